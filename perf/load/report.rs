//! The run's result: a human summary or one JSON line.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde_json::{json, Map, Value};

use crate::track::Latency;

/// Everything a scenario measured. `None` = not applicable to this scenario or not measured
/// (no `--server-pid`).
#[derive(Debug, Default)]
pub struct Report {
    pub scenario: &'static str,
    /// `stomp` or `amqp`.
    pub protocol: &'static str,
    pub label: String,
    pub target: String,
    pub stomp_version: String,
    /// `--tls`: the negotiated version and cipher suite.
    pub tls: Option<String>,
    /// Scenario parameters, as given.
    pub params: Map<String, Value>,
    pub window_s: f64,

    /// Messages (rpc: requests) sent with a send stamp inside the window.
    pub sent: Option<u64>,
    /// Distinct window messages received before the window closed (all receivers).
    pub delivered: Option<u64>,
    pub latency: Option<Latency>,
    /// `--receipt-window`: window SENDs whose RECEIPT arrived.
    pub receipted: Option<u64>,
    /// `--receipt-window`: SEND -> RECEIPT latency of those SENDs.
    pub receipt_latency: Option<Latency>,
    pub lost: Option<u64>,
    pub duplicated: Option<u64>,
    /// AMQP queue: window deliveries the server settled `accepted` (the receipt's equivalent).
    pub accepted: Option<u64>,
    pub out_of_order: Option<u64>,
    /// Stamped messages from outside this run (a leftover queue) that were ignored.
    pub foreign: Option<u64>,

    /// `connect`: full CONNECT..RECEIPT cycles completed in the window.
    pub connections: Option<u64>,
    /// `idle`: connections found closed by the server at the end of the hold.
    pub dropped: Option<u64>,
    /// `idle`: how fast the connections were opened.
    pub open_per_s: Option<f64>,

    /// `rpc`: window requests answered without `stomp-error` before the window closed.
    pub completed: Option<u64>,
    /// `rpc`: window requests answered with `stomp-error`.
    pub errors: Option<u64>,
    /// `rpc`: `errors` per `stomp-error` value (`timeout`, `no-responder`, `failed`, `unavailable`).
    pub stomp_errors: Option<BTreeMap<String, u64>>,

    pub harness_cpu_s: f64,
    pub server_cpu_s: Option<f64>,
    pub server_rss_kib: Option<u64>,
    pub server_rss_before_kib: Option<u64>,
}

impl Report {
    pub fn sent_per_s(&self) -> Option<f64> {
        self.sent.map(|n| n as f64 / self.window_s)
    }

    pub fn delivered_per_s(&self) -> Option<f64> {
        self.delivered.map(|n| n as f64 / self.window_s)
    }

    pub fn connections_per_s(&self) -> Option<f64> {
        self.connections.map(|n| n as f64 / self.window_s)
    }

    pub fn completed_per_s(&self) -> Option<f64> {
        self.completed.map(|n| n as f64 / self.window_s)
    }

    /// The unit of work CPU is divided by: delivered messages, else completed requests, else
    /// completed connections.
    fn work(&self) -> Option<u64> {
        self.delivered.or(self.completed).or(self.connections).filter(|&n| n > 0)
    }

    pub fn harness_cpu_us_per_msg(&self) -> Option<f64> {
        self.work().map(|n| self.harness_cpu_s * 1e6 / n as f64)
    }

    pub fn server_cpu_us_per_msg(&self) -> Option<f64> {
        Some(self.server_cpu_s? * 1e6 / self.work()? as f64)
    }

    /// `idle`: server RSS growth per held connection, in bytes.
    pub fn rss_per_conn_bytes(&self) -> Option<f64> {
        let held = self.params.get("connections")?.as_u64()?.saturating_sub(self.dropped.unwrap_or(0));
        let grown = self.server_rss_kib?.checked_sub(self.server_rss_before_kib?)?;
        (held > 0).then(|| grown as f64 * 1024.0 / held as f64)
    }

