//! The sync loop (upstream `kubelet.go` syncLoop): one thread that turns
//! config updates, PLEG events and tickers into work for the pod workers.
//!
//! Architecture invariant: the sync loop never calls the runtime and never
//! blocks on I/O; it owns the pod manager (the desired pods by UID) and the
//! pod workers, and only dispatches.
//!
//! The loop measures itself at the cost of two clock reads a turn: every
//! turn over its expected length is logged as a warning with its event's
//! kind (housekeeping is expected within 1 s, as upstream expects; any other
//! turn within 100 ms, as it only dispatches), and at shutdown one line gives
//! the number of turns, the longest one, and the longest a pod's update
//! waited for its worker (see `pod_workers`).

mod admit;
mod leftovers;

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{select, tick, Receiver};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use log::{debug, info, warn};

use crate::admission::NodeInfo;
use crate::config::checkpoint::Admissions;
use crate::config::validation::{addressable, validate_api_pod};
use crate::config::{PodOperation, PodUpdate};
use crate::events::EventRecorder;
use crate::pleg::{PodCache, PodLifecycleEvent, PodLifecycleEventType};
use crate::pod::{is_mirror_pod, is_static_pod, pod_full_name, pod_uid, API_SOURCE};
use crate::pod_workers::{PodWork, PodWorkers, Report, UpdateType};
use crate::status::manager::{MirrorPod, StatusReporter};
use crate::volume::sweeper::OrphanSweeper;

/// The reason (status and event) of a pod refused for names that cannot
/// become paths on this node; the event reason upstream gives a pod that
/// fails validation.
pub(crate) const FAILED_VALIDATION: &str = "FailedValidation";

/// How often due resyncs are dispatched (upstream: 1 s).
pub(crate) const SYNC_TICK: Duration = Duration::from_secs(1);
/// How often housekeeping runs (upstream: 2 s).
pub(crate) const HOUSEKEEPING_PERIOD: Duration = Duration::from_secs(2);
/// Housekeeping turns (2 s apart) that hand memory back after work: pods
/// that went away, or containers that started.
const TRIMS_AFTER_WORK: u8 = 3;
/// After the first drop of the executable's code pages (once the sources
/// are ready), the second comes this much later, when start-up's other
/// threads (registration, the first image GC, the server's first
/// requests) are done.
const SECOND_CODE_DROP: Duration = Duration::from_secs(60);
/// A housekeeping turn longer than this is logged (upstream's
/// housekeepingWarningDuration).
pub(crate) const HOUSEKEEPING_WARNING: Duration = Duration::from_secs(1);
/// Any other turn longer than this is logged: it only dispatches.
pub(crate) const TURN_WARNING: Duration = Duration::from_millis(100);

/// Everything the sync loop reacts to.
#[derive(Debug)]
pub(crate) enum Event {
    Config(PodUpdate),
    SyncTick,
    Housekeeping,
    Pleg(PodLifecycleEvent),
    /// A worker asks for its pod (UID) to be synced again after this long.
    Resync(String, Duration),
    WorkerDone(String),
    /// A probe result of this pod (UID) changed, or a Secret or ConfigMap
    /// it uses did (the object manager sends on the same channel): either
    /// way its worker syncs it.
    Probe(String),
    /// The eviction manager evicts this pod.
    Evict(crate::eviction::manager::Eviction),
}

impl Event {
    /// What kind of event this is, without its payload: cheap to keep.
    pub(crate) fn kind(&self) -> EventKind {
        match self {
            Event::Config(u) => EventKind::Config {
                op: u.op,
                pods: u.pods.len(),
            },
            Event::SyncTick => EventKind::SyncTick,
            Event::Housekeeping => EventKind::Housekeeping,
            Event::Pleg(e) => EventKind::Pleg(e.kind),
            Event::Resync(..) => EventKind::Resync,
            Event::WorkerDone(_) => EventKind::WorkerDone,
            Event::Probe(_) => EventKind::Probe,
            Event::Evict(_) => EventKind::Evict,
        }
    }
}

/// An [`Event`] without its payload, for the loop's measurements and logs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum EventKind {
    Config { op: PodOperation, pods: usize },
    SyncTick,
    Housekeeping,
    Pleg(PodLifecycleEventType),
    Resync,
    WorkerDone,
    Probe,
    Evict,
}

impl EventKind {
    /// How long a turn handling this kind of event is expected to take.
    pub(crate) fn expected(self) -> Duration {
        match self {
            EventKind::Housekeeping => HOUSEKEEPING_WARNING,
            _ => TURN_WARNING,
        }
    }
}

impl std::fmt::Display for EventKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            EventKind::Config { op, pods } => write!(f, "config {op:?}, {pods} pods"),
            EventKind::SyncTick => f.write_str("sync tick"),
            EventKind::Housekeeping => f.write_str("housekeeping"),
            EventKind::Pleg(k) => write!(f, "PLEG {k:?}"),
            EventKind::Resync => f.write_str("resync request"),
            EventKind::WorkerDone => f.write_str("worker done"),
            EventKind::Probe => f.write_str("probe result"),
            EventKind::Evict => f.write_str("eviction"),
        }
    }
}

/// The sync loop's own figures: turns handled and the longest one. Plain
/// numbers, updated in place on every turn.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LoopStats {
    pub(crate) turns: u64,
    pub(crate) longest: Duration,
    /// The kind of event the longest turn handled.
    pub(crate) longest_kind: Option<EventKind>,
}

impl LoopStats {
    /// Counts one turn of `kind` that took `took`; true when it took longer
    /// than such a turn is expected to.
    pub(crate) fn record(&mut self, kind: EventKind, took: Duration) -> bool {
        self.turns += 1;
        if took > self.longest {
            self.longest = took;
            self.longest_kind = Some(kind);
        }
        took > kind.expected()
    }
}

impl std::fmt::Display for LoopStats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} turns, longest {} ms",
            self.turns,
            self.longest.as_millis()
        )?;
        if let Some(k) = self.longest_kind {
            write!(f, " ({k})")?;
        }
        Ok(())
    }
}

/// The channels the loop selects over.
pub(crate) struct Inputs {
    pub(crate) updates: Receiver<PodUpdate>,
    pub(crate) pleg: Receiver<PodLifecycleEvent>,
    /// The workers' resync requests and last messages.
    pub(crate) worker_reports: Receiver<Report>,
    /// Pods whose probe results changed (from the prober).
    pub(crate) probes: Receiver<String>,
    /// Any message or disconnection stops the loop.
    pub(crate) stop: Receiver<()>,
}

