//! The status manager (upstream `status_manager.go` and `mirror_client.go`):
//! the one thread that writes pods to the API server. Pod workers hand it
//! each pod's generated status; it patches `pods/<name>/status` when the
//! status changed, keeps the mirror pod of every static pod right (created,
//! recreated when stale or deleted, deleted with its static pod), reports
//! static pods' status through their mirror pods, and deletes a gracefully
//! deleted API pod's object (grace period 0, UID precondition) once its
//! containers are gone.
//!
//! Threading: reporters write into a shared table under a short lock and
//! wake the thread through a one-slot channel (a wake-up that finds one
//! pending is coalesced). The table holds the latest status per pod with a
//! version; the thread sends the newest version and records which one the
//! server has, so a stale status never overwrites a newer one. No lock is
//! held across a request. Failed writes are retried with back-off; nothing
//! is polled.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{bounded, Receiver, Sender, TrySendError};
use k8s_openapi::api::core::v1::{Pod, PodStatus};
use log::{debug, info, warn};
use parking_lot::Mutex;
use serde_json::{json, Value};

use super::generate::{generate_pod_status, keep_foreign_conditions, StatusContext};
use super::patch::{status_equal, status_patch};
use crate::kube::{ApiError, Client, PatchKind};
use crate::node::NodeStateReader;
use crate::pod::{
    is_static_pod, pod_full_name, CONFIG_HASH_ANNOTATION_KEY, CONFIG_MIRROR_ANNOTATION_KEY,
};
use crate::prober::{ProbeResults, ProbeStatus};
use crate::runtime::WaitingReasons;
use crate::thread::{spawn_named, JoinOnDrop};

/// A mirror pod as the API server holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct MirrorPod {
    pub(crate) uid: String,
    /// Its `kubernetes.io/config.mirror` annotation: the static pod's hash.
    pub(crate) hash: String,
    pub(crate) deleting: bool,
}

impl MirrorPod {
    pub(crate) fn of(pod: &Pod) -> Option<MirrorPod> {
        let hash = pod
            .metadata
            .annotations
            .as_ref()?
            .get(CONFIG_MIRROR_ANNOTATION_KEY)?
            .clone();
        Some(MirrorPod {
            uid: pod.metadata.uid.clone().unwrap_or_default(),
            hash,
            deleting: pod.metadata.deletion_timestamp.is_some(),
        })
    }
}

/// What a pod's API status is generated from, besides the pod, its previous
/// status and the probe results. The status manager keeps it with the
/// status of a pod that has probes, so that a readiness or startup change
/// generates the status again at once, without a sync.
#[derive(Debug, Clone)]
pub(crate) struct StatusInputs {
    /// The runtime status the pod's worker last saw (after its sync).
    pub(crate) runtime: crate::runtime::PodStatus,
    pub(crate) waiting_reasons: WaitingReasons,
    /// The node's IP for `status.hostIP`.
    pub(crate) host_ip: Option<String>,
    /// The runtime's name for container IDs (`containerd://...`).
    pub(crate) runtime_name: String,
    /// `(reason, message)` of a pod that failed whatever its containers
    /// say (its active deadline passed).
    pub(crate) failed: Option<(String, String)>,
}

impl StatusInputs {
    /// The pod's API status, from these inputs, its previous status `old`
    /// (for transition times and the start time) and the probe results.
    pub(crate) fn generate(
        &self,
        pod: &Pod,
        old: Option<&PodStatus>,
        probes: Option<&ProbeResults>,
    ) -> PodStatus {
        let ctx = StatusContext {
            host_ip: self.host_ip.as_deref(),
            runtime_name: &self.runtime_name,
            waiting_reasons: &self.waiting_reasons,
            now: k8s_openapi::jiff::Timestamp::now(),
            probes,
        };
        let mut api = generate_pod_status(pod, &self.runtime, old, &ctx);
        if let Some((reason, message)) = &self.failed {
            api.phase = Some(crate::pod::FAILED.into());
            api.reason = Some(reason.clone());
            api.message = Some(message.clone());
        }
        api
    }
}

struct Entry {
    pod: Arc<Pod>,
    status: Option<PodStatus>,
    /// What `status` was generated from, for a pod with probes.
    inputs: Option<Box<StatusInputs>>,
    /// The sync loop set a terminal status (the pod was rejected or
    /// evicted): the worker's reports, made while it stops the pod, keep
    /// its phase, reason and message, as upstream applies the status a pod
    /// was killed with to every status generated through its termination.
    decided: bool,
    version: u64,
    /// The version the server has.
    sent: u64,
    /// The containers are gone; `true`: delete the API object too.
    finished: Option<bool>,
    /// The pod is being stopped: a static pod's mirror is no longer kept.
    killed: bool,
    /// When a mirror pod was last asked for, so the next one waits for the watch.
    mirror_asked: Option<Instant>,
    retry_at: Option<Instant>,
    failures: u32,
}

