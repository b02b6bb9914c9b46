//! The pod lifecycle event generator (upstream `pleg/generic.go`) and the pod
//! status cache the pod workers read from.
//!
//! A relist thread lists all sandboxes and containers, diffs each
//! container's state against the previous relist, and for every pod that
//! changed re-inspects it into the cache (unless the cache already agrees:
//! a pod worker puts the status it read after its own changes there) and
//! sends lifecycle events to the sync loop. It relists every second, or,
//! while the runtime's event stream is up, after each event and every 30 s
//! (`watch`).
//!
//! Assumption, as upstream: a container is not created, exited and removed
//! all within one relist period; if it is, that change is missed here and the
//! periodic resync of the pod workers is the safety net.
//!
//! While the runtime does not answer, the relist is the one place that says
//! so: one warning when it goes down, a reminder once a minute, one line
//! when it is back, and relists spaced out up to [`MAX_RELIST_BACKOFF`]
//! meanwhile. The cache is not refreshed during an outage, so pod workers
//! wait for it instead of failing their syncs one by one.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{at, select, Receiver, Sender, TrySendError};
use log::{debug, info, warn};
use parking_lot::{Condvar, Mutex};

use crate::cri::CriError;

mod watch;

use crate::runtime::{ContainerState, PodStatus, RuntimeManager, RuntimePod};
use crate::thread::{spawn_named, JoinOnDrop};
pub(crate) use watch::EVENTED_RELIST_PERIOD;
use watch::{EventWatch, Schedule, Signals};

