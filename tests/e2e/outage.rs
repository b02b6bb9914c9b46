//! End-to-end tests of apiserver outages: the real binary as node edge-1
//! with pods in a real, private containerd, against the fake apiserver
//! whose link is cut, either refusing connections or as a black hole
//! (connections accepted, nothing ever answered on them). The outage lasts
//! `TINYLET_OUTAGE_SECS` (default 60, longer than the node's 40 s lease);
//! `packaging/outage.sh` runs these with a long one.
//!
//! What must hold: nothing that runs is touched during the outage; the node
//! notices within its timeouts and no thread stays stuck on a connection
//! that went silent; what changed meanwhile (a pod deleted, the history
//! compacted, the Node marked Unknown by the node lifecycle controller) is
//! caught up with soon after the link returns, without a request storm.
//! And a node rebooted during an outage runs its checkpointed API pods
//! again, once each, before the apiserver is back. Figures are printed.

use std::fs;
use std::time::{Duration, Instant};

use serde_json::json;

use crate::e2e::cluster::{api_pod, only_ids, status_problem, str_at, wait_status_running, NS};
use crate::e2e::{yaml_pod, LONG_RUNNING, NODE, SETTLE};
use crate::support::containerd::{
    holds_for, scaled, wait_until, write_manifest, PrivateContainerd, Tinylet, POD_UID_LABEL,
};
use crate::support::fake_apiserver::{FakeApiServer, RecordedRequest};

const LEASE_PATH: &str = "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/edge-1";
const NODE_STATUS_PATH: &str = "/api/v1/nodes/edge-1/status";
/// tinylet's defaults, from which the bounds below are derived.
const LEASE_DURATION: Duration = Duration::from_secs(40);
const LEASE_RENEW: Duration = Duration::from_secs(10);
/// The longest pause between two attempts of one lease renewal.
const LEASE_RETRY_MAX: Duration = Duration::from_secs(7);
/// min(node status update period 10 s, lease duration 40 s).
const HEARTBEAT_TIMEOUT: Duration = Duration::from_secs(10);
const NODE_STATUS_PERIOD: Duration = Duration::from_secs(10);
/// Any other request, and the head of a watch's answer.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// The reflector's re-watch back-off cap (10 s) with its 50% jitter.
const WATCH_BACKOFF_MAX: Duration = Duration::from_secs(15);
/// Room for a loaded machine on top of each derived bound.
const MARGIN: Duration = Duration::from_secs(20);
/// The node lifecycle controller's grace period before it marks a silent
/// node's conditions Unknown (upstream `--node-monitor-grace-period`).
const NODE_MONITOR_GRACE: Duration = Duration::from_secs(40);

