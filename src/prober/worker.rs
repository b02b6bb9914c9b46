//! The probe state machine (upstream `worker.go`'s `doProbe` and the
//! results managers) for every probe of every pod, driven by the `prober`
//! thread but free of threads and clocks itself, so that tests step it with
//! a fake clock.
//!
//! Each probe ticks every `periodSeconds` from when its pod was added (a
//! first run at once, or spread over one period in the first period after
//! tinylet started, as upstream). At a tick the probe, as upstream:
//! - waits while its container has no ID yet;
//! - on a new container ID drops the old ID's result, sets the initial one
//!   (liveness Success, readiness Failure, startup Unknown) and leaves hold;
//! - stays quiet while on hold (after a liveness or startup failure, until
//!   the container is replaced);
//! - for a container that is not running sets Failure, and stops for good
//!   when the container ended and the pod's restartPolicy is Never;
//! - ends liveness and startup probes of a pod being deleted, and skips
//!   any run within `initialDelaySeconds` of the container's start;
//! - runs only the startup probe until it has succeeded, and then only the
//!   others;
//! - otherwise hands a [`Job`] to a runner. A probe has at most one job out;
//!   a tick that finds one out is remembered and run when the job is back.
//!
//! A result counts once it repeated `failureThreshold` (or
//! `successThreshold`) times in a row; an errored run is thrown away.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Container, Pod};

use crate::runtime::actions::is_restartable_init;
use parking_lot::RwLock;

use super::spec::{Action, ProbeKind, ProbeSpec};

pub(crate) type ProbeId = u64;

/// A probe's standing result (upstream `results.Result`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ProbeResult {
    Unknown,
    Success,
    Failure,
}

/// What one run found; the runner has reported failures as events already.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    Success,
    Failure,
    /// The probe could not be run (the result is thrown away).
    Error,
}

/// The standing result of each probe by container ID, read by pod workers
/// (liveness kills, `ready` and `started` in the status) and written only
/// by the prober thread. Short critical sections, no I/O under the lock.
#[derive(Default)]
pub struct ProbeResults {
    by_container: RwLock<HashMap<String, [Option<ProbeResult>; 3]>>,
}

impl ProbeResults {
    /// The result of the `kind` probe of container `id`; `None` before
    /// the prober has seen that container.
    pub(crate) fn get(&self, id: &str, kind: ProbeKind) -> Option<ProbeResult> {
        self.by_container
            .read()
            .get(id)
            .and_then(|r| r[kind.index()])
    }

    /// Sets a result; true when it changed.
    fn set(&self, id: &str, kind: ProbeKind, r: ProbeResult) -> bool {
        let mut map = self.by_container.write();
        let slot = &mut map.entry(id.to_string()).or_default()[kind.index()];
        let changed = *slot != Some(r);
        *slot = Some(r);
        changed
    }

    #[cfg(test)]
    pub(crate) fn set_for_test(&self, id: &str, kind: ProbeKind, r: ProbeResult) {
        self.set(id, kind, r);
    }

    fn remove(&self, id: &str, kind: ProbeKind) {
        let mut map = self.by_container.write();
        if let Some(r) = map.get_mut(id) {
            r[kind.index()] = None;
            if r.iter().all(Option::is_none) {
                map.remove(id);
            }
        }
    }

    pub fn len(&self) -> usize {
        self.by_container.read().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A pod whose standing result changed (its UID), and the kind of probe.
pub(crate) type Changed = (String, ProbeKind);

/// A container as its pod's worker last saw it in the runtime.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct SeenContainer {
    pub(crate) name: String,
    /// The CRI container ID of its newest instance.
    pub(crate) id: String,
    pub(crate) running: bool,
    /// It ran and ended.
    pub(crate) exited: bool,
    /// When it started, in nanoseconds since the epoch.
    pub(crate) started_at: i64,
}

/// What the prober knows of a pod: sent by its worker after each sync.
#[derive(Debug, Clone)]
pub(crate) struct PodInput {
    pub(crate) pod: Arc<Pod>,
    /// Where httpGet and tcpSocket probes without a host connect.
    pub(crate) pod_ip: Option<String>,
    pub(crate) containers: Vec<SeenContainer>,
}

/// One probe run, for a runner.
#[derive(Debug, Clone)]
pub(crate) struct Job {
    pub(crate) probe: ProbeId,
    pub(crate) kind: ProbeKind,
    pub(crate) action: Action,
    pub(crate) timeout: Duration,
    pub(crate) pod: Arc<Pod>,
    pub(crate) container: String,
    pub(crate) container_id: String,
    pub(crate) pod_ip: Option<String>,
}

/// Now, on both clocks: ticks run on the monotonic one, the initial delay
/// is measured against the container's start time on the wall clock.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Now {
    pub(crate) mono: Instant,
    /// Nanoseconds since the epoch.
    pub(crate) wall_ns: i64,
}

