//! Turning a pod spec into CRI sandbox and container configs: metadata,
//! ports, env and `$(VAR)` expansion, mounts and subPaths, resources, QoS.
//! DNS and the hosts file are in `dns`, the security context in `security`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::{Container, EnvFromSource, EnvVar, EnvVarSource, Pod};
use protobuf::{EnumOrUnknown, MessageField};

use super::dns::{hostname_and_domain, pod_dns, read_host_resolv_conf};
use super::expansion::expand;
use super::labels;
use super::qos;
use super::security::{
    container_security_context, sandbox_security_context, verify_run_as_non_root, ImageUser,
};
use super::NodeSettings;
use crate::cri::api;
use crate::fieldpath::{self, NodeAllocatable};
use crate::pod::{pod_name, pod_namespace, pod_uid};
use crate::quantity::{parse_bytes, parse_millis};

/// What a container's config needs besides its pod, known when it is created.
#[derive(Debug, Clone)]
pub struct ContainerInputs<'a> {
    pub settings: &'a NodeSettings,
    /// The sandbox's IPs (for a hostNetwork pod, the node's), primary first.
    pub pod_ips: Vec<String>,
    /// Stands in for missing limits in `resourceFieldRef`s.
    pub allocatable: NodeAllocatable,
    /// The image's user, looked up when `runAsNonRoot` must be checked.
    pub image_user: Option<ImageUser>,
    /// The pod's managed `/etc/hosts` file, mounted unless the container
    /// mounts its own.
    pub etc_hosts: Option<PathBuf>,
    /// A fresh empty file mounted at the container's
    /// terminationMessagePath, read back when it has exited.
    pub termination_log: Option<PathBuf>,
    /// The pod's service variables (`services::Services::env`); empty
    /// without an apiserver.
    pub service_env: Vec<(String, String)>,
    /// The ConfigMaps and Secrets the container's env names, read at its
    /// creation (`None` for one that does not exist); `None` when there
    /// is no apiserver to read them from.
    pub env_objects: Option<EnvObjects>,
}

/// The kind of object an env source names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum EnvObjectKind {
    ConfigMap,
    Secret,
}

/// ConfigMaps and Secrets by kind and name: their keys, or `None` for one
/// that does not exist.
pub(crate) type EnvObjects =
    BTreeMap<(EnvObjectKind, String), Option<crate::volume::payload::Keys>>;

/// Where a container writes its termination message (`/dev/termination-log`
/// unless set; empty: nowhere).
pub(crate) fn termination_message_path(container: &Container) -> &str {
    container
        .termination_message_path
        .as_deref()
        .unwrap_or("/dev/termination-log")
}

/// Where a pod's container logs go: `<logs_root>/<namespace>_<name>_<uid>`,
/// the layout log collectors expect from the kubelet. Fails when the pod's
/// names would make that anything but one directory right under
/// `logs_root`.
pub fn pod_log_dir(logs_root: &Path, pod: &Pod) -> std::io::Result<PathBuf> {
    let uid = pod_uid(pod);
    if let Some(why) = crate::paths::uid_error(uid) {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("pod UID {uid:?} cannot name a log directory: it {why}"),
        ));
    }
    crate::paths::join(
        logs_root,
        &format!("{}_{}_{}", pod_namespace(pod), pod_name(pod), uid),
    )
}

/// The directory of a pod's volumes under tinylet's root dir; fails for a
/// UID that cannot name one directory there (`paths::pod_dir`).
pub fn pod_dir(root_dir: &Path, uid: &str) -> std::io::Result<PathBuf> {
    crate::paths::pod_dir(root_dir, uid)
}

/// The CRI sandbox config for a pod.
pub fn sandbox_config(
    pod: &Pod,
    attempt: u32,
    logs_root: &Path,
    settings: &NodeSettings,
) -> api::PodSandboxConfig {
    let spec = pod.spec.as_ref();
    let host_network = spec.and_then(|s| s.host_network).unwrap_or(false);

    let mut meta = api::PodSandboxMetadata::new();
    meta.name = pod_name(pod).into();
    meta.namespace = pod_namespace(pod).into();
    meta.uid = pod_uid(pod).into();
    meta.attempt = attempt;

    let mut cfg = api::PodSandboxConfig::new();
    cfg.metadata = MessageField::some(meta);
    // A pod on the host network shares the node's UTS namespace: the
    // runtime refuses to set a hostname there, so it stays empty.
    if !host_network {
        let (hostname, domain) = hostname_and_domain(pod, &settings.cluster_domain);
        let fqdn = spec.and_then(|s| s.set_hostname_as_fqdn).unwrap_or(false);
        cfg.hostname = if fqdn && !domain.is_empty() {
            // The kernel holds at most 64 characters; upstream refuses a
            // longer FQDN, the runtime would too.
            format!("{hostname}.{domain}")
        } else {
            hostname
        };
    }
    // A pod whose names cannot make a log directory gets none here; SyncPod
    // refuses to create its sandbox (it checks the same directory first).
    cfg.log_directory = pod_log_dir(logs_root, pod)
        .map(|d| d.to_string_lossy().into_owned())
        .unwrap_or_default();
    cfg.dns_config = MessageField::some(pod_dns(pod, settings, &read_host_resolv_conf(settings)).0);
    for c in spec.map(|s| &s.containers[..]).unwrap_or(&[]) {
        for p in c.ports.iter().flatten() {
            let Some(host_port) = p.host_port.filter(|hp| *hp > 0) else {
                continue;
            };
            let mut m = api::PortMapping::new();
            m.container_port = p.container_port;
            m.host_port = host_port;
            m.host_ip = p.host_ip.clone().unwrap_or_default();
            m.protocol = EnumOrUnknown::new(match p.protocol.as_deref() {
                Some("UDP") => api::Protocol::UDP,
                Some("SCTP") => api::Protocol::SCTP,
                _ => api::Protocol::TCP,
            });
            cfg.port_mappings.push(m);
        }
    }
    cfg.labels = labels::sandbox_labels(pod);
    cfg.annotations = labels::sandbox_annotations(pod);

    let mut linux = api::LinuxPodSandboxConfig::new();
    linux.security_context = MessageField::some(sandbox_security_context(pod, settings));
    if settings.cgroups_per_qos {
        linux.cgroup_parent = qos::pod_cgroup_parent(pod, settings.cgroup_driver);
    }
    if let Some(sysctls) = spec
        .and_then(|s| s.security_context.as_ref())
        .and_then(|sc| sc.sysctls.as_ref())
    {
        linux.sysctls = sysctls
            .iter()
            .map(|s| (s.name.clone(), s.value.clone()))
            .collect();
    }
    cfg.linux = MessageField::some(linux);
    cfg
}

/// A container's CRI config. `volumes_dir` holds the pod's emptyDir volumes.
pub fn container_config(
    pod: &Pod,
    container: &Container,
    restart_count: u32,
    image_ref: &str,
    volumes_dir: &Path,
    inputs: &ContainerInputs,
) -> Result<api::ContainerConfig, String> {
    let mut meta = api::ContainerMetadata::new();
    meta.name = container.name.clone();
    meta.attempt = restart_count;

    let mut image = api::ImageSpec::new();
    image.image = image_ref.to_string();

    let mut cfg = api::ContainerConfig::new();
    cfg.metadata = MessageField::some(meta);
    cfg.image = MessageField::some(image);
    cfg.command = container.command.clone().unwrap_or_default();
    cfg.args = container.args.clone().unwrap_or_default();
    cfg.working_dir = container.working_dir.clone().unwrap_or_default();
    let env = make_env(pod, container, inputs)?;
    let lookup = |name: &str| env.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str());
    cfg.command = cfg.command.iter().map(|a| expand(a, lookup)).collect();
    cfg.args = cfg.args.iter().map(|a| expand(a, lookup)).collect();
    for (key, value) in env.iter() {
        let mut kv = api::KeyValue::new();
        kv.key = key.clone();
        kv.value = value.clone();
        cfg.envs.push(kv);
    }
    cfg.mounts = mounts(pod, container, volumes_dir)?;
    if let Some(log) = inputs.termination_log.as_ref() {
        let path = termination_message_path(container);
        if !path.is_empty() {
            let mut m = api::Mount::new();
            m.container_path = path.to_string();
            m.host_path = log.to_string_lossy().into_owned();
            cfg.mounts.push(m);
        }
    }
    if let Some(hosts) = inputs.etc_hosts.as_ref() {
        if !cfg.mounts.iter().any(|m| m.container_path == "/etc/hosts") {
            let mut m = api::Mount::new();
            m.container_path = "/etc/hosts".into();
            m.host_path = hosts.to_string_lossy().into_owned();
            cfg.mounts.push(m);
        }
    }
    cfg.labels = labels::container_labels(pod, container);
    cfg.annotations = labels::container_annotations(pod, container, restart_count);
    cfg.log_path = format!("{}/{}.log", container.name, restart_count);
    cfg.stdin = container.stdin.unwrap_or(false);
    cfg.stdin_once = container.stdin_once.unwrap_or(false);
    cfg.tty = container.tty.unwrap_or(false);

    let mut linux = api::LinuxContainerConfig::new();
    let mut res = resources(container)?;
    res.oom_score_adj = qos::oom_score_adj(pod, container, inputs.settings.memory_capacity);
    linux.resources = MessageField::some(res);
    verify_run_as_non_root(pod, container, inputs.image_user.as_ref())?;
    let sc = container_security_context(pod, container, inputs.settings);
    linux.security_context = MessageField::some(sc);
    cfg.linux = MessageField::some(linux);
    Ok(cfg)
}

