//! Queue consumption through the array: one `QueuesDownstream` stream per STOMP queue
//! subscription.
//!
//! The consumer keeps at most `prefetch` (SubBuffSize) messages unsettled: once it holds half
//! of that or less (half rounded down) and no Get is outstanding, it asks for the difference (Get, `WaitTimeout`
//! 1 s, no auto-ack). The prefetch may change while it runs (an AMQP queue link's follows the
//! peer's credit, down to 0: then no Get is made); a lower one takes effect at the next Get
//! (one already outstanding may still bring up to the old difference). Settlements already queued are coalesced into one range per transaction. Each received message gets a local delivery tag, which STOMP ACK/NACK name;
//! settling maps tags back to (transaction, sequence) and sends AckRange / NAckRange /
//! ReQueueRange. A message not settled within QueueAckTimeoutSeconds is NAcked (the array
//! requeues it). When the stream breaks, the array returns what it held to the queue; the
//! consumer reconnects and late ACKs for the old tags are ignored.
//!
//! A receipted SUBSCRIBE is confirmed once the array holds the consumer's first Get (the same
//! kind of fence, sent right after it): a message sent after the RECEIPT is competed for by
//! this consumer too, as in the embedded array, instead of going to another consumer whose Get
//! got there first. While the array cannot be reached it is confirmed at once; when it refuses
//! the gateway's token it fails (ERROR `internal error`).
//!
//! A receipted ACK/NACK is confirmed only once the array has applied it (stomp-decisions:
//! RECEIPT after the effect is in the array). Settlements reply only on error, so the consumer
//! follows them with an ActiveOffsets request, which always replies, and confirms when that
//! reply comes: the array handles one stream's requests in order, so by then the settlements
//! before it are applied, and a SEND the client makes after the RECEIPT finds the room an ACK
//! made.
use super::backoff::Backoff;
use super::publish::Outbound;
use super::Worker;
use crate::mesh::msg::{CoreMsg, Settle, SubRef, Ticket};
use crate::model::{Channel, Message};
use crate::telemetry::Counted;
use crate::wire::convert::{bytes_of, channel_of, tags_from_entries};
use crate::wire::pb;
use bytes::Bytes;
use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::rc::{Rc, Weak};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

use crate::wire::kind::{ACK_RANGE, ACTIVE_OFFSETS, GET, NACK_RANGE, REQUEUE_RANGE};
/// How long one Get waits at the array for a first message (its floor in KubeMQ).
const GET_WAIT_MS: i32 = 1000;
/// How often held messages are checked against the ack timeout.
const SWEEP: Duration = Duration::from_secs(1);
/// How long a receipted settlement waits for the array's answer to its ActiveOffsets fence
/// before it is confirmed anyway (an array that never answers must not hang the client).
const FENCE_WAIT: Duration = Duration::from_secs(10);

/// What the consumer's task is told: a settlement, or that its prefetch changed (the new
/// value is in the shared cell; the message only wakes the task to ask again).
enum Ctl {
    Settle(Settlement),
    Prefetch,
}

/// One ACK/NACK (merged per read batch by the session) and the ticket of its RECEIPT.
struct Settlement {
    tags: Vec<u64>,
    action: Settle,
    done: Option<Ticket>,
}

/// Receipts waiting for the array's answer to one ActiveOffsets request.
struct Fence {
    request_id: String,
    sent: Instant,
    done: Vec<Ticket>,
}

struct Consumer {
    ctl: mpsc::UnboundedSender<Ctl>,
    /// The prefetch the task reads before each Get.
    prefetch: Rc<Cell<usize>>,
    task: tokio::task::JoinHandle<()>,
    /// The UNSUBSCRIBE's ticket, confirmed when the task ends (see [`EndReceipt`]).
    end: Rc<Cell<Option<Ticket>>>,
}

/// Confirms an ended subscription's UNSUBSCRIBE when its task is over, however it ends: after
/// the array closed the stream (what it held is back in the queue, so a consumer that comes
/// after the RECEIPT finds it), or at once while the stream was down.
struct EndReceipt {
    w: Rc<Worker>,
    end: Rc<Cell<Option<Ticket>>>,
}

