//! Incremental, zero-copy STOMP frame decoder. (Owned by the codec work; see contract below.)
//!
//! Contract:
//! - `decode(&mut buf)` consumes at most one frame (or one heart-beat EOL) from the front of
//!   `buf` and returns it; `Ok(None)` means "not enough bytes yet" and leaves `buf` intact while
//!   remembering how far it has scanned, so a large body is never rescanned from byte 0.
//! - Headers and body are `Bytes` views of `buf` (split off with `split_to().freeze()`); only a
//!   header containing an escape sequence is copied.
//! - Escaping per negotiated version: none before CONNECT/for CONNECT and in 1.0; 1.1 `\c \n \\`;
//!   1.2 adds `\r`. An undefined escape (1.1/1.2) is `Malformed`.
//! - Limits: header block (command line + headers) > `max_header_bytes`, more than
//!   `max_headers` headers, or body > `max_body` → `FrameTooLarge`.
use super::frame::{Frame, Version};
use bytes::BytesMut;

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

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decoded {
    Frame(Frame),
    /// A bare EOL between frames (heart-beat).
    HeartBeat,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("frame too large")]
    FrameTooLarge,
    #[error("malformed frame")]
    Malformed,
}

#[derive(Debug)]
pub struct Decoder {
    limits: Limits,
    version: Option<Version>,
}

impl Decoder {
    pub fn new(limits: Limits) -> Self {
        Decoder { limits, version: None }
    }
    /// Set once CONNECT has been negotiated; before that no header is unescaped.
    pub fn set_version(&mut self, v: Version) {
        self.version = Some(v);
    }
    pub fn decode(&mut self, buf: &mut BytesMut) -> Result<Option<Decoded>, DecodeError> {
        let _ = (buf, &self.limits);
        todo!("codec helper")
    }
}