/// How often the runtime is listed (upstream: 1 s).
pub(crate) const RELIST_PERIOD: Duration = Duration::from_secs(1);
/// Longest wait between relists while they fail (the period doubles from
/// [`RELIST_PERIOD`] up to this): a restarted runtime is seen within it.
pub(crate) const MAX_RELIST_BACKOFF: Duration = Duration::from_secs(5);
/// How often a runtime that stays down is mentioned again in the log.
pub(crate) const RUNTIME_DOWN_REMINDER: Duration = Duration::from_secs(60);
/// Capacity of the events channel (upstream: 1000). When it is full, a
/// relist's events are dropped with a log line; the resync catches up.
pub(crate) const EVENTS_CAPACITY: usize = 1000;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PodLifecycleEventType {
    ContainerStarted,
    ContainerDied,
    ContainerRemoved,
    ContainerChanged,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PodLifecycleEvent {
    pub(crate) uid: String,
    pub(crate) kind: PodLifecycleEventType,
    /// The container (or sandbox) the event is about.
    pub(crate) data: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PlegState {
    Running,
    Exited,
    Unknown,
    Absent,
}

fn pleg_state(s: ContainerState) -> PlegState {
    match s {
        ContainerState::Running => PlegState::Running,
        ContainerState::Exited => PlegState::Exited,
        // Created containers are not acted on yet: treat them as unknown.
        ContainerState::Created | ContainerState::Unknown => PlegState::Unknown,
    }
}

fn state_of(pod: Option<&RuntimePod>, id: &str) -> PlegState {
    pod.into_iter()
        .flat_map(|p| p.containers.iter().chain(&p.sandboxes))
        .find(|c| c.id == id)
        .map(|c| pleg_state(c.state))
        .unwrap_or(PlegState::Absent)
}

/// The events between two relists of one pod.
pub(crate) fn compute_events(
    uid: &str,
    old: Option<&RuntimePod>,
    new: Option<&RuntimePod>,
) -> Vec<PodLifecycleEvent> {
    let mut ids: Vec<&str> = Vec::new();
    for p in [old, new].into_iter().flatten() {
        for c in p.containers.iter().chain(&p.sandboxes) {
            if !ids.contains(&c.id.as_str()) {
                ids.push(&c.id);
            }
        }
    }
    let mut events = Vec::new();
    let mut ev = |kind, id: &str| {
        events.push(PodLifecycleEvent {
            uid: uid.to_string(),
            kind,
            data: id.to_string(),
        })
    };
    for id in ids {
        let (before, after) = (state_of(old, id), state_of(new, id));
        if before == after {
            continue;
        }
        use PodLifecycleEventType::*;
        match after {
            PlegState::Running => ev(ContainerStarted, id),
            PlegState::Exited => ev(ContainerDied, id),
            PlegState::Unknown => ev(ContainerChanged, id),
            PlegState::Absent => {
                if before != PlegState::Exited {
                    ev(ContainerDied, id);
                }
                ev(ContainerRemoved, id);
            }
        }
    }
    events
}

struct CacheEntry {
    status: Arc<PodStatus>,
    error: Option<String>,
    modified: Instant,
}

#[derive(Default)]
struct CacheInner {
    pods: HashMap<String, CacheEntry>,
    /// Every entry is at least this fresh (the start of the last relist).
    timestamp: Option<Instant>,
    /// The pods found by the last relist, for housekeeping.
    runtime_pods: Arc<Vec<RuntimePod>>,
    closed: bool,
    /// Asks the relist thread for a relist (bounded(1)); set by the PLEG.
    wanted: Option<Sender<()>>,
}

/// The pod status cache (upstream `kubecontainer.Cache`). Written by the
/// relist thread, read by pod workers; `get_newer_than` blocks a worker
/// until the cache holds a status at least as new as its last sync.
#[derive(Default)]
pub struct PodCache {
    inner: Mutex<CacheInner>,
    changed: Condvar,
}

/// A status read from the cache: the status, or why it could not be read.
pub(crate) type CachedStatus = (Arc<PodStatus>, Option<String>);

/// How a wait for a fresh status ended.
pub(crate) enum Wait {
    Fresh(CachedStatus),
    /// The caller's abort condition held (e.g. a kill arrived).
    Aborted,
    /// The cache was closed (shutdown).
    Closed,
}

impl PodCache {
    pub(crate) fn new() -> Arc<Self> {
        Arc::new(PodCache::default())
    }

    pub(crate) fn get(&self, uid: &str) -> CachedStatus {
        let inner = self.inner.lock();
        Self::read(&inner, uid)
    }

    fn read(inner: &CacheInner, uid: &str) -> CachedStatus {
        match inner.pods.get(uid) {
            Some(e) => (e.status.clone(), e.error.clone()),
            None => (
                Arc::new(PodStatus {
                    uid: uid.to_string(),
                    ..Default::default()
                }),
                None,
            ),
        }
    }

    /// Waits until the cache's view of `uid` is newer than `min` (any view
    /// when `min` is `None` once the first relist finished). `None` once the
    /// cache is closed.
    pub fn get_newer_than(&self, uid: &str, min: Option<Instant>) -> Option<CachedStatus> {
        match self.wait_newer_than(uid, min, &|| false) {
            Wait::Fresh(s) => Some(s),
            Wait::Aborted | Wait::Closed => None,
        }
    }

    /// Like `get_newer_than`, but gives up when `abort` says so; `abort` is
    /// checked whenever the cache changes or [`PodCache::interrupt`] is called.
    pub(crate) fn wait_newer_than(
        &self,
        uid: &str,
        min: Option<Instant>,
        abort: &dyn Fn() -> bool,
    ) -> Wait {
        let mut inner = self.inner.lock();
        loop {
            if inner.closed {
                return Wait::Closed;
            }
            let fresh = |t: Instant| min.is_none_or(|m| t >= m);
            let entry_fresh = inner.pods.get(uid).is_some_and(|e| fresh(e.modified));
            let global_fresh = inner.timestamp.is_some_and(fresh);
            if entry_fresh || global_fresh {
                return Wait::Fresh(Self::read(&inner, uid));
            }
            if abort() {
                return Wait::Aborted;
            }
            // Relists may be 30 s apart: this one is asked for.
            if let Some(w) = &inner.wanted {
                let _ = w.try_send(());
            }
            self.changed.wait(&mut inner);
        }
    }

    /// Wakes every waiter to re-check its abort condition.
    pub(crate) fn interrupt(&self) {
        let _guard = self.inner.lock();
        self.changed.notify_all();
    }

    /// Stores `status` as read at `at`, unless the entry holds a newer one
    /// (the relist thread and the pod's worker both write here).
    pub(crate) fn set(&self, uid: &str, status: PodStatus, error: Option<String>, at: Instant) {
        let mut inner = self.inner.lock();
        if inner.pods.get(uid).is_some_and(|e| e.modified > at) {
            return;
        }
        inner.pods.insert(
            uid.to_string(),
            CacheEntry {
                status: Arc::new(status),
                error,
                modified: at,
            },
        );
        drop(inner);
        self.changed.notify_all();
    }

    /// When the entry of `uid` was read from the runtime, if there is one.
    pub(crate) fn modified(&self, uid: &str) -> Option<Instant> {
        self.inner.lock().pods.get(uid).map(|e| e.modified)
    }

    /// The entry of `uid`, if it is a status without an error.
    fn status_of(&self, uid: &str) -> Option<Arc<PodStatus>> {
        let inner = self.inner.lock();
        inner
            .pods
            .get(uid)
            .filter(|e| e.error.is_none())
            .map(|e| e.status.clone())
    }

    /// Marks the entry of `uid` as current at `at` (a relist that started
    /// then found it unchanged).
    fn touch(&self, uid: &str, at: Instant) {
        let mut inner = self.inner.lock();
        if let Some(e) = inner.pods.get_mut(uid) {
            if e.modified < at {
                e.modified = at;
            }
        }
        drop(inner);
        self.changed.notify_all();
    }

    pub(crate) fn delete(&self, uid: &str) {
        let mut inner = self.inner.lock();
        inner.pods.remove(uid);
        crate::malloc::shrink_map(&mut inner.pods);
    }

    /// Marks every entry as fresh as of `at` and publishes the relist.
    pub(crate) fn update_time(&self, at: Instant, runtime_pods: Arc<Vec<RuntimePod>>) {
        let mut inner = self.inner.lock();
        inner.timestamp = Some(at);
        inner.runtime_pods = runtime_pods;
        drop(inner);
        self.changed.notify_all();
    }

    /// The pods found by the last relist and when it started.
    pub(crate) fn runtime_pods(&self) -> (Option<Instant>, Arc<Vec<RuntimePod>>) {
        let inner = self.inner.lock();
        (inner.timestamp, inner.runtime_pods.clone())
    }

    /// The IDs of the containers the last relist found running.
    pub(crate) fn running_container_ids(&self) -> Vec<String> {
        let pods = self.inner.lock().runtime_pods.clone();
        pods.iter()
            .flat_map(|p| &p.containers)
            .filter(|c| c.state == ContainerState::Running)
            .map(|c| c.id.clone())
            .collect()
    }

    /// Wakes every waiter for good (shutdown).
    pub(crate) fn close(&self) {
        self.inner.lock().closed = true;
        self.changed.notify_all();
    }
}

/// Handle of the relist thread (and of the `runtime-events` thread that
/// follows the runtime's events); dropping it stops both.
pub(crate) struct Pleg {
    stop: Option<Sender<()>>,
    _thread: JoinOnDrop<()>,
    _events: Option<EventWatch>,
}

impl Pleg {
    /// Starts the relist thread, and the thread that follows the runtime's
    /// events (with which relists are 30 s apart while it is up); stamps
    /// `health` after each successful relist and publishes the runtime's
    /// pods to `running` when they change.
    pub(crate) fn start_with(
        runtime: Arc<RuntimeManager>,
        cache: Arc<PodCache>,
        period: Duration,
        events: Sender<PodLifecycleEvent>,
        health: Option<Arc<crate::health::Health>>,
        running: Option<Arc<RunningPods>>,
    ) -> std::io::Result<Pleg> {
        let (stop_tx, stop_rx) = crossbeam_channel::bounded(0);
        let (changed_tx, changed_rx) = crossbeam_channel::bounded(1);
        let (exited_tx, exited_rx) = crossbeam_channel::bounded(1);
        let (wanted_tx, wanted_rx) = crossbeam_channel::bounded(1);
        let live = Arc::new(AtomicBool::new(false));
        cache.inner.lock().wanted = Some(wanted_tx);
        let watch = EventWatch::start(
            runtime.runtime().clone(),
            changed_tx,
            exited_tx,
            live.clone(),
            period,
        )?;
        let signals = Signals {
            changed: changed_rx,
            exited: exited_rx,
            wanted: wanted_rx,
            live,
        };
        let actor = Relister {
            runtime,
            cache,
            events,
            records: HashMap::new(),
            reinspect: HashSet::new(),
            health,
            running,
        };
        let thread = spawn_named("pleg", move || actor.run(period, stop_rx, signals))?;
        Ok(Pleg {
            stop: Some(stop_tx),
            _thread: thread,
            _events: Some(watch),
        })
    }
}

impl Drop for Pleg {
    fn drop(&mut self) {
        self.stop.take();
    }
}

struct Relister {
    runtime: Arc<RuntimeManager>,
    cache: Arc<PodCache>,
    events: Sender<PodLifecycleEvent>,
    /// The previous relist's view of each pod.
    records: HashMap<String, RuntimePod>,
    /// Pods whose inspection failed; tried again on the next relist.
    reinspect: HashSet<String>,
    health: Option<Arc<crate::health::Health>>,
    running: Option<Arc<RunningPods>>,
}

impl Relister {
    /// Whether the cached status of `uid` has exactly the sandboxes and
    /// containers `listed` has, in the same states.
    fn cache_agrees(&self, uid: &str, listed: &RuntimePod) -> bool {
        self.cache
            .status_of(uid)
            .is_some_and(|st| status_agrees(&st, listed))
    }
}

/// Whether `status` shows what the list shows of the pod: the same sandbox
/// and container IDs, each in the same state.
pub(crate) fn status_agrees(status: &PodStatus, listed: &RuntimePod) -> bool {
    use crate::cri::api::PodSandboxState;
    let sandboxes = status.sandbox_statuses.len() == listed.sandboxes.len()
        && listed.sandboxes.iter().all(|l| {
            status.sandbox_statuses.iter().any(|s| {
                let ready = s.state.enum_value() == Ok(PodSandboxState::SANDBOX_READY);
                s.id == l.id && ready == (l.state == ContainerState::Running)
            })
        });
    let containers = status.container_statuses.len() == listed.containers.len()
        && listed.containers.iter().all(|l| {
            status
                .container_statuses
                .iter()
                .any(|c| c.id == l.id && c.state == l.state)
        });
    sandboxes && containers
}

/// The pods the runtime ran at the last relist, for the node API's
/// `/runningpods/`: replaced as a whole when they change.
#[derive(Default)]
pub(crate) struct RunningPods(Mutex<Arc<Vec<RuntimePod>>>);

impl RunningPods {
    pub(crate) fn pods(&self) -> Arc<Vec<RuntimePod>> {
        self.0.lock().clone()
    }

    fn publish(&self, pods: &[RuntimePod]) {
        let mut cur = self.0.lock();
        if cur.as_slice() != pods {
            *cur = Arc::new(pods.to_vec());
        }
    }
}

/// A log line the relist owes about the runtime's health.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum HealthNote {
    /// The first failed relist: the runtime is down (or refuses to list).
    Down(String),
    /// Still failing, `RUNTIME_DOWN_REMINDER` after the last line.
    StillDown(Duration, String),
    /// A relist worked again after this long and this many failures.
    Back(Duration, u32),
}

impl std::fmt::Display for HealthNote {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HealthNote::Down(e) => write!(
                f,
                "container runtime is down: {e}; pod syncs wait for it, relisting every {}s at most",
                MAX_RELIST_BACKOFF.as_secs()
            ),
            HealthNote::StillDown(d, e) => write!(
                f,
                "container runtime still down after {}s: {e}",
                d.as_secs()
            ),
            HealthNote::Back(d, n) => write!(
                f,
                "container runtime is back after {:.1}s ({n} failed relists)",
                d.as_secs_f64()
            ),
        }
    }
}

