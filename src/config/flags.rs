//! The command line: clap parses every flag into a raw `Option<String>` and nothing more; the
//! fallback to env, file and default is [`super::resolve`]'s. The help texts name each
//! setting's env variable and TOML key by hand (see the module doc of [`super`]).
use clap::Parser;

const AFTER_HELP: &str = "\
Precedence: command-line flag > environment variable > --config file > default.
An environment variable set to the empty string counts as unset.
A bad value stops start-up with a one-line reason naming the setting and where it came from.";

/// The command line. Every value is kept as the raw string (`None` = flag absent) and parsed
/// in [`Config::parse_with`](super::Config::parse_with), which owns the env/file/default fallback.
#[derive(Parser, Debug, Default)]
#[command(
    name = "stompgate",
    version,
    about = "Thread-per-core STOMP 1.0/1.1/1.2 gateway onto KubeMQ's five messaging patterns \
             (embedded array, or a remote KubeMQ array with --array).",
    after_help = AFTER_HELP
)]
pub(super) struct Cli {
    /// STOMP listener address, an IP literal and a port (1-65535), e.g. 127.0.0.1:61613 or
    /// [::]:61613. Default 0.0.0.0:61613. Env CONNECTORS_STOMP_PORT sets only the port (the host
    /// stays that of the config file's stomp_addr, else 0.0.0.0). TOML key: stomp_addr.
    /// `off` turns plain STOMP off (then only the TLS listener serves STOMP).
    #[arg(long, value_name = "IP:PORT|off")]
    pub(super) stomp_addr: Option<String>,

    /// AMQP 1.0 listener address (IP:PORT), or `off`. Default 0.0.0.0:5672. Env
    /// CONNECTORS_AMQP10_PORT sets only the port (host from the config file's amqp_addr, else
    /// 0.0.0.0). TOML key: amqp_addr.
    #[arg(long, value_name = "IP:PORT|off")]
    pub(super) amqp_addr: Option<String>,

    /// Largest AMQP 1.0 frame accepted, advertised in OPEN (min(client, this) applies), at
    /// least 512. Default 131072. Env CONNECTORS_AMQP10_MAX_FRAME_SIZE. TOML key:
    /// amqp_max_frame_size.
    #[arg(long, value_name = "BYTES")]
    pub(super) amqp_max_frame_size: Option<String>,

    /// Largest AMQP 1.0 message, multi-frame transfers included; larger ones detach the link
    /// with amqp:link:message-size-exceeded. Default 104857600 (100 MiB). Env
    /// CONNECTORS_AMQP10_MAX_MESSAGE_SIZE. TOML key: amqp_max_message_size.
    #[arg(long, value_name = "BYTES")]
    pub(super) amqp_max_message_size: Option<String>,

    /// `false` turns both AMQP 1.0 listeners off (as --amqp-addr off --amqp-tls-addr off).
    /// Default true. Env CONNECTORS_AMQP10_ENABLE. TOML key: amqp_enable.
    #[arg(long, value_name = "true|false")]
    pub(super) amqp_enable: Option<String>,

    /// AMQP 1.0 over TLS (amqps) listener address (IP:PORT), or `off`. Bound only with
    /// --tls-cert and --tls-key (the STOMP TLS certificate, client CA and reload). Default
    /// 0.0.0.0:5671. Env CONNECTORS_AMQP10_TLS_PORT sets only the port. TOML key: amqp_tls_addr.
    #[arg(long, value_name = "IP:PORT|off")]
    pub(super) amqp_tls_addr: Option<String>,

    /// AMQP 1.0 sessions per connection (channel-max = min(client, this - 1)), 1-65535.
    /// Default 256. Env CONNECTORS_AMQP10_SESSION_MAX. TOML key: amqp_session_max.
    #[arg(long, value_name = "N")]
    pub(super) amqp_session_max: Option<String>,

