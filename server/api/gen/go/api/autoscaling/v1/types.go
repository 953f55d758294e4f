package v1

type Scale struct {
	metav1.TypeMeta `json:""`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Spec ScaleSpec `json:"spec,omitempty"`
	Status ScaleStatus `json:"status,omitempty"`
}

type ScaleSpec struct {
	Replicas int32 `json:"replicas,omitempty"`
}

type ScaleStatus struct {
	Replicas int32 `json:"replicas"`
	Selector string `json:"selector,omitempty"`
}
