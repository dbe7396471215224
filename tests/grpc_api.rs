//! The KubeMQ gRPC API answers `Ping` with stompgate's identity and refuses the one RPC it does
//! not serve (the legacy `StreamQueueMessage`) with `UNIMPLEMENTED` at once, while the client's
//! request stream stays open; `GrpcServer::shutdown` returns.
//!
//! Setup: an in-process gateway (`common::TestServer`) and `stompgate::grpc::start` on an
//! ephemeral loopback port with one worker, driven by the generated tonic client.
use crate::common;

use common::TestServer;
use std::time::Duration;
use stompgate::wire::pb::{kubemq_client::KubemqClient, Empty, StreamQueueMessagesRequest};
use tokio::time::timeout;
use tonic::Code;

const PROMPT: Duration = Duration::from_secs(5);

#[test]
fn ping_answers_and_the_legacy_queue_stream_is_unimplemented_promptly() {
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

        // Like an SDK, keep the request stream open: the refusal must not wait for it to end.
        let requests = futures_lite::stream::pending::<StreamQueueMessagesRequest>();
        let status = timeout(PROMPT, client.stream_queue_message(requests)).await.expect("StreamQueueMessage in time").expect_err("StreamQueueMessage refused");
        assert_eq!(status.code(), Code::Unimplemented, "{status:?}");
        assert!(status.message().contains("QueuesDownstream"), "{status:?}");
    });

    // The client connection is still open: shutdown must not wait on it forever.
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
