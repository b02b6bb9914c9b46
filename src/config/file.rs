//! The file source: static pod manifests from a directory (or one file),
//! sent to the merge as a SET of all of them whenever anything changes
//! (upstream `config/file.go` and `file_linux.go`).
//!
//! Two threads per source:
//! - `config-file` lists the path: at start, after every `period` tick, at
//!   once when the watcher reports a change, and again after a short settle
//!   time if the change was a burst. Every list that differs from the last
//!   one sent, and the first list, becomes one SET.
//! - `config-file-watch` blocks in `read` on an inotify descriptor watching
//!   the directory (or, for a single file or a path that does not exist yet,
//!   its parent) and only wakes the lister. It is started by the lister when
//!   the watched directory exists and ends when its watch goes away (the
//!   directory was removed or moved, or the lister removed the watch to stop).
//!
//! While there is nothing to watch (neither the path nor its parent
//! exists) or inotify fails, the lister retries the watch and lists again
//! with back-off (1 s doubling to 20 s, as upstream retries its watch), on
//! top of the periodic list. A manifest that can't be read, decoded or
//! validated is logged with its file name and the reason and left out; the
//! others are unaffected. Parsed manifests are cached by file identity
//! (device, inode, size, mtime, ctime), so a change re-reads only the files
//! that changed.

use std::collections::{BTreeMap, HashMap};
use std::ffi::OsString;
use std::fs;
use std::io::{self, Read};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{after, bounded, never, select, tick, Receiver, Sender, TrySendError};
use inotify::{EventMask, Inotify, WatchDescriptor, WatchMask, Watches};

use super::decode::decode_pod;
use super::defaults::apply_static_defaults;
use super::{Pod, PodOperation, PodUpdate};
use crate::pod::FILE_SOURCE;
use crate::thread::{spawn_named, spawn_with_stack, JoinOnDrop};

/// How often the whole path is listed again (`--file-check-frequency`).
pub const DEFAULT_FILE_CHECK_FREQUENCY: Duration = Duration::from_secs(20);

/// Manifests larger than this are refused.
pub const MAX_MANIFEST_SIZE: u64 = 10 * 1024 * 1024;

/// A manifest over this size has the allocator's free memory handed back
/// after the list that read it (as has any manifest that failed).
const GIVE_BACK_SIZE: u64 = 1024 * 1024;

/// After a change event and its list, list again if further events came
/// and then none for this long...
const SETTLE_QUIET: Duration = Duration::from_millis(15);
/// ...or once this much time has passed since the first event.
const SETTLE_MAX: Duration = Duration::from_millis(50);

/// First and longest delay between attempts to set up a watch while there
/// is none (upstream: 1 s and 20 s).
const WATCH_RETRY_MIN: Duration = Duration::from_secs(1);
const WATCH_RETRY_MAX: Duration = Duration::from_secs(20);

/// The lister parses untrusted YAML and JSON (nesting is bounded by the
/// parsers' depth limits); give it more stack than the default.
const LISTER_STACK: usize = 1024 * 1024;

/// Events that can change what the directory holds.
fn watch_mask() -> WatchMask {
    WatchMask::CREATE
        | WatchMask::CLOSE_WRITE
        | WatchMask::MOVED_TO
        | WatchMask::MOVED_FROM
        | WatchMask::DELETE
        | WatchMask::ATTRIB
        | WatchMask::DELETE_SELF
        | WatchMask::MOVE_SELF
        | WatchMask::ONLYDIR
}

/// A running file source; dropping it stops and joins its threads.
pub struct FileSource {
    /// Never sent on: dropping it tells the lister to stop.
    stop: Option<Sender<()>>,
    lister: Option<JoinOnDrop<()>>,
}

impl FileSource {
    /// Starts watching `path` (a directory of manifests or one manifest
    /// file) and sends a SET of all its pods on `updates` at start and after
    /// every change. `period` is the full re-list interval (zero means
    /// [`DEFAULT_FILE_CHECK_FREQUENCY`]). A missing path is not an error: it
    /// holds no pods until it appears.
    pub(crate) fn start(
        path: PathBuf,
        node_name: String,
        period: Duration,
        updates: Sender<PodUpdate>,
    ) -> io::Result<FileSource> {
        FileSource::start_with(path, node_name, period, updates, true)
    }

