//! The write queue and the writer: every frame queued since the last write goes out in
//! one write, then the book-keeping for what reached the socket.
use super::{Conn, State};
use crate::engine::Core;
use crate::mesh::msg::{Settle, SubNo};
use crate::mesh::op::ArrayOp;
use crate::model::Pattern;
use bytes::BytesMut;
use std::rc::Rc;
use std::time::Instant;

/// What the writer must do once a frame has gone out.
#[derive(Clone, Copy, Debug)]
pub enum Sent {
    /// An Events/Events-Store frame of this subscription left the buffer.
    Event(SubNo),
    /// An `ack:auto` queue delivery was written: acknowledge it.
    AutoAck { sub: SubNo, tag: u64 },
}

/// Pending output (bytes queued plus bytes the writer holds) above which the connection's
/// reader stops reading: a client that does not read what it is sent (receipts, errors,
/// messages, replies) cannot make the gateway buffer without bound by sending more.
pub const OUTPUT_PAUSE_BYTES: usize = 1 << 20;
/// Once paused, reading resumes when pending output is back under this.
pub const OUTPUT_RESUME_BYTES: usize = OUTPUT_PAUSE_BYTES / 2;

/// A MESSAGE in the write queue whose delivery latency is recorded once it is written: the
/// time the array accepted its message (`Message::timestamp_ns`).
#[derive(Clone, Copy, Debug)]
pub struct Stamp {
    pub pattern: Pattern,
    pub accepted_ns: i64,
}

#[derive(Default)]
pub struct WriteQueue {
    pub buf: BytesMut,
    pub sent: Vec<Sent>,
    /// One per Events / Events-Store / queue MESSAGE in `buf` that has a timestamp, so bounded
    /// as `buf` is (16 bytes per frame queued); its capacity is kept between writes, so pushing
    /// to it does not allocate in steady state.
    pub stamps: Vec<Stamp>,
    /// Bytes of the batch the writer took that have not reached the socket yet.
    pub in_flight: usize,
}

impl WriteQueue {
    /// Output bytes not yet accepted by the socket.
    pub fn pending(&self) -> usize {
        self.buf.len() + self.in_flight
    }
}

/// Returns whether it shut the socket down itself (after an ERROR or a DISCONNECT receipt).
pub async fn write_loop(core: &Rc<Core>, conn: &Rc<Conn>, wr: &mut super::stream::WriteHalf) -> bool {
    let mut out = BytesMut::new();
    let mut sent: Vec<Sent> = Vec::new();
    let mut stamps: Vec<Stamp> = Vec::new();
    loop {
        loop {
            match conn.state.get() {
                State::Dead => return false,
                State::Draining => break,
                State::Open if !conn.wq.borrow().buf.is_empty() => break,
                State::Open => {
                    conn.write_ready.reset();
                    conn.write_ready.wait().await;
                }
            }
        }
        {
            let mut wq = conn.wq.borrow_mut();
            std::mem::swap(&mut wq.buf, &mut out);
            std::mem::swap(&mut wq.sent, &mut sent);
            std::mem::swap(&mut wq.stamps, &mut stamps);
            wq.in_flight = out.len();
        }
        if !out.is_empty() {
            if write_tracking_blocked(conn, wr, &out).await.is_err() {
                // Peer gone: make the reader notice too.
                crate::engine::endpoint::Endpoint::kill(&**conn);
                return false;
            }
            conn.last_write.set(Instant::now());
            record_latency(core, &mut stamps);
        }
        // A reader paused on this connection's output looks again.
        conn.output_drained.set();
        // Keep a burst's buffer for the next one, but do not let one large frame pin memory
        // on an otherwise idle connection.
        if out.capacity() > 256 * 1024 {
            out = BytesMut::new();
        } else {
            out.clear();
        }
        after_write(core, conn, &mut sent);
        if conn.state.get() == State::Draining && conn.wq.borrow().buf.is_empty() {
            // Everything (ERROR or the DISCONNECT receipt) is written: shut both directions
            // down, which also ends the reader if the client keeps its side open (one
            // syscall; a write-side close before it would be a second). A TLS client first
            // gets close_notify, so it can tell our close from a truncation.
            wr.close_notify().await;
            super::stream::shutdown_both(conn.fd);
            return true;
        }
    }
}

