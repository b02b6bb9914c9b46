//! Pod churn against the real binary and a real containerd, shared by the
//! CI-sized test (`tests/e2e/churn.rs`) and the full-size load program
//! (`benches/churn.rs`).
//!
//! A run writes static pod manifests into tinylet's manifest dir at a fixed
//! rate, a seeded random mix of: create, re-create with the same name (half
//! of them with the content the pod had before its deletion, so the same
//! UID comes back), a spec change that replaces the container, a
//! metadata-only change (a label), and delete. Half the pods carry an
//! explicit `metadata.uid`, so their edits are updates of one pod; the
//! others get the content-hash UID, so each edit is a new pod under the
//! same name (the old one must be gone before the new one runs).
//!
//! It measures tinylet's threads (`/proc/PID/task`), file descriptors
//! (`/proc/PID/fd`) and RSS idle before the churn (the baseline), samples
//! them during it, waits for the runtime to hold exactly the final desired
//! set (one ready sandbox per pod with the expected UID, one running
//! container with the latest spec's hash, nothing of any other pod), then
//! after a settle period with the final set, removes every manifest, waits
//! until the runtime is empty, and measures again after the settle period.
//! Last, it stops tinylet with SIGTERM and reads its shutdown line (the
//! longest sync loop turn and the longest pod worker wait).

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::fs;
use std::path::Path;
use std::time::{Duration, Instant};

use protobuf::EnumOrUnknown;
use serde_json::json;
use tinylet::cri::{api, RemoteRuntime, RuntimeService};
use tinylet::runtime::labels::{container_hash, CONTAINER_HASH, POD_NAME, POD_UID};

use super::containerd::{
    remove_manifest, write_manifest, PrivateContainerd, Tinylet, BUSYBOX_IMAGE,
};

/// The one container of every churned pod.
pub const CONTAINER: &str = "sleep";

/// What to run.
#[derive(Debug, Clone)]
pub struct Plan {
    pub pods: usize,
    /// Changes per second.
    pub rate: f64,
    pub churn: Duration,
    pub seed: u64,
    /// How long to wait after convergence, and after the last pod went,
    /// before measuring.
    pub settle: Duration,
    /// Convergence (and the final removal) must happen within this.
    pub converge_within: Duration,
}

/// Threads, file descriptors and RSS of a process.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Footprint {
    pub threads: usize,
    pub fds: usize,
    pub rss_kib: u64,
}

impl Footprint {
    pub fn of(pid: u32) -> Footprint {
        let count = |dir: String| fs::read_dir(&dir).map(|d| d.count()).unwrap_or(0);
        let rss_kib = fs::read_to_string(format!("/proc/{pid}/status"))
            .ok()
            .and_then(|t| {
                t.lines()
                    .find_map(|l| l.strip_prefix("VmRSS:"))
                    .and_then(|v| v.split_whitespace().next())
                    .and_then(|v| v.parse().ok())
            })
            .unwrap_or(0);
        Footprint {
            threads: count(format!("/proc/{pid}/task")),
            fds: count(format!("/proc/{pid}/fd")),
            rss_kib,
        }
    }

    fn max(self, o: Footprint) -> Footprint {
        Footprint {
            threads: self.threads.max(o.threads),
            fds: self.fds.max(o.fds),
            rss_kib: self.rss_kib.max(o.rss_kib),
        }
    }
}

/// The figures of the sync loop's shutdown line.
#[derive(Debug, Clone, Default)]
pub struct LoopLine {
    pub line: String,
    pub turns: u64,
    pub longest_turn_ms: u64,
    pub longest_turn_kind: String,
    pub longest_wait_ms: Option<u64>,
    pub longest_wait_pod: String,
}

impl LoopLine {
    /// Parses "sync loop: N turns, longest X ms (KIND); longest pod worker
    /// wait Y ms (POD)" (the wait may be "none").
    pub fn parse(log: &str) -> Option<LoopLine> {
        let line = log
            .lines()
            .rev()
            .find(|l| l.contains("sync loop: ") && l.contains(" turns, longest "))?;
        let rest = &line[line.find("sync loop: ")? + "sync loop: ".len()..];
        let (turns, rest) = rest.split_once(" turns, longest ")?;
        let (ms, rest) = rest.split_once(" ms")?;
        let (kind, rest) = match rest.strip_prefix(" (") {
            Some(r) => r.split_once("); ")?,
            None => ("", rest.strip_prefix("; ")?),
        };
        let wait = rest.strip_prefix("longest pod worker wait ")?;
        let (wait_ms, wait_pod) = match wait.split_once(" ms (") {
            Some((ms, pod)) => (Some(ms.parse().ok()?), pod.trim_end_matches(')')),
            None => (None, ""),
        };
        Some(LoopLine {
            line: line.to_string(),
            turns: turns.parse().ok()?,
            longest_turn_ms: ms.parse().ok()?,
            longest_turn_kind: kind.to_string(),
            longest_wait_ms: wait_ms,
            longest_wait_pod: wait_pod.to_string(),
        })
    }
}

