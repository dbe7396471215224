//! Incremental, zero-copy STOMP frame decoder.
//!
//! Contract:
//! - `decode(&mut buf)` consumes at most one frame (or one heart-beat EOL) from the front of
//!   `buf` and returns it; `Ok(None)` means "not enough bytes yet" and leaves `buf` intact while
//!   remembering how far it has scanned, so a large body is never rescanned from byte 0.
//! - The frame is split off `buf` (`split_to().freeze()`); its body is a view of it and its
//!   headers are ranges of it (`frame::Headers`). Only a header containing an escape sequence
//!   is copied, into the frame's one side buffer of unescaped copies.
//! - Escaping per negotiated version: none before CONNECT/for CONNECT and in 1.0; 1.1 `\c \n \\`;
//!   1.2 adds `\r`. An undefined escape (1.1/1.2) is `Malformed`.
//! - Limits: header block (command line + headers) > `max_header_bytes`, more than
//!   `max_headers` headers, or body > `max_body` → `FrameTooLarge`.
//!
//! Decisions callers must know:
//! - **Heart-beats are not coalesced.** Every EOL (LF, or CR LF) seen between frames yields its
//!   own `Decoded::HeartBeat`. Coalescing would make the result depend on how the bytes were cut
//!   into reads; one-per-EOL does not. The EOLs the spec allows after a frame's NUL are left in
//!   the buffer, so a frame followed by `\n` yields `Frame` and then `HeartBeat`.
//! - **CR handling.** An EOL is `LF` or `CR LF` in 1.2 and before negotiation (CONNECT may come
//!   from a 1.2 client). STOMP 1.0/1.1 define EOL as LF alone, and the 1.1 grammar lets a header
//!   name or value contain any octet but LF and `:`, so there a CR before LF stays part of the line
//!   (a `SEND\r` command line is an unknown command → `Malformed`). A CR LF *between* frames is a
//!   heart-beat in every version: it cannot start a valid frame anyway.
//! - `content-length` is kept in the decoded headers; only its first occurrence sizes the body,
//!   and surrounding spaces/tabs around its digits are tolerated (1.0 clients pad headers).
//! - After an error the decoder resets to "between frames" but does not consume `buf`; calling
//!   `decode` again on the same bytes returns the same error. The connection should be closed.
//! - `set_version` takes effect for bytes not yet parsed. Since `decode` returns right after a
//!   frame, calling it after the CONNECT frame is decoded applies it to everything that follows.
use super::error::{Malformed, TooLarge, WireError};
use super::frame::{name_bit, Command, Frame, Headers, Span, Version};
use bytes::{Buf, Bytes, BytesMut};
use memchr::memchr;
use std::sync::atomic::{AtomicUsize, Ordering};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    pub max_header_bytes: usize,
    pub max_headers: usize,
    pub max_body: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits { max_header_bytes: 64 * 1024, max_headers: 128, max_body: 100 * 1024 * 1024 }
    }
}

// A frame holds its first eight header ranges inline (248 bytes); `decode` builds it in the
// caller's result and the read loop handles it there, by reference, so its size is never
// moved, and boxing it would cost an allocation per frame.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decoded {
    Frame(Frame),
    /// A bare EOL between frames (heart-beat). One per EOL; never coalesced.
    HeartBeat,
}

/// What one `step` found.
enum Step {
    More,
    HeartBeat,
    /// A complete frame: `buf[..=nul]`, its body from `body_start`.
    Frame {
        command: Command,
        body_start: usize,
        nul: usize,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("frame too large")]
    FrameTooLarge,
    #[error("malformed frame")]
    Malformed,
}

/// Which escape sequences a frame's headers use (depends on version and command).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Escapes {
    /// Pre-CONNECT, 1.0, and CONNECT/STOMP/CONNECTED frames: bytes are taken literally.
    None,
    /// 1.1: `\c \n \\`.
    V11,
    /// 1.2: `\c \n \\ \r`.
    V12,
}

/// Where the decoder is inside the frame at the front of the buffer. All offsets are from the
/// front of the caller's buffer, which is where the frame starts: nothing is consumed until a
/// whole frame (or heart-beat) has been recognized.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// Between frames: the next byte starts a heart-beat EOL or a command line.
    Idle,
    /// Reading the command line and header lines.
    Head {
        /// The command, once its line is complete.
        command: Option<Command>,
        /// Start of the first line not yet processed.
        line_start: usize,
        /// The LF search resumes here: bytes in `line_start..scan_from` hold no LF.
        scan_from: usize,
    },
    /// The blank line has been seen; waiting for the body and its NUL.
    Body {
        command: Command,
        body_start: usize,
        /// `Some` when a `content-length` header sized the body.
        content_length: Option<usize>,
        /// The NUL search resumes here (only used without `content-length`).
        scan_from: usize,
    },
}

#[derive(Debug)]
pub struct Decoder {
    limits: Limits,
    version: Option<Version>,
    state: State,
    /// Headers of the frame being parsed. Kept across calls (and its allocation reused across
    /// frames) so a header block arriving in many reads is parsed once, line by line.
    headers: Vec<(Span, Span)>,
    /// The unescaped copies of the frame being parsed (`Span::unescaped` ranges); empty unless
    /// a header needed unescaping.
    unescaped: Vec<u8>,
    /// `Headers`' summary of the names parsed so far (`frame::name_bit`).
    names: u64,
    /// The first `content-length` of the frame being parsed.
    content_length: Option<usize>,
    /// See `error_receipt`.
    error_receipt: Option<Bytes>,
    /// See `wire_error`: which rule the last error broke.
    error_detail: Option<WireError>,
    /// Test-only count of bytes handed to the LF/NUL searches, to prove nothing is rescanned.
    #[cfg(test)]
    examined: usize,
}

