//! `compute_pod_actions`: what SyncPod must do to bring a pod's runtime state
//! to its spec (upstream `computePodActions` and
//! `computeInitContainerActions`, with restartable init containers). A pure
//! function of the spec, the observed status and the startup probe results,
//! so it is tested without a runtime.
//!
//! Init containers run in spec order. A regular init container must exit 0
//! before the next one starts; one that fails is started again unless the
//! pod's restartPolicy is Never, which fails the pod. A restartable init
//! container (a sidecar: `restartPolicy: Always` on the init container) lets
//! the next one start as soon as it runs (and its startup probe, if it has
//! one, succeeded), keeps running next to the regular containers, and is
//! started again whenever it exits. The regular containers start once the
//! last init container is done.
//!
//! Ephemeral containers (`kubectl debug`) start once in the pod's running
//! sandbox, even before initialization is done, and are never started
//! again: one with any instance in the runtime is left alone. They do not
//! keep a finished pod's sandbox running, and the pod's spec hash and
//! sandbox hash leave them out, so adding one restarts nothing.

use k8s_openapi::api::core::v1::{Container, EphemeralContainer, Pod};

use super::labels::container_hash;
use super::{ContainerState, ContainerStatus, PodStatus};
use crate::cri::api;

/// A running container of a pod whose liveness or startup probe failed,
/// to be killed (upstream `computePodActions`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ProbeKill {
    /// Index into `spec.containers`; `None` for a sidecar (an init
    /// container, started again by the next sync).
    pub(crate) index: Option<usize>,
    pub(crate) id: String,
    pub(crate) name: String,
    /// The Killing event's message, upstream's words.
    pub(crate) message: String,
    /// Start it again (restartPolicy is not Never).
    pub(crate) restart: bool,
    /// The probe's own grace period, if it sets one.
    pub(crate) grace: Option<i64>,
}

/// Where SyncPod learns which containers failed probes condemn: the
/// prober's standing results.
pub(crate) trait ProbeKills: Send + Sync {
    fn probe_kills(&self, pod: &Pod, status: &PodStatus) -> Vec<ProbeKill>;
}

/// The changes one SyncPod makes.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct PodActions {
    /// Stop every container and sandbox of the pod first.
    pub(crate) kill_pod: bool,
    /// Create a new sandbox (after killing the old one, if any).
    pub(crate) create_sandbox: bool,
    /// The sandbox to use when not creating one.
    pub(crate) sandbox_id: String,
    /// Attempt number for a new sandbox.
    pub(crate) attempt: u32,
    /// Indexes into `spec.initContainers` to start, in spec order.
    pub(crate) init_containers_to_start: Vec<usize>,
    /// Indexes into `spec.containers` of containers to start, in order.
    pub(crate) containers_to_start: Vec<usize>,
    /// Indexes into `spec.ephemeralContainers` to start, in order.
    pub(crate) ephemeral_containers_to_start: Vec<usize>,
    /// Containers to stop: (id, name, message of the Killing event).
    pub(crate) containers_to_kill: Vec<(String, String, String)>,
}

/// A startup probe's verdict on one container, as far as SyncPod needs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StartupResult {
    /// Not probed yet, or not decided.
    Unknown,
    Success,
    Failure,
}

/// Where SyncPod reads startup probe results by container ID (upstream
/// `startupManager`). A restartable init container with a startup probe
/// lets the next init container start only once this says `Success`, and
/// is restarted on `Failure`. The prober implements it and asks for a
/// resync of the pod when a result changes.
pub(crate) trait StartupResults: Send + Sync {
    fn startup(&self, container_id: &str) -> StartupResult;
}

/// No prober: a startup probe counts as passed, as pod status assumes.
pub(crate) struct NoProber;

impl StartupResults for NoProber {
    fn startup(&self, _container_id: &str) -> StartupResult {
        StartupResult::Success
    }
}

pub(crate) fn restart_policy(pod: &Pod) -> &str {
    pod.spec
        .as_ref()
        .and_then(|s| s.restart_policy.as_deref())
        .unwrap_or("Always")
}

/// An init container with `restartPolicy: Always`: a sidecar.
pub(crate) fn is_restartable_init(c: &Container) -> bool {
    c.restart_policy.as_deref() == Some("Always")
}

fn host_network(pod: &Pod) -> bool {
    pod.spec
        .as_ref()
        .and_then(|s| s.host_network)
        .unwrap_or(false)
}

fn containers(pod: &Pod) -> &[Container] {
    pod.spec.as_ref().map(|s| &s.containers[..]).unwrap_or(&[])
}

