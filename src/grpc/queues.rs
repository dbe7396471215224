//! Queues over gRPC: `SendQueueMessage`, `SendQueueMessagesBatch`, `QueuesUpstream` (sending),
//! `QueuesDownstream` (transactional receive), `ReceiveQueueMessages` (pull / peek) and
//! `AckAllQueueMessages` (purge).
//!
//! Sends are confirmed by the queue's owner (appended; held while its consumers are far behind,
//! the same pacing a receipted STOMP SEND gets). Receives are pulls on the owner
//! (`CoreMsg::QueuePull`); a downstream stream holds its reserved messages under one holder
//! `SubRef` and settles them by tag. When the stream ends, everything it still holds goes back
//! to the head of its queue.
use super::auth::{StreamAuthz, ACCESS_DENIED};
use super::bridge::{Bridge, HOLDER_CORE};
use super::stream::ChannelStream;
use super::{pb, validate, BoxStream};
use crate::auth::Access;
use crate::mesh::confirm::{Confirmation, Outcome, NOT_STORED, QUEUE_FULL, STORE_FULL};
use crate::mesh::msg::{CoreId, CoreMsg, Mailbox, PullMode, PullRequest, PullResult, QueueMeta, Settle, SettleArgs, SubNo, SubRef};
use crate::model::{now_unix_ns, Channel, Message, Pattern};
use crate::wire::convert::{self, Incoming};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tonic::{Status, Streaming};

const NANOS: i64 = 1_000_000_000;
/// `WaitTimeSeconds` 0 means KubeMQ's default wait (`DefaultWaitTimeoutSeconds`).
const DEFAULT_WAIT: Duration = Duration::from_secs(1);

/// A validated queue message and what its send result reports.
struct Prepared {
    msg: Arc<Message>,
    meta: Option<Box<QueueMeta>>,
    result: pb::SendQueueMessageResult,
}

fn prepare(b: &Bridge, m: pb::QueueMessage, now_ns: i64) -> Result<Prepared, validate::Invalid> {
    validate::client_id(&m.client_id)?;
    validate::queue(&m.channel)?;
    let policy = m.policy.clone().unwrap_or_default();
    if !(0..=validate::MAX_POLICY_SECONDS).contains(&policy.expiration_seconds) {
        return Err(validate::BAD_EXPIRATION);
    }
    if !(0..=validate::MAX_POLICY_SECONDS).contains(&policy.delay_seconds) {
        return Err(validate::BAD_DELAY);
    }
    if !(0..=validate::MAX_RECEIVE_COUNT).contains(&policy.max_receive_count) {
        return Err(validate::BAD_MAX_RECEIVE);
    }
    if !policy.max_receive_queue.is_empty() {
        validate::queue(&policy.max_receive_queue)?;
    }
    // Empty messages are accepted, as for events (see `super::events::publish`).
    let incoming = Incoming::from(m);
    let msg = Arc::new(incoming.into_message(b.unique_id("q"), now_ns));
    let delay = i64::from(policy.delay_seconds) * NANOS;
    let delayed_to_ns = if delay > 0 { now_ns + delay } else { 0 };
    let expires_at_ns = if policy.expiration_seconds > 0 { now_ns + delay + i64::from(policy.expiration_seconds) * NANOS } else { 0 };
    let has_policy = expires_at_ns != 0 || delayed_to_ns != 0 || policy.max_receive_count != 0 || !policy.max_receive_queue.is_empty();
    let meta = has_policy.then(|| {
        Box::new(QueueMeta {
            expires_at_ns,
            delayed_to_ns,
            max_receive: policy.max_receive_count as u32,
            dead_letter: (!policy.max_receive_queue.is_empty()).then(|| convert::channel_of(&policy.max_receive_queue)),
            rerouted_from: None,
        })
    });
    let result = pb::SendQueueMessageResult {
        message_id: convert::string_of(&msg.id),
        sent_at: now_ns,
        expiration_at: expires_at_ns,
        delayed_to: delayed_to_ns,
        ..Default::default()
    };
    Ok(Prepared { msg, meta, result })
}

fn error_result(message_id: String, e: &str) -> pb::SendQueueMessageResult {
    pb::SendQueueMessageResult { message_id, is_error: true, error: e.to_string(), ..Default::default() }
}

