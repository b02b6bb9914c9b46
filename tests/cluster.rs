//! The real `tinylet` binary as a cluster node: against the fake apiserver
//! (as node `edge-1` with its own credentials) and the fake CRI. Node
//! registration, status and lease, API pods with their status, graceful
//! deletion, watch recovery, admission, mirror pods, events, an apiserver
//! that is down or refuses, and the kubeconfig's credential kinds.

use std::fs;
use std::path::PathBuf;
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use serde_json::{json, Value};

use crate::support::agent::{running_containers, Agent};
use crate::support::containerd::write_manifest;
use crate::support::fake_apiserver::{
    FakeApiServer, KubeconfigAuth, RecordedRequest, FAKE_ROOT_CA, MIRROR_ANNOTATION,
    NODE_LEASE_NAMESPACE,
};
use crate::support::fake_cri::{FakeCri, EXIT_TERMINATED};

const NODE: &str = "edge-1";
const NODE_USER: &str = "system:node:edge-1";
const STATUS_PATH: &str = "/api/v1/nodes/edge-1/status";

/// The agent, its fake apiserver and fake runtime. The agent is declared
/// first so it is killed before the servers go.
pub(crate) struct Cluster {
    pub(crate) agent: Agent,
    pub(crate) api: FakeApiServer,
    pub(crate) cri: FakeCri,
    _dir: tempfile::TempDir,
}

impl Cluster {
    /// An agent joined to a plain-HTTP fake apiserver with a token.
    pub(crate) fn start(extra: &[&str]) -> Cluster {
        Cluster::start_with(FakeApiServer::start(), KubeconfigAuth::token(), extra)
    }

    pub(crate) fn start_with(api: FakeApiServer, auth: KubeconfigAuth, extra: &[&str]) -> Cluster {
        let cri = FakeCri::start();
        let dir = tempfile::Builder::new()
            .prefix("tinylet-kubeconfig")
            .tempdir()
            .expect("temp dir");
        let kubeconfig = api.write_kubeconfig(dir.path(), NODE_USER, auth);
        let kubeconfig = kubeconfig.display().to_string();
        let mut flags = vec![
            "--kubeconfig",
            kubeconfig.as_str(),
            "--node-status-update-frequency",
            "1s",
            "--node-lease-duration-seconds",
            "4",
        ];
        flags.extend_from_slice(extra);
        let agent = Agent::start(&cri.endpoint(), &flags);
        Cluster {
            agent,
            api,
            cri,
            _dir: dir,
        }
    }

    pub(crate) fn wait_node_ready(&mut self) -> Value {
        let api = &self.api;
        self.agent.wait("the Node is Ready", || {
            api.node(NODE)
                .is_some_and(|n| condition(&n, "Ready")["status"] == "True")
        });
        api.node(NODE).unwrap()
    }

    pub(crate) fn wait_pod(
        &mut self,
        name: &str,
        what: &str,
        mut f: impl FnMut(&Value) -> bool,
    ) -> Value {
        let api = &self.api;
        self.agent.wait(&format!("pod {name}: {what}"), || {
            api.pod("default", name).is_some_and(|p| f(&p))
        });
        api.pod("default", name).unwrap()
    }

    pub(crate) fn wait_running(&mut self, pod: &str) {
        let cri = &self.cri;
        self.agent.wait(&format!("{pod} runs in the runtime"), || {
            running_containers(cri, pod) == 1
        });
    }

    fn log_has(&mut self, what: &str, needles: &[&str]) {
        let path = self.agent.log_path();
        self.agent.wait(what, || {
            let log = fs::read_to_string(&path).unwrap_or_default();
            needles.iter().all(|n| log.contains(n))
        });
    }
}

/// The condition of `kind` in a Node's or Pod's status (Null if absent).
pub(crate) fn condition(obj: &Value, kind: &str) -> Value {
    obj["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["type"] == kind)
        .cloned()
        .unwrap_or(Value::Null)
}

/// A pod bound to edge-1 as a scheduler would leave it; no service account
/// token volume (the agent only mounts hostPath and emptyDir volumes).
pub(crate) fn api_pod(name: &str) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "nodeName": NODE,
            "automountServiceAccountToken": false,
            "terminationGracePeriodSeconds": 30,
            "containers": [{
                "name": "app",
                "image": "busybox:latest",
                "imagePullPolicy": "IfNotPresent",
                "command": ["sleep", "1000"],
            }],
        },
    })
}

fn static_pod(name: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\nspec:\n  terminationGracePeriodSeconds: 0\n  containers:\n  - name: app\n    image: busybox:latest\n    imagePullPolicy: IfNotPresent\n    command: [sleep, \"1000\"]\n"
    )
}

fn phase(pod: &Value) -> &str {
    pod["status"]["phase"].as_str().unwrap_or("")
}

fn requests_to(api: &FakeApiServer, verb: &str, path: &str) -> Vec<RecordedRequest> {
    api.requests()
        .into_iter()
        .filter(|r| r.verb == verb && r.path == path)
        .collect()
}

fn parse_time(v: &Value) -> Timestamp {
    v.as_str()
        .unwrap_or_else(|| panic!("not a time: {v}"))
        .parse()
        .unwrap_or_else(|e| panic!("bad time {v}: {e}"))
}

#[test]
fn node_registers_with_labels_and_status_and_registers_again_only_when_gone() {
    // A Node deleted meanwhile is noticed by the next status report: the node
    // does not read its Node between reports (no polling).
    let mut c = Cluster::start(&["--node-status-report-frequency", "3s"]);
    let node = c.wait_node_ready();
    let labels = &node["metadata"]["labels"];
    let arch = match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    };
    assert_eq!(labels["kubernetes.io/hostname"], NODE, "{node:#}");
    assert_eq!(labels["kubernetes.io/os"], "linux", "{node:#}");
    assert_eq!(labels["kubernetes.io/arch"], arch, "{node:#}");
    assert_eq!(labels["beta.kubernetes.io/os"], "linux", "{node:#}");
    assert_eq!(labels["beta.kubernetes.io/arch"], arch, "{node:#}");
    let status = &node["status"];
    for list in ["capacity", "allocatable"] {
        for r in ["cpu", "memory", "pods", "ephemeral-storage"] {
            let q = status[list][r].as_str().unwrap_or("");
            assert!(!q.is_empty(), "status.{list}.{r}: {node:#}");
        }
        assert_eq!(status[list]["pods"], "110", "{node:#}");
    }
    assert!(
        status["addresses"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|a| a["type"] == "Hostname" && a["address"] == NODE),
        "{node:#}"
    );
    let info = &status["nodeInfo"];
    let boot_id = fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap();
    assert_eq!(info["bootID"], boot_id.trim(), "{node:#}");
    let kernel = fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
    assert_eq!(info["kernelVersion"], kernel.trim(), "{node:#}");
    assert_eq!(
        info["containerRuntimeVersion"], "fake-cri://1.0.0",
        "{node:#}"
    );
    // The version the operator set (TINYLET_KUBELET_VERSION), as
    // `kubelet --version` prints it.
    assert_eq!(
        info["kubeletVersion"],
        crate::support::agent::REPORTED_VERSION,
        "{node:#}"
    );
    assert_eq!(condition(&node, "Ready")["reason"], "KubeletReady");
    let creates = requests_to(&c.api, "POST", "/api/v1/nodes");
    assert_eq!(creates.len(), 1, "{creates:?}");
    assert_eq!(
        (creates[0].user.as_str(), creates[0].status),
        (NODE_USER, 201)
    );
    let uid = node["metadata"]["uid"].as_str().unwrap().to_string();

    // A restarted agent finds its Node: 409, no second Node, no retry loop.
    c.agent.kill();
    c.api.clear_requests();
    c.agent.spawn();
    let api = &c.api;
    c.agent
        .wait("the restarted agent patches the existing Node", || {
            requests_to(api, "PATCH", STATUS_PATH)
                .iter()
                .any(|r| r.status == 200)
        });
    std::thread::sleep(Duration::from_secs(2));
    let creates = requests_to(&c.api, "POST", "/api/v1/nodes");
    assert_eq!(
        creates.iter().map(|r| r.status).collect::<Vec<_>>(),
        vec![409],
        "one create, refused as AlreadyExists"
    );
    assert_eq!(c.api.node(NODE).unwrap()["metadata"]["uid"], uid.as_str());

    // Deleted by the admin: registered again, as a new object, at the next
    // report; and nothing read the Node in between.
    let gets_before = c.api.count("GET", "/api/v1/nodes/");
    assert!(c.api.delete_node(NODE));
    let api = &c.api;
    c.agent.wait("the Node is registered again", || {
        api.node(NODE)
            .is_some_and(|n| n["metadata"]["uid"] != uid.as_str())
    });
    assert_eq!(
        c.api.count("GET", "/api/v1/nodes/"),
        gets_before,
        "the Node was read between reports"
    );
}