/// The runtime's health as the relists see it: pure, stepped with the
/// time of each relist, so tests need no clock.
#[derive(Debug, Default)]
pub(crate) struct RuntimeHealth {
    down_since: Option<Instant>,
    last_note: Option<Instant>,
    failures: u32,
}

impl RuntimeHealth {
    /// A relist failed at `now` with `error`: what to log (None: only a
    /// debug line) and how long to wait before the next relist.
    pub(crate) fn failed(
        &mut self,
        now: Instant,
        error: &str,
        period: Duration,
    ) -> (Option<HealthNote>, Duration) {
        self.failures = self.failures.saturating_add(1);
        let delay = period
            .saturating_mul(1u32 << self.failures.min(8))
            .min(MAX_RELIST_BACKOFF.max(period));
        let Some(since) = self.down_since else {
            self.down_since = Some(now);
            self.last_note = Some(now);
            return (Some(HealthNote::Down(error.to_string())), delay);
        };
        let due = self
            .last_note
            .is_none_or(|t| now.saturating_duration_since(t) >= RUNTIME_DOWN_REMINDER);
        if due {
            self.last_note = Some(now);
            let down_for = now.saturating_duration_since(since);
            return (
                Some(HealthNote::StillDown(down_for, error.to_string())),
                delay,
            );
        }
        (None, delay)
    }