    /// AMQP 1.0 links per session (handle-max = this - 1); an ATTACH beyond it is refused with
    /// amqp:resource-limit-exceeded. Default 256. Env CONNECTORS_AMQP10_MAX_LINKS_PER_SESSION.
    /// TOML key: amqp_max_links_per_session.
    #[arg(long, value_name = "N")]
    pub(super) amqp_max_links_per_session: Option<String>,

    /// AMQP 1.0 connections open at once in this process, 0 = unlimited; the one over it is
    /// refused at OPEN with amqp:resource-limit-exceeded. Default 1000. Env
    /// CONNECTORS_AMQP10_MAX_CONNECTIONS. TOML key: amqp_max_connections.
    #[arg(long, value_name = "N")]
    pub(super) amqp_max_connections: Option<String>,

    /// AMQP 1.0 idle time-out, seconds, 0 = off: a connection that sends nothing for this long
    /// is closed with amqp:resource-limit-exceeded; OPEN advertises half of it. Default 120.
    /// Env CONNECTORS_AMQP10_IDLE_TIMEOUT_SECONDS. TOML key: amqp_idle_timeout_s.
    #[arg(long, value_name = "SECONDS")]
    pub(super) amqp_idle_timeout_s: Option<String>,

    /// The pattern of a bare AMQP address without a node-capability hint: queues, events,
    /// events-store, commands or queries. Default queues. Env CONNECTORS_AMQP10_DEFAULT_PATTERN.
    /// TOML key: amqp_default_pattern.
    #[arg(long, value_name = "PATTERN")]
    pub(super) amqp_default_pattern: Option<String>,

    /// KubeMQ's cap on one queue Get, 1-1024; validated and kept for parity (stompgate's queue
    /// links are fed by credit-sized subscriptions, not Get batches). Default 32. Env
    /// CONNECTORS_AMQP10_GET_BATCH_SIZE. TOML key: amqp_get_batch_size.
    #[arg(long, value_name = "N")]
    pub(super) amqp_get_batch_size: Option<String>,

    /// Unsettled queue deliveries per AMQP 1.0 link, and the credit given to a client sender.
    /// Default 1024. Env CONNECTORS_AMQP10_MAX_UNSETTLED_PER_LINK. TOML key:
    /// amqp_max_unsettled_per_link.
    #[arg(long, value_name = "N")]
    pub(super) amqp_max_unsettled_per_link: Option<String>,

    /// AMQP 1.0 RPC time-out without a header.ttl, seconds (at least 1). Default 30. Env
    /// CONNECTORS_AMQP10_DEFAULT_RPC_TIMEOUT_SECONDS. TOML key: amqp_rpc_timeout_s.
    #[arg(long, value_name = "SECONDS")]
    pub(super) amqp_rpc_timeout_s: Option<String>,

    /// AMQP 1.0 RPC requests in flight per connection; one more is rejected with
    /// amqp:resource-limit-exceeded. Default 512. Env CONNECTORS_AMQP10_RPC_MAX_PENDING. TOML
    /// key: amqp_rpc_max_pending.
    #[arg(long, value_name = "N")]
    pub(super) amqp_rpc_max_pending: Option<String>,

    /// STOMP over TLS listener address (IP:PORT), or `off`. Bound only when --tls-cert and
    /// --tls-key are given. Default 0.0.0.0:61614. Env CONNECTORS_STOMP_TLS_PORT sets only the
    /// port (the host stays that of the config file's stomp_tls_addr, else 0.0.0.0). TOML key:
    /// stomp_tls_addr.
    #[arg(long, value_name = "IP:PORT|off")]
    pub(super) stomp_tls_addr: Option<String>,

    /// PEM certificate chain of the STOMP TLS listener (TLS 1.2 and 1.3 only); needs
    /// --tls-key. Re-read on SIGHUP (new connections get the new one). No env. TOML key: tls_cert.
    #[arg(long, value_name = "FILE")]
    pub(super) tls_cert: Option<String>,

    /// PEM private key for --tls-cert. Re-read on SIGHUP. No env. TOML key: tls_key.
    #[arg(long, value_name = "FILE")]
    pub(super) tls_key: Option<String>,

