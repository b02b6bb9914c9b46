//! Image garbage collection (upstream's image GC manager): when the image
//! filesystem's use reaches `--image-gc-high-threshold` percent, unused
//! images are removed, least recently used first, until it is down to
//! `--image-gc-low-threshold`. Never an image a container (running or
//! exited) uses, never the runtime's sandbox image or a pinned one, never
//! one first seen less than `--minimum-image-ttl-duration` ago.
//!
//! One `image-gc` thread runs a pass at start and every 5 minutes (upstream's
//! period). It only reads the runtime and removes images; pods are never
//! touched.

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use log::{debug, info, warn};

use crate::cri::{api, CriError, ImageService, RuntimeService};
use crate::events::{EventRecorder, EventType, ObjectRef};

/// How often a pass runs (upstream `ImageGCPeriod`).
pub(crate) const PERIOD: Duration = Duration::from_secs(300);

/// The thresholds and age limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Policy {
    /// Percent of the image filesystem in use that starts a collection.
    pub(crate) high_threshold: u8,
    /// Percent a collection tries to get down to.
    pub(crate) low_threshold: u8,
    /// Images first seen more recently are left alone.
    pub(crate) min_age: Duration,
}

impl Default for Policy {
    fn default() -> Self {
        Policy {
            high_threshold: 85,
            low_threshold: 80,
            min_age: Duration::from_secs(120),
        }
    }
}

impl Policy {
    /// The kubelet's validation of the two thresholds.
    pub(crate) fn validate(&self) -> Result<(), String> {
        if self.high_threshold > 100 {
            return Err(format!(
                "--image-gc-high-threshold {} must be between 0 and 100",
                self.high_threshold
            ));
        }
        if self.low_threshold > 100 {
            return Err(format!(
                "--image-gc-low-threshold {} must be between 0 and 100",
                self.low_threshold
            ));
        }
        if self.low_threshold >= self.high_threshold && self.high_threshold != 100 {
            return Err(format!(
                "--image-gc-low-threshold {} must be less than --image-gc-high-threshold {}",
                self.low_threshold, self.high_threshold
            ));
        }
        Ok(())
    }

    /// A high threshold of 100 turns image GC off, as upstream.
    pub(crate) fn enabled(&self) -> bool {
        self.high_threshold < 100
    }

    /// Bytes to free on a filesystem of `capacity` bytes with `available`
    /// free, or 0 when use is below the high threshold.
    pub(crate) fn bytes_to_free(&self, capacity: u64, available: u64) -> u64 {
        if capacity == 0 {
            return 0;
        }
        let available = available.min(capacity);
        let used_percent = 100 - (available as u128 * 100 / capacity as u128) as u64;
        if used_percent < u64::from(self.high_threshold) {
            return 0;
        }
        let target_free = capacity as u128 * u128::from(100 - self.low_threshold) / 100;
        target_free.saturating_sub(available as u128) as u64
    }
}

/// What the manager remembers of an image it has seen.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Record {
    first_seen: SystemTime,
    last_used: SystemTime,
    /// Why its last removal failed: the same failure again is not warned
    /// about at every pass.
    removal_error: Option<String>,
}

/// An image as GC sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Candidate {
    pub(crate) id: String,
    pub(crate) size: u64,
    first_seen: SystemTime,
    last_used: SystemTime,
}

/// The images to remove, in order, to free `bytes` (pure): unused, not
/// protected, old enough, least recently used (then oldest seen) first.
/// Returns them and the bytes they free.
pub(crate) fn plan(
    mut candidates: Vec<Candidate>,
    bytes: u64,
    now: SystemTime,
    min_age: Duration,
) -> (Vec<Candidate>, u64) {
    candidates.retain(|c| {
        now.duration_since(c.first_seen)
            .map(|age| age >= min_age)
            .unwrap_or(false)
    });
    candidates.sort_by(|a, b| {
        (a.last_used, a.first_seen, &a.id).cmp(&(b.last_used, b.first_seen, &b.id))
    });
    let mut freed = 0u64;
    let mut out = Vec::new();
    for c in candidates {
        if freed >= bytes {
            break;
        }
        freed = freed.saturating_add(c.size);
        out.push(c);
    }
    (out, freed)
}