#[test]
fn node_status_is_patched_only_when_it_changes() {
    let mut c = Cluster::start(&[]);
    c.wait_node_ready();
    std::thread::sleep(Duration::from_millis(1500));
    let before = c.api.count("PATCH", STATUS_PATH);
    std::thread::sleep(Duration::from_secs(4));
    let after = c.api.count("PATCH", STATUS_PATH);
    assert!(
        after - before <= 1,
        "{} status patches in 4 s with nothing changed: {:#?}",
        after - before,
        requests_to(&c.api, "PATCH", STATUS_PATH)
    );

    c.cri.set_condition("NetworkReady", false);
    let api = &c.api;
    c.agent.wait("Ready False naming NetworkReady", || {
        api.node(NODE).is_some_and(|n| {
            let r = condition(&n, "Ready");
            r["status"] == "False"
                && r["reason"] == "KubeletNotReady"
                && r["message"]
                    .as_str()
                    .is_some_and(|m| m.contains("NetworkReady"))
        })
    });
    c.cri.set_condition("NetworkReady", true);
    c.wait_node_ready();
}

#[test]
fn node_lease_is_owned_by_the_node_and_renewed() {
    let mut c = Cluster::start(&[]);
    let node = c.wait_node_ready();
    let api = &c.api;
    c.agent.wait("the lease has its owner", || {
        api.lease(NODE)
            .is_some_and(|l| l["metadata"]["ownerReferences"].is_array())
    });
    let lease = c.api.lease(NODE).unwrap();
    assert_eq!(lease["metadata"]["namespace"], NODE_LEASE_NAMESPACE);
    assert_eq!(lease["spec"]["holderIdentity"], NODE, "{lease:#}");
    assert_eq!(lease["spec"]["leaseDurationSeconds"], 4, "{lease:#}");
    let owner = &lease["metadata"]["ownerReferences"][0];
    assert_eq!(
        (&owner["kind"], &owner["name"], &owner["uid"]),
        (&json!("Node"), &json!(NODE), &node["metadata"]["uid"]),
        "{lease:#}"
    );
    let first = parse_time(&lease["spec"]["renewTime"]);
    std::thread::sleep(Duration::from_secs(3));
    let later = parse_time(&c.api.lease(NODE).unwrap()["spec"]["renewTime"]);
    assert!(
        later > first,
        "renewTime did not advance in 3 s: {first} -> {later}"
    );
}

const LEASE_PATH: &str = "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/edge-1";

/// The node's requests on its lease so far.
fn lease_requests(api: &FakeApiServer) -> Vec<RecordedRequest> {
    api.requests()
        .into_iter()
        .filter(|r| r.path == LEASE_PATH)
        .collect()
}

/// A node Ready whose lease has the Node as its owner.
fn cluster_with_owned_lease() -> Cluster {
    let mut c = Cluster::start(&[]);
    c.wait_node_ready();
    let api = &c.api;
    c.agent.wait("the lease has its owner", || {
        api.lease(NODE)
            .is_some_and(|l| l["metadata"]["ownerReferences"].is_array())
    });
    c
}

#[test]
fn lease_renewals_are_merge_patches_of_the_renew_time_alone() {
    let mut c = cluster_with_owned_lease();
    let api = &c.api;
    let owned_at = lease_requests(api).len();
    c.agent.wait("three more renewals", || {
        lease_requests(api).len() >= owned_at + 3
    });
    let renewals = &lease_requests(&c.api)[owned_at..];
    for r in renewals {
        assert_eq!(
            (r.verb.as_str(), r.content_type.as_str(), r.status),
            ("PATCH", "application/merge-patch+json", 200),
            "{r:?}"
        );
        // The answer in protobuf, a third of the JSON one's bytes.
        assert_eq!(
            r.accept, "application/vnd.kubernetes.protobuf, application/json",
            "{r:?}"
        );
        let patch: Value = serde_json::from_str(&r.body).unwrap();
        let spec = patch["spec"].as_object().expect("a spec");
        assert_eq!(
            (patch.as_object().unwrap().len(), spec.len()),
            (1, 1),
            "only spec.renewTime: {patch}"
        );
        parse_time(&spec["renewTime"]);
    }
    assert_eq!(
        c.api.count("PUT", LEASE_PATH),
        0,
        "no full PUT of the lease"
    );
}

/// A renewal's answer comes in protobuf; what it says of the holder and
/// the duration is read from it: a lease another writer took is patched
/// back whole at the next renewal, and then by renewTime alone again.
#[test]
fn a_lease_changed_by_another_writer_is_set_right_from_the_protobuf_answer() {
    let mut c = cluster_with_owned_lease();
    let api = &c.api;
    assert!(api.update_lease(NODE, |l| {
        l["spec"]["holderIdentity"] = json!("someone-else");
        l["spec"]["leaseDurationSeconds"] = json!(99);
    }));
    let changed_at = lease_requests(api).len();
    c.agent.wait("the lease held by the node again", || {
        api.lease(NODE).is_some_and(|l| {
            l["spec"]["holderIdentity"] == NODE && l["spec"]["leaseDurationSeconds"] == 4
        })
    });
    c.agent.wait("two more renewals", || {
        lease_requests(api).len() >= changed_at + 4
    });
    let patches: Vec<Value> = lease_requests(api)[changed_at..]
        .iter()
        .filter(|r| r.verb == "PATCH")
        .map(|r| serde_json::from_str(&r.body).unwrap())
        .collect();
    let fixing = patches
        .iter()
        .position(|p| p["spec"]["holderIdentity"] == NODE)
        .unwrap_or_else(|| panic!("no patch set the holder: {patches:?}"));
    assert_eq!(
        patches[fixing]["spec"]["leaseDurationSeconds"], 4,
        "{patches:?}"
    );
    // The first renewal after the change learnt of it from its answer; the
    // one that fixed it is the last to carry more than renewTime.
    assert!(fixing <= 1, "{patches:?}");
    for p in &patches[fixing + 1..] {
        assert_eq!(p["spec"].as_object().unwrap().len(), 1, "{patches:?}");
    }
    assert_eq!(c.api.count("PUT", LEASE_PATH), 0, "no PUT of the lease");
}

