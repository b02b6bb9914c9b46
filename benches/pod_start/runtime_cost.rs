//! The runtime's work tinylet causes: containerd's CPU with tinylet
//! running idle pods, and with tinylet stopped (SIGSTOP: the same pods, the
//! same containerd, no agent asking anything), in windows that take turns so
//! that drift in the machine's load hits both alike. What containerd spends
//! because of tinylet is the difference; beside it, tinylet's own CPU and
//! the two added up, against what the upstream kubelet v1.20.2 costs on the
//! same containerd with 50 idle pods (issue 29's side-by-side figures).

use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use super::{cpu_ticks, USER_HZ};

/// Upstream kubelet v1.20.2 with 50 idle pods on containerd 1.6, seconds of
/// CPU a minute (60 s windows, fresh runtime state for each agent): its own,
/// and what containerd spent beyond its no-agent figure.
pub(super) const KUBELET_OWN_50: f64 = 2.95;
pub(super) const KUBELET_RUNTIME_50: f64 = 0.59;
/// The targets: shares of the kubelet's figures.
const OWN_TARGET: f64 = 0.05;
const RUNTIME_TARGET: f64 = 0.10;
const WHOLE_TARGET: f64 = 0.10;

/// One measurement, in CPU seconds a minute.
pub(super) struct Cost {
    pub pods: usize,
    /// Total time measured in each state.
    pub window: Duration,
    pub own: f64,
    pub runtime_with: f64,
    pub runtime_without: f64,
}

impl Cost {
    fn caused(&self) -> f64 {
        (self.runtime_with - self.runtime_without).max(0.0)
    }
}

fn signal(pid: u32, sig: &str) -> Result<()> {
    let ok = Command::new("kill")
        .args([sig, &pid.to_string()])
        .status()
        .with_context(|| format!("kill {sig} {pid}"))?
        .success();
    if !ok {
        bail!("kill {sig} {pid} failed");
    }
    Ok(())
}

/// Measures `rounds` turns of `window` with tinylet `pid` running and then
/// stopped, containerd being `ctd`. Tinylet is running again on return.
pub(super) fn measure(
    pid: u32,
    ctd: u32,
    pods: usize,
    window: Duration,
    rounds: u32,
) -> Result<Cost> {
    let (mut own, mut with, mut without) = (0u64, 0u64, 0u64);
    let (mut t_with, mut t_without) = (Duration::ZERO, Duration::ZERO);
    for _ in 0..rounds {
        let (a0, c0, s0) = (cpu_ticks(pid)?, cpu_ticks(ctd)?, Instant::now());
        std::thread::sleep(window);
        let (a1, c1) = (cpu_ticks(pid)?, cpu_ticks(ctd)?);
        t_with += s0.elapsed();
        own += a1 - a0;
        with += c1 - c0;
        signal(pid, "-STOP")?;
        // Calls in flight end first.
        std::thread::sleep(Duration::from_millis(500));
        let (c0, s0) = (cpu_ticks(ctd)?, Instant::now());
        std::thread::sleep(window);
        let c1 = cpu_ticks(ctd)?;
        t_without += s0.elapsed();
        without += c1 - c0;
        signal(pid, "-CONT")?;
    }
    let per_min = |ticks: u64, t: Duration| ticks as f64 / USER_HZ * 60.0 / t.as_secs_f64();
    let cost = Cost {
        pods,
        window: t_with,
        own: per_min(own, t_with),
        runtime_with: per_min(with, t_with),
        runtime_without: per_min(without, t_without),
    };
    eprintln!(
        "pod_start: runtime cost with {pods} pods: tinylet {:.3} s/min, containerd {:.3} s/min with it, {:.3} without",
        cost.own, cost.runtime_with, cost.runtime_without
    );
    Ok(cost)
}

fn verdict(ok: bool) -> &'static str {
    if ok {
        "met"
    } else {
        "MISSED"
    }
}

