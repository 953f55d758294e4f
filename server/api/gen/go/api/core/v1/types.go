package v1

type Volume struct {
	Name string `json:"name"`
	VolumeSource `json:",inline"`
}

type VolumeSource struct {
	HostPath *HostPathVolumeSource `json:"hostPath,omitempty"`
	EmptyDir *EmptyDirVolumeSource `json:"emptyDir,omitempty"`
	GCEPersistentDisk *GCEPersistentDiskVolumeSource `json:"gcePersistentDisk,omitempty"`
	AWSElasticBlockStore *AWSElasticBlockStoreVolumeSource `json:"awsElasticBlockStore,omitempty"`
	GitRepo *GitRepoVolumeSource `json:"gitRepo,omitempty"`
	Secret *SecretVolumeSource `json:"secret,omitempty"`
	NFS *NFSVolumeSource `json:"nfs,omitempty"`
	ISCSI *ISCSIVolumeSource `json:"iscsi,omitempty"`
	Glusterfs *GlusterfsVolumeSource `json:"glusterfs,omitempty"`
	PersistentVolumeClaim *PersistentVolumeClaimVolumeSource `json:"persistentVolumeClaim,omitempty"`
	RBD *RBDVolumeSource `json:"rbd,omitempty"`
	FlexVolume *FlexVolumeSource `json:"flexVolume,omitempty"`
	Cinder *CinderVolumeSource `json:"cinder,omitempty"`
	CephFS *CephFSVolumeSource `json:"cephfs,omitempty"`
	Flocker *FlockerVolumeSource `json:"flocker,omitempty"`
	DownwardAPI *DownwardAPIVolumeSource `json:"downwardAPI,omitempty"`
	FC *FCVolumeSource `json:"fc,omitempty"`
	AzureFile *AzureFileVolumeSource `json:"azureFile,omitempty"`
	ConfigMap *ConfigMapVolumeSource `json:"configMap,omitempty"`
	VsphereVolume *VsphereVirtualDiskVolumeSource `json:"vsphereVolume,omitempty"`
	Quobyte *QuobyteVolumeSource `json:"quobyte,omitempty"`
	AzureDisk *AzureDiskVolumeSource `json:"azureDisk,omitempty"`
	PhotonPersistentDisk *PhotonPersistentDiskVolumeSource `json:"photonPersistentDisk,omitempty"`
	Projected *ProjectedVolumeSource `json:"projected,omitempty"`
	PortworxVolume *PortworxVolumeSource `json:"portworxVolume,omitempty"`
	ScaleIO *ScaleIOVolumeSource `json:"scaleIO,omitempty"`
	StorageOS *StorageOSVolumeSource `json:"storageos,omitempty"`
	CSI *CSIVolumeSource `json:"csi,omitempty"`
	Ephemeral *EphemeralVolumeSource `json:"ephemeral,omitempty"`
	Image *ImageVolumeSource `json:"image,omitempty"`
}

type PersistentVolumeClaimVolumeSource struct {
	ClaimName string `json:"claimName"`
	ReadOnly bool `json:"readOnly,omitempty"`
}

type PersistentVolumeClaim struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Spec PersistentVolumeClaimSpec `json:"spec,omitempty"`
	Status PersistentVolumeClaimStatus `json:"status,omitempty"`
}

type PersistentVolumeClaimSpec struct {
	AccessModes []PersistentVolumeAccessMode `json:"accessModes,omitempty"`
	Selector *metav1.LabelSelector `json:"selector,omitempty"`
	Resources VolumeResourceRequirements `json:"resources,omitempty"`
	VolumeName string `json:"volumeName,omitempty"`
	StorageClassName *string `json:"storageClassName,omitempty"`
	VolumeMode *PersistentVolumeMode `json:"volumeMode,omitempty"`
	DataSource *TypedLocalObjectReference `json:"dataSource,omitempty"`
	DataSourceRef *TypedObjectReference `json:"dataSourceRef,omitempty"`
	VolumeAttributesClassName *string `json:"volumeAttributesClassName,omitempty"`
}

type TypedObjectReference struct {
	APIGroup *string `json:"apiGroup"`
	Kind string `json:"kind"`
	Name string `json:"name"`
	Namespace *string `json:"namespace,omitempty"`
}

type ModifyVolumeStatus struct {
	TargetVolumeAttributesClassName string `json:"targetVolumeAttributesClassName,omitempty"`
	Status PersistentVolumeClaimModifyVolumeStatus `json:"status"`
}

type PersistentVolumeClaimCondition struct {
	Type PersistentVolumeClaimConditionType `json:"type"`
	Status ConditionStatus `json:"status"`
	LastProbeTime metav1.Time `json:"lastProbeTime,omitempty"`
	LastTransitionTime metav1.Time `json:"lastTransitionTime,omitempty"`
	Reason string `json:"reason,omitempty"`
	Message string `json:"message,omitempty"`
}

type PersistentVolumeClaimStatus struct {
	Phase PersistentVolumeClaimPhase `json:"phase,omitempty"`
	AccessModes []PersistentVolumeAccessMode `json:"accessModes,omitempty"`
	Capacity ResourceList `json:"capacity,omitempty"`
	Conditions []PersistentVolumeClaimCondition `json:"conditions,omitempty"`
	AllocatedResources ResourceList `json:"allocatedResources,omitempty"`
	AllocatedResourceStatuses map[ResourceName]ClaimResourceStatus `json:"allocatedResourceStatuses,omitempty"`
	CurrentVolumeAttributesClassName *string `json:"currentVolumeAttributesClassName,omitempty"`
	ModifyVolumeStatus *ModifyVolumeStatus `json:"modifyVolumeStatus,omitempty"`
}

type HostPathVolumeSource struct {
	Path string `json:"path"`
	Type *HostPathType `json:"type,omitempty"`
}

type EmptyDirVolumeSource struct {
	Medium StorageMedium `json:"medium,omitempty"`
	SizeLimit *resource.Quantity `json:"sizeLimit,omitempty"`
}

type GlusterfsVolumeSource struct {
	EndpointsName string `json:"endpoints"`
	Path string `json:"path"`
	ReadOnly bool `json:"readOnly,omitempty"`
}

type RBDVolumeSource struct {
	CephMonitors []string `json:"monitors"`
	RBDImage string `json:"image"`
	FSType string `json:"fsType,omitempty"`
	RBDPool string `json:"pool,omitempty"`
	RadosUser string `json:"user,omitempty"`
	Keyring string `json:"keyring,omitempty"`
	SecretRef *LocalObjectReference `json:"secretRef,omitempty"`
	ReadOnly bool `json:"readOnly,omitempty"`
}

