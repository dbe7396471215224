//! Minimal STOMP 1.2 framing for the load harness: bytes in, [`Frame`] out, no socket.
//!
//! Only what a load client needs: the decoder finds frame boundaries (`content-length` when
//! present, else the NUL), skips heart-beat EOLs, and exposes the raw header block so a caller
//! can look up the one or two headers it cares about. Header values are never unescaped: the
//! only value the harness sends back (a MESSAGE's `ack` into an ACK's `id`) is echoed byte for
//! byte, which keeps its escaping intact.

use std::fmt;

/// A header block larger than this without its blank line is a broken peer, not a slow one.
const MAX_HEADER_BLOCK: usize = 64 * 1024;
/// Largest `content-length` accepted from a server.
pub const MAX_BODY: usize = 128 * 1024 * 1024;

/// A decoded frame borrowing the read buffer.
pub struct Frame<'a> {
    pub command: &'a [u8],
    /// Header lines (without the command line and the blank line), `\n` or `\r\n` separated.
    headers: &'a [u8],
    pub body: &'a [u8],
}

impl<'a> Frame<'a> {
    /// The first occurrence of header `name` (STOMP 1.2: the first repeated header wins).
    pub fn header(&self, name: &[u8]) -> Option<&'a [u8]> {
        header_in(self.headers, name)
    }

    pub fn is(&self, command: &[u8]) -> bool {
        self.command == command
    }

    /// `message` header and body of an ERROR frame, for a one-line diagnostic.
    pub fn error_text(&self) -> String {
        let msg = self.header(b"message").unwrap_or(b"");
        let body = &self.body[..self.body.len().min(200)];
        format!("{}{}{}", String::from_utf8_lossy(msg), if body.is_empty() { "" } else { ": " }, String::from_utf8_lossy(body).trim())
    }
}

fn header_in<'a>(block: &'a [u8], name: &[u8]) -> Option<&'a [u8]> {
    for line in block.split(|&b| b == b'\n') {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if line.len() > name.len() && line[name.len()] == b':' && line.starts_with(name) {
            return Some(&line[name.len() + 1..]);
        }
    }
    None
}

#[derive(Debug)]
pub struct DecodeError(pub &'static str);

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.0)
    }
}

/// Incremental frame decoder. "Not enough bytes yet" is `Ok(None)`; the decoder keeps how far
/// it got in the current frame (relative to the frame's first byte, which the caller keeps at
/// the front of the slice it passes) so neither the header block nor a NUL-terminated body is
/// rescanned from its start.
#[derive(Default)]
pub struct Decoder {
    /// Leading heart-beat EOLs are behind us and `line_scan` is valid.
    started: bool,
    /// Leading heart-beat EOL bytes of the current frame.
    skip: usize,
    /// Offset of the next header-block byte to scan for a line end.
    line_scan: usize,
    /// Offset just past the blank line, once found.
    body_start: Option<usize>,
    content_length: Option<usize>,
    /// Offset of the next body byte to scan for the NUL (no `content-length`).
    nul_scan: usize,
}

impl Decoder {
    /// Decodes the frame at the front of `buf`. Returns the frame and the bytes it used
    /// (heart-beat EOLs before it included).
    ///
    /// # Errors
    /// A header block over 64 KiB, a bad or oversized `content-length`, or a body not
    /// followed by NUL.
    pub fn decode<'a>(&mut self, buf: &'a [u8]) -> Result<Option<(Frame<'a>, usize)>, DecodeError> {
        if self.body_start.is_none() {
            if !self.started {
                while self.skip < buf.len() {
                    match buf[self.skip] {
                        b'\n' => self.skip += 1,
                        b'\r' if buf.get(self.skip + 1) == Some(&b'\n') => self.skip += 2,
                        b'\r' if self.skip + 1 == buf.len() => return Ok(None),
                        _ => break,
                    }
                }
                if self.skip == buf.len() {
                    return Ok(None);
                }
                self.line_scan = self.skip;
                self.started = true;
            }
            loop {
                let Some(nl) = memchr::memchr(b'\n', &buf[self.line_scan..]) else {
                    if buf.len() - self.skip > MAX_HEADER_BLOCK {
                        return Err(DecodeError("header block too large"));
                    }
                    return Ok(None);
                };
                let line_start = self.line_scan;
                let line_end = line_start + nl;
                self.line_scan = line_end + 1;
                let line = &buf[line_start..line_end];
                let line = line.strip_suffix(b"\r").unwrap_or(line);
                if line.is_empty() {
                    self.body_start = Some(self.line_scan);
                    self.nul_scan = self.line_scan;
                    break;
                }
                if self.content_length.is_none() {
                    if let Some(v) = line.strip_prefix(b"content-length:") {
                        let n = parse_usize(v).ok_or(DecodeError("bad content-length"))?;
                        if n > MAX_BODY {
                            return Err(DecodeError("content-length too large"));
                        }
                        self.content_length = Some(n);
                    }
                }
            }
        }
        let body_start = self.body_start.expect("set above");
        let body_end = match self.content_length {
            Some(n) => {
                if buf.len() < body_start + n + 1 {
                    return Ok(None);
                }
                if buf[body_start + n] != 0 {
                    return Err(DecodeError("body not followed by NUL"));
                }
                body_start + n
            }
            None => match memchr::memchr(0, &buf[self.nul_scan..]) {
                Some(i) => self.nul_scan + i,
                None => {
                    self.nul_scan = buf.len();
                    if buf.len() - body_start > MAX_BODY {
                        return Err(DecodeError("frame body too large"));
                    }
                    return Ok(None);
                }
            },
        };
        let head = &buf[self.skip..body_start];
        let cmd_end = memchr::memchr(b'\n', head).unwrap_or(head.len());
        let command = &head[..cmd_end];
        let command = command.strip_suffix(b"\r").unwrap_or(command);
        let headers = head.get(cmd_end + 1..).unwrap_or(b"");
        let frame = Frame { command, headers, body: &buf[body_start..body_end] };
        *self = Decoder::default();
        Ok(Some((frame, body_end + 1)))
    }
}

