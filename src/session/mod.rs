//! One connection's STOMP protocol logic: the CONNECT handshake, then SEND, SUBSCRIBE,
//! UNSUBSCRIBE, ACK, NACK, BEGIN, COMMIT, ABORT and DISCONNECT, turned into array operations
//! (`CoreMsg`s to owner cores) and frames for the client.
//!
//! | client frame | handled here as                                                      |
//! |--------------|-----------------------------------------------------------------------|
//! | CONNECT/STOMP| version + heart-beat negotiation, MaxConnections, CONNECTED            |
//! | SEND         | route → Publish / QueueSend / RpcRequest to the channel's owner core   |
//! | SUBSCRIBE    | local subscription + Subscribe to the owner (wildcards: every core)   |
//! | UNSUBSCRIBE  | Unsubscribe (queues requeue what the subscription held)              |
//! | ACK / NACK   | QueueSettle for queue deliveries; a no-op for events                  |
//! | BEGIN…       | SEND/ACK/NACK with `transaction` held until COMMIT, dropped on ABORT  |
//! | DISCONNECT   | Barrier to every core, RECEIPT once all earlier work is confirmed     |
//!
//! Errors become a `WireError` through `Conn::fail`, which writes ERROR and closes.
use crate::conn::{parse_queue_message_id, AckMode, Conn, LocalSub};
use crate::model::{now_unix_ns, Message, Pattern};
use crate::route::{headers_to_tags, parse_destination, DestinationError, Intent};
use crate::runtime::core::Core;
use crate::mesh::msg::{CoreMsg, RpcRequest, Settle, StartAt, SubRef};
use crate::stomp::negotiate::{negotiate_heart_beat, negotiate_version, parse_heart_beat};
use crate::stomp::{Command, Decoder, Frame, Version, WireError};
use ahash::AHashMap;
use bytes::Bytes;
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::sync::Arc;

pub mod start;

/// Protocol state that only frame handling touches.
#[derive(Default)]
pub struct Session {
    /// Client subscription `id` → local subscription number.
    subs_by_id: AHashMap<Bytes, u32>,
    next_sub: u32,
    /// `/reply/<name>` channel → its local subscription numbers (oldest first); replies go to
    /// the first, and the name stays usable while any of them remains.
    reply_subs: AHashMap<Bytes, Vec<u32>>,
    /// Open transactions and the frames they hold.
    txs: AHashMap<Bytes, Vec<Frame>>,
    client_id: Bytes,
    /// ACKs/NACKs read but not yet sent to their owner core (see `PendingSettle`).
    pending_settle: Option<PendingSettle>,
}

/// Consecutive ACKs (or NACKs) of one subscription, merged into one `QueueSettle`: a consumer
/// that acknowledges every message then costs its owner one mesh message per read batch
/// instead of one per ACK. Sent before any other frame is handled (so UNSUBSCRIBE, COMMIT's
/// and DISCONNECT's barriers and every receipt see it applied), at the end of each read batch,
/// and when the connection is released.
struct PendingSettle {
    owner: usize,
    channel: crate::model::Channel,
    sub: SubRef,
    action: Settle,
    tags: Vec<u64>,
}

/// Handles one frame. Returns false when the connection must stop reading (ERROR sent, or
/// DISCONNECT).
pub fn handle_frame(core: &Rc<Core>, conn: &Rc<Conn>, frame: Frame, decoder: &mut Decoder) -> bool {
    if !conn.connected.get() {
        return match frame.command {
            Command::Connect | Command::Stomp => on_connect(core, conn, &frame, decoder),
            _ => {
                conn.fail(core, WireError::NotConnected, frame.headers.get(b"receipt").map(|r| &r[..]));
                false
            }
        };
    }
    handle_connected(core, conn, frame, false)
}

