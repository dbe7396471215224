//! CPU lists (`--cpus 0,2-3`), the core count (`--cores N`) and the CPUs this process may run
//! on.
use super::sources::{Raw, Source, Sources};
use super::values::{invalid, parse_uint, text};
use super::Config;

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
        let num = |t: &str| -> Result<usize, String> { t.trim().parse::<usize>().map_err(|_| format!("{item:?} is not a CPU id or range (e.g. 0,2-3)")) };
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
                return Err(format!("CPU {cpu} is not online (online: {})", format_cpu_list(online)));
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
        out.push(if start == end { start.to_string() } else { format!("{start}-{end}") });
        i += 1;
    }
    out.join(",")
}

/// The CPUs this process may run on (its affinity mask), ascending. `Err` when the OS cannot
/// tell us, which leaves nothing to pin executors to.
pub fn online_cpus() -> Result<Vec<usize>, String> {
    let mut ids: Vec<usize> = core_affinity::get_core_ids().unwrap_or_default().into_iter().map(|c| c.id).collect();
    ids.sort_unstable();
    ids.dedup();
    if ids.is_empty() {
        return Err("cannot list the online CPUs (sched_getaffinity failed)".into());
    }
    Ok(ids)
}

impl Config {
    /// The CPU plan from the highest source that has one: flags (`--cores`/`--cpus`, exclusive
    /// by clap), else the file (`cores`/`cpus`, also exclusive), else all online CPUs.
    pub(super) fn resolve_cpus<F: Fn(&str) -> Option<String>>(src: &Sources<'_, F>, online: &[usize]) -> Result<Vec<usize>, String> {
        let cores = |raw: Raw<'_>, source: Source<'_>| -> Result<Vec<usize>, String> {
            let n: usize = parse_uint(&raw, source, 1)?;
            if n > online.len() {
                return Err(invalid(source, format!("{n} cores requested but only {} CPUs are online", online.len())));
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
                (Some(_), Some(_)) => return Err(format!("invalid config file {}: cores and cpus are mutually exclusive", file.path)),
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

    const ONLINE: [usize; 4] = [0, 1, 2, 3];

    #[test]
    fn cpu_lists() {
        assert_eq!(parse_cpu_list("0,2-3", &ONLINE).unwrap(), vec![0, 2, 3]);
        assert_eq!(parse_cpu_list(" 3 , 0-1 ", &ONLINE).unwrap(), vec![3, 0, 1]);
        assert_eq!(parse_cpu_list("2-2", &ONLINE).unwrap(), vec![2]);
        assert_eq!(parse_cpu_list("0,0", &ONLINE).unwrap_err(), "CPU 0 is listed twice");
        assert_eq!(parse_cpu_list("0-2,1", &ONLINE).unwrap_err(), "CPU 1 is listed twice");
        assert_eq!(parse_cpu_list("3-2", &ONLINE).unwrap_err(), "reversed range \"3-2\"");
        assert_eq!(parse_cpu_list("0,4", &ONLINE).unwrap_err(), "CPU 4 is not online (online: 0-3)");
        assert_eq!(parse_cpu_list("1", &[0, 2, 3, 5]).unwrap_err(), "CPU 1 is not online (online: 0,2-3,5)");
        for bad in ["", " ", "0,", ",1", "a", "1-", "-1", "0-1-2", "1;2"] {
            assert!(parse_cpu_list(bad, &ONLINE).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn real_machine_has_online_cpus() {
        let online = online_cpus().unwrap();
        assert!(!online.is_empty());
        assert_eq!(Config::parse_from(["stompgate"], |_| None).unwrap().cpus, online);
    }
}
