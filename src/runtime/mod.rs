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
//! 5. start the next init container;
//! 6. start the regular containers that should run.

pub mod actions;
pub mod backoff;
pub mod config;
pub mod labels;

#[cfg(test)]
pub mod fake;

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use k8s_openapi::api::core::v1::{Container, Pod};
use log::{debug, info, warn};
use parking_lot::Mutex;
use protobuf::EnumOrUnknown;

use crate::cri::{self, api, CriError, ImageService, RuntimeService};
use crate::events::{EventRecorder, EventType, ObjectRef};
use actions::{compute_pod_actions, PodActions};
use backoff::Backoff;
use labels::{pod_full_name, pod_uid};

/// The kubelet's floor for a graceful stop: a shorter grace period is raised to this.
const MIN_GRACE_PERIOD_SECS: i64 = 2;
const DEFAULT_GRACE_PERIOD_SECS: i64 = 30;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ContainerState {
    Created,
    Running,
    Exited,
    #[default]
    Unknown,
}

impl ContainerState {
    fn from_cri(s: EnumOrUnknown<api::ContainerState>) -> Self {
        match s.enum_value() {
            Ok(api::ContainerState::CONTAINER_CREATED) => ContainerState::Created,
            Ok(api::ContainerState::CONTAINER_RUNNING) => ContainerState::Running,
            Ok(api::ContainerState::CONTAINER_EXITED) => ContainerState::Exited,
            _ => ContainerState::Unknown,
        }
    }
}

/// One container as the runtime reports it (upstream `kubecontainer.Status`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ContainerStatus {
    pub id: String,
    pub name: String,
    pub state: ContainerState,
    pub created_at: i64,
    pub started_at: i64,
    pub finished_at: i64,
    pub exit_code: i32,
    pub image: String,
    pub image_ref: String,
    pub hash: u64,
    pub restart_count: u32,
    pub reason: String,
    pub message: String,
}

/// Everything the runtime knows of one pod, newest first.
#[derive(Debug, Clone, Default)]
pub struct PodStatus {
    pub uid: String,
    pub name: String,
    pub namespace: String,
    pub ips: Vec<String>,
    pub sandbox_statuses: Vec<api::PodSandboxStatus>,
    pub container_statuses: Vec<ContainerStatus>,
}

impl PodStatus {
    /// The newest status of the container named `name`.
    pub fn latest(&self, name: &str) -> Option<&ContainerStatus> {
        self.container_statuses.iter().find(|c| c.name == name)
    }
}

/// A sandbox or container in a relist: just enough to diff states.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuntimeContainer {
    pub id: String,
    pub name: String,
    pub state: ContainerState,
}

/// A pod as found by listing the runtime (upstream `kubecontainer.Pod`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RuntimePod {
    pub uid: String,
    pub name: String,
    pub namespace: String,
    pub sandboxes: Vec<RuntimeContainer>,
    pub containers: Vec<RuntimeContainer>,
}

/// Why a SyncPod did not fully succeed.
#[derive(Debug)]
pub enum SyncError {
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
pub type WaitingReasons = BTreeMap<String, (String, String)>;

pub struct RuntimeManager {
    runtime: Arc<dyn RuntimeService>,
    images: Arc<dyn ImageService>,
    root_dir: PathBuf,
    logs_root: PathBuf,
    backoff: Mutex<Backoff>,
    recorder: EventRecorder,
    /// Why each pod's containers could not start in the last sync, by pod
    /// UID and container name (upstream `ReasonCache`), for pod status.
    reasons: Mutex<HashMap<String, WaitingReasons>>,
    /// Standing probe results: a failed liveness or startup probe kills
    /// and restarts its container.
    probe_results: Option<Arc<crate::prober::ProbeResults>>,
}

fn ns_to_time(ns: i64) -> SystemTime {
    UNIX_EPOCH + Duration::from_nanos(ns.max(0) as u64)
}

impl RuntimeManager {
    pub fn new(
        runtime: Arc<dyn RuntimeService>,
        images: Arc<dyn ImageService>,
        root_dir: PathBuf,
        logs_root: PathBuf,
    ) -> Self {
        RuntimeManager {
            runtime,
            images,
            root_dir,
            logs_root,
            backoff: Mutex::new(Backoff::default()),
            recorder: EventRecorder::disabled(),
            reasons: Mutex::new(HashMap::new()),
            probe_results: None,
        }
    }

