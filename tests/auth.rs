//! JWT authentication and per-channel authorization over real sockets (issue 14). Tokens are
//! minted here with the `jsonwebtoken` crate: HS256 with a secret, RS256 with the committed
//! test key tests/data/jwt-rs256.{key,pub} (made with `openssl genrsa 2048`), ES256 with a P-256
//! key generated in the test by `rcgen`.
use crate::common;
use common::props::{expect_error_close, send_with_receipt, subscribe};
use common::{unique, Client, TestServer};
use jsonwebtoken::{encode, Algorithm, EncodingKey, Header};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use stompgate::auth::{Auth, Authz, JwtAlg, JwtVerifier};

const SECRET: &[u8] = b"integration-secret";

/// A file removed when dropped.
struct TempFile(PathBuf);
impl TempFile {
    fn new(name: &str, contents: &[u8]) -> TempFile {
        let path = std::env::temp_dir().join(unique(&format!("stompgate-auth-{name}-")));
        std::fs::write(&path, contents).unwrap();
        TempFile(path)
    }
    fn path(&self) -> &str {
        self.0.to_str().unwrap()
    }
}
impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs()
}

fn hs256(claims: serde_json::Value) -> String {
    encode(&Header::new(Algorithm::HS256), &claims, &EncodingKey::from_secret(SECRET)).unwrap()
}

fn server_with(jwt: Option<(&TempFile, JwtAlg)>, rules: Option<&TempFile>) -> TestServer {
    let auth = Auth { jwt: jwt.map(|(f, alg)| Arc::new(JwtVerifier::load(&f.0, alg).unwrap())), authz: rules.map(|f| Arc::new(Authz::load(&f.0).unwrap())) };
    TestServer::start_with(|c| c.auth = auth)
}

/// CONNECT with `login` and `passcode`; returns the client and the first frame.
fn connect(server: &TestServer, login: &str, passcode: &str) -> (Client, common::Frame) {
    let mut c = server.client();
    c.send("CONNECT", &[("accept-version", "1.2"), ("host", "/"), ("login", login), ("passcode", passcode)], b"");
    let f = c.frame();
    (c, f)
}

/// The refusal every bad credential gets: ERROR `access denied`, no detail, then close. The
/// body is the one generic hint every denial gets (issue 18), never which check failed.
fn assert_denied(mut c: Client, f: &common::Frame, case: &str) {
    assert_eq!(f.command, "ERROR", "{case}: {:?}", String::from_utf8_lossy(&f.raw));
    assert_eq!(f.header("message"), Some("access denied"), "{case}");
    assert_eq!(f.body_str(), "the credentials or the access rules do not allow this", "{case}: no detail on the wire");
    assert!(c.closed(), "{case}: still open after ERROR");
}

#[test]
fn hs256_tokens_valid_and_every_bad_case() {
    let key = TempFile::new("hs256", SECRET);
    let server = server_with(Some((&key, JwtAlg::HS256)), None);
    let t = now();
    let (mut c, f) = connect(&server, "display", &hs256(serde_json::json!({"ClientID": "alice", "exp": t + 3600})));
    assert_eq!(f.command, "CONNECTED", "{:?}", String::from_utf8_lossy(&f.raw));
    let q = format!("/queue/{}", unique("hs"));
    send_with_receipt(&mut c, "SEND", &[("destination", &q)], b"x", "r1");

    let none_alg = {
        // {"alg":"none","typ":"JWT"} . {"sub":"mallory","exp":4102444800} . (no signature)
        "eyJhbGciOiJub25lIiwidHlwIjoiSldUIn0.eyJzdWIiOiJtYWxsb3J5IiwiZXhwIjo0MTAyNDQ0ODAwfQ.".to_string()
    };
    let bad = [
        ("wrong alg", encode(&Header::new(Algorithm::HS512), &serde_json::json!({"sub": "x", "exp": t + 3600}), &EncodingKey::from_secret(SECRET)).unwrap()),
        (
            "bad signature",
            encode(&Header::new(Algorithm::HS256), &serde_json::json!({"sub": "x", "exp": t + 3600}), &EncodingKey::from_secret(b"other")).unwrap(),
        ),
        ("expired", hs256(serde_json::json!({"sub": "x", "exp": t - 3600}))),
        ("no exp", hs256(serde_json::json!({"sub": "x"}))),
        ("nbf in the future", hs256(serde_json::json!({"sub": "x", "exp": t + 7200, "nbf": t + 3600}))),
        ("alg none", none_alg),
        ("garbage", "garbage".to_string()),
        // Valid, but naming nobody: the identity would otherwise come from `login`, which the
        // client chooses (and with it whose --authz-file rules apply).
        ("no ClientID or sub", hs256(serde_json::json!({"exp": t + 3600}))),
        ("an empty ClientID and no sub", hs256(serde_json::json!({"ClientID": "", "exp": t + 3600}))),
    ];
    for (case, token) in &bad {
        let (c, f) = connect(&server, "display", token);
        assert_denied(c, &f, case);
    }
    // No passcode at all.
    let mut c = server.client();
    c.send("CONNECT", &[("accept-version", "1.2"), ("host", "/")], b"");
    let f = c.frame();
    assert_denied(c, &f, "no passcode");
}