    /// A relist worked at `now`: the line saying the runtime is back, if
    /// it was down.
    pub(crate) fn succeeded(&mut self, now: Instant) -> Option<HealthNote> {
        let since = self.down_since.take()?;
        let failures = std::mem::take(&mut self.failures);
        self.last_note = None;
        Some(HealthNote::Back(
            now.saturating_duration_since(since),
            failures,
        ))
    }
}

impl Relister {
    fn run(mut self, period: Duration, stop: Receiver<()>, signals: Signals) {
        let mut health = RuntimeHealth::default();
        let mut last_relist: Option<Instant> = None;
        let mut schedule = Schedule::new(Instant::now(), period, EVENTED_RELIST_PERIOD);
        // A signal whose sender has gone (the event thread ends for good on
        // a runtime without events) is never ready again, not always.
        let (mut changed, mut exited, mut wanted) =
            (signals.changed, signals.exited, signals.wanted);
        loop {
            select! {
                recv(stop) -> _ => return,
                recv(changed) -> m => {
                    match m {
                        Ok(()) => schedule.changed(Instant::now()),
                        Err(_) => changed = crossbeam_channel::never(),
                    }
                    continue;
                }
                recv(exited) -> m => {
                    match m {
                        Ok(()) => schedule.exited(Instant::now()),
                        Err(_) => exited = crossbeam_channel::never(),
                    }
                    continue;
                }
                recv(wanted) -> m => {
                    match m {
                        Ok(()) => schedule.wanted(Instant::now()),
                        Err(_) => wanted = crossbeam_channel::never(),
                    }
                    continue;
                }
                recv(at(schedule.next())) -> _ => {}
            }
            let started = Instant::now();
            let result = self.relist();
            let interval = last_relist.map(|l| started.saturating_duration_since(l));
            crate::metrics::pleg_relist(started.elapsed(), interval);
            match result {
                Ok(()) => {
                    last_relist = Some(started);
                    if let Some(note) = health.succeeded(Instant::now()) {
                        info!("{note}");
                    }
                    schedule.relisted(started, signals.live.load(Ordering::SeqCst));
                }
                Err(e) => {
                    let (note, delay) = health.failed(started, &e.to_string(), period);
                    match note {
                        Some(note) => warn!("{note}"),
                        None => debug!("relist: {e}"),
                    }
                    schedule.failed(started, delay);
                }
            }
        }
    }

