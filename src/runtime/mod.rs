//! The thread-per-core runtime: one pinned glommio executor per chosen CPU, each with its own
//! SO_REUSEPORT listeners on the STOMP addresses (plain and TLS), its connections and its array
//! shard; the cores talk through glommio's channel mesh.
//!
//! SO_REUSEPORT would just as gladly share a port with another process (a second gateway with
//! its own array, taking half the new connections), so before the cores bind, each fixed port
//! is probed with a bind that does not use it ([`probe_exclusive`]): a port another process
//! listens on is that listener's bind failure. Availability first (seed 003): the gateway runs
//! on with the listeners it has, and fails to start only when no STOMP listener is left.
//!
//! Why glommio's mesh for the cores: it is a full mesh of bounded single-producer /
//! single-consumer rings (lock-free), and a receiver parked in its executor is woken through
//! io_uring (eventfd), so an idle core sleeps instead of polling. crossbeam-channel would need
//! a blocking receive or polling on the executor thread.

mod accept;
mod listeners;

use crate::config::Config;
use crate::conn;
use crate::engine::batch::Batch;
use crate::engine::metrics::Shared;
use crate::engine::Core;
use crate::mesh::handle::ArrayHandle;
use crate::mesh::msg::{CoreId, CoreMsg};
use glommio::channels::channel_mesh::MeshBuilder;
use glommio::{LocalExecutorBuilder, Placement};
use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

/// Housekeeping period: heart-beats, ack and RPC timeouts, shutdown check.
const TICK: Duration = Duration::from_millis(100);
/// How long a shutting-down core waits for its connections to flush the ERROR frame.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(2);

/// A running gateway.
pub struct Server {
    /// The plain listener's address (the configured one when it is off or could not bind).
    stomp_addr: SocketAddr,
    stomp_plain_addr: Option<SocketAddr>,
    stomp_tls_addr: Option<SocketAddr>,
    ws_addr: Option<SocketAddr>,
    amqp_addr: Option<SocketAddr>,
    amqp_tls_addr: Option<SocketAddr>,
    ws_tls_addr: Option<SocketAddr>,
    tls: Option<Arc<crate::tls::Tls>>,
    shared: Arc<Shared>,
    threads: Vec<glommio::ExecutorJoinHandle<()>>,
    array: ArrayHandle,
    /// The embedded array's store directory, locked for this server's life.
    _store: Option<crate::array::persist::StoreDir>,
}

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("io_uring is not usable on this kernel (stompgate needs Linux >= 5.11 with io_uring enabled): {0}")]
    NoIoUring(String),
    #[error("cannot listen on {addr}: {source}")]
    Bind { addr: SocketAddr, source: std::io::Error },
    #[error("cannot serve STOMP over TLS on {addr}: {reason}")]
    Tls { addr: SocketAddr, reason: String },
    #[error("no STOMP listener: --stomp-addr is off and no TLS listener is configured (--tls-cert, --tls-key)")]
    NoListener,
    #[error("cannot start core on CPU {cpu}: {reason}")]
    Executor { cpu: usize, reason: String },
    /// `--store-dir`: locked by another process, not writable, or from another core count.
    #[error("{0}")]
    Store(String),
}

