//! `PodConfig` and its Mux: one `pod-config` thread owns the merged state
//! ([`PodStorage`]), selects over every named source's channel, merges what
//! each sends, and passes the resulting notifications on to the single
//! merged updates channel that the sync loop reads (upstream `PodConfig`,
//! its `pkg/util/config.Mux` and the one goroutine that merges).
//!
//! Nothing else touches the storage: registering a source and a restore
//! are messages to that thread, the sources it has seen are published by
//! it alone, and the events the merge raises go from it to the event
//! recorder.
//!
//! Threads: `pod-config`, started by [`PodConfig::new`] and stopped and
//! joined when the `PodConfig` is dropped.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use crossbeam_channel::{bounded, select, Receiver, Select, Sender, TryRecvError};
use parking_lot::{Mutex, RwLock};

use super::storage::PodStorage;
use super::{Pod, PodEvent, PodOperation, PodUpdate};
use crate::events::EventRecorder;
use crate::thread::{spawn_named, JoinOnDrop};

/// Capacity of the merged updates channel read by the sync loop.
///
/// Ordering: one thread merges every source's updates and sends each
/// merge's notifications before it takes the next update, as upstream's
/// `podStorage` holds its update lock across `merge` and the channel sends.
/// So the sync loop receives the changes of all sources in exactly the
/// order the storage made them, and a REMOVE that frees a name always
/// arrives before the ADD of the pod that was waiting for it.
///
/// When the channel is full the `pod-config` thread blocks: notifications
/// are never dropped or reordered, and the sources in turn block on their
/// own channels. This is back-pressure, not loss; the sync loop only
/// dispatches and drains it quickly.
pub(crate) const UPDATES_CHANNEL_CAPACITY: usize = 50;

/// Capacity of each source's channel into the `pod-config` thread.
///
/// When it is full the source blocks in `send`: its updates can't be
/// dropped (an incremental source such as the API watch can't resend a lost
/// ADD), and a source with nothing to do but wait costs nothing.
pub(crate) const SOURCE_CHANNEL_CAPACITY: usize = 8;

/// Capacity of the requests channel into the `pod-config` thread. A
/// caller blocks while it is full, as a source does on its own channel;
/// requests come from start-up and tests, a few at a time.
const REQUESTS_CHANNEL_CAPACITY: usize = 16;

/// What the [`PodConfig`] handle asks of the `pod-config` thread. The
/// thread takes every waiting request before it merges a source's update,
/// so a request made before a source sends is served before that update.
enum Request {
    /// Listen to a new source, under this name.
    Register(String, Receiver<PodUpdate>),
    /// Merge checkpointed pods for a source; answered once delivered.
    Restore(String, Vec<Arc<Pod>>, Sender<()>),
    /// Answer with the merged pods.
    #[cfg(test)]
    MergedState(Sender<Vec<Arc<Pod>>>),
}

/// Why a delivery did not happen.
enum Stopped {
    /// The `PodConfig` is being dropped.
    Shutdown,
    /// Nobody reads the updates channel any more.
    NoReader,
}

/// The `pod-config` thread's state: the storage, the sources it listens
/// to, and the sending ends it feeds. Owned by that thread alone.
struct Merger {
    storage: PodStorage,
    /// The sources, in registration order.
    sources: Vec<(String, Receiver<PodUpdate>)>,
    /// Sources whose first SET has been merged *and delivered*; written
    /// here only, read by [`PodConfig::seen_all_sources`].
    seen: Arc<RwLock<HashSet<String>>>,
    updates: Sender<PodUpdate>,
    /// Where the merge's events go (upstream's podStorage recorder): the
    /// apiserver when connected; it never blocks the merge.
    recorder: EventRecorder,
    requests: Receiver<Request>,
    /// Disconnects when the `PodConfig` is dropped.
    stop: Receiver<()>,
}

impl Merger {
    fn send(&self, update: PodUpdate) -> Result<(), Stopped> {
        select! {
            send(self.updates, update) -> res => res.map_err(|_| Stopped::NoReader),
            recv(self.stop) -> _ => Err(Stopped::Shutdown),
        }
    }

    fn merge_and_send(&mut self, source: &str, update: PodUpdate) -> Result<(), Stopped> {
        let is_set = update.op == PodOperation::Set;
        let notifications = self.storage.merge(source, update);
        let events = self.storage.take_events();
        for notification in notifications {
            self.send(notification)?;
        }
        self.publish(events);
        if is_set && !self.seen.read().contains(source) {
            self.seen.write().insert(source.to_string());
        }
        Ok(())
    }

