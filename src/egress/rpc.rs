//! Commands and Queries through the array: `SendRequest` with the effective timeout; the
//! outcome goes back to the requester's `/reply/` subscription as on the embedded array.
use super::Worker;
use crate::mesh::msg::{CoreMsg, RpcOutcome, RpcRequest};
use crate::model::Pattern;
use crate::wire::convert::{string_of, tags_to_entries};
use crate::wire::pb;
use std::rc::Rc;
use std::time::Duration;
use tonic::Code;

/// Extra time for the array's own timeout verdict to arrive before giving up locally.
const VERDICT_GRACE: Duration = Duration::from_secs(2);

pub fn request(w: Rc<Worker>, req: RpcRequest) {
    tokio::task::spawn_local(async move {
        let msg = &req.msg;
        let request = pb::Request {
            request_id: string_of(&msg.id),
            request_type_data: if req.pattern == Pattern::Queries { 2 } else { 1 },
            client_id: if msg.client_id.is_empty() { w.client_id.clone() } else { string_of(&msg.client_id) },
            channel: msg.channel.to_string(),
            metadata: string_of(&msg.metadata),
            body: msg.body.to_vec(),
            timeout: req.timeout_ms.clamp(1, i32::MAX as u64) as i32,
            tags: tags_to_entries(&msg.tags),
            // The array caches the query's answer and marks a hit in `CacheHit`.
            cache_key: req.cache.as_ref().map(|c| string_of(&c.key)).unwrap_or_default(),
            cache_ttl: req.cache.as_ref().map_or(0, |c| c.ttl_s.min(i32::MAX as u32) as i32),
            span: req.span.to_vec(),
            ..Default::default()
        };
        let mut client = w.client.clone();
        let call = client.send_request(request);
        let outcome = match tokio::time::timeout(Duration::from_millis(req.timeout_ms) + VERDICT_GRACE, call).await {
            Ok(Ok(r)) => crate::wire::convert::outcome_of_response(r.into_inner()),
            Ok(Err(status)) => {
                let outcome = outcome_of(&status);
                if matches!(outcome, RpcOutcome::Unavailable) {
                    w.metrics.rpc_unavailable.increment(1);
                }
                outcome
            }
            Err(_) => RpcOutcome::Timeout,
        };
        let reply = CoreMsg::RpcReply { reply_to: req.reply_to, pattern: req.pattern, correlation_id: req.correlation_id.clone(), outcome: Box::new(outcome) };
        w.back.send(req.reply_to.core, reply);
    });
}

/// How an array error reads to a STOMP requester: KubeMQ reports a timeout as an error with
/// `Error 301` (stompgate as DEADLINE_EXCEEDED), and stompgate reports a missing responder
/// as NOT_FOUND; anything else means the array could not serve the request.
fn outcome_of(status: &tonic::Status) -> RpcOutcome {
    match status.code() {
        Code::DeadlineExceeded => RpcOutcome::Timeout,
        Code::NotFound => RpcOutcome::NoResponder,
        _ if status.message().contains("Error 301") || status.message().contains("timeout") => RpcOutcome::Timeout,
        _ => RpcOutcome::Unavailable,
    }
}
