//! What this machine is, for the Node's `status.nodeInfo` and capacity:
//! cores, memory and huge pages, machine and boot ids, kernel, OS image and
//! architecture, read from /proc, /sys and /etc (or an injected root).

use std::ffi::CStr;
use std::path::Path;

/// What the Node's `status.nodeInfo` and capacity say about this host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct MachineInfo {
    /// Logical CPUs (the "processor" entries of /proc/cpuinfo).
    pub(crate) num_cores: u32,
    /// Bytes: MemTotal of /proc/meminfo (given there in KiB).
    pub(crate) memory_capacity: u64,
    /// /etc/machine-id, else /var/lib/dbus/machine-id; empty if neither.
    pub(crate) machine_id: String,
    /// DMI product_uuid, else the device-tree system id, else the machine
    /// id (as cAdvisor does on hosts without DMI, e.g. microVMs); may be
    /// empty.
    pub(crate) system_uuid: String,
    /// /proc/sys/kernel/random/boot_id.
    pub(crate) boot_id: String,
    /// The kernel release (uname -r).
    pub(crate) kernel_version: String,
    /// PRETTY_NAME of /etc/os-release, else NAME, else "Linux".
    pub(crate) os_image: String,
    /// Go's GOARCH name for this build's architecture (see [`go_arch`]).
    pub(crate) architecture: &'static str,
    /// Go's GOOS: always "linux".
    pub(crate) operating_system: &'static str,
    /// Huge page pools: (page size in bytes, pages reserved), from
    /// /sys/kernel/mm/hugepages. The kubelet reports each as a
    /// `hugepages-<size>` resource, "0" when none are reserved.
    pub(crate) huge_pages: Vec<(u64, u64)>,
}

/// Reads the machine facts of this host. Files that cannot be read give
/// empty strings (or zero), logged, as the kubelet tolerates them.
pub(crate) fn read_machine_info() -> MachineInfo {
    let mut info = read_machine_info_at(Path::new("/"));
    if let Some(release) = uname_release() {
        info.kernel_version = release;
    }
    if info.num_cores == 0 {
        info.num_cores = std::thread::available_parallelism()
            .map(|n| n.get() as u32)
            .unwrap_or(1);
    }
    info
}

/// Reads the machine facts from a tree laid out like `/` under `root`
/// (proc/cpuinfo, proc/meminfo, etc/machine-id, ...). The kernel version
/// comes from proc/sys/kernel/osrelease. `num_cores` is 0 when cpuinfo
/// lists no processors.
pub(crate) fn read_machine_info_at(root: &Path) -> MachineInfo {
    let read = |rel: &str| std::fs::read_to_string(root.join(rel)).ok();
    let trimmed = |rel: &str| {
        read(rel)
            .map(|s| {
                s.trim_matches(|c: char| c.is_whitespace() || c == '\0')
                    .to_string()
            })
            .filter(|s| !s.is_empty())
    };

    let num_cores = read("proc/cpuinfo").map_or(0, |t| count_processors(&t));
    let memory_capacity = match read("proc/meminfo").and_then(|t| meminfo_bytes(&t, "MemTotal")) {
        Some(b) => b,
        None => {
            log::warn!("{}: no MemTotal", root.join("proc/meminfo").display());
            0
        }
    };
    let machine_id = trimmed("etc/machine-id")
        .or_else(|| trimmed("var/lib/dbus/machine-id"))
        .unwrap_or_default();
    let system_uuid = trimmed("sys/class/dmi/id/product_uuid")
        .or_else(|| trimmed("proc/device-tree/system-id"))
        .or_else(|| trimmed("proc/device-tree/vm,uuid"))
        .unwrap_or_else(|| machine_id.clone());
    let boot_id = trimmed("proc/sys/kernel/random/boot_id").unwrap_or_default();
    let kernel_version = trimmed("proc/sys/kernel/osrelease").unwrap_or_default();
    let os_image = read("etc/os-release")
        .or_else(|| read("usr/lib/os-release"))
        .map_or_else(|| "Linux".to_string(), |t| os_image(&t));
    MachineInfo {
        num_cores,
        memory_capacity,
        machine_id,
        system_uuid,
        boot_id,
        kernel_version,
        os_image,
        architecture: go_arch(),
        operating_system: "linux",
        huge_pages: read_huge_pages(&root.join("sys/kernel/mm/hugepages")),
    }
}

/// The number of "processor : N" entries in /proc/cpuinfo text.
pub(crate) fn count_processors(cpuinfo: &str) -> u32 {
    cpuinfo
        .lines()
        .filter(|l| {
            l.split_once(':')
                .is_some_and(|(k, _)| k.trim() == "processor")
        })
        .count() as u32
}

