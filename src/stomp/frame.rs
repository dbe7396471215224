//! The STOMP frame as the decoder yields it: a command, headers and a body, all views of the
//! connection's read buffer, so decoding copies nothing unless a header needs unescaping.

use bytes::Bytes;
use smallvec::SmallVec;

/// STOMP protocol versions. Ordered, so the highest common version is a `max`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Version {
    V1_0,
    V1_1,
    V1_2,
}

impl Version {
    pub fn as_str(self) -> &'static str {
        match self {
            Version::V1_0 => "1.0",
            Version::V1_1 => "1.1",
            Version::V1_2 => "1.2",
        }
    }
}

/// Client and server frame commands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Command {
    // client frames
    Connect,
    Stomp,
    Send,
    Subscribe,
    Unsubscribe,
    Ack,
    Nack,
    Begin,
    Commit,
    Abort,
    Disconnect,
    // server frames
    Connected,
    Message,
    Receipt,
    Error,
}

impl Command {
    /// Parses a command line (without its EOL). Commands are case-sensitive (spec).
    pub fn parse(line: &[u8]) -> Option<Command> {
        Some(match line {
            b"CONNECT" => Command::Connect,
            b"STOMP" => Command::Stomp,
            b"SEND" => Command::Send,
            b"SUBSCRIBE" => Command::Subscribe,
            b"UNSUBSCRIBE" => Command::Unsubscribe,
            b"ACK" => Command::Ack,
            b"NACK" => Command::Nack,
            b"BEGIN" => Command::Begin,
            b"COMMIT" => Command::Commit,
            b"ABORT" => Command::Abort,
            b"DISCONNECT" => Command::Disconnect,
            b"CONNECTED" => Command::Connected,
            b"MESSAGE" => Command::Message,
            b"RECEIPT" => Command::Receipt,
            b"ERROR" => Command::Error,
            _ => return None,
        })
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Command::Connect => "CONNECT",
            Command::Stomp => "STOMP",
            Command::Send => "SEND",
            Command::Subscribe => "SUBSCRIBE",
            Command::Unsubscribe => "UNSUBSCRIBE",
            Command::Ack => "ACK",
            Command::Nack => "NACK",
            Command::Begin => "BEGIN",
            Command::Commit => "COMMIT",
            Command::Abort => "ABORT",
            Command::Disconnect => "DISCONNECT",
            Command::Connected => "CONNECTED",
            Command::Message => "MESSAGE",
            Command::Receipt => "RECEIPT",
            Command::Error => "ERROR",
        }
    }

    /// CONNECT, STOMP and CONNECTED headers are never escaped (spec 1.2, "Value Encoding").
    pub fn escapes_headers(self) -> bool {
        !matches!(self, Command::Connect | Command::Stomp | Command::Connected)
    }
}

/// One side of a header: a byte range of the frame as received, or, for a name or value that
/// had to be unescaped, of the frame's unescaped copies. `Copy` and 8 bytes, so a header list
/// is cleared, copied and dropped without touching each entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Span {
    /// Start offset; the top bit set when the range is in the unescaped copies.
    start: u32,
    end: u32,
}

const UNESCAPED: u32 = 1 << 31;

impl Span {
    /// `frame[start..end]`. The decoder's offsets are inside a header block, which its limits
    /// keep far below 2 GiB.
    pub(crate) fn in_frame(start: usize, end: usize) -> Span {
        debug_assert!(end < UNESCAPED as usize);
        Span { start: start as u32, end: end as u32 }
    }

    /// `unescaped[start..end]`.
    pub(crate) fn unescaped(start: usize, end: usize) -> Span {
        debug_assert!(end < UNESCAPED as usize);
        Span { start: start as u32 | UNESCAPED, end: end as u32 }
    }

    pub(crate) fn is_unescaped(self) -> bool {
        self.start & UNESCAPED != 0
    }

    pub(crate) fn range(self) -> std::ops::Range<usize> {
        (self.start & !UNESCAPED) as usize..self.end as usize
    }

    /// The bytes this span names, given the frame's bytes and its unescaped copies.
    pub(crate) fn of<'a>(self, frame: &'a [u8], unescaped: &'a [u8]) -> &'a [u8] {
        if self.is_unescaped() {
            &unescaped[self.range()]
        } else {
            &frame[self.range()]
        }
    }
}

/// Headers a frame holds inline; a frame with more allocates its list.
const INLINE_HEADERS: usize = 8;

