//! How the PLEG learns of changes without listing the runtime every
//! second: the `runtime-events` thread follows containerd's event stream on
//! the CRI socket (`cri::events`), and the relist [`Schedule`] relists soon
//! after each event and then only every [`EVENTED_RELIST_PERIOD`] while the
//! stream is up. A runtime without the stream (CRI-O) or a stream that
//! broke falls back to relisting every period (1 s), as upstream's generic
//! PLEG does.
//!
//! The runtime's CRI view can lag its events (containerd's CRI plugin
//! handles the same events on its own), so an event is followed by relists
//! every period for [`SETTLE`], and never more often than one a period:
//! a burst of pod starts costs the runtime no more lists than polling does.
//! A pod worker that waits for a status newer than its last sync asks for
//! a relist too (`wanted`), so a long period never holds a sync up.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender, TryRecvError};
use log::{debug, info, warn};
use parking_lot::Mutex;

use crate::cri::events::{Stopper, CRI_NAMESPACE};
use crate::cri::{Code, RuntimeService};
use crate::thread::{spawn_named, JoinOnDrop};

/// How often the runtime is listed while its events flow: a safety net for
/// an event lost or a change the runtime does not announce.
pub(crate) const EVENTED_RELIST_PERIOD: Duration = Duration::from_secs(30);
/// How long after an event relists keep to the period.
pub(crate) const SETTLE: Duration = Duration::from_secs(3);
/// The shortest wait between an event and the relist it causes, so that
/// the events of one change (a task's exit, then its delete) make one.
pub(crate) const COALESCE: Duration = Duration::from_millis(20);
/// After a task's exit (what a restart waits for), a second look this
/// long after the event, in case the runtime's CRI view had not caught up
/// at the first.
pub(crate) const RECHECK: Duration = Duration::from_millis(250);
/// The shortest time between relists that exits ask for.
pub(crate) const EXIT_GAP: Duration = Duration::from_millis(100);
/// The topics of a task's exit: the exit itself, and its delete, which
/// containerd's CRI plugin does on that exit just before its own view of
/// the container says Exited (measured: a relist 20 ms after the exit
/// does not see it yet, one 250 ms after does).
pub(crate) const EXIT_TOPICS: [&str; 2] = ["/tasks/exit", "/tasks/delete"];
/// Longest wait before subscribing again after the stream broke.
const MAX_RESUBSCRIBE: Duration = Duration::from_secs(30);

/// When the next relist is due: pure, stepped with the times of events and
/// relists, so tests need no clock.
#[derive(Debug)]
pub(crate) struct Schedule {
    period: Duration,
    evented_period: Duration,
    /// The start of the last relist that worked.
    last: Option<Instant>,
    next: Instant,
    /// Relists keep to `period` until then (set by events).
    settle_until: Option<Instant>,
    /// Relists due soon after exits (never more than a few).
    exits: Vec<Instant>,
}

impl Schedule {
    /// The first relist is due at `now`.
    pub(crate) fn new(now: Instant, period: Duration, evented_period: Duration) -> Self {
        Schedule {
            period,
            evented_period: evented_period.max(period),
            last: None,
            next: now,
            settle_until: None,
            exits: Vec::new(),
        }
    }

    pub(crate) fn next(&self) -> Instant {
        self.next
    }

    /// The earliest a relist may start: a period after the last one.
    fn earliest(&self, now: Instant) -> Instant {
        self.last.map_or(now, |l| (l + self.period).max(now))
    }

    /// The runtime announced a change at `now`.
    pub(crate) fn changed(&mut self, now: Instant) {
        self.settle_until = Some(now + SETTLE);
        let due = self.earliest(now + COALESCE);
        self.next = self.next.min(due);
    }

    /// A task exited at `now`: its container is restarted after the
    /// relist that sees it, so that relist is not held to the period (only
    /// to [`EXIT_GAP`]), and a second one follows [`RECHECK`] later.
    pub(crate) fn exited(&mut self, now: Instant) {
        self.settle_until = Some(now + SETTLE);
        if self.exits.len() < 8 {
            self.exits.extend([now + COALESCE, now + RECHECK]);
            self.exits.sort();
        }
        let due = self.last.map_or(now, |l| l + EXIT_GAP).max(now + COALESCE);
        self.next = self.next.min(due);
    }

    /// A pod worker waits at `now` for a status newer than the cache has.
    pub(crate) fn wanted(&mut self, now: Instant) {
        let due = self.earliest(now);
        self.next = self.next.min(due);
    }

