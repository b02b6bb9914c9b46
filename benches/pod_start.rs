//! The pod start benchmark: how long pods take to start and to go away under
//! tinylet compared with containerd's own floor, and tinylet's footprint.
//! It prints numbers and judges them against the targets; it is not a test
//! and fails only when something does not work at all.
//!
//! Run it with `packaging/bench.sh`, or `cargo bench --bench pod_start`
//! after `cargo build --release` (needs root: it runs a private containerd
//! through `packaging/containerd-private.sh`). Without `--bench` on the
//! command line (`cargo test --all-targets` runs bench targets that way) it
//! does nothing.
//!
//! What it measures, all against one private containerd:
//! 1. the floor: N pods started straight through `RemoteRuntime` from N
//!    threads (RunPodSandbox, CreateContainer, StartContainer with the CRI
//!    configs tinylet itself generates), once until every StartContainer
//!    returned, and once until a poll like tinylet's (below) saw them all
//!    running, so that both carry the same observer load; then the teardown
//!    of all N;
//! 2. tinylet: N manifests renamed into its manifest directory at once, until
//!    a `ListContainers` poll (state RUNNING, every 2 ms for one pod, 5 ms
//!    for more) shows a container for every pod; then, 3 s later, the
//!    manifests deleted, until no sandbox of theirs is left;
//! 3. the footprint of a fresh tinylet: binary size, RSS, threads and CPU
//!    idle and with 10, 50 and 110 pods; RSS a minute after they all went;
//!    RSS while a corpus of hostile manifests is there and a minute after
//!    it went (memory that comes back).
//!
//! 4. the probe part (`pod_start/probes.rs`): a fresh tinylet with 110
//!    pods, each with an httpGet liveness and an exec readiness probe: RSS,
//!    threads (the prober's among them) and CPU of tinylet and containerd;
//!
//! 5. the cluster part (`pod_start/cluster.rs`): tinylet joined to the
//!    integration tests' fake apiserver, running API pods: its footprint
//!    connected, idle and with up to 110 pods, the requests it sends idle,
//!    and the time from a pod's creation to its containers running and to
//!    its Running status patch.
//!
//! Floor and tinylet runs take turns, so that drift in the machine's load
//! hits both alike. The report adds where tinylet's time went, from its own
//! log (`--v 2` logs each sandbox's RunPodSandbox time) and from the CPU time
//! containerd and tinylet used during the starts.
//!
//! Options (after `cargo bench --bench pod_start --`):
//!   --containerd-dir DIR  where the private containerd lives (short path;
//!                         default /tmp/tl-bench.PID); started and stopped here
//!   --endpoint unix://S   use a running containerd instead (it needs the
//!                         busybox and pause test images)
//!   --tinylet PATH        the binary (default $TINYLET_BIN, else
//!                         $CARGO_TARGET_DIR/release/tinylet, else
//!                         /var/cache/tinylet/target/release/tinylet)
//!   --work-dir DIR        manifests, tinylet's root and logs (default: a
//!                         fresh dir under /tmp, removed at the end)
//!   --host-network        also run the 1- and 20-pod cases on the host network
//!   --max-pods N          also measure RSS with N pods (default 110, 0: skip)
//!   --quick               fewer runs and shorter windows (a smoke run)
//!   --cases 1x30,20x5     other CNI cases: pods x runs (default 1x9,20x3,50x3)
//!   --no-footprint        skip the footprint part
//!   --probe-pods N        pods of the probe part (default 110, 0: skip it)
//!   --no-cluster          skip the cluster part (5. above)
//!   --cluster-only        run only the cluster part
//!   --restarts-only       run only the crash-to-restart part
//!   --keep                leave the work dir and containerd dir in place

use std::collections::{BTreeMap, HashSet};
use std::ffi::OsStr;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{anyhow, bail, Context, Result};
use k8s_openapi::api::core::v1::{Container, Pod, PodSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use protobuf::{EnumOrUnknown, MessageField};

#[path = "pod_start/cluster.rs"]
mod cluster;
#[path = "../tests/support/fake_apiserver/mod.rs"]
mod fake_apiserver;
#[path = "pod_start/probes.rs"]
mod probes;
#[path = "pod_start/runtime_cost.rs"]
mod runtime_cost;

use tinylet::cri::{api, ImageService, RemoteRuntime, RuntimeService};
use tinylet::runtime::config::{
    container_config, pod_dir, pod_log_dir, sandbox_config, ContainerInputs,
};
use tinylet::runtime::labels::{POD_NAME, POD_UID};
use tinylet::runtime::NodeSettings;
use tinylet::thread::{spawn_named, JoinOnDrop};

const BUSYBOX_IMAGE: &str = "docker.io/tinylet/busybox:1";
const NODE: &str = "bench-node";
const NAMESPACE: &str = "default";
const CONTAINER: &str = "sleep";
/// Sleeps, and exits at once on SIGTERM so that stopping a pod measures the
/// agent and the runtime rather than a grace period.
const SCRIPT: &str = "trap 'exit 0' TERM; sleep 3600 & wait";
/// tinylet's floor for a grace period; the floor's teardown uses the same.
const GRACE_SECS: i64 = 2;
const CALL_TIMEOUT: Duration = Duration::from_secs(60);
/// Quiet time after every run, for containerd's asynchronous clean-up.
const PAUSE: Duration = Duration::from_secs(1);
/// How long tinylet's pods run before their manifests are deleted: past the
/// two PLEG relists (1 s apart) after a start and the re-syncs they cause.
const SETTLE_BEFORE_REMOVAL: Duration = Duration::from_millis(3000);

/// The upstream kubelet (v1.20.2, standalone, same containerd) as measured
/// on this kind of machine: see BUILD-NOTES.md.
mod kubelet {
    pub const START_1: &str = "250 ms";
    pub const START_20: &str = "2.3 s";
    pub const START_50: &str = "8.7-12 s";
    pub const REMOVE_1: &str = "~1.7 s";
    pub const BINARY: &str = "105 MB";
    pub const RSS_IDLE: &str = "78 MiB";
    pub const RSS_10: &str = "84 MiB";
    pub const RSS_50: &str = "94 MiB";
    pub const CPU_10: &str = "~1%";
    pub const CPU_50: &str = "~3.3%";
}

// ---- options -------------------------------------------------------------

#[derive(Debug, Default)]
struct Options {
    containerd_dir: Option<PathBuf>,
    endpoint: Option<String>,
    tinylet: Option<PathBuf>,
    work_dir: Option<PathBuf>,
    host_network: bool,
    max_pods: usize,
    quick: bool,
    keep: bool,
    /// Replaces the CNI cases: (pods, runs).
    cases: Option<Vec<(usize, usize)>>,
    footprint: bool,
    probe_pods: usize,
    cluster: bool,
    cluster_only: bool,
    restarts_only: bool,
}

fn parse_options(args: &[String]) -> Result<Options> {
    let mut o = Options {
        footprint: true,
        probe_pods: 110,
        cluster: true,
        max_pods: 110,
        ..Options::default()
    };
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut value = || {
            it.next()
                .cloned()
                .ok_or_else(|| anyhow!("option {a} needs a value"))
        };
        match a.as_str() {
            "--bench" => {}
            "--containerd-dir" => o.containerd_dir = Some(PathBuf::from(value()?)),
            "--endpoint" => o.endpoint = Some(value()?),
            "--tinylet" => o.tinylet = Some(PathBuf::from(value()?)),
            "--work-dir" => o.work_dir = Some(PathBuf::from(value()?)),
            "--host-network" => o.host_network = true,
            "--max-pods" => {
                let v = value()?;
                o.max_pods = v
                    .parse()
                    .with_context(|| format!("--max-pods {v:?}: not a number"))?;
            }
            "--probe-pods" => {
                let v = value()?;
                o.probe_pods = v
                    .parse()
                    .with_context(|| format!("--probe-pods {v:?}: not a number"))?;
            }
            "--quick" => o.quick = true,
            "--keep" => o.keep = true,
            "--no-footprint" => o.footprint = false,
            "--no-cluster" => o.cluster = false,
            "--cluster-only" => o.cluster_only = true,
            "--restarts-only" => o.restarts_only = true,
            "--cases" => {
                let v = value()?;
                o.cases = Some(parse_cases(&v)?);
            }
            other => bail!("unknown option {other:?} (see the header of benches/pod_start.rs)"),
        }
    }
    if o.endpoint.is_some() && o.containerd_dir.is_some() {
        bail!("--endpoint and --containerd-dir exclude each other");
    }
    if o.cluster_only && !o.cluster {
        bail!("--cluster-only and --no-cluster exclude each other");
    }
    Ok(o)
}

/// "1x30,20x3": pods x runs, comma-separated.
fn parse_cases(v: &str) -> Result<Vec<(usize, usize)>> {
    v.split(',')
        .map(|c| {
            let (n, r) = c
                .split_once('x')
                .ok_or_else(|| anyhow!("--cases {v:?}: {c:?} is not PODSxRUNS"))?;
            let n: usize = n
                .trim()
                .parse()
                .with_context(|| format!("--cases {v:?}: pods in {c:?}"))?;
            let r: usize = r
                .trim()
                .parse()
                .with_context(|| format!("--cases {v:?}: runs in {c:?}"))?;
            if n == 0 || r == 0 {
                bail!("--cases {v:?}: {c:?} needs at least one pod and one run");
            }
            Ok((n, r))
        })
        .collect()
}

/// How many runs of each case, and how long the footprint windows are.
struct Plan {
    cases: Vec<(usize, usize)>,
    host_cases: Vec<(usize, usize)>,
    settle: Duration,
    cpu_window: Duration,
    /// The runtime cost's windows (each state) and their turns.
    cost_window: Duration,
    cost_rounds: u32,
}

