//! Pod workers (upstream `pod_workers.go`): one named OS thread per pod, the
//! only place a pod's runtime actions happen.
//!
//! The sync loop owns [`PodWorkers`] and hands each pod's worker the latest
//! desired state through a one-slot mailbox: a new update for a busy worker
//! replaces the pending one (latest wins), so a worker never replays stale
//! specs. The worker reads the pod's runtime status from the PLEG cache,
//! newer than its own last sync, and runs SyncPod with the latest update,
//! including one that arrived while it waited for that status.
//!
//! A pod's life on its worker:
//!
//! ```text
//!   syncing ──kill──► terminating ──containers and sandbox stopped──►
//!   terminated ──removed from the runtime──► finished (thread exits)
//! ```
//!
//! Once terminating, a worker takes no more syncs: a UID that was torn down
//! never starts again. A static pod whose file changed gets a new UID; the
//! new pod waits, with no thread yet, until the old one with the same full
//! name has finished (the sync loop learns it from the worker's last
//! message), so two copies of one static pod never run side by side.
//!
//! After each sync the worker asks the sync loop for its next resync (a
//! [`Report::Resync`] on the channel it reports on; the loop keeps the
//! work queue): after `sync-frequency` on success, after the remaining back-off
//! for a crash-looping container, and after 10 s for other errors; never
//! later than the pod's active deadline. Past that deadline
//! (`activeDeadlineSeconds`, see `crate::active_deadline`) each turn only
//! stops what runs and reports the pod Failed: nothing starts again.
//!
//! What a turn decides (what the work means, when to sync again, how
//! long before a retry, when the pod's start is recorded) is `state`'s
//! `PodSyncState`, a plain state machine that tests step with their own
//! clock; the worker thread drives it and does the I/O.
//!
//! The workers keep one figure for the sync loop's shutdown line: the
//! longest a pod's update waited, from the moment the sync loop handed it
//! over (the oldest of the updates it coalesced) until its worker started
//! to act on it (SyncPod, after the fresh status it waits for, or the
//! termination). Busy workers, a name held by an older UID, and slow
//! relists all show up in it.

use std::collections::HashMap;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender, TrySendError};
use k8s_openapi::api::core::v1::Pod;
use log::{debug, error, info, warn};
use parking_lot::Mutex;

use crate::events::EventRecorder;
use crate::fieldpath::NodeAllocatable;
use crate::pleg::{PodCache, Wait};
use crate::pod::{pod_full_name, pod_name, pod_namespace, pod_uid};
use crate::prober::ProberHandle;
use crate::runtime::PodStatus;
use crate::runtime::{RuntimeManager, SyncError, WaitingReasons};
use crate::status::manager::{StatusInputs, StatusReporter};
use crate::thread::{spawn_named, JoinOnDrop};
use crate::volume::VolumeManager;

mod state;
use state::{PodSyncState, Step, SyncEnd};
pub(crate) use state::{UpdateType, ERROR_BACKOFF};

#[derive(Debug, Clone)]
pub(crate) struct PodWork {
    pub(crate) pod: Arc<Pod>,
    pub(crate) update_type: UpdateType,
    /// Grace period for a kill, overriding the pod's.
    pub(crate) grace_period: Option<i64>,
}

/// What a worker tells the sync loop, on one channel so that the loop
/// reads them in the order they were sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Report {
    /// Sync this pod (UID) again after this long.
    Resync(String, Duration),
    /// The pod's worker has finished for good (its last message).
    Done(String),
}

/// When each pod syncs again: the sync loop's alone (inside
/// [`PodWorkers`]), filled from the workers' [`Report::Resync`] and drained
/// by its ticker.
#[derive(Default)]
pub(crate) struct WorkQueue {
    due: HashMap<String, Instant>,
}

impl WorkQueue {
    pub(crate) fn enqueue(&mut self, uid: &str, after: Duration) {
        let now = Instant::now();
        // An interval from the outside (a back-off, the resync period) that
        // does not fit is as good as never; a year stands for it.
        let due = now
            .checked_add(after)
            .or_else(|| now.checked_add(Duration::from_secs(365 * 24 * 3600)))
            .unwrap_or(now);
        self.due.insert(uid.to_string(), due);
    }

    /// The pods whose resync is due now, removed from the queue.
    pub(crate) fn take_ready(&mut self, now: Instant) -> Vec<String> {
        let due = &mut self.due;
        let ready: Vec<String> = due
            .iter()
            .filter(|(_, t)| **t <= now)
            .map(|(u, _)| u.clone())
            .collect();
        for u in &ready {
            due.remove(u);
        }
        ready
    }

    pub(crate) fn forget(&mut self, uid: &str) {
        self.due.remove(uid);
        crate::malloc::shrink_map(&mut self.due);
    }
}

/// Which UID holds each pod full name, and the UIDs waiting for one in
/// the order they came. The sync loop's alone (inside [`PodWorkers`]): a
/// pod's worker thread starts only once the pod holds its name, so no
/// worker waits on another.
#[derive(Default)]
struct FullNames {
    held: HashMap<String, String>,
    /// (full name, UID), oldest first.
    waiting: Vec<(String, String)>,
}

impl FullNames {
    /// Takes `name` for `uid` unless another UID holds it.
    fn claim(&mut self, name: &str, uid: &str) -> bool {
        match self.held.get(name) {
            Some(holder) if holder != uid => false,
            _ => {
                self.held.insert(name.to_string(), uid.to_string());
                true
            }
        }
    }

    /// Releases the name `uid` holds; the UID waiting longest for it now
    /// holds it and is returned.
    fn release(&mut self, uid: &str) -> Option<String> {
        let name = self
            .held
            .iter()
            .find(|(_, holder)| *holder == uid)
            .map(|(name, _)| name.clone())?;
        self.held.remove(&name);
        crate::malloc::shrink_map(&mut self.held);
        let next = self.waiting.iter().position(|(n, _)| *n == name)?;
        let (_, next) = self.waiting.remove(next);
        self.held.insert(name, next.clone());
        Some(next)
    }

    fn stop_waiting(&mut self, uid: &str) {
        self.waiting.retain(|(_, u)| u != uid);
    }
}

/// The one-slot mailbox between the sync loop and a worker.
struct Mailbox {
    /// The latest work, and when the slot last went from empty to full.
    pending: Mutex<Option<(PodWork, Instant)>>,
    closed: Mutex<bool>,
    /// Capacity 1: a full channel means the worker is already woken, and
    /// the new work simply replaced the pending one.
    wake: Sender<()>,
}

impl Mailbox {
    fn put(&self, work: PodWork) {
        {
            let mut p = self.pending.lock();
            match p.as_mut() {
                // A kill is never replaced by a sync.
                Some((w, _)) if !state::replaces(w.update_type, work.update_type) => {}
                // Replaced: the wait started with the first pending update.
                Some((w, _)) => *w = work,
                None => *p = Some((work, Instant::now())),
            }
        }
        match self.wake.try_send(()) {
            Ok(()) | Err(TrySendError::Full(())) | Err(TrySendError::Disconnected(())) => {}
        }
    }

