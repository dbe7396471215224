//! The persistent embedded array (issue 15), on real files with a real `kill -9`: a child
//! gateway (`stompgate --store-dir DIR`) takes receipted queue SENDs and ACKs, is killed with
//! SIGKILL (no shutdown code runs), and a new process on the same directory must deliver every
//! receipted-but-unacknowledged message again — a delivered-but-unacked one with
//! `redelivered:true` — and none that was acknowledged. Also: a second process on a directory
//! in use, a read-only directory and another core count fail at start with one clear line; a
//! torn last record (the tail a kill during a write leaves) is cut and the rest survives; a
//! store write that fails (a file-size limit standing in for a full disk) answers its STOMP
//! and gRPC sends with errors at once and loses nothing receipted before.
//! Space: with small segments, segments holding nothing live are deleted, and nothing settled
//! comes back after a kill; old live messages (a pinned queue message, delivered or not, an
//! Events-Store message) are copied forward so that a long acknowledged stream after them
//! keeps the segment count bounded, and after a kill each comes back exactly once. Store full: at `--store-max-bytes`, and on a real full filesystem (a 1 MiB tmpfs, where
//! the test may mount one), a refused SEND gets ERROR `too many pending requests` and nothing
//! receipted is lost.
//! RECEIPTs are the barriers: a RECEIPT of a SEND or ACK is sent only once its record is
//! synced, so everything receipted before the kill is on disk.
use crate::common;
use common::child::{Gateway, Limits};
use common::flow::*;
use common::grpc::pb;
use common::stomp_client::{Client, Frame};
use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use stompgate::wire::pb::kubemq_client::KubemqClient;

/// A fresh store directory under the system temp dir, removed when dropped.
struct TempStore(PathBuf);

impl TempStore {
    fn new(name: &str) -> TempStore {
        let dir = std::env::temp_dir().join(format!("sg-persist-{}-{name}-{}", std::process::id(), common::unique("d")));
        let _ = std::fs::remove_dir_all(&dir);
        TempStore(dir)
    }
    fn arg(&self) -> &str {
        self.0.to_str().unwrap()
    }
}

impl Drop for TempStore {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn connected(gw: &Gateway) -> Client {
    let mut c = Client::open(gw.stomp_addr);
    let f = c.connect("1.2");
    assert_eq!(f.command, "CONNECTED", "{f:?}");
    c
}

/// `n` SENDs to `dest`, each with a receipt, each RECEIPT awaited before the next.
fn send_receipted(c: &mut Client, dest: &str, bodies: impl Iterator<Item = String>) {
    for b in bodies {
        assert!(c.send_sync("SEND", &[("destination", dest)], b.as_bytes()).is_empty());
    }
}

fn body_set(frames: &[Frame]) -> BTreeSet<String> {
    frames.iter().map(|f| f.body_str().to_owned()).collect()
}

/// Runs the gateway binary with `args` and expects it to exit at start: its status and stderr.
fn start_fails(args: &[&str]) -> (std::process::ExitStatus, String) {
    start_fails_as(args, None)
}

fn start_fails_as(args: &[&str], uid: Option<u32>) -> (std::process::ExitStatus, String) {
    let port = common::metrics::free_port().to_string();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_stompgate"));
    cmd.args(["--grpc-addr", "off", "--ws-addr", "off", "--amqp-addr", "off", "--stomp-addr", &port])
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    if let Some(uid) = uid {
        use std::os::unix::process::CommandExt;
        cmd.uid(uid).gid(uid);
    }
    let mut child = cmd.spawn().expect("stompgate starts");
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("stompgate {args:?} did not exit at start");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
    (status, err)
}

/// The newest segment file of core `core`'s log.
fn last_segment(store: &Path, core: usize) -> PathBuf {
    let mut segs: Vec<PathBuf> = std::fs::read_dir(store.join(format!("core-{core}")))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "seg"))
        .collect();
    segs.sort();
    segs.pop().expect("a segment")
}

#[test]
fn receipted_unacked_queue_messages_survive_kill_9_and_acked_ones_do_not_come_back() {
    let store = TempStore::new("kill9");
    let dest = "/queue/persist.kill9";
    // 100 are delivered (the prefetch window, SubBuffSize) before the ACKs, 60 more as the
    // ACKs free slots, 90 never.
    let total = 250;
    let gw = Gateway::spawn(&["--store-dir", store.arg()], None);
    let mut p = connected(&gw);
    send_receipted(&mut p, dest, (0..total).map(|i| format!("m{i}")));
    let mut c = connected(&gw);
    let mut got = c.subscribe_expect("s", dest, &[("ack", "client-individual")], 100);
    // The first 60 are acknowledged, the last ACK with a receipt (ACKs of one connection are
    // logged in order, so its RECEIPT means all 60 are on disk).
    let acks: Vec<String> = got[..60].iter().map(|f| f.header("ack").unwrap().to_owned()).collect();
    for id in &acks[..59] {
        c.send("ACK", &[("id", id)], b"");
    }
    got.extend(c.send_sync("ACK", &[("id", &acks[59])], b""));
    got.extend(c.read_messages(160 - got.len()));
    c.no_frame(Duration::from_millis(300));
    // A receipted SEND elsewhere on the same core: its record follows the 160 deliveries'
    // records in the log, so its RECEIPT means they are on disk too.
    assert!(p.send_sync("SEND", &[("destination", "/queue/persist.kill9.barrier")], b"b").is_empty());
    let acked: BTreeSet<String> = body_set(&got[..60]);
    let delivered_unacked: BTreeSet<String> = body_set(&got[60..]);
    assert_eq!((acked.len(), delivered_unacked.len()), (60, 100));
    gw.stop(); // SIGKILL

    let gw = Gateway::spawn(&["--store-dir", store.arg()], None);
    let mut c = connected(&gw);
    // `auto`: acknowledged as written, so every message left can arrive at once.
    let again = c.subscribe_expect("s", dest, &[], 190);
    let bodies = body_set(&again);
    assert_eq!(bodies.len(), 190, "no duplicates");
    let expected: BTreeSet<String> = (0..total).map(|i| format!("m{i}")).filter(|b| !acked.contains(b)).collect();
    assert_eq!(bodies, expected, "every receipted, unacknowledged message is back; no acknowledged one");
    for f in &again {
        let was_delivered = delivered_unacked.contains(f.body_str());
        assert_eq!(f.header("redelivered") == Some("true"), was_delivered, "redelivered marks exactly the ones delivered before the kill: {f:?}");
    }
    let order: Vec<usize> = again.iter().map(|f| f.body_str()[1..].parse().unwrap()).collect();
    let mut sorted = order.clone();
    sorted.sort_unstable();
    assert_eq!(order, sorted, "the queue's order survives");
    // Everything was acknowledged (auto); after a receipted barrier and another kill, nothing
    // comes back.
    assert!(c.send_sync("UNSUBSCRIBE", &[("id", "s")], b"").is_empty());
    gw.stop();
    let gw = Gateway::spawn(&["--store-dir", store.arg()], None);
    let mut c = connected(&gw);
    assert!(c.subscribe_expect("s", dest, &[], 0).is_empty(), "all were acknowledged before the second kill");
    drop(gw);
}