/// The runtime's sandbox (pause) image from its verbose status, where
/// containerd reports it (`config.sandboxImage`).
pub(crate) fn sandbox_image(info: &HashMap<String, String>) -> Option<String> {
    let config: serde_json::Value = serde_json::from_str(info.get("config")?).ok()?;
    config
        .get("sandboxImage")
        .and_then(|v| v.as_str())
        .filter(|s| !s.is_empty())
        .map(String::from)
}

pub(crate) struct ImageGc {
    runtime: Arc<dyn RuntimeService>,
    images: Arc<dyn ImageService>,
    policy: Policy,
    recorder: EventRecorder,
    node: String,
    records: HashMap<String, Record>,
    /// Whether the records come from a first pass (images seen then count
    /// as old: their age is unknown, as upstream assumes).
    initialized: bool,
}

/// What one pass did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct Pass {
    pub(crate) wanted: u64,
    pub(crate) freed: u64,
    pub(crate) removed: Vec<String>,
}

impl ImageGc {
    pub(crate) fn new(
        runtime: Arc<dyn RuntimeService>,
        images: Arc<dyn ImageService>,
        policy: Policy,
        recorder: EventRecorder,
        node: &str,
    ) -> Self {
        ImageGc {
            runtime,
            images,
            policy,
            recorder,
            node: node.to_string(),
            records: HashMap::new(),
            initialized: false,
        }
    }

    /// Images in use: by any container, and the sandbox image.
    fn in_use(&self, images: &[api::Image]) -> Result<HashSet<String>, CriError> {
        let mut refs: HashSet<String> = HashSet::new();
        for c in self.runtime.list_containers(None)? {
            refs.insert(c.image_ref.clone());
            if let Some(spec) = c.image.as_ref() {
                refs.insert(spec.image.clone());
            }
        }
        if let Ok(info) = self.runtime.status_info() {
            if let Some(img) = sandbox_image(&info) {
                refs.insert(img);
            }
        }
        let matches = |img: &api::Image, r: &str| {
            img.id == r
                || img.repo_tags.iter().any(|t| t == r)
                || img.repo_digests.iter().any(|d| d == r)
        };
        Ok(images
            .iter()
            .filter(|img| img.pinned || refs.iter().any(|r| matches(img, r)))
            .map(|img| img.id.clone())
            .collect())
    }

    /// One pass: measure, and remove what is needed. `fs` gives capacity
    /// and available bytes of the image filesystem's mount point.
    pub(crate) fn collect(
        &mut self,
        now: SystemTime,
        fs: &dyn Fn(&Path) -> std::io::Result<(u64, u64)>,
    ) -> Result<Pass, String> {
        self.pass(now, Some(fs))
    }

    /// Removes every unused image old enough, whatever the thresholds
    /// (upstream `DeleteUnusedImages`, the eviction manager's reclaim).
    pub(crate) fn free_unused(&mut self, now: SystemTime) -> Result<Pass, String> {
        self.pass(now, None)
    }

