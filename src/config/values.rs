//! Parsing one raw value, with errors that name the setting and its source.
use super::sources::{Raw, Source};
use crate::route::DefaultPattern;
use std::fmt::Display;
use std::net::SocketAddr;

pub(super) fn invalid(source: Source<'_>, reason: impl Display) -> String {
    format!("invalid {source}: {reason}")
}

/// A non-negative whole number from text or a TOML integer, with `min` as its lower bound.
pub(super) fn parse_uint<T>(raw: &Raw<'_>, source: Source<'_>, min: u64) -> Result<T, String>
where
    T: TryFrom<u64>,
{
    let n: u64 = match raw {
        Raw::Text(s) => s.trim().parse::<u64>().map_err(|_| invalid(source, format!("{s:?} is not a non-negative whole number")))?,
        Raw::Toml(toml::Value::Integer(i)) => u64::try_from(*i).map_err(|_| invalid(source, format!("{i} is negative")))?,
        Raw::Toml(other) => return Err(invalid(source, format!("expected an integer, found a {}", other.type_str()))),
    };
    if n < min {
        return Err(invalid(source, format!("must be at least {min}")));
    }
    T::try_from(n).map_err(|_| invalid(source, format!("{n} is too large")))
}

pub(super) fn text<'r>(raw: &'r Raw<'_>, source: Source<'_>) -> Result<&'r str, String> {
    match raw {
        Raw::Text(s) => Ok(s),
        Raw::Toml(toml::Value::String(s)) => Ok(s),
        Raw::Toml(other) => Err(invalid(source, format!("expected a string, found a {}", other.type_str()))),
    }
}

pub(super) fn parse_port(s: &str, source: Source<'_>) -> Result<u16, String> {
    match s.trim().parse::<u16>() {
        Ok(0) | Err(_) => Err(invalid(source, format!("{s:?} is not a port (1-65535)"))),
        Ok(p) => Ok(p),
    }
}

pub(super) fn parse_addr(s: &str, source: Source<'_>) -> Result<SocketAddr, String> {
    let addr: SocketAddr = s.trim().parse().map_err(|_| invalid(source, format!("{s:?} is not IP:PORT (e.g. 0.0.0.0:61613 or [::]:61613)")))?;
    if addr.port() == 0 {
        return Err(invalid(source, "port must be 1-65535"));
    }
    Ok(addr)
}

/// `events` | `queues` | `store` | `none` (exact, lower case). Kept here because
/// `DefaultPattern` lives in the router, which has no business knowing about configuration.
/// `true`/`false` (also 1/0, yes/no, as an env var may say), or a TOML boolean.
pub(super) fn parse_bool(raw: &Raw<'_>, source: Source<'_>) -> Result<bool, String> {
    match raw {
        Raw::Toml(toml::Value::Boolean(b)) => Ok(*b),
        Raw::Text(s) => match s.trim().to_ascii_lowercase().as_str() {
            "true" | "1" | "yes" => Ok(true),
            "false" | "0" | "no" => Ok(false),
            other => Err(invalid(source, format!("{other:?} is not true or false"))),
        },
        Raw::Toml(other) => Err(invalid(source, format!("expected a boolean, found a {}", other.type_str()))),
    }
}

pub fn parse_default_pattern(s: &str) -> Option<DefaultPattern> {
    match s.trim() {
        "events" => Some(DefaultPattern::Events),
        "queues" => Some(DefaultPattern::Queues),
        "store" => Some(DefaultPattern::Store),
        "none" => Some(DefaultPattern::None),
        _ => None,
    }
}
