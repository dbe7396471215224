//! Property tests for the destination router and wildcard filters (seeds 000/001).
use bytes::{Bytes, BytesMut};
use proptest::prelude::*;
use stompgate::model::Pattern;
use stompgate::route::{parse_destination, write_egress_destination, DefaultPattern, DestinationError, Filter, Intent};

/// Every ingress prefix (primary and alias), plus `None` for a bare destination.
const PREFIXES: [Option<&str>; 12] = [
    Some("queue"),
    Some("queues"),
    Some("topic"),
    Some("events"),
    Some("topic-store"),
    Some("store"),
    Some("command"),
    Some("commands"),
    Some("query"),
    Some("queries"),
    Some("reply"),
    None,
];

fn default_pattern() -> impl Strategy<Value = DefaultPattern> {
    prop_oneof![Just(DefaultPattern::Events), Just(DefaultPattern::Queues), Just(DefaultPattern::Store), Just(DefaultPattern::None),]
}

fn intent() -> impl Strategy<Value = Intent> {
    prop_oneof![Just(Intent::Send), Just(Intent::Subscribe)]
}

/// A segment of arbitrary text except the separator, whitespace (the channel rule refuses it)
/// and, unless asked for, '.', '*' and '>' (a literal '.' is lossy by design; wildcards are not
/// valid on SEND).
fn segment(allow_dot: bool) -> impl Strategy<Value = Vec<u8>> {
    prop::collection::vec(any::<char>(), 1..16).prop_map(move |s| {
        s.into_iter()
            .map(|c| if c == '/' || c == '*' || c == '>' || c.is_whitespace() || (!allow_dot && c == '.') { '_' } else { c })
            .collect::<String>()
            .into_bytes()
    })
}

fn build(prefix: Option<&str>, segments: &[Vec<u8>], leading_slash: bool) -> Vec<u8> {
    let mut raw = Vec::new();
    if leading_slash {
        raw.push(b'/');
    }
    if let Some(p) = prefix {
        raw.extend_from_slice(p.as_bytes());
        raw.push(b'/');
    }
    raw.extend_from_slice(&segments.join(&b'/'));
    raw
}

/// SEND except for `/reply/`, which is SUBSCRIBE-only; RPC is SEND-only.
fn legal_intent(p: Pattern) -> Intent {
    if p == Pattern::Reply {
        Intent::Subscribe
    } else {
        Intent::Send
    }
}

fn egress(p: Pattern, channel: &[u8]) -> Vec<u8> {
    let mut out = BytesMut::new();
    write_egress_destination(p, channel, &mut out);
    out.to_vec()
}