/// A /proc/meminfo field in bytes (the file gives KiB), if present.
pub(crate) fn meminfo_bytes(meminfo: &str, field: &str) -> Option<u64> {
    meminfo.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        if k.trim() != field {
            return None;
        }
        let mut parts = v.split_whitespace();
        let n: u64 = parts.next()?.parse().ok()?;
        match parts.next() {
            Some("kB") => n.checked_mul(1024),
            None => Some(n),
            Some(_) => None,
        }
    })
}

/// The OS image from /etc/os-release text: PRETTY_NAME, else NAME, else
/// "Linux".
pub(crate) fn os_image(os_release: &str) -> String {
    let field = |key: &str| {
        os_release.lines().find_map(|l| {
            let v = l.trim().strip_prefix(key)?.strip_prefix('=')?;
            let v = unquote(v.trim());
            (!v.is_empty()).then_some(v)
        })
    };
    field("PRETTY_NAME")
        .or_else(|| field("NAME"))
        .unwrap_or_else(|| "Linux".to_string())
}

/// Removes shell-style quotes from an os-release value.
fn unquote(v: &str) -> String {
    for q in ['"', '\''] {
        if let Some(inner) = v.strip_prefix(q).and_then(|s| s.strip_suffix(q)) {
            if q == '\'' {
                return inner.to_string();
            }
            let mut out = String::with_capacity(inner.len());
            let mut chars = inner.chars();
            while let Some(c) = chars.next() {
                match c {
                    '\\' => out.extend(chars.next()),
                    c => out.push(c),
                }
            }
            return out;
        }
    }
    v.to_string()
}

/// The huge page pools under a /sys/kernel/mm/hugepages directory, sorted
/// by page size. Missing directory: none.
fn read_huge_pages(dir: &Path) -> Vec<(u64, u64)> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut pools: Vec<(u64, u64)> = entries
        .flatten()
        .filter_map(|e| {
            let name = e.file_name();
            let kib: u64 = name
                .to_str()?
                .strip_prefix("hugepages-")?
                .strip_suffix("kB")?
                .parse()
                .ok()?;
            let nr = std::fs::read_to_string(e.path().join("nr_hugepages")).ok()?;
            match nr.trim().parse() {
                Ok(n) => Some((kib.checked_mul(1024)?, n)),
                Err(_) => {
                    log::warn!("{}: not a number", e.path().join("nr_hugepages").display());
                    None
                }
            }
        })
        .collect();
    pools.sort_unstable();
    pools
}

/// The running kernel's release string.
fn uname_release() -> Option<String> {
    // SAFETY: utsname is plain bytes; uname fills it or fails.
    let mut u: libc::utsname = unsafe { std::mem::zeroed() };
    if unsafe { libc::uname(&mut u) } != 0 {
        return None;
    }
    // SAFETY: the kernel NUL-terminates release within the array.
    let release = unsafe { CStr::from_ptr(u.release.as_ptr()) };
    Some(release.to_string_lossy().into_owned())
}

/// This build's architecture under Go's GOARCH name, which is what the
/// kubelet writes to `nodeInfo.architecture` and the `kubernetes.io/arch`
/// label.
pub(crate) fn go_arch() -> &'static str {
    go_arch_of(std::env::consts::ARCH, cfg!(target_endian = "little"))
}