#[test]
fn a_server_that_refuses_lease_patches_gets_puts_said_once() {
    let api = FakeApiServer::start();
    // As a server (or a proxy before it) that does not take this patch type.
    api.fail_next(
        "PATCH",
        LEASE_PATH,
        415,
        "UnsupportedMediaType",
        "415: Unsupported Media Type",
        1000,
    );
    let mut c = Cluster::start_with(api, KubeconfigAuth::token(), &[]);
    c.wait_node_ready();
    let api = &c.api;
    c.agent.wait("three renewals by PUT", || {
        api.count("PUT", LEASE_PATH) >= 3
    });
    let verbs: Vec<(String, u16)> = lease_requests(&c.api)
        .into_iter()
        .map(|r| (r.verb, r.status))
        .collect();
    // The read that found no lease (then created in the collection), the
    // one refused patch, and PUTs only from then on.
    let pair = |v: &str, s: u16| (v.to_string(), s);
    assert_eq!(
        verbs[..2],
        [pair("GET", 404), pair("PATCH", 415)],
        "{verbs:?}"
    );
    assert!(
        verbs[2..].iter().all(|r| *r == pair("PUT", 200)),
        "{verbs:?}"
    );
    let renewed = c.api.lease(NODE).unwrap();
    assert_eq!(renewed["spec"]["holderIdentity"], NODE);
    let log = c.agent.log();
    assert_eq!(
        log.matches("renewing it by PUT from now on").count(),
        1,
        "said once: {log}"
    );
}

#[test]
fn api_pod_runs_and_reports_its_status_and_crash_loop() {
    let mut c = Cluster::start(&[]);
    c.wait_node_ready();
    c.api.create_pod(api_pod("web"));
    c.wait_running("web");
    let pod = c.wait_pod("web", "Running and ready", |p| {
        phase(p) == "Running" && p["status"]["containerStatuses"][0]["ready"] == true
    });
    let id = c.cri.containers_named("app")[0].id.clone();
    let cs = &pod["status"]["containerStatuses"][0];
    assert_eq!(cs["containerID"], format!("fake-cri://{id}"), "{pod:#}");
    assert_eq!(cs["restartCount"], 0, "{pod:#}");
    assert!(cs["state"]["running"]["startedAt"].is_string(), "{pod:#}");
    let sandbox_ip = c.cri.sandboxes()[0]
        .network
        .as_ref()
        .map(|n| n.ip.clone())
        .unwrap_or_default();
    assert!(!sandbox_ip.is_empty());
    assert_eq!(pod["status"]["podIP"], sandbox_ip.as_str(), "{pod:#}");
    assert!(
        pod["status"]["hostIP"]
            .as_str()
            .is_some_and(|ip| !ip.is_empty()),
        "{pod:#}"
    );
    assert_eq!(condition(&pod, "Ready")["status"], "True", "{pod:#}");
    let patches = requests_to(
        &c.api,
        "PATCH",
        "/api/v1/namespaces/default/pods/web/status",
    );
    assert!(patches.iter().all(|r| r.user == NODE_USER), "{patches:?}");

    // A crash: restarted at once, counted.
    c.cri.exit_container(&id, 3);
    c.wait_pod("web", "restartCount 1", |p| {
        p["status"]["containerStatuses"][0]["restartCount"] == 1
    });
    let cri = &c.cri;
    c.agent.wait("the second container runs", || {
        running_containers(cri, "web") == 1
    });
    let second = c
        .cri
        .containers_named("app")
        .into_iter()
        .find(|s| s.id != id && s.finished_at == 0)
        .map(|s| s.id)
        .unwrap();
    // A second crash falls in the back-off window.
    c.cri.exit_container(&second, 3);
    let pod = c.wait_pod("web", "waiting in CrashLoopBackOff", |p| {
        p["status"]["containerStatuses"][0]["state"]["waiting"]["reason"] == "CrashLoopBackOff"
    });
    let cs = &pod["status"]["containerStatuses"][0];
    assert!(cs["restartCount"].as_u64() >= Some(1), "{pod:#}");
    assert_eq!(cs["lastState"]["terminated"]["exitCode"], 3, "{pod:#}");
    assert_eq!(cs["ready"], false, "{pod:#}");
}

#[test]
fn graceful_deletion_stops_reports_then_deletes_with_uid_precondition() {
    let mut c = Cluster::start(&[]);
    c.wait_node_ready();
    let created = c.api.create_pod(api_pod("web"));
    let uid = created["metadata"]["uid"].as_str().unwrap().to_string();
    c.wait_running("web");
    c.wait_pod("web", "Running", |p| phase(p) == "Running");
    let id = c.cri.containers_named("app")[0].id.clone();
    c.api.clear_requests();

    let deleting = c.api.delete_pod("default", "web", Some(30)).unwrap();
    assert!(deleting["metadata"]["deletionTimestamp"].is_string());
    let api = &c.api;
    c.agent.wait("the pod object is gone", || {
        api.pod("default", "web").is_none()
    });
    assert_eq!(c.cri.stop_timeouts(), vec![(id.clone(), 30)]);

    let reqs = c.api.requests();
    let pos = |f: &dyn Fn(&RecordedRequest) -> bool| reqs.iter().position(f);
    let delete = pos(&|r| r.verb == "DELETE" && r.path == "/api/v1/namespaces/default/pods/web")
        .unwrap_or_else(|| panic!("no DELETE: {reqs:#?}"));
    let del = &reqs[delete];
    assert_eq!((del.user.as_str(), del.status), (NODE_USER, 200), "{del:?}");
    let body: Value = serde_json::from_str(&del.body).unwrap();
    assert_eq!(body["gracePeriodSeconds"], 0, "{body}");
    assert_eq!(body["preconditions"]["uid"], uid.as_str(), "{body}");
    let terminated = pos(&|r| {
        r.verb == "PATCH"
            && r.path == "/api/v1/namespaces/default/pods/web/status"
            && r.status == 200
            && serde_json::from_str::<Value>(&r.body).is_ok_and(|b| {
                b.pointer("/status/containerStatuses/0/state/terminated/exitCode")
                    == Some(&json!(EXIT_TERMINATED))
            })
    })
    .unwrap_or_else(|| panic!("no status patch with the terminated container: {reqs:#?}"));
    assert!(
        terminated < delete,
        "the terminated status must be sent before the DELETE: {reqs:#?}"
    );
    assert_eq!(
        reqs.iter()
            .filter(|r| r.verb == "DELETE" && r.user == NODE_USER)
            .count(),
        1,
        "{reqs:#?}"
    );
    let cri = &c.cri;
    c.agent
        .wait("the sandbox is removed", || cri.sandboxes().is_empty());
}

