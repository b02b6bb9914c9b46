//! The prober (upstream `pkg/kubelet/prober`): liveness, readiness and
//! startup probes of every pod's containers.
//!
//! Threads: one `prober` thread owns every probe's state ([`worker`]) and a
//! timer heap of their next ticks; the runs themselves (exec, httpGet,
//! tcpSocket: [`run`]) go to `probe-runner/N` threads that the [`pool`]
//! starts as the load needs them and ends after a minute idle. A probe has
//! at most one run out at a time, and a pod at most two: a pod whose probes
//! hang (a day's timeout, a host that drops packets) delays only its own
//! probes, while the others' runs pass its queued ones and get runners of
//! their own (a run out for over a second no longer counts toward the four
//! that fast runs share). Instead of upstream's goroutine per probe: 110
//! pods with two fast probes each keep a few runners, not 220 threads.
//!
//! Data flow:
//! - pod workers send each pod's containers (IDs, running, start time) and
//!   IP after every sync through [`ProberHandle`], a latest-wins table per
//!   pod plus a one-slot wake channel (a full channel means the prober is
//!   woken already), so a worker never waits for the prober;
//! - the prober thread writes standing results into [`ProbeResults`], read
//!   by the runtime manager (a failed liveness or startup probe kills and
//!   restarts the container, on the pod's worker) and by status generation
//!   (`ready`, `started`, the Ready and ContainersReady conditions);
//! - when a readiness or startup result changes, the prober tells the
//!   status manager at once ([`ProbeStatus`], upstream's
//!   `SetContainerReadiness` and `SetContainerStartup`), which generates
//!   the pod's status again from what its worker last reported: no sync is
//!   needed for a readiness flip;
//! - when a liveness or startup result changes, the pod's UID goes to the
//!   sync loop (bounded; when full, the UID is kept and sent again 100 ms
//!   later), and the sync loop has the pod's worker sync it (a failed
//!   probe kills and restarts the container; a sidecar that started lets
//!   the next init container start).

mod pool;
pub mod run;
pub mod spec;
pub mod worker;

use std::collections::{BTreeSet, HashMap};
use std::io;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{bounded, select, Receiver, Sender, TrySendError};
use k8s_openapi::api::core::v1::Pod;
use log::{debug, error, warn};
use parking_lot::Mutex;

use crate::events::EventRecorder;
use crate::pod::{pod_full_name, pod_uid};
use crate::runtime::{ContainerState, PodStatus, RuntimeManager};
use crate::thread::{spawn_named, JoinOnDrop};

pub(crate) use pool::Limits;
use pool::Pool;
pub(crate) use spec::ProbeKind;
pub(crate) use worker::{has_probes, ProbeResult, ProbeResults};
use worker::{Changed, Job, Now, Outcome, PodInput, ProbeId, Probes, SeenContainer};

/// Capacity of the runners' outcome channel.
const DONE_CAPACITY: usize = 64;
/// Capacity of the channel of pod UIDs to the sync loop.
pub(crate) const UPDATES_CAPACITY: usize = 256;
/// How soon UIDs that found the sync loop's channel full are sent again.
const RESEND: Duration = Duration::from_millis(100);
/// The longest the prober thread sleeps with nothing due.
const IDLE: Duration = Duration::from_secs(60);

/// Where a pod's changed readiness or startup result goes at once: the
/// status manager, which takes `results` into the pod's status without a
/// sync. Called on the prober thread; must not block.
pub(crate) trait ProbeStatus: Send {
    fn probe_changed(&self, uid: &str, results: &ProbeResults);
}

/// Pods waiting for the prober thread: latest wins per pod; `None` removes.
struct Inbox {
    pending: Mutex<HashMap<String, Option<PodInput>>>,
    closed: AtomicBool,
    /// Capacity 1: full means the prober is woken already.
    wake: Sender<()>,
}

impl Inbox {
    fn put(&self, uid: &str, input: Option<PodInput>) {
        self.pending.lock().insert(uid.to_string(), input);
        match self.wake.try_send(()) {
            Ok(()) | Err(TrySendError::Full(())) | Err(TrySendError::Disconnected(())) => {}
        }
    }
}

/// What pod workers hold to tell the prober about their pod; cheap to clone.
#[derive(Clone, Default)]
pub(crate) struct ProberHandle {
    /// `None`: no prober (tests); probes never run.
    inbox: Option<Arc<Inbox>>,
    /// The standing results, for pod status (`None` without a prober).
    results: Option<Arc<ProbeResults>>,
}

impl ProberHandle {
    /// The standing probe results (none without a prober).
    pub(crate) fn results(&self) -> Option<&ProbeResults> {
        self.results.as_deref()
    }