    fn start_with(
        path: PathBuf,
        node_name: String,
        period: Duration,
        updates: Sender<PodUpdate>,
        use_inotify: bool,
    ) -> io::Result<FileSource> {
        let period = if period.is_zero() {
            DEFAULT_FILE_CHECK_FREQUENCY
        } else {
            period
        };
        let (stop_tx, stop_rx) = bounded(0);
        // Capacity 1: the watcher's wake-ups coalesce; if one is already
        // pending, the list it triggers will see the newer change too, so a
        // wake-up that finds the channel full is dropped (`try_send`).
        let (wake_tx, wake_rx) = bounded(1);
        log::info!("config: watching static pod path {}", path.display());
        let lister = Lister {
            path,
            node_name,
            period,
            updates,
            stop: stop_rx,
            use_inotify,
            wake_tx,
            wake_rx,
            watcher: None,
            watch_error_logged: false,
            watch_retry: WATCH_RETRY_MIN,
            path_state_logged: None,
            cache: HashMap::new(),
            reported: BTreeMap::new(),
            last_sent: None,
            give_back_due: false,
        };
        let handle = spawn_with_stack("config-file", LISTER_STACK, move || lister.run())?;
        Ok(FileSource {
            stop: Some(stop_tx),
            lister: Some(handle),
        })
    }
}

impl Drop for FileSource {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(lister) = self.lister.take() {
            if lister.join().is_err() {
                log::error!("config: the file source thread panicked");
            }
        }
    }
}

/// What the watcher watches: a directory, and maybe just one name in it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct WatchTarget {
    dir: PathBuf,
    only: Option<OsString>,
}

impl WatchTarget {
    /// The directory itself when `path` is one; otherwise the parent
    /// directory, filtered to `path`'s name (a single manifest file, or a
    /// manifest directory that does not exist yet). None when there is no
    /// directory to watch.
    fn for_path(path: &Path) -> Option<WatchTarget> {
        if fs::metadata(path).map(|m| m.is_dir()).unwrap_or(false) {
            return Some(WatchTarget {
                dir: path.to_path_buf(),
                only: None,
            });
        }
        let name = path.file_name()?;
        let parent = match path.parent() {
            Some(p) if !p.as_os_str().is_empty() => p,
            _ => Path::new("."),
        };
        fs::metadata(parent)
            .ok()
            .filter(|m| m.is_dir())
            .map(|_| WatchTarget {
                dir: parent.to_path_buf(),
                only: Some(name.to_os_string()),
            })
    }
}

/// One inotify instance with one watch and the thread reading it.
struct Watcher {
    target: WatchTarget,
    watches: Watches,
    wd: WatchDescriptor,
    /// Cleared by the reader before it ends.
    alive: Arc<AtomicBool>,
    reader: Option<JoinOnDrop<()>>,
}

impl Watcher {
    fn start(target: WatchTarget, wake: Sender<()>) -> io::Result<Watcher> {
        let inotify = Inotify::init()?;
        let mut watches = inotify.watches();
        let wd = watches.add(&target.dir, watch_mask())?;
        let alive = Arc::new(AtomicBool::new(true));
        let reader_alive = Arc::clone(&alive);
        let only = target.only.clone();
        let dir = target.dir.clone();
        let reader = spawn_named("config-file-watch", move || {
            read_events(inotify, dir, only, wake, reader_alive)
        })?;
        Ok(Watcher {
            target,
            watches,
            wd,
            alive,
            reader: Some(reader),
        })
    }

    fn is_alive(&self) -> bool {
        self.alive.load(Ordering::SeqCst)
    }

    /// Removes the watch, which wakes the reader with IN_IGNORED, and
    /// waits for it. If the watch is already gone, so is the reader.
    fn stop(mut self) {
        let _ = self.watches.remove(self.wd.clone());
        if let Some(reader) = self.reader.take() {
            if reader.join().is_err() {
                log::error!("config: the inotify reader thread panicked");
            }
        }
    }
}

/// The body of `config-file-watch`: blocks on the inotify descriptor and
/// wakes the lister for every batch of relevant events.
fn read_events(
    mut inotify: Inotify,
    dir: PathBuf,
    only: Option<OsString>,
    wake: Sender<()>,
    alive: Arc<AtomicBool>,
) {
    let mut buffer = [0u8; 4096];
    loop {
        let events = match inotify.read_events_blocking(&mut buffer) {
            Ok(events) => events,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => {
                log::warn!(
                    "config: reading inotify events for {} failed: {e}; relying on the periodic list",
                    dir.display()
                );
                break;
            }
        };
        let mut relevant = false;
        let mut watch_gone = false;
        for event in events {
            if event.mask.intersects(
                EventMask::IGNORED
                    | EventMask::DELETE_SELF
                    | EventMask::MOVE_SELF
                    | EventMask::UNMOUNT,
            ) {
                watch_gone = true;
            } else if event.mask.contains(EventMask::Q_OVERFLOW) {
                relevant = true;
            } else if event.mask.contains(EventMask::CREATE)
                && !event.mask.contains(EventMask::ISDIR)
            {
                // A new file is empty when it is created; its CLOSE_WRITE
                // follows once written. (A hard link made into the directory
                // has no CLOSE_WRITE: the periodic list picks it up.)
            } else {
                relevant |= match (&only, event.name) {
                    (Some(only), Some(name)) => name == only.as_os_str(),
                    (Some(_), None) => false,
                    (None, Some(name)) => !name.to_string_lossy().starts_with('.'),
                    // A change to the directory itself, e.g. its permissions.
                    (None, None) => true,
                };
            }
        }
        if watch_gone {
            log::debug!("config: watch on {} ended", dir.display());
            break;
        }
        if relevant {
            if let Err(TrySendError::Disconnected(())) = wake.try_send(()) {
                break;
            }
        }
    }
    // Clear `alive` before the last wake-up, so that the lister's list
    // after it sees the watch gone and sets up a new one.
    alive.store(false, Ordering::SeqCst);
    let _ = wake.try_send(());
}

