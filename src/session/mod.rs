//! One connection's STOMP protocol state machine, with no socket, executor or core in sight:
//! [`Session::handle`] takes a decoded frame and appends [`Action`]s — work for the array
//! ([`ArrayOp`]s), frames to write (CONNECTED, RECEIPT, ERROR), close — which the connection
//! (`conn/`) carries out. What comes back from the array (completions, deliveries) updates the
//! same state through the methods below.
//!
//! | client frame | handled here as                                                      |
//! |--------------|-----------------------------------------------------------------------|
//! | CONNECT/STOMP| version + heart-beat negotiation, MaxConnections, CONNECTED            |
//! | SEND         | route → Publish / QueueSend / Request                                 |
//! | SUBSCRIBE    | a [`Subscription`] + Subscribe (`/reply/`: local only)                |
//! | UNSUBSCRIBE  | Unsubscribe (queues requeue what the subscription held)              |
//! | ACK / NACK   | Settle for queue deliveries, merged per read batch; a no-op for events|
//! | BEGIN…       | SEND/ACK/NACK with `transaction` held until COMMIT, dropped on ABORT  |
//! | DISCONNECT   | Barrier, RECEIPT once all earlier work is confirmed, then close      |
//!
//! Per-connection memory budgets (issue 13), each over its cap an ERROR + close: frames held
//! in one transaction (`max_tx_frames`), open transactions (`max_transactions`) and
//! subscriptions (`max_subscriptions`, `/reply/` ones included: they hold memory too).
//!
//! Authentication and authorization (issue 14) are asked of the [`Host`]: the JWT in CONNECT's
//! `passcode` once per connection ([`Host::authenticate`]), and each (pattern, channel, access)
//! of a SEND or SUBSCRIBE once per connection and rule generation ([`Host::authorize`], its
//! answers cached here so a SEND pays a hash lookup, not a regex). Either refusal is ERROR
//! `access denied` + close.
//!
//! Every error becomes a `WireError` (the closed vocabulary) through [`Session::fail`].
#[cfg(test)]
mod auth_tests;
pub mod authz;
pub mod message_id;
pub mod receipts;
pub mod start;
pub mod subscription;
#[cfg(test)]
mod tests;

use crate::auth::{Access, Denied};
use crate::config::Config;
use crate::mesh::msg::{CacheSpec, Settle, StartAt, SubNo, Ticket};
use crate::mesh::op::ArrayOp;
use crate::model::{Channel, Message, Pattern};
use crate::route::tags::{MAX_CUSTOM_TAGS, MAX_TAG_VALUE_LEN};
use crate::route::{headers_to_tags, parse_destination, Destination, DestinationError, Intent};
use crate::stomp::error::{Malformed, TooLarge};
use crate::stomp::negotiate::{negotiate_heart_beat, negotiate_version, parse_heart_beat};
use crate::stomp::{Command, Frame, Version, WireError};
use ahash::AHashMap;
use bytes::Bytes;
use receipts::{Due, Receipts};
use std::sync::Arc;
pub use subscription::{AckMode, ParkedEvent, Subscription, Subscriptions};

/// What the session needs from the process around it.
pub trait Host {
    /// Connected sessions in the process now, counting the one being connected (MaxConnections).
    fn open_connections(&self) -> usize;
    /// A process-unique message id.
    fn new_message_id(&self) -> Bytes;
    /// Wall-clock time, Unix nanoseconds.
    fn now_ns(&self) -> i64;
    /// Checks CONNECT's credentials. `Ok(Some(id))`: a verified client id; `Ok(None)`:
    /// authentication is off (or the token names no client); `Err`: refuse the connection.
    /// The default is authentication off.
    fn authenticate(&self, login: Option<&[u8]>, passcode: Option<&[u8]>) -> Result<Option<Bytes>, Denied> {
        let _ = (login, passcode);
        Ok(None)
    }
    /// The generation of the authorization rules in force, `None` when authorization is off
    /// (the default). A session's cached decisions hold while it stays the same.
    fn authz_generation(&self) -> Option<u64> {
        None
    }
    /// Whether `client_id` may do `access` on `channel` (as written: a wildcard filter is
    /// checked as its text) of `pattern`. Asked only on a cache miss.
    fn authorize(&self, client_id: &[u8], pattern: Pattern, channel: &[u8], access: Access) -> bool {
        let _ = (client_id, pattern, channel, access);
        true
    }
}

