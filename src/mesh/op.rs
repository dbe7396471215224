//! The array interface a protocol front-end speaks: what a connection asks of "the array",
//! whether that array is embedded (sharded over the cores) or remote (a KubeMQ cluster behind
//! the core's egress thread). A front-end names its own subscriptions by a connection-local
//! number and never learns which core or thread does the work: `core::Core::submit` decides.
//!
//! Each operation may carry a completion token; the front-end is told exactly once when the
//! operation took effect everywhere it had to (`core::Endpoint::completed`) or failed for good
//! (`core::Endpoint::failed`).
use super::msg::{CacheSpec, Settle, StartAt, SubNo};
use crate::model::{Channel, Message, Pattern};
use bytes::Bytes;
use std::sync::Arc;

/// One operation for the array.
#[derive(Clone, Debug)]
pub enum ArrayOp {
    /// Publish to Events or Events-Store. Completes once every subscriber has the message in
    /// its buffer (or lost it to the slow-subscriber rule): that paces a confirming publisher.
    Publish { pattern: Pattern, msg: Arc<Message> },
    /// Append to a queue. Completes once the queue holds it.
    QueueSend { msg: Arc<Message> },
    /// Start a subscription (`sub`: the connection-local number deliveries will carry).
    /// Completes once it is live on every core that can match it.
    Subscribe { sub: SubNo, pattern: Pattern, channel: Channel, wildcard: bool, group: Option<Bytes>, start: StartAt, prefetch: u32 },
    /// End a subscription; a queue consumer's unacknowledged messages go back to the queue.
    Unsubscribe { sub: SubNo, pattern: Pattern, channel: Channel, wildcard: bool },
    /// Settle queue deliveries of subscription `sub` by the tags they were delivered with.
    Settle { sub: SubNo, channel: Channel, tags: Vec<u64>, action: Settle },
    /// Sets how many unsettled messages queue subscription `sub` may hold (0 = none, the
    /// subscription stays). Lowering takes nothing back: the array only stops handing it more
    /// until it holds fewer. An AMQP queue link's prefetch follows the peer's credit.
    Prefetch { sub: SubNo, channel: Channel, prefetch: u32 },
    /// A Commands/Queries request; its outcome comes back on subscription `reply_sub`.
    Request { pattern: Pattern, msg: Arc<Message>, timeout_ms: u64, reply_sub: SubNo, correlation_id: Option<Bytes>, cache: Option<CacheSpec> },
    /// Completes once everything this connection submitted before it has been handled.
    Barrier,
}