    /// A pass that frees what the thresholds ask (`fs` given) or all it can.
    fn pass(&mut self, now: SystemTime, fs: Option<FsStat>) -> Result<Pass, String> {
        let usage = self
            .images
            .image_fs_info()
            .map_err(|e| format!("image filesystem info: {e}"))?;
        let mount = usage
            .first()
            .and_then(|u| u.fs_id.as_ref())
            .map(|f| f.mountpoint.clone())
            .filter(|m| !m.is_empty())
            .ok_or("the runtime reports no image filesystem")?;
        let images = self
            .images
            .list_images(None)
            .map_err(|e| format!("list images: {e}"))?;
        let in_use = self
            .in_use(&images)
            .map_err(|e| format!("list containers: {e}"))?;

        // Records: new images are seen now (or "long ago" on the first
        // pass), images in use are used now, removed images are forgotten.
        let seen_at = if self.initialized {
            now
        } else {
            SystemTime::UNIX_EPOCH
        };
        self.initialized = true;
        let present: HashSet<&str> = images.iter().map(|i| i.id.as_str()).collect();
        self.records.retain(|id, _| present.contains(id.as_str()));
        for img in &images {
            let r = self.records.entry(img.id.clone()).or_insert(Record {
                first_seen: seen_at,
                last_used: SystemTime::UNIX_EPOCH,
                removal_error: None,
            });
            if in_use.contains(&img.id) {
                r.last_used = now;
            }
        }

        let wanted = match fs {
            Some(fs) => {
                let (capacity, available) =
                    fs(Path::new(&mount)).map_err(|e| format!("statfs {mount}: {e}"))?;
                if capacity == 0 {
                    return Err(format!("invalid capacity 0 on image filesystem {mount}"));
                }
                let wanted = self.policy.bytes_to_free(capacity, available);
                if wanted == 0 {
                    debug!("image GC: {mount} below {}%", self.policy.high_threshold);
                    return Ok(Pass::default());
                }
                info!(
                    "image GC: {mount} at {}% (high threshold {}%), freeing {wanted} bytes to get to {}%",
                    100 - available.min(capacity) as u128 * 100 / capacity as u128,
                    self.policy.high_threshold,
                    self.policy.low_threshold
                );
                wanted
            }
            None => u64::MAX,
        };
        let candidates = images
            .iter()
            .filter(|img| !in_use.contains(&img.id))
            .filter_map(|img| {
                let r = self.records.get(&img.id)?;
                Some(Candidate {
                    id: img.id.clone(),
                    size: img.size,
                    first_seen: r.first_seen,
                    last_used: r.last_used,
                })
            })
            .collect();
        let (chosen, _) = plan(candidates, wanted, now, self.policy.min_age);
        let mut pass = Pass {
            wanted,
            ..Pass::default()
        };
        for c in chosen {
            let mut spec = api::ImageSpec::new();
            spec.image = c.id.clone();
            match self.images.remove_image(&spec) {
                Ok(()) => {
                    info!("image GC: removed image {} ({} bytes)", c.id, c.size);
                    self.records.remove(&c.id);
                    pass.freed = pass.freed.saturating_add(c.size);
                    pass.removed.push(c.id);
                }
                Err(e) => {
                    let e = e.to_string();
                    let again = self
                        .records
                        .get(&c.id)
                        .is_some_and(|r| r.removal_error.as_deref() == Some(e.as_str()));
                    if again {
                        debug!("image GC: remove image {}: {e} (again)", c.id);
                    } else {
                        warn!(
                            "image GC: remove image {}: {e}; tried again at each pass",
                            c.id
                        );
                    }
                    if let Some(r) = self.records.get_mut(&c.id) {
                        r.removal_error = Some(e);
                    }
                }
            }
        }
        if pass.freed < wanted && wanted != u64::MAX {
            let message = format!(
                "Failed to garbage collect required amount of images. Attempted to free {wanted} bytes, but only found {} bytes eligible to free.",
                pass.freed
            );
            warn!("image GC: {message}");
            self.recorder.event(
                &ObjectRef::node(&self.node),
                EventType::Warning,
                "FreeDiskSpaceFailed",
                message,
            );
        }
        Ok(pass)
    }
}

/// How a pass measures a filesystem: capacity and available bytes.
type FsStat<'a> = &'a dyn Fn(&Path) -> std::io::Result<(u64, u64)>;

/// Handle of the `image-gc` thread; dropping it stops and joins the thread.
pub(crate) struct ImageGcThread {
    _stop: crossbeam_channel::Sender<()>,
    requests: crossbeam_channel::Sender<crossbeam_channel::Sender<Result<Pass, String>>>,
    _thread: crate::thread::JoinOnDrop<()>,
}

impl ImageGcThread {
    /// A handle through which other threads ask for unused images to go.
    pub(crate) fn handle(&self) -> ImageGcHandle {
        ImageGcHandle(self.requests.clone())
    }
}

/// Asks the `image-gc` thread to remove every unused image now.
#[derive(Clone)]
pub(crate) struct ImageGcHandle(
    crossbeam_channel::Sender<crossbeam_channel::Sender<Result<Pass, String>>>,
);

impl ImageGcHandle {
    /// Waits for the pass (the thread may be in a pass of its own first).
    pub(crate) fn free_unused(&self) -> Result<Pass, String> {
        let (tx, rx) = crossbeam_channel::bounded(1);
        self.0
            .send(tx)
            .map_err(|_| "the image GC thread is gone".to_string())?;
        rx.recv()
            .map_err(|_| "the image GC thread is gone".to_string())?
    }
}

