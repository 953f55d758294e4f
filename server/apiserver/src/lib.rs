//! skerry's Kubernetes apiserver.