#[test]
fn rs256_and_es256_tokens() {
    let t = now();
    let claims = serde_json::json!({"sub": "svc", "exp": t + 600});
    // RS256, the committed key pair.
    let public = TempFile::new("rs256", include_bytes!("data/jwt-rs256.pub"));
    let server = server_with(Some((&public, JwtAlg::RS256)), None);
    let good = encode(&Header::new(Algorithm::RS256), &claims, &EncodingKey::from_rsa_pem(include_bytes!("data/jwt-rs256.key")).unwrap()).unwrap();
    let (_c, f) = connect(&server, "", &good);
    assert_eq!(f.command, "CONNECTED", "{:?}", String::from_utf8_lossy(&f.raw));
    // An HS256 token whose secret is the public key's PEM: the classic key-confusion attack.
    let confused = encode(&Header::new(Algorithm::HS256), &claims, &EncodingKey::from_secret(include_bytes!("data/jwt-rs256.pub"))).unwrap();
    let (c, f) = connect(&server, "", &confused);
    assert_denied(c, &f, "HS256 signed with the RSA public key");
    drop(server);

    // ES256, a P-256 key generated now.
    let pair = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    let public = TempFile::new("es256", pair.public_key_pem().as_bytes());
    let server = server_with(Some((&public, JwtAlg::ES256)), None);
    let good = encode(&Header::new(Algorithm::ES256), &claims, &EncodingKey::from_ec_pem(pair.serialize_pem().as_bytes()).unwrap()).unwrap();
    let (_c, f) = connect(&server, "", &good);
    assert_eq!(f.command, "CONNECTED", "{:?}", String::from_utf8_lossy(&f.raw));
    let other = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    let forged = encode(&Header::new(Algorithm::ES256), &claims, &EncodingKey::from_ec_pem(other.serialize_pem().as_bytes()).unwrap()).unwrap();
    let (c, f) = connect(&server, "", &forged);
    assert_denied(c, &f, "ES256 signed by another key");
}