    /// The pending work and when it was first handed over.
    fn take(&self) -> Option<(PodWork, Instant)> {
        self.pending.lock().take()
    }

    /// The pending work unless it is a kill (which stays for the next turn).
    fn take_update(&self) -> Option<PodWork> {
        let mut p = self.pending.lock();
        if p.as_ref()
            .is_some_and(|(w, _)| w.update_type != UpdateType::Kill)
        {
            return p.take().map(|(w, _)| w);
        }
        None
    }

    fn kill_pending(&self) -> bool {
        self.pending
            .lock()
            .as_ref()
            .is_some_and(|(w, _)| w.update_type == UpdateType::Kill)
    }

    fn close(&self) {
        *self.closed.lock() = true;
        let _ = self.wake.try_send(());
    }

    fn is_closed(&self) -> bool {
        *self.closed.lock()
    }
}

/// The longest a pod's update waited for its worker to act on it.
#[derive(Debug, Default)]
pub(crate) struct WaitStats {
    longest: Mutex<Option<(Duration, String)>>,
}

impl WaitStats {
    /// Notes that pod `full_name`'s update waited `waited`; allocates only
    /// for a new longest wait.
    pub(crate) fn record(&self, full_name: &str, waited: Duration) {
        let mut l = self.longest.lock();
        if l.as_ref().is_none_or(|(d, _)| waited > *d) {
            *l = Some((waited, full_name.to_string()));
        }
    }

    /// The longest wait so far and the pod's full name.
    pub(crate) fn longest(&self) -> Option<(Duration, String)> {
        self.longest.lock().clone()
    }
}

/// What workers share: the runtime, the cache, where reports and statuses go.
pub(crate) struct Shared {
    pub(crate) runtime: Arc<RuntimeManager>,
    pub(crate) cache: Arc<PodCache>,
    pub(crate) resync_interval: Duration,
    /// Where a worker asks for its resyncs and says it has finished. A
    /// worker blocks while the channel is full, which only delays it: the
    /// sync loop never waits for a worker.
    pub(crate) reports: Sender<Report>,
    /// Where each pod's API status goes after every sync.
    reporter: StatusReporter,
    /// The node's IP for `status.hostIP`.
    host_ip: Option<String>,
    /// The runtime's name for container IDs (`containerd://...`).
    runtime_name: String,
    /// Makes each pod's volumes ready before it syncs.
    volumes: Arc<VolumeManager>,
    /// Where each pod's containers go after every sync, for its probes.
    prober: ProberHandle,
    /// The longest wait of an update for its worker.
    waits: WaitStats,
}

impl Shared {
    /// Asks the sync loop to sync `uid` again after `after`. Fails only
    /// once the loop has stopped, when nothing syncs again anyway.
    fn resync(&self, uid: &str, after: Duration) {
        let _ = self.reports.send(Report::Resync(uid.to_string(), after));
    }
}

struct Worker {
    mailbox: Arc<Mailbox>,
    terminating: bool,
    /// None while the pod waits for its full name (and once it finished).
    thread: Option<JoinOnDrop<()>>,
    /// The thread's end of the wake-up channel, until the thread starts.
    wake: Option<Receiver<()>>,
}

/// Owned by the sync loop thread.
pub struct PodWorkers {
    shared: Arc<Shared>,
    workers: HashMap<String, Worker>,
    names: FullNames,
    queue: WorkQueue,
}

impl PodWorkers {
    pub(crate) fn new(
        runtime: Arc<RuntimeManager>,
        cache: Arc<PodCache>,
        resync_interval: Duration,
        reports: Sender<Report>,
    ) -> Self {
        PodWorkers {
            shared: Arc::new(Shared {
                cache,
                resync_interval,
                reports,
                reporter: StatusReporter::standalone(),
                host_ip: None,
                runtime_name: String::new(),
                volumes: Arc::new(VolumeManager::new(
                    runtime.root_dir().to_path_buf(),
                    None,
                    NodeAllocatable::default(),
                    EventRecorder::disabled(),
                )),
                runtime,
                prober: ProberHandle::disabled(),
                waits: WaitStats::default(),
            }),
            workers: HashMap::new(),
            names: FullNames::default(),
            queue: WorkQueue::default(),
        }
    }

    /// A worker's request: sync `uid` again after `after`.
    pub(crate) fn requeue(&mut self, uid: &str, after: Duration) {
        self.queue.enqueue(uid, after);
    }

    /// The pods whose resync is due at `now`, taken from the queue.
    pub(crate) fn take_ready(&mut self, now: Instant) -> Vec<String> {
        self.queue.take_ready(now)
    }

    /// Sends each pod's status to `reporter`, with the node's IP and the
    /// runtime's name. Call before any pod is handed over.
    pub(crate) fn with_status(
        mut self,
        reporter: StatusReporter,
        host_ip: Option<String>,
        runtime_name: String,
    ) -> Self {
        if let Some(shared) = Arc::get_mut(&mut self.shared) {
            shared.reporter = reporter;
            shared.host_ip = host_ip;
            shared.runtime_name = runtime_name;
        } else {
            error!("pod workers: status reporting set after workers started; ignored");
        }
        self
    }

    /// Sets up pod volumes with `volumes` (which knows the apiserver).
    /// Call before any pod is handed over.
    pub(crate) fn with_volumes(mut self, volumes: Arc<VolumeManager>) -> Self {
        if let Some(shared) = Arc::get_mut(&mut self.shared) {
            shared.volumes = volumes;
        } else {
            error!("pod workers: volume manager set after workers started; ignored");
        }
        self
    }

    /// Tells `prober` about each pod's containers after every sync. Call
    /// before any pod is handed over.
    pub(crate) fn with_prober(mut self, prober: ProberHandle) -> Self {
        if let Some(shared) = Arc::get_mut(&mut self.shared) {
            shared.prober = prober;
        } else {
            error!("pod workers: prober set after workers started; ignored");
        }
        self
    }

    /// Hands `work` to the pod's worker, starting one for a new pod. A
    /// pod whose full name another UID holds waits, without a thread,
    /// until that UID's worker has finished (or until it is killed itself).
    pub(crate) fn update_pod(&mut self, work: PodWork) {
        let uid = pod_uid(&work.pod).to_string();
        if let Some(w) = self.workers.get_mut(&uid) {
            if w.terminating && work.update_type != UpdateType::Kill {
                debug!(
                    "pod {}: terminating, update ignored",
                    pod_full_name(&work.pod)
                );
                return;
            }
            let kill = work.update_type == UpdateType::Kill;
            w.terminating |= kill;
            w.mailbox.put(work);
            if kill {
                if w.thread.is_none() && w.wake.is_some() {
                    // Killed while it waited for its name: torn down
                    // without ever holding it.
                    self.names.stop_waiting(&uid);
                    self.start(&uid);
                }
                // The worker may be waiting for a fresh status; let it see the kill.
                self.shared.cache.interrupt();
            }
            return;
        }
        let (wake_tx, wake_rx) = crossbeam_channel::bounded(1);
        let mailbox = Arc::new(Mailbox {
            pending: Mutex::new(None),
            closed: Mutex::new(false),
            wake: wake_tx,
        });
        let terminating = work.update_type == UpdateType::Kill;
        let full_name = pod_full_name(&work.pod);
        let waits = !terminating && !self.names.claim(&full_name, &uid);
        mailbox.put(work);
        self.workers.insert(
            uid.clone(),
            Worker {
                mailbox,
                terminating,
                thread: None,
                wake: Some(wake_rx),
            },
        );
        if waits {
            debug!("pod {full_name}: waits for the pod that holds its full name to finish");
            self.names.waiting.push((full_name, uid));
        } else if !self.start(&uid) {
            self.hand_on_name(&uid);
        }
    }

