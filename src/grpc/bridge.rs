//! The gRPC side's end of the array: ids for external delivery targets, confirmations of array
//! operations, and the plumbing every handler shares.
//!
//! Confirmations: the cores answer a `Ticket` with `CoreMsg::Done` to the ticket's connection.
//! One [`Confirmer`] sink per server is attached on every core under its own connection id, so any handler can
//! send an operation with a ticket and await its `Done` — a queue send is reported only once its
//! owner has appended it, a subscription only once it is live.
use crate::model::{Channel, Pattern};
use crate::mesh::handle::ArrayHandle;
use crate::mesh::msg::{ConnId, CoreId, CoreMsg, ExternalSink, Ticket};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::oneshot;

/// Connection ids at and above this belong to gRPC sinks; STOMP connections count up from 1,
/// so the two never meet.
const EXTERNAL_CONN_BASE: u64 = 1 << 62;
/// The next external connection id, process-wide: several gRPC servers may share one array
/// (tests do), and their sinks must not collide.
static NEXT_EXTERNAL_CONN: AtomicU64 = AtomicU64::new(EXTERNAL_CONN_BASE);

fn next_external_conn() -> ConnId {
    ConnId(NEXT_EXTERNAL_CONN.fetch_add(1, Ordering::Relaxed))
}
/// The core marker of a pull holder (`SubRef::core`): pulls answer through a callback, so the
/// holder is never dispatched to.
pub const HOLDER_CORE: CoreId = usize::MAX;

/// How long an operation may wait for its confirmation: KubeMQ's `PubAckWaitSeconds` default.
/// A queue send is held longer only while its consumers are far behind (producer pacing).
pub const CONFIRM_WAIT: Duration = Duration::from_secs(60);

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
        let confirmer = Confirmer::attach(&array, 0..array.cores());
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
    /// confirmation. False if the core is gone or nothing came within [`CONFIRM_WAIT`].
    pub async fn confirm(&self, core: CoreId, build: impl FnOnce(Ticket) -> CoreMsg) -> bool {
        self.send_confirmed(core, build).wait().await
    }

    /// Sends now and returns the confirmation to wait for later, so several operations can be
    /// in flight at once.
    pub fn send_confirmed(&self, core: CoreId, build: impl FnOnce(Ticket) -> CoreMsg) -> Confirmation {
        self.confirmer.send(&self.array, core, build)
    }

    /// Waits until `core` has handled everything sent to it from here before.
    pub async fn barrier(&self, core: CoreId) -> bool {
        self.confirm(core, CoreMsg::Barrier).await
    }
}

/// An operation sent to a core, whose `Done` has not been awaited yet.
pub struct Confirmation {
    confirmer: Arc<Confirmer>,
    token: u64,
    rx: Option<oneshot::Receiver<()>>,
}

impl Confirmation {
    /// True once the core confirmed; false if it is gone or [`CONFIRM_WAIT`] passed.
    pub async fn wait(self) -> bool {
        let Some(rx) = self.rx else { return false };
        if let Ok(Ok(())) = tokio::time::timeout(CONFIRM_WAIT, rx).await {
            return true;
        }
        self.confirmer.forget(self.token);
        false
    }
}

/// Resolves waiting operations when their `Done`s arrive. A ticket may be answered by several
/// `Done`s (an events publish: the owner's says how many more follow). Used by the gRPC API and
/// by the remote-array egress (to pace its deliveries into a core).
pub struct Confirmer {
    /// The connection id it is attached under on every core.
    conn: ConnId,
    waiting: Mutex<HashMap<u64, (u32, oneshot::Sender<()>)>>,
    next_token: AtomicU64,
}

impl Confirmer {
    /// A new confirmer attached to `cores` under its own connection id.
    pub fn attach(array: &ArrayHandle, cores: impl IntoIterator<Item = CoreId>) -> Arc<Confirmer> {
        let confirmer = Arc::new(Confirmer { conn: next_external_conn(), waiting: Default::default(), next_token: AtomicU64::new(0) });
        for core in cores {
            let sink: Arc<dyn ExternalSink> = confirmer.clone();
            array.send(core, CoreMsg::AttachSink { conn: confirmer.conn, sink });
        }
        confirmer
    }

    /// Sends the operation `build` makes around a ticket of this confirmer to `core`; returns
    /// the confirmation to await.
    pub fn send(self: &Arc<Self>, array: &ArrayHandle, core: CoreId, build: impl FnOnce(Ticket) -> CoreMsg) -> Confirmation {
        let (ticket, rx) = self.issue(core);
        let rx = if array.send(core, build(ticket)) {
            Some(rx)
        } else {
            self.forget(ticket.token);
            None
        };
        Confirmation { confirmer: Arc::clone(self), token: ticket.token, rx }
    }

    fn issue(&self, core: CoreId) -> (Ticket, oneshot::Receiver<()>) {
        let token = self.next_token.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        self.lock().insert(token, (1, tx));
        (Ticket { core, conn: self.conn, token }, rx)
    }

    fn forget(&self, token: u64) {
        self.lock().remove(&token);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, (u32, oneshot::Sender<()>)>> {
        // A panic elsewhere while holding this lock leaves a usable map.
        self.waiting.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl ExternalSink for Confirmer {
    fn done(&self, token: u64, more: u32) {
        let mut waiting = self.lock();
        let Some((remaining, _)) = waiting.get_mut(&token) else { return };
        *remaining = *remaining - 1 + more;
        if *remaining == 0 {
            if let Some((_, tx)) = waiting.remove(&token) {
                let _ = tx.send(());
            }
        }
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