    /// Mutual TLS on the STOMP TLS listener: PEM CA certificate(s); every client must present
    /// a certificate signed by one of them, and the certificate's subject CN becomes the
    /// client id. Needs --tls-cert. Re-read on SIGHUP. No env. TOML key: tls_client_ca.
    #[arg(long, value_name = "FILE")]
    pub(super) tls_client_ca: Option<String>,

    /// STOMP over WebSocket listener (IP:PORT), or `off`. Default 0.0.0.0:15674. Env
    /// STOMPGATE_WS_ADDR. TOML key: ws_addr.
    #[arg(long, value_name = "IP:PORT|off")]
    pub(super) ws_addr: Option<String>,

    /// The HTTP path a WebSocket handshake must ask for (others get 404); must start with '/'.
    /// Default /ws. Env STOMPGATE_WS_PATH. TOML key: ws_path.
    #[arg(long, value_name = "PATH")]
    pub(super) ws_path: Option<String>,

    /// STOMP over secure WebSocket (wss) listener (IP:PORT), or `off`. Bound only when
    /// --tls-cert and --tls-key are given (the same certificate as the STOMP TLS listener).
    /// Default 0.0.0.0:15673. Env STOMPGATE_WS_TLS_ADDR. TOML key: ws_tls_addr.
    #[arg(long, value_name = "IP:PORT|off")]
    pub(super) ws_tls_addr: Option<String>,

    /// Comma-separated origins a WebSocket handshake may come from, e.g.
    /// https://app.example.com,http://localhost:8080; a handshake with another `Origin` gets
    /// 403 (cross-site WebSocket hijacking); one without `Origin` (not a browser) is let in.
    /// `*` or unset: any origin. Env STOMPGATE_WS_ALLOWED_ORIGINS. TOML key: ws_allowed_origins.
    #[arg(long, value_name = "LIST")]
    pub(super) ws_allowed_origins: Option<String>,

    /// Run on the first N online CPUs, one pinned executor each; N must be 1..=number of online
    /// CPUs. Default: all online CPUs. Conflicts with --cpus. No env. TOML key: cores.
    #[arg(long, value_name = "N", conflicts_with = "cpus", allow_negative_numbers = true)]
    pub(super) cores: Option<String>,

    /// Run on exactly these CPUs, e.g. 0,2-3 (comma-separated CPU ids and inclusive ranges;
    /// each CPU must be online, no duplicates). Default: all online CPUs. Conflicts with
    /// --cores. No env. TOML key: cpus (a string).
    #[arg(long, value_name = "LIST")]
    pub(super) cpus: Option<String>,

    /// Pattern for bare destinations (no known prefix): events, queues, store, or none
    /// (= reject as invalid destination). Default events. Env CONNECTORS_STOMP_DEFAULT_PATTERN.
    /// TOML key: default_pattern.
    #[arg(long, value_name = "PATTERN")]
    pub(super) default_pattern: Option<String>,

    /// Server heart-beat in milliseconds, advertised as sx=sy in CONNECTED; 0 disables
    /// heart-beating. Default 10000. Env CONNECTORS_STOMP_HEARTBEAT_MS. TOML key: heartbeat_ms.
    #[arg(long, value_name = "MS", allow_negative_numbers = true)]
    pub(super) heartbeat_ms: Option<String>,

    /// Maximum concurrent STOMP connections; 0 = unlimited. Default 0.
    /// Env CONNECTORS_STOMP_MAX_CONNECTIONS. TOML key: max_connections.
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub(super) max_connections: Option<String>,

    /// Maximum frame body size in bytes (larger → ERROR "frame too large"); must be > 0.
    /// Default 104857600 (100 MiB). Env CONNECTORS_STOMP_MAX_BODY_SIZE. TOML key: max_body_size.
    #[arg(long, value_name = "BYTES", allow_negative_numbers = true)]
    pub(super) max_body_size: Option<String>,

