//! The field-by-field resolution of every setting from (flag, env, file, default), and the
//! settings that are resolved together (the gRPC listener's TLS pair, the array with its CA
//! file and token, the STOMP address with its env port).
use super::flags::Cli;
use super::sources::{env, File, Source, Sources};
use super::values::{invalid, parse_addr, parse_bool, parse_default_pattern, parse_port, parse_uint, text};
use super::{ArrayMode, Config, RemoteArray, ServerTls, StompTls, StoreConfig, StoreSync};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::Path;

impl Config {
    pub(super) fn resolve<F: Fn(&str) -> Option<String>>(cli: &Cli, env: F, online: &[usize]) -> Result<Config, String> {
        if online.is_empty() {
            return Err("cannot list the online CPUs".into());
        }
        let file = cli.config.as_deref().map(File::load).transpose()?;
        let src = Sources { cli, env, file: file.as_ref() };
        let d = Config::default();

        let (stomp_addr, stomp_plain) = match Self::resolve_addr(&src, "stomp-addr", &cli.stomp_addr, env::STOMP_PORT, "stomp_addr", d.stomp_addr)? {
            Some(addr) => (addr, true),
            None => (d.stomp_addr, false),
        };
        let stomp_tls_addr = Self::resolve_addr(&src, "stomp-tls-addr", &cli.stomp_tls_addr, env::STOMP_TLS_PORT, "stomp_tls_addr", d.stomp_tls_addr.unwrap())?;
        let stomp_tls = Self::resolve_stomp_tls(&src)?;
        let ws_addr = Self::resolve_ws_addr(&src, "ws-addr", &cli.ws_addr, env::WS_ADDR, "ws_addr", super::DEFAULT_WS_ADDR)?;
        let ws_tls_addr = Self::resolve_ws_addr(&src, "ws-tls-addr", &cli.ws_tls_addr, env::WS_TLS_ADDR, "ws_tls_addr", super::DEFAULT_WS_TLS_ADDR)?;
        let ws_path = match src.pick("ws-path", &cli.ws_path, Some(env::WS_PATH), "ws_path") {
            None => d.ws_path.clone(),
            Some((raw, source)) => {
                let p = text(&raw, source)?.trim();
                if !p.starts_with('/') || p.contains(['?', '#', ' ']) {
                    return Err(invalid(source, format!("{p:?} is not an absolute path (e.g. /ws)")));
                }
                p.to_string()
            }
        };
        let ws_allowed_origins = match src.pick("ws-allowed-origins", &cli.ws_allowed_origins, Some(env::WS_ALLOWED_ORIGINS), "ws_allowed_origins") {
            None => Vec::new(),
            Some((raw, source)) => {
                let list: Vec<String> = text(&raw, source)?.split(',').map(|o| o.trim().trim_end_matches('/').to_ascii_lowercase()).collect();
                if list.iter().any(String::is_empty) {
                    return Err(invalid(source, "an empty origin in the list (expected e.g. https://app.example.com,http://localhost:8080)"));
                }
                if list.iter().any(|o| o == "*") {
                    Vec::new()
                } else {
                    list
                }
            }
        };
        let amqp_enabled = match src.pick("amqp-enable", &cli.amqp_enable, Some(env::AMQP10_ENABLE), "amqp_enable") {
            None => true,
            Some((raw, source)) => parse_bool(&raw, source)?,
        };
        let (amqp_addr, amqp_tls_addr) = if amqp_enabled {
            (
                Self::resolve_addr(&src, "amqp-addr", &cli.amqp_addr, env::AMQP10_PORT, "amqp_addr", super::DEFAULT_AMQP_ADDR)?,
                Self::resolve_addr(&src, "amqp-tls-addr", &cli.amqp_tls_addr, env::AMQP10_TLS_PORT, "amqp_tls_addr", super::DEFAULT_AMQP_TLS_ADDR)?,
            )
        } else {
            (None, None)
        };
        let amqp_default_pattern = match src.pick("amqp-default-pattern", &cli.amqp_default_pattern, Some(env::AMQP10_DEFAULT_PATTERN), "amqp_default_pattern")
        {
            None => d.amqp_default_pattern,
            Some((raw, source)) => {
                let s = text(&raw, source)?;
                crate::model::Pattern::from_amqp_setting(s)
                    .ok_or_else(|| invalid(source, format!("{s:?} is not one of queues, events, events-store, commands, queries")))?
            }
        };
        let cpus = Self::resolve_cpus(&src, online)?;
        let array = Self::resolve_array(&src)?;

        let default_pattern = match src.pick("default-pattern", &cli.default_pattern, Some(env::DEFAULT_PATTERN), "default_pattern") {
            None => d.default_pattern,
            Some((raw, source)) => {
                let s = text(&raw, source)?;
                parse_default_pattern(s).ok_or_else(|| invalid(source, format!("{s:?} is not one of events, queues, store, none")))?
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
            stomp_plain,
            stomp_tls_addr,
            stomp_tls,
            ws_addr,
            ws_tls_addr,
            ws_path,
            ws_allowed_origins,
            amqp_addr,
            amqp_max_frame_size: uint!(amqp_max_frame_size, "amqp-max-frame-size", Some(env::AMQP10_MAX_FRAME_SIZE), 512),
            amqp_max_message_size: uint!(amqp_max_message_size, "amqp-max-message-size", Some(env::AMQP10_MAX_MESSAGE_SIZE), 1),
            amqp_tls_addr,
            amqp_session_max: uint!(amqp_session_max, "amqp-session-max", Some(env::AMQP10_SESSION_MAX), 1),
            amqp_max_links_per_session: uint!(amqp_max_links_per_session, "amqp-max-links-per-session", Some(env::AMQP10_MAX_LINKS_PER_SESSION), 1),
            amqp_max_connections: uint!(amqp_max_connections, "amqp-max-connections", Some(env::AMQP10_MAX_CONNECTIONS), 0),
            amqp_idle_timeout_s: uint!(amqp_idle_timeout_s, "amqp-idle-timeout-s", Some(env::AMQP10_IDLE_TIMEOUT_SECONDS), 0),
            amqp_default_pattern,
            amqp_get_batch_size: match src.pick("amqp-get-batch-size", &cli.amqp_get_batch_size, Some(env::AMQP10_GET_BATCH_SIZE), "amqp_get_batch_size") {
                None => d.amqp_get_batch_size,
                Some((raw, source)) => match parse_uint(&raw, source, 1)? {
                    n if n > 1024 => return Err(invalid(source, "must be at most 1024")),
                    n => n,
                },
            },
            amqp_max_unsettled_per_link: uint!(amqp_max_unsettled_per_link, "amqp-max-unsettled-per-link", Some(env::AMQP10_MAX_UNSETTLED_PER_LINK), 1),
            amqp_rpc_timeout_s: uint!(amqp_rpc_timeout_s, "amqp-rpc-timeout-s", Some(env::AMQP10_DEFAULT_RPC_TIMEOUT_SECONDS), 1),
            amqp_rpc_max_pending: uint!(amqp_rpc_max_pending, "amqp-rpc-max-pending", Some(env::AMQP10_RPC_MAX_PENDING), 1),
            cpus,
            default_pattern,
            heartbeat_ms: uint!(heartbeat_ms, "heartbeat-ms", Some(env::HEARTBEAT_MS), 0),
            max_connections: uint!(max_connections, "max-connections", Some(env::MAX_CONNECTIONS), 0),
            max_body_size: uint!(max_body_size, "max-body-size", Some(env::MAX_BODY_SIZE), 1),
            sub_buff_size: uint!(sub_buff_size, "sub-buff-size", Some(env::SUB_BUFF_SIZE), 1),
            queue_ack_timeout_s: uint!(queue_ack_timeout_s, "queue-ack-timeout-s", Some(env::QUEUE_ACK_TIMEOUT_SECONDS), 1),
            rpc_timeout_s: uint!(rpc_timeout_s, "rpc-timeout-s", Some(env::RPC_TIMEOUT_SECONDS), 1),
            rpc_max_pending: uint!(rpc_max_pending, "rpc-max-pending", Some(env::RPC_MAX_PENDING), 1),
            connect_timeout_s: uint!(connect_timeout_s, "connect-timeout-s", Some(env::CONNECT_TIMEOUT_SECONDS), 1),
            max_tx_frames: uint!(max_tx_frames, "max-tx-frames", Some(env::MAX_TX_FRAMES), 1),
            max_transactions: uint!(max_transactions, "max-transactions", Some(env::MAX_TRANSACTIONS), 1),
            max_subscriptions: uint!(max_subscriptions, "max-subscriptions", Some(env::MAX_SUBSCRIPTIONS), 1),
            partial_frames_budget: uint!(partial_frames_budget, "partial-frames-budget", Some(env::PARTIAL_FRAMES_BUDGET), 1),
            queue_max_messages: uint!(queue_max_messages, "queue-max-messages", Some(env::QUEUE_MAX_MESSAGES), 0),
            queue_max_bytes: uint!(queue_max_bytes, "queue-max-bytes", Some(env::QUEUE_MAX_BYTES), 0),
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
            auth: Self::resolve_auth(&src)?,
            store: Self::resolve_store(&src, &array)?,
            array,
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

    /// `--store-dir` (a path or `off`; default [`super::DEFAULT_STORE_DIR`] with the embedded
    /// array, none with a remote one, where a directory is an error: it would do nothing),
    /// `--store-sync`, `--store-sync-interval-us`, `--store-max-bytes`, `--store-retention-min`.
    fn resolve_store<F: Fn(&str) -> Option<String>>(src: &Sources<'_, F>, array: &ArrayMode) -> Result<StoreConfig, String> {
        let cli = src.cli;
        let d = StoreConfig::default();
        let remote = matches!(array, ArrayMode::Remote(_));
        let dir = match src.pick("store-dir", &cli.store_dir, Some(env::STORE_PATH), "store_dir") {
            None if remote => None,
            None => Some(std::path::PathBuf::from(super::DEFAULT_STORE_DIR)),
            Some((raw, source)) => match text(&raw, source)?.trim() {
                "off" => None,
                "" => return Err(invalid(source, "expected a directory or off")),
                _ if remote => return Err(invalid(source, "a gateway in front of a remote array (--array grpc://…) keeps no store; leave it unset or off")),
                path => Some(std::path::PathBuf::from(path)),
            },
        };
        let retention_min = match src.pick("store-retention-min", &cli.store_retention_min, Some(env::STORE_MAX_RETENTION), "store_retention_min") {
            None => d.retention_min,
            Some((raw, source)) => parse_uint(&raw, source, 0)?,
        };
        let retention_mb = match src.pick("store-retention-mb", &cli.store_retention_mb, Some(env::STORE_RETENTION_MB), "store_retention_mb") {
            None => d.retention_mb,
            Some((raw, source)) => parse_uint(&raw, source, 0)?,
        };
        let sync = match src.pick("store-sync", &cli.store_sync, Some(env::STORE_SYNC), "store_sync") {
            None => d.sync,
            Some((raw, source)) => match text(&raw, source)?.trim() {
                "fsync" => StoreSync::Fsync,
                "write" => StoreSync::Write,
                other => return Err(invalid(source, format!("{other:?} is not one of fsync, write"))),
            },
        };
        let sync_interval_us =
            match src.pick("store-sync-interval-us", &cli.store_sync_interval_us, Some(env::STORE_SYNC_INTERVAL_US), "store_sync_interval_us") {
                None => d.sync_interval_us,
                Some((raw, source)) => parse_uint(&raw, source, 0)?,
            };
        let max_bytes = match src.pick("store-max-bytes", &cli.store_max_bytes, Some(env::STORE_MAX_BYTES), "store_max_bytes") {
            None => d.max_bytes,
            Some((raw, source)) => parse_uint(&raw, source, 0)?,
        };
        let segment_bytes = match src.pick("store-segment-bytes", &cli.store_segment_bytes, None, "store_segment_bytes") {
            None => d.segment_bytes,
            Some((raw, source)) => parse_uint(&raw, source, 1024)?,
        };
        let cache_mb = match src.pick("store-cache-mb", &cli.store_cache_mb, Some(env::STORE_CACHE_MB), "store_cache_mb") {
            None => d.cache_mb,
            Some((raw, source)) => parse_uint(&raw, source, 0)?,
        };
        Ok(StoreConfig { dir, retention_min, retention_mb, sync, sync_interval_us, max_bytes, segment_bytes, cache_mb })
    }

    /// `--grpc-tls-cert` and `--grpc-tls-key`: both or neither, each a readable file.
    fn resolve_grpc_tls<F: Fn(&str) -> Option<String>>(src: &Sources<'_, F>) -> Result<Option<ServerTls>, String> {
        let cli = src.cli;
        let cert = Self::resolve_file(src, "grpc-tls-cert", &cli.grpc_tls_cert, "grpc_tls_cert")?;
        let key = Self::resolve_file(src, "grpc-tls-key", &cli.grpc_tls_key, "grpc_tls_key")?;
        match (cert, key) {
            (Some((cert_file, _)), Some((key_file, _))) => Ok(Some(ServerTls { cert_file, key_file })),
            (None, None) => Ok(None),
            (Some((_, source)), None) => Err(format!("invalid {source}: needs --grpc-tls-key too")),
            (None, Some((_, source))) => Err(format!("invalid {source}: needs --grpc-tls-cert too")),
        }
    }

    /// `--tls-cert` and `--tls-key` (both or neither) and `--tls-client-ca` (needs the pair).
    fn resolve_stomp_tls<F: Fn(&str) -> Option<String>>(src: &Sources<'_, F>) -> Result<Option<StompTls>, String> {
        let cli = src.cli;
        let cert = Self::resolve_file(src, "tls-cert", &cli.tls_cert, "tls_cert")?;
        let key = Self::resolve_file(src, "tls-key", &cli.tls_key, "tls_key")?;
        let ca = Self::resolve_file(src, "tls-client-ca", &cli.tls_client_ca, "tls_client_ca")?;
        match (cert, key) {
            (Some((cert_file, _)), Some((key_file, _))) => Ok(Some(StompTls { cert_file, key_file, client_ca_file: ca.map(|(p, _)| p) })),
            (None, None) => match ca {
                Some((_, source)) => Err(format!("invalid {source}: needs --tls-cert and --tls-key too")),
                None => Ok(None),
            },
            (Some((_, source)), None) => Err(format!("invalid {source}: needs --tls-key too")),
            (None, Some((_, source))) => Err(format!("invalid {source}: needs --tls-cert too")),
        }
    }

    /// A file setting (flag > file; no env): the path, checked to be a readable file, and the
    /// name of its source for later messages.
    fn resolve_file<F: Fn(&str) -> Option<String>>(
        src: &Sources<'_, F>,
        name: &'static str,
        raw: &Option<String>,
        key: &'static str,
    ) -> Result<Option<(std::path::PathBuf, String)>, String> {
        let Some((raw, source)) = src.pick(name, raw, None, key) else { return Ok(None) };
        let path = text(&raw, source)?.to_string();
        if !Path::new(&path).is_file() {
            return Err(format!("invalid {source}: {path} is not a readable file"));
        }
        Ok(Some((path.into(), source.to_string())))
    }

    /// `--auth-jwt-key` with `--auth-jwt-alg`, and `--authz-file`: the files are read and
    /// checked now, so a bad key or rule file stops start-up with its reason.
    fn resolve_auth<F: Fn(&str) -> Option<String>>(src: &Sources<'_, F>) -> Result<crate::auth::Auth, String> {
        use crate::auth::{Auth, Authz, JwtAlg, JwtVerifier};
        use std::sync::Arc;
        let cli = src.cli;
        let alg = match src.pick("auth-jwt-alg", &cli.auth_jwt_alg, Some(env::AUTH_JWT_ALG), "auth_jwt_alg") {
            None => None,
            Some((raw, source)) => {
                let s = text(&raw, source)?;
                Some((JwtAlg::parse(s).ok_or_else(|| invalid(source, format!("{s:?} is not one of {}", JwtAlg::NAMES)))?, source.to_string()))
            }
        };
        let jwt = match src.pick("auth-jwt-key", &cli.auth_jwt_key, Some(env::AUTH_JWT_KEY), "auth_jwt_key") {
            None => {
                if let Some((_, s)) = alg {
                    return Err(format!("invalid {s}: needs --auth-jwt-key"));
                }
                None
            }
            Some((raw, source)) => {
                let path = text(&raw, source)?;
                let alg = alg.map_or(JwtAlg::HS256, |(a, _)| a);
                if let Some((_, token_source)) = src.pick("grpc-token", &cli.grpc_token, Some(env::GRPC_TOKEN), "grpc_token") {
                    return Err(format!("invalid {token_source}: a JWT key ({source}) replaces the static gRPC token; set only one"));
                }
                Some(Arc::new(JwtVerifier::load(Path::new(path), alg).map_err(|e| invalid(source, e))?))
            }
        };
        let authz = match src.pick("authz-file", &cli.authz_file, Some(env::AUTHZ_FILE), "authz_file") {
            None => None,
            Some((raw, source)) => Some(Arc::new(Authz::load(Path::new(text(&raw, source)?)).map_err(|e| invalid(source, e))?)),
        };
        Ok(Auth { jwt, authz })
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

    /// A WebSocket listener address, `None` for `off`: flag > env > file > `default` (the
    /// env variable holds the whole address, unlike the KubeMQ port-only STOMP ones).
    fn resolve_ws_addr<F: Fn(&str) -> Option<String>>(
        src: &Sources<'_, F>,
        flag: &'static str,
        raw_flag: &Option<String>,
        env_name: &'static str,
        key: &'static str,
        default: &str,
    ) -> Result<Option<SocketAddr>, String> {
        match src.pick(flag, raw_flag, Some(env_name), key) {
            None => Ok(Some(default.parse().expect("a valid default address"))),
            Some((raw, source)) => match text(&raw, source)?.trim() {
                "off" => Ok(None),
                a => parse_addr(a, source).map(Some),
            },
        }
    }

    /// A STOMP listener address, `None` for `off`: flag > env port (port only; host from the
    /// file's key, else 0.0.0.0) > file > default. Used for `--stomp-addr` with
    /// `CONNECTORS_STOMP_PORT` and for `--stomp-tls-addr` with `CONNECTORS_STOMP_TLS_PORT`.
    fn resolve_addr<F: Fn(&str) -> Option<String>>(
        src: &Sources<'_, F>,
        flag: &'static str,
        raw_flag: &Option<String>,
        env_port: &'static str,
        key: &'static str,
        default: SocketAddr,
    ) -> Result<Option<SocketAddr>, String> {
        let addr_or_off = |s: &str, source: Source<'_>| match s.trim() {
            "off" => Ok(None),
            a => parse_addr(a, source).map(Some),
        };
        if let Some(s) = raw_flag {
            return addr_or_off(s, Source::Flag(flag));
        }
        let from_file = match src.file.and_then(|f| f.get(key)) {
            Some((raw, source)) => Some(addr_or_off(text(&raw, source)?, source)?),
            None => None,
        };
        if let Some((raw, source)) = src.env(env_port) {
            let port = parse_port(text(&raw, source)?, source)?;
            let ip = from_file.flatten().map_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED), |a| a.ip());
            return Ok(Some(SocketAddr::new(ip, port)));
        }
        Ok(from_file.unwrap_or(Some(default)))
    }
}