fn ephemeral_containers(pod: &Pod) -> &[EphemeralContainer] {
    pod.spec
        .as_ref()
        .and_then(|s| s.ephemeral_containers.as_deref())
        .unwrap_or(&[])
}

/// An ephemeral container as the container it runs as (upstream converts
/// its `EphemeralContainerCommon`, which has the same fields). What the API
/// forbids there (ports, probes, lifecycle, resources) is dropped.
pub(crate) fn ephemeral_container(e: &EphemeralContainer) -> Container {
    Container {
        name: e.name.clone(),
        image: e.image.clone(),
        image_pull_policy: e.image_pull_policy.clone(),
        command: e.command.clone(),
        args: e.args.clone(),
        working_dir: e.working_dir.clone(),
        env: e.env.clone(),
        env_from: e.env_from.clone(),
        volume_mounts: e.volume_mounts.clone(),
        volume_devices: e.volume_devices.clone(),
        security_context: e.security_context.clone(),
        stdin: e.stdin,
        stdin_once: e.stdin_once,
        tty: e.tty,
        termination_message_path: e.termination_message_path.clone(),
        termination_message_policy: e.termination_message_policy.clone(),
        ..Default::default()
    }
}

/// The pod's ephemeral containers, as containers.
pub(crate) fn ephemeral_as_containers(pod: &Pod) -> Vec<Container> {
    ephemeral_containers(pod)
        .iter()
        .map(ephemeral_container)
        .collect()
}

/// The container an ephemeral container `name` targets (it joins that
/// container's process namespace), if it names one.
pub(crate) fn ephemeral_target<'a>(pod: &'a Pod, name: &str) -> Option<&'a str> {
    ephemeral_containers(pod)
        .iter()
        .find(|e| e.name == name)?
        .target_container_name
        .as_deref()
        .filter(|t| !t.is_empty())
}

fn init_containers(pod: &Pod) -> &[Container] {
    pod.spec
        .as_ref()
        .and_then(|s| s.init_containers.as_deref())
        .unwrap_or(&[])
}

/// Whether a regular container whose newest instance is `status` should be
/// started (upstream `ShouldContainerBeRestarted`).
pub(crate) fn should_restart(pod: &Pod, status: Option<&ContainerStatus>) -> bool {
    if pod.metadata.deletion_timestamp.is_some() {
        return false;
    }
    let Some(s) = status else { return true };
    match s.state {
        ContainerState::Running => false,
        ContainerState::Created | ContainerState::Unknown => true,
        ContainerState::Exited => match restart_policy(pod) {
            "Never" => false,
            "OnFailure" => s.exit_code != 0,
            _ => true,
        },
    }
}

/// A regular init container that did not succeed (upstream `isInitContainerFailed`).
fn init_failed(s: &ContainerStatus) -> bool {
    s.reason.contains("OOMKilled")
        || (s.state == ContainerState::Exited && s.exit_code != 0)
        || s.state == ContainerState::Unknown
}

/// A hash of what the sandbox is made from: namespaces, hostname, DNS and
/// host ports. A ready sandbox whose recorded hash differs is recreated.
pub(crate) fn sandbox_hash(pod: &Pod) -> String {
    let spec = pod.spec.as_ref();
    let ports: Vec<_> = containers(pod)
        .iter()
        .flat_map(|c| c.ports.iter().flatten())
        .filter(|p| p.host_port.is_some_and(|h| h > 0))
        .map(|p| (p.container_port, p.host_port, &p.host_ip, &p.protocol))
        .collect();
    let key = serde_json::json!({
        "hostNetwork": spec.and_then(|s| s.host_network),
        "hostPID": spec.and_then(|s| s.host_pid),
        "hostIPC": spec.and_then(|s| s.host_ipc),
        "shareProcessNamespace": spec.and_then(|s| s.share_process_namespace),
        "hostname": spec.and_then(|s| s.hostname.as_ref()),
        "subdomain": spec.and_then(|s| s.subdomain.as_ref()),
        "dnsPolicy": spec.and_then(|s| s.dns_policy.as_ref()),
        "dnsConfig": spec.and_then(|s| s.dns_config.as_ref()),
        "runtimeClassName": spec.and_then(|s| s.runtime_class_name.as_ref()),
        "ports": ports,
    });
    use md5::{Digest, Md5};
    let digest = Md5::digest(key.to_string().as_bytes());
    digest[..8].iter().map(|b| format!("{b:02x}")).collect()
}

