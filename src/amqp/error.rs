//! The closed set of AMQP error conditions the connector may send (connector-extra.md §3.3).
//!
//! KubeMQ's AMQP connector uses exactly these thirteen symbols and no numeric codes; peers
//! branch on the symbol. Like the STOMP `WireError`, each carries a fixed description written
//! here, so no internal detail (addresses, broker errors, stack text) can leak into a DETACH,
//! END, CLOSE or rejected disposition. §3.3 caps descriptions at 512 characters; ours are far
//! shorter, and a test holds them to it.
//!
//! Where each travels (§3.3): the plain `amqp:*` symbols and `amqp:link:*` on DETACH or a
//! rejected disposition, `amqp:session:*` on END, `amqp:connection:*` on CLOSE.

/// One AMQP error condition of the closed set.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AmqpError {
    /// A broker fault.
    InternalError,
    /// A bad address or channel.
    NotFound,
    /// An authorization denial.
    UnauthorizedAccess,
    DecodeError,
    /// A cap was reached (RpcMaxPending, idle time-out, stalled events-store credit).
    ResourceLimitExceeded,
    /// Duplicate link or durable identity, a receiver on `responses/`, broker not ready.
    NotAllowed,
    /// A bad `x-opt-kubemq-start`, bad selector, `copy` distribution on a queue.
    InvalidField,
    NotImplemented,
    /// An anonymous sender's message without a `to`, or with a bad one.
    PreconditionFailed,
    MessageSizeExceeded,
    WindowViolation,
    ErrantLink,
    /// Shutdown, or the broker went away.
    ConnectionForced,
}

impl AmqpError {
    /// Every condition, in §3.3's order.
    pub const ALL: [AmqpError; 13] = [
        AmqpError::InternalError,
        AmqpError::NotFound,
        AmqpError::UnauthorizedAccess,
        AmqpError::DecodeError,
        AmqpError::ResourceLimitExceeded,
        AmqpError::NotAllowed,
        AmqpError::InvalidField,
        AmqpError::NotImplemented,
        AmqpError::PreconditionFailed,
        AmqpError::MessageSizeExceeded,
        AmqpError::WindowViolation,
        AmqpError::ErrantLink,
        AmqpError::ConnectionForced,
    ];

    /// The condition symbol as it goes on the wire.
    pub fn symbol(self) -> &'static str {
        match self {
            AmqpError::InternalError => "amqp:internal-error",
            AmqpError::NotFound => "amqp:not-found",
            AmqpError::UnauthorizedAccess => "amqp:unauthorized-access",
            AmqpError::DecodeError => "amqp:decode-error",
            AmqpError::ResourceLimitExceeded => "amqp:resource-limit-exceeded",
            AmqpError::NotAllowed => "amqp:not-allowed",
            AmqpError::InvalidField => "amqp:invalid-field",
            AmqpError::NotImplemented => "amqp:not-implemented",
            AmqpError::PreconditionFailed => "amqp:precondition-failed",
            AmqpError::MessageSizeExceeded => "amqp:link:message-size-exceeded",
            AmqpError::WindowViolation => "amqp:session:window-violation",
            AmqpError::ErrantLink => "amqp:session:errant-link",
            AmqpError::ConnectionForced => "amqp:connection:forced",
        }
    }

    /// A short, fixed description for when nothing more specific applies. Never carries input.
    pub fn description(self) -> &'static str {
        match self {
            AmqpError::InternalError => "internal error",
            AmqpError::NotFound => "address not found",
            AmqpError::UnauthorizedAccess => "not authorized",
            AmqpError::DecodeError => "malformed data",
            AmqpError::ResourceLimitExceeded => "resource limit exceeded",
            AmqpError::NotAllowed => "not allowed",
            AmqpError::InvalidField => "invalid field",
            AmqpError::NotImplemented => "not implemented",
            AmqpError::PreconditionFailed => "precondition failed",
            AmqpError::MessageSizeExceeded => "message size exceeded",
            AmqpError::WindowViolation => "session window violation",
            AmqpError::ErrantLink => "errant link",
            AmqpError::ConnectionForced => "connection closed by the server",
        }
    }

    /// The condition a symbol names, if it is one of the closed set.
    pub fn from_symbol(symbol: &str) -> Option<AmqpError> {
        AmqpError::ALL.into_iter().find(|e| e.symbol() == symbol)
    }
}

impl std::fmt::Display for AmqpError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.symbol())
    }
}

/// §3.3's cap on a description's length, in characters.
pub const MAX_DESCRIPTION_LEN: usize = 512;

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    /// §3.3 lists exactly these thirteen symbols; the enum has no others.
    #[test]
    fn the_closed_set_is_exactly_the_thirteen_symbols_of_3_3() {
        let expected = [
            "amqp:internal-error",
            "amqp:not-found",
            "amqp:unauthorized-access",
            "amqp:decode-error",
            "amqp:resource-limit-exceeded",
            "amqp:not-allowed",
            "amqp:invalid-field",
            "amqp:not-implemented",
            "amqp:precondition-failed",
            "amqp:link:message-size-exceeded",
            "amqp:session:window-violation",
            "amqp:session:errant-link",
            "amqp:connection:forced",
        ];
        let symbols: Vec<&str> = AmqpError::ALL.iter().map(|e| e.symbol()).collect();
        assert_eq!(symbols, expected);
        assert_eq!(symbols.iter().collect::<HashSet<_>>().len(), 13, "symbols are distinct");
    }

    #[test]
    fn from_symbol_inverts_symbol_and_refuses_anything_else() {
        for e in AmqpError::ALL {
            assert_eq!(AmqpError::from_symbol(e.symbol()), Some(e));
            assert_eq!(e.to_string(), e.symbol());
        }
        for other in ["amqp:unauthorized", "amqp:not-found ", "AMQP:NOT-FOUND", "amqp:link:detach-forced", "amqp:connection:redirect", ""] {
            assert_eq!(AmqpError::from_symbol(other), None, "{other:?}");
        }
    }

    #[test]
    fn descriptions_are_short_fixed_text() {
        for e in AmqpError::ALL {
            let d = e.description();
            assert!(!d.is_empty() && d.chars().count() <= MAX_DESCRIPTION_LEN, "{e:?}");
            assert!(d.chars().all(|c| c.is_ascii_graphic() || c == ' '), "{e:?}: printable ASCII only");
        }
    }
}
