//! Every queue SEND refused at the depth limit is counted in
//! `stompgate_queue_sends_refused_total` (README, Metrics), the receipted ones (ERROR `too many
//! pending requests`) and the unreceipted ones (dropped with no one to tell) alike.
//!
//! Setup: the Prometheus exporter of tests/counters.rs (the recorder is process-wide, and this
//! is the only test there that fills a queue); a queue limited to 2 messages. Through a remote
//! array the refusals happen at gateway A, the array, which runs in this process too.
use crate::common;
use common::flow::*;
use common::metrics::{metrics_addr, scrape_sum};
use common::*;
use std::time::{Duration, Instant};

const METRIC: &str = "stompgate_queue_sends_refused_total";

#[test]
fn every_send_refused_at_the_queue_depth_limit_is_counted() {
    metrics_addr();
    let server = TestServer::start_with(|c| c.queue_max_messages = 2);
    let q = format!("/queue/{}", unique("refusals"));
    let before = scrape_sum(METRIC);
    let mut p = server.connected();
    for body in ["1", "2"] {
        p.send_sync("SEND", &[("destination", &q)], body.as_bytes());
    }
    // Three over the limit without a receipt, then one with a receipt: refused with an ERROR,
    // after the three before it on the same connection and queue.
    const UNRECEIPTED: f64 = 3.0;
    for body in ["3", "4", "5"] {
        p.send("SEND", &[("destination", &q)], body.as_bytes());
    }
    p.send("SEND", &[("destination", &q), ("receipt", "over")], b"6");
    p.expect_error_then_close("too many pending requests");
    // The cores copy their counters to the exporter every 100 ms: wait for that copy.
    let want = UNRECEIPTED + 1.0;
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut counted = scrape_sum(METRIC) - before;
    while counted < want && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
        counted = scrape_sum(METRIC) - before;
    }
    assert_eq!(counted, want, "{want} SENDs were refused at the depth limit, {counted} counted");
}
