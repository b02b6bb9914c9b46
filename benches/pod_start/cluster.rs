//! The cluster part of the pod start benchmark: tinylet joined to the fake
//! apiserver of the integration tests (plain HTTP, a bearer token for
//! `system:node:edge-1`) as an API-only node, against the bench's
//! containerd. It measures the footprint of a connected node idle and with
//! 110 API pods, the requests an idle node sends (a node must not poll:
//! watches, the lease, and node status only when it changed), and how long
//! an API pod takes from its creation (the ADDED watch event goes out at
//! once) to its containers running and to the Running status patch, and
//! how long a pod that fills its emptyDir past `sizeLimit` runs before
//! the eviction manager stops it and reports it Failed/Evicted.

use std::collections::{BTreeMap, HashSet};
use std::ffi::OsStr;
use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use serde_json::{json, Value};

use super::fake_apiserver::{FakeApiServer, KubeconfigAuth, RecordedRequest};
use super::{
    cpu_ticks, fmt_ms, fmt_stat, mib, ms, proc_status, running, sandboxes_left, verdict, Mem,
    Tinylet, BUSYBOX_IMAGE, CONTAINER, GRACE_SECS, NAMESPACE, PAUSE, SCRIPT, USER_HZ,
};
use tinylet::cri::RemoteRuntime;

const NODE: &str = "edge-1";
const LEASE_PATH: &str = "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/";
/// tinylet's default lease duration; renewed every quarter of it.
const LEASE_SECS: f64 = 40.0;
const MANY: usize = 110;

/// How long the cluster part idles and how many single pods it starts.
pub(super) struct ClusterPlan {
    pub settle: Duration,
    pub idle_window: Duration,
    pub runs: usize,
    pub many: usize,
}

impl ClusterPlan {
    pub fn new(quick: bool, max_pods: usize) -> ClusterPlan {
        let many = max_pods.min(MANY);
        if quick {
            ClusterPlan {
                settle: Duration::from_secs(5),
                idle_window: Duration::from_secs(20),
                runs: 3,
                many,
            }
        } else {
            ClusterPlan {
                settle: Duration::from_secs(10),
                idle_window: Duration::from_secs(60),
                runs: 5,
                many,
            }
        }
    }
}

/// Requests of one kind: how many, and their bodies' bytes.
#[derive(Default, Clone, Copy)]
pub(super) struct Tally {
    count: usize,
    bytes: usize,
}

/// What the cluster part measured.
pub(super) struct ClusterResult {
    /// From tinylet's start until the Node was Ready, the lease existed and
    /// the pod watch was open.
    joined: f64,
    idle: Mem,
    idle_cpu: Option<f64>,
    window: Duration,
    /// Requests sent during the idle window, by kind.
    idle_requests: BTreeMap<String, Tally>,
    /// Per pod, ms from its creation.
    to_running: Vec<f64>,
    to_status: Vec<f64>,
    /// ms from the containers running to the Running status patch.
    status_lag: Vec<f64>,
    /// ms from the deletion (graceful) until the object and sandbox were gone.
    to_gone: Vec<f64>,
    /// Requests tinylet sent for one pod, from its creation until it was gone.
    requests_per_pod: Vec<f64>,
    many: Option<ManyResult>,
    eviction: Option<EvictionResult>,
    log: PathBuf,
}

/// A pod over its emptyDir's `sizeLimit`: ms from its container running
/// (it fills the volume at once) to the Failed/Evicted status patch, and
/// on to its containers gone.
pub(super) struct EvictionResult {
    to_evicted: f64,
    to_stopped: f64,
    message: String,
}

pub(super) struct ManyResult {
    pods: usize,
    all_running: f64,
    all_status: f64,
    mem: Mem,
    all_gone: f64,
    after: Mem,
    status_patches: usize,
}