/// Every MESSAGE of the batch just written took until now: one wall-clock read (vDSO, no
/// syscall) per write, not per message, and plain-cell counting on this core's histogram.
fn record_latency(core: &Core, stamps: &mut Vec<Stamp>) {
    if stamps.is_empty() {
        return;
    }
    let now = crate::model::now_unix_ns();
    for s in stamps.drain(..) {
        core.metrics.delivery_latency.record(s.pattern, now.saturating_sub(s.accepted_ns));
    }
}

/// Writes all of `buf`, recording in `conn.write_blocked` whether the socket is refusing
/// bytes (the peer is not reading), which is what makes an events subscriber "full".
async fn write_tracking_blocked(conn: &Conn, wr: &mut super::stream::WriteHalf, buf: &[u8]) -> std::io::Result<()> {
    use futures_lite::AsyncWrite;
    let mut pos = 0;
    while pos < buf.len() {
        let n = std::future::poll_fn(|cx| match std::pin::Pin::new(&mut *wr).poll_write(cx, &buf[pos..]) {
            std::task::Poll::Pending => {
                conn.write_blocked.set(true);
                std::task::Poll::Pending
            }
            ready => ready,
        })
        .await?;
        if n == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        super::Counters::add(&conn.counters().bytes_out, n as u64);
        conn.write_blocked.set(false);
        pos += n;
        conn.wq.borrow_mut().in_flight = buf.len() - pos;
    }
    // TLS holds written records in rustls until flushed; plain TCP has nothing to flush and
    // answers at once.
    std::future::poll_fn(|cx| match std::pin::Pin::new(&mut *wr).poll_flush(cx) {
        std::task::Poll::Pending => {
            conn.write_blocked.set(true);
            std::task::Poll::Pending
        }
        ready => ready,
    })
    .await?;
    conn.write_blocked.set(false);
    Ok(())
}

/// Book-keeping for frames that reached the socket: free SubBuffSize room and acknowledge
/// `ack:auto` queue deliveries (stomp-decisions.md: auto acknowledges once written).
fn after_write(core: &Rc<Core>, conn: &Conn, sent: &mut Vec<Sent>) {
    if sent.is_empty() {
        return;
    }
    let mut acks: Vec<(SubNo, Vec<u64>)> = Vec::new();
    let parked = {
        let mut session = conn.session.borrow_mut();
        for s in sent.drain(..) {
            match s {
                Sent::Event(n) => {
                    if let Some(sub) = session.subs.get_mut(n) {
                        sub.queued = sub.queued.saturating_sub(1);
                    }
                }
                Sent::AutoAck { sub, tag } => match acks.iter_mut().find(|(s, _)| *s == sub) {
                    Some((_, tags)) => tags.push(tag),
                    None => acks.push((sub, vec![tag])),
                },
            }
        }
        session.subs.parked()
    };
    // Room was made: parked deliveries follow, in order, and their receipts are confirmed.
    if parked > 0 {
        let mut settled = Vec::new();
        super::deliver::unpark(conn, core, Instant::now(), &mut settled);
        for t in settled {
            core.confirm_parked(t);
        }
    }
    for (n, tags) in acks {
        // A subscription released meanwhile already had its messages requeued and settled.
        let channel = conn.session.borrow().subs.get(n).map(|s| s.channel.clone());
        if let Some(channel) = channel {
            core.submit_from(conn.id, ArrayOp::Settle { sub: n, channel, tags, action: Settle::Ack }, None, Some(&conn.reached));
        }
    }
    core.drain_local();
}
