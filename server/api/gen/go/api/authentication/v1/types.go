package v1

type TokenReview struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Spec TokenReviewSpec `json:"spec"`
	Status TokenReviewStatus `json:"status,omitempty"`
}

type TokenReviewSpec struct {
	Token string `json:"token,omitempty"`
	Audiences []string `json:"audiences,omitempty"`
}

type TokenReviewStatus struct {
	Authenticated bool `json:"authenticated,omitempty"`
	User UserInfo `json:"user,omitempty"`
	Audiences []string `json:"audiences,omitempty"`
	Error string `json:"error,omitempty"`
}

type UserInfo struct {
	Username string `json:"username,omitempty"`
	UID string `json:"uid,omitempty"`
	Groups []string `json:"groups,omitempty"`
	Extra map[string]ExtraValue `json:"extra,omitempty"`
}

type TokenRequest struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Spec TokenRequestSpec `json:"spec"`
	Status TokenRequestStatus `json:"status,omitempty"`
}

type TokenRequestSpec struct {
	Audiences []string `json:"audiences"`
	ExpirationSeconds *int64 `json:"expirationSeconds"`
	BoundObjectRef *BoundObjectReference `json:"boundObjectRef"`
}

type TokenRequestStatus struct {
	Token string `json:"token"`
	ExpirationTimestamp metav1.Time `json:"expirationTimestamp"`
}

type BoundObjectReference struct {
	Kind string `json:"kind,omitempty"`
	APIVersion string `json:"apiVersion,omitempty"`
	Name string `json:"name,omitempty"`
	UID types.UID `json:"uid,omitempty"`
}
