//! Pod admission: the checks the kubelet runs on a pod before it starts it.
//!
//! These are the scheduler predicates that still matter once a pod is bound
//! to this node (upstream `pkg/kubelet/lifecycle/predicate.go`): the pod OS,
//! then resource fit, required node affinity and node selector, the node
//! name, and host port conflicts with the pods already running. The first
//! failing check is the pod's rejection; its reason and message are the ones
//! the upstream kubelet writes into the pod's status (`OutOfcpu`,
//! `NodeAffinity`, ...), so clients that look at them keep working.
//!
//! Pure functions over a `Pod`, the pods already admitted and a snapshot of
//! the node: no I/O, no clock. The caller passes the node's labels as the
//! API has them (including `kubernetes.io/hostname` and `kubernetes.io/os`).
//!
//! Not checked (upstream does): NoExecute taints (the node has none),
//! device-plugin resources (there are no device plugins, so extended
//! resources are dropped from the request as upstream does for resources
//! unknown to the node), and eviction of lower-priority pods to make room
//! for a critical one.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Container, NodeSelectorRequirement, NodeSelectorTerm, Pod};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use crate::quantity::parse_quantity_scaled;
use crate::sysctl::Allowlist;

/// Reason when the pod's `kubernetes.io/os` label names another OS.
pub(crate) const POD_OS_SELECTOR_NODE_LABEL_DOES_NOT_MATCH: &str =
    "PodOSSelectorNodeLabelDoesNotMatch";
/// Reason when the pod's `spec.os.name` names another OS.
pub(crate) const POD_OS_NOT_SUPPORTED: &str = "PodOSNotSupported";
/// Reason when the pod's resource quantities cannot be read.
pub(crate) const UNEXPECTED_ADMISSION_ERROR: &str = "UnexpectedAdmissionError";
/// Prefix of the reason for a resource the node has too little of.
pub(crate) const INSUFFICIENT_RESOURCE_PREFIX: &str = "OutOf";
/// Predicate name (and reason) for a failed node selector or node affinity.
pub(crate) const NODE_AFFINITY: &str = "NodeAffinity";
/// Predicate name (and reason) for `spec.nodeName` naming another node.
pub(crate) const NODE_NAME: &str = "NodeName";
/// Predicate name (and reason) for a host port already taken.
pub(crate) const NODE_PORTS: &str = "NodePorts";
/// Reason when a privileged container or a host namespace is refused
/// (`--allow-privileged=false`).
pub(crate) const PRIVILEGED_FORBIDDEN: &str = "PrivilegedForbidden";

/// Reason when a pod asks for a user namespace (`spec.hostUsers: false`):
/// tinylet's own. The CRI runtimes tinylet targets (containerd 1.6 and 1.7,
/// Debian's among them) cannot give a pod one through CRI (containerd 2.0
/// and CRI's `userns_options` can). Upstream fails such a pod later, at
/// sandbox creation, with the feature gate's or the runtime's error
/// (FailedCreatePodSandBox, the pod Pending for ever); refusing it at
/// admission reports it Failed at once, with a reason that says why.
pub(crate) const USER_NAMESPACES_UNSUPPORTED: &str = "UserNamespacesNotSupported";

/// Reason when an API pod has the full name of a static pod of this node
/// (tinylet's own: upstream has no such check).
pub(crate) const STATIC_POD_NAME_CONFLICT: &str = "StaticPodNameConflict";

/// The rejection of an API pod named as the static pod `full_name` of
/// `source` (a manifest file or URL) is.
pub(crate) fn static_name_conflict(full_name: &str, source: &str) -> Rejection {
    Rejection {
        reason: STATIC_POD_NAME_CONFLICT.into(),
        message: format!(
            "Pod name {full_name} belongs to a static pod of this node (source {source}); \
             a pod from the API server cannot take it"
        ),
    }
}

const NODE_AFFINITY_DESC: &str = "node(s) didn't match Pod's node affinity/selector";
const NODE_NAME_DESC: &str = "node(s) didn't match the requested node name";
const NODE_PORTS_DESC: &str = "node(s) didn't have free ports for the requested pod ports";

const LABEL_OS: &str = "kubernetes.io/os";
const BIND_ALL_HOST_IP: &str = "0.0.0.0";

/// What admission needs to know about this node.
#[derive(Debug, Clone)]
pub(crate) struct NodeInfo {
    /// The Node object's name.
    pub(crate) name: String,
    /// The Node object's labels.
    pub(crate) labels: BTreeMap<String, String>,
    /// Allocatable CPU in millicores.
    pub(crate) allocatable_milli_cpu: i64,
    /// Allocatable memory in bytes.
    pub(crate) allocatable_memory: i64,
    /// Allocatable ephemeral storage in bytes.
    pub(crate) allocatable_ephemeral_storage: i64,
    /// The most pods the node runs at once (`--max-pods`).
    pub(crate) allowed_pod_number: i64,
    /// The node's OS as Go names it ("linux").
    pub(crate) os: &'static str,
    /// Whether privileged containers and host namespaces may run
    /// (`--allow-privileged`).
    pub(crate) allow_privileged: bool,
    /// The sysctls pods may set (the safe set and
    /// `--allowed-unsafe-sysctls`).
    pub(crate) sysctls: Arc<Allowlist>,
}

/// Why a pod was not admitted: the pod status' `reason` and `message`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Rejection {
    pub(crate) reason: String,
    pub(crate) message: String,
}

impl fmt::Display for Rejection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.reason, self.message)
    }
}

/// A pod's effective resource requests.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Requests {
    pub(crate) milli_cpu: i64,
    /// Bytes.
    pub(crate) memory: i64,
    /// Bytes.
    pub(crate) ephemeral_storage: i64,
    /// Other node-level resources that the fit check counts (`hugepages-*`,
    /// `attachable-volumes-*`, `*kubernetes.io/*`), in whole units.
    pub(crate) scalar: BTreeMap<String, i64>,
}

/// A resource quantity in a pod spec that is not a Kubernetes quantity.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct QuantityError {
    /// Where it is, e.g. `spec.containers[0].resources.requests.cpu`.
    pub(crate) field: String,
    pub(crate) value: String,
}

impl fmt::Display for QuantityError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: invalid quantity {:?}", self.field, self.value)
    }
}

impl std::error::Error for QuantityError {}

