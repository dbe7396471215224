//! STOMP over TLS (issue 14, items 1 and 5): a rustls client through CONNECT / SUBSCRIBE /
//! SEND / MESSAGE, the wrong protocol on each port, mutual TLS with the certificate CN as the
//! client id, TLS 1.1 refused, `openssl s_client`, certificate reload on SIGHUP, and a second
//! gateway refused a port the first one holds. Certificates are made here with rcgen.
use crate::common;

use common::grpc::{pb, within};
use common::TestServer;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const PROMPT: Duration = Duration::from_secs(5);

/// A CA and what it signs, with PEM files in a directory of their own (removed on drop).
struct Pki {
    dir: PathBuf,
    ca: rcgen::Certificate,
    ca_key: rcgen::KeyPair,
}

/// A leaf certificate: its DER and PEM files.
struct Leaf {
    der: CertificateDer<'static>,
    key: PrivateKeyDer<'static>,
    cert_file: PathBuf,
    key_file: PathBuf,
}

impl Pki {
    fn new() -> Pki {
        static N: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!("stompgate-tls-{}-{}", std::process::id(), N.fetch_add(1, Ordering::Relaxed)));
        std::fs::create_dir_all(&dir).unwrap();
        let ca_key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params.distinguished_name.push(rcgen::DnType::CommonName, "stompgate test CA");
        params.key_usages = vec![rcgen::KeyUsagePurpose::KeyCertSign, rcgen::KeyUsagePurpose::CrlSign];
        let ca = params.self_signed(&ca_key).unwrap();
        std::fs::write(dir.join("ca.pem"), ca.pem()).unwrap();
        Pki { dir, ca, ca_key }
    }

    fn ca_file(&self) -> PathBuf {
        self.dir.join("ca.pem")
    }

    fn roots(&self) -> rustls::RootCertStore {
        let mut roots = rustls::RootCertStore::empty();
        roots.add(self.ca.der().clone()).unwrap();
        roots
    }

    /// A server certificate for localhost / 127.0.0.1, written as `name`.pem / `name`.key.
    fn server(&self, name: &str) -> Leaf {
        let params = rcgen::CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()]).unwrap();
        self.leaf(name, params)
    }

    /// A client certificate with subject CN `cn`.
    fn client(&self, name: &str, cn: &str) -> Leaf {
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.distinguished_name.push(rcgen::DnType::CommonName, cn);
        params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
        self.leaf(name, params)
    }

    fn leaf(&self, name: &str, params: rcgen::CertificateParams) -> Leaf {
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.ca, &self.ca_key).unwrap();
        let (cert_file, key_file) = (self.dir.join(format!("{name}.pem")), self.dir.join(format!("{name}.key")));
        std::fs::write(&cert_file, cert.pem()).unwrap();
        std::fs::write(&key_file, key.serialize_pem()).unwrap();
        Leaf { der: cert.der().clone(), key: PrivateKeyDer::try_from(key.serialize_der()).unwrap(), cert_file, key_file }
    }
}

impl Drop for Pki {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn tls_settings(server: &Leaf, client_ca: Option<PathBuf>) -> stompgate::config::StompTls {
    stompgate::config::StompTls { cert_file: server.cert_file.clone(), key_file: server.key_file.clone(), client_ca_file: client_ca }
}

/// A gateway with plain STOMP and TLS STOMP, both on free loopback ports.
fn tls_gateway(server: &Leaf, client_ca: Option<PathBuf>) -> TestServer {
    TestServer::start_with(|c| {
        c.stomp_tls = Some(tls_settings(server, client_ca));
        c.stomp_tls_addr = Some("127.0.0.1:0".parse().unwrap());
    })
}

fn tls_addr(gw: &TestServer) -> SocketAddr {
    gw.server().stomp_tls_addr().expect("the TLS listener is bound")
}

fn client_config(pki: &Pki, cert: Option<&Leaf>) -> Arc<rustls::ClientConfig> {
    let builder = rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(pki.roots());
    Arc::new(match cert {
        Some(leaf) => builder.with_client_auth_cert(vec![leaf.der.clone()], leaf.key.clone_key()).unwrap(),
        None => builder.with_no_client_auth(),
    })
}

/// A STOMP client over rustls (blocking).
struct TlsClient {
    s: rustls::StreamOwned<rustls::ClientConnection, TcpStream>,
    buf: Vec<u8>,
}

/// One received frame: command, headers, body.
#[derive(Debug)]
struct Frame {
    command: String,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Frame {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
    }
}

impl TlsClient {
    fn open(addr: SocketAddr, config: Arc<rustls::ClientConfig>) -> TlsClient {
        let tcp = TcpStream::connect(addr).unwrap();
        tcp.set_read_timeout(Some(PROMPT)).unwrap();
        let conn = rustls::ClientConnection::new(config, ServerName::try_from("localhost").unwrap()).unwrap();
        TlsClient { s: rustls::StreamOwned::new(conn, tcp), buf: Vec::new() }
    }

