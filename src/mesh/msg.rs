//! The one closed set of messages cores exchange (design.md, "Cores"). Every cross-core
//! interaction is a `CoreMsg` over glommio's channel mesh, gathered into one ring entry per peer
//! per loop turn (`engine::batch`), in order; a message to the sending core itself goes through
//! the core's local queue at once, so local and remote behave alike except for when.
//!
//! Full rings (`engine::dispatch`): every message waits in the sending core's per-peer overflow
//! queue until the ring has room, and while any core's overflow queue is long every core's
//! readers pause (back-pressure onto the clients producing it). Only a `Deliver` without a
//! ticket (events, owner → subscriber core) may be dropped, and counted, once that queue holds
//! `LOSSY_SPILL_LIMIT` messages — events are at-most-once (seed 003); a ticketed `Deliver` (its
//! publisher's RECEIPT waits for it) never is. Senders outside the cores (`ArrayHandle`, the egress link) use
//! unbounded channels: nothing there is dropped either.

use crate::model::{Channel, Message, Pattern};
use bytes::Bytes;
use std::sync::Arc;

/// Index of a core in the mesh (0 .. the core count).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CoreId(pub usize);

impl CoreId {
    /// The position of this core in per-core tables (the mesh's senders, per-core lists).
    pub fn index(self) -> usize {
        self.0
    }

    /// Every core of a mesh of `cores`, in order.
    pub fn all(cores: usize) -> impl Iterator<Item = CoreId> {
        (0..cores).map(CoreId)
    }
}

impl std::fmt::Display for CoreId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

/// A connection, unique within its core for the process's life.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ConnId(pub u64);

/// A subscription's number within its connection, assigned by the gateway (not the client's
/// `id` header, which is the client's own name for it).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SubNo(pub u32);

impl std::fmt::Display for SubNo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

/// A subscription anywhere in the process: core, connection and the connection-local
/// subscription number (not the client's `id` header, which may repeat across connections).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SubRef {
    pub core: CoreId,
    pub conn: ConnId,
    pub sub: SubNo,
}

/// The subscriptions one `Deliver` is for, all on the receiving core.
#[derive(Clone, Debug)]
pub enum SubList {
    /// One subscription (an Events-Store replay, a paced delivery): nothing allocated.
    One(SubRef),
    /// A list built for this message alone (consumer-group picks, the remote array's egress).
    Owned(Vec<SubRef>),
    /// A channel's list for that core, shared by every message published to the channel while
    /// its subscriptions do not change (`array::events`, "Plans"): one reference count per
    /// message instead of an allocation on the publishing core and a free on the receiving one.
    Shared(Arc<[SubRef]>),
}

impl SubList {
    pub fn as_slice(&self) -> &[SubRef] {
        match self {
            SubList::One(sub) => std::slice::from_ref(sub),
            SubList::Owned(subs) => subs,
            SubList::Shared(subs) => subs,
        }
    }
}

/// Where Events-Store delivery starts (`x-kubemq-start`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StartAt {
    NewOnly,
    First,
    Last,
    Sequence(u64),
    /// Unix nanoseconds.
    Time(i64),
}

/// An operation the requesting connection waits for (a RECEIPT, or ordering a DISCONNECT
/// receipt after everything before it). The owner echoes it back in `Done`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Ticket {
    pub core: CoreId,
    pub conn: ConnId,
    pub token: u64,
}

/// The outcome of a Commands/Queries request, as the requester's reply subscription shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RpcOutcome {
    /// The responder answered. `error` non-empty = a logical failure (`stomp-error: failed`).
    Response {
        executed: bool,
        error: Bytes,
        metadata: Bytes,
        body: Bytes,
        tags: crate::model::Tags,
        responder: Bytes,
        timestamp_ns: i64,
        /// The responder's opaque tracing blob (`Response.Span`), passed back to the requester.
        span: Bytes,
        /// A query answered from the owner core's cache (`Response.CacheHit`).
        cache_hit: bool,
    },
    Timeout,
    NoResponder,
    Unavailable,
}