/// 64 receipted SENDs to `dest` written at once (bodies `m{sent}` on), then their 64 RECEIPTs
/// (receipt ids `w{round}-{i}`): one window of a producer that keeps 64 outstanding.
fn send_window_of_64(p: &mut Client, dest: &str, round: usize, sent: &mut usize) {
    let mut window = Vec::new();
    for i in 0..64 {
        let receipt = format!("w{round}-{i}");
        window.extend(common::props::frame_bytes("SEND", &[("destination", dest), ("receipt", &receipt)], format!("m{sent}").as_bytes()));
        *sent += 1;
    }
    p.send_raw(&window);
    let receipts: BTreeSet<String> = (0..64)
        .map(|_| {
            let f = p.frame();
            assert_eq!(f.command, "RECEIPT", "{f:?}");
            f.header("receipt-id").unwrap().to_owned()
        })
        .collect();
    assert_eq!(receipts, (0..64).map(|i| format!("w{round}-{i}")).collect::<BTreeSet<_>>());
}

/// After a commit that released a whole window of confirmations, the commit loop waits for the
/// senders' answers (the "echo", `engine::durable`), but never past its cap: a SEND sent alone
/// after a window of 64 pipelined receipted SENDs gets its RECEIPT though no echo of 64 ever
/// comes, three times over, and every message is in the queue once.
#[test]
fn a_lone_receipted_send_after_a_window_of_64_is_confirmed_though_no_echo_comes() {
    let store = TempStore::new("echo");
    let dest = "/queue/persist.echo";
    let gw = Gateway::spawn(&["--store-dir", store.arg()], None);
    let mut p = connected(&gw);
    let mut sent = 0;
    for round in 0..3 {
        send_window_of_64(&mut p, dest, round, &mut sent);
        // One more, alone: its commit must not wait for 64 answers that never come.
        assert!(p.send_sync("SEND", &[("destination", dest)], format!("m{sent}").as_bytes()).is_empty());
        sent += 1;
    }
    let mut c = connected(&gw);
    let got = c.subscribe_expect("s", dest, &[], sent);
    assert_eq!(got.len(), sent);
    assert_eq!(body_set(&got), (0..sent).map(|i| format!("m{i}")).collect::<BTreeSet<_>>());
    c.no_frame(Duration::from_millis(200));
}

/// Deliveries held back while a commit waits for its echo (`array::queue`, "Deliveries held
/// back for a commit's echo") are handed out when the wait ends: a subscribed consumer gets
/// every message of a window of 64 pipelined receipted SENDs and of the lone unreceipted SEND
/// after it (sent while the next commit waits for an echo that never comes), round after
/// round, each message once.
#[test]
fn a_consumer_gets_what_was_sent_while_a_commit_waited_for_its_echo() {
    let store = TempStore::new("echo-deliver");
    let dest = "/queue/persist.echo-deliver";
    let gw = Gateway::spawn(&["--store-dir", store.arg()], None);
    let mut c = connected(&gw);
    assert!(c.subscribe_sync("s", dest, &[]).is_empty());
    let mut p = connected(&gw);
    let mut sent = 0;
    for round in 0..3 {
        let first = sent;
        send_window_of_64(&mut p, dest, round, &mut sent);
        p.publish(dest, format!("m{sent}").as_bytes());
        sent += 1;
        let got = c.read_messages(sent - first);
        assert_eq!(body_set(&got), (first..sent).map(|i| format!("m{i}")).collect::<BTreeSet<_>>(), "round {round}");
    }
    c.no_frame(Duration::from_millis(200));
}

#[test]
fn a_second_process_on_the_same_store_dir_fails_fast_with_one_line() {
    let store = TempStore::new("lock");
    let gw = Gateway::spawn(&["--store-dir", store.arg()], None);
    let (status, err) = start_fails(&["--cores", "1", "--store-dir", store.arg()]);
    assert!(!status.success());
    assert!(err.contains("is in use by another stompgate process"), "{err}");
    assert_eq!(err.lines().filter(|l| l.starts_with("stompgate: ")).count(), 1, "one line: {err}");
    // The first one is unharmed.
    let mut c = connected(&gw);
    assert!(c.send_sync("SEND", &[("destination", "/queue/persist.lock")], b"x").is_empty());
    drop(gw);
    // Its lock goes with it, also on SIGKILL: the next start works.
    let gw = Gateway::spawn(&["--store-dir", store.arg()], None);
    let mut c = connected(&gw);
    assert_eq!(body_set(&c.subscribe_expect("s", "/queue/persist.lock", &[], 1)), BTreeSet::from(["x".to_owned()]));
}

#[test]
fn a_read_only_store_dir_fails_at_start_with_a_clear_line() {
    use std::os::unix::fs::PermissionsExt;
    let store = TempStore::new("ro");
    std::fs::create_dir_all(&store.0).unwrap();
    std::fs::set_permissions(&store.0, std::fs::Permissions::from_mode(0o555)).unwrap();
    // root writes through permission bits: run the gateway as `nobody` then.
    // SAFETY: geteuid has no preconditions.
    let uid = (unsafe { libc::geteuid() } == 0).then_some(65534);
    let (status, err) = start_fails_as(&["--cores", "1", "--store-dir", store.arg()], uid);
    assert!(!status.success());
    assert!(err.contains(&format!("store directory {}", store.arg())), "{err}");
    assert!(err.contains("ermission denied"), "{err}");
    std::fs::set_permissions(&store.0, std::fs::Permissions::from_mode(0o755)).unwrap();
}

#[test]
fn a_restart_with_another_core_count_is_refused_with_one_line() {
    let store = TempStore::new("cores");
    let gw = Gateway::spawn(&["--store-dir", store.arg()], None);
    let mut c = connected(&gw);
    assert!(c.send_sync("SEND", &[("destination", "/queue/persist.cores")], b"kept").is_empty());
    gw.stop();
    let (status, err) = start_fails(&["--cores", "2", "--store-dir", store.arg()]);
    assert!(!status.success());
    assert!(err.contains("was written by 1 cores and this start has 2"), "{err}");
    // Nothing was lost by the refused start.
    let gw = Gateway::spawn(&["--store-dir", store.arg()], None);
    let mut c = connected(&gw);
    assert_eq!(body_set(&c.subscribe_expect("s", "/queue/persist.cores", &[], 1)), BTreeSet::from(["kept".to_owned()]));
}