    /// Kills and restarts containers whose liveness or startup probe
    /// failed, as `results` says.
    pub fn with_probe_results(mut self, results: Arc<crate::prober::ProbeResults>) -> Self {
        self.probe_results = Some(results);
        self
    }

    /// The standing probe results this manager acts on.
    pub fn probe_results(&self) -> Option<&crate::prober::ProbeResults> {
        self.probe_results.as_deref()
    }

    /// Runs `cmd` in a running container (exec probes), within `timeout`.
    pub fn exec_sync(
        &self,
        container_id: &str,
        cmd: &[String],
        timeout: Duration,
    ) -> Result<api::ExecSyncResponse, CriError> {
        self.runtime.exec_sync(container_id, cmd, timeout)
    }

    /// Reports the pod lifecycle events (Pulling, Created, Killing, ...) to
    /// `recorder`.
    pub fn with_recorder(mut self, recorder: EventRecorder) -> Self {
        self.recorder = recorder;
        self
    }

    /// Why containers of pod `uid` are waiting, by container name:
    /// `(reason, message)` from the last sync.
    pub fn waiting_reasons(&self, uid: &str) -> WaitingReasons {
        self.reasons.lock().get(uid).cloned().unwrap_or_default()
    }

    fn set_reason(&self, pod: &Pod, container: &str, reason: Option<(&str, String)>) {
        let mut all = self.reasons.lock();
        let uid = pod_uid(pod);
        match reason {
            Some((r, m)) => {
                all.entry(uid.to_string())
                    .or_default()
                    .insert(container.to_string(), (r.to_string(), m));
            }
            None => {
                if let Some(map) = all.get_mut(uid) {
                    map.remove(container);
                    if map.is_empty() {
                        all.remove(uid);
                    }
                }
            }
        }
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

    /// Lists every pod the runtime holds that carries tinylet's labels.
    pub fn get_pods(&self) -> Result<Vec<RuntimePod>, CriError> {
        let sandboxes = self.runtime.list_pod_sandbox(None)?;
        let containers = self.runtime.list_containers(None)?;
        let mut pods: Vec<RuntimePod> = Vec::new();
        fn entry<'a>(
            pods: &'a mut Vec<RuntimePod>,
            labels: &std::collections::HashMap<String, String>,
        ) -> Option<&'a mut RuntimePod> {
            let uid = labels.get(labels::POD_UID)?;
            let i = match pods.iter().position(|p| &p.uid == uid) {
                Some(i) => i,
                None => {
                    pods.push(RuntimePod {
                        uid: uid.clone(),
                        name: labels.get(labels::POD_NAME).cloned().unwrap_or_default(),
                        namespace: labels
                            .get(labels::POD_NAMESPACE)
                            .cloned()
                            .unwrap_or_default(),
                        ..Default::default()
                    });
                    pods.len() - 1
                }
            };
            pods.get_mut(i)
        }
        for s in sandboxes {
            if let Some(p) = entry(&mut pods, &s.labels) {
                p.sandboxes.push(RuntimeContainer {
                    id: s.id.clone(),
                    name: String::new(),
                    state: if s.state.enum_value() == Ok(api::PodSandboxState::SANDBOX_READY) {
                        ContainerState::Running
                    } else {
                        ContainerState::Exited
                    },
                });
            }
        }
        for c in containers {
            if let Some(p) = entry(&mut pods, &c.labels) {
                p.containers.push(RuntimeContainer {
                    id: c.id.clone(),
                    name: c
                        .labels
                        .get(labels::CONTAINER_NAME)
                        .cloned()
                        .unwrap_or_default(),
                    state: ContainerState::from_cri(c.state),
                });
            }
        }
        Ok(pods)
    }

