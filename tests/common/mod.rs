//! Shared setup for the integration tests: an in-process gateway on an ephemeral loopback port
//! and a blocking raw-frame STOMP client that sees the exact bytes the server writes.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};
use stompgate::config::Config;
use stompgate::runtime::Server;

/// A gateway running in this process; stopped when dropped.
pub struct TestServer {
    server: Option<Server>,
    pub addr: SocketAddr,
}

impl TestServer {
    pub fn start() -> TestServer {
        Self::start_with(|_| {})
    }

    /// Starts with two cores (on CPUs 0 and 1, or twice CPU 0 on a one-CPU machine) so
    /// cross-core paths are exercised, after `tweak` adjusts the defaults.
    pub fn start_with(tweak: impl FnOnce(&mut Config)) -> TestServer {
        if let Ok(filter) = std::env::var("STOMPGATE_LOG") {
            let _ = tracing_subscriber::fmt().with_env_filter(filter).with_test_writer().try_init();
        }
        let online = core_affinity::get_core_ids().map(|v| v.len()).unwrap_or(1);
        let mut cfg = Config {
            stomp_addr: std::env::var("TEST_ADDR").unwrap_or("127.0.0.1:0".into()).parse().unwrap(),
            cpus: if online >= 2 { vec![0, 1] } else { vec![0, 0] },
            ..Config::default()
        };
        tweak(&mut cfg);
        let server = Server::start(cfg).expect("server starts");
        let addr = server.stomp_addr();
        TestServer { server: Some(server), addr }
    }

    pub fn server(&self) -> &Server {
        self.server.as_ref().unwrap()
    }

    pub fn client(&self) -> Client {
        Client::open(self.addr)
    }

    /// A client that has completed CONNECT with `accept-version:1.2`.
    pub fn connected(&self) -> Client {
        let mut c = self.client();
        let f = c.connect("1.2");
        assert_eq!(f.command, "CONNECTED", "{f:?}");
        c
    }

    /// Stops the server and waits for it (what SIGTERM does).
    pub fn stop(mut self) {
        if let Some(s) = self.server.take() {
            s.shutdown();
        }
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        if let Some(s) = self.server.take() {
            s.shutdown();
        }
    }
}

/// A server frame as read off the wire.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Frame {
    pub command: String,
    /// Raw (still escaped) header lines split at the first ':'.
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    /// The exact bytes of the frame, command line through the NUL.
    pub raw: Vec<u8>,
}

impl Frame {
    /// First value of `name` (STOMP: the first occurrence wins).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
    }
    pub fn count(&self, name: &str) -> usize {
        self.headers.iter().filter(|(n, _)| n == name).count()
    }
    pub fn body_str(&self) -> &str {
        std::str::from_utf8(&self.body).unwrap()
    }
}

pub struct Client {
    pub stream: TcpStream,
    buf: Vec<u8>,
    /// Heart-beat EOLs seen between frames.
    pub heartbeats: usize,
    eof: bool,
}

pub const WAIT: Duration = Duration::from_secs(5);

impl Client {
    pub fn open(addr: SocketAddr) -> Client {
        let stream = TcpStream::connect(addr).unwrap_or_else(|e| panic!("connect {addr}: {e}"));
        stream.set_nodelay(true).unwrap();
        Client { stream, buf: Vec::new(), heartbeats: 0, eof: false }
    }

