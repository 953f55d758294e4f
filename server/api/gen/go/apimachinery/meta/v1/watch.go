package v1

type WatchEvent struct {
	Type string `json:"type"`
	Object runtime.RawExtension `json:"object"`
}
