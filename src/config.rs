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
use crate::route::DefaultPattern;
use clap::Parser;
use std::fmt::Display;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::Path;

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
    /// KubeMQ gRPC array API listener (default 0.0.0.0:50000); `None` = off.
    pub grpc_addr: Option<SocketAddr>,
    /// Worker threads of the gRPC server's own tokio runtime.
    pub grpc_threads: usize,
    /// TLS for the gRPC listener: PEM certificate chain and private key files.
    pub grpc_tls: Option<ServerTls>,
    /// A token every gRPC call must carry as `authorization` metadata (`None`: no check).
    pub grpc_token: Option<String>,
    /// Where the array lives: in this process (default) or a remote KubeMQ array.
    pub array: ArrayMode,
    /// Prometheus metrics listener (`None` = off, the default).
    pub metrics_addr: Option<SocketAddr>,
    /// Capacity of each cross-core ring. Not a setting: the default suits every deployment,
    /// and tests shrink it to reach the full-ring paths.
    pub mesh_ring: usize,
}

/// The gRPC listener's certificate chain and key (both PEM files, read at start-up).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServerTls {
    pub cert_file: std::path::PathBuf,
    pub key_file: std::path::PathBuf,
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
            cpus: vec![0],
            default_pattern: DefaultPattern::Events,
            heartbeat_ms: 10_000,
            max_connections: 0,
            max_body_size: 100 * 1024 * 1024,
            sub_buff_size: 100,
            queue_ack_timeout_s: 30,
            rpc_timeout_s: 30,
            rpc_max_pending: 1024,
            grpc_addr: Some("0.0.0.0:50000".parse().unwrap()),
            grpc_threads: 1,
            grpc_tls: None,
            grpc_token: None,
            array: ArrayMode::Embedded,
            metrics_addr: None,
            mesh_ring: 8192,
        }
    }
}

/// Environment variable names (KubeMQ's own, so an operator's settings carry over).
pub mod env {
    pub const STOMP_PORT: &str = "CONNECTORS_STOMP_PORT";
    /// Validated as a port, otherwise unused: TLS is not implemented yet.
    pub const STOMP_TLS_PORT: &str = "CONNECTORS_STOMP_TLS_PORT";
    pub const DEFAULT_PATTERN: &str = "CONNECTORS_STOMP_DEFAULT_PATTERN";
    pub const HEARTBEAT_MS: &str = "CONNECTORS_STOMP_HEARTBEAT_MS";
    pub const MAX_CONNECTIONS: &str = "CONNECTORS_STOMP_MAX_CONNECTIONS";
    pub const MAX_BODY_SIZE: &str = "CONNECTORS_STOMP_MAX_BODY_SIZE";
    pub const SUB_BUFF_SIZE: &str = "CONNECTORS_STOMP_SUB_BUFF_SIZE";
    pub const QUEUE_ACK_TIMEOUT_SECONDS: &str = "CONNECTORS_STOMP_QUEUE_ACK_TIMEOUT_SECONDS";
    pub const RPC_TIMEOUT_SECONDS: &str = "CONNECTORS_STOMP_RPC_TIMEOUT_SECONDS";
    pub const RPC_MAX_PENDING: &str = "CONNECTORS_STOMP_RPC_MAX_PENDING";
    /// The remote array's auth token (kept out of the command line, where `ps` shows it).
    pub const ARRAY_TOKEN: &str = "STOMPGATE_ARRAY_TOKEN";
    /// The token the gRPC listener requires (same reason).
    pub const GRPC_TOKEN: &str = "STOMPGATE_GRPC_TOKEN";
}

/// Keys accepted in the `--config` TOML file: the flag names with `-` → `_`.
pub const TOML_KEYS: [&str; 20] = [
    "stomp_addr",
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
    "grpc_addr",
    "grpc_threads",
    "grpc_tls_cert",
    "grpc_tls_key",
    "grpc_token",
    "array",
    "array_ca_file",
    "array_token",
    "metrics_addr",
];

const AFTER_HELP: &str = "\
Precedence: command-line flag > environment variable > --config file > default.
An environment variable set to the empty string counts as unset.
CONNECTORS_STOMP_TLS_PORT is accepted and checked to be a port (1-65535), but TLS is not \
implemented yet: no TLS listener is started.
A bad value stops start-up with a one-line reason naming the setting and where it came from.";

/// The command line. Every value is kept as the raw string (`None` = flag absent) and parsed
/// in [`Config::parse_with`], which owns the env/file/default fallback.
#[derive(Parser, Debug, Default)]
#[command(
    name = "stompgate",
    version,
    about = "Thread-per-core STOMP 1.0/1.1/1.2 gateway onto KubeMQ's five messaging patterns \
             (embedded array, or a remote KubeMQ array with --array).",
    after_help = AFTER_HELP
)]
struct Cli {
    /// STOMP listener address, an IP literal and a port (1-65535), e.g. 127.0.0.1:61613 or
    /// [::]:61613. Default 0.0.0.0:61613. Env CONNECTORS_STOMP_PORT sets only the port (the host
    /// stays that of the config file's stomp_addr, else 0.0.0.0). TOML key: stomp_addr.
    #[arg(long, value_name = "IP:PORT")]
    stomp_addr: Option<String>,

