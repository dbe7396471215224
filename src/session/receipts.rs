//! RECEIPTs in frame order. Every frame that waits for the array (a receipted SEND, SUBSCRIBE,
//! UNSUBSCRIBE, ACK, COMMIT, DISCONNECT) takes a token here; the array completes tokens in any
//! order, but a RECEIPT is written only once every receipt before it is written too. An ERROR
//! caused by a later frame waits behind them as well (the earlier frames took effect and their
//! receipts are owed), and so does the close after DISCONNECT.
use crate::stomp::WireError;
use bytes::Bytes;
use std::collections::VecDeque;

/// What the head of the queue asks the connection to write.
#[derive(Debug, PartialEq, Eq)]
pub enum Due {
    Receipt(Bytes),
    /// ERROR (with the failing frame's receipt id), then close.
    Error(WireError, Option<Bytes>),
    /// Close once everything before is written (DISCONNECT).
    Close,
}

struct Pending {
    token: u64,
    receipt: Option<Bytes>,
    waiting: bool,
    disconnect: bool,
    error: Option<(WireError, Option<Bytes>)>,
}

#[derive(Default)]
pub struct Receipts {
    queue: VecDeque<Pending>,
    next_token: u64,
}

impl Receipts {
    /// Queues a receipt (or, with `None`, only a place in the order) and returns its token.
    /// `waiting`: it is written only after [`Receipts::complete`] for the token.
    pub fn expect(&mut self, receipt: Option<Bytes>, waiting: bool, disconnect: bool) -> u64 {
        self.next_token += 1;
        let token = self.next_token;
        self.queue.push_back(Pending { token, receipt, waiting, disconnect, error: None });
        token
    }

    /// Queues an ERROR behind the receipts still owed.
    pub fn expect_error(&mut self, error: WireError, receipt: Option<Bytes>) {
        self.expect(None, false, false);
        self.queue.back_mut().expect("just pushed").error = Some((error, receipt));
    }

    /// The operation behind `token` took effect.
    pub fn complete(&mut self, token: u64) {
        if let Some(p) = self.queue.iter_mut().find(|p| p.token == token) {
            p.waiting = false;
        }
    }

    /// The operation behind `token` failed for good: its place in the order becomes ERROR
    /// `internal error` carrying its receipt id.
    pub fn fail(&mut self, token: u64) {
        self.fail_with(token, WireError::Internal);
    }

    /// The operation behind `token` was refused with `error`.
    pub fn fail_with(&mut self, token: u64, error: WireError) {
        if let Some(p) = self.queue.iter_mut().find(|p| p.token == token) {
            let receipt = p.receipt.take();
            p.waiting = false;
            p.error = Some((error, receipt));
        }
    }

    pub fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    /// Places still held in the order (receipts and closes owed).
    pub fn len(&self) -> usize {
        self.queue.len()
    }

    /// Takes everything now due at the head of the queue, in order. After an ERROR nothing
    /// more is due: the queue is cleared.
    pub fn take_due(&mut self, due: &mut Vec<Due>) {
        while self.queue.front().is_some_and(|p| !p.waiting) {
            let p = self.queue.pop_front().expect("front exists");
            if let Some(r) = p.receipt {
                due.push(Due::Receipt(r));
            }
            if let Some((err, receipt)) = p.error {
                due.push(Due::Error(err, receipt));
                self.queue.clear();
                return;
            }
            if p.disconnect {
                due.push(Due::Close);
            }
        }
    }

    pub fn clear(&mut self) {
        self.queue.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stomp::error::Malformed;

    fn due(r: &mut Receipts) -> Vec<Due> {
        let mut d = Vec::new();
        r.take_due(&mut d);
        d
    }

    #[test]
    fn receipts_are_written_in_frame_order_whatever_order_work_completes_in() {
        let mut r = Receipts::default();
        let a = r.expect(Some(Bytes::from_static(b"a")), true, false);
        let b = r.expect(Some(Bytes::from_static(b"b")), true, false);
        r.expect(Some(Bytes::from_static(b"c")), false, false);
        r.complete(b);
        assert_eq!(due(&mut r), vec![], "b and c wait behind a");
        r.complete(a);
        assert_eq!(due(&mut r), vec![Due::Receipt("a".into()), Due::Receipt("b".into()), Due::Receipt("c".into())]);
        assert!(r.is_empty());
    }

    #[test]
    fn an_error_waits_behind_owed_receipts_and_ends_the_queue() {
        let mut r = Receipts::default();
        let a = r.expect(Some(Bytes::from_static(b"a")), true, false);
        r.expect_error(WireError::MalformedFrame(Malformed::ServerFrame), Some(Bytes::from_static(b"x")));
        assert_eq!(due(&mut r), vec![]);
        r.complete(a);
        assert_eq!(due(&mut r), vec![Due::Receipt("a".into()), Due::Error(WireError::MalformedFrame(Malformed::ServerFrame), Some("x".into()))]);
        assert!(r.is_empty());
    }

    #[test]
    fn a_failed_operation_becomes_internal_error_with_its_receipt_id() {
        let mut r = Receipts::default();
        let a = r.expect(Some(Bytes::from_static(b"a")), true, false);
        r.expect(Some(Bytes::from_static(b"b")), false, false);
        r.fail(a);
        assert_eq!(due(&mut r), vec![Due::Error(WireError::Internal, Some("a".into()))]);
        assert!(r.is_empty(), "nothing after the ERROR");
    }

    #[test]
    fn disconnect_closes_after_its_receipt() {
        let mut r = Receipts::default();
        let d = r.expect(Some(Bytes::from_static(b"bye")), true, true);
        r.complete(d);
        assert_eq!(due(&mut r), vec![Due::Receipt("bye".into()), Due::Close]);
    }
}
