//! The watched objects benchmark: what the Secrets and ConfigMaps that pods
//! mount cost a node under the default `Watch` strategy, against a private
//! containerd and the integration tests' fake apiserver, with the real
//! tinylet binary. It prints numbers and judges them against issue 18's
//! target; it is not a test and fails only when something does not work.
//!
//! Two runs of a node joined to a fresh fake apiserver: 20 pods without
//! objects, then 20 pods each mounting its own ConfigMap and Secret (40
//! watched objects). For each, idle: RSS, threads, the node's TCP
//! connections to the apiserver, and the bytes those connections carried
//! in both directions over an idle window, scaled to a day (a watch's
//! re-watch, every 5 to 10 minutes, falls in a short window only for some
//! objects: a longer `--window-secs` gives a truer figure).
//!
//! Then a node where one pod references 1,100 ConfigMaps (`optional`
//! envFrom refs, ten of them existing), as a hostile pod would: the
//! agent's threads, open files and RSS idle before it, at their peak while
//! its objects are read and once it runs, its watches, and how long
//! another pod takes to start (from creation to running in containerd)
//! before it, while its objects are read, and after it runs.
//!
//!   cargo bench --bench objects -- [--pods N] [--window-secs N]
//!                                  [--referenced N] [--referenced-only]
//!
//! `TINYLET_E2E_BIN` picks the tinylet binary (default: the one cargo built
//! with the bench); `packaging/bench.sh` passes its release binary. Needs
//! root. Without `--bench` on the command line it does nothing.

use std::collections::BTreeSet;
use std::process::{Command, ExitCode};
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use serde_json::{json, Value};

#[path = "../tests/support/containerd.rs"]
mod containerd;
#[path = "../tests/support/fake_apiserver/mod.rs"]
mod fake_apiserver;

use containerd::{wait_until, PrivateContainerd, Tinylet, BUSYBOX_IMAGE};
use fake_apiserver::{FakeApiServer, KubeconfigAuth};

const NS: &str = "default";
const LONG_RUNNING: &str = "trap 'exit 0' TERM; while :; do sleep 1; done";

struct Options {
    pods: usize,
    window: Duration,
    /// ConfigMaps the hostile pod references (0: that part is skipped).
    referenced: usize,
    referenced_only: bool,
}

fn parse(args: &[String]) -> Result<Options> {
    let mut o = Options {
        pods: 20,
        window: Duration::from_secs(60),
        referenced: 1100,
        referenced_only: false,
    };
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut number = || -> Result<u64> {
            let v = it.next().ok_or_else(|| anyhow!("{a} needs a value"))?;
            v.parse()
                .with_context(|| format!("{a} {v:?}: not a number"))
        };
        match a.as_str() {
            "--bench" | "--quick" | "--no-cluster" | "--cluster-only" | "--host-network" => {}
            "--pods" => o.pods = number()?.max(1) as usize,
            "--window-secs" => o.window = Duration::from_secs(number()?.max(5)),
            "--referenced" => o.referenced = number()? as usize,
            "--referenced-only" => o.referenced_only = true,
            other => bail!("unknown option {other:?} (see the header of benches/objects.rs)"),
        }
    }
    Ok(o)
}

#[derive(Default, Clone)]
struct Figures {
    rss_kib: u64,
    threads: u64,
    connections: usize,
    idle_bytes: u64,
    window: Duration,
}

fn status_field(pid: u32, key: &str) -> Result<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    text.lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| anyhow!("/proc/{pid}/status: no {key}"))
}

/// The socket inodes `pid` holds.
fn socket_inodes(pid: u32) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for e in std::fs::read_dir(format!("/proc/{pid}/fd"))
        .into_iter()
        .flatten()
        .flatten()
    {
        if let Ok(link) = std::fs::read_link(e.path()) {
            let l = link.to_string_lossy();
            if let Some(ino) = l.strip_prefix("socket:[").and_then(|s| s.strip_suffix(']')) {
                out.insert(ino.to_string());
            }
        }
    }
    out
}

