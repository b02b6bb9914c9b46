//! Pull back-off and the registry token bucket, shared by every pod's
//! pulls: the per-pod-and-image back-off of failed pulls (upstream
//! `flowcontrol.Backoff`) and the `--registry-qps`/`--registry-burst`
//! bucket. Instants are arguments, so tests step a fake clock.

use std::collections::HashMap;
use std::time::{Duration, Instant};

/// Upstream's image pull back-off: 10 s doubling up to 5 min, per pod and image.
pub(crate) const PULL_BACKOFF_INITIAL: Duration = Duration::from_secs(10);
pub(crate) const PULL_BACKOFF_MAX: Duration = Duration::from_secs(300);

#[derive(Debug, Clone)]
struct BackoffEntry {
    window: Duration,
    last_failure: Instant,
    /// `ErrImagePull: <message>` of the failure that opened the window.
    last_error: String,
}

/// Image pull back-off by `<pod uid>_<image>` (upstream `flowcontrol.Backoff`
/// without jitter): a failure opens a window of 10 s, each failure after
/// that doubles it up to 5 min; an entry quiet for twice the maximum starts
/// over. Instants are arguments so tests step a fake clock.
#[derive(Debug, Default)]
pub struct PullBackoff {
    entries: HashMap<String, BackoffEntry>,
}

impl PullBackoff {
    fn expired(e: &BackoffEntry, now: Instant) -> bool {
        now.saturating_duration_since(e.last_failure) > PULL_BACKOFF_MAX * 2
    }

    /// While `key` is backing off at `now`: the time left, the window and
    /// the error that opened it.
    pub(crate) fn in_backoff(&self, key: &str, now: Instant) -> Option<(Duration, Duration, &str)> {
        let e = self.entries.get(key)?;
        if Self::expired(e, now) {
            return None;
        }
        let since = now.saturating_duration_since(e.last_failure);
        e.window
            .checked_sub(since)
            .filter(|d| !d.is_zero())
            .map(|left| (left, e.window, e.last_error.as_str()))
    }

    /// Records a failed pull of `key` at `now`; returns the new window.
    pub(crate) fn failed(&mut self, key: &str, now: Instant, error: String) -> Duration {
        let window = match self.entries.get(key) {
            Some(e) if !Self::expired(e, now) => (e.window * 2).min(PULL_BACKOFF_MAX),
            _ => PULL_BACKOFF_INITIAL,
        };
        self.entries.insert(
            key.to_string(),
            BackoffEntry {
                window,
                last_failure: now,
                last_error: error,
            },
        );
        window
    }

    /// Drops entries quiet for twice the maximum.
    pub(crate) fn gc(&mut self, now: Instant) {
        self.entries.retain(|_, e| !Self::expired(e, now));
    }

    /// Forgets the keys of a pod that is gone.
    pub(crate) fn forget_pod(&mut self, uid: &str) {
        let prefix = format!("{uid}_");
        self.entries.retain(|k, _| !k.starts_with(&prefix));
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

// ---- registry token bucket -----------------------------------------------

/// A token bucket that refuses instead of waiting (upstream's throttled
/// image service: a pull beyond the rate fails with "pull QPS exceeded").
#[derive(Debug)]
pub(crate) struct PullBucket {
    qps: f64,
    burst: f64,
    tokens: f64,
    last: Instant,
}

impl PullBucket {
    /// None when `qps` is 0 (unlimited).
    pub(crate) fn new(qps: f32, burst: u32, now: Instant) -> Option<PullBucket> {
        if !(qps.is_finite() && qps > 0.0) {
            return None;
        }
        let burst = f64::from(burst.max(1));
        Some(PullBucket {
            qps: f64::from(qps),
            burst,
            tokens: burst,
            last: now,
        })
    }

    /// Takes a token if one is there at `now`.
    pub(crate) fn try_accept(&mut self, now: Instant) -> bool {
        let elapsed = now.saturating_duration_since(self.last);
        if now > self.last {
            self.last = now;
        }
        self.tokens = (self.tokens + elapsed.as_secs_f64() * self.qps).min(self.burst);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pull_backoff_doubles_to_five_minutes_and_resets_when_quiet() {
        let t0 = Instant::now();
        let s = Duration::from_secs;
        let mut b = PullBackoff::default();
        assert!(b.in_backoff("uid_img", t0).is_none());
        assert_eq!(b.failed("uid_img", t0, "ErrImagePull: 401".into()), s(10));
        let (left, window, last) = b.in_backoff("uid_img", t0 + s(4)).unwrap();
        assert_eq!((left, window, last), (s(6), s(10), "ErrImagePull: 401"));
        assert!(b.in_backoff("uid_img", t0 + s(10)).is_none());
        assert!(b.in_backoff("other_img", t0 + s(1)).is_none());
        let t1 = t0 + s(11);
        assert_eq!(b.failed("uid_img", t1, "e".into()), s(20));
        assert_eq!(b.in_backoff("uid_img", t1 + s(19)).unwrap().0, s(1));
        let mut t = t1;
        for _ in 0..10 {
            t += s(1);
            b.failed("uid_img", t, "e".into());
        }
        assert_eq!(b.in_backoff("uid_img", t).unwrap().1, PULL_BACKOFF_MAX);
        // Quiet for more than twice the maximum: starts over at 10 s.
        let late = t + PULL_BACKOFF_MAX * 2 + s(1);
        assert!(b.in_backoff("uid_img", late).is_none());
        b.gc(late);
        assert!(b.is_empty());
        assert_eq!(b.failed("uid_img", late, "e".into()), s(10));
        b.failed("other_img", late, "e".into());
        b.forget_pod("uid");
        assert_eq!(b.len(), 1);
    }

    #[test]
    fn pull_bucket_refuses_beyond_burst_and_refills_at_qps() {
        let t0 = Instant::now();
        assert!(PullBucket::new(0.0, 10, t0).is_none(), "0 qps: unlimited");
        let mut b = PullBucket::new(5.0, 2, t0).unwrap();
        assert!(b.try_accept(t0));
        assert!(b.try_accept(t0));
        assert!(!b.try_accept(t0));
        assert!(!b.try_accept(t0 + Duration::from_millis(100)));
        assert!(b.try_accept(t0 + Duration::from_millis(200)));
        assert!(!b.try_accept(t0 + Duration::from_millis(200)));
        // Refill stops at the burst.
        let later = t0 + Duration::from_secs(60);
        assert!(b.try_accept(later) && b.try_accept(later) && !b.try_accept(later));
    }
}
