//! End-to-end test of the eviction manager on a real containerd: the
//! node's filesystem (tinylet's `--root-dir`, with the pod logs inside it)
//! is a small tmpfs the test mounts and then fills, with a nodefs
//! threshold given by flag, so nothing touches the host's disk. It checks
//! an emptyDir over its `sizeLimit` evicted with upstream's message, then,
//! under disk pressure, the order of the reclaim: the unused image first,
//! the rotated container logs next, and only then the best-effort pod
//! (Failed, reason Evicted, an event), while the guaranteed pod runs on
//! and a new pod is refused as long as the node reports DiskPressure.
//!
//! And a pod cannot hide what it writes from the limits by nesting it:
//! 40 MiB 40 directories down in an emptyDir with `sizeLimit: 20Mi`, or
//! in one under a container's `ephemeral-storage` limit of 20Mi, is
//! evicted within two of the manager's 10 s turns once written.

use std::fs;
use std::io::Write;
use std::path::Path;
use std::time::Duration;

use serde_json::{json, Value};

use crate::e2e::disk::Tmpfs;
use crate::e2e::images::import_spare_image;
use crate::e2e::{NODE, SETTLE};
use crate::support::containerd::{
    holds_for, wait_until, PrivateContainerd, Tinylet, BUSYBOX_IMAGE,
};
use crate::support::fake_apiserver::FakeApiServer;

const MI: u64 = 1 << 20;
/// The nodefs threshold the test gives (`nodefs.available<10Mi`).
const THRESHOLD: u64 = 10 * MI;
/// What the best-effort pod writes into its emptyDir.
const BEST_EFFORT_MI: u64 = 6;
/// How long the manager may take: a 10 s turn, a cleanup wait, margins.
const EVICTION_WAIT: Duration = Duration::from_secs(90);

fn pod(name: &str, script: &str, resources: Value, volumes: Value) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "nodeName": NODE,
            "automountServiceAccountToken": false,
            "terminationGracePeriodSeconds": 2,
            "containers": [{
                "name": "app",
                "image": BUSYBOX_IMAGE,
                "imagePullPolicy": "IfNotPresent",
                "command": ["sh", "-c", script],
                "resources": resources,
                "volumeMounts": volumes.as_array().map_or_else(Vec::new, |vs| vs
                    .iter()
                    .map(|v| json!({"name": v["name"], "mountPath": format!("/{}", v["name"].as_str().unwrap_or(""))}))
                    .collect::<Vec<_>>()),
            }],
            "volumes": volumes,
        },
    })
}

fn status<'a>(p: &'a Value, field: &str) -> &'a str {
    p["status"][field].as_str().unwrap_or("")
}

fn available(path: &Path) -> u64 {
    let c = std::ffi::CString::new(path.display().to_string()).unwrap();
    // SAFETY: statvfs fills the struct or fails.
    let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
    assert_eq!(unsafe { libc::statvfs(c.as_ptr(), &mut s) }, 0);
    s.f_bavail as u64 * s.f_frsize as u64
}

/// Rotated container log files under `logs` (`<n>.log.<time>[.gz]`).
fn rotated_logs(logs: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let Ok(pods) = fs::read_dir(logs) else {
        return out;
    };
    for p in pods.flatten() {
        for c in fs::read_dir(p.path()).into_iter().flatten().flatten() {
            for f in fs::read_dir(c.path()).into_iter().flatten().flatten() {
                let name = f.file_name().to_string_lossy().into_owned();
                if name.contains(".log.") {
                    out.push(f.path().display().to_string());
                }
            }
        }
    }
    out
}

