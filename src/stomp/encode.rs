//! Frame writer: appends one server frame to an output buffer, escaping per version and
//! dropping headers the negotiated version cannot represent (seed 000's table).
//!
//! | version | dropped on egress                              | escaped            |
//! |---------|------------------------------------------------|--------------------|
//! | 1.0     | `:`, CR or LF in a name; CR or LF in a value   | nothing            |
//! | 1.1     | CR anywhere (1.1 has no escape for it)         | `\\` `\n` `:`      |
//! | 1.2     | nothing                                        | `\\` `\n` `:` `\r` |
//!
//! CONNECTED (and CONNECT/STOMP) headers are never escaped (spec 1.2 "Value Encoding"), so
//! they follow the 1.0 row whatever the version: written raw, and a header whose raw bytes
//! would break the frame is dropped rather than corrupting it.
//!
//! The writer appends straight into the caller's `BytesMut`; nothing is staged elsewhere. A
//! `FrameWriter` dropped without `finish` leaves a partial frame in the buffer, so always
//! finish it (or truncate the buffer back).
use super::frame::{Command, Version};
use bytes::{BufMut, BytesMut};
use memchr::{memchr, memchr2};

pub struct FrameWriter<'a> {
    buf: &'a mut BytesMut,
    version: Version,
    /// `false` for CONNECT/STOMP/CONNECTED, whose headers are written raw.
    escape: bool,
    dropped: u32,
}

impl<'a> FrameWriter<'a> {
    /// Starts a frame: writes the command line.
    pub fn begin(buf: &'a mut BytesMut, version: Version, command: Command) -> Self {
        buf.extend_from_slice(command.as_str().as_bytes());
        buf.put_u8(b'\n');
        FrameWriter { buf, version, escape: command.escapes_headers(), dropped: 0 }
    }

    /// [`begin`](Self::begin) after making room for the whole frame at once: the header
    /// lines of `headers` (every header the frame may carry, unescaped) and a body of
    /// `body_len`. Growing an empty buffer frame piece by frame piece reallocates it four or
    /// five times for a CONNECTED (issue 19: a tenth of a connection's user-space instructions
    /// went to that growth); this allocates once. Escapes that lengthen a value only make the
    /// buffer grow as it would have.
    pub fn begin_sized(buf: &'a mut BytesMut, version: Version, command: Command, headers: &[(&[u8], &[u8])], body_len: usize) -> Self {
        buf.reserve(frame_room(command, headers, body_len));
        Self::begin(buf, version, command)
    }

    /// Continues a frame whose command line and first headers were copied into `buf` already
    /// (pre-encoded by a writer of the same version and command), counting the `dropped`
    /// headers that encoding left out.
    pub fn resume(buf: &'a mut BytesMut, version: Version, command: Command, dropped: u32) -> Self {
        FrameWriter { buf, version, escape: command.escapes_headers(), dropped }
    }

    /// Appends header lines encoded earlier by a writer of the same version and command.
    pub fn encoded(&mut self, lines: &[u8]) {
        self.buf.extend_from_slice(lines);
    }

    /// The length of the buffer written into (the frame so far, for a buffer it started).
    pub fn buffer_len(&self) -> usize {
        self.buf.len()
    }

    /// Headers dropped so far as unrepresentable for the version.
    pub fn dropped(&self) -> u32 {
        self.dropped
    }

    /// Appends one header, escaped for the version; drops it (and counts the drop) if the
    /// version cannot represent it. The caller never writes `content-length`: one passed here
    /// is ignored (not written, not counted), because `finish` stamps the true length.
    pub fn header(&mut self, name: &[u8], value: &[u8]) {
        if name == b"content-length" {
            return;
        }
        // Unescaped (1.0, CONNECTED): a ':' in a name would move the name/value split.
        if !self.representable(name) || (!self.escapes() && memchr(b':', name).is_some()) || !self.representable(value) {
            self.dropped += 1;
            return;
        }
        self.put_text(name);
        self.buf.put_u8(b':');
        self.put_text(value);
        self.buf.put_u8(b'\n');
    }

