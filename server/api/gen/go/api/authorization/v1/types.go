package v1

type SubjectAccessReview struct {
	metav1.TypeMeta `json:""`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Spec SubjectAccessReviewSpec `json:"spec"`
	Status SubjectAccessReviewStatus `json:"status,omitempty"`
}

type SelfSubjectAccessReview struct {
	metav1.TypeMeta `json:""`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Spec SelfSubjectAccessReviewSpec `json:"spec"`
	Status SubjectAccessReviewStatus `json:"status,omitempty"`
}

type LocalSubjectAccessReview struct {
	metav1.TypeMeta `json:""`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Spec SubjectAccessReviewSpec `json:"spec"`
	Status SubjectAccessReviewStatus `json:"status,omitempty"`
}

type ResourceAttributes struct {
	Namespace string `json:"namespace,omitempty"`
	Verb string `json:"verb,omitempty"`
	Group string `json:"group,omitempty"`
	Version string `json:"version,omitempty"`
	Resource string `json:"resource,omitempty"`
	Subresource string `json:"subresource,omitempty"`
	Name string `json:"name,omitempty"`
	FieldSelector *FieldSelectorAttributes `json:"fieldSelector,omitempty"`
	LabelSelector *LabelSelectorAttributes `json:"labelSelector,omitempty"`
}

type LabelSelectorAttributes struct {
	RawSelector string `json:"rawSelector,omitempty"`
	Requirements []metav1.LabelSelectorRequirement `json:"requirements,omitempty"`
}

type FieldSelectorAttributes struct {
	RawSelector string `json:"rawSelector,omitempty"`
	Requirements []metav1.FieldSelectorRequirement `json:"requirements,omitempty"`
}

type NonResourceAttributes struct {
	Path string `json:"path,omitempty"`
	Verb string `json:"verb,omitempty"`
}

type SubjectAccessReviewSpec struct {
	ResourceAttributes *ResourceAttributes `json:"resourceAttributes,omitempty"`
	NonResourceAttributes *NonResourceAttributes `json:"nonResourceAttributes,omitempty"`
	User string `json:"user,omitempty"`
	Groups []string `json:"groups,omitempty"`
	Extra map[string]ExtraValue `json:"extra,omitempty"`
	UID string `json:"uid,omitempty"`
	AuthorizationOptions *AuthorizationOptions `json:"authorizationOptions,omitempty"`
}

type SelfSubjectAccessReviewSpec struct {
	ResourceAttributes *ResourceAttributes `json:"resourceAttributes,omitempty"`
	NonResourceAttributes *NonResourceAttributes `json:"nonResourceAttributes,omitempty"`
	AuthorizationOptions *AuthorizationOptions `json:"authorizationOptions,omitempty"`
}

type SubjectAccessReviewStatus struct {
	Allowed bool `json:"allowed"`
	Denied bool `json:"denied,omitempty"`
	Reason string `json:"reason,omitempty"`
	EvaluationError string `json:"evaluationError,omitempty"`
	ConditionalDecision *ConditionsAwareDecision `json:"conditionalDecision,omitempty"`
}