/// Pod lists (not watches) the agent sent.
fn pod_lists(api: &FakeApiServer) -> usize {
    api.requests()
        .iter()
        .filter(|r| r.verb == "GET" && r.path == "/api/v1/pods" && !r.query.contains("watch="))
        .count()
}

#[test]
fn pods_created_after_a_compaction_or_a_cut_watch_still_run() {
    let mut c = Cluster::start(&[]);
    c.api.create_pod(api_pod("a"));
    c.wait_running("a");

    // A pod written while the agent cannot see it, then the history is
    // compacted: the watch from the agent's resourceVersion gets 410 Gone
    // and the agent lists again.
    let lists = pod_lists(&c.api);
    c.api.set_down(true);
    c.api.create_pod(api_pod("b"));
    c.api.compact();
    c.api.drop_watches();
    c.api.set_down(false);
    c.wait_running("b");
    assert!(pod_lists(&c.api) > lists, "no list after the 410");

    // A watch cut mid-stream: watched again from where it was.
    c.api.drop_watches();
    c.api.create_pod(api_pod("c"));
    c.wait_running("c");
}

fn wait_rejected(c: &mut Cluster, name: &str, reason: &str) -> Value {
    let pod = c.wait_pod(name, &format!("Failed {reason}"), |p| {
        phase(p) == "Failed" && p["status"]["reason"] == reason
    });
    assert!(
        pod["status"]["message"]
            .as_str()
            .is_some_and(|m| !m.is_empty()),
        "{pod:#}"
    );
    let api = &c.api;
    c.agent.wait(&format!("an event {reason} for {name}"), || {
        api.events().iter().any(|e| {
            e["reason"] == reason && e["involvedObject"]["name"] == name && e["type"] == "Warning"
        })
    });
    assert!(
        !c.cri
            .calls_to("RunPodSandbox")
            .contains(&format!("default/{name}")),
        "a rejected pod never runs: {:?}",
        c.cri.calls()
    );
    pod
}

#[test]
fn admission_rejects_pods_that_do_not_fit() {
    let mut c = Cluster::start(&[]);
    c.wait_node_ready();
    let mut big = api_pod("big");
    big["spec"]["containers"][0]["resources"] = json!({"requests": {"cpu": "1000"}});
    c.api.create_pod(big);
    wait_rejected(&mut c, "big", "OutOfcpu");

    let mut ssd = api_pod("ssd");
    ssd["spec"]["nodeSelector"] = json!({"disk": "ssd"});
    c.api.create_pod(ssd);
    wait_rejected(&mut c, "ssd", "NodeAffinity");

    let ported = |name: &str| {
        let mut p = api_pod(name);
        p["spec"]["containers"][0]["ports"] = json!([{"containerPort": 80, "hostPort": 8080}]);
        p
    };
    c.api.create_pod(ported("first"));
    c.wait_running("first");
    c.api.create_pod(ported("second"));
    wait_rejected(&mut c, "second", "NodePorts");
    assert_eq!(running_containers(&c.cri, "first"), 1);
}

/// An API pod whose volume name would become a path outside the pod's
/// directory is refused before anything is made for it: Failed with
/// FailedValidation and the field named, a warning event, never run; a
/// good pod beside it runs.
#[test]
fn an_api_pod_with_a_volume_name_that_is_a_path_is_refused_with_the_field() {
    let mut c = Cluster::start(&[]);
    c.wait_node_ready();
    let mut bad = api_pod("badvol");
    bad["spec"]["volumes"] = json!([{"name": "../../x", "emptyDir": {}}]);
    bad["spec"]["containers"][0]["volumeMounts"] = json!([{"name": "../../x", "mountPath": "/x"}]);
    c.api.create_pod(bad);
    let pod = wait_rejected(&mut c, "badvol", "FailedValidation");
    let message = pod["status"]["message"].as_str().unwrap_or("");
    assert!(message.contains("spec.volumes[0].name"), "{pod:#}");
    c.api.create_pod(api_pod("good"));
    c.wait_running("good");
}

#[test]
fn max_pods_rejects_the_pod_beyond_it() {
    let mut c = Cluster::start(&["--max-pods", "1"]);
    let node = c.wait_node_ready();
    assert_eq!(node["status"]["capacity"]["pods"], "1", "{node:#}");
    c.api.create_pod(api_pod("one"));
    c.wait_running("one");
    c.api.create_pod(api_pod("two"));
    wait_rejected(&mut c, "two", "OutOfpods");
    assert_eq!(running_containers(&c.cri, "one"), 1);
}

#[test]
fn static_pod_gets_a_mirror_pod_that_is_kept_and_removed_with_it() {
    let mut c = Cluster::start(&[]);
    let node = c.wait_node_ready();
    write_manifest(&c.agent.manifests(), "web.yaml", &static_pod("web"));
    c.wait_running("web-edge-1");
    let hash = c.cri.sandboxes()[0]
        .labels
        .get("io.kubernetes.pod.uid")
        .cloned()
        .unwrap();
    let mirror = c.wait_pod("web-edge-1", "the mirror pod is Running", |p| {
        phase(p) == "Running"
    });
    assert_eq!(
        mirror["metadata"]["annotations"][MIRROR_ANNOTATION],
        hash.as_str(),
        "{mirror:#}"
    );
    assert_eq!(mirror["spec"]["nodeName"], NODE);
    let owner = &mirror["metadata"]["ownerReferences"][0];
    assert_eq!(
        (
            &owner["kind"],
            &owner["name"],
            &owner["uid"],
            &owner["controller"]
        ),
        (
            &json!("Node"),
            &json!(NODE),
            &node["metadata"]["uid"],
            &json!(true)
        ),
        "{mirror:#}"
    );
    let created = requests_to(&c.api, "POST", "/api/v1/namespaces/default/pods");
    assert!(
        created
            .iter()
            .all(|r| r.user == NODE_USER && r.status == 201),
        "{created:?}"
    );

    // Deleted by the admin: created again.
    let old = mirror["metadata"]["uid"].clone();
    c.api.delete_pod("default", "web-edge-1", Some(0));
    c.wait_pod("web-edge-1", "a new mirror pod", |p| {
        p["metadata"]["uid"] != old
    });
    // The mirror pod itself never runs; the static pod was not restarted.
    assert_eq!(
        c.cri.calls_to("RunPodSandbox"),
        vec!["default/web-edge-1".to_string()]
    );
    assert_eq!(running_containers(&c.cri, "web-edge-1"), 1);

    fs::remove_file(c.agent.manifests().join("web.yaml")).unwrap();
    let api = &c.api;
    c.agent.wait("the mirror pod is deleted", || {
        api.pod("default", "web-edge-1").is_none()
    });
    let cri = &c.cri;
    c.agent
        .wait("the static pod is torn down", || cri.sandboxes().is_empty());
}

