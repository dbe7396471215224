//! The KubeMQ gRPC side of the tests: a harness with the gateway's gRPC API, a tonic client,
//! and helpers that bound every call and stream read by `PROMPT`.
use super::TestServer;
use std::collections::HashMap;
use std::fmt::Debug;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
pub use stompgate::wire::pb;
use stompgate::wire::pb::kubemq_client::KubemqClient;
use tokio::sync::mpsc;
use tonic::transport::Channel;
pub use tonic::{Code, Status, Streaming};

/// How long any single gRPC call or stream read may take before the test fails.
pub const PROMPT: Duration = Duration::from_secs(5);
/// How long a test waits to be sure nothing (more) arrives.
pub const QUIET: Duration = Duration::from_millis(300);
/// The ClientID the helpers put on requests.
pub const CLIENT_ID: &str = "grpc-test";

pub type Client = KubemqClient<Channel>;

/// A two-core gateway (`TestServer`) plus its KubeMQ gRPC API on an ephemeral loopback
/// port, and a tokio runtime for the test's clients. Dropping it closes the clients first,
/// so the gRPC server's graceful shutdown does not wait on them.
pub struct GrpcHarness {
    rt: Option<tokio::runtime::Runtime>,
    grpc: Option<stompgate::grpc::GrpcServer>,
    pub addr: SocketAddr,
    pub server: TestServer,
}

impl GrpcHarness {
    pub fn start() -> GrpcHarness {
        Self::start_limited(stompgate::grpc::Limits::default())
    }

    /// With explicit gRPC limits (a small subscriber buffer, say).
    pub fn start_limited(limits: stompgate::grpc::Limits) -> GrpcHarness {
        let server = TestServer::start();
        let grpc = stompgate::grpc::start_with("127.0.0.1:0".parse().unwrap(), 2, server.array(), limits).expect("gRPC server starts");
        let addr = grpc.local_addr();
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        GrpcHarness { rt: Some(rt), grpc: Some(grpc), addr, server }
    }

    /// Runs the test body on the client runtime.
    pub fn run<F: Future>(&self, f: F) -> F::Output {
        self.rt.as_ref().unwrap().block_on(f)
    }

    /// A new client on its own HTTP/2 connection.
    pub async fn connect(&self) -> Client {
        let endpoint = tonic::transport::Endpoint::from_shared(format!("http://{}", self.addr)).unwrap();
        let channel = within("connect", endpoint.connect()).await.expect("connect");
        KubemqClient::new(channel)
    }

    /// A raw channel (for calls through `tonic::client::Grpc` with hand-made messages).
    pub async fn channel(&self) -> Channel {
        let endpoint = tonic::transport::Endpoint::from_shared(format!("http://{}", self.addr)).unwrap();
        within("connect", endpoint.connect()).await.expect("connect")
    }
}

impl Drop for GrpcHarness {
    fn drop(&mut self) {
        if let Some(rt) = self.rt.take() {
            rt.shutdown_timeout(Duration::from_millis(500));
        }
        if let Some(g) = self.grpc.take() {
            g.shutdown();
        }
    }
}

/// `f`, or a test failure naming `what` if it takes longer than [`PROMPT`].
pub async fn within<T>(what: &str, f: impl Future<Output = T>) -> T {
    match tokio::time::timeout(PROMPT, f).await {
        Ok(v) => v,
        Err(_) => panic!("{what}: no answer within {PROMPT:?}"),
    }
}

/// A call that must succeed promptly; its message.
pub async fn ok<T>(what: &str, f: impl Future<Output = Result<tonic::Response<T>, Status>>) -> T {
    match within(what, f).await {
        Ok(r) => r.into_inner(),
        Err(s) => panic!("{what}: failed with {s:?}"),
    }
}

/// A call that must fail promptly; its status.
pub async fn fails<T: Debug>(what: &str, f: impl Future<Output = Result<tonic::Response<T>, Status>>) -> Status {
    match within(what, f).await {
        Ok(r) => panic!("{what}: expected an error, got {:?}", r.into_inner()),
        Err(s) => s,
    }
}

