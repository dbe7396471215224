//! Property: CONNECT negotiates the highest common STOMP version from `accept-version`
//! (missing → 1.0, none in common → `ERROR unsupported protocol version` + close), CONNECTED
//! carries exactly `version`, `heart-beat`, `session` and `server`, and header escaping follows
//! the negotiated version on both sides: 1.2 unescapes/escapes `\n \c \\ \r`, 1.1 the same
//! without `\r`, 1.0 nothing; an undefined escape is `malformed frame` + close; a value the
//! subscriber's version cannot represent is dropped from the MESSAGE and the connection lives.
//!
//! Setup: an in-process gateway on two cores; raw CONNECT frames per version, and cross-version
//! deliveries (publisher on one version, subscriber on another) through a topic. Header values
//! are compared exactly as they appear on the wire (still escaped).
use crate::common;
use common::props::*;
use common::*;

const SERVER: &str = concat!("stompgate/", env!("CARGO_PKG_VERSION"));

fn connected_version(server: &TestServer, accept_version: &str) -> Frame {
    let mut c = server.client();
    let f = c.connect(accept_version);
    assert_eq!(f.command, "CONNECTED", "{f:?}");
    f
}

#[test]
fn accept_version_picks_the_highest_common_version() {
    let server = TestServer::start();
    for (offered, agreed) in
        [("1.0", "1.0"), ("1.1", "1.1"), ("1.2", "1.2"), ("1.1,1.2", "1.2"), ("1.2,1.1", "1.2"), (" 1.2 , 1.0 ", "1.2"), ("1.0,1.1", "1.1"), ("1.1,2.0", "1.1")]
    {
        let f = connected_version(&server, offered);
        assert_eq!(f.header("version"), Some(agreed), "accept-version:{offered:?}");
    }
}

#[test]
fn missing_accept_version_is_1_0() {
    let server = TestServer::start();
    let mut c = server.client();
    c.send("CONNECT", &[("host", "localhost")], b"");
    let f = c.frame();
    let session = f.header("session").unwrap().to_string();
    assert_raw(&f, format!("CONNECTED\nversion:1.0\nheart-beat:0,0\nsession:{session}\nserver:{SERVER}\ncontent-length:0\n\n\0").as_bytes());
}

#[test]
fn unsupported_version_is_error_and_close() {
    let server = TestServer::start();
    for offered in ["2.0", "1.3,3.0"] {
        let mut c = server.client();
        c.send("CONNECT", &[("accept-version", offered), ("host", "localhost")], b"");
        let f = expect_error_close(&mut c, "unsupported protocol version");
        assert_raw(
            &f,
            b"ERROR\nmessage:unsupported protocol version\nversion:1.0,1.1,1.2\ncontent-type:text/plain\ncontent-length:34\n\nsupported versions are 1.0,1.1,1.2\0",
        );
    }
}

#[test]
fn stomp_frame_is_accepted_as_connect() {
    let server = TestServer::start();
    let mut c = server.client();
    c.send("STOMP", &[("accept-version", "1.2"), ("host", "localhost")], b"");
    let f = c.frame();
    assert_eq!(f.command, "CONNECTED");
    assert_eq!(f.header("version"), Some("1.2"));
    assert_alive(&mut c);
}

#[test]
fn connected_headers_are_exact() {
    let server = TestServer::start();
    let f = connected_version(&server, "1.2");
    let session = f.header("session").unwrap().to_string();
    assert!(!session.is_empty());
    assert!(SERVER.starts_with("stompgate/"));
    assert_raw(&f, format!("CONNECTED\nversion:1.2\nheart-beat:10000,10000\nsession:{session}\nserver:{SERVER}\ncontent-length:0\n\n\0").as_bytes());
    let f = connected_version(&server, "1.1");
    let session2 = f.header("session").unwrap().to_string();
    assert_ne!(session, session2, "each connection has its own session id");
    assert_raw(&f, format!("CONNECTED\nversion:1.1\nheart-beat:10000,10000\nsession:{session2}\nserver:{SERVER}\ncontent-length:0\n\n\0").as_bytes());
}

#[test]
fn connect_headers_are_not_unescaped() {
    // CONNECT headers are taken literally (spec): an undefined escape there is not an error.
    let server = TestServer::start();
    let mut c = server.client();
    c.send("CONNECT", &[("accept-version", "1.2"), ("host", "localhost"), ("x-junk", "a\\tb")], b"");
    let f = c.frame();
    assert_eq!(f.command, "CONNECTED");
    assert_alive(&mut c);
}

/// A subscriber on `sub_version` and a publisher on `pub_version`; the publisher's SEND has
/// `headers` written raw. Returns (MESSAGE, subscriber).
fn cross(server: &TestServer, pub_version: &str, sub_version: &str, headers: &[(&str, &str)]) -> (Frame, Client) {
    let dest = format!("/topic/{}", unique("esc"));
    let mut sub = connect_version(server, sub_version);
    subscribe(&mut sub, "s1", &dest, &[]);
    let mut publisher = connect_version(server, pub_version);
    let mut h = vec![("destination", dest.as_str())];
    h.extend_from_slice(headers);
    send_with_receipt(&mut publisher, "SEND", &h, b"body", "p1");
    let m = sub.frame();
    assert_eq!(m.command, "MESSAGE", "{m:?}");
    assert_eq!(m.header("destination"), Some(dest.as_str()));
    assert_eq!(m.body, b"body");
    (m, sub)
}

