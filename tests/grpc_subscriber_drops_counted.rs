//! A gRPC subscriber that stops reading loses events under the slow-subscriber policy, and
//! every one it loses is counted in `stompgate_grpc_deliveries_dropped_total` (README,
//! Metrics): what it received plus what was counted is exactly what was published.
//!
//! Setup: the Prometheus exporter of tests/counters.rs (the recorder is process-wide, and this is
//! the only test there with gRPC subscribers); a gRPC subscriber with a 10-message buffer that reads nothing
//! until the end; a STOMP publisher of plain events, then one receipted SEND whose RECEIPT means
//! every delivery before it was queued, parked or dropped. Through a remote array the
//! subscriber is on array A, fed by gateway B's egress; the count is the same.
use crate::common;
use common::flow::*;
use common::grpc::*;
use common::metrics::{metrics_addr, scrape_sum};
use common::*;
use std::time::Duration;

#[test]
fn every_event_a_stuck_grpc_subscriber_loses_is_counted() {
    metrics_addr();
    const N: usize = 2000;
    let h = GrpcHarness::start_limited(stompgate::grpc::Limits { subscriber_buffer: 10 });
    let base = unique("counted");
    let before = scrape_sum("stompgate_grpc_deliveries_dropped_total");
    h.run(async {
        let mut c = h.connect().await;
        let mut stuck = subscribe_events(&mut c, subscription(1, &base)).await;
        let mut p = h.server.connected();
        let topic = format!("/topic/{base}");
        let body = vec![b'x'; 4096];
        for _ in 0..N {
            p.publish(&topic, &body);
        }
        // The marker's RECEIPT waits for its own delivery, parked or not: after it, every event
        // before it is in the subscriber's buffers, parked, or dropped. Through a remote array it
        // also waits until the array has taken every event before it, and the array reads the
        // gateway's stream only as fast as its subscribers take events (README, Remote array):
        // with this subscriber stuck, about 128 events per 2 s grace (22 s measured), so the
        // wait is longer than a frame's usual one.
        p.send("SEND", &[("destination", &topic), ("receipt", "m")], b"marker");
        let receipt = p.frame_within(Duration::from_secs(90)).expect("the marker's RECEIPT within 90 s");
        assert_eq!((receipt.command.as_str(), receipt.header("receipt-id")), ("RECEIPT", Some("m")), "{receipt:?}");
        // Parked deliveries end with the grace, delivered or dropped: wait it out, then read.
        tokio::time::sleep(Duration::from_millis(2500)).await;
        let mut got = 0usize;
        while let Ok(Ok(Some(_))) = tokio::time::timeout(Duration::from_millis(500), stuck.message()).await {
            got += 1;
        }
        let dropped = scrape_sum("stompgate_grpc_deliveries_dropped_total") - before;
        assert!(dropped > 0.0, "nothing was dropped (got {got} of {})", N + 1);
        assert_eq!(got as f64 + dropped, (N + 1) as f64, "received {got} + counted {dropped} must be the {} published (the marker too)", N + 1);
    });
}