/// Everything a run found.
#[derive(Debug, Clone, Default)]
pub struct Report {
    pub changes: BTreeMap<&'static str, usize>,
    /// How far the change writer fell behind its schedule, at most.
    pub max_lag: Duration,
    pub churn_took: Duration,
    pub desired_at_end: usize,
    /// `None`: did not converge within the bound.
    pub converge: Option<Duration>,
    /// What was wrong when convergence was last checked (empty when it
    /// converged).
    pub problems: Vec<String>,
    /// Samples during the churn where one pod name had two running
    /// containers (two UIDs, or one twice) at once.
    pub side_by_side: Vec<String>,
    pub baseline: Footprint,
    pub peak: Footprint,
    /// With the final set running, `settle` after convergence.
    pub with_final_set: Footprint,
    /// Removal of the final set: how long until the runtime was empty.
    pub removal: Option<Duration>,
    /// `settle` after the last pod went.
    pub after: Footprint,
    /// The sync loop's "took longer than expected" warnings.
    pub slow_turns: Vec<String>,
    pub loop_line: Option<LoopLine>,
    pub exit_ok: bool,
    pub load_before: String,
    pub load_after: String,
}

impl Report {
    /// Threads and fds back to the baseline (or below).
    pub fn returned(&self) -> bool {
        self.after.threads <= self.baseline.threads && self.after.fds <= self.baseline.fds
    }

    /// The table the bench prints and the test shows.
    pub fn table(&self, plan: &Plan) -> String {
        let mib = |k: u64| format!("{:.1} MiB", k as f64 / 1024.0);
        let fp = |f: &Footprint| {
            format!(
                "{:>4} threads {:>4} fds  RSS {}",
                f.threads,
                f.fds,
                mib(f.rss_kib)
            )
        };
        let secs = |d: Option<Duration>| match d {
            Some(d) => format!("{:.1} s", d.as_secs_f64()),
            None => "NOT within bound".into(),
        };
        let mut t = String::new();
        let mut row = |k: &str, v: String| t.push_str(&format!("  {k:<34} {v}\n"));
        row(
            "plan",
            format!(
                "{} pods, {} changes/s, {} s, seed {}",
                plan.pods,
                plan.rate,
                plan.churn.as_secs(),
                plan.seed
            ),
        );
        row(
            "load average before / after",
            format!("{} / {}", self.load_before, self.load_after),
        );
        let total: usize = self.changes.values().sum();
        let mix: Vec<String> = self
            .changes
            .iter()
            .map(|(k, v)| format!("{k} {v}"))
            .collect();
        row("changes", format!("{total}: {}", mix.join(", ")));
        row(
            "churn took (writer lag at most)",
            format!(
                "{:.1} s ({} ms)",
                self.churn_took.as_secs_f64(),
                self.max_lag.as_millis()
            ),
        );
        row("desired pods at the end", self.desired_at_end.to_string());
        row("converged after the last change", secs(self.converge));
        row(
            "exactly once / leftovers",
            if self.problems.is_empty() {
                "ok / none".into()
            } else {
                format!("{} problems", self.problems.len())
            },
        );
        row(
            "two copies of a name running",
            format!("{} samples", self.side_by_side.len()),
        );
        match &self.loop_line {
            Some(l) => {
                row("sync loop turns", l.turns.to_string());
                row(
                    "longest sync loop turn",
                    format!("{} ms ({})", l.longest_turn_ms, l.longest_turn_kind),
                );
                row(
                    "longest pod worker wait",
                    match l.longest_wait_ms {
                        Some(ms) => format!("{ms} ms ({})", l.longest_wait_pod),
                        None => "none".into(),
                    },
                );
            }
            None => row("sync loop shutdown line", "MISSING".into()),
        }
        row("slow-turn warnings", self.slow_turns.len().to_string());
        row("baseline (idle, before)", fp(&self.baseline));
        row("peak during churn", fp(&self.peak));
        row(
            &format!("final set, {} s after", plan.settle.as_secs()),
            fp(&self.with_final_set),
        );
        row("removal of the final set", secs(self.removal));
        row(
            &format!("all gone, {} s after", plan.settle.as_secs()),
            fp(&self.after),
        );
        row(
            "vs baseline",
            format!(
                "threads {:+}, fds {:+}, RSS {:+.2} MiB",
                self.after.threads as i64 - self.baseline.threads as i64,
                self.after.fds as i64 - self.baseline.fds as i64,
                (self.after.rss_kib as f64 - self.baseline.rss_kib as f64) / 1024.0
            ),
        );
        row(
            "clean exit on SIGTERM",
            if self.exit_ok { "yes" } else { "NO" }.into(),
        );
        for w in self.slow_turns.iter().take(5) {
            t.push_str(&format!("  slow turn: {w}\n"));
        }
        for p in self.problems.iter().take(10) {
            t.push_str(&format!("  problem: {p}\n"));
        }
        for p in self.side_by_side.iter().take(10) {
            t.push_str(&format!("  side by side: {p}\n"));
        }
        t
    }
}