/// `pid`'s established TCP connections to `port`, and the bytes each
/// carried so far (sent + received, from `ss -tine`), by socket inode.
fn connections(pid: u32, port: u16) -> Result<Vec<(String, u64)>> {
    let mine = socket_inodes(pid);
    let out = Command::new("ss")
        .args([
            "-tine",
            "state",
            "established",
            "dport",
            &format!("= :{port}"),
        ])
        .output()
        .context("running ss")?;
    let text = String::from_utf8_lossy(&out.stdout);
    let mut found = Vec::new();
    // ss prints each socket on a line and its details on the next.
    let lines: Vec<&str> = text.lines().collect();
    for (i, l) in lines.iter().enumerate() {
        let Some(ino) = l
            .split_whitespace()
            .find_map(|w| w.strip_prefix("ino:"))
            .map(str::to_string)
        else {
            continue;
        };
        if !mine.contains(&ino) {
            continue;
        }
        let detail = format!("{l} {}", lines.get(i + 1).copied().unwrap_or(""));
        let counter = |key: &str| -> u64 {
            detail
                .split_whitespace()
                .find_map(|w| w.strip_prefix(key))
                .and_then(|v| v.parse().ok())
                .unwrap_or(0)
        };
        found.push((ino, counter("bytes_acked:") + counter("bytes_received:")));
    }
    Ok(found)
}

fn pod(name: &str, objects: bool) -> Value {
    let mut p = json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "nodeName": "objects",
            "automountServiceAccountToken": false,
            "terminationGracePeriodSeconds": 2,
            "containers": [{
                "name": "app",
                "image": BUSYBOX_IMAGE,
                "imagePullPolicy": "IfNotPresent",
                "command": ["sh", "-c", LONG_RUNNING],
            }],
        },
    });
    if objects {
        p["spec"]["volumes"] = json!([
            {"name": "cfg", "configMap": {"name": format!("{name}-cfg")}},
            {"name": "sec", "secret": {"secretName": format!("{name}-sec")}},
        ]);
        p["spec"]["containers"][0]["volumeMounts"] = json!([
            {"name": "cfg", "mountPath": "/cfg"},
            {"name": "sec", "mountPath": "/sec"},
        ]);
    }
    p
}

/// A node with `o.pods` pods, with or without two objects each.
fn measure(ctd: &PrivateContainerd, o: &Options, objects: bool) -> Result<Figures> {
    let node = "objects";
    let fake = FakeApiServer::start();
    let port = fake.addr().port();
    let kc_dir = ctd.dir().join(format!("kubeconfig-{objects}"));
    std::fs::create_dir_all(&kc_dir)?;
    let kubeconfig = fake.write_kubeconfig(
        &kc_dir,
        &format!("system:node:{node}"),
        KubeconfigAuth::token(),
    );
    let kc = kubeconfig.display().to_string();
    let mut t = Tinylet::start_with(ctd, node, &["--kubeconfig", &kc, "--v", "2"]);
    let names: Vec<String> = (0..o.pods).map(|i| format!("p{i}")).collect();
    for n in &names {
        if objects {
            fake.create_config_map(NS, &format!("{n}-cfg"), &[("app.conf", "level=info\n")]);
            fake.create_secret(NS, &format!("{n}-sec"), &[("password", "hunter2")]);
        }
        fake.create_pod(pod(n, objects));
    }
    wait_until(Duration::from_secs(300), "every pod runs", || {
        names.iter().all(|n| ctd.pod_running(n, &["app"]))
    });
    std::thread::sleep(Duration::from_secs(10));
    let pid = t.pid().ok_or_else(|| anyhow!("tinylet is not running"))?;
    let before = connections(pid, port)?;
    std::thread::sleep(o.window);
    if !t.is_running() {
        bail!("tinylet exited; log tail:\n{}", t.log_tail(30));
    }
    let after = connections(pid, port)?;
    let idle_bytes = after
        .iter()
        .map(|(ino, b)| {
            let was = before.iter().find(|(i, _)| i == ino).map_or(0, |(_, b)| *b);
            b.saturating_sub(was)
        })
        .sum();
    let f = Figures {
        rss_kib: status_field(pid, "VmRSS:")?,
        threads: status_field(pid, "Threads:")?,
        connections: after.len(),
        idle_bytes,
        window: o.window,
    };
    eprintln!(
        "objects: {} pods {}: RSS {:.1} MiB, {} threads, {} apiserver connections, {} bytes in {} s idle",
        o.pods,
        if objects { "with a ConfigMap and a Secret each" } else { "without objects" },
        f.rss_kib as f64 / 1024.0,
        f.threads,
        f.connections,
        f.idle_bytes,
        f.window.as_secs()
    );
    // Deleted while the node runs, so that it stops them.
    for n in &names {
        fake.delete_pod(NS, n, Some(0));
    }
    wait_until(
        Duration::from_secs(120),
        "the bench's pods are gone",
        || names.iter().all(|n| ctd.pod_gone(n)),
    );
    t.sigterm();
    Ok(f)
}

