//! STOMP over WebSocket (issue 17) with a real WebSocket client (tungstenite, blocking): the
//! handshake rules (path, Origin, plain HTTP, subprotocol choice, deadline), STOMP frames
//! split over and joined in messages, text/binary message choice, size limits, ping/pong and
//! the close handshake. The client is the suite's own (`common::Client` over a WebSocket,
//! `common::ws_client`); frames are built with `common::props::frame_bytes`.
use crate::common;
use common::props::frame_bytes;
use common::ws_client::retrying;
use common::{Client, TestServer, WAIT};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};
use tungstenite::Message;

/// A gateway with its WebSocket listener on a free loopback port, after `tweak`.
fn ws_server(tweak: impl FnOnce(&mut stompgate::config::Config)) -> (TestServer, SocketAddr) {
    let server = TestServer::start_with(|c| {
        c.ws_addr = Some("127.0.0.1:0".parse().unwrap());
        tweak(c);
    });
    let addr = server.server().ws_addr().expect("the WebSocket listener is bound");
    (server, addr)
}

/// Opens a WebSocket to `addr` at `path`, offering `protocols`; the handshake's response too.
fn open(
    addr: SocketAddr,
    path: &str,
    protocols: &[&str],
    origin: Option<&str>,
) -> Result<(Client, tungstenite::handshake::client::Response), tungstenite::Error> {
    Client::websocket(addr, path, protocols, origin)
}

/// Reads until the server closes the WebSocket; returns the close code it sent, if any.
fn close_code(c: &mut Client) -> Option<tungstenite::protocol::frame::coding::CloseCode> {
    loop {
        match c.ws().read() {
            Ok(Message::Close(frame)) => return frame.map(|f| f.code),
            Ok(_) => {}
            Err(e) => panic!("the WebSocket ended without a Close frame: {e}"),
        }
    }
}

/// Sends a raw HTTP request and returns the status code of the answer.
fn http_status(addr: SocketAddr, request: &str) -> u16 {
    let mut tcp = TcpStream::connect(addr).unwrap();
    tcp.set_read_timeout(Some(WAIT)).unwrap();
    tcp.write_all(request.as_bytes()).unwrap();
    let mut answer = Vec::new();
    let _ = tcp.read_to_end(&mut answer);
    let answer = String::from_utf8_lossy(&answer);
    let status = answer.split(' ').nth(1).unwrap_or_else(|| panic!("no HTTP answer: {answer:?}"));
    status.parse().unwrap()
}

const UPGRADE: &str =
    "Host: localhost\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n";

#[test]
fn the_highest_stomp_subprotocol_offered_is_answered() {
    let (_s, addr) = ws_server(|_| {});
    let (_c, r) = open(addr, "/ws", &["v10.stomp", "v11.stomp", "v12.stomp"], None).unwrap();
    assert_eq!(r.headers().get("Sec-WebSocket-Protocol").unwrap(), "v12.stomp");
    let (_c, r) = open(addr, "/ws", &["v10.stomp", "v11.stomp"], None).unwrap();
    assert_eq!(r.headers().get("Sec-WebSocket-Protocol").unwrap(), "v11.stomp");
}

#[test]
fn a_subprotocol_not_offered_is_never_answered() {
    let (_s, addr) = ws_server(|_| {});
    let request = format!("GET /ws HTTP/1.1\r\n{UPGRADE}Sec-WebSocket-Protocol: mqtt, v13.stomp\r\n\r\n");
    let mut tcp = TcpStream::connect(addr).unwrap();
    tcp.set_read_timeout(Some(WAIT)).unwrap();
    tcp.write_all(request.as_bytes()).unwrap();
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        assert_eq!(retrying(|| tcp.read(&mut byte)).unwrap(), 1, "the answer ended early: {:?}", String::from_utf8_lossy(&head));
        head.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&head).to_ascii_lowercase();
    assert!(head.starts_with("http/1.1 101"), "{head}");
    assert!(!head.contains("sec-websocket-protocol"), "no subprotocol was acceptable: {head}");
}

