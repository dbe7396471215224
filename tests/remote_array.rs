//! Remote array mode (`--array grpc://…|grpcs://…`) beyond what the whole suite already checks
//! in two-gateway mode (`STOMPGATE_TEST_ARRAY=remote`):
//!
//! - gateway B reaches an array that serves TLS only and requires a token, with `grpcs://`,
//!   its CA file and the token; the array refuses calls without the token;
//! - with a wrong token, work that needs the array's confirmation fails at once with ERROR
//!   `internal error` instead of hanging until the 60 s give-up;
//! - an Events-Store subscription whose connection to the array is cut resumes after the last
//!   sequence it delivered: what was published during the cut arrives once, nothing twice;
//!   a plain events subscription is re-established too.
//!
//! Setup: each test builds its own pair in this process: gateway A (embedded array, KubeMQ
//! gRPC API on an ephemeral port, STOMP for publishing straight into the array) and gateway B
//! in remote mode in front of it, sometimes through a TCP proxy that can cut the connection.
use crate::common;

use common::flow::Flow;
use common::props::{expect_error_close, send_with_receipt, subscribe};
use common::{unique, Client, Frame};
use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use stompgate::config::{ArrayMode, Config, RemoteArray};
use stompgate::grpc::{GrpcServer, Limits, Security};
use stompgate::runtime::Server;

/// Gateway A (the array) and gateway B (remote mode) in front of it.
struct Pair {
    gateway: Server,
    grpc: GrpcServer,
    array: Server,
}

impl Pair {
    /// A with `security` on its gRPC API; B dialing `remote` (its authority filled in by
    /// `authority_of` from A's gRPC address, e.g. to put a proxy between them).
    fn start(security: Security, remote: RemoteArray, authority_of: impl FnOnce(SocketAddr) -> String) -> Pair {
        let online = core_affinity::get_core_ids().map(|v| v.len()).unwrap_or(1);
        let cpus = if online >= 2 { vec![0, 1] } else { vec![0, 0] };
        let base = Config { stomp_addr: "127.0.0.1:0".parse().unwrap(), cpus, ..Config::default() };
        let array = Server::start(base.clone()).expect("array gateway starts");
        let grpc = stompgate::grpc::start_secured("127.0.0.1:0".parse().unwrap(), 2, array.array(), Limits::default(), security).expect("array gRPC starts");
        let remote = RemoteArray { authority: authority_of(grpc.local_addr()), ..remote };
        let gateway = Server::start(Config { array: ArrayMode::Remote(remote), ..base }).expect("remote gateway starts");
        Pair { gateway, grpc, array }
    }

    /// A STOMP 1.2 client on B.
    fn client(&self) -> Client {
        connected(self.gateway.stomp_addr())
    }

    /// A STOMP 1.2 client on A, publishing straight into the array.
    fn array_client(&self) -> Client {
        connected(self.array.stomp_addr())
    }

    fn stop(self) {
        self.gateway.shutdown();
        self.grpc.shutdown();
        self.array.shutdown();
    }
}

fn connected(addr: SocketAddr) -> Client {
    let mut c = Client::open(addr);
    let f = c.connect("1.2");
    assert_eq!(f.command, "CONNECTED", "{f:?}");
    c
}

fn plain(authority: &str) -> RemoteArray {
    RemoteArray { authority: authority.into(), tls: false, ca_file: None, token: None }
}

/// A test CA, and a certificate it signed for `localhost`: (CA file, certificate PEM, key PEM).
fn test_pki() -> (PathBuf, Vec<u8>, Vec<u8>) {
    use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair};
    let ca_key = KeyPair::generate().unwrap();
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.distinguished_name.push(DnType::CommonName, "stompgate test CA");
    let ca = ca_params.self_signed(&ca_key).unwrap();
    let key = KeyPair::generate().unwrap();
    let cert = CertificateParams::new(vec!["localhost".to_string()]).unwrap().signed_by(&key, &ca, &ca_key).unwrap();
    let ca_file = std::env::temp_dir().join(format!("{}-ca.pem", unique("stompgate-test")));
    std::fs::write(&ca_file, ca.pem()).unwrap();
    (ca_file, cert.pem().into_bytes(), key.serialize_pem().into_bytes())
}

/// Sends `n` queue messages on `c` (receipted) and reads them back on a second client.
fn queue_round_trip(pair: &Pair, n: usize) {
    let dest = format!("/queue/{}", unique("tls"));
    let mut producer = pair.client();
    for i in 0..n {
        send_with_receipt(&mut producer, "SEND", &[("destination", &dest)], format!("m{i}").as_bytes(), &format!("r{i}"));
    }
    let mut consumer = pair.client();
    // The backlog may come before the SUBSCRIBE's RECEIPT as well as after it: B confirms the
    // subscription once the array answered a fence sent after its first Get, and the Get's
    // answer (the queued messages) can come first (see `Flow::subscribe_sync`).
    let got: Vec<String> = consumer.subscribe_expect("q", &dest, &[("ack", "auto")], n).iter().map(|f| f.body_str().to_string()).collect();
    assert_eq!(got, (0..n).map(|i| format!("m{i}")).collect::<Vec<_>>());
}

