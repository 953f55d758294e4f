//! Compiles the OpenAPI v2 wire schema (`proto/openapi_v2.proto`: the messages kubectl decodes
//! from `GET /openapi/v2`, as far as skerry writes them) with `protox` (pure Rust, so a machine
//! without `protoc` builds) and generates prost messages for it.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto = "proto/openapi_v2.proto";
    println!("cargo:rerun-if-changed={proto}");
    // protox resolves `google/protobuf/any.proto` from its bundled well-known types.
    let file_descriptors = protox::compile([proto], ["proto"])?;
    prost_build::Config::new().compile_fds(file_descriptors)?;
    Ok(())
}