type CinderVolumeSource struct {
	VolumeID string `json:"volumeID"`
	FSType string `json:"fsType,omitempty"`
	ReadOnly bool `json:"readOnly,omitempty"`
	SecretRef *LocalObjectReference `json:"secretRef,omitempty"`
}

type CephFSVolumeSource struct {
	Monitors []string `json:"monitors"`
	Path string `json:"path,omitempty"`
	User string `json:"user,omitempty"`
	SecretFile string `json:"secretFile,omitempty"`
	SecretRef *LocalObjectReference `json:"secretRef,omitempty"`
	ReadOnly bool `json:"readOnly,omitempty"`
}

type FlockerVolumeSource struct {
	DatasetName string `json:"datasetName,omitempty"`
	DatasetUUID string `json:"datasetUUID,omitempty"`
}

type GCEPersistentDiskVolumeSource struct {
	PDName string `json:"pdName"`
	FSType string `json:"fsType,omitempty"`
	Partition int32 `json:"partition,omitempty"`
	ReadOnly bool `json:"readOnly,omitempty"`
}

type QuobyteVolumeSource struct {
	Registry string `json:"registry"`
	Volume string `json:"volume"`
	ReadOnly bool `json:"readOnly,omitempty"`
	User string `json:"user,omitempty"`
	Group string `json:"group,omitempty"`
	Tenant string `json:"tenant,omitempty"`
}

type FlexVolumeSource struct {
	Driver string `json:"driver"`
	FSType string `json:"fsType,omitempty"`
	SecretRef *LocalObjectReference `json:"secretRef,omitempty"`
	ReadOnly bool `json:"readOnly,omitempty"`
	Options map[string]string `json:"options,omitempty"`
}

type AWSElasticBlockStoreVolumeSource struct {
	VolumeID string `json:"volumeID"`
	FSType string `json:"fsType,omitempty"`
	Partition int32 `json:"partition,omitempty"`
	ReadOnly bool `json:"readOnly,omitempty"`
}

type GitRepoVolumeSource struct {
	Repository string `json:"repository"`
	Revision string `json:"revision,omitempty"`
	Directory string `json:"directory,omitempty"`
}

type SecretVolumeSource struct {
	SecretName string `json:"secretName,omitempty"`
	Items []KeyToPath `json:"items,omitempty"`
	DefaultMode *int32 `json:"defaultMode,omitempty"`
	Optional *bool `json:"optional,omitempty"`
}

type SecretProjection struct {
	LocalObjectReference `json:",inline"`
	Items []KeyToPath `json:"items,omitempty"`
	Optional *bool `json:"optional,omitempty"`
}

type NFSVolumeSource struct {
	Server string `json:"server"`
	Path string `json:"path"`
	ReadOnly bool `json:"readOnly,omitempty"`
}

type ISCSIVolumeSource struct {
	TargetPortal string `json:"targetPortal"`
	IQN string `json:"iqn"`
	Lun int32 `json:"lun"`
	ISCSIInterface string `json:"iscsiInterface,omitempty"`
	FSType string `json:"fsType,omitempty"`
	ReadOnly bool `json:"readOnly,omitempty"`
	Portals []string `json:"portals,omitempty"`
	DiscoveryCHAPAuth bool `json:"chapAuthDiscovery,omitempty"`
	SessionCHAPAuth bool `json:"chapAuthSession,omitempty"`
	SecretRef *LocalObjectReference `json:"secretRef,omitempty"`
	InitiatorName *string `json:"initiatorName,omitempty"`
}

type FCVolumeSource struct {
	TargetWWNs []string `json:"targetWWNs,omitempty"`
	Lun *int32 `json:"lun,omitempty"`
	FSType string `json:"fsType,omitempty"`
	ReadOnly bool `json:"readOnly,omitempty"`
	WWIDs []string `json:"wwids,omitempty"`
}

type AzureFileVolumeSource struct {
	SecretName string `json:"secretName"`
	ShareName string `json:"shareName"`
	ReadOnly bool `json:"readOnly,omitempty"`
}

type VsphereVirtualDiskVolumeSource struct {
	VolumePath string `json:"volumePath"`
	FSType string `json:"fsType,omitempty"`
	StoragePolicyName string `json:"storagePolicyName,omitempty"`
	StoragePolicyID string `json:"storagePolicyID,omitempty"`
}

type PhotonPersistentDiskVolumeSource struct {
	PdID string `json:"pdID"`
	FSType string `json:"fsType,omitempty"`
}

type AzureDiskVolumeSource struct {
	DiskName string `json:"diskName"`
	DataDiskURI string `json:"diskURI"`
	CachingMode *AzureDataDiskCachingMode `json:"cachingMode,omitempty"`
	FSType *string `json:"fsType,omitempty"`
	ReadOnly *bool `json:"readOnly,omitempty"`
	Kind *AzureDataDiskKind `json:"kind,omitempty"`
}

type PortworxVolumeSource struct {
	VolumeID string `json:"volumeID"`
	FSType string `json:"fsType,omitempty"`
	ReadOnly bool `json:"readOnly,omitempty"`
}

type ScaleIOVolumeSource struct {
	Gateway string `json:"gateway"`
	System string `json:"system"`
	SecretRef *LocalObjectReference `json:"secretRef"`
	SSLEnabled bool `json:"sslEnabled,omitempty"`
	ProtectionDomain string `json:"protectionDomain,omitempty"`
	StoragePool string `json:"storagePool,omitempty"`
	StorageMode string `json:"storageMode,omitempty"`
	VolumeName string `json:"volumeName,omitempty"`
	FSType string `json:"fsType,omitempty"`
	ReadOnly bool `json:"readOnly,omitempty"`
}

type StorageOSVolumeSource struct {
	VolumeName string `json:"volumeName,omitempty"`
	VolumeNamespace string `json:"volumeNamespace,omitempty"`
	FSType string `json:"fsType,omitempty"`
	ReadOnly bool `json:"readOnly,omitempty"`
	SecretRef *LocalObjectReference `json:"secretRef,omitempty"`
}

type ConfigMapVolumeSource struct {
	LocalObjectReference `json:",inline"`
	Items []KeyToPath `json:"items,omitempty"`
	DefaultMode *int32 `json:"defaultMode,omitempty"`
	Optional *bool `json:"optional,omitempty"`
}

type ConfigMapProjection struct {
	LocalObjectReference `json:",inline"`
	Items []KeyToPath `json:"items,omitempty"`
	Optional *bool `json:"optional,omitempty"`
}

