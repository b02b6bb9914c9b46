//! The API server pod source (upstream `config/apiserver.go`): a reflector
//! over the pods bound to this node (`fieldSelector=spec.nodeName=<node>`)
//! that sends the complete set as a SET to the `api` source after the first
//! list and after every change, so the merge computes what was added,
//! updated, gracefully deleted or removed. With
//! `--bootstrap-checkpoint-path`, every pod it sends that the sync loop
//! admitted (mirror pods never run) is checkpointed, written atomically
//! when it changed and removed when the pod is gone or refused, so a node
//! that restarts without the API server still runs its pods. A pod's first
//! checkpoint is written at the first update after its admission (its own
//! status patch at the latest): the sync loop only records the decision.

use std::borrow::Borrow;
use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::Arc;

use crossbeam_channel::Sender;
use log::{debug, info, warn};

use super::checkpoint::{
    encode_checkpoint, load_checkpoints, remove_checkpoint, write_encoded, Admissions,
    MAX_POD_CHECKPOINT, MAX_TOTAL_CHECKPOINTS,
};
use super::{Pod, PodOperation, PodUpdate};
use crate::kube::{Client, ListWatch, Reflector};
use crate::pod::{is_mirror_pod, pod_full_name, pod_uid, API_SOURCE};

/// Handle of the source; dropping it stops the reflector.
pub(crate) struct ApiSource {
    _reflector: Reflector,
}

impl ApiSource {
    pub(crate) fn start(
        client: Client,
        node: &str,
        updates: Sender<PodUpdate>,
        checkpoint_dir: Option<PathBuf>,
        admissions: Arc<Admissions>,
    ) -> std::io::Result<ApiSource> {
        let lw = ListWatch {
            path: "/api/v1/pods".into(),
            field_selector: Some(format!("spec.nodeName={node}")),
        };
        let mut checkpoints = checkpoint_dir.map(|d| Checkpointer::new(d, admissions));
        // The reflector's own copies go on as they are: a pod is copied
        // only where the merge changes it.
        let sink = Box::new(move |pods: Vec<Arc<Pod>>| {
            if let Some(c) = checkpoints.as_mut() {
                c.sync(&pods);
            }
            // Blocks while the merge is behind: an update can't be dropped.
            if updates
                .send(PodUpdate::new(PodOperation::Set, API_SOURCE, pods))
                .is_err()
            {
                debug!("api source: the pod config is gone");
            }
        });
        let reflector = Reflector::start::<Pod>("pods", client, lw, sink)?;
        Ok(ApiSource {
            _reflector: reflector,
        })
    }
}

/// Keeps one checkpoint per admitted API pod in a directory, within
/// [`MAX_POD_CHECKPOINT`] bytes each and [`MAX_TOTAL_CHECKPOINTS`] in all.
struct Checkpointer {
    dir: PathBuf,
    /// What the sync loop decided about each pod.
    admissions: Arc<Admissions>,
    /// UID to what is on disk; `None` until the directory was read once.
    written: Option<HashMap<String, Written>>,
    /// Pods whose checkpoint write or removal is failing: warned about
    /// once, then retried at each update quietly until it works (every
    /// status change of every pod is an update, so a full disk would
    /// otherwise repeat the same warning many times a minute).
    failing: HashSet<String>,
    /// Pods refused a checkpoint for its size, warned about once.
    too_big: HashSet<String>,
    /// The limits: bytes per pod and in all.
    max_pod: usize,
    max_total: usize,
}

/// A checkpoint on disk.
#[derive(Debug, Clone, Default)]
struct Written {
    /// The resourceVersion it holds; empty: to be written again.
    rv: String,
    /// Its size in bytes.
    size: usize,
}

impl Checkpointer {
    fn new(dir: PathBuf, admissions: Arc<Admissions>) -> Checkpointer {
        Checkpointer {
            dir,
            admissions,
            written: None,
            failing: HashSet::new(),
            too_big: HashSet::new(),
            max_pod: MAX_POD_CHECKPOINT,
            max_total: MAX_TOTAL_CHECKPOINTS,
        }
    }