#[test]
fn a_client_offering_no_subprotocol_still_speaks_stomp() {
    let (_s, addr) = ws_server(|_| {});
    let (mut c, r) = open(addr, "/ws", &[], None).unwrap();
    assert!(r.headers().get("Sec-WebSocket-Protocol").is_none());
    let f = c.connect("1.2");
    assert_eq!(f.command, "CONNECTED", "{f:?}");
    assert_eq!(f.header("version"), Some("1.2"), "the version comes from CONNECT");
}

#[test]
fn a_wrong_path_gets_404() {
    let (_s, addr) = ws_server(|_| {});
    assert_eq!(http_status(addr, &format!("GET /other HTTP/1.1\r\n{UPGRADE}\r\n")), 404);
    assert!(open(addr, "/other", &[], None).is_err());
}

#[test]
fn a_configured_path_is_served_and_the_default_is_not() {
    let (_s, addr) = ws_server(|c| c.ws_path = "/stomp".into());
    assert_eq!(http_status(addr, &format!("GET /ws HTTP/1.1\r\n{UPGRADE}\r\n")), 404);
    let (mut c, _) = open(addr, "/stomp?x=1", &["v12.stomp"], None).unwrap();
    assert_eq!(c.connect("1.2").command, "CONNECTED");
}

#[test]
fn an_origin_not_allowed_gets_403_and_an_allowed_one_connects() {
    let (_s, addr) = ws_server(|c| c.ws_allowed_origins = vec!["https://app.example.com".into()]);
    assert_eq!(http_status(addr, &format!("GET /ws HTTP/1.1\r\n{UPGRADE}Origin: https://evil.example\r\n\r\n")), 403);
    let (mut c, _) = open(addr, "/ws", &["v12.stomp"], Some("https://app.example.com")).unwrap();
    assert_eq!(c.connect("1.2").command, "CONNECTED");
}

#[test]
fn a_plain_http_request_gets_426_and_garbage_gets_400() {
    let (_s, addr) = ws_server(|_| {});
    assert_eq!(http_status(addr, "GET /ws HTTP/1.1\r\nHost: localhost\r\n\r\n"), 426);
    assert_eq!(http_status(addr, &format!("GET /ws HTTP/1.1\r\n{}\r\n", UPGRADE.replace("Sec-WebSocket-Version: 13", "Sec-WebSocket-Version: 8"))), 400);
    assert_eq!(http_status(addr, "CONNECT\naccept-version:1.2\n\n\0\r\n\r\n"), 400, "STOMP bytes are not an HTTP request");
}

#[test]
fn a_handshake_not_completed_within_the_connect_timeout_is_closed() {
    let (_s, addr) = ws_server(|c| c.connect_timeout_s = 1);
    let mut tcp = TcpStream::connect(addr).unwrap();
    tcp.write_all(b"GET /ws HTTP/1.1\r\n").unwrap();
    tcp.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let started = Instant::now();
    let mut buf = [0u8; 64];
    let n = retrying(|| tcp.read(&mut buf)).expect("closed, not timed out");
    assert_eq!(n, 0, "closed without an answer");
    let waited = started.elapsed();
    assert!(waited >= Duration::from_millis(900), "closed after {waited:?}: before the 1 s deadline");
}

#[test]
fn events_reach_a_subscriber_over_websocket() {
    let (_s, addr) = ws_server(|_| {});
    let dest = format!("/topic/{}", common::unique("ws-ev"));
    let (mut sub, _) = open(addr, "/ws", &["v12.stomp"], None).unwrap();
    sub.connect("1.2");
    sub.send("SUBSCRIBE", &[("id", "1"), ("destination", &dest), ("receipt", "r1")], b"");
    assert_eq!(sub.frame().command, "RECEIPT");
    let (mut publ, _) = open(addr, "/ws", &["v12.stomp"], None).unwrap();
    publ.connect("1.2");
    publ.send("SEND", &[("destination", &dest), ("receipt", "s1")], b"hello over ws");
    assert_eq!(publ.frame().header("receipt-id"), Some("s1"));
    let m = sub.frame();
    assert_eq!(m.command, "MESSAGE");
    assert_eq!(m.body, b"hello over ws");
}

