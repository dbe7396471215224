//! STOMP over WebSocket for the harness (`--ws`): tungstenite's client over a `TcpStream`, used
//! blocking (publishers, handshakes) or non-blocking (receiver groups under `poll(2)`), the way a
//! browser's @stomp/stompjs reaches stompgate's `--ws-addr` or RabbitMQ's Web-STOMP.
//!
//! The harness writes many STOMP frames in one buffer, so each write becomes one binary
//! WebSocket message carrying all of them (masked, as RFC 6455 requires of a client); what the
//! server's messages carry is handed to the caller as a byte stream, whatever the message
//! boundaries. tungstenite buffers input that `poll(2)` cannot see, so after any message was read
//! [`WsStream::has_buffered_input`] says "read again" until a read would block.

use std::io::{self, ErrorKind};
use std::net::TcpStream;

use bytes::Bytes;
use tungstenite::client::IntoClientRequest;
use tungstenite::protocol::WebSocketConfig;
use tungstenite::{Message, WebSocket};

use crate::conn::LoadError;

/// The STOMP subprotocols offered, highest first (RabbitMQ and stompgate answer with one).
const SUBPROTOCOLS: &str = "v12.stomp, v11.stomp, v10.stomp";
/// Bound on one incoming message: far above any frame the scenarios exchange.
const MAX_MESSAGE: usize = 64 << 20;

/// What every WebSocket connection of a run shares: the request path.
#[derive(Clone, Debug)]
pub struct WsClient {
    pub path: String,
}

pub struct WsStream {
    ws: WebSocket<TcpStream>,
    /// The rest of the last data message not yet returned by [`WsStream::read`].
    unread: Bytes,
    /// A message was read since the last `WouldBlock`: tungstenite may hold more.
    maybe_more: bool,
    /// A flush could not write everything (non-blocking): output is still queued.
    pending: bool,
    closed: bool,
}

fn io_error(e: tungstenite::Error) -> io::Error {
    match e {
        tungstenite::Error::Io(e) => e,
        other => io::Error::other(other.to_string()),
    }
}

impl WsClient {
    /// The opening handshake on `tcp` (blocking; the socket's timeouts bound it), offering the
    /// STOMP subprotocols.
    ///
    /// # Errors
    /// The handshake failing or refused (the HTTP status is in the text).
    pub fn handshake(&self, tcp: TcpStream) -> Result<WsStream, LoadError> {
        let addr = tcp.peer_addr().map_err(|e| LoadError::io("peer address", e))?;
        let mut request = format!("ws://{addr}{}", self.path).into_client_request().map_err(|e| LoadError::Setup(format!("--ws-path {}: {e}", self.path)))?;
        request.headers_mut().insert("Sec-WebSocket-Protocol", SUBPROTOCOLS.parse().expect("a valid header value"));
        let config = WebSocketConfig::default().max_message_size(Some(MAX_MESSAGE)).max_frame_size(Some(MAX_MESSAGE));
        let (ws, _response) = tungstenite::client::client_with_config(request, tcp, Some(config))
            .map_err(|e| LoadError::Connect { addr: format!("{addr} (WebSocket handshake)"), source: io::Error::other(e.to_string()) })?;
        Ok(WsStream { ws, unread: Bytes::new(), maybe_more: false, pending: false, closed: false })
    }
}

impl WsStream {
    pub fn tcp(&self) -> &TcpStream {
        self.ws.get_ref()
    }

    /// Bytes of the server's messages; `Ok(0)` once the server closed. Pings are answered by
    /// tungstenite (its pong goes out with the next write or flush).
    pub fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            if !self.unread.is_empty() {
                let n = buf.len().min(self.unread.len());
                buf[..n].copy_from_slice(&self.unread.split_to(n));
                return Ok(n);
            }
            if self.closed {
                return Ok(0);
            }
            match self.ws.read() {
                Ok(Message::Binary(data)) => self.unread = data,
                Ok(Message::Text(text)) => self.unread = Bytes::from(text),
                Ok(Message::Close(_)) | Err(tungstenite::Error::ConnectionClosed | tungstenite::Error::AlreadyClosed) => {
                    self.closed = true;
                    return Ok(0);
                }
                Ok(Message::Ping(_) | Message::Pong(_) | Message::Frame(_)) => {}
                Err(e) => {
                    let e = io_error(e);
                    if e.kind() == ErrorKind::WouldBlock {
                        self.maybe_more = false;
                    }
                    return Err(e);
                }
            }
            self.maybe_more = true;
        }
    }

    /// Blocking: `data` as one binary message.
    pub fn write_all(&mut self, data: &[u8]) -> io::Result<()> {
        self.ws.send(Message::binary(Bytes::copy_from_slice(data))).map_err(io_error)
    }

    /// Non-blocking: queues `data` as one message (nothing when empty) and writes what the
    /// socket takes. `Ok(true)` when nothing is left queued.
    pub fn queue_and_flush(&mut self, data: &[u8]) -> io::Result<bool> {
        if !data.is_empty() {
            match self.ws.write(Message::binary(Bytes::copy_from_slice(data))) {
                Ok(()) => {}
                // Queued, the socket took only part of it: flushed below / on POLLOUT.
                Err(tungstenite::Error::Io(e)) if e.kind() == ErrorKind::WouldBlock => {}
                Err(e) => return Err(io_error(e)),
            }
        }
        match self.ws.flush() {
            Ok(()) => {
                self.pending = false;
                Ok(true)
            }
            Err(tungstenite::Error::Io(e)) if e.kind() == ErrorKind::WouldBlock => {
                self.pending = true;
                Ok(false)
            }
            Err(e) => Err(io_error(e)),
        }
    }

    pub fn has_pending_write(&self) -> bool {
        self.pending
    }

    /// Input that `poll(2)` will not report: the rest of a message, or frames tungstenite
    /// already read from the socket.
    pub fn has_buffered_input(&self) -> bool {
        !self.unread.is_empty() || self.maybe_more
    }
}
