//! What the accept loop does when `accept` fails, above all at the open-files limit.
//!
//! At the limit, accept(2) fails with EMFILE at once, whether or not a client is waiting, and
//! the client stays in the listen queue, connected and unanswered. So each core keeps one
//! spare descriptor: on EMFILE/ENFILE it closes the spare, accepts the waiting client with
//! that descriptor, writes `ERROR message:too many connections`, closes it and reopens the
//! spare. A client beyond the limit is therefore refused as soon as it is seen (within one
//! back-off step), and the loop never spins: when nobody is waiting, or on any other failure,
//! it sleeps with a doubling back-off (1 ms up to [`MAX_BACKOFF`]), and it logs one warning per
//! [`WARN_EVERY`] per core with what it counted meanwhile.
use crate::mesh::msg::CoreId;
use crate::stomp::{server, Version, WireError};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::{Duration, Instant};

const MIN_BACKOFF: Duration = Duration::from_millis(1);
/// The longest a client waits, at the limit, before it is refused.
pub(super) const MAX_BACKOFF: Duration = Duration::from_millis(100);
/// At most one `accept failed` warning per core this often.
const WARN_EVERY: Duration = Duration::from_secs(10);

/// One core's accept-failure state: its spare descriptor, back-off and warning limiter.
pub(super) struct AcceptGuard {
    core: CoreId,
    spare: Option<OwnedFd>,
    backoff: Duration,
    last_warning: Option<Instant>,
    /// Since the last warning: failed accepts, and clients refused with the spare.
    failures: u64,
    refused: u64,
}

/// What to do after a failed accept.
pub(super) enum Next {
    /// A waiting client was refused: accept again at once.
    Retry,
    /// Sleep this long, then accept again.
    Wait(Duration),
}

impl AcceptGuard {
    pub(super) fn new(core: CoreId) -> AcceptGuard {
        AcceptGuard { core, spare: open_spare(), backoff: MIN_BACKOFF, last_warning: None, failures: 0, refused: 0 }
    }

    /// An accept succeeded: the next failure starts a fresh back-off. Also restores the spare
    /// if another thread took the descriptor it freed last time.
    pub(super) fn accepted(&mut self) {
        self.backoff = MIN_BACKOFF;
        if self.spare.is_none() {
            self.spare = open_spare();
        }
    }

    /// Handles one failed accept on `listener_fd`.
    pub(super) fn failed(&mut self, listener_fd: RawFd, error: io::Error) -> Next {
        self.failures += 1;
        let out_of_fds = matches!(error.raw_os_error(), Some(libc::EMFILE) | Some(libc::ENFILE));
        let refused = out_of_fds && self.refuse_one(listener_fd);
        self.warn(&error, out_of_fds);
        if refused {
            return Next::Retry;
        }
        if self.spare.is_none() {
            self.spare = open_spare();
        }
        let wait = self.backoff;
        self.backoff = (self.backoff * 2).min(MAX_BACKOFF);
        Next::Wait(wait)
    }

    /// Frees the spare, accepts one waiting client with it and refuses it; false if no spare
    /// was held or nobody was waiting.
    fn refuse_one(&mut self, listener_fd: RawFd) -> bool {
        let Some(spare) = self.spare.take() else { return false };
        drop(spare);
        let refused = match accept_nonblocking(listener_fd) {
            Some(client) => {
                refuse(&client);
                self.refused += 1;
                true
            }
            None => false,
        };
        self.spare = open_spare();
        refused
    }

    fn warn(&mut self, error: &io::Error, out_of_fds: bool) {
        let now = Instant::now();
        if self.last_warning.is_some_and(|t| now.duration_since(t) < WARN_EVERY) {
            return;
        }
        self.last_warning = Some(now);
        let (failures, refused) = (std::mem::take(&mut self.failures), std::mem::take(&mut self.refused));
        if out_of_fds {
            tracing::warn!(core = %self.core, %error, failures, refused, "accept failed: out of file descriptors; refusing new clients with ERROR too many connections (next warning in 10 s at most)");
        } else {
            tracing::warn!(core = %self.core, %error, failures, "accept failed (next warning in 10 s at most)");
        }
    }
}

/// A descriptor to give up when the process runs out of them.
fn open_spare() -> Option<OwnedFd> {
    // SAFETY: open(2) of a constant NUL-terminated path; the result is checked.
    let fd = unsafe { libc::open(c"/dev/null".as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) };
    // SAFETY: a fresh descriptor nobody else owns.
    (fd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(fd) })
}

/// accept(2) that never blocks: the listener is in blocking mode (glommio accepts through
/// io_uring only, see vendor/README.md), so it is switched to non-blocking for this one call.
/// Only this core's executor thread uses the listener, and no io_uring accept is pending on it
/// while the accept loop handles a failure.
fn accept_nonblocking(listener_fd: RawFd) -> Option<OwnedFd> {
    // SAFETY: fcntl and accept4 on a listening socket this core owns; null address pointers
    // are allowed; the returned descriptor is checked and owned by the OwnedFd.
    unsafe {
        let flags = libc::fcntl(listener_fd, libc::F_GETFL);
        if flags < 0 || libc::fcntl(listener_fd, libc::F_SETFL, flags | libc::O_NONBLOCK) < 0 {
            return None;
        }
        let fd = libc::accept4(listener_fd, std::ptr::null_mut(), std::ptr::null_mut(), libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK);
        libc::fcntl(listener_fd, libc::F_SETFL, flags);
        (fd >= 0).then(|| OwnedFd::from_raw_fd(fd))
    }
}

/// Writes `ERROR message:too many connections` (a 1.0 frame: no version is negotiated yet),
/// half-closes, and discards what the client has already sent, so that closing sends a FIN
/// rather than a reset that could overtake the ERROR. Never blocks: a fresh socket's send
/// buffer always holds one short frame.
fn refuse(client: &OwnedFd) {
    let mut frame = bytes::BytesMut::with_capacity(64);
    let refusal = WireError::TooManyConnections(None);
    server::write_error(&mut frame, Version::V1_0, refusal, None);
    if let Some(limit) = refusal.limit() {
        crate::telemetry::limit_refusal("stomp", limit);
    }
    let fd = client.as_raw_fd();
    // SAFETY: send/shutdown/recv on a socket we own, with buffers of the lengths given.
    unsafe {
        libc::send(fd, frame.as_ptr().cast(), frame.len(), libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL);
        libc::shutdown(fd, libc::SHUT_WR);
        let mut sink = [0u8; 4096];
        for _ in 0..16 {
            if libc::recv(fd, sink.as_mut_ptr().cast(), sink.len(), libc::MSG_DONTWAIT) <= 0 {
                break;
            }
        }
    }
}