/// A request waiting for a responder, as the owner of its channel keeps it.
#[derive(Clone, Debug)]
pub struct RpcRequest {
    pub pattern: Pattern,
    pub request_id: Bytes,
    pub msg: Arc<Message>,
    pub timeout_ms: u64,
    /// The requester's `/reply/` subscription.
    pub reply_to: SubRef,
    pub correlation_id: Option<Bytes>,
    /// A native requester's opaque tracing blob (`Request.Span`), passed to the responder.
    pub span: Bytes,
    /// A query's `CacheKey` and `CacheTTL`: answer from the owner's cache, or cache the answer.
    pub cache: Option<CacheSpec>,
}

/// Where a query's answer is cached (kubemq-patterns.md §5.2): a non-empty key, and a time to
/// live > 0 in seconds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CacheSpec {
    pub key: Bytes,
    pub ttl_s: u32,
}

/// A typed channel from a core to a task outside the cores: the answer to a pull or a channel
/// listing, or the request feed of a responder. Data, not a callback: the core only sends and
/// never runs the asker's code on its thread. Unbounded, so a send never blocks a core; it
/// fails when the receiver is gone (the asker left), which tells the core to undo what it did
/// for it (put reserved messages back, try another responder).
pub struct Mailbox<T>(flume::Sender<T>);

impl<T> Mailbox<T> {
    /// A mailbox and the receiver its owner reads (blocking, with a timeout, or async).
    pub fn new() -> (Mailbox<T>, flume::Receiver<T>) {
        let (tx, rx) = flume::unbounded();
        (Mailbox(tx), rx)
    }

    /// False when the receiver is gone.
    pub fn send(&self, value: T) -> bool {
        self.0.send(value).is_ok()
    }
}

impl<T> Clone for Mailbox<T> {
    fn clone(&self) -> Self {
        Mailbox(self.0.clone())
    }
}

impl<T> std::fmt::Debug for Mailbox<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Mailbox")
    }
}

/// What a queue settlement does to the deliveries it names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Settle {
    /// Done with: remove.
    Ack,
    /// Rejected: back to the tail; the delivery counts toward the receive limit.
    Nack,
    /// Given back unprocessed (stream closed, transaction closed): back to the head.
    Release,
    /// Moved to another queue with its receive count reset (gRPC ReQueue).
    Requeue(Box<Channel>),
}

/// A queue sender's policy, resolved to absolute times by the sender side.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct QueueMeta {
    /// Unix ns after which the message is discarded instead of delivered; 0 = never.
    pub expires_at_ns: i64,
    /// Unix ns before which the message is not delivered; 0 = at once.
    pub delayed_to_ns: i64,
    /// Deliveries allowed before the message is dead-lettered; 0 = the array default.
    pub max_receive: u32,
    /// Where a message goes when it exceeds `max_receive`; none = discarded.
    pub dead_letter: Option<Channel>,
    /// Set on a dead-lettered copy: the queue it came from.
    pub rerouted_from: Option<Channel>,
}

/// How a pull takes messages.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PullMode {
    /// Reserve for the holder until settled (QueuesDownstream Get).
    Reserve,
    /// Remove at once (auto-ack, `ReceiveQueueMessages` pull).
    Remove,
    /// Look without taking (`ReceiveQueueMessages` peek).
    Peek,
    /// Remove everything ready now and report the count (`AckAllQueueMessages`).
    Purge,
}

/// One queue message handed to a pull, with its server-side attributes.
#[derive(Clone, Debug)]
pub struct Pulled {
    pub msg: Arc<Message>,
    /// The owner's delivery tag (what a `QueueSettle` names).
    pub tag: u64,
    /// Per-queue sequence (gRPC `Attributes.Sequence`).
    pub seq: u64,
    /// Deliveries including this one.
    pub receive_count: u32,
    pub expires_at_ns: i64,
    pub delayed_to_ns: i64,
    pub rerouted_from: Option<Channel>,
}

