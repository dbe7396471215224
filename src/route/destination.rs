//! The destination router (seed 000 "The grammar", seed 001 "The parse algorithm").
use crate::model::{Channel, Pattern};
use bytes::BytesMut;

/// Connector-wide fallback for destinations with an unknown first segment.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum DefaultPattern {
    #[default]
    Events,
    Queues,
    Store,
    None,
}

/// What the client is doing with the destination: wildcards are legal only when subscribing
/// to Events; `/reply/` is legal only when subscribing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Intent {
    Send,
    Subscribe,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Destination {
    pub pattern: Pattern,
    /// Dotted channel (`a.b.c`); for wildcard subscriptions, the dotted filter (`orders.*`).
    pub channel: Channel,
    /// True when `channel` contains a `*` or `>` token (Events SUBSCRIBE only).
    pub wildcard: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DestinationError {
    #[error("invalid destination")]
    Invalid,
    #[error("cannot send to reply destinations")]
    SendToReply,
    #[error("cannot subscribe to RPC destinations")]
    SubscribeToRpc,
}

pub fn parse_destination(raw: &[u8], default: DefaultPattern, intent: Intent) -> Result<Destination, DestinationError> {
    let _ = (raw, default, intent);
    todo!("router helper")
}

/// Appends the canonical (primary prefix, slash form) destination for egress:
/// (Events, `a.b.c`) → `/topic/a/b/c`.
pub fn write_egress_destination(pattern: Pattern, channel: &[u8], out: &mut BytesMut) {
    let _ = (pattern, channel, out);
    todo!("router helper")
}