    /// Per-subscription buffer: for queues the maximum unacknowledged messages (prefetch), for
    /// events the deliveries queued before new ones are dropped; must be >= 1. Default 100.
    /// Env CONNECTORS_STOMP_SUB_BUFF_SIZE. TOML key: sub_buff_size.
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub(super) sub_buff_size: Option<String>,

    /// Seconds a queue message may stay unacknowledged before it is requeued; must be >= 1.
    /// Default 30. Env CONNECTORS_STOMP_QUEUE_ACK_TIMEOUT_SECONDS. TOML key: queue_ack_timeout_s.
    #[arg(long, value_name = "SECONDS", allow_negative_numbers = true)]
    pub(super) queue_ack_timeout_s: Option<String>,

    /// Upper bound in seconds for a command/query reply (a request's `timeout` header, in ms,
    /// can only shorten it); must be >= 1. Default 30. Env CONNECTORS_STOMP_RPC_TIMEOUT_SECONDS.
    /// TOML key: rpc_timeout_s.
    #[arg(long, value_name = "SECONDS", allow_negative_numbers = true)]
    pub(super) rpc_timeout_s: Option<String>,

    /// Maximum RPC requests in flight per connection (more → ERROR "too many pending requests");
    /// must be >= 1. Default 1024. Env CONNECTORS_STOMP_RPC_MAX_PENDING. TOML key: rpc_max_pending.
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub(super) rpc_max_pending: Option<String>,

    /// Seconds a new connection has to complete CONNECT; then it is closed (a bare close if it
    /// sent nothing, else ERROR "not connected"). Must be >= 1. Default 10.
    /// Env CONNECTORS_STOMP_CONNECT_TIMEOUT_SECONDS. TOML key: connect_timeout_s.
    #[arg(long, value_name = "SECONDS", allow_negative_numbers = true)]
    pub(super) connect_timeout_s: Option<String>,
    /// Maximum SEND/ACK/NACK frames one transaction may hold until COMMIT (more → ERROR
    /// "too many pending requests"); must be >= 1. Default 10000. Env STOMPGATE_MAX_TX_FRAMES.
    /// TOML key: max_tx_frames.
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub(super) max_tx_frames: Option<String>,

    /// Maximum open transactions per connection (more → ERROR "too many pending requests");
    /// must be >= 1. Default 1000. Env STOMPGATE_MAX_TRANSACTIONS. TOML key: max_transactions.
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub(super) max_transactions: Option<String>,

    /// Maximum subscriptions per connection (more → ERROR "too many pending requests"); must
    /// be >= 1. Default 10000. Env STOMPGATE_MAX_SUBSCRIPTIONS. TOML key: max_subscriptions.
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub(super) max_subscriptions: Option<String>,

    /// Process-wide budget in bytes for inbound frames not yet complete (all connections
    /// together; a body without content-length counts as it arrives). Over it, the connection
    /// holding the most gets ERROR "frame too large" and is closed; must be >= 1. Default
    /// 536870912 (512 MiB). Env STOMPGATE_PARTIAL_FRAMES_BUDGET. TOML key: partial_frames_budget.
    #[arg(long, value_name = "BYTES", allow_negative_numbers = true)]
    pub(super) partial_frames_budget: Option<String>,

    /// Depth limit of each queue in messages (KubeMQ's per-channel store MaxMessages); a SEND
    /// over it → ERROR "too many pending requests"; 0 = unlimited. Default 1000000. Embedded
    /// array only. Env STOMPGATE_QUEUE_MAX_MESSAGES. TOML key: queue_max_messages.
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub(super) queue_max_messages: Option<String>,

    /// Depth limit of each queue in body bytes (KubeMQ's per-channel store MaxQueueSize); a
    /// SEND over it → ERROR "too many pending requests"; 0 = unlimited. Default 1073741824
    /// (1 GiB). Embedded array only. Env STOMPGATE_QUEUE_MAX_BYTES. TOML key: queue_max_bytes.
    #[arg(long, value_name = "BYTES", allow_negative_numbers = true)]
    pub(super) queue_max_bytes: Option<String>,