fn handle_connected(core: &Rc<Core>, conn: &Rc<Conn>, frame: Frame, from_commit: bool) -> bool {
    if !matches!(frame.command, Command::Ack | Command::Nack) {
        flush_settles(core, conn);
    }
    let result = match frame.command {
        Command::Send => on_send(core, conn, frame, from_commit),
        Command::Subscribe => on_subscribe(core, conn, &frame),
        Command::Unsubscribe => on_unsubscribe(core, conn, &frame),
        Command::Ack => on_settle(core, conn, frame, false, from_commit),
        Command::Nack => on_settle(core, conn, frame, true, from_commit),
        Command::Begin => on_begin(core, conn, &frame),
        Command::Commit => on_commit(core, conn, &frame),
        Command::Abort => on_abort(core, conn, &frame),
        Command::Disconnect => {
            on_disconnect(core, conn, &frame);
            return false;
        }
        // A second CONNECT, or a server frame sent by a client.
        _ => Err((WireError::MalformedFrame, receipt_of(&frame))),
    };
    match result {
        Ok(()) => true,
        Err((err, receipt)) => {
            conn.fail(core, err, receipt.as_deref());
            false
        }
    }
}

type Handled = Result<(), (WireError, Option<Bytes>)>;

fn receipt_of(frame: &Frame) -> Option<Bytes> {
    frame.headers.get(b"receipt").cloned()
}

/// Fails `frame` with `err`, echoing its receipt.
fn reject(frame: &Frame, err: WireError) -> Handled {
    Err((err, receipt_of(frame)))
}

/// A RECEIPT for work already complete (still written in frame order).
fn receipt_now(core: &Core, conn: &Conn, frame: &Frame) {
    if let Some(r) = receipt_of(frame) {
        conn.expect(Some(r), 0, false);
        conn.flush_receipts(core);
    }
}

fn on_connect(core: &Rc<Core>, conn: &Rc<Conn>, frame: &Frame, decoder: &mut Decoder) -> bool {
    let h = &frame.headers;
    let Some(version) = negotiate_version(h.get(b"accept-version").map(|v| &v[..])) else {
        conn.fail(core, WireError::UnsupportedVersion, None);
        return false;
    };
    let max = core.cfg.max_connections;
    if max > 0 && core.shared.connections.load(Ordering::Relaxed) > max {
        conn.fail(core, WireError::TooManyConnections, None);
        return false;
    }
    let client_hb = if version == Version::V1_0 {
        (0, 0)
    } else {
        match parse_heart_beat(h.get(b"heart-beat").map(|v| &v[..])) {
            Ok(hb) => hb,
            Err(()) => {
                conn.fail(core, WireError::MalformedFrame, None);
                return false;
            }
        }
    };
    let server_hb = if version == Version::V1_0 { (0, 0) } else { (core.cfg.heartbeat_ms, core.cfg.heartbeat_ms) };
    conn.heartbeat.set(negotiate_heart_beat(client_hb, server_hb));
    conn.version.set(version);
    decoder.set_version(version);
    conn.connected.set(true);
    let session_id = format!("stompgate-{}-{}", core.id, conn.id.0);
    conn.session.borrow_mut().client_id = match h.get(b"login") {
        Some(login) if !login.is_empty() => login.clone(),
        _ => Bytes::from(session_id.clone()),
    };
    let hb = format!("{},{}", server_hb.0, server_hb.1);
    conn.write_frame(
        core,
        Command::Connected,
        |w| {
            w.header(b"version", version.as_str().as_bytes());
            w.header(b"heart-beat", hb.as_bytes());
            w.header(b"session", session_id.as_bytes());
            w.header(b"server", concat!("stompgate/", env!("CARGO_PKG_VERSION")).as_bytes());
        },
        b"",
    );
    tracing::debug!(core = core.id, conn = conn.id.0, version = version.as_str(), "connected");
    true
}

fn destination_error(e: DestinationError) -> WireError {
    match e {
        DestinationError::Invalid => WireError::InvalidDestination,
        DestinationError::SendToReply => WireError::CannotSendToReply,
        DestinationError::SubscribeToRpc => WireError::CannotSubscribeRpc,
    }
}

/// Holds `frame` in its transaction, if it names one. `Ok(true)` = held.
fn hold_in_transaction(conn: &Conn, frame: &Frame, from_commit: bool) -> Result<bool, (WireError, Option<Bytes>)> {
    if from_commit {
        return Ok(false);
    }
    let Some(tx) = frame.headers.get(b"transaction") else { return Ok(false) };
    let mut session = conn.session.borrow_mut();
    match session.txs.get_mut(tx) {
        Some(held) => {
            held.push(frame.clone());
            Ok(true)
        }
        None => Err((WireError::UnknownTransaction, receipt_of(frame))),
    }
}