/// Decides whether `pod` may start on `node`, next to the `active` pods
/// (admitted and not yet terminated, `pod` itself not among them).
pub(crate) fn admit(pod: &Pod, active: &[&Pod], node: &NodeInfo) -> Result<(), Rejection> {
    // Sysctls first, as upstream's sysctl admit handler runs before its
    // predicates.
    node.sysctls.admit(pod).map_err(|message| Rejection {
        reason: crate::sysctl::SYSCTL_FORBIDDEN.into(),
        message,
    })?;
    if pod.spec.as_ref().and_then(|s| s.host_users) == Some(false) {
        return Err(Rejection {
            reason: USER_NAMESPACES_UNSUPPORTED.into(),
            message: "Pod requested a user namespace (spec.hostUsers: false), \
                      but the container runtime cannot create one through CRI"
                .into(),
        });
    }
    // Then the OS checks: making room would not help these.
    if let Some(os) = pod.metadata.labels.as_ref().and_then(|l| l.get(LABEL_OS)) {
        // Upstream looks at the pod's labels here, not its node selector; a
        // node selector on the OS is the affinity check's business.
        if os != node.os {
            return Err(Rejection {
                reason: POD_OS_SELECTOR_NODE_LABEL_DOES_NOT_MATCH.into(),
                message:
                    "Failed to admit pod as the `kubernetes.io/os` label doesn't match node label"
                        .into(),
            });
        }
    }
    let spec = pod.spec.as_ref();
    if let Some(os) = spec.and_then(|s| s.os.as_ref()) {
        if os.name != node.os {
            return Err(Rejection {
                reason: POD_OS_NOT_SUPPORTED.into(),
                message: "Failed to admit pod as the OS field doesn't match node OS".into(),
            });
        }
    }

    check_privileged(pod, node)?;

    let want = try_pod_requests(pod).map_err(|e| Rejection {
        reason: UNEXPECTED_ADMISSION_ERROR.into(),
        message: e.to_string(),
    })?;
    if let Some(r) = insufficient_resource(&want, active, node) {
        return Err(r);
    }
    if !matches_node_affinity(pod, node) {
        return Err(predicate_failure(NODE_AFFINITY, NODE_AFFINITY_DESC));
    }
    if let Some(name) = spec.and_then(|s| s.node_name.as_deref()) {
        if !name.is_empty() && name != node.name {
            return Err(predicate_failure(NODE_NAME, NODE_NAME_DESC));
        }
    }
    if host_ports_conflict(pod, active) {
        return Err(predicate_failure(NODE_PORTS, NODE_PORTS_DESC));
    }
    Ok(())
}

/// The checks a pod must pass again whenever its spec changes (a manifest
/// pod edited in place keeps its UID): its sysctls and, under
/// `--allow-privileged=false`, privileged containers and host namespaces.
/// Resources, affinity and host ports were settled when it was admitted.
pub(crate) fn admit_update(pod: &Pod, node: &NodeInfo) -> Result<(), Rejection> {
    node.sysctls.admit(pod).map_err(|message| Rejection {
        reason: crate::sysctl::SYSCTL_FORBIDDEN.into(),
        message,
    })?;
    check_privileged(pod, node)
}

fn check_privileged(pod: &Pod, node: &NodeInfo) -> Result<(), Rejection> {
    if node.allow_privileged {
        return Ok(());
    }
    match privileged_use(pod) {
        None => Ok(()),
        Some(what) => Err(Rejection {
            reason: PRIVILEGED_FORBIDDEN.into(),
            message: format!(
                "Pod specified {what}, but privileged pods are disallowed on this node (--allow-privileged=false)"
            ),
        }),
    }
}

/// The capabilities a container runtime grants by default (containerd's
/// and CRI-O's default set, Docker's before them). Adding one of these is
/// no privilege; adding anything else is.
const DEFAULT_CAPABILITIES: &[&str] = &[
    "AUDIT_WRITE",
    "CHOWN",
    "DAC_OVERRIDE",
    "FOWNER",
    "FSETID",
    "KILL",
    "MKNOD",
    "NET_BIND_SERVICE",
    "NET_RAW",
    "SETFCAP",
    "SETGID",
    "SETPCAP",
    "SETUID",
    "SYS_CHROOT",
];

/// What in one container's security context needs privileges: `privileged`,
/// a capability added beyond the runtime's default set (`ALL` included), or
/// `procMount: Unmasked` (an unmasked /proc gives what the masked paths
/// hide). Upstream's `--allow-privileged=false` looks at `privileged` only;
/// tinylet also refuses the other two, which give a container the same
/// reach into the host (DEVIATIONS.md).
fn container_privilege(sc: Option<&k8s_openapi::api::core::v1::SecurityContext>) -> Option<String> {
    let sc = sc?;
    if sc.privileged == Some(true) {
        return Some("privileged".into());
    }
    if let Some(cap) = sc
        .capabilities
        .as_ref()
        .and_then(|c| c.add.as_ref())
        .into_iter()
        .flatten()
        .find(|cap| {
            let name = cap.trim().to_ascii_uppercase();
            let name = name.strip_prefix("CAP_").unwrap_or(&name);
            !DEFAULT_CAPABILITIES.contains(&name)
        })
    {
        return Some(format!("capability {cap:?} added to"));
    }
    if sc.proc_mount.as_deref() == Some("Unmasked") {
        return Some("procMount Unmasked in".into());
    }
    None
}

/// What in `pod` needs privileges: a host namespace, or a privileged (init,
/// or ephemeral) container (see [`container_privilege`]); `None` when
/// nothing does.
pub(crate) fn privileged_use(pod: &Pod) -> Option<String> {
    let spec = pod.spec.as_ref()?;
    for (on, what) in [
        (spec.host_network, "host networking"),
        (spec.host_pid, "host PID"),
        (spec.host_ipc, "host IPC"),
    ] {
        if on == Some(true) {
            return Some(what.into());
        }
    }
    let init = spec
        .init_containers
        .iter()
        .flatten()
        .map(|c| ("init container", &c.name, c.security_context.as_ref()));
    let app = spec
        .containers
        .iter()
        .map(|c| ("container", &c.name, c.security_context.as_ref()));
    let ephemeral = spec
        .ephemeral_containers
        .iter()
        .flatten()
        .map(|c| ("ephemeral container", &c.name, c.security_context.as_ref()));
    init.chain(app)
        .chain(ephemeral)
        .find_map(|(kind, name, sc)| {
            container_privilege(sc).map(|what| format!("{what} {kind} {name:?}"))
        })
}

fn predicate_failure(name: &str, desc: &str) -> Rejection {
    Rejection {
        reason: name.into(),
        message: format!("Predicate {name} failed: {desc}"),
    }
}

fn insufficient(resource: &str, requested: i64, used: i64, capacity: i64) -> Rejection {
    let reason = format!("{INSUFFICIENT_RESOURCE_PREFIX}{resource}");
    Rejection {
        reason,
        message: format!(
            "Node didn't have enough resource: {resource}, requested: {requested}, used: {used}, capacity: {capacity}"
        ),
    }
}