    pub fn send_raw(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).expect("write");
    }

    /// Sends a frame built from parts (headers written as given, no escaping).
    pub fn send(&mut self, command: &str, headers: &[(&str, &str)], body: &[u8]) {
        let mut out = Vec::new();
        out.extend_from_slice(command.as_bytes());
        out.push(b'\n');
        for (n, v) in headers {
            out.extend_from_slice(n.as_bytes());
            out.push(b':');
            out.extend_from_slice(v.as_bytes());
            out.push(b'\n');
        }
        out.push(b'\n');
        out.extend_from_slice(body);
        out.push(0);
        self.send_raw(&out);
    }

    pub fn connect(&mut self, accept_version: &str) -> Frame {
        self.send("CONNECT", &[("accept-version", accept_version), ("host", "localhost")], b"");
        self.frame()
    }

    /// Reads the next frame, failing the test if none arrives within `WAIT`.
    pub fn frame(&mut self) -> Frame {
        match self.frame_within(WAIT) {
            Some(f) => f,
            None => panic!("no frame within the wait (eof: {}, buffered: {:?})", self.eof, String::from_utf8_lossy(&self.buf)),
        }
    }

    /// The next frame, or None if nothing (complete) arrives within `wait` or the peer closed.
    pub fn frame_within(&mut self, wait: Duration) -> Option<Frame> {
        let deadline = Instant::now() + wait;
        loop {
            if let Some(f) = self.parse() {
                return Some(f);
            }
            if self.eof {
                return None;
            }
            let now = Instant::now();
            if now >= deadline {
                return None;
            }
            self.stream.set_read_timeout(Some(deadline - now)).unwrap();
            let mut chunk = [0u8; 65536];
            match self.stream.read(&mut chunk) {
                Ok(0) => self.eof = true,
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
                // glommio's executors signal their threads; a blocking read here may see EINTR.
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => return None,
                Err(_) => self.eof = true,
            }
        }
    }

    /// Asserts that no frame arrives within `wait`.
    pub fn no_frame(&mut self, wait: Duration) {
        if let Some(f) = self.frame_within(wait) {
            panic!("unexpected frame: {f:?}");
        }
    }

    /// True once the server has closed the connection (reads EOF within `WAIT`), after any
    /// remaining frames.
    pub fn closed(&mut self) -> bool {
        let deadline = Instant::now() + WAIT;
        while Instant::now() < deadline {
            if self.frame_within(Duration::from_millis(100)).is_none() && self.eof {
                return true;
            }
        }
        false
    }

    /// Reads frames until one with `command` arrives; returns it and what came before.
    pub fn until(&mut self, command: &str) -> (Frame, Vec<Frame>) {
        let mut before = Vec::new();
        loop {
            let f = self.frame();
            if f.command == command {
                return (f, before);
            }
            before.push(f);
        }
    }

    fn parse(&mut self) -> Option<Frame> {
        // Heart-beats between frames.
        while let Some(&b) = self.buf.first() {
            if b == b'\n' {
                self.heartbeats += 1;
                self.buf.remove(0);
            } else if b == b'\r' && self.buf.get(1) == Some(&b'\n') {
                self.heartbeats += 1;
                self.buf.drain(..2);
            } else {
                break;
            }
        }
        let head_end = find(&self.buf, b"\n\n")?;
        let head = std::str::from_utf8(&self.buf[..head_end]).expect("utf-8 header block");
        let mut lines = head.split('\n');
        let command = lines.next().unwrap().to_string();
        let headers: Vec<(String, String)> = lines
            .map(|l| {
                let (n, v) = l.split_once(':').expect("header line has ':'");
                (n.to_string(), v.to_string())
            })
            .collect();
        let body_start = head_end + 2;
        let len = headers.iter().find(|(n, _)| n == "content-length").map(|(_, v)| v.parse::<usize>().expect("numeric content-length"));
        let body_end = match len {
            Some(len) => {
                if self.buf.len() < body_start + len + 1 {
                    return None;
                }
                assert_eq!(self.buf[body_start + len], 0, "NUL after content-length bytes");
                body_start + len
            }
            None => body_start + self.buf[body_start..].iter().position(|&b| b == 0)?,
        };
        let body = self.buf[body_start..body_end].to_vec();
        let raw: Vec<u8> = self.buf.drain(..body_end + 1).collect();
        Some(Frame { command, headers, body, raw })
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// A destination name unique to this test run, so tests sharing a server never collide.
pub fn unique(prefix: &str) -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    format!("{prefix}{}-{}", std::process::id(), N.fetch_add(1, Ordering::Relaxed))
}

