//! `stompgate-load rpc` (perf/load/): the harness binary, run as a process, against an
//! in-process gateway with its KubeMQ gRPC API. The harness starts its own gRPC responder,
//! probes it through STOMP, runs requesters for a short window and prints one JSON line:
//! requests complete, none answered with `stomp-error`, none lost or answered twice, and the
//! `--server-pid` CPU accounting (this test process is the server) yields a per-request figure.
//!
//! Setup: every test runs its own two-core gateway (`TestServer`) and gRPC server on ephemeral
//! loopback ports; the harness's channel (`--name`) is unique to the test.
use crate::common;

use common::load::{harness, report};
use common::{unique, TestServer};
use serde_json::Value;

/// The gateway plus its KubeMQ gRPC API; the gRPC server stops first on drop.
struct Gateway {
    grpc: Option<stompgate::grpc::GrpcServer>,
    server: TestServer,
}

impl Gateway {
    fn start() -> Gateway {
        let server = TestServer::start();
        let grpc = stompgate::grpc::start("127.0.0.1:0".parse().unwrap(), 1, server.array()).expect("gRPC server starts");
        Gateway { grpc: Some(grpc), server }
    }

    fn grpc_addr(&self) -> String {
        self.grpc.as_ref().unwrap().local_addr().to_string()
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        if let Some(g) = self.grpc.take() {
            g.shutdown();
        }
    }
}

fn run_rpc(g: &Gateway, kind: &str, extra: &[&str]) -> Value {
    let port = g.server.addr.port().to_string();
    let grpc = g.grpc_addr();
    let name = unique("loadrpc");
    let pid = std::process::id().to_string();
    let mut args = vec![
        "rpc",
        "--host",
        "127.0.0.1",
        "--port",
        &port,
        "--grpc",
        &grpc,
        "--kind",
        kind,
        "--name",
        &name,
        "--duration-s",
        "1",
        "--warmup-s",
        "0.3",
        "--server-pid",
        &pid,
        "--json",
        "--quiet",
    ];
    args.extend_from_slice(extra);
    report(&harness(&args), "rpc")
}

fn assert_clean_run(r: &Value, kind: &str) {
    assert_eq!(r["scenario"], "rpc", "{r}");
    assert_eq!(r["params"]["kind"], kind, "{r}");
    let n = |k: &str| r[k].as_u64().unwrap_or_else(|| panic!("{k} missing: {r}"));
    assert!(n("completed") > 0, "{r}");
    assert!(n("sent") >= n("completed"), "{r}");
    assert_eq!((n("errors"), n("lost"), n("duplicated"), n("foreign")), (0, 0, 0, 0), "{r}");
    for e in ["timeout", "no-responder", "failed", "unavailable"] {
        assert_eq!(r["stomp_errors"][e], 0, "{r}");
    }
    assert_eq!(n("latency_count"), n("sent"), "every window request answered once: {r}");
    assert!(r["p50_us"].as_f64().unwrap() > 0.0 && r["p999_us"].as_f64() >= r["p50_us"].as_f64(), "{r}");
    assert!(r["completed_per_s"].as_f64().unwrap() > 0.0, "{r}");
    assert!(r["harness_cpu_us_per_msg"].as_f64().unwrap() > 0.0, "{r}");
    assert!(r["server_cpu_us_per_msg"].as_f64().is_some(), "server CPU per request from --server-pid: {r}");
}

#[test]
fn commands_closed_loop_complete_without_errors_or_losses() {
    let g = Gateway::start();
    let r = run_rpc(&g, "command", &["--requesters", "3", "--inflight", "8"]);
    assert_clean_run(&r, "command");
    assert_eq!((r["params"]["requesters"].as_u64(), r["params"]["inflight"].as_u64()), (Some(3), Some(8)), "{r}");
}

#[test]
fn queries_paced_over_two_threads_complete_without_errors_or_losses() {
    let g = Gateway::start();
    let r = run_rpc(&g, "query", &["--requesters", "2", "--threads", "2", "--rate", "500", "--payload", "100"]);
    assert_clean_run(&r, "query");
    // Paced at 500 requests/s for 1 s: the pacer may send fewer on a busy machine (no speed is
    // asserted here), never more than the rate allows, give or take the window's edges.
    let sent = r["sent"].as_u64().unwrap();
    assert!(sent > 0 && sent <= 520, "paced at 500/s: {r}");
}

#[test]
fn an_unreachable_grpc_api_fails_the_run_at_once() {
    let g = Gateway::start();
    let port = g.server.addr.port().to_string();
    let out = harness(&["rpc", "--port", &port, "--grpc", "127.0.0.1:1", "--duration-s", "1", "--quiet"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("cannot connect to 127.0.0.1:1"), "{stderr}");
}