/// The first resource the node lacks for `want`, in upstream's order: pods,
/// cpu, memory, ephemeral-storage, then the others by name.
fn insufficient_resource(want: &Requests, active: &[&Pod], node: &NodeInfo) -> Option<Rejection> {
    let running = active.len() as i64;
    if running + 1 > node.allowed_pod_number {
        return Some(insufficient("pods", 1, running, node.allowed_pod_number));
    }
    if *want == Requests::default() {
        return None;
    }
    let mut used = Requests::default();
    for p in active {
        add(&mut used, &pod_requests(p));
    }
    let plain = [
        (
            "cpu",
            want.milli_cpu,
            used.milli_cpu,
            node.allocatable_milli_cpu,
        ),
        ("memory", want.memory, used.memory, node.allocatable_memory),
        (
            "ephemeral-storage",
            want.ephemeral_storage,
            used.ephemeral_storage,
            node.allocatable_ephemeral_storage,
        ),
    ];
    for (name, requested, used, capacity) in plain {
        if capacity < requested.saturating_add(used) {
            return Some(insufficient(name, requested, used, capacity));
        }
    }
    // The node advertises none of the scalar resources.
    for (name, &requested) in &want.scalar {
        let used = used.scalar.get(name).copied().unwrap_or(0);
        if requested.saturating_add(used) > 0 {
            return Some(insufficient(name, requested, used, 0));
        }
    }
    None
}

/// The pod's effective requests: the larger of the running set (regular
/// containers plus sidecars, i.e. init containers with `restartPolicy:
/// Always`) and each init container's peak (itself plus the sidecars started
/// before it); pod-level `spec.resources.requests` for cpu and memory replace
/// the containers' sum; then `spec.overhead` is added. A quantity that cannot
/// be parsed counts as zero; [`try_pod_requests`] reports it instead.
pub(crate) fn pod_requests(pod: &Pod) -> Requests {
    compute_requests(pod, &mut |_| {})
}

/// Like [`pod_requests`], but fails on the first quantity that cannot be
/// parsed.
pub(crate) fn try_pod_requests(pod: &Pod) -> Result<Requests, QuantityError> {
    let mut first = None;
    let r = compute_requests(pod, &mut |e| {
        first.get_or_insert(e);
    });
    match first {
        Some(e) => Err(e),
        None => Ok(r),
    }
}

fn compute_requests(pod: &Pod, on_error: &mut dyn FnMut(QuantityError)) -> Requests {
    let Some(spec) = pod.spec.as_ref() else {
        return Requests::default();
    };
    let mut total = Requests::default();
    for (i, c) in spec.containers.iter().enumerate() {
        let r = container_requests(c, &format!("spec.containers[{i}]"), on_error);
        add(&mut total, &r);
    }
    let mut sidecars = Requests::default();
    let mut init_peak = Requests::default();
    for (i, c) in spec.init_containers.iter().flatten().enumerate() {
        let r = container_requests(c, &format!("spec.initContainers[{i}]"), on_error);
        if c.restart_policy.as_deref() == Some("Always") {
            add(&mut total, &r);
            add(&mut sidecars, &r);
            max_into(&mut init_peak, &sidecars);
        } else {
            let mut peak = r;
            add(&mut peak, &sidecars);
            max_into(&mut init_peak, &peak);
        }
    }
    max_into(&mut total, &init_peak);

    let pod_level = spec.resources.as_ref().and_then(|r| r.requests.as_ref());
    if let Some(reqs) = pod_level {
        for (name, q) in reqs {
            let field = || format!("spec.resources.requests.{name}");
            match name.as_str() {
                "cpu" => total.milli_cpu = quantity(q, 3, field, on_error),
                "memory" => total.memory = quantity(q, 0, field, on_error),
                _ => {}
            }
        }
    }
    if let Some(overhead) = spec.overhead.as_ref() {
        add(
            &mut total,
            &resource_list(overhead, "spec.overhead", on_error),
        );
    }
    total
}

fn container_requests(
    c: &Container,
    path: &str,
    on_error: &mut dyn FnMut(QuantityError),
) -> Requests {
    match c.resources.as_ref().and_then(|r| r.requests.as_ref()) {
        Some(list) => resource_list(list, &format!("{path}.resources.requests"), on_error),
        None => Requests::default(),
    }
}

fn resource_list(
    list: &BTreeMap<String, Quantity>,
    path: &str,
    on_error: &mut dyn FnMut(QuantityError),
) -> Requests {
    let mut r = Requests::default();
    for (name, q) in list {
        let field = || format!("{path}.{name}");
        match name.as_str() {
            "cpu" => r.milli_cpu = quantity(q, 3, field, on_error),
            "memory" => r.memory = quantity(q, 0, field, on_error),
            "ephemeral-storage" => r.ephemeral_storage = quantity(q, 0, field, on_error),
            n if is_counted_scalar(n) => {
                r.scalar
                    .insert(n.to_string(), quantity(q, 0, field, on_error));
            }
            _ => {}
        }
    }
    r
}

/// Whether the fit check counts a resource beyond cpu, memory and ephemeral
/// storage. Extended resources (`vendor.example/thing`) are not counted:
/// upstream drops requests for extended resources the node does not
/// advertise, and this node advertises none. Native ones it does not have
/// (huge pages, attachable volumes, `kubernetes.io/` names) are counted, so
/// requesting them fails. Unprefixed names of no known kind are ignored.
fn is_counted_scalar(name: &str) -> bool {
    name.starts_with("hugepages-")
        || name.starts_with("attachable-volumes-")
        || name.contains("kubernetes.io/")
}

fn quantity(
    q: &Quantity,
    scale: i32,
    field: impl FnOnce() -> String,
    on_error: &mut dyn FnMut(QuantityError),
) -> i64 {
    parse_quantity_scaled(&q.0, scale).unwrap_or_else(|| {
        on_error(QuantityError {
            field: field(),
            value: q.0.clone(),
        });
        0
    })
}

fn add(into: &mut Requests, r: &Requests) {
    into.milli_cpu = into.milli_cpu.saturating_add(r.milli_cpu);
    into.memory = into.memory.saturating_add(r.memory);
    into.ephemeral_storage = into.ephemeral_storage.saturating_add(r.ephemeral_storage);
    for (name, v) in &r.scalar {
        let e = into.scalar.entry(name.clone()).or_insert(0);
        *e = e.saturating_add(*v);
    }
}

fn max_into(into: &mut Requests, r: &Requests) {
    into.milli_cpu = into.milli_cpu.max(r.milli_cpu);
    into.memory = into.memory.max(r.memory);
    into.ephemeral_storage = into.ephemeral_storage.max(r.ephemeral_storage);
    for (name, v) in &r.scalar {
        let e = into.scalar.entry(name.clone()).or_insert(0);
        *e = (*e).max(*v);
    }
}

/// Whether the node satisfies the pod's `nodeSelector` (every pair present
/// in the node's labels) and its required node affinity (the terms ORed,
/// the expressions and fields inside a term ANDed; an empty term or an
/// invalid one matches nothing).
pub(crate) fn matches_node_affinity(pod: &Pod, node: &NodeInfo) -> bool {
    let Some(spec) = pod.spec.as_ref() else {
        return true;
    };
    if let Some(sel) = spec.node_selector.as_ref() {
        if sel.iter().any(|(k, v)| node.labels.get(k) != Some(v)) {
            return false;
        }
    }
    let required = spec
        .affinity
        .as_ref()
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|n| {
            n.required_during_scheduling_ignored_during_execution
                .as_ref()
        });
    match required {
        Some(ns) => ns.node_selector_terms.iter().any(|t| term_matches(t, node)),
        None => true,
    }
}