/// Messages sent to their owners, with the confirmations still to wait for.
type InFlight = Vec<(pb::SendQueueMessageResult, Option<Confirmation>)>;

/// Sends messages in order, all at once, without waiting (validation failures, and messages
/// `allowed` refuses, become in-band error results right away).
fn start_all(b: &Bridge, messages: Vec<pb::QueueMessage>, allowed: &mut dyn FnMut(&pb::QueueMessage) -> bool) -> InFlight {
    let now_ns = now_unix_ns();
    let mut pending = Vec::with_capacity(messages.len());
    for m in messages {
        let id = m.message_id.clone();
        if !allowed(&m) {
            pending.push((error_result(id, ACCESS_DENIED), None));
            continue;
        }
        match prepare(b, m, now_ns) {
            Ok(p) => {
                let owner = b.owner_of(Pattern::Queues, &p.msg.channel);
                let Prepared { msg, meta, result } = p;
                pending.push((result, Some(b.send_confirmed(owner, move |t| CoreMsg::QueueSend { msg, meta, done: Some(t) }))));
            }
            Err(e) => pending.push((error_result(id, &e.message()), None)),
        }
    }
    pending
}

/// One result per message, once its owner confirmed it (in-band error if it never did).
async fn finish_all(pending: InFlight) -> Vec<pb::SendQueueMessageResult> {
    let mut results = Vec::with_capacity(pending.len());
    for (result, confirm) in pending {
        let outcome = match confirm {
            Some(confirmation) => confirmation.outcome().await,
            None => Outcome::Confirmed,
        };
        match outcome {
            Outcome::Confirmed => results.push(result),
            Outcome::QueueFull => results.push(error_result(result.message_id, QUEUE_FULL)),
            Outcome::NotStored => results.push(error_result(result.message_id, NOT_STORED)),
            Outcome::StoreFull => results.push(error_result(result.message_id, STORE_FULL)),
            Outcome::NotConfirmed => results.push(error_result(result.message_id, "Error 130: queue send was not confirmed")),
        }
    }
    results
}

/// Sends messages (all in flight at once) and reports one result per message. Validation and
/// confirmation failures are in-band (`IsError`), as in KubeMQ.
async fn send_all(b: &Bridge, messages: Vec<pb::QueueMessage>) -> Vec<pb::SendQueueMessageResult> {
    // The unary calls are authorized whole, before they get here.
    finish_all(start_all(b, messages, &mut |_| true)).await
}

pub async fn send_one(b: &Bridge, m: pb::QueueMessage) -> pb::SendQueueMessageResult {
    send_all(b, vec![m]).await.pop().unwrap_or_default()
}

pub async fn send_batch(b: &Bridge, r: pb::QueueMessagesBatchRequest) -> Result<pb::QueueMessagesBatchResponse, Status> {
    if r.messages.is_empty() {
        return Err(Status::invalid_argument("Error 131: batch has no messages"));
    }
    let results = send_all(b, r.messages).await;
    let have_errors = results.iter().any(|r| r.is_error);
    Ok(pb::QueueMessagesBatchResponse { batch_id: r.batch_id, results, have_errors })
}