/// xorshift64*: deterministic for a seed, no dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// One manifest file and the pod it holds.
#[derive(Debug, Clone)]
struct Slot {
    name: String,
    /// Carries an explicit `metadata.uid`.
    keyed: bool,
    /// The content written last (also while deleted: a re-create may put
    /// it back).
    content: Option<String>,
    present: bool,
    spec: u32,
    meta: u32,
    generation: u32,
}

impl Slot {
    fn file(&self) -> String {
        format!("{}.json", self.name)
    }

    fn render(&self) -> String {
        let mut metadata = json!({
            "name": self.name,
            "labels": {"app": "churn", "churn/meta": self.meta.to_string()},
        });
        if self.keyed {
            metadata["uid"] = json!(format!("{}-g{}", self.name, self.generation));
        }
        json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": metadata,
            "spec": {
                "terminationGracePeriodSeconds": 2,
                "containers": [{
                    "name": CONTAINER,
                    "image": BUSYBOX_IMAGE,
                    "imagePullPolicy": "IfNotPresent",
                    "command": ["sh", "-c", "trap 'exit 0' TERM; sleep 3600 & wait"],
                    "env": [{"name": "SPEC", "value": self.spec.to_string()}],
                    "volumeMounts": [{"name": "scratch", "mountPath": "/scratch"}],
                }],
                "volumes": [{"name": "scratch", "emptyDir": {}}],
            },
        })
        .to_string()
    }
}

/// The expected UID and container hash of a manifest, as tinylet's file
/// source derives them.
fn expected(dir: &Path, slot: &Slot, node: &str) -> (String, String) {
    let Some(content) = slot.content.as_deref() else {
        panic!("{}: no content", slot.name)
    };
    let mut pod = tinylet::config::decode_pod(content.as_bytes())
        .unwrap_or_else(|e| panic!("{}: {e}", slot.name));
    let path = dir.join(slot.file());
    tinylet::config::apply_static_defaults(
        &mut pod,
        &path.to_string_lossy(),
        node,
        tinylet::pod::FILE_SOURCE,
    )
    .unwrap_or_else(|e| panic!("{}: {e:?}", slot.name));
    let uid = pod.metadata.uid.clone().unwrap_or_default();
    let spec = pod.spec.as_ref().expect("a spec");
    let hash = format!("{:x}", container_hash(&spec.containers[0]));
    (uid, hash)
}

fn loadavg() -> String {
    fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "?".into())
}

fn is_running(c: &api::Container) -> bool {
    c.state == EnumOrUnknown::new(api::ContainerState::CONTAINER_RUNNING)
}

fn is_ready(s: &api::PodSandbox) -> bool {
    s.state == EnumOrUnknown::new(api::PodSandboxState::SANDBOX_READY)
}

/// Pod names with two running containers named `CONTAINER` at once.
fn side_by_side(rt: &RemoteRuntime, prefix: &str) -> Vec<String> {
    let Ok(list) = rt.list_containers(None) else {
        return Vec::new();
    };
    let mut by_name: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for c in list.iter().filter(|c| is_running(c)) {
        let name = c.labels.get(POD_NAME).map(String::as_str).unwrap_or("");
        if name.starts_with(prefix) {
            let uid = c.labels.get(POD_UID).map(String::as_str).unwrap_or("");
            by_name.entry(name).or_default().push(uid);
        }
    }
    by_name
        .into_iter()
        .filter(|(_, uids)| uids.len() > 1)
        .map(|(n, uids)| format!("{n}: {}", uids.join(", ")))
        .collect()
}