    /// A handle that drops everything.
    pub(crate) fn disabled() -> Self {
        ProberHandle {
            inbox: None,
            results: None,
        }
    }

    /// Hands the prober the pod's containers as `status` shows them. A pod
    /// without probes is not sent. `host_ip` is the pod's IP under host
    /// networking (the loopback address when the node's IP is unknown).
    pub(crate) fn update_pod(&self, pod: &Arc<Pod>, status: &PodStatus, host_ip: Option<&str>) {
        let Some(inbox) = &self.inbox else { return };
        if !has_probes(pod) {
            return;
        }
        inbox.put(pod_uid(pod), Some(pod_input(pod, status, host_ip)));
    }

    /// Stops the pod's probes (it is being killed) and drops their results.
    pub(crate) fn remove_pod(&self, pod: &Pod) {
        let Some(inbox) = &self.inbox else { return };
        if has_probes(pod) {
            inbox.put(pod_uid(pod), None);
        }
    }
}

/// What the prober needs of a pod: its IP and the newest instances of its
/// probed containers (regular ones and sidecars).
fn pod_input(pod: &Arc<Pod>, status: &PodStatus, host_ip: Option<&str>) -> PodInput {
    let spec = pod.spec.as_ref();
    let host_network = spec.and_then(|s| s.host_network).unwrap_or(false);
    let pod_ip = if host_network {
        Some(host_ip.unwrap_or("127.0.0.1").to_string())
    } else {
        status.ips.first().cloned()
    };
    let containers = worker::probed_containers(pod)
        .filter_map(|c| status.latest(&c.name))
        .map(|r| SeenContainer {
            name: r.name.clone(),
            id: r.id.clone(),
            running: r.state == ContainerState::Running,
            exited: r.state == ContainerState::Exited,
            started_at: r.started_at,
        })
        .collect();
    PodInput {
        pod: pod.clone(),
        pod_ip,
        containers,
    }
}

/// Handle of the prober thread; dropping it stops the thread (runners end
/// after their current run).
pub(crate) struct Prober {
    inbox: Arc<Inbox>,
    results: Arc<ProbeResults>,
    /// Runner threads there are, as the prober thread last counted them.
    #[cfg(test)]
    runners: Arc<AtomicUsize>,
    thread: Option<JoinOnDrop<()>>,
}

impl Prober {
    /// Starts the prober thread. Standing results go to `results`; a
    /// changed readiness or startup result goes to `status`, the UID of a
    /// pod whose liveness or startup result changed to `updates`. Runs use
    /// `runtime` for exec probes, report failures to `recorder` and go to
    /// runner threads within `limits`.
    pub(crate) fn start(
        runtime: Arc<RuntimeManager>,
        results: Arc<ProbeResults>,
        recorder: EventRecorder,
        status: Option<Box<dyn ProbeStatus>>,
        updates: Sender<String>,
        limits: Limits,
    ) -> io::Result<Prober> {
        let (wake_tx, wake_rx) = bounded(1);
        let inbox = Arc::new(Inbox {
            pending: Mutex::new(HashMap::new()),
            closed: AtomicBool::new(false),
            wake: wake_tx,
        });
        // A runner has at most one outcome out, and the prober thread never
        // waits for a runner: a runner that finds this full waits for the
        // prober thread's next turn.
        let (done_tx, done_rx) = bounded(DONE_CAPACITY);
        let runners = Arc::new(AtomicUsize::new(0));
        let actor = Actor {
            inbox: inbox.clone(),
            probes: Probes::new(results.clone()),
            started: Instant::now(),
            wake: wake_rx,
            status,
            updates,
            unsent: BTreeSet::new(),
            pool: Pool::new(limits),
            runners: Vec::new(),
            count: runners.clone(),
            done_tx,
            done: done_rx,
            runtime,
            recorder,
        };
        let thread = spawn_named("prober", move || actor.run())?;
        Ok(Prober {
            inbox,
            results,
            #[cfg(test)]
            runners,
            thread: Some(thread),
        })
    }

    /// The handle pod workers use.
    pub(crate) fn handle(&self) -> ProberHandle {
        ProberHandle {
            inbox: Some(self.inbox.clone()),
            results: Some(self.results.clone()),
        }
    }

    /// Runner threads there are (idle or busy).
    #[cfg(test)]
    pub(crate) fn runners(&self) -> usize {
        self.runners.load(Ordering::Relaxed)
    }
}

impl Drop for Prober {
    fn drop(&mut self) {
        self.inbox.closed.store(true, Ordering::SeqCst);
        let _ = self.inbox.wake.try_send(());
        drop(self.thread.take());
    }
}

