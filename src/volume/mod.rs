//! The volume manager: makes a pod's volumes ready on the host before its
//! containers are created (upstream's volume manager, without attach and
//! detach), and tears them down with the pod.
//!
//! Under `<root-dir>/pods/<uid>/volumes/` each kind has upstream's plugin
//! directory: `kubernetes.io~empty-dir`, `~secret`, `~configmap`,
//! `~downward-api` and `~projected`. Secret and projected volumes (which
//! carry service account tokens) and emptyDir volumes with medium Memory are
//! tmpfs mounts, so secrets never reach a disk. Files are written through
//! `writer` (the `..data` layout), mounted read-only into containers.
//!
//! Setup runs on the pod's worker thread, before SyncPod, at every sync:
//! secret, configMap, downwardAPI and projected volumes are computed again
//! from the pod and the objects (read through `objects`, the Secret and
//! ConfigMap manager, which watches them by default) and written again when
//! their files changed, in one `..data` swap, so a container sees the old
//! set or the new one, never a mix (subPath mounts, bind mounts made at the
//! container's start, keep what they had, as upstream). A projected service
//! account token is kept and requested again once 80% of its lifetime has
//! passed (or after 24 h). A volume that was set up once keeps its files
//! when a later refresh fails (the apiserver may be away); the refresh is
//! tried again at the pod's next sync.
//!
//! An emptyDir is set up once: made world-writable, given the pod's
//! `fsGroup` (`ownership`), then marked ready by a file beside it,
//! `pods/<uid>/plugins/kubernetes.io~empty-dir/<name>/ready` (upstream's
//! ready file, out of every container's reach). A volume marked ready is
//! never set up or walked again, by this tinylet or a restarted one: what
//! is in it is the containers'. Only a volume whose directory (or, for
//! medium Memory, tmpfs) is gone is set up afresh. At a first set-up the
//! directory is new and the walk sees only it, unless an earlier tinylet
//! left it without a marker; then it walks what the containers wrote, once,
//! by descriptors. A walk that fails on some entries is logged and the
//! volume used as it is, and not tried again (as upstream, which ignores
//! the error). Volumes tinylet writes itself get the group when written.
//!
//! The directories of pods that are gone are removed by `sweeper`, at
//! housekeeping's request, each sweep on a `pod-dir-sweeper` thread that
//! ends with it.

use std::collections::HashMap;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use k8s_openapi::api::core::v1::{EmptyDirVolumeSource, Pod, Volume};
use log::{info, warn};

use crate::events::{EventRecorder, EventType, ObjectRef};
use crate::fieldpath::NodeAllocatable;

mod api;
pub(crate) use api::ApiObjects;
mod host_path;
pub mod objects;
pub(crate) use objects::{ApiWatcher, ObjectManager, Strategy};
mod ownership;
pub mod payload;
pub(crate) mod subpath;
pub(crate) mod sweeper;
pub(crate) mod writer;

pub use payload::{Fetched, Keys, Token};

/// Where a volume manager reads Secrets and ConfigMaps and gets service
/// account tokens: the apiserver, through `kube::Client`.
pub(crate) trait ObjectSource: Send + Sync {
    /// A Secret's decoded `data`, or `None` when it does not exist.
    fn secret(&self, namespace: &str, name: &str) -> Result<Fetched, String>;
    /// A ConfigMap's `data` and `binaryData`, or `None` when it does not exist.
    fn config_map(&self, namespace: &str, name: &str) -> Result<Fetched, String>;
    /// A token for `pod`'s service account, bound to the pod (TokenRequest).
    fn service_account_token(
        &self,
        pod: &Pod,
        audience: Option<&str>,
        expiration_seconds: i64,
    ) -> Result<Token, String>;
    /// Notes the objects `pod` references, at each of its syncs (a source
    /// that watches them starts or stops watches here).
    fn register_pod(&self, _pod: &Pod) {}
    /// Forgets the pod `uid`, which is gone.
    fn unregister_pod(&self, _uid: &str) {}
}

/// The two kinds of API object whose keys become files.
#[derive(Clone, Copy)]
enum Kind {
    Secret,
    ConfigMap,
}

/// The lifetime the API gives a projected token when the spec names none.
const DEFAULT_TOKEN_SECONDS: i64 = 3600;
/// A token is refreshed at most this long after it was issued.
const MAX_TOKEN_AGE: Duration = Duration::from_secs(24 * 3600);

/// The plugin directory name of each volume kind.
const EMPTY_DIR: &str = "kubernetes.io~empty-dir";
const SECRET: &str = "kubernetes.io~secret";
const CONFIG_MAP: &str = "kubernetes.io~configmap";
const DOWNWARD_API: &str = "kubernetes.io~downward-api";
const PROJECTED: &str = "kubernetes.io~projected";
/// The pod's directory of what volume plugins keep about its volumes.
const PLUGINS: &str = "plugins";
/// The name of an emptyDir's ready marker.
const READY: &str = "ready";

/// The plugin directory of `v`'s kind, and whether containers must see it
/// read-only. `Err` names a kind tinylet cannot set up (hostPath has none).
fn plugin(v: &Volume) -> Result<(&'static str, bool), String> {
    Ok(match () {
        _ if v.empty_dir.is_some() => (EMPTY_DIR, false),
        _ if v.secret.is_some() => (SECRET, true),
        _ if v.config_map.is_some() => (CONFIG_MAP, true),
        _ if v.downward_api.is_some() => (DOWNWARD_API, true),
        _ if v.projected.is_some() => (PROJECTED, true),
        _ => {
            return Err(format!(
                "volume {:?}: only hostPath, emptyDir, secret, configMap, downwardAPI and projected volumes are supported",
                v.name
            ))
        }
    })
}

/// Whether tinylet writes `v`'s files itself (with the `..data` layout,
/// read-only to containers): secret, configMap, downwardAPI, projected.
pub(crate) fn written_by_tinylet(v: &Volume) -> bool {
    v.secret.is_some()
        || v.config_map.is_some()
        || v.downward_api.is_some()
        || v.projected.is_some()
}

