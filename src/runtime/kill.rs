//! The kill path (upstream `killContainer`, `killPodWithSyncResult` and
//! `terminationOrdering`): stopping a pod's containers and its sandbox,
//! the grace period each stop starts from, the preStop hook run within it,
//! and the order in which sidecars stop after the containers they outlive.
//!
//! A container's stop takes the kill's grace period override, else the
//! deletion's, else the pod's (30 s when unset); the preStop hook and the
//! wait for a sidecar's turn come out of it, and StopContainer gets what is
//! left, never less than 2 s. A pod's containers stop in parallel, each on
//! its own `kill/<id>` thread, and its sandboxes after them.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Container, Lifecycle, LifecycleHandler, Pod};
use log::{debug, info, warn};
use parking_lot::{Condvar, Mutex};

use super::actions::is_restartable_init;
use super::{hooks, is_init_container, ContainerState, ContainerStatus, PodStatus, RuntimeManager};
use crate::cri::{api, CriError};
use crate::events::{EventType, ObjectRef};
use crate::pod::pod_full_name;

/// The kubelet's floor for a graceful stop: a shorter grace period is raised to this.
const MIN_GRACE_PERIOD_SECS: i64 = 2;
const DEFAULT_GRACE_PERIOD_SECS: i64 = 30;
/// The longest grace period tinylet waits: a longer one (the API allows up
/// to `i64::MAX` seconds) is cut to a year, so deadlines computed from it
/// never overflow and the runtime gets a timeout it can hold. Upstream
/// passes the number on as is.
pub(crate) const MAX_GRACE_PERIOD_SECS: i64 = 365 * 24 * 3600;

impl RuntimeManager {
    /// Stops one container the way upstream `killContainer` does: a
    /// Killing event, the preStop hook within the grace period, then (for
    /// a sidecar during a pod kill) its turn after the containers it
    /// outlives, and StopContainer with what is left, at least 2 s.
    pub(super) fn kill_container(
        &self,
        pod: &Pod,
        kill: &Kill,
        grace_override: Option<i64>,
        pod_ip: Option<&str>,
        ordering: Option<&TerminationOrdering>,
    ) -> Result<(), CriError> {
        crate::fault::point(
            "container-kill",
            format_args!("{}/{}", pod_full_name(pod), kill.name),
        );
        let spec = container_spec(pod, kill.name).or(kill.restored.as_ref().map(|r| &r.0));
        let message = kill
            .message
            .clone()
            .unwrap_or_else(|| format!("Stopping container {}", kill.name));
        self.recorder.event(
            &ObjectRef::container(pod, kill.name, is_init_container(pod, kill.name)),
            EventType::Normal,
            "Killing",
            message,
        );
        let recorded = kill.restored.as_ref().and_then(|r| r.1);
        let mut grace = grace_period(pod, grace_override.or(recorded));
        if let Some(hook) = spec
            .and_then(|c| c.lifecycle.as_ref())
            .and_then(|l| l.pre_stop.as_ref())
            .filter(|_| grace > 0)
        {
            if let Some(c) = spec {
                grace -= self.run_pre_stop(pod, c, kill.id, hook, pod_ip, grace);
            }
        }
        if let Some(o) = ordering.filter(|_| grace > 0) {
            grace -= o.wait_for_turn(kill.name, grace);
        }
        let grace = grace.max(MIN_GRACE_PERIOD_SECS);
        debug!(
            "pod {}: stopping container {:?} ({:.12}) with grace period {grace}s",
            pod_full_name(pod),
            kill.name,
            kill.id
        );
        let result = match self.runtime.stop_container(kill.id, grace) {
            Err(e) if e.is_not_found() => Ok(()),
            r => r,
        };
        crate::fault::point(
            "container-stopped",
            format_args!("{}/{}", pod_full_name(pod), kill.name),
        );
        if let Some(o) = ordering {
            o.terminated(kill.name);
        }
        result
    }