#[test]
fn a_torn_last_record_after_kill_9_is_cut_and_everything_before_it_survives() {
    let store = TempStore::new("torn");
    let dest = "/queue/persist.torn";
    let gw = Gateway::spawn(&["--store-dir", store.arg()], None);
    let mut p = connected(&gw);
    send_receipted(&mut p, dest, (0..20).map(|i| format!("t{i}")));
    gw.stop();
    // What a kill in the middle of a write leaves: the first part of one more record, right
    // after the records (the end of the file, or where the zeros of a segment written over a
    // spare begin: either may be the last segment, depending on when the spare was ready).
    let seg = last_segment(&store.0, 0);
    let file = std::fs::read(&seg).unwrap();
    let end = records_end(&file);
    assert!(end > 0 && file[end..].iter().all(|&b| b == 0), "the segment is its records, then zeros if any");
    let bytes = file[..end].to_vec();
    let first_record_len = 12 + u32::from_le_bytes(bytes[8..12].try_into().unwrap()) as usize;
    let f = std::fs::OpenOptions::new().write(true).open(&seg).unwrap();
    std::os::unix::fs::FileExt::write_all_at(&f, &bytes[..first_record_len / 2], end as u64).unwrap();
    drop(f);

    let gw = Gateway::spawn(&["--store-dir", store.arg()], None);
    let mut c = connected(&gw);
    let got = c.subscribe_expect("s", dest, &[], 20);
    assert_eq!(body_set(&got), (0..20).map(|i| format!("t{i}")).collect::<BTreeSet<_>>());
    let mut p = connected(&gw);
    assert!(p.send_sync("SEND", &[("destination", "/queue/persist.torn.after")], b"after").is_empty(), "the log takes appends after the cut");
    let err = gw.stop();
    assert!(err.contains("torn or corrupt tail"), "one line about the cut: {err}");
    // The half record is gone: the good bytes are kept as they were, and the record appended
    // after the restart starts right where they end, or at the start of the next segment when
    // the log had moved to a spare by then (it leaves a plain segment for one once it is ready).
    let now = std::fs::read(&seg).unwrap();
    assert_eq!(&now[..bytes.len()], &bytes[..]);
    if now.len() > bytes.len() {
        assert_eq!(&now[bytes.len()..bytes.len() + 4], b"SGR1", "the next record starts right at the cut");
    }
    let next = last_segment(&store.0, 0);
    if next == seg {
        assert!(now.len() > bytes.len(), "the records after the restart were appended here");
    } else {
        assert_eq!(&std::fs::read(&next).unwrap()[..4], b"SGR1", "the records after the restart go on in the next segment");
    }
}

/// Where a segment's records end: the first position that does not start a record's frame
/// (magic `SGR1`, then CRC and length, each 4 bytes).
fn records_end(bytes: &[u8]) -> usize {
    let mut pos = 0;
    while bytes.len() >= pos + 12 && &bytes[pos..pos + 4] == b"SGR1" {
        pos += 12 + u32::from_le_bytes(bytes[pos + 8..pos + 12].try_into().unwrap()) as usize;
    }
    pos
}

/// A DISCONNECT's RECEIPT proves every earlier SEND took effect, receipted or not, on every
/// core the connection sent to, and only those are visited (`engine::reached`). The SENDs go
/// to a queue the other core owns, inside that core's sync interval (a first receipted SEND
/// has just committed there), so its next commit is up to a second away: the RECEIPT must
/// wait for it, and a kill -9 right after the RECEIPT loses nothing. A barrier that skipped
/// the owner would answer at once from this connection's own core.
#[test]
fn a_disconnect_receipt_proves_unreceipted_sends_on_another_core_durable() {
    let store = TempStore::new("barrier");
    let args = ["--store-dir", store.arg(), "--cores", "2", "--store-sync", "write", "--store-sync-interval-us", "1000000"];
    let gw = Gateway::spawn(&args, None);
    let mut p = Client::open(gw.stomp_addr);
    let welcome = p.connect("1.2");
    // The session id is `stompgate-<core>-<connection>`.
    let own: usize = welcome.header("session").and_then(|s| s.split('-').nth(1)).and_then(|c| c.parse().ok()).expect("session names the core");
    let other = (0..)
        .map(|i| format!("{}.{i}", common::unique("barrier")))
        .find(|c| {
            stompgate::mesh::topology::owner_of(stompgate::model::Pattern::Queues, &stompgate::model::Channel(bytes::Bytes::from(c.clone())), 2).index() != own
        })
        .unwrap();
    let dest = format!("/queue/{other}");
    send_receipted(&mut p, &dest, std::iter::once("first".to_string()));
    for i in 0..20 {
        p.publish(&dest, format!("u{i}").as_bytes());
    }
    let started = Instant::now();
    let frames = p.disconnect_sync();
    assert!(frames.is_empty(), "{frames:?}");
    let waited = started.elapsed();
    let _ = gw.stop();
    assert!(waited >= Duration::from_millis(200), "the RECEIPT came after {waited:?}, before the owner's next commit");
    let gw = Gateway::spawn(&args, None);
    let mut c = connected(&gw);
    let expected: BTreeSet<String> = std::iter::once("first".to_string()).chain((0..20).map(|i| format!("u{i}"))).collect();
    assert_eq!(body_set(&c.subscribe_expect("s", &dest, &[], 21)), expected);
}

#[test]
fn with_store_sync_write_receipted_messages_survive_kill_9() {
    // `write`: the RECEIPT waits for write(2) only; the page cache outlives the process.
    let store = TempStore::new("write");
    let dest = "/queue/persist.write";
    let args = ["--store-dir", store.arg(), "--store-sync", "write", "--store-sync-interval-us", "0"];
    let gw = Gateway::spawn(&args, None);
    let mut p = connected(&gw);
    send_receipted(&mut p, dest, (0..50).map(|i| format!("w{i}")));
    gw.stop();
    let gw = Gateway::spawn(&args, None);
    let mut c = connected(&gw);
    assert_eq!(body_set(&c.subscribe_expect("s", dest, &[], 50)), (0..50).map(|i| format!("w{i}")).collect::<BTreeSet<_>>());
}