/// `QueuesUpstream`: one response per request, in request order. Pipelined: a reader sends
/// each request's messages to their owners as it arrives, and a writer answers each request
/// once its messages are confirmed, so a stream is not one round trip per request.
///
/// With `--authz-file`, each message is checked (Write on its queue); a denied one gets its
/// own error result (`IsError`, `Error: "access denied"`) beside the others' results.
pub fn upstream(b: Arc<Bridge>, mut inbound: Streaming<pb::QueuesUpstreamRequest>, mut authz: StreamAuthz) -> BoxStream<pb::QueuesUpstreamResponse> {
    /// Requests sent and not yet answered (bounds what one stream has in flight).
    const WINDOW: usize = 1024;
    let (tx, rx) = mpsc::channel(256);
    let (in_flight, mut confirmed) = mpsc::channel::<(String, Result<InFlight, &'static str>)>(WINDOW);
    tokio::spawn(async move {
        while let Ok(Some(req)) = inbound.message().await {
            let sent = if req.messages.is_empty() {
                Err("Error 131: request has no messages")
            } else {
                Ok(start_all(&b, req.messages, &mut |m| authz.allows(&m.client_id, Pattern::Queues, &m.channel, Access::Write)))
            };
            if in_flight.send((req.request_id, sent)).await.is_err() {
                break;
            }
        }
    });
    tokio::spawn(async move {
        while let Some((request_id, sent)) = confirmed.recv().await {
            let response = match sent {
                Ok(pending) => {
                    pb::QueuesUpstreamResponse { ref_request_id: request_id, results: finish_all(pending).await, is_error: false, error: String::new() }
                }
                Err(e) => pb::QueuesUpstreamResponse { ref_request_id: request_id, is_error: true, error: e.into(), ..Default::default() },
            };
            if tx.send(response).await.is_err() {
                break;
            }
        }
    });
    Box::pin(ChannelStream::new(rx, Ok, ()))
}

/// Sends a pull to the queue's owner and waits for its answer.
async fn pull(b: &Bridge, channel: Channel, holder: SubRef, max: u32, wait: Duration, mode: PullMode) -> Option<PullResult> {
    let (reply, answer) = Mailbox::new();
    let owner = b.owner_of(Pattern::Queues, &channel);
    if !b.array.send(owner, CoreMsg::QueuePull(Box::new(PullRequest { channel, holder, max, wait, mode, token: 0, reply }))) {
        return None;
    }
    answer.recv_async().await.ok()
}

fn wait_of(seconds: i32) -> Result<Duration, validate::Invalid> {
    match seconds {
        0 => Ok(DEFAULT_WAIT),
        s if (1..=validate::MAX_WAIT_SECONDS).contains(&s) => Ok(Duration::from_secs(s as u64)),
        _ => Err(validate::BAD_WAIT),
    }
}

/// `ReceiveQueueMessages`: a destructive pull, or a peek (`IsPeak`). Errors are in-band.
pub async fn receive(b: &Bridge, r: pb::ReceiveQueueMessagesRequest) -> pb::ReceiveQueueMessagesResponse {
    let mut response = pb::ReceiveQueueMessagesResponse { request_id: r.request_id.clone(), is_peak: r.is_peak, ..Default::default() };
    let checked = (|| {
        validate::client_id(&r.client_id)?;
        validate::queue(&r.channel)?;
        if !(1..=validate::MAX_PULL_MESSAGES).contains(&r.max_number_of_messages) {
            return Err(validate::BAD_MAX_MESSAGES);
        }
        wait_of(r.wait_time_seconds)
    })();
    let wait = match checked {
        Ok(wait) => wait,
        Err(e) => {
            response.is_error = true;
            response.error = e.message();
            return response;
        }
    };
    let holder = SubRef { core: HOLDER_CORE, conn: b.new_conn(), sub: SubNo(0) };
    let mode = if r.is_peak { PullMode::Peek } else { PullMode::Remove };
    match pull(b, convert::channel_of(&r.channel), holder, r.max_number_of_messages as u32, wait, mode).await {
        Some(result) => {
            response.messages = result.messages.iter().map(convert::queue_message).collect();
            response.messages_received = response.messages.len() as i32;
            response.messages_expired = result.expired as i32;
        }
        None => {
            response.is_error = true;
            response.error = "Error 405: the array is shutting down".into();
        }
    }
    response
}

/// `AckAllQueueMessages`: removes every message ready in the queue now and reports how many.
pub async fn ack_all(b: &Bridge, r: pb::AckAllQueueMessagesRequest) -> pb::AckAllQueueMessagesResponse {
    let mut response = pb::AckAllQueueMessagesResponse { request_id: r.request_id.clone(), ..Default::default() };
    let checked = validate::client_id(&r.client_id).and_then(|()| validate::queue(&r.channel)).and_then(|()| wait_of(r.wait_time_seconds).map(|_| ()));
    if let Err(e) = checked {
        response.is_error = true;
        response.error = e.message();
        return response;
    }
    let holder = SubRef { core: HOLDER_CORE, conn: b.new_conn(), sub: SubNo(0) };
    match pull(b, convert::channel_of(&r.channel), holder, 0, Duration::ZERO, PullMode::Purge).await {
        Some(result) => response.affected_messages = result.purged,
        None => {
            response.is_error = true;
            response.error = "Error 405: the array is shutting down".into();
        }
    }
    response
}

// ---- QueuesDownstream ----

use crate::wire::kind;

/// Messages a Get reserved and not yet settled: sequence → the owner's delivery tag.
pub struct Transaction {
    /// The stream whose Get reserved them (the owner settles by this holder).
    holder: SubRef,
    channel: Channel,
    open: BTreeMap<u64, u64>,
}

/// Open transactions of every downstream stream, by TransactionId. Process-wide because SDKs
/// settle on another stream than the one that got the messages (the async Python client sends
/// NAckAll / ReQueueAll on a fresh stream); a transaction still ends with the stream that
/// opened it.
#[derive(Default)]
pub struct Transactions(std::sync::Mutex<HashMap<String, Transaction>>);

impl Transactions {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Transaction>> {
        self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// A Get sent to its queue's owner, waiting for the answer (`PullResult::token` finds it).
struct PendingGet {
    request_id: String,
    channel: Channel,
    auto_ack: bool,
}

struct Downstream {
    b: Arc<Bridge>,
    holder: SubRef,
    out: mpsc::Sender<pb::QueuesDownstreamResponse>,
    /// The transactions this stream opened (they live in `Bridge::transactions`).
    opened: HashSet<String>,
    /// Every queue this stream reserved from (released when the stream ends).
    channels: HashSet<Channel>,
    /// Where the owners answer this stream's Gets, and the Gets still unanswered by token.
    answers: Mailbox<PullResult>,
    pending: HashMap<u64, PendingGet>,
    next_token: u64,
    /// Each Get (Read on its queue), settlement (Read on the transaction's queue) and requeue
    /// (Write on the target queue) is checked on its own.
    authz: StreamAuthz,
}

fn error_reply(request_id: &str, kind: i32, error: String) -> pb::QueuesDownstreamResponse {
    pb::QueuesDownstreamResponse { ref_request_id: request_id.to_string(), request_type_data: kind, is_error: true, error, ..Default::default() }
}

impl Downstream {
    async fn reply(&self, r: pb::QueuesDownstreamResponse) {
        let _ = self.out.send(r).await;
    }

    fn get(&mut self, r: pb::QueuesDownstreamRequest) -> Option<pb::QueuesDownstreamResponse> {
        let checked = validate::client_id(&r.client_id).and_then(|()| validate::queue(&r.channel));
        if let Err(e) = checked {
            return Some(error_reply(&r.request_id, kind::GET, e.message()));
        }
        if !self.authz.allows(&r.client_id, Pattern::Queues, &r.channel, Access::Read) {
            return Some(error_reply(&r.request_id, kind::GET, ACCESS_DENIED.into()));
        }
        if r.wait_timeout < 0 || r.wait_timeout > validate::MAX_WAIT_SECONDS * 1000 {
            return Some(error_reply(&r.request_id, kind::GET, validate::BAD_WAIT.message()));
        }
        let max = if r.max_items <= 0 { validate::MAX_PULL_MESSAGES } else { r.max_items.min(validate::MAX_PULL_MESSAGES) } as u32;
        let channel = convert::channel_of(&r.channel);
        let mode = if r.auto_ack { PullMode::Remove } else { PullMode::Reserve };
        self.channels.insert(channel.clone());
        self.next_token += 1;
        let token = self.next_token;
        let wait = Duration::from_millis(r.wait_timeout as u64);
        let owner = self.b.owner_of(Pattern::Queues, &channel);
        let req = PullRequest { channel: channel.clone(), holder: self.holder, max, wait, mode, token, reply: self.answers.clone() };
        if !self.b.array.send(owner, CoreMsg::QueuePull(Box::new(req))) {
            return Some(error_reply("", kind::GET, "Error 405: the array is shutting down".into()));
        }
        self.pending.insert(token, PendingGet { request_id: r.request_id, channel, auto_ack: r.auto_ack });
        None
    }

    /// The answer to one of this stream's Gets (none for a token it does not know).
    fn got(&mut self, result: PullResult) -> Option<pb::QueuesDownstreamResponse> {
        let done = self.pending.remove(&result.token)?;
        let transaction_id = self.b.unique_id("t");
        let messages: Vec<pb::QueueMessage> = result.messages.iter().map(convert::queue_message).collect();
        let complete = done.auto_ack || result.messages.is_empty();
        let active: Vec<i64> = if complete { Vec::new() } else { result.messages.iter().map(|m| m.seq as i64).collect() };
        if !complete {
            let open = result.messages.iter().map(|m| (m.seq, m.tag)).collect();
            self.b.transactions.lock().insert(transaction_id.clone(), Transaction { holder: self.holder, channel: done.channel, open });
            self.opened.insert(transaction_id.clone());
        }
        Some(pb::QueuesDownstreamResponse {
            transaction_id,
            ref_request_id: done.request_id,
            request_type_data: kind::GET,
            messages,
            active_offsets: active,
            is_error: false,
            error: String::new(),
            transaction_complete: complete,
            metadata: Vec::new(),
        })
    }

    /// Settles all or some (`range`) of a transaction's open messages.
    fn settle(&mut self, r: &pb::QueuesDownstreamRequest, action: Settle, range: bool) -> Option<pb::QueuesDownstreamResponse> {
        let mut transactions = self.b.transactions.lock();
        let Some(txn) = transactions.get_mut(&r.ref_transaction_id) else {
            return Some(error_reply(&r.request_id, r.request_type_data, "Error 200: transaction is completed or transaction id not found".into()));
        };
        // Transactions are shared by every stream (see `Transactions`): settling one takes
        // Read on its queue, as getting its messages did.
        if !self.authz.allows(&r.client_id, Pattern::Queues, &String::from_utf8_lossy(&txn.channel.0), Access::Read) {
            return Some(error_reply(&r.request_id, r.request_type_data, ACCESS_DENIED.into()));
        }
        let mut tags = Vec::new();
        let mut unknown = Vec::new();
        if range {
            for &seq in &r.sequence_range {
                match u64::try_from(seq).ok().and_then(|s| txn.open.remove(&s)) {
                    Some(tag) => tags.push(tag),
                    None => unknown.push(seq),
                }
            }
        } else {
            tags.extend(std::mem::take(&mut txn.open).into_values());
        }
        let (channel, holder) = (txn.channel.clone(), txn.holder);
        if txn.open.is_empty() {
            transactions.remove(&r.ref_transaction_id);
        }
        drop(transactions);
        if !tags.is_empty() {
            let owner = self.b.owner_of(Pattern::Queues, &channel);
            self.b.array.send(owner, CoreMsg::QueueSettle(Box::new(SettleArgs { channel, sub: holder, tags, action, done: None })));
        }
        (!unknown.is_empty()).then(|| error_reply(&r.request_id, r.request_type_data, format!("Error 123: sequences not in this transaction: {unknown:?}")))
    }

    async fn handle(&mut self, r: pb::QueuesDownstreamRequest) {
        let requeue_target = |authz: &mut StreamAuthz| -> Result<Settle, String> {
            validate::queue(&r.re_queue_channel).map_err(|e| e.message())?;
            if !authz.allows(&r.client_id, Pattern::Queues, &r.re_queue_channel, Access::Write) {
                return Err(ACCESS_DENIED.into());
            }
            Ok(Settle::Requeue(Box::new(convert::channel_of(&r.re_queue_channel))))
        };
        let reply = match r.request_type_data {
            kind::GET => self.get(r),
            kind::ACK_ALL => self.settle(&r, Settle::Ack, false),
            kind::ACK_RANGE => self.settle(&r, Settle::Ack, true),
            kind::NACK_ALL => self.settle(&r, Settle::Nack, false),
            kind::NACK_RANGE => self.settle(&r, Settle::Nack, true),
            kind::REQUEUE_ALL | kind::REQUEUE_RANGE => match requeue_target(&mut self.authz) {
                Ok(action) => self.settle(&r, action, r.request_type_data == kind::REQUEUE_RANGE),
                Err(e) => Some(error_reply(&r.request_id, r.request_type_data, e)),
            },
            kind::ACTIVE_OFFSETS => Some(match self.b.transactions.lock().get(&r.ref_transaction_id) {
                Some(txn) => pb::QueuesDownstreamResponse {
                    transaction_id: r.ref_transaction_id.clone(),
                    ref_request_id: r.request_id.clone(),
                    request_type_data: kind::ACTIVE_OFFSETS,
                    active_offsets: txn.open.keys().map(|&s| s as i64).collect(),
                    ..Default::default()
                },
                None => error_reply(&r.request_id, kind::ACTIVE_OFFSETS, "Error 200: transaction is completed or transaction id not found".into()),
            }),
            kind::TRANSACTION_STATUS => Some(pb::QueuesDownstreamResponse {
                transaction_id: r.ref_transaction_id.clone(),
                ref_request_id: r.request_id.clone(),
                request_type_data: kind::TRANSACTION_STATUS,
                transaction_complete: !self.b.transactions.lock().contains_key(&r.ref_transaction_id),
                ..Default::default()
            }),
            // Closing gives back what is still open, unprocessed (to the head of the queue).
            kind::CLOSE_BY_CLIENT => {
                if self.b.transactions.lock().contains_key(&r.ref_transaction_id) {
                    let _ = self.settle(&r, Settle::Release, false);
                }
                None
            }
            other => Some(error_reply(&r.request_id, other, format!("Error 132: invalid request type {other}"))),
        };
        if let Some(reply) = reply {
            self.reply(reply).await;
        }
    }

    /// The stream ended: every queue it touched takes back what the stream still held, and
    /// waiting Gets are cancelled.
    fn release(&self) {
        let mut transactions = self.b.transactions.lock();
        for id in &self.opened {
            transactions.remove(id);
        }
        drop(transactions);
        self.b.release_holder(self.holder, &self.channels);
    }
}

/// `QueuesDownstream`: Get replies always; settlements reply only on error; ActiveOffsets and
/// TransactionStatus always; CloseByClient never (kubemq-grpc.md §7). With `--authz-file`, a
/// denied request gets an error reply (`IsError`, `Error: "access denied"`) and the stream
/// goes on.
pub fn downstream(b: Arc<Bridge>, mut inbound: Streaming<pb::QueuesDownstreamRequest>, authz: StreamAuthz) -> BoxStream<pb::QueuesDownstreamResponse> {
    let (out, rx) = mpsc::channel(256);
    let (answers, answered) = Mailbox::new();
    let holder = SubRef { core: HOLDER_CORE, conn: b.new_conn(), sub: SubNo(0) };
    let mut ds = Downstream { b, holder, out, opened: HashSet::new(), channels: HashSet::new(), answers, pending: HashMap::new(), next_token: 0, authz };
    tokio::spawn(async move {
        loop {
            tokio::select! {
                next = inbound.message() => match next {
                    Ok(Some(r)) => ds.handle(r).await,
                    // Half-close, cancellation or a broken connection: the stream is over.
                    _ => break,
                },
                Ok(result) = answered.recv_async() => {
                    if let Some(reply) = ds.got(result) {
                        ds.reply(reply).await;
                    }
                }
                // The client stopped reading responses.
                () = ds.out.closed() => break,
            }
        }
        ds.release();
    });
    Box::pin(ChannelStream::new(rx, Ok, ()))
}

/// `QueuesInfo` (in the newer protos only): per-queue counters, filtered by `QueueName`
/// (substring; empty = all).
pub async fn info(b: &Bridge, r: pb::QueuesInfoRequest) -> pb::QueuesInfoResponse {
    let mut queues = Vec::new();
    for core in CoreId::all(b.array.cores()) {
        let (reply, answer) = Mailbox::new();
        if b.array.send(core, CoreMsg::ListChannels { pattern: Pattern::Queues, reply }) {
            queues.extend(answer.recv_async().await.unwrap_or_default());
        }
    }
    let queues: Vec<pb::QueueInfo> = queues
        .into_iter()
        .map(|s| pb::QueueInfo {
            name: s.name.to_string(),
            messages: s.messages as i64,
            bytes: s.bytes as i64,
            sent: s.messages as i64,
            waiting: s.waiting as i64,
            subscribers: s.subscribers as i64,
            ..Default::default()
        })
        .filter(|q| q.name.contains(&r.queue_name))
        .collect();
    let info = pb::QueuesInfo {
        total_queue: queues.len() as i32,
        sent: queues.iter().map(|q| q.sent).sum(),
        waiting: queues.iter().map(|q| q.waiting).sum(),
        delivered: 0,
        queues,
    };
    pb::QueuesInfoResponse { ref_request_id: r.request_id, info: Some(info) }
}