#[test]
fn disk_pressure_reclaims_images_then_logs_then_evicts_the_best_effort_pod() {
    let fake = FakeApiServer::start();
    let ctd = PrivateContainerd::start();
    let spare = "docker.io/tinylet/spare:1";
    import_spare_image(&ctd, spare);
    let images = |ctd: &PrivateContainerd| ctd.ctr(&["images", "ls", "-q"]);
    assert!(images(&ctd).contains(spare), "{}", images(&ctd));

    // The node's filesystem: Tinylet::start puts its root dir here.
    let root = ctd.dir().join(format!("tinylet-{NODE}")).join("root");
    let _tmpfs = Tmpfs::mount(&root, "48m");
    let logs = root.join("pod-logs");
    fs::create_dir_all(&logs).unwrap();
    let kubeconfig = fake.node_kubeconfig(ctd.dir(), NODE);
    let mut kubelet = Tinylet::start_with(
        &ctd,
        NODE,
        &[
            "--kubeconfig",
            &kubeconfig.display().to_string(),
            "--pod-logs-dir",
            &logs.display().to_string(),
            "--eviction-hard",
            "nodefs.available<10Mi",
            "--eviction-pressure-transition-period",
            "1m",
            "--minimum-image-ttl-duration",
            "0s",
            "--container-log-max-size",
            "16Ki",
        ],
    );
    assert_eq!(kubelet.root_dir(), root);

    // Guaranteed, and chatty once: its log is rotated.
    fake.create_pod(pod(
        "guaranteed",
        "i=0; while [ $i -lt 3000 ]; do echo \"line $i of the guaranteed pod's log\"; \
         i=$((i+1)); done; exec sleep 100000",
        json!({"requests": {"cpu": "10m", "memory": "32Mi"},
               "limits": {"cpu": "10m", "memory": "32Mi"}}),
        json!([]),
    ));
    fake.create_pod(pod(
        "besteffort",
        &format!(
            "dd if=/dev/zero of=/scratch/fill bs=1M count={BEST_EFFORT_MI} && exec sleep 100000"
        ),
        json!({}),
        json!([{"name": "scratch", "emptyDir": {}}]),
    ));
    fake.create_pod(pod(
        "oversized",
        "dd if=/dev/zero of=/small/fill bs=1M count=2 && exec sleep 100000",
        json!({}),
        json!([{"name": "small", "emptyDir": {"sizeLimit": "1Mi"}}]),
    ));
    let running = |name: &str| {
        fake.pod("default", name)
            .is_some_and(|p| status(&p, "phase") == "Running")
    };
    wait_until(SETTLE, "guaranteed and besteffort run", || {
        running("guaranteed") && running("besteffort")
    });

    // The emptyDir over its sizeLimit: evicted without any pressure.
    wait_until(EVICTION_WAIT, "oversized is evicted", || {
        fake.pod("default", "oversized")
            .is_some_and(|p| status(&p, "reason") == "Evicted")
    });
    let p = fake.pod("default", "oversized").unwrap();
    assert_eq!(status(&p, "phase"), "Failed", "{p:#}");
    assert_eq!(
        status(&p, "message"),
        "Usage of EmptyDir volume \"small\" exceeds the limit \"1Mi\". ",
        "{p:#}"
    );
    wait_until(SETTLE, "oversized is stopped", || ctd.pod_gone("oversized"));
    assert!(images(&ctd).contains(spare), "reclaimed without pressure");

    wait_until(SETTLE, "the guaranteed pod's log is rotated", || {
        !rotated_logs(&logs).is_empty()
    });
    let rotated = rotated_logs(&logs);
    let scratch_done = || {
        let uid = fake
            .pod("default", "besteffort")
            .and_then(|p| p["metadata"]["uid"].as_str().map(str::to_string))
            .unwrap_or_default();
        let fill = root
            .join("pods")
            .join(uid)
            .join("volumes/kubernetes.io~empty-dir/scratch/fill");
        fs::metadata(fill).is_ok_and(|m| m.len() >= BEST_EFFORT_MI * MI)
    };
    wait_until(SETTLE, "besteffort wrote its emptyDir", scratch_done);

    // Fill the node's filesystem to 4 MiB short of the threshold: the
    // best-effort pod's emptyDir is what brings it back above.
    let filler_size = available(&root).saturating_sub(THRESHOLD - 4 * MI);
    {
        let mut f = fs::File::create(root.join("filler")).unwrap();
        let chunk = vec![1u8; MI as usize];
        let mut left = filler_size;
        while left > 0 {
            let n = left.min(MI);
            f.write_all(&chunk[..n as usize]).unwrap();
            left -= n;
        }
        f.sync_all().unwrap();
    }
    assert!(available(&root) < THRESHOLD, "{}", available(&root));

    wait_until(EVICTION_WAIT, "besteffort is evicted", || {
        fake.pod("default", "besteffort")
            .is_some_and(|p| status(&p, "reason") == "Evicted")
    });
    let p = fake.pod("default", "besteffort").unwrap();
    assert_eq!(status(&p, "phase"), "Failed", "{p:#}");
    assert!(
        status(&p, "message").starts_with("The node was low on resource: ephemeral-storage. "),
        "{p:#}"
    );
    // The event is posted by the recorder's own thread, not in step with
    // the status manager's write (as upstream): it may land a little later.
    wait_until(SETTLE, "an Evicted event for besteffort", || {
        fake.events()
            .iter()
            .any(|e| e["reason"] == "Evicted" && e["involvedObject"]["name"] == "besteffort")
    });

    // In that order: the image, the rotated logs, the pod.
    assert!(!images(&ctd).contains(spare), "{}", images(&ctd));
    for f in &rotated {
        assert!(!Path::new(f).exists(), "{f} was not removed");
    }
    let log = kubelet.log_since_start();
    let at = |what: &str| {
        log.find(what)
            .unwrap_or_else(|| panic!("{what:?} not in the log:\n{}", kubelet.log_tail(60)))
    };
    let images_at = at("removed 1 unused images");
    let logs_at = at("rotated container logs");
    // The last eviction: the first was the oversized pod's.
    let evict_at = log.rfind("evicting pod").expect("an eviction in the log");
    assert!(images_at < logs_at && logs_at < evict_at, "wrong order");
    assert!(log[evict_at..]
        .lines()
        .next()
        .unwrap_or("")
        .contains("besteffort"));

    // Reported for the transition period (1m), at the next status update.
    wait_until(SETTLE, "the node reports DiskPressure", || {
        fake.node(NODE).is_some_and(|node| {
            node["status"]["conditions"].as_array().is_some_and(|cs| {
                cs.iter()
                    .any(|c| c["type"] == "DiskPressure" && c["status"] == "True")
            })
        })
    });

    // While DiskPressure holds, a new pod is refused (reason Evicted).
    fake.create_pod(pod("late", "exec sleep 100000", json!({}), json!([])));
    wait_until(SETTLE, "late is refused", || {
        fake.pod("default", "late")
            .is_some_and(|p| status(&p, "reason") == "Evicted")
    });
    let p = fake.pod("default", "late").unwrap();
    assert_eq!(status(&p, "phase"), "Failed", "{p:#}");
    assert!(
        status(&p, "message").contains("The node had condition: [DiskPressure]. "),
        "{p:#}"
    );
    assert!(ctd.pod_gone("late"));

    // Relieved: the guaranteed pod is left alone.
    wait_until(SETTLE, "besteffort is stopped", || {
        ctd.pod_gone("besteffort")
    });
    holds_for(Duration::from_secs(25), "guaranteed keeps running", || {
        running("guaranteed") && ctd.pod_running("guaranteed", &["app"])
    });
    let mut reasons: Vec<String> = fake
        .pods()
        .iter()
        .filter(|p| status(p, "reason") == "Evicted")
        .map(|p| p["metadata"]["name"].as_str().unwrap_or("").to_string())
        .collect();
    reasons.sort();
    assert_eq!(reasons, ["besteffort", "late", "oversized"], "{reasons:?}");
    kubelet.assert_running();
}