    /// Completes the handshake (what a first write would do), or says why not.
    fn handshake(&mut self) -> std::io::Result<()> {
        while self.s.conn.is_handshaking() {
            self.s.conn.complete_io(&mut self.s.sock)?;
        }
        Ok(())
    }

    fn send(&mut self, command: &str, headers: &[(&str, &str)], body: &str) -> std::io::Result<()> {
        let mut f = format!("{command}\n");
        for (k, v) in headers {
            f.push_str(&format!("{k}:{v}\n"));
        }
        f.push('\n');
        f.push_str(body);
        f.push('\0');
        self.s.write_all(f.as_bytes())?;
        self.s.flush()
    }

    /// The next frame (heart-beat newlines skipped); `Err` on EOF, a TLS error or PROMPT.
    fn frame(&mut self) -> std::io::Result<Frame> {
        loop {
            while self.buf.first() == Some(&b'\n') {
                self.buf.remove(0);
            }
            if let Some(end) = self.buf.iter().position(|&b| b == 0) {
                let raw: Vec<u8> = self.buf.drain(..=end).collect();
                let text = String::from_utf8_lossy(&raw[..end]).into_owned();
                let (head, body) = text.split_once("\n\n").unwrap_or((&text, ""));
                let mut lines = head.lines();
                let command = lines.next().unwrap_or_default().to_string();
                let headers = lines.filter_map(|l| l.split_once(':')).map(|(k, v)| (k.to_string(), v.to_string())).collect();
                return Ok(Frame { command, headers, body: body.as_bytes().to_vec() });
            }
            let mut chunk = [0u8; 4096];
            let n = self.s.read(&mut chunk)?;
            if n == 0 {
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
            self.buf.extend_from_slice(&chunk[..n]);
        }
    }

    fn connect(&mut self, login: Option<&str>) -> Frame {
        let mut headers = vec![("accept-version", "1.2"), ("host", "/")];
        if let Some(l) = login {
            headers.push(("login", l));
        }
        self.send("CONNECT", &headers, "").expect("CONNECT written");
        self.frame().expect("an answer to CONNECT")
    }
}

#[test]
fn connect_subscribe_send_message_over_tls() {
    let pki = Pki::new();
    let server = pki.server("server");
    let gw = tls_gateway(&server, None);
    let config = client_config(&pki, None);
    let mut sub = TlsClient::open(tls_addr(&gw), Arc::clone(&config));
    assert_eq!(sub.connect(None).command, "CONNECTED");
    sub.send("SUBSCRIBE", &[("id", "1"), ("destination", "/topic/tlsfanout"), ("receipt", "r1")], "").unwrap();
    let receipt = sub.frame().unwrap();
    assert_eq!((receipt.command.as_str(), receipt.header("receipt-id")), ("RECEIPT", Some("r1")));
    let mut publisher = TlsClient::open(tls_addr(&gw), config);
    assert_eq!(publisher.connect(None).command, "CONNECTED");
    publisher.send("SEND", &[("destination", "/topic/tlsfanout"), ("receipt", "s1")], "over tls").unwrap();
    assert_eq!(publisher.frame().unwrap().header("receipt-id"), Some("s1"));
    let m = sub.frame().unwrap();
    assert_eq!((m.command.as_str(), m.header("destination"), &m.body[..]), ("MESSAGE", Some("/topic/tlsfanout"), &b"over tls"[..]));
    // Plain STOMP still serves beside it.
    let mut plain = gw.connected();
    plain.send("DISCONNECT", &[("receipt", "bye")], b"");
    assert_eq!(plain.frame().header("receipt-id"), Some("bye"));
}

#[test]
fn a_plain_client_on_the_tls_port_is_closed_promptly_and_the_gateway_keeps_serving() {
    let pki = Pki::new();
    let server = pki.server("server");
    let gw = tls_gateway(&server, None);
    let mut raw = TcpStream::connect(tls_addr(&gw)).unwrap();
    raw.set_read_timeout(Some(PROMPT)).unwrap();
    raw.write_all(b"CONNECT\naccept-version:1.2\n\n\0").unwrap();
    let started = Instant::now();
    let mut answer = Vec::new();
    // Whatever comes back (a TLS alert at most), the connection ends: EOF or a reset.
    let end = raw.read_to_end(&mut answer);
    assert!(started.elapsed() < PROMPT, "closed within the read timeout");
    assert!(!String::from_utf8_lossy(&answer).contains("CONNECTED"), "no STOMP answer on the TLS port: {answer:?} {end:?}");
    let mut ok = TlsClient::open(tls_addr(&gw), client_config(&pki, None));
    assert_eq!(ok.connect(None).command, "CONNECTED", "the TLS listener still serves");
}

#[test]
fn a_tls_client_on_the_plain_port_fails_cleanly() {
    let pki = Pki::new();
    let server = pki.server("server");
    let gw = tls_gateway(&server, None);
    let mut c = TlsClient::open(gw.addr, client_config(&pki, None));
    let started = Instant::now();
    assert!(c.handshake().is_err(), "no TLS handshake on the plain STOMP port");
    assert!(started.elapsed() < PROMPT + Duration::from_secs(1));
    let mut plain = gw.connected();
    plain.send("DISCONNECT", &[("receipt", "bye")], b"");
    assert_eq!(plain.frame().header("receipt-id"), Some("bye"), "plain STOMP still serves");
}

#[test]
fn mutual_tls_refuses_a_client_without_a_certificate_and_the_cn_becomes_the_client_id() {
    let pki = Pki::new();
    let server = pki.server("server");
    let gw = tls_gateway(&server, Some(pki.ca_file()));

    let mut anonymous = TlsClient::open(tls_addr(&gw), client_config(&pki, None));
    let refused = anonymous.handshake().and_then(|_| anonymous.send("CONNECT", &[("accept-version", "1.2")], "")).and_then(|_| anonymous.frame());
    assert!(refused.is_err(), "no client certificate: refused, got {refused:?}");

    let stranger_pki = Pki::new();
    let stranger = stranger_pki.client("stranger", "mallory");
    let mut foreign = TlsClient::open(tls_addr(&gw), client_config(&pki, Some(&stranger)));
    let refused = foreign.handshake().and_then(|_| foreign.send("CONNECT", &[("accept-version", "1.2")], "")).and_then(|_| foreign.frame());
    assert!(refused.is_err(), "a certificate from another CA: refused, got {refused:?}");

    let alice = pki.client("alice", "alice-cn");
    let mut c = TlsClient::open(tls_addr(&gw), client_config(&pki, Some(&alice)));
    // `login` names someone else: the verified certificate wins.
    assert_eq!(c.connect(Some("bob")).command, "CONNECTED");
    let queue = common::unique("tls.mtls");
    c.send("SEND", &[("destination", &format!("/queue/{queue}")), ("receipt", "s1")], "from alice").unwrap();
    assert_eq!(c.frame().unwrap().header("receipt-id"), Some("s1"));

    // The client id as the array stored it, through the KubeMQ gRPC API.
    let grpc = stompgate::grpc::start_with("127.0.0.1:0".parse().unwrap(), 1, gw.array(), stompgate::grpc::Limits::default()).expect("gRPC starts");
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let got = rt.block_on(async {
        let endpoint = tonic::transport::Endpoint::from_shared(format!("http://{}", grpc.local_addr())).unwrap();
        let mut client = pb::kubemq_client::KubemqClient::new(within("connect", endpoint.connect()).await.unwrap());
        let req = pb::ReceiveQueueMessagesRequest {
            request_id: "r".into(),
            client_id: "reader".into(),
            channel: queue.clone(),
            max_number_of_messages: 1,
            wait_time_seconds: 2,
            is_peak: false,
        };
        within("receive", client.receive_queue_messages(req)).await.unwrap().into_inner()
    });
    drop(rt);
    grpc.shutdown();
    assert_eq!(got.messages.len(), 1, "{got:?}");
    assert_eq!((got.messages[0].client_id.as_str(), &got.messages[0].body[..]), ("alice-cn", &b"from alice"[..]));
}

/// `openssl s_client` with its success and output; `input` is written to its stdin, which
/// stays open for `linger` (`-quiet` also ignores EOF: the server's close ends it).
fn s_client(addr: SocketAddr, ca: &std::path::Path, extra: &[&str], input: &[u8], linger: Duration) -> (bool, String) {
    let mut child = Command::new("openssl")
        .args(["s_client", "-connect", &addr.to_string(), "-servername", "localhost", "-verify_return_error", "-CAfile"])
        .arg(ca)
        .args(extra)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("openssl is installed");
    let mut stdin = child.stdin.take().unwrap();
    let _ = stdin.write_all(input);
    std::thread::sleep(linger);
    drop(stdin);
    // s_client ends when the server closes (after the DISCONNECT receipt) or the handshake
    // fails; a hung one is killed so the test fails on its output rather than hanging.
    let deadline = Instant::now() + PROMPT;
    while child.try_wait().unwrap().is_none() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let out = child.wait_with_output().unwrap();
    (out.status.success(), format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)))
}