#[test]
fn a_gateway_reaches_a_tls_array_that_requires_a_token() {
    let (ca_file, cert, key) = test_pki();
    let security = Security { tls: Some(tonic::transport::Identity::from_pem(cert, key)), token: Some("s3cret".into()), ..Default::default() };
    let remote = RemoteArray { authority: String::new(), tls: true, ca_file: Some(ca_file.clone()), token: Some("s3cret".into()) };
    // The certificate names `localhost`, so B must dial that name, not the IP.
    let pair = Pair::start(security, remote, |a| format!("localhost:{}", a.port()));
    queue_round_trip(&pair, 5);

    // Events both ways through the TLS connection: a subscription on B, a publisher on A.
    let base = unique("tlsev");
    let mut sub = pair.client();
    subscribe(&mut sub, "e", &format!("/topic-store/{base}"), &[]);
    let mut publisher = pair.array_client();
    send_with_receipt(&mut publisher, "SEND", &[("destination", &format!("/topic-store/{base}"))], b"over tls", "p1");
    assert_eq!(sub.frame().body_str(), "over tls");

    // The array itself: no token → UNAUTHENTICATED; the right token over TLS → served.
    let port = pair.grpc.local_addr().port();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let with = |token: Option<&str>| RemoteArray {
            authority: format!("localhost:{port}"),
            tls: true,
            ca_file: Some(ca_file.clone()),
            token: token.map(Into::into),
        };
        let mut anonymous = stompgate::egress::client(&with(None)).unwrap();
        let refused = anonymous.ping(stompgate::wire::pb::Empty {}).await.expect_err("no token, no service");
        assert_eq!(refused.code(), tonic::Code::Unauthenticated, "{refused:?}");
        let mut wrong = stompgate::egress::client(&with(Some("guess"))).unwrap();
        assert_eq!(wrong.ping(stompgate::wire::pb::Empty {}).await.unwrap_err().code(), tonic::Code::Unauthenticated);
        let mut right = stompgate::egress::client(&with(Some("s3cret"))).unwrap();
        assert!(right.ping(stompgate::wire::pb::Empty {}).await.is_ok());
        // Plain HTTP/2 to a TLS-only listener gets nowhere.
        let mut cleartext = stompgate::egress::client(&RemoteArray { tls: false, ca_file: None, ..with(Some("s3cret")) }).unwrap();
        assert!(cleartext.ping(stompgate::wire::pb::Empty {}).await.is_err());
    });
    let _ = std::fs::remove_file(&ca_file);
    pair.stop();
}

#[test]
fn a_refused_token_fails_confirmed_work_at_once_instead_of_hanging() {
    let security = Security { tls: None, token: Some("right".into()), ..Default::default() };
    let remote = RemoteArray { token: Some("wrong".into()), ..plain("") };
    let pair = Pair::start(security, remote, |a| a.to_string());
    let started = Instant::now();

    // A queue SEND is RECEIPTed only on the array's confirmation, which cannot come.
    let mut producer = pair.client();
    producer.send("SEND", &[("destination", &format!("/queue/{}", unique("auth"))), ("receipt", "r1")], b"x");
    let f = expect_error_close(&mut producer, "internal error");
    assert_eq!(f.header("receipt-id"), Some("r1"), "{f:?}");

    // So is an Events-Store SEND, and a SUBSCRIBE's receipt waits for the array's stream.
    let mut store = pair.client();
    store.send("SEND", &[("destination", &format!("/topic-store/{}", unique("auth"))), ("receipt", "r2")], b"x");
    expect_error_close(&mut store, "internal error");
    let mut subscriber = pair.client();
    subscriber.send("SUBSCRIBE", &[("id", "s"), ("destination", &format!("/topic/{}", unique("auth"))), ("receipt", "r3")], b"");
    expect_error_close(&mut subscriber, "internal error");
    // A queue SUBSCRIBE's receipt waits for the array to hold the consumer's first Get.
    let mut consumer = pair.client();
    consumer.send("SUBSCRIBE", &[("id", "q"), ("destination", &format!("/queue/{}", unique("auth"))), ("receipt", "r4")], b"");
    let f = expect_error_close(&mut consumer, "internal error");
    assert_eq!(f.header("receipt-id"), Some("r4"), "{f:?}");
    assert!(started.elapsed() < Duration::from_secs(20), "took {:?}", started.elapsed());
    pair.stop();
}

/// A TCP proxy whose connections can be cut (both directions shut down) and which refuses new
/// ones until restored.
struct Proxy {
    addr: SocketAddr,
    refusing: Arc<AtomicBool>,
    open: Arc<Mutex<Vec<TcpStream>>>,
}

