//! Compiles etcd's v3 API and skerry's command protos with `protox` (pure Rust, so a machine
//! without `protoc` builds) and generates prost messages plus tonic clients and servers.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protos = ["proto/kv.proto", "proto/rpc.proto", "proto/command.proto"];
    for proto in protos {
        println!("cargo:rerun-if-changed={proto}");
    }
    let file_descriptors = protox::compile(protos, ["proto"])?;
    tonic_prost_build::configure()
        // Keys and values are shared between the store, watch events and responses without copies.
        .bytes(".")
        .compile_fds(file_descriptors)?;
    Ok(())
}
