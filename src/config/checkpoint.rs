//! Pod checkpoints (`--bootstrap-checkpoint-path`, upstream
//! `pkg/kubelet/checkpoint`): pods of the API source saved on disk so that
//! a node restarting without the API server can bring them back. At start
//! the checkpoints are loaded once and merged as a RESTORE for the API
//! source ([`super::PodConfig::restore`]); they never mark that source as
//! seen.
//!
//! One file per pod, `Pod_<UID>.yaml` as upstream names them, holding JSON:
//! `{"Pod": {...}, "Checksum": N}`. The checksum is FNV-1a (64 bit) of the
//! pod's JSON encoding, so a file that was cut short, edited or bit-flipped
//! is refused with an error and never trusted. (Upstream's checksum hashes
//! a Go-specific dump of the object, so its files don't load here.) Files
//! are written to a dotfile first and renamed into place.
//!
//! Only pods the sync loop admitted are checkpointed ([`Admissions`]), and
//! checkpoints are bounded: [`MAX_POD_CHECKPOINT`] bytes each and
//! [`MAX_TOTAL_CHECKPOINTS`] bytes together, so pods bound to the node
//! cannot fill the disk with them. (Upstream bounds neither.)

use std::collections::HashMap;
use std::fs;
use std::io::{self, Read};
use std::path::{Path, PathBuf};

use parking_lot::Mutex;

use serde_json::Value;

use super::decode::pod_from_json;
use super::file::MAX_MANIFEST_SIZE;
use super::Pod;
use crate::atomic_file::{write_file, Durability};
use crate::pod::{pod_full_name, pod_uid};

/// Pods annotated `node.kubernetes.io/bootstrap-checkpoint: "true"` are the
/// ones checkpointed (by whoever writes checkpoints).
pub const BOOTSTRAP_CHECKPOINT_ANNOTATION_KEY: &str = "node.kubernetes.io/bootstrap-checkpoint";

/// The largest checkpoint written for one pod, in bytes.
pub(crate) const MAX_POD_CHECKPOINT: usize = 512 * 1024;
/// The most bytes all checkpoints together take.
pub(crate) const MAX_TOTAL_CHECKPOINTS: usize = 32 * 1024 * 1024;

/// What the sync loop decided about each pod's admission, for the
/// checkpointer: only admitted pods get a checkpoint, and a refused pod
/// loses the one it had. The sync loop records decisions under a short
/// lock and never does I/O for it; the checkpointer reads them when it
/// writes (on the API source's thread).
#[derive(Debug, Default)]
pub(crate) struct Admissions {
    decided: Mutex<HashMap<String, bool>>,
}

impl Admissions {
    /// Pod `uid` was admitted (true) or refused (false).
    pub(crate) fn record(&self, uid: &str, admitted: bool) {
        self.decided.lock().insert(uid.to_string(), admitted);
    }

    /// Pod `uid` is gone from the node.
    pub(crate) fn forget(&self, uid: &str) {
        let mut d = self.decided.lock();
        d.remove(uid);
        crate::malloc::shrink_map(&mut *d);
    }

    /// The decisions about `uids`, read under one lock.
    pub(crate) fn get_all<'a>(&self, uids: impl Iterator<Item = &'a str>) -> Vec<Option<bool>> {
        let d = self.decided.lock();
        uids.map(|u| d.get(u).copied()).collect()
    }
}

const FILE_PREFIX: &str = "Pod_";
const FILE_SUFFIX: &str = ".yaml";

/// What [`load_checkpoints`] found.
#[derive(Debug, Default)]
pub struct Checkpoints {
    /// Pods from valid checkpoints, in file name order.
    pub(crate) pods: Vec<Pod>,
    /// Files that were skipped, with the reason (already logged).
    pub(crate) skipped: Vec<(PathBuf, String)>,
}

/// FNV-1a, 64 bit.
fn fnv1a64(bytes: &[u8]) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        hash ^= u64::from(*b);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    hash
}

fn checksum(pod: &Pod) -> io::Result<u64> {
    let bytes = serde_json::to_vec(pod).map_err(|e| {
        io::Error::other(format!(
            "encoding pod {} for its checksum: {e}",
            pod_full_name(pod)
        ))
    })?;
    Ok(fnv1a64(&bytes))
}

/// The file a pod's checkpoint is kept in.
pub fn checkpoint_path(dir: &Path, uid: &str) -> PathBuf {
    dir.join(format!("{FILE_PREFIX}{uid}{FILE_SUFFIX}"))
}

fn checked_uid(uid: &str) -> io::Result<&str> {
    // The pod UID rules (one path element, bounded), and no leading dot, so
    // that no checkpoint hides among the writer's dotfiles.
    if crate::paths::uid_error(uid).is_some() || uid.starts_with('.') {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("pod UID {uid:?} can't name a checkpoint file"),
        ));
    }
    Ok(uid)
}

/// Writes (or replaces) the checkpoint of `pod`, creating `dir` if needed.
pub fn write_checkpoint(dir: &Path, pod: &Pod) -> io::Result<()> {
    write_encoded(dir, pod, &encode_checkpoint(pod)?)
}

