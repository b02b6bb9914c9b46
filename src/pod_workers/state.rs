//! `PodSyncState`: a pod worker's decisions as a plain state machine, with
//! no thread, channel or runtime in it, so that tests step it with a clock
//! of their own (as `prober::worker` does for probes).
//!
//! The worker thread (`run_worker` in the parent module) is a driver: it
//! takes the pod's work from its mailbox, asks the state what the work
//! means ([`PodSyncState::step`]), does the I/O (status wait, volumes,
//! SyncPod, the kill), and tells the state how that ended; the state
//! answers with when to sync again, how long to wait before a retry, and
//! whether the pod's start is to be recorded. What it keeps between turns:
//! the last sync's time (the next one waits for a status newer than it),
//! the containers' waiting reasons (upstream's `ReasonCache`), whether the
//! pod's active deadline passed, and the panic and retry counts.

use std::time::{Duration, Instant};

use crate::runtime::WaitingReasons;

/// Delay before retrying a pod whose sync failed (upstream backOffPeriod).
pub(crate) const ERROR_BACKOFF: Duration = Duration::from_secs(10);

/// The first wait before a termination that panicked is tried again; it
/// doubles with each panic in a row, up to [`ERROR_BACKOFF`].
const KILL_PANIC_RETRY: Duration = Duration::from_millis(250);
/// The first wait before a failed termination is tried again; it doubles
/// with each failure, up to [`TERMINATE_RETRY_MAX`].
const TERMINATE_RETRY: Duration = Duration::from_millis(500);
/// The longest wait between two tries of a termination.
const TERMINATE_RETRY_MAX: Duration = Duration::from_secs(10);

/// What the sync loop hands a pod's worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum UpdateType {
    Create,
    Update,
    Sync,
    Kill,
}

/// What a piece of work means for the pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Step {
    /// Stop and remove everything of the pod; the worker then ends.
    Terminate,
    /// Bring the pod to its spec (volumes, then SyncPod), once a status
    /// newer than the last sync is in, unless it is past its deadline
    /// ([`PodSyncState::is_past_deadline`]).
    Sync,
}

/// How a sync ended, as far as the next one is concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum SyncEnd {
    Done,
    /// A container is in its restart back-off for this long still.
    BackOff(Duration),
    Failed,
}

/// What the worker does after a sync.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct AfterSync {
    /// Sync again after this long (through the work queue).
    pub(crate) resync: Duration,
    /// The pod's status said Running for the first time: from when the
    /// kubelet first saw the pod until `now`, for
    /// `kubelet_pod_start_duration_seconds`.
    pub(crate) started: Option<Duration>,
}

/// A pod worker's state between its turns.
#[derive(Debug, Default)]
pub(super) struct PodSyncState {
    /// When the last sync (or try) ended: the next waits for a newer status.
    pub(crate) last_sync: Option<Instant>,
    /// Why containers wait, by name, as the syncs so far found it
    /// (upstream's `ReasonCache`), for the pod's status.
    pub(crate) reasons: WaitingReasons,
    /// The pod's restart back-off (CrashLoopBackOff), grown and read by
    /// its syncs; it goes with the worker when the pod is removed.
    pub(crate) restart_backoff: crate::runtime::backoff::Backoff,
    /// Panics in a row while terminating: each retry waits longer.
    kill_panics: u32,
    /// Failed tries of the current termination.
    terminate_failures: u32,
    /// When the sync loop first handed this pod over (the kubelet first
    /// saw it), until its start was recorded for
    /// `kubelet_pod_start_duration_seconds`.
    first_seen: Option<Instant>,
    start_recorded: bool,
    /// The pod's active deadline passed: its containers were stopped and
    /// are never started again.
    deadline_exceeded: bool,
    /// What the volume manager set up of the pod's volumes (the projected
    /// tokens it keeps until they are due).
    pub(crate) volumes: crate::volume::PodVolumes,
}

impl PodSyncState {
    /// Work handed over by the sync loop at `handed_over` is taken.
    pub(crate) fn handed_over(&mut self, handed_over: Instant) {
        self.first_seen.get_or_insert(handed_over);
    }

    /// What `work` means for the pod.
    pub(crate) fn step(&self, work: UpdateType) -> Step {
        if work == UpdateType::Kill {
            Step::Terminate
        } else {
            Step::Sync
        }
    }