type ServiceAccountTokenProjection struct {
	Audience string `json:"audience,omitempty"`
	ExpirationSeconds *int64 `json:"expirationSeconds,omitempty"`
	Path string `json:"path"`
}

type ClusterTrustBundleProjection struct {
	Name *string `json:"name,omitempty"`
	SignerName *string `json:"signerName,omitempty"`
	LabelSelector *metav1.LabelSelector `json:"labelSelector,omitempty"`
	Optional *bool `json:"optional,omitempty"`
	Path string `json:"path"`
}

type ProjectedVolumeSource struct {
	Sources []VolumeProjection `json:"sources"`
	DefaultMode *int32 `json:"defaultMode,omitempty"`
}

type VolumeProjection struct {
	Secret *SecretProjection `json:"secret,omitempty"`
	DownwardAPI *DownwardAPIProjection `json:"downwardAPI,omitempty"`
	ConfigMap *ConfigMapProjection `json:"configMap,omitempty"`
	ServiceAccountToken *ServiceAccountTokenProjection `json:"serviceAccountToken,omitempty"`
	ClusterTrustBundle *ClusterTrustBundleProjection `json:"clusterTrustBundle,omitempty"`
}

type KeyToPath struct {
	Key string `json:"key"`
	Path string `json:"path"`
	Mode *int32 `json:"mode,omitempty"`
}

type CSIVolumeSource struct {
	Driver string `json:"driver"`
	ReadOnly *bool `json:"readOnly,omitempty"`
	FSType *string `json:"fsType,omitempty"`
	VolumeAttributes map[string]string `json:"volumeAttributes,omitempty"`
	NodePublishSecretRef *LocalObjectReference `json:"nodePublishSecretRef,omitempty"`
}

type EphemeralVolumeSource struct {
	VolumeClaimTemplate *PersistentVolumeClaimTemplate `json:"volumeClaimTemplate,omitempty"`
}

type PersistentVolumeClaimTemplate struct {
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Spec PersistentVolumeClaimSpec `json:"spec"`
}

type ContainerPort struct {
	Name string `json:"name,omitempty"`
	HostPort int32 `json:"hostPort,omitempty"`
	ContainerPort int32 `json:"containerPort"`
	Protocol Protocol `json:"protocol,omitempty"`
	HostIP string `json:"hostIP,omitempty"`
}

type VolumeMount struct {
	Name string `json:"name"`
	ReadOnly bool `json:"readOnly,omitempty"`
	RecursiveReadOnly *RecursiveReadOnlyMode `json:"recursiveReadOnly,omitempty"`
	MountPath string `json:"mountPath"`
	SubPath string `json:"subPath,omitempty"`
	MountPropagation *MountPropagationMode `json:"mountPropagation,omitempty"`
	SubPathExpr string `json:"subPathExpr,omitempty"`
}

type VolumeDevice struct {
	Name string `json:"name"`
	DevicePath string `json:"devicePath"`
}

type EnvVar struct {
	Name string `json:"name"`
	Value string `json:"value,omitempty"`
	ValueFrom *EnvVarSource `json:"valueFrom,omitempty"`
}

type EnvVarSource struct {
	FieldRef *ObjectFieldSelector `json:"fieldRef,omitempty"`
	ResourceFieldRef *ResourceFieldSelector `json:"resourceFieldRef,omitempty"`
	ConfigMapKeyRef *ConfigMapKeySelector `json:"configMapKeyRef,omitempty"`
	SecretKeyRef *SecretKeySelector `json:"secretKeyRef,omitempty"`
}

type ObjectFieldSelector struct {
	APIVersion string `json:"apiVersion,omitempty"`
	FieldPath string `json:"fieldPath"`
}

type ResourceFieldSelector struct {
	ContainerName string `json:"containerName,omitempty"`
	Resource string `json:"resource"`
	Divisor resource.Quantity `json:"divisor,omitempty"`
}

type ConfigMapKeySelector struct {
	LocalObjectReference `json:",inline"`
	Key string `json:"key"`
	Optional *bool `json:"optional,omitempty"`
}

type SecretKeySelector struct {
	LocalObjectReference `json:",inline"`
	Key string `json:"key"`
	Optional *bool `json:"optional,omitempty"`
}

type EnvFromSource struct {
	Prefix string `json:"prefix,omitempty"`
	ConfigMapRef *ConfigMapEnvSource `json:"configMapRef,omitempty"`
	SecretRef *SecretEnvSource `json:"secretRef,omitempty"`
}

type ConfigMapEnvSource struct {
	LocalObjectReference `json:",inline"`
	Optional *bool `json:"optional,omitempty"`
}

type SecretEnvSource struct {
	LocalObjectReference `json:",inline"`
	Optional *bool `json:"optional,omitempty"`
}

type HTTPHeader struct {
	Name string `json:"name"`
	Value string `json:"value"`
}

type HTTPGetAction struct {
	Path string `json:"path,omitempty"`
	Port intstr.IntOrString `json:"port"`
	Host string `json:"host,omitempty"`
	Scheme URIScheme `json:"scheme,omitempty"`
	HTTPHeaders []HTTPHeader `json:"httpHeaders,omitempty"`
}

type TCPSocketAction struct {
	Port intstr.IntOrString `json:"port"`
	Host string `json:"host,omitempty"`
}

type GRPCAction struct {
	Port int32 `json:"port"`
	Service *string `json:"service"`
}

type ExecAction struct {
	Command []string `json:"command,omitempty"`
}

type SleepAction struct {
	Seconds int64 `json:"seconds"`
}

type Probe struct {
	ProbeHandler `json:",inline"`
	InitialDelaySeconds int32 `json:"initialDelaySeconds,omitempty"`
	TimeoutSeconds int32 `json:"timeoutSeconds,omitempty"`
	PeriodSeconds int32 `json:"periodSeconds,omitempty"`
	SuccessThreshold int32 `json:"successThreshold,omitempty"`
	FailureThreshold int32 `json:"failureThreshold,omitempty"`
	TerminationGracePeriodSeconds *int64 `json:"terminationGracePeriodSeconds,omitempty"`
}

type ContainerResizePolicy struct {
	ResourceName ResourceName `json:"resourceName"`
	RestartPolicy ResourceResizeRestartPolicy `json:"restartPolicy"`
}

type Capabilities struct {
	Add []Capability `json:"add,omitempty"`
	Drop []Capability `json:"drop,omitempty"`
}

type ResourceRequirements struct {
	Limits ResourceList `json:"limits,omitempty"`
	Requests ResourceList `json:"requests,omitempty"`
	Claims []ResourceClaim `json:"claims,omitempty"`
}

