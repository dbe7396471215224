//! `connect`: K workers each loop TCP connect, CONNECT, CONNECTED, DISCONNECT + receipt, close.

use std::sync::atomic::Ordering;
use std::time::Duration;

use crate::body::now_ns;
use crate::conn::{Buffers, Conn, LoadError, Target};
use crate::measure::Server;
use crate::report::Report;
use crate::track::{latency_histogram, Latency};
use crate::{window_from_now, Common, Shared, Watch};

const DISCONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Cycles completed inside the window, and their durations.
struct Cycles {
    count: u64,
    latency: hdrhistogram::Histogram<u64>,
    version: String,
}

fn worker(target: &Target, shared: &Shared) -> Result<Cycles, LoadError> {
    let mut out = Cycles { count: 0, latency: latency_histogram(), version: String::new() };
    while !shared.failed.load(Ordering::Relaxed) {
        let t0 = now_ns();
        if t0 >= shared.window.end_ns {
            break;
        }
        let conn = Conn::open(target, Buffers::Small)?;
        if out.version.is_empty() {
            out.version.clone_from(&conn.version);
        }
        conn.disconnect(DISCONNECT_TIMEOUT)?;
        let t1 = now_ns();
        shared.sent.fetch_add(1, Ordering::Relaxed);
        if shared.window.contains(t0) && t1 < shared.window.end_ns {
            out.count += 1;
            let _ = out.latency.record((t1 - t0).max(1));
        }
    }
    Ok(out)
}

/// # Errors
/// The first worker's failure (connect refused, ERROR, missing receipt).
pub fn run(workers: usize, c: &Common, target: &Target, server: Option<Server>) -> Result<Report, LoadError> {
    let shared = Shared::new(window_from_now(c), c.quiet);
    let mut watch = Watch::new(server, ("connections", "-"));
    let results: Vec<Result<Cycles, LoadError>> = std::thread::scope(|s| {
        let shared = &shared;
        let handles: Vec<_> = (0..workers)
            .map(|i| {
                std::thread::Builder::new()
                    .name(format!("connect-{i}"))
                    .spawn_scoped(s, move || shared.guard(|| worker(target, shared)))
                    .expect("spawn connect worker")
            })
            .collect();
        watch.run_until(shared, shared.window.end_ns, || false);
        handles.into_iter().map(|h| h.join().expect("connect worker panicked")).collect()
    });
    let mut latency = latency_histogram();
    let mut count = 0;
    let mut version = String::new();
    for r in results {
        let r = r?;
        count += r.count;
        latency.add(&r.latency).expect("same histogram bounds");
        if version.is_empty() {
            version = r.version;
        }
    }
    let (harness_cpu_s, server_cpu_s) = watch.window_cpu();
    Ok(Report {
        scenario: "connect",
        stomp_version: version,
        window_s: shared.window.secs(),
        connections: Some(count),
        latency: Some(Latency::of(&latency)),
        harness_cpu_s,
        server_cpu_s,
        ..Report::default()
    })
}
