//! Channel management: the Query requests SDKs send to the reserved channel
//! `kubemq.cluster.internal.requests` (kubemq-grpc.md §6.4) — `create-channel`,
//! `delete-channel` and `list-channels`, with the type in tag `channel_type`.
//!
//! Channels are implicit in the array (created on first use), so `create-channel` only
//! declares a name for listing; `delete-channel` forgets the declaration and drops what the
//! channel holds (queued messages; an Events-Store log without subscribers). A list merges the
//! declared names with what each core's shard holds (`CoreMsg::ListChannels`).
use super::bridge::Bridge;
use super::pb;
use crate::mesh::msg::{ChannelStats, CoreId, CoreMsg, Mailbox};
use crate::model::{now_unix_ns, Pattern};
use crate::route::Filter;
use bytes::Bytes;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;
use tonic::Status;

pub const MANAGEMENT_CHANNEL: &str = "kubemq.cluster.internal.requests";

/// Names declared with `create-channel`, per channel type.
#[derive(Default)]
pub struct Declared(Mutex<BTreeSet<(String, String)>>);

impl Declared {
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeSet<(String, String)>> {
        self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

fn pattern_of(channel_type: &str) -> Option<Pattern> {
    Some(match channel_type {
        "events" => Pattern::Events,
        "events_store" => Pattern::EventsStore,
        "queues" => Pattern::Queues,
        "commands" => Pattern::Commands,
        "queries" => Pattern::Queries,
        _ => return None,
    })
}

fn answer(r: &pb::Request, executed: bool, error: String, body: Vec<u8>) -> pb::Response {
    pb::Response { client_id: r.client_id.clone(), request_id: r.request_id.clone(), body, timestamp: now_unix_ns(), executed, error, ..Default::default() }
}

pub async fn handle(b: &Bridge, r: pb::Request) -> Result<pb::Response, Status> {
    let tag = |k: &str| crate::wire::convert::entry_value(&r.tags, k).unwrap_or_default().to_string();
    let channel_type = tag("channel_type");
    let Some(pattern) = pattern_of(&channel_type) else {
        return Ok(answer(&r, false, format!("invalid channel type {channel_type:?}"), Vec::new()));
    };
    match r.metadata.as_str() {
        "create-channel" | "delete-channel" => {
            let name = tag("channel");
            if let Err(e) = super::validate::channel(&name) {
                return Ok(answer(&r, false, e.message(), Vec::new()));
            }
            if r.metadata == "create-channel" {
                b.declared.lock().insert((channel_type, name));
            } else {
                let channel = crate::wire::convert::channel_of(&name);
                let owner = b.owner_of(pattern, &channel);
                b.array.send(owner, CoreMsg::DeleteChannel { pattern, channel });
                b.declared.lock().remove(&(channel_type, name));
                // The owner confirms a barrier sent after the delete once the delete is done,
                // and with a store directory once its records are durable (its confirmation
                // is held for the log like any other): the answer then means deleted for good.
                if !b.confirm(owner, CoreMsg::Barrier).await {
                    return Ok(answer(&r, false, "the deletion was not confirmed".into(), Vec::new()));
                }
            }
            Ok(answer(&r, true, String::new(), Vec::new()))
        }
        "list-channels" => {
            let list = list(b, pattern, &channel_type, &tag("channel_search")).await;
            Ok(answer(&r, true, String::new(), list.into_bytes()))
        }
        other => Ok(answer(&r, false, format!("unknown channel management request {other:?}"), Vec::new())),
    }
}

/// Whether `name` matches a list search: empty matches all; a search with `*` / `>` is a
/// wildcard filter; anything else matches as a substring.
fn matches(search: &str, name: &str) -> bool {
    if search.is_empty() {
        return true;
    }
    if search.contains(['*', '>']) {
        return Filter::new(Bytes::copy_from_slice(search.as_bytes())).matches(name.as_bytes());
    }
    name.contains(search)
}

/// The JSON list SDKs decode: name, type, lastActivity, isActive, incoming/outgoing stats.
async fn list(b: &Bridge, pattern: Pattern, channel_type: &str, search: &str) -> String {
    let mut found: BTreeMap<String, ChannelStats> = BTreeMap::new();
    for core in CoreId::all(b.array.cores()) {
        let (reply, answer) = Mailbox::new();
        if b.array.send(core, CoreMsg::ListChannels { pattern, reply }) {
            for s in answer.recv_async().await.unwrap_or_default() {
                found.insert(s.name.to_string(), s);
            }
        }
    }
    for (kind, name) in b.declared.lock().iter() {
        if kind == channel_type {
            found.entry(name.clone()).or_default();
        }
    }
    let items: Vec<serde_json::Value> = found
        .into_iter()
        .filter(|(name, _)| matches(search, name))
        .map(|(name, s)| {
            let incoming = serde_json::json!({
                "messages": s.messages, "volume": s.bytes, "waiting": s.waiting,
                "expired": 0, "delayed": 0, "responses": 0,
            });
            let outgoing = serde_json::json!({
                "messages": 0, "volume": 0, "waiting": 0, "expired": 0, "delayed": 0, "responses": 0,
            });
            serde_json::json!({
                "name": name,
                "type": channel_type,
                "lastActivity": 0,
                "isActive": s.subscribers > 0 || s.waiting > 0,
                "incoming": incoming,
                "outgoing": outgoing,
            })
        })
        .collect();
    serde_json::Value::Array(items).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn search_rules() {
        assert!(matches("", "a.b"));
        assert!(matches("a.*", "a.b"));
        assert!(!matches("a.*", "a.b.c"));
        assert!(matches("a.>", "a.b.c"));
        assert!(matches("ord", "orders"));
        assert!(!matches("x", "orders"));
    }
}