fn kind(r: &RecordedRequest) -> String {
    let watch = r
        .query
        .split('&')
        .any(|kv| kv == "watch=true" || kv == "watch=1");
    if watch {
        format!("watch {}", r.path)
    } else if matches!(r.verb.as_str(), "PATCH" | "PUT") && r.path.starts_with(LEASE_PATH) {
        "lease renewal".into()
    } else if r.verb == "PATCH" && r.path == format!("/api/v1/nodes/{NODE}/status") {
        "node status PATCH".into()
    } else if r.verb == "PATCH" && r.path.starts_with("/api/v1/namespaces/") {
        "pod status PATCH".into()
    } else {
        format!("other: {} {}", r.verb, r.path)
    }
}

fn tally(requests: &[RecordedRequest]) -> BTreeMap<String, Tally> {
    let mut out: BTreeMap<String, Tally> = BTreeMap::new();
    for r in requests {
        let t = out.entry(kind(r)).or_default();
        t.count += 1;
        t.bytes += r.body.len();
    }
    out
}

/// The pod the API runs: the bench's busybox sleeper, bound to the node.
fn api_pod(name: &str) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": NAMESPACE,
            "labels": {"app": "pod-start-bench"},
        },
        "spec": {
            "nodeName": NODE,
            "automountServiceAccountToken": false,
            "terminationGracePeriodSeconds": GRACE_SECS,
            "containers": [{
                "name": CONTAINER,
                "image": BUSYBOX_IMAGE,
                "imagePullPolicy": "IfNotPresent",
                "command": ["sh", "-c", SCRIPT],
            }],
        },
    })
}

fn phase(pod: &Value) -> &str {
    pod["status"]["phase"].as_str().unwrap_or("")
}

fn node_ready(fake: &FakeApiServer) -> bool {
    fake.node(NODE).is_some_and(|n| {
        n["status"]["conditions"].as_array().is_some_and(|cs| {
            cs.iter()
                .any(|c| c["type"] == "Ready" && c["status"] == "True")
        })
    })
}

fn pods_watch_open(fake: &FakeApiServer) -> bool {
    fake.requests().iter().any(|r| {
        r.verb == "GET" && r.path == "/api/v1/pods" && r.query.contains("watch=") && r.status == 200
    })
}

/// The time of the first status patch of `name` that says Running.
fn running_patch(fake: &FakeApiServer, name: &str) -> Option<Instant> {
    let path = format!("/api/v1/namespaces/{NAMESPACE}/pods/{name}/status");
    fake.requests()
        .iter()
        .filter(|r| r.verb == "PATCH" && r.path == path && (200..300).contains(&r.status))
        .find(|r| {
            serde_json::from_str::<Value>(&r.body).is_ok_and(|b| b["status"]["phase"] == "Running")
        })
        .map(|r| r.at)
}

fn sample(t: &mut Tinylet, what: &str) -> Result<Mem> {
    t.check_alive()?;
    let mem = proc_status(t.pid())?;
    eprintln!(
        "pod_start: cluster: {what}: RSS {}, peak {}, {} threads",
        mem.show(),
        mib(mem.hwm),
        mem.threads
    );
    Ok(mem)
}

/// Waits until `done` or `within` passed; checks tinylet is alive meanwhile.
fn wait_for(
    t: &mut Tinylet,
    what: &str,
    every: Duration,
    within: Duration,
    mut done: impl FnMut() -> Result<bool>,
) -> Result<Duration> {
    let t0 = Instant::now();
    loop {
        if done()? {
            return Ok(t0.elapsed());
        }
        t.check_alive()?;
        if t0.elapsed() > within {
            bail!("{what}: not within {} s", within.as_secs());
        }
        std::thread::sleep(every);
    }
}

