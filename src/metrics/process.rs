//! Process metrics (`process_*`), read from `/proc/self` at render time.

use super::registry::{header, sample};

/// Fields of `/proc/<pid>/stat` after the command name, as numbers:
/// index 0 is the state field (field 3 of the man page).
fn stat_fields(stat: &str) -> Option<Vec<&str>> {
    // The command name may hold spaces and parentheses: the fields start
    // after its last ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    Some(rest.split_ascii_whitespace().collect())
}

/// The system's boot time (`btime` of /proc/stat), seconds since the epoch.
pub(crate) fn boot_time(proc_stat: &str) -> Option<u64> {
    proc_stat
        .lines()
        .find_map(|l| l.strip_prefix("btime "))
        .and_then(|v| v.trim().parse().ok())
}

pub(crate) fn clock_ticks() -> f64 {
    // SAFETY: sysconf has no memory effects.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 {
        t as f64
    } else {
        100.0
    }
}

fn page_size() -> f64 {
    // SAFETY: sysconf has no memory effects.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if p > 0 {
        p as f64
    } else {
        4096.0
    }
}

/// Process facts from `stat` (of /proc/self), `btime` and the tick rate:
/// (CPU seconds, resident bytes, start time in seconds since the epoch).
fn from_stat(stat: &str, btime: Option<u64>, ticks: f64, page: f64) -> Option<(f64, f64, f64)> {
    let f = stat_fields(stat)?;
    // Man page fields 14, 15 (utime, stime), 22 (starttime), 24 (rss).
    let num = |i: usize| f.get(i - 3).and_then(|v| v.parse::<u64>().ok());
    let cpu = (num(14)? + num(15)?) as f64 / ticks;
    let rss = num(24)? as f64 * page;
    let start = btime.map_or(0.0, |b| b as f64 + num(22).unwrap_or(0) as f64 / ticks);
    Some((cpu, rss, start))
}

/// Writes the process metrics; a fact that cannot be read is left out.
pub(crate) fn render(out: &mut String) {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let btime = std::fs::read_to_string("/proc/stat")
        .ok()
        .and_then(|s| boot_time(&s));
    if let Some((cpu, rss, start)) = from_stat(&stat, btime, clock_ticks(), page_size()) {
        header(
            out,
            "process_cpu_seconds_total",
            "Total user and system CPU time spent in seconds.",
            "counter",
        );
        sample(out, "process_cpu_seconds_total", &[], cpu);
        header(
            out,
            "process_resident_memory_bytes",
            "Resident memory size in bytes.",
            "gauge",
        );
        sample(out, "process_resident_memory_bytes", &[], rss);
        if start > 0.0 {
            header(
                out,
                "process_start_time_seconds",
                "Start time of the process since unix epoch in seconds.",
                "gauge",
            );
            sample(out, "process_start_time_seconds", &[], start);
        }
    }
    if let Ok(dir) = std::fs::read_dir("/proc/self/fd") {
        // The directory handle itself is one of the entries.
        let fds = dir.count().saturating_sub(1);
        header(
            out,
            "process_open_fds",
            "Number of open file descriptors.",
            "gauge",
        );
        sample(out, "process_open_fds", &[], fds as f64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_with_a_strange_command_name() {
        // pid (comm) state ppid ... : utime=250, stime=50, starttime=1000, rss=300
        let mut fields = vec!["0"; 50];
        fields[0] = "S";
        fields[14 - 3] = "250";
        fields[15 - 3] = "50";
        fields[22 - 3] = "1000";
        fields[24 - 3] = "300";
        let stat = format!("42 (a) b (c)) {}", fields.join(" "));
        let (cpu, rss, start) = from_stat(&stat, Some(1_700_000_000), 100.0, 4096.0).unwrap();
        assert_eq!(cpu, 3.0);
        assert_eq!(rss, 300.0 * 4096.0);
        assert_eq!(start, 1_700_000_010.0);
        assert!(from_stat("garbage", None, 100.0, 4096.0).is_none());
        assert_eq!(boot_time("cpu 1 2\nbtime 12345\n"), Some(12345));
    }
}
