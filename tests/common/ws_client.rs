//! STOMP over a real WebSocket for the test client (tungstenite, blocking): the handshake, the
//! socket under it, and the transport switch.
//!
//! With `STOMPGATE_TEST_TRANSPORT=ws` every [`crate::common::TestServer`] also binds its
//! WebSocket listener on 127.0.0.1:0 and records it here against its STOMP address, so
//! `Client::open(server.addr)` (and `server.client()`) opens a WebSocket to `/ws` instead of a
//! TCP connection: the test bodies stay the same. A STOMP address with no WebSocket listener
//! recorded (a child gateway, a hand-made one) is a test that cannot run over WebSocket: it
//! panics rather than silently passing over TCP, and its module belongs in the WS pass's skip
//! list (scripts/test).

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Mutex;
use tungstenite::client::IntoClientRequest;
use tungstenite::WebSocket;

/// The subprotocols a STOMP client offers (what @stomp/stompjs sends).
pub const STOMP_SUBPROTOCOLS: &[&str] = &["v10.stomp", "v11.stomp", "v12.stomp"];

/// Whether this run speaks STOMP over WebSocket (`STOMPGATE_TEST_TRANSPORT=ws`).
pub fn ws_transport() -> bool {
    std::env::var("STOMPGATE_TEST_TRANSPORT").is_ok_and(|v| v == "ws")
}

/// STOMP address → WebSocket address of each running test gateway (WS runs only).
static WS_OF: Mutex<Option<HashMap<SocketAddr, SocketAddr>>> = Mutex::new(None);

/// Records that the gateway at `stomp` serves WebSocket at `ws` (until [`forget`]).
pub fn register(stomp: SocketAddr, ws: SocketAddr) {
    WS_OF.lock().unwrap().get_or_insert_with(HashMap::new).insert(stomp, ws);
}

/// Drops the record of `stomp` (its gateway stopped; the port may be reused).
pub fn forget(stomp: SocketAddr) {
    if let Some(map) = WS_OF.lock().unwrap().as_mut() {
        map.remove(&stomp);
    }
}

/// The WebSocket address recorded for the gateway at `stomp`, if any.
pub fn ws_addr_of(stomp: SocketAddr) -> Option<SocketAddr> {
    WS_OF.lock().unwrap().as_ref().and_then(|m| m.get(&stomp).copied())
}

/// The client's socket, retrying reads and writes that a signal interrupted: glommio's
/// executors signal their threads, and a blocking call in the test process may see EINTR.
pub struct Tcp(pub TcpStream);

pub fn retrying<T>(mut op: impl FnMut() -> std::io::Result<T>) -> std::io::Result<T> {
    loop {
        match op() {
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            other => return other,
        }
    }
}

impl Read for Tcp {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        retrying(|| self.0.read(buf))
    }
}

impl Write for Tcp {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        retrying(|| self.0.write(buf))
    }
    fn flush(&mut self) -> std::io::Result<()> {
        retrying(|| self.0.flush())
    }
}

/// Opens a WebSocket to `addr` at `path` (may carry a query), offering `protocols` and
/// sending `origin` when given; returns it with the handshake's response.
pub fn handshake(
    addr: SocketAddr,
    path: &str,
    protocols: &[&str],
    origin: Option<&str>,
) -> Result<(WebSocket<Tcp>, tungstenite::handshake::client::Response), tungstenite::Error> {
    let mut request = format!("ws://{addr}{path}").into_client_request()?;
    if !protocols.is_empty() {
        request.headers_mut().insert("Sec-WebSocket-Protocol", protocols.join(", ").parse().unwrap());
    }
    if let Some(origin) = origin {
        request.headers_mut().insert("Origin", origin.parse().unwrap());
    }
    let tcp = TcpStream::connect(addr).unwrap_or_else(|e| panic!("connect {addr}: {e}"));
    tcp.set_nodelay(true).unwrap();
    tcp.set_read_timeout(Some(super::WAIT)).unwrap();
    tungstenite::client(request, Tcp(tcp)).map_err(|e| match e {
        tungstenite::HandshakeError::Failure(e) => e,
        tungstenite::HandshakeError::Interrupted(_) => panic!("blocking handshake interrupted"),
    })
}