impl Now {
    pub(crate) fn current() -> Now {
        Now {
            mono: Instant::now(),
            wall_ns: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
                .unwrap_or(0),
        }
    }
}

struct Probe {
    uid: String,
    container: String,
    kind: ProbeKind,
    spec: ProbeSpec,
    /// The container instance this probe follows (empty: none yet).
    container_id: String,
    on_hold: bool,
    last: Option<ProbeResult>,
    run: u32,
    in_flight: bool,
    /// A tick came while a job was out.
    missed: bool,
    /// The heap entry that is this probe's next tick.
    next_due: Instant,
}

struct PodProbes {
    input: PodInput,
    probes: Vec<ProbeId>,
}

/// Every probe of every pod.
pub(crate) struct Probes {
    results: Arc<ProbeResults>,
    probes: HashMap<ProbeId, Probe>,
    pods: HashMap<String, PodProbes>,
    heap: BinaryHeap<Reverse<(Instant, ProbeId)>>,
    next_id: ProbeId,
}

/// The containers whose probes run: the regular ones and the sidecars
/// (restartable init containers), as upstream.
pub(crate) fn probed_containers(pod: &Pod) -> impl Iterator<Item = &Container> {
    let spec = pod.spec.as_ref();
    let regular = spec.map(|s| s.containers.as_slice()).unwrap_or(&[]);
    let init = spec
        .and_then(|s| s.init_containers.as_deref())
        .unwrap_or(&[]);
    regular
        .iter()
        .chain(init.iter().filter(|c| is_restartable_init(c)))
}

/// Whether the pod has any probe (on a regular container or a sidecar).
pub(crate) fn has_probes(pod: &Pod) -> bool {
    probed_containers(pod).any(|c| ProbeKind::ALL.iter().any(|k| k.of(c).is_some()))
}

fn pod_uid(pod: &Pod) -> &str {
    crate::pod::pod_uid(pod)
}

/// A fraction in [0, 1) that spreads first ticks, stable per probe.
fn spread_fraction(id: ProbeId) -> f64 {
    let h = id.wrapping_add(1).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 11;
    h as f64 / (1u64 << 53) as f64
}

impl Probes {
    pub(crate) fn new(results: Arc<ProbeResults>) -> Probes {
        Probes {
            results,
            probes: HashMap::new(),
            pods: HashMap::new(),
            heap: BinaryHeap::new(),
            next_id: 0,
        }
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.probes.len()
    }

    /// The standing results these probes write.
    pub(crate) fn results(&self) -> &ProbeResults {
        &self.results
    }

    #[cfg(test)]
    pub(crate) fn pods(&self) -> usize {
        self.pods.len()
    }

    /// Takes a pod's latest state, adding its probes if it is new. A new
    /// probe ticks at once, unless the prober has run for less than the
    /// probe's period (`age`): then its first tick falls somewhere in that
    /// period, so that probes found at a restart do not all run together.
    pub(crate) fn update_pod(&mut self, input: PodInput, now: Instant, age: Duration) {
        let uid = pod_uid(&input.pod).to_string();
        if let Some(p) = self.pods.get_mut(&uid) {
            p.input = input;
            return;
        }
        let mut ids = Vec::new();
        let containers: Vec<Container> = probed_containers(&input.pod).cloned().collect();
        for c in &containers {
            for kind in ProbeKind::ALL {
                let Some(p) = kind.of(c) else { continue };
                let id = self.next_id;
                self.next_id += 1;
                let spec = ProbeSpec::new(p, c);
                let first = if spec.period > age {
                    now + spec.period.mul_f64(spread_fraction(id))
                } else {
                    now
                };
                self.heap.push(Reverse((first, id)));
                self.probes.insert(
                    id,
                    Probe {
                        uid: uid.clone(),
                        container: c.name.clone(),
                        kind,
                        spec,
                        container_id: String::new(),
                        on_hold: false,
                        last: None,
                        run: 0,
                        in_flight: false,
                        missed: false,
                        next_due: first,
                    },
                );
                ids.push(id);
            }
        }
        if !ids.is_empty() {
            self.pods.insert(uid, PodProbes { input, probes: ids });
        }
    }

