//! The API server pod source (upstream `config/apiserver.go`): a reflector
//! over the pods bound to this node (`fieldSelector=spec.nodeName=<node>`)
//! that sends the complete set as a SET to the `api` source after the first
//! list and after every change, so the merge computes what was added,
//! updated, gracefully deleted or removed. With
//! `--bootstrap-checkpoint-path`, every pod it sends (mirror pods aside,
//! which never run) is checkpointed, written atomically when it changed and
//! removed when the pod is gone, so a node that restarts without the API
//! server still runs its pods.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use crossbeam_channel::Sender;
use log::{debug, warn};

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
}

impl Checkpointer {
    fn new(dir: PathBuf) -> Checkpointer {
        Checkpointer { dir, written: None }
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
                    warn!(
                        "--bootstrap-checkpoint-path {}: cannot checkpoint pod {uid}: {e}",
                        dir.display()
                    );
                    // The file on disk (an older version, or none) is kept
                    // and written again at the next update.
                    keep.insert(uid, String::new());
                    continue;
                }
            }
            keep.insert(uid, rv);
        }
        for uid in written.keys() {
            if !keep.contains_key(uid) {
                if let Err(e) = remove_checkpoint(&dir, uid) {
                    warn!(
                        "--bootstrap-checkpoint-path {}: cannot remove checkpoint of {uid}: {e}",
                        dir.display()
                    );
                    // Tried again at the next update; until then a restart
                    // would restore the pod, and the first SET drop it.
                    keep.insert(uid.clone(), String::new());
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
}
