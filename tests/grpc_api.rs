//! The KubeMQ gRPC API answers `Ping` with stompgate's identity and refuses every RPC it does
//! not serve yet with `UNIMPLEMENTED` at once (streaming ones too, while the client's request
//! stream stays open), and `GrpcServer::shutdown` returns.
//!
//! Setup: an in-process gateway (`common::TestServer`) and `stompgate::grpc::start` on an
//! ephemeral loopback port with one worker, driven by the generated tonic client.
mod common;

use common::TestServer;
use std::time::Duration;
use stompgate::grpc::pb::{kubemq_client::KubemqClient, Empty, Event, QueuesDownstreamRequest, Subscribe};
use tokio::time::timeout;
use tonic::Code;

const PROMPT: Duration = Duration::from_secs(5);

#[test]
fn ping_answers_and_other_rpcs_are_unimplemented_promptly() {
    let server = TestServer::start();
    let grpc = stompgate::grpc::start("127.0.0.1:0".parse().unwrap(), 1, server.server().array()).expect("gRPC server starts");
    let addr = grpc.local_addr();
    assert_ne!(addr.port(), 0);

    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    rt.block_on(async {
        let mut client = timeout(PROMPT, KubemqClient::connect(format!("http://{addr}"))).await.expect("connect in time").expect("connect");

        let ping = timeout(PROMPT, client.ping(Empty {})).await.expect("Ping in time").expect("Ping ok").into_inner();
        assert_eq!(ping.version, env!("CARGO_PKG_VERSION"));
        assert!(!ping.host.is_empty());
        assert!(ping.server_start_time > 0, "{ping:?}");
        assert!(ping.server_up_time_seconds >= 0, "{ping:?}");

        let event = Event { client_id: "t".into(), channel: "c".into(), body: b"x".to_vec(), ..Default::default() };
        let status = timeout(PROMPT, client.send_event(event)).await.expect("SendEvent in time").expect_err("SendEvent refused");
        assert_eq!(status.code(), Code::Unimplemented, "{status:?}");
        assert_eq!(status.message(), "SendEvent is not supported by stompgate yet");

        let sub = Subscribe { subscribe_type_data: 1, client_id: "t".into(), channel: "c".into(), ..Default::default() };
        let status = timeout(PROMPT, client.subscribe_to_events(sub)).await.expect("SubscribeToEvents in time").expect_err("SubscribeToEvents refused");
        assert_eq!(status.code(), Code::Unimplemented, "{status:?}");

        // Like an SDK, keep the request stream open: the refusal must not wait for it to end.
        let requests = futures_lite::stream::pending::<QueuesDownstreamRequest>();
        let status = timeout(PROMPT, client.queues_downstream(requests)).await.expect("QueuesDownstream in time").expect_err("QueuesDownstream refused");
        assert_eq!(status.code(), Code::Unimplemented, "{status:?}");
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