    /// Runs a preStop hook for at most `grace` seconds on its own thread;
    /// returns the whole seconds it took (all of `grace` if it did not end).
    fn run_pre_stop(
        &self,
        pod: &Pod,
        c: &Container,
        id: &str,
        hook: &LifecycleHandler,
        pod_ip: Option<&str>,
        grace: i64,
    ) -> i64 {
        let who = pod_full_name(pod);
        crate::fault::point("pre-stop", format_args!("{who}/{}", c.name));
        let limit = Duration::from_secs(grace.unsigned_abs());
        let started = self.clock.now();
        let (tx, rx) = crossbeam_channel::bounded(1);
        let job = {
            let (runtime, pod, c, id, hook) = (
                self.runtime.clone(),
                pod.clone(),
                c.clone(),
                id.to_string(),
                hook.clone(),
            );
            let ip = pod_ip.map(str::to_string);
            move || {
                let r = hooks::run(&runtime, &pod, &c, &id, &hook, ip.as_deref(), limit);
                // Capacity 1, one send: never blocks; nobody listening after
                // a time-out is fine.
                let _ = tx.send(r);
            }
        };
        let thread = match crate::thread::spawn_named(format!("prestop/{id:.12}"), job) {
            Ok(t) => t,
            Err(e) => {
                warn!(
                    "pod {who}: container {:?}: cannot run its preStop hook: {e}",
                    c.name
                );
                return 0;
            }
        };
        let deadline = deadline_after(Instant::now(), limit);
        match rx.recv_deadline(deadline) {
            Ok(result) => {
                drop(thread);
                if let Err(message) = result {
                    warn!("pod {who}: container {:?}: {message}", c.name);
                    self.container_event(
                        pod,
                        c,
                        EventType::Warning,
                        "FailedPreStopHook",
                        "PreStopHook failed".into(),
                    );
                }
                let took = self
                    .clock
                    .now()
                    .duration_since(started)
                    .unwrap_or(Duration::ZERO);
                i64::try_from(took.as_secs()).unwrap_or(grace).min(grace)
            }
            Err(_) => {
                info!(
                    "pod {who}: container {:?}: preStop hook did not end within the grace period ({grace}s)",
                    c.name
                );
                // Its exec or request ends on its own deadline.
                thread.detach();
                grace
            }
        }
    }

    /// Stops every container of the pod (in parallel, each with the grace
    /// period, sidecars after the regular containers) and then its
    /// sandboxes. For a pod known only from the runtime, `pod` carries just
    /// its identity and the default grace period applies.
    pub(crate) fn kill_pod(
        &self,
        pod: &Pod,
        status: &PodStatus,
        grace_override: Option<i64>,
    ) -> Result<(), CriError> {
        let mut seen = HashSet::new();
        let running: Vec<&ContainerStatus> = status
            .container_statuses
            .iter()
            .filter(|c| {
                matches!(
                    c.state,
                    ContainerState::Running | ContainerState::Created | ContainerState::Unknown
                )
            })
            .filter(|c| seen.insert(c.id.as_str()))
            .collect();
        let ordering = TerminationOrdering::new(pod, running.iter().map(|c| c.name.as_str()));
        let pod_ip = status.ips.first().map(String::as_str);
        let kills: Vec<Kill> = running
            .iter()
            .map(|c| Kill {
                id: &c.id,
                name: &c.name,
                message: None,
                restored: pod.spec.is_none().then(|| {
                    let lifecycle = c.pre_stop.clone().map(|h| Lifecycle {
                        pre_stop: Some(h),
                        ..Default::default()
                    });
                    let spec = Container {
                        name: c.name.clone(),
                        lifecycle,
                        ..Default::default()
                    };
                    (spec, c.grace_period)
                }),
            })
            .collect();
        let results: Vec<Result<(), CriError>> = crate::thread::scope_named(|s| {
            let handles: Vec<_> = kills
                .iter()
                .map(|k| {
                    let ordering = &ordering;
                    s.spawn(format!("kill/{:.12}", k.id), move || {
                        // Even a stop that panics lets the containers
                        // waiting for its turn go on.
                        let _turn = TurnDone(ordering, k.name);
                        self.kill_container(pod, k, grace_override, pod_ip, Some(ordering))
                    })
                })
                .collect();
            handles
                .into_iter()
                .zip(&kills)
                .map(|(h, k)| match h {
                    // A stop that panicked did not stop its container: the
                    // panic goes on to the pod's worker, which contains it
                    // and stops the pod again.
                    Ok(h) => h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)),
                    // No thread to spare: stop it from this one, without
                    // waiting for a turn that may depend on other threads.
                    Err(_) => {
                        let r = self.kill_container(pod, k, grace_override, pod_ip, None);
                        ordering.terminated(k.name);
                        r
                    }
                })
                .collect()
        });
        for r in results {
            r?;
        }
        let who = pod_full_name(pod);
        crate::fault::point("containers-stopped", &who);
        for s in &status.sandbox_statuses {
            if s.state.enum_value() == Ok(api::PodSandboxState::SANDBOX_READY) {
                match self.runtime.stop_pod_sandbox(&s.id) {
                    Err(e) if !e.is_not_found() => return Err(e),
                    _ => {}
                }
                crate::fault::point("sandbox-stopped", &who);
            }
        }
        Ok(())
    }
}