type VolumeResourceRequirements struct {
	Limits ResourceList `json:"limits,omitempty"`
	Requests ResourceList `json:"requests,omitempty"`
}

type ResourceClaim struct {
	Name string `json:"name"`
}

type Container struct {
	Name string `json:"name"`
	Image string `json:"image,omitempty"`
	Command []string `json:"command,omitempty"`
	Args []string `json:"args,omitempty"`
	WorkingDir string `json:"workingDir,omitempty"`
	Ports []ContainerPort `json:"ports,omitempty"`
	EnvFrom []EnvFromSource `json:"envFrom,omitempty"`
	Env []EnvVar `json:"env,omitempty"`
	Resources ResourceRequirements `json:"resources,omitempty"`
	ResizePolicy []ContainerResizePolicy `json:"resizePolicy,omitempty"`
	RestartPolicy *ContainerRestartPolicy `json:"restartPolicy,omitempty"`
	VolumeMounts []VolumeMount `json:"volumeMounts,omitempty"`
	VolumeDevices []VolumeDevice `json:"volumeDevices,omitempty"`
	LivenessProbe *Probe `json:"livenessProbe,omitempty"`
	ReadinessProbe *Probe `json:"readinessProbe,omitempty"`
	StartupProbe *Probe `json:"startupProbe,omitempty"`
	Lifecycle *Lifecycle `json:"lifecycle,omitempty"`
	TerminationMessagePath string `json:"terminationMessagePath,omitempty"`
	TerminationMessagePolicy TerminationMessagePolicy `json:"terminationMessagePolicy,omitempty"`
	ImagePullPolicy PullPolicy `json:"imagePullPolicy,omitempty"`
	SecurityContext *SecurityContext `json:"securityContext,omitempty"`
	Stdin bool `json:"stdin,omitempty"`
	StdinOnce bool `json:"stdinOnce,omitempty"`
	TTY bool `json:"tty,omitempty"`
}

type ProbeHandler struct {
	Exec *ExecAction `json:"exec,omitempty"`
	HTTPGet *HTTPGetAction `json:"httpGet,omitempty"`
	TCPSocket *TCPSocketAction `json:"tcpSocket,omitempty"`
	GRPC *GRPCAction `json:"grpc,omitempty"`
}

type LifecycleHandler struct {
	Exec *ExecAction `json:"exec,omitempty"`
	HTTPGet *HTTPGetAction `json:"httpGet,omitempty"`
	TCPSocket *TCPSocketAction `json:"tcpSocket,omitempty"`
	Sleep *SleepAction `json:"sleep,omitempty"`
}

type Lifecycle struct {
	PostStart *LifecycleHandler `json:"postStart,omitempty"`
	PreStop *LifecycleHandler `json:"preStop,omitempty"`
}

type ContainerStateWaiting struct {
	Reason string `json:"reason,omitempty"`
	Message string `json:"message,omitempty"`
}

type ContainerStateRunning struct {
	StartedAt metav1.Time `json:"startedAt,omitempty"`
}

type ContainerStateTerminated struct {
	ExitCode int32 `json:"exitCode"`
	Signal int32 `json:"signal,omitempty"`
	Reason string `json:"reason,omitempty"`
	Message string `json:"message,omitempty"`
	StartedAt metav1.Time `json:"startedAt,omitempty"`
	FinishedAt metav1.Time `json:"finishedAt,omitempty"`
	ContainerID string `json:"containerID,omitempty"`
}

type ContainerState struct {
	Waiting *ContainerStateWaiting `json:"waiting,omitempty"`
	Running *ContainerStateRunning `json:"running,omitempty"`
	Terminated *ContainerStateTerminated `json:"terminated,omitempty"`
}

type ContainerStatus struct {
	Name string `json:"name"`
	State ContainerState `json:"state,omitempty"`
	LastTerminationState ContainerState `json:"lastState,omitempty"`
	Ready bool `json:"ready"`
	RestartCount int32 `json:"restartCount"`
	Image string `json:"image"`
	ImageID string `json:"imageID"`
	ContainerID string `json:"containerID,omitempty"`
	Started *bool `json:"started,omitempty"`
	AllocatedResources ResourceList `json:"allocatedResources,omitempty"`
	Resources *ResourceRequirements `json:"resources,omitempty"`
	VolumeMounts []VolumeMountStatus `json:"volumeMounts,omitempty"`
	User *ContainerUser `json:"user,omitempty"`
}

type ContainerUser struct {
	Linux *LinuxContainerUser `json:"linux,omitempty"`
}

type LinuxContainerUser struct {
	UID int64 `json:"uid"`
	GID int64 `json:"gid"`
	SupplementalGroups []int64 `json:"supplementalGroups,omitempty"`
}

type PodCondition struct {
	Type PodConditionType `json:"type"`
	Status ConditionStatus `json:"status"`
	LastProbeTime metav1.Time `json:"lastProbeTime,omitempty"`
	LastTransitionTime metav1.Time `json:"lastTransitionTime,omitempty"`
	Reason string `json:"reason,omitempty"`
	Message string `json:"message,omitempty"`
}

type VolumeMountStatus struct {
	Name string `json:"name"`
	MountPath string `json:"mountPath"`
	ReadOnly bool `json:"readOnly,omitempty"`
	RecursiveReadOnly *RecursiveReadOnlyMode `json:"recursiveReadOnly,omitempty"`
}

type NodeSelector struct {
	NodeSelectorTerms []NodeSelectorTerm `json:"nodeSelectorTerms"`
}

type NodeSelectorTerm struct {
	MatchExpressions []NodeSelectorRequirement `json:"matchExpressions,omitempty"`
	MatchFields []NodeSelectorRequirement `json:"matchFields,omitempty"`
}

type NodeSelectorRequirement struct {
	Key string `json:"key"`
	Operator NodeSelectorOperator `json:"operator"`
	Values []string `json:"values,omitempty"`
}

type Affinity struct {
	NodeAffinity *NodeAffinity `json:"nodeAffinity,omitempty"`
	PodAffinity *PodAffinity `json:"podAffinity,omitempty"`
	PodAntiAffinity *PodAntiAffinity `json:"podAntiAffinity,omitempty"`
}

type PodAffinity struct {
	RequiredDuringSchedulingIgnoredDuringExecution []PodAffinityTerm `json:"requiredDuringSchedulingIgnoredDuringExecution,omitempty"`
	PreferredDuringSchedulingIgnoredDuringExecution []WeightedPodAffinityTerm `json:"preferredDuringSchedulingIgnoredDuringExecution,omitempty"`
}

