//! The closed vocabulary of ERROR `message` texts (stomp-decisions.md, "Error vocabulary").
//! Only a `WireError` can become an ERROR frame, so internal error text never reaches the wire.
//!
//! Every error also carries a short hint for the ERROR body naming the rule that was broken
//! (issue 18). Hints are built only from this file's static text and the gateway's own limits:
//! a client's bytes (header values, unknown header names, destinations) are never echoed.
use std::borrow::Cow;

/// A sanitized error that may be sent to a STOMP client.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WireError {
    InvalidDestination,
    /// Seed 001 files "cannot SEND to reply destinations" under `invalid destination`:
    /// the `message` header says `invalid destination`, the body carries the hint.
    CannotSendToReply,
    FrameTooLarge(TooLarge),
    MalformedFrame(Malformed),
    UnsupportedVersion,
    NotConnected,
    CannotSubscribeRpc,
    MissingReplyTo,
    ReplyToNotSubscribed,
    TooManyPending,
    /// The memory budgets of issue 13 have no entry of their own in the closed vocabulary;
    /// each is the nearest one, `too many pending requests` (work this connection asked the
    /// gateway to hold is over its bound), with a hint saying which bound.
    TooManyTxFrames,
    TooManyTransactions,
    TooManySubscriptions,
    /// A SEND to a queue at its depth limit (messages or bytes).
    QueueFull,
    /// A queue or Events-Store SEND the persistent store has no room for: its
    /// `--store-max-bytes` (the value; 0 = no cap, so the disk itself is full).
    StoreFull(u64),
    DuplicateSubscription,
    UnknownSubscription,
    UnknownTransaction,
    AccessDenied,
    TooManyConnections,
    ShuttingDown,
    Internal,
}

/// Which limit made a frame `frame too large`, with the limit's value (the gateway's own
/// configuration, so it is safe to show).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TooLarge {
    /// The command line and headers together (bytes).
    HeaderBlock(usize),
    /// The number of header lines.
    HeaderCount(usize),
    /// The body, by `content-length` or by where its NUL is (bytes; `--max-body-size`).
    Body(usize),
    /// The per-core budget for frames still arriving (bytes; `--partial-frames-budget`).
    PartialFrames(usize),
    /// Headers that become KubeMQ tags: too many custom ones, or a value too long.
    Tags { max_custom: usize, max_value: usize },
}

/// Which rule made a frame `malformed frame`. One variant per rule, so each ERROR names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Malformed {
    // The decoder (the frame's syntax).
    UnknownCommand,
    HeaderWithoutColon,
    EmptyHeaderName,
    UndefinedEscape,
    BadContentLength,
    NoNulAfterContentLength,
    // CONNECT.
    BadHeartBeat,
    // SEND.
    SendWithoutDestination,
    BadTimeout,
    BadCacheTtl,
    // SUBSCRIBE / UNSUBSCRIBE.
    SubscribeWithoutDestination,
    SubscribeWithoutId,
    BadAckMode,
    BadStart,
    UnsubscribeWithoutId,
    Unsubscribe10WithoutIdOrDestination,
    // ACK / NACK.
    AckWithoutId,
    AckWithoutMessageId,
    // Transactions.
    BeginWithoutTransaction,
    CommitWithoutTransaction,
    TransactionAlreadyOpen,
    // Frames that are not allowed at this point.
    SecondConnect,
    ServerFrame,
}

impl Malformed {
    /// The rule, in a few words.
    pub fn rule(self) -> &'static str {
        match self {
            Malformed::UnknownCommand => "unknown command: a frame starts with a client command line (CONNECT, STOMP, SEND, SUBSCRIBE, UNSUBSCRIBE, ACK, NACK, BEGIN, COMMIT, ABORT, DISCONNECT)",
            Malformed::HeaderWithoutColon => "a header line has no ':' between name and value",
            Malformed::EmptyHeaderName => "a header line has an empty name",
            Malformed::UndefinedEscape => "undefined escape in a header: STOMP 1.1 allows \\n \\c \\\\ and 1.2 also \\r",
            Malformed::BadContentLength => "the content-length header is not a decimal number of octets",
            Malformed::NoNulAfterContentLength => "the body is longer than its content-length header says (no NUL after content-length octets)",
            Malformed::BadHeartBeat => "the heart-beat header must be two non-negative integers 'cx,cy'",
            Malformed::SendWithoutDestination => "SEND requires a destination header",
            Malformed::BadTimeout => "the timeout header must be a non-negative integer of milliseconds",
            Malformed::BadCacheTtl => "x-kubemq-cache-ttl must be a positive integer of seconds (at most 2147483647), and is required with x-kubemq-cache-key",
            Malformed::SubscribeWithoutDestination => "SUBSCRIBE requires a destination header",
            Malformed::SubscribeWithoutId => "STOMP 1.1 and 1.2 require an id header on SUBSCRIBE",
            Malformed::BadAckMode => "the ack header must be auto, client or client-individual",
            Malformed::BadStart => "x-kubemq-start must be new-only, first, last, sequence:N, time:RFC3339-or-unix-seconds or time-delta:SECONDS",
            Malformed::UnsubscribeWithoutId => "STOMP 1.1 and 1.2 require an id header on UNSUBSCRIBE",
            Malformed::Unsubscribe10WithoutIdOrDestination => "UNSUBSCRIBE requires an id or destination header",
            Malformed::AckWithoutId => "STOMP 1.2 ACK and NACK require an id header (the MESSAGE's ack header)",
            Malformed::AckWithoutMessageId => "STOMP 1.0 and 1.1 ACK and NACK require a message-id header",
            Malformed::BeginWithoutTransaction => "BEGIN requires a transaction header",
            Malformed::CommitWithoutTransaction => "COMMIT and ABORT require a transaction header",
            Malformed::TransactionAlreadyOpen => "BEGIN names a transaction that is already open on this connection",
            Malformed::SecondConnect => "already connected: CONNECT or STOMP may be sent only once",
            Malformed::ServerFrame => "MESSAGE, RECEIPT, ERROR and CONNECTED are server frames; a client may not send them",
        }
    }
}