pub(super) fn run(
    rt: &RemoteRuntime,
    bin: &Path,
    endpoint: &str,
    dir: &Path,
    plan: &ClusterPlan,
) -> Result<ClusterResult> {
    fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let fake = FakeApiServer::start();
    let kubeconfig =
        fake.write_kubeconfig(dir, &format!("system:node:{NODE}"), KubeconfigAuth::token());
    eprintln!(
        "pod_start: cluster: fake apiserver at {}, tinylet joins as {NODE}",
        fake.url()
    );
    let started = Instant::now();
    let mut t = Tinylet::start_with(
        bin,
        endpoint,
        dir,
        NODE,
        false,
        &[OsStr::new("--kubeconfig"), kubeconfig.as_os_str()],
    )?;
    wait_for(
        &mut t,
        "Node Ready, lease and pod watch",
        Duration::from_millis(20),
        Duration::from_secs(60),
        || Ok(node_ready(&fake) && fake.lease(NODE).is_some() && pods_watch_open(&fake)),
    )?;
    let joined = ms(started.elapsed());
    eprintln!(
        "pod_start: cluster: Node Ready, lease and pod watch after {}; idling {} s, then a {} s window",
        fmt_ms(joined),
        plan.settle.as_secs(),
        plan.idle_window.as_secs()
    );

    // Idle, connected.
    std::thread::sleep(plan.settle);
    t.check_alive()?;
    fake.clear_requests();
    let c0 = cpu_ticks(t.pid()).ok();
    let w0 = Instant::now();
    std::thread::sleep(plan.idle_window);
    let window = w0.elapsed();
    let c1 = cpu_ticks(t.pid()).ok();
    let idle_cpu = c0
        .zip(c1)
        .map(|(a, b)| b.saturating_sub(a) as f64 / USER_HZ / window.as_secs_f64() * 100.0);
    let idle_requests = tally(&fake.requests());
    let idle = sample(&mut t, "connected, idle")?;

    // Single API pods, one after the other.
    let mut r = ClusterResult {
        joined,
        idle,
        idle_cpu,
        window,
        idle_requests,
        to_running: Vec::new(),
        to_status: Vec::new(),
        status_lag: Vec::new(),
        to_gone: Vec::new(),
        requests_per_pod: Vec::new(),
        many: None,
        eviction: None,
        log: dir.join("tinylet.log"),
    };
    for i in 0..plan.runs {
        let name = format!("api-{i}");
        let names: HashSet<String> = HashSet::from([name.clone()]);
        // A short log to scan while polling.
        fake.clear_requests();
        let t0 = Instant::now();
        fake.create_pod(api_pod(&name));
        let mut seen_running = None;
        let mut seen_status = None;
        wait_for(
            &mut t,
            &format!("API pod {name} running with a Running status"),
            Duration::from_millis(2),
            Duration::from_secs(60),
            || {
                if seen_running.is_none() && !running(rt, &names)?.is_empty() {
                    seen_running = Some(Instant::now());
                }
                if seen_status.is_none() {
                    seen_status = running_patch(&fake, &name);
                }
                Ok(seen_running.is_some() && seen_status.is_some())
            },
        )?;
        let (run_at, status_at) = seen_running
            .zip(seen_status)
            .ok_or_else(|| anyhow!("API pod {name}: no running or status time"))?;
        let to_running = ms(run_at - t0);
        let to_status = ms(status_at.saturating_duration_since(t0));
        // Let it settle, as the static pod runs do, then delete it gracefully.
        std::thread::sleep(super::SETTLE_BEFORE_REMOVAL);
        let d0 = Instant::now();
        fake.delete_pod(NAMESPACE, &name, None)
            .ok_or_else(|| anyhow!("API pod {name} vanished before its deletion"))?;
        wait_for(
            &mut t,
            &format!("API pod {name} deleted and its sandbox removed"),
            Duration::from_millis(5),
            Duration::from_secs(60),
            || Ok(fake.pod(NAMESPACE, &name).is_none() && sandboxes_left(rt, &names)? == 0),
        )?;
        let gone = ms(d0.elapsed());
        let sent = fake.requests().len();
        eprintln!(
            "pod_start: cluster: API pod {name}: containers running {}, Running status {} after its creation; deleted and gone in {}; {sent} requests",
            fmt_ms(to_running),
            fmt_ms(to_status),
            fmt_ms(gone)
        );
        r.to_running.push(to_running);
        r.to_status.push(to_status);
        r.status_lag.push(to_status - to_running);
        r.to_gone.push(gone);
        r.requests_per_pod.push(sent as f64);
        std::thread::sleep(PAUSE);
    }

    r.eviction = Some(eviction(rt, &fake, &mut t)?);
    if plan.many > 0 {
        r.many = Some(many(rt, &fake, &mut t, plan)?);
    }
    t.stop();
    Ok(r)
}

