//! The built `stompgate` binary as a child process, for tests that need a process of its own:
//! a lowered open-files limit, its own metrics recorder, its own stderr.
use std::io::Read;
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running `stompgate` child; killed when dropped.
pub struct Gateway {
    child: Child,
    pub stomp_addr: SocketAddr,
    /// Drains stderr as it comes (a full pipe would block the child's logging).
    stderr: Option<std::thread::JoinHandle<String>>,
}

impl Gateway {
    /// Starts `stompgate --cores 1 --grpc-addr off --ws-addr off --stomp-addr <free port>` plus `args`, with
    /// RLIMIT_NOFILE set to `nofile` (soft and hard) when given, and waits until STOMP accepts.
    pub fn spawn(args: &[&str], nofile: Option<u64>) -> Gateway {
        let stomp_addr = super::metrics::free_port();
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_stompgate"));
        cmd.args(["--cores", "1", "--grpc-addr", "off", "--ws-addr", "off", "--amqp-addr", "off", "--stomp-addr", &stomp_addr.to_string()])
            .args(args)
            .env("STOMPGATE_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        if let Some(n) = nofile {
            use std::os::unix::process::CommandExt;
            // SAFETY: setrlimit is async-signal-safe, and only the child (after fork) runs it.
            unsafe {
                cmd.pre_exec(move || {
                    let lim = libc::rlimit { rlim_cur: n, rlim_max: n };
                    if libc::setrlimit(libc::RLIMIT_NOFILE, &lim) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
        }
        let mut child = cmd.spawn().expect("stompgate binary starts");
        let mut pipe = child.stderr.take().unwrap();
        let stderr = std::thread::spawn(move || {
            let mut text = String::new();
            let _ = pipe.read_to_string(&mut text);
            text
        });
        let gw = Gateway { child, stomp_addr, stderr: Some(stderr) };
        let deadline = Instant::now() + Duration::from_secs(20);
        while TcpStream::connect(stomp_addr).is_err() {
            assert!(Instant::now() < deadline, "stompgate did not listen on {stomp_addr}");
            std::thread::sleep(Duration::from_millis(50));
        }
        gw
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Descriptors the child has open now.
    pub fn open_fds(&self) -> usize {
        std::fs::read_dir(format!("/proc/{}/fd", self.pid())).map(|d| d.count()).unwrap_or(0)
    }

    /// CPU time (user + system) the child has used so far.
    pub fn cpu_time(&self) -> Duration {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.pid())).expect("/proc/PID/stat");
        // Fields after the `(comm)`: utime and stime are the 12th and 13th.
        let rest = &stat[stat.rfind(')').unwrap() + 2..];
        let f: Vec<&str> = rest.split(' ').collect();
        let ticks: u64 = f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap();
        // SAFETY: sysconf has no preconditions.
        let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as u64;
        Duration::from_millis(ticks * 1000 / hz)
    }

    /// Stops the child and returns what it wrote to stderr.
    pub fn stop(mut self) -> String {
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.stderr.take().and_then(|t| t.join().ok()).unwrap_or_default()
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
