//! Pod status generation (upstream `generateAPIPodStatus`, `getPhase`,
//! `convertToAPIContainerStatuses`, the condition generators, the status
//! manager's transition-time and start-time rules, and the QoS class). The
//! patch that carries it to the apiserver is `super::patch`'s.
//!
//! Everything here is a pure function of the pod, the runtime's view of it
//! (`crate::runtime::PodStatus`), the status the apiserver last held and a
//! [`StatusContext`]. A running container is started once its startup
//! probe succeeded (at once without one) and ready once started and its
//! readiness probe succeeded (at once without one), as upstream's prober
//! manager sets them; the probe results come with the context.
//!
//! Regular container statuses are sorted by name, as upstream sorts them
//! (init containers keep spec order), so a node switched between tinylet and
//! a kubelet sees no reorder.

use std::collections::BTreeMap;
use std::net::IpAddr;

use k8s_openapi::api::core::v1::{
    Container, ContainerState as ApiState, ContainerStateRunning, ContainerStateTerminated,
    ContainerStateWaiting, ContainerStatus as ApiContainerStatus, Pod, PodCondition, PodIP,
    PodStatus as ApiPodStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

use crate::cri::api;
use crate::runtime::actions::{is_restartable_init, restart_policy};
use crate::runtime::{self, ContainerState};

use crate::pod::{FAILED, PENDING, RUNNING, SUCCEEDED};

/// Waiting reason of a container that has not been created yet.
pub(crate) const CONTAINER_CREATING: &str = "ContainerCreating";
/// Waiting reason of every container without a record while the pod has init containers.
pub(crate) const POD_INITIALIZING: &str = "PodInitializing";

/// The condition types the kubelet owns; others in the old status are kept as they are.
const KUBELET_CONDITIONS: [&str; 4] = ["PodScheduled", "Ready", "Initialized", "ContainersReady"];

/// What the status needs besides the pod and its runtime state.
pub(crate) struct StatusContext<'a> {
    pub(crate) host_ip: Option<&'a str>,
    /// "containerd" or "cri-o" etc. from CRI Version.runtime_name: containerID is "<runtime>://<id>".
    pub(crate) runtime_name: &'a str,
    /// Why the last sync could not start a container, by container name: (reason, message),
    /// e.g. ("CrashLoopBackOff", "back-off 10s restarting failed container=app pod=web_default(uid)"),
    /// ("ErrImagePull", ..), ("ImagePullBackOff", ..), ("CreateContainerError", ..), ("ErrImageNeverPull", ..)
    pub(crate) waiting_reasons: &'a BTreeMap<String, (String, String)>,
    /// Now (for new transition times and startTime).
    pub(crate) now: Timestamp,
    /// Standing probe results by container ID; `None`: none yet, so a
    /// container with a startup or readiness probe is not started or ready.
    pub(crate) probes: Option<&'a crate::prober::ProbeResults>,
}

/// The API status of `pod`. `old` is the status the apiserver holds (the
/// pod's own `status` when `None`): it supplies the start time, condition
/// transition times that did not change, a terminal phase (which never goes
/// back), the QoS class, conditions other components own, and the status
/// of containers the runtime no longer has.
pub(crate) fn generate_pod_status(
    pod: &Pod,
    rt: &runtime::PodStatus,
    old: Option<&ApiPodStatus>,
    ctx: &StatusContext,
) -> ApiPodStatus {
    let old = old.or(pod.status.as_ref());
    let spec = pod.spec.as_ref();
    let containers: &[Container] = spec.map(|s| s.containers.as_slice()).unwrap_or(&[]);
    let inits: &[Container] = spec
        .and_then(|s| s.init_containers.as_deref())
        .unwrap_or(&[]);
    let has_inits = !inits.is_empty();
    let now = Time(seconds(ctx.now));

    let old_regular = old
        .and_then(|o| o.container_statuses.as_deref())
        .unwrap_or(&[]);
    let old_init = old
        .and_then(|o| o.init_container_statuses.as_deref())
        .unwrap_or(&[]);
    let mut statuses = container_statuses(pod, rt, old_regular, containers, has_inits, false, ctx);
    statuses.sort_by(|a, b| a.name.cmp(&b.name));
    let init_statuses = container_statuses(pod, rt, old_init, inits, has_inits, true, ctx);
    let ephemeral_statuses = ephemeral_statuses(pod, rt, old, has_inits, ctx);

    // A terminal phase the apiserver shows is never left.
    let phase = match old.and_then(|o| o.phase.as_deref()) {
        Some(FAILED) => FAILED,
        Some(SUCCEEDED) => SUCCEEDED,
        _ => pod_phase(pod, &statuses, &init_statuses),
    };

    // Conditions other controllers own (readiness gates') come from the
    // latest API pod, as upstream reads them from its pod manager; the
    // status tinylet last reported may predate them.
    let foreign = pod.status.as_ref().filter(|s| s.conditions.is_some());
    let mut conditions: Vec<PodCondition> = foreign
        .or(old)
        .and_then(|o| o.conditions.as_ref())
        .map(|cs| {
            cs.iter()
                .filter(|c| !KUBELET_CONDITIONS.contains(&c.type_.as_str()))
                .cloned()
                .collect()
        })
        .unwrap_or_default();
    let initialized = initialized_condition(pod, &init_statuses, &statuses, phase);
    let containers_ready =
        containers_ready_condition(containers, inits, &statuses, &init_statuses, phase);
    let ready = ready_condition(pod, &conditions, &containers_ready);
    let first_owned = conditions.len();
    conditions.extend([
        initialized,
        ready,
        containers_ready,
        condition("PodScheduled", true, None, None),
    ]);
    for c in &mut conditions[first_owned..] {
        set_transition_time(c, old, &now);
    }

    let sandbox_ready = rt
        .sandbox_statuses
        .first()
        .is_some_and(|s| s.state.enum_value() == Ok(api::PodSandboxState::SANDBOX_READY));
    let host_ip = ctx.host_ip.filter(|h| !h.is_empty());
    let mut ips = if sandbox_ready {
        sort_pod_ips(&rt.ips, host_ip)
    } else {
        Vec::new()
    };
    let host_network = spec.and_then(|s| s.host_network).unwrap_or(false);
    if ips.is_empty() && host_network {
        ips.extend(host_ip.map(str::to_string));
    }

    let qos = old
        .and_then(|o| o.qos_class.clone())
        .filter(|q| !q.is_empty())
        .unwrap_or_else(|| crate::pod::qos_class(pod).to_string());

    ApiPodStatus {
        phase: Some(phase.to_string()),
        conditions: Some(conditions),
        host_ip: host_ip.map(str::to_string),
        pod_ip: ips.first().cloned(),
        pod_ips: (!ips.is_empty()).then(|| ips.into_iter().map(|ip| PodIP { ip }).collect()),
        start_time: Some(
            old.and_then(|o| o.start_time.clone())
                .unwrap_or_else(|| now.clone()),
        ),
        qos_class: Some(qos),
        container_statuses: Some(statuses),
        init_container_statuses: has_inits.then_some(init_statuses),
        ephemeral_container_statuses: (!ephemeral_statuses.is_empty())
            .then_some(ephemeral_statuses),
        ..Default::default()
    }
}