    /// Messages lost or duplicated (rpc: or answered with `stomp-error`; `--receipt-window`:
    /// or a window SEND without its RECEIPT): the run did not deliver exactly what was sent.
    pub fn violated(&self) -> bool {
        self.receipted.is_some_and(|n| Some(n) != self.sent)
            || self.lost.unwrap_or(0) > 0
            || self.duplicated.unwrap_or(0) > 0
            || self.dropped.unwrap_or(0) > 0
            || self.errors.unwrap_or(0) > 0
    }

    pub fn to_json(&self) -> Value {
        let r1 = |x: Option<f64>| x.map(|v| (v * 10.0).round() / 10.0);
        let r3 = |x: Option<f64>| x.map(|v| (v * 1000.0).round() / 1000.0);
        let lat = self.latency;
        let rl = self.receipt_latency;
        let mut v = json!({
            "scenario": self.scenario,
            "protocol": self.protocol,
            "label": self.label,
            "target": self.target,
            "stomp_version": self.stomp_version,
            "tls": self.tls,
            "params": self.params,
            "window_s": r3(Some(self.window_s)),
            "sent": self.sent,
            "delivered": self.delivered,
            "sent_per_s": r1(self.sent_per_s()),
            "delivered_per_s": r1(self.delivered_per_s()),
            "latency_count": lat.map(|l| l.count),
            "p50_us": r1(lat.map(|l| l.p50_us)),
            "p99_us": r1(lat.map(|l| l.p99_us)),
            "p999_us": r1(lat.map(|l| l.p999_us)),
            "max_us": r1(lat.map(|l| l.max_us)),
            "lost": self.lost,
            "duplicated": self.duplicated,
            "accepted": self.accepted,
            "out_of_order": self.out_of_order,
            "foreign": self.foreign,
            "connections": self.connections,
            "connections_per_s": r1(self.connections_per_s()),
            "open_per_s": r1(self.open_per_s),
            "dropped": self.dropped,
            "completed": self.completed,
            "completed_per_s": r1(self.completed_per_s()),
            "errors": self.errors,
            "stomp_errors": self.stomp_errors,
            "harness_cpu_s": r3(Some(self.harness_cpu_s)),
            "harness_cpu_us_per_msg": r3(self.harness_cpu_us_per_msg()),
            "server_cpu_s": r3(self.server_cpu_s),
            "server_cpu_us_per_msg": r3(self.server_cpu_us_per_msg()),
            "server_rss_kib": self.server_rss_kib,
            "server_rss_before_kib": self.server_rss_before_kib,
            "rss_per_conn_bytes": r1(self.rss_per_conn_bytes()),
        });
        // Outside the macro, whose recursion limit one object this size reaches.
        let receipts = json!({
            "receipted": self.receipted,
            "receipt_p50_us": r1(rl.map(|l| l.p50_us)),
            "receipt_p99_us": r1(rl.map(|l| l.p99_us)),
            "receipt_p999_us": r1(rl.map(|l| l.p999_us)),
            "receipt_max_us": r1(rl.map(|l| l.max_us)),
        });
        if let (Some(all), Value::Object(more)) = (v.as_object_mut(), receipts) {
            all.extend(more);
        }
        v
    }

