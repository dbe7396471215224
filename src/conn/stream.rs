//! Splits one glommio `TcpStream` into a read half and a write half for two tasks on the same
//! executor. glommio keeps separate readiness sources for reading and writing, so both halves
//! may be pending at once; each `poll_*` borrows the stream only for the duration of the poll
//! (never across an `.await`), so the `RefCell` never conflicts. This avoids the `Mutex` that
//! `futures_lite::io::split` would put on every read and write.
use futures_lite::{AsyncRead, AsyncWrite};
use glommio::net::TcpStream;
use std::cell::RefCell;
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll};

pub struct ReadHalf(Rc<RefCell<TcpStream>>);
pub struct WriteHalf(Rc<RefCell<TcpStream>>);

pub fn split(stream: TcpStream) -> (ReadHalf, WriteHalf, RawFd) {
    let fd = stream.as_raw_fd();
    let s = Rc::new(RefCell::new(stream));
    (ReadHalf(Rc::clone(&s)), WriteHalf(s), fd)
}

impl AsyncRead for ReadHalf {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut [u8]) -> Poll<io::Result<usize>> {
        let mut s = self.0.borrow_mut();
        Pin::new(&mut *s).poll_read(cx, buf)
    }
}

impl AsyncWrite for WriteHalf {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let mut s = self.0.borrow_mut();
        Pin::new(&mut *s).poll_write(cx, buf)
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let mut s = self.0.borrow_mut();
        Pin::new(&mut *s).poll_flush(cx)
    }
    fn poll_close(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let mut s = self.0.borrow_mut();
        Pin::new(&mut *s).poll_close(cx)
    }
}

/// Shuts the socket down in both directions, so a task blocked reading it wakes with EOF.
pub fn shutdown_both(fd: RawFd) {
    // SAFETY: `fd` belongs to a stream still owned by the connection (both halves hold it),
    // and shutdown(2) does not close or invalidate the descriptor.
    unsafe {
        libc::shutdown(fd, libc::SHUT_RDWR);
    }
}