/// Reference matcher, formulated differently from `Filter::matches`: by lengths and pairwise
/// comparison rather than a token walk.
fn reference_match(filter: &[&str], channel: &[&str]) -> bool {
    let tok = |f: &str, c: &str| f == "*" || f == c;
    match filter.split_last() {
        Some((&">", head)) => channel.len() > head.len() && head.iter().zip(channel).all(|(f, c)| tok(f, c)),
        _ => filter.len() == channel.len() && filter.iter().zip(channel).all(|(f, c)| tok(f, c)),
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2048, ..ProptestConfig::default() })]

    /// parse → channel → canonical egress → parse gives the same (pattern, channel).
    #[test]
    fn egress_round_trips(
        prefix in prop::sample::select(PREFIXES.to_vec()),
        segments in prop::collection::vec(segment(false), 1..8),
        leading_slash in any::<bool>(),
        default in prop_oneof![Just(DefaultPattern::Events), Just(DefaultPattern::Queues), Just(DefaultPattern::Store)],
    ) {
        // A bare first segment that happens to spell a prefix is a prefix: not a bare case.
        prop_assume!(prefix.is_some() || std::str::from_utf8(&segments[0]).map_or(true, |s| !PREFIXES.contains(&Some(s))));
        let raw = build(prefix, &segments, leading_slash);
        prop_assume!(raw.len() <= 512);
        // Intent depends on the pattern, which a bare first segment decides; find it first.
        let first = parse_destination(&raw, default, Intent::Subscribe)
            .or_else(|_| parse_destination(&raw, default, Intent::Send))
            .expect("valid segments parse");
        let intent = legal_intent(first.pattern);
        let d = parse_destination(&raw, default, intent).expect("legal intent");
        prop_assert!(!d.wildcard);
        // The channel is the segments after the prefix (all of them when bare), dot-joined.
        let joined = segments.join(&b'.');
        prop_assert_eq!(d.channel.as_bytes(), joined.as_slice());
        let out = egress(d.pattern, d.channel.as_bytes());
        let mut expected_head = b"/".to_vec();
        expected_head.extend_from_slice(d.pattern.primary_prefix().as_bytes());
        expected_head.push(b'/');
        prop_assert!(out.starts_with(&expected_head));
        // Canonicalizing an alias can lengthen the destination past the gate; otherwise the
        // trip is exact.
        if out.len() <= 512 {
            let again = parse_destination(&out, default, intent).expect("egress re-parses");
            prop_assert_eq!(again.pattern, d.pattern);
            prop_assert_eq!(again.channel, d.channel);
            prop_assert!(!again.wildcard);
        } else {
            prop_assert_eq!(parse_destination(&out, default, intent), Err(DestinationError::Invalid));
        }
    }

    /// With literal dots, the (pattern, channel) still round-trips unless a dot makes an empty
    /// token, which egress turns into an empty segment (the literal-dot trap, worst case).
    #[test]
    fn literal_dots_round_trip_unless_empty_token(
        segments in prop::collection::vec(segment(true), 1..6),
    ) {
        let raw = build(Some("topic"), &segments, true);
        prop_assume!(raw.len() <= 512);
        // A trailing '.' is refused by the channel rule (KubeMQ Error 119).
        prop_assume!(!raw.ends_with(b"."));
        let d = parse_destination(&raw, DefaultPattern::Events, Intent::Send).unwrap();
        let out = egress(d.pattern, d.channel.as_bytes());
        let has_empty_token = d.channel.as_bytes().split(|&b| b == b'.').any(|t| t.is_empty());
        match parse_destination(&out, DefaultPattern::Events, Intent::Send) {
            Ok(again) => {
                prop_assert!(!has_empty_token);
                prop_assert_eq!(again.pattern, Pattern::Events);
                prop_assert_eq!(again.channel, d.channel);
            }
            Err(e) => {
                prop_assert!(has_empty_token);
                prop_assert_eq!(e, DestinationError::Invalid);
            }
        }
    }

    /// Arbitrary bytes never panic, and every success obeys the grammar's invariants.
    #[test]
    fn arbitrary_bytes_never_panic(
        raw in prop::collection::vec(any::<u8>(), 0..600),
        default in default_pattern(),
        intent in intent(),
    ) {
        check_invariants(&raw, default, intent)?;
    }

    /// Same, over an alphabet dense in separators, prefixes and wildcard characters, so the
    /// interesting branches are actually reached.
    #[test]
    fn structured_strings_never_panic(
        raw in "(/|//|queue|topic|topic-store|store|reply|command|query|x|\\.|\\*|>|a\\*|Queue){0,12}",
        default in default_pattern(),
        intent in intent(),
    ) {
        check_invariants(raw.as_bytes(), default, intent)?;
    }

    /// `Filter::matches` agrees with the reference on random token lists.
    #[test]
    fn filter_matches_reference(
        ftoks in prop::collection::vec(prop::sample::select(vec!["a", "b", "c", "*"]), 0..5),
        tail in any::<bool>(),
        ctoks in prop::collection::vec(prop::sample::select(vec!["a", "b", "c"]), 1..7),
    ) {
        let mut ftoks = ftoks;
        if tail || ftoks.is_empty() {
            ftoks.push(">");
        }
        let filter = Filter::new(Bytes::from(ftoks.join(".")));
        let channel = ctoks.join(".");
        prop_assert_eq!(filter.matches(channel.as_bytes()), reference_match(&ftoks, &ctoks), "{:?} vs {:?}", ftoks, ctoks);
        prop_assert_eq!(filter.is_literal(), !ftoks.iter().any(|t| *t == "*" || *t == ">"));
    }

    /// Filters as the router builds them from SUBSCRIBE destinations agree with the reference.
    #[test]
    fn router_filters_match_reference(
        ftoks in prop::collection::vec(prop::sample::select(vec!["a", "b", "*"]), 1..5),
        tail in any::<bool>(),
        ctoks in prop::collection::vec(prop::sample::select(vec!["a", "b"]), 1..6),
    ) {
        let mut ftoks = ftoks;
        if tail {
            ftoks.push(">");
        }
        let raw = format!("/topic/{}", ftoks.join("/"));
        let d = parse_destination(raw.as_bytes(), DefaultPattern::Events, Intent::Subscribe).unwrap();
        prop_assert_eq!(d.pattern, Pattern::Events);
        let wildcard = ftoks.iter().any(|t| *t == "*" || *t == ">");
        prop_assert_eq!(d.wildcard, wildcard);
        let filter = Filter::new(d.channel.0.clone());
        prop_assert_eq!(filter.is_literal(), !wildcard);
        let channel = ctoks.join(".");
        prop_assert_eq!(filter.matches(channel.as_bytes()), reference_match(&ftoks, &ctoks));
        // Egress of a concrete matched channel is the slash form of that channel.
        prop_assert_eq!(egress(Pattern::Events, channel.as_bytes()), format!("/topic/{}", ctoks.join("/")).into_bytes());
    }
}

fn check_invariants(raw: &[u8], default: DefaultPattern, intent: Intent) -> Result<(), TestCaseError> {
    match parse_destination(raw, default, intent) {
        Ok(d) => {
            prop_assert!(raw.len() <= 512);
            let ch = d.channel.as_bytes();
            prop_assert!(!ch.is_empty());
            prop_assert!(!ch.contains(&b'/'));
            prop_assert!(ch.len() < raw.len() || (ch.len() == raw.len() && raw.first() != Some(&b'/')));
            let has_wild = ch.iter().any(|&b| b == b'*' || b == b'>');
            prop_assert_eq!(d.wildcard, has_wild);
            if d.wildcard {
                prop_assert_eq!(intent, Intent::Subscribe);
                prop_assert_eq!(d.pattern, Pattern::Events);
            }
            match intent {
                Intent::Send => prop_assert!(d.pattern != Pattern::Reply),
                Intent::Subscribe => prop_assert!(!matches!(d.pattern, Pattern::Commands | Pattern::Queries)),
            }
            // Egress then re-parse is stable whenever it stays under the gate and no dot made
            // an empty token.
            let out = egress(d.pattern, ch);
            if out.len() <= 512 && !ch.split(|&b| b == b'.').any(|t| t.is_empty()) {
                let again = parse_destination(&out, default, intent).unwrap();
                prop_assert_eq!(again, d);
            }
        }
        Err(DestinationError::SendToReply) => prop_assert_eq!(intent, Intent::Send),
        Err(DestinationError::SubscribeToRpc) => prop_assert_eq!(intent, Intent::Subscribe),
        Err(DestinationError::Invalid) => {}
    }
    Ok(())
}