fn go_arch_of(rust_arch: &'static str, little_endian: bool) -> &'static str {
    match (rust_arch, little_endian) {
        ("x86_64", _) => "amd64",
        ("x86", _) => "386",
        ("aarch64", true) => "arm64",
        ("aarch64", false) => "arm64be",
        ("arm", _) => "arm",
        ("powerpc64", true) => "ppc64le",
        ("powerpc64", false) => "ppc64",
        ("powerpc", _) => "ppc",
        ("mips", true) => "mipsle",
        ("mips", false) => "mips",
        ("mips64", true) => "mips64le",
        ("mips64", false) => "mips64",
        ("loongarch64", _) => "loong64",
        // riscv64, s390x, sparc64, wasm32 share Go's spelling.
        (other, _) => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::node::machine::write;

    const CPUINFO: &str = "processor\t: 0\nvendor_id\t: GenuineIntel\nmodel name\t: Xeon\n\n\
        processor\t: 1\nvendor_id\t: GenuineIntel\nmodel name\t: Xeon\n\n";

    // The shape of /proc/meminfo; MemTotal is the recorded node's.
    const MEMINFO: &str = "MemTotal:       24684092 kB\nMemFree:         1000000 kB\n\
        MemAvailable:   20000000 kB\nBuffers:          100000 kB\nCached:          2000000 kB\n\
        HugePages_Total:       0\n";

    #[test]
    fn machine_info_from_a_root() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        write(root, "proc/cpuinfo", CPUINFO);
        write(root, "proc/meminfo", MEMINFO);
        write(root, "etc/machine-id", "3d1219c7c4c5404aaa1f6d2a48adfda4\n");
        write(
            root,
            "proc/sys/kernel/random/boot_id",
            "ec0bca95-72fe-4842-aefe-82ee73bc9222\n",
        );
        write(root, "proc/sys/kernel/osrelease", "6.18.44-fc-v657\n");
        write(
            root,
            "etc/os-release",
            "NAME=\"Debian GNU/Linux\"\nPRETTY_NAME=\"Debian GNU/Linux 12 (bookworm)\"\nID=debian\n",
        );
        write(
            root,
            "sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages",
            "0\n",
        );
        write(
            root,
            "sys/kernel/mm/hugepages/hugepages-1048576kB/nr_hugepages",
            "2\n",
        );
        let info = read_machine_info_at(root);
        assert_eq!(info.num_cores, 2);
        assert_eq!(info.memory_capacity, 24684092 * 1024);
        assert_eq!(info.machine_id, "3d1219c7c4c5404aaa1f6d2a48adfda4");
        // No DMI: the system UUID falls back to the machine id, which is
        // what the recorded v1.20 kubelet reported on such a host.
        assert_eq!(info.system_uuid, "3d1219c7c4c5404aaa1f6d2a48adfda4");
        assert_eq!(info.boot_id, "ec0bca95-72fe-4842-aefe-82ee73bc9222");
        assert_eq!(info.kernel_version, "6.18.44-fc-v657");
        assert_eq!(info.os_image, "Debian GNU/Linux 12 (bookworm)");
        assert_eq!(info.operating_system, "linux");
        assert_eq!(info.huge_pages, vec![(2 << 20, 0), (1 << 30, 2)]);

        write(
            root,
            "sys/class/dmi/id/product_uuid",
            "EC2A0F1E-0000-1111-2222-333344445555\n",
        );
        write(root, "var/lib/dbus/machine-id", "dbusid\n");
        std::fs::remove_file(root.join("etc/machine-id")).unwrap();
        let info = read_machine_info_at(root);
        assert_eq!(info.system_uuid, "EC2A0F1E-0000-1111-2222-333344445555");
        assert_eq!(info.machine_id, "dbusid");
    }

    #[test]
    fn machine_info_with_nothing_readable() {
        let dir = tempfile::tempdir().unwrap();
        let info = read_machine_info_at(dir.path());
        assert_eq!(info.num_cores, 0);
        assert_eq!(info.memory_capacity, 0);
        assert_eq!(info.machine_id, "");
        assert_eq!(info.system_uuid, "");
        assert_eq!(info.os_image, "Linux");
        assert!(info.huge_pages.is_empty());
    }

    #[test]
    fn machine_info_of_this_host() {
        let info = read_machine_info();
        assert!(!info.boot_id.is_empty());
        assert!(!info.kernel_version.is_empty());
        assert!(info.num_cores >= 1);
        assert!(info.memory_capacity > 0);
        assert_eq!(info.architecture, go_arch());
    }

    #[test]
    fn cpuinfo_meminfo_and_os_release_texts() {
        // arm64 cpuinfo: lower-case "processor" lines among others.
        let arm = "processor\t: 0\nBogoMIPS\t: 48.00\n\nprocessor\t: 1\nBogoMIPS\t: 48.00\n\n\
            processor\t: 2\n\nprocessor\t: 3\n\nHardware\t: BCM2835\n";
        assert_eq!(count_processors(arm), 4);
        assert_eq!(count_processors(""), 0);
        assert_eq!(
            meminfo_bytes(MEMINFO, "MemAvailable"),
            Some(20000000 * 1024)
        );
        assert_eq!(meminfo_bytes(MEMINFO, "HugePages_Total"), Some(0));
        assert_eq!(meminfo_bytes(MEMINFO, "Mem"), None);
        assert_eq!(meminfo_bytes("MemTotal: lots kB\n", "MemTotal"), None);
        assert_eq!(
            os_image("NAME=Alpine\nPRETTY_NAME='Alpine Linux v3.19'\n"),
            "Alpine Linux v3.19"
        );
        assert_eq!(os_image("NAME=\"Buildroot\"\n"), "Buildroot");
        assert_eq!(os_image("PRETTY_NAME=\"a \\\"b\\\"\"\n"), "a \"b\"");
        assert_eq!(os_image("ID=x\n"), "Linux");
    }

    #[test]
    fn go_arch_names() {
        assert_eq!(go_arch_of("x86_64", true), "amd64");
        assert_eq!(go_arch_of("aarch64", true), "arm64");
        assert_eq!(go_arch_of("arm", true), "arm");
        assert_eq!(go_arch_of("x86", true), "386");
        assert_eq!(go_arch_of("powerpc64", true), "ppc64le");
        assert_eq!(go_arch_of("mips", true), "mipsle");
        assert_eq!(go_arch_of("riscv64", true), "riscv64");
        assert_eq!(go_arch_of("s390x", false), "s390x");
        if cfg!(target_arch = "x86_64") {
            assert_eq!(go_arch(), "amd64");
        }
    }
}
