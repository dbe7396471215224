//! A blocking raw-frame STOMP client that sees the exact bytes the server writes, and the
//! frames it parses from them: over TCP, or over a real WebSocket (`super::ws_client`; the
//! transport switch `STOMPGATE_TEST_TRANSPORT=ws` picks it for every `Client::open`), with the
//! same API either way so a test body does not know which it runs on.
//!
//! Over WebSocket: each `send_raw` is one binary message (so a test writing a frame in pieces
//! sends it split over several messages); what text and binary messages carry is one byte
//! stream for the parser; a Close frame, TCP EOF or a reset reads as EOF; `shutdown_write` sends
//! a Close frame, WebSocket's way of saying "I send no more".

use super::ws_client::{self, Tcp};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};
use tungstenite::{Message, WebSocket};

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
    transport: Transport,
    buf: Vec<u8>,
    /// Heart-beat EOLs seen between frames.
    pub heartbeats: usize,
    eof: bool,
    /// Over WebSocket: whether each data message read was "text" or "binary", in order.
    pub kinds: Vec<&'static str>,
}

enum Transport {
    Tcp(TcpStream),
    Ws(Box<WebSocket<Tcp>>),
}

pub const WAIT: Duration = Duration::from_secs(5);

impl Client {
    /// A client of the gateway whose STOMP address is `addr`: over TCP, or in a WebSocket run
    /// over a WebSocket to that gateway's `/ws` offering the STOMP subprotocols. A WebSocket
    /// run panics for a gateway with no WebSocket listener recorded (see `ws_client`).
    pub fn open(addr: SocketAddr) -> Client {
        if ws_client::ws_transport() {
            let ws = ws_client::ws_addr_of(addr).unwrap_or_else(|| {
                panic!(
                    "STOMPGATE_TEST_TRANSPORT=ws: the gateway at {addr} has no WebSocket listener recorded \
                     (not a TestServer): this test cannot run over WebSocket; skip it in scripts/test's WS pass"
                )
            });
            return Client::websocket(ws, "/ws", ws_client::STOMP_SUBPROTOCOLS, None).expect("WebSocket handshake").0;
        }
        Client::tcp(addr)
    }

    /// A client over TCP, whatever the transport switch says.
    pub fn tcp(addr: SocketAddr) -> Client {
        let stream = TcpStream::connect(addr).unwrap_or_else(|e| panic!("connect {addr}: {e}"));
        stream.set_nodelay(true).unwrap();
        Client::over(Transport::Tcp(stream))
    }

    /// A client over a WebSocket to `addr` at `path`, offering `protocols` (and `origin`);
    /// with the handshake's response.
    pub fn websocket(
        addr: SocketAddr,
        path: &str,
        protocols: &[&str],
        origin: Option<&str>,
    ) -> Result<(Client, tungstenite::handshake::client::Response), tungstenite::Error> {
        let (ws, response) = ws_client::handshake(addr, path, protocols, origin)?;
        Ok((Client::over(Transport::Ws(Box::new(ws))), response))
    }

    fn over(transport: Transport) -> Client {
        Client { transport, buf: Vec::new(), heartbeats: 0, eof: false, kinds: Vec::new() }
    }

    /// The TCP socket under the transport (over WebSocket, writing to it bypasses the framing).
    pub fn tcp_stream(&self) -> &TcpStream {
        match &self.transport {
            Transport::Tcp(s) => s,
            Transport::Ws(ws) => &ws.get_ref().0,
        }
    }

    /// Our end's address, as the gateway sees the peer.
    pub fn local_addr(&self) -> SocketAddr {
        self.tcp_stream().local_addr().unwrap()
    }

    /// Whether this client speaks STOMP over a WebSocket.
    pub fn is_websocket(&self) -> bool {
        matches!(self.transport, Transport::Ws(_))
    }

    /// The WebSocket, for tests of WebSocket itself (panics over TCP).
    pub fn ws(&mut self) -> &mut WebSocket<Tcp> {
        match &mut self.transport {
            Transport::Ws(ws) => ws,
            Transport::Tcp(_) => panic!("not a WebSocket client"),
        }
    }

    pub fn send_raw(&mut self, bytes: &[u8]) {
        self.write(bytes).expect("write");
    }

    /// Over WebSocket: one binary message per call.
    fn write(&mut self, bytes: &[u8]) -> Result<(), String> {
        match &mut self.transport {
            Transport::Tcp(s) => s.write_all(bytes).map_err(|e| e.to_string()),
            Transport::Ws(ws) => ws.send(Message::binary(bytes.to_vec())).map_err(|e| e.to_string()),
        }
    }

