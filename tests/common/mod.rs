//! Shared setup for the integration tests: an in-process gateway on an ephemeral loopback port
//! and a blocking raw-frame STOMP client that sees the exact bytes the server writes.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};
use stompgate::config::Config;
use stompgate::runtime::Server;

/// A gateway running in this process; stopped when dropped.
///
/// With `STOMPGATE_TEST_ARRAY=remote` every test runs against a pair instead: gateway A
/// (embedded array, KubeMQ gRPC API on an ephemeral port) as the array, and gateway B
/// (`--array grpc://A`) in front of it. STOMP clients talk to B; [`TestServer::array`] is A's
/// array, where native responders attach.
pub struct TestServer {
    server: Option<Server>,
    pub addr: SocketAddr,
    /// Remote mode: the array side (gateway A and its gRPC server).
    remote: Option<(Server, stompgate::grpc::GrpcServer)>,
}

/// Whether this run puts a remote array behind every test gateway.
pub fn remote_array() -> bool {
    std::env::var("STOMPGATE_TEST_ARRAY").is_ok_and(|v| v == "remote")
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
        let remote = if remote_array() {
            let array_cfg = Config { stomp_addr: "127.0.0.1:0".parse().unwrap(), ..cfg.clone() };
            let array = Server::start(array_cfg).expect("array gateway starts");
            let grpc = stompgate::grpc::start("127.0.0.1:0".parse().unwrap(), 2, array.array()).expect("array gRPC starts");
            cfg.array = stompgate::config::ArrayMode::Remote(stompgate::config::RemoteArray {
                authority: grpc.local_addr().to_string(),
                tls: false,
                ca_file: None,
                token: None,
            });
            Some((array, grpc))
        } else {
            None
        };
        let server = Server::start(cfg).expect("server starts");
        let addr = server.stomp_addr();
        TestServer { server: Some(server), addr, remote }
    }

    pub fn server(&self) -> &Server {
        self.server.as_ref().unwrap()
    }

    /// The array: this gateway's own, or in remote mode gateway A's.
    pub fn array(&self) -> stompgate::mesh::handle::ArrayHandle {
        match &self.remote {
            Some((array, _)) => array.array(),
            None => self.server().array(),
        }
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
        self.stop_all();
    }

    fn stop_all(&mut self) {
        if let Some(s) = self.server.take() {
            s.shutdown();
        }
        if let Some((array, grpc)) = self.remote.take() {
            grpc.shutdown();
            array.shutdown();
        }
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.stop_all();
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
    use stompgate::mesh::msg::{CoreMsg, ResponderFn, RpcRequest};

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
        server.array().owner_of(pattern, &Channel(Bytes::from(channel.to_string())))
    }

    /// Waits until `core` has handled everything sent to it earlier through the array API:
    /// publishes a probe event there (same foreign queue, so handled after) and waits for a
    /// STOMP subscriber of it to receive the probe.
    pub fn sync_array(server: &TestServer, core: usize) {
        let array = server.array();
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
        let array = server.array();
        assert!(array.register_responder(pattern, ch, ID.fetch_add(1, Ordering::Relaxed), None, responder));
        sync_array(server, owner(server, pattern, channel));
        rx
    }
}
// ==== END flow helpers ====

// ==== BEGIN grpc helpers (grpc_events, grpc_queues, grpc_rpc, grpc_robustness). ====
// ==== Append-only block; names live under `grpc`.                               ====
pub mod grpc {
    use super::TestServer;
    use std::collections::HashMap;
    use std::fmt::Debug;
    use std::future::Future;
    use std::net::SocketAddr;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::time::Duration;
    pub use stompgate::grpc::pb;
    use stompgate::grpc::pb::kubemq_client::KubemqClient;
    use tokio::sync::mpsc;
    use tonic::transport::Channel;
    pub use tonic::{Code, Status, Streaming};

    /// How long any single gRPC call or stream read may take before the test fails.
    pub const PROMPT: Duration = Duration::from_secs(5);
    /// How long a test waits to be sure nothing (more) arrives.
    pub const QUIET: Duration = Duration::from_millis(300);
    /// The ClientID the helpers put on requests.
    pub const CLIENT_ID: &str = "grpc-test";

    pub type Client = KubemqClient<Channel>;

    /// A two-core gateway (`TestServer`) plus its KubeMQ gRPC API on an ephemeral loopback
    /// port, and a tokio runtime for the test's clients. Dropping it closes the clients first,
    /// so the gRPC server's graceful shutdown does not wait on them.
    pub struct GrpcHarness {
        rt: Option<tokio::runtime::Runtime>,
        grpc: Option<stompgate::grpc::GrpcServer>,
        pub addr: SocketAddr,
        pub server: TestServer,
    }