impl Drop for EndReceipt {
    fn drop(&mut self) {
        self.w.done(self.end.take());
    }
}

/// The subscription's receipts: the SUBSCRIBE's, confirmed once the array holds the first Get,
/// and the UNSUBSCRIBE's, once the task is over.
struct Receipts {
    subscribe: Option<Ticket>,
    _unsubscribe: EndReceipt,
}

pub struct Consumers {
    worker: Weak<Worker>,
    by_sub: RefCell<HashMap<SubRef, Consumer>>,
    /// Delivery tags, unique on this core (STOMP message ids are `q<core>-<tag>`).
    next_tag: Rc<Cell<u64>>,
}

impl Consumers {
    pub fn new(worker: Weak<Worker>) -> Self {
        Consumers { worker, by_sub: RefCell::new(HashMap::new()), next_tag: Rc::new(Cell::new(1)) }
    }

    /// Starts consuming for `sub`; `done` (the SUBSCRIBE's receipt) is confirmed once the
    /// array holds its first Get (see the module docs).
    pub fn subscribe(&self, channel: Channel, sub: SubRef, prefetch: u32, done: Option<Ticket>) {
        let Some(w) = self.worker.upgrade() else { return };
        let (ctl, rx) = mpsc::unbounded_channel();
        let end = Rc::new(Cell::new(None));
        let receipts = Receipts { subscribe: done, _unsubscribe: EndReceipt { w: Rc::clone(&w), end: Rc::clone(&end) } };
        let prefetch = Rc::new(Cell::new(prefetch.max(1) as usize));
        let task = tokio::task::spawn_local(run(w, channel, sub, Rc::clone(&prefetch), rx, Rc::clone(&self.next_tag), receipts));
        if let Some(old) = self.by_sub.borrow_mut().insert(sub, Consumer { ctl, prefetch, task, end }) {
            old.task.abort();
        }
    }

    /// Ends the subscription: settlements already queued still reach the array, then its
    /// stream closes and the array requeues what it held. Aborting the task instead would drop
    /// ACKs the client sent just before UNSUBSCRIBE (or before closing), and the array would
    /// redeliver acknowledged messages. `done` is confirmed once the array closed the stream;
    /// it comes back at once when there is no such subscription.
    pub fn unsubscribe(&self, sub: SubRef, done: Option<Ticket>) -> Option<Ticket> {
        // Dropping the sender ends the task's settlement channel after what is queued in it.
        let Some(c) = self.by_sub.borrow_mut().remove(&sub) else { return done };
        c.end.set(done);
        None
    }

    /// Queues a settlement for the subscription's stream. `done` comes back at once when the
    /// subscription is gone (a late ACK, ignored as the embedded array ignores it).
    pub fn settle(&self, sub: SubRef, tags: Vec<u64>, action: Settle, done: Option<Ticket>) -> Option<Ticket> {
        let by_sub = self.by_sub.borrow();
        let Some(c) = by_sub.get(&sub) else { return done };
        match c.ctl.send(Ctl::Settle(Settlement { tags, action, done })) {
            Ok(()) => None,
            Err(mpsc::error::SendError(Ctl::Settle(s))) => s.done,
            Err(_) => None,
        }
    }

    /// Sets the subscription's prefetch (0 = no more Gets) and wakes its task to act on it.
    /// Queued behind the settlements sent before it, which the task applies first.
    pub fn set_prefetch(&self, sub: SubRef, prefetch: u32) {
        let by_sub = self.by_sub.borrow();
        let Some(c) = by_sub.get(&sub) else { return };
        c.prefetch.set(prefetch as usize);
        let _ = c.ctl.send(Ctl::Prefetch);
    }

    pub fn stop_all(&self) {
        for (_, c) in self.by_sub.borrow_mut().drain() {
            c.task.abort();
        }
    }
}

