//! The reader: socket → decoder → session, one read batch at a time.
use super::write::{OUTPUT_PAUSE_BYTES, OUTPUT_RESUME_BYTES};
use super::Conn;
use crate::engine::metrics::Metrics;
use crate::engine::Core;
use crate::stomp::error::TooLarge;
use crate::stomp::{Decoded, Decoder, Limits, PartialShare, WireError};
use bytes::BytesMut;
use futures_lite::AsyncReadExt;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Smallest and largest read (bytes).
const MIN_READ: usize = 4096;
const MAX_READ: usize = 256 * 1024;
/// What a connection with nothing to read waits with: a buffer this size inside the reader's
/// future instead of a [`MIN_READ`] allocation (issue 19: idle memory per connection). Most
/// connections are idle most of the time, and a frame that wakes one (an ACK, a heart-beat, a
/// small SEND) usually fits.
const IDLE_READ: usize = 128;

/// Frames waiting for their place in the receipt order above which the reader stops reading.
/// A receipted SEND whose delivery is parked behind a full subscriber holds its receipt up to
/// the 2 s slow-subscriber grace (`crate::delivery`), and every later receipt waits behind it:
/// this is what paces a publisher that pipelines receipted frames without waiting for them.
pub const RECEIPTS_OWED_PAUSE: usize = 1024;
/// Once paused, reading resumes when the owed receipts are back under this.
const RECEIPTS_OWED_RESUME: usize = RECEIPTS_OWED_PAUSE / 2;

/// Back-pressure from output to input: while this connection's pending output is over
/// [`OUTPUT_PAUSE_BYTES`] or its owed receipts over [`RECEIPTS_OWED_PAUSE`], stop reading it
/// until both are back under their resume marks. Called once per read batch; a batch adds at
/// most what one read (`MAX_READ`) can ask for, so the bounds hold to within one batch.
async fn wait_for_output(conn: &Conn) {
    let over = |pause_bytes: usize, pause_receipts: usize| conn.wq.borrow().pending() > pause_bytes || conn.session.borrow().receipts_owed() > pause_receipts;
    if !over(OUTPUT_PAUSE_BYTES, RECEIPTS_OWED_PAUSE) {
        return;
    }
    while over(OUTPUT_RESUME_BYTES, RECEIPTS_OWED_RESUME) && !conn.stops_reading() {
        conn.output_drained.reset();
        // The writer wakes us after each write; the timer covers a receipt place that
        // completes without writing anything (and a close while paused).
        futures_lite::future::or(conn.output_drained.wait(), glommio::timer::sleep(Duration::from_millis(10))).await;
    }
}