/// Every algorithm `--auth-jwt-alg` names accepts a token signed with the configured key and
/// refuses one signed with another key of the same kind.
#[test]
fn every_configured_algorithm_accepts_its_key_and_refuses_another() {
    let claims = serde_json::json!({"ClientID": "svc", "exp": now() + 600});
    let rsa_private = include_bytes!("data/jwt-rs256.key");
    let rsa_public = include_bytes!("data/jwt-rs256.pub");
    let p256 = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    let p384 = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P384_SHA384).unwrap();
    let other_p256 = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    let other_p384 = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P384_SHA384).unwrap();
    let other_secret = EncodingKey::from_secret(b"another secret");
    // (configured, algorithm, the key file the gateway verifies with, signing key, a wrong key)
    let cases: Vec<(JwtAlg, Algorithm, Vec<u8>, EncodingKey, EncodingKey)> = vec![
        (JwtAlg::HS256, Algorithm::HS256, SECRET.to_vec(), EncodingKey::from_secret(SECRET), other_secret.clone()),
        (JwtAlg::HS384, Algorithm::HS384, SECRET.to_vec(), EncodingKey::from_secret(SECRET), other_secret.clone()),
        (JwtAlg::HS512, Algorithm::HS512, SECRET.to_vec(), EncodingKey::from_secret(SECRET), other_secret),
        (JwtAlg::RS256, Algorithm::RS256, rsa_public.to_vec(), EncodingKey::from_rsa_pem(rsa_private).unwrap(), EncodingKey::from_secret(rsa_public)),
        (JwtAlg::RS384, Algorithm::RS384, rsa_public.to_vec(), EncodingKey::from_rsa_pem(rsa_private).unwrap(), EncodingKey::from_secret(rsa_public)),
        (JwtAlg::RS512, Algorithm::RS512, rsa_public.to_vec(), EncodingKey::from_rsa_pem(rsa_private).unwrap(), EncodingKey::from_secret(rsa_public)),
        (
            JwtAlg::ES256,
            Algorithm::ES256,
            p256.public_key_pem().into_bytes(),
            EncodingKey::from_ec_pem(p256.serialize_pem().as_bytes()).unwrap(),
            EncodingKey::from_ec_pem(other_p256.serialize_pem().as_bytes()).unwrap(),
        ),
        (
            JwtAlg::ES384,
            Algorithm::ES384,
            p384.public_key_pem().into_bytes(),
            EncodingKey::from_ec_pem(p384.serialize_pem().as_bytes()).unwrap(),
            EncodingKey::from_ec_pem(other_p384.serialize_pem().as_bytes()).unwrap(),
        ),
    ];
    for (configured, alg, key_file, good_key, wrong_key) in cases {
        let key = TempFile::new(&format!("{configured:?}").to_lowercase(), &key_file);
        let server = server_with(Some((&key, configured)), None);
        let good = encode(&Header::new(alg), &claims, &good_key).unwrap();
        let (_c, f) = connect(&server, "", &good);
        assert_eq!(f.command, "CONNECTED", "{configured:?}: {:?}", String::from_utf8_lossy(&f.raw));
        // RS*: the wrong key is an HS256 token keyed by the public key (key confusion).
        let wrong_alg = if matches!(alg, Algorithm::RS256 | Algorithm::RS384 | Algorithm::RS512) { Algorithm::HS256 } else { alg };
        let forged = encode(&Header::new(wrong_alg), &claims, &wrong_key).unwrap();
        let (c, f) = connect(&server, "", &forged);
        assert_denied(c, &f, &format!("{configured:?} signed by another key"));
    }
}

const RULES: &str = r#"[
    {"ClientID": "alice", "Queues": true, "Channel": "auth-ok\\..*", "Read": true, "Write": true},
    {"ClientID": "alice", "Events": true, "Channel": "auth-news\\..*", "Read": true},
    {"ClientID": "alice", "Events": true, "Channel": "auth-metrics\\.>", "Read": true},
    {"ClientID": "alice", "Commands": true, "Channel": "auth-rpc\\..*", "Write": true}
]"#;