/// One API pod that writes 4 MiB into an emptyDir limited to 1 MiB.
fn eviction(rt: &RemoteRuntime, fake: &FakeApiServer, t: &mut Tinylet) -> Result<EvictionResult> {
    let name = "hog";
    let names: HashSet<String> = HashSet::from([name.to_string()]);
    let mut pod = api_pod(name);
    pod["spec"]["volumes"] = json!([{"name": "scratch", "emptyDir": {"sizeLimit": "1Mi"}}]);
    pod["spec"]["containers"][0]["command"] = json!([
        "sh",
        "-c",
        "dd if=/dev/zero of=/scratch/fill bs=1M count=4 2>/dev/null; exec sleep 3600"
    ]);
    pod["spec"]["containers"][0]["volumeMounts"] =
        json!([{"name": "scratch", "mountPath": "/scratch"}]);
    fake.create_pod(pod);
    let mut ran = None;
    wait_for(
        t,
        "the eviction pod running",
        Duration::from_millis(5),
        Duration::from_secs(60),
        || {
            ran = (!running(rt, &names)?.is_empty()).then(Instant::now);
            Ok(ran.is_some())
        },
    )?;
    let ran = ran.ok_or_else(|| anyhow!("pod {name}: no running time"))?;
    let evicted_patch = || {
        let path = format!("/api/v1/namespaces/{NAMESPACE}/pods/{name}/status");
        fake.requests()
            .iter()
            .filter(|r| r.verb == "PATCH" && r.path == path && (200..300).contains(&r.status))
            .find(|r| {
                serde_json::from_str::<Value>(&r.body).is_ok_and(|b| {
                    b["status"]["phase"] == "Failed" && b["status"]["reason"] == "Evicted"
                })
            })
            .map(|r| r.at)
    };
    let mut evicted = None;
    wait_for(
        t,
        "the pod over its emptyDir sizeLimit reported Failed/Evicted",
        Duration::from_millis(20),
        Duration::from_secs(60),
        || {
            evicted = evicted_patch();
            Ok(evicted.is_some())
        },
    )?;
    wait_for(
        t,
        "the evicted pod's containers stopped",
        Duration::from_millis(20),
        Duration::from_secs(60),
        || Ok(running(rt, &names)?.is_empty()),
    )?;
    let stopped = Instant::now();
    let evicted = evicted.ok_or_else(|| anyhow!("pod {name}: no eviction time"))?;
    let message = fake
        .pod(NAMESPACE, name)
        .and_then(|p| p["status"]["message"].as_str().map(str::to_string))
        .unwrap_or_default();
    let r = EvictionResult {
        to_evicted: ms(evicted.saturating_duration_since(ran)),
        to_stopped: ms(stopped.saturating_duration_since(ran)),
        message,
    };
    eprintln!(
        "pod_start: cluster: pod {name} over its emptyDir sizeLimit: Failed/Evicted {} after its container ran, stopped by {} ({})",
        fmt_ms(r.to_evicted),
        fmt_ms(r.to_stopped),
        r.message
    );
    fake.delete_pod(NAMESPACE, name, None);
    wait_for(
        t,
        "the evicted pod deleted and its sandbox removed",
        Duration::from_millis(20),
        Duration::from_secs(60),
        || Ok(fake.pod(NAMESPACE, name).is_none() && sandboxes_left(rt, &names)? == 0),
    )?;
    Ok(r)
}