#[derive(Debug, Default)]
pub struct PullResult {
    /// The `token` of the request it answers.
    pub token: u64,
    pub messages: Vec<Pulled>,
    /// Expired messages discarded while collecting.
    pub expired: u32,
    /// `Purge`: how many messages were removed.
    pub purged: u64,
}

pub struct PullRequest {
    pub channel: Channel,
    /// Who holds reserved messages (settles and releases them by this `SubRef`).
    pub holder: SubRef,
    pub max: u32,
    /// How long to wait for a first message when none is ready.
    pub wait: std::time::Duration,
    pub mode: PullMode,
    /// The asker's own number for this pull, echoed in its `PullResult` (one mailbox may
    /// collect the answers to many pulls).
    pub token: u64,
    /// Where the answer goes, once. If the asker is gone by then, reserved messages go back.
    pub reply: Mailbox<PullResult>,
}

/// A channel as channel management lists it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ChannelStats {
    pub name: Channel,
    pub messages: u64,
    pub bytes: u64,
    pub waiting: u64,
    /// Queues: messages delivered (to a consumer or a pull) and not yet settled; 0 for the
    /// other patterns.
    pub unacked: u64,
    pub subscribers: u64,
}

/// How many bytes of a client-chosen name (client id, subscription id) the operator view shows.
pub const VIEW_TEXT_MAX: usize = 256;

/// One STOMP connection in the operator view, built on its core from its own state.
#[derive(Clone, Debug)]
pub struct ConnectionView {
    /// At most [`VIEW_TEXT_MAX`] bytes.
    pub client_id: Bytes,
    pub peer: Option<std::net::SocketAddr>,
    pub version: &'static str,
    /// When CONNECTED was sent, Unix ms.
    pub connected_at_ms: u64,
    pub frames_in: u64,
    pub bytes_in: u64,
    pub frames_out: u64,
    pub bytes_out: u64,
    pub subscriptions: Vec<SubscriptionView>,
}

#[derive(Clone, Debug)]
pub struct SubscriptionView {
    /// At most [`VIEW_TEXT_MAX`] bytes.
    pub id: Bytes,
    pub pattern: Pattern,
    pub channel: Channel,
    pub ack: &'static str,
    /// Queue deliveries not yet acknowledged.
    pub unacked: u64,
}

/// One AMQP 1.0 connection as `/api/amqp10/connections` shows it (and its links, as
/// `/api/amqp10/links` does): listed once its OPEN was answered. Texts are at most
/// [`VIEW_TEXT_MAX`] bytes.
#[derive(Clone, Debug)]
pub struct AmqpConnectionView {
    pub client_id: Bytes,
    /// The client's OPEN container-id.
    pub container_id: Bytes,
    /// `product` and `version` from the client's OPEN properties, when given as strings.
    pub product: Option<Bytes>,
    pub version: Option<Bytes>,
    pub sessions: u32,
    /// When the OPEN was answered, Unix ms.
    pub connected_at_ms: u64,
    pub peer: Option<std::net::SocketAddr>,
    /// The SASL mechanism that authenticated it (`ANONYMOUS`, `PLAIN`, `EXTERNAL`), or `none`.
    pub sasl: &'static str,
    pub tls: bool,
    pub links: Vec<AmqpLinkView>,
}

/// One attached link of an AMQP connection.
#[derive(Clone, Debug)]
pub struct AmqpLinkView {
    pub name: Bytes,
    /// The client's role: `sender` (the client sends to us) or `receiver`.
    pub role: &'static str,
    /// The address the client attached to (a dynamic node's minted one); None for a null
    /// target (the anonymous sender).
    pub address: Option<Bytes>,
    /// `queues`, `events`, `events-store`, `commands`, `queries`; None for the special nodes
    /// (anonymous, dynamic, `responses/`).
    pub pattern: Option<&'static str>,
    pub channel: Option<Bytes>,
    /// Receiver: the credit the client gave us and we have not used; sender: the credit we
    /// gave the client and it has not used.
    pub credit: u32,
    /// Receiver: queue deliveries sent and not settled by the client; sender: the client's
    /// unsettled transfers waiting for the array's answer.
    pub unsettled: u32,
    pub durable: bool,
    pub dynamic: bool,
}