impl Decoder {
    pub fn new(mut limits: Limits) -> Self {
        // A `Span` holds 31-bit offsets into a header block; no real one comes near 1 GiB.
        limits.max_header_bytes = limits.max_header_bytes.min(1 << 30);
        Decoder {
            limits,
            version: None,
            state: State::Idle,
            headers: Vec::new(),
            unescaped: Vec::new(),
            names: 0,
            content_length: None,
            error_receipt: None,
            error_detail: None,
            #[cfg(test)]
            examined: 0,
        }
    }

    /// Gives the header list's allocation to this thread's spare lists when no frame is half
    /// parsed, so a connection waiting for its next frame holds none (idle memory per
    /// connection, issue 19); the next header line takes one back without allocating.
    pub fn park(&mut self) {
        if matches!(self.state, State::Idle) {
            if self.headers.capacity() > 0 {
                spare_headers::give(std::mem::take(&mut self.headers));
            }
            self.unescaped = Vec::new();
        }
    }

    /// Set once CONNECT has been negotiated; before that no header is unescaped.
    pub fn set_version(&mut self, v: Version) {
        self.version = Some(v);
    }

    /// Decodes at most one frame or heart-beat from the front of `buf`.
    ///
    /// # Errors
    /// `FrameTooLarge` when a limit is exceeded (detected as soon as the buffered bytes prove
    /// it), `Malformed` for anything else the grammar does not allow. `buf` is not consumed.
    ///
    /// # Cancel-safety
    /// All progress lives in `self`; `buf` must be the same buffer, only appended to, between
    /// calls that return `Ok(None)`. If it shrank, parsing restarts from its front.
    pub fn decode(&mut self, buf: &mut BytesMut) -> Result<Option<Decoded>, DecodeError> {
        if self.resume_offset() > buf.len() {
            // The caller dropped bytes we had scanned: our offsets are meaningless now.
            self.reset();
        }
        match self.step(buf) {
            Ok(Step::More) => Ok(None),
            Ok(Step::HeartBeat) => Ok(Some(Decoded::HeartBeat)),
            // Built here, in the caller's result, rather than returned up through `step`: a
            // frame is too large to move for free.
            Ok(Step::Frame { command, body_start, nul }) => Ok(Some(Decoded::Frame(self.take_frame(buf, command, body_start, nul)))),
            Err(e) => {
                self.error_receipt = self.parsed_receipt(buf);
                self.reset();
                Err(e)
            }
        }
    }

    /// Splits the complete frame `buf[..=nul]` off the buffer.
    #[inline]
    fn take_frame(&mut self, buf: &mut BytesMut, command: Command, body_start: usize, nul: usize) -> Frame {
        let frame = buf.split_to(nul + 1).freeze();
        let body = frame.slice(body_start..nul);
        let unescaped = if self.unescaped.is_empty() { Bytes::new() } else { Bytes::from(std::mem::take(&mut self.unescaped)) };
        let headers = Headers::over(frame, unescaped, &self.headers, self.names);
        self.reset();
        Frame { command, headers, body }
    }

    /// The `receipt` header of the frame that the last error was about, if its header block
    /// had been parsed that far: the ERROR must carry it as `receipt-id` (stomp-decisions.md).
    pub fn error_receipt(&self) -> Option<&Bytes> {
        self.error_receipt.as_ref()
    }

    /// The ERROR to send for `err`, the last error `decode` returned: it names the rule the
    /// frame broke (which limit and its value, which syntax rule), never the frame's bytes.
    pub fn wire_error(&self, err: DecodeError) -> WireError {
        self.error_detail.unwrap_or(match err {
            DecodeError::FrameTooLarge => WireError::FrameTooLarge(TooLarge::HeaderBlock(self.limits.max_header_bytes)),
            DecodeError::Malformed => WireError::MalformedFrame(Malformed::UnknownCommand),
        })
    }

    /// Records why the frame is too large; returns the error to return.
    fn too_large(&mut self, limit: TooLarge) -> DecodeError {
        self.error_detail = Some(WireError::FrameTooLarge(limit));
        DecodeError::FrameTooLarge
    }

    /// Records which syntax rule the frame broke; returns the error to return.
    fn malformed(&mut self, why: Malformed) -> DecodeError {
        self.error_detail = Some(WireError::MalformedFrame(why));
        DecodeError::Malformed
    }

    fn parsed_receipt(&self, buf: &BytesMut) -> Option<Bytes> {
        let view = |span: &Span| -> Option<Vec<u8>> {
            let from: &[u8] = if span.is_unescaped() { &self.unescaped } else { buf };
            from.get(span.range()).map(<[u8]>::to_vec)
        };
        self.headers.iter().find(|(n, _)| view(n).as_deref() == Some(&b"receipt"[..])).and_then(|(_, v)| view(v)).map(Bytes::from)
    }

    fn reset(&mut self) {
        self.state = State::Idle;
        self.headers.clear();
        self.unescaped.clear();
        self.names = 0;
        self.content_length = None;
    }

    /// The furthest offset into `buf` the current state relies on.
    fn resume_offset(&self) -> usize {
        match self.state {
            State::Idle => 0,
            State::Head { scan_from, .. } => scan_from,
            State::Body { scan_from, .. } => scan_from,
        }
    }

    #[inline]
    fn note_examined(&mut self, n: usize) {
        #[cfg(test)]
        {
            self.examined += n;
        }
        let _ = n;
    }

    /// CR LF is an EOL only in 1.2 and before negotiation; see the module docs.
    fn strips_cr(&self) -> bool {
        matches!(self.version, None | Some(Version::V1_2))
    }

    fn escapes_for(&self, command: Command) -> Escapes {
        if !command.escapes_headers() {
            return Escapes::None;
        }
        match self.version {
            None | Some(Version::V1_0) => Escapes::None,
            Some(Version::V1_1) => Escapes::V11,
            Some(Version::V1_2) => Escapes::V12,
        }
    }

