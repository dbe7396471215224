//! AMQP 1.0 framing (AMQP 1.0 part 2.3, 5.3): protocol headers, the 8-byte frame header and
//! the frame bodies, AMQP (performative + payload) and SASL.
//!
//! The type system is `serde_amqp` / `fe2o3-amqp-types`; this layer only cuts the byte stream
//! into frames and every length is checked here before anything is allocated or handed on:
//! a frame's `size` against the negotiated max-frame-size (so a crafted size never reserves
//! gigabytes: the bytes are only taken once they have all arrived, and never more than the
//! limit), the data offset against the size, and the performative's own length prefix against
//! the frame body. Bad input is an error value, never a panic.
use bytes::{Buf, Bytes, BytesMut};
use fe2o3_amqp_types::performatives::Performative;
use fe2o3_amqp_types::sasl::{SaslChallenge, SaslInit, SaslMechanisms, SaslOutcome, SaslResponse};
use serde::Serialize;

/// The header that opens an AMQP connection (protocol id 0, version 1.0.0).
pub const AMQP_HEADER: [u8; 8] = *b"AMQP\x00\x01\x00\x00";
/// The header that opens the SASL layer (protocol id 3).
pub const SASL_HEADER: [u8; 8] = *b"AMQP\x03\x01\x00\x00";
/// Every peer must accept frames this large before OPEN is exchanged (part 2.4.1).
pub const MIN_MAX_FRAME_SIZE: u32 = 512;
/// Frame header length; also the smallest legal `size`.
pub const HEADER_LEN: usize = 8;
/// Frame type codes.
const TYPE_AMQP: u8 = 0x00;
const TYPE_SASL: u8 = 0x01;

/// What the first eight bytes of a connection (or of the layer after SASL) said.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProtocolHeader {
    Amqp,
    Sasl,
}

/// Reads a protocol header: `Ok(None)` until eight bytes are there, `Err` for anything but
/// AMQP 1.0.0 with protocol id 0 or 3 (the caller answers with the header it supports and
/// closes, part 2.2).
pub fn read_protocol_header(buf: &mut BytesMut) -> Result<Option<ProtocolHeader>, FrameError> {
    if buf.len() < 8 {
        // A peer speaking something else is detected as early as its first differing byte.
        if !AMQP_HEADER.starts_with(&buf[..buf.len().min(4)]) {
            return Err(FrameError::BadProtocolHeader);
        }
        return Ok(None);
    }
    let header = match &buf[..8] {
        h if h == AMQP_HEADER => ProtocolHeader::Amqp,
        h if h == SASL_HEADER => ProtocolHeader::Sasl,
        _ => return Err(FrameError::BadProtocolHeader),
    };
    buf.advance(8);
    Ok(Some(header))
}

/// A SASL frame's body (part 5.3.3).
#[derive(Debug)]
pub enum SaslBody {
    Mechanisms(SaslMechanisms),
    Init(SaslInit),
    Challenge(SaslChallenge),
    Response(SaslResponse),
    Outcome(SaslOutcome),
}

/// One decoded frame.
#[derive(Debug)]
pub enum Frame {
    /// An empty AMQP frame: a heart-beat (part 2.4.5).
    Empty {
        channel: u16,
    },
    /// A performative and, for TRANSFER, its payload (the message bytes, possibly a part).
    Amqp {
        channel: u16,
        performative: Box<Performative>,
        payload: Bytes,
    },
    Sasl(SaslBody),
}

/// Why a frame could not be read. Each is fatal for the connection (`amqp:decode-error` or,
/// for a too-large frame, `amqp:connection:framing-error`-like close with our closed set).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    #[error("not an AMQP 1.0 protocol header")]
    BadProtocolHeader,
    #[error("frame size {0} is below the 8-byte header")]
    SizeTooSmall(u32),
    #[error("frame size {size} exceeds the max-frame-size {max}")]
    SizeTooLarge { size: u32, max: u32 },
    #[error("bad data offset")]
    BadDataOffset,
    #[error("unknown frame type {0}")]
    UnknownType(u8),
    #[error("the frame body is not a valid performative")]
    BadBody,
}

