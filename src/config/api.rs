//! The API server pod source (upstream `config/apiserver.go`): a reflector
//! over the pods bound to this node (`fieldSelector=spec.nodeName=<node>`)
//! that sends the complete set as a SET to the `api` source after the first
//! list and after every change, so the merge computes what was added,
//! updated, gracefully deleted or removed. With
//! `--bootstrap-checkpoint-path`, every pod it sends (mirror pods aside,
//! which never run) is checkpointed, written atomically when it changed and
//! removed when the pod is gone, so a node that restarts without the API
//! server still runs its pods.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::Arc;

use crossbeam_channel::Sender;
use log::{debug, info, warn};

use super::checkpoint::{load_checkpoints, remove_checkpoint, write_checkpoint};
use super::storage::is_mirror_pod;
use super::{pod_uid, Pod, PodOperation, PodUpdate, API_SOURCE};
use crate::kube::{Client, ListWatch, Reflector};

/// Handle of the source; dropping it stops the reflector.
pub struct ApiSource {
    _reflector: Reflector,
}

impl ApiSource {
    pub fn start(
        client: Client,
        node: &str,
        updates: Sender<PodUpdate>,
        checkpoint_dir: Option<PathBuf>,
    ) -> std::io::Result<ApiSource> {
        let lw = ListWatch {
            path: "/api/v1/pods".into(),
            field_selector: Some(format!("spec.nodeName={node}")),
        };
        let mut checkpoints = checkpoint_dir.map(Checkpointer::new);
        let sink = Box::new(move |pods: Vec<Arc<Pod>>| {
            let pods: Vec<Pod> = pods.iter().map(|p| (**p).clone()).collect();
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

/// Keeps one checkpoint per API pod in a directory.
struct Checkpointer {
    dir: PathBuf,
    /// UID to the resourceVersion checkpointed; `None` until the directory
    /// was read once.
    written: Option<HashMap<String, String>>,
    /// Pods whose checkpoint write or removal is failing: warned about
    /// once, then retried at each update quietly until it works (every
    /// status change of every pod is an update, so a full disk would
    /// otherwise repeat the same warning many times a minute).
    failing: HashSet<String>,
}

impl Checkpointer {
    fn new(dir: PathBuf) -> Checkpointer {
        Checkpointer {
            dir,
            written: None,
            failing: HashSet::new(),
        }
    }

    fn sync(&mut self, pods: &[Pod]) {
        let dir = self.dir.clone();
        let written = self
            .written
            .get_or_insert_with(|| match load_checkpoints(&dir) {
                Ok(found) => found
                    .pods
                    .iter()
                    .map(|p| (pod_uid(p).to_string(), String::new()))
                    .collect(),
                Err(e) => {
                    warn!("--bootstrap-checkpoint-path {}: {e}", dir.display());
                    HashMap::new()
                }
            });
        let mut keep = HashMap::new();
        for pod in pods.iter().filter(|p| !is_mirror_pod(p)) {
            let uid = pod_uid(pod).to_string();
            let rv = pod.metadata.resource_version.clone().unwrap_or_default();
            if written.get(&uid) != Some(&rv) || rv.is_empty() {
                if let Err(e) = write_checkpoint(&dir, pod) {
                    let what = format!(
                        "--bootstrap-checkpoint-path {}: cannot checkpoint pod {uid}: {e}",
                        dir.display()
                    );
                    if self.failing.insert(uid.clone()) {
                        warn!("{what}; retrying at each update");
                    } else {
                        debug!("{what}");
                    }
                    // The file on disk (an older version, or none) is kept
                    // and written again at the next update.
                    keep.insert(uid, String::new());
                    continue;
                }
                if self.failing.remove(&uid) {
                    info!(
                        "--bootstrap-checkpoint-path {}: checkpoint of pod {uid} written",
                        dir.display()
                    );
                }
            }
            keep.insert(uid, rv);
        }
        for uid in written.keys() {
            if !keep.contains_key(uid) {
                if let Err(e) = remove_checkpoint(&dir, uid) {
                    let what = format!(
                        "--bootstrap-checkpoint-path {}: cannot remove checkpoint of {uid}: {e}",
                        dir.display()
                    );
                    if self.failing.insert(uid.clone()) {
                        warn!("{what}; retrying at each update");
                    } else {
                        debug!("{what}");
                    }
                    // Tried again at the next update; until then a restart
                    // would restore the pod, and the first SET drop it.
                    keep.insert(uid.clone(), String::new());
                } else {
                    self.failing.remove(uid);
                }
            }
        }
        *written = keep;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let mut c = Checkpointer::new(dir.path().to_path_buf());
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
        let mut c = Checkpointer::new(dir.clone());
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
}
