//! Admission: what keeps connections that never become sessions from holding the gateway.
//!
//! - `--max-connections` counts *connected sessions* (past CONNECT), not sockets: a socket
//!   takes a [`SessionSlot`] when its CONNECT is handled and gives it back when it closes, so
//!   silent or half-open sockets can never lock a real client out (seed 003 checks the limit in
//!   the CONNECT handshake). The slot is taken before the session checks the limit, so two
//!   CONNECTs racing on two cores can both be refused at the limit but never both admitted over it.
//! - `--connect-timeout-s` closes a connection that has not completed CONNECT in time, which
//!   bounds what silent sockets cost (a descriptor and a little memory each) to the deadline.
use super::Conn;
use crate::engine::endpoint::Endpoint;
use crate::engine::metrics::Shared;
use crate::engine::Core;
use crate::stomp::{Command, WireError};
use std::cell::Cell;
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// Whether this connection holds one of the process's connected-session places.
#[derive(Default)]
pub(super) struct SessionSlot(Cell<bool>);

impl SessionSlot {
    /// Counts this connection among the sessions (once).
    pub(super) fn take(&self, shared: &Shared) {
        if !self.0.replace(true) {
            shared.sessions.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Gives the place back (once); a no-op if none is held.
    pub(super) fn give_back(&self, shared: &Shared) {
        if self.0.replace(false) {
            shared.sessions.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

/// Whether `command` asks to open a session.
pub(super) fn opens_session(command: Command) -> bool {
    matches!(command, Command::Connect | Command::Stomp)
}

impl Conn {
    /// The pre-CONNECT deadline, checked on the core's housekeeping tick (100 ms, so a
    /// connection lives at most one tick past it). A peer that sent nothing at all is closed
    /// without a word, as the heart-beat watchdog closes a silent peer: it has not shown that
    /// it speaks STOMP, and an ERROR would only cost us a write. A peer that sent bytes but not
    /// a whole CONNECT (a slow or half-sent frame) gets ERROR `not connected`, the closed
    /// vocabulary's word for a connection that never completed CONNECT, and is closed.
    pub(super) fn connect_deadline_tick(&self, core: &Rc<Core>, now: Instant) {
        if self.state.get() != super::State::Open || self.session.borrow().state() != crate::session::State::AwaitingConnect {
            return;
        }
        if now.duration_since(self.accepted_at) < Duration::from_secs(core.cfg.connect_timeout_s) {
            return;
        }
        let sent_something = self.last_read.get() > self.accepted_at;
        tracing::debug!(core = %core.id, conn = self.id.0, sent_something, "no CONNECT before the deadline; closing");
        if sent_something {
            self.fail(core, WireError::NotConnected, None);
        } else {
            Endpoint::kill(self);
        }
    }
}