    /// Starts the thread of `uid`'s worker. If it cannot start, the worker
    /// is dropped and the pod synced again later; false.
    fn start(&mut self, uid: &str) -> bool {
        let Some(w) = self.workers.get_mut(uid) else {
            return false;
        };
        let Some(wake) = w.wake.take() else {
            return true;
        };
        let full_name = w
            .mailbox
            .pending
            .lock()
            .as_ref()
            .map(|(work, _)| pod_full_name(&work.pod))
            .unwrap_or_else(|| uid.to_string());
        let shared = self.shared.clone();
        let mailbox = w.mailbox.clone();
        let id = uid.to_string();
        let name = format!("pod-worker/{full_name}");
        match spawn_named(name, move || run_worker(shared, mailbox, wake, id)) {
            Ok(t) => {
                w.thread = Some(t);
                true
            }
            Err(e) => {
                error!(
                    "pod {uid}: cannot start its worker thread: {e}; will retry on the next sync"
                );
                self.workers.remove(uid);
                self.queue.enqueue(uid, ERROR_BACKOFF);
                false
            }
        }
    }

    /// The full name `uid` held goes to the pod that waited longest for it,
    /// whose worker starts now.
    fn hand_on_name(&mut self, uid: &str) {
        let mut freed = uid.to_string();
        while let Some(next) = self.names.release(&freed) {
            if self.start(&next) {
                return;
            }
            freed = next;
        }
    }

    /// The longest an update waited for its worker, and the pod's full name.
    pub(crate) fn longest_wait(&self) -> Option<(Duration, String)> {
        self.shared.waits.longest()
    }

    pub(crate) fn is_known(&self, uid: &str) -> bool {
        self.workers.contains_key(uid)
    }

    /// The UIDs of the pods that have a worker.
    pub(crate) fn uids(&self) -> impl Iterator<Item = &String> {
        self.workers.keys()
    }

    pub fn is_terminating(&self, uid: &str) -> bool {
        self.workers.get(uid).is_some_and(|w| w.terminating)
    }

    pub fn is_empty(&self) -> bool {
        self.workers.is_empty()
    }

    /// Called by the sync loop when a worker reported that it has finished.
    pub(crate) fn forget(&mut self, uid: &str) {
        if let Some(mut w) = self.workers.remove(uid) {
            if let Some(t) = w.thread.take() {
                // It has sent its last message and is about to return.
                drop(t);
            }
        }
        crate::malloc::shrink_map(&mut self.workers);
        self.hand_on_name(uid);
        self.queue.forget(uid);
    }

    /// Stops every worker after its current step, waiting up to `within`.
    /// Containers keep running.
    pub(crate) fn shutdown(&mut self, within: Duration) {
        for w in self.workers.values() {
            w.mailbox.close();
        }
        let deadline = Instant::now() + within;
        for (uid, mut w) in self.workers.drain() {
            if let Some(t) = w.thread.take() {
                while !t.is_finished() && Instant::now() < deadline {
                    std::thread::sleep(Duration::from_millis(10));
                }
                if t.is_finished() {
                    drop(t);
                } else {
                    warn!("pod {uid}: worker still busy at shutdown, leaving it");
                    t.detach();
                }
            }
        }
    }
}

impl Drop for PodWorkers {
    /// Tells every worker to stop after its current step without waiting:
    /// a worker may be blocked on the status cache, which only the owner of
    /// the cache can close (`Kubelet::run` closes it, then calls `shutdown`).
    fn drop(&mut self) {
        for (_, mut w) in self.workers.drain() {
            w.mailbox.close();
            if let Some(t) = w.thread.take() {
                t.detach();
            }
        }
    }
}

/// How a worker goes on after one turn.
enum Turn {
    /// Wait for the next wake-up.
    Next,
    /// Stop (tinylet shuts down); the pod stays as it is.
    Stop,
    /// The pod is gone: its worker has reported and ends.
    Finished,
}

fn run_worker(shared: Arc<Shared>, mailbox: Arc<Mailbox>, wake: Receiver<()>, uid: String) {
    let mut state = PodSyncState::default();
    let mut last_pod = None;
    loop {
        if wake.recv().is_err() || mailbox.is_closed() {
            break;
        }
        let Some((work, handed_over)) = mailbox.take() else {
            continue;
        };
        let full_name = pod_full_name(&work.pod);
        state.handed_over(handed_over);
        last_pod = Some(work.pod.clone());
        // A panic (a bug, or input nothing checked) must not end the
        // worker: the pod would never be synced, killed or deleted again.
        // Locks are parking_lot's, released on unwind and never poisoned.
        let turn = std::panic::catch_unwind(AssertUnwindSafe(|| {
            worker_turn(
                &shared,
                &mailbox,
                &mut state,
                &work,
                handed_over,
                &uid,
                &full_name,
            )
        }));
        match turn {
            // Idle until the next wake-up: the sync's stack pages go back.
            Ok(Turn::Next) => crate::thread::release_idle_stack(),
            Ok(Turn::Stop) => break,
            Ok(Turn::Finished) => return,
            Err(payload) => {
                let what = panic_message(payload.as_ref());
                if state.step(work.update_type) == Step::Terminate {
                    // Stop again, without the grace period (and so without
                    // the preStop hooks) that may be what panicked.
                    let delay = state.kill_panicked(Instant::now());
                    error!(
                        "pod {full_name}: worker panicked while terminating: {what}; \
                         stopping it again without grace in {}s",
                        delay.as_secs_f32()
                    );
                    std::thread::sleep(delay);
                    mailbox.put(PodWork {
                        grace_period: Some(0),
                        ..work
                    });
                } else {
                    error!("pod {full_name}: worker panicked while syncing: {what}; will retry");
                    let delay = state.sync_panicked(Instant::now());
                    shared.resync(&uid, delay);
                }
            }
        }
    }
    debug!(
        "pod {}: worker stopped",
        last_pod.map(|p| pod_full_name(&p)).unwrap_or(uid)
    );
}

/// The message a panic carried (`panic!` gives a `&str` or a `String`).
fn panic_message(payload: &(dyn std::any::Any + Send)) -> &str {
    payload
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("(no message)")
}

