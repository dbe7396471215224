//! CONNECT-time arithmetic: version negotiation and heart-beat negotiation.
use super::frame::Version;

/// Highest common version from `accept-version` (comma separated, order-independent,
/// whitespace-tolerant). Missing or empty → 1.0. `None` = no common version.
pub fn negotiate_version(accept_version: Option<&[u8]>) -> Option<Version> {
    let _ = accept_version;
    todo!("codec helper")
}

/// Parses a `heart-beat: cx,cy` header (ms). Missing → (0, 0). Malformed → Err.
pub fn parse_heart_beat(value: Option<&[u8]>) -> Result<(u64, u64), ()> {
    let _ = value;
    todo!("codec helper")
}

/// Negotiated intervals in ms, given the client's `(cx, cy)` and the server's `(sx, sy)`:
/// `(server_sends_every, client_must_send_every)`; 0 = off. Per the spec, the server sends
/// every max(sx, cy) when both are non-zero; the client sends every max(cx, sy).
pub fn negotiate_heart_beat(client: (u64, u64), server: (u64, u64)) -> (u64, u64) {
    let _ = (client, server);
    todo!("codec helper")
}
