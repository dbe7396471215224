//! Operator views on the metrics listener (issue 18): `GET /api/channels`, per pattern and
//! channel, gathered from every core with `CoreMsg::ListChannels`, and
//! `GET /api/stomp/connections`, gathered with `CoreMsg::ListConnections` (each core owns its
//! shard's and its connections' state, so it answers for itself; nothing here reads another
//! core's memory).
//!
//! Bounded: at most `limit` channels (connections) are listed (`?limit=N`, default [`DEFAULT_LIMIT`], capped
//! at [`MAX_LIMIT`]); `truncated` says when more exist. A core that does not answer within
//! [`CORE_ANSWER_WAIT`] is skipped and counted in `cores_unanswered`, so a busy core cannot
//! hold the listener.
//!
//! `GET /api/amqp10/connections` and `GET /api/amqp10/links` (KubeMQ's AMQP connector views,
//! connector-extra.md §3.5) come from one `CoreMsg::ListAmqpConnections` per core: the first
//! lists connections, the second every link of them, each bounded by `limit` on its own.
use crate::mesh::handle::ArrayHandle;
use crate::mesh::msg::{AmqpConnectionView, AmqpLinkView, ConnectionView, CoreId, CoreMsg, Mailbox};
use crate::model::Pattern;
use std::sync::OnceLock;
use std::time::Duration;

pub const DEFAULT_LIMIT: usize = 1000;
pub const MAX_LIMIT: usize = 10_000;
pub const CORE_ANSWER_WAIT: Duration = Duration::from_secs(2);

/// The array the views ask, set once the cores run (`telemetry::serve_views`).
static ARRAY: OnceLock<ArrayHandle> = OnceLock::new();

pub(super) fn set_array(array: ArrayHandle) {
    let _ = ARRAY.set(array);
}

const PATTERNS: [(Pattern, &str); 5] = [
    (Pattern::Events, "events"),
    (Pattern::EventsStore, "events_store"),
    (Pattern::Queues, "queues"),
    (Pattern::Commands, "commands"),
    (Pattern::Queries, "queries"),
];

/// `limit` from a query string such as `limit=10&x=y`; absent or unparsable → the default.
pub(super) fn limit_of(query: Option<&str>) -> usize {
    let asked = query.and_then(|q| q.split('&').find_map(|kv| kv.strip_prefix("limit="))).and_then(|v| v.parse::<usize>().ok());
    asked.unwrap_or(DEFAULT_LIMIT).min(MAX_LIMIT)
}

/// The `/api/channels` JSON document.
pub(super) async fn channels(limit: usize) -> String {
    let mut items = Vec::new();
    let mut truncated = false;
    let mut unanswered = 0u32;
    for (pattern, name) in PATTERNS {
        let (stats, missed) = ask_every_core(|reply| CoreMsg::ListChannels { pattern, reply }).await;
        unanswered += missed;
        for (core, s) in stats {
            if items.len() >= limit {
                truncated = true;
                break;
            }
            items.push(serde_json::json!({
                "pattern": name,
                "channel": String::from_utf8_lossy(&s.name.0),
                // The core that owns the channel (its shard holds it): which core its traffic
                // loads, e.g. to tell a benchmark's placement.
                "core": core.index(),
                "subscribers": s.subscribers,
                // Queues: the depth (ready + delayed); 0 for the other patterns.
                "waiting": s.waiting,
                // Queues: delivered and not yet acknowledged; 0 for the other patterns.
                "unacked": s.unacked,
                // Queues: messages sent so far; events-store: messages stored (its size).
                "messages": s.messages,
                "bytes": s.bytes,
            }));
        }
    }
    serde_json::json!({ "channels": items, "truncated": truncated, "cores_unanswered": unanswered }).to_string()
}

/// The `/api/stomp/connections` JSON document.
pub(super) async fn connections(limit: usize) -> String {
    let (all, unanswered) = ask_every_core(|reply| CoreMsg::ListConnections { reply }).await;
    let truncated = all.len() > limit;
    let items: Vec<serde_json::Value> = all.iter().take(limit).map(|(core, v)| connection_json(*core, v)).collect();
    serde_json::json!({ "connections": items, "truncated": truncated, "cores_unanswered": unanswered }).to_string()
}

