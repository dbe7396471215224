//! Request/wait steps (`Flow`), core placement and array-side helpers for the message-flow tests.
use super::{unique, Client, Frame, TestServer, WAIT};
use bytes::Bytes;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use stompgate::mesh::msg::{CoreId, CoreMsg, Mailbox, RpcRequest};
use stompgate::model::{now_unix_ns, Channel, Message, Pattern, Tags};

/// How long a test waits to be sure nothing (more) arrives.
pub const QUIET: Duration = Duration::from_millis(300);

fn next_receipt() -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    format!("flow-{}", N.fetch_add(1, Ordering::Relaxed))
}

fn show(f: &Frame) -> String {
    String::from_utf8_lossy(&f.raw).into_owned()
}

/// Request/wait steps on top of the raw `Client`.
pub trait Flow {
    /// Sends `command` with `headers` plus a fresh `receipt`, waits for that RECEIPT and
    /// returns the frames that came before it (all must be MESSAGEs; an ERROR fails).
    fn send_sync(&mut self, command: &str, headers: &[(&str, &str)], body: &[u8]) -> Vec<Frame>;
    /// SUBSCRIBE with a receipt. Returns the MESSAGEs written before the RECEIPT: what the
    /// owner handed over while registering (queue backlog, Events-Store replay).
    fn subscribe_sync(&mut self, id: &str, destination: &str, extra: &[(&str, &str)]) -> Vec<Frame>;
    /// SUBSCRIBE, then exactly `n` MESSAGEs (before or after the RECEIPT), then quiet.
    fn subscribe_expect(&mut self, id: &str, destination: &str, extra: &[(&str, &str)], n: usize) -> Vec<Frame>;
    /// SEND without a receipt.
    fn publish(&mut self, destination: &str, body: &[u8]);
    /// The next `n` frames, each asserted to be a MESSAGE.
    fn read_messages(&mut self, n: usize) -> Vec<Frame>;
    /// Every frame until nothing arrives for `quiet`.
    fn read_until_quiet(&mut self, quiet: Duration) -> Vec<Frame>;
    /// DISCONNECT with a receipt; waits for the RECEIPT (frames before it are returned).
    fn disconnect_sync(&mut self) -> Vec<Frame>;
    /// Next frame is ERROR with `message:<message>`, then the server closes.
    fn expect_error_then_close(&mut self, message: &str) -> Frame;
}

impl Flow for Client {
    fn send_sync(&mut self, command: &str, headers: &[(&str, &str)], body: &[u8]) -> Vec<Frame> {
        let receipt = next_receipt();
        let mut h: Vec<(&str, &str)> = headers.to_vec();
        h.push(("receipt", &receipt));
        self.send(command, &h, body);
        let mut before = Vec::new();
        loop {
            let f = self.frame();
            match f.command.as_str() {
                "RECEIPT" if f.header("receipt-id") == Some(receipt.as_str()) => return before,
                "MESSAGE" => before.push(f),
                _ => panic!("waiting for RECEIPT {receipt} of {command}, got {}", show(&f)),
            }
        }
    }

    fn subscribe_sync(&mut self, id: &str, destination: &str, extra: &[(&str, &str)]) -> Vec<Frame> {
        let mut h = vec![("id", id), ("destination", destination)];
        h.extend_from_slice(extra);
        self.send_sync("SUBSCRIBE", &h, b"")
    }

    fn subscribe_expect(&mut self, id: &str, destination: &str, extra: &[(&str, &str)], n: usize) -> Vec<Frame> {
        let mut got = self.subscribe_sync(id, destination, extra);
        assert!(got.len() <= n, "more than {n} messages: {:?}", got.iter().map(show).collect::<Vec<_>>());
        let rest = n - got.len();
        got.extend(self.read_messages(rest));
        self.no_frame(QUIET);
        got
    }

    fn publish(&mut self, destination: &str, body: &[u8]) {
        self.send("SEND", &[("destination", destination)], body);
    }

    fn read_messages(&mut self, n: usize) -> Vec<Frame> {
        (0..n)
            .map(|i| {
                let f = match self.frame_within(WAIT) {
                    Some(f) => f,
                    None => panic!("only {i} of {n} messages arrived"),
                };
                assert_eq!(f.command, "MESSAGE", "message {i} of {n}: {}", show(&f));
                f
            })
            .collect()
    }

    fn read_until_quiet(&mut self, quiet: Duration) -> Vec<Frame> {
        let mut out = Vec::new();
        while let Some(f) = self.frame_within(quiet) {
            out.push(f);
        }
        out
    }

    fn disconnect_sync(&mut self) -> Vec<Frame> {
        self.send_sync("DISCONNECT", &[], b"")
    }

    fn expect_error_then_close(&mut self, message: &str) -> Frame {
        let f = self.frame();
        assert_eq!(f.command, "ERROR", "expected ERROR, got {}", show(&f));
        assert_eq!(f.header("message"), Some(message), "{}", show(&f));
        assert!(self.closed(), "still open after {}", show(&f));
        f
    }
}

/// Publishes `n` events of `size` bytes (the index as six digits first) to `dest` from a
/// STOMP client on its own thread, with a RECEIPT every 100 (each waited for up to 30 s: a
/// receipt may wait out the 2 s parking grace more than once); `sent` counts the SENDs made.
pub fn receipted_publisher(addr: std::net::SocketAddr, dest: String, n: usize, size: usize, sent: std::sync::Arc<AtomicU64>) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let mut p = Client::open(addr);
        assert_eq!(p.connect("1.2").command, "CONNECTED");
        for i in 0..n {
            let mut body = format!("{i:06}").into_bytes();
            body.resize(size, b'x');
            if i % 100 == 99 {
                p.send("SEND", &[("destination", &dest), ("receipt", &format!("r{i}"))], &body);
                let f = p.frame_within(Duration::from_secs(30)).expect("RECEIPT");
                assert_eq!(f.command, "RECEIPT", "{f:?}");
            } else {
                p.publish(&dest, &body);
            }
            sent.store(i as u64 + 1, Ordering::SeqCst);
        }
    })
}

