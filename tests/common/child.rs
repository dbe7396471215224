//! The built `stompgate` binary as a child process, for tests that need a process of its own:
//! a lowered open-files limit, its own metrics recorder, its own stderr.
use std::io::Read;
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Resource limits for a child gateway (`setrlimit` before exec).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Limits {
    /// RLIMIT_NOFILE, soft and hard.
    pub nofile: Option<u64>,
    /// RLIMIT_FSIZE: no file the child writes may grow past this many bytes (a full disk, for
    /// the one file that grows: the store's segment). SIGXFSZ is ignored, so such a write
    /// fails with EFBIG.
    pub file_bytes: Option<u64>,
}

/// A running `stompgate` child; killed when dropped.
pub struct Gateway {
    child: Child,
    pub stomp_addr: SocketAddr,
    /// Drains stderr as it comes (a full pipe would block the child's logging).
    stderr: Option<std::thread::JoinHandle<String>>,
}

impl Gateway {
    /// Starts `stompgate --cores 1 --grpc-addr off --ws-addr off --amqp-addr off --store-dir off
    /// --stomp-addr <free port>` plus `args` (which may override all but the last; a test of
    /// persistence gives its own `--store-dir`, never the default ./store, whose lock parallel
    /// tests would share), with RLIMIT_NOFILE set to `nofile` (soft and hard) when given, and waits until STOMP accepts.
    pub fn spawn(args: &[&str], nofile: Option<u64>) -> Gateway {
        Self::spawn_limited(args, Limits { nofile, ..Limits::default() })
    }

    /// Like [`Gateway::spawn`], with the resource limits in `limits`.
    pub fn spawn_limited(args: &[&str], limits: Limits) -> Gateway {
        let stomp_addr = super::metrics::free_port();
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_stompgate"));
        // The defaults above, for each flag the test does not give itself (clap refuses a
        // flag given twice).
        let stomp = stomp_addr.to_string();
        for (flag, value) in [
            ("--cores", "1"),
            ("--grpc-addr", "off"),
            ("--ws-addr", "off"),
            ("--amqp-addr", "off"),
            ("--amqp-tls-addr", "off"),
            ("--store-dir", "off"),
            ("--stomp-addr", stomp.as_str()),
        ] {
            if !args.contains(&flag) {
                cmd.args([flag, value]);
            }
        }
        cmd.args(args).env("STOMPGATE_LOG", "info").stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::piped());
        if limits != Limits::default() {
            use std::os::unix::process::CommandExt;
            // SAFETY: setrlimit and signal are async-signal-safe, and only the child (after
            // fork) runs them.
            unsafe {
                cmd.pre_exec(move || {
                    let set = |resource, n: u64| {
                        let lim = libc::rlimit { rlim_cur: n, rlim_max: n };
                        if libc::setrlimit(resource, &lim) != 0 {
                            return Err(std::io::Error::last_os_error());
                        }
                        Ok(())
                    };
                    if let Some(n) = limits.nofile {
                        set(libc::RLIMIT_NOFILE, n)?;
                    }
                    if let Some(n) = limits.file_bytes {
                        set(libc::RLIMIT_FSIZE, n)?;
                        // A write past the limit then fails with EFBIG instead of killing the
                        // process (an ignored disposition survives exec).
                        libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
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
