//! Run-once mode (`--runonce`, upstream `pkg/kubelet/runonce.go`): the pods
//! of the local sources (`--pod-manifest-path`, `--manifest-url`) are read
//! once, started through the usual machinery (sync loop, admission, pod
//! workers, runtime manager, PLEG), and watched until each one runs (all its
//! containers running for [`RUNNING_SETTLE`]) or has failed, up to `--runonce-timeout`. Then one
//! line per pod is printed and tinylet exits, leaving the containers
//! running.
//!
//! Two pieces, wired by `main.rs`:
//! - [`first_sets`] takes the first SET of each source from the sources'
//!   own channel, after which the sources are stopped (no watching);
//! - [`Monitor`], the `runonce` thread, reads each pod's status from the
//!   status reporter every [`POLL`] and ends the sync loop (by dropping its
//!   stop sender) once every pod is decided, the time is up, or a signal
//!   came.
//!
//! Upstream syncs each pod on a goroutine of its own, retrying up to ten
//! times with a doubling delay, counts a pod that admission refused as
//! started, and takes the first update of whichever source speaks first.
//! Here a refused pod is failed (its reason is printed), the wait is
//! bounded by one deadline instead of a retry count, a pod whose container
//! cannot start (an image that cannot be pulled, a container config error,
//! a crash loop, a container that exited for good) is failed as soon as its
//! status says so rather than after the retries, and every local source's
//! first list is used, so that a node with both a manifest path and a URL
//! runs both sets. A pod counts as running only once it has stayed so for
//! [`RUNNING_SETTLE`], where upstream takes the first read that shows it
//! running. As upstream, any pod that does not run makes the exit
//! code non-zero.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{bounded, select, Receiver, Sender};
use k8s_openapi::api::core::v1::{Pod, PodStatus as ApiPodStatus};

use crate::config::{PodOperation, PodUpdate};
use crate::pod::{pod_name, pod_namespace, pod_uid};
use crate::status::manager::StatusReporter;
use crate::thread::{spawn_named, JoinOnDrop};

/// How often the monitor reads the pods' statuses.
pub(crate) const POLL: Duration = Duration::from_millis(200);

/// How long a pod must stay running before it counts as running. A worker
/// reports the status it reads right after starting the containers, so a
/// container that exits at once (`exit 3` under `restartPolicy: Never`) is
/// seen running first; its exit shows after the next PLEG relist (every
/// second). Two relists' time lets that exit decide the pod.
pub(crate) const RUNNING_SETTLE: Duration = Duration::from_secs(2);

/// How a pod ended up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// Every container of the pod is running.
    Running,
    /// It cannot run (the reason, as its status gives it).
    Failed(String),
    /// Still neither when the time was up.
    TimedOut,
    /// A signal stopped tinylet first.
    Interrupted,
}

impl std::fmt::Display for Outcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Outcome::Running => f.write_str("running"),
            Outcome::Failed(reason) => write!(f, "failed: {reason}"),
            Outcome::TimedOut => f.write_str("timed out"),
            Outcome::Interrupted => f.write_str("interrupted"),
        }
    }
}

/// One pod's line: `<namespace>/<name>: <outcome>`.
pub(crate) fn line(pod: &Pod, outcome: &Outcome) -> String {
    format!("{}/{}: {outcome}", pod_namespace(pod), pod_name(pod))
}

/// Waiting reasons after which a container will not run without a change
/// to the pod or the node: the pod is failed at once.
const FAILED_WAITING: &[&str] = &[
    "ErrImagePull",
    "ImagePullBackOff",
    "InvalidImageName",
    "ErrImageNeverPull",
    "RegistryUnavailable",
    "CreateContainerConfigError",
    "CreateContainerError",
    "RunContainerError",
    "PreStartHookError",
    "PostStartHookError",
    "CrashLoopBackOff",
];

