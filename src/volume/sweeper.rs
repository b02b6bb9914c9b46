//! The `pod-dir-sweeper`: removes the directories under `<root-dir>/pods`
//! that no pod claims any more ([`super::remove_orphaned_pod_dirs`]:
//! read_dir, unmount, remove), so that the sync loop, which only hands it
//! the UIDs to keep at each housekeeping, never walks the filesystem.
//!
//! A sweep runs on a `pod-dir-sweeper` thread that ends once no request
//! waits, so an idle node keeps no thread for it. Requests are
//! latest-wins: one made while a sweep is under way waits for that
//! thread, replacing any that waited before it (the newer keep set is the
//! truer one). A directory that cannot be removed is warned about once,
//! until a sweep removes it or no longer finds it.
//!
//! The keep set is a snapshot: the loop may learn of a pod after it asked
//! and before the sweep reaches that pod's directory, which the pod's
//! worker creates. So the loop counts every pod it hands to a new worker
//! ([`OrphanSweeper::claim`]), and once that count has moved past the one
//! its request saw, a sweep removes nothing more; the next request, which
//! keeps the new pod, sweeps again. What is left open is a pod that
//! reuses the very UID of the one directory being removed at that moment,
//! admitted during its removal: its worker's first sync then fails and is
//! retried.

use std::cell::Cell;
use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use log::{debug, warn};
use parking_lot::Mutex;

use crate::thread::{spawn_named, JoinOnDrop};

/// One sweep to make: the pod UIDs whose directories stay, and the claim
/// count when they were gathered.
struct Request {
    keep: HashSet<String>,
    claims: u64,
}

/// What the loop and the sweeping thread share.
#[derive(Default)]
struct Shared {
    /// Whether a sweeping thread runs, and the request that waits for it;
    /// the thread ends only once it found none waiting, under this lock.
    queue: Mutex<(bool, Option<Request>)>,
    claims: AtomicU64,
    /// Directories that could not be removed, warned about once (one
    /// sweep runs at a time).
    stuck: Mutex<HashSet<String>>,
}

/// Held by the sync loop; dropping it lets a sweep under way finish and
/// joins its thread.
pub(crate) struct OrphanSweeper {
    root_dir: PathBuf,
    shared: Arc<Shared>,
    /// The sweeping thread, running or ended.
    sweep: Option<JoinOnDrop<()>>,
}

impl OrphanSweeper {
    /// A sweeper for `<root_dir>/pods`; it starts a thread only to sweep.
    pub(crate) fn new(root_dir: PathBuf) -> OrphanSweeper {
        OrphanSweeper {
            root_dir,
            shared: Arc::default(),
            sweep: None,
        }
    }

    /// Asks for a sweep that keeps the directories of `keep`; never blocks.
    pub(crate) fn request(&mut self, keep: HashSet<String>) {
        let request = Request {
            keep,
            claims: self.shared.claims.load(Ordering::SeqCst),
        };
        {
            let mut queue = self.shared.queue.lock();
            if queue.0 {
                // The running thread takes it before it ends.
                queue.1 = Some(request);
                return;
            }
            queue.0 = true;
        }
        // The last thread has ended: joining it does not wait.
        self.sweep = None;
        let root_dir = self.root_dir.clone();
        let shared = self.shared.clone();
        match spawn_named("pod-dir-sweeper", move || run(&root_dir, &shared, request)) {
            Ok(t) => self.sweep = Some(t),
            Err(e) => {
                self.shared.queue.lock().0 = false;
                debug!("housekeeping: cannot start the pod directory sweep: {e}");
            }
        }
    }

    /// Tells the sweeper that a pod the last request did not know of may
    /// now have a directory: a sweep asked for before stops removing.
    pub(crate) fn claim(&self) {
        self.shared.claims.fetch_add(1, Ordering::SeqCst);
    }
}

/// The sweeping thread: `first`, then each request that came meanwhile.
fn run(root_dir: &Path, shared: &Shared, first: Request) {
    let mut request = first;
    loop {
        sweep(root_dir, &request, &shared.claims, &shared.stuck);
        let mut queue = shared.queue.lock();
        match queue.1.take() {
            Some(next) => request = next,
            None => {
                queue.0 = false;
                return;
            }
        }
    }
}