    /// [`header`](Self::header) for a name the gateway itself writes: a literal with nothing
    /// to escape or drop in any version, never `content-length`. Only the value is checked
    /// and escaped (issue 19: escaping the name `message-id` was a third of writing that
    /// header, once per delivery).
    #[inline]
    pub fn own_header(&mut self, name: &'static [u8], value: &[u8]) {
        debug_assert!(first_to_escape(name).is_none() && name != b"content-length", "not a plain name: {name:?}");
        if !self.representable(value) {
            self.dropped += 1;
            return;
        }
        self.buf.extend_from_slice(name);
        self.buf.put_u8(b':');
        self.put_text(value);
        self.buf.put_u8(b'\n');
    }

    /// Whether this frame's header text is escaped (1.1 and 1.2, except CONNECTED).
    fn escapes(&self) -> bool {
        self.escape && self.version != Version::V1_0
    }

    /// Whether the version can carry `s` in a header at all. Unescaped, a raw LF would end
    /// the line and a CR would be read as part of the EOL by 1.2 parsers; 1.1 has no escape
    /// for CR; 1.2 escapes everything.
    fn representable(&self, s: &[u8]) -> bool {
        match (self.escapes(), self.version) {
            (false, _) => memchr2(b'\r', b'\n', s).is_none(),
            (true, Version::V1_1) => memchr(b'\r', s).is_none(),
            (true, _) => true,
        }
    }

    /// Writes `s` raw or with the 1.1/1.2 escapes, as the frame needs.
    fn put_text(&mut self, s: &[u8]) {
        if self.escapes() {
            self.put_escaped(s);
        } else {
            self.buf.extend_from_slice(s);
        }
    }

    /// Stamps `content-length`, the blank line, the body and the NUL. Returns the number of
    /// headers dropped as unrepresentable.
    pub fn finish(self, body: &[u8]) -> u32 {
        let mut digits = itoa::Buffer::new();
        let len = digits.format(body.len());
        self.buf.reserve(b"content-length:".len() + len.len() + 2 + body.len() + 1);
        self.buf.extend_from_slice(b"content-length:");
        self.buf.extend_from_slice(len.as_bytes());
        self.buf.extend_from_slice(b"\n\n");
        self.buf.extend_from_slice(body);
        self.buf.put_u8(0);
        self.dropped
    }

    /// Writes `s` with the 1.1/1.2 escapes. A CR only reaches here in 1.2 (1.1 dropped it).
    fn put_escaped(&mut self, s: &[u8]) {
        // Hot path (every header of every MESSAGE): most values need no escaping, so find the
        // first special byte and copy the whole value in one go if none.
        let Some(first) = first_to_escape(s) else {
            self.buf.extend_from_slice(s);
            return;
        };
        self.buf.reserve(s.len() + 8);
        self.buf.extend_from_slice(&s[..first]);
        let mut run_start = first;
        for (i, &b) in s.iter().enumerate().skip(first) {
            let escaped: &[u8] = match b {
                b'\\' => b"\\\\",
                b'\n' => b"\\n",
                b':' => b"\\c",
                b'\r' => b"\\r",
                _ => continue,
            };
            self.buf.extend_from_slice(&s[run_start..i]);
            self.buf.extend_from_slice(escaped);
            run_start = i + 1;
        }
        self.buf.extend_from_slice(&s[run_start..]);
    }
}

/// Bytes a frame takes with the `name:value` lines of `headers` (unescaped) and a body of
/// `body_len`: the command line, the header lines, `content-length` (as many digits as any
/// length has at most), the blank line, the body and the NUL.
pub fn frame_room(command: Command, headers: &[(&[u8], &[u8])], body_len: usize) -> usize {
    const MAX_DIGITS: usize = 20;
    let header_lines: usize = headers.iter().map(|(name, value)| name.len() + value.len() + 2).sum();
    command.as_str().len() + 1 + header_lines + b"content-length:".len() + MAX_DIGITS + 2 + body_len + 1
}