/// What the connection must do, in order.
#[derive(Debug)]
pub enum Action {
    /// Write CONNECTED; decode with `version` and run heart-beats at `heart_beat` (ms:
    /// send every, expect every) from now on.
    Connected {
        version: Version,
        heart_beat: (u64, u64),
        advertised: (u64, u64),
        session: Bytes,
    },
    /// Submit work to the array; `done` is completed (or failed) back through
    /// [`Session::completed`] / [`Session::failed`].
    Array {
        op: ArrayOp,
        done: Option<u64>,
    },
    /// A parked delivery died with its subscription: its publisher's ticket is owed a
    /// confirmation.
    SettleParked(Ticket),
    Receipt(Bytes),
    /// Write ERROR, then close.
    Error {
        error: WireError,
        receipt: Option<Bytes>,
    },
    /// Write what is queued, then close (DISCONNECT).
    Close,
}

/// Where the session is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum State {
    /// Only CONNECT or STOMP is accepted.
    AwaitingConnect,
    Connected,
    /// An ERROR is queued behind owed receipts (or written): no frame is handled any more.
    Failing,
    /// DISCONNECT was handled: its receipt (if any) is the last frame.
    Disconnecting,
}

type Handled = Result<(), (WireError, Option<Bytes>)>;

pub struct Session {
    cfg: Arc<Config>,
    state: State,
    version: Version,
    /// `stompgate-<core>-<conn>`: the CONNECTED `session` header, and the client id without `login`.
    session_id: Bytes,
    client_id: Bytes,
    pub subs: Subscriptions,
    /// Open transactions and the frames they hold.
    txs: AHashMap<Bytes, Vec<Frame>>,
    receipts: Receipts,
    /// ACKs/NACKs read but not yet sent (see [`PendingSettle`]).
    pending_settle: Option<PendingSettle>,
    /// Commands/Queries requests awaiting their reply.
    rpc_pending: usize,
    /// The identity the transport proved (a TLS client certificate's CN), if any: the client
    /// id when no JWT names one (see [`Session::set_transport_identity`]).
    transport_identity: Option<Bytes>,
    /// Authorization decisions made for this connection (see `authz`).
    authz: authz::Decisions,
    /// The destination the last SEND named, as given and as parsed (see
    /// [`Session::send_destination`]); boxed, so an idle connection pays one pointer for it.
    last_send: Option<Box<(Bytes, Destination)>>,
}

/// Consecutive ACKs (or NACKs) of one subscription, merged into one Settle: a consumer that
/// acknowledges every message then costs its queue's owner one operation per read batch
/// instead of one per ACK. Sent before any other frame is handled (so UNSUBSCRIBE, COMMIT's
/// and DISCONNECT's barriers and every receipt see it applied), at the end of each read
/// batch ([`Session::end_of_batch`]) and on release.
struct PendingSettle {
    sub: SubNo,
    channel: Channel,
    action: Settle,
    tags: Vec<u64>,
}

impl Session {
    pub fn new(cfg: Arc<Config>, session_id: Bytes) -> Session {
        Session {
            cfg,
            state: State::AwaitingConnect,
            version: Version::V1_0,
            client_id: session_id.clone(),
            session_id,
            subs: Subscriptions::default(),
            txs: AHashMap::new(),
            receipts: Receipts::default(),
            pending_settle: None,
            rpc_pending: 0,
            transport_identity: None,
            authz: authz::Decisions::default(),
            last_send: None,
        }
    }

    /// The hook for the transport (TLS): an identity it verified, e.g. a client certificate's
    /// CN. Set before CONNECT is handled. Precedence of the client id: a verified JWT's
    /// `ClientID`/`sub` > this > `login` > the session id.
    pub fn set_transport_identity(&mut self, id: Bytes) {
        self.transport_identity = Some(id);
    }

    pub fn state(&self) -> State {
        self.state
    }

    pub fn version(&self) -> Version {
        self.version
    }

    pub fn client_id(&self) -> &Bytes {
        &self.client_id
    }

