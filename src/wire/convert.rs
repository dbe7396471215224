//! Conversions between the array's `Message` and the KubeMQ protobuf types. Bodies are
//! byte-exact both ways; tags become a map (in key order on ingress, so egress order is stable);
//! `Metadata` is kept as is, so seed 000's header ⇄ tag rules hold across protocols.
use super::pb;
use crate::mesh::msg::Pulled;
use crate::model::{Channel, Message, Tags};
use bytes::Bytes;
use md5::{Digest, Md5};
use std::collections::HashMap;

pub fn bytes_of(s: String) -> Bytes {
    Bytes::from(s.into_bytes())
}

pub fn string_of(b: &Bytes) -> String {
    String::from_utf8_lossy(b).into_owned()
}

pub fn channel_of(name: &str) -> Channel {
    Channel(Bytes::copy_from_slice(name.as_bytes()))
}

/// A map's tags, sorted by key (a map has no order; this keeps egress deterministic).
pub fn tags_from_map(map: HashMap<String, String>) -> Tags {
    let mut tags: Vec<(Bytes, Bytes)> = map.into_iter().map(|(k, v)| (bytes_of(k), bytes_of(v))).collect();
    tags.sort_unstable_by(|a, b| a.0.cmp(&b.0));
    Tags(tags)
}

pub fn tags_to_map(tags: &Tags) -> HashMap<String, String> {
    tags.iter().map(|(k, v)| (string_of(k), string_of(v))).collect()
}

/// A message from a native producer. `id` empty → the server assigns one.
pub struct Incoming {
    pub id: String,
    pub client_id: String,
    pub channel: String,
    pub metadata: String,
    pub body: Vec<u8>,
    pub tags: HashMap<String, String>,
}

impl Incoming {
    pub fn into_message(self, id: String, now_ns: i64) -> Message {
        Message {
            id: bytes_of(if self.id.is_empty() { id } else { self.id }),
            channel: channel_of(&self.channel),
            client_id: bytes_of(self.client_id),
            metadata: bytes_of(self.metadata),
            body: Bytes::from(self.body),
            tags: tags_from_map(self.tags),
            timestamp_ns: now_ns,
            sequence: 0,
        }
    }
}

impl From<pb::Event> for Incoming {
    fn from(e: pb::Event) -> Self {
        Incoming { id: e.event_id, client_id: e.client_id, channel: e.channel, metadata: e.metadata, body: e.body, tags: e.tags }
    }
}

impl From<pb::QueueMessage> for Incoming {
    fn from(m: pb::QueueMessage) -> Self {
        Incoming { id: m.message_id, client_id: m.client_id, channel: m.channel, metadata: m.metadata, body: m.body, tags: m.tags }
    }
}

/// An Events / Events-Store delivery. Events carry no timestamp or sequence (as in KubeMQ).
pub fn event_receive(msg: &Message, store: bool) -> pb::EventReceive {
    pb::EventReceive {
        event_id: string_of(&msg.id),
        channel: msg.channel.to_string(),
        metadata: string_of(&msg.metadata),
        body: msg.body.to_vec(),
        timestamp: if store { msg.timestamp_ns } else { 0 },
        sequence: if store { msg.sequence } else { 0 },
        tags: tags_to_map(&msg.tags),
    }
}

/// A queue message as a receiver sees it, with the server-side attributes.
pub fn queue_message(p: &Pulled) -> pb::QueueMessage {
    let msg = &p.msg;
    pb::QueueMessage {
        message_id: string_of(&msg.id),
        client_id: string_of(&msg.client_id),
        channel: msg.channel.to_string(),
        metadata: string_of(&msg.metadata),
        body: msg.body.to_vec(),
        tags: tags_to_map(&msg.tags),
        attributes: Some(pb::QueueMessageAttributes {
            timestamp: msg.timestamp_ns,
            sequence: p.seq,
            md5_of_body: md5_hex(&msg.body),
            receive_count: p.receive_count.min(i32::MAX as u32) as i32,
            re_routed: p.rerouted_from.is_some(),
            re_routed_from_queue: p.rerouted_from.as_ref().map(Channel::to_string).unwrap_or_default(),
            expiration_at: p.expires_at_ns,
            delayed_to: p.delayed_to_ns,
        }),
        policy: None,
        ..Default::default()
    }
}

fn md5_hex(body: &[u8]) -> String {
    let digest = Md5::digest(body);
    let mut out = String::with_capacity(32);
    for b in digest {
        out.push_str(&format!("{b:02x}"));
    }
    out
}

/// A responder's answer as the array carries it (from `SendResponse`, or from the array's reply
/// to a remote gateway's `SendRequest`).
pub fn outcome_of_response(r: pb::Response) -> crate::mesh::msg::RpcOutcome {
    crate::mesh::msg::RpcOutcome::Response {
        executed: r.executed,
        error: bytes_of(r.error),
        metadata: bytes_of(r.metadata),
        body: Bytes::from(r.body),
        tags: tags_from_map(r.tags),
        responder: bytes_of(r.client_id),
        timestamp_ns: r.timestamp,
        span: Bytes::from(r.span),
        cache_hit: r.cache_hit,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn md5_matches_the_reference_digest() {
        assert_eq!(md5_hex(b""), "d41d8cd98f00b204e9800998ecf8427e");
        assert_eq!(md5_hex(b"abc"), "900150983cd24fb0d6963f7d28e17f72");
    }

    #[test]
    fn tags_are_sorted_and_round_trip() {
        let map: HashMap<String, String> = [("b", "2"), ("a", "1")].into_iter().map(|(k, v)| (k.into(), v.into())).collect();
        let tags = tags_from_map(map.clone());
        assert_eq!(tags.0[0].0.as_ref(), b"a");
        assert_eq!(tags_to_map(&tags), map);
    }

    #[test]
    fn body_is_byte_exact_and_server_fills_missing_id() {
        let inc =
            Incoming { id: String::new(), client_id: "c".into(), channel: "x".into(), metadata: "m".into(), body: vec![0, 255, 10], tags: HashMap::new() };
        let msg = inc.into_message("g-1".into(), 5);
        assert_eq!(msg.id.as_ref(), b"g-1");
        assert_eq!(msg.body.as_ref(), &[0, 255, 10]);
        let ev = event_receive(&msg, false);
        assert_eq!((ev.body, ev.timestamp, ev.metadata), (vec![0, 255, 10], 0, "m".to_string()));
    }
}
