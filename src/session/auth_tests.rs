//! The session's authentication and authorization, table-driven, with a host that verifies
//! real tokens (minted here with `jsonwebtoken`) and decides with a real rule set.
use super::*;
use crate::auth::{Access, JwtAlg, JwtVerifier, RuleSet};
use jsonwebtoken::{encode, EncodingKey, Header};
use std::cell::Cell;

const SECRET: &[u8] = b"unit-test-secret";

struct AuthHost {
    jwt: Option<JwtVerifier>,
    rules: Option<RuleSet>,
    generation: Cell<u64>,
    /// How many times the rules were asked (a cache hit does not ask).
    asked: Cell<usize>,
}

impl Host for AuthHost {
    fn open_connections(&self) -> usize {
        1
    }
    fn new_message_id(&self) -> Bytes {
        Bytes::from_static(b"m")
    }
    fn now_ns(&self) -> i64 {
        crate::model::now_unix_ns()
    }
    fn authenticate(&self, _login: Option<&[u8]>, passcode: Option<&[u8]>) -> Result<Option<Bytes>, Denied> {
        let Some(jwt) = &self.jwt else { return Ok(None) };
        jwt.verify(passcode.ok_or(Denied)?).map(|id| Some(Bytes::from(id))).map_err(|_| Denied)
    }
    fn authz_generation(&self) -> Option<u64> {
        self.rules.as_ref().map(|_| self.generation.get())
    }
    fn authorize(&self, client_id: &[u8], pattern: Pattern, channel: &[u8], access: Access) -> bool {
        self.asked.set(self.asked.get() + 1);
        let rules = self.rules.as_ref().expect("asked only with rules");
        rules.allows(std::str::from_utf8(client_id).unwrap(), pattern, std::str::from_utf8(channel).unwrap(), access)
    }
}

fn host(jwt: bool, rules: Option<&str>) -> AuthHost {
    AuthHost {
        jwt: jwt.then(|| JwtVerifier::from_key(std::path::Path::new("secret"), SECRET, JwtAlg::HS256).unwrap()),
        rules: rules.map(|r| RuleSet::parse(r).unwrap()),
        generation: Cell::new(1),
        asked: Cell::new(0),
    }
}

fn now() -> i64 {
    crate::model::now_unix_ns() / 1_000_000_000
}

fn token(alg: jsonwebtoken::Algorithm, key: &[u8], claims: serde_json::Value) -> String {
    encode(&Header::new(alg), &claims, &EncodingKey::from_secret(key)).unwrap()
}

fn frame(command: Command, headers: &[(&str, &str)]) -> Frame {
    Frame {
        command,
        headers: crate::stomp::Headers::from_pairs(headers.iter().map(|(n, v)| (Bytes::copy_from_slice(n.as_bytes()), Bytes::copy_from_slice(v.as_bytes())))),
        body: Bytes::new(),
    }
}

fn connect(h: &AuthHost, login: &str, passcode: Option<&str>) -> (Session, bool, Vec<Action>) {
    let mut s = Session::new(Arc::new(Config::default()), Bytes::from_static(b"stompgate-0-1"));
    let mut headers = vec![("accept-version", "1.2"), ("login", login)];
    if let Some(p) = passcode {
        headers.push(("passcode", p));
    }
    let mut out = Vec::new();
    let go = s.handle(&frame(Command::Connect, &headers), h, &mut out);
    (s, go, out)
}

fn is_access_denied(out: &[Action]) -> bool {
    matches!(out.last(), Some(Action::Error { error: WireError::AccessDenied, .. }))
}