/// `plan.many` API pods at once: until all run and report Running, the
/// footprint then, and after deleting them all.
fn many(
    rt: &RemoteRuntime,
    fake: &FakeApiServer,
    t: &mut Tinylet,
    plan: &ClusterPlan,
) -> Result<ManyResult> {
    let n = plan.many;
    let names: Vec<String> = (0..n).map(|i| format!("many-{i}")).collect();
    let set: HashSet<String> = names.iter().cloned().collect();
    fake.clear_requests();
    let t0 = Instant::now();
    for name in &names {
        fake.create_pod(api_pod(name));
    }
    let within = Duration::from_secs(60 + 2 * n as u64);
    let mut all_running = None;
    wait_for(
        t,
        &format!("{n} API pods running with a Running status"),
        Duration::from_millis(50),
        within,
        || {
            if all_running.is_none() && running(rt, &set)?.len() == n {
                all_running = Some(t0.elapsed());
            }
            let reported = fake
                .pods()
                .iter()
                .filter(|p| {
                    p["metadata"]["name"]
                        .as_str()
                        .is_some_and(|m| set.contains(m))
                        && phase(p) == "Running"
                })
                .count();
            Ok(all_running.is_some() && reported == n)
        },
    )?;
    let all_status = ms(t0.elapsed());
    let all_running = all_running.map(ms).unwrap_or(all_status);
    let status_patches = fake
        .requests()
        .iter()
        .filter(|r| kind(r) == "pod status PATCH")
        .count();
    eprintln!(
        "pod_start: cluster: {n} API pods: all running after {}, all Running in the API after {} ({status_patches} status patches)",
        fmt_ms(all_running),
        fmt_ms(all_status)
    );
    std::thread::sleep(plan.settle);
    let mem = sample(t, &format!("{n} API pods"))?;

    let d0 = Instant::now();
    for name in &names {
        fake.delete_pod(NAMESPACE, name, None);
    }
    wait_for(
        t,
        &format!("{n} API pods deleted and their sandboxes removed"),
        Duration::from_millis(50),
        Duration::from_secs(120 + n as u64),
        || {
            let left = fake
                .pods()
                .iter()
                .filter(|p| {
                    p["metadata"]["name"]
                        .as_str()
                        .is_some_and(|m| set.contains(m))
                })
                .count();
            Ok(left == 0 && sandboxes_left(rt, &set)? == 0)
        },
    )?;
    let all_gone = ms(d0.elapsed());
    eprintln!(
        "pod_start: cluster: {n} API pods deleted and gone after {}",
        fmt_ms(all_gone)
    );
    // Memory that comes back: a minute after the last pod went.
    std::thread::sleep(super::RETURN_WINDOW);
    let after = sample(t, "a minute after deleting them all")?;
    Ok(ManyResult {
        pods: n,
        all_running,
        all_status,
        mem,
        all_gone,
        after,
        status_patches,
    })
}