#[test]
fn openssl_s_client_speaks_stomp_over_tls_and_tls_1_1_is_refused() {
    let pki = Pki::new();
    let server = pki.server("server");
    let gw = tls_gateway(&server, None);
    let connect = b"CONNECT\naccept-version:1.2\nhost:/\n\n\0DISCONNECT\nreceipt:bye\n\n\0";
    let (_, out) = s_client(tls_addr(&gw), &pki.ca_file(), &["-quiet"], connect, Duration::from_millis(1500));
    assert!(out.contains("CONNECTED\n"), "s_client got CONNECTED: {out}");
    assert!(out.contains("version:1.2") && out.contains("receipt-id:bye"), "{out}");
    // TLS 1.2 offered alone is served (the control for the 1.1 case below) ...
    let (_, out) = s_client(tls_addr(&gw), &pki.ca_file(), &["-quiet", "-tls1_2"], connect, Duration::from_millis(1500));
    assert!(out.contains("CONNECTED\n") && out.contains("version:1.2"), "TLS 1.2 served: {out}");
    // ... TLS 1.1 is not. SECLEVEL=0 lets openssl itself offer 1.1, so a refusal is the server's.
    let (ok, out) = s_client(tls_addr(&gw), &pki.ca_file(), &["-tls1_1", "-cipher", "DEFAULT@SECLEVEL=0"], connect, Duration::from_millis(500));
    // (s_client prints "CONNECTED(fd)" for the TCP connection; the STOMP answer would carry
    // `version:`.) The server answers a 1.1 ClientHello with a handshake_failure alert.
    assert!(!ok && !out.contains("version:1.2") && out.contains("alert"), "TLS 1.1 must be refused: {out}");
    assert!(!out.contains("no protocols available"), "openssl could not offer TLS 1.1 here, so this case proves nothing: {out}");
}

