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
    let mut hb = [0u8; HEART_BEAT_MAX];
    let hb = heart_beat_value(&mut hb, heart_beat);
    let headers: [(&'static [u8], &[u8]); 4] =
        [(b"version", version.as_str().as_bytes()), (b"heart-beat", hb), (b"session", session), (b"server", SERVER.as_bytes())];
    let mut w = FrameWriter::begin_sized(buf, version, Command::Connected, &headers, 0);
    for (name, value) in headers {
        w.own_header(name, value);
    }
    w.finish(b"")
}

/// Longest heart-beat value: two `u64`s and the comma.
const HEART_BEAT_MAX: usize = 2 * 20 + 1;

/// `send,expect` written into `out` (no allocation: once per connection).
fn heart_beat_value(out: &mut [u8; HEART_BEAT_MAX], (send, expect): (u64, u64)) -> &[u8] {
    let mut n = itoa::Buffer::new();
    let send = n.format(send).as_bytes();
    out[..send.len()].copy_from_slice(send);
    out[send.len()] = b',';
    let at = send.len() + 1;
    let expect = n.format(expect).as_bytes();
    out[at..at + expect.len()].copy_from_slice(expect);
    &out[..at + expect.len()]
}

pub fn write_receipt(buf: &mut BytesMut, version: Version, receipt: &[u8]) -> u32 {
    let mut w = FrameWriter::begin_sized(buf, version, Command::Receipt, &[(b"receipt-id", receipt)], 0);
    w.own_header(b"receipt-id", receipt);
    w.finish(b"")
}

/// ERROR with the sanitized vocabulary text, the failing frame's receipt id, and the short
/// hint as a text body.
pub fn write_error(buf: &mut BytesMut, version: Version, err: WireError, receipt: Option<&[u8]>) -> u32 {
    let hint = err.hint();
    let hint = hint.as_bytes();
    let at_most: [(&[u8], &[u8]); 4] =
        [(b"message", err.message().as_bytes()), (b"receipt-id", receipt.unwrap_or_default()), (b"version", b"1.0,1.1,1.2"), (b"content-type", b"text/plain")];
    let mut w = FrameWriter::begin_sized(buf, version, Command::Error, &at_most, hint.len());
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
    use crate::stomp::encode::frame_room;
    use proptest::prelude::*;

    /// Header values with every byte the versions treat differently (escapes, CR, LF, ':').
    fn value() -> impl Strategy<Value = Vec<u8>> {
        prop::collection::vec(prop::sample::select(b"ab/.:\\\r\n-1".to_vec()), 0..12)
    }

    fn version() -> impl Strategy<Value = Version> {
        prop::sample::select(vec![Version::V1_0, Version::V1_1, Version::V1_2])
    }

    #[test]
    fn heart_beat_values_are_written_whole() {
        let mut out = [0u8; HEART_BEAT_MAX];
        assert_eq!(heart_beat_value(&mut out, (0, 0)), b"0,0");
        assert_eq!(heart_beat_value(&mut out, (10_000, 250)), b"10000,250");
        assert_eq!(heart_beat_value(&mut out, (u64::MAX, u64::MAX)), format!("{0},{0}", u64::MAX).as_bytes());
    }

    proptest! {
        /// CONNECTED, RECEIPT and ERROR each take one allocation of an empty buffer: the room
        /// made at the start holds the whole frame, so the buffer never grew past it (a
        /// growth would at least double the capacity).
        #[test]
        fn server_frames_fit_the_room_made_for_them(
            v in version(), send in any::<u64>(), expect in any::<u64>(), session in value(),
            receipt in prop::collection::vec(prop::sample::select(b"ab-1_/".to_vec()), 0..40),
            with_receipt in any::<bool>(),
        ) {
            let mut buf = BytesMut::new();
            write_connected(&mut buf, v, (send, expect), &session);
            prop_assert!(buf.starts_with(b"CONNECTED\n"));
            prop_assert_eq!(buf.capacity(), frame_room(Command::Connected, &[
                (b"version", v.as_str().as_bytes()), (b"heart-beat", format!("{send},{expect}").as_bytes()), (b"session", &session), (b"server", SERVER.as_bytes()),
            ], 0));
            let mut buf = BytesMut::new();
            write_receipt(&mut buf, v, &receipt);
            prop_assert_eq!(buf.capacity(), frame_room(Command::Receipt, &[(b"receipt-id", &receipt)], 0));
            for err in [WireError::UnsupportedVersion, WireError::Internal, WireError::ShuttingDown] {
                let mut buf = BytesMut::new();
                let r = with_receipt.then_some(&receipt[..]);
                write_error(&mut buf, v, err, r);
                let hint = err.hint();
                let at_most: [(&[u8], &[u8]); 4] =
                    [(b"message", err.message().as_bytes()), (b"receipt-id", r.unwrap_or_default()), (b"version", b"1.0,1.1,1.2"), (b"content-type", b"text/plain")];
                prop_assert_eq!(buf.capacity(), frame_room(Command::Error, &at_most, hint.len()));
            }
        }

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
