//! The probe runners' pool: which due run goes to which `probe-runner/N`
//! thread, when a runner starts and when it ends. Free of threads and
//! clocks (the `prober` thread drives it), so that tests step it.
//!
//! The rules, so that a probe only waits for its own pod:
//! - a pod has at most [`Limits::per_pod`] runs out; its other due runs
//!   wait in the queue while the runs of other pods pass them by. A pod
//!   whose probes hang (an exec `sleep 86400` with a day's timeout, a
//!   tcpSocket probe to a host that drops packets) delays its own probes
//!   and holds two runners, nobody else's;
//! - a run goes to the runner that went idle last, else to a new runner,
//!   as long as fewer than [`Limits::base`] runners are busy with runs out
//!   for less than [`Limits::slow`]: a run out for longer no longer counts,
//!   so slow runs make room for new runners instead of holding the others
//!   back, and fast ones share a few threads (110 pods with two probes each
//!   need at most four runners while runs take under a second; on a loaded
//!   node where they take longer, as many as run at once: a dozen, not 220);
//! - never more than [`Limits::max`] runners: by default the base plus
//!   `per_pod` for each pod the node may hold, so even a node full of pods
//!   whose probes all hang leaves each pod its share;
//! - a runner idle for [`Limits::idle`] ends. Idle runners are used last in,
//!   first out, so after a burst the extra runners sit idle and end; a
//!   node without probes keeps no runner.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use super::worker::Job;

/// Runs out per pod at most.
pub(crate) const PER_POD: usize = 2;
/// Runners busy with fast runs at most, before due runs wait.
pub(crate) const BASE: usize = 4;
/// How long a run is out before it no longer counts toward [`BASE`].
pub(crate) const SLOW: Duration = Duration::from_secs(1);
/// How long an idle runner waits for a run before it ends.
pub(crate) const IDLE: Duration = Duration::from_secs(60);
/// Runners at most, whatever the number of pods.
pub(crate) const HARD_MAX: usize = 1024;
/// How long after a runner failed to start no other is tried.
const RETRY: Duration = Duration::from_secs(1);

/// The pool's limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Limits {
    /// Runners busy with fast runs at most before due runs wait.
    pub(crate) base: usize,
    /// Runs out per pod at most.
    pub(crate) per_pod: usize,
    /// Runners at most.
    pub(crate) max: usize,
    /// A run out this long no longer counts toward `base`.
    pub(crate) slow: Duration,
    /// A runner idle this long ends.
    pub(crate) idle: Duration,
}

impl Limits {
    /// The limits for a node of at most `max_pods` pods: every pod can have
    /// its share out at once, beside [`BASE`] fast runs.
    pub(crate) fn for_pods(max_pods: usize) -> Limits {
        Limits {
            base: BASE,
            per_pod: PER_POD,
            max: BASE
                .saturating_add(PER_POD.saturating_mul(max_pods))
                .min(HARD_MAX),
            slow: SLOW,
            idle: IDLE,
        }
    }
}

impl Default for Limits {
    /// For upstream's default of 110 pods.
    fn default() -> Limits {
        Limits::for_pods(110)
    }
}

#[derive(Debug)]
enum Slot {
    Vacant,
    Idle(Instant),
    Busy { since: Instant, uid: String },
}

/// Where [`Pool::next`] sends a run: a runner that is there and idle, or
/// one to start in this slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Runner {
    Idle(usize),
    New(usize),
}

pub(crate) struct Pool {
    limits: Limits,
    /// Due runs, oldest first.
    queue: VecDeque<Job>,
    /// Runs out, by pod UID (no entry: none).
    out: HashMap<String, usize>,
    /// By runner number.
    slots: Vec<Slot>,
    /// Idle runners, the one idle last at the end.
    idle: Vec<usize>,
    /// No runner is started before this (one failed to start).
    no_start_until: Option<Instant>,
}

fn uid(job: &Job) -> &str {
    crate::pod::pod_uid(&job.pod)
}