#[test]
fn a_frame_split_over_several_messages_is_reassembled() {
    let (_s, addr) = ws_server(|_| {});
    let dest = format!("/queue/{}", common::unique("ws-split"));
    let (mut c, _) = open(addr, "/ws", &["v12.stomp"], None).unwrap();
    c.connect("1.2");
    let frame = frame_bytes("SEND", &[("destination", &dest), ("receipt", "split")], b"in three pieces");
    for piece in [&frame[..5], &frame[5..20], &frame[20..]] {
        c.ws().send(Message::binary(piece.to_vec())).unwrap();
    }
    assert_eq!(c.frame().header("receipt-id"), Some("split"));
    c.send("SUBSCRIBE", &[("id", "1"), ("destination", &dest)], b"");
    assert_eq!(c.frame().body, b"in three pieces");
}

#[test]
fn several_frames_in_one_text_message_are_all_handled() {
    let (_s, addr) = ws_server(|_| {});
    let dest = format!("/queue/{}", common::unique("ws-joined"));
    let (mut c, _) = open(addr, "/ws", &["v12.stomp"], None).unwrap();
    let mut joined = frame_bytes("CONNECT", &[("accept-version", "1.2"), ("host", "localhost")], b"");
    for i in 0..3 {
        joined.extend(frame_bytes("SEND", &[("destination", &dest), ("receipt", &format!("r{i}"))], format!("m{i}").as_bytes()));
    }
    c.ws().send(Message::text(String::from_utf8(joined).unwrap())).unwrap();
    assert_eq!(c.frame().command, "CONNECTED");
    for i in 0..3 {
        assert_eq!(c.frame().header("receipt-id"), Some(format!("r{i}").as_str()));
    }
}

#[test]
fn utf8_frames_go_out_as_text_and_binary_bodies_as_binary_messages() {
    let (_s, addr) = ws_server(|_| {});
    let dest = format!("/queue/{}", common::unique("ws-kinds"));
    let (mut c, _) = open(addr, "/ws", &["v12.stomp"], None).unwrap();
    c.connect("1.2");
    let binary: Vec<u8> = vec![0xff, 0x00, 0xfe, 0x80];
    c.send("SEND", &[("destination", &dest), ("content-length", "4"), ("receipt", "b")], &binary);
    assert_eq!(c.frame().header("receipt-id"), Some("b"));
    c.kinds.clear();
    c.send("SUBSCRIBE", &[("id", "1"), ("destination", &dest)], b"");
    let m = c.frame();
    assert_eq!(m.body, binary, "the binary body arrives intact");
    assert_eq!(c.kinds, ["binary"], "a frame that is not UTF-8 is a binary message");
    c.kinds.clear();
    c.send("SEND", &[("destination", "/queue/other"), ("receipt", "héllo")], b"");
    assert_eq!(c.frame().header("receipt-id"), Some("héllo"));
    assert_eq!(c.kinds, ["text"], "a UTF-8 frame is a text message");
}

#[test]
fn a_message_over_the_size_limit_gets_frame_too_large() {
    let (_s, addr) = ws_server(|c| c.max_body_size = 1024);
    let (mut c, _) = open(addr, "/ws", &["v12.stomp"], None).unwrap();
    c.connect("1.2");
    // Over --max-body-size plus the headers' allowance: refused by the WebSocket layer before
    // it is buffered, answered like a STOMP frame too large.
    let too_big = vec![b'x'; 1024 + stompgate::ws::HEADERS_ALLOWANCE + 1];
    // The gateway may refuse and close before the whole message is written: the write's own
    // outcome does not matter, the ERROR that was sent before the close does.
    let _ = c.ws().send(Message::binary(too_big));
    let e = c.frame();
    assert_eq!(e.command, "ERROR", "{e:?}");
    assert_eq!(e.header("message"), Some("frame too large"));
}

