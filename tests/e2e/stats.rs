//! End-to-end tests of the statistics on a real, private containerd:
//! `/stats/summary` and `/metrics/resource` as tinylet's metrics module
//! renders them from the runtime's CRI stats, the pod sandbox's network
//! namespace, the pod's volume and log directories and the image
//! filesystem.

use std::path::Path;
use std::time::Duration;

use serde_json::Value;
use tinylet::cri::RemoteRuntime;
use tinylet::stats::{render_resource_metrics, stats_summary, NodeFacts};

use crate::e2e::{LONG_RUNNING, NODE, SETTLE};
use crate::support::containerd::{
    wait_until, write_manifest, PrivateContainerd, Tinylet, BUSYBOX_IMAGE, POD_UID_LABEL,
};

/// The text-format checker the unit tests use, shared by path.
#[allow(dead_code)]
#[path = "../../src/metrics/textformat.rs"]
pub(crate) mod textformat;

/// The pod named `name` in a summary.
fn pod<'a>(summary: &'a Value, name: &str) -> &'a Value {
    summary["pods"]
        .as_array()
        .and_then(|p| p.iter().find(|p| p["podRef"]["name"] == name))
        .unwrap_or_else(|| panic!("no pod {name} in the summary: {summary:#}"))
}

fn container<'a>(pod: &'a Value, name: &str) -> &'a Value {
    pod["containers"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["name"] == name))
        .unwrap_or_else(|| panic!("no container {name} in {pod:#}"))
}

fn num(v: &Value, what: &str) -> u64 {
    v.as_u64()
        .unwrap_or_else(|| panic!("{what} is not a number: {v}"))
}

