//! The closed vocabulary of ERROR `message` texts (stomp-decisions.md, "Error vocabulary").
//! Only a `WireError` can become an ERROR frame, so internal error text never reaches the wire.

/// A sanitized error that may be sent to a STOMP client.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WireError {
    InvalidDestination,
    /// Seed 001 files "cannot SEND to reply destinations" under `invalid destination`:
    /// the `message` header says `invalid destination`, the body carries the hint.
    CannotSendToReply,
    FrameTooLarge,
    MalformedFrame,
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
    DuplicateSubscription,
    UnknownSubscription,
    UnknownTransaction,
    AccessDenied,
    TooManyConnections,
    ShuttingDown,
    Internal,
}

impl WireError {
    /// The `message` header value.
    pub fn message(self) -> &'static str {
        match self {
            WireError::InvalidDestination | WireError::CannotSendToReply => "invalid destination",
            WireError::FrameTooLarge => "frame too large",
            WireError::MalformedFrame => "malformed frame",
            WireError::UnsupportedVersion => "unsupported protocol version",
            WireError::NotConnected => "not connected",
            WireError::CannotSubscribeRpc => "cannot subscribe to RPC destinations",
            WireError::MissingReplyTo => "missing reply-to",
            WireError::ReplyToNotSubscribed => "reply-to not subscribed",
            WireError::TooManyPending
            | WireError::TooManyTxFrames
            | WireError::TooManyTransactions
            | WireError::TooManySubscriptions
            | WireError::QueueFull => "too many pending requests",
            WireError::DuplicateSubscription => "duplicate subscription id",
            WireError::UnknownSubscription => "unknown subscription",
            WireError::UnknownTransaction => "unknown transaction",
            WireError::AccessDenied => "access denied",
            WireError::TooManyConnections => "too many connections",
            WireError::ShuttingDown => "server shutting down",
            WireError::Internal => "internal error",
        }
    }

    /// A short sanitized hint for the ERROR body (may be empty).
    pub fn hint(self) -> &'static str {
        match self {
            WireError::CannotSendToReply => "cannot SEND to reply destinations",
            WireError::UnsupportedVersion => "supported versions are 1.0,1.1,1.2",
            WireError::TooManyTxFrames => "the transaction holds too many frames",
            WireError::TooManyTransactions => "too many open transactions",
            WireError::TooManySubscriptions => "too many subscriptions",
            WireError::QueueFull => "the queue is full",
            _ => "",
        }
    }
}

impl std::fmt::Display for WireError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.message())
    }
}