    /// Stops a pod's probes and forgets their results.
    pub(crate) fn remove_pod(&mut self, uid: &str) {
        if let Some(p) = self.pods.remove(uid) {
            for id in p.probes {
                self.stop(id);
            }
            crate::malloc::shrink_map(&mut self.pods);
            crate::malloc::shrink_map(&mut self.probes);
        }
    }

    fn stop(&mut self, id: ProbeId) {
        if let Some(p) = self.probes.remove(&id) {
            crate::metrics::probe_removed(p.kind.name(), &p.container, &p.uid);
            if !p.container_id.is_empty() {
                self.results.remove(&p.container_id, p.kind);
            }
        }
    }

    /// When the earliest tick is due (possibly one for a removed probe).
    pub(crate) fn next_due(&self) -> Option<Instant> {
        self.heap.peek().map(|Reverse((t, _))| *t)
    }

    /// Runs the ticks due at `now`: returns the jobs to run, and adds the
    /// pods whose results changed to `changed`, with the kind of probe.
    pub(crate) fn due(&mut self, now: Now, changed: &mut Vec<Changed>) -> Vec<Job> {
        let mut jobs = Vec::new();
        while let Some(Reverse((t, id))) = self.heap.peek().copied() {
            if t > now.mono {
                break;
            }
            self.heap.pop();
            let Some(p) = self.probes.get_mut(&id) else {
                continue;
            };
            if p.next_due != t {
                continue;
            }
            // The next tick, on the period's grid unless far behind.
            let mut next = t + p.spec.period;
            if next <= now.mono {
                next = now.mono + p.spec.period;
            }
            p.next_due = next;
            self.heap.push(Reverse((next, id)));
            if p.in_flight {
                p.missed = true;
                continue;
            }
            match self.tick(id, now, changed) {
                Tick::Run(job) => {
                    if let Some(p) = self.probes.get_mut(&id) {
                        p.in_flight = true;
                    }
                    jobs.push(*job);
                }
                Tick::Wait => {}
                Tick::Stop => {
                    if let Some(uid) = self.probes.get(&id).map(|p| p.uid.clone()) {
                        if let Some(pp) = self.pods.get_mut(&uid) {
                            pp.probes.retain(|i| *i != id);
                        }
                    }
                    self.stop(id);
                }
            }
        }
        jobs
    }

    /// One tick of one probe: upstream `doProbe` up to the run itself.
    fn tick(&mut self, id: ProbeId, now: Now, changed: &mut Vec<Changed>) -> Tick {
        let Some(p) = self.probes.get_mut(&id) else {
            return Tick::Stop;
        };
        let Some(pod) = self.pods.get(&p.uid) else {
            return Tick::Stop;
        };
        let input = &pod.input;
        let Some(c) = input
            .containers
            .iter()
            .find(|c| c.name == p.container && !c.id.is_empty())
        else {
            return Tick::Wait;
        };
        if c.id != p.container_id {
            if !p.container_id.is_empty() {
                self.results.remove(&p.container_id, p.kind);
            }
            p.container_id = c.id.clone();
            let initial = match p.kind {
                ProbeKind::Liveness => ProbeResult::Success,
                ProbeKind::Readiness => ProbeResult::Failure,
                ProbeKind::Startup => ProbeResult::Unknown,
            };
            if self.results.set(&c.id, p.kind, initial) {
                changed.push((p.uid.clone(), p.kind));
            }
            p.on_hold = false;
        }
        if p.on_hold {
            return Tick::Wait;
        }
        if !c.running {
            if self.results.set(&c.id, p.kind, ProbeResult::Failure) {
                changed.push((p.uid.clone(), p.kind));
            }
            let never = input
                .pod
                .spec
                .as_ref()
                .and_then(|s| s.restart_policy.as_deref())
                == Some("Never");
            return if c.exited && never {
                Tick::Stop
            } else {
                Tick::Wait
            };
        }
        if input.pod.metadata.deletion_timestamp.is_some() && p.kind != ProbeKind::Readiness {
            // A pod being deleted shuts down quietly: its liveness and
            // startup probes end (and their results go with them).
            return Tick::Stop;
        }
        let since_start = now.wall_ns.saturating_sub(c.started_at).max(0);
        if Duration::from_nanos(since_start.unsigned_abs()) < p.spec.initial_delay {
            return Tick::Wait;
        }
        let has_startup = probed_containers(&input.pod)
            .find(|x| x.name == p.container)
            .is_some_and(|x| x.startup_probe.is_some());
        let started = !has_startup
            || self.results.get(&c.id, ProbeKind::Startup) == Some(ProbeResult::Success);
        if started == (p.kind == ProbeKind::Startup) {
            return Tick::Wait;
        }
        Tick::Run(Box::new(Job {
            probe: id,
            kind: p.kind,
            action: p.spec.action.clone(),
            timeout: p.spec.timeout,
            pod: input.pod.clone(),
            container: p.container.clone(),
            container_id: c.id.clone(),
            pod_ip: input.pod_ip.clone(),
        }))
    }

