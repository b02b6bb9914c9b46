//! `PodConfig` and its Mux: one listener thread per named source, each
//! merging what its source sends into the shared [`PodStorage`] and passing
//! the resulting notifications on to the single merged updates channel that
//! the sync loop reads (upstream `PodConfig` and `pkg/util/config.Mux`).
//!
//! Threads: `config-mux/<source>`, started by the first
//! [`PodConfig::channel`] call for that source and stopped and joined when
//! the `PodConfig` is dropped.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use crossbeam_channel::{bounded, select, Receiver, Sender};
use parking_lot::{Mutex, RwLock};

use super::storage::PodStorage;
use super::{NotificationMode, PodOperation, PodUpdate, ALL_SOURCE};
use crate::thread::{spawn_named, JoinOnDrop};

/// Capacity of the merged updates channel read by the sync loop.
///
/// When it is full the Mux listener blocks, still holding the merge lock
/// (see [`Merger`]): notifications are never dropped or reordered, and the
/// sources in turn block on their own channels. This is back-pressure, not
/// loss; the sync loop only dispatches and drains it quickly.
pub const UPDATES_CHANNEL_CAPACITY: usize = 50;

/// Capacity of each source's channel into its Mux listener.
///
/// When it is full the source blocks in `send`: its updates can't be
/// dropped (an incremental source such as the API watch can't resend a lost
/// ADD), and a source with nothing to do but wait costs nothing.
pub const SOURCE_CHANNEL_CAPACITY: usize = 8;

/// The merge state and the sending end of the updates channel.
///
/// `storage` is locked across the whole compute-and-send of one merge, so
/// that two sources' notifications never interleave and the sync loop sees
/// them in the order the storage changed. A listener that blocks on a full
/// updates channel therefore holds the lock; nothing the sync loop calls
/// takes it (`seen` has its own lock), except [`PodConfig::sync`].
struct Merger {
    storage: Mutex<PodStorage>,
    /// Sources whose first SET has been merged *and delivered*.
    seen: RwLock<HashSet<String>>,
    updates: Sender<PodUpdate>,
    /// Disconnects when the `PodConfig` is dropped.
    stop: Receiver<()>,
}

/// Why a delivery did not happen.
enum Stopped {
    /// The `PodConfig` is being dropped.
    Shutdown,
    /// Nobody reads the updates channel any more.
    NoReader,
}

impl Merger {
    fn send(&self, update: PodUpdate) -> Result<(), Stopped> {
        select! {
            send(self.updates, update) -> res => res.map_err(|_| Stopped::NoReader),
            recv(self.stop) -> _ => Err(Stopped::Shutdown),
        }
    }

    fn merge_and_send(&self, source: &str, update: PodUpdate) -> Result<(), Stopped> {
        let is_set = update.op == PodOperation::Set;
        let mut storage = self.storage.lock();
        for notification in storage.merge(source, update) {
            self.send(notification)?;
        }
        drop(storage);
        if is_set && !self.seen.read().contains(source) {
            self.seen.write().insert(source.to_string());
        }
        Ok(())
    }
}

/// Merges the pod sources into one ordered stream of [`PodUpdate`]s.
pub struct PodConfig {
    merger: Arc<Merger>,
    /// Every source that asked for a channel, with the sending end handed out.
    sources: Mutex<BTreeMap<String, Sender<PodUpdate>>>,
    /// The listeners, joined on drop after `stop` is dropped.
    listeners: Mutex<Vec<JoinOnDrop<()>>>,
    /// Never sent on: dropping it disconnects every listener's stop receiver.
    stop: Option<Sender<()>>,
}

impl PodConfig {
    /// Returns the config and the receiving end of the merged updates
    /// channel (capacity [`UPDATES_CHANNEL_CAPACITY`]).
    pub fn new(mode: NotificationMode) -> (PodConfig, Receiver<PodUpdate>) {
        PodConfig::with_storage(PodStorage::new(mode))
    }

    /// Like [`PodConfig::new`] with a storage built by the caller (tests use
    /// a fixed clock).
    pub fn with_storage(storage: PodStorage) -> (PodConfig, Receiver<PodUpdate>) {
        let (updates_tx, updates_rx) = bounded(UPDATES_CHANNEL_CAPACITY);
        let (stop_tx, stop_rx) = bounded(0);
        let merger = Arc::new(Merger {
            storage: Mutex::new(storage),
            seen: RwLock::new(HashSet::new()),
            updates: updates_tx,
            stop: stop_rx,
        });
        let config = PodConfig {
            merger,
            sources: Mutex::new(BTreeMap::new()),
            listeners: Mutex::new(Vec::new()),
            stop: Some(stop_tx),
        };
        (config, updates_rx)
    }

    /// The sending end for the named source (capacity
    /// [`SOURCE_CHANNEL_CAPACITY`]). The first call for a name registers the
    /// source and starts its listener thread `config-mux/<source>`; later
    /// calls return the same channel. The source name given here, not the
    /// `source` field of what is sent, decides where pods are merged.
    pub fn channel(&self, source: &str) -> Sender<PodUpdate> {
        let mut sources = self.sources.lock();
        if let Some(tx) = sources.get(source) {
            return tx.clone();
        }
        let (tx, rx) = bounded(SOURCE_CHANNEL_CAPACITY);
        let merger = Arc::clone(&self.merger);
        let name = source.to_string();
        match spawn_named(format!("config-mux/{source}"), move || {
            listen(merger, name, rx)
        }) {
            Ok(handle) => {
                self.listeners.lock().push(handle);
                sources.insert(source.to_string(), tx.clone());
            }
            Err(e) => {
                // The returned sender is then disconnected: the source sees
                // its sends fail and logs them; a later call tries again.
                log::error!("config: cannot start the listener thread for source {source}: {e}");
            }
        }
        tx
    }

