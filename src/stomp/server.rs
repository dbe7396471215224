//! Every frame the server sends, built in one place: CONNECTED, RECEIPT, ERROR, and MESSAGE
//! for events, queue and RPC-reply deliveries alike (in one pass, or with a subscription's
//! head encoded once: [`EncodedHead`], the same bytes). Each appends to the
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
    w.own_header(b"version", version.as_str().as_bytes());
    w.own_header(b"heart-beat", &hb);
    w.own_header(b"session", session);
    w.own_header(b"server", SERVER.as_bytes());
    w.finish(b"")
}

pub fn write_receipt(buf: &mut BytesMut, version: Version, receipt: &[u8]) -> u32 {
    let mut w = FrameWriter::begin(buf, version, Command::Receipt);
    w.own_header(b"receipt-id", receipt);
    w.finish(b"")
}

/// ERROR with the sanitized vocabulary text, the failing frame's receipt id, and the short
/// hint as a text body.
pub fn write_error(buf: &mut BytesMut, version: Version, err: WireError, receipt: Option<&[u8]>) -> u32 {
    let hint = err.hint();
    let hint = hint.as_bytes();
    let mut w = FrameWriter::begin(buf, version, Command::Error);
    w.own_header(b"message", err.message().as_bytes());
    if let Some(r) = receipt {
        w.own_header(b"receipt-id", r);
    }
    if err == WireError::UnsupportedVersion {
        w.own_header(b"version", b"1.0,1.1,1.2");
    }
    if !hint.is_empty() {
        w.own_header(b"content-type", b"text/plain");
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

/// The part of a MESSAGE that is the same for every message one subscription gets from one
/// destination — the command line with `destination`, and `subscription` — encoded once
/// (escaped for the version, an unrepresentable header dropped and counted) and copied into
/// each frame by [`write_message_encoded`]: escaping those values byte by byte was the largest
/// single cost of a delivery (perf/RESULTS.md, "Encode once"). Its buffer is reused when
/// the destination changes (a wildcard subscription's messages come from many channels).
#[derive(Debug, Default)]
pub struct EncodedHead {
    bytes: BytesMut,
    /// Where `subscription`'s line starts (`message-id` goes between the two).
    split: usize,
    dropped: u32,
}

impl EncodedHead {
    /// Encodes `destination` and `subscription` for `version`, replacing what it held.
    pub fn encode(&mut self, version: Version, destination: &[u8], subscription: &[u8]) {
        self.bytes.clear();
        let mut w = FrameWriter::begin(&mut self.bytes, version, Command::Message);
        w.own_header(b"destination", destination);
        let split = w.buffer_len();
        w.own_header(b"subscription", subscription);
        self.dropped = w.dropped();
        self.split = split;
    }
}

/// The headers of a MESSAGE that change from message to message (see [`MessageHead`]).
pub struct PerMessage<'a> {
    pub message_id: &'a [u8],
    pub ack: Option<&'a [u8]>,
    pub redelivered: bool,
}

/// One MESSAGE like [`write_message`], its destination and subscription from `head` (encoded
/// for the same version). Same bytes, same order, same dropped count.
#[inline]
pub fn write_message_encoded(
    buf: &mut BytesMut,
    version: Version,
    head: &EncodedHead,
    this: &PerMessage<'_>,
    rest: impl FnOnce(&mut FrameWriter<'_>),
    body: &[u8],
) -> u32 {
    buf.extend_from_slice(&head.bytes[..head.split]);
    let mut w = FrameWriter::resume(buf, version, Command::Message, head.dropped);
    w.own_header(b"message-id", this.message_id);
    w.encoded(&head.bytes[head.split..]);
    if let Some(ack) = this.ack {
        w.own_header(b"ack", ack);
    }
    if this.redelivered {
        w.own_header(b"redelivered", b"true");
    }
    rest(&mut w);
    w.finish(body)
}

/// One MESSAGE: `head`, then the headers `rest` writes (tags, pattern-specific ones), then
/// `body`. Inlined: it runs once per delivery, and as a call it cost ~90 instructions per
/// events delivery over the inline encoding it replaced (perf/RESULTS.md, instruction counts).
#[inline]
pub fn write_message(buf: &mut BytesMut, version: Version, head: &MessageHead<'_>, rest: impl FnOnce(&mut FrameWriter<'_>), body: &[u8]) -> u32 {
    let mut w = FrameWriter::begin(buf, version, Command::Message);
    w.own_header(b"destination", head.destination);
    w.own_header(b"message-id", head.message_id);
    w.own_header(b"subscription", head.subscription);
    if let Some(ack) = head.ack {
        w.own_header(b"ack", ack);
    }
    if head.redelivered {
        w.own_header(b"redelivered", b"true");
    }
    if let Some(c) = head.correlation_id {
        w.own_header(b"correlation-id", c);
    }
    rest(&mut w);
    w.finish(body)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Header values with every byte the versions treat differently (escapes, CR, LF, ':').
    fn value() -> impl Strategy<Value = Vec<u8>> {
        prop::collection::vec(prop::sample::select(b"ab/.:\\\r\n-1".to_vec()), 0..12)
    }

    fn version() -> impl Strategy<Value = Version> {
        prop::sample::select(vec![Version::V1_0, Version::V1_1, Version::V1_2])
    }

    proptest! {
        /// The pre-encoded head gives the very bytes (and dropped count) of the one-pass
        /// builder, whatever the version and values, also when the head is re-encoded in place
        /// for another destination.
        #[test]
        fn an_encoded_head_writes_what_write_message_writes(
            v in version(), first in value(), destination in value(), subscription in value(), id in value(),
            ack in prop::option::of(value()), redelivered in any::<bool>(), body in value(),
        ) {
            let mut head = EncodedHead::default();
            head.encode(v, &first, &subscription);
            head.encode(v, &destination, &subscription);
            let rest = |w: &mut FrameWriter<'_>| w.header(b"x-tag", b"a:b");
            let mut want = BytesMut::new();
            let full = MessageHead { destination: &destination, message_id: &id, subscription: &subscription, ack: ack.as_deref(), redelivered, correlation_id: None };
            let want_dropped = write_message(&mut want, v, &full, rest, &body);
            let mut got = BytesMut::from(&b"earlier frames"[..]);
            let this = PerMessage { message_id: &id, ack: ack.as_deref(), redelivered };
            let got_dropped = write_message_encoded(&mut got, v, &head, &this, rest, &body);
            prop_assert_eq!(&got[b"earlier frames".len()..], &want[..]);
            prop_assert_eq!(got_dropped, want_dropped);
        }
    }
}