/// The index of the first byte that 1.1/1.2 escaping rewrites (`\\`, LF, `:`, CR), if any.
/// Eight bytes at a time ("has a zero byte" on the word XOR each special byte: the lowest
/// flagged byte is always a true match; a false flag can only sit above a true one): about a
/// third of the instructions of a table lookup per byte on the short values headers hold
/// (perf/RESULTS.md, "Encode once").
#[inline]
fn first_to_escape(s: &[u8]) -> Option<usize> {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGHS: u64 = 0x8080_8080_8080_8080;
    let zero_bytes = |x: u64| x.wrapping_sub(ONES) & !x & HIGHS;
    let mut chunks = s.chunks_exact(8);
    let mut at = 0;
    for chunk in &mut chunks {
        let w = u64::from_le_bytes(chunk.try_into().expect("chunks of 8"));
        let hits = zero_bytes(w ^ (ONES * u64::from(b'\\')))
            | zero_bytes(w ^ (ONES * u64::from(b'\n')))
            | zero_bytes(w ^ (ONES * u64::from(b':')))
            | zero_bytes(w ^ (ONES * u64::from(b'\r')));
        if hits != 0 {
            return Some(at + hits.trailing_zeros() as usize / 8);
        }
        at += 8;
    }
    chunks.remainder().iter().position(|&b| NEEDS_ESCAPE[b as usize]).map(|i| at + i)
}

/// Bytes that 1.1/1.2 header escaping rewrites (`\r` only reaches here on 1.2: 1.1 drops
/// headers containing it first).
const NEEDS_ESCAPE: [bool; 256] = {
    let mut t = [false; 256];
    t[b'\\' as usize] = true;
    t[b'\n' as usize] = true;
    t[b':' as usize] = true;
    t[b'\r' as usize] = true;
    t
};