    /// Takes a job's outcome; adds the pod to `changed` when its standing
    /// result changed.
    pub(crate) fn complete(
        &mut self,
        id: ProbeId,
        outcome: Outcome,
        now: Instant,
        changed: &mut Vec<Changed>,
    ) {
        let Some(p) = self.probes.get_mut(&id) else {
            return;
        };
        p.in_flight = false;
        if p.missed {
            // As a ticker that kept one tick: run again at once.
            p.missed = false;
            p.next_due = now;
            self.heap.push(Reverse((now, id)));
        }
        let result = match outcome {
            Outcome::Error => return,
            Outcome::Success => ProbeResult::Success,
            Outcome::Failure => ProbeResult::Failure,
        };
        if let Some(pod) = self.pods.get(&p.uid).map(|pp| &pp.input.pod.metadata) {
            crate::metrics::probe_result(
                p.kind.name(),
                if result == ProbeResult::Success {
                    "successful"
                } else {
                    "failed"
                },
                &p.container,
                pod.name.as_deref().unwrap_or(""),
                pod.namespace.as_deref().unwrap_or(""),
                &p.uid,
            );
        }
        if p.last == Some(result) {
            p.run = p.run.saturating_add(1);
        } else {
            p.last = Some(result);
            p.run = 1;
        }
        let threshold = match result {
            ProbeResult::Failure => p.spec.failure_threshold,
            _ => p.spec.success_threshold,
        };
        if p.run < threshold {
            return;
        }
        if self.results.set(&p.container_id, p.kind, result) {
            changed.push((p.uid.clone(), p.kind));
        }
        if p.kind != ProbeKind::Readiness && result == ProbeResult::Failure {
            // The container will be killed: no more runs until it is replaced.
            p.on_hold = true;
            p.run = 0;
        }
    }
}

enum Tick {
    Run(Box<Job>),
    Wait,
    Stop,
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{Container, ExecAction, PodSpec, Probe as ApiProbe};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    const SEC: i64 = 1_000_000_000;

    fn probe(period: i32, delay: i32, success: i32, failure: i32) -> ApiProbe {
        ApiProbe {
            exec: Some(ExecAction {
                command: Some(vec!["check".into()]),
            }),
            period_seconds: Some(period),
            initial_delay_seconds: Some(delay),
            success_threshold: Some(success),
            failure_threshold: Some(failure),
            ..Default::default()
        }
    }

    fn pod(c: Container, policy: &str) -> Arc<Pod> {
        Arc::new(Pod {
            metadata: ObjectMeta {
                name: Some("web".into()),
                namespace: Some("default".into()),
                uid: Some("u1".into()),
                ..Default::default()
            },
            spec: Some(PodSpec {
                containers: vec![c],
                restart_policy: Some(policy.into()),
                ..Default::default()
            }),
            status: None,
        })
    }

    fn app() -> Container {
        Container {
            name: "app".into(),
            ..Default::default()
        }
    }

    /// A fake clock and the state machine, stepped by hand.
    struct Rig {
        probes: Probes,
        results: Arc<ProbeResults>,
        t0: Instant,
        /// Seconds since t0; the container started at wall 0.
        now: i64,
        changed: Vec<Changed>,
    }