/// The host directory of `v` under the pod's `volumes_dir` (or the host
/// path), and whether containers must see it read-only. `Err` names a kind
/// tinylet cannot mount, or a volume name that is not one plain path
/// element (validation refuses such pods first; this keeps the path under
/// the pod's directory whatever comes).
pub(crate) fn host_dir(volumes_dir: &Path, v: &Volume) -> Result<(PathBuf, bool), String> {
    if let Some(hp) = &v.host_path {
        return Ok((PathBuf::from(&hp.path), false));
    }
    let (plugin, read_only) = plugin(v)?;
    let dir = crate::paths::join(&volumes_dir.join(plugin), &v.name)
        .map_err(|e| format!("volume {:?}: {e}", v.name))?;
    Ok((dir, read_only))
}

/// The volumes directory of the pod `uid`; fails for a UID that cannot
/// name a directory under `<root_dir>/pods`.
pub(crate) fn volumes_dir(root_dir: &Path, uid: &str) -> std::io::Result<PathBuf> {
    Ok(crate::paths::pod_dir(root_dir, uid)?.join("volumes"))
}

/// Removes the directories under `<root_dir>/pods` of pods that `keep`
/// does not claim (upstream's cleanupOrphanedPodDirs): left behind when
/// tinylet died between removing a pod's sandbox and its directory. Their
/// tmpfs volumes are unmounted first; a directory whose mounts cannot be
/// undone is left alone. Returns the directories that could not be removed,
/// with why, so the caller can report each once.
pub(crate) fn remove_orphaned_pod_dirs(
    root_dir: &Path,
    keep: impl Fn(&str) -> bool,
) -> Vec<(String, std::io::Error)> {
    let pods = root_dir.join("pods");
    let entries = match std::fs::read_dir(&pods) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Vec::new(),
        Err(e) => return vec![(pods.display().to_string(), e)],
    };
    let mut failed = Vec::new();
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(uid) = name.to_str() else { continue };
        if keep(uid) || !entry.file_type().is_ok_and(|t| t.is_dir()) {
            continue;
        }
        crate::fault::point("orphan-dir", uid);
        let dir = entry.path();
        let removed =
            crate::mount::unmount_below(&dir).and_then(|()| crate::paths::remove_tree(&dir));
        match removed {
            Ok(()) => info!(
                "housekeeping: removed the directory of pod {uid}, which no source has and nothing runs"
            ),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => failed.push((dir.display().to_string(), e)),
        }
    }
    failed
}

/// What the manager set up of one pod's volumes, by volume name. The
/// pod's worker keeps it (in its sync state) and hands it to every
/// [`VolumeManager::setup`], so it has one owner and goes with the worker.
#[derive(Debug, Default)]
pub(crate) struct PodVolumes(HashMap<String, SetUp>);

/// What the manager remembers of one volume it set up.
#[derive(Debug, Clone, Default)]
struct SetUp {
    /// The service account tokens of a projected volume, by source index.
    tokens: Vec<KeptToken>,
}

/// A projected token, used until it is due for replacement.
#[derive(Debug, Clone)]
struct KeptToken {
    index: usize,
    token: Token,
    due: SystemTime,
}

pub(crate) struct VolumeManager {
    root_dir: PathBuf,
    source: Option<Arc<dyn ObjectSource>>,
    allocatable: NodeAllocatable,
    recorder: EventRecorder,
}

/// A volume that could not be made ready; the pod's containers wait.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct VolumeError {
    pub(crate) volume: String,
    pub(crate) message: String,
}

impl std::fmt::Display for VolumeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "MountVolume.SetUp failed for volume {:?} : {}",
            self.volume, self.message
        )
    }
}

impl VolumeManager {
    /// `source` is `None` for a standalone node: volumes that need API
    /// objects then fail with a clear message.
    pub(crate) fn new(
        root_dir: PathBuf,
        source: Option<Arc<dyn ObjectSource>>,
        allocatable: NodeAllocatable,
        recorder: EventRecorder,
    ) -> Self {
        VolumeManager {
            root_dir,
            source,
            allocatable,
            recorder,
        }
    }

    /// Makes every volume of `pod` ready (or refreshes what is due), with
    /// `set_up` what earlier calls for the pod set up. The first volume
    /// that cannot be made ready for the first time is returned, with a
    /// FailedMount event; refresh failures are logged.
    pub(crate) fn setup(&self, pod: &Pod, set_up: &mut PodVolumes) -> Result<(), VolumeError> {
        let uid = crate::pod::pod_uid(pod).to_string();
        let dir = volumes_dir(&self.root_dir, &uid).map_err(|e| VolumeError {
            volume: String::new(),
            message: e.to_string(),
        })?;
        let volumes = pod
            .spec
            .as_ref()
            .and_then(|s| s.volumes.as_deref())
            .unwrap_or(&[]);
        if let Some(source) = &self.source {
            source.register_pod(pod);
        }
        for v in volumes {
            let known = set_up.0.get(&v.name).cloned();
            // What tinylet writes is computed again at every sync and
            // written when it changed; the rest is set up once.
            if known.is_some() && !written_by_tinylet(v) {
                continue;
            }
            let kept = known.as_ref().map_or(&[][..], |k| &k.tokens[..]);
            match self.setup_volume(pod, &dir, v, kept) {
                Ok(tokens) => {
                    set_up.0.insert(v.name.clone(), SetUp { tokens });
                }
                Err(message) => {
                    let err = VolumeError {
                        volume: v.name.clone(),
                        message,
                    };
                    let already = match host_dir(&dir, v) {
                        Ok((d, _)) => d.join(writer::DATA_LINK).exists(),
                        Err(_) => false,
                    };
                    if known.is_some() || already {
                        // Keep what the containers already see; try again
                        // at the next sync.
                        warn!(
                            "pod {}: refreshing volume {:?} failed, its files stay as they were: {}",
                            crate::pod::pod_full_name(pod),
                            v.name,
                            err.message
                        );
                        set_up.0.insert(v.name.clone(), known.unwrap_or_default());
                        continue;
                    }
                    self.recorder.event(
                        &ObjectRef::pod(pod),
                        EventType::Warning,
                        "FailedMount",
                        err.to_string(),
                    );
                    return Err(err);
                }
            }
        }
        Ok(())
    }