    fn publish(&self, events: Vec<PodEvent>) {
        for e in events {
            self.recorder
                .event(&e.object, e.event_type, e.reason, e.message);
        }
    }

    fn serve(&mut self, request: Request) -> Result<(), Stopped> {
        match request {
            Request::Register(source, rx) => {
                log::debug!("config: listening to source {source}");
                self.sources.push((source, rx));
            }
            Request::Restore(source, pods, done) => {
                let update = PodUpdate::new(PodOperation::Restore, &source, pods);
                self.merge_and_send(&source, update)?;
                let _ = done.send(());
            }
            #[cfg(test)]
            Request::MergedState(reply) => {
                let _ = reply.send(self.storage.merged_state());
            }
        }
        Ok(())
    }

    /// Serves every waiting request. Err(Shutdown) as well when the
    /// `PodConfig` is gone.
    fn serve_waiting(&mut self) -> Result<(), Stopped> {
        loop {
            match self.requests.try_recv() {
                Ok(request) => self.serve(request)?,
                Err(TryRecvError::Empty) => return Ok(()),
                Err(TryRecvError::Disconnected) => return Err(Stopped::Shutdown),
            }
        }
    }

    /// Waits for the next request or source update and handles it.
    fn turn(&mut self) -> Result<(), Stopped> {
        let mut sel = Select::new();
        let stop = sel.recv(&self.stop);
        let requests = sel.recv(&self.requests);
        for (_, rx) in &self.sources {
            sel.recv(rx);
        }
        let op = sel.select();
        match op.index() {
            i if i == stop => {
                let _ = op.recv(&self.stop);
                Err(Stopped::Shutdown)
            }
            i if i == requests => match op.recv(&self.requests) {
                Ok(request) => self.serve(request),
                Err(_) => Err(Stopped::Shutdown),
            },
            i => {
                let n = i - 2;
                match op.recv(&self.sources[n].1) {
                    Ok(update) => {
                        self.serve_waiting()?;
                        let source = self.sources[n].0.clone();
                        self.merge_and_send(&source, update)
                    }
                    Err(_) => {
                        // Every sender is gone: nothing more can come.
                        let (source, _) = self.sources.remove(n);
                        log::debug!("config: source {source} closed");
                        Ok(())
                    }
                }
            }
        }
    }
}

/// The `pod-config` thread: merges until the `PodConfig` is dropped or
/// nobody reads the updates channel.
fn run(mut merger: Merger) {
    loop {
        match merger.turn() {
            Ok(()) => {}
            Err(Stopped::Shutdown) => break,
            Err(Stopped::NoReader) => {
                log::debug!("config: updates channel closed, the pod config stops merging");
                break;
            }
        }
    }
    log::debug!("config: pod config stopped");
}

/// Merges the pod sources into one ordered stream of [`PodUpdate`]s.
pub(crate) struct PodConfig {
    /// Every source that asked for a channel, with the sending end handed out.
    sources: Mutex<BTreeMap<String, Sender<PodUpdate>>>,
    /// Published by the `pod-config` thread.
    seen: Arc<RwLock<HashSet<String>>>,
    requests: Sender<Request>,
    /// The `pod-config` thread, joined on drop after `stop` is dropped.
    merger: Option<JoinOnDrop<()>>,
    /// Never sent on: dropping it disconnects the thread's stop receiver.
    stop: Option<Sender<()>>,
}

impl PodConfig {
    /// Returns the config and the receiving end of the merged updates
    /// channel (capacity [`UPDATES_CHANNEL_CAPACITY`]). The merge's events
    /// (a pod ignored because its full name is taken) go to `recorder`.
    pub(crate) fn new(recorder: EventRecorder) -> (PodConfig, Receiver<PodUpdate>) {
        let storage = PodStorage::new();
        let (updates_tx, updates_rx) = bounded(UPDATES_CHANNEL_CAPACITY);
        let (stop_tx, stop_rx) = bounded(0);
        let (requests_tx, requests_rx) = bounded(REQUESTS_CHANNEL_CAPACITY);
        let seen = Arc::new(RwLock::new(HashSet::new()));
        let merger = Merger {
            storage,
            sources: Vec::new(),
            seen: Arc::clone(&seen),
            updates: updates_tx,
            recorder,
            requests: requests_rx,
            stop: stop_rx,
        };
        let merger = match spawn_named("pod-config", move || run(merger)) {
            Ok(handle) => Some(handle),
            Err(e) => {
                // Every request then fails: sources see their sends fail
                // and log them.
                log::error!("config: cannot start the pod-config thread: {e}");
                None
            }
        };
        let config = PodConfig {
            sources: Mutex::new(BTreeMap::new()),
            seen,
            requests: requests_tx,
            merger,
            stop: Some(stop_tx),
        };
        (config, updates_rx)
    }