/// What `status` says about `pod`: `None` while it may still come to run.
pub(crate) fn judge(pod: &Pod, status: Option<&ApiPodStatus>) -> Option<Outcome> {
    let status = status?;
    let why = |s: &ApiPodStatus| {
        let mut text = s.reason.clone().unwrap_or_default();
        if let Some(m) = s.message.as_deref().filter(|m| !m.is_empty()) {
            if !text.is_empty() {
                text.push_str(": ");
            }
            text.push_str(m);
        }
        text
    };
    match status.phase.as_deref() {
        Some("Failed") => {
            let text = why(status);
            return Some(Outcome::Failed(match container_failure(pod, status) {
                Some(c) if text.is_empty() => c,
                None if text.is_empty() => "pod Failed".into(),
                _ => text,
            }));
        }
        Some("Succeeded") => {
            return Some(Outcome::Failed(
                "pod Succeeded: its containers exited".into(),
            ))
        }
        _ => {}
    }
    let spec = pod.spec.as_ref()?;
    let statuses = status.container_statuses.as_deref().unwrap_or_default();
    let all_running = !spec.containers.is_empty()
        && spec.containers.iter().all(|c| {
            statuses.iter().any(|s| {
                s.name == c.name && s.state.as_ref().is_some_and(|st| st.running.is_some())
            })
        });
    if all_running {
        return Some(Outcome::Running);
    }
    container_failure(pod, status).map(Outcome::Failed)
}

/// A container (init or regular) that will not run: waiting for one of
/// [`FAILED_WAITING`], or exited and not to be restarted by its policy.
fn container_failure(pod: &Pod, status: &ApiPodStatus) -> Option<String> {
    let policy = pod
        .spec
        .as_ref()
        .and_then(|s| s.restart_policy.as_deref())
        .unwrap_or("Always");
    let all = status
        .init_container_statuses
        .iter()
        .flatten()
        .map(|s| (s, true))
        .chain(
            status
                .container_statuses
                .iter()
                .flatten()
                .map(|s| (s, false)),
        );
    for (s, init) in all {
        let Some(state) = &s.state else { continue };
        let kind = if init { "init container" } else { "container" };
        if let Some(w) = &state.waiting {
            let reason = w.reason.as_deref().unwrap_or_default();
            if FAILED_WAITING.contains(&reason) {
                let message = w.message.as_deref().unwrap_or_default();
                return Some(if message.is_empty() {
                    format!("{kind} {}: {reason}", s.name)
                } else {
                    format!("{kind} {}: {reason}: {message}", s.name)
                });
            }
        }
        // A container shown waiting with the exit it last had counts as
        // that exit, as for the pod's phase (a status taken while its pod
        // is being stopped can show it so).
        let last = s.last_state.as_ref().and_then(|l| l.terminated.as_ref());
        let exited = state
            .terminated
            .as_ref()
            .or(last.filter(|_| state.waiting.is_some()));
        if let Some(t) = exited {
            let restarts = match policy {
                "Never" => false,
                "OnFailure" => t.exit_code != 0,
                _ => true,
            };
            // An init container that exited 0 has done its work.
            let done = init && t.exit_code == 0;
            if !restarts && !done {
                let reason = t.reason.as_deref().unwrap_or("Error");
                return Some(format!(
                    "{kind} {} exited with code {} ({reason})",
                    s.name, t.exit_code
                ));
            }
        }
    }
    None
}

/// Takes the first SET of every source in `expected` from `updates`, for
/// at most `wait`. A source that sent none in time is an error naming it.
pub(crate) fn first_sets(
    updates: &Receiver<PodUpdate>,
    expected: &[&str],
    wait: Duration,
) -> Result<Vec<PodUpdate>, String> {
    let deadline = Instant::now() + wait;
    let mut sets: Vec<PodUpdate> = Vec::new();
    while sets.len() < expected.len() {
        let left = deadline.saturating_duration_since(Instant::now());
        match updates.recv_timeout(left) {
            Ok(u) if u.op == PodOperation::Set && !sets.iter().any(|s| s.source == u.source) => {
                sets.push(u)
            }
            Ok(_) => {}
            Err(_) => {
                let missing: Vec<&str> = expected
                    .iter()
                    .filter(|e| !sets.iter().any(|s| s.source == **e))
                    .copied()
                    .collect();
                return Err(format!(
                    "no pods read from the {} source(s) within {}s (see the log above)",
                    missing.join(", "),
                    wait.as_secs()
                ));
            }
        }
    }
    // In the order of `expected`, whatever order they came in.
    sets.sort_by_key(|s| expected.iter().position(|e| *e == s.source));
    Ok(sets)
}

/// The `runonce` thread: watches the pods' statuses and stops the sync loop
/// once each is decided.
pub(crate) struct Monitor {
    thread: JoinOnDrop<Vec<Outcome>>,
}