impl Entry {
    /// A pod the table has not seen: no status yet, nothing sent.
    fn new(pod: &Arc<Pod>) -> Entry {
        Entry {
            pod: pod.clone(),
            status: None,
            inputs: None,
            decided: false,
            version: 0,
            sent: 0,
            finished: None,
            killed: false,
            mirror_asked: None,
            retry_at: None,
            failures: 0,
        }
    }
}

#[derive(Default)]
struct Table {
    pods: HashMap<String, Entry>,
    /// Mirror pods by full name, as the API source reports them.
    mirrors: HashMap<String, MirrorPod>,
    /// Mirror pods whose static pod is gone: (full name, UID).
    orphans: Vec<(String, String)>,
    /// The API source's first list has been merged: until then a missing
    /// mirror pod may only be unknown yet, and is not created.
    api_seen: bool,
    /// UIDs of API objects this manager deleted (newest last, at most
    /// [`MAX_DELETED`]): a late report about one of them (a second
    /// termination after the watch's DELETED) sends nothing.
    /// Kept as hashes, in one block: a string each would stay scattered
    /// over the heap after a burst of deletions.
    deleted: VecDeque<u64>,
}

/// A UID's 64-bit hash (a collision among 256 UIDs is about one in 10^15).
fn uid_hash(uid: &str) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    uid.hash(&mut h);
    h.finish()
}

/// PATCHes one status change may take: the first, and one against the
/// server's answer when that still differs.
const STATUS_ROUNDS: u32 = 2;

/// Deleted UIDs remembered; older ones fall off (their late reports are
/// rare and only cost a 404).
const MAX_DELETED: usize = 256;

impl Table {
    fn was_deleted(&self, uid: &str) -> bool {
        let h = uid_hash(uid);
        self.deleted.iter().any(|u| *u == h)
    }
}

struct Shared {
    table: Mutex<Table>,
    wake: Sender<()>,
    /// No manager thread: nothing is sent, and a finished pod's entry is
    /// dropped at once.
    standalone: bool,
}

impl Shared {
    fn wake(&self) {
        match self.wake.try_send(()) {
            // A wake-up is pending already: it covers this one.
            Ok(()) | Err(TrySendError::Full(())) => {}
            Err(TrySendError::Disconnected(())) => {}
        }
    }
}

/// Where pod workers and the sync loop report to. Cheap to clone. Without
/// an API server (standalone) it only keeps the latest status of each pod.
#[derive(Clone)]
pub(crate) struct StatusReporter {
    shared: Arc<Shared>,
}

impl StatusReporter {
    /// A reporter with no thread behind it (standalone mode and tests).
    pub(crate) fn standalone() -> StatusReporter {
        let (tx, _) = bounded(1);
        StatusReporter {
            shared: Arc::new(Shared {
                table: Mutex::new(Table::default()),
                wake: tx,
                standalone: true,
            }),
        }
    }

    /// The latest status of pod `uid`, if any was set.
    pub(crate) fn status(&self, uid: &str) -> Option<PodStatus> {
        self.shared.table.lock().pods.get(uid)?.status.clone()
    }

    /// Whether pod `uid`'s latest status has a terminal phase (Succeeded or
    /// Failed): it no longer counts among the node's active pods.
    pub(crate) fn is_terminal(&self, uid: &str) -> bool {
        let t = self.shared.table.lock();
        let phase = t
            .pods
            .get(uid)
            .and_then(|e| e.status.as_ref())
            .and_then(|s| s.phase.as_deref());
        matches!(phase, Some("Succeeded" | "Failed"))
    }

    /// Records `status` for `pod`; it is sent if it differs from the last one.
    pub(crate) fn set_status(&self, pod: &Arc<Pod>, status: PodStatus) {
        self.store(pod, false, move |_| (status, None));
    }

    /// Generates `pod`'s status from `inputs`, its latest status (the API
    /// pod's before the first) and the probe results, records it as
    /// [`set_status`](Self::set_status) does, and returns it. With `keep`
    /// (a pod with probes), the inputs are kept to generate the status
    /// again when a readiness or startup result changes
    /// ([`probe_changed`](Self::probe_changed)). The status is generated
    /// under the table's lock, which `probe_changed` holds too, after the
    /// prober wrote its result: a status generated with the older result
    /// never overwrites the one with the newer.
    pub(crate) fn report(
        &self,
        pod: &Arc<Pod>,
        inputs: StatusInputs,
        probes: Option<&ProbeResults>,
        keep: bool,
    ) -> PodStatus {
        self.store(pod, true, move |old| {
            let status = inputs.generate(pod, old.or(pod.status.as_ref()), probes);
            (status, keep.then_some(inputs))
        })
    }