/// One piece of work on the pod: terminate it, or sync it once.
fn worker_turn(
    shared: &Shared,
    mailbox: &Mailbox,
    state: &mut PodSyncState,
    work: &PodWork,
    handed_over: Instant,
    uid: &str,
    full_name: &str,
) -> Turn {
    if state.step(work.update_type) == Step::Terminate {
        shared.waits.record(full_name, handed_over.elapsed());
        shared.prober.remove_pod(&work.pod);
        let began = Instant::now();
        if !terminate(shared, mailbox, state, work, uid, full_name) {
            return Turn::Stop;
        }
        crate::metrics::pod_worker_sync(crate::metrics::WorkerOperation::Kill, began.elapsed());
        shared
            .reporter
            .pod_finished(&work.pod, deleted_from_api(&work.pod));
        shared.cache.delete(uid);
        let _ = shared.reports.send(Report::Done(uid.to_string()));
        return Turn::Finished;
    }

    // A kill that arrives meanwhile must not wait for the next relist.
    let (status, err) = match shared
        .cache
        .wait_newer_than(uid, state.last_sync, &|| mailbox.kill_pending())
    {
        Wait::Fresh(s) => s,
        Wait::Aborted => {
            let _ = mailbox.wake.try_send(());
            return Turn::Next;
        }
        Wait::Closed => return Turn::Stop,
    };
    // Updates that came while the worker waited supersede its work:
    // the sync acts on the latest spec, not on one already replaced.
    let taken = mailbox.take_update();
    let work = taken.as_ref().unwrap_or(work);
    if let Some(e) = err {
        warn!("pod {full_name}: status unknown ({e}), will retry");
        let delay = state.not_synced(Instant::now());
        shared.resync(uid, delay);
        return Turn::Next;
    }
    shared.waits.record(full_name, handed_over.elapsed());
    if state.is_past_deadline(|| {
        time_left(shared, &work.pod) == Some(Duration::ZERO) && !ended_on_its_own(shared, &work.pod)
    }) {
        past_deadline(shared, state, &work.pod, &status, uid, full_name);
        return Turn::Next;
    }
    debug!("pod {full_name}: sync ({:?})", work.update_type);
    crate::fault::point("sync-begin", full_name);
    let began = Instant::now();
    let operation = match work.update_type {
        UpdateType::Create => crate::metrics::WorkerOperation::Create,
        UpdateType::Update => crate::metrics::WorkerOperation::Update,
        _ => crate::metrics::WorkerOperation::Sync,
    };
    // Volumes first: no container starts without them (upstream's
    // WaitForAttachAndMount).
    if let Err(e) = shared.volumes.setup(&work.pod, &mut state.volumes) {
        warn!("pod {full_name}: {e}; will retry");
        let delay = state.not_synced(Instant::now());
        report_status(shared, &work.pod, &status, &state.reasons);
        // Woken at the deadline at the latest (read after the status
        // report, which sets the start time of a new pod).
        let left = time_left(shared, &work.pod).filter(|d| !d.is_zero());
        shared.resync(uid, left.map_or(delay, |d| delay.min(d)));
        return Turn::Next;
    }
    crate::fault::point("volumes-set-up", full_name);
    // When the status acted on was read (for a sync that changes nothing,
    // the next may act on the same one).
    let acted_on = shared.cache.modified(uid);
    let synced = shared
        .runtime
        .sync_pod(&work.pod, &status, &mut state.restart_backoff);
    let synced_at = Instant::now();
    // The status read after the sync's changes goes into the cache, so
    // that the next sync need not wait for a relist and the relist need
    // not read it again (a relist newer than it still wins).
    if let (Some(st), Some(at)) = (&synced.status, synced.status_read_at) {
        shared.cache.set(uid, st.clone(), None, at);
    }
    synced.update_reasons(&mut state.reasons);
    // The status after this sync (the one it started from when it changed
    // nothing), with the reasons it found: what the sync did reaches the
    // status manager now, not at the next relist.
    let after = synced.status.as_ref().unwrap_or(&status);
    let running = report_status(shared, &work.pod, after, &state.reasons);
    crate::metrics::pod_worker_sync(operation, began.elapsed());
    let end = match synced.result {
        Ok(()) => SyncEnd::Done,
        Err(SyncError::BackOff(msg, left)) => {
            info!("{msg}: next try in {}s", left.as_secs().max(1));
            SyncEnd::BackOff(left)
        }
        Err(e) => {
            warn!("sync failed: {e}");
            SyncEnd::Failed
        }
    };
    // The time left before the deadline is read after the status report,
    // which sets the start time of a new pod.
    let next = state.synced(
        synced_at,
        end,
        running,
        shared.resync_interval,
        time_left(shared, &work.pod),
    );
    // The next sync waits for a status newer than this sync's view of the
    // runtime: the one read after its changes, or, when it changed
    // nothing, the one it acted on.
    state.last_sync = match (synced.status_read_at, acted_on) {
        (Some(at), _) => Some(at),
        (None, Some(at)) if !synced.changed => Some(at),
        _ => Some(synced_at),
    };
    if let Some(took) = next.started {
        crate::metrics::pod_started(took);
    }
    shared
        .prober
        .update_pod(&work.pod, after, shared.host_ip.as_deref());
    if end == SyncEnd::Done {
        shared.runtime.prune_dead(&status);
    }
    shared.resync(uid, next.resync);
    Turn::Next
}

/// An API pod that is being deleted gracefully: once its containers are
/// gone, its final status is reported and its API object deleted.
fn deleted_from_api(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_some()
        && pod
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(crate::pod::CONFIG_SOURCE_ANNOTATION_KEY))
            .is_some_and(|s| s == crate::pod::API_SOURCE)
}

/// The time left before the pod's active deadline, from the start time it
/// was reported with (the API pod's before the first report), as upstream
/// reads it from its status manager.
fn time_left(shared: &Shared, pod: &Pod) -> Option<Duration> {
    // Most pods have none: no status is looked up for them.
    pod.spec.as_ref()?.active_deadline_seconds?;
    let start = shared
        .reporter
        .status(pod_uid(pod))
        .and_then(|s| s.start_time)
        .or_else(|| pod.status.as_ref().and_then(|s| s.start_time.clone()));
    let now = k8s_openapi::jiff::Timestamp::now();
    crate::active_deadline::time_left(pod, start.as_ref(), now)
}

/// Whether the pod reached a terminal phase of its own (a Job that
/// completed, a pod whose containers failed under restartPolicy Never):
/// a deadline that passes later changes nothing, as upstream no longer
/// syncs a terminated pod.
fn ended_on_its_own(shared: &Shared, pod: &Pod) -> bool {
    let status = shared
        .reporter
        .status(pod_uid(pod))
        .or_else(|| pod.status.clone());
    status.is_some_and(|s| {
        matches!(
            s.phase.as_deref(),
            Some(crate::pod::SUCCEEDED | crate::pod::FAILED)
        ) && s.reason.as_deref() != Some(crate::active_deadline::REASON)
    })
}