/// A runner thread: its one-slot job channel (dropping it ends the thread
/// once idle) and its handle.
struct RunnerThread {
    jobs: Sender<Job>,
    thread: JoinOnDrop<()>,
}

/// What a runner sends back when a run ends.
struct Done {
    /// The runner's number.
    slot: usize,
    probe: ProbeId,
    outcome: Outcome,
}

struct Actor {
    inbox: Arc<Inbox>,
    probes: Probes,
    started: Instant,
    wake: Receiver<()>,
    /// Where readiness and startup changes go (none in some tests).
    status: Option<Box<dyn ProbeStatus>>,
    /// Pod UIDs to the sync loop; bounded(UPDATES_CAPACITY), see `unsent`.
    updates: Sender<String>,
    /// UIDs that found `updates` full, sent again after `RESEND`.
    unsent: BTreeSet<String>,
    /// Due runs and which runner takes each.
    pool: Pool,
    /// By runner number, as the pool numbers them.
    runners: Vec<Option<RunnerThread>>,
    count: Arc<AtomicUsize>,
    done_tx: Sender<Done>,
    done: Receiver<Done>,
    runtime: Arc<RuntimeManager>,
    recorder: EventRecorder,
}

impl Actor {
    fn run(mut self) {
        debug!("prober started");
        loop {
            let now = Instant::now();
            let due = [self.probes.next_due(), self.pool.wake_at(now)]
                .into_iter()
                .flatten()
                .min();
            let mut wait = due.map_or(IDLE, |t| t.saturating_duration_since(now));
            if !self.unsent.is_empty() {
                wait = wait.min(RESEND);
            }
            let mut changed = Vec::new();
            select! {
                recv(self.wake) -> m => if m.is_err() { break },
                recv(self.done) -> d => if let Ok(d) = d {
                    self.finished(d, &mut changed);
                },
                default(wait) => {}
            }
            if self.inbox.closed.load(Ordering::SeqCst) {
                break;
            }
            while let Ok(d) = self.done.try_recv() {
                self.finished(d, &mut changed);
            }
            let pending = std::mem::take(&mut *self.inbox.pending.lock());
            let now = Now::current();
            let age = now.mono.saturating_duration_since(self.started);
            for (uid, input) in pending {
                match input {
                    Some(input) => self.probes.update_pod(input, now.mono, age),
                    None => {
                        self.probes.remove_pod(&uid);
                        self.pool.remove_pod(&uid);
                    }
                }
            }
            for job in self.probes.due(now, &mut changed) {
                self.pool.push(job);
            }
            self.dispatch(now.mono);
            for slot in self.pool.reap(now.mono) {
                if let Some(r) = self.runners.get_mut(slot).and_then(Option::take) {
                    // Idle: it sees its channel closed and ends at once.
                    drop(r.jobs);
                    r.thread.detach();
                }
            }
            while matches!(self.runners.last(), Some(None)) {
                self.runners.pop();
            }
            self.count.store(self.pool.runners(), Ordering::Relaxed);
            self.notify(changed);
        }
        // Runners end when their job channel closes; one in a long run is
        // not waited for.
        for r in self.runners.drain(..).flatten() {
            drop(r.jobs);
            r.thread.detach();
        }
        debug!("prober stopped");
    }

    fn finished(&mut self, d: Done, changed: &mut Vec<Changed>) {
        let now = Instant::now();
        self.pool.finished(d.slot, now);
        self.probes.complete(d.probe, d.outcome, now, changed);
    }

    /// Hands due runs to runners as the pool says, starting runners.
    fn dispatch(&mut self, now: Instant) {
        while let Some((runner, job)) = self.pool.next(now) {
            let slot = match runner {
                pool::Runner::Idle(slot) => slot,
                pool::Runner::New(slot) => match self.start_runner(slot) {
                    Ok(()) => slot,
                    Err(e) => {
                        warn!("prober: cannot start a probe runner: {e}");
                        self.pool.not_started(slot, job, now);
                        return;
                    }
                },
            };
            // An idle runner's one slot is free: this fails only when its
            // thread is gone, and then another is started for the run.
            let sent = match self.runners.get(slot).and_then(Option::as_ref) {
                Some(r) => r.jobs.try_send(job).map_err(TrySendError::into_inner),
                None => Err(job),
            };
            if let Err(job) = sent {
                warn!("prober: probe runner {slot} is gone");
                if let Some(r) = self.runners.get_mut(slot).and_then(Option::take) {
                    r.thread.detach();
                }
                self.pool.not_started(slot, job, now);
                return;
            }
        }
    }

