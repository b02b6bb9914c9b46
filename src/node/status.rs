//! Node registration and node status (upstream `kubelet_node_status.go` and
//! `nodestatus`): the `node-status` thread registers the Node (reconciling
//! an existing one instead of failing), then every
//! `--node-status-update-frequency` computes the status from the machine
//! and the runtime and patches `nodes/<name>/status` when it changed, or at
//! least every `--node-status-report-frequency`. The patch is a two-way
//! strategic merge patch against the status last sent, as upstream sends:
//! only what changed, with the conditions' order.
//!
//! After an outage (the lease thread reports a heartbeat recovery) the Node
//! is read once and the next patch is computed against the server's status,
//! as upstream compares with the Node it reads: while the node was away the
//! node lifecycle controller may have set its conditions to Unknown, and
//! only the node sets them back.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use crossbeam_channel::{bounded, Receiver, Sender};
use log::{debug, info, warn};
use serde_json::{json, Map, Value};

use super::lease::sleep;
use super::machine::{self, MachineInfo};
use super::taint::Taint;
use super::NodeStateWriter;
use crate::apitime::rfc3339;
use crate::cri::{ImageService, RuntimeService};
use crate::events::{EventRecorder, EventType, ObjectRef};
use crate::kube::{ApiError, Client, PatchKind};
use crate::thread::{spawn_named, JoinOnDrop};

/// Images listed in the node status, largest first (upstream: 50).
const MAX_IMAGES: usize = 50;
/// Names listed per image (upstream: 5).
const MAX_NAMES_PER_IMAGE: usize = 5;

/// What the node reports and how often.
#[derive(Debug, Clone)]
pub(crate) struct NodeConfig {
    pub(crate) name: String,
    pub(crate) register: bool,
    pub(crate) labels: Vec<(String, String)>,
    pub(crate) taints: Vec<Taint>,
    pub(crate) update_frequency: Duration,
    pub(crate) report_frequency: Duration,
    pub(crate) max_pods: u32,
    pub(crate) kube_reserved: Vec<(String, String)>,
    pub(crate) system_reserved: Vec<(String, String)>,
    pub(crate) node_ip: Option<IpAddr>,
    /// Its filesystem is the node's ephemeral storage.
    pub(crate) root_dir: PathBuf,
    /// The port the node API listens on (`daemonEndpoints`); 0: none.
    pub(crate) kubelet_port: u16,
    /// The hard memory.available eviction threshold, kept out of
    /// allocatable ("0": none).
    pub(crate) eviction_hard_memory: String,
    /// The hard nodefs.available threshold, kept out of allocatable
    /// ephemeral-storage ("0": none).
    pub(crate) eviction_hard_nodefs: String,
    /// The eviction manager's pressure conditions; without one (run-once)
    /// the signals are read against the default thresholds.
    pub(crate) pressure: Option<Arc<super::pressure::State>>,
}

/// Handle of the `node-status` thread; dropping it stops and joins it.
pub(crate) struct NodeStatusController {
    _stop: Sender<()>,
    _thread: JoinOnDrop<()>,
}

impl NodeStatusController {
    pub(crate) fn start(
        client: Client,
        runtime: Arc<dyn RuntimeService>,
        images: Arc<dyn ImageService>,
        config: NodeConfig,
        state: NodeStateWriter,
        recoveries: Receiver<()>,
        recorder: EventRecorder,
    ) -> std::io::Result<NodeStatusController> {
        let (stop_tx, stop_rx) = bounded(0);
        let thread = spawn_named("node-status", move || {
            let machine = machine::read_machine_info();
            let mut n = NodeStatus {
                client,
                runtime,
                images,
                config,
                state,
                recorder,
                machine,
                runtime_version: None,
                sent: None,
                sent_at: None,
                ready: None,
                pressure: BTreeMap::new(),
                recoveries,
                resync_due: false,
            };
            n.run(stop_rx)
        })?;
        Ok(NodeStatusController {
            _stop: stop_tx,
            _thread: thread,
        })
    }
}

