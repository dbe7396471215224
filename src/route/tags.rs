//! Header ⇄ tag mapping (seed 000 "Header ⇄ tag interop").
use crate::model::Tags;
use crate::stomp::{FrameWriter, Headers};

#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TagError {
    /// More than 32 custom tags, or a tag value over 4096 bytes: ERROR `frame too large` + close.
    #[error("frame too large")]
    TooLarge,
}

/// SEND headers → KubeMQ tags.
pub fn headers_to_tags(headers: &Headers) -> Result<Tags, TagError> {
    let _ = headers;
    todo!("router helper")
}

/// Egress: writes `x-kubemq-metadata` (if `metadata` is non-empty), the five standard headers
/// from their `stomp.*` tags (which win over bare same-named tags), then custom tags.
pub fn write_egress_tag_headers(tags: &Tags, metadata: &[u8], w: &mut FrameWriter<'_>) {
    let _ = (tags, metadata, w);
    todo!("router helper")
}
