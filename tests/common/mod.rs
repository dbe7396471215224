//! Shared setup for the integration tests: an in-process gateway on an ephemeral loopback port
//! (`TestServer`, or a gateway pair in remote-array mode) and unique destination names.
//!
//! By concern: `stomp_client` (the raw STOMP client and its frames), `props` (frame assertions
//! and receipt-barrier steps), `flow` (request/wait steps, core placement, array-side
//! responders), `grpc` (the KubeMQ gRPC harness and client helpers), `metrics` (scraping the exporter).
#![allow(dead_code)]

pub mod child;
pub mod flow;
pub mod grpc;
pub mod load;
pub mod metrics;
pub mod props;
pub mod stomp_client;
pub mod ws_client;

pub use stomp_client::{Client, Frame, WAIT};

use std::net::SocketAddr;
use stompgate::config::Config;
use stompgate::runtime::Server;

/// A gateway running in this process; stopped when dropped.
///
/// With `STOMPGATE_TEST_ARRAY=remote` every test runs against a pair instead: gateway A
/// (embedded array, KubeMQ gRPC API on an ephemeral port) as the array, and gateway B
/// (`--array grpc://A`) in front of it. STOMP clients talk to B; [`TestServer::array`] is A's
/// array, where native responders attach.
///
/// With `STOMPGATE_TEST_TRANSPORT=ws` the gateway the clients talk to also binds its WebSocket
/// listener on 127.0.0.1:0 (unless `tweak` sets `ws_addr` itself), and [`Client::open`] on
/// its address speaks STOMP over a WebSocket to it (see `ws_client`).
pub struct TestServer {
    server: Option<Server>,
    pub addr: SocketAddr,
    /// Remote mode: the array side (gateway A and its gRPC server).
    remote: Option<(Server, stompgate::grpc::GrpcServer)>,
}

/// Whether this run puts a remote array behind every test gateway.
pub fn remote_array() -> bool {
    std::env::var("STOMPGATE_TEST_ARRAY").is_ok_and(|v| v == "remote")
}

impl TestServer {
    pub fn start() -> TestServer {
        Self::start_with(|_| {})
    }

    /// Starts with two cores (on CPUs 0 and 1, or twice CPU 0 on a one-CPU machine) so
    /// cross-core paths are exercised, after `tweak` adjusts the defaults. The store stays off
    /// (`Config::default()`; the command line's default ./store would be shared by every
    /// gateway of the test process), unless `tweak` names a directory of its own.
    pub fn start_with(tweak: impl FnOnce(&mut Config)) -> TestServer {
        if let Ok(filter) = std::env::var("STOMPGATE_LOG") {
            let _ = tracing_subscriber::fmt().with_env_filter(filter).with_test_writer().try_init();
        }
        let online = core_affinity::get_core_ids().map(|v| v.len()).unwrap_or(1);
        let mut cfg = Config {
            stomp_addr: std::env::var("TEST_ADDR").unwrap_or("127.0.0.1:0".into()).parse().unwrap(),
            cpus: if online >= 2 { vec![0, 1] } else { vec![0, 0] },
            ws_addr: ws_client::ws_transport().then(|| "127.0.0.1:0".parse().unwrap()),
            store: stompgate::config::StoreConfig { dir: None, ..Default::default() },
            ..Config::default()
        };
        tweak(&mut cfg);
        let remote = if remote_array() {
            let array_cfg = Config { stomp_addr: "127.0.0.1:0".parse().unwrap(), ws_addr: None, ..cfg.clone() };
            let array = Server::start(array_cfg).expect("array gateway starts");
            let grpc = stompgate::grpc::start("127.0.0.1:0".parse().unwrap(), 2, array.array()).expect("array gRPC starts");
            cfg.array = stompgate::config::ArrayMode::Remote(stompgate::config::RemoteArray {
                authority: grpc.local_addr().to_string(),
                tls: false,
                ca_file: None,
                token: None,
            });
            Some((array, grpc))
        } else {
            None
        };
        let server = Server::start(cfg).expect("server starts");
        let addr = server.stomp_addr();
        if let (true, Some(ws)) = (ws_client::ws_transport(), server.ws_addr()) {
            ws_client::register(addr, ws);
        }
        TestServer { server: Some(server), addr, remote }
    }

    /// Remote mode: the STOMP address of gateway A, the array (clients there use the array
    /// directly). None on the embedded array.
    pub fn array_stomp_addr(&self) -> Option<SocketAddr> {
        self.remote.as_ref().map(|(array, _)| array.stomp_addr())
    }

    pub fn server(&self) -> &Server {
        self.server.as_ref().unwrap()
    }

    /// The array: this gateway's own, or in remote mode gateway A's.
    pub fn array(&self) -> stompgate::mesh::handle::ArrayHandle {
        match &self.remote {
            Some((array, _)) => array.array(),
            None => self.server().array(),
        }
    }

    pub fn client(&self) -> Client {
        Client::open(self.addr)
    }

    /// A client that has completed CONNECT with `accept-version:1.2`.
    pub fn connected(&self) -> Client {
        let mut c = self.client();
        let f = c.connect("1.2");
        assert_eq!(f.command, "CONNECTED", "{f:?}");
        c
    }

    /// Stops the server and waits for it (what SIGTERM does).
    pub fn stop(mut self) {
        self.stop_all();
    }

    /// Stops only the gateway the STOMP clients talk to and waits for it; in remote mode the
    /// array (gateway A) keeps running until the `TestServer` is dropped, as a KubeMQ array
    /// outlives the gateways in front of it.
    pub fn stop_gateway(&mut self) {
        if let Some(s) = self.server.take() {
            ws_client::forget(self.addr);
            s.shutdown();
        }
    }

    fn stop_all(&mut self) {
        self.stop_gateway();
        if let Some((array, grpc)) = self.remote.take() {
            grpc.shutdown();
            array.shutdown();
        }
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.stop_all();
    }
}

/// A destination name unique to this test run, so tests sharing a server never collide.
pub fn unique(prefix: &str) -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    format!("{prefix}{}-{}", std::process::id(), N.fetch_add(1, Ordering::Relaxed))
}