fn term_matches(term: &NodeSelectorTerm, node: &NodeInfo) -> bool {
    let exprs = term.match_expressions.as_deref().unwrap_or_default();
    let fields = term.match_fields.as_deref().unwrap_or_default();
    if exprs.is_empty() && fields.is_empty() {
        return false;
    }
    // An invalid requirement anywhere makes the whole term match nothing,
    // even when an earlier requirement already failed.
    let labels_ok = exprs.iter().map(|r| label_requirement(r, &node.labels));
    let fields_ok = fields.iter().map(|r| field_requirement(r, node));
    let results: Option<Vec<bool>> = labels_ok.collect();
    let Some(labels) = results else { return false };
    let results: Option<Vec<bool>> = fields_ok.collect();
    let Some(mut fields_match) = results else {
        return false;
    };
    // Upstream only applies field requirements to a node that has a name.
    if node.name.is_empty() {
        fields_match.clear();
    }
    labels.iter().chain(&fields_match).all(|m| *m)
}

/// `None` when the requirement is invalid, else whether the labels match.
fn label_requirement(
    r: &NodeSelectorRequirement,
    labels: &BTreeMap<String, String>,
) -> Option<bool> {
    let values = r.values.as_deref().unwrap_or_default();
    let have = labels.get(&r.key);
    match r.operator.as_str() {
        "In" | "NotIn" if values.is_empty() => None,
        "In" => Some(have.is_some_and(|v| values.contains(v))),
        "NotIn" => Some(have.is_none_or(|v| !values.contains(v))),
        "Exists" | "DoesNotExist" if !values.is_empty() => None,
        "Exists" => Some(have.is_some()),
        "DoesNotExist" => Some(have.is_none()),
        op @ ("Gt" | "Lt") => {
            let [bound] = values else { return None };
            let bound: i64 = bound.parse().ok()?;
            let Some(v) = have.and_then(|v| v.parse::<i64>().ok()) else {
                return Some(false);
            };
            Some(if op == "Gt" { v > bound } else { v < bound })
        }
        _ => None,
    }
}

/// `None` when the requirement is invalid, else whether the node's fields
/// (only `metadata.name`; any other key reads as empty) match.
fn field_requirement(r: &NodeSelectorRequirement, node: &NodeInfo) -> Option<bool> {
    let [value] = r.values.as_deref().unwrap_or_default() else {
        return None;
    };
    let have = if r.key == "metadata.name" {
        node.name.as_str()
    } else {
        ""
    };
    match r.operator.as_str() {
        "In" => Some(have == value),
        "NotIn" => Some(have != value),
        _ => None,
    }
}

/// A host port as the conflict check sees it: empty IP means all addresses,
/// empty protocol means TCP.
#[derive(Debug, PartialEq, Eq)]
struct HostPort<'a> {
    ip: &'a str,
    protocol: &'a str,
    port: i32,
}

/// The host ports a pod holds while it runs: those of its regular containers
/// and of its sidecars (init containers with `restartPolicy: Always`).
fn host_ports(pod: &Pod) -> Vec<HostPort<'_>> {
    let Some(spec) = pod.spec.as_ref() else {
        return Vec::new();
    };
    let sidecars = spec
        .init_containers
        .iter()
        .flatten()
        .filter(|c| c.restart_policy.as_deref() == Some("Always"));
    sidecars
        .chain(&spec.containers)
        .flat_map(|c| c.ports.iter().flatten())
        .filter_map(|p| {
            let port = p.host_port.filter(|p| *p > 0)?;
            let ip = p.host_ip.as_deref().filter(|s| !s.is_empty());
            let protocol = p.protocol.as_deref().filter(|s| !s.is_empty());
            Some(HostPort {
                ip: ip.unwrap_or(BIND_ALL_HOST_IP),
                protocol: protocol.unwrap_or("TCP"),
                port,
            })
        })
        .collect()
}