    /// Records the status `make` returns from the latest one, with the
    /// inputs to keep, and returns it. A worker's report (`by_worker`)
    /// keeps the phase, reason and message of a terminal status the sync
    /// loop set.
    fn store(
        &self,
        pod: &Arc<Pod>,
        by_worker: bool,
        make: impl FnOnce(Option<&PodStatus>) -> (PodStatus, Option<StatusInputs>),
    ) -> PodStatus {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let mut t = self.shared.table.lock();
        let (mut status, inputs) = make(t.pods.get(&uid).and_then(|e| e.status.as_ref()));
        if t.was_deleted(&uid) {
            return status;
        }
        let e = t.pods.entry(uid).or_insert_with(|| Entry::new(pod));
        e.pod = pod.clone();
        if e.finished.is_some() {
            return status;
        }
        if let Some(name) = e
            .status
            .as_ref()
            .and_then(|old| leaves_terminated(pod, old, &status))
        {
            debug!(
                "pod {}: status not recorded: container {name} cannot leave its terminated state",
                pod_full_name(pod)
            );
            return e.status.clone().unwrap_or(status);
        }
        if by_worker && e.decided {
            keep_decided(e.status.as_ref(), &mut status);
        } else if !by_worker {
            let phase = status.phase.as_deref();
            e.decided = matches!(phase, Some(crate::pod::FAILED | crate::pod::SUCCEEDED));
        }
        e.inputs = inputs.map(Box::new);
        if e.status.as_ref() == Some(&status) {
            return status;
        }
        e.status = Some(status.clone());
        e.version += 1;
        drop(t);
        self.shared.wake();
        status
    }

    /// A readiness or startup result of pod `uid` changed (upstream's
    /// `SetContainerReadiness` and `SetContainerStartup`): its status is
    /// generated again, with `probes`, from what its worker last reported
    /// it from (the containers' `ready` and `started`, the Ready,
    /// ContainersReady and Initialized conditions, the phase), and sent if
    /// that changed it. A pod not reported yet gets the results with its
    /// first status.
    pub(crate) fn probe_changed(&self, uid: &str, probes: &ProbeResults) {
        let mut t = self.shared.table.lock();
        let Some(e) = t.pods.get_mut(uid) else {
            return;
        };
        if e.finished.is_some() {
            return;
        }
        let (Some(inputs), Some(old)) = (e.inputs.as_deref(), e.status.as_ref()) else {
            return;
        };
        let mut status = inputs.generate(&e.pod, Some(old), Some(probes));
        if e.decided {
            keep_decided(Some(old), &mut status);
        }
        if *old == status {
            return;
        }
        debug!("pod {}: status after a probe result", pod_full_name(&e.pod));
        e.status = Some(status);
        e.version += 1;
        drop(t);
        self.shared.wake();
    }

    /// The pod's containers are stopped and removed. A gracefully deleted API
    /// pod (`delete_object`) then has its API object deleted; a static pod
    /// loses its mirror pod; any other entry is forgotten.
    pub(crate) fn pod_finished(&self, pod: &Arc<Pod>, delete_object: bool) {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let mut t = self.shared.table.lock();
        if self.shared.standalone {
            // Nothing to tell anyone: the pod's status goes with it.
            t.pods.remove(&uid);
            crate::malloc::shrink_map(&mut t.pods);
            return;
        }
        if t.was_deleted(&uid) {
            return;
        }
        match t.pods.get_mut(&uid) {
            Some(e) => {
                e.finished = Some(delete_object);
                e.retry_at = None;
            }
            None if delete_object || is_static_pod(pod) => {
                t.pods.insert(
                    uid,
                    Entry {
                        finished: Some(delete_object),
                        killed: true,
                        ..Entry::new(pod)
                    },
                );
            }
            None => return,
        }
        drop(t);
        self.shared.wake();
    }

    /// The pod is being stopped: from now on a static pod's mirror pod is
    /// neither created nor updated (housekeeping deletes it).
    pub(crate) fn pod_killed(&self, pod: &Arc<Pod>) {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        self.shared
            .table
            .lock()
            .pods
            .entry(uid)
            .or_insert_with(|| Entry::new(pod))
            .killed = true;
    }

    /// Forgets pod `uid` (its API object is gone).
    pub(crate) fn forget(&self, uid: &str) {
        let mut t = self.shared.table.lock();
        t.pods.remove(uid);
        crate::malloc::shrink_map(&mut t.pods);
    }

