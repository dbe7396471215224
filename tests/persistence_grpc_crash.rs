//! Restart under SDK load through the gRPC API (issue 15): a child gateway (`stompgate
//! --store-dir DIR --cores 2`, `fsync`, small segments) takes queue sends through the KubeMQ
//! gRPC API from two threads — one with unary `SendQueueMessage`, one with
//! `SendQueueMessagesBatch` of four, as the SDKs send them — while a third pulls with
//! `ReceiveQueueMessages` (destructive: a message it got is taken). The child is killed with
//! SIGKILL once enough sends have succeeded, a new process starts on the same directory, and
//! the queue is drained (up to a marker sent after the restart, so no timing is involved):
//!
//! * every send whose result came back without error was either pulled before the kill or is
//!   delivered after it: 0 lost;
//! * a message pulled before the kill may come back once (its removal's record may not have
//!   reached the disk: at-least-once), and a message may not come back twice after it; those
//!   duplicates are counted and printed.
//!
//! Follows `persistence_crash_accounting.rs` (STOMP) in shape; two rounds on the same
//! directory, so the second also recovers what the first restart wrote.
use crate::common;
use common::child::Gateway;
use common::grpc::{pb, queue_message, rid, Client, CLIENT_ID};
use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use stompgate::wire::pb::kubemq_client::KubemqClient;

const CHANNEL: &str = "persist.grpc.crash";
/// Successful sends before the kill, per round.
const KILL_AFTER: usize = 300;

#[derive(Default)]
struct Seen {
    /// Bodies whose send result came back without error.
    sent_ok: BTreeSet<String>,
    /// Bodies pulled before the kill.
    pulled: BTreeSet<String>,
}

type Shared = Arc<Mutex<Seen>>;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap()
}

async fn connect(addr: SocketAddr) -> Client {
    let endpoint = tonic::transport::Endpoint::from_shared(format!("http://{addr}")).unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match endpoint.connect().await {
            Ok(c) => return KubemqClient::new(c),
            Err(_) if Instant::now() < deadline => tokio::time::sleep(Duration::from_millis(50)).await,
            Err(e) => panic!("gRPC connect to {addr}: {e}"),
        }
    }
}