    /// Whether deliveries are still taken: until an ERROR is queued, and after DISCONNECT until
    /// the connection stops reading (what it takes then is given back on release, like
    /// everything it holds; refusing it would bounce a queue message between the owner and
    /// this subscription until then).
    pub fn is_open(&self) -> bool {
        matches!(self.state, State::Connected | State::Disconnecting)
    }

    /// Whether receipts or an ERROR are still owed: the connection must not close before.
    pub fn owes_frames(&self) -> bool {
        !self.receipts.is_empty()
    }

    /// How many frames still wait for their place in the receipt order (the connection's
    /// reader pauses while too many do: `conn::read`).
    pub fn receipts_owed(&self) -> usize {
        self.receipts.len()
    }

    /// Handles one frame. Returns false when the connection must stop reading (ERROR queued,
    /// or DISCONNECT).
    pub fn handle(&mut self, frame: &Frame, host: &dyn Host, out: &mut Vec<Action>) -> bool {
        match self.state {
            State::AwaitingConnect => match frame.command {
                Command::Connect | Command::Stomp => self.on_connect(frame, host, out),
                _ => {
                    self.fail(WireError::NotConnected, receipt_of(frame), out);
                    false
                }
            },
            State::Connected => self.handle_connected(frame, host, false, out),
            State::Failing | State::Disconnecting => false,
        }
    }

    /// The read batch is over: send the ACKs/NACKs merged so far.
    pub fn end_of_batch(&mut self, out: &mut Vec<Action>) {
        self.flush_settles(out);
    }

    /// Fails the connection with `err`: ERROR (echoing `receipt`) and close, after the
    /// receipts still owed (shutdown does not wait: the array may be gone already).
    pub fn fail(&mut self, err: WireError, receipt: Option<Bytes>, out: &mut Vec<Action>) {
        if self.state == State::Failing {
            return;
        }
        self.state = State::Failing;
        if err != WireError::ShuttingDown && !self.receipts.is_empty() {
            self.receipts.expect_error(err, receipt);
            self.take_due(out);
        } else {
            self.receipts.clear();
            out.push(Action::Error { error: err, receipt });
        }
    }

    /// The array completed the operation behind `token`.
    pub fn completed(&mut self, token: u64, out: &mut Vec<Action>) {
        self.receipts.complete(token);
        self.take_due(out);
    }

    /// The operation behind `token` failed for good (the remote array never confirmed it).
    pub fn failed(&mut self, token: u64, out: &mut Vec<Action>) {
        self.receipts.fail(token);
        self.take_due(out);
    }

    /// The array refused the operation behind `token` with `err` (a queue at its depth limit).
    pub fn refused(&mut self, token: u64, err: WireError, out: &mut Vec<Action>) {
        self.receipts.fail_with(token, err);
        self.take_due(out);
    }

    /// A Commands/Queries reply (or its failure) arrived.
    pub fn rpc_replied(&mut self) {
        self.rpc_pending = self.rpc_pending.saturating_sub(1);
    }

    /// The connection stopped reading: give back what it held (subscriptions, whose queue
    /// messages are requeued; transactions, aborted). ACKs read before still count, first.
    pub fn release(&mut self, out: &mut Vec<Action>) {
        self.flush_settles(out);
        for n in self.subs.numbers() {
            self.drop_subscription(n, None, out);
        }
        self.txs.clear();
    }

    fn take_due(&mut self, out: &mut Vec<Action>) {
        let mut due = Vec::new();
        self.receipts.take_due(&mut due);
        for d in due {
            out.push(match d {
                Due::Receipt(r) => Action::Receipt(r),
                Due::Error(error, receipt) => Action::Error { error, receipt },
                Due::Close => Action::Close,
            });
        }
    }

    /// A RECEIPT for work already complete (still written in frame order).
    fn receipt_now(&mut self, frame: &Frame, out: &mut Vec<Action>) {
        if let Some(r) = receipt_of(frame) {
            self.receipts.expect(Some(r), false, false);
            self.take_due(out);
        }
    }

    /// A token for `frame`'s RECEIPT that waits for the array, if the frame asks for one.
    fn receipt_token(&mut self, frame: &Frame) -> Option<u64> {
        receipt_of(frame).map(|r| self.receipts.expect(Some(r), true, false))
    }