    /// Unmounts the pod's tmpfs volumes; its directory is removed with the
    /// pod (and what was set up goes with its worker).
    pub(crate) fn teardown(&self, uid: &str) -> std::io::Result<()> {
        if let Some(source) = &self.source {
            source.unregister_pod(uid);
        }
        let dir = crate::paths::pod_dir(&self.root_dir, uid)?;
        if dir.exists() {
            crate::mount::unmount_below(&dir)?;
        }
        Ok(())
    }

    /// Writes one volume (`kept`: the tokens it had); returns the tokens
    /// it has now.
    fn setup_volume(
        &self,
        pod: &Pod,
        volumes_dir: &Path,
        v: &Volume,
        kept: &[KeptToken],
    ) -> Result<Vec<KeptToken>, String> {
        let (dir, read_only) = host_dir(volumes_dir, v)?;
        if let Some(hp) = &v.host_path {
            host_path::check_type(&dir, hp.type_.as_deref())?;
            return Ok(Vec::new());
        }
        // The pod's fsGroup owns what it may write or read (not hostPath).
        let fs_group = pod
            .spec
            .as_ref()
            .and_then(|s| s.security_context.as_ref())
            .and_then(|c| c.fs_group)
            .and_then(|g| u32::try_from(g).ok());
        let own = |what: &Path| -> Result<(), String> {
            match fs_group {
                Some(gid) => ownership::set_group(what, gid, read_only)
                    .map(|_| ())
                    .map_err(|e| format!("set group {gid} on {}: {e}", what.display())),
                None => Ok(()),
            }
        };
        // The pod's directories, private to root (upstream's 0750), then
        // the volume's own.
        let (plugin, _) = plugin(v)?;
        let uid = crate::pod::pod_uid(pod);
        crate::paths::ensure_pod_dirs(&self.root_dir, uid, &["volumes", plugin])
            .map_err(|e| format!("create the volume's directory: {e}"))?;
        if let Some(ed) = &v.empty_dir {
            self.setup_empty_dir(pod, v, ed, &dir, fs_group)?;
            return Ok(Vec::new());
        }
        let (mut files, tokens) = self.payload(pod, v, kept)?;
        if fs_group.is_some() {
            // The modes the ownership pass gives, so that an unchanged
            // payload compares equal and is not written again.
            for f in files.values_mut() {
                f.mode = ownership::file_mode(f.mode, read_only);
            }
        }
        payload::check_paths(&files)?;
        // Readable by all as the files inside (their own modes guard them):
        // upstream's are wider still (0777, or 1777 for a tmpfs).
        create_dir(&dir, 0o755)?;
        if v.secret.is_some() || v.projected.is_some() {
            crate::mount::ensure_tmpfs(&dir, 0)
                .map_err(|e| format!("mount tmpfs on {}: {e}", dir.display()))?;
        }
        let changed = writer::write_payload(&dir, &files)
            .map_err(|e| format!("write files in {}: {e}", dir.display()))?;
        if changed {
            own(&dir)?;
            info!(
                "pod {}: volume {:?} written ({} files)",
                crate::pod::pod_full_name(pod),
                v.name,
                files.len()
            );
        }
        Ok(tokens)
    }

    /// Sets up the emptyDir `v` at `dir` once: made world-writable (a
    /// tmpfs for medium Memory), given the pod's `fs_group`, then marked
    /// ready beside it (`ready_marker`). A volume marked ready and still
    /// there (its tmpfs still mounted) is left as it is: what is in it
    /// belongs to the containers, and a restarted tinylet never walks it
    /// again. A walk that fails on some entries is logged and the volume
    /// used as it is (upstream ignores the error too); it is not tried again.
    fn setup_empty_dir(
        &self,
        pod: &Pod,
        v: &Volume,
        ed: &EmptyDirVolumeSource,
        dir: &Path,
        fs_group: Option<u32>,
    ) -> Result<(), String> {
        let uid = crate::pod::pod_uid(pod);
        let memory = ed.medium.as_deref() == Some("Memory");
        let marker = ready_marker(&self.root_dir, uid, &v.name)
            .map_err(|e| format!("volume {:?}: {e}", v.name))?;
        if std::fs::symlink_metadata(&marker).is_ok_and(|m| m.is_file()) {
            let there = if memory {
                crate::mount::is_mount_point(dir).unwrap_or(false)
            } else {
                std::fs::symlink_metadata(dir).is_ok_and(|m| m.is_dir())
            };
            if there {
                return Ok(());
            }
            // Gone (a reboot took its tmpfs, say): set up afresh.
            warn!(
                "pod {}: volume {:?} was set up but {} is gone; setting it up again",
                crate::pod::pod_full_name(pod),
                v.name,
                dir.display()
            );
            std::fs::remove_file(&marker)
                .map_err(|e| format!("remove {}: {e}", marker.display()))?;
        }
        create_dir(dir, 0o777)?;
        if memory {
            let size = ed
                .size_limit
                .as_ref()
                .map(|q| {
                    crate::quantity::parse_bytes(&q.0)
                        .ok_or_else(|| format!("emptyDir.sizeLimit: cannot parse {:?}", q.0))
                })
                .transpose()?
                .unwrap_or(0);
            crate::mount::ensure_tmpfs(dir, size.max(0) as u64)
                .map_err(|e| format!("mount tmpfs on {}: {e}", dir.display()))?;
        }
        // World-writable as upstream, so that any runAsUser can write.
        let meta = std::fs::metadata(dir).map_err(|e| format!("stat {}: {e}", dir.display()))?;
        let mode = std::os::unix::fs::PermissionsExt::mode(&meta.permissions());
        if mode & 0o777 != 0o777 {
            std::fs::set_permissions(
                dir,
                std::os::unix::fs::PermissionsExt::from_mode((mode & 0o7000) | 0o777),
            )
            .map_err(|e| format!("chmod {}: {e}", dir.display()))?;
        }
        if let Some(gid) = fs_group {
            // Only the directory itself, unless an earlier tinylet left a
            // volume without a marker: then what its containers wrote, by
            // the descriptor walk, once.
            match ownership::set_group(dir, gid, false) {
                Ok(w) if w.entries > 1 => info!(
                    "pod {}: volume {:?}: {} of {} entries given group {gid}",
                    crate::pod::pod_full_name(pod),
                    v.name,
                    w.changed,
                    w.entries
                ),
                Ok(_) => {}
                Err(e) => warn!(
                    "pod {}: volume {:?}: setting group {gid} failed, the volume is used as it is: {e}",
                    crate::pod::pod_full_name(pod),
                    v.name
                ),
            }
        }
        mark_ready(&self.root_dir, uid, &v.name)
            .map_err(|e| format!("mark volume ready at {}: {e}", marker.display()))
    }

