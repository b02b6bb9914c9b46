//! The runtime manager (upstream `kuberuntime`): SyncPod, killing pods, and
//! reading pods back from the CRI runtime.
//!
//! API boundary: this is the only module that issues CRI calls for pods, and
//! it is called only from pod worker threads (one pod at a time per pod) and
//! the PLEG relist thread (reads only).
//!
//! SyncPod follows the upstream six steps:
//! 1. compute sandbox and container changes (`actions::compute_pod_actions`);
//! 2. kill the pod's sandbox and containers if the sandbox must change;
//! 3. kill containers that should not run;
//! 4. create the sandbox if needed;
//! 5. start the init containers that should run (the next one, and
//!    sidecars that exited);
//! 6. start the regular containers that should run.
//!
//! A started container's postStart hook runs before SyncPod goes on; if it
//! fails, the container is killed (FailedPostStartHook). Stopping a
//! container runs its preStop hook first, within the grace period, and
//! gives StopContainer what is left of it (never less than 2 s). A pod's
//! containers stop in parallel, sidecars after the regular containers (the
//! later sidecar first), the sandbox last: the kill path is in `kill`,
//! starting one container in `start`.

pub(crate) mod actions;
pub(crate) mod backoff;
pub mod config;
pub(crate) mod dns;
pub(crate) mod expansion;
mod hooks;
pub(crate) use hooks::resolve_port;
mod inputs;
mod kill;
pub mod labels;
pub(crate) mod qos;
pub(crate) mod security;
pub(crate) mod services;
mod start;
mod status;
pub(crate) mod termination;

#[cfg(test)]
pub(crate) mod fake;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use k8s_openapi::api::core::v1::{Container, Pod};
use log::{debug, info, warn};

use crate::cri::{api, CriError, ImageService, RuntimeService};
use crate::events::{Clock, EventRecorder, EventType, ObjectRef, SystemClock};
use crate::images::{ImageManager, ImageOptions};
use crate::pod::{pod_full_name, pod_name, pod_namespace, pod_uid};
use actions::{compute_pod_actions, is_restartable_init, PodActions, StartupResults};
use backoff::Backoff;
use kill::Kill;
use qos::CgroupDriver;
#[cfg(test)]
pub(crate) use status::RuntimeContainer;
pub(crate) use status::{ContainerState, ContainerStatus, PodStatus, RuntimePod};

/// How long a postStart httpGet may take (upstream sets none; the worker
/// must not hang on a server that never answers).
const POST_START_HTTP_TIMEOUT: Duration = Duration::from_secs(120);

/// Node-wide settings that shape every pod's CRI configs (from flags).
#[derive(Debug, Clone, PartialEq)]
pub struct NodeSettings {
    /// `--cluster-dns`: the nameservers of dnsPolicy ClusterFirst.
    pub cluster_dns: Vec<String>,
    /// `--cluster-domain`: the cluster's DNS domain (search paths).
    pub cluster_domain: String,
    /// `--resolv-conf`: the resolver configuration of dnsPolicy Default;
    /// empty: none (pods then resolve nothing but through dnsConfig).
    pub resolv_conf: PathBuf,
    /// The node's IPs: `status.hostIP(s)`, and the pod IPs of hostNetwork pods.
    pub host_ips: Vec<String>,
    /// Where `Localhost` seccomp profiles are (`<root-dir>/seccomp`).
    pub seccomp_profile_root: PathBuf,
    /// `--seccomp-default`: containers without a seccomp profile get the
    /// runtime's default one instead of none.
    pub seccomp_default: bool,
    /// Pods get a cgroup parent by QoS class (`--cgroups-per-qos`).
    pub cgroups_per_qos: bool,
    /// How cgroups are named (`--cgroup-driver`).
    pub cgroup_driver: CgroupDriver,
    /// `--pod-max-pids`: `pids.max` of each pod's cgroup when above 0
    /// (with `cgroups_per_qos`).
    pub pod_pids_limit: i64,
    /// The node's memory in bytes, for Burstable OOM score adjustments.
    pub memory_capacity: i64,
}

impl Default for NodeSettings {
    fn default() -> Self {
        NodeSettings {
            cluster_dns: Vec::new(),
            cluster_domain: String::new(),
            resolv_conf: PathBuf::from("/etc/resolv.conf"),
            host_ips: Vec::new(),
            seccomp_profile_root: PathBuf::from("/var/lib/tinylet/seccomp"),
            seccomp_default: false,
            cgroups_per_qos: false,
            cgroup_driver: CgroupDriver::Cgroupfs,
            pod_pids_limit: -1,
            memory_capacity: 0,
        }
    }
}

/// Why a SyncPod did not fully succeed.
#[derive(Debug)]
pub(crate) enum SyncError {
    /// A container is in its restart back-off; try again after the duration.
    BackOff(String, Duration),
    /// A step failed; the message names the step, the container and the cause.
    Failed(String),
}

impl std::fmt::Display for SyncError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SyncError::BackOff(m, d) => write!(f, "{m} (back-off {}s)", d.as_secs()),
            SyncError::Failed(m) => f.write_str(m),
        }
    }
}

/// Why containers are waiting, by container name: `(reason, message)`.
pub(crate) type WaitingReasons = BTreeMap<String, (String, String)>;

/// What one SyncPod found (upstream's `PodSyncResult`, with the status its
/// pod worker reads next): how it ended, why the containers it tried are
/// waiting, and the pod's runtime status after its actions.
#[derive(Debug)]
pub(crate) struct SyncResult {
    pub(crate) result: Result<(), SyncError>,
    /// The containers this sync tried to start, by name: why each waits
    /// (`Some((reason, message))`), or `None` for one that started. A
    /// container not tried keeps the reason it had.
    pub(crate) reasons: BTreeMap<String, Option<(String, String)>>,
    /// The runtime status read after the sync's actions; `None` when the
    /// sync changed nothing in the runtime (the status it was given still
    /// stands) or when that read failed.
    pub(crate) status: Option<PodStatus>,
    /// When that read began: the status is current as of then.
    pub(crate) status_read_at: Option<Instant>,
    /// Whether the sync changed anything in the runtime.
    pub(crate) changed: bool,
}