#[test]
fn a_body_over_the_limit_in_one_message_gets_frame_too_large() {
    let (_s, addr) = ws_server(|c| c.max_body_size = 1024);
    let (mut c, _) = open(addr, "/ws", &["v12.stomp"], None).unwrap();
    c.connect("1.2");
    c.send("SEND", &[("destination", "/queue/x"), ("content-length", "2048")], &[b'y'; 2048]);
    let e = c.frame();
    assert_eq!(e.command, "ERROR", "{e:?}");
    assert_eq!(e.header("message"), Some("frame too large"));
}

/// A client WebSocket frame header (RFC 6455 §5.2): FIN or not, `opcode`, masked with an
/// all-zero key so the payload bytes go unchanged, declaring `len` payload bytes.
fn raw_frame_header(fin: bool, opcode: u8, len: u64) -> Vec<u8> {
    let mut h = vec![if fin { 0x80 | opcode } else { opcode }];
    match len {
        0..=125 => h.push(0x80 | len as u8),
        126..=0xffff => {
            h.push(0x80 | 126);
            h.extend((len as u16).to_be_bytes());
        }
        _ => {
            h.push(0x80 | 127);
            h.extend(len.to_be_bytes());
        }
    }
    h.extend([0, 0, 0, 0]);
    h
}

/// Writes raw bytes under the client's WebSocket (what tungstenite's API would not send);
/// errors are ignored, as the gateway may refuse and close while they are being written.
fn write_raw(c: &mut Client, bytes: &[u8]) {
    let _ = c.ws().get_mut().write_all(bytes);
}

#[test]
fn a_fragmented_message_adding_up_past_the_size_limit_gets_frame_too_large() {
    let (_s, addr) = ws_server(|c| c.max_body_size = 1024);
    let (mut c, _) = open(addr, "/ws", &["v12.stomp"], None).unwrap();
    c.connect("1.2");
    // Each fragment is far under the limit (--max-body-size + the headers' allowance, 67 KiB);
    // the message they make is not.
    let fragment = vec![b'x'; 16 * 1024];
    for i in 0..8u8 {
        let opcode = if i == 0 { 0x2 } else { 0x0 };
        write_raw(&mut c, &raw_frame_header(i == 7, opcode, fragment.len() as u64));
        write_raw(&mut c, &fragment);
    }
    let e = c.frame();
    assert_eq!(e.command, "ERROR", "{e:?}");
    assert_eq!(e.header("message"), Some("frame too large"));
    assert!(e.body_str().contains("--max-body-size (1024 bytes)"), "{e:?}");
}

#[test]
fn a_message_still_arriving_counts_in_the_partial_frames_budget() {
    // Over TCP the bytes of an unfinished STOMP frame count in --partial-frames-budget; over a
    // WebSocket tungstenite holds a message until it is whole, so those bytes must count too,
    // as they arrive: a message declared at 4 MiB (under the 8 MiB size limit) that has
    // delivered 512 KiB is refused at a 256 KiB budget, before it is complete.
    const BUDGET: usize = 256 * 1024;
    let (_s, addr) = ws_server(|c| {
        c.max_body_size = 8 * 1024 * 1024;
        c.partial_frames_budget = BUDGET;
    });
    // A message under the budget still passes whole.
    let (mut ok, _) = open(addr, "/ws", &["v12.stomp"], None).unwrap();
    ok.connect("1.2");
    let body = vec![b'b'; 200 * 1024];
    ok.send("SEND", &[("destination", "/topic/budget-ok"), ("receipt", "r1")], &body);
    assert_eq!(ok.frame().header("receipt-id"), Some("r1"));

    let (mut c, _) = open(addr, "/ws", &["v12.stomp"], None).unwrap();
    c.connect("1.2");
    write_raw(&mut c, &raw_frame_header(true, 0x2, 4 * 1024 * 1024));
    let chunk = vec![b'x'; 16 * 1024];
    for _ in 0..32 {
        write_raw(&mut c, &chunk);
    }
    let e = c.frame();
    assert_eq!(e.command, "ERROR", "{e:?}");
    assert_eq!(e.header("message"), Some("frame too large"));
    assert_eq!(e.body_str(), format!("frames still arriving on this core exceed --partial-frames-budget ({BUDGET} bytes)"));
    // The others go on.
    ok.send("SEND", &[("destination", "/topic/budget-ok"), ("receipt", "r2")], b"after");
    assert_eq!(ok.frame().header("receipt-id"), Some("r2"));
}

