//! Seed 002's tables, row by row, each refusal, and properties over arbitrary input.
use super::*;
use crate::route::check_channel;
use proptest::prelude::*;
use AddressError as E;
use Pattern::*;
use PeerRole::{Receiver, Sender};

fn attach(role: PeerRole, address: &str) -> Attach<'_> {
    Attach { role, address: Some(address), ..Attach::default() }
}

fn judge(role: PeerRole, address: &str) -> Result<LinkPlan, AddressError> {
    judge_attach(&attach(role, address), Queues)
}

fn channel(pattern: Pattern, name: &str) -> Node {
    Node::Channel { pattern, channel: Channel(Bytes::copy_from_slice(name.as_bytes())) }
}

fn ok(server_role: ServerRole, node: Node, permission: Permission) -> Result<LinkPlan, AddressError> {
    Ok(LinkPlan { server_role, node, permission })
}

/// Master table: each pattern row, each column it fills ("Send to" = peer sender on the target,
/// "Receive from" = peer receiver on the source), with the server role and attach permission of
/// *Server role and authorization*.
#[test]
fn master_table_rows() {
    use ServerRole as S;
    // Queues: produce = receiver; consume = sender.
    assert_eq!(judge(Sender, "queues/orders"), ok(S::Receiver, channel(Queues, "orders"), Permission::Write));
    assert_eq!(judge(Receiver, "queues/orders"), ok(S::Sender, channel(Queues, "orders"), Permission::Read));
    // Events.
    assert_eq!(judge(Sender, "events/telemetry"), ok(S::Receiver, channel(Events, "telemetry"), Permission::Write));
    assert_eq!(judge(Receiver, "events/telemetry"), ok(S::Sender, channel(Events, "telemetry"), Permission::Read));
    // Events Store.
    assert_eq!(judge(Sender, "events-store/audit"), ok(S::Receiver, channel(EventsStore, "audit"), Permission::Write));
    assert_eq!(judge(Receiver, "events-store/audit"), ok(S::Sender, channel(EventsStore, "audit"), Permission::Read));
    // Commands / Queries: request = receiver. (A peer receiver here is a responder, §3.6.)
    assert_eq!(judge(Sender, "commands/dispatch"), ok(S::Receiver, channel(Commands, "dispatch"), Permission::Write));
    assert_eq!(judge(Sender, "queries/lookup"), ok(S::Receiver, channel(Queries, "lookup"), Permission::Write));
    assert_eq!(judge(Receiver, "commands/dispatch"), ok(S::Sender, channel(Commands, "dispatch"), Permission::Read));
    assert_eq!(judge(Receiver, "queries/lookup"), ok(S::Sender, channel(Queries, "lookup"), Permission::Read));
    // Responses: receiver only, write-only, no authz.
    assert_eq!(judge(Sender, "responses/r1"), ok(S::Receiver, Node::Responses { request_id: Bytes::from_static(b"r1") }, Permission::None));
    assert_eq!(judge(Receiver, "responses/r1"), Err(E::ReceiverOnResponses));
    // Queues row, settlement column: copy distribution → amqp:invalid-field.
    let copy = Attach { copy_distribution: true, ..attach(Receiver, "queues/orders") };
    assert_eq!(judge_attach(&copy, Queues).map_err(E::condition), Err(AmqpError::InvalidField));
    // Queues row, filters column: a selector → amqp:not-implemented.
    let selector = Attach { selector: true, ..attach(Receiver, "queues/orders") };
    assert_eq!(judge_attach(&selector, Queues).map_err(E::condition), Err(AmqpError::NotImplemented));
    // Events and Events Store rows: a consume link may carry a selector; copy is fan-out anyway.
    for address in ["events/t", "events-store/a"] {
        let a = Attach { selector: true, copy_distribution: true, ..attach(Receiver, address) };
        assert_eq!(judge_attach(&a, Queues).map(|p| p.permission), Ok(Permission::Read), "{address}");
    }
    // Note "the same <pattern>/<channel> resolves to the same channel regardless of direction".
    for address in ["queues/a.b", "events/a.b", "events-store/a.b", "commands/a.b", "queries/a.b"] {
        assert_eq!(judge(Sender, address).unwrap().node, judge(Receiver, address).unwrap().node, "{address}");
    }
}

