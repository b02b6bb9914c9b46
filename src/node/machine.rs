//! Facts about this machine that go into the Node object, in the kubelet's
//! wire formats: node info (ids, kernel, OS image, architecture), capacity
//! and allocatable, addresses, and the memory/disk/PID pressure signals,
//! printed as the kubelet prints quantities (`crate::quantity`).
//!
//! Everything here is a plain function. Readers of /proc, /sys and /etc
//! have a variant taking a root directory or the file's text, so tests run
//! against samples rather than the host.
//!
//! Where this differs from the upstream kubelet (which gets the same facts
//! from cAdvisor and its eviction manager):
//! - memory pressure looks at /proc/meminfo MemAvailable, not at the root
//!   cgroup's working set;
//! - with no `--node-ip`, the InternalIP comes from the hostname if it is an
//!   IP literal, else from the default route's interface; the kubelet's DNS
//!   lookup of the node name in between is skipped (it can block for
//!   seconds on an edge machine with no resolver, and the default route
//!   gives the same answer on the machines we target).

use std::collections::BTreeMap;
use std::ffi::{CStr, CString};
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use crate::quantity::{format_binary_si, format_decimal_si, parse_quantity, QuantityError};

/// An error from this module: bad flag values, bad quantities, or a host
/// whose addresses cannot be determined. The message names the input.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MachineError(String);

impl fmt::Display for MachineError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for MachineError {}

impl From<QuantityError> for MachineError {
    fn from(e: QuantityError) -> Self {
        MachineError(e.to_string())
    }
}

// ---------------------------------------------------------------------------
// Machine info
// ---------------------------------------------------------------------------

/// What the Node's `status.nodeInfo` and capacity say about this host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MachineInfo {
    /// Logical CPUs (the "processor" entries of /proc/cpuinfo).
    pub num_cores: u32,
    /// Bytes: MemTotal of /proc/meminfo (given there in KiB).
    pub memory_capacity: u64,
    /// /etc/machine-id, else /var/lib/dbus/machine-id; empty if neither.
    pub machine_id: String,
    /// DMI product_uuid, else the device-tree system id, else the machine
    /// id (as cAdvisor does on hosts without DMI, e.g. microVMs); may be
    /// empty.
    pub system_uuid: String,
    /// /proc/sys/kernel/random/boot_id.
    pub boot_id: String,
    /// The kernel release (uname -r).
    pub kernel_version: String,
    /// PRETTY_NAME of /etc/os-release, else NAME, else "Linux".
    pub os_image: String,
    /// Go's GOARCH name for this build's architecture (see [`go_arch`]).
    pub architecture: &'static str,
    /// Go's GOOS: always "linux".
    pub operating_system: &'static str,
    /// Huge page pools: (page size in bytes, pages reserved), from
    /// /sys/kernel/mm/hugepages. The kubelet reports each as a
    /// `hugepages-<size>` resource, "0" when none are reserved.
    pub huge_pages: Vec<(u64, u64)>,
}

/// Reads the machine facts of this host. Files that cannot be read give
/// empty strings (or zero), logged, as the kubelet tolerates them.
pub fn read_machine_info() -> MachineInfo {
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
pub fn read_machine_info_at(root: &Path) -> MachineInfo {
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
pub fn count_processors(cpuinfo: &str) -> u32 {
    cpuinfo
        .lines()
        .filter(|l| {
            l.split_once(':')
                .is_some_and(|(k, _)| k.trim() == "processor")
        })
        .count() as u32
}

/// A /proc/meminfo field in bytes (the file gives KiB), if present.
pub fn meminfo_bytes(meminfo: &str, field: &str) -> Option<u64> {
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
pub fn os_image(os_release: &str) -> String {
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
pub fn go_arch() -> &'static str {
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

// ---------------------------------------------------------------------------
// Filesystem
// ---------------------------------------------------------------------------

/// Size of the filesystem holding a path, as cAdvisor reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct FsStats {
    /// Bytes: fragment size × blocks.
    pub capacity: u64,
    /// Bytes available to unprivileged users: fragment size × blocks
    /// available (the eviction signal nodefs.available).
    pub available: u64,
    /// Total inodes; 0 on filesystems that do not count them (btrfs).
    pub inodes: u64,
    /// Free inodes (the eviction signal nodefs.inodesFree).
    pub inodes_free: u64,
}

/// statvfs(2) of `path`.
pub fn fs_stats(path: &Path) -> std::io::Result<FsStats> {
    let c = CString::new(path.as_os_str().as_bytes()).map_err(|_| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("{}: path contains a NUL byte", path.display()),
        )
    })?;
    // SAFETY: statvfs is plain data; the call fills it or fails.
    let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statvfs(c.as_ptr(), &mut s) } != 0 {
        let e = std::io::Error::last_os_error();
        return Err(std::io::Error::new(
            e.kind(),
            format!("statvfs {}: {e}", path.display()),
        ));
    }
    let frsize = s.f_frsize as u64;
    Ok(FsStats {
        capacity: frsize.saturating_mul(s.f_blocks as u64),
        available: frsize.saturating_mul(s.f_bavail as u64),
        inodes: s.f_files as u64,
        inodes_free: s.f_ffree as u64,
    })
}