fn per_day(f: &Figures) -> f64 {
    f.idle_bytes as f64 * 86_400.0 / f.window.as_secs_f64().max(1.0)
}

fn print_report(o: &Options, plain: &Figures, with: &Figures) {
    let row = |cols: [&str; 5]| {
        println!(
            "{:<44} {:<22} {:<22} {:<10} {}",
            cols[0], cols[1], cols[2], cols[3], cols[4]
        );
    };
    let objects = 2 * o.pods;
    println!();
    println!(
        "watched objects: tinylet {} (strategy Watch)",
        containerd::tinylet_bin().display()
    );
    row([
        "watched objects",
        "with objects",
        "without",
        "target",
        "verdict",
    ]);
    row([
        "---------------",
        "------------",
        "-------",
        "------",
        "-------",
    ]);
    let ok = with.rss_kib < 25 * 1024;
    row([
        &format!("RSS, {} pods, {objects} objects", o.pods),
        &format!("{:.1} MiB", with.rss_kib as f64 / 1024.0),
        &format!("{:.1} MiB", plain.rss_kib as f64 / 1024.0),
        "< 25 MiB",
        if ok { "met" } else { "MISSED" },
    ]);
    row([
        "  per object",
        &format!(
            "{:.0} KiB",
            with.rss_kib.saturating_sub(plain.rss_kib) as f64 / objects as f64
        ),
        "",
        "",
        "",
    ]);
    row([
        "threads",
        &with.threads.to_string(),
        &plain.threads.to_string(),
        "",
        "",
    ]);
    row([
        "apiserver connections",
        &with.connections.to_string(),
        &plain.connections.to_string(),
        "one per object",
        "",
    ]);
    row([
        &format!("idle bytes/day (from {} s)", with.window.as_secs()),
        &format!("{:.1} MB", per_day(with) / 1e6),
        &format!("{:.1} MB", per_day(plain) / 1e6),
        "",
        "",
    ]);
}

/// Threads, open files and RSS (KiB) of `pid`.
#[derive(Default, Clone, Copy)]
struct Usage {
    threads: u64,
    files: u64,
    rss_kib: u64,
}

fn usage(pid: u32) -> Result<Usage> {
    Ok(Usage {
        threads: status_field(pid, "Threads:")?,
        files: std::fs::read_dir(format!("/proc/{pid}/fd"))?.count() as u64,
        rss_kib: status_field(pid, "VmRSS:")?,
    })
}

/// Creates a plain pod and says how long it took to run in containerd.
fn time_pod_start(ctd: &PrivateContainerd, fake: &FakeApiServer, name: &str) -> Duration {
    let start = std::time::Instant::now();
    fake.create_pod(pod(name, false));
    wait_until(Duration::from_secs(120), "the pod runs", || {
        ctd.pod_running(name, &["app"])
    });
    start.elapsed()
}

