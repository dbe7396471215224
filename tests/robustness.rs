//! Property: whatever bytes a client sends, the gateway answers with a well-formed ERROR
//! (`malformed frame` or `frame too large`) and closes, or simply closes when the client does —
//! it never hangs, never delivers a partial or lying frame, and keeps serving every other
//! client. Frame limits (header block 64 KiB, 128 headers, body MaxBodySize) are enforced with
//! `frame too large` + close; frames cut at any byte boundary or pipelined many to a write are
//! processed exactly as if sent whole.
//!
//! Setup: an in-process gateway on two cores (`max_body_size = 1024` where a test says so);
//! garbage from a fixed-seed xorshift generator; a bystander subscriber proves nothing leaked.
use crate::common;
use common::props::*;
use common::*;
use std::time::Duration;

/// xorshift64*: deterministic bytes for a seed.
fn garbage(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x >> 12;
            x ^= x << 25;
            x ^= x >> 27;
            (x.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 56) as u8
        })
        .collect()
}

/// After `bytes` and our half-close, the server either sends one ERROR with `allowed` message
/// and closes, or closes without a frame. Returns the ERROR message, if any.
fn error_or_close(c: &mut Client, allowed: &[&str]) -> Option<String> {
    c.shutdown_write();
    let first = c.frame_within(WAIT);
    let message = first.map(|f| {
        assert_eq!(f.command, "ERROR", "{:?}", String::from_utf8_lossy(&f.raw));
        let m = f.header("message").unwrap().to_string();
        assert!(allowed.contains(&m.as_str()), "unexpected ERROR message {m:?}");
        m
    });
    assert!(c.frame_within(WAIT).is_none(), "a frame after the ERROR");
    assert!(c.saw_eof(), "server neither answered nor closed");
    message
}

#[test]
fn random_garbage_gets_malformed_frame_or_close_and_server_keeps_serving() {
    let server = TestServer::start();
    let dest = format!("/topic/{}", unique("bystander"));
    let mut bystander = server.connected();
    subscribe(&mut bystander, "b", &dest, &[]);
    for seed in 1..=12u64 {
        let mut c = if seed % 2 == 0 { server.connected() } else { server.client() };
        c.send_raw_lossy(&garbage(seed, 4096));
        let m = error_or_close(&mut c, &["malformed frame", "frame too large"]);
        // Random bytes hit an LF within the first few hundred, and no command is random.
        assert_eq!(m.as_deref(), Some("malformed frame"), "seed {seed}");
    }
    bystander.no_frame(QUIET);
    assert_alive(&mut bystander);
    assert_server_serves(&server);
}

#[test]
fn garbage_after_a_valid_command_line_never_hangs() {
    let server = TestServer::start();
    for (i, command) in ["SEND", "SUBSCRIBE", "ACK", "BEGIN", "SEND", "UNSUBSCRIBE"].iter().enumerate() {
        for seed in 0..4u64 {
            let mut c = server.connected();
            let mut bytes = format!("{command}\n").into_bytes();
            bytes.extend(garbage(100 + 10 * i as u64 + seed, 2048));
            c.send_raw_lossy(&bytes);
            error_or_close(&mut c, &["malformed frame", "frame too large", "invalid destination", "unknown transaction", "unknown subscription"]);
        }
    }
    assert_server_serves(&server);
}

#[test]
fn garbage_header_lines_are_malformed() {
    let server = TestServer::start();
    for (head, rule) in [
        (&b"SEND\nno colon here\n\n\0"[..], Malformed::HeaderWithoutColon),
        (b"SEND\n:empty-name\n\n\0", Malformed::EmptyHeaderName),
        (b"SEND\ndestination:/topic/x\ncontent-length:ten\n\nbody\0", Malformed::BadContentLength),
        (b"SEND\ndestination:/topic/x\ncontent-length:-1\n\nbody\0", Malformed::BadContentLength),
    ] {
        let mut c = server.connected();
        c.send_raw(head);
        let f = expect_error_close(&mut c, "malformed frame");
        assert_raw(&f, &error_bytes(WireError::MalformedFrame(rule), None));
    }
}