#[test]
fn every_jwt_case_at_connect() {
    let h = host(true, None);
    let t = now();
    // alg:none, as an attacker writes it: {"alg":"none"} + {"sub":"mallory","exp":4102444800}, no signature.
    let unsigned = "eyJhbGciOiJub25lIiwidHlwIjoiSldUIn0.eyJzdWIiOiJtYWxsb3J5IiwiZXhwIjo0MTAyNDQ0ODAwfQ.".to_string();
    let cases: Vec<(&str, Option<String>, Option<&str>)> = vec![
        (
            "ClientID claim",
            Some(token(jsonwebtoken::Algorithm::HS256, SECRET, serde_json::json!({"ClientID": "alice", "sub": "ignored", "exp": t + 3600}))),
            Some("alice"),
        ),
        ("sub when no ClientID", Some(token(jsonwebtoken::Algorithm::HS256, SECRET, serde_json::json!({"sub": "bob", "exp": t + 3600}))), Some("bob")),
        ("no passcode", None, None),
        ("wrong alg (HS384 for HS256)", Some(token(jsonwebtoken::Algorithm::HS384, SECRET, serde_json::json!({"sub": "x", "exp": t + 3600}))), None),
        ("bad signature", Some(token(jsonwebtoken::Algorithm::HS256, b"another secret", serde_json::json!({"sub": "x", "exp": t + 3600}))), None),
        ("expired", Some(token(jsonwebtoken::Algorithm::HS256, SECRET, serde_json::json!({"sub": "x", "exp": t - 3600}))), None),
        ("no exp", Some(token(jsonwebtoken::Algorithm::HS256, SECRET, serde_json::json!({"sub": "x"}))), None),
        ("nbf in the future", Some(token(jsonwebtoken::Algorithm::HS256, SECRET, serde_json::json!({"sub": "x", "exp": t + 7200, "nbf": t + 3600}))), None),
        ("alg none", Some(unsigned), None),
        ("garbage", Some("not.a.jwt".to_string()), None),
        ("empty", Some(String::new()), None),
    ];
    for (name, passcode, want) in cases {
        let (s, go, out) = connect(&h, "display-name", passcode.as_deref());
        match want {
            Some(id) => {
                assert!(go && matches!(out.as_slice(), [Action::Connected { .. }]), "{name}: {out:?}");
                assert_eq!(&s.client_id()[..], id.as_bytes(), "{name}");
            }
            None => {
                assert!(!go, "{name}");
                assert!(is_access_denied(&out), "{name}: {out:?}");
                assert_eq!(out.len(), 1, "{name}: nothing but the ERROR: {out:?}");
                assert_ne!(s.state(), State::Connected, "{name}");
            }
        }
    }
}

#[test]
fn client_id_precedence_jwt_then_transport_then_login() {
    let t = now();
    let on = host(true, None);
    let off = host(false, None);
    let tok = token(jsonwebtoken::Algorithm::HS256, SECRET, serde_json::json!({"ClientID": "from-jwt", "exp": t + 60}));
    let run = |h: &AuthHost, cn: Option<&str>, login: &str, passcode: Option<&str>| {
        let mut s = Session::new(Arc::new(Config::default()), Bytes::from_static(b"stompgate-0-1"));
        if let Some(cn) = cn {
            s.set_transport_identity(Bytes::copy_from_slice(cn.as_bytes()));
        }
        let mut headers = vec![("accept-version", "1.2")];
        if !login.is_empty() {
            headers.push(("login", login));
        }
        if let Some(p) = passcode {
            headers.push(("passcode", p));
        }
        let mut out = Vec::new();
        assert!(s.handle(&frame(Command::Connect, &headers), h, &mut out), "{out:?}");
        String::from_utf8(s.client_id().to_vec()).unwrap()
    };
    assert_eq!(run(&on, Some("cert-cn"), "login", Some(&tok)), "from-jwt");
    assert_eq!(run(&off, Some("cert-cn"), "login", None), "cert-cn");
    assert_eq!(run(&off, None, "login", None), "login");
    assert_eq!(run(&off, None, "", None), "stompgate-0-1");
    // Authentication off: the passcode is not looked at.
    assert_eq!(run(&off, None, "x", Some("garbage")), "x");
}

