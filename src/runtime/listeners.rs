//! Which STOMP listeners the cores bind: plain and TLS, and STOMP over WebSocket (ws, wss),
//! each claimed for this process before
//! the cores bind their SO_REUSEPORT shards of it.
//!
//! Claiming a fixed port is a probe: a bind *without* SO_REUSEPORT (with SO_REUSEADDR, so that
//! connections of an earlier run still in TIME_WAIT do not count) fails with EADDRINUSE exactly
//! when some socket listens on the port, whatever options it used. Without this, a second
//! gateway would bind its SO_REUSEPORT listeners beside the first one's and the kernel would
//! split new connections between two processes with separate arrays. The probe socket is
//! closed at once (kept, it would keep our own SO_REUSEPORT binds out), so a process binding
//! in the instant between the probe and the cores' binds is not caught; that window is a few
//! system calls long. A port in use is probed again for up to two seconds: a listener of a
//! process just gone can outlive it that long (see `probe_patiently`). Port 0 is resolved to a
//! free port instead, held until the cores bind.
use super::{bound_reuseport_socket, sockaddr_of, StartError};
use crate::config::Config;
use crate::tls::Tls;
use std::net::SocketAddr;
use std::sync::Arc;

/// One listener every core binds: its address, its TLS configuration (TLS and wss) and its
/// WebSocket settings (ws and wss).
#[derive(Clone)]
pub(super) struct Spec {
    pub(super) addr: SocketAddr,
    pub(super) tls: Option<Arc<Tls>>,
    pub(super) ws: Option<Arc<crate::ws::Settings>>,
    /// An AMQP 1.0 listener (`--amqp-addr`), not STOMP.
    pub(super) amqp: bool,
}

/// The listeners that will be bound, and the sockets holding resolved port-0 addresses until
/// the cores have bound them (dropping the plan releases them).
pub(super) struct Plan {
    pub(super) specs: Vec<Spec>,
    pub(super) tls: Option<Arc<Tls>>,
    _reservations: Vec<std::net::TcpListener>,
}

impl Plan {
    fn addr_of(&self, tls: bool, ws: bool) -> Option<SocketAddr> {
        self.specs.iter().find(|s| !s.amqp && s.tls.is_some() == tls && s.ws.is_some() == ws).map(|s| s.addr)
    }

    pub(super) fn plain_addr(&self) -> Option<SocketAddr> {
        self.addr_of(false, false)
    }

    pub(super) fn tls_addr(&self) -> Option<SocketAddr> {
        self.addr_of(true, false)
    }

    pub(super) fn ws_addr(&self) -> Option<SocketAddr> {
        self.addr_of(false, true)
    }

    pub(super) fn ws_tls_addr(&self) -> Option<SocketAddr> {
        self.addr_of(true, true)
    }

    pub(super) fn amqp_addr(&self) -> Option<SocketAddr> {
        self.specs.iter().find(|s| s.amqp && s.tls.is_none()).map(|s| s.addr)
    }

    pub(super) fn amqp_tls_addr(&self) -> Option<SocketAddr> {
        self.specs.iter().find(|s| s.amqp && s.tls.is_some()).map(|s| s.addr)
    }
}

