//! The node's memory, disk and PID pressure against the default hard
//! eviction thresholds (used where no eviction manager runs), read from
//! /proc and statvfs, and the words of the Node's pressure conditions.

use std::path::Path;

use super::{fs_stats, meminfo_bytes, FsStats, NODEFS_AVAILABLE_FRACTION};

/// The node's resource pressure, the eviction signals behind the Node's
/// MemoryPressure, DiskPressure and PIDPressure conditions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Pressure {
    pub(crate) memory: bool,
    pub(crate) disk: bool,
    pub(crate) pid: bool,
}

/// Hard eviction thresholds: a signal below its threshold means pressure.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct EvictionThresholds {
    /// memory.available, bytes.
    pub(crate) memory_available: u64,
    /// nodefs.available, a fraction of the filesystem's capacity.
    pub(crate) nodefs_available: f32,
    /// nodefs.inodesFree, a fraction of the filesystem's inodes.
    pub(crate) nodefs_inodes_free: f32,
    /// pid.available, a fraction of the PID limit.
    pub(crate) pid_available: f32,
}

/// The kubelet's default hard eviction thresholds on Linux:
/// memory.available<100Mi, nodefs.available<10%, nodefs.inodesFree<5%,
/// pid.available<10%. (imagefs.available<15% has no counterpart here: the
/// image filesystem is containerd's.)
pub(crate) const DEFAULT_EVICTION_HARD: EvictionThresholds = EvictionThresholds {
    memory_available: 100 << 20,
    nodefs_available: NODEFS_AVAILABLE_FRACTION,
    nodefs_inodes_free: 0.05,
    pid_available: 0.10,
};

/// [`pressure_with`] the default thresholds.
pub(crate) fn pressure(
    meminfo_text: &str,
    root_fs: &FsStats,
    pid_max: u64,
    pids_in_use: u64,
) -> Pressure {
    pressure_with(
        &DEFAULT_EVICTION_HARD,
        meminfo_text,
        root_fs,
        pid_max,
        pids_in_use,
    )
}

/// Pressure from the signals, each compared strictly (available below the
/// threshold is pressure, equal is not):
/// - memory: MemAvailable of /proc/meminfo text (MemFree + Buffers +
///   Cached on kernels without it; neither: no pressure);
/// - disk: available bytes or free inodes of the kubelet's filesystem (a
///   filesystem reporting 0 inodes has no inode signal);
/// - pid: `pid_max - pids_in_use`.
pub(crate) fn pressure_with(
    t: &EvictionThresholds,
    meminfo_text: &str,
    root_fs: &FsStats,
    pid_max: u64,
    pids_in_use: u64,
) -> Pressure {
    let frac = |cap: u64, f: f32| (cap as f64 * f64::from(f)) as u64;
    let mem_available = meminfo_bytes(meminfo_text, "MemAvailable").or_else(|| {
        let f = |k| meminfo_bytes(meminfo_text, k);
        Some(f("MemFree")? + f("Buffers").unwrap_or(0) + f("Cached").unwrap_or(0))
    });
    let memory = mem_available.is_some_and(|a| a < t.memory_available);
    let bytes_low =
        root_fs.capacity > 0 && root_fs.available < frac(root_fs.capacity, t.nodefs_available);
    let inodes_low =
        root_fs.inodes > 0 && root_fs.inodes_free < frac(root_fs.inodes, t.nodefs_inodes_free);
    let pid = pid_max > 0 && pid_max.saturating_sub(pids_in_use) < frac(pid_max, t.pid_available);
    Pressure {
        memory,
        disk: bytes_low || inodes_low,
        pid,
    }
}

/// Reads the pressure signals of this host: /proc/meminfo, statvfs of
/// `root_dir` (the kubelet's root directory), the PID limit (the smaller of
/// /proc/sys/kernel/pid_max and threads-max, as upstream) and the number of
/// tasks (the total of /proc/loadavg's fourth field: threads, which take
/// PIDs too). A signal that cannot be read counts as no pressure, logged.
pub(crate) fn read_pressure(root_dir: &Path) -> Pressure {
    read_pressure_in(Path::new("/proc"), root_dir)
}

