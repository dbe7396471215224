//! The Prometheus exporter for tests that read the gateway's counters. The recorder is
//! process-wide: a test binary that scrapes must be the only one counting what it checks.
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::OnceLock;
use std::time::Duration;

/// The metrics exporter's address, installed on first use (before any gateway starts).
pub fn metrics_addr() -> SocketAddr {
    static ADDR: OnceLock<SocketAddr> = OnceLock::new();
    *ADDR.get_or_init(|| {
        let addr = free_port();
        stompgate::telemetry::install(addr).expect("metrics exporter installs");
        addr
    })
}

/// A loopback address for a listener a test is about to start: free when returned (bound,
/// then released), never handed out twice by this process, and below the kernel's ephemeral
/// range where one is left (`ip_local_port_range`). A port from `bind(:0)` comes from that
/// range: the kernel may give it again to another test's `bind(:0)` before the first gateway
/// has bound it (then one test's readiness probe or client lands on the other test's
/// listener, e.g. a stray failed TLS handshake in a test that counts them), or to a client as
/// its source port.
pub fn free_port() -> SocketAddr {
    use std::sync::atomic::{AtomicU32, Ordering};
    const LOWEST: u32 = 10_000;
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let below = ephemeral_range_start();
    if below <= LOWEST + 1_000 {
        // No room below the range: the kernel's choice, never twice from this process.
        static GIVEN: std::sync::Mutex<Vec<u16>> = std::sync::Mutex::new(Vec::new());
        loop {
            let addr = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
            let mut given = GIVEN.lock().unwrap();
            if !given.contains(&addr.port()) {
                given.push(addr.port());
                return addr;
            }
        }
    }
    let span = below - LOWEST;
    // Each test binary starts at its own place (they run one after another, and a gateway
    // of the previous one may still be closing).
    let _ = NEXT.compare_exchange(0, 1 + std::process::id() % span, Ordering::Relaxed, Ordering::Relaxed);
    for _ in 0..span {
        let port = LOWEST + NEXT.fetch_add(1, Ordering::Relaxed) % span;
        // Free now (nothing bound, nothing lingering in TIME_WAIT): bound without SO_REUSEADDR.
        if let Ok(l) = TcpListener::bind(("127.0.0.1", port as u16)) {
            return l.local_addr().unwrap();
        }
    }
    panic!("no free loopback port in {LOWEST}..{below}");
}

/// The first port of the kernel's ephemeral range (32768 when it cannot be read).
fn ephemeral_range_start() -> u32 {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").ok().and_then(|s| s.split_whitespace().next()?.parse().ok()).unwrap_or(32_768).min(65_536)
}

/// A loopback port that stays unreachable while this lives: a socket is bound to it without
/// `SO_REUSEADDR` and never listens, so a connect to it is refused and no other socket (another
/// test's listener, or a client's ephemeral source port) can take it meanwhile. A port from
/// [`free_port`] is only free when returned.
pub struct UnreachablePort {
    fd: libc::c_int,
    pub addr: SocketAddr,
}

impl UnreachablePort {
    pub fn hold() -> UnreachablePort {
        // SAFETY: plain socket calls on a descriptor this function owns; `addr` and `len` are
        // valid for the sizes passed.
        unsafe {
            let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
            assert!(fd >= 0, "socket: {}", std::io::Error::last_os_error());
            let mut addr: libc::sockaddr_in = std::mem::zeroed();
            addr.sin_family = libc::AF_INET as libc::sa_family_t;
            addr.sin_addr.s_addr = u32::from(std::net::Ipv4Addr::LOCALHOST).to_be();
            let len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
            let rc = libc::bind(fd, std::ptr::addr_of!(addr).cast(), len);
            assert_eq!(rc, 0, "bind: {}", std::io::Error::last_os_error());
            let mut len = len;
            let rc = libc::getsockname(fd, std::ptr::addr_of_mut!(addr).cast(), &mut len);
            assert_eq!(rc, 0, "getsockname: {}", std::io::Error::last_os_error());
            let port = u16::from_be(addr.sin_port);
            UnreachablePort { fd, addr: SocketAddr::from((std::net::Ipv4Addr::LOCALHOST, port)) }
        }
    }
}

impl Drop for UnreachablePort {
    fn drop(&mut self) {
        // SAFETY: `fd` is this value's own descriptor, closed once.
        unsafe { libc::close(self.fd) };
    }
}

/// The sum over its labels of a counter, scraped from the exporter.
pub fn scrape_sum(metric: &str) -> f64 {
    scrape_sum_at(metrics_addr(), metric)
}

/// The whole `GET /metrics` answer (status line included) of the metrics listener at `addr`.
pub fn scrape_at(addr: SocketAddr) -> String {
    let mut s = TcpStream::connect(addr).expect("metrics endpoint");
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n").unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).expect("metrics response");
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    text
}

/// The sum over its labels of a counter, scraped from the metrics listener at `addr` (a
/// gateway of its own, e.g. a spawned child).
pub fn scrape_sum_at(addr: SocketAddr, metric: &str) -> f64 {
    scrape_at(addr)
        .lines()
        .filter(|l| l.starts_with(&format!("{metric}{{")) || l.starts_with(&format!("{metric} ")))
        .map(|l| l.rsplit(' ').next().unwrap().parse::<f64>().unwrap_or_else(|_| panic!("bad sample {l:?}")))
        .sum()
}
