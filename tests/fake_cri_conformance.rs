//! Tests against the fake CRI runtime (`support::fake_cri`): first the fake
//! itself, driven through tinylet's own CRI client.

use std::collections::HashMap;
use std::time::Duration;

use grpcio::RpcStatusCode;
use protobuf::{EnumOrUnknown, MessageField};
use tinylet::cri::{api, ImageService, RemoteRuntime, RuntimeService};

use crate::support::fake_cri::FakeCri;

fn labels(pairs: &[(&str, &str)]) -> HashMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn sandbox_config(name: &str, uid: &str) -> api::PodSandboxConfig {
    let mut meta = api::PodSandboxMetadata::new();
    meta.name = name.to_string();
    meta.namespace = "default".to_string();
    meta.uid = uid.to_string();
    let mut config = api::PodSandboxConfig::new();
    config.metadata = MessageField::some(meta);
    config.hostname = name.to_string();
    config.log_directory = format!("/var/log/pods/default_{name}_{uid}");
    config.labels = labels(&[
        ("io.kubernetes.pod.name", name),
        ("io.kubernetes.pod.namespace", "default"),
        ("io.kubernetes.pod.uid", uid),
    ]);
    config.annotations = labels(&[("tinylet.io/config-hash", "abc")]);
    config
}

fn container_config(name: &str, image: &str) -> api::ContainerConfig {
    let mut meta = api::ContainerMetadata::new();
    meta.name = name.to_string();
    let mut spec = api::ImageSpec::new();
    spec.image = image.to_string();
    let mut config = api::ContainerConfig::new();
    config.metadata = MessageField::some(meta);
    config.image = MessageField::some(spec);
    config.command = vec!["sleep".to_string(), "3600".to_string()];
    config.log_path = format!("{name}/0.log");
    config.labels = labels(&[("io.kubernetes.container.name", name)]);
    config.annotations = labels(&[("io.kubernetes.container.hash", "1234")]);
    config
}

fn client(fake: &FakeCri) -> RemoteRuntime {
    let rt = RemoteRuntime::new(&fake.endpoint(), Duration::from_secs(10)).unwrap();
    rt.wait_ready(Duration::from_secs(10)).unwrap();
    rt
}

#[test]
fn pod_lifecycle_through_the_real_client() {
    let fake = FakeCri::start();
    let rt = client(&fake);

    let version = rt.version().unwrap();
    assert_eq!(version.runtime_name, "fake-cri");
    let status = rt.status().unwrap();
    assert!(status.status.conditions.iter().all(|c| c.status));

    // Sandbox: created READY with labels, annotations and metadata echoed.
    let sb_config = sandbox_config("web", "uid-1");
    let sb = rt.run_pod_sandbox(&sb_config, "").unwrap();
    let st = rt.pod_sandbox_status(&sb).unwrap();
    assert_eq!(st.id, sb);
    assert_eq!(
        st.state.enum_value(),
        Ok(api::PodSandboxState::SANDBOX_READY)
    );
    assert_eq!(st.metadata.name, "web");
    assert_eq!(st.labels, sb_config.labels);
    assert_eq!(st.annotations, sb_config.annotations);
    assert!(st.created_at > 0);
    assert!(!st.network.ip.is_empty());

    // A second pod, to see filters select.
    let other = rt
        .run_pod_sandbox(&sandbox_config("db", "uid-2"), "")
        .unwrap();
    let mut by_uid = api::PodSandboxFilter::new();
    by_uid.label_selector = labels(&[("io.kubernetes.pod.uid", "uid-1")]);
    let listed = rt.list_pod_sandbox(Some(by_uid)).unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].id, sb);
    assert_eq!(rt.list_pod_sandbox(None).unwrap().len(), 2);

    // Container: CREATED, then RUNNING.
    let c_config = container_config("app", "busybox");
    let c = rt.create_container(&sb, &c_config, &sb_config).unwrap();
    let cs = rt.container_status(&c).unwrap();
    assert_eq!(
        cs.state.enum_value(),
        Ok(api::ContainerState::CONTAINER_CREATED)
    );
    assert_eq!(cs.labels, c_config.labels);
    assert_eq!(cs.annotations, c_config.annotations);
    assert_eq!(cs.log_path, "/var/log/pods/default_web_uid-1/app/0.log");
    rt.start_container(&c).unwrap();
    let cs = rt.container_status(&c).unwrap();
    assert_eq!(
        cs.state.enum_value(),
        Ok(api::ContainerState::CONTAINER_RUNNING)
    );
    assert!(cs.started_at >= cs.created_at);

    let mut running = api::ContainerFilter::new();
    let mut state = api::ContainerStateValue::new();
    state.state = EnumOrUnknown::new(api::ContainerState::CONTAINER_RUNNING);
    running.state = MessageField::some(state);
    running.pod_sandbox_id = sb.clone();
    let listed = rt.list_containers(Some(running.clone())).unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].id, c);
    assert_eq!(listed[0].pod_sandbox_id, sb);
    assert_eq!(listed[0].metadata.name, "app");

    // A crash, as the fake reports it.
    fake.exit_container(&c, 2);
    let cs = rt.container_status(&c).unwrap();
    assert_eq!(
        cs.state.enum_value(),
        Ok(api::ContainerState::CONTAINER_EXITED)
    );
    assert_eq!(cs.exit_code, 2);
    assert_eq!(cs.reason, "Error");
    assert!(cs.finished_at >= cs.started_at);
    assert!(rt.list_containers(Some(running)).unwrap().is_empty());

    // Teardown: stop is fine on an exited container; removal of the sandbox
    // takes its containers along and is idempotent.
    rt.stop_container(&c, 0).unwrap();
    rt.stop_pod_sandbox(&sb).unwrap();
    let st = rt.pod_sandbox_status(&sb).unwrap();
    assert_eq!(
        st.state.enum_value(),
        Ok(api::PodSandboxState::SANDBOX_NOTREADY)
    );
    rt.remove_pod_sandbox(&sb).unwrap();
    rt.remove_pod_sandbox(&sb).unwrap();
    assert!(rt.list_containers(None).unwrap().is_empty());
    let err = rt.pod_sandbox_status(&sb).unwrap_err();
    assert!(err.is_not_found(), "{err}");
    assert_eq!(err.method(), "PodSandboxStatus");
    let err = rt.container_status(&c).unwrap_err();
    assert!(err.is_not_found(), "{err}");
    assert_eq!(rt.list_pod_sandbox(None).unwrap()[0].id, other);

    assert_eq!(fake.count("RunPodSandbox"), 2);
    assert_eq!(
        fake.calls_to("RunPodSandbox"),
        vec!["default/web", "default/db"]
    );
    assert_eq!(fake.calls_to("CreateContainer"), vec!["default/web/app"]);
    assert_eq!(fake.count("StartContainer"), 1);
    assert!(fake.calls().contains(&format!("RemovePodSandbox {sb}")));
}