/// *Quick examples*, one assertion per row, in the seed's order.
#[test]
fn quick_examples_rows() {
    use ServerRole as S;
    // `queues/orders`, sender → (queues, orders), receiver (Write).
    assert_eq!(judge(Sender, "queues/orders"), ok(S::Receiver, channel(Queues, "orders"), Permission::Write));
    // `queues/orders`, receiver → (queues, orders), sender (Read).
    assert_eq!(judge(Receiver, "queues/orders"), ok(S::Sender, channel(Queues, "orders"), Permission::Read));
    // `/events/telemetry`, receiver → (events, telemetry), sender (Read).
    assert_eq!(judge(Receiver, "/events/telemetry"), ok(S::Sender, channel(Events, "telemetry"), Permission::Read));
    // `events-store/audit`, receiver → (events-store, audit), sender (Read).
    assert_eq!(judge(Receiver, "events-store/audit"), ok(S::Sender, channel(EventsStore, "audit"), Permission::Read));
    // `commands/dispatch`, sender → (commands, dispatch), receiver (Write).
    assert_eq!(judge(Sender, "commands/dispatch"), ok(S::Receiver, channel(Commands, "dispatch"), Permission::Write));
    // `responses/abc123`, sender → (responses, abc123), receiver (no authz).
    assert_eq!(judge(Sender, "responses/abc123"), ok(S::Receiver, Node::Responses { request_id: Bytes::from_static(b"abc123") }, Permission::None));
    // `responses/abc123`, receiver → DETACH amqp:not-allowed.
    assert_eq!(judge(Receiver, "responses/abc123").map_err(E::condition), Err(AmqpError::NotAllowed));
    // `orders` (bare, node-cap `queue`), sender → (queues, orders), receiver (Write). Default
    // events here, so the hint is what decides.
    let bare = Attach { hint: Some(NodeHint::Queue), ..attach(Sender, "orders") };
    assert_eq!(judge_attach(&bare, Events), ok(S::Receiver, channel(Queues, "orders"), Permission::Write));
    // null target, sender → anonymous terminus, receiver (per-message Write).
    let null = Attach { role: Sender, address: None, ..Attach::default() };
    assert_eq!(judge_attach(&null, Queues), ok(S::Receiver, Node::Anonymous, Permission::WritePerMessage));
    // `source.dynamic=true`, empty address, receiver → minted node, sender (no authz).
    let dynamic = Attach { role: Receiver, address: Some(""), dynamic: true, ..Attach::default() };
    assert_eq!(judge_attach(&dynamic, Queues), ok(S::Sender, Node::MintDynamic, Permission::None));
    // `events/x;y`, receiver → DETACH amqp:not-found (`;` in channel).
    assert_eq!(judge(Receiver, "events/x;y"), Err(E::Channel(ChannelFault::Separator)));
    assert_eq!(E::Channel(ChannelFault::Separator).condition(), AmqpError::NotFound);
}

/// *Longest-prefix discipline*: `events-store/` is never events with channel `store/...`, and
/// each prefix needs its trailing slash.
#[test]
fn longest_prefix_order() {
    assert_eq!(judge(Sender, "events-store/audit").unwrap().node, channel(EventsStore, "audit"));
    assert_eq!(judge(Sender, "events/store/audit").unwrap().node, channel(Events, "store/audit"));
    assert_eq!(judge(Sender, "events/events-store/x").unwrap().node, channel(Events, "events-store/x"));
    assert_eq!(judge(Sender, "queues/events/x").unwrap().node, channel(Queues, "events/x"));
    let order: Vec<&str> = PREFIXES.iter().map(|(p, _)| *p).collect();
    assert_eq!(order, ["events-store/", "queues/", "events/", "commands/", "queries/", "responses/"]);
    // A prefix word without its slash is a bare address.
    assert_eq!(judge(Sender, "queues").unwrap().node, channel(Queues, "queues"));
    assert_eq!(judge_attach(&attach(Sender, "events"), Commands).unwrap().node, channel(Commands, "events"));
}

/// *Address grammar*: at most one leading slash is stripped.
#[test]
fn leading_slash_is_optional_once() {
    for address in ["queues/orders", "events/t", "events-store/a", "commands/c", "queries/q", "responses/r", "orders"] {
        for role in [Sender, Receiver] {
            assert_eq!(judge(role, address), judge(role, &format!("/{address}")), "{address}");
        }
    }
    assert_eq!(judge(Sender, "//queues/orders"), Err(E::UnknownPrefix));
    // "/" alone is not the null address: its channel is empty.
    assert_eq!(judge(Sender, "/"), Err(E::Channel(ChannelFault::Empty)));
}