    /// A relist that started at `started` worked; `events_live` says
    /// whether the event stream is up.
    pub(crate) fn relisted(&mut self, started: Instant, events_live: bool) {
        self.last = Some(started);
        let settling = self.settle_until.is_some_and(|t| started < t);
        let regular = if events_live && !settling {
            started + self.evented_period
        } else {
            started + self.period
        };
        self.exits.retain(|t| *t > started);
        self.next = match self.exits.first() {
            Some(t) => regular.min((*t).max(started + EXIT_GAP)),
            None => regular,
        };
    }

    /// A relist that started at `started` failed: the next in `delay`.
    pub(crate) fn failed(&mut self, started: Instant, delay: Duration) {
        self.next = started + delay;
    }
}

/// The signals the relist thread follows besides its timer.
pub(crate) struct Signals {
    /// An event of the runtime's (bounded(1): one pending stands for all).
    pub(crate) changed: Receiver<()>,
    /// A task's exit, likewise.
    pub(crate) exited: Receiver<()>,
    /// A worker waits for a newer status (bounded(1), likewise).
    pub(crate) wanted: Receiver<()>,
    /// Whether the event stream is up now.
    pub(crate) live: Arc<AtomicBool>,
}

/// Handle of the `runtime-events` thread; dropping it ends the stream and
/// joins the thread.
pub(crate) struct EventWatch {
    stop: Option<Sender<()>>,
    current: Arc<Mutex<Option<Stopper>>>,
    _thread: JoinOnDrop<()>,
}

impl EventWatch {
    /// Follows `runtime`'s events: each one sends on `changed`; `live` says
    /// whether the stream is up.
    pub(crate) fn start(
        runtime: Arc<dyn RuntimeService>,
        changed: Sender<()>,
        exited: Sender<()>,
        live: Arc<AtomicBool>,
        period: Duration,
    ) -> std::io::Result<EventWatch> {
        let (stop_tx, stop_rx) = crossbeam_channel::bounded(0);
        let current = Arc::new(Mutex::new(None));
        let c = current.clone();
        let signals = Senders { changed, exited };
        let thread = spawn_named("runtime-events", move || {
            follow(&*runtime, &signals, &live, &stop_rx, &c, period)
        })?;
        Ok(EventWatch {
            stop: Some(stop_tx),
            current,
            _thread: thread,
        })
    }
}

impl Drop for EventWatch {
    fn drop(&mut self) {
        // First the channel (seen by a thread between streams), then the
        // stream being read, if any.
        self.stop.take();
        if let Some(s) = self.current.lock().as_ref() {
            s.stop();
        }
    }
}

/// Where the `runtime-events` thread signals.
struct Senders {
    changed: Sender<()>,
    exited: Sender<()>,
}

fn stopped(stop: &Receiver<()>) -> bool {
    matches!(stop.try_recv(), Err(TryRecvError::Disconnected) | Ok(()))
}