/// The ConfigMaps and Secrets `container`'s env and envFrom name, each once.
pub(crate) fn env_object_refs(container: &Container) -> Vec<(EnvObjectKind, &str)> {
    let mut refs = Vec::new();
    for from in container.env_from.iter().flatten() {
        if let Some((kind, name, _)) = env_from_source(from) {
            refs.push((kind, name));
        }
    }
    for e in container.env.iter().flatten() {
        if let Some((kind, name, _, _)) = e.value_from.as_ref().and_then(key_ref) {
            refs.push((kind, name));
        }
    }
    refs.sort_unstable();
    refs.dedup();
    refs
}

/// An envFrom entry's object: kind, name and whether it is optional.
fn env_from_source(from: &EnvFromSource) -> Option<(EnvObjectKind, &str, bool)> {
    if let Some(r) = from.config_map_ref.as_ref() {
        Some((EnvObjectKind::ConfigMap, &r.name, r.optional == Some(true)))
    } else {
        let r = from.secret_ref.as_ref()?;
        Some((EnvObjectKind::Secret, &r.name, r.optional == Some(true)))
    }
}

/// A `configMapKeyRef` or `secretKeyRef`: kind, name, key, optional.
fn key_ref(from: &EnvVarSource) -> Option<(EnvObjectKind, &str, &str, bool)> {
    if let Some(r) = from.config_map_key_ref.as_ref() {
        Some((
            EnvObjectKind::ConfigMap,
            &r.name,
            &r.key,
            r.optional == Some(true),
        ))
    } else {
        let r = from.secret_key_ref.as_ref()?;
        Some((
            EnvObjectKind::Secret,
            &r.name,
            &r.key,
            r.optional == Some(true),
        ))
    }
}

/// Upstream `IsEnvVarName`: `[-._a-zA-Z][-._a-zA-Z0-9]*`, and not `.` or
/// starting with `..`.
pub(crate) fn is_env_var_name(name: &str) -> bool {
    let mut bytes = name.bytes();
    let first_ok = bytes
        .next()
        .is_some_and(|b| b.is_ascii_alphabetic() || matches!(b, b'-' | b'.' | b'_'));
    first_ok
        && bytes.all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_'))
        && name != "."
        && !name.starts_with("..")
}

/// The keys of an env source's object; `None` when it is missing and the
/// reference is optional. The errors are upstream's messages.
fn env_object<'a>(
    inputs: &'a ContainerInputs,
    namespace: &str,
    kind: EnvObjectKind,
    name: &str,
    optional: bool,
) -> Result<Option<&'a crate::volume::payload::Keys>, String> {
    let Some(objects) = inputs.env_objects.as_ref() else {
        let kind = match kind {
            EnvObjectKind::ConfigMap => "configMap",
            EnvObjectKind::Secret => "secret",
        };
        return Err(format!(
            "couldn't get {kind} {namespace}/{name}, no kubeClient defined"
        ));
    };
    match objects.get(&(kind, name.to_string())) {
        Some(Some(keys)) => Ok(Some(keys)),
        _ if optional => Ok(None),
        // The kubelet's object managers' NotFound.
        _ => Err(format!(
            "{} {name:?} not found",
            match kind {
                EnvObjectKind::ConfigMap => "configmap",
                EnvObjectKind::Secret => "secret",
            }
        )),
    }
}

/// The keys of `container`'s envFrom sources that are not valid variable
/// names once prefixed, and so are skipped: one upstream
/// InvalidEnvironmentVariableNames message per source that has any.
/// Missing sources are left to `make_env`.
pub(crate) fn invalid_env_from_keys(
    pod: &Pod,
    container: &Container,
    inputs: &ContainerInputs,
) -> Vec<String> {
    let ns = pod_namespace(pod);
    let mut messages = Vec::new();
    for from in container.env_from.iter().flatten() {
        let Some((kind, name, _)) = env_from_source(from) else {
            continue;
        };
        let Ok(Some(keys)) = env_object(inputs, ns, kind, name, true) else {
            continue;
        };
        let prefix = from.prefix.as_deref().unwrap_or("");
        let mut bad: Vec<String> = keys
            .keys()
            .map(|k| format!("{prefix}{k}"))
            .filter(|k| !is_env_var_name(k))
            .collect();
        if bad.is_empty() {
            continue;
        }
        bad.sort();
        let what = match kind {
            EnvObjectKind::ConfigMap => "configMap",
            EnvObjectKind::Secret => "secret",
        };
        messages.push(format!(
            "Keys [{}] from the EnvFrom {what} {ns}/{name} were skipped since they are considered invalid environment variable names.",
            bad.join(", ")
        ));
    }
    messages
}

/// The container's environment (upstream `makeEnvironmentVariables`):
/// first the keys of its envFrom sources (in their order, each source's
/// keys in key order, with its prefix; keys that are not valid names are
/// skipped), then each env variable in declaration order, a literal value
/// with its `$(VAR)` references expanded (from the variables so far, then
/// the service variables), or the value of its `valueFrom` source; then
/// the service variables no other variable named. A name set again keeps
/// its first place and takes the later value. A missing object or key
/// that is not optional fails with upstream's message; an optional one
/// leaves the variable out.
pub(crate) fn make_env(
    pod: &Pod,
    container: &Container,
    inputs: &ContainerInputs,
) -> Result<Vec<(String, String)>, String> {
    let at = |what: String| format!("container {:?}: {what}", container.name);
    let ns = pod_namespace(pod);
    let mut env: Vec<(String, String)> = Vec::new();
    let set = |env: &mut Vec<(String, String)>, name: String, value: String| match env
        .iter_mut()
        .find(|(k, _)| *k == name)
    {
        Some(slot) => slot.1 = value,
        None => env.push((name, value)),
    };
    for from in container.env_from.iter().flatten() {
        let Some((kind, name, optional)) = env_from_source(from) else {
            continue;
        };
        let Some(keys) = env_object(inputs, ns, kind, name, optional)? else {
            continue;
        };
        let prefix = from.prefix.as_deref().unwrap_or("");
        for (k, v) in keys {
            let k = format!("{prefix}{k}");
            if is_env_var_name(&k) {
                set(&mut env, k, String::from_utf8_lossy(v).into_owned());
            }
        }
    }
    for e in container.env.iter().flatten() {
        let value = match (e.value.as_deref(), e.value_from.as_ref()) {
            (Some(v), _) if !v.is_empty() => expand(v, |name| {
                env.iter()
                    .chain(inputs.service_env.iter())
                    .find(|(k, _)| k == name)
                    .map(|(_, v)| v.as_str())
            }),
            (_, Some(from)) => match key_ref(from) {
                Some((kind, name, key, optional)) => {
                    let Some(keys) = env_object(inputs, ns, kind, name, optional)? else {
                        continue;
                    };
                    match keys.get(key) {
                        Some(v) => String::from_utf8_lossy(v).into_owned(),
                        None if optional => continue,
                        None => {
                            let kind = match kind {
                                EnvObjectKind::ConfigMap => "ConfigMap",
                                EnvObjectKind::Secret => "Secret",
                            };
                            return Err(format!("couldn't find key {key} in {kind} {ns}/{name}"));
                        }
                    }
                }
                None => env_source_value(pod, container, e, inputs)
                    .map_err(|m| at(format!("env {:?}: valueFrom.{m}", e.name)))?,
            },
            _ => String::new(),
        };
        set(&mut env, e.name.clone(), value);
    }
    for (k, v) in &inputs.service_env {
        if !env.iter().any(|(name, _)| name == k) {
            env.push((k.clone(), v.clone()));
        }
    }
    Ok(env)
}

