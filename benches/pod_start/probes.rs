//! The probe part of the pod start benchmark: a fresh tinylet running N
//! static pods (110 by default), each with an httpGet liveness probe (busybox
//! `httpd` in the pod) and an exec readiness probe, at the API's default
//! period (10 s) and timeout (1 s). It reports tinylet's RSS, its threads
//! (and how many of them are the prober's) and the CPU tinylet and
//! containerd use while the probes run, beside the footprint part's numbers
//! for the same number of pods without probes.

use std::collections::HashSet;
use std::fs;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

use super::{
    full_name, mib, proc_status, wait_gone, wait_running, CpuMeter, Mem, Plan, Tinylet,
    BUSYBOX_IMAGE, CONTAINER, GRACE_SECS,
};
use tinylet::cri::RemoteRuntime;

/// Serves /www over HTTP on 8080, is ready once /tmp/ready exists, and
/// exits at once on SIGTERM.
const SCRIPT: &str = "mkdir -p /www && echo ok > /www/healthz && touch /tmp/ready && \
                      httpd -p 8080 -h /www; trap 'exit 0' TERM; sleep 3600 & wait";
/// The probes' period (the API default): the settle time adds one, so that
/// every probe has run before anything is measured.
const PERIOD: Duration = Duration::from_secs(10);

pub(super) struct ProbeResult {
    pub pods: usize,
    pub mem: Mem,
    /// Threads named `prober` or `probe-runner/N`.
    pub prober_threads: usize,
    /// CPU over the window, % of one core: tinylet, containerd.
    pub cpu_tinylet: Option<f64>,
    pub cpu_containerd: Option<f64>,
    pub window: Duration,
    /// Containers restarted by a failed liveness probe (the log's count).
    pub restarts: usize,
    /// RSS (KiB) that one thread per probe would add at least: as many
    /// parked threads as probes, started the way tinylet starts threads,
    /// measured in this process.
    pub thread_per_probe: Option<u64>,
}

fn manifest(name: &str) -> String {
    format!(
        r#"apiVersion: v1
kind: Pod
metadata:
  name: {name}
  labels:
    app: pod-start-bench
spec:
  terminationGracePeriodSeconds: {GRACE_SECS}
  containers:
  - name: {CONTAINER}
    image: {BUSYBOX_IMAGE}
    imagePullPolicy: IfNotPresent
    command: ["sh", "-c", {SCRIPT:?}]
    livenessProbe:
      httpGet:
        path: /healthz
        port: 8080
    readinessProbe:
      exec:
        command: ["cat", "/tmp/ready"]
"#
    )
}

/// What `n` more threads cost in RSS (KiB), at least: started like
/// tinylet's (named, 256 KiB stacks), each allocating a little and then
/// parked, in this process with tinylet's malloc arena limit.
fn thread_cost(n: usize) -> Result<u64> {
    tinylet::malloc::limit_arenas();
    let rss = || proc_status(std::process::id()).map(|m| m.rss);
    let before = rss()?;
    let (stop_tx, stop_rx) = crossbeam_channel::bounded::<()>(0);
    let barrier = std::sync::Arc::new(std::sync::Barrier::new(n + 1));
    let mut threads = Vec::with_capacity(n);
    for i in 0..n {
        let stop = stop_rx.clone();
        let barrier = barrier.clone();
        threads.push(tinylet::thread::spawn_named(
            format!("probe-{i}"),
            move || {
                let buf = vec![i as u8; 4096];
                std::hint::black_box(&buf);
                drop(buf);
                barrier.wait();
                let _ = stop.recv();
            },
        )?);
    }
    barrier.wait();
    let after = rss()?;
    drop(stop_tx);
    drop(threads);
    Ok(after.saturating_sub(before))
}

/// How many threads of `pid` are the prober's (by name).
fn prober_threads(pid: u32) -> usize {
    let Ok(tasks) = fs::read_dir(format!("/proc/{pid}/task")) else {
        return 0;
    };
    tasks
        .flatten()
        .filter_map(|t| fs::read_to_string(t.path().join("comm")).ok())
        .filter(|n| n.starts_with("prober") || n.starts_with("probe-runner"))
        .count()
}