// ---------------------------------------------------------------------------
// Quantities
// ---------------------------------------------------------------------------

/// Whether the kubelet prints this resource binary (bytes) or decimal.
fn is_binary_resource(name: &str) -> bool {
    name == "memory" || name == "ephemeral-storage" || name.starts_with("hugepages-")
}

fn format_resource(name: &str, milli: i128) -> String {
    if is_binary_resource(name) {
        format_binary_si(milli)
    } else {
        format_decimal_si(milli)
    }
}

// ---------------------------------------------------------------------------
// Reservations, capacity, allocatable
// ---------------------------------------------------------------------------

/// Resources `--kube-reserved` and `--system-reserved` may name.
pub const RESERVABLE: [&str; 4] = ["cpu", "memory", "ephemeral-storage", "pid"];

/// Parses a `--kube-reserved` / `--system-reserved` value,
/// "cpu=100m,memory=256Mi,ephemeral-storage=1Gi,pid=1000". Entries are
/// comma separated, spaces around them are ignored, a later entry for the
/// same resource wins (as with the kubelet's map flags). Names must be in
/// [`RESERVABLE`] and quantities valid and not negative; the error names
/// the entry. The caller prefixes the flag's name.
pub fn parse_reserved(flag_value: &str) -> Result<BTreeMap<String, String>, MachineError> {
    let mut out = BTreeMap::new();
    for entry in flag_value
        .split(',')
        .map(str::trim)
        .filter(|e| !e.is_empty())
    {
        let bad = |why: String| MachineError(format!("entry {entry:?}: {why}"));
        let (name, value) = entry
            .split_once('=')
            .ok_or_else(|| bad("expected <resource>=<quantity>".into()))?;
        let (name, value) = (name.trim(), value.trim());
        if !RESERVABLE.contains(&name) {
            return Err(bad(format!(
                "unknown resource {name:?} (want one of {})",
                RESERVABLE.join(", ")
            )));
        }
        let q = parse_quantity(value).map_err(|e| bad(e.to_string()))?;
        if q.is_negative() {
            return Err(bad(format!("quantity {value:?} is negative")));
        }
        out.insert(name.to_string(), value.to_string());
    }
    Ok(out)
}

/// The Node's `status.capacity`: cpu (cores), memory (MemTotal, in Ki as
/// the kubelet prints it), ephemeral-storage (the root filesystem's size),
/// pods (`max_pods`), and one `hugepages-<size>` per huge page pool.
pub fn capacity(info: &MachineInfo, root_fs: &FsStats, max_pods: u32) -> BTreeMap<String, String> {
    let mut c = BTreeMap::new();
    let mut put = |name: String, milli: i128| {
        let text = format_resource(&name, milli);
        c.insert(name, text);
    };
    put("cpu".into(), i128::from(info.num_cores) * 1000);
    put("memory".into(), i128::from(info.memory_capacity) * 1000);
    put(
        "ephemeral-storage".into(),
        i128::from(root_fs.capacity) * 1000,
    );
    put("pods".into(), i128::from(max_pods) * 1000);
    for &(page_size, pages) in &info.huge_pages {
        let name = format!(
            "hugepages-{}",
            format_binary_si(i128::from(page_size) * 1000)
        );
        put(name, i128::from(page_size) * i128::from(pages) * 1000);
    }
    c
}

/// The kubelet's default hard eviction threshold for nodefs.available
/// (a float32 upstream; its rounding shows in the reported bytes).
pub const NODEFS_AVAILABLE_FRACTION: f32 = 0.10;

/// A fraction of a capacity, computed as the kubelet does (float64 of the
/// float32 fraction, truncated).
fn fraction_of(capacity: i128, fraction: f32) -> i128 {
    (capacity as f64 * f64::from(fraction)) as i128
}