    fn step(&mut self, buf: &mut BytesMut) -> Result<Step, DecodeError> {
        loop {
            match self.state {
                State::Idle => match buf.first() {
                    None => return Ok(Step::More),
                    Some(b'\n') => {
                        buf.advance(1);
                        return Ok(Step::HeartBeat);
                    }
                    Some(b'\r') => match buf.get(1) {
                        // A lone CR may still become a CR LF heart-beat.
                        None => return Ok(Step::More),
                        Some(b'\n') => {
                            buf.advance(2);
                            return Ok(Step::HeartBeat);
                        }
                        Some(_) => self.state = State::Head { command: None, line_start: 0, scan_from: 0 },
                    },
                    Some(_) => self.state = State::Head { command: None, line_start: 0, scan_from: 0 },
                },
                State::Head { command, line_start, scan_from } => match self.head(buf, command, line_start, scan_from)? {
                    true => continue,
                    false => return Ok(Step::More),
                },
                State::Body { command, body_start, content_length, scan_from } => {
                    return self.body(buf, command, body_start, content_length, scan_from);
                }
            }
        }
    }

    /// Processes every complete line of the header block. Returns `true` when the blank line
    /// was found (state is now `Body`), `false` when more bytes are needed.
    fn head(&mut self, buf: &BytesMut, mut command: Option<Command>, mut line_start: usize, mut scan_from: usize) -> Result<bool, DecodeError> {
        let max = self.limits.max_header_bytes;
        // Per frame, not per line: neither changes inside a header block.
        let strips_cr = self.strips_cr();
        let mut escapes = command.map_or(Escapes::None, |c| self.escapes_for(c));
        loop {
            let Some(i) = memchr(b'\n', &buf[scan_from..]) else {
                self.note_examined(buf.len() - scan_from);
                self.state = State::Head { command, line_start, scan_from: buf.len() };
                // The header block will end at an LF not yet received, so it is at least
                // `buf.len() + 1` bytes long: fail now rather than buffer forever.
                if buf.len() >= max {
                    return Err(self.too_large(TooLarge::HeaderBlock(max)));
                }
                return Ok(false);
            };
            self.note_examined(i + 1);
            let lf = scan_from + i;
            let next = lf + 1;
            // Size is checked before the line's content so the error does not depend on how
            // the input was cut into reads (the partial check above fires on the same inputs).
            if next > max {
                return Err(self.too_large(TooLarge::HeaderBlock(max)));
            }
            let mut end = lf;
            if strips_cr && end > line_start && buf[end - 1] == b'\r' {
                end -= 1;
            }
            let line = &buf[line_start..end];
            match command {
                None => match Command::parse(line) {
                    Some(c) => {
                        command = Some(c);
                        escapes = self.escapes_for(c);
                    }
                    None => return Err(self.malformed(Malformed::UnknownCommand)),
                },
                Some(cmd) if line.is_empty() => {
                    let content_length = self.content_length;
                    self.state = State::Body { command: cmd, body_start: next, content_length, scan_from: next };
                    return Ok(true);
                }
                Some(_) => self.header_line(line, line_start, escapes)?,
            }
            line_start = next;
            scan_from = next;
        }
    }

    /// Parses one non-empty header line starting at `offset` in the frame.
    fn header_line(&mut self, line: &[u8], offset: usize, escapes: Escapes) -> Result<(), DecodeError> {
        if self.headers.len() >= self.limits.max_headers {
            return Err(self.too_large(TooLarge::HeaderCount(self.limits.max_headers)));
        }
        // Split at the FIRST colon: 1.0 and CONNECT values may contain raw colons, and we are
        // lenient about raw colons in 1.1/1.2 values too.
        let Some(colon) = memchr(b':', line) else { return Err(self.malformed(Malformed::HeaderWithoutColon)) };
        if colon == 0 {
            return Err(self.malformed(Malformed::EmptyHeaderName));
        }
        // One search for a backslash covers both halves of the line: most lines have none, and
        // then neither half is unescaped (nor searched again).
        let escaped = escapes != Escapes::None && memchr(b'\\', line).is_some();
        let (name, value) = if escaped {
            let (Ok(name), Ok(value)) = (self.field(line, offset, 0..colon, escapes), self.field(line, offset, colon + 1..line.len(), escapes)) else {
                // `field` fails only on an undefined escape.
                return Err(self.malformed(Malformed::UndefinedEscape));
            };
            (name, value)
        } else {
            // The common line: both halves are spans of the frame as they are.
            (Span::in_frame(offset, offset + colon), Span::in_frame(offset + colon + 1, offset + line.len()))
        };
        // Only the first `content-length` sizes the body ("first wins"); later ones are kept
        // as history but not even validated. Checked here, as soon as the line is complete,
        // so an oversized body is refused before any of it is buffered.
        let name_bytes = self.field_bytes(name, line, offset);
        let (bit, is_length) = (name_bit(name_bytes), name_bytes == b"content-length");
        self.names |= bit;
        if self.content_length.is_none() && is_length {
            let len = match parse_length(self.field_bytes(value, line, offset), self.limits.max_body) {
                Ok(len) => len,
                Err(DecodeError::Malformed) => return Err(self.malformed(Malformed::BadContentLength)),
                Err(DecodeError::FrameTooLarge) => return Err(self.too_large(TooLarge::Body(self.limits.max_body))),
            };
            self.content_length = Some(len);
        }
        if self.headers.capacity() == 0 {
            self.headers = spare_headers::take();
        }
        self.headers.push((name, value));
        Ok(())
    }

    /// One side of a header line that holds a backslash, `line[range]`: a span of the frame,
    /// or, if this side holds one, of its unescaped copy appended to `self.unescaped`. Fails
    /// only on an undefined escape.
    fn field(&mut self, line: &[u8], offset: usize, range: std::ops::Range<usize>, escapes: Escapes) -> Result<Span, DecodeError> {
        let raw = &line[range.clone()];
        if memchr(b'\\', raw).is_none() {
            return Ok(Span::in_frame(offset + range.start, offset + range.end));
        }
        let start = self.unescaped.len();
        unescape(raw, escapes == Escapes::V12, &mut self.unescaped)?;
        Ok(Span::unescaped(start, self.unescaped.len()))
    }