struct NodeStatus {
    client: Client,
    runtime: Arc<dyn RuntimeService>,
    images: Arc<dyn ImageService>,
    config: NodeConfig,
    /// The node state, which this thread alone writes.
    state: NodeStateWriter,
    recorder: EventRecorder,
    machine: MachineInfo,
    runtime_version: Option<String>,
    /// The status as last accepted by the server.
    sent: Option<Value>,
    sent_at: Option<Instant>,
    /// The Ready status last reported, for NodeReady/NodeNotReady events.
    ready: Option<bool>,
    /// Pressure conditions last reported, for their events.
    pressure: BTreeMap<&'static str, bool>,
    /// A message for each heartbeat recovery, from the lease thread.
    recoveries: Receiver<()>,
    /// A recovery was reported and the Node not read since.
    resync_due: bool,
}

fn node_path(name: &str) -> String {
    format!("/api/v1/nodes/{name}")
}

impl NodeStatus {
    fn run(&mut self, stop: Receiver<()>) {
        let mut registered = !self.config.register;
        let mut delay = Duration::from_millis(100);
        if registered {
            // Not registering: the Node exists already; learn its UID and labels.
            match self.client.get(&node_path(&self.config.name)) {
                Ok(node) => self.remember(&node),
                Err(e) => warn!("node {}: {e}", self.config.name),
            }
        }
        loop {
            if !registered {
                match self.register() {
                    Ok(()) => registered = true,
                    Err(e) => {
                        warn!(
                            "unable to register node {} with the API server: {e}; retrying in {:.1}s",
                            self.config.name,
                            delay.as_secs_f32()
                        );
                        if !sleep(&stop, delay) {
                            return;
                        }
                        delay = (delay * 2).min(Duration::from_secs(7));
                        continue;
                    }
                }
            }
            self.resync_after_outage();
            if let Err(e) = self.update() {
                warn!("node {}: status update failed: {e}", self.config.name);
                if e.is_not_found() && self.config.register {
                    // The Node was deleted: register it again.
                    registered = false;
                    self.sent = None;
                    continue;
                }
            }
            if !sleep(&stop, self.config.update_frequency) {
                return;
            }
        }
    }

    /// Reads the Node once after the link to the apiserver came back, so
    /// that the next patch undoes what others changed meanwhile.
    fn resync_after_outage(&mut self) {
        if self.recoveries.try_recv().is_ok() {
            self.resync_due = true;
        }
        if !self.resync_due {
            return;
        }
        match self.client.get(&node_path(&self.config.name)) {
            Ok(node) => {
                self.resync_due = false;
                self.remember(&node);
                if let Some(status) = node.get("status") {
                    if self
                        .sent
                        .as_ref()
                        .is_some_and(|sent| !same_ignoring_heartbeats(sent, status))
                    {
                        info!(
                            "node {}: its status changed in the API server during the outage; \
                             reporting the current one",
                            self.config.name
                        );
                    }
                    self.sent = Some(status.clone());
                }
            }
            // Tried again at the next update.
            Err(e) => warn!("node {}: reading it after an outage: {e}", self.config.name),
        }
    }

    fn remember(&mut self, node: &Value) {
        self.state.update(|st| {
            if let Some(uid) = node.pointer("/metadata/uid").and_then(Value::as_str) {
                st.uid = Some(uid.to_string());
            }
            // Upstream reads it as whole seconds; anything else means no TTL.
            st.object_ttl = node
                .pointer("/metadata/annotations/node.alpha.kubernetes.io~1ttl")
                .and_then(Value::as_str)
                .and_then(|t| t.parse::<u64>().ok())
                .map(std::time::Duration::from_secs);
            if let Some(labels) = node.pointer("/metadata/labels").and_then(Value::as_object) {
                st.labels = labels
                    .iter()
                    .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
                    .collect();
            }
        });
    }

    /// The labels the kubelet sets on its own Node.
    fn default_labels(&self) -> BTreeMap<String, String> {
        super::state::default_labels(&self.config.name, &self.machine, &self.config.labels)
    }