impl Monitor {
    /// Starts watching `pods` through `reporter` until `timeout` has passed
    /// or `signals` speaks. Returns the monitor and the receiver to give the
    /// sync loop as its stop input: it disconnects when the monitor is done.
    pub(crate) fn start(
        pods: Vec<Arc<Pod>>,
        reporter: StatusReporter,
        timeout: Duration,
        signals: Receiver<()>,
    ) -> std::io::Result<(Monitor, Receiver<()>)> {
        let (stop_tx, stop_rx) = bounded::<()>(1);
        let thread = spawn_named("runonce", move || {
            watch(&pods, &reporter, timeout, &signals, stop_tx)
        })?;
        Ok((Monitor { thread }, stop_rx))
    }

    /// Each pod's outcome, in the order given to `start`.
    pub(crate) fn outcomes(self) -> Vec<Outcome> {
        self.thread.join().unwrap_or_else(|_| {
            log::error!("runonce: the monitor thread panicked");
            Vec::new()
        })
    }
}

/// The outcome of one read: a failure at once, running only once the pod
/// has been seen running since `since` for [`RUNNING_SETTLE`].
fn settle(judged: Option<Outcome>, since: &mut Option<Instant>, now: Instant) -> Option<Outcome> {
    match judged {
        Some(Outcome::Running) => {
            let first = *since.get_or_insert(now);
            (now.duration_since(first) >= RUNNING_SETTLE).then_some(Outcome::Running)
        }
        other => {
            *since = None;
            other
        }
    }
}