/// How a burst of watch events ended.
enum Settled {
    /// No event after the one that woke the lister.
    Quiet,
    /// More events came: list again.
    More,
    /// The source is stopping.
    Stop,
}

/// The body of `config-file`: lists the path and sends the SETs.
struct Lister {
    path: PathBuf,
    node_name: String,
    period: Duration,
    updates: Sender<PodUpdate>,
    stop: Receiver<()>,
    use_inotify: bool,
    /// Kept so that `wake_rx` never disconnects.
    wake_tx: Sender<()>,
    wake_rx: Receiver<()>,
    watcher: Option<Watcher>,
    watch_error_logged: bool,
    /// The next back-off delay while there is no watch.
    watch_retry: Duration,
    /// The last state of the path itself that was logged (missing, unreadable).
    path_state_logged: Option<String>,
    /// The last error logged for each manifest, so that the same error is
    /// logged once rather than on every list.
    reported: BTreeMap<PathBuf, String>,
    /// The pods of the last SET sent; None before the first.
    last_sent: Option<Vec<Arc<Pod>>>,
    /// Each manifest's last outcome, valid while its file is unchanged.
    cache: HashMap<PathBuf, (FileStamp, Result<Box<Pod>, String>)>,
    /// Set when this list read a big or a bad manifest: decoding it may have
    /// used far more memory than it kept (an alias bomb, a 10 MiB file),
    /// which goes back to the system once the list ends.
    give_back_due: bool,
}

/// What identifies one version of a file without reading it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct FileStamp {
    dev: u64,
    ino: u64,
    size: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

impl FileStamp {
    fn of(md: &fs::Metadata) -> FileStamp {
        FileStamp {
            dev: md.dev(),
            ino: md.ino(),
            size: md.size(),
            mtime: (md.mtime(), md.mtime_nsec()),
            ctime: (md.ctime(), md.ctime_nsec()),
        }
    }
}

impl Lister {
    fn run(mut self) {
        let ticker = tick(self.period);
        if self.relist() {
            loop {
                let retry = self.watch_retry_timer();
                let keep_going = select! {
                    recv(self.stop) -> _ => false,
                    recv(ticker) -> _ => self.relist(),
                    recv(retry) -> _ => self.relist(),
                    // List at once (pod start latency), then once more if
                    // the burst (an editor's save) went on.
                    recv(self.wake_rx) -> _ => self.relist() && match self.settle() {
                        Settled::Quiet => true,
                        Settled::More => self.relist(),
                        Settled::Stop => false,
                    },
                };
                if !keep_going {
                    break;
                }
            }
        }
        if let Some(watcher) = self.watcher.take() {
            watcher.stop();
        }
        log::debug!("config: file source for {} stopped", self.path.display());
    }

    /// While inotify is wanted but nothing is watched, a timer for the next
    /// attempt (doubling each time); otherwise one that never fires.
    fn watch_retry_timer(&mut self) -> Receiver<Instant> {
        if !self.use_inotify || self.watcher.as_ref().is_some_and(Watcher::is_alive) {
            self.watch_retry = WATCH_RETRY_MIN;
            return never();
        }
        let delay = self.watch_retry;
        self.watch_retry = (delay * 2).min(WATCH_RETRY_MAX);
        log::debug!(
            "config: nothing to watch for {}; trying again in {delay:?}",
            self.path.display()
        );
        after(delay)
    }

    /// Lets a burst of events (an editor's save) pass: returns once no event
    /// came for [`SETTLE_QUIET`], or [`SETTLE_MAX`] after the first, saying
    /// whether any came at all.
    fn settle(&self) -> Settled {
        let start = Instant::now();
        let mut more = false;
        loop {
            let left = SETTLE_MAX.saturating_sub(start.elapsed());
            if left.is_zero() {
                return if more { Settled::More } else { Settled::Quiet };
            }
            select! {
                recv(self.wake_rx) -> _ => more = true,
                recv(self.stop) -> _ => return Settled::Stop,
                default(SETTLE_QUIET.min(left)) => {
                    return if more { Settled::More } else { Settled::Quiet };
                }
            }
        }
    }