/// The statuses of the pod's ephemeral containers, sorted by name as
/// upstream sorts them. They are never ready, and have no `started` (the
/// prober looks only at regular and init containers); one that exited
/// stays terminated, as it is never started again.
fn ephemeral_statuses(
    pod: &Pod,
    rt: &runtime::PodStatus,
    old: Option<&ApiPodStatus>,
    has_inits: bool,
    ctx: &StatusContext,
) -> Vec<ApiContainerStatus> {
    let containers = runtime::actions::ephemeral_as_containers(pod);
    if containers.is_empty() {
        return Vec::new();
    }
    let previous = old
        .and_then(|o| o.ephemeral_container_statuses.as_deref())
        .unwrap_or(&[]);
    let mut out = container_statuses(pod, rt, previous, &containers, has_inits, false, ctx);
    for st in &mut out {
        st.ready = false;
        st.started = None;
        let ran = rt.container_statuses.iter().any(|r| r.name == st.name);
        if ran && st.state.as_ref().is_some_and(|s| s.waiting.is_some()) {
            // A waiting reason left from an earlier failed start: the
            // instance there is is the one that counts.
            if let Some(last) = st.last_state.take() {
                st.state = Some(last);
            }
            st.last_state = Some(ApiState::default());
        }
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    out
}

/// `t` truncated to whole seconds: API times have second precision.
fn seconds(t: Timestamp) -> Timestamp {
    Timestamp::from_second(t.as_second()).unwrap_or(t)
}

/// A runtime time in unix nanoseconds as an API time; 0 (unset) is `None`.
fn ns_time(ns: i64) -> Option<Time> {
    if ns <= 0 {
        return None;
    }
    Timestamp::from_second(ns.div_euclid(1_000_000_000))
        .ok()
        .map(Time)
}

fn non_empty(s: &str) -> Option<String> {
    (!s.is_empty()).then(|| s.to_string())
}

fn waiting(reason: &str, message: &str) -> ApiState {
    ApiState {
        waiting: Some(ContainerStateWaiting {
            reason: non_empty(reason),
            message: non_empty(message),
        }),
        ..Default::default()
    }
}

/// The API state of one runtime record (upstream `convertContainerStatus`).
fn record_state(r: &runtime::ContainerStatus, container_id: &str) -> ApiState {
    match r.state {
        ContainerState::Running => ApiState {
            running: Some(ContainerStateRunning {
                started_at: ns_time(r.started_at),
            }),
            ..Default::default()
        },
        // A created container is reported as exited, as upstream does: a
        // sync starts every container it creates, so one left created failed
        // to start.
        ContainerState::Created | ContainerState::Exited => {
            let reason = match (r.reason.as_str(), r.state) {
                ("", ContainerState::Exited) if r.exit_code == 0 => Some("Completed".into()),
                ("", ContainerState::Exited) => Some("Error".into()),
                (reason, _) => non_empty(reason),
            };
            ApiState {
                terminated: Some(ContainerStateTerminated {
                    exit_code: r.exit_code,
                    reason,
                    message: non_empty(&r.message),
                    started_at: ns_time(r.started_at),
                    finished_at: ns_time(r.finished_at),
                    container_id: non_empty(container_id),
                    signal: None,
                }),
                ..Default::default()
            }
        }
        ContainerState::Unknown => ApiState {
            waiting: Some(ContainerStateWaiting::default()),
            ..Default::default()
        },
    }
}

/// Whether the next sync would (re)start a container whose newest record is
/// `newest` (upstream `ShouldContainerBeRestarted`); a sidecar is started
/// again whatever the pod's restart policy.
fn should_restart(
    pod: &Pod,
    c: &Container,
    is_init: bool,
    newest: Option<&runtime::ContainerStatus>,
) -> bool {
    if is_init && is_restartable_init(c) {
        return pod.metadata.deletion_timestamp.is_none()
            && newest.is_none_or(|r| r.state != ContainerState::Running);
    }
    runtime::actions::should_restart(pod, newest)
}

/// The statuses of `containers` (spec order), from the runtime's records,
/// the start failures in `ctx` and, for a container without records, its
/// previous API status.
fn container_statuses(
    pod: &Pod,
    rt: &runtime::PodStatus,
    previous: &[ApiContainerStatus],
    containers: &[Container],
    has_inits: bool,
    is_init: bool,
    ctx: &StatusContext,
) -> Vec<ApiContainerStatus> {
    let default_reason = if has_inits {
        POD_INITIALIZING
    } else {
        CONTAINER_CREATING
    };
    let mut out = Vec::with_capacity(containers.len());
    for c in containers {
        let old = previous.iter().find(|s| s.name == c.name);
        let mut records: Vec<&runtime::ContainerStatus> = rt
            .container_statuses
            .iter()
            .filter(|r| r.name == c.name)
            .collect();
        records.sort_by_key(|r| std::cmp::Reverse(r.created_at));
        let newest = records.first().copied();
        let image = c.image.clone().unwrap_or_default();

        let mut st = match newest {
            Some(r) => {
                let cid = format!("{}://{}", ctx.runtime_name, r.id);
                ApiContainerStatus {
                    name: c.name.clone(),
                    image,
                    image_id: r.image_ref.clone(),
                    restart_count: i32::try_from(r.restart_count).unwrap_or(i32::MAX),
                    state: Some(record_state(r, &cid)),
                    // The instance before this one, if the runtime still has it.
                    last_state: Some(
                        records
                            .get(1)
                            .map(|p| record_state(p, &format!("{}://{}", ctx.runtime_name, p.id)))
                            .unwrap_or_default(),
                    ),
                    container_id: Some(cid),
                    ..Default::default()
                }
            }
            // Gone from the runtime after it finished: what was reported stands.
            None if old
                .is_some_and(|o| o.state.as_ref().is_some_and(|s| s.terminated.is_some())) =>
            {
                old.cloned().unwrap_or_default()
            }
            None => ApiContainerStatus {
                name: c.name.clone(),
                image,
                state: Some(waiting(default_reason, "")),
                restart_count: old.map(|o| o.restart_count).unwrap_or(0),
                last_state: Some(old.and_then(|o| o.last_state.clone()).unwrap_or_default()),
                ..Default::default()
            },
        };

        // A container the next sync will (re)start, and whose last start
        // failed, waits with that failure's reason. An init container that
        // succeeded is never started again.
        let init_done = is_init
            && !is_restartable_init(c)
            && newest.is_some_and(|r| r.state == ContainerState::Exited && r.exit_code == 0);
        if !init_done && should_restart(pod, c, is_init, newest) {
            if let Some((reason, message)) = ctx.waiting_reasons.get(&c.name) {
                if st.state.as_ref().is_some_and(|s| s.terminated.is_some()) {
                    st.last_state = st.state.take();
                }
                st.state = Some(waiting(reason, message));
            }
        }

        // A regular init container is ready once it succeeded. A regular
        // container or a sidecar is started when running and its startup
        // probe (if any) succeeded, and ready when started and its
        // readiness probe (if any) did.
        let state = st.state.clone().unwrap_or_default();
        let running = state.running.is_some();
        if is_init && !is_restartable_init(c) {
            st.ready = state.terminated.as_ref().is_some_and(|t| t.exit_code == 0);
            st.started = Some(running);
        } else {
            let passed = |kind: crate::prober::ProbeKind| {
                kind.of(c).is_none()
                    || newest.zip(ctx.probes).is_some_and(|(r, p)| {
                        p.get(&r.id, kind) == Some(crate::prober::ProbeResult::Success)
                    })
            };
            let started = running && passed(crate::prober::ProbeKind::Startup);
            st.started = Some(started);
            st.ready = started && passed(crate::prober::ProbeKind::Readiness);
        }
        out.push(st);
    }
    out
}

/// How getPhase sees one container.
enum Seen {
    Running,
    Terminated(i32),
    /// Waiting, with the exit code of the previous instance if there was one.
    Waiting(Option<i32>),
    Unknown,
}

fn seen(statuses: &[ApiContainerStatus], name: &str) -> Option<Seen> {
    let s = statuses.iter().find(|s| s.name == name)?;
    let state = s.state.as_ref();
    Some(if state.is_some_and(|st| st.running.is_some()) {
        Seen::Running
    } else if let Some(t) = state.and_then(|st| st.terminated.as_ref()) {
        Seen::Terminated(t.exit_code)
    } else if state.is_some_and(|st| st.waiting.is_some()) {
        let last = s
            .last_state
            .as_ref()
            .and_then(|l| l.terminated.as_ref())
            .map(|t| t.exit_code);
        Seen::Waiting(last)
    } else {
        Seen::Unknown
    })
}

/// Whether a regular container of the pod runs or ran (upstream
/// `HasAnyRegularContainerStarted`).
fn any_regular_started(pod: &Pod, statuses: &[ApiContainerStatus]) -> bool {
    let spec = pod.spec.as_ref();
    statuses.iter().any(|s| {
        spec.is_some_and(|sp| sp.containers.iter().any(|c| c.name == s.name))
            && s.state
                .as_ref()
                .is_some_and(|st| st.running.is_some() || st.terminated.is_some())
    })
}

/// The pod phase from its container statuses (upstream `getPhase`).
pub(crate) fn pod_phase(
    pod: &Pod,
    statuses: &[ApiContainerStatus],
    init_statuses: &[ApiContainerStatus],
) -> &'static str {
    let spec = pod.spec.as_ref();
    let policy = restart_policy(pod);
    let inits = spec
        .and_then(|s| s.init_containers.as_deref())
        .unwrap_or(&[]);
    let (mut pending_init, mut failed_init, mut pending_sidecars) = (0, 0, 0);
    let (mut unknown, mut running, mut waiting, mut stopped, mut succeeded) = (0, 0, 0, 0, 0);
    for c in inits {
        let seen = seen(init_statuses, &c.name);
        if is_restartable_init(c) {
            // A sidecar counts as running while it runs; stopped, it counts
            // for nothing; not yet started, it holds the pod in Pending.
            match seen {
                None => unknown += 1,
                Some(Seen::Running) => {
                    let started = init_statuses
                        .iter()
                        .find(|s| s.name == c.name)
                        .is_some_and(|s| s.started == Some(true));
                    if !started {
                        pending_sidecars += 1;
                    }
                    running += 1;
                }
                Some(Seen::Terminated(_)) | Some(Seen::Waiting(Some(_))) => {}
                Some(Seen::Waiting(None)) | Some(Seen::Unknown) => pending_sidecars += 1,
            }
            continue;
        }
        match seen {
            Some(Seen::Terminated(code)) | Some(Seen::Waiting(Some(code))) => {
                if code != 0 {
                    failed_init += 1;
                }
            }
            _ => pending_init += 1,
        }
    }
    for c in spec.map(|s| s.containers.as_slice()).unwrap_or(&[]) {
        match seen(statuses, &c.name) {
            None | Some(Seen::Unknown) => unknown += 1,
            Some(Seen::Running) => running += 1,
            Some(Seen::Terminated(code)) => {
                stopped += 1;
                if code == 0 {
                    succeeded += 1;
                }
            }
            Some(Seen::Waiting(Some(_))) => stopped += 1,
            Some(Seen::Waiting(None)) => waiting += 1,
        }
    }

    if failed_init > 0 && policy == "Never" {
        return FAILED;
    }
    // A sidecar restarting after the pod was initialized does not send it
    // back to Pending.
    if pending_init > 0
        || (pending_sidecars > 0 && !any_regular_started(pod, statuses))
        || waiting > 0
    {
        // Some container has not started yet.
        return PENDING;
    }
    if running > 0 && unknown == 0 {
        return RUNNING;
    }
    if running == 0 && stopped > 0 && unknown == 0 {
        return match policy {
            // Restarting.
            "Always" => RUNNING,
            _ if stopped == succeeded => SUCCEEDED,
            "Never" => FAILED,
            // OnFailure, with a failed container restarting.
            _ => RUNNING,
        };
    }
    PENDING
}