/// Bodies as strings, in frame order.
pub fn bodies(frames: &[Frame]) -> Vec<String> {
    frames.iter().map(|f| String::from_utf8_lossy(&f.body).into_owned()).collect()
}

/// `"<prefix><i>"` for i in `range`.
pub fn numbered(prefix: &str, range: std::ops::Range<usize>) -> Vec<String> {
    range.map(|i| format!("{prefix}{i}")).collect()
}

/// The core a connection runs on, from CONNECTED's `session:stompgate-<core>-<conn>`.
pub fn core_of(connected: &Frame) -> usize {
    let s = connected.header("session").expect("CONNECTED has session");
    let rest = s.strip_prefix("stompgate-").unwrap_or_else(|| panic!("session {s:?}"));
    rest.split('-').next().unwrap().parse().unwrap_or_else(|_| panic!("session {s:?}"))
}

/// A 1.2 client and the core SO_REUSEPORT gave it.
pub fn connected_with_core(server: &TestServer) -> (Client, usize) {
    let mut c = server.client();
    let f = c.connect("1.2");
    assert_eq!(f.command, "CONNECTED", "{}", show(&f));
    let core = core_of(&f);
    (c, core)
}

/// A 1.2 client on `core` (opens connections until the kernel places one there; gives
/// up after 64).
pub fn connected_on(server: &TestServer, core: usize) -> Client {
    for _ in 0..64 {
        let (c, got) = connected_with_core(server);
        if got == core {
            return c;
        }
    }
    panic!("64 connections and none landed on core {core}");
}

/// `n` 1.2 clients, `n / 2` on core 0 and the rest on core 1 (alternating 0, 1, 0, …).
pub fn connected_spread(server: &TestServer, n: usize) -> Vec<Client> {
    (0..n).map(|i| connected_on(server, i % 2)).collect()
}

/// The owner core of (pattern, channel) with the test server's two cores.
pub fn owner(server: &TestServer, pattern: Pattern, channel: &str) -> usize {
    server.array().owner_of(pattern, &Channel(Bytes::from(channel.to_string()))).index()
}

/// Waits until `core` has handled everything sent to it earlier through the array API:
/// publishes a probe event there (same foreign queue, so handled after) and waits for a
/// STOMP subscriber of it to receive the probe.
pub fn sync_array(server: &TestServer, core: usize) {
    let array = server.array();
    let channel =
        (0..).map(|i| format!("{}.{i}", unique("probe"))).find(|c| array.owner_of(Pattern::Events, &Channel(Bytes::from(c.clone()))).index() == core).unwrap();
    let mut c = server.connected();
    c.subscribe_sync("probe", &format!("/topic/{channel}"), &[]);
    let msg = Message {
        id: Bytes::from_static(b"probe"),
        channel: Channel(Bytes::from(channel)),
        client_id: Bytes::from_static(b"test"),
        metadata: Bytes::new(),
        body: Bytes::from_static(b"probe"),
        tags: Tags::default(),
        timestamp_ns: now_unix_ns(),
        sequence: 0,
    };
    assert!(array.send(CoreId(core), CoreMsg::Publish { pattern: Pattern::Events, msg: Arc::new(msg), done: None }));
    let f = c.frame();
    assert_eq!((f.command.as_str(), f.body.as_slice()), ("MESSAGE", &b"probe"[..]));
}

/// Registers a responder on (pattern, channel) that forwards each request to the returned
/// receiver (the test answers with `array().respond`), and waits until it is attached.
pub fn forwarding_responder(server: &TestServer, pattern: Pattern, channel: &str) -> flume::Receiver<RpcRequest> {
    static ID: AtomicU64 = AtomicU64::new(1);
    let (requests, rx) = Mailbox::new();
    let ch = Channel(Bytes::from(channel.to_string()));
    let array = server.array();
    assert!(array.register_responder(pattern, ch, ID.fetch_add(1, Ordering::Relaxed), None, requests));
    sync_array(server, owner(server, pattern, channel));
    rx
}

/// Waits until a publisher counting its SENDs in `sent` is held back: no new SEND for 200 ms
/// after at least one. Returns where it stopped. Fails if it sends all `n` (nothing held it)
/// or is still going after 20 s. Tests that pause a subscriber use this instead of a fixed
/// pause, so the pause ends soon after the publisher is held, well inside the 2 s grace.
pub fn wait_until_held(sent: &AtomicU64, n: usize) -> usize {
    const STILL: Duration = Duration::from_millis(200);
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let mut last = sent.load(Ordering::SeqCst);
    let mut since = std::time::Instant::now();
    loop {
        std::thread::sleep(Duration::from_millis(20));
        let now = sent.load(Ordering::SeqCst);
        assert!((now as usize) < n, "the publisher sent all {n}: nothing held it back");
        if now != last {
            (last, since) = (now, std::time::Instant::now());
        } else if now > 0 && since.elapsed() >= STILL {
            return now as usize;
        }
        assert!(std::time::Instant::now() < deadline, "the publisher was never held back (at {now} of {n})");
    }
}