    /// Run on the first N online CPUs, one pinned executor each; N must be 1..=number of online
    /// CPUs. Default: all online CPUs. Conflicts with --cpus. No env. TOML key: cores.
    #[arg(
        long,
        value_name = "N",
        conflicts_with = "cpus",
        allow_negative_numbers = true
    )]
    cores: Option<String>,

    /// Run on exactly these CPUs, e.g. 0,2-3 (comma-separated CPU ids and inclusive ranges;
    /// each CPU must be online, no duplicates). Default: all online CPUs. Conflicts with
    /// --cores. No env. TOML key: cpus (a string).
    #[arg(long, value_name = "LIST")]
    cpus: Option<String>,

    /// Pattern for bare destinations (no known prefix): events, queues, store, or none
    /// (= reject as invalid destination). Default events. Env CONNECTORS_STOMP_DEFAULT_PATTERN.
    /// TOML key: default_pattern.
    #[arg(long, value_name = "PATTERN")]
    default_pattern: Option<String>,

    /// Server heart-beat in milliseconds, advertised as sx=sy in CONNECTED; 0 disables
    /// heart-beating. Default 10000. Env CONNECTORS_STOMP_HEARTBEAT_MS. TOML key: heartbeat_ms.
    #[arg(long, value_name = "MS", allow_negative_numbers = true)]
    heartbeat_ms: Option<String>,

    /// Maximum concurrent STOMP connections; 0 = unlimited. Default 0.
    /// Env CONNECTORS_STOMP_MAX_CONNECTIONS. TOML key: max_connections.
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    max_connections: Option<String>,

    /// Maximum frame body size in bytes (larger → ERROR "frame too large"); must be > 0.
    /// Default 104857600 (100 MiB). Env CONNECTORS_STOMP_MAX_BODY_SIZE. TOML key: max_body_size.
    #[arg(long, value_name = "BYTES", allow_negative_numbers = true)]
    max_body_size: Option<String>,

    /// Per-subscription buffer: for queues the maximum unacknowledged messages (prefetch), for
    /// events the deliveries queued before new ones are dropped; must be >= 1. Default 100.
    /// Env CONNECTORS_STOMP_SUB_BUFF_SIZE. TOML key: sub_buff_size.
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    sub_buff_size: Option<String>,

    /// Seconds a queue message may stay unacknowledged before it is requeued; must be >= 1.
    /// Default 30. Env CONNECTORS_STOMP_QUEUE_ACK_TIMEOUT_SECONDS. TOML key: queue_ack_timeout_s.
    #[arg(long, value_name = "SECONDS", allow_negative_numbers = true)]
    queue_ack_timeout_s: Option<String>,

    /// Upper bound in seconds for a command/query reply (a request's `timeout` header, in ms,
    /// can only shorten it); must be >= 1. Default 30. Env CONNECTORS_STOMP_RPC_TIMEOUT_SECONDS.
    /// TOML key: rpc_timeout_s.
    #[arg(long, value_name = "SECONDS", allow_negative_numbers = true)]
    rpc_timeout_s: Option<String>,

    /// Maximum RPC requests in flight per connection (more → ERROR "too many pending requests");
    /// must be >= 1. Default 1024. Env CONNECTORS_STOMP_RPC_MAX_PENDING. TOML key: rpc_max_pending.
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    rpc_max_pending: Option<String>,

    /// KubeMQ gRPC array API listener (IP:PORT), for native KubeMQ SDK clients; `off` disables
    /// it. Serves all five patterns (service kubemq.kubemq) on the same channels STOMP clients
    /// use. Default 0.0.0.0:50000. No env. TOML key: grpc_addr.
    #[arg(long, value_name = "IP:PORT|off")]
    grpc_addr: Option<String>,

    /// Worker threads of the gRPC server's own runtime (kept off the STOMP cores); must be
    /// >= 1. Default 1. No env. TOML key: grpc_threads.
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    grpc_threads: Option<String>,

    /// PEM certificate chain for the gRPC listener: with --grpc-tls-key it serves TLS only
    /// (what `grpcs://` gateways and SDK clients with TLS dial). No env. TOML key: grpc_tls_cert.
    #[arg(long, value_name = "FILE")]
    grpc_tls_cert: Option<String>,

    /// PEM private key for --grpc-tls-cert. No env. TOML key: grpc_tls_key.
    #[arg(long, value_name = "FILE")]
    grpc_tls_key: Option<String>,

    /// Require this token as `authorization` metadata on every gRPC call (what --array-token
    /// and the SDKs' auth token send); others get UNAUTHENTICATED. A shared secret compared as
    /// is, not a JWT. Env STOMPGATE_GRPC_TOKEN (preferred: a flag shows in `ps`). TOML key:
    /// grpc_token.
    #[arg(long, value_name = "TOKEN")]
    grpc_token: Option<String>,

    /// Where the array lives: `embedded` (in this process, the default) or a remote KubeMQ
    /// array, `grpc://HOST:PORT` or `grpcs://HOST:PORT` (TLS). In remote mode each core keeps
    /// its own gRPC connection on a dedicated egress thread and the gateway holds no channel
    /// state. No env. TOML key: array.
    #[arg(long, value_name = "embedded|grpc://HOST:PORT|grpcs://HOST:PORT")]
    array: Option<String>,

    /// PEM file of the CA that signs the remote array's certificate (`grpcs://` only; default:
    /// the standard web roots). No env. TOML key: array_ca_file.
    #[arg(long, value_name = "FILE")]
    array_ca_file: Option<String>,

    /// Auth token for the remote array, sent as KubeMQ's `authorization` metadata on every call.
    /// Env STOMPGATE_ARRAY_TOKEN (preferred: a flag shows in `ps`). TOML key: array_token.
    #[arg(long, value_name = "TOKEN")]
    array_token: Option<String>,

    /// Serve Prometheus metrics at http://IP:PORT/metrics: per-core connections, frames,
    /// deliveries and drops, and in remote-array mode each core's egress streams (wanted,
    /// connected, reconnects, unconfirmed, failed). `off` (the default) serves none. No env.
    /// TOML key: metrics_addr.
    #[arg(long, value_name = "IP:PORT|off")]
    metrics_addr: Option<String>,

    /// TOML file with any of the settings above; keys are the flag names with '-' → '_'
    /// (e.g. stomp_addr = "127.0.0.1:61613", cores = 2, cpus = "0,1", default_pattern = "queues",
    /// heartbeat_ms = 5000). Unknown keys are an error. Flags and env override the file.
    #[arg(long, value_name = "FILE")]
    config: Option<String>,
}

/// Where a raw value came from; its `Display` names the setting as the user wrote it.
#[derive(Clone, Copy, Debug)]
enum Source<'a> {
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
enum Raw<'a> {
    Text(String),
    Toml(&'a toml::Value),
}

fn invalid(source: Source<'_>, reason: impl Display) -> String {
    format!("invalid {source}: {reason}")
}

/// The parsed `--config` file: its path (for messages) and its top-level table.
struct File {
    path: String,
    table: toml::Table,
}

impl File {
    fn load(path: &str) -> Result<File, String> {
        let text = std::fs::read_to_string(Path::new(path))
            .map_err(|e| format!("cannot read config file {path}: {e}"))?;
        let table: toml::Table = text.parse().map_err(|e: toml::de::Error| {
            let line = e
                .span()
                .map(|s| text[..s.start.min(text.len())].matches('\n').count() + 1);
            let msg = e.message().trim().replace('\n', " ");
            match line {
                Some(line) => format!("invalid config file {path}: line {line}: {msg}"),
                None => format!("invalid config file {path}: {msg}"),
            }
        })?;
        if let Some(key) = table.keys().find(|k| !TOML_KEYS.contains(&k.as_str())) {
            return Err(format!(
                "invalid config file {path}: unknown key `{key}` (known keys: {})",
                TOML_KEYS.join(", ")
            ));
        }
        Ok(File {
            path: path.to_owned(),
            table,
        })
    }

    fn get(&self, key: &'static str) -> Option<(Raw<'_>, Source<'_>)> {
        self.table.get(key).map(|v| {
            (
                Raw::Toml(v),
                Source::File {
                    key,
                    path: &self.path,
                },
            )
        })
    }
}

/// The lookup state for one resolution: command line, env lookup, optional file.
struct Sources<'a, F> {
    cli: &'a Cli,
    env: F,
    file: Option<&'a File>,
}