/// The bytes of `pod`'s checkpoint file.
pub(crate) fn encode_checkpoint(pod: &Pod) -> io::Result<Vec<u8>> {
    let doc = serde_json::json!({ "Pod": pod, "Checksum": checksum(pod)? });
    serde_json::to_vec(&doc).map_err(|e| {
        io::Error::other(format!(
            "encoding checkpoint of pod {}: {e}",
            pod_full_name(pod)
        ))
    })
}

/// Writes `bytes` ([`encode_checkpoint`]) as `pod`'s checkpoint.
pub(crate) fn write_encoded(dir: &Path, pod: &Pod, bytes: &[u8]) -> io::Result<()> {
    let uid = checked_uid(pod_uid(pod))?;
    fs::create_dir_all(dir).map_err(|e| {
        io::Error::new(e.kind(), format!("create directory {}: {e}", dir.display()))
    })?;
    let path = checkpoint_path(dir, uid);
    write_file(&path, bytes, 0o600, Durability::Fsync)
}

/// Removes the checkpoint of the pod with this UID; a missing one is fine.
pub(crate) fn remove_checkpoint(dir: &Path, uid: &str) -> io::Result<()> {
    let path = checkpoint_path(dir, checked_uid(uid)?);
    match fs::remove_file(&path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(io::Error::new(
            e.kind(),
            format!("remove {}: {e}", path.display()),
        )),
        _ => Ok(()),
    }
}

/// Loads every checkpoint in `dir`. A missing directory holds none; a
/// checkpoint that can't be read, decoded or verified is logged as an
/// error and skipped. Fails only when the directory can't be listed.
pub fn load_checkpoints(dir: &Path) -> io::Result<Checkpoints> {
    let mut found = Checkpoints::default();
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            log::info!(
                "config: no pod checkpoints: {} does not exist",
                dir.display()
            );
            return Ok(found);
        }
        Err(e) => return Err(e),
    };
    let mut files: Vec<PathBuf> = entries
        .filter_map(Result::ok)
        .filter(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            name.starts_with(FILE_PREFIX) && name.ends_with(FILE_SUFFIX)
        })
        .map(|e| e.path())
        .collect();
    files.sort();
    for file in files {
        match read_checkpoint(&file) {
            Ok(pod) => found.pods.push(pod),
            Err(reason) => {
                log::error!(
                    "config: skipping pod checkpoint {}: {reason}",
                    file.display()
                );
                found.skipped.push((file, reason));
            }
        }
    }
    log::info!(
        "config: {} pod checkpoint(s) loaded from {}",
        found.pods.len(),
        dir.display()
    );
    Ok(found)
}

