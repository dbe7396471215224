//! The destination router (seed 000 "The grammar", seed 001 "The parse algorithm").
//!
//! A destination is parsed into a (pattern, channel) pair: the first segment selects the
//! pattern, the rest are `.`-joined into the KubeMQ channel. Egress reverses the join and always
//! uses the primary prefix, so aliases never reach a subscriber.
use crate::model::{Channel, Pattern};
use crate::route::channel::check_channel;
use crate::route::wildcard::Filter;
use bytes::{BufMut, Bytes, BytesMut};

/// Seed 000 step 1: the raw destination (leading slash included) may be at most this long.
pub const MAX_DESTINATION_LEN: usize = 512;

/// Connector-wide fallback for destinations with an unknown first segment.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum DefaultPattern {
    #[default]
    Events,
    Queues,
    Store,
    None,
}

/// What the client is doing with the destination: wildcards are legal only when subscribing
/// to Events; `/reply/` is legal only when subscribing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Intent {
    Send,
    Subscribe,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Destination {
    pub pattern: Pattern,
    /// Dotted channel (`a.b.c`); for wildcard subscriptions, the dotted filter (`orders.*`).
    pub channel: Channel,
    /// True when `channel` contains a `*` or `>` token (Events SUBSCRIBE only).
    pub wildcard: bool,
}