impl Server {
    /// Starts one executor per CPU of `cfg.cpus` and returns once every core listens.
    /// Port 0 picks a free port, shared by all cores.
    pub fn start(cfg: Config) -> Result<Server, StartError> {
        check_io_uring()?;
        let cfg = Arc::new(cfg);
        let plan = listeners::plan(&cfg)?;
        let (stomp_plain_addr, stomp_tls_addr, tls) = (plan.plain_addr(), plan.tls_addr(), plan.tls.clone());
        let (ws_addr, ws_tls_addr, amqp_addr, amqp_tls_addr) = (plan.ws_addr(), plan.ws_tls_addr(), plan.amqp_addr(), plan.amqp_tls_addr());
        let stomp_addr = stomp_plain_addr.unwrap_or(cfg.stomp_addr);
        let specs = Arc::new(plan.specs.clone());
        let shared = Arc::new(Shared::default());
        let cores = cfg.cpus.len();
        // The store is the embedded array's: a gateway in front of a remote array keeps none.
        let store = match (&cfg.store.dir, &cfg.array) {
            (Some(dir), crate::config::ArrayMode::Embedded) => {
                crate::array::persist::check_body_limit(cfg.max_body_size).map_err(StartError::Store)?;
                Some(crate::array::persist::StoreDir::open(dir, cores).map_err(StartError::Store)?)
            }
            _ => None,
        };
        // Ring entries are batches (`engine::batch`): the ring's slots are counted so that it
        // holds `mesh_ring` messages at most, as before batching.
        let mesh = MeshBuilder::<Batch, _>::full(cores, crate::engine::batch::ring_shape(cfg.mesh_ring).0);
        let (ready_tx, ready_rx) = std::sync::mpsc::channel::<Result<(), StartError>>();
        let mut threads = Vec::with_capacity(cores);
        // Foreign ingress: one channel per core, indexed by mesh peer id. Executors learn their
        // peer id only when they join the mesh, so each picks its receiver from a shared list.
        let (foreign_txs, foreign_rxs): (Vec<_>, Vec<_>) = (0..cores).map(|_| flume::unbounded::<CoreMsg>()).unzip();
        let foreign_rxs = Arc::new(std::sync::Mutex::new(foreign_rxs.into_iter().map(Some).collect::<Vec<_>>()));
        let array = ArrayHandle::new(foreign_txs);
        for &cpu in cfg.cpus.iter() {
            let (cfg, shared, mesh, ready_tx) = (Arc::clone(&cfg), Arc::clone(&shared), mesh.clone(), ready_tx.clone());
            let (foreign_rxs, array, specs) = (Arc::clone(&foreign_rxs), array.clone(), Arc::clone(&specs));
            let handle = LocalExecutorBuilder::new(Placement::Fixed(cpu))
                .name(&format!("stompgate-core-{cpu}"))
                // No file I/O here: keep the registered (locked) I/O memory small.
                .io_memory(256 * 1024)
                .spawn(move || async move { run_core(cfg, cpu, shared, mesh, foreign_rxs, array, specs, ready_tx).await })
                .map_err(|e| StartError::Executor { cpu, reason: e.to_string() })?;
            threads.push(handle);
        }
        drop(ready_tx);
        let mut first_err = None;
        for _ in 0..cores {
            match ready_rx.recv() {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    first_err.get_or_insert(e);
                }
                Err(_) => break,
            }
        }
        drop(plan);
        let server =
            Server { stomp_addr, stomp_plain_addr, stomp_tls_addr, ws_addr, ws_tls_addr, amqp_addr, amqp_tls_addr, tls, shared, threads, array, _store: store };
        if let Some(e) = first_err {
            server.shutdown();
            return Err(e);
        }
        Ok(server)
    }

    pub fn stomp_addr(&self) -> SocketAddr {
        self.stomp_addr
    }

    /// The plain STOMP listener's address, if it is bound.
    pub fn stomp_plain_addr(&self) -> Option<SocketAddr> {
        self.stomp_plain_addr
    }

    /// The STOMP TLS listener's address, if it is bound.
    pub fn stomp_tls_addr(&self) -> Option<SocketAddr> {
        self.stomp_tls_addr
    }

    /// The STOMP over WebSocket listener's address, if it is bound.
    pub fn ws_addr(&self) -> Option<SocketAddr> {
        self.ws_addr
    }

    /// The STOMP over secure WebSocket listener's address, if it is bound.
    pub fn ws_tls_addr(&self) -> Option<SocketAddr> {
        self.ws_tls_addr
    }

    /// The AMQP 1.0 listener's address, if it is bound.
    pub fn amqp_addr(&self) -> Option<SocketAddr> {
        self.amqp_addr
    }

    /// The AMQP 1.0 over TLS listener's address, if it is bound.
    pub fn amqp_tls_addr(&self) -> Option<SocketAddr> {
        self.amqp_tls_addr
    }

    /// Re-reads the TLS certificate, key and client CA (SIGHUP); new connections use them.
    /// Does nothing without a TLS listener.
    pub fn reload_tls(&self) {
        if let Some(tls) = &self.tls {
            tls.reload();
        }
    }

    /// The TLS configuration handle, for a signal thread to reload.
    pub fn tls(&self) -> Option<Arc<crate::tls::Tls>> {
        self.tls.clone()
    }

    /// The array API for callers outside the cores (gRPC server, tests).
    pub fn array(&self) -> ArrayHandle {
        self.array.clone()
    }

    /// Asks every core to stop (as SIGINT/SIGTERM do).
    pub fn request_shutdown(&self) {
        self.shared.shutdown.store(true, Ordering::SeqCst);
    }

    /// The flag signal handlers set.
    pub fn shutdown_flag(&self) -> Arc<Shared> {
        Arc::clone(&self.shared)
    }

    /// Waits until every core has stopped.
    pub fn join(self) {
        for t in self.threads {
            let _ = t.join();
        }
    }

    /// Requests shutdown and waits for it.
    pub fn shutdown(self) {
        self.request_shutdown();
        self.join();
    }
}

