//! What housekeeping does about pods the runtime holds that no source has
//! (upstream's `HandlePodCleanups` for running pods, and its container
//! garbage collection for the rest): pure, stepped with the time of each
//! housekeeping turn, so tests need no clock.
//!
//! A pod with a ready sandbox or a running container is *running*: it is
//! stopped. One with neither (a sandbox that is not ready and whatever exited
//! containers are left, a sandbox whose containers were removed under the
//! runtime's feet) is *garbage*: it is removed. Either is handed to a worker
//! once; a pod that is still listed after its worker finished (a sandbox that
//! will not go, a removal the runtime answers but does not do) is tried again
//! with back-off, [`FIRST_RETRY`] doubling up to [`MAX_RETRY`], not at every
//! housekeeping. It is logged once when found, once more (a warning) when
//! the first retry finds it still there, and once when it is gone; the
//! retries between say nothing above debug.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use crate::runtime::{ContainerState, RuntimePod};

/// The wait before a leftover that outlived its removal is tried again
/// (upstream's container GC runs every minute).
pub(crate) const FIRST_RETRY: Duration = Duration::from_secs(60);
/// The longest wait between tries.
pub(crate) const MAX_RETRY: Duration = Duration::from_secs(600);

/// Whether the runtime runs anything of the pod (upstream's `GetPods(false)`
/// counts only ready sandboxes and running containers).
pub(crate) fn is_running(pod: &RuntimePod) -> bool {
    pod.sandboxes
        .iter()
        .chain(&pod.containers)
        .any(|c| c.state == ContainerState::Running)
}

/// What housekeeping does with one leftover pod this turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Found running: stop and remove it (logged at info).
    Stop,
    /// Found with nothing running: remove it (logged at info).
    Remove,
    /// Still listed after its removal: try again now, for the `n`th time
    /// (the second is logged as a warning, later ones at debug).
    Retry {
        running: bool,
        n: u32,
        next: Duration,
    },
    /// Tried lately: nothing this turn.
    Wait,
}

#[derive(Debug)]
struct Leftover {
    running: bool,
    tries: u32,
    next: Instant,
}

/// The leftover pods housekeeping has handed to workers, by UID.
#[derive(Debug, Default)]
pub(crate) struct Leftovers {
    seen: HashMap<String, Leftover>,
}

impl Leftovers {
    /// The verdict on `pod`, a pod the runtime lists at `now` that no source
    /// has and no worker holds.
    pub(crate) fn judge(&mut self, pod: &RuntimePod, now: Instant) -> Verdict {
        let running = is_running(pod);
        match self.seen.get_mut(&pod.uid) {
            // Found anew, or changed since (it ran again, or stopped):
            // handled at once.
            Some(l) if l.running == running => {
                if now < l.next {
                    return Verdict::Wait;
                }
                l.tries = l.tries.saturating_add(1);
                let wait = retry_wait(l.tries);
                l.next = now + wait;
                Verdict::Retry {
                    running,
                    n: l.tries,
                    next: wait,
                }
            }
            _ => {
                self.seen.insert(
                    pod.uid.clone(),
                    Leftover {
                        running,
                        tries: 1,
                        next: now + FIRST_RETRY,
                    },
                );
                if running {
                    Verdict::Stop
                } else {
                    Verdict::Remove
                }
            }
        }
    }

    /// Forgets the pods no longer listed; returns those that had outlived a
    /// removal (worth a line saying they are gone at last) with their tries.
    pub(crate) fn forget_gone(&mut self, listed: &[RuntimePod]) -> Vec<(String, u32)> {
        let mut gone = Vec::new();
        self.seen.retain(|uid, l| {
            let still = listed.iter().any(|p| &p.uid == uid);
            if !still && l.tries > 1 {
                gone.push((uid.clone(), l.tries));
            }
            still
        });
        crate::malloc::shrink_map(&mut self.seen);
        gone
    }

    /// Forgets `uid`: a source has it now (it is no leftover).
    pub(crate) fn forget(&mut self, uid: &str) {
        self.seen.remove(uid);
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.seen.len()
    }
}

