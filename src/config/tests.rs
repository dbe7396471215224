//! The resolution end to end, through [`Config::parse_with`]: defaults, each flag, env name and
//! TOML key, precedence, and the one-line errors.
use super::*;
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};

const ONLINE: [usize; 4] = [0, 1, 2, 3];

fn parse_env(args: &[&str], env: &[(&str, &str)]) -> Result<Config, String> {
    let env: HashMap<String, String> = env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
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
        let path = std::env::temp_dir().join(format!("stompgate-config-test-{}-{}.toml", std::process::id(), N.fetch_add(1, Ordering::Relaxed)));
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
    // The WebSocket and AMQP listeners are the one difference: on by default on the command
    // line, off in `Config::default()` (see the fields' docs).
    let ws = |a: &str| Some(a.parse().unwrap());
    let on_the_command_line = Config {
        cpus: ONLINE.to_vec(),
        ws_addr: ws(super::DEFAULT_WS_ADDR),
        ws_tls_addr: ws(super::DEFAULT_WS_TLS_ADDR),
        amqp_addr: Some(super::DEFAULT_AMQP_ADDR),
        amqp_tls_addr: Some(super::DEFAULT_AMQP_TLS_ADDR),
        store: super::StoreConfig { dir: Some(super::DEFAULT_STORE_DIR.into()), ..super::StoreConfig::default() },
        ..Config::default()
    };
    assert_eq!(c, on_the_command_line);
    assert_eq!(c.stomp_addr, "0.0.0.0:61613".parse().unwrap());
    assert_eq!(c.default_pattern, DefaultPattern::Events);
    assert_eq!(c.heartbeat_ms, 10_000);
    assert_eq!(c.max_connections, 0);
    assert_eq!(c.max_body_size, 104_857_600);
    assert_eq!(c.sub_buff_size, 100);
    assert_eq!(c.queue_ack_timeout_s, 30);
    assert_eq!(c.rpc_timeout_s, 30);
    assert_eq!(c.rpc_max_pending, 1024);
    assert_eq!(c.connect_timeout_s, 10);
    assert_eq!(c.max_tx_frames, 10_000);
    assert_eq!(c.max_transactions, 1_000);
    assert_eq!(c.max_subscriptions, 10_000);
    assert_eq!(c.partial_frames_budget, 536_870_912);
    assert_eq!(c.queue_max_messages, 1_000_000);
    assert_eq!(c.queue_max_bytes, 1_073_741_824);
}

#[test]
fn each_flag() {
    let c = parse(&["--stomp-addr", "127.0.0.1:7000"]).unwrap();
    assert_eq!(c.stomp_addr, "127.0.0.1:7000".parse().unwrap());
    let c = parse(&["--stomp-addr=[::1]:7001"]).unwrap();
    assert_eq!(c.stomp_addr, "[::1]:7001".parse().unwrap());
    assert_eq!(parse(&["--cores", "2"]).unwrap().cpus, vec![0, 1]);
    assert_eq!(parse(&["--cpus", "1,3"]).unwrap().cpus, vec![1, 3]);
    for (s, p) in [("events", DefaultPattern::Events), ("queues", DefaultPattern::Queues), ("store", DefaultPattern::Store), ("none", DefaultPattern::None)] {
        assert_eq!(parse(&["--default-pattern", s]).unwrap().default_pattern, p);
    }
    assert_eq!(parse(&["--heartbeat-ms", "0"]).unwrap().heartbeat_ms, 0);
    assert_eq!(parse(&["--heartbeat-ms", "2500"]).unwrap().heartbeat_ms, 2500);
    assert_eq!(parse(&["--max-connections", "7"]).unwrap().max_connections, 7);
    assert_eq!(parse(&["--max-body-size", "1"]).unwrap().max_body_size, 1);
    assert_eq!(parse(&["--sub-buff-size", "1"]).unwrap().sub_buff_size, 1);
    assert_eq!(parse(&["--queue-ack-timeout-s", "5"]).unwrap().queue_ack_timeout_s, 5);
    assert_eq!(parse(&["--rpc-timeout-s", "6"]).unwrap().rpc_timeout_s, 6);
    assert_eq!(parse(&["--rpc-max-pending", "8"]).unwrap().rpc_max_pending, 8);
    assert_eq!(parse(&["--connect-timeout-s", "3"]).unwrap().connect_timeout_s, 3);
    assert_eq!(parse(&["--max-tx-frames", "9"]).unwrap().max_tx_frames, 9);
    assert_eq!(parse(&["--max-transactions", "10"]).unwrap().max_transactions, 10);
    assert_eq!(parse(&["--max-subscriptions", "11"]).unwrap().max_subscriptions, 11);
    assert_eq!(parse(&["--partial-frames-budget", "12"]).unwrap().partial_frames_budget, 12);
    assert_eq!(parse(&["--queue-max-messages", "0"]).unwrap().queue_max_messages, 0);
    assert_eq!(parse(&["--queue-max-bytes", "14"]).unwrap().queue_max_bytes, 14);
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
            ("CONNECTORS_STOMP_CONNECT_TIMEOUT_SECONDS", "7"),
            ("STOMPGATE_MAX_TX_FRAMES", "7"),
            ("STOMPGATE_MAX_TRANSACTIONS", "8"),
            ("STOMPGATE_MAX_SUBSCRIPTIONS", "9"),
            ("STOMPGATE_PARTIAL_FRAMES_BUDGET", "10"),
            ("STOMPGATE_QUEUE_MAX_MESSAGES", "11"),
            ("STOMPGATE_QUEUE_MAX_BYTES", "12"),
            ("STOMPGATE_WS_ADDR", "127.0.0.1:7004"),
            ("STOMPGATE_WS_PATH", "/stomp"),
            ("STOMPGATE_WS_TLS_ADDR", "off"),
            ("STOMPGATE_WS_ALLOWED_ORIGINS", "https://a.example, http://localhost:8080/"),
        ],
    )
    .unwrap();
    assert_eq!(
        c,
        Config {
            stomp_addr: "0.0.0.0:7002".parse().unwrap(),
            stomp_plain: true,
            stomp_tls_addr: Some("0.0.0.0:7003".parse().unwrap()),
            stomp_tls: None,
            ws_addr: Some("127.0.0.1:7004".parse().unwrap()),
            ws_tls_addr: None,
            ws_path: "/stomp".into(),
            ws_allowed_origins: vec!["https://a.example".into(), "http://localhost:8080".into()],
            amqp_addr: Some("0.0.0.0:5672".parse().unwrap()),
            amqp_max_frame_size: 131_072,
            amqp_max_message_size: 104_857_600,
            amqp_tls_addr: Some(super::DEFAULT_AMQP_TLS_ADDR),
            amqp_session_max: 256,
            amqp_max_links_per_session: 256,
            amqp_max_connections: 1000,
            amqp_idle_timeout_s: 120,
            amqp_default_pattern: crate::model::Pattern::Queues,
            amqp_get_batch_size: 32,
            amqp_max_unsettled_per_link: 1024,
            amqp_rpc_timeout_s: 30,
            amqp_rpc_max_pending: 512,
            cpus: ONLINE.to_vec(),
            default_pattern: DefaultPattern::Store,
            heartbeat_ms: 0,
            max_connections: 9,
            max_body_size: 4096,
            sub_buff_size: 3,
            queue_ack_timeout_s: 4,
            rpc_timeout_s: 5,
            rpc_max_pending: 6,
            connect_timeout_s: 7,
            max_tx_frames: 7,
            max_transactions: 8,
            max_subscriptions: 9,
            partial_frames_budget: 10,
            queue_max_messages: 11,
            queue_max_bytes: 12,
            grpc_addr: Some("0.0.0.0:50000".parse().unwrap()),
            grpc_threads: 1,
            grpc_tls: None,
            grpc_token: None,
            auth: crate::auth::Auth::default(),
            array: ArrayMode::Embedded,
            metrics_addr: None,
            store: crate::config::StoreConfig { dir: Some("./store".into()), ..crate::config::StoreConfig::default() },
            mesh_ring: 8192,
        }
    );
}

