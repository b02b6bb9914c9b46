//! Facts about this machine that go into the Node object, in the kubelet's
//! wire formats: node info (ids, kernel, OS image, architecture), capacity
//! and allocatable, addresses, and the memory/disk/PID pressure signals,
//! printed as the kubelet prints quantities (`crate::quantity`).
//!
//! One file per kind of fact: `info` (what the machine is), `filesystem`
//! (statvfs), `allocatable` (capacity, reservations, allocatable),
//! `addresses` (interfaces, default routes, the Node's addresses) and
//! `pressure` (the pressure signals and their conditions); this module
//! re-exports them and holds their error type.
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

use std::fmt;

use crate::quantity::QuantityError;

mod addresses;
mod allocatable;
mod filesystem;
mod info;
mod pressure;

pub(crate) use addresses::node_addresses;
pub(crate) use allocatable::{
    allocatable, capacity, check_reserved, parse_reserved, NODEFS_AVAILABLE_FRACTION,
};
pub(crate) use filesystem::{fs_stats, FsStats};
pub(crate) use info::{go_arch, meminfo_bytes, read_machine_info, MachineInfo};
pub(crate) use pressure::{
    condition_reason_message, loadavg_tasks, read_pressure, Pressure, PressureKind,
};

/// An error from this module: bad flag values, bad quantities, or a host
/// whose addresses cannot be determined. The message names the input.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct MachineError(String);

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

/// Writes `text` to `rel` under `root`, making its directories: a sample
/// host tree for the readers' tests.
#[cfg(test)]
fn write(root: &std::path::Path, rel: &str, text: &str) {
    let p = root.join(rel);
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(p, text).unwrap();
}