    fn register(&mut self) -> Result<(), ApiError> {
        let status = self.compute_status();
        let taints: Vec<Value> = self
            .config
            .taints
            .iter()
            .map(|t| {
                let mut v = json!({"key": t.key, "effect": t.effect});
                if !t.value.is_empty() {
                    v["value"] = json!(t.value);
                }
                v
            })
            .collect();
        let mut spec = json!({});
        if !taints.is_empty() {
            spec["taints"] = Value::Array(taints);
        }
        let body = json!({
            "kind": "Node",
            "apiVersion": "v1",
            "metadata": {
                "name": self.config.name,
                "labels": self.default_labels(),
                "annotations": {"volumes.kubernetes.io/controller-managed-attach-detach": "true"},
            },
            "spec": spec,
            "status": status,
        });
        match self.client.create("/api/v1/nodes", &body) {
            Ok(node) => {
                info!("node {} registered", self.config.name);
                self.remember(&node);
                self.accepted(node.get("status").cloned().unwrap_or(status));
                self.node_events();
                Ok(())
            }
            Err(e) if e.is_already_exists() => {
                let node = self.client.get(&node_path(&self.config.name))?;
                self.reconcile(&node)?;
                info!(
                    "node {} was registered already; reconciled",
                    self.config.name
                );
                // The server's status is what the next patch is computed against.
                self.sent = node.get("status").cloned();
                self.sent_at = None;
                Ok(())
            }
            Err(e) => Err(e),
        }
    }

    /// Brings an existing Node's default labels up to date (upstream
    /// `reconcileExistingNode`); taints are left alone, as upstream.
    fn reconcile(&mut self, node: &Value) -> Result<(), ApiError> {
        let have = node.pointer("/metadata/labels").and_then(Value::as_object);
        let mut missing = Map::new();
        for (k, v) in self.default_labels() {
            if have.and_then(|m| m.get(&k)).and_then(Value::as_str) != Some(v.as_str()) {
                missing.insert(k, Value::String(v));
            }
        }
        if missing.is_empty() {
            self.remember(node);
            return Ok(());
        }
        let patch = json!({"metadata": {"labels": missing}});
        let updated =
            self.client
                .patch(&node_path(&self.config.name), PatchKind::Strategic, &patch)?;
        self.remember(&updated);
        Ok(())
    }

    fn accepted(&mut self, status: Value) {
        if let Some(alloc) = status.get("allocatable").and_then(Value::as_object) {
            let alloc: BTreeMap<String, String> = alloc
                .iter()
                .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
                .collect();
            self.state.update(|st| st.allocatable = alloc);
        }
        self.sent = Some(status);
        self.sent_at = Some(Instant::now());
    }

    fn runtime_version(&mut self) -> String {
        if self.runtime_version.is_none() {
            match self.runtime.version() {
                Ok(v) => {
                    self.runtime_version =
                        Some(format!("{}://{}", v.runtime_name, v.runtime_version))
                }
                Err(e) => debug!("runtime version: {e}"),
            }
        }
        self.runtime_version.clone().unwrap_or_default()
    }

    /// Ready from the runtime's own conditions, with its reason when not.
    fn readiness(&self) -> (bool, String) {
        match self.runtime.status() {
            Err(e) => (false, format!("container runtime is down: {e}")),
            Ok(resp) => {
                let conds = resp
                    .status
                    .as_ref()
                    .map(|s| s.conditions.clone())
                    .unwrap_or_default();
                let mut problems = Vec::new();
                for want in ["RuntimeReady", "NetworkReady"] {
                    match conds.iter().find(|c| c.type_ == want) {
                        Some(c) if c.status => {}
                        Some(c) => {
                            let what = if want == "RuntimeReady" {
                                "container runtime not ready"
                            } else {
                                "container runtime network not ready"
                            };
                            problems.push(format!(
                                "{what}: {want}=false reason:{} message:{}",
                                c.reason, c.message
                            ));
                        }
                        None => problems.push(format!(
                            "container runtime status check may not have completed yet: no {want} condition"
                        )),
                    }
                }
                if problems.is_empty() {
                    (true, "kubelet is posting ready status".to_string())
                } else {
                    (false, problems.join(", "))
                }
            }
        }
    }