#[test]
fn v12_escapes_arrive_escaped_identically() {
    let server = TestServer::start();
    let (m, _) = cross(&server, "1.2", "1.2", &[("x-esc", "a\\nb\\cc\\\\d\\re"), ("x\\cname", "v")]);
    assert_eq!(m.header("x-esc"), Some("a\\nb\\cc\\\\d\\re"));
    assert_eq!(m.header("x\\cname"), Some("v"));
    assert!(find(&m.raw, b"\nx-esc:a\\nb\\cc\\\\d\\re\n"), "{:?}", String::from_utf8_lossy(&m.raw));
}

#[test]
fn v11_escapes_arrive_escaped_identically() {
    let server = TestServer::start();
    let (m, _) = cross(&server, "1.1", "1.1", &[("x-esc", "a\\nb\\cc\\\\d")]);
    assert_eq!(m.header("x-esc"), Some("a\\nb\\cc\\\\d"));
}

#[test]
fn v11_carriage_return_escape_is_malformed() {
    let server = TestServer::start();
    let mut c = connect_version(&server, "1.1");
    c.send("SEND", &[("destination", &format!("/topic/{}", unique("esc"))), ("x-a", "b\\rc")], b"x");
    let f = expect_error_close(&mut c, "malformed frame");
    assert_raw(&f, &error_bytes(WireError::MalformedFrame(Malformed::UndefinedEscape), None));
}

#[test]
fn v12_undefined_escape_is_malformed() {
    let server = TestServer::start();
    for value in ["b\\tc", "trailing\\"] {
        let mut c = server.connected();
        c.send("SEND", &[("destination", &format!("/topic/{}", unique("esc"))), ("x-a", value)], b"x");
        let f = expect_error_close(&mut c, "malformed frame");
        assert_raw(&f, &error_bytes(WireError::MalformedFrame(Malformed::UndefinedEscape), None));
    }
}

#[test]
fn v11_subscriber_drops_a_value_with_cr_and_stays_connected() {
    let server = TestServer::start();
    let (m, mut sub) = cross(&server, "1.2", "1.1", &[("x-cr", "a\\rb"), ("x-lf", "a\\nb"), ("x-keep", "ok")]);
    let mid = m.header("message-id").unwrap().to_string();
    assert_headers(
        &m,
        &[
            ("destination", m.header("destination").unwrap()),
            ("message-id", &mid),
            ("subscription", "s1"),
            ("x-lf", "a\\nb"),
            ("x-keep", "ok"),
            ("content-length", "4"),
        ],
    );
    assert_alive(&mut sub);
}

#[test]
fn v10_subscriber_drops_values_with_lf_or_cr_and_stays_connected() {
    let server = TestServer::start();
    let (m, mut sub) = cross(&server, "1.2", "1.0", &[("x-lf", "a\\nb"), ("x-cr", "a\\rb"), ("x\\cname", "v"), ("x-colon", "a\\cb"), ("x-keep", "ok")]);
    let mid = m.header("message-id").unwrap().to_string();
    // 1.0 does not escape: the colon goes out raw (the reader splits at the first one).
    assert_headers(
        &m,
        &[
            ("destination", m.header("destination").unwrap()),
            ("message-id", &mid),
            ("subscription", "s1"),
            ("x-colon", "a:b"),
            ("x-keep", "ok"),
            ("content-length", "4"),
        ],
    );
    assert_alive(&mut sub);
}

#[test]
fn v10_send_is_not_unescaped() {
    let server = TestServer::start();
    let (m, _) = cross(&server, "1.0", "1.2", &[("x-a", "b\\c"), ("x-n", "a\\nb"), ("x-colon", "b:c")]);
    // Literal backslashes, escaped for the 1.2 subscriber; the raw colon becomes `\c`.
    assert_eq!(m.header("x-a"), Some("b\\\\c"));
    assert_eq!(m.header("x-n"), Some("a\\\\nb"));
    assert_eq!(m.header("x-colon"), Some("b\\cc"));
    let (m, _) = cross(&server, "1.0", "1.0", &[("x-a", "b\\c")]);
    assert_eq!(m.header("x-a"), Some("b\\c"));
}

#[test]
fn crlf_line_endings_are_accepted_on_1_2() {
    let server = TestServer::start();
    let dest = format!("/topic/{}", unique("crlf"));
    let mut c = server.client();
    c.send_raw(b"CONNECT\r\naccept-version:1.2\r\nhost:localhost\r\n\r\n\0");
    let f = c.frame();
    assert_eq!(f.command, "CONNECTED");
    assert_eq!(f.header("version"), Some("1.2"));
    c.send_raw(format!("SUBSCRIBE\r\nid:s1\r\ndestination:{dest}\r\nreceipt:r1\r\n\r\n\0").as_bytes());
    assert_raw(&c.frame(), b"RECEIPT\nreceipt-id:r1\ncontent-length:0\n\n\0");
    c.send_raw(format!("SEND\r\ndestination:{dest}\r\nx-a:b\r\n\r\nhi\0\r\n").as_bytes());
    let m = c.frame();
    let mid = m.header("message-id").unwrap().to_string();
    assert_raw(&m, format!("MESSAGE\ndestination:{dest}\nmessage-id:{mid}\nsubscription:s1\nx-a:b\ncontent-length:2\n\nhi\0").as_bytes());
}

fn find(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}