    /// KubeMQ gRPC array API listener (IP:PORT), for native KubeMQ SDK clients; `off` disables
    /// it. Serves all five patterns (service kubemq.kubemq) on the same channels STOMP clients
    /// use. Default 0.0.0.0:50000. No env. TOML key: grpc_addr.
    #[arg(long, value_name = "IP:PORT|off")]
    pub(super) grpc_addr: Option<String>,

    /// Worker threads of the gRPC server's own runtime (kept off the STOMP cores); must be
    /// >= 1. Default 1. No env. TOML key: grpc_threads.
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub(super) grpc_threads: Option<String>,

    /// PEM certificate chain for the gRPC listener: with --grpc-tls-key it serves TLS only
    /// (what `grpcs://` gateways and SDK clients with TLS dial). No env. TOML key: grpc_tls_cert.
    #[arg(long, value_name = "FILE")]
    pub(super) grpc_tls_cert: Option<String>,

    /// PEM private key for --grpc-tls-cert. No env. TOML key: grpc_tls_key.
    #[arg(long, value_name = "FILE")]
    pub(super) grpc_tls_key: Option<String>,

    /// Require this token as `authorization` metadata on every gRPC call (what --array-token
    /// and the SDKs' auth token send); others get UNAUTHENTICATED. A shared secret compared as
    /// is, not a JWT. Env STOMPGATE_GRPC_TOKEN (preferred: a flag shows in `ps`). TOML key:
    /// grpc_token.
    #[arg(long, value_name = "TOKEN")]
    pub(super) grpc_token: Option<String>,

    /// JWT authentication: the HMAC secret (HS*; the file's bytes, one trailing newline
    /// dropped) or PEM public key (RS*, ES*) that signs client tokens. With it, a STOMP
    /// CONNECT must carry a valid token in `passcode` and every gRPC call one as
    /// `authorization` metadata (this replaces --grpc-token, which cannot be set with it);
    /// others get ERROR "access denied" / UNAUTHENTICATED. Default: off. Env
    /// STOMPGATE_AUTH_JWT_KEY. TOML key: auth_jwt_key.
    #[arg(long, value_name = "FILE")]
    pub(super) auth_jwt_key: Option<String>,

    /// The one algorithm tokens must be signed with: HS256, HS384, HS512, RS256, RS384, RS512,
    /// ES256 or ES384 (KubeMQ's names). Default HS256. Needs --auth-jwt-key. Env
    /// STOMPGATE_AUTH_JWT_ALG. TOML key: auth_jwt_alg.
    #[arg(long, value_name = "ALG")]
    pub(super) auth_jwt_alg: Option<String>,

    /// Per-channel authorization: a JSON list of KubeMQ access rules ({"ClientID": regex,
    /// "Events"/"EventsStore"/"Queues"/"Commands"/"Queries": bool, "Channel": regex, "Read":
    /// bool, "Write": bool}); with it, only what a rule allows is (SUBSCRIBE = Read, SEND =
    /// Write), on STOMP and gRPC. Re-read on SIGHUP (a bad file keeps the old rules). Default:
    /// off. Env STOMPGATE_AUTHZ_FILE. TOML key: authz_file.
    #[arg(long, value_name = "FILE")]
    pub(super) authz_file: Option<String>,

    /// Where the array lives: `embedded` (in this process, the default) or a remote KubeMQ
    /// array, `grpc://HOST:PORT` or `grpcs://HOST:PORT` (TLS). In remote mode each core keeps
    /// its own gRPC connection on a dedicated egress thread and the gateway holds no channel
    /// state. No env. TOML key: array.
    #[arg(long, value_name = "embedded|grpc://HOST:PORT|grpcs://HOST:PORT")]
    pub(super) array: Option<String>,

    /// PEM file of the CA that signs the remote array's certificate (`grpcs://` only; default:
    /// the standard web roots). No env. TOML key: array_ca_file.
    #[arg(long, value_name = "FILE")]
    pub(super) array_ca_file: Option<String>,