pub(crate) struct Kubelet {
    /// The pod manager: desired pods by UID.
    pods: HashMap<String, Arc<Pod>>,
    workers: PodWorkers,
    cache: Arc<PodCache>,
    /// Whether every configured source has been heard from.
    sources_ready: Box<dyn Fn() -> bool + Send>,
    /// When each finished worker's pod was removed, so housekeeping does not
    /// mistake a relist taken before that for a pod still running.
    finished: HashMap<String, Instant>,
    /// Pods still in the pod manager whose worker has finished: gracefully
    /// deleted pods waiting for their API object to go. Nothing starts or
    /// kills them again; their REMOVE forgets them.
    terminated: HashSet<String>,
    /// Pods the runtime holds that no source has, handed to workers to stop
    /// and remove, and when to try again those that stay.
    leftovers: leftovers::Leftovers,
    inputs: Inputs,
    sync_tick: Receiver<Instant>,
    housekeeping: Receiver<Instant>,
    /// Where pod status and mirror pods are reported.
    reporter: StatusReporter,
    recorder: EventRecorder,
    /// What admission checks pods against; `None` admits every pod.
    node: Option<Box<dyn Fn() -> NodeInfo + Send>>,
    /// Housekeeping turns that still hand freed memory back to the system:
    /// set when pods went away or a container started, so that what a
    /// burst freed (decoded manifests, CRI configs, statuses, events, and
    /// what other threads free a little later) goes back too, rather than
    /// staying resident between the live chunks of the pods that stay.
    trims_due: u8,
    /// When housekeeping next drops the executable's code pages
    /// (`malloc::drop_code_pages`): `None` when not enabled or none is due.
    code_drop_at: Option<Instant>,
    /// Code page drops done so far.
    code_drops: u32,
    /// The number of desired pods at the last housekeeping.
    pods_at_housekeeping: usize,
    /// Pods refused by admission: never run, reported as Failed.
    rejected: HashMap<String, Arc<Pod>>,
    /// Removes orphaned pod directories, on a thread per sweep, at
    /// housekeeping's request; `None` leaves them.
    sweeper: Option<OrphanSweeper>,
    /// Turns handled and the longest one.
    stats: LoopStats,
    /// Where admission decisions are recorded for the checkpointer.
    admissions: Option<Arc<Admissions>>,
    /// Stamped at each turn, for `/healthz`.
    health: Option<Arc<crate::health::Health>>,
    /// The desired pods, published for the node API's `/pods`.
    view: Option<Arc<PodView>>,
    /// Pods the eviction manager evicts; never, without one.
    evictions: Receiver<crate::eviction::manager::Eviction>,
    /// The node's pressure conditions, for the eviction admission check.
    pressure: Option<Arc<crate::eviction::State>>,
}

/// A read-only copy of the sync loop's desired pods for other threads (the
/// node API's `/pods`): replaced as a whole when the pods change, so a
/// reader takes the `Arc` and never holds the lock.
#[derive(Default)]
pub(crate) struct PodView(parking_lot::Mutex<Arc<Vec<Arc<Pod>>>>);

impl PodView {
    /// The pods as last published.
    pub(crate) fn pods(&self) -> Arc<Vec<Arc<Pod>>> {
        self.0.lock().clone()
    }

    /// Replaces the pods, unless they are the very same ones.
    pub(crate) fn publish(&self, pods: Vec<Arc<Pod>>) {
        let mut cur = self.0.lock();
        let same = cur.len() == pods.len() && cur.iter().zip(&pods).all(|(a, b)| Arc::ptr_eq(a, b));
        if !same {
            *cur = Arc::new(pods);
        }
    }
}

impl Kubelet {
    pub(crate) fn new(
        workers: PodWorkers,
        cache: Arc<PodCache>,
        sources_ready: Box<dyn Fn() -> bool + Send>,
        inputs: Inputs,
    ) -> Self {
        Kubelet {
            pods: HashMap::new(),
            workers,
            cache,
            sources_ready,
            finished: HashMap::new(),
            terminated: HashSet::new(),
            leftovers: leftovers::Leftovers::default(),
            inputs,
            sync_tick: tick(SYNC_TICK),
            housekeeping: tick(HOUSEKEEPING_PERIOD),
            reporter: StatusReporter::standalone(),
            recorder: EventRecorder::disabled(),
            node: None,
            rejected: HashMap::new(),
            trims_due: 0,
            code_drop_at: None,
            code_drops: 0,
            pods_at_housekeeping: 0,
            sweeper: None,
            stats: LoopStats::default(),
            admissions: None,
            evictions: crossbeam_channel::never(),
            pressure: None,
            health: None,
            view: None,
        }
    }

    /// Stamps `health` at each turn of the loop.
    pub(crate) fn with_health(mut self, health: Arc<crate::health::Health>) -> Self {
        self.health = Some(health);
        self
    }

    /// Publishes the desired pods to `view` whenever they change.
    pub(crate) fn with_pod_view(mut self, view: Arc<PodView>) -> Self {
        self.view = Some(view);
        self
    }

    /// Publishes the pod manager's pods (sorted by namespace and name, so
    /// the list reads the same each time) when a view is attached.
    fn publish_pods(&self) {
        if let Some(view) = &self.view {
            let mut pods: Vec<Arc<Pod>> = self.pods.values().cloned().collect();
            pods.sort_by(|a, b| {
                (&a.metadata.namespace, &a.metadata.name)
                    .cmp(&(&b.metadata.namespace, &b.metadata.name))
            });
            view.publish(pods);
        }
    }

    /// Evicts the pods the eviction manager sends, and refuses new pods
    /// under the pressure `state` reports (upstream's eviction admit
    /// handler).
    pub(crate) fn with_eviction(
        mut self,
        state: Arc<crate::eviction::State>,
        evictions: Receiver<crate::eviction::manager::Eviction>,
    ) -> Self {
        self.pressure = Some(state);
        self.evictions = evictions;
        self
    }

    /// Records each admission decision in `admissions` (for checkpoints).
    pub(crate) fn with_admissions(mut self, admissions: Arc<Admissions>) -> Self {
        self.admissions = Some(admissions);
        self
    }

    /// Has housekeeping drop the resident pages of the executable's code
    /// (`malloc::drop_code_pages`) once start-up is done: when every source
    /// has been heard from, and a minute later (after a burst of work,
    /// `malloc::give_back` drops them too). Off in tests of the loop, whose
    /// process is the test harness.
    pub(crate) fn with_code_page_drops(mut self) -> Self {
        self.code_drop_at = Some(Instant::now());
        self
    }

