package v1

type ListMeta struct {
	SelfLink string `json:"selfLink,omitempty"`
	ResourceVersion string `json:"resourceVersion,omitempty"`
	Continue string `json:"continue,omitempty"`
	RemainingItemCount *int64 `json:"remainingItemCount,omitempty"`
	ShardInfo *ShardInfo `json:"shardInfo,omitempty"`
}

type ObjectMeta struct {
	Name string `json:"name,omitempty"`
	GenerateName string `json:"generateName,omitempty"`
	Namespace string `json:"namespace,omitempty"`
	SelfLink string `json:"selfLink,omitempty"`
	UID types.UID `json:"uid,omitempty"`
	ResourceVersion string `json:"resourceVersion,omitempty"`
	Generation int64 `json:"generation,omitempty"`
	CreationTimestamp Time `json:"creationTimestamp,omitempty,omitzero"`
	DeletionTimestamp *Time `json:"deletionTimestamp,omitempty"`
	DeletionGracePeriodSeconds *int64 `json:"deletionGracePeriodSeconds,omitempty"`
	Labels map[string]string `json:"labels,omitempty"`
	Annotations map[string]string `json:"annotations,omitempty"`
	OwnerReferences []OwnerReference `json:"ownerReferences,omitempty"`
	Finalizers []string `json:"finalizers,omitempty"`
	ManagedFields []ManagedFieldsEntry `json:"managedFields,omitempty"`
}

type OwnerReference struct {
	APIVersion string `json:"apiVersion"`
	Kind string `json:"kind"`
	Name string `json:"name"`
	UID types.UID `json:"uid"`
	Controller *bool `json:"controller,omitempty"`
	BlockOwnerDeletion *bool `json:"blockOwnerDeletion,omitempty"`
}

type DeleteOptions struct {
	TypeMeta `json:""`
	GracePeriodSeconds *int64 `json:"gracePeriodSeconds,omitempty"`
	Preconditions *Preconditions `json:"preconditions,omitempty"`
	OrphanDependents *bool `json:"orphanDependents,omitempty"`
	PropagationPolicy *DeletionPropagation `json:"propagationPolicy,omitempty"`
	DryRun []string `json:"dryRun,omitempty"`
	IgnoreStoreReadErrorWithClusterBreakingPotential *bool `json:"ignoreStoreReadErrorWithClusterBreakingPotential,omitempty"`
}

type Preconditions struct {
	UID *types.UID `json:"uid,omitempty"`
	ResourceVersion *string `json:"resourceVersion,omitempty"`
}

type Status struct {
	TypeMeta `json:""`
	ListMeta `json:"metadata,omitempty"`
	Status string `json:"status,omitempty"`
	Message string `json:"message,omitempty"`
	Reason StatusReason `json:"reason,omitempty"`
	Details *StatusDetails `json:"details,omitempty"`
	Code int32 `json:"code,omitempty"`
}

type StatusDetails struct {
	Name string `json:"name,omitempty"`
	Group string `json:"group,omitempty"`
	Kind string `json:"kind,omitempty"`
	UID types.UID `json:"uid,omitempty"`
	Causes []StatusCause `json:"causes,omitempty"`
	RetryAfterSeconds int32 `json:"retryAfterSeconds,omitempty"`
}

type StatusCause struct {
	Type CauseType `json:"reason,omitempty"`
	Message string `json:"message,omitempty"`
	Field string `json:"field,omitempty"`
}

type LabelSelector struct {
	MatchLabels map[string]string `json:"matchLabels,omitempty"`
	MatchExpressions []LabelSelectorRequirement `json:"matchExpressions,omitempty"`
}

type LabelSelectorRequirement struct {
	Key string `json:"key"`
	Operator LabelSelectorOperator `json:"operator"`
	Values []string `json:"values,omitempty"`
}

type FieldSelectorRequirement struct {
	Key string `json:"key"`
	Operator FieldSelectorOperator `json:"operator"`
	Values []string `json:"values,omitempty"`
}

type ManagedFieldsEntry struct {
	Manager string `json:"manager,omitempty"`
	Operation ManagedFieldsOperationType `json:"operation,omitempty"`
	APIVersion string `json:"apiVersion,omitempty"`
	Time *Time `json:"time,omitempty"`
	FieldsType string `json:"fieldsType,omitempty"`
	FieldsV1 *FieldsV1 `json:"fieldsV1,omitempty"`
	Subresource string `json:"subresource,omitempty"`
}

type PartialObjectMetadata struct {
	TypeMeta `json:""`
	ObjectMeta `json:"metadata,omitempty"`
}

type PartialObjectMetadataList struct {
	TypeMeta `json:""`
	ListMeta `json:"metadata,omitempty"`
	Items []PartialObjectMetadata `json:"items"`
}

type Condition struct {
	Type string `json:"type"`
	Status ConditionStatus `json:"status"`
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	LastTransitionTime Time `json:"lastTransitionTime"`
	Reason string `json:"reason"`
	Message string `json:"message"`
}