impl SyncResult {
    /// Brings `reasons` (kept by the caller between syncs, as upstream's
    /// `ReasonCache`) up to this sync.
    pub(crate) fn update_reasons(&self, reasons: &mut WaitingReasons) {
        for (name, r) in &self.reasons {
            match r {
                Some(r) => {
                    reasons.insert(name.clone(), r.clone());
                }
                None => {
                    reasons.remove(name);
                }
            }
        }
    }
}

/// What a SyncPod gathers on its way (reasons, and whether it changed
/// anything in the runtime), with the pod's restart back-off it consults
/// and grows.
struct Found<'a> {
    reasons: BTreeMap<String, Option<(String, String)>>,
    changed: bool,
    backoff: &'a mut Backoff,
}

impl Found<'_> {
    fn set_reason(&mut self, container: &str, reason: Option<(&str, String)>) {
        self.reasons.insert(
            container.to_string(),
            reason.map(|(r, m)| (r.to_string(), m)),
        );
    }
}

pub struct RuntimeManager {
    runtime: Arc<dyn RuntimeService>,
    images: Arc<dyn ImageService>,
    root_dir: PathBuf,
    logs_root: PathBuf,
    recorder: EventRecorder,
    /// Exited instances kept per container (`--maximum-dead-containers-per-container`).
    max_dead_per_container: u32,
    clock: Arc<dyn Clock>,
    startup: Arc<dyn StartupResults>,
    /// Node-wide settings of the CRI configs (DNS, node IPs).
    node: NodeSettings,
    /// The node's allocatable resources, read at each container creation.
    allocatable: Box<dyn Fn() -> crate::fieldpath::NodeAllocatable + Send + Sync>,
    /// Pull policy, pull back-off, registry rate limit, pull secrets.
    image_manager: ImageManager,
    /// Standing probe results: a failed liveness or startup probe kills
    /// and restarts its container.
    probe_results: Option<Arc<dyn actions::ProbeKills>>,
    /// Where env's ConfigMaps and Secrets are read (the apiserver).
    objects: Option<Arc<dyn crate::volume::ObjectSource>>,
    /// The Services known to the node, for service variables.
    services: Option<Arc<services::Services>>,
}

/// Makes a log directory (and its missing parents) 0755 whatever the
/// umask, as upstream's `MkdirAll(dir, 0755)` under the usual 022.
fn create_log_dir(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o755)
        .create(dir)?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755))
}

/// Deletes a pod's directory tree (one that is gone already is fine).
/// What is mounted below it (a subPath's bind mount shows a volume's or a
/// host path's files) is unmounted first; the removal then follows no
/// symlink and crosses no mount point (`paths::remove_tree`).
fn remove_dir(dir: &Path) -> std::io::Result<()> {
    if dir.exists() {
        crate::mount::unmount_below(dir)?;
    }
    crate::paths::remove_tree(dir)
}

fn ns_to_time(ns: i64) -> SystemTime {
    UNIX_EPOCH + Duration::from_nanos(ns.max(0) as u64)
}

impl RuntimeManager {
    pub(crate) fn new(
        runtime: Arc<dyn RuntimeService>,
        images: Arc<dyn ImageService>,
        root_dir: PathBuf,
        logs_root: PathBuf,
    ) -> Self {
        RuntimeManager {
            runtime,
            image_manager: ImageManager::new(images.clone(), ImageOptions::default()),
            images,
            root_dir,
            logs_root,
            recorder: EventRecorder::disabled(),
            max_dead_per_container: 1,
            clock: Arc::new(SystemClock),
            startup: Arc::new(actions::NoProber),
            node: NodeSettings::default(),
            allocatable: Box::new(Default::default),
            probe_results: None,
            objects: None,
            services: None,
        }
    }

    /// Keeps `n` exited instances of each container (at least the newest).
    pub(crate) fn with_max_dead_per_container(mut self, n: u32) -> Self {
        self.max_dead_per_container = n;
        self
    }

    /// Reads the time from `clock` (restart back-off, hook durations).
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// Reads startup probe results from `startup` (the prober): a sidecar
    /// with a startup probe holds the next init container back until it
    /// succeeded. Without it, startup probes count as passed.
    pub(crate) fn with_startup_results(mut self, startup: Arc<dyn StartupResults>) -> Self {
        self.startup = startup;
        self
    }

    /// Uses the node's settings and allocatable resources in CRI configs.
    pub(crate) fn with_node(
        mut self,
        node: NodeSettings,
        allocatable: Box<dyn Fn() -> crate::fieldpath::NodeAllocatable + Send + Sync>,
    ) -> Self {
        self.node = node;
        self.allocatable = allocatable;
        self
    }

    /// Kills and restarts containers whose liveness or startup probe
    /// failed, as `results` says.
    pub(crate) fn with_probe_results(mut self, results: Arc<dyn actions::ProbeKills>) -> Self {
        self.probe_results = Some(results);
        self
    }

    /// Runs `cmd` in a running container (exec probes), within `timeout`.
    pub(crate) fn exec_sync(
        &self,
        container_id: &str,
        cmd: &[String],
        timeout: Duration,
    ) -> Result<api::ExecSyncResponse, CriError> {
        self.runtime.exec_sync(container_id, cmd, timeout)
    }

    /// Reports the pod lifecycle events (Pulling, Created, Killing, ...) to
    /// `recorder`.
    pub(crate) fn with_recorder(mut self, recorder: EventRecorder) -> Self {
        self.recorder = recorder;
        self
    }