// ==== BEGIN props helpers (destinations, headers_tags, versions_escaping, heartbeats, ====
// ==== receipts_errors, robustness). Append-only block; names live under `props`.      ====
pub mod props {
    use super::{Client, Frame, TestServer};
    use std::io::Write;
    use std::time::Duration;

    impl Client {
        /// True once a read has seen EOF (or a reset) from the server. Does not read.
        pub fn saw_eof(&self) -> bool {
            self.eof
        }

        /// Writes bytes, ignoring errors (the server may already have closed and reset).
        pub fn send_raw_lossy(&mut self, bytes: &[u8]) {
            let _ = self.stream.write_all(bytes);
        }

        /// Half-closes our side: the server reads EOF.
        pub fn shutdown_write(&mut self) {
            let _ = self.stream.shutdown(std::net::Shutdown::Write);
        }
    }

    /// One frame's bytes from parts (headers written as given, no escaping).
    pub fn frame_bytes(command: &str, headers: &[(&str, &str)], body: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend_from_slice(command.as_bytes());
        out.push(b'\n');
        for (n, v) in headers {
            out.extend_from_slice(n.as_bytes());
            out.push(b':');
            out.extend_from_slice(v.as_bytes());
            out.push(b'\n');
        }
        out.push(b'\n');
        out.extend_from_slice(body);
        out.push(0);
        out
    }

    /// A client connected with `accept-version:<version>`.
    pub fn connect_version(server: &TestServer, version: &str) -> Client {
        let mut c = server.client();
        let f = c.connect(version);
        assert_eq!(f.command, "CONNECTED", "{f:?}");
        assert_eq!(f.header("version"), Some(version), "{f:?}");
        c
    }

    /// Asserts the frame's exact bytes, printing both sides readably on failure.
    pub fn assert_raw(frame: &Frame, expected: &[u8]) {
        assert_eq!(String::from_utf8_lossy(&frame.raw), String::from_utf8_lossy(expected), "exact frame bytes differ");
        assert_eq!(frame.raw, expected);
    }

    /// Asserts the frame's headers are exactly `expected` as a multiset (order-insensitive).
    pub fn assert_headers(frame: &Frame, expected: &[(&str, &str)]) {
        let mut got: Vec<(String, String)> = frame.headers.clone();
        let mut want: Vec<(String, String)> = expected.iter().map(|(n, v)| (n.to_string(), v.to_string())).collect();
        got.sort();
        want.sort();
        assert_eq!(got, want, "headers of {:?}", String::from_utf8_lossy(&frame.raw));
    }

    /// Sends a frame with `receipt:<receipt>` and asserts the exact RECEIPT comes back next.
    pub fn send_with_receipt(c: &mut Client, command: &str, headers: &[(&str, &str)], body: &[u8], receipt: &str) {
        let mut h: Vec<(&str, &str)> = headers.to_vec();
        h.push(("receipt", receipt));
        c.send(command, &h, body);
        let f = c.frame();
        assert_raw(&f, format!("RECEIPT\nreceipt-id:{receipt}\ncontent-length:0\n\n\0").as_bytes());
    }

    /// SUBSCRIBE `id` to `destination` (plus `extra` headers) and wait for its RECEIPT, so
    /// the subscription is live at the owner before anything is sent.
    pub fn subscribe(c: &mut Client, id: &str, destination: &str, extra: &[(&str, &str)]) {
        let mut h = vec![("id", id), ("destination", destination)];
        h.extend_from_slice(extra);
        let receipt = format!("sub-{id}");
        send_with_receipt(c, "SUBSCRIBE", &h, b"", &receipt);
    }