fn watch(
    pods: &[Arc<Pod>],
    reporter: &StatusReporter,
    timeout: Duration,
    signals: &Receiver<()>,
    stop: Sender<()>,
) -> Vec<Outcome> {
    let deadline = Instant::now() + timeout;
    let mut outcomes: Vec<Option<Outcome>> = vec![None; pods.len()];
    // When each pod was first seen running, since it was last seen otherwise.
    let mut running_since: Vec<Option<Instant>> = vec![None; pods.len()];
    let last = loop {
        let now = Instant::now();
        for ((pod, outcome), since) in pods
            .iter()
            .zip(outcomes.iter_mut())
            .zip(running_since.iter_mut())
        {
            if outcome.is_some() {
                continue;
            }
            let judged = judge(pod, reporter.status(pod_uid(pod)).as_ref());
            *outcome = settle(judged, since, now);
            if let Some(o) = outcome {
                log::info!("runonce: {}", line(pod, o));
            }
        }
        if outcomes.iter().all(Option::is_some) {
            break Outcome::TimedOut;
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            break Outcome::TimedOut;
        }
        select! {
            recv(signals) -> _ => break Outcome::Interrupted,
            default(left.min(POLL)) => {}
        }
    };
    drop(stop);
    outcomes
        .into_iter()
        .map(|o| o.unwrap_or_else(|| last.clone()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(policy: &str, containers: &[&str]) -> Pod {
        let containers: Vec<_> = containers
            .iter()
            .map(|n| json!({"name": n, "image": "busybox"}))
            .collect();
        serde_json::from_value(json!({
            "metadata": {"name": "web-edge-1", "namespace": "default", "uid": "u1"},
            "spec": {"restartPolicy": policy, "containers": containers}
        }))
        .unwrap()
    }

    fn status(v: serde_json::Value) -> ApiPodStatus {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn running_counts_once_it_held_and_a_failure_at_once() {
        let t0 = Instant::now();
        let s = Duration::from_secs(1);
        let mut since = None;
        assert_eq!(settle(Some(Outcome::Running), &mut since, t0), None);
        assert_eq!(settle(Some(Outcome::Running), &mut since, t0 + s), None);
        // Not running for a moment: the clock starts again.
        assert_eq!(settle(None, &mut since, t0 + s), None);
        assert_eq!(settle(Some(Outcome::Running), &mut since, t0 + 2 * s), None);
        assert_eq!(
            settle(Some(Outcome::Running), &mut since, t0 + 4 * s),
            Some(Outcome::Running)
        );
        let failed = Some(Outcome::Failed("exited".into()));
        assert_eq!(settle(failed.clone(), &mut None, t0), failed);
    }

    #[test]
    fn running_only_when_every_container_runs() {
        let p = pod("Always", &["a", "b"]);
        assert_eq!(judge(&p, None), None);
        let one = status(json!({"phase": "Pending", "containerStatuses": [
            {"name": "a", "image": "", "imageID": "", "ready": true, "restartCount": 0,
             "state": {"running": {}}},
            {"name": "b", "image": "", "imageID": "", "ready": false, "restartCount": 0,
             "state": {"waiting": {"reason": "ContainerCreating"}}}]}));
        assert_eq!(judge(&p, Some(&one)), None);
        let both = status(json!({"phase": "Running", "containerStatuses": [
            {"name": "a", "image": "", "imageID": "", "ready": true, "restartCount": 0,
             "state": {"running": {}}},
            {"name": "b", "image": "", "imageID": "", "ready": false, "restartCount": 0,
             "state": {"running": {}}}]}));
        assert_eq!(judge(&p, Some(&both)), Some(Outcome::Running));
    }

    #[test]
    fn failures_name_the_container_and_the_reason() {
        let p = pod("Always", &["a"]);
        let pull = status(json!({"phase": "Pending", "containerStatuses": [
            {"name": "a", "image": "", "imageID": "", "ready": false, "restartCount": 0,
             "state": {"waiting": {"reason": "ErrImagePull", "message": "not found"}}}]}));
        assert_eq!(
            judge(&p, Some(&pull)),
            Some(Outcome::Failed(
                "container a: ErrImagePull: not found".into()
            ))
        );
        let rejected = status(json!({"phase": "Failed", "reason": "SysctlForbidden",
            "message": "forbidden sysctl"}));
        assert_eq!(
            judge(&p, Some(&rejected)),
            Some(Outcome::Failed("SysctlForbidden: forbidden sysctl".into()))
        );
        // Under Never, an exited container is final even while others run.
        let p = pod("Never", &["a", "b"]);
        let exited = status(json!({"phase": "Running", "containerStatuses": [
            {"name": "a", "image": "", "imageID": "", "ready": false, "restartCount": 0,
             "state": {"terminated": {"exitCode": 3, "reason": "Error"}}},
            {"name": "b", "image": "", "imageID": "", "ready": true, "restartCount": 0,
             "state": {"running": {}}}]}));
        assert_eq!(
            judge(&p, Some(&exited)),
            Some(Outcome::Failed(
                "container a exited with code 3 (Error)".into()
            ))
        );
        let failed = status(json!({"phase": "Failed", "containerStatuses": [
            {"name": "a", "image": "", "imageID": "", "ready": false, "restartCount": 0,
             "state": {"terminated": {"exitCode": 1, "reason": "Error"}}}]}));
        assert_eq!(
            judge(&pod("Never", &["a"]), Some(&failed)),
            Some(Outcome::Failed(
                "container a exited with code 1 (Error)".into()
            ))
        );
        // Failed by an exit the container shows as its last state while
        // it waits (the pod being stopped): still that exit.
        let stopping = status(json!({"phase": "Failed", "containerStatuses": [
            {"name": "a", "image": "", "imageID": "", "ready": false, "restartCount": 0,
             "state": {"waiting": {"reason": "ContainerCreating"}},
             "lastState": {"terminated": {"exitCode": 3, "reason": "Error"}}}]}));
        assert_eq!(
            judge(&pod("Never", &["a"]), Some(&stopping)),
            Some(Outcome::Failed(
                "container a exited with code 3 (Error)".into()
            ))
        );
    }

    #[test]
    fn a_restarting_container_or_a_done_init_container_is_not_a_failure() {
        let p = pod("Always", &["a"]);
        let restarting = status(json!({"phase": "Running",
            "initContainerStatuses": [
            {"name": "init", "image": "", "imageID": "", "ready": true, "restartCount": 0,
             "state": {"terminated": {"exitCode": 0, "reason": "Completed"}}}],
            "containerStatuses": [
            {"name": "a", "image": "", "imageID": "", "ready": false, "restartCount": 0,
             "state": {"terminated": {"exitCode": 1, "reason": "Error"}}}]}));
        assert_eq!(judge(&p, Some(&restarting)), None);
    }

    #[test]
    fn first_sets_takes_one_set_per_source_in_order_or_names_the_silent_one() {
        let (tx, rx) = bounded(4);
        tx.send(PodUpdate::new(PodOperation::Set, "http", vec![]))
            .unwrap();
        tx.send(PodUpdate::new(PodOperation::Set, "file", vec![]))
            .unwrap();
        let sets = first_sets(&rx, &["file", "http"], Duration::from_secs(5)).unwrap();
        let order: Vec<_> = sets.iter().map(|s| s.source.as_str()).collect();
        assert_eq!(order, ["file", "http"]);
        tx.send(PodUpdate::new(PodOperation::Set, "file", vec![]))
            .unwrap();
        let err = first_sets(&rx, &["file", "http"], Duration::from_millis(50)).unwrap_err();
        assert!(err.contains("the http source"), "{err}");
    }
}