    /// The API source's view of the mirror pod named `full_name` (`None`: gone).
    pub(crate) fn set_mirror(&self, full_name: &str, mirror: Option<MirrorPod>) {
        let mut t = self.shared.table.lock();
        let changed = match mirror {
            Some(m) => t.mirrors.insert(full_name.to_string(), m.clone()) != Some(m),
            None => t.mirrors.remove(full_name).is_some(),
        };
        if changed {
            // A static pod waiting for its mirror can now report through it.
            for e in t.pods.values_mut() {
                if pod_full_name(&e.pod) == full_name {
                    e.mirror_asked = None;
                    e.retry_at = None;
                }
            }
            drop(t);
            self.shared.wake();
        }
    }

    /// The API source's first list has been merged, so the mirror pods it
    /// holds are known.
    pub(crate) fn api_seen(&self) {
        let mut t = self.shared.table.lock();
        if !t.api_seen {
            t.api_seen = true;
            drop(t);
            self.shared.wake();
        }
    }

    /// Deletes a mirror pod whose static pod is gone (housekeeping).
    pub(crate) fn delete_orphan_mirror(&self, full_name: &str, uid: &str) {
        let mut t = self.shared.table.lock();
        if t.orphans.iter().any(|(_, u)| u == uid) {
            return;
        }
        t.orphans.push((full_name.to_string(), uid.to_string()));
        drop(t);
        self.shared.wake();
    }

    /// Full names of the mirror pods the API source reported.
    pub(crate) fn mirrors(&self) -> Vec<(String, MirrorPod)> {
        self.shared
            .table
            .lock()
            .mirrors
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    }
}

/// The container that `new` shows not terminated although `old` showed it
/// terminated and the pod's restart policy does not start it again (under
/// `Never`, or `OnFailure` after exit 0): such a status is stale (a
/// status read while the pod was being stopped can show an exited
/// container as unknown), and upstream's status manager refuses it too.
fn leaves_terminated(pod: &Pod, old: &PodStatus, new: &PodStatus) -> Option<String> {
    let policy = pod
        .spec
        .as_ref()
        .and_then(|s| s.restart_policy.as_deref())
        .unwrap_or("Always");
    if policy == "Always" {
        return None;
    }
    let pairs = [
        (&old.container_statuses, &new.container_statuses),
        (&old.init_container_statuses, &new.init_container_statuses),
    ];
    for (old, new) in pairs {
        for was in old.iter().flatten() {
            let Some(t) = was.state.as_ref().and_then(|s| s.terminated.as_ref()) else {
                continue;
            };
            if policy == "OnFailure" && t.exit_code != 0 {
                continue;
            }
            let left = new.iter().flatten().any(|now| {
                now.name == was.name && now.state.as_ref().is_none_or(|s| s.terminated.is_none())
            });
            if left {
                return Some(was.name.clone());
            }
        }
    }
    None
}

/// Gives `status` the phase, reason and message of the terminal status
/// the sync loop `decided` for the pod.
fn keep_decided(decided: Option<&PodStatus>, status: &mut PodStatus) {
    if let Some(d) = decided {
        status.phase.clone_from(&d.phase);
        status.reason.clone_from(&d.reason);
        status.message.clone_from(&d.message);
    }
}

impl ProbeStatus for StatusReporter {
    fn probe_changed(&self, uid: &str, results: &ProbeResults) {
        StatusReporter::probe_changed(self, uid, results);
    }
}

/// Handle of the `status-manager` thread; dropping it stops and joins it.
pub(crate) struct StatusManager {
    _stop: Sender<()>,
    _thread: JoinOnDrop<()>,
}

impl StatusManager {
    pub(crate) fn start(
        client: Client,
        node: NodeStateReader,
        node_name: String,
    ) -> std::io::Result<(StatusManager, StatusReporter)> {
        let (wake_tx, wake_rx) = bounded(1);
        let shared = Arc::new(Shared {
            table: Mutex::new(Table::default()),
            wake: wake_tx,
            standalone: false,
        });
        let (stop_tx, stop_rx) = bounded::<()>(0);
        let worker = Worker {
            client,
            shared: shared.clone(),
            node,
            node_name,
        };
        let thread = spawn_named("status-manager", move || worker.run(wake_rx, stop_rx))?;
        Ok((
            StatusManager {
                _stop: stop_tx,
                _thread: thread,
            },
            StatusReporter { shared },
        ))
    }
}

struct Worker {
    client: Client,
    shared: Arc<Shared>,
    node: NodeStateReader,
    node_name: String,
}

/// What one pod needs from the API server, taken from the table.
enum Job {
    /// Patch `status` (version `version`) to the object with this UID.
    Patch {
        uid: String,
        target_uid: String,
        namespace: String,
        name: String,
        old: Option<Box<PodStatus>>,
        status: Box<PodStatus>,
        version: u64,
    },
    CreateMirror {
        uid: String,
        pod: Arc<Pod>,
    },
    DeleteObject {
        uid: String,
        namespace: String,
        name: String,
        target_uid: String,
        /// Remove the entry afterwards.
        last: bool,
    },
    Forget(String),
}

