//! The Node's capacity and allocatable: `--kube-reserved` and
//! `--system-reserved` values, the capacity from the machine's facts, and
//! allocatable after reservations, hard eviction thresholds and huge pages,
//! each printed as the kubelet prints that resource.

use std::collections::BTreeMap;

use super::{FsStats, MachineError, MachineInfo};
use crate::quantity::{format_binary_si, format_decimal_si, parse_quantity};

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

/// Resources `--kube-reserved` and `--system-reserved` may name.
pub(crate) const RESERVABLE: [&str; 4] = ["cpu", "memory", "ephemeral-storage", "pid"];

/// Parses a `--kube-reserved` / `--system-reserved` value,
/// "cpu=100m,memory=256Mi,ephemeral-storage=1Gi,pid=1000". Entries are
/// comma separated, spaces around them are ignored, a later entry for the
/// same resource wins (as with the kubelet's map flags). Names must be in
/// [`RESERVABLE`] and quantities valid and not negative; the error names
/// the entry. The caller prefixes the flag's name.
pub(crate) fn parse_reserved(flag_value: &str) -> Result<BTreeMap<String, String>, MachineError> {
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
        check_reserved(name, value).map_err(bad)?;
        out.insert(name.to_string(), value.to_string());
    }
    Ok(out)
}

/// Checks one reserved resource (a flag's entry, a config file's
/// `kubeReserved`/`systemReserved` key): a name in [`RESERVABLE`] and a
/// valid quantity that is not negative, as the kubelet refuses others.
pub(crate) fn check_reserved(name: &str, value: &str) -> Result<(), String> {
    if !RESERVABLE.contains(&name) {
        return Err(format!(
            "unknown resource {name:?} (want one of {})",
            RESERVABLE.join(", ")
        ));
    }
    let q = parse_quantity(value).map_err(|e| e.to_string())?;
    if q.is_negative() {
        return Err(format!("quantity {value:?} is negative"));
    }
    Ok(())
}

/// The Node's `status.capacity`: cpu (cores), memory (MemTotal, in Ki as
/// the kubelet prints it), ephemeral-storage (the root filesystem's size),
/// pods (`max_pods`), and one `hugepages-<size>` per huge page pool.
pub(crate) fn capacity(
    info: &MachineInfo,
    root_fs: &FsStats,
    max_pods: u32,
) -> BTreeMap<String, String> {
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
pub(crate) const NODEFS_AVAILABLE_FRACTION: f32 = 0.10;

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
pub(crate) fn allocatable(
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
