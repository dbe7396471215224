//! A publisher thread: stamped SENDs to one destination over one blocking connection.
//!
//! Unbounded (`--rate 0`): every `receipt_every`-th SEND carries a receipt and the publisher
//! waits for it before going on, so at most one batch is in flight and a server that merely
//! buffers cannot pass for a fast one. Paced (`--rate R`): SENDs are spread over time, written
//! at most a millisecond's worth at a time, without receipts.
//! With a receipt window (`--receipt-window N`, see `receipts.rs`) every SEND carries a
//! receipt and at most N are outstanding, unbounded or paced; RECEIPTs are read as they come
//! and timed, and the publisher waits for all of them at the end of the window.
//! Either way the publisher stops at the end of the window and closes with DISCONNECT +
//! receipt, which confirms that the server has processed every SEND.

use std::sync::atomic::Ordering;
use std::time::Duration;

use crate::body::{self, now_ns, Stamp};
use crate::conn::{eof, poll_conns, proto, Conn, LoadError, RECEIPT_TIMEOUT};
use crate::receipts::{ReceiptWindow, Receipted};
use crate::Shared;

/// Write when this much is buffered (and always before waiting or sleeping).
const FLUSH_AT: usize = 128 * 1024;
/// Paced mode wakes at most once per tick and sends what is due: above 1000 msg/s per
/// publisher that is a small burst per millisecond instead of a wake-up per message.
const PACE_TICK_NS: u64 = 1_000_000;
/// Paced mode never catches up by more than this many messages in one burst.
const MAX_BURST: u64 = 1000;
/// A receipt-window publisher with nothing to send rechecks the run's state this often.
const RECEIPT_POLL_MS: i32 = 100;

pub struct PublishSpec {
    pub id: u32,
    pub destination: String,
    pub payload: usize,
    /// Messages per second for this publisher; 0 = unbounded.
    pub rate: f64,
    pub receipt_every: u64,
    /// Every SEND receipted, at most this many outstanding; 0 = no receipt window.
    pub receipt_window: usize,
    /// Header lines (`name:value\n`) every SEND carries after its destination.
    pub extra_headers: Vec<u8>,
}

/// What one publisher sent. Its window messages are the sequence numbers
/// `first_window_seq..end_seq`.
#[derive(Clone, Debug, Default)]
pub struct Published {
    pub first_window_seq: u64,
    pub end_seq: u64,
    /// With a receipt window: what the window SENDs' RECEIPTs showed.
    pub receipted: Option<Receipted>,
}

impl Published {
    pub fn window_sent(&self) -> u64 {
        self.end_seq - self.first_window_seq
    }
}

struct Sender {
    conn: Conn,
    spec: PublishSpec,
    /// `SEND` + destination header, up to (excluding) `content-length`.
    head: Vec<u8>,
    /// `content-length` header and the blank line.
    tail: Vec<u8>,
    body: Vec<u8>,
    seq: u64,
    first_window_seq: Option<u64>,
}

impl Sender {
    fn new(conn: Conn, spec: PublishSpec) -> Sender {
        let mut head = format!("SEND\ndestination:{}\n", spec.destination).into_bytes();
        head.extend_from_slice(&spec.extra_headers);
        let tail = format!("content-length:{}\n\n", spec.payload).into_bytes();
        let body = body::template(spec.payload);
        Sender { conn, spec, head, tail, body, seq: 0, first_window_seq: None }
    }

    /// Appends one SEND stamped now, with `receipt:s<seq>` if `receipt`; returns its stamp,
    /// `None` (nothing appended) once the window has ended.
    fn push(&mut self, shared: &Shared, receipt: bool) -> Option<u64> {
        let t = now_ns();
        if t >= shared.window.end_ns {
            return None;
        }
        if self.first_window_seq.is_none() && t >= shared.window.start_ns {
            self.first_window_seq = Some(self.seq);
        }
        body::write(&mut self.body, Stamp { publisher: self.spec.id, seq: self.seq, sent_ns: t });
        let w = &mut self.conn.wr;
        w.extend_from_slice(&self.head);
        if receipt {
            w.extend_from_slice(b"receipt:s");
            w.extend_from_slice(itoa::Buffer::new().format(self.seq).as_bytes());
            w.push(b'\n');
        }
        w.extend_from_slice(&self.tail);
        w.extend_from_slice(&self.body);
        w.push(0);
        self.seq += 1;
        Some(t)
    }

    fn flush(&mut self) -> Result<(), LoadError> {
        let id = self.spec.id;
        self.conn.flush().map_err(|e| LoadError::io(format!("publisher {id}: sending"), e))
    }

    fn run_unbounded(&mut self, shared: &Shared) -> Result<(), LoadError> {
        let k = self.spec.receipt_every.max(1);
        let ctx = format!("publisher {} waiting for a SEND receipt", self.spec.id);
        while !shared.failed.load(Ordering::Relaxed) {
            let batch_start = self.seq;
            let mut receipt = None;
            for i in 0..k {
                let last = i + 1 == k;
                let seq = self.seq;
                if self.push(shared, last).is_none() {
                    break;
                }
                if last {
                    receipt = Some(format!("s{seq}"));
                }
                if self.conn.wr.len() >= FLUSH_AT {
                    self.flush()?;
                }
            }
            self.flush()?;
            shared.sent.fetch_add(self.seq - batch_start, Ordering::Relaxed);
            match receipt {
                Some(r) => self.conn.await_receipt(r.as_bytes(), RECEIPT_TIMEOUT, &ctx)?,
                None => break, // the window ended inside this batch
            }
        }
        Ok(())
    }