const MIRROR_WAIT: Duration = Duration::from_secs(5);

impl Worker {
    fn run(self, wake: Receiver<()>, stop: Receiver<()>) {
        loop {
            let now = Instant::now();
            let (jobs, next) = self.plan(now);
            for job in jobs {
                if !matches!(stop.try_recv(), Err(crossbeam_channel::TryRecvError::Empty)) {
                    return;
                }
                self.run_job(job);
            }
            // A job that failed just now is retried at its own time, which
            // the plan made before it could not know.
            let next = [next, self.next_retry()].into_iter().flatten().min();
            let timeout = next.map(|t| t.saturating_duration_since(Instant::now()));
            crossbeam_channel::select! {
                recv(stop) -> _ => return,
                recv(wake) -> msg => if msg.is_err() { return },
                recv(timeout.map(crossbeam_channel::after).unwrap_or_else(crossbeam_channel::never)) -> _ => {}
            }
        }
    }

    /// The earliest retry any pod waits for.
    fn next_retry(&self) -> Option<Instant> {
        let t = self.shared.table.lock();
        t.pods.values().filter_map(|e| e.retry_at).min()
    }

    /// Decides the jobs to run now and when to look again.
    fn plan(&self, now: Instant) -> (Vec<Job>, Option<Instant>) {
        let mut t = self.shared.table.lock();
        let mut jobs = Vec::new();
        let mut next: Option<Instant> = None;
        let mut wait_until = |at: Instant| next = Some(next.map_or(at, |n| n.min(at)));
        for (full_name, uid) in std::mem::take(&mut t.orphans) {
            let (namespace, name) = full_name.split_once('/').unwrap_or(("", &full_name));
            jobs.push(Job::DeleteObject {
                uid: String::new(),
                namespace: namespace.to_string(),
                name: name.to_string(),
                target_uid: uid,
                last: false,
            });
        }
        let mirrors = t.mirrors.clone();
        let api_seen = t.api_seen;
        for (uid, e) in t.pods.iter_mut() {
            if let Some(at) = e.retry_at {
                if at > now {
                    wait_until(at);
                    continue;
                }
            }
            let pod = &e.pod;
            let full_name = pod_full_name(pod);
            let namespace = pod.metadata.namespace.clone().unwrap_or_default();
            let name = pod.metadata.name.clone().unwrap_or_default();
            if is_static_pod(pod) {
                let hash = static_hash(pod);
                let mirror = mirrors.get(&full_name);
                if let Some(_delete) = e.finished {
                    match mirror {
                        Some(m) => jobs.push(Job::DeleteObject {
                            uid: uid.clone(),
                            namespace,
                            name,
                            target_uid: m.uid.clone(),
                            last: true,
                        }),
                        None => jobs.push(Job::Forget(uid.clone())),
                    }
                    continue;
                }
                if e.killed {
                    // Stopping: its mirror goes (housekeeping, or when finished).
                    continue;
                }
                match mirror {
                    Some(m) if m.hash == hash && !m.deleting => {
                        if let Some(status) = e.status.clone().filter(|_| e.version > e.sent) {
                            jobs.push(Job::Patch {
                                uid: uid.clone(),
                                target_uid: m.uid.clone(),
                                namespace,
                                name,
                                old: None,
                                status: Box::new(status),
                                version: e.version,
                            });
                        }
                    }
                    Some(m) => {
                        // Stale or being deleted: remove it; the new one follows.
                        info!("mirror pod {full_name} is stale or being deleted; deleting it");
                        jobs.push(Job::DeleteObject {
                            uid: uid.clone(),
                            namespace,
                            name,
                            target_uid: m.uid.clone(),
                            last: false,
                        });
                        e.mirror_asked = None;
                    }
                    None if !api_seen => {}
                    None => {
                        if let Some(asked) = e.mirror_asked {
                            if now < asked + MIRROR_WAIT {
                                wait_until(asked + MIRROR_WAIT);
                                continue;
                            }
                        }
                        e.mirror_asked = Some(now);
                        jobs.push(Job::CreateMirror {
                            uid: uid.clone(),
                            pod: pod.clone(),
                        });
                    }
                }
                continue;
            }
            if e.version > e.sent {
                if let Some(status) = e.status.clone() {
                    jobs.push(Job::Patch {
                        uid: uid.clone(),
                        target_uid: uid.clone(),
                        namespace: namespace.clone(),
                        name: name.clone(),
                        old: pod.status.clone().map(Box::new),
                        status: Box::new(status),
                        version: e.version,
                    });
                }
            }
            match e.finished {
                Some(true) => jobs.push(Job::DeleteObject {
                    uid: uid.clone(),
                    namespace,
                    name,
                    target_uid: uid.clone(),
                    last: true,
                }),
                Some(false) => jobs.push(Job::Forget(uid.clone())),
                None => {}
            }
        }
        (jobs, next)
    }

