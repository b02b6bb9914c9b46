//! End-to-end: a container's environment from a ConfigMap, a Secret and
//! the Services of the fake apiserver, as its own process sees it in a
//! real, private containerd.

use serde_json::json;

use crate::e2e::cluster::{api_pod, only_ids, NS};
use crate::e2e::{NODE, SETTLE};
use crate::support::containerd::{wait_until, PrivateContainerd, Tinylet};
use crate::support::fake_apiserver::FakeApiServer;

/// envFrom a ConfigMap and a Secret (with a prefix), key references, a
/// `$(VAR)` of both, and the service variables, read back from the
/// environment the container's first process was started with.
#[test]
fn a_container_sees_env_from_config_maps_secrets_and_services() {
    let fake = FakeApiServer::start();
    let ctd = PrivateContainerd::start();
    let kubeconfig = fake.node_kubeconfig(ctd.dir(), NODE);
    let kubeconfig = kubeconfig.display().to_string();
    let _kubelet = Tinylet::start_with(&ctd, NODE, &["--kubeconfig", &kubeconfig]);

    fake.create_service(
        "default",
        "kubernetes",
        "10.96.0.1",
        json!([{"name": "https", "port": 443}]),
    );
    fake.create_service(NS, "redis-main", "10.96.3.3", json!([{"port": 6379}]));
    fake.create_config_map(
        NS,
        "app-config",
        &[("GREETING", "hello world"), ("MODE", "edge")],
    );
    fake.create_secret(NS, "app-secret", &[("token", "s3cr3t")]);
    let mut pod = api_pod("envpod");
    let c = &mut pod["spec"]["containers"][0];
    c["command"] = json!([
        "sh",
        "-c",
        "env > /tmp/env; trap 'exit 0' TERM; while :; do sleep 1; done"
    ]);
    c["envFrom"] = json!([
        {"configMapRef": {"name": "app-config"}},
        {"prefix": "SECRET_", "secretRef": {"name": "app-secret"}}
    ]);
    c["env"] = json!([
        {"name": "ONLY_MODE", "valueFrom": {"configMapKeyRef": {"name": "app-config", "key": "MODE"}}},
        {"name": "AUTH", "value": "Bearer $(SECRET_token) at $(KUBERNETES_SERVICE_HOST)"}
    ]);
    fake.create_pod(pod);

    let mut env = String::new();
    wait_until(SETTLE, "the container wrote its environment", || {
        let Some((_, id)) = only_ids(&ctd, "envpod") else {
            return false;
        };
        match ctd.exec_printing(&id, &["cat", "/tmp/env"]) {
            Ok(text) if text.contains("MODE=") => {
                env = text;
                true
            }
            _ => false,
        }
    });
    let lines: Vec<&str> = env.lines().collect();
    for want in [
        "GREETING=hello world",
        "MODE=edge",
        "SECRET_token=s3cr3t",
        "ONLY_MODE=edge",
        "AUTH=Bearer s3cr3t at 10.96.0.1",
        "KUBERNETES_SERVICE_HOST=10.96.0.1",
        "KUBERNETES_SERVICE_PORT=443",
        "KUBERNETES_SERVICE_PORT_HTTPS=443",
        "KUBERNETES_PORT=tcp://10.96.0.1:443",
        "KUBERNETES_PORT_443_TCP=tcp://10.96.0.1:443",
        "KUBERNETES_PORT_443_TCP_PROTO=tcp",
        "KUBERNETES_PORT_443_TCP_PORT=443",
        "KUBERNETES_PORT_443_TCP_ADDR=10.96.0.1",
        "REDIS_MAIN_SERVICE_HOST=10.96.3.3",
        "REDIS_MAIN_PORT_6379_TCP=tcp://10.96.3.3:6379",
    ] {
        assert!(lines.contains(&want), "{want:?} not in\n{env}");
    }
}
