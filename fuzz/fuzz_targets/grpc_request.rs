//! Fuzzes the gRPC API's request path with the gateway's own code: bytes → a prost-decoded
//! request (the first byte picks which) → KubeMQ validation → conversion into the array's
//! message → conversion out to what a receiver gets. Nothing may panic, and whatever passes
//! validation must come out with its channel, metadata, body and tags unchanged.
#![no_main]

use libfuzzer_sys::fuzz_target;
use prost::Message as _;
use std::sync::Arc;
use stompgate::mesh::msg::{Pulled, RpcOutcome};
use stompgate::wire::convert::{self, Incoming};
use stompgate::{grpc::validate, wire::pb};

/// What the gateway sent back carries the same tags as `sent` under map semantics (an absent key
/// or value is "", the last duplicate wins), with every entry's key and value written.
fn assert_same_tags(out: &[pb::TagsEntry], sent: &[pb::TagsEntry]) {
    assert!(out.iter().all(|e| e.key.is_some() && e.value.is_some()), "an entry without its key or value: {out:?}");
    assert_eq!(convert::tags_from_entries(out.to_vec()), convert::tags_from_entries(sent.to_vec()));
}

fn event(bytes: &[u8]) {
    let Ok(ev) = pb::Event::decode(bytes) else { return };
    if validate::client_id(&ev.client_id).and(validate::channel(&ev.channel)).is_err() {
        return;
    }
    let sent = ev.clone();
    let msg = Incoming::from(ev).into_message("server-id".into(), 1);
    let out = convert::event_receive(&msg, sent.store);
    let out = pb::EventReceive::decode(out.encode_to_vec().as_slice()).expect("our encoding decodes");
    assert_eq!(out.channel, sent.channel);
    assert_eq!(out.metadata, sent.metadata);
    assert_eq!(out.body, sent.body);
    assert_same_tags(&out.tags, &sent.tags);
    assert!(!out.event_id.is_empty());
}

fn subscribe(bytes: &[u8]) {
    let Ok(s) = pb::Subscribe::decode(bytes) else { return };
    let _ = validate::client_id(&s.client_id);
    // Wildcards only on Events subscriptions (type 1).
    if validate::channel_with(&s.channel, s.subscribe_type_data == 1).is_ok() {
        assert!(!s.channel.is_empty());
    }
}

fn queue_message(m: pb::QueueMessage) {
    if validate::client_id(&m.client_id).and(validate::queue(&m.channel)).is_err() {
        return;
    }
    if let Some(p) = &m.policy {
        let secs = 0..=validate::MAX_POLICY_SECONDS;
        if !secs.contains(&p.expiration_seconds) || !secs.contains(&p.delay_seconds) || !(0..=validate::MAX_RECEIVE_COUNT).contains(&p.max_receive_count) {
            return;
        }
        if !p.max_receive_queue.is_empty() && validate::queue(&p.max_receive_queue).is_err() {
            return;
        }
    }
    let sent = m.clone();
    let msg = Incoming::from(m).into_message("server-id".into(), 1);
    let pulled = Pulled { msg: Arc::new(msg), tag: 1, seq: 1, receive_count: 1, expires_at_ns: 0, delayed_to_ns: 0, rerouted_from: None };
    let out = pb::QueueMessage::decode(convert::queue_message(&pulled).encode_to_vec().as_slice()).expect("our encoding decodes");
    assert_eq!(out.channel, sent.channel);
    assert_eq!(out.client_id, sent.client_id);
    assert_eq!(out.metadata, sent.metadata);
    assert_eq!(out.body, sent.body);
    assert_same_tags(&out.tags, &sent.tags);
}

fn request(bytes: &[u8]) {
    let Ok(r) = pb::Request::decode(bytes) else { return };
    let _ = validate::client_id(&r.client_id).and(validate::channel(&r.channel));
}

fn response(bytes: &[u8]) {
    let Ok(r) = pb::Response::decode(bytes) else { return };
    if validate::channel(&r.reply_channel).is_err() {
        return;
    }
    let sent = r.clone();
    let RpcOutcome::Response { executed, error, metadata, body, tags, .. } = convert::outcome_of_response(r) else {
        panic!("a response converts to a Response");
    };
    assert_eq!(executed, sent.executed);
    assert_eq!(&error[..], sent.error.as_bytes());
    assert_eq!(&metadata[..], sent.metadata.as_bytes());
    assert_eq!(&body[..], &sent.body[..]);
    assert_eq!(tags, convert::tags_from_entries(sent.tags));
}

fn pull(bytes: &[u8]) {
    let Ok(r) = pb::ReceiveQueueMessagesRequest::decode(bytes) else { return };
    let _ = validate::client_id(&r.client_id).and(validate::queue(&r.channel));
    let _ = (1..=validate::MAX_PULL_MESSAGES).contains(&r.max_number_of_messages);
}

fuzz_target!(|data: &[u8]| {
    let Some((&kind, bytes)) = data.split_first() else { return };
    match kind % 7 {
        0 => event(bytes),
        1 => subscribe(bytes),
        2 => {
            if let Ok(m) = pb::QueueMessage::decode(bytes) {
                queue_message(m);
            }
        }
        3 => {
            if let Ok(b) = pb::QueueMessagesBatchRequest::decode(bytes) {
                b.messages.into_iter().for_each(queue_message);
            }
        }
        4 => request(bytes),
        5 => response(bytes),
        _ => pull(bytes),
    }
});