    /// Schedules a retry of `uid`'s work; false when the apiserver could not
    /// be reached at all.
    fn failed(&self, uid: &str, what: &str, e: &ApiError) -> bool {
        let mut t = self.shared.table.lock();
        if let Some(entry) = t.pods.get_mut(uid) {
            entry.failures += 1;
            let delay = Duration::from_millis(500)
                .saturating_mul(1 << entry.failures.min(6))
                .min(Duration::from_secs(30));
            entry.retry_at = Some(Instant::now() + delay);
            if entry.failures <= 3 || entry.failures.is_multiple_of(10) {
                warn!("{what}: {e}; retrying in {:.1}s", delay.as_secs_f32());
            }
        } else {
            warn!("{what}: {e}");
        }
        !e.is_transport()
    }

    fn succeeded(&self, uid: &str, f: impl FnOnce(&mut Entry)) {
        let mut t = self.shared.table.lock();
        if let Some(entry) = t.pods.get_mut(uid) {
            entry.failures = 0;
            entry.retry_at = None;
            f(entry);
        }
    }

    /// Runs one job; false when the apiserver could not be reached.
    fn run_job(&self, job: Job) -> bool {
        match job {
            Job::Forget(uid) => {
                let mut t = self.shared.table.lock();
                t.pods.remove(&uid);
                crate::malloc::shrink_map(&mut t.pods);
                true
            }
            Job::Patch {
                uid,
                target_uid,
                namespace,
                name,
                old,
                status,
                version,
            } => {
                // Conditions other controllers set stay as the server has them.
                let status = keep_foreign_conditions(old.as_deref(), &status);
                if old.as_ref().is_some_and(|o| status_equal(o, &status)) {
                    // The server has this status already (after a restart,
                    // say): an empty patch would only cost a request.
                    debug!("pod {namespace}/{name}: status unchanged (version {version})");
                    self.succeeded(&uid, |e| e.sent = e.sent.max(version));
                    return true;
                }
                let path = format!("/api/v1/namespaces/{namespace}/pods/{name}/status");
                let mut old = old;
                for round in 1..=STATUS_ROUNDS {
                    let status = keep_foreign_conditions(old.as_deref(), &status);
                    let patch = status_patch(&target_uid, old.as_deref(), &status);
                    crate::fault::point("status-patch", format_args!("{namespace}/{name}"));
                    match self.client.patch(&path, PatchKind::Strategic, &patch) {
                        Ok(mut answer) => {
                            // The answer is the object as the server now has
                            // it. A patch made against a stale view (the
                            // source's copy after a restart, or none for a
                            // mirror pod) can leave fields tinylet owns as
                            // they were: patch again against the answer, as
                            // upstream patches against a fresh GET.
                            let server = answer.get_mut("status").map(Value::take).and_then(|v| {
                                <PodStatus as serde::Deserialize>::deserialize(&v).ok()
                            });
                            if let Some(server) = server.filter(|s| !status_equal(s, &status)) {
                                if round < STATUS_ROUNDS {
                                    debug!("pod {namespace}/{name}: the server's status still differs; patching against it");
                                    old = Some(Box::new(server));
                                    continue;
                                }
                                warn!("pod {namespace}/{name}: the server's status still differs after {STATUS_ROUNDS} patches");
                            }
                            debug!("pod {namespace}/{name}: status sent (version {version})");
                            self.succeeded(&uid, |e| e.sent = e.sent.max(version));
                            return true;
                        }
                        Err(e) if e.is_not_found() || e.code() == Some(422) || e.is_conflict() => {
                            // The object is gone or is another pod by now.
                            debug!("pod {namespace}/{name}: status not sent: {e}");
                            self.succeeded(&uid, |e| e.sent = e.sent.max(version));
                            return true;
                        }
                        Err(e) => {
                            return self.failed(
                                &uid,
                                &format!("pod {namespace}/{name}: status"),
                                &e,
                            )
                        }
                    }
                }
                true
            }
            Job::CreateMirror { uid, pod } => {
                let full_name = pod_full_name(&pod);
                let Some(body) = self.mirror_body(&pod) else {
                    debug!("mirror pod {full_name}: waiting for the Node's UID");
                    let mut t = self.shared.table.lock();
                    if let Some(e) = t.pods.get_mut(&uid) {
                        e.mirror_asked = None;
                        e.retry_at = Some(Instant::now() + Duration::from_secs(1));
                    }
                    return true;
                };
                let ns = pod.metadata.namespace.clone().unwrap_or_default();
                crate::fault::point("mirror-create", &full_name);
                match self
                    .client
                    .create(&format!("/api/v1/namespaces/{ns}/pods"), &body)
                {
                    Ok(_) => {
                        info!("mirror pod {full_name} created");
                        true
                    }
                    Err(e) if e.is_already_exists() => {
                        debug!("mirror pod {full_name}: exists already");
                        true
                    }
                    Err(e) => self.failed(&uid, &format!("mirror pod {full_name}: create"), &e),
                }
            }
            Job::DeleteObject {
                uid,
                namespace,
                name,
                target_uid,
                last,
            } => {
                let path = format!("/api/v1/namespaces/{namespace}/pods/{name}");
                let options = json!({
                    "kind": "DeleteOptions",
                    "apiVersion": "v1",
                    "gracePeriodSeconds": 0,
                    "preconditions": {"uid": target_uid},
                });
                crate::fault::point("api-delete", format_args!("{namespace}/{name}"));
                match self.client.delete(&path, &options) {
                    Ok(_) => info!("pod {namespace}/{name} ({target_uid}): API object deleted"),
                    // Gone, or replaced by a new pod of the same name: not ours to delete.
                    Err(e) if e.is_not_found() || e.is_conflict() => {
                        debug!("pod {namespace}/{name}: delete: {e}")
                    }
                    Err(e) => {
                        if uid.is_empty() {
                            warn!("pod {namespace}/{name}: delete: {e}");
                            // An orphan: housekeeping reports it again.
                            return !e.is_transport();
                        }
                        return self.failed(&uid, &format!("pod {namespace}/{name}: delete"), &e);
                    }
                }
                if last && !uid.is_empty() {
                    let mut t = self.shared.table.lock();
                    t.pods.remove(&uid);
                    crate::malloc::shrink_map(&mut t.pods);
                    // The pod's own object (not a mirror pod: a static pod
                    // comes back with the same UID when its file does).
                    if target_uid == uid {
                        if t.deleted.len() >= MAX_DELETED {
                            t.deleted.pop_front();
                        }
                        t.deleted.push_back(uid_hash(&uid));
                    }
                }
                true
            }
        }
    }