/// Why the sandbox must be (re)created, if it must: (create, attempt, id).
fn sandbox_changed(pod: &Pod, status: &PodStatus) -> (bool, u32, String) {
    let Some(latest) = status.sandbox_statuses.first() else {
        return (true, 0, String::new());
    };
    let attempt = latest.metadata.as_ref().map(|m| m.attempt).unwrap_or(0);
    let ready = status
        .sandbox_statuses
        .iter()
        .filter(|s| s.state.enum_value() == Ok(api::PodSandboxState::SANDBOX_READY))
        .count();
    if ready > 1 || latest.state.enum_value() != Ok(api::PodSandboxState::SANDBOX_READY) {
        return (true, attempt + 1, latest.id.clone());
    }
    let sandbox_host_network = latest
        .linux
        .as_ref()
        .and_then(|l| l.namespaces.as_ref())
        .and_then(|n| n.options.as_ref())
        .map(|o| o.network.enum_value() == Ok(api::NamespaceMode::NODE))
        .unwrap_or(false);
    if sandbox_host_network != host_network(pod) {
        return (true, attempt + 1, latest.id.clone());
    }
    if !host_network(pod) && latest.network.as_ref().is_none_or(|n| n.ip.is_empty()) {
        return (true, attempt + 1, latest.id.clone());
    }
    // A sandbox made before the hash was recorded is adopted as it is.
    if latest
        .annotations
        .get(super::labels::SANDBOX_HASH)
        .is_some_and(|h| *h != sandbox_hash(pod))
    {
        return (true, attempt + 1, latest.id.clone());
    }
    (false, attempt, latest.id.clone())
}

/// Computes the actions SyncPod takes for `pod` given what runs now.
pub(crate) fn compute_pod_actions(
    pod: &Pod,
    status: &PodStatus,
    probes: &dyn StartupResults,
) -> PodActions {
    let (create_sandbox, attempt, sandbox_id) = sandbox_changed(pod, status);
    let mut actions = PodActions {
        kill_pod: create_sandbox,
        create_sandbox,
        attempt,
        sandbox_id,
        ..Default::default()
    };
    let policy = restart_policy(pod);

    if create_sandbox {
        // A pod that must never restart and already ran once does not get a
        // second sandbox: it is finished.
        if policy == "Never" && attempt > 0 && !status.container_statuses.is_empty() {
            actions.create_sandbox = false;
            return actions;
        }
        // OnFailure: containers that succeeded stay done in the new sandbox.
        let to_start: Vec<usize> = containers(pod)
            .iter()
            .enumerate()
            .filter(|(_, c)| {
                policy != "OnFailure"
                    || !status
                        .latest(&c.name)
                        .is_some_and(|s| s.state == ContainerState::Exited && s.exit_code == 0)
            })
            .map(|(i, _)| i)
            .collect();
        if to_start.is_empty() && any_regular_container_created(pod, status) {
            actions.create_sandbox = false;
            return actions;
        }
        if init_containers(pod).is_empty() {
            actions.containers_to_start = to_start;
        } else {
            actions.init_containers_to_start = vec![0];
        }
        return actions;
    }

    // Ephemeral containers start even before initialization is done, and
    // only once: any instance of one means it ran (upstream v1.20+).
    if pod.metadata.deletion_timestamp.is_none() {
        actions.ephemeral_containers_to_start = ephemeral_containers(pod)
            .iter()
            .enumerate()
            .filter(|(_, e)| status.latest(&e.name).is_none())
            .map(|(i, _)| i)
            .collect();
    }

    let initialized = compute_init_actions(pod, status, probes, &mut actions);
    if actions.kill_pod {
        actions.ephemeral_containers_to_start.clear();
    }
    if actions.kill_pod || !initialized {
        return actions;
    }

    let mut keep = 0;
    for (i, c) in containers(pod).iter().enumerate() {
        let s = status.latest(&c.name);
        match s {
            Some(s) if s.state == ContainerState::Running => {
                if s.hash != container_hash(c) {
                    // A changed spec restarts whatever the restart policy.
                    actions.containers_to_kill.push((
                        s.id.clone(),
                        c.name.clone(),
                        format!("Container {} definition changed, will be restarted", c.name),
                    ));
                    actions.containers_to_start.push(i);
                } else {
                    keep += 1;
                }
            }
            _ => {
                if should_restart(pod, s) {
                    actions.containers_to_start.push(i);
                    if let Some(s) = s.filter(|s| s.state == ContainerState::Unknown) {
                        actions.containers_to_kill.push((
                            s.id.clone(),
                            c.name.clone(),
                            "Container is in \"unknown\" state, try killing it before restart"
                                .into(),
                        ));
                    }
                }
            }
        }
    }

    // Running containers the spec does not name any more.
    let inits = init_containers(pod);
    let ephemeral = ephemeral_containers(pod);
    let mut seen = std::collections::HashSet::new();
    for s in &status.container_statuses {
        if seen.insert(s.name.as_str())
            && s.state == ContainerState::Running
            && !containers(pod).iter().any(|c| c.name == s.name)
            && !inits.iter().any(|c| c.name == s.name)
            && !ephemeral.iter().any(|e| e.name == s.name)
        {
            actions.containers_to_kill.push((
                s.id.clone(),
                s.name.clone(),
                format!("Container {} is not in the pod spec", s.name),
            ));
        }
    }

    if keep == 0 && actions.containers_to_start.is_empty() {
        // Nothing runs and nothing will: stop the sandbox too. Sidecars do
        // not keep a finished pod alive.
        actions.kill_pod = true;
        actions.init_containers_to_start.clear();
        actions.ephemeral_containers_to_start.clear();
    }
    actions
}