    /// Has housekeeping ask `sweeper` to remove the pod directories that
    /// no pod claims any more.
    pub(crate) fn with_orphan_sweeper(mut self, sweeper: OrphanSweeper) -> Self {
        self.sweeper = Some(sweeper);
        self
    }

    /// Reports status and mirror pods to `reporter`, events to `recorder`,
    /// and admits pods against the node that `node` describes.
    pub(crate) fn with_cluster(
        mut self,
        reporter: StatusReporter,
        recorder: EventRecorder,
        node: Box<dyn Fn() -> NodeInfo + Send>,
    ) -> Self {
        self.reporter = reporter;
        self.recorder = recorder;
        self.node = Some(node);
        self
    }

    /// Mirror pods are the API server's copies of static pods: they are
    /// recorded for the status manager and never run.
    fn take_mirror_pods(&mut self, u: &mut PodUpdate) {
        if u.source != API_SOURCE && u.op != PodOperation::Set {
            return;
        }
        let (mirrors, rest): (Vec<Arc<Pod>>, Vec<Arc<Pod>>) = std::mem::take(&mut u.pods)
            .into_iter()
            .partition(|p| is_mirror_pod(p));
        u.pods = rest;
        for m in mirrors {
            let full_name = pod_full_name(&m);
            if u.op == PodOperation::Remove {
                self.reporter.set_mirror(&full_name, None);
            } else {
                self.reporter.set_mirror(&full_name, MirrorPod::of(&m));
            }
        }
    }

    /// Runs until stopped, then stops the pod workers (containers keep running).
    pub(crate) fn run(mut self) {
        info!("sync loop started");
        while let Some(event) = self.next_event() {
            let start = Instant::now();
            if let Some(h) = &self.health {
                h.sync_loop_turned_at(start);
            }
            let kind = event.kind();
            // Only these change the pod manager.
            let config = matches!(
                event,
                Event::Config(_) | Event::WorkerDone(_) | Event::Housekeeping | Event::Evict(_)
            );
            self.handle_event(event);
            if config {
                self.publish_pods();
            }
            let took = start.elapsed();
            if self.stats.record(kind, took) {
                warn!(
                    "sync loop: {kind} took longer than expected: expected {} ms, actual {} ms",
                    kind.expected().as_millis(),
                    took.as_millis()
                );
            }
        }
        info!("sync loop stopping");
        self.cache.close();
        self.workers.shutdown(Duration::from_secs(5));
        info!("{}", self.summary());
    }

    /// The shutdown line: the loop's turns and the longest pod worker wait.
    pub(crate) fn summary(&self) -> String {
        let wait = match self.workers.longest_wait() {
            Some((d, pod)) => format!("{} ms ({pod})", d.as_millis()),
            None => "none".into(),
        };
        format!("sync loop: {}; longest pod worker wait {wait}", self.stats)
    }

    fn next_event(&self) -> Option<Event> {
        let updates = &self.inputs.updates;
        select! {
            recv(self.inputs.stop) -> _ => None,
            recv(updates) -> u => match u {
                Ok(u) => Some(Event::Config(u)),
                Err(_) => {
                    warn!("config updates channel closed");
                    None
                }
            },
            recv(self.inputs.pleg) -> e => e.ok().map(Event::Pleg).or(Some(Event::SyncTick)),
            recv(self.inputs.worker_reports) -> r => match r {
                Ok(Report::Resync(uid, after)) => Some(Event::Resync(uid, after)),
                Ok(Report::Done(uid)) => Some(Event::WorkerDone(uid)),
                Err(_) => Some(Event::SyncTick),
            },
            recv(self.inputs.probes) -> p => p.ok().map(Event::Probe).or(Some(Event::SyncTick)),
            recv(self.evictions) -> e => e.ok().map(Event::Evict).or(Some(Event::SyncTick)),
            recv(self.sync_tick) -> _ => Some(Event::SyncTick),
            recv(self.housekeeping) -> _ => Some(Event::Housekeeping),
        }
    }

    pub(crate) fn handle_event(&mut self, event: Event) {
        match event {
            Event::Config(u) => self.handle_config(u),
            Event::SyncTick => {
                for uid in self.workers.take_ready(Instant::now()) {
                    if let Some(pod) = self.pods.get(&uid).cloned() {
                        self.dispatch(pod, UpdateType::Sync, None);
                    }
                }
            }
            Event::Pleg(e) => {
                if e.kind == PodLifecycleEventType::ContainerStarted {
                    self.trims_due = TRIMS_AFTER_WORK;
                }
                if let Some(pod) = self.pods.get(&e.uid).cloned() {
                    debug!("pod {}: {:?} {:.12}", pod_full_name(&pod), e.kind, e.data);
                    self.dispatch(pod, UpdateType::Sync, None);
                } else if e.kind == PodLifecycleEventType::ContainerStarted {
                    debug!("pleg: container started in unknown pod {}", e.uid);
                }
            }
            Event::Resync(uid, after) => self.workers.requeue(&uid, after),
            Event::WorkerDone(uid) => {
                self.workers.forget(&uid);
                self.trims_due = TRIMS_AFTER_WORK;
                self.finished.insert(uid.clone(), Instant::now());
                match self.pods.get(&uid) {
                    // Added again while it was being torn down (a static
                    // pod's manifest that came back with the same content):
                    // its ADD was ignored by the terminating worker, so it
                    // starts afresh now, as upstream restarts such a pod.
                    Some(p) if p.metadata.deletion_timestamp.is_none() => {
                        let p = p.clone();
                        info!(
                            "pod {}: added again while terminating; starting it",
                            pod_full_name(&p)
                        );
                        self.dispatch(p, UpdateType::Create, None);
                    }
                    Some(_) => {
                        self.terminated.insert(uid);
                    }
                    None => {}
                }
            }
            Event::Housekeeping => self.housekeeping(),
            Event::Evict(e) => self.evict(e),
            Event::Probe(uid) => {
                // The pod's worker acts on the result: a kill and restart
                // for a failed liveness or startup probe, the next init
                // container after a sidecar's startup probe passed.
                // Readiness goes from the prober to the status manager.
                if let Some(pod) = self.pods.get(&uid).cloned() {
                    self.dispatch(pod, UpdateType::Sync, None);
                }
            }
        }
    }