    /// The sending end for the named source (capacity
    /// [`SOURCE_CHANNEL_CAPACITY`]). The first call for a name registers the
    /// source with the `pod-config` thread; later calls return the same
    /// channel. The source name given here, not the `source` field of what
    /// is sent, decides where pods are merged.
    pub(crate) fn channel(&self, source: &str) -> Sender<PodUpdate> {
        let (tx, rx) = bounded(SOURCE_CHANNEL_CAPACITY);
        {
            let mut sources = self.sources.lock();
            if let Some(tx) = sources.get(source) {
                return tx.clone();
            }
            sources.insert(source.to_string(), tx.clone());
        }
        // Outside the lock: the send may wait for the `pod-config` thread,
        // and `seen_all_sources` (the sync loop) takes that lock. What the
        // source sends meanwhile waits in its channel.
        if self
            .requests
            .send(Request::Register(source.to_string(), rx))
            .is_err()
        {
            // The returned sender is then disconnected: the source sees
            // its sends fail and logs them; a later call tries again.
            self.sources.lock().remove(source);
            log::error!("config: cannot register source {source}: the pod config is gone");
        }
        tx
    }

    /// True once every source in `expected`, and every source that asked for
    /// a channel, has had a SET merged and its notifications delivered to the
    /// updates channel (upstream `SeenAllSources`). ADD, UPDATE and RESTORE
    /// don't count: only a SET is a source's complete word.
    pub(crate) fn seen_all_sources(&self, expected: &[&str]) -> bool {
        let registered: Vec<String> = self.sources.lock().keys().cloned().collect();
        let seen = self.seen.read();
        expected.iter().all(|s| seen.contains(*s)) && registered.iter().all(|s| seen.contains(s))
    }

    /// Asks the `pod-config` thread and waits for its answer. `None` when
    /// the thread is gone (or stops before answering).
    fn ask<T>(&self, request: impl FnOnce(Sender<T>) -> Request) -> Option<T> {
        let (tx, rx) = bounded(1);
        self.requests.send(request(tx)).ok()?;
        rx.recv().ok()
    }

    /// Merges pods restored from a checkpoint for `source` (a RESTORE) and
    /// returns once the notifications are delivered. The source is not
    /// registered (it may not exist in this configuration) and not marked
    /// as seen: only its own SET does that. May block on a full updates
    /// channel, so it must not be called from the thread that reads that
    /// channel; call it before the sync loop is busy.
    pub(crate) fn restore(&self, source: &str, pods: Vec<Arc<Pod>>) {
        let request = |done| Request::Restore(source.to_string(), pods, done);
        if self.ask(request).is_none() {
            log::debug!("config: restore not delivered, the updates channel is closed");
        }
    }

    /// All merged pods, as the `pod-config` thread has them once it has
    /// delivered what it merged so far (empty if it is gone).
    #[cfg(test)]
    pub(crate) fn merged_state(&self) -> Vec<Arc<Pod>> {
        self.ask(Request::MergedState).unwrap_or_default()
    }

    /// The names of the sources that asked for a channel.
    #[cfg(test)]
    pub(crate) fn sources(&self) -> Vec<String> {
        self.sources.lock().keys().cloned().collect()
    }
}

