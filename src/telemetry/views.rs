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
use crate::mesh::handle::ArrayHandle;
use crate::mesh::msg::{ConnectionView, CoreId, CoreMsg, Mailbox};
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
    let Some(array) = ARRAY.get() else {
        return serde_json::json!({ "channels": [], "truncated": false, "cores_unanswered": 0 }).to_string();
    };
    let mut items = Vec::new();
    let mut truncated = false;
    let mut unanswered = 0u32;
    for (pattern, name) in PATTERNS {
        for core in CoreId::all(array.cores()) {
            let (reply, answer) = Mailbox::new();
            if !array.send(core, CoreMsg::ListChannels { pattern, reply }) {
                unanswered += 1;
                continue;
            }
            let Ok(Ok(stats)) = tokio::time::timeout(CORE_ANSWER_WAIT, answer.recv_async()).await else {
                unanswered += 1;
                continue;
            };
            for s in stats {
                if items.len() >= limit {
                    truncated = true;
                    break;
                }
                items.push(serde_json::json!({
                    "pattern": name,
                    "channel": String::from_utf8_lossy(&s.name.0),
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
    }
    serde_json::json!({ "channels": items, "truncated": truncated, "cores_unanswered": unanswered }).to_string()
}

/// The `/api/stomp/connections` JSON document.
pub(super) async fn connections(limit: usize) -> String {
    let Some(array) = ARRAY.get() else {
        return serde_json::json!({ "connections": [], "truncated": false, "cores_unanswered": 0 }).to_string();
    };
    let mut items = Vec::new();
    let mut truncated = false;
    let mut unanswered = 0u32;
    for core in CoreId::all(array.cores()) {
        let (reply, answer) = Mailbox::new();
        if !array.send(core, CoreMsg::ListConnections { reply }) {
            unanswered += 1;
            continue;
        }
        let Ok(Ok(views)) = tokio::time::timeout(CORE_ANSWER_WAIT, answer.recv_async()).await else {
            unanswered += 1;
            continue;
        };
        for v in views {
            if items.len() >= limit {
                truncated = true;
                break;
            }
            items.push(connection_json(core, &v));
        }
    }
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