#[test]
fn a_store_write_that_fails_answers_its_sends_with_errors_at_once_and_loses_nothing_receipted() {
    // A full disk, for the one file that grows: the child may not write any file past 64 KiB
    // (RLIMIT_FSIZE, EFBIG). 20 receipted 1 KiB messages fit; a 60 KiB one does not.
    const LIMIT: u64 = 64 << 10;
    let store = TempStore::new("full");
    let dest = "/queue/persist.full";
    let channel = "persist.full";
    let grpc = common::metrics::free_port();
    let grpc_arg = grpc.to_string();
    let args = ["--store-dir", store.arg(), "--grpc-addr", grpc_arg.as_str()];
    let small = |i: usize| format!("{i:04}{}", "s".repeat(1020));
    let gw = Gateway::spawn_limited(&args, Limits { file_bytes: Some(LIMIT), ..Limits::default() });
    let mut p = connected(&gw);
    send_receipted(&mut p, dest, (0..20).map(small));

    // STOMP: the SEND whose record cannot be written gets ERROR `internal error` with its
    // receipt-id, not a RECEIPT, and the connection closes.
    let big = "b".repeat(60 << 10);
    let started = Instant::now();
    p.send("SEND", &[("destination", dest), ("receipt", "too-big")], big.as_bytes());
    let f = p.frame();
    assert_eq!(f.command, "ERROR", "{}", String::from_utf8_lossy(&f.raw));
    assert_eq!(f.header("message"), Some("internal error"), "{f:?}");
    assert_eq!(f.header("receipt-id"), Some("too-big"), "{f:?}");
    assert!(p.closed(), "the connection stays open after the ERROR");

    // gRPC: SendQueueMessage gets its in-band error as soon as the write failed, not after
    // the 60 s confirmation wait.
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let result = rt.block_on(async {
        let mut client = grpc_client(grpc).await;
        let msg = pb::QueueMessage {
            message_id: "g-big".into(),
            client_id: "persist-test".into(),
            channel: channel.into(),
            body: big.clone().into_bytes(),
            ..Default::default()
        };
        tokio::time::timeout(Duration::from_secs(10), client.send_queue_message(msg))
            .await
            .expect("answered within 10 s")
            .expect("an in-band result")
            .into_inner()
    });
    assert!(result.is_error, "{result:?}");
    assert_eq!(result.error, stompgate::mesh::confirm::NOT_STORED, "{result:?}");
    assert!(started.elapsed() < Duration::from_secs(20), "errors took {:?}", started.elapsed());

    // The failed batch was cut off again: a small SEND after it is stored and receipted.
    let mut q = connected(&gw);
    send_receipted(&mut q, dest, std::iter::once(small(20)));
    drop(gw); // SIGKILL

    // Every receipted message is back, neither refused one is.
    let gw = Gateway::spawn(&args, None);
    let mut c = connected(&gw);
    let got = c.subscribe_expect("s", dest, &[], 21);
    assert_eq!(body_set(&got), (0..21).map(small).collect::<BTreeSet<_>>());
}

/// A gRPC client of a child gateway's API at `addr` (retrying while the child starts).
async fn grpc_client(addr: SocketAddr) -> KubemqClient<tonic::transport::Channel> {
    let endpoint = tonic::transport::Endpoint::from_shared(format!("http://{addr}")).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match endpoint.connect().await {
            Ok(c) => return KubemqClient::new(c),
            Err(_) if Instant::now() < deadline => tokio::time::sleep(Duration::from_millis(50)).await,
            Err(e) => panic!("gRPC connect to {addr}: {e}"),
        }
    }
}

/// The (sequence, timestamp, body) of Events-Store MESSAGEs.
fn stamped(frames: &[Frame]) -> Vec<(u64, i64, String)> {
    let header = |f: &Frame, name: &str| f.header(name).unwrap_or_else(|| panic!("no {name}: {f:?}")).to_owned();
    frames
        .iter()
        .map(|f| (header(f, "x-kubemq-sequence").parse().unwrap(), header(f, "x-kubemq-timestamp").parse().unwrap(), f.body_str().to_owned()))
        .collect()
}

#[test]
fn events_store_channels_survive_kill_9_with_their_sequences_and_timestamps_and_a_deletion_survives_too() {
    let store = TempStore::new("es");
    let grpc = common::metrics::free_port();
    let grpc_arg = grpc.to_string();
    // Two cores, so the channels live in two logs.
    let args = ["--store-dir", store.arg(), "--cores", "2", "--grpc-addr", grpc_arg.as_str()];
    let kept = "/topic-store/persist.es.kept";
    let deleted = "/topic-store/persist.es.deleted";
    let gw = Gateway::spawn(&args, None);
    let mut p = connected(&gw);
    send_receipted(&mut p, kept, (1..=5).map(|i| format!("k{i}")));
    send_receipted(&mut p, deleted, (1..=3).map(|i| format!("d{i}")));
    let mut c = connected(&gw);
    let before = stamped(&c.subscribe_expect("s", kept, &[("x-kubemq-start", "first")], 5));
    assert_eq!(before.iter().map(|(seq, _, _)| *seq).collect::<Vec<_>>(), [1, 2, 3, 4, 5]);
    drop(c);
    gw.stop(); // SIGKILL

    let gw = Gateway::spawn(&args, None);
    let mut c = connected(&gw);
    // Every receipted message is back with its sequence, timestamp and body.
    assert_eq!(stamped(&c.subscribe_expect("all", kept, &[("x-kubemq-start", "first")], 5)), before);
    assert_eq!(stamped(&c.subscribe_expect("from3", kept, &[("x-kubemq-start", "sequence:3")], 3)), before[2..]);
    let (_, ts4, _) = &before[3];
    let at4 = jiff::Timestamp::from_nanosecond(i128::from(*ts4)).unwrap(); // RFC 3339, to the ns
    let since4 = stamped(&c.subscribe_expect("time", kept, &[("x-kubemq-start", &format!("time:{at4}"))], 2));
    assert_eq!(since4, before[3..], "a time start finds the restored timestamps");
    // The sequence goes on after the restored ones, to every live subscriber.
    let mut p = connected(&gw);
    send_receipted(&mut p, kept, std::iter::once("k6".to_string()));
    for _ in 0..3 {
        let next = stamped(&c.read_messages(1));
        assert_eq!((next[0].0, next[0].2.as_str()), (6, "k6"));
    }
    // Delete the other channel through the gRPC API, then kill again: it stays deleted.
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let mut g = grpc_client(grpc).await;
        let request =
            common::grpc::management("delete-channel", &[("channel_type", "events_store"), ("channel", "persist.es.deleted"), ("client_id", "persist-test")]);
        let r = g.send_request(request).await.expect("delete-channel answered").into_inner();
        assert!(r.executed && r.error.is_empty(), "{r:?}");
    });
    // The delete's answer waits for its owner's confirmation, held like any other until the
    // deletion's record is synced: so it is on disk now.
    drop(c);
    gw.stop();

    let gw = Gateway::spawn(&args, None);
    let mut c = connected(&gw);
    assert!(c.subscribe_expect("d", deleted, &[("x-kubemq-start", "first")], 0).is_empty(), "the deleted channel stayed deleted");
    let mut p = connected(&gw);
    send_receipted(&mut p, deleted, std::iter::once("again".to_string()));
    let again = stamped(&c.read_messages(1));
    assert_eq!((again[0].0, again[0].2.as_str()), (1, "again"), "a deleted channel starts at sequence 1 again");
    assert_eq!(stamped(&c.subscribe_expect("k", kept, &[("x-kubemq-start", "first")], 6)).len(), 6);
}

/// The segment files of core `core`'s log, oldest first.
fn segments(store: &Path, core: usize) -> Vec<PathBuf> {
    let mut segs: Vec<PathBuf> = std::fs::read_dir(store.join(format!("core-{core}")))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "seg"))
        .collect();
    segs.sort();
    segs
}

