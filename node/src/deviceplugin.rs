//! The device plugin API (`k8s.io/kubelet/pkg/apis/deviceplugin`), compiled from
//! `proto/deviceplugin/v1beta1/api.proto`: the messages, the kubelet's `Registration` server
//! and its `DevicePlugin` client, and the other two sides for plugins written against this
//! crate (the tests' fake plugin). The kubelet's side is [`crate::cm::device_manager`].

/// Version `v1beta1`, the one upstream's kubelet serves.
#[allow(clippy::all, missing_docs)]
pub mod v1beta1 {
    tonic::include_proto!("v1beta1");
}