/// [`read_pressure`] with /proc at `proc_root`.
pub(crate) fn read_pressure_in(proc_root: &Path, root_dir: &Path) -> Pressure {
    let read = |rel: &str| {
        let p = proc_root.join(rel);
        std::fs::read_to_string(&p)
            .map_err(|e| log::warn!("{}: {e}", p.display()))
            .ok()
    };
    let meminfo = read("meminfo").unwrap_or_default();
    let fs = fs_stats(root_dir)
        .map_err(|e| log::warn!("{e}"))
        .unwrap_or_default();
    let number = |rel: &str| read(rel).and_then(|t| t.trim().parse::<u64>().ok());
    let pid_max = match (
        number("sys/kernel/pid_max"),
        number("sys/kernel/threads-max"),
    ) {
        (Some(a), Some(b)) => a.min(b),
        (a, b) => a.or(b).unwrap_or(0),
    };
    let tasks = read("loadavg").and_then(|t| loadavg_tasks(&t)).unwrap_or(0);
    pressure(&meminfo, &fs, pid_max, tasks)
}

/// The total in /proc/loadavg's "running/total" field.
pub(crate) fn loadavg_tasks(loadavg: &str) -> Option<u64> {
    loadavg
        .split_whitespace()
        .nth(3)?
        .split_once('/')?
        .1
        .parse()
        .ok()
}

/// The three pressure conditions of a Node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PressureKind {
    Memory,
    Disk,
    Pid,
}

impl PressureKind {
    /// The condition's `type`.
    pub(crate) fn condition_type(self) -> &'static str {
        match self {
            PressureKind::Memory => "MemoryPressure",
            PressureKind::Disk => "DiskPressure",
            PressureKind::Pid => "PIDPressure",
        }
    }
}