/// The pod is past its active deadline: its containers and sandbox are
/// stopped (with the pod's grace period) and never started again, and it is
/// reported Failed with reason DeadlineExceeded, as upstream's
/// `syncPod` kills a pod whose generated phase is Failed. The pod stays
/// (its worker and stopped containers) until its source removes it.
fn past_deadline(
    shared: &Shared,
    state: &mut PodSyncState,
    pod: &Arc<Pod>,
    status: &PodStatus,
    uid: &str,
    full_name: &str,
) {
    use crate::active_deadline::{MESSAGE, REASON};
    if state.deadline_reached(Instant::now()) {
        info!("pod {full_name}: {MESSAGE}; stopping it");
        // Upstream records it at each status generation and lets the
        // event correlator count the repeats; once is enough here.
        shared
            .runtime
            .pod_event(pod, crate::events::EventType::Normal, REASON, MESSAGE);
        shared.prober.remove_pod(pod);
    }
    let stopped = shared.runtime.kill_pod(pod, status, None).and_then(|()| {
        shared
            .runtime
            .get_pod_status(uid, pod_name(pod), pod_namespace(pod))
    });
    match stopped {
        Ok(st) => {
            report_failed(shared, pod, &st, &state.reasons, Some((REASON, MESSAGE)));
        }
        Err(e) => {
            warn!("pod {full_name}: stopping it after its deadline: {e}; will retry");
            report_failed(shared, pod, status, &state.reasons, Some((REASON, MESSAGE)));
            shared.resync(uid, ERROR_BACKOFF);
        }
    }
}

/// Generates the pod's API status from `status` and the containers'
/// waiting `reasons`, and hands it to the reporter; true when its phase is
/// Running.
fn report_status(
    shared: &Shared,
    pod: &Arc<Pod>,
    status: &PodStatus,
    reasons: &WaitingReasons,
) -> bool {
    report_failed(shared, pod, status, reasons, None)
}

/// [`report_status`], with the pod Failed for `failed` (reason, message)
/// when given.
fn report_failed(
    shared: &Shared,
    pod: &Arc<Pod>,
    status: &PodStatus,
    reasons: &WaitingReasons,
    failed: Option<(&str, &str)>,
) -> bool {
    let inputs = StatusInputs {
        runtime: status.clone(),
        waiting_reasons: reasons.clone(),
        host_ip: shared.host_ip.clone(),
        runtime_name: shared.runtime_name.clone(),
        failed: failed.map(|(r, m)| (r.to_string(), m.to_string())),
    };
    // A pod with probes keeps its inputs with the status manager, which
    // takes a readiness or startup change into its status without a sync.
    let keep = crate::prober::has_probes(pod);
    let api = shared
        .reporter
        .report(pod, inputs, shared.prober.results(), keep);
    api.phase.as_deref() == Some("Running")
}

