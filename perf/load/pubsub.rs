//! `fanout` and `queue`: publishers and receiver groups around one destination.

use std::sync::atomic::Ordering;

use crate::body::now_ns;
use crate::conn::{Buffers, Conn, LoadError, Target};
use crate::measure::Server;
use crate::publish::{self, PublishSpec, Published};
use crate::receive::{self, Mode, Receiver};
use crate::report::Report;
use crate::track::{latency_histogram, Latency, Seen};
use crate::{secs_ns, window_from_now, Common, Shared, Watch};

pub struct Plan {
    pub mode: Mode,
    pub destination: String,
    pub publishers: usize,
    pub receivers: usize,
    pub threads: usize,
}

/// The drain never lasts longer than this, however slowly messages trickle in.
const MAX_DRAIN_NS: u64 = 60_000_000_000;

/// Subscribes every receiver (each confirmed by a receipt), then publishes for warm-up +
/// window, drains, and accounts.
///
/// # Errors
/// Any connection's failure; the others are wound down first.
pub fn run(plan: &Plan, c: &Common, target: &Target, server: Option<Server>) -> Result<Report, LoadError> {
    let ack = match plan.mode {
        Mode::Topic => "auto",
        Mode::Queue => "client-individual",
    };
    let mut version = String::new();
    let threads = plan.threads.min(plan.receivers).max(1);
    let mut groups: Vec<Vec<Receiver>> = (0..threads).map(|_| Vec::new()).collect();
    for i in 0..plan.receivers {
        let mut conn = Conn::open(target, Buffers::Large)?;
        conn.subscribe(&plan.destination, &format!("sub-{i}"), ack)?;
        version.clone_from(&conn.version);
        groups[i % threads].push(Receiver::new(conn, plan.publishers));
    }
    let mut senders = Vec::with_capacity(plan.publishers);
    for _ in 0..plan.publishers {
        senders.push(Conn::open(target, Buffers::Large)?);
    }
    let per_publisher_rate = c.rate / plan.publishers as f64;

    let shared = Shared::new(window_from_now(c), c.quiet);
    let mut watch = Watch::new(server, ("sent", "delivered"));
    let (published, received) = std::thread::scope(|s| {
        let shared = &shared;
        let receiver_threads: Vec<_> = groups
            .into_iter()
            .enumerate()
            .map(|(i, g)| {
                std::thread::Builder::new()
                    .name(format!("recv-{i}"))
                    .spawn_scoped(s, move || shared.guard(|| receive::run(g, plan.mode, plan.publishers, shared)))
                    .expect("spawn receiver thread")
            })
            .collect();
        let publisher_threads: Vec<_> = senders
            .into_iter()
            .enumerate()
            .map(|(i, conn)| {
                let spec = PublishSpec {
                    id: u32::try_from(i).expect("publisher count fits u32"),
                    destination: plan.destination.clone(),
                    payload: c.payload as usize,
                    rate: per_publisher_rate,
                    receipt_every: c.receipt_every,
                    receipt_window: c.receipt_window as usize,
                    extra_headers: c.send_header.iter().flat_map(|h| h.bytes().chain([b'\n'])).collect(),
                };
                std::thread::Builder::new()
                    .name(format!("pub-{i}"))
                    .spawn_scoped(s, move || shared.guard(|| publish::publish(conn, spec, shared)))
                    .expect("spawn publisher thread")
            })
            .collect();

        watch.run_until(shared, shared.window.end_ns, || false);
        let published: Result<Vec<Published>, LoadError> = publisher_threads.into_iter().map(|h| h.join().expect("publisher thread panicked")).collect();

        if let Ok(p) = &published {
            drain(plan.mode, plan.receivers, p, c, shared, &mut watch);
        }
        shared.stop.store(true, Ordering::Relaxed);
        let received: Result<Vec<receive::Received>, LoadError> = receiver_threads.into_iter().map(|h| h.join().expect("receiver thread panicked")).collect();
        (published, received)
    });
    let published = published?;
    let received = received?;
    let (harness_cpu_s, server_cpu_s) = watch.window_cpu();

    let mut report = Report {
        scenario: match plan.mode {
            Mode::Topic => "fanout",
            Mode::Queue => "queue",
        },
        stomp_version: version,
        window_s: shared.window.secs(),
        harness_cpu_s,
        server_cpu_s,
        ..Report::default()
    };
    account(&mut report, plan.mode, plan.publishers, &published, received);
    Ok(report)
}

