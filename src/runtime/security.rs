//! The security context of a pod's CRI configs (upstream
//! `security_context.go` and `determineEffectiveSecurityContext`): the
//! sandbox's and each container's, the container's fields winning over the
//! pod's; namespaces (host, pod, or an ephemeral container's target);
//! seccomp, AppArmor and SELinux profiles; masked and read-only paths; and
//! the runAsNonRoot check against the image's user.

use k8s_openapi::api::core::v1::{
    AppArmorProfile, Capabilities, Container, Pod, SELinuxOptions, SeccompProfile,
};
use protobuf::{EnumOrUnknown, MessageField};

use super::NodeSettings;
use crate::cri::api;
use crate::pod::{pod_name, pod_namespace, pod_uid};

/// The user an image runs as, from the runtime's ImageStatus.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ImageUser {
    pub(crate) uid: Option<i64>,
    pub(crate) username: String,
}

fn namespace_options(pod: &Pod) -> api::NamespaceOption {
    let spec = pod.spec.as_ref();
    let flag = |f: Option<bool>| f.unwrap_or(false);
    let mut o = api::NamespaceOption::new();
    o.network = EnumOrUnknown::new(if flag(spec.and_then(|s| s.host_network)) {
        api::NamespaceMode::NODE
    } else {
        api::NamespaceMode::POD
    });
    o.pid = EnumOrUnknown::new(if flag(spec.and_then(|s| s.host_pid)) {
        api::NamespaceMode::NODE
    } else if flag(spec.and_then(|s| s.share_process_namespace)) {
        api::NamespaceMode::POD
    } else {
        api::NamespaceMode::CONTAINER
    });
    o.ipc = EnumOrUnknown::new(if flag(spec.and_then(|s| s.host_ipc)) {
        api::NamespaceMode::NODE
    } else {
        api::NamespaceMode::POD
    });
    o
}

/// Puts an ephemeral container into the process namespace of its target
/// container `target` (CRI `NamespaceMode::TARGET`), which must be running.
pub(crate) fn target_pid_namespace(
    cfg: &mut api::ContainerConfig,
    target: &str,
    status: &super::PodStatus,
) -> Result<(), String> {
    let running = status
        .latest(target)
        .filter(|t| t.state == super::ContainerState::Running)
        .ok_or_else(|| format!("target container {target:?} is not running"))?;
    let ns = cfg
        .linux
        .mut_or_insert_default()
        .security_context
        .mut_or_insert_default()
        .namespace_options
        .mut_or_insert_default();
    ns.pid = EnumOrUnknown::new(api::NamespaceMode::TARGET);
    ns.target_id = running.id.clone();
    Ok(())
}

/// The CRI security context of a pod's sandbox: the pod's namespaces,
/// privileged when any of its containers is, and the pod's user, group,
/// SELinux options, supplemental groups and seccomp profile.
pub(super) fn sandbox_security_context(
    pod: &Pod,
    settings: &NodeSettings,
) -> api::LinuxSandboxSecurityContext {
    let spec = pod.spec.as_ref();
    let mut sc = api::LinuxSandboxSecurityContext::new();
    sc.namespace_options = MessageField::some(namespace_options(pod));
    sc.privileged = spec
        .map(|s| {
            s.containers
                .iter()
                .chain(s.init_containers.iter().flatten())
                .any(|c| {
                    c.security_context
                        .as_ref()
                        .and_then(|sc| sc.privileged)
                        .unwrap_or(false)
                })
        })
        .unwrap_or(false);
    if let Some(p) = spec.and_then(|s| s.security_context.as_ref()) {
        if let Some(uid) = p.run_as_user {
            sc.run_as_user = int64(uid);
        }
        if let Some(gid) = p.run_as_group {
            sc.run_as_group = int64(gid);
        }
        if let Some(o) = p.se_linux_options.as_ref() {
            sc.selinux_options = selinux(o);
        }
    }
    sc.supplemental_groups = supplemental_groups(pod);
    let (profile, path) = seccomp(
        spec.and_then(|s| s.security_context.as_ref())
            .and_then(|p| p.seccomp_profile.as_ref()),
        settings,
    );
    sc.seccomp = MessageField::some(profile);
    sc.seccomp_profile_path = path;
    sc
}

/// A container's security settings with the pod's as defaults (upstream
/// `DetermineEffectiveSecurityContext`): the container's field wins.
#[derive(Debug, Clone, Default)]
struct EffectiveSecurity {
    run_as_user: Option<i64>,
    run_as_group: Option<i64>,
    run_as_non_root: Option<bool>,
    se_linux: Option<SELinuxOptions>,
    seccomp: Option<SeccompProfile>,
    apparmor: Option<AppArmorProfile>,
    capabilities: Option<Capabilities>,
    privileged: Option<bool>,
    read_only_root_filesystem: Option<bool>,
    allow_privilege_escalation: Option<bool>,
    proc_mount: Option<String>,
}

