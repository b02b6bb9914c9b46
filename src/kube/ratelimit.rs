//! The client-side rate limiter: one token bucket shared by every clone of a
//! client (upstream's `--kube-api-qps` / `--kube-api-burst`). A request
//! reserves a token and sleeps until the token is due; it never fails for
//! lack of one.
//!
//! The bucket is a reservation scheme: tokens may go below zero, and each
//! caller's wait is the time the bucket needs to pay its debt back. The
//! arithmetic takes the current instant as an argument so that tests step
//! a fake clock instead of sleeping.

use std::time::{Duration, Instant};

use parking_lot::Mutex;

pub(crate) struct TokenBucket {
    /// Tokens added per second; 0 means no limit.
    qps: f64,
    /// The most tokens the bucket holds (at least 1 when limited).
    burst: f64,
    state: Mutex<State>,
}

struct State {
    /// May be negative: tokens already promised to waiting callers.
    tokens: f64,
    last: Instant,
}

impl TokenBucket {
    pub(crate) fn new(qps: f32, burst: u32, now: Instant) -> TokenBucket {
        let qps = if qps.is_finite() && qps > 0.0 {
            f64::from(qps)
        } else {
            0.0
        };
        let burst = f64::from(burst.max(1));
        TokenBucket {
            qps,
            burst,
            state: Mutex::new(State {
                tokens: burst,
                last: now,
            }),
        }
    }

    /// Takes one token at `now` and says how long the caller must wait
    /// before using it (zero when one was available).
    pub(crate) fn reserve(&self, now: Instant) -> Duration {
        if self.qps == 0.0 {
            return Duration::ZERO;
        }
        let mut s = self.state.lock();
        // An instant earlier than the last one (callers racing between
        // reading the clock and taking the lock) adds nothing.
        let elapsed = now.saturating_duration_since(s.last);
        if now > s.last {
            s.last = now;
        }
        s.tokens = (s.tokens + elapsed.as_secs_f64() * self.qps).min(self.burst);
        s.tokens -= 1.0;
        if s.tokens >= 0.0 {
            Duration::ZERO
        } else {
            Duration::from_secs_f64(-s.tokens / self.qps)
        }
    }

    /// Waits for a token (the lock is not held while sleeping).
    pub(crate) fn acquire(&self) {
        let wait = self.reserve(Instant::now());
        if !wait.is_zero() {
            std::thread::sleep(wait);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn burst_is_free_then_requests_are_spaced_by_one_over_qps() {
        let t0 = Instant::now();
        let b = TokenBucket::new(5.0, 3, t0);
        for _ in 0..3 {
            assert_eq!(b.reserve(t0), Duration::ZERO);
        }
        // The bucket is empty: the next callers wait 200 ms, 400 ms, ...
        assert_eq!(b.reserve(t0), ms(200));
        assert_eq!(b.reserve(t0), ms(400));
        // 400 ms later the debt of two tokens is paid, the next waits 200 ms.
        assert_eq!(b.reserve(t0 + ms(400)), ms(200));
    }

    #[test]
    fn tokens_refill_up_to_burst_only() {
        let t0 = Instant::now();
        let b = TokenBucket::new(10.0, 2, t0);
        assert_eq!(b.reserve(t0), Duration::ZERO);
        assert_eq!(b.reserve(t0), Duration::ZERO);
        // A long idle time refills two tokens, not a hundred.
        let later = t0 + Duration::from_secs(10);
        assert_eq!(b.reserve(later), Duration::ZERO);
        assert_eq!(b.reserve(later), Duration::ZERO);
        assert_eq!(b.reserve(later), ms(100));
        // Half a token's time later the next one is due after 150 ms: it
        // queues behind the one already promised.
        assert_eq!(b.reserve(later + ms(50)), ms(150));
    }

    #[test]
    fn zero_qps_is_unlimited_and_zero_burst_means_one() {
        let t0 = Instant::now();
        let b = TokenBucket::new(0.0, 0, t0);
        for _ in 0..1000 {
            assert_eq!(b.reserve(t0), Duration::ZERO);
        }
        let b = TokenBucket::new(2.0, 0, t0);
        assert_eq!(b.reserve(t0), Duration::ZERO);
        assert_eq!(b.reserve(t0), ms(500));
    }

    #[test]
    fn an_earlier_instant_does_not_move_the_clock_back() {
        let t0 = Instant::now();
        let b = TokenBucket::new(1.0, 1, t0 + Duration::from_secs(1));
        assert_eq!(b.reserve(t0 + Duration::from_secs(1)), Duration::ZERO);
        // A racing caller with an older reading still pays a full token.
        assert_eq!(b.reserve(t0), Duration::from_secs(1));
    }
}