pub(super) fn condition(
    type_: &str,
    status: bool,
    reason: Option<&str>,
    message: Option<String>,
) -> PodCondition {
    PodCondition {
        type_: type_.into(),
        status: if status { "True" } else { "False" }.into(),
        reason: reason.map(str::to_string),
        message,
        ..Default::default()
    }
}

/// Names as Go prints a string slice: `[a b]`.
fn go_list(names: &[&str]) -> String {
    format!("[{}]", names.join(" "))
}

fn initialized_condition(
    pod: &Pod,
    init_statuses: &[ApiContainerStatus],
    statuses: &[ApiContainerStatus],
    phase: &str,
) -> PodCondition {
    let inits = pod
        .spec
        .as_ref()
        .and_then(|s| s.init_containers.as_deref())
        .unwrap_or(&[]);
    let (mut unknown, mut incomplete) = (Vec::new(), Vec::new());
    for c in inits {
        match init_statuses.iter().find(|s| s.name == c.name) {
            // A sidecar counts once it started, a regular init container
            // once it succeeded.
            Some(s) if is_restartable_init(c) && s.started == Some(true) => {}
            Some(s) if !is_restartable_init(c) && s.ready => {}
            Some(_) => incomplete.push(c.name.as_str()),
            None => unknown.push(c.name.as_str()),
        }
    }
    if inits.is_empty() || (phase == SUCCEEDED && unknown.is_empty()) {
        let reason = (!inits.is_empty()).then_some("PodCompleted");
        return condition("Initialized", true, reason, None);
    }
    // A regular container ran: the pod was initialized, even if a sidecar
    // is restarting now.
    if any_regular_started(pod, statuses) {
        return condition("Initialized", true, None, None);
    }
    containers_condition(
        ("Initialized", "ContainersNotInitialized"),
        &unknown,
        ("incomplete", &incomplete),
    )
}

/// ContainersReady: every sidecar and every regular container ready.
fn containers_ready_condition(
    containers: &[Container],
    inits: &[Container],
    statuses: &[ApiContainerStatus],
    init_statuses: &[ApiContainerStatus],
    phase: &str,
) -> PodCondition {
    let (mut unknown, mut unready) = (Vec::new(), Vec::new());
    let sidecars = inits
        .iter()
        .filter(|c| is_restartable_init(c))
        .map(|c| (c, init_statuses));
    for (c, list) in sidecars.chain(containers.iter().map(|c| (c, statuses))) {
        match list.iter().find(|s| s.name == c.name) {
            Some(s) if s.ready => {}
            Some(_) => unready.push(c.name.as_str()),
            None => unknown.push(c.name.as_str()),
        }
    }
    if phase == SUCCEEDED && unknown.is_empty() {
        return condition("ContainersReady", false, Some("PodCompleted"), None);
    }
    containers_condition(
        ("ContainersReady", "ContainersNotReady"),
        &unknown,
        ("unready", &unready),
    )
}

/// A condition `(kind, reason when False)` that is True when no container
/// is in `unknown` or the `(state, names)` list, False with upstream's
/// message otherwise ("containers with unknown status: [a], containers
/// with unready status: [b]").
fn containers_condition(
    (kind, reason): (&str, &str),
    unknown: &[&str],
    (state, names): (&str, &[&str]),
) -> PodCondition {
    let mut msgs = Vec::new();
    if !unknown.is_empty() {
        msgs.push(format!(
            "containers with unknown status: {}",
            go_list(unknown)
        ));
    }
    if !names.is_empty() {
        msgs.push(format!(
            "containers with {state} status: {}",
            go_list(names)
        ));
    }
    if msgs.is_empty() {
        return condition(kind, true, None, None);
    }
    condition(kind, false, Some(reason), Some(msgs.join(", ")))
}

/// Ready follows ContainersReady, then the pod's readiness gates, each
/// of which needs a True condition of its type among `others`.
fn ready_condition(
    pod: &Pod,
    others: &[PodCondition],
    containers_ready: &PodCondition,
) -> PodCondition {
    if containers_ready.status != "True" {
        return PodCondition {
            type_: "Ready".into(),
            ..containers_ready.clone()
        };
    }
    let mut msgs = Vec::new();
    let gates = pod
        .spec
        .as_ref()
        .and_then(|s| s.readiness_gates.as_deref())
        .unwrap_or(&[]);
    for g in gates {
        match others.iter().find(|c| c.type_ == g.condition_type) {
            None => msgs.push(format!(
                "corresponding condition of pod readiness gate {:?} does not exist.",
                g.condition_type
            )),
            Some(c) if c.status != "True" => msgs.push(format!(
                "the status of pod readiness gate {:?} is not \"True\", but {}",
                g.condition_type, c.status
            )),
            Some(_) => {}
        }
    }
    if msgs.is_empty() {
        condition("Ready", true, None, None)
    } else {
        condition(
            "Ready",
            false,
            Some("ReadinessGatesNotReady"),
            Some(msgs.join(", ")),
        )
    }
}

/// `new` with the conditions the kubelet does not own taken from `old`
/// (the server's status) instead, as upstream's `mergePodStatus`: a status
/// patch never changes or removes what other controllers set, such as the
/// conditions of readiness gates. Without `old`, `new` as it is.
pub(crate) fn keep_foreign_conditions(
    old: Option<&ApiPodStatus>,
    new: &ApiPodStatus,
) -> ApiPodStatus {
    let mut out = new.clone();
    let Some(old) = old else {
        return out;
    };
    let owned = |c: &&PodCondition| KUBELET_CONDITIONS.contains(&c.type_.as_str());
    let mut conditions: Vec<PodCondition> = old
        .conditions
        .iter()
        .flatten()
        .filter(|c| !owned(c))
        .cloned()
        .collect();
    conditions.extend(new.conditions.iter().flatten().filter(owned).cloned());
    out.conditions = (new.conditions.is_some() || !conditions.is_empty()).then_some(conditions);
    out
}