fn connection_json(core: CoreId, v: &ConnectionView) -> serde_json::Value {
    let subscriptions: Vec<serde_json::Value> = v
        .subscriptions
        .iter()
        .map(|s| {
            serde_json::json!({
                "id": String::from_utf8_lossy(&s.id),
                // The destination as its pattern's primary prefix and the (dotted) channel.
                "pattern": s.pattern.primary_prefix(),
                "channel": String::from_utf8_lossy(&s.channel.0),
                "ack": s.ack,
                "unacked": s.unacked,
            })
        })
        .collect();
    serde_json::json!({
        "client_id": String::from_utf8_lossy(&v.client_id),
        "address": v.peer.map(|p| p.to_string()),
        "core": core.index(),
        "version": v.version,
        "connected_since_unix_ms": v.connected_at_ms,
        "frames_in": v.frames_in,
        "bytes_in": v.bytes_in,
        "frames_out": v.frames_out,
        "bytes_out": v.bytes_out,
        "unacked": v.subscriptions.iter().map(|s| s.unacked).sum::<u64>(),
        "subscriptions": subscriptions,
    })
}

/// Asks every core, in core order, the question `ask` builds around a reply mailbox; returns
/// the answers with the core that gave each, and the number of cores that did not answer
/// within [`CORE_ANSWER_WAIT`] (or at all, before the cores run).
async fn ask_every_core<T>(ask: impl Fn(Mailbox<Vec<T>>) -> CoreMsg) -> (Vec<(CoreId, T)>, u32) {
    let Some(array) = ARRAY.get() else { return (Vec::new(), 0) };
    let mut all = Vec::new();
    let mut unanswered = 0u32;
    for core in CoreId::all(array.cores()) {
        let (reply, answer) = Mailbox::new();
        if !array.send(core, ask(reply)) {
            unanswered += 1;
            continue;
        }
        let Ok(Ok(items)) = tokio::time::timeout(CORE_ANSWER_WAIT, answer.recv_async()).await else {
            unanswered += 1;
            continue;
        };
        all.extend(items.into_iter().map(|v| (core, v)));
    }
    (all, unanswered)
}

/// Every core's AMQP connections, in core order; with the number of cores that did not answer.
async fn amqp_views() -> (Vec<(CoreId, AmqpConnectionView)>, u32) {
    ask_every_core(|reply| CoreMsg::ListAmqpConnections { reply }).await
}

fn text(b: &[u8]) -> std::borrow::Cow<'_, str> {
    String::from_utf8_lossy(b)
}

/// The `/api/amqp10/connections` JSON document.
pub(super) async fn amqp_connections(limit: usize) -> String {
    let (all, unanswered) = amqp_views().await;
    let truncated = all.len() > limit;
    let items: Vec<serde_json::Value> = all.iter().take(limit).map(|(core, v)| amqp_connection_json(*core, v)).collect();
    serde_json::json!({ "connections": items, "truncated": truncated, "cores_unanswered": unanswered }).to_string()
}

/// The `/api/amqp10/links` JSON document.
pub(super) async fn amqp_links(limit: usize) -> String {
    let (all, unanswered) = amqp_views().await;
    let mut items = Vec::new();
    let mut truncated = false;
    'all: for (core, v) in &all {
        for l in &v.links {
            if items.len() >= limit {
                truncated = true;
                break 'all;
            }
            items.push(amqp_link_json(*core, v, l));
        }
    }
    serde_json::json!({ "links": items, "truncated": truncated, "cores_unanswered": unanswered }).to_string()
}

fn amqp_connection_json(core: CoreId, v: &AmqpConnectionView) -> serde_json::Value {
    serde_json::json!({
        "client_id": text(&v.client_id),
        "container_id": text(&v.container_id),
        "product": v.product.as_deref().map(text),
        "version": v.version.as_deref().map(text),
        "sessions": v.sessions,
        "links": v.links.len(),
        // When the gateway answered the client's OPEN, Unix ms.
        "connected_at_unix_ms": v.connected_at_ms,
        "source_ip": v.peer.map(|p| p.ip().to_string()),
        "address": v.peer.map(|p| p.to_string()),
        "sasl": v.sasl,
        "tls": v.tls,
        "core": core.index(),
    })
}

fn amqp_link_json(core: CoreId, c: &AmqpConnectionView, l: &AmqpLinkView) -> serde_json::Value {
    serde_json::json!({
        "client_id": text(&c.client_id),
        "container_id": text(&c.container_id),
        "name": text(&l.name),
        "role": l.role,
        "address": l.address.as_deref().map(text),
        "pattern": l.pattern,
        "channel": l.channel.as_deref().map(text),
        "credit": l.credit,
        "unsettled": l.unsettled,
        "durable": l.durable,
        "dynamic": l.dynamic,
        "core": core.index(),
    })
}