/// The Node's `status.allocatable`: each capacity entry minus
/// kube-reserved, system-reserved and the hard eviction threshold (memory:
/// `eviction_hard_memory`, a quantity like "100Mi" or a percentage like
/// "5%"; ephemeral-storage: `eviction_hard_nodefs`, likewise; "0": none),
/// floored at 0, then memory minus every huge page pool. Formatted like
/// capacity. Reservations for resources capacity lacks (pid) are ignored,
/// as upstream.
pub fn allocatable(
    capacity: &BTreeMap<String, String>,
    kube_reserved: &BTreeMap<String, String>,
    system_reserved: &BTreeMap<String, String>,
    eviction_hard_memory: &str,
    eviction_hard_nodefs: &str,
) -> Result<BTreeMap<String, String>, MachineError> {
    let mut cap_milli = BTreeMap::new();
    for (name, text) in capacity {
        let q = parse_quantity(text).map_err(|e| MachineError(format!("capacity {name}: {e}")))?;
        cap_milli.insert(name.as_str(), q.milli_value());
    }
    let mut reserved: BTreeMap<&str, i128> = BTreeMap::new();
    for (flag, list) in [
        ("kube-reserved", kube_reserved),
        ("system-reserved", system_reserved),
    ] {
        for (name, text) in list {
            let q =
                parse_quantity(text).map_err(|e| MachineError(format!("{flag} {name}: {e}")))?;
            *reserved.entry(name.as_str()).or_default() += q.milli_value();
        }
    }
    if let Some(&mem) = cap_milli.get("memory") {
        let threshold = eviction_threshold(eviction_hard_memory, mem / 1000)
            .map_err(|e| MachineError(format!("eviction-hard memory.available: {e}")))?;
        *reserved.entry("memory").or_default() += threshold * 1000;
    }
    if let Some(&eph) = cap_milli.get("ephemeral-storage") {
        let threshold = eviction_threshold(eviction_hard_nodefs, eph / 1000)
            .map_err(|e| MachineError(format!("eviction-hard nodefs.available: {e}")))?;
        *reserved.entry("ephemeral-storage").or_default() += threshold * 1000;
    }
    let mut alloc: BTreeMap<&str, i128> = cap_milli
        .iter()
        .map(|(&name, &cap)| {
            let r = reserved.get(name).copied().unwrap_or(0);
            (name, (cap - r).max(0))
        })
        .collect();
    let huge: i128 = cap_milli
        .iter()
        .filter(|(n, _)| n.starts_with("hugepages-"))
        .map(|(_, &v)| v)
        .sum();
    if let Some(mem) = alloc.get_mut("memory") {
        *mem = (*mem - huge).max(0);
    }
    Ok(alloc
        .into_iter()
        .map(|(name, v)| (name.to_string(), format_resource(name, v)))
        .collect())
}

/// An eviction threshold in base units: a quantity, or "<n>%" of capacity.
fn eviction_threshold(text: &str, capacity: i128) -> Result<i128, MachineError> {
    if let Some(pct) = text.strip_suffix('%') {
        let p: f32 = pct
            .parse()
            .ok()
            .filter(|p: &f32| (0.0..=100.0).contains(p))
            .ok_or_else(|| MachineError(format!("{text:?}: not a percentage from 0 to 100")))?;
        return Ok(fraction_of(capacity, p / 100.0));
    }
    let q = parse_quantity(text)?;
    if q.is_negative() {
        return Err(MachineError(format!("{text:?}: negative")));
    }
    Ok(q.value())
}

// ---------------------------------------------------------------------------
// Addresses
// ---------------------------------------------------------------------------

/// One address of a network interface.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IfAddr {
    pub name: String,
    pub addr: IpAddr,
    /// IFF_UP.
    pub up: bool,
}