/// Decides the listeners. A listener that cannot be had (port held by another process, bad
/// certificate) is logged in one line and left out while another remains; with none left,
/// the first failure is the error (the caller prints it and exits non-zero).
pub(super) fn plan(cfg: &Config) -> Result<Plan, StartError> {
    let mut wanted: Vec<Spec> = Vec::new();
    let mut failures: Vec<StartError> = Vec::new();
    if cfg.stomp_plain {
        wanted.push(Spec { addr: cfg.stomp_addr, tls: None, ws: None, amqp: false });
    }
    let mut tls_handle = None;
    let tls_addrs: Vec<SocketAddr> = [cfg.stomp_tls_addr, cfg.ws_tls_addr, cfg.amqp_tls_addr].into_iter().flatten().collect();
    let tls = match &cfg.stomp_tls {
        Some(files) if !tls_addrs.is_empty() => match Tls::load(files) {
            Ok(tls) => Some(Arc::new(tls)),
            Err(reason) => {
                failures.extend(tls_addrs.iter().map(|&addr| StartError::Tls { addr, reason: reason.clone() }));
                None
            }
        },
        _ => None,
    };
    if let (Some(tls), Some(addr)) = (&tls, cfg.stomp_tls_addr) {
        wanted.push(Spec { addr, tls: Some(Arc::clone(tls)), ws: None, amqp: false });
    }
    let ws = Arc::new(crate::ws::Settings::from_config(cfg));
    if let Some(addr) = cfg.ws_addr {
        wanted.push(Spec { addr, tls: None, ws: Some(Arc::clone(&ws)), amqp: false });
    }
    if let (Some(tls), Some(addr)) = (&tls, cfg.ws_tls_addr) {
        wanted.push(Spec { addr, tls: Some(Arc::clone(tls)), ws: Some(ws), amqp: false });
    }
    // A listener whose port an earlier one already takes is left out (the earlier wins).
    let mut distinct: Vec<Spec> = Vec::new();
    for spec in wanted {
        match distinct.iter().find(|d| overlaps(d.addr, spec.addr)) {
            Some(earlier) => {
                let what = listener_name(earlier);
                let source = std::io::Error::new(std::io::ErrorKind::AddrInUse, format!("the {what} listener uses this port"));
                failures.push(StartError::Bind { addr: spec.addr, source });
            }
            None => distinct.push(spec),
        }
    }
    let mut specs = Vec::new();
    let mut reservations = Vec::new();
    for spec in distinct {
        match claim(spec.addr) {
            Ok((bound, reservation)) => {
                if spec.tls.is_some() {
                    tls_handle = spec.tls.clone();
                }
                specs.push(Spec { addr: bound, ..spec });
                reservations.extend(reservation);
            }
            Err(source) => failures.push(StartError::Bind { addr: spec.addr, source }),
        }
    }
    if specs.is_empty() {
        return Err(failures.into_iter().next().unwrap_or(StartError::NoListener));
    }
    for failure in failures {
        tracing::error!(error = %failure, "continuing without this STOMP listener");
    }
    // AMQP 1.0 (issue 16): optional beside STOMP; a port it cannot have is logged, not fatal.
    // amqps serves the STOMP TLS certificate (bound only with one, as the STOMP TLS listener).
    let amqp_tls = tls.as_ref().and_then(|tls| cfg.amqp_tls_addr.map(|addr| (addr, Arc::clone(tls))));
    for (addr, tls) in cfg.amqp_addr.map(|a| (a, None)).into_iter().chain(amqp_tls.map(|(a, t)| (a, Some(t)))) {
        let clash = specs.iter().find(|s| overlaps(s.addr, addr)).map(listener_name);
        let claimed = match clash {
            Some(what) => Err(std::io::Error::new(std::io::ErrorKind::AddrInUse, format!("the {what} listener uses this port"))),
            None => claim(addr),
        };
        match claimed {
            Ok((bound, reservation)) => {
                if tls.is_some() && tls_handle.is_none() {
                    tls_handle = tls.clone();
                }
                specs.push(Spec { addr: bound, tls, ws: None, amqp: true });
                reservations.extend(reservation);
            }
            Err(source) => tracing::error!(error = %StartError::Bind { addr, source }, "continuing without this AMQP 1.0 listener"),
        }
    }
    Ok(Plan { specs, tls: tls_handle, _reservations: reservations })
}

/// The listener's kind, for messages.
fn listener_name(spec: &Spec) -> &'static str {
    if spec.amqp {
        return if spec.tls.is_some() { "AMQP 1.0 TLS" } else { "AMQP 1.0" };
    }
    match (spec.tls.is_some(), spec.ws.is_some()) {
        (false, false) => "plain STOMP",
        (true, false) => "STOMP TLS",
        (false, true) => "STOMP WebSocket",
        (true, true) => "STOMP secure WebSocket",
    }
}

/// Whether two listeners would take the same connections (same fixed port, and the same IP or
/// a wildcard on either side). Port 0 picks a fresh port for each.
fn overlaps(a: SocketAddr, b: SocketAddr) -> bool {
    a.port() != 0 && a.port() == b.port() && (a.ip() == b.ip() || a.ip().is_unspecified() || b.ip().is_unspecified())
}

