//! Where a raw value comes from: a flag, a KubeMQ environment name or the `--config` TOML
//! file, and which of them wins (flag > env > file; the default is the caller's).
use super::flags::Cli;
use std::fmt::Display;
use std::path::Path;

/// Environment variable names (KubeMQ's own, so an operator's settings carry over).
pub mod env {
    pub const STOMP_PORT: &str = "CONNECTORS_STOMP_PORT";
    /// The port of the STOMP TLS listener (host: the file's `stomp_tls_addr`, else 0.0.0.0).
    pub const STOMP_TLS_PORT: &str = "CONNECTORS_STOMP_TLS_PORT";
    pub const AMQP10_PORT: &str = "CONNECTORS_AMQP10_PORT";
    pub const AMQP10_MAX_FRAME_SIZE: &str = "CONNECTORS_AMQP10_MAX_FRAME_SIZE";
    pub const AMQP10_MAX_MESSAGE_SIZE: &str = "CONNECTORS_AMQP10_MAX_MESSAGE_SIZE";
    pub const AMQP10_ENABLE: &str = "CONNECTORS_AMQP10_ENABLE";
    pub const AMQP10_TLS_PORT: &str = "CONNECTORS_AMQP10_TLS_PORT";
    pub const AMQP10_SESSION_MAX: &str = "CONNECTORS_AMQP10_SESSION_MAX";
    pub const AMQP10_MAX_LINKS_PER_SESSION: &str = "CONNECTORS_AMQP10_MAX_LINKS_PER_SESSION";
    pub const AMQP10_MAX_CONNECTIONS: &str = "CONNECTORS_AMQP10_MAX_CONNECTIONS";
    pub const AMQP10_IDLE_TIMEOUT_SECONDS: &str = "CONNECTORS_AMQP10_IDLE_TIMEOUT_SECONDS";
    pub const AMQP10_DEFAULT_PATTERN: &str = "CONNECTORS_AMQP10_DEFAULT_PATTERN";
    pub const AMQP10_GET_BATCH_SIZE: &str = "CONNECTORS_AMQP10_GET_BATCH_SIZE";
    pub const AMQP10_MAX_UNSETTLED_PER_LINK: &str = "CONNECTORS_AMQP10_MAX_UNSETTLED_PER_LINK";
    pub const AMQP10_DEFAULT_RPC_TIMEOUT_SECONDS: &str = "CONNECTORS_AMQP10_DEFAULT_RPC_TIMEOUT_SECONDS";
    pub const AMQP10_RPC_MAX_PENDING: &str = "CONNECTORS_AMQP10_RPC_MAX_PENDING";
    pub const DEFAULT_PATTERN: &str = "CONNECTORS_STOMP_DEFAULT_PATTERN";
    pub const HEARTBEAT_MS: &str = "CONNECTORS_STOMP_HEARTBEAT_MS";
    pub const MAX_CONNECTIONS: &str = "CONNECTORS_STOMP_MAX_CONNECTIONS";
    pub const MAX_BODY_SIZE: &str = "CONNECTORS_STOMP_MAX_BODY_SIZE";
    pub const SUB_BUFF_SIZE: &str = "CONNECTORS_STOMP_SUB_BUFF_SIZE";
    pub const QUEUE_ACK_TIMEOUT_SECONDS: &str = "CONNECTORS_STOMP_QUEUE_ACK_TIMEOUT_SECONDS";
    pub const RPC_TIMEOUT_SECONDS: &str = "CONNECTORS_STOMP_RPC_TIMEOUT_SECONDS";
    pub const RPC_MAX_PENDING: &str = "CONNECTORS_STOMP_RPC_MAX_PENDING";
    pub const CONNECT_TIMEOUT_SECONDS: &str = "CONNECTORS_STOMP_CONNECT_TIMEOUT_SECONDS";
    /// The memory budgets (issue 13) have no KubeMQ STOMP counterpart: our own names.
    pub const MAX_TX_FRAMES: &str = "STOMPGATE_MAX_TX_FRAMES";
    pub const MAX_TRANSACTIONS: &str = "STOMPGATE_MAX_TRANSACTIONS";
    pub const MAX_SUBSCRIPTIONS: &str = "STOMPGATE_MAX_SUBSCRIPTIONS";
    pub const PARTIAL_FRAMES_BUDGET: &str = "STOMPGATE_PARTIAL_FRAMES_BUDGET";
    pub const QUEUE_MAX_MESSAGES: &str = "STOMPGATE_QUEUE_MAX_MESSAGES";
    pub const QUEUE_MAX_BYTES: &str = "STOMPGATE_QUEUE_MAX_BYTES";
    /// The remote array's auth token (kept out of the command line, where `ps` shows it).
    pub const ARRAY_TOKEN: &str = "STOMPGATE_ARRAY_TOKEN";
    /// The token the gRPC listener requires (same reason).
    pub const GRPC_TOKEN: &str = "STOMPGATE_GRPC_TOKEN";
    /// Authentication and authorization files: no KubeMQ STOMP counterpart, our own names.
    pub const AUTH_JWT_KEY: &str = "STOMPGATE_AUTH_JWT_KEY";
    pub const AUTH_JWT_ALG: &str = "STOMPGATE_AUTH_JWT_ALG";
    pub const AUTHZ_FILE: &str = "STOMPGATE_AUTHZ_FILE";
    /// STOMP over WebSocket: no KubeMQ counterpart, our own names (whole addresses).
    pub const WS_ADDR: &str = "STOMPGATE_WS_ADDR";
    pub const WS_PATH: &str = "STOMPGATE_WS_PATH";
    pub const WS_TLS_ADDR: &str = "STOMPGATE_WS_TLS_ADDR";
    pub const WS_ALLOWED_ORIGINS: &str = "STOMPGATE_WS_ALLOWED_ORIGINS";
    /// The store directory: KubeMQ's own name for its store path.
    pub const STORE_PATH: &str = "STORE_STORE_PATH";
    /// How the store syncs: no KubeMQ counterpart, our own names.
    pub const STORE_SYNC: &str = "STOMPGATE_STORE_SYNC";
    pub const STORE_SYNC_INTERVAL_US: &str = "STOMPGATE_STORE_SYNC_INTERVAL_US";
    /// KubeMQ's store limits are per channel (`STORE_MAX_QUEUE_SIZE`, mapped to
    /// `--queue-max-bytes`); a cap on the whole store is ours.
    pub const STORE_MAX_BYTES: &str = "STOMPGATE_STORE_MAX_BYTES";
    /// Events-Store retention in minutes: KubeMQ's own name (`Store.MaxRetention`).
    pub const STORE_MAX_RETENTION: &str = "STORE_MAX_RETENTION";
    pub const STORE_CACHE_MB: &str = "STOMPGATE_STORE_CACHE_MB";
    /// Events-Store size retention: KubeMQ bounds each channel instead, so the name is ours.
    pub const STORE_RETENTION_MB: &str = "STOMPGATE_STORE_RETENTION_MB";
}