    fn source(&self, what: &str) -> Result<&dyn ObjectSource, String> {
        self.source
            .as_deref()
            .ok_or_else(|| format!("{what} needs an apiserver, and this node has no --kubeconfig"))
    }

    /// The files of the Secret or ConfigMap `name` (all keys, or `items`).
    #[allow(clippy::too_many_arguments)]
    fn key_files(
        &self,
        ns: &str,
        kind: Kind,
        name: &str,
        items: Option<&[k8s_openapi::api::core::v1::KeyToPath]>,
        optional: bool,
        mode: u32,
        out: &mut payload::Payload,
    ) -> Result<(), String> {
        let (what, keys) = match kind {
            Kind::Secret => ("secret", self.source("a secret")?.secret(ns, name)?),
            Kind::ConfigMap => (
                "configmap",
                self.source("a configMap")?.config_map(ns, name)?,
            ),
        };
        payload::key_files(what, name, keys.as_ref(), items, optional, mode, out)
    }

    /// The files of a secret, configMap, downwardAPI or projected volume.
    fn payload(
        &self,
        pod: &Pod,
        v: &Volume,
        kept: &[KeptToken],
    ) -> Result<(payload::Payload, Vec<KeptToken>), String> {
        let ns = pod.metadata.namespace.as_deref().unwrap_or("default");
        let mut out = payload::Payload::new();
        let default = |m: Option<i32>| {
            m.map(|m| (m as u32) & 0o777)
                .unwrap_or(payload::DEFAULT_MODE)
        };
        if let Some(s) = &v.secret {
            let name = s.secret_name.as_deref().unwrap_or("");
            if name.is_empty() {
                return Err("secret.secretName is empty".into());
            }
            let (items, optional) = (s.items.as_deref(), s.optional.unwrap_or(false));
            let mode = default(s.default_mode);
            self.key_files(ns, Kind::Secret, name, items, optional, mode, &mut out)?;
            return Ok((out, Vec::new()));
        }
        if let Some(c) = &v.config_map {
            let (items, optional) = (c.items.as_deref(), c.optional.unwrap_or(false));
            let mode = default(c.default_mode);
            self.key_files(
                ns,
                Kind::ConfigMap,
                &c.name,
                items,
                optional,
                mode,
                &mut out,
            )?;
            return Ok((out, Vec::new()));
        }
        if let Some(d) = &v.downward_api {
            payload::downward_files(
                pod,
                d.items.as_deref().unwrap_or(&[]),
                default(d.default_mode),
                &self.allocatable,
                &mut out,
            )?;
            return Ok((out, Vec::new()));
        }
        let Some(p) = &v.projected else {
            return Ok((out, Vec::new()));
        };
        let mode = default(p.default_mode);
        let mut tokens = Vec::new();
        let now = SystemTime::now();
        for (i, src) in p.sources.iter().flatten().enumerate() {
            let at = |e: String| format!("projected.sources[{i}]: {e}");
            if let Some(s) = &src.secret {
                let (items, optional) = (s.items.as_deref(), s.optional.unwrap_or(false));
                self.key_files(ns, Kind::Secret, &s.name, items, optional, mode, &mut out)
                    .map_err(at)?;
            } else if let Some(c) = &src.config_map {
                let (items, optional) = (c.items.as_deref(), c.optional.unwrap_or(false));
                self.key_files(
                    ns,
                    Kind::ConfigMap,
                    &c.name,
                    items,
                    optional,
                    mode,
                    &mut out,
                )
                .map_err(at)?;
            } else if let Some(d) = &src.downward_api {
                payload::downward_files(
                    pod,
                    d.items.as_deref().unwrap_or(&[]),
                    mode,
                    &self.allocatable,
                    &mut out,
                )
                .map_err(at)?;
            } else if let Some(t) = &src.service_account_token {
                let seconds = t.expiration_seconds.unwrap_or(DEFAULT_TOKEN_SECONDS);
                if seconds < 600 {
                    return Err(at(format!(
                        "serviceAccountToken.expirationSeconds: {seconds} is less than 600"
                    )));
                }
                let token = match kept.iter().find(|k| k.index == i && k.due > now) {
                    Some(k) => k.clone(),
                    None => {
                        let token = self
                            .source("a service account token")?
                            .service_account_token(
                                pod,
                                t.audience.as_deref().filter(|a| !a.is_empty()),
                                seconds,
                            )
                            .map_err(at)?;
                        let due = refresh_time(&token, seconds);
                        KeptToken {
                            index: i,
                            token,
                            due,
                        }
                    }
                };
                let data = token.token.token.clone().into_bytes();
                tokens.push(token);
                if out.contains_key(&t.path) {
                    return Err(at(format!("two files at path {:?}", t.path)));
                }
                out.insert(t.path.clone(), payload::File { data, mode });
            } else {
                return Err(at(
                    "no supported source (secret, configMap, downwardAPI, serviceAccountToken)"
                        .into(),
                ));
            }
        }
        Ok((out, tokens))
    }
}