impl Destination {
    /// The channel as a wildcard filter, for subscriptions that have one (`wildcard == true`).
    pub fn filter(&self) -> Option<Filter> {
        self.wildcard.then(|| Filter::new(self.channel.0.clone()))
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DestinationError {
    #[error("invalid destination")]
    Invalid,
    #[error("cannot send to reply destinations")]
    SendToReply,
    #[error("cannot subscribe to RPC destinations")]
    SubscribeToRpc,
}

/// The case-sensitive prefix map (seed 000 tables: primary names and their MQTT-style aliases).
fn prefix_pattern(segment: &[u8]) -> Option<Pattern> {
    Some(match segment {
        b"queue" | b"queues" => Pattern::Queues,
        b"topic" | b"events" => Pattern::Events,
        b"topic-store" | b"store" => Pattern::EventsStore,
        b"command" | b"commands" => Pattern::Commands,
        b"query" | b"queries" => Pattern::Queries,
        b"reply" => Pattern::Reply,
        _ => return None,
    })
}

/// Parses a STOMP destination.
///
/// Check order (it decides which error a doubly-wrong destination gets, so it is fixed):
/// 1. raw length > 512 → `Invalid` (raw string, before the slash strip — seed 000 step 1);
/// 2. strip exactly one leading `/`;
/// 3. any empty segment (``, `/`, `//`, trailing `/`, `/queue/`) → `Invalid`;
/// 4. prefix → pattern; known prefix with no channel (`/queue`) or a bare destination under
///    `DefaultPattern::None` → `Invalid`;
/// 5. wildcards: any `*`/`>` outside an Events SUBSCRIBE, or not a whole token, or a `>` that
///    is not the final token → `Invalid`;
/// 6. the channel rule shared with the gRPC API ([`check_channel`]): not UTF-8, any
///    whitespace, or a trailing `.` → `Invalid`;
/// 7. intent: SEND to Reply → `SendToReply`; SUBSCRIBE to Commands/Queries → `SubscribeToRpc`.
///
/// Intent comes last so that a well-formed but misdirected destination (`SUBSCRIBE /command/x`,
/// `SEND /reply/r`) gets the specific error, while anything malformed is `invalid destination`.
pub fn parse_destination(raw: &[u8], default: DefaultPattern, intent: Intent) -> Result<Destination, DestinationError> {
    // 1. Length gate on the raw bytes.
    if raw.len() > MAX_DESTINATION_LEN {
        return Err(DestinationError::Invalid);
    }
    // 2. Exactly one leading slash is optional; a second one becomes an empty first segment.
    let path = raw.strip_prefix(b"/").unwrap_or(raw);
    // 3. Empty segments. Equivalent to splitting and checking each segment, without the split.
    if path.is_empty() || path[0] == b'/' || path[path.len() - 1] == b'/' || memchr::memmem::find(path, b"//").is_some() {
        return Err(DestinationError::Invalid);
    }
    // 4. First segment → pattern. `rest` is the part that becomes the channel; from step 3 it
    //    is non-empty and has no empty segment.
    let first_end = memchr::memchr(b'/', path);
    let first = &path[..first_end.unwrap_or(path.len())];
    let (pattern, rest) = match prefix_pattern(first) {
        Some(pattern) => match first_end {
            Some(i) => (pattern, &path[i + 1..]),
            // `/queue`: a known prefix with nothing after it names no channel.
            None => return Err(DestinationError::Invalid),
        },
        // Bare destination: every segment, the first included, is channel. Never RPC/Reply.
        None => match default {
            DefaultPattern::Events => (Pattern::Events, path),
            DefaultPattern::Queues => (Pattern::Queues, path),
            DefaultPattern::Store => (Pattern::EventsStore, path),
            DefaultPattern::None => return Err(DestinationError::Invalid),
        },
    };
    // 5. Wildcards.
    let wildcard = check_wildcards(rest, pattern, intent)?;
    // 6. The channel rule. Checked on the slash form, which differs from the dotted channel
    //    only in '/' vs '.': neither is whitespace or a wildcard, and `rest` never ends in '/'.
    if !std::str::from_utf8(rest).is_ok_and(|name| check_channel(name, wildcard).is_ok()) {
        return Err(DestinationError::Invalid);
    }
    // 7. Intent.
    match (intent, pattern) {
        (Intent::Send, Pattern::Reply) => return Err(DestinationError::SendToReply),
        (Intent::Subscribe, Pattern::Commands | Pattern::Queries) => return Err(DestinationError::SubscribeToRpc),
        _ => {}
    }
    // Slash → dot. The input is borrowed, so one allocation for the channel is unavoidable; a
    // literal '.' inside a segment passes through (lossy by design, seed 000 "literal-dot trap").
    let mut channel = rest.to_vec();
    for b in &mut channel {
        if *b == b'/' {
            *b = b'.';
        }
    }
    Ok(Destination { pattern, channel: Channel(Bytes::from(channel)), wildcard })
}

/// Step 5. `rest` is the slash form of the channel; tokens are split on both '/' and '.' so the
/// check sees exactly the tokens the dotted filter will have (`/topic/a.*` is the filter `a.*`,
/// the same as `/topic/a/*` — consistent with the literal-dot rule).
fn check_wildcards(rest: &[u8], pattern: Pattern, intent: Intent) -> Result<bool, DestinationError> {
    if memchr::memchr2(b'*', b'>', rest).is_none() {
        return Ok(false);
    }
    // Seeds: wildcards are SUBSCRIBE-only and Events-only; everything else is invalid.
    if intent != Intent::Subscribe || pattern != Pattern::Events {
        return Err(DestinationError::Invalid);
    }
    let mut tokens = rest.split(|&b| b == b'/' || b == b'.').peekable();
    while let Some(token) = tokens.next() {
        match token {
            b"*" => {}
            // '>' is the tail match; anywhere but last it would be meaningless.
            b">" if tokens.peek().is_none() => {}
            // `a*`, `>x`, or a non-final `>`: not the broker's syntax.
            _ if memchr::memchr2(b'*', b'>', token).is_some() => return Err(DestinationError::Invalid),
            _ => {}
        }
    }
    Ok(true)
}

/// Appends the canonical (primary prefix, slash form) destination for egress:
/// (Events, `a.b.c`) → `/topic/a/b/c`. Every '.' becomes '/', so a channel with a literal dot from
/// `/topic/a.b` is delivered as `/topic/a/b` (seed 000, "literal-dot trap").
pub fn write_egress_destination(pattern: Pattern, channel: &[u8], out: &mut BytesMut) {
    let prefix = pattern.primary_prefix().as_bytes();
    out.reserve(2 + prefix.len() + channel.len());
    out.put_u8(b'/');
    out.extend_from_slice(prefix);
    out.put_u8(b'/');
    let mut rest = channel;
    while let Some(i) = memchr::memchr(b'.', rest) {
        out.extend_from_slice(&rest[..i]);
        out.put_u8(b'/');
        rest = &rest[i + 1..];
    }
    out.extend_from_slice(rest);
}

#[cfg(test)]
mod tests {
    use super::*;
    use DestinationError::*;

    fn parse(raw: &str, default: DefaultPattern, intent: Intent) -> Result<(Pattern, String, bool), DestinationError> {
        parse_destination(raw.as_bytes(), default, intent).map(|d| (d.pattern, String::from_utf8(d.channel.0.to_vec()).unwrap(), d.wildcard))
    }
    fn send(raw: &str) -> Result<(Pattern, String, bool), DestinationError> {
        parse(raw, DefaultPattern::Events, Intent::Send)
    }
    fn sub(raw: &str) -> Result<(Pattern, String, bool), DestinationError> {
        parse(raw, DefaultPattern::Events, Intent::Subscribe)
    }
    fn ok(p: Pattern, ch: &str) -> Result<(Pattern, String, bool), DestinationError> {
        Ok((p, ch.to_string(), false))
    }
    fn wild(ch: &str) -> Result<(Pattern, String, bool), DestinationError> {
        Ok((Pattern::Events, ch.to_string(), true))
    }
    fn egress(p: Pattern, ch: &str) -> String {
        let mut out = BytesMut::new();
        write_egress_destination(p, ch.as_bytes(), &mut out);
        String::from_utf8(out.to_vec()).unwrap()
    }

    // Seed 000 "Primary prefix → pattern → channel": ingress, channel and canonical egress.
    #[test]
    fn primary_prefix_rows() {
        let rows = [
            ("/queue/orders/new", Pattern::Queues, "orders.new", "/queue/orders/new"),
            ("/topic/a/b/c", Pattern::Events, "a.b.c", "/topic/a/b/c"),
            ("/topic-store/audit", Pattern::EventsStore, "audit", "/topic-store/audit"),
            ("/command/exec", Pattern::Commands, "exec", "/command/exec"),
            ("/query/lookup", Pattern::Queries, "lookup", "/query/lookup"),
        ];
        for (raw, p, ch, eg) in rows {
            assert_eq!(send(raw), ok(p, ch), "{raw}");
            assert_eq!(egress(p, ch), eg, "{raw}");
        }
        // Reply is SUBSCRIBE-only.
        assert_eq!(sub("/reply/r1"), ok(Pattern::Reply, "r1"));
        assert_eq!(egress(Pattern::Reply, "r1"), "/reply/r1");
    }

    // Seed 000 "MQTT-name aliases": route identically, egress canonicalizes to the primary.
    #[test]
    fn alias_rows() {
        let rows = [
            ("/queues/x", Pattern::Queues, "/queue/x"),
            ("/events/x", Pattern::Events, "/topic/x"),
            ("/store/x", Pattern::EventsStore, "/topic-store/x"),
            ("/commands/x", Pattern::Commands, "/command/x"),
            ("/queries/x", Pattern::Queries, "/query/x"),
        ];
        for (raw, p, eg) in rows {
            assert_eq!(send(raw), ok(p, "x"), "{raw}");
            assert_eq!(egress(p, "x"), eg, "{raw}");
        }
    }

    // Seed 000 callout: there is no /topic_store/ or /eventstore/ (seed 001 adds /exchange/,
    // /amq/queue/): they are bare destinations, the whole path is the channel.
    #[test]
    fn non_prefixes_are_bare() {
        assert_eq!(send("/topic_store/x"), ok(Pattern::Events, "topic_store.x"));
        assert_eq!(send("/eventstore/x"), ok(Pattern::Events, "eventstore.x"));
        assert_eq!(send("/exchange/x"), ok(Pattern::Events, "exchange.x"));
        assert_eq!(send("/amq/queue/x"), ok(Pattern::Events, "amq.queue.x"));
    }

    // Seed 000 "DefaultPattern": the four rows.
    #[test]
    fn default_pattern_rows() {
        assert_eq!(DefaultPattern::default(), DefaultPattern::Events);
        let i = Intent::Send;
        assert_eq!(parse("sensor/temp", DefaultPattern::Events, i), ok(Pattern::Events, "sensor.temp"));
        assert_eq!(parse("sensor/temp", DefaultPattern::Queues, i), ok(Pattern::Queues, "sensor.temp"));
        assert_eq!(parse("sensor/temp", DefaultPattern::Store, i), ok(Pattern::EventsStore, "sensor.temp"));
        assert_eq!(parse("sensor/temp", DefaultPattern::None, i), Err(Invalid));
        // The leading slash is optional for bare destinations too.
        assert_eq!(parse("/sensor/temp", DefaultPattern::Queues, i), ok(Pattern::Queues, "sensor.temp"));
        assert_eq!(parse("/sensor", DefaultPattern::Store, i), ok(Pattern::EventsStore, "sensor"));
        // DefaultPattern::None does not affect prefixed destinations.
        assert_eq!(parse("/queue/x", DefaultPattern::None, i), ok(Pattern::Queues, "x"));
    }

    // Seed 000 "Destination errors" table.
    #[test]
    fn destination_error_rows() {
        for raw in ["//", "/queue//x", "/queue/x/", "/queue/", "", "/", "//queue/x", "a//b", "a/"] {
            assert_eq!(send(raw), Err(Invalid), "{raw:?}");
            assert_eq!(sub(raw), Err(Invalid), "{raw:?}");
        }
        for raw in ["/queue", "queue", "/topic", "/topic-store", "/command", "/query", "/reply", "/queues"] {
            assert_eq!(send(raw), Err(Invalid), "{raw:?}");
            assert_eq!(sub(raw), Err(Invalid), "{raw:?}");
        }
        assert_eq!(parse("x", DefaultPattern::None, Intent::Subscribe), Err(Invalid));
        assert_eq!(send("/topic/orders/*"), Err(Invalid));
        assert_eq!(sub("/queue/jobs/*"), Err(Invalid));
        assert_eq!(sub("/topic-store/a/*"), Err(Invalid));
        assert_eq!(sub("/command/a/*"), Err(Invalid));
        assert_eq!(sub("/query/a/>"), Err(Invalid));
        assert_eq!(sub("/reply/*"), Err(Invalid));
    }

    // Seed 000 step 1: ≤ 512 bytes on the raw string, leading slash included.
    #[test]
    fn length_gate_512_vs_513_raw() {
        let ch = "a".repeat(512 - "/queue/".len());
        let raw512 = format!("/queue/{ch}");
        assert_eq!(raw512.len(), 512);
        assert_eq!(send(&raw512), ok(Pattern::Queues, &ch));
        let raw513 = format!("/queue/{ch}b");
        assert_eq!(raw513.len(), 513);
        assert_eq!(send(&raw513), Err(Invalid));
        // Without the slash, 512 bytes is fine and 513 is not: the strip does not buy a byte.
        let bare512 = format!("queue/{ch}b");
        assert_eq!(bare512.len(), 512);
        assert!(send(&bare512).is_ok());
        let raw513_slash = format!("/{bare512}");
        assert_eq!(raw513_slash.len(), 513);
        assert_eq!(send(&raw513_slash), Err(Invalid));
        // The length gate wins over every later check.
        let long_sub_rpc = format!("/command/{}", "x".repeat(600));
        assert_eq!(sub(&long_sub_rpc), Err(Invalid));
        let long_send_reply = format!("/reply/{}", "x".repeat(600));
        assert_eq!(send(&long_send_reply), Err(Invalid));
    }

    // Seed 000 step 2: exactly one leading slash is stripped.
    #[test]
    fn leading_slash_optional_exactly_one() {
        assert_eq!(send("queue/x"), ok(Pattern::Queues, "x"));
        assert_eq!(send("/queue/x"), ok(Pattern::Queues, "x"));
        assert_eq!(send("//queue/x"), Err(Invalid));
    }

    // Seed 000 step 4: the prefix map is case-sensitive.
    #[test]
    fn prefix_map_is_case_sensitive() {
        assert_eq!(send("/Queue/x"), ok(Pattern::Events, "Queue.x"));
        assert_eq!(send("/TOPIC/x"), ok(Pattern::Events, "TOPIC.x"));
        assert_eq!(parse("/Queue/x", DefaultPattern::None, Intent::Send), Err(Invalid));
        assert_eq!(parse("/Reply/x", DefaultPattern::Queues, Intent::Send), ok(Pattern::Queues, "Reply.x"));
    }

    // Seed 000 "Slash → dot, and the literal-dot trap".
    #[test]
    fn literal_dot_trap() {
        assert_eq!(send("/topic/a.b"), ok(Pattern::Events, "a.b"));
        assert_eq!(send("/topic/a/b"), ok(Pattern::Events, "a.b"));
        assert_eq!(egress(Pattern::Events, "a.b"), "/topic/a/b");
    }

    #[test]
    fn segments_are_any_utf8_text_but_slash_and_whitespace() {
        let d = parse_destination("/queue/\u{e9}\x00:x/y+z#".as_bytes(), DefaultPattern::Events, Intent::Send).unwrap();
        assert_eq!(d.pattern, Pattern::Queues);
        assert_eq!(d.channel.as_bytes(), "\u{e9}\x00:x.y+z#".as_bytes());
        assert!(!d.wildcard);
        // A prefix name further down the path is just a segment.
        assert_eq!(send("/topic/queue/reply"), ok(Pattern::Events, "queue.reply"));
    }

    // The channel rule shared with the gRPC API (route::channel): what KubeMQ would refuse
    // through a remote array is refused here too, as a malformed destination.
    #[test]
    fn channels_the_grpc_api_refuses_are_invalid() {
        for raw in ["/queue/my orders", "/topic/a\tb", "/topic/a/b\u{a0}c", "x y", "/topic/a.", "/topic/a/b.", "/queue/."] {
            assert_eq!(send(raw), Err(Invalid), "{raw:?}");
            assert_eq!(sub(raw), Err(Invalid), "{raw:?}");
        }
        // Not UTF-8: a gRPC channel is a protobuf string.
        assert_eq!(parse_destination(b"/queue/\xff", DefaultPattern::Events, Intent::Send), Err(Invalid));
        // Malformed beats misdirected.
        assert_eq!(sub("/command/a b"), Err(Invalid));
        assert_eq!(send("/reply/r."), Err(Invalid));
        // A leading or inner literal dot is not refused (KubeMQ accepts it).
        assert_eq!(send("/topic/.a"), ok(Pattern::Events, ".a"));
        assert_eq!(send("/topic/a..b"), ok(Pattern::Events, "a..b"));
    }

    // Seed 000/001 "Wildcards — Events only, subscribe only".
    #[test]
    fn wildcard_rows() {
        assert_eq!(sub("/topic/orders/*"), wild("orders.*"));
        assert_eq!(sub("/topic/orders/>"), wild("orders.>"));
        assert_eq!(sub("/topic/a/*/c"), wild("a.*.c"));
        assert_eq!(sub("/events/a/*/c"), wild("a.*.c"));
        assert_eq!(sub("/topic/*"), wild("*"));
        assert_eq!(sub("/topic/>"), wild(">"));
        assert_eq!(sub("/topic/*/>"), wild("*.>"));
        assert_eq!(sub("/topic/*/*"), wild("*.*"));
        // Bare destinations under DefaultPattern::Events are Events too.
        assert_eq!(sub("orders/*"), wild("orders.*"));
        assert_eq!(parse("orders/*", DefaultPattern::Queues, Intent::Subscribe), Err(Invalid));
        // Not whole tokens, or '>' not final.
        assert_eq!(sub("/topic/a*"), Err(Invalid));
        assert_eq!(sub("/topic/a/b*c"), Err(Invalid));
        assert_eq!(sub("/topic/>/a"), Err(Invalid));
        assert_eq!(sub("/topic/a/>x"), Err(Invalid));
        assert_eq!(sub("/topic/**"), Err(Invalid));
        assert_eq!(sub("/topic/>>"), Err(Invalid));
        // SEND with a wildcard character: invalid for every pattern, even as part of a token.
        for raw in ["/topic/a/*", "/topic/a/>", "/topic/a*b", "/queue/*", "/topic-store/>", "/command/*", "/query/*", "x/*"] {
            assert_eq!(send(raw), Err(Invalid), "{raw}");
        }
        // SUBSCRIBE to non-Events with a wildcard character.
        for raw in ["/queue/jobs/*", "/queues/>", "/topic-store/a/*", "/store/a>", "/reply/r/*"] {
            assert_eq!(sub(raw), Err(Invalid), "{raw}");
        }
        // No MQTT-style '+' / '#': they are ordinary bytes.
        assert_eq!(sub("/topic/a/+/#"), ok(Pattern::Events, "a.+.#"));
    }

    // Wildcard tokens are judged on the dotted channel, so a literal dot makes a token boundary.
    #[test]
    fn wildcard_tokens_follow_literal_dots() {
        assert_eq!(sub("/topic/a.*"), wild("a.*"));
        assert_eq!(sub("/topic/a/*.>"), wild("a.*.>"));
        assert_eq!(sub("/topic/a.>.b"), Err(Invalid));
    }

    #[test]
    fn intent_rules() {
        assert_eq!(send("/reply/r1"), Err(SendToReply));
        assert_eq!(sub("/command/x"), Err(SubscribeToRpc));
        assert_eq!(sub("/commands/x"), Err(SubscribeToRpc));
        assert_eq!(sub("/query/x"), Err(SubscribeToRpc));
        assert_eq!(sub("/queries/x"), Err(SubscribeToRpc));
        // Allowed combinations.
        assert_eq!(send("/command/x"), ok(Pattern::Commands, "x"));
        assert_eq!(send("/query/x"), ok(Pattern::Queries, "x"));
        assert_eq!(sub("/reply/r1"), ok(Pattern::Reply, "r1"));
        assert_eq!(sub("/queue/x"), ok(Pattern::Queues, "x"));
        assert_eq!(sub("/topic-store/x"), ok(Pattern::EventsStore, "x"));
        // Malformed beats misdirected (check order).
        assert_eq!(send("/reply/"), Err(Invalid));
        assert_eq!(send("/reply"), Err(Invalid));
        assert_eq!(sub("/command"), Err(Invalid));
        assert_eq!(send("/reply/*"), Err(Invalid));
        assert_eq!(sub("/command/*"), Err(Invalid));
    }

    // Bare destinations never resolve to RPC or Reply, whatever the DefaultPattern.
    #[test]
    fn bare_never_rpc() {
        for d in [DefaultPattern::Events, DefaultPattern::Queues, DefaultPattern::Store] {
            for raw in ["Command/x", "cmd/x", "rpc"] {
                let p = parse_destination(raw.as_bytes(), d, Intent::Subscribe).unwrap().pattern;
                assert!(matches!(p, Pattern::Events | Pattern::Queues | Pattern::EventsStore));
            }
        }
    }

    #[test]
    fn canonical_egress_rows() {
        assert_eq!(egress(Pattern::Events, "a.b.c"), "/topic/a/b/c");
        assert_eq!(egress(Pattern::Queues, "orders.new"), "/queue/orders/new");
        assert_eq!(egress(Pattern::EventsStore, "audit"), "/topic-store/audit");
        assert_eq!(egress(Pattern::Commands, "exec"), "/command/exec");
        assert_eq!(egress(Pattern::Queries, "lookup"), "/query/lookup");
        assert_eq!(egress(Pattern::Reply, "r1"), "/reply/r1");
        // Egress delivers the concrete channel, never the filter.
        assert_eq!(egress(Pattern::Events, "orders.eu"), "/topic/orders/eu");
        // Appends: existing buffer contents are kept.
        let mut out = BytesMut::from(&b"destination:"[..]);
        write_egress_destination(Pattern::Events, b"x", &mut out);
        assert_eq!(&out[..], b"destination:/topic/x");
    }

    #[test]
    fn filter_accessor() {
        let d = parse_destination(b"/topic/orders/*", DefaultPattern::Events, Intent::Subscribe).unwrap();
        let f = d.filter().unwrap();
        assert!(f.matches(b"orders.eu"));
        assert!(parse_destination(b"/topic/orders", DefaultPattern::Events, Intent::Subscribe).unwrap().filter().is_none());
    }
}
