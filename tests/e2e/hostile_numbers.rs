//! End-to-end tests, on a real private containerd, of numbers a hostile pod
//! author picks: a grace period of `i64::MAX` seconds with a liveness probe
//! that fails and a preStop hook (the kill that follows used to overflow an
//! `Instant` and end the pod's worker, so the pod could never be deleted),
//! and, with tinylet joined to the fake apiserver, a pull secret whose
//! registry key is twenty `*`s against a long host (the backtracking match
//! used to hold the pod's worker for good).

use std::time::Duration;

use base64::Engine;
use serde_json::json;

use crate::e2e::{LONG_RUNNING, NODE, SETTLE};
use crate::support::containerd::{
    remove_manifest, wait_until, write_manifest, PrivateContainerd, Tinylet, BUSYBOX_IMAGE,
};
use crate::support::fake_apiserver::FakeApiServer;

/// A liveness failure kills the container through its preStop hook with a
/// grace period of `i64::MAX` seconds: tinylet cuts it to a year, does not
/// panic, restarts the container, and still deletes the pod when its
/// manifest goes away.
#[test]
fn a_huge_grace_period_with_a_failing_liveness_probe_still_lets_the_pod_go() {
    let ctd = PrivateContainerd::start();
    let mut kubelet = Tinylet::start(&ctd, NODE);
    let pod = kubelet.pod_name("forever");
    let manifest = format!(
        r#"apiVersion: v1
kind: Pod
metadata:
  name: forever
spec:
  terminationGracePeriodSeconds: 9223372036854775807
  containers:
  - name: app
    image: {BUSYBOX_IMAGE}
    imagePullPolicy: IfNotPresent
    command: ["sh", "-c", {LONG_RUNNING:?}]
    livenessProbe:
      exec:
        command: ["false"]
      periodSeconds: 1
      failureThreshold: 1
    lifecycle:
      preStop:
        exec:
          command: ["sleep", "1"]
"#
    );
    write_manifest(&kubelet.manifest_dir(), "forever.yaml", &manifest);
    wait_until(SETTLE, "forever-edge-1 runs", || {
        ctd.pod_running(&pod, &["app"])
    });
    // The failing probe has the container killed (preStop, then a stop
    // with the year that is left) and started again.
    wait_until(
        SETTLE,
        "the app container of forever-edge-1 is restarted",
        || ctd.container_ids_named(&pod, "app").len() >= 2,
    );
    kubelet.assert_running();

    remove_manifest(&kubelet.manifest_dir(), "forever.yaml");
    wait_until(SETTLE, "forever-edge-1 is removed", || ctd.pod_gone(&pod));
    kubelet.assert_running();
    let log = kubelet.log_since_start();
    assert!(!log.contains("panicked"), "tinylet log:\n{log}");
}

/// An API pod whose pull secret has a registry key of twenty `*`s and an
/// image on a host of long labels: matching the key against the host ends
/// (the pull then fails: nothing serves that host), and the pod is deleted
/// when the API deletes it.
#[test]
fn a_pull_secret_of_twenty_stars_does_not_hold_the_pods_worker() {
    let fake = FakeApiServer::start();
    let ctd = PrivateContainerd::start();
    let mut kubelet = crate::e2e::start_joined(&ctd, &fake);

    // One host label of 60 `a`s: a backtracking glob tries every way of
    // spreading them over twenty stars before the `b` fails.
    let label = "a".repeat(60);
    let key = format!("{}b.invalid", "*".repeat(20));
    let auth = base64::engine::general_purpose::STANDARD.encode("user:pass");
    let config = json!({"auths": {key: {"auth": auth}}}).to_string();
    fake.create_secret("default", "stars", &[(".dockerconfigjson", &config)]);
    fake.create_pod(json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "stars", "namespace": "default"},
        "spec": {
            "nodeName": NODE,
            "automountServiceAccountToken": false,
            "terminationGracePeriodSeconds": 2,
            "imagePullSecrets": [{"name": "stars"}],
            "containers": [{
                "name": "app",
                "image": format!("{label}.invalid/app:1"),
                "imagePullPolicy": "Always",
                "command": ["sh", "-c", LONG_RUNNING],
            }],
        },
    }));
    // The pull was tried (and failed): the keyring lookup came back.
    wait_until(SETTLE, "pod stars reports its failed pull", || {
        fake.pod("default", "stars")
            .and_then(|p| {
                p.pointer("/status/containerStatuses/0/state/waiting/reason")
                    .and_then(|r| r.as_str().map(str::to_string))
            })
            .is_some_and(|r| r == "ErrImagePull" || r == "ImagePullBackOff")
    });
    fake.delete_pod("default", "stars", Some(2));
    wait_until(
        SETTLE + Duration::from_secs(2),
        "pod stars is deleted",
        || fake.pod("default", "stars").is_none(),
    );
    kubelet.assert_running();
}
