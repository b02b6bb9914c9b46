//! End-to-end tests of containerd outages under tinylet: the real binary
//! against a real, private containerd that the tests stop (the daemon only:
//! its runc shims, and so the containers, keep running, as on a real node)
//! and start again on the same state. The node turns NotReady with the
//! runtime's reason, tinylet says once that the runtime is down instead of
//! every second, does not spin, and when containerd is back it adopts what
//! survived: no second sandbox, no restarted container.
//!
//! Figures (outage length, log lines, CPU time, time to converge) are
//! printed; only generous "no busy loop" and "no spam" bounds are asserted.

use std::collections::BTreeMap;
use std::fs;
use std::time::{Duration, Instant};

use crate::e2e::cluster::api_pod;
use crate::e2e::{yaml_pod, LONG_RUNNING, NODE, SETTLE};
use crate::support::containerd::{
    cpu_time, holds_for, scaled, wait_until, write_manifest, PrivateContainerd, Tinylet,
    CONTAINER_NAME_LABEL, POD_UID_LABEL,
};
use crate::support::fake_apiserver::FakeApiServer;

const NS: &str = "default";
/// Image GC off: on a build machine whose disk is over 85% full it would
/// remove the test images, which cannot be pulled again.
const NO_IMAGE_GC: [&str; 2] = ["--image-gc-high-threshold", "100"];
/// How long containerd stays away in the long outage.
const OUTAGE: Duration = Duration::from_secs(30);
/// Most lines tinylet may log about the runtime over `OUTAGE`: once a
/// second would be 30 and more; a first line and a reminder or two is what
/// is expected.
const MAX_OUTAGE_LINES: usize = 12;
/// Most failed relists over `OUTAGE` besides the first (logged at debug
/// level): once a second would be 30; backed off to 5 s it is about 7.
const MAX_OUTAGE_RELISTS: usize = 15;
/// Most CPU time tinylet may use over `OUTAGE` (idle it uses a few tens of
/// ms): far above that, but a spinning thread would use the whole 30 s.
const MAX_OUTAGE_CPU: Duration = Duration::from_secs(3);

