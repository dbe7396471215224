//! The channel rule, as a property: every channel the STOMP router accepts is accepted by the
//! gRPC API's validation (and so by a remote array), for every pattern, intent and default;
//! and for grammatical destinations the router refuses exactly what the validation refuses,
//! because both use one rule (`route::check_channel`). Before the shared rule, `/queue/a b`
//! worked on the embedded array and failed through a remote one (KubeMQ Error 108).
use proptest::prelude::*;
use stompgate::grpc::validate;
use stompgate::model::Pattern;
use stompgate::route::{parse_destination, DefaultPattern, DestinationError, Intent};

fn default_pattern() -> impl Strategy<Value = DefaultPattern> {
    prop_oneof![Just(DefaultPattern::Events), Just(DefaultPattern::Queues), Just(DefaultPattern::Store), Just(DefaultPattern::None),]
}

fn intent() -> impl Strategy<Value = Intent> {
    prop_oneof![Just(Intent::Send), Just(Intent::Subscribe)]
}

/// Characters dense in what either side treats specially: separators, wildcards, ASCII and
/// Unicode whitespace, non-ASCII letters, prefixes' letters.
fn special_char() -> impl Strategy<Value = char> {
    prop::sample::select(vec![
        'a', 'q', 'x', '.', '/', '*', '>', ' ', '\t', '\n', '\r', '\u{0b}', '\u{0c}', '\u{85}', '\u{a0}', '\u{2003}', '\u{2028}', '\u{3000}', '\u{feff}', 'é',
        '中', ':', '-', '_', '+', '#', '\0',
    ])
}

fn prefix() -> impl Strategy<Value = &'static str> {
    prop::sample::select(vec!["", "/", "/queue/", "/topic/", "/topic-store/", "/command/", "/query/", "/reply/", "/events/", "queue/"])
}

/// What the gRPC API would say about the router's channel, by the API call a remote array
/// receives for that pattern.
fn grpc_verdict(pattern: Pattern, channel: &str, wildcard: bool) -> Result<(), validate::Invalid> {
    match pattern {
        Pattern::Queues => validate::queue(channel),
        // Events subscriptions are the only place a wildcard may appear.
        Pattern::Events => validate::channel_with(channel, wildcard),
        // Store subscriptions, publishes, requests and response channels: no wildcards.
        Pattern::EventsStore | Pattern::Commands | Pattern::Queries | Pattern::Reply => validate::channel(channel),
    }
}

fn accepted_channel_passes(raw: &[u8], default: DefaultPattern, intent: Intent) -> Result<(), TestCaseError> {
    if let Ok(d) = parse_destination(raw, default, intent) {
        let channel = std::str::from_utf8(d.channel.as_bytes());
        prop_assert!(channel.is_ok(), "router accepted a non-UTF-8 channel from {:?}", raw);
        let channel = channel.unwrap();
        prop_assert_eq!(grpc_verdict(d.pattern, channel, d.wildcard), Ok(()), "router accepted {:?} as {:?}", channel, d.pattern);
        if !d.wildcard {
            prop_assert_eq!(validate::channel(channel), Ok(()));
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 4096, ..ProptestConfig::default() })]

    /// Arbitrary bytes: whatever the router accepts, the gRPC validation accepts.
    #[test]
    fn accepted_bytes_pass_grpc_validation(
        raw in prop::collection::vec(any::<u8>(), 0..64),
        default in default_pattern(),
        intent in intent(),
    ) {
        accepted_channel_passes(&raw, default, intent)?;
    }

    /// The same over text dense in the characters either side cares about.
    #[test]
    fn accepted_text_passes_grpc_validation(
        prefix in prefix(),
        body in prop::collection::vec(special_char(), 0..24),
        default in default_pattern(),
        intent in intent(),
    ) {
        let raw = format!("{prefix}{}", body.into_iter().collect::<String>());
        accepted_channel_passes(raw.as_bytes(), default, intent)?;
    }

    /// For a grammatical SEND destination (non-empty segments, no wildcard characters), the
    /// router accepts it exactly when the gRPC validation accepts its channel: one rule.
    #[test]
    fn router_refuses_exactly_what_grpc_refuses(
        prefix in prop::sample::select(vec!["/queue/", "/topic/", "/topic-store/", "/command/", "/query/"]),
        segments in prop::collection::vec(
            prop::collection::vec(special_char(), 1..6)
                .prop_map(|cs| cs.into_iter().map(|c| if matches!(c, '/' | '*' | '>') { '_' } else { c }).collect::<String>()),
            1..5,
        ),
    ) {
        let raw = format!("{prefix}{}", segments.join("/"));
        let channel = segments.join(".");
        let router = parse_destination(raw.as_bytes(), DefaultPattern::Events, Intent::Send);
        match validate::channel(&channel) {
            Ok(()) => prop_assert_eq!(router.map(|d| d.channel.as_bytes().to_vec()), Ok(channel.into_bytes())),
            Err(e) => prop_assert_eq!(router, Err(DestinationError::Invalid), "gRPC refuses {:?} with {:?}", channel, e),
        }
    }
}

/// The reported case, through both doors: a space is KubeMQ's Error 108 on gRPC and
/// `invalid destination` on STOMP, for every prefix and intent.
#[test]
fn a_space_is_refused_by_both() {
    assert_eq!(validate::channel("my orders"), Err(validate::WHITESPACE));
    assert_eq!(validate::queue("my orders"), Err(validate::BAD_QUEUE));
    for raw in ["/queue/my orders", "/topic/my orders", "/topic-store/my orders", "/command/my orders", "my orders"] {
        assert_eq!(parse_destination(raw.as_bytes(), DefaultPattern::Events, Intent::Send), Err(DestinationError::Invalid), "{raw}");
        assert_eq!(parse_destination(raw.as_bytes(), DefaultPattern::Events, Intent::Subscribe), Err(DestinationError::Invalid), "{raw}");
    }
}