/// The message, its sequence at the array and its receive count (at least 1: this delivery).
fn message_of(m: pb::QueueMessage) -> (Arc<Message>, u64, u32) {
    let attrs = m.attributes.unwrap_or_default();
    let msg = Message {
        id: bytes_of(m.message_id),
        channel: channel_of(&m.channel),
        client_id: bytes_of(m.client_id),
        metadata: bytes_of(m.metadata),
        body: Bytes::from(m.body),
        tags: tags_from_entries(m.tags),
        timestamp_ns: attrs.timestamp,
        sequence: 0,
    };
    (Arc::new(msg), attrs.sequence, u32::try_from(attrs.receive_count).unwrap_or(0).max(1))
}

/// A message this consumer holds: its transaction and sequence at the array, and when the
/// STOMP ack timeout runs out.
struct Held {
    transaction: String,
    seq: i64,
    deadline: Instant,
}

async fn run(
    w: Rc<Worker>,
    channel: Channel,
    sub: SubRef,
    prefetch: Rc<Cell<usize>>,
    mut ctl: mpsc::UnboundedReceiver<Ctl>,
    next_tag: Rc<Cell<u64>>,
    receipts: Receipts,
) {
    let Receipts { subscribe: mut subscribed, _unsubscribe } = receipts;
    let metrics = w.metrics.stream(crate::telemetry::Stream::Consume);
    let _wanted = Counted::new(&metrics.wanted);
    let mut backoff = Backoff::default();
    let ack_timeout = Duration::from_secs(w.cfg.queue_ack_timeout_s);
    let mut request_no = 0u64;
    let mut request_id = move || {
        request_no += 1;
        format!("d{request_no}")
    };
    loop {
        let (tx, rx) = mpsc::channel::<pb::QueuesDownstreamRequest>(256);
        let mut responses = match w.client.clone().queues_downstream(Outbound(rx)).await {
            Ok(r) => r.into_inner(),
            Err(e) => {
                metrics.reconnects.increment(1);
                // A SUBSCRIBE receipt does not wait for the array to come back, nor hang on
                // credentials it refuses (ERROR `internal error`, as for other subscriptions).
                if super::refused(&e) {
                    w.failed(subscribed.take());
                } else {
                    w.done(subscribed.take());
                }
                tracing::warn!(core = %w.core, channel = %channel, error = %e, "array unreachable (queue downstream); retrying");
                if !drain_while_waiting(&w, &mut ctl, backoff.next_delay()).await {
                    return;
                }
                continue;
            }
        };
        backoff.reset();
        let connected = Counted::new(&metrics.connected);
        let mut held: HashMap<u64, Held> = HashMap::new();
        let mut get_outstanding = false;
        let mut fences: VecDeque<Fence> = VecDeque::new();
        let mut sweep = tokio::time::interval(SWEEP);
        loop {
            // Ask again once half the window is free (rounded down, so a window of 3 refills
            // after one ACK): one Get per freed message would make every delivery a round trip.
            let prefetch = prefetch.get();
            if !get_outstanding && prefetch - held.len().min(prefetch) >= (prefetch / 2).max(1) {
                let get = pb::QueuesDownstreamRequest {
                    request_id: request_id(),
                    client_id: w.client_id.clone(),
                    request_type_data: GET,
                    channel: channel.to_string(),
                    max_items: (prefetch - held.len()) as i32,
                    wait_timeout: GET_WAIT_MS,
                    auto_ack: false,
                    ..Default::default()
                };
                if tx.send(get).await.is_err() {
                    break;
                }
                get_outstanding = true;
            }
            if let Some(t) = subscribed.take() {
                // After the first Get (none with a prefetch of 0): its answer means the array
                // holds that Get.
                let fence = fence_request(&mut request_id, &w.client_id, &channel, String::new());
                fences.push_back(Fence { request_id: fence.request_id.clone(), sent: Instant::now(), done: vec![t] });
                if tx.send(fence).await.is_err() {
                    break;
                }
            }
            tokio::select! {
                response = responses.message() => match response {
                    Ok(Some(r)) if r.request_type_data == GET => {
                        get_outstanding = false;
                        if r.is_error {
                            tracing::warn!(core = %w.core, channel = %channel, error = %r.error, "queue Get refused by the array");
                            tokio::time::sleep(SWEEP).await;
                            continue;
                        }
                        for m in r.messages {
                            let (msg, seq, receive_count) = message_of(m);
                            let tag = next_tag.get();
                            next_tag.set(tag + 1);
                            held.insert(tag, Held { transaction: r.transaction_id.clone(), seq: seq as i64, deadline: Instant::now() + ack_timeout });
                            w.back.send(w.core, CoreMsg::QueueDeliver { sub, owner: w.core, tag, msg, receive_count });
                        }
                    }
                    Ok(Some(r)) => {
                        if r.request_type_data == ACTIVE_OFFSETS || fences.iter().any(|f| f.request_id == r.ref_request_id) {
                            // A fence's answer (an error one too: the transaction may have
                            // completed): everything sent before it is applied.
                            answered(&w, &mut fences, &r.ref_request_id);
                        } else if r.is_error {
                            tracing::debug!(core = %w.core, channel = %channel, error = %r.error, "queue settlement refused by the array");
                        }
                    }
                    Ok(None) | Err(_) => break,
                },
                settle = ctl.recv() => {
                    let first = match settle {
                        Some(Ctl::Settle(first)) => first,
                        // A new prefetch: the next turn of the loop asks by it.
                        Some(Ctl::Prefetch) => continue,
                        None => {
                            close_after_sent(tx, &mut responses).await;
                            confirm_all(&w, fences);
                            return;
                        }
                    };
                    // Coalesce what is already queued (a STOMP client ACKs message by message):
                    // one AckRange per transaction instead of one request per ACK.
                    let mut done = Vec::new();
                    let mut batches: Vec<(Vec<u64>, Settle)> = Vec::new();
                    let queued = std::iter::from_fn(|| ctl.try_recv().ok()).filter_map(|c| match c {
                        Ctl::Settle(s) => Some(s),
                        Ctl::Prefetch => None,
                    });
                    for s in std::iter::once(first).chain(queued) {
                        done.extend(s.done);
                        match batches.iter_mut().find(|(_, a)| *a == s.action) {
                            Some((all, _)) => all.extend(s.tags),
                            None => batches.push((s.tags, s.action)),
                        }
                    }
                    let mut broken = false;
                    let mut last_txn = None;
                    for (tags, action) in batches {
                        for req in settlements(&mut held, &tags, &action, &channel, &w.client_id, &mut request_id) {
                            last_txn = Some(req.ref_transaction_id.clone());
                            broken |= tx.send(req).await.is_err();
                        }
                    }
                    if broken {
                        done.into_iter().for_each(|t| w.done(Some(t)));
                        break;
                    }
                    match (done.is_empty(), last_txn) {
                        (true, _) => {}
                        // Nothing of it was held any more (timed out, or from a broken stream):
                        // ignored, as the embedded array ignores it.
                        (false, None) => done.into_iter().for_each(|t| w.done(Some(t))),
                        (false, Some(txn)) => {
                            let fence = fence_request(&mut request_id, &w.client_id, &channel, txn);
                            fences.push_back(Fence { request_id: fence.request_id.clone(), sent: Instant::now(), done });
                            if tx.send(fence).await.is_err() {
                                break;
                            }
                        }
                    }
                }
                _ = sweep.tick() => {
                    let now = Instant::now();
                    while fences.front().is_some_and(|f| now.duration_since(f.sent) >= FENCE_WAIT) {
                        let f = fences.pop_front().expect("checked above");
                        tracing::warn!(core = %w.core, channel = %channel, "the array did not answer an ActiveOffsets request in time; confirming the settlements sent before it");
                        f.done.into_iter().for_each(|t| w.done(Some(t)));
                    }
                    let late: Vec<u64> = held.iter().filter(|(_, h)| h.deadline <= now).map(|(t, _)| *t).collect();
                    if !late.is_empty() {
                        for req in settlements(&mut held, &late, &Settle::Nack, &channel, &w.client_id, &mut request_id) {
                            let _ = tx.send(req).await;
                        }
                    }
                }
            }
        }
        drop(connected);
        // What the fences waited for is moot: the array gives back what the stream held (and
        // a SUBSCRIBE whose fence was never sent is confirmed as while the array is away).
        confirm_all(&w, fences);
        w.done(subscribed.take());
        metrics.reconnects.increment(1);
        tracing::warn!(core = %w.core, channel = %channel, "queue downstream to the array broke; the array requeues what it held; reconnecting");
        if !drain_while_waiting(&w, &mut ctl, backoff.next_delay()).await {
            return;
        }
    }
}