    fn handle_config(&mut self, mut u: PodUpdate) {
        if u.source == API_SOURCE && u.op != PodOperation::Restore {
            // Only a SET from the API source gets here: its first list is in.
            self.reporter.api_seen();
        }
        self.take_mirror_pods(&mut u);
        if u.pods.is_empty() && u.op != PodOperation::Set {
            return;
        }
        let names = || {
            u.pods
                .iter()
                .map(|p| pod_full_name(p))
                .collect::<Vec<_>>()
                .join(", ")
        };
        match u.op {
            PodOperation::Add | PodOperation::Restore => {
                if !u.pods.is_empty() {
                    info!("SyncLoop ADD ({}): {}", u.source, names());
                }
                let mut pods = u.pods;
                // Admit in creation order, as upstream does.
                pods.sort_by(|a, b| {
                    a.metadata
                        .creation_timestamp
                        .cmp(&b.metadata.creation_timestamp)
                });
                for p in pods {
                    let uid = pod_uid(&p).to_string();
                    if !self.validate(&p) {
                        continue;
                    }
                    if p.metadata.deletion_timestamp.is_some() {
                        // Being deleted already (tinylet restarted meanwhile).
                        self.pods.insert(uid, p.clone());
                        let grace = p.metadata.deletion_grace_period_seconds;
                        self.dispatch(p, UpdateType::Kill, grace);
                        continue;
                    }
                    if !self.settle_name_conflicts(&p) {
                        continue;
                    }
                    if !self.admit(&p) {
                        continue;
                    }
                    self.pods.insert(uid, p.clone());
                    self.dispatch(p, UpdateType::Create, None);
                }
            }
            PodOperation::Update => {
                info!("SyncLoop UPDATE ({}): {}", u.source, names());
                for p in u.pods {
                    if self.rejected.contains_key(pod_uid(&p)) {
                        continue;
                    }
                    if let Err(e) = validate_api_pod(&p) {
                        // The running pod keeps its last valid spec.
                        warn!("pod {}: update refused: {e}", pod_full_name(&p));
                        continue;
                    }
                    if p.metadata.deletion_timestamp.is_none() && !self.admit_update(&p) {
                        continue;
                    }
                    self.pods.insert(pod_uid(&p).to_string(), p.clone());
                    self.dispatch(p, UpdateType::Update, None);
                }
            }
            PodOperation::Reconcile => {
                for p in u.pods {
                    if self.rejected.contains_key(pod_uid(&p)) {
                        // Its own Failed status coming back: it stays out
                        // of the desired pods (admission's count, syncs).
                        continue;
                    }
                    self.pods.insert(pod_uid(&p).to_string(), p.clone());
                    // A readiness gate's condition changed: the Ready
                    // condition follows (upstream's HandlePodReconcile).
                    if crate::status::generate::readiness_needs_reconcile(&p) {
                        self.dispatch(p, UpdateType::Sync, None);
                    }
                }
            }
            PodOperation::Delete => {
                info!("SyncLoop DELETE ({}): {}", u.source, names());
                for p in u.pods {
                    let grace = p.metadata.deletion_grace_period_seconds;
                    if self.rejected.remove(pod_uid(&p)).is_some() {
                        // Never ran: its API object can go at once.
                        if addressable(&p) {
                            self.reporter.pod_finished(&p, true);
                        }
                        continue;
                    }
                    self.pods.insert(pod_uid(&p).to_string(), p.clone());
                    self.dispatch(p, UpdateType::Kill, grace);
                }
            }
            PodOperation::Remove => {
                info!("SyncLoop REMOVE ({}): {}", u.source, names());
                for p in u.pods {
                    if let Some(a) = &self.admissions {
                        a.forget(pod_uid(&p));
                    }
                    if self.rejected.remove(pod_uid(&p)).is_some() {
                        self.reporter.forget(pod_uid(&p));
                        continue;
                    }
                    let p = self.pods.remove(pod_uid(&p)).unwrap_or(p);
                    if self.terminated.remove(pod_uid(&p)) {
                        continue;
                    }
                    self.dispatch(p, UpdateType::Kill, None);
                }
            }
            PodOperation::Set => {
                // Snapshot modes only; the kubelet runs in incremental mode.
                let keep: HashMap<String, Arc<Pod>> = u
                    .pods
                    .into_iter()
                    .map(|p| (pod_uid(&p).to_string(), p))
                    .collect();
                let gone: Vec<Arc<Pod>> = self
                    .pods
                    .values()
                    .filter(|p| !keep.contains_key(pod_uid(p)) && source_of(p) == u.source)
                    .cloned()
                    .collect();
                for p in gone {
                    self.pods.remove(pod_uid(&p));
                    if self.terminated.remove(pod_uid(&p)) {
                        continue;
                    }
                    self.dispatch(p, UpdateType::Kill, None);
                }
                for (uid, p) in keep {
                    let t = if self.pods.contains_key(&uid) {
                        UpdateType::Update
                    } else {
                        UpdateType::Create
                    };
                    self.pods.insert(uid, p.clone());
                    self.dispatch(p, t, None);
                }
            }
        }
    }

    fn dispatch(&mut self, pod: Arc<Pod>, update_type: UpdateType, grace_period: Option<i64>) {
        if self.terminated.contains(pod_uid(&pod)) {
            debug!(
                "pod {}: terminated already, {update_type:?} ignored",
                pod_full_name(&pod)
            );
            return;
        }
        if update_type == UpdateType::Kill {
            self.reporter.pod_killed(&pod);
        }
        if let Some(sweeper) = &self.sweeper {
            if !self.workers.is_known(pod_uid(&pod)) {
                // Its worker may make its directory before a sweep asked
                // for earlier gets to it.
                sweeper.claim();
            }
        }
        self.workers.update_pod(PodWork {
            pod,
            update_type,
            grace_period,
        });
    }