impl<'a, F: Fn(&str) -> Option<String>> Sources<'a, F> {
    fn env(&self, name: &'static str) -> Option<(Raw<'a>, Source<'a>)> {
        (self.env)(name)
            .filter(|v| !v.is_empty())
            .map(|v| (Raw::Text(v), Source::Env(name)))
    }

    /// The highest-precedence raw value of one setting: flag > env > file.
    fn pick(
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

/// A non-negative whole number from text or a TOML integer, with `min` as its lower bound.
fn parse_uint<T>(raw: &Raw<'_>, source: Source<'_>, min: u64) -> Result<T, String>
where
    T: TryFrom<u64>,
{
    let n: u64 = match raw {
        Raw::Text(s) => s
            .trim()
            .parse::<u64>()
            .map_err(|_| invalid(source, format!("{s:?} is not a non-negative whole number")))?,
        Raw::Toml(toml::Value::Integer(i)) => {
            u64::try_from(*i).map_err(|_| invalid(source, format!("{i} is negative")))?
        }
        Raw::Toml(other) => {
            return Err(invalid(
                source,
                format!("expected an integer, found a {}", other.type_str()),
            ))
        }
    };
    if n < min {
        return Err(invalid(source, format!("must be at least {min}")));
    }
    T::try_from(n).map_err(|_| invalid(source, format!("{n} is too large")))
}

fn text<'r>(raw: &'r Raw<'_>, source: Source<'_>) -> Result<&'r str, String> {
    match raw {
        Raw::Text(s) => Ok(s),
        Raw::Toml(toml::Value::String(s)) => Ok(s),
        Raw::Toml(other) => Err(invalid(
            source,
            format!("expected a string, found a {}", other.type_str()),
        )),
    }
}

fn parse_port(s: &str, source: Source<'_>) -> Result<u16, String> {
    match s.trim().parse::<u16>() {
        Ok(0) | Err(_) => Err(invalid(source, format!("{s:?} is not a port (1-65535)"))),
        Ok(p) => Ok(p),
    }
}

fn parse_addr(s: &str, source: Source<'_>) -> Result<SocketAddr, String> {
    let addr: SocketAddr = s.trim().parse().map_err(|_| {
        invalid(
            source,
            format!("{s:?} is not IP:PORT (e.g. 0.0.0.0:61613 or [::]:61613)"),
        )
    })?;
    if addr.port() == 0 {
        return Err(invalid(source, "port must be 1-65535"));
    }
    Ok(addr)
}

/// `events` | `queues` | `store` | `none` (exact, lower case). Kept here because
/// `DefaultPattern` lives in the router, which has no business knowing about configuration.
pub fn parse_default_pattern(s: &str) -> Option<DefaultPattern> {
    match s.trim() {
        "events" => Some(DefaultPattern::Events),
        "queues" => Some(DefaultPattern::Queues),
        "store" => Some(DefaultPattern::Store),
        "none" => Some(DefaultPattern::None),
        _ => None,
    }
}

/// Parses a CPU list such as `0,2-3` into `[0, 2, 3]` (order as written). Every CPU must be in
/// `online`; an empty item, a reversed range (`3-2`) or a repeated CPU is an error. `Err` is the
/// reason, without the setting's name.
pub fn parse_cpu_list(s: &str, online: &[usize]) -> Result<Vec<usize>, String> {
    let mut cpus: Vec<usize> = Vec::new();
    if s.trim().is_empty() {
        return Err("empty CPU list".into());
    }
    for item in s.split(',') {
        let item = item.trim();
        let num = |t: &str| -> Result<usize, String> {
            t.trim()
                .parse::<usize>()
                .map_err(|_| format!("{item:?} is not a CPU id or range (e.g. 0,2-3)"))
        };
        let (lo, hi) = match item.split_once('-') {
            Some((a, b)) => (num(a)?, num(b)?),
            None => {
                let n = num(item)?;
                (n, n)
            }
        };
        if lo > hi {
            return Err(format!("reversed range {item:?}"));
        }
        for cpu in lo..=hi {
            if !online.contains(&cpu) {
                return Err(format!(
                    "CPU {cpu} is not online (online: {})",
                    format_cpu_list(online)
                ));
            }
            if cpus.contains(&cpu) {
                return Err(format!("CPU {cpu} is listed twice"));
            }
            cpus.push(cpu);
        }
    }
    Ok(cpus)
}

/// `[0, 1, 2, 5]` → `0-2,5` (for messages).
fn format_cpu_list(cpus: &[usize]) -> String {
    let mut sorted = cpus.to_vec();
    sorted.sort_unstable();
    let mut out: Vec<String> = Vec::new();
    let mut i = 0;
    while i < sorted.len() {
        let start = sorted[i];
        let mut end = start;
        while i + 1 < sorted.len() && sorted[i + 1] == end + 1 {
            i += 1;
            end = sorted[i];
        }
        out.push(if start == end {
            start.to_string()
        } else {
            format!("{start}-{end}")
        });
        i += 1;
    }
    out.join(",")
}

/// The CPUs this process may run on (its affinity mask), ascending. `Err` when the OS cannot
/// tell us, which leaves nothing to pin executors to.
pub fn online_cpus() -> Result<Vec<usize>, String> {
    let mut ids: Vec<usize> = core_affinity::get_core_ids()
        .unwrap_or_default()
        .into_iter()
        .map(|c| c.id)
        .collect();
    ids.sort_unstable();
    ids.dedup();
    if ids.is_empty() {
        return Err("cannot list the online CPUs (sched_getaffinity failed)".into());
    }
    Ok(ids)
}

