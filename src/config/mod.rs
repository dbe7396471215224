//! Settings: CLI flags > KubeMQ environment names > TOML file (`--config`) > defaults
//! (stomp-decisions.md, "Configuration"). A bad value is refused at start-up with a one-line
//! reason, never silently fixed.
//!
//! Why clap does not read the environment itself: with clap's `env` attribute an env value and a
//! flag are indistinguishable after parsing, and the TOML file (which clap knows nothing about)
//! would have to be merged underneath afterwards. So clap only parses the command line into
//! `Option<String>`s, and [`Config::parse_with`] resolves every setting field by field from
//! (flag, env, file, default), parsing each value itself so that an error can name the setting
//! *and* the source it came from (`--sub-buff-size`, `CONNECTORS_STOMP_SUB_BUFF_SIZE`, or
//! `sub_buff_size in FILE`). The env names are therefore documented in the help texts by hand.
//!
//! Where each part lives: `flags.rs` is the command line (clap), `sources.rs` where a raw value
//! comes from (flag, env, file) and which one wins, `values.rs` how one raw value is parsed,
//! `resolve.rs` the field-by-field resolution into a [`Config`], `cpus.rs` CPU lists and the
//! core count.
mod cpus;
mod flags;
mod resolve;
mod sources;
#[cfg(test)]
mod tests;
mod values;

pub use cpus::{online_cpus, parse_cpu_list};
pub use sources::{env, TOML_KEYS};
pub use values::parse_default_pattern;

use crate::route::DefaultPattern;
use clap::Parser;
use flags::{one_line, Cli};
use std::net::SocketAddr;