/// A fixed port: checked to be free of other processes' listeners. Port 0: a free port, with
/// the socket that holds it until the cores have bound it.
fn claim(addr: SocketAddr) -> std::io::Result<(SocketAddr, Option<std::net::TcpListener>)> {
    if addr.port() == 0 {
        let sock = std::net::TcpListener::from(bound_reuseport_socket(addr)?);
        let bound = sock.local_addr()?;
        return Ok((bound, Some(sock)));
    }
    probe_patiently(addr)?;
    Ok((addr, None))
}

/// How long a start waits for a port to come free: a gateway killed with SIGKILL (or any
/// process with an accept in io_uring) keeps its listener until the kernel tears its ring
/// down, shortly after the process is gone, and a supervisor restarting it at once should
/// not fail for that. A port held by a live process is still refused, this much later.
const PORT_RELEASE_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// [`probe_exclusive`], retried while the port is in use, for up to [`PORT_RELEASE_WAIT`].
fn probe_patiently(addr: SocketAddr) -> std::io::Result<()> {
    let deadline = std::time::Instant::now() + PORT_RELEASE_WAIT;
    loop {
        match probe_exclusive(addr) {
            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse && std::time::Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            outcome => return outcome,
        }
    }
}

/// Binds `addr` without SO_REUSEPORT and closes the socket: EADDRINUSE means another socket
/// listens there (see the module doc).
pub(super) fn probe_exclusive(addr: SocketAddr) -> std::io::Result<()> {
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    // SAFETY: plain socket(2); the descriptor is owned by the OwnedFd below.
    let fd = unsafe { libc::socket(if addr.is_ipv4() { libc::AF_INET } else { libc::AF_INET6 }, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `fd` is a fresh socket we own.
    let sock = unsafe { OwnedFd::from_raw_fd(fd) };
    let one: libc::c_int = 1;
    // SAFETY: setsockopt with a c_int option value of the right size.
    let rc = unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_REUSEADDR,
            &one as *const _ as *const libc::c_void,
            std::mem::size_of::<libc::c_int>() as u32,
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let (storage, len) = sockaddr_of(addr);
    // SAFETY: `storage` holds a valid sockaddr of `len` bytes.
    if unsafe { libc::bind(sock.as_raw_fd(), &storage as *const _ as *const libc::sockaddr, len) } != 0 {
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::EADDRINUSE) {
            return Err(std::io::Error::new(std::io::ErrorKind::AddrInUse, "the port is already in use by another process (is another stompgate running?)"));
        }
        return Err(e);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_port_another_socket_listens_on_is_refused_even_with_reuseport() {
        // The other "process": a listener with SO_REUSEPORT, as a gateway's cores bind.
        let sock = bound_reuseport_socket("127.0.0.1:0".parse().unwrap()).unwrap();
        let other = std::net::TcpListener::from(sock);
        // SAFETY: listen(2) on a bound socket we own.
        assert_eq!(unsafe { libc::listen(std::os::fd::AsRawFd::as_raw_fd(&other), 16) }, 0);
        let addr = other.local_addr().unwrap();
        let err = probe_exclusive(addr).expect_err("the port is held");
        assert_eq!(err.kind(), std::io::ErrorKind::AddrInUse);
        drop(other);
        probe_exclusive(addr).expect("free again once the listener is gone");
    }

    #[test]
    fn overlapping_addresses() {
        let a = |s: &str| s.parse::<SocketAddr>().unwrap();
        assert!(overlaps(a("0.0.0.0:7000"), a("127.0.0.1:7000")));
        assert!(overlaps(a("127.0.0.1:7000"), a("127.0.0.1:7000")));
        assert!(!overlaps(a("127.0.0.1:7000"), a("127.0.0.2:7000")));
        assert!(!overlaps(a("0.0.0.0:7000"), a("0.0.0.0:7001")));
        assert!(!overlaps(a("127.0.0.1:0"), a("127.0.0.1:0")), "each port 0 is its own free port");
    }
}