    impl GrpcHarness {
        pub fn start() -> GrpcHarness {
            Self::start_limited(stompgate::grpc::Limits::default())
        }

        /// With explicit gRPC limits (a small subscriber buffer, say).
        pub fn start_limited(limits: stompgate::grpc::Limits) -> GrpcHarness {
            let server = TestServer::start();
            let grpc = stompgate::grpc::start_with("127.0.0.1:0".parse().unwrap(), 2, server.array(), limits).expect("gRPC server starts");
            let addr = grpc.local_addr();
            let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
            GrpcHarness { rt: Some(rt), grpc: Some(grpc), addr, server }
        }

        /// Runs the test body on the client runtime.
        pub fn run<F: Future>(&self, f: F) -> F::Output {
            self.rt.as_ref().unwrap().block_on(f)
        }

        /// A new client on its own HTTP/2 connection.
        pub async fn connect(&self) -> Client {
            let endpoint = tonic::transport::Endpoint::from_shared(format!("http://{}", self.addr)).unwrap();
            let channel = within("connect", endpoint.connect()).await.expect("connect");
            KubemqClient::new(channel)
        }

        /// A raw channel (for calls through `tonic::client::Grpc` with hand-made messages).
        pub async fn channel(&self) -> Channel {
            let endpoint = tonic::transport::Endpoint::from_shared(format!("http://{}", self.addr)).unwrap();
            within("connect", endpoint.connect()).await.expect("connect")
        }
    }

    impl Drop for GrpcHarness {
        fn drop(&mut self) {
            if let Some(rt) = self.rt.take() {
                rt.shutdown_timeout(Duration::from_millis(500));
            }
            if let Some(g) = self.grpc.take() {
                g.shutdown();
            }
        }
    }

    /// `f`, or a test failure naming `what` if it takes longer than [`PROMPT`].
    pub async fn within<T>(what: &str, f: impl Future<Output = T>) -> T {
        match tokio::time::timeout(PROMPT, f).await {
            Ok(v) => v,
            Err(_) => panic!("{what}: no answer within {PROMPT:?}"),
        }
    }

    /// A call that must succeed promptly; its message.
    pub async fn ok<T>(what: &str, f: impl Future<Output = Result<tonic::Response<T>, Status>>) -> T {
        match within(what, f).await {
            Ok(r) => r.into_inner(),
            Err(s) => panic!("{what}: failed with {s:?}"),
        }
    }

    /// A call that must fail promptly; its status.
    pub async fn fails<T: Debug>(what: &str, f: impl Future<Output = Result<tonic::Response<T>, Status>>) -> Status {
        match within(what, f).await {
            Ok(r) => panic!("{what}: expected an error, got {:?}", r.into_inner()),
            Err(s) => s,
        }
    }

    /// Asserts `status` is `code` with KubeMQ's `Error <n>: …` text.
    pub fn assert_kubemq_status(status: &Status, code: Code, n: u16) {
        assert_eq!(status.code(), code, "{status:?}");
        assert!(status.message().starts_with(&format!("Error {n}: ")), "expected Error {n}, got {status:?}");
    }

    /// Asserts an in-band error string is KubeMQ's `Error <n>: …`.
    pub fn assert_kubemq_error(error: &str, n: u16) {
        assert!(error.starts_with(&format!("Error {n}: ")), "expected Error {n}, got {error:?}");
    }

    /// The next message of a server stream, within [`PROMPT`].
    pub async fn next<T>(s: &mut Streaming<T>) -> T {
        match within("stream read", s.message()).await {
            Ok(Some(m)) => m,
            Ok(None) => panic!("stream ended"),
            Err(e) => panic!("stream failed: {e:?}"),
        }
    }

    /// The next `n` messages of a server stream.
    pub async fn take<T>(s: &mut Streaming<T>, n: usize) -> Vec<T> {
        let mut out = Vec::with_capacity(n);
        for _ in 0..n {
            out.push(next(s).await);
        }
        out
    }

    /// Asserts nothing arrives on the stream for [`QUIET`] (and it does not end or fail).
    pub async fn quiet<T: Debug>(s: &mut Streaming<T>) {
        if let Ok(r) = tokio::time::timeout(QUIET, s.message()).await {
            panic!("expected nothing on the stream, got {r:?}");
        }
    }

    /// Asserts nothing arrives on any of the streams for [`QUIET`] (one wait for all of them:
    /// anything sent meanwhile is buffered, so a final non-blocking poll sees it).
    pub async fn quiet_all<T: Debug>(streams: &mut [&mut Streaming<T>]) {
        tokio::time::sleep(QUIET).await;
        for (i, s) in streams.iter_mut().enumerate() {
            if let Ok(r) = tokio::time::timeout(Duration::ZERO, s.message()).await {
                panic!("expected nothing on stream {i}, got {r:?}");
            }
        }
    }