/// One sweep: removes what the request does not keep, until the claim
/// count moves past the one it saw.
fn sweep(root_dir: &Path, request: &Request, claims: &AtomicU64, stuck: &Mutex<HashSet<String>>) {
    let cut_short = Cell::new(false);
    let failed = super::remove_orphaned_pod_dirs(root_dir, |uid| {
        if request.keep.contains(uid) {
            return true;
        }
        if claims.load(Ordering::SeqCst) != request.claims {
            cut_short.set(true);
            return true;
        }
        false
    });
    let failed_dirs: HashSet<String> = failed.iter().map(|(d, _)| d.clone()).collect();
    let mut stuck = stuck.lock();
    for (dir, e) in failed {
        if !stuck.contains(&dir) {
            warn!("housekeeping: cannot remove orphaned pod directory {dir}: {e}");
        }
    }
    if cut_short.get() {
        // Not every directory was tried: the ones not tried stay stuck.
        stuck.extend(failed_dirs);
    } else {
        *stuck = failed_dirs;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    fn wait_for(what: &str, cond: impl Fn() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !cond() {
            assert!(Instant::now() < deadline, "timed out waiting for {what}");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    #[test]
    fn a_request_removes_the_unclaimed_directories_on_a_thread_that_then_ends() {
        let root = tempfile::tempdir().unwrap();
        let pods = root.path().join("pods");
        for uid in ["kept", "gone"] {
            std::fs::create_dir_all(pods.join(uid).join("volumes")).unwrap();
        }
        let mut sweeper = OrphanSweeper::new(root.path().to_path_buf());
        assert!(sweeper.sweep.is_none(), "no thread before a request");
        sweeper.request(HashSet::from(["kept".to_string()]));
        wait_for("the orphan's removal", || !pods.join("gone").exists());
        assert!(pods.join("kept").join("volumes").is_dir());
        wait_for("the thread's end", || {
            sweeper.sweep.as_ref().is_some_and(|t| t.is_finished())
        });
        assert!(!sweeper.shared.queue.lock().0);
    }

    #[test]
    fn a_pod_claimed_after_the_request_keeps_its_directory() {
        let root = tempfile::tempdir().unwrap();
        let pods = root.path().join("pods");
        std::fs::create_dir_all(pods.join("new")).unwrap();
        let shared = Shared::default();
        // A request that keeps nothing, made before the loop learned of
        // pod "new" and handed it to a worker.
        let stale = Request {
            keep: HashSet::new(),
            claims: shared.claims.load(Ordering::SeqCst),
        };
        shared.claims.fetch_add(1, Ordering::SeqCst);
        // The next one, which knows of it, waits behind it.
        std::fs::create_dir_all(pods.join("old")).unwrap();
        shared.queue.lock().1 = Some(Request {
            keep: HashSet::from(["new".to_string()]),
            claims: shared.claims.load(Ordering::SeqCst),
        });
        run(root.path(), &shared, stale);
        assert!(pods.join("new").is_dir(), "a claimed pod's directory stays");
        assert!(
            !pods.join("old").exists(),
            "the next sweep removed the rest"
        );
        assert!(shared.queue.lock().1.is_none());
    }

    #[test]
    fn a_newer_request_replaces_the_waiting_one_and_the_running_thread_takes_it() {
        let root = tempfile::tempdir().unwrap();
        let pods = root.path().join("pods");
        for uid in ["a", "b"] {
            std::fs::create_dir_all(pods.join(uid)).unwrap();
        }
        let mut sweeper = OrphanSweeper::new(root.path().to_path_buf());
        // As if a sweep were under way.
        sweeper.shared.queue.lock().0 = true;
        sweeper.request(HashSet::from(["a".to_string()]));
        sweeper.request(HashSet::from(["b".to_string()]));
        assert!(sweeper.sweep.is_none(), "no second thread");
        let waiting = sweeper.shared.queue.lock().1.take().expect("one waits");
        assert_eq!(waiting.keep, HashSet::from(["b".to_string()]));
        // The running thread, at the end of its sweep, takes what waits.
        sweeper.shared.queue.lock().1 = Some(waiting);
        run(
            root.path(),
            &sweeper.shared,
            Request {
                keep: HashSet::from(["a".to_string(), "b".to_string()]),
                claims: 0,
            },
        );
        assert!(!pods.join("a").exists() && pods.join("b").is_dir());
        assert!(!sweeper.shared.queue.lock().0, "the thread ended");
    }
}
