//! The one place that knows whether the array is embedded or remote.
//!
//! - **Embedded**: the array is sharded over the cores; this core's [`Shard`] holds the
//!   channels it owns. Work goes to the owner core of its channel (wildcard subscriptions and
//!   barriers to every core), and the owner's shard does it.
//! - **Remote**: every piece of array work goes to this core's egress thread, which talks to a
//!   KubeMQ array over gRPC and answers with the same messages the embedded shards produce.
//!
//! Front-ends never see the difference: they submit [`ArrayOp`]s (`Core::submit`) and get
//! completions and deliveries back through `Endpoint`.
use crate::array::{Outbox, Shard};
use crate::mesh::msg::{CoreMsg, SettleArgs, SubNo, SubRef, SubscribeArgs, Ticket};
use crate::mesh::op::ArrayOp;
use crate::mesh::topology::owner_of;
use crate::model::{now_unix_ns, Pattern};
use std::cell::RefCell;
use std::ops::Range;
use std::time::Instant;

// One per core, built once and never moved: the shard stays inline (no extra pointer to follow
// on every array operation).
#[allow(clippy::large_enum_variant)]
pub enum Backend {
    Embedded(RefCell<Shard>),
    Remote(crate::egress::Link),
}

/// Where one operation goes: a range of core indexes, or the egress.
pub enum Route {
    Cores(Range<usize>),
    Egress,
}

impl Backend {
    /// Whether the array cannot take more from this core's readers for now: a remote array's
    /// egress over its backlog bound. The embedded array paces through the mesh instead.
    pub fn backed_up(&self) -> bool {
        match self {
            Backend::Embedded(_) => false,
            Backend::Remote(link) => link.backed_up(),
        }
    }

    /// Where `op` must go, with `cores` cores in the process.
    pub fn route(&self, op: &ArrayOp, cores: usize) -> Route {
        if let Backend::Remote(_) = self {
            return Route::Egress;
        }
        let one = |pattern: Pattern, channel| {
            let owner = owner_of(pattern, channel, cores);
            Route::Cores(owner.index()..owner.index() + 1)
        };
        match op {
            ArrayOp::Publish { pattern, msg } => one(*pattern, &msg.channel),
            ArrayOp::QueueSend { msg } => one(Pattern::Queues, &msg.channel),
            ArrayOp::Settle { channel, .. } | ArrayOp::Prefetch { channel, .. } => one(Pattern::Queues, channel),
            ArrayOp::Request { pattern, msg, .. } => one(*pattern, &msg.channel),
            // A filter can match channels owned anywhere.
            ArrayOp::Subscribe { wildcard: true, .. } | ArrayOp::Unsubscribe { wildcard: true, .. } | ArrayOp::Barrier => Route::Cores(0..cores),
            ArrayOp::Subscribe { pattern, channel, .. } | ArrayOp::Unsubscribe { pattern, channel, .. } => one(*pattern, channel),
        }
    }