#[test]
fn an_error_ends_with_a_close_frame() {
    let (_s, addr) = ws_server(|_| {});
    let (mut c, _) = open(addr, "/ws", &["v12.stomp"], None).unwrap();
    c.connect("1.2");
    c.send("BOGUS", &[], b"");
    let e = c.frame();
    assert_eq!(e.command, "ERROR", "{e:?}");
    assert_eq!(e.header("message"), Some("malformed frame"));
    assert_eq!(close_code(&mut c), Some(tungstenite::protocol::frame::coding::CloseCode::Normal));
}

#[test]
fn a_ping_is_answered_with_a_pong() {
    let (_s, addr) = ws_server(|_| {});
    let (mut c, _) = open(addr, "/ws", &["v12.stomp"], None).unwrap();
    c.connect("1.2");
    c.ws().send(Message::Ping(b"are you there".to_vec().into())).unwrap();
    loop {
        match c.ws().read().expect("a pong") {
            Message::Pong(p) => {
                assert_eq!(&p[..], b"are you there");
                break;
            }
            Message::Text(_) | Message::Binary(_) => {} // heart-beats
            other => panic!("unexpected {other:?}"),
        }
    }
}

#[test]
fn a_client_close_is_answered_with_a_close() {
    let (_s, addr) = ws_server(|_| {});
    let (mut c, _) = open(addr, "/ws", &["v12.stomp"], None).unwrap();
    c.connect("1.2");
    c.ws().close(None).unwrap();
    loop {
        match c.ws().read() {
            Ok(Message::Close(_)) | Err(tungstenite::Error::ConnectionClosed) => break,
            Ok(_) => {}
            Err(e) => panic!("no close reply: {e}"),
        }
    }
}

#[test]
fn disconnect_with_receipt_ends_with_a_close_frame() {
    let (_s, addr) = ws_server(|_| {});
    let (mut c, _) = open(addr, "/ws", &["v12.stomp"], None).unwrap();
    c.connect("1.2");
    c.send("DISCONNECT", &[("receipt", "bye")], b"");
    assert_eq!(c.frame().header("receipt-id"), Some("bye"));
    assert_eq!(close_code(&mut c), Some(tungstenite::protocol::frame::coding::CloseCode::Normal));
}

#[test]
fn queue_messages_are_acked_over_websocket() {
    let (_s, addr) = ws_server(|_| {});
    let dest = format!("/queue/{}", common::unique("ws-ack"));
    let (mut c, _) = open(addr, "/ws", &["v12.stomp"], None).unwrap();
    c.connect("1.2");
    c.send("SEND", &[("destination", &dest), ("receipt", "s")], b"work");
    assert_eq!(c.frame().header("receipt-id"), Some("s"));
    c.send("SUBSCRIBE", &[("id", "1"), ("destination", &dest), ("ack", "client-individual")], b"");
    let m = c.frame();
    assert_eq!(m.body, b"work");
    let ack = m.header("ack").expect("ack header").to_string();
    c.send("ACK", &[("id", &ack), ("receipt", "a")], b"");
    assert_eq!(c.frame().header("receipt-id"), Some("a"));
}