    fn on_connect(&mut self, frame: &Frame, host: &dyn Host, out: &mut Vec<Action>) -> bool {
        let h = &frame.headers;
        let Some(version) = negotiate_version(h.get(b"accept-version")) else {
            self.fail(WireError::UnsupportedVersion, None, out);
            return false;
        };
        let max = self.cfg.max_connections;
        if max > 0 && host.open_connections() > max {
            self.fail(WireError::TooManyConnections(Some(max)), None, out);
            return false;
        }
        let login = h.get(b"login").filter(|l| !l.is_empty());
        let verified = match host.authenticate(login, h.get(b"passcode")) {
            Ok(id) => id,
            Err(Denied) => {
                self.fail(WireError::AccessDenied, None, out);
                return false;
            }
        };
        let (client_hb, advertised) = if version == Version::V1_0 {
            ((0, 0), (0, 0))
        } else {
            match parse_heart_beat(h.get(b"heart-beat")) {
                Ok(hb) => (hb, (self.cfg.heartbeat_ms, self.cfg.heartbeat_ms)),
                Err(()) => {
                    self.fail(WireError::MalformedFrame(Malformed::BadHeartBeat), None, out);
                    return false;
                }
            }
        };
        self.version = version;
        self.state = State::Connected;
        // A copy of `login`, not a view: a view would keep the whole read buffer the CONNECT
        // arrived in alive for as long as the connection.
        if let Some(id) = verified.or_else(|| self.transport_identity.clone()).or_else(|| login.map(Bytes::copy_from_slice)) {
            self.client_id = id;
        }
        out.push(Action::Connected { version, heart_beat: negotiate_heart_beat(client_hb, advertised), advertised, session: self.session_id.clone() });
        true
    }

    fn handle_connected(&mut self, frame: &Frame, host: &dyn Host, from_commit: bool, out: &mut Vec<Action>) -> bool {
        if !matches!(frame.command, Command::Ack | Command::Nack) {
            self.flush_settles(out);
        }
        let result = match frame.command {
            Command::Send => self.on_send(frame, host, from_commit, out),
            Command::Subscribe => self.on_subscribe(frame, host, out),
            Command::Unsubscribe => self.on_unsubscribe(frame, out),
            Command::Ack => self.on_settle(frame, Settle::Ack, from_commit, out),
            Command::Nack => self.on_settle(frame, Settle::Nack, from_commit, out),
            Command::Begin => self.on_begin(frame, out),
            Command::Commit => self.on_commit(frame, host, out),
            Command::Abort => self.on_abort(frame, out),
            Command::Disconnect => {
                self.on_disconnect(frame, out);
                return false;
            }
            Command::Connect | Command::Stomp => Err((WireError::MalformedFrame(Malformed::SecondConnect), receipt_of(frame))),
            // A server frame sent by a client.
            _ => Err((WireError::MalformedFrame(Malformed::ServerFrame), receipt_of(frame))),
        };
        match result {
            Ok(()) => self.state == State::Connected,
            Err((err, receipt)) => {
                self.fail(err, receipt, out);
                false
            }
        }
    }

    /// Holds `frame` in its transaction, if it names one. `Ok(true)` = held.
    fn hold_in_transaction(&mut self, frame: &Frame, from_commit: bool) -> Result<bool, (WireError, Option<Bytes>)> {
        if from_commit {
            return Ok(false);
        }
        let Some(tx) = frame.headers.get(b"transaction") else { return Ok(false) };
        match self.txs.get_mut(tx) {
            Some(held) if held.len() >= self.cfg.max_tx_frames => Err((WireError::TooManyTxFrames(self.cfg.max_tx_frames), receipt_of(frame))),
            Some(held) => {
                held.push(frame.clone());
                Ok(true)
            }
            None => Err((WireError::UnknownTransaction, receipt_of(frame))),
        }
    }

