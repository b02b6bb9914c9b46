//! End-to-end tests: the real `tinylet` binary against a real, private
//! containerd (Debian's containerd, runc and CNI plugins) with images built
//! locally from busybox-static. Each test starts its own containerd, so they
//! run in parallel; related checks are grouped to keep the number of
//! containerd start-ups small.
//!
//! Waits are generous (these are behaviour tests, not timing tests); the one
//! timing property checked is that a crashing container is not restarted in
//! a hot loop.
//!
//! This module holds what the tests share (the node name, the settle time,
//! starting tinylet joined to the fake apiserver, a static pod manifest);
//! each submodule covers one area, filtered as `e2e::<area>::`.

mod basic;
mod churn;
mod cluster;
mod disk;
mod env;
mod eviction;
mod hostile_numbers;
mod images;
mod kill;
mod lifecycle;
mod logs;
mod node_api;
mod objects;
mod outage;
mod pod_fields;
mod policy;
mod probes;
mod read_only;
mod runtime_outage;
mod security;
mod spec;
mod stats;
mod status;
mod stream;

use std::time::Duration;

use crate::support::containerd::{wait_until, PrivateContainerd, Tinylet, BUSYBOX_IMAGE};

pub(crate) const NODE: &str = "edge-1";
/// How long a pod may take to start, stop or be removed: generous, so a
/// loaded CI machine does not make the tests flaky.
pub(crate) const SETTLE: Duration = Duration::from_secs(30);

/// A container command that runs until SIGTERM and then exits at once.
pub(crate) const LONG_RUNNING: &str = "trap 'exit 0' TERM; while :; do sleep 1; done";

/// tinylet on `ctd` joined to `fake` as node `NODE`, with its own
/// kubeconfig (user `system:node:NODE`, a token), once its Node is
/// registered.
pub(crate) fn start_joined(
    ctd: &PrivateContainerd,
    fake: &crate::support::fake_apiserver::FakeApiServer,
) -> Tinylet {
    let kubeconfig = fake.write_kubeconfig(
        ctd.dir(),
        &format!("system:node:{NODE}"),
        crate::support::fake_apiserver::KubeconfigAuth::token(),
    );
    let kubeconfig = kubeconfig.display().to_string();
    let kubelet = Tinylet::start_with(ctd, NODE, &["--kubeconfig", &kubeconfig]);
    wait_until(SETTLE, "node edge-1 is registered", || {
        fake.node(NODE).is_some()
    });
    kubelet
}

/// A YAML static pod with one container `app` running `sh -c SCRIPT`.
pub(crate) fn yaml_pod(name: &str, script: &str, extra_spec: &str) -> String {
    format!(
        r#"apiVersion: v1
kind: Pod
metadata:
  name: {name}
  labels:
    app: {name}
spec:
  terminationGracePeriodSeconds: 5
{extra_spec}  containers:
  - name: app
    image: {BUSYBOX_IMAGE}
    imagePullPolicy: IfNotPresent
    command: ["sh", "-c", {script:?}]
"#
    )
}