/// Waits (generously: deletion runs after a commit, on the blocking thread) until core 0's
/// log has at most `max` segment files; their count then.
fn eventually_at_most(store: &Path, max: usize) -> usize {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let n = segments(store, 0).len();
        if n <= max || Instant::now() > deadline {
            return n;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Receives `n` MESSAGEs on `c` (client-individual) and ACKs each, the last ACK with a
/// receipt: once this returns, every ACK is on disk. Returns the bodies.
fn receive_and_ack(c: &mut Client, n: usize) -> Vec<String> {
    let mut bodies = Vec::new();
    while bodies.len() < n {
        let batch = c.read_messages(1);
        let f = &batch[0];
        bodies.push(f.body_str().to_owned());
        let ack = f.header("ack").unwrap().to_owned();
        if bodies.len() == n {
            assert!(c.send_sync("ACK", &[("id", &ack)], b"").is_empty(), "nothing more was sent");
        } else {
            c.send("ACK", &[("id", &ack)], b"");
        }
    }
    bodies
}

#[test]
fn segments_holding_nothing_live_are_deleted_and_nothing_settled_comes_back_after_kill_9() {
    // 16 KiB segments: 200 messages of 1 KiB fill about 15 of them.
    let store = TempStore::new("gc");
    let args = ["--store-dir", store.arg(), "--store-segment-bytes", "16384"];
    let (dest, pin) = ("/queue/persist.gc", "/queue/persist.gc.pin");
    let body = |p: &str, i: usize| format!("{p}{i:04}{}", "x".repeat(1000));
    let gw = Gateway::spawn(&args, None);
    let mut p = connected(&gw);
    // One message nobody consumes yet, in the first segment: it keeps every segment from the
    // first on (only a prefix of dead segments is deleted).
    send_receipted(&mut p, pin, std::iter::once("pin".to_string()));
    send_receipted(&mut p, dest, (0..200).map(|i| body("a", i)));
    let written = segments(&store.0, 0).len();
    assert!(written >= 10, "200 KiB in 16 KiB segments: {written}");
    let mut c = connected(&gw);
    c.send("SUBSCRIBE", &[("id", "s"), ("destination", dest), ("ack", "client-individual")], b"");
    let acked = receive_and_ack(&mut c, 200);
    assert_eq!(acked, (0..200).map(|i| body("a", i)).collect::<Vec<_>>());
    // Every `a` is settled, but the pin is live in segment 1: only compaction (copying the
    // pin forward, see `compaction_keeps_...` below) may free the segments now.
    // Settle the pin: now every closed segment holds nothing live. A later commit deletes
    // them (this receipted SEND is one, so is the pin's ACK).
    let mut pc = connected(&gw);
    pc.send("SUBSCRIBE", &[("id", "p"), ("destination", pin), ("ack", "client-individual")], b"");
    let pinned = receive_and_ack_any(&mut pc);
    assert_eq!(pinned, "pin");
    send_receipted(&mut p, dest, (0..20).map(|i| body("b", i)));
    // The 20 live `b`s (20 KiB) need two segments of their own; at most one more may be kept
    // (the active one, or the one their first batch was journaled under).
    let left = eventually_at_most(&store.0, 3);
    assert!(left <= 3, "dead segments are deleted: {left} left of {written}");
    assert!(!segments(&store.0, 0).iter().any(|s| s.ends_with("00000000000000000001.seg")), "the first segment is gone");
    drop((c, pc));
    gw.stop(); // SIGKILL

    // Nothing settled comes back (their records and some of their ACKs' are deleted), and
    // nothing live is lost.
    let gw = Gateway::spawn(&args, None);
    let mut c = connected(&gw);
    let again = c.subscribe_expect("s", dest, &[], 20);
    assert_eq!(bodies(&again), (0..20).map(|i| body("b", i)).collect::<Vec<_>>());
    c.no_frame(Duration::from_millis(500));
    assert!(c.subscribe_expect("p", pin, &[], 0).is_empty(), "the settled pin stays settled");
    let err = gw.stop();
    assert!(err.contains("store recovered"), "{err}");
}

#[test]
fn compaction_keeps_the_segment_count_bounded_behind_old_live_messages_and_each_comes_back_once_after_kill_9() {
    // 16 KiB segments; 1500 acknowledged messages of 1 KiB would fill about 100 of them, all
    // kept without compaction by the three live messages in the first one.
    let store = TempStore::new("compact");
    // No content cache: the unconsumed pins keep their contents on disk only, so compaction
    // reads them back to copy them, and a read after it must find the copy.
    let args = ["--store-dir", store.arg(), "--store-segment-bytes", "16384", "--store-retention-min", "0", "--store-cache-mb", "0"];
    let (dest, pin, pin2, held, events) = (
        "/queue/persist.compact",
        "/queue/persist.compact.pin",
        "/queue/persist.compact.pin2",
        "/queue/persist.compact.held",
        "/topic-store/persist.compact.store",
    );
    let body = |i: usize| format!("a{i:05}{}", "x".repeat(1000));
    let gw = Gateway::spawn(&args, None);
    let mut p = connected(&gw);
    // Old live messages: one nobody consumes, one delivered and never acknowledged, one in
    // an Events-Store channel.
    send_receipted(&mut p, pin, std::iter::once("pin".to_string()));
    send_receipted(&mut p, pin2, std::iter::once("pin2".to_string()));
    send_receipted(&mut p, held, std::iter::once("held".to_string()));
    send_receipted(&mut p, events, std::iter::once("stored".to_string()));
    let mut h = connected(&gw);
    let delivered = h.subscribe_expect("h", held, &[("ack", "client-individual")], 1);
    assert_eq!(delivered[0].body_str(), "held");
    let mut c = connected(&gw);
    c.send("SUBSCRIBE", &[("id", "s"), ("destination", dest), ("ack", "client-individual")], b"");
    // The acknowledged stream, in rounds; the segment count is sampled after each.
    let (rounds, per_round) = (15, 100);
    let mut most = 0;
    for round in 0..rounds {
        send_receipted(&mut p, dest, (round * per_round..(round + 1) * per_round).map(body));
        let acked = receive_and_ack(&mut c, per_round);
        assert_eq!(acked, (round * per_round..(round + 1) * per_round).map(body).collect::<Vec<_>>());
        most = most.max(segments(&store.0, 0).len());
    }
    // Live: four small records. Compaction starts past 4 segments more than that; the
    // active segment, and copies not yet freed, come on top.
    let left = eventually_at_most(&store.0, 6);
    assert!(left <= 6, "compaction frees the segments behind the old live messages: {left} left");
    assert!(most <= 12, "the count stays bounded throughout: at most {most} segments (without compaction: about 100)");
    assert!(!segments(&store.0, 0).iter().any(|s| s.ends_with("00000000000000000001.seg")), "the first segment is gone");
    // Its original's segment gone, a pin kept on disk is read back from its copy.
    let mut c2 = connected(&gw);
    let second = c2.subscribe_expect("p2", pin2, &[("ack", "client-individual")], 1);
    assert_eq!(second[0].body_str(), "pin2");
    drop((c, h, c2));
    gw.stop(); // SIGKILL

    // Each live message exactly once, the delivered one redelivered, the Events-Store one
    // with its sequence; nothing of the stream.
    let gw = Gateway::spawn(&args, None);
    let mut c = connected(&gw);
    let pins = c.subscribe_expect("p", pin, &[], 1);
    assert_eq!((pins[0].body_str(), pins[0].header("redelivered")), ("pin", None), "{pins:?}");
    let seconds = c.subscribe_expect("p2", pin2, &[], 1);
    assert_eq!((seconds[0].body_str(), seconds[0].header("redelivered")), ("pin2", Some("true")), "{seconds:?}");
    let helds = c.subscribe_expect("h", held, &[], 1);
    assert_eq!((helds[0].body_str(), helds[0].header("redelivered")), ("held", Some("true")), "{helds:?}");
    assert!(c.subscribe_expect("s", dest, &[], 0).is_empty(), "the acknowledged stream stays acknowledged");
    let stored = stamped(&c.subscribe_expect("e", events, &[("x-kubemq-start", "first")], 1));
    assert_eq!((stored[0].0, stored[0].2.as_str()), (1, "stored"));
    c.no_frame(Duration::from_millis(500));
    let err = gw.stop();
    assert!(err.contains("store recovered"), "{err}");
}

/// VmRSS of a process, in KiB.
fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("/proc/PID/status");
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).expect("VmRSS line");
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// Issue 15 item 5: with `--store-cache-mb 1`, a backlog 512 times that (16,000 messages of
/// 32 KiB) keeps its contents on disk, so once it is written the gateway's memory is back to
/// within 64 MiB of where it started (a backlog held in memory would add 512 MiB). The flood
/// itself passes through memory on its way to disk, and an idle core gives back what it freed
/// on its tick, once the allocator's 1 s purge delay has passed (`engine::give_back_freed_memory`;
/// without it 67–290 MiB stayed). A consumer then drains it completely and in order through the
/// read-ahead, half of it live and the rest after a `kill -9` (recovery brings the backlog back
/// as index entries, and the contents are read back again).
#[test]
fn a_backlog_much_larger_than_the_cache_drains_completely_and_in_order_live_and_after_kill_9() {
    let store = TempStore::new("cache");
    let args = ["--store-dir", store.arg(), "--store-cache-mb", "1"];
    let dest = "/queue/persist.cache";
    let n = 16000;
    let body = |i: usize| format!("{i:05}{}", "c".repeat(32 * 1024 - 5));
    let gw = Gateway::spawn(&args, None);
    let before = rss_kib(gw.pid());
    let mut p = connected(&gw);
    for i in 0..n - 1 {
        p.send("SEND", &[("destination", dest)], body(i).as_bytes());
    }
    // SENDs of one connection are logged in order: this RECEIPT means all are on disk.
    assert!(p.send_sync("SEND", &[("destination", dest)], body(n - 1).as_bytes()).is_empty());
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut grown = u64::MAX;
    while Instant::now() < deadline {
        grown = rss_kib(gw.pid()).saturating_sub(before);
        if grown < 64 * 1024 {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(grown < 64 * 1024, "a 512 MiB backlog with a 1 MiB cache still held {grown} KiB more than before, 10 s after it was written");
    // Live: the first half, acknowledged one by one (the last ACK with a receipt).
    let mut c = connected(&gw);
    c.send("SUBSCRIBE", &[("id", "s"), ("destination", dest), ("ack", "client-individual")], b"");
    let mut live = Vec::new();
    while live.len() < n / 2 {
        let f = c.read_messages(1).pop().unwrap();
        let ack = f.header("ack").unwrap().to_owned();
        live.push(f.body_str().to_owned());
        if live.len() < n / 2 {
            c.send("ACK", &[("id", &ack)], b"");
        } else {
            // The receipt: every ACK is on disk. MESSAGEs past the half arrive meanwhile
            // (prefetch): they stay unacknowledged and come back after the kill.
            let more = c.send_sync("ACK", &[("id", &ack)], b"");
            assert!(more.iter().all(|f| f.command == "MESSAGE"), "{more:?}");
        }
    }
    assert!(live == (0..n / 2).map(body).collect::<Vec<_>>(), "the first half, complete and in order");
    gw.stop(); // SIGKILL

    let gw = Gateway::spawn(&args, None);
    // The 128 MiB left are not loaded (recovery holds one 64 MiB segment at a time while it
    // scans, and the allocator may keep the last one freed until a core's tick gives it back:
    // measured at once, a loaded CI machine once saw 120,984 KiB). Contents loaded would stay.
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut before = rss_kib(gw.pid());
    while before >= 112 * 1024 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
        before = rss_kib(gw.pid());
    }
    assert!(before < 112 * 1024, "recovery loads no contents: {before} KiB, 10 s after the restart");
    let mut c = connected(&gw);
    let again = c.subscribe_expect("s", dest, &[], n / 2);
    assert!(bodies(&again) == (n / 2..n).map(body).collect::<Vec<_>>(), "the second half, complete and in order, after kill -9");
    c.no_frame(Duration::from_millis(300));
    let err = gw.stop();
    assert!(err.contains("store recovered"), "{err}");
}

/// Receives one MESSAGE on `c` and ACKs it with a receipt; its body.
fn receive_and_ack_any(c: &mut Client) -> String {
    receive_and_ack(c, 1).pop().unwrap()
}

/// Sends receipted 1 KiB queue messages `{prefix}{i}` until the gateway refuses one: the
/// bodies receipted before, and the refusal (an ERROR, after which the connection closes).
fn fill_until_refused(gw: &Gateway, dest: &str, prefix: &str, max: usize) -> (Vec<String>, Frame) {
    let mut p = connected(gw);
    let mut receipted = Vec::new();
    for i in 0..max {
        let body = format!("{prefix}{i:05}{}", "f".repeat(1000));
        p.send("SEND", &[("destination", dest), ("receipt", "r")], body.as_bytes());
        let f = p.frame();
        match f.command.as_str() {
            "RECEIPT" => receipted.push(body),
            "ERROR" => {
                assert_eq!(f.header("receipt-id"), Some("r"), "the ERROR answers the refused SEND: {f:?}");
                assert!(p.closed(), "an ERROR closes the connection");
                return (receipted, f);
            }
            other => panic!("{other}: {f:?}"),
        }
    }
    panic!("{max} SENDs and none refused");
}

#[test]
fn at_store_max_bytes_sends_are_refused_with_an_error_nothing_receipted_is_lost_and_acks_make_room() {
    let store = TempStore::new("cap");
    let grpc = common::metrics::free_port();
    let grpc_arg = grpc.to_string();
    let args = ["--store-dir", store.arg(), "--store-max-bytes", "65536", "--store-segment-bytes", "16384", "--grpc-addr", grpc_arg.as_str()];
    let dest = "/queue/persist.cap";
    let gw = Gateway::spawn(&args, None);
    let (receipted, err) = fill_until_refused(&gw, dest, "c", 1000);
    assert_eq!(err.header("message"), Some("too many pending requests"), "{err:?}");
    assert!(err.body_str().contains("--store-max-bytes (65536 bytes)"), "the hint names the limit: {:?}", err.body_str());
    assert!(receipted.len() >= 40 && receipted.len() <= 64, "about 64 KiB of 1 KiB messages: {}", receipted.len());
    // An Events-Store SEND is refused the same way, and so is a gRPC queue send (in band).
    // Each is larger than the queue SENDs, so that whatever room the last refusal left (less
    // than one of those) cannot hold it.
    let big = "h".repeat(2048);
    let mut s = connected(&gw);
    s.send("SEND", &[("destination", "/topic-store/persist.cap.es"), ("receipt", "es")], big.as_bytes());
    let f = s.frame();
    assert_eq!((f.command.as_str(), f.header("message"), f.header("receipt-id")), ("ERROR", Some("too many pending requests"), Some("es")), "{f:?}");
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let result = rt.block_on(async {
        let mut client = grpc_client(grpc).await;
        let msg = pb::QueueMessage {
            message_id: "g".into(),
            client_id: "persist-test".into(),
            channel: "persist.cap".into(),
            body: big.clone().into_bytes(),
            ..Default::default()
        };
        client.send_queue_message(msg).await.expect("an in-band result").into_inner()
    });
    assert!(result.is_error, "{result:?}");
    assert_eq!(result.error, stompgate::mesh::confirm::STORE_FULL, "{result:?}");
    let stored = rt.block_on(async {
        let mut client = grpc_client(grpc).await;
        let ev = pb::Event {
            event_id: "e".into(),
            client_id: "persist-test".into(),
            channel: "persist.cap.es".into(),
            body: big.clone().into_bytes(),
            store: true,
            ..Default::default()
        };
        client.send_event(ev).await.expect("an in-band result").into_inner()
    });
    assert!(!stored.sent && stored.error.contains("the store is full"), "{stored:?}");
    gw.stop(); // SIGKILL

    // Every receipted message survives, none refused is there; acknowledging them frees
    // whole segments, and SENDs are taken again.
    let gw = Gateway::spawn(&args, None);
    let mut c = connected(&gw);
    c.send("SUBSCRIBE", &[("id", "s"), ("destination", dest), ("ack", "client-individual")], b"");
    let back = receive_and_ack(&mut c, receipted.len());
    assert_eq!(back, receipted, "every receipted message, in order");
    c.no_frame(Duration::from_millis(300));
    let deadline = Instant::now() + Duration::from_secs(30);
    let after = loop {
        let mut p = connected(&gw);
        p.send("SEND", &[("destination", dest), ("receipt", "again")], b"after");
        let f = p.frame();
        if f.command == "RECEIPT" {
            break f;
        }
        assert_eq!(f.header("message"), Some("too many pending requests"), "{f:?}");
        assert!(Instant::now() < deadline, "no room 30 s after every message was acknowledged");
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(after.header("receipt-id"), Some("again"));
    assert_eq!(bodies(&c.read_messages(1)), ["after"]);
}

/// A tmpfs of `size` mounted on a fresh directory, unmounted when dropped; `None` where this
/// process may not mount (not root, no CAP_SYS_ADMIN, a container that forbids it).
struct SmallFs(PathBuf);

impl SmallFs {
    fn mount(name: &str, size: &str) -> Option<SmallFs> {
        let dir = std::env::temp_dir().join(format!("sg-smallfs-{}-{name}-{}", std::process::id(), common::unique("m")));
        std::fs::create_dir_all(&dir).ok()?;
        let status = Command::new("mount").args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"]).arg(&dir).stderr(Stdio::null()).status();
        if status.is_ok_and(|s| s.success()) {
            Some(SmallFs(dir))
        } else {
            let _ = std::fs::remove_dir(&dir);
            None
        }
    }
}

impl Drop for SmallFs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
        let _ = std::fs::remove_dir(&self.0);
    }
}

#[test]
fn no_spare_segment_takes_room_the_records_need() {
    // Spares (segments of zeros written ahead) are made only with twice their size free: on a
    // 1 MiB filesystem a 640 KiB spare would fit, but would leave the records too little room.
    let Some(fs) = SmallFs::mount("nospare", "1m") else {
        eprintln!("SKIPPED: cannot mount a tmpfs here (needs root / CAP_SYS_ADMIN)");
        return;
    };
    let store = fs.0.join("store");
    let args = ["--store-dir", store.to_str().unwrap(), "--store-segment-bytes", "655360"];
    let gw = Gateway::spawn(&args, None);
    let mut p = connected(&gw);
    send_receipted(&mut p, "/queue/persist.nospare", (0..20).map(|i| format!("n{i}")));
    std::thread::sleep(Duration::from_secs(1));
    // A spare would show as a 640 KiB file: waiting as `spare.zeros`, or as a segment it became.
    let files: Vec<(PathBuf, u64)> = std::fs::read_dir(&store)
        .unwrap()
        .map(|core| core.unwrap().path())
        .filter(|core| core.is_dir())
        .flat_map(|core| std::fs::read_dir(core).unwrap().map(|e| e.unwrap().path()))
        .map(|f| {
            let len = std::fs::metadata(&f).unwrap().len();
            (f, len)
        })
        .collect();
    assert!(files.iter().any(|(f, _)| f.extension().is_some_and(|e| e == "seg")), "{files:?}");
    assert!(files.iter().all(|&(_, len)| len < 64 << 10), "no spare on a filesystem with less than two segments free: {files:?}");
    drop(gw);
}

#[test]
fn on_a_full_filesystem_sends_are_refused_with_an_error_and_nothing_receipted_is_lost() {
    let Some(fs) = SmallFs::mount("enospc", "1m") else {
        eprintln!("SKIPPED: cannot mount a tmpfs here (needs root / CAP_SYS_ADMIN); the --store-max-bytes test covers the refusal");
        return;
    };
    let store = fs.0.join("store");
    let store_arg = store.to_str().unwrap();
    let args = ["--store-dir", store_arg];
    let dest = "/queue/persist.enospc";
    let gw = Gateway::spawn(&args, None);
    // A 1 MiB filesystem, no cap: the disk itself refuses (ENOSPC).
    let (receipted, err) = fill_until_refused(&gw, dest, "e", 5000);
    assert_eq!(err.header("message"), Some("too many pending requests"), "{err:?}");
    assert!(err.body_str().contains("no space left on its disk"), "{:?}", err.body_str());
    assert!(receipted.len() > 500, "most of 1 MiB was used: {}", receipted.len());
    // Until space is back, new SENDs are refused at once, the same way.
    let (none, err) = fill_until_refused(&gw, dest, "x", 10);
    assert!(none.is_empty() || none.len() < 10, "{}", none.len());
    assert_eq!(err.header("message"), Some("too many pending requests"), "{err:?}");
    let stderr = gw.stop(); // SIGKILL
    assert!(stderr.contains("store write failed"), "{stderr}");

    // Recovery on the full filesystem: every receipted message is back.
    let gw = Gateway::spawn(&args, None);
    // (Queue order: the receipted ones come first, then whatever of the refused ones a
    // partial write may have left.)
    let mut c = connected(&gw);
    c.send("SUBSCRIBE", &[("id", "s"), ("destination", dest)], b"");
    assert_eq!(bodies(&c.read_messages(receipted.len())), receipted, "every receipted message, in order");
    drop(c);
    drop(gw);
}

/// Retention (`--store-retention-min`): Events-Store messages within it come back after a
/// kill, with their sequences. (Expiry itself is tested at unit level with injected time in
/// `src/array/store.rs`: a minute is the smallest retention.)
#[test]
fn events_store_messages_within_retention_survive_kill_9() {
    let store = TempStore::new("retention");
    let args = ["--store-dir", store.arg(), "--store-retention-min", "1"];
    let dest = "/topic-store/persist.retention";
    let gw = Gateway::spawn(&args, None);
    let mut p = connected(&gw);
    send_receipted(&mut p, dest, (1..=3).map(|i| format!("r{i}")));
    drop(p);
    gw.stop(); // SIGKILL

    let gw = Gateway::spawn(&args, None);
    let mut c = connected(&gw);
    let back = stamped(&c.subscribe_expect("all", dest, &[("x-kubemq-start", "first")], 3));
    assert_eq!(back.iter().map(|(seq, _, body)| (*seq, body.as_str())).collect::<Vec<_>>(), [(1, "r1"), (2, "r2"), (3, "r3")]);
}

/// Every MESSAGE a new subscription to `dest` from `x-kubemq-start:first` replays, as
/// (sequence, timestamp, body): those that come within a second of each other.
fn replay_all(c: &mut Client, id: &str, dest: &str) -> Vec<(u64, i64, String)> {
    let mut got = c.send_sync("SUBSCRIBE", &[("id", id), ("destination", dest), ("x-kubemq-start", "first")], b"");
    while let Some(f) = c.frame_within(Duration::from_secs(1)) {
        got.push(f);
    }
    stamped(&got)
}

/// Size retention (`--store-retention-mb`) with a store: messages that leave for the bound
/// stop keeping their segments, so the log stays near the bound while eight times as much is
/// sent, and a restart after `kill -9` brings back the same history (the rule applied again
/// to what the log holds).
#[test]
fn events_store_size_retention_frees_segments_and_the_same_history_comes_back_after_kill_9() {
    let store = TempStore::new("size");
    let args = ["--store-dir", store.arg(), "--store-segment-bytes", "65536", "--store-retention-mb", "1", "--store-sync", "write"];
    let dest = "/topic-store/persist.size";
    let sent = 8000; // 8 MiB of records in 64 KiB segments: about 130 of them
    let body = |i: usize| format!("s{i:05}{}", "x".repeat(1000));
    let gw = Gateway::spawn(&args, None);
    let mut p = connected(&gw);
    send_receipted(&mut p, dest, (0..sent).map(body));
    let mut c = connected(&gw);
    let before = replay_all(&mut c, "a", dest);
    // 1 MiB of messages counted at about 1.4 KiB each (body, id, tags, per-message overhead).
    assert!((500..1000).contains(&before.len()), "{} held", before.len());
    assert_eq!(before.last().map(|m| m.0), Some(sent as u64));
    assert!(before.windows(2).all(|w| w[1].0 == w[0].0 + 1), "the newest, contiguous");
    assert_eq!(before.last().unwrap().2, body(sent - 1));
    // Live: 1 MiB of records, 16 segments; compaction starts past 4 more, and the active
    // segment and copies not yet freed come on top.
    let left = eventually_at_most(&store.0, 24);
    assert!(left <= 24, "segments of trimmed messages are deleted: {left} left");
    drop((p, c));
    gw.stop(); // SIGKILL

    let gw = Gateway::spawn(&args, None);
    let mut c = connected(&gw);
    let after = replay_all(&mut c, "b", dest);
    assert_eq!(after, before, "the same history, sequences, timestamps and bodies");
    let mut p = connected(&gw);
    send_receipted(&mut p, dest, std::iter::once("next".to_string()));
    let next = stamped(&c.read_messages(1));
    assert_eq!((next[0].0, next[0].2.as_str()), (sent as u64 + 1, "next"), "sequences go on");
}

/// The binary started in `cwd` with `args` (no `--store-dir` unless given), listening on a
/// free STOMP port: the default store directory is relative to it.
fn spawn_in(cwd: &Path, args: &[&str]) -> std::process::Child {
    let addr = common::metrics::free_port();
    let mut child = Command::new(env!("CARGO_BIN_EXE_stompgate"))
        .current_dir(cwd)
        .args(["--cores", "1", "--grpc-addr", "off", "--ws-addr", "off", "--amqp-addr", "off", "--stomp-addr", &addr.to_string()])
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("stompgate starts");
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::net::TcpStream::connect(addr).is_err() {
        assert!(child.try_wait().unwrap().is_none(), "stompgate {args:?} exited at start");
        assert!(Instant::now() < deadline, "stompgate {args:?} did not listen");
        std::thread::sleep(Duration::from_millis(50));
    }
    child
}

/// By default the embedded array persists to ./store (created, locked); a gateway in front of
/// a remote array has no store, so it neither creates nor locks ./store.
#[test]
fn the_default_store_is_dot_store_and_a_remote_array_gateway_keeps_none() {
    let cwd = TempStore::new("cwd");
    std::fs::create_dir_all(&cwd.0).unwrap();
    let unreachable = format!("grpc://{}", common::metrics::free_port());
    let mut front = spawn_in(&cwd.0, &["--array", &unreachable]);
    std::thread::sleep(Duration::from_millis(300));
    assert!(!cwd.0.join("store").exists(), "a remote-array gateway created ./store");
    let _ = front.kill();
    let _ = front.wait();

    let mut embedded = spawn_in(&cwd.0, &[]);
    assert!(cwd.0.join("store/LOCK").is_file(), "the embedded array's default store is ./store");
    // Held: a second embedded gateway in the same directory fails at start.
    let (status, err) = {
        let mut second = Command::new(env!("CARGO_BIN_EXE_stompgate"))
            .current_dir(&cwd.0)
            .args(["--cores", "1", "--grpc-addr", "off", "--ws-addr", "off", "--amqp-addr", "off"])
            .args(["--stomp-addr", &common::metrics::free_port().to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let status = second.wait().unwrap();
        let mut err = String::new();
        std::io::Read::read_to_string(&mut second.stderr.take().unwrap(), &mut err).unwrap();
        (status, err)
    };
    let _ = embedded.kill();
    let _ = embedded.wait();
    assert!(!status.success(), "{err}");
    assert!(err.contains("the store directory ./store is in use by another stompgate process"), "{err}");
}