/// Every address on this host's interfaces (getifaddrs(3)).
pub fn host_interfaces() -> std::io::Result<Vec<IfAddr>> {
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs allocates a list we walk read-only and free once.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        let e = std::io::Error::last_os_error();
        return Err(std::io::Error::new(e.kind(), format!("getifaddrs: {e}")));
    }
    let mut out = Vec::new();
    let mut cur = head;
    while !cur.is_null() {
        // SAFETY: cur is a live node of the list until freeifaddrs.
        let ifa = unsafe { &*cur };
        cur = ifa.ifa_next;
        if ifa.ifa_addr.is_null() || ifa.ifa_name.is_null() {
            continue;
        }
        // SAFETY: ifa_addr points to a sockaddr whose family says its type.
        let addr = match i32::from(unsafe { (*ifa.ifa_addr).sa_family }) {
            libc::AF_INET => {
                let sin = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in) };
                IpAddr::V4(Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr)))
            }
            libc::AF_INET6 => {
                let sin6 = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in6) };
                IpAddr::V6(Ipv6Addr::from(sin6.sin6_addr.s6_addr))
            }
            _ => continue,
        };
        // SAFETY: ifa_name is a NUL-terminated string owned by the list.
        let name = unsafe { CStr::from_ptr(ifa.ifa_name) }
            .to_string_lossy()
            .into_owned();
        out.push(IfAddr {
            name,
            addr,
            up: ifa.ifa_flags & libc::IFF_UP as u32 != 0,
        });
    }
    // SAFETY: head came from getifaddrs and nothing borrows it any more.
    unsafe { libc::freeifaddrs(head) };
    Ok(out)
}

const RTF_UP: u32 = 0x0001;
const RTF_REJECT: u32 = 0x0200;

/// Interfaces of the IPv4 default routes (destination and mask 0, route
/// up) in /proc/net/route text, in file order.
pub fn parse_default_routes_v4(text: &str) -> Result<Vec<String>, MachineError> {
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate().skip(1) {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.is_empty() {
            continue;
        }
        let bad = || MachineError(format!("/proc/net/route line {}: {line:?}", n + 1));
        if f.len() < 8 {
            return Err(bad());
        }
        let hex = |s: &str| u32::from_str_radix(s, 16).map_err(|_| bad());
        let (dest, flags, mask) = (hex(f[1])?, hex(f[3])?, hex(f[7])?);
        if dest == 0 && mask == 0 && flags & RTF_UP != 0 && flags & RTF_REJECT == 0 {
            out.push(f[0].to_string());
        }
    }
    Ok(out)
}

/// Interfaces of the IPv6 default routes (::/0, route up, not a reject
/// route) in /proc/net/ipv6_route text, in file order.
pub fn parse_default_routes_v6(text: &str) -> Result<Vec<String>, MachineError> {
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.is_empty() {
            continue;
        }
        let bad = || MachineError(format!("/proc/net/ipv6_route line {}: {line:?}", n + 1));
        if f.len() < 10 || f[0].len() != 32 {
            return Err(bad());
        }
        let dest = u128::from_str_radix(f[0], 16).map_err(|_| bad())?;
        let prefix = u8::from_str_radix(f[1], 16).map_err(|_| bad())?;
        let flags = u32::from_str_radix(f[8], 16).map_err(|_| bad())?;
        if dest == 0 && prefix == 0 && flags & RTF_UP != 0 && flags & RTF_REJECT == 0 {
            out.push(f[9].to_string());
        }
    }
    Ok(out)
}

/// Go's `IsGlobalUnicast` plus what the kubelet rejects for a node IP:
/// not loopback, link-local, multicast, unspecified or broadcast.
fn is_global_unicast(ip: &IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => {
            !(v4.is_loopback()
                || v4.is_link_local()
                || v4.is_multicast()
                || v4.is_unspecified()
                || v4.is_broadcast())
        }
        IpAddr::V6(v6) => {
            !(v6.is_loopback()
                || v6.is_multicast()
                || v6.is_unspecified()
                || (v6.segments()[0] & 0xffc0) == 0xfe80)
        }
    }
}

/// Checks a `--node-ip` as the kubelet does: a usable unicast address
/// that one of this host's interfaces holds.
pub fn validate_node_ip(ip: IpAddr, ifaces: &[IfAddr]) -> Result<(), MachineError> {
    let why = match ip {
        ip if ip.is_loopback() => Some("a loopback address"),
        ip if ip.is_multicast() => Some("a multicast address"),
        ip if ip.is_unspecified() => Some("an all-zeros address"),
        ip if !is_global_unicast(&ip) => Some("a link-local or broadcast address"),
        _ => None,
    };
    if let Some(why) = why {
        return Err(MachineError(format!("--node-ip {ip}: can't be {why}")));
    }
    if !ifaces.iter().any(|i| i.addr == ip) {
        return Err(MachineError(format!(
            "--node-ip {ip}: not found in the host's network interfaces"
        )));
    }
    Ok(())
}