type PodAntiAffinity struct {
	RequiredDuringSchedulingIgnoredDuringExecution []PodAffinityTerm `json:"requiredDuringSchedulingIgnoredDuringExecution,omitempty"`
	PreferredDuringSchedulingIgnoredDuringExecution []WeightedPodAffinityTerm `json:"preferredDuringSchedulingIgnoredDuringExecution,omitempty"`
}

type WeightedPodAffinityTerm struct {
	Weight int32 `json:"weight"`
	PodAffinityTerm PodAffinityTerm `json:"podAffinityTerm"`
}

type PodAffinityTerm struct {
	LabelSelector *metav1.LabelSelector `json:"labelSelector,omitempty"`
	Namespaces []string `json:"namespaces,omitempty"`
	TopologyKey string `json:"topologyKey"`
	NamespaceSelector *metav1.LabelSelector `json:"namespaceSelector,omitempty"`
	MatchLabelKeys []string `json:"matchLabelKeys,omitempty"`
	MismatchLabelKeys []string `json:"mismatchLabelKeys,omitempty"`
}

type NodeAffinity struct {
	RequiredDuringSchedulingIgnoredDuringExecution *NodeSelector `json:"requiredDuringSchedulingIgnoredDuringExecution,omitempty"`
	PreferredDuringSchedulingIgnoredDuringExecution []PreferredSchedulingTerm `json:"preferredDuringSchedulingIgnoredDuringExecution,omitempty"`
}

type PreferredSchedulingTerm struct {
	Weight int32 `json:"weight"`
	Preference NodeSelectorTerm `json:"preference"`
}

type Taint struct {
	Key string `json:"key"`
	Value string `json:"value,omitempty"`
	Effect TaintEffect `json:"effect"`
	TimeAdded *metav1.Time `json:"timeAdded,omitempty"`
}

type Toleration struct {
	Key string `json:"key,omitempty"`
	Operator TolerationOperator `json:"operator,omitempty"`
	Value string `json:"value,omitempty"`
	Effect TaintEffect `json:"effect,omitempty"`
	TolerationSeconds *int64 `json:"tolerationSeconds,omitempty"`
}

type PodReadinessGate struct {
	ConditionType PodConditionType `json:"conditionType"`
}

type PodSpec struct {
	Volumes []Volume `json:"volumes,omitempty"`
	InitContainers []Container `json:"initContainers,omitempty"`
	Containers []Container `json:"containers"`
	EphemeralContainers []EphemeralContainer `json:"ephemeralContainers,omitempty"`
	RestartPolicy RestartPolicy `json:"restartPolicy,omitempty"`
	TerminationGracePeriodSeconds *int64 `json:"terminationGracePeriodSeconds,omitempty"`
	ActiveDeadlineSeconds *int64 `json:"activeDeadlineSeconds,omitempty"`
	DNSPolicy DNSPolicy `json:"dnsPolicy,omitempty"`
	NodeSelector map[string]string `json:"nodeSelector,omitempty"`
	ServiceAccountName string `json:"serviceAccountName,omitempty"`
	DeprecatedServiceAccount string `json:"serviceAccount,omitempty"`
	AutomountServiceAccountToken *bool `json:"automountServiceAccountToken,omitempty"`
	NodeName string `json:"nodeName,omitempty"`
	HostNetwork bool `json:"hostNetwork,omitempty"`
	HostPID bool `json:"hostPID,omitempty"`
	HostIPC bool `json:"hostIPC,omitempty"`
	ShareProcessNamespace *bool `json:"shareProcessNamespace,omitempty"`
	SecurityContext *PodSecurityContext `json:"securityContext,omitempty"`
	ImagePullSecrets []LocalObjectReference `json:"imagePullSecrets,omitempty"`
	Hostname string `json:"hostname,omitempty"`
	Subdomain string `json:"subdomain,omitempty"`
	Affinity *Affinity `json:"affinity,omitempty"`
	SchedulerName string `json:"schedulerName,omitempty"`
	Tolerations []Toleration `json:"tolerations,omitempty"`
	HostAliases []HostAlias `json:"hostAliases,omitempty"`
	PriorityClassName string `json:"priorityClassName,omitempty"`
	Priority *int32 `json:"priority,omitempty"`
	DNSConfig *PodDNSConfig `json:"dnsConfig,omitempty"`
	ReadinessGates []PodReadinessGate `json:"readinessGates,omitempty"`
	RuntimeClassName *string `json:"runtimeClassName,omitempty"`
	EnableServiceLinks *bool `json:"enableServiceLinks,omitempty"`
	PreemptionPolicy *PreemptionPolicy `json:"preemptionPolicy,omitempty"`
	Overhead ResourceList `json:"overhead,omitempty"`
	TopologySpreadConstraints []TopologySpreadConstraint `json:"topologySpreadConstraints,omitempty"`
	SetHostnameAsFQDN *bool `json:"setHostnameAsFQDN,omitempty"`
	OS *PodOS `json:"os,omitempty"`
	HostUsers *bool `json:"hostUsers,omitempty"`
	SchedulingGates []PodSchedulingGate `json:"schedulingGates,omitempty"`
	ResourceClaims []PodResourceClaim `json:"resourceClaims,omitempty"`
}

type PodResourceClaim struct {
	Name string `json:"name"`
	ResourceClaimName *string `json:"resourceClaimName,omitempty"`
	ResourceClaimTemplateName *string `json:"resourceClaimTemplateName,omitempty"`
}

type PodResourceClaimStatus struct {
	Name string `json:"name"`
	ResourceClaimName *string `json:"resourceClaimName,omitempty"`
}

type PodOS struct {
	Name OSName `json:"name"`
}

type PodSchedulingGate struct {
	Name string `json:"name"`
}

type TopologySpreadConstraint struct {
	MaxSkew int32 `json:"maxSkew"`
	TopologyKey string `json:"topologyKey"`
	WhenUnsatisfiable UnsatisfiableConstraintAction `json:"whenUnsatisfiable"`
	LabelSelector *metav1.LabelSelector `json:"labelSelector,omitempty"`
	MinDomains *int32 `json:"minDomains,omitempty"`
	NodeAffinityPolicy *NodeInclusionPolicy `json:"nodeAffinityPolicy,omitempty"`
	NodeTaintsPolicy *NodeInclusionPolicy `json:"nodeTaintsPolicy,omitempty"`
	MatchLabelKeys []string `json:"matchLabelKeys,omitempty"`
}

type HostAlias struct {
	IP string `json:"ip"`
	Hostnames []string `json:"hostnames,omitempty"`
}