impl Plan {
    fn new(o: &Options) -> Plan {
        let (mut cases, settle, cpu_window) = if o.quick {
            (vec![(1, 3), (20, 1), (50, 1)], 3, 5)
        } else {
            (vec![(1, 9), (20, 3), (50, 3)], 10, 30)
        };
        if let Some(c) = &o.cases {
            cases = c.clone();
        }
        let host_cases = if !o.host_network {
            Vec::new()
        } else if o.quick {
            vec![(1, 3), (20, 1)]
        } else {
            vec![(1, 9), (20, 3)]
        };
        Plan {
            cases,
            host_cases,
            settle: Duration::from_secs(settle),
            cpu_window: Duration::from_secs(cpu_window),
            cost_window: Duration::from_secs(if o.quick { 5 } else { 30 }),
            cost_rounds: if o.quick { 1 } else { 2 },
        }
    }
}

// ---- small helpers -------------------------------------------------------

fn wall_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn median(v: &[f64]) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.total_cmp(b));
    let m = s.len() / 2;
    if s.len() % 2 == 1 {
        s[m]
    } else {
        (s[m - 1] + s[m]) / 2.0
    }
}

fn min_max(v: &[f64]) -> (f64, f64) {
    v.iter()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), x| {
            (lo.min(*x), hi.max(*x))
        })
}

/// "131 ms" below 10 s, "3.71 s" above.
fn fmt_ms(v: f64) -> String {
    if v.is_nan() {
        "-".into()
    } else if v < 10_000.0 {
        format!("{v:.0} ms")
    } else {
        format!("{:.2} s", v / 1000.0)
    }
}

/// "131 ms [120-150]" (median [min-max]) for several runs.
fn fmt_stat(v: &[f64]) -> String {
    if v.is_empty() {
        return "-".into();
    }
    let (lo, hi) = min_max(v);
    if v.len() == 1 {
        return fmt_ms(v[0]);
    }
    let unit = |x: f64| {
        if median(v) < 10_000.0 {
            format!("{x:.0}")
        } else {
            format!("{:.2}", x / 1000.0)
        }
    };
    format!("{} [{}-{}]", fmt_ms(median(v)), unit(lo), unit(hi))
}

fn mib(kib: u64) -> String {
    format!("{:.1} MiB", kib as f64 / 1024.0)
}

fn tail(path: &Path, lines: usize) -> String {
    match fs::read_to_string(path) {
        Ok(t) => {
            let all: Vec<&str> = t.lines().collect();
            all[all.len().saturating_sub(lines)..].join("\n")
        }
        Err(e) => format!("(cannot read {}: {e})", path.display()),
    }
}

fn loadavg() -> String {
    fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|e| format!("(cannot read /proc/loadavg: {e})"))
}

// ---- the private containerd ------------------------------------------------

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("packaging/containerd-private.sh")
}

/// A containerd started (and, on drop, stopped) through containerd-private.sh.
struct PrivateContainerd {
    dir: PathBuf,
    keep: bool,
}

impl PrivateContainerd {
    fn start(dir: &Path, keep: bool) -> Result<PrivateContainerd> {
        fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        eprintln!(
            "pod_start: starting a private containerd in {}",
            dir.display()
        );
        let status = Command::new("bash")
            .arg(script())
            .arg("start")
            .arg(dir)
            .stdin(Stdio::null())
            .status()
            .with_context(|| format!("running {} start", script().display()))?;
        let ctd = PrivateContainerd {
            dir: dir.to_path_buf(),
            keep,
        };
        if !status.success() {
            bail!(
                "{} start {} failed ({status}); containerd.log ends:\n{}",
                script().display(),
                dir.display(),
                tail(&dir.join("containerd.log"), 20)
            );
        }
        Ok(ctd)
    }

    /// containerd's own process (not its shims), when it is running.
    fn pid(&self) -> Option<u32> {
        fs::read_to_string(self.dir.join("containerd.pid"))
            .ok()?
            .trim()
            .parse()
            .ok()
    }

    fn endpoint(&self) -> String {
        format!("unix://{}/containerd.sock", self.dir.display())
    }
}

impl Drop for PrivateContainerd {
    fn drop(&mut self) {
        eprintln!(
            "pod_start: stopping the private containerd in {}",
            self.dir.display()
        );
        let stopped = Command::new("bash")
            .arg(script())
            .arg("stop")
            .arg(&self.dir)
            .stdin(Stdio::null())
            .status();
        match stopped {
            Ok(s) if s.success() => {
                if !self.keep {
                    if let Err(e) = fs::remove_dir_all(&self.dir) {
                        eprintln!("pod_start: cannot remove {}: {e}", self.dir.display());
                    }
                }
            }
            Ok(s) => eprintln!(
                "pod_start: stopping containerd in {} failed ({s}); left in place",
                self.dir.display()
            ),
            Err(e) => eprintln!("pod_start: running {} stop: {e}", script().display()),
        }
    }
}

// ---- pods and manifests -----------------------------------------------------

/// The pod every case runs: one busybox container that sleeps.
fn bench_pod(name: &str, uid: &str, host_network: bool) -> Pod {
    Pod {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            namespace: Some(NAMESPACE.to_string()),
            uid: Some(uid.to_string()),
            labels: Some(BTreeMap::from([(
                "app".to_string(),
                "pod-start-bench".to_string(),
            )])),
            ..Default::default()
        },
        spec: Some(PodSpec {
            host_network: Some(host_network),
            termination_grace_period_seconds: Some(GRACE_SECS),
            containers: vec![Container {
                name: CONTAINER.to_string(),
                image: Some(BUSYBOX_IMAGE.to_string()),
                image_pull_policy: Some("IfNotPresent".to_string()),
                command: Some(vec!["sh".into(), "-c".into(), SCRIPT.into()]),
                ..Default::default()
            }],
            ..Default::default()
        }),
        status: None,
    }
}

/// The same pod as a static pod manifest.
fn manifest(name: &str, host_network: bool) -> String {
    format!(
        r#"apiVersion: v1
kind: Pod
metadata:
  name: {name}
  labels:
    app: pod-start-bench
spec:
  hostNetwork: {host_network}
  terminationGracePeriodSeconds: {GRACE_SECS}
  containers:
  - name: {CONTAINER}
    image: {BUSYBOX_IMAGE}
    imagePullPolicy: IfNotPresent
    command: ["sh", "-c", {SCRIPT:?}]
"#
    )
}

/// Writes every manifest as a dotfile first, then renames them into place
/// one after the other; returns when the first rename began (monotonic and
/// wall clock).
fn publish_manifests(dir: &Path, names: &[String], host_network: bool) -> Result<(Instant, i64)> {
    let mut staged = Vec::with_capacity(names.len());
    for name in names {
        let dot = dir.join(format!(".{name}.yaml"));
        fs::write(&dot, manifest(name, host_network))
            .with_context(|| format!("writing {}", dot.display()))?;
        staged.push((dot, dir.join(format!("{name}.yaml"))));
    }
    let t0 = Instant::now();
    let w0 = wall_ms();
    for (dot, target) in &staged {
        fs::rename(dot, target)
            .with_context(|| format!("renaming {} to {}", dot.display(), target.display()))?;
    }
    Ok((t0, w0))
}

fn full_name(name: &str) -> String {
    format!("{name}-{NODE}")
}

// ---- CRI views ----------------------------------------------------------------

/// The pods among `names` that have a RUNNING container, with those containers.
fn running(rt: &RemoteRuntime, names: &HashSet<String>) -> Result<BTreeMap<String, String>> {
    let mut state = api::ContainerStateValue::new();
    state.state = EnumOrUnknown::new(api::ContainerState::CONTAINER_RUNNING);
    let mut filter = api::ContainerFilter::new();
    filter.state = MessageField::some(state);
    let list = rt
        .list_containers(Some(filter))
        .context("ListContainers (state RUNNING)")?;
    Ok(list
        .into_iter()
        .filter_map(|c| {
            let pod = c.labels.get(POD_NAME)?;
            names.contains(pod).then(|| (pod.clone(), c.id.clone()))
        })
        .collect())
}

/// How many of `names` still have a sandbox, in any state.
fn sandboxes_left(rt: &RemoteRuntime, names: &HashSet<String>) -> Result<usize> {
    let list = rt.list_pod_sandbox(None).context("ListPodSandbox")?;
    Ok(list
        .iter()
        .filter(|s| s.labels.get(POD_NAME).is_some_and(|n| names.contains(n)))
        .count())
}

/// Polls until every pod in `names` has a running container; returns when
/// the first and the last were seen, and the containers.
fn wait_running(
    rt: &RemoteRuntime,
    names: &HashSet<String>,
    since: Instant,
    every: Duration,
    within: Duration,
) -> Result<(Duration, Duration, BTreeMap<String, String>)> {
    let mut first = None;
    loop {
        let seen = running(rt, names)?;
        let now = since.elapsed();
        if first.is_none() && !seen.is_empty() {
            first = Some(now);
        }
        if seen.len() == names.len() {
            return Ok((first.unwrap_or(now), now, seen));
        }
        if now > within {
            bail!(
                "only {} of {} pods running after {:.1} s",
                seen.len(),
                names.len(),
                now.as_secs_f64()
            );
        }
        std::thread::sleep(every);
    }
}

/// Polls until no sandbox of `names` is left; returns how long that took.
fn wait_gone(
    rt: &RemoteRuntime,
    names: &HashSet<String>,
    since: Instant,
    every: Duration,
    within: Duration,
) -> Result<Duration> {
    loop {
        let left = sandboxes_left(rt, names)?;
        let now = since.elapsed();
        if left == 0 {
            return Ok(now);
        }
        if now > within {
            bail!(
                "{left} of {} sandboxes still there after {:.1} s",
                names.len(),
                now.as_secs_f64()
            );
        }
        std::thread::sleep(every);
    }
}

fn poll_every(n: usize) -> Duration {
    // Fine-grained for a single pod; coarser for bursts, where each poll
    // takes CPU from the two cores that start the pods.
    if n == 1 {
        Duration::from_millis(2)
    } else {
        Duration::from_millis(5)
    }
}

// ---- 1. the floor --------------------------------------------------------------

#[derive(Default)]
struct FloorSample {
    /// Until the last StartContainer returned.
    total: f64,
    /// Until the poller saw every pod running (polled runs only).
    observed: Option<f64>,
    /// CPU time (ms) containerd used until every StartContainer returned.
    cpu_containerd: Option<f64>,
    sandbox: Vec<f64>,
    create: Vec<f64>,
    start: Vec<f64>,
    teardown: f64,
}