    /// Brings the checkpoints in line with `pods`, the API's pods for this
    /// node: admitted pods are written when they changed; refused pods and
    /// pods gone lose theirs; a pod not yet decided on keeps what it has
    /// (a restored one), and gets one at its first update after admission.
    fn sync<P: Borrow<Pod>>(&mut self, pods: &[P]) {
        let dir = self.dir.clone();
        let written = self
            .written
            .get_or_insert_with(|| match load_checkpoints(&dir) {
                Ok(found) => found
                    .pods
                    .iter()
                    .map(|p| {
                        let size = encode_checkpoint(p).map_or(0, |b| b.len());
                        (
                            pod_uid(p).to_string(),
                            Written {
                                rv: String::new(),
                                size,
                            },
                        )
                    })
                    .collect(),
                Err(e) => {
                    warn!("--bootstrap-checkpoint-path {}: {e}", dir.display());
                    HashMap::new()
                }
            });
        let pods: Vec<&Pod> = pods
            .iter()
            .map(Borrow::borrow)
            .filter(|p| !is_mirror_pod(p))
            .collect();
        let decided = self.admissions.get_all(pods.iter().map(|p| pod_uid(p)));
        let mut keep: HashMap<String, Written> = HashMap::new();
        let mut total = 0usize;
        // What stays as it is counts first: undecided pods' checkpoints and
        // admitted pods' unchanged ones.
        let mut to_write = Vec::new();
        for (pod, decision) in pods.iter().zip(&decided) {
            let uid = pod_uid(pod);
            let rv = pod.metadata.resource_version.clone().unwrap_or_default();
            match (decision, written.get(uid)) {
                (None, Some(w)) => {
                    total += w.size;
                    keep.insert(uid.to_string(), w.clone());
                }
                (Some(true), Some(w)) if w.rv == rv && !rv.is_empty() => {
                    total += w.size;
                    keep.insert(uid.to_string(), w.clone());
                }
                (Some(true), _) => to_write.push(*pod),
                _ => {}
            }
        }
        for pod in to_write {
            let uid = pod_uid(pod).to_string();
            let rv = pod.metadata.resource_version.clone().unwrap_or_default();
            let bytes = match encode_checkpoint(pod) {
                Ok(b) => b,
                Err(e) => {
                    warn!("--bootstrap-checkpoint-path {}: {e}", dir.display());
                    continue;
                }
            };
            let refusal = if bytes.len() > self.max_pod {
                Some(format!(
                    "its checkpoint would take {} bytes, over the limit of {} bytes per pod",
                    bytes.len(),
                    self.max_pod
                ))
            } else if total + bytes.len() > self.max_total {
                Some(format!(
                    "the checkpoints would take {} bytes, over the limit of {} bytes in all",
                    total + bytes.len(),
                    self.max_total
                ))
            } else {
                None
            };
            if let Some(why) = refusal {
                if self.too_big.insert(uid.clone()) {
                    warn!(
                        "--bootstrap-checkpoint-path {}: pod {} ({uid}) not checkpointed: {why}",
                        dir.display(),
                        pod_full_name(pod)
                    );
                }
                // An older checkpoint of it is removed below.
                continue;
            }
            self.too_big.remove(&uid);
            if let Err(e) = write_encoded(&dir, pod, &bytes) {
                let what = format!(
                    "--bootstrap-checkpoint-path {}: cannot checkpoint pod {uid}: {e}",
                    dir.display()
                );
                warn_once(&mut self.failing, &uid, &what);
                // The file on disk (an older version, or none) is kept
                // and written again at the next update.
                if let Some(old) = written.get(&uid) {
                    total += old.size;
                    keep.insert(
                        uid,
                        Written {
                            rv: String::new(),
                            size: old.size,
                        },
                    );
                }
                continue;
            }
            if self.failing.remove(&uid) {
                info!(
                    "--bootstrap-checkpoint-path {}: checkpoint of pod {uid} written",
                    dir.display()
                );
            }
            total += bytes.len();
            keep.insert(
                uid,
                Written {
                    rv,
                    size: bytes.len(),
                },
            );
        }
        for (uid, old) in written.iter() {
            if !keep.contains_key(uid) {
                if let Err(e) = remove_checkpoint(&dir, uid) {
                    let what = format!(
                        "--bootstrap-checkpoint-path {}: cannot remove checkpoint of {uid}: {e}",
                        dir.display()
                    );
                    warn_once(&mut self.failing, uid, &what);
                    // Tried again at the next update; until then a restart
                    // would restore the pod, and the first SET drop it.
                    keep.insert(
                        uid.clone(),
                        Written {
                            rv: String::new(),
                            size: old.size,
                        },
                    );
                } else {
                    self.failing.remove(uid);
                }
            }
        }
        let present: HashSet<&str> = pods.iter().map(|p| pod_uid(p)).collect();
        self.too_big.retain(|u| present.contains(u.as_str()));
        *written = keep;
    }
}