/// The wait after the `tries`th try (2 or more).
fn retry_wait(tries: u32) -> Duration {
    let doublings = tries.saturating_sub(1).min(16);
    FIRST_RETRY.saturating_mul(1u32 << doublings).min(MAX_RETRY)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::RuntimeContainer;

    fn pod(uid: &str, sandbox: ContainerState, containers: &[ContainerState]) -> RuntimePod {
        let c = |id: &str, state| RuntimeContainer {
            id: id.into(),
            name: "c".into(),
            state,
        };
        RuntimePod {
            uid: uid.into(),
            name: "p".into(),
            namespace: "default".into(),
            sandboxes: vec![c("s", sandbox)],
            containers: containers
                .iter()
                .enumerate()
                .map(|(i, s)| c(&format!("c{i}"), *s))
                .collect(),
        }
    }

    #[test]
    fn only_a_ready_sandbox_or_a_running_container_is_running() {
        use ContainerState::*;
        assert!(is_running(&pod("u", Running, &[])));
        assert!(is_running(&pod("u", Exited, &[Running])));
        assert!(!is_running(&pod("u", Exited, &[])));
        assert!(!is_running(&pod("u", Exited, &[Exited, Created])));
    }

    #[test]
    fn a_leftover_that_stays_is_tried_again_with_back_off_not_every_turn() {
        let mut l = Leftovers::default();
        let garbage = pod("u1", ContainerState::Exited, &[]);
        let t0 = Instant::now();
        assert_eq!(l.judge(&garbage, t0), Verdict::Remove);
        // Housekeeping every 2 s for a minute: nothing.
        for s in (2..60).step_by(2) {
            assert_eq!(
                l.judge(&garbage, t0 + Duration::from_secs(s)),
                Verdict::Wait
            );
        }
        let t1 = t0 + FIRST_RETRY;
        assert_eq!(
            l.judge(&garbage, t1),
            Verdict::Retry {
                running: false,
                n: 2,
                next: Duration::from_secs(120)
            }
        );
        assert_eq!(
            l.judge(&garbage, t1 + Duration::from_secs(119)),
            Verdict::Wait
        );
        let t2 = t1 + Duration::from_secs(120);
        assert!(matches!(l.judge(&garbage, t2), Verdict::Retry { n: 3, .. }));
        // The waits stop growing at MAX_RETRY.
        let mut t = t2;
        for _ in 0..10 {
            t += MAX_RETRY;
            assert!(matches!(l.judge(&garbage, t), Verdict::Retry { .. }));
        }
        assert!(matches!(
            l.judge(&garbage, t + MAX_RETRY),
            Verdict::Retry { next, .. } if next == MAX_RETRY
        ));
    }

    #[test]
    fn a_leftover_that_changes_state_is_handled_at_once() {
        let mut l = Leftovers::default();
        let t0 = Instant::now();
        let running = pod("u1", ContainerState::Running, &[ContainerState::Running]);
        assert_eq!(l.judge(&running, t0), Verdict::Stop);
        let stopped = pod("u1", ContainerState::Exited, &[ContainerState::Exited]);
        assert_eq!(
            l.judge(&stopped, t0 + Duration::from_secs(2)),
            Verdict::Remove
        );
        assert_eq!(
            l.judge(&stopped, t0 + Duration::from_secs(4)),
            Verdict::Wait
        );
    }

    #[test]
    fn pods_no_longer_listed_are_forgotten_and_those_retried_are_named() {
        let mut l = Leftovers::default();
        let t0 = Instant::now();
        let a = pod("a", ContainerState::Exited, &[]);
        let b = pod("b", ContainerState::Exited, &[]);
        l.judge(&a, t0);
        l.judge(&b, t0);
        l.judge(&b, t0 + FIRST_RETRY);
        assert_eq!(
            l.forget_gone(std::slice::from_ref(&a)),
            vec![("b".to_string(), 2)]
        );
        assert_eq!(l.len(), 1);
        assert!(l.forget_gone(&[]).is_empty());
        assert_eq!(l.len(), 0);
        // Listed again later: a new leftover.
        assert_eq!(l.judge(&a, t0 + Duration::from_secs(1)), Verdict::Remove);
        l.forget("a");
        assert_eq!(l.len(), 0);
    }
}
