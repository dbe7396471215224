//! Settings: CLI flags > KubeMQ environment names > TOML file (`--config`) > defaults
//! (stomp-decisions.md, "Configuration"). A bad value is refused at start-up with a one-line
//! reason, never silently fixed.
use crate::route::DefaultPattern;
use std::net::SocketAddr;

/// Validated, effective settings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    /// STOMP listener (default 0.0.0.0:61613).
    pub stomp_addr: SocketAddr,
    /// CPUs to run one pinned executor on (from `--cpus`, else the first `--cores` online CPUs,
    /// else all online CPUs). Never empty.
    pub cpus: Vec<usize>,
    pub default_pattern: DefaultPattern,
    /// Server heart-beat advertised as `sx=sy`; 0 disables.
    pub heartbeat_ms: u64,
    /// 0 = unlimited.
    pub max_connections: usize,
    pub max_body_size: usize,
    pub sub_buff_size: usize,
    pub queue_ack_timeout_s: u64,
    pub rpc_timeout_s: u64,
    pub rpc_max_pending: usize,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            stomp_addr: "0.0.0.0:61613".parse().unwrap(),
            cpus: vec![0],
            default_pattern: DefaultPattern::Events,
            heartbeat_ms: 10_000,
            max_connections: 0,
            max_body_size: 100 * 1024 * 1024,
            sub_buff_size: 100,
            queue_ack_timeout_s: 30,
            rpc_timeout_s: 30,
            rpc_max_pending: 1024,
        }
    }
}

impl Config {
    /// Parses the process's arguments and environment. `Err` is a one-line reason.
    pub fn from_env_and_args() -> Result<Config, String> {
        todo!("config helper")
    }
}