/// A status field the server has but tinylet does not want (left there by
/// an earlier writer) goes at the next status change: the mirror pod's
/// patch has nothing to diff against, so tinylet patches again against the
/// PATCH answer.
#[test]
fn a_status_field_left_on_the_server_is_patched_away() {
    let mut c = Cluster::start(&[]);
    c.wait_node_ready();
    write_manifest(&c.agent.manifests(), "web.yaml", &static_pod("web"));
    c.wait_running("web-edge-1");
    c.wait_pod("web-edge-1", "the mirror pod is Running", |p| {
        phase(p) == "Running"
    });
    assert!(c.api.update_pod("default", "web-edge-1", |p| {
        p["status"]["message"] = json!("left by an earlier writer");
        p["status"]["reason"] = json!("Stale");
    }));

    // A status change: the container exits and is started again.
    let id = c.cri.containers_named("app")[0].id.clone();
    c.cri.exit_container(&id, 1);
    let pod = c.wait_pod("web-edge-1", "restarted, without the stale fields", |p| {
        p["status"]["containerStatuses"][0]["restartCount"] == 1
            && p["status"].get("message").is_none()
            && p["status"].get("reason").is_none()
    });
    assert_eq!(phase(&pod), "Running", "{pod:#}");
    assert!(
        c.agent
            .log()
            .contains("the server's status still differs; patching against it"),
        "{}",
        c.agent.log()
    );
}

#[test]
fn kubelet_events_are_posted_for_the_node_and_pods() {
    let mut c = Cluster::start(&[]);
    c.api.create_pod(api_pod("web"));
    c.wait_running("web");
    let from_kubelet =
        |e: &Value| e["source"]["component"] == "kubelet" && e["source"]["host"] == NODE;
    let api = &c.api;
    c.agent
        .wait("Created, Started and the node's Starting", || {
            let events = api.events();
            let about = |kind: &str, name: &str, reason: &str| {
                events.iter().any(|e| {
                    from_kubelet(e)
                        && e["involvedObject"]["kind"] == kind
                        && e["involvedObject"]["name"] == name
                        && e["reason"] == reason
                })
            };
            about("Pod", "web", "Created")
                && about("Pod", "web", "Started")
                && about("Node", NODE, "Starting")
        });
    let started = c
        .api
        .events()
        .into_iter()
        .find(|e| e["reason"] == "Started" && e["involvedObject"]["name"] == "web")
        .unwrap();
    assert_eq!(
        started["involvedObject"]["fieldPath"], "spec.containers{app}",
        "{started:#}"
    );
    assert_eq!(started["metadata"]["namespace"], "default");

    // The same event again is counted on the same object, not posted anew.
    let id = c.cri.containers_named("app")[0].id.clone();
    c.cri.exit_container(&id, 1);
    let api = &c.api;
    c.agent.wait("Started counted twice", || {
        api.events().iter().any(|e| {
            e["reason"] == "Started" && e["involvedObject"]["name"] == "web" && e["count"] == 2
        })
    });
    let started: Vec<Value> = c
        .api
        .events()
        .into_iter()
        .filter(|e| e["reason"] == "Started" && e["involvedObject"]["name"] == "web")
        .collect();
    assert_eq!(started.len(), 1, "{started:#?}");
}

#[test]
fn apiserver_down_at_start_is_retried_and_static_pods_run_meanwhile() {
    let api = FakeApiServer::start();
    api.set_down(true);
    let mut c = Cluster::start_with(api, KubeconfigAuth::token(), &[]);
    write_manifest(&c.agent.manifests(), "web.yaml", &static_pod("web"));
    c.wait_running("web-edge-1");
    c.log_has(
        "a registration retry is logged",
        &["unable to register node"],
    );
    assert!(c.api.node(NODE).is_none());
    c.api.create_pod(api_pod("api"));

    c.api.set_down(false);
    c.wait_node_ready();
    c.wait_running("api");
    c.wait_pod("web-edge-1", "the mirror pod", |_| true);
}

fn registers_with(api: FakeApiServer, auth: KubeconfigAuth) {
    let mut c = Cluster::start_with(api, auth, &[]);
    c.wait_node_ready();
    let reqs = requests_to(&c.api, "POST", "/api/v1/nodes");
    assert_eq!(reqs[0].user, NODE_USER, "{reqs:?}");
}

#[test]
fn kubeconfig_with_a_token_file() {
    registers_with(FakeApiServer::start(), KubeconfigAuth::token_file());
}

#[test]
fn kubeconfig_with_client_certificate_files_over_tls() {
    registers_with(
        FakeApiServer::start_tls(),
        KubeconfigAuth::client_cert_files(),
    );
}

#[test]
fn kubeconfig_with_client_certificate_data_over_tls() {
    registers_with(
        FakeApiServer::start_tls(),
        KubeconfigAuth::client_cert_data(),
    );
}

/// A TLS cluster whose node has renewed its lease at least `n` times.
fn tls_cluster_renewed(api: FakeApiServer, n: usize) -> Cluster {
    let mut c = Cluster::start_with(api, KubeconfigAuth::client_cert_files(), &[]);
    c.wait_node_ready();
    wait_renewals(&mut c, n);
    c
}

/// The node's lease renewals (PATCHes) so far.
fn renewals(api: &FakeApiServer) -> Vec<RecordedRequest> {
    lease_requests(api)
        .into_iter()
        .filter(|r| r.verb == "PATCH")
        .collect()
}

fn wait_renewals(c: &mut Cluster, n: usize) {
    let api = &c.api;
    c.agent
        .wait(&format!("{n} lease renewals"), || renewals(api).len() >= n);
}

/// Heartbeats go over HTTP/2: every lease renewal and node status patch
/// once the connection is open (a heartbeat that comes while the first
/// connection is being made goes over HTTP/1.1 rather than wait).
#[test]
fn heartbeats_go_over_http2_and_lists_and_watches_over_http1() {
    let mut c = tls_cluster_renewed(FakeApiServer::start_tls(), 3);
    // A change of status: the node is no longer Ready.
    c.cri.set_condition("NetworkReady", false);
    let api = &c.api;
    c.agent.wait("a node status patch", || {
        api.count("PATCH", STATUS_PATH) > 0
    });
    let reqs = c.api.requests();
    let on = |r: &RecordedRequest| format!("{} {}?{} h2={}", r.verb, r.path, r.query, r.http2);
    let status: Vec<_> = reqs
        .iter()
        .filter(|r| r.verb == "PATCH" && r.path == STATUS_PATH)
        .collect();
    for r in renewals(&c.api).iter().skip(1).chain(status) {
        assert!(r.http2 && r.status < 300, "{}", on(r));
    }
    let watches: Vec<_> = reqs.iter().filter(|r| r.query.contains("watch=")).collect();
    assert!(!watches.is_empty());
    for r in watches {
        assert!(!r.http2, "{}", on(r));
    }
    let log = c.agent.log();
    assert_eq!(log.matches("heartbeats over HTTP/2").count(), 1, "{log}");
}

#[test]
fn heartbeats_stay_on_http1_when_the_server_offers_no_http2() {
    let c = tls_cluster_renewed(FakeApiServer::start_tls_http1_only(), 3);
    for r in renewals(&c.api) {
        assert!(!r.http2 && r.status == 200, "{r:?}");
    }
    let log = c.agent.log();
    assert_eq!(log.matches("no HTTP/2 offered").count(), 1, "{log}");
    assert!(!log.contains("heartbeats over HTTP/2"), "{log}");
}