    /// Makes sure the right directory is watched, lists, and sends a SET if
    /// the pods differ from the last SET. False when the source must stop.
    fn relist(&mut self) -> bool {
        self.ensure_watch();
        let Some(pods) = self.list() else {
            return true;
        };
        // Shared from here on: the SET and `last_sent` hold the same pods.
        let pods: Vec<Arc<Pod>> = pods.into_iter().map(Arc::new).collect();
        if self.last_sent.as_ref() == Some(&pods) {
            return true;
        }
        log::debug!(
            "config: {} static pod(s) in {}",
            pods.len(),
            self.path.display()
        );
        let update = PodUpdate::new(PodOperation::Set, FILE_SOURCE, pods.clone());
        // Blocks while the source channel is full (see
        // `SOURCE_CHANNEL_CAPACITY`), but never past a stop.
        let sent = select! {
            send(self.updates, update) -> res => res.is_ok(),
            recv(self.stop) -> _ => return false,
        };
        if !sent {
            log::debug!("config: pod config is gone, file source stops");
            return false;
        }
        self.last_sent = Some(pods);
        true
    }

    fn ensure_watch(&mut self) {
        if !self.use_inotify {
            return;
        }
        let wanted = WatchTarget::for_path(&self.path);
        if let Some(w) = &self.watcher {
            if w.is_alive() && Some(&w.target) == wanted.as_ref() {
                return;
            }
        }
        if let Some(w) = self.watcher.take() {
            w.stop();
        }
        let Some(target) = wanted else {
            return;
        };
        match Watcher::start(target.clone(), self.wake_tx.clone()) {
            Ok(w) => {
                log::debug!("config: inotify watch on {}", target.dir.display());
                self.watcher = Some(w);
                self.watch_error_logged = false;
            }
            Err(e) => {
                if !self.watch_error_logged {
                    log::warn!(
                        "config: cannot watch {} with inotify: {e}; listing it every {:?} instead",
                        target.dir.display(),
                        self.period
                    );
                    self.watch_error_logged = true;
                }
            }
        }
    }

    /// Logs a change in the state of the configured path itself.
    fn path_state(&mut self, state: Option<String>, error: bool) {
        if self.path_state_logged == state {
            return;
        }
        match &state {
            Some(msg) if error => log::error!("config: {msg}"),
            Some(msg) => log::warn!("config: {msg}"),
            None => log::info!(
                "config: static pod path {} is readable",
                self.path.display()
            ),
        }
        self.path_state_logged = state;
    }