/// Settlement requests for `tags`, one per transaction. Tags this consumer no longer holds
/// (settled, timed out, or from a broken stream) are ignored.
fn settlements(
    held: &mut HashMap<u64, Held>,
    tags: &[u64],
    action: &Settle,
    channel: &Channel,
    client_id: &str,
    request_id: &mut impl FnMut() -> String,
) -> Vec<pb::QueuesDownstreamRequest> {
    let mut by_txn: BTreeMap<String, Vec<i64>> = BTreeMap::new();
    for tag in tags {
        if let Some(h) = held.remove(tag) {
            by_txn.entry(h.transaction).or_default().push(h.seq);
        }
    }
    let (kind, requeue) = match action {
        Settle::Ack => (ACK_RANGE, String::new()),
        Settle::Nack | Settle::Release => (NACK_RANGE, String::new()),
        Settle::Requeue(to) => (REQUEUE_RANGE, to.to_string()),
    };
    by_txn
        .into_iter()
        .map(|(txn, seqs)| pb::QueuesDownstreamRequest {
            request_id: request_id(),
            client_id: client_id.to_string(),
            request_type_data: kind,
            channel: channel.to_string(),
            re_queue_channel: requeue.clone(),
            sequence_range: seqs,
            ref_transaction_id: txn,
            ..Default::default()
        })
        .collect()
}