/// Asserts `status` is `code` with KubeMQ's `Error <n>: …` text.
pub fn assert_kubemq_status(status: &Status, code: Code, n: u16) {
    assert_eq!(status.code(), code, "{status:?}");
    assert!(status.message().starts_with(&format!("Error {n}: ")), "expected Error {n}, got {status:?}");
}

/// Asserts an in-band error string is KubeMQ's `Error <n>: …`.
pub fn assert_kubemq_error(error: &str, n: u16) {
    assert!(error.starts_with(&format!("Error {n}: ")), "expected Error {n}, got {error:?}");
}

/// The next message of a server stream, within [`PROMPT`].
pub async fn next<T>(s: &mut Streaming<T>) -> T {
    match within("stream read", s.message()).await {
        Ok(Some(m)) => m,
        Ok(None) => panic!("stream ended"),
        Err(e) => panic!("stream failed: {e:?}"),
    }
}

/// The next `n` messages of a server stream.
pub async fn take<T>(s: &mut Streaming<T>, n: usize) -> Vec<T> {
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        out.push(next(s).await);
    }
    out
}

/// Asserts nothing arrives on the stream for [`QUIET`] (and it does not end or fail).
pub async fn quiet<T: Debug>(s: &mut Streaming<T>) {
    if let Ok(r) = tokio::time::timeout(QUIET, s.message()).await {
        panic!("expected nothing on the stream, got {r:?}");
    }
}

/// Asserts nothing arrives on any of the streams for [`QUIET`] (one wait for all of them:
/// anything sent meanwhile is buffered, so a final non-blocking poll sees it).
pub async fn quiet_all<T: Debug>(streams: &mut [&mut Streaming<T>]) {
    tokio::time::sleep(QUIET).await;
    for (i, s) in streams.iter_mut().enumerate() {
        if let Ok(r) = tokio::time::timeout(Duration::ZERO, s.message()).await {
            panic!("expected nothing on stream {i}, got {r:?}");
        }
    }
}

/// A request id unique in this process.
pub fn rid(prefix: &str) -> String {
    static N: AtomicU64 = AtomicU64::new(1);
    format!("{prefix}-{}", N.fetch_add(1, Ordering::Relaxed))
}

/// Wire map entries (key and value both set, as stompgate writes them), in the given order:
/// what a message from the gateway carries when `pairs` is sorted by key.
pub fn tags(pairs: &[(&str, &str)]) -> Vec<pb::TagsEntry> {
    pairs.iter().map(|(k, v)| stompgate::wire::convert::entry(k.to_string(), v.to_string())).collect()
}

/// A gateway message's tag entries as a map, for order-free comparisons (STOMP-origin tags keep
/// their header order). Panics on an entry without its key or value field: stompgate writes both.
pub fn map_of(entries: &[pb::TagsEntry]) -> HashMap<String, String> {
    entries
        .iter()
        .map(|e| match (&e.key, &e.value) {
            (Some(k), Some(v)) => (k.clone(), v.clone()),
            _ => panic!("a tag entry without its key or value field: {e:?}"),
        })
        .collect()
}