/// Validated, effective settings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    /// STOMP listener (default 0.0.0.0:61613).
    pub stomp_addr: SocketAddr,
    /// Whether the plain STOMP listener is bound (`--stomp-addr off` turns it off; then
    /// `stomp_addr` keeps its default and is unused). A flag beside the address, not an
    /// `Option`, so that the many callers that build a `Config` with an address are unchanged.
    pub stomp_plain: bool,
    /// STOMP over TLS: listener address (default 0.0.0.0:61614; `None` = `off`), bound only
    /// when `stomp_tls` is set.
    pub stomp_tls_addr: Option<SocketAddr>,
    /// The STOMP TLS listener's certificate, key and optional client CA (`--tls-*`).
    pub stomp_tls: Option<StompTls>,
    /// STOMP over WebSocket listener; `None` = off. `Config::default()` (embedders, the
    /// in-process tests) leaves it off so that gateways in one process never share a fixed
    /// port; the command line's default is [`DEFAULT_WS_ADDR`].
    pub ws_addr: Option<SocketAddr>,
    /// STOMP over secure WebSocket listener, bound only with `stomp_tls`; `None` = off.
    /// Off in `Config::default()` as `ws_addr`; the command line's default is
    /// [`DEFAULT_WS_TLS_ADDR`].
    pub ws_tls_addr: Option<SocketAddr>,
    /// The path a WebSocket handshake must ask for (default `/ws`).
    pub ws_path: String,
    /// Origins a WebSocket handshake may come from; empty = any.
    pub ws_allowed_origins: Vec<String>,
    /// AMQP 1.0 listener; `None` = off. Off in `Config::default()` as `ws_addr` (gateways in
    /// one process must not share a fixed port); the command line's default is
    /// [`DEFAULT_AMQP_ADDR`].
    pub amqp_addr: Option<SocketAddr>,
    /// AMQP 1.0 max-frame-size we accept and advertise (KubeMQ's MaxFrameSize, default 131072, >= 512).
    pub amqp_max_frame_size: u32,
    /// AMQP 1.0 largest message, multi-frame transfers included (MaxMessageSize, default 100 MiB).
    pub amqp_max_message_size: usize,
    /// AMQP 1.0 over TLS (TlsPort); bound only with a certificate; `None` = off (also in
    /// `Config::default()`); the command line's default is [`DEFAULT_AMQP_TLS_ADDR`].
    pub amqp_tls_addr: Option<SocketAddr>,
    /// SessionMax: channel-max = min(client, this - 1).
    pub amqp_session_max: u16,
    /// MaxLinksPerSession: handle-max = this - 1.
    pub amqp_max_links_per_session: u32,
    /// MaxConnections (AMQP connections open at once in this process), 0 = unlimited.
    pub amqp_max_connections: u32,
    /// IdleTimeoutSeconds, 0 = off (advertised as half, in ms).
    pub amqp_idle_timeout_s: u32,
    /// DefaultPattern of a bare address without a node-capability hint.
    pub amqp_default_pattern: crate::model::Pattern,
    /// GetBatchSize: validated for parity; no Get batch exists to cap (see `--help`).
    pub amqp_get_batch_size: u32,
    /// MaxUnsettledPerLink: unsettled queue deliveries per link, and a client sender's credit.
    pub amqp_max_unsettled_per_link: u32,
    /// DefaultRpcTimeoutSeconds.
    pub amqp_rpc_timeout_s: u64,
    /// RpcMaxPending, per connection.
    pub amqp_rpc_max_pending: u32,
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
    /// Seconds a new connection has to complete CONNECT before it is closed (slowloris).
    pub connect_timeout_s: u64,
    /// Memory budgets (issue 13): frames one transaction may hold, open transactions and
    /// subscriptions per connection; over any → ERROR + close.
    pub max_tx_frames: usize,
    pub max_transactions: usize,
    pub max_subscriptions: usize,
    /// Process-wide bytes of inbound frames not yet complete, over all connections.
    pub partial_frames_budget: usize,
    /// Depth limit of each embedded queue, in messages and body bytes; 0 = unlimited.
    pub queue_max_messages: usize,
    pub queue_max_bytes: usize,
    /// KubeMQ gRPC array API listener (default 0.0.0.0:50000); `None` = off.
    pub grpc_addr: Option<SocketAddr>,
    /// Worker threads of the gRPC server's own tokio runtime.
    pub grpc_threads: usize,
    /// TLS for the gRPC listener: PEM certificate chain and private key files.
    pub grpc_tls: Option<ServerTls>,
    /// A token every gRPC call must carry as `authorization` metadata (`None`: no check).
    pub grpc_token: Option<String>,
    /// JWT authentication (`--auth-jwt-key`, `--auth-jwt-alg`) and per-channel authorization
    /// (`--authz-file`), loaded and checked at start-up; off by default.
    pub auth: crate::auth::Auth,
    /// Where the array lives: in this process (default) or a remote KubeMQ array.
    pub array: ArrayMode,
    /// Prometheus metrics listener (`None` = off, the default).
    pub metrics_addr: Option<SocketAddr>,
    /// The persistent embedded array's store (`--store-dir`, `--store-sync`,
    /// `--store-sync-interval-us`, `--store-retention-min`); `dir: None` keeps every queue in
    /// memory only. `Config::default()` (embedders, the in-process tests) leaves it off, as it
    /// leaves `ws_addr` off: gateways in one process must not share `./store` and its lock. The
    /// command line's default is [`DEFAULT_STORE_DIR`].
    pub store: StoreConfig,
    /// How many messages each cross-core ring holds (its slots carry batches of several,
    /// `engine::batch::ring_shape`). Not a setting: the default suits every deployment, and
    /// tests shrink it to reach the full-ring paths.
    pub mesh_ring: usize,
}

/// Where and how the embedded array persists its queues (issue 15).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoreConfig {
    /// The store directory (one subdirectory per core, a lock file); `None` = `off`.
    pub dir: Option<std::path::PathBuf>,
    /// Events-Store retention in minutes (KubeMQ's `STORE_MAX_RETENTION`, default 1440 as
    /// KubeMQ's): older messages leave their channel; 0 = kept for ever. Applies with and
    /// without a store directory.
    pub retention_min: u64,
    /// Events-Store size retention in MiB over every core (`--store-retention-mb`): the oldest
    /// messages of a core leave past its share (`array::store`, "Size retention"); 0 = none.
    /// Applies with and without a store directory.
    pub retention_mb: u64,
    /// What a persistent SEND's RECEIPT waits for.
    pub sync: StoreSync,
    /// Shortest time between two syncs of one core's log, in µs: records that arrive in
    /// between share the next write and sync (group commit).
    pub sync_interval_us: u64,
    /// Cap on the segment files' bytes over every core (`--store-max-bytes`); 0 = none.
    pub max_bytes: u64,
    /// Size of one segment file (hidden `--store-segment-bytes`, for tests): by default
    /// 64 MiB, large enough that rollovers are rare, small enough that a segment is a cheap
    /// unit to scan at recovery and to delete once nothing in it is live.
    pub segment_bytes: u64,
    /// Memory for queued message contents, in MiB over every core (`--store-cache-mb`):
    /// past it a backlog's contents stay on disk (`array::queue`, "Bodies on disk").
    pub cache_mb: u64,
}