    /// True once every source in `expected`, and every source that asked for
    /// a channel, has had a SET merged and its notifications delivered to the
    /// updates channel (upstream `SeenAllSources`). ADD, UPDATE and RESTORE
    /// don't count: only a SET is a source's complete word.
    pub fn seen_all_sources(&self, expected: &[&str]) -> bool {
        let registered: Vec<String> = self.sources.lock().keys().cloned().collect();
        let seen = self.merger.seen.read();
        expected.iter().all(|s| seen.contains(*s)) && registered.iter().all(|s| seen.contains(s))
    }

    /// Re-sends the full merged state as one SET from [`ALL_SOURCE`]
    /// (upstream `PodConfig.Sync`). Takes the merge lock and may block on a
    /// full updates channel, so it must not be called from the thread that
    /// reads that channel.
    pub fn sync(&self) {
        let storage = self.merger.storage.lock();
        let update = PodUpdate::new(PodOperation::Set, ALL_SOURCE, storage.merged_state());
        if self.merger.send(update).is_err() {
            log::debug!("config: sync not delivered, the updates channel is closed");
        }
    }

    /// The names of the sources that asked for a channel.
    pub fn sources(&self) -> Vec<String> {
        self.sources.lock().keys().cloned().collect()
    }
}

impl Drop for PodConfig {
    fn drop(&mut self) {
        // Disconnect the stop channel first, then wait for the listeners.
        drop(self.stop.take());
        for listener in self.listeners.lock().drain(..) {
            if listener.join().is_err() {
                log::error!("config: a source listener thread panicked");
            }
        }
    }
}

/// The Mux listener of one source: merges each update it receives.
fn listen(merger: Arc<Merger>, source: String, updates: Receiver<PodUpdate>) {
    log::debug!("config: listening to source {source}");
    loop {
        let update = select! {
            recv(updates) -> msg => match msg {
                Ok(update) => update,
                Err(_) => break,
            },
            recv(merger.stop) -> _ => break,
        };
        match merger.merge_and_send(&source, update) {
            Ok(()) => {}
            Err(Stopped::Shutdown) => break,
            Err(Stopped::NoReader) => {
                log::debug!("config: updates channel closed, listener for {source} ends");
                break;
            }
        }
    }
    log::debug!("config: listener for source {source} stopped");
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Pod, API_SOURCE, FILE_SOURCE};
    use std::time::Duration;

    const WAIT: Duration = Duration::from_secs(5);

    fn pod(uid: &str, name: &str) -> Pod {
        let mut p = Pod::default();
        p.metadata.uid = Some(uid.to_string());
        p.metadata.name = Some(name.to_string());
        p.metadata.namespace = Some("default".to_string());
        p
    }

    fn names(u: &PodUpdate) -> Vec<String> {
        u.pods
            .iter()
            .map(|p| p.metadata.name.clone().unwrap_or_default())
            .collect()
    }

    #[test]
    fn sources_are_merged_through_listener_threads() {
        let (config, updates) = PodConfig::new(NotificationMode::Incremental);
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
        // The listener marks the source after delivering; wait for it.
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
    fn sync_resends_the_merged_state() {
        let (config, updates) = PodConfig::new(NotificationMode::Incremental);
        let api = config.channel(API_SOURCE);
        api.send(PodUpdate::new(
            PodOperation::Add,
            API_SOURCE,
            vec![pod("u1", "a"), pod("u2", "b")],
        ))
        .unwrap();
        assert_eq!(updates.recv_timeout(WAIT).unwrap().op, PodOperation::Add);
        config.sync();
        let u = updates.recv_timeout(WAIT).unwrap();
        assert_eq!((u.op, u.source.as_str()), (PodOperation::Set, ALL_SOURCE));
        assert_eq!(names(&u), ["a", "b"]);
    }

    #[test]
    fn drop_stops_listeners_even_when_the_updates_channel_is_full() {
        let (config, updates) = PodConfig::new(NotificationMode::Incremental);
        let api = config.channel(API_SOURCE);
        // Fill the updates channel and leave the listener blocked on it.
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
        drop(config); // joins the listener; must not hang
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
    fn listener_ends_when_nobody_reads_updates() {
        let (config, updates) = PodConfig::new(NotificationMode::Incremental);
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
    fn snapshot_mode_through_the_config() {
        let (config, updates) = PodConfig::new(NotificationMode::Snapshot);
        let file = config.channel(FILE_SOURCE);
        file.send(PodUpdate::new(
            PodOperation::Set,
            FILE_SOURCE,
            vec![pod("u1", "a")],
        ))
        .unwrap();
        let u = updates.recv_timeout(WAIT).unwrap();
        assert_eq!(
            (u.op, names(&u)),
            (PodOperation::Set, vec!["a".to_string()])
        );
    }
}