/// What differs between the runtime and `want` (pod name to UID and
/// container hash); empty when they match exactly.
fn differences(
    rt: &RemoteRuntime,
    prefix: &str,
    want: &BTreeMap<String, (String, String)>,
) -> Vec<String> {
    let sandboxes = match rt.list_pod_sandbox(None) {
        Ok(s) => s,
        Err(e) => return vec![format!("ListPodSandbox: {e}")],
    };
    let containers = match rt.list_containers(None) {
        Ok(c) => c,
        Err(e) => return vec![format!("ListContainers: {e}")],
    };
    let mut problems = Vec::new();
    let mut seen: BTreeMap<&str, Vec<&api::PodSandbox>> = BTreeMap::new();
    for s in &sandboxes {
        let name = s.labels.get(POD_NAME).map(String::as_str).unwrap_or("");
        if name.starts_with(prefix) {
            seen.entry(name).or_default().push(s);
        }
    }
    for (name, list) in &seen {
        if !want.contains_key(*name) {
            problems.push(format!("{name}: deleted, {} sandboxes left", list.len()));
        }
    }
    for (name, (uid, hash)) in want {
        let list = seen.get(name.as_str()).cloned().unwrap_or_default();
        match list.as_slice() {
            [] => problems.push(format!("{name}: no sandbox")),
            [s] => {
                let got = s.labels.get(POD_UID).map(String::as_str).unwrap_or("");
                if got != uid {
                    problems.push(format!("{name}: sandbox of UID {got}, want {uid}"));
                } else if !is_ready(s) {
                    problems.push(format!("{name}: sandbox not ready"));
                }
            }
            more => problems.push(format!("{name}: {} sandboxes", more.len())),
        }
        let mine: Vec<&api::Container> = containers
            .iter()
            .filter(|c| c.labels.get(POD_NAME) == Some(name))
            .collect();
        let running: Vec<&&api::Container> = mine.iter().filter(|c| is_running(c)).collect();
        match running.as_slice() {
            [] => problems.push(format!("{name}: no running container")),
            [c] => {
                let got_uid = c.labels.get(POD_UID).map(String::as_str).unwrap_or("");
                let got = c.annotations.get(CONTAINER_HASH).map(String::as_str);
                if got_uid != uid {
                    problems.push(format!("{name}: container of UID {got_uid}, want {uid}"));
                } else if got != Some(hash.as_str()) {
                    problems.push(format!(
                        "{name}: container spec hash {got:?}, want {hash} (not the latest spec)"
                    ));
                }
            }
            more => problems.push(format!("{name}: {} running containers", more.len())),
        }
        // tinylet keeps one exited instance per container (the
        // --maximum-dead-containers-per-container default); more, or any
        // of another UID, is a leftover.
        let dead: Vec<&&api::Container> = mine.iter().filter(|c| !is_running(c)).collect();
        if dead.len() > 1 {
            problems.push(format!("{name}: {} exited containers", dead.len()));
        }
        for c in &dead {
            let got_uid = c.labels.get(POD_UID).map(String::as_str).unwrap_or("");
            if got_uid != uid {
                problems.push(format!("{name}: container of old UID {got_uid} left"));
            }
        }
    }
    for c in &containers {
        let name = c.labels.get(POD_NAME).map(String::as_str).unwrap_or("");
        if name.starts_with(prefix) && !want.contains_key(name) {
            problems.push(format!("{name}: deleted, container {} left", c.id));
        }
    }
    problems
}