    /// Pulls images with `opts` (serialized or not, the registry rate limit).
    pub(crate) fn with_image_options(mut self, opts: ImageOptions) -> Self {
        self.image_manager = ImageManager::new(self.images.clone(), opts);
        self
    }

    /// Reads pods' imagePullSecrets, and the ConfigMaps and Secrets their
    /// env names, from `source` (the apiserver); without one (a standalone
    /// node) they cannot be used.
    pub(crate) fn with_pull_secrets(
        mut self,
        source: Arc<dyn crate::volume::ObjectSource>,
    ) -> Self {
        self.image_manager.set_secrets(source.clone());
        self.objects = Some(source);
        self
    }

    /// Gives containers the service variables of `services`; API pods
    /// wait for its first list.
    pub(crate) fn with_services(mut self, services: Arc<services::Services>) -> Self {
        self.services = Some(services);
        self
    }

    /// Records an event about the pod itself (a `DeadlineExceeded`, ...).
    pub(crate) fn pod_event(&self, pod: &Pod, kind: EventType, reason: &str, message: &str) {
        self.recorder
            .event(&ObjectRef::pod(pod), kind, reason, message.to_string());
    }

    fn container_event(
        &self,
        pod: &Pod,
        c: &Container,
        kind: EventType,
        reason: &str,
        message: String,
    ) {
        self.recorder.event(
            &ObjectRef::container(pod, &c.name, is_init_container(pod, &c.name)),
            kind,
            reason,
            message,
        );
    }

    /// Brings the pod's runtime state to its spec (the six steps), and
    /// reads its status again when that changed anything. `backoff` is the
    /// pod's restart back-off, kept by its worker between syncs (upstream
    /// passes SyncPod its back-off too).
    pub(crate) fn sync_pod(
        &self,
        pod: &Pod,
        status: &PodStatus,
        backoff: &mut Backoff,
    ) -> SyncResult {
        let mut found = Found {
            reasons: BTreeMap::new(),
            changed: false,
            backoff,
        };
        let result = self.sync_steps(pod, status, &mut found);
        let read_at = Instant::now();
        let status = if found.changed {
            self.get_pod_status(pod_uid(pod), pod_name(pod), pod_namespace(pod))
                .map_err(|e| {
                    debug!(
                        "pod {}: status after sync: {e}; reported at the next relist",
                        pod_full_name(pod)
                    )
                })
                .ok()
        } else {
            None
        };
        SyncResult {
            result,
            reasons: found.reasons,
            status_read_at: status.as_ref().map(|_| read_at),
            status,
            changed: found.changed,
        }
    }