    /// The destination of a SEND naming `raw`. A producer names the same destination SEND after
    /// SEND, so the last one parsed is kept: the same bytes again (one comparison) give its
    /// parse, channel shared, without the checks and the channel's allocation (about 10 % of a
    /// queue message's instructions, perf/RESULTS.md). Only a valid destination is kept; the
    /// parse depends on nothing else that can change during a session (the default pattern is
    /// the session's configuration).
    fn send_destination(&mut self, raw: &[u8]) -> Result<Destination, DestinationError> {
        if let Some(last) = &self.last_send {
            if last.0 == raw {
                return Ok(last.1.clone());
            }
        }
        let dest = parse_destination(raw, self.cfg.default_pattern, Intent::Send)?;
        // A copy of the raw bytes: a view would pin the connection's read buffer.
        let kept = (Bytes::copy_from_slice(raw), dest.clone());
        match &mut self.last_send {
            Some(last) => **last = kept,
            None => self.last_send = Some(Box::new(kept)),
        }
        Ok(dest)
    }

    fn on_send(&mut self, frame: &Frame, host: &dyn Host, from_commit: bool, out: &mut Vec<Action>) -> Handled {
        let Some(raw) = frame.headers.get(b"destination") else { return reject(frame, WireError::MalformedFrame(Malformed::SendWithoutDestination)) };
        let dest = self.send_destination(raw).map_err(|e| (destination_error(e), receipt_of(frame)))?;
        if !self.authz.allows(host, &self.client_id, dest.pattern, &dest.channel.0, Access::Write) {
            return reject(frame, WireError::AccessDenied);
        }
        let tags = headers_to_tags(&frame.headers).map_err(|_| (WireError::FrameTooLarge(TAGS_LIMIT), receipt_of(frame)))?;
        // Validated now, so a bad frame fails at SEND time even inside a transaction.
        if self.hold_in_transaction(frame, from_commit)? {
            self.receipt_now(frame, out);
            return Ok(());
        }
        let msg = Message {
            id: host.new_message_id(),
            channel: dest.channel,
            client_id: self.client_id.clone(),
            metadata: Bytes::new(),
            body: frame.body.clone(),
            tags,
            timestamp_ns: host.now_ns(),
            sequence: 0,
        };
        match dest.pattern {
            Pattern::Events | Pattern::EventsStore => {
                let done = self.receipt_token(frame);
                out.push(Action::Array { op: ArrayOp::Publish { pattern: dest.pattern, msg: Arc::new(msg) }, done });
            }
            Pattern::Queues => {
                let done = self.receipt_token(frame);
                out.push(Action::Array { op: ArrayOp::QueueSend { msg: Arc::new(msg) }, done });
            }
            Pattern::Commands | Pattern::Queries => {
                let reply_sub = self.rpc_reply_sub(frame)?;
                if self.rpc_pending >= self.cfg.rpc_max_pending {
                    return reject(frame, WireError::TooManyPending(self.cfg.rpc_max_pending));
                }
                let max_ms = self.cfg.rpc_timeout_s.saturating_mul(1000);
                let timeout_ms = match frame.headers.get_str(b"timeout") {
                    None => max_ms,
                    Some(t) => match t.trim().parse::<u64>() {
                        Ok(0) => max_ms,
                        Ok(ms) => ms.min(max_ms),
                        Err(_) => return reject(frame, WireError::MalformedFrame(Malformed::BadTimeout)),
                    },
                };
                let Ok(cache) = query_cache(frame) else { return reject(frame, WireError::MalformedFrame(Malformed::BadCacheTtl)) };
                // Commands are never cached (kubemq-patterns.md §5.2); their headers are only checked.
                let cache = cache.filter(|_| dest.pattern == Pattern::Queries);
                self.rpc_pending += 1;
                let correlation_id = frame.headers.get_bytes(b"correlation-id");
                out.push(Action::Array {
                    op: ArrayOp::Request { pattern: dest.pattern, msg: Arc::new(msg), timeout_ms, reply_sub, correlation_id, cache },
                    done: None,
                });
                self.receipt_now(frame, out);
            }
            Pattern::Reply => unreachable!("the router refuses SEND to /reply/"),
        }
        Ok(())
    }