fn parse_usize(v: &[u8]) -> Option<usize> {
    let v = v.strip_suffix(b"\r").unwrap_or(v);
    if v.is_empty() || v.len() > 12 {
        return None;
    }
    v.iter().try_fold(0usize, |acc, &b| b.is_ascii_digit().then(|| acc * 10 + usize::from(b - b'0')))
}

/// Appends a frame with the given headers and body (`content-length` added when the body is
/// not empty). Header values here are ours and contain no characters needing escapes.
pub fn encode(out: &mut Vec<u8>, command: &str, headers: &[(&str, &[u8])], body: &[u8]) {
    out.extend_from_slice(command.as_bytes());
    out.push(b'\n');
    for (k, v) in headers {
        out.extend_from_slice(k.as_bytes());
        out.push(b':');
        out.extend_from_slice(v);
        out.push(b'\n');
    }
    if !body.is_empty() {
        out.extend_from_slice(b"content-length:");
        out.extend_from_slice(itoa::Buffer::new().format(body.len()).as_bytes());
        out.push(b'\n');
    }
    out.push(b'\n');
    out.extend_from_slice(body);
    out.push(0);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// (command, `ack` header, body) of one decoded frame.
    type Decoded = (Vec<u8>, Option<Vec<u8>>, Vec<u8>);

    fn all_frames(input: &[u8], piece: usize) -> Vec<Decoded> {
        let mut dec = Decoder::default();
        let mut buf = Vec::new();
        let mut out = Vec::new();
        for chunk in input.chunks(piece) {
            buf.extend_from_slice(chunk);
            while let Some((f, n)) = dec.decode(&buf).unwrap() {
                out.push((f.command.to_vec(), f.header(b"ack").map(<[u8]>::to_vec), f.body.to_vec()));
                buf.drain(..n);
            }
        }
        assert!(buf.iter().all(|&b| b == b'\n' || b == b'\r'), "leftover {buf:?}");
        out
    }

    #[test]
    fn decodes_any_fragmentation() {
        let mut input = Vec::new();
        input.extend_from_slice(b"\n\r\nCONNECTED\r\nversion:1.2\r\n\r\n\0\n");
        encode(&mut input, "MESSAGE", &[("ack", b"a\\c1"), ("ack", b"second")], b"x\0y");
        input.extend_from_slice(b"RECEIPT\nreceipt-id:7\n\nno-length\0\n\n");
        for piece in [1000, 100, 10, 5, 2, 1] {
            let frames = all_frames(&input, piece);
            assert_eq!(frames.len(), 3, "piece {piece}");
            assert_eq!(frames[0].0, b"CONNECTED");
            assert_eq!(frames[1], (b"MESSAGE".to_vec(), Some(b"a\\c1".to_vec()), b"x\0y".to_vec()));
            assert_eq!(frames[2].2, b"no-length");
        }
    }

    #[test]
    fn rejects_missing_nul() {
        let mut dec = Decoder::default();
        assert!(dec.decode(b"MESSAGE\ncontent-length:1\n\nxy").is_err());
    }
}