impl WireError {
    /// The `message` header value.
    pub fn message(self) -> &'static str {
        match self {
            WireError::InvalidDestination | WireError::CannotSendToReply => "invalid destination",
            WireError::FrameTooLarge(_) => "frame too large",
            WireError::MalformedFrame(_) => "malformed frame",
            WireError::UnsupportedVersion => "unsupported protocol version",
            WireError::NotConnected => "not connected",
            WireError::CannotSubscribeRpc => "cannot subscribe to RPC destinations",
            WireError::MissingReplyTo => "missing reply-to",
            WireError::ReplyToNotSubscribed => "reply-to not subscribed",
            WireError::TooManyPending
            | WireError::TooManyTxFrames
            | WireError::TooManyTransactions
            | WireError::TooManySubscriptions
            | WireError::QueueFull
            | WireError::StoreFull(_) => "too many pending requests",
            WireError::DuplicateSubscription => "duplicate subscription id",
            WireError::UnknownSubscription => "unknown subscription",
            WireError::UnknownTransaction => "unknown transaction",
            WireError::AccessDenied => "access denied",
            WireError::TooManyConnections => "too many connections",
            WireError::ShuttingDown => "server shutting down",
            WireError::Internal => "internal error",
        }
    }

    /// The short sanitized hint for the ERROR body: never empty. Only a limit's value is
    /// formatted (errors are rare: the allocation is off the happy path).
    pub fn hint(self) -> Cow<'static, str> {
        Cow::Borrowed(match self {
            WireError::InvalidDestination => {
                "a destination is /queue/, /topic/, /topic-store/, /command/, /query/ or /reply/ and a channel name of at most 512 bytes: no empty segment, whitespace or trailing '.'; wildcards (* >) only in SUBSCRIBE to /topic/"
            }
            WireError::CannotSendToReply => "cannot SEND to reply destinations",
            WireError::FrameTooLarge(limit) => return Cow::Owned(too_large_hint(limit)),
            WireError::MalformedFrame(why) => why.rule(),
            WireError::UnsupportedVersion => "supported versions are 1.0,1.1,1.2",
            WireError::NotConnected => "the first frame must be CONNECT or STOMP",
            WireError::CannotSubscribeRpc => "/command/ and /query/ take requests by SEND; receive replies by subscribing to a /reply/ destination",
            WireError::MissingReplyTo => "a SEND to /command/ or /query/ requires a reply-to header naming a /reply/ destination",
            WireError::ReplyToNotSubscribed => "reply-to must name a /reply/ destination this connection has subscribed to",
            WireError::TooManyPending => "more RPC requests in flight on this connection than --rpc-max-pending",
            // These four bodies predate issue 18 and tests/memory_budgets.rs pins them.
            WireError::TooManyTxFrames => "the transaction holds too many frames",
            WireError::TooManyTransactions => "too many open transactions",
            WireError::TooManySubscriptions => "too many subscriptions",
            WireError::QueueFull => "the queue is full",
            WireError::StoreFull(0) => "the store is full: no space left on its disk",
            WireError::StoreFull(max) => return Cow::Owned(format!("the store is full: --store-max-bytes ({max} bytes) or no space left on its disk")),
            WireError::DuplicateSubscription => "this connection already has a subscription with this id",
            WireError::UnknownSubscription => "no subscription with this id on this connection",
            WireError::UnknownTransaction => "no open transaction with this name on this connection",
            WireError::AccessDenied => "the credentials or the access rules do not allow this",
            WireError::TooManyConnections => "the gateway is at --max-connections",
            WireError::ShuttingDown => "the gateway is stopping; reconnect later",
            WireError::Internal => "the gateway could not handle this frame; the connection is closed",
        })
    }
}

fn too_large_hint(limit: TooLarge) -> String {
    match limit {
        TooLarge::HeaderBlock(max) => format!("the command line and headers exceed {max} bytes"),
        TooLarge::HeaderCount(max) => format!("a frame may have at most {max} headers"),
        TooLarge::Body(max) => format!("the body exceeds --max-body-size ({max} bytes)"),
        TooLarge::PartialFrames(max) => format!("frames still arriving on this core exceed --partial-frames-budget ({max} bytes)"),
        TooLarge::Tags { max_custom, max_value } => {
            format!("a SEND may carry at most {max_custom} custom headers, each value at most {max_value} bytes")
        }
    }
}

impl std::fmt::Display for WireError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.message())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_hint_is_short_and_printable() {
        let all = [
            WireError::InvalidDestination,
            WireError::FrameTooLarge(TooLarge::HeaderBlock(65536)),
            WireError::FrameTooLarge(TooLarge::Tags { max_custom: 32, max_value: 4096 }),
            WireError::MalformedFrame(Malformed::UnknownCommand),
            WireError::MalformedFrame(Malformed::UndefinedEscape),
            WireError::Internal,
        ];
        for e in all {
            let h = e.hint();
            assert!(!h.is_empty() && h.len() <= 240, "{e:?}: {h}");
            assert!(h.bytes().all(|b| (b' '..=b'~').contains(&b)), "{e:?}: {h}");
        }
        assert_eq!(WireError::FrameTooLarge(TooLarge::Body(65536)).hint(), "the body exceeds --max-body-size (65536 bytes)");
    }
}