/// *Special rows*, "Bare address": the hint, else DefaultPattern, degrading to queues.
#[test]
fn bare_address_hint_then_default_pattern() {
    let with = |hint, default| judge_attach(&Attach { hint, ..attach(Receiver, "orders") }, default).unwrap().node;
    assert_eq!(with(Some(NodeHint::Queue), Events), channel(Queues, "orders"));
    assert_eq!(with(Some(NodeHint::Topic), Queues), channel(Events, "orders"));
    for default in [Queues, Events, EventsStore, Commands, Queries] {
        assert_eq!(with(None, default), channel(default, "orders"));
    }
    assert_eq!(with(None, Reply), channel(Queues, "orders"), "a misconfigured default degrades to queues");
    // The hint does not override an explicit prefix.
    assert_eq!(judge_attach(&Attach { hint: Some(NodeHint::Topic), ..attach(Sender, "queues/o") }, Queues).unwrap().node, channel(Queues, "o"));
    // Capability symbols → hint.
    assert_eq!(NodeHint::from_capabilities(["shared", "queue"]), Some(NodeHint::Queue));
    assert_eq!(NodeHint::from_capabilities(["topic", "queue"]), Some(NodeHint::Topic));
    assert_eq!(NodeHint::from_capabilities(["temporary-queue", "Queue", ""]), None);
    assert_eq!(NodeHint::from_capabilities([]), None);
}

/// *Longest-prefix discipline*: a bare address with a `/` and no known prefix → not-found.
#[test]
fn unknown_prefix_is_not_found() {
    for address in ["foo/bar", "queue/orders", "topic/x", "Queues/orders", "events-storex/a", "a/", "/a/b"] {
        assert_eq!(judge(Sender, address), Err(E::UnknownPrefix), "{address}");
        assert_eq!(judge(Receiver, address), Err(E::UnknownPrefix), "{address}");
    }
    assert_eq!(E::UnknownPrefix.condition(), AmqpError::NotFound);
    // Without a slash, a prefix word is just a bare channel name.
    assert_eq!(judge(Sender, "events-store").unwrap().node, channel(Queues, "events-store"));
}

/// *Channel validation*: each rule's row and its rejected example, all `amqp:not-found`.
#[test]
fn channel_validation_rows() {
    let long = "a".repeat(300);
    let rows = [
        ("queues/".to_string(), ChannelFault::Empty),
        (format!("queues/{long}"), ChannelFault::TooLong),
        ("queues/orders.".to_string(), ChannelFault::TrailingDot),
        ("queues/my orders".to_string(), ChannelFault::Whitespace),
        ("queues/orders.*".to_string(), ChannelFault::Wildcard),
        ("queues/a:b".to_string(), ChannelFault::Separator),
    ];
    for (address, fault) in &rows {
        for role in [Sender, Receiver] {
            assert_eq!(judge(role, address), Err(E::Channel(*fault)), "{address}");
        }
        assert_eq!(E::Channel(*fault).condition(), AmqpError::NotFound);
    }
    // The rest of each rule: tab/CR/LF, `>`, `;`, the 255-byte edge (bytes, not characters).
    for ws in ["a\tb", "a\rb", "a\nb", " a"] {
        assert_eq!(check_amqp_channel(ws), Err(ChannelFault::Whitespace), "{ws:?}");
    }
    assert_eq!(check_amqp_channel("a.>"), Err(ChannelFault::Wildcard));
    assert_eq!(check_amqp_channel("a*"), Err(ChannelFault::Wildcard));
    assert_eq!(check_amqp_channel("a;b"), Err(ChannelFault::Separator));
    assert_eq!(check_amqp_channel(&"a".repeat(255)), Ok(()));
    assert_eq!(check_amqp_channel(&"a".repeat(256)), Err(ChannelFault::TooLong));
    assert_eq!(check_amqp_channel(&"é".repeat(128)), Err(ChannelFault::TooLong), "256 bytes, 128 chars");
    // Wildcards are refused on an events consume link too (unlike STOMP SUBSCRIBE).
    assert_eq!(judge(Receiver, "events/a.*"), Err(E::Channel(ChannelFault::Wildcard)));
    assert_eq!(judge(Receiver, "events/a.>"), Err(E::Channel(ChannelFault::Wildcard)));
    // Bare channels follow the same rule.
    assert_eq!(judge(Sender, "a b"), Err(E::Channel(ChannelFault::Whitespace)));
    assert_eq!(judge(Sender, "a:b"), Err(E::Channel(ChannelFault::Separator)));
    // `.` as a separator inside the channel is fine (`queues/region.eu.orders`).
    assert_eq!(judge(Sender, "queues/region.eu.orders").unwrap().node, channel(Queues, "region.eu.orders"));
}

