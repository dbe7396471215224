//! The load harness over TLS and with JWT authentication (`stompgate-load --tls --tls-ca
//! --passcode-file`, issue 14's benchmark), as a process against an in-process gateway whose
//! only STOMP listener is TLS and which requires a JWT. What is checked is the accounting and
//! that the harness really used TLS and the token (a wrong token, an untrusted CA and a wrong
//! server name each fail the run), never a speed. Certificates are made here with rcgen, the
//! token with `jsonwebtoken`.
use crate::common;

use common::load::{harness, report};
use common::{unique, TestServer};
use jsonwebtoken::{encode, Algorithm, EncodingKey, Header};
use serde_json::{json, Value};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use stompgate::auth::{Auth, JwtAlg, JwtVerifier};

const SECRET: &[u8] = b"load-harness-secret";

/// A directory of PEM files and the token, removed on drop.
struct Files {
    dir: PathBuf,
}

impl Files {
    /// `ca.pem`, `server.pem`/`server.key` (127.0.0.1, localhost) signed by it, `other-ca.pem`
    /// (a CA that signed nothing here), `jwt.key` (the secret) and `token` (a JWT it signs).
    fn new() -> Files {
        let dir = std::env::temp_dir().join(unique("stompgate-load-tls-"));
        std::fs::create_dir_all(&dir).unwrap();
        let ca_key = rcgen::KeyPair::generate().unwrap();
        let ca = ca_params("load test CA").self_signed(&ca_key).unwrap();
        let server_key = rcgen::KeyPair::generate().unwrap();
        let server =
            rcgen::CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()]).unwrap().signed_by(&server_key, &ca, &ca_key).unwrap();
        let other_key = rcgen::KeyPair::generate().unwrap();
        let other = ca_params("another CA").self_signed(&other_key).unwrap();
        std::fs::write(dir.join("ca.pem"), ca.pem()).unwrap();
        std::fs::write(dir.join("server.pem"), server.pem()).unwrap();
        std::fs::write(dir.join("server.key"), server_key.serialize_pem()).unwrap();
        std::fs::write(dir.join("other-ca.pem"), other.pem()).unwrap();
        std::fs::write(dir.join("jwt.key"), SECRET).unwrap();
        let exp = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() + 3600;
        let token = encode(&Header::new(Algorithm::HS256), &json!({"ClientID": "load", "exp": exp}), &EncodingKey::from_secret(SECRET)).unwrap();
        // The trailing newline is the one --passcode-file drops.
        std::fs::write(dir.join("token"), format!("{token}\n")).unwrap();
        Files { dir }
    }

    fn path(&self, name: &str) -> String {
        self.dir.join(name).to_str().unwrap().to_owned()
    }
}

impl Drop for Files {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn ca_params(cn: &str) -> rcgen::CertificateParams {
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    params.distinguished_name.push(rcgen::DnType::CommonName, cn);
    params.key_usages = vec![rcgen::KeyUsagePurpose::KeyCertSign, rcgen::KeyUsagePurpose::CrlSign];
    params
}

/// TLS STOMP only (plain off), JWT authentication on.
fn tls_auth_gateway(files: &Files) -> (TestServer, SocketAddr) {
    let verifier = JwtVerifier::load(Path::new(&files.path("jwt.key")), JwtAlg::HS256).unwrap();
    let server = TestServer::start_with(|c| {
        c.stomp_tls =
            Some(stompgate::config::StompTls { cert_file: files.dir.join("server.pem"), key_file: files.dir.join("server.key"), client_ca_file: None });
        c.stomp_tls_addr = Some("127.0.0.1:0".parse().unwrap());
        c.auth = Auth { jwt: Some(Arc::new(verifier)), authz: None };
    });
    let addr = server.server().stomp_tls_addr().expect("the TLS listener is bound");
    (server, addr)
}

/// The harness's arguments for a short run against `addr`, before the scenario's `extra`.
fn args(scenario: &[&str], addr: SocketAddr, extra: &[String]) -> Vec<String> {
    let mut a: Vec<String> = scenario.iter().map(|s| (*s).to_owned()).collect();
    for s in [
        "--host",
        "127.0.0.1",
        "--port",
        &addr.port().to_string(),
        "--name",
        &unique("load-tls"),
        "--duration-s",
        "1",
        "--warmup-s",
        "0.3",
        "--json",
        "--quiet",
    ] {
        a.push(s.to_owned());
    }
    a.extend_from_slice(extra);
    a
}

fn run_ok(scenario: &[&str], addr: SocketAddr, extra: &[String]) -> Value {
    let a = args(scenario, addr, extra);
    let a: Vec<&str> = a.iter().map(String::as_str).collect();
    report(&harness(&a), &format!("{scenario:?}"))
}

/// A run that must fail at connect time (exit 1); returns its stderr.
fn run_refused(scenario: &[&str], addr: SocketAddr, extra: &[String]) -> String {
    let a = args(scenario, addr, extra);
    let a: Vec<&str> = a.iter().map(String::as_str).collect();
    let out = harness(&a);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(1), "expected exit 1: {stderr}");
    stderr
}

