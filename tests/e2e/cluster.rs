//! End-to-end tests of tinylet as a cluster node: the real binary with a
//! kubeconfig for `system:node:edge-1` against the fake apiserver, running
//! pods in a real, private containerd. API pods run and report their status,
//! graceful deletion goes all the way to the API object, static pods get
//! mirror pods, and a killed and restarted tinylet neither loses nor doubles
//! anything.
//!
//! Like the other `e2e` tests, each test starts its own containerd, so
//! related checks are grouped to keep start-ups few.

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::e2e::{yaml_pod, LONG_RUNNING, NODE, SETTLE};
use crate::support::containerd::{
    holds_for, remove_manifest, wait_until, write_manifest, PrivateContainerd, Tinylet,
    BUSYBOX_IMAGE, POD_UID_LABEL,
};
use crate::support::fake_apiserver::{FakeApiServer, MIRROR_ANNOTATION};

pub(crate) const NS: &str = "default";
const CONFIG_HASH: &str = "kubernetes.io/config.hash";
const SA_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

/// A pod bound to edge-1 as an admin (or the scheduler) would create it:
/// one container `app` running until SIGTERM, without the service account
/// token volume.
pub(crate) fn api_pod(name: &str) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NS, "labels": {"app": name}},
        "spec": {
            "nodeName": NODE,
            "automountServiceAccountToken": false,
            "terminationGracePeriodSeconds": 5,
            "containers": [{
                "name": "app",
                "image": BUSYBOX_IMAGE,
                "imagePullPolicy": "IfNotPresent",
                "command": ["sh", "-c", LONG_RUNNING],
            }],
        },
    })
}

/// The fake apiserver, a private containerd, and tinylet joined to the
/// fake with a token kubeconfig.
fn start_cluster_node() -> (FakeApiServer, PrivateContainerd, Tinylet) {
    let fake = FakeApiServer::start();
    let ctd = PrivateContainerd::start();
    let kubeconfig = fake.node_kubeconfig(ctd.dir(), NODE);
    let kubeconfig = kubeconfig.display().to_string();
    let kubelet = Tinylet::start_with(&ctd, NODE, &["--kubeconfig", &kubeconfig]);
    (fake, ctd, kubelet)
}

pub(crate) fn str_at<'a>(v: &'a Value, pointer: &str) -> &'a str {
    v.pointer(pointer).and_then(Value::as_str).unwrap_or("")
}

/// The one CRI container of `pod_name` and its sandbox, when both exist
/// exactly once.
pub(crate) fn only_ids(ctd: &PrivateContainerd, pod_name: &str) -> Option<(String, String)> {
    let sandboxes = ctd.sandbox_ids(pod_name);
    let containers = ctd.container_ids(pod_name);
    match (sandboxes.as_slice(), containers.as_slice()) {
        ([s], [c]) => Some((s.clone(), c.clone())),
        _ => None,
    }
}

