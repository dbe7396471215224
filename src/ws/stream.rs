//! [`WsStream`]: a WebSocket as the byte stream the STOMP connection reads and writes.
use async_tungstenite::WebSocketStream;
use bytes::{Buf, Bytes};
use futures_lite::{AsyncRead, AsyncWrite, Stream as _};
use futures_sink::Sink;
use std::io;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use tungstenite::protocol::frame::coding::CloseCode;
use tungstenite::protocol::CloseFrame;
use tungstenite::{Error as WsError, Message};

/// An accepted WebSocket over `S`, the connection's plain or TLS stream (generic, so this
/// module does not depend on the connection layer that uses it).
pub struct WsStream<S> {
    ws: WebSocketStream<S>,
    /// What is left of the last data message, for the next reads.
    unread: Bytes,
}

/// The marker inside the `io::Error` a too-large WebSocket frame or message becomes, so the
/// reader can answer ERROR `frame too large` rather than just close.
#[derive(Debug)]
struct TooLarge;

impl std::fmt::Display for TooLarge {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("WebSocket message too large")
    }
}

impl std::error::Error for TooLarge {}

/// Whether a read error was a WebSocket frame or message over the size limit.
pub fn is_too_large(e: &io::Error) -> bool {
    e.get_ref().is_some_and(|inner| inner.is::<TooLarge>())
}

fn to_io(e: WsError) -> io::Error {
    match e {
        WsError::Io(e) => e,
        WsError::Capacity(_) => io::Error::new(io::ErrorKind::InvalidData, TooLarge),
        other => io::Error::other(other),
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> WsStream<S> {
    pub(super) fn new(ws: WebSocketStream<S>) -> WsStream<S> {
        WsStream { ws, unread: Bytes::new() }
    }

    /// The stream under the WebSocket.
    pub fn inner(&self) -> &S {
        self.ws.get_ref()
    }

    /// Queues a Close frame (1000, normal closure); the next flush sends it.
    pub fn start_close(&mut self) {
        let close = Message::Close(Some(CloseFrame { code: CloseCode::Normal, reason: "".into() }));
        let _ = Pin::new(&mut self.ws).start_send(close);
    }
}

/// Data messages become bytes; control frames are tungstenite's business (it answers a ping
/// with a pong and a Close with a Close on its next read or flush), so reading goes on past
/// them. The end of the WebSocket (closed by either side) reads as end of stream.
impl<S: AsyncRead + AsyncWrite + Unpin> AsyncRead for WsStream<S> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut [u8]) -> Poll<io::Result<usize>> {
        loop {
            if !self.unread.is_empty() {
                let n = buf.len().min(self.unread.len());
                buf[..n].copy_from_slice(&self.unread[..n]);
                self.unread.advance(n);
                return Poll::Ready(Ok(n));
            }
            match ready!(Pin::new(&mut self.ws).poll_next(cx)) {
                None => return Poll::Ready(Ok(0)),
                Some(Err(e)) => return Poll::Ready(Err(to_io(e))),
                Some(Ok(Message::Text(text))) => self.unread = Bytes::from(text),
                Some(Ok(Message::Binary(data))) => self.unread = data,
                // Ping (the pong is queued), Pong, Close (the reply is queued; the next poll
                // sends it and ends the stream), raw frames (never produced when reading).
                Some(Ok(_)) => {}
            }
        }
    }
}

/// One write is one message (the connection writes whole frames): text when the bytes are
/// valid UTF-8, binary otherwise.
impl<S: AsyncRead + AsyncWrite + Unpin> AsyncWrite for WsStream<S> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        ready!(Pin::new(&mut self.ws).poll_ready(cx)).map_err(to_io)?;
        let message = match std::str::from_utf8(buf) {
            Ok(text) => Message::text(text),
            Err(_) => Message::binary(Bytes::copy_from_slice(buf)),
        };
        Pin::new(&mut self.ws).start_send(message).map_err(to_io)?;
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.ws).poll_flush(cx).map_err(to_io)
    }

    fn poll_close(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.ws).poll_close(cx).map_err(to_io)
    }
}