fn on_send(core: &Rc<Core>, conn: &Rc<Conn>, frame: Frame, from_commit: bool) -> Handled {
    let Some(raw) = frame.headers.get(b"destination") else { return reject(&frame, WireError::MalformedFrame) };
    let dest = parse_destination(raw, core.cfg.default_pattern, Intent::Send).map_err(|e| (destination_error(e), receipt_of(&frame)))?;
    let tags = headers_to_tags(&frame.headers).map_err(|_| (WireError::FrameTooLarge, receipt_of(&frame)))?;
    // Validated now, so a bad frame fails at SEND time even inside a transaction.
    if hold_in_transaction(conn, &frame, from_commit)? {
        receipt_now(core, conn, &frame);
        return Ok(());
    }
    let msg = Message {
        id: core.new_message_id(),
        channel: dest.channel,
        client_id: conn.session.borrow().client_id.clone(),
        metadata: Bytes::new(),
        body: frame.body.clone(),
        tags,
        timestamp_ns: now_unix_ns(),
        sequence: 0,
    };
    let owner = core.owner_of(dest.pattern, &msg.channel);
    let receipt = receipt_of(&frame);
    match dest.pattern {
        Pattern::Events | Pattern::EventsStore => {
            let done = receipt.map(|r| core.ticket(conn.id, conn.expect(Some(r), 1, false)));
            core.dispatch(owner, CoreMsg::Publish { pattern: dest.pattern, msg: Arc::new(msg), done });
        }
        Pattern::Queues => {
            let done = receipt.map(|r| core.ticket(conn.id, conn.expect(Some(r), 1, false)));
            core.dispatch(owner, CoreMsg::QueueSend { msg: Arc::new(msg), meta: None, done });
        }
        Pattern::Commands | Pattern::Queries => {
            let reply_sub = rpc_reply_sub(core, conn, &frame)?;
            if conn.rpc_pending.get() >= core.cfg.rpc_max_pending {
                return reject(&frame, WireError::TooManyPending);
            }
            let max_ms = core.cfg.rpc_timeout_s.saturating_mul(1000);
            let timeout_ms = match frame.headers.get_str(b"timeout") {
                None => max_ms,
                Some(t) => match t.trim().parse::<u64>() {
                    Ok(0) => max_ms,
                    Ok(ms) => ms.min(max_ms),
                    Err(_) => return reject(&frame, WireError::MalformedFrame),
                },
            };
            conn.rpc_pending.set(conn.rpc_pending.get() + 1);
            let req = RpcRequest {
                pattern: dest.pattern,
                request_id: msg.id.clone(),
                msg: Arc::new(msg),
                timeout_ms,
                reply_to: SubRef { core: core.id, conn: conn.id, sub: reply_sub },
                correlation_id: frame.headers.get(b"correlation-id").cloned(),
                span: Bytes::new(),
            };
            core.dispatch(owner, CoreMsg::RpcRequest(Box::new(req)));
            receipt_now(core, conn, &frame);
        }
        Pattern::Reply => unreachable!("the router refuses SEND to /reply/"),
    }
    Ok(())
}

/// The `/reply/` subscription a request's `reply-to` names (seed 003: required, and it must be
/// an active subscription of this connection).
fn rpc_reply_sub(core: &Core, conn: &Conn, frame: &Frame) -> Result<u32, (WireError, Option<Bytes>)> {
    let Some(reply_to) = frame.headers.get(b"reply-to") else { return Err((WireError::MissingReplyTo, receipt_of(frame))) };
    let not_subscribed = || (WireError::ReplyToNotSubscribed, receipt_of(frame));
    let dest = parse_destination(reply_to, core.cfg.default_pattern, Intent::Subscribe).map_err(|_| not_subscribed())?;
    if dest.pattern != Pattern::Reply {
        return Err(not_subscribed());
    }
    conn.session.borrow().reply_subs.get(&dest.channel.0).and_then(|subs| subs.first().copied()).ok_or_else(not_subscribed)
}