    impl Rig {
        fn new(pod: Arc<Pod>, running: bool) -> Rig {
            let results = Arc::new(ProbeResults::default());
            let mut probes = Probes::new(results.clone());
            let t0 = Instant::now();
            probes.update_pod(input(pod, "c1", running), t0, Duration::MAX);
            Rig {
                probes,
                results,
                t0,
                now: 0,
                changed: Vec::new(),
            }
        }

        fn at(&self) -> Now {
            Now {
                mono: self.t0 + Duration::from_secs(self.now as u64),
                wall_ns: self.now * SEC,
            }
        }

        /// Advances to second `s` and runs what is due there.
        fn step(&mut self, s: i64) -> Vec<Job> {
            self.now = s;
            let now = self.at();
            self.probes.due(now, &mut self.changed)
        }

        /// Runs what is due at second `s`, each job ending with `outcome`.
        fn run(&mut self, s: i64, outcome: Outcome) -> Vec<ProbeKind> {
            let jobs = self.step(s);
            let kinds = jobs.iter().map(|j| j.kind).collect();
            for j in jobs {
                let now = self.at().mono;
                self.probes
                    .complete(j.probe, outcome, now, &mut self.changed);
            }
            kinds
        }

        fn result(&self, id: &str, kind: ProbeKind) -> Option<ProbeResult> {
            self.results.get(id, kind)
        }
    }

    fn input(pod: Arc<Pod>, id: &str, running: bool) -> PodInput {
        PodInput {
            pod,
            pod_ip: Some("10.88.0.2".into()),
            containers: vec![SeenContainer {
                name: "app".into(),
                id: id.into(),
                running,
                exited: !running,
                started_at: 0,
            }],
        }
    }

    #[test]
    fn every_probe_result_is_counted_and_the_series_go_with_the_pod() {
        let mut c = app();
        c.readiness_probe = Some(probe(10, 0, 1, 3));
        let mut p = (*pod(c, "Always")).clone();
        p.metadata.uid = Some("u-metrics".into());
        let mut r = Rig::new(Arc::new(p), true);
        r.run(0, Outcome::Failure);
        r.run(10, Outcome::Failure);
        r.run(20, Outcome::Success);
        r.run(30, Outcome::Error);
        let page = || {
            let mut out = String::new();
            crate::metrics::render_probe_metrics(&mut out);
            out
        };
        let series = |result: &str| {
            format!(
                "prober_probe_total{{probe_type=\"Readiness\",result=\"{result}\",\
                 container=\"app\",pod=\"web\",namespace=\"default\",pod_uid=\"u-metrics\"}}"
            )
        };
        let out = page();
        assert!(out.contains(&format!("{} 2\n", series("failed"))), "{out}");
        assert!(
            out.contains(&format!("{} 1\n", series("successful"))),
            "{out}"
        );
        r.probes.remove_pod("u-metrics");
        assert!(!page().contains("u-metrics"));
    }

    #[test]
    fn liveness_fails_after_failure_threshold_then_holds() {
        let mut c = app();
        c.liveness_probe = Some(probe(10, 0, 1, 3));
        let mut r = Rig::new(pod(c, "Always"), true);
        // First tick at once: the initial result, then a run.
        assert_eq!(r.run(0, Outcome::Failure), vec![ProbeKind::Liveness]);
        assert_eq!(
            r.result("c1", ProbeKind::Liveness),
            Some(ProbeResult::Success)
        );
        assert_eq!(r.changed, vec![("u1".to_string(), ProbeKind::Liveness)]);
        r.changed.clear();
        // Nothing between ticks.
        assert!(r.step(5).is_empty());
        r.run(10, Outcome::Failure);
        assert_eq!(
            r.result("c1", ProbeKind::Liveness),
            Some(ProbeResult::Success)
        );
        assert!(r.changed.is_empty());
        r.run(20, Outcome::Failure);
        assert_eq!(
            r.result("c1", ProbeKind::Liveness),
            Some(ProbeResult::Failure)
        );
        assert_eq!(r.changed, vec![("u1".to_string(), ProbeKind::Liveness)]);
        // On hold until the container is replaced.
        assert!(r.step(30).is_empty());
        assert!(r.step(40).is_empty());
        r.probes.update_pod(
            input(r.probes.pods["u1"].input.pod.clone(), "c2", true),
            r.t0,
            Duration::MAX,
        );
        r.now = 40;
        r.changed.clear();
        assert_eq!(r.run(50, Outcome::Success), vec![ProbeKind::Liveness]);
        assert_eq!(r.result("c1", ProbeKind::Liveness), None, "old ID dropped");
        assert_eq!(
            r.result("c2", ProbeKind::Liveness),
            Some(ProbeResult::Success)
        );
    }