/// clap's rendered error is several lines (message, tip, usage); keep the first.
fn one_line(e: &clap::Error) -> String {
    let rendered = e.render().to_string();
    let first = rendered
        .lines()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .unwrap_or("invalid arguments");
    first.strip_prefix("error: ").unwrap_or(first).to_owned()
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

    fn resolve<F: Fn(&str) -> Option<String>>(
        cli: &Cli,
        env: F,
        online: &[usize],
    ) -> Result<Config, String> {
        if online.is_empty() {
            return Err("cannot list the online CPUs".into());
        }
        let file = cli.config.as_deref().map(File::load).transpose()?;
        let src = Sources {
            cli,
            env,
            file: file.as_ref(),
        };
        let d = Config::default();

        // TLS is not implemented: the value is only checked, so a typo is still caught.
        if let Some((raw, source)) = src.env(env::STOMP_TLS_PORT) {
            parse_port(text(&raw, source)?, source)?;
        }

        let stomp_addr = Self::resolve_addr(&src, d.stomp_addr)?;
        let cpus = Self::resolve_cpus(&src, online)?;

        let default_pattern = match src.pick(
            "default-pattern",
            &cli.default_pattern,
            Some(env::DEFAULT_PATTERN),
            "default_pattern",
        ) {
            None => d.default_pattern,
            Some((raw, source)) => {
                let s = text(&raw, source)?;
                parse_default_pattern(s).ok_or_else(|| {
                    invalid(
                        source,
                        format!("{s:?} is not one of events, queues, store, none"),
                    )
                })?
            }
        };

        macro_rules! uint {
            ($field:ident, $flag:literal, $env:expr, $min:expr) => {
                match src.pick($flag, &cli.$field, $env, stringify!($field)) {
                    None => d.$field,
                    Some((raw, source)) => parse_uint(&raw, source, $min)?,
                }
            };
        }

        Ok(Config {
            stomp_addr,
            cpus,
            default_pattern,
            heartbeat_ms: uint!(heartbeat_ms, "heartbeat-ms", Some(env::HEARTBEAT_MS), 0),
            max_connections: uint!(
                max_connections,
                "max-connections",
                Some(env::MAX_CONNECTIONS),
                0
            ),
            max_body_size: uint!(max_body_size, "max-body-size", Some(env::MAX_BODY_SIZE), 1),
            sub_buff_size: uint!(sub_buff_size, "sub-buff-size", Some(env::SUB_BUFF_SIZE), 1),
            queue_ack_timeout_s: uint!(
                queue_ack_timeout_s,
                "queue-ack-timeout-s",
                Some(env::QUEUE_ACK_TIMEOUT_SECONDS),
                1
            ),
            rpc_timeout_s: uint!(
                rpc_timeout_s,
                "rpc-timeout-s",
                Some(env::RPC_TIMEOUT_SECONDS),
                1
            ),
            rpc_max_pending: uint!(
                rpc_max_pending,
                "rpc-max-pending",
                Some(env::RPC_MAX_PENDING),
                1
            ),
            grpc_addr: match src.pick("grpc-addr", &cli.grpc_addr, None, "grpc_addr") {
                None => d.grpc_addr,
                Some((raw, source)) => match text(&raw, source)? {
                    "off" => None,
                    addr => Some(parse_addr(addr, source)?),
                },
            },
            grpc_threads: uint!(grpc_threads, "grpc-threads", None, 1),
            grpc_tls: Self::resolve_grpc_tls(&src)?,
            grpc_token: match src.pick("grpc-token", &cli.grpc_token, Some(env::GRPC_TOKEN), "grpc_token") {
                Some((raw, source)) => Some(text(&raw, source)?.to_string()),
                None => None,
            },
            array: Self::resolve_array(&src)?,
            metrics_addr: match src.pick("metrics-addr", &cli.metrics_addr, None, "metrics_addr") {
                None => None,
                Some((raw, source)) => match text(&raw, source)? {
                    "off" => None,
                    addr => Some(parse_addr(addr, source)?),
                },
            },
            mesh_ring: Config::default().mesh_ring,
        })
    }

    /// `--grpc-tls-cert` and `--grpc-tls-key`: both or neither, each a readable file.
    fn resolve_grpc_tls<F: Fn(&str) -> Option<String>>(src: &Sources<'_, F>) -> Result<Option<ServerTls>, String> {
        let cli = src.cli;
        let file = |name: &'static str, raw: &Option<String>, key: &'static str| -> Result<Option<(std::path::PathBuf, String)>, String> {
            let Some((raw, source)) = src.pick(name, raw, None, key) else { return Ok(None) };
            let path = text(&raw, source)?.to_string();
            if !Path::new(&path).is_file() {
                return Err(format!("invalid {source}: {path} is not a readable file"));
            }
            Ok(Some((path.into(), source.to_string())))
        };
        let cert = file("grpc-tls-cert", &cli.grpc_tls_cert, "grpc_tls_cert")?;
        let key = file("grpc-tls-key", &cli.grpc_tls_key, "grpc_tls_key")?;
        match (cert, key) {
            (Some((cert_file, _)), Some((key_file, _))) => Ok(Some(ServerTls { cert_file, key_file })),
            (None, None) => Ok(None),
            (Some((_, source)), None) => Err(format!("invalid {source}: needs --grpc-tls-key too")),
            (None, Some((_, source))) => Err(format!("invalid {source}: needs --grpc-tls-cert too")),
        }
    }

    /// `--array` with its CA file and token. The CA file and token are errors without a remote
    /// array (they would silently do nothing); a CA file needs `grpcs://`.
    fn resolve_array<F: Fn(&str) -> Option<String>>(src: &Sources<'_, F>) -> Result<ArrayMode, String> {
        let cli = src.cli;
        let ca = match src.pick("array-ca-file", &cli.array_ca_file, None, "array_ca_file") {
            Some((raw, source)) => Some((text(&raw, source)?.to_string(), source.to_string())),
            None => None,
        };
        let token = match src.pick("array-token", &cli.array_token, Some(env::ARRAY_TOKEN), "array_token") {
            Some((raw, source)) => Some((text(&raw, source)?.to_string(), source.to_string())),
            None => None,
        };
        let (value, source) = match src.pick("array", &cli.array, None, "array") {
            Some((raw, source)) => (text(&raw, source)?.to_string(), source),
            None => ("embedded".to_string(), Source::Flag("array")),
        };
        let remote = |tls: bool, authority: &str| -> Result<ArrayMode, String> {
            let (host, port) = authority.rsplit_once(':').ok_or_else(|| invalid(source, format!("{value:?} needs HOST:PORT")))?;
            if host.is_empty() || port.parse::<u16>().map_or(true, |p| p == 0) {
                return Err(invalid(source, format!("{value:?} needs HOST:PORT with a port 1-65535")));
            }
            if let Some((_, ca_source)) = ca.as_ref().filter(|_| !tls) {
                return Err(format!("invalid {ca_source}: a CA file needs a grpcs:// array"));
            }
            if let Some((path, ca_source)) = &ca {
                if !Path::new(path).is_file() {
                    return Err(format!("invalid {ca_source}: {path} is not a readable file"));
                }
            }
            Ok(ArrayMode::Remote(RemoteArray {
                authority: authority.to_string(),
                tls,
                ca_file: ca.as_ref().map(|(p, _)| p.into()),
                token: token.as_ref().map(|(t, _)| t.clone()),
            }))
        };
        match value.as_str() {
            "embedded" => {
                if let Some((_, s)) = ca.as_ref().or(token.as_ref()) {
                    return Err(format!("invalid {s}: only used with a remote array (--array grpc://HOST:PORT)"));
                }
                Ok(ArrayMode::Embedded)
            }
            v => match (v.strip_prefix("grpc://"), v.strip_prefix("grpcs://")) {
                (Some(a), _) => remote(false, a),
                (_, Some(a)) => remote(true, a),
                _ => Err(invalid(source, format!("{value:?} is not embedded, grpc://HOST:PORT or grpcs://HOST:PORT"))),
            },
        }
    }

    /// `--stomp-addr` > `CONNECTORS_STOMP_PORT` (port only; host from the file's `stomp_addr`,
    /// else 0.0.0.0) > file `stomp_addr` > default.
    fn resolve_addr<F: Fn(&str) -> Option<String>>(
        src: &Sources<'_, F>,
        default: SocketAddr,
    ) -> Result<SocketAddr, String> {
        if let Some(s) = &src.cli.stomp_addr {
            return parse_addr(s, Source::Flag("stomp-addr"));
        }
        let from_file = match src.file.and_then(|f| f.get("stomp_addr")) {
            Some((raw, source)) => Some(parse_addr(text(&raw, source)?, source)?),
            None => None,
        };
        if let Some((raw, source)) = src.env(env::STOMP_PORT) {
            let port = parse_port(text(&raw, source)?, source)?;
            let ip = from_file.map_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED), |a| a.ip());
            return Ok(SocketAddr::new(ip, port));
        }
        Ok(from_file.unwrap_or(default))
    }

    /// The CPU plan from the highest source that has one: flags (`--cores`/`--cpus`, exclusive
    /// by clap), else the file (`cores`/`cpus`, also exclusive), else all online CPUs.
    fn resolve_cpus<F: Fn(&str) -> Option<String>>(
        src: &Sources<'_, F>,
        online: &[usize],
    ) -> Result<Vec<usize>, String> {
        let cores = |raw: Raw<'_>, source: Source<'_>| -> Result<Vec<usize>, String> {
            let n: usize = parse_uint(&raw, source, 1)?;
            if n > online.len() {
                return Err(invalid(
                    source,
                    format!(
                        "{n} cores requested but only {} CPUs are online",
                        online.len()
                    ),
                ));
            }
            Ok(online[..n].to_vec())
        };
        let cpus = |raw: Raw<'_>, source: Source<'_>| -> Result<Vec<usize>, String> {
            parse_cpu_list(text(&raw, source)?, online).map_err(|reason| invalid(source, reason))
        };
        if let Some(v) = &src.cli.cores {
            return cores(Raw::Text(v.clone()), Source::Flag("cores"));
        }
        if let Some(v) = &src.cli.cpus {
            return cpus(Raw::Text(v.clone()), Source::Flag("cpus"));
        }
        if let Some(file) = src.file {
            match (file.get("cores"), file.get("cpus")) {
                (Some(_), Some(_)) => {
                    return Err(format!(
                        "invalid config file {}: cores and cpus are mutually exclusive",
                        file.path
                    ))
                }
                (Some((raw, source)), None) => return cores(raw, source),
                (None, Some((raw, source))) => return cpus(raw, source),
                (None, None) => {}
            }
        }
        Ok(online.to_vec())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;
    use std::sync::atomic::{AtomicUsize, Ordering};

    const ONLINE: [usize; 4] = [0, 1, 2, 3];

    fn parse_env(args: &[&str], env: &[(&str, &str)]) -> Result<Config, String> {
        let env: HashMap<String, String> = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let argv = std::iter::once("stompgate").chain(args.iter().copied());
        Config::parse_with(argv, |k| env.get(k).cloned(), &ONLINE)
    }

    fn parse(args: &[&str]) -> Result<Config, String> {
        parse_env(args, &[])
    }

    fn err(args: &[&str], env: &[(&str, &str)]) -> String {
        let e = parse_env(args, env).expect_err("expected an error");
        assert!(!e.contains('\n'), "error must be one line: {e:?}");
        e
    }

    /// A TOML file under the temp dir, removed on drop.
    struct TempToml(std::path::PathBuf);
    impl TempToml {
        fn new(contents: &str) -> TempToml {
            static N: AtomicUsize = AtomicUsize::new(0);
            let path = std::env::temp_dir().join(format!(
                "stompgate-config-test-{}-{}.toml",
                std::process::id(),
                N.fetch_add(1, Ordering::Relaxed)
            ));
            std::fs::write(&path, contents).unwrap();
            TempToml(path)
        }
        fn path(&self) -> &str {
            self.0.to_str().unwrap()
        }
    }
    impl Drop for TempToml {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }

    #[test]
    fn defaults() {
        let c = parse(&[]).unwrap();
        assert_eq!(
            c,
            Config {
                cpus: ONLINE.to_vec(),
                ..Config::default()
            }
        );
        assert_eq!(c.stomp_addr, "0.0.0.0:61613".parse().unwrap());
        assert_eq!(c.default_pattern, DefaultPattern::Events);
        assert_eq!(c.heartbeat_ms, 10_000);
        assert_eq!(c.max_connections, 0);
        assert_eq!(c.max_body_size, 104_857_600);
        assert_eq!(c.sub_buff_size, 100);
        assert_eq!(c.queue_ack_timeout_s, 30);
        assert_eq!(c.rpc_timeout_s, 30);
        assert_eq!(c.rpc_max_pending, 1024);
    }

    #[test]
    fn each_flag() {
        let c = parse(&["--stomp-addr", "127.0.0.1:7000"]).unwrap();
        assert_eq!(c.stomp_addr, "127.0.0.1:7000".parse().unwrap());
        let c = parse(&["--stomp-addr=[::1]:7001"]).unwrap();
        assert_eq!(c.stomp_addr, "[::1]:7001".parse().unwrap());
        assert_eq!(parse(&["--cores", "2"]).unwrap().cpus, vec![0, 1]);
        assert_eq!(parse(&["--cpus", "1,3"]).unwrap().cpus, vec![1, 3]);
        for (s, p) in [
            ("events", DefaultPattern::Events),
            ("queues", DefaultPattern::Queues),
            ("store", DefaultPattern::Store),
            ("none", DefaultPattern::None),
        ] {
            assert_eq!(parse(&["--default-pattern", s]).unwrap().default_pattern, p);
        }
        assert_eq!(parse(&["--heartbeat-ms", "0"]).unwrap().heartbeat_ms, 0);
        assert_eq!(
            parse(&["--heartbeat-ms", "2500"]).unwrap().heartbeat_ms,
            2500
        );
        assert_eq!(
            parse(&["--max-connections", "7"]).unwrap().max_connections,
            7
        );
        assert_eq!(parse(&["--max-body-size", "1"]).unwrap().max_body_size, 1);
        assert_eq!(parse(&["--sub-buff-size", "1"]).unwrap().sub_buff_size, 1);
        assert_eq!(
            parse(&["--queue-ack-timeout-s", "5"])
                .unwrap()
                .queue_ack_timeout_s,
            5
        );
        assert_eq!(parse(&["--rpc-timeout-s", "6"]).unwrap().rpc_timeout_s, 6);
        assert_eq!(
            parse(&["--rpc-max-pending", "8"]).unwrap().rpc_max_pending,
            8
        );
    }

    #[test]
    fn each_env_name() {
        let c = parse_env(
            &[],
            &[
                ("CONNECTORS_STOMP_PORT", "7002"),
                ("CONNECTORS_STOMP_TLS_PORT", "7003"),
                ("CONNECTORS_STOMP_DEFAULT_PATTERN", "store"),
                ("CONNECTORS_STOMP_HEARTBEAT_MS", "0"),
                ("CONNECTORS_STOMP_MAX_CONNECTIONS", "9"),
                ("CONNECTORS_STOMP_MAX_BODY_SIZE", "4096"),
                ("CONNECTORS_STOMP_SUB_BUFF_SIZE", "3"),
                ("CONNECTORS_STOMP_QUEUE_ACK_TIMEOUT_SECONDS", "4"),
                ("CONNECTORS_STOMP_RPC_TIMEOUT_SECONDS", "5"),
                ("CONNECTORS_STOMP_RPC_MAX_PENDING", "6"),
            ],
        )
        .unwrap();
        assert_eq!(
            c,
            Config {
                stomp_addr: "0.0.0.0:7002".parse().unwrap(),
                cpus: ONLINE.to_vec(),
                default_pattern: DefaultPattern::Store,
                heartbeat_ms: 0,
                max_connections: 9,
                max_body_size: 4096,
                sub_buff_size: 3,
                queue_ack_timeout_s: 4,
                rpc_timeout_s: 5,
                rpc_max_pending: 6,
                grpc_addr: Some("0.0.0.0:50000".parse().unwrap()),
                grpc_threads: 1,
                grpc_tls: None,
                grpc_token: None,
                array: ArrayMode::Embedded,
                metrics_addr: None,
                mesh_ring: 8192,
            }
        );
    }

    #[test]
    fn empty_env_counts_as_unset() {
        let c = parse_env(
            &[],
            &[
                ("CONNECTORS_STOMP_SUB_BUFF_SIZE", ""),
                ("CONNECTORS_STOMP_PORT", ""),
            ],
        )
        .unwrap();
        assert_eq!(c.sub_buff_size, 100);
        assert_eq!(c.stomp_addr, "0.0.0.0:61613".parse().unwrap());
    }

    #[test]
    fn toml_file_sets_every_key() {
        let f = TempToml::new(
            r#"
stomp_addr = "127.0.0.1:7100"
cpus = "0,2-3"
default_pattern = "queues"
heartbeat_ms = 5000
max_connections = 10
max_body_size = 2048
sub_buff_size = 11
queue_ack_timeout_s = 12
rpc_timeout_s = 13
rpc_max_pending = 14
grpc_addr = "127.0.0.1:7101"
grpc_threads = 2
grpc_token = "s3cret"
metrics_addr = "127.0.0.1:9100"
"#,
        );
        let c = parse(&["--config", f.path()]).unwrap();
        assert_eq!(
            c,
            Config {
                stomp_addr: "127.0.0.1:7100".parse().unwrap(),
                cpus: vec![0, 2, 3],
                default_pattern: DefaultPattern::Queues,
                heartbeat_ms: 5000,
                max_connections: 10,
                max_body_size: 2048,
                sub_buff_size: 11,
                queue_ack_timeout_s: 12,
                rpc_timeout_s: 13,
                rpc_max_pending: 14,
                grpc_addr: Some("127.0.0.1:7101".parse().unwrap()),
                grpc_threads: 2,
                grpc_tls: None,
                grpc_token: Some("s3cret".into()),
                array: ArrayMode::Embedded,
                metrics_addr: Some("127.0.0.1:9100".parse().unwrap()),
                mesh_ring: 8192,
            }
        );
        let g = TempToml::new("cores = 3\n");
        assert_eq!(parse(&["--config", g.path()]).unwrap().cpus, vec![0, 1, 2]);
        let empty = TempToml::new("");
        assert_eq!(
            parse(&["--config", empty.path()]).unwrap(),
            parse(&[]).unwrap()
        );
    }

    #[test]
    fn precedence_flag_over_env_over_file_over_default() {
        let f = TempToml::new("sub_buff_size = 3\nrpc_max_pending = 30\nheartbeat_ms = 300\nstomp_addr = \"127.0.0.1:7200\"\ndefault_pattern = \"store\"\n");
        let env = [
            ("CONNECTORS_STOMP_SUB_BUFF_SIZE", "2"),
            ("CONNECTORS_STOMP_RPC_MAX_PENDING", "20"),
            ("CONNECTORS_STOMP_DEFAULT_PATTERN", "queues"),
        ];
        let c = parse_env(
            &[
                "--config",
                f.path(),
                "--sub-buff-size",
                "1",
                "--default-pattern",
                "none",
            ],
            &env,
        )
        .unwrap();
        assert_eq!(c.sub_buff_size, 1, "flag beats env and file");
        assert_eq!(
            c.default_pattern,
            DefaultPattern::None,
            "flag beats env and file"
        );
        assert_eq!(c.rpc_max_pending, 20, "env beats file");
        assert_eq!(c.heartbeat_ms, 300, "file beats default");
        assert_eq!(c.max_body_size, 104_857_600, "default when nothing is set");
        assert_eq!(c.stomp_addr, "127.0.0.1:7200".parse().unwrap());

        // Env port replaces the file's port and keeps its host; the flag replaces both.
        let c = parse_env(
            &["--config", f.path()],
            &[("CONNECTORS_STOMP_PORT", "7300")],
        )
        .unwrap();
        assert_eq!(c.stomp_addr, "127.0.0.1:7300".parse().unwrap());
        let c = parse_env(
            &["--config", f.path(), "--stomp-addr", "[::]:7400"],
            &[("CONNECTORS_STOMP_PORT", "7300")],
        )
        .unwrap();
        assert_eq!(c.stomp_addr, "[::]:7400".parse().unwrap());

        // An explicit flag wins even when the lower sources hold a bad value.
        let c = parse_env(
            &["--sub-buff-size", "5"],
            &[("CONNECTORS_STOMP_SUB_BUFF_SIZE", "zero")],
        )
        .unwrap();
        assert_eq!(c.sub_buff_size, 5);

        // CPU plan: a flag overrides the file's plan of the other kind.
        let g = TempToml::new("cpus = \"3\"\n");
        assert_eq!(
            parse(&["--config", g.path(), "--cores", "2"]).unwrap().cpus,
            vec![0, 1]
        );
        assert_eq!(parse(&["--config", g.path()]).unwrap().cpus, vec![3]);
    }

    #[test]
    fn bad_values_are_rejected_with_the_setting_and_source() {
        assert_eq!(
            err(&["--sub-buff-size", "0"], &[]),
            "invalid --sub-buff-size: must be at least 1"
        );
        assert_eq!(
            err(&[], &[("CONNECTORS_STOMP_SUB_BUFF_SIZE", "0")]),
            "invalid CONNECTORS_STOMP_SUB_BUFF_SIZE: must be at least 1"
        );
        assert_eq!(
            err(&["--max-body-size", "0"], &[]),
            "invalid --max-body-size: must be at least 1"
        );
        assert_eq!(
            err(&["--queue-ack-timeout-s", "0"], &[]),
            "invalid --queue-ack-timeout-s: must be at least 1"
        );
        assert_eq!(
            err(&["--rpc-timeout-s", "0"], &[]),
            "invalid --rpc-timeout-s: must be at least 1"
        );
        assert_eq!(
            err(&["--rpc-max-pending", "0"], &[]),
            "invalid --rpc-max-pending: must be at least 1"
        );
        assert!(err(&["--heartbeat-ms", "-1"], &[]).starts_with("invalid --heartbeat-ms: "));
        assert!(err(&["--max-connections", "lots"], &[]).starts_with("invalid --max-connections: "));
        assert!(err(&["--heartbeat-ms", "99999999999999999999999"], &[])
            .starts_with("invalid --heartbeat-ms: "));
        assert!(err(&["--default-pattern", "commands"], &[])
            .starts_with("invalid --default-pattern: \"commands\""));
        assert!(
            err(&["--default-pattern", "Events"], &[]).starts_with("invalid --default-pattern: ")
        );
        assert!(err(&[], &[("CONNECTORS_STOMP_DEFAULT_PATTERN", "all")])
            .starts_with("invalid CONNECTORS_STOMP_DEFAULT_PATTERN: "));
        for bad in [
            "61613",
            "localhost:61613",
            "0.0.0.0:0",
            "0.0.0.0:70000",
            "1.2.3.4",
        ] {
            assert!(
                err(&["--stomp-addr", bad], &[]).starts_with("invalid --stomp-addr: "),
                "{bad}"
            );
        }
        for bad in ["0", "65536", "-1", "http"] {
            assert!(
                err(&[], &[("CONNECTORS_STOMP_PORT", bad)])
                    .starts_with("invalid CONNECTORS_STOMP_PORT: "),
                "{bad}"
            );
            assert!(
                err(&[], &[("CONNECTORS_STOMP_TLS_PORT", bad)])
                    .starts_with("invalid CONNECTORS_STOMP_TLS_PORT: "),
                "{bad}"
            );
        }
        for e in [
            "CONNECTORS_STOMP_HEARTBEAT_MS",
            "CONNECTORS_STOMP_MAX_CONNECTIONS",
            "CONNECTORS_STOMP_MAX_BODY_SIZE",
            "CONNECTORS_STOMP_QUEUE_ACK_TIMEOUT_SECONDS",
            "CONNECTORS_STOMP_RPC_TIMEOUT_SECONDS",
            "CONNECTORS_STOMP_RPC_MAX_PENDING",
        ] {
            assert!(
                err(&[], &[(e, "x")]).starts_with(&format!("invalid {e}: ")),
                "{e}"
            );
        }
        // Command-line errors from clap are one line too.
        assert!(err(&["--no-such-flag"], &[]).contains("--no-such-flag"));
        assert!(err(&["--cores", "2", "--cpus", "0"], &[]).contains("cannot be used with"));
        assert!(!err(&["--sub-buff-size"], &[]).is_empty());
    }

    #[test]
    fn bad_config_files_are_rejected() {
        let e = err(&["--config", "/nonexistent/stompgate.toml"], &[]);
        assert!(
            e.starts_with("cannot read config file /nonexistent/stompgate.toml: "),
            "{e}"
        );

        let f = TempToml::new("sub_buff_size = \n");
        let e = err(&["--config", f.path()], &[]);
        assert!(
            e.starts_with(&format!("invalid config file {}: line 1: ", f.path())),
            "{e}"
        );

        let f = TempToml::new("sub_buff_size = 1\nsubbuffsize = 2\n");
        let e = err(&["--config", f.path()], &[]);
        assert!(
            e.starts_with(&format!(
                "invalid config file {}: unknown key `subbuffsize`",
                f.path()
            )),
            "{e}"
        );

        let f = TempToml::new("config = \"x.toml\"\n");
        assert!(err(&["--config", f.path()], &[]).contains("unknown key `config`"));

        let f = TempToml::new("sub_buff_size = 0\n");
        assert_eq!(
            err(&["--config", f.path()], &[]),
            format!("invalid sub_buff_size in {}: must be at least 1", f.path())
        );

        let f = TempToml::new("heartbeat_ms = \"5000\"\n");
        assert_eq!(
            err(&["--config", f.path()], &[]),
            format!(
                "invalid heartbeat_ms in {}: expected an integer, found a string",
                f.path()
            )
        );

        let f = TempToml::new("max_connections = -1\n");
        assert!(err(&["--config", f.path()], &[])
            .starts_with(&format!("invalid max_connections in {}: ", f.path())));

        let f = TempToml::new("default_pattern = 1\n");
        assert!(err(&["--config", f.path()], &[])
            .starts_with(&format!("invalid default_pattern in {}: ", f.path())));

        let f = TempToml::new("stomp_addr = \"nowhere\"\n");
        assert!(err(&["--config", f.path()], &[])
            .starts_with(&format!("invalid stomp_addr in {}: ", f.path())));

        let f = TempToml::new("cores = 2\ncpus = \"0\"\n");
        assert!(err(&["--config", f.path()], &[]).contains("mutually exclusive"));

        let f = TempToml::new("cores = 5\n");
        assert!(err(&["--config", f.path()], &[])
            .starts_with(&format!("invalid cores in {}: ", f.path())));

        let f = TempToml::new("cpus = \"0,9\"\n");
        assert!(err(&["--config", f.path()], &[]).starts_with(&format!(
            "invalid cpus in {}: CPU 9 is not online",
            f.path()
        )));
    }

    #[test]
    fn cpu_lists() {
        assert_eq!(parse_cpu_list("0,2-3", &ONLINE).unwrap(), vec![0, 2, 3]);
        assert_eq!(parse_cpu_list(" 3 , 0-1 ", &ONLINE).unwrap(), vec![3, 0, 1]);
        assert_eq!(parse_cpu_list("2-2", &ONLINE).unwrap(), vec![2]);
        assert_eq!(
            parse_cpu_list("0,0", &ONLINE).unwrap_err(),
            "CPU 0 is listed twice"
        );
        assert_eq!(
            parse_cpu_list("0-2,1", &ONLINE).unwrap_err(),
            "CPU 1 is listed twice"
        );
        assert_eq!(
            parse_cpu_list("3-2", &ONLINE).unwrap_err(),
            "reversed range \"3-2\""
        );
        assert_eq!(
            parse_cpu_list("0,4", &ONLINE).unwrap_err(),
            "CPU 4 is not online (online: 0-3)"
        );
        assert_eq!(
            parse_cpu_list("1", &[0, 2, 3, 5]).unwrap_err(),
            "CPU 1 is not online (online: 0,2-3,5)"
        );
        for bad in ["", " ", "0,", ",1", "a", "1-", "-1", "0-1-2", "1;2"] {
            assert!(parse_cpu_list(bad, &ONLINE).is_err(), "{bad:?}");
        }
        assert_eq!(
            err(&["--cpus", "0,0"], &[]),
            "invalid --cpus: CPU 0 is listed twice"
        );
        assert_eq!(
            err(&["--cpus", "3-2"], &[]),
            "invalid --cpus: reversed range \"3-2\""
        );
        assert_eq!(
            err(&["--cpus", "7"], &[]),
            "invalid --cpus: CPU 7 is not online (online: 0-3)"
        );
    }

    #[test]
    fn cores_must_fit_the_online_cpus() {
        assert_eq!(parse(&["--cores", "4"]).unwrap().cpus, ONLINE.to_vec());
        assert_eq!(parse(&["--cores", "1"]).unwrap().cpus, vec![0]);
        assert_eq!(
            err(&["--cores", "5"], &[]),
            "invalid --cores: 5 cores requested but only 4 CPUs are online"
        );
        assert_eq!(
            err(&["--cores", "0"], &[]),
            "invalid --cores: must be at least 1"
        );
        let sparse =
            Config::parse_with(["stompgate", "--cores", "2"], |_| None, &[1, 3, 5]).unwrap();
        assert_eq!(sparse.cpus, vec![1, 3]);
    }

    #[test]
    fn help_names_every_env_and_toml_key() {
        use clap::CommandFactory;
        let help = Cli::command().render_long_help().to_string();
        let help = help.split_whitespace().collect::<Vec<_>>().join(" ");
        for name in [
            env::STOMP_PORT,
            env::STOMP_TLS_PORT,
            env::DEFAULT_PATTERN,
            env::HEARTBEAT_MS,
            env::MAX_CONNECTIONS,
            env::MAX_BODY_SIZE,
            env::SUB_BUFF_SIZE,
            env::QUEUE_ACK_TIMEOUT_SECONDS,
            env::RPC_TIMEOUT_SECONDS,
            env::RPC_MAX_PENDING,
        ] {
            assert!(help.contains(name), "help lacks {name}");
        }
        for key in TOML_KEYS {
            assert!(
                help.contains(&format!("TOML key: {key}")),
                "help lacks TOML key {key}"
            );
        }
        Cli::command().debug_assert();
    }

    #[test]
    fn real_machine_has_online_cpus() {
        let online = online_cpus().unwrap();
        assert!(!online.is_empty());
        assert_eq!(
            Config::parse_from(["stompgate"], |_| None).unwrap().cpus,
            online
        );
    }

    #[test]
    fn grpc_listener_tls_needs_both_files_and_token_comes_from_env_or_flag() {
        let file = concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml");
        let c = parse(&["--grpc-tls-cert", file, "--grpc-tls-key", file]).unwrap();
        assert_eq!(c.grpc_tls, Some(ServerTls { cert_file: file.into(), key_file: file.into() }));
        assert_eq!(parse(&["--grpc-tls-cert", file]).unwrap_err(), "invalid --grpc-tls-cert: needs --grpc-tls-key too");
        assert_eq!(parse(&["--grpc-tls-key", file]).unwrap_err(), "invalid --grpc-tls-key: needs --grpc-tls-cert too");
        assert_eq!(parse(&["--grpc-tls-cert", "/nonexistent.pem", "--grpc-tls-key", file]).unwrap_err(), "invalid --grpc-tls-cert: /nonexistent.pem is not a readable file");
        assert_eq!(parse_env(&[], &[("STOMPGATE_GRPC_TOKEN", "t1")]).unwrap().grpc_token.as_deref(), Some("t1"));
        assert_eq!(parse_env(&["--grpc-token", "t2"], &[("STOMPGATE_GRPC_TOKEN", "t1")]).unwrap().grpc_token.as_deref(), Some("t2"));
        assert_eq!(parse(&[]).unwrap().grpc_token, None);
    }

    #[test]
    fn grpc_listener_can_move_or_be_switched_off() {
        assert_eq!(parse(&[]).unwrap().grpc_addr, Some("0.0.0.0:50000".parse().unwrap()));
        assert_eq!(parse(&["--grpc-addr", "127.0.0.1:50001"]).unwrap().grpc_addr, Some("127.0.0.1:50001".parse().unwrap()));
        assert_eq!(parse(&["--grpc-addr", "off"]).unwrap().grpc_addr, None);
        assert_eq!(parse(&[]).unwrap().metrics_addr, None);
        assert_eq!(parse(&["--metrics-addr", "127.0.0.1:9100"]).unwrap().metrics_addr, Some("127.0.0.1:9100".parse().unwrap()));
        assert_eq!(parse(&["--metrics-addr", "off"]).unwrap().metrics_addr, None);
        assert_eq!(parse(&["--grpc-threads", "3"]).unwrap().grpc_threads, 3);
    }

    #[test]
    fn array_mode() {
        assert_eq!(parse(&[]).unwrap().array, ArrayMode::Embedded);
        let remote = |tls, authority: &str, token: Option<&str>| {
            ArrayMode::Remote(RemoteArray { authority: authority.into(), tls, ca_file: None, token: token.map(Into::into) })
        };
        assert_eq!(parse(&["--array", "grpc://10.0.0.5:50000"]).unwrap().array, remote(false, "10.0.0.5:50000", None));
        assert_eq!(parse(&["--array", "grpcs://kubemq:50000", "--array-token", "jwt"]).unwrap().array, remote(true, "kubemq:50000", Some("jwt")));
        let ArrayMode::Remote(r) = parse(&["--array", "grpcs://h:1"]).unwrap().array else { panic!() };
        assert_eq!(r.uri(), "https://h:1");
        for bad in ["grpc://nohost", "grpc://h:0", "http://h:1", "grpc://:5"] {
            assert!(parse(&["--array", bad]).unwrap_err().starts_with("invalid --array:"), "{bad}");
        }
        assert_eq!(parse(&["--array-token", "t"]).unwrap_err(), "invalid --array-token: only used with a remote array (--array grpc://HOST:PORT)");
        assert_eq!(parse(&["--array", "grpc://h:1", "--array-ca-file", "/etc/hostname"]).unwrap_err(), "invalid --array-ca-file: a CA file needs a grpcs:// array");
        assert!(parse(&["--grpc-threads", "0"]).unwrap_err().contains("grpc-threads"));
        assert!(parse(&["--grpc-addr", "nowhere"]).unwrap_err().contains("grpc-addr"));
    }
}
