//! Durable Events-Store identities (connector-extra.md §3.8): a receiver on `events-store/…`
//! whose source asks for expiry-policy `never` is identified by its container-id and link
//! name, [`identity`]. One live attach per identity in this gateway process, and a re-attach
//! (after a DETACH or a reconnect) resumes after the last sequence delivered to it.
//!
//! Node-local, as KubeMQ's: the [`Registry`] (in `engine`, as it lives in the process's shared
//! state the cores hold) is lost
//! with the process (a restart starts every identity anew, from its `x-opt-kubemq-start`).
pub use crate::engine::identities::Registry;

/// `sanitize40(containerID) + "_" + sanitize40(linkName) + "_" + fnv1a32hex(containerID + "|" +
/// linkName)` (§3.8).
pub fn identity(container_id: &str, link_name: &str) -> String {
    let mut joined = Vec::with_capacity(container_id.len() + 1 + link_name.len());
    joined.extend_from_slice(container_id.as_bytes());
    joined.push(b'|');
    joined.extend_from_slice(link_name.as_bytes());
    format!("{}_{}_{:08x}", sanitize40(container_id), sanitize40(link_name), fnv1a32(&joined))
}

/// The spec names `sanitize40` without defining it; ours: every character outside
/// `[A-Za-z0-9_.-]` becomes one `_` (a multi-byte one too), and the result is cut at 40
/// bytes (all ASCII by then). Two names that sanitize alike still differ in the hash part.
pub fn sanitize40(s: &str) -> String {
    s.chars().map(|c| if c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-') { c } else { '_' }).take(40).collect()
}

/// 32-bit FNV-1a.
pub fn fnv1a32(bytes: &[u8]) -> u32 {
    bytes.iter().fold(0x811c_9dc5u32, |h, &b| (h ^ u32::from(b)).wrapping_mul(0x0100_0193))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identity_is_sanitized_names_and_the_fnv_hash_of_both() {
        // FNV-1a 32 of "" is the offset basis; of "a" a published vector.
        assert_eq!(fnv1a32(b""), 0x811c9dc5);
        assert_eq!(fnv1a32(b"a"), 0xe40c292c);
        assert_eq!(identity("app-1", "orders sub"), format!("app-1_orders_sub_{:08x}", fnv1a32(b"app-1|orders sub")));
        let long = "x".repeat(100);
        let id = identity(&long, "é/ü");
        assert!(id.starts_with(&format!("{}___", "x".repeat(40))), "{id}");
        assert_eq!(sanitize40("a.b-c_d:e"), "a.b-c_d_e");
        // Sanitized alike, told apart by the hash.
        assert_ne!(identity("a:b", "l"), identity("a;b", "l"));
    }
}