    #[test]
    fn a_success_between_failures_restarts_the_count() {
        let mut c = app();
        c.liveness_probe = Some(probe(1, 0, 1, 2));
        let mut r = Rig::new(pod(c, "Always"), true);
        r.run(0, Outcome::Failure);
        r.run(1, Outcome::Success);
        r.run(2, Outcome::Failure);
        assert_eq!(
            r.result("c1", ProbeKind::Liveness),
            Some(ProbeResult::Success)
        );
        // An errored run counts for nothing either way.
        r.run(3, Outcome::Error);
        assert_eq!(
            r.result("c1", ProbeKind::Liveness),
            Some(ProbeResult::Success)
        );
        r.run(4, Outcome::Failure);
        assert_eq!(
            r.result("c1", ProbeKind::Liveness),
            Some(ProbeResult::Failure)
        );
    }

    #[test]
    fn readiness_starts_false_and_flips_with_thresholds() {
        let mut c = app();
        c.readiness_probe = Some(probe(2, 0, 2, 1));
        let mut r = Rig::new(pod(c, "Always"), true);
        r.run(0, Outcome::Success);
        assert_eq!(
            r.result("c1", ProbeKind::Readiness),
            Some(ProbeResult::Failure)
        );
        r.run(2, Outcome::Success);
        assert_eq!(
            r.result("c1", ProbeKind::Readiness),
            Some(ProbeResult::Success)
        );
        r.run(4, Outcome::Failure);
        assert_eq!(
            r.result("c1", ProbeKind::Readiness),
            Some(ProbeResult::Failure)
        );
        // Readiness failures never hold the probe.
        assert_eq!(r.run(6, Outcome::Success), vec![ProbeKind::Readiness]);
        assert_eq!(r.run(8, Outcome::Success), vec![ProbeKind::Readiness]);
        assert_eq!(
            r.result("c1", ProbeKind::Readiness),
            Some(ProbeResult::Success)
        );
    }

    #[test]
    fn initial_delay_counts_from_the_container_start() {
        let mut c = app();
        c.liveness_probe = Some(probe(3, 5, 1, 1));
        let mut r = Rig::new(pod(c, "Always"), true);
        // Ticks at 0 and 3 are within the delay; 6 runs.
        assert!(r.run(0, Outcome::Failure).is_empty());
        assert!(r.run(3, Outcome::Failure).is_empty());
        assert_eq!(r.run(6, Outcome::Failure), vec![ProbeKind::Liveness]);
        assert_eq!(
            r.result("c1", ProbeKind::Liveness),
            Some(ProbeResult::Failure)
        );
    }

    #[test]
    fn startup_gates_liveness_and_readiness() {
        let mut c = app();
        c.startup_probe = Some(probe(1, 0, 1, 3));
        c.liveness_probe = Some(probe(1, 0, 1, 1));
        c.readiness_probe = Some(probe(1, 0, 1, 1));
        let mut r = Rig::new(pod(c, "Always"), true);
        assert_eq!(r.run(0, Outcome::Failure), vec![ProbeKind::Startup]);
        assert_eq!(
            r.result("c1", ProbeKind::Startup),
            Some(ProbeResult::Unknown)
        );
        assert_eq!(
            r.result("c1", ProbeKind::Readiness),
            Some(ProbeResult::Failure)
        );
        assert_eq!(r.run(1, Outcome::Success), vec![ProbeKind::Startup]);
        assert_eq!(
            r.result("c1", ProbeKind::Startup),
            Some(ProbeResult::Success)
        );
        // Started: the startup probe is done, the other two run.
        let mut kinds = r.run(2, Outcome::Success);
        kinds.sort();
        assert_eq!(kinds, vec![ProbeKind::Liveness, ProbeKind::Readiness]);
        assert_eq!(
            r.result("c1", ProbeKind::Readiness),
            Some(ProbeResult::Success)
        );
    }