/// A running pod with an emptyDir and a log line, and a hostNetwork pod:
/// the summary lists the pod with its UID, its container's CPU, memory,
/// logs and writable layer, the pod's own network (eth0 of its sandbox's
/// namespace, none for the hostNetwork pod), its volume and ephemeral
/// storage; a second summary has CPU rates; the image filesystem is there
/// only when asked for; the resource metrics have the container's series.
#[test]
fn stats_summary_and_resource_metrics_on_containerd() {
    let ctd = PrivateContainerd::start();
    let logs = ctd.dir().join("pod-logs");
    std::fs::create_dir_all(&logs).unwrap_or_else(|e| panic!("{}: {e}", logs.display()));
    let logs_flag = logs.display().to_string();
    let kubelet = Tinylet::start_with(&ctd, NODE, &["--pod-logs-dir", &logs_flag]);
    let dir = kubelet.manifest_dir();
    let script = format!(
        "echo stats-log-line; dd if=/dev/zero of=/scratch/blob bs=1024 count=256 2>/dev/null; \
         touch /scratch/done; {LONG_RUNNING}"
    );
    write_manifest(
        &dir,
        "stats.yaml",
        &format!(
            r#"apiVersion: v1
kind: Pod
metadata:
  name: stats
spec:
  terminationGracePeriodSeconds: 2
  containers:
  - name: app
    image: {BUSYBOX_IMAGE}
    imagePullPolicy: IfNotPresent
    command: ["sh", "-c", {script:?}]
    volumeMounts:
    - name: scratch
      mountPath: /scratch
  volumes:
  - name: scratch
    emptyDir: {{}}
"#
        ),
    );
    write_manifest(
        &dir,
        "host.yaml",
        &format!(
            r#"apiVersion: v1
kind: Pod
metadata:
  name: host
spec:
  hostNetwork: true
  terminationGracePeriodSeconds: 2
  containers:
  - name: app
    image: {BUSYBOX_IMAGE}
    imagePullPolicy: IfNotPresent
    command: ["sh", "-c", {LONG_RUNNING:?}]
"#
        ),
    );
    let stats_pod = kubelet.pod_name("stats");
    let host_pod = kubelet.pod_name("host");
    wait_until(SETTLE, "pods stats and host run", || {
        ctd.pod_running(&stats_pod, &["app"]) && ctd.pod_running(&host_pod, &["app"])
    });
    let sandbox = ctd.sandbox_ids(&stats_pod)[0].clone();
    let uid = ctd
        .object(&sandbox)
        .map(|o| o.label(POD_UID_LABEL).to_string())
        .unwrap_or_else(|| panic!("no sandbox {sandbox}"));
    let root = kubelet.root_dir();
    let volume = root.join(format!(
        "pods/{uid}/volumes/kubernetes.io~empty-dir/scratch"
    ));
    wait_until(SETTLE, "the container wrote its blob", || {
        volume.join("done").exists()
    });

    let cri = RemoteRuntime::new(&ctd.endpoint(), Duration::from_secs(30))
        .unwrap_or_else(|e| panic!("CRI client for {}: {e}", ctd.endpoint()));
    let facts = NodeFacts {
        node_name: NODE,
        root_dir: &root,
        images: Some(&cri),
        proc_root: Path::new("/proc"),
        logs_dir: &logs,
    };
    let summary = |facts: &NodeFacts| -> Value {
        let text = stats_summary(&cri, facts).unwrap_or_else(|e| panic!("stats summary: {e}"));
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("summary is not JSON ({e}): {text}"))
    };
    let v = summary(&facts);
    assert_eq!(v["node"]["nodeName"], NODE);
    assert!(
        num(
            &v["node"]["runtime"]["imageFs"]["capacityBytes"],
            "imageFs capacity"
        ) > 0,
        "{:#}",
        v["node"]
    );

    let p = pod(&v, &stats_pod);
    assert_eq!(p["podRef"]["namespace"], "default");
    assert_eq!(p["podRef"]["uid"], uid.as_str());
    let app = container(p, "app");
    assert!(num(&app["memory"]["workingSetBytes"], "working set") > 0);
    assert!(num(&app["cpu"]["usageCoreNanoSeconds"], "CPU usage") > 0);
    // The log line and nothing of the volume's: a few hundred bytes in a
    // block or two.
    let log_bytes = num(&app["logs"]["usedBytes"], "logs usedBytes");
    assert!(log_bytes > 0 && log_bytes < 1 << 20, "{app:#}");

    // The sandbox's own namespace: eth0 alone, not the node's interfaces.
    let net = &p["network"];
    assert_eq!(net["name"], "eth0", "{p:#}");
    let names: Vec<&str> = net["interfaces"]
        .as_array()
        .unwrap_or_else(|| panic!("no interfaces: {net}"))
        .iter()
        .filter_map(|i| i["name"].as_str())
        .collect();
    assert_eq!(names, ["eth0"], "{net}");
    let host = pod(&v, &host_pod);
    assert!(host.get("network").is_none(), "hostNetwork: {host:#}");

    let vols = p["volume"]
        .as_array()
        .unwrap_or_else(|| panic!("no volumes: {p:#}"));
    let scratch = vols
        .iter()
        .find(|v| v["name"] == "scratch")
        .unwrap_or_else(|| panic!("no volume scratch: {p:#}"));
    let used = num(&scratch["usedBytes"], "volume usedBytes");
    assert!(used >= 256 << 10, "{scratch}");
    // The dir, blob and done.
    assert!(
        num(&scratch["inodesUsed"], "volume inodesUsed") >= 3,
        "{scratch}"
    );
    assert!(num(&scratch["capacityBytes"], "volume capacity") > 0);
    let eph = num(&p["ephemeral-storage"]["usedBytes"], "ephemeral usedBytes");
    assert!(eph >= used + log_bytes, "{p:#}");

    // A rate needs a previous sample at an earlier time.
    std::thread::sleep(Duration::from_millis(1500));
    let v = summary(&facts);
    let app = container(pod(&v, &stats_pod), "app");
    num(&app["cpu"]["usageNanoCores"], "usageNanoCores");

    let no_images = NodeFacts {
        images: None,
        ..facts
    };
    let v = summary(&no_images);
    assert!(v["node"].get("runtime").is_none(), "{:#}", v["node"]);

    let mut page = String::new();
    render_resource_metrics(&cri, &mut page).unwrap_or_else(|e| panic!("resource metrics: {e}"));
    let samples = textformat::parse(&page).unwrap_or_else(|e| panic!("{e}\n{page}"));
    let ws = samples
        .iter()
        .find(|s| {
            s.name == "container_memory_working_set_bytes"
                && [
                    ("container", "app"),
                    ("pod", stats_pod.as_str()),
                    ("namespace", "default"),
                ]
                .iter()
                .all(|(k, v)| s.labels.iter().any(|(a, b)| a == k && b == v))
        })
        .unwrap_or_else(|| panic!("no working set of app in:\n{page}"));
    assert!(ws.value > 0.0, "{page}");
}
