//! What the rest of tinylet knows about its own Node: its UID once
//! registered, its labels and its allocatable resources. Written by the
//! node status thread, read by admission and the status manager.

use std::collections::BTreeMap;
use std::path::Path;

use super::machine;
use crate::admission::NodeInfo;
use crate::quantity::{parse_bytes, parse_millis};

#[derive(Debug, Clone, Default, PartialEq)]
pub struct NodeState {
    pub name: String,
    /// The Node's UID, once the API server has it.
    pub uid: Option<String>,
    pub labels: BTreeMap<String, String>,
    /// Resource name to quantity, as reported in `status.allocatable`.
    pub allocatable: BTreeMap<String, String>,
    /// The Ready condition last reported.
    pub ready: bool,
    /// Heartbeats that succeeded after failing (the link to the apiserver
    /// came back); counted by the lease thread.
    pub heartbeat_recoveries: u64,
    /// The Node's `node.alpha.kubernetes.io/ttl` annotation: how long a
    /// Secret or ConfigMap read by the Cache strategy may be kept.
    pub object_ttl: Option<std::time::Duration>,
}

/// The node as the machine describes it before the API server is heard
/// from: the default labels, the `--node-labels`, and the allocatable
/// resources computed locally (admission uses them in standalone mode too).
#[allow(clippy::too_many_arguments)]
pub fn initial_node_state(
    name: &str,
    root_dir: &Path,
    max_pods: u32,
    node_labels: &[(String, String)],
    kube_reserved: &[(String, String)],
    system_reserved: &[(String, String)],
    eviction_hard_memory: &str,
    eviction_hard_nodefs: &str,
) -> NodeState {
    let info = machine::read_machine_info();
    let fs = machine::fs_stats(root_dir).unwrap_or_default();
    let capacity = machine::capacity(&info, &fs, max_pods);
    let reserved = |p: &[(String, String)]| p.iter().cloned().collect::<BTreeMap<_, _>>();
    let allocatable = machine::allocatable(
        &capacity,
        &reserved(kube_reserved),
        &reserved(system_reserved),
        eviction_hard_memory,
        eviction_hard_nodefs,
    )
    .unwrap_or_else(|e| {
        log::warn!("node: allocatable: {e}; using capacity");
        capacity.clone()
    });
    NodeState {
        name: name.to_string(),
        uid: None,
        labels: default_labels(name, &info, node_labels),
        allocatable,
        ready: false,
        heartbeat_recoveries: 0,
        object_ttl: None,
    }
}

/// The labels a kubelet sets on its own Node, plus `--node-labels`.
pub fn default_labels(
    name: &str,
    info: &machine::MachineInfo,
    extra: &[(String, String)],
) -> BTreeMap<String, String> {
    let arch = info.architecture.to_string();
    let os = info.operating_system.to_string();
    let mut labels = BTreeMap::from([
        ("beta.kubernetes.io/arch".to_string(), arch.clone()),
        ("beta.kubernetes.io/os".to_string(), os.clone()),
        ("kubernetes.io/arch".to_string(), arch),
        ("kubernetes.io/hostname".to_string(), name.to_string()),
        ("kubernetes.io/os".to_string(), os),
    ]);
    labels.extend(extra.iter().cloned());
    labels
}

/// The node as admission sees it. A resource the node does not report is
/// unlimited for admission (it cannot be checked).
pub fn node_info(state: &NodeState) -> NodeInfo {
    let get = |k: &str| state.allocatable.get(k);
    NodeInfo {
        name: state.name.clone(),
        labels: state.labels.clone(),
        allocatable_milli_cpu: get("cpu").and_then(|q| parse_millis(q)).unwrap_or(i64::MAX),
        allocatable_memory: get("memory")
            .and_then(|q| parse_bytes(q))
            .unwrap_or(i64::MAX),
        allocatable_ephemeral_storage: get("ephemeral-storage")
            .and_then(|q| parse_bytes(q))
            .unwrap_or(i64::MAX),
        allowed_pod_number: get("pods").and_then(|q| q.parse().ok()).unwrap_or(i64::MAX),
        os: "linux",
        allow_privileged: true,
        sysctls: Default::default(),
    }
}