    /// The mirror pod of a static pod (as upstream: its spec and metadata,
    /// the mirror annotation, and the Node as controlling owner).
    fn mirror_body(&self, pod: &Pod) -> Option<Value> {
        let node_uid = self.node.read().uid.clone()?;
        let mut v = serde_json::to_value(pod).ok()?;
        let hash = static_hash(pod);
        let meta = v.get_mut("metadata")?.as_object_mut()?;
        for key in [
            "uid",
            "resourceVersion",
            "creationTimestamp",
            "managedFields",
            "selfLink",
            "generation",
        ] {
            meta.remove(key);
        }
        let annotations = meta
            .entry("annotations")
            .or_insert_with(|| json!({}))
            .as_object_mut()?;
        annotations.insert(CONFIG_MIRROR_ANNOTATION_KEY.into(), json!(hash));
        meta.insert(
            "ownerReferences".into(),
            json!([{"apiVersion": "v1", "kind": "Node", "name": self.node_name,
                    "uid": node_uid, "controller": true}]),
        );
        v["spec"]["nodeName"] = json!(self.node_name);
        v["status"] = json!({});
        v["kind"] = json!("Pod");
        v["apiVersion"] = json!("v1");
        Some(v)
    }
}

/// The static pod's hash (its `kubernetes.io/config.hash`, else its UID).
pub(crate) fn static_hash(pod: &Pod) -> String {
    pod.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(CONFIG_HASH_ANNOTATION_KEY))
        .cloned()
        .or_else(|| pod.metadata.uid.clone())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::fake::test_pod;

    #[test]
    fn a_probe_change_regenerates_a_probed_pods_status_and_keeps_its_failure() {
        use crate::prober::{ProbeKind, ProbeResult};
        use crate::runtime::fake::test_manager;
        let (fake, rm) = test_manager("sm-probe");
        let mut p = test_pod("u2", "web");
        p.spec.as_mut().unwrap().containers[0].readiness_probe = Some(Default::default());
        let pod = Arc::new(p);
        let st = rm.get_pod_status("u2", "web", "default").unwrap();
        rm.sync_pod(&pod, &st, &mut Default::default())
            .result
            .unwrap();
        let st = rm.get_pod_status("u2", "web", "default").unwrap();
        let id = fake.container_id("app").unwrap();
        let results = ProbeResults::default();
        results.set_for_test(&id, ProbeKind::Readiness, ProbeResult::Failure);
        let r = StatusReporter::standalone();
        let inputs = StatusInputs {
            runtime: st,
            waiting_reasons: Default::default(),
            host_ip: None,
            runtime_name: "containerd".into(),
            failed: None,
        };
        r.report(&pod, inputs.clone(), Some(&results), true);
        let ready = |r: &StatusReporter| {
            let s = r.status("u2").unwrap();
            let cond = s
                .conditions
                .iter()
                .flatten()
                .find(|c| c.type_ == "Ready")
                .cloned();
            (s.container_statuses.unwrap()[0].ready, cond.unwrap())
        };
        let (was, before) = ready(&r);
        assert!(!was);
        assert_eq!(before.status, "False");
        results.set_for_test(&id, ProbeKind::Readiness, ProbeResult::Success);
        r.probe_changed("u2", &results);
        let (now, after) = ready(&r);
        assert!(now);
        assert_eq!(after.status, "True");
        assert_eq!(after.reason, None);

        // A pod that failed (its deadline) stays failed through a probe change.
        let failed = StatusInputs {
            failed: Some(("DeadlineExceeded".into(), "too long".into())),
            ..inputs
        };
        r.report(&pod, failed, Some(&results), true);
        results.set_for_test(&id, ProbeKind::Readiness, ProbeResult::Failure);
        r.probe_changed("u2", &results);
        let s = r.status("u2").unwrap();
        assert_eq!(s.phase.as_deref(), Some("Failed"));
        assert_eq!(s.reason.as_deref(), Some("DeadlineExceeded"));
        assert!(!s.container_statuses.unwrap()[0].ready);

        // A status set without its inputs is left alone.
        let plain = Arc::new(test_pod("u3", "other"));
        r.set_status(&plain, PodStatus::default());
        r.probe_changed("u3", &results);
        assert_eq!(r.status("u3"), Some(PodStatus::default()));
    }

    #[test]
    fn a_container_that_terminated_under_never_or_after_success_does_not_go_back() {
        let status = |state: serde_json::Value| -> PodStatus {
            serde_json::from_value(serde_json::json!({"phase": "Failed", "containerStatuses": [
                {"name": "app", "image": "", "imageID": "", "ready": false, "restartCount": 0,
                 "state": state}]}))
            .unwrap()
        };
        let exited = |code: i32| status(serde_json::json!({"terminated": {"exitCode": code}}));
        let unknown = status(serde_json::json!({"waiting": {}}));
        let state = |r: &StatusReporter, uid: &str| {
            r.status(uid).unwrap().container_statuses.unwrap()[0]
                .state
                .clone()
                .unwrap()
        };
        let r = StatusReporter::standalone();
        for (uid, policy, code, stays) in [
            ("n", "Never", 3, true),
            ("f0", "OnFailure", 0, true),
            ("f1", "OnFailure", 1, false),
            ("a", "Always", 0, false),
        ] {
            let mut p = test_pod(uid, "job");
            p.spec.as_mut().unwrap().restart_policy = Some(policy.into());
            let pod = Arc::new(p);
            r.set_status(&pod, exited(code));
            r.set_status(&pod, unknown.clone());
            assert_eq!(
                state(&r, uid).terminated.is_some(),
                stays,
                "{policy}, exit {code}"
            );
        }
    }

    #[test]
    fn a_workers_report_keeps_the_terminal_status_the_sync_loop_set() {
        use crate::runtime::fake::test_manager;
        let (_fake, rm) = test_manager("sm-decided");
        let pod = Arc::new(test_pod("u4", "web"));
        let st = rm.get_pod_status("u4", "web", "default").unwrap();
        rm.sync_pod(&pod, &st, &mut Default::default())
            .result
            .unwrap();
        let r = StatusReporter::standalone();
        // Rejected while its worker was syncing it.
        r.set_status(
            &pod,
            PodStatus {
                phase: Some("Failed".into()),
                reason: Some("StaticPodNameConflict".into()),
                message: Some("Pod was rejected: taken".into()),
                ..Default::default()
            },
        );
        let inputs = StatusInputs {
            runtime: rm.get_pod_status("u4", "web", "default").unwrap(),
            waiting_reasons: Default::default(),
            host_ip: None,
            runtime_name: "containerd".into(),
            failed: None,
        };
        let reported = r.report(&pod, inputs, None, false);
        let s = r.status("u4").unwrap();
        assert_eq!(reported, s);
        assert_eq!(s.phase.as_deref(), Some("Failed"));
        assert_eq!(s.reason.as_deref(), Some("StaticPodNameConflict"));
        assert_eq!(s.message.as_deref(), Some("Pod was rejected: taken"));
        // The rest is the worker's.
        assert_eq!(s.container_statuses.unwrap().len(), 1);
    }

    #[test]
    fn a_standalone_reporter_forgets_a_finished_pod() {
        let r = StatusReporter::standalone();
        let pod = Arc::new(test_pod("u1", "web"));
        r.set_status(&pod, PodStatus::default());
        r.pod_killed(&pod);
        assert!(r.status("u1").is_some());
        r.pod_finished(&pod, false);
        assert!(r.status("u1").is_none());
        assert!(
            r.shared.table.lock().pods.is_empty(),
            "nothing kept of the pod"
        );
    }
}