/// The file whose presence says that the emptyDir `name` of pod `uid` was
/// set up (upstream's ready file, in the same place):
/// `<root_dir>/pods/<uid>/plugins/kubernetes.io~empty-dir/<name>/ready`,
/// beside the volume and out of every container's reach.
pub(crate) fn ready_marker(root_dir: &Path, uid: &str, name: &str) -> std::io::Result<PathBuf> {
    let plugin = crate::paths::pod_dir(root_dir, uid)?
        .join(PLUGINS)
        .join(EMPTY_DIR);
    Ok(crate::paths::join(&plugin, name)?.join(READY))
}

/// Writes the ready marker of the emptyDir `name` of pod `uid`.
fn mark_ready(root_dir: &Path, uid: &str, name: &str) -> std::io::Result<()> {
    let dir = crate::paths::ensure_pod_dirs(root_dir, uid, &[PLUGINS, EMPTY_DIR, name])?;
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(dir.join(READY))
        .map(drop)
}

fn create_dir(dir: &Path, mode: u32) -> Result<(), String> {
    crate::paths::ensure_dir(dir, mode).map_err(|e| format!("create {}: {e}", dir.display()))
}

/// When a token must be replaced: after 80% of its lifetime, at most 24 h
/// after it was issued (upstream's token manager rule).
pub(crate) fn refresh_time(token: &Token, expiration_seconds: i64) -> SystemTime {
    // Checked throughout: a manifest may ask for any number of seconds, and
    // a lifetime beyond what SystemTime holds must not panic the worker.
    let ttl = Duration::from_secs(expiration_seconds.max(0).unsigned_abs());
    let issued = token.expires.checked_sub(ttl).unwrap_or(token.expires);
    let by_ttl = issued
        .checked_add(ttl.mul_f64(0.8))
        .unwrap_or(token.expires);
    by_ttl.min(issued.checked_add(MAX_TOKEN_AGE).unwrap_or(token.expires))
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{
        ConfigMapProjection, DownwardAPIProjection, DownwardAPIVolumeFile, KeyToPath,
        ObjectFieldSelector, PodSpec, ProjectedVolumeSource, SecretVolumeSource,
        ServiceAccountTokenProjection, VolumeProjection,
    };
    use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

    /// An apiserver stand-in: one secret, the root CA configmap, tokens
    /// that live `ttl` seconds; `down` makes every call fail.
    #[derive(Default)]
    struct Objects {
        tokens: AtomicU32,
        down: AtomicBool,
        ttl: i64,
        /// Bumped to change the root CA configmap's content.
        ca_version: AtomicU32,
    }

    impl ObjectSource for Objects {
        fn secret(&self, _ns: &str, name: &str) -> Result<Fetched, String> {
            if self.down.load(Ordering::SeqCst) {
                return Err("connection refused".into());
            }
            Ok((name == "tok").then(|| [("token".to_string(), b"s3cr3t".to_vec())].into()))
        }
        fn config_map(&self, _ns: &str, name: &str) -> Result<Fetched, String> {
            if self.down.load(Ordering::SeqCst) {
                return Err("connection refused".into());
            }
            let ca = match self.ca_version.load(Ordering::SeqCst) {
                0 => "PEM".to_string(),
                v => format!("PEM{v}"),
            };
            Ok((name == "kube-root-ca.crt")
                .then(|| [("ca.crt".to_string(), ca.into_bytes())].into()))
        }
        fn service_account_token(
            &self,
            _pod: &Pod,
            _audience: Option<&str>,
            _seconds: i64,
        ) -> Result<Token, String> {
            if self.down.load(Ordering::SeqCst) {
                return Err("connection refused".into());
            }
            let n = self.tokens.fetch_add(1, Ordering::SeqCst) + 1;
            Ok(Token {
                token: format!("jwt-{n}"),
                expires: SystemTime::now() + Duration::from_secs(self.ttl as u64),
            })
        }
    }

    fn pod(volumes: Vec<Volume>) -> Pod {
        let mut p = Pod::default();
        p.metadata.name = Some("web".into());
        p.metadata.namespace = Some("default".into());
        p.metadata.uid = Some("uid-1".into());
        p.spec = Some(PodSpec {
            volumes: Some(volumes),
            ..Default::default()
        });
        p
    }

    fn secret_volume(name: &str, secret: &str) -> Volume {
        Volume {
            name: name.into(),
            secret: Some(SecretVolumeSource {
                secret_name: Some(secret.into()),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    /// The shape of the API's `kube-api-access-*` volume.
    fn api_access(expiration: i64) -> Volume {
        Volume {
            name: "kube-api-access-x".into(),
            projected: Some(ProjectedVolumeSource {
                default_mode: Some(0o644),
                sources: Some(vec![
                    VolumeProjection {
                        service_account_token: Some(ServiceAccountTokenProjection {
                            expiration_seconds: Some(expiration),
                            path: "token".into(),
                            audience: None,
                        }),
                        ..Default::default()
                    },
                    VolumeProjection {
                        config_map: Some(ConfigMapProjection {
                            name: "kube-root-ca.crt".into(),
                            items: Some(vec![KeyToPath {
                                key: "ca.crt".into(),
                                path: "ca.crt".into(),
                                mode: None,
                            }]),
                            optional: None,
                        }),
                        ..Default::default()
                    },
                    VolumeProjection {
                        downward_api: Some(DownwardAPIProjection {
                            items: Some(vec![DownwardAPIVolumeFile {
                                path: "namespace".into(),
                                field_ref: Some(ObjectFieldSelector {
                                    field_path: "metadata.namespace".into(),
                                    api_version: Some("v1".into()),
                                }),
                                ..Default::default()
                            }]),
                        }),
                        ..Default::default()
                    },
                ]),
            }),
            ..Default::default()
        }
    }

    struct Rig {
        _root: tempfile::TempDir,
        root: PathBuf,
        objects: Arc<Objects>,
        vm: VolumeManager,
        /// What a worker would keep of each pod's volumes, by UID.
        set_up: HashMap<String, PodVolumes>,
    }

    impl Rig {
        /// `vm.setup` as the pod's worker calls it.
        fn setup(&mut self, p: &Pod) -> Result<(), VolumeError> {
            let uid = crate::pod::pod_uid(p).to_string();
            self.vm.setup(p, self.set_up.entry(uid).or_default())
        }
    }

    impl Drop for Rig {
        fn drop(&mut self) {
            let _ = crate::mount::unmount_below(&self.root);
        }
    }

    fn rig(ttl: i64) -> Rig {
        let root = tempfile::tempdir().unwrap();
        let objects = Arc::new(Objects {
            ttl,
            ..Default::default()
        });
        let source: Arc<dyn ObjectSource> = objects.clone();
        let path = root.path().to_path_buf();
        Rig {
            root: path.clone(),
            _root: root,
            objects,
            vm: VolumeManager::new(
                path,
                Some(source),
                NodeAllocatable::default(),
                EventRecorder::disabled(),
            ),
            set_up: HashMap::new(),
        }
    }

    fn rigged(ttl: i64) -> Rig {
        rig(ttl)
    }

    fn read(dir: &Path, file: &str) -> String {
        std::fs::read_to_string(dir.join(file)).unwrap_or_default()
    }

    #[test]
    fn a_secret_volume_is_a_tmpfs_with_the_secret_files_and_goes_with_the_pod() {
        let mut r = rigged(3600);
        let p = pod(vec![secret_volume("sa", "tok")]);
        r.setup(&p).unwrap();
        let dir = volumes_dir(&r.root, "uid-1")
            .unwrap()
            .join(SECRET)
            .join("sa");
        assert_eq!(read(&dir, "token"), "s3cr3t");
        assert!(
            crate::mount::is_mount_point(&dir).unwrap(),
            "secrets live on tmpfs"
        );

        r.vm.teardown("uid-1").unwrap();
        assert!(!crate::mount::is_mount_point(&dir).unwrap());
        assert!(crate::mount::mounts_below(&r.root).unwrap().is_empty());
    }

    #[test]
    fn orphaned_pod_dirs_go_with_their_mounts_and_claimed_ones_stay() {
        let mut r = rigged(3600);
        // uid-1 gets a tmpfs secret volume; nothing claims it any more.
        r.setup(&pod(vec![secret_volume("sa", "tok")])).unwrap();
        let kept = r.root.join("pods").join("kept");
        std::fs::create_dir_all(kept.join("volumes")).unwrap();
        std::fs::write(r.root.join("pods").join("a-file"), "x").unwrap();

        let failed = remove_orphaned_pod_dirs(&r.root, |uid| uid == "kept");
        assert!(failed.is_empty(), "{failed:?}");
        assert!(!r.root.join("pods").join("uid-1").exists());
        assert!(crate::mount::mounts_below(&r.root).unwrap().is_empty());
        assert!(kept.join("volumes").is_dir());
        assert!(
            r.root.join("pods").join("a-file").exists(),
            "only directories are pods"
        );
        // No pods directory at all is nothing to do.
        let empty = tempfile::tempdir().unwrap();
        assert!(remove_orphaned_pod_dirs(empty.path(), |_| false).is_empty());
    }

    #[test]
    fn a_missing_secret_fails_the_first_setup_with_its_name() {
        let mut r = rigged(3600);
        let p = pod(vec![secret_volume("sa", "gone")]);
        let e = r.setup(&p).unwrap_err();
        assert_eq!(
            e.to_string(),
            "MountVolume.SetUp failed for volume \"sa\" : secret \"gone\" not found"
        );
    }

    #[test]
    fn the_service_account_volume_gets_a_token_the_ca_and_the_namespace() {
        let mut r = rigged(3600);
        let p = pod(vec![api_access(3600)]);
        r.setup(&p).unwrap();
        let dir = volumes_dir(&r.root, "uid-1")
            .unwrap()
            .join(PROJECTED)
            .join("kube-api-access-x");
        assert_eq!(read(&dir, "token"), "jwt-1");
        assert_eq!(read(&dir, "ca.crt"), "PEM");
        assert_eq!(read(&dir, "namespace"), "default");
        assert!(crate::mount::is_mount_point(&dir).unwrap());
        // Not due yet: no new token at the next sync.
        r.setup(&p).unwrap();
        assert_eq!(r.objects.tokens.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn objects_and_labels_that_change_are_written_again_at_the_next_sync() {
        let mut r = rigged(3600);
        let mut v = api_access(3600);
        if let Some(p) = v.projected.as_mut() {
            p.sources.as_mut().unwrap().push(VolumeProjection {
                downward_api: Some(DownwardAPIProjection {
                    items: Some(vec![DownwardAPIVolumeFile {
                        path: "labels".into(),
                        field_ref: Some(ObjectFieldSelector {
                            field_path: "metadata.labels".into(),
                            api_version: None,
                        }),
                        ..Default::default()
                    }]),
                }),
                ..Default::default()
            });
        }
        let mut p = pod(vec![v]);
        p.metadata.labels = Some([("tier".to_string(), "web".to_string())].into());
        r.setup(&p).unwrap();
        let dir = volumes_dir(&r.root, "uid-1")
            .unwrap()
            .join(PROJECTED)
            .join("kube-api-access-x");
        assert_eq!(read(&dir, "ca.crt"), "PEM");
        assert_eq!(read(&dir, "labels"), "tier=\"web\"");
        let first = std::fs::read_link(dir.join(writer::DATA_LINK)).unwrap();

        // The configmap changed: its file follows, in a new `..data`.
        r.objects.ca_version.store(2, Ordering::SeqCst);
        r.setup(&p).unwrap();
        assert_eq!(read(&dir, "ca.crt"), "PEM2");
        let second = std::fs::read_link(dir.join(writer::DATA_LINK)).unwrap();
        assert_ne!(first, second);
        assert!(!dir.join(&first).exists(), "the old set is gone");
        // The labels changed (a metadata-only update of the pod).
        p.metadata.labels = Some([("tier".to_string(), "db".to_string())].into());
        r.setup(&p).unwrap();
        assert_eq!(read(&dir, "labels"), "tier=\"db\"");
        // The token, not due, was kept throughout.
        assert_eq!(read(&dir, "token"), "jwt-1");
        assert_eq!(r.objects.tokens.load(Ordering::SeqCst), 1);
        // Nothing changed: nothing is written.
        let third = std::fs::read_link(dir.join(writer::DATA_LINK)).unwrap();
        r.setup(&p).unwrap();
        assert_eq!(
            third,
            std::fs::read_link(dir.join(writer::DATA_LINK)).unwrap()
        );
    }

    #[test]
    fn a_due_token_is_replaced_and_a_failed_refresh_keeps_the_old_one() {
        // A token that lived 80% of its life at once: due at every sync.
        let mut r = rigged(0);
        let p = pod(vec![api_access(3600)]);
        r.setup(&p).unwrap();
        let dir = volumes_dir(&r.root, "uid-1")
            .unwrap()
            .join(PROJECTED)
            .join("kube-api-access-x");
        assert_eq!(read(&dir, "token"), "jwt-1");
        r.setup(&p).unwrap();
        assert_eq!(read(&dir, "token"), "jwt-2");

        r.objects.down.store(true, Ordering::SeqCst);
        r.setup(&p).expect("a failed refresh does not stop the pod");
        assert_eq!(read(&dir, "token"), "jwt-2");
        r.objects.down.store(false, Ordering::SeqCst);
        r.setup(&p).unwrap();
        assert_eq!(read(&dir, "token"), "jwt-3");
    }

    #[test]
    fn files_left_by_an_earlier_run_carry_a_pod_through_an_outage() {
        let mut r = rigged(3600);
        let p = pod(vec![secret_volume("sa", "tok")]);
        r.setup(&p).unwrap();
        // A restarted tinylet (no memory of the volume) while the apiserver is away.
        r.set_up.clear();
        r.objects.down.store(true, Ordering::SeqCst);
        r.setup(&p).expect("the files from before are used");
        let dir = volumes_dir(&r.root, "uid-1")
            .unwrap()
            .join(SECRET)
            .join("sa");
        assert_eq!(read(&dir, "token"), "s3cr3t");
    }

    #[test]
    fn standalone_nodes_refuse_api_volumes_but_serve_the_downward_api() {
        let root = tempfile::tempdir().unwrap();
        let vm = VolumeManager::new(
            root.path().to_path_buf(),
            None,
            NodeAllocatable::default(),
            EventRecorder::disabled(),
        );
        let e = vm
            .setup(
                &pod(vec![secret_volume("sa", "tok")]),
                &mut PodVolumes::default(),
            )
            .unwrap_err();
        assert!(e.message.contains("needs an apiserver"), "{e}");

        let mut v = api_access(3600);
        if let Some(p) = v.projected.as_mut() {
            p.sources.as_mut().unwrap().drain(..2);
        }
        vm.setup(&pod(vec![v]), &mut PodVolumes::default()).unwrap();
        let dir = volumes_dir(root.path(), "uid-1")
            .unwrap()
            .join(PROJECTED)
            .join("kube-api-access-x");
        assert_eq!(read(&dir, "namespace"), "default");
        vm.teardown("uid-1").unwrap();
    }

    #[test]
    fn fs_group_owns_volume_files_and_empty_dirs_are_world_writable() {
        use std::os::unix::fs::MetadataExt;
        let mut r = rigged(3600);
        let mut p = pod(vec![
            secret_volume("sa", "tok"),
            Volume {
                name: "scratch".into(),
                empty_dir: Some(Default::default()),
                ..Default::default()
            },
        ]);
        if let Some(spec) = p.spec.as_mut() {
            spec.security_context = Some(k8s_openapi::api::core::v1::PodSecurityContext {
                fs_group: Some(2000),
                ..Default::default()
            });
        }
        r.setup(&p).unwrap();
        let vols = volumes_dir(&r.root, "uid-1").unwrap();
        let token = std::fs::metadata(vols.join(SECRET).join("sa/token")).unwrap();
        assert_eq!(token.gid(), 2000);
        assert_eq!(token.mode() & 0o040, 0o040, "group may read the token");
        let scratch = std::fs::metadata(vols.join(EMPTY_DIR).join("scratch")).unwrap();
        assert_eq!(scratch.gid(), 2000);
        assert_eq!(scratch.mode() & 0o2777, 0o2777);
        // Set up again (a restarted tinylet): the unchanged files stay.
        let data =
            std::fs::read_link(vols.join(SECRET).join("sa").join(writer::DATA_LINK)).unwrap();
        r.set_up.clear();
        r.setup(&p).unwrap();
        let again =
            std::fs::read_link(vols.join(SECRET).join("sa").join(writer::DATA_LINK)).unwrap();
        assert_eq!(
            data, again,
            "files with the group's bits count as unchanged"
        );

        // Without fsGroup nothing is chowned, but emptyDir is still 0777.
        let mut q = pod(vec![Volume {
            name: "scratch".into(),
            empty_dir: Some(Default::default()),
            ..Default::default()
        }]);
        q.metadata.uid = Some("uid-2".into());
        r.setup(&q).unwrap();
        let scratch = std::fs::metadata(
            volumes_dir(&r.root, "uid-2")
                .unwrap()
                .join(EMPTY_DIR)
                .join("scratch"),
        )
        .unwrap();
        assert_eq!(scratch.gid(), 0);
        assert_eq!(scratch.mode() & 0o7777, 0o777);
    }

    fn fs_group_pod(volumes: Vec<Volume>) -> Pod {
        let mut p = pod(volumes);
        if let Some(spec) = p.spec.as_mut() {
            spec.security_context = Some(k8s_openapi::api::core::v1::PodSecurityContext {
                fs_group: Some(2000),
                ..Default::default()
            });
        }
        p
    }

    fn empty_dir(name: &str, medium: Option<&str>) -> Volume {
        Volume {
            name: name.into(),
            empty_dir: Some(EmptyDirVolumeSource {
                medium: medium.map(str::to_string),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn gid_mode(p: &Path) -> (u32, u32) {
        use std::os::unix::fs::MetadataExt;
        let m = std::fs::symlink_metadata(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
        (m.gid(), m.mode() & 0o7777)
    }

    #[test]
    fn an_empty_dir_is_given_the_group_at_its_first_set_up_only() {
        use std::os::unix::fs::PermissionsExt;
        let mut r = rigged(3600);
        let p = fs_group_pod(vec![empty_dir("scratch", None)]);
        r.setup(&p).unwrap();
        let dir = volumes_dir(&r.root, "uid-1")
            .unwrap()
            .join(EMPTY_DIR)
            .join("scratch");
        assert_eq!(gid_mode(&dir), (2000, 0o2777));
        let marker = ready_marker(&r.root, "uid-1", "scratch").unwrap();
        assert!(marker.is_file(), "no ready marker at {}", marker.display());
        assert!(
            !marker.starts_with(&dir),
            "the marker is out of the containers' reach"
        );

        // What a root container does in its volume: its own group and modes.
        std::fs::write(dir.join("f"), "x").unwrap();
        std::fs::set_permissions(dir.join("f"), std::fs::Permissions::from_mode(0o600)).unwrap();
        std::os::unix::fs::chown(dir.join("f"), None, Some(0)).unwrap();
        std::os::unix::fs::chown(&dir, None, Some(0)).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        // A restarted tinylet sets the volume up again: nothing is walked.
        r.set_up.clear();
        r.setup(&p).unwrap();
        assert_eq!(gid_mode(&dir.join("f")), (0, 0o600));
        assert_eq!(gid_mode(&dir), (0, 0o755));
    }

    #[test]
    fn an_empty_dir_without_a_marker_is_walked_once() {
        use std::os::unix::fs::PermissionsExt;
        let mut r = rigged(3600);
        // Left by an earlier tinylet, which kept no marker, with what its
        // containers wrote.
        let dir = volumes_dir(&r.root, "uid-1")
            .unwrap()
            .join(EMPTY_DIR)
            .join("scratch");
        std::fs::create_dir_all(dir.join("sub")).unwrap();
        std::fs::write(dir.join("sub/f"), "x").unwrap();
        std::fs::set_permissions(dir.join("sub/f"), std::fs::Permissions::from_mode(0o600))
            .unwrap();
        let p = fs_group_pod(vec![empty_dir("scratch", None)]);
        r.setup(&p).unwrap();
        assert_eq!(gid_mode(&dir.join("sub/f")), (2000, 0o660));
        assert_eq!(gid_mode(&dir.join("sub")).0, 2000);
        assert_eq!(std::fs::read_to_string(dir.join("sub/f")).unwrap(), "x");

        std::os::unix::fs::chown(dir.join("sub/f"), None, Some(0)).unwrap();
        std::os::unix::fs::chown(&dir, None, Some(0)).unwrap();
        r.set_up.clear();
        r.setup(&p).unwrap();
        assert_eq!(gid_mode(&dir.join("sub/f")).0, 0, "walked a second time");
    }

    #[test]
    fn an_empty_dir_that_is_gone_is_set_up_again() {
        let mut r = rigged(3600);
        let p = fs_group_pod(vec![
            empty_dir("mem", Some("Memory")),
            empty_dir("disk", None),
        ]);
        r.setup(&p).unwrap();
        let vols = volumes_dir(&r.root, "uid-1").unwrap().join(EMPTY_DIR);
        assert!(crate::mount::is_mount_point(&vols.join("mem")).unwrap());
        // A reboot took the tmpfs; someone removed the other directory.
        crate::mount::unmount_below(&vols.join("mem")).unwrap();
        std::fs::remove_dir(vols.join("disk")).unwrap();
        r.set_up.clear();
        r.setup(&p).unwrap();
        assert!(crate::mount::is_mount_point(&vols.join("mem")).unwrap());
        assert_eq!(gid_mode(&vols.join("mem")), (2000, 0o2777));
        assert_eq!(gid_mode(&vols.join("disk")), (2000, 0o2777));
        assert!(ready_marker(&r.root, "uid-1", "disk").unwrap().is_file());
    }

    #[test]
    fn a_host_path_of_the_wrong_type_fails_the_set_up_with_upstreams_message() {
        let mut r = rigged(3600);
        let file = r.root.join("a-file");
        std::fs::write(&file, "x").unwrap();
        let host_path = |name: &str, path: &Path, kind: &str| Volume {
            name: name.into(),
            host_path: Some(k8s_openapi::api::core::v1::HostPathVolumeSource {
                path: path.display().to_string(),
                type_: Some(kind.into()),
            }),
            ..Default::default()
        };
        let made = r.root.join("made");
        let p = pod(vec![
            host_path("made", &made, "DirectoryOrCreate"),
            host_path("h", &file, "Directory"),
        ]);
        let e = r.setup(&p).unwrap_err();
        assert_eq!(
            e.to_string(),
            format!(
                "MountVolume.SetUp failed for volume \"h\" : hostPath type check failed: {} is not a directory, it's a File",
                file.display()
            )
        );
        assert!(made.is_dir(), "DirectoryOrCreate made the directory");
        // Once the path is as asked, the next sync sets the pod up.
        std::fs::remove_file(&file).unwrap();
        std::fs::create_dir(&file).unwrap();
        r.setup(&p).unwrap();
    }
}
