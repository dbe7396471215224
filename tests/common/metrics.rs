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

/// A loopback address nothing listens on (bound, then released).
pub fn free_port() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap()
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
