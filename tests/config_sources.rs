//! The real `tinylet` binary with several pod sources against the fake CRI
//! server: checkpoint restore (one good, one corrupt checkpoint), and a
//! file pod and a URL pod that claim the same name (the first keeps it, the
//! other runs once it is free).

use std::fs;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Container, Pod, PodSpec};
use protobuf::EnumOrUnknown;
use tinylet::config::checkpoint::checkpoint_path;
use tinylet::config::write_checkpoint;
use tinylet::cri::api;

use crate::http_source::Server;
use crate::support::agent::Agent;
use crate::support::containerd::{remove_manifest, write_manifest};
use crate::support::fake_cri::FakeCri;

fn running(fake: &FakeCri, pod: &str) -> Vec<String> {
    fake.container_statuses()
        .iter()
        .filter(|c| {
            c.labels.get("io.kubernetes.pod.name").map(String::as_str) == Some(pod)
                && c.state == EnumOrUnknown::new(api::ContainerState::CONTAINER_RUNNING)
        })
        .map(|c| {
            c.labels
                .get("io.kubernetes.pod.uid")
                .cloned()
                .unwrap_or_default()
        })
        .collect()
}

fn manifest(name: &str, image: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\nspec:\n  terminationGracePeriodSeconds: 0\n  containers:\n  - name: app\n    image: {image}\n    imagePullPolicy: IfNotPresent\n"
    )
}

fn api_pod(uid: &str, name: &str) -> Pod {
    let mut p = Pod::default();
    p.metadata.uid = Some(uid.into());
    p.metadata.name = Some(name.into());
    p.metadata.namespace = Some("kube-system".into());
    p.spec = Some(PodSpec {
        containers: vec![Container {
            name: "app".into(),
            image: Some("busybox:latest".into()),
            image_pull_policy: Some("IfNotPresent".into()),
            ..Default::default()
        }],
        termination_grace_period_seconds: Some(0),
        ..Default::default()
    });
    p
}

#[test]
fn checkpointed_pods_are_restored_and_corrupt_ones_skipped() {
    let fake = FakeCri::start();
    let checkpoints = tempfile::tempdir().expect("temp dir");
    write_checkpoint(checkpoints.path(), &api_pod("cp-good", "restored")).expect("checkpoint");
    write_checkpoint(checkpoints.path(), &api_pod("cp-bad", "tampered")).expect("checkpoint");
    let bad = checkpoint_path(checkpoints.path(), "cp-bad");
    let text = fs::read_to_string(&bad).expect("read checkpoint");
    fs::write(&bad, text.replace("busybox:latest", "nginx:latest")).expect("tamper");

    let cp = checkpoints.path().display().to_string();
    let mut agent = Agent::start(&fake.endpoint(), &["--bootstrap-checkpoint-path", &cp]);
    agent.wait("the restored pod runs", || {
        running(&fake, "restored") == ["cp-good"]
    });
    let log = agent.log_path();
    agent.wait("the corrupt checkpoint is reported", || {
        log_has(&log, "Pod_cp-bad.yaml") && log_has(&log, "checksum mismatch")
    });
    // A file pod runs beside it, and the corrupt one never does.
    write_manifest(
        &agent.manifests(),
        "web.yaml",
        &manifest("web", "busybox:latest"),
    );
    agent.wait("the file pod runs", || {
        running(&fake, "web-edge-1").len() == 1
    });
    assert!(running(&fake, "tampered").is_empty());
    assert!(fake
        .calls_to("RunPodSandbox")
        .iter()
        .all(|c| !c.contains("tampered")));
}

fn log_has(log: &std::path::Path, needle: &str) -> bool {
    fs::read_to_string(log).is_ok_and(|l| l.contains(needle))
}

#[test]
fn a_file_pod_and_a_url_pod_with_one_name_never_run_together() {
    let fake = FakeCri::start();
    // The URL answers 404 at first, so the file pod is surely first.
    let server = Server::start();
    let mut agent = Agent::start(
        &fake.endpoint(),
        &[
            "--manifest-url",
            &server.url,
            "--http-check-frequency",
            "200ms",
        ],
    );
    write_manifest(
        &agent.manifests(),
        "web.yaml",
        &manifest("web", "busybox:latest"),
    );
    agent.wait("the file pod runs", || {
        running(&fake, "web-edge-1").len() == 1
    });
    let file_uid = running(&fake, "web-edge-1");

    // The URL now offers a pod of the same name: the file pod keeps it.
    server.set(200, manifest("web", "nginx:latest"));
    let log = agent.log_path();
    agent.wait("the conflict is logged", || {
        log_has(&log, "duplicate pod name")
    });
    let end = Instant::now() + Duration::from_secs(2);
    while Instant::now() < end {
        assert_eq!(running(&fake, "web-edge-1"), file_uid, "{}", agent.log());
        std::thread::sleep(Duration::from_millis(50));
    }

    // Removing the manifest frees the name: the URL's pod runs instead.
    remove_manifest(&agent.manifests(), "web.yaml");
    agent.wait("the URL's pod runs in the file pod's place", || {
        let uids = running(&fake, "web-edge-1");
        uids.len() == 1 && uids != file_uid
    });
    let images: Vec<String> = fake
        .container_statuses()
        .iter()
        .filter(|c| {
            c.labels.get("io.kubernetes.pod.name").map(String::as_str) == Some("web-edge-1")
                && c.state == EnumOrUnknown::new(api::ContainerState::CONTAINER_RUNNING)
        })
        .filter_map(|c| c.image.as_ref().map(|i| i.image.clone()))
        .collect();
    assert!(
        images.len() == 1 && images[0].contains("nginx"),
        "the running web-edge-1 is not the URL's (nginx) pod: {images:?}"
    );
}