    /// The bytes of `span` while its line (at `offset` in the frame) is still borrowed from the
    /// buffer.
    fn field_bytes<'a>(&'a self, span: Span, line: &'a [u8], offset: usize) -> &'a [u8] {
        let range = span.range();
        if span.is_unescaped() {
            &self.unescaped[range]
        } else {
            &line[range.start - offset..range.end - offset]
        }
    }

    /// Looks for the end of the body. `Step::Frame` when the frame is complete (`decode` takes
    /// it), `Step::More` when more bytes are needed.
    fn body(&mut self, buf: &BytesMut, command: Command, body_start: usize, content_length: Option<usize>, scan_from: usize) -> Result<Step, DecodeError> {
        let max = self.limits.max_body;
        let nul = match content_length {
            Some(len) => {
                // `len <= max_body` was checked when the header was parsed.
                let Some(nul) = body_start.checked_add(len) else { return Err(self.too_large(TooLarge::Body(max))) };
                if buf.len() <= nul {
                    return Ok(Step::More);
                }
                // The spec: read exactly `len` octets, then the frame must end with NUL.
                if buf[nul] != 0 {
                    return Err(self.malformed(Malformed::NoNulAfterContentLength));
                }
                nul
            }
            None => match memchr(0, &buf[scan_from..]) {
                Some(i) => {
                    self.note_examined(i + 1);
                    let nul = scan_from + i;
                    if nul - body_start > max {
                        return Err(self.too_large(TooLarge::Body(max)));
                    }
                    nul
                }
                None => {
                    self.note_examined(buf.len() - scan_from);
                    self.state = State::Body { command, body_start, content_length, scan_from: buf.len() };
                    if buf.len() - body_start > max {
                        return Err(self.too_large(TooLarge::Body(max)));
                    }
                    return Ok(Step::More);
                }
            },
        };
        Ok(Step::Frame { command, body_start, nul })
    }
}

/// Applies the spec's header unescaping, appending to `out`. Any other escape, or a trailing
/// lone backslash, is a fatal protocol error (spec 1.1/1.2 "Value Encoding").
fn unescape(raw: &[u8], with_cr: bool, out: &mut Vec<u8>) -> Result<(), DecodeError> {
    out.reserve(raw.len());
    let mut rest = raw;
    while let Some(i) = memchr(b'\\', rest) {
        out.extend_from_slice(&rest[..i]);
        let decoded = match rest.get(i + 1) {
            Some(b'n') => b'\n',
            Some(b'c') => b':',
            Some(b'\\') => b'\\',
            Some(b'r') if with_cr => b'\r',
            _ => return Err(DecodeError::Malformed),
        };
        out.push(decoded);
        rest = &rest[i + 2..];
    }
    out.extend_from_slice(rest);
    Ok(())
}

/// Parses a `content-length` value: ASCII digits, optionally padded with spaces/tabs.
/// Non-numeric → `Malformed`; larger than `max_body` (including overflow) → `FrameTooLarge`.
fn parse_length(value: &[u8], max_body: usize) -> Result<usize, DecodeError> {
    let value = trim_blanks(value);
    if value.is_empty() || !value.iter().all(u8::is_ascii_digit) {
        return Err(DecodeError::Malformed);
    }
    // Digits only now, so `None` can only be an overflow.
    match super::frame::decimal(value).and_then(|n| usize::try_from(n).ok()) {
        Some(n) if n <= max_body => Ok(n),
        _ => Err(DecodeError::FrameTooLarge),
    }
}

fn trim_blanks(mut v: &[u8]) -> &[u8] {
    while let [b' ' | b'\t', rest @ ..] = v {
        v = rest;
    }
    while let [rest @ .., b' ' | b'\t'] = v {
        v = rest;
    }
    v
}

/// The process-wide budget for inbound partial frames (issue 13): bytes that every decoder of
/// the process holds for frames not complete yet — headers still arriving, or a body, with or
/// without `content-length`, counted as it arrives. One instance is shared by all cores.
///
/// Cost: each connection reports its holding through its [`PartialShare`] once per read
/// batch, and only when it changed: one or two relaxed atomic adds per read syscall (itself
/// up to 256 KiB), never per byte or per frame.
#[derive(Debug, Default)]
pub struct PartialFrames {
    held: AtomicUsize,
    /// Connections holding anything.
    holders: AtomicUsize,
}

impl PartialFrames {
    /// Bytes held now, over all connections.
    pub fn held(&self) -> usize {
        self.held.load(Ordering::Relaxed)
    }

    /// One holder went from holding `before` bytes to `now`. True when it must be refused
    /// (`frame too large`): the process is over `budget` and this holder grew to at least an
    /// average share of what is held. The largest holder always has one, so whoever keeps
    /// growing the excess is cut off; holders of less are left alone, so one huge frame does
    /// not cost the many small ones. A single frame over the budget is therefore refused too.
    pub fn update(&self, before: usize, now: usize, budget: usize) -> bool {
        if now == before {
            return false;
        }
        match (before, now) {
            (0, _) => self.holders.fetch_add(1, Ordering::Relaxed),
            (_, 0) => self.holders.fetch_sub(1, Ordering::Relaxed),
            _ => 0,
        };
        let total = if now > before {
            self.held.fetch_add(now - before, Ordering::Relaxed) + (now - before)
        } else {
            self.held.fetch_sub(before - now, Ordering::Relaxed) - (before - now)
        };
        let holders = self.holders.load(Ordering::Relaxed).max(1);
        now > before && total > budget && now.saturating_mul(holders) >= total
    }
}