/// *Special rows*, "Responses token": opaque, only emptiness refused; receiver → not-allowed.
#[test]
fn responses_token() {
    let token = |id: &'static str| Node::Responses { request_id: Bytes::from_static(id.as_bytes()) };
    // Opaque: charset rules do not apply.
    assert_eq!(judge(Sender, "responses/a b:c;*").unwrap().node, token("a b:c;*"));
    assert_eq!(judge(Sender, "/responses/x/y").unwrap().node, token("x/y"));
    assert_eq!(judge(Sender, "responses/"), Err(E::EmptyRequestId));
    assert_eq!(E::EmptyRequestId.condition(), AmqpError::NotFound);
    // Malformed before misdirected: `responses/` alone as a receiver is not-found.
    assert_eq!(judge(Receiver, "responses/"), Err(E::EmptyRequestId));
    assert_eq!(E::ReceiverOnResponses.condition(), AmqpError::NotAllowed);
}

/// *Special rows*, "Dynamic terminus" and "Anonymous terminus" at attach.
#[test]
fn null_and_dynamic_termini() {
    use ServerRole as S;
    let t = |role, address, dynamic| judge_attach(&Attach { role, address, dynamic, ..Attach::default() }, Queues);
    // Dynamic, either role, null or empty address.
    assert_eq!(t(Receiver, None, true), ok(S::Sender, Node::MintDynamic, Permission::None));
    assert_eq!(t(Sender, None, true), ok(S::Receiver, Node::MintDynamic, Permission::None));
    assert_eq!(t(Sender, Some(""), true), ok(S::Receiver, Node::MintDynamic, Permission::None));
    // Dynamic with an address → invalid-field.
    assert_eq!(t(Receiver, Some("queues/x"), true), Err(E::DynamicWithAddress));
    assert_eq!(E::DynamicWithAddress.condition(), AmqpError::InvalidField);
    // Null or empty target on a sender → anonymous.
    assert_eq!(t(Sender, Some(""), false), ok(S::Receiver, Node::Anonymous, Permission::WritePerMessage));
    // Null or empty source on a receiver, not dynamic → not-found.
    assert_eq!(t(Receiver, None, false), Err(E::NoSourceAddress));
    assert_eq!(t(Receiver, Some(""), false), Err(E::NoSourceAddress));
    assert_eq!(E::NoSourceAddress.condition(), AmqpError::NotFound);
}

/// Selector refusal on the other consume links (§3.8: events and events-store only).
#[test]
fn selector_only_on_events_and_events_store() {
    for address in ["queues/q", "commands/c", "queries/q", "orders"] {
        let a = Attach { selector: true, ..attach(Receiver, address) };
        assert_eq!(judge_attach(&a, Queues), Err(E::SelectorNotSupported), "{address}");
    }
    // Copy is refused on queues only, and the source options mean nothing on a sender's target.
    let a = Attach { copy_distribution: true, ..attach(Receiver, "commands/c") };
    assert!(judge_attach(&a, Queues).is_ok());
    let a = Attach { copy_distribution: true, selector: true, ..attach(Sender, "queues/q") };
    assert!(judge_attach(&a, Queues).is_ok());
}

