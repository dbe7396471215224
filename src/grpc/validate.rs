//! Request validation with KubeMQ's error numbers and texts (kubemq-grpc.md §7.1), so SDK users
//! see the messages they know. Channel rules follow kubemq-patterns.md §1.1 and live in
//! `route::channel`, shared with the STOMP router: non-empty, no whitespace, no trailing `.`,
//! and `*` / `>` only where wildcards are allowed (Events subscriptions). Deliberately not
//! enforced: KubeMQ's "message/request has neither metadata nor body" (110 / 115), since a
//! STOMP SEND with an empty body is valid and reaches the array through this API in
//! remote-array mode.
use crate::route::{check_channel, ChannelError};
use tonic::Status;

/// A KubeMQ validation failure: its number and text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Invalid {
    pub code: u16,
    pub text: &'static str,
}

impl Invalid {
    pub const fn new(code: u16, text: &'static str) -> Self {
        Invalid { code, text }
    }

    /// The in-band error string (`Error 101: …`).
    pub fn message(&self) -> String {
        format!("Error {}: {}", self.code, self.text)
    }

    /// As a gRPC status: INVALID_ARGUMENT, which SDKs report as a validation error.
    pub fn status(&self) -> Status {
        Status::invalid_argument(self.message())
    }
}

impl From<Invalid> for Status {
    fn from(e: Invalid) -> Status {
        e.status()
    }
}

pub const NO_CLIENT_ID: Invalid = Invalid::new(101, "invalid client id, value cannot be empty");
pub const NO_CHANNEL: Invalid = Invalid::new(102, "invalid channel name, value cannot be empty");
pub const WILDCARD: Invalid = Invalid::new(107, "invalid channel name, wildcards are not allowed");
pub const WHITESPACE: Invalid = Invalid::new(108, "invalid channel name, whitespace is not allowed");
pub const BAD_TIMEOUT: Invalid = Invalid::new(109, "invalid request timeout, value must be greater than 0");
pub const NO_START: Invalid = Invalid::new(111, "invalid events store subscription, start type is missing");
pub const BAD_START_SEQUENCE: Invalid = Invalid::new(112, "invalid events store start sequence, value must be greater than 0");
pub const BAD_START_TIME: Invalid = Invalid::new(113, "invalid events store start time, value must be greater than 0");
pub const BAD_START_DELTA: Invalid = Invalid::new(114, "invalid events store start time delta, value must be greater than 0");
pub const BAD_CACHE: Invalid = Invalid::new(116, "invalid cache ttl, value must be greater than 0 when a cache key is set");
pub const NO_REQUEST_ID: Invalid = Invalid::new(117, "invalid request id, value cannot be empty");
pub const START_ON_EVENTS: Invalid = Invalid::new(118, "invalid events subscription, start position is for events store only");
pub const TRAILING_DOT: Invalid = Invalid::new(119, "invalid channel name, cannot end with '.'");
pub const BAD_QUEUE: Invalid = Invalid::new(120, "invalid queue name");
pub const BAD_MAX_MESSAGES: Invalid = Invalid::new(122, "invalid max number of messages, value out of range");
pub const BAD_EXPIRATION: Invalid = Invalid::new(133, "invalid expiration seconds, value out of range");
pub const BAD_MAX_RECEIVE: Invalid = Invalid::new(134, "invalid max receive count, value out of range");
pub const BAD_DELAY: Invalid = Invalid::new(135, "invalid delay seconds, value out of range");
pub const BAD_WAIT: Invalid = Invalid::new(136, "invalid wait timeout, value out of range");
pub const BAD_REQUEST_TYPE: Invalid = Invalid::new(206, "invalid request type");
pub const BAD_SUBSCRIBE_TYPE: Invalid = Invalid::new(207, "invalid subscribe type");

/// Largest delay or expiration accepted, in seconds. The Python SDK allows 86,400; KubeMQ's own
/// default cap (43,200) would refuse what the SDK sends (kubemq-patterns.md §4.1).
pub const MAX_POLICY_SECONDS: i32 = 86_400;
/// Largest receive limit (KubeMQ's `MaxReceiveCount`).
pub const MAX_RECEIVE_COUNT: i32 = 1024;
/// Largest batch a pull may ask for (KubeMQ's `MaxNumberOfMessages`).
pub const MAX_PULL_MESSAGES: i32 = 1024;
/// Longest wait a pull may ask for, in seconds (KubeMQ's `MaxWaitTimeoutSeconds`).
pub const MAX_WAIT_SECONDS: i32 = 3600;

pub fn client_id(id: &str) -> Result<(), Invalid> {
    if id.is_empty() {
        Err(NO_CLIENT_ID)
    } else {
        Ok(())
    }
}

/// A channel for publishing, requests and store subscriptions (no wildcards).
pub fn channel(name: &str) -> Result<(), Invalid> {
    channel_with(name, false)
}

/// A channel that may hold `*` / `>` when `wildcards` is set (Events subscriptions). The rule
/// is the router's too (`route::check_channel`), so every channel a STOMP client can name passes.
pub fn channel_with(name: &str, wildcards: bool) -> Result<(), Invalid> {
    check_channel(name, wildcards).map_err(|e| match e {
        ChannelError::Empty => NO_CHANNEL,
        ChannelError::Whitespace => WHITESPACE,
        ChannelError::TrailingDot => TRAILING_DOT,
        ChannelError::Wildcard => WILDCARD,
    })
}

/// A queue name: the channel rules, reported as KubeMQ's single queue-name error.
pub fn queue(name: &str) -> Result<(), Invalid> {
    channel(name).map_err(|_| BAD_QUEUE)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn channel_rules() {
        assert_eq!(channel("orders.eu"), Ok(()));
        assert_eq!(channel(""), Err(NO_CHANNEL));
        assert_eq!(channel("a b"), Err(WHITESPACE));
        assert_eq!(channel("a\tb"), Err(WHITESPACE));
        assert_eq!(channel("a."), Err(TRAILING_DOT));
        assert_eq!(channel("a.*"), Err(WILDCARD));
        assert_eq!(channel("a.>"), Err(WILDCARD));
        assert_eq!(channel_with("a.*", true), Ok(()));
        assert_eq!(channel_with("a.>", true), Ok(()));
        assert_eq!(queue("q 1"), Err(BAD_QUEUE));
        assert_eq!(queue("q.*"), Err(BAD_QUEUE));
    }

    #[test]
    fn messages_carry_the_kubemq_number() {
        assert_eq!(NO_CLIENT_ID.message(), "Error 101: invalid client id, value cannot be empty");
        assert_eq!(NO_CLIENT_ID.status().code(), tonic::Code::InvalidArgument);
    }
}
