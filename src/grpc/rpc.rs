//! Commands and Queries over gRPC: `SubscribeToRequests` (responders), `SendRequest`
//! (requesters) and `SendResponse`.
//!
//! Responders attach to the owner core of their channel (`CoreMsg::RegisterResponder`); the
//! owner hands each request to every group-less responder and one member per group, and the
//! first answer wins. The `ReplyChannel` a responder sees names the owner core and the
//! request's internal id (`_stompgate.reply.<core>.<id>`), so its `SendResponse` goes straight
//! to the core holding the pending request. A gRPC requester waits on a one-shot sink attached
//! to that owner.
use super::bridge::{Bridge, OnDrop};
use super::stream::MailboxStream;
use super::{pb, validate, BoxStream};
use crate::mesh::msg::{CacheSpec, CoreId, CoreMsg, ExternalSink, Mailbox, RpcOutcome, RpcRequest, SubNo, SubRef};
use crate::model::{now_unix_ns, Channel, Message, Pattern};
use crate::wire::convert::{self, bytes_of, string_of, tags_from_entries, tags_to_entries};
use bytes::Bytes;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::oneshot;
use tonic::Status;

/// Prefix of the reply channels this server hands to responders.
const REPLY_PREFIX: &str = "_stompgate.reply.";
/// How much longer than its own timeout a requester waits for the owner's verdict (the owner
/// checks timeouts on its 100 ms tick).
const VERDICT_GRACE: Duration = Duration::from_secs(2);

fn pattern_of_request(kind: i32) -> Result<Pattern, validate::Invalid> {
    match kind {
        1 => Ok(Pattern::Commands),
        2 => Ok(Pattern::Queries),
        _ => Err(validate::BAD_REQUEST_TYPE),
    }
}

pub fn reply_channel(owner: CoreId, request_id: &[u8]) -> String {
    format!("{REPLY_PREFIX}{owner}.{}", String::from_utf8_lossy(request_id))
}

/// (owner core, internal request id) from a reply channel this server issued.
pub fn parse_reply_channel(reply: &str) -> Option<(CoreId, Bytes)> {
    let rest = reply.strip_prefix(REPLY_PREFIX)?;
    let (core, id) = rest.split_once('.')?;
    Some((CoreId(core.parse().ok()?), Bytes::copy_from_slice(id.as_bytes())))
}

/// A request as a responder receives it.
fn request_for_responder(owner: CoreId, req: &RpcRequest) -> pb::Request {
    let msg = &req.msg;
    pb::Request {
        request_id: string_of(&msg.id),
        request_type_data: if req.pattern == Pattern::Queries { 2 } else { 1 },
        client_id: string_of(&msg.client_id),
        channel: msg.channel.to_string(),
        metadata: string_of(&msg.metadata),
        body: msg.body.to_vec(),
        reply_channel: reply_channel(owner, &req.request_id),
        timeout: req.timeout_ms.min(i32::MAX as u64) as i32,
        tags: tags_to_entries(&msg.tags),
        span: req.span.to_vec(),
        cache_key: req.cache.as_ref().map(|c| string_of(&c.key)).unwrap_or_default(),
        cache_ttl: req.cache.as_ref().map_or(0, |c| c.ttl_s.min(i32::MAX as u32) as i32),
    }
}

/// `SubscribeToRequests`: registers a responder and streams it the requests. Returns once
/// the responder is registered.
pub async fn subscribe(b: Arc<Bridge>, s: pb::Subscribe) -> Result<BoxStream<pb::Request>, Status> {
    let pattern = match s.subscribe_type_data {
        3 => Pattern::Commands,
        4 => Pattern::Queries,
        _ => return Err(validate::BAD_SUBSCRIBE_TYPE.status()),
    };
    validate::client_id(&s.client_id)?;
    validate::channel(&s.channel)?;
    let channel = convert::channel_of(&s.channel);
    let group = (!s.group.is_empty()).then(|| Bytes::from(s.group.into_bytes()));
    let owner = b.owner_of(pattern, &channel);
    let responder_id = b.new_conn().0;
    // The owner core hands over a cheap clone of each request; it is converted on this side.
    let (requests, rx) = Mailbox::<RpcRequest>::new();
    b.array.register_responder(pattern, channel.clone(), responder_id, group, requests);
    let guard = {
        let b = Arc::clone(&b);
        OnDrop(Some(move || {
            b.array.unregister_responder(pattern, channel, responder_id);
        }))
    };
    if !b.barrier(owner).await {
        return Err(Status::unavailable("the array is shutting down"));
    }
    let map = Box::new(move |req: RpcRequest| Ok(request_for_responder(owner, &req)));
    Ok(Box::pin(MailboxStream::new(rx, map, guard)))
}

/// `SendResponse`: routes a responder's answer to the core holding the request. A late answer
/// (the requester already timed out) is dropped there, as in KubeMQ.
pub fn respond(b: &Bridge, r: pb::Response) -> Result<pb::Empty, Status> {
    validate::client_id(&r.client_id)?;
    if r.request_id.is_empty() {
        return Err(validate::NO_REQUEST_ID.status());
    }
    if r.reply_channel.is_empty() {
        return Err(validate::NO_CHANNEL.status());
    }
    let Some((owner, request_id)) = parse_reply_channel(&r.reply_channel).filter(|(core, _)| core.index() < b.array.cores()) else {
        return Err(Status::invalid_argument(format!("Error 303: unknown reply channel {:?}", r.reply_channel)));
    };
    let outcome = convert::outcome_of_response(r);
    b.array.send(owner, CoreMsg::RpcResponse { pattern: Pattern::Commands, channel: Channel::default(), request_id, outcome: Box::new(outcome), amqp: false });
    Ok(pb::Empty {})
}