pub(super) fn print_report(r: &ClusterResult) {
    let frow = |cols: [&str; 4]| {
        println!(
            "{:<40} {:<62} {:<16} {}",
            cols[0], cols[1], cols[2], cols[3]
        );
    };
    let minutes = r.window.as_secs_f64() / 60.0;
    let per_min = |x: usize| x as f64 / minutes;
    println!();
    println!(
        "cluster: tinylet as node {NODE} of the fake apiserver (HTTP, token), API pods only; log {}",
        r.log.display()
    );
    frow(["cluster", "tinylet", "target", "verdict"]);
    frow(["-------", "-------", "------", "-------"]);
    frow([
        "start -> Node Ready, lease, pod watch",
        &fmt_ms(r.joined),
        "",
        "",
    ]);
    let idle_ok = (r.idle.rss as f64) < 10.0 * 1024.0;
    frow([
        "RSS connected, idle",
        &r.idle.show(),
        "< 10 MiB",
        verdict(idle_ok),
    ]);
    frow([
        "threads connected, idle",
        &r.idle.threads.to_string(),
        "",
        "",
    ]);
    if let Some(c) = r.idle_cpu {
        frow([
            "CPU connected, idle (% of one core)",
            &format!("{c:.2}%"),
            "",
            "",
        ]);
    }
    let get = |k: &str| r.idle_requests.get(k).copied().unwrap_or_default();
    let total: usize = r.idle_requests.values().map(|t| t.count).sum();
    let bytes: usize = r.idle_requests.values().map(|t| t.bytes).sum();
    let watches: usize = r
        .idle_requests
        .iter()
        .filter(|(k, _)| k.starts_with("watch "))
        .map(|(_, t)| t.count)
        .sum();
    let others: usize = r
        .idle_requests
        .iter()
        .filter(|(k, _)| k.starts_with("other: "))
        .map(|(_, t)| t.count)
        .sum();
    let lease = get("lease renewal");
    let node = get("node status PATCH");
    // Not polling: lease renewals at their period, no reads, and node status
    // only when it changed (at most one report in a window).
    let lease_max = (r.window.as_secs_f64() / (LEASE_SECS / 4.0)).ceil() as usize + 1;
    let no_poll = lease.count <= lease_max && others == 0 && node.count <= 1;
    frow([
        &format!("API requests/min idle ({} s window)", r.window.as_secs()),
        &format!(
            "{:.1} (lease renewal {:.1}, node status PATCH {:.1}, watch {:.1}, other {:.1})",
            per_min(total),
            per_min(lease.count),
            per_min(node.count),
            per_min(watches),
            per_min(others)
        ),
        &format!("~{:.0} (lease)", 60.0 / (LEASE_SECS / 4.0)),
        &format!("{} (no polling)", verdict(no_poll)),
    ]);
    frow([
        "API request bytes/min idle (bodies)",
        &format!(
            "{:.0} B (lease {:.0}, node status {:.0})",
            per_min(bytes),
            per_min(lease.bytes),
            per_min(node.bytes)
        ),
        "",
        "",
    ]);
    frow([
        "API pod: created -> containers running",
        &fmt_stat(&r.to_running),
        "",
        "",
    ]);
    frow([
        "API pod: created -> Running status PATCH",
        &fmt_stat(&r.to_status),
        "",
        "",
    ]);
    let lag_ok = !r.status_lag.is_empty() && r.status_lag.iter().all(|l| *l < 1000.0);
    frow([
        "API pod: running -> status PATCH",
        &fmt_stat(&r.status_lag),
        "< 1 s (each)",
        verdict(lag_ok),
    ]);
    frow([
        "API pod: deleted (grace 2 s) -> gone",
        &fmt_stat(&r.to_gone),
        "",
        "",
    ]);
    frow([
        "API requests per pod, created -> gone",
        &format!(
            "{:.0} [{:.0}-{:.0}]",
            super::median(&r.requests_per_pod),
            super::min_max(&r.requests_per_pod).0,
            super::min_max(&r.requests_per_pod).1
        ),
        "",
        "",
    ]);
    if let Some(m) = &r.many {
        frow([
            &format!("{} API pods: all running / all Running", m.pods),
            &format!(
                "{} / {} ({} status patches)",
                fmt_ms(m.all_running),
                fmt_ms(m.all_status),
                m.status_patches
            ),
            "",
            "",
        ]);
        let ok = (m.mem.rss as f64) < 25.0 * 1024.0;
        frow([
            &format!("RSS, {} API pods", m.pods),
            &format!("{}, {} threads", m.mem.show(), m.mem.threads),
            if m.pods == MANY {
                "< 25 MiB"
            } else {
                "< 25 MiB at 110"
            },
            verdict(ok),
        ]);
        frow([
            &format!("{} API pods: deleted -> all gone", m.pods),
            &fmt_ms(m.all_gone),
            "",
            "",
        ]);
        let back = m.after.rss <= r.idle.rss + 2048;
        frow([
            "RSS 1 min after deleting them all",
            &format!(
                "{}, peak {}, {} threads",
                m.after.show(),
                mib(m.after.hwm),
                m.after.threads
            ),
            "<= idle + 2 MiB",
            verdict(back),
        ]);
    }
    if let Some(e) = &r.eviction {
        // The manager looks every 10 s, as upstream's does.
        let ok = e.to_evicted <= 11_000.0;
        frow([
            "emptyDir over sizeLimit -> Evicted",
            &format!(
                "{} after it ran; stopped by {}",
                fmt_ms(e.to_evicted),
                fmt_ms(e.to_stopped)
            ),
            "<= 10 s period",
            verdict(ok),
        ]);
    }
    println!(
        "  idle requests in {:.0} s (count, body bytes):",
        r.window.as_secs_f64()
    );
    if r.idle_requests.is_empty() {
        println!("    none");
    }
    for (k, t) in &r.idle_requests {
        println!("    {k}: {} ({} B)", t.count, t.bytes);
    }
}
