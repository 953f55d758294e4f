//! Compiles the CRI v1 proto, the few containerd services skerry calls and the gRPC health
//! protocol (gRPC probes) and the device plugin API with `protox` (pure
//! Rust, so a machine without `protoc` builds) into prost messages and tonic clients.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protos = [
        "proto/cri.proto",
        "proto/containerd/types.proto",
        "proto/containerd/content.proto",
        "proto/containerd/images.proto",
        "proto/containerd/leases.proto",
        "proto/containerd/version.proto",
    ];
    for proto in protos {
        println!("cargo:rerun-if-changed={proto}");
    }
    let file_descriptors = protox::compile(protos, ["proto"])?;
    tonic_prost_build::configure()
        .build_server(false)
        // Registry credentials: `cri::AuthConfig`'s Debug is written by hand, redacted.
        .skip_debug([".runtime.v1.AuthConfig"])
        .compile_fds(file_descriptors)?;
    // The gRPC health protocol: the client for gRPC probes, the server for their tests.
    let health = "proto/grpc/health/v1/health.proto";
    println!("cargo:rerun-if-changed={health}");
    tonic_prost_build::configure().compile_fds(protox::compile([health], ["proto"])?)?;
    // The device plugin API: the kubelet serves `Registration` and calls `DevicePlugin`;
    // the other two sides are for plugins (the tests' fake one).
    let deviceplugin = "proto/deviceplugin/v1beta1/api.proto";
    println!("cargo:rerun-if-changed={deviceplugin}");
    tonic_prost_build::configure().compile_fds(protox::compile([deviceplugin], ["proto"])?)?;
    Ok(())
}
