//! The bytes of publishes and queue SENDs a core has handed to its egress thread that have not
//! left it yet: still queued toward the thread or a stream task, or sent and awaiting the
//! array's confirmation. Above [`PAUSE_BYTES`] the core's readers stop reading (see
//! `conn::read`), so a publisher faster than the remote array is paced instead of filling the
//! gateway's memory (issue 13: the embedded array pauses readers the same way when a peer
//! core's ring backs up).
//!
//! Cost: one atomic add on the core and one atomic subtract on the egress thread per message,
//! in remote-array mode only (the embedded array never builds one).
use crate::mesh::msg::CoreMsg;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// Backlog per core at which its readers pause; they resume as soon as it is below again.
pub const PAUSE_BYTES: usize = 32 << 20;
/// What one message costs beyond its body and metadata (its `Message`, the request built from
/// it, the stream task's bookkeeping), roughly.
const OVERHEAD: usize = 512;

/// The counter, shared by a core (adds, reads) and its egress thread (subtracts).
#[derive(Clone, Default)]
pub struct Backlog(Arc<AtomicUsize>);

impl Backlog {
    /// What `msg` adds to the backlog: nothing for work that is not a publish or a queue SEND
    /// (subscriptions, settlements, requests and barriers are bounded by the session's caps).
    pub fn weight(msg: &CoreMsg) -> usize {
        match msg {
            CoreMsg::Publish { msg, .. } | CoreMsg::QueueSend { msg, .. } => msg.body.len() + msg.metadata.len() + OVERHEAD,
            _ => 0,
        }
    }

    /// Counts `weight` bytes in (the core, as it forwards the work).
    pub fn add(&self, weight: usize) {
        if weight > 0 {
            self.0.fetch_add(weight, Ordering::Relaxed);
        }
    }

    /// Whether the core's readers must pause. One relaxed load per read batch.
    pub fn over(&self) -> bool {
        self.0.load(Ordering::Relaxed) > PAUSE_BYTES
    }

    /// The bytes now held (for tests and the log).
    pub fn bytes(&self) -> usize {
        self.0.load(Ordering::Relaxed)
    }

    /// A claim on `weight` bytes that gives them back when the work leaves the egress.
    pub fn hold(&self, weight: usize) -> Held {
        Held { backlog: self.clone(), weight }
    }
}

/// One message's part of the [`Backlog`], returned on drop: however the work ends (sent,
/// confirmed, failed, given up, or dropped with its task), it is counted out exactly once.
pub struct Held {
    backlog: Backlog,
    weight: usize,
}

impl Drop for Held {
    fn drop(&mut self) {
        if self.weight > 0 {
            self.backlog.0.fetch_sub(self.weight, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn held_bytes_come_back_once_and_pause_above_the_bound() {
        let b = Backlog::default();
        b.add(PAUSE_BYTES);
        let h = b.hold(PAUSE_BYTES);
        assert!(!b.over(), "at the bound: not over");
        b.add(1);
        let one = b.hold(1);
        assert!(b.over());
        drop(one);
        assert!(!b.over());
        drop(h);
        assert_eq!(b.bytes(), 0);
    }
}