impl Drop for PodConfig {
    fn drop(&mut self) {
        // Disconnect the stop channel first, then wait for the thread.
        drop(self.stop.take());
        if let Some(merger) = self.merger.take() {
            if merger.join().is_err() {
                log::error!("config: the pod-config thread panicked");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Pod;
    use crate::events::EventType;
    use crate::pod::{API_SOURCE, FILE_SOURCE, HTTP_SOURCE};
    use std::time::Duration;

    const WAIT: Duration = Duration::from_secs(5);

    fn pod(uid: &str, name: &str) -> Arc<Pod> {
        let mut p = Pod::default();
        p.metadata.uid = Some(uid.to_string());
        p.metadata.name = Some(name.to_string());
        p.metadata.namespace = Some("default".to_string());
        Arc::new(p)
    }

    fn names(u: &PodUpdate) -> Vec<String> {
        u.pods
            .iter()
            .map(|p| p.metadata.name.clone().unwrap_or_default())
            .collect()
    }

    #[test]
    fn sources_are_merged_by_the_config_thread() {
        let (config, updates) = PodConfig::new(EventRecorder::disabled());
        let file = config.channel(FILE_SOURCE);
        let api = config.channel(API_SOURCE);
        assert_eq!(config.sources(), [API_SOURCE, FILE_SOURCE]);
        assert!(!config.seen_all_sources(&[]));

        file.send(PodUpdate::new(
            PodOperation::Set,
            FILE_SOURCE,
            vec![pod("u1", "a")],
        ))
        .unwrap();
        let u = updates.recv_timeout(WAIT).unwrap();
        assert_eq!(
            (u.op, u.source.as_str(), names(&u)),
            (PodOperation::Add, "file", vec!["a".to_string()])
        );
        assert!(!config.seen_all_sources(&[FILE_SOURCE]), "api not seen yet");

        // The channel's name decides the source, whatever the update says.
        api.send(PodUpdate::new(PodOperation::Set, "mislabelled", vec![]))
            .unwrap();
        let u = updates.recv_timeout(WAIT).unwrap();
        assert_eq!(
            (u.op, u.source.as_str(), u.pods.len()),
            (PodOperation::Add, "api", 0)
        );
        // The source is marked seen after delivering; wait for it.
        let deadline = std::time::Instant::now() + WAIT;
        while !config.seen_all_sources(&[FILE_SOURCE, API_SOURCE]) {
            assert!(std::time::Instant::now() < deadline, "sources never seen");
            std::thread::yield_now();
        }
        assert!(!config.seen_all_sources(&["http"]));

        // A second channel call returns the same channel.
        config
            .channel(FILE_SOURCE)
            .send(PodUpdate::new(PodOperation::Set, FILE_SOURCE, vec![]))
            .unwrap();
        let u = updates.recv_timeout(WAIT).unwrap();
        assert_eq!(
            (u.op, names(&u)),
            (PodOperation::Remove, vec!["a".to_string()])
        );
    }

    #[test]
    fn drop_stops_the_config_thread_even_when_the_updates_channel_is_full() {
        let (config, updates) = PodConfig::new(EventRecorder::disabled());
        let api = config.channel(API_SOURCE);
        // Fill the updates channel and leave the config thread blocked on it.
        for i in 0..UPDATES_CHANNEL_CAPACITY + 3 {
            let p = pod(&format!("u{i}"), &format!("p{i}"));
            api.send(PodUpdate::new(PodOperation::Add, API_SOURCE, vec![p]))
                .unwrap();
        }
        let deadline = std::time::Instant::now() + WAIT;
        while updates.len() < UPDATES_CHANNEL_CAPACITY {
            assert!(std::time::Instant::now() < deadline, "channel never filled");
            std::thread::yield_now();
        }
        drop(config); // joins the config thread; must not hang
                      // The source learns that nobody listens any more.
        let late = PodUpdate::new(PodOperation::Set, API_SOURCE, vec![]);
        let mut refused = false;
        for _ in 0..SOURCE_CHANNEL_CAPACITY + 1 {
            if api.send(late.clone()).is_err() {
                refused = true;
                break;
            }
        }
        assert!(refused);
        // What was delivered stays readable, then the channel is closed.
        assert_eq!(updates.iter().count(), UPDATES_CHANNEL_CAPACITY);
    }

    #[test]
    fn config_thread_ends_when_nobody_reads_updates() {
        let (config, updates) = PodConfig::new(EventRecorder::disabled());
        drop(updates);
        let api = config.channel(API_SOURCE);
        api.send(PodUpdate::new(
            PodOperation::Add,
            API_SOURCE,
            vec![pod("u1", "a")],
        ))
        .unwrap();
        drop(config);
    }

    #[test]
    fn restore_delivers_without_registering_or_marking_the_source() {
        let (config, updates) = PodConfig::new(EventRecorder::disabled());
        let file = config.channel(FILE_SOURCE);
        config.restore(API_SOURCE, vec![pod("r1", "restored")]);
        let u = updates.recv_timeout(WAIT).unwrap();
        assert_eq!(
            (u.op, u.source.as_str(), names(&u)),
            (
                PodOperation::Restore,
                API_SOURCE,
                vec!["restored".to_string()]
            )
        );
        assert_eq!(config.sources(), [FILE_SOURCE]);
        file.send(PodUpdate::new(PodOperation::Set, FILE_SOURCE, vec![]))
            .unwrap();
        assert_eq!(updates.recv_timeout(WAIT).unwrap().op, PodOperation::Add);
        let deadline = std::time::Instant::now() + WAIT;
        while !config.seen_all_sources(&[FILE_SOURCE]) {
            assert!(std::time::Instant::now() < deadline, "file never seen");
            std::thread::yield_now();
        }
        assert!(!config.seen_all_sources(&[FILE_SOURCE, API_SOURCE]));
        // The API source's first SET then decides about the restored pod.
        let api = config.channel(API_SOURCE);
        api.send(PodUpdate::new(PodOperation::Set, API_SOURCE, vec![]))
            .unwrap();
        let u = updates.recv_timeout(WAIT).unwrap();
        assert_eq!(
            (u.op, names(&u)),
            (PodOperation::Remove, vec!["restored".to_string()])
        );
        assert!(config.merged_state().is_empty());
    }

    #[test]
    fn name_conflicts_are_reported_as_events() {
        let (recorder, events) = EventRecorder::capture();
        let (config, updates) = PodConfig::new(recorder);
        let file = config.channel(FILE_SOURCE);
        let http = config.channel(HTTP_SOURCE);
        file.send(PodUpdate::new(
            PodOperation::Set,
            FILE_SOURCE,
            vec![pod("f1", "web")],
        ))
        .unwrap();
        assert_eq!(updates.recv_timeout(WAIT).unwrap().op, PodOperation::Add);
        http.send(PodUpdate::new(
            PodOperation::Add,
            HTTP_SOURCE,
            vec![pod("a1", "web")],
        ))
        .unwrap();
        let event = events.recv_timeout(WAIT).unwrap();
        assert_eq!(
            (
                event.obj.kind,
                event.obj.name.as_str(),
                event.obj.uid.as_str()
            ),
            ("Pod", "web", "a1")
        );
        assert_eq!(
            (event.kind, event.reason.as_str()),
            (EventType::Warning, "FailedValidation")
        );
        assert!(event.message.contains("from http"), "{}", event.message);
        assert!(updates.try_recv().is_err(), "a held pod is not delivered");
        // Freeing the name lets it in, right after the removal.
        file.send(PodUpdate::new(PodOperation::Set, FILE_SOURCE, vec![]))
            .unwrap();
        let removed = updates.recv_timeout(WAIT).unwrap();
        let added = updates.recv_timeout(WAIT).unwrap();
        assert_eq!(
            (removed.op, removed.source.as_str()),
            (PodOperation::Remove, FILE_SOURCE)
        );
        assert_eq!(
            (added.op, added.source.as_str(), names(&added)),
            (PodOperation::Add, HTTP_SOURCE, vec!["web".to_string()])
        );
    }

    /// The names of this process's threads.
    fn thread_names() -> Vec<String> {
        let mut names = Vec::new();
        for entry in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
            if let Ok(comm) = std::fs::read_to_string(entry.path().join("comm")) {
                names.push(comm.trim_end().to_string());
            }
        }
        names
    }

    /// One `pod-config` thread merges every source: registering a source
    /// starts no thread of its own.
    #[test]
    fn one_thread_merges_every_source() {
        let (config, updates) = PodConfig::new(EventRecorder::disabled());
        for source in [FILE_SOURCE, HTTP_SOURCE, API_SOURCE] {
            config
                .channel(source)
                .send(PodUpdate::new(PodOperation::Set, source, vec![]))
                .unwrap();
        }
        for _ in 0..3 {
            assert_eq!(updates.recv_timeout(WAIT).unwrap().op, PodOperation::Add);
        }
        let names = thread_names();
        assert!(names.iter().any(|n| n == "pod-config"), "{names:?}");
        assert!(
            !names.iter().any(|n| n.starts_with("config-mux")),
            "{names:?}"
        );
        let deadline = std::time::Instant::now() + WAIT;
        while !config.seen_all_sources(&[FILE_SOURCE, HTTP_SOURCE, API_SOURCE]) {
            assert!(std::time::Instant::now() < deadline, "sources never seen");
            std::thread::yield_now();
        }
    }

    /// Upstream's race test: registering sources while another thread asks
    /// whether all were seen.
    #[test]
    fn channel_and_seen_all_sources_race() {
        let (config, _updates) = PodConfig::new(EventRecorder::disabled());
        let config = Arc::new(config);
        let registering = Arc::clone(&config);
        let t = spawn_named("test-register", move || {
            for i in 0..100 {
                registering.channel(&format!("s{i}"));
            }
        })
        .unwrap();
        for _ in 0..100 {
            assert!(!config.seen_all_sources(&["s0"]));
        }
        t.join().unwrap();
        assert_eq!(config.sources().len(), 100);
    }

    /// Several sources sending at once, with names that collide across
    /// them, and a consumer slow enough that the merge queues up on the
    /// updates channel: the consumer that only reads that channel ends up
    /// with exactly the merged state. If one merge's sends could interleave
    /// with another's, a REMOVE could overtake the ADD it enabled and this
    /// fails.
    #[test]
    fn concurrent_sources_are_delivered_in_merge_order() {
        const ROUNDS: usize = 400;
        let (config, updates) = PodConfig::new(EventRecorder::disabled());
        let sources = [API_SOURCE, FILE_SOURCE, "http"];
        let mut senders = Vec::new();
        for (n, source) in sources.into_iter().enumerate() {
            let tx = config.channel(source);
            senders.push(
                spawn_named(format!("test-{source}"), move || {
                    let mut x = 0x2545_F491_4F6C_DD1Du64 ^ (n as u64 + 1);
                    let mut next = move || {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        x
                    };
                    for _ in 0..ROUNDS {
                        let count = (next() % 4) as usize;
                        let pods: Vec<Arc<Pod>> = (0..count)
                            .map(|_| {
                                let i = next() % 6;
                                pod(&format!("{source}-{i}"), &format!("p{}", i % 3))
                            })
                            .collect();
                        let op = match next() % 4 {
                            0 | 1 => PodOperation::Set,
                            2 => PodOperation::Add,
                            _ => PodOperation::Remove,
                        };
                        if tx.send(PodUpdate::new(op, source, pods)).is_err() {
                            return;
                        }
                    }
                    // The last word of each source: a pod no one else names.
                    let marker = pod(&format!("done-{source}"), &format!("done-{source}"));
                    let _ = tx.send(PodUpdate::new(PodOperation::Add, source, vec![marker]));
                })
                .unwrap(),
            );
        }
        let mut state: BTreeMap<String, Arc<Pod>> = BTreeMap::new();
        let mut consume = || -> Result<(), String> {
            let mut done = 0;
            let mut received = 0u64;
            while done < sources.len() {
                let u = updates
                    .recv_timeout(WAIT)
                    .map_err(|_| "updates stalled".to_string())?;
                received += 1;
                if received.is_multiple_of(4) {
                    std::thread::sleep(std::time::Duration::from_micros(200));
                }
                for p in u.pods {
                    let uid = crate::pod::pod_uid(&p).to_string();
                    let known = state.contains_key(&uid);
                    match u.op {
                        PodOperation::Add if !known => {
                            done += usize::from(uid.starts_with("done-"));
                            state.insert(uid, p);
                        }
                        PodOperation::Remove if known => {
                            state.remove(&uid);
                        }
                        PodOperation::Update | PodOperation::Reconcile | PodOperation::Delete
                            if known =>
                        {
                            state.insert(uid, p);
                        }
                        op => return Err(format!("{op:?} of {uid} (known: {known})")),
                    }
                }
            }
            Ok(())
        };
        let outcome = consume();
        let merged: BTreeMap<String, Arc<Pod>> = config
            .merged_state()
            .into_iter()
            .map(|p| (crate::pod::pod_uid(&p).to_string(), p))
            .collect();
        // Stop the config thread first, so that senders blocked on it return.
        drop(config);
        drop(senders);
        if let Err(e) = outcome {
            panic!("out of order: {e}");
        }
        assert_eq!(state, merged);
    }
}
