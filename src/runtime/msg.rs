//! The one closed set of messages cores exchange (design.md, "Cores"). Every cross-core
//! interaction is a `CoreMsg` over glommio's channel mesh; a message to the sending core itself
//! takes the same path through the core's local queue, so local and remote behave alike.
//!
//! Full channels: `Deliver` (events, owner → subscriber core) is dropped and counted when the
//! peer's ring is full — events are at-most-once (seed 003). Every other variant is never
//! dropped: it waits in the sending core's per-peer overflow queue until the ring has room
//! (see `core::Core::dispatch`).

use crate::model::{Channel, Message, Pattern};
use bytes::Bytes;
use std::sync::Arc;

/// Index of a core in the mesh.
pub type CoreId = usize;

/// A connection, unique within its core for the process's life.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ConnId(pub u64);

/// A subscription anywhere in the process: core, connection and the connection-local
/// subscription number (not the client's `id` header, which may repeat across connections).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SubRef {
    pub core: CoreId,
    pub conn: ConnId,
    pub sub: u32,
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
    Response { executed: bool, error: Bytes, metadata: Bytes, body: Bytes, tags: crate::model::Tags },
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
}

/// A responder attached to a Commands/Queries channel (the gRPC API registers these). The
/// callback must not block: it hands the request to the responder's own queue and returns
/// false if that queue is gone, so the owner can try another responder.
pub type ResponderFn = Arc<dyn Fn(&RpcRequest) -> bool + Send + Sync>;

pub enum CoreMsg {
    // ---- to the owner core of (pattern, channel) ----
    /// Publish to Events or Events-Store. Never dropped on the way to the owner (a full ring
    /// spills into the overflow queue and pauses this core's readers), so a publisher feels
    /// back-pressure instead of losing messages; `done` is confirmed per `Deliver` below.
    Publish { pattern: Pattern, msg: Arc<Message>, done: Option<Ticket> },
    /// Append to a queue; `done` is answered once appended.
    QueueSend { msg: Arc<Message>, done: Option<Ticket> },
    /// Register a subscription. Wildcard Events filters go to every core.
    Subscribe {
        pattern: Pattern,
        channel: Channel,
        wildcard: bool,
        sub: SubRef,
        group: Option<Bytes>,
        start: StartAt,
        /// Queues: how many unacknowledged messages this consumer may hold (SubBuffSize).
        prefetch: u32,
        done: Option<Ticket>,
    },
    /// Remove a subscription; for queues its unacknowledged messages are requeued first.
    Unsubscribe { pattern: Pattern, channel: Channel, wildcard: bool, sub: SubRef, done: Option<Ticket> },
    /// Settle queue deliveries by tag. `requeue`: NACK (back to the queue) instead of ACK.
    QueueSettle { channel: Channel, sub: SubRef, tags: Vec<u64>, requeue: bool, done: Option<Ticket> },
    /// A Commands/Queries request for the owner to hand to a responder.
    RpcRequest(Box<RpcRequest>),
    /// A responder's answer, routed to the owner that holds the pending request.
    RpcResponse { pattern: Pattern, channel: Channel, request_id: Bytes, outcome: Box<RpcOutcome> },
    /// Attach a responder to (pattern, channel).
    RegisterResponder { pattern: Pattern, channel: Channel, responder_id: u64, group: Option<Bytes>, responder: ResponderFn },
    UnregisterResponder { pattern: Pattern, channel: Channel, responder_id: u64 },

    /// Answered with `Done` once everything sent before it on this path has been handled:
    /// orders a DISCONNECT receipt after the connection's earlier work (spec: "receipt on
    /// DISCONNECT").
    Barrier(Ticket),

    // ---- to the subscriber's core ----
    /// Events / Events-Store delivery of one shared message to some of that core's subscriptions.
    /// With `done`, the core confirms once every one of those subscriptions has the frame in
    /// its write queue (or has lost it to the slow-subscriber rule): that is what a RECEIPT
    /// for an events SEND waits for, so a publisher that asks for receipts is paced by its
    /// subscribers instead of overrunning them.
    Deliver { pattern: Pattern, msg: Arc<Message>, subs: Vec<SubRef>, done: Option<Ticket> },
    /// One queue delivery, tagged by the owner for ACK/NACK.
    QueueDeliver { sub: SubRef, owner: CoreId, tag: u64, msg: Arc<Message>, redelivered: bool },
    /// The answer to a request, for the requester's `/reply/` subscription.
    RpcReply { reply_to: SubRef, pattern: Pattern, correlation_id: Option<Bytes>, outcome: Box<RpcOutcome> },
    /// One confirmation for a ticket; `more` further confirmations will follow (an events
    /// publish answers with the number of cores it delivered to).
    Done { ticket: Ticket, more: u32 },
}

// Messages are moved through fixed-size rings: keep them small (bodies travel as shared `Arc`s).
const _: () = assert!(std::mem::size_of::<CoreMsg>() <= 144);
