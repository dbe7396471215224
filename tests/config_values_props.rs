//! Properties of configuration parsing, through the public API (`Config::parse_with`,
//! `parse_cpu_list`, `parse_default_pattern`): every whole-number setting takes exactly the
//! number written, from a flag, the environment or the TOML file, with flag > env > file;
//! values under the minimum, over u64, or not a number are refused with a reason naming the
//! setting; a CPU list is exactly the CPUs written, in order, and anything else is refused;
//! and no input panics.
use proptest::prelude::*;
use std::sync::atomic::{AtomicU64, Ordering};
use stompgate::config::{parse_cpu_list, parse_default_pattern, Config};
use stompgate::route::DefaultPattern;

/// A whole-number setting: flag, environment variable, TOML key, minimum, and its field.
#[derive(Debug)]
struct Setting {
    flag: &'static str,
    env: Option<&'static str>,
    key: &'static str,
    min: u64,
    get: fn(&Config) -> u64,
}

const SETTINGS: [Setting; 15] = [
    Setting { flag: "--heartbeat-ms", env: Some("CONNECTORS_STOMP_HEARTBEAT_MS"), key: "heartbeat_ms", min: 0, get: |c| c.heartbeat_ms },
    Setting { flag: "--max-connections", env: Some("CONNECTORS_STOMP_MAX_CONNECTIONS"), key: "max_connections", min: 0, get: |c| c.max_connections as u64 },
    Setting { flag: "--max-body-size", env: Some("CONNECTORS_STOMP_MAX_BODY_SIZE"), key: "max_body_size", min: 1, get: |c| c.max_body_size as u64 },
    Setting { flag: "--sub-buff-size", env: Some("CONNECTORS_STOMP_SUB_BUFF_SIZE"), key: "sub_buff_size", min: 1, get: |c| c.sub_buff_size as u64 },
    Setting {
        flag: "--queue-ack-timeout-s",
        env: Some("CONNECTORS_STOMP_QUEUE_ACK_TIMEOUT_SECONDS"),
        key: "queue_ack_timeout_s",
        min: 1,
        get: |c| c.queue_ack_timeout_s,
    },
    Setting { flag: "--rpc-timeout-s", env: Some("CONNECTORS_STOMP_RPC_TIMEOUT_SECONDS"), key: "rpc_timeout_s", min: 1, get: |c| c.rpc_timeout_s },
    Setting { flag: "--rpc-max-pending", env: Some("CONNECTORS_STOMP_RPC_MAX_PENDING"), key: "rpc_max_pending", min: 1, get: |c| c.rpc_max_pending as u64 },
    Setting { flag: "--max-tx-frames", env: Some("STOMPGATE_MAX_TX_FRAMES"), key: "max_tx_frames", min: 1, get: |c| c.max_tx_frames as u64 },
    Setting { flag: "--max-transactions", env: Some("STOMPGATE_MAX_TRANSACTIONS"), key: "max_transactions", min: 1, get: |c| c.max_transactions as u64 },
    Setting { flag: "--max-subscriptions", env: Some("STOMPGATE_MAX_SUBSCRIPTIONS"), key: "max_subscriptions", min: 1, get: |c| c.max_subscriptions as u64 },
    Setting {
        flag: "--partial-frames-budget",
        env: Some("STOMPGATE_PARTIAL_FRAMES_BUDGET"),
        key: "partial_frames_budget",
        min: 1,
        get: |c| c.partial_frames_budget as u64,
    },
    Setting {
        flag: "--queue-max-messages",
        env: Some("STOMPGATE_QUEUE_MAX_MESSAGES"),
        key: "queue_max_messages",
        min: 0,
        get: |c| c.queue_max_messages as u64,
    },
    Setting { flag: "--queue-max-bytes", env: Some("STOMPGATE_QUEUE_MAX_BYTES"), key: "queue_max_bytes", min: 0, get: |c| c.queue_max_bytes as u64 },
    Setting { flag: "--grpc-threads", env: None, key: "grpc_threads", min: 1, get: |c| c.grpc_threads as u64 },
    Setting {
        flag: "--connect-timeout-s",
        env: Some("CONNECTORS_STOMP_CONNECT_TIMEOUT_SECONDS"),
        key: "connect_timeout_s",
        min: 1,
        get: |c| c.connect_timeout_s,
    },
];

const ONLINE: [usize; 6] = [0, 1, 2, 3, 5, 8];

