//! A publisher thread: stamped SENDs to one destination over one blocking connection.
//!
//! Unbounded (`--rate 0`): every `receipt_every`-th SEND carries a receipt and the publisher
//! waits for it before going on, so at most one batch is in flight and a server that merely
//! buffers cannot pass for a fast one. Paced (`--rate R`): SENDs are spread over time, written
//! at most a millisecond's worth at a time, without receipts.
//! Either way the publisher stops at the end of the window and closes with DISCONNECT +
//! receipt, which confirms that the server has processed every SEND.

use std::sync::atomic::Ordering;
use std::time::Duration;

use crate::body::{self, now_ns, Stamp};
use crate::conn::{Conn, LoadError, RECEIPT_TIMEOUT};
use crate::Shared;

/// Write when this much is buffered (and always before waiting or sleeping).
const FLUSH_AT: usize = 128 * 1024;
/// Paced mode wakes at most once per tick and sends what is due: above 1000 msg/s per
/// publisher that is a small burst per millisecond instead of a wake-up per message.
const PACE_TICK_NS: u64 = 1_000_000;
/// Paced mode never catches up by more than this many messages in one burst.
const MAX_BURST: u64 = 1000;

pub struct PublishSpec {
    pub id: u32,
    pub destination: String,
    pub payload: usize,
    /// Messages per second for this publisher; 0 = unbounded.
    pub rate: f64,
    pub receipt_every: u64,
}

/// What one publisher sent. Its window messages are the sequence numbers
/// `first_window_seq..end_seq`.
#[derive(Clone, Copy, Debug, Default)]
pub struct Published {
    pub first_window_seq: u64,
    pub end_seq: u64,
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
        let head = format!("SEND\ndestination:{}\n", spec.destination).into_bytes();
        let tail = format!("content-length:{}\n\n", spec.payload).into_bytes();
        let body = body::template(spec.payload);
        Sender { conn, spec, head, tail, body, seq: 0, first_window_seq: None }
    }

    /// Appends one SEND stamped now; `false` (nothing appended) once the window has ended.
    fn push(&mut self, shared: &Shared, receipt: Option<&str>) -> bool {
        let t = now_ns();
        if t >= shared.window.end_ns {
            return false;
        }
        if self.first_window_seq.is_none() && t >= shared.window.start_ns {
            self.first_window_seq = Some(self.seq);
        }
        body::write(&mut self.body, Stamp { publisher: self.spec.id, seq: self.seq, sent_ns: t });
        let w = &mut self.conn.wr;
        w.extend_from_slice(&self.head);
        if let Some(r) = receipt {
            w.extend_from_slice(b"receipt:");
            w.extend_from_slice(r.as_bytes());
            w.push(b'\n');
        }
        w.extend_from_slice(&self.tail);
        w.extend_from_slice(&self.body);
        w.push(0);
        self.seq += 1;
        true
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
                let r = (i + 1 == k).then(|| format!("s{}", self.seq));
                if !self.push(shared, r.as_deref()) {
                    break;
                }
                receipt = r;
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
                if !self.push(shared, None) {
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
}

/// Runs one publisher to the end of the window.
///
/// # Errors
/// Socket errors, an ERROR frame, or a receipt not arriving within 30 s.
pub fn publish(conn: Conn, spec: PublishSpec, shared: &Shared) -> Result<Published, LoadError> {
    let paced = spec.rate > 0.0;
    let mut s = Sender::new(conn, spec);
    if paced {
        s.run_paced(shared)?;
    } else {
        s.run_unbounded(shared)?;
    }
    let published = Published { first_window_seq: s.first_window_seq.unwrap_or(s.seq), end_seq: s.seq };
    s.conn.disconnect(RECEIPT_TIMEOUT)?;
    Ok(published)
}