    /// Whether a sync is to stop the pod for its active deadline instead
    /// (stop what runs, report it Failed, start nothing again).
    /// `deadline_passed` says whether the deadline is behind it and it did
    /// not reach a terminal phase of its own before (then a deadline changes
    /// nothing, as upstream no longer syncs a terminated pod); it is asked
    /// only while the pod is not past its deadline already: once there, it
    /// stays.
    pub(crate) fn is_past_deadline(&self, deadline_passed: impl FnOnce() -> bool) -> bool {
        self.deadline_exceeded || deadline_passed()
    }

    /// The pod was stopped for its active deadline at `now`; true the first
    /// time (its event is recorded and its probes stopped once).
    pub(crate) fn deadline_reached(&mut self, now: Instant) -> bool {
        self.last_sync = Some(now);
        !std::mem::replace(&mut self.deadline_exceeded, true)
    }

    /// The pod's status could not be read, or its volumes set up: try again
    /// after the returned delay.
    pub(crate) fn not_synced(&mut self, now: Instant) -> Duration {
        self.last_sync = Some(now);
        ERROR_BACKOFF
    }

    /// A sync ended at `now` as `end`, the status it reported saying
    /// Running or not; `time_left` is what remains before the pod's active
    /// deadline, if it has one. The next sync comes after `sync-frequency`
    /// (`resync_interval`) on success, after the rest of a back-off, after
    /// [`ERROR_BACKOFF`] for other errors; never later than the deadline.
    pub(crate) fn synced(
        &mut self,
        now: Instant,
        end: SyncEnd,
        running: bool,
        resync_interval: Duration,
        time_left: Option<Duration>,
    ) -> AfterSync {
        self.last_sync = Some(now);
        let mut started = None;
        if running && !self.start_recorded {
            // As upstream: from first seen to the first status that says Running.
            self.start_recorded = true;
            started = self
                .first_seen
                .map(|seen| now.saturating_duration_since(seen));
        }
        let after = match end {
            SyncEnd::Done => resync_interval,
            SyncEnd::BackOff(left) => left,
            SyncEnd::Failed => ERROR_BACKOFF,
        };
        // Woken at the deadline at the latest, not at the next resync.
        let resync = time_left
            .filter(|d| !d.is_zero())
            .map_or(after, |d| after.min(d));
        AfterSync { resync, started }
    }

    /// A sync panicked at `now`: try again after the returned delay.
    pub(crate) fn sync_panicked(&mut self, now: Instant) -> Duration {
        self.last_sync = Some(now);
        ERROR_BACKOFF
    }

    /// A termination panicked at `now`: it is tried again after the
    /// returned delay, without a grace period (and so without the preStop
    /// hooks that may be what panicked). The delay doubles with each panic
    /// in a row, up to 8 s (never more than [`ERROR_BACKOFF`]).
    pub(crate) fn kill_panicked(&mut self, now: Instant) -> Duration {
        self.last_sync = Some(now);
        self.kill_panics = self.kill_panics.saturating_add(1);
        KILL_PANIC_RETRY
            .saturating_mul(1 << self.kill_panics.min(5))
            .min(ERROR_BACKOFF)
    }

    /// A termination begins: its retries start from the shortest delay.
    pub(crate) fn terminate_begins(&mut self) {
        self.terminate_failures = 0;
    }

    /// A try of the termination failed: the next one waits the returned
    /// delay (doubling from 500 ms up to 10 s).
    pub(crate) fn terminate_failed(&mut self) -> Duration {
        let delay = TERMINATE_RETRY
            .saturating_mul(1 << self.terminate_failures.min(5))
            .min(TERMINATE_RETRY_MAX);
        self.terminate_failures = self.terminate_failures.saturating_add(1);
        delay
    }
}