/// Writes one whole frame: `begin`, every header in order, `finish`. Returns the number of
/// headers dropped as unrepresentable for `version`.
pub fn encode_frame(buf: &mut BytesMut, version: Version, command: Command, headers: &[(&[u8], &[u8])], body: &[u8]) -> u32 {
    let mut w = FrameWriter::begin(buf, version, command);
    for (name, value) in headers {
        w.header(name, value);
    }
    w.finish(body)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// The word-at-a-time scan finds what a byte-by-byte one finds, wherever the special
        /// bytes sit (every byte value, and runs of the special ones and their neighbours).
        #[test]
        fn first_to_escape_is_the_first_special_byte(
            s in prop::collection::vec(prop_oneof![any::<u8>(), prop::sample::select(b"\\\n:\r\x0b\x0c9;[]\x8a\xba\xdc".to_vec())], 0..40)
        ) {
            prop_assert_eq!(first_to_escape(&s), s.iter().position(|&b| NEEDS_ESCAPE[b as usize]));
        }

        /// `own_header` writes (or drops) exactly what `header` does for the names the gateway
        /// writes itself, whatever the value, version and frame.
        #[test]
        fn own_header_is_header_for_the_gateways_names(
            name in prop::sample::select(vec![&b"message-id"[..], b"ack", b"subscription", b"x-kubemq-sequence", b"receipt-id", b"heart-beat"]),
            value in prop::collection::vec(prop_oneof![any::<u8>(), prop::sample::select(b"\\\n:\r".to_vec())], 0..24),
            version in prop::sample::select(vec![Version::V1_0, Version::V1_1, Version::V1_2]),
            command in prop::sample::select(vec![Command::Message, Command::Connected, Command::Receipt]),
        ) {
            let write = |own: bool| {
                let mut buf = BytesMut::new();
                let mut w = FrameWriter::begin(&mut buf, version, command);
                if own { w.own_header(name, &value) } else { w.header(name, &value) }
                let dropped = w.finish(b"");
                (buf, dropped)
            };
            prop_assert_eq!(write(true), write(false));
        }
    }

    fn encode(version: Version, command: Command, headers: &[(&[u8], &[u8])], body: &[u8]) -> (Vec<u8>, u32) {
        let mut buf = BytesMut::new();
        let dropped = encode_frame(&mut buf, version, command, headers, body);
        (buf.to_vec(), dropped)
    }

    /// One header set that exercises every special byte.
    const TRICKY: &[(&[u8], &[u8])] = &[
        (b"destination", b"/topic/a"),
        (b"url", b"http://h:1/x"),
        (b"back\\slash", b"a\\b"),
        (b"multi", b"line1\nline2"),
        (b"cr", b"a\rb"),
        (b"na:me", b"v"),
        (b"crname\r", b"v"),
        (b"lfname\n", b"v"),
    ];

    #[test]
    fn v1_0_drops_unrepresentable_and_escapes_nothing() {
        let (bytes, dropped) = encode(Version::V1_0, Command::Message, TRICKY, b"hi");
        assert_eq!(bytes, b"MESSAGE\ndestination:/topic/a\nurl:http://h:1/x\nback\\slash:a\\b\ncontent-length:2\n\nhi\0");
        // multi (LF in value), cr (CR in value), na:me, crname, lfname.
        assert_eq!(dropped, 5);
    }

    #[test]
    fn v1_1_drops_cr_and_escapes_the_rest() {
        let (bytes, dropped) = encode(Version::V1_1, Command::Message, TRICKY, b"hi");
        assert_eq!(
            bytes,
            &b"MESSAGE\ndestination:/topic/a\nurl:http\\c//h\\c1/x\nback\\\\slash:a\\\\b\n\
               multi:line1\\nline2\nna\\cme:v\nlfname\\n:v\ncontent-length:2\n\nhi\0"[..]
        );
        // cr (CR in value), crname (CR in name).
        assert_eq!(dropped, 2);
    }

    #[test]
    fn v1_2_escapes_everything_and_never_drops() {
        let (bytes, dropped) = encode(Version::V1_2, Command::Message, TRICKY, b"hi");
        assert_eq!(
            bytes,
            &b"MESSAGE\ndestination:/topic/a\nurl:http\\c//h\\c1/x\nback\\\\slash:a\\\\b\n\
               multi:line1\\nline2\ncr:a\\rb\nna\\cme:v\ncrname\\r:v\nlfname\\n:v\n\
               content-length:2\n\nhi\0"[..]
        );
        assert_eq!(dropped, 0);
    }

    #[test]
    fn content_length_always_stamped_and_caller_copy_ignored() {
        for v in [Version::V1_0, Version::V1_1, Version::V1_2] {
            let (bytes, dropped) = encode(v, Command::Message, &[(b"content-length", b"999"), (b"k", b"v")], b"a\0b");
            assert_eq!(bytes, b"MESSAGE\nk:v\ncontent-length:3\n\na\0b\0");
            assert_eq!(dropped, 0);
            let (bytes, _) = encode(v, Command::Receipt, &[(b"receipt-id", b"7")], b"");
            assert_eq!(bytes, b"RECEIPT\nreceipt-id:7\ncontent-length:0\n\n\0");
        }
    }

    #[test]
    fn connected_is_not_escaped() {
        for v in [Version::V1_1, Version::V1_2] {
            let (bytes, dropped) =
                encode(v, Command::Connected, &[(b"version", v.as_str().as_bytes()), (b"server", b"stompgate/0.1 a:b\\c"), (b"bad", b"x\ny")], b"");
            let mut expected = b"CONNECTED\nversion:".to_vec();
            expected.extend_from_slice(v.as_str().as_bytes());
            expected.extend_from_slice(b"\nserver:stompgate/0.1 a:b\\c\ncontent-length:0\n\n\0");
            assert_eq!(bytes, expected);
            // A raw LF would break the frame; it is dropped, not written.
            assert_eq!(dropped, 1);
        }
    }

    #[test]
    fn appends_after_existing_bytes() {
        let mut buf = BytesMut::from(&b"ERROR\n\n\0"[..]);
        let mut w = FrameWriter::begin(&mut buf, Version::V1_2, Command::Error);
        w.header(b"message", b"frame too large");
        assert_eq!(w.finish(b""), 0);
        assert_eq!(&buf[..], b"ERROR\n\n\0ERROR\nmessage:frame too large\ncontent-length:0\n\n\0");
    }
}