/// Two of the manager's turns (10 s each), and time for the status to
/// reach the apiserver: before the fix such a pod was never evicted.
const TWO_TURNS: Duration = Duration::from_secs(30);

#[test]
fn writes_nested_forty_deep_are_counted_against_size_limits() {
    let fake = FakeApiServer::start();
    let ctd = PrivateContainerd::start();
    // The node's filesystem, so nothing lands on the host's disk.
    let root = ctd.dir().join(format!("tinylet-{NODE}")).join("root");
    let _tmpfs = Tmpfs::mount(&root, "128m");
    let kubeconfig = fake.node_kubeconfig(ctd.dir(), NODE);
    let mut kubelet = Tinylet::start_with(
        &ctd,
        NODE,
        &["--kubeconfig", &kubeconfig.display().to_string()],
    );
    assert_eq!(kubelet.root_dir(), root);

    // 40 MiB at the bottom of 40 nested directories, then a mark at the
    // top that the test waits for.
    let deep_writer =
        "d=/scratch; i=0; while [ $i -lt 40 ]; do d=$d/d; mkdir $d; i=$((i+1)); done; \
         dd if=/dev/zero of=$d/fill bs=1M count=40 && touch /scratch/written; exec sleep 100000";
    fake.create_pod(pod(
        "sized",
        deep_writer,
        json!({}),
        json!([{"name": "scratch", "emptyDir": {"sizeLimit": "20Mi"}}]),
    ));
    fake.create_pod(pod(
        "limited",
        deep_writer,
        json!({"limits": {"ephemeral-storage": "20Mi"}}),
        json!([{"name": "scratch", "emptyDir": {}}]),
    ));
    let written = |name: &str| {
        let uid = fake
            .pod("default", name)
            .and_then(|p| p["metadata"]["uid"].as_str().map(str::to_string))
            .unwrap_or_default();
        !uid.is_empty()
            && root
                .join("pods")
                .join(uid)
                .join("volumes/kubernetes.io~empty-dir/scratch/written")
                .exists()
    };
    let evicted = |name: &str| {
        fake.pod("default", name)
            .is_some_and(|p| status(&p, "reason") == "Evicted")
    };
    for name in ["sized", "limited"] {
        wait_until(SETTLE, &format!("{name} wrote its 40 MiB"), || {
            written(name) || evicted(name)
        });
    }
    for (name, message) in [
        (
            "sized",
            "Usage of EmptyDir volume \"scratch\" exceeds the limit \"20Mi\". ",
        ),
        (
            "limited",
            "Pod ephemeral local storage usage exceeds the total limit of containers 20Mi. ",
        ),
    ] {
        wait_until(TWO_TURNS, &format!("{name} is evicted"), || evicted(name));
        let p = fake.pod("default", name).unwrap();
        assert_eq!(status(&p, "phase"), "Failed", "{p:#}");
        assert_eq!(status(&p, "message"), message, "{p:#}");
        wait_until(SETTLE, &format!("{name} is stopped"), || ctd.pod_gone(name));
    }
    kubelet.assert_running();
}