    /// Reads the next frame, asserts it is ERROR with exactly this `message`, then asserts
    /// the server closes the connection. Returns the ERROR.
    pub fn expect_error_close(c: &mut Client, message: &str) -> Frame {
        let f = c.frame();
        assert_eq!(f.command, "ERROR", "expected ERROR, got {:?}", String::from_utf8_lossy(&f.raw));
        assert_eq!(f.header("message"), Some(message), "{:?}", String::from_utf8_lossy(&f.raw));
        assert_eq!(f.count("message"), 1);
        assert!(c.closed(), "connection still open after ERROR {:?}", String::from_utf8_lossy(&f.raw));
        f
    }

    /// Proves a connection is alive and in order: a SUBSCRIBE+UNSUBSCRIBE with receipts.
    pub fn assert_alive(c: &mut Client) {
        let dest = format!("/topic/{}", super::unique("alive"));
        send_with_receipt(c, "SUBSCRIBE", &[("id", "alive-probe"), ("destination", &dest)], b"", "alive-1");
        send_with_receipt(c, "UNSUBSCRIBE", &[("id", "alive-probe")], b"", "alive-2");
    }

    /// A fresh client on `server` can CONNECT, subscribe, send and receive.
    pub fn assert_server_serves(server: &TestServer) {
        let mut c = server.connected();
        let dest = format!("/topic/{}", super::unique("serves"));
        subscribe(&mut c, "s", &dest, &[]);
        c.send("SEND", &[("destination", &dest)], b"still here");
        let m = c.frame();
        assert_eq!(m.command, "MESSAGE");
        assert_eq!(m.header("destination"), Some(dest.as_str()));
        assert_eq!(m.body, b"still here");
    }

    /// How long tests wait to be sure nothing (more) arrives.
    pub const QUIET: Duration = Duration::from_millis(200);
}
// ==== END props helpers ====

// ==== BEGIN flow helpers (queues, events, wildcards, transactions, rpc, cross_core,    ====
// ==== shutdown). Append-only block; names live under `flow`.                           ====
pub mod flow {
    use super::{unique, Client, Frame, TestServer, WAIT};
    use bytes::Bytes;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;
    use std::time::Duration;
    use stompgate::model::{now_unix_ns, Channel, Message, Pattern, Tags};
    use stompgate::runtime::msg::{CoreMsg, ResponderFn, RpcRequest};

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
        server.server().array().owner_of(pattern, &Channel(Bytes::from(channel.to_string())))
    }

    /// Waits until `core` has handled everything sent to it earlier through the array API:
    /// publishes a probe event there (same foreign queue, so handled after) and waits for a
    /// STOMP subscriber of it to receive the probe.
    pub fn sync_array(server: &TestServer, core: usize) {
        let array = server.server().array();
        let channel =
            (0..).map(|i| format!("{}.{i}", unique("probe"))).find(|c| array.owner_of(Pattern::Events, &Channel(Bytes::from(c.clone()))) == core).unwrap();
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
        assert!(array.send(core, CoreMsg::Publish { pattern: Pattern::Events, msg: Arc::new(msg), done: None }));
        let f = c.frame();
        assert_eq!((f.command.as_str(), f.body.as_slice()), ("MESSAGE", &b"probe"[..]));
    }

    /// Registers a responder on (pattern, channel) that forwards each request to the returned
    /// receiver (the test answers with `array().respond`), and waits until it is attached.
    pub fn forwarding_responder(server: &TestServer, pattern: Pattern, channel: &str) -> std::sync::mpsc::Receiver<RpcRequest> {
        static ID: AtomicU64 = AtomicU64::new(1);
        let (tx, rx) = std::sync::mpsc::channel::<RpcRequest>();
        let tx = std::sync::Mutex::new(tx);
        let responder: ResponderFn = Arc::new(move |r: &RpcRequest| tx.lock().unwrap().send(r.clone()).is_ok());
        let ch = Channel(Bytes::from(channel.to_string()));
        let array = server.server().array();
        assert!(array.register_responder(pattern, ch, ID.fetch_add(1, Ordering::Relaxed), None, responder));
        sync_array(server, owner(server, pattern, channel));
        rx
    }
}
// ==== END flow helpers ====
