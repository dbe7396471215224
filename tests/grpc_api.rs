//! The KubeMQ gRPC API answers `Ping` with stompgate's identity; `GrpcServer::shutdown` returns
//! while a client's stream is still open.
//!
//! Setup: an in-process gateway (`common::TestServer`) and `stompgate::grpc::start` on an
//! ephemeral loopback port with one worker, driven by the generated tonic client.
use crate::common;

use common::TestServer;
use std::time::Duration;
use stompgate::wire::pb::{kubemq_client::KubemqClient, Empty, StreamQueueMessagesRequest};
use tokio::time::timeout;

const PROMPT: Duration = Duration::from_secs(5);

#[test]
fn ping_answers_and_shutdown_returns_with_a_stream_open() {
    let server = TestServer::start();
    let grpc = stompgate::grpc::start("127.0.0.1:0".parse().unwrap(), 1, server.server().array()).expect("gRPC server starts");
    let addr = grpc.local_addr();
    assert_ne!(addr.port(), 0);

    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    rt.block_on(async {
        let mut client = timeout(PROMPT, KubemqClient::connect(format!("http://{addr}"))).await.expect("connect in time").expect("connect");

        let ping = timeout(PROMPT, client.ping(Empty {})).await.expect("Ping in time").expect("Ping ok").into_inner();
        assert_eq!(ping.version, concat!("2.6.0+stompgate.", env!("CARGO_PKG_VERSION")));
        assert!(!ping.host.is_empty());
        assert!(ping.server_start_time > 0, "{ping:?}");
        assert!(ping.server_up_time_seconds >= 0, "{ping:?}");

        // Like an SDK, keep a request stream open (a transaction waiting for its first request).
        let requests = futures_lite::stream::pending::<StreamQueueMessagesRequest>();
        let _open = timeout(PROMPT, client.stream_queue_message(requests)).await.expect("StreamQueueMessage in time").expect("StreamQueueMessage opens");
    });

    // The client connection and its stream are still open: shutdown must not wait on them forever.
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        grpc.shutdown();
        let _ = done_tx.send(());
    });
    done_rx.recv_timeout(PROMPT).expect("shutdown returns");
    drop(rt);
    server.stop();
}

#[test]
fn start_reports_a_taken_port() {
    let server = TestServer::start();
    let first = stompgate::grpc::start("127.0.0.1:0".parse().unwrap(), 1, server.server().array()).expect("first starts");
    let err = stompgate::grpc::start(first.local_addr(), 1, server.server().array()).err().expect("second bind fails");
    assert_eq!(err.kind(), std::io::ErrorKind::AddrInUse, "{err}");
    first.shutdown();
}