    /// Does array work that reached this core (from a peer, from itself, or from outside the
    /// cores), appending what it produces to `out`. Returns the work back if it is not array
    /// work at all (a delivery or confirmation for this core's endpoints).
    pub fn apply(&self, msg: CoreMsg, cores: usize, out: &mut Outbox) -> Option<CoreMsg> {
        let shard = match self {
            Backend::Embedded(shard) => shard,
            Backend::Remote(egress) => {
                if crate::egress::is_array_work(&msg) {
                    egress.forward(msg);
                    return None;
                }
                return Some(msg);
            }
        };
        // The clock is read only by the variants that need it: not per delivered message.
        match msg {
            CoreMsg::Publish { pattern, msg, done } => {
                let mut shard = shard.borrow_mut();
                let first = out.len();
                match pattern {
                    Pattern::EventsStore => {
                        if shard.store.publish(msg, now_unix_ns(), cores, out).is_none() {
                            // The persistent store has no room: nothing was appended. Without a
                            // ticket (no receipt) the refusal is only counted (the journal's).
                            if let Some(t) = done {
                                out.push((t.core, CoreMsg::Refused { ticket: t, why: crate::mesh::msg::Refusal::StoreFull }));
                            }
                            return None;
                        }
                    }
                    _ => shard.events.publish(Pattern::Events, &msg, cores, out),
                }
                if let Some(t) = done {
                    // Each core that delivers confirms its part (`CoreMsg::Delivered`); the
                    // announcement says how many parts to expect (see `completion`).
                    let mut more = 0;
                    for (_, m) in out[first..].iter_mut() {
                        if let CoreMsg::Deliver { done, .. } = m {
                            *done = Some(t);
                            more += 1;
                        }
                    }
                    out.push((t.core, CoreMsg::Done { ticket: t, more }));
                }
            }
            CoreMsg::QueueSend { msg, meta, done } => shard.borrow_mut().queues.send(msg, meta, done, Instant::now(), out),
            CoreMsg::QueuePull(req) => shard.borrow_mut().queues.pull(*req, Instant::now(), out),
            CoreMsg::DeleteChannel { pattern, channel } => shard.borrow_mut().delete(pattern, &channel, out),
            CoreMsg::ListChannels { pattern, reply } => {
                reply.send(shard.borrow().stats(pattern));
            }
            CoreMsg::Subscribe(args) => {
                let SubscribeArgs { pattern, channel, wildcard, sub, group, start, prefetch, done } = *args;
                let mut shard = shard.borrow_mut();
                let interest = crate::array::events::Interest { sub, group };
                match pattern {
                    Pattern::Events => shard.events.subscribe(channel, wildcard, interest),
                    Pattern::EventsStore => shard.store.subscribe(channel, interest, start, now_unix_ns(), out),
                    Pattern::Queues => shard.queues.subscribe(channel, sub, prefetch, Instant::now(), out),
                    _ => {}
                }
                announce(done, out);
            }
            CoreMsg::Unsubscribe { pattern, channel, wildcard, sub, done } => {
                let mut shard = shard.borrow_mut();
                match pattern {
                    Pattern::Events => shard.events.unsubscribe(&channel, wildcard, sub),
                    Pattern::EventsStore => shard.store.unsubscribe(&channel, sub),
                    Pattern::Queues => shard.queues.unsubscribe(&channel, sub, Instant::now(), out),
                    _ => {}
                }
                announce(done, out);
            }
            CoreMsg::QueueSettle(args) => {
                let SettleArgs { channel, sub, tags, action, done } = *args;
                shard.borrow_mut().queues.settle(&channel, sub, &tags, &action, Instant::now(), out);
                announce(done, out);
            }
            CoreMsg::QueuePrefetch { channel, sub, prefetch } => shard.borrow_mut().queues.set_prefetch(&channel, sub, prefetch, Instant::now(), out),
            CoreMsg::RpcRequest(req) => shard.borrow_mut().rpc.request(*req, Instant::now(), out),
            CoreMsg::RpcResponse { request_id, outcome, amqp, .. } => {
                let mut shard = shard.borrow_mut();
                if !shard.rpc.respond(&request_id, *outcome, Instant::now(), out) && amqp {
                    crate::telemetry::amqp::rpc_late_response(shard.core);
                }
            }
            CoreMsg::RegisterResponder { pattern, channel, responder_id, group, requests } => {
                shard.borrow_mut().rpc.register(pattern, channel, responder_id, group, requests)
            }
            CoreMsg::UnregisterResponder { pattern, channel, responder_id } => shard.borrow_mut().rpc.unregister(pattern, &channel, responder_id),
            CoreMsg::Barrier(t) => announce(Some(t), out),
            other => return Some(other),
        }
        None
    }

    /// Periodic array duties: queue ack timeouts and expiries, Events-Store retention, RPC
    /// timeouts.
    pub fn tick(&self, now: Instant, out: &mut Outbox) {
        if let Backend::Embedded(shard) = self {
            let mut shard = shard.borrow_mut();
            let now_ns = now_unix_ns();
            shard.queues.expire(now, now_ns, out);
            shard.store.expire(now_ns);
            shard.rpc.expire(now, out);
        }
    }
}

/// The work behind `done` is complete here, with no parts to follow.
fn announce(done: Option<Ticket>, out: &mut Outbox) {
    if let Some(t) = done {
        out.push((t.core, CoreMsg::Done { ticket: t, more: 0 }));
    }
}

/// The mesh message for `op` from connection `at` (each op names its own subscription
/// number), confirming `done`. `None` for a barrier nobody waits for.
pub fn message_for(op: ArrayOp, at: SubRef, done: Option<Ticket>) -> Option<CoreMsg> {
    let sub = |n: SubNo| SubRef { sub: n, ..at };
    Some(match op {
        ArrayOp::Publish { pattern, msg } => CoreMsg::Publish { pattern, msg, done },
        ArrayOp::QueueSend { msg } => CoreMsg::QueueSend { msg, meta: None, done },
        ArrayOp::Subscribe { sub: n, pattern, channel, wildcard, group, start, prefetch } => {
            CoreMsg::Subscribe(Box::new(SubscribeArgs { pattern, channel, wildcard, sub: sub(n), group, start, prefetch, done }))
        }
        ArrayOp::Unsubscribe { sub: n, pattern, channel, wildcard } => CoreMsg::Unsubscribe { pattern, channel, wildcard, sub: sub(n), done },
        ArrayOp::Settle { sub: n, channel, tags, action } => CoreMsg::QueueSettle(Box::new(SettleArgs { channel, sub: sub(n), tags, action, done })),
        // Nothing to confirm: a prefetch change is never waited for (`done` is always None).
        ArrayOp::Prefetch { sub: n, channel, prefetch } => CoreMsg::QueuePrefetch { channel, sub: sub(n), prefetch },
        ArrayOp::Request { pattern, msg, timeout_ms, reply_sub, correlation_id, cache } => CoreMsg::RpcRequest(Box::new(crate::mesh::msg::RpcRequest {
            pattern,
            request_id: msg.id.clone(),
            msg,
            timeout_ms,
            reply_to: sub(reply_sub),
            correlation_id,
            span: bytes::Bytes::new(),
            cache,
        })),
        ArrayOp::Barrier => CoreMsg::Barrier(done?),
    })
}