/// Cuts frames off a byte stream, bounded by the max-frame-size in force.
#[derive(Debug)]
pub struct FrameDecoder {
    max_frame_size: u32,
}

impl Default for FrameDecoder {
    fn default() -> Self {
        FrameDecoder { max_frame_size: MIN_MAX_FRAME_SIZE }
    }
}

impl FrameDecoder {
    pub fn new(max_frame_size: u32) -> FrameDecoder {
        FrameDecoder { max_frame_size: max_frame_size.max(MIN_MAX_FRAME_SIZE) }
    }

    /// The limit in force: what we advertised in OPEN (before OPEN, the spec's 512; we are
    /// lenient and use our own limit from the start, which only ever allows more).
    pub fn set_max_frame_size(&mut self, max: u32) {
        self.max_frame_size = max.max(MIN_MAX_FRAME_SIZE);
    }

    pub fn max_frame_size(&self) -> u32 {
        self.max_frame_size
    }

    /// The next whole frame in `buf`, `Ok(None)` if it has not all arrived. The size is
    /// judged from the header alone, before waiting for (or reserving room for) the body.
    pub fn decode(&self, buf: &mut BytesMut) -> Result<Option<Frame>, FrameError> {
        if buf.len() < HEADER_LEN {
            return Ok(None);
        }
        let size = u32::from_be_bytes([buf[0], buf[1], buf[2], buf[3]]);
        let doff = buf[4];
        let kind = buf[5];
        let channel = u16::from_be_bytes([buf[6], buf[7]]);
        if (size as usize) < HEADER_LEN {
            return Err(FrameError::SizeTooSmall(size));
        }
        if size > self.max_frame_size {
            return Err(FrameError::SizeTooLarge { size, max: self.max_frame_size });
        }
        let body_start = usize::from(doff) * 4;
        if body_start < HEADER_LEN || body_start > size as usize {
            return Err(FrameError::BadDataOffset);
        }
        if kind != TYPE_AMQP && kind != TYPE_SASL {
            return Err(FrameError::UnknownType(kind));
        }
        if buf.len() < size as usize {
            return Ok(None);
        }
        let mut frame = buf.split_to(size as usize).freeze();
        frame.advance(body_start);
        decode_body(kind, channel, frame).map(Some)
    }
}

/// Decodes a frame body of type `kind` (the bytes after the data offset).
pub fn decode_body(kind: u8, channel: u16, body: Bytes) -> Result<Frame, FrameError> {
    if kind == TYPE_AMQP && body.is_empty() {
        return Ok(Frame::Empty { channel });
    }
    let len = described_list_len(&body).ok_or(FrameError::BadBody)?;
    let (head, payload) = (body.slice(..len), body.slice(len..));
    if kind == TYPE_SASL {
        if !payload.is_empty() {
            return Err(FrameError::BadBody);
        }
        return decode_sasl(&head).map(Frame::Sasl);
    }
    if !well_formed(&head) {
        return Err(FrameError::BadBody);
    }
    let performative: Performative = serde_amqp::from_slice(&head).map_err(|_| FrameError::BadBody)?;
    // Only TRANSFER carries a payload (part 2.3.2).
    if !payload.is_empty() && !matches!(performative, Performative::Transfer(_)) {
        return Err(FrameError::BadBody);
    }
    Ok(Frame::Amqp { channel, performative: Box::new(performative), payload })
}

fn decode_sasl(head: &[u8]) -> Result<SaslBody, FrameError> {
    if !well_formed(head) {
        return Err(FrameError::BadBody);
    }
    let code = descriptor_code(head).ok_or(FrameError::BadBody)?;
    let bad = |_| FrameError::BadBody;
    Ok(match code {
        0x40 => SaslBody::Mechanisms(serde_amqp::from_slice(head).map_err(bad)?),
        0x41 => SaslBody::Init(serde_amqp::from_slice(head).map_err(bad)?),
        0x42 => SaslBody::Challenge(serde_amqp::from_slice(head).map_err(bad)?),
        0x43 => SaslBody::Response(serde_amqp::from_slice(head).map_err(bad)?),
        0x44 => SaslBody::Outcome(serde_amqp::from_slice(head).map_err(bad)?),
        _ => return Err(FrameError::BadBody),
    })
}