type PodSecurityContext struct {
	SELinuxOptions *SELinuxOptions `json:"seLinuxOptions,omitempty"`
	WindowsOptions *WindowsSecurityContextOptions `json:"windowsOptions,omitempty"`
	RunAsUser *int64 `json:"runAsUser,omitempty"`
	RunAsGroup *int64 `json:"runAsGroup,omitempty"`
	RunAsNonRoot *bool `json:"runAsNonRoot,omitempty"`
	SupplementalGroups []int64 `json:"supplementalGroups,omitempty"`
	SupplementalGroupsPolicy *SupplementalGroupsPolicy `json:"supplementalGroupsPolicy,omitempty"`
	FSGroup *int64 `json:"fsGroup,omitempty"`
	Sysctls []Sysctl `json:"sysctls,omitempty"`
	FSGroupChangePolicy *PodFSGroupChangePolicy `json:"fsGroupChangePolicy,omitempty"`
	SeccompProfile *SeccompProfile `json:"seccompProfile,omitempty"`
	AppArmorProfile *AppArmorProfile `json:"appArmorProfile,omitempty"`
}

type SeccompProfile struct {
	Type SeccompProfileType `json:"type"`
	LocalhostProfile *string `json:"localhostProfile,omitempty"`
}

type AppArmorProfile struct {
	Type AppArmorProfileType `json:"type"`
	LocalhostProfile *string `json:"localhostProfile,omitempty"`
}

type PodDNSConfig struct {
	Nameservers []string `json:"nameservers,omitempty"`
	Searches []string `json:"searches,omitempty"`
	Options []PodDNSConfigOption `json:"options,omitempty"`
}

type PodDNSConfigOption struct {
	Name string `json:"name,omitempty"`
	Value *string `json:"value,omitempty"`
}

type PodIP struct {
	IP string `json:"ip"`
}

type HostIP struct {
	IP string `json:"ip"`
}

type EphemeralContainerCommon struct {
	Name string `json:"name"`
	Image string `json:"image,omitempty"`
	Command []string `json:"command,omitempty"`
	Args []string `json:"args,omitempty"`
	WorkingDir string `json:"workingDir,omitempty"`
	Ports []ContainerPort `json:"ports,omitempty"`
	EnvFrom []EnvFromSource `json:"envFrom,omitempty"`
	Env []EnvVar `json:"env,omitempty"`
	Resources ResourceRequirements `json:"resources,omitempty"`
	ResizePolicy []ContainerResizePolicy `json:"resizePolicy,omitempty"`
	RestartPolicy *ContainerRestartPolicy `json:"restartPolicy,omitempty"`
	VolumeMounts []VolumeMount `json:"volumeMounts,omitempty"`
	VolumeDevices []VolumeDevice `json:"volumeDevices,omitempty"`
	LivenessProbe *Probe `json:"livenessProbe,omitempty"`
	ReadinessProbe *Probe `json:"readinessProbe,omitempty"`
	StartupProbe *Probe `json:"startupProbe,omitempty"`
	Lifecycle *Lifecycle `json:"lifecycle,omitempty"`
	TerminationMessagePath string `json:"terminationMessagePath,omitempty"`
	TerminationMessagePolicy TerminationMessagePolicy `json:"terminationMessagePolicy,omitempty"`
	ImagePullPolicy PullPolicy `json:"imagePullPolicy,omitempty"`
	SecurityContext *SecurityContext `json:"securityContext,omitempty"`
	Stdin bool `json:"stdin,omitempty"`
	StdinOnce bool `json:"stdinOnce,omitempty"`
	TTY bool `json:"tty,omitempty"`
}

type EphemeralContainer struct {
	EphemeralContainerCommon `json:",inline"`
	TargetContainerName string `json:"targetContainerName,omitempty"`
}

type PodStatus struct {
	Phase PodPhase `json:"phase,omitempty"`
	Conditions []PodCondition `json:"conditions,omitempty"`
	Message string `json:"message,omitempty"`
	Reason string `json:"reason,omitempty"`
	NominatedNodeName string `json:"nominatedNodeName,omitempty"`
	HostIP string `json:"hostIP,omitempty"`
	HostIPs []HostIP `json:"hostIPs,omitempty"`
	PodIP string `json:"podIP,omitempty"`
	PodIPs []PodIP `json:"podIPs,omitempty"`
	StartTime *metav1.Time `json:"startTime,omitempty"`
	InitContainerStatuses []ContainerStatus `json:"initContainerStatuses,omitempty"`
	ContainerStatuses []ContainerStatus `json:"containerStatuses,omitempty"`
	QOSClass PodQOSClass `json:"qosClass,omitempty"`
	EphemeralContainerStatuses []ContainerStatus `json:"ephemeralContainerStatuses,omitempty"`
	Resize PodResizeStatus `json:"resize,omitempty"`
	ResourceClaimStatuses []PodResourceClaimStatus `json:"resourceClaimStatuses,omitempty"`
}

type Pod struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Spec PodSpec `json:"spec,omitempty"`
	Status PodStatus `json:"status,omitempty"`
}

type PodList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items []Pod `json:"items"`
}

type PodTemplateSpec struct {
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Spec PodSpec `json:"spec,omitempty"`
}

type SessionAffinityConfig struct {
	ClientIP *ClientIPConfig `json:"clientIP,omitempty"`
}

type ClientIPConfig struct {
	TimeoutSeconds *int32 `json:"timeoutSeconds,omitempty"`
}