/// Polls until the runtime matches `want`; returns how long that took, or
/// None with the last differences.
fn converge(
    rt: &RemoteRuntime,
    prefix: &str,
    want: &BTreeMap<String, (String, String)>,
    within: Duration,
    tl: &mut Tinylet,
) -> (Option<Duration>, Vec<String>) {
    let start = Instant::now();
    loop {
        let problems = differences(rt, prefix, want);
        if problems.is_empty() {
            return (Some(start.elapsed()), problems);
        }
        tl.assert_running();
        if start.elapsed() > within {
            return (None, problems);
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// Flags for the tinylet a churn runs: image GC off, so that pods never
/// depend on how full the shared disk happens to be (a pass above the
/// threshold would remove the unused test image before the first pod), and
/// room for more than the default 110 pods, which admission enforces.
pub const TINYLET_FLAGS: &[&str] = &["--image-gc-high-threshold", "100", "--max-pods", "1000"];

/// Runs the plan against a tinylet freshly started on `ctd` (with
/// `TINYLET_FLAGS`) with an empty manifest dir; stops it with SIGTERM at
/// the end.
pub fn run(ctd: &PrivateContainerd, tl: &mut Tinylet, plan: &Plan) -> Report {
    let mut r = Report {
        load_before: loadavg(),
        ..Report::default()
    };
    let pid = tl.pid().expect("tinylet runs");
    let dir = tl.manifest_dir();
    let node = tl.node().to_string();
    let rt = RemoteRuntime::new(&ctd.endpoint(), Duration::from_secs(30)).expect("CRI client");

    // Idle baseline: after start-up settled (image GC pass, first relists).
    let started = Instant::now();
    while !tl.log_since_start().contains("sync loop started") {
        tl.assert_running();
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "tinylet did not start its sync loop\n{}",
            tl.log_tail(40)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_secs(5));
    r.baseline = Footprint::of(pid);
    r.peak = r.baseline;

    let mut rng = Rng(plan.seed.max(1));
    let mut slots: Vec<Slot> = (0..plan.pods)
        .map(|i| Slot {
            name: format!("churn-{i}"),
            keyed: i % 2 == 0,
            content: None,
            present: false,
            spec: 0,
            meta: 0,
            generation: 0,
        })
        .collect();
    let prefix = "churn-";
    let total = (plan.rate * plan.churn.as_secs_f64()).round() as u64;
    let period = Duration::from_secs_f64(1.0 / plan.rate);
    let begin = Instant::now();
    let mut next_sample = begin;
    for k in 0..total {
        let due = begin + period.mul_f64(k as f64);
        let now = Instant::now();
        if due > now {
            std::thread::sleep(due - now);
        } else {
            r.max_lag = r.max_lag.max(now - due);
        }
        let slot = &mut slots[rng.below(plan.pods as u64) as usize];
        let kind: &'static str = if !slot.present {
            let same = slot.content.is_some() && rng.below(2) == 0;
            let kind = match (&slot.content, same) {
                (None, _) => "create",
                (Some(_), true) => "re-create, same content",
                (Some(_), false) => {
                    slot.spec += 1;
                    slot.generation += 1;
                    slot.content = Some(slot.render());
                    "re-create, new content"
                }
            };
            if slot.content.is_none() {
                slot.content = Some(slot.render());
            }
            write_manifest(&dir, &slot.file(), slot.content.as_deref().unwrap_or(""));
            slot.present = true;
            kind
        } else {
            match rng.below(100) {
                0..=34 => {
                    slot.spec += 1;
                    slot.content = Some(slot.render());
                    write_manifest(&dir, &slot.file(), slot.content.as_deref().unwrap_or(""));
                    "update spec"
                }
                35..=69 => {
                    slot.meta += 1;
                    slot.content = Some(slot.render());
                    write_manifest(&dir, &slot.file(), slot.content.as_deref().unwrap_or(""));
                    "update metadata"
                }
                _ => {
                    remove_manifest(&dir, &slot.file());
                    slot.present = false;
                    "delete"
                }
            }
        };
        *r.changes.entry(kind).or_default() += 1;
        if Instant::now() >= next_sample {
            next_sample += Duration::from_secs(2);
            tl.assert_running();
            r.peak = r.peak.max(Footprint::of(pid));
            for s in side_by_side(&rt, prefix) {
                r.side_by_side
                    .push(format!("{:.0} s: {s}", begin.elapsed().as_secs_f64()));
            }
        }
    }
    r.churn_took = begin.elapsed();

    let want: BTreeMap<String, (String, String)> = slots
        .iter()
        .filter(|s| s.present)
        .map(|s| (format!("{}-{node}", s.name), expected(&dir, s, &node)))
        .collect();
    r.desired_at_end = want.len();
    let (took, problems) = converge(&rt, prefix, &want, plan.converge_within, tl);
    r.converge = took;
    r.problems = problems;
    r.peak = r.peak.max(Footprint::of(pid));

    if r.converge.is_some() {
        std::thread::sleep(plan.settle);
        r.with_final_set = Footprint::of(pid);
        r.peak = r.peak.max(r.with_final_set);
        for s in slots.iter().filter(|s| s.present) {
            remove_manifest(&dir, &s.file());
        }
        let (took, problems) = converge(&rt, prefix, &BTreeMap::new(), plan.converge_within, tl);
        r.removal = took;
        r.problems.extend(problems);
        if r.removal.is_some() {
            std::thread::sleep(plan.settle);
            r.after = Footprint::of(pid);
        }
    }
    r.load_after = loadavg();
    let status = tl.sigterm();
    r.exit_ok = status.success();
    let log = tl.log_since_start();
    r.slow_turns = log
        .lines()
        .filter(|l| l.contains("took longer than expected"))
        .map(|l| l.split_once("] ").map_or(l, |(_, m)| m).to_string())
        .collect();
    r.loop_line = LoopLine::parse(&log);
    r
}
