//! What the rest of tinylet knows about its own Node: its UID once
//! registered, its labels and its allocatable resources.
//!
//! One owner: the `node-status` thread holds the only [`NodeStateWriter`]
//! and publishes each change as a new immutable snapshot; everyone else
//! (admission in the sync loop, the status manager, the lease thread, the
//! runtime's and the object manager's closures) holds a
//! [`NodeStateReader`], which hands out the latest snapshot and cannot
//! write. A standalone node has no writer: its readers keep the state
//! computed at start.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use parking_lot::Mutex;

use super::machine;
use crate::admission::NodeInfo;
use crate::quantity::{parse_bytes, parse_millis};

#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct NodeState {
    pub(crate) name: String,
    /// The Node's UID, once the API server has it.
    pub(crate) uid: Option<String>,
    pub(crate) labels: BTreeMap<String, String>,
    /// Resource name to quantity, as reported in `status.allocatable`.
    pub(crate) allocatable: BTreeMap<String, String>,
    /// The Ready condition last reported.
    pub(crate) ready: bool,
    /// The Node's `node.alpha.kubernetes.io/ttl` annotation: how long a
    /// Secret or ConfigMap read by the Cache strategy may be kept.
    pub(crate) object_ttl: Option<std::time::Duration>,
}

/// The node as the machine describes it before the API server is heard
/// from: the default labels, the `--node-labels`, and the allocatable
/// resources computed locally (admission uses them in standalone mode too).
#[allow(clippy::too_many_arguments)]
pub(crate) fn initial_node_state(
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
        object_ttl: None,
    }
}

/// Makes `state` the first snapshot: the writer for the state's owner and
/// a reader to clone for everyone else.
pub(crate) fn publish(state: NodeState) -> (NodeStateWriter, NodeStateReader) {
    let current = Arc::new(state);
    let reader = NodeStateReader(Arc::new(Mutex::new(current.clone())));
    (
        NodeStateWriter {
            current,
            reader: reader.clone(),
        },
        reader,
    )
}

/// The one writer of the node state (not `Clone`), held by the
/// `node-status` thread.
pub(crate) struct NodeStateWriter {
    /// The snapshot last published.
    current: Arc<NodeState>,
    reader: NodeStateReader,
}

impl NodeStateWriter {
    /// Changes the state with `change` and publishes the result, unless
    /// nothing changed.
    pub(crate) fn update(&mut self, change: impl FnOnce(&mut NodeState)) {
        let mut next = NodeState::clone(&self.current);
        change(&mut next);
        if next != *self.current {
            self.current = Arc::new(next);
            *self.reader.0.lock() = self.current.clone();
        }
    }
}

/// A read-only handle on the node state: each [`read`](Self::read) takes
/// the latest snapshot, and no lock is held while it is used.
#[derive(Clone)]
pub(crate) struct NodeStateReader(Arc<Mutex<Arc<NodeState>>>);

impl NodeStateReader {
    /// The state as last published.
    pub(crate) fn read(&self) -> Arc<NodeState> {
        self.0.lock().clone()
    }
}

/// The labels a kubelet sets on its own Node, plus `--node-labels`.
pub(crate) fn default_labels(
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
pub(crate) fn node_info(state: &NodeState) -> NodeInfo {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn readers_see_what_the_writer_publishes_and_keep_their_snapshot() {
        let (mut writer, reader) = publish(NodeState {
            name: "n".into(),
            ..Default::default()
        });
        let before = reader.read();
        writer.update(|st| st.uid = Some("u1".into()));
        assert_eq!(reader.clone().read().uid.as_deref(), Some("u1"));
        assert_eq!(before.uid, None, "a snapshot taken stays as it was");
        // An update that changes nothing publishes nothing new.
        let now = reader.read();
        writer.update(|st| st.uid = Some("u1".into()));
        assert!(Arc::ptr_eq(&now, &reader.read()));
    }
}