#[test]
fn a_heartbeat_connection_the_server_closed_is_replaced_without_a_failed_renewal() {
    let mut c = tls_cluster_renewed(FakeApiServer::start_tls(), 2);
    c.api.cut_connections();
    let before = renewals(&c.api).len();
    wait_renewals(&mut c, before + 3);
    assert!(renewals(&c.api)[before..]
        .iter()
        .all(|r| r.http2 && r.status == 200));
    let log = c.agent.log();
    assert_eq!(log.matches("heartbeats over HTTP/2").count(), 2, "{log}");
    assert!(!log.contains("node lease:"), "no renewal failed:\n{log}");
}

#[test]
fn kubeconfig_naming_a_missing_key_file_is_fatal_and_named() {
    let api = FakeApiServer::start_tls();
    let cri = FakeCri::start();
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig =
        api.write_kubeconfig(dir.path(), NODE_USER, KubeconfigAuth::client_cert_files());
    fs::remove_file(dir.path().join("client.key")).unwrap();
    let kc = kubeconfig.display().to_string();
    let mut agent = Agent::start(&cri.endpoint(), &["--kubeconfig", &kc]);
    let status = agent.wait_exit();
    let log = agent.log();
    assert!(!status.success(), "{log}");
    assert!(log.contains(&kc), "the error names the kubeconfig:\n{log}");
    assert!(
        log.contains("client-key"),
        "the error names the field:\n{log}"
    );
    assert_eq!(api.requests().len(), 0);
}

#[test]
fn a_refused_status_patch_is_logged_readably_and_retried() {
    let mut c = Cluster::start(&[]);
    c.wait_node_ready();
    c.api.fail_next(
        "PATCH",
        "/pods/web/status",
        403,
        "Forbidden",
        "pods \"web\" is forbidden: refused for the test",
        1,
    );
    c.api.create_pod(api_pod("web"));
    c.log_has(
        "the refusal is logged",
        &["403", "pods \"web\" is forbidden: refused for the test"],
    );
    c.wait_pod("web", "Running after the retry", |p| phase(p) == "Running");
}

/// The mount of `container_path` in the fake runtime's container `name`.
pub(crate) fn mount_of(
    cri: &FakeCri,
    name: &str,
    container_path: &str,
) -> Option<tinylet::cri::api::Mount> {
    cri.containers_named(name).first().and_then(|c| {
        c.mounts
            .iter()
            .find(|m| m.container_path == container_path)
            .cloned()
    })
}

const SA_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

#[test]
fn a_pod_with_the_default_service_account_token_volume_runs_with_the_token_on_tmpfs() {
    let mut c = Cluster::start(&[]);
    let mut pod = api_pod("sa");
    pod["spec"]
        .as_object_mut()
        .unwrap()
        .remove("automountServiceAccountToken");
    let created = c.api.create_pod(pod);
    let volume = created["spec"]["volumes"][0]["name"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(created["spec"]["volumes"][0]["secret"].is_object());
    c.wait_running("sa");

    let m = mount_of(&c.cri, "app", SA_DIR).expect("the token volume is mounted");
    assert!(m.readonly, "{m:?}");
    let host = PathBuf::from(&m.host_path);
    assert!(
        host.starts_with(c.agent.root_dir())
            && host.ends_with(format!("volumes/kubernetes.io~secret/{volume}")),
        "{host:?}"
    );
    assert_eq!(
        fs::read_to_string(host.join("token")).unwrap(),
        "fake-secret-token.default.default"
    );
    assert_eq!(
        fs::read_to_string(host.join("namespace")).unwrap(),
        "default"
    );
    assert_eq!(
        fs::read_to_string(host.join("ca.crt")).unwrap(),
        FAKE_ROOT_CA
    );
    assert!(
        tinylet::mount::is_mount_point(&host).unwrap(),
        "the secret lives on its own tmpfs"
    );
    let secret_path = format!("/api/v1/namespaces/default/secrets/{volume}");
    assert_eq!(
        c.api.count("GET", &secret_path),
        0,
        "read from its watch, not by GET"
    );

    // Deleted: the tmpfs goes with the pod.
    c.api.delete_pod("default", "sa", Some(0));
    let api = &c.api;
    c.agent
        .wait("the pod is gone", || api.pod("default", "sa").is_none());
    c.agent
        .wait("its volumes are unmounted and removed", || !host.exists());
    assert!(tinylet::mount::mounts_below(&c.agent.root_dir())
        .unwrap()
        .is_empty());
}

/// A pod with the projected volume current apiservers add instead of the
/// token Secret (`kube-api-access-*`).
fn api_access_pod(name: &str) -> Value {
    let mut pod = api_pod(name);
    pod["spec"]["volumes"] = json!([{
        "name": "kube-api-access-abcde",
        "projected": {
            "defaultMode": 420,
            "sources": [
                {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}},
            ],
        },
    }]);
    pod["spec"]["containers"][0]["volumeMounts"] =
        json!([{"name": "kube-api-access-abcde", "readOnly": true, "mountPath": SA_DIR}]);
    pod
}

#[test]
fn a_projected_service_account_token_is_requested_bound_to_the_pod() {
    let mut c = Cluster::start(&[]);
    // The root CA ConfigMap is published in the namespace.
    c.api.create_pod(api_pod("first"));
    c.wait_running("first");
    let created = c.api.create_pod(api_access_pod("projected"));
    let uid = created["metadata"]["uid"].as_str().unwrap().to_string();
    let cri = &c.cri;
    c.agent
        .wait("the pod runs", || running_containers(cri, "projected") == 1);
    let m = cri
        .container_statuses()
        .into_iter()
        .find(|s| s.labels.get("io.kubernetes.pod.name").map(String::as_str) == Some("projected"))
        .and_then(|s| {
            s.mounts
                .iter()
                .find(|m| m.container_path == SA_DIR)
                .cloned()
        })
        .expect("mounted");
    assert!(m.readonly);
    let host = PathBuf::from(&m.host_path);
    assert!(
        host.ends_with("volumes/kubernetes.io~projected/kube-api-access-abcde"),
        "{host:?}"
    );
    assert!(tinylet::mount::is_mount_point(&host).unwrap());
    let token = fs::read_to_string(host.join("token")).unwrap();
    assert_eq!(token, "fake-token.default.default.projected.1");
    assert_eq!(
        fs::read_to_string(host.join("ca.crt")).unwrap(),
        FAKE_ROOT_CA
    );
    assert_eq!(
        fs::read_to_string(host.join("namespace")).unwrap(),
        "default"
    );
    assert_eq!(c.api.tokens_issued(), 1);
    let request = c
        .api
        .requests()
        .into_iter()
        .find(|r| r.verb == "POST" && r.path.ends_with("/serviceaccounts/default/token"))
        .expect("a TokenRequest");
    let body: Value = serde_json::from_str(&request.body).unwrap();
    assert_eq!(
        body["spec"]["boundObjectRef"]["uid"],
        uid.as_str(),
        "{body:#}"
    );
    assert_eq!(body["spec"]["expirationSeconds"], 3607, "{body:#}");
}