    #[test]
    fn a_failed_startup_probe_holds_like_liveness() {
        let mut c = app();
        c.startup_probe = Some(probe(1, 0, 1, 2));
        c.liveness_probe = Some(probe(1, 0, 1, 1));
        let mut r = Rig::new(pod(c, "Always"), true);
        r.run(0, Outcome::Failure);
        r.run(1, Outcome::Failure);
        assert_eq!(
            r.result("c1", ProbeKind::Startup),
            Some(ProbeResult::Failure)
        );
        assert!(r.step(2).is_empty(), "startup on hold, liveness gated");
        assert_eq!(
            r.result("c1", ProbeKind::Liveness),
            Some(ProbeResult::Success)
        );
    }

    #[test]
    fn a_stopped_container_fails_and_never_restarting_ends_the_probe() {
        let mut c = app();
        c.readiness_probe = Some(probe(1, 0, 1, 1));
        let mut r = Rig::new(pod(c.clone(), "Always"), false);
        assert!(r.run(0, Outcome::Success).is_empty());
        assert_eq!(
            r.result("c1", ProbeKind::Readiness),
            Some(ProbeResult::Failure)
        );
        assert_eq!(r.probes.len(), 1, "restartPolicy Always: keeps waiting");

        let mut r = Rig::new(pod(c, "Never"), false);
        r.run(0, Outcome::Success);
        assert_eq!(r.probes.len(), 0);
        assert_eq!(r.result("c1", ProbeKind::Readiness), None);
    }

    #[test]
    fn a_pod_being_deleted_ends_liveness_but_keeps_readiness() {
        let mut c = app();
        c.liveness_probe = Some(probe(1, 0, 1, 1));
        c.readiness_probe = Some(probe(1, 0, 1, 1));
        let mut r = Rig::new(pod(c, "Always"), true);
        r.run(0, Outcome::Success);
        let mut deleting = (*r.probes.pods["u1"].input.pod).clone();
        deleting.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
            ));
        r.probes
            .update_pod(input(Arc::new(deleting), "c1", true), r.t0, Duration::MAX);
        assert_eq!(r.run(1, Outcome::Failure), vec![ProbeKind::Readiness]);
        assert_eq!(r.probes.len(), 1);
        assert_eq!(r.result("c1", ProbeKind::Liveness), None);
    }

    #[test]
    fn no_container_yet_means_no_result_and_no_run() {
        let mut c = app();
        c.readiness_probe = Some(probe(1, 0, 1, 1));
        let mut r = Rig::new(pod(c, "Always"), true);
        let p = r.probes.pods["u1"].input.pod.clone();
        r.probes.update_pod(
            PodInput {
                pod: p,
                pod_ip: None,
                containers: vec![],
            },
            r.t0,
            Duration::MAX,
        );
        assert!(r.run(0, Outcome::Success).is_empty());
        assert!(r.results.is_empty());
    }

    #[test]
    fn a_tick_during_a_slow_run_runs_again_when_it_ends() {
        let mut c = app();
        c.liveness_probe = Some(probe(1, 0, 1, 1));
        let mut r = Rig::new(pod(c, "Always"), true);
        let jobs = r.step(0);
        assert_eq!(jobs.len(), 1);
        // Still out at the next two ticks: no second job.
        assert!(r.step(1).is_empty());
        assert!(r.step(2).is_empty());
        let now = r.at().mono;
        r.probes
            .complete(jobs[0].probe, Outcome::Success, now, &mut r.changed);
        assert_eq!(r.step(2).len(), 1, "the missed tick runs at once");
    }

    #[test]
    fn removing_a_pod_stops_its_probes_and_drops_results() {
        let mut c = app();
        c.liveness_probe = Some(probe(1, 0, 1, 1));
        c.readiness_probe = Some(probe(1, 0, 1, 1));
        let mut r = Rig::new(pod(c, "Always"), true);
        r.run(0, Outcome::Success);
        assert_eq!(r.results.len(), 1);
        r.probes.remove_pod("u1");
        assert!(r.results.is_empty());
        assert!(r.step(1).is_empty());
        assert_eq!((r.probes.len(), r.probes.pods()), (0, 0));
    }

    #[test]
    fn first_ticks_spread_over_one_period_after_a_restart() {
        let results = Arc::new(ProbeResults::default());
        let mut probes = Probes::new(results);
        let t0 = Instant::now();
        let mut c = app();
        c.liveness_probe = Some(probe(10, 0, 1, 1));
        probes.update_pod(input(pod(c, "Always"), "c1", true), t0, Duration::ZERO);
        let due = probes.next_due().unwrap();
        assert!(due >= t0 && due < t0 + Duration::from_secs(10));
    }
}