fn on_subscribe(core: &Rc<Core>, conn: &Rc<Conn>, frame: &Frame) -> Handled {
    let h = &frame.headers;
    let Some(raw) = h.get(b"destination") else { return reject(frame, WireError::MalformedFrame) };
    let id = match (h.get(b"id"), conn.version.get()) {
        (Some(id), _) => id.clone(),
        (None, Version::V1_0) => raw.clone(),
        (None, _) => return reject(frame, WireError::MalformedFrame),
    };
    let ack = match h.get(b"ack").map(|a| &a[..]) {
        None | Some(b"auto") => AckMode::Auto,
        Some(b"client") => AckMode::Client,
        Some(b"client-individual") => AckMode::ClientIndividual,
        Some(_) => return reject(frame, WireError::MalformedFrame),
    };
    let dest = parse_destination(raw, core.cfg.default_pattern, Intent::Subscribe).map_err(|e| (destination_error(e), receipt_of(frame)))?;
    let start = match (dest.pattern, h.get(b"x-kubemq-start")) {
        (Pattern::EventsStore, Some(v)) => match start::parse_start(v, now_unix_ns()) {
            Some(s) => s,
            None => return reject(frame, WireError::MalformedFrame),
        },
        _ => StartAt::NewOnly,
    };
    let group = match dest.pattern {
        Pattern::Events | Pattern::EventsStore => h.get(b"x-kubemq-group").filter(|g| !g.is_empty()).cloned(),
        _ => None,
    };
    let sub_no = {
        let mut session = conn.session.borrow_mut();
        if session.subs_by_id.contains_key(&id) {
            drop(session);
            return reject(frame, WireError::DuplicateSubscription);
        }
        session.next_sub += 1;
        let n = session.next_sub;
        session.subs_by_id.insert(id.clone(), n);
        if dest.pattern == Pattern::Reply {
            session.reply_subs.entry(dest.channel.0.clone()).or_default().push(n);
        }
        n
    };
    let owner = core.owner_of(dest.pattern, &dest.channel);
    conn.subs.borrow_mut().insert(
        sub_no,
        LocalSub {
            id,
            pattern: dest.pattern,
            channel: dest.channel.clone(),
            wildcard: dest.wildcard,
            ack,
            owner,
            queued: 0,
            unacked: Default::default(),
            parked: Default::default(),
        },
    );
    if dest.pattern == Pattern::Reply {
        // Connection-local: no array, nothing to wait for.
        receipt_now(core, conn, frame);
        return Ok(());
    }
    let sub = SubRef { core: core.id, conn: conn.id, sub: sub_no };
    let targets = holders(core, dest.wildcard, owner);
    let receipt = receipt_of(frame);
    let token = receipt.map(|r| conn.expect(Some(r), targets.len() as u32, false));
    for to in targets {
        core.dispatch(
            to,
            CoreMsg::Subscribe {
                pattern: dest.pattern,
                channel: dest.channel.clone(),
                wildcard: dest.wildcard,
                sub,
                group: group.clone(),
                start,
                prefetch: core.cfg.sub_buff_size as u32,
                done: token.map(|t| core.ticket(conn.id, t)),
            },
        );
    }
    Ok(())
}

/// Removes a subscription locally and tells its owner(s). Returns how many owners will
/// confirm (`done` tickets sent).
fn drop_subscription(core: &Rc<Core>, conn: &Conn, sub_no: u32, token: Option<u64>) -> u32 {
    let Some(mut sub) = conn.subs.borrow_mut().remove(&sub_no) else { return 0 };
    // Parked deliveries die with the subscription; receipts waiting on them must not.
    conn.parked.set(conn.parked.get() - sub.parked.len());
    for parked in sub.parked.drain(..) {
        if let Some(t) = parked.ticket() {
            core.confirm_parked(t);
        }
    }
    if sub.pattern == Pattern::Reply {
        let mut session = conn.session.borrow_mut();
        if let Some(subs) = session.reply_subs.get_mut(&sub.channel.0) {
            subs.retain(|&n| n != sub_no);
            if subs.is_empty() {
                session.reply_subs.remove(&sub.channel.0);
            }
        }
        return 0;
    }
    let targets = holders(core, sub.wildcard, sub.owner);
    let n = targets.len() as u32;
    for to in targets {
        core.dispatch(
            to,
            CoreMsg::Unsubscribe {
                pattern: sub.pattern,
                channel: sub.channel.clone(),
                wildcard: sub.wildcard,
                sub: SubRef { core: core.id, conn: conn.id, sub: sub_no },
                done: token.map(|t| core.ticket(conn.id, t)),
            },
        );
    }
    n
}