    fn images(&self) -> Vec<Value> {
        let mut list = match self.images.list_images(None) {
            Ok(l) => l,
            Err(e) => {
                debug!("node status: list images: {e}");
                return Vec::new();
            }
        };
        list.sort_by_key(|i| std::cmp::Reverse(i.size));
        list.into_iter()
            .take(MAX_IMAGES)
            .map(|i| {
                let names: Vec<String> = i
                    .repo_digests
                    .iter()
                    .chain(&i.repo_tags)
                    .take(MAX_NAMES_PER_IMAGE)
                    .cloned()
                    .collect();
                json!({"names": names, "sizeBytes": i.size})
            })
            .collect()
    }

    fn condition(&self, kind: &str, status: bool, reason: &str, message: &str, now: &str) -> Value {
        let old = self.sent.as_ref().and_then(|s| {
            s.get("conditions")?
                .as_array()?
                .iter()
                .find(|c| c.get("type").and_then(Value::as_str) == Some(kind))
                .cloned()
        });
        let status = if status { "True" } else { "False" };
        let transition = match &old {
            Some(o) if o.get("status").and_then(Value::as_str) == Some(status) => o
                .get("lastTransitionTime")
                .cloned()
                .unwrap_or_else(|| json!(now)),
            _ => json!(now),
        };
        json!({
            "type": kind,
            "status": status,
            "lastHeartbeatTime": now,
            "lastTransitionTime": transition,
            "reason": reason,
            "message": message,
        })
    }

    /// The full status as it is now.
    fn compute_status(&mut self) -> Value {
        let now = rfc3339(SystemTime::now());
        let fs = machine::fs_stats(&self.config.root_dir).unwrap_or_else(|e| {
            debug!("node status: {}: {e}", self.config.root_dir.display());
            machine::FsStats::default()
        });
        let capacity = machine::capacity(&self.machine, &fs, self.config.max_pods);
        let reserved = |pairs: &[(String, String)]| -> BTreeMap<String, String> {
            pairs.iter().cloned().collect()
        };
        let allocatable = machine::allocatable(
            &capacity,
            &reserved(&self.config.kube_reserved),
            &reserved(&self.config.system_reserved),
            &self.config.eviction_hard_memory,
            &self.config.eviction_hard_nodefs,
        )
        .unwrap_or_else(|e| {
            warn!("node status: allocatable: {e}; reporting capacity");
            capacity.clone()
        });
        let pressure = match &self.config.pressure {
            Some(s) => machine::Pressure {
                memory: s.has(super::pressure::Condition::Memory),
                disk: s.has(super::pressure::Condition::Disk),
                pid: s.has(super::pressure::Condition::Pid),
            },
            None => machine::read_pressure(&self.config.root_dir),
        };
        let mut conditions = Vec::new();
        for (kind, on) in [
            (machine::PressureKind::Memory, pressure.memory),
            (machine::PressureKind::Disk, pressure.disk),
            (machine::PressureKind::Pid, pressure.pid),
        ] {
            let (_, reason, message) = machine::condition_reason_message(kind, on);
            conditions.push(self.condition(kind.condition_type(), on, reason, message, &now));
        }
        let (ready, message) = self.readiness();
        let reason = if ready {
            "KubeletReady"
        } else {
            "KubeletNotReady"
        };
        conditions.push(self.condition("Ready", ready, reason, &message, &now));
        let addresses: Vec<Value> =
            match machine::node_addresses(self.config.node_ip, &self.config.name) {
                Ok(a) => a
                    .into_iter()
                    .map(|(t, a)| json!({"type": t, "address": a}))
                    .collect(),
                Err(e) => {
                    warn!("node status: addresses: {e}");
                    vec![json!({"type": "Hostname", "address": self.config.name})]
                }
            };
        let runtime_version = self.runtime_version();
        let m = &self.machine;
        json!({
            "capacity": capacity,
            "allocatable": allocatable,
            "conditions": conditions,
            "addresses": addresses,
            // The main port when it listens; 0 when it does not.
            "daemonEndpoints": {"kubeletEndpoint": {"Port": self.config.kubelet_port}},
            "nodeInfo": {
                "machineID": m.machine_id,
                "systemUUID": m.system_uuid,
                "bootID": m.boot_id,
                "kernelVersion": m.kernel_version,
                "osImage": m.os_image,
                "containerRuntimeVersion": runtime_version,
                "kubeletVersion": crate::version::kubelet(),
                "kubeProxyVersion": "",
                "operatingSystem": m.operating_system,
                "architecture": m.architecture,
            },
            "images": self.images(),
        })
    }