/// Deepest nesting of compound and described values accepted (a performative needs about 6).
const MAX_DEPTH: usize = 32;

/// Walks the AMQP type encoding of `b` (values one after another, to its end) and refuses
/// what serde_amqp 0.18 mishandles: a list, map or array whose size cannot even hold its own
/// count field (its decoder subtracts unchecked and panics: found by the `amqp_frame` fuzz
/// target), a map with an odd count (its decoder takes two off the count per entry, unchecked:
/// found by the `amqp_message` fuzz target), any value running past its container or the
/// buffer, an unknown format code, and nesting deeper than [`MAX_DEPTH`] (its decoder
/// recurses). Only sizes and counts are read here; the values themselves are the crate's to
/// decode. Frames and whole messages (`mapping::decode`) both go through it.
pub fn well_formed(b: &[u8]) -> bool {
    let mut at = 0;
    while at < b.len() {
        match value(b, at, 0) {
            Some(next) => at = next,
            None => return false,
        }
    }
    true
}

/// The end of the value (constructor and data) starting at `at`.
fn value(b: &[u8], at: usize, depth: usize) -> Option<usize> {
    let code = *b.get(at)?;
    data(b, at + 1, code, depth)
}

/// The end of the data of a value with format `code`, starting at `at`.
fn data(b: &[u8], at: usize, code: u8, depth: usize) -> Option<usize> {
    if depth > MAX_DEPTH {
        return None;
    }
    match code {
        0x00 => {
            let descriptor_end = value(b, at, depth + 1)?;
            value(b, descriptor_end, depth + 1)
        }
        0x40..=0x45 => Some(at),
        0x50..=0x56 => span(b, at, 1),
        0x60 | 0x61 => span(b, at, 2),
        0x70..=0x74 => span(b, at, 4),
        0x80..=0x84 => span(b, at, 8),
        0x94 | 0x98 => span(b, at, 16),
        0xa0 | 0xa1 | 0xa3 => span(b, at + 1, usize::from(*b.get(at)?)),
        0xb0 | 0xb1 | 0xb3 => span(b, at + 4, read_size(b, at, 4)?),
        0xc0 => compound(b, at, 1, false, depth),
        0xc1 => compound(b, at, 1, true, depth),
        0xd0 => compound(b, at, 4, false, depth),
        0xd1 => compound(b, at, 4, true, depth),
        0xe0 => array(b, at, 1, depth),
        0xf0 => array(b, at, 4, depth),
        _ => None,
    }
}

/// `len` bytes from `at`, inside `b`: their end.
fn span(b: &[u8], at: usize, len: usize) -> Option<usize> {
    let end = at.checked_add(len)?;
    (end <= b.len()).then_some(end)
}

/// A big-endian size field of `width` (1 or 4) bytes at `at`.
fn read_size(b: &[u8], at: usize, width: usize) -> Option<usize> {
    let field = b.get(at..at.checked_add(width)?)?;
    Some(field.iter().fold(0usize, |n, &byte| (n << 8) | usize::from(byte)))
}

/// A list or map: size, count, then `count` values, all inside the size; a map's count (keys
/// and values) is even.
fn compound(b: &[u8], at: usize, width: usize, map: bool, depth: usize) -> Option<usize> {
    let (mut pos, count, end) = sized(b, at, width)?;
    if map && count % 2 != 0 {
        return None;
    }
    for _ in 0..count {
        pos = value(&b[..end], pos, depth + 1)?;
    }
    exactly(pos, end)
}

/// A compound's items must fill its size exactly: serde_amqp reads on after the last item,
/// not from the declared end, so bytes left inside the size would be read as the next value
/// by the crate but skipped by this walk (the `amqp_message` fuzz target's second find).
fn exactly(pos: usize, end: usize) -> Option<usize> {
    (pos == end).then_some(end)
}