type ServiceStatus struct {
	LoadBalancer LoadBalancerStatus `json:"loadBalancer,omitempty"`
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

type LoadBalancerStatus struct {
	Ingress []LoadBalancerIngress `json:"ingress,omitempty"`
}

type LoadBalancerIngress struct {
	IP string `json:"ip,omitempty"`
	Hostname string `json:"hostname,omitempty"`
	IPMode *LoadBalancerIPMode `json:"ipMode,omitempty"`
	Ports []PortStatus `json:"ports,omitempty"`
}

type ServiceSpec struct {
	Ports []ServicePort `json:"ports,omitempty"`
	Selector map[string]string `json:"selector,omitempty"`
	ClusterIP string `json:"clusterIP,omitempty"`
	ClusterIPs []string `json:"clusterIPs,omitempty"`
	Type ServiceType `json:"type,omitempty"`
	ExternalIPs []string `json:"externalIPs,omitempty"`
	SessionAffinity ServiceAffinity `json:"sessionAffinity,omitempty"`
	LoadBalancerIP string `json:"loadBalancerIP,omitempty"`
	LoadBalancerSourceRanges []string `json:"loadBalancerSourceRanges,omitempty"`
	ExternalName string `json:"externalName,omitempty"`
	ExternalTrafficPolicy ServiceExternalTrafficPolicy `json:"externalTrafficPolicy,omitempty"`
	HealthCheckNodePort int32 `json:"healthCheckNodePort,omitempty"`
	PublishNotReadyAddresses bool `json:"publishNotReadyAddresses,omitempty"`
	SessionAffinityConfig *SessionAffinityConfig `json:"sessionAffinityConfig,omitempty"`
	IPFamilies []IPFamily `json:"ipFamilies,omitempty"`
	IPFamilyPolicy *IPFamilyPolicy `json:"ipFamilyPolicy,omitempty"`
	AllocateLoadBalancerNodePorts *bool `json:"allocateLoadBalancerNodePorts,omitempty"`
	LoadBalancerClass *string `json:"loadBalancerClass,omitempty"`
	InternalTrafficPolicy *ServiceInternalTrafficPolicy `json:"internalTrafficPolicy,omitempty"`
	TrafficDistribution *string `json:"trafficDistribution,omitempty"`
}

type ServicePort struct {
	Name string `json:"name,omitempty"`
	Protocol Protocol `json:"protocol,omitempty"`
	AppProtocol *string `json:"appProtocol,omitempty"`
	Port int32 `json:"port"`
	TargetPort intstr.IntOrString `json:"targetPort,omitempty"`
	NodePort int32 `json:"nodePort,omitempty"`
}

type Service struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Spec ServiceSpec `json:"spec,omitempty"`
	Status ServiceStatus `json:"status,omitempty"`
}

type ServiceList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items []Service `json:"items"`
}

type ServiceAccount struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Secrets []ObjectReference `json:"secrets,omitempty"`
	ImagePullSecrets []LocalObjectReference `json:"imagePullSecrets,omitempty"`
	AutomountServiceAccountToken *bool `json:"automountServiceAccountToken,omitempty"`
}

type ServiceAccountList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items []ServiceAccount `json:"items"`
}

type Endpoints struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Subsets []EndpointSubset `json:"subsets,omitempty"`
}

type EndpointSubset struct {
	Addresses []EndpointAddress `json:"addresses,omitempty"`
	NotReadyAddresses []EndpointAddress `json:"notReadyAddresses,omitempty"`
	Ports []EndpointPort `json:"ports,omitempty"`
}

type EndpointAddress struct {
	IP string `json:"ip"`
	Hostname string `json:"hostname,omitempty"`
	NodeName *string `json:"nodeName,omitempty"`
	TargetRef *ObjectReference `json:"targetRef,omitempty"`
}

type EndpointPort struct {
	Name string `json:"name,omitempty"`
	Port int32 `json:"port"`
	Protocol Protocol `json:"protocol,omitempty"`
	AppProtocol *string `json:"appProtocol,omitempty"`
}

type EndpointsList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items []Endpoints `json:"items"`
}

type NodeSpec struct {
	PodCIDR string `json:"podCIDR,omitempty"`
	PodCIDRs []string `json:"podCIDRs,omitempty"`
	ProviderID string `json:"providerID,omitempty"`
	Unschedulable bool `json:"unschedulable,omitempty"`
	Taints []Taint `json:"taints,omitempty"`
	ConfigSource *NodeConfigSource `json:"configSource,omitempty"`
	DoNotUseExternalID string `json:"externalID,omitempty"`
}

type NodeConfigSource struct {
	ConfigMap *ConfigMapNodeConfigSource `json:"configMap,omitempty"`
}

type ConfigMapNodeConfigSource struct {
	Namespace string `json:"namespace"`
	Name string `json:"name"`
	UID types.UID `json:"uid,omitempty"`
	ResourceVersion string `json:"resourceVersion,omitempty"`
	KubeletConfigKey string `json:"kubeletConfigKey"`
}

type DaemonEndpoint struct {
	Port int32 `json:"Port"`
}

type NodeDaemonEndpoints struct {
	KubeletEndpoint DaemonEndpoint `json:"kubeletEndpoint,omitempty"`
}

type NodeRuntimeHandlerFeatures struct {
	RecursiveReadOnlyMounts *bool `json:"recursiveReadOnlyMounts,omitempty"`
	UserNamespaces *bool `json:"userNamespaces,omitempty"`
}

type NodeRuntimeHandler struct {
	Name string `json:"name"`
	Features *NodeRuntimeHandlerFeatures `json:"features,omitempty"`
}

type NodeFeatures struct {
	SupplementalGroupsPolicy *bool `json:"supplementalGroupsPolicy,omitempty"`
}

type NodeSystemInfo struct {
	MachineID string `json:"machineID"`
	SystemUUID string `json:"systemUUID"`
	BootID string `json:"bootID"`
	KernelVersion string `json:"kernelVersion"`
	OSImage string `json:"osImage"`
	ContainerRuntimeVersion string `json:"containerRuntimeVersion"`
	KubeletVersion string `json:"kubeletVersion"`
	KubeProxyVersion string `json:"kubeProxyVersion"`
	OperatingSystem string `json:"operatingSystem"`
	Architecture string `json:"architecture"`
}

type NodeConfigStatus struct {
	Assigned *NodeConfigSource `json:"assigned,omitempty"`
	Active *NodeConfigSource `json:"active,omitempty"`
	LastKnownGood *NodeConfigSource `json:"lastKnownGood,omitempty"`
	Error string `json:"error,omitempty"`
}

type NodeStatus struct {
	Capacity ResourceList `json:"capacity,omitempty"`
	Allocatable ResourceList `json:"allocatable,omitempty"`
	Phase NodePhase `json:"phase,omitempty"`
	Conditions []NodeCondition `json:"conditions,omitempty"`
	Addresses []NodeAddress `json:"addresses,omitempty"`
	DaemonEndpoints NodeDaemonEndpoints `json:"daemonEndpoints,omitempty"`
	NodeInfo NodeSystemInfo `json:"nodeInfo,omitempty"`
	Images []ContainerImage `json:"images,omitempty"`
	VolumesInUse []UniqueVolumeName `json:"volumesInUse,omitempty"`
	VolumesAttached []AttachedVolume `json:"volumesAttached,omitempty"`
	Config *NodeConfigStatus `json:"config,omitempty"`
	RuntimeHandlers []NodeRuntimeHandler `json:"runtimeHandlers,omitempty"`
	Features *NodeFeatures `json:"features,omitempty"`
}

type AttachedVolume struct {
	Name UniqueVolumeName `json:"name"`
	DevicePath string `json:"devicePath"`
}

type ContainerImage struct {
	Names []string `json:"names"`
	SizeBytes int64 `json:"sizeBytes,omitempty"`
}