/// Whether the Ready condition `pod`'s API status shows disagrees with its
/// readiness gates' conditions there (upstream's
/// `NeedToReconcilePodReadiness`): a controller changed a gate's condition
/// and the pod needs a sync for a new Ready condition.
pub(crate) fn readiness_needs_reconcile(pod: &Pod) -> bool {
    let gated = pod
        .spec
        .as_ref()
        .and_then(|s| s.readiness_gates.as_ref())
        .is_some_and(|g| !g.is_empty());
    let Some(conditions) = pod.status.as_ref().and_then(|s| s.conditions.as_deref()) else {
        return false;
    };
    if !gated {
        return false;
    }
    let find = |t: &str| conditions.iter().find(|c| c.type_ == t);
    let Some(ready) = find("Ready") else {
        return false;
    };
    let containers_ready = find("ContainersReady")
        .cloned()
        .unwrap_or_else(|| condition("ContainersReady", false, None, None));
    let others: Vec<PodCondition> = conditions
        .iter()
        .filter(|c| !KUBELET_CONDITIONS.contains(&c.type_.as_str()))
        .cloned()
        .collect();
    ready_condition(pod, &others, &containers_ready).status != ready.status
}

/// Keeps the old transition time while the condition's status is unchanged.
fn set_transition_time(c: &mut PodCondition, old: Option<&ApiPodStatus>, now: &Time) {
    let prev = old
        .and_then(|o| o.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|p| p.type_ == c.type_));
    c.last_transition_time = match prev {
        Some(p) if p.status == c.status => p.last_transition_time.clone(),
        _ => None,
    }
    .or_else(|| Some(now.clone()));
}

