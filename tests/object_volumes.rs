//! Secret, configMap and downwardAPI volumes that follow their objects,
//! against the fake apiserver and the fake runtime: the files on the host
//! change with the objects under each `configMapAndSecretChangeDetectionStrategy`
//! (Watch: one watch per object and no GETs; Get: a GET per sync; Cache: a
//! GET per TTL), and downwardAPI files follow the pod's labels. A pod that
//! references 1,100 ConfigMaps takes neither the node's threads nor its
//! file descriptors.

use std::fs;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::cluster::{api_pod, condition, mount_of, Cluster};
use crate::support::agent::running_containers;
use crate::support::fake_apiserver::{FakeApiServer, KubeconfigAuth};

const CM_PATH: &str = "/api/v1/namespaces/default/configmaps/cfg";
const SECRET_PATH: &str = "/api/v1/namespaces/default/secrets/creds";

/// A pod mounting ConfigMap `cfg` at /cfg, Secret `creds` at /creds and
/// its labels at /info.
fn pod_with_objects(name: &str) -> Value {
    let mut pod = api_pod(name);
    pod["metadata"]["labels"] = json!({"tier": "web"});
    pod["spec"]["volumes"] = json!([
        {"name": "cfg", "configMap": {"name": "cfg"}},
        {"name": "creds", "secret": {"secretName": "creds"}},
        {"name": "info", "downwardAPI": {"items": [
            {"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}}]}},
    ]);
    pod["spec"]["containers"][0]["volumeMounts"] = json!([
        {"name": "cfg", "mountPath": "/cfg"},
        {"name": "creds", "mountPath": "/creds"},
        {"name": "info", "mountPath": "/info"},
    ]);
    pod
}

fn host_file(c: &Cluster, mount: &str, file: &str) -> String {
    mount_of(&c.cri, "app", mount)
        .map(|m| fs::read_to_string(PathBuf::from(&m.host_path).join(file)).unwrap_or_default())
        .unwrap_or_default()
}

/// A config file that sets the strategy.
fn strategy_config(dir: &tempfile::TempDir, strategy: &str) -> String {
    let path = dir.path().join("kubelet.yaml");
    fs::write(
        &path,
        format!(
            "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n\
             configMapAndSecretChangeDetectionStrategy: {strategy}\n"
        ),
    )
    .unwrap();
    path.display().to_string()
}

fn watches_of(api: &FakeApiServer, path: &str) -> usize {
    api.requests()
        .iter()
        .filter(|r| {
            r.verb == "GET"
                && r.path == path
                && r.query.contains("watch=true")
                && r.query.contains("metadata.name")
        })
        .count()
}

fn start_pod(c: &mut Cluster) {
    c.api.create_config_map("default", "cfg", &[("k", "one")]);
    c.api.create_secret("default", "creds", &[("p", "s1")]);
    c.api.create_pod(pod_with_objects("objs"));
    c.wait_running("objs");
    assert_eq!(host_file(c, "/cfg", "k"), "one");
    assert_eq!(host_file(c, "/creds", "p"), "s1");
    assert_eq!(host_file(c, "/info", "labels"), "tier=\"web\"");
}

#[test]
fn watched_objects_and_labels_reach_the_files_without_gets_or_restarts() {
    // The default strategy; resyncs every minute, so what arrives within
    // the wait came through the watch.
    let mut c = Cluster::start(&[]);
    start_pod(&mut c);
    assert_eq!(c.api.count("GET", CM_PATH), 0, "no GET of the configmap");
    assert_eq!(c.api.count("GET", SECRET_PATH), 0, "no GET of the secret");
    assert_eq!(
        watches_of(&c.api, "/api/v1/namespaces/default/configmaps"),
        1
    );
    assert_eq!(watches_of(&c.api, "/api/v1/namespaces/default/secrets"), 1);

    assert!(c.api.update_config_map("default", "cfg", &[("k", "two")]));
    assert!(c.api.update_secret("default", "creds", &[("p", "s2")]));
    c.api.update_pod("default", "objs", |p| {
        p["metadata"]["labels"] = json!({"tier": "db"})
    });
    let mut seen = (String::new(), String::new(), String::new());
    let end = Instant::now() + Duration::from_secs(15);
    while Instant::now() < end {
        seen = (
            host_file(&c, "/cfg", "k"),
            host_file(&c, "/creds", "p"),
            host_file(&c, "/info", "labels"),
        );
        if seen == ("two".into(), "s2".into(), "tier=\"db\"".into()) {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(
        seen,
        ("two".into(), "s2".into(), "tier=\"db\"".into()),
        "{}",
        c.agent.log()
    );
    assert_eq!(c.api.count("GET", CM_PATH), 0, "still no GET");
    assert_eq!(c.api.count("GET", SECRET_PATH), 0, "still no GET");
    assert_eq!(c.cri.count("CreateContainer"), 1, "nothing restarted");
}

#[test]
fn get_reads_the_objects_at_every_sync() {
    let dir = tempfile::tempdir().unwrap();
    let config = strategy_config(&dir, "Get");
    let mut c = Cluster::start(&["--config", &config, "--sync-frequency", "1s"]);
    start_pod(&mut c);
    let before = c.api.count("GET", CM_PATH);
    assert!(before >= 1);
    let api = &c.api;
    c.agent.wait("a GET at each of three more syncs", || {
        api.count("GET", CM_PATH) >= before + 3
    });
    assert!(c.api.update_config_map("default", "cfg", &[("k", "two")]));
    let cri = &c.cri;
    c.agent.wait("the new content at a sync", || {
        mount_of(cri, "app", "/cfg").is_some_and(|m| {
            fs::read_to_string(PathBuf::from(&m.host_path).join("k")).unwrap_or_default() == "two"
        })
    });
    assert_eq!(
        watches_of(&c.api, "/api/v1/namespaces/default/configmaps"),
        0
    );
}

#[test]
fn cache_reads_the_objects_once_per_node_ttl() {
    let api = FakeApiServer::start();
    // The node's TTL annotation, as the TTL controller sets it.
    api.create_node(json!({"metadata": {"name": "edge-1",
        "annotations": {"node.alpha.kubernetes.io/ttl": "3"}}}));
    let dir = tempfile::tempdir().unwrap();
    let config = strategy_config(&dir, "Cache");
    let mut c = Cluster::start_with(
        api,
        KubeconfigAuth::token(),
        &["--config", &config, "--sync-frequency", "1s"],
    );
    start_pod(&mut c);
    // Syncs every second; GETs at most once per 3 s TTL.
    let start = Instant::now();
    let first = c.api.count("GET", CM_PATH);
    std::thread::sleep(Duration::from_secs(7));
    let gets = c.api.count("GET", CM_PATH) - first;
    let secs = start.elapsed().as_secs() as usize;
    assert!(gets >= 1, "the TTL ran out and the object was read again");
    assert!(
        gets + 2 <= secs,
        "fewer GETs than syncs: {gets} in {secs} s"
    );
    assert!(c.api.update_config_map("default", "cfg", &[("k", "two")]));
    let cri = &c.cri;
    c.agent.wait("the new content after the TTL", || {
        mount_of(cri, "app", "/cfg").is_some_and(|m| {
            fs::read_to_string(PathBuf::from(&m.host_path).join("k")).unwrap_or_default() == "two"
        })
    });
    assert_eq!(
        watches_of(&c.api, "/api/v1/namespaces/default/configmaps"),
        0
    );
}

#[test]
fn a_watch_that_fails_keeps_the_files_and_catches_up_when_it_is_back() {
    // Syncs every second, so volumes are computed again while the watch fails.
    let mut c = Cluster::start(&["--sync-frequency", "1s"]);
    start_pod(&mut c);
    // The watch is cut and refused twice (the Node authorizer's 403, as
    // while the pod's binding is not yet seen): the reflector backs off.
    c.api.fail_next(
        "GET",
        "/api/v1/namespaces/default/configmaps",
        403,
        "Forbidden",
        "configmaps \"cfg\" is forbidden: no relationship found",
        2,
    );
    c.api.drop_watches();
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(host_file(&c, "/cfg", "k"), "one", "the last files stay");
    assert_eq!(c.api.count("GET", CM_PATH), 0, "no GET instead");
    assert!(c.api.update_config_map("default", "cfg", &[("k", "two")]));
    let cri = &c.cri;
    c.agent.wait("the change once the watch is back", || {
        mount_of(cri, "app", "/cfg").is_some_and(|m| {
            fs::read_to_string(PathBuf::from(&m.host_path).join("k")).unwrap_or_default() == "two"
        })
    });
    let refused = c
        .api
        .requests()
        .iter()
        .filter(|r| r.path == "/api/v1/namespaces/default/configmaps" && r.status == 403)
        .count();
    assert_eq!(refused, 2, "the fault was hit");
}

/// Entries of a `/proc/<pid>/` directory (`task`: threads, `fd`: open files).
fn proc_entries(pid: u32, dir: &str) -> usize {
    fs::read_dir(format!("/proc/{pid}/{dir}"))
        .map(|d| d.count())
        .unwrap_or(0)
}

/// The most threads and open files a process was seen with.
#[derive(Default)]
struct Peak {
    threads: usize,
    files: usize,
}

impl Peak {
    fn sample(&mut self, pid: u32) {
        self.threads = self.threads.max(proc_entries(pid, "task"));
        self.files = self.files.max(proc_entries(pid, "fd"));
    }
}

/// The names of the threads of `pid` (as /proc shows them, 15 bytes).
fn thread_names(pid: u32) -> Vec<String> {
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("comm")).ok())
        .map(|n| n.trim_end().to_string())
        .collect()
}

#[test]
fn a_pod_referencing_1100_config_maps_takes_neither_the_threads_nor_the_files_of_the_node() {
    // One thread and one connection per referenced object let one
    // pod take the node's threads and file descriptors (and under systemd's
    // limit of 1024 files, every socket and accept after them).
    let mut c = Cluster::start(&[]);
    c.wait_node_ready();
    // Two of them exist: one among those watched (the first in order), one
    // among those read as under Cache.
    c.api
        .create_config_map("default", "cm-0", &[("FIRST", "watched")]);
    c.api
        .create_config_map("default", "cm-999", &[("LAST", "cached")]);
    let mut hog = api_pod("hog");
    hog["spec"]["containers"][0]["name"] = json!("hog");
    hog["spec"]["containers"][0]["envFrom"] = (0..1100)
        .map(|i| json!({"configMapRef": {"name": format!("cm-{i}"), "optional": true}}))
        .collect();
    c.api.create_pod(hog);
    let start = Instant::now();
    let pid = c.agent.pid().expect("running");
    let mut peak = Peak::default();
    let api = &c.api;
    c.agent.wait("the pod's objects are being read", || {
        peak.sample(pid);
        let reads = api
            .requests()
            .iter()
            .filter(|r| r.path.starts_with("/api/v1/namespaces/default/configmaps"))
            .count();
        reads >= 200
    });
    // Another pod starts meanwhile, as on any node.
    c.api.create_pod(api_pod("plain"));
    let cri = &c.cri;
    c.agent.wait("the other pod runs", || {
        peak.sample(pid);
        running_containers(cri, "plain") == 1
    });
    assert!(peak.threads < 150, "{} threads", peak.threads);
    assert!(peak.files < 300, "{} open files", peak.files);

    // The hog starts too, with what its objects hold (its GETs, at the
    // node's 50 requests a second through their own rate limiter, take
    // about 20 s).
    let end = Instant::now() + Duration::from_secs(90);
    while running_containers(&c.cri, "hog") != 1 {
        peak.sample(pid);
        assert!(c.agent.running(), "{}", c.agent.log());
        assert!(Instant::now() < end, "the hog never ran\n{}", c.agent.log());
        std::thread::sleep(Duration::from_millis(100));
    }
    let env = c.cri.container_env("hog").unwrap_or_default();
    for want in [("FIRST", "watched"), ("LAST", "cached")] {
        assert!(
            env.iter().any(|(k, v)| (k.as_str(), v.as_str()) == want),
            "{want:?} not in {env:?}"
        );
    }
    peak.sample(pid);
    eprintln!(
        "at most {} threads and {} open files; the hog ran after {:.1} s",
        peak.threads,
        peak.files,
        start.elapsed().as_secs_f64()
    );
    assert!(peak.threads < 150, "{} threads", peak.threads);
    assert!(peak.files < 300, "{} open files", peak.files);
    assert_eq!(
        watches_of(&c.api, "/api/v1/namespaces/default/configmaps"),
        32,
        "the pod's bound on watches"
    );
    // The 32 watches share one thread.
    let names = thread_names(pid);
    let count = |p: &str| names.iter().filter(|n| n.starts_with(p)).count();
    assert_eq!(count("watch-mux"), 1, "{names:?}");
    assert!(count("reflector/") <= 2, "{names:?}");
    // It is told which objects are not watched, and why.
    let event = c
        .api
        .events()
        .into_iter()
        .find(|e| e["reason"] == "ObjectsNotWatched" && e["involvedObject"]["name"] == "hog")
        .expect("a warning event on the pod");
    assert_eq!(event["type"], "Warning");
    let message = event["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("1068 of the 1100 Secrets and ConfigMaps")
            && message.contains("configmap cm-")
            && message.contains("and 1058 more"),
        "{message}"
    );
    // The node is still Ready, its status current.
    let node = c.wait_node_ready();
    assert_eq!(condition(&node, "Ready")["status"], "True");
}
