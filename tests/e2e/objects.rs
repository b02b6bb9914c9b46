//! End-to-end on a real containerd: a ConfigMap and a Secret edited while a
//! pod mounts them, and the pod's labels edited, reach the files inside the
//! running container within 60 s, without a restart; a subPath mount of
//! the ConfigMap keeps what it had when the container started, as upstream.

use std::time::Duration;

use serde_json::json;

use crate::e2e::cluster::{api_pod, only_ids, NS};
use crate::e2e::{LONG_RUNNING, NODE, SETTLE};
use crate::support::containerd::{wait_until, PrivateContainerd, Tinylet};
use crate::support::fake_apiserver::FakeApiServer;

/// The bound: a change reaches the mounted files within 60 s.
const FOLLOW: Duration = Duration::from_secs(60);

#[test]
fn edited_objects_and_labels_reach_the_container_and_sub_path_keeps_the_old() {
    let fake = FakeApiServer::start();
    let ctd = PrivateContainerd::start();
    let kubeconfig = fake.node_kubeconfig(ctd.dir(), NODE);
    let kubeconfig = kubeconfig.display().to_string();
    let _kubelet = Tinylet::start_with(&ctd, NODE, &["--kubeconfig", &kubeconfig]);

    fake.create_config_map(NS, "app-config", &[("mode", "one")]);
    fake.create_secret(NS, "app-secret", &[("password", "first")]);
    let mut pod = api_pod("objects");
    pod["metadata"]["labels"] = json!({"tier": "web"});
    pod["spec"]["volumes"] = json!([
        {"name": "cfg", "configMap": {"name": "app-config"}},
        {"name": "sec", "secret": {"secretName": "app-secret"}},
        {"name": "info", "downwardAPI": {"items": [
            {"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}}]}},
    ]);
    pod["spec"]["containers"][0]["command"] = json!(["sh", "-c", LONG_RUNNING]);
    pod["spec"]["containers"][0]["volumeMounts"] = json!([
        {"name": "cfg", "mountPath": "/cfg"},
        {"name": "cfg", "mountPath": "/pinned/mode", "subPath": "mode"},
        {"name": "sec", "mountPath": "/sec"},
        {"name": "info", "mountPath": "/info"},
    ]);
    fake.create_pod(pod);

    let mut ids = None;
    wait_until(SETTLE, "the pod runs in containerd", || {
        ids = only_ids(&ctd, "objects");
        ids.as_ref()
            .is_some_and(|(_, c)| ctd.task_status(c) == "RUNNING")
    });
    let (_, container) = ids.unwrap();
    let read = |path: &str| {
        ctd.exec_printing(&container, &["cat", path])
            .unwrap_or_default()
    };
    wait_until(SETTLE, "the first contents inside the container", || {
        read("/cfg/mode") == "one"
            && read("/pinned/mode") == "one"
            && read("/sec/password") == "first"
            && read("/info/labels") == "tier=\"web\""
    });

    assert!(fake.update_config_map(NS, "app-config", &[("mode", "two")]));
    assert!(fake.update_secret(NS, "app-secret", &[("password", "second")]));
    assert!(fake.update_pod(NS, "objects", |p| {
        p["metadata"]["labels"] = json!({"tier": "db"})
    }));
    wait_until(FOLLOW, "the new contents inside the container", || {
        read("/cfg/mode") == "two"
            && read("/sec/password") == "second"
            && read("/info/labels") == "tier=\"db\""
    });
    assert_eq!(read("/pinned/mode"), "one", "a subPath mount keeps the old");
    // The same container throughout: nothing was restarted.
    assert_eq!(
        only_ids(&ctd, "objects").map(|(_, c)| c),
        Some(container.clone())
    );
    assert_eq!(ctd.task_status(&container), "RUNNING");
}
