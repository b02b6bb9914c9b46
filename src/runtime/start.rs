//! Starting one container (upstream's `startContainer`): the restart
//! back-off, the image, the CRI config, its subPaths and log directory,
//! CreateContainer and StartContainer, then its postStart hook (a failure
//! kills it again).

use std::path::Path;

use k8s_openapi::api::core::v1::{Container, LifecycleHandler, Pod};
use log::{info, warn};

use super::kill::Kill;
use super::status::{ContainerState, PodStatus};
use super::{actions, config, hooks, security};
use super::{
    create_log_dir, is_init_container, ns_to_time, Found, RuntimeManager, SandboxRef, SyncError,
    POST_START_HTTP_TIMEOUT,
};
use crate::cri::api;
use crate::events::{EventType, ObjectRef};
use crate::pod::{pod_full_name, pod_uid};

impl RuntimeManager {
    pub(super) fn start_container(
        &self,
        pod: &Pod,
        c: &Container,
        status: &PodStatus,
        sandbox: &SandboxRef,
        found: &mut Found,
    ) -> Result<(), SyncError> {
        let (sandbox_id, sandbox_config) = (sandbox.id, sandbox.config);
        let who = pod_full_name(pod);
        let prev = status.latest(&c.name);
        // Restart back-off, the pod's own, keyed by container and measured
        // from the exit.
        if let Some(p) = prev.filter(|p| p.state == ContainerState::Exited) {
            let key = &c.name;
            let exited = ns_to_time(p.finished_at);
            let now = self.clock.now();
            if let Some(left) = found.backoff.remaining(key, exited, now) {
                let total = found.backoff.current(key).unwrap_or(left);
                let message = format!(
                    "back-off {} restarting failed container={} pod={}",
                    crate::apitime::go_duration(total),
                    c.name,
                    hooks::format_pod(pod)
                );
                found.set_reason(&c.name, Some(("CrashLoopBackOff", message)));
                self.container_event(
                    pod,
                    c,
                    EventType::Warning,
                    "BackOff",
                    format!(
                        "Back-off restarting failed container {} in pod {}",
                        c.name,
                        hooks::format_pod(pod)
                    ),
                );
                return Err(SyncError::BackOff(
                    format!(
                        "pod {who}: container {:?}: back-off restarting failed container",
                        c.name
                    ),
                    left,
                ));
            }
            found.backoff.next(key, exited, now);
        }
        let restart_count = prev.map(|p| p.restart_count.saturating_add(1)).unwrap_or(0);
        let fail = |step: &str, e: &dyn std::fmt::Display| {
            SyncError::Failed(format!("pod {who}: container {:?}: {step}: {e}", c.name))
        };

        let image_ref = self.ensure_image(pod, c, sandbox_config, found)?;
        let volumes_dir = config::pod_dir(&self.root_dir, pod_uid(pod))
            .map_err(|e| fail("volumes", &e))?
            .join("volumes");
        let cfg = match self
            .container_inputs(pod, c, status, sandbox_id)
            .and_then(|inputs| {
                for message in config::invalid_env_from_keys(pod, c, &inputs) {
                    self.recorder.event(
                        &ObjectRef::pod(pod),
                        EventType::Warning,
                        "InvalidEnvironmentVariableNames",
                        message,
                    );
                }
                config::container_config(pod, c, restart_count, &image_ref, &volumes_dir, &inputs)
            })
            .and_then(|mut cfg| {
                if config::has_sub_paths(c) {
                    self.prepare_sub_paths(pod, c, &volumes_dir, &mut cfg)?;
                }
                if let Some(target) = actions::ephemeral_target(pod, &c.name) {
                    security::target_pid_namespace(&mut cfg, target, status)?;
                }
                Ok(cfg)
            }) {
            Ok(cfg) => cfg,
            Err(e) => {
                found.set_reason(&c.name, Some(("CreateContainerConfigError", e.to_string())));
                self.container_event(pod, c, EventType::Warning, "Failed", format!("Error: {e}"));
                return Err(SyncError::Failed(format!("pod {who}: {e}")));
            }
        };
        // emptyDir volumes are created here (their subPaths were made by
        // the safe walk above); the volume manager has filled the other
        // kinds already.
        let empty_dirs = volumes_dir.join("kubernetes.io~empty-dir");
        for m in &cfg.mounts {
            if Path::new(&m.host_path).starts_with(&empty_dirs) {
                std::fs::create_dir_all(&m.host_path)
                    .map_err(|e| fail(&format!("create volume directory {}", m.host_path), &e))?;
            }
        }
        let log_dir = config::pod_log_dir(&self.logs_root, pod)
            .and_then(|d| crate::paths::join(&d, &c.name))
            .map_err(|e| fail("create log directory", &e))?;
        create_log_dir(&log_dir)
            .map_err(|e| fail(&format!("create log directory {}", log_dir.display()), &e))?;
        found.changed = true;
        let id = match self
            .runtime
            .create_container(sandbox_id, &cfg, sandbox_config)
        {
            Ok(id) => id,
            Err(e) => {
                found.set_reason(&c.name, Some(("CreateContainerError", e.to_string())));
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
        crate::fault::point("container-created", format_args!("{who}/{}", c.name));
        if let Err(e) = self.runtime.start_container(&id) {
            found.set_reason(&c.name, Some(("RunContainerError", e.to_string())));
            self.container_event(pod, c, EventType::Warning, "Failed", format!("Error: {e}"));
            return Err(fail("start", &e));
        }
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
        crate::fault::point("container-started", format_args!("{who}/{}", c.name));
        if let Some(hook) = c.lifecycle.as_ref().and_then(|l| l.post_start.as_ref()) {
            if let Err(message) = self.run_post_start(pod, c, &id, hook, sandbox) {
                warn!("pod {who}: container {:?}: {message}", c.name);
                // The message may carry secrets: the event does not.
                self.container_event(
                    pod,
                    c,
                    EventType::Warning,
                    "FailedPostStartHook",
                    "PostStartHook failed".into(),
                );
                let kill = Kill {
                    id: &id,
                    name: &c.name,
                    message: Some("FailedPostStartHook".into()),
                    restored: None,
                };
                if let Err(e) = self.kill_container(pod, &kill, None, None, None) {
                    warn!(
                        "pod {who}: container {:?}: stop after postStart hook failure: {e}",
                        c.name
                    );
                }
                found.set_reason(&c.name, Some(("PostStartHookError", message)));
                return Err(fail("postStart hook", &"PostStartHookError"));
            }
        }
        found.set_reason(&c.name, None);
        Ok(())
    }

    /// Resolves `c`'s subPaths safely and bind-mounts each at
    /// `<root-dir>/pods/<uid>/volume-subpaths/<volume>/<container>/<index>`,
    /// which becomes the CRI mount's host path. A subPath that would leave
    /// its volume (a symlink, `..`, an absolute path) is an error naming
    /// the container, the mount and the subPath.
    pub(super) fn prepare_sub_paths(
        &self,
        pod: &Pod,
        c: &Container,
        volumes_dir: &Path,
        cfg: &mut api::ContainerConfig,
    ) -> Result<(), String> {
        let subs = config::sub_paths(pod, c, volumes_dir, &cfg.envs)?;
        let pod_dir = config::pod_dir(&self.root_dir, pod_uid(pod)).map_err(|e| e.to_string())?;
        let base = crate::volume::subpath::pod_subpaths_dir(&pod_dir);
        for sp in subs {
            let at = |m: String| {
                format!(
                    "container {:?}: volumeMounts {:?}: subPath {:?}: {m}",
                    c.name, sp.volume, sp.path
                )
            };
            // The names become directories: one plain name each.
            let target = crate::paths::join(&base, &sp.volume)
                .and_then(|d| crate::paths::join(&d, &c.name))
                .map_err(|e| at(e.to_string()))?
                .join(sp.index.to_string());
            let host_path = crate::volume::subpath::prepare(&sp, &target).map_err(at)?;
            let Some(m) = cfg.mounts.get_mut(sp.index) else {
                return Err(at("no such mount".into()));
            };
            m.host_path = host_path.to_string_lossy().into_owned();
        }
        Ok(())
    }

    /// Runs a container's postStart hook; the error is upstream's message.
    pub(super) fn run_post_start(
        &self,
        pod: &Pod,
        c: &Container,
        id: &str,
        hook: &LifecycleHandler,
        sandbox: &SandboxRef,
    ) -> Result<(), String> {
        let mut ip = (!sandbox.created)
            .then(|| sandbox.ips.first().cloned())
            .flatten();
        if ip.is_none() && hook.http_get.as_ref().is_some_and(|g| g.host.is_none()) {
            // A new sandbox: ask the runtime for its address.
            ip = self
                .runtime
                .pod_sandbox_status(sandbox.id)
                .ok()
                .and_then(|st| st.network.into_option())
                .map(|n| n.ip)
                .filter(|ip| !ip.is_empty());
        }
        hooks::run(
            &self.runtime,
            pod,
            c,
            id,
            hook,
            ip.as_deref(),
            POST_START_HTTP_TIMEOUT,
        )
    }

    /// Pull-if-needed under the container's imagePullPolicy (see
    /// `images`); returns the image reference to create the container from.
    pub(super) fn ensure_image(
        &self,
        pod: &Pod,
        c: &Container,
        sandbox_config: &api::PodSandboxConfig,
        found: &mut Found,
    ) -> Result<String, SyncError> {
        let container = ObjectRef::container(pod, &c.name, is_init_container(pod, &c.name));
        self.image_manager
            .ensure_image(pod, c, sandbox_config, &self.recorder, &container)
            .map_err(|e| {
                found.set_reason(&c.name, Some((e.reason, e.message.clone())));
                self.container_event(
                    pod,
                    c,
                    EventType::Warning,
                    "Failed",
                    format!("Error: {}", e.reason),
                );
                let m = format!(
                    "pod {}: container {:?}: {}: {}",
                    pod_full_name(pod),
                    c.name,
                    e.reason,
                    e.message
                );
                match e.retry_after {
                    Some(d) => SyncError::BackOff(m, d),
                    None => SyncError::Failed(m),
                }
            })
    }
}