/// A container to stop: its ID, its name, and the Killing event's message
/// (upstream's "Stopping container NAME" when none).
pub(super) struct Kill<'a> {
    pub(super) id: &'a str,
    pub(super) name: &'a str,
    pub(super) message: Option<String>,
    /// For a pod known only from the runtime: the container as its
    /// annotations describe it (name and preStop hook) and the pod's
    /// recorded grace period.
    pub(super) restored: Option<(Container, Option<i64>)>,
}

/// The order in which a pod's containers stop (upstream
/// `terminationOrdering`): a sidecar waits until the regular containers and
/// the sidecars after it in the spec have stopped. Regular containers never
/// wait.
pub(super) struct TerminationOrdering {
    /// For each sidecar: the containers it outlives.
    after: HashMap<String, Vec<String>>,
    running: Mutex<HashSet<String>>,
    stopped: Condvar,
}

impl TerminationOrdering {
    fn new<'a>(pod: &Pod, running: impl Iterator<Item = &'a str>) -> Self {
        let running: HashSet<String> = running.map(str::to_string).collect();
        let spec = pod.spec.as_ref();
        let regular: Vec<String> = spec
            .map(|s| s.containers.iter().map(|c| c.name.clone()).collect())
            .unwrap_or_default();
        let inits = spec
            .and_then(|s| s.init_containers.as_deref())
            .unwrap_or(&[]);
        let mut after = HashMap::new();
        let mut later_sidecars: Vec<String> = Vec::new();
        for c in inits.iter().rev().filter(|c| is_restartable_init(c)) {
            let mut waits = regular.clone();
            waits.extend(later_sidecars.iter().cloned());
            waits.retain(|n| running.contains(n));
            after.insert(c.name.clone(), waits);
            later_sidecars.push(c.name.clone());
        }
        TerminationOrdering {
            after,
            running: Mutex::new(running),
            stopped: Condvar::new(),
        }
    }

    /// Waits up to `grace` seconds for `name`'s turn; returns the whole
    /// seconds waited.
    fn wait_for_turn(&self, name: &str, grace: i64) -> i64 {
        let Some(waits) = self.after.get(name).filter(|w| !w.is_empty()) else {
            return 0;
        };
        let start = Instant::now();
        let deadline = deadline_after(start, Duration::from_secs(grace.unsigned_abs()));
        let mut running = self.running.lock();
        while waits.iter().any(|n| running.contains(n)) {
            if self.stopped.wait_until(&mut running, deadline).timed_out() {
                break;
            }
        }
        i64::try_from(start.elapsed().as_secs()).unwrap_or(grace)
    }

    fn terminated(&self, name: &str) {
        self.running.lock().remove(name);
        self.stopped.notify_all();
    }
}

/// Marks a container's stop as done when dropped, also by a panic.
struct TurnDone<'a>(&'a TerminationOrdering, &'a str);

impl Drop for TurnDone<'_> {
    fn drop(&mut self) {
        self.0.terminated(self.1);
    }
}

/// The spec of the container (or init container) named `name`.
fn container_spec<'a>(pod: &'a Pod, name: &str) -> Option<&'a Container> {
    let spec = pod.spec.as_ref()?;
    spec.containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
        .find(|c| c.name == name)
}