    /// Inspects one pod's sandboxes and containers in detail.
    pub fn get_pod_status(
        &self,
        uid: &str,
        name: &str,
        namespace: &str,
    ) -> Result<PodStatus, CriError> {
        let mut sf = api::PodSandboxFilter::new();
        sf.label_selector.insert(labels::POD_UID.into(), uid.into());
        let mut sandboxes = self.runtime.list_pod_sandbox(Some(sf))?;
        sandboxes.sort_by_key(|s| std::cmp::Reverse(s.created_at));
        let mut status = PodStatus {
            uid: uid.into(),
            name: name.into(),
            namespace: namespace.into(),
            ..Default::default()
        };
        for (i, s) in sandboxes.iter().enumerate() {
            match self.runtime.pod_sandbox_status(&s.id) {
                Ok(st) => {
                    if i == 0 && st.state.enum_value() == Ok(api::PodSandboxState::SANDBOX_READY) {
                        if let Some(n) = st.network.as_ref() {
                            if !n.ip.is_empty() {
                                status.ips.push(n.ip.clone());
                            }
                            status
                                .ips
                                .extend(n.additional_ips.iter().map(|ip| ip.ip.clone()));
                        }
                    }
                    status.sandbox_statuses.push(st);
                }
                // Removed between the list and the inspect: it is gone.
                Err(e) if e.is_not_found() => {}
                Err(e) => return Err(e),
            }
        }
        let mut cf = api::ContainerFilter::new();
        cf.label_selector.insert(labels::POD_UID.into(), uid.into());
        for c in self.runtime.list_containers(Some(cf))? {
            match self.runtime.container_status(&c.id) {
                Ok(st) => status.container_statuses.push(ContainerStatus {
                    id: st.id.clone(),
                    name: st
                        .labels
                        .get(labels::CONTAINER_NAME)
                        .cloned()
                        .or_else(|| st.metadata.as_ref().map(|m| m.name.clone()))
                        .unwrap_or_default(),
                    state: ContainerState::from_cri(st.state),
                    created_at: st.created_at,
                    started_at: st.started_at,
                    finished_at: st.finished_at,
                    exit_code: st.exit_code,
                    image: st
                        .image
                        .as_ref()
                        .map(|i| i.image.clone())
                        .unwrap_or_default(),
                    image_ref: st.image_ref.clone(),
                    hash: labels::parse_hash(&st.annotations),
                    restart_count: labels::parse_restart_count(&st.annotations),
                    reason: st.reason.clone(),
                    message: st.message.clone(),
                }),
                Err(e) if e.is_not_found() => {}
                Err(e) => return Err(e),
            }
        }
        status
            .container_statuses
            .sort_by_key(|c| std::cmp::Reverse(c.created_at));
        Ok(status)
    }