/// An array: size, count, one element constructor, then `count` elements of that format.
fn array(b: &[u8], at: usize, width: usize, depth: usize) -> Option<usize> {
    let (mut pos, count, end) = sized(b, at, width)?;
    let inside = &b[..end];
    let mut code = *inside.get(pos)?;
    pos += 1;
    if code == 0x00 {
        pos = value(inside, pos, depth + 1)?;
        code = *inside.get(pos)?;
        pos += 1;
        if code == 0x00 {
            return None;
        }
    }
    if (0x40..=0x45).contains(&code) {
        return exactly(pos, end);
    }
    for _ in 0..count {
        pos = data(inside, pos, code, depth + 1)?;
    }
    exactly(pos, end)
}

/// A compound's size and count fields: (where its items start, their count, its end). The
/// size must cover the count field and stay inside `b`.
fn sized(b: &[u8], at: usize, width: usize) -> Option<(usize, usize, usize)> {
    let size = read_size(b, at, width)?;
    if size < width {
        return None;
    }
    let end = span(b, at + width, size)?;
    let count = read_size(b, at + width, width)?;
    Some((at + 2 * width, count, end))
}

/// The numeric descriptor of a described value (`0x00`, then `smallulong`/`ulong`). Symbolic
/// descriptors are not used by any peer we know for performatives and are refused.
fn descriptor_code(b: &[u8]) -> Option<u64> {
    match b {
        [0x00, 0x53, code, ..] => Some(u64::from(*code)),
        [0x00, 0x80, rest @ ..] if rest.len() >= 8 => Some(u64::from_be_bytes(rest[..8].try_into().ok()?)),
        [0x00, 0x44, ..] => Some(0),
        _ => None,
    }
}

/// The encoded length of the described list at the start of `b` (a performative or SASL
/// body): descriptor + list constructor + the list's own size field. `None` if it is not one
/// or claims more bytes than `b` holds. This is the only part of the encoding read here: it
/// tells where the performative ends and the TRANSFER payload begins.
pub fn described_list_len(b: &[u8]) -> Option<usize> {
    let descriptor_len = match b {
        [0x00, 0x53, ..] => 3,
        [0x00, 0x80, ..] => 10,
        [0x00, 0x44, ..] => 2,
        _ => return None,
    };
    let list = b.get(descriptor_len..)?;
    let list_len = match list {
        [0x45, ..] => 1,
        [0xc0, size, ..] => 2 + usize::from(*size),
        [0xd0, s0, s1, s2, s3, ..] => 5usize.checked_add(u32::from_be_bytes([*s0, *s1, *s2, *s3]) as usize)?,
        _ => return None,
    };
    let total = descriptor_len.checked_add(list_len)?;
    (total <= b.len()).then_some(total)
}

/// Appends one AMQP frame: `performative` (and the TRANSFER `payload`) on `channel`.
pub fn write_amqp(out: &mut BytesMut, channel: u16, performative: &Performative, payload: &[u8]) {
    write_frame(out, TYPE_AMQP, channel, performative, payload);
}

/// Appends one SASL frame.
pub fn write_sasl<T: Serialize>(out: &mut BytesMut, body: &T) {
    write_frame(out, TYPE_SASL, 0, body, &[]);
}

/// Appends an empty frame (a heart-beat).
pub fn write_empty(out: &mut BytesMut) {
    out.extend_from_slice(&[0, 0, 0, 8, 2, TYPE_AMQP, 0, 0]);
}

fn write_frame<T: Serialize>(out: &mut BytesMut, kind: u8, channel: u16, body: &T, payload: &[u8]) {
    // Our own values always encode; an encoder failure would be a bug in the type crate, and
    // an empty frame (a heart-beat) is the harmless thing to send then.
    let Ok(encoded) = serde_amqp::to_vec(body) else {
        write_empty(out);
        return;
    };
    let size = (HEADER_LEN + encoded.len() + payload.len()) as u32;
    out.reserve(size as usize);
    out.extend_from_slice(&size.to_be_bytes());
    out.extend_from_slice(&[2, kind]);
    out.extend_from_slice(&channel.to_be_bytes());
    out.extend_from_slice(&encoded);
    out.extend_from_slice(payload);
}

#[cfg(test)]
mod tests;