pub async fn read_loop(core: &Rc<Core>, conn: &Rc<Conn>, rd: &mut super::stream::ReadHalf) {
    let mut rbuf = BytesMut::new();
    let limits = Limits { max_body: core.cfg.max_body_size, ..Limits::default() };
    let mut decoder = Decoder::new(limits);
    // What this connection holds of an unfinished frame, in the process-wide budget; over a
    // WebSocket, what tungstenite holds of a message still arriving counts too.
    let mut partial = PartialShare::new(&*core.shared.partial_frames);
    rd.set_ws_budget(|| {
        // What tungstenite holds below the decoder: a share of its own, owned by the
        // WebSocket (given back when it is dropped).
        let mut share = PartialShare::new(Arc::clone(&core.shared.partial_frames));
        let budget = core.cfg.partial_frames_budget;
        Box::new(move |now| share.update(now, budget))
    });
    // Read size adapts: a read that fills the buffer means more is waiting, so the next one is
    // larger (fewer syscalls under load); an idle connection holds no buffer at all.
    let mut read_size = MIN_READ;
    // Whether the last read left the socket empty (it did not fill its buffer).
    let mut drained = true;
    let mut idle = [0u8; IDLE_READ];
    'read: loop {
        // The last read emptied the socket and left no partial frame: wait without a buffer
        // of our own (the old one goes back to the allocator, or to the frames still using
        // it), and take one once bytes have come. The decoder's header list and the action
        // list go to the core's spares meanwhile.
        if rbuf.is_empty() && drained {
            rbuf = BytesMut::new();
            decoder.park();
            conn.park();
            let Some(n) = read_outcome(core, conn, rd.read(&mut idle).await) else { break };
            drained = n < IDLE_READ;
            // Sized to what came when that was all: what the session keeps of these frames
            // (a subscription's destination and id, say) shares this allocation, so an idle
            // subscriber pins a few dozen bytes rather than a whole read buffer.
            rbuf.reserve(if drained { n } else { MIN_READ });
            rbuf.extend_from_slice(&idle[..n]);
            super::Counters::add(&conn.counters().bytes_in, n as u64);
        } else {
            if rbuf.capacity() - rbuf.len() < read_size / 2 {
                rbuf.reserve(read_size.max(rbuf.len()));
            }
            let start = rbuf.len();
            let room = rbuf.capacity() - start;
            rbuf.resize(start + room, 0);
            let read = rd.read(&mut rbuf[start..]).await;
            let Some(n) = read_outcome(core, conn, read) else { break };
            rbuf.truncate(start + n);
            super::Counters::add(&conn.counters().bytes_in, n as u64);
            // A read that fills the buffer means more is waiting: the next one is larger.
            drained = n < room;
            read_size = if drained { MIN_READ } else { (read_size * 2).min(MAX_READ) };
        }
        conn.last_read.set(Instant::now());
        loop {
            // Matched by reference: the frame is handled where `decode` built it, not moved.
            let decoded = decoder.decode(&mut rbuf);
            match &decoded {
                Ok(None) => break,
                Ok(Some(Decoded::HeartBeat)) => {}
                Ok(Some(Decoded::Frame(frame))) => {
                    Metrics::add(&core.metrics.frames_in, 1);
                    super::Counters::add(&conn.counters().frames_in, 1);
                    // A bug in frame handling must cost this connection, not the core (and
                    // every other connection on it): contain the panic, answer `internal
                    // error`, close.
                    let handled = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| conn.on_frame(core, frame, &mut decoder)));
                    let keep_going = handled.unwrap_or_else(|_| {
                        tracing::error!(core = %core.id, conn = conn.id.0, "internal error while handling a frame; closing the connection");
                        conn.fail(core, WireError::Internal, None);
                        false
                    });
                    core.drain_local();
                    if !keep_going || conn.stops_reading() {
                        break 'read;
                    }
                }
                Err(e) => {
                    conn.fail(core, decoder.wire_error(*e), decoder.error_receipt().cloned());
                    break 'read;
                }
            }
        }
        // What is left in the buffer is the frame not complete yet (issue 13's budget).
        if partial.update(rbuf.len(), core.cfg.partial_frames_budget) {
            conn.fail(core, WireError::FrameTooLarge(TooLarge::PartialFrames(core.cfg.partial_frames_budget)), None);
            break 'read;
        }
        // One Settle per subscription for the whole batch's ACKs (see session::PendingSettle).
        conn.with_session(core, |s, out| s.end_of_batch(out));
        core.drain_local();
        // Back-pressure: while a core cannot keep up with what another sends it (or, with a
        // remote array, this core's egress with what it forwards), stop reading from clients
        // rather than queueing or dropping without bound.
        while core.readers_must_pause() && !conn.stops_reading() {
            glommio::timer::sleep(Duration::from_millis(1)).await;
        }
        wait_for_output(conn).await;
        // A socket that always has data would keep this task running forever (a ready read
        // never yields): let the writers and other connections run between batches.
        futures_lite::future::yield_now().await;
    }
}

/// The bytes a read brought, or `None` when reading is over: EOF, a dead connection, or an
/// error. A read error ends the connection exactly like EOF, except a WebSocket message over
/// the size limit or the partial-frames budget, which the client is told about as any frame
/// too large.
fn read_outcome(core: &Rc<Core>, conn: &Rc<Conn>, read: std::io::Result<usize>) -> Option<usize> {
    let n = match read {
        Ok(n) => n,
        Err(e) if crate::ws::is_too_large(&e) => {
            conn.fail(core, WireError::FrameTooLarge(TooLarge::Body(core.cfg.max_body_size)), None);
            return None;
        }
        Err(e) if crate::ws::is_over_budget(&e) => {
            conn.fail(core, WireError::FrameTooLarge(TooLarge::PartialFrames(core.cfg.partial_frames_budget)), None);
            return None;
        }
        Err(_) => 0,
    };
    (n > 0 && conn.state.get() != super::State::Dead).then_some(n)
}
