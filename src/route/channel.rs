//! The one channel-name rule, shared by the STOMP router and the gRPC API's validation.
//!
//! Both front doors lead to the same channels, and in remote-array mode a STOMP destination
//! reaches the array *through* the gRPC API. So a name the router accepts must pass the gRPC
//! validation too, or it would work on the embedded array and fail (KubeMQ Error 108/119)
//! through a remote one. The rule is KubeMQ's (kubemq-patterns.md §1.1, the Python SDK's
//! check, which is the strictest client-side one): non-empty, no whitespace of any kind, no
//! trailing `.`, and `*` / `>` only where wildcards are allowed (Events subscriptions). It is
//! stated on `&str` because a gRPC channel is a protobuf string: a STOMP channel that is not
//! UTF-8 cannot be sent to a remote array at all, so the router refuses it first.

/// Why a channel name is refused (the gRPC API maps each to its KubeMQ error number).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChannelError {
    Empty,
    Whitespace,
    TrailingDot,
    /// `*` or `>` where wildcards are not allowed.
    Wildcard,
}

/// Checks `name` against the channel rule. `wildcards`: `*` / `>` may appear (where they may
/// appear as tokens is the caller's grammar; the router's is stricter than KubeMQ's).
pub fn check_channel(name: &str, wildcards: bool) -> Result<(), ChannelError> {
    if name.is_empty() {
        return Err(ChannelError::Empty);
    }
    if name.chars().any(char::is_whitespace) {
        return Err(ChannelError::Whitespace);
    }
    if name.ends_with('.') {
        return Err(ChannelError::TrailingDot);
    }
    if !wildcards && name.contains(['*', '>']) {
        return Err(ChannelError::Wildcard);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use ChannelError::*;

    #[test]
    fn rule_rows() {
        assert_eq!(check_channel("orders.eu", false), Ok(()));
        assert_eq!(check_channel(".leading.dot..and.empty.tokens", false), Ok(()));
        assert_eq!(check_channel("ünïcode:+#", false), Ok(()));
        assert_eq!(check_channel("", true), Err(Empty));
        for ws in ["a b", "a\tb", "a\nb", "a\rb", "a\u{a0}b", "a\u{2003}b", "a\u{3000}b", " "] {
            assert_eq!(check_channel(ws, true), Err(Whitespace), "{ws:?}");
        }
        assert_eq!(check_channel("a.", true), Err(TrailingDot));
        assert_eq!(check_channel(".", true), Err(TrailingDot));
        assert_eq!(check_channel("a.*", false), Err(Wildcard));
        assert_eq!(check_channel("a.>", false), Err(Wildcard));
        assert_eq!(check_channel("a*b", false), Err(Wildcard));
        assert_eq!(check_channel("a.*", true), Ok(()));
        assert_eq!(check_channel("a.>", true), Ok(()));
    }
}
