//! Splits one glommio `TcpStream` into a read half and a write half for two tasks on the same
//! executor. glommio keeps separate readiness sources for reading and writing, so both halves
//! may be pending at once; each `poll_*` borrows the stream only for the duration of the poll
//! (never across an `.await`), so the `RefCell` never conflicts. This avoids the `Mutex` that
//! `futures_lite::io::split` would put on every read and write.
//!
//! The stream is plain TCP or TLS over TCP ([`Stream`]): an enum, so the plain path pays one
//! branch per poll and no virtual call or allocation. A TLS read may need to write (and a
//! write to read) inside rustls; both go through the same `TlsStream`, borrowed one poll at a
//! time like the plain stream.
//!
//! STOMP over WebSocket ([`Stream::Ws`]) sits behind the same seam: [`crate::ws::WsStream`]
//! turns the messages of a WebSocket (itself over a plain or TLS [`Stream`]) into the byte
//! stream the STOMP decoder reads, and wraps written bytes into messages, so the reader,
//! writer and session are the TCP ones.
use futures_lite::{AsyncRead, AsyncWrite};
use glommio::net::TcpStream;
use std::cell::RefCell;
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll};

/// One accepted client connection: plain TCP, or TLS after a completed handshake.
pub enum Stream {
    Plain(TcpStream),
    /// Boxed: a TLS session is some kilobytes, the plain variant a few words.
    Tls(Box<futures_rustls::server::TlsStream<TcpStream>>),
    /// STOMP over WebSocket, after a completed handshake (over plain TCP or TLS).
    Ws(Box<crate::ws::WsStream<Stream>>),
}

impl Stream {
    fn tcp(&self) -> &TcpStream {
        match self {
            Stream::Plain(s) => s,
            Stream::Tls(s) => s.get_ref().0,
            Stream::Ws(s) => s.inner().tcp(),
        }
    }
}

/// Dispatches one poll to the stream's variant.
macro_rules! poll_either {
    ($stream:expr, $s:ident => $poll:expr) => {
        match &mut *$stream {
            Stream::Plain($s) => $poll,
            Stream::Tls($s) => $poll,
            Stream::Ws($s) => $poll,
        }
    };
}

pub struct ReadHalf(Rc<RefCell<Stream>>);
pub struct WriteHalf(Rc<RefCell<Stream>>);

pub fn split(stream: Stream) -> (ReadHalf, WriteHalf, RawFd) {
    let fd = stream.tcp().as_raw_fd();
    let s = Rc::new(RefCell::new(stream));
    (ReadHalf(Rc::clone(&s)), WriteHalf(s), fd)
}

/// The whole stream is readable and writable too: the WebSocket layer runs over a plain or
/// TLS `Stream` (during its handshake and after).
impl AsyncRead for Stream {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut [u8]) -> Poll<io::Result<usize>> {
        poll_either!(self, s => Pin::new(s).poll_read(cx, buf))
    }
}

impl AsyncWrite for Stream {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        poll_either!(self, s => Pin::new(s).poll_write(cx, buf))
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        poll_either!(self, s => Pin::new(s).poll_flush(cx))
    }
    fn poll_close(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        poll_either!(self, s => Pin::new(s).poll_close(cx))
    }
}

impl ReadHalf {
    /// On a WebSocket, puts what it holds of messages still arriving under the gate `make`
    /// builds; on a plain or TLS stream nothing is held below the decoder, and nothing is
    /// built (no allocation per TCP connection).
    pub fn set_ws_budget(&self, make: impl FnOnce() -> crate::ws::BudgetGate) {
        if let Stream::Ws(ws) = &mut *self.0.borrow_mut() {
            ws.set_budget(make());
        }
    }
}

impl AsyncRead for ReadHalf {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut [u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut *self.0.borrow_mut()).poll_read(cx, buf)
    }
}

impl AsyncWrite for WriteHalf {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut *self.0.borrow_mut()).poll_write(cx, buf)
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.0.borrow_mut()).poll_flush(cx)
    }
    fn poll_close(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.0.borrow_mut()).poll_close(cx)
    }
}

impl WriteHalf {
    /// TLS: sends close_notify; WebSocket: a Close frame (RFC 6455 5.5.1; over wss no
    /// close_notify after it: the WebSocket close is what its clients wait for). Best effort: a peer that is not reading does not hold the close up
    /// for long, both are tiny. Plain: nothing.
    pub async fn close_notify(&mut self) {
        {
            let mut s = self.0.borrow_mut();
            match &mut *s {
                Stream::Plain(_) => return,
                Stream::Tls(tls) => tls.get_mut().1.send_close_notify(),
                Stream::Ws(ws) => ws.start_close(),
            }
        }
        let _ = futures_lite::future::or(futures_lite::AsyncWriteExt::flush(self), async {
            glommio::timer::sleep(std::time::Duration::from_millis(100)).await;
            Ok(())
        })
        .await;
    }
}

/// The peer's address of a connected socket, for audit lines and the operator views (None
/// once the socket failed).
pub fn peer_of(fd: RawFd) -> Option<std::net::SocketAddr> {
    use std::os::fd::FromRawFd;
    // SAFETY: `fd` is an open TCP socket the connection owns; the `ManuallyDrop` only borrows
    // it for getpeername(2) and never closes it.
    let socket = std::mem::ManuallyDrop::new(unsafe { std::net::TcpStream::from_raw_fd(fd) });
    socket.peer_addr().ok()
}

/// Shuts the socket down in both directions, so a task blocked reading it wakes with EOF.
pub fn shutdown_both(fd: RawFd) {
    // SAFETY: `fd` belongs to a stream still owned by the connection (both halves hold it),
    // and shutdown(2) does not close or invalidate the descriptor.
    unsafe {
        libc::shutdown(fd, libc::SHUT_RDWR);
    }
}