/// Warns of a failing checkpoint write or removal of `uid` when it is new
/// to `failing`; while it goes on failing, at each update, it is a debug line.
fn warn_once(failing: &mut HashSet<String>, uid: &str, what: &str) {
    if failing.insert(uid.to_string()) {
        warn!("{what}; retrying at each update");
    } else {
        debug!("{what}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::checkpoint::write_checkpoint;

    fn pod(uid: &str, rv: &str) -> Pod {
        let mut p = Pod::default();
        p.metadata.uid = Some(uid.into());
        p.metadata.name = Some(format!("p-{uid}"));
        p.metadata.namespace = Some("default".into());
        p.metadata.resource_version = Some(rv.into());
        p
    }

    #[test]
    fn checkpoints_follow_the_pods() {
        let dir = tempfile::tempdir().unwrap();
        // A checkpoint left from before whose pod is gone now.
        write_checkpoint(dir.path(), &pod("old", "1")).unwrap();
        let admissions = Arc::new(Admissions::default());
        for uid in ["a", "b", "m"] {
            admissions.record(uid, true);
        }
        let mut c = Checkpointer::new(dir.path().to_path_buf(), admissions);
        let mut mirror = pod("m", "3");
        mirror.metadata.annotations = Some(
            [("kubernetes.io/config.mirror".to_string(), "h".to_string())]
                .into_iter()
                .collect(),
        );
        c.sync(&[pod("a", "1"), pod("b", "2"), mirror]);
        let uids = |dir: &std::path::Path| {
            let mut u: Vec<String> = load_checkpoints(dir)
                .unwrap()
                .pods
                .iter()
                .map(|p| pod_uid(p).to_string())
                .collect();
            u.sort();
            u
        };
        assert_eq!(uids(dir.path()), ["a", "b"]);
        c.sync(&[pod("b", "5")]);
        assert_eq!(uids(dir.path()), ["b"]);
        let found = load_checkpoints(dir.path()).unwrap();
        assert_eq!(
            found.pods[0].metadata.resource_version.as_deref(),
            Some("5")
        );
    }

    #[test]
    fn a_checkpoint_that_cannot_be_written_keeps_the_old_one_and_is_retried() {
        let base = tempfile::tempdir().unwrap();
        let dir = base.path().join("checkpoints");
        let admissions = Arc::new(Admissions::default());
        admissions.record("a", true);
        let mut c = Checkpointer::new(dir.clone(), admissions);
        c.sync(&[pod("a", "1")]);
        // The directory becomes unusable (a file in the way of the temp
        // file's name): the update to v2 fails, v1 stays on disk.
        let tmp =
            crate::atomic_file::temp_path(&super::super::checkpoint::checkpoint_path(&dir, "a"));
        std::fs::create_dir(&tmp).unwrap();
        std::fs::write(tmp.join("x"), "in the way").unwrap();
        c.sync(&[pod("a", "2")]);
        c.sync(&[pod("a", "2")]);
        assert!(c.failing.contains("a"));
        let rv = |dir: &std::path::Path| {
            load_checkpoints(dir).unwrap().pods[0]
                .metadata
                .resource_version
                .clone()
        };
        assert_eq!(rv(&dir).as_deref(), Some("1"), "the old checkpoint went");
        // Once writable again the next update (even an unchanged one) writes it.
        std::fs::remove_dir_all(&tmp).unwrap();
        c.sync(&[pod("a", "2")]);
        assert_eq!(rv(&dir).as_deref(), Some("2"));
        assert!(c.failing.is_empty());
    }

    fn uids(dir: &std::path::Path) -> Vec<String> {
        let mut u: Vec<String> = load_checkpoints(dir)
            .unwrap()
            .pods
            .iter()
            .map(|p| pod_uid(p).to_string())
            .collect();
        u.sort();
        u
    }

    #[test]
    fn only_admitted_pods_are_checkpointed() {
        let dir = tempfile::tempdir().unwrap();
        // Restored at start, not decided on yet: kept as it is.
        write_checkpoint(dir.path(), &pod("restored", "1")).unwrap();
        let admissions = Arc::new(Admissions::default());
        let mut c = Checkpointer::new(dir.path().to_path_buf(), admissions.clone());
        let all = [pod("restored", "2"), pod("new", "1"), pod("bad", "1")];
        c.sync(&all);
        assert_eq!(uids(dir.path()), ["restored"]);
        assert_eq!(
            load_checkpoints(dir.path()).unwrap().pods[0]
                .metadata
                .resource_version
                .as_deref(),
            Some("1"),
            "an undecided pod's checkpoint is left alone"
        );
        // The sync loop decides; the next update writes the admitted ones
        // and drops the refused one's.
        admissions.record("restored", false);
        admissions.record("new", true);
        admissions.record("bad", false);
        c.sync(&all);
        assert_eq!(uids(dir.path()), ["new"]);
    }

    #[test]
    fn checkpoints_are_bounded_per_pod_and_in_all() {
        let dir = tempfile::tempdir().unwrap();
        let admissions = Arc::new(Admissions::default());
        let big = |uid: &str, rv: &str, bytes: usize| {
            let mut p = pod(uid, rv);
            p.metadata.annotations = Some(
                [("big".to_string(), "x".repeat(bytes))]
                    .into_iter()
                    .collect(),
            );
            p
        };
        for uid in ["a", "b", "c", "huge"] {
            admissions.record(uid, true);
        }
        let mut c = Checkpointer::new(dir.path().to_path_buf(), admissions);
        c.max_pod = 4000;
        c.max_total = 7000;
        c.sync(&[big("a", "1", 3000), big("huge", "1", 5000)]);
        assert_eq!(uids(dir.path()), ["a"], "over the per-pod limit");
        assert!(c.too_big.contains("huge"));
        c.sync(&[
            big("a", "1", 3000),
            big("b", "1", 3000),
            big("c", "1", 3000),
        ]);
        assert_eq!(uids(dir.path()), ["a", "b"], "over the total");
        assert!(c.too_big.contains("c") && !c.too_big.contains("huge"));
        // Room again once a pod is gone.
        c.sync(&[big("b", "1", 3000), big("c", "2", 3000)]);
        assert_eq!(uids(dir.path()), ["b", "c"]);
        assert!(c.too_big.is_empty());
        // A pod that grows over the limit loses its stale checkpoint.
        c.sync(&[big("b", "1", 3000), big("c", "3", 4500)]);
        assert_eq!(uids(dir.path()), ["b"]);
    }
}
