//! Starting and stopping the gateway repeatedly never hangs: every core joins the mesh and
//! binds its listener, even when cores start while others are parked (glommio's mesh join
//! could miss that wake-up).
use crate::common;
use common::*;

#[test]
fn start_and_stop_twenty_times() {
    for _ in 0..20 {
        let server = TestServer::start();
        let mut c = server.client();
        assert_eq!(c.connect("1.2").command, "CONNECTED");
        server.stop();
    }
}

/// A gateway stopped while clients were connected leaves its side of their connections in
/// TIME_WAIT; the next gateway on the same fixed port must still start at once: the start-up
/// probe for another process's listener (`runtime::listeners`) must not mistake those for one.
#[test]
fn a_restart_on_the_same_port_right_after_a_stop_or_a_kill_with_clients_works() {
    use std::io::{Read, Write};
    use std::net::TcpStream;
    use std::process::{Command, Stdio};
    use std::time::{Duration, Instant};
    let addr = common::metrics::free_port();
    let start = || {
        Command::new(env!("CARGO_BIN_EXE_stompgate"))
            .args(["--cores", "2", "--grpc-addr", "off", "--ws-addr", "off", "--amqp-addr", "off", "--store-dir", "off", "--stomp-addr", &addr.to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            // Piped, read after exit: a few start-up lines, far below the pipe's buffer.
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    // `after_kill`: a connection may land on a SIGKILLed gateway's listener, which the kernel
    // keeps until it tears that process's io_uring down, and be reset: the client retries.
    let connected_client = |child: &mut std::process::Child, after_kill: bool| {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                panic!("the gateway exited ({status}) instead of listening on {addr}");
            }
            if let Ok(mut s) = TcpStream::connect(addr) {
                s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
                s.write_all(b"CONNECT\naccept-version:1.2\nhost:/\n\n\0").unwrap();
                let mut buf = [0u8; 9];
                match s.read_exact(&mut buf) {
                    Err(e) if after_kill && e.kind() == std::io::ErrorKind::ConnectionReset => {}
                    read => {
                        read.unwrap();
                        assert_eq!(&buf, b"CONNECTED");
                        return s;
                    }
                }
            }
            assert!(Instant::now() < deadline, "the gateway never listened on {addr}");
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    let mut first = start();
    // Each client leaves with DISCONNECT: the gateway closes first, so its side of each
    // connection stays in TIME_WAIT (as after any load run).
    for _ in 0..4 {
        let mut c = connected_client(&mut first, false);
        c.write_all(b"DISCONNECT\nreceipt:bye\n\n\0").unwrap();
        let mut rest = Vec::new();
        let _ = c.read_to_end(&mut rest);
        assert!(String::from_utf8_lossy(&rest).contains("receipt-id:bye"), "DISCONNECT's receipt, then the gateway's close");
    }
    // SAFETY: kill(2) on our own child's pid.
    assert_eq!(unsafe { libc::kill(first.id() as i32, libc::SIGTERM) }, 0);
    let status = first.wait().unwrap();
    let mut log = String::new();
    let _ = first.stderr.take().map(|mut e| e.read_to_string(&mut log));
    assert!(status.success(), "SIGTERM must stop the gateway cleanly: {status}; its stderr:\n{log}");
    // At once: a stopped gateway's listener must be gone with it. (It used to outlive the
    // process inside io_uring's teardown: this connect then landed in its backlog and was
    // reset, and the next start found the port "in use by another process".)
    assert!(TcpStream::connect(addr).is_err(), "nothing listens on {addr} once the gateway has exited");
    let mut second = start();
    let _client = connected_client(&mut second, false);
    // SIGKILL with a client connected, and a restart at once, as a supervisor does: the start
    // waits out the dead process's listener instead of refusing the port.
    second.kill().unwrap();
    second.wait().unwrap();
    let mut third = start();
    let _client = connected_client(&mut third, true);
    third.kill().unwrap();
    third.wait().unwrap();
}

/// A stop signal that arrives while the gateway is still starting waits for its handler and
/// then stops the gateway cleanly (exit 0), instead of killing it with the default action.
/// The moment is made exact by watching the main thread's blocked-signal mask in /proc: the
/// SIGTERM is sent as soon as `main` holds it, long before the listeners are up.
#[test]
fn a_sigterm_while_starting_waits_and_then_stops_the_gateway_cleanly() {
    use std::process::{Command, Stdio};
    use std::time::{Duration, Instant};
    let addr = common::metrics::free_port();
    let mut child = Command::new(env!("CARGO_BIN_EXE_stompgate"))
        .args(["--cores", "2", "--grpc-addr", "off", "--ws-addr", "off", "--amqp-addr", "off", "--store-dir", "off", "--stomp-addr", &addr.to_string()])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // Before exec the child is still a copy of this test process (with every signal blocked
    // around the spawn): only the gateway's own mask counts, once its name is `stompgate`.
    let status_file = format!("/proc/{}/status", child.id());
    let sigterm_bit = 1u64 << (libc::SIGTERM - 1);
    let deadline = Instant::now() + Duration::from_secs(10);
    let held = loop {
        let blocked = std::fs::read_to_string(&status_file)
            .ok()
            .filter(|s| s.lines().next() == Some("Name:\tstompgate"))
            .and_then(|s| s.lines().find_map(|l| l.strip_prefix("SigBlk:").map(|v| u64::from_str_radix(v.trim(), 16).unwrap_or(0))))
            .unwrap_or(0);
        if blocked & sigterm_bit != 0 {
            break true;
        }
        if Instant::now() > deadline || std::net::TcpStream::connect(addr).is_ok() {
            break false;
        }
    };
    // SAFETY: kill(2) on our own child's pid.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGTERM) }, 0);
    let status = child.wait().unwrap();
    assert!(held, "the gateway never held SIGTERM while starting (it listened, or 10 s passed, first)");
    assert!(status.success(), "a SIGTERM during start-up must stop the gateway cleanly: {status}");
}