fn follow(
    runtime: &dyn RuntimeService,
    signals: &Senders,
    live: &AtomicBool,
    stop: &Receiver<()>,
    current: &Mutex<Option<Stopper>>,
    period: Duration,
) {
    let mut wait = Duration::from_secs(1);
    // Whether an event came since the stream was last (re)made, and
    // whether the stream's being down has been logged.
    let mut flowed_once = false;
    let mut down_logged = false;
    loop {
        let opened = Instant::now();
        let mut flowed = false;
        let error = match runtime.subscribe_changes() {
            Ok(mut stream) => {
                *current.lock() = Some(stream.stopper());
                if stopped(stop) {
                    return;
                }
                // Up (until the first read says otherwise): one relist for
                // what changed meanwhile, then the long period.
                if !live.swap(true, Ordering::SeqCst) {
                    let _ = signals.changed.try_send(());
                }
                let error = loop {
                    match stream.next() {
                        Some(Ok(env)) => {
                            if !flowed_once {
                                info!(
                                    "following the runtime's events: relisting every {}s while they flow",
                                    EVENTED_RELIST_PERIOD.as_secs()
                                );
                                flowed_once = true;
                            }
                            if !flowed && down_logged {
                                info!("runtime event stream is back");
                            }
                            flowed = true;
                            down_logged = false;
                            if env.namespace == CRI_NAMESPACE {
                                debug!("runtime event {}", env.topic);
                                let _ = if EXIT_TOPICS.contains(&env.topic.as_str()) {
                                    signals.exited.try_send(())
                                } else {
                                    signals.changed.try_send(())
                                };
                            }
                        }
                        Some(Err(e)) => break Some(e),
                        None => break None,
                    }
                };
                *current.lock() = None;
                // Down: relists every period again, the first at once.
                if live.swap(false, Ordering::SeqCst) {
                    let _ = signals.changed.try_send(());
                }
                if stopped(stop) {
                    return;
                }
                error
            }
            Err(e) => Some(e),
        };
        if let Some(e) = &error {
            if e.code() == Some(Code::Unimplemented) {
                info!(
                    "the runtime has no event stream ({e}); relisting it every {}s",
                    period.as_secs_f32()
                );
                return;
            }
        }
        // A stream that carried events, or lasted, was up: it is made again
        // soon, and its end is worth a line.
        let was_up = flowed || opened.elapsed() > MAX_RESUBSCRIBE;
        if was_up {
            wait = Duration::from_secs(1);
        }
        let why = error.map_or_else(|| "the runtime ended it".to_string(), |e| e.to_string());
        if was_up && !down_logged {
            warn!(
                "runtime event stream down ({why}); relisting every {}s until it is back",
                period.as_secs_f32()
            );
            down_logged = true;
        } else {
            debug!(
                "runtime event stream: {why}; subscribing again in {}s",
                wait.as_secs()
            );
        }
        match stop.recv_timeout(wait) {
            Err(RecvTimeoutError::Timeout) => {}
            _ => return,
        }
        wait = (wait * 2).min(MAX_RESUBSCRIBE);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cri::events::{ChangeStream, Envelope};
    use crate::cri::CriError;
    use crate::runtime::fake::FakeRuntime;

    /// Gives its events, then ends with `end` (an error), or, without one,
    /// waits until stopped.
    struct Scripted {
        events: Vec<Envelope>,
        end: Option<CriError>,
        stopper: Stopper,
    }

    impl ChangeStream for Scripted {
        fn next(&mut self) -> Option<Result<Envelope, CriError>> {
            if !self.events.is_empty() {
                return Some(Ok(self.events.remove(0)));
            }
            if let Some(e) = self.end.take() {
                return Some(Err(e));
            }
            self.stopper.read_here();
            while !self.stopper.is_stopped() {
                std::thread::park();
            }
            None
        }

        fn stopper(&self) -> Stopper {
            self.stopper.clone()
        }
    }

    fn env(ns: &str) -> Envelope {
        Envelope {
            namespace: ns.into(),
            topic: EXIT_TOPICS[0].into(),
        }
    }

    fn start(ns: &str) -> Envelope {
        Envelope {
            namespace: ns.into(),
            topic: "/tasks/start".into(),
        }
    }

    /// Events of the CRI namespace signal a change; a broken stream is
    /// made again and the relists go back to polling meanwhile; dropping
    /// the watch ends a stream that waits.
    #[test]
    fn the_watch_signals_events_resubscribes_after_a_break_and_stops_on_drop() {
        let fake = Arc::new(FakeRuntime::default());
        fake.push_change_stream(Box::new(Scripted {
            events: vec![env("k8s.io"), env("moby"), start("k8s.io")],
            end: Some(CriError::status(
                "Subscribe",
                "fake",
                Code::Unavailable,
                "gone",
            )),
            stopper: Stopper::default(),
        }));
        fake.push_change_stream(Box::new(Scripted {
            events: vec![],
            end: None,
            stopper: Stopper::default(),
        }));
        let (tx, rx) = crossbeam_channel::bounded(1);
        let (exit_tx, exit_rx) = crossbeam_channel::bounded(1);
        let live = Arc::new(AtomicBool::new(false));
        let watch = EventWatch::start(
            fake.clone(),
            tx,
            exit_tx,
            live.clone(),
            Duration::from_secs(1),
        )
        .unwrap();
        // The first stream: up, an exit and a start, down; the exit in the
        // CRI namespace is told apart from other changes.
        assert!(exit_rx.recv_timeout(Duration::from_secs(2)).is_ok());
        assert!(rx.recv_timeout(Duration::from_secs(2)).is_ok());
        // The second, a second later: up and waiting.
        let t0 = Instant::now();
        while !(live.load(Ordering::SeqCst) && t0.elapsed() > Duration::from_millis(900)) {
            assert!(
                t0.elapsed() < Duration::from_secs(5),
                "not subscribed again"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        let t1 = Instant::now();
        drop(watch);
        assert!(
            t1.elapsed() < Duration::from_secs(1),
            "the drop waited for the stream"
        );
        assert!(!live.load(Ordering::SeqCst));
    }

    #[test]
    fn a_runtime_without_events_ends_the_watch_for_good() {
        let fake = Arc::new(FakeRuntime::default());
        let (tx, rx) = crossbeam_channel::bounded(1);
        let (exit_tx, _exit_rx) = crossbeam_channel::bounded(1);
        let live = Arc::new(AtomicBool::new(false));
        let _watch =
            EventWatch::start(fake, tx, exit_tx, live.clone(), Duration::from_secs(1)).unwrap();
        // The thread ends, and with it the sender: the relist thread sees
        // a disconnected channel (and stops selecting on it).
        assert_eq!(
            rx.recv_timeout(Duration::from_secs(2)),
            Err(crossbeam_channel::RecvTimeoutError::Disconnected)
        );
        assert!(!live.load(Ordering::SeqCst));
    }

    const P: Duration = Duration::from_secs(1);

    #[test]
    fn while_events_flow_idle_relists_fall_to_the_long_period() {
        let t0 = Instant::now();
        let mut s = Schedule::new(t0, P, EVENTED_RELIST_PERIOD);
        assert_eq!(s.next(), t0);
        s.relisted(t0, false);
        assert_eq!(s.next(), t0 + P, "polling while the stream is down");
        s.relisted(t0 + P, true);
        assert_eq!(s.next(), t0 + P + EVENTED_RELIST_PERIOD);
    }

    #[test]
    fn an_event_brings_a_relist_soon_then_every_period_while_it_settles() {
        let t0 = Instant::now();
        let mut s = Schedule::new(t0, P, EVENTED_RELIST_PERIOD);
        s.relisted(t0, true);
        // Long after the last relist: at once (after the coalescing wait).
        let e = t0 + Duration::from_secs(10);
        s.changed(e);
        assert_eq!(s.next(), e + COALESCE);
        s.relisted(e + COALESCE, true);
        // The runtime's view may lag its event: again a period later, for
        // SETTLE after the event.
        assert_eq!(s.next(), e + COALESCE + P);
        s.relisted(e + COALESCE + P, true);
        s.relisted(e + COALESCE + 2 * P, true);
        let settled = e + COALESCE + 3 * P;
        s.relisted(settled, true);
        assert_eq!(s.next(), settled + EVENTED_RELIST_PERIOD);
    }

    #[test]
    fn a_burst_of_events_lists_no_more_often_than_polling() {
        let t0 = Instant::now();
        let mut s = Schedule::new(t0, P, EVENTED_RELIST_PERIOD);
        s.relisted(t0, true);
        for ms in (0..900).step_by(10) {
            s.changed(t0 + Duration::from_millis(ms));
            assert_eq!(s.next(), t0 + P, "at {ms} ms");
        }
    }

    #[test]
    fn an_exit_is_looked_at_at_once_and_again_not_held_to_the_period() {
        let t0 = Instant::now();
        let mut s = Schedule::new(t0, P, EVENTED_RELIST_PERIOD);
        s.relisted(t0, true);
        // 300 ms after a relist (a start's, say): not held until t0 + 1 s.
        let e = t0 + Duration::from_millis(300);
        s.exited(e);
        assert_eq!(s.next(), e + COALESCE);
        s.relisted(e + COALESCE, true);
        assert_eq!(s.next(), e + RECHECK, "a second look");
        s.relisted(e + RECHECK, true);
        assert_eq!(s.next(), e + RECHECK + P, "then the settling period");
        // Right after a relist: EXIT_GAP after it.
        let mut s = Schedule::new(t0, P, EVENTED_RELIST_PERIOD);
        s.relisted(t0, true);
        s.exited(t0 + Duration::from_millis(10));
        assert_eq!(s.next(), t0 + EXIT_GAP);
    }

    #[test]
    fn a_waiting_worker_gets_a_relist_within_a_period() {
        let t0 = Instant::now();
        let mut s = Schedule::new(t0, P, EVENTED_RELIST_PERIOD);
        s.relisted(t0, true);
        s.wanted(t0 + Duration::from_millis(300));
        assert_eq!(s.next(), t0 + P);
        s.relisted(t0 + P, true);
        s.wanted(t0 + Duration::from_secs(20));
        assert_eq!(s.next(), t0 + Duration::from_secs(20));
        // A failed relist keeps its back-off.
        s.failed(t0 + Duration::from_secs(20), Duration::from_secs(4));
        assert_eq!(s.next(), t0 + Duration::from_secs(24));
    }
}