pub(super) fn run(
    rt: &RemoteRuntime,
    bin: &Path,
    endpoint: &str,
    dir: &Path,
    plan: &Plan,
    pods: usize,
    ctd_pid: Option<u32>,
) -> Result<ProbeResult> {
    let mut t = Tinylet::start(bin, endpoint, dir)?;
    let names: Vec<String> = (0..pods).map(|i| format!("probed-{i}")).collect();
    for name in &names {
        let dot = t.manifests.join(format!(".{name}.yaml"));
        fs::write(&dot, manifest(name)).with_context(|| format!("writing {}", dot.display()))?;
    }
    let t0 = Instant::now();
    for name in &names {
        let dot = t.manifests.join(format!(".{name}.yaml"));
        let target = t.manifests.join(format!("{name}.yaml"));
        fs::rename(&dot, &target).with_context(|| format!("renaming {}", dot.display()))?;
    }
    let full: HashSet<String> = names.iter().map(|n| full_name(n)).collect();
    let waited = wait_running(
        rt,
        &full,
        t0,
        Duration::from_millis(50),
        Duration::from_secs(60 + 2 * pods as u64),
    );
    t.check_alive()?;
    let (_, all, _) = waited.context("probes: starting the probed pods")?;
    eprintln!(
        "pod_start: probes: {pods} probed pods running ({:.2} s)",
        all.as_secs_f64()
    );
    std::thread::sleep(plan.settle + PERIOD);
    t.check_alive()?;
    let mem = proc_status(t.pid())?;
    let prober = prober_threads(t.pid());
    // At least two probe periods, so that the window holds whole rounds.
    let window = plan.cpu_window.max(2 * PERIOD);
    let meter = CpuMeter::start(&[Some(t.pid()), ctd_pid]);
    let started = Instant::now();
    std::thread::sleep(window);
    let used = meter.read();
    let secs = started.elapsed().as_secs_f64();
    let pct = |ms: Option<f64>| ms.map(|m| m / 10.0 / secs);
    let log = fs::read_to_string(&t.log).unwrap_or_default();
    let result = ProbeResult {
        pods,
        mem,
        prober_threads: prober,
        cpu_tinylet: pct(used.first().copied().flatten()),
        cpu_containerd: pct(used.get(1).copied().flatten()),
        window,
        restarts: log.matches("failed liveness probe").count(),
        thread_per_probe: thread_cost(2 * pods)
            .map_err(|e| eprintln!("pod_start: probes: thread cost: {e:#}"))
            .ok(),
    };
    eprintln!(
        "pod_start: probes: {pods} pods with 2 probes each: RSS {}, {} threads ({} prober), CPU {}",
        result.mem.show(),
        result.mem.threads,
        result.prober_threads,
        result
            .cpu_tinylet
            .map(|c| format!("{c:.2}%"))
            .unwrap_or_else(|| "?".into())
    );
    let t1 = Instant::now();
    for name in &names {
        let p = t.manifests.join(format!("{name}.yaml"));
        fs::remove_file(&p).with_context(|| format!("removing {}", p.display()))?;
    }
    let gone = wait_gone(
        rt,
        &full,
        t1,
        Duration::from_millis(50),
        Duration::from_secs(120 + pods as u64),
    );
    t.check_alive()?;
    gone.context("probes: removing the probed pods")?;
    Ok(result)
}

/// The probe lines of the report; `plain` is the footprint part's RSS and
/// threads with as many pods and no probes, when it ran.
pub(super) fn print_report(r: &ProbeResult, plain: Option<&Mem>) {
    println!();
    println!(
        "Probes: {} pods, each with an httpGet liveness and an exec readiness probe (period 10 s);",
        r.pods
    );
    println!(
        "one prober thread with a timer heap and probe-runner threads as the runs need them (ending after a minute idle), not one per probe."
    );
    let row = |a: &str, b: String, c: &str, d: &str| {
        println!("{a:<30} {b:<62} {c:<13} {d}");
    };
    row("", "tinylet".into(), "target", "");
    let ok = (r.mem.rss as f64) < 25.0 * 1024.0;
    row(
        &format!("RSS, {} probed pods", r.pods),
        format!("{}, peak {}", r.mem.show(), mib(r.mem.hwm)),
        "< 25 MiB",
        super::verdict(ok),
    );
    if let Some(p) = plain {
        let delta = r.mem.rss as i64 - p.rss as i64;
        row(
            "  the same pods without probes",
            format!(
                "{} ({:+.1} MiB with probes)",
                p.show(),
                delta as f64 / 1024.0
            ),
            "",
            "",
        );
    }
    row(
        "threads",
        format!(
            "{} ({} of them the prober's{})",
            r.mem.threads,
            r.prober_threads,
            plain
                .map(|p| format!("; {} without probes", p.threads))
                .unwrap_or_default()
        ),
        "",
        "",
    );
    if let Some(kib) = r.thread_per_probe {
        row(
            "a thread per probe instead",
            format!(
                "at least +{} for {} parked threads (measured in the bench process)",
                mib(kib),
                r.pods * 2
            ),
            "",
            "",
        );
    }
    let pct = |c: Option<f64>| c.map(|c| format!("{c:.2}%")).unwrap_or_else(|| "?".into());
    row(
        &format!("CPU over {} s (% of one core)", r.window.as_secs()),
        format!(
            "tinylet {}, containerd {} ({} probe runs/s)",
            pct(r.cpu_tinylet),
            pct(r.cpu_containerd),
            r.pods * 2 / PERIOD.as_secs() as usize
        ),
        "",
        "",
    );
    row(
        "liveness restarts",
        format!("{} (0 expected: every probe passes)", r.restarts),
        "",
        "",
    );
}
