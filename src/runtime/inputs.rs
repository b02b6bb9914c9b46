//! What a container's CRI config needs from outside its pod, gathered at
//! creation: the sandbox's IPs, the node's allocatable resources, and the
//! image's user when `runAsNonRoot` must be checked, the service variables
//! and the ConfigMaps and Secrets its env names; writes the pod's
//! managed `/etc/hosts`, and reports DNS settings that had to be cut.

use std::path::PathBuf;

use k8s_openapi::api::core::v1::{Container, Pod};
use log::warn;

use super::config::{self, ContainerInputs, EnvObjectKind, EnvObjects};
use super::dns;
use super::security::{self, ImageUser};
use super::{PodStatus, RuntimeManager};
use crate::atomic_file::{write_file, Durability};
use crate::cri::api;
use crate::events::{EventType, ObjectRef};
use crate::pod::{pod_full_name, pod_namespace, pod_uid};

impl RuntimeManager {
    /// Logs and reports what the pod's DNS settings had to give up (no
    /// cluster DNS for ClusterFirst, too many nameservers or search paths),
    /// as upstream does when it creates the sandbox.
    pub(super) fn report_dns_warnings(&self, pod: &Pod) {
        let host = dns::read_host_resolv_conf(&self.node);
        for (reason, message) in dns::pod_dns(pod, &self.node, &host).1 {
            warn!("pod {}: {reason}: {message}", pod_full_name(pod));
            self.recorder
                .event(&ObjectRef::pod(pod), EventType::Warning, reason, message);
        }
    }

