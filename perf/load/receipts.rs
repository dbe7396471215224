//! A publisher's pipelined receipt window (`--receipt-window N`): every SEND carries
//! `receipt:s<seq>`, and SEND `seq` may go out only once the RECEIPT of SEND `seq - N` is in, so
//! at most N are outstanding. (With RECEIPTs in order, as STOMP servers send them on one
//! connection, that is exactly "N outstanding"; a server answering out of order gets fewer.)
//! Each RECEIPT is timed against its SEND's stamp: the SEND -> RECEIPT latency of the window's
//! SENDs.
//!
//! Fixed-size state, no allocation per message: a slot per window position holding the
//! outstanding SEND's sequence number and send time.

use hdrhistogram::Histogram;

use crate::conn::LoadError;
use crate::stomp::Frame;
use crate::track::{latency_histogram, Window};

/// What the RECEIPTs of one publisher's window SENDs showed.
#[derive(Clone, Debug)]
pub struct Receipted {
    /// Window SENDs (send stamp inside the window) whose RECEIPT arrived.
    pub in_window: u64,
    /// Their SEND -> RECEIPT latency, ns.
    pub latency: Histogram<u64>,
}

#[derive(Clone, Copy)]
struct Slot {
    seq: u64,
    sent_ns: u64,
}

pub struct ReceiptWindow {
    /// Indexed by `seq % len`; `None` = free.
    slots: Vec<Option<Slot>>,
    outstanding: usize,
    window: Window,
    receipted: Receipted,
}

impl ReceiptWindow {
    pub fn new(size: usize, window: Window) -> ReceiptWindow {
        ReceiptWindow { slots: vec![None; size.max(1)], outstanding: 0, window, receipted: Receipted { in_window: 0, latency: latency_histogram() } }
    }

    /// SEND `seq` may go out now.
    pub fn has_room_for(&self, seq: u64) -> bool {
        self.slots[self.index(seq)].is_none()
    }

    /// SEND `seq`, stamped `sent_ns`, went out with `receipt:s<seq>`.
    pub fn sent(&mut self, seq: u64, sent_ns: u64) {
        let i = self.index(seq);
        debug_assert!(self.slots[i].is_none(), "SEND {seq} sent without room");
        self.slots[i] = Some(Slot { seq, sent_ns });
        self.outstanding += 1;
    }

    pub fn outstanding(&self) -> usize {
        self.outstanding
    }

    /// Takes one frame read on the publisher's connection at `now_ns`: a RECEIPT frees its
    /// SEND's slot and is timed.
    ///
    /// # Errors
    /// An ERROR frame, any frame but RECEIPT, or a RECEIPT for no outstanding SEND.
    pub fn on_frame(&mut self, f: &Frame<'_>, now_ns: u64, context: &str) -> Result<(), LoadError> {
        if !f.is(b"RECEIPT") {
            return Err(crate::conn::unexpected(context, f));
        }
        let id = f.header(b"receipt-id").unwrap_or(b"");
        let slot = id.strip_prefix(b"s").and_then(parse_u64).and_then(|seq| {
            let i = self.index(seq);
            self.slots[i].filter(|s| s.seq == seq).map(|s| (i, s))
        });
        let Some((i, s)) = slot else {
            return Err(LoadError::Protocol {
                context: context.to_owned(),
                text: format!("RECEIPT {} answers no outstanding SEND", String::from_utf8_lossy(id)),
            });
        };
        self.slots[i] = None;
        self.outstanding -= 1;
        if self.window.contains(s.sent_ns) {
            self.receipted.in_window += 1;
            let _ = self.receipted.latency.record(now_ns.saturating_sub(s.sent_ns).max(1));
        }
        Ok(())
    }

    pub fn into_receipted(self) -> Receipted {
        self.receipted
    }

    fn index(&self, seq: u64) -> usize {
        (seq % self.slots.len() as u64) as usize
    }
}

fn parse_u64(v: &[u8]) -> Option<u64> {
    if v.is_empty() || v.len() > 19 {
        return None;
    }
    v.iter().try_fold(0u64, |acc, &b| b.is_ascii_digit().then(|| acc * 10 + u64::from(b - b'0')))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stomp::Decoder;

    fn receipt(id: &str) -> Vec<u8> {
        format!("RECEIPT\nreceipt-id:{id}\n\n\0").into_bytes()
    }

    #[test]
    fn a_slot_frees_only_for_its_own_receipt() {
        let mut w = ReceiptWindow::new(2, Window { start_ns: 100, end_ns: 200 });
        w.sent(0, 50);
        w.sent(1, 150);
        assert!(!w.has_room_for(2));
        let mut dec = Decoder::default();
        let bytes = receipt("s1");
        let (f, _) = dec.decode(&bytes).unwrap().unwrap();
        w.on_frame(&f, 170, "t").unwrap();
        assert!(w.has_room_for(3) && !w.has_room_for(2));
        let bytes = receipt("s1");
        let (f, _) = dec.decode(&bytes).unwrap().unwrap();
        assert!(w.on_frame(&f, 171, "t").is_err(), "a second RECEIPT for s1 answers nothing outstanding");
        let bytes = receipt("s0");
        let (f, _) = dec.decode(&bytes).unwrap().unwrap();
        w.on_frame(&f, 180, "t").unwrap();
        assert_eq!(w.outstanding(), 0);
        let r = w.into_receipted();
        assert_eq!(r.in_window, 1, "SEND 0 was stamped before the window");
        assert_eq!(r.latency.max(), 20);
    }
}
