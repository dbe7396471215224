//! `stompgate`: serve STOMP on the embedded array until SIGINT/SIGTERM.
use stompgate::config::Config;
use stompgate::runtime::Server;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    // Until their handlers are installed (below, after the listeners start), a stop or reload
    // signal waits instead of killing the gateway with its default action.
    signals_held(true);
    // Colours only for a person at a terminal: a log file or a collector gets plain text.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_env("STOMPGATE_LOG").unwrap_or_else(|_| "info".into()))
        .with_writer(std::io::stderr)
        .with_ansi(ansi)
        .init();
    let cfg = match Config::from_env_and_args() {
        Ok(cfg) => cfg,
        Err(reason) => {
            eprintln!("stompgate: {reason}");
            std::process::exit(2);
        }
    };
    raise_open_files_limit();
    let (grpc_addr, grpc_threads) = (cfg.grpc_addr, cfg.grpc_threads);
    // A gRPC subscriber buffers and parks exactly as a STOMP subscription does (`delivery`).
    let grpc_limits = stompgate::grpc::Limits { subscriber_buffer: cfg.sub_buff_size.max(1) };
    let cpus = cfg.cpus.clone();
    // With a remote array, native clients use the array's own gRPC API: serving ours would
    // expose an empty embedded array.
    let remote = match &cfg.array {
        stompgate::config::ArrayMode::Remote(r) => Some(r.uri()),
        stompgate::config::ArrayMode::Embedded => None,
    };
    let grpc_addr = if remote.is_some() { None } else { grpc_addr };
    let grpc_security = match stompgate::grpc::Security::from_config(cfg.grpc_tls.as_ref(), cfg.grpc_token.as_deref()) {
        Ok(s) => stompgate::grpc::Security { auth: cfg.auth.clone(), ..s },
        Err(e) => {
            eprintln!("stompgate: {e}");
            std::process::exit(1);
        }
    };
    // Before the cores and egress threads start: they take their metric handles at birth.
    if let Some(addr) = cfg.metrics_addr {
        if let Err(e) = stompgate::telemetry::install(addr) {
            eprintln!("stompgate: {e}");
            std::process::exit(1);
        }
        tracing::info!(%addr, "metrics at http://{addr}/metrics");
    }
    let auth = cfg.auth.clone();
    let server = match Server::start(cfg) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("stompgate: {e}");
            std::process::exit(1);
        }
    };
    let shared = server.shutdown_flag();
    reload_on_sighup(&auth, server.tls());
    // The handler only stores to an atomic flag, which each core's housekeeping tick reads.
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        if let Err(e) = signal_hook::flag::register(sig, shared.shutdown_flag()) {
            eprintln!("stompgate: cannot install signal handler: {e}");
            std::process::exit(1);
        }
    }
    // A signal that came while starting is delivered now, to this thread: every thread
    // started meanwhile inherited the blocked mask and keeps it.
    signals_held(false);
    stompgate::telemetry::serve_views(server.array());
    let plain = server.stomp_plain_addr().map_or_else(|| "off".into(), |a| a.to_string());
    let tls = server.stomp_tls_addr().map_or_else(|| "off".into(), |a| a.to_string());
    let (ws, wss) = (server.ws_addr(), server.ws_tls_addr());
    let ws = format!("{}{}", ws.map_or_else(|| "off".into(), |a| format!("ws://{a}")), wss.map(|a| format!(" wss://{a}")).unwrap_or_default());
    let amqp = server.amqp_addr().map_or_else(|| "off".into(), |a| a.to_string());
    let amqps = server.amqp_tls_addr().map_or_else(|| "off".into(), |a| a.to_string());
    match &remote {
        Some(array) => {
            tracing::info!(stomp = %plain, stomp_tls = %tls, websocket = %ws, %amqp, %amqps, cores = cpus.len(), cpus = ?cpus, %array, "stompgate listening (remote array; the gRPC API is the array's)")
        }
        None => {
            tracing::info!(stomp = %plain, stomp_tls = %tls, websocket = %ws, %amqp, %amqps, cores = cpus.len(), cpus = ?cpus, "stompgate listening (embedded array)")
        }
    }
    // Availability first (seed 003): a gRPC listener that cannot bind is logged and the
    // gateway runs on without it.
    let grpc = grpc_addr.and_then(|a| match stompgate::grpc::start_secured(a, grpc_threads, server.array(), grpc_limits, grpc_security) {
        Ok(g) => Some(g),
        Err(e) => {
            tracing::error!(grpc = %a, error = %e, "cannot start the gRPC API; continuing without it");
            None
        }
    });
    server.join();
    if let Some(g) = grpc {
        g.shutdown();
    }
    tracing::info!("stompgate stopped");
}

/// Blocks (`true`) or unblocks SIGINT, SIGTERM and SIGHUP for the calling thread. Blocked
/// from the start of `main`, so a stop sent while the gateway starts — its listeners may already
/// accept connections — stays pending until the handlers exist, rather than terminating the
/// process (a supervisor's or a test's SIGTERM right after the port answers used to do that).
fn signals_held(held: bool) {
    // SAFETY: sigemptyset/sigaddset fill a set on this stack; pthread_sigmask changes only
    // the calling thread's mask.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
            libc::sigaddset(&mut set, sig);
        }
        libc::pthread_sigmask(if held { libc::SIG_BLOCK } else { libc::SIG_UNBLOCK }, &set, std::ptr::null_mut());
    }
}

/// SIGHUP re-reads the `--authz-file` rules and the TLS certificate, key and client CA (a bad
/// file is logged and the old one stays; new connections use the new ones), on a thread of
/// its own: the handler itself only wakes it. Installed even with nothing to reload, so that
/// a SIGHUP never kills the gateway (its default action).
fn reload_on_sighup(auth: &stompgate::auth::Auth, tls: Option<std::sync::Arc<stompgate::tls::Tls>>) {
    let mut signals = match signal_hook::iterator::Signals::new([signal_hook::consts::SIGHUP]) {
        Ok(s) => s,
        Err(e) => {
            tracing::error!(error = %e, "cannot install the SIGHUP handler; reloading is off");
            return;
        }
    };
    let authz = auth.authz.clone();
    let spawned = std::thread::Builder::new().name("stompgate-sighup".into()).spawn(move || {
        for _ in signals.forever() {
            // Each `reload` logs its outcome either way.
            if let Some(a) = &authz {
                drop(a.reload());
            }
            if let Some(t) = &tls {
                t.reload();
            }
            if authz.is_none() && tls.is_none() {
                tracing::info!("SIGHUP: nothing to reload");
            }
        }
    });
    if let Err(e) = spawned {
        tracing::error!(error = %e, "cannot start the SIGHUP thread; reloading is off");
    }
}

/// Every connection is a descriptor: lift the soft RLIMIT_NOFILE to the hard limit, as servers
/// meant for many connections do, and say how many we can hold.
fn raise_open_files_limit() {
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit/setrlimit with a valid, writable rlimit struct.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) != 0 {
            return;
        }
        if lim.rlim_cur < lim.rlim_max {
            lim.rlim_cur = lim.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
        }
    }
    tracing::debug!(open_files = lim.rlim_cur, "open-files limit");
}
