//! `compute_pod_actions`: what SyncPod must do to bring a pod's runtime state
//! to its spec. A pure function of the spec and the observed status, so it is
//! tested without a runtime.

use k8s_openapi::api::core::v1::{Container, Pod};

use super::labels::container_hash;
use super::{ContainerState, ContainerStatus, PodStatus};
use crate::cri::api;

/// The changes one SyncPod makes.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct PodActions {
    /// Stop every container and sandbox of the pod first.
    pub kill_pod: bool,
    /// Create a new sandbox (after killing the old one, if any).
    pub create_sandbox: bool,
    /// The sandbox to use when not creating one.
    pub sandbox_id: String,
    /// Attempt number for a new sandbox.
    pub attempt: u32,
    /// Index into `spec.initContainers` of the next init container to start.
    pub next_init_container: Option<usize>,
    /// Indexes into `spec.containers` of containers to start, in order.
    pub containers_to_start: Vec<usize>,
    /// Running containers to stop, with the reason.
    pub containers_to_kill: Vec<(String, String, String)>,
}

fn restart_policy(pod: &Pod) -> &str {
    pod.spec
        .as_ref()
        .and_then(|s| s.restart_policy.as_deref())
        .unwrap_or("Always")
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

fn init_containers(pod: &Pod) -> &[Container] {
    pod.spec
        .as_ref()
        .and_then(|s| s.init_containers.as_deref())
        .unwrap_or(&[])
}

/// Whether an exited container should run again under the pod's policy.
pub fn should_restart(pod: &Pod, status: &ContainerStatus) -> bool {
    match restart_policy(pod) {
        "Never" => false,
        "OnFailure" => status.exit_code != 0,
        _ => true,
    }
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
    (false, attempt, latest.id.clone())
}

/// Computes the actions SyncPod takes for `pod` given what runs now.
pub fn compute_pod_actions(pod: &Pod, status: &PodStatus) -> PodActions {
    let (create_sandbox, attempt, sandbox_id) = sandbox_changed(pod, status);
    let mut actions = PodActions {
        kill_pod: create_sandbox,
        create_sandbox,
        attempt,
        sandbox_id,
        ..Default::default()
    };

    if create_sandbox {
        // A pod that must never restart and already ran once does not get a
        // second sandbox: it is finished.
        if restart_policy(pod) == "Never" && attempt > 0 && !status.container_statuses.is_empty() {
            actions.create_sandbox = false;
            return actions;
        }
        if init_containers(pod).is_empty() {
            actions.containers_to_start = (0..containers(pod).len()).collect();
        } else {
            actions.next_init_container = Some(0);
        }
        return actions;
    }

    // Init containers run one at a time, in order, each to success.
    let inits = init_containers(pod);
    if !inits.is_empty() {
        let mut all_done = true;
        for (i, c) in inits.iter().enumerate() {
            match status.latest(&c.name) {
                None => {
                    actions.next_init_container = Some(i);
                    all_done = false;
                    break;
                }
                Some(s) if s.state == ContainerState::Running => {
                    all_done = false;
                    break;
                }
                Some(s) if s.state == ContainerState::Exited && s.exit_code == 0 => continue,
                Some(_) => {
                    all_done = false;
                    if restart_policy(pod) == "Never" {
                        actions.kill_pod = true;
                    } else {
                        actions.next_init_container = Some(i);
                    }
                    break;
                }
            }
        }
        if !all_done {
            return actions;
        }
    }

    let mut keep = 0;
    for (i, c) in containers(pod).iter().enumerate() {
        match status.latest(&c.name) {
            Some(s) if s.state == ContainerState::Running => {
                if s.hash != container_hash(c) {
                    actions.containers_to_kill.push((
                        s.id.clone(),
                        c.name.clone(),
                        "its definition changed".into(),
                    ));
                    actions.containers_to_start.push(i);
                } else {
                    keep += 1;
                }
            }
            None => actions.containers_to_start.push(i),
            Some(s) => {
                if should_restart(pod, s) {
                    actions.containers_to_start.push(i);
                }
            }
        }
    }

    // Running containers the spec does not name any more.
    for s in &status.container_statuses {
        if s.state == ContainerState::Running
            && !containers(pod).iter().any(|c| c.name == s.name)
            && !inits.iter().any(|c| c.name == s.name)
        {
            actions.containers_to_kill.push((
                s.id.clone(),
                s.name.clone(),
                "not in the pod spec".into(),
            ));
        }
    }

    if keep == 0 && actions.containers_to_start.is_empty() {
        // Nothing runs and nothing will: stop the sandbox too.
        actions.kill_pod = true;
    }
    actions
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::PodSpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use protobuf::{EnumOrUnknown, MessageField};

    fn container(name: &str) -> Container {
        Container {
            name: name.into(),
            image: Some("busybox".into()),
            ..Default::default()
        }
    }

    fn pod(policy: &str, inits: &[&str], names: &[&str]) -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some("web-edge".into()),
                namespace: Some("default".into()),
                uid: Some("uid-1".into()),
                ..Default::default()
            },
            spec: Some(PodSpec {
                restart_policy: Some(policy.into()),
                init_containers: if inits.is_empty() {
                    None
                } else {
                    Some(inits.iter().map(|n| container(n)).collect())
                },
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

    #[test]
    fn new_pod_creates_sandbox_and_starts_all_containers() {
        let p = pod("Always", &[], &["a", "b"]);
        let a = compute_pod_actions(&p, &PodStatus::default());
        assert!(a.create_sandbox && a.kill_pod);
        assert_eq!(a.attempt, 0);
        assert_eq!(a.containers_to_start, vec![0, 1]);
    }

    #[test]
    fn running_pod_is_left_alone() {
        let p = pod("Always", &[], &["a"]);
        let s = status(
            vec![sandbox("s1", true, 0)],
            vec![cs(&p, "a", ContainerState::Running, 0)],
        );
        let a = compute_pod_actions(&p, &s);
        assert_eq!(
            a,
            PodActions {
                sandbox_id: "s1".into(),
                ..Default::default()
            }
        );
    }

    #[test]
    fn dead_sandbox_is_replaced_with_next_attempt() {
        let p = pod("Always", &[], &["a"]);
        let s = status(
            vec![sandbox("s1", false, 2)],
            vec![cs(&p, "a", ContainerState::Exited, 0)],
        );
        let a = compute_pod_actions(&p, &s);
        assert!(a.create_sandbox && a.kill_pod);
        assert_eq!(a.attempt, 3);
        assert_eq!(a.containers_to_start, vec![0]);
    }

    #[test]
    fn restart_policy_decides_exited_containers() {
        for (policy, exit, restart) in [
            ("Always", 0, true),
            ("Always", 1, true),
            ("OnFailure", 0, false),
            ("OnFailure", 2, true),
            ("Never", 1, false),
        ] {
            let p = pod(policy, &[], &["a", "b"]);
            let s = status(
                vec![sandbox("s1", true, 0)],
                vec![
                    cs(&p, "a", ContainerState::Exited, exit),
                    cs(&p, "b", ContainerState::Running, 0),
                ],
            );
            let a = compute_pod_actions(&p, &s);
            assert_eq!(
                a.containers_to_start,
                if restart { vec![0] } else { vec![] },
                "{policy} exit {exit}"
            );
            assert!(!a.kill_pod);
        }
    }

    #[test]
    fn finished_pod_gets_its_sandbox_stopped_and_never_recreated() {
        let p = pod("Never", &[], &["a"]);
        let s = status(
            vec![sandbox("s1", true, 0)],
            vec![cs(&p, "a", ContainerState::Exited, 0)],
        );
        let a = compute_pod_actions(&p, &s);
        assert!(a.kill_pod && !a.create_sandbox);
        let s = status(
            vec![sandbox("s1", false, 0)],
            vec![cs(&p, "a", ContainerState::Exited, 0)],
        );
        let a = compute_pod_actions(&p, &s);
        assert!(a.kill_pod && !a.create_sandbox);
        assert!(a.containers_to_start.is_empty());
    }

    #[test]
    fn changed_spec_restarts_the_container() {
        let p = pod("Always", &[], &["a"]);
        let mut running = cs(&p, "a", ContainerState::Running, 0);
        running.hash ^= 1;
        let s = status(vec![sandbox("s1", true, 0)], vec![running]);
        let a = compute_pod_actions(&p, &s);
        assert_eq!(a.containers_to_start, vec![0]);
        assert_eq!(a.containers_to_kill.len(), 1);
        assert_eq!(a.containers_to_kill[0].0, "id-a");
    }

    #[test]
    fn unknown_running_container_is_killed() {
        let p = pod("Always", &[], &["a"]);
        let s = status(
            vec![sandbox("s1", true, 0)],
            vec![
                cs(&p, "a", ContainerState::Running, 0),
                cs(&p, "old", ContainerState::Running, 0),
            ],
        );
        let a = compute_pod_actions(&p, &s);
        assert_eq!(a.containers_to_kill[0].1, "old");
        assert!(a.containers_to_start.is_empty());
    }

    #[test]
    fn init_containers_run_in_order_before_the_rest() {
        let p = pod("Always", &["i1", "i2"], &["a"]);
        let a = compute_pod_actions(&p, &PodStatus::default());
        assert_eq!(a.next_init_container, Some(0));
        assert!(a.containers_to_start.is_empty());

        let sb = || vec![sandbox("s1", true, 0)];
        let a = compute_pod_actions(
            &p,
            &status(sb(), vec![cs(&p, "i1", ContainerState::Running, 0)]),
        );
        assert_eq!(
            (a.next_init_container, a.containers_to_start.len()),
            (None, 0)
        );

        let a = compute_pod_actions(
            &p,
            &status(sb(), vec![cs(&p, "i1", ContainerState::Exited, 0)]),
        );
        assert_eq!(a.next_init_container, Some(1));

        let a = compute_pod_actions(
            &p,
            &status(sb(), vec![cs(&p, "i1", ContainerState::Exited, 1)]),
        );
        assert_eq!(a.next_init_container, Some(0));

        let a = compute_pod_actions(
            &p,
            &status(
                sb(),
                vec![
                    cs(&p, "i1", ContainerState::Exited, 0),
                    cs(&p, "i2", ContainerState::Exited, 0),
                ],
            ),
        );
        assert_eq!(a.next_init_container, None);
        assert_eq!(a.containers_to_start, vec![0]);

        let p = pod("Never", &["i1"], &["a"]);
        let a = compute_pod_actions(
            &p,
            &status(sb(), vec![cs(&p, "i1", ContainerState::Exited, 1)]),
        );
        assert!(a.kill_pod);
        assert_eq!(a.next_init_container, None);
    }

    #[test]
    fn host_network_change_recreates_the_sandbox() {
        let mut p = pod("Always", &[], &["a"]);
        p.spec.as_mut().unwrap().host_network = Some(true);
        let s = status(
            vec![sandbox("s1", true, 0)],
            vec![cs(&p, "a", ContainerState::Running, 0)],
        );
        let a = compute_pod_actions(&p, &s);
        assert!(a.create_sandbox);
        assert_eq!(a.attempt, 1);
    }
}