const RULES: &str = r#"[
    {"ClientID": "alice", "Queues": true, "Channel": "orders\\..*", "Read": true, "Write": true},
    {"ClientID": "alice", "Events": true, "Channel": "news", "Read": true},
    {"ClientID": "alice", "Events": true, "Channel": "metrics\\.>", "Read": true},
    {"ClientID": "alice", "Commands": true, "Channel": "rpc\\.pay", "Write": true}
]"#;

/// Each (frame, destination) → allowed? for client `alice` (her `login`, auth off).
#[test]
fn every_authz_decision_for_send_and_subscribe() {
    let cases: &[(Command, &str, bool)] = &[
        (Command::Send, "/queue/orders.eu", true),
        (Command::Subscribe, "/queue/orders.eu", true),
        (Command::Send, "/queue/invoices", false),
        (Command::Subscribe, "/topic/news", true),
        (Command::Send, "/topic/news", false),
        (Command::Subscribe, "/topic/sports", false),
        (Command::Subscribe, "/topic/metrics.>", true),
        (Command::Subscribe, "/topic/metrics.*", false),
        (Command::Subscribe, "/topic/>", false),
        (Command::Subscribe, "/store/news", false),
        (Command::Subscribe, "/reply/mine", true),
        (Command::Send, "/command/rpc.pay", true),
        (Command::Send, "/query/rpc.pay", false),
    ];
    for &(command, dest, allowed) in cases {
        let h = host(false, Some(RULES));
        let (mut s, go, _) = connect(&h, "alice", None);
        assert!(go);
        let mut out = Vec::new();
        if dest.starts_with("/command/") || dest.starts_with("/query/") {
            // An RPC request needs its /reply/ subscription (always allowed) first.
            assert!(s.handle(&frame(Command::Subscribe, &[("destination", "/reply/r"), ("id", "r")]), &h, &mut out));
            out.clear();
        }
        let f = match command {
            Command::Send => frame(command, &[("destination", dest), ("reply-to", "/reply/r")]),
            _ => frame(command, &[("destination", dest), ("id", "s1")]),
        };
        let go = s.handle(&f, &h, &mut out);
        if allowed {
            assert!(go && !is_access_denied(&out), "{command:?} {dest}: {out:?}");
        } else {
            assert!(!go && is_access_denied(&out), "{command:?} {dest}: {out:?}");
        }
    }
}

#[test]
fn decisions_are_cached_until_the_rules_change() {
    let h = host(false, Some(RULES));
    let (mut s, _, _) = connect(&h, "alice", None);
    let mut out = Vec::new();
    for _ in 0..100 {
        assert!(s.handle(&frame(Command::Send, &[("destination", "/queue/orders.eu")]), &h, &mut out));
    }
    assert_eq!(h.asked.get(), 1, "one regex pass for 100 SENDs to one channel");
    assert!(s.handle(&frame(Command::Subscribe, &[("destination", "/queue/orders.eu"), ("id", "a")]), &h, &mut out));
    assert_eq!(h.asked.get(), 2, "Read is a decision of its own");
    h.generation.set(2);
    assert!(s.handle(&frame(Command::Send, &[("destination", "/queue/orders.eu")]), &h, &mut out));
    assert_eq!(h.asked.get(), 3, "a new rule generation asks again");
    assert_eq!(s.authz.cached_channels(), 1);
}

#[test]
fn with_authorization_off_the_rules_are_never_asked() {
    let h = host(false, None);
    let (mut s, _, _) = connect(&h, "anyone", None);
    let mut out = Vec::new();
    assert!(s.handle(&frame(Command::Subscribe, &[("destination", "/topic/>"), ("id", "a")]), &h, &mut out));
    assert!(s.handle(&frame(Command::Send, &[("destination", "/queue/x")]), &h, &mut out));
    assert_eq!(h.asked.get(), 0);
}