impl Pool {
    pub(crate) fn new(limits: Limits) -> Pool {
        Pool {
            limits: Limits {
                base: limits.base.max(1),
                per_pod: limits.per_pod.max(1),
                max: limits.max.max(1),
                ..limits
            },
            queue: VecDeque::new(),
            out: HashMap::new(),
            slots: Vec::new(),
            idle: Vec::new(),
            no_start_until: None,
        }
    }

    /// Queues a due run.
    pub(crate) fn push(&mut self, job: Job) {
        self.queue.push_back(job);
    }

    /// Drops the pod's queued runs (its runs out finish on their own).
    pub(crate) fn remove_pod(&mut self, pod: &str) {
        self.queue.retain(|j| uid(j) != pod);
    }

    /// Runner threads there are (idle or busy).
    pub(crate) fn runners(&self) -> usize {
        self.slots
            .iter()
            .filter(|s| !matches!(s, Slot::Vacant))
            .count()
    }

    /// Runs waiting for a runner.
    #[cfg(test)]
    pub(crate) fn queued(&self) -> usize {
        self.queue.len()
    }

    /// Runs out for `pod`.
    #[cfg(test)]
    fn out(&self, pod: &str) -> usize {
        self.out.get(pod).copied().unwrap_or(0)
    }

    /// The oldest queued run whose pod may have another run out.
    fn eligible(&self) -> Option<usize> {
        let per_pod = self.limits.per_pod;
        self.queue
            .iter()
            .position(|j| self.out.get(uid(j)).copied().unwrap_or(0) < per_pod)
    }

    /// Busy runners whose run is out for less than `slow`.
    fn fast_busy(&self, now: Instant) -> usize {
        self.slots
            .iter()
            .filter(|s| match s {
                Slot::Busy { since, .. } => {
                    now.saturating_duration_since(*since) < self.limits.slow
                }
                _ => false,
            })
            .count()
    }

    fn may_start(&self, now: Instant) -> bool {
        self.no_start_until.is_none_or(|t| now >= t)
            && self.runners() < self.limits.max
            && self.fast_busy(now) < self.limits.base
    }

    /// The next run to hand out at `now` and the runner it goes to; `None`
    /// when none can go now ([`Pool::wake_at`] says when to ask again).
    pub(crate) fn next(&mut self, now: Instant) -> Option<(Runner, Job)> {
        let pos = self.eligible()?;
        let runner = if let Some(i) = self.idle.pop() {
            Runner::Idle(i)
        } else if self.may_start(now) {
            let i = match self.slots.iter().position(|s| matches!(s, Slot::Vacant)) {
                Some(i) => i,
                None => {
                    self.slots.push(Slot::Vacant);
                    self.slots.len() - 1
                }
            };
            Runner::New(i)
        } else {
            return None;
        };
        let job = self.queue.remove(pos)?;
        let pod = uid(&job).to_string();
        *self.out.entry(pod.clone()).or_default() += 1;
        let (Runner::Idle(i) | Runner::New(i)) = runner;
        self.slots[i] = Slot::Busy {
            since: now,
            uid: pod,
        };
        Some((runner, job))
    }

    /// The runner [`Pool::next`] asked for could not be started: its run
    /// goes back to the head of the queue, and no runner is started for a
    /// while.
    pub(crate) fn not_started(&mut self, slot: usize, job: Job, now: Instant) {
        self.release(slot);
        self.slots[slot] = Slot::Vacant;
        self.trim();
        self.queue.push_front(job);
        self.no_start_until = Some(now + RETRY);
    }

    /// Runner `slot` finished its run and is idle.
    pub(crate) fn finished(&mut self, slot: usize, now: Instant) {
        if !matches!(self.slots.get(slot), Some(Slot::Busy { .. })) {
            return;
        }
        self.release(slot);
        self.slots[slot] = Slot::Idle(now);
        self.idle.push(slot);
    }