    /// Stops pods that run in the runtime but no source wants (for example a
    /// manifest deleted while tinylet was down), and removes what such pods
    /// left that runs nothing, once every source has been heard from; one
    /// that stays is tried again with back-off (`leftovers`).
    fn housekeeping(&mut self) {
        if self.pods.len() < self.pods_at_housekeeping {
            self.trims_due = TRIMS_AFTER_WORK;
        }
        self.pods_at_housekeeping = self.pods.len();
        if self.trims_due > 0 {
            // Pods went away lately: their memory can go too.
            self.trims_due -= 1;
            crate::malloc::give_back();
        }
        if !(self.sources_ready)() {
            debug!("housekeeping: waiting for all sources");
            return;
        }
        if self.code_drop_at.is_some_and(|at| at <= Instant::now()) {
            let bytes = crate::malloc::drop_code_pages();
            self.code_drops += 1;
            debug!("housekeeping: dropped {} KiB of code pages", bytes / 1024);
            self.code_drop_at = (self.code_drops == 1).then(|| Instant::now() + SECOND_CODE_DROP);
        }
        // Mirror pods whose static pod is gone.
        for (full_name, mirror) in self.reporter.mirrors() {
            let wanted = self
                .pods
                .values()
                .any(|p| is_static_pod(p) && pod_full_name(p) == full_name);
            if !wanted {
                debug!("housekeeping: mirror pod {full_name} has no static pod");
                self.reporter.delete_orphan_mirror(&full_name, &mirror.uid);
            }
        }
        let (relisted, runtime_pods) = self.cache.runtime_pods();
        let Some(relisted) = relisted else { return };
        self.finished.retain(|_, t| *t > relisted);
        crate::malloc::shrink_map(&mut self.finished);
        crate::malloc::shrink_map(&mut self.pods);
        for (uid, tries) in self.leftovers.forget_gone(&runtime_pods) {
            info!("housekeeping: pod {uid} is gone from the runtime after {tries} tries");
        }
        let now = Instant::now();
        for rp in runtime_pods.iter() {
            if self.pods.contains_key(&rp.uid) {
                self.leftovers.forget(&rp.uid);
                continue;
            }
            if self.workers.is_known(&rp.uid) || self.finished.contains_key(&rp.uid) {
                continue;
            }
            let who = format!("{}/{} ({})", rp.namespace, rp.name, rp.uid);
            match self.leftovers.judge(rp, now) {
                leftovers::Verdict::Wait => continue,
                leftovers::Verdict::Stop => {
                    info!("housekeeping: pod {who} runs but no source has it; stopping it")
                }
                leftovers::Verdict::Remove => info!(
                    "housekeeping: pod {who} is left in the runtime (no ready sandbox, \
                     no running container) and no source has it; removing it"
                ),
                leftovers::Verdict::Retry {
                    running,
                    n: 2,
                    next,
                } => warn!(
                    "housekeeping: pod {who} is still in the runtime ({}) after its removal; \
                     trying again now, then after {}s, up to every {}s",
                    if running {
                        "running"
                    } else {
                        "nothing running"
                    },
                    next.as_secs(),
                    leftovers::MAX_RETRY.as_secs()
                ),
                leftovers::Verdict::Retry { n, next, .. } => debug!(
                    "housekeeping: pod {who} still in the runtime; try {n}, next in {}s",
                    next.as_secs()
                ),
            }
            crate::fault::point(
                "housekeeping-orphan",
                format_args!("{}/{}", rp.namespace, rp.name),
            );
            let pod = Arc::new(Pod {
                metadata: ObjectMeta {
                    name: Some(rp.name.clone()),
                    namespace: Some(rp.namespace.clone()),
                    uid: Some(rp.uid.clone()),
                    ..Default::default()
                },
                ..Default::default()
            });
            self.dispatch(pod, UpdateType::Kill, None);
        }
        if let Some(sweeper) = &mut self.sweeper {
            // The sweep itself (read_dir, unmount, remove) runs on a
            // thread of its own.
            let keep: HashSet<String> = self
                .pods
                .keys()
                .chain(self.workers.uids())
                .chain(self.finished.keys())
                .chain(runtime_pods.iter().map(|p| &p.uid))
                .cloned()
                .collect();
            sweeper.request(keep);
        }
    }
}