/// Keys accepted in the `--config` TOML file: the flag names with `-` → `_`.
pub const TOML_KEYS: [&str; 59] = [
    "stomp_addr",
    "stomp_tls_addr",
    "tls_cert",
    "tls_key",
    "tls_client_ca",
    "cores",
    "cpus",
    "default_pattern",
    "heartbeat_ms",
    "max_connections",
    "max_body_size",
    "sub_buff_size",
    "queue_ack_timeout_s",
    "rpc_timeout_s",
    "rpc_max_pending",
    "connect_timeout_s",
    "max_tx_frames",
    "max_transactions",
    "max_subscriptions",
    "partial_frames_budget",
    "queue_max_messages",
    "queue_max_bytes",
    "grpc_addr",
    "grpc_threads",
    "grpc_tls_cert",
    "grpc_tls_key",
    "grpc_token",
    "array",
    "array_ca_file",
    "array_token",
    "metrics_addr",
    "auth_jwt_key",
    "auth_jwt_alg",
    "authz_file",
    "ws_addr",
    "ws_path",
    "ws_tls_addr",
    "ws_allowed_origins",
    "store_dir",
    "store_sync",
    "store_sync_interval_us",
    "store_max_bytes",
    "store_retention_min",
    "store_retention_mb",
    "store_cache_mb",
    "amqp_addr",
    "amqp_max_frame_size",
    "amqp_max_message_size",
    "amqp_enable",
    "amqp_tls_addr",
    "amqp_session_max",
    "amqp_max_links_per_session",
    "amqp_max_connections",
    "amqp_idle_timeout_s",
    "amqp_default_pattern",
    "amqp_get_batch_size",
    "amqp_max_unsettled_per_link",
    "amqp_rpc_timeout_s",
    "amqp_rpc_max_pending",
];

