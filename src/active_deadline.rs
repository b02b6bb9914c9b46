//! `spec.activeDeadlineSeconds` (upstream `active_deadline.go`): how long
//! a pod may be active on the node, counted from its `status.startTime`.
//!
//! Pure: the pod's worker asks [`time_left`] before each sync. When none is
//! left it stops the pod's containers and sandbox (never starting them
//! again) and reports the pod Failed with [`REASON`] and [`MESSAGE`], with
//! a `DeadlineExceeded` event; otherwise it asks for its next resync no
//! later than the deadline, so the pod is stopped on time and not at the
//! next periodic resync.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

/// The pod status reason and event reason of a pod past its deadline.
pub(crate) const REASON: &str = "DeadlineExceeded";
/// The pod status message and event message of a pod past its deadline.
pub(crate) const MESSAGE: &str = "Pod was active on the node longer than the specified deadline";

/// The time left before `pod`'s active deadline, counted from `start` (its
/// `status.startTime`): `None` when it has no deadline or no start time
/// yet, zero once the deadline has passed (upstream: active for at least
/// the allowed duration).
pub(crate) fn time_left(pod: &Pod, start: Option<&Time>, now: Timestamp) -> Option<Duration> {
    let deadline = pod.spec.as_ref()?.active_deadline_seconds?;
    let start = start?;
    // Whole seconds, as the API's times are; a start in the future (a clock
    // step) counts as no time spent.
    let active = now.as_second().saturating_sub(start.0.as_second()).max(0);
    let left = deadline.saturating_sub(active).max(0);
    Some(Duration::from_secs(left.unsigned_abs()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(deadline: Option<i64>) -> Pod {
        Pod {
            spec: Some(k8s_openapi::api::core::v1::PodSpec {
                active_deadline_seconds: deadline,
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn at(s: i64) -> Timestamp {
        Timestamp::from_second(s).unwrap()
    }

    #[test]
    fn the_deadline_counts_from_the_start_time() {
        let start = Time(at(1_000));
        let p = pod(Some(30));
        assert_eq!(
            time_left(&p, Some(&start), at(1_010)),
            Some(Duration::from_secs(20))
        );
        assert_eq!(
            time_left(&p, Some(&start), at(1_030)),
            Some(Duration::ZERO),
            "exactly at the deadline it has passed"
        );
        assert_eq!(time_left(&p, Some(&start), at(5_000)), Some(Duration::ZERO));
        // A start time ahead of the clock spends nothing.
        assert_eq!(
            time_left(&p, Some(&start), at(900)),
            Some(Duration::from_secs(30))
        );
    }

    #[test]
    fn no_deadline_or_no_start_time_never_expires() {
        let start = Time(at(0));
        assert_eq!(time_left(&pod(None), Some(&start), at(1 << 34)), None);
        assert_eq!(time_left(&pod(Some(1)), None, at(1 << 34)), None);
        assert_eq!(time_left(&Pod::default(), Some(&start), at(1 << 34)), None);
        // Huge deadlines do not overflow.
        assert_eq!(
            time_left(&pod(Some(i64::MAX)), Some(&start), at(10)),
            Some(Duration::from_secs(i64::MAX as u64 - 10))
        );
    }
}