    /// The `/reply/` subscription a request's `reply-to` names (seed 003: required, and it
    /// must be an active subscription of this connection).
    fn rpc_reply_sub(&self, frame: &Frame) -> Result<SubNo, (WireError, Option<Bytes>)> {
        let Some(reply_to) = frame.headers.get(b"reply-to") else { return Err((WireError::MissingReplyTo, receipt_of(frame))) };
        let not_subscribed = || (WireError::ReplyToNotSubscribed, receipt_of(frame));
        let dest = parse_destination(reply_to, self.cfg.default_pattern, Intent::Subscribe).map_err(|_| not_subscribed())?;
        if dest.pattern != Pattern::Reply {
            return Err(not_subscribed());
        }
        self.subs.reply_target(&dest.channel.0).ok_or_else(not_subscribed)
    }

    fn on_subscribe(&mut self, frame: &Frame, host: &dyn Host, out: &mut Vec<Action>) -> Handled {
        let h = &frame.headers;
        let Some(raw) = h.get(b"destination") else { return reject(frame, WireError::MalformedFrame(Malformed::SubscribeWithoutDestination)) };
        let id = match (h.get(b"id"), self.version) {
            (Some(id), _) => id,
            (None, Version::V1_0) => raw,
            (None, _) => return reject(frame, WireError::MalformedFrame(Malformed::SubscribeWithoutId)),
        };
        let ack = match h.get(b"ack") {
            None | Some(b"auto") => AckMode::Auto,
            Some(b"client") => AckMode::Client,
            Some(b"client-individual") => AckMode::ClientIndividual,
            Some(_) => return reject(frame, WireError::MalformedFrame(Malformed::BadAckMode)),
        };
        let dest = parse_destination(raw, self.cfg.default_pattern, Intent::Subscribe).map_err(|e| (destination_error(e), receipt_of(frame)))?;
        // `/reply/` is local to this connection: always allowed (never asked of the rules).
        if dest.pattern != Pattern::Reply && !self.authz.allows(host, &self.client_id, dest.pattern, &dest.channel.0, Access::Read) {
            return reject(frame, WireError::AccessDenied);
        }
        let start = match (dest.pattern, h.get(b"x-kubemq-start")) {
            (Pattern::EventsStore, Some(v)) => match start::parse_start(v, host.now_ns()) {
                Some(s) => s,
                None => return reject(frame, WireError::MalformedFrame(Malformed::BadStart)),
            },
            _ => StartAt::NewOnly,
        };
        let group = match dest.pattern {
            Pattern::Events | Pattern::EventsStore => h.get(b"x-kubemq-group").filter(|g| !g.is_empty()),
            _ => None,
        };
        // Copies, not views: a subscription (here, and the channel in the array's registries)
        // lives as long as the connection, and a view would keep alive the whole read buffer
        // the SUBSCRIBE arrived in (up to 256 KiB when it came in a burst).
        let (id, channel, group) = (Bytes::copy_from_slice(id), Channel(Bytes::copy_from_slice(&dest.channel.0)), group.map(Bytes::copy_from_slice));
        let sub = Subscription::new(id, dest.pattern, channel.clone(), dest.wildcard, ack);
        // Checked after the frame is validated, before anything is taken: a malformed
        // SUBSCRIBE is still reported as malformed at the cap.
        if self.subs.len() >= self.cfg.max_subscriptions {
            return reject(frame, WireError::TooManySubscriptions(self.cfg.max_subscriptions));
        }
        let Some(n) = self.subs.add(sub) else { return reject(frame, WireError::DuplicateSubscription) };
        if dest.pattern == Pattern::Reply {
            // Connection-local: no array, nothing to wait for.
            self.receipt_now(frame, out);
            return Ok(());
        }
        let done = self.receipt_token(frame);
        let prefetch = u32::try_from(self.cfg.sub_buff_size).unwrap_or(u32::MAX);
        let op = ArrayOp::Subscribe { sub: n, pattern: dest.pattern, channel, wildcard: dest.wildcard, group, start, prefetch };
        out.push(Action::Array { op, done });
        Ok(())
    }

    /// Removes subscription `n` and, unless it is a local `/reply/` one, tells the array
    /// (with `done` confirming it). Returns whether the array was told.
    fn drop_subscription(&mut self, n: SubNo, done: Option<u64>, out: &mut Vec<Action>) -> bool {
        let Some(mut sub) = self.subs.remove(n) else { return false };
        // Parked deliveries die with the subscription; receipts waiting on them must not.
        out.extend(sub.parked.drain().filter_map(|p| p.ticket).map(Action::SettleParked));
        if sub.pattern == Pattern::Reply {
            return false;
        }
        out.push(Action::Array { op: ArrayOp::Unsubscribe { sub: n, pattern: sub.pattern, channel: sub.channel, wildcard: sub.wildcard }, done });
        true
    }

