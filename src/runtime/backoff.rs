//! Per-container restart back-off (CrashLoopBackOff), as the kubelet does it.
//!
//! The first restart after an exit is immediate; every further exit within
//! the current back-off window waits: 10 s, then doubling up to 5 min. An
//! entry that has not been touched for twice the maximum is forgotten, so a
//! container that ran fine for a while starts again from 10 s.

use std::collections::HashMap;
use std::time::{Duration, SystemTime};

pub(crate) const INITIAL: Duration = Duration::from_secs(10);
pub(crate) const MAX: Duration = Duration::from_secs(300);

#[derive(Debug, Clone, Copy)]
struct Entry {
    backoff: Duration,
    last_update: SystemTime,
}

#[derive(Debug)]
pub(crate) struct Backoff {
    initial: Duration,
    max: Duration,
    entries: HashMap<String, Entry>,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff::new(INITIAL, MAX)
    }
}

impl Backoff {
    pub(crate) fn new(initial: Duration, max: Duration) -> Self {
        Backoff {
            initial,
            max,
            entries: HashMap::new(),
        }
    }

    /// If `key` is backing off as of an exit at `exited_at`, the time left.
    pub(crate) fn remaining(
        &self,
        key: &str,
        exited_at: SystemTime,
        now: SystemTime,
    ) -> Option<Duration> {
        let e = self.entries.get(key)?;
        if self.expired(e, exited_at) {
            return None;
        }
        let since = now.duration_since(exited_at).unwrap_or(Duration::ZERO);
        e.backoff.checked_sub(since).filter(|d| !d.is_zero())
    }

    /// The current window of `key`, if it has one.
    pub(crate) fn current(&self, key: &str) -> Option<Duration> {
        self.entries.get(key).map(|e| e.backoff)
    }

    /// Records a restart of `key` at `now`, growing its window.
    pub(crate) fn next(&mut self, key: &str, exited_at: SystemTime, now: SystemTime) {
        let (initial, max) = (self.initial, self.max);
        let expired = self
            .entries
            .get(key)
            .is_some_and(|e| self.expired(e, exited_at));
        let e = self.entries.entry(key.to_string()).or_insert(Entry {
            backoff: Duration::ZERO,
            last_update: now,
        });
        e.backoff = if e.backoff.is_zero() || expired {
            initial
        } else {
            (e.backoff * 2).min(max)
        };
        e.last_update = now;
    }

    fn expired(&self, e: &Entry, at: SystemTime) -> bool {
        at.duration_since(e.last_update)
            .is_ok_and(|d| d > self.max * 2)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_restart_is_free_then_the_window_doubles() {
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let mut b = Backoff::default();
        assert_eq!(b.remaining("p/c", t0, t0), None);
        b.next("p/c", t0, t0);
        // Exits again 1 s after the restart: must wait 10 s from that exit.
        let t1 = t0 + Duration::from_secs(1);
        assert_eq!(b.remaining("p/c", t1, t1), Some(Duration::from_secs(10)));
        assert_eq!(
            b.remaining("p/c", t1, t1 + Duration::from_secs(4)),
            Some(Duration::from_secs(6))
        );
        assert_eq!(b.remaining("p/c", t1, t1 + Duration::from_secs(10)), None);
        b.next("p/c", t1, t1 + Duration::from_secs(10));
        let t2 = t1 + Duration::from_secs(11);
        assert_eq!(b.remaining("p/c", t2, t2), Some(Duration::from_secs(20)));
        // Capped at the maximum.
        for _ in 0..10 {
            b.next("p/c", t2, t2);
        }
        assert_eq!(b.remaining("p/c", t2, t2), Some(MAX));
        // Other keys are independent.
        assert_eq!(b.remaining("q/c", t2, t2), None);
    }

    #[test]
    fn a_long_quiet_spell_resets_the_window() {
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let mut b = Backoff::default();
        b.next("k", t0, t0);
        b.next("k", t0, t0);
        let late = t0 + MAX * 3;
        assert_eq!(b.remaining("k", late, late), None);
        b.next("k", late, late);
        let t = late + Duration::from_secs(1);
        assert_eq!(b.remaining("k", t, t), Some(INITIAL));
    }
}