/// One holder's part of [`PartialFrames`] (a connection's decoder, or its WebSocket layer);
/// gives it back when dropped. `F` is how it reaches the process-wide total: a borrow, or an
/// `Arc` for a holder that must own it.
#[derive(Debug)]
pub struct PartialShare<F: std::ops::Deref<Target = PartialFrames>> {
    all: F,
    held: usize,
}

impl<F: std::ops::Deref<Target = PartialFrames>> PartialShare<F> {
    pub fn new(all: F) -> Self {
        PartialShare { all, held: 0 }
    }

    /// This connection now holds `now` bytes of an incomplete frame. True when it must be
    /// refused (`frame too large`): see [`PartialFrames::update`].
    pub fn update(&mut self, now: usize, budget: usize) -> bool {
        let before = std::mem::replace(&mut self.held, now);
        self.all.update(before, now, budget)
    }
}

impl<F: std::ops::Deref<Target = PartialFrames>> Drop for PartialShare<F> {
    fn drop(&mut self) {
        self.update(0, usize::MAX);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    type Item = Result<Decoded, DecodeError>;

    /// Feeds `input` to a fresh decoder in pieces of `piece` bytes, draining after each piece
    /// until it needs more bytes or fails (then it stops feeding). Returns the results and how
    /// many bytes the decoder consumed.
    fn decode_in_pieces(version: Option<Version>, limits: Limits, input: &[u8], piece: usize) -> (Vec<Item>, usize) {
        let mut d = Decoder::new(limits);
        if let Some(v) = version {
            d.set_version(v);
        }
        let mut buf = BytesMut::new();
        let mut out = Vec::new();
        let mut fed = 0;
        for chunk in input.chunks(piece.max(1)) {
            buf.extend_from_slice(chunk);
            fed += chunk.len();
            loop {
                match d.decode(&mut buf) {
                    Ok(Some(item)) => out.push(Ok(item)),
                    Ok(None) => break,
                    Err(e) => {
                        out.push(Err(e));
                        return (out, fed - buf.len());
                    }
                }
            }
        }
        (out, fed - buf.len())
    }

    /// Runs `f` with the piece sizes seastar's memcached parser test uses, plus "whole".
    fn for_each_fragment_size(input_len: usize, mut f: impl FnMut(usize)) {
        for size in [1, 2, 5, 10, 100, 1000, input_len.max(1)] {
            f(size);
        }
    }

    /// Asserts that every way of cutting `input` yields `expected` and leaves the suffix `rest`
    /// unconsumed (after an error, the decoder must not have consumed the failing frame).
    fn check_rest(version: Option<Version>, limits: Limits, input: &[u8], expected: &[Item], rest: &[u8]) {
        assert!(input.ends_with(rest));
        for_each_fragment_size(input.len(), |size| {
            let (got, consumed) = decode_in_pieces(version, limits, input, size);
            assert_eq!(got, expected, "piece size {size}");
            assert_eq!(consumed, input.len() - rest.len(), "consumed, piece size {size}");
        });
    }

    fn check(version: Option<Version>, input: &[u8], expected: &[Item]) {
        check_rest(version, Limits::default(), input, expected, b"");
    }

    fn frame(command: Command, headers: &[(&[u8], &[u8])], body: &[u8]) -> Item {
        Ok(Decoded::Frame(Frame {
            command,
            headers: Headers::from_pairs(headers.iter().map(|(n, v)| (Bytes::copy_from_slice(n), Bytes::copy_from_slice(v)))),
            body: Bytes::copy_from_slice(body),
        }))
    }

    const HB: Item = Ok(Decoded::HeartBeat);
    const MALFORMED: Item = Err(DecodeError::Malformed);
    const TOO_LARGE: Item = Err(DecodeError::FrameTooLarge);
    const ALL: [Option<Version>; 4] = [None, Some(Version::V1_0), Some(Version::V1_1), Some(Version::V1_2)];

    #[test]
    fn simple_frame_every_version() {
        for v in ALL {
            check(
                v,
                b"SEND\ndestination:/queue/a\ncontent-type:text/plain\n\nhello queue a\n\0",
                &[frame(Command::Send, &[(b"destination", b"/queue/a"), (b"content-type", b"text/plain")], b"hello queue a\n")],
            );
        }
    }

    #[test]
    fn frame_without_headers_and_empty_body() {
        for v in ALL {
            check(v, b"DISCONNECT\n\n\0", &[frame(Command::Disconnect, &[], b"")]);
            check(v, b"SEND\ncontent-length:0\n\n\0", &[frame(Command::Send, &[(b"content-length", b"0")], b"")]);
        }
    }

    #[test]
    fn crlf_in_1_2_and_before_connect() {
        for v in [None, Some(Version::V1_2)] {
            check(
                v,
                b"SEND\r\ndestination:/queue/a\r\nx:y\r\n\r\nbody\r\n\0",
                &[frame(Command::Send, &[(b"destination", b"/queue/a"), (b"x", b"y")], b"body\r\n")],
            );
        }
    }

    #[test]
    fn crlf_in_1_0_and_1_1_keeps_cr_in_the_line() {
        for v in [Some(Version::V1_0), Some(Version::V1_1)] {
            // The CR is part of the command line, so the command is unknown.
            check_rest(v, Limits::default(), b"SEND\r\n\n\0", &[MALFORMED], b"SEND\r\n\n\0");
            // A CR at the end of a header line is part of the value.
            check(v, b"SEND\nx:y\r\n\n\0", &[frame(Command::Send, &[(b"x", b"y\r")], b"")]);
            // "\r" alone is not a blank line but a header line without ':'.
            check_rest(v, Limits::default(), b"SEND\nx:y\n\r\n\0", &[MALFORMED], b"SEND\nx:y\n\r\n\0");
        }
    }

    #[test]
    fn heart_beats_between_frames_one_per_eol() {
        for v in ALL {
            check(v, b"\n\r\n\nSEND\n\nA\0\n\r\nSEND\n\nB\0\n", &[HB, HB, HB, frame(Command::Send, &[], b"A"), HB, HB, frame(Command::Send, &[], b"B"), HB]);
        }
    }

    #[test]
    fn lone_cr_waits_then_starts_a_frame() {
        // A CR not followed by LF starts the command line, which is then unknown.
        check_rest(None, Limits::default(), b"\r", &[], b"\r");
        check_rest(None, Limits::default(), b"\rSEND\n\n\0", &[MALFORMED], b"\rSEND\n\n\0");
    }

    #[test]
    fn content_length_body_with_embedded_nuls() {
        for v in ALL {
            check(v, b"SEND\ncontent-length:5\n\na\0b\0c\0", &[frame(Command::Send, &[(b"content-length", b"5")], b"a\0b\0c")]);
        }
    }

    #[test]
    fn content_length_first_wins_and_padding_tolerated() {
        check(
            Some(Version::V1_2),
            b"SEND\ncontent-length:2\ncontent-length:zz\n\n\0\0\0",
            &[frame(Command::Send, &[(b"content-length", b"2"), (b"content-length", b"zz")], b"\0\0")],
        );
        check(Some(Version::V1_0), b"SEND\ncontent-length: 3 \n\nabc\0", &[frame(Command::Send, &[(b"content-length", b" 3 ")], b"abc")]);
    }

    #[test]
    fn lying_content_length_is_malformed() {
        // Stated 3, but byte 3 of the body is 'd', not NUL.
        let input = b"SEND\ncontent-length:3\n\nabcd\0";
        check_rest(Some(Version::V1_2), Limits::default(), input, &[MALFORMED], input);
        // Stated 1 but the body is empty: the NUL is read as body and the next byte is not NUL.
        let input = b"SEND\ncontent-length:1\n\n\0SEND\n\n\0";
        check_rest(Some(Version::V1_2), Limits::default(), input, &[MALFORMED], input);
    }

    #[test]
    fn non_numeric_content_length_is_malformed() {
        for bad in [&b"abc"[..], b"", b"-1", b"+1", b"1 2", b"0x10"] {
            let mut input = b"SEND\ncontent-length:".to_vec();
            input.extend_from_slice(bad);
            input.extend_from_slice(b"\n\n\0");
            check_rest(Some(Version::V1_2), Limits::default(), &input, &[MALFORMED], &input);
        }
    }

    #[test]
    fn content_length_waits_for_body() {
        // Body not complete yet: nothing decoded, nothing consumed.
        let input = b"SEND\ncontent-length:10\n\nabc";
        check_rest(Some(Version::V1_2), Limits::default(), input, &[], input);
    }

    #[test]
    fn escapes_1_1() {
        check(Some(Version::V1_1), b"SEND\na\\cb:x\\ny\\\\z\\c\n\n\0", &[frame(Command::Send, &[(b"a:b", b"x\ny\\z:")], b"")]);
        // \r is not defined in 1.1.
        let input = b"SEND\nk:a\\rb\n\n\0";
        check_rest(Some(Version::V1_1), Limits::default(), input, &[MALFORMED], input);
    }

    #[test]
    fn escapes_1_2() {
        check(Some(Version::V1_2), b"MESSAGE\na\\cb:x\\ny\\\\z\\c\\r\n\n\0", &[frame(Command::Message, &[(b"a:b", b"x\ny\\z:\r")], b"")]);
    }

    #[test]
    fn no_unescaping_before_connect_or_in_1_0() {
        for v in [None, Some(Version::V1_0)] {
            check(v, b"SEND\nk:a\\cb\\t\\\n\n\0", &[frame(Command::Send, &[(b"k", b"a\\cb\\t\\")], b"")]);
        }
    }

    #[test]
    fn undefined_escape_is_malformed() {
        for v in [Some(Version::V1_1), Some(Version::V1_2)] {
            for bad in [&b"SEND\nk:\\t\n\n\0"[..], b"SEND\nk:abc\\\n\n\0", b"SEND\n\\x:v\n\n\0", b"SEND\nk:\\C\n\n\0"] {
                check_rest(v, Limits::default(), bad, &[MALFORMED], bad);
            }
        }
    }

    #[test]
    fn connect_headers_are_never_unescaped() {
        for v in ALL {
            for cmd in [&b"CONNECT"[..], b"STOMP"] {
                let mut input = cmd.to_vec();
                input.extend_from_slice(b"\nlogin:a\\cb\npasscode:p:w\\t\n\n\0");
                let command = Command::parse(cmd).unwrap();
                check(v, &input, &[frame(command, &[(b"login", b"a\\cb"), (b"passcode", b"p:w\\t")], b"")]);
            }
        }
    }

    #[test]
    fn value_splits_at_first_colon() {
        for v in ALL {
            check(v, b"SEND\nurl:http://h:1/x\nempty:\n\n\0", &[frame(Command::Send, &[(b"url", b"http://h:1/x"), (b"empty", b"")], b"")]);
        }
    }

    #[test]
    fn header_without_colon_or_name_is_malformed() {
        for v in ALL {
            for bad in [&b"SEND\nnocolon\n\n\0"[..], b"SEND\n:value\n\n\0"] {
                check_rest(v, Limits::default(), bad, &[MALFORMED], bad);
            }
        }
    }

    #[test]
    fn repeated_headers_kept_in_order() {
        check(
            Some(Version::V1_2),
            b"MESSAGE\nfoo:World\nfoo:Hello\nbar:1\nfoo:x\n\n\0",
            &[frame(Command::Message, &[(b"foo", b"World"), (b"foo", b"Hello"), (b"bar", b"1"), (b"foo", b"x")], b"")],
        );
    }

    #[test]
    fn multiple_frames_in_one_buffer() {
        check(
            Some(Version::V1_2),
            b"SEND\ndestination:/a\n\none\0SUBSCRIBE\nid:1\ndestination:/b\n\n\0ACK\nid:7\n\n\0",
            &[
                frame(Command::Send, &[(b"destination", b"/a")], b"one"),
                frame(Command::Subscribe, &[(b"id", b"1"), (b"destination", b"/b")], b""),
                frame(Command::Ack, &[(b"id", b"7")], b""),
            ],
        );
    }

    #[test]
    fn server_commands_decode_too() {
        for (name, cmd) in [(&b"CONNECTED"[..], Command::Connected), (b"MESSAGE", Command::Message), (b"RECEIPT", Command::Receipt), (b"ERROR", Command::Error)]
        {
            let mut input = name.to_vec();
            input.extend_from_slice(b"\n\n\0");
            check(Some(Version::V1_2), &input, &[frame(cmd, &[], b"")]);
        }
    }

    #[test]
    fn unknown_command_is_malformed() {
        for v in ALL {
            for bad in [&b"send\n\n\0"[..], b"GET / HTTP/1.1\n\n\0", b"SENDX\n\n\0", b"SEND \n\n\0"] {
                check_rest(v, Limits::default(), bad, &[MALFORMED], bad);
            }
        }
        // The command is rejected as soon as its line is complete, before the frame ends.
        check_rest(None, Limits::default(), b"BOGUS\nk:v\n", &[MALFORMED], b"BOGUS\nk:v\n");
    }

    #[test]
    fn frames_after_a_frame_are_not_consumed_early() {
        // The second frame is left for a later call, after the caller had a chance to
        // `set_version`.
        let mut d = Decoder::new(Limits::default());
        let mut buf = BytesMut::from(&b"CONNECT\naccept-version:1.2\n\n\0SEND\nk:a\\cb\n\n\0"[..]);
        assert_eq!(d.decode(&mut buf), frame(Command::Connect, &[(b"accept-version", b"1.2")], b"").map(Some));
        assert_eq!(&buf[..], b"SEND\nk:a\\cb\n\n\0");
        d.set_version(Version::V1_2);
        assert_eq!(d.decode(&mut buf), frame(Command::Send, &[(b"k", b"a:b")], b"").map(Some));
        assert!(buf.is_empty());
        assert_eq!(d.decode(&mut buf), Ok(None));
    }

    fn limits(max_header_bytes: usize, max_headers: usize, max_body: usize) -> Limits {
        Limits { max_header_bytes, max_headers, max_body }
    }

    #[test]
    fn header_bytes_limit_is_exact() {
        // Header block = "SEND\n" + "k:vvvv\n" + "\n" = 5 + 7 + 1 = 13 bytes.
        let input = b"SEND\nk:vvvv\n\nbody\0";
        let ok = [frame(Command::Send, &[(b"k", b"vvvv")], b"body")];
        check_rest(Some(Version::V1_2), limits(13, 128, 1024), input, &ok, b"");
        check_rest(Some(Version::V1_2), limits(12, 128, 1024), input, &[TOO_LARGE], input);
    }

    #[test]
    fn header_bytes_limit_fires_without_a_blank_line() {
        // A client that never ends its headers is refused once the limit is passed, not
        // buffered forever. No LF at all (one endless command line) is caught the same way.
        let mut endless = b"SEND\n".to_vec();
        endless.extend(std::iter::repeat_n(b'x', 100));
        check_rest(Some(Version::V1_2), limits(64, 128, 1024), &endless, &[TOO_LARGE], &endless);
        let no_lf = vec![b'A'; 100];
        check_rest(None, limits(64, 128, 1024), &no_lf, &[TOO_LARGE], &no_lf);
    }

    #[test]
    fn header_count_limit() {
        let input = b"SEND\na:1\nb:2\nc:3\n\n\0";
        let ok = [frame(Command::Send, &[(b"a", b"1"), (b"b", b"2"), (b"c", b"3")], b"")];
        check_rest(Some(Version::V1_2), limits(1024, 3, 1024), input, &ok, b"");
        check_rest(Some(Version::V1_2), limits(1024, 2, 1024), input, &[TOO_LARGE], input);
    }

    #[test]
    fn body_limit_with_content_length() {
        let input = b"SEND\ncontent-length:4\n\nabcd\0";
        let ok = [frame(Command::Send, &[(b"content-length", b"4")], b"abcd")];
        check_rest(Some(Version::V1_2), limits(1024, 128, 4), input, &ok, b"");
        check_rest(Some(Version::V1_2), limits(1024, 128, 3), input, &[TOO_LARGE], input);
        // Refused as soon as the header is parsed: no body byte needs to arrive.
        let head_only = b"SEND\ncontent-length:999999999999\n";
        check_rest(Some(Version::V1_2), limits(1024, 128, 1 << 20), head_only, &[TOO_LARGE], head_only);
        // A length that overflows usize is numeric, just too large.
        let huge = b"SEND\ncontent-length:99999999999999999999999999\n\n";
        check_rest(Some(Version::V1_2), limits(1024, 128, 1 << 20), huge, &[TOO_LARGE], huge);
    }

    #[test]
    fn body_limit_without_content_length() {
        let input = b"SEND\n\nabcd\0";
        let ok = [frame(Command::Send, &[], b"abcd")];
        check_rest(Some(Version::V1_2), limits(1024, 128, 4), input, &ok, b"");
        check_rest(Some(Version::V1_2), limits(1024, 128, 3), input, &[TOO_LARGE], input);
        // Detected while the NUL has not arrived yet.
        let open = b"SEND\n\nabcdefgh";
        check_rest(Some(Version::V1_2), limits(1024, 128, 3), open, &[TOO_LARGE], open);
    }

    #[test]
    fn error_is_repeatable_and_does_not_consume() {
        let mut d = Decoder::new(Limits::default());
        d.set_version(Version::V1_2);
        let mut buf = BytesMut::from(&b"SEND\nk:\\t\n\n\0"[..]);
        assert_eq!(d.decode(&mut buf), Err(DecodeError::Malformed));
        assert_eq!(d.decode(&mut buf), Err(DecodeError::Malformed));
        assert_eq!(&buf[..], b"SEND\nk:\\t\n\n\0");
    }

    #[test]
    fn shrunk_buffer_restarts_instead_of_panicking() {
        let mut d = Decoder::new(Limits::default());
        let mut buf = BytesMut::from(&b"SEND\nkey:value-not-finished"[..]);
        assert_eq!(d.decode(&mut buf), Ok(None));
        buf.clear();
        buf.extend_from_slice(b"ACK\n\n\0");
        assert_eq!(d.decode(&mut buf), frame(Command::Ack, &[], b"").map(Some));
    }

    #[test]
    fn headers_and_body_share_the_read_buffer() {
        // Zero-copy: unescaped headers and the body point into the frame's own bytes.
        let mut d = Decoder::new(Limits::default());
        d.set_version(Version::V1_2);
        let mut buf = BytesMut::from(&b"SEND\nplain:value\nesc:a\\cb\n\nthe body\0"[..]);
        let start = buf.as_ptr() as usize;
        let end = start + buf.len();
        let Ok(Some(Decoded::Frame(f))) = d.decode(&mut buf) else { panic!("no frame") };
        let inside = |b: &[u8]| (start..end).contains(&(b.as_ptr() as usize));
        assert!(inside(&f.body));
        let h: Vec<(&[u8], &[u8])> = f.headers.iter().collect();
        assert!(inside(h[0].0) && inside(h[0].1));
        assert!(inside(h[1].0));
        assert!(!inside(h[1].1), "an unescaped value is a copy");
        assert_eq!(h[1].1, b"a:b");
        // A header kept past the frame shares its buffer too.
        assert!(inside(&f.headers.get_bytes(b"plain").expect("plain")));
        assert!(inside(&f.headers.name_bytes(1)));
        assert_eq!(f.headers.value_bytes(1), Bytes::from_static(b"a:b"));
    }

    /// Feeds `input` one byte at a time and returns (frames decoded, bytes examined).
    fn examined_one_byte_at_a_time(input: &[u8], version: Version) -> (usize, usize) {
        let mut d = Decoder::new(limits(1 << 20, 128, 1 << 24));
        d.set_version(version);
        let mut buf = BytesMut::new();
        let mut frames = 0;
        for &b in input {
            buf.extend_from_slice(&[b]);
            while let Some(item) = d.decode(&mut buf).expect("valid input") {
                if matches!(item, Decoded::Frame(_)) {
                    frames += 1;
                }
            }
        }
        (frames, d.examined)
    }

    #[test]
    fn scan_position_is_kept_across_reads() {
        // A 1 MiB NUL-terminated body and a 60 KiB header line, fed one byte per read: each
        // byte is examined once, not once per read (which would be ~5 * 10^11 for the body).
        let mut input = b"SEND\nlong:".to_vec();
        input.extend(std::iter::repeat_n(b'h', 60 * 1024));
        input.extend_from_slice(b"\n\n");
        input.extend(std::iter::repeat_n(b'b', 1 << 20));
        input.push(0);
        let started = std::time::Instant::now();
        let (frames, examined) = examined_one_byte_at_a_time(&input, Version::V1_2);
        assert_eq!(frames, 1);
        assert_eq!(examined, input.len());
        assert!(started.elapsed() < std::time::Duration::from_secs(10), "took {:?}", started.elapsed());
    }

    #[test]
    fn content_length_body_is_not_scanned() {
        let body = vec![7u8; 1 << 20];
        let mut input = format!("SEND\ncontent-length:{}\n\n", body.len()).into_bytes();
        let head = input.len();
        input.extend_from_slice(&body);
        input.push(0);
        let (frames, examined) = examined_one_byte_at_a_time(&input, Version::V1_2);
        assert_eq!(frames, 1);
        assert_eq!(examined, head);
    }

    #[test]
    fn partial_frames_refuse_the_connection_that_grows_past_the_budget_with_an_average_share() {
        let all = PartialFrames::default();
        let mut small = PartialShare::new(&all);
        let mut big = PartialShare::new(&all);
        assert!(!small.update(10, 100));
        assert!(!big.update(80, 100), "at 90 of 100: within the budget");
        // Over the budget: the small one (10 of 110, under the average 55) is left alone…
        assert!(!big.update(80, 100));
        assert!(!small.update(30, 100), "30 of 110 is under the average share");
        // …the one that keeps growing with the largest share is refused.
        assert!(big.update(90, 100));
        assert_eq!(all.held(), 120);
        drop(big);
        assert_eq!(all.held(), 30, "a dropped share gives its bytes back");
        assert!(!small.update(0, 100));
        assert_eq!(all.held(), 0);
        // One frame larger than the whole budget is refused on its own.
        let mut alone = PartialShare::new(&all);
        assert!(alone.update(101, 100));
    }
}

/// Header lists not in use on this thread: an idle decoder (`Decoder::park`) gives its list
/// back, and the next header line of any connection takes one.
mod spare_headers {
    use super::Span;
    use std::cell::RefCell;

    /// Enough for the connections of one core that wake in the same loop turn; lists past it
    /// are freed.
    const KEEP: usize = 64;

    thread_local! {
        static SPARE: RefCell<Vec<Vec<(Span, Span)>>> = const { RefCell::new(Vec::new()) };
    }

    pub(super) fn take() -> Vec<(Span, Span)> {
        SPARE.with(|s| s.borrow_mut().pop()).unwrap_or_default()
    }

    pub(super) fn give(mut list: Vec<(Span, Span)>) {
        list.clear();
        SPARE.with(|s| {
            let mut s = s.borrow_mut();
            if s.len() < KEEP {
                s.push(list);
            }
        });
    }
}
