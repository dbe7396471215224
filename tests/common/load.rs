//! The load harness (`stompgate-load`, perf/load/) run as a child process by the tests.
use serde_json::Value;
use std::process::{Command, Output};

/// Runs the harness with `args` and waits for it.
pub fn harness(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_stompgate-load")).args(args).output().expect("stompgate-load runs")
}

/// The JSON report (its last stdout line) of a run that must have succeeded; `what` names the
/// run in the failure message.
pub fn report(out: &Output, what: &str) -> Value {
    assert!(out.status.success(), "stompgate-load {what} failed ({:?}):\n{}", out.status, String::from_utf8_lossy(&out.stderr));
    last_line(out)
}

/// [`report`] for a run that may also have ended with exit 3, the harness's "lost or
/// duplicated": the caller checks which from the report.
pub fn report_allowing_loss(out: &Output, what: &str) -> Value {
    if out.status.code() == Some(3) {
        last_line(out)
    } else {
        report(out, what)
    }
}

fn last_line(out: &Output) -> Value {
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout.lines().last().unwrap_or_else(|| panic!("no JSON line; stderr:\n{}", String::from_utf8_lossy(&out.stderr)));
    serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"))
}