    fn on_unsubscribe(&mut self, frame: &Frame, out: &mut Vec<Action>) -> Handled {
        let h = &frame.headers;
        let id = match (h.get(b"id"), self.version) {
            (Some(id), _) => id,
            (None, Version::V1_0) => match h.get(b"destination") {
                Some(d) => d,
                None => return reject(frame, WireError::MalformedFrame(Malformed::Unsubscribe10WithoutIdOrDestination)),
            },
            (None, _) => return reject(frame, WireError::MalformedFrame(Malformed::UnsubscribeWithoutId)),
        };
        let Some(n) = self.subs.number_of(id) else { return reject(frame, WireError::UnknownSubscription) };
        let local = self.subs.get(n).is_some_and(|s| s.pattern == Pattern::Reply);
        if local {
            self.drop_subscription(n, None, out);
            self.receipt_now(frame, out);
        } else {
            let done = self.receipt_token(frame);
            self.drop_subscription(n, done, out);
        }
        Ok(())
    }

    /// ACK (`Settle::Ack`) or NACK (`Settle::Nack`).
    fn on_settle(&mut self, frame: &Frame, action: Settle, from_commit: bool, out: &mut Vec<Action>) -> Handled {
        let h = &frame.headers;
        let id = match self.version {
            Version::V1_2 => h.get(b"id"),
            _ => h.get(b"message-id"),
        };
        let missing = if self.version == Version::V1_2 { Malformed::AckWithoutId } else { Malformed::AckWithoutMessageId };
        let Some(id) = id else { return reject(frame, WireError::MalformedFrame(missing)) };
        if self.hold_in_transaction(frame, from_commit)? {
            self.receipt_now(frame, out);
            return Ok(());
        }
        // Anything that is not a queue delivery id (events, events-store: ACKs are no-ops), or
        // a delivery this connection no longer holds (requeued by a timeout), is acknowledged
        // as is.
        let settle = message_id::parse_queue(id).and_then(|(owner, tag)| self.subs.take_unacked(owner, tag)).map(|(sub, s, tags)| PendingSettle {
            sub,
            channel: s.channel.clone(),
            action,
            tags,
        });
        match settle {
            Some(next) => {
                self.merge_settle(next, out);
                if let Some(done) = self.receipt_token(frame) {
                    // The RECEIPT proves this settle (and the ones merged ahead of it) took effect.
                    self.send_settles(Some(done), out);
                }
            }
            None => {
                // Keep frame order: settles read before this one go out before its RECEIPT.
                self.flush_settles(out);
                self.receipt_now(frame, out);
            }
        }
        Ok(())
    }

    /// Merges `next` into the pending settle when it names the same subscription and action;
    /// otherwise sends the pending one first.
    fn merge_settle(&mut self, next: PendingSettle, out: &mut Vec<Action>) {
        if let Some(p) = self.pending_settle.as_mut() {
            if p.sub == next.sub && p.action == next.action {
                p.tags.extend_from_slice(&next.tags);
                return;
            }
        }
        if let Some(p) = self.pending_settle.replace(next) {
            out.push(Action::Array { op: ArrayOp::Settle { sub: p.sub, channel: p.channel, tags: p.tags, action: p.action }, done: None });
        }
    }

    /// Sends the pending settle, if any, with `done` confirming it.
    fn send_settles(&mut self, done: Option<u64>, out: &mut Vec<Action>) {
        if let Some(p) = self.pending_settle.take() {
            out.push(Action::Array { op: ArrayOp::Settle { sub: p.sub, channel: p.channel, tags: p.tags, action: p.action }, done });
        }
    }

    fn flush_settles(&mut self, out: &mut Vec<Action>) {
        self.send_settles(None, out);
    }

