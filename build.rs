//! Generates the KubeMQ gRPC types, server and client (`src/wire/`) from `proto/kubemq.proto`.
//!
//! protoc comes from the `protoc-bin-vendored` crate, so building needs no system protoc.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/kubemq.proto");
    // A `PROTOC` already set in the environment wins (e.g. a platform the vendored crate lacks).
    if std::env::var_os("PROTOC").is_none() {
        let protoc = protoc_bin_vendored::protoc_bin_path()?;
        // Build scripts are single-threaded, so setting the environment here races nothing.
        std::env::set_var("PROTOC", protoc);
    }
    tonic_build::configure().build_server(true).build_client(true).compile_protos(&["proto/kubemq.proto"], &["proto"])?;
    Ok(())
}