fn effective_security(pod: &Pod, container: &Container) -> EffectiveSecurity {
    let mut e = EffectiveSecurity::default();
    if let Some(p) = pod.spec.as_ref().and_then(|s| s.security_context.as_ref()) {
        e.run_as_user = p.run_as_user;
        e.run_as_group = p.run_as_group;
        e.run_as_non_root = p.run_as_non_root;
        e.se_linux = p.se_linux_options.clone();
        e.seccomp = p.seccomp_profile.clone();
        e.apparmor = p.app_armor_profile.clone();
    }
    if let Some(c) = container.security_context.as_ref() {
        let or = |c: Option<i64>, p: Option<i64>| c.or(p);
        e.run_as_user = or(c.run_as_user, e.run_as_user);
        e.run_as_group = or(c.run_as_group, e.run_as_group);
        e.run_as_non_root = c.run_as_non_root.or(e.run_as_non_root);
        e.se_linux = c.se_linux_options.clone().or(e.se_linux);
        e.seccomp = c.seccomp_profile.clone().or(e.seccomp);
        e.apparmor = c.app_armor_profile.clone().or(e.apparmor);
        e.capabilities = c.capabilities.clone();
        e.privileged = c.privileged;
        e.read_only_root_filesystem = c.read_only_root_filesystem;
        e.allow_privilege_escalation = c.allow_privilege_escalation;
        e.proc_mount = c.proc_mount.clone();
    }
    e
}

/// Whether the container must not run as root, so that the image's user
/// has to be checked (runAsNonRoot without a runAsUser).
pub(crate) fn must_verify_non_root(pod: &Pod, container: &Container) -> bool {
    let e = effective_security(pod, container);
    e.run_as_non_root == Some(true) && e.run_as_user.is_none()
}

/// Refuses a container that would run as root against `runAsNonRoot`
/// (upstream `verifyRunAsNonRoot`, with its messages); `image_user` is
/// needed only when [`must_verify_non_root`] says so.
pub(crate) fn verify_run_as_non_root(
    pod: &Pod,
    container: &Container,
    image_user: Option<&ImageUser>,
) -> Result<(), String> {
    let e = effective_security(pod, container);
    if e.run_as_non_root != Some(true) {
        return Ok(());
    }
    let who = format!(
        "pod: {:?}, container: {}",
        format!("{}_{}({})", pod_name(pod), pod_namespace(pod), pod_uid(pod)),
        container.name
    );
    if let Some(uid) = e.run_as_user {
        if uid == 0 {
            return Err(format!(
                "container's runAsUser breaks non-root policy ({who})"
            ));
        }
        return Ok(());
    }
    match image_user {
        Some(ImageUser { uid: Some(0), .. }) => Err(format!(
            "container has runAsNonRoot and image will run as root ({who})"
        )),
        Some(ImageUser { uid: None, username }) if !username.is_empty() => Err(format!(
            "container has runAsNonRoot and image has non-numeric user ({username}), cannot verify user is non-root ({who})"
        )),
        Some(_) => Ok(()),
        None => Err(format!(
            "container has runAsNonRoot and the image's user is not known ({who})"
        )),
    }
}

/// Paths the runtime hides from a container unless procMount is Unmasked.
pub(super) const MASKED_PATHS: &[&str] = &[
    "/proc/asound",
    "/proc/acpi",
    "/proc/kcore",
    "/proc/keys",
    "/proc/latency_stats",
    "/proc/timer_list",
    "/proc/timer_stats",
    "/proc/sched_debug",
    "/proc/scsi",
    "/sys/firmware",
    "/sys/devices/virtual/powercap",
];
/// Paths the runtime makes read-only unless procMount is Unmasked.
pub(super) const READONLY_PATHS: &[&str] = &[
    "/proc/bus",
    "/proc/fs",
    "/proc/irq",
    "/proc/sys",
    "/proc/sysrq-trigger",
];

fn int64(v: i64) -> MessageField<api::Int64Value> {
    let mut i = api::Int64Value::new();
    i.value = v;
    MessageField::some(i)
}

fn selinux(o: &SELinuxOptions) -> MessageField<api::SELinuxOption> {
    let mut s = api::SELinuxOption::new();
    s.user = o.user.clone().unwrap_or_default();
    s.role = o.role.clone().unwrap_or_default();
    s.type_ = o.type_.clone().unwrap_or_default();
    s.level = o.level.clone().unwrap_or_default();
    MessageField::some(s)
}

fn security_profile(
    kind: api::security_profile::ProfileType,
    localhost: &str,
) -> api::SecurityProfile {
    let mut p = api::SecurityProfile::new();
    p.profile_type = EnumOrUnknown::new(kind);
    p.localhost_ref = localhost.to_string();
    p
}