#[test]
fn empty_env_counts_as_unset() {
    let c = parse_env(&[], &[("CONNECTORS_STOMP_SUB_BUFF_SIZE", ""), ("CONNECTORS_STOMP_PORT", "")]).unwrap();
    assert_eq!(c.sub_buff_size, 100);
    assert_eq!(c.stomp_addr, "0.0.0.0:61613".parse().unwrap());
}

#[test]
fn toml_file_sets_every_key() {
    let f = TempToml::new(
        &r#"
stomp_addr = "127.0.0.1:7100"
stomp_tls_addr = "127.0.0.1:7102"
tls_cert = "CERT"
tls_key = "CERT"
tls_client_ca = "CERT"
cpus = "0,2-3"
default_pattern = "queues"
heartbeat_ms = 5000
max_connections = 10
max_body_size = 2048
sub_buff_size = 11
queue_ack_timeout_s = 12
rpc_timeout_s = 13
rpc_max_pending = 14
connect_timeout_s = 15
max_tx_frames = 15
max_transactions = 16
max_subscriptions = 17
partial_frames_budget = 18
queue_max_messages = 19
queue_max_bytes = 20
grpc_addr = "127.0.0.1:7101"
grpc_threads = 2
grpc_token = "s3cret"
metrics_addr = "127.0.0.1:9100"
ws_addr = "127.0.0.1:7103"
ws_path = "/ws/stomp"
ws_tls_addr = "127.0.0.1:7104"
ws_allowed_origins = "*"
"#
        .replace("CERT", concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml")),
    );
    let c = parse(&["--config", f.path()]).unwrap();
    let cert = std::path::PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml"));
    assert_eq!(
        c,
        Config {
            stomp_addr: "127.0.0.1:7100".parse().unwrap(),
            stomp_plain: true,
            stomp_tls_addr: Some("127.0.0.1:7102".parse().unwrap()),
            stomp_tls: Some(StompTls { cert_file: cert.clone(), key_file: cert.clone(), client_ca_file: Some(cert) }),
            ws_addr: Some("127.0.0.1:7103".parse().unwrap()),
            ws_tls_addr: Some("127.0.0.1:7104".parse().unwrap()),
            ws_path: "/ws/stomp".into(),
            ws_allowed_origins: Vec::new(),
            amqp_addr: Some("0.0.0.0:5672".parse().unwrap()),
            amqp_max_frame_size: 131_072,
            amqp_max_message_size: 104_857_600,
            amqp_tls_addr: Some(super::DEFAULT_AMQP_TLS_ADDR),
            amqp_session_max: 256,
            amqp_max_links_per_session: 256,
            amqp_max_connections: 1000,
            amqp_idle_timeout_s: 120,
            amqp_default_pattern: crate::model::Pattern::Queues,
            amqp_get_batch_size: 32,
            amqp_max_unsettled_per_link: 1024,
            amqp_rpc_timeout_s: 30,
            amqp_rpc_max_pending: 512,
            cpus: vec![0, 2, 3],
            default_pattern: DefaultPattern::Queues,
            heartbeat_ms: 5000,
            max_connections: 10,
            max_body_size: 2048,
            sub_buff_size: 11,
            queue_ack_timeout_s: 12,
            rpc_timeout_s: 13,
            rpc_max_pending: 14,
            connect_timeout_s: 15,
            max_tx_frames: 15,
            max_transactions: 16,
            max_subscriptions: 17,
            partial_frames_budget: 18,
            queue_max_messages: 19,
            queue_max_bytes: 20,
            grpc_addr: Some("127.0.0.1:7101".parse().unwrap()),
            grpc_threads: 2,
            grpc_tls: None,
            grpc_token: Some("s3cret".into()),
            auth: crate::auth::Auth::default(),
            array: ArrayMode::Embedded,
            metrics_addr: Some("127.0.0.1:9100".parse().unwrap()),
            store: crate::config::StoreConfig { dir: Some("./store".into()), ..crate::config::StoreConfig::default() },
            mesh_ring: 8192,
        }
    );
    let g = TempToml::new("cores = 3\n");
    assert_eq!(parse(&["--config", g.path()]).unwrap().cpus, vec![0, 1, 2]);
    let empty = TempToml::new("");
    assert_eq!(parse(&["--config", empty.path()]).unwrap(), parse(&[]).unwrap());
}

#[test]
fn precedence_flag_over_env_over_file_over_default() {
    let f = TempToml::new("sub_buff_size = 3\nrpc_max_pending = 30\nheartbeat_ms = 300\nstomp_addr = \"127.0.0.1:7200\"\ndefault_pattern = \"store\"\n");
    let env = [("CONNECTORS_STOMP_SUB_BUFF_SIZE", "2"), ("CONNECTORS_STOMP_RPC_MAX_PENDING", "20"), ("CONNECTORS_STOMP_DEFAULT_PATTERN", "queues")];
    let c = parse_env(&["--config", f.path(), "--sub-buff-size", "1", "--default-pattern", "none"], &env).unwrap();
    assert_eq!(c.sub_buff_size, 1, "flag beats env and file");
    assert_eq!(c.default_pattern, DefaultPattern::None, "flag beats env and file");
    assert_eq!(c.rpc_max_pending, 20, "env beats file");
    assert_eq!(c.heartbeat_ms, 300, "file beats default");
    assert_eq!(c.max_body_size, 104_857_600, "default when nothing is set");
    assert_eq!(c.stomp_addr, "127.0.0.1:7200".parse().unwrap());

    // Env port replaces the file's port and keeps its host; the flag replaces both.
    let c = parse_env(&["--config", f.path()], &[("CONNECTORS_STOMP_PORT", "7300")]).unwrap();
    assert_eq!(c.stomp_addr, "127.0.0.1:7300".parse().unwrap());
    let c = parse_env(&["--config", f.path(), "--stomp-addr", "[::]:7400"], &[("CONNECTORS_STOMP_PORT", "7300")]).unwrap();
    assert_eq!(c.stomp_addr, "[::]:7400".parse().unwrap());

    // An explicit flag wins even when the lower sources hold a bad value.
    let c = parse_env(&["--sub-buff-size", "5"], &[("CONNECTORS_STOMP_SUB_BUFF_SIZE", "zero")]).unwrap();
    assert_eq!(c.sub_buff_size, 5);

    // CPU plan: a flag overrides the file's plan of the other kind.
    let g = TempToml::new("cpus = \"3\"\n");
    assert_eq!(parse(&["--config", g.path(), "--cores", "2"]).unwrap().cpus, vec![0, 1]);
    assert_eq!(parse(&["--config", g.path()]).unwrap().cpus, vec![3]);
}

#[test]
fn bad_values_are_rejected_with_the_setting_and_source() {
    assert_eq!(err(&["--sub-buff-size", "0"], &[]), "invalid --sub-buff-size: must be at least 1");
    assert_eq!(err(&[], &[("CONNECTORS_STOMP_SUB_BUFF_SIZE", "0")]), "invalid CONNECTORS_STOMP_SUB_BUFF_SIZE: must be at least 1");
    assert_eq!(err(&["--max-body-size", "0"], &[]), "invalid --max-body-size: must be at least 1");
    assert_eq!(err(&["--queue-ack-timeout-s", "0"], &[]), "invalid --queue-ack-timeout-s: must be at least 1");
    assert_eq!(err(&["--rpc-timeout-s", "0"], &[]), "invalid --rpc-timeout-s: must be at least 1");
    assert_eq!(err(&["--rpc-max-pending", "0"], &[]), "invalid --rpc-max-pending: must be at least 1");
    assert_eq!(err(&["--connect-timeout-s", "0"], &[]), "invalid --connect-timeout-s: must be at least 1");
    assert_eq!(err(&[], &[("CONNECTORS_STOMP_CONNECT_TIMEOUT_SECONDS", "0")]), "invalid CONNECTORS_STOMP_CONNECT_TIMEOUT_SECONDS: must be at least 1");
    assert_eq!(err(&["--max-tx-frames", "0"], &[]), "invalid --max-tx-frames: must be at least 1");
    assert_eq!(err(&["--max-transactions", "0"], &[]), "invalid --max-transactions: must be at least 1");
    assert_eq!(err(&["--max-subscriptions", "0"], &[]), "invalid --max-subscriptions: must be at least 1");
    assert_eq!(err(&["--partial-frames-budget", "0"], &[]), "invalid --partial-frames-budget: must be at least 1");
    assert!(err(&["--queue-max-bytes", "-1"], &[]).starts_with("invalid --queue-max-bytes: "));
    assert!(err(&["--heartbeat-ms", "-1"], &[]).starts_with("invalid --heartbeat-ms: "));
    assert!(err(&["--max-connections", "lots"], &[]).starts_with("invalid --max-connections: "));
    assert!(err(&["--heartbeat-ms", "99999999999999999999999"], &[]).starts_with("invalid --heartbeat-ms: "));
    assert!(err(&["--default-pattern", "commands"], &[]).starts_with("invalid --default-pattern: \"commands\""));
    assert!(err(&["--default-pattern", "Events"], &[]).starts_with("invalid --default-pattern: "));
    assert!(err(&[], &[("CONNECTORS_STOMP_DEFAULT_PATTERN", "all")]).starts_with("invalid CONNECTORS_STOMP_DEFAULT_PATTERN: "));
    for bad in ["61613", "localhost:61613", "0.0.0.0:0", "0.0.0.0:70000", "1.2.3.4"] {
        assert!(err(&["--stomp-addr", bad], &[]).starts_with("invalid --stomp-addr: "), "{bad}");
    }
    for bad in ["0", "65536", "-1", "http"] {
        assert!(err(&[], &[("CONNECTORS_STOMP_PORT", bad)]).starts_with("invalid CONNECTORS_STOMP_PORT: "), "{bad}");
        assert!(err(&[], &[("CONNECTORS_STOMP_TLS_PORT", bad)]).starts_with("invalid CONNECTORS_STOMP_TLS_PORT: "), "{bad}");
    }
    for e in [
        "CONNECTORS_STOMP_HEARTBEAT_MS",
        "CONNECTORS_STOMP_MAX_CONNECTIONS",
        "CONNECTORS_STOMP_MAX_BODY_SIZE",
        "CONNECTORS_STOMP_QUEUE_ACK_TIMEOUT_SECONDS",
        "CONNECTORS_STOMP_RPC_TIMEOUT_SECONDS",
        "CONNECTORS_STOMP_RPC_MAX_PENDING",
        "CONNECTORS_STOMP_CONNECT_TIMEOUT_SECONDS",
    ] {
        assert!(err(&[], &[(e, "x")]).starts_with(&format!("invalid {e}: ")), "{e}");
    }
    // Command-line errors from clap are one line too.
    assert!(err(&["--no-such-flag"], &[]).contains("--no-such-flag"));
    assert!(err(&["--cores", "2", "--cpus", "0"], &[]).contains("cannot be used with"));
    assert!(!err(&["--sub-buff-size"], &[]).is_empty());
}

#[test]
fn bad_config_files_are_rejected() {
    let e = err(&["--config", "/nonexistent/stompgate.toml"], &[]);
    assert!(e.starts_with("cannot read config file /nonexistent/stompgate.toml: "), "{e}");

    let f = TempToml::new("sub_buff_size = \n");
    let e = err(&["--config", f.path()], &[]);
    assert!(e.starts_with(&format!("invalid config file {}: line 1: ", f.path())), "{e}");

    let f = TempToml::new("sub_buff_size = 1\nsubbuffsize = 2\n");
    let e = err(&["--config", f.path()], &[]);
    assert!(e.starts_with(&format!("invalid config file {}: unknown key `subbuffsize`", f.path())), "{e}");

    let f = TempToml::new("config = \"x.toml\"\n");
    assert!(err(&["--config", f.path()], &[]).contains("unknown key `config`"));

    let f = TempToml::new("sub_buff_size = 0\n");
    assert_eq!(err(&["--config", f.path()], &[]), format!("invalid sub_buff_size in {}: must be at least 1", f.path()));

    let f = TempToml::new("heartbeat_ms = \"5000\"\n");
    assert_eq!(err(&["--config", f.path()], &[]), format!("invalid heartbeat_ms in {}: expected an integer, found a string", f.path()));

    let f = TempToml::new("max_connections = -1\n");
    assert!(err(&["--config", f.path()], &[]).starts_with(&format!("invalid max_connections in {}: ", f.path())));

    let f = TempToml::new("default_pattern = 1\n");
    assert!(err(&["--config", f.path()], &[]).starts_with(&format!("invalid default_pattern in {}: ", f.path())));

    let f = TempToml::new("stomp_addr = \"nowhere\"\n");
    assert!(err(&["--config", f.path()], &[]).starts_with(&format!("invalid stomp_addr in {}: ", f.path())));

    let f = TempToml::new("cores = 2\ncpus = \"0\"\n");
    assert!(err(&["--config", f.path()], &[]).contains("mutually exclusive"));

    let f = TempToml::new("cores = 5\n");
    assert!(err(&["--config", f.path()], &[]).starts_with(&format!("invalid cores in {}: ", f.path())));

    let f = TempToml::new("cpus = \"0,9\"\n");
    assert!(err(&["--config", f.path()], &[]).starts_with(&format!("invalid cpus in {}: CPU 9 is not online", f.path())));
}

/// The CPU-list errors of `cpus::parse_cpu_list`, as `--cpus` reports them.
#[test]
fn cpu_list_errors_name_the_flag() {
    assert_eq!(err(&["--cpus", "0,0"], &[]), "invalid --cpus: CPU 0 is listed twice");
    assert_eq!(err(&["--cpus", "3-2"], &[]), "invalid --cpus: reversed range \"3-2\"");
    assert_eq!(err(&["--cpus", "7"], &[]), "invalid --cpus: CPU 7 is not online (online: 0-3)");
}

#[test]
fn cores_must_fit_the_online_cpus() {
    assert_eq!(parse(&["--cores", "4"]).unwrap().cpus, ONLINE.to_vec());
    assert_eq!(parse(&["--cores", "1"]).unwrap().cpus, vec![0]);
    assert_eq!(err(&["--cores", "5"], &[]), "invalid --cores: 5 cores requested but only 4 CPUs are online");
    assert_eq!(err(&["--cores", "0"], &[]), "invalid --cores: must be at least 1");
    let sparse = Config::parse_with(["stompgate", "--cores", "2"], |_| None, &[1, 3, 5]).unwrap();
    assert_eq!(sparse.cpus, vec![1, 3]);
}

#[test]
fn grpc_listener_tls_needs_both_files_and_token_comes_from_env_or_flag() {
    let file = concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml");
    let c = parse(&["--grpc-tls-cert", file, "--grpc-tls-key", file]).unwrap();
    assert_eq!(c.grpc_tls, Some(ServerTls { cert_file: file.into(), key_file: file.into() }));
    assert_eq!(parse(&["--grpc-tls-cert", file]).unwrap_err(), "invalid --grpc-tls-cert: needs --grpc-tls-key too");
    assert_eq!(parse(&["--grpc-tls-key", file]).unwrap_err(), "invalid --grpc-tls-key: needs --grpc-tls-cert too");
    assert_eq!(
        parse(&["--grpc-tls-cert", "/nonexistent.pem", "--grpc-tls-key", file]).unwrap_err(),
        "invalid --grpc-tls-cert: /nonexistent.pem is not a readable file"
    );
    assert_eq!(parse_env(&[], &[("STOMPGATE_GRPC_TOKEN", "t1")]).unwrap().grpc_token.as_deref(), Some("t1"));
    assert_eq!(parse_env(&["--grpc-token", "t2"], &[("STOMPGATE_GRPC_TOKEN", "t1")]).unwrap().grpc_token.as_deref(), Some("t2"));
    assert_eq!(parse(&[]).unwrap().grpc_token, None);
}

#[test]
fn stomp_tls_needs_cert_and_key_and_its_address_follows_the_stomp_conventions() {
    let file = concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml");
    let d = parse(&[]).unwrap();
    assert_eq!((d.stomp_tls.as_ref(), d.stomp_tls_addr), (None, Some("0.0.0.0:61614".parse().unwrap())));
    assert_eq!(d.stomp_tls_listener(), None, "no certificate: no TLS listener");
    let c = parse(&["--tls-cert", file, "--tls-key", file]).unwrap();
    assert_eq!(c.stomp_tls, Some(StompTls { cert_file: file.into(), key_file: file.into(), client_ca_file: None }));
    assert_eq!(c.stomp_tls_listener(), Some("0.0.0.0:61614".parse().unwrap()));
    let m = parse(&["--tls-cert", file, "--tls-key", file, "--tls-client-ca", file]).unwrap();
    assert_eq!(m.stomp_tls.unwrap().client_ca_file, Some(file.into()));
    assert_eq!(err(&["--tls-cert", file], &[]), "invalid --tls-cert: needs --tls-key too");
    assert_eq!(err(&["--tls-key", file], &[]), "invalid --tls-key: needs --tls-cert too");
    assert_eq!(err(&["--tls-client-ca", file], &[]), "invalid --tls-client-ca: needs --tls-cert and --tls-key too");
    assert_eq!(err(&["--tls-cert", "/nonexistent.pem", "--tls-key", file], &[]), "invalid --tls-cert: /nonexistent.pem is not a readable file");
    // Address: flag > env port (host from the file) > file > default; `off` switches it off.
    let tls = ["--tls-cert", file, "--tls-key", file];
    fn with<'a>(tls: &[&'a str], extra: &[&'a str]) -> Vec<&'a str> {
        [tls, extra].concat()
    }
    assert_eq!(parse(&with(&tls, &["--stomp-tls-addr", "127.0.0.1:7010"])).unwrap().stomp_tls_listener(), Some("127.0.0.1:7010".parse().unwrap()));
    assert_eq!(parse(&with(&tls, &["--stomp-tls-addr", "off"])).unwrap().stomp_tls_listener(), None);
    assert_eq!(parse_env(&tls, &[("CONNECTORS_STOMP_TLS_PORT", "7011")]).unwrap().stomp_tls_addr, Some("0.0.0.0:7011".parse().unwrap()));
    let f = TempToml::new("stomp_tls_addr = \"127.0.0.2:7012\"\n");
    assert_eq!(parse_env(&["--config", f.path()], &[("CONNECTORS_STOMP_TLS_PORT", "7013")]).unwrap().stomp_tls_addr, Some("127.0.0.2:7013".parse().unwrap()));
    assert_eq!(parse(&["--config", f.path()]).unwrap().stomp_tls_addr, Some("127.0.0.2:7012".parse().unwrap()));
    assert_eq!(
        parse_env(&["--stomp-tls-addr", "127.0.0.1:7014"], &[("CONNECTORS_STOMP_TLS_PORT", "7013")]).unwrap().stomp_tls_addr,
        Some("127.0.0.1:7014".parse().unwrap())
    );
    assert!(err(&["--stomp-tls-addr", "nowhere"], &[]).starts_with("invalid --stomp-tls-addr: "));
}

#[test]
fn plain_stomp_can_be_switched_off() {
    assert!(parse(&[]).unwrap().stomp_plain);
    let c = parse(&["--stomp-addr", "off"]).unwrap();
    assert!(!c.stomp_plain);
    let f = TempToml::new("stomp_addr = \"off\"\n");
    assert!(!parse(&["--config", f.path()]).unwrap().stomp_plain);
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

#[test]
fn auth_settings_are_checked_at_start_up() {
    let secret = TempToml::new("s3cret\n");
    let rules = TempToml::new(r#"[{"ClientID": "a.*", "Events": true, "Channel": ".*", "Read": true}]"#);
    let c = parse(&["--auth-jwt-key", secret.path(), "--auth-jwt-alg", "HS512", "--authz-file", rules.path()]).unwrap();
    let jwt = c.auth.jwt.as_ref().expect("jwt on");
    assert_eq!(jwt.alg(), crate::auth::JwtAlg::HS512);
    assert_eq!(c.auth.authz.as_ref().map(|a| a.path().to_path_buf()), Some(std::path::PathBuf::from(rules.path())));
    let c = parse_env(&[], &[("STOMPGATE_AUTH_JWT_KEY", secret.path())]).unwrap();
    assert_eq!(c.auth.jwt.as_ref().map(|j| j.alg()), Some(crate::auth::JwtAlg::HS256), "default alg");
    assert!(parse(&[]).unwrap().auth.jwt.is_none());
    for (args, says) in [
        (vec!["--auth-jwt-key", secret.path(), "--auth-jwt-alg", "none"], "invalid --auth-jwt-alg"),
        (vec!["--auth-jwt-alg", "HS256"], "needs --auth-jwt-key"),
        (vec!["--auth-jwt-key", "/nonexistent/key"], "invalid --auth-jwt-key: cannot read"),
        (vec!["--auth-jwt-key", secret.path(), "--auth-jwt-alg", "RS256"], "not a usable RS256 key"),
        (vec!["--auth-jwt-key", secret.path(), "--grpc-token", "t"], "invalid --grpc-token: a JWT key"),
        (vec!["--authz-file", secret.path()], "invalid --authz-file"),
    ] {
        let err = parse(&args).unwrap_err();
        assert!(err.contains(says), "{args:?}: {err}");
    }
    let file = TempToml::new(&format!("auth_jwt_key = {:?}\nauth_jwt_alg = \"HS384\"\nauthz_file = {:?}\n", secret.path(), rules.path()));
    let c = parse(&["--config", file.path()]).unwrap();
    assert_eq!(c.auth.jwt.as_ref().map(|j| j.alg()), Some(crate::auth::JwtAlg::HS384));
    assert!(c.auth.authz.is_some());
}

#[test]
fn websocket_defaults_and_bad_values() {
    let c = parse(&[]).unwrap();
    assert_eq!(c.ws_addr, Some("0.0.0.0:15674".parse().unwrap()));
    assert_eq!(c.ws_tls_addr, Some("0.0.0.0:15673".parse().unwrap()));
    assert_eq!(c.ws_path, "/ws");
    assert!(c.ws_allowed_origins.is_empty(), "default: any origin");
    assert_eq!(c.ws_tls_listener(), None, "no wss without a certificate");
    let off = parse(&["--ws-addr", "off", "--ws-tls-addr", "off"]).unwrap();
    assert_eq!((off.ws_addr, off.ws_tls_addr), (None, None));
    let e = parse(&["--ws-path", "ws"]).unwrap_err();
    assert!(e.starts_with("invalid --ws-path:"), "{e}");
    let e = parse(&["--ws-allowed-origins", "https://a.example,,"]).unwrap_err();
    assert!(e.starts_with("invalid --ws-allowed-origins:"), "{e}");
    let e = parse(&["--ws-addr", "127.0.0.1"]).unwrap_err();
    assert!(e.starts_with("invalid --ws-addr:"), "{e}");
}

#[test]
fn store_settings_from_flag_env_and_file() {
    use crate::config::{StoreConfig, StoreSync};
    use std::path::PathBuf;
    assert_eq!(
        parse(&[]).unwrap().store,
        StoreConfig { dir: Some(PathBuf::from("./store")), retention_min: 1440, sync: StoreSync::Fsync, sync_interval_us: 200, ..StoreConfig::default() },
        "./store by default, as KubeMQ's store path, with KubeMQ's retention of a day"
    );
    assert_eq!(StoreConfig::default().dir, None, "embedders and in-process tests: off unless asked for");
    let c = parse(&["--store-dir", "/tmp/sg", "--store-sync", "write", "--store-sync-interval-us", "0"]).unwrap();
    assert_eq!(c.store, StoreConfig { dir: Some(PathBuf::from("/tmp/sg")), sync: StoreSync::Write, sync_interval_us: 0, ..StoreConfig::default() });
    assert_eq!(parse(&["--store-dir", "off"]).unwrap().store.dir, None);
    let c = parse_env(&[], &[("STORE_STORE_PATH", "/var/sg"), ("STOMPGATE_STORE_SYNC", "fsync"), ("STOMPGATE_STORE_SYNC_INTERVAL_US", "50")]).unwrap();
    assert_eq!(c.store, StoreConfig { dir: Some(PathBuf::from("/var/sg")), sync: StoreSync::Fsync, sync_interval_us: 50, ..StoreConfig::default() });
    assert_eq!(parse_env(&["--store-dir", "off"], &[("STORE_STORE_PATH", "/var/sg")]).unwrap().store.dir, None, "flag over env");
    let file = TempToml::new("store_dir = \"./st\"\nstore_sync = \"write\"\nstore_sync_interval_us = 7\n");
    let c = parse(&["--config", file.path()]).unwrap();
    assert_eq!(c.store, StoreConfig { dir: Some(PathBuf::from("./st")), sync: StoreSync::Write, sync_interval_us: 7, ..StoreConfig::default() });
    assert!(err(&["--store-sync", "always"], &[]).starts_with("invalid --store-sync: \"always\""));
    assert!(err(&["--store-sync-interval-us", "-3"], &[]).starts_with("invalid --store-sync-interval-us: "));
    assert!(err(&["--store-dir", ""], &[]).starts_with("invalid --store-dir: "));
    let c = parse_env(&["--store-segment-bytes", "4096"], &[("STOMPGATE_STORE_MAX_BYTES", "1000000")]).unwrap();
    assert_eq!((c.store.max_bytes, c.store.segment_bytes), (1_000_000, 4096));
    assert_eq!(parse(&["--store-max-bytes", "5"]).unwrap().store.max_bytes, 5);
    assert!(err(&["--store-segment-bytes", "10"], &[]).starts_with("invalid --store-segment-bytes: must be at least 1024"));
}

#[test]
fn store_retention_from_flag_env_and_file() {
    assert_eq!(parse(&["--store-retention-min", "0"]).unwrap().store.retention_min, 0, "0 = for ever");
    assert_eq!(parse_env(&[], &[("STORE_MAX_RETENTION", "60")]).unwrap().store.retention_min, 60);
    assert_eq!(parse_env(&["--store-retention-min", "5"], &[("STORE_MAX_RETENTION", "60")]).unwrap().store.retention_min, 5, "flag over env");
    let file = TempToml::new("store_retention_min = 90\n");
    assert_eq!(parse(&["--config", file.path()]).unwrap().store.retention_min, 90);
    assert_eq!(parse_env(&["--config", file.path()], &[("STORE_MAX_RETENTION", "7")]).unwrap().store.retention_min, 7, "env over file");
    let e = err(&["--store-retention-min", "-1"], &[]);
    assert_eq!(e, "invalid --store-retention-min: \"-1\" is not a non-negative whole number");
    let e = err(&[], &[("STORE_MAX_RETENTION", "a day")]);
    assert!(e.starts_with("invalid STORE_MAX_RETENTION: "), "{e}");
    let file = TempToml::new("store_retention_min = \"1440\"\n");
    let e = err(&["--config", file.path()], &[]);
    assert!(e.starts_with("invalid store_retention_min in ") && e.ends_with("expected an integer, found a string"), "{e}");
}

#[test]
fn store_size_retention_from_flag_env_and_file() {
    assert_eq!(parse(&[]).unwrap().store.retention_mb, 512, "half a GiB by default");
    assert_eq!(parse(&["--store-retention-mb", "0"]).unwrap().store.retention_mb, 0, "0 = no bound");
    assert_eq!(parse_env(&["--store-retention-mb", "5"], &[("STOMPGATE_STORE_RETENTION_MB", "60")]).unwrap().store.retention_mb, 5, "flag over env");
    let file = TempToml::new("store_retention_mb = 90\n");
    assert_eq!(parse(&["--config", file.path()]).unwrap().store.retention_mb, 90);
    assert_eq!(parse_env(&["--config", file.path()], &[("STOMPGATE_STORE_RETENTION_MB", "7")]).unwrap().store.retention_mb, 7, "env over file");
    let e = err(&["--store-retention-mb", "-1"], &[]);
    assert_eq!(e, "invalid --store-retention-mb: \"-1\" is not a non-negative whole number");
}

/// The store is the embedded array's: a gateway in front of a remote array has none by
/// default (it must not create or lock ./store), and a directory given to one is an error.
#[test]
fn a_remote_array_gateway_keeps_no_store() {
    let remote = ["--array", "grpc://127.0.0.1:50000"];
    assert_eq!(parse(&remote).unwrap().store.dir, None);
    assert_eq!(parse(&[&remote[..], &["--store-dir", "off"]].concat()).unwrap().store.dir, None);
    let e = err(&[&remote[..], &["--store-dir", "/var/sg"]].concat(), &[]);
    assert!(e.starts_with("invalid --store-dir: a gateway in front of a remote array"), "{e}");
    assert!(!e.contains('\n'));
    let e = err(&remote, &[("STORE_STORE_PATH", "/var/sg")]);
    assert!(e.starts_with("invalid STORE_STORE_PATH: "), "{e}");
}

#[test]
fn amqp_listener_and_limits() {
    let c = parse(&[]).unwrap();
    assert_eq!(c.amqp_addr, Some("0.0.0.0:5672".parse().unwrap()));
    assert_eq!((c.amqp_max_frame_size, c.amqp_max_message_size), (131_072, 104_857_600));
    assert_eq!(parse(&["--amqp-addr", "off"]).unwrap().amqp_addr, None);
    assert_eq!(parse(&["--amqp-addr", "127.0.0.1:5673"]).unwrap().amqp_addr, Some("127.0.0.1:5673".parse().unwrap()));
    let c = parse_env(&[], &[("CONNECTORS_AMQP10_PORT", "5674"), ("CONNECTORS_AMQP10_MAX_FRAME_SIZE", "512"), ("CONNECTORS_AMQP10_MAX_MESSAGE_SIZE", "9")])
        .unwrap();
    assert_eq!((c.amqp_addr, c.amqp_max_frame_size, c.amqp_max_message_size), (Some("0.0.0.0:5674".parse().unwrap()), 512, 9));
    assert!(parse(&["--amqp-max-frame-size", "511"]).is_err());
    assert!(parse(&["--amqp-max-message-size", "0"]).is_err());
}

#[test]
fn amqp_settings_are_kubemqs_fourteen_by_flag_env_and_toml() {
    use crate::model::Pattern;
    let d = parse(&[]).unwrap();
    assert_eq!(d.amqp_tls_addr, Some("0.0.0.0:5671".parse().unwrap()));
    assert_eq!((d.amqp_session_max, d.amqp_max_links_per_session, d.amqp_max_connections, d.amqp_idle_timeout_s), (256, 256, 1000, 120));
    assert_eq!((d.amqp_default_pattern, d.amqp_get_batch_size, d.amqp_max_unsettled_per_link), (Pattern::Queues, 32, 1024));
    assert_eq!((d.amqp_rpc_timeout_s, d.amqp_rpc_max_pending), (30, 512));

    let env = parse_env(
        &[],
        &[
            ("CONNECTORS_AMQP10_TLS_PORT", "5699"),
            ("CONNECTORS_AMQP10_SESSION_MAX", "7"),
            ("CONNECTORS_AMQP10_MAX_LINKS_PER_SESSION", "8"),
            ("CONNECTORS_AMQP10_MAX_CONNECTIONS", "0"),
            ("CONNECTORS_AMQP10_IDLE_TIMEOUT_SECONDS", "0"),
            ("CONNECTORS_AMQP10_DEFAULT_PATTERN", "events-store"),
            ("CONNECTORS_AMQP10_GET_BATCH_SIZE", "1024"),
            ("CONNECTORS_AMQP10_MAX_UNSETTLED_PER_LINK", "9"),
            ("CONNECTORS_AMQP10_DEFAULT_RPC_TIMEOUT_SECONDS", "10"),
            ("CONNECTORS_AMQP10_RPC_MAX_PENDING", "11"),
        ],
    )
    .unwrap();
    assert_eq!(env.amqp_tls_addr, Some("0.0.0.0:5699".parse().unwrap()));
    assert_eq!((env.amqp_session_max, env.amqp_max_links_per_session, env.amqp_max_connections, env.amqp_idle_timeout_s), (7, 8, 0, 0));
    assert_eq!((env.amqp_default_pattern, env.amqp_get_batch_size, env.amqp_max_unsettled_per_link), (Pattern::EventsStore, 1024, 9));
    assert_eq!((env.amqp_rpc_timeout_s, env.amqp_rpc_max_pending), (10, 11));

    let flags = parse(&[
        "--amqp-tls-addr",
        "127.0.0.1:5698",
        "--amqp-session-max",
        "65535",
        "--amqp-default-pattern",
        "commands",
        "--amqp-idle-timeout-s",
        "3",
        "--amqp-max-connections",
        "2",
    ])
    .unwrap();
    assert_eq!(flags.amqp_tls_addr, Some("127.0.0.1:5698".parse().unwrap()));
    assert_eq!((flags.amqp_session_max, flags.amqp_default_pattern, flags.amqp_idle_timeout_s, flags.amqp_max_connections), (65535, Pattern::Commands, 3, 2));

    let f = TempToml::new("amqp_enable = false\namqp_default_pattern = \"queries\"\namqp_rpc_max_pending = 4\n");
    let file = parse(&["--config", f.path()]).unwrap();
    assert_eq!((file.amqp_addr, file.amqp_tls_addr), (None, None), "Enable=false turns both listeners off");
    assert_eq!((file.amqp_default_pattern, file.amqp_rpc_max_pending), (Pattern::Queries, 4));
    let off = parse_env(&[], &[("CONNECTORS_AMQP10_ENABLE", "false")]).unwrap();
    assert_eq!((off.amqp_addr, off.amqp_tls_addr), (None, None));
    assert!(parse_env(&[], &[("CONNECTORS_AMQP10_ENABLE", "true")]).unwrap().amqp_addr.is_some());

    // KubeMQ's validation (§3.1), each refusal one line naming the setting.
    for (args, env, names) in [
        (&["--amqp-session-max", "0"][..], &[][..], "--amqp-session-max"),
        (&["--amqp-session-max", "65536"][..], &[][..], "--amqp-session-max"),
        (&["--amqp-max-links-per-session", "0"][..], &[][..], "--amqp-max-links-per-session"),
        (&["--amqp-get-batch-size", "1025"][..], &[][..], "--amqp-get-batch-size"),
        (&["--amqp-get-batch-size", "0"][..], &[][..], "--amqp-get-batch-size"),
        (&["--amqp-max-unsettled-per-link", "0"][..], &[][..], "--amqp-max-unsettled-per-link"),
        (&["--amqp-rpc-timeout-s", "0"][..], &[][..], "--amqp-rpc-timeout-s"),
        (&["--amqp-rpc-max-pending", "0"][..], &[][..], "--amqp-rpc-max-pending"),
        (&["--amqp-default-pattern", "store"][..], &[][..], "--amqp-default-pattern"),
        (&[][..], &[("CONNECTORS_AMQP10_ENABLE", "maybe")][..], "CONNECTORS_AMQP10_ENABLE"),
    ] {
        let e = err(args, env);
        assert!(e.contains(names), "{args:?} {env:?}: {e}");
    }
}