    /// The inputs of `c`'s config in sandbox `sandbox_id`. An error (the
    /// image's user cannot be read) is a config error of the container.
    pub(super) fn container_inputs(
        &self,
        pod: &Pod,
        c: &Container,
        status: &PodStatus,
        sandbox_id: &str,
    ) -> Result<ContainerInputs<'_>, String> {
        let service_env = self.service_env(pod)?;
        let env_objects = self.env_objects(pod, c)?;
        let image_user = if security::must_verify_non_root(pod, c) {
            Some(self.image_user(c)?)
        } else {
            None
        };
        let pod_ips = self.sandbox_ips(pod, status, sandbox_id);
        let etc_hosts = if pod_ips.is_empty() {
            None
        } else {
            Some(self.write_etc_hosts(pod, &pod_ips)?)
        };
        let termination_log = if config::termination_message_path(c).is_empty() {
            None
        } else {
            Some(self.create_termination_log(pod, c)?)
        };
        Ok(ContainerInputs {
            settings: &self.node,
            pod_ips,
            allocatable: (self.allocatable)(),
            image_user,
            etc_hosts,
            termination_log,
            service_env,
            env_objects,
        })
    }

    /// The pod's service variables. Until the Services were read once an
    /// API pod cannot have them, which is a config error (upstream's
    /// message) that the pod's next sync retries; a static pod then gets
    /// none, as upstream, and so does a pod restored from a checkpoint,
    /// and every pod of a node without an apiserver.
    fn service_env(&self, pod: &Pod) -> Result<Vec<(String, String)>, String> {
        let Some(services) = self.services.as_ref() else {
            return Ok(Vec::new());
        };
        let links = pod
            .spec
            .as_ref()
            .and_then(|s| s.enable_service_links)
            .unwrap_or(true);
        match services.env(pod_namespace(pod), links) {
            Some(env) => Ok(env),
            None if crate::pod::is_static_pod(pod) => Ok(Vec::new()),
            // Restored during an outage: started without the variables
            // (a deviation; see `Services::restored`).
            None if services.is_restored(pod_uid(pod)) => Ok(Vec::new()),
            None => Err(
                "services have not yet been read at least once, cannot construct envvars".into(),
            ),
        }
    }

    /// The ConfigMaps and Secrets `c`'s env names, each read once from the
    /// object source; `None` without one. A read that fails (other than
    /// for a missing object) fails the container's config, optional or not,
    /// as upstream.
    fn env_objects(&self, pod: &Pod, c: &Container) -> Result<Option<EnvObjects>, String> {
        let Some(source) = self.objects.as_deref() else {
            return Ok(None);
        };
        let ns = pod_namespace(pod);
        let mut out = EnvObjects::new();
        for (kind, name) in config::env_object_refs(c) {
            let fetched = match kind {
                EnvObjectKind::ConfigMap => source.config_map(ns, name)?,
                EnvObjectKind::Secret => source.secret(ns, name)?,
            };
            out.insert((kind, name.to_string()), fetched);
        }
        Ok(Some(out))
    }

    /// Writes the pod's managed `/etc/hosts` under its pod dir (again at
    /// each container creation, as upstream) and returns its path.
    fn write_etc_hosts(&self, pod: &Pod, pod_ips: &[String]) -> Result<PathBuf, String> {
        let node_hosts = if pod.spec.as_ref().and_then(|s| s.host_network) == Some(true) {
            std::fs::read_to_string("/etc/hosts").map_err(|e| format!("read /etc/hosts: {e}"))?
        } else {
            String::new()
        };
        let text = dns::etc_hosts_content(pod, &self.node, pod_ips, &node_hosts);
        // Replaced in one rename: a full disk must not leave the running
        // containers of the pod, which mount this file, an empty one.
        let dir = crate::paths::ensure_pod_dirs(&self.root_dir, pod_uid(pod), &[])
            .map_err(|e| format!("create the pod's directory: {e}"))?;
        let path = dir.join("etc-hosts");
        write_file(&path, text.as_bytes(), 0o644, Durability::Rename).map_err(|e| e.to_string())?;
        Ok(path)
    }

    /// Creates an empty, world-writable file for this instance of the
    /// container's termination message, under
    /// `<pod dir>/containers/<name>/`, as upstream.
    fn create_termination_log(&self, pod: &Pod, c: &Container) -> Result<PathBuf, String> {
        use std::os::unix::fs::PermissionsExt;
        let dir =
            crate::paths::ensure_pod_dirs(&self.root_dir, pod_uid(pod), &["containers", &c.name])
                .map_err(|e| format!("create the container's directory: {e}"))?;
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        let path = dir.join(format!("{nanos:x}"));
        std::fs::File::create(&path)
            .and_then(|_| std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666)))
            .map_err(|e| format!("create termination log {}: {e}", path.display()))?;
        Ok(path)
    }

    /// The pod's IPs: the node's for a hostNetwork pod, else the sandbox's
    /// (read again when the sandbox is newer than `status`).
    fn sandbox_ips(&self, pod: &Pod, status: &PodStatus, sandbox_id: &str) -> Vec<String> {
        if pod
            .spec
            .as_ref()
            .and_then(|s| s.host_network)
            .unwrap_or(false)
        {
            return self.node.host_ips.clone();
        }
        if status
            .sandbox_statuses
            .first()
            .is_some_and(|s| s.id == sandbox_id)
        {
            return status.ips.clone();
        }
        match self.runtime.pod_sandbox_status(sandbox_id) {
            Ok(st) => st
                .network
                .as_ref()
                .map(|n| {
                    std::iter::once(n.ip.clone())
                        .filter(|ip| !ip.is_empty())
                        .chain(n.additional_ips.iter().map(|ip| ip.ip.clone()))
                        .collect()
                })
                .unwrap_or_default(),
            Err(e) => {
                warn!(
                    "pod {}: sandbox {sandbox_id:.12}: cannot read its IPs: {e}",
                    pod_full_name(pod)
                );
                Vec::new()
            }
        }
    }

    /// The user the container's image runs as (upstream `getImageUser`):
    /// its uid, else its user name, else root.
    fn image_user(&self, c: &Container) -> Result<ImageUser, String> {
        let mut spec = api::ImageSpec::new();
        spec.image = c.image.clone().unwrap_or_default();
        let image = self
            .images
            .image_status(&spec)
            .map_err(|e| format!("inspect image {:?}: {e}", spec.image))?
            .ok_or_else(|| format!("image {:?} is not present", spec.image))?;
        Ok(match (image.uid.as_ref(), image.username.as_str()) {
            (Some(uid), _) => ImageUser {
                uid: Some(uid.value),
                username: String::new(),
            },
            (None, name) if !name.is_empty() => ImageUser {
                uid: None,
                username: name.to_string(),
            },
            _ => ImageUser {
                uid: Some(0),
                username: String::new(),
            },
        })
    }
}