/// A seccomp profile for the CRI: the structured field and the older path
/// form. No profile is Unconfined, or RuntimeDefault under
/// `--seccomp-default` (`seccompDefault`), as upstream.
fn seccomp(
    profile: Option<&SeccompProfile>,
    settings: &NodeSettings,
) -> (api::SecurityProfile, String) {
    use api::security_profile::ProfileType;
    let root = &settings.seccomp_profile_root;
    let kind = match profile {
        Some(p) => Some((p.type_.as_str(), p.localhost_profile.as_deref())),
        None if settings.seccomp_default => Some(("RuntimeDefault", None)),
        None => None,
    };
    match kind {
        Some(("RuntimeDefault", _)) => (
            security_profile(ProfileType::RuntimeDefault, ""),
            "runtime/default".into(),
        ),
        Some(("Localhost", Some(file))) => {
            let path = root.join(file).to_string_lossy().into_owned();
            (
                security_profile(ProfileType::Localhost, &path),
                format!("localhost/{path}"),
            )
        }
        _ => (
            security_profile(ProfileType::Unconfined, ""),
            "unconfined".into(),
        ),
    }
}

/// The AppArmor profile: the security context's field, else the older
/// per-container annotation. None: the runtime's default.
fn apparmor(
    pod: &Pod,
    container: &Container,
    field: Option<&AppArmorProfile>,
) -> Option<(api::SecurityProfile, String)> {
    use api::security_profile::ProfileType;
    let annotation = || {
        pod.metadata
            .annotations
            .as_ref()?
            .get(&format!(
                "container.apparmor.security.beta.kubernetes.io/{}",
                container.name
            ))
            .cloned()
    };
    let (kind, name) = match field {
        Some(p) => (
            p.type_.clone(),
            p.localhost_profile.clone().unwrap_or_default(),
        ),
        None => {
            let v = annotation()?;
            match v.as_str() {
                "runtime/default" => ("RuntimeDefault".into(), String::new()),
                "unconfined" => ("Unconfined".into(), String::new()),
                other => (
                    "Localhost".into(),
                    other.strip_prefix("localhost/")?.to_string(),
                ),
            }
        }
    };
    Some(match kind.as_str() {
        "RuntimeDefault" => (
            security_profile(ProfileType::RuntimeDefault, ""),
            "runtime/default".into(),
        ),
        "Localhost" => (
            security_profile(ProfileType::Localhost, &name),
            format!("localhost/{name}"),
        ),
        _ => (
            security_profile(ProfileType::Unconfined, ""),
            "unconfined".into(),
        ),
    })
}

/// The pod's supplemental groups: fsGroup first, then supplementalGroups.
fn supplemental_groups(pod: &Pod) -> Vec<i64> {
    let Some(p) = pod.spec.as_ref().and_then(|s| s.security_context.as_ref()) else {
        return Vec::new();
    };
    p.fs_group
        .into_iter()
        .chain(p.supplemental_groups.iter().flatten().copied())
        .collect()
}

/// The CRI security context of a container (upstream
/// `determineEffectiveSecurityContext`).
pub(super) fn container_security_context(
    pod: &Pod,
    container: &Container,
    settings: &NodeSettings,
) -> api::LinuxContainerSecurityContext {
    let e = effective_security(pod, container);
    let mut sc = api::LinuxContainerSecurityContext::new();
    sc.namespace_options = MessageField::some(namespace_options(pod));
    if let Some(caps) = e.capabilities.as_ref() {
        let mut c = api::Capability::new();
        c.add_capabilities = caps.add.clone().unwrap_or_default();
        c.drop_capabilities = caps.drop.clone().unwrap_or_default();
        sc.capabilities = MessageField::some(c);
    }
    if let Some(o) = e.se_linux.as_ref() {
        sc.selinux_options = selinux(o);
    }
    if let Some(uid) = e.run_as_user {
        sc.run_as_user = int64(uid);
    }
    if let Some(gid) = e.run_as_group {
        sc.run_as_group = int64(gid);
    }
    sc.privileged = e.privileged.unwrap_or(false);
    sc.readonly_rootfs = e.read_only_root_filesystem.unwrap_or(false);
    let (profile, path) = seccomp(e.seccomp.as_ref(), settings);
    sc.seccomp = MessageField::some(profile);
    sc.seccomp_profile_path = path;
    if let Some((profile, name)) = apparmor(pod, container, e.apparmor.as_ref()) {
        sc.apparmor = MessageField::some(profile);
        sc.apparmor_profile = name;
    }
    sc.supplemental_groups = supplemental_groups(pod);
    // no_new_privs only when escalation is explicitly refused.
    sc.no_new_privs = e.allow_privilege_escalation == Some(false);
    if e.proc_mount.as_deref() != Some("Unmasked") {
        sc.masked_paths = MASKED_PATHS.iter().map(|p| p.to_string()).collect();
        sc.readonly_paths = READONLY_PATHS.iter().map(|p| p.to_string()).collect();
    }
    sc
}
