//! Properties of `x-kubemq-start` (stomp-decisions.md): every documented form parses to the
//! position it names, over its whole range, with surrounding whitespace; values out of range
//! (sequence 0, times ≤ 0 or past i64 nanoseconds, deltas ≤ 0) are refused; arbitrary bytes
//! never panic and never give a position the forms cannot name.
use proptest::prelude::*;
use stompgate::mesh::msg::StartAt;
use stompgate::session::start::parse_start;

const NS: i64 = 1_000_000_000;
/// Largest Unix-seconds value whose nanoseconds fit in i64.
const MAX_SECS: i64 = i64::MAX / NS;

fn pad() -> impl Strategy<Value = &'static str> {
    prop::sample::select(vec!["", " ", "\t", "  "])
}

fn now() -> impl Strategy<Value = i64> {
    prop_oneof![Just(0i64), Just(i64::MAX), 1_600_000_000 * NS..1_900_000_000 * NS]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1024))]

    #[test]
    fn sequences_are_exact_from_one_to_u64_max(n in prop_oneof![Just(1u64), Just(u64::MAX), any::<u64>()], a in pad(), b in pad(), now in now()) {
        let v = format!("{a}sequence:{b}{n}{a}");
        let want = if n == 0 { None } else { Some(StartAt::Sequence(n)) };
        prop_assert_eq!(parse_start(v.as_bytes(), now), want);
    }

    #[test]
    fn sequences_past_u64_are_refused(extra in 1u128..=u128::from(u64::MAX)) {
        let n = u128::from(u64::MAX) + extra;
        prop_assert_eq!(parse_start(format!("sequence:{n}").as_bytes(), 0), None);
    }

    /// Unix seconds: exact nanoseconds while they fit in i64, refused at ≤ 0 or past it.
    #[test]
    fn unix_seconds_are_exact_or_refused(s in prop_oneof![Just(1i64), Just(MAX_SECS), Just(MAX_SECS + 1), Just(0), Just(-1), any::<i64>()], a in pad(), now in now()) {
        let got = parse_start(format!("time:{a}{s}{a}").as_bytes(), now);
        let want = if (1..=MAX_SECS).contains(&s) { Some(StartAt::Time(s * NS)) } else { None };
        prop_assert_eq!(got, want);
    }

    /// RFC 3339 timestamps (UTC or with an offset, with or without fractions) give the instant
    /// they name, in nanoseconds.
    #[test]
    fn rfc3339_times_are_the_instant_named(
        secs in 1i64..253_402_300_799, // up to 9999-12-31T23:59:59Z
        nanos in prop_oneof![Just(0i32), 0..1_000_000_000i32],
        offset_minutes in prop_oneof![Just(0i32), -14 * 60..=14 * 60],
    ) {
        let ts = jiff::Timestamp::new(secs, nanos).unwrap();
        let offset = jiff::tz::Offset::from_seconds(offset_minutes * 60).unwrap();
        let text = ts.display_with_offset(offset).to_string();
        let want = i64::try_from(ts.as_nanosecond()).ok().filter(|&n| n > 0).map(StartAt::Time);
        prop_assert_eq!(parse_start(format!("time:{text}").as_bytes(), 0), want, "{}", text);
    }

    /// `time-delta:D` starts D seconds before now (saturating), for every D > 0; D ≤ 0 and
    /// non-numbers are refused.
    #[test]
    fn time_deltas_count_back_from_now(d in prop_oneof![Just(1i64), Just(i64::MAX), Just(0), Just(-1), any::<i64>()], now in now(), a in pad()) {
        let got = parse_start(format!("time-delta:{a}{d}").as_bytes(), now);
        if d > 0 {
            let want = now.saturating_sub(d.saturating_mul(NS));
            prop_assert_eq!(got, Some(StartAt::Time(want)));
            prop_assert!(want < now);
        } else {
            prop_assert_eq!(got, None);
        }
    }

    /// The keywords are exact and lower case; blank means new-only.
    #[test]
    fn keywords_are_exact(word in "(new-only|first|last|NEW-ONLY|First|LAST|firsts|las|new_only|)", a in pad()) {
        let want = match word.as_str() {
            "" | "new-only" => Some(StartAt::NewOnly),
            "first" => Some(StartAt::First),
            "last" => Some(StartAt::Last),
            _ => None,
        };
        prop_assert_eq!(parse_start(format!("{a}{word}{a}").as_bytes(), 0), want);
    }

    /// Arbitrary bytes never panic; what parses is one of the forms' positions, and a
    /// sequence is never 0.
    #[test]
    fn arbitrary_values_never_panic(
        v in prop_oneof![
            prop::collection::vec(any::<u8>(), 0..40),
            "(sequence:|time:|time-delta:|first|last|new-only| |-|\\+|0|9|1|T|Z|:|\\.){0,10}".prop_map(String::into_bytes),
        ],
        now in now(),
    ) {
        match parse_start(&v, now) {
            None | Some(StartAt::NewOnly | StartAt::First | StartAt::Last) => {}
            Some(StartAt::Sequence(n)) => prop_assert!(n >= 1),
            Some(StartAt::Time(t)) => {
                let s = String::from_utf8_lossy(&v);
                prop_assert!(t > 0 || s.trim().starts_with("time-delta:"), "{:?} → {}", s, t);
            }
        }
    }
}
