//! Liveness stamps the node's health checks read: the sync loop stamps
//! each turn, the PLEG each successful relist. Plain atomics, so the
//! stampers import nothing and the readers (the node API's `/healthz`)
//! never take a lock.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// How long the PLEG may go without a successful relist before the node
/// is unhealthy (upstream's `relistThreshold`).
pub(crate) const RELIST_THRESHOLD: Duration = Duration::from_secs(3 * 60);

/// When the sync loop last turned and the PLEG last relisted.
#[derive(Debug)]
pub(crate) struct Health {
    base: Instant,
    /// Nanoseconds after `base` of the last stamp, plus one; 0: never.
    sync_loop: AtomicU64,
    relist: AtomicU64,
    /// How long the sync loop may stay away (upstream: twice the resync
    /// interval, at least 5 minutes).
    sync_threshold: Duration,
}

impl Health {
    /// `sync_frequency` is `--sync-frequency`, which sets the sync loop's
    /// threshold as upstream: twice it, at least 5 minutes.
    pub(crate) fn new(sync_frequency: Duration) -> Health {
        let now = Instant::now();
        Health {
            // An hour back, so that tests can stamp a stale turn.
            base: now.checked_sub(Duration::from_secs(3600)).unwrap_or(now),
            sync_loop: AtomicU64::new(0),
            relist: AtomicU64::new(0),
            sync_threshold: (sync_frequency.saturating_mul(2)).max(Duration::from_secs(5 * 60)),
        }
    }

    fn stamp(&self, at: Instant) -> u64 {
        let ns = at.saturating_duration_since(self.base).as_nanos();
        u64::try_from(ns).unwrap_or(u64::MAX - 1) + 1
    }

    fn since(&self, stamp: &AtomicU64, now: Instant) -> Option<Duration> {
        match stamp.load(Ordering::Relaxed) {
            0 => None,
            n => Some(now.saturating_duration_since(self.base + Duration::from_nanos(n - 1))),
        }
    }

    /// The sync loop entered a turn at `at`.
    pub(crate) fn sync_loop_turned_at(&self, at: Instant) {
        self.sync_loop.store(self.stamp(at), Ordering::Relaxed);
    }

    pub(crate) fn relisted_at(&self, at: Instant) {
        self.relist.store(self.stamp(at), Ordering::Relaxed);
    }

    /// The sync loop's check (upstream's `syncloop`): healthy before its
    /// first turn, then while the last turn is within the threshold.
    pub(crate) fn check_sync_loop(&self, now: Instant) -> Result<(), String> {
        match self.since(&self.sync_loop, now) {
            Some(d) if d > self.sync_threshold => Err(format!(
                "sync Loop took longer than expected: last turn {}s ago; threshold is {}s",
                d.as_secs(),
                self.sync_threshold.as_secs()
            )),
            _ => Ok(()),
        }
    }

    /// The PLEG's check (upstream's `pleg`).
    pub(crate) fn check_pleg(&self, now: Instant) -> Result<(), String> {
        match self.since(&self.relist, now) {
            None => Err("pleg has yet to be successful".into()),
            Some(d) if d > RELIST_THRESHOLD => Err(format!(
                "pleg was last seen active {}s ago; threshold is {}s",
                d.as_secs(),
                RELIST_THRESHOLD.as_secs()
            )),
            Some(_) => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stuck_sync_loop_or_pleg_is_unhealthy_with_the_reason() {
        let h = Health::new(Duration::from_secs(60));
        let t0 = Instant::now();
        assert_eq!(h.check_sync_loop(t0), Ok(()));
        assert_eq!(
            h.check_pleg(t0),
            Err("pleg has yet to be successful".to_string())
        );
        h.sync_loop_turned_at(t0);
        h.relisted_at(t0);
        let later = t0 + Duration::from_secs(299);
        assert_eq!(h.check_sync_loop(later), Ok(()));
        assert_eq!(h.check_pleg(t0 + Duration::from_secs(179)), Ok(()));
        let e = h
            .check_sync_loop(t0 + Duration::from_secs(301))
            .unwrap_err();
        assert!(e.starts_with("sync Loop took longer than expected"), "{e}");
        let e = h.check_pleg(t0 + Duration::from_secs(200)).unwrap_err();
        assert!(e.starts_with("pleg was last seen active 200s ago"), "{e}");
        // A long --sync-frequency widens the sync loop's threshold.
        let slow = Health::new(Duration::from_secs(600));
        slow.sync_loop_turned_at(t0);
        assert_eq!(slow.check_sync_loop(t0 + Duration::from_secs(1100)), Ok(()));
    }
}