    /// Auth token for the remote array, sent as KubeMQ's `authorization` metadata on every call.
    /// Env STOMPGATE_ARRAY_TOKEN (preferred: a flag shows in `ps`). TOML key: array_token.
    #[arg(long, value_name = "TOKEN")]
    pub(super) array_token: Option<String>,

    /// Serve Prometheus metrics at http://IP:PORT/metrics: per-core connections, frames,
    /// deliveries and drops, and in remote-array mode each core's egress streams (wanted,
    /// connected, reconnects, unconfirmed, failed); and the operator views (JSON)
    /// /api/channels and /api/stomp/connections; other paths get 404. `off` (the default)
    /// serves none. No env.
    /// TOML key: metrics_addr.
    #[arg(long, value_name = "IP:PORT|off")]
    pub(super) metrics_addr: Option<String>,

    /// The persistent embedded array's store directory (created if missing; one subdirectory
    /// per core and a lock file: a second process on the same directory fails at start).
    /// Queue messages and their settlements, and Events-Store messages, are logged there and
    /// recovered at start. Default ./store (KubeMQ's); `off` keeps them in memory only.
    /// Embedded array only: with --array grpc://… the gateway keeps no store (a directory
    /// given then is an error). Env STORE_STORE_PATH (KubeMQ's name). TOML key: store_dir.
    #[arg(long, value_name = "DIR|off")]
    pub(super) store_dir: Option<String>,

    /// What a persistent queue or store SEND's RECEIPT (and gRPC send result) waits for: `fsync` (the
    /// default: write(2) and fdatasync, survives a power loss) or `write` (write(2) only:
    /// survives kill -9, not a power loss). Env STOMPGATE_STORE_SYNC. TOML key: store_sync.
    #[arg(long, value_name = "fsync|write")]
    pub(super) store_sync: Option<String>,

    /// Group commit: the shortest time between two syncs of one core's log, in microseconds;
    /// records arriving in between share the next write and fdatasync; after a sync that
    /// confirmed 32 or more operations, the next waits up to twice this for their senders'
    /// answers (queue deliveries wait with it). Default 200. Env
    /// STOMPGATE_STORE_SYNC_INTERVAL_US. TOML key: store_sync_interval_us.
    #[arg(long, value_name = "US", allow_negative_numbers = true)]
    pub(super) store_sync_interval_us: Option<String>,

    /// Cap on the store's disk use, in bytes (segment files over every core, each core taking
    /// an equal share): a queue or Events-Store SEND that would take its core's log past its
    /// share is refused (STOMP ERROR `too many pending requests`, gRPC an in-band error) and
    /// nothing is appended; settlements (ACKs) are always written, so consumers can still
    /// drain and free whole segments. A full disk (ENOSPC) is refused the same way. 0 (the
    /// default) = no cap. Env STOMPGATE_STORE_MAX_BYTES. TOML key: store_max_bytes.
    #[arg(long, value_name = "BYTES", allow_negative_numbers = true)]
    pub(super) store_max_bytes: Option<String>,

