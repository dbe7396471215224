//! Fuzzes the session ring: the wire bytes are decoded as a connection's reader decodes them,
//! and every frame goes to a pure `Session`, as the connection hands it over. The first input
//! byte picks how the array answers (bit 0: complete each operation at once, else fail it; bit
//! 1: answer in reverse order). Whatever the frames, the session must not panic, must write
//! nothing after an ERROR or a close, and must owe nothing once every operation is answered.
#![no_main]

use bytes::{Bytes, BytesMut};
use libfuzzer_sys::fuzz_target;
use std::cell::Cell;
use std::sync::Arc;
use stompgate::config::Config;
use stompgate::session::{Action, Host, Session};
use stompgate::stomp::{Decoded, Decoder, Limits};

struct FuzzHost(Cell<u64>);

impl Host for FuzzHost {
    fn open_connections(&self) -> usize {
        1
    }
    fn new_message_id(&self) -> Bytes {
        self.0.set(self.0.get() + 1);
        Bytes::from(self.0.get().to_string())
    }
    fn now_ns(&self) -> i64 {
        1_700_000_000_000_000_000
    }
}

/// Checks one batch of actions: no frame is written after ERROR or Close (giving back what the
/// connection held still is). Collects the tokens to answer.
fn check(actions: &[Action], closed: &mut bool, tokens: &mut Vec<u64>) {
    for a in actions {
        let writes = matches!(a, Action::Connected { .. } | Action::Receipt(_) | Action::Error { .. } | Action::Close);
        assert!(!(*closed && writes), "{a:?} after the connection was closed");
        match a {
            Action::Error { .. } | Action::Close => *closed = true,
            Action::Array { done: Some(t), .. } => tokens.push(*t),
            _ => {}
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, wire)) = data.split_first() else { return };
    let host = FuzzHost(Cell::new(0));
    let cfg = Config { max_connections: 0, ..Config::default() };
    let mut session = Session::new(Arc::new(cfg), Bytes::from_static(b"stompgate-0-1"));
    let mut decoder = Decoder::new(Limits { max_body: 64 * 1024, ..Limits::default() });
    let mut buf = BytesMut::from(wire);
    let (mut closed, mut tokens) = (false, Vec::new());
    loop {
        let frame = match decoder.decode(&mut buf) {
            Ok(Some(Decoded::Frame(f))) => f,
            Ok(Some(Decoded::HeartBeat)) => continue,
            Ok(None) | Err(_) => break,
        };
        let mut out = Vec::new();
        let go = session.handle(&frame, &host, &mut out);
        for a in &out {
            if let Action::Connected { version, .. } = a {
                decoder.set_version(*version);
            }
        }
        check(&out, &mut closed, &mut tokens);
        let mut out = Vec::new();
        session.end_of_batch(&mut out);
        check(&out, &mut closed, &mut tokens);
        if !go {
            break;
        }
    }
    let mut out = Vec::new();
    session.release(&mut out);
    check(&out, &mut closed, &mut tokens);
    if mode & 2 != 0 {
        tokens.reverse();
    }
    for t in tokens {
        let mut out = Vec::new();
        if mode & 1 != 0 {
            session.completed(t, &mut out);
        } else {
            session.failed(t, &mut out);
        }
        let mut more = Vec::new();
        check(&out, &mut closed, &mut more);
        assert!(more.is_empty(), "answering a token submitted new work: {out:?}");
    }
    assert!(!session.owes_frames(), "every operation answered, yet frames are still owed");
});