type NodeCondition struct {
	Type NodeConditionType `json:"type"`
	Status ConditionStatus `json:"status"`
	LastHeartbeatTime metav1.Time `json:"lastHeartbeatTime,omitempty"`
	LastTransitionTime metav1.Time `json:"lastTransitionTime,omitempty"`
	Reason string `json:"reason,omitempty"`
	Message string `json:"message,omitempty"`
}

type NodeAddress struct {
	Type NodeAddressType `json:"type"`
	Address string `json:"address"`
}

type Node struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Spec NodeSpec `json:"spec,omitempty"`
	Status NodeStatus `json:"status,omitempty"`
}

type NodeList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items []Node `json:"items"`
}

type NamespaceSpec struct {
	Finalizers []FinalizerName `json:"finalizers,omitempty"`
}

type NamespaceStatus struct {
	Phase NamespacePhase `json:"phase,omitempty"`
	Conditions []NamespaceCondition `json:"conditions,omitempty"`
}

type NamespaceCondition struct {
	Type NamespaceConditionType `json:"type"`
	Status ConditionStatus `json:"status"`
	LastTransitionTime metav1.Time `json:"lastTransitionTime,omitempty"`
	Reason string `json:"reason,omitempty"`
	Message string `json:"message,omitempty"`
}

type Namespace struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Spec NamespaceSpec `json:"spec,omitempty"`
	Status NamespaceStatus `json:"status,omitempty"`
}

type NamespaceList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items []Namespace `json:"items"`
}

type Binding struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Target ObjectReference `json:"target"`
}

type ObjectReference struct {
	Kind string `json:"kind,omitempty"`
	Namespace string `json:"namespace,omitempty"`
	Name string `json:"name,omitempty"`
	UID types.UID `json:"uid,omitempty"`
	APIVersion string `json:"apiVersion,omitempty"`
	ResourceVersion string `json:"resourceVersion,omitempty"`
	FieldPath string `json:"fieldPath,omitempty"`
}

type LocalObjectReference struct {
	Name string `json:"name,omitempty"`
}

type TypedLocalObjectReference struct {
	APIGroup *string `json:"apiGroup"`
	Kind string `json:"kind"`
	Name string `json:"name"`
}

type EventSource struct {
	Component string `json:"component,omitempty"`
	Host string `json:"host,omitempty"`
}

type Event struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	InvolvedObject ObjectReference `json:"involvedObject"`
	Reason string `json:"reason,omitempty"`
	Message string `json:"message,omitempty"`
	Source EventSource `json:"source,omitempty"`
	FirstTimestamp metav1.Time `json:"firstTimestamp,omitempty"`
	LastTimestamp metav1.Time `json:"lastTimestamp,omitempty"`
	Count int32 `json:"count,omitempty"`
	Type string `json:"type,omitempty"`
	EventTime metav1.MicroTime `json:"eventTime,omitempty"`
	Series *EventSeries `json:"series,omitempty"`
	Action string `json:"action,omitempty"`
	Related *ObjectReference `json:"related,omitempty"`
	ReportingController string `json:"reportingComponent"`
	ReportingInstance string `json:"reportingInstance"`
}

type EventSeries struct {
	Count int32 `json:"count,omitempty"`
	LastObservedTime metav1.MicroTime `json:"lastObservedTime,omitempty"`
}

type EventList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items []Event `json:"items"`
}

type Secret struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Immutable *bool `json:"immutable,omitempty"`
	Data map[string][]byte `json:"data,omitempty"`
	StringData map[string]string `json:"stringData,omitempty"`
	Type SecretType `json:"type,omitempty"`
}

type SecretList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items []Secret `json:"items"`
}

type ConfigMap struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Immutable *bool `json:"immutable,omitempty"`
	Data map[string]string `json:"data,omitempty"`
	BinaryData map[string][]byte `json:"binaryData,omitempty"`
}

type ConfigMapList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items []ConfigMap `json:"items"`
}

type DownwardAPIVolumeSource struct {
	Items []DownwardAPIVolumeFile `json:"items,omitempty"`
	DefaultMode *int32 `json:"defaultMode,omitempty"`
}

type DownwardAPIVolumeFile struct {
	Path string `json:"path"`
	FieldRef *ObjectFieldSelector `json:"fieldRef,omitempty"`
	ResourceFieldRef *ResourceFieldSelector `json:"resourceFieldRef,omitempty"`
	Mode *int32 `json:"mode,omitempty"`
}

type DownwardAPIProjection struct {
	Items []DownwardAPIVolumeFile `json:"items,omitempty"`
}

type SecurityContext struct {
	Capabilities *Capabilities `json:"capabilities,omitempty"`
	Privileged *bool `json:"privileged,omitempty"`
	SELinuxOptions *SELinuxOptions `json:"seLinuxOptions,omitempty"`
	WindowsOptions *WindowsSecurityContextOptions `json:"windowsOptions,omitempty"`
	RunAsUser *int64 `json:"runAsUser,omitempty"`
	RunAsGroup *int64 `json:"runAsGroup,omitempty"`
	RunAsNonRoot *bool `json:"runAsNonRoot,omitempty"`
	ReadOnlyRootFilesystem *bool `json:"readOnlyRootFilesystem,omitempty"`
	AllowPrivilegeEscalation *bool `json:"allowPrivilegeEscalation,omitempty"`
	ProcMount *ProcMountType `json:"procMount,omitempty"`
	SeccompProfile *SeccompProfile `json:"seccompProfile,omitempty"`
	AppArmorProfile *AppArmorProfile `json:"appArmorProfile,omitempty"`
}

type SELinuxOptions struct {
	User string `json:"user,omitempty"`
	Role string `json:"role,omitempty"`
	Type string `json:"type,omitempty"`
	Level string `json:"level,omitempty"`
}

type WindowsSecurityContextOptions struct {
	GMSACredentialSpecName *string `json:"gmsaCredentialSpecName,omitempty"`
	GMSACredentialSpec *string `json:"gmsaCredentialSpec,omitempty"`
	RunAsUserName *string `json:"runAsUserName,omitempty"`
	HostProcess *bool `json:"hostProcess,omitempty"`
}

type Sysctl struct {
	Name string `json:"name"`
	Value string `json:"value"`
}

type PortStatus struct {
	Port int32 `json:"port"`
	Protocol Protocol `json:"protocol"`
	Error *string `json:"error,omitempty"`
}

type ImageVolumeSource struct {
	Reference string `json:"reference,omitempty"`
	PullPolicy PullPolicy `json:"pullPolicy,omitempty"`
}