#[test]
fn truncated_frame_then_client_close_leaves_server_fine() {
    let server = TestServer::start();
    let dest = format!("/topic/{}", unique("trunc"));
    let mut bystander = server.connected();
    subscribe(&mut bystander, "b", &dest, &[]);
    for cut in [b"SEN".len(), b"SEND\ndestination:/to".len(), format!("SEND\ndestination:{dest}\n\nhalf a bo").len()] {
        let mut c = server.connected();
        let whole = frame_bytes("SEND", &[("destination", &dest)], b"half a body");
        c.send_raw(&whole[..cut]);
        std::thread::sleep(Duration::from_millis(20));
        drop(c);
    }
    // A truncated frame with content-length, then close.
    let mut c = server.connected();
    c.send_raw(format!("SEND\ndestination:{dest}\ncontent-length:100\n\nshort").as_bytes());
    c.shutdown_write();
    assert!(c.frame_within(WAIT).is_none());
    assert!(c.saw_eof());
    bystander.no_frame(QUIET);
    assert_alive(&mut bystander);
    assert_server_serves(&server);
}

#[test]
fn lying_content_length_is_malformed_frame() {
    let server = TestServer::start();
    let dest = format!("/topic/{}", unique("lie"));
    let mut bystander = server.connected();
    subscribe(&mut bystander, "b", &dest, &[]);
    let mut c = server.connected();
    // content-length:10 but a 3-byte body: byte 10 of what follows is 'k', not NUL.
    c.send_raw(format!("SEND\ndestination:{dest}\ncontent-length:10\n\nabc\0efghijklmnop\0").as_bytes());
    let f = expect_error_close(&mut c, "malformed frame");
    assert_raw(&f, &error_bytes(WireError::MalformedFrame(Malformed::NoNulAfterContentLength), None));
    bystander.no_frame(QUIET);
    assert_alive(&mut bystander);
}

#[test]
fn header_block_over_64_kib_is_frame_too_large() {
    let server = TestServer::start();
    let mut c = server.connected();
    let big = "h".repeat(70 * 1024);
    c.send_raw_lossy(&frame_bytes("SUBSCRIBE", &[("id", "s"), ("destination", "/topic/x"), ("x-big", &big)], b""));
    let f = expect_error_close(&mut c, "frame too large");
    assert_raw(&f, &error_bytes(WireError::FrameTooLarge(TooLarge::HeaderBlock(65536)), None));
    // A header block that never ends: refused once 64 KiB are buffered, not waited on.
    let mut c = server.connected();
    c.send_raw_lossy(format!("SEND\ndestination:/topic/x\nx-endless:{big}").as_bytes());
    expect_error_close(&mut c, "frame too large");
    // Many lines adding up to over 64 KiB.
    let mut c = server.connected();
    let line = "v".repeat(1000);
    let lines: Vec<(&str, &str)> = (0..70).map(|_| ("x-same", line.as_str())).collect();
    c.send_raw_lossy(&frame_bytes("SUBSCRIBE", &lines, b""));
    expect_error_close(&mut c, "frame too large");
}

#[test]
fn header_block_just_under_64_kib_is_accepted() {
    let server = TestServer::start();
    let mut c = server.connected();
    // "SUBSCRIBE\n" + "id:s\n" + "destination:/topic/xyz\n" + "x-big:" + value + "\n" + "receipt:r\n" + "\n"
    let fixed = "SUBSCRIBE\nid:s\ndestination:/topic/xyz\nx-big:\nreceipt:r\n\n".len();
    let big = "h".repeat(64 * 1024 - fixed);
    send_with_receipt(&mut c, "SUBSCRIBE", &[("id", "s"), ("destination", "/topic/xyz"), ("x-big", &big)], b"", "r");
}