/// A delivery target outside the cores (see `CoreMsg::AttachSink`), as a STOMP connection is one
/// inside them (`engine::endpoint::Endpoint`). A trait object, not a mailbox, because a
/// delivery needs an answer at once, on the core thread: whether the sink parked it (holding
/// its publisher's ticket) or took it. Implementations hand off to their own queue and never
/// block.
pub trait ExternalSink: Send + Sync {
    /// An Events / Events-Store delivery. True when the sink parked it while holding `ticket`:
    /// it then owes the delivering core a `CoreMsg::SinkSettled` for that ticket once the
    /// delivery is taken or dropped (as a STOMP subscription parks, so a slow gRPC subscriber
    /// paces publishers instead of losing events at once).
    fn deliver(&self, _pattern: Pattern, _msg: &Arc<Message>, _ticket: Option<Ticket>) -> bool {
        false
    }
    /// The answer to a Commands/Queries request this sink made.
    fn rpc_reply(&self, _outcome: RpcOutcome) {}
    /// A confirmation for a ticket this sink issued (see `CoreMsg::Done`).
    fn done(&self, _token: u64, _more: u32) {}
    /// A send this sink issued was refused (see `CoreMsg::Refused`).
    fn refused(&self, _token: u64, _why: Refusal) {}
    /// An operation this sink issued failed for good (see `CoreMsg::Failed`).
    fn failed(&self, _token: u64) {}
}

/// Why the array refused a send: nothing was appended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// The queue is at its depth limit (`--queue-max-messages`, `--queue-max-bytes`).
    QueueFull,
    /// The persistent store has no room: `--store-max-bytes`, or its disk is full (ENOSPC).
    StoreFull,
}

/// [`CoreMsg::Subscribe`]'s fields.
pub struct SubscribeArgs {
    pub pattern: Pattern,
    pub channel: Channel,
    pub wildcard: bool,
    pub sub: SubRef,
    pub group: Option<Bytes>,
    pub start: StartAt,
    /// Queues: how many unacknowledged messages this consumer may hold (SubBuffSize).
    pub prefetch: u32,
    pub done: Option<Ticket>,
}

/// [`CoreMsg::QueueSettle`]'s fields.
pub struct SettleArgs {
    pub channel: Channel,
    pub sub: SubRef,
    pub tags: Vec<u64>,
    pub action: Settle,
    pub done: Option<Ticket>,
}