/// The node's Ready condition: (status, message).
fn node_ready(fake: &FakeApiServer) -> Option<(String, String)> {
    let node = fake.node(NODE)?;
    let c = node["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == "Ready")?
        .clone();
    Some((
        c["status"].as_str().unwrap_or("").to_string(),
        c["message"].as_str().unwrap_or("").to_string(),
    ))
}

/// containerStatuses[0] of an API pod: (containerID, restartCount, running).
fn api_container(fake: &FakeApiServer, name: &str) -> Option<(String, i64, bool)> {
    let pod = fake.pod(NS, name)?;
    let c = pod.pointer("/status/containerStatuses/0")?;
    Some((
        c["containerID"].as_str().unwrap_or("").to_string(),
        c["restartCount"].as_i64().unwrap_or(-1),
        c.pointer("/state/running").is_some(),
    ))
}

/// Every CRI object of a pod by kind: sandbox IDs and container IDs.
fn pod_ids(ctd: &PrivateContainerd, pod: &str) -> (Vec<String>, Vec<String>) {
    (ctd.sandbox_ids(pod), ctd.container_ids(pod))
}

/// The lines tinylet logged after byte `from` of its log.
fn log_after(kubelet: &Tinylet, from: usize) -> Vec<String> {
    let text = fs::read(kubelet.log_path()).unwrap_or_default();
    let text = String::from_utf8_lossy(&text[from.min(text.len())..]).into_owned();
    text.lines().map(String::from).collect()
}

fn log_len(kubelet: &Tinylet) -> usize {
    fs::metadata(kubelet.log_path())
        .map(|m| m.len() as usize)
        .unwrap_or(0)
}

/// Lines about the runtime being unreachable (the relist, workers, probes,
/// node status: whoever says so).
fn runtime_lines(lines: &[String]) -> Vec<&String> {
    lines
        .iter()
        .filter(|l| l.contains(" WARN ") || l.contains(" ERROR ") || l.contains(" INFO "))
        .filter(|l| {
            let l = l.to_ascii_lowercase();
            l.contains("runtime") || l.contains("containerd.sock") || l.contains("unavailable")
        })
        .collect()
}

/// containerd stops under running pods (two API pods and a static pod with
/// an exec liveness probe) for 30 s: the node's Ready condition turns False naming the runtime, tinylet
/// logs that the runtime is down without repeating it every second, uses
/// little CPU, and a pod created meanwhile waits. containerd starts again
/// on the same state: Ready comes back, the new pod runs, and the pods that
/// ran keep their sandboxes and containers (same IDs, restartCount as
/// before).
#[test]
fn containerd_outage_turns_the_node_not_ready_and_nothing_restarts_after_it() {
    let fake = FakeApiServer::start();
    let mut ctd = PrivateContainerd::start();
    let kubeconfig = fake.node_kubeconfig(ctd.dir(), NODE);
    let kubeconfig = kubeconfig.display().to_string();
    let kubelet = Tinylet::start_with(
        &ctd,
        NODE,
        &[
            "--kubeconfig",
            &kubeconfig,
            "--node-status-update-frequency",
            "2s",
            NO_IMAGE_GC[0],
            NO_IMAGE_GC[1],
        ],
    );
    write_manifest(
        &kubelet.manifest_dir(),
        "static.yaml",
        // A liveness probe that errors all through the outage (ExecSync
        // cannot reach the runtime) must not get the container restarted.
        &yaml_pod("static", LONG_RUNNING, "").replace(
            "    command:",
            "    livenessProbe:\n      exec:\n        command: [\"true\"]\n      periodSeconds: 2\n      failureThreshold: 1\n    command:",
        ),
    );
    let static_name = kubelet.pod_name("static");
    fake.create_pod(api_pod("web"));
    fake.create_pod(api_pod("db"));
    for pod in ["web", "db", static_name.as_str()] {
        wait_until(SETTLE, &format!("pod {pod} runs"), || {
            ctd.pod_running(pod, &["app"])
        });
    }
    for pod in ["web", "db"] {
        wait_until(
            SETTLE,
            &format!("the API status of {pod} says running"),
            || api_container(&fake, pod).is_some_and(|(id, _, running)| !id.is_empty() && running),
        );
    }
    wait_until(SETTLE, "the node is Ready", || {
        node_ready(&fake).is_some_and(|(s, _)| s == "True")
    });
    let before: BTreeMap<String, (Vec<String>, Vec<String>)> = ["web", "db", &static_name]
        .iter()
        .map(|p| (p.to_string(), pod_ids(&ctd, p)))
        .collect();
    let api_before: BTreeMap<&str, (String, i64, bool)> = ["web", "db"]
        .into_iter()
        .map(|p| (p, api_container(&fake, p).unwrap()))
        .collect();

    // The outage.
    let pid = kubelet.pid().unwrap();
    let log_from = log_len(&kubelet);
    let cpu_before = cpu_time(pid).unwrap();
    let down_at = Instant::now();
    ctd.stop_daemon("TERM");
    wait_until(
        SETTLE,
        "the node's Ready condition is False naming the runtime",
        || {
            node_ready(&fake).is_some_and(|(s, m)| {
                s == "False"
                    && m.contains("container runtime is down")
                    && m.contains("containerd.sock")
            })
        },
    );
    let not_ready_after = down_at.elapsed();
    let (_, message) = node_ready(&fake).unwrap();
    eprintln!(
        "node NotReady {:.1}s after containerd stopped: {message}",
        not_ready_after.as_secs_f64()
    );
    // A pod scheduled during the outage waits for the runtime.
    fake.create_pod(api_pod("late"));
    let rest = scaled(OUTAGE).saturating_sub(down_at.elapsed());
    holds_for(
        rest,
        "the node stays NotReady while containerd is down",
        || node_ready(&fake).is_some_and(|(s, _)| s == "False"),
    );
    let outage = down_at.elapsed();
    let cpu = cpu_time(pid).unwrap().saturating_sub(cpu_before);
    let lines = log_after(&kubelet, log_from);
    let about_runtime = runtime_lines(&lines);
    eprintln!(
        "outage {:.1}s: tinylet used {:.3}s of CPU, logged {} lines, {} of them about the runtime:\n{}",
        outage.as_secs_f64(),
        cpu.as_secs_f64(),
        lines.len(),
        about_runtime.len(),
        about_runtime
            .iter()
            .map(|l| l.as_str())
            .collect::<Vec<_>>()
            .join("\n")
    );
    assert!(
        about_runtime
            .iter()
            .any(|l| l.contains("container runtime is down")),
        "no log line says the container runtime is down:\n{}",
        lines.join("\n")
    );
    assert!(
        about_runtime.len() <= MAX_OUTAGE_LINES,
        "{} lines about the runtime in a {:.0}s outage (at most {MAX_OUTAGE_LINES} expected):\n{}",
        about_runtime.len(),
        outage.as_secs_f64(),
        lines.join("\n")
    );
    // Relists back off: one a second would be 30.
    let relists = lines
        .iter()
        .filter(|l| l.contains("tinylet::pleg] relist: "))
        .count();
    eprintln!("failed relists during the outage: {relists} (+1 reported as down)");
    assert!(
        relists <= MAX_OUTAGE_RELISTS,
        "{relists} failed relists in a {:.0}s outage: no back-off",
        outage.as_secs_f64()
    );
    let cpu_bound = MAX_OUTAGE_CPU.mul_f64(crate::support::containerd::time_scale());
    assert!(
        cpu <= cpu_bound,
        "tinylet used {:.2}s of CPU over a {:.0}s outage: a busy loop",
        cpu.as_secs_f64(),
        outage.as_secs_f64()
    );

    // containerd comes back on the same state.
    ctd.start_daemon();
    let back_at = Instant::now();
    wait_until(SETTLE, "the node is Ready again", || {
        node_ready(&fake).is_some_and(|(s, _)| s == "True")
    });
    let ready_after = back_at.elapsed();
    wait_until(SETTLE, "the pod created during the outage runs", || {
        ctd.pod_running("late", &["app"])
    });
    wait_until(SETTLE, "the API status of late says running", || {
        api_container(&fake, "late").is_some_and(|(id, _, running)| !id.is_empty() && running)
    });
    let converged_after = back_at.elapsed();
    eprintln!(
        "containerd back: node Ready after {:.1}s, the new pod running after {:.1}s",
        ready_after.as_secs_f64(),
        converged_after.as_secs_f64()
    );
    // Time for a wrong restart or a second sandbox to show.
    holds_for(
        scaled(Duration::from_secs(5)),
        "the pods that ran keep their sandboxes and containers",
        || {
            before
                .iter()
                .all(|(pod, ids)| &pod_ids(&ctd, pod) == ids && ctd.pod_running(pod, &["app"]))
        },
    );
    for (pod, was) in &api_before {
        let now = api_container(&fake, pod).unwrap();
        assert_eq!(
            (&now.0, now.1),
            (&was.0, was.1),
            "pod {pod}: container ID and restartCount in the API status changed over the outage"
        );
        assert!(now.2, "pod {pod} is not running in its API status");
    }
    let (late_sandboxes, late_containers) = pod_ids(&ctd, "late");
    assert_eq!(late_sandboxes.len(), 1, "late: {late_sandboxes:?}");
    assert_eq!(late_containers.len(), 1, "late: {late_containers:?}");
}

/// One sandbox per pod UID and one container per name and attempt, for
/// every pod in `pods` (the CRI objects' labels say which is which).
fn assert_each_pod_once(ctd: &PrivateContainerd, pods: &[String]) {
    for pod in pods {
        let objects = ctd.pod_objects(pod);
        let sandboxes: Vec<_> = objects.iter().filter(|o| o.is_sandbox()).collect();
        let uids: std::collections::BTreeSet<&str> =
            sandboxes.iter().map(|s| s.label(POD_UID_LABEL)).collect();
        assert_eq!(
            sandboxes.len(),
            1,
            "pod {pod}: one sandbox expected, found {:?} (UIDs {uids:?})",
            sandboxes.iter().map(|s| &s.id).collect::<Vec<_>>()
        );
        let mut seen = BTreeMap::new();
        for c in objects.iter().filter(|o| !o.is_sandbox()) {
            let key = (c.label(CONTAINER_NAME_LABEL).to_string(), c.attempt);
            if let Some(other) = seen.insert(key.clone(), c.id.clone()) {
                panic!(
                    "pod {pod}: container {:?} attempt {} exists twice: {other} and {}",
                    key.0, key.1, c.id
                );
            }
        }
    }
}

/// containerd is killed while tinylet starts several pods (as soon as the
/// first sandbox exists), so calls are cut off mid-way: when it is back,
/// every pod runs exactly once, with no sandbox or container left over from
/// the interrupted start.
#[test]
fn containerd_killed_while_pods_start_leaves_each_pod_running_once() {
    let mut ctd = PrivateContainerd::start();
    let kubelet = Tinylet::start_with(&ctd, NODE, &NO_IMAGE_GC);
    let names: Vec<String> = (1..=4).map(|i| format!("p{i}")).collect();
    for n in &names {
        write_manifest(
            &kubelet.manifest_dir(),
            &format!("{n}.yaml"),
            &yaml_pod(n, LONG_RUNNING, ""),
        );
    }
    let pods: Vec<String> = names.iter().map(|n| kubelet.pod_name(n)).collect();
    let sandbox_filter = "labels.\"io.cri-containerd.kind\"==sandbox";
    wait_until(SETTLE, "the first sandbox exists", || {
        !ctd.ids(sandbox_filter).is_empty()
    });
    ctd.stop_daemon("KILL");
    let down_at = Instant::now();
    std::thread::sleep(scaled(Duration::from_secs(5)));
    ctd.start_daemon();
    let back_at = Instant::now();
    eprintln!(
        "containerd killed during start-up for {:.1}s",
        (back_at - down_at).as_secs_f64()
    );
    for pod in &pods {
        wait_until(SETTLE, &format!("pod {pod} runs"), || {
            ctd.pod_running(pod, &["app"])
        });
    }
    let sandboxes = ctd.ids(sandbox_filter);
    let not_ready: Vec<&String> = sandboxes
        .iter()
        .filter(|id| ctd.task_status(id) != "RUNNING")
        .collect();
    let attempts: Vec<u32> = sandboxes
        .iter()
        .filter_map(|id| ctd.object(id).map(|o| o.attempt))
        .collect();
    eprintln!("sandbox attempts (1 = made again after the kill): {attempts:?}");
    eprintln!(
        "every pod running {:.1}s after containerd came back; {} sandboxes for {} pods then, {} of them not running: {not_ready:?}",
        back_at.elapsed().as_secs_f64(),
        sandboxes.len(),
        pods.len(),
        not_ready.len()
    );
    // Leftovers of the interrupted start are removed by the pod workers'
    // pruning after their next successful sync; give them time.
    wait_until(SETTLE, "each pod has one sandbox and one container", || {
        pods.iter().all(|p| {
            let (s, c) = pod_ids(&ctd, p);
            s.len() == 1 && c.len() == 1
        })
    });
    holds_for(
        scaled(Duration::from_secs(5)),
        "every pod keeps running once",
        || pods.iter().all(|p| ctd.pod_running(p, &["app"])),
    );
    assert_each_pod_once(&ctd, &pods);
    let cut: Vec<String> = log_after(&kubelet, 0)
        .into_iter()
        .filter(|l| l.contains("sync failed") || l.contains("pod syncs wait"))
        .map(|l| l.chars().take(240).collect())
        .collect();
    eprintln!(
        "what the interrupted start looked like to tinylet:\n{}",
        cut.join("\n")
    );
    assert_eq!(
        ctd.ids(sandbox_filter).len(),
        pods.len(),
        "sandboxes beyond one per pod"
    );
}

/// containerd restarted quickly (SIGTERM, start at once) under running
/// pods: nothing is restarted, no sandbox is added.
#[test]
fn containerd_restarted_quickly_restarts_nothing() {
    let mut ctd = PrivateContainerd::start();
    let kubelet = Tinylet::start_with(&ctd, NODE, &NO_IMAGE_GC);
    let names = ["a", "b"];
    for n in names {
        write_manifest(
            &kubelet.manifest_dir(),
            &format!("{n}.yaml"),
            &yaml_pod(n, LONG_RUNNING, ""),
        );
    }
    let pods: Vec<String> = names.iter().map(|n| kubelet.pod_name(n)).collect();
    for pod in &pods {
        wait_until(SETTLE, &format!("pod {pod} runs"), || {
            ctd.pod_running(pod, &["app"])
        });
    }
    let before: Vec<_> = pods.iter().map(|p| pod_ids(&ctd, p)).collect();
    let log_from = log_len(&kubelet);
    let started = Instant::now();
    ctd.stop_daemon("TERM");
    ctd.start_daemon();
    eprintln!(
        "containerd restarted in {:.2}s",
        started.elapsed().as_secs_f64()
    );
    // Time for tinylet to relist, resync and (wrongly) act.
    holds_for(
        scaled(Duration::from_secs(15)),
        "the pods keep their sandboxes and containers",
        || {
            pods.iter()
                .zip(&before)
                .all(|(p, ids)| &pod_ids(&ctd, p) == ids && ctd.pod_running(p, &["app"]))
        },
    );
    let lines = log_after(&kubelet, log_from);
    for l in &lines {
        assert!(
            !l.contains("sandbox") || !l.contains("running (attempt"),
            "a sandbox was created after the restart: {l}"
        );
        assert!(
            !l.contains("\" started ("),
            "a container was started after the restart: {l}"
        );
    }
}