/// After the window: receivers keep receiving until every window message is in (once per
/// receiver in topic mode), or nothing new came for `--drain-s` (at most [`MAX_DRAIN_NS`]).
pub fn drain(mode: Mode, receivers: usize, published: &[Published], c: &Common, shared: &Shared, watch: &mut Watch) {
    let copies = match mode {
        Mode::Topic => receivers as u64,
        Mode::Queue => 1,
    };
    let expected: u64 = published.iter().map(Published::window_sent).sum::<u64>() * copies;
    let give_up = now_ns() + MAX_DRAIN_NS;
    let mut last = shared.window_distinct.load(Ordering::Relaxed);
    let mut idle_until = now_ns() + secs_ns(c.drain_s);
    while now_ns() < idle_until.min(give_up) && !shared.failed.load(Ordering::Relaxed) {
        watch.run_until(shared, (now_ns() + 100_000_000).min(idle_until), || shared.window_distinct.load(Ordering::Relaxed) >= expected);
        let got = shared.window_distinct.load(Ordering::Relaxed);
        if got >= expected {
            break;
        }
        if got > last {
            last = got;
            idle_until = now_ns() + secs_ns(c.drain_s);
        }
    }
}

/// Fills `report`'s message figures from what the publishers sent and the receiver groups
/// saw: delivered, latency, lost (per subscriber in topic mode, once over all consumers in
/// queue mode), duplicated, out-of-order, foreign.
pub fn account(report: &mut Report, mode: Mode, publishers: usize, published: &[Published], received: Vec<receive::Received>) {
    let mut latency = latency_histogram();
    let (mut delivered, mut ooo, mut foreign) = (0, 0, 0);
    let mut slots: Vec<Vec<Seen>> = Vec::new();
    for r in received {
        latency.add(&r.latency).expect("same histogram bounds");
        delivered += r.delivered_in_window;
        ooo += r.out_of_order;
        foreign += r.foreign;
        slots.extend(r.seen);
    }
    if mode == Mode::Queue {
        // One exactly-once ledger for all consumers.
        let mut merged = vec![Seen::default(); publishers];
        for slot in &slots {
            for (m, s) in merged.iter_mut().zip(slot) {
                m.merge(s);
            }
        }
        slots = vec![merged];
    }
    let (mut lost, mut dup) = (0, 0);
    for slot in &mut slots {
        for (seen, p) in slot.iter_mut().zip(published) {
            seen.recount_window(p.first_window_seq, p.end_seq);
            lost += p.window_sent() - seen.distinct;
            dup += seen.received - seen.distinct;
        }
    }
    let mut receipted = published.iter().filter_map(|p| p.receipted.as_ref()).peekable();
    if receipted.peek().is_some() {
        let mut receipt_latency = latency_histogram();
        let mut n = 0;
        for r in receipted {
            receipt_latency.add(&r.latency).expect("same histogram bounds");
            n += r.in_window;
        }
        report.receipted = Some(n);
        report.receipt_latency = Some(Latency::of(&receipt_latency));
    }
    report.sent = Some(published.iter().map(Published::window_sent).sum());
    report.delivered = Some(delivered);
    report.latency = Some(Latency::of(&latency));
    report.lost = Some(lost);
    report.duplicated = Some(dup);
    report.out_of_order = Some(ooo);
    report.foreign = Some(foreign);
}