/// Alice, named by `login` (authentication off), against the rules.
#[test]
fn authz_allows_and_denies_per_pattern_action_and_filter() {
    let rules = TempFile::new("rules", RULES.as_bytes());
    let server = server_with(None, Some(&rules));
    let login = |who: &str| {
        let mut c = server.client();
        c.send("CONNECT", &[("accept-version", "1.2"), ("host", "/"), ("login", who)], b"");
        assert_eq!(c.frame().command, "CONNECTED");
        c
    };
    let ok_q = format!("/queue/auth-ok.{}", unique("q"));
    let mut a = login("alice");
    // Read and Write on separate queues, so no MESSAGE comes between a frame and its RECEIPT.
    subscribe(&mut a, "s1", &format!("/queue/auth-ok.{}", unique("r")), &[]);
    send_with_receipt(&mut a, "SEND", &[("destination", &ok_q)], b"hi", "w1");
    subscribe(&mut a, "s2", &format!("/topic/auth-news.{}", unique("t")), &[]);
    subscribe(&mut a, "s3", "/topic/auth-metrics.>", &[]);
    // `/reply/` is always allowed, and a permitted command can use it.
    subscribe(&mut a, "r", "/reply/mine", &[]);
    a.send("SEND", &[("destination", &format!("/command/auth-rpc.{}", unique("c"))), ("reply-to", "/reply/mine"), ("timeout", "200"), ("receipt", "c1")], b"");
    assert_eq!(a.frame().header("receipt-id"), Some("c1"));
    // Allowed through to the array, which has no responder: the request's failure comes back.
    assert_eq!(a.frame().header("stomp-error"), Some("no-responder"));

    let denied: [(&str, &str, String); 7] = [
        ("alice", "SEND", format!("/topic/auth-news.{}", unique("t"))),
        ("alice", "SEND", format!("/queue/{}", unique("other"))),
        ("alice", "SUBSCRIBE", "/topic/>".to_string()),
        ("alice", "SUBSCRIBE", "/topic/auth-metrics.*".to_string()),
        ("alice", "SUBSCRIBE", format!("/store/auth-news.{}", unique("s"))),
        ("alice", "SEND", format!("/query/auth-rpc.{}", unique("q"))),
        ("bob", "SUBSCRIBE", ok_q.clone()),
    ];
    for (who, cmd, dest) in &denied {
        let mut c = login(who);
        if cmd == &"SEND" {
            subscribe(&mut c, "r", "/reply/r", &[]);
            c.send("SEND", &[("destination", dest), ("reply-to", "/reply/r"), ("receipt", "x")], b"");
        } else {
            c.send("SUBSCRIBE", &[("destination", dest), ("id", "x"), ("receipt", "x")], b"");
        }
        let f = expect_error_close(&mut c, "access denied");
        assert_eq!(f.header("receipt-id"), Some("x"), "{who} {cmd} {dest}");
    }
    // The allowed connection is untouched by the others' denials.
    send_with_receipt(&mut a, "SEND", &[("destination", &ok_q)], b"again", "w2");
}

/// The verified token's ClientID is the identity the rules see, not `login`.
#[test]
fn authz_uses_the_jwt_client_id() {
    let key = TempFile::new("hs256b", SECRET);
    let rules = TempFile::new("rules-b", RULES.as_bytes());
    let server = server_with(Some((&key, JwtAlg::HS256)), Some(&rules));
    let q = format!("/queue/auth-ok.{}", unique("j"));
    let (mut c, f) = connect(&server, "bob", &hs256(serde_json::json!({"ClientID": "alice", "exp": now() + 600})));
    assert_eq!(f.command, "CONNECTED");
    send_with_receipt(&mut c, "SEND", &[("destination", &q)], b"x", "w1");
    let (mut c, f) = connect(&server, "alice", &hs256(serde_json::json!({"ClientID": "bob", "exp": now() + 600})));
    assert_eq!(f.command, "CONNECTED");
    c.send("SEND", &[("destination", &q), ("receipt", "w2")], b"x");
    expect_error_close(&mut c, "access denied");
}

