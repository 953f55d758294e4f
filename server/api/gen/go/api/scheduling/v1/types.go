package v1

type PriorityClass struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Value int32 `json:"value"`
	GlobalDefault bool `json:"globalDefault,omitempty"`
	Description string `json:"description,omitempty"`
	PreemptionPolicy *apiv1.PreemptionPolicy `json:"preemptionPolicy,omitempty"`
}

type PriorityClassList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items []PriorityClass `json:"items"`
}
