//! Properties of CONNECT-time arithmetic (`stomp::negotiate`): a `heart-beat` header of two
//! decimal u64 values (whitespace allowed around each) parses to exactly those values, over
//! the whole u64 range; anything past u64::MAX or not two plain numbers is malformed; arbitrary
//! bytes never panic; negotiation follows the spec's max/0 rule without overflow; and version
//! negotiation picks the highest common version whatever the order and the noise.
use proptest::prelude::*;
use stompgate::stomp::negotiate::{negotiate_heart_beat, negotiate_version, parse_heart_beat};
use stompgate::stomp::Version;

fn ms() -> impl Strategy<Value = u64> {
    prop_oneof![Just(0u64), Just(1), Just(u64::MAX), Just(u64::MAX - 1), 0..100_000u64, any::<u64>()]
}

fn pad() -> impl Strategy<Value = &'static str> {
    prop::sample::select(vec!["", " ", "\t", "  ", " \t"])
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1024))]

    #[test]
    fn two_numbers_parse_exactly(x in ms(), y in ms(), a in pad(), b in pad(), c in pad(), d in pad(), zeros in 0usize..3) {
        let lead = "0".repeat(zeros);
        let v = format!("{a}{lead}{x}{b},{c}{y}{d}");
        prop_assert_eq!(parse_heart_beat(Some(v.as_bytes())), Ok((x, y)), "{:?}", v);
    }

    /// One past u64::MAX, or any larger number, in either field is malformed (not wrapped, not
    /// saturated).
    #[test]
    fn past_u64_is_malformed(big in (u128::from(u64::MAX) + 1)..=u128::MAX, other in ms(), first in any::<bool>()) {
        let v = if first { format!("{big},{other}") } else { format!("{other},{big}") };
        prop_assert_eq!(parse_heart_beat(Some(v.as_bytes())), Err(()));
    }

    /// Signs, fractions, a missing or third field, inner spaces: malformed.
    #[test]
    fn non_numbers_are_malformed(
        x in ms(),
        shape in prop::sample::select(vec!["{x}", "{x},", ",{x}", "{x},{x},{x}", "-{x},0", "+{x},0", "{x}.5,0", "0,{x} 1", "0x{x},0", "{x};{x}", "{x},a"]),
    ) {
        let v = shape.replace("{x}", &x.to_string());
        prop_assert_eq!(parse_heart_beat(Some(v.as_bytes())), Err(()), "{:?}", v);
    }

    /// Arbitrary bytes never panic, and whatever parses re-parses identically from its
    /// canonical form.
    #[test]
    fn arbitrary_bytes_never_panic(v in prop_oneof![
        prop::collection::vec(any::<u8>(), 0..48),
        "[0-9, \t+\\-]{0,48}".prop_map(String::into_bytes),
    ]) {
        if let Ok((x, y)) = parse_heart_beat(Some(&v)) {
            prop_assert_eq!(parse_heart_beat(Some(format!("{x},{y}").as_bytes())), Ok((x, y)));
        }
    }

    /// Each direction is off when either side says 0, else the larger of the two; the result
    /// never overflows and never undercuts what either side asked for.
    #[test]
    fn negotiation_is_max_or_off(cx in ms(), cy in ms(), sx in ms(), sy in ms()) {
        let (server_every, client_every) = negotiate_heart_beat((cx, cy), (sx, sy));
        let rule = |can: u64, wants: u64| if can == 0 || wants == 0 { 0 } else { can.max(wants) };
        prop_assert_eq!(server_every, rule(sx, cy));
        prop_assert_eq!(client_every, rule(cx, sy));
        if server_every != 0 {
            prop_assert!(server_every >= sx && server_every >= cy);
        }
        // Parsing the client's header and negotiating compose (u64::MAX included).
        let header = format!("{cx},{cy}");
        let parsed = parse_heart_beat(Some(header.as_bytes())).unwrap();
        prop_assert_eq!(negotiate_heart_beat(parsed, (sx, sy)), (server_every, client_every));
    }

    /// The highest version we speak among those named wins, in any order, with spaces, empty
    /// entries and versions we do not speak mixed in.
    #[test]
    fn version_is_the_highest_common(
        named in prop::collection::vec(prop::sample::select(vec!["1.0", "1.1", "1.2", "2.0", "1.3", "x", "", " ", "1.2.0"]), 0..6),
        a in pad(),
    ) {
        let list = named.iter().map(|v| format!("{a}{v}{a}")).collect::<Vec<_>>().join(",");
        let ours: Vec<Version> = named.iter().filter_map(|v| match *v {
            "1.0" => Some(Version::V1_0),
            "1.1" => Some(Version::V1_1),
            "1.2" => Some(Version::V1_2),
            _ => None,
        }).collect();
        let any_named = named.iter().any(|v| !v.trim().is_empty());
        let want = if any_named { ours.into_iter().max() } else { Some(Version::V1_0) };
        prop_assert_eq!(negotiate_version(Some(list.as_bytes())), want, "{:?}", list);
    }
}
