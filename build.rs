//! Generates the KubeMQ gRPC types, server and client (`src/wire/`) from `proto/kubemq.proto`.
//!
//! `proto/kubemq.proto` is KubeMQ's public schema, `map<string, string>` fields and all: what a
//! native client generates its code from. stompgate compiles a copy of it in which every such map
//! is spelled out as `repeated TagsEntry`, the message a map field is defined as on the wire
//! (key = 1, value = 2), so both are wire-identical. The copy exists because a generated map
//! encoder leaves an empty key or value out of its entry (proto3 allows that), and SDKs whose map
//! decoder has no default value (kubemq-js 1.2.3) then fail the whole message with "Response
//! message parsing error". `optional` gives the entry's fields explicit presence: stompgate always
//! sets both (src/wire/convert.rs), so an empty string is still written, and an entry that omits
//! either (a proto3-minimal entry from an SDK) decodes as None, read as "". Duplicate keys keep
//! map semantics there too: the last entry wins.
//!
//! protoc comes from the `protoc-bin-vendored` crate, so building needs no system protoc.

use std::path::PathBuf;

const PUBLIC_PROTO: &str = "proto/kubemq.proto";
const MAP_FIELD: &str = "map<string, string> ";
const ENTRY_MESSAGE: &str = "\n// The wire form of every `map<string, string>` field above (build.rs says why).\n\
message TagsEntry {\n  optional string key = 1;\n  optional string value = 2;\n}\n";

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Only the public schema and this script decide the generated code. tonic-build's own
    // rerun-if-changed would name the copy below, which this script writes: every build would
    // then rerun it and recompile the crate.
    println!("cargo:rerun-if-changed={PUBLIC_PROTO}");
    println!("cargo:rerun-if-changed=build.rs");
    // A `PROTOC` already set in the environment wins (e.g. a platform the vendored crate lacks).
    if std::env::var_os("PROTOC").is_none() {
        let protoc = protoc_bin_vendored::protoc_bin_path()?;
        // Build scripts are single-threaded, so setting the environment here races nothing.
        std::env::set_var("PROTOC", protoc);
    }
    let public = std::fs::read_to_string(PUBLIC_PROTO)?;
    if !public.contains(MAP_FIELD) {
        return Err(format!("{PUBLIC_PROTO} has no `{MAP_FIELD}` field: update build.rs").into());
    }
    let wire = public.replace(MAP_FIELD, "repeated TagsEntry ") + ENTRY_MESSAGE;
    let dir = PathBuf::from(std::env::var("OUT_DIR")?).join("wire-proto");
    std::fs::create_dir_all(&dir)?;
    let wire_path = dir.join("kubemq.proto");
    if std::fs::read_to_string(&wire_path).ok().as_deref() != Some(wire.as_str()) {
        std::fs::write(&wire_path, &wire)?;
    }
    tonic_build::configure().build_server(true).build_client(true).emit_rerun_if_changed(false).compile_protos(&[&wire_path], &[&dir])?;
    Ok(())
}
