//! The KubeMQ wire: the protobuf types generated from `proto/kubemq.proto` ([`pb`]), their
//! conversions to and from the array's domain types ([`convert`]), and the constants both ends
//! of the wire share.
//!
//! Why a module of its own: two sides speak this wire. The gRPC server (`grpc/`) serves it to
//! native SDK clients; the egress (`egress/`) is a client of a remote array through it. Both
//! depend on this module and neither on the other.
pub mod convert;
pub mod kind;

/// Types, server and client generated from `proto/kubemq.proto` by `build.rs` (each
/// `map<string, string>` compiled as a `repeated TagsEntry`; build.rs says why).
#[allow(clippy::all, clippy::pedantic, missing_docs, non_camel_case_types)]
pub mod pb {
    tonic::include_proto!("kubemq");
}

/// Largest message either side decodes or encodes: the community server's default
/// `Grpc.BodyLimit` (100 MiB), not tonic's 4 MiB.
pub const MAX_MESSAGE_BYTES: usize = 100 * 1024 * 1024;

/// The kernel's host name, if it is set and UTF-8. Both sides name themselves with it: the
/// server in `Ping`'s `Host`, the egress in its client id towards the array.
pub fn host_name() -> Option<String> {
    let mut buf = [0u8; 256];
    // SAFETY: the pointer and length describe `buf`, which outlives the call.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc != 0 {
        return None;
    }
    let len = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    let name = std::str::from_utf8(&buf[..len]).ok()?.trim();
    (!name.is_empty()).then(|| name.to_string())
}