/// Decoded (already unescaped) headers in wire order. Repeated names are kept; lookups return
/// the first occurrence, as the spec says ("first wins").
///
/// Names and values are ranges of the frame's bytes, not one `Bytes` each: a lookup is a
/// slice, and only a caller that keeps a header past the frame (`get_bytes`, `name_bytes`,
/// `value_bytes`) takes a reference on the buffer (issue 19: those reference counts and the
/// list they were collected into were 38 % of decoding a small frame). Up to eight headers
/// live inline, so a frame like SEND or ACK allocates nothing for them. Most lookups are for
/// a header the frame does not have (`transaction`, `receipt`, …); a one-bit-per-name summary
/// answers those without a scan.
#[derive(Clone, Default)]
pub struct Headers {
    /// The frame as decoded, which `Span`s index (empty for headers built by `from_pairs`).
    frame: Bytes,
    /// Unescaped names and values, one after another; empty unless some needed it.
    unescaped: Bytes,
    spans: SmallVec<[(Span, Span); INLINE_HEADERS]>,
    /// `name_bit` of every name present, OR-ed: a clear bit proves a name absent.
    names: u64,
}

/// One of 64 bits for a name, from its length and its first and last bytes (cheap, and it
/// separates the names the gateway looks up: `destination` from `transaction`, …).
#[inline(always)]
pub(crate) fn name_bit(name: &[u8]) -> u64 {
    let (first, last) = match name {
        [] => (0, 0),
        [first, .., last] => (*first, *last),
        [only] => (*only, *only),
    };
    let mix = (name.len() * 5) ^ (usize::from(first) << 1) ^ (usize::from(last) << 2);
    1 << (mix % 64)
}

impl Headers {
    /// Headers over `frame`'s bytes (the decoder's constructor); `names` is the `name_bit`
    /// summary of their names.
    #[inline]
    pub(crate) fn over(frame: Bytes, unescaped: Bytes, spans: &[(Span, Span)], names: u64) -> Headers {
        let h = Headers { frame, unescaped, spans: SmallVec::from_slice(spans), names };
        debug_assert_eq!(names, h.summarize());
        h
    }

    fn summarize(&self) -> u64 {
        self.spans.iter().fold(0, |bits, &(n, _)| bits | name_bit(self.slice(n)))
    }

    /// Headers from owned names and values, in order (frames built by hand: tests, benches).
    pub fn from_pairs<N: AsRef<[u8]>, V: AsRef<[u8]>>(pairs: impl IntoIterator<Item = (N, V)>) -> Headers {
        let mut copies = Vec::new();
        let mut h = Headers::default();
        let mut copy = |b: &[u8]| {
            let start = copies.len();
            copies.extend_from_slice(b);
            Span::unescaped(start, copies.len())
        };
        for (n, v) in pairs {
            h.spans.push((copy(n.as_ref()), copy(v.as_ref())));
            h.names |= name_bit(n.as_ref());
        }
        h.unescaped = Bytes::from(copies);
        h
    }

    fn slice(&self, span: Span) -> &[u8] {
        span.of(&self.frame, &self.unescaped)
    }

    fn bytes(&self, span: Span) -> Bytes {
        let b = if span.is_unescaped() { &self.unescaped } else { &self.frame };
        b.slice(span.range())
    }

    /// Inlined so that, for the constant names callers look up, `name_bit` folds away and a
    /// miss is a test of one bit; the scan stays out of line.
    #[inline(always)]
    fn position(&self, name: &[u8]) -> Option<usize> {
        if self.names & name_bit(name) == 0 {
            return None;
        }
        self.scan(name)
    }

    #[inline(never)]
    fn scan(&self, name: &[u8]) -> Option<usize> {
        self.spans.iter().position(|&(n, _)| self.slice(n) == name)
    }

    /// The first value of `name`.
    #[inline(always)]
    pub fn get(&self, name: &[u8]) -> Option<&[u8]> {
        self.position(name).map(|i| self.slice(self.spans[i].1))
    }

    /// The first value of `name` as a `Bytes` that may outlive the frame (it shares the
    /// frame's buffer; no copy).
    #[inline(always)]
    pub fn get_bytes(&self, name: &[u8]) -> Option<Bytes> {
        self.position(name).map(|i| self.bytes(self.spans[i].1))
    }

    pub fn get_str(&self, name: &[u8]) -> Option<&str> {
        self.get(name).and_then(|v| std::str::from_utf8(v).ok())
    }

    /// Names and values in wire order.
    pub fn iter(&self) -> impl Iterator<Item = (&[u8], &[u8])> {
        self.spans.iter().map(|&(n, v)| (self.slice(n), self.slice(v)))
    }

    /// The `i`th name as a `Bytes` that may outlive the frame (no copy).
    pub fn name_bytes(&self, i: usize) -> Bytes {
        self.bytes(self.spans[i].0)
    }

    /// The `i`th value as a `Bytes` that may outlive the frame (no copy).
    pub fn value_bytes(&self, i: usize) -> Bytes {
        self.bytes(self.spans[i].1)
    }

