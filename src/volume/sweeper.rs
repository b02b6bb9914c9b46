//! The `pod-dir-sweeper` thread: removes the directories under
//! `<root-dir>/pods` that no pod claims any more
//! ([`super::remove_orphaned_pod_dirs`]: read_dir, unmount, remove), so
//! that the sync loop, which only hands it the UIDs to keep at each
//! housekeeping, never walks the filesystem.
//!
//! Requests are latest-wins: the channel holds one, and a request made
//! while another still waits replaces it (the newer keep set is the truer
//! one); a sweep under way finishes first. A directory that cannot be
//! removed is warned about once, until a sweep removes it or no longer
//! finds it.
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
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crossbeam_channel::{bounded, Receiver, Sender, TrySendError};
use log::{debug, warn};

use crate::thread::{spawn_named, JoinOnDrop};

/// One sweep to make: the pod UIDs whose directories stay, and the claim
/// count when they were gathered.
struct Request {
    keep: HashSet<String>,
    claims: u64,
}

/// Handle of the `pod-dir-sweeper` thread, held by the sync loop; dropping
/// it lets a sweep under way finish and joins the thread.
pub struct OrphanSweeper {
    requests: Sender<Request>,
    /// The thread's end too, to take back a request still waiting when a
    /// newer one comes.
    waiting: Receiver<Request>,
    claims: Arc<AtomicU64>,
    _thread: JoinOnDrop<()>,
}

/// Starts the `pod-dir-sweeper` thread for `<root_dir>/pods`.
pub fn start(root_dir: PathBuf) -> std::io::Result<OrphanSweeper> {
    // Capacity 1, latest wins: `request` replaces a waiting request.
    let (requests, rx) = bounded(1);
    let claims = Arc::new(AtomicU64::new(0));
    let thread = {
        let rx = rx.clone();
        let claims = claims.clone();
        spawn_named("pod-dir-sweeper", move || run(root_dir, rx, claims))?
    };
    Ok(OrphanSweeper {
        requests,
        waiting: rx,
        claims,
        _thread: thread,
    })
}

impl OrphanSweeper {
    /// Asks for a sweep that keeps the directories of `keep`; never blocks.
    pub(crate) fn request(&self, keep: HashSet<String>) {
        let mut request = Request {
            keep,
            claims: self.claims.load(Ordering::SeqCst),
        };
        loop {
            match self.requests.try_send(request) {
                Ok(()) => return,
                Err(TrySendError::Full(r)) => {
                    // The sweeper is busy and an older request waits: this
                    // one replaces it.
                    let _ = self.waiting.try_recv();
                    request = r;
                }
                Err(TrySendError::Disconnected(_)) => {
                    debug!("housekeeping: the pod directory sweeper is gone");
                    return;
                }
            }
        }
    }

    /// Tells the sweeper that a pod the last request did not know of may
    /// now have a directory: a sweep asked for before stops removing.
    pub(crate) fn claim(&self) {
        self.claims.fetch_add(1, Ordering::SeqCst);
    }
}

fn run(root_dir: PathBuf, requests: Receiver<Request>, claims: Arc<AtomicU64>) {
    // Directories that could not be removed, warned about once.
    let mut stuck: HashSet<String> = HashSet::new();
    for request in requests.iter() {
        let cut_short = Cell::new(false);
        let failed = super::remove_orphaned_pod_dirs(&root_dir, |uid| {
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
        for (dir, e) in failed {
            if !stuck.contains(&dir) {
                warn!("housekeeping: cannot remove orphaned pod directory {dir}: {e}");
            }
        }
        if cut_short.get() {
            // Not every directory was tried: the ones not tried stay stuck.
            stuck.extend(failed_dirs);
        } else {
            stuck = failed_dirs;
        }
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
    fn a_request_removes_the_unclaimed_directories_on_the_sweeper_thread() {
        let root = tempfile::tempdir().unwrap();
        let pods = root.path().join("pods");
        for uid in ["kept", "gone"] {
            std::fs::create_dir_all(pods.join(uid).join("volumes")).unwrap();
        }
        let sweeper = start(root.path().to_path_buf()).unwrap();
        sweeper.request(HashSet::from(["kept".to_string()]));
        wait_for("the orphan's removal", || !pods.join("gone").exists());
        assert!(pods.join("kept").join("volumes").is_dir());
        drop(sweeper);
    }

    #[test]
    fn a_pod_claimed_after_the_request_keeps_its_directory() {
        let root = tempfile::tempdir().unwrap();
        let pods = root.path().join("pods");
        std::fs::create_dir_all(pods.join("new")).unwrap();
        let sweeper = start(root.path().to_path_buf()).unwrap();
        // A request that keeps nothing, made before the loop learned of
        // pod "new" and handed it to a worker.
        let stale = Request {
            keep: HashSet::new(),
            claims: sweeper.claims.load(Ordering::SeqCst),
        };
        sweeper.claim();
        sweeper.requests.send(stale).unwrap();
        // Once the sweeper takes the next request, the first sweep is over.
        let next = Request {
            keep: HashSet::from(["new".to_string()]),
            claims: sweeper.claims.load(Ordering::SeqCst),
        };
        sweeper.requests.send(next).unwrap();
        wait_for("both requests taken", || sweeper.requests.is_empty());
        assert!(pods.join("new").is_dir(), "a claimed pod's directory stays");
    }

    #[test]
    fn a_newer_request_replaces_the_waiting_one() {
        let (requests, waiting) = bounded(1);
        let claims = Arc::new(AtomicU64::new(0));
        let sweeper = OrphanSweeper {
            requests,
            waiting: waiting.clone(),
            claims,
            _thread: spawn_named("test-idle", || ()).unwrap(),
        };
        sweeper.request(HashSet::from(["a".to_string()]));
        sweeper.request(HashSet::from(["b".to_string()]));
        let r = waiting.try_recv().expect("one request waits");
        assert_eq!(r.keep, HashSet::from(["b".to_string()]));
        assert!(waiting.try_recv().is_err(), "only the latest waits");
    }
}
