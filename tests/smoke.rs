//! The basic round trip over real loopback sockets: CONNECT, SUBSCRIBE, SEND, MESSAGE, with
//! exact bytes. Also the transport switch's own check: in the WebSocket pass
//! (`STOMPGATE_TEST_TRANSPORT=ws`) the client really is a WebSocket and the frames came in
//! WebSocket messages.
use crate::common;
use common::*;

#[test]
fn connect_subscribe_send_receive_exact_bytes() {
    let server = TestServer::start();
    let mut c = server.client();
    let connected = c.connect("1.2");
    assert_eq!(connected.command, "CONNECTED");
    assert_eq!(connected.header("version"), Some("1.2"));
    assert_eq!(connected.header("heart-beat"), Some("10000,10000"));
    assert!(connected.header("server").unwrap().starts_with("stompgate/"));
    assert!(connected.header("session").is_some());

    c.send("SUBSCRIBE", &[("id", "s1"), ("destination", "/topic/smoke/a"), ("receipt", "r1")], b"");
    let r = c.frame();
    assert_eq!(r.raw, b"RECEIPT\nreceipt-id:r1\ncontent-length:0\n\n\x00");
    c.send("SEND", &[("destination", "/topic/smoke/a")], b"hello");
    let m = c.frame();
    assert_eq!(m.command, "MESSAGE");
    assert_eq!(m.header("destination"), Some("/topic/smoke/a"));
    assert_eq!(m.header("subscription"), Some("s1"));
    assert_eq!(m.header("content-length"), Some("5"));
    assert_eq!(m.body, b"hello");
    assert_eq!(c.is_websocket(), common::ws_client::ws_transport(), "the client speaks the transport the run asked for");
    if c.is_websocket() {
        assert_eq!(c.kinds, ["text", "text", "text"], "CONNECTED, RECEIPT and MESSAGE, each a text message");
    }
    server.stop();
}