pub enum CoreMsg {
    // ---- to the owner core of (pattern, channel) ----
    /// Publish to Events or Events-Store. Never dropped on the way to the owner (a full ring
    /// spills into the overflow queue and pauses this core's readers), so a publisher feels
    /// back-pressure instead of losing messages; `done` is confirmed per `Deliver` below.
    Publish {
        pattern: Pattern,
        msg: Arc<Message>,
        done: Option<Ticket>,
    },
    /// Append to a queue; `done` is answered once appended. `meta`: the sender's policy
    /// (expiration, delay, receive limit, dead-letter queue); STOMP SENDs carry none.
    QueueSend {
        msg: Arc<Message>,
        meta: Option<Box<QueueMeta>>,
        done: Option<Ticket>,
    },
    /// Register a subscription. Wildcard Events filters go to every core. Boxed, as rare
    /// messages with many fields are (see the size assertion below).
    Subscribe(Box<SubscribeArgs>),
    /// Remove a subscription; for queues its unacknowledged messages are requeued first.
    Unsubscribe {
        pattern: Pattern,
        channel: Channel,
        wildcard: bool,
        sub: SubRef,
        done: Option<Ticket>,
    },
    /// Settle queue deliveries by tag (ACK, NACK, release, or move to another queue); one per
    /// batch of settlements, so boxed.
    QueueSettle(Box<SettleArgs>),
    /// Set how many unsettled messages a queue subscription may hold (0 = none; lowering takes
    /// nothing back). Each carries the whole value, so a lost one is made good by the next;
    /// until then the subscription keeps its old prefetch.
    QueuePrefetch {
        channel: Channel,
        sub: SubRef,
        prefetch: u32,
    },
    /// A pull-mode receive (gRPC `QueuesDownstream` Get, `ReceiveQueueMessages`,
    /// `AckAllQueueMessages`): answered once, into the request's mailbox.
    QueuePull(Box<PullRequest>),
    /// A Commands/Queries request for the owner to hand to a responder.
    RpcRequest(Box<RpcRequest>),
    /// A responder's answer, routed to the owner that holds the pending request.
    RpcResponse {
        pattern: Pattern,
        channel: Channel,
        request_id: Bytes,
        outcome: Box<RpcOutcome>,
        /// Sent by an AMQP 1.0 responder: a late answer is counted
        /// (`kubemq_amqp10_rpc_late_responses_total`).
        amqp: bool,
    },
    /// Attach a responder to (pattern, channel): requests for it go into `requests` (a
    /// failed send means the responder is gone, and the owner tries another).
    RegisterResponder {
        pattern: Pattern,
        channel: Channel,
        responder_id: u64,
        group: Option<Bytes>,
        requests: Mailbox<RpcRequest>,
    },
    UnregisterResponder {
        pattern: Pattern,
        channel: Channel,
        responder_id: u64,
    },

    /// Attach a delivery target that is not a STOMP connection (a gRPC subscriber or a gRPC
    /// requester waiting for its answer) under a connection id on this core. `SubRef`s with
    /// that connection id then deliver to it exactly as to a connection.
    AttachSink {
        conn: ConnId,
        sink: Arc<dyn ExternalSink>,
    },
    DetachSink {
        conn: ConnId,
    },
    /// Channel management's delete, to the channel's owner.
    DeleteChannel {
        pattern: Pattern,
        channel: Channel,
    },
    /// Which channels of `pattern` this core owns, with counters (channel management).
    ListChannels {
        pattern: Pattern,
        reply: Mailbox<Vec<ChannelStats>>,
    },
    /// The STOMP connections this core serves (the operator view `/api/stomp/connections`).
    ListConnections {
        reply: Mailbox<Vec<ConnectionView>>,
    },
    /// The AMQP 1.0 connections this core serves (`/api/amqp10/connections` and `/links`).
    ListAmqpConnections {
        reply: Mailbox<Vec<AmqpConnectionView>>,
    },

    /// Answered with `Done` once everything sent before it on this path has been handled:
    /// orders a DISCONNECT receipt after the connection's earlier work (spec: "receipt on
    /// DISCONNECT").
    Barrier(Ticket),

