//! The `kubemq.kubemq` service: which RPCs stompgate answers.
//!
//! | RPC | Answer |
//! |---|---|
//! | `Ping` | `PingResult` (host, crate version, start time, uptime) |
//! | every other RPC | `UNIMPLEMENTED` at once; streaming RPCs return the status instead of a stream and never read the request stream |
use super::pb;
use crate::runtime::handle::ArrayHandle;
use futures_lite::Stream;
use std::pin::Pin;
use std::time::{SystemTime, UNIX_EPOCH};
use tonic::{Request, Response, Status, Streaming};

/// A server stream of `T` (what a streaming RPC returns once implemented).
pub type BoxStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send + 'static>>;

/// Implements `kubemq_server::Kubemq` on top of the array.
pub struct KubemqService {
    /// The array the RPCs will publish into and subscribe from; unused until they are implemented.
    #[allow(dead_code)]
    array: ArrayHandle,
    host: String,
    /// Unix seconds when this process started (what `Ping` reports as `ServerStartTime`).
    started_unix_secs: i64,
}

impl KubemqService {
    pub fn new(array: ArrayHandle) -> Self {
        let started_unix_secs = process_start_unix_secs().unwrap_or_else(now_unix_secs);
        KubemqService { array, host: host_name().unwrap_or_else(|| "stompgate".into()), started_unix_secs }
    }
}

/// The status for an RPC stompgate does not serve yet (clients treat UNIMPLEMENTED as final,
/// not retryable).
fn unsupported(rpc: &str) -> Status {
    Status::unimplemented(format!("{rpc} is not supported by stompgate yet"))
}

#[tonic::async_trait]
impl pb::kubemq_server::Kubemq for KubemqService {
    async fn send_event(&self, _: Request<pb::Event>) -> Result<Response<pb::Result>, Status> {
        Err(unsupported("SendEvent"))
    }

    type SendEventsStreamStream = BoxStream<pb::Result>;
    async fn send_events_stream(&self, _: Request<Streaming<pb::Event>>) -> Result<Response<Self::SendEventsStreamStream>, Status> {
        Err(unsupported("SendEventsStream"))
    }

    type SubscribeToEventsStream = BoxStream<pb::EventReceive>;
    async fn subscribe_to_events(&self, _: Request<pb::Subscribe>) -> Result<Response<Self::SubscribeToEventsStream>, Status> {
        Err(unsupported("SubscribeToEvents"))
    }

    type SubscribeToRequestsStream = BoxStream<pb::Request>;
    async fn subscribe_to_requests(&self, _: Request<pb::Subscribe>) -> Result<Response<Self::SubscribeToRequestsStream>, Status> {
        Err(unsupported("SubscribeToRequests"))
    }

    async fn send_request(&self, _: Request<pb::Request>) -> Result<Response<pb::Response>, Status> {
        Err(unsupported("SendRequest"))
    }

    async fn send_response(&self, _: Request<pb::Response>) -> Result<Response<pb::Empty>, Status> {
        Err(unsupported("SendResponse"))
    }

    async fn send_queue_message(&self, _: Request<pb::QueueMessage>) -> Result<Response<pb::SendQueueMessageResult>, Status> {
        Err(unsupported("SendQueueMessage"))
    }

    async fn send_queue_messages_batch(&self, _: Request<pb::QueueMessagesBatchRequest>) -> Result<Response<pb::QueueMessagesBatchResponse>, Status> {
        Err(unsupported("SendQueueMessagesBatch"))
    }

    async fn receive_queue_messages(&self, _: Request<pb::ReceiveQueueMessagesRequest>) -> Result<Response<pb::ReceiveQueueMessagesResponse>, Status> {
        Err(unsupported("ReceiveQueueMessages"))
    }

    type StreamQueueMessageStream = BoxStream<pb::StreamQueueMessagesResponse>;
    async fn stream_queue_message(&self, _: Request<Streaming<pb::StreamQueueMessagesRequest>>) -> Result<Response<Self::StreamQueueMessageStream>, Status> {
        Err(unsupported("StreamQueueMessage"))
    }

    async fn ack_all_queue_messages(&self, _: Request<pb::AckAllQueueMessagesRequest>) -> Result<Response<pb::AckAllQueueMessagesResponse>, Status> {
        Err(unsupported("AckAllQueueMessages"))
    }

    async fn ping(&self, _: Request<pb::Empty>) -> Result<Response<pb::PingResult>, Status> {
        Ok(Response::new(pb::PingResult {
            host: self.host.clone(),
            version: env!("CARGO_PKG_VERSION").into(),
            server_start_time: self.started_unix_secs,
            server_up_time_seconds: (now_unix_secs() - self.started_unix_secs).max(0),
        }))
    }

    type QueuesDownstreamStream = BoxStream<pb::QueuesDownstreamResponse>;
    async fn queues_downstream(&self, _: Request<Streaming<pb::QueuesDownstreamRequest>>) -> Result<Response<Self::QueuesDownstreamStream>, Status> {
        Err(unsupported("QueuesDownstream"))
    }

    type QueuesUpstreamStream = BoxStream<pb::QueuesUpstreamResponse>;
    async fn queues_upstream(&self, _: Request<Streaming<pb::QueuesUpstreamRequest>>) -> Result<Response<Self::QueuesUpstreamStream>, Status> {
        Err(unsupported("QueuesUpstream"))
    }

    async fn queues_info(&self, _: Request<pb::QueuesInfoRequest>) -> Result<Response<pb::QueuesInfoResponse>, Status> {
        Err(unsupported("QueuesInfo"))
    }
}

fn now_unix_secs() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs() as i64)
}

/// The kernel's host name, if it is set and UTF-8.
fn host_name() -> Option<String> {
    let mut buf = [0u8; 256];
    // SAFETY: the pointer and length describe `buf`, which outlives the call.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc != 0 {
        return None;
    }
    let len = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    let name = std::str::from_utf8(&buf[..len]).ok()?.trim();
    (!name.is_empty()).then(|| name.to_string())
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