/// The hostile pod: one node, a pod that references `o.referenced`
/// ConfigMaps, and another pod started before and after it.
fn measure_referenced(ctd: &PrivateContainerd, o: &Options) -> Result<()> {
    let node = "objects";
    let fake = FakeApiServer::start();
    let kc_dir = ctd.dir().join("kubeconfig-referenced");
    std::fs::create_dir_all(&kc_dir)?;
    let kubeconfig = fake.write_kubeconfig(
        &kc_dir,
        &format!("system:node:{node}"),
        KubeconfigAuth::token(),
    );
    let kc = kubeconfig.display().to_string();
    let mut t = Tinylet::start_with(ctd, node, &["--kubeconfig", &kc, "--v", "2"]);
    let before = time_pod_start(ctd, &fake, "before");
    std::thread::sleep(Duration::from_secs(5));
    let pid = t.pid().ok_or_else(|| anyhow!("tinylet is not running"))?;
    let idle = usage(pid)?;
    for i in (0..o.referenced).step_by((o.referenced / 10).max(1)) {
        let key = format!("K{i}");
        fake.create_config_map(NS, &format!("cm-{i}"), &[(key.as_str(), "v")]);
    }
    let mut hog = pod("hog", false);
    hog["spec"]["containers"][0]["envFrom"] = (0..o.referenced)
        .map(|i| json!({"configMapRef": {"name": format!("cm-{i}"), "optional": true}}))
        .collect();
    let created = std::time::Instant::now();
    fake.create_pod(hog);
    let mut peak = idle;
    let sample = |peak: &mut Usage| -> Result<()> {
        let u = usage(pid)?;
        peak.threads = peak.threads.max(u.threads);
        peak.files = peak.files.max(u.files);
        peak.rss_kib = peak.rss_kib.max(u.rss_kib);
        Ok(())
    };
    // Another pod while the hostile pod's objects are being read.
    let reads = (o.referenced / 4).max(1);
    wait_until(
        Duration::from_secs(120),
        "the pod's objects are being read",
        || {
            fake.requests()
                .iter()
                .filter(|r| r.path.contains("/configmaps"))
                .count()
                >= reads
        },
    );
    sample(&mut peak)?;
    let hog_ran_first = ctd.pod_running("hog", &["app"]);
    let during = time_pod_start(ctd, &fake, "during");
    let deadline = created + Duration::from_secs(300);
    while !ctd.pod_running("hog", &["app"]) {
        sample(&mut peak)?;
        if !t.is_running() {
            bail!("tinylet exited; log tail:\n{}", t.log_tail(30));
        }
        if std::time::Instant::now() > deadline {
            bail!("the pod with {} references never ran", o.referenced);
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let hog_start = created.elapsed();
    let after = time_pod_start(ctd, &fake, "after");
    sample(&mut peak)?;
    std::thread::sleep(Duration::from_secs(5));
    let running = usage(pid)?;
    let watches = fake
        .requests()
        .iter()
        .filter(|r| r.query.contains("watch=true") && r.path.ends_with("/configmaps"))
        .count();
    let row = |cols: [&str; 4]| {
        println!(
            "{:<44} {:<16} {:<16} {}",
            cols[0], cols[1], cols[2], cols[3]
        )
    };
    let mib = |k: u64| format!("{:.1} MiB", k as f64 / 1024.0);
    println!();
    println!(
        "one pod referencing {} ConfigMaps (Watch): tinylet {}",
        o.referenced,
        containerd::tinylet_bin().display()
    );
    row(["", "idle before", "peak", "running after"]);
    row([
        "threads",
        &idle.threads.to_string(),
        &peak.threads.to_string(),
        &running.threads.to_string(),
    ]);
    row([
        "open files",
        &idle.files.to_string(),
        &peak.files.to_string(),
        &running.files.to_string(),
    ]);
    row([
        "RSS",
        &mib(idle.rss_kib),
        &mib(peak.rss_kib),
        &mib(running.rss_kib),
    ]);
    let ok = peak.threads < 150 && peak.files < 300;
    println!(
        "target: < 150 threads and < 300 open files: {}",
        if ok { "met" } else { "MISSED" }
    );
    println!(
        "watches opened: {watches}; the pod ran {:.1} s after its creation",
        hog_start.as_secs_f64()
    );
    println!(
        "another pod's start: {:.2} s before, {:.2} s while its objects were read{}, {:.2} s after",
        before.as_secs_f64(),
        during.as_secs_f64(),
        if hog_ran_first {
            " (it already ran)"
        } else {
            ""
        },
        after.as_secs_f64()
    );
    let pods = ["before", "hog", "during", "after"];
    for n in pods {
        fake.delete_pod(NS, n, Some(0));
    }
    wait_until(
        Duration::from_secs(120),
        "the bench's pods are gone",
        || pods.iter().all(|n| ctd.pod_gone(n)),
    );
    t.sigterm();
    Ok(())
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if !args.iter().any(|a| a == "--bench") {
        return ExitCode::SUCCESS;
    }
    let o = match parse(&args) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("objects: {e:#}");
            return ExitCode::from(2);
        }
    };
    let ctd = PrivateContainerd::start();
    let result = if o.referenced_only {
        Ok(())
    } else {
        measure(&ctd, &o, false).and_then(|plain| {
            let with = measure(&ctd, &o, true)?;
            print_report(&o, &plain, &with);
            Ok(())
        })
    };
    let result = result.and_then(|()| match o.referenced {
        0 => Ok(()),
        _ => measure_referenced(&ctd, &o),
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("objects: {e:#}");
            ExitCode::FAILURE
        }
    }
}