fn on_unsubscribe(core: &Rc<Core>, conn: &Rc<Conn>, frame: &Frame) -> Handled {
    let h = &frame.headers;
    let id = match (h.get(b"id"), conn.version.get()) {
        (Some(id), _) => id.clone(),
        (None, Version::V1_0) => match h.get(b"destination") {
            Some(d) => d.clone(),
            None => return reject(frame, WireError::MalformedFrame),
        },
        (None, _) => return reject(frame, WireError::MalformedFrame),
    };
    let Some(sub_no) = conn.session.borrow_mut().subs_by_id.remove(&id) else {
        return reject(frame, WireError::UnknownSubscription);
    };
    let pattern = conn.subs.borrow().get(&sub_no).map(|s| (s.pattern, s.wildcard));
    let owners = match pattern {
        Some((Pattern::Reply, _)) | None => 0,
        Some((_, true)) => core.array_cores().len() as u32,
        Some((_, false)) => 1,
    };
    let token = receipt_of(frame).map(|r| conn.expect(Some(r), owners, false));
    drop_subscription(core, conn, sub_no, token);
    if let Some(t) = token {
        if owners == 0 {
            conn.ticket_done(core, t, 0);
        }
    }
    Ok(())
}

/// ACK (`requeue == false`) or NACK.
fn on_settle(core: &Rc<Core>, conn: &Rc<Conn>, frame: Frame, requeue: bool, from_commit: bool) -> Handled {
    let h = &frame.headers;
    let id = match conn.version.get() {
        Version::V1_2 => h.get(b"id"),
        _ => h.get(b"message-id"),
    };
    let Some(id) = id.cloned() else { return reject(&frame, WireError::MalformedFrame) };
    if hold_in_transaction(conn, &frame, from_commit)? {
        receipt_now(core, conn, &frame);
        return Ok(());
    }
    // Anything that is not a queue delivery id (events, events-store: ACKs are no-ops), or a
    // delivery this connection no longer holds (requeued by a timeout), is acknowledged as is.
    let settle = parse_queue_message_id(&id).and_then(|(owner, tag)| {
        let mut subs = conn.subs.borrow_mut();
        // One scan: clients mostly acknowledge in delivery order, so the tag is at the front.
        let (&sub_no, sub, at) = subs
            .iter_mut()
            .filter(|(_, s)| s.pattern == Pattern::Queues && s.owner == owner)
            .find_map(|(n, s)| s.unacked.iter().position(|&t| t == tag).map(|at| (n, s, at)))?;
        let tags: Vec<u64> = match sub.ack {
            // Cumulative (spec: client mode acknowledges this and every earlier message).
            AckMode::Client => sub.unacked.drain(..=at).collect(),
            _ => {
                sub.unacked.remove(at);
                vec![tag]
            }
        };
        Some((owner, sub.channel.clone(), SubRef { core: core.id, conn: conn.id, sub: sub_no }, tags))
    });
    let receipt = receipt_of(&frame);
    match settle {
        Some((owner, channel, sub, tags)) => {
            let action = if requeue { Settle::Nack } else { Settle::Ack };
            queue_settle(core, conn, PendingSettle { owner, channel, sub, action, tags });
            if let Some(r) = receipt {
                // The RECEIPT proves this settle (and the ones merged ahead of it) took effect.
                let done = core.ticket(conn.id, conn.expect(Some(r), 1, false));
                send_settles(core, conn, Some(done));
            }
        }
        None => {
            // Keep frame order: settles read before this one go out before its RECEIPT.
            flush_settles(core, conn);
            receipt_now(core, conn, &frame);
        }
    }
    Ok(())
}

/// Merges `next` into the pending settle when it names the same subscription and action;
/// otherwise sends the pending one first.
fn queue_settle(core: &Rc<Core>, conn: &Conn, next: PendingSettle) {
    let mut session = conn.session.borrow_mut();
    if let Some(p) = session.pending_settle.as_mut() {
        if p.owner == next.owner && p.sub == next.sub && p.action == next.action {
            p.tags.extend_from_slice(&next.tags);
            return;
        }
    }
    let previous = session.pending_settle.replace(next);
    drop(session);
    if let Some(p) = previous {
        core.dispatch(p.owner, CoreMsg::QueueSettle { channel: p.channel, sub: p.sub, tags: p.tags, action: p.action, done: None });
    }
}