#[test]
fn stop_and_remove_of_a_running_container() {
    let fake = FakeCri::start();
    let rt = client(&fake);
    let sb_config = sandbox_config("web", "uid-1");
    let sb = rt.run_pod_sandbox(&sb_config, "").unwrap();
    let c = rt
        .create_container(&sb, &container_config("app", "nginx"), &sb_config)
        .unwrap();
    rt.start_container(&c).unwrap();

    rt.stop_container(&c, 30).unwrap();
    let cs = rt.container_status(&c).unwrap();
    assert_eq!(
        cs.state.enum_value(),
        Ok(api::ContainerState::CONTAINER_EXITED)
    );
    assert_eq!(cs.exit_code, 143);
    rt.remove_container(&c).unwrap();
    rt.remove_container(&c).unwrap();
    assert!(rt.list_containers(None).unwrap().is_empty());
    let err = rt.stop_container(&c, 0).unwrap_err();
    assert!(err.is_not_found(), "{err}");
}

#[test]
fn names_are_reserved_and_sandboxes_must_exist() {
    let fake = FakeCri::start();
    let rt = client(&fake);
    let sb_config = sandbox_config("web", "uid-1");
    let sb = rt.run_pod_sandbox(&sb_config, "").unwrap();
    let err = rt.run_pod_sandbox(&sb_config, "").unwrap_err();
    assert!(err.to_string().contains("reserve sandbox name"), "{err}");
    assert!(!err.is_not_found() && !err.is_unavailable());

    let cfg = container_config("app", "busybox");
    rt.create_container(&sb, &cfg, &sb_config).unwrap();
    let err = rt.create_container(&sb, &cfg, &sb_config).unwrap_err();
    assert!(err.to_string().contains("reserve container name"), "{err}");

    let err = rt.create_container("nope", &cfg, &sb_config).unwrap_err();
    assert!(err.is_not_found(), "{err}");
    let err = rt
        .create_container(&sb, &container_config("x", "unknown/image:1"), &sb_config)
        .unwrap_err();
    assert!(err.is_not_found(), "{err}");
}