    /// The six steps of SyncPod.
    fn sync_steps(
        &self,
        pod: &Pod,
        status: &PodStatus,
        found: &mut Found,
    ) -> Result<(), SyncError> {
        let who = pod_full_name(pod);
        let mut actions = compute_pod_actions(pod, status, self.startup.as_ref());
        let probe_kills = self.probe_kills(pod, status, &mut actions);
        debug!("pod {who}: actions {actions:?}");
        let fail = |step: &str, e: &dyn std::fmt::Display| {
            SyncError::Failed(format!("pod {who}: {step}: {e}"))
        };

        // Steps 2 and 3.
        if actions.kill_pod {
            if !status.sandbox_statuses.is_empty() || !status.container_statuses.is_empty() {
                info!("pod {who}: stopping its containers and sandbox (sandbox changed or pod finished)");
                found.changed = true;
                self.kill_pod(pod, status, None)
                    .map_err(|e| fail("kill pod", &e))?;
            }
        } else {
            let pod_ip = status.ips.first().map(String::as_str);
            for (id, name, message) in &actions.containers_to_kill {
                info!("pod {who}: stopping container {name:?} ({id:.12}): {message}");
                found.changed = true;
                let kill = Kill {
                    id,
                    name,
                    message: Some(message.clone()),
                    restored: None,
                };
                self.kill_container(pod, &kill, None, pod_ip, None)
                    .map_err(|e| fail(&format!("stop container {name:?}"), &e))?;
            }
            for k in &probe_kills {
                info!(
                    "pod {who}: stopping container {:?} ({:.12}): {}",
                    k.name, k.id, k.message
                );
                let kill = Kill {
                    id: &k.id,
                    name: &k.name,
                    message: Some(k.message.clone()),
                    restored: None,
                };
                // The probe's own grace period, when it has one.
                found.changed = true;
                self.kill_container(pod, &kill, k.grace, pod_ip, None)
                    .map_err(|e| fail(&format!("stop container {:?}", k.name), &e))?;
            }
        }

        let PodActions {
            create_sandbox,
            mut sandbox_id,
            attempt,
            init_containers_to_start,
            containers_to_start,
            ephemeral_containers_to_start,
            ..
        } = actions;
        let mut sandbox_config = config::sandbox_config(pod, attempt, &self.logs_root, &self.node);
        sandbox_config
            .annotations
            .insert(labels::SANDBOX_HASH.into(), actions::sandbox_hash(pod));

        // Step 4.
        if create_sandbox {
            self.report_dns_warnings(pod);
            let log_dir = config::pod_log_dir(&self.logs_root, pod)
                .map_err(|e| fail("create log directory", &e))?;
            create_log_dir(&log_dir)
                .map_err(|e| fail(&format!("create log directory {}", log_dir.display()), &e))?;
            let start = std::time::Instant::now();
            crate::fault::point("sandbox-create", &who);
            found.changed = true;
            sandbox_id = self
                .runtime
                .run_pod_sandbox(&sandbox_config, "")
                .map_err(|e| fail("create sandbox", &e))?;
            info!(
                "pod {who}: sandbox {sandbox_id:.12} running (attempt {attempt}, {} ms)",
                start.elapsed().as_millis()
            );
            crate::fault::point("sandbox-created", &who);
        }
        if sandbox_id.is_empty() {
            return Ok(());
        }
        // The pod's process limit holds before any of its containers runs
        // (again at every start: a restarted tinylet or a changed flag).
        let starts = !(init_containers_to_start.is_empty()
            && containers_to_start.is_empty()
            && ephemeral_containers_to_start.is_empty());
        if starts && self.node.cgroups_per_qos && self.node.pod_pids_limit > 0 {
            qos::set_pod_pids_limit(
                Path::new("/sys/fs/cgroup"),
                self.node.cgroup_driver,
                pod,
                self.node.pod_pids_limit,
            )
            .map_err(|e| fail("set the pod's process limit", &e))?;
        }
        let sandbox = SandboxRef {
            id: &sandbox_id,
            config: &sandbox_config,
            created: create_sandbox,
            ips: &status.ips,
        };

        let spec = pod.spec.as_ref();
        let mut first_err = None;
        // Ephemeral containers first, so a pod whose init containers fail
        // can still be debugged (upstream's order); one that fails to start
        // holds nothing back.
        for i in ephemeral_containers_to_start {
            let Some(e) = spec
                .and_then(|s| s.ephemeral_containers.as_ref())
                .and_then(|v| v.get(i))
            else {
                continue;
            };
            let c = actions::ephemeral_container(e);
            if let Err(e) = self.start_container(pod, &c, status, &sandbox, found) {
                if let Some(prev) = first_err.replace(e) {
                    warn!("{prev}");
                }
            }
        }
        // Step 5: a regular init container that fails to start ends this
        // sync; a sidecar that fails does not hold the others back.
        for i in init_containers_to_start {
            let Some(c) = spec
                .and_then(|s| s.init_containers.as_ref())
                .and_then(|v| v.get(i))
            else {
                continue;
            };
            if let Err(e) = self.start_container(pod, c, status, &sandbox, found) {
                if !is_restartable_init(c) {
                    return Err(e);
                }
                if let Some(prev) = first_err.replace(e) {
                    warn!("{prev}");
                }
            }
        }
        // Step 6.
        for i in containers_to_start {
            let Some(c) = spec.and_then(|s| s.containers.get(i)) else {
                continue;
            };
            if let Err(e) = self.start_container(pod, c, status, &sandbox, found) {
                if let Some(prev) = first_err.replace(e) {
                    // Several containers failed: log all but the one returned.
                    warn!("{prev}");
                }
            }
        }
        match first_err {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Containers to kill because a liveness or startup probe failed, added
    /// to `actions` as upstream's `computePodActions` does: restarted unless
    /// restartPolicy is Never, and the whole pod stopped when nothing would
    /// be left running.
    fn probe_kills(
        &self,
        pod: &Pod,
        status: &PodStatus,
        actions: &mut PodActions,
    ) -> Vec<actions::ProbeKill> {
        let Some(results) = &self.probe_results else {
            return Vec::new();
        };
        if actions.kill_pod {
            return Vec::new();
        }
        let kills: Vec<_> = results
            .probe_kills(pod, status)
            .into_iter()
            .filter(|k| {
                !actions
                    .containers_to_kill
                    .iter()
                    .any(|(id, _, _)| *id == k.id)
            })
            .collect();
        for k in &kills {
            if let Some(i) = k.index.filter(|_| k.restart) {
                if !actions.containers_to_start.contains(&i) {
                    actions.containers_to_start.push(i);
                }
            }
        }
        let kept = status
            .container_statuses
            .iter()
            .filter(|c| c.state == ContainerState::Running)
            .filter(|c| {
                !actions
                    .containers_to_kill
                    .iter()
                    .any(|(id, _, _)| *id == c.id)
            })
            .filter(|c| !kills.iter().any(|k| k.id == c.id))
            .count();
        if !kills.is_empty() && kept == 0 && actions.containers_to_start.is_empty() {
            actions.kill_pod = true;
        }
        kills
    }

    /// Removes every container and sandbox of a pod that has been killed, and
    /// its directories. Called when the pod is gone for good.
    pub(crate) fn remove_pod(&self, uid: &str, status: &PodStatus) -> Result<(), CriError> {
        for c in &status.container_statuses {
            match self.runtime.remove_container(&c.id) {
                Err(e) if !e.is_not_found() => return Err(e),
                _ => {}
            }
        }
        crate::fault::point("containers-removed", uid);
        for s in &status.sandbox_statuses {
            match self.runtime.remove_pod_sandbox(&s.id) {
                Err(e) if !e.is_not_found() => return Err(e),
                _ => {}
            }
        }
        crate::fault::point("sandboxes-removed", uid);
        // A UID that cannot name a directory (a runtime label nobody
        // validated) has none: nothing outside the pods directory is touched.
        match config::pod_dir(&self.root_dir, uid) {
            Ok(dir) => {
                if let Err(e) = remove_dir(&dir) {
                    // Housekeeping's sweep of orphaned pod directories
                    // tries again (`volume::sweeper`).
                    warn!(
                        "pod {uid}: cannot remove {}: {e}; left to the sweep of orphaned pod directories",
                        dir.display()
                    );
                }
            }
            Err(e) => warn!("pod {uid:?}: not removing its directory: {e}"),
        }
        if self.node.cgroups_per_qos {
            qos::remove_pod_cgroups(Path::new("/sys/fs/cgroup"), self.node.cgroup_driver, uid);
        }
        self.image_manager.forget_pod(uid);
        Ok(())
    }

    /// Removes exited containers of a live pod beyond
    /// `--maximum-dead-containers-per-container` per name (upstream's
    /// container GC; the one kept gives `lastState` and the previous log),
    /// and sandboxes that are not ready beyond the newest.
    pub(crate) fn prune_dead(&self, status: &PodStatus) {
        for id in dead_to_remove(status, self.max_dead_per_container) {
            crate::fault::point(
                "prune-dead",
                format_args!("{}/{}", status.namespace, status.name),
            );
            if let Err(e) = self.runtime.remove_container(id) {
                debug!("remove dead container {id:.12}: {e}");
            }
        }
        // A sandbox that is not ready has had its containers stopped with it.
        for s in status.sandbox_statuses.iter().skip(1) {
            if s.state.enum_value() != Ok(api::PodSandboxState::SANDBOX_READY) {
                if let Err(e) = self.runtime.remove_pod_sandbox(&s.id) {
                    debug!("remove dead sandbox {:.12}: {e}", s.id);
                }
            }
        }
    }

    /// tinylet's `--root-dir`.
    pub(crate) fn root_dir(&self) -> &std::path::Path {
        &self.root_dir
    }

    pub(crate) fn runtime(&self) -> &Arc<dyn RuntimeService> {
        &self.runtime
    }
}

/// Exited containers beyond the `keep` newest exited instances of each
/// container name (statuses are newest first). The newest instance of a
/// name is never chosen: its restart count and back-off live on it.
fn dead_to_remove(status: &PodStatus, keep: u32) -> Vec<&str> {
    let mut newest_seen = HashSet::new();
    let mut dead_kept: HashMap<&str, u32> = HashMap::new();
    let mut out = Vec::new();
    for c in &status.container_statuses {
        let newest = newest_seen.insert(c.name.as_str());
        if c.state != ContainerState::Exited {
            continue;
        }
        let kept = dead_kept.entry(c.name.as_str()).or_default();
        if newest || *kept < keep {
            *kept += 1;
        } else {
            out.push(c.id.as_str());
        }
    }
    out
}

/// The sandbox SyncPod starts containers in.
struct SandboxRef<'a> {
    id: &'a str,
    config: &'a api::PodSandboxConfig,
    /// Made by this sync: the status's IPs are not its own.
    created: bool,
    ips: &'a [String],
}

fn is_init_container(pod: &Pod, name: &str) -> bool {
    pod.spec
        .as_ref()
        .and_then(|s| s.init_containers.as_ref())
        .is_some_and(|v| v.iter().any(|i| i.name == name))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::{EventBroadcaster, EventSink};
    use crate::kube::ApiError;
    use fake::{test_pod, wait_for, ExecBehaviour, FakeRuntime, TEST_IMAGE};
    use k8s_openapi::api::core::v1::{ExecAction, Lifecycle, LifecycleHandler};
    use parking_lot::Mutex;
    use serde_json::Value;

    /// Events as written: (fieldPath, reason, message).
    type Seen = Arc<Mutex<Vec<(String, String, String)>>>;

    struct Sink(Seen);

    impl EventSink for Sink {
        fn create(&mut self, _ns: &str, event: &Value) -> Result<Value, ApiError> {
            let s = |p: &str| {
                event
                    .pointer(p)
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_string()
            };
            self.0
                .lock()
                .push((s("/involvedObject/fieldPath"), s("/reason"), s("/message")));
            Ok(event.clone())
        }
        fn patch(&mut self, _ns: &str, _name: &str, patch: &Value) -> Result<Value, ApiError> {
            Ok(patch.clone())
        }
    }

    pub(super) struct Rig {
        pub(super) fake: Arc<FakeRuntime>,
        pub(super) rm: RuntimeManager,
        events: Seen,
        /// The waiting reasons found so far, as a pod worker keeps them.
        reasons: std::cell::RefCell<WaitingReasons>,
        /// Each pod's restart back-off, as its worker keeps it.
        backoffs: std::cell::RefCell<HashMap<String, Backoff>>,
        _broadcaster: EventBroadcaster,
        _dir: tempfile::TempDir,
    }

    pub(super) fn rig() -> Rig {
        let fake = Arc::new(FakeRuntime::with_images(&[TEST_IMAGE]));
        let dir = tempfile::tempdir().unwrap();
        let events = Seen::default();
        let (broadcaster, recorder) =
            EventBroadcaster::start(Box::new(Sink(events.clone())), "kubelet", "edge-1").unwrap();
        let rm = RuntimeManager::new(
            fake.clone(),
            fake.clone(),
            dir.path().into(),
            dir.path().join("logs"),
        )
        .with_clock(fake.clone())
        .with_recorder(recorder);
        Rig {
            fake,
            rm,
            events,
            reasons: Default::default(),
            backoffs: Default::default(),
            _broadcaster: broadcaster,
            _dir: dir,
        }
    }

    impl Rig {
        pub(super) fn status(&self, pod: &Pod) -> PodStatus {
            self.rm
                .get_pod_status(
                    pod_uid(pod),
                    crate::pod::pod_name(pod),
                    crate::pod::pod_namespace(pod),
                )
                .unwrap()
        }

        /// Syncs `pod` from its current status, keeping the waiting
        /// reasons the sync found as a pod worker does.
        pub(super) fn sync(&self, pod: &Pod) -> Result<(), SyncError> {
            let found = self.sync_from(pod, &self.status(pod));
            found.update_reasons(&mut self.reasons.borrow_mut());
            found.result
        }

        /// Syncs `pod` from `status` with the pod's own back-off.
        pub(super) fn sync_from(&self, pod: &Pod, status: &PodStatus) -> SyncResult {
            let mut backoffs = self.backoffs.borrow_mut();
            let backoff = backoffs.entry(pod_uid(pod).to_string()).or_default();
            self.rm.sync_pod(pod, status, backoff)
        }

        /// Why containers wait, after the syncs so far.
        pub(super) fn waiting_reasons(&self) -> WaitingReasons {
            self.reasons.borrow().clone()
        }

        fn exit(&self, name: &str, code: i32) {
            self.fake
                .exit_container(&self.fake.container_id(name).unwrap(), code);
        }

        pub(super) fn running(&self, name: &str) -> bool {
            self.fake.containers().iter().any(|c| {
                c.metadata.as_ref().is_some_and(|m| m.name == name)
                    && c.state.enum_value() == Ok(api::ContainerState::CONTAINER_RUNNING)
            })
        }

        /// Waits for an event with `reason` on `field_path`; returns its message.
        pub(super) fn event(&self, field_path: &str, reason: &str) -> String {
            let find = || {
                self.events
                    .lock()
                    .iter()
                    .find(|(f, r, _)| f == field_path && r == reason)
                    .map(|e| e.2.clone())
            };
            wait_for(&format!("event {reason} on {field_path}"), || {
                find().is_some()
            });
            find().unwrap_or_default()
        }
    }

    pub(super) fn exec_hook(cmd: &str) -> LifecycleHandler {
        LifecycleHandler {
            exec: Some(ExecAction {
                command: Some(vec!["sh".into(), "-c".into(), cmd.into()]),
            }),
            ..Default::default()
        }
    }

    pub(super) fn container(name: &str) -> Container {
        Container {
            name: name.into(),
            image: Some(TEST_IMAGE.into()),
            ..Default::default()
        }
    }

    #[test]
    fn a_sync_returns_the_status_after_its_actions_and_reads_none_when_idle() {
        let r = rig();
        let pod = test_pod("u1", "web");
        let found = r.sync_from(&pod, &r.status(&pod));
        found.result.unwrap();
        assert_eq!(found.reasons.get("app"), Some(&None));
        let after = found
            .status
            .expect("the status after a sync that started a container");
        let app = after.latest("app").unwrap();
        assert_eq!(app.state, ContainerState::Running);
        assert_eq!(after.sandbox_statuses.len(), 1);
        // Nothing left to do: no action, and no status read either.
        let before = r.status(&pod);
        let lists = r.fake.count("ListPodSandbox");
        let found = r.sync_from(&pod, &before);
        found.result.unwrap();
        assert!(found.status.is_none());
        assert!(found.reasons.is_empty());
        assert_eq!(r.fake.count("ListPodSandbox"), lists);
    }

    #[test]
    fn a_container_in_back_off_changes_nothing_and_keeps_its_reason() {
        let r = rig();
        let pod = test_pod("u1", "web");
        r.sync(&pod).unwrap();
        r.exit("app", 1);
        r.sync(&pod).unwrap();
        r.exit("app", 1);
        let found = r.sync_from(&pod, &r.status(&pod));
        assert!(matches!(found.result, Err(SyncError::BackOff(..))));
        assert!(found.status.is_none(), "a back-off starts nothing");
        let mut reasons = WaitingReasons::new();
        reasons.insert("other".into(), ("Old".into(), "kept".into()));
        found.update_reasons(&mut reasons);
        assert_eq!(reasons["app"].0, "CrashLoopBackOff");
        assert_eq!(
            reasons["other"].0, "Old",
            "a container not tried keeps its reason"
        );
    }

    #[test]
    fn a_sub_path_through_a_planted_symlink_fails_its_container_alone() {
        let r = rig();
        // What a planted link would expose: a directory outside the volume
        // (not `/`, so that nothing of the host is at stake if this fails).
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("secret"), "s").unwrap();
        let root = r.rm.root_dir().to_path_buf();
        let data = config::pod_dir(&root, "u1")
            .unwrap()
            .join("volumes/kubernetes.io~empty-dir/data");
        std::fs::create_dir_all(&data).unwrap();
        std::os::unix::fs::symlink(outside.path(), data.join("x")).unwrap();
        let mut pod = test_pod("u1", "web");
        let mounted = |name: &str, sub: Option<&str>| Container {
            volume_mounts: Some(vec![k8s_openapi::api::core::v1::VolumeMount {
                name: "data".into(),
                mount_path: "/data".into(),
                sub_path: sub.map(Into::into),
                ..Default::default()
            }]),
            ..container(name)
        };
        if let Some(spec) = pod.spec.as_mut() {
            spec.volumes = Some(vec![k8s_openapi::api::core::v1::Volume {
                name: "data".into(),
                empty_dir: Some(Default::default()),
                ..Default::default()
            }]);
            spec.containers = vec![
                mounted("app", Some("x")),
                mounted("ok", Some("sub/dir")),
                mounted("plain", None),
            ];
        }
        let e = r.sync(&pod).unwrap_err();
        assert!(e.to_string().contains("subPath \"x\""), "{e}");
        let reasons = r.waiting_reasons();
        let (reason, message) = reasons.get("app").cloned().unwrap_or_default();
        assert_eq!(reason, "CreateContainerConfigError");
        assert!(
            message.starts_with(
                "container \"app\": volumeMounts \"data\": subPath \"x\": x is a symlink"
            ),
            "{message}"
        );
        assert!(!r.running("app"));
        assert!(r.running("ok") && r.running("plain"));
        let host_path = |name: &str| {
            r.fake
                .containers()
                .iter()
                .find(|c| c.metadata.as_ref().is_some_and(|m| m.name == name))
                .map(|c| c.mounts[0].host_path.clone())
                .unwrap_or_default()
        };
        let target = config::pod_dir(&root, "u1")
            .unwrap()
            .join("volume-subpaths/data/ok/0");
        assert_eq!(host_path("ok"), target.to_string_lossy());
        assert_eq!(host_path("plain"), data.to_string_lossy());
        assert!(data.join("sub/dir").is_dir(), "made inside the volume");
        std::fs::write(data.join("sub/dir/f"), "in").unwrap();
        assert_eq!(std::fs::read_to_string(target.join("f")).unwrap(), "in");

        // Removing the pod unmounts before deleting: only the pod's own
        // files go, never what a mount shows.
        r.fake
            .exit_container(&r.fake.container_id("ok").unwrap(), 0);
        r.fake
            .exit_container(&r.fake.container_id("plain").unwrap(), 0);
        r.rm.remove_pod("u1", &r.status(&pod)).unwrap();
        assert!(!config::pod_dir(&root, "u1").unwrap().exists());
        assert!(crate::mount::mounts_below(&root).unwrap().is_empty());
        assert!(outside.path().join("secret").exists());
    }

