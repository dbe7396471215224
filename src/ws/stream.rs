//! [`WsStream`]: a WebSocket as the byte stream the STOMP connection reads and writes.
use async_tungstenite::WebSocketStream;
use bytes::{Buf, Bytes};
use futures_lite::{AsyncRead, AsyncWrite, Stream as _};
use futures_sink::Sink;
use std::cell::Cell;
use std::io;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{ready, Context, Poll};
use tungstenite::protocol::frame::coding::CloseCode;
use tungstenite::protocol::CloseFrame;
use tungstenite::{Error as WsError, Message};

/// An accepted WebSocket over `S`, the connection's plain or TLS stream (generic, so this
/// module does not depend on the connection layer that uses it).
pub struct WsStream<S> {
    ws: WebSocketStream<Metered<S>>,
    /// What is left of the last data message, for the next reads.
    unread: Bytes,
    /// Bytes read from `S` so far (shared with the [`Metered`] under tungstenite), and that
    /// count when the last data message came out: the difference is what tungstenite holds of
    /// a message still arriving (plus at most one read of the next one).
    read: Rc<Cell<u64>>,
    read_at_last_message: u64,
    /// Asked with what tungstenite holds each time that changes; true refuses the connection
    /// (the reader gets an error [`is_over_budget`] recognises). None: no budget.
    budget: Option<BudgetGate>,
}

/// The connection layer's budget for bytes held of messages still arriving (STOMP's
/// `--partial-frames-budget`, shared with the STOMP decoder's partial frames): called with what
/// this WebSocket holds now, true when that is too much.
pub type BudgetGate = Box<dyn FnMut(usize) -> bool>;

/// `S` with a count of the bytes read from it. tungstenite buffers a frame (and a fragmented
/// message) until it is whole, out of sight of the STOMP decoder's partial-frame budget; this
/// count is how that holding is seen while it grows.
pub(super) struct Metered<S> {
    inner: S,
    read: Rc<Cell<u64>>,
}

impl<S> Metered<S> {
    pub(super) fn new(inner: S) -> (Metered<S>, Rc<Cell<u64>>) {
        let read = Rc::new(Cell::new(0));
        (Metered { inner, read: Rc::clone(&read) }, read)
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Metered<S> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut [u8]) -> Poll<io::Result<usize>> {
        let n = ready!(Pin::new(&mut self.inner).poll_read(cx, buf))?;
        self.read.set(self.read.get() + n as u64);
        Poll::Ready(Ok(n))
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Metered<S> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_close(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_close(cx)
    }
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

/// The marker inside the `io::Error` of a WebSocket whose [`BudgetGate`] refused what it holds.
#[derive(Debug)]
struct OverBudget;

impl std::fmt::Display for OverBudget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("WebSocket messages still arriving are over the budget")
    }
}

impl std::error::Error for OverBudget {}

/// Whether a read error was the [`BudgetGate`]'s refusal.
pub fn is_over_budget(e: &io::Error) -> bool {
    e.get_ref().is_some_and(|inner| inner.is::<OverBudget>())
}

fn to_io(e: WsError) -> io::Error {
    match e {
        WsError::Io(e) => e,
        WsError::Capacity(_) => io::Error::new(io::ErrorKind::InvalidData, TooLarge),
        other => io::Error::other(other),
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> WsStream<S> {
    pub(super) fn new(ws: WebSocketStream<Metered<S>>, read: Rc<Cell<u64>>) -> WsStream<S> {
        let read_at_last_message = read.get();
        WsStream { ws, unread: Bytes::new(), read, read_at_last_message, budget: None }
    }

    /// The stream under the WebSocket.
    pub fn inner(&self) -> &S {
        &self.ws.get_ref().inner
    }

    /// Puts what this WebSocket holds of messages still arriving under `gate` (see
    /// [`BudgetGate`]); it is told 0 when a message completes and is dropped with the stream
    /// (so it can give its share back).
    pub fn set_budget(&mut self, gate: BudgetGate) {
        self.budget = Some(gate);
    }

    /// What tungstenite holds now: bytes read since the last data message came out.
    fn held(&self) -> usize {
        usize::try_from(self.read.get() - self.read_at_last_message).unwrap_or(usize::MAX)
    }

    /// Tells the gate what is held now; Err once it refuses.
    fn charge(&mut self) -> io::Result<()> {
        let held = self.held();
        match self.budget.as_mut().map(|gate| gate(held)) {
            Some(true) => Err(io::Error::new(io::ErrorKind::InvalidData, OverBudget)),
            _ => Ok(()),
        }
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
            let next = Pin::new(&mut self.ws).poll_next(cx);
            // Whatever came of it, tungstenite may hold more than before: a message
            // still arriving is charged as it grows, not only once it is whole.
            if let Poll::Ready(Some(Ok(Message::Text(_) | Message::Binary(_)))) = &next {
                // The message is out (read-ahead of the next one, at most one read, is let go).
                self.read_at_last_message = self.read.get();
            }
            if let Err(e) = self.charge() {
                return Poll::Ready(Err(e));
            }
            match ready!(next) {
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
