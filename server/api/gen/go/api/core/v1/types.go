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