    fn update(&mut self) -> Result<(), ApiError> {
        let status = self.compute_status();
        let changed = match &self.sent {
            Some(old) => !same_ignoring_heartbeats(old, &status),
            None => true,
        };
        let due = self
            .sent_at
            .is_none_or(|t| t.elapsed() >= self.config.report_frequency);
        if !changed && !due {
            return Ok(());
        }
        let patch = status_patch(self.sent.as_ref(), &status);
        let node = self.client.patch(
            &format!("{}/status", node_path(&self.config.name)),
            PatchKind::Strategic,
            &patch,
        )?;
        debug!("node status sent ({} bytes)", patch.to_string().len());
        self.remember(&node);
        self.accepted(node.get("status").cloned().unwrap_or(status));
        self.node_events();
        Ok(())
    }

    /// NodeReady / NodeNotReady and the pressure events on transitions.
    fn node_events(&mut self) {
        let Some(sent) = self.sent.clone() else {
            return;
        };
        let node = ObjectRef::node(&self.config.name);
        let conds = sent
            .get("conditions")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        for c in conds {
            let kind = c.get("type").and_then(Value::as_str).unwrap_or("");
            let on = c.get("status").and_then(Value::as_str) == Some("True");
            let event = match kind {
                "Ready" => {
                    if self.ready == Some(on) {
                        continue;
                    }
                    self.ready = Some(on);
                    if on {
                        "NodeReady"
                    } else {
                        "NodeNotReady"
                    }
                }
                "MemoryPressure" | "DiskPressure" | "PIDPressure" => {
                    let key: &'static str = match kind {
                        "MemoryPressure" => "MemoryPressure",
                        "DiskPressure" => "DiskPressure",
                        _ => "PIDPressure",
                    };
                    if self.pressure.get(key) == Some(&on) {
                        continue;
                    }
                    self.pressure.insert(key, on);
                    match (key, on) {
                        ("MemoryPressure", false) => "NodeHasSufficientMemory",
                        ("MemoryPressure", true) => "NodeHasInsufficientMemory",
                        ("DiskPressure", false) => "NodeHasNoDiskPressure",
                        ("DiskPressure", true) => "NodeHasDiskPressure",
                        ("PIDPressure", false) => "NodeHasSufficientPID",
                        _ => "NodeHasInsufficientPID",
                    }
                }
                _ => continue,
            };
            if kind == "Ready" {
                self.state.update(|st| st.ready = on);
            }
            self.recorder.event(
                &node,
                EventType::Normal,
                event,
                format!("Node {} status is now: {event}", self.config.name),
            );
        }
    }
}

fn strip_heartbeats(status: &Value) -> Value {
    let mut s = status.clone();
    if let Some(conds) = s.get_mut("conditions").and_then(Value::as_array_mut) {
        for c in conds {
            if let Some(o) = c.as_object_mut() {
                o.remove("lastHeartbeatTime");
            }
        }
    }
    s
}

/// True when two statuses differ at most in their heartbeat times.
pub(crate) fn same_ignoring_heartbeats(a: &Value, b: &Value) -> bool {
    strip_heartbeats(a) == strip_heartbeats(b)
}

