//! The `eviction-manager` thread (upstream's eviction manager loop): every
//! 10 s it observes the node's signals, updates the pressure conditions
//! (read by the node status and admission through [`super::State`]),
//! evicts pods over their local storage limits, and when a threshold's
//! grace period is over reclaims what the node holds itself before it
//! evicts one pod.
//!
//! Local storage limits are checked on the pods that set one, their
//! volumes and logs walked afresh at every turn (`stats::pod_usage`); a
//! walk that stopped short counts as over the limit. Under pressure every
//! pod is measured for the ranking, reusing what this turn measured (the
//! measures are kept in `stats::UsageCache`, which the summary reads too).
//!
//! For the disk signals the node-level reclaim is, in order, unused
//! images (through the `image-gc` thread, which owns the images' records),
//! then rotated container logs (tinylet's own step: upstream leaves them),
//! measuring again after each; only if a threshold is still met is a pod
//! evicted. Dead containers are not collected here: each pod's worker
//! prunes its own after every sync, so none are left beyond
//! `--maximum-dead-containers-per-container`.
//!
//! The eviction itself is the sync loop's: the manager sends the pod, its
//! message and grace period, and the loop reports it Failed (reason
//! Evicted) with an event and has its worker stop it, as it does for
//! refused pods. The manager then waits (up to 30 s) for the pod's sandbox
//! to be gone before it observes again, as upstream waits for cleanup.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender};
use k8s_openapi::api::core::v1::Pod;
use log::{debug, info, warn};

use crate::pod::is_critical;

use super::{
    eviction_message, has_local_storage_limits, local_storage_violation, rank, Observation,
    Observations, PodUsage, Signal, State, Threshold, Tracker,
};
use crate::cri::{ImageService, RuntimeService};
use crate::images::gc::ImageGcHandle;
use crate::node::machine;
use crate::pod::pod_uid;

/// How long the manager waits for an evicted pod to be gone.
const CLEANUP_TIMEOUT: Duration = Duration::from_secs(30);

/// A pod the sync loop is to evict.
#[derive(Debug)]
pub(crate) struct Eviction {
    pub(crate) pod: Arc<Pod>,
    /// The pod's status message.
    pub(crate) message: String,
    /// Overrides the pod's grace period: 0 for hard thresholds.
    pub(crate) grace_period: i64,
}

/// What the manager works with.
pub(crate) struct Config {
    pub(crate) thresholds: Vec<Threshold>,
    pub(crate) transition_period: Duration,
    pub(crate) max_pod_grace_period: i64,
    pub(crate) root_dir: PathBuf,
    pub(crate) logs_dir: PathBuf,
    pub(crate) interval: Duration,
    /// `--container-log-max-size` and `-files`, for the rotated logs.
    pub(crate) log_max_size: u64,
    pub(crate) log_max_files: usize,
}

/// Handle of the `eviction-manager` thread; dropping it stops and joins it.
pub(crate) struct EvictionManager {
    _stop: Sender<()>,
    _thread: crate::thread::JoinOnDrop<()>,
}

/// The sync loop's desired pods as last published (its `PodView`), read
/// through a function so that this module does not import the loop's.
pub(crate) type Pods = Box<dyn Fn() -> Arc<Vec<Arc<Pod>>> + Send>;

struct Manager {
    config: Config,
    runtime: Arc<dyn RuntimeService>,
    images: Arc<dyn ImageService>,
    image_gc: Option<ImageGcHandle>,
    pods: Pods,
    state: Arc<State>,
    evictions: Sender<Eviction>,
    tracker: Tracker,
}

impl EvictionManager {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn start(
        config: Config,
        runtime: Arc<dyn RuntimeService>,
        images: Arc<dyn ImageService>,
        image_gc: Option<ImageGcHandle>,
        pods: Pods,
        state: Arc<State>,
        evictions: Sender<Eviction>,
    ) -> std::io::Result<EvictionManager> {
        let (stop_tx, stop_rx) = crossbeam_channel::bounded::<()>(0);
        let thread = crate::thread::spawn_named("eviction-manager", move || {
            let mut m = Manager {
                config,
                runtime,
                images,
                image_gc,
                pods,
                state,
                evictions,
                tracker: Tracker::default(),
            };
            m.run(&stop_rx)
        })?;
        Ok(EvictionManager {
            _stop: stop_tx,
            _thread: thread,
        })
    }
}

fn stopped(stop: &Receiver<()>, wait: Duration) -> bool {
    !matches!(
        stop.recv_timeout(wait),
        Err(crossbeam_channel::RecvTimeoutError::Timeout)
    )
}

impl Manager {
    fn run(&mut self, stop: &Receiver<()>) {
        loop {
            let evicted = self.synchronize();
            if !evicted.is_empty() {
                self.wait_for_cleanup(&evicted, stop);
            }
            if stopped(stop, self.config.interval) {
                return;
            }
        }
    }

