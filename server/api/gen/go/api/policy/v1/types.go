package v1

type PodDisruptionBudgetSpec struct {
	MinAvailable *intstr.IntOrString `json:"minAvailable,omitempty"`
	Selector *metav1.LabelSelector `json:"selector,omitempty"`
	MaxUnavailable *intstr.IntOrString `json:"maxUnavailable,omitempty"`
	UnhealthyPodEvictionPolicy *UnhealthyPodEvictionPolicyType `json:"unhealthyPodEvictionPolicy,omitempty"`
}

type PodDisruptionBudgetStatus struct {
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	DisruptedPods map[string]metav1.Time `json:"disruptedPods,omitempty"`
	DisruptionsAllowed int32 `json:"disruptionsAllowed"`
	CurrentHealthy int32 `json:"currentHealthy"`
	DesiredHealthy int32 `json:"desiredHealthy"`
	ExpectedPods int32 `json:"expectedPods"`
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

type PodDisruptionBudget struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Spec PodDisruptionBudgetSpec `json:"spec,omitempty"`
	Status PodDisruptionBudgetStatus `json:"status,omitempty"`
}

type PodDisruptionBudgetList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items []PodDisruptionBudget `json:"items"`
}
