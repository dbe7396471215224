//! CONNECT-time arithmetic: version negotiation and heart-beat negotiation.
use super::frame::Version;

/// Highest common version from `accept-version` (comma separated, order-independent,
/// whitespace-tolerant). Missing or empty → 1.0. `None` = no common version.
///
/// Versions we do not speak (e.g. `2.0`) are ignored, so `1.1,2.0` → 1.1 and `2.0` → `None`.
/// A value with no non-blank entry at all (`""`, `"  "`, `","`) counts as missing: the client
/// named no version, which the spec reads as 1.0.
pub fn negotiate_version(accept_version: Option<&[u8]>) -> Option<Version> {
    let Some(list) = accept_version else {
        return Some(Version::V1_0);
    };
    let mut named_any = false;
    let mut best = None;
    for entry in list.split(|&b| b == b',') {
        let entry = entry.trim_ascii();
        if entry.is_empty() {
            continue;
        }
        named_any = true;
        let v = match entry {
            b"1.0" => Version::V1_0,
            b"1.1" => Version::V1_1,
            b"1.2" => Version::V1_2,
            _ => continue,
        };
        best = best.max(Some(v));
    }
    if named_any {
        best
    } else {
        Some(Version::V1_0)
    }
}

/// Parses a `heart-beat: cx,cy` header (ms). Missing → (0, 0). Malformed → Err.
///
/// Each number is ASCII digits with optional surrounding whitespace; anything else (a sign,
/// a third field, an empty field, a value over `u64::MAX`) is malformed. An empty or blank
/// value is treated as missing.
#[allow(clippy::result_unit_err)] // the contract: callers map any failure to `malformed frame`
pub fn parse_heart_beat(value: Option<&[u8]>) -> Result<(u64, u64), ()> {
    let Some(value) = value else {
        return Ok((0, 0));
    };
    if value.trim_ascii().is_empty() {
        return Ok((0, 0));
    }
    let mut fields = value.split(|&b| b == b',');
    let (Some(x), Some(y), None) = (fields.next(), fields.next(), fields.next()) else {
        return Err(());
    };
    Ok((parse_ms(x)?, parse_ms(y)?))
}

fn parse_ms(field: &[u8]) -> Result<u64, ()> {
    super::frame::decimal(field.trim_ascii()).ok_or(())
}

/// Negotiated intervals in ms, given the client's `(cx, cy)` and the server's `(sx, sy)`:
/// `(server_sends_every, client_must_send_every)`; 0 = off. Per the spec, the server sends
/// every max(sx, cy) when both are non-zero; the client sends every max(cx, sy).
pub fn negotiate_heart_beat(client: (u64, u64), server: (u64, u64)) -> (u64, u64) {
    let (cx, cy) = client;
    let (sx, sy) = server;
    // 0 on either side means that direction is off: one side cannot send or the other does
    // not want to receive.
    let every = |can: u64, wants: u64| {
        if can == 0 || wants == 0 {
            0
        } else {
            can.max(wants)
        }
    };
    (every(sx, cy), every(cx, sy))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_missing_or_blank_is_1_0() {
        assert_eq!(negotiate_version(None), Some(Version::V1_0));
        assert_eq!(negotiate_version(Some(b"")), Some(Version::V1_0));
        assert_eq!(negotiate_version(Some(b"   ")), Some(Version::V1_0));
        assert_eq!(negotiate_version(Some(b" , ")), Some(Version::V1_0));
    }

    #[test]
    fn version_picks_highest_common() {
        assert_eq!(negotiate_version(Some(b"1.0,1.1,1.2")), Some(Version::V1_2));
        assert_eq!(negotiate_version(Some(b"1.2,1.0")), Some(Version::V1_2));
        assert_eq!(negotiate_version(Some(b" 1.0 , 1.1 ")), Some(Version::V1_1));
        assert_eq!(negotiate_version(Some(b"1.0")), Some(Version::V1_0));
        assert_eq!(negotiate_version(Some(b"1.0,1.1,2.0")), Some(Version::V1_1));
        assert_eq!(negotiate_version(Some(b"1.1,2.0")), Some(Version::V1_1));
    }

    #[test]
    fn version_none_in_common() {
        assert_eq!(negotiate_version(Some(b"2.0")), None);
        assert_eq!(negotiate_version(Some(b"2.0,3.1")), None);
        assert_eq!(negotiate_version(Some(b"1.3")), None);
        assert_eq!(negotiate_version(Some(b"1.2.0")), None);
    }

    #[test]
    fn heart_beat_parses() {
        assert_eq!(parse_heart_beat(None), Ok((0, 0)));
        assert_eq!(parse_heart_beat(Some(b"")), Ok((0, 0)));
        assert_eq!(parse_heart_beat(Some(b"0,0")), Ok((0, 0)));
        assert_eq!(parse_heart_beat(Some(b"1000,2500")), Ok((1000, 2500)));
        assert_eq!(parse_heart_beat(Some(b" 10 , 20 ")), Ok((10, 20)));
        assert_eq!(parse_heart_beat(Some(b"18446744073709551615,0")), Ok((u64::MAX, 0)));
    }

    #[test]
    fn heart_beat_malformed() {
        for bad in [&b"10"[..], b"10,", b",10", b"1,2,3", b"-1,5", b"+1,5", b"a,b", b"1 0,5", b"18446744073709551616,0", b"1.5,2"] {
            assert_eq!(parse_heart_beat(Some(bad)), Err(()), "{:?}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn heart_beat_negotiation() {
        // (server_sends_every, client_must_send_every)
        assert_eq!(negotiate_heart_beat((0, 0), (10_000, 10_000)), (0, 0));
        assert_eq!(negotiate_heart_beat((4000, 6000), (10_000, 10_000)), (10_000, 10_000));
        assert_eq!(negotiate_heart_beat((20_000, 30_000), (10_000, 10_000)), (30_000, 20_000));
        assert_eq!(negotiate_heart_beat((5000, 0), (10_000, 1000)), (0, 5000));
        assert_eq!(negotiate_heart_beat((0, 7000), (1000, 1000)), (7000, 0));
        assert_eq!(negotiate_heart_beat((5000, 7000), (0, 0)), (0, 0));
    }
}