    fn relist(&mut self) -> Result<(), CriError> {
        let started = Instant::now();
        let pods = self.runtime.get_pods()?;
        crate::fault::point("pleg-relist", PodNames(&pods));
        if let Some(h) = &self.health {
            h.relisted_at(started);
        }
        if let Some(r) = &self.running {
            r.publish(&pods);
        }
        let (running_pods, containers) = running_counts(&pods);
        crate::metrics::set_running(running_pods, containers);
        let mut current: HashMap<String, RuntimePod> =
            pods.iter().map(|p| (p.uid.clone(), p.clone())).collect();
        let mut uids: Vec<String> = current.keys().cloned().collect();
        uids.extend(
            self.records
                .keys()
                .filter(|u| !current.contains_key(*u))
                .cloned(),
        );

        let mut all_events = Vec::new();
        let mut inspected = 0usize;
        for uid in &uids {
            let old = self.records.get(uid);
            let new = current.get(uid);
            let events = compute_events(uid, old, new);
            let changed = !events.is_empty() || self.reinspect.contains(uid);
            if new.is_none() {
                // Gone from the runtime: an absent entry reads as an empty status.
                self.reinspect.remove(uid);
                self.cache.delete(uid);
            } else if changed && new.is_some_and(|p| self.cache_agrees(uid, p)) {
                // Read already (by the worker that made the change) and
                // still as listed: no second read of the same status.
                self.cache.touch(uid, started);
            } else if changed {
                inspected += 1;
                let (name, namespace) = new
                    .or(old)
                    .map(|p| (p.name.clone(), p.namespace.clone()))
                    .unwrap_or_default();
                match self.runtime.get_pod_status(uid, &name, &namespace) {
                    Ok(st) => {
                        self.reinspect.remove(uid);
                        self.cache.set(uid, st, None, started);
                    }
                    Err(e) => {
                        warn!("relist: inspect pod {namespace}/{name} ({uid}): {e}");
                        self.reinspect.insert(uid.clone());
                        let keep = self.cache.get(uid).0;
                        self.cache
                            .set(uid, (*keep).clone(), Some(e.to_string()), started);
                    }
                }
            }
            all_events.extend(
                events
                    .into_iter()
                    .filter(|e| e.kind != PodLifecycleEventType::ContainerChanged),
            );
        }
        self.records.clear();
        for uid in uids {
            if let Some(p) = current.remove(&uid) {
                self.records.insert(uid, p);
            }
        }
        self.cache.update_time(started, Arc::new(pods));
        let took = started.elapsed();
        if took > RELIST_PERIOD {
            // Workers waiting for a fresh status waited this long.
            debug!(
                "relist took {} ms ({inspected} pods inspected)",
                took.as_millis()
            );
        }

        for e in all_events {
            debug!("pleg: {e:?}");
            match self.events.try_send(e) {
                Ok(()) => {}
                Err(TrySendError::Full(_)) => {
                    warn!("pleg: event channel full, dropping the rest of this relist's events");
                    break;
                }
                Err(TrySendError::Disconnected(_)) => return Ok(()),
            }
        }
        Ok(())
    }
}