    /// A request id unique in this process.
    pub fn rid(prefix: &str) -> String {
        static N: AtomicU64 = AtomicU64::new(1);
        format!("{prefix}-{}", N.fetch_add(1, Ordering::Relaxed))
    }

    pub fn tags(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    /// An Events (or Events-Store, `store`) event from [`CLIENT_ID`].
    pub fn event(channel: &str, body: &[u8], store: bool) -> pb::Event {
        pb::Event { client_id: CLIENT_ID.into(), channel: channel.into(), body: body.to_vec(), store, ..Default::default() }
    }

    /// `SubscribeToEvents`/`SubscribeToRequests` request of `kind` (1 Events, 2 Events-Store,
    /// 3 Commands, 4 Queries).
    pub fn subscription(kind: i32, channel: &str) -> pb::Subscribe {
        pb::Subscribe { subscribe_type_data: kind, client_id: CLIENT_ID.into(), channel: channel.into(), ..Default::default() }
    }

    /// An Events-Store subscription from start `(type, value)`.
    pub fn store_subscription(channel: &str, start: i32, value: i64) -> pb::Subscribe {
        pb::Subscribe { events_store_type_data: start, events_store_type_value: value, ..subscription(2, channel) }
    }

    /// A queue message from [`CLIENT_ID`].
    pub fn queue_message(channel: &str, body: &[u8]) -> pb::QueueMessage {
        pb::QueueMessage { client_id: CLIENT_ID.into(), channel: channel.into(), body: body.to_vec(), ..Default::default() }
    }

    /// A command (`kind` 1) or query (2) with a timeout in ms.
    pub fn request(kind: i32, channel: &str, body: &[u8], timeout_ms: i32) -> pb::Request {
        pb::Request {
            request_id: rid("req"),
            request_type_data: kind,
            client_id: CLIENT_ID.into(),
            channel: channel.into(),
            body: body.to_vec(),
            timeout: timeout_ms,
            ..Default::default()
        }
    }

    /// Subscribes and returns the live stream (the call returns once the subscription is live).
    pub async fn subscribe_events(c: &mut Client, s: pb::Subscribe) -> Streaming<pb::EventReceive> {
        ok("SubscribeToEvents", c.subscribe_to_events(s)).await
    }

    pub async fn subscribe_requests(c: &mut Client, s: pb::Subscribe) -> Streaming<pb::Request> {
        ok("SubscribeToRequests", c.subscribe_to_requests(s)).await
    }

    pub async fn send_event(c: &mut Client, e: pb::Event) -> pb::Result {
        let r = ok("SendEvent", c.send_event(e)).await;
        assert!(r.sent && r.error.is_empty(), "{r:?}");
        r
    }

    pub async fn send_queue(c: &mut Client, m: pb::QueueMessage) -> pb::SendQueueMessageResult {
        let r = ok("SendQueueMessage", c.send_queue_message(m)).await;
        assert!(!r.is_error, "{r:?}");
        r
    }

    /// A request stream the test feeds by hand, for the bidirectional RPCs.
    pub fn feed<T: Send + 'static>() -> (mpsc::UnboundedSender<T>, impl futures_lite::Stream<Item = T> + Send + 'static) {
        let (tx, rx) = mpsc::unbounded_channel::<T>();
        let stream = futures_lite::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|m| (m, rx)) });
        (tx, stream)
    }

    /// `QueuesDownstreamRequestType` values.
    pub use stompgate::grpc::queues::kind as ds;

    /// An open `QueuesDownstream` call.
    pub struct Downstream {
        tx: Option<mpsc::UnboundedSender<pb::QueuesDownstreamRequest>>,
        pub rx: Streaming<pb::QueuesDownstreamResponse>,
    }

    impl Downstream {
        pub async fn open(c: &mut Client) -> Downstream {
            let (tx, requests) = feed();
            let rx = ok("QueuesDownstream", c.queues_downstream(requests)).await;
            Downstream { tx: Some(tx), rx }
        }

        pub fn send(&self, r: pb::QueuesDownstreamRequest) {
            self.tx.as_ref().expect("request stream open").send(r).expect("request stream open");
        }

        /// Half-closes the request stream (the client is done sending).
        pub fn close_requests(&mut self) {
            self.tx = None;
        }

        /// A Get: returns its reply (asserted to be the Get's, by RefRequestId and type).
        pub async fn get(&mut self, channel: &str, max: i32, wait_ms: i32, auto_ack: bool) -> pb::QueuesDownstreamResponse {
            let request_id = rid("get");
            self.send(pb::QueuesDownstreamRequest {
                request_id: request_id.clone(),
                client_id: CLIENT_ID.into(),
                request_type_data: ds::GET,
                channel: channel.into(),
                max_items: max,
                wait_timeout: wait_ms,
                auto_ack,
                ..Default::default()
            });
            let r = self.next().await;
            assert_eq!((r.ref_request_id.as_str(), r.request_type_data), (request_id.as_str(), ds::GET), "{r:?}");
            assert!(!r.is_error, "{r:?}");
            r
        }

        /// A settlement or query of `kind` on transaction `txn`; returns the request id.
        pub fn on_txn(&self, kind: i32, txn: &str, seqs: &[i64], requeue_to: &str) -> String {
            let request_id = rid("ds");
            self.send(pb::QueuesDownstreamRequest {
                request_id: request_id.clone(),
                client_id: CLIENT_ID.into(),
                request_type_data: kind,
                ref_transaction_id: txn.into(),
                sequence_range: seqs.to_vec(),
                re_queue_channel: requeue_to.into(),
                ..Default::default()
            });
            request_id
        }

        /// ActiveOffsets of `txn` (the reply is asserted to match the request).
        pub async fn active_offsets(&mut self, txn: &str) -> Vec<i64> {
            let id = self.on_txn(ds::ACTIVE_OFFSETS, txn, &[], "");
            let r = self.next().await;
            assert_eq!((r.ref_request_id.as_str(), r.request_type_data, r.is_error), (id.as_str(), ds::ACTIVE_OFFSETS, false), "{r:?}");
            r.active_offsets
        }

        /// TransactionStatus of `txn`: whether it is complete.
        pub async fn complete(&mut self, txn: &str) -> bool {
            let id = self.on_txn(ds::TRANSACTION_STATUS, txn, &[], "");
            let r = self.next().await;
            assert_eq!((r.ref_request_id.as_str(), r.request_type_data, r.is_error), (id.as_str(), ds::TRANSACTION_STATUS, false), "{r:?}");
            r.transaction_complete
        }

        pub async fn next(&mut self) -> pb::QueuesDownstreamResponse {
            next(&mut self.rx).await
        }

        pub async fn quiet(&mut self) {
            quiet(&mut self.rx).await
        }
    }

    /// Sequences of received queue messages.
    pub fn seqs(messages: &[pb::QueueMessage]) -> Vec<i64> {
        messages.iter().map(|m| attrs(m).sequence as i64).collect()
    }

    /// Bodies of received queue messages, as strings.
    pub fn queue_bodies(messages: &[pb::QueueMessage]) -> Vec<String> {
        messages.iter().map(|m| String::from_utf8_lossy(&m.body).into_owned()).collect()
    }

    /// Receive counts of received queue messages.
    pub fn receive_counts(messages: &[pb::QueueMessage]) -> Vec<i32> {
        messages.iter().map(|m| attrs(m).receive_count).collect()
    }

    pub fn attrs(m: &pb::QueueMessage) -> &pb::QueueMessageAttributes {
        m.attributes.as_ref().expect("a received queue message carries attributes")
    }

    /// A channel-management query (kubemq-grpc.md §6.4).
    pub fn management(metadata: &str, tag_pairs: &[(&str, &str)]) -> pb::Request {
        pb::Request {
            metadata: metadata.into(),
            tags: tags(tag_pairs),
            ..request(2, "kubemq.cluster.internal.requests", b"", 10_000)
        }
    }

    /// `list-channels` of `channel_type` filtered by `search`: the decoded JSON array.
    pub async fn list_channels(c: &mut Client, channel_type: &str, search: &str) -> Vec<serde_json::Value> {
        let r = ok("list-channels", c.send_request(management("list-channels", &[("channel_type", channel_type), ("channel_search", search)]))).await;
        assert!(r.executed && r.error.is_empty(), "{r:?}");
        match serde_json::from_slice(&r.body).expect("list body is JSON") {
            serde_json::Value::Array(items) => items,
            other => panic!("list body is not an array: {other}"),
        }
    }

    /// Polls `list-channels` until `channel` (exact name) is listed or not (`present`), failing
    /// after [`PROMPT`].
    pub async fn wait_listed(c: &mut Client, channel_type: &str, channel: &str, present: bool) {
        let deadline = tokio::time::Instant::now() + PROMPT;
        loop {
            let items = list_channels(c, channel_type, channel).await;
            let listed = items.iter().any(|i| i["name"] == channel);
            if listed == present {
                return;
            }
            assert!(tokio::time::Instant::now() < deadline, "{channel_type} channel {channel} still {} after {PROMPT:?}: {items:?}", if present { "absent" } else { "listed" });
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}
// ==== END grpc helpers ====
