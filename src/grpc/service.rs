//! The `kubemq.kubemq` service: each RPC delegates to the module that owns its pattern.
//!
//! | RPC | Module |
//! |---|---|
//! | `Ping` | here: host, crate version, start time, uptime |
//! | `SendEvent`, `SendEventsStream`, `SubscribeToEvents` | [`super::events`] |
//! | `SubscribeToRequests`, `SendRequest`, `SendResponse` | [`super::rpc`] (management queries: [`super::channels`]) |
//! | `SendQueueMessage`, `SendQueueMessagesBatch`, `QueuesUpstream`, `QueuesDownstream`, `ReceiveQueueMessages`, `AckAllQueueMessages` | [`super::queues`] |
//! | `QueuesInfo` | here, from the queues' channel list |
//! | `StreamQueueMessage` (legacy single-message stream; kubemq-js's `transaction()` uses it) | [`super::queue_stream`] |
use super::auth::{authorize, CallIdentity, StreamAuthz};
use super::bridge::{Bridge, Limits};
use super::{events, pb, queue_stream, queues, rpc, BoxStream};
use crate::auth::{Access, Auth};
use crate::mesh::handle::ArrayHandle;
use crate::model::Pattern;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};
use tonic::{Request, Response, Status, Streaming};

/// What `Ping` reports as `Version`: the KubeMQ server API level stompgate implements, with its
/// own name and version as semver build metadata. SDKs compare the numeric prefix with the
/// range they were tested against (Python 4.1.5: 2.4.0–2.6.0) and warn on every connect when it
/// is outside; a bare `0.1.0` would trigger that warning.
pub const PING_VERSION: &str = concat!("2.6.0+stompgate.", env!("CARGO_PKG_VERSION"));

/// Implements `kubemq_server::Kubemq` on top of the array.
pub struct KubemqService {
    bridge: Arc<Bridge>,
    host: String,
    /// Unix seconds when this process started (what `Ping` reports as `ServerStartTime`).
    started_unix_secs: i64,
    /// `--authz-file` rules, checked on every call that names a channel (see [`super::auth`]).
    auth: Auth,
}

impl KubemqService {
    pub fn new(array: ArrayHandle, limits: Limits, auth: Auth) -> Self {
        let started_unix_secs = process_start_unix_secs().unwrap_or_else(now_unix_secs);
        KubemqService { bridge: Bridge::new(array, limits), host: crate::wire::host_name().unwrap_or_else(|| "stompgate".into()), started_unix_secs, auth }
    }

    /// [`authorize`] for a request `r`'s (pattern, channel, access).
    fn check<T>(&self, r: &Request<T>, declared: &str, pattern: Pattern, channel: &str, access: Access) -> Result<(), Status> {
        authorize(&self.auth, r.extensions().get::<CallIdentity>(), declared, pattern, channel, access)
    }

    /// The per-message checker of a stream call `r` (its messages name their channels).
    fn stream_authz<T>(&self, r: &Request<T>) -> StreamAuthz {
        StreamAuthz::new(&self.auth, r.extensions().get::<CallIdentity>())
    }
}

/// The pattern a `Subscribe` names (unknown types are left to the handler to refuse).
fn subscribe_pattern(s: &pb::Subscribe) -> Option<Pattern> {
    match s.subscribe_type_data {
        1 => Some(Pattern::Events),
        2 => Some(Pattern::EventsStore),
        3 => Some(Pattern::Commands),
        4 => Some(Pattern::Queries),
        _ => None,
    }
}

#[tonic::async_trait]
impl pb::kubemq_server::Kubemq for KubemqService {
    async fn send_event(&self, r: Request<pb::Event>) -> Result<Response<pb::Result>, Status> {
        let pattern = if r.get_ref().store { Pattern::EventsStore } else { Pattern::Events };
        self.check(&r, &r.get_ref().client_id, pattern, &r.get_ref().channel, Access::Write)?;
        events::send_event(&self.bridge, r.into_inner()).await.map(Response::new)
    }

    type SendEventsStreamStream = BoxStream<pb::Result>;
    async fn send_events_stream(&self, r: Request<Streaming<pb::Event>>) -> Result<Response<Self::SendEventsStreamStream>, Status> {
        let authz = self.stream_authz(&r);
        Ok(Response::new(events::send_events_stream(Arc::clone(&self.bridge), r.into_inner(), authz)))
    }

    type SubscribeToEventsStream = BoxStream<pb::EventReceive>;
    async fn subscribe_to_events(&self, r: Request<pb::Subscribe>) -> Result<Response<Self::SubscribeToEventsStream>, Status> {
        if let Some(p) = subscribe_pattern(r.get_ref()) {
            self.check(&r, &r.get_ref().client_id, p, &r.get_ref().channel, Access::Read)?;
        }
        events::subscribe(Arc::clone(&self.bridge), r.into_inner()).await.map(Response::new)
    }

    type SubscribeToRequestsStream = BoxStream<pb::Request>;
    async fn subscribe_to_requests(&self, r: Request<pb::Subscribe>) -> Result<Response<Self::SubscribeToRequestsStream>, Status> {
        if let Some(p) = subscribe_pattern(r.get_ref()) {
            self.check(&r, &r.get_ref().client_id, p, &r.get_ref().channel, Access::Read)?;
        }
        rpc::subscribe(Arc::clone(&self.bridge), r.into_inner()).await.map(Response::new)
    }