/// Fails early, with one clear line, where io_uring cannot be set up.
fn check_io_uring() -> Result<(), StartError> {
    if let Some((major, minor)) = kernel_version() {
        if (major, minor) < (5, 11) {
            return Err(StartError::NoIoUring(format!("running on Linux {major}.{minor}")));
        }
    }
    // io_uring_setup(2) with a tiny ring; ENOSYS (old kernel), EPERM (disabled by sysctl or a
    // seccomp policy) and friends all mean glommio cannot run.
    let mut params = [0u8; 120];
    // SAFETY: io_uring_setup reads/writes exactly a `struct io_uring_params` (120 bytes) and
    // returns a new descriptor, which we close at once.
    let fd = unsafe { libc::syscall(libc::SYS_io_uring_setup, 4u32, params.as_mut_ptr()) };
    if fd < 0 {
        return Err(StartError::NoIoUring(std::io::Error::last_os_error().to_string()));
    }
    // SAFETY: `fd` was just returned by io_uring_setup and is owned by nobody else.
    unsafe { libc::close(fd as i32) };
    Ok(())
}

/// (major, minor) of the running kernel, from uname(2).
fn kernel_version() -> Option<(u32, u32)> {
    // SAFETY: utsname is plain old data; uname fills it in.
    let mut u: libc::utsname = unsafe { std::mem::zeroed() };
    // SAFETY: `u` is a valid, writable utsname.
    if unsafe { libc::uname(&mut u) } != 0 {
        return None;
    }
    // SAFETY: uname NUL-terminates `release`.
    let release = unsafe { std::ffi::CStr::from_ptr(u.release.as_ptr()) }.to_str().ok()?;
    parse_kernel_release(release)
}

fn parse_kernel_release(release: &str) -> Option<(u32, u32)> {
    let mut parts = release.split(|c: char| !c.is_ascii_digit());
    Some((parts.next()?.parse().ok()?, parts.next()?.parse().ok()?))
}

/// A TCP socket with SO_REUSEPORT, bound to `addr` (not listening yet).
pub(super) fn bound_reuseport_socket(addr: SocketAddr) -> std::io::Result<std::os::fd::OwnedFd> {
    use std::os::fd::FromRawFd;
    let fd = unsafe {
        // SAFETY: plain socket(2); the descriptor is owned by the OwnedFd below.
        libc::socket(if addr.is_ipv4() { libc::AF_INET } else { libc::AF_INET6 }, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0)
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `fd` is a fresh socket we own.
    let sock = unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) };
    // SO_REUSEADDR too, not only for the usual reason: the connections a listener accepts
    // inherit it, and only then does this run's side of them, left in TIME_WAIT after a stop,
    // stay out of the next start's exclusive-port probe (`listeners::probe_exclusive`), so a
    // restart right after a stop is not refused as "in use by another process".
    for option in [libc::SO_REUSEADDR, libc::SO_REUSEPORT] {
        switch_on(fd, libc::SOL_SOCKET, option)?;
    }
    let (storage, len) = sockaddr_of(addr);
    // SAFETY: `storage` holds a valid sockaddr of `len` bytes.
    if unsafe { libc::bind(fd, &storage as *const _ as *const libc::sockaddr, len) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(sock)
}