/// Waits for one request's outcome.
struct ReplySink(Mutex<Option<oneshot::Sender<RpcOutcome>>>);

impl ExternalSink for ReplySink {
    fn rpc_reply(&self, outcome: RpcOutcome) {
        if let Some(tx) = self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner).take() {
            let _ = tx.send(outcome);
        }
    }
}

/// `SendRequest`: a command or query from a native requester. Channel management queries go to
/// [`super::channels`].
pub async fn request(b: &Bridge, r: pb::Request) -> Result<pb::Response, Status> {
    let pattern = pattern_of_request(r.request_type_data)?;
    validate::client_id(&r.client_id)?;
    validate::channel(&r.channel)?;
    if r.timeout <= 0 {
        return Err(validate::BAD_TIMEOUT.status());
    }
    if !r.cache_key.is_empty() && r.cache_ttl <= 0 {
        return Err(validate::BAD_CACHE.status());
    }
    if r.channel == super::channels::MANAGEMENT_CHANNEL {
        return super::channels::handle(b, r).await;
    }
    // An empty request is accepted (not KubeMQ's Error 115), like an empty event.
    let client_request_id = if r.request_id.is_empty() { b.unique_id("r") } else { r.request_id };
    let timeout_ms = r.timeout as u64;
    // Only queries are cached; a command's key is ignored, as in KubeMQ.
    let cache = (pattern == Pattern::Queries && !r.cache_key.is_empty()).then(|| CacheSpec { key: bytes_of(r.cache_key), ttl_s: r.cache_ttl as u32 });
    let msg = Arc::new(Message {
        id: Bytes::from(client_request_id.clone().into_bytes()),
        channel: convert::channel_of(&r.channel),
        client_id: bytes_of(r.client_id),
        metadata: bytes_of(r.metadata),
        body: Bytes::from(r.body),
        tags: tags_from_entries(r.tags),
        timestamp_ns: now_unix_ns(),
        sequence: 0,
    });
    let owner = b.owner_of(pattern, &msg.channel);
    let conn = b.new_conn();
    let (tx, rx) = oneshot::channel();
    b.array.send(owner, CoreMsg::AttachSink { conn, sink: Arc::new(ReplySink(Mutex::new(Some(tx)))) });
    let req = RpcRequest {
        pattern,
        request_id: Bytes::from(b.unique_id("g").into_bytes()),
        msg,
        timeout_ms,
        reply_to: SubRef { core: owner, conn, sub: SubNo(0) },
        correlation_id: None,
        span: Bytes::from(r.span),
        cache,
    };
    if !b.array.send(owner, CoreMsg::RpcRequest(Box::new(req))) {
        return Err(Status::unavailable("the array is shutting down"));
    }
    let outcome = match tokio::time::timeout(Duration::from_millis(timeout_ms) + VERDICT_GRACE, rx).await {
        Ok(Ok(outcome)) => outcome,
        _ => {
            b.array.send(owner, CoreMsg::DetachSink { conn });
            RpcOutcome::Unavailable
        }
    };
    match outcome {
        RpcOutcome::Response { executed, error, metadata, body, tags, responder, timestamp_ns, span, cache_hit } => {
            // Command replies keep the responder's body and metadata. Community KubeMQ clears
            // them for a native requester (kubemq-patterns.md §5.2), but STOMP requesters get
            // them (seed 003), also through a gateway in remote-array mode, whose requests
            // arrive here as native ones; SDKs ignore the fields on command responses.
            let (metadata, body) = (string_of(&metadata), body.to_vec());
            Ok(pb::Response {
                client_id: string_of(&responder),
                request_id: client_request_id,
                reply_channel: String::new(),
                metadata,
                body,
                // Commands are never cached (kubemq-patterns.md §5.2: CacheHit cleared).
                cache_hit: cache_hit && pattern == Pattern::Queries,
                timestamp: timestamp_ns,
                executed,
                error: string_of(&error),
                span: span.to_vec(),
                tags: tags_to_entries(&tags),
            })
        }
        RpcOutcome::Timeout => Err(Status::deadline_exceeded("Error 301: timeout for request message")),
        RpcOutcome::NoResponder => Err(Status::not_found(format!("no responder is subscribed to {} channel {}", kind_name(pattern), r.channel))),
        RpcOutcome::Unavailable => Err(Status::unavailable("the array did not answer")),
    }
}

fn kind_name(p: Pattern) -> &'static str {
    if p == Pattern::Queries {
        "queries"
    } else {
        "commands"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reply_channels_round_trip() {
        let rc = reply_channel(CoreId(1), b"0-17");
        assert_eq!(rc, "_stompgate.reply.1.0-17");
        assert_eq!(parse_reply_channel(&rc), Some((CoreId(1), Bytes::from_static(b"0-17"))));
        assert_eq!(parse_reply_channel("other"), None);
        assert_eq!(parse_reply_channel("_stompgate.reply.x.1"), None);
    }
}