/// Stops the pod's containers and sandbox and removes them, retrying until it
/// succeeds (true) or tinylet shuts down (false).
fn terminate(
    shared: &Shared,
    mailbox: &Mailbox,
    state: &mut PodSyncState,
    work: &PodWork,
    uid: &str,
    full_name: &str,
) -> bool {
    info!("pod {full_name}: terminating");
    state.terminate_begins();
    loop {
        let reasons = &state.reasons;
        let pod = &work.pod;
        let result = shared
            .runtime
            .get_pod_status(
                uid,
                crate::pod::pod_name(pod),
                crate::pod::pod_namespace(pod),
            )
            .and_then(|st| {
                crate::fault::point("pod-kill", full_name);
                shared.runtime.kill_pod(pod, &st, work.grace_period)?;
                Ok(st)
            })
            .and_then(|_| {
                // Inspect again: stopping may have changed what is there.
                let st = shared
                    .runtime
                    .get_pod_status(uid, pod_name(pod), pod_namespace(pod))?;
                if deleted_from_api(pod) {
                    // The final status, with the containers' exit codes,
                    // before they are removed.
                    report_status(shared, pod, &st, reasons);
                }
                if let Err(e) = shared.volumes.teardown(uid) {
                    warn!("pod {full_name}: unmounting its volumes: {e}");
                }
                crate::fault::point("volumes-torn-down", full_name);
                shared.runtime.remove_pod(uid, &st)
            });
        match result {
            Ok(()) => {
                info!("pod {full_name}: terminated and removed");
                return true;
            }
            Err(_) if mailbox.is_closed() => return false,
            Err(e) => {
                let delay = state.terminate_failed();
                warn!(
                    "pod {full_name}: terminate: {e}; retrying in {}s",
                    delay.as_secs_f32()
                );
                std::thread::sleep(delay);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::fake::{test_manager, test_pod, wait_for, FakeRuntime};
    use crossbeam_channel::RecvTimeoutError;

    fn pod(uid: &str, name: &str) -> Arc<Pod> {
        Arc::new(test_pod(uid, name))
    }

    struct Rig {
        fake: Arc<FakeRuntime>,
        cache: Arc<PodCache>,
        workers: PodWorkers,
        reports: Receiver<Report>,
    }

    impl Rig {
        fn done(&mut self, within: Duration) -> Result<String, RecvTimeoutError> {
            done(&self.reports, &mut self.workers, within)
        }

        fn wait_resync(&mut self, uid: &str) -> Instant {
            wait_resync(&self.reports, &mut self.workers, uid)
        }
    }

    /// The UID of the next worker to finish, within `within`; the resyncs
    /// asked for meanwhile go to the queue, as the sync loop does.
    fn done(
        reports: &Receiver<Report>,
        workers: &mut PodWorkers,
        within: Duration,
    ) -> Result<String, RecvTimeoutError> {
        let deadline = Instant::now() + within;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match reports.recv_timeout(left)? {
                Report::Resync(uid, after) => workers.requeue(&uid, after),
                Report::Done(uid) => return Ok(uid),
            }
        }
    }

    /// Waits (up to 5 s) for `uid`'s worker to ask for a resync, queues it
    /// as the sync loop does, and returns when it is due.
    fn wait_resync(reports: &Receiver<Report>, workers: &mut PodWorkers, uid: &str) -> Instant {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match reports.recv_timeout(left) {
                Ok(Report::Resync(u, after)) => {
                    workers.requeue(&u, after);
                    if u == uid {
                        return workers.queue.due[uid];
                    }
                }
                Ok(Report::Done(u)) => panic!("{u} finished while waiting for {uid}'s resync"),
                Err(e) => panic!("no resync of {uid} asked for: {e}"),
            }
        }
    }

    /// Queues the resyncs asked for so far, as the sync loop does.
    fn queue_pending(reports: &Receiver<Report>, workers: &mut PodWorkers) {
        while let Ok(report) = reports.try_recv() {
            match report {
                Report::Resync(uid, after) => workers.requeue(&uid, after),
                Report::Done(uid) => panic!("{uid} finished unexpectedly"),
            }
        }
    }

    fn rig() -> Rig {
        let (fake, rm) = test_manager("pw");
        let cache = PodCache::new();
        cache.update_time(Instant::now(), Arc::new(vec![]));
        let (reports_tx, reports) = crossbeam_channel::bounded(1024);
        let workers = PodWorkers::new(rm, cache.clone(), Duration::from_secs(60), reports_tx);
        Rig {
            fake,
            cache,
            workers,
            reports,
        }
    }

    #[test]
    fn create_runs_sandbox_and_container_then_kill_removes_them() {
        let mut r = rig();
        let p = pod("u1", "web");
        r.workers.update_pod(PodWork {
            pod: p.clone(),
            update_type: UpdateType::Create,
            grace_period: None,
        });
        wait_for("container start", || r.fake.count("StartContainer") == 1);
        assert_eq!(r.fake.count("RunPodSandbox"), 1);
        assert!(r.workers.is_known("u1"));

        r.workers.update_pod(PodWork {
            pod: p.clone(),
            update_type: UpdateType::Kill,
            grace_period: Some(0),
        });
        assert!(r.workers.is_terminating("u1"));
        // Syncs after a kill are ignored.
        r.workers.update_pod(PodWork {
            pod: p,
            update_type: UpdateType::Sync,
            grace_period: None,
        });
        let uid = r.done(Duration::from_secs(5)).unwrap();
        assert_eq!(uid, "u1");
        r.workers.forget(&uid);
        assert!(r.fake.sandboxes().is_empty());
        assert!(r.fake.containers().is_empty());
        assert_eq!(r.fake.count("RunPodSandbox"), 1);
        assert!(r.workers.is_empty());
    }

    #[test]
    fn the_status_after_a_sync_shows_what_it_started_without_a_relist() {
        let mut r = rig();
        r.workers.update_pod(PodWork {
            pod: pod("u7", "web"),
            update_type: UpdateType::Create,
            grace_period: None,
        });
        wait_for("container start", || r.fake.count("StartContainer") == 1);
        // No relist ever comes in this test: the status the worker reports
        // is the one it read after its sync.
        wait_for("a Running status", || {
            r.workers
                .shared
                .reporter
                .status("u7")
                .is_some_and(|s| s.phase.as_deref() == Some("Running"))
        });
        let status = r.workers.shared.reporter.status("u7").unwrap();
        let app = &status.container_statuses.unwrap()[0];
        assert!(app.state.as_ref().is_some_and(|s| s.running.is_some()));
        assert!(app.container_id.is_some());
        r.workers.shutdown(Duration::from_secs(2));
    }

    #[test]
    fn a_worker_that_panics_keeps_serving_its_pod_and_still_removes_it() {
        let mut r = rig();
        let p = pod("u9", "web");
        // The first sync panics in the runtime, with the fake's lock held.
        r.fake.panic_next("CreateContainer", 1);
        r.workers.update_pod(PodWork {
            pod: p.clone(),
            update_type: UpdateType::Create,
            grace_period: None,
        });
        r.wait_resync("u9");
        assert_eq!(r.fake.count("CreateContainer"), 1);
        assert_eq!(r.workers.take_ready(far_future()), vec!["u9".to_string()]);
        // The same worker syncs the pod again (the lock the panic held is
        // free) and starts its container.
        r.cache.update_time(Instant::now(), Arc::new(vec![]));
        r.workers.update_pod(PodWork {
            pod: p.clone(),
            update_type: UpdateType::Sync,
            grace_period: None,
        });
        wait_for("container start", || r.fake.count("StartContainer") == 1);

        // Stopping the container panics too: the kill is tried again
        // without grace, and the pod is removed all the same.
        r.fake.panic_next("StopContainer", 1);
        r.workers.update_pod(PodWork {
            pod: p,
            update_type: UpdateType::Kill,
            grace_period: Some(30),
        });
        assert_eq!(r.done(Duration::from_secs(5)).unwrap(), "u9");
        r.workers.forget("u9");
        assert_eq!(r.fake.count("StopContainer"), 2);
        assert!(r.fake.sandboxes().is_empty());
        assert!(r.fake.containers().is_empty());
        assert!(r.workers.is_empty());
    }

    fn far_future() -> Instant {
        Instant::now() + Duration::from_secs(3600)
    }

    #[test]
    fn a_kill_does_not_wait_for_the_next_relist() {
        let mut r = rig();
        let p = pod("u3", "web");
        r.workers.update_pod(PodWork {
            pod: p.clone(),
            update_type: UpdateType::Create,
            grace_period: None,
        });
        wait_for("container start", || r.fake.count("StartContainer") == 1);
        // This sync waits for a status newer than the first sync, which
        // never comes: there is no relist in this test.
        r.workers.update_pod(PodWork {
            pod: p.clone(),
            update_type: UpdateType::Sync,
            grace_period: None,
        });
        std::thread::sleep(Duration::from_millis(50));
        r.workers.update_pod(PodWork {
            pod: p,
            update_type: UpdateType::Kill,
            grace_period: Some(0),
        });
        assert_eq!(r.done(Duration::from_secs(2)).unwrap(), "u3");
        assert!(r.fake.sandboxes().is_empty());
    }

    #[test]
    fn a_new_uid_with_the_same_name_waits_for_the_old_one() {
        let mut r = rig();
        let old = pod("old", "web");
        r.workers.update_pod(PodWork {
            pod: old.clone(),
            update_type: UpdateType::Create,
            grace_period: None,
        });
        wait_for("old start", || r.fake.count("StartContainer") == 1);
        // Stopping fails for a while, so the old pod stays terminating.
        r.fake.fail_next("StopContainer", 2);
        r.workers.update_pod(PodWork {
            pod: old,
            update_type: UpdateType::Kill,
            grace_period: Some(0),
        });
        r.workers.update_pod(PodWork {
            pod: pod("new", "web"),
            update_type: UpdateType::Create,
            grace_period: None,
        });
        std::thread::sleep(Duration::from_millis(300));
        assert_eq!(
            r.fake.count("RunPodSandbox"),
            1,
            "new pod must wait for the old one"
        );
        assert_eq!(r.done(Duration::from_secs(10)).unwrap(), "old");
        r.workers.forget("old");
        r.cache.update_time(Instant::now(), Arc::new(vec![]));
        wait_for("new start", || r.fake.count("RunPodSandbox") == 2);
        wait_for("new container", || r.fake.count("StartContainer") == 2);
        let live: Vec<_> = r
            .fake
            .sandboxes()
            .into_iter()
            .map(|s| s.metadata.uid.clone())
            .collect();
        assert_eq!(live, vec!["new".to_string()]);
        r.workers.shutdown(Duration::from_secs(2));
    }

    #[test]
    fn pods_waiting_for_a_name_start_in_turn_and_a_killed_one_never_does() {
        let mut r = rig();
        let work = |uid: &str, t| PodWork {
            pod: pod(uid, "web"),
            update_type: t,
            grace_period: Some(0),
        };
        r.workers.update_pod(work("a", UpdateType::Create));
        wait_for("a's start", || r.fake.count("StartContainer") == 1);
        r.workers.update_pod(work("b", UpdateType::Create));
        r.workers.update_pod(work("c", UpdateType::Create));
        // b and c wait without a thread of their own.
        let threads = |r: &Rig| {
            r.workers
                .workers
                .values()
                .filter(|w| w.thread.is_some())
                .count()
        };
        assert_eq!(threads(&r), 1);
        assert!(r.workers.is_known("b") && r.workers.is_known("c"));

        // b is killed while it waits: it finishes at once, having run
        // nothing, and a keeps running.
        r.workers.update_pod(work("b", UpdateType::Kill));
        assert_eq!(r.done(Duration::from_secs(5)).as_deref(), Ok("b"));
        r.workers.forget("b");
        assert_eq!(r.fake.count("RunPodSandbox"), 1);
        assert_eq!(r.fake.count("StopContainer"), 0);

        // Once a has finished, c, which waited next, holds the name and runs.
        r.workers.update_pod(work("a", UpdateType::Kill));
        assert_eq!(r.done(Duration::from_secs(5)).as_deref(), Ok("a"));
        r.workers.forget("a");
        r.cache.update_time(Instant::now(), Arc::new(vec![]));
        wait_for("c's start", || r.fake.count("StartContainer") == 2);
        assert_eq!(r.fake.count("RunPodSandbox"), 2);
        assert_eq!(
            r.workers.names.held.get("default/web").map(String::as_str),
            Some("c")
        );
        r.workers.shutdown(Duration::from_secs(2));
    }

    #[test]
    fn failed_sync_is_requeued_and_resync_scheduled() {
        let mut r = rig();
        r.fake.fail_next("RunPodSandbox", 1);
        r.workers.update_pod(PodWork {
            pod: pod("u2", "db"),
            update_type: UpdateType::Create,
            grace_period: None,
        });
        let due = r.wait_resync("u2");
        assert!(due > Instant::now() + Duration::from_secs(5));
        assert!(r.workers.take_ready(Instant::now()).is_empty());
        assert_eq!(r.workers.take_ready(due), vec!["u2".to_string()]);
        r.workers.shutdown(Duration::from_secs(2));
    }

    #[test]
    fn crash_back_off_is_the_workers_and_ends_with_the_pod() {
        let (fake, rm) = test_manager("pw-backoff");
        let cache = PodCache::new();
        let p = pod("u4", "crash");
        let work = |t| PodWork {
            pod: p.clone(),
            update_type: t,
            grace_period: None,
        };
        let fresh_status = || {
            let st = rm.get_pod_status("u4", "crash", "default").unwrap();
            cache.set("u4", st, None, Instant::now());
        };
        let (reports_tx, reports) = crossbeam_channel::bounded(1024);
        let mut workers = PodWorkers::new(
            rm.clone(),
            cache.clone(),
            Duration::from_secs(60),
            reports_tx,
        );
        fresh_status();
        workers.update_pod(work(UpdateType::Create));
        wait_for("first start", || fake.count("StartContainer") == 1);
        // It crashes once: restarted at once, and the back-off begins.
        let id = fake.container_id("app").unwrap();
        fake.exit_container(&id, 1);
        fresh_status();
        workers.update_pod(work(UpdateType::Sync));
        wait_for("immediate restart", || fake.count("StartContainer") == 2);

        // It crashes again: the worker's next sync backs off.
        queue_pending(&reports, &mut workers);
        workers.queue.due.clear();
        let id = fake.container_id("app").unwrap();
        fake.exit_container(&id, 1);
        fresh_status();
        workers.update_pod(work(UpdateType::Sync));
        let due = wait_resync(&reports, &mut workers, "u4");
        assert_eq!(fake.count("StartContainer"), 2);
        assert!(due > Instant::now() + Duration::from_secs(8), "{due:?}");
        let status = workers.shared.reporter.status("u4").unwrap();
        let app = &status.container_statuses.unwrap()[0];
        let waiting = app.state.as_ref().and_then(|s| s.waiting.as_ref());
        assert_eq!(
            waiting.and_then(|w| w.reason.as_deref()),
            Some("CrashLoopBackOff")
        );

        // Once the pod is killed and removed, the same UID starts afresh.
        workers.update_pod(work(UpdateType::Kill));
        assert_eq!(
            done(&reports, &mut workers, Duration::from_secs(10)).as_deref(),
            Ok("u4")
        );
        workers.forget("u4");
        fresh_status();
        workers.update_pod(work(UpdateType::Create));
        wait_for("a start without back-off", || {
            fake.count("StartContainer") == 3
        });
        workers.shutdown(Duration::from_secs(2));
    }

    #[test]
    fn a_coalesced_update_waits_from_the_first_hand_over() {
        let mb = Mailbox {
            pending: Mutex::new(None),
            closed: Mutex::new(false),
            wake: crossbeam_channel::bounded(1).0,
        };
        let work = |t| PodWork {
            pod: pod("u", "a"),
            update_type: t,
            grace_period: None,
        };
        let before = Instant::now();
        mb.put(work(UpdateType::Create));
        std::thread::sleep(Duration::from_millis(20));
        mb.put(work(UpdateType::Update));
        let (w, since) = mb.take().unwrap();
        assert_eq!(w.update_type, UpdateType::Update);
        assert!(since >= before && since < before + Duration::from_millis(15));
        // Once taken, the next update starts a new wait.
        mb.put(work(UpdateType::Sync));
        assert!(mb.take().unwrap().1 >= before + Duration::from_millis(20));
    }

    #[test]
    fn wait_stats_keep_the_longest_wait_and_its_pod() {
        let w = WaitStats::default();
        assert_eq!(w.longest(), None);
        w.record("default/a", Duration::from_millis(5));
        w.record("default/b", Duration::from_millis(9));
        w.record("default/c", Duration::from_millis(7));
        assert_eq!(
            w.longest(),
            Some((Duration::from_millis(9), "default/b".to_string()))
        );
    }

    #[test]
    fn a_worker_records_how_long_its_update_waited() {
        let mut r = rig();
        assert_eq!(r.workers.longest_wait(), None);
        // The status read after the first sync fails, so the next sync
        // waits for a relist.
        r.fake.fail_next("ListPodSandbox", 1);
        let p = pod("u5", "web");
        r.workers.update_pod(PodWork {
            pod: p.clone(),
            update_type: UpdateType::Create,
            grace_period: None,
        });
        wait_for("container start", || r.fake.count("StartContainer") == 1);
        let (first, name) = r.workers.longest_wait().expect("a wait recorded");
        assert_eq!(name, pod_full_name(&p));
        // The next sync waits for a relist newer than the first sync, which
        // comes 300 ms later: that wait is the worker's to count.
        r.workers.update_pod(PodWork {
            pod: p.clone(),
            update_type: UpdateType::Sync,
            grace_period: None,
        });
        std::thread::sleep(Duration::from_millis(300));
        r.cache.update_time(Instant::now(), Arc::new(vec![]));
        wait_for("a longer wait recorded", || {
            r.workers
                .longest_wait()
                .is_some_and(|(d, _)| d >= Duration::from_millis(300) && d > first)
        });
        r.workers.shutdown(Duration::from_secs(2));
    }

    /// Pod `uid` named web whose container runs `cmd`.
    fn web_running(uid: &str, cmd: &str) -> Arc<Pod> {
        let mut p = test_pod(uid, "web");
        if let Some(s) = p.spec.as_mut() {
            s.containers[0].command = Some(vec![cmd.to_string()]);
        }
        Arc::new(p)
    }

    /// The status a sync read after its changes is in the cache for the
    /// next sync: an update right after a start needs no relist, and the
    /// relist thread has nothing to read again.
    #[test]
    fn the_status_read_after_a_sync_serves_the_next_sync_without_a_relist() {
        let mut r = rig();
        let spec = |cmd: &str| web_running("u7", cmd);
        let before = Instant::now();
        r.workers.update_pod(PodWork {
            pod: spec("a"),
            update_type: UpdateType::Create,
            grace_period: None,
        });
        wait_for("container start", || r.fake.count("StartContainer") == 1);
        wait_for("the status read after the start is cached", || {
            r.cache.modified("u7").is_some_and(|t| t > before)
                && r.cache.get("u7").0.container_statuses.len() == 1
        });
        let cached = r.cache.get("u7").0;
        assert_eq!(
            cached.container_statuses[0].state,
            crate::runtime::ContainerState::Running
        );
        // No relist happens here (no update_time): the spec change is
        // acted on at once, from the cached status.
        r.workers.update_pod(PodWork {
            pod: spec("b"),
            update_type: UpdateType::Update,
            grace_period: None,
        });
        wait_for("container replaced", || r.fake.count("StartContainer") == 2);
        // An older status (a relist that started before the worker's read)
        // does not replace the worker's.
        let stale = Instant::now() - Duration::from_secs(5);
        r.cache.set("u7", PodStatus::default(), None, stale);
        assert_eq!(r.cache.get("u7").0.uid, "u7");
        r.workers.shutdown(Duration::from_secs(2));
    }

    #[test]
    fn an_update_that_comes_during_the_status_wait_is_the_one_synced() {
        use crate::runtime::labels::{container_hash, CONTAINER_HASH};
        let mut r = rig();
        let spec = |cmd: &str| web_running("u6", cmd);
        // The status read after the first sync fails...
        r.fake.fail_next("ListPodSandbox", 1);
        r.workers.update_pod(PodWork {
            pod: spec("a"),
            update_type: UpdateType::Create,
            grace_period: None,
        });
        wait_for("container start", || r.fake.count("StartContainer") == 1);
        // ... so the worker waits for a relist newer than its first sync...
        r.workers.update_pod(PodWork {
            pod: spec("b"),
            update_type: UpdateType::Update,
            grace_period: None,
        });
        std::thread::sleep(Duration::from_millis(100));
        // ... while the spec changes again.
        let latest = spec("c");
        r.workers.update_pod(PodWork {
            pod: latest.clone(),
            update_type: UpdateType::Update,
            grace_period: None,
        });
        std::thread::sleep(Duration::from_millis(50));
        r.cache.update_time(Instant::now(), Arc::new(vec![]));
        wait_for("container replaced", || r.fake.count("StartContainer") == 2);
        std::thread::sleep(Duration::from_millis(200));
        // Replaced once, by the latest spec; the one in between never ran.
        assert_eq!(r.fake.count("StartContainer"), 2);
        let want = format!(
            "{:x}",
            container_hash(&latest.spec.as_ref().unwrap().containers[0])
        );
        let id = r.fake.container_id("app").unwrap();
        let c = r
            .fake
            .containers()
            .into_iter()
            .find(|c| c.id == id)
            .unwrap();
        assert_eq!(c.annotations.get(CONTAINER_HASH), Some(&want));
        r.workers.shutdown(Duration::from_secs(2));
    }

    #[test]
    fn a_pod_past_its_active_deadline_is_stopped_failed_and_not_restarted() {
        let mut r = rig();
        let mut p = test_pod("u5", "job");
        p.spec.as_mut().unwrap().active_deadline_seconds = Some(1);
        let p = Arc::new(p);
        let sync = |r: &mut Rig, update_type| {
            let st = r
                .workers
                .shared
                .runtime
                .get_pod_status("u5", "job", "default")
                .unwrap();
            r.cache.set("u5", st, None, Instant::now());
            r.workers.update_pod(PodWork {
                pod: p.clone(),
                update_type,
                grace_period: None,
            });
        };
        r.workers.update_pod(PodWork {
            pod: p.clone(),
            update_type: UpdateType::Create,
            grace_period: None,
        });
        wait_for("container start", || r.fake.count("StartContainer") == 1);
        // The worker is woken at the deadline, not at the 60 s resync.
        let due = r.wait_resync("u5");
        assert!(due < Instant::now() + Duration::from_secs(30), "{due:?}");
        std::thread::sleep(Duration::from_millis(1500));
        assert_eq!(r.workers.take_ready(Instant::now()), vec!["u5".to_string()]);

        sync(&mut r, UpdateType::Sync);
        wait_for("pod stopped", || r.fake.count("StopPodSandbox") == 1);
        assert_eq!(r.fake.count("StopContainer"), 1);
        let status = r.workers.shared.reporter.status("u5").unwrap();
        assert_eq!(status.phase.as_deref(), Some("Failed"));
        assert_eq!(status.reason.as_deref(), Some("DeadlineExceeded"));
        assert_eq!(
            status.message.as_deref(),
            Some("Pod was active on the node longer than the specified deadline")
        );

        // Later syncs (a relist, a resync) never start it again.
        for _ in 0..3 {
            sync(&mut r, UpdateType::Sync);
            std::thread::sleep(Duration::from_millis(100));
        }
        assert_eq!(r.fake.count("StartContainer"), 1);
        assert_eq!(r.fake.count("RunPodSandbox"), 1);
        let status = r.workers.shared.reporter.status("u5").unwrap();
        assert_eq!(status.reason.as_deref(), Some("DeadlineExceeded"));
        r.workers.shutdown(Duration::from_secs(2));
    }

    #[test]
    fn a_pod_that_finished_before_its_deadline_keeps_its_own_phase() {
        let mut r = rig();
        let mut p = test_pod("u6", "job");
        p.spec.as_mut().unwrap().active_deadline_seconds = Some(1);
        let p = Arc::new(p);
        let long_ago = k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            k8s_openapi::jiff::Timestamp::from_second(1_000_000).unwrap(),
        );
        r.workers.shared.reporter.set_status(
            &p,
            k8s_openapi::api::core::v1::PodStatus {
                phase: Some("Succeeded".into()),
                start_time: Some(long_ago),
                ..Default::default()
            },
        );
        r.workers.update_pod(PodWork {
            pod: p.clone(),
            update_type: UpdateType::Sync,
            grace_period: None,
        });
        let due = r.wait_resync("u6");
        let status = r.workers.shared.reporter.status("u6").unwrap();
        assert_eq!(status.phase.as_deref(), Some("Succeeded"));
        assert_eq!(status.reason, None);
        // Not synced again at every tick for a deadline long gone.
        assert!(due > Instant::now() + Duration::from_secs(30), "{due:?}");
        r.workers.shutdown(Duration::from_secs(2));
    }

    #[test]
    fn latest_update_wins() {
        let mb = Mailbox {
            pending: Mutex::new(None),
            closed: Mutex::new(false),
            wake: crossbeam_channel::bounded(1).0,
        };
        for t in [UpdateType::Create, UpdateType::Update, UpdateType::Sync] {
            mb.put(PodWork {
                pod: pod("u", "a"),
                update_type: t,
                grace_period: None,
            });
        }
        assert_eq!(mb.take().unwrap().0.update_type, UpdateType::Sync);
        mb.put(PodWork {
            pod: pod("u", "a"),
            update_type: UpdateType::Kill,
            grace_period: None,
        });
        mb.put(PodWork {
            pod: pod("u", "a"),
            update_type: UpdateType::Update,
            grace_period: None,
        });
        assert_eq!(mb.take().unwrap().0.update_type, UpdateType::Kill);
    }
}