/// Starts the `image-gc` thread: with `periodic`, a pass now, then one
/// every [`PERIOD`]; it also serves [`ImageGcHandle::free_unused`].
pub(crate) fn start(mut gc: ImageGc, periodic: bool) -> std::io::Result<ImageGcThread> {
    let (stop_tx, stop_rx) = crossbeam_channel::bounded::<()>(0);
    // One request at a time: the asking thread waits for its answer.
    let (req_tx, req_rx) =
        crossbeam_channel::bounded::<crossbeam_channel::Sender<Result<Pass, String>>>(1);
    let thread = crate::thread::spawn_named("image-gc", move || {
        let mut next = std::time::Instant::now();
        loop {
            let wait = if periodic {
                crossbeam_channel::at(next)
            } else {
                crossbeam_channel::never()
            };
            crossbeam_channel::select! {
                recv(stop_rx) -> _ => break,
                recv(req_rx) -> r => {
                    let Ok(reply) = r else { break };
                    let _ = reply.send(gc.free_unused(SystemTime::now()));
                }
                recv(wait) -> _ => {
                    if let Err(e) = gc.collect(SystemTime::now(), &statfs) {
                        warn!("image GC: {e}");
                    }
                    next = std::time::Instant::now() + PERIOD;
                }
            }
        }
    })?;
    Ok(ImageGcThread {
        _stop: stop_tx,
        requests: req_tx,
        _thread: thread,
    })
}

/// Capacity and available bytes of the filesystem holding `path`.
pub(crate) fn statfs(path: &Path) -> std::io::Result<(u64, u64)> {
    let s = crate::node::machine::fs_stats(path)?;
    Ok((s.capacity, s.available))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn candidate(id: &str, size: u64, seen_ago: u64, used_ago: u64, now: SystemTime) -> Candidate {
        Candidate {
            id: id.into(),
            size,
            first_seen: now - Duration::from_secs(seen_ago),
            last_used: now - Duration::from_secs(used_ago),
        }
    }

    #[test]
    fn thresholds_decide_how_much_to_free() {
        let p = Policy::default();
        // 84% used: nothing.
        assert_eq!(p.bytes_to_free(100, 16), 0);
        // 85% used: down to 80%, 5 bytes.
        assert_eq!(p.bytes_to_free(100, 15), 5);
        assert_eq!(p.bytes_to_free(1000, 100), 100);
        // Off at 100, and a zero-sized filesystem frees nothing.
        assert!(!Policy {
            high_threshold: 100,
            ..p
        }
        .enabled());
        assert_eq!(p.bytes_to_free(0, 0), 0);
    }

    #[test]
    fn low_must_be_below_high() {
        let bad = Policy {
            high_threshold: 50,
            low_threshold: 50,
            min_age: Duration::ZERO,
        };
        assert!(bad.validate().unwrap_err().contains("must be less than"));
        assert!(Policy {
            high_threshold: 101,
            ..Policy::default()
        }
        .validate()
        .is_err());
        Policy::default().validate().unwrap();
    }

    #[test]
    fn least_recently_used_old_enough_images_go_first_until_enough_is_freed() {
        let now = SystemTime::now();
        let cands = vec![
            candidate("recent-use", 50, 1000, 10, now),
            candidate("stale", 30, 1000, 900, now),
            candidate("never-used", 20, 1000, 1000, now),
            candidate("too-young", 500, 60, 60, now),
        ];
        let (chosen, freed) = plan(cands.clone(), 40, now, Duration::from_secs(120));
        let ids: Vec<_> = chosen.iter().map(|c| c.id.as_str()).collect();
        assert_eq!(ids, ["never-used", "stale"]);
        assert_eq!(freed, 50);
        // Asking for more than there is takes every eligible one, never the young.
        let (chosen, freed) = plan(cands, 10_000, now, Duration::from_secs(120));
        assert_eq!(chosen.len(), 3);
        assert_eq!(freed, 100);
    }

    #[test]
    fn containerd_reports_its_sandbox_image_in_the_verbose_config() {
        let info: HashMap<String, String> = [(
            "config".to_string(),
            r#"{"sandboxImage":"registry.k8s.io/pause:3.9","other":1}"#.to_string(),
        )]
        .into();
        assert_eq!(
            sandbox_image(&info).as_deref(),
            Some("registry.k8s.io/pause:3.9")
        );
        assert_eq!(sandbox_image(&HashMap::new()), None);
        let bad: HashMap<String, String> = [("config".to_string(), "{".to_string())].into();
        assert_eq!(sandbox_image(&bad), None);
    }
}
