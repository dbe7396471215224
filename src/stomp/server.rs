//! Every frame the server sends, built in one place: CONNECTED, RECEIPT, ERROR, and one
//! MESSAGE builder for events, queue and RPC-reply deliveries alike. Each appends to the
//! connection's write buffer and returns how many headers the negotiated version could not
//! represent (dropped, and counted by the caller: seed 000).
use super::encode::FrameWriter;
use super::error::WireError;
use super::frame::{Command, Version};
use bytes::BytesMut;

/// The server's name in CONNECTED.
pub const SERVER: &str = concat!("stompgate/", env!("CARGO_PKG_VERSION"));

/// CONNECTED for `version`, advertising the server's heart-beat `(send, expect)` in ms.
pub fn write_connected(buf: &mut BytesMut, version: Version, heart_beat: (u64, u64), session: &[u8]) -> u32 {
    let mut n = itoa::Buffer::new();
    let mut hb = Vec::with_capacity(24);
    hb.extend_from_slice(n.format(heart_beat.0).as_bytes());
    hb.push(b',');
    hb.extend_from_slice(n.format(heart_beat.1).as_bytes());
    let mut w = FrameWriter::begin(buf, version, Command::Connected);
    w.header(b"version", version.as_str().as_bytes());
    w.header(b"heart-beat", &hb);
    w.header(b"session", session);
    w.header(b"server", SERVER.as_bytes());
    w.finish(b"")
}

pub fn write_receipt(buf: &mut BytesMut, version: Version, receipt: &[u8]) -> u32 {
    let mut w = FrameWriter::begin(buf, version, Command::Receipt);
    w.header(b"receipt-id", receipt);
    w.finish(b"")
}

/// ERROR with the sanitized vocabulary text, the failing frame's receipt id, and the short
/// hint as a text body.
pub fn write_error(buf: &mut BytesMut, version: Version, err: WireError, receipt: Option<&[u8]>) -> u32 {
    let hint = err.hint();
    let hint = hint.as_bytes();
    let mut w = FrameWriter::begin(buf, version, Command::Error);
    w.header(b"message", err.message().as_bytes());
    if let Some(r) = receipt {
        w.header(b"receipt-id", r);
    }
    if err == WireError::UnsupportedVersion {
        w.header(b"version", b"1.0,1.1,1.2");
    }
    if !hint.is_empty() {
        w.header(b"content-type", b"text/plain");
    }
    w.finish(hint)
}

/// The headers every MESSAGE starts with, in this order.
pub struct MessageHead<'a> {
    /// The canonical destination (seed 000: primary prefix, slash form).
    pub destination: &'a [u8],
    pub message_id: &'a [u8],
    /// The client's subscription id.
    pub subscription: &'a [u8],
    /// 1.2 subscriptions that need ACKs: the id to acknowledge.
    pub ack: Option<&'a [u8]>,
    /// A queue message delivered before.
    pub redelivered: bool,
    /// An RPC reply to a request that set one.
    pub correlation_id: Option<&'a [u8]>,
}

/// One MESSAGE: `head`, then the headers `rest` writes (tags, pattern-specific ones), then
/// `body`. Inlined: it runs once per delivery, and as a call it cost ~90 instructions per
/// events delivery over the inline encoding it replaced (perf/RESULTS.md, instruction counts).
#[inline]
pub fn write_message(buf: &mut BytesMut, version: Version, head: &MessageHead<'_>, rest: impl FnOnce(&mut FrameWriter<'_>), body: &[u8]) -> u32 {
    let mut w = FrameWriter::begin(buf, version, Command::Message);
    w.header(b"destination", head.destination);
    w.header(b"message-id", head.message_id);
    w.header(b"subscription", head.subscription);
    if let Some(ack) = head.ack {
        w.header(b"ack", ack);
    }
    if head.redelivered {
        w.header(b"redelivered", b"true");
    }
    if let Some(c) = head.correlation_id {
        w.header(b"correlation-id", c);
    }
    rest(&mut w);
    w.finish(body)
}
