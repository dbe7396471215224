//! Every STOMP client closed with an ERROR at a limit is counted in
//! `stompgate_limit_refusals_total{transport,limit}` (README, Metrics), each under the limit it
//! met; an ERROR that is not a limit (a broken rule) is not counted there.
//!
//! Setup: the Prometheus exporter of tests/counters.rs (the recorder is process-wide, and no
//! other test there refuses at these limits: queue_refusals_counted's queue_depth refusal is
//! why that limit is not checked here); small limits, so each refusal is one frame away. The
//! counter is incremented where the ERROR is written, so it is in the exporter by the time the
//! client sees the close.
use crate::common;
use common::flow::*;
use common::metrics::{metrics_addr, scrape_at};
use common::*;

const METRIC: &str = "stompgate_limit_refusals_total";

/// The STOMP count of `limit` (0 before its first refusal: the series does not exist yet).
fn counted(limit: &str) -> f64 {
    let (name, transport) = (format!("limit=\"{limit}\""), "transport=\"stomp\"");
    scrape_at(metrics_addr())
        .lines()
        .filter(|l| l.starts_with(&format!("{METRIC}{{")) && l.contains(&name) && l.contains(transport))
        .map(|l| l.rsplit(' ').next().unwrap().parse::<f64>().unwrap())
        .sum()
}

#[test]
fn every_client_refused_at_a_limit_is_counted_under_that_limit() {
    metrics_addr();
    let server = TestServer::start_with(|c| {
        c.max_subscriptions = 1;
        c.max_transactions = 1;
        c.max_body_size = 100;
    });
    let limits = ["max_subscriptions", "max_transactions", "max_body_size"];
    let before: Vec<f64> = limits.iter().map(|l| counted(l)).collect();
    let t = format!("/topic/{}", unique("limits"));

    let mut c = server.connected();
    c.subscribe_sync("1", &t, &[]);
    c.send("SUBSCRIBE", &[("id", "2"), ("destination", &t)], b"");
    c.expect_error_then_close("too many pending requests");

    let mut c = server.connected();
    c.send_sync("BEGIN", &[("transaction", "a")], b"");
    c.send("BEGIN", &[("transaction", "b")], b"");
    c.expect_error_then_close("too many pending requests");

    let mut c = server.connected();
    c.send("SEND", &[("destination", &t)], &[b'x'; 101]);
    c.expect_error_then_close("frame too large");

    // Not a limit: a malformed frame is not counted under any of them.
    let mut c = server.connected();
    c.send("SUBSCRIBE", &[("destination", &t)], b"");
    c.expect_error_then_close("malformed frame");

    let after: Vec<f64> = limits.iter().map(|l| counted(l)).collect();
    for ((limit, b), a) in limits.iter().zip(&before).zip(&after) {
        assert_eq!(a - b, 1.0, "{limit}: one client refused, {} counted", a - b);
    }
}