/// Why the API status of a pod does not (yet) say it runs in container
/// `container_id`, or None when it does: phase Running, the first
/// container running, ready and with that ID, the pod Ready.
pub(crate) fn status_problem(pod: Option<&Value>, container_id: &str) -> Option<String> {
    let Some(pod) = pod else {
        return Some("the pod is not in the API".into());
    };
    let status = &pod["status"];
    let want_id = format!("containerd://{container_id}");
    let ready_condition = status["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["type"] == "Ready")
        .map(|c| c["status"].clone());
    let problem = if str_at(status, "/phase") != "Running" {
        "phase is not Running"
    } else if str_at(status, "/containerStatuses/0/containerID") != want_id {
        "containerStatuses[0].containerID is not the containerd container"
    } else if status.pointer("/containerStatuses/0/ready") != Some(&json!(true)) {
        "containerStatuses[0].ready is not true"
    } else if status
        .pointer("/containerStatuses/0/state/running")
        .is_none()
    {
        "containerStatuses[0].state is not running"
    } else if ready_condition != Some(json!("True")) {
        "the Ready condition is not True"
    } else {
        return None;
    };
    Some(format!("{problem} (want {want_id}); status: {status}"))
}

/// Waits until the API status of `ns/name` reports container `container_id`
/// running and ready.
pub(crate) fn wait_status_running(fake: &FakeApiServer, name: &str, container_id: &str) {
    let mut last = None;
    let what = format!("the API status of {name} says Running in containerd://{container_id}");
    let start = Instant::now();
    while start.elapsed() < SETTLE {
        last = status_problem(fake.pod(NS, name).as_ref(), container_id);
        if last.is_none() {
            return;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    // Fails at once, naming the last problem and showing the tinylet log.
    wait_until(Duration::ZERO, &format!("{what}: {last:?}"), || false);
}

/// API pods run in containerd with a status that says so (container ID,
/// ready, pod IP from CNI, host IP); an admin's graceful delete stops the
/// container with SIGTERM, removes it from containerd and then the API
/// object, through tinylet's final DELETE with grace 0 and the UID as
/// precondition; the pod beside it is not touched.
#[test]
fn api_pods_run_report_status_and_are_deleted_gracefully() {
    let (fake, ctd, mut kubelet) = start_cluster_node();

    wait_until(SETTLE, "node edge-1 is registered", || {
        fake.node(NODE).is_some()
    });
    let created = fake.create_pod(api_pod("web"));
    assert!(
        created["spec"]["volumes"]
            .as_array()
            .is_none_or(Vec::is_empty),
        "the fake added volumes to a pod without automounting: {created}"
    );
    let web_uid = str_at(&created, "/metadata/uid").to_string();
    // The bystander gets the service account token volume the apiserver
    // adds by default, and checks inside that it reads its token,
    // namespace and CA, read-only, before it settles down.
    let mut bystander = api_pod("bystander");
    bystander["spec"]
        .as_object_mut()
        .expect("spec")
        .remove("automountServiceAccountToken");
    bystander["spec"]["containers"][0]["command"] = json!([
        "sh",
        "-c",
        format!(
            "cd {SA_DIR} && grep -q fake-secret-token token && test \"$(cat namespace)\" = {NS} \
             && grep -q CERTIFICATE ca.crt && ! touch probe 2>/dev/null || exit 3; {LONG_RUNNING}"
        )
    ]);
    let bystander = fake.create_pod(bystander);
    assert!(
        bystander["spec"]["volumes"][0]["secret"].is_object(),
        "the fake adds the token volume: {bystander}"
    );

    wait_until(SETTLE, "API pod web runs in containerd", || {
        ctd.pod_running("web", &["app"])
    });
    wait_until(SETTLE, "API pod bystander runs in containerd", || {
        ctd.pod_running("bystander", &["app"])
    });
    let (web_sandbox, web_container) =
        only_ids(&ctd, "web").expect("web: one sandbox, one container");
    let (by_sandbox, by_container) =
        only_ids(&ctd, "bystander").expect("bystander: one sandbox, one container");
    let sandbox = ctd.object(&web_sandbox).expect("web sandbox vanished");
    assert_eq!(
        sandbox.label(POD_UID_LABEL),
        web_uid,
        "an API pod runs under its API UID"
    );

    wait_status_running(&fake, "web", &web_container);
    wait_status_running(&fake, "bystander", &by_container);
    let web = fake.pod(NS, "web").expect("pod web vanished");
    let ip = ctd
        .sandbox_ip(&web_sandbox)
        .unwrap_or_else(|| panic!("no IPAM lease for web's sandbox: {:?}", ctd.ip_leases()));
    assert!(ip.starts_with(&ctd.pod_ip_prefix()), "web's IP {ip}");
    assert_eq!(
        str_at(&web, "/status/podIP"),
        ip,
        "status: {}",
        web["status"]
    );
    assert_eq!(
        web.pointer("/status/podIPs"),
        Some(&json!([{"ip": ip}])),
        "status: {}",
        web["status"]
    );
    let node = fake.node(NODE).expect("node edge-1 vanished");
    let internal_ip = node["status"]["addresses"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|a| a["type"] == "InternalIP")
        .map(|a| str_at(a, "/address").to_string())
        .unwrap_or_default();
    assert!(
        !internal_ip.is_empty(),
        "node addresses: {}",
        node["status"]
    );
    assert_eq!(
        str_at(&web, "/status/hostIP"),
        internal_ip,
        "status: {}",
        web["status"]
    );
    assert!(
        !str_at(&web, "/status/startTime").is_empty(),
        "status: {}",
        web["status"]
    );

    // Graceful deletion.
    fake.clear_requests();
    let deleting = fake
        .delete_pod(NS, "web", Some(30))
        .expect("pod web to delete");
    assert!(
        !str_at(&deleting, "/metadata/deletionTimestamp").is_empty(),
        "a bound pod with grace 30 is deleted gracefully: {deleting}"
    );
    let deleted_at = Instant::now();
    // The exit code, if seen before the container is removed: 0 from the
    // TERM trap (SIGKILL would give 137).
    let mut exit_code = None;
    wait_until(
        SETTLE,
        "web's sandbox and container leave containerd",
        || {
            if let Some((_, code)) = ctd.container_exit(&web_container) {
                exit_code = Some(code);
            }
            ctd.pod_gone("web")
        },
    );
    assert!(
        exit_code.is_none_or(|c| c == 0),
        "web's container exited with {exit_code:?}, not through its TERM trap"
    );
    wait_until(SETTLE, "pod web leaves the API", || {
        fake.pod(NS, "web").is_none()
    });
    // Well below the 30 s grace period: the container ended on SIGTERM,
    // it was not killed when the grace period ran out.
    let took = deleted_at.elapsed();
    assert!(
        took < Duration::from_secs(15),
        "graceful deletion of a pod whose container exits on SIGTERM took {took:?}"
    );
    assert!(
        ctd.object(&web_sandbox).is_none(),
        "web's sandbox is still there"
    );

    let requests = fake.requests();
    let deletes: Vec<_> = requests
        .iter()
        .filter(|r| r.verb == "DELETE" && r.path.starts_with("/api/v1/namespaces/"))
        .collect();
    assert_eq!(
        deletes.len(),
        1,
        "exactly one pod DELETE, for web: {deletes:?}"
    );
    let delete = deletes[0];
    assert_eq!(delete.path, "/api/v1/namespaces/default/pods/web");
    assert_eq!(delete.user, format!("system:node:{NODE}"));
    assert_eq!(delete.status, 200, "{delete:?}");
    let body: Value = serde_json::from_str(&delete.body)
        .unwrap_or_else(|e| panic!("DELETE body is not JSON ({e}): {:?}", delete.body));
    assert_eq!(body["gracePeriodSeconds"], json!(0), "DELETE body: {body}");
    assert_eq!(
        body["preconditions"]["uid"],
        json!(web_uid),
        "DELETE body: {body}"
    );

    // The bystander: same sandbox and container, still running, its API
    // object untouched by any write of the node.
    assert_eq!(
        only_ids(&ctd, "bystander"),
        Some((by_sandbox, by_container.clone()))
    );
    assert!(ctd.pod_running("bystander", &["app"]));
    assert_eq!(
        status_problem(fake.pod(NS, "bystander").as_ref(), &by_container),
        None
    );
    let touched: Vec<_> = requests
        .iter()
        .filter(|r| r.verb != "GET" && r.path.contains("/pods/bystander"))
        .collect();
    assert!(
        touched.is_empty(),
        "the node wrote to bystander: {touched:?}"
    );
    kubelet.assert_running();
}

/// A static pod gets a mirror pod (its hash, owned by the Node) whose status
/// shows the real container; it runs once, not again as an API pod. With
/// it and an API pod running, a SIGKILLed and restarted tinylet keeps every
/// sandbox and container, the statuses, the mirror pod and the Node.
/// Removing the manifest stops the pod and deletes the mirror pod.
#[test]
fn static_pods_get_mirror_pods_and_a_restart_loses_and_doubles_nothing() {
    let (fake, ctd, mut kubelet) = start_cluster_node();
    let dir = kubelet.manifest_dir();
    let stat = kubelet.pod_name("stat");

    write_manifest(&dir, "stat.yaml", &yaml_pod("stat", LONG_RUNNING, ""));
    wait_until(SETTLE, "node edge-1 is registered", || {
        fake.node(NODE).is_some()
    });
    let node_uid = str_at(&fake.node(NODE).unwrap_or_default(), "/metadata/uid").to_string();
    assert!(!node_uid.is_empty());
    fake.create_pod(api_pod("api"));

    wait_until(SETTLE, "static pod stat-edge-1 runs in containerd", || {
        ctd.pod_running(&stat, &["app"])
    });
    wait_until(SETTLE, "API pod api runs in containerd", || {
        ctd.pod_running("api", &["app"])
    });
    let (stat_sandbox, stat_container) =
        only_ids(&ctd, &stat).expect("stat-edge-1: one sandbox, one container");
    let (api_sandbox, api_container) =
        only_ids(&ctd, "api").expect("api: one sandbox, one container");
    let static_uid = ctd
        .object(&stat_sandbox)
        .map(|o| o.label(POD_UID_LABEL).to_string())
        .unwrap_or_default();
    assert!(!static_uid.is_empty());

    // The mirror pod.
    wait_until(SETTLE, "the mirror pod of stat-edge-1 exists", || {
        fake.pod(NS, &stat).is_some()
    });
    let mirror = fake.pod(NS, &stat).expect("mirror pod vanished");
    let annotations = &mirror["metadata"]["annotations"];
    assert_eq!(
        str_at(
            annotations,
            &format!("/{}", MIRROR_ANNOTATION.replace('/', "~1"))
        ),
        static_uid,
        "the mirror annotation carries the static pod's hash (its UID): {annotations}"
    );
    assert_eq!(
        str_at(annotations, &format!("/{}", CONFIG_HASH.replace('/', "~1"))),
        static_uid,
        "{annotations}"
    );
    assert_ne!(
        str_at(&mirror, "/metadata/uid"),
        static_uid,
        "the API gives the mirror pod its own UID"
    );
    assert_eq!(
        mirror["metadata"]["ownerReferences"],
        json!([{
            "apiVersion": "v1",
            "kind": "Node",
            "name": NODE,
            "uid": node_uid,
            "controller": true,
        }]),
        "mirror pod: {}",
        mirror["metadata"]
    );
    let mirror_uid = str_at(&mirror, "/metadata/uid").to_string();
    wait_status_running(&fake, &stat, &stat_container);
    wait_status_running(&fake, "api", &api_container);
    // The mirror pod (an API pod bound to edge-1) is not run a second time.
    holds_for(
        Duration::from_secs(2),
        "stat-edge-1 has exactly one sandbox and one container",
        || only_ids(&ctd, &stat) == Some((stat_sandbox.clone(), stat_container.clone())),
    );

    // SIGKILL and restart.
    let unchanged = || {
        only_ids(&ctd, &stat) == Some((stat_sandbox.clone(), stat_container.clone()))
            && only_ids(&ctd, "api") == Some((api_sandbox.clone(), api_container.clone()))
            && ctd.pod_running(&stat, &["app"])
            && ctd.pod_running("api", &["app"])
    };
    kubelet.sigkill();
    assert!(unchanged(), "the pods did not survive tinylet's SIGKILL");
    fake.clear_requests();
    kubelet.restart();
    let restarted = Instant::now();
    // Long enough for the restarted tinylet to list, sync both pods and
    // write their statuses.
    holds_for(
        Duration::from_secs(8),
        "after a restart: same sandboxes and containers, API statuses Running, same mirror pod and Node",
        || {
            unchanged()
                && status_problem(fake.pod(NS, &stat).as_ref(), &stat_container).is_none()
                && status_problem(fake.pod(NS, "api").as_ref(), &api_container).is_none()
                && fake
                    .pod(NS, &stat)
                    .is_some_and(|p| str_at(&p, "/metadata/uid") == mirror_uid)
                && fake
                    .node(NODE)
                    .is_some_and(|n| str_at(&n, "/metadata/uid") == node_uid)
        },
    );
    assert!(restarted.elapsed() >= Duration::from_secs(8));

    // The restarted tinylet did talk to the apiserver (so the checks above
    // saw it at work): it watched pods for its node.
    assert!(
        fake.count("GET", "/api/v1/pods") > 0,
        "the restarted tinylet never listed its pods: {:?}",
        fake.requests()
    );
    let writes: Vec<_> = fake
        .requests()
        .into_iter()
        .filter(|r| {
            (r.verb == "POST" || r.verb == "DELETE") && r.path.starts_with("/api/v1/namespaces/")
        })
        .filter(|r| r.path.contains("/pods"))
        .collect();
    assert!(
        writes.is_empty(),
        "the restarted tinylet created or deleted pods: {writes:?}"
    );
    // The API pod's status in the API is what the restarted tinylet
    // generates: nothing to patch.
    let api_patches: Vec<_> = fake
        .requests()
        .into_iter()
        .filter(|r| r.verb == "PATCH" && r.path == "/api/v1/namespaces/default/pods/api/status")
        .collect();
    assert!(
        api_patches.is_empty(),
        "the restarted tinylet patched the unchanged status of pod api: {api_patches:?}"
    );

    // Removing the manifest: the static pod stops, its mirror pod goes.
    remove_manifest(&dir, "stat.yaml");
    wait_until(SETTLE, "stat-edge-1 leaves containerd", || {
        ctd.pod_gone(&stat)
    });
    wait_until(SETTLE, "the mirror pod of stat-edge-1 is deleted", || {
        fake.pod(NS, &stat).is_none()
    });
    assert_eq!(
        only_ids(&ctd, "api"),
        Some((api_sandbox, api_container.clone())),
        "removing the static pod disturbed the API pod"
    );
    assert_eq!(
        status_problem(fake.pod(NS, "api").as_ref(), &api_container),
        None
    );
    kubelet.assert_running();
}
