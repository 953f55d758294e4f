package v1

type Lease struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Spec LeaseSpec `json:"spec,omitempty"`
}

type LeaseSpec struct {
	HolderIdentity *string `json:"holderIdentity,omitempty"`
	LeaseDurationSeconds *int32 `json:"leaseDurationSeconds,omitempty"`
	AcquireTime *metav1.MicroTime `json:"acquireTime,omitempty"`
	RenewTime *metav1.MicroTime `json:"renewTime,omitempty"`
	LeaseTransitions *int32 `json:"leaseTransitions,omitempty"`
}

type LeaseList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items []Lease `json:"items"`
}