fn parse(args: &[String], env: &[(&str, String)]) -> Result<Config, String> {
    let argv = std::iter::once("stompgate".to_string()).chain(args.iter().cloned());
    Config::parse_with(argv, |name| env.iter().find(|(n, _)| *n == name).map(|(_, v)| v.clone()), &ONLINE)
}

/// A TOML file in the temp dir, removed on drop.
struct TomlFile(std::path::PathBuf);

impl TomlFile {
    fn new(text: &str) -> TomlFile {
        static N: AtomicU64 = AtomicU64::new(0);
        let path = std::env::temp_dir().join(format!("stompgate-config-props-{}-{}.toml", std::process::id(), N.fetch_add(1, Ordering::Relaxed)));
        std::fs::write(&path, text).unwrap();
        TomlFile(path)
    }
}

impl Drop for TomlFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn setting() -> impl Strategy<Value = &'static Setting> {
    (0..SETTINGS.len()).prop_map(|i| &SETTINGS[i])
}

/// A u64 biased to the edges: 0, 1, the minimum's neighbourhood and u64::MAX.
fn number() -> impl Strategy<Value = u64> {
    prop_oneof![Just(0u64), Just(1), Just(2), Just(u64::MAX), Just(u64::MAX - 1), 0..100_000u64, any::<u64>()]
}

/// Whitespace around a number is accepted (values often come from env files).
fn padding() -> impl Strategy<Value = &'static str> {
    prop::sample::select(vec!["", " ", "\t", "  "])
}