/// The Node's `status.addresses` for this host, as (type, address), in the
/// kubelet's order: InternalIP, then Hostname.
///
/// The InternalIP is `node_ip` if given (validated, see
/// [`validate_node_ip`]), else `hostname` if it is an IP literal, else the
/// global unicast IPv4 address of the first IPv4 default route's interface
/// (/proc/net/route), else the IPv6 one of the first IPv6 default route's
/// (/proc/net/ipv6_route).
pub fn node_addresses(
    node_ip: Option<IpAddr>,
    hostname: &str,
) -> Result<Vec<(String, String)>, MachineError> {
    let ifaces = host_interfaces().map_err(|e| MachineError(e.to_string()))?;
    let v4 = std::fs::read_to_string("/proc/net/route").unwrap_or_default();
    let v6 = std::fs::read_to_string("/proc/net/ipv6_route").unwrap_or_default();
    choose_addresses(node_ip, hostname, &ifaces, &v4, &v6)
}

/// [`node_addresses`] over given interfaces and route tables.
pub fn choose_addresses(
    node_ip: Option<IpAddr>,
    hostname: &str,
    ifaces: &[IfAddr],
    route_v4: &str,
    route_v6: &str,
) -> Result<Vec<(String, String)>, MachineError> {
    let ip = match node_ip {
        Some(ip) => {
            validate_node_ip(ip, ifaces)?;
            ip
        }
        None => match hostname.parse::<IpAddr>() {
            Ok(ip) => ip,
            Err(_) => default_route_ip(ifaces, route_v4, route_v6).map_err(|e| {
                MachineError(format!(
                    "can't get the IP address of node {hostname} (set --node-ip): {e}"
                ))
            })?,
        },
    };
    Ok(vec![
        ("InternalIP".to_string(), ip.to_string()),
        ("Hostname".to_string(), hostname.to_string()),
    ])
}

/// The address of the default route's interface, IPv4 routes first.
fn default_route_ip(
    ifaces: &[IfAddr],
    route_v4: &str,
    route_v6: &str,
) -> Result<IpAddr, MachineError> {
    let pick = |routes: Vec<String>, want_v4: bool| {
        routes.iter().find_map(|iface| {
            ifaces
                .iter()
                .find(|a| {
                    a.name == *iface
                        && a.up
                        && a.addr.is_ipv4() == want_v4
                        && is_global_unicast(&a.addr)
                })
                .map(|a| a.addr)
        })
    };
    let v4_routes = parse_default_routes_v4(route_v4);
    let v6_routes = parse_default_routes_v6(route_v6);
    if let Some(ip) = v4_routes.clone().ok().and_then(|r| pick(r, true)) {
        return Ok(ip);
    }
    if let Some(ip) = v6_routes.clone().ok().and_then(|r| pick(r, false)) {
        return Ok(ip);
    }
    match (v4_routes, v6_routes) {
        (Err(e), _) | (_, Err(e)) => Err(e),
        (Ok(a), Ok(b)) if a.is_empty() && b.is_empty() => Err(MachineError(
            "no default route in /proc/net/route or /proc/net/ipv6_route".into(),
        )),
        _ => Err(MachineError(
            "no default route's interface has a global unicast address".into(),
        )),
    }
}

// ---------------------------------------------------------------------------
// Pressure
// ---------------------------------------------------------------------------

/// The node's resource pressure, the eviction signals behind the Node's
/// MemoryPressure, DiskPressure and PIDPressure conditions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Pressure {
    pub memory: bool,
    pub disk: bool,
    pub pid: bool,
}

/// Hard eviction thresholds: a signal below its threshold means pressure.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EvictionThresholds {
    /// memory.available, bytes.
    pub memory_available: u64,
    /// nodefs.available, a fraction of the filesystem's capacity.
    pub nodefs_available: f32,
    /// nodefs.inodesFree, a fraction of the filesystem's inodes.
    pub nodefs_inodes_free: f32,
    /// pid.available, a fraction of the PID limit.
    pub pid_available: f32,
}

/// The kubelet's default hard eviction thresholds on Linux:
/// memory.available<100Mi, nodefs.available<10%, nodefs.inodesFree<5%,
/// pid.available<10%. (imagefs.available<15% has no counterpart here: the
/// image filesystem is containerd's.)
pub const DEFAULT_EVICTION_HARD: EvictionThresholds = EvictionThresholds {
    memory_available: 100 << 20,
    nodefs_available: NODEFS_AVAILABLE_FRACTION,
    nodefs_inodes_free: 0.05,
    pid_available: 0.10,
};