#[test]
fn more_than_128_headers_is_frame_too_large() {
    let server = TestServer::start();
    // 128 headers pass (repeats are not extra tags, so only the header limit is in play).
    let mut c = server.connected();
    let dest = format!("/topic/{}", unique("many"));
    let mut h: Vec<(&str, &str)> = vec![("destination", &dest), ("receipt", "r128")];
    h.extend((0..126).map(|_| ("x-rep", "v")));
    assert_eq!(h.len(), 128);
    c.send("SEND", &h, b"x");
    assert_raw(&c.frame(), b"RECEIPT\nreceipt-id:r128\ncontent-length:0\n\n\0");
    // 129 do not.
    h.push(("x-rep", "v"));
    c.send("SEND", &h, b"x");
    let f = expect_error_close(&mut c, "frame too large");
    // The receipt header was parsed before the limit was hit, so the ERROR echoes it.
    assert_raw(&f, &error_bytes(WireError::FrameTooLarge(TooLarge::HeaderCount(128)), Some("r128")));
    // On any command.
    let mut c = server.connected();
    let h: Vec<(&str, &str)> = (0..129).map(|_| ("x-rep", "v")).collect();
    c.send("SUBSCRIBE", &h, b"");
    expect_error_close(&mut c, "frame too large");
}

#[test]
fn body_over_max_body_size_is_frame_too_large() {
    let server = TestServer::start_with(|cfg| cfg.max_body_size = 1024);
    let dest = format!("/topic/{}", unique("body"));
    let mut bystander = server.connected();
    subscribe(&mut bystander, "b", &dest, &[]);
    let body = vec![b'b'; 2048];
    // With content-length: refused from the header alone.
    let mut c = server.connected();
    c.send_raw_lossy(&frame_bytes("SEND", &[("destination", &dest), ("content-length", "2048")], &body));
    let f = expect_error_close(&mut c, "frame too large");
    assert_raw(&f, &error_bytes(WireError::FrameTooLarge(TooLarge::Body(1024)), None));
    // Without: refused once more than 1024 bytes arrived without a NUL.
    let mut c = server.connected();
    c.send_raw_lossy(&frame_bytes("SEND", &[("destination", &dest)], &body));
    expect_error_close(&mut c, "frame too large");
    // 1025 is one too many.
    let mut c = server.connected();
    c.send_raw_lossy(&frame_bytes("SEND", &[("destination", &dest)], &body[..1025]));
    expect_error_close(&mut c, "frame too large");
    bystander.no_frame(QUIET);
}

#[test]
fn body_of_exactly_max_body_size_is_accepted() {
    let server = TestServer::start_with(|cfg| cfg.max_body_size = 1024);
    let dest = format!("/topic/{}", unique("body"));
    let mut sub = server.connected();
    subscribe(&mut sub, "b", &dest, &[]);
    let mut c = server.connected();
    let body = vec![b'b'; 1024];
    send_with_receipt(&mut c, "SEND", &[("destination", &dest), ("content-length", "1024")], &body, "r1");
    send_with_receipt(&mut c, "SEND", &[("destination", &dest)], &body, "r2");
    for _ in 0..2 {
        let m = sub.frame();
        assert_eq!(m.header("content-length"), Some("1024"));
        assert_eq!(m.body, body);
    }
}

/// A whole session's bytes: CONNECT, SUBSCRIBE, SEND with content-length and NULs in the body,
/// SEND without, DISCONNECT — each with a receipt, with heart-beat EOLs between some frames.
fn session_bytes(dest: &str) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend(frame_bytes("CONNECT", &[("accept-version", "1.2"), ("host", "localhost")], b""));
    out.extend(b"\n");
    out.extend(frame_bytes("SUBSCRIBE", &[("id", "s"), ("destination", &format!("{dest}/own")), ("receipt", "r-sub")], b""));
    out.extend(frame_bytes("SEND", &[("destination", dest), ("content-length", "5"), ("x-h", "a\\cb"), ("receipt", "r-1")], b"a\0b\0c"));
    out.extend(b"\r\n");
    out.extend(frame_bytes("SEND", &[("destination", dest), ("receipt", "r-2")], b"plain"));
    out.extend(frame_bytes("DISCONNECT", &[("receipt", "r-bye")], b""));
    out
}