    /// All valid pods under the path, in file name order. None when the
    /// path can't be read at all (the last SET then stays in force).
    fn list(&mut self) -> Option<Vec<Pod>> {
        let path = self.path.clone();
        let md = match fs::metadata(&path) {
            Ok(md) => md,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                self.path_state(
                    Some(format!(
                        "static pod path {} does not exist; waiting for it",
                        path.display()
                    )),
                    false,
                );
                self.reported.clear();
                self.cache.clear();
                return Some(Vec::new());
            }
            Err(e) => {
                self.path_state(
                    Some(format!(
                        "cannot read static pod path {}: {e}",
                        path.display()
                    )),
                    true,
                );
                return None;
            }
        };
        let mut errors = BTreeMap::new();
        let pods = if md.is_dir() {
            let entries = match fs::read_dir(&path) {
                Ok(entries) => entries,
                Err(e) => {
                    self.path_state(
                        Some(format!(
                            "cannot list static pod directory {}: {e}",
                            path.display()
                        )),
                        true,
                    );
                    return None;
                }
            };
            let mut files: Vec<PathBuf> = entries
                .filter_map(|entry| match entry {
                    Ok(entry) => Some(entry),
                    Err(e) => {
                        log::warn!("config: error while listing {}: {e}", path.display());
                        None
                    }
                })
                .filter(|entry| !entry.file_name().to_string_lossy().starts_with('.'))
                .map(|entry| entry.path())
                .collect();
            files.sort();
            let mut pods = Vec::with_capacity(files.len());
            let seen: std::collections::HashSet<PathBuf> = files.iter().cloned().collect();
            for file in files {
                match fs::metadata(&file) {
                    Ok(m) if m.is_file() => {}
                    Ok(m) if m.is_dir() => {
                        log::debug!("config: not descending into directory {}", file.display());
                        continue;
                    }
                    Ok(_) => {
                        errors.insert(file, "not a regular file".to_string());
                        continue;
                    }
                    // Removed since the directory was read: its event follows.
                    // (A dangling symlink is still there: its error shows.)
                    Err(e)
                        if e.kind() == io::ErrorKind::NotFound
                            && fs::symlink_metadata(&file).is_err() =>
                    {
                        log::debug!("config: {} went while listing", file.display());
                        continue;
                    }
                    Err(e) => {
                        errors.insert(file, format!("cannot stat: {e}"));
                        continue;
                    }
                }
                match self.read_cached(&file) {
                    Ok(pod) => pods.push(pod),
                    Err(_) if fs::symlink_metadata(&file).is_err() => {
                        log::debug!("config: {} went while reading it", file.display());
                    }
                    Err(reason) => {
                        errors.insert(file, reason);
                    }
                }
            }
            let before = self.cache.len();
            self.cache.retain(|f, _| seen.contains(f));
            // Files went: what their reading took can go back too.
            self.give_back_due |= self.cache.len() < before;
            crate::malloc::shrink_map(&mut self.cache);
            pods
        } else if md.is_file() {
            self.cache.retain(|f, _| *f == path);
            match self.read_cached(&path) {
                Ok(pod) => vec![pod],
                Err(reason) => {
                    errors.insert(path.clone(), reason);
                    Vec::new()
                }
            }
        } else {
            self.path_state(
                Some(format!(
                    "static pod path {} is neither a directory nor a regular file",
                    path.display()
                )),
                true,
            );
            return Some(Vec::new());
        };
        self.path_state(None, false);
        for (file, reason) in &errors {
            if self.reported.get(file) != Some(reason) {
                log::error!(
                    "config: skipping static pod manifest {}: {reason}",
                    file.display()
                );
            } else {
                log::debug!(
                    "config: still skipping static pod manifest {}: {reason}",
                    file.display()
                );
            }
        }
        self.reported = errors;
        if std::mem::take(&mut self.give_back_due) {
            crate::malloc::give_back();
        }
        Some(pods)
    }
}

impl Lister {
    /// [`read_manifest`], or its earlier outcome while the file's stamp is
    /// unchanged.
    fn read_cached(&mut self, file: &Path) -> Result<Pod, String> {
        let stamp = fs::metadata(file).ok().map(|md| FileStamp::of(&md));
        if let (Some(stamp), Some((cached, outcome))) = (stamp, self.cache.get(file)) {
            if stamp == *cached {
                return outcome.clone().map(|p| *p);
            }
        }
        let outcome = read_manifest(file, &self.node_name);
        self.give_back_due |= outcome.is_err() || stamp.is_some_and(|s| s.size > GIVE_BACK_SIZE);
        if let Some(stamp) = stamp {
            // Boxed: the table's slots stay small however big a Pod is.
            let kept = outcome.clone().map(Box::new);
            self.cache.insert(file.to_path_buf(), (stamp, kept));
        }
        outcome
    }
}

/// Reads, decodes, defaults and validates one manifest file.
fn read_manifest(file: &Path, node_name: &str) -> Result<Pod, String> {
    let too_large =
        |size: u64| format!("file is {size} bytes, over the limit of {MAX_MANIFEST_SIZE} bytes");
    let mut f = fs::File::open(file).map_err(|e| format!("cannot open: {e}"))?;
    let size = f.metadata().map_err(|e| format!("cannot stat: {e}"))?.len();
    if size > MAX_MANIFEST_SIZE {
        return Err(too_large(size));
    }
    let mut bytes = Vec::with_capacity(size as usize);
    (&mut f)
        .take(MAX_MANIFEST_SIZE + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("cannot read: {e}"))?;
    if bytes.len() as u64 > MAX_MANIFEST_SIZE {
        return Err(too_large(bytes.len() as u64));
    }
    let pod = parse_manifest(&bytes, &file.to_string_lossy(), node_name)?;
    crate::fault::point("manifest-read", file.display());
    Ok(pod)
}