pub(super) fn print_report(costs: &[Cost]) {
    if costs.is_empty() {
        return;
    }
    println!();
    println!(
        "Runtime cost, idle pods (CPU seconds a minute; containerd with tinylet running and with it stopped, {} s each)",
        costs[0].window.as_secs()
    );
    println!(
        "  {:>5}  {:>12}  {:>16}  {:>19}  {:>18}  {:>14}",
        "pods",
        "tinylet own",
        "containerd with",
        "containerd without",
        "caused by tinylet",
        "whole cost"
    );
    for c in costs {
        println!(
            "  {:>5}  {:>12.3}  {:>16.3}  {:>19.3}  {:>18.3}  {:>14.3}",
            c.pods,
            c.own,
            c.runtime_with,
            c.runtime_without,
            c.caused(),
            c.own + c.caused()
        );
    }
    if let Some(c) = costs.iter().find(|c| c.pods == 50) {
        let whole_k = KUBELET_OWN_50 + KUBELET_RUNTIME_50;
        let (own, caused, whole) = (
            c.own / KUBELET_OWN_50,
            c.caused() / KUBELET_RUNTIME_50,
            (c.own + c.caused()) / whole_k,
        );
        println!(
            "  50 pods against the kubelet (own {KUBELET_OWN_50}, containerd {KUBELET_RUNTIME_50}, whole {whole_k:.2} s/min):"
        );
        println!(
            "    tinylet own {own:.3}x (target <= {OWN_TARGET}x) {}; containerd caused {caused:.3}x (target <= {RUNTIME_TARGET}x) {}; whole {whole:.3}x (target <= {WHOLE_TARGET}x) {}",
            verdict(own <= OWN_TARGET),
            verdict(caused <= RUNTIME_TARGET),
            verdict(whole <= WHOLE_TARGET)
        );
    }
}

/// How long after a container's exit its replacement started, by the
/// runtime's own clock (the old container's `finishedAt` to the new one's
/// `startedAt`): the PLEG's notice, the sync and the start. Each of `pods`
/// pods runs a container that exits 1 after a few seconds (at staggered
/// times); its first restart has no back-off.
pub(super) fn crash_to_restart(
    rt: &tinylet::cri::RemoteRuntime,
    bin: &std::path::Path,
    endpoint: &str,
    dir: &std::path::Path,
    pods: usize,
) -> Result<Vec<f64>> {
    use tinylet::cri::RuntimeService;
    let mut t = super::Tinylet::start(bin, endpoint, dir)?;
    let names: Vec<String> = (0..pods).map(|i| format!("crash-{i}")).collect();
    for (i, name) in names.iter().enumerate() {
        // Exits at 3 s plus 0.37 s a pod, so that the exits do not meet.
        let ms = 3000 + 370 * i;
        let manifest = format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\nspec:\n  terminationGracePeriodSeconds: 0\n  \
             containers:\n  - name: {}\n    image: {}\n    imagePullPolicy: IfNotPresent\n    \
             command: [\"sh\", \"-c\", \"usleep {}; exit 1\"]\n",
            super::CONTAINER,
            super::BUSYBOX_IMAGE,
            ms * 1000
        );
        std::fs::write(t.manifests.join(format!("{name}.yaml")), manifest)
            .with_context(|| format!("writing the manifest of {name}"))?;
    }
    let deadline = Instant::now() + Duration::from_secs(60 + pods as u64);
    let mut latencies = Vec::new();
    let mut done = std::collections::HashSet::new();
    while done.len() < pods {
        if Instant::now() > deadline {
            bail!(
                "crash to restart: {} of {pods} pods restarted within the time",
                done.len()
            );
        }
        t.check_alive()?;
        std::thread::sleep(Duration::from_millis(200));
        for name in &names {
            if done.contains(name) {
                continue;
            }
            let full = super::full_name(name);
            let mut by_attempt = std::collections::BTreeMap::new();
            for c in rt.list_containers(None)? {
                if c.labels.get("io.kubernetes.pod.name") != Some(&full) {
                    continue;
                }
                let attempt = c.metadata.as_ref().map_or(0, |m| m.attempt);
                by_attempt.insert(attempt, rt.container_status(&c.id)?);
            }
            if let (Some(old), Some(new)) = (by_attempt.get(&0), by_attempt.get(&1)) {
                if old.finished_at > 0 && new.started_at > 0 {
                    latencies.push((new.started_at - old.finished_at) as f64 / 1e6);
                    done.insert(name.clone());
                }
            }
        }
    }
    for name in &names {
        let _ = std::fs::remove_file(t.manifests.join(format!("{name}.yaml")));
    }
    let full: std::collections::HashSet<String> =
        names.iter().map(|n| super::full_name(n)).collect();
    super::wait_gone(
        rt,
        &full,
        Instant::now(),
        Duration::from_millis(100),
        Duration::from_secs(120),
    )
    .context("crash to restart: removing the pods")?;
    latencies.sort_by(f64::total_cmp);
    eprintln!(
        "pod_start: crash to restart, {pods} pods: median {:.0} ms [{:.0}-{:.0}]",
        super::median(&latencies),
        latencies.first().copied().unwrap_or(0.0),
        latencies.last().copied().unwrap_or(0.0)
    );
    Ok(latencies)
}

pub(super) fn print_restarts(latencies: &[f64]) {
    if latencies.is_empty() {
        return;
    }
    println!(
        "Crash to restart (old container's finishedAt to the new one's startedAt, {} pods): median {:.0} ms, min {:.0}, max {:.0}",
        latencies.len(),
        super::median(latencies),
        latencies[0],
        latencies[latencies.len() - 1]
    );
}