    #[test]
    fn a_removed_pod_dir_is_unmounted_before_it_is_deleted() {
        let r = rig();
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("keep"), "k").unwrap();
        let pod_dir = config::pod_dir(r.rm.root_dir(), "u2").unwrap();
        let target = pod_dir.join("volume-subpaths/v/app/0");
        std::fs::create_dir_all(&target).unwrap();
        let sp = crate::volume::subpath::SubPath {
            volume_root: outside.path().to_path_buf(),
            path: "d".into(),
            volume: "v".into(),
            index: 0,
            writer_links: false,
        };
        std::fs::create_dir(outside.path().join("d")).unwrap();
        std::fs::write(outside.path().join("d/keep"), "k").unwrap();
        crate::volume::subpath::prepare(&sp, &target).unwrap();
        assert!(target.join("keep").exists());
        // A pod whose volumes were not torn down (the unmount failed).
        r.rm.remove_pod("u2", &PodStatus::default()).unwrap();
        assert!(!pod_dir.exists());
        assert!(
            outside.path().join("d/keep").exists(),
            "deleted through the mount"
        );
        assert!(crate::mount::mounts_below(r.rm.root_dir())
            .unwrap()
            .is_empty());
    }

    #[test]
    fn crash_back_off_doubles_to_five_minutes_and_resets_after_ten_minutes_of_running() {
        let r = rig();
        let pod = test_pod("u1", "web");
        r.sync(&pod).unwrap();
        // The first restart is immediate.
        r.exit("app", 1);
        r.sync(&pod).unwrap();
        assert_eq!(r.fake.count("StartContainer"), 2);
        for (want, text) in [
            (10, "10s"),
            (20, "20s"),
            (40, "40s"),
            (80, "1m20s"),
            (160, "2m40s"),
            (300, "5m0s"),
            (300, "5m0s"),
        ] {
            let starts = r.fake.count("StartContainer");
            r.exit("app", 1);
            let want = Duration::from_secs(want);
            match r.sync(&pod) {
                Err(SyncError::BackOff(_, left)) => {
                    assert!(
                        left <= want && left > want - Duration::from_secs(1),
                        "{left:?}"
                    )
                }
                other => panic!("want back-off {want:?}, got {other:?}"),
            }
            assert_eq!(
                r.waiting_reasons().get("app"),
                Some(&(
                    "CrashLoopBackOff".to_string(),
                    format!("back-off {text} restarting failed container=app pod=web_default(u1)")
                ))
            );
            // Still backing off just before the end.
            r.fake.advance(want - Duration::from_secs(1));
            assert!(matches!(r.sync(&pod), Err(SyncError::BackOff(..))));
            r.fake.advance(Duration::from_secs(1));
            r.sync(&pod).unwrap();
            assert_eq!(r.fake.count("StartContainer"), starts + 1);
            assert!(r.waiting_reasons().is_empty());
        }
        assert_eq!(
            r.event("spec.containers{app}", "BackOff"),
            "Back-off restarting failed container app in pod web_default(u1)"
        );
        // Ran for 11 minutes: the next restart is immediate again, and the
        // one after waits 10 s.
        r.fake.advance(Duration::from_secs(11 * 60));
        r.exit("app", 1);
        r.sync(&pod).unwrap();
        r.exit("app", 1);
        match r.sync(&pod) {
            Err(SyncError::BackOff(_, left)) => assert!(left <= Duration::from_secs(10)),
            other => panic!("want a 10 s back-off, got {other:?}"),
        }
    }

    #[test]
    fn restart_policies_on_the_fake_runtime() {
        for (policy, code, restarted) in [
            ("Always", 0, true),
            ("OnFailure", 0, false),
            ("OnFailure", 1, true),
            ("Never", 1, false),
        ] {
            let r = rig();
            let mut pod = test_pod("u1", "web");
            pod.spec.as_mut().unwrap().restart_policy = Some(policy.into());
            r.sync(&pod).unwrap();
            r.exit("app", code);
            r.sync(&pod).unwrap();
            assert_eq!(r.running("app"), restarted, "{policy} exit {code}");
            if !restarted {
                // Finished: the sandbox is stopped and not made again.
                assert_eq!(r.fake.count("StopPodSandbox"), 1, "{policy}");
                r.sync(&pod).unwrap();
                assert_eq!(r.fake.count("RunPodSandbox"), 1, "{policy}");
            }
        }
    }

    #[test]
    fn init_containers_finish_first_and_a_sidecar_outlives_them() {
        let r = rig();
        let mut pod = test_pod("u1", "web");
        let spec = pod.spec.as_mut().unwrap();
        spec.restart_policy = Some("Never".into());
        spec.init_containers = Some(vec![
            Container {
                restart_policy: Some("Always".into()),
                ..container("side")
            },
            container("setup"),
        ]);
        r.sync(&pod).unwrap();
        assert!(r.running("side") && r.fake.container_id("setup").is_none());
        r.sync(&pod).unwrap();
        assert!(r.running("setup"));
        assert!(
            r.fake.container_id("app").is_none(),
            "app before setup ended"
        );
        r.sync(&pod).unwrap();
        assert!(r.fake.container_id("app").is_none(), "app while setup runs");
        r.exit("setup", 0);
        r.sync(&pod).unwrap();
        assert!(r.running("app") && r.running("side"));
        // The sidecar exits: it alone is restarted, despite restartPolicy Never.
        r.exit("side", 2);
        let app = r.fake.container_id("app");
        r.sync(&pod).unwrap();
        assert!(r.running("side"));
        assert_eq!(r.fake.container_id("app"), app);
        assert_eq!(r.fake.count("CreateContainer"), 4);
        // The app ends: the pod is done; the sidecar is stopped with it.
        r.exit("app", 0);
        r.sync(&pod).unwrap();
        assert!(!r.running("side"));
        assert_eq!(r.fake.count("StopPodSandbox"), 1);
        assert_eq!(
            r.event("spec.initContainers{side}", "Killing"),
            "Stopping container side"
        );
    }

    #[test]
    fn a_failed_init_container_is_retried_unless_the_policy_is_never() {
        for policy in ["OnFailure", "Never"] {
            let r = rig();
            let mut pod = test_pod("u1", "web");
            let spec = pod.spec.as_mut().unwrap();
            spec.restart_policy = Some(policy.into());
            spec.init_containers = Some(vec![container("setup")]);
            r.sync(&pod).unwrap();
            r.exit("setup", 1);
            r.sync(&pod).unwrap();
            if policy == "Never" {
                assert!(!r.running("setup"));
                assert_eq!(r.fake.count("StopPodSandbox"), 1);
                r.sync(&pod).unwrap();
                assert_eq!(r.fake.count("RunPodSandbox"), 1);
            } else {
                assert!(r.running("setup"), "retried under {policy}");
            }
            assert!(r.fake.container_id("app").is_none(), "{policy}");
        }
    }

    #[test]
    fn a_changed_container_is_restarted_alone() {
        let r = rig();
        let mut pod = test_pod("u1", "web");
        pod.spec
            .as_mut()
            .unwrap()
            .containers
            .push(container("other"));
        r.sync(&pod).unwrap();
        let other = r.fake.container_id("other");
        pod.spec.as_mut().unwrap().containers[0].args = Some(vec!["v2".into()]);
        r.sync(&pod).unwrap();
        assert_eq!(r.fake.stops().len(), 1);
        assert_eq!(r.fake.stops()[0].0, "app");
        assert!(r.running("app"));
        assert_eq!(r.fake.container_id("other"), other);
        assert_eq!(r.fake.count("RunPodSandbox"), 1);
        assert_eq!(
            r.event("spec.containers{app}", "Killing"),
            "Container app definition changed, will be restarted"
        );
    }

    #[test]
    fn a_changed_sandbox_recreates_the_pod() {
        let r = rig();
        let mut pod = test_pod("u1", "web");
        r.sync(&pod).unwrap();
        pod.spec.as_mut().unwrap().containers[0].ports =
            Some(vec![k8s_openapi::api::core::v1::ContainerPort {
                container_port: 80,
                host_port: Some(8080),
                ..Default::default()
            }]);
        r.sync(&pod).unwrap();
        assert_eq!(r.fake.count("StopPodSandbox"), 1);
        assert_eq!(r.fake.count("RunPodSandbox"), 2);
        assert!(r.running("app"));
        r.sync(&pod).unwrap();
        assert_eq!(r.fake.count("RunPodSandbox"), 2, "stable once recreated");
    }

    #[test]
    fn post_start_runs_after_the_start_and_its_failure_kills_the_container() {
        let r = rig();
        let mut pod = test_pod("u1", "web");
        pod.spec.as_mut().unwrap().containers[0].lifecycle = Some(Lifecycle {
            post_start: Some(exec_hook("touch /started")),
            ..Default::default()
        });
        r.sync(&pod).unwrap();
        assert_eq!(
            r.fake.execs(),
            vec![(
                "app".to_string(),
                vec!["sh".into(), "-c".into(), "touch /started".into()]
            )]
        );
        let calls = r.fake.calls();
        let start = calls.iter().position(|c| c == "StartContainer").unwrap();
        assert_eq!(calls[start + 1], "ExecSync");
        assert!(r.running("app"));

        let r = rig();
        r.fake.set_exec(ExecBehaviour {
            exit_code: 1,
            ..Default::default()
        });
        match r.sync(&pod) {
            Err(SyncError::Failed(m)) => assert!(m.contains("PostStartHookError"), "{m}"),
            other => panic!("want a failure, got {other:?}"),
        }
        assert!(!r.running("app"));
        let (reason, message) = r.waiting_reasons().remove("app").unwrap();
        assert_eq!(reason, "PostStartHookError");
        assert!(
            message.starts_with(
                "Exec lifecycle hook ([sh -c touch /started]) for Container \"app\" in Pod \"web_default(u1)\" failed - error: command 'sh -c touch /started' exited with 1"
            ),
            "{message}"
        );
        assert_eq!(
            r.event("spec.containers{app}", "FailedPostStartHook"),
            "PostStartHook failed"
        );
        assert_eq!(
            r.event("spec.containers{app}", "Killing"),
            "FailedPostStartHook"
        );
    }

    fn exited(name: &str, id: &str, created: i64) -> ContainerStatus {
        ContainerStatus {
            id: id.into(),
            name: name.into(),
            state: ContainerState::Exited,
            created_at: created,
            ..Default::default()
        }
    }

    #[test]
    fn dead_containers_beyond_the_limit_go_newest_kept() {
        let mut running = exited("app", "a3", 3);
        running.state = ContainerState::Running;
        let status = PodStatus {
            container_statuses: vec![
                running,
                exited("app", "a2", 2),
                exited("app", "a1", 1),
                exited("side", "s2", 2),
                exited("side", "s1", 1),
            ],
            ..Default::default()
        };
        assert_eq!(dead_to_remove(&status, 1), ["a1", "s1"]);
        assert_eq!(dead_to_remove(&status, 2), Vec::<&str>::new());
        // Zero keeps only what restart counts need: the newest of each.
        assert_eq!(dead_to_remove(&status, 0), ["a2", "a1", "s1"]);
    }
}
