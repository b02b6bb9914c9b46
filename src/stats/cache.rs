//! Volume and log usage, kept between measurements: walking every volume
//! and log directory of every pod is the one costly part of the
//! statistics, so `/stats/summary` uses a measure up to [`SUMMARY_MAX_AGE`]
//! old (upstream's fsResourceAnalyzer measures each pod's volumes every
//! `--volume-stats-agg-period`, one minute, and serves the last result),
//! while the eviction manager asks for fresher ones where it decides by
//! them (every turn for pods with local storage limits) and leaves them
//! here for the summary.
//!
//! Nothing walks in the background: a measure is made when one is asked
//! for and the kept one is too old. However fresh a caller asks for it, a
//! measure is kept at least [`WALK_DUTY`] times as long as its walk took,
//! so walking a huge tree takes at most about a tenth of the time of
//! whoever asks (a million entries take about 3 s; such a tree is then
//! measured every 30 s rather than at every 10 s eviction turn). The lock is not held during a walk,
//! so a slow walk holds up only its caller; two callers that miss at once
//! both walk. Entries not asked for in two periods are dropped, so the
//! cache stays as large as what runs.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::paths::DiskUsage;

/// How old a volume's or log directory's usage `/stats/summary` gives may
/// be (upstream's `volumeStatsAggPeriod` default).
pub(crate) const SUMMARY_MAX_AGE: Duration = Duration::from_secs(60);

/// Entries one walk looks at, at most (`paths::disk_usage`): a tree a
/// container made larger stops the walk there, and its usage counts as
/// over every limit. A million `fstatat` calls take about a second on a
/// warm cache; upstream's `du` has no bound.
pub(crate) const WALK_LIMIT: u64 = 1_000_000;

/// A measure is kept at least this many times as long as its walk took.
const WALK_DUTY: u32 = 10;

/// Usage by directory, with when it was measured.
pub(crate) struct UsageCache {
    max_entries: u64,
    entries: Mutex<HashMap<PathBuf, Measured>>,
    walks: AtomicU64,
}

#[derive(Clone, Copy)]
struct Measured {
    at: Instant,
    /// How long the walk took.
    took: Duration,
    /// None when the directory could not be opened (gone, say).
    usage: Option<DiskUsage>,
}

impl UsageCache {
    pub(crate) fn new(max_entries: u64) -> UsageCache {
        UsageCache {
            max_entries,
            entries: Mutex::new(HashMap::new()),
            walks: AtomicU64::new(0),
        }
    }

    /// The process's cache, shared by the node API and the eviction
    /// manager.
    pub(crate) fn shared() -> &'static UsageCache {
        static SHARED: OnceLock<UsageCache> = OnceLock::new();
        SHARED.get_or_init(|| UsageCache::new(WALK_LIMIT))
    }

    /// The usage of the tree at `dir`: the kept one if it was measured
    /// less than `max_age` before `now`, else measured again (and kept).
    /// None when it cannot be measured.
    pub(crate) fn usage(&self, dir: &Path, now: Instant, max_age: Duration) -> Option<DiskUsage> {
        if let Some(m) = self.entries.lock().get(dir) {
            if now.saturating_duration_since(m.at) < max_age.max(m.took.saturating_mul(WALK_DUTY)) {
                return m.usage;
            }
        }
        self.walks.fetch_add(1, Ordering::Relaxed);
        let started = Instant::now();
        let usage = match crate::paths::disk_usage(dir, self.max_entries) {
            Ok(u) => {
                if !u.complete {
                    log::info!(
                        "usage of {} measured in part ({} entries seen): counted as over its limits",
                        dir.display(),
                        u.inodes
                    );
                }
                Some(u)
            }
            Err(e) => {
                if e.kind() != std::io::ErrorKind::NotFound {
                    log::debug!("usage of {}: {e}", dir.display());
                }
                None
            }
        };
        self.entries.lock().insert(
            dir.to_path_buf(),
            Measured {
                at: now,
                took: started.elapsed(),
                usage,
            },
        );
        usage
    }

    /// Drops what was measured more than twice `max_age` before `now`.
    pub(crate) fn forget_older(&self, now: Instant, max_age: Duration) {
        self.entries
            .lock()
            .retain(|_, m| now.saturating_duration_since(m.at) < max_age.saturating_mul(2));
    }

    /// Walks made so far.
    #[cfg(test)]
    pub(crate) fn walks(&self) -> u64 {
        self.walks.load(Ordering::Relaxed)
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.entries.lock().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_costly_walk_is_kept_ten_times_as_long_as_it_took() {
        let tmp = tempfile::tempdir().unwrap();
        let cache = UsageCache::new(100);
        let t0 = Instant::now();
        let seen = cache.usage(tmp.path(), t0, Duration::ZERO).unwrap();
        assert_eq!(cache.walks(), 1);
        // As if that walk had taken 3 s: asked for afresh, it is kept 30 s.
        if let Some(m) = cache.entries.lock().get_mut(tmp.path()) {
            m.took = Duration::from_secs(3);
        }
        let at = |s| t0 + Duration::from_secs(s);
        assert_eq!(cache.usage(tmp.path(), at(29), Duration::ZERO), Some(seen));
        assert_eq!(cache.walks(), 1);
        cache.usage(tmp.path(), at(30), Duration::ZERO);
        assert_eq!(cache.walks(), 2);
        // A quick walk asked for afresh a second later is measured again.
        cache.usage(tmp.path(), at(31), Duration::ZERO);
        assert_eq!(cache.walks(), 3);
    }
}