/// The source the merge recorded on the pod ("" for none).
fn source_of(pod: &Pod) -> &str {
    crate::pod::config_source(pod).unwrap_or("")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::PodUpdate;
    use crate::cri::RuntimeService;
    use crate::runtime::fake::{test_manager, test_pod, wait_for, FakeRuntime};
    use crate::runtime::RuntimeManager;
    use std::sync::atomic::{AtomicBool, Ordering};

    fn pod(uid: &str, name: &str) -> Pod {
        test_pod(uid, name)
    }

    struct Rig {
        kubelet: Kubelet,
        fake: Arc<FakeRuntime>,
        rm: Arc<RuntimeManager>,
        cache: Arc<PodCache>,
        ready: Arc<AtomicBool>,
        reports: Receiver<Report>,
        _keep: Vec<crossbeam_channel::Sender<PodUpdate>>,
    }

    impl Rig {
        /// The UID of the next worker to finish, within `within`; the
        /// resyncs asked for meanwhile go to the queue, as the loop does.
        fn finished(&mut self, within: Duration) -> String {
            let deadline = Instant::now() + within;
            loop {
                let left = deadline.saturating_duration_since(Instant::now());
                match self.reports.recv_timeout(left) {
                    Ok(Report::Resync(uid, after)) => self.kubelet.workers.requeue(&uid, after),
                    Ok(Report::Done(uid)) => return uid,
                    Err(e) => panic!("no worker finished within {within:?}: {e}"),
                }
            }
        }
    }

    fn rig() -> Rig {
        let (fake, rm) = test_manager("kl");
        rig_with(fake, rm)
    }

    fn rig_with(fake: Arc<FakeRuntime>, rm: Arc<RuntimeManager>) -> Rig {
        let cache = PodCache::new();
        cache.update_time(Instant::now(), Arc::new(vec![]));
        // Room for every resync the tests' workers ask for: a test reads
        // the reports only when it waits for a worker to finish.
        let (reports_tx, reports) = crossbeam_channel::bounded(1024);
        let workers = PodWorkers::new(
            rm.clone(),
            cache.clone(),
            Duration::from_secs(60),
            reports_tx,
        );
        let ready = Arc::new(AtomicBool::new(false));
        let r = ready.clone();
        let (utx, urx) = crossbeam_channel::bounded(1);
        let kubelet = Kubelet::new(
            workers,
            cache.clone(),
            Box::new(move || r.load(Ordering::SeqCst)),
            Inputs {
                updates: urx,
                pleg: crossbeam_channel::never(),
                worker_reports: crossbeam_channel::never(),
                probes: crossbeam_channel::never(),
                stop: crossbeam_channel::never(),
            },
        );
        Rig {
            kubelet,
            fake,
            rm,
            cache,
            ready,
            reports,
            _keep: vec![utx],
        }
    }

    fn update(op: PodOperation, pods: Vec<Pod>) -> Event {
        Event::Config(PodUpdate {
            pods: pods.into_iter().map(Arc::new).collect(),
            op,
            source: "file".into(),
        })
    }

    #[test]
    fn pods_whose_names_cannot_be_paths_never_start() {
        let mut r = rig();
        let mut bad_volume = pod("u2", "vol");
        if let Some(spec) = bad_volume.spec.as_mut() {
            spec.volumes = Some(vec![k8s_openapi::api::core::v1::Volume {
                name: "a/b".into(),
                empty_dir: Some(Default::default()),
                ..Default::default()
            }]);
        }
        let bad = vec![pod("..", "dotdot"), bad_volume, pod("u3", "a/b")];
        r.kubelet
            .handle_event(update(PodOperation::Add, bad.clone()));
        r.kubelet
            .handle_event(update(PodOperation::Update, bad.clone()));
        r.kubelet
            .handle_event(update(PodOperation::Add, vec![pod("u1", "web")]));
        wait_for("the valid pod started", || {
            r.fake.count("StartContainer") == 1
        });
        assert_eq!(r.fake.count("RunPodSandbox"), 1);
        assert!(r.kubelet.pods.contains_key("u1"));
        assert_eq!(r.kubelet.pods.len(), 1);
        // Their removal is a no-op: nothing was made for them.
        r.kubelet.handle_event(update(PodOperation::Remove, bad));
        assert_eq!(r.kubelet.pods.len(), 1);
        assert!(r.kubelet.rejected.is_empty());
    }

    /// The pod the config sent is the one the pod manager keeps and the
    /// worker gets: no copy on the way.
    #[test]
    fn the_config_pods_are_kept_as_sent() {
        let mut r = rig();
        let sent = Arc::new(pod("u1", "web"));
        r.kubelet.handle_event(Event::Config(PodUpdate {
            pods: vec![sent.clone()],
            op: PodOperation::Add,
            source: "file".into(),
        }));
        assert!(Arc::ptr_eq(&r.kubelet.pods["u1"], &sent));
        let mut changed = pod("u1", "web");
        if let Some(spec) = changed.spec.as_mut() {
            spec.containers[0].image = Some("other".into());
        }
        let changed = Arc::new(changed);
        r.kubelet.handle_event(Event::Config(PodUpdate {
            pods: vec![changed.clone()],
            op: PodOperation::Update,
            source: "file".into(),
        }));
        assert!(Arc::ptr_eq(&r.kubelet.pods["u1"], &changed));
    }

    #[test]
    fn add_runs_the_pod_and_remove_tears_it_down() {
        let mut r = rig();
        r.kubelet
            .handle_event(update(PodOperation::Add, vec![pod("u1", "web")]));
        wait_for("container started", || r.fake.count("StartContainer") == 1);
        // As the PLEG would: a relist after the sync inspects the pod.
        std::thread::sleep(Duration::from_millis(20));
        let status = r.rm.get_pod_status("u1", "web", "default").unwrap();
        r.cache.set("u1", status, None, Instant::now());
        // A PLEG event for a known pod syncs it; nothing needs doing.
        r.kubelet.handle_event(Event::Pleg(PodLifecycleEvent {
            uid: "u1".into(),
            kind: PodLifecycleEventType::ContainerStarted,
            data: "x".into(),
        }));
        std::thread::sleep(Duration::from_millis(50));
        r.kubelet
            .handle_event(update(PodOperation::Remove, vec![pod("u1", "web")]));
        let uid = r.finished(Duration::from_secs(5));
        r.kubelet.handle_event(Event::WorkerDone(uid));
        assert!(r.fake.sandboxes().is_empty());
        assert_eq!(r.fake.count("RunPodSandbox"), 1);
        assert!(r.kubelet.workers.is_empty());
        assert!(r.kubelet.pods.is_empty());
    }

    #[test]
    fn a_deleted_pod_whose_worker_finished_is_not_started_or_killed_again() {
        let mut r = rig();
        r.kubelet
            .handle_event(update(PodOperation::Add, vec![pod("u1", "web")]));
        wait_for("container started", || r.fake.count("StartContainer") == 1);
        let mut deleting = pod("u1", "web");
        deleting.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::now(),
            ));
        deleting.metadata.deletion_grace_period_seconds = Some(30);
        r.kubelet
            .handle_event(update(PodOperation::Delete, vec![deleting.clone()]));
        let uid = r.finished(Duration::from_secs(5));
        r.kubelet.handle_event(Event::WorkerDone(uid));
        assert!(r.fake.sandboxes().is_empty());
        let stops = r.fake.count("StopPodSandbox");

        // Until the API object is gone, neither a PLEG event from the relist
        // after the removal, nor a resync, nor the final DELETE's grace-0
        // update runs the pod again or starts a second termination.
        std::thread::sleep(Duration::from_millis(20));
        let status = r.rm.get_pod_status("u1", "web", "default").unwrap();
        r.cache.set("u1", status, None, Instant::now());
        r.kubelet.handle_event(Event::Pleg(PodLifecycleEvent {
            uid: "u1".into(),
            kind: PodLifecycleEventType::ContainerRemoved,
            data: "x".into(),
        }));
        r.kubelet
            .handle_event(Event::Resync("u1".into(), Duration::ZERO));
        r.kubelet.handle_event(Event::SyncTick);
        // Time for a wrongly started worker to run its sync.
        std::thread::sleep(Duration::from_millis(300));
        deleting.metadata.deletion_grace_period_seconds = Some(0);
        r.kubelet
            .handle_event(update(PodOperation::Delete, vec![deleting.clone()]));
        std::thread::sleep(Duration::from_millis(100));
        assert!(r.kubelet.workers.is_empty(), "a worker was started again");
        assert_eq!(r.fake.count("RunPodSandbox"), 1);
        assert_eq!(r.fake.count("StopPodSandbox"), stops);

        r.kubelet
            .handle_event(update(PodOperation::Remove, vec![deleting]));
        std::thread::sleep(Duration::from_millis(50));
        assert!(r.kubelet.workers.is_empty());
        assert!(r.kubelet.pods.is_empty());
        assert_eq!(r.fake.count("StopPodSandbox"), stops);

        // The same UID added again afterwards is a new pod (a static pod
        // whose manifest came back).
        r.kubelet
            .handle_event(update(PodOperation::Add, vec![pod("u1", "web")]));
        wait_for("sandbox run again", || r.fake.count("RunPodSandbox") == 2);
    }

    #[test]
    fn a_probe_event_has_the_worker_restart_a_container_whose_liveness_failed() {
        use crate::prober::{ProbeKind, ProbeResults};
        let (fake, rm) = test_manager("kl-probe");
        let results = Arc::new(ProbeResults::default());
        let rm = Arc::new(
            Arc::try_unwrap(rm)
                .ok()
                .unwrap()
                .with_probe_results(results.clone()),
        );
        let mut r = rig_with(fake, rm);
        r.kubelet
            .handle_event(update(PodOperation::Add, vec![pod("u1", "web")]));
        wait_for("container started", || r.fake.count("StartContainer") == 1);
        std::thread::sleep(Duration::from_millis(20));
        let status = r.rm.get_pod_status("u1", "web", "default").unwrap();
        let id = status.latest("app").unwrap().id.clone();
        results.set_for_test(
            &id,
            ProbeKind::Liveness,
            crate::prober::ProbeResult::Failure,
        );
        r.cache.set("u1", status, None, Instant::now());
        r.kubelet.handle_event(Event::Probe("u1".into()));
        wait_for("container restarted", || {
            r.fake.count("StartContainer") == 2
        });
        assert_eq!(r.fake.count("StopContainer"), 1);
        let after = r.rm.get_pod_status("u1", "web", "default").unwrap();
        assert_eq!(after.latest("app").unwrap().restart_count, 1);
        // A probe event for a pod the loop does not know does nothing.
        r.kubelet.handle_event(Event::Probe("nobody".into()));
        assert!(!r.kubelet.workers.is_known("nobody"));
    }

    #[test]
    fn loop_stats_keep_the_longest_turn_and_flag_slow_ones() {
        let mut st = LoopStats::default();
        let add = EventKind::Config {
            op: PodOperation::Add,
            pods: 3,
        };
        assert!(!st.record(EventKind::SyncTick, Duration::from_millis(2)));
        assert!(st.record(add, Duration::from_millis(150)));
        // Housekeeping may take up to a second, as upstream expects.
        assert!(!st.record(EventKind::Housekeeping, Duration::from_millis(900)));
        assert!(st.record(EventKind::Housekeeping, Duration::from_millis(1100)));
        assert!(!st.record(EventKind::WorkerDone, Duration::from_millis(1)));
        assert_eq!(st.turns, 5);
        assert_eq!(st.longest, Duration::from_millis(1100));
        assert_eq!(st.longest_kind, Some(EventKind::Housekeeping));
        assert_eq!(st.to_string(), "5 turns, longest 1100 ms (housekeeping)");
        assert_eq!(add.to_string(), "config Add, 3 pods");
        assert_eq!(
            Event::Pleg(PodLifecycleEvent {
                uid: "u".into(),
                kind: PodLifecycleEventType::ContainerDied,
                data: "x".into(),
            })
            .kind()
            .to_string(),
            "PLEG ContainerDied"
        );
    }

    #[test]
    fn the_summary_names_the_longest_turn_and_worker_wait() {
        let mut r = rig();
        assert_eq!(
            r.kubelet.summary(),
            "sync loop: 0 turns, longest 0 ms; longest pod worker wait none"
        );
        r.kubelet
            .stats
            .record(EventKind::SyncTick, Duration::from_millis(12));
        r.kubelet
            .handle_event(update(PodOperation::Add, vec![pod("u1", "web")]));
        wait_for("container started", || r.fake.count("StartContainer") == 1);
        let s = r.kubelet.summary();
        assert!(
            s.starts_with(
                "sync loop: 1 turns, longest 12 ms (sync tick); longest pod worker wait "
            ),
            "{s}"
        );
        assert!(s.ends_with(" ms (default/web)"), "{s}");
    }

    #[test]
    fn a_pod_added_again_while_terminating_starts_once_its_worker_finished() {
        let mut r = rig();
        r.kubelet
            .handle_event(update(PodOperation::Add, vec![pod("u1", "web")]));
        wait_for("container started", || r.fake.count("StartContainer") == 1);
        r.kubelet
            .handle_event(update(PodOperation::Remove, vec![pod("u1", "web")]));
        // The same UID again (a manifest put back) before the loop has
        // heard that the old worker finished: that worker ignores it.
        r.kubelet
            .handle_event(update(PodOperation::Add, vec![pod("u1", "web")]));
        let uid = r.finished(Duration::from_secs(5));
        r.kubelet.handle_event(Event::WorkerDone(uid));
        wait_for("sandbox run again", || r.fake.count("RunPodSandbox") == 2);
        wait_for("container started again", || {
            r.fake.count("StartContainer") == 2
        });
        assert_eq!(r.fake.sandboxes().len(), 1);
        assert!(r.kubelet.workers.is_known("u1"));
        assert!(!r.kubelet.terminated.contains("u1"));
    }

    #[test]
    fn housekeeping_stops_unwanted_runtime_pods_only_once_sources_are_ready() {
        let mut r = rig();
        // A pod left in the runtime by an earlier run whose manifest is gone.
        let mut cfg = crate::runtime::config::sandbox_config(
            &pod("gone", "old"),
            0,
            std::path::Path::new("/tmp"),
            &Default::default(),
        );
        cfg.log_directory.clear();
        r.fake.run_pod_sandbox(&cfg, "").unwrap();
        r.cache
            .update_time(Instant::now(), Arc::new(r.rm.get_pods().unwrap()));

        r.kubelet.handle_event(Event::Housekeeping);
        std::thread::sleep(Duration::from_millis(100));
        assert_eq!(
            r.fake.sandboxes().len(),
            1,
            "must wait until all sources are seen"
        );

        r.ready.store(true, Ordering::SeqCst);
        r.kubelet.handle_event(Event::Housekeeping);
        let uid = r.finished(Duration::from_secs(5));
        assert_eq!(uid, "gone");
        r.kubelet.handle_event(Event::WorkerDone(uid));
        assert!(r.fake.sandboxes().is_empty());
        // The relist from before the removal does not start a second kill.
        r.kubelet.handle_event(Event::Housekeeping);
        assert!(r.kubelet.workers.is_empty());
    }

    #[test]
    fn housekeeping_has_the_sweeper_remove_only_the_directories_no_pod_claims() {
        let root = tempfile::tempdir().unwrap();
        let pods = root.path().join("pods");
        let mut r = rig();
        r.kubelet = r
            .kubelet
            .with_orphan_sweeper(OrphanSweeper::new(root.path().to_path_buf()));
        r.ready.store(true, Ordering::SeqCst);
        r.kubelet
            .handle_event(update(PodOperation::Add, vec![pod("u1", "web")]));
        wait_for("container started", || r.fake.count("StartContainer") == 1);
        for uid in ["u1", "gone"] {
            std::fs::create_dir_all(pods.join(uid).join("volumes")).unwrap();
        }
        r.kubelet.handle_event(Event::Housekeeping);
        wait_for("the orphan's removal", || !pods.join("gone").exists());
        // Once a second sweep is over, the first one is too.
        std::fs::create_dir_all(pods.join("gone-too")).unwrap();
        r.kubelet.handle_event(Event::Housekeeping);
        wait_for("the second orphan's removal", || {
            !pods.join("gone-too").exists()
        });
        assert!(
            pods.join("u1").join("volumes").is_dir(),
            "a desired pod's stays"
        );
    }

    fn strict_node() -> NodeInfo {
        NodeInfo {
            name: "kl".into(),
            labels: Default::default(),
            allocatable_milli_cpu: i64::MAX,
            allocatable_memory: i64::MAX,
            allocatable_ephemeral_storage: i64::MAX,
            allowed_pod_number: i64::MAX,
            os: "linux",
            allow_privileged: false,
            sysctls: Default::default(),
        }
    }

    /// A pod whose status is terminal (Failed past its deadline, a finished
    /// Job) no longer takes a place on the node: a new pod is admitted.
    #[test]
    fn a_finished_pod_does_not_count_toward_admission() {
        let reporter = StatusReporter::standalone();
        let r = rig();
        let mut r = Rig {
            kubelet: r.kubelet.with_cluster(
                reporter.clone(),
                EventRecorder::disabled(),
                Box::new(|| NodeInfo {
                    allowed_pod_number: 1,
                    ..strict_node()
                }),
            ),
            ..r
        };
        let done = Arc::new(pod("u1", "job"));
        r.kubelet
            .handle_event(update(PodOperation::Add, vec![done.as_ref().clone()]));
        reporter.set_status(
            &done,
            k8s_openapi::api::core::v1::PodStatus {
                phase: Some("Failed".into()),
                reason: Some("DeadlineExceeded".into()),
                ..Default::default()
            },
        );
        r.kubelet
            .handle_event(update(PodOperation::Add, vec![pod("u2", "web")]));
        assert!(
            !r.kubelet.rejected.contains_key("u2"),
            "u2 was refused for a place the finished pod no longer holds"
        );
        assert!(r.kubelet.pods.contains_key("u2"));
        r.kubelet.workers.shutdown(Duration::from_secs(2));
    }

    /// A pod edited in place (same UID) to need privileges under
    /// `--allow-privileged=false`: the edit is refused, what ran stops, and
    /// nothing starts it again.
    #[test]
    fn an_evicted_pod_is_failed_stopped_and_never_started_again() {
        let r = rig();
        let reporter = StatusReporter::standalone();
        let pressure = Arc::new(crate::eviction::State::default());
        let (_evict_tx, evict_rx) = crossbeam_channel::bounded(1);
        let mut r = Rig {
            kubelet: r
                .kubelet
                .with_cluster(
                    reporter.clone(),
                    EventRecorder::disabled(),
                    Box::new(|| NodeInfo {
                        allow_privileged: true,
                        ..strict_node()
                    }),
                )
                .with_eviction(pressure.clone(), evict_rx),
            ..r
        };
        let p = pod("u1", "web");
        r.kubelet
            .handle_event(update(PodOperation::Add, vec![p.clone()]));
        wait_for("container started", || r.fake.count("StartContainer") == 1);
        let message = "The node was low on resource: ephemeral-storage. ".to_string();
        r.kubelet
            .handle_event(Event::Evict(crate::eviction::manager::Eviction {
                pod: Arc::new(p.clone()),
                message: message.clone(),
                grace_period: 0,
            }));
        let status = reporter.status("u1").expect("a status");
        assert_eq!(status.phase.as_deref(), Some("Failed"));
        assert_eq!(status.reason.as_deref(), Some("Evicted"));
        assert_eq!(status.message.as_deref(), Some(message.as_str()));
        let uid = r.finished(Duration::from_secs(5));
        r.kubelet.handle_event(Event::WorkerDone(uid));
        assert!(r.fake.sandboxes().is_empty(), "the pod was not stopped");
        assert!(!r.kubelet.pods.contains_key("u1"));
        r.kubelet
            .handle_event(update(PodOperation::Update, vec![p.clone()]));
        std::thread::sleep(Duration::from_millis(200));
        assert!(r.kubelet.workers.is_empty());
        assert_eq!(r.fake.count("RunPodSandbox"), 1);

        // Under disk pressure a new pod is refused with reason Evicted.
        pressure.set(&[crate::eviction::Condition::Disk]);
        r.kubelet
            .handle_event(update(PodOperation::Add, vec![pod("u2", "db")]));
        let status = reporter.status("u2").expect("a status");
        assert_eq!(status.phase.as_deref(), Some("Failed"));
        assert_eq!(status.reason.as_deref(), Some("Evicted"));
        assert!(r.kubelet.rejected.contains_key("u2"));
        assert_eq!(r.fake.count("RunPodSandbox"), 1);
    }

    #[test]
    fn an_update_that_needs_privileges_is_refused_and_stops_the_pod() {
        let r = rig();
        let mut r = Rig {
            kubelet: r.kubelet.with_cluster(
                StatusReporter::standalone(),
                EventRecorder::disabled(),
                Box::new(strict_node),
            ),
            ..r
        };
        r.kubelet
            .handle_event(update(PodOperation::Add, vec![pod("u1", "web")]));
        wait_for("container started", || r.fake.count("StartContainer") == 1);
        let mut privileged = pod("u1", "web");
        if let Some(spec) = privileged.spec.as_mut() {
            spec.containers[0].security_context = Some(Default::default());
            if let Some(sc) = spec.containers[0].security_context.as_mut() {
                sc.privileged = Some(true);
            }
        }
        r.kubelet
            .handle_event(update(PodOperation::Update, vec![privileged.clone()]));
        let uid = r.finished(Duration::from_secs(5));
        r.kubelet.handle_event(Event::WorkerDone(uid));
        assert!(r.fake.sandboxes().is_empty(), "the pod was not stopped");
        assert!(r.kubelet.rejected.contains_key("u1"));
        assert!(!r.kubelet.pods.contains_key("u1"));
        // Neither the edit again nor its status coming back starts it.
        r.kubelet
            .handle_event(update(PodOperation::Update, vec![privileged.clone()]));
        r.kubelet
            .handle_event(update(PodOperation::Reconcile, vec![privileged]));
        std::thread::sleep(Duration::from_millis(200));
        assert!(r.kubelet.workers.is_empty());
        assert_eq!(r.fake.count("StartContainer"), 1);
        assert_eq!(r.fake.count("RunPodSandbox"), 1);
    }
}
