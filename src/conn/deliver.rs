//! Deliveries into a connection's write queue: Events / Events-Store messages under the
//! slow-subscriber policy ([`crate::delivery`]), queue messages, RPC replies. Every MESSAGE is
//! built by `stomp::server`: events and queue deliveries with their subscription's
//! pre-encoded head (`write_message_encoded`), RPC replies in one pass (`write_message`).
use super::write::{Sent, Stamp, WriteQueue};
use super::Conn;
use crate::delivery::park_limit;
use crate::engine::endpoint::Delivery;
use crate::engine::metrics::Metrics;
use crate::engine::Core;
use crate::mesh::msg::{CoreId, RpcOutcome, SubNo, Ticket};
use crate::model::{Message, Pattern};
use crate::route::{write_egress_destination, write_egress_tag_headers};
use crate::session::{message_id, ParkedEvent, Subscription};
use crate::stomp::server::{write_message, write_message_encoded, EncodedHead, MessageHead, PerMessage};
use crate::stomp::Version;
use bytes::{Bytes, BytesMut};
use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Instant;

thread_local! {
    /// Scratch space for building a destination value before it is escaped into a frame.
    static SCRATCH: RefCell<BytesMut> = RefCell::new(BytesMut::with_capacity(256));
}

/// Calls `f` with the canonical destination for (pattern, channel) (seed 000: egress always
/// uses the primary prefix and the slash form).
fn with_destination<R>(pattern: Pattern, channel: &[u8], f: impl FnOnce(&[u8]) -> R) -> R {
    SCRATCH.with(|s| {
        let mut s = s.borrow_mut();
        s.clear();
        write_egress_destination(pattern, channel, &mut s);
        f(&s)
    })
}

fn count_dropped_headers(core: &Core, dropped: u32) {
    if dropped > 0 {
        Metrics::add(&core.metrics.headers_dropped, u64::from(dropped));
    }
}

/// Delivers an Events / Events-Store message to subscription `n`. The buffer is "full" when
/// SubBuffSize frames wait *and* the socket is refusing bytes (frames queued during one burst
/// that the writer has not reached yet are no sign of a slow subscriber); a delivery that finds
/// it full is parked, in order, behind the ones already waiting.
pub fn event(conn: &Conn, core: &Rc<Core>, pattern: Pattern, msg: &Arc<Message>, n: SubNo, ticket: Option<Ticket>) -> Delivery {
    if !conn.is_open() {
        return Delivery::Gone;
    }
    let limit = core.cfg.sub_buff_size;
    let mut session = conn.session.borrow_mut();
    let version = session.version();
    let Some(sub) = session.subs.get_mut(n) else { return Delivery::Gone };
    let full = !sub.parked.is_empty() || (sub.queued as usize >= limit && conn.write_blocked.get());
    if full {
        let parked = ParkedEvent { pattern, msg: Arc::clone(msg), ticket };
        return match session.subs.park(n, parked, Instant::now(), park_limit(limit)) {
            Ok(()) => Delivery::Parked,
            Err(_) => {
                Metrics::add(&core.metrics.deliveries_dropped, 1);
                Delivery::Dropped
            }
        };
    }
    write_event(core, &mut conn.wq.borrow_mut(), version, sub, n, pattern, msg);
    super::Counters::add(&conn.counters().frames_out, 1);
    conn.wake_writer();
    Delivery::Queued
}

/// `sub`'s encoded MESSAGE head for messages of (`pattern`, `channel`): the one it holds when
/// its last message came from there too (always, for a subscription without wildcards),
/// else encoded now in its place.
fn encoded_head<'s>(sub: &'s mut Subscription, version: Version, pattern: Pattern, channel: &[u8]) -> &'s EncodedHead {
    let cache = sub.head.get_or_insert_with(Box::default);
    if cache.pattern != Some(pattern) || cache.channel != channel {
        with_destination(pattern, channel, |destination| cache.encoded.encode(version, destination, &sub.id));
        cache.pattern = Some(pattern);
        cache.channel.clear();
        cache.channel.extend_from_slice(channel);
    }
    &cache.encoded
}

/// Encodes one events MESSAGE into the write queue.
fn write_event(core: &Core, wq: &mut WriteQueue, version: Version, sub: &mut Subscription, n: SubNo, pattern: Pattern, msg: &Message) {
    let ack = (version == Version::V1_2 && sub.needs_ack()).then_some(&msg.id[..]);
    let head = encoded_head(sub, version, pattern, msg.channel.as_bytes());
    let dropped = write_message_encoded(
        &mut wq.buf,
        version,
        head,
        &PerMessage { message_id: &msg.id, ack, redelivered: false },
        |w| {
            write_egress_tag_headers(&msg.tags, &msg.metadata, w);
            if pattern == Pattern::EventsStore {
                let mut d = itoa::Buffer::new();
                w.own_header(b"x-kubemq-sequence", d.format(msg.sequence).as_bytes());
                w.own_header(b"x-kubemq-timestamp", d.format(msg.timestamp_ns).as_bytes());
            }
        },
        &msg.body,
    );
    count_dropped_headers(core, dropped);
    sub.queued += 1;
    wq.sent.push(Sent::Event(n));
    stamp(wq, pattern, msg);
    Metrics::add(&core.metrics.messages_delivered, 1);
}

/// Notes `msg`'s acceptance time for the delivery-latency histogram, recorded when the write
/// that carries it completes. A message without one (plain events from a remote array: KubeMQ
/// sends no timestamp for them) is not timed.
fn stamp(wq: &mut WriteQueue, pattern: Pattern, msg: &Message) {
    if msg.timestamp_ns > 0 {
        wq.stamps.push(Stamp { pattern, accepted_ns: msg.timestamp_ns });
    }
}