#[test]
fn images_present_pullable_and_missing() {
    let fake = FakeCri::start();
    let rt = client(&fake);
    let spec = |image: &str| {
        let mut s = api::ImageSpec::new();
        s.image = image.to_string();
        s
    };

    let busybox = rt.image_status(&spec("busybox")).unwrap().unwrap();
    assert!(busybox
        .repo_tags
        .contains(&"docker.io/library/busybox:latest".to_string()));
    assert!(rt
        .image_status(&spec("example.com/app:1"))
        .unwrap()
        .is_none());

    let err = rt
        .pull_image(&spec("example.com/app:1"), None, None)
        .unwrap_err();
    assert!(
        err.to_string().contains("failed to pull and unpack image"),
        "{err}"
    );
    assert_eq!(err.method(), "PullImage");

    fake.set_pullable(&["example.com/app:1"]);
    let image_ref = rt
        .pull_image(&spec("example.com/app:1"), None, None)
        .unwrap();
    let pulled = rt
        .image_status(&spec("example.com/app:1"))
        .unwrap()
        .unwrap();
    assert_eq!(pulled.id, image_ref);
    let mut filter = api::ImageFilter::new();
    filter.image = MessageField::some(spec("example.com/app:1"));
    assert_eq!(rt.list_images(Some(filter)).unwrap().len(), 1);

    rt.remove_image(&spec("example.com/app:1")).unwrap();
    rt.remove_image(&spec("example.com/app:1")).unwrap();
    assert!(rt
        .image_status(&spec("example.com/app:1"))
        .unwrap()
        .is_none());

    fake.set_images(&["registry.k8s.io/pause:3.9"]);
    assert_eq!(rt.list_images(None).unwrap().len(), 1);
}

#[test]
fn injected_failures_and_runtime_restart() {
    let fake = FakeCri::start();
    let rt = client(&fake);
    let sb_config = sandbox_config("web", "uid-1");

    fake.fail_next("RunPodSandbox", 2, RpcStatusCode::INTERNAL);
    for _ in 0..2 {
        let err = rt.run_pod_sandbox(&sb_config, "").unwrap_err();
        assert_eq!(err.code(), Some(tinylet::cri::Code::Internal), "{err}");
        assert_eq!(err.method(), "RunPodSandbox");
    }
    assert!(fake.sandboxes().is_empty());
    let sb = rt.run_pod_sandbox(&sb_config, "").unwrap();
    assert_eq!(fake.count("RunPodSandbox"), 3);

    fake.fail_next("ContainerStatus", 1, RpcStatusCode::NOT_FOUND);
    assert!(rt.container_status("whatever").unwrap_err().is_not_found());

    // The runtime goes away: the socket is gone.
    fake.stop_server();
    let err = rt.list_pod_sandbox(None).unwrap_err();
    assert!(err.is_unavailable(), "{err}");
    assert!(err.to_string().contains("does not exist"), "{err}");

    // It comes back with its state; the same client reconnects.
    fake.start_server();
    rt.wait_ready(Duration::from_secs(10)).unwrap();
    let listed = rt.list_pod_sandbox(None).unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].id, sb);

    fake.set_condition("NetworkReady", false);
    let status = rt.status().unwrap();
    let net = status
        .status
        .conditions
        .iter()
        .find(|c| c.type_ == "NetworkReady")
        .unwrap();
    assert!(!net.status);
}

#[test]
fn host_network_sandboxes_follow_runc_rules() {
    let fake = FakeCri::start();
    let rt = client(&fake);
    let host_net = |mut config: api::PodSandboxConfig| {
        let mut ns = api::NamespaceOption::new();
        ns.network = EnumOrUnknown::new(api::NamespaceMode::NODE);
        config
            .linux
            .mut_or_insert_default()
            .security_context
            .mut_or_insert_default()
            .namespace_options = MessageField::some(ns);
        config
    };

    // A hostname cannot be set in the host's UTS namespace.
    let with_hostname = host_net(sandbox_config("hn", "uid-1"));
    let err = rt.run_pod_sandbox(&with_hostname, "").unwrap_err();
    assert!(err.to_string().contains("unable to set hostname"), "{err}");

    let mut config = host_net(sandbox_config("hn", "uid-1"));
    config.hostname.clear();
    let sb = rt.run_pod_sandbox(&config, "").unwrap();
    let st = rt.pod_sandbox_status(&sb).unwrap();
    assert_eq!(st.network.ip, "", "host-network sandboxes report no IP");
    assert_eq!(
        st.linux.namespaces.options.network.enum_value(),
        Ok(api::NamespaceMode::NODE)
    );

    // The container's image is reported by its normalized tag.
    let c = rt
        .create_container(&sb, &container_config("app", "busybox"), &config)
        .unwrap();
    let cs = rt.container_status(&c).unwrap();
    assert_eq!(cs.image.image, "docker.io/library/busybox:latest");
    assert!(cs.image_ref.starts_with("sha256:"));
}