/// SIGHUP re-reads the file (new rules apply); a broken file is refused and the old rules stay.
#[test]
fn sighup_reloads_the_rules_and_a_broken_file_keeps_the_old_ones() {
    let rules = TempFile::new("reload", br#"[{"Events": true, "Channel": "auth-before", "Read": true}]"#);
    let gw = common::child::Gateway::spawn(&["--authz-file", rules.path()], None);
    let try_subscribe = |dest: &str| -> bool {
        let mut c = Client::open(gw.stomp_addr);
        c.send("CONNECT", &[("accept-version", "1.2"), ("host", "/")], b"");
        assert_eq!(c.frame().command, "CONNECTED");
        c.send("SUBSCRIBE", &[("destination", dest), ("id", "1"), ("receipt", "s")], b"");
        let f = c.frame();
        match f.command.as_str() {
            "RECEIPT" => true,
            "ERROR" => {
                assert_eq!(f.header("message"), Some("access denied"));
                false
            }
            other => panic!("unexpected {other}"),
        }
    };
    assert!(try_subscribe("/topic/auth-before"));
    assert!(!try_subscribe("/topic/auth-after"));
    std::fs::write(&rules.0, br#"[{"Events": true, "Channel": "auth-after", "Read": true}]"#).unwrap();
    // SAFETY: kill(2) on our own child's pid.
    assert_eq!(unsafe { libc::kill(gw.pid() as i32, libc::SIGHUP) }, 0);
    // The reload runs on the gateway's signal thread: wait (bounded) until it shows.
    let deadline = Instant::now() + Duration::from_secs(10);
    while !try_subscribe("/topic/auth-after") {
        assert!(Instant::now() < deadline, "new rules not in force 10 s after SIGHUP");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(!try_subscribe("/topic/auth-before"), "the old rule is gone");
    std::fs::write(&rules.0, b"[{ broken").unwrap();
    assert_eq!(unsafe { libc::kill(gw.pid() as i32, libc::SIGHUP) }, 0);
    // Let the second reload happen (and fail) before checking that nothing changed: its log
    // line is the barrier.
    std::thread::sleep(Duration::from_millis(500));
    assert!(try_subscribe("/topic/auth-after"), "old rules stay after a broken file");
    assert!(!try_subscribe("/topic/auth-before"));
    let log = gw.stop();
    assert!(log.contains("authorization rules reloaded"), "{log}");
    assert!(log.contains("authorization rules not reloaded"), "{log}");
}

/// Item 4: while 1,000 bad CONNECTs arrive over about a second (four threads), a valid client
/// still connects and gets a receipted SEND through, again and again; every bad one gets
/// `access denied` and its connection closed; and the gateway counts exactly the bad ones in
/// `stompgate_auth_failures_total`. The gateway is a child process (its counter is its own).
/// The 5 s bound per valid connect + receipted SEND is generous on purpose: it states that
/// valid logins are not starved, not how fast they are.
#[test]
fn a_burst_of_bad_tokens_does_not_starve_valid_logins() {
    const ATTACKERS: u64 = 4;
    const PER_ATTACKER: u64 = 250;
    let key = TempFile::new("burst", SECRET);
    let metrics = common::metrics::free_port();
    let metrics_arg = metrics.to_string();
    let gw = common::child::Gateway::spawn(&["--auth-jwt-key", key.path(), "--auth-jwt-alg", "HS256", "--metrics-addr", &metrics_arg], None);
    let addr = gw.stomp_addr;
    let failures = || common::metrics::scrape_sum_at(metrics, "stompgate_auth_failures_total");
    assert_eq!(failures(), 0.0);
    let done = Arc::new(AtomicU64::new(0));
    let refused = Arc::new(AtomicU64::new(0));
    let bad_token = encode(&Header::new(Algorithm::HS256), &serde_json::json!({"sub": "x", "exp": now() + 600}), &EncodingKey::from_secret(b"wrong")).unwrap();
    let started = Instant::now();
    let attackers: Vec<_> = (0..ATTACKERS)
        .map(|_| {
            let (done, refused, bad_token) = (Arc::clone(&done), Arc::clone(&refused), bad_token.clone());
            std::thread::spawn(move || {
                // 250 per thread over about a second: 5 every 20 ms.
                let mut next = Instant::now();
                for i in 0..PER_ATTACKER {
                    let mut c = Client::open(addr);
                    c.send("CONNECT", &[("accept-version", "1.2"), ("host", "/"), ("passcode", &bad_token)], b"");
                    let f = c.frame();
                    assert_eq!((f.command.as_str(), f.header("message")), ("ERROR", Some("access denied")));
                    assert!(c.closed(), "a refused connection stays open");
                    refused.fetch_add(1, Ordering::Relaxed);
                    if i % 5 == 4 {
                        next += Duration::from_millis(20);
                        if let Some(d) = next.checked_duration_since(Instant::now()) {
                            std::thread::sleep(d);
                        }
                    }
                }
                done.fetch_add(1, Ordering::Relaxed);
            })
        })
        .collect();
    let valid = hs256(serde_json::json!({"sub": "valid", "exp": now() + 600}));
    let mut rounds = 0;
    while done.load(Ordering::Relaxed) < ATTACKERS {
        let t0 = Instant::now();
        let mut c = Client::open(addr);
        c.send("CONNECT", &[("accept-version", "1.2"), ("host", "/"), ("login", "valid"), ("passcode", &valid)], b"");
        assert_eq!(c.frame().command, "CONNECTED");
        send_with_receipt(&mut c, "SEND", &[("destination", &format!("/queue/{}", unique("burst")))], b"ping", "r");
        assert!(t0.elapsed() < Duration::from_secs(5), "a valid login + receipted SEND took {:?} during the burst", t0.elapsed());
        rounds += 1;
    }
    for a in attackers {
        a.join().expect("attacker thread");
    }
    let bad = refused.load(Ordering::Relaxed);
    let secs = started.elapsed().as_secs_f64();
    eprintln!("burst: {bad} bad CONNECTs refused in {secs:.1} s ({:.0}/s) beside {rounds} valid connect + receipted SENDs", bad as f64 / secs);
    assert_eq!(bad, ATTACKERS * PER_ATTACKER);
    assert!(rounds >= 1);
    // Each failure is counted before its ERROR is written, so the count is complete now.
    assert_eq!(failures(), bad as f64, "auth failures counted");
    drop(gw);
}

/// Item 6: with stderr not a terminal (a pipe here), log lines carry no ANSI colour codes,
/// the audit lines included. The audit line names the client's address (looked up only when
/// authentication needs it).
#[test]
fn logs_to_a_pipe_have_no_ansi_escape_codes() {
    let key = TempFile::new("ansi", SECRET);
    let gw = common::child::Gateway::spawn(&["--auth-jwt-key", key.path(), "--auth-jwt-alg", "HS256"], None);
    let mut c = Client::open(gw.stomp_addr);
    let client_addr = c.local_addr().to_string();
    c.send("CONNECT", &[("accept-version", "1.2"), ("host", "/"), ("passcode", "garbage")], b"");
    assert_eq!(c.frame().header("message"), Some("access denied"));
    assert!(c.closed());
    let log = gw.stop();
    assert!(log.contains("listening") && log.contains("auth.failure"), "the log has the lines this checks: {log}");
    let audit = log.lines().find(|l| l.contains("auth.failure")).unwrap();
    assert!(audit.contains(&format!("source=\"{client_addr}\"")), "the audit line names the client's address {client_addr}: {audit}");
    assert!(!log.contains("\x1b["), "ANSI escape codes in a log written to a pipe: {log:?}");
}

/// The gRPC API takes the same JWT as `authorization` metadata and applies the same rules:
/// UNAUTHENTICATED without a valid token, PERMISSION_DENIED outside the rules.
#[test]
fn grpc_calls_take_the_same_jwt_and_rules() {
    use common::grpc::pb;
    use stompgate::wire::pb::kubemq_client::KubemqClient;
    let key = TempFile::new("grpc", SECRET);
    let rules = TempFile::new("grpc-rules", RULES.as_bytes());
    let server = server_with(Some((&key, JwtAlg::HS256)), Some(&rules));
    let auth = Auth { jwt: Some(Arc::new(JwtVerifier::load(&key.0, JwtAlg::HS256).unwrap())), authz: Some(Arc::new(Authz::load(&rules.0).unwrap())) };
    let security = stompgate::grpc::Security { auth, ..Default::default() };
    let grpc = stompgate::grpc::start_secured("127.0.0.1:0".parse().unwrap(), 1, server.array(), stompgate::grpc::Limits::default(), security).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", grpc.local_addr())).unwrap().connect().await.unwrap();
        let mut client = KubemqClient::new(channel);
        let call = |token: Option<String>, ch: String| {
            let mut req = tonic::Request::new(pb::QueueMessage { channel: ch, client_id: "declared".into(), body: b"x".to_vec(), ..Default::default() });
            if let Some(t) = token {
                req.metadata_mut().insert("authorization", t.parse().unwrap());
            }
            req
        };
        let alice = hs256(serde_json::json!({"ClientID": "alice", "exp": now() + 600}));
        let ok = format!("auth-ok.{}", unique("g"));
        let res = client.send_queue_message(call(Some(alice.clone()), ok.clone())).await.expect("allowed");
        assert!(!res.get_ref().is_error, "{res:?}");
        let res = client.send_queue_message(call(Some(format!("Bearer {alice}")), ok.clone())).await.expect("Bearer prefix");
        assert!(!res.get_ref().is_error, "{res:?}");
        let denied = client.send_queue_message(call(Some(alice.clone()), unique("other"))).await.unwrap_err();
        assert_eq!(denied.code(), tonic::Code::PermissionDenied, "{denied:?}");
        assert_eq!(denied.message(), "access denied");
        let bob = hs256(serde_json::json!({"ClientID": "bob", "exp": now() + 600}));
        assert_eq!(client.send_queue_message(call(Some(bob), ok.clone())).await.unwrap_err().code(), tonic::Code::PermissionDenied);
        for bad in [None, Some("garbage".to_string()), Some(hs256(serde_json::json!({"sub": "alice", "exp": now() - 3600})))] {
            let refused = client.send_queue_message(call(bad.clone(), ok.clone())).await.unwrap_err();
            assert_eq!(refused.code(), tonic::Code::Unauthenticated, "{bad:?}: {refused:?}");
            assert_eq!(refused.message(), "access denied");
        }
    });
    grpc.shutdown();
}

const STREAM_RULES: &str = r#"[
    {"ClientID": "alice", "Queues": true, "Channel": "sa-ok\\..*", "Read": true, "Write": true},
    {"ClientID": "alice", "Events": true, "EventsStore": true, "Channel": "sa-pub\\..*", "Write": true}
]"#;