/// The outage's length: `TINYLET_OUTAGE_SECS`, default 60 s.
fn outage_length() -> Duration {
    let secs = match std::env::var("TINYLET_OUTAGE_SECS") {
        Ok(s) => s
            .trim()
            .parse::<u64>()
            .unwrap_or_else(|e| panic!("TINYLET_OUTAGE_SECS={s:?}: {e}")),
        Err(_) => 60,
    };
    let d = Duration::from_secs(secs);
    assert!(
        d > LEASE_DURATION,
        "TINYLET_OUTAGE_SECS={secs}: an outage must outlast the node's lease ({}s)",
        LEASE_DURATION.as_secs()
    );
    d
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Cut {
    /// The listener is closed: connections are refused, open ones reset.
    Refused,
    /// Connections are accepted and never answered, and those that had a
    /// request or watch in the hole stay silent after it.
    BlackHole,
}

impl Cut {
    fn set(self, api: &FakeApiServer, on: bool) {
        match self {
            Cut::Refused => api.set_down(on),
            Cut::BlackHole => api.set_black_hole(on),
        }
    }
}

fn start_node(extra: &[&str]) -> (FakeApiServer, PrivateContainerd, Tinylet) {
    let fake = FakeApiServer::start();
    let ctd = PrivateContainerd::start();
    let kubeconfig = fake.node_kubeconfig(ctd.dir(), NODE);
    let kubeconfig = kubeconfig.display().to_string();
    let mut flags = vec!["--kubeconfig", kubeconfig.as_str()];
    flags.extend_from_slice(extra);
    let kubelet = Tinylet::start_with(&ctd, NODE, &flags);
    (fake, ctd, kubelet)
}

fn node_ready(fake: &FakeApiServer) -> Option<String> {
    let node = fake.node(NODE)?;
    node["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == "Ready")
        .map(|c| str_at(c, "/status").to_string())
}

fn restart_count(fake: &FakeApiServer, name: &str) -> Option<u64> {
    fake.pod(NS, name)?
        .pointer("/status/containerStatuses/0/restartCount")?
        .as_u64()
}

/// Pod LISTs (not watches) answered 200 at or after `since`.
fn pod_lists_since(reqs: &[RecordedRequest], since: Instant) -> Vec<&RecordedRequest> {
    reqs.iter()
        .filter(|r| {
            r.at >= since
                && r.verb == "GET"
                && r.path == "/api/v1/pods"
                && !r.query.contains("watch=true")
                && r.status == 200
        })
        .collect()
}

/// When the first request matching `f` was answered 200 at or after `since`.
fn first_ok(
    reqs: &[RecordedRequest],
    since: Instant,
    f: impl Fn(&RecordedRequest) -> bool,
) -> Option<Instant> {
    reqs.iter()
        .find(|r| r.at >= since && r.status == 200 && f(r))
        .map(|r| r.at)
}

/// The first log line after byte `from` holding every needle.
fn log_line_after(log: &str, from: usize, needles: &[&str]) -> Option<String> {
    log.get(from..)?
        .lines()
        .find(|l| needles.iter().all(|n| l.contains(n)))
        .map(str::to_string)
}

fn secs(d: Duration) -> String {
    format!("{:.1}s", d.as_secs_f64())
}

/// Two API pods and a static pod run (and a third API pod, `job`, that
/// ends during the outage); the link is cut for `outage_length()`; during
/// it `gone` is deleted, the history compacted and the Node marked
/// Unknown. Asserts the outage's promises and prints its figures.
fn outage(cut: Cut) {
    let length = outage_length();
    let (fake, ctd, mut kubelet) = start_node(&[]);
    let stat = kubelet.pod_name("stat");
    write_manifest(
        &kubelet.manifest_dir(),
        "stat.yaml",
        &yaml_pod("stat", LONG_RUNNING, ""),
    );
    wait_until(SETTLE, "node edge-1 is registered", || {
        fake.node(NODE).is_some()
    });
    let keep_uid = str_at(&fake.create_pod(api_pod("keep")), "/metadata/uid").to_string();
    fake.create_pod(api_pod("gone"));
    let mut job = api_pod("job");
    job["spec"]["restartPolicy"] = json!("Never");
    fake.create_pod(job);
    let pods = ["keep", "gone", "job", stat.as_str()];
    for p in pods {
        wait_until(SETTLE, &format!("{p} runs in containerd"), || {
            ctd.pod_running(p, &["app"])
        });
    }
    let ids: Vec<(String, String)> = pods
        .iter()
        .map(|p| only_ids(&ctd, p).unwrap_or_else(|| panic!("{p}: one sandbox, one container")))
        .collect();
    for (p, (_, container)) in pods.iter().zip(&ids) {
        wait_status_running(&fake, p, container);
    }
    wait_until(SETTLE, "the node is Ready with a lease", || {
        node_ready(&fake).as_deref() == Some("True") && fake.lease(NODE).is_some()
    });
    let same_ids = |p: &str, i: usize| only_ids(&ctd, p).as_ref() == Some(&ids[i]);

    // The outage.
    let log_from = fs::read_to_string(kubelet.log_path())
        .unwrap_or_default()
        .len();
    let started = Instant::now();
    cut.set(&fake, true);
    eprintln!("outage ({cut:?}) for {}", secs(length));
    let mut lease_noticed: Option<Duration> = None;
    let mut notice_line = String::new();
    let mut watch_noticed: Option<Duration> = None;
    let mut changed = false;
    let mut marked_unknown = false;
    while started.elapsed() < length {
        kubelet.assert_running();
        let log = fs::read_to_string(kubelet.log_path()).unwrap_or_default();
        if lease_noticed.is_none() {
            if let Some(line) = log_line_after(&log, log_from, &["node lease: ", "attempt 1 of"]) {
                lease_noticed = Some(started.elapsed());
                notice_line = line;
            }
        }
        if watch_noticed.is_none()
            && log_line_after(&log, log_from, &["reflector pods: GET /api/v1/pods?"]).is_some()
        {
            watch_noticed = Some(started.elapsed());
        }
        if !changed && started.elapsed() >= Duration::from_secs(3) {
            // What happens while the node cannot see it: a pod deleted
            // gracefully, the history compacted (its re-watch gets 410),
            // and a pod whose container ends by itself (a status to report).
            let deleting = fake.delete_pod(NS, "gone", Some(5)).expect("pod gone");
            assert!(!str_at(&deleting, "/metadata/deletionTimestamp").is_empty());
            fake.compact();
            ctd.exec(&ids[2].1, &["kill", "-TERM", "1"])
                .unwrap_or_else(|e| panic!("ending job's container: {e}"));
            changed = true;
        }
        if !marked_unknown && started.elapsed() >= NODE_MONITOR_GRACE {
            assert!(fake.mark_node_unknown(NODE));
            marked_unknown = true;
        }
        // Nothing that runs is touched: same sandboxes and containers.
        for (i, p) in pods.iter().enumerate() {
            assert!(
                same_ids(p, i),
                "{p}'s sandbox or container changed during the outage: {:?} (was {:?})\n{}",
                only_ids(&ctd, p),
                ids[i],
                kubelet.log_tail(40)
            );
        }
        for p in ["keep", "gone", stat.as_str()] {
            assert!(
                ctd.pod_running(p, &["app"]),
                "{p} stopped during the outage"
            );
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    let outage_log = fs::read_to_string(kubelet.log_path()).unwrap_or_default();
    let lease_noticed = lease_noticed.unwrap_or_else(|| {
        panic!(
            "the node never logged a failed lease renewal during the outage\n{}",
            kubelet.log_tail(60)
        )
    });
    // The lease is tried every 10 s, and a try into a black hole ends
    // after the heartbeat timeout.
    let notice_bound = LEASE_RENEW + HEARTBEAT_TIMEOUT + MARGIN;
    assert!(
        lease_noticed <= scaled(notice_bound),
        "the node noticed the outage after {} (bound {})",
        secs(lease_noticed),
        secs(notice_bound)
    );
    if cut == Cut::BlackHole {
        // The lease renewal hung until the heartbeat timeout ended it.
        assert!(
            notice_line.to_lowercase().contains("timeout")
                || notice_line.to_lowercase().contains("timed out"),
            "the first failed renewal in the black hole was not a timeout: {notice_line}"
        );
        // Hung requests and watches were cut by the client, not the server.
        assert!(
            log_line_after(&outage_log, log_from, &["closing every connection"]).is_some(),
            "the node never closed its hung connections\n{}",
            kubelet.log_tail(60)
        );
        assert!(
            watch_noticed.is_some(),
            "the hung pods watch was never ended during the outage\n{}",
            kubelet.log_tail(60)
        );
    }
    let lease_before = fake.lease(NODE).expect("the lease");
    assert_eq!(
        node_ready(&fake).as_deref(),
        Some("Unknown"),
        "the node lifecycle controller's mark stands until the node is back"
    );

    // The link returns.
    cut.set(&fake, false);
    let back = Instant::now();
    let lease_bound = HEARTBEAT_TIMEOUT + LEASE_RETRY_MAX.max(LEASE_RENEW);
    let status_bound = lease_bound + NODE_STATUS_PERIOD + HEARTBEAT_TIMEOUT;
    let relist_bound = REQUEST_TIMEOUT + WATCH_BACKOFF_MAX;
    let deleted_bound = relist_bound + Duration::from_secs(5) + NODE_STATUS_PERIOD;
    let mut lease_back = None;
    let mut ready_back = None;
    let mut relisted = None;
    let mut gone_back = None;
    let mut job_back = None;
    let deadline = back + scaled(deleted_bound + MARGIN);
    while [lease_back, ready_back, relisted, gone_back, job_back]
        .iter()
        .any(Option::is_none)
    {
        kubelet.assert_running();
        assert!(
            Instant::now() < deadline,
            "after {} back: lease {lease_back:?}, Ready {ready_back:?}, relist {relisted:?}, \
             gone removed {gone_back:?}, job Succeeded {job_back:?}\n{}",
            secs(back.elapsed()),
            kubelet.log_tail(80)
        );
        let reqs = fake.requests();
        lease_back = lease_back.or(first_ok(&reqs, back, |r| {
            matches!(r.verb.as_str(), "PATCH" | "PUT") && r.path == LEASE_PATH
        }));
        if ready_back.is_none() && node_ready(&fake).as_deref() == Some("True") {
            ready_back = first_ok(&reqs, back, |r| {
                r.verb == "PATCH" && r.path == NODE_STATUS_PATH
            });
        }
        relisted = relisted.or(pod_lists_since(&reqs, back).first().map(|r| r.at));
        if gone_back.is_none() && fake.pod(NS, "gone").is_none() && ctd.pod_gone("gone") {
            gone_back = Some(Instant::now());
        }
        if job_back.is_none()
            && str_at(&fake.pod(NS, "job").unwrap_or_default(), "/status/phase") == "Succeeded"
        {
            job_back = Some(Instant::now());
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let after = |t: Option<Instant>| {
        t.map(|t| t.saturating_duration_since(back))
            .unwrap_or_default()
    };
    let (lease_back, ready_back, relisted, gone_back, job_back) = (
        after(lease_back),
        after(ready_back),
        after(relisted),
        after(gone_back),
        after(job_back),
    );
    for (what, took, bound) in [
        ("lease renewed", lease_back, lease_bound),
        ("node status Ready True", ready_back, status_bound),
        ("pods relisted", relisted, relist_bound),
    ] {
        assert!(
            took <= scaled(bound + MARGIN),
            "{what} {} after the link returned (bound {} + {})",
            secs(took),
            secs(bound),
            secs(MARGIN)
        );
    }
    let lease_after = fake.lease(NODE).expect("the lease");
    assert_ne!(
        lease_after["spec"]["renewTime"], lease_before["spec"]["renewTime"],
        "the lease was not renewed"
    );

    // Nothing that kept running was restarted.
    for (i, p) in pods.iter().enumerate() {
        if *p == "gone" {
            continue;
        }
        assert!(
            same_ids(p, i),
            "{p} changed: {:?} (was {:?})",
            only_ids(&ctd, p),
            ids[i]
        );
    }
    wait_status_running(&fake, "keep", &ids[0].1);
    wait_status_running(&fake, &stat, &ids[3].1);
    assert_eq!(
        str_at(&fake.pod(NS, "keep").unwrap_or_default(), "/metadata/uid"),
        keep_uid
    );
    for p in ["keep", stat.as_str(), "job"] {
        assert_eq!(
            restart_count(&fake, p),
            Some(0),
            "{p}: {:?}",
            fake.pod(NS, p)
        );
    }
    assert_eq!(
        status_problem(fake.pod(NS, "keep").as_ref(), &ids[0].1),
        None
    );

    // No storm: the requests of the first 10 s back.
    if back.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_secs(10) - back.elapsed());
    }
    let reqs = fake.requests();
    let first: Vec<&RecordedRequest> = reqs
        .iter()
        .filter(|r| r.at >= back && r.at < back + Duration::from_secs(10))
        .collect();
    let mut by_kind = std::collections::BTreeMap::<String, usize>::new();
    for r in &first {
        let path = match r.path.as_str() {
            p if p.starts_with("/api/v1/namespaces/default/pods/") => {
                "/api/v1/namespaces/default/pods/*".to_string()
            }
            p => p.to_string(),
        };
        let watch = if r.query.contains("watch=true") {
            " (watch)"
        } else {
            ""
        };
        *by_kind
            .entry(format!("{} {path}{watch}", r.verb))
            .or_default() += 1;
    }
    // The back-offs may leave the first seconds back quiet; the burst that
    // matters is the one after the first answered request.
    let first_answer = reqs
        .iter()
        .find(|r| r.at >= back && r.status != 0)
        .map(|r| r.at)
        .unwrap_or(back);
    if first_answer.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_secs(10) - first_answer.elapsed());
    }
    let reqs = fake.requests();
    let burst = reqs
        .iter()
        .filter(|r| r.at >= first_answer && r.at < first_answer + Duration::from_secs(10))
        .count();
    assert!(
        burst <= 60,
        "{burst} requests in the 10 s after the first answer back"
    );
    let lists = pod_lists_since(&reqs, back).len();
    assert!(lists >= 1);
    // The re-watch from before the compaction got 410 Gone.
    let log = fs::read_to_string(kubelet.log_path()).unwrap_or_default();
    assert!(
        log_line_after(&log, log_from, &["reflector pods: ", "410", "relisting"]).is_some(),
        "no 410 Gone and relist after the outage\n{}",
        kubelet.log_tail(60)
    );
    assert!(
        first.len() <= 60,
        "{} requests in the first 10 s after the outage: {by_kind:#?}",
        first.len()
    );
    assert!(!kubelet.log_since_start().contains("panicked"));
    eprintln!(
        "outage figures ({cut:?}, {}): noticed after {} ({notice_line}; pods watch: {}), \
         back: lease renewed {}, node status Ready True {}, pods relisted {} ({lists} LIST(s) in all), \
         deleted pod gone from containerd and the API {}, job Succeeded in the API {}; \
         {} requests in the first 10 s back ({by_kind:?}), {burst} in the 10 s from the \
         first answered one ({} back)",
        secs(length),
        secs(lease_noticed),
        watch_noticed.map_or("not logged".into(), secs),
        secs(lease_back),
        secs(ready_back),
        secs(relisted),
        secs(gone_back),
        secs(job_back),
        first.len(),
        secs(first_answer.saturating_duration_since(back)),
    );
    kubelet.assert_running();
}

/// Connections refused for longer than the lease: pods run on untouched,
/// and the node catches up once the apiserver is back.
#[test]
fn apiserver_refusing_connections_for_longer_than_the_lease() {
    outage(Cut::Refused);
}

/// A black hole for longer than the lease: hung lease renewals, status patches
/// and watches are cut by the client's own timeouts, and the node catches
/// up within a bound derived from them once the link is back.
#[test]
fn apiserver_black_hole_for_longer_than_the_lease() {
    outage(Cut::BlackHole);
}

/// Removes every sandbox (and with it every container) from the runtime,
/// as a reboot leaves it.
fn wipe_runtime(ctd: &PrivateContainerd) {
    use tinylet::cri::{RemoteRuntime, RuntimeService};
    let cri = RemoteRuntime::new(&ctd.endpoint(), Duration::from_secs(60))
        .unwrap_or_else(|e| panic!("connecting to containerd: {e}"));
    for sandbox in cri.list_pod_sandbox(None).expect("list sandboxes") {
        cri.stop_pod_sandbox(&sandbox.id).expect("stop sandbox");
        cri.remove_pod_sandbox(&sandbox.id).expect("remove sandbox");
    }
    for container in cri.list_containers(None).expect("list containers") {
        cri.remove_container(&container.id)
            .expect("remove container");
    }
    assert!(cri.list_pod_sandbox(None).expect("list").is_empty());
    assert!(cri.list_containers(None).expect("list").is_empty());
}

/// A node rebooted while the apiserver is a black hole runs its
/// checkpointed API pods again, one sandbox each under the pod's own UID,
/// before the apiserver is back; then nothing is doubled and the API
/// statuses converge to Running.
#[test]
fn checkpointed_api_pods_run_after_a_reboot_in_a_black_hole() {
    let fake_dir = tempfile::tempdir().expect("checkpoint dir");
    let checkpoints = fake_dir.path().display().to_string();
    let (fake, ctd, mut kubelet) = start_node(&["--bootstrap-checkpoint-path", &checkpoints]);
    wait_until(SETTLE, "node edge-1 is registered", || {
        fake.node(NODE).is_some()
    });
    let names = ["ck-1", "ck-2"];
    let uids: Vec<String> = names
        .iter()
        .map(|n| str_at(&fake.create_pod(api_pod(n)), "/metadata/uid").to_string())
        .collect();
    for (n, uid) in names.iter().zip(&uids) {
        wait_until(SETTLE, &format!("{n} runs"), || {
            ctd.pod_running(n, &["app"])
        });
        let (_, container) = only_ids(&ctd, n).expect("one sandbox, one container");
        wait_status_running(&fake, n, &container);
        let file = fake_dir.path().join(format!("Pod_{uid}.yaml"));
        wait_until(SETTLE, &format!("{n} is checkpointed"), || file.exists());
    }
    let before: Vec<(String, String)> = names.iter().filter_map(|n| only_ids(&ctd, n)).collect();

    // The reboot, in the black hole.
    fake.set_black_hole(true);
    kubelet.sigkill();
    wipe_runtime(&ctd);
    for n in names {
        assert!(ctd.pod_gone(n), "{n} survived the wipe");
    }
    kubelet.restart();
    let restarted = Instant::now();
    for (n, uid) in names.iter().zip(&uids) {
        wait_until(
            Duration::from_secs(60),
            &format!("{n} runs again from its checkpoint while the apiserver is silent"),
            || ctd.pod_running(n, &["app"]),
        );
        let (sandbox, _) = only_ids(&ctd, n).expect("one sandbox, one container");
        let obj = ctd.object(&sandbox).expect("the new sandbox");
        assert_eq!(obj.label(POD_UID_LABEL), uid.as_str(), "{n} keeps its UID");
    }
    let restored_in = restarted.elapsed();
    let restored: Vec<(String, String)> = names.iter().filter_map(|n| only_ids(&ctd, n)).collect();
    assert_eq!(restored.len(), 2);
    assert!(
        restored.iter().all(|r| !before.contains(r)),
        "the old sandboxes came back: {restored:?}"
    );
    holds_for(
        Duration::from_secs(5),
        "one sandbox and one container per checkpointed pod, in the black hole",
        || {
            names
                .iter()
                .filter_map(|n| only_ids(&ctd, n))
                .collect::<Vec<_>>()
                == restored
        },
    );

    // The apiserver comes back.
    fake.set_black_hole(false);
    let back = Instant::now();
    for (i, n) in names.iter().enumerate() {
        let container = restored[i].1.clone();
        let mut last = None;
        let waited = Instant::now();
        while waited.elapsed() < scaled(Duration::from_secs(120)) {
            last = status_problem(fake.pod(NS, n).as_ref(), &container);
            if last.is_none() {
                break;
            }
            kubelet.assert_running();
            std::thread::sleep(Duration::from_millis(200));
        }
        assert_eq!(
            last,
            None,
            "{n}'s API status does not say Running in the restored container {container}\n{}",
            kubelet.log_tail(80)
        );
        assert_eq!(
            str_at(&fake.pod(NS, n).unwrap_or_default(), "/metadata/uid"),
            uids[i]
        );
    }
    let converged = back.elapsed();
    holds_for(
        Duration::from_secs(5),
        "still one sandbox and one container per pod after the apiserver came back",
        || {
            names
                .iter()
                .filter_map(|n| only_ids(&ctd, n))
                .collect::<Vec<_>>()
                == restored
        },
    );
    let created: Vec<RecordedRequest> = fake
        .requests()
        .into_iter()
        .filter(|r| r.verb == "POST" && r.path.ends_with("/pods"))
        .collect();
    assert!(created.is_empty(), "the node created pods: {created:?}");
    eprintln!(
        "reboot in a black hole: checkpointed pods ran again {} after the restart; \
         API statuses Running {} after the apiserver came back",
        secs(restored_in),
        secs(converged)
    );
    kubelet.assert_running();
}