/// The value of an env var's `valueFrom`; errors start with the source's
/// field name (`fieldRef`, ...).
fn env_source_value(
    pod: &Pod,
    container: &Container,
    e: &EnvVar,
    inputs: &ContainerInputs,
) -> Result<String, String> {
    let Some(from) = e.value_from.as_ref() else {
        return Ok(String::new());
    };
    if let Some(f) = from.field_ref.as_ref() {
        let fail = |m: String| format!("fieldRef: {m}");
        if let Some(v) = f
            .api_version
            .as_deref()
            .filter(|v| !v.is_empty() && *v != "v1")
        {
            return Err(fail(format!("unsupported pod version: {v}")));
        }
        let joined = |ips: &[String]| ips.join(",");
        return match f.field_path.as_str() {
            // The runtime's view, as at container creation upstream.
            "status.podIP" => Ok(inputs.pod_ips.first().cloned().unwrap_or_default()),
            "status.podIPs" => Ok(joined(&inputs.pod_ips)),
            "status.hostIP" if !inputs.settings.host_ips.is_empty() => {
                Ok(inputs.settings.host_ips[0].clone())
            }
            "status.hostIPs" if !inputs.settings.host_ips.is_empty() => {
                Ok(joined(&inputs.settings.host_ips))
            }
            path => fieldpath::field_value(pod, path).map_err(|e| fail(e.to_string())),
        };
    }
    if let Some(r) = from.resource_field_ref.as_ref() {
        let fail = |m: String| format!("resourceFieldRef: {m}");
        let target = match r.container_name.as_deref().filter(|n| !n.is_empty()) {
            None => container,
            Some(name) => pod
                .spec
                .as_ref()
                .and_then(|s| {
                    s.containers
                        .iter()
                        .chain(s.init_containers.iter().flatten())
                        .find(|c| c.name == name)
                })
                .ok_or_else(|| fail(format!("container {name} not found")))?,
        };
        let divisor = r.divisor.as_ref().map(|q| q.0.as_str());
        return fieldpath::resource_value(target, &r.resource, divisor, &inputs.allocatable)
            .map_err(|e| fail(e.to_string()));
    }
    // ConfigMap and Secret keys are read by `make_env`.
    Err("no source given".into())
}

fn mounts(pod: &Pod, container: &Container, volumes_dir: &Path) -> Result<Vec<api::Mount>, String> {
    let volumes = pod
        .spec
        .as_ref()
        .and_then(|s| s.volumes.as_deref())
        .unwrap_or(&[]);
    let mut out = Vec::new();
    for vm in container.volume_mounts.iter().flatten() {
        let Some(v) = volumes.iter().find(|v| v.name == vm.name) else {
            return Err(format!(
                "container {:?}: volumeMounts {:?}: no volume of that name in spec.volumes",
                container.name, vm.name
            ));
        };
        let (host_path, read_only) = crate::volume::host_dir(volumes_dir, v)?;
        let mut m = api::Mount::new();
        m.container_path = vm.mount_path.clone();
        let sub = vm.sub_path.as_deref().filter(|s| !s.is_empty());
        let expr = vm.sub_path_expr.as_deref().filter(|s| !s.is_empty());
        m.host_path = match (sub, expr) {
            (Some(_), Some(_)) => {
                return Err(format!(
                "container {:?}: volumeMounts {:?}: subPathExpr and subPath are mutually exclusive",
                container.name, vm.name
            ))
            }
            // Left for `sub_paths` and the safe bind mount made at the
            // container's start: a step forgotten fails at the runtime
            // instead of mounting the whole volume.
            (Some(_), None) | (None, Some(_)) => String::new(),
            (None, None) => host_path.to_string_lossy().into_owned(),
        };
        // Volumes tinylet writes (secret, configMap, ...) are always read-only.
        m.readonly = read_only || vm.read_only.unwrap_or(false);
        out.push(m);
    }
    Ok(out)
}

/// Whether any of `container`'s volumeMounts has a subPath or subPathExpr
/// (no syscalls: pods without one pay nothing more).
pub(crate) fn has_sub_paths(container: &Container) -> bool {
    container.volume_mounts.iter().flatten().any(|vm| {
        vm.sub_path.as_deref().is_some_and(|s| !s.is_empty())
            || vm.sub_path_expr.as_deref().is_some_and(|s| !s.is_empty())
    })
}

/// The subPaths of `container`'s volumeMounts, `subPathExpr` expanded from
/// the container's environment `envs` (upstream: a reference to a variable
/// that is missing or empty is an error), each checked to be a relative
/// path without `..`. The index is the mount's place in volumeMounts, which
/// is also its place in the CRI config's mounts.
pub(crate) fn sub_paths(
    pod: &Pod,
    container: &Container,
    volumes_dir: &Path,
    envs: &[api::KeyValue],
) -> Result<Vec<crate::volume::subpath::SubPath>, String> {
    let volumes = pod
        .spec
        .as_ref()
        .and_then(|s| s.volumes.as_deref())
        .unwrap_or(&[]);
    let mut out = Vec::new();
    for (index, vm) in container.volume_mounts.iter().flatten().enumerate() {
        let at = |m: String| {
            format!(
                "container {:?}: volumeMounts {:?}: {m}",
                container.name, vm.name
            )
        };
        let sub = vm.sub_path.as_deref().filter(|s| !s.is_empty());
        let expr = vm.sub_path_expr.as_deref().filter(|s| !s.is_empty());
        let (field, path) = match (sub, expr) {
            (Some(_), Some(_)) => {
                return Err(at("subPathExpr and subPath are mutually exclusive".into()))
            }
            (Some(s), None) => ("subPath", s.to_string()),
            (None, Some(e)) => {
                let missing = std::cell::RefCell::new(Vec::new());
                let expanded = expand(e, |name| match envs.iter().find(|kv| kv.key == name) {
                    Some(kv) if !kv.value.is_empty() => Some(kv.value.as_str()),
                    _ => {
                        missing.borrow_mut().push(name.to_string());
                        Some("")
                    }
                });
                let mut missing = missing.into_inner();
                if !missing.is_empty() {
                    missing.sort();
                    missing.dedup();
                    return Err(at(format!(
                        "subPathExpr {e:?}: missing value for {}",
                        missing.join(", ")
                    )));
                }
                ("subPathExpr", expanded)
            }
            (None, None) => continue,
        };
        crate::volume::subpath::check_relative(&path)
            .map_err(|why| at(format!("{field} {path:?} {why}")))?;
        let Some(v) = volumes.iter().find(|v| v.name == vm.name) else {
            return Err(at("no volume of that name in spec.volumes".into()));
        };
        let (volume_root, _) = crate::volume::host_dir(volumes_dir, v)?;
        out.push(crate::volume::subpath::SubPath {
            volume_root,
            path,
            volume: v.name.clone(),
            index,
            writer_links: crate::volume::written_by_tinylet(v),
        });
    }
    Ok(out)
}

/// The fewest and most CPU shares a container gets (the kernel's bounds,
/// which upstream's milliCPUToShares clamps to).
const MIN_SHARES: i64 = 2;
const MAX_SHARES: i64 = 262_144;
/// The CFS period (µs) and the smallest quota upstream sets (1 ms).
const CPU_PERIOD: i64 = 100_000;
const MIN_QUOTA: i64 = 1000;
/// The largest CFS quota the kernel takes (µs, 2^44 - 1): a bigger CPU
/// limit is as good as none. Upstream's int64 product wraps for limits
/// this large; here it saturates and is cut to what the kernel accepts.
const MAX_QUOTA: i64 = (1 << 44) - 1;