struct Started {
    sandbox_id: String,
    container_id: String,
    phases: [Duration; 3],
    done: Instant,
}

fn floor_start_one(
    rt: &RemoteRuntime,
    sandbox: &api::PodSandboxConfig,
    container: &api::ContainerConfig,
) -> Result<Started> {
    let t = Instant::now();
    let sandbox_id = rt.run_pod_sandbox(sandbox, "").context("RunPodSandbox")?;
    let t1 = Instant::now();
    let container_id = rt
        .create_container(&sandbox_id, container, sandbox)
        .context("CreateContainer")?;
    let t2 = Instant::now();
    rt.start_container(&container_id)
        .context("StartContainer")?;
    let done = Instant::now();
    Ok(Started {
        sandbox_id,
        container_id,
        phases: [t1 - t, t2 - t1, done - t2],
        done,
    })
}

fn floor_teardown_one(rt: &RemoteRuntime, s: &Started) -> Result<()> {
    rt.stop_container(&s.container_id, GRACE_SECS)
        .context("StopContainer")?;
    rt.stop_pod_sandbox(&s.sandbox_id)
        .context("StopPodSandbox")?;
    rt.remove_container(&s.container_id)
        .context("RemoveContainer")?;
    rt.remove_pod_sandbox(&s.sandbox_id)
        .context("RemovePodSandbox")?;
    Ok(())
}

/// Runs `f(i)` on n named threads released together; returns the release
/// instant and every result in order.
fn fan_out<T: Send + 'static>(
    n: usize,
    label: &str,
    f: impl Fn(usize) -> Result<T> + Send + Sync + 'static,
) -> Result<(Instant, Vec<Result<T>>)> {
    let f = Arc::new(f);
    let go = Arc::new(Barrier::new(n + 1));
    let mut threads = Vec::with_capacity(n);
    for i in 0..n {
        let (f, go) = (f.clone(), go.clone());
        let t = spawn_named(format!("{label}/{i}"), move || {
            go.wait();
            f(i)
        })
        .with_context(|| format!("starting thread {label}/{i}"))?;
        threads.push(t);
    }
    go.wait();
    let t0 = Instant::now();
    let results = threads
        .into_iter()
        .enumerate()
        .map(|(i, t)| {
            t.join()
                .unwrap_or_else(|_| Err(anyhow!("thread {label}/{i} panicked")))
        })
        .collect();
    Ok((t0, results))
}

/// Polls ListContainers like the tinylet runs do, from its own thread, until
/// every pod in `names` is running; so that the floor can be observed the
/// same way, under the same load, as tinylet.
struct Poller {
    stop: Arc<AtomicBool>,
    thread: JoinOnDrop<Result<Option<Instant>>>,
}

impl Poller {
    fn start(rt: Arc<RemoteRuntime>, names: HashSet<String>, every: Duration) -> Result<Poller> {
        let stop = Arc::new(AtomicBool::new(false));
        let stop2 = stop.clone();
        let thread = spawn_named("floor-poll", move || {
            let deadline = Instant::now() + Duration::from_secs(120);
            while !stop2.load(Ordering::Relaxed) && Instant::now() < deadline {
                if running(&rt, &names)?.len() == names.len() {
                    return Ok(Some(Instant::now()));
                }
                std::thread::sleep(every);
            }
            Ok(None)
        })
        .context("starting the floor's poller thread")?;
        Ok(Poller { stop, thread })
    }

    /// When it saw every pod running (None: stopped or timed out first).
    fn finish(self, stop: bool) -> Result<Option<Instant>> {
        if stop {
            self.stop.store(true, Ordering::Relaxed);
        }
        self.thread
            .join()
            .unwrap_or_else(|_| Err(anyhow!("the floor's poller thread panicked")))
    }
}

/// Starts pods straight through the CRI, as tinylet would, from one thread
/// per pod.
struct Floor {
    rt: Arc<RemoteRuntime>,
    ctd_pid: Option<u32>,
    image_ref: String,
    logs_root: PathBuf,
    root: PathBuf,
}

type PodConfigs = Vec<(api::PodSandboxConfig, api::ContainerConfig)>;

impl Floor {
    /// The CRI configs tinylet generates for `n` bench pods named
    /// floor-TAG-I, with one change: without the pod UID label, which makes
    /// them invisible to a tinylet running beside the floor runs (its
    /// housekeeping would stop pods with tinylet's labels that no source
    /// has).
    fn configs(&self, n: usize, host: bool, tag: &str) -> Result<PodConfigs> {
        let mut configs = Vec::with_capacity(n);
        for i in 0..n {
            let name = format!("floor-{tag}-{i}");
            let pod = bench_pod(&name, &format!("{name}-{}", std::process::id()), host);
            let container = pod
                .spec
                .as_ref()
                .and_then(|s| s.containers.first())
                .ok_or_else(|| anyhow!("bench pod {name} without a container"))?;
            let log_dir = pod_log_dir(&self.logs_root, &pod)?.join(CONTAINER);
            fs::create_dir_all(&log_dir)
                .with_context(|| format!("creating {}", log_dir.display()))?;
            let volumes = pod_dir(&self.root, &name)?.join("volumes");
            // tinylet's defaults: a QoS cgroup parent, no cluster DNS.
            let settings = NodeSettings {
                cgroups_per_qos: true,
                ..NodeSettings::default()
            };
            // The same files tinylet mounts: a managed /etc/hosts and an
            // empty termination log.
            let pod_files = pod_dir(&self.root, &name)?;
            fs::create_dir_all(&pod_files)
                .with_context(|| format!("creating {}", pod_files.display()))?;
            let (etc_hosts, termination_log) = (
                pod_files.join("etc-hosts"),
                pod_files.join("termination-log"),
            );
            fs::write(&etc_hosts, "127.0.0.1\tlocalhost\n")
                .and_then(|()| fs::write(&termination_log, ""))
                .with_context(|| format!("writing files in {}", pod_files.display()))?;
            let inputs = ContainerInputs {
                settings: &settings,
                pod_ips: Vec::new(),
                allocatable: Default::default(),
                image_user: None,
                etc_hosts: Some(etc_hosts),
                termination_log: Some(termination_log),
                service_env: Vec::new(),
                env_objects: None,
            };
            let mut sandbox = sandbox_config(&pod, 0, &self.logs_root, &settings);
            let mut c = container_config(&pod, container, 0, &self.image_ref, &volumes, &inputs)
                .map_err(|e| anyhow!("container config of {name}: {e}"))?;
            sandbox.labels.remove(POD_UID);
            c.labels.remove(POD_UID);
            configs.push((sandbox, c));
        }
        Ok(configs)
    }

    /// Starts every pod from its own thread, the threads released together.
    /// Returns the release instant and what started; on a failure, what did
    /// start is still returned for the teardown.
    fn start_all(
        &self,
        configs: PodConfigs,
    ) -> Result<(Instant, Vec<Started>, Option<anyhow::Error>)> {
        let n = configs.len();
        let configs = Arc::new(configs);
        let rt = self.rt.clone();
        let (t0, results) = fan_out(n, "floor", move |i| {
            floor_start_one(&rt, &configs[i].0, &configs[i].1)
        })?;
        let mut started = Vec::new();
        let mut first_err = None;
        for (i, r) in results.into_iter().enumerate() {
            match r {
                Ok(s) => started.push(s),
                Err(e) => {
                    if first_err.is_none() {
                        first_err = Some(e.context(format!("floor pod {i} of {n}")));
                    }
                }
            }
        }
        Ok((t0, started, first_err))
    }

    /// Stops and removes everything `started`, from one thread per pod;
    /// returns how long that took.
    fn teardown(&self, started: Vec<Started>) -> Result<f64> {
        let started = Arc::new(started);
        let (rt, st) = (self.rt.clone(), started.clone());
        let (t1, results) = fan_out(started.len(), "floor-rm", move |i| {
            floor_teardown_one(&rt, &st[i])
        })?;
        let took = ms(t1.elapsed());
        for r in results {
            r.context("floor teardown")?;
        }
        Ok(took)
    }

    /// One run of `n` pods: started, observed by a poller if `poll`, torn down.
    fn run(&self, n: usize, host: bool, tag: &str, poll: bool) -> Result<FloorSample> {
        let configs = self.configs(n, host, tag)?;
        let poller = if poll {
            let names = configs
                .iter()
                .filter_map(|(sb, _)| sb.metadata.as_ref().map(|m| m.name.clone()))
                .collect();
            Some(Poller::start(self.rt.clone(), names, poll_every(n))?)
        } else {
            None
        };
        let cpu = CpuMeter::start(&[self.ctd_pid]);
        let (t0, started, mut first_err) = self.start_all(configs)?;
        let cpu_containerd = cpu.read()[0];
        let observed = match poller.map(|p| p.finish(first_err.is_some())) {
            None => None,
            Some(Ok(Some(at))) => Some(ms(at.saturating_duration_since(t0))),
            Some(Ok(None)) => {
                if first_err.is_none() {
                    first_err = Some(anyhow!(
                        "the floor's poller did not see all {n} pods running"
                    ));
                }
                None
            }
            Some(Err(e)) => {
                if first_err.is_none() {
                    first_err = Some(e);
                }
                None
            }
        };
        let mut sample = FloorSample {
            observed,
            cpu_containerd,
            total: started.iter().map(|s| ms(s.done - t0)).fold(0.0, f64::max),
            ..FloorSample::default()
        };
        for s in &started {
            sample.sandbox.push(ms(s.phases[0]));
            sample.create.push(ms(s.phases[1]));
            sample.start.push(ms(s.phases[2]));
        }
        let teardown = self.teardown(started);
        if let Some(e) = first_err {
            return Err(e);
        }
        sample.teardown = teardown?;
        Ok(sample)
    }