    /// The signals as they are now. A signal that cannot be read is left
    /// out (it meets no threshold), logged.
    fn observe(&self) -> Observations {
        let mut o = Observations::new();
        let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
        let total = machine::meminfo_bytes(&meminfo, "MemTotal");
        let available = machine::meminfo_bytes(&meminfo, "MemAvailable");
        if let (Some(total), Some(available)) = (total, available) {
            o.insert(Signal::MemoryAvailable, obs(available, total));
        }
        match machine::fs_stats(&self.config.root_dir) {
            Ok(fs) => {
                o.insert(Signal::NodeFsAvailable, obs(fs.available, fs.capacity));
                if fs.inodes > 0 {
                    o.insert(Signal::NodeFsInodesFree, obs(fs.inodes_free, fs.inodes));
                }
            }
            Err(e) => warn!("eviction manager: {e}"),
        }
        let mount = self.images.image_fs_info().map(|u| {
            u.into_iter()
                .next()
                .and_then(|u| u.fs_id.into_option())
                .map(|f| f.mountpoint)
                .filter(|m| !m.is_empty())
        });
        match mount {
            Ok(Some(m)) => match machine::fs_stats(std::path::Path::new(&m)) {
                Ok(fs) => {
                    o.insert(Signal::ImageFsAvailable, obs(fs.available, fs.capacity));
                    if fs.inodes > 0 {
                        o.insert(Signal::ImageFsInodesFree, obs(fs.inodes_free, fs.inodes));
                    }
                }
                Err(e) => debug!("eviction manager: image filesystem: {e}"),
            },
            Ok(None) => {}
            Err(e) => debug!("eviction manager: image filesystem info: {e}"),
        }
        let number = |p: &str| {
            std::fs::read_to_string(p)
                .ok()
                .and_then(|t| t.trim().parse::<u64>().ok())
        };
        let pid_max = match (
            number("/proc/sys/kernel/pid_max"),
            number("/proc/sys/kernel/threads-max"),
        ) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        let tasks = std::fs::read_to_string("/proc/loadavg")
            .ok()
            .and_then(|t| machine::loadavg_tasks(&t));
        if let (Some(max), Some(tasks)) = (pid_max, tasks) {
            o.insert(Signal::PidAvailable, obs(max.saturating_sub(tasks), max));
        }
        o
    }

    /// What the pods `which` selects use. Volumes and logs are measured
    /// again unless their kept usage is younger than `max_age` (see
    /// `stats::UsageCache`; what is measured here is kept for the summary).
    fn usage(&self, which: &dyn Fn(&str) -> bool, max_age: Duration) -> HashMap<String, PodUsage> {
        let measure = crate::stats::Measure {
            pods: which,
            max_age,
            cache: crate::stats::UsageCache::shared(),
            now: Instant::now(),
        };
        crate::stats::pod_usage(
            self.runtime.as_ref(),
            &self.config.root_dir,
            &self.config.logs_dir,
            &measure,
        )
        .unwrap_or_else(|e| {
            warn!("eviction manager: pod statistics: {e}");
            HashMap::new()
        })
    }