/// The first IP of the node's family, then the first of the other family
/// (upstream `sortPodIPs`). Strings that are not IPs are dropped.
fn sort_pod_ips(ips: &[String], host_ip: Option<&str>) -> Vec<String> {
    let node_v6 = host_ip
        .and_then(|h| h.parse::<IpAddr>().ok())
        .is_some_and(|a| a.is_ipv6());
    let family = |s: &String| s.parse::<IpAddr>().ok().map(|a| a.is_ipv6());
    let mut out = Vec::new();
    for want_v6 in [node_v6, !node_v6] {
        out.extend(ips.iter().find(|ip| family(ip) == Some(want_v6)).cloned());
    }
    out
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::status::patch::status_patch;
    use serde_json::json;

    pub(crate) const APP_ID: &str =
        "865ee0694c66c79568c9cec967468738c5d62d223f4085096d044fc031f795ff";
    pub(crate) const IMAGE_ID: &str =
        "sha256:6d7efc24c273b8160fc28d4376678fa250ef76526d0ad2cdbc0401a99bd9cdb4";

    pub(crate) fn ts(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    pub(crate) fn ns(s: &str) -> i64 {
        i64::try_from(ts(s).as_nanosecond()).unwrap()
    }

    pub(crate) fn time(s: &str) -> Option<Time> {
        Some(Time(ts(s)))
    }

    pub(crate) const T0: &str = "2026-11-22T00:40:00Z";
    pub(crate) const NOW: &str = "2026-11-22T00:48:19Z";

    pub(crate) fn pod(policy: &str, inits: &[&str], names: &[&str]) -> Pod {
        let c = |n: &&str| json!({"name": n, "image": format!("img/{n}:1")});
        serde_json::from_value(json!({
            "metadata": {"name": "web", "namespace": "default", "uid": "u1"},
            "spec": {
                "restartPolicy": policy,
                "initContainers": inits.iter().map(c).collect::<Vec<_>>(),
                "containers": names.iter().map(c).collect::<Vec<_>>(),
            }
        }))
        .unwrap()
    }

    pub(crate) fn rec(
        name: &str,
        id: &str,
        state: ContainerState,
        created: i64,
    ) -> runtime::ContainerStatus {
        runtime::ContainerStatus {
            id: id.into(),
            name: name.into(),
            state,
            created_at: created,
            started_at: if state == ContainerState::Created {
                0
            } else {
                created + 1_500_000_000
            },
            image: format!("img/{name}:1"),
            image_ref: format!("sha256:{name}"),
            ..Default::default()
        }
    }

    pub(crate) fn exited(
        name: &str,
        id: &str,
        code: i32,
        created: i64,
    ) -> runtime::ContainerStatus {
        runtime::ContainerStatus {
            exit_code: code,
            finished_at: created + 5_000_000_000,
            ..rec(name, id, ContainerState::Exited, created)
        }
    }

    pub(crate) fn sandbox(ready: bool) -> api::PodSandboxStatus {
        let mut s = api::PodSandboxStatus::new();
        s.id = "sb".into();
        s.state = if ready {
            api::PodSandboxState::SANDBOX_READY
        } else {
            api::PodSandboxState::SANDBOX_NOTREADY
        }
        .into();
        s
    }

    pub(crate) fn rt(records: Vec<runtime::ContainerStatus>) -> runtime::PodStatus {
        let mut records = records;
        records.sort_by_key(|r| std::cmp::Reverse(r.created_at));
        runtime::PodStatus {
            uid: "u1".into(),
            ips: vec!["10.88.0.6".into()],
            sandbox_statuses: vec![sandbox(true)],
            container_statuses: records,
            ..Default::default()
        }
    }

    pub(crate) fn gen_with(
        pod: &Pod,
        rt: &runtime::PodStatus,
        old: Option<&ApiPodStatus>,
        reasons: &[(&str, &str, &str)],
    ) -> ApiPodStatus {
        let reasons: BTreeMap<String, (String, String)> = reasons
            .iter()
            .map(|(c, r, m)| (c.to_string(), (r.to_string(), m.to_string())))
            .collect();
        let ctx = StatusContext {
            host_ip: Some("10.0.2.15"),
            runtime_name: "containerd",
            waiting_reasons: &reasons,
            now: ts(NOW) + std::time::Duration::from_millis(700),
            probes: None,
        };
        generate_pod_status(pod, rt, old, &ctx)
    }

    pub(crate) fn gen(pod: &Pod, rt: &runtime::PodStatus) -> ApiPodStatus {
        gen_with(pod, rt, None, &[])
    }

    fn cond<'a>(s: &'a ApiPodStatus, t: &str) -> &'a PodCondition {
        s.conditions
            .as_ref()
            .unwrap()
            .iter()
            .find(|c| c.type_ == t)
            .unwrap_or_else(|| panic!("no condition {t}"))
    }

    /// (status, reason, message) of a condition.
    fn crm(s: &ApiPodStatus, t: &str) -> (String, Option<String>, Option<String>) {
        let c = cond(s, t);
        (c.status.clone(), c.reason.clone(), c.message.clone())
    }

    fn own(
        status: &str,
        reason: Option<&str>,
        message: Option<&str>,
    ) -> (String, Option<String>, Option<String>) {
        (
            status.into(),
            reason.map(str::to_string),
            message.map(str::to_string),
        )
    }

    fn cstatus<'a>(s: &'a ApiPodStatus, name: &str) -> &'a ApiContainerStatus {
        s.container_statuses
            .iter()
            .flatten()
            .chain(s.init_container_statuses.iter().flatten())
            .find(|c| c.name == name)
            .unwrap_or_else(|| panic!("no status for {name}"))
    }

    fn waiting_of(c: &ApiContainerStatus) -> Option<(String, Option<String>)> {
        let w = c.state.as_ref()?.waiting.as_ref()?;
        Some((w.reason.clone().unwrap_or_default(), w.message.clone()))
    }

    fn term(st: &Option<ApiState>) -> &ContainerStateTerminated {
        st.as_ref()
            .and_then(|s| s.terminated.as_ref())
            .expect("terminated state")
    }

    // ---- phase ----

    /// An API container status from a short description: "running",
    /// "term:<code>", "wait", "wait-last:<code>".
    fn api_cs(name: &str, d: &str) -> ApiContainerStatus {
        let state = match d.split_once(':') {
            Some(("term", code)) => ApiState {
                terminated: Some(ContainerStateTerminated {
                    exit_code: code.parse().unwrap(),
                    ..Default::default()
                }),
                ..Default::default()
            },
            _ if d == "running" => ApiState {
                running: Some(ContainerStateRunning::default()),
                ..Default::default()
            },
            _ => waiting("CrashLoopBackOff", ""),
        };
        let last_state = match d.split_once(':') {
            Some(("wait-last", code)) => ApiState {
                terminated: Some(ContainerStateTerminated {
                    exit_code: code.parse().unwrap(),
                    ..Default::default()
                }),
                ..Default::default()
            },
            _ => ApiState::default(),
        };
        ApiContainerStatus {
            name: name.into(),
            state: Some(state),
            last_state: Some(last_state),
            ..Default::default()
        }
    }

    #[test]
    fn phase_rules() {
        // (restartPolicy, init containers, containers, phase); "-" means no status.
        #[allow(clippy::type_complexity)]
        let cases: &[(&str, &[(&str, &str)], &[(&str, &str)], &str)] = &[
            ("Always", &[], &[("a", "running")], RUNNING),
            ("Always", &[], &[("a", "wait")], PENDING),
            ("Always", &[], &[("a", "-")], PENDING),
            ("Always", &[], &[("a", "running"), ("b", "-")], PENDING),
            ("Always", &[], &[("a", "running"), ("b", "wait")], PENDING),
            ("Always", &[], &[("a", "term:0")], RUNNING),
            ("Always", &[], &[("a", "term:1")], RUNNING),
            (
                "Always",
                &[],
                &[("a", "running"), ("b", "wait-last:1")],
                RUNNING,
            ),
            ("OnFailure", &[], &[("a", "term:0")], SUCCEEDED),
            ("OnFailure", &[], &[("a", "term:1")], RUNNING),
            ("OnFailure", &[], &[("a", "wait-last:1")], RUNNING),
            ("Never", &[], &[("a", "term:0"), ("b", "term:0")], SUCCEEDED),
            ("Never", &[], &[("a", "term:0"), ("b", "term:2")], FAILED),
            ("Never", &[], &[("a", "term:0"), ("b", "running")], RUNNING),
            ("Never", &[("i", "-")], &[("a", "wait")], PENDING),
            ("Always", &[("i", "running")], &[("a", "wait")], PENDING),
            ("Always", &[("i", "wait")], &[("a", "wait")], PENDING),
            ("Never", &[("i", "term:1")], &[("a", "wait")], FAILED),
            ("Never", &[("i", "wait-last:1")], &[("a", "wait")], FAILED),
            ("Always", &[("i", "term:1")], &[("a", "wait")], PENDING),
            (
                "OnFailure",
                &[("i", "wait-last:1")],
                &[("a", "wait")],
                PENDING,
            ),
            ("Always", &[("i", "term:0")], &[("a", "running")], RUNNING),
            (
                "Never",
                &[("i", "wait-last:0")],
                &[("a", "running")],
                RUNNING,
            ),
            (
                "Never",
                &[("i", "term:0"), ("j", "-")],
                &[("a", "wait")],
                PENDING,
            ),
        ];
        for (policy, inits, containers, want) in cases {
            fn names<'a>(l: &[(&'a str, &str)]) -> Vec<&'a str> {
                l.iter().map(|(n, _)| *n).collect()
            }
            let p = pod(policy, &names(inits), &names(containers));
            let statuses = |l: &[(&str, &str)]| {
                l.iter()
                    .filter(|(_, d)| *d != "-")
                    .map(|(n, d)| api_cs(n, d))
                    .collect::<Vec<_>>()
            };
            assert_eq!(
                pod_phase(&p, &statuses(containers), &statuses(inits)),
                *want,
                "policy {policy}, inits {inits:?}, containers {containers:?}"
            );
        }
    }

    // ---- whole status ----

    #[test]
    fn no_runtime_state_is_pending_and_creating() {
        let p = pod("Always", &[], &["app"]);
        let s = gen(&p, &runtime::PodStatus::default());
        assert_eq!(s.phase.as_deref(), Some(PENDING));
        let c = cstatus(&s, "app");
        assert_eq!(waiting_of(c), Some((CONTAINER_CREATING.into(), None)));
        assert_eq!(
            (c.ready, c.started, c.restart_count),
            (false, Some(false), 0)
        );
        assert_eq!(c.image, "img/app:1");
        assert_eq!(c.image_id, "");
        assert_eq!(c.container_id, None);
        assert_eq!(c.last_state, Some(ApiState::default()));
        assert_eq!(crm(&s, "Initialized"), own("True", None, None));
        let unready = own(
            "False",
            Some("ContainersNotReady"),
            Some("containers with unready status: [app]"),
        );
        assert_eq!(crm(&s, "ContainersReady"), unready);
        assert_eq!(crm(&s, "Ready"), unready);
        assert_eq!(crm(&s, "PodScheduled"), own("True", None, None));
        let types: Vec<&str> = s
            .conditions
            .iter()
            .flatten()
            .map(|c| c.type_.as_str())
            .collect();
        assert_eq!(
            types,
            ["Initialized", "Ready", "ContainersReady", "PodScheduled"]
        );
        for c in s.conditions.iter().flatten() {
            assert_eq!(c.last_transition_time, time(NOW), "{}", c.type_);
            assert_eq!(c.last_probe_time, None);
        }
        assert_eq!(s.start_time, time(NOW), "now, truncated to seconds");
        assert_eq!(s.pod_ip, None);
        assert_eq!(s.pod_ips, None);
        assert_eq!(s.host_ip.as_deref(), Some("10.0.2.15"));
        assert_eq!(s.qos_class.as_deref(), Some("BestEffort"));
        assert_eq!(s.init_container_statuses, None);
    }

    #[test]
    fn running_container() {
        let p = pod("Always", &[], &["app"]);
        let mut r = rec("app", APP_ID, ContainerState::Running, ns(T0));
        r.started_at = ns("2026-11-22T00:41:05Z") + 999_999_999;
        r.image_ref = IMAGE_ID.into();
        r.restart_count = 3;
        let s = gen(&p, &rt(vec![r]));
        assert_eq!(s.phase.as_deref(), Some(RUNNING));
        let c = cstatus(&s, "app");
        assert_eq!(
            c.state
                .as_ref()
                .unwrap()
                .running
                .as_ref()
                .unwrap()
                .started_at,
            time("2026-11-22T00:41:05Z")
        );
        assert_eq!(c.container_id, Some(format!("containerd://{APP_ID}")));
        assert_eq!(c.image_id, IMAGE_ID);
        assert_eq!(c.image, "img/app:1");
        assert_eq!((c.ready, c.started, c.restart_count), (true, Some(true), 3));
        for t in ["Initialized", "Ready", "ContainersReady", "PodScheduled"] {
            assert_eq!(crm(&s, t), own("True", None, None), "{t}");
        }
        assert_eq!(s.pod_ip.as_deref(), Some("10.88.0.6"));
        assert_eq!(
            s.pod_ips,
            Some(vec![PodIP {
                ip: "10.88.0.6".into()
            }])
        );
    }

    #[test]
    fn pod_ips() {
        let p = pod("Always", &[], &["app"]);
        let mut r = rt(vec![rec("app", "c1", ContainerState::Running, 1)]);
        r.sandbox_statuses = vec![sandbox(false)];
        let s = gen(&p, &r);
        assert_eq!((s.pod_ip, s.pod_ips), (None, None), "sandbox not ready");

        r.sandbox_statuses = vec![sandbox(true)];
        r.ips = vec![
            "fd00::1".into(),
            "10.0.0.1".into(),
            "10.0.0.2".into(),
            "junk".into(),
        ];
        let ips = |s: ApiPodStatus| -> Vec<String> {
            s.pod_ips.unwrap().into_iter().map(|i| i.ip).collect()
        };
        assert_eq!(
            ips(gen(&p, &r)),
            ["10.0.0.1", "fd00::1"],
            "node family first"
        );
        let reasons = BTreeMap::new();
        let ctx = StatusContext {
            host_ip: Some("fd00::99"),
            runtime_name: "containerd",
            waiting_reasons: &reasons,
            now: ts(NOW),
            probes: None,
        };
        let s = generate_pod_status(&p, &r, None, &ctx);
        assert_eq!(s.pod_ip.as_deref(), Some("fd00::1"));
        assert_eq!(ips(s), ["fd00::1", "10.0.0.1"]);
    }

    #[test]
    fn host_network_pod_gets_the_host_ip() {
        let mut p = pod("Always", &[], &["app"]);
        p.spec.as_mut().unwrap().host_network = Some(true);
        let mut r = rt(vec![rec("app", "c1", ContainerState::Running, 1)]);
        r.ips.clear();
        let s = gen(&p, &r);
        assert_eq!(s.pod_ip.as_deref(), Some("10.0.2.15"));
        assert_eq!(
            s.pod_ips,
            Some(vec![PodIP {
                ip: "10.0.2.15".into()
            }])
        );
        // Not for a pod on the pod network.
        let s = gen(&pod("Always", &[], &["app"]), &r);
        assert_eq!(s.pod_ip, None);
    }

    #[test]
    fn transition_times_kept_while_status_unchanged() {
        let p = pod("Always", &[], &["app"]);
        let old = ApiPodStatus {
            conditions: Some(vec![
                PodCondition {
                    last_transition_time: time(T0),
                    ..condition("PodScheduled", true, None, None)
                },
                PodCondition {
                    last_transition_time: time(T0),
                    ..condition("Initialized", true, None, None)
                },
                PodCondition {
                    last_transition_time: time(T0),
                    ..condition("Ready", false, Some("ContainersNotReady"), None)
                },
                // Same status, no time recorded: gets one.
                condition("ContainersReady", false, Some("ContainersNotReady"), None),
            ]),
            start_time: time(T0),
            ..Default::default()
        };
        let s = gen_with(&p, &rt(vec![]), Some(&old), &[]);
        assert_eq!(cond(&s, "PodScheduled").last_transition_time, time(T0));
        assert_eq!(cond(&s, "Initialized").last_transition_time, time(T0));
        assert_eq!(cond(&s, "Ready").last_transition_time, time(T0));
        assert_eq!(cond(&s, "ContainersReady").last_transition_time, time(NOW));
        assert_eq!(s.start_time, time(T0), "start time kept");

        // Ready turns True: a new transition time; the others stay.
        let running = rt(vec![rec("app", "c1", ContainerState::Running, 1)]);
        let s2 = gen_with(&p, &running, Some(&old), &[]);
        assert_eq!(crm(&s2, "Ready"), own("True", None, None));
        assert_eq!(cond(&s2, "Ready").last_transition_time, time(NOW));
        assert_eq!(cond(&s2, "Initialized").last_transition_time, time(T0));
        // The pod's own status stands in for a missing `old`.
        let mut p2 = p.clone();
        p2.status = Some(old.clone());
        let s3 = gen(&p2, &running);
        assert_eq!(s3.conditions, s2.conditions);
        assert_eq!(s3.start_time, time(T0));
    }

    #[test]
    fn last_state_is_the_previous_instance() {
        let p = pod("Always", &[], &["app"]);
        let mut first = exited("app", "old1", 1, ns(T0));
        first.message = "boom".into();
        let mut second = rec(
            "app",
            "new2",
            ContainerState::Running,
            ns(T0) + 60_000_000_000,
        );
        second.restart_count = 1;
        // An older third instance is ignored.
        let third = exited("app", "older0", 2, ns(T0) - 60_000_000_000);
        let s = gen(&p, &rt(vec![third, first, second]));
        let c = cstatus(&s, "app");
        assert!(c.state.as_ref().unwrap().running.is_some());
        assert_eq!(c.restart_count, 1);
        assert_eq!(c.container_id.as_deref(), Some("containerd://new2"));
        let last = term(&c.last_state);
        assert_eq!(last.exit_code, 1);
        assert_eq!(last.reason.as_deref(), Some("Error"));
        assert_eq!(last.message.as_deref(), Some("boom"));
        assert_eq!(last.container_id.as_deref(), Some("containerd://old1"));
        assert_eq!(last.started_at, time("2026-11-22T00:40:01Z"));
        assert_eq!(last.finished_at, time("2026-11-22T00:40:05Z"));
        assert!(c.ready);
        assert_eq!(s.phase.as_deref(), Some(RUNNING));
    }

    #[test]
    fn terminated_reasons() {
        let p = pod("Never", &[], &["ok", "bad", "oom", "made"]);
        let mut oom = exited("oom", "c3", 137, 3);
        oom.reason = "OOMKilled".into();
        let s = gen(
            &p,
            &rt(vec![
                exited("ok", "c1", 0, 1),
                exited("bad", "c2", 2, 2),
                oom,
                rec("made", "c4", ContainerState::Created, 4),
            ]),
        );
        let reason = |n: &str| {
            let t = term(&cstatus(&s, n).state);
            (t.exit_code, t.reason.clone())
        };
        assert_eq!(reason("ok"), (0, Some("Completed".into())));
        assert_eq!(reason("bad"), (2, Some("Error".into())));
        assert_eq!(reason("oom"), (137, Some("OOMKilled".into())));
        // A created container that never started is reported as exited.
        assert_eq!(reason("made"), (0, None));
        assert_eq!(term(&cstatus(&s, "made").state).started_at, None);
        for n in ["ok", "bad", "oom", "made"] {
            let c = cstatus(&s, n);
            assert_eq!((c.ready, c.started), (false, Some(false)), "{n}");
        }
        assert_eq!(s.phase.as_deref(), Some(FAILED));
    }

    #[test]
    fn crash_loop_back_off_waits_with_the_exit_as_last_state() {
        let p = pod("Always", &[], &["app"]);
        let mut newest = exited("app", "c2", 1, ns(T0) + 10_000_000_000);
        newest.restart_count = 2;
        let older = exited("app", "c1", 1, ns(T0));
        let msg = "back-off 20s restarting failed container=app pod=web_default(u1)";
        let r = rt(vec![older, newest]);
        let s = gen_with(&p, &r, None, &[("app", "CrashLoopBackOff", msg)]);
        let c = cstatus(&s, "app");
        assert_eq!(
            waiting_of(c),
            Some(("CrashLoopBackOff".into(), Some(msg.into())))
        );
        let last = term(&c.last_state);
        assert_eq!(last.container_id.as_deref(), Some("containerd://c2"));
        assert_eq!(last.exit_code, 1);
        assert_eq!(c.restart_count, 2);
        assert_eq!(c.container_id.as_deref(), Some("containerd://c2"));
        assert!(!c.ready);
        assert_eq!(s.phase.as_deref(), Some(RUNNING));
        assert_eq!(crm(&s, "Ready").0, "False");

        // Without a recorded reason, the exit itself is shown.
        let s = gen(&p, &r);
        assert_eq!(term(&cstatus(&s, "app").state).exit_code, 1);

        // A container that will not restart keeps its terminated state.
        let never = pod("Never", &[], &["app"]);
        let s = gen_with(&never, &r, None, &[("app", "CrashLoopBackOff", msg)]);
        assert!(cstatus(&s, "app")
            .state
            .as_ref()
            .unwrap()
            .terminated
            .is_some());
        assert_eq!(s.phase.as_deref(), Some(FAILED));
        let on_failure_ok = pod("OnFailure", &[], &["app"]);
        let s = gen_with(
            &on_failure_ok,
            &rt(vec![exited("app", "c1", 0, 1)]),
            None,
            &[("app", "CrashLoopBackOff", msg)],
        );
        assert!(cstatus(&s, "app")
            .state
            .as_ref()
            .unwrap()
            .terminated
            .is_some());
        assert_eq!(s.phase.as_deref(), Some(SUCCEEDED));

        // Nor does anything restart in a pod being deleted.
        let mut deleting = p.clone();
        deleting.metadata.deletion_timestamp = time(NOW);
        let s = gen_with(&deleting, &r, None, &[("app", "CrashLoopBackOff", msg)]);
        assert!(cstatus(&s, "app")
            .state
            .as_ref()
            .unwrap()
            .terminated
            .is_some());
    }

    #[test]
    fn start_failure_of_a_new_container() {
        let p = pod("Always", &[], &["app", "side"]);
        let s = gen_with(
            &p,
            &rt(vec![rec("side", "c1", ContainerState::Running, 1)]),
            None,
            &[("app", "ErrImagePull", "pull failed: not found")],
        );
        let c = cstatus(&s, "app");
        assert_eq!(
            waiting_of(c),
            Some(("ErrImagePull".into(), Some("pull failed: not found".into())))
        );
        assert_eq!(c.last_state, Some(ApiState::default()));
        assert_eq!(s.phase.as_deref(), Some(PENDING));
        // A reason for a running container is stale and ignored.
        let s = gen_with(
            &p,
            &rt(vec![rec("side", "c1", ContainerState::Running, 1)]),
            None,
            &[("side", "ErrImagePull", "x")],
        );
        assert!(cstatus(&s, "side")
            .state
            .as_ref()
            .unwrap()
            .running
            .is_some());
    }

    #[test]
    fn init_containers() {
        let p = pod("Always", &["init"], &["app"]);
        let names = |s: &ApiPodStatus| -> Vec<String> {
            s.init_container_statuses
                .iter()
                .flatten()
                .map(|c| c.name.clone())
                .collect()
        };

        // Nothing yet: everything waits for initialization.
        let s = gen(&p, &rt(vec![]));
        assert_eq!(names(&s), ["init"]);
        assert_eq!(
            waiting_of(cstatus(&s, "init")),
            Some((POD_INITIALIZING.into(), None))
        );
        assert_eq!(
            waiting_of(cstatus(&s, "app")),
            Some((POD_INITIALIZING.into(), None))
        );
        assert_eq!(
            crm(&s, "Initialized"),
            own(
                "False",
                Some("ContainersNotInitialized"),
                Some("containers with incomplete status: [init]")
            )
        );
        assert_eq!(s.phase.as_deref(), Some(PENDING));

        // The init container runs.
        let s = gen(&p, &rt(vec![rec("init", "i1", ContainerState::Running, 1)]));
        let i = cstatus(&s, "init");
        assert!(i.state.as_ref().unwrap().running.is_some());
        assert_eq!((i.ready, i.started), (false, Some(true)));
        assert_eq!(
            waiting_of(cstatus(&s, "app")),
            Some((POD_INITIALIZING.into(), None))
        );
        assert_eq!(crm(&s, "Initialized").0, "False");
        assert_eq!(s.phase.as_deref(), Some(PENDING));

        // It succeeded and the app runs; a stale reason for it is ignored.
        let done = rt(vec![
            exited("init", "i1", 0, 1),
            rec("app", "a1", ContainerState::Running, 10_000_000_000),
        ]);
        let s = gen_with(&p, &done, None, &[("init", "CrashLoopBackOff", "x")]);
        let i = cstatus(&s, "init");
        assert_eq!(term(&i.state).reason.as_deref(), Some("Completed"));
        assert_eq!((i.ready, i.started), (true, Some(false)));
        assert_eq!(crm(&s, "Initialized"), own("True", None, None));
        assert_eq!(crm(&s, "Ready"), own("True", None, None));
        assert_eq!(s.phase.as_deref(), Some(RUNNING));

        // A failing init container crash-loops (Always) or fails the pod (Never).
        let failed = rt(vec![exited("init", "i1", 1, 1)]);
        let s = gen_with(
            &p,
            &failed,
            None,
            &[("init", "CrashLoopBackOff", "back-off")],
        );
        let i = cstatus(&s, "init");
        assert_eq!(waiting_of(i).unwrap().0, "CrashLoopBackOff");
        assert_eq!(term(&i.last_state).exit_code, 1);
        assert_eq!(s.phase.as_deref(), Some(PENDING));
        let s = gen(&pod("Never", &["init"], &["app"]), &failed);
        assert_eq!(s.phase.as_deref(), Some(FAILED));

        // Init containers keep spec order.
        let p = pod("Always", &["z", "a"], &["app"]);
        assert_eq!(names(&gen(&p, &rt(vec![]))), ["z", "a"]);
    }

    #[test]
    fn sidecars() {
        // Init containers: a sidecar "side" (restartPolicy Always), then "setup".
        let mut p = pod("Never", &["side", "setup"], &["app"]);
        p.spec.as_mut().unwrap().init_containers.as_mut().unwrap()[0].restart_policy =
            Some("Always".into());

        // Nothing runs yet.
        let s = gen(&p, &rt(vec![]));
        assert_eq!(s.phase.as_deref(), Some(PENDING));

        // The sidecar runs, setup too: still initializing.
        let s = gen(
            &p,
            &rt(vec![
                rec("side", "s1", ContainerState::Running, 1),
                rec("setup", "i1", ContainerState::Running, 2),
            ]),
        );
        assert_eq!(s.phase.as_deref(), Some(PENDING));
        let side = cstatus(&s, "side");
        assert_eq!((side.ready, side.started), (true, Some(true)));
        assert_eq!(
            crm(&s, "Initialized"),
            own(
                "False",
                Some("ContainersNotInitialized"),
                Some("containers with incomplete status: [setup]")
            )
        );

        // setup done, app and sidecar run: Running, all conditions true.
        let up = vec![
            rec("side", "s1", ContainerState::Running, 1),
            exited("setup", "i1", 0, 2),
            rec("app", "a1", ContainerState::Running, 3),
        ];
        let s = gen(&p, &rt(up));
        assert_eq!(s.phase.as_deref(), Some(RUNNING));
        assert_eq!(crm(&s, "Initialized"), own("True", None, None));
        assert_eq!(crm(&s, "ContainersReady"), own("True", None, None));

        // The sidecar crashed and waits for its back-off, even under
        // restartPolicy Never: the pod stays Running and initialized, but
        // not ready.
        let crashed = rt(vec![
            exited("side", "s1", 1, 1),
            exited("setup", "i1", 0, 2),
            rec("app", "a1", ContainerState::Running, 3),
        ]);
        let s = gen_with(
            &p,
            &crashed,
            None,
            &[("side", "CrashLoopBackOff", "back-off 10s")],
        );
        assert_eq!(s.phase.as_deref(), Some(RUNNING));
        assert_eq!(
            waiting_of(cstatus(&s, "side")).unwrap().0,
            "CrashLoopBackOff"
        );
        assert_eq!(crm(&s, "Initialized"), own("True", None, None));
        assert_eq!(
            crm(&s, "ContainersReady"),
            own(
                "False",
                Some("ContainersNotReady"),
                Some("containers with unready status: [side]")
            )
        );

        // The app finished: the pod's phase follows the app alone.
        let done = rt(vec![
            exited("side", "s1", 137, 1),
            exited("setup", "i1", 0, 2),
            exited("app", "a1", 0, 3),
        ]);
        assert_eq!(gen(&p, &done).phase.as_deref(), Some(SUCCEEDED));
    }

    #[test]
    fn regular_containers_sorted_by_name() {
        let p = pod("Always", &[], &["web", "app"]);
        let s = gen(&p, &rt(vec![]));
        let names: Vec<&str> = s
            .container_statuses
            .iter()
            .flatten()
            .map(|c| c.name.as_str())
            .collect();
        assert_eq!(names, ["app", "web"]);
        assert_eq!(
            crm(&s, "ContainersReady").2.as_deref(),
            Some("containers with unready status: [web app]"),
            "spec order in messages"
        );
    }

    #[test]
    fn completed_pod() {
        let p = pod("OnFailure", &["init"], &["app"]);
        let s = gen(
            &p,
            &rt(vec![exited("init", "i1", 0, 1), exited("app", "a1", 0, 2)]),
        );
        assert_eq!(s.phase.as_deref(), Some(SUCCEEDED));
        assert_eq!(
            crm(&s, "Initialized"),
            own("True", Some("PodCompleted"), None)
        );
        assert_eq!(
            crm(&s, "ContainersReady"),
            own("False", Some("PodCompleted"), None)
        );
        assert_eq!(crm(&s, "Ready"), own("False", Some("PodCompleted"), None));
    }

    #[test]
    fn terminal_phase_and_finished_containers_survive_removal() {
        let p = pod("Never", &[], &["app"]);
        let first = gen(&p, &rt(vec![exited("app", "a1", 0, 1)]));
        assert_eq!(first.phase.as_deref(), Some(SUCCEEDED));
        // The runtime removed the container: what was reported stands.
        let s = gen_with(&p, &runtime::PodStatus::default(), Some(&first), &[]);
        assert_eq!(s.phase.as_deref(), Some(SUCCEEDED));
        assert_eq!(s.container_statuses, first.container_statuses);

        // A terminal phase is kept even if the containers say otherwise.
        let old = ApiPodStatus {
            phase: Some(FAILED.into()),
            ..Default::default()
        };
        let s = gen_with(
            &p,
            &rt(vec![rec("app", "a2", ContainerState::Running, 5)]),
            Some(&old),
            &[],
        );
        assert_eq!(s.phase.as_deref(), Some(FAILED));

        // A container that was waiting keeps its restart count and last state.
        let mut old_cs = api_cs("app", "wait-last:3");
        old_cs.restart_count = 4;
        let old = ApiPodStatus {
            container_statuses: Some(vec![old_cs.clone()]),
            ..Default::default()
        };
        let s = gen_with(&pod("Always", &[], &["app"]), &rt(vec![]), Some(&old), &[]);
        let c = cstatus(&s, "app");
        assert_eq!(c.restart_count, 4);
        assert_eq!(c.last_state, old_cs.last_state);
        assert_eq!(waiting_of(c).unwrap().0, CONTAINER_CREATING);
    }

    #[test]
    fn readiness_gates_and_foreign_conditions() {
        let mut p = pod("Always", &[], &["app"]);
        p.spec.as_mut().unwrap().readiness_gates =
            Some(vec![k8s_openapi::api::core::v1::PodReadinessGate {
                condition_type: "example.com/lb".into(),
            }]);
        let running = rt(vec![rec("app", "a1", ContainerState::Running, 1)]);
        let s = gen(&p, &running);
        assert_eq!(
            crm(&s, "Ready"),
            own(
                "False",
                Some("ReadinessGatesNotReady"),
                Some("corresponding condition of pod readiness gate \"example.com/lb\" does not exist.")
            )
        );
        assert_eq!(crm(&s, "ContainersReady").0, "True");

        let gate = |status: bool| ApiPodStatus {
            conditions: Some(vec![PodCondition {
                last_transition_time: time(T0),
                ..condition("example.com/lb", status, None, None)
            }]),
            ..Default::default()
        };
        let s = gen_with(&p, &running, Some(&gate(false)), &[]);
        assert_eq!(
            crm(&s, "Ready").2.as_deref(),
            Some("the status of pod readiness gate \"example.com/lb\" is not \"True\", but False")
        );
        let s = gen_with(&p, &running, Some(&gate(true)), &[]);
        assert_eq!(crm(&s, "Ready"), own("True", None, None));
        // The gate's condition is kept, first and untouched.
        let first = &s.conditions.as_ref().unwrap()[0];
        assert_eq!(first.type_, "example.com/lb");
        assert_eq!(first.last_transition_time, time(T0));
    }

    #[test]
    fn readiness_gates_follow_the_latest_api_pod_not_the_last_report() {
        let mut p = pod("Always", &[], &["app"]);
        p.spec.as_mut().unwrap().readiness_gates =
            Some(vec![k8s_openapi::api::core::v1::PodReadinessGate {
                condition_type: "example.com/lb".into(),
            }]);
        let running = rt(vec![rec("app", "a1", ContainerState::Running, 1)]);
        // What tinylet reported before the controller set the gate.
        let reported = gen(&p, &running);
        assert_eq!(crm(&reported, "Ready").0, "False");
        // The controller's condition, on the API pod the sync loop has now.
        let mut api_status = reported.clone();
        api_status
            .conditions
            .as_mut()
            .unwrap()
            .insert(0, condition("example.com/lb", true, None, None));
        p.status = Some(api_status);
        let s = gen_with(&p, &running, Some(&reported), &[]);
        assert_eq!(crm(&s, "Ready"), own("True", None, None));
        assert!(!readiness_needs_reconcile(&Pod {
            status: Some(s),
            ..p.clone()
        }));
        // The API pod says Ready False while its gate is True: a sync is due.
        assert!(readiness_needs_reconcile(&p));
        // Without gates there is never anything to reconcile.
        p.spec.as_mut().unwrap().readiness_gates = None;
        assert!(!readiness_needs_reconcile(&p));
    }

    #[test]
    fn a_status_patch_keeps_the_conditions_other_controllers_set() {
        let gate = |status: bool| condition("example.com/lb", status, None, None);
        let server = ApiPodStatus {
            conditions: Some(vec![
                gate(true),
                condition("Ready", false, None, None),
                condition("other.io/x", false, None, None),
            ]),
            ..Default::default()
        };
        // A status generated from an older view: the gate still False.
        let new = ApiPodStatus {
            phase: Some(RUNNING.into()),
            conditions: Some(vec![gate(false), condition("Ready", true, None, None)]),
            ..Default::default()
        };
        let merged = keep_foreign_conditions(Some(&server), &new);
        let types: Vec<(&str, &str)> = merged
            .conditions
            .iter()
            .flatten()
            .map(|c| (c.type_.as_str(), c.status.as_str()))
            .collect();
        assert_eq!(
            types,
            [
                ("example.com/lb", "True"),
                ("other.io/x", "False"),
                ("Ready", "True")
            ]
        );
        assert_eq!(merged.phase.as_deref(), Some(RUNNING));
        let patch = status_patch("u1", Some(&server), &merged);
        let changed = patch["status"]["conditions"].as_array().unwrap();
        assert!(
            changed.iter().all(|c| c["type"] == "Ready"),
            "only Ready changes: {patch}"
        );
        assert_eq!(keep_foreign_conditions(None, &new), new);
    }

    #[test]
    fn ephemeral_containers_are_reported_apart_and_never_ready() {
        let mut p = pod("Always", &[], &["app"]);
        p.spec.as_mut().unwrap().ephemeral_containers = Some(
            ["dbg", "aux"]
                .iter()
                .map(|n| k8s_openapi::api::core::v1::EphemeralContainer {
                    name: n.to_string(),
                    image: Some("busybox".into()),
                    ..Default::default()
                })
                .collect(),
        );
        let s = gen(
            &p,
            &rt(vec![
                rec("app", "a1", ContainerState::Running, 1),
                rec("dbg", "d1", ContainerState::Running, 2),
            ]),
        );
        let names: Vec<&str> = s
            .container_statuses
            .iter()
            .flatten()
            .map(|c| c.name.as_str())
            .collect();
        assert_eq!(names, ["app"]);
        let eph = s.ephemeral_container_statuses.as_deref().unwrap();
        let names: Vec<&str> = eph.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["aux", "dbg"], "sorted by name");
        assert_eq!(waiting_of(&eph[0]).unwrap().0, CONTAINER_CREATING);
        assert!(eph[1].state.as_ref().unwrap().running.is_some());
        assert_eq!(eph[1].container_id.as_deref(), Some("containerd://d1"));
        assert!(!eph[1].ready && eph[1].started.is_none());
        // Ephemeral containers leave the pod's phase and readiness alone.
        assert_eq!(s.phase.as_deref(), Some(RUNNING));
        assert_eq!(crm(&s, "Ready").0, "True");
        let patch = status_patch("u1", None, &s);
        assert_eq!(
            patch["status"]["ephemeralContainerStatuses"][1]["name"], "dbg",
            "{patch}"
        );

        // One that exited stays terminated, even after a failed start.
        let s = gen_with(
            &p,
            &rt(vec![
                rec("app", "a1", ContainerState::Running, 1),
                exited("dbg", "d1", 0, 2),
            ]),
            None,
            &[("dbg", "RunContainerError", "boom")],
        );
        let dbg = &s.ephemeral_container_statuses.as_deref().unwrap()[1];
        assert_eq!(term(&dbg.state).exit_code, 0);
    }

    // ---- QoS ----

    #[test]
    fn qos_from_old_status_wins() {
        let p = pod("Always", &[], &["app"]);
        let old = ApiPodStatus {
            qos_class: Some("Burstable".into()),
            ..Default::default()
        };
        let s = gen_with(&p, &rt(vec![]), Some(&old), &[]);
        assert_eq!(s.qos_class.as_deref(), Some("Burstable"));
    }
}