    fn on_begin(&mut self, frame: &Frame, out: &mut Vec<Action>) -> Handled {
        let Some(tx) = frame.headers.get(b"transaction") else { return reject(frame, WireError::MalformedFrame(Malformed::BeginWithoutTransaction)) };
        if self.txs.contains_key(tx) {
            return reject(frame, WireError::MalformedFrame(Malformed::TransactionAlreadyOpen));
        }
        if self.txs.len() >= self.cfg.max_transactions {
            return reject(frame, WireError::TooManyTransactions(self.cfg.max_transactions));
        }
        // A copy: the transaction outlives the read buffer the BEGIN arrived in.
        self.txs.insert(Bytes::copy_from_slice(tx), Vec::new());
        self.receipt_now(frame, out);
        Ok(())
    }

    fn take_transaction(&mut self, frame: &Frame) -> Result<Vec<Frame>, (WireError, Option<Bytes>)> {
        let Some(tx) = frame.headers.get(b"transaction") else {
            return Err((WireError::MalformedFrame(Malformed::CommitWithoutTransaction), receipt_of(frame)));
        };
        self.txs.remove(tx).ok_or_else(|| (WireError::UnknownTransaction, receipt_of(frame)))
    }

    fn on_commit(&mut self, frame: &Frame, host: &dyn Host, out: &mut Vec<Action>) -> Handled {
        for mut held in self.take_transaction(frame)? {
            // Receipts of held frames were already sent when they were held.
            held.headers.remove_all(b"receipt");
            if !self.handle_connected(&held, host, true, out) {
                return Ok(());
            }
        }
        // Held ACKs/NACKs go out before the barrier that proves them.
        self.flush_settles(out);
        // The RECEIPT must prove the held frames took effect.
        if let Some(r) = receipt_of(frame) {
            let done = self.receipts.expect(Some(r), true, false);
            out.push(Action::Array { op: ArrayOp::Barrier, done: Some(done) });
        }
        Ok(())
    }

    fn on_abort(&mut self, frame: &Frame, out: &mut Vec<Action>) -> Handled {
        self.take_transaction(frame)?;
        self.receipt_now(frame, out);
        Ok(())
    }

    fn on_disconnect(&mut self, frame: &Frame, out: &mut Vec<Action>) {
        self.state = State::Disconnecting;
        match receipt_of(frame) {
            Some(r) => {
                let done = self.receipts.expect(Some(r), true, true);
                out.push(Action::Array { op: ArrayOp::Barrier, done: Some(done) });
            }
            None => {
                self.receipts.expect(None, false, true);
                self.take_due(out);
            }
        }
    }
}

/// `frame too large` for headers that cannot become KubeMQ tags (route::tags' bounds).
const TAGS_LIMIT: TooLarge = TooLarge::Tags { max_custom: MAX_CUSTOM_TAGS, max_value: MAX_TAG_VALUE_LEN };

fn receipt_of(frame: &Frame) -> Option<Bytes> {
    frame.headers.get_bytes(b"receipt")
}

/// Fails `frame` with `err`, echoing its receipt.
fn reject(frame: &Frame, err: WireError) -> Handled {
    Err((err, receipt_of(frame)))
}

fn destination_error(e: DestinationError) -> WireError {
    match e {
        DestinationError::Invalid => WireError::InvalidDestination,
        DestinationError::SendToReply => WireError::CannotSendToReply,
        DestinationError::SubscribeToRpc => WireError::CannotSubscribeRpc,
    }
}

/// A request's `x-kubemq-cache-key` / `x-kubemq-cache-ttl` (README "Query cache"): with a
/// non-empty key, the TTL must be a positive integer of seconds (KubeMQ's CacheTTL, an int32);
/// a TTL without a key is checked and ignored. `Err` = a bad or missing TTL.
fn query_cache(frame: &Frame) -> Result<Option<CacheSpec>, ()> {
    let key = frame.headers.get(b"x-kubemq-cache-key").filter(|k| !k.is_empty());
    let ttl = match frame.headers.get_str(b"x-kubemq-cache-ttl") {
        None => None,
        Some(t) => match t.trim().parse::<u32>() {
            Ok(s) if s > 0 && s <= i32::MAX as u32 => Some(s),
            _ => return Err(()),
        },
    };
    match (key, ttl) {
        (Some(key), Some(ttl_s)) => Ok(Some(CacheSpec { key: Bytes::copy_from_slice(key), ttl_s })),
        (Some(_), None) => Err(()),
        (None, _) => Ok(None),
    }
}