/// Whether a regular container was ever created in this pod (upstream
/// `hasAnyRegularContainerCreated`).
fn any_regular_container_created(pod: &Pod, status: &PodStatus) -> bool {
    containers(pod).iter().any(|c| {
        status.latest(&c.name).is_some_and(|s| {
            matches!(
                s.state,
                ContainerState::Created | ContainerState::Running | ContainerState::Exited
            )
        })
    })
}

/// Fills in the init containers to start (and to kill); returns whether
/// the pod is initialized, i.e. its regular containers may run.
///
/// The walk goes from the last init container back to the first: finished
/// init containers may have been removed from the runtime, so the last one
/// with a record tells how far initialization got.
fn compute_init_actions(
    pod: &Pod,
    status: &PodStatus,
    probes: &dyn StartupResults,
    actions: &mut PodActions,
) -> bool {
    let inits = init_containers(pod);
    if inits.is_empty() {
        return true;
    }
    // A regular container that was created or runs means initialization
    // finished before, even if init containers' records are gone. Exited
    // ones do not count: they may be from before a reboot.
    let mut initialized = containers(pod).iter().any(|c| {
        status
            .latest(&c.name)
            .is_some_and(|s| matches!(s.state, ContainerState::Created | ContainerState::Running))
    });
    let mut previously_initialized = initialized;
    let restart_on_failure = restart_policy(pod) != "Never";
    let last = inits.len() - 1;
    let mut start = Vec::new();
    let kill = |actions: &mut PodActions, s: &ContainerStatus, message: String| {
        actions
            .containers_to_kill
            .push((s.id.clone(), s.name.clone(), message));
    };

    for (i, c) in inits.iter().enumerate().rev() {
        let sidecar = is_restartable_init(c);
        let Some(s) = status.latest(&c.name) else {
            // Gone after initialization: only a sidecar needs to run again.
            if previously_initialized && sidecar {
                start.push(i);
            }
            continue;
        };
        if previously_initialized && !sidecar {
            continue;
        }
        match s.state {
            // Created but not started: the start failed; try again.
            ContainerState::Created => start.push(i),
            ContainerState::Running if sidecar => 'running: {
                if c.startup_probe.is_some() {
                    match probes.startup(&s.id) {
                        StartupResult::Unknown => break 'running,
                        StartupResult::Failure => {
                            kill(
                                actions,
                                s,
                                format!("Init container {} failed startup probe", c.name),
                            );
                            start.push(i);
                            break 'running;
                        }
                        StartupResult::Success => {}
                    }
                }
                if i == last {
                    initialized = true;
                } else if !previously_initialized {
                    start.push(i + 1);
                }
                if s.hash != container_hash(c) {
                    kill(
                        actions,
                        s,
                        format!("Init container {} definition changed", c.name),
                    );
                    start.push(i);
                }
            }
            // A regular init container still running: wait for it.
            ContainerState::Running => {}
            ContainerState::Exited if sidecar => start.push(i),
            ContainerState::Exited if init_failed(s) => {
                if !restart_on_failure {
                    actions.kill_pod = true;
                    actions.init_containers_to_start.clear();
                    return false;
                }
                start.push(i);
            }
            ContainerState::Exited => {
                if i == last {
                    initialized = true;
                } else {
                    start.push(i + 1);
                }
            }
            ContainerState::Unknown => {
                if !sidecar && !restart_on_failure {
                    actions.kill_pod = true;
                    actions.init_containers_to_start.clear();
                    return false;
                }
                kill(
                    actions,
                    s,
                    "Init container is in \"unknown\" state, try killing it before restart".into(),
                );
                start.push(i);
            }
        }
        previously_initialized = true;
    }
    if !previously_initialized {
        start.push(0);
    }
    start.reverse();
    let mut seen = std::collections::HashSet::new();
    start.retain(|i| seen.insert(*i));
    actions.init_containers_to_start = start;
    initialized
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{ContainerPort, PodSpec, Probe};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use protobuf::{EnumOrUnknown, MessageField};

    fn container(name: &str) -> Container {
        Container {
            name: name.into(),
            image: Some("busybox".into()),
            ..Default::default()
        }
    }

    fn sidecar(name: &str) -> Container {
        Container {
            restart_policy: Some("Always".into()),
            ..container(name)
        }
    }

    fn pod(policy: &str, inits: &[&str], names: &[&str]) -> Pod {
        pod_with(policy, inits.iter().map(|n| container(n)).collect(), names)
    }

    fn pod_with(policy: &str, inits: Vec<Container>, names: &[&str]) -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some("web-edge".into()),
                namespace: Some("default".into()),
                uid: Some("uid-1".into()),
                ..Default::default()
            },
            spec: Some(PodSpec {
                restart_policy: Some(policy.into()),
                init_containers: (!inits.is_empty()).then_some(inits),
                containers: names.iter().map(|n| container(n)).collect(),
                ..Default::default()
            }),
            status: None,
        }
    }

    fn sandbox(id: &str, ready: bool, attempt: u32) -> api::PodSandboxStatus {
        let mut s = api::PodSandboxStatus::new();
        s.id = id.into();
        s.state = EnumOrUnknown::new(if ready {
            api::PodSandboxState::SANDBOX_READY
        } else {
            api::PodSandboxState::SANDBOX_NOTREADY
        });
        let mut m = api::PodSandboxMetadata::new();
        m.attempt = attempt;
        s.metadata = MessageField::some(m);
        let mut n = api::PodSandboxNetworkStatus::new();
        n.ip = "10.88.0.2".into();
        s.network = MessageField::some(n);
        s
    }

    fn cs(pod: &Pod, name: &str, state: ContainerState, exit: i32) -> ContainerStatus {
        let spec = pod
            .spec
            .as_ref()
            .unwrap()
            .containers
            .iter()
            .chain(pod.spec.as_ref().unwrap().init_containers.iter().flatten())
            .find(|c| c.name == name)
            .cloned()
            .unwrap_or_else(|| container(name));
        ContainerStatus {
            id: format!("id-{name}"),
            name: name.into(),
            state,
            exit_code: exit,
            hash: container_hash(&spec),
            ..Default::default()
        }
    }

    fn status(sandboxes: Vec<api::PodSandboxStatus>, cs: Vec<ContainerStatus>) -> PodStatus {
        PodStatus {
            sandbox_statuses: sandboxes,
            container_statuses: cs,
            ..Default::default()
        }
    }

    fn sb() -> Vec<api::PodSandboxStatus> {
        vec![sandbox("s1", true, 0)]
    }

    fn actions(p: &Pod, s: &PodStatus) -> PodActions {
        compute_pod_actions(p, s, &NoProber)
    }

    use ContainerState::{Exited, Running, Unknown};

    #[test]
    fn new_pod_creates_sandbox_and_starts_all_containers() {
        let p = pod("Always", &[], &["a", "b"]);
        let a = actions(&p, &PodStatus::default());
        assert!(a.create_sandbox && a.kill_pod);
        assert_eq!(a.attempt, 0);
        assert_eq!(a.containers_to_start, vec![0, 1]);
    }

    #[test]
    fn running_pod_is_left_alone() {
        let p = pod("Always", &[], &["a"]);
        let s = status(sb(), vec![cs(&p, "a", Running, 0)]);
        assert_eq!(
            actions(&p, &s),
            PodActions {
                sandbox_id: "s1".into(),
                ..Default::default()
            }
        );
    }

    #[test]
    fn dead_sandbox_is_replaced_with_next_attempt() {
        let p = pod("Always", &[], &["a"]);
        let s = status(vec![sandbox("s1", false, 2)], vec![cs(&p, "a", Exited, 0)]);
        let a = actions(&p, &s);
        assert!(a.create_sandbox && a.kill_pod);
        assert_eq!(a.attempt, 3);
        assert_eq!(a.containers_to_start, vec![0]);
    }

    #[test]
    fn on_failure_keeps_succeeded_containers_done_in_a_new_sandbox() {
        let p = pod("OnFailure", &[], &["a", "b"]);
        let s = status(
            vec![sandbox("s1", false, 0)],
            vec![cs(&p, "a", Exited, 0), cs(&p, "b", Exited, 1)],
        );
        let a = actions(&p, &s);
        assert!(a.create_sandbox);
        assert_eq!(a.containers_to_start, vec![1]);
        // All succeeded: no new sandbox at all.
        let s = status(
            vec![sandbox("s1", false, 0)],
            vec![cs(&p, "a", Exited, 0), cs(&p, "b", Exited, 0)],
        );
        let a = actions(&p, &s);
        assert!(a.kill_pod && !a.create_sandbox);
        assert!(a.containers_to_start.is_empty());
    }

    #[test]
    fn restart_policy_decides_exited_containers() {
        for (policy, exit, restart) in [
            ("Always", 0, true),
            ("Always", 1, true),
            ("OnFailure", 0, false),
            ("OnFailure", 2, true),
            ("Never", 1, false),
            ("Never", 0, false),
        ] {
            let p = pod(policy, &[], &["a", "b"]);
            let s = status(
                sb(),
                vec![cs(&p, "a", Exited, exit), cs(&p, "b", Running, 0)],
            );
            let a = actions(&p, &s);
            assert_eq!(
                a.containers_to_start,
                if restart { vec![0] } else { vec![] },
                "{policy} exit {exit}"
            );
            assert!(!a.kill_pod);
        }
    }

    #[test]
    fn a_deleted_pod_restarts_nothing() {
        let mut p = pod("Always", &[], &["a"]);
        p.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
        ));
        let a = actions(&p, &status(sb(), vec![cs(&p, "a", Exited, 1)]));
        assert!(a.kill_pod);
        assert!(a.containers_to_start.is_empty());
    }

    #[test]
    fn unknown_container_is_killed_before_its_restart() {
        let p = pod("Never", &[], &["a"]);
        let a = actions(&p, &status(sb(), vec![cs(&p, "a", Unknown, 0)]));
        assert_eq!(a.containers_to_start, vec![0]);
        assert_eq!(a.containers_to_kill[0].0, "id-a");
    }

    #[test]
    fn finished_pod_gets_its_sandbox_stopped_and_never_recreated() {
        let p = pod("Never", &[], &["a"]);
        let s = status(sb(), vec![cs(&p, "a", Exited, 0)]);
        let a = actions(&p, &s);
        assert!(a.kill_pod && !a.create_sandbox);
        let s = status(vec![sandbox("s1", false, 0)], vec![cs(&p, "a", Exited, 0)]);
        let a = actions(&p, &s);
        assert!(a.kill_pod && !a.create_sandbox);
        assert!(a.containers_to_start.is_empty());
    }

    #[test]
    fn changed_spec_restarts_only_that_container() {
        let p = pod("Never", &[], &["a", "b"]);
        let mut running = cs(&p, "a", Running, 0);
        running.hash ^= 1;
        let s = status(sb(), vec![running, cs(&p, "b", Running, 0)]);
        let a = actions(&p, &s);
        assert!(!a.kill_pod && !a.create_sandbox);
        assert_eq!(a.containers_to_start, vec![0]);
        assert_eq!(
            a.containers_to_kill,
            vec![(
                "id-a".to_string(),
                "a".to_string(),
                "Container a definition changed, will be restarted".to_string()
            )]
        );
    }

    #[test]
    fn unknown_running_container_is_killed() {
        let p = pod("Always", &[], &["a"]);
        let s = status(
            sb(),
            vec![cs(&p, "a", Running, 0), cs(&p, "old", Running, 0)],
        );
        let a = actions(&p, &s);
        assert_eq!(a.containers_to_kill[0].1, "old");
        assert!(a.containers_to_start.is_empty());
    }

    #[test]
    fn init_containers_run_in_order_before_the_rest() {
        let p = pod("Always", &["i1", "i2"], &["a"]);
        let a = actions(&p, &PodStatus::default());
        assert_eq!(a.init_containers_to_start, vec![0]);
        assert!(a.containers_to_start.is_empty());

        let a = actions(&p, &status(sb(), vec![cs(&p, "i1", Running, 0)]));
        assert_eq!(
            (
                a.init_containers_to_start.len(),
                a.containers_to_start.len()
            ),
            (0, 0)
        );
        assert!(!a.kill_pod);

        let a = actions(&p, &status(sb(), vec![cs(&p, "i1", Exited, 0)]));
        assert_eq!(a.init_containers_to_start, vec![1]);
        assert!(a.containers_to_start.is_empty());

        // A failed init container is retried (Always, OnFailure).
        let a = actions(&p, &status(sb(), vec![cs(&p, "i1", Exited, 1)]));
        assert_eq!(a.init_containers_to_start, vec![0]);
        assert!(!a.kill_pod);

        let done = vec![cs(&p, "i1", Exited, 0), cs(&p, "i2", Exited, 0)];
        let a = actions(&p, &status(sb(), done.clone()));
        assert!(a.init_containers_to_start.is_empty());
        assert_eq!(a.containers_to_start, vec![0]);

        // Once a regular container runs, removed init records do not rerun.
        let a = actions(&p, &status(sb(), vec![cs(&p, "a", Running, 0)]));
        assert_eq!(
            a,
            PodActions {
                sandbox_id: "s1".into(),
                ..Default::default()
            }
        );

        // Never: a failed init container fails the pod.
        let p = pod("Never", &["i1", "i2"], &["a"]);
        let a = actions(&p, &status(sb(), vec![cs(&p, "i1", Exited, 1)]));
        assert!(a.kill_pod);
        assert!(a.init_containers_to_start.is_empty());
        assert!(a.containers_to_start.is_empty());
        // ... and an OOM-killed one too, whatever its exit code says.
        let mut oom = cs(&p, "i1", Exited, 0);
        oom.reason = "OOMKilled".into();
        assert!(actions(&p, &status(sb(), vec![oom])).kill_pod);
        // A new sandbox starts again from the first init container.
        let a = actions(&p, &PodStatus::default());
        assert_eq!(a.init_containers_to_start, vec![0]);
    }

    #[test]
    fn sidecars_start_in_order_without_blocking_and_keep_running() {
        let p = pod_with("Never", vec![sidecar("side"), container("setup")], &["a"]);
        let a = actions(&p, &status(sb(), vec![]));
        assert_eq!(a.init_containers_to_start, vec![0]);
        // The sidecar runs: the next init container starts at once.
        let a = actions(&p, &status(sb(), vec![cs(&p, "side", Running, 0)]));
        assert_eq!(a.init_containers_to_start, vec![1]);
        assert!(a.containers_to_start.is_empty());
        // setup running: wait.
        let a = actions(
            &p,
            &status(
                sb(),
                vec![cs(&p, "setup", Running, 0), cs(&p, "side", Running, 0)],
            ),
        );
        assert!(a.init_containers_to_start.is_empty() && a.containers_to_start.is_empty());
        // setup done: the regular container starts, the sidecar stays.
        let a = actions(
            &p,
            &status(
                sb(),
                vec![cs(&p, "setup", Exited, 0), cs(&p, "side", Running, 0)],
            ),
        );
        assert!(a.init_containers_to_start.is_empty());
        assert_eq!(a.containers_to_start, vec![0]);
        assert!(a.containers_to_kill.is_empty());
        // A sidecar that exits is restarted, even under restartPolicy Never,
        // while the regular container runs on.
        let a = actions(
            &p,
            &status(
                sb(),
                vec![
                    cs(&p, "a", Running, 0),
                    cs(&p, "setup", Exited, 0),
                    cs(&p, "side", Exited, 1),
                ],
            ),
        );
        assert_eq!(a.init_containers_to_start, vec![0]);
        assert!(a.containers_to_start.is_empty() && !a.kill_pod);
        // Once the regular container finished, the sidecar keeps nothing alive.
        let a = actions(
            &p,
            &status(
                sb(),
                vec![
                    cs(&p, "a", Exited, 0),
                    cs(&p, "setup", Exited, 0),
                    cs(&p, "side", Running, 0),
                ],
            ),
        );
        assert!(a.kill_pod);
        assert!(a.init_containers_to_start.is_empty());
    }

    struct Startup(StartupResult);
    impl StartupResults for Startup {
        fn startup(&self, _id: &str) -> StartupResult {
            self.0
        }
    }

    #[test]
    fn a_sidecar_with_a_startup_probe_blocks_until_it_succeeds() {
        let mut side = sidecar("side");
        side.startup_probe = Some(Probe::default());
        let p = pod_with("Always", vec![side, container("setup")], &["a"]);
        let s = status(sb(), vec![cs(&p, "side", Running, 0)]);
        let a = compute_pod_actions(&p, &s, &Startup(StartupResult::Unknown));
        assert!(a.init_containers_to_start.is_empty());
        assert!(a.containers_to_kill.is_empty());
        let a = compute_pod_actions(&p, &s, &Startup(StartupResult::Success));
        assert_eq!(a.init_containers_to_start, vec![1]);
        let a = compute_pod_actions(&p, &s, &Startup(StartupResult::Failure));
        assert_eq!(a.init_containers_to_start, vec![0]);
        assert_eq!(a.containers_to_kill[0].0, "id-side");
    }

    #[test]
    fn a_changed_sidecar_is_restarted_alone() {
        let p = pod_with("Always", vec![sidecar("side")], &["a"]);
        let mut side = cs(&p, "side", Running, 0);
        side.hash ^= 1;
        let a = actions(&p, &status(sb(), vec![cs(&p, "a", Running, 0), side]));
        assert_eq!(a.init_containers_to_start, vec![0]);
        assert_eq!(a.containers_to_kill.len(), 1);
        assert_eq!(a.containers_to_kill[0].1, "side");
        assert!(a.containers_to_start.is_empty() && !a.kill_pod);
    }

    #[test]
    fn host_network_change_recreates_the_sandbox() {
        let mut p = pod("Always", &[], &["a"]);
        p.spec.as_mut().unwrap().host_network = Some(true);
        let s = status(sb(), vec![cs(&p, "a", Running, 0)]);
        let a = actions(&p, &s);
        assert!(a.create_sandbox);
        assert_eq!(a.attempt, 1);
    }

    #[test]
    fn port_or_dns_change_recreates_the_sandbox() {
        let p = pod("Always", &[], &["a"]);
        let mut s = status(sb(), vec![cs(&p, "a", Running, 0)]);
        s.sandbox_statuses[0]
            .annotations
            .insert(super::super::labels::SANDBOX_HASH.into(), sandbox_hash(&p));
        assert!(!actions(&p, &s).create_sandbox);

        let mut ported = p.clone();
        ported.spec.as_mut().unwrap().containers[0].ports = Some(vec![ContainerPort {
            container_port: 80,
            host_port: Some(8080),
            ..Default::default()
        }]);
        let a = actions(&ported, &s);
        assert!(a.create_sandbox && a.kill_pod);
        assert_eq!(a.containers_to_start, vec![0]);

        let mut dns = p.clone();
        dns.spec.as_mut().unwrap().dns_policy = Some("Default".into());
        assert!(actions(&dns, &s).create_sandbox);

        // A port without a host port is not part of the sandbox.
        let mut inner = p.clone();
        inner.spec.as_mut().unwrap().containers[0].ports = Some(vec![ContainerPort {
            container_port: 80,
            ..Default::default()
        }]);
        assert!(!actions(&inner, &s).create_sandbox);
        // A sandbox without the annotation (made before it existed) is kept.
        s.sandbox_statuses[0].annotations.clear();
        assert!(!actions(&ported, &s).create_sandbox);
    }

    fn with_debug(mut p: Pod) -> Pod {
        p.spec.as_mut().unwrap().ephemeral_containers = Some(vec![EphemeralContainer {
            name: "debug".into(),
            image: Some("busybox".into()),
            stdin: Some(true),
            tty: Some(true),
            target_container_name: Some("a".into()),
            ..Default::default()
        }]);
        p
    }

    #[test]
    fn an_added_ephemeral_container_starts_once_and_restarts_nothing() {
        let plain = pod("Always", &[], &["a"]);
        let p = with_debug(plain.clone());
        // Adding it changes neither hash: the running container stays.
        assert_eq!(sandbox_hash(&p), sandbox_hash(&plain));
        let s = status(sb(), vec![cs(&p, "a", Running, 0)]);
        assert_eq!(
            actions(&p, &s),
            PodActions {
                sandbox_id: "s1".into(),
                ephemeral_containers_to_start: vec![0],
                ..Default::default()
            }
        );
        // Running, it is not "not in the pod spec"; exited, never again.
        for state in [Running, Exited] {
            let s = status(
                sb(),
                vec![cs(&p, "a", Running, 0), cs(&p, "debug", state, 0)],
            );
            assert_eq!(
                actions(&p, &s),
                PodActions {
                    sandbox_id: "s1".into(),
                    ..Default::default()
                },
                "{state:?}"
            );
        }
        // Before initialization is done, it starts too.
        let mut init = with_debug(pod("Always", &["i"], &["a"]));
        init.spec.as_mut().unwrap().containers[0].name = "a".into();
        let s = status(sb(), vec![cs(&init, "i", Running, 0)]);
        assert_eq!(actions(&init, &s).ephemeral_containers_to_start, vec![0]);
        // A finished pod or a pod being deleted starts none.
        let never = with_debug(pod("Never", &[], &["a"]));
        let s = status(sb(), vec![cs(&never, "a", Exited, 0)]);
        let a = actions(&never, &s);
        assert!(a.kill_pod && a.ephemeral_containers_to_start.is_empty());
        let mut deleted = p.clone();
        deleted.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
            ));
        let s = status(sb(), vec![cs(&p, "a", Running, 0)]);
        assert!(actions(&deleted, &s)
            .ephemeral_containers_to_start
            .is_empty());
        // As a container: what a debug session needs, and its target.
        let c = ephemeral_container(
            &p.spec
                .as_ref()
                .unwrap()
                .ephemeral_containers
                .as_ref()
                .unwrap()[0],
        );
        assert_eq!(
            (c.name.as_str(), c.stdin, c.tty),
            ("debug", Some(true), Some(true))
        );
        assert_eq!(ephemeral_target(&p, "debug"), Some("a"));
        assert_eq!(ephemeral_target(&p, "a"), None);
    }
}