/// [`pressure_with`] the default thresholds.
pub fn pressure(meminfo_text: &str, root_fs: &FsStats, pid_max: u64, pids_in_use: u64) -> Pressure {
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
pub fn pressure_with(
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
pub fn read_pressure(root_dir: &Path) -> Pressure {
    read_pressure_in(Path::new("/proc"), root_dir)
}

/// [`read_pressure`] with /proc at `proc_root`.
pub fn read_pressure_in(proc_root: &Path, root_dir: &Path) -> Pressure {
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
pub fn loadavg_tasks(loadavg: &str) -> Option<u64> {
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
pub enum PressureKind {
    Memory,
    Disk,
    Pid,
}

impl PressureKind {
    /// The condition's `type`.
    pub fn condition_type(self) -> &'static str {
        match self {
            PressureKind::Memory => "MemoryPressure",
            PressureKind::Disk => "DiskPressure",
            PressureKind::Pid => "PIDPressure",
        }
    }
}

/// (status, reason, message) of a pressure condition, the kubelet's words.
pub fn condition_reason_message(
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

    fn write(root: &Path, rel: &str, text: &str) {
        let p = root.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    }

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

    #[test]
    fn fs_stats_of_root() {
        let s = fs_stats(Path::new("/")).unwrap();
        assert!(s.capacity > 0);
        assert!(s.available <= s.capacity);
        assert!(s.inodes_free <= s.inodes);
        let e = fs_stats(Path::new("/no/such/dir")).unwrap_err();
        assert!(e.to_string().contains("/no/such/dir"), "{e}");
    }

    #[test]
    fn reserved_flags() {
        let r = parse_reserved(" cpu=100m, memory=256Mi,ephemeral-storage=1Gi,pid=1000,").unwrap();
        let want: BTreeMap<String, String> = [
            ("cpu", "100m"),
            ("memory", "256Mi"),
            ("ephemeral-storage", "1Gi"),
            ("pid", "1000"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        assert_eq!(r, want);
        assert!(parse_reserved("").unwrap().is_empty());
        assert_eq!(parse_reserved("cpu=1,cpu=2").unwrap()["cpu"], "2");
        let err = |v: &str| parse_reserved(v).unwrap_err().to_string();
        assert_eq!(err("cpu"), "entry \"cpu\": expected <resource>=<quantity>");
        assert_eq!(
            err("cpu=1,gpu=1"),
            "entry \"gpu=1\": unknown resource \"gpu\" (want one of cpu, memory, ephemeral-storage, pid)"
        );
        assert_eq!(
            err("memory=lots"),
            "entry \"memory=lots\": quantity \"lots\": expected a number"
        );
        assert_eq!(
            err("memory=-1Gi"),
            "entry \"memory=-1Gi\": quantity \"-1Gi\" is negative"
        );
        assert_eq!(err("memory="), "entry \"memory=\": quantity \"\": empty");
    }

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    /// The machine behind the recorded node registration (v1.20.2 kubelet,
    /// 01a-node-create-201): 2 cores, MemTotal 24684092 kB, a 264212084 KiB
    /// root filesystem, both huge page pools empty.
    fn recorded_machine() -> (MachineInfo, FsStats) {
        let info = MachineInfo {
            num_cores: 2,
            memory_capacity: 24684092 * 1024,
            machine_id: String::new(),
            system_uuid: String::new(),
            boot_id: String::new(),
            kernel_version: String::new(),
            os_image: String::new(),
            architecture: "amd64",
            operating_system: "linux",
            huge_pages: vec![(2 << 20, 0), (1 << 30, 0)],
        };
        let fs = FsStats {
            capacity: 264212084 * 1024,
            available: 100 << 30,
            inodes: 1000,
            inodes_free: 900,
        };
        (info, fs)
    }

    #[test]
    fn capacity_and_allocatable_match_the_recorded_node() {
        let (info, fs) = recorded_machine();
        let cap = capacity(&info, &fs, 110);
        // status.capacity and status.allocatable of the recorded request.
        let want_cap = map(&[
            ("cpu", "2"),
            ("ephemeral-storage", "264212084Ki"),
            ("hugepages-1Gi", "0"),
            ("hugepages-2Mi", "0"),
            ("memory", "24684092Ki"),
            ("pods", "110"),
        ]);
        assert_eq!(cap, want_cap);
        let none = BTreeMap::new();
        let alloc = allocatable(&cap, &none, &none, "100Mi", "10%").unwrap();
        let want_alloc = map(&[
            ("cpu", "2"),
            ("ephemeral-storage", "243497856212"),
            ("hugepages-1Gi", "0"),
            ("hugepages-2Mi", "0"),
            ("memory", "24581692Ki"),
            ("pods", "110"),
        ]);
        assert_eq!(alloc, want_alloc);
    }

    #[test]
    fn allocatable_subtracts_reservations_and_floors_at_zero() {
        let cap = map(&[
            ("cpu", "2"),
            ("memory", "1Gi"),
            ("ephemeral-storage", "10Gi"),
            ("pods", "110"),
            ("hugepages-2Mi", "128Mi"),
        ]);
        let kube = parse_reserved("cpu=100m,memory=256Mi,pid=1000").unwrap();
        let system = parse_reserved("cpu=0.5,memory=128Mi,ephemeral-storage=1Gi").unwrap();
        let a = allocatable(&cap, &kube, &system, "100Mi", "10%").unwrap();
        assert_eq!(a["cpu"], "1400m");
        // 1024 - 256 - 128 - 100 (eviction) - 128 (huge pages) = 412 Mi.
        assert_eq!(a["memory"], "412Mi");
        // 10Gi - 1Gi - 10% of 10Gi (float32 0.1, truncated).
        let eph = 10i128 << 30;
        let want = eph - (1 << 30) - (eph as f64 * f64::from(0.1f32)) as i128;
        assert_eq!(a["ephemeral-storage"], format_binary_si(want * 1000));
        assert_eq!(a["pods"], "110");
        assert_eq!(a["hugepages-2Mi"], "128Mi");
        assert!(!a.contains_key("pid"));

        let a = allocatable(
            &cap,
            &parse_reserved("cpu=3,memory=2Gi").unwrap(),
            &BTreeMap::new(),
            "5%",
            "10%",
        )
        .unwrap();
        assert_eq!(a["cpu"], "0");
        assert_eq!(a["memory"], "0");

        // The nodefs.available threshold comes off ephemeral-storage.
        let cap = map(&[("ephemeral-storage", "1000Mi")]);
        let none = BTreeMap::new();
        let a = allocatable(&cap, &none, &none, "0", "100Mi").unwrap();
        assert_eq!(a["ephemeral-storage"], "900Mi");
        let a = allocatable(&cap, &none, &none, "0", "0").unwrap();
        assert_eq!(a["ephemeral-storage"], "1000Mi");

        // A percentage threshold for memory.
        let cap = map(&[("memory", "1000Mi")]);
        let a = allocatable(&cap, &BTreeMap::new(), &BTreeMap::new(), "10%", "10%").unwrap();
        let mem = 1000i128 << 20;
        let want = mem - (mem as f64 * f64::from(0.1f32)) as i128;
        assert_eq!(a["memory"], format_binary_si(want * 1000));

        let e = allocatable(&cap, &BTreeMap::new(), &BTreeMap::new(), "lots", "10%").unwrap_err();
        assert_eq!(
            e.to_string(),
            "eviction-hard memory.available: quantity \"lots\": expected a number"
        );
        let e = allocatable(&cap, &BTreeMap::new(), &BTreeMap::new(), "120%", "10%").unwrap_err();
        assert_eq!(
            e.to_string(),
            "eviction-hard memory.available: \"120%\": not a percentage from 0 to 100"
        );
    }

    const ROUTE: &str =
        "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n\
        docker0\t000011AC\t00000000\t0001\t0\t0\t0\t0000FFFF\t0\t0\t0\n\
        wlan0\t00000000\t0101A8C0\t0003\t0\t0\t600\t00000000\t0\t0\t0\n\
        eth0\t00000000\t010200C0\t0003\t0\t0\t100\t00000000\t0\t0\t0\n\
        eth0\t000200C0\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0\n";

    const ROUTE6: &str = "\
        fd000000000000000000000000000000 40 00000000000000000000000000000000 00 00000000000000000000000000000000 00000100 00000001 00000000 00000001     eth0\n\
        00000000000000000000000000000000 00 00000000000000000000000000000000 00 fd000000000000000000000000000001 00000400 00000002 00000000 00000003     eth0\n\
        00000000000000000000000000000000 00 00000000000000000000000000000000 00 00000000000000000000000000000000 ffffffff 00000001 00000000 00200200       lo\n";

    fn iface(name: &str, addr: &str, up: bool) -> IfAddr {
        IfAddr {
            name: name.to_string(),
            addr: addr.parse().unwrap(),
            up,
        }
    }

    #[test]
    fn default_routes_from_proc_text() {
        assert_eq!(
            parse_default_routes_v4(ROUTE).unwrap(),
            vec!["wlan0", "eth0"]
        );
        assert_eq!(parse_default_routes_v6(ROUTE6).unwrap(), vec!["eth0"]);
        assert!(parse_default_routes_v4("Iface\tDestination\n")
            .unwrap()
            .is_empty());
        let e = parse_default_routes_v4("Iface\neth0 zz 0 3 0 0 0 00000000\n").unwrap_err();
        assert_eq!(
            e.to_string(),
            "/proc/net/route line 2: \"eth0 zz 0 3 0 0 0 00000000\""
        );
        assert!(parse_default_routes_v6("short line\n").is_err());
    }

    #[test]
    fn addresses_in_upstream_order() {
        let ifaces = [
            iface("lo", "127.0.0.1", true),
            iface("wlan0", "192.168.1.5", false),
            iface("eth0", "fe80::1", true),
            iface("eth0", "10.0.2.15", true),
            iface("eth0", "fd00::2", true),
        ];
        let pair = |t: &str, a: &str| (t.to_string(), a.to_string());
        // The down wlan0 is skipped; eth0's global IPv4 wins.
        assert_eq!(
            choose_addresses(None, "edge-1", &ifaces, ROUTE, ROUTE6).unwrap(),
            vec![pair("InternalIP", "10.0.2.15"), pair("Hostname", "edge-1")]
        );
        // No IPv4 default route: the IPv6 one's global address.
        assert_eq!(
            choose_addresses(None, "edge-1", &ifaces, "Iface\n", ROUTE6).unwrap()[0],
            pair("InternalIP", "fd00::2")
        );
        // A hostname that is an IP is used as is.
        assert_eq!(
            choose_addresses(None, "10.9.9.9", &ifaces, ROUTE, ROUTE6).unwrap(),
            vec![pair("InternalIP", "10.9.9.9"), pair("Hostname", "10.9.9.9")]
        );
        // --node-ip, when it is one of ours.
        let ip = "fd00::2".parse().ok();
        assert_eq!(
            choose_addresses(ip, "edge-1", &ifaces, ROUTE, ROUTE6).unwrap()[0],
            pair("InternalIP", "fd00::2")
        );
        let err = |ip: &str| {
            choose_addresses(ip.parse().ok(), "edge-1", &ifaces, ROUTE, ROUTE6)
                .unwrap_err()
                .to_string()
        };
        assert_eq!(
            err("127.0.0.1"),
            "--node-ip 127.0.0.1: can't be a loopback address"
        );
        assert_eq!(
            err("224.0.0.1"),
            "--node-ip 224.0.0.1: can't be a multicast address"
        );
        assert_eq!(
            err("0.0.0.0"),
            "--node-ip 0.0.0.0: can't be an all-zeros address"
        );
        assert_eq!(
            err("fe80::1"),
            "--node-ip fe80::1: can't be a link-local or broadcast address"
        );
        assert_eq!(
            err("10.0.2.16"),
            "--node-ip 10.0.2.16: not found in the host's network interfaces"
        );
        // Nothing to go on.
        let e = choose_addresses(None, "edge-1", &ifaces, "Iface\n", "").unwrap_err();
        assert_eq!(
            e.to_string(),
            "can't get the IP address of node edge-1 (set --node-ip): \
             no default route in /proc/net/route or /proc/net/ipv6_route"
        );
        let only_lo = [iface("lo", "127.0.0.1", true)];
        let e = choose_addresses(None, "edge-1", &only_lo, ROUTE, "").unwrap_err();
        assert!(
            e.to_string()
                .ends_with("no default route's interface has a global unicast address"),
            "{e}"
        );
    }

    #[test]
    fn addresses_of_this_host() {
        let ifaces = host_interfaces().unwrap();
        assert!(ifaces.iter().any(|i| i.addr.is_loopback()));
        // Whatever this host's default route gives must pass --node-ip
        // validation, since it is one of its own addresses.
        if let Ok(addrs) = node_addresses(None, "here") {
            assert_eq!(addrs[1], ("Hostname".to_string(), "here".to_string()));
            let ip: IpAddr = addrs[0].1.parse().unwrap();
            assert_eq!(node_addresses(Some(ip), "here").unwrap(), addrs);
        }
    }

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