/// The leaf certificate a new connection is served, as DER.
fn served_certificate(addr: SocketAddr, pki: &Pki) -> Vec<u8> {
    let mut c = TlsClient::open(addr, client_config(pki, None));
    c.handshake().expect("handshake");
    c.s.conn.peer_certificates().expect("a server certificate")[0].to_vec()
}

/// Starts the built gateway with TLS on free ports and waits for both listeners: each core binds
/// all its listeners before it accepts on any, so once the plain port answers (what
/// `Gateway::spawn` waits for) the TLS port does too. Probing the TLS port with a bare TCP
/// connect would itself be a failed handshake, counted in `stompgate_tls_handshakes_failed_total`
/// when the gateway reads its EOF (a race with the tests that count them).
fn spawn_tls_gateway(server: &Leaf, extra: &[&str]) -> (common::child::Gateway, SocketAddr) {
    let tls = common::metrics::free_port();
    let cert = server.cert_file.to_str().unwrap();
    let key = server.key_file.to_str().unwrap();
    let mut args = vec!["--tls-cert", cert, "--tls-key", key];
    let tls_arg = tls.to_string();
    args.extend(["--stomp-tls-addr", &tls_arg]);
    args.extend(extra);
    let gw = common::child::Gateway::spawn(&args, None);
    (gw, tls)
}