impl Proxy {
    fn start(upstream: SocketAddr) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let refusing = Arc::new(AtomicBool::new(false));
        let open: Arc<Mutex<Vec<TcpStream>>> = Arc::default();
        let (r, o) = (Arc::clone(&refusing), Arc::clone(&open));
        std::thread::spawn(move || {
            for client in listener.incoming().flatten() {
                if r.load(Ordering::SeqCst) {
                    continue; // dropped: the dialer sees the connection closed
                }
                let Ok(server) = TcpStream::connect(upstream) else { continue };
                let mut tracked = o.lock().unwrap();
                tracked.push(client.try_clone().unwrap());
                tracked.push(server.try_clone().unwrap());
                drop(tracked);
                pipe(client.try_clone().unwrap(), server.try_clone().unwrap());
                pipe(server, client);
            }
        });
        Proxy { addr, refusing, open }
    }

    fn cut(&self) {
        self.refusing.store(true, Ordering::SeqCst);
        for s in self.open.lock().unwrap().drain(..) {
            let _ = s.shutdown(Shutdown::Both);
        }
    }

    fn restore(&self) {
        self.refusing.store(false, Ordering::SeqCst);
    }
}

fn pipe(mut from: TcpStream, mut to: TcpStream) {
    std::thread::spawn(move || {
        let mut buf = [0u8; 16384];
        loop {
            match from.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if to.write_all(&buf[..n]).is_err() {
                        break;
                    }
                }
            }
        }
        let _ = to.shutdown(Shutdown::Both);
        let _ = from.shutdown(Shutdown::Both);
    });
}

/// `(body, x-kubemq-sequence)` of the next `n` MESSAGEs.
fn next_messages(c: &mut Client, n: usize) -> Vec<(String, u64)> {
    (0..n)
        .map(|_| {
            let f = c.frame();
            assert_eq!(f.command, "MESSAGE", "{f:?}");
            (f.body_str().to_string(), f.header("x-kubemq-sequence").map_or(0, |s| s.parse().unwrap()))
        })
        .collect()
}

#[test]
fn subscriptions_come_back_after_the_connection_to_the_array_is_cut_and_store_ones_resume_after_their_last_sequence() {
    let upstream: Arc<Mutex<Option<Proxy>>> = Arc::default();
    let slot = Arc::clone(&upstream);
    let pair = Pair::start(Security::default(), plain(""), move |a| {
        let proxy = Proxy::start(a);
        let authority = proxy.addr.to_string();
        *slot.lock().unwrap() = Some(proxy);
        authority
    });
    let proxy = upstream.lock().unwrap().take().unwrap();
    let base = unique("cut");
    let (store_dest, topic_dest) = (format!("/topic-store/{base}/s"), format!("/topic/{base}/e"));
    let mut sub = pair.client();
    subscribe(&mut sub, "store", &store_dest, &[]);
    subscribe(&mut sub, "plain", &topic_dest, &[]);
    let mut publisher = pair.array_client();
    let publish = |p: &mut Client, dest: &str, range: std::ops::Range<usize>| {
        for i in range {
            send_with_receipt(p, "SEND", &[("destination", dest)], format!("m{i}").as_bytes(), &format!("r{i}"));
        }
    };
    publish(&mut publisher, &store_dest, 1..6);
    let expected = |range: std::ops::Range<usize>| range.map(|i| (format!("m{i}"), i as u64)).collect::<Vec<_>>();
    assert_eq!(next_messages(&mut sub, 5), expected(1..6));

    proxy.cut();
    // Published while B cannot hear: the array keeps them in the store.
    std::thread::sleep(Duration::from_millis(300));
    publish(&mut publisher, &store_dest, 6..11);
    std::thread::sleep(Duration::from_millis(700));
    proxy.restore();

    // The store subscription resumes at sequence 6: each of 6..10 once, none of 1..5 again.
    assert_eq!(next_messages(&mut sub, 5), expected(6..11));
    // The plain subscription is live again (events are at-most-once: what was published
    // during the cut is gone, so probe until one arrives).
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut seen = None;
    while seen.is_none() && Instant::now() < deadline {
        send_with_receipt(&mut publisher, "SEND", &[("destination", &topic_dest)], b"probe", "probe");
        seen = sub.frame_within(Duration::from_millis(300));
    }
    let seen = seen.expect("the plain subscription came back within 10 s");
    assert_eq!((seen.header("subscription"), seen.body_str()), (Some("plain"), "probe"));
    // Nothing else is owed: no duplicate store message trails behind.
    publish(&mut publisher, &store_dest, 11..12);
    let rest: Vec<Frame> = std::iter::from_fn(|| sub.frame_within(Duration::from_millis(500))).collect();
    let store_rest: Vec<&str> = rest.iter().filter(|f| f.header("subscription") == Some("store")).map(|f| f.body_str()).collect();
    assert_eq!(store_rest, vec!["m11"], "{rest:?}");
    pair.stop();
}