/// Moves parked deliveries into the write queue while their subscription has room, and drops
/// those parked longer than the grace. The tickets of the deliveries it settled go to `settled`.
pub fn unpark(conn: &Conn, core: &Core, now: Instant, settled: &mut Vec<Ticket>) {
    if !conn.is_open() || conn.session.borrow().subs.parked() == 0 {
        return;
    }
    let limit = core.cfg.sub_buff_size;
    let blocked = conn.write_blocked.get();
    let mut session = conn.session.borrow_mut();
    let version = session.version();
    let mut wq = conn.wq.borrow_mut();
    let mut wrote = false;
    let dropped = session.subs.unpark(
        now,
        |sub| (sub.queued as usize) < limit || !blocked,
        |n, sub, parked| {
            write_event(core, &mut wq, version, sub, n, parked.pattern, &parked.msg);
            super::Counters::add(&conn.counters().frames_out, 1);
            wrote = true;
        },
        settled,
    );
    Metrics::add(&core.metrics.deliveries_dropped, dropped);
    drop(wq);
    if wrote {
        conn.wake_writer();
    }
}

/// Writes a queue MESSAGE for subscription `n`. False if the subscription is gone, so the
/// core gives the message back to the queue.
pub fn queue(conn: &Conn, core: &Core, msg: &Arc<Message>, n: SubNo, owner: CoreId, tag: u64, redelivered: bool) -> bool {
    if !conn.is_open() {
        return false;
    }
    let mut session = conn.session.borrow_mut();
    let version = session.version();
    let Some(sub) = session.subs.get_mut(n) else { return false };
    let mut id = [0u8; message_id::MAX_LEN];
    let id = message_id::write_queue(&mut id, owner, tag);
    let ack = (version == Version::V1_2 && sub.needs_ack()).then_some(id);
    let mut wq = conn.wq.borrow_mut();
    let head = encoded_head(sub, version, Pattern::Queues, msg.channel.as_bytes());
    let dropped = write_message_encoded(
        &mut wq.buf,
        version,
        head,
        &PerMessage { message_id: id, ack, redelivered },
        |w| write_egress_tag_headers(&msg.tags, &msg.metadata, w),
        &msg.body,
    );
    super::Counters::add(&conn.counters().frames_out, 1);
    count_dropped_headers(core, dropped);
    if sub.needs_ack() {
        sub.unacked.push_back((owner, tag));
    } else {
        // stomp-decisions.md: auto acknowledges once written.
        wq.sent.push(Sent::AutoAck { sub: n, tag });
    }
    stamp(&mut wq, Pattern::Queues, msg);
    Metrics::add(&core.metrics.messages_delivered, 1);
    drop(wq);
    conn.wake_writer();
    true
}

/// Writes the reply (or failure) of a Commands/Queries request on the `/reply/` subscription
/// (stomp-decisions.md, "RPC").
pub fn rpc_reply(conn: &Conn, core: &Core, n: SubNo, pattern: Pattern, correlation_id: Option<Bytes>, outcome: RpcOutcome) {
    let mut session = conn.session.borrow_mut();
    session.rpc_replied();
    if !(conn.state.get() == super::State::Open && session.is_open()) {
        return;
    }
    let version = session.version();
    let Some(sub) = session.subs.get(n) else { return };
    let message_id = core.new_message_id();
    let empty = Bytes::new();
    let body = match &outcome {
        RpcOutcome::Response { body, .. } => body,
        _ => &empty,
    };
    let mut wq = conn.wq.borrow_mut();
    let dropped = with_destination(Pattern::Reply, sub.channel.as_bytes(), |destination| {
        let head = MessageHead {
            destination,
            message_id: &message_id,
            subscription: &sub.id,
            ack: None,
            redelivered: false,
            correlation_id: correlation_id.as_deref(),
        };
        write_message(
            &mut wq.buf,
            version,
            &head,
            |w| match &outcome {
                RpcOutcome::Response { executed, error, metadata, tags, cache_hit, .. } => {
                    if pattern == Pattern::Commands {
                        w.own_header(b"x-kubemq-executed", if *executed { b"true" } else { b"false" });
                    }
                    if *cache_hit && pattern == Pattern::Queries {
                        w.own_header(b"x-kubemq-cache-hit", b"true");
                    }
                    if !error.is_empty() {
                        w.own_header(b"stomp-error", b"failed");
                        w.own_header(b"x-kubemq-error", &sanitize_error(error));
                    }
                    write_egress_tag_headers(tags, metadata, w);
                }
                RpcOutcome::Timeout => w.own_header(b"stomp-error", b"timeout"),
                RpcOutcome::NoResponder => w.own_header(b"stomp-error", b"no-responder"),
                RpcOutcome::Unavailable => w.own_header(b"stomp-error", b"unavailable"),
            },
            body,
        )
    });
    count_dropped_headers(core, dropped);
    super::Counters::add(&conn.counters().frames_out, 1);
    drop(wq);
    conn.wake_writer();
}

/// A responder's error text, made safe for a header: printable ASCII only, at most 256 bytes.
fn sanitize_error(error: &[u8]) -> Vec<u8> {
    error.iter().take(256).map(|&b| if (0x20..0x7f).contains(&b) { b } else { b'?' }).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_text_is_sanitized() {
        assert_eq!(sanitize_error(b"bad\r\nthing\x00"), b"bad??thing?");
        assert_eq!(sanitize_error(&[b'a'; 300]).len(), 256);
    }
}