/// Checks what the server answered to `session_bytes`, and what `watcher` (subscribed to
/// `dest`) received.
fn check_session(c: &mut Client, watcher: &mut Client, dest: &str) {
    let f = c.frame();
    assert_eq!(f.command, "CONNECTED", "{f:?}");
    for r in ["r-sub", "r-1", "r-2", "r-bye"] {
        assert_raw(&c.frame(), format!("RECEIPT\nreceipt-id:{r}\ncontent-length:0\n\n\0").as_bytes());
    }
    assert!(c.closed());
    let m1 = watcher.frame();
    let mid = m1.header("message-id").unwrap().to_string();
    assert_raw(&m1, format!("MESSAGE\ndestination:{dest}\nmessage-id:{mid}\nsubscription:w\nx-h:a\\cb\ncontent-length:5\n\na\0b\0c\0").as_bytes());
    let m2 = watcher.frame();
    assert_eq!(m2.header("content-length"), Some("5"));
    assert_eq!(m2.body, b"plain");
}

/// A subscriber on a fresh topic, and the topic.
fn watcher(server: &TestServer, name: &str) -> (Client, String) {
    let dest = format!("/topic/{}", unique(name));
    let mut w = server.connected();
    subscribe(&mut w, "w", &dest, &[]);
    (w, dest)
}

#[test]
fn frames_dribbled_one_byte_at_a_time_work() {
    let server = TestServer::start();
    let (mut w, dest) = watcher(&server, "dribble");
    let mut c = server.client();
    for b in session_bytes(&dest) {
        c.send_raw(&[b]);
        std::thread::sleep(Duration::from_micros(300));
    }
    check_session(&mut c, &mut w, &dest);
}

#[test]
fn frames_cut_into_any_piece_size_work() {
    let server = TestServer::start();
    for piece in [1000, 100, 10, 7, 5, 3, 2] {
        let (mut w, dest) = watcher(&server, "pieces");
        let mut c = server.client();
        for chunk in session_bytes(&dest).chunks(piece) {
            c.send_raw(chunk);
            std::thread::sleep(Duration::from_micros(200));
        }
        check_session(&mut c, &mut w, &dest);
    }
}

#[test]
fn two_hundred_pipelined_frames_are_all_processed() {
    let server = TestServer::start();
    let mut c = server.connected();
    let dest = format!("/topic/{}", unique("pipe"));
    let queue = format!("/queue/{}", unique("pipe"));
    let mut out = Vec::new();
    for i in 0..200 {
        let d = if i % 2 == 0 { &dest } else { &queue };
        out.extend(frame_bytes("SEND", &[("destination", d), ("receipt", &format!("r{i}"))], format!("m{i}").as_bytes()));
    }
    c.send_raw(&out);
    for i in 0..200 {
        assert_raw(&c.frame(), format!("RECEIPT\nreceipt-id:r{i}\ncontent-length:0\n\n\0").as_bytes());
    }
    // Every queue SEND took effect, in order.
    let mut q = server.connected();
    q.send("SUBSCRIBE", &[("id", "q"), ("destination", &queue)], b"");
    for i in (1..200).step_by(2) {
        let m = q.frame();
        assert_eq!(m.body_str(), format!("m{i}"));
    }
}

#[test]
fn abrupt_close_with_unread_server_output_leaves_server_fine() {
    // A client that pipelines work and vanishes without reading a byte.
    let server = TestServer::start();
    for _ in 0..5 {
        let mut c = server.connected();
        let dest = format!("/topic/{}", unique("vanish"));
        let mut out = frame_bytes("SUBSCRIBE", &[("id", "s"), ("destination", &dest)], b"");
        for i in 0..100 {
            out.extend(frame_bytes("SEND", &[("destination", &dest), ("receipt", &format!("r{i}"))], &[b'x'; 512]));
        }
        c.send_raw(&out);
        drop(c);
    }
    assert_server_serves(&server);
}