/// Sends `{prefix}{n}` until the gateway goes away (a transport error) or `stop`; `batch`
/// > 1 sends them as one `SendQueueMessagesBatch`. Records every successful result.
fn producer(addr: SocketAddr, prefix: String, batch: usize, seen: Shared, stop: Arc<AtomicBool>, ok: Arc<AtomicUsize>) -> JoinHandle<()> {
    std::thread::spawn(move || {
        runtime().block_on(async {
            let mut c = connect(addr).await;
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let bodies: Vec<String> = (0..batch)
                    .map(|_| {
                        n += 1;
                        format!("{prefix}{n}")
                    })
                    .collect();
                let results = if batch == 1 {
                    match c.send_queue_message(queue_message(CHANNEL, bodies[0].as_bytes())).await {
                        Ok(r) => vec![r.into_inner()],
                        Err(_) => return,
                    }
                } else {
                    let messages = bodies.iter().map(|b| queue_message(CHANNEL, b.as_bytes())).collect();
                    match c.send_queue_messages_batch(pb::QueueMessagesBatchRequest { batch_id: rid("batch"), messages }).await {
                        Ok(r) => r.into_inner().results,
                        Err(_) => return,
                    }
                };
                let mut s = seen.lock().unwrap();
                for (body, r) in bodies.iter().zip(&results) {
                    if !r.is_error {
                        s.sent_ok.insert(body.clone());
                        ok.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        })
    })
}

fn receive_request(max: i32, wait_s: i32) -> pb::ReceiveQueueMessagesRequest {
    pb::ReceiveQueueMessagesRequest {
        request_id: rid("pull"),
        client_id: CLIENT_ID.into(),
        channel: CHANNEL.into(),
        max_number_of_messages: max,
        wait_time_seconds: wait_s,
        is_peak: false,
    }
}

/// Pulls (destructively) until the gateway goes away or `stop`, recording what it got: two
/// at a time with a pause, slower than the producers, so that a backlog is queued at the kill.
fn consumer(addr: SocketAddr, seen: Shared, stop: Arc<AtomicBool>) -> JoinHandle<()> {
    std::thread::spawn(move || {
        runtime().block_on(async {
            let mut c = connect(addr).await;
            while !stop.load(Ordering::Relaxed) {
                let Ok(r) = c.receive_queue_messages(receive_request(2, 1)).await else { return };
                let r = r.into_inner();
                seen.lock().unwrap().pulled.extend(r.messages.into_iter().map(|m| String::from_utf8(m.body).unwrap()));
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
    })
}

/// After a restart: sends a marker, then pulls until it arrives; every body before it, in
/// order of arrival (repeats kept).
fn drain(addr: SocketAddr, marker: &str) -> Vec<String> {
    runtime().block_on(async {
        let mut c = connect(addr).await;
        let r = c.send_queue_message(queue_message(CHANNEL, marker.as_bytes())).await.expect("marker sent").into_inner();
        assert!(!r.is_error, "{r:?}");
        let mut got = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            assert!(Instant::now() < deadline, "the marker never arrived; got {} so far", got.len());
            let r = c.receive_queue_messages(receive_request(1024, 1)).await.expect("pull").into_inner();
            assert!(!r.is_error, "{r:?}");
            for m in r.messages {
                let body = String::from_utf8(m.body).unwrap();
                if body == marker {
                    return got;
                }
                got.push(body);
            }
        }
    })
}

#[test]
fn every_successful_grpc_queue_send_survives_kill_9_as_pulled_before_or_delivered_after() {
    let dir = std::env::temp_dir().join(format!("sg-persist-grpc-{}-{}", std::process::id(), common::unique("d")));
    let _ = std::fs::remove_dir_all(&dir);
    let _cleanup = Cleanup(dir.clone());
    let grpc = common::metrics::free_port();
    let (dir_arg, grpc_arg) = (dir.to_str().unwrap().to_owned(), grpc.to_string());
    let args = ["--store-dir", dir_arg.as_str(), "--cores", "2", "--grpc-addr", grpc_arg.as_str(), "--store-segment-bytes", "65536"];
    for round in 0..2 {
        let gw = Gateway::spawn(&args, None);
        let seen: Shared = Arc::default();
        let (stop, ok) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicUsize::new(0)));
        let threads = vec![
            producer(grpc, format!("r{round}-u-"), 1, Arc::clone(&seen), Arc::clone(&stop), Arc::clone(&ok)),
            producer(grpc, format!("r{round}-b-"), 4, Arc::clone(&seen), Arc::clone(&stop), Arc::clone(&ok)),
            consumer(grpc, Arc::clone(&seen), Arc::clone(&stop)),
        ];
        let deadline = Instant::now() + Duration::from_secs(120);
        while ok.load(Ordering::Relaxed) < KILL_AFTER {
            assert!(Instant::now() < deadline, "only {} sends succeeded", ok.load(Ordering::Relaxed));
            std::thread::sleep(Duration::from_millis(5));
        }
        gw.stop(); // SIGKILL, under load
        stop.store(true, Ordering::Relaxed);
        for t in threads {
            t.join().unwrap();
        }
        let seen = Arc::try_unwrap(seen).ok().unwrap().into_inner().unwrap();

        let gw = Gateway::spawn(&args, None);
        let after = drain(grpc, &format!("marker-{round}"));
        gw.stop();
        let mut times: BTreeMap<&str, usize> = BTreeMap::new();
        for b in &after {
            *times.entry(b.as_str()).or_default() += 1;
        }
        let delivered: BTreeSet<String> = times.keys().map(|b| b.to_string()).collect();
        let lost: Vec<&String> = seen.sent_ok.iter().filter(|b| !seen.pulled.contains(*b) && !delivered.contains(*b)).collect();
        let pulled_and_back = seen.pulled.intersection(&delivered).count();
        let twice_after = times.values().filter(|&&n| n > 1).count();
        println!(
            "round {round}: {} sends succeeded, {} pulled before the kill, {} delivered after it ({} of them pulled before too, {} more than once), {} lost",
            seen.sent_ok.len(),
            seen.pulled.len(),
            delivered.len(),
            pulled_and_back,
            twice_after,
            lost.len()
        );
        assert!(lost.is_empty(), "round {round}: successful sends lost: {:?}", &lost[..lost.len().min(20)]);
        assert!(!delivered.is_empty() && !seen.pulled.is_empty(), "round {round}: the kill came with a backlog and a consumer at work");
        assert_eq!(twice_after, 0, "round {round}: a message delivered twice after one restart");
    }
}

struct Cleanup(PathBuf);

impl Drop for Cleanup {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