/// `--store-sync`: how durable a record is before its confirmation goes out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StoreSync {
    /// `write(2)` and `fdatasync`: survives a power loss.
    Fsync,
    /// `write(2)` only (in the page cache): survives `kill -9`, not a power loss.
    Write,
}

impl Default for StoreConfig {
    /// Off (see [`Config::store`]); the command line's default directory is [`DEFAULT_STORE_DIR`].
    fn default() -> Self {
        StoreConfig {
            dir: None,
            retention_min: 1440,
            retention_mb: DEFAULT_RETENTION_MB,
            sync: StoreSync::Fsync,
            sync_interval_us: 200,
            max_bytes: 0,
            segment_bytes: 64 << 20,
            cache_mb: 256,
        }
    }
}

/// `--store-retention-mb`'s default: half a GiB of Events-Store history over every core.
pub const DEFAULT_RETENTION_MB: u64 = 512;

/// The command line's store directory when none is given: KubeMQ's default store path.
pub const DEFAULT_STORE_DIR: &str = "./store";

/// The gRPC listener's certificate chain and key (both PEM files, read at start-up).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServerTls {
    pub cert_file: std::path::PathBuf,
    pub key_file: std::path::PathBuf,
}

/// `--tls-cert`, `--tls-key` and `--tls-client-ca`: PEM files, re-read on SIGHUP.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StompTls {
    pub cert_file: std::path::PathBuf,
    pub key_file: std::path::PathBuf,
    /// Mutual TLS: client certificates are required and verified against this CA.
    pub client_ca_file: Option<std::path::PathBuf>,
}

/// The command line's default STOMP over WebSocket listener (RabbitMQ Web-STOMP's port).
pub const DEFAULT_WS_ADDR: &str = "0.0.0.0:15674";
/// The command line's AMQP 1.0 listener (KubeMQ's AMQP connector port).
pub const DEFAULT_AMQP_ADDR: SocketAddr = SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED), 5672);
/// The AMQP 1.0 over TLS listener's command-line default (KubeMQ's TlsPort 5671).
pub const DEFAULT_AMQP_TLS_ADDR: SocketAddr = SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED), 5671);
/// The command line's default secure WebSocket listener.
pub const DEFAULT_WS_TLS_ADDR: &str = "0.0.0.0:15673";

impl Config {
    /// The secure WebSocket listener's address, when it is to be bound (a certificate is
    /// configured and `ws_tls_addr` is not off).
    pub fn ws_tls_listener(&self) -> Option<SocketAddr> {
        self.stomp_tls.as_ref().and(self.ws_tls_addr)
    }

    /// The TLS listener's address, when it is to be bound (a certificate is configured and
    /// `--stomp-tls-addr` is not `off`).
    pub fn stomp_tls_listener(&self) -> Option<SocketAddr> {
        self.stomp_tls.as_ref().and(self.stomp_tls_addr)
    }
}

/// `--array`: the embedded array, or a remote one reached over gRPC.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum ArrayMode {
    #[default]
    Embedded,
    Remote(RemoteArray),
}

/// A remote KubeMQ array (`--array grpc://HOST:PORT` or `grpcs://HOST:PORT`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RemoteArray {
    /// `HOST:PORT`.
    pub authority: String,
    /// `grpcs://`: TLS (rustls).
    pub tls: bool,
    /// PEM file of the CA to trust for `grpcs://` (default: the web PKI roots).
    pub ca_file: Option<std::path::PathBuf>,
    /// Sent as KubeMQ's `authorization` metadata on every call.
    pub token: Option<String>,
}