/// (status, reason, message) of a pressure condition, the kubelet's words.
pub(crate) fn condition_reason_message(
    kind: PressureKind,
    pressure: bool,
) -> (&'static str, &'static str, &'static str) {
    match (kind, pressure) {
        (PressureKind::Memory, false) => (
            "False",
            "KubeletHasSufficientMemory",
            "kubelet has sufficient memory available",
        ),
        (PressureKind::Memory, true) => (
            "True",
            "KubeletHasInsufficientMemory",
            "kubelet has insufficient memory available",
        ),
        (PressureKind::Disk, false) => (
            "False",
            "KubeletHasNoDiskPressure",
            "kubelet has no disk pressure",
        ),
        (PressureKind::Disk, true) => (
            "True",
            "KubeletHasDiskPressure",
            "kubelet has disk pressure",
        ),
        (PressureKind::Pid, false) => (
            "False",
            "KubeletHasSufficientPID",
            "kubelet has sufficient PID available",
        ),
        (PressureKind::Pid, true) => (
            "True",
            "KubeletHasInsufficientPID",
            "kubelet has insufficient PID available",
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::node::machine::write;

    fn fs(capacity: u64, available: u64, inodes: u64, inodes_free: u64) -> FsStats {
        FsStats {
            capacity,
            available,
            inodes,
            inodes_free,
        }
    }

    #[test]
    fn pressure_thresholds_on_both_sides() {
        let roomy = fs(1000 << 20, 500 << 20, 1000, 500);
        let mem = |kib: u64| format!("MemTotal: 4000000 kB\nMemAvailable: {kib} kB\n");
        // memory.available < 100Mi (102400 KiB).
        assert!(!pressure(&mem(102400), &roomy, 1000, 10).memory);
        assert!(pressure(&mem(102399), &roomy, 1000, 10).memory);
        // Without MemAvailable: MemFree + Buffers + Cached.
        let old = "MemFree: 50000 kB\nBuffers: 2400 kB\nCached: 50000 kB\n";
        assert!(!pressure(old, &roomy, 1000, 10).memory);
        assert!(pressure("MemFree: 50000 kB\n", &roomy, 1000, 10).memory);
        assert!(!pressure("", &roomy, 1000, 10).memory);

        let ok = mem(1 << 20);
        // nodefs.available < 10% of capacity (float32 0.1 of 1000 is 100).
        assert!(!pressure(&ok, &fs(1000, 100, 0, 0), 1000, 10).disk);
        assert!(pressure(&ok, &fs(1000, 99, 0, 0), 1000, 10).disk);
        // nodefs.inodesFree < 5%.
        assert!(!pressure(&ok, &fs(1000, 500, 1000, 50), 1000, 10).disk);
        assert!(pressure(&ok, &fs(1000, 500, 1000, 49), 1000, 10).disk);
        // A filesystem without inode counts or stats has no disk signal.
        assert!(!pressure(&ok, &fs(1000, 500, 0, 0), 1000, 10).disk);
        assert!(!pressure(&ok, &FsStats::default(), 1000, 10).disk);

        // pid.available < 10% of the PID limit.
        assert!(!pressure(&ok, &roomy, 1000, 900).pid);
        assert!(pressure(&ok, &roomy, 1000, 901).pid);
        assert!(pressure(&ok, &roomy, 1000, 5000).pid);
        assert!(!pressure(&ok, &roomy, 0, 10).pid);

        let all = pressure(&mem(1), &fs(1000, 1, 1000, 1), 100, 100);
        assert_eq!(
            all,
            Pressure {
                memory: true,
                disk: true,
                pid: true
            }
        );
    }

    #[test]
    fn pressure_read_from_a_proc_tree() {
        let dir = tempfile::tempdir().unwrap();
        let proc = dir.path();
        write(proc, "meminfo", "MemAvailable: 1000 kB\n");
        write(proc, "sys/kernel/pid_max", "4194304\n");
        write(proc, "sys/kernel/threads-max", "1000\n");
        write(proc, "loadavg", "0.10 0.20 0.30 2/950 4242\n");
        let p = read_pressure_in(proc, Path::new("/"));
        assert!(p.memory);
        // threads-max (1000) is the limit; 950 tasks leave 50 < 100.
        assert!(p.pid);
        write(proc, "loadavg", "0.10 0.20 0.30 2/900 4242\n");
        assert!(!read_pressure_in(proc, Path::new("/")).pid);
        assert_eq!(loadavg_tasks("5.75 4.08 1.91 9/123 20183\n"), Some(123));
        assert_eq!(loadavg_tasks("garbage"), None);
        // This host is not out of PIDs.
        assert!(!read_pressure(Path::new("/")).pid);
    }

    #[test]
    fn condition_words() {
        use PressureKind::*;
        let cases = [
            (
                Memory,
                false,
                (
                    "False",
                    "KubeletHasSufficientMemory",
                    "kubelet has sufficient memory available",
                ),
            ),
            (
                Memory,
                true,
                (
                    "True",
                    "KubeletHasInsufficientMemory",
                    "kubelet has insufficient memory available",
                ),
            ),
            (
                Disk,
                false,
                (
                    "False",
                    "KubeletHasNoDiskPressure",
                    "kubelet has no disk pressure",
                ),
            ),
            (
                Disk,
                true,
                (
                    "True",
                    "KubeletHasDiskPressure",
                    "kubelet has disk pressure",
                ),
            ),
            (
                Pid,
                false,
                (
                    "False",
                    "KubeletHasSufficientPID",
                    "kubelet has sufficient PID available",
                ),
            ),
            (
                Pid,
                true,
                (
                    "True",
                    "KubeletHasInsufficientPID",
                    "kubelet has insufficient PID available",
                ),
            ),
        ];
        for (kind, p, want) in cases {
            assert_eq!(condition_reason_message(kind, p), want, "{kind:?} {p}");
        }
        assert_eq!(Memory.condition_type(), "MemoryPressure");
        assert_eq!(Disk.condition_type(), "DiskPressure");
        assert_eq!(Pid.condition_type(), "PIDPressure");
    }
}