    fn start_runner(&mut self, slot: usize) -> io::Result<()> {
        let (jobs_tx, jobs) = bounded::<Job>(1);
        let done = self.done_tx.clone();
        let runner = run::Runner::new(self.runtime.clone(), self.recorder.clone());
        let thread = spawn_named(format!("probe-runner/{slot}"), move || {
            for job in jobs.iter() {
                // A panic in a run ends that run, not the runner.
                let outcome = std::panic::catch_unwind(AssertUnwindSafe(|| runner.run(&job)))
                    .unwrap_or_else(|_| {
                        error!(
                            "prober: the {} probe of pod {} panicked",
                            job.kind.name(),
                            pod_full_name(&job.pod)
                        );
                        Outcome::Error
                    });
                let d = Done {
                    slot,
                    probe: job.probe,
                    outcome,
                };
                if done.send(d).is_err() {
                    return;
                }
            }
        })?;
        if self.runners.len() <= slot {
            self.runners.resize_with(slot + 1, || None);
        }
        self.runners[slot] = Some(RunnerThread {
            jobs: jobs_tx,
            thread,
        });
        Ok(())
    }

    fn notify(&mut self, changed: Vec<Changed>) {
        let mut status_told = BTreeSet::new();
        for (uid, kind) in changed {
            debug!(
                "prober: a {} probe result of pod {uid} changed",
                kind.name()
            );
            if kind != ProbeKind::Liveness && !status_told.contains(&uid) {
                if let Some(status) = &self.status {
                    status.probe_changed(&uid, self.probes.results());
                }
                status_told.insert(uid.clone());
            }
            // A readiness change needs no sync: the status manager has it.
            if kind != ProbeKind::Readiness {
                self.unsent.insert(uid);
            }
        }
        while let Some(uid) = self.unsent.pop_first() {
            match self.updates.try_send(uid) {
                Ok(()) => {}
                Err(TrySendError::Full(uid)) => {
                    self.unsent.insert(uid);
                    return;
                }
                Err(TrySendError::Disconnected(_)) => {
                    self.unsent.clear();
                    return;
                }
            }
        }
    }
}

pub(crate) use crate::runtime::actions::ProbeKill;

impl crate::runtime::actions::ProbeKills for ProbeResults {
    fn probe_kills(&self, pod: &Pod, status: &PodStatus) -> Vec<ProbeKill> {
        failed_probe_kills(pod, status, self)
    }
}

/// SyncPod holds the next init container back until a sidecar's startup
/// probe succeeded.
impl crate::runtime::actions::StartupResults for ProbeResults {
    fn startup(&self, container_id: &str) -> crate::runtime::actions::StartupResult {
        use crate::runtime::actions::StartupResult;
        match self.get(container_id, ProbeKind::Startup) {
            Some(ProbeResult::Success) => StartupResult::Success,
            Some(ProbeResult::Failure) => StartupResult::Failure,
            _ => StartupResult::Unknown,
        }
    }
}

/// The running containers whose liveness (or else startup) probe stands
/// at Failure.
pub(crate) fn failed_probe_kills(
    pod: &Pod,
    status: &PodStatus,
    results: &ProbeResults,
) -> Vec<ProbeKill> {
    let Some(spec) = pod.spec.as_ref() else {
        return Vec::new();
    };
    let restart = spec.restart_policy.as_deref() != Some("Never");
    let mut out = Vec::new();
    // Regular containers by index, then sidecars: a killed sidecar is
    // started again by the next sync, whatever the pod's policy.
    let regular = spec
        .containers
        .iter()
        .enumerate()
        .map(|(i, c)| (Some(i), c));
    let sidecars = spec
        .init_containers
        .iter()
        .flatten()
        .filter(|c| crate::runtime::actions::is_restartable_init(c))
        .map(|c| (None, c));
    for (index, c) in regular.chain(sidecars) {
        let restart = restart || index.is_none();
        let Some(s) = status.latest(&c.name) else {
            continue;
        };
        if s.state != ContainerState::Running {
            continue;
        }
        let failed = |k: ProbeKind| results.get(&s.id, k) == Some(ProbeResult::Failure);
        let (kind, what) = if failed(ProbeKind::Liveness) {
            (ProbeKind::Liveness, "liveness")
        } else if failed(ProbeKind::Startup) {
            (ProbeKind::Startup, "startup")
        } else {
            continue;
        };
        let mut message = format!("Container {} failed {what} probe", c.name);
        if restart {
            message.push_str(", will be restarted");
        }
        out.push(ProbeKill {
            index,
            id: s.id.clone(),
            name: c.name.clone(),
            message,
            restart,
            grace: kind.of(c).and_then(|p| p.termination_grace_period_seconds),
        });
    }
    if !out.is_empty() {
        debug!("pod {}: probe kills {out:?}", pod_full_name(pod));
    }
    out
}

#[cfg(test)]
mod tests;