/// Only the option's name ("heartbeat-ms") is sure to be in a reason.
fn name_of(s: &Setting) -> &'static str {
    s.flag.trim_start_matches("--")
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// A flag's number is taken exactly when it is at least the minimum, else refused naming
    /// the flag.
    #[test]
    fn flag_numbers_are_exact_or_refused(s in setting(), n in number(), pad in padding()) {
        let got = parse(&[s.flag.to_string(), format!("{pad}{n}{pad}")], &[]);
        if n >= s.min {
            prop_assert_eq!((s.get)(&got.unwrap()), n);
        } else {
            let e = got.unwrap_err();
            prop_assert!(e.contains(name_of(s)), "{}", e);
        }
    }

    /// The same number through the environment and the TOML file; flag > env > file.
    #[test]
    fn precedence_is_flag_then_env_then_file(
        s in setting(),
        values in prop::collection::vec(1_000u64..1_000_000, 3),
        use_flag in any::<bool>(),
        use_env in any::<bool>(),
    ) {
        let file = TomlFile::new(&format!("{} = {}\n", s.key, values[2]));
        let mut args = vec!["--config".to_string(), file.0.display().to_string()];
        if use_flag {
            args.extend([s.flag.to_string(), values[0].to_string()]);
        }
        let env: Vec<(&str, String)> = match (use_env, s.env) {
            (true, Some(name)) => vec![(name, values[1].to_string())],
            _ => vec![],
        };
        let want = if use_flag { values[0] } else if !env.is_empty() { values[1] } else { values[2] };
        prop_assert_eq!((s.get)(&parse(&args, &env).unwrap()), want);
    }

    /// Text that is not a non-negative whole number (a sign, a fraction, letters, an empty
    /// value, a number over u64::MAX) is refused, from a flag or from the environment, with the
    /// setting named; nothing panics.
    #[test]
    fn non_numbers_are_refused(
        s in setting(),
        junk in prop_oneof![
            Just("-1".to_string()),
            Just("1.5".to_string()),
            Just("18446744073709551616".to_string()),
            Just("99999999999999999999999".to_string()),
            Just("0x10".to_string()),
            Just("1e3".to_string()),
            Just("12 34".to_string()),
            "[a-z]{1,8}",
            "-[0-9]{1,5}",
        ],
        via_env in any::<bool>(),
    ) {
        let got = match (via_env, s.env) {
            (true, Some(name)) => parse(&[], &[(name, junk.clone())]),
            _ => parse(&[s.flag.to_string(), junk.clone()], &[]),
        };
        let e = got.unwrap_err();
        prop_assert!(!e.contains('\n'), "one line: {:?}", e);
        match (via_env, s.env) {
            (true, Some(name)) => prop_assert!(e.contains(name), "{}", e),
            _ => prop_assert!(e.contains(name_of(s)), "{}", e),
        }
    }

    /// Arbitrary text as any setting never panics; an error is one line.
    #[test]
    fn arbitrary_values_never_panic(s in setting(), value in "\\PC{0,24}", via_env in any::<bool>()) {
        let got = match (via_env, s.env) {
            (true, Some(name)) => parse(&[], &[(name, value)]),
            _ => parse(&[s.flag.to_string(), value], &[]),
        };
        if let Err(e) = got {
            prop_assert!(!e.contains('\n'), "{:?}", e);
        }
    }

    /// A CPU list written as any mix of singles and ranges over distinct online CPUs, in any
    /// order and with spaces, parses to exactly those CPUs in the written order.
    #[test]
    fn cpu_lists_are_exactly_the_cpus_written(
        cpus in Just(ONLINE.to_vec()).prop_shuffle().prop_flat_map(|v| (1..=v.len()).prop_map(move |n| v[..n].to_vec())),
        as_ranges in prop::collection::vec(any::<bool>(), ONLINE.len()),
        pad in padding(),
    ) {
        // Group consecutive runs (2,3 → "2-3") where asked, so ranges are exercised.
        let mut items = Vec::new();
        let mut i = 0;
        while i < cpus.len() {
            let mut j = i;
            while as_ranges[i] && j + 1 < cpus.len() && cpus[j + 1] == cpus[j] + 1 {
                j += 1;
            }
            items.push(if j > i { format!("{pad}{}{pad}-{pad}{}{pad}", cpus[i], cpus[j]) } else { format!("{pad}{}{pad}", cpus[i]) });
            i = j + 1;
        }
        let list = items.join(",");
        prop_assert_eq!(parse_cpu_list(&list, &ONLINE), Ok(cpus.clone()), "{:?}", list);
        // And through --cpus.
        prop_assert_eq!(parse(&["--cpus".into(), list], &[]).unwrap().cpus, cpus);
    }

    /// A list naming an offline CPU, a CPU twice, or a reversed range is refused.
    #[test]
    fn bad_cpu_lists_are_refused(
        good in prop::sample::subsequence(ONLINE.to_vec(), 0..3),
        bad in prop_oneof![
            (0usize..20).prop_filter("offline", |c| !ONLINE.contains(c)).prop_map(|c| c.to_string()),
            prop::sample::select(ONLINE.to_vec()).prop_map(|c| format!("{c},{c}")),
            Just("3-2".to_string()),
            Just("8-5".to_string()),
            Just("".to_string()),
            Just("1-".to_string()),
            Just("-1".to_string()),
            Just("a".to_string()),
        ],
        at_front in any::<bool>(),
    ) {
        let mut items: Vec<String> = good.iter().map(|c| c.to_string()).collect();
        // The "twice" case must collide with nothing else listed, so it stays the only fault.
        items.retain(|c| !bad.split(',').any(|b| b == c));
        if at_front { items.insert(0, bad.clone()) } else { items.push(bad.clone()) }
        let list = items.join(",");
        prop_assert!(parse_cpu_list(&list, &ONLINE).is_err(), "{:?} was accepted", list);
        // `--cpus=…`: a list starting with '-' must not read as another flag.
        let e = parse(&[format!("--cpus={list}")], &[]).unwrap_err();
        prop_assert!(e.contains("cpus"), "{}", e);
    }

    /// Arbitrary CPU-list text never panics, and what it accepts is online and unique.
    #[test]
    fn arbitrary_cpu_lists_are_safe(list in "[0-9,\\- ]{0,16}|\\PC{0,16}") {
        if let Ok(cpus) = parse_cpu_list(&list, &ONLINE) {
            prop_assert!(!cpus.is_empty());
            prop_assert!(cpus.iter().all(|c| ONLINE.contains(c)));
            let mut sorted = cpus.clone();
            sorted.sort_unstable();
            sorted.dedup();
            prop_assert_eq!(sorted.len(), cpus.len());
        }
    }

    /// --cores N is the first N online CPUs for 1..=online, refused otherwise.
    #[test]
    fn cores_are_the_first_n_online(n in 0usize..12) {
        let got = parse(&["--cores".into(), n.to_string()], &[]);
        if (1..=ONLINE.len()).contains(&n) {
            prop_assert_eq!(got.unwrap().cpus, ONLINE[..n].to_vec());
        } else {
            prop_assert!(got.unwrap_err().contains("cores"));
        }
    }

    /// The default pattern is one of four exact lower-case names (whitespace trimmed).
    #[test]
    fn default_pattern_names_are_exact(s in "\\PC{0,8}|(events|queues|store|none|Events|QUEUES| store )") {
        let want = match s.trim() {
            "events" => Some(DefaultPattern::Events),
            "queues" => Some(DefaultPattern::Queues),
            "store" => Some(DefaultPattern::Store),
            "none" => Some(DefaultPattern::None),
            _ => None,
        };
        prop_assert_eq!(parse_default_pattern(&s), want);
    }
}