    /// One turn (upstream `synchronize`); the pods it asked to evict.
    fn synchronize(&mut self) -> Vec<Arc<Pod>> {
        let observations = self.observe();
        let step = self.tracker.step(
            &self.config.thresholds,
            &observations,
            self.config.transition_period,
            Instant::now(),
        );
        self.state.set(&step.conditions);
        let pods = (self.pods)();
        // Upstream's active pods: not being deleted, not finished.
        let active: Vec<&Arc<Pod>> = pods
            .iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .filter(|p| {
                let phase = p.status.as_ref().and_then(|s| s.phase.as_deref());
                !matches!(phase, Some(crate::pod::SUCCEEDED | crate::pod::FAILED))
            })
            .collect();

        // Local storage limits first, every pod over one. Measuring walks
        // volumes and logs: only the pods that set such a limit, afresh at
        // every turn, so that a pod over one is evicted at the next turn
        // (upstream decides on volume usage up to a minute old).
        let limited: Vec<&str> = active
            .iter()
            .filter(|p| has_local_storage_limits(p))
            .map(|p| pod_uid(p))
            .collect();
        let usage = if limited.is_empty() {
            HashMap::new()
        } else {
            self.usage(&|uid| limited.contains(&uid), Duration::ZERO)
        };
        let mut evicted = Vec::new();
        for pod in &active {
            let Some(u) = usage.get(pod_uid(pod)) else {
                continue;
            };
            if let Some((signal, message)) = local_storage_violation(pod, u) {
                if self.evict(pod, message, 0) {
                    crate::metrics::eviction(signal);
                    evicted.push(Arc::clone(pod));
                }
            }
        }
        if !evicted.is_empty() {
            return evicted;
        }

        // Memory first, then the others in the order the signals are listed.
        let mut due = step.thresholds;
        due.sort_by_key(|t| t.signal);
        let Some(threshold) = due.first().copied() else {
            return Vec::new();
        };
        info!(
            "eviction manager: threshold {}<{:?} met (observed {:?})",
            threshold.signal,
            threshold.value,
            observations.get(&threshold.signal)
        );
        if threshold.signal.disk() && self.reclaim_node_level(threshold.signal) {
            return Vec::new();
        }

        // Every pod, with what this turn measured already.
        let usage = self.usage(&|_| true, self.config.interval);
        let mut ranked: Vec<&Pod> = active.iter().map(|p| p.as_ref()).collect();
        rank(&mut ranked, threshold.signal, &|p: &Pod| {
            usage.get(pod_uid(p))
        });
        let grace = |p: &Pod| -> i64 {
            if threshold.is_hard() {
                return 0;
            }
            let own = p
                .spec
                .as_ref()
                .and_then(|s| s.termination_grace_period_seconds)
                .unwrap_or(30);
            own.min(self.config.max_pod_grace_period).max(0)
        };
        for p in ranked {
            if is_critical(p) {
                continue;
            }
            let message = eviction_message(threshold.signal, p, usage.get(pod_uid(p)));
            let Some(pod) = active.iter().find(|a| pod_uid(a) == pod_uid(p)) else {
                continue;
            };
            if self.evict(pod, message, grace(p)) {
                crate::metrics::eviction(threshold.signal.name());
                return vec![Arc::clone(pod)];
            }
        }
        info!(
            "eviction manager: {} is under pressure but no pod can be evicted",
            threshold.signal
        );
        Vec::new()
    }

    /// Node-level reclaim for a disk signal: unused images, then rotated
    /// logs, measuring after each. True when no threshold of that
    /// signal's condition is met any more (with its minimum reclaim).
    fn reclaim_node_level(&mut self, signal: Signal) -> bool {
        let resolved = |m: &Manager| {
            let o = m.observe();
            let left: Vec<Threshold> = super::thresholds_met(&m.config.thresholds, &o, true)
                .into_iter()
                .filter(|t| t.signal.disk())
                .collect();
            left.is_empty()
        };
        if let Some(gc) = &self.image_gc {
            match gc.free_unused() {
                Ok(pass) => info!(
                    "eviction manager: {signal}: removed {} unused images ({} bytes)",
                    pass.removed.len(),
                    pass.freed
                ),
                Err(e) => warn!("eviction manager: removing unused images: {e}"),
            }
            if resolved(self) {
                info!("eviction manager: {signal}: relieved by removing unused images");
                return true;
            }
        }
        let rotation = crate::logs::rotate::LogRotation::new(
            self.runtime.clone(),
            self.config.log_max_size,
            self.config.log_max_files,
        );
        match rotation.remove_rotated() {
            Ok((files, bytes)) => info!(
                "eviction manager: {signal}: removed {files} rotated container logs ({bytes} bytes)"
            ),
            Err(e) => warn!("eviction manager: removing rotated logs: {e}"),
        }
        if resolved(self) {
            info!("eviction manager: {signal}: relieved by removing rotated logs");
            return true;
        }
        false
    }

    fn evict(&self, pod: &Arc<Pod>, message: String, grace_period: i64) -> bool {
        if is_critical(pod) {
            warn!(
                "eviction manager: cannot evict a critical pod {}",
                crate::pod::pod_full_name(pod)
            );
            return false;
        }
        info!(
            "eviction manager: evicting pod {}: {message}",
            crate::pod::pod_full_name(pod)
        );
        // The sync loop takes one at a time; it never blocks for long.
        self.evictions
            .send(Eviction {
                pod: pod.clone(),
                message,
                grace_period,
            })
            .is_ok()
    }

    /// Waits until the runtime has no sandbox of the evicted pods any
    /// more, or [`CLEANUP_TIMEOUT`].
    fn wait_for_cleanup(&self, pods: &[Arc<Pod>], stop: &Receiver<()>) {
        let deadline = Instant::now() + CLEANUP_TIMEOUT;
        while Instant::now() < deadline {
            let left = match self.runtime.list_pod_sandbox(None) {
                Ok(list) => list.iter().any(|s| {
                    s.labels
                        .get(crate::runtime::labels::POD_UID)
                        .is_some_and(|u| pods.iter().any(|p| pod_uid(p) == u))
                }),
                Err(_) => true,
            };
            if !left || stopped(stop, Duration::from_secs(1)) {
                return;
            }
        }
        warn!("eviction manager: evicted pods not cleaned up within 30s");
    }
}

fn obs(available: u64, capacity: u64) -> Observation {
    Observation {
        available: i128::from(available),
        capacity: i128::from(capacity),
    }
}