    /// Brings the pod's runtime state to its spec: the six steps.
    pub fn sync_pod(&self, pod: &Pod, status: &PodStatus) -> Result<(), SyncError> {
        let who = pod_full_name(pod);
        let mut actions = compute_pod_actions(pod, status);
        let probe_kills = self.probe_kills(pod, status, &mut actions);
        debug!("pod {who}: actions {actions:?}");
        let fail = |step: &str, e: &dyn std::fmt::Display| {
            SyncError::Failed(format!("pod {who}: {step}: {e}"))
        };

        // Steps 2 and 3.
        if actions.kill_pod {
            if !status.sandbox_statuses.is_empty() || !status.container_statuses.is_empty() {
                info!("pod {who}: stopping its containers and sandbox (sandbox changed or pod finished)");
                self.kill_pod(pod, status, None)
                    .map_err(|e| fail("kill pod", &e))?;
            }
        } else {
            for (id, name, reason) in &actions.containers_to_kill {
                info!("pod {who}: stopping container {name:?} ({id:.12}): {reason}");
                self.kill_container(id, grace_period(pod, None))
                    .map_err(|e| fail(&format!("stop container {name:?}"), &e))?;
            }
            for k in &probe_kills {
                info!(
                    "pod {who}: stopping container {:?} ({:.12}): {}",
                    k.name, k.id, k.message
                );
                self.recorder.event(
                    &ObjectRef::container(pod, &k.name, false),
                    EventType::Normal,
                    "Killing",
                    k.message.clone(),
                );
                self.kill_container(&k.id, grace_period(pod, k.grace))
                    .map_err(|e| fail(&format!("stop container {:?}", k.name), &e))?;
            }
        }

        let PodActions {
            create_sandbox,
            mut sandbox_id,
            attempt,
            next_init_container,
            containers_to_start,
            ..
        } = actions;
        let sandbox_config = config::sandbox_config(pod, attempt, &self.logs_root);

        // Step 4.
        if create_sandbox {
            let log_dir = config::pod_log_dir(&self.logs_root, pod);
            std::fs::create_dir_all(&log_dir)
                .map_err(|e| fail(&format!("create log directory {}", log_dir.display()), &e))?;
            let start = std::time::Instant::now();
            sandbox_id = self
                .runtime
                .run_pod_sandbox(&sandbox_config, "")
                .map_err(|e| fail("create sandbox", &e))?;
            info!(
                "pod {who}: sandbox {sandbox_id:.12} running (attempt {attempt}, {} ms)",
                start.elapsed().as_millis()
            );
        }
        if sandbox_id.is_empty() {
            return Ok(());
        }

        let spec = pod.spec.as_ref();
        // Step 5.
        if let Some(i) = next_init_container {
            if let Some(c) = spec
                .and_then(|s| s.init_containers.as_ref())
                .and_then(|v| v.get(i))
            {
                self.start_container(pod, c, status, &sandbox_id, &sandbox_config)?;
            }
            return Ok(());
        }
        // Step 6.
        let mut first_err = None;
        for i in containers_to_start {
            let Some(c) = spec.and_then(|s| s.containers.get(i)) else {
                continue;
            };
            if let Err(e) = self.start_container(pod, c, status, &sandbox_id, &sandbox_config) {
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
    ) -> Vec<crate::prober::ProbeKill> {
        let Some(results) = &self.probe_results else {
            return Vec::new();
        };
        if actions.kill_pod {
            return Vec::new();
        }
        let kills: Vec<_> = crate::prober::failed_probe_kills(pod, status, results)
            .into_iter()
            .filter(|k| {
                !actions
                    .containers_to_kill
                    .iter()
                    .any(|(id, _, _)| *id == k.id)
            })
            .collect();
        for k in &kills {
            if k.restart && !actions.containers_to_start.contains(&k.index) {
                actions.containers_to_start.push(k.index);
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

    fn start_container(
        &self,
        pod: &Pod,
        c: &Container,
        status: &PodStatus,
        sandbox_id: &str,
        sandbox_config: &api::PodSandboxConfig,
    ) -> Result<(), SyncError> {
        let who = pod_full_name(pod);
        let prev = status.latest(&c.name);
        // Restart back-off, keyed by pod and container, measured from the exit.
        if let Some(p) = prev.filter(|p| p.state == ContainerState::Exited) {
            let key = backoff_key(pod, c);
            let exited = ns_to_time(p.finished_at);
            let now = SystemTime::now();
            let mut b = self.backoff.lock();
            if let Some(left) = b.remaining(&key, exited, now) {
                let total = b.current(&key).unwrap_or(left);
                drop(b);
                let message = format!(
                    "back-off {} restarting failed container={} pod={}_{}({})",
                    go_duration(total),
                    c.name,
                    labels::pod_name(pod),
                    labels::pod_namespace(pod),
                    pod_uid(pod)
                );
                self.set_reason(pod, &c.name, Some(("CrashLoopBackOff", message)));
                self.container_event(
                    pod,
                    c,
                    EventType::Warning,
                    "BackOff",
                    "Back-off restarting failed container".into(),
                );
                return Err(SyncError::BackOff(
                    format!(
                        "pod {who}: container {:?}: back-off restarting failed container",
                        c.name
                    ),
                    left,
                ));
            }
            b.next(&key, exited, now);
        }
        let restart_count = prev.map(|p| p.restart_count + 1).unwrap_or(0);
        let fail = |step: &str, e: &dyn std::fmt::Display| {
            SyncError::Failed(format!("pod {who}: container {:?}: {step}: {e}", c.name))
        };

        let image_ref = self.ensure_image(pod, c, sandbox_config)?;
        let volumes_dir = config::pod_dir(&self.root_dir, pod_uid(pod)).join("volumes");
        let cfg = match config::container_config(pod, c, restart_count, &image_ref, &volumes_dir) {
            Ok(cfg) => cfg,
            Err(e) => {
                self.set_reason(
                    pod,
                    &c.name,
                    Some(("CreateContainerConfigError", e.to_string())),
                );
                self.container_event(pod, c, EventType::Warning, "Failed", format!("Error: {e}"));
                return Err(SyncError::Failed(format!("pod {who}: {e}")));
            }
        };
        for m in &cfg.mounts {
            if m.host_path.starts_with(&*volumes_dir.to_string_lossy()) {
                std::fs::create_dir_all(&m.host_path)
                    .map_err(|e| fail(&format!("create volume directory {}", m.host_path), &e))?;
            }
        }
        let log_dir = config::pod_log_dir(&self.logs_root, pod).join(&c.name);
        std::fs::create_dir_all(&log_dir)
            .map_err(|e| fail(&format!("create log directory {}", log_dir.display()), &e))?;
        let id = match self
            .runtime
            .create_container(sandbox_id, &cfg, sandbox_config)
        {
            Ok(id) => id,
            Err(e) => {
                self.set_reason(pod, &c.name, Some(("CreateContainerError", e.to_string())));
                self.container_event(pod, c, EventType::Warning, "Failed", format!("Error: {e}"));
                return Err(fail("create", &e));
            }
        };
        self.container_event(
            pod,
            c,
            EventType::Normal,
            "Created",
            format!("Created container {}", c.name),
        );
        if let Err(e) = self.runtime.start_container(&id) {
            self.set_reason(pod, &c.name, Some(("RunContainerError", e.to_string())));
            self.container_event(pod, c, EventType::Warning, "Failed", format!("Error: {e}"));
            return Err(fail("start", &e));
        }
        self.set_reason(pod, &c.name, None);
        self.container_event(
            pod,
            c,
            EventType::Normal,
            "Started",
            format!("Started container {}", c.name),
        );
        info!(
            "pod {who}: container {:?} started ({id:.12}, restart count {restart_count})",
            c.name
        );
        Ok(())
    }

    /// Pull-if-needed under the container's imagePullPolicy; returns the image reference.
    fn ensure_image(
        &self,
        pod: &Pod,
        c: &Container,
        sandbox_config: &api::PodSandboxConfig,
    ) -> Result<String, SyncError> {
        let who = pod_full_name(pod);
        let image = c.image.as_deref().unwrap_or("");
        let fail = |step: &str, e: &dyn std::fmt::Display| {
            SyncError::Failed(format!(
                "pod {who}: container {:?}: {step} {image:?}: {e}",
                c.name
            ))
        };
        let mut spec = api::ImageSpec::new();
        spec.image = image.to_string();
        let policy = c
            .image_pull_policy
            .clone()
            .unwrap_or_else(|| default_pull_policy(image).into());
        if policy != "Always" {
            let present = self
                .images
                .image_status(&spec)
                .map_err(|e| fail("inspect image", &e))?;
            match present {
                Some(img) => {
                    self.container_event(
                        pod,
                        c,
                        EventType::Normal,
                        "Pulled",
                        format!("Container image {image:?} already present on machine"),
                    );
                    return Ok(if img.id.is_empty() {
                        image.to_string()
                    } else {
                        img.id
                    });
                }
                None if policy == "Never" => {
                    let message = format!(
                        "Container image {image:?} is not present with pull policy of Never"
                    );
                    self.set_reason(pod, &c.name, Some(("ErrImageNeverPull", message.clone())));
                    self.container_event(pod, c, EventType::Warning, "ErrImageNeverPull", message);
                    return Err(fail(
                        "image",
                        &"not present and imagePullPolicy is Never (ErrImageNeverPull)",
                    ));
                }
                None => {}
            }
        }
        info!("pod {who}: pulling image {image:?}");
        self.container_event(
            pod,
            c,
            EventType::Normal,
            "Pulling",
            format!("Pulling image {image:?}"),
        );
        let started = std::time::Instant::now();
        match self.images.pull_image(&spec, None, Some(sandbox_config)) {
            Ok(r) => {
                self.container_event(
                    pod,
                    c,
                    EventType::Normal,
                    "Pulled",
                    format!(
                        "Successfully pulled image {image:?} in {:.3}s",
                        started.elapsed().as_secs_f64()
                    ),
                );
                Ok(r)
            }
            Err(e) => {
                let message = format!("Failed to pull image {image:?}: {e}");
                self.set_reason(pod, &c.name, Some(("ErrImagePull", message.clone())));
                self.container_event(pod, c, EventType::Warning, "Failed", message);
                self.container_event(
                    pod,
                    c,
                    EventType::Warning,
                    "Failed",
                    "Error: ErrImagePull".into(),
                );
                Err(fail("pull image", &e))
            }
        }
    }

    fn kill_container(&self, id: &str, grace: i64) -> Result<(), CriError> {
        match self.runtime.stop_container(id, grace) {
            Err(e) if e.is_not_found() => Ok(()),
            r => r,
        }
    }

    /// Stops every container of the pod (in parallel, each with the grace
    /// period) and then its sandboxes. For a pod known only from the runtime,
    /// `pod` carries just its identity and the default grace period applies.
    pub fn kill_pod(
        &self,
        pod: &Pod,
        status: &PodStatus,
        grace_override: Option<i64>,
    ) -> Result<(), CriError> {
        let grace = grace_period(pod, grace_override);
        let running: Vec<&ContainerStatus> = status
            .container_statuses
            .iter()
            .filter(|c| {
                matches!(
                    c.state,
                    ContainerState::Running | ContainerState::Created | ContainerState::Unknown
                )
            })
            .collect();
        for c in &running {
            self.recorder.event(
                &ObjectRef::container(pod, &c.name, is_init_container(pod, &c.name)),
                EventType::Normal,
                "Killing",
                format!("Stopping container {}", c.name),
            );
        }
        let results: Vec<Result<(), CriError>> = std::thread::scope(|s| {
            let handles: Vec<_> = running
                .iter()
                .map(|c| {
                    let id = c.id.clone();
                    std::thread::Builder::new()
                        .name(format!("kill/{:.12}", c.id))
                        .stack_size(crate::thread::DEFAULT_STACK)
                        .spawn_scoped(s, move || self.kill_container(&id, grace))
                })
                .collect();
            handles
                .into_iter()
                .zip(&running)
                .map(|(h, c)| match h {
                    Ok(h) => h.join().unwrap_or(Ok(())),
                    // No thread to spare: stop it from this one.
                    Err(_) => self.kill_container(&c.id, grace),
                })
                .collect()
        });
        for r in results {
            r?;
        }
        for s in &status.sandbox_statuses {
            if s.state.enum_value() == Ok(api::PodSandboxState::SANDBOX_READY) {
                match self.runtime.stop_pod_sandbox(&s.id) {
                    Err(e) if !e.is_not_found() => return Err(e),
                    _ => {}
                }
            }
        }
        Ok(())
    }

    /// Removes every container and sandbox of a pod that has been killed, and
    /// its directories. Called when the pod is gone for good.
    pub fn remove_pod(&self, uid: &str, status: &PodStatus) -> Result<(), CriError> {
        for c in &status.container_statuses {
            match self.runtime.remove_container(&c.id) {
                Err(e) if !e.is_not_found() => return Err(e),
                _ => {}
            }
        }
        for s in &status.sandbox_statuses {
            match self.runtime.remove_pod_sandbox(&s.id) {
                Err(e) if !e.is_not_found() => return Err(e),
                _ => {}
            }
        }
        let dir = config::pod_dir(&self.root_dir, uid);
        if let Err(e) = std::fs::remove_dir_all(&dir) {
            if e.kind() != std::io::ErrorKind::NotFound {
                warn!("pod {uid}: cannot remove {}: {e}", dir.display());
            }
        }
        self.backoff.lock().forget_prefix(&format!("{uid}/"));
        self.reasons.lock().remove(uid);
        Ok(())
    }

    /// Removes exited containers of a live pod beyond the newest one per name
    /// and sandboxes that are not ready beyond the newest (upstream container
    /// GC keeps one dead instance per container).
    pub fn prune_dead(&self, status: &PodStatus) {
        let mut seen = std::collections::HashSet::new();
        for c in &status.container_statuses {
            if !seen.insert(c.name.as_str()) && c.state == ContainerState::Exited {
                if let Err(e) = self.runtime.remove_container(&c.id) {
                    debug!("remove dead container {:.12}: {e}", c.id);
                }
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

    pub fn runtime(&self) -> &Arc<dyn RuntimeService> {
        &self.runtime
    }
}

fn is_init_container(pod: &Pod, name: &str) -> bool {
    pod.spec
        .as_ref()
        .and_then(|s| s.init_containers.as_ref())
        .is_some_and(|v| v.iter().any(|i| i.name == name))
}

/// A duration the way Go prints it in upstream messages: `10s`, `2m40s`, `5m0s`.
fn go_duration(d: Duration) -> String {
    let secs = d.as_secs();
    if secs >= 60 {
        format!("{}m{}s", secs / 60, secs % 60)
    } else {
        format!("{secs}s")
    }
}

fn backoff_key(pod: &Pod, c: &Container) -> String {
    format!("{}/{}", pod_uid(pod), c.name)
}

/// The default pull policy: Always for `:latest` or untagged images.
pub fn default_pull_policy(image: &str) -> &'static str {
    let name = image.split('@').next().unwrap_or(image);
    let last = name.rsplit('/').next().unwrap_or(name);
    if image.contains('@') {
        return "IfNotPresent";
    }
    match last.split_once(':') {
        Some((_, "latest")) | None => "Always",
        Some(_) => "IfNotPresent",
    }
}

fn grace_period(pod: &Pod, over: Option<i64>) -> i64 {
    over.or(pod.metadata.deletion_grace_period_seconds)
        .or_else(|| {
            pod.spec
                .as_ref()
                .and_then(|s| s.termination_grace_period_seconds)
        })
        .unwrap_or(DEFAULT_GRACE_PERIOD_SECS)
        .max(MIN_GRACE_PERIOD_SECS)
}

pub use cri::DEFAULT_REQUEST_TIMEOUT;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pull_policy_defaults() {
        assert_eq!(default_pull_policy("busybox"), "Always");
        assert_eq!(default_pull_policy("busybox:latest"), "Always");
        assert_eq!(
            default_pull_policy("docker.io/tinylet/busybox:1"),
            "IfNotPresent"
        );
        assert_eq!(default_pull_policy("localhost:5000/busybox"), "Always");
        assert_eq!(default_pull_policy("busybox@sha256:abcd"), "IfNotPresent");
    }
}