/// How long an ending subscription waits for the array to close its stream.
const CLOSE_WAIT: Duration = Duration::from_secs(5);

/// Half-closes the stream and waits until the array ends it: the settlements sent before are
/// then applied ahead of the requeue of what is still held. Dropping the response stream at
/// once could reset the call while those requests are still on their way.
async fn close_after_sent(tx: mpsc::Sender<pb::QueuesDownstreamRequest>, responses: &mut tonic::Streaming<pb::QueuesDownstreamResponse>) {
    drop(tx);
    let _ = tokio::time::timeout(CLOSE_WAIT, async { while let Ok(Some(_)) = responses.message().await {} }).await;
}

/// Sleeps `delay` while discarding settlements (nothing is held while disconnected; their
/// receipts are given, as for any ACK of a message no longer held). False when the
/// subscription ended meanwhile.
async fn drain_while_waiting(w: &Worker, ctl: &mut mpsc::UnboundedReceiver<Ctl>, delay: Duration) -> bool {
    let sleep = tokio::time::sleep(delay);
    tokio::pin!(sleep);
    loop {
        tokio::select! {
            () = &mut sleep => return true,
            c = ctl.recv() => match c {
                Some(Ctl::Settle(s)) => w.done(s.done),
                Some(Ctl::Prefetch) => {}
                None => return false,
            },
        }
    }
}

/// An ActiveOffsets request: always answered (an unknown transaction with an error), after
/// every request sent on the stream before it.
fn fence_request(request_id: &mut impl FnMut() -> String, client_id: &str, channel: &Channel, transaction: String) -> pb::QueuesDownstreamRequest {
    pb::QueuesDownstreamRequest {
        request_id: request_id(),
        client_id: client_id.to_string(),
        request_type_data: ACTIVE_OFFSETS,
        channel: channel.to_string(),
        ref_transaction_id: transaction,
        ..Default::default()
    }
}

/// The array answered fence `request_id`: its receipts and every earlier fence's are due
/// (one stream's replies come in order). An answer naming no fence is the oldest's.
fn answered(w: &Worker, fences: &mut VecDeque<Fence>, request_id: &str) {
    let upto = fences.iter().position(|f| f.request_id == request_id).unwrap_or(0);
    for f in fences.drain(..(upto + 1).min(fences.len())) {
        f.done.into_iter().for_each(|t| w.done(Some(t)));
    }
}

fn confirm_all(w: &Worker, fences: VecDeque<Fence>) {
    fences.into_iter().flat_map(|f| f.done).for_each(|t| w.done(Some(t)));
}