/// SendEventsStream, QueuesUpstream and QueuesDownstream check each message on its own: a
/// denied one gets KubeMQ's in-band error result (`access denied`), the allowed ones on the same
/// stream are served, and nothing denied reaches the array. The identity is the JWT's
/// (`alice`), not the messages' declared `ClientID`.
#[test]
fn grpc_streams_check_each_message_and_keep_serving_the_allowed_ones() {
    use common::grpc::{ds, event, feed, next, ok, pb, queue_message, quiet, store_subscription, take};
    use stompgate::wire::pb::kubemq_client::KubemqClient;
    let key = TempFile::new("grpc-streams", SECRET);
    let rules = TempFile::new("grpc-stream-rules", STREAM_RULES.as_bytes());
    let server = server_with(None, None);
    let auth = Auth { jwt: Some(Arc::new(JwtVerifier::load(&key.0, JwtAlg::HS256).unwrap())), authz: Some(Arc::new(Authz::load(&rules.0).unwrap())) };
    let security = stompgate::grpc::Security { auth, ..Default::default() };
    let grpc = stompgate::grpc::start_secured("127.0.0.1:0".parse().unwrap(), 1, server.array(), stompgate::grpc::Limits::default(), security).unwrap();
    // The same array without rules: where the test looks for what the denied messages did not do.
    let open = stompgate::grpc::start("127.0.0.1:0".parse().unwrap(), 1, server.array()).unwrap();
    let token: tonic::metadata::MetadataValue<_> = hs256(serde_json::json!({"ClientID": "alice", "exp": now() + 600})).parse().unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    rt.block_on(async {
        let connect = |addr: std::net::SocketAddr| async move {
            let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}")).unwrap().connect().await.unwrap();
            KubemqClient::new(channel)
        };
        // tonic's interceptor signature fixes the error type.
        #[allow(clippy::result_large_err)]
        let with_token = move |req: tonic::Request<()>| -> Result<tonic::Request<()>, tonic::Status> {
            let mut req = req;
            req.metadata_mut().insert("authorization", token.clone());
            Ok(req)
        };
        let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", grpc.local_addr())).unwrap().connect().await.unwrap();
        let mut c = KubemqClient::with_interceptor(channel, with_token);
        let mut unruled = connect(open.local_addr()).await;

        // SendEventsStream: store events allowed, denied, allowed; a plain denied event is
        // answered too (an allowed plain event is not, as without rules).
        let (pub_ch, secret_ch) = (format!("sa-pub.{}", unique("e")), format!("sa-secret.{}", unique("e")));
        let mut secret_store = ok("SubscribeToEvents", unruled.subscribe_to_events(store_subscription(&secret_ch, 2, 0))).await;
        let (tx, events) = feed::<pb::Event>();
        let mut results = ok("SendEventsStream", c.send_events_stream(events)).await;
        let with_id = |id: &str, e: pb::Event| pb::Event { event_id: id.into(), ..e };
        tx.send(with_id("st-ok-1", event(&pub_ch, b"a", true))).unwrap();
        tx.send(with_id("st-denied", event(&secret_ch, b"x", true))).unwrap();
        tx.send(with_id("ev-ok", event(&pub_ch, b"b", false))).unwrap();
        tx.send(with_id("ev-denied", event(&secret_ch, b"y", false))).unwrap();
        tx.send(with_id("st-ok-2", event(&pub_ch, b"c", true))).unwrap();
        let got = take(&mut results, 4).await;
        let summary: Vec<(&str, bool, &str)> = got.iter().map(|r| (r.event_id.as_str(), r.sent, r.error.as_str())).collect();
        assert_eq!(summary, [("st-ok-1", true, ""), ("st-denied", false, "access denied"), ("ev-denied", false, "access denied"), ("st-ok-2", true, "")]);
        quiet(&mut results).await;
        quiet(&mut secret_store).await;
        let mut pub_store = ok("SubscribeToEvents", unruled.subscribe_to_events(store_subscription(&pub_ch, 2, 0))).await;
        let stored: Vec<Vec<u8>> = take(&mut pub_store, 2).await.into_iter().map(|e| e.body).collect();
        assert_eq!(stored, [b"a".to_vec(), b"c".to_vec()]);
        drop(tx);

        // QueuesUpstream: one request with an allowed and a denied message, then an allowed one.
        let (ok_q, secret_q) = (format!("sa-ok.{}", unique("q")), format!("sa-secret.{}", unique("q")));
        let (tx, requests) = feed::<pb::QueuesUpstreamRequest>();
        let mut responses = ok("QueuesUpstream", c.queues_upstream(requests)).await;
        let msg = |ch: &str, id: &str, body: &[u8]| pb::QueueMessage { message_id: id.into(), ..queue_message(ch, body) };
        tx.send(pb::QueuesUpstreamRequest { request_id: "u1".into(), messages: vec![msg(&ok_q, "m1", b"one"), msg(&secret_q, "m2", b"no")] }).unwrap();
        tx.send(pb::QueuesUpstreamRequest { request_id: "u2".into(), messages: vec![msg(&ok_q, "m3", b"two")] }).unwrap();
        let r1 = next(&mut responses).await;
        assert_eq!((r1.ref_request_id.as_str(), r1.is_error), ("u1", false), "{r1:?}");
        let per_message: Vec<(&str, bool, &str)> = r1.results.iter().map(|r| (r.message_id.as_str(), r.is_error, r.error.as_str())).collect();
        assert_eq!(per_message, [("m1", false, ""), ("m2", true, "access denied")]);
        let r2 = next(&mut responses).await;
        assert_eq!((r2.ref_request_id.as_str(), r2.is_error, r2.results.len(), r2.results[0].is_error), ("u2", false, 1, false), "{r2:?}");
        drop(tx);
        let peek = |ch: &str| pb::ReceiveQueueMessagesRequest {
            client_id: "test".into(),
            channel: ch.into(),
            max_number_of_messages: 10,
            wait_time_seconds: 1,
            is_peak: true,
            ..Default::default()
        };
        let denied_q = ok("ReceiveQueueMessages", unruled.receive_queue_messages(peek(&secret_q))).await;
        assert_eq!(denied_q.messages.len(), 0, "a denied upstream message reached its queue: {denied_q:?}");

        // QueuesDownstream: a Get on a denied queue is refused in-band, and the same stream
        // then gets from the allowed one.
        let (tx, requests) = feed::<pb::QueuesDownstreamRequest>();
        let mut down = ok("QueuesDownstream", c.queues_downstream(requests)).await;
        let get = |id: &str, ch: &str| pb::QueuesDownstreamRequest {
            request_id: id.into(),
            client_id: "grpc-test".into(),
            request_type_data: ds::GET,
            channel: ch.into(),
            max_items: 10,
            wait_timeout: 1000,
            auto_ack: true,
            ..Default::default()
        };
        tx.send(get("g-denied", &secret_q)).unwrap();
        let denied = next(&mut down).await;
        assert_eq!(
            (denied.ref_request_id.as_str(), denied.request_type_data, denied.is_error, denied.error.as_str()),
            ("g-denied", ds::GET, true, "access denied"),
            "{denied:?}"
        );
        assert!(denied.messages.is_empty());
        tx.send(get("g-ok", &ok_q)).unwrap();
        let got = next(&mut down).await;
        assert_eq!((got.ref_request_id.as_str(), got.is_error), ("g-ok", false), "{got:?}");
        let bodies: Vec<Vec<u8>> = got.messages.into_iter().map(|m| m.body).collect();
        assert_eq!(bodies, [b"one".to_vec(), b"two".to_vec()]);
    });
    rt.shutdown_timeout(Duration::from_millis(500));
    grpc.shutdown();
    open.shutdown();
}