    pub fn human(&self) -> String {
        let mut s = String::new();
        let label = if self.label.is_empty() { String::new() } else { format!(" [{}]", self.label) };
        let tls = self.tls.as_ref().map_or_else(String::new, |t| format!(" over {t}"));
        let proto = if self.protocol == "amqp" { "AMQP 1.0".to_owned() } else { format!("STOMP {}", self.stomp_version) };
        let _ = writeln!(s, "stompgate-load {}{label}: {} ({proto}{tls}), {:.1} s window", self.scenario, self.target, self.window_s);
        let params: Vec<String> = self.params.iter().map(|(k, v)| format!("{k}={v}")).collect();
        let _ = writeln!(s, "  params      {}", params.join(" "));
        if let (Some(sent), Some(done)) = (self.sent, self.completed) {
            let _ = writeln!(
                s,
                "  throughput  sent {:.0} req/s ({sent}), completed {:.0} req/s ({done})",
                self.sent_per_s().unwrap_or(0.0),
                self.completed_per_s().unwrap_or(0.0)
            );
        }
        if let (Some(sent), Some(d)) = (self.sent, self.delivered) {
            let _ = writeln!(
                s,
                "  throughput  sent {:.0} msg/s ({sent}), delivered {:.0} msg/s ({d})",
                self.sent_per_s().unwrap_or(0.0),
                self.delivered_per_s().unwrap_or(0.0)
            );
        }
        if let Some(l) = self.latency {
            let _ = writeln!(
                s,
                "  latency     p50 {:.1} us, p99 {:.1} us, p99.9 {:.1} us, max {:.1} us ({} samples)",
                l.p50_us, l.p99_us, l.p999_us, l.max_us, l.count
            );
        }
        if let (Some(n), Some(l)) = (self.receipted, self.receipt_latency) {
            let _ = writeln!(
                s,
                "  receipts    {n} of {} window SENDs; SEND -> RECEIPT p50 {:.1} us, p99 {:.1} us, p99.9 {:.1} us, max {:.1} us",
                self.sent.unwrap_or(0),
                l.p50_us,
                l.p99_us,
                l.p999_us,
                l.max_us
            );
        }
        if let Some(a) = self.accepted {
            let _ = writeln!(s, "  accepted    {a} (settled accepted by the server)");
        }
        if let Some(lost) = self.lost {
            let _ = writeln!(
                s,
                "  integrity   lost {lost}, duplicated {}{}{}",
                self.duplicated.unwrap_or(0),
                self.out_of_order.map_or_else(String::new, |n| format!(", out-of-order {n}")),
                match self.foreign {
                    Some(n) if n > 0 => format!(", foreign {n}"),
                    _ => String::new(),
                }
            );
        }
        if let Some(n) = self.errors {
            let kinds: Vec<String> = self.stomp_errors.iter().flatten().filter(|(_, &v)| v > 0).map(|(k, v)| format!("{k} {v}")).collect();
            let kinds = if kinds.is_empty() { String::new() } else { format!(" ({})", kinds.join(", ")) };
            let _ = writeln!(s, "  errors      {n} answered with stomp-error{kinds}");
        }
        if let Some(c) = self.connections {
            let _ = writeln!(s, "  connect     {:.0} connections/s ({c})", self.connections_per_s().unwrap_or(0.0));
        }
        if let Some(d) = self.dropped {
            let held = self.params.get("connections").and_then(Value::as_u64).unwrap_or(0);
            let _ = writeln!(s, "  idle        held {held}, dropped by server {d}, opened at {:.0} connections/s", self.open_per_s.unwrap_or(0.0));
        }
        let unit = if self.delivered.is_some() {
            "msg"
        } else if self.completed.is_some() {
            "request"
        } else {
            "connection"
        };
        let per = |x: Option<f64>| x.map_or_else(String::new, |v| format!(", {v:.2} us per {unit}"));
        let _ = writeln!(s, "  harness cpu {:.2} s{}", self.harness_cpu_s, per(self.harness_cpu_us_per_msg()));
        if let Some(c) = self.server_cpu_s {
            let _ = writeln!(s, "  server cpu  {c:.2} s{}", per(self.server_cpu_us_per_msg()));
        }
        if let Some(rss) = self.server_rss_kib {
            let _ = write!(s, "  server rss  {rss} KiB");
            if let Some(b) = self.server_rss_before_kib {
                let _ = write!(s, " (before connecting {b} KiB)");
            }
            if let Some(p) = self.rss_per_conn_bytes() {
                let _ = write!(s, ", {p:.0} bytes per idle connection");
            }
            s.push('\n');
        }
        s
    }
}