#[test]
fn a_missing_secret_holds_the_pod_with_a_failed_mount_until_it_exists() {
    let mut c = Cluster::start(&[]);
    let mut pod = api_pod("cfg");
    pod["spec"]["volumes"] = json!([{"name": "creds", "secret": {"secretName": "later"}}]);
    pod["spec"]["containers"][0]["volumeMounts"] =
        json!([{"name": "creds", "mountPath": "/etc/creds"}]);
    c.api.create_pod(pod);
    let api = &c.api;
    c.agent.wait("a FailedMount event", || {
        api.events().iter().any(|e| {
            e["reason"] == "FailedMount"
                && e["type"] == "Warning"
                && e["involvedObject"]["name"] == "cfg"
                && e["message"]
                    == "MountVolume.SetUp failed for volume \"creds\" : secret \"later\" not found"
        })
    });
    let pod = c.wait_pod("cfg", "waiting in ContainerCreating", |p| {
        p["status"]["containerStatuses"][0]["state"]["waiting"]["reason"] == "ContainerCreating"
    });
    assert_eq!(phase(&pod), "Pending", "{pod:#}");
    assert_eq!(c.cri.count("CreateContainer"), 0);

    c.api
        .create_secret("default", "later", &[("password", "hunter2")]);
    c.wait_running("cfg");
    let m = mount_of(&c.cri, "app", "/etc/creds").expect("mounted");
    assert_eq!(
        fs::read_to_string(PathBuf::from(&m.host_path).join("password")).unwrap(),
        "hunter2"
    );
}

#[test]
fn a_static_pod_may_not_read_a_secret_and_says_why() {
    // No API pod of this node references the Secret, so the Node authorizer
    // refuses it (fixture 11c); the pod waits and the log names the refusal.
    let mut c = Cluster::start(&[]);
    c.api
        .create_secret("default", "unreferenced", &[("k", "v")]);
    let manifest = static_pod("holder").replace(
        "spec:\n",
        "spec:\n  volumes:\n  - name: s\n    secret:\n      secretName: unreferenced\n",
    );
    write_manifest(&c.agent.manifests(), "holder.yaml", &manifest);
    c.log_has(
        "the refusal is logged with the volume",
        &[
            "volume \"s\"",
            "secrets \"unreferenced\" is forbidden",
            "no relationship found between node 'edge-1' and this object",
        ],
    );
    assert_eq!(c.cri.count("CreateContainer"), 0);
}

#[test]
fn checkpointed_api_pods_start_after_a_reboot_while_the_apiserver_is_down() {
    let checkpoints = tempfile::tempdir().expect("checkpoint dir");
    let dir = checkpoints.path().display().to_string();
    let flags = ["--bootstrap-checkpoint-path", dir.as_str()];
    let mut c = Cluster::start(&flags);
    c.wait_node_ready();
    let created = c.api.create_pod(api_pod("keep"));
    let uid = created["metadata"]["uid"].as_str().unwrap().to_string();
    c.wait_running("keep");
    let checkpoint = checkpoints.path().join(format!("Pod_{uid}.yaml"));
    c.agent
        .wait("the pod is checkpointed", || checkpoint.exists());

    // A reboot during an outage: tinylet killed, every container gone (a
    // new runtime), the apiserver unreachable.
    let Cluster { api, mut agent, .. } = c;
    agent.kill();
    drop(agent);
    api.set_down(true);
    let mut c = Cluster::start_with(api, KubeconfigAuth::token(), &flags);
    c.wait_running("keep");
    assert_eq!(c.cri.count("RunPodSandbox"), 1);
    let sandbox_uid = c.cri.sandboxes()[0]
        .labels
        .get("io.kubernetes.pod.uid")
        .cloned()
        .unwrap_or_default();
    assert_eq!(sandbox_uid, uid, "the checkpointed pod keeps its UID");

    // The apiserver comes back: the same pod, not a second one; its status
    // converges, and its deletion removes the checkpoint.
    c.api.set_down(false);
    c.wait_node_ready();
    c.wait_pod("keep", "Running again in the API", |p| {
        phase(p) == "Running"
    });
    assert_eq!(c.cri.count("RunPodSandbox"), 1, "{:?}", c.cri.calls());
    c.api.delete_pod("default", "keep", Some(0));
    let cri = &c.cri;
    c.agent
        .wait("the pod is stopped and its checkpoint removed", || {
            cri.sandboxes().is_empty() && !checkpoint.exists()
        });
}

/// Only admitted API pods are checkpointed: a pod admission refuses gets
/// no checkpoint, while an admitted one next to it does.
#[test]
fn a_rejected_api_pod_gets_no_checkpoint() {
    let checkpoints = tempfile::tempdir().expect("checkpoint dir");
    let dir = checkpoints.path().display().to_string();
    let mut c = Cluster::start(&["--bootstrap-checkpoint-path", dir.as_str()]);
    c.wait_node_ready();
    let mut big = api_pod("big");
    big["spec"]["containers"][0]["resources"] = json!({"requests": {"cpu": "1000"}});
    let big = c.api.create_pod(big);
    let big_uid = big["metadata"]["uid"].as_str().unwrap().to_string();
    wait_rejected(&mut c, "big", "OutOfcpu");
    let ok = c.api.create_pod(api_pod("ok"));
    let ok_uid = ok["metadata"]["uid"].as_str().unwrap().to_string();
    c.wait_running("ok");
    let path = |uid: &str| checkpoints.path().join(format!("Pod_{uid}.yaml"));
    let admitted = path(&ok_uid);
    c.agent
        .wait("the admitted pod is checkpointed", || admitted.exists());
    let names: Vec<String> = fs::read_dir(checkpoints.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        !path(&big_uid).exists(),
        "the rejected pod was checkpointed: {names:?}"
    );
    assert_eq!(names, [format!("Pod_{ok_uid}.yaml")]);
}

/// The sandbox UIDs of pod `name` in the fake runtime.
fn sandbox_uids(cri: &FakeCri, name: &str) -> Vec<String> {
    cri.sandboxes()
        .iter()
        .filter(|s| s.metadata.as_ref().is_some_and(|m| m.name == name))
        .map(|s| {
            s.labels
                .get("io.kubernetes.pod.uid")
                .cloned()
                .unwrap_or_default()
        })
        .collect()
}