/// The same pairs as a generated `map<string, string>` field holds them (clients whose schema
/// has the map: the hand-written superset messages of `grpc_robustness`).
pub fn tag_map(pairs: &[(&str, &str)]) -> HashMap<String, String> {
    pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

/// An Events (or Events-Store, `store`) event from [`CLIENT_ID`].
pub fn event(channel: &str, body: &[u8], store: bool) -> pb::Event {
    pb::Event { client_id: CLIENT_ID.into(), channel: channel.into(), body: body.to_vec(), store, ..Default::default() }
}

/// `SubscribeToEvents`/`SubscribeToRequests` request of `kind` (1 Events, 2 Events-Store,
/// 3 Commands, 4 Queries).
pub fn subscription(kind: i32, channel: &str) -> pb::Subscribe {
    pb::Subscribe { subscribe_type_data: kind, client_id: CLIENT_ID.into(), channel: channel.into(), ..Default::default() }
}

/// An Events-Store subscription from start `(type, value)`.
pub fn store_subscription(channel: &str, start: i32, value: i64) -> pb::Subscribe {
    pb::Subscribe { events_store_type_data: start, events_store_type_value: value, ..subscription(2, channel) }
}

/// A queue message from [`CLIENT_ID`].
pub fn queue_message(channel: &str, body: &[u8]) -> pb::QueueMessage {
    pb::QueueMessage { client_id: CLIENT_ID.into(), channel: channel.into(), body: body.to_vec(), ..Default::default() }
}

/// A command (`kind` 1) or query (2) with a timeout in ms.
pub fn request(kind: i32, channel: &str, body: &[u8], timeout_ms: i32) -> pb::Request {
    pb::Request {
        request_id: rid("req"),
        request_type_data: kind,
        client_id: CLIENT_ID.into(),
        channel: channel.into(),
        body: body.to_vec(),
        timeout: timeout_ms,
        ..Default::default()
    }
}

/// Subscribes and returns the live stream (the call returns once the subscription is live).
pub async fn subscribe_events(c: &mut Client, s: pb::Subscribe) -> Streaming<pb::EventReceive> {
    ok("SubscribeToEvents", c.subscribe_to_events(s)).await
}

pub async fn subscribe_requests(c: &mut Client, s: pb::Subscribe) -> Streaming<pb::Request> {
    ok("SubscribeToRequests", c.subscribe_to_requests(s)).await
}

pub async fn send_event(c: &mut Client, e: pb::Event) -> pb::Result {
    let r = ok("SendEvent", c.send_event(e)).await;
    assert!(r.sent && r.error.is_empty(), "{r:?}");
    r
}

pub async fn send_queue(c: &mut Client, m: pb::QueueMessage) -> pb::SendQueueMessageResult {
    let r = ok("SendQueueMessage", c.send_queue_message(m)).await;
    assert!(!r.is_error, "{r:?}");
    r
}

/// A request stream the test feeds by hand, for the bidirectional RPCs.
pub fn feed<T: Send + 'static>() -> (mpsc::UnboundedSender<T>, impl futures_lite::Stream<Item = T> + Send + 'static) {
    let (tx, rx) = mpsc::unbounded_channel::<T>();
    let stream = futures_lite::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|m| (m, rx)) });
    (tx, stream)
}

/// `QueuesDownstreamRequestType` values.
pub use stompgate::wire::kind as ds;

/// An open `QueuesDownstream` call.
pub struct Downstream {
    tx: Option<mpsc::UnboundedSender<pb::QueuesDownstreamRequest>>,
    pub rx: Streaming<pb::QueuesDownstreamResponse>,
}

impl Downstream {
    pub async fn open(c: &mut Client) -> Downstream {
        let (tx, requests) = feed();
        let rx = ok("QueuesDownstream", c.queues_downstream(requests)).await;
        Downstream { tx: Some(tx), rx }
    }

    pub fn send(&self, r: pb::QueuesDownstreamRequest) {
        self.tx.as_ref().expect("request stream open").send(r).expect("request stream open");
    }

    /// Half-closes the request stream (the client is done sending).
    pub fn close_requests(&mut self) {
        self.tx = None;
    }

    /// A Get: returns its reply (asserted to be the Get's, by RefRequestId and type).
    pub async fn get(&mut self, channel: &str, max: i32, wait_ms: i32, auto_ack: bool) -> pb::QueuesDownstreamResponse {
        let request_id = rid("get");
        self.send(pb::QueuesDownstreamRequest {
            request_id: request_id.clone(),
            client_id: CLIENT_ID.into(),
            request_type_data: ds::GET,
            channel: channel.into(),
            max_items: max,
            wait_timeout: wait_ms,
            auto_ack,
            ..Default::default()
        });
        let r = self.next().await;
        assert_eq!((r.ref_request_id.as_str(), r.request_type_data), (request_id.as_str(), ds::GET), "{r:?}");
        assert!(!r.is_error, "{r:?}");
        r
    }