    /// Sends a frame built from parts (headers written as given, no escaping).
    pub fn send(&mut self, command: &str, headers: &[(&str, &str)], body: &[u8]) {
        self.send_raw(&super::props::frame_bytes(command, headers, body));
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
            self.tcp_stream().set_read_timeout(Some(deadline - now)).unwrap();
            if !self.read_some() {
                return None;
            }
        }
    }

    /// Reads what arrives into the buffer (or notes EOF); false when the read timed out.
    fn read_some(&mut self) -> bool {
        let timed_out = |e: &std::io::Error| matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut);
        match &mut self.transport {
            Transport::Tcp(stream) => {
                let mut chunk = [0u8; 65536];
                match stream.read(&mut chunk) {
                    Ok(0) => self.eof = true,
                    Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
                    // glommio's executors signal their threads; a blocking read here may see EINTR.
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(e) if timed_out(&e) => return false,
                    Err(_) => self.eof = true,
                }
            }
            // tungstenite keeps a partly read message across a timed-out read.
            Transport::Ws(ws) => match ws.read() {
                Ok(Message::Text(t)) => {
                    self.kinds.push("text");
                    self.buf.extend_from_slice(t.as_bytes());
                }
                Ok(Message::Binary(b)) => {
                    self.kinds.push("binary");
                    self.buf.extend_from_slice(&b);
                }
                Ok(Message::Close(_)) => self.eof = true,
                Ok(Message::Ping(_) | Message::Pong(_) | Message::Frame(_)) => {}
                Err(tungstenite::Error::Io(e)) if timed_out(&e) => return false,
                Err(_) => self.eof = true,
            },
        }
        true
    }

    /// Asserts that no frame arrives within `wait`.
    pub fn no_frame(&mut self, wait: Duration) {
        if let Some(f) = self.frame_within(wait) {
            panic!("unexpected frame: {f:?}");
        }
    }

    /// True once the server has closed the connection (reads EOF within `WAIT`); false if it is
    /// still open then. Any frame that arrives first fails the test: callers ask this right
    /// after the frame the server must close on (an ERROR, DISCONNECT's RECEIPT), so nothing
    /// may follow it. Heart-beat EOLs are not frames and may arrive.
    pub fn closed(&mut self) -> bool {
        let deadline = Instant::now() + WAIT;
        while Instant::now() < deadline {
            if let Some(f) = self.frame_within(Duration::from_millis(100)) {
                panic!("a frame arrived where the server should have closed: {:?}", String::from_utf8_lossy(&f.raw));
            }
            if self.eof {
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
        parse_frame(&mut self.buf, &mut self.heartbeats)
    }
}

/// Takes the first complete server frame off `buf`, counting the heart-beat EOLs before it;
/// None while it is incomplete. Over WebSocket it is fed the bytes of the
/// messages.
pub fn parse_frame(buf: &mut Vec<u8>, heartbeats: &mut usize) -> Option<Frame> {
    // Heart-beats between frames.
    while let Some(&b) = buf.first() {
        if b == b'\n' {
            *heartbeats += 1;
            buf.remove(0);
        } else if b == b'\r' && buf.get(1) == Some(&b'\n') {
            *heartbeats += 1;
            buf.drain(..2);
        } else {
            break;
        }
    }
    let head_end = find(buf, b"\n\n")?;
    let head = std::str::from_utf8(&buf[..head_end]).expect("utf-8 header block");
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
            if buf.len() < body_start + len + 1 {
                return None;
            }
            assert_eq!(buf[body_start + len], 0, "NUL after content-length bytes");
            body_start + len
        }
        None => body_start + buf[body_start..].iter().position(|&b| b == 0)?,
    };
    let body = buf[body_start..body_end].to_vec();
    let raw: Vec<u8> = buf.drain(..body_end + 1).collect();
    Some(Frame { command, headers, body, raw })
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

impl Client {
    /// True once a read has seen EOF (or a reset) from the server. Does not read.
    pub fn saw_eof(&self) -> bool {
        self.eof
    }

    /// Writes bytes, ignoring errors (the server may already have closed and reset).
    pub fn send_raw_lossy(&mut self, bytes: &[u8]) {
        let _ = self.write(bytes);
    }

    /// Half-closes our side: the server reads EOF. Over WebSocket a Close frame (the server
    /// answers with its own and closes; nothing can follow it in either direction).
    pub fn shutdown_write(&mut self) {
        match &mut self.transport {
            Transport::Tcp(s) => {
                let _ = s.shutdown(std::net::Shutdown::Write);
            }
            Transport::Ws(ws) => {
                let _ = ws.close(None);
                let _ = ws.flush();
            }
        }
    }
}