/// The strategic merge patch from `old` to `new` status: changed fields only;
/// conditions merged by type with their order, each with its changed fields;
/// addresses merged by type with their order, removed types deleted.
pub(crate) fn status_patch(old: Option<&Value>, new: &Value) -> Value {
    let empty = Map::new();
    let old_map = old.and_then(Value::as_object).unwrap_or(&empty);
    let mut out = Map::new();
    let Some(new_map) = new.as_object() else {
        return json!({"status": {}});
    };
    for (key, value) in new_map {
        let before = old_map.get(key);
        match key.as_str() {
            "conditions" | "addresses" => {
                let list = value.as_array().cloned().unwrap_or_default();
                let old_list = before
                    .and_then(Value::as_array)
                    .cloned()
                    .unwrap_or_default();
                let type_of = |v: &Value| v.get("type").and_then(Value::as_str).map(str::to_string);
                let mut items = Vec::new();
                for item in &list {
                    let t = type_of(item);
                    let prev = old_list.iter().find(|o| type_of(o) == t);
                    match (prev, item.as_object()) {
                        (Some(p), Some(fields)) if key == "conditions" => {
                            let mut changed = Map::new();
                            for (f, v) in fields {
                                if p.get(f) != Some(v) {
                                    changed.insert(f.clone(), v.clone());
                                }
                            }
                            if !changed.is_empty() {
                                changed.insert("type".into(), json!(t));
                                items.push(Value::Object(changed));
                            }
                        }
                        (Some(p), _) if p == item => {}
                        _ => items.push(item.clone()),
                    }
                }
                for o in &old_list {
                    let t = type_of(o);
                    if key == "addresses" && !list.iter().any(|n| type_of(n) == t) {
                        items.push(json!({"type": t, "$patch": "delete"}));
                    }
                }
                if !items.is_empty() || before.is_none() {
                    let order: Vec<Value> =
                        list.iter().map(|i| json!({"type": type_of(i)})).collect();
                    out.insert(format!("$setElementOrder/{key}"), Value::Array(order));
                    out.insert(key.clone(), Value::Array(items));
                }
            }
            "capacity" | "allocatable" => {
                if before != Some(value) {
                    let mut m = value.as_object().cloned().unwrap_or_default();
                    if let Some(b) = before.and_then(Value::as_object) {
                        for k in b.keys() {
                            m.entry(k.clone()).or_insert(Value::Null);
                        }
                    }
                    out.insert(key.clone(), Value::Object(m));
                }
            }
            _ => {
                if before != Some(value) {
                    out.insert(key.clone(), value.clone());
                }
            }
        }
    }
    json!({ "status": out })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cond(t: &str, s: &str, hb: &str, tr: &str) -> Value {
        json!({"type": t, "status": s, "lastHeartbeatTime": hb, "lastTransitionTime": tr,
               "reason": "R", "message": "m"})
    }

    #[test]
    fn patch_carries_only_changes_and_condition_order() {
        let old = json!({
            "capacity": {"cpu": "2", "pods": "110"},
            "conditions": [cond("MemoryPressure", "False", "t1", "t0"), cond("Ready", "False", "t1", "t0")],
            "addresses": [{"type": "InternalIP", "address": "10.0.0.1"}, {"type": "Hostname", "address": "e"}],
            "nodeInfo": {"bootID": "a"},
        });
        let mut new = old.clone();
        new["conditions"] = json!([
            cond("MemoryPressure", "False", "t2", "t0"),
            cond("Ready", "True", "t2", "t2")
        ]);
        let p = status_patch(Some(&old), &new);
        assert_eq!(
            p,
            json!({"status": {
                "$setElementOrder/conditions": [{"type": "MemoryPressure"}, {"type": "Ready"}],
                "conditions": [
                    {"type": "MemoryPressure", "lastHeartbeatTime": "t2"},
                    {"type": "Ready", "status": "True", "lastHeartbeatTime": "t2", "lastTransitionTime": "t2"},
                ],
            }})
        );
        assert!(same_ignoring_heartbeats(&old, &{
            let mut s = old.clone();
            s["conditions"][0]["lastHeartbeatTime"] = json!("t9");
            s
        }));
        assert!(!same_ignoring_heartbeats(&old, &new));

        // A removed address type is deleted; a removed capacity key is nulled.
        let mut moved = old.clone();
        moved["addresses"] = json!([{"type": "Hostname", "address": "e"}]);
        moved["capacity"] = json!({"cpu": "2"});
        let p = status_patch(Some(&old), &moved);
        assert_eq!(
            p["status"]["addresses"],
            json!([{"type": "InternalIP", "$patch": "delete"}])
        );
        assert_eq!(p["status"]["capacity"], json!({"cpu": "2", "pods": null}));
        assert!(p["status"].get("conditions").is_none());

        // Without a previous status everything is sent.
        let p = status_patch(None, &new);
        assert_eq!(p["status"]["conditions"], new["conditions"]);
        assert_eq!(p["status"]["nodeInfo"], new["nodeInfo"]);
    }
}
