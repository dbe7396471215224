//! `idle`: open M connections (CONNECT, no heart-beats, no subscriptions), hold them for the
//! window, check that the server kept every one, close them.
//!
//! Server RSS is read before the first connection and after the settle time (`--warmup-s`);
//! the difference divided by M is the server's memory per idle connection.

use std::io::ErrorKind;
use std::os::fd::AsRawFd;
use std::time::Instant;

use crate::body::now_ns;
use crate::conn::{Buffers, Conn, LoadError, Stream, Target};
use crate::measure::Server;
use crate::report::Report;
use crate::track::Window;
use crate::{secs_ns, Common, Shared, Watch};

/// File descriptors kept free for everything else the harness opens.
const FD_RESERVE: u64 = 64;

/// Opens `n` connections; only the streams are kept (the read/write buffers are dropped).
/// Stops at the first failure, returning what it opened so far and the error.
fn open_many(target: &Target, n: usize) -> (Vec<Stream>, String, Option<LoadError>) {
    let mut out = Vec::with_capacity(n);
    let mut version = String::new();
    for _ in 0..n {
        match Conn::open(target, Buffers::Small) {
            Ok(conn) => {
                version.clone_from(&conn.version);
                out.push(conn.stream);
            }
            Err(e) => return (out, version, Some(e)),
        }
    }
    (out, version, None)
}

/// Connections on which the server sent something or hung up: for an idle connection with
/// heart-beats off, only an ERROR or a close can have arrived. Over TLS the server may also
/// have sent TLS records of its own (TLS 1.3 session tickets): such a connection is read, and
/// counts only if STOMP bytes, EOF or an error came.
fn count_dropped(streams: &mut [Stream]) -> u64 {
    let mut dropped = 0;
    for chunk in streams.chunks_mut(1024) {
        let mut fds: Vec<libc::pollfd> =
            chunk.iter().map(|s| libc::pollfd { fd: s.tcp().as_raw_fd(), events: libc::POLLIN | libc::POLLRDHUP, revents: 0 }).collect();
        // SAFETY: `fds` is a valid array of `fds.len()` pollfd structs; timeout 0 never blocks.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, 0) };
        if n > 0 {
            for (p, s) in fds.iter().zip(chunk.iter_mut()) {
                if p.revents != 0 && !only_transport_records(s) {
                    dropped += 1;
                }
            }
        }
    }
    dropped
}

/// A TLS or WebSocket connection whose pending input is TLS records or WebSocket control
/// frames only (no STOMP bytes, no EOF).
fn only_transport_records(s: &mut Stream) -> bool {
    if !matches!(s, Stream::Tls(_) | Stream::Ws(_)) || s.tcp().set_nonblocking(true).is_err() {
        return false;
    }
    let mut probe = [0u8; 64];
    let quiet = matches!(s.read(&mut probe), Err(e) if e.kind() == ErrorKind::WouldBlock);
    quiet && s.tcp().set_nonblocking(false).is_ok()
}

/// # Errors
/// Too low a file limit, or any connection failing to open (the message says how many did).
pub fn run(connections: usize, workers: usize, nofile: u64, c: &Common, target: &Target, server: Option<Server>) -> Result<Report, LoadError> {
    if connections as u64 + FD_RESERVE > nofile {
        return Err(LoadError::Setup(format!(
            "--connections {connections} needs about {} file descriptors; RLIMIT_NOFILE allows {nofile} \
             (raised to the hard limit already; raise the hard limit with ulimit -Hn as root)",
            connections as u64 + FD_RESERVE
        )));
    }
    let rss_before = server.and_then(|s| s.rss_kib());
    let opened = Instant::now();
    let workers = workers.min(connections).max(1);
    let results: Vec<(Vec<Stream>, String, Option<LoadError>)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..workers)
            .map(|i| {
                let n = connections / workers + usize::from(i < connections % workers);
                std::thread::Builder::new().name(format!("idle-open-{i}")).spawn_scoped(s, move || open_many(target, n)).expect("spawn idle opener")
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("idle opener panicked")).collect()
    });
    let mut streams = Vec::with_capacity(connections);
    let mut version = String::new();
    let mut first_err = None;
    for (s, v, err) in results {
        streams.extend(s);
        if !v.is_empty() {
            version = v;
        }
        first_err = first_err.or(err);
    }
    if let Some(e) = first_err {
        return Err(LoadError::Setup(format!("opened {} of {connections} idle connections, then: {e}", streams.len())));
    }
    let open_per_s = connections as f64 / opened.elapsed().as_secs_f64();

    // Settle (--warmup-s), then the window: hold the connections and watch.
    let start_ns = now_ns() + secs_ns(c.warmup_s);
    let shared = Shared::new(Window { start_ns, end_ns: start_ns + secs_ns(c.duration_s) }, c.quiet);
    let mut watch = Watch::new(server, ("-", "-"));
    watch.run_until(&shared, shared.window.start_ns, || false);
    let rss_held = server.and_then(|s| s.rss_kib());
    watch.run_until(&shared, shared.window.end_ns, || false);
    let dropped = count_dropped(&mut streams);
    let rss_end = server.and_then(|s| s.rss_kib());
    let (harness_cpu_s, server_cpu_s) = watch.window_cpu();

    // Best effort: a DISCONNECT so the server sees a clean close; no receipts awaited.
    for mut s in streams {
        let _ = s.write_all(b"DISCONNECT\n\n\0");
    }
    Ok(Report {
        scenario: "idle",
        stomp_version: version,
        window_s: shared.window.secs(),
        dropped: Some(dropped),
        open_per_s: Some(open_per_s),
        harness_cpu_s,
        server_cpu_s,
        server_rss_kib: rss_held.max(rss_end),
        server_rss_before_kib: rss_before,
        ..Report::default()
    })
}