fn read_checkpoint(file: &Path) -> Result<Pod, String> {
    let f = fs::File::open(file).map_err(|e| format!("cannot open: {e}"))?;
    let md = f.metadata().map_err(|e| format!("cannot stat: {e}"))?;
    if !md.is_file() {
        return Err("not a regular file".into());
    }
    let mut bytes = Vec::new();
    f.take(MAX_MANIFEST_SIZE + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("cannot read: {e}"))?;
    if bytes.len() as u64 > MAX_MANIFEST_SIZE {
        return Err(format!("over the limit of {MAX_MANIFEST_SIZE} bytes"));
    }
    let doc: Value = serde_json::from_slice(&bytes)
        .map_err(|e| format!("not a checkpoint (invalid JSON: {e})"))?;
    let Value::Object(mut doc) = doc else {
        return Err("not a checkpoint (not a JSON object)".into());
    };
    let want = doc
        .get("Checksum")
        .and_then(Value::as_u64)
        .ok_or("not a checkpoint: Checksum is missing or not a number")?;
    let pod = doc
        .remove("Pod")
        .ok_or("not a checkpoint: Pod is missing")?;
    let pod = pod_from_json(pod).map_err(|e| format!("Pod: {e}"))?;
    let got = checksum(&pod).map_err(|e| e.to_string())?;
    if got != want {
        return Err(format!(
            "checksum mismatch (file says {want}, content gives {got}): corrupt, not trusted"
        ));
    }
    if pod_uid(&pod).is_empty() || pod.metadata.name.as_deref().unwrap_or("").is_empty() {
        return Err("the pod has no UID or no name".into());
    }
    Ok(pod)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{Container, PodSpec};

    fn pod(uid: &str, name: &str) -> Pod {
        let mut p = Pod::default();
        p.metadata.uid = Some(uid.into());
        p.metadata.name = Some(name.into());
        p.metadata.namespace = Some("kube-system".into());
        p.metadata.annotations = Some(
            [(
                BOOTSTRAP_CHECKPOINT_ANNOTATION_KEY.to_string(),
                "true".to_string(),
            )]
            .into_iter()
            .collect(),
        );
        p.spec = Some(PodSpec {
            containers: vec![Container {
                name: "c".into(),
                image: Some("busybox".into()),
                command: Some(vec!["sleep".into(), "3600".into()]),
                ..Default::default()
            }],
            ..Default::default()
        });
        p
    }

    #[test]
    fn round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let sub = dir.path().join("checkpoints");
        write_checkpoint(&sub, &pod("u2", "b")).unwrap();
        write_checkpoint(&sub, &pod("u1", "a")).unwrap();
        // Rewriting replaces.
        let mut changed = pod("u1", "a");
        changed.spec.as_mut().unwrap().containers[0].image = Some("busybox:2".into());
        write_checkpoint(&sub, &changed).unwrap();
        assert!(checkpoint_path(&sub, "u1").ends_with("Pod_u1.yaml"));

        let loaded = load_checkpoints(&sub).unwrap();
        assert!(loaded.skipped.is_empty(), "{:?}", loaded.skipped);
        assert_eq!(loaded.pods, vec![changed, pod("u2", "b")]);

        remove_checkpoint(&sub, "u1").unwrap();
        remove_checkpoint(&sub, "u1").unwrap();
        assert_eq!(load_checkpoints(&sub).unwrap().pods, vec![pod("u2", "b")]);
        // No temp files left behind.
        let names: Vec<_> = fs::read_dir(&sub)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert_eq!(names, ["Pod_u2.yaml"]);
    }

    #[test]
    fn missing_directory_has_no_checkpoints() {
        let dir = tempfile::tempdir().unwrap();
        let loaded = load_checkpoints(&dir.path().join("absent")).unwrap();
        assert!(loaded.pods.is_empty() && loaded.skipped.is_empty());
    }

    #[test]
    fn corrupt_checkpoints_are_skipped_never_trusted() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        write_checkpoint(d, &pod("good", "good")).unwrap();
        write_checkpoint(d, &pod("edited", "edited")).unwrap();
        write_checkpoint(d, &pod("short", "short")).unwrap();

        // A changed image with the old checksum: well-formed, but not what
        // was written.
        let path = checkpoint_path(d, "edited");
        let text = fs::read_to_string(&path).unwrap();
        assert!(text.contains("\"busybox\""));
        fs::write(&path, text.replace("\"busybox\"", "\"evil\"")).unwrap();
        // Cut short.
        let path = checkpoint_path(d, "short");
        let bytes = fs::read(&path).unwrap();
        fs::write(&path, &bytes[..bytes.len() / 2]).unwrap();
        // Other shapes.
        fs::write(
            checkpoint_path(d, "nosum"),
            r#"{"Pod":{"metadata":{"name":"x","uid":"nosum"}}}"#,
        )
        .unwrap();
        fs::write(checkpoint_path(d, "list"), "[1,2]").unwrap();
        fs::write(checkpoint_path(d, "nopod"), r#"{"Checksum":1}"#).unwrap();
        fs::write(
            checkpoint_path(d, "typed"),
            r#"{"Pod":{"metadata":{"name":1}},"Checksum":1}"#,
        )
        .unwrap();
        fs::create_dir(checkpoint_path(d, "dir")).unwrap();
        // Not checkpoints at all: ignored without a word.
        fs::write(d.join("notes.txt"), "hello").unwrap();
        fs::write(d.join(".Pod_tmp.yaml.tmp"), "partial").unwrap();

        let loaded = load_checkpoints(d).unwrap();
        assert_eq!(loaded.pods, vec![pod("good", "good")]);
        let reasons: std::collections::BTreeMap<String, String> = loaded
            .skipped
            .iter()
            .map(|(p, r)| {
                (
                    p.file_name().unwrap().to_string_lossy().into_owned(),
                    r.clone(),
                )
            })
            .collect();
        assert_eq!(reasons.len(), 7, "{reasons:?}");
        assert!(
            reasons["Pod_edited.yaml"].contains("checksum mismatch"),
            "{reasons:?}"
        );
        assert!(
            reasons["Pod_short.yaml"].contains("invalid JSON"),
            "{reasons:?}"
        );
        assert!(
            reasons["Pod_nosum.yaml"].contains("Checksum"),
            "{reasons:?}"
        );
        assert!(
            reasons["Pod_list.yaml"].contains("not a JSON object"),
            "{reasons:?}"
        );
        assert!(
            reasons["Pod_nopod.yaml"].contains("Pod is missing"),
            "{reasons:?}"
        );
        assert!(
            reasons["Pod_typed.yaml"].contains("metadata.name"),
            "{reasons:?}"
        );
        assert!(
            reasons["Pod_dir.yaml"].contains("not a regular file"),
            "{reasons:?}"
        );
    }

    #[test]
    fn uids_that_cannot_name_a_file_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let long = "u".repeat(crate::paths::UID_MAX + 1);
        for uid in ["", "../x", ".hidden", "a/b", long.as_str()] {
            let err = write_checkpoint(dir.path(), &pod(uid, "p")).unwrap_err();
            assert_eq!(err.kind(), io::ErrorKind::InvalidInput, "{uid:?}");
        }
    }
}