fn n(r: &Value, key: &str) -> u64 {
    r[key].as_u64().unwrap_or_else(|| panic!("{key} missing: {r}"))
}

fn assert_over_tls(r: &Value) {
    let tls = r["tls"].as_str().unwrap_or_else(|| panic!("no negotiated TLS in the report: {r}"));
    assert!(tls.starts_with("TLSv1_3 ") || tls.starts_with("TLSv1_2 "), "{r}");
    assert_eq!(r["params"]["tls"], true, "{r}");
}

fn assert_exact(r: &Value, copies: u64) {
    assert!(n(r, "sent") > 0, "{r}");
    assert_eq!((n(r, "lost"), n(r, "duplicated")), (0, 0), "{r}");
    assert_eq!(n(r, "latency_count"), n(r, "sent") * copies, "every window message arrived once per subscriber: {r}");
}

#[test]
fn every_scenario_runs_over_tls_with_a_jwt_and_accounts_exactly() {
    let files = Files::new();
    let (_server, addr) = tls_auth_gateway(&files);
    let creds = vec!["--tls".into(), "--tls-ca".into(), files.path("ca.pem"), "--login".into(), "load".into(), "--passcode-file".into(), files.path("token")];

    let fanout = run_ok(&["fanout", "--subscribers", "3", "--receipt-every", "200"], addr, &creds);
    assert_over_tls(&fanout);
    assert_exact(&fanout, 3);

    let queue = run_ok(&["queue", "--producers", "2", "--consumers", "2", "--receipt-every", "200"], addr, &creds);
    assert_over_tls(&queue);
    assert_exact(&queue, 1);

    // Paced: the receivers wait in poll(2) between bursts, so records rustls holds must be read.
    let paced = run_ok(&["fanout", "--subscribers", "2", "--rate", "2000"], addr, &creds);
    assert_exact(&paced, 2);

    let connect = run_ok(&["connect", "--workers", "2"], addr, &creds);
    assert_over_tls(&connect);
    assert!(n(&connect, "connections") > 0, "{connect}");

    // TLS 1.3 servers send session tickets after the handshake: not a dropped connection.
    let idle = run_ok(&["idle", "--connections", "20", "--workers", "2"], addr, &creds);
    assert_over_tls(&idle);
    assert_eq!(n(&idle, "dropped"), 0, "{idle}");
}

#[test]
fn a_wrong_token_an_untrusted_ca_or_a_wrong_name_fails_the_run() {
    let files = Files::new();
    let (_server, addr) = tls_auth_gateway(&files);
    let tls = |ca: &str| vec!["--tls".to_owned(), "--tls-ca".to_owned(), files.path(ca)];

    let mut bad_token = tls("ca.pem");
    bad_token.extend(["--passcode".to_owned(), "not-a-jwt".to_owned()]);
    let stderr = run_refused(&["connect", "--workers", "1"], addr, &bad_token);
    assert!(stderr.contains("access denied"), "{stderr}");

    let mut untrusted = tls("other-ca.pem");
    untrusted.extend(["--passcode-file".to_owned(), files.path("token")]);
    let stderr = run_refused(&["connect", "--workers", "1"], addr, &untrusted);
    assert!(stderr.contains("TLS handshake") && stderr.contains("UnknownIssuer"), "{stderr}");

    let mut wrong_name = tls("ca.pem");
    wrong_name.extend(["--tls-server-name".to_owned(), "example.org".to_owned(), "--passcode-file".to_owned(), files.path("token")]);
    let stderr = run_refused(&["connect", "--workers", "1"], addr, &wrong_name);
    assert!(stderr.contains("TLS handshake") && stderr.contains("not valid for name"), "{stderr}");

    // And a plain client on the TLS port never gets a CONNECTED.
    let plain = vec!["--passcode-file".to_owned(), files.path("token")];
    let out = harness(&args(&["connect", "--workers", "1"], addr, &plain).iter().map(String::as_str).collect::<Vec<_>>());
    assert_eq!(out.status.code(), Some(1), "{}", String::from_utf8_lossy(&out.stderr));
}