impl RemoteArray {
    /// The URI tonic dials.
    pub fn uri(&self) -> String {
        format!("{}://{}", if self.tls { "https" } else { "http" }, self.authority)
    }
}

impl Default for Config {
    fn default() -> Self {
        Config {
            stomp_addr: "0.0.0.0:61613".parse().unwrap(),
            stomp_plain: true,
            stomp_tls_addr: Some("0.0.0.0:61614".parse().unwrap()),
            stomp_tls: None,
            ws_addr: None,
            ws_tls_addr: None,
            ws_path: "/ws".into(),
            ws_allowed_origins: Vec::new(),
            amqp_addr: None,
            amqp_max_frame_size: 131_072,
            amqp_max_message_size: 100 * 1024 * 1024,
            amqp_tls_addr: None,
            amqp_session_max: 256,
            amqp_max_links_per_session: 256,
            amqp_max_connections: 1000,
            amqp_idle_timeout_s: 120,
            amqp_default_pattern: crate::model::Pattern::Queues,
            amqp_get_batch_size: 32,
            amqp_max_unsettled_per_link: 1024,
            amqp_rpc_timeout_s: 30,
            amqp_rpc_max_pending: 512,
            cpus: vec![0],
            default_pattern: DefaultPattern::Events,
            heartbeat_ms: 10_000,
            max_connections: 0,
            max_body_size: 100 * 1024 * 1024,
            sub_buff_size: 100,
            queue_ack_timeout_s: 30,
            rpc_timeout_s: 30,
            rpc_max_pending: 1024,
            connect_timeout_s: 10,
            max_tx_frames: 10_000,
            max_transactions: 1_000,
            max_subscriptions: 10_000,
            partial_frames_budget: 512 * 1024 * 1024,
            queue_max_messages: 1_000_000,
            queue_max_bytes: 1024 * 1024 * 1024,
            grpc_addr: Some("0.0.0.0:50000".parse().unwrap()),
            grpc_threads: 1,
            grpc_tls: None,
            grpc_token: None,
            auth: crate::auth::Auth::default(),
            array: ArrayMode::Embedded,
            metrics_addr: None,
            store: StoreConfig::default(),
            mesh_ring: 8192,
        }
    }
}

impl Config {
    /// Parses the process's arguments and environment. `Err` is a one-line reason.
    /// `--help` and `--version` print and exit the process with status 0.
    pub fn from_env_and_args() -> Result<Config, String> {
        let cli = match Cli::try_parse() {
            Ok(cli) => cli,
            Err(e) if !e.use_stderr() => e.exit(), // --help / --version
            Err(e) => return Err(one_line(&e)),
        };
        let env = |name: &str| std::env::var_os(name).map(|v| v.to_string_lossy().into_owned());
        Config::resolve(&cli, env, &online_cpus()?)
    }

    /// Like [`Config::from_env_and_args`] but with explicit arguments (the first is the program
    /// name, as in `std::env::args()`) and environment lookup; uses the real online CPUs.
    /// `--help`/`--version` come back as `Err` holding the first line of the text.
    pub fn parse_from<I, T, F>(args: I, env: F) -> Result<Config, String>
    where
        I: IntoIterator<Item = T>,
        T: Into<std::ffi::OsString> + Clone,
        F: Fn(&str) -> Option<String>,
    {
        Config::parse_with(args, env, &online_cpus()?)
    }

    /// The pure form: arguments, environment lookup and the list of online CPUs are all given,
    /// so tests touch neither the process environment nor the machine.
    pub fn parse_with<I, T, F>(args: I, env: F, online: &[usize]) -> Result<Config, String>
    where
        I: IntoIterator<Item = T>,
        T: Into<std::ffi::OsString> + Clone,
        F: Fn(&str) -> Option<String>,
    {
        let cli = Cli::try_parse_from(args).map_err(|e| one_line(&e))?;
        Config::resolve(&cli, env, online)
    }
}