/// Where a raw value came from; its `Display` names the setting as the user wrote it.
#[derive(Clone, Copy, Debug)]
pub(super) enum Source<'a> {
    Flag(&'a str),
    Env(&'a str),
    File { key: &'a str, path: &'a str },
}

impl Display for Source<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Source::Flag(name) => write!(f, "--{name}"),
            Source::Env(name) => f.write_str(name),
            Source::File { key, path } => write!(f, "{key} in {path}"),
        }
    }
}

/// A raw value from a flag or env (always a string) or from the TOML file (typed).
pub(super) enum Raw<'a> {
    Text(String),
    Toml(&'a toml::Value),
}

/// The parsed `--config` file: its path (for messages) and its top-level table.
pub(super) struct File {
    pub(super) path: String,
    table: toml::Table,
}

impl File {
    pub(super) fn load(path: &str) -> Result<File, String> {
        let text = std::fs::read_to_string(Path::new(path)).map_err(|e| format!("cannot read config file {path}: {e}"))?;
        let table: toml::Table = text.parse().map_err(|e: toml::de::Error| {
            let line = e.span().map(|s| text[..s.start.min(text.len())].matches('\n').count() + 1);
            let msg = e.message().trim().replace('\n', " ");
            match line {
                Some(line) => format!("invalid config file {path}: line {line}: {msg}"),
                None => format!("invalid config file {path}: {msg}"),
            }
        })?;
        if let Some(key) = table.keys().find(|k| !TOML_KEYS.contains(&k.as_str())) {
            return Err(format!("invalid config file {path}: unknown key `{key}` (known keys: {})", TOML_KEYS.join(", ")));
        }
        Ok(File { path: path.to_owned(), table })
    }

    pub(super) fn get(&self, key: &'static str) -> Option<(Raw<'_>, Source<'_>)> {
        self.table.get(key).map(|v| (Raw::Toml(v), Source::File { key, path: &self.path }))
    }
}

/// The lookup state for one resolution: command line, env lookup, optional file.
pub(super) struct Sources<'a, F> {
    pub(super) cli: &'a Cli,
    pub(super) env: F,
    pub(super) file: Option<&'a File>,
}

impl<'a, F: Fn(&str) -> Option<String>> Sources<'a, F> {
    pub(super) fn env(&self, name: &'static str) -> Option<(Raw<'a>, Source<'a>)> {
        (self.env)(name).filter(|v| !v.is_empty()).map(|v| (Raw::Text(v), Source::Env(name)))
    }

    /// The highest-precedence raw value of one setting: flag > env > file.
    pub(super) fn pick(
        &self,
        flag_name: &'static str,
        flag: &Option<String>,
        env_name: Option<&'static str>,
        key: &'static str,
    ) -> Option<(Raw<'a>, Source<'a>)> {
        if let Some(v) = flag {
            return Some((Raw::Text(v.clone()), Source::Flag(flag_name)));
        }
        if let Some(found) = env_name.and_then(|name| self.env(name)) {
            return Some(found);
        }
        self.file.and_then(|f| f.get(key))
    }
}