/// Sends the pending settle, if any, with `done` confirming it.
fn send_settles(core: &Rc<Core>, conn: &Conn, done: Option<crate::mesh::msg::Ticket>) {
    let pending = conn.session.borrow_mut().pending_settle.take();
    if let Some(p) = pending {
        core.dispatch(p.owner, CoreMsg::QueueSettle { channel: p.channel, sub: p.sub, tags: p.tags, action: p.action, done });
    }
}

/// Sends the ACKs/NACKs merged so far to their owner core. Called before any other frame, at
/// the end of each read batch, and on release.
pub fn flush_settles(core: &Rc<Core>, conn: &Conn) {
    send_settles(core, conn, None);
}

fn on_begin(core: &Rc<Core>, conn: &Rc<Conn>, frame: &Frame) -> Handled {
    let Some(tx) = frame.headers.get(b"transaction") else { return reject(frame, WireError::MalformedFrame) };
    let mut session = conn.session.borrow_mut();
    if session.txs.contains_key(tx) {
        drop(session);
        return reject(frame, WireError::MalformedFrame);
    }
    session.txs.insert(tx.clone(), Vec::new());
    drop(session);
    receipt_now(core, conn, frame);
    Ok(())
}

fn take_transaction(conn: &Conn, frame: &Frame) -> Result<Vec<Frame>, (WireError, Option<Bytes>)> {
    let Some(tx) = frame.headers.get(b"transaction") else { return Err((WireError::MalformedFrame, receipt_of(frame))) };
    conn.session.borrow_mut().txs.remove(tx).ok_or_else(|| (WireError::UnknownTransaction, receipt_of(frame)))
}

fn on_commit(core: &Rc<Core>, conn: &Rc<Conn>, frame: &Frame) -> Handled {
    for held in take_transaction(conn, frame)? {
        // Receipts of held frames were already sent when they were held.
        let mut held = held;
        held.headers.0.retain(|(n, _)| n.as_ref() != b"receipt");
        if !handle_connected(core, conn, held, true) {
            return Ok(());
        }
    }
    // Held ACKs/NACKs go out before the barrier that proves them.
    flush_settles(core, conn);
    // The RECEIPT must prove the held frames took effect.
    if let Some(r) = receipt_of(frame) {
        receipt_after_barrier(core, conn, r, false);
    }
    Ok(())
}

fn on_abort(core: &Rc<Core>, conn: &Rc<Conn>, frame: &Frame) -> Handled {
    take_transaction(conn, frame)?;
    receipt_now(core, conn, frame);
    Ok(())
}

/// Sends `receipt` once every core has handled everything this connection sent it before:
/// each core answers the barrier after the work queued ahead of it on the same path.
fn receipt_after_barrier(core: &Rc<Core>, conn: &Conn, receipt: Bytes, disconnect: bool) {
    let token = conn.expect(Some(receipt), core.array_cores().len() as u32, disconnect);
    for to in core.array_cores() {
        core.dispatch(to, CoreMsg::Barrier(core.ticket(conn.id, token)));
    }
}

/// The cores that hold a subscription: its channel's owner, or every core for a wildcard
/// filter (a filter can match channels owned anywhere).
fn holders(core: &Core, wildcard: bool, owner: usize) -> std::ops::Range<usize> {
    if wildcard {
        core.array_cores()
    } else {
        owner..owner + 1
    }
}

fn on_disconnect(core: &Rc<Core>, conn: &Rc<Conn>, frame: &Frame) {
    match receipt_of(frame) {
        Some(r) => receipt_after_barrier(core, conn, r, true),
        None => {
            conn.expect(None, 0, true);
            conn.flush_receipts(core);
        }
    }
}

/// The connection stopped reading: drop its subscriptions (the owners requeue unacknowledged
/// queue messages) and abort its transactions.
pub fn release(core: &Rc<Core>, conn: &Conn) {
    // ACKs the client sent before it went away still count (ahead of the requeue below).
    flush_settles(core, conn);
    let subs: Vec<u32> = conn.subs.borrow().keys().copied().collect();
    for sub_no in subs {
        drop_subscription(core, conn, sub_no, None);
    }
    let mut session = conn.session.borrow_mut();
    session.txs.clear();
    session.subs_by_id.clear();
    session.reply_subs.clear();
}