/// CPU and memory limits as cgroup settings (the kubelet's conversion),
/// saturating and clamped, whatever the quantities.
fn resources(container: &Container) -> Result<api::LinuxContainerResources, String> {
    let mut r = api::LinuxContainerResources::new();
    let res = container.resources.as_ref();
    let get = |which: &str, key: &str| {
        let m = match which {
            "limits" => res.and_then(|r| r.limits.as_ref()),
            _ => res.and_then(|r| r.requests.as_ref()),
        };
        m.and_then(|m| m.get(key)).map(|q| q.0.clone())
    };
    let field =
        |which: &str, key: &str| format!("container {:?}: resources.{which}.{key}", container.name);

    let cpu_request = get("requests", "cpu")
        .or_else(|| get("limits", "cpu"))
        .map(|q| {
            parse_millis(&q)
                .ok_or_else(|| format!("{}: bad quantity {q:?}", field("requests", "cpu")))
        })
        .transpose()?;
    // Shares: 1024 per core, within the kernel's [2, 262144] as upstream's
    // milliCPUToShares clamps them.
    r.cpu_shares = cpu_request
        .map(|m| (m.saturating_mul(1024) / 1000).clamp(MIN_SHARES, MAX_SHARES))
        .unwrap_or(MIN_SHARES);
    if let Some(q) = get("limits", "cpu") {
        let m = parse_millis(&q)
            .ok_or_else(|| format!("{}: bad quantity {q:?}", field("limits", "cpu")))?;
        r.cpu_period = CPU_PERIOD;
        r.cpu_quota = (m.saturating_mul(CPU_PERIOD) / 1000).clamp(MIN_QUOTA, MAX_QUOTA);
    }
    if let Some(q) = get("limits", "memory") {
        r.memory_limit_in_bytes = parse_bytes(&q)
            .ok_or_else(|| format!("{}: bad quantity {q:?}", field("limits", "memory")))?;
    }
    Ok(r)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::dns::etc_hosts_content;
    use crate::runtime::qos::CgroupDriver;
    use crate::runtime::security::{must_verify_non_root, MASKED_PATHS, READONLY_PATHS};

    fn pod_from(v: serde_json::Value) -> Pod {
        serde_json::from_value(v).unwrap()
    }

    fn settings() -> NodeSettings {
        NodeSettings {
            host_ips: vec!["192.168.1.2".into()],
            ..Default::default()
        }
    }

    fn inputs(settings: &NodeSettings) -> ContainerInputs<'_> {
        ContainerInputs {
            settings,
            pod_ips: vec!["10.88.0.7".into(), "fd00::7".into()],
            allocatable: NodeAllocatable {
                cpu: Some("2".into()),
                memory: Some("1Gi".into()),
                ephemeral_storage: None,
            },
            image_user: None,
            etc_hosts: None,
            termination_log: None,
            service_env: Vec::new(),
            env_objects: None,
        }
    }

    fn env_pod(env: serde_json::Value) -> Pod {
        pod_from(serde_json::json!({
            "metadata": {"name": "web", "namespace": "shop", "uid": "u1",
                         "labels": {"app": "web"}},
            "spec": {"nodeName": "edge-1", "serviceAccountName": "robot", "containers": [
                {"name": "app", "image": "busybox", "env": env,
                 "command": ["sh", "-c", "echo $(A) $$(A) $(NOPE) $(B)"],
                 "args": ["$(C)", "$$$(D)"],
                 "resources": {"limits": {"memory": "64Mi"}, "requests": {"cpu": "250m"}}},
                {"name": "side", "image": "busybox",
                 "resources": {"limits": {"cpu": "500m"}}}
            ]}
        }))
    }

    fn build(pod: &Pod, inputs: &ContainerInputs) -> Result<api::ContainerConfig, String> {
        let c = &pod.spec.as_ref().unwrap().containers[0];
        container_config(pod, c, 0, "img", Path::new("/tmp/v"), inputs)
    }

    fn envs(cfg: &api::ContainerConfig) -> Vec<(String, String)> {
        cfg.envs
            .iter()
            .map(|kv| (kv.key.clone(), kv.value.clone()))
            .collect()
    }

    #[test]
    fn sub_path_expr_expands_from_the_container_env_and_bad_sub_paths_are_named() {
        let with_mounts = |mounts: serde_json::Value| {
            pod_from(serde_json::json!({
                "metadata": {"name": "web", "namespace": "shop", "uid": "u1"},
                "spec": {"volumes": [
                    {"name": "data", "emptyDir": {}},
                    {"name": "info", "downwardAPI": {"items": []}}
                ], "containers": [
                    {"name": "app", "image": "busybox", "volumeMounts": mounts,
                     "env": [{"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                             {"name": "EMPTY", "value": ""}]}
                ]}
            }))
        };
        let s = settings();
        let run = |pod: &Pod| {
            let c = &pod.spec.as_ref().unwrap().containers[0];
            let cfg = container_config(pod, c, 0, "img", Path::new("/tmp/v"), &inputs(&s))?;
            sub_paths(pod, c, Path::new("/tmp/v"), &cfg.envs).map(|subs| (cfg, subs))
        };
        let pod = with_mounts(serde_json::json!([
            {"name": "data", "mountPath": "/all"},
            {"name": "data", "mountPath": "/mine", "subPathExpr": "logs/$(POD_NAME)/$$x"},
            {"name": "info", "mountPath": "/etc/labels", "subPath": "labels"}
        ]));
        let (cfg, subs) = run(&pod).unwrap();
        assert_eq!(
            cfg.mounts[0].host_path,
            "/tmp/v/kubernetes.io~empty-dir/data"
        );
        assert_eq!(
            cfg.mounts[1].host_path, "",
            "filled in by the safe bind mount"
        );
        assert_eq!(
            subs.iter()
                .map(|s| (s.index, s.path.as_str(), s.writer_links))
                .collect::<Vec<_>>(),
            [(1, "logs/web/$x", false), (2, "labels", true)]
        );
        assert_eq!(
            subs[0].volume_root,
            Path::new("/tmp/v/kubernetes.io~empty-dir/data")
        );

        for (mount, want) in [
            (
                serde_json::json!({"name": "data", "mountPath": "/m", "subPathExpr": "$(NOPE)/$(EMPTY)"}),
                "container \"app\": volumeMounts \"data\": subPathExpr \"$(NOPE)/$(EMPTY)\": missing value for EMPTY, NOPE",
            ),
            (
                serde_json::json!({"name": "data", "mountPath": "/m", "subPath": "a", "subPathExpr": "b"}),
                "container \"app\": volumeMounts \"data\": subPathExpr and subPath are mutually exclusive",
            ),
            (
                serde_json::json!({"name": "data", "mountPath": "/m", "subPath": "a/../../b"}),
                "container \"app\": volumeMounts \"data\": subPath \"a/../../b\" must be a relative path without '..'",
            ),
            (
                serde_json::json!({"name": "data", "mountPath": "/m", "subPathExpr": "/$(POD_NAME)"}),
                "container \"app\": volumeMounts \"data\": subPathExpr \"/web\" must not be an absolute path",
            ),
        ] {
            assert_eq!(run(&with_mounts(serde_json::json!([mount]))).unwrap_err(), want);
        }
    }

    #[test]
    fn huge_cpu_and_memory_limits_are_clamped_not_overflowed() {
        let c = |requests: serde_json::Value, limits: serde_json::Value| -> Container {
            serde_json::from_value(serde_json::json!({
                "name": "app", "image": "busybox",
                "resources": {"requests": requests, "limits": limits}
            }))
            .unwrap()
        };
        // Multiplying these by 1024 or 100000 overflowed an i64.
        for huge in ["9223372036854775807", "1E", "99999999999999999999999999"] {
            let r = resources(&c(
                serde_json::json!({"cpu": huge}),
                serde_json::json!({"cpu": huge, "memory": huge}),
            ))
            .unwrap();
            assert_eq!(r.cpu_shares, MAX_SHARES, "{huge}");
            assert_eq!(r.cpu_period, 100_000, "{huge}");
            assert_eq!(r.cpu_quota, (1 << 44) - 1, "{huge}");
            assert!(
                r.memory_limit_in_bytes >= 1_000_000_000_000_000_000,
                "{huge}"
            );
        }
        // The usual conversions and their lower bounds.
        let r = resources(&c(
            serde_json::json!({"cpu": "1m"}),
            serde_json::json!({"cpu": "1m"}),
        ))
        .unwrap();
        assert_eq!((r.cpu_shares, r.cpu_quota), (2, 1000));
        let r = resources(&c(
            serde_json::json!({"cpu": "1500m"}),
            serde_json::json!({"cpu": "2"}),
        ))
        .unwrap();
        assert_eq!((r.cpu_shares, r.cpu_quota), (1536, 200_000));
        let r = resources(&c(serde_json::json!({"cpu": "300"}), serde_json::json!({}))).unwrap();
        assert_eq!(
            r.cpu_shares, 262_144,
            "256 cores and more: the kernel's maximum"
        );
    }

    #[test]
    fn env_values_expand_in_order_and_later_wins() {
        let pod = env_pod(serde_json::json!([
            {"name": "A", "value": "a"},
            {"name": "B", "value": "$(A)-x"},
            {"name": "C", "value": "$(D)/$(A)"},
            {"name": "D", "value": "d"},
            {"name": "A", "value": "second"},
            {"name": "E", "value": "$(A)$$(A)"},
            {"name": "F"},
            {"name": "G", "value": "$(F)|$(SELF)"}
        ]));
        let s = settings();
        let cfg = build(&pod, &inputs(&s)).unwrap();
        let owned = |v: &[(&str, &str)]| {
            v.iter()
                .map(|(a, b)| (a.to_string(), b.to_string()))
                .collect::<Vec<_>>()
        };
        assert_eq!(
            envs(&cfg),
            owned(&[
                ("A", "second"),
                ("B", "a-x"),
                ("C", "$(D)/a"),
                ("D", "d"),
                ("E", "second$(A)"),
                ("F", ""),
                ("G", "|$(SELF)"),
            ])
        );
        // Command and args see the final values.
        assert_eq!(
            cfg.command,
            vec!["sh", "-c", "echo second $(A) $(NOPE) a-x"]
        );
        assert_eq!(cfg.args, vec!["$(D)/a", "$d"]);
    }

    #[test]
    fn env_from_field_and_resource_refs() {
        let pod = env_pod(serde_json::json!([
            {"name": "NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {"name": "NS", "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}},
            {"name": "UID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}},
            {"name": "APP", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['app']"}}},
            {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
            {"name": "SA", "valueFrom": {"fieldRef": {"fieldPath": "spec.serviceAccountName"}}},
            {"name": "IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
            {"name": "IPS", "valueFrom": {"fieldRef": {"fieldPath": "status.podIPs"}}},
            {"name": "HOST", "valueFrom": {"fieldRef": {"fieldPath": "status.hostIP"}}},
            {"name": "HOSTS", "valueFrom": {"fieldRef": {"fieldPath": "status.hostIPs"}}},
            {"name": "MEM", "valueFrom": {"resourceFieldRef": {"resource": "limits.memory", "divisor": "1Mi"}}},
            {"name": "CPU", "valueFrom": {"resourceFieldRef": {"resource": "limits.cpu"}}},
            {"name": "REQ", "valueFrom": {"resourceFieldRef": {"resource": "requests.cpu", "divisor": "1m"}}},
            {"name": "SIDE", "valueFrom": {"resourceFieldRef": {"containerName": "side", "resource": "limits.cpu", "divisor": "1m"}}},
            {"name": "URL", "value": "http://$(IP):80/$(NAME)"}
        ]));
        let s = settings();
        let cfg = build(&pod, &inputs(&s)).unwrap();
        let env = envs(&cfg);
        let get = |k: &str| env.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
        assert_eq!(get("NAME"), Some("web"));
        assert_eq!(get("NS"), Some("shop"));
        assert_eq!(get("UID"), Some("u1"));
        assert_eq!(get("APP"), Some("web"));
        assert_eq!(get("NODE"), Some("edge-1"));
        assert_eq!(get("SA"), Some("robot"));
        assert_eq!(get("IP"), Some("10.88.0.7"));
        assert_eq!(get("IPS"), Some("10.88.0.7,fd00::7"));
        assert_eq!(get("HOST"), Some("192.168.1.2"));
        assert_eq!(get("HOSTS"), Some("192.168.1.2"));
        assert_eq!(get("MEM"), Some("64"));
        // No cpu limit: the node's allocatable 2 cores.
        assert_eq!(get("CPU"), Some("2"));
        assert_eq!(get("REQ"), Some("250"));
        assert_eq!(get("SIDE"), Some("500"));
        assert_eq!(get("URL"), Some("http://10.88.0.7:80/web"));
    }

    #[test]
    fn env_errors_name_the_field() {
        let s = settings();
        let err = |env: serde_json::Value| build(&env_pod(env), &inputs(&s)).unwrap_err();
        let e = err(serde_json::json!([
            {"name": "X", "valueFrom": {"fieldRef": {"fieldPath": "spec.restartPolicy"}}}
        ]));
        assert_eq!(
            e,
            "container \"app\": env \"X\": valueFrom.fieldRef: spec.restartPolicy: unsupported field path"
        );
        let e = err(serde_json::json!([
            {"name": "X", "valueFrom": {"fieldRef": {"apiVersion": "v2", "fieldPath": "metadata.name"}}}
        ]));
        assert!(e.contains("unsupported pod version: v2"), "{e}");
        let e = err(serde_json::json!([
            {"name": "X", "valueFrom": {"resourceFieldRef": {"containerName": "nope", "resource": "limits.cpu"}}}
        ]));
        assert!(
            e.contains("resourceFieldRef: container nope not found"),
            "{e}"
        );
        // Without an apiserver, upstream's message for a kubelet without a client.
        let e = err(serde_json::json!([
            {"name": "X", "valueFrom": {"configMapKeyRef": {"name": "cm", "key": "k"}}}
        ]));
        assert_eq!(e, "couldn't get configMap shop/cm, no kubeClient defined");
        let e = err(serde_json::json!([
            {"name": "X", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k", "optional": true}}}
        ]));
        assert_eq!(e, "couldn't get secret shop/s, no kubeClient defined");
        let pod = env_from_pod(
            serde_json::json!([{"secretRef": {"name": "s"}}]),
            serde_json::json!([]),
        );
        let e = build(&pod, &inputs(&s)).unwrap_err();
        assert_eq!(e, "couldn't get secret shop/s, no kubeClient defined");
    }

    fn env_from_pod(env_from: serde_json::Value, env: serde_json::Value) -> Pod {
        let mut pod = env_pod(env);
        pod.spec.as_mut().unwrap().containers[0].env_from =
            serde_json::from_value(env_from).unwrap();
        pod
    }

    /// An object's kind, name, and its keys (None: it does not exist).
    type TestObject<'a> = (EnvObjectKind, &'a str, Option<&'a [(&'a str, &'a str)]>);

    fn objects(list: &[TestObject]) -> EnvObjects {
        list.iter()
            .map(|(kind, name, keys)| {
                let keys = keys.map(|keys| {
                    keys.iter()
                        .map(|(k, v)| (k.to_string(), v.as_bytes().to_vec()))
                        .collect()
                });
                ((*kind, name.to_string()), keys)
            })
            .collect()
    }

    fn owned(v: &[(&str, &str)]) -> Vec<(String, String)> {
        v.iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect()
    }

    #[test]
    fn env_from_first_then_env_then_service_variables() {
        use EnvObjectKind::{ConfigMap, Secret};
        let pod = env_from_pod(
            serde_json::json!([
                {"configMapRef": {"name": "cm"}},
                {"prefix": "S_", "secretRef": {"name": "sec"}},
                {"configMapRef": {"name": "gone", "optional": true}},
                {"prefix": "1", "configMapRef": {"name": "cm"}}
            ]),
            serde_json::json!([
                {"name": "HOST", "value": "$(KUBERNETES_SERVICE_HOST):$(S_pass)"},
                {"name": "b", "value": "env-wins"},
                {"name": "ONE", "valueFrom": {"configMapKeyRef": {"name": "cm", "key": "a"}}},
                {"name": "PW", "valueFrom": {"secretKeyRef": {"name": "sec", "key": "pass"}}},
                {"name": "OPT", "valueFrom": {"secretKeyRef": {"name": "sec", "key": "nope", "optional": true}}},
                {"name": "OPT2", "valueFrom": {"configMapKeyRef": {"name": "gone", "key": "k", "optional": true}}},
                {"name": "KUBERNETES_SERVICE_PORT", "value": "override"}
            ]),
        );
        let s = settings();
        let mut i = inputs(&s);
        i.env_objects = Some(objects(&[
            (
                ConfigMap,
                "cm",
                Some(&[("b", "2"), ("a", "1"), ("bad key", "x"), ("1st", "y")]),
            ),
            (
                Secret,
                "sec",
                Some(&[("pass", "hunter2"), ("b", "from-secret")]),
            ),
            (ConfigMap, "gone", None),
        ]));
        i.service_env = owned(&[
            ("KUBERNETES_SERVICE_HOST", "10.96.0.1"),
            ("KUBERNETES_SERVICE_PORT", "443"),
            ("S_pass", "not-this"),
        ]);
        let cfg = build(&pod, &i).unwrap();
        assert_eq!(
            envs(&cfg),
            owned(&[
                // envFrom in order, each object's keys in key order,
                // invalid names skipped ("1st" and "bad key", "1a"...).
                ("a", "1"),
                ("b", "env-wins"),
                ("S_b", "from-secret"),
                ("S_pass", "hunter2"),
                ("HOST", "10.96.0.1:hunter2"),
                ("ONE", "1"),
                ("PW", "hunter2"),
                ("KUBERNETES_SERVICE_PORT", "override"),
                ("KUBERNETES_SERVICE_HOST", "10.96.0.1"),
            ])
        );
        let warnings = invalid_env_from_keys(&pod, &pod.spec.as_ref().unwrap().containers[0], &i);
        assert_eq!(
            warnings,
            [
                "Keys [1st, bad key] from the EnvFrom configMap shop/cm were skipped since they are considered invalid environment variable names.",
                "Keys [11st, 1a, 1b, 1bad key] from the EnvFrom configMap shop/cm were skipped since they are considered invalid environment variable names.",
            ]
        );
    }

    #[test]
    fn missing_objects_and_keys_fail_with_upstreams_messages() {
        use EnvObjectKind::{ConfigMap, Secret};
        let s = settings();
        let mut i = inputs(&s);
        i.env_objects = Some(objects(&[
            (ConfigMap, "cm", Some(&[("a", "1")])),
            (ConfigMap, "gone", None),
            (Secret, "sgone", None),
            (Secret, "sec", Some(&[])),
        ]));
        let err = |env_from: serde_json::Value, env: serde_json::Value| {
            build(&env_from_pod(env_from, env), &i).unwrap_err()
        };
        let none = serde_json::json!([]);
        assert_eq!(
            err(
                serde_json::json!([{"configMapRef": {"name": "gone"}}]),
                none.clone()
            ),
            "configmap \"gone\" not found"
        );
        assert_eq!(
            err(
                serde_json::json!([{"secretRef": {"name": "sgone", "optional": false}}]),
                none.clone()
            ),
            "secret \"sgone\" not found"
        );
        assert_eq!(
            err(
                none.clone(),
                serde_json::json!([
                    {"name": "X", "valueFrom": {"configMapKeyRef": {"name": "gone", "key": "a"}}}
                ])
            ),
            "configmap \"gone\" not found"
        );
        assert_eq!(
            err(
                none.clone(),
                serde_json::json!([
                    {"name": "X", "valueFrom": {"configMapKeyRef": {"name": "cm", "key": "k"}}}
                ])
            ),
            "couldn't find key k in ConfigMap shop/cm"
        );
        assert_eq!(
            err(
                none.clone(),
                serde_json::json!([
                    {"name": "X", "valueFrom": {"secretKeyRef": {"name": "sec", "key": "k"}}}
                ])
            ),
            "couldn't find key k in Secret shop/sec"
        );
        // Optional references to a missing object or key leave their
        // variables out.
        let pod = env_from_pod(
            serde_json::json!([{"secretRef": {"name": "sgone", "optional": true}}]),
            serde_json::json!([
                {"name": "X", "valueFrom": {"configMapKeyRef": {"name": "cm", "key": "k", "optional": true}}},
                {"name": "Y", "valueFrom": {"secretKeyRef": {"name": "sgone", "key": "k", "optional": true}}}
            ]),
        );
        assert_eq!(envs(&build(&pod, &i).unwrap()), owned(&[]));
    }

    #[test]
    fn env_var_names_as_upstream_validates_them() {
        for ok in [
            "A",
            "a_b",
            "my.env-name",
            "MY_ENV.NAME",
            "MyEnvName1",
            "-x",
            "_",
            ".a",
            "a..b",
        ] {
            assert!(is_env_var_name(ok), "{ok}");
        }
        for bad in ["", "1a", "a b", "a=b", ".", "..", "..a", "é", "a$"] {
            assert!(!is_env_var_name(bad), "{bad}");
        }
    }

    #[test]
    fn referenced_objects_are_listed_once() {
        use EnvObjectKind::{ConfigMap, Secret};
        let pod = env_from_pod(
            serde_json::json!([{"configMapRef": {"name": "cm"}}, {"secretRef": {"name": "s"}}, {}]),
            serde_json::json!([
                {"name": "X", "valueFrom": {"configMapKeyRef": {"name": "cm", "key": "a"}}},
                {"name": "Y", "valueFrom": {"secretKeyRef": {"name": "t", "key": "a"}}},
                {"name": "Z", "valueFrom": {"configMapKeyRef": {"name": "s", "key": "a"}}}
            ]),
        );
        assert_eq!(
            env_object_refs(&pod.spec.as_ref().unwrap().containers[0]),
            [
                (ConfigMap, "cm"),
                (ConfigMap, "s"),
                (Secret, "s"),
                (Secret, "t")
            ]
        );
    }

    fn sc_pod(pod_sc: serde_json::Value, c_sc: serde_json::Value) -> Pod {
        pod_from(serde_json::json!({
            "metadata": {"name": "web", "namespace": "shop", "uid": "u1",
                "annotations": {"container.apparmor.security.beta.kubernetes.io/app": "localhost/tight"}},
            "spec": {"securityContext": pod_sc, "containers": [
                {"name": "app", "image": "busybox", "securityContext": c_sc}
            ]}
        }))
    }

    fn security(pod: &Pod) -> api::LinuxContainerSecurityContext {
        let s = settings();
        let cfg = build(pod, &inputs(&s)).unwrap();
        cfg.linux.unwrap().security_context.unwrap()
    }

    #[test]
    fn security_context_container_wins_over_pod() {
        let pod = sc_pod(
            serde_json::json!({"runAsUser": 1000, "runAsGroup": 2000, "fsGroup": 3000,
                "supplementalGroups": [4000, 4001],
                "seccompProfile": {"type": "RuntimeDefault"},
                "seLinuxOptions": {"level": "s0:c1"}}),
            serde_json::json!({"runAsUser": 1001,
                "capabilities": {"add": ["NET_ADMIN"], "drop": ["ALL"]},
                "readOnlyRootFilesystem": true, "allowPrivilegeEscalation": false,
                "seccompProfile": {"type": "Localhost", "localhostProfile": "p/audit.json"}}),
        );
        let sc = security(&pod);
        assert_eq!(sc.run_as_user.value, 1001);
        assert_eq!(sc.run_as_group.value, 2000);
        assert_eq!(sc.supplemental_groups, vec![3000, 4000, 4001]);
        assert_eq!(sc.capabilities.add_capabilities, vec!["NET_ADMIN"]);
        assert_eq!(sc.capabilities.drop_capabilities, vec!["ALL"]);
        assert!(sc.readonly_rootfs);
        assert!(sc.no_new_privs);
        assert!(!sc.privileged);
        assert_eq!(sc.selinux_options.level, "s0:c1");
        assert_eq!(
            sc.seccomp.profile_type.enum_value(),
            Ok(api::security_profile::ProfileType::Localhost)
        );
        assert_eq!(
            sc.seccomp.localhost_ref,
            "/var/lib/tinylet/seccomp/p/audit.json"
        );
        assert_eq!(sc.apparmor.localhost_ref, "tight");
        assert_eq!(sc.apparmor_profile, "localhost/tight");
        assert_eq!(sc.masked_paths.len(), MASKED_PATHS.len());
        assert_eq!(sc.readonly_paths.len(), READONLY_PATHS.len());

        // Defaults: escalation allowed, unconfined seccomp, pod values.
        let pod = sc_pod(
            serde_json::json!({"runAsUser": 1000}),
            serde_json::json!({"privileged": true, "procMount": "Unmasked",
                "appArmorProfile": {"type": "RuntimeDefault"}}),
        );
        let sc = security(&pod);
        assert_eq!(sc.run_as_user.value, 1000);
        assert!(sc.run_as_group.is_none());
        assert!(sc.privileged);
        assert!(!sc.no_new_privs);
        assert_eq!(sc.seccomp_profile_path, "unconfined");
        assert_eq!(sc.apparmor_profile, "runtime/default");
        assert!(sc.masked_paths.is_empty() && sc.readonly_paths.is_empty());
    }

    #[test]
    fn seccomp_default_gives_runtime_default_to_pods_without_a_profile() {
        use api::security_profile::ProfileType;
        let mut s = settings();
        s.seccomp_default = true;
        let profile_of = |s: &NodeSettings, pod_sc: serde_json::Value, c_sc: serde_json::Value| {
            let pod = sc_pod(pod_sc, c_sc);
            let c = build(&pod, &inputs(s))
                .unwrap()
                .linux
                .unwrap()
                .security_context
                .unwrap();
            let sb = sandbox_config(&pod, 0, Path::new("/var/log/pods"), s)
                .linux
                .unwrap()
                .security_context
                .unwrap();
            (
                c.seccomp.profile_type.enum_value().unwrap(),
                c.seccomp_profile_path,
                sb.seccomp.profile_type.enum_value().unwrap(),
            )
        };
        // No profile anywhere: the runtime's default, sandbox included.
        assert_eq!(
            profile_of(&s, serde_json::json!({}), serde_json::json!({})),
            (
                ProfileType::RuntimeDefault,
                "runtime/default".into(),
                ProfileType::RuntimeDefault
            )
        );
        // One the pod author asked for wins, Unconfined included.
        assert_eq!(
            profile_of(
                &s,
                serde_json::json!({"seccompProfile": {"type": "Unconfined"}}),
                serde_json::json!({})
            ),
            (
                ProfileType::Unconfined,
                "unconfined".into(),
                ProfileType::Unconfined
            )
        );
        assert_eq!(
            profile_of(
                &s,
                serde_json::json!({}),
                serde_json::json!({"seccompProfile": {"type": "Unconfined"}})
            ),
            (
                ProfileType::Unconfined,
                "unconfined".into(),
                ProfileType::RuntimeDefault
            )
        );
        // Without the setting nothing changes: no profile is Unconfined.
        s.seccomp_default = false;
        assert_eq!(
            profile_of(&s, serde_json::json!({}), serde_json::json!({})),
            (
                ProfileType::Unconfined,
                "unconfined".into(),
                ProfileType::Unconfined
            )
        );
    }

    #[test]
    fn run_as_non_root_is_enforced_as_upstream() {
        let s = settings();
        let check =
            |pod_sc: serde_json::Value, c_sc: serde_json::Value, user: Option<ImageUser>| {
                let pod = sc_pod(pod_sc, c_sc);
                let mut i = inputs(&s);
                i.image_user = user;
                build(&pod, &i).err()
            };
        let root = ImageUser {
            uid: Some(0),
            username: String::new(),
        };
        let named = ImageUser {
            uid: None,
            username: "nginx".into(),
        };
        let user = ImageUser {
            uid: Some(101),
            username: String::new(),
        };
        let yes = serde_json::json!({"runAsNonRoot": true});
        assert_eq!(
            check(yes.clone(), serde_json::json!({}), Some(root.clone())).as_deref(),
            Some("container has runAsNonRoot and image will run as root (pod: \"web_shop(u1)\", container: app)")
        );
        assert_eq!(
            check(yes.clone(), serde_json::json!({}), Some(named)).as_deref(),
            Some("container has runAsNonRoot and image has non-numeric user (nginx), cannot verify user is non-root (pod: \"web_shop(u1)\", container: app)")
        );
        assert_eq!(check(yes.clone(), serde_json::json!({}), Some(user)), None);
        assert_eq!(
            check(yes.clone(), serde_json::json!({"runAsUser": 0}), None).as_deref(),
            Some("container's runAsUser breaks non-root policy (pod: \"web_shop(u1)\", container: app)")
        );
        assert_eq!(
            check(yes.clone(), serde_json::json!({"runAsUser": 5}), None),
            None
        );
        // The container's false wins over the pod's true.
        assert_eq!(
            check(
                yes.clone(),
                serde_json::json!({"runAsNonRoot": false}),
                Some(root.clone())
            ),
            None
        );
        assert_eq!(
            check(serde_json::json!({}), serde_json::json!({}), Some(root)),
            None
        );
        let pod = sc_pod(yes, serde_json::json!({}));
        let c = &pod.spec.as_ref().unwrap().containers[0];
        assert!(must_verify_non_root(&pod, c));
        let pod = sc_pod(
            serde_json::json!({"runAsNonRoot": true, "runAsUser": 7}),
            serde_json::json!({}),
        );
        assert!(!must_verify_non_root(
            &pod,
            &pod.spec.as_ref().unwrap().containers[0]
        ));
    }

    #[test]
    fn sandbox_security_from_the_pod() {
        let pod = sc_pod(
            serde_json::json!({"runAsUser": 1000, "runAsGroup": 2000, "fsGroup": 3000,
                "sysctls": [{"name": "net.ipv4.ip_unprivileged_port_start", "value": "0"}]}),
            serde_json::json!({"privileged": true}),
        );
        let cfg = sandbox_config(&pod, 0, Path::new("/tmp"), &settings());
        let linux = cfg.linux.unwrap();
        let sc = linux.security_context.unwrap();
        assert_eq!(sc.run_as_user.value, 1000);
        assert_eq!(sc.run_as_group.value, 2000);
        assert_eq!(sc.supplemental_groups, vec![3000]);
        assert!(sc.privileged);
        assert_eq!(
            linux
                .sysctls
                .get("net.ipv4.ip_unprivileged_port_start")
                .map(String::as_str),
            Some("0")
        );
    }

    #[test]
    fn working_dir_ports_stdio_and_log_path() {
        let pod = pod_from(serde_json::json!({
            "metadata": {"name": "web", "namespace": "shop", "uid": "u1"},
            "spec": {"containers": [
                {"name": "app", "image": "busybox", "workingDir": "/srv",
                 "stdin": true, "stdinOnce": true, "tty": true,
                 "ports": [{"containerPort": 80, "hostPort": 8080},
                           {"containerPort": 53, "hostPort": 5353, "protocol": "UDP", "hostIP": "127.0.0.1"},
                           {"containerPort": 9090}]},
                {"name": "side", "image": "busybox",
                 "ports": [{"containerPort": 81, "hostPort": 8081, "protocol": "SCTP"}]}
            ]}
        }));
        let s = settings();
        let c = &pod.spec.as_ref().unwrap().containers[0];
        let cfg = container_config(&pod, c, 3, "img", Path::new("/tmp/v"), &inputs(&s)).unwrap();
        assert_eq!(cfg.working_dir, "/srv");
        assert!(cfg.stdin && cfg.stdin_once && cfg.tty);
        // Relative to the sandbox's log directory.
        assert_eq!(cfg.log_path, "app/3.log");
        let sb = sandbox_config(&pod, 0, Path::new("/var/log/pods"), &s);
        assert_eq!(sb.log_directory, "/var/log/pods/shop_web_u1");
        let ports: Vec<(i32, i32, String, Option<api::Protocol>)> = sb
            .port_mappings
            .iter()
            .map(|m| {
                (
                    m.container_port,
                    m.host_port,
                    m.host_ip.clone(),
                    m.protocol.enum_value().ok(),
                )
            })
            .collect();
        assert_eq!(
            ports,
            vec![
                (80, 8080, String::new(), Some(api::Protocol::TCP)),
                (53, 5353, "127.0.0.1".into(), Some(api::Protocol::UDP)),
                (81, 8081, String::new(), Some(api::Protocol::SCTP)),
            ]
        );
    }

    fn dns_pod(spec: serde_json::Value) -> Pod {
        let mut spec = spec;
        spec["containers"] = serde_json::json!([{"name": "app"}]);
        pod_from(serde_json::json!({
            "metadata": {"name": "web", "namespace": "shop", "uid": "u1"},
            "spec": spec
        }))
    }

    const HOST_RESOLV: &str = "nameserver 192.168.1.1\nsearch lan\noptions edns0\n";

    fn dns(
        spec: serde_json::Value,
        s: &NodeSettings,
    ) -> (Vec<String>, Vec<String>, Vec<String>, Vec<&'static str>) {
        let (d, w) = pod_dns(&dns_pod(spec), s, HOST_RESOLV);
        (
            d.servers,
            d.searches,
            d.options,
            w.into_iter().map(|(r, _)| r).collect(),
        )
    }

    fn v(items: &[&str]) -> Vec<String> {
        items.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn dns_policies() {
        let cluster = NodeSettings {
            cluster_dns: v(&["10.96.0.10"]),
            cluster_domain: "cluster.local".into(),
            ..settings()
        };
        let search = v(&[
            "shop.svc.cluster.local",
            "svc.cluster.local",
            "cluster.local",
            "lan",
        ]);
        // ClusterFirst (also the default).
        for spec in [
            serde_json::json!({}),
            serde_json::json!({"dnsPolicy": "ClusterFirst"}),
        ] {
            assert_eq!(
                dns(spec, &cluster),
                (v(&["10.96.0.10"]), search.clone(), v(&["ndots:5"]), vec![])
            );
        }
        // ClusterFirst on the host network is Default; ClusterFirstWithHostNet is not.
        let host = (v(&["192.168.1.1"]), v(&["lan"]), v(&["edns0"]), vec![]);
        assert_eq!(
            dns(serde_json::json!({"hostNetwork": true}), &cluster),
            host.clone()
        );
        assert_eq!(
            dns(
                serde_json::json!({"hostNetwork": true, "dnsPolicy": "ClusterFirstWithHostNet"}),
                &cluster
            )
            .0,
            v(&["10.96.0.10"])
        );
        assert_eq!(
            dns(serde_json::json!({"dnsPolicy": "Default"}), &cluster),
            host
        );
        // No cluster DNS: Default, with a warning.
        let (servers, _, _, warnings) = dns(serde_json::json!({}), &settings());
        assert_eq!(servers, v(&["192.168.1.1"]));
        assert_eq!(warnings, vec!["MissingClusterDNS"]);
        // None: only dnsConfig.
        assert_eq!(
            dns(
                serde_json::json!({"dnsPolicy": "None", "dnsConfig": {
                    "nameservers": ["1.1.1.1"], "searches": ["x.y"],
                    "options": [{"name": "ndots", "value": "2"}, {"name": "edns0"}]}}),
                &cluster
            ),
            (
                v(&["1.1.1.1"]),
                v(&["x.y"]),
                v(&["ndots:2", "edns0"]),
                vec![]
            )
        );
        // No resolver configuration: the local host, search ".".
        let none = NodeSettings {
            resolv_conf: PathBuf::new(),
            ..settings()
        };
        assert_eq!(
            dns(serde_json::json!({"dnsPolicy": "Default"}), &none),
            (v(&["127.0.0.1"]), v(&["."]), vec![], vec![])
        );
    }

    #[test]
    fn dns_config_merges_and_limits() {
        let cluster = NodeSettings {
            cluster_dns: v(&["10.96.0.10"]),
            cluster_domain: "cluster.local".into(),
            ..settings()
        };
        let (servers, searches, options, warnings) = dns(
            serde_json::json!({"dnsConfig": {
                "nameservers": ["10.96.0.10", "1.1.1.1", "8.8.8.8", "9.9.9.9"],
                "searches": ["lan", "extra"],
                "options": [{"name": "ndots", "value": "1"}, {"name": "timeout", "value": "2"}]}}),
            &cluster,
        );
        assert_eq!(servers, v(&["10.96.0.10", "1.1.1.1", "8.8.8.8"]));
        assert_eq!(
            searches,
            v(&[
                "shop.svc.cluster.local",
                "svc.cluster.local",
                "cluster.local",
                "lan",
                "extra"
            ])
        );
        assert_eq!(options, v(&["ndots:1", "timeout:2"]));
        assert_eq!(warnings, vec!["DNSConfigForming"]);

        let many: Vec<String> = (0..40).map(|i| format!("d{i}.example")).collect();
        let (_, searches, _, warnings) = dns(
            serde_json::json!({"dnsPolicy": "None", "dnsConfig": {"searches": many}}),
            &cluster,
        );
        assert_eq!(searches.len(), 32);
        assert_eq!(warnings, vec!["DNSConfigForming"]);
        let long: Vec<String> = (0..12).map(|i| format!("{i}{}", "a".repeat(200))).collect();
        let (_, searches, _, _) = dns(
            serde_json::json!({"dnsPolicy": "None", "dnsConfig": {"searches": long}}),
            &cluster,
        );
        assert!(
            searches.join(" ").len() <= 2048 && searches.len() == 10,
            "{}",
            searches.len()
        );
        let (_, searches, _, _) = dns(
            serde_json::json!({"dnsPolicy": "None", "dnsConfig": {"searches": ["a".repeat(254), "ok"]}}),
            &cluster,
        );
        assert_eq!(searches, v(&["ok"]));
    }

    #[test]
    fn qos_cgroup_parent_and_oom_score() {
        let mut s = settings();
        let pod = env_pod(serde_json::json!([]));
        assert_eq!(
            sandbox_config(&pod, 0, Path::new("/l"), &s)
                .linux
                .cgroup_parent,
            ""
        );
        s.cgroups_per_qos = true;
        assert_eq!(
            sandbox_config(&pod, 0, Path::new("/l"), &s)
                .linux
                .cgroup_parent,
            "/kubepods/burstable/podu1"
        );
        s.cgroup_driver = CgroupDriver::Systemd;
        assert_eq!(
            sandbox_config(&pod, 0, Path::new("/l"), &s)
                .linux
                .cgroup_parent,
            "kubepods-burstable-podu1.slice"
        );
        s.memory_capacity = 256 << 20;
        // 64Mi limit (and so request) of 256Mi: 1000 - 250.
        let cfg = build(&pod, &inputs(&s)).unwrap();
        assert_eq!(cfg.linux.resources.oom_score_adj, 750);
    }

    #[test]
    fn managed_etc_hosts() {
        let s = NodeSettings {
            cluster_domain: "cluster.local".into(),
            ..settings()
        };
        let pod = dns_pod(serde_json::json!({"hostname": "db-0", "subdomain": "db",
            "hostAliases": [{"ip": "10.0.0.9", "hostnames": ["foo", "bar"]}]}));
        let text = etc_hosts_content(&pod, &s, &v(&["10.88.0.7"]), "ignored");
        assert!(
            text.starts_with("# Kubernetes-managed hosts file.\n127.0.0.1\tlocalhost\n"),
            "{text}"
        );
        assert!(
            text.ends_with(
                "fe00::2\tip6-allrouters\n10.88.0.7\tdb-0.db.shop.svc.cluster.local\tdb-0\n\
                 \n# Entries added by HostAliases.\n10.0.0.9\tfoo\tbar\n"
            ),
            "{text}"
        );
        let plain = etc_hosts_content(&dns_pod(serde_json::json!({})), &s, &v(&["10.88.0.7"]), "");
        assert!(
            plain.ends_with("ip6-allrouters\n10.88.0.7\tweb\n"),
            "{plain}"
        );
        let host = etc_hosts_content(
            &dns_pod(serde_json::json!({"hostNetwork": true})),
            &s,
            &v(&["192.168.1.2"]),
            "127.0.0.1 localhost\n",
        );
        assert_eq!(
            host,
            "# Kubernetes-managed hosts file (host network).\n127.0.0.1 localhost\n"
        );

        // Mounted unless the container brings its own.
        let mut i = inputs(&s);
        i.etc_hosts = Some(PathBuf::from("/r/pods/u1/etc-hosts"));
        let cfg = build(&pod, &i).unwrap();
        let m = cfg
            .mounts
            .iter()
            .find(|m| m.container_path == "/etc/hosts")
            .unwrap();
        assert_eq!(m.host_path, "/r/pods/u1/etc-hosts");
        assert!(!m.readonly);
    }

    #[test]
    fn termination_log_is_mounted_at_the_message_path() {
        let s = settings();
        let mut i = inputs(&s);
        i.termination_log = Some(PathBuf::from("/r/pods/u1/containers/app/x"));
        let mut pod = env_pod(serde_json::json!([]));
        let cfg = build(&pod, &i).unwrap();
        let m = cfg
            .mounts
            .iter()
            .find(|m| m.container_path == "/dev/termination-log")
            .unwrap();
        assert_eq!(m.host_path, "/r/pods/u1/containers/app/x");
        pod.spec.as_mut().unwrap().containers[0].termination_message_path = Some("/tmp/why".into());
        let cfg = build(&pod, &i).unwrap();
        assert!(cfg.mounts.iter().any(|m| m.container_path == "/tmp/why"));
        assert_eq!(
            cfg.annotations
                .get(labels::TERMINATION_MESSAGE_PATH)
                .map(String::as_str),
            Some("/tmp/why")
        );
    }

    #[test]
    fn hostname_subdomain_and_fqdn() {
        let s = NodeSettings {
            cluster_domain: "cluster.local".into(),
            ..settings()
        };
        let sb = |spec: serde_json::Value| sandbox_config(&dns_pod(spec), 0, Path::new("/l"), &s);
        assert_eq!(sb(serde_json::json!({})).hostname, "web");
        assert_eq!(
            sb(serde_json::json!({"hostname": "db-0", "subdomain": "db"})).hostname,
            "db-0"
        );
        assert_eq!(
            sb(serde_json::json!({"hostname": "db-0", "subdomain": "db", "setHostnameAsFQDN": true}))
                .hostname,
            "db-0.db.shop.svc.cluster.local"
        );
        assert_eq!(
            sb(serde_json::json!({"hostNetwork": true, "hostname": "x"})).hostname,
            ""
        );
        let (h, d) = hostname_and_domain(
            &dns_pod(
                serde_json::json!({"hostname": format!("{}-.x", "a".repeat(61)), "subdomain": "s"}),
            ),
            "c.l",
        );
        assert_eq!(h, "a".repeat(61));
        assert_eq!(d, "s.shop.svc.c.l");
    }
}
