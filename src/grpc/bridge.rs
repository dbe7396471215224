//! The gRPC side's end of the array: ids for external delivery targets, confirmations of array
//! operations, and the plumbing every handler shares.
//!
//! Confirmations: one [`Confirmer`] sink per server is attached on every core under its own
//! connection id, so any handler can send an operation with a ticket and await its `Done`
//! (how a `Done` becomes a [`Confirmation`] is in [`crate::mesh::confirm`]).
use crate::mesh::confirm::{next_external_conn, Confirmation, Confirmer};
use crate::mesh::handle::ArrayHandle;
use crate::mesh::msg::{ConnId, CoreId, CoreMsg, SubRef, Ticket};
use crate::model::{Channel, Pattern};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// The core marker of a pull holder (`SubRef::core`): pulls answer through a callback, so the
/// holder is never dispatched to.
pub const HOLDER_CORE: CoreId = CoreId(usize::MAX);

/// Limits the gRPC API applies (from the gateway configuration).
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// A gRPC subscriber's buffer, in messages (SubBuffSize, as for a STOMP subscription);
    /// behind it `delivery::park_limit` of this many deliveries may park.
    pub subscriber_buffer: usize,
}

impl Default for Limits {
    fn default() -> Self {
        // The default SubBuffSize.
        Limits { subscriber_buffer: 100 }
    }
}

pub struct Bridge {
    pub array: ArrayHandle,
    pub limits: Limits,
    /// Channel names declared through channel management.
    pub declared: super::channels::Declared,
    /// Open QueuesDownstream transactions of all streams.
    pub transactions: super::queues::Transactions,
    confirmer: Arc<Confirmer>,
}

/// Server-assigned ids, process-wide for the same reason as connection ids (internal request
/// ids key pending requests on a core).
static NEXT_ID: AtomicU64 = AtomicU64::new(1);

impl Bridge {
    /// Attaches the confirmer on every core.
    pub fn new(array: ArrayHandle, limits: Limits) -> Arc<Bridge> {
        let confirmer = Confirmer::attach(&array, CoreId::all(array.cores()));
        Arc::new(Bridge { array, limits, declared: Default::default(), transactions: Default::default(), confirmer })
    }

    /// A connection id for a new sink or pull holder.
    pub fn new_conn(&self) -> ConnId {
        next_external_conn()
    }

    /// A process-unique id with a prefix (`g-17`), for server-assigned ids.
    pub fn unique_id(&self, prefix: &str) -> String {
        format!("{prefix}-{}", NEXT_ID.fetch_add(1, Ordering::Relaxed))
    }

    pub fn owner_of(&self, pattern: Pattern, channel: &Channel) -> CoreId {
        self.array.owner_of(pattern, channel)
    }

    /// Sends the message `build` makes with a fresh ticket to `core` and waits for its
    /// confirmation. False if the core is gone or nothing came within
    /// [`CONFIRM_WAIT`](crate::mesh::confirm::CONFIRM_WAIT).
    pub async fn confirm(&self, core: CoreId, build: impl FnOnce(Ticket) -> CoreMsg) -> bool {
        self.send_confirmed(core, build).wait().await
    }

    /// Sends now and returns the confirmation to wait for later, so several operations can be
    /// in flight at once.
    pub fn send_confirmed(&self, core: CoreId, build: impl FnOnce(Ticket) -> CoreMsg) -> Confirmation {
        self.confirmer.send(&self.array, core, build)
    }

    /// A pull holder is done (its stream ended): the owner of each queue in `channels` takes
    /// back what `holder` still has reserved there.
    pub fn release_holder<'a>(&self, holder: SubRef, channels: impl IntoIterator<Item = &'a Channel>) {
        for channel in channels {
            let owner = self.owner_of(Pattern::Queues, channel);
            self.array.send(owner, CoreMsg::Unsubscribe { pattern: Pattern::Queues, channel: channel.clone(), wildcard: false, sub: holder, done: None });
        }
    }

    /// Waits until `core` has handled everything sent to it from here before.
    pub async fn barrier(&self, core: CoreId) -> bool {
        self.confirm(core, CoreMsg::Barrier).await
    }
}

/// Runs `f` when dropped: how a stream hands its array resources back when the client goes.
pub struct OnDrop<F: FnOnce()>(pub Option<F>);

impl<F: FnOnce()> Drop for OnDrop<F> {
    fn drop(&mut self) {
        if let Some(f) = self.0.take() {
            f();
        }
    }
}