/// Whether one of the pod's host ports is already held by an active pod: same
/// port and protocol, and the same IP or either side bound to all addresses.
fn host_ports_conflict(pod: &Pod, active: &[&Pod]) -> bool {
    let want = host_ports(pod);
    if want.is_empty() {
        return false;
    }
    let used: Vec<HostPort<'_>> = active.iter().flat_map(|p| host_ports(p)).collect();
    want.iter().any(|w| {
        used.iter().any(|u| {
            u.port == w.port
                && u.protocol == w.protocol
                && (u.ip == w.ip || u.ip == BIND_ALL_HOST_IP || w.ip == BIND_ALL_HOST_IP)
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    fn node() -> NodeInfo {
        let labels = [
            ("kubernetes.io/hostname", "node-a"),
            ("kubernetes.io/os", "linux"),
            ("zone", "a"),
            ("cores", "8"),
        ];
        NodeInfo {
            name: "node-a".into(),
            labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            allocatable_milli_cpu: 1000,
            allocatable_memory: 1 << 30,
            allocatable_ephemeral_storage: 10 << 30,
            allow_privileged: true,
            allowed_pod_number: 10,
            os: "linux",
            sysctls: Default::default(),
        }
    }

    fn pod(spec: Value) -> Pod {
        pod_with(json!({}), spec)
    }

    fn pod_with(metadata: Value, spec: Value) -> Pod {
        serde_json::from_value(json!({"metadata": metadata, "spec": spec})).unwrap()
    }

    /// One container with these requests.
    fn requesting(requests: Value) -> Pod {
        pod(json!({"containers": [{"name": "c", "resources": {"requests": requests}}]}))
    }

    /// One container holding this port.
    fn port(p: Value) -> Pod {
        pod(json!({"containers": [{"name": "c", "ports": [p]}]}))
    }

    fn affinity(terms: Value) -> Pod {
        pod(json!({
            "containers": [{"name": "c"}],
            "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": terms
            }}}
        }))
    }

    fn expr(key: &str, op: &str, values: &[&str]) -> Value {
        json!({"matchExpressions": [{"key": key, "operator": op, "values": values}]})
    }

    fn reject(reason: &str, message: &str) -> Result<(), Rejection> {
        Err(Rejection {
            reason: reason.into(),
            message: message.into(),
        })
    }

    /// A name, the pod, the active pods, what admission says.
    type Case<'a> = (&'a str, Pod, Vec<&'a Pod>, Result<(), Rejection>);

    #[test]
    fn a_pod_asking_for_a_user_namespace_is_refused() {
        let userns = pod(json!({"hostUsers": false, "containers": [{"name": "c"}]}));
        assert_eq!(
            admit(&userns, &[], &node()),
            reject(
                USER_NAMESPACES_UNSUPPORTED,
                "Pod requested a user namespace (spec.hostUsers: false), \
                 but the container runtime cannot create one through CRI"
            )
        );
        let host = pod(json!({"hostUsers": true, "containers": [{"name": "c"}]}));
        assert_eq!(admit(&host, &[], &node()), Ok(()));
    }

    #[test]
    fn rejection_reasons_and_messages() {
        let half_cpu = requesting(json!({"cpu": "500m"}));
        let some_memory = requesting(json!({"memory": "768Mi"}));
        let some_disk = requesting(json!({"ephemeral-storage": "8Gi"}));
        let web = port(json!({"containerPort": 80, "hostPort": 8080}));
        let idle = pod(json!({"containers": [{"name": "c"}]}));
        let full: Vec<&Pod> = vec![&idle; 10];
        let cases: Vec<Case> = vec![
            (
                "too many pods",
                pod(json!({"containers": [{"name": "c"}]})),
                full.clone(),
                reject(
                    "OutOfpods",
                    "Node didn't have enough resource: pods, requested: 1, used: 10, capacity: 10",
                ),
            ),
            (
                "cpu",
                requesting(json!({"cpu": "2"})),
                vec![&half_cpu],
                reject(
                    "OutOfcpu",
                    "Node didn't have enough resource: cpu, requested: 2000, used: 500, capacity: 1000",
                ),
            ),
            (
                "memory",
                requesting(json!({"memory": "512Mi"})),
                vec![&some_memory],
                reject(
                    "OutOfmemory",
                    "Node didn't have enough resource: memory, requested: 536870912, used: 805306368, capacity: 1073741824",
                ),
            ),
            (
                "ephemeral storage",
                requesting(json!({"ephemeral-storage": "4Gi"})),
                vec![&some_disk],
                reject(
                    "OutOfephemeral-storage",
                    "Node didn't have enough resource: ephemeral-storage, requested: 4294967296, used: 8589934592, capacity: 10737418240",
                ),
            ),
            (
                "huge pages the node does not have",
                requesting(json!({"hugepages-2Mi": "4Mi"})),
                vec![],
                reject(
                    "OutOfhugepages-2Mi",
                    "Node didn't have enough resource: hugepages-2Mi, requested: 4194304, used: 0, capacity: 0",
                ),
            ),
            (
                "prefixed native resource the node does not have",
                requesting(json!({"example.kubernetes.io/widget": "2"})),
                vec![],
                reject(
                    "OutOfexample.kubernetes.io/widget",
                    "Node didn't have enough resource: example.kubernetes.io/widget, requested: 2, used: 0, capacity: 0",
                ),
            ),
            (
                "node selector",
                pod(json!({"containers": [{"name": "c"}], "nodeSelector": {"zone": "b"}})),
                vec![],
                reject(
                    "NodeAffinity",
                    "Predicate NodeAffinity failed: node(s) didn't match Pod's node affinity/selector",
                ),
            ),
            (
                "node selector on the OS label",
                pod(json!({"containers": [{"name": "c"}], "nodeSelector": {"kubernetes.io/os": "windows"}})),
                vec![],
                reject(
                    "NodeAffinity",
                    "Predicate NodeAffinity failed: node(s) didn't match Pod's node affinity/selector",
                ),
            ),
            (
                "node name",
                pod(json!({"containers": [{"name": "c"}], "nodeName": "node-b"})),
                vec![],
                reject(
                    "NodeName",
                    "Predicate NodeName failed: node(s) didn't match the requested node name",
                ),
            ),
            (
                "host port",
                port(json!({"containerPort": 80, "hostPort": 8080})),
                vec![&web],
                reject(
                    "NodePorts",
                    "Predicate NodePorts failed: node(s) didn't have free ports for the requested pod ports",
                ),
            ),
            (
                "OS field",
                pod(json!({"containers": [{"name": "c"}], "os": {"name": "windows"}})),
                vec![],
                reject(
                    "PodOSNotSupported",
                    "Failed to admit pod as the OS field doesn't match node OS",
                ),
            ),
            (
                "OS label",
                pod_with(
                    json!({"labels": {"kubernetes.io/os": "windows"}}),
                    json!({"containers": [{"name": "c"}]}),
                ),
                vec![],
                reject(
                    "PodOSSelectorNodeLabelDoesNotMatch",
                    "Failed to admit pod as the `kubernetes.io/os` label doesn't match node label",
                ),
            ),
            (
                "unparseable quantity",
                requesting(json!({"cpu": "lots"})),
                vec![],
                reject(
                    "UnexpectedAdmissionError",
                    "spec.containers[0].resources.requests.cpu: invalid quantity \"lots\"",
                ),
            ),
            // The same pods, admitted.
            ("matching node name", pod(json!({"containers": [{"name": "c"}], "nodeName": "node-a"})), vec![], Ok(())),
            ("matching OS field", pod(json!({"containers": [{"name": "c"}], "os": {"name": "linux"}})), vec![], Ok(())),
            (
                "matching OS label",
                pod_with(json!({"labels": {"kubernetes.io/os": "linux"}}), json!({"containers": [{"name": "c"}]})),
                vec![],
                Ok(()),
            ),
            (
                "matching node selector",
                pod(json!({"containers": [{"name": "c"}], "nodeSelector": {"zone": "a", "kubernetes.io/os": "linux"}})),
                vec![],
                Ok(()),
            ),
            (
                "extended resource the node does not advertise is dropped",
                requesting(json!({"example.com/gpu": "1"})),
                vec![],
                Ok(()),
            ),
            ("one pod slot left", pod(json!({"containers": [{"name": "c"}]})), full[..9].to_vec(), Ok(())),
        ];
        for (name, p, active, want) in cases {
            assert_eq!(admit(&p, &active, &node()), want, "{name}");
        }
    }

    #[test]
    fn first_failure_wins_in_upstream_order() {
        let taken = port(json!({"containerPort": 80, "hostPort": 80}));
        let everything_wrong = |labels: Value, os: Value| {
            pod_with(
                json!({"labels": labels}),
                json!({
                    "os": os,
                    "nodeName": "node-b",
                    "nodeSelector": {"zone": "b"},
                    "containers": [{
                        "name": "c",
                        "resources": {"requests": {"cpu": "2", "memory": "2Gi"}},
                        "ports": [{"containerPort": 80, "hostPort": 80}]
                    }]
                }),
            )
        };
        let reason = |p: &Pod, n: &NodeInfo| admit(p, &[&taken], n).unwrap_err().reason;
        let n = node();
        let p = everything_wrong(
            json!({"kubernetes.io/os": "windows"}),
            json!({"name": "windows"}),
        );
        assert_eq!(reason(&p, &n), "PodOSSelectorNodeLabelDoesNotMatch");
        let p = everything_wrong(json!({}), json!({"name": "windows"}));
        assert_eq!(reason(&p, &n), "PodOSNotSupported");
        let p = everything_wrong(json!({}), json!({"name": "linux"}));
        let one_slot = NodeInfo {
            allowed_pod_number: 1,
            ..node()
        };
        assert_eq!(reason(&p, &one_slot), "OutOfpods");
        assert_eq!(reason(&p, &n), "OutOfcpu");
        let roomy = NodeInfo {
            allocatable_milli_cpu: 4000,
            ..node()
        };
        assert_eq!(reason(&p, &roomy), "OutOfmemory");
        let roomier = NodeInfo {
            allocatable_memory: 4 << 30,
            ..roomy
        };
        assert_eq!(reason(&p, &roomier), "NodeAffinity");
        let mut labelled = roomier.clone();
        labelled.labels.insert("zone".into(), "b".into());
        assert_eq!(reason(&p, &labelled), "NodeName");
        labelled.name = "node-b".into();
        assert_eq!(reason(&p, &labelled), "NodePorts");
        assert_eq!(admit(&p, &[], &labelled), Ok(()));
    }

    #[test]
    fn exact_fit_is_admitted_and_one_more_is_not() {
        let n = node();
        let used =
            requesting(json!({"cpu": "250m", "memory": "256Mi", "ephemeral-storage": "2Gi"}));
        let exact =
            requesting(json!({"cpu": "750m", "memory": "768Mi", "ephemeral-storage": "8Gi"}));
        assert_eq!(admit(&exact, &[&used], &n), Ok(()));
        let over = [
            ("cpu", json!({"cpu": "751m"})),
            ("memory", json!({"memory": "805306369"})),
            (
                "ephemeral-storage",
                json!({"ephemeral-storage": "8589934593"}),
            ),
        ];
        for (resource, req) in over {
            let r = admit(&requesting(req), &[&used], &n).unwrap_err();
            assert_eq!(r.reason, format!("OutOf{resource}"));
        }
    }

    #[test]
    fn zero_requests_fit_any_load_but_count_as_pods() {
        let hog = requesting(json!({"cpu": "4", "memory": "4Gi"}));
        let idle = pod(json!({"containers": [{"name": "c"}]}));
        assert_eq!(admit(&idle, &[&hog], &node()), Ok(()));
        let explicit_zero = requesting(json!({"cpu": "0", "memory": "0"}));
        assert_eq!(admit(&explicit_zero, &[&hog], &node()), Ok(()));
        let tiny = NodeInfo {
            allowed_pod_number: 1,
            ..node()
        };
        assert_eq!(
            admit(&idle, &[&hog], &tiny).unwrap_err().reason,
            "OutOfpods"
        );
    }

    #[test]
    fn requests_take_the_larger_of_containers_and_any_init_container() {
        let r = |cpu: i64, mem: i64| Requests {
            milli_cpu: cpu,
            memory: mem,
            ..Requests::default()
        };
        let container = |cpu: &str, mem: &str| json!({"name": "c", "resources": {"requests": {"cpu": cpu, "memory": mem}}});
        let cases = [
            (
                "containers are summed",
                json!({"containers": [container("1", "1G"), container("500m", "1G")]}),
                r(1500, 2_000_000_000),
            ),
            (
                // The upstream example: init 2/1G and 2/3G, containers 2/1G and 1/1G.
                "init containers are maxed per resource",
                json!({
                    "initContainers": [container("2", "1G"), container("2", "3G")],
                    "containers": [container("2", "1G"), container("1", "1G")]
                }),
                r(3000, 3_000_000_000),
            ),
            (
                "a big init container wins",
                json!({"initContainers": [container("4", "1k")], "containers": [container("1", "1G")]}),
                r(4000, 1_000_000_000),
            ),
            (
                "overhead is added after the max",
                json!({
                    "initContainers": [container("2", "1G")],
                    "containers": [container("1", "1G")],
                    "overhead": {"cpu": "250m", "memory": "120Mi"}
                }),
                r(2250, 1_000_000_000 + 120 * (1 << 20)),
            ),
            (
                "a sidecar runs with the containers and under later init containers",
                json!({
                    "initContainers": [
                        {"name": "s", "restartPolicy": "Always", "resources": {"requests": {"cpu": "1", "memory": "1k"}}},
                        container("3", "1k")
                    ],
                    "containers": [container("1", "1k")]
                }),
                // Running: 1 + 1 = 2 cores; the init container peaks at 3 + 1.
                r(4000, 2000),
            ),
            (
                "pod-level requests replace the containers' cpu and memory",
                json!({
                    "resources": {"requests": {"cpu": "3", "memory": "2G"}},
                    "containers": [container("1", "1G")],
                    "overhead": {"cpu": "100m"}
                }),
                r(3100, 2_000_000_000),
            ),
            (
                "no requests",
                json!({"containers": [{"name": "c"}]}),
                r(0, 0),
            ),
        ];
        for (name, spec, want) in cases {
            let p = pod(spec);
            assert_eq!(pod_requests(&p), want, "{name}");
            assert_eq!(try_pod_requests(&p), Ok(want), "{name}");
        }
    }

    #[test]
    fn init_container_peak_is_what_must_fit() {
        let p = pod(json!({
            "initContainers": [{"name": "i", "resources": {"requests": {"cpu": "1001m"}}}],
            "containers": [{"name": "c", "resources": {"requests": {"cpu": "100m"}}}]
        }));
        let r = admit(&p, &[], &node()).unwrap_err();
        assert_eq!(
            r.message,
            "Node didn't have enough resource: cpu, requested: 1001, used: 0, capacity: 1000"
        );
        let with_overhead = pod(json!({
            "containers": [{"name": "c", "resources": {"requests": {"cpu": "900m"}}}],
            "overhead": {"cpu": "101m"}
        }));
        assert_eq!(
            admit(&with_overhead, &[], &node()).unwrap_err().reason,
            "OutOfcpu"
        );
    }

    #[test]
    fn scalar_resources_and_bad_quantities() {
        let p = pod(json!({
            "containers": [{"name": "c", "resources": {"requests": {
                "hugepages-1Gi": "1Gi", "example.com/gpu": "2", "cpu": "1", "widgets": "3"
            }}}],
            "overhead": {"memory": "bogus"}
        }));
        let want = Requests {
            milli_cpu: 1000,
            scalar: [("hugepages-1Gi".to_string(), 1 << 30)]
                .into_iter()
                .collect(),
            ..Requests::default()
        };
        assert_eq!(pod_requests(&p), want);
        assert_eq!(
            try_pod_requests(&p),
            Err(QuantityError {
                field: "spec.overhead.memory".into(),
                value: "bogus".into()
            })
        );
    }

    #[test]
    fn host_port_conflicts() {
        let cases = [
            (
                "same port, TCP by default",
                json!({"hostPort": 80}),
                json!({"hostPort": 80, "protocol": "TCP"}),
                true,
            ),
            (
                "other port",
                json!({"hostPort": 80}),
                json!({"hostPort": 81}),
                false,
            ),
            (
                "protocol differs",
                json!({"hostPort": 53, "protocol": "UDP"}),
                json!({"hostPort": 53}),
                false,
            ),
            (
                "same UDP",
                json!({"hostPort": 53, "protocol": "UDP"}),
                json!({"hostPort": 53, "protocol": "UDP"}),
                true,
            ),
            (
                "host IP differs",
                json!({"hostPort": 80, "hostIP": "10.0.0.1"}),
                json!({"hostPort": 80, "hostIP": "10.0.0.2"}),
                false,
            ),
            (
                "same host IP",
                json!({"hostPort": 80, "hostIP": "10.0.0.1"}),
                json!({"hostPort": 80, "hostIP": "10.0.0.1"}),
                true,
            ),
            (
                "all addresses vs specific",
                json!({"hostPort": 80, "hostIP": "0.0.0.0"}),
                json!({"hostPort": 80, "hostIP": "10.0.0.1"}),
                true,
            ),
            (
                "specific vs all addresses",
                json!({"hostPort": 80, "hostIP": "10.0.0.1"}),
                json!({"hostPort": 80}),
                true,
            ),
            (
                "empty host IP is all addresses",
                json!({"hostPort": 80, "hostIP": ""}),
                json!({"hostPort": 80, "hostIP": "10.0.0.1"}),
                true,
            ),
            ("no host port", json!({}), json!({}), false),
            (
                "host port 0",
                json!({"hostPort": 0}),
                json!({"hostPort": 0}),
                false,
            ),
        ];
        for (name, existing, wanted, conflict) in cases {
            let with_container_port = |mut p: Value| {
                p["containerPort"] = json!(8000);
                p
            };
            let existing = port(with_container_port(existing));
            let wanted = port(with_container_port(wanted));
            let got = admit(&wanted, &[&existing], &node());
            let want = if conflict {
                reject(
                    "NodePorts",
                    "Predicate NodePorts failed: node(s) didn't have free ports for the requested pod ports",
                )
            } else {
                Ok(())
            };
            assert_eq!(got, want, "{name}");
        }
    }

    #[test]
    fn sidecar_host_ports_count_and_plain_init_container_ports_do_not() {
        let with_init = |restart: Value| {
            pod(json!({
                "initContainers": [{"name": "i", "restartPolicy": restart,
                    "ports": [{"containerPort": 80, "hostPort": 80}]}],
                "containers": [{"name": "c"}]
            }))
        };
        let sidecar = with_init(json!("Always"));
        let plain_init = with_init(Value::Null);
        let wanted = port(json!({"containerPort": 80, "hostPort": 80}));
        assert_eq!(
            admit(&wanted, &[&sidecar], &node()).unwrap_err().reason,
            "NodePorts"
        );
        assert_eq!(admit(&wanted, &[&plain_init], &node()), Ok(()));
        assert_eq!(
            admit(&sidecar, &[&wanted], &node()).unwrap_err().reason,
            "NodePorts"
        );
    }

    #[test]
    fn affinity_operators() {
        let cases = [
            ("In, value listed", expr("zone", "In", &["b", "a"]), true),
            ("In, value not listed", expr("zone", "In", &["b"]), false),
            ("In, label missing", expr("rack", "In", &["a"]), false),
            ("NotIn, value listed", expr("zone", "NotIn", &["a"]), false),
            (
                "NotIn, value not listed",
                expr("zone", "NotIn", &["b"]),
                true,
            ),
            ("NotIn, label missing", expr("rack", "NotIn", &["a"]), true),
            ("Exists", expr("zone", "Exists", &[]), true),
            ("Exists, label missing", expr("rack", "Exists", &[]), false),
            ("DoesNotExist", expr("rack", "DoesNotExist", &[]), true),
            (
                "DoesNotExist, label present",
                expr("zone", "DoesNotExist", &[]),
                false,
            ),
            ("Gt, greater", expr("cores", "Gt", &["4"]), true),
            ("Gt, equal", expr("cores", "Gt", &["8"]), false),
            ("Lt, less", expr("cores", "Lt", &["16"]), true),
            ("Lt, equal", expr("cores", "Lt", &["8"]), false),
            ("Gt, label not a number", expr("zone", "Gt", &["1"]), false),
            ("Gt, label missing", expr("rack", "Gt", &["1"]), false),
            // Invalid requirements match nothing.
            ("In without values", expr("zone", "In", &[]), false),
            ("NotIn without values", expr("rack", "NotIn", &[]), false),
            ("Exists with values", expr("zone", "Exists", &["a"]), false),
            (
                "DoesNotExist with values",
                expr("rack", "DoesNotExist", &["a"]),
                false,
            ),
            (
                "Gt with two values",
                expr("cores", "Gt", &["1", "2"]),
                false,
            ),
            (
                "Lt with a non-number",
                expr("cores", "Lt", &["many"]),
                false,
            ),
            ("unknown operator", expr("zone", "Equals", &["a"]), false),
        ];
        for (name, term, want) in cases {
            let p = affinity(json!([term]));
            assert_eq!(matches_node_affinity(&p, &node()), want, "{name}");
            let reason = admit(&p, &[], &node()).err().map(|r| r.reason);
            assert_eq!(reason.is_none(), want, "{name}");
        }
    }

    #[test]
    fn affinity_terms_and_fields() {
        let fields = |op: &str, values: &[&str]| json!({"matchFields": [{"key": "metadata.name", "operator": op, "values": values}]});
        let cases = [
            ("no terms", json!([]), false),
            ("only an empty term", json!([{}]), false),
            (
                "empty lists",
                json!([{"matchExpressions": [], "matchFields": []}]),
                false,
            ),
            (
                "empty term ORed with a match",
                json!([{}, expr("zone", "In", &["a"])]),
                true,
            ),
            (
                "terms are ORed",
                json!([expr("zone", "In", &["b"]), expr("cores", "Gt", &["2"])]),
                true,
            ),
            (
                "no term matches",
                json!([expr("zone", "In", &["b"]), expr("cores", "Gt", &["9"])]),
                false,
            ),
            (
                "invalid term ORed with a match",
                json!([expr("zone", "Bogus", &[]), expr("zone", "Exists", &[])]),
                true,
            ),
            (
                "expressions are ANDed",
                json!([{"matchExpressions": [
                    {"key": "zone", "operator": "In", "values": ["a"]},
                    {"key": "cores", "operator": "Lt", "values": ["4"]}
                ]}]),
                false,
            ),
            (
                "an invalid expression spoils a term",
                json!([{"matchExpressions": [
                    {"key": "zone", "operator": "In", "values": ["a"]},
                    {"key": "zone", "operator": "In"}
                ]}]),
                false,
            ),
            ("matchFields In", json!([fields("In", &["node-a"])]), true),
            (
                "matchFields In, other node",
                json!([fields("In", &["node-b"])]),
                false,
            ),
            (
                "matchFields NotIn",
                json!([fields("NotIn", &["node-b"])]),
                true,
            ),
            (
                "matchFields NotIn, this node",
                json!([fields("NotIn", &["node-a"])]),
                false,
            ),
            (
                "matchFields takes one value",
                json!([fields("In", &["node-a", "node-b"])]),
                false,
            ),
            (
                "matchFields only In and NotIn",
                json!([fields("Exists", &[])]),
                false,
            ),
            (
                "matchFields on an unknown key reads empty",
                json!([{"matchFields": [{"key": "spec.unschedulable", "operator": "NotIn", "values": ["x"]}]}]),
                true,
            ),
            (
                "fields and expressions ANDed",
                json!([{
                    "matchExpressions": [{"key": "zone", "operator": "In", "values": ["b"]}],
                    "matchFields": [{"key": "metadata.name", "operator": "In", "values": ["node-a"]}]
                }]),
                false,
            ),
        ];
        for (name, terms, want) in cases {
            let p = affinity(terms);
            assert_eq!(matches_node_affinity(&p, &node()), want, "{name}");
        }

        // The node selector and the affinity must both match.
        let p = pod(json!({
            "containers": [{"name": "c"}],
            "nodeSelector": {"zone": "a"},
            "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [expr("zone", "In", &["b"])]
            }}}
        }));
        assert!(!matches_node_affinity(&p, &node()));
        // Preferred terms and no required ones: anything matches.
        let p = pod(json!({
            "containers": [{"name": "c"}],
            "affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
                {"weight": 1, "preference": expr("zone", "In", &["b"])}
            ]}}
        }));
        assert!(matches_node_affinity(&p, &node()));
    }

    #[test]
    fn privileged_pods_are_refused_only_when_disallowed() {
        let strict = NodeInfo {
            allow_privileged: false,
            ..node()
        };
        let plain: Pod = serde_json::from_value(json!({
            "metadata": {"name": "p", "uid": "u"},
            "spec": {"containers": [{"name": "app"}]}
        }))
        .unwrap();
        assert_eq!(admit(&plain, &[], &strict), Ok(()));
        let cases = [
            (
                json!({"hostNetwork": true, "containers": [{"name": "app"}]}),
                "host networking",
            ),
            (
                json!({"hostPID": true, "containers": [{"name": "app"}]}),
                "host PID",
            ),
            (
                json!({"hostIPC": true, "containers": [{"name": "app"}]}),
                "host IPC",
            ),
            (
                json!({"containers": [{"name": "app", "securityContext": {"privileged": true}}]}),
                "privileged container \"app\"",
            ),
            (
                json!({"initContainers": [{"name": "init", "securityContext": {"privileged": true}}],
                       "containers": [{"name": "app"}]}),
                "privileged init container \"init\"",
            ),
            (
                json!({"containers": [{"name": "app", "securityContext":
                    {"capabilities": {"add": ["NET_BIND_SERVICE", "SYS_ADMIN"]}}}]}),
                "capability \"SYS_ADMIN\" added to container \"app\"",
            ),
            (
                json!({"containers": [{"name": "app", "securityContext":
                    {"capabilities": {"add": ["all"]}}}]}),
                "capability \"all\" added to container \"app\"",
            ),
            (
                json!({"containers": [{"name": "app", "securityContext":
                    {"capabilities": {"add": ["CAP_NET_ADMIN"]}}}]}),
                "capability \"CAP_NET_ADMIN\" added to container \"app\"",
            ),
            (
                json!({"containers": [{"name": "app", "securityContext": {"procMount": "Unmasked"}}]}),
                "procMount Unmasked in container \"app\"",
            ),
            (
                json!({"containers": [{"name": "app"}],
                       "ephemeralContainers": [{"name": "dbg", "securityContext":
                           {"capabilities": {"add": ["SYS_PTRACE"]}}}]}),
                "capability \"SYS_PTRACE\" added to ephemeral container \"dbg\"",
            ),
        ];
        for (spec, what) in cases {
            let pod: Pod = serde_json::from_value(
                json!({"metadata": {"name": "p", "uid": "u"}, "spec": spec}),
            )
            .unwrap();
            assert_eq!(admit(&pod, &[], &node()), Ok(()), "{what}");
            let r = admit(&pod, &[], &strict).unwrap_err();
            assert_eq!(r.reason, PRIVILEGED_FORBIDDEN);
            assert_eq!(
                r.message,
                format!("Pod specified {what}, but privileged pods are disallowed on this node (--allow-privileged=false)")
            );
        }
        // Explicitly unprivileged is fine, and so are the runtime's default
        // capabilities (in either spelling), drops and the default /proc.
        let pod: Pod = serde_json::from_value(json!({"metadata": {"name": "p"}, "spec": {
            "hostNetwork": false,
            "containers": [{"name": "app", "securityContext": {"privileged": false,
                "procMount": "Default",
                "capabilities": {"add": ["NET_BIND_SERVICE", "cap_chown", " KILL"],
                                 "drop": ["ALL"]}}}]}}))
        .unwrap();
        assert_eq!(admit(&pod, &[], &strict), Ok(()));
    }

    #[test]
    fn updates_are_checked_for_privileges_and_sysctls_only() {
        let strict = NodeInfo {
            allow_privileged: false,
            ..node()
        };
        let with = |spec: Value| -> Pod {
            serde_json::from_value(json!({"metadata": {"name": "p", "uid": "u"}, "spec": spec}))
                .unwrap()
        };
        // Too big for the node: settled at admission, not on an update.
        let big = with(json!({"containers": [{"name": "app",
            "resources": {"requests": {"cpu": "8"}}}]}));
        assert_eq!(admit_update(&big, &strict), Ok(()));
        let privileged = with(json!({"containers": [{"name": "app",
            "securityContext": {"privileged": true}}]}));
        assert_eq!(admit_update(&privileged, &node()), Ok(()));
        assert_eq!(
            admit_update(&privileged, &strict).unwrap_err().reason,
            PRIVILEGED_FORBIDDEN
        );
        let host_pid = with(json!({"hostPID": true, "containers": [{"name": "app"}]}));
        assert_eq!(
            admit_update(&host_pid, &strict).unwrap_err().reason,
            PRIVILEGED_FORBIDDEN
        );
        let sysctl = with(json!({"containers": [{"name": "app"}],
            "securityContext": {"sysctls": [{"name": "net.core.somaxconn", "value": "1"}]}}));
        let r = admit_update(&sysctl, &node()).unwrap_err();
        assert_eq!(r.reason, "SysctlForbidden");
        assert_eq!(admit(&sysctl, &[], &node()), Err(r));
        let allowing = NodeInfo {
            sysctls: Arc::new(Allowlist::new(&["net.core.*".to_string()]).unwrap()),
            ..node()
        };
        assert_eq!(admit_update(&sysctl, &allowing), Ok(()));
        assert_eq!(admit(&sysctl, &[], &allowing), Ok(()));
    }
}