    /// What some CRI calls cost with `n` pods running: one of the bench's
    /// polls, and one pod's status inspection as tinylet's PLEG does it for
    /// every pod that changed.
    fn cri_costs(&self, n: usize) -> Result<CriCosts> {
        let configs = self.configs(n, false, "cost")?;
        let names: Vec<String> = configs
            .iter()
            .filter_map(|(sb, _)| sb.metadata.as_ref().map(|m| m.name.clone()))
            .collect();
        let (_, started, first_err) = self.start_all(configs)?;
        let costs = match first_err {
            None => Some(measure_cri_costs(&self.rt, self.ctd_pid, &names)),
            Some(_) => None,
        };
        let teardown = self.teardown(started);
        if let Some(e) = first_err {
            return Err(e.context(format!("measuring CRI calls with {n} pods")));
        }
        teardown?;
        costs.unwrap_or_else(|| Err(anyhow!("no pods to measure CRI calls with")))
    }
}

/// Round trip and containerd CPU time (ms) of a poll and of one pod's
/// status inspection.
#[derive(Default, Clone, Copy)]
struct CriCosts {
    pods: usize,
    list_ms: f64,
    list_cpu_ms: Option<f64>,
    inspect_ms: f64,
    inspect_cpu_ms: Option<f64>,
}

fn measure_cri_costs(
    rt: &RemoteRuntime,
    ctd_pid: Option<u32>,
    names: &[String],
) -> Result<CriCosts> {
    const LISTS: u32 = 200;
    const ROUNDS: usize = 4;
    let none = HashSet::new();
    let cpu = CpuMeter::start(&[ctd_pid]);
    let t = Instant::now();
    for _ in 0..LISTS {
        running(rt, &none)?;
    }
    let list_ms = ms(t.elapsed()) / LISTS as f64;
    let list_cpu_ms = cpu.read()[0].map(|c| c / LISTS as f64);

    // ListPodSandbox and ListContainers filtered by the pod's label, then
    // the status of each: what inspecting one pod takes.
    let cpu = CpuMeter::start(&[ctd_pid]);
    let t = Instant::now();
    for _ in 0..ROUNDS {
        for name in names {
            let mut sf = api::PodSandboxFilter::new();
            sf.label_selector.insert(POD_NAME.into(), name.clone());
            for sb in rt.list_pod_sandbox(Some(sf)).context("ListPodSandbox")? {
                rt.pod_sandbox_status(&sb.id).context("PodSandboxStatus")?;
            }
            let mut cf = api::ContainerFilter::new();
            cf.label_selector.insert(POD_NAME.into(), name.clone());
            for c in rt.list_containers(Some(cf)).context("ListContainers")? {
                rt.container_status(&c.id).context("ContainerStatus")?;
            }
        }
    }
    let inspections = (ROUNDS * names.len()).max(1) as f64;
    Ok(CriCosts {
        pods: names.len(),
        list_ms,
        list_cpu_ms,
        inspect_ms: ms(t.elapsed()) / inspections,
        inspect_cpu_ms: cpu.read()[0].map(|c| c / inspections),
    })
}

// ---- 2. tinylet --------------------------------------------------------------------

/// A tinylet process with its own manifest, root and log directories.
struct Tinylet {
    child: Child,
    log: PathBuf,
    manifests: PathBuf,
}

impl Tinylet {
    fn start(bin: &Path, endpoint: &str, dir: &Path) -> Result<Tinylet> {
        Tinylet::start_with(bin, endpoint, dir, NODE, true, &[])
    }

