//! What every bench file shares.
use criterion::Criterion;
use std::time::Duration;

/// Short runs: the whole `cargo bench` stays within a couple of minutes on two cores.
/// Command-line flags (`--measurement-time`, `--quick`, …) still override these.
pub fn config() -> Criterion {
    Criterion::default().warm_up_time(Duration::from_millis(500)).measurement_time(Duration::from_secs(2)).sample_size(30)
}