    /// Appends a header after the others (lookups still find the first occurrence). Rebuilds
    /// the headers as copies (`from_pairs`): for frames built by hand, not the decoder's.
    pub fn push(&mut self, name: &[u8], value: &[u8]) {
        let rebuilt = Headers::from_pairs(self.iter().chain(std::iter::once((name, value))));
        *self = rebuilt;
    }

    /// Drops every header named `name`.
    pub fn remove_all(&mut self, name: &[u8]) {
        let (frame, unescaped) = (&self.frame, &self.unescaped);
        self.spans.retain(|(n, _)| n.of(frame, unescaped) != name);
        self.names = self.summarize();
    }

    pub fn len(&self) -> usize {
        self.spans.len()
    }

    pub fn is_empty(&self) -> bool {
        self.spans.is_empty()
    }
}

/// Equal when the names and values are, in order, however they are stored.
impl PartialEq for Headers {
    fn eq(&self, other: &Self) -> bool {
        self.len() == other.len() && self.iter().eq(other.iter())
    }
}

impl Eq for Headers {}

impl std::fmt::Debug for Headers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.iter().map(|(n, v)| (Bytes::copy_from_slice(n), Bytes::copy_from_slice(v)))).finish()
    }
}

/// One inbound frame.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Frame {
    pub command: Command,
    pub headers: Headers,
    pub body: Bytes,
}

/// A header value's unsigned decimal number: ASCII digits only (no sign, no blanks), at most
/// `u64::MAX`; `None` otherwise. Bytes, not `str::parse`: no UTF-8 check on the hot path (an
/// ACK's `message-id`), and no `+` accepted.
pub fn decimal(digits: &[u8]) -> Option<u64> {
    if digits.is_empty() {
        return None;
    }
    digits.iter().try_fold(0u64, |n, &d| if d.is_ascii_digit() { n.checked_mul(10)?.checked_add(u64::from(d - b'0')) } else { None })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn decimals_are_digits_only_and_fit_64_bits() {
        assert_eq!(decimal(b"0"), Some(0));
        assert_eq!(decimal(b"007"), Some(7));
        assert_eq!(decimal(b"18446744073709551615"), Some(u64::MAX));
        for bad in [&b""[..], b"18446744073709551616", b"+1", b"-1", b" 1", b"1 ", b"1a", b"\xd9"] {
            assert_eq!(decimal(bad), None, "{:?}", String::from_utf8_lossy(bad));
        }
    }

    /// Names drawn from a small alphabet so that lookups hit, miss and collide in `name_bit`.
    fn name() -> impl Strategy<Value = Vec<u8>> {
        proptest::collection::vec(prop_oneof![Just(b'a'), Just(b'b'), Just(b'd'), Just(b'n')], 0..4)
    }

    proptest! {
        /// `get` (with the name summary) finds what a plain first-match scan finds, after
        /// pushes and removals too.
        #[test]
        fn get_is_the_first_match(pairs in proptest::collection::vec((name(), name()), 0..12), probes in proptest::collection::vec(name(), 1..8), removed in name()) {
            let mut h = Headers::from_pairs(pairs.iter().map(|(n, v)| (&n[..], &v[..])));
            let scan = |pairs: &[(Vec<u8>, Vec<u8>)], name: &[u8]| pairs.iter().find(|(n, _)| n == name).map(|(_, v)| v.clone());
            for p in &probes {
                prop_assert_eq!(h.get(p).map(<[u8]>::to_vec), scan(&pairs, p));
            }
            h.remove_all(&removed);
            let kept: Vec<_> = pairs.iter().filter(|(n, _)| *n != removed).cloned().collect();
            for p in probes.iter().chain([&removed]) {
                prop_assert_eq!(h.get(p).map(<[u8]>::to_vec), scan(&kept, p));
            }
        }
    }

    #[test]
    fn the_names_the_gateway_looks_up_do_not_share_a_bit() {
        let names: [&[u8]; 21] = [
            b"destination",
            b"transaction",
            b"receipt",
            b"content-length",
            b"content-type",
            b"id",
            b"message-id",
            b"ack",
            b"subscription",
            b"correlation-id",
            b"reply-to",
            b"x-kubemq-group",
            b"x-kubemq-start",
            b"x-kubemq-cache-key",
            b"x-kubemq-cache-ttl",
            b"timeout",
            b"login",
            b"passcode",
            b"accept-version",
            b"heart-beat",
            b"host",
        ];
        for (i, a) in names.iter().enumerate() {
            for b in &names[i + 1..] {
                assert_ne!(name_bit(a), name_bit(b), "{} and {}", String::from_utf8_lossy(a), String::from_utf8_lossy(b));
            }
        }
    }
}
