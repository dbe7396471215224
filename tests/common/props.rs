//! Frame assertions and small STOMP steps on the raw client, exact to the byte: receipts as
//! barriers, ERROR-then-close, liveness probes.
use super::{Client, Frame, TestServer};
use std::time::Duration;
// Re-exported for `error_bytes` callers; a test binary that uses none of them (counters)
// would otherwise warn.
#[allow(unused_imports)]
pub use stompgate::stomp::error::{Malformed, TooLarge};
#[allow(unused_imports)]
pub use stompgate::stomp::WireError;

/// One frame's bytes from parts (headers written as given, no escaping).
pub fn frame_bytes(command: &str, headers: &[(&str, &str)], body: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(command.as_bytes());
    out.push(b'\n');
    for (n, v) in headers {
        out.extend_from_slice(n.as_bytes());
        out.push(b':');
        out.extend_from_slice(v.as_bytes());
        out.push(b'\n');
    }
    out.push(b'\n');
    out.extend_from_slice(body);
    out.push(0);
    out
}

/// A client connected with `accept-version:<version>`.
pub fn connect_version(server: &TestServer, version: &str) -> Client {
    let mut c = server.client();
    let f = c.connect(version);
    assert_eq!(f.command, "CONNECTED", "{f:?}");
    assert_eq!(f.header("version"), Some(version), "{f:?}");
    c
}

/// Asserts the frame's exact bytes, printing both sides readably on failure.
pub fn assert_raw(frame: &Frame, expected: &[u8]) {
    assert_eq!(String::from_utf8_lossy(&frame.raw), String::from_utf8_lossy(expected), "exact frame bytes differ");
    assert_eq!(frame.raw, expected);
}

/// Asserts the frame's headers are exactly `expected` as a multiset (order-insensitive).
pub fn assert_headers(frame: &Frame, expected: &[(&str, &str)]) {
    let mut got: Vec<(String, String)> = frame.headers.clone();
    let mut want: Vec<(String, String)> = expected.iter().map(|(n, v)| (n.to_string(), v.to_string())).collect();
    got.sort();
    want.sort();
    assert_eq!(got, want, "headers of {:?}", String::from_utf8_lossy(&frame.raw));
}

/// Sends a frame with `receipt:<receipt>` and asserts the exact RECEIPT comes back next.
pub fn send_with_receipt(c: &mut Client, command: &str, headers: &[(&str, &str)], body: &[u8], receipt: &str) {
    let mut h: Vec<(&str, &str)> = headers.to_vec();
    h.push(("receipt", receipt));
    c.send(command, &h, body);
    let f = c.frame();
    assert_raw(&f, format!("RECEIPT\nreceipt-id:{receipt}\ncontent-length:0\n\n\0").as_bytes());
}

/// SUBSCRIBE `id` to `destination` (plus `extra` headers) and wait for its RECEIPT, so
/// the subscription is live at the owner before anything is sent.
pub fn subscribe(c: &mut Client, id: &str, destination: &str, extra: &[(&str, &str)]) {
    let mut h = vec![("id", id), ("destination", destination)];
    h.extend_from_slice(extra);
    let receipt = format!("sub-{id}");
    send_with_receipt(c, "SUBSCRIBE", &h, b"", &receipt);
}

/// Reads the next frame, asserts it is ERROR with exactly this `message`, then asserts
/// the server closes the connection. Returns the ERROR.
pub fn expect_error_close(c: &mut Client, message: &str) -> Frame {
    let f = c.frame();
    assert_eq!(f.command, "ERROR", "expected ERROR, got {:?}", String::from_utf8_lossy(&f.raw));
    assert_eq!(f.header("message"), Some(message), "{:?}", String::from_utf8_lossy(&f.raw));
    assert_eq!(f.count("message"), 1);
    assert!(c.closed(), "connection still open after ERROR {:?}", String::from_utf8_lossy(&f.raw));
    f
}

/// Proves a connection is alive and in order: a SUBSCRIBE+UNSUBSCRIBE with receipts.
pub fn assert_alive(c: &mut Client) {
    let dest = format!("/topic/{}", super::unique("alive"));
    send_with_receipt(c, "SUBSCRIBE", &[("id", "alive-probe"), ("destination", &dest)], b"", "alive-1");
    send_with_receipt(c, "UNSUBSCRIBE", &[("id", "alive-probe")], b"", "alive-2");
}

/// A fresh client on `server` can CONNECT, subscribe, send and receive.
pub fn assert_server_serves(server: &TestServer) {
    let mut c = server.connected();
    let dest = format!("/topic/{}", super::unique("serves"));
    subscribe(&mut c, "s", &dest, &[]);
    c.send("SEND", &[("destination", &dest)], b"still here");
    let m = c.frame();
    assert_eq!(m.command, "MESSAGE");
    assert_eq!(m.header("destination"), Some(dest.as_str()));
    assert_eq!(m.body, b"still here");
}

/// How long tests wait to be sure nothing (more) arrives.
pub const QUIET: Duration = Duration::from_millis(200);

/// The exact bytes of the ERROR the gateway sends for `err` (issue 18: the body is the error's
/// hint naming the broken rule), echoing `receipt` as `receipt-id`.
pub fn error_bytes(err: stompgate::stomp::WireError, receipt: Option<&str>) -> Vec<u8> {
    let hint = err.hint();
    let mut out = format!("ERROR\nmessage:{}\n", err.message());
    if let Some(r) = receipt {
        out.push_str(&format!("receipt-id:{r}\n"));
    }
    out.push_str(&format!("content-type:text/plain\ncontent-length:{}\n\n{hint}\0", hint.len()));
    out.into_bytes()
}