/// Decodes, defaults and validates the bytes of the manifest file `file` as
/// the file source does (one pod, YAML or JSON). The error says what is
/// wrong, without the file name (the caller logs it with the file).
pub fn parse_manifest(bytes: &[u8], file: &str, node_name: &str) -> Result<Pod, String> {
    let mut pod = decode_pod(bytes).map_err(|e| format!("cannot decode: {e}"))?;
    apply_static_defaults(&mut pod, file, node_name, FILE_SOURCE).map_err(|e| e.to_string())?;
    Ok(pod)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    const WAIT: Duration = Duration::from_secs(10);
    /// Long enough that only inotify can explain a prompt SET.
    const NO_TICK: Duration = Duration::from_secs(3600);

    fn manifest(name: &str, image: &str) -> String {
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\nspec:\n  containers:\n  - name: c\n    image: {image}\n"
        )
    }

    /// Writes a file the way tools should: a dotfile renamed into place.
    fn put(dir: &Path, name: &str, content: &str) {
        let tmp = dir.join(format!(".{name}.tmp"));
        fs::write(&tmp, content).unwrap();
        fs::rename(&tmp, dir.join(name)).unwrap();
    }

    fn names(u: &PodUpdate) -> Vec<String> {
        u.pods
            .iter()
            .map(|p| p.metadata.name.clone().unwrap_or_default())
            .collect()
    }

    fn next_set(rx: &Receiver<PodUpdate>) -> PodUpdate {
        let u = rx.recv_timeout(WAIT).expect("no SET from the file source");
        assert_eq!((u.op, u.source.as_str()), (PodOperation::Set, FILE_SOURCE));
        u
    }

    /// Reads SETs until one holds exactly `want` (by name, in order).
    fn wait_for(rx: &Receiver<PodUpdate>, want: &[&str]) -> PodUpdate {
        let deadline = Instant::now() + WAIT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let u = rx
                .recv_timeout(left)
                .unwrap_or_else(|_| panic!("no SET with pods {want:?}"));
            assert_eq!(u.op, PodOperation::Set);
            if names(&u) == want {
                return u;
            }
        }
    }

    fn start(path: &Path, period: Duration) -> (FileSource, Receiver<PodUpdate>) {
        let (tx, rx) = bounded(16);
        let source =
            FileSource::start(path.to_path_buf(), "node1".to_string(), period, tx).unwrap();
        (source, rx)
    }

    #[test]
    fn first_list_sends_a_set_even_when_empty() {
        let dir = tempfile::tempdir().unwrap();
        let (_source, rx) = start(dir.path(), NO_TICK);
        assert!(next_set(&rx).pods.is_empty());
    }

    #[test]
    fn reports_create_edit_rename_and_delete() {
        let dir = tempfile::tempdir().unwrap();
        put(dir.path(), "web.yaml", &manifest("web", "nginx:1"));
        let (_source, rx) = start(dir.path(), NO_TICK);
        let first = next_set(&rx);
        assert_eq!(names(&first), ["web-node1"]);
        let uid1 = first.pods[0].metadata.uid.clone().unwrap();

        // Create by writing in place.
        fs::write(dir.path().join("db.json"), manifest("db", "pg:16")).unwrap();
        wait_for(&rx, &["db-node1", "web-node1"]);

        // Edit: a new UID for the changed content.
        put(dir.path(), "web.yaml", &manifest("web", "nginx:2"));
        let edited = wait_for(&rx, &["db-node1", "web-node1"]);
        let uid2 = edited.pods[1].metadata.uid.clone().unwrap();
        assert_ne!(uid1, uid2);

        // Rename in from outside the directory.
        let outside = tempfile::tempdir().unwrap();
        let staged = outside.path().join("cache.yaml");
        fs::write(&staged, manifest("cache", "redis:7")).unwrap();
        fs::rename(&staged, dir.path().join("cache.yaml")).unwrap();
        wait_for(&rx, &["cache-node1", "db-node1", "web-node1"]);

        // Rename out and delete.
        fs::rename(
            dir.path().join("cache.yaml"),
            outside.path().join("gone.yaml"),
        )
        .unwrap();
        wait_for(&rx, &["db-node1", "web-node1"]);
        fs::remove_file(dir.path().join("db.json")).unwrap();
        wait_for(&rx, &["web-node1"]);
    }

    #[test]
    fn an_editor_save_gives_one_set() {
        let dir = tempfile::tempdir().unwrap();
        let (_source, rx) = start(dir.path(), NO_TICK);
        assert!(next_set(&rx).pods.is_empty());
        // Several writes in a burst, as an editor does.
        let file = dir.path().join("web.yaml");
        let mut f = fs::File::create(&file).unwrap();
        f.write_all(manifest("web", "nginx:1").as_bytes()).unwrap();
        drop(f);
        fs::write(&file, manifest("web", "nginx:1")).unwrap();
        let u = wait_for(&rx, &["web-node1"]);
        assert_eq!(u.pods.len(), 1);
        // Nothing changed since: no further SET.
        assert!(rx.recv_timeout(Duration::from_millis(300)).is_err());
    }

    #[test]
    fn dotfiles_are_ignored() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join(".hidden.yaml"), manifest("hidden", "x")).unwrap();
        let (_source, rx) = start(dir.path(), NO_TICK);
        assert!(next_set(&rx).pods.is_empty());
        fs::write(dir.path().join(".swap.yaml"), manifest("swap", "x")).unwrap();
        assert!(rx.recv_timeout(Duration::from_millis(300)).is_err());
    }

    #[test]
    fn oversize_and_malformed_files_are_skipped_next_to_good_ones() {
        let dir = tempfile::tempdir().unwrap();
        put(dir.path(), "a-good.yaml", &manifest("good", "busybox"));
        put(dir.path(), "b-bad.yaml", "metadata: {name: bad\nspec: [");
        put(
            dir.path(),
            "c-wrongtype.yaml",
            "metadata: {name: typed}\nspec:\n  containers:\n  - name: c\n    image: i\n    command: [sleep, 3600]\n",
        );
        put(dir.path(), "d-invalid.yaml", &manifest("Invalid_Name", "x"));
        let mut big = manifest("big", "x");
        big.push_str("# ");
        big.push_str(&"x".repeat(MAX_MANIFEST_SIZE as usize));
        put(dir.path(), "e-big.yaml", &big);
        fs::create_dir(dir.path().join("f-subdir")).unwrap();
        put(dir.path(), "g-other.json", &manifest("other", "busybox"));

        let (_source, rx) = start(dir.path(), NO_TICK);
        assert_eq!(names(&next_set(&rx)), ["good-node1", "other-node1"]);

        // Fixing a bad file brings its pod in.
        put(dir.path(), "b-bad.yaml", &manifest("bad", "busybox"));
        // Pods come in file name order.
        wait_for(&rx, &["good-node1", "bad-node1", "other-node1"]);
    }

    #[test]
    fn read_manifest_errors_name_file_problem() {
        let dir = tempfile::tempdir().unwrap();
        let cases = [
            ("bad.yaml", "metadata: {name: x\n".to_string(), "cannot decode: invalid YAML"),
            (
                "typed.yaml",
                "metadata: {name: t}\nspec: {containers: [{name: c, image: i, command: [sleep, 3600]}]}\n".to_string(),
                "spec.containers[0].command[1]",
            ),
            ("noimage.yaml", manifest("noimage", "''"), "spec.containers[0].image: Required value"),
            ("noname.yaml", "spec: {containers: [{name: c, image: i}]}\n".to_string(), "metadata.name"),
            ("kind.yaml", "kind: Service\nmetadata: {name: s}\n".to_string(), "kind: expected \"Pod\""),
            (
                "big.yaml",
                "#".repeat(MAX_MANIFEST_SIZE as usize + 1),
                "over the limit",
            ),
        ];
        for (name, content, want) in cases {
            let file = dir.path().join(name);
            fs::write(&file, content).unwrap();
            let err = read_manifest(&file, "node1").unwrap_err();
            assert!(err.contains(want), "{name}: {err}");
        }
        let err = read_manifest(&dir.path().join("absent.yaml"), "node1").unwrap_err();
        assert!(err.starts_with("cannot open"), "{err}");
    }

    #[test]
    fn deeply_nested_manifest_is_refused_without_crashing() {
        let dir = tempfile::tempdir().unwrap();
        let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
        put(
            dir.path(),
            "deep.json",
            &format!("{{\"metadata\":{{\"name\":{deep}}}}}"),
        );
        put(
            dir.path(),
            "deep.yaml",
            &format!("metadata: {{name: {deep}}}\n"),
        );
        put(dir.path(), "ok.yaml", &manifest("ok", "busybox"));
        let (_source, rx) = start(dir.path(), NO_TICK);
        assert_eq!(names(&next_set(&rx)), ["ok-node1"]);
    }

    #[test]
    fn missing_parent_is_retried_with_backoff() {
        let parent = tempfile::tempdir().unwrap();
        let dir = parent.path().join("etc/kubernetes/manifests");
        let (_source, rx) = start(&dir, NO_TICK);
        assert!(next_set(&rx).pods.is_empty());
        // Nothing to watch, and no periodic list for an hour: only the
        // watch retry can find it.
        fs::create_dir_all(&dir).unwrap();
        put(&dir, "web.yaml", &manifest("web", "nginx"));
        wait_for(&rx, &["web-node1"]);
        // From then on, inotify.
        let started = Instant::now();
        put(&dir, "db.yaml", &manifest("db", "pg"));
        wait_for(&rx, &["db-node1", "web-node1"]);
        assert!(started.elapsed() < Duration::from_millis(900));
    }

    #[test]
    fn in_place_edit_of_the_same_size_is_seen() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("web.yaml");
        fs::write(&file, manifest("web", "nginx:1")).unwrap();
        let (_source, rx) = start(dir.path(), NO_TICK);
        let first = next_set(&rx);
        fs::write(&file, manifest("web", "nginx:2")).unwrap();
        let edited = wait_for(&rx, &["web-node1"]);
        assert_ne!(first.pods[0].metadata.uid, edited.pods[0].metadata.uid);
        let image = &edited.pods[0].spec.as_ref().unwrap().containers[0].image;
        assert_eq!(image.as_deref(), Some("nginx:2"));
    }

    #[test]
    fn missing_directory_then_created() {
        let parent = tempfile::tempdir().unwrap();
        let dir = parent.path().join("manifests");
        let (_source, rx) = start(&dir, NO_TICK);
        // Missing is not fatal: an empty SET marks the source as seen.
        assert!(next_set(&rx).pods.is_empty());

        // Created (by rename, complete with a manifest): picked up through
        // the watch on the parent, then watched itself.
        let staging = parent.path().join(".staging");
        fs::create_dir(&staging).unwrap();
        fs::write(staging.join("web.yaml"), manifest("web", "nginx")).unwrap();
        fs::rename(&staging, &dir).unwrap();
        wait_for(&rx, &["web-node1"]);
        put(&dir, "db.yaml", &manifest("db", "pg"));
        wait_for(&rx, &["db-node1", "web-node1"]);

        // Removed: its pods go; created again: watched again.
        fs::remove_dir_all(&dir).unwrap();
        wait_for(&rx, &[]);
        fs::create_dir(&dir).unwrap();
        put(&dir, "web.yaml", &manifest("web", "nginx"));
        wait_for(&rx, &["web-node1"]);
    }

    #[test]
    fn periodic_list_without_inotify() {
        let parent = tempfile::tempdir().unwrap();
        let dir = parent.path().join("manifests");
        let (tx, rx) = bounded(16);
        let _source = FileSource::start_with(
            dir.clone(),
            "node1".to_string(),
            Duration::from_millis(50),
            tx,
            false,
        )
        .unwrap();
        assert!(next_set(&rx).pods.is_empty());
        fs::create_dir(&dir).unwrap();
        put(&dir, "web.yaml", &manifest("web", "nginx"));
        wait_for(&rx, &["web-node1"]);
        fs::remove_file(dir.join("web.yaml")).unwrap();
        wait_for(&rx, &[]);
    }

    #[test]
    fn single_file_path() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("web.yaml");
        put(dir.path(), "web.yaml", &manifest("web", "nginx:1"));
        put(dir.path(), "other.yaml", &manifest("other", "x"));
        let (_source, rx) = start(&file, NO_TICK);
        let first = next_set(&rx);
        assert_eq!(names(&first), ["web-node1"]);

        // A neighbour changing is not this source's business.
        put(dir.path(), "other.yaml", &manifest("other", "y"));
        assert!(rx.recv_timeout(Duration::from_millis(300)).is_err());

        put(dir.path(), "web.yaml", &manifest("web", "nginx:2"));
        let edited = wait_for(&rx, &["web-node1"]);
        assert_ne!(first.pods[0].metadata.uid, edited.pods[0].metadata.uid);
        fs::remove_file(&file).unwrap();
        wait_for(&rx, &[]);
    }

    #[test]
    fn same_content_gives_same_uid_across_restarts() {
        let dir = tempfile::tempdir().unwrap();
        put(dir.path(), "web.yaml", &manifest("web", "nginx"));
        let uid = |rx: &Receiver<PodUpdate>| next_set(rx).pods[0].metadata.uid.clone();
        let (first, rx) = start(dir.path(), NO_TICK);
        let a = uid(&rx);
        drop(first);
        let (_second, rx) = start(dir.path(), NO_TICK);
        assert_eq!(a, uid(&rx));
    }

    #[test]
    fn drop_stops_even_when_nobody_reads() {
        let dir = tempfile::tempdir().unwrap();
        let (tx, rx) = bounded(1);
        let source = FileSource::start(
            dir.path().to_path_buf(),
            "n".into(),
            Duration::from_millis(5),
            tx,
        )
        .unwrap();
        // Keep changing the directory so that SETs queue up behind a full channel.
        for i in 0..5 {
            put(
                dir.path(),
                &format!("p{i}.yaml"),
                &manifest(&format!("p{i}"), "x"),
            );
        }
        std::thread::sleep(Duration::from_millis(100));
        drop(source); // must return
        drop(rx);
    }

    #[test]
    fn stops_when_the_receiver_is_gone() {
        let dir = tempfile::tempdir().unwrap();
        let (tx, rx) = bounded(1);
        drop(rx);
        let source = FileSource::start(dir.path().to_path_buf(), "n".into(), NO_TICK, tx).unwrap();
        let deadline = Instant::now() + WAIT;
        while !source.lister.as_ref().unwrap().is_finished() {
            assert!(Instant::now() < deadline, "lister did not stop");
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}