/// Pods with a running (ready) sandbox, and containers by state (created,
/// running, exited, unknown), for `kubelet_running_pods` and
/// `kubelet_running_containers`.
fn running_counts(pods: &[RuntimePod]) -> (u64, [u64; 4]) {
    let mut running = 0;
    let mut states = [0u64; 4];
    for p in pods {
        if p.sandboxes
            .iter()
            .any(|s| s.state == ContainerState::Running)
        {
            running += 1;
        }
        for c in &p.containers {
            let i = match c.state {
                ContainerState::Created => 0,
                ContainerState::Running => 1,
                ContainerState::Exited => 2,
                ContainerState::Unknown => 3,
            };
            states[i] += 1;
        }
    }
    (running, states)
}

/// The pods of a relist as `ns/name ns/name ...`, for a kill point's context.
struct PodNames<'a>(&'a [RuntimePod]);

impl std::fmt::Display for PodNames<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for p in self.0 {
            write!(f, "{}/{} ", p.namespace, p.name)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::RuntimeContainer;
    use PodLifecycleEventType::*;

    fn pod(cs: &[(&str, ContainerState)]) -> RuntimePod {
        RuntimePod {
            uid: "u".into(),
            containers: cs
                .iter()
                .map(|(id, s)| RuntimeContainer {
                    id: id.to_string(),
                    name: id.to_string(),
                    state: *s,
                })
                .collect(),
            ..Default::default()
        }
    }

    fn kinds(ev: Vec<PodLifecycleEvent>) -> Vec<(PodLifecycleEventType, String)> {
        ev.into_iter().map(|e| (e.kind, e.data)).collect()
    }

    #[test]
    fn running_pods_and_containers_are_counted_by_state() {
        use ContainerState::*;
        let mut a = pod(&[("c1", Running), ("c2", Exited), ("c3", Created)]);
        a.sandboxes = vec![RuntimeContainer {
            id: "s1".into(),
            name: String::new(),
            state: Running,
        }];
        let mut b = pod(&[("c4", Unknown), ("c5", Running)]);
        b.sandboxes = vec![RuntimeContainer {
            id: "s2".into(),
            name: String::new(),
            state: Exited,
        }];
        assert_eq!(running_counts(&[a, b]), (1, [1, 2, 1, 1]));
    }

    #[test]
    fn diffing_relists() {
        use ContainerState::*;
        let a = pod(&[("c1", Running)]);
        assert_eq!(
            kinds(compute_events("u", None, Some(&a))),
            vec![(ContainerStarted, "c1".into())]
        );
        assert!(compute_events("u", Some(&a), Some(&a)).is_empty());
        let b = pod(&[("c1", Exited)]);
        assert_eq!(
            kinds(compute_events("u", Some(&a), Some(&b))),
            vec![(ContainerDied, "c1".into())]
        );
        assert_eq!(
            kinds(compute_events("u", Some(&b), None)),
            vec![(ContainerRemoved, "c1".into())]
        );
        assert_eq!(
            kinds(compute_events("u", Some(&a), None)),
            vec![
                (ContainerDied, "c1".into()),
                (ContainerRemoved, "c1".into())
            ]
        );
        let c = pod(&[("c1", Exited), ("c2", Created)]);
        assert_eq!(
            kinds(compute_events("u", Some(&b), Some(&c))),
            vec![(ContainerChanged, "c2".into())]
        );
        let d = pod(&[("c1", Exited), ("c2", Running)]);
        assert_eq!(
            kinds(compute_events("u", Some(&c), Some(&d))),
            vec![(ContainerStarted, "c2".into())]
        );
    }