    /// Counts a busy slot's run as no longer out.
    fn release(&mut self, slot: usize) {
        if let Some(Slot::Busy { uid, .. }) = self.slots.get(slot) {
            if let Some(n) = self.out.get_mut(uid) {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    let uid = uid.clone();
                    self.out.remove(&uid);
                    crate::malloc::shrink_map(&mut self.out);
                }
            }
        }
    }

    /// Ends the runners idle for `idle` at `now`: returns their numbers.
    pub(crate) fn reap(&mut self, now: Instant) -> Vec<usize> {
        let idle = self.limits.idle;
        let mut ended = Vec::new();
        self.idle.retain(|&i| match self.slots[i] {
            Slot::Idle(since) if now.saturating_duration_since(since) >= idle => {
                ended.push(i);
                false
            }
            _ => true,
        });
        for &i in &ended {
            self.slots[i] = Slot::Vacant;
        }
        self.trim();
        ended
    }

    fn trim(&mut self) {
        while matches!(self.slots.last(), Some(Slot::Vacant)) {
            self.slots.pop();
        }
    }

    /// When the pool next needs the prober thread, without a run finishing:
    /// an idle runner's time is up, or a queued run that waits only for a
    /// runner can have a new one (a busy run turns slow, or starting may be
    /// tried again).
    pub(crate) fn wake_at(&self, now: Instant) -> Option<Instant> {
        let mut at = self
            .slots
            .iter()
            .filter_map(|s| match s {
                Slot::Idle(since) => Some(*since + self.limits.idle),
                _ => None,
            })
            .min();
        let waiting =
            self.idle.is_empty() && self.runners() < self.limits.max && self.eligible().is_some();
        if waiting {
            let slow = self
                .slots
                .iter()
                .filter_map(|s| match s {
                    Slot::Busy { since, .. } => Some(*since + self.limits.slow),
                    _ => None,
                })
                .filter(|t| *t > now)
                .min();
            let retry = self.no_start_until.filter(|t| *t > now);
            at = [at, slow, retry].into_iter().flatten().min();
        }
        at
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::prober::spec::{Action, ProbeKind};
    use std::sync::Arc;

    fn job(pod: &str, probe: u64) -> Job {
        Job {
            probe,
            kind: ProbeKind::Liveness,
            action: Action::Exec(vec!["check".into()]),
            timeout: Duration::from_secs(1),
            pod: Arc::new(crate::runtime::fake::test_pod(pod, pod)),
            container: "app".into(),
            container_id: "c1".into(),
            pod_ip: None,
        }
    }

    fn limits() -> Limits {
        Limits {
            base: 4,
            per_pod: 2,
            max: 10,
            slow: Duration::from_secs(1),
            idle: Duration::from_secs(60),
        }
    }

    /// Hands out everything that can go at `now`: (runner, pod, probe).
    fn drain(pool: &mut Pool, now: Instant) -> Vec<(Runner, String, u64)> {
        let mut out = Vec::new();
        while let Some((r, j)) = pool.next(now) {
            out.push((r, uid(&j).to_string(), j.probe));
        }
        out
    }

    #[test]
    fn a_pod_has_at_most_its_share_out_and_others_pass_its_queued_runs() {
        let t0 = Instant::now();
        let mut pool = Pool::new(limits());
        for p in 0..100 {
            pool.push(job("hog", p));
        }
        pool.push(job("victim", 100));
        let out = drain(&mut pool, t0);
        assert_eq!(
            out,
            vec![
                (Runner::New(0), "hog".into(), 0),
                (Runner::New(1), "hog".into(), 1),
                (Runner::New(2), "victim".into(), 100),
            ]
        );
        assert_eq!((pool.out("hog"), pool.queued()), (2, 98));
        // The victim's run ends; its next one goes to the same runner,
        // while the hog's two still hang.
        pool.finished(2, t0 + Duration::from_millis(10));
        pool.push(job("victim", 100));
        let t = t0 + Duration::from_secs(10);
        assert_eq!(
            drain(&mut pool, t),
            vec![(Runner::Idle(2), "victim".into(), 100)]
        );
        assert_eq!(pool.runners(), 3);
        // One of the hog's runs ends: the next of its queue goes out.
        pool.finished(0, t);
        assert_eq!(
            drain(&mut pool, t),
            vec![(Runner::Idle(0), "hog".into(), 2)]
        );
        assert_eq!(pool.out("hog"), 2);
        // Removing the pod drops its queue.
        pool.remove_pod("hog");
        assert_eq!(pool.queued(), 0);
    }

    #[test]
    fn fast_runs_share_the_base_and_slow_ones_make_room() {
        let t0 = Instant::now();
        let mut pool = Pool::new(limits());
        for p in 0..6 {
            pool.push(job(&format!("p{p}"), p));
        }
        // Four runners for four fast runs; the other two wait.
        assert_eq!(drain(&mut pool, t0).len(), 4);
        assert_eq!(pool.queued(), 2);
        let half = t0 + Duration::from_millis(500);
        assert!(drain(&mut pool, half).is_empty());
        // The prober is woken when the runs out turn slow.
        assert_eq!(pool.wake_at(half), Some(t0 + Duration::from_secs(1)));
        let late = t0 + Duration::from_secs(1);
        let out = drain(&mut pool, late);
        assert_eq!(
            out.iter().map(|o| o.0).collect::<Vec<_>>(),
            vec![Runner::New(4), Runner::New(5)]
        );
        // A run that ends frees its runner for the next due run.
        pool.finished(1, late);
        pool.push(job("p9", 9));
        assert_eq!(
            drain(&mut pool, late),
            vec![(Runner::Idle(1), "p9".into(), 9)]
        );
    }

    #[test]
    fn never_past_max_runners() {
        let t0 = Instant::now();
        let mut pool = Pool::new(limits());
        for p in 0..20 {
            pool.push(job(&format!("p{p}"), p));
        }
        let mut t = t0;
        for _ in 0..5 {
            drain(&mut pool, t);
            t += Duration::from_secs(2);
        }
        assert_eq!(pool.runners(), 10);
        assert_eq!(pool.queued(), 10);
        assert_eq!(pool.wake_at(t), None, "nothing to wake for at the cap");
    }

    #[test]
    fn idle_runners_end_the_ones_used_last_first_kept() {
        let t0 = Instant::now();
        let mut pool = Pool::new(limits());
        for p in 0..3 {
            pool.push(job(&format!("p{p}"), p));
        }
        drain(&mut pool, t0);
        for slot in [0, 1, 2] {
            pool.finished(slot, t0);
        }
        // One run every 10 s keeps the runner used last (2) busy; 0 and 1
        // end a minute after their last run.
        let mut t = t0;
        for _ in 0..5 {
            t += Duration::from_secs(10);
            assert!(pool.reap(t).is_empty());
            pool.push(job("p0", 0));
            assert_eq!(drain(&mut pool, t), vec![(Runner::Idle(2), "p0".into(), 0)]);
            pool.finished(2, t);
        }
        assert_eq!(pool.wake_at(t), Some(t0 + IDLE));
        assert_eq!(pool.reap(t0 + IDLE), vec![0, 1]);
        assert_eq!(pool.runners(), 1);
        // The last one ends a minute after its last run; then nothing wakes.
        assert_eq!(pool.reap(t + IDLE), vec![2]);
        assert_eq!((pool.runners(), pool.wake_at(t + IDLE)), (0, None));
        // A new run starts runner 0 again.
        pool.push(job("p0", 0));
        assert_eq!(drain(&mut pool, t + IDLE)[0].0, Runner::New(0));
    }

    #[test]
    fn a_runner_that_cannot_start_puts_its_run_back_and_waits() {
        let t0 = Instant::now();
        let mut pool = Pool::new(limits());
        pool.push(job("a", 1));
        pool.push(job("b", 2));
        let (r, j) = pool.next(t0).unwrap();
        assert_eq!(r, Runner::New(0));
        pool.not_started(0, j, t0);
        assert_eq!((pool.runners(), pool.queued(), pool.out("a")), (0, 2, 0));
        assert!(pool.next(t0).is_none(), "no new start at once");
        assert_eq!(pool.wake_at(t0), Some(t0 + RETRY));
        let (r, j) = pool.next(t0 + RETRY).unwrap();
        assert_eq!((r, j.probe), (Runner::New(0), 1), "the same run first");
    }

    #[test]
    fn the_default_cap_leaves_every_pod_its_share() {
        let l = Limits::default();
        assert_eq!(l.max, BASE + PER_POD * 110);
        assert_eq!(Limits::for_pods(usize::MAX).max, HARD_MAX);
    }
}
