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
    /// `--rpc-max-pending` (its value).
    TooManyPending(usize),
    /// The memory budgets of issue 13 have no entry of their own in the closed vocabulary;
    /// each is the nearest one, `too many pending requests` (work this connection asked the
    /// gateway to hold is over its bound), with a hint saying which bound and its value:
    /// `--max-tx-frames`, `--max-transactions`, `--max-subscriptions`.
    TooManyTxFrames(usize),
    TooManyTransactions(usize),
    TooManySubscriptions(usize),
    /// A SEND to a queue at its depth limit: the embedded array's `--queue-max-messages` and
    /// `--queue-max-bytes`, or None when a remote array refused it (its limits are its own).
    QueueFull(Option<(usize, usize)>),
    /// A queue or Events-Store SEND the persistent store has no room for: its
    /// `--store-max-bytes` (the value; 0 = no cap, so the disk itself is full).
    StoreFull(u64),
    DuplicateSubscription,
    UnknownSubscription,
    UnknownTransaction,
    AccessDenied,
    /// `--max-connections` (its value), or None: out of file descriptors at accept.
    TooManyConnections(Option<usize>),
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
            WireError::TooManyPending(_)
            | WireError::TooManyTxFrames(_)
            | WireError::TooManyTransactions(_)
            | WireError::TooManySubscriptions(_)
            | WireError::QueueFull(_)
            | WireError::StoreFull(_) => "too many pending requests",
            WireError::DuplicateSubscription => "duplicate subscription id",
            WireError::UnknownSubscription => "unknown subscription",
            WireError::UnknownTransaction => "unknown transaction",
            WireError::AccessDenied => "access denied",
            WireError::TooManyConnections(_) => "too many connections",
            WireError::ShuttingDown => "server shutting down",
            WireError::Internal => "internal error",
        }
    }

    /// The limit this error enforces, as `stompgate_limit_refusals_total` labels it; None for
    /// an error that is not a limit (a broken rule, access, shutdown).
    pub fn limit(self) -> Option<&'static str> {
        Some(match self {
            WireError::FrameTooLarge(TooLarge::HeaderBlock(_)) => "header_block",
            WireError::FrameTooLarge(TooLarge::HeaderCount(_)) => "header_count",
            WireError::FrameTooLarge(TooLarge::Body(_)) => "max_body_size",
            WireError::FrameTooLarge(TooLarge::PartialFrames(_)) => "partial_frames_budget",
            WireError::FrameTooLarge(TooLarge::Tags { .. }) => "tags",
            WireError::TooManyPending(_) => "rpc_max_pending",
            WireError::TooManyTxFrames(_) => "max_tx_frames",
            WireError::TooManyTransactions(_) => "max_transactions",
            WireError::TooManySubscriptions(_) => "max_subscriptions",
            WireError::QueueFull(_) => "queue_depth",
            WireError::StoreFull(_) => "store_full",
            WireError::TooManyConnections(Some(_)) => "max_connections",
            WireError::TooManyConnections(None) => "open_files",
            _ => return None,
        })
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
            WireError::TooManyPending(max) => return Cow::Owned(format!("more RPC requests in flight on this connection than --rpc-max-pending ({max})")),
            WireError::TooManyTxFrames(max) => return Cow::Owned(format!("the transaction holds too many frames: --max-tx-frames ({max})")),
            WireError::TooManyTransactions(max) => return Cow::Owned(format!("too many open transactions: --max-transactions ({max})")),
            WireError::TooManySubscriptions(max) => return Cow::Owned(format!("too many subscriptions: --max-subscriptions ({max})")),
            WireError::QueueFull(Some((messages, bytes))) => {
                return Cow::Owned(format!("the queue is full: --queue-max-messages ({messages}) or --queue-max-bytes ({bytes} bytes)"))
            }
            WireError::QueueFull(None) => "the queue is full: the array refused it at its depth limit",
            WireError::StoreFull(0) => "the store is full: no space left on its disk",
            WireError::StoreFull(max) => return Cow::Owned(format!("the store is full: --store-max-bytes ({max} bytes) or no space left on its disk")),
            WireError::DuplicateSubscription => "this connection already has a subscription with this id",
            WireError::UnknownSubscription => "no subscription with this id on this connection",
            WireError::UnknownTransaction => "no open transaction with this name on this connection",
            WireError::AccessDenied => "the credentials or the access rules do not allow this",
            WireError::TooManyConnections(Some(max)) => return Cow::Owned(format!("the gateway is at --max-connections ({max})")),
            WireError::TooManyConnections(None) => "the gateway is out of file descriptors (its open-files limit); retry later",
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
        // Every variant but MalformedFrame's rules (tests/error_hints.rs table-tests those).
        let all = [
            WireError::InvalidDestination,
            WireError::CannotSendToReply,
            WireError::FrameTooLarge(TooLarge::HeaderBlock(65536)),
            WireError::FrameTooLarge(TooLarge::HeaderCount(1000)),
            WireError::FrameTooLarge(TooLarge::Body(usize::MAX)),
            WireError::FrameTooLarge(TooLarge::PartialFrames(usize::MAX)),
            WireError::FrameTooLarge(TooLarge::Tags { max_custom: 32, max_value: 4096 }),
            WireError::MalformedFrame(Malformed::UnknownCommand),
            WireError::MalformedFrame(Malformed::UndefinedEscape),
            WireError::UnsupportedVersion,
            WireError::NotConnected,
            WireError::CannotSubscribeRpc,
            WireError::MissingReplyTo,
            WireError::ReplyToNotSubscribed,
            WireError::TooManyPending(usize::MAX),
            WireError::TooManyTxFrames(usize::MAX),
            WireError::TooManyTransactions(usize::MAX),
            WireError::TooManySubscriptions(usize::MAX),
            WireError::QueueFull(Some((usize::MAX, usize::MAX))),
            WireError::QueueFull(None),
            WireError::StoreFull(0),
            WireError::StoreFull(u64::MAX),
            WireError::DuplicateSubscription,
            WireError::UnknownSubscription,
            WireError::UnknownTransaction,
            WireError::AccessDenied,
            WireError::TooManyConnections(Some(usize::MAX)),
            WireError::TooManyConnections(None),
            WireError::ShuttingDown,
            WireError::Internal,
        ];
        for e in all {
            let h = e.hint();
            assert!(!h.is_empty() && h.len() <= 240, "{e:?}: {h}");
            assert!(h.bytes().all(|b| (b' '..=b'~').contains(&b)), "{e:?}: {h}");
        }
        assert_eq!(WireError::FrameTooLarge(TooLarge::Body(65536)).hint(), "the body exceeds --max-body-size (65536 bytes)");
        // A limit's hint names the flag and its value.
        for (e, flag, value) in [
            (WireError::TooManyPending(7), "--rpc-max-pending", "(7)"),
            (WireError::TooManyTxFrames(8), "--max-tx-frames", "(8)"),
            (WireError::TooManyTransactions(9), "--max-transactions", "(9)"),
            (WireError::TooManySubscriptions(10), "--max-subscriptions", "(10)"),
            (WireError::QueueFull(Some((11, 12))), "--queue-max-messages (11)", "(12 bytes)"),
            (WireError::TooManyConnections(Some(13)), "--max-connections", "(13)"),
        ] {
            let h = e.hint();
            assert!(h.contains(flag) && h.contains(value), "{e:?}: {h}");
        }
    }
}