    // ---- to the subscriber's core ----
    /// Events / Events-Store delivery of one shared message to some of that core's subscriptions.
    /// With `done`, the core confirms (`Delivered`) once every one of those subscriptions has
    /// the frame in its write queue (or has lost it to the slow-subscriber rule): that is what a
    /// RECEIPT for an events SEND waits for, so a publisher that asks for receipts is paced by
    /// its subscribers instead of overrunning them. Full ring: waits (without
    /// `done`: dropped and counted past `LOSSY_SPILL_LIMIT` in the overflow queue).
    Deliver {
        pattern: Pattern,
        msg: Arc<Message>,
        subs: SubList,
        done: Option<Ticket>,
    },
    /// One queue delivery, tagged by the owner for ACK/NACK. `receive_count`: deliveries of
    /// the message so far, this one included (1 = first; STOMP's `redelivered` is `> 1`, an
    /// AMQP header's delivery-count is one less, connector-extra.md §3.7).
    QueueDeliver {
        sub: SubRef,
        owner: CoreId,
        tag: u64,
        msg: Arc<Message>,
        receive_count: u32,
    },
    /// The answer to a request, for the requester's `/reply/` subscription.
    RpcReply {
        reply_to: SubRef,
        pattern: Pattern,
        correlation_id: Option<Bytes>,
        outcome: Box<RpcOutcome>,
    },
    /// A core finished the work behind a ticket (its *announcement*, see
    /// `engine::completion`); `more` parts will follow from other cores (an events publish:
    /// one `Delivered` per core it delivers on). Never dropped.
    Done {
        ticket: Ticket,
        more: u32,
    },
    /// One announced part of a ticket: a core that delivered an events publish has every
    /// subscription's frame in its write queue (or lost to the slow-subscriber rule). Sent to
    /// the ticket's core; may arrive before the announcement. Never dropped.
    Delivered {
        ticket: Ticket,
    },
    /// The operation behind a ticket failed for good (remote array mode: never confirmed; a
    /// persistent store: its record could not be written or synced).
    Failed {
        ticket: Ticket,
    },
    /// The array refused the send behind a ticket (a queue at its depth limit, or the
    /// persistent store out of room): nothing was appended.
    Refused {
        ticket: Ticket,
        why: Refusal,
    },
    /// An external sink took or dropped a delivery it had parked while holding `ticket` (see
    /// `ExternalSink::deliver`); sent to the core that delivered it.
    SinkSettled {
        ticket: Ticket,
    },
}

impl CoreMsg {
    /// The variant's name, for logs.
    pub fn name(&self) -> &'static str {
        match self {
            CoreMsg::Publish { .. } => "Publish",
            CoreMsg::QueueSend { .. } => "QueueSend",
            CoreMsg::Subscribe(_) => "Subscribe",
            CoreMsg::Unsubscribe { .. } => "Unsubscribe",
            CoreMsg::QueueSettle(_) => "QueueSettle",
            CoreMsg::QueuePrefetch { .. } => "QueuePrefetch",
            CoreMsg::QueuePull(_) => "QueuePull",
            CoreMsg::RpcRequest(_) => "RpcRequest",
            CoreMsg::RpcResponse { .. } => "RpcResponse",
            CoreMsg::RegisterResponder { .. } => "RegisterResponder",
            CoreMsg::UnregisterResponder { .. } => "UnregisterResponder",
            CoreMsg::AttachSink { .. } => "AttachSink",
            CoreMsg::DetachSink { .. } => "DetachSink",
            CoreMsg::DeleteChannel { .. } => "DeleteChannel",
            CoreMsg::ListChannels { .. } => "ListChannels",
            CoreMsg::ListConnections { .. } => "ListConnections",
            CoreMsg::ListAmqpConnections { .. } => "ListAmqpConnections",
            CoreMsg::Barrier(_) => "Barrier",
            CoreMsg::Deliver { .. } => "Deliver",
            CoreMsg::QueueDeliver { .. } => "QueueDeliver",
            CoreMsg::RpcReply { .. } => "RpcReply",
            CoreMsg::Done { .. } => "Done",
            CoreMsg::Delivered { .. } => "Delivered",
            CoreMsg::Failed { .. } => "Failed",
            CoreMsg::Refused { .. } => "Refused",
            CoreMsg::SinkSettled { .. } => "SinkSettled",
        }
    }
}

// Messages are moved in batches and parked in overflow queues: keep them small (bodies travel
// as shared `Arc`s). An outbox entry, `(CoreId, CoreMsg)`, of at most 128 bytes is moved by a
// few vector instructions instead of a call to `memcpy` (LLVM's inline limit on x86-64).
const _: () = assert!(std::mem::size_of::<(CoreId, CoreMsg)>() <= 128);