    async fn send_request(&self, r: Request<pb::Request>) -> Result<Response<pb::Response>, Status> {
        let pattern = if r.get_ref().request_type_data == 2 { Pattern::Queries } else { Pattern::Commands };
        self.check(&r, &r.get_ref().client_id, pattern, &r.get_ref().channel, Access::Write)?;
        rpc::request(&self.bridge, r.into_inner()).await.map(Response::new)
    }

    async fn send_response(&self, r: Request<pb::Response>) -> Result<Response<pb::Empty>, Status> {
        rpc::respond(&self.bridge, r.into_inner()).map(Response::new)
    }

    async fn send_queue_message(&self, r: Request<pb::QueueMessage>) -> Result<Response<pb::SendQueueMessageResult>, Status> {
        self.check(&r, &r.get_ref().client_id, Pattern::Queues, &r.get_ref().channel, Access::Write)?;
        Ok(Response::new(queues::send_one(&self.bridge, r.into_inner()).await))
    }

    async fn send_queue_messages_batch(&self, r: Request<pb::QueueMessagesBatchRequest>) -> Result<Response<pb::QueueMessagesBatchResponse>, Status> {
        for m in &r.get_ref().messages {
            self.check(&r, &m.client_id, Pattern::Queues, &m.channel, Access::Write)?;
        }
        queues::send_batch(&self.bridge, r.into_inner()).await.map(Response::new)
    }

    async fn receive_queue_messages(&self, r: Request<pb::ReceiveQueueMessagesRequest>) -> Result<Response<pb::ReceiveQueueMessagesResponse>, Status> {
        self.check(&r, &r.get_ref().client_id, Pattern::Queues, &r.get_ref().channel, Access::Read)?;
        Ok(Response::new(queues::receive(&self.bridge, r.into_inner()).await))
    }

    type StreamQueueMessageStream = BoxStream<pb::StreamQueueMessagesResponse>;
    async fn stream_queue_message(&self, r: Request<Streaming<pb::StreamQueueMessagesRequest>>) -> Result<Response<Self::StreamQueueMessageStream>, Status> {
        let authz = self.stream_authz(&r);
        Ok(Response::new(queue_stream::stream(Arc::clone(&self.bridge), r.into_inner(), authz)))
    }

    async fn ack_all_queue_messages(&self, r: Request<pb::AckAllQueueMessagesRequest>) -> Result<Response<pb::AckAllQueueMessagesResponse>, Status> {
        self.check(&r, &r.get_ref().client_id, Pattern::Queues, &r.get_ref().channel, Access::Read)?;
        Ok(Response::new(queues::ack_all(&self.bridge, r.into_inner()).await))
    }

    async fn ping(&self, _: Request<pb::Empty>) -> Result<Response<pb::PingResult>, Status> {
        Ok(Response::new(pb::PingResult {
            host: self.host.clone(),
            version: PING_VERSION.into(),
            server_start_time: self.started_unix_secs,
            server_up_time_seconds: (now_unix_secs() - self.started_unix_secs).max(0),
        }))
    }

    type QueuesDownstreamStream = BoxStream<pb::QueuesDownstreamResponse>;
    async fn queues_downstream(&self, r: Request<Streaming<pb::QueuesDownstreamRequest>>) -> Result<Response<Self::QueuesDownstreamStream>, Status> {
        let authz = self.stream_authz(&r);
        Ok(Response::new(queues::downstream(Arc::clone(&self.bridge), r.into_inner(), authz)))
    }

    type QueuesUpstreamStream = BoxStream<pb::QueuesUpstreamResponse>;
    async fn queues_upstream(&self, r: Request<Streaming<pb::QueuesUpstreamRequest>>) -> Result<Response<Self::QueuesUpstreamStream>, Status> {
        let authz = self.stream_authz(&r);
        Ok(Response::new(queues::upstream(Arc::clone(&self.bridge), r.into_inner(), authz)))
    }

    async fn queues_info(&self, r: Request<pb::QueuesInfoRequest>) -> Result<Response<pb::QueuesInfoResponse>, Status> {
        Ok(Response::new(queues::info(&self.bridge, r.into_inner()).await))
    }
}

fn now_unix_secs() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs() as i64)
}

/// When this process started, in Unix seconds: boot time (`btime` in /proc/stat) plus the
/// process's `starttime` (field 22 of /proc/self/stat, in clock ticks since boot). None off Linux
/// or if /proc is unreadable.
fn process_start_unix_secs() -> Option<i64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // The command name (field 2) may hold spaces and ')'; fields after the last ')' start at 3.
    let after_comm = &stat[stat.rfind(')')? + 1..];
    let start_ticks: i64 = after_comm.split_whitespace().nth(22 - 3)?.parse().ok()?;
    let boot: i64 = std::fs::read_to_string("/proc/stat").ok()?.lines().find_map(|l| l.strip_prefix("btime ")?.trim().parse().ok())?;
    // SAFETY: sysconf has no preconditions.
    let ticks_per_sec = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    (ticks_per_sec > 0).then(|| boot + start_ticks / ticks_per_sec as i64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn process_start_is_in_the_past_and_recent() {
        let start = process_start_unix_secs().expect("/proc readable on Linux");
        let now = now_unix_secs();
        assert!(start <= now && now - start < 24 * 3600, "start {start}, now {now}");
    }
}