    #[test]
    fn an_outage_is_logged_once_with_reminders_and_relists_back_off() {
        let period = RELIST_PERIOD;
        let t0 = Instant::now();
        let mut h = RuntimeHealth::default();
        assert_eq!(h.succeeded(t0), None, "nothing to say while healthy");
        let (note, delay) = h.failed(t0, "socket gone", period);
        assert_eq!(note, Some(HealthNote::Down("socket gone".into())));
        assert!(note
            .unwrap()
            .to_string()
            .starts_with("container runtime is down: socket gone"));
        assert_eq!(delay, Duration::from_secs(2));
        // Quiet for a minute, with relists spaced out up to the cap.
        let mut t = t0;
        let mut delays = vec![delay];
        let mut notes = 0;
        loop {
            let next = t + *delays.last().unwrap();
            if next >= t0 + Duration::from_secs(60) {
                break;
            }
            t = next;
            let (note, delay) = h.failed(t, "socket gone", period);
            notes += usize::from(note.is_some());
            delays.push(delay);
        }
        assert_eq!(notes, 0, "no line before the reminder is due");
        assert_eq!(&delays[..3], &[2, 4, 5].map(Duration::from_secs));
        assert!(delays.iter().all(|d| *d <= MAX_RELIST_BACKOFF));
        let (note, _) = h.failed(t0 + Duration::from_secs(61), "socket gone", period);
        assert_eq!(
            note,
            Some(HealthNote::StillDown(
                Duration::from_secs(61),
                "socket gone".into()
            ))
        );
        let back = h.succeeded(t0 + Duration::from_secs(70)).unwrap();
        assert!(
            matches!(back, HealthNote::Back(d, n) if d == Duration::from_secs(70) && n as usize == delays.len() + 1)
        );
        assert!(back
            .to_string()
            .starts_with("container runtime is back after 70.0s"));
        // The next outage is reported afresh.
        let (note, delay) = h.failed(t0 + Duration::from_secs(80), "refused", period);
        assert_eq!(note, Some(HealthNote::Down("refused".into())));
        assert_eq!(delay, Duration::from_secs(2));
    }

    fn relister(
        rm: Arc<RuntimeManager>,
        cache: Arc<PodCache>,
    ) -> (Relister, Receiver<PodLifecycleEvent>) {
        let (tx, rx) = crossbeam_channel::bounded(100);
        let r = Relister {
            runtime: rm,
            cache,
            events: tx,
            records: HashMap::new(),
            reinspect: HashSet::new(),
            health: None,
            running: None,
        };
        (r, rx)
    }

    /// A status a worker read after starting the pod is what the next
    /// relist would read: it is not read again; a pod the list shows
    /// otherwise (its container exited) is.
    #[test]
    fn a_relist_reads_again_only_pods_whose_cached_status_it_contradicts() {
        let (fake, rm) = crate::runtime::fake::test_manager("pleg-agree");
        let cache = PodCache::new();
        let (mut r, events) = relister(rm.clone(), cache.clone());
        let pod = crate::runtime::fake::test_pod("u1", "web");
        let mut backoff = crate::runtime::backoff::Backoff::default();
        let empty = PodStatus {
            uid: "u1".into(),
            ..Default::default()
        };
        let synced = rm.sync_pod(&pod, &empty, &mut backoff);
        let (st, at) = (synced.status.unwrap(), synced.status_read_at.unwrap());
        assert_eq!(st.container_statuses.len(), 1);
        cache.set("u1", st, None, at);

        fake.clear_calls();
        r.relist().unwrap();
        assert_eq!(fake.count("PodSandboxStatus"), 0, "{:?}", fake.calls());
        assert_eq!(fake.count("ContainerStatus"), 0, "{:?}", fake.calls());
        assert!(
            cache.modified("u1").unwrap() > at,
            "the entry is current as of the relist"
        );
        // The events still reach the sync loop.
        let kinds: Vec<_> = events.try_iter().map(|e| e.kind).collect();
        assert!(kinds.contains(&ContainerStarted), "{kinds:?}");

        let id = fake.container_id("app").unwrap();
        fake.exit_container(&id, 1);
        fake.clear_calls();
        r.relist().unwrap();
        assert_eq!(fake.count("ContainerStatus"), 1, "{:?}", fake.calls());
        assert_eq!(
            cache.get("u1").0.container_statuses[0].state,
            ContainerState::Exited
        );
        let kinds: Vec<_> = events.try_iter().map(|e| e.kind).collect();
        assert_eq!(kinds, vec![ContainerDied]);
    }

