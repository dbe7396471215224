//! CPU and memory readings: the harness's own (`getrusage`) and the server's (`/proc/PID`).

use std::fs;

/// User + system CPU seconds this process has used so far.
pub fn self_cpu_s() -> f64 {
    // SAFETY: getrusage only writes the struct we pass.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: valid pointer to a properly sized rusage.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) } != 0 {
        return 0.0;
    }
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

/// Raises RLIMIT_NOFILE's soft limit to the hard limit; returns the new soft limit.
pub fn raise_nofile() -> u64 {
    // SAFETY: getrlimit/setrlimit only read/write the struct we pass.
    unsafe {
        let mut rl: libc::rlimit = std::mem::zeroed();
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut rl) != 0 {
            return 0;
        }
        if rl.rlim_cur < rl.rlim_max {
            let want = libc::rlimit { rlim_cur: rl.rlim_max, rlim_max: rl.rlim_max };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &want) == 0 {
                return want.rlim_cur;
            }
        }
        rl.rlim_cur
    }
}

/// A server process observed through `/proc`.
#[derive(Clone, Copy, Debug)]
pub struct Server {
    pub pid: u32,
}

impl Server {
    /// utime + stime of the whole process (all threads), in seconds.
    pub fn cpu_s(&self) -> Option<f64> {
        let stat = fs::read_to_string(format!("/proc/{}/stat", self.pid)).ok()?;
        // Fields after the parenthesised command name, which may contain spaces.
        let rest = &stat[stat.rfind(')')? + 2..];
        let mut f = rest.split_ascii_whitespace();
        // rest starts at field 3 (state); utime and stime are fields 14 and 15.
        let utime: u64 = f.nth(11)?.parse().ok()?;
        let stime: u64 = f.next()?.parse().ok()?;
        // SAFETY: sysconf has no memory effects.
        let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
        let hz = if hz > 0 { hz as f64 } else { 100.0 };
        Some((utime + stime) as f64 / hz)
    }

    /// VmRSS in KiB.
    pub fn rss_kib(&self) -> Option<u64> {
        let status = fs::read_to_string(format!("/proc/{}/status", self.pid)).ok()?;
        let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
        line.split_ascii_whitespace().nth(1)?.parse().ok()
    }

    /// Fails early with a clear message when the pid is not a readable process.
    pub fn check(&self) -> Result<(), String> {
        match self.cpu_s() {
            Some(_) => Ok(()),
            None => Err(format!("--server-pid {}: cannot read /proc/{}/stat", self.pid, self.pid)),
        }
    }
}

/// CPU of the harness and, if given, the server, between two points.
#[derive(Clone, Copy, Debug)]
pub struct CpuMark {
    pub self_s: f64,
    pub server_s: Option<f64>,
}

impl CpuMark {
    pub fn take(server: Option<Server>) -> CpuMark {
        CpuMark { self_s: self_cpu_s(), server_s: server.and_then(|s| s.cpu_s()) }
    }

    /// (harness seconds, server seconds) from `self` to `later`.
    pub fn until(&self, later: &CpuMark) -> (f64, Option<f64>) {
        let server = match (self.server_s, later.server_s) {
            (Some(a), Some(b)) => Some(b - a),
            _ => None,
        };
        (later.self_s - self.self_s, server)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_own_proc_entries() {
        let me = Server { pid: std::process::id() };
        assert!(me.cpu_s().is_some());
        assert!(me.rss_kib().unwrap() > 0);
        assert!(self_cpu_s() >= 0.0);
    }
}
