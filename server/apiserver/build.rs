//! Compiles gnostic's OpenAPI v2 protobuf (`proto/OpenAPIv2.proto`, the message kubectl decodes
//! from `GET /openapi/v2`) with `protox` (pure Rust, so a machine without `protoc` builds) and
//! generates prost messages for it.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto = "proto/OpenAPIv2.proto";
    println!("cargo:rerun-if-changed={proto}");
    // protox resolves `google/protobuf/any.proto` from its bundled well-known types.
    let file_descriptors = protox::compile([proto], ["proto"])?;
    prost_build::Config::new().compile_fds(file_descriptors)?;
    Ok(())
}