    fn run_paced(&mut self, shared: &Shared) -> Result<(), LoadError> {
        let rate = self.spec.rate;
        let start = now_ns();
        let due_at = |seq: u64| start + (seq as f64 * 1e9 / rate) as u64;
        'run: while !shared.failed.load(Ordering::Relaxed) {
            let now = now_ns();
            let due = ((now - start) as f64 * rate / 1e9) as u64 + 1;
            let burst_end = due.min(self.seq + MAX_BURST);
            let before = self.seq;
            while self.seq < burst_end {
                if self.push(shared, false).is_none() {
                    self.flush()?;
                    shared.sent.fetch_add(self.seq - before, Ordering::Relaxed);
                    break 'run;
                }
            }
            self.flush()?;
            shared.sent.fetch_add(self.seq - before, Ordering::Relaxed);
            let next = due_at(self.seq).max(now_ns() + PACE_TICK_NS).min(shared.window.end_ns);
            let now = now_ns();
            if next > now {
                std::thread::sleep(Duration::from_nanos(next - now));
            }
        }
        Ok(())
    }

    /// Every SEND receipted, at most `size` outstanding; paced as [`Sender::run_paced`] when
    /// the spec has a rate. Stops sending at the end of the window, then waits for the
    /// outstanding RECEIPTs.
    fn run_windowed(&mut self, shared: &Shared, size: usize) -> Result<Receipted, LoadError> {
        let mut rw = ReceiptWindow::new(size, shared.window);
        let ctx = format!("publisher {} reading SEND receipts", self.spec.id);
        let rate = self.spec.rate;
        let start = now_ns();
        let due_at = |seq: u64| start + (seq as f64 * 1e9 / rate) as u64;
        let mut sending = true;
        let mut last_progress = start;
        while !shared.failed.load(Ordering::Relaxed) {
            if sending {
                let due = if rate > 0.0 { (((now_ns() - start) as f64 * rate / 1e9) as u64 + 1).min(self.seq + MAX_BURST) } else { u64::MAX };
                let before = self.seq;
                while self.seq < due && rw.has_room_for(self.seq) {
                    let seq = self.seq;
                    let Some(t) = self.push(shared, true) else {
                        sending = false;
                        break;
                    };
                    rw.sent(seq, t);
                    if self.conn.wr.len() >= FLUSH_AT {
                        self.flush()?;
                    }
                }
                if !self.conn.wr.is_empty() {
                    self.flush()?;
                }
                shared.sent.fetch_add(self.seq - before, Ordering::Relaxed);
            }
            if !sending && rw.outstanding() == 0 {
                break;
            }
            let mut got = self.take_receipts(&mut rw, &ctx)?;
            if got == 0 {
                // Nothing in yet: wait for a RECEIPT, or (paced, with room) until the next SEND
                // is due.
                let now = now_ns();
                let wait_ms = if sending && rw.has_room_for(self.seq) && rate > 0.0 {
                    let next = due_at(self.seq).max(now + PACE_TICK_NS).min(shared.window.end_ns);
                    i32::try_from(next.saturating_sub(now).div_ceil(1_000_000)).unwrap_or(i32::MAX)
                } else {
                    RECEIPT_POLL_MS
                };
                got = self.read_receipts(&mut rw, wait_ms, &ctx)?;
            }
            let now = now_ns();
            if got > 0 || rw.outstanding() == 0 {
                last_progress = now;
            } else if now - last_progress > RECEIPT_TIMEOUT.as_nanos() as u64 {
                return Err(LoadError::Protocol {
                    context: ctx,
                    text: format!("{} SEND receipts outstanding, none arrived within {RECEIPT_TIMEOUT:?}", rw.outstanding()),
                });
            }
        }
        Ok(rw.into_receipted())
    }

    /// The RECEIPTs already read; returns how many.
    fn take_receipts(&mut self, rw: &mut ReceiptWindow, ctx: &str) -> Result<usize, LoadError> {
        let mut n = 0;
        while let Some(f) = self.conn.rd.next_frame().map_err(|e| proto(ctx, &e))? {
            rw.on_frame(&f, now_ns(), ctx)?;
            n += 1;
        }
        Ok(n)
    }

    /// Waits up to `wait_ms` for input, reads what is there and takes its RECEIPTs.
    fn read_receipts(&mut self, rw: &mut ReceiptWindow, wait_ms: i32, ctx: &str) -> Result<usize, LoadError> {
        let mut pfd = [libc::pollfd { fd: self.conn.fd(), events: 0, revents: 0 }];
        if !poll_conns(&mut pfd, std::iter::once(&self.conn), wait_ms)? || pfd[0].revents == 0 {
            return Ok(0);
        }
        match self.conn.read_some() {
            Ok(Some(0)) => return Err(eof(ctx)),
            Ok(_) => {}
            Err(e) => return Err(LoadError::io(ctx, e)),
        }
        self.take_receipts(rw, ctx)
    }
}

/// Runs one publisher to the end of the window.
///
/// # Errors
/// Socket errors, an ERROR frame, or a receipt not arriving within 30 s (with a receipt
/// window: no RECEIPT at all for 30 s while some are outstanding).
pub fn publish(conn: Conn, spec: PublishSpec, shared: &Shared) -> Result<Published, LoadError> {
    let paced = spec.rate > 0.0;
    let receipt_window = spec.receipt_window;
    let mut s = Sender::new(conn, spec);
    let mut receipted = None;
    if receipt_window > 0 {
        receipted = Some(s.run_windowed(shared, receipt_window)?);
    } else if paced {
        s.run_paced(shared)?;
    } else {
        s.run_unbounded(shared)?;
    }
    let published = Published { first_window_seq: s.first_window_seq.unwrap_or(s.seq), end_seq: s.seq, receipted };
    s.conn.disconnect(RECEIPT_TIMEOUT)?;
    Ok(published)
}
