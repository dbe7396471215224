//! `x-kubemq-start` on an Events-Store SUBSCRIBE (stomp-decisions.md): `new-only` (default),
//! `first`, `last`, `sequence:N`, `time:RFC3339-or-unix-seconds`, `time-delta:SECONDS`.
use crate::mesh::msg::StartAt;

/// Parses the header value; `None` = malformed. `now_ns` anchors `time-delta`.
pub fn parse_start(value: &[u8], now_ns: i64) -> Option<StartAt> {
    let v = std::str::from_utf8(value).ok()?.trim();
    Some(match v {
        "" | "new-only" => StartAt::NewOnly,
        "first" => StartAt::First,
        "last" => StartAt::Last,
        _ => {
            if let Some(n) = v.strip_prefix("sequence:") {
                let n: u64 = n.trim().parse().ok()?;
                if n == 0 {
                    return None;
                }
                StartAt::Sequence(n)
            } else if let Some(t) = v.strip_prefix("time:") {
                StartAt::Time(parse_time(t.trim())?)
            } else if let Some(d) = v.strip_prefix("time-delta:") {
                let secs: i64 = d.trim().parse().ok()?;
                if secs <= 0 {
                    return None;
                }
                StartAt::Time(now_ns.saturating_sub(secs.saturating_mul(1_000_000_000)))
            } else {
                return None;
            }
        }
    })
}

/// Unix seconds, or an RFC 3339 timestamp, to Unix nanoseconds.
fn parse_time(t: &str) -> Option<i64> {
    if let Ok(secs) = t.parse::<i64>() {
        return if secs > 0 { secs.checked_mul(1_000_000_000) } else { None };
    }
    let ts: jiff::Timestamp = t.parse().ok()?;
    i64::try_from(ts.as_nanosecond()).ok().filter(|&n| n > 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_documented_form() {
        let now = 10_000_000_000_000;
        assert_eq!(parse_start(b"new-only", now), Some(StartAt::NewOnly));
        assert_eq!(parse_start(b"", now), Some(StartAt::NewOnly));
        assert_eq!(parse_start(b"first", now), Some(StartAt::First));
        assert_eq!(parse_start(b"last", now), Some(StartAt::Last));
        assert_eq!(parse_start(b"sequence:5", now), Some(StartAt::Sequence(5)));
        assert_eq!(parse_start(b"time:1700000000", now), Some(StartAt::Time(1_700_000_000_000_000_000)));
        assert_eq!(parse_start(b"time:2023-11-14T22:13:20Z", now), Some(StartAt::Time(1_700_000_000_000_000_000)));
        assert_eq!(parse_start(b"time:2023-11-14T23:13:20.5+01:00", now), Some(StartAt::Time(1_700_000_000_500_000_000)));
        assert_eq!(parse_start(b"time-delta:10", now), Some(StartAt::Time(now - 10_000_000_000)));
    }

    #[test]
    fn malformed_values_are_refused() {
        for bad in [&b"sequence:0"[..], b"sequence:x", b"time:yesterday", b"time:0", b"time-delta:0", b"time-delta:-5", b"latest", b"FIRST", b"\xff"] {
            assert_eq!(parse_start(bad, 0), None, "{:?}", String::from_utf8_lossy(bad));
        }
    }
}