    /// A tinylet named `node`, with a manifest directory if `static_pods`,
    /// and `extra` flags.
    fn start_with(
        bin: &Path,
        endpoint: &str,
        dir: &Path,
        node: &str,
        static_pods: bool,
        extra: &[&OsStr],
    ) -> Result<Tinylet> {
        let manifests = dir.join("manifests");
        for d in [&manifests, &dir.join("root"), &dir.join("logs")] {
            fs::create_dir_all(d).with_context(|| format!("creating {}", d.display()))?;
        }
        let log = dir.join("tinylet.log");
        let out = fs::File::create(&log).with_context(|| format!("creating {}", log.display()))?;
        let err = out
            .try_clone()
            .with_context(|| format!("opening {} twice", log.display()))?;
        let mut cmd = Command::new(bin);
        cmd.arg("--container-runtime-endpoint").arg(endpoint);
        if static_pods {
            cmd.arg("--pod-manifest-path").arg(&manifests);
        }
        let child = cmd
            .arg("--hostname-override")
            .arg(node)
            .arg("--root-dir")
            .arg(dir.join("root"))
            .arg("--pod-logs-dir")
            .arg(dir.join("logs"))
            .args(["--v", "2"])
            // The bench's images must survive a machine whose disk is over
            // image GC's 85%.
            .args(["--image-gc-high-threshold", "100"])
            // Nor the disk eviction thresholds, which such a disk meets.
            .args(["--eviction-hard", "memory.available<100Mi"])
            .args(extra)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        let mut t = Tinylet {
            child,
            log,
            manifests,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if fs::read_to_string(&t.log).is_ok_and(|l| l.contains("sync loop started")) {
                break;
            }
            if let Ok(Some(status)) = t.child.try_wait() {
                bail!(
                    "tinylet exited during start-up ({status}); its log ends:\n{}",
                    tail(&t.log, 20)
                );
            }
            if Instant::now() > deadline {
                bail!(
                    "tinylet did not log \"sync loop started\" within 30 s; its log ends:\n{}",
                    tail(&t.log, 20)
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        // The first relist (1 s period) must have finished before a new pod's
        // worker may sync; a node agent is long past it in real life.
        std::thread::sleep(Duration::from_millis(1500));
        if let Ok(Some(status)) = t.child.try_wait() {
            bail!(
                "tinylet exited ({status}); its log ends:\n{}",
                tail(&t.log, 20)
            );
        }
        Ok(t)
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    fn check_alive(&mut self) -> Result<()> {
        if let Ok(Some(status)) = self.child.try_wait() {
            bail!(
                "tinylet exited ({status}); its log ends:\n{}",
                tail(&self.log, 20)
            );
        }
        Ok(())
    }

    /// SIGTERM, then SIGKILL if it has not exited within 10 s.
    fn stop(&mut self) {
        if let Ok(Some(_)) = self.child.try_wait() {
            return;
        }
        let _ = Command::new("kill")
            .args(["-TERM", &self.pid().to_string()])
            .stdin(Stdio::null())
            .status();
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        eprintln!(
            "pod_start: tinylet {} ignored SIGTERM for 10 s; killing it",
            self.pid()
        );
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Tinylet {
    fn drop(&mut self) {
        self.stop();
    }
}

struct TinyletSample {
    names: Vec<String>,
    /// Wall clock (ms) of the first rename and of the first unlink.
    w_start: i64,
    w_remove: i64,
    first_running: f64,
    all_running: f64,
    /// Last container's CRI started_at, from the first rename.
    last_started_at: f64,
    all_gone: f64,
    /// CPU time (ms) tinylet and containerd used until all were running.
    cpu_tinylet: Option<f64>,
    cpu_containerd: Option<f64>,
}

fn tinylet_run(
    rt: &RemoteRuntime,
    ctd_pid: Option<u32>,
    t: &mut Tinylet,
    n: usize,
    host: bool,
    tag: &str,
) -> Result<TinyletSample> {
    let names: Vec<String> = (0..n).map(|i| format!("bench-{tag}-{i}")).collect();
    let full: HashSet<String> = names.iter().map(|n| full_name(n)).collect();
    let every = poll_every(n);
    let within = Duration::from_secs(60 + 2 * n as u64);

    let cpu = CpuMeter::start(&[Some(t.pid()), ctd_pid]);
    let (t0, w0) = publish_manifests(&t.manifests, &names, host)?;
    let waited = wait_running(rt, &full, t0, every, within);
    let used = cpu.read();
    t.check_alive()?;
    let (first, all, containers) =
        waited.with_context(|| format!("tinylet starting {n} pods ({tag})"))?;

    let mut last_started = 0i64;
    for id in containers.values() {
        let st = rt.container_status(id).context("ContainerStatus")?;
        last_started = last_started.max(st.started_at);
    }
    let last_started_at = (last_started as f64 / 1e6) - w0 as f64;

    // Remove them in the steady state: after the PLEG relists that see the
    // sandbox and the container start, and the re-syncs those trigger.
    std::thread::sleep(SETTLE_BEFORE_REMOVAL);

    let t1 = Instant::now();
    let w1 = wall_ms();
    for name in &names {
        let p = t.manifests.join(format!("{name}.yaml"));
        fs::remove_file(&p).with_context(|| format!("removing {}", p.display()))?;
    }
    let gone = wait_gone(
        rt,
        &full,
        t1,
        Duration::from_millis(5),
        Duration::from_secs(60 + n as u64),
    );
    t.check_alive()?;
    let gone = gone.with_context(|| format!("tinylet removing {n} pods ({tag})"))?;
    // Let the PLEG and housekeeping catch up before the next run.
    std::thread::sleep(PAUSE);
    Ok(TinyletSample {
        names: names.iter().map(|n| full_name(n)).collect(),
        w_start: w0,
        w_remove: w1,
        first_running: ms(first),
        all_running: ms(all),
        last_started_at,
        cpu_tinylet: used[0],
        cpu_containerd: used[1],
        all_gone: ms(gone),
    })
}

// ---- tinylet's log -------------------------------------------------------------------

/// One line of tinylet's log: wall clock in ms and the message.
struct LogLine {
    at: i64,
    msg: String,
}

/// Days since 1970-01-01 of a proleptic Gregorian date.
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// "2025-01-02T03:04:05.678Z" as ms since the epoch.
fn parse_timestamp(s: &str) -> Option<i64> {
    let s = s.strip_suffix('Z')?;
    let (date, time) = s.split_once('T')?;
    let mut d = date.split('-').map(|x| x.parse::<i64>().ok());
    let (y, mo, da) = (d.next()??, d.next()??, d.next()??);
    let (hms, frac) = time.split_once('.').unwrap_or((time, "0"));
    let mut t = hms.split(':').map(|x| x.parse::<i64>().ok());
    let (h, mi, se) = (t.next()??, t.next()??, t.next()??);
    let frac_ms = match frac.len() {
        0 => 0,
        n => frac.parse::<i64>().ok()? * 1000 / 10i64.pow(n as u32),
    };
    Some(((days_from_civil(y, mo, da) * 24 + h) * 60 + mi) * 60_000 + se * 1000 + frac_ms)
}

fn read_log(path: &Path) -> Vec<LogLine> {
    let Ok(text) = fs::read_to_string(path) else {
        return Vec::new();
    };
    text.lines()
        .filter_map(|l| {
            let rest = l.strip_prefix('[')?;
            let (ts, rest) = rest.split_once(' ')?;
            let (_, msg) = rest.split_once("] ")?;
            Some(LogLine {
                at: parse_timestamp(ts)?,
                msg: msg.to_string(),
            })
        })
        .collect()
}

/// Where one pod's start went, from tinylet's log (ms from the first rename).
#[derive(Default, Clone, Copy)]
struct PodTrace {
    add: Option<i64>,
    sandbox_requested: Option<i64>,
    sandbox_ms: Option<f64>,
    sandbox_done: Option<i64>,
    container_started: Option<i64>,
    remove: Option<i64>,
    removed: Option<i64>,
}

fn trace_pod(log: &[LogLine], full: &str, w_start: i64, w_remove: i64) -> PodTrace {
    let mut t = PodTrace::default();
    let who = format!("pod {NAMESPACE}/{full}:");
    let listed = |msg: &str| {
        msg.split_once("): ").is_some_and(|(_, names)| {
            names
                .split(", ")
                .any(|n| n == format!("{NAMESPACE}/{full}") || n == full)
        })
    };
    for l in log.iter().filter(|l| l.at >= w_start - 5) {
        if l.msg.starts_with("SyncLoop ADD") && listed(&l.msg) && t.add.is_none() {
            t.add = Some(l.at - w_start);
        } else if l.msg.starts_with("SyncLoop REMOVE") && listed(&l.msg) && t.remove.is_none() {
            t.remove = Some(l.at - w_remove);
        } else if let Some(rest) = l.msg.strip_prefix(&who) {
            if rest.contains(" sandbox ") && rest.contains(" running (") && t.sandbox_done.is_none()
            {
                // "... running (attempt 0, 52 ms)"
                let took = rest
                    .rsplit_once(", ")
                    .and_then(|(_, x)| x.strip_suffix(" ms)"))
                    .and_then(|x| x.parse::<f64>().ok());
                t.sandbox_done = Some(l.at - w_start);
                t.sandbox_ms = took;
                t.sandbox_requested = took.map(|x| l.at - w_start - x.round() as i64);
            } else if rest.contains("container")
                && rest.contains(" started (")
                && t.container_started.is_none()
            {
                t.container_started = Some(l.at - w_start);
            } else if rest.trim() == "terminated and removed" && t.removed.is_none() {
                t.removed = Some(l.at - w_remove);
            }
        }
    }
    t
}

// ---- 3. footprint ----------------------------------------------------------------------

/// Memory (KiB) and threads of a process, from /proc/PID/status.
#[derive(Default, Clone, Copy)]
struct Mem {
    rss: u64,
    /// Peak RSS.
    hwm: u64,
    /// RSS in anonymous pages (heap, stacks) and in file pages (the
    /// binary's code and data as far as touched).
    anon: u64,
    file: u64,
    /// Proportional set size: shared library pages split among their users.
    pss: Option<u64>,
    threads: u64,
}

impl Mem {
    /// "8.2 MiB (anon 0.8, file 7.4; PSS 6.9)".
    fn show(&self) -> String {
        format!(
            "{} (anon {:.1}, file {:.1}{})",
            mib(self.rss),
            self.anon as f64 / 1024.0,
            self.file as f64 / 1024.0,
            self.pss
                .map(|p| format!("; PSS {:.1}", p as f64 / 1024.0))
                .unwrap_or_default()
        )
    }
}

fn proc_status(pid: u32) -> Result<Mem> {
    let path = format!("/proc/{pid}/status");
    let text = fs::read_to_string(&path).with_context(|| format!("reading {path}"))?;
    let field = |key: &str| -> Result<u64> {
        text.lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| anyhow!("{path}: no numeric {key}"))
    };
    Ok(Mem {
        rss: field("VmRSS:")?,
        hwm: field("VmHWM:")?,
        anon: field("RssAnon:")?,
        file: field("RssFile:")?,
        pss: fs::read_to_string(format!("/proc/{pid}/smaps_rollup"))
            .ok()
            .and_then(|t| {
                t.lines()
                    .find_map(|l| l.strip_prefix("Pss:"))
                    .and_then(|v| v.split_whitespace().next())
                    .and_then(|v| v.parse().ok())
            }),
        threads: field("Threads:")?,
    })
}

/// The unit of /proc/PID/stat times: 100 per second on Linux, whatever HZ is.
const USER_HZ: f64 = 100.0;

/// utime + stime of a process in clock ticks (USER_HZ).
fn cpu_ticks(pid: u32) -> Result<u64> {
    let path = format!("/proc/{pid}/stat");
    let text = fs::read_to_string(&path).with_context(|| format!("reading {path}"))?;
    let after = text
        .rsplit_once(')')
        .map(|(_, r)| r)
        .ok_or_else(|| anyhow!("{path}: no ')' after the command name"))?;
    let f: Vec<&str> = after.split_whitespace().collect();
    // Fields after the name start at 3 (state); utime is 14, stime 15.
    let get = |i: usize| -> Result<u64> {
        f.get(i - 3)
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| anyhow!("{path}: field {i} missing or not a number"))
    };
    Ok(get(14)? + get(15)?)
}

/// CPU use over `window` as a percentage of one core.
fn cpu_percent(pid: u32, window: Duration) -> Result<f64> {
    let (c0, t0) = (cpu_ticks(pid)?, Instant::now());
    std::thread::sleep(window);
    let (c1, t1) = (cpu_ticks(pid)?, Instant::now());
    Ok((c1 - c0) as f64 / USER_HZ / (t1 - t0).as_secs_f64() * 100.0)
}

/// CPU time of some processes over a stretch of time.
struct CpuMeter {
    pids: Vec<Option<u32>>,
    start: Vec<Option<u64>>,
}

impl CpuMeter {
    fn start(pids: &[Option<u32>]) -> CpuMeter {
        CpuMeter {
            pids: pids.to_vec(),
            start: pids
                .iter()
                .map(|p| p.and_then(|p| cpu_ticks(p).ok()))
                .collect(),
        }
    }

    /// CPU ms each process used since `start` (None: unknown or gone).
    fn read(&self) -> Vec<Option<f64>> {
        self.pids
            .iter()
            .zip(&self.start)
            .map(|(p, s)| {
                let now = cpu_ticks((*p)?).ok()?;
                Some(now.checked_sub((*s)?)? as f64 * 1000.0 / USER_HZ)
            })
            .collect()
    }
}

#[derive(Default)]
struct Point {
    pods: usize,
    mem: Mem,
    cpu: Option<f64>,
    /// What the point is after: "" (pods running or idle), "removed"
    /// (a minute after the pods went), "hostile" (a minute after the
    /// hostile corpus went), "hostile-reading" (while it was there).
    after: &'static str,
}

fn measure(
    t: &mut Tinylet,
    pods: usize,
    settle: Duration,
    cpu_window: Option<Duration>,
) -> Result<Point> {
    std::thread::sleep(settle);
    t.check_alive()?;
    let mem = proc_status(t.pid())?;
    let cpu = match cpu_window {
        Some(w) => Some(cpu_percent(t.pid(), w)?),
        None => None,
    };
    eprintln!(
        "pod_start: footprint with {pods} pods: RSS {}, peak {}, {} threads{}",
        mem.show(),
        mib(mem.hwm),
        mem.threads,
        cpu.map(|c| format!(", CPU {c:.2}%")).unwrap_or_default()
    );
    Ok(Point {
        pods,
        mem,
        cpu,
        after: "",
    })
}

fn footprint(
    rt: &RemoteRuntime,
    bin: &Path,
    endpoint: &str,
    dir: &Path,
    plan: &Plan,
    max_pods: usize,
    ctd_pid: Option<u32>,
) -> Result<(Vec<Point>, Option<f64>, Vec<runtime_cost::Cost>)> {
    let mut costs = Vec::new();
    let mut t = Tinylet::start(bin, endpoint, dir)?;
    let mut points = vec![measure(&mut t, 0, plan.settle, Some(plan.cpu_window))?];
    let mut steps = vec![10, 50];
    if max_pods > 50 {
        steps.push(max_pods);
    }
    let mut names: Vec<String> = Vec::new();
    for pods in steps {
        let new: Vec<String> = (names.len()..pods).map(|i| format!("foot-{i}")).collect();
        let (t0, _) = publish_manifests(&t.manifests, &new, false)?;
        names.extend(new);
        let full: HashSet<String> = names.iter().map(|n| full_name(n)).collect();
        let waited = wait_running(
            rt,
            &full,
            t0,
            Duration::from_millis(50),
            Duration::from_secs(60 + 2 * pods as u64),
        );
        t.check_alive()?;
        let (_, all, _) =
            waited.with_context(|| format!("footprint: starting pods up to {pods}"))?;
        eprintln!(
            "pod_start: footprint: {pods} pods running ({:.2} s after the new manifests)",
            all.as_secs_f64()
        );
        let window = (pods <= 50).then_some(plan.cpu_window);
        points.push(measure(&mut t, pods, plan.settle, window)?);
        // What containerd spends because of tinylet, idle at 10 and 50 pods.
        if let (Some(ctd), true) = (ctd_pid, pods <= 50) {
            costs.push(runtime_cost::measure(
                t.pid(),
                ctd,
                pods,
                plan.cost_window,
                plan.cost_rounds,
            )?);
        }
    }
    let t1 = Instant::now();
    for name in &names {
        let p = t.manifests.join(format!("{name}.yaml"));
        fs::remove_file(&p).with_context(|| format!("removing {}", p.display()))?;
    }
    let full: HashSet<String> = names.iter().map(|n| full_name(n)).collect();
    let gone = wait_gone(
        rt,
        &full,
        t1,
        Duration::from_millis(50),
        Duration::from_secs(120 + names.len() as u64),
    );
    t.check_alive()?;
    let gone = gone.context("footprint: removing the pods")?;
    eprintln!(
        "pod_start: footprint: {} pods removed in {:.2} s",
        names.len(),
        gone.as_secs_f64()
    );
    // Memory that comes back: a minute after the last pod went.
    let since = t1 + gone;
    let mut after = measure(
        &mut t,
        0,
        RETURN_WINDOW.saturating_sub(since.elapsed()),
        None,
    )?;
    after.after = "removed";
    points.push(after);

    // The hostile corpus: read (and refused), then removed.
    let corpus = write_hostile_corpus(&t.manifests)?;
    let mut reading = measure(&mut t, 0, Duration::from_secs(15), None)?;
    reading.after = "hostile-reading";
    points.push(reading);
    for f in &corpus {
        fs::remove_file(f).with_context(|| format!("removing {}", f.display()))?;
    }
    let mut hostile = measure(&mut t, 0, RETURN_WINDOW, None)?;
    hostile.after = "hostile";
    points.push(hostile);
    Ok((points, Some(ms(gone)), costs))
}

/// How long after work ends RSS must be back near its idle figure.
const RETURN_WINDOW: Duration = Duration::from_secs(60);

/// Writes manifests meant to hurt into `dir`: binary garbage, a 12 MiB
/// file, deep nesting in JSON and YAML, a YAML alias bomb, duplicate keys,
/// wrong types, invalid and path-traversing names, and a pod with 5000
/// containers (refused: over the 250 a local pod may have).
/// Returns their paths.
fn write_hostile_corpus(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut files: Vec<(&str, Vec<u8>)> = Vec::new();
    let mut x: u64 = 0x2545_f491_4f6c_dd1d;
    let garbage: Vec<u8> = (0..1 << 20)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect();
    files.push(("hostile-garbage.yaml", garbage));
    let mut huge = String::from(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: huge\n  annotations:\n    a: \"",
    );
    huge.push_str(&"x".repeat(12 << 20));
    huge.push_str("\"\nspec:\n  containers:\n  - {name: a, image: busybox}\n");
    files.push(("hostile-huge.yaml", huge.into_bytes()));
    let depth = 100_000;
    let nest = format!("{}{}", "[".repeat(depth), "]".repeat(depth));
    files.push((
        "hostile-deep.json",
        format!(r#"{{"apiVersion":"v1","kind":"Pod","metadata":{{"name":"deep"}},"spec":{nest}}}"#)
            .into_bytes(),
    ));
    files.push((
        "hostile-deep.yaml",
        format!("apiVersion: v1\nkind: Pod\nmetadata: {{name: deepy}}\nspec: {nest}\n")
            .into_bytes(),
    ));
    let mut bomb = String::from(
        "apiVersion: v1\nkind: Pod\nmetadata: {name: bomb}\nx0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n",
    );
    for i in 1..10 {
        let refs = vec![format!("*a{}", i - 1); 9].join(", ");
        bomb.push_str(&format!("x{i}: &a{i} [{refs}]\n"));
    }
    files.push(("hostile-bomb.yaml", bomb.into_bytes()));
    files.push((
        "hostile-dupkeys.yaml",
        b"apiVersion: v1\nkind: Pod\nmetadata: {name: dup}\nmetadata: {name: dup2}\nspec: {containers: [{name: a, image: busybox}]}\n".to_vec(),
    ));
    files.push((
        "hostile-types.yaml",
        b"apiVersion: v1\nkind: Pod\nmetadata: {name: [1, 2]}\nspec: {containers: nope}\n".to_vec(),
    ));
    files.push((
        "hostile-name.yaml",
        b"apiVersion: v1\nkind: Pod\nmetadata: {name: Bad_Name!}\nspec: {containers: [{name: a, image: busybox}]}\n".to_vec(),
    ));
    files.push((
        "hostile-traverse.yaml",
        b"apiVersion: v1\nkind: Pod\nmetadata: {name: ../../etc, namespace: ../..}\nspec: {containers: [{name: ../x, image: busybox}]}\n".to_vec(),
    ));
    let mut many =
        String::from("apiVersion: v1\nkind: Pod\nmetadata: {name: many}\nspec:\n  containers:\n");
    for i in 0..5000 {
        many.push_str(&format!(
            "  - {{name: c{i}, image: example.invalid/absent:1, imagePullPolicy: Never}}\n"
        ));
    }
    files.push(("hostile-many.yaml", many.into_bytes()));
    let mut paths = Vec::new();
    for (name, bytes) in files {
        let dot = dir.join(format!(".{name}"));
        fs::write(&dot, bytes).with_context(|| format!("writing {}", dot.display()))?;
        let path = dir.join(name);
        fs::rename(&dot, &path).with_context(|| format!("renaming {}", dot.display()))?;
        paths.push(path);
    }
    Ok(paths)
}

// ---- the whole run ---------------------------------------------------------------------

struct CaseResult {
    n: usize,
    host: bool,
    /// Floor runs observed by polling, like tinylet's.
    floor: Vec<FloorSample>,
    /// Floor runs without a poller.
    floor_quiet: Vec<FloorSample>,
    tinylet: Vec<TinyletSample>,
}

impl CaseResult {
    fn floor_observed(&self) -> Vec<f64> {
        self.floor.iter().filter_map(|s| s.observed).collect()
    }
    fn floor_quiet(&self) -> Vec<f64> {
        self.floor_quiet.iter().map(|s| s.total).collect()
    }
    fn floor_teardowns(&self) -> Vec<f64> {
        self.floor
            .iter()
            .chain(&self.floor_quiet)
            .map(|s| s.teardown)
            .collect()
    }
    fn tinylet_all(&self) -> Vec<f64> {
        self.tinylet.iter().map(|s| s.all_running).collect()
    }
    fn tinylet_gone(&self) -> Vec<f64> {
        self.tinylet.iter().map(|s| s.all_gone).collect()
    }
    fn label(&self) -> String {
        format!(
            "{} pod{}, {}",
            self.n,
            if self.n == 1 { "" } else { "s" },
            if self.host { "host net" } else { "CNI" }
        )
    }
}

struct Env {
    runtime: String,
    cpus: usize,
    kernel: String,
    load_before: String,
    bin: PathBuf,
    bin_size: u64,
    cri_costs: Option<CriCosts>,
    /// VmRSS, VmHWM, threads of the timed runs' tinylet at their end, and how
    /// many pods it started and removed.
    run_rss: Option<Mem>,
    run_pods: usize,
    tinylet_log: PathBuf,
}

fn tinylet_binary(o: &Options) -> Result<PathBuf> {
    let candidates: Vec<PathBuf> = match (&o.tinylet, std::env::var_os("TINYLET_BIN")) {
        (Some(p), _) => vec![p.clone()],
        (None, Some(p)) => vec![PathBuf::from(p)],
        (None, None) => {
            let mut v = Vec::new();
            if let Some(t) = std::env::var_os("CARGO_TARGET_DIR") {
                v.push(Path::new(&t).join("release/tinylet"));
            }
            v.push(PathBuf::from("/var/cache/tinylet/target/release/tinylet"));
            v
        }
    };
    candidates
        .iter()
        .find(|p| p.is_file())
        .cloned()
        .ok_or_else(|| {
            anyhow!(
                "no tinylet binary at {}; build it with `cargo build --release` or set TINYLET_BIN",
                candidates
                    .iter()
                    .map(|p| p.display().to_string())
                    .collect::<Vec<_>>()
                    .join(" or ")
            )
        })
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if !args.iter().any(|a| a == "--bench") {
        eprintln!("pod_start: a benchmark; run it with `cargo bench --bench pod_start` or packaging/bench.sh");
        return ExitCode::SUCCESS;
    }
    let opts = match parse_options(&args) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("pod_start: {e:#}");
            return ExitCode::from(2);
        }
    };
    match run(&opts) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("pod_start: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(o: &Options) -> Result<()> {
    let plan = Plan::new(o);
    let bin = tinylet_binary(o)?;
    let bin_size = fs::metadata(&bin)
        .with_context(|| format!("stat {}", bin.display()))?
        .len();
    let load_before = loadavg();

    let work = match &o.work_dir {
        Some(d) => d.clone(),
        None => PathBuf::from(format!("/tmp/tl-bench-work.{}", std::process::id())),
    };
    fs::create_dir_all(&work).with_context(|| format!("creating {}", work.display()))?;

    // Declared before anything that uses it, so it is stopped last.
    let containerd = match (&o.endpoint, &o.containerd_dir) {
        (Some(_), _) => None,
        (None, Some(d)) => Some(PrivateContainerd::start(d, o.keep)?),
        (None, None) => Some(PrivateContainerd::start(
            Path::new(&format!("/tmp/tl-bench.{}", std::process::id())),
            o.keep,
        )?),
    };
    let endpoint = match (&o.endpoint, &containerd) {
        (Some(e), _) => e.clone(),
        (None, Some(c)) => c.endpoint(),
        (None, None) => bail!("no containerd endpoint"),
    };

    let rt = Arc::new(
        RemoteRuntime::new(&endpoint, CALL_TIMEOUT)
            .with_context(|| format!("CRI client for {endpoint}"))?,
    );
    let version = rt
        .wait_ready(Duration::from_secs(30))
        .with_context(|| format!("waiting for {endpoint}"))?;
    let mut spec = api::ImageSpec::new();
    spec.image = BUSYBOX_IMAGE.to_string();
    let image = rt
        .image_status(&spec)
        .context("ImageStatus")?
        .ok_or_else(|| {
            anyhow!("{BUSYBOX_IMAGE} is not in the runtime; containerd-private.sh imports it")
        })?;
    let image_ref = if image.id.is_empty() {
        BUSYBOX_IMAGE.to_string()
    } else {
        image.id.clone()
    };

    if o.restarts_only {
        let pods = if o.quick { 3 } else { 10 };
        let r = runtime_cost::crash_to_restart(&rt, &bin, &endpoint, &work.join("crash"), pods);
        if let Ok(l) = &r {
            println!(
                "binary {}, load average {load_before} before the run",
                bin.display()
            );
            runtime_cost::print_restarts(l);
        }
        drop(containerd);
        remove_work(o, &work);
        return r.map(|_| ());
    }
    let cluster_plan = cluster::ClusterPlan::new(o.quick, o.max_pods);
    if o.cluster_only {
        let r = cluster::run(&rt, &bin, &endpoint, &work.join("cluster"), &cluster_plan);
        if let Ok(r) = &r {
            println!();
            println!(
                "tinylet cluster benchmark: {} {}, {} CPUs, load average {load_before} before the run",
                version.runtime_name,
                version.runtime_version,
                std::thread::available_parallelism()
                    .map(|n| n.get())
                    .unwrap_or(0),
            );
            println!(
                "binary {} ({:.2} MiB)",
                bin.display(),
                bin_size as f64 / 1048576.0
            );
            cluster::print_report(r);
        }
        drop(containerd);
        remove_work(o, &work);
        return r.map(|_| ()).context("the cluster part");
    }

    let mut cases: Vec<CaseResult> = plan
        .cases
        .iter()
        .map(|&(n, _)| (n, false))
        .chain(plan.host_cases.iter().map(|&(n, _)| (n, true)))
        .map(|(n, host)| CaseResult {
            n,
            host,
            floor: Vec::new(),
            floor_quiet: Vec::new(),
            tinylet: Vec::new(),
        })
        .collect();
    let runs: Vec<usize> = plan
        .cases
        .iter()
        .chain(&plan.host_cases)
        .map(|&(_, r)| r)
        .collect();

    // 1 and 2: the floor and tinylet, run after run in turn (floor without a
    // poller, floor with one, tinylet), so that drift in the machine's load
    // hits all three alike. tinylet idles during the floor runs.
    let ctd_pid = containerd.as_ref().and_then(|c| c.pid());
    let floor = Floor {
        rt: rt.clone(),
        ctd_pid,
        image_ref,
        logs_root: work.join("floor-logs"),
        root: work.join("floor-root"),
    };
    let tl_dir = work.join("tinylet");
    let mut t = Tinylet::start(&bin, &endpoint, &tl_dir)?;
    eprintln!(
        "pod_start: tinylet {} (pid {}) up; warm-up runs",
        bin.display(),
        t.pid()
    );
    floor.run(1, false, "w", true)?;
    tinylet_run(&rt, ctd_pid, &mut t, 1, false, "w")?;
    let mut cri_costs = None;
    for (ci, case) in cases.iter_mut().enumerate() {
        for r in 0..runs[ci] {
            let tag = format!("{}{}-{r}", if case.host { "h" } else { "c" }, case.n);
            for poll in [false, true] {
                let s = floor.run(
                    case.n,
                    case.host,
                    &format!("{tag}{}", if poll { "p" } else { "q" }),
                    poll,
                )?;
                eprintln!(
                    "pod_start: floor {} run {}{}: last StartContainer returned after {}{}; teardown {}",
                    case.label(),
                    r + 1,
                    if poll { ", polled" } else { "" },
                    fmt_ms(s.total),
                    s.observed
                        .map(|o| format!(", poll saw all running after {}", fmt_ms(o)))
                        .unwrap_or_default(),
                    fmt_ms(s.teardown)
                );
                if poll {
                    case.floor.push(s);
                } else {
                    case.floor_quiet.push(s);
                }
                // As after a tinylet run: let containerd finish cleaning up.
                std::thread::sleep(PAUSE);
            }
            let s = tinylet_run(&rt, ctd_pid, &mut t, case.n, case.host, &tag)?;
            eprintln!(
                "pod_start: tinylet {} run {}: first running {}, all running {}; all removed {}",
                case.label(),
                r + 1,
                fmt_ms(s.first_running),
                fmt_ms(s.all_running),
                fmt_ms(s.all_gone)
            );
            case.tinylet.push(s);
        }
        if case.n == 50 && !case.host && cri_costs.is_none() {
            cri_costs = Some(floor.cri_costs(50)?);
        }
    }
    let run_pid = t.pid();
    let run_rss = proc_status(run_pid).ok();
    let run_pods: usize = 1 + cases.iter().map(|c| c.n * c.tinylet.len()).sum::<usize>();
    drop(t);
    let tinylet_log = tl_dir.join("tinylet.log");
    eprintln!("pod_start: tinylet {run_pid} stopped");

    // 3. Footprint, with a fresh process.
    let (points, removed_all, costs) = if o.footprint {
        eprintln!(
            "pod_start: footprint: a fresh tinylet, {} s settling and {} s CPU windows",
            plan.settle.as_secs(),
            plan.cpu_window.as_secs()
        );
        footprint(
            &rt,
            &bin,
            &endpoint,
            &work.join("footprint"),
            &plan,
            o.max_pods,
            ctd_pid,
        )?
    } else {
        (Vec::new(), None, Vec::new())
    };

    // How soon a crashed container is replaced, with a fresh process.
    let restarts = if o.footprint {
        runtime_cost::crash_to_restart(
            &rt,
            &bin,
            &endpoint,
            &work.join("crash"),
            if o.quick { 3 } else { 10 },
        )?
    } else {
        Vec::new()
    };

    // 4. Probes on every pod, with a fresh process; its failure is
    // reported after the rest.
    let probed = if o.probe_pods > 0 && !o.cluster_only {
        eprintln!("pod_start: probe part, {} pods", o.probe_pods);
        Some(probes::run(
            &rt,
            &bin,
            &endpoint,
            &work.join("probes"),
            &plan,
            o.probe_pods,
            ctd_pid,
        ))
    } else {
        None
    };

    // 5. The cluster part; its failure is reported after the rest.
    let cluster = if o.cluster {
        eprintln!("pod_start: cluster part");
        Some(cluster::run(
            &rt,
            &bin,
            &endpoint,
            &work.join("cluster"),
            &cluster_plan,
        ))
    } else {
        None
    };

    let env = Env {
        runtime: format!("{} {}", version.runtime_name, version.runtime_version),
        cpus: std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(0),
        kernel: fs::read_to_string("/proc/sys/kernel/osrelease")
            .map(|s| s.trim().to_string())
            .unwrap_or_default(),
        load_before,
        bin,
        bin_size,
        cri_costs,
        run_rss,
        run_pods,
        tinylet_log: tinylet_log.clone(),
    };
    let log = read_log(&tinylet_log);
    print_report(&env, &cases, &points, removed_all, &log);
    runtime_cost::print_report(&costs);
    runtime_cost::print_restarts(&restarts);
    if let Some(Ok(r)) = &probed {
        let plain = points.iter().find(|p| p.pods == r.pods).map(|p| &p.mem);
        probes::print_report(r, plain);
    }
    if let Some(Ok(r)) = &cluster {
        cluster::print_report(r);
    }

    drop(containerd);
    remove_work(o, &work);
    if let Some(Err(e)) = probed {
        return Err(e.context("the probe part"));
    }
    match cluster {
        Some(Err(e)) => Err(e.context("the cluster part")),
        _ => Ok(()),
    }
}

/// Removes the work dir unless it is to be kept or was given.
fn remove_work(o: &Options, work: &Path) {
    if !o.keep && o.work_dir.is_none() {
        if let Err(e) = fs::remove_dir_all(work) {
            eprintln!("pod_start: cannot remove {}: {e}", work.display());
        }
    }
}

// ---- the report ------------------------------------------------------------------------

fn verdict(ok: bool) -> &'static str {
    if ok {
        "met"
    } else {
        "MISSED"
    }
}

fn print_report(
    env: &Env,
    cases: &[CaseResult],
    points: &[Point],
    removed_all: Option<f64>,
    log: &[LogLine],
) {
    let frow = |cols: [&str; 5]| {
        println!(
            "{:<30} {:<62} {:<9} {:<13} {}",
            cols[0], cols[1], cols[2], cols[3], cols[4]
        );
    };
    let row = |cols: [&str; 7]| {
        println!(
            "{:<30} {:<20} {:<20} {:<20} {:<9} {:<13} {}",
            cols[0], cols[1], cols[2], cols[3], cols[4], cols[5], cols[6]
        );
    };
    println!();
    println!(
        "tinylet pod start benchmark: {}, {} CPUs, kernel {}, load average {} before the run",
        env.runtime, env.cpus, env.kernel, env.load_before
    );
    println!("binary {}", env.bin.display());
    println!("Times: median [min-max] over the runs. Floor: the same pods started with CRI calls straight");
    println!(
        "from N threads. \"polled\": until a ListContainers poll (every {} ms for 1 pod, {} ms",
        poll_every(1).as_millis(),
        poll_every(2).as_millis()
    );
    println!(
        "otherwise) saw all N running, the way tinylet is measured; \"no poll\": until the last"
    );
    println!("StartContainer returned, with no poller loading containerd. Targets compare like with like.");
    println!();
    row([
        "start (all N running)",
        "floor, polled",
        "floor, no poll",
        "tinylet",
        "kubelet",
        "target",
        "verdict",
    ]);
    row([
        "---------------------",
        "-------------",
        "--------------",
        "-------",
        "-------",
        "------",
        "-------",
    ]);
    for c in cases {
        let f = c.floor_observed();
        let t = c.tinylet_all();
        let (fm, tm) = (median(&f), median(&t));
        let (kubelet, target, ok) = match (c.n, c.host) {
            (1, false) => (
                kubelet::START_1,
                "floor +20 ms".to_string(),
                Some(tm - fm <= 20.0),
            ),
            (20, false) => (
                kubelet::START_20,
                "floor +10%".to_string(),
                Some(tm <= fm * 1.10),
            ),
            (50, false) => (
                kubelet::START_50,
                "floor +15%".to_string(),
                Some(tm <= fm * 1.15),
            ),
            _ => ("-", "-".to_string(), None),
        };
        let over = if c.n == 1 {
            format!("{:+.0} ms", tm - fm)
        } else {
            format!("{:+.1}%", (tm / fm - 1.0) * 100.0)
        };
        row([
            &c.label(),
            &fmt_stat(&f),
            &fmt_stat(&c.floor_quiet()),
            &fmt_stat(&t),
            kubelet,
            &target,
            &match ok {
                Some(ok) => format!("{} ({over})", verdict(ok)),
                None => over,
            },
        ]);
    }
    println!();
    row([
        "stop, remove (all N gone)",
        "floor teardown",
        "",
        "tinylet",
        "kubelet",
        "",
        "",
    ]);
    row([
        "-------------------------",
        "--------------",
        "",
        "-------",
        "-------",
        "",
        "",
    ]);
    for c in cases {
        let kubelet = if c.n == 1 && !c.host {
            kubelet::REMOVE_1
        } else {
            "-"
        };
        row([
            &c.label(),
            &fmt_stat(&c.floor_teardowns()),
            "",
            &fmt_stat(&c.tinylet_gone()),
            kubelet,
            "",
            "",
        ]);
    }

    println!();
    frow(["footprint", "tinylet", "kubelet", "target", "verdict"]);
    frow(["---------", "-------", "-------", "------", "-------"]);
    let size_mib = env.bin_size as f64 / 1048576.0;
    frow([
        "binary size (stripped)",
        &format!("{size_mib:.2} MiB"),
        kubelet::BINARY,
        "< 10 MiB",
        verdict(size_mib < 10.0),
    ]);
    let point = |pods: usize| points.iter().find(|p| p.pods == pods);
    if let Some(p) = points.first() {
        let ok = (p.mem.rss as f64) < 8.0 * 1024.0;
        frow([
            "RSS idle, no pods",
            &p.mem.show(),
            kubelet::RSS_IDLE,
            "< 8 MiB",
            verdict(ok),
        ]);
    }
    for (pods, k) in [(10, kubelet::RSS_10), (50, kubelet::RSS_50)] {
        if let Some(p) = point(pods) {
            frow([&format!("RSS, {pods} pods"), &p.mem.show(), k, "", ""]);
        }
    }
    if let Some(p) = points.iter().rfind(|p| p.pods > 50) {
        let ok = (p.mem.rss as f64) < 25.0 * 1024.0;
        let target = if p.pods == 110 {
            "< 25 MiB"
        } else {
            "< 25 MiB at 110"
        };
        frow([
            &format!("RSS, {} pods", p.pods),
            &p.mem.show(),
            "-",
            target,
            verdict(ok),
        ]);
    }
    let idle_rss = points.first().map(|p| p.mem.rss as f64);
    let back = |p: &Point| idle_rss.is_some_and(|i| (p.mem.rss as f64) < i + 2.0 * 1024.0);
    if let Some(p) = points.iter().find(|p| p.after == "removed") {
        frow([
            "RSS 1 min after removing them all",
            &format!("{}, peak {}", p.mem.show(), mib(p.mem.hwm)),
            "-",
            "< idle + 2 MiB",
            verdict(back(p)),
        ]);
    }
    if let Some(p) = points.iter().find(|p| p.after == "hostile-reading") {
        frow([
            "RSS with the hostile corpus there",
            &format!("{}, peak {}", p.mem.show(), mib(p.mem.hwm)),
            "-",
            "",
            "",
        ]);
    }
    if let Some(p) = points.iter().find(|p| p.after == "hostile") {
        frow([
            "RSS 1 min after the hostile corpus went",
            &p.mem.show(),
            "-",
            "< idle + 2 MiB",
            verdict(back(p)),
        ]);
    }
    if let Some(m) = env.run_rss {
        frow([
            "RSS after the timed runs",
            &format!(
                "{}, peak {}, after {} pods",
                m.show(),
                mib(m.hwm),
                env.run_pods
            ),
            "-",
            "",
            "",
        ]);
    }
    for (pods, k) in [(0, "-"), (10, kubelet::CPU_10), (50, kubelet::CPU_50)] {
        if let Some(c) = point(pods).and_then(|p| p.cpu) {
            let what = if pods == 0 {
                "CPU idle (% of one core)".to_string()
            } else {
                format!("CPU, {pods} pods")
            };
            frow([&what, &format!("{c:.2}%"), k, "", ""]);
        }
    }
    let threads: Vec<String> = points
        .iter()
        .map(|p| format!("{}:{}", p.pods, p.mem.threads))
        .collect();
    frow(["threads (pods:threads)", &threads.join(" "), "-", "", ""]);
    if let Some(r) = removed_all {
        let n = points.iter().map(|p| p.pods).max().unwrap_or(0);
        frow([
            &format!("remove all {n} footprint pods"),
            &fmt_ms(r),
            "-",
            "",
            "",
        ]);
    }

    print_breakdown(env, cases, log);
}

/// Where tinylet's time went, from its own log (ms resolution).
fn print_breakdown(env: &Env, cases: &[CaseResult], log: &[LogLine]) {
    println!();
    println!(
        "where the time goes (from {} and the floor's per-call times)",
        env.tinylet_log.display()
    );
    if let Some(c) = env.cri_costs {
        let cpu = |x: Option<f64>| {
            x.map(|v| format!(", {v:.2} ms of containerd CPU"))
                .unwrap_or_default()
        };
        println!(
            "  with {} pods running: one ListContainers poll {:.2} ms round trip{}; one pod's status",
            c.pods,
            c.list_ms,
            cpu(c.list_cpu_ms)
        );
        println!(
            "  inspection (ListPodSandbox, PodSandboxStatus, ListContainers, ContainerStatus) {:.2} ms{}",
            c.inspect_ms,
            cpu(c.inspect_cpu_ms)
        );
    }
    for c in cases {
        let traces: Vec<Vec<PodTrace>> = c
            .tinylet
            .iter()
            .map(|s| {
                s.names
                    .iter()
                    .map(|n| trace_pod(log, n, s.w_start, s.w_remove))
                    .collect()
            })
            .collect();
        let all: Vec<&PodTrace> = traces.iter().flatten().collect();
        let vals = |f: &dyn Fn(&PodTrace) -> Option<f64>| {
            all.iter().filter_map(|t| f(t)).collect::<Vec<f64>>()
        };
        let per_run = |f: &dyn Fn(&[PodTrace]) -> Option<f64>| {
            traces.iter().filter_map(|t| f(t)).collect::<Vec<f64>>()
        };

        println!("  {}:", c.label());
        let floor_sb: Vec<f64> = c
            .floor
            .iter()
            .flat_map(|s| s.sandbox.iter().copied())
            .collect();
        let floor_cs: Vec<f64> = c
            .floor
            .iter()
            .flat_map(|s| s.create.iter().zip(&s.start).map(|(a, b)| a + b))
            .collect();
        let first_add = per_run(&|t| t.iter().filter_map(|p| p.add).min().map(|x| x as f64));
        let last_add = per_run(&|t| t.iter().filter_map(|p| p.add).max().map(|x| x as f64));
        let first_req = per_run(&|t| {
            t.iter()
                .filter_map(|p| p.sandbox_requested)
                .min()
                .map(|x| x as f64)
        });
        let last_req = per_run(&|t| {
            t.iter()
                .filter_map(|p| p.sandbox_requested)
                .max()
                .map(|x| x as f64)
        });
        let sb = vals(&|t| t.sandbox_ms);
        let cs = vals(&|t| Some((t.container_started? - t.sandbox_done?) as f64));
        let last_started = per_run(&|t| {
            t.iter()
                .filter_map(|p| p.container_started)
                .max()
                .map(|x| x as f64)
        });
        let seen_after = c
            .tinylet
            .iter()
            .zip(&last_started)
            .map(|(s, l)| s.all_running - l)
            .collect::<Vec<f64>>();
        let started_at: Vec<f64> = c.tinylet.iter().map(|s| s.last_started_at).collect();
        println!(
            "    rename -> SyncLoop ADD (file source, decode, merge): first {} / last {}",
            fmt_stat(&first_add),
            fmt_stat(&last_add)
        );
        println!(
            "    rename -> RunPodSandbox sent (worker, cache, config): first {} / last {}",
            fmt_stat(&first_req),
            fmt_stat(&last_req)
        );
        println!(
            "    RunPodSandbox per pod: tinylet {} vs floor {}",
            fmt_stat(&sb),
            fmt_stat(&floor_sb)
        );
        println!(
            "    sandbox ready -> container started (ImageStatus, CreateContainer, StartContainer): tinylet {} vs floor {}",
            fmt_stat(&cs),
            fmt_stat(&floor_cs)
        );
        println!(
            "    rename -> last container started: by tinylet's log {}, by CRI started_at {}; poll saw it {} later",
            fmt_stat(&last_started),
            fmt_stat(&started_at),
            fmt_stat(&seen_after)
        );
        let floor_cpu: Vec<f64> = c.floor.iter().filter_map(|s| s.cpu_containerd).collect();
        let quiet_cpu: Vec<f64> = c
            .floor_quiet
            .iter()
            .filter_map(|s| s.cpu_containerd)
            .collect();
        let ctd_cpu: Vec<f64> = c.tinylet.iter().filter_map(|s| s.cpu_containerd).collect();
        let tl_cpu: Vec<f64> = c.tinylet.iter().filter_map(|s| s.cpu_tinylet).collect();
        println!(
            "    CPU until all running: containerd {} under tinylet, {} for the floor polled, {} unpolled; tinylet itself {}",
            fmt_stat(&ctd_cpu),
            fmt_stat(&floor_cpu),
            fmt_stat(&quiet_cpu),
            fmt_stat(&tl_cpu)
        );
        let remove = per_run(&|t| t.iter().filter_map(|p| p.remove).max().map(|x| x as f64));
        let removed = per_run(&|t| t.iter().filter_map(|p| p.removed).max().map(|x| x as f64));
        println!(
            "    unlink -> SyncLoop REMOVE {} -> last \"terminated and removed\" {} (floor teardown {})",
            fmt_stat(&remove),
            fmt_stat(&removed),
            fmt_stat(&c.floor_teardowns())
        );
    }
    let warnings: Vec<&LogLine> = log
        .iter()
        .filter(|l| {
            l.msg.contains("took") && l.msg.contains("sync loop turn")
                || l.msg.contains("failed")
                || l.msg.contains("retrying")
        })
        .collect();
    if !warnings.is_empty() {
        println!(
            "  {} log lines about slow turns, failures or retries, e.g.:",
            warnings.len()
        );
        for l in warnings.iter().take(5) {
            println!("    {}", l.msg);
        }
    }
}