/// The grace period a container's stop starts from: the kill's override,
/// else the deletion's, else the pod's (30 s when unset, the API default).
/// The preStop hook and the wait for a sidecar's turn come out of it; what
/// is left, at least 2 s, goes to StopContainer. A negative one is 0 and
/// one over [`MAX_GRACE_PERIOD_SECS`] is cut to it.
fn grace_period(pod: &Pod, over: Option<i64>) -> i64 {
    over.or(pod.metadata.deletion_grace_period_seconds)
        .or_else(|| {
            pod.spec
                .as_ref()
                .and_then(|s| s.termination_grace_period_seconds)
        })
        .unwrap_or(DEFAULT_GRACE_PERIOD_SECS)
        .clamp(0, MAX_GRACE_PERIOD_SECS)
}

/// `start + wait`, or `start` plus the longest grace period where that
/// would not fit in an `Instant` (a wait of years ends with tinylet anyway).
fn deadline_after(start: Instant, wait: Duration) -> Instant {
    start
        .checked_add(wait)
        .or_else(|| start.checked_add(Duration::from_secs(MAX_GRACE_PERIOD_SECS.unsigned_abs())))
        .unwrap_or(start)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::fake::{test_pod, ExecBehaviour};
    use crate::runtime::tests::{container, exec_hook, rig};

    fn pre_stop_pod(grace: i64) -> Pod {
        let mut pod = test_pod("u1", "web");
        let spec = pod.spec.as_mut().unwrap();
        spec.termination_grace_period_seconds = Some(grace);
        spec.containers[0].lifecycle = Some(Lifecycle {
            pre_stop: Some(exec_hook("sleep 3")),
            ..Default::default()
        });
        pod
    }

    #[test]
    fn pre_stop_runs_first_and_its_time_comes_out_of_the_grace_period() {
        let r = rig();
        let pod = pre_stop_pod(10);
        r.sync(&pod).unwrap();
        r.fake.set_exec(ExecBehaviour {
            takes_secs: 3,
            ..Default::default()
        });
        r.rm.kill_pod(&pod, &r.status(&pod), None).unwrap();
        assert_eq!(r.fake.execs().len(), 1);
        assert_eq!(r.fake.stops(), vec![("app".to_string(), 7)]);
        let calls = r.fake.calls();
        let exec = calls.iter().position(|c| c == "ExecSync").unwrap();
        let stop = calls.iter().position(|c| c == "StopContainer").unwrap();
        assert!(exec < stop);
        assert_eq!(
            r.event("spec.containers{app}", "Killing"),
            "Stopping container app"
        );

        // The deletion's grace period wins over the pod's; never below 2 s.
        let r = rig();
        let mut pod = pre_stop_pod(10);
        r.sync(&pod).unwrap();
        pod.metadata.deletion_grace_period_seconds = Some(4);
        r.fake.set_exec(ExecBehaviour {
            takes_secs: 3,
            ..Default::default()
        });
        r.rm.kill_pod(&pod, &r.status(&pod), None).unwrap();
        assert_eq!(r.fake.stops(), vec![("app".to_string(), 2)]);
    }

    #[test]
    fn a_huge_grace_period_is_cut_to_a_year_and_never_overflows() {
        // terminationGracePeriodSeconds: i64::MAX with a preStop hook used
        // to panic adding the grace period to an Instant.
        let r = rig();
        let pod = pre_stop_pod(i64::MAX);
        r.sync(&pod).unwrap();
        r.fake.set_exec(ExecBehaviour {
            takes_secs: 1,
            ..Default::default()
        });
        r.rm.kill_pod(&pod, &r.status(&pod), None).unwrap();
        assert_eq!(
            r.fake.stops(),
            vec![("app".to_string(), MAX_GRACE_PERIOD_SECS - 1)]
        );

        // The same through the deletion's grace period and a kill's override.
        let r = rig();
        let mut pod = pre_stop_pod(10);
        r.sync(&pod).unwrap();
        pod.metadata.deletion_grace_period_seconds = Some(i64::MAX);
        r.rm.kill_pod(&pod, &r.status(&pod), None).unwrap();
        assert_eq!(
            r.fake.stops(),
            vec![("app".to_string(), MAX_GRACE_PERIOD_SECS)]
        );
        let r = rig();
        let pod = pre_stop_pod(10);
        r.sync(&pod).unwrap();
        r.rm.kill_pod(&pod, &r.status(&pod), Some(i64::MIN))
            .unwrap();
        assert_eq!(r.fake.stops(), vec![("app".to_string(), 2)]);
        let pod = pre_stop_pod(10);
        assert_eq!(grace_period(&pod, Some(i64::MAX)), MAX_GRACE_PERIOD_SECS);
        assert_eq!(grace_period(&pod, Some(-5)), 0);
        assert!(deadline_after(Instant::now(), Duration::MAX) > Instant::now());
    }

    #[test]
    fn a_pod_known_only_from_the_runtime_stops_with_its_recorded_hook_and_grace() {
        let r = rig();
        let pod = pre_stop_pod(7);
        r.sync(&pod).unwrap();
        r.fake.set_exec(ExecBehaviour {
            takes_secs: 1,
            ..Default::default()
        });
        // What housekeeping has of a pod no source wants: its identity.
        let orphan = Pod {
            metadata: pod.metadata.clone(),
            ..Default::default()
        };
        r.rm.kill_pod(&orphan, &r.status(&pod), None).unwrap();
        assert_eq!(
            r.fake.execs(),
            vec![(
                "app".to_string(),
                vec!["sh".into(), "-c".into(), "sleep 3".into()]
            )]
        );
        assert_eq!(r.fake.stops(), vec![("app".to_string(), 6)]);
    }

    #[test]
    fn a_pre_stop_hook_that_outlives_the_grace_period_is_cut_short() {
        let r = rig();
        let pod = pre_stop_pod(30);
        r.sync(&pod).unwrap();
        r.fake.set_exec(ExecBehaviour {
            blocks: Some(Duration::from_secs(4)),
            ..Default::default()
        });
        let start = Instant::now();
        r.rm.kill_pod(&pod, &r.status(&pod), Some(2)).unwrap();
        let took = start.elapsed();
        assert!(took >= Duration::from_secs(2), "{took:?}");
        assert!(
            took < Duration::from_secs(4),
            "waited for the hook: {took:?}"
        );
        assert_eq!(r.fake.stops(), vec![("app".to_string(), 2)]);
    }

    #[test]
    fn sidecars_stop_after_the_regular_containers_later_sidecar_first() {
        let r = rig();
        let mut pod = test_pod("u1", "web");
        let spec = pod.spec.as_mut().unwrap();
        spec.termination_grace_period_seconds = Some(20);
        spec.init_containers = Some(vec![
            Container {
                restart_policy: Some("Always".into()),
                ..container("side1")
            },
            Container {
                restart_policy: Some("Always".into()),
                ..container("side2")
            },
        ]);
        spec.containers.push(container("other"));
        // The regular containers take a while to stop (a slow preStop hook).
        for c in &mut spec.containers {
            c.lifecycle = Some(Lifecycle {
                pre_stop: Some(exec_hook("sleep 1")),
                ..Default::default()
            });
        }
        for _ in 0..3 {
            r.sync(&pod).unwrap();
        }
        assert!(r.running("app") && r.running("other") && r.running("side2"));
        r.fake.set_exec(ExecBehaviour {
            blocks: Some(Duration::from_millis(300)),
            ..Default::default()
        });
        r.rm.kill_pod(&pod, &r.status(&pod), None).unwrap();
        let order: Vec<String> = r.fake.stops().into_iter().map(|s| s.0).collect();
        assert_eq!(order.len(), 4, "{order:?}");
        assert_eq!(&order[2..], ["side2", "side1"], "{order:?}");
        let calls = r.fake.calls();
        let last_stop = calls.iter().rposition(|c| c == "StopContainer").unwrap();
        let sandbox = calls.iter().position(|c| c == "StopPodSandbox").unwrap();
        assert!(last_stop < sandbox, "the sandbox stops last");
    }
}