/// Whether pending work `pending` gives way to `new` in a worker's one-slot
/// mailbox: the latest wins, except that a kill is never replaced by a sync.
pub(super) fn replaces(pending: UpdateType, new: UpdateType) -> bool {
    !(pending == UpdateType::Kill && new != UpdateType::Kill)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEC: Duration = Duration::from_secs(1);
    const RESYNC: Duration = Duration::from_secs(60);

    #[test]
    fn the_next_sync_follows_how_the_last_ended_and_never_passes_the_deadline() {
        let t0 = Instant::now();
        let mut s = PodSyncState::default();
        let resync =
            |s: &mut PodSyncState, end, left| s.synced(t0 + SEC, end, false, RESYNC, left).resync;
        assert_eq!(resync(&mut s, SyncEnd::Done, None), RESYNC);
        assert_eq!(s.last_sync, Some(t0 + SEC));
        assert_eq!(resync(&mut s, SyncEnd::BackOff(7 * SEC), None), 7 * SEC);
        assert_eq!(resync(&mut s, SyncEnd::Failed, None), ERROR_BACKOFF);
        // Woken at the deadline at the latest.
        assert_eq!(resync(&mut s, SyncEnd::Done, Some(3 * SEC)), 3 * SEC);
        assert_eq!(
            resync(&mut s, SyncEnd::BackOff(2 * SEC), Some(3 * SEC)),
            2 * SEC
        );
        // A deadline already behind does not make it spin.
        assert_eq!(resync(&mut s, SyncEnd::Done, Some(Duration::ZERO)), RESYNC);
        assert_eq!(s.not_synced(t0 + 2 * SEC), ERROR_BACKOFF);
        assert_eq!(s.last_sync, Some(t0 + 2 * SEC));
    }

    #[test]
    fn the_start_is_recorded_once_from_when_the_pod_was_first_handed_over() {
        let t0 = Instant::now();
        let mut s = PodSyncState::default();
        s.handed_over(t0);
        s.handed_over(t0 + SEC);
        let sync = |s: &mut PodSyncState, at: Duration, running| {
            s.synced(t0 + at, SyncEnd::Done, running, RESYNC, None)
                .started
        };
        assert_eq!(sync(&mut s, 2 * SEC, false), None);
        assert_eq!(sync(&mut s, 3 * SEC, true), Some(3 * SEC));
        assert_eq!(sync(&mut s, 4 * SEC, true), None);
    }

    #[test]
    fn a_pod_past_its_deadline_stays_there() {
        let t0 = Instant::now();
        let mut s = PodSyncState::default();
        for t in [UpdateType::Create, UpdateType::Update, UpdateType::Sync] {
            assert_eq!(s.step(t), Step::Sync);
        }
        assert_eq!(s.step(UpdateType::Kill), Step::Terminate);
        assert!(!s.is_past_deadline(|| false));
        assert!(s.is_past_deadline(|| true));
        assert!(s.deadline_reached(t0), "the first time");
        assert!(!s.deadline_reached(t0 + SEC));
        assert_eq!(s.last_sync, Some(t0 + SEC));
        // Later syncs never start it again, whatever they find (the
        // deadline is not even looked at).
        assert!(s.is_past_deadline(|| panic!("the deadline is not asked again")));
        // A kill still terminates it.
        assert_eq!(s.step(UpdateType::Kill), Step::Terminate);
    }

    #[test]
    fn retries_of_a_panicking_kill_wait_longer_each_time() {
        let t0 = Instant::now();
        let mut s = PodSyncState::default();
        let waits: Vec<_> = (0..7).map(|_| s.kill_panicked(t0)).collect();
        let ms = |m| Duration::from_millis(m);
        assert_eq!(
            waits,
            vec![
                ms(500),
                ms(1000),
                ms(2000),
                ms(4000),
                ms(8000),
                ms(8000),
                ms(8000)
            ]
        );
        assert!(waits.iter().all(|w| *w <= ERROR_BACKOFF));
        assert_eq!(s.sync_panicked(t0 + SEC), ERROR_BACKOFF);
        assert_eq!(s.last_sync, Some(t0 + SEC));
    }

    #[test]
    fn a_failing_termination_is_retried_with_a_doubling_delay() {
        let mut s = PodSyncState::default();
        let waits: Vec<_> = (0..7).map(|_| s.terminate_failed()).collect();
        let ms = |m| Duration::from_millis(m);
        assert_eq!(
            waits,
            vec![
                ms(500),
                ms(1000),
                ms(2000),
                ms(4000),
                ms(8000),
                10 * SEC,
                10 * SEC
            ]
        );
        // The next termination (after a panic) starts over.
        s.terminate_begins();
        assert_eq!(s.terminate_failed(), ms(500));
    }

    #[test]
    fn the_latest_work_wins_but_a_kill_is_never_replaced_by_a_sync() {
        use UpdateType::*;
        for pending in [Create, Update, Sync] {
            for new in [Create, Update, Sync, Kill] {
                assert!(replaces(pending, new), "{pending:?} by {new:?}");
            }
        }
        for new in [Create, Update, Sync] {
            assert!(!replaces(Kill, new));
        }
        assert!(replaces(Kill, Kill), "a later kill (its grace period) wins");
    }
}