/// This core's STOMP listener (SO_REUSEPORT, like glommio's own `bind`), with its descriptor:
/// glommio's listener does not expose it, and the accept loop needs it at the fd limit.
fn listen_on(addr: SocketAddr) -> std::io::Result<(glommio::net::TcpListener, std::os::fd::RawFd)> {
    use std::os::fd::{FromRawFd, IntoRawFd};
    let sock = bound_reuseport_socket(addr)?;
    set_nodelay(sock.as_raw_fd())?;
    // SAFETY: listen(2) on a bound socket we own.
    if unsafe { libc::listen(sock.as_raw_fd(), 1024) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let fd = sock.into_raw_fd();
    // SAFETY: `fd` is a bound, listening socket whose ownership passes to the listener.
    Ok((unsafe { glommio::net::TcpListener::from_raw_fd(fd) }, fd))
}

/// TCP_NODELAY on a listener: Linux copies it to every connection the listener accepts, so
/// no connection needs a setsockopt(2) of its own (one syscall fewer per connection).
fn set_nodelay(fd: std::os::fd::RawFd) -> std::io::Result<()> {
    switch_on(fd, libc::IPPROTO_TCP, libc::TCP_NODELAY)
}

/// Sets the boolean socket option (`level`, `option`) of `fd` to 1.
fn switch_on(fd: std::os::fd::RawFd, level: libc::c_int, option: libc::c_int) -> std::io::Result<()> {
    let one: libc::c_int = 1;
    // SAFETY: setsockopt with a c_int option value of the right size on a socket we own.
    let rc = unsafe { libc::setsockopt(fd, level, option, &one as *const _ as *const libc::c_void, std::mem::size_of::<libc::c_int>() as u32) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

pub(super) fn sockaddr_of(addr: SocketAddr) -> (libc::sockaddr_storage, libc::socklen_t) {
    // SAFETY: sockaddr_storage is plain old data; all-zero is a valid value.
    let mut storage: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    match addr {
        SocketAddr::V4(a) => {
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: a.port().to_be(),
                sin_addr: libc::in_addr { s_addr: u32::from_ne_bytes(a.ip().octets()) },
                sin_zero: [0; 8],
            };
            // SAFETY: sockaddr_in fits in sockaddr_storage.
            unsafe { std::ptr::write(&mut storage as *mut _ as *mut libc::sockaddr_in, sin) };
            (storage, std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t)
        }
        SocketAddr::V6(a) => {
            let sin6 = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: a.port().to_be(),
                sin6_flowinfo: a.flowinfo(),
                sin6_addr: libc::in6_addr { s6_addr: a.ip().octets() },
                sin6_scope_id: a.scope_id(),
            };
            // SAFETY: sockaddr_in6 fits in sockaddr_storage.
            unsafe { std::ptr::write(&mut storage as *mut _ as *mut libc::sockaddr_in6, sin6) };
            (storage, std::mem::size_of::<libc::sockaddr_in6>() as libc::socklen_t)
        }
    }
}

#[allow(clippy::too_many_arguments)]
async fn run_core(
    cfg: Arc<Config>,
    cpu: usize,
    shared: Arc<Shared>,
    mesh: MeshBuilder<Batch, glommio::channels::channel_mesh::Full>,
    foreign_rxs: Arc<std::sync::Mutex<Vec<Option<flume::Receiver<CoreMsg>>>>>,
    array: ArrayHandle,
    specs: Arc<Vec<listeners::Spec>>,
    ready: std::sync::mpsc::Sender<Result<(), StartError>>,
) {
    let cores = cfg.cpus.len();
    // glommio's mesh join can miss the wake-up for a peer that connects while this executor
    // is parked with no timer armed (glommio issue #261): a short ticking task keeps the
    // reactor turning until the join completes.
    let joined = Rc::new(std::cell::Cell::new(false));
    let poker = {
        let joined = Rc::clone(&joined);
        glommio::spawn_local(async move {
            while !joined.get() {
                glommio::timer::sleep(Duration::from_millis(1)).await;
            }
        })
    };
    let joining = mesh.join().await;
    joined.set(true);
    poker.await;
    let (senders, mut receivers) = match joining {
        Ok(x) => x,
        Err(e) => {
            let _ = ready.send(Err(StartError::Executor { cpu: usize::MAX, reason: e.to_string() }));
            return;
        }
    };
    let id = CoreId(senders.peer_id());
    let mut bound = Vec::with_capacity(specs.len());
    for spec in specs.iter() {
        match listen_on(spec.addr) {
            Ok((listener, fd)) => bound.push((spec.clone(), listener, fd)),
            Err(source) => {
                let _ = ready.send(Err(StartError::Bind { addr: spec.addr, source }));
                return;
            }
        }
    }
    // Remote array: this core's egress thread, answering through the core's array channel.
    let egress = match &cfg.array {
        crate::config::ArrayMode::Embedded => None,
        crate::config::ArrayMode::Remote(remote) => match crate::egress::spawn(id, cpu, remote, Arc::clone(&cfg), array) {
            Ok(link) => Some(link),
            Err(reason) => {
                let _ = ready.send(Err(StartError::Executor { cpu, reason }));
                return;
            }
        },
    };
    let store = match egress {
        Some(_) => None,
        None => match crate::engine::durable::open(&cfg, id) {
            Ok(store) => store,
            Err(reason) => {
                let _ = ready.send(Err(StartError::Store(reason)));
                return;
            }
        },
    };
    let core = Core::new(id, cores, cfg, Arc::clone(&shared), senders, egress, store);
    let _ = ready.send(Ok(()));
    tracing::debug!(core = %id, listeners = ?specs.iter().map(|s| s.addr).collect::<Vec<_>>(), "core listening");

    // What this core's tasks send peers during a turn goes out as one entry per peer.
    glommio::spawn_local(Rc::clone(&core).ship_batches()).detach();

    // One task per peer ring: handle each message of each batch in order, then whatever it
    // queued locally.
    for (_, rx) in receivers.streams() {
        let core = Rc::clone(&core);
        glommio::spawn_local(async move {
            let mut handled = 0u32;
            while let Some(mut batch) = rx.recv().await {
                for msg in batch.drain(..) {
                    core.handle(msg);
                    core.drain_local();
                    // A ring that never runs dry would starve every other task of this core.
                    handled += 1;
                    if handled.is_multiple_of(64) {
                        futures_lite::future::yield_now().await;
                    }
                }
                core.recycle(batch);
            }
        })
        .detach();
    }

    // Messages from outside the cores (array API).
    let foreign_rx = foreign_rxs.lock().ok().and_then(|mut v| v.get_mut(id.index()).and_then(Option::take));
    if let Some(rx) = foreign_rx {
        let core = Rc::clone(&core);
        glommio::spawn_local(async move {
            while let Ok(msg) = rx.recv_async().await {
                core.handle(msg);
                core.drain_local();
            }
        })
        .detach();
    }

    // Housekeeping; also notices the shutdown request.
    let ticker = {
        let core = Rc::clone(&core);
        glommio::spawn_local(async move {
            loop {
                glommio::timer::sleep(TICK).await;
                core.tick();
                if core.shared.shutdown.load(Ordering::SeqCst) {
                    core.stopping.set();
                    break;
                }
            }
        })
    };

    // Accept until shutdown, one task per listener.
    let accepting: Vec<_> = bound.into_iter().map(|(spec, listener, fd)| glommio::spawn_local(accept_loop(Rc::clone(&core), listener, fd, spec))).collect();
    for task in accepting {
        task.await;
    }
    ticker.await;
    shutdown_connections(&core).await;
}

/// Accepts on one listener until shutdown: plain connections are served at once, TLS ones
/// after their handshake ([`serve_tls`]), WebSocket ones after theirs ([`serve_ws`]), each on
/// its own task on this core.
async fn accept_loop(core: Rc<Core>, listener: glommio::net::TcpListener, listener_fd: std::os::fd::RawFd, spec: listeners::Spec) {
    let mut guard = accept::AcceptGuard::new(core.id);
    loop {
        let accepted = futures_lite::future::or(async { Some(listener.accept().await) }, async {
            core.stopping.wait().await;
            None
        })
        .await;
        match accepted {
            None => break,
            Some(Ok(stream)) => {
                // TCP_NODELAY is already set: inherited from the listener (`set_nodelay`).
                guard.accepted();
                match (&spec.tls, &spec.ws) {
                    (None, None) if spec.amqp => {
                        glommio::spawn_local(crate::amqp::serve::serve(Rc::clone(&core), conn::stream::Stream::Plain(stream), None)).detach()
                    }
                    (None, None) => glommio::spawn_local(conn::serve(Rc::clone(&core), conn::stream::Stream::Plain(stream), None)).detach(),
                    (Some(tls), None) => glommio::spawn_local(serve_tls(Rc::clone(&core), stream, Arc::clone(tls), spec.amqp)).detach(),
                    (tls, Some(ws)) => glommio::spawn_local(serve_ws(Rc::clone(&core), stream, tls.clone(), Arc::clone(ws))).detach(),
                };
            }
            Some(Err(e)) => match guard.failed(listener_fd, std::io::Error::from(e)) {
                accept::Next::Retry => {}
                accept::Next::Wait(pause) => glommio::timer::sleep(pause).await,
            },
        }
    }
    stop_listening(listener_fd);
}

/// Takes the listener out of LISTEN state now. Closing it is not enough: the accept still in
/// flight in io_uring holds a reference to the socket, and the kernel drops it only when the
/// ring is torn down, asynchronously and after the process has exited. Until then the port
/// still listens: new connections queue on a socket nobody accepts from (and are reset when
/// it finally goes), and a restart's exclusive-port probe finds the port taken.
/// shutdown(2) on a listening socket stops it at once and completes the pending accept.
fn stop_listening(listener_fd: std::os::fd::RawFd) {
    // SAFETY: shutdown(2) on the listener's descriptor, which the caller's listener still owns.
    unsafe { libc::shutdown(listener_fd, libc::SHUT_RDWR) };
}

/// The TLS handshake, on this core's executor, within `--connect-timeout-s` (the same clock a
/// client has to send CONNECT: a handshake is the first thing a slow or silent client can
/// stall). A failed or late handshake closes this connection only, and is counted. Then the
/// connection is STOMP's, or with `amqp` AMQP 1.0's (amqps).
async fn serve_tls(core: Rc<Core>, tcp: glommio::net::TcpStream, tls: Arc<crate::tls::Tls>, amqp: bool) {
    let deadline = Duration::from_secs(core.cfg.connect_timeout_s);
    let handshake = tls.acceptor().accept(tcp);
    let outcome = futures_lite::future::or(async { Some(handshake.await) }, async {
        glommio::timer::sleep(deadline).await;
        None
    })
    .await;
    match outcome {
        Some(Ok(stream)) => {
            let identity = crate::tls::peer_identity(stream.get_ref().1);
            let stream = conn::stream::Stream::Tls(Box::new(stream));
            if amqp {
                crate::amqp::serve::serve(core, stream, identity).await;
            } else {
                conn::serve(core, stream, identity).await;
            }
        }
        Some(Err(error)) => {
            crate::engine::metrics::Metrics::add(&core.metrics.tls_handshakes_failed, 1);
            tracing::debug!(core = %core.id, %error, "TLS handshake failed; connection closed");
        }
        None => {
            crate::engine::metrics::Metrics::add(&core.metrics.tls_handshakes_failed, 1);
            tracing::debug!(core = %core.id, "TLS handshake not completed within --connect-timeout-s; connection closed");
        }
    }
}

/// STOMP over WebSocket: the TLS handshake (wss) and the WebSocket handshake, on this core's
/// executor and both within `--connect-timeout-s`, as for TLS; then the connection is served
/// like any other. A refused handshake has had its HTTP answer (see `ws::handshake`).
async fn serve_ws(core: Rc<Core>, tcp: glommio::net::TcpStream, tls: Option<Arc<crate::tls::Tls>>, ws: Arc<crate::ws::Settings>) {
    let deadline = Duration::from_secs(core.cfg.connect_timeout_s);
    let handshakes = async {
        let (stream, identity) = match tls {
            None => (conn::stream::Stream::Plain(tcp), None),
            Some(tls) => match tls.acceptor().accept(tcp).await {
                Ok(stream) => {
                    let identity = crate::tls::peer_identity(stream.get_ref().1);
                    (conn::stream::Stream::Tls(Box::new(stream)), identity)
                }
                Err(error) => {
                    crate::engine::metrics::Metrics::add(&core.metrics.tls_handshakes_failed, 1);
                    return Err(format!("TLS handshake failed: {error}"));
                }
            },
        };
        match crate::ws::handshake::accept(stream, &ws).await {
            Ok(ws) => Ok((ws, identity)),
            Err(failed) => Err(format!("WebSocket handshake failed: {failed:?}")),
        }
    };
    let outcome = futures_lite::future::or(async { Some(handshakes.await) }, async {
        glommio::timer::sleep(deadline).await;
        None
    })
    .await;
    match outcome {
        Some(Ok((ws, identity))) => conn::serve(core, conn::stream::Stream::Ws(Box::new(ws)), identity).await,
        Some(Err(reason)) => tracing::debug!(core = %core.id, %reason, "connection closed"),
        None => tracing::debug!(core = %core.id, "WebSocket handshake not completed within --connect-timeout-s; connection closed"),
    }
}

/// Graceful stop: every connection gets `ERROR server shutting down` and is closed; closing
/// releases its subscriptions, which requeues unacknowledged queue messages.
async fn shutdown_connections(core: &Rc<Core>) {
    for endpoint in core.all_endpoints() {
        endpoint.shut_down(core);
    }
    let deadline = std::time::Instant::now() + SHUTDOWN_GRACE;
    while core.endpoint_count() > 0 && std::time::Instant::now() < deadline {
        core.drain_local();
        glommio::timer::sleep(Duration::from_millis(10)).await;
    }
    for endpoint in core.all_endpoints() {
        endpoint.kill();
    }
    core.drain_local();
    core.ship_all();
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What `listen_on` relies on to skip a setsockopt per connection: an accepted socket
    /// inherits TCP_NODELAY from its listener (and has it only through the listener).
    #[test]
    fn accepted_connections_inherit_nodelay_from_the_listener() {
        use std::os::fd::AsRawFd;
        for listener_nodelay in [true, false] {
            let sock = bound_reuseport_socket("127.0.0.1:0".parse().unwrap()).unwrap();
            if listener_nodelay {
                set_nodelay(sock.as_raw_fd()).unwrap();
            }
            // SAFETY: listen(2) on a bound socket we own.
            assert_eq!(unsafe { libc::listen(sock.as_raw_fd(), 16) }, 0);
            let listener = std::net::TcpListener::from(sock);
            let _client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
            let (accepted, _) = listener.accept().unwrap();
            assert_eq!(accepted.nodelay().unwrap(), listener_nodelay, "listener TCP_NODELAY {listener_nodelay}");
        }
    }

    #[test]
    fn kernel_release_parses() {
        assert_eq!(parse_kernel_release("6.18.44-fc-v657"), Some((6, 18)));
        assert_eq!(parse_kernel_release("5.10.0-28-amd64"), Some((5, 10)));
        assert_eq!(parse_kernel_release("garbage"), None);
    }

    #[test]
    fn this_kernel_runs_io_uring() {
        check_io_uring().expect("the development kernel supports io_uring");
    }
}