#[test]
fn sighup_reloads_the_certificate_for_new_connections() {
    let pki = Pki::new();
    let first = pki.server("served");
    let (gw, tls) = spawn_tls_gateway(&first, &[]);
    assert_eq!(served_certificate(tls, &pki), first.der.to_vec());
    let mut open = TlsClient::open(tls, client_config(&pki, None));
    assert_eq!(open.connect(None).command, "CONNECTED");

    // New files at the same paths, then SIGHUP.
    let second = pki.server("served");
    assert_ne!(first.der, second.der);
    // SAFETY: kill(2) on our own child.
    assert_eq!(unsafe { libc::kill(gw.pid() as i32, libc::SIGHUP) }, 0);
    let deadline = Instant::now() + PROMPT;
    while served_certificate(tls, &pki) != second.der.to_vec() {
        assert!(Instant::now() < deadline, "the new certificate is served after SIGHUP");
        std::thread::sleep(Duration::from_millis(50));
    }
    // The connection made before the reload goes on.
    open.send("DISCONNECT", &[("receipt", "bye")], "").unwrap();
    assert_eq!(open.frame().unwrap().header("receipt-id"), Some("bye"));

    // A broken file: refused with a logged reason, the last good certificate stays.
    std::fs::write(&second.cert_file, "not a certificate").unwrap();
    // SAFETY: as above.
    assert_eq!(unsafe { libc::kill(gw.pid() as i32, libc::SIGHUP) }, 0);
    let deadline = Instant::now() + PROMPT;
    let log = loop {
        assert_eq!(served_certificate(tls, &pki), second.der.to_vec(), "the previous certificate is still served");
        if Instant::now() > deadline {
            break gw.stop();
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    assert!(log.contains("TLS reload refused"), "{log}");
}

/// Runs the gateway binary with `args` and waits for it to exit (or fails the test).
fn run_to_exit(args: &[&str]) -> (std::process::ExitStatus, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_stompgate"))
        // No WebSocket listener: the second gateway's listeners are exactly those under test.
        .args(["--cores", "1", "--grpc-addr", "off", "--ws-addr", "off", "--amqp-addr", "off", "--store-dir", "off"])
        .args(args)
        .env("STOMPGATE_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            let mut err = String::new();
            child.stderr.take().unwrap().read_to_string(&mut err).unwrap();
            return (status, err);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the second gateway kept running on a port the first holds");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_second_gateway_cannot_share_a_port_the_first_holds() {
    let pki = Pki::new();
    let server = pki.server("server");
    let (first, tls) = spawn_tls_gateway(&server, &[]);
    let (plain, tls_s) = (first.stomp_addr.to_string(), tls.to_string());

    // Its only listener is taken: it exits non-zero, saying why.
    let (status, err) = run_to_exit(&["--stomp-addr", &plain]);
    assert!(!status.success(), "{err}");
    assert!(err.contains(&plain) && err.contains("in use"), "{err}");

    // Both of its listeners taken (plain and TLS): the same.
    let cert = server.cert_file.to_str().unwrap();
    let key = server.key_file.to_str().unwrap();
    let (status, err) = run_to_exit(&["--stomp-addr", &plain, "--tls-cert", cert, "--tls-key", key, "--stomp-tls-addr", &tls_s]);
    assert!(!status.success(), "{err}");

    // One taken, one free: it runs on with the free one and logs the other.
    let free = common::metrics::free_port();
    let mut second = Command::new(env!("CARGO_BIN_EXE_stompgate"))
        .args(["--cores", "1", "--grpc-addr", "off", "--stomp-addr", &plain, "--tls-cert", cert, "--tls-key", key, "--stomp-tls-addr", &free.to_string()])
        .args(["--ws-addr", "off", "--amqp-addr", "off", "--store-dir", "off"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while TcpStream::connect(free).is_err() {
        assert!(Instant::now() < deadline, "the second gateway serves its free TLS port");
        assert!(second.try_wait().unwrap().is_none(), "the second gateway runs on");
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = second.kill();
    let out = second.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(&plain) && err.contains("continuing without this STOMP listener"), "{err}");

    // The first gateway was never disturbed: every connection to its port is its own.
    let mut c = common::stomp_client::Client::open(first.stomp_addr);
    assert_eq!(c.connect("1.2").command, "CONNECTED");
    drop(first);
}

/// A client that starts a TLS handshake and stalls (half a ClientHello, then silence) is closed
/// once `--connect-timeout-s` has passed, and counted in
/// `stompgate_tls_handshakes_failed_total`; another TLS client is served meanwhile, on the
/// same single core. The gateway is a child process, so the counter is its own.
#[test]
fn a_stalled_handshake_is_closed_at_the_connect_timeout_and_counted_while_others_are_served() {
    const TIMEOUT_S: u64 = 2;
    let pki = Pki::new();
    let server = pki.server("server");
    let metrics = common::metrics::free_port();
    let (metrics_arg, timeout_arg) = (metrics.to_string(), TIMEOUT_S.to_string());
    let (gw, tls) = spawn_tls_gateway(&server, &["--connect-timeout-s", &timeout_arg, "--metrics-addr", &metrics_arg]);
    let failed = || common::metrics::scrape_sum_at(metrics, "stompgate_tls_handshakes_failed_total");
    assert_eq!(failed(), 0.0);

    let mut stalled = TcpStream::connect(tls).unwrap();
    // A handshake record announcing 512 bytes, and only the start of the ClientHello in it
    // (type 1, length 508, version 3.3, 8 bytes of "random"): the server must wait for more.
    stalled.write_all(&[0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00, 0x01, 0xfc, 0x03, 0x03, 1, 2, 3, 4, 5, 6, 7, 8]).unwrap();
    let stalled_at = Instant::now();

    // Served meanwhile: a full handshake, CONNECT and a receipted SEND.
    let mut other = TlsClient::open(tls, client_config(&pki, None));
    assert_eq!(other.connect(None).command, "CONNECTED");
    other.send("SEND", &[("destination", "/queue/tls-stall"), ("receipt", "s1")], "beside a stalled handshake").unwrap();
    assert_eq!(other.frame().unwrap().header("receipt-id"), Some("s1"));
    assert!(stalled_at.elapsed() < Duration::from_secs(TIMEOUT_S), "the served client was slower than the timeout itself; this run proves nothing");

    // The stalled one ends (EOF or reset) at its deadline: not before (nothing was wrong with
    // what it sent), and not much after (the bound states the promise, with slack for a loaded machine).
    stalled.set_read_timeout(Some(Duration::from_secs(TIMEOUT_S) + PROMPT)).unwrap();
    let mut buf = [0u8; 64];
    let end = stalled.read(&mut buf);
    let closed_after = stalled_at.elapsed();
    assert!(matches!(end, Ok(0)) || end.as_ref().is_err_and(|e| e.kind() == std::io::ErrorKind::ConnectionReset), "closed, got {end:?}");
    assert!(closed_after >= Duration::from_secs(TIMEOUT_S) - Duration::from_millis(100), "closed after {closed_after:?}, before --connect-timeout-s");
    assert!(closed_after < Duration::from_secs(TIMEOUT_S) + Duration::from_secs(3), "closed only after {closed_after:?}");

    // Counted once (the served client's handshake is not a failure). The exporter may publish
    // a core's counters a moment later: wait, bounded.
    let deadline = Instant::now() + PROMPT;
    while failed() < 1.0 {
        assert!(Instant::now() < deadline, "the stalled handshake was not counted");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(failed(), 1.0);
    drop(gw);
}