    /// A settlement or query of `kind` on transaction `txn`; returns the request id.
    pub fn on_txn(&self, kind: i32, txn: &str, seqs: &[i64], requeue_to: &str) -> String {
        let request_id = rid("ds");
        self.send(pb::QueuesDownstreamRequest {
            request_id: request_id.clone(),
            client_id: CLIENT_ID.into(),
            request_type_data: kind,
            ref_transaction_id: txn.into(),
            sequence_range: seqs.to_vec(),
            re_queue_channel: requeue_to.into(),
            ..Default::default()
        });
        request_id
    }

    /// ActiveOffsets of `txn` (the reply is asserted to match the request).
    pub async fn active_offsets(&mut self, txn: &str) -> Vec<i64> {
        let id = self.on_txn(ds::ACTIVE_OFFSETS, txn, &[], "");
        let r = self.next().await;
        assert_eq!((r.ref_request_id.as_str(), r.request_type_data, r.is_error), (id.as_str(), ds::ACTIVE_OFFSETS, false), "{r:?}");
        r.active_offsets
    }

    /// TransactionStatus of `txn`: whether it is complete.
    pub async fn complete(&mut self, txn: &str) -> bool {
        let id = self.on_txn(ds::TRANSACTION_STATUS, txn, &[], "");
        let r = self.next().await;
        assert_eq!((r.ref_request_id.as_str(), r.request_type_data, r.is_error), (id.as_str(), ds::TRANSACTION_STATUS, false), "{r:?}");
        r.transaction_complete
    }

    pub async fn next(&mut self) -> pb::QueuesDownstreamResponse {
        next(&mut self.rx).await
    }

    pub async fn quiet(&mut self) {
        quiet(&mut self.rx).await
    }
}

/// Sequences of received queue messages.
pub fn seqs(messages: &[pb::QueueMessage]) -> Vec<i64> {
    messages.iter().map(|m| attrs(m).sequence as i64).collect()
}

/// Bodies of received queue messages, as strings.
pub fn queue_bodies(messages: &[pb::QueueMessage]) -> Vec<String> {
    messages.iter().map(|m| String::from_utf8_lossy(&m.body).into_owned()).collect()
}

/// Receive counts of received queue messages.
pub fn receive_counts(messages: &[pb::QueueMessage]) -> Vec<i32> {
    messages.iter().map(|m| attrs(m).receive_count).collect()
}

pub fn attrs(m: &pb::QueueMessage) -> &pb::QueueMessageAttributes {
    m.attributes.as_ref().expect("a received queue message carries attributes")
}

/// A channel-management query (kubemq-grpc.md §6.4).
pub fn management(metadata: &str, tag_pairs: &[(&str, &str)]) -> pb::Request {
    pb::Request { metadata: metadata.into(), tags: tags(tag_pairs), ..request(2, "kubemq.cluster.internal.requests", b"", 10_000) }
}

/// `list-channels` of `channel_type` filtered by `search`: the decoded JSON array.
pub async fn list_channels(c: &mut Client, channel_type: &str, search: &str) -> Vec<serde_json::Value> {
    let r = ok("list-channels", c.send_request(management("list-channels", &[("channel_type", channel_type), ("channel_search", search)]))).await;
    assert!(r.executed && r.error.is_empty(), "{r:?}");
    match serde_json::from_slice(&r.body).expect("list body is JSON") {
        serde_json::Value::Array(items) => items,
        other => panic!("list body is not an array: {other}"),
    }
}

/// Polls `list-channels` until `channel` (exact name) is listed or not (`present`), failing
/// after [`PROMPT`].
pub async fn wait_listed(c: &mut Client, channel_type: &str, channel: &str, present: bool) {
    let deadline = tokio::time::Instant::now() + PROMPT;
    loop {
        let items = list_channels(c, channel_type, channel).await;
        let listed = items.iter().any(|i| i["name"] == channel);
        if listed == present {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{channel_type} channel {channel} still {} after {PROMPT:?}: {items:?}",
            if present { "absent" } else { "listed" }
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