/// *Special rows*, "Anonymous terminus": per-message routing by `to`.
#[test]
fn anonymous_routing_by_to() {
    assert_eq!(route_to(Some("queues/orders"), Events), Ok(channel(Queues, "orders")));
    assert_eq!(route_to(Some("/events-store/a"), Queues), Ok(channel(EventsStore, "a")));
    assert_eq!(route_to(Some("orders"), Events), Ok(channel(Events, "orders")), "bare → DefaultPattern");
    assert_eq!(route_to(Some("responses/abc"), Queues), Ok(Node::Responses { request_id: Bytes::from_static(b"abc") }));
    let node = DynamicAddress { conn: 7, id: 0x0123_4567_89ab_cdef_0123_4567_89ab_cdef };
    assert_eq!(route_to(Some(&node.to_string()), Queues), Ok(Node::Dynamic(node)));
    assert_eq!(route_to(Some(&format!("/{node}")), Queues), Ok(Node::Dynamic(node)));
    // Missing or bad → precondition-failed.
    assert_eq!(route_to(None, Queues), Err(E::MissingTo));
    assert_eq!(route_to(Some(""), Queues), Err(E::MissingTo));
    for bad in ["queues/", "foo/bar", "events/x;y", "queues/a b", "responses/", "_amqp10.tmp.7.nope", "_amqp10.tmp.", "//queues/x"] {
        assert_eq!(route_to(Some(bad), Queues), Err(E::BadTo), "{bad:?}");
    }
    assert_eq!(E::MissingTo.condition(), AmqpError::PreconditionFailed);
    assert_eq!(E::BadTo.condition(), AmqpError::PreconditionFailed);
    // Per-message permission.
    assert_eq!(channel(Queues, "o").write_permission(), Permission::Write);
    assert_eq!(Node::Responses { request_id: Bytes::from_static(b"r") }.write_permission(), Permission::None);
    assert_eq!(Node::Dynamic(node).write_permission(), Permission::None);
}

#[test]
fn dynamic_address_format() {
    let a = DynamicAddress { conn: 42, id: 0x0123_4567_89ab_cdef_0123_4567_89ab_cdef };
    assert_eq!(a.to_string(), "_amqp10.tmp.42.01234567-89ab-cdef-0123-456789abcdef");
    assert_eq!(a.to_string().parse(), Ok(a));
    assert_eq!(DynamicAddress { conn: 0, id: 0 }.to_string(), "_amqp10.tmp.0.00000000-0000-0000-0000-000000000000");
    assert!(check_amqp_channel(&DynamicAddress { conn: u64::MAX, id: u128::MAX }.to_string()).is_ok(), "fits the channel rule");
    for bad in [
        "_amqp10.tmp.042.01234567-89ab-cdef-0123-456789abcdef",
        "_amqp10.tmp.+42.01234567-89ab-cdef-0123-456789abcdef",
        "_amqp10.tmp.42.01234567-89AB-cdef-0123-456789abcdef",
        "_amqp10.tmp.42.0123456789ab-cdef-0123-4567-89abcdef",
        "_amqp10.tmp.42.01234567-89ab-cdef-0123-456789abcdef0",
        "_amqp10.tmp..01234567-89ab-cdef-0123-456789abcdef",
        "_amqp10.tmp.18446744073709551616.01234567-89ab-cdef-0123-456789abcdef",
        "amqp10.tmp.42.01234567-89ab-cdef-0123-456789abcdef",
        "_amqp10.tmp.42",
    ] {
        assert_eq!(bad.parse::<DynamicAddress>(), Err(NotDynamicAddress), "{bad}");
    }
}

#[test]
fn settings_and_resources() {
    for (s, p) in [("queues", Queues), ("events", Events), ("events-store", EventsStore), ("commands", Commands), ("queries", Queries)] {
        assert_eq!(Pattern::from_amqp_setting(s), Some(p));
    }
    for s in ["store", "none", "reply", "Queues", "", "events_store"] {
        assert_eq!(Pattern::from_amqp_setting(s), None, "{s:?}");
    }
    let resources: Vec<_> = [Queues, Events, EventsStore, Commands, Queries, Reply].into_iter().map(authz_resource).collect();
    assert_eq!(resources, [Some("queues"), Some("events"), Some("events_store"), Some("commands"), Some("queries"), None]);
}

#[test]
fn refusals_carry_closed_conditions_and_fixed_text() {
    let all = [
        E::Channel(ChannelFault::Empty),
        E::Channel(ChannelFault::TooLong),
        E::Channel(ChannelFault::TrailingDot),
        E::Channel(ChannelFault::Whitespace),
        E::Channel(ChannelFault::Wildcard),
        E::Channel(ChannelFault::Separator),
        E::UnknownPrefix,
        E::EmptyRequestId,
        E::ReceiverOnResponses,
        E::NoSourceAddress,
        E::DynamicWithAddress,
        E::CopyOnQueue,
        E::SelectorNotSupported,
        E::MissingTo,
        E::BadTo,
    ];
    for e in all {
        assert!(AmqpError::ALL.contains(&e.condition()));
        let d = e.description();
        assert!(!d.is_empty() && d.len() <= crate::amqp::error::MAX_DESCRIPTION_LEN, "{e:?}");
        assert_eq!(e.to_string(), format!("{}: {d}", e.condition().symbol()));
    }
}