/// An API pod named as a static pod of the node (`<name>-<node>` in its
/// namespace) cannot hold the static pod off the node, whichever came
/// first: the API pod is refused (Failed, reason and event) and stopped,
/// and the static pod runs.
#[test]
fn an_api_pod_cannot_take_a_static_pods_name() {
    let mut c = Cluster::start(&[]);
    c.wait_node_ready();
    let conflict = "StaticPodNameConflict";
    let refused = |c: &mut Cluster, name: &str| {
        let pod = c.wait_pod(name, &format!("Failed {conflict}"), |p| {
            phase(p) == "Failed" && p["status"]["reason"] == conflict
        });
        let message = pod["status"]["message"].as_str().unwrap_or("").to_string();
        assert!(
            message.contains(&format!("default/{name}")) && message.contains("static pod"),
            "{pod:#}"
        );
        let api = &c.api;
        c.agent
            .wait(&format!("an event {conflict} for {name}"), || {
                api.events().iter().any(|e| {
                    e["reason"] == conflict
                        && e["involvedObject"]["name"] == name
                        && e["type"] == "Warning"
                })
            });
        pod["metadata"]["uid"].as_str().unwrap().to_string()
    };

    // The API pod first: it runs until the static pod comes.
    let squat = c.api.create_pod(api_pod("web-edge-1"));
    let squat_uid = squat["metadata"]["uid"].as_str().unwrap().to_string();
    c.wait_running("web-edge-1");
    write_manifest(&c.agent.manifests(), "web.yaml", &static_pod("web"));
    assert_eq!(refused(&mut c, "web-edge-1"), squat_uid);
    let cri = &c.cri;
    c.agent.wait("the static pod runs instead", || {
        let uids = sandbox_uids(cri, "web-edge-1");
        running_containers(cri, "web-edge-1") == 1 && uids.len() == 1 && uids[0] != squat_uid
    });

    // The static pod first: the API pod never runs. It exists unbound
    // before the static pod (once the mirror pod exists no API pod can take
    // the name) and is bound to the node only after the static pod runs,
    // as a scheduler binds a pending pod late.
    let mut pending = api_pod("db-edge-1");
    pending["spec"]["nodeName"] = Value::Null;
    let late = c.api.create_pod(pending);
    write_manifest(&c.agent.manifests(), "db.yaml", &static_pod("db"));
    c.wait_running("db-edge-1");
    let static_uid = sandbox_uids(&c.cri, "db-edge-1")[0].clone();
    assert!(c.api.update_pod("default", "db-edge-1", |p| {
        p["spec"]["nodeName"] = json!(NODE);
    }));
    assert_eq!(
        refused(&mut c, "db-edge-1"),
        late["metadata"]["uid"].as_str().unwrap()
    );
    assert_eq!(sandbox_uids(&c.cri, "db-edge-1"), [static_uid]);
    assert_eq!(running_containers(&c.cri, "db-edge-1"), 1);
    let log = c.agent.log();
    assert!(
        log.contains("pod default/db-edge-1 (")
            && log.contains("from api: rejected: StaticPodNameConflict"),
        "{log}"
    );
}

/// Two manifests of one name: the second is ignored, as upstream ignores a
/// duplicate in a source's update, and the node says so in a
/// FailedValidation event about it, not only in its log.
#[test]
fn two_manifests_of_one_name_run_one_pod_and_raise_an_event_about_the_other() {
    let mut c = Cluster::start(&[]);
    c.wait_node_ready();
    write_manifest(&c.agent.manifests(), "a.yaml", &static_pod("twin"));
    write_manifest(&c.agent.manifests(), "b.yaml", &static_pod("twin"));
    c.wait_running("twin-edge-1");
    let api = &c.api;
    let mut event = Value::Null;
    c.agent
        .wait("a FailedValidation event for twin-edge-1", || {
            event = api
                .events()
                .into_iter()
                .find(|e| e["reason"] == "FailedValidation")
                .unwrap_or(Value::Null);
            !event.is_null()
        });
    assert_eq!(
        (
            &event["type"],
            &event["involvedObject"]["kind"],
            &event["involvedObject"]["name"],
            &event["involvedObject"]["namespace"],
        ),
        (
            &json!("Warning"),
            &json!("Pod"),
            &json!("twin-edge-1"),
            &json!("default")
        ),
        "{event:#}"
    );
    let message = event["message"].as_str().unwrap_or("");
    assert!(
        message.contains("duplicate pod name") && message.contains("from file"),
        "{event:#}"
    );
    assert_eq!(sandbox_uids(&c.cri, "twin-edge-1").len(), 1);
    assert_eq!(running_containers(&c.cri, "twin-edge-1"), 1);
}

/// An API pod of about `bytes` bytes: the bulk is an env var's value, as
/// the apiserver allows (annotations are limited to 256 KiB in all, a whole
/// object to about 1.5 MiB in etcd).
fn big_pod(name: &str, bytes: usize) -> Value {
    let mut pod = api_pod(name);
    pod["spec"]["containers"][0]["env"] = json!([{"name": "BULK", "value": "x".repeat(bytes)}]);
    pod
}

const MIB: usize = 1024 * 1024;

#[test]
fn a_node_whose_pods_total_over_16_mib_runs_them_all_and_sees_later_changes() {
    // 14 pods of 1.4 MiB: the first list (resourceVersion=0, served from
    // the watch cache, which ignores limit) is one answer of ~20 MiB.
    let api = FakeApiServer::start();
    let names: Vec<String> = (0..14).map(|i| format!("big-{i}")).collect();
    for name in &names {
        api.create_pod(big_pod(name, 1400 * 1024));
    }
    let mut c = Cluster::start_with(api, KubeconfigAuth::token(), &[]);
    for name in &names {
        c.wait_running(name);
    }
    let lists: Vec<RecordedRequest> = c
        .api
        .requests()
        .into_iter()
        .filter(|r| r.verb == "GET" && r.path == "/api/v1/pods" && !r.query.contains("watch="))
        .collect();
    assert!(
        lists
            .iter()
            .all(|r| r.status == 200 && r.query.contains("limit=500")),
        "{lists:?}"
    );
    // A pod added afterwards runs, and a deletion is seen: the watch works.
    c.api.create_pod(big_pod("late", 1400 * 1024));
    c.wait_running("late");
    c.api.delete_pod("default", "big-3", Some(30)).unwrap();
    let api = &c.api;
    c.agent
        .wait("big-3 is deleted", || api.pod("default", "big-3").is_none());
    let cri = &c.cri;
    c.agent
        .wait("big-3 stopped", || running_containers(cri, "big-3") == 0);
    assert_eq!(running_containers(&c.cri, "big-4"), 1);
}

#[test]
fn an_object_over_the_cap_is_skipped_by_name_and_the_rest_runs() {
    // Only the fake can hold an object this large (etcd stops at ~1.5 MiB).
    let api = FakeApiServer::start();
    api.create_pod(api_pod("a"));
    api.create_pod(big_pod("huge", 17 * MIB));
    api.create_pod(api_pod("b"));
    let mut c = Cluster::start_with(api, KubeconfigAuth::token(), &[]);
    c.wait_running("a");
    c.wait_running("b");
    c.log_has(
        "the list's over-cap item is logged by name",
        &["GET /api/v1/pods?", "skipping items[", "\"default/huge\""],
    );
    // The same in a watch event: skipped by name, and the stream goes on.
    c.api.create_pod(big_pod("huge-2", 17 * MIB));
    c.api.create_pod(api_pod("c"));
    c.wait_running("c");
    c.log_has(
        "the watch's over-cap event is logged by name",
        &["skipping a ADDED event for \"default/huge-2\""],
    );
    assert_eq!(running_containers(&c.cri, "huge"), 0);
    assert_eq!(running_containers(&c.cri, "huge-2"), 0);
    assert!(
        c.cri.sandboxes().iter().all(|s| s
            .metadata
            .as_ref()
            .is_none_or(|m| !m.name.starts_with("huge"))),
        "a sandbox for an over-cap pod"
    );
}