    /// Events-Store retention in minutes: a message older than this leaves its channel (it is
    /// no longer replayed, and its record no longer keeps its log segment on disk); its
    /// sequence is never reused. Default 1440 (a day, KubeMQ's default); 0 = keep for ever.
    /// Queues are not affected (a queue message stays until settled or its own expiration).
    /// Env STORE_MAX_RETENTION (KubeMQ's name). TOML key: store_retention_min.
    #[arg(long, value_name = "MINUTES", allow_negative_numbers = true)]
    pub(super) store_retention_min: Option<String>,
    /// Events-Store size retention in MiB over every core (each core taking an equal share;
    /// default 512): the history is held in memory, and past this the oldest messages of a
    /// core leave first, whatever their channel, as if their age had run out (a channel always
    /// keeps its newest message). Applies with and without a store directory. 0 = no bound:
    /// then any client can make the process hold everything it sends for the whole age
    /// retention. Env STOMPGATE_STORE_RETENTION_MB. TOML key: store_retention_mb.
    #[arg(long, value_name = "MIB", allow_negative_numbers = true)]
    pub(super) store_retention_mb: Option<String>,
    /// Memory for queued message contents with a store, in MiB over every core (each core
    /// taking an equal share; default 256): past it, a queue backlog's written messages keep
    /// only a 64-byte index entry in memory and their contents are read back from the log
    /// just ahead of the consumers (up to 1024 messages or 4 MiB per queue). Messages in
    /// flight and delayed ones always stay in memory. 0 keeps only the read-ahead windows.
    /// Env STOMPGATE_STORE_CACHE_MB. TOML key: store_cache_mb.
    #[arg(long, value_name = "MIB", allow_negative_numbers = true)]
    pub(super) store_cache_mb: Option<String>,

    /// Size of one log segment file in bytes (default 64 MiB). For tests of space
    /// reclamation: not part of the documented configuration.
    #[arg(long, value_name = "BYTES", hide = true)]
    pub(super) store_segment_bytes: Option<String>,

    /// TOML file with any of the settings above; keys are the flag names with '-' → '_'
    /// (e.g. stomp_addr = "127.0.0.1:61613", cores = 2, cpus = "0,1", default_pattern = "queues",
    /// heartbeat_ms = 5000). Unknown keys are an error. Flags and env override the file.
    #[arg(long, value_name = "FILE")]
    pub(super) config: Option<String>,
}

/// clap's rendered error is several lines (message, tip, usage); keep the first.
pub(super) fn one_line(e: &clap::Error) -> String {
    let rendered = e.render().to_string();
    let first = rendered.lines().map(str::trim).find(|l| !l.is_empty()).unwrap_or("invalid arguments");
    first.strip_prefix("error: ").unwrap_or(first).to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{env, TOML_KEYS};

    #[test]
    fn help_names_every_env_and_toml_key() {
        use clap::CommandFactory;
        let help = Cli::command().render_long_help().to_string();
        let help = help.split_whitespace().collect::<Vec<_>>().join(" ");
        for name in [
            env::STOMP_PORT,
            env::STOMP_TLS_PORT,
            env::AMQP10_PORT,
            env::AMQP10_MAX_FRAME_SIZE,
            env::AMQP10_MAX_MESSAGE_SIZE,
            env::DEFAULT_PATTERN,
            env::HEARTBEAT_MS,
            env::MAX_CONNECTIONS,
            env::MAX_BODY_SIZE,
            env::SUB_BUFF_SIZE,
            env::QUEUE_ACK_TIMEOUT_SECONDS,
            env::RPC_TIMEOUT_SECONDS,
            env::RPC_MAX_PENDING,
            env::CONNECT_TIMEOUT_SECONDS,
            env::MAX_TX_FRAMES,
            env::MAX_TRANSACTIONS,
            env::MAX_SUBSCRIPTIONS,
            env::PARTIAL_FRAMES_BUDGET,
            env::QUEUE_MAX_MESSAGES,
            env::QUEUE_MAX_BYTES,
            env::AUTH_JWT_KEY,
            env::AUTH_JWT_ALG,
            env::AUTHZ_FILE,
            env::WS_ADDR,
            env::WS_PATH,
            env::WS_TLS_ADDR,
            env::WS_ALLOWED_ORIGINS,
            env::STORE_PATH,
            env::STORE_SYNC,
            env::STORE_SYNC_INTERVAL_US,
            env::STORE_MAX_BYTES,
            env::STORE_MAX_RETENTION,
            env::STORE_RETENTION_MB,
            env::STORE_CACHE_MB,
        ] {
            assert!(help.contains(name), "help lacks {name}");
        }
        for key in TOML_KEYS {
            assert!(help.contains(&format!("TOML key: {key}")), "help lacks TOML key {key}");
        }
        Cli::command().debug_assert();
    }
}