    #[test]
    fn a_status_agrees_with_a_list_only_with_the_same_ids_in_the_same_states() {
        use crate::cri::api::{PodSandboxState, PodSandboxStatus};
        use crate::runtime::{ContainerStatus, RuntimeContainer};
        use ContainerState::*;
        let sandbox = |id: &str, ready: bool| {
            let mut s = PodSandboxStatus::new();
            s.id = id.into();
            s.state = protobuf::EnumOrUnknown::new(if ready {
                PodSandboxState::SANDBOX_READY
            } else {
                PodSandboxState::SANDBOX_NOTREADY
            });
            s
        };
        let container = |id: &str, state| ContainerStatus {
            id: id.into(),
            state,
            ..Default::default()
        };
        let listed = |sb: ContainerState, cs: &[(&str, ContainerState)]| RuntimePod {
            sandboxes: vec![RuntimeContainer {
                id: "s".into(),
                name: String::new(),
                state: sb,
            }],
            ..pod(cs)
        };
        let status = PodStatus {
            sandbox_statuses: vec![sandbox("s", true)],
            container_statuses: vec![container("c1", Running), container("c2", Exited)],
            ..Default::default()
        };
        assert!(status_agrees(
            &status,
            &listed(Running, &[("c2", Exited), ("c1", Running)])
        ));
        assert!(!status_agrees(
            &status,
            &listed(Exited, &[("c1", Running), ("c2", Exited)])
        ));
        assert!(!status_agrees(
            &status,
            &listed(Running, &[("c1", Exited), ("c2", Exited)])
        ));
        assert!(!status_agrees(
            &status,
            &listed(Running, &[("c1", Running)])
        ));
        assert!(!status_agrees(
            &status,
            &listed(Running, &[("c1", Running), ("c2", Exited), ("c3", Created)])
        ));
    }

    #[test]
    fn cache_blocks_until_newer() {
        let cache = PodCache::new();
        let t0 = Instant::now();
        let c = cache.clone();
        let waiter = spawn_named("cache-waiter", move || {
            c.get_newer_than("u", Some(t0)).map(|s| s.0.name.clone())
        })
        .unwrap();
        std::thread::sleep(Duration::from_millis(30));
        assert!(!waiter.is_finished());
        cache.set(
            "u",
            PodStatus {
                name: "p".into(),
                ..Default::default()
            },
            None,
            Instant::now(),
        );
        assert_eq!(waiter.join().unwrap(), Some("p".to_string()));

        // A global timestamp newer than `min` satisfies any pod.
        let t1 = Instant::now();
        cache.update_time(Instant::now(), Arc::new(vec![]));
        assert!(cache.get_newer_than("other", Some(t1)).is_some());
        // An interrupt wakes a waiter whose abort condition now holds.
        let flag = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (c, f) = (cache.clone(), flag.clone());
        let later = Instant::now() + Duration::from_secs(3600);
        let waiter = spawn_named("cache-waiter", move || {
            matches!(
                c.wait_newer_than("u", Some(later), &|| f
                    .load(std::sync::atomic::Ordering::SeqCst)),
                Wait::Aborted
            )
        })
        .unwrap();
        std::thread::sleep(Duration::from_millis(20));
        assert!(!waiter.is_finished());
        flag.store(true, std::sync::atomic::Ordering::SeqCst);
        cache.interrupt();
        assert!(waiter.join().unwrap());
        // Closing wakes waiters with None.
        let c = cache.clone();
        let later = Instant::now() + Duration::from_secs(3600);
        let waiter = spawn_named("cache-waiter", move || {
            c.get_newer_than("u", Some(later)).is_none()
        })
        .unwrap();
        std::thread::sleep(Duration::from_millis(20));
        cache.close();
        assert!(waiter.join().unwrap());
    }
}
