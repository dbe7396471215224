//! Confirmations of array operations, for threads outside the cores (the gRPC server, the
//! egress threads): the cores answer a `Ticket` with `CoreMsg::Done` to the ticket's
//! connection, and a [`Confirmer`], attached as an external sink under its own connection id,
//! turns those `Done`s back into awaitable [`Confirmation`]s. A queue send is then reported
//! only once its owner has appended it, a subscription only once it is live.
//!
//! Why here and not in `grpc/`: the gRPC server and the remote-array egress both confirm this
//! way, and the egress must not depend on the server.
use super::handle::ArrayHandle;
use super::msg::{ConnId, CoreId, CoreMsg, ExternalSink, Refusal, Ticket};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::oneshot;

/// Connection ids at and above this belong to sinks outside the cores (gRPC streams and pull
/// holders, confirmers); STOMP connections count up from 1, so the two never meet.
const EXTERNAL_CONN_BASE: u64 = 1 << 62;
/// The next external connection id, process-wide: several gRPC servers and the egress threads
/// may share one array (tests do), and their sinks must not collide.
static NEXT_EXTERNAL_CONN: AtomicU64 = AtomicU64::new(EXTERNAL_CONN_BASE);

/// A fresh connection id for a sink outside the cores.
pub fn next_external_conn() -> ConnId {
    ConnId(NEXT_EXTERNAL_CONN.fetch_add(1, Ordering::Relaxed))
}

/// How long an operation may wait for its confirmation: KubeMQ's `PubAckWaitSeconds` default.
/// A queue send is held longer only while its consumers are far behind (producer pacing).
pub const CONFIRM_WAIT: Duration = Duration::from_secs(60);

/// The in-band error (SendQueueMessageResult.Error) of a queue send refused at the queue's
/// depth limit; the remote-array egress recognises it by this text.
pub const QUEUE_FULL: &str = "Error 130: queue is full (depth limit reached)";

/// The in-band error of a queue send whose record the persistent store could not write or
/// sync (`--store-dir`; e.g. the disk is full): it is not confirmed, as a STOMP SEND's
/// RECEIPT becomes an ERROR then.
pub const NOT_STORED: &str = "Error 130: queue send was not stored (the store could not write it)";

/// The in-band error of a queue send refused because the persistent store has no room
/// (`--store-max-bytes` reached, or its disk is full).
pub const STORE_FULL: &str = "Error 130: queue send was refused: the store is full (--store-max-bytes or no space left on its disk)";

/// An operation sent to a core, whose `Done` has not been awaited yet.
pub struct Confirmation {
    confirmer: Arc<Confirmer>,
    token: u64,
    rx: Option<oneshot::Receiver<Outcome>>,
}

impl Confirmation {
    /// True once the core confirmed; false if it is gone or [`CONFIRM_WAIT`] passed.
    pub async fn wait(self) -> bool {
        self.outcome().await == Outcome::Confirmed
    }

    /// Like [`Confirmation::wait`], but tells a refusal (a queue at its depth limit, a failed
    /// store write) apart.
    pub async fn outcome(self) -> Outcome {
        let Some(rx) = self.rx else { return Outcome::NotConfirmed };
        match tokio::time::timeout(CONFIRM_WAIT, rx).await {
            Ok(Ok(outcome)) => outcome,
            _ => {
                self.confirmer.forget(self.token);
                Outcome::NotConfirmed
            }
        }
    }
}

/// How a [`Confirmation`] ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    Confirmed,
    /// The queue was at its depth limit: nothing was appended.
    QueueFull,
    /// The persistent store had no room (`--store-max-bytes`, a full disk): nothing was
    /// appended.
    StoreFull,
    /// The persistent store could not write or sync the operation's record: not confirmed.
    NotStored,
    /// The core is gone, or [`CONFIRM_WAIT`] passed.
    NotConfirmed,
}

/// Resolves waiting operations when their `Done`s arrive. A ticket may be answered by several
/// `Done`s (an events publish: the owner's says how many more follow). Used by the gRPC API and
/// by the remote-array egress (to pace its deliveries into a core).
pub struct Confirmer {
    /// The connection id it is attached under on every core.
    conn: ConnId,
    waiting: Mutex<HashMap<u64, (u32, oneshot::Sender<Outcome>)>>,
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

    fn issue(&self, core: CoreId) -> (Ticket, oneshot::Receiver<Outcome>) {
        let token = self.next_token.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        self.lock().insert(token, (1, tx));
        (Ticket { core, conn: self.conn, token }, rx)
    }

    fn forget(&self, token: u64) {
        self.lock().remove(&token);
    }

    /// Ends the wait for `token` with `outcome`, whatever `Done`s it still expected.
    fn end(&self, token: u64, outcome: Outcome) {
        if let Some((_, tx)) = self.lock().remove(&token) {
            let _ = tx.send(outcome);
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, (u32, oneshot::Sender<Outcome>)>> {
        // A panic elsewhere while holding this lock leaves a usable map.
        self.waiting.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl ExternalSink for Confirmer {
    /// Refused (a queue at its depth limit, the store full): the waiter learns it at once.
    fn refused(&self, token: u64, why: Refusal) {
        self.end(
            token,
            match why {
                Refusal::QueueFull => Outcome::QueueFull,
                Refusal::StoreFull => Outcome::StoreFull,
            },
        );
    }

    /// Not stored (a failed store write): the waiter learns it at once.
    fn failed(&self, token: u64) {
        self.end(token, Outcome::NotStored);
    }

    fn done(&self, token: u64, more: u32) {
        let mut waiting = self.lock();
        let Some((remaining, _)) = waiting.get_mut(&token) else { return };
        *remaining = *remaining - 1 + more;
        if *remaining == 0 {
            if let Some((_, tx)) = waiting.remove(&token) {
                let _ = tx.send(Outcome::Confirmed);
            }
        }
    }
}