fn any_role() -> impl Strategy<Value = PeerRole> {
    prop_oneof![Just(Sender), Just(Receiver)]
}

fn any_hint() -> impl Strategy<Value = Option<NodeHint>> {
    prop_oneof![Just(None), Just(Some(NodeHint::Queue)), Just(Some(NodeHint::Topic))]
}

fn any_default() -> impl Strategy<Value = Pattern> {
    prop_oneof![Just(Queues), Just(Events), Just(EventsStore), Just(Commands), Just(Queries), Just(Reply)]
}

/// Addresses near the grammar: a prefix (or none, or a slash) and a tail from a charset rich in
/// the characters the rules care about, plus any string.
fn any_address() -> impl Strategy<Value = String> {
    let prefix = prop_oneof![
        Just(""),
        Just("/"),
        Just("//"),
        Just("queues/"),
        Just("/events/"),
        Just("events-store/"),
        Just("commands/"),
        Just("queries/"),
        Just("responses/"),
        Just("_amqp10.tmp."),
    ];
    prop_oneof![(prefix, "[a-z./;:*> \t\u{a0}é-]{0,300}").prop_map(|(p, t)| format!("{p}{t}")), any::<String>()]
}

proptest! {
    /// No input panics, and any refusal is one of the closed conditions.
    #[test]
    fn no_input_panics(address in proptest::option::of(any_address()), role in any_role(), dynamic in any::<bool>(),
                       hint in any_hint(), default in any_default(), copy in any::<bool>(), selector in any::<bool>()) {
        let a = Attach { role, address: address.as_deref(), dynamic, hint, copy_distribution: copy, selector };
        if let Err(e) = judge_attach(&a, default) {
            prop_assert!(AmqpError::ALL.contains(&e.condition()));
        }
        if let Err(e) = route_to(address.as_deref(), default) {
            prop_assert!(matches!(e, E::MissingTo | E::BadTo));
        }
        let _ = address.as_deref().map(str::parse::<DynamicAddress>);
    }

    /// A mapped channel always passes the connector rule and the crate's channel rule without
    /// wildcards (so the gRPC API would accept it), and is never the STOMP reply pattern.
    #[test]
    fn mapped_channels_pass_the_channel_rule(address in any_address(), role in any_role(), hint in any_hint(), default in any_default()) {
        let a = Attach { role, address: Some(&address), hint, ..Attach::default() };
        let nodes = [judge_attach(&a, default).map(|p| p.node), route_to(Some(&address), default)];
        for node in nodes.into_iter().flatten() {
            if let Node::Channel { pattern, channel } = node {
                let name = std::str::from_utf8(channel.as_bytes()).unwrap();
                prop_assert!(check_amqp_channel(name).is_ok());
                prop_assert!(check_channel(name, false).is_ok());
                prop_assert!(name.len() <= MAX_CHANNEL_LEN);
                prop_assert!(pattern != Reply);
            }
        }
    }

    /// The leading slash is optional (once), and the channel does not depend on the role.
    #[test]
    fn slash_and_role_do_not_change_the_channel(address in any_address(), hint in any_hint(), default in any_default()) {
        let node = |role, address: &str| judge_attach(&Attach { role, address: Some(address), hint, ..Attach::default() }, default).map(|p| p.node);
        if !address.starts_with('/') && !address.is_empty() {
            prop_assert_eq!(node(Sender, &address), node(Sender, &format!("/{address}")));
        }
        if let Ok(n @ Node::Channel { .. }) = node(Sender, &address) {
            prop_assert_eq!(Ok(n), node(Receiver, &address));
        }
    }

    #[test]
    fn dynamic_address_round_trips(conn in any::<u64>(), id in any::<u128>()) {
        let a = DynamicAddress { conn, id };
        prop_assert_eq!(a.to_string().parse::<DynamicAddress>(), Ok(a));
        prop_assert_eq!(route_to(Some(&a.to_string()), Queues), Ok(Node::Dynamic(a)));
    }
}
