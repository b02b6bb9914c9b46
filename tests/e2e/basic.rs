//! The core of the end-to-end tier: the private containerd harness itself,
//! static pods run, replaced and removed, restart back-off, adoption of
//! running pods by a restarted tinylet, the CRI client on a CNI sandbox, and
//! the http and file sources side by side.

use std::collections::BTreeSet;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::{yaml_pod, LONG_RUNNING, NODE, SETTLE};
use crate::support::containerd::{
    holds_for, remove_manifest, scaled, wait_until, write_manifest, PrivateContainerd, Tinylet,
    BUSYBOX_IMAGE, CONTAINER_NAME_LABEL, PAUSE_IMAGE, POD_NAMESPACE_LABEL, POD_NAME_LABEL,
    POD_UID_LABEL,
};

fn now_nanos() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as i64)
        .unwrap_or(0)
}

/// The harness alone: a private containerd starts, answers `ctr`, has both
/// images, runs a plain container, and is cleaned up on drop.
#[test]
fn private_containerd_serves_the_test_images() {
    let ctd = PrivateContainerd::start();
    let version = ctd.ctr(&["version"]);
    assert!(version.contains("Server:"), "ctr version: {version}");

    let images = ctd.ctr(&["images", "ls", "-q"]);
    for image in [BUSYBOX_IMAGE, PAUSE_IMAGE] {
        assert!(
            images.lines().any(|l| l.trim() == image),
            "image {image} not imported; ctr images ls -q: {images}"
        );
    }

    let snapshotter = ctd.snapshotter();
    let out = ctd.ctr(&[
        "run",
        "--rm",
        "--snapshotter",
        &snapshotter,
        BUSYBOX_IMAGE,
        "e2e-hello",
        "sh",
        "-c",
        "echo hello from $(busybox | head -1 | cut -d' ' -f1)",
    ]);
    assert_eq!(out.trim(), "hello from BusyBox");
    assert!(ctd.tasks().is_empty(), "tasks left: {:?}", ctd.tasks());
    let cni = ctd.dir().join("cni/10-tinylet.conflist");
    assert!(cni.exists(), "{} missing", cni.display());
}

/// Static pods from YAML and JSON run with the CRI labels, with CNI or host
/// networking; a malformed manifest beside them changes nothing; editing a
/// manifest replaces the pod; deleting it removes the pod.
#[test]
fn static_pods_run_are_replaced_on_edit_and_removed_on_delete() {
    let ctd = PrivateContainerd::start();
    let mut kubelet = Tinylet::start(&ctd, NODE);
    let dir = kubelet.manifest_dir();

    write_manifest(&dir, "web.yaml", &yaml_pod("web", LONG_RUNNING, ""));
    write_manifest(
        &dir,
        "hostnet.json",
        &format!(
            r#"{{"apiVersion":"v1","kind":"Pod","metadata":{{"name":"hostnet"}},
"spec":{{"hostNetwork":true,"terminationGracePeriodSeconds":5,"containers":[{{"name":"app",
"image":"{BUSYBOX_IMAGE}","imagePullPolicy":"Never","command":["sh","-c",{LONG_RUNNING:?}]}}]}}}}"#
        ),
    );
    write_manifest(
        &dir,
        "broken.yaml",
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: [broken\nspec: {containers: [\n",
    );

    let web = kubelet.pod_name("web");
    let hostnet = kubelet.pod_name("hostnet");
    assert_eq!(web, "web-edge-1");
    wait_until(
        SETTLE,
        "pod web-edge-1 runs (sandbox and app RUNNING)",
        || ctd.pod_running(&web, &["app"]),
    );
    wait_until(
        SETTLE,
        "pod hostnet-edge-1 runs (sandbox and app RUNNING)",
        || ctd.pod_running(&hostnet, &["app"]),
    );
    kubelet.assert_running();

    // The CRI labels tinylet adopts pods by.
    let sandbox = ctd.sandbox_ids(&web)[0].clone();
    let app = ctd.container_ids_named(&web, "app")[0].clone();
    let sb = ctd.object(&sandbox).expect("web sandbox vanished");
    let ct = ctd.object(&app).expect("web container vanished");
    assert_eq!(sb.label(POD_NAME_LABEL), "web-edge-1", "{sb:?}");
    assert_eq!(sb.label(POD_NAMESPACE_LABEL), "default", "{sb:?}");
    assert_eq!(
        sb.label("app"),
        "web",
        "pod labels go on the sandbox: {sb:?}"
    );
    assert!(!sb.label(POD_UID_LABEL).is_empty(), "{sb:?}");
    assert_eq!(ct.label(POD_NAME_LABEL), "web-edge-1", "{ct:?}");
    assert_eq!(ct.label(POD_NAMESPACE_LABEL), "default", "{ct:?}");
    assert_eq!(ct.label(CONTAINER_NAME_LABEL), "app", "{ct:?}");
    assert_eq!(ct.label(POD_UID_LABEL), sb.label(POD_UID_LABEL));
    let first_uid = sb.label(POD_UID_LABEL).to_string();

    // CNI: the sandbox got a lease from host-local, and the pod's network
    // namespace really carries that address.
    let ip = ctd
        .sandbox_ip(&sandbox)
        .unwrap_or_else(|| panic!("no IPAM lease for sandbox {sandbox}: {:?}", ctd.ip_leases()));
    assert!(ip.starts_with(&ctd.pod_ip_prefix()), "pod IP {ip}");
    let addr = ctd
        .exec_printing(&app, &["ip", "-4", "-o", "addr", "show", "eth0"])
        .unwrap_or_else(|e| panic!("ip addr in web pod: {e}"));
    assert!(
        addr.contains(&format!("inet {ip}/")),
        "eth0 of web pod: {addr}"
    );

    // Host network: no lease, and the host's network namespace.
    let host_sandbox = ctd.sandbox_ids(&hostnet)[0].clone();
    let host_app = ctd.container_ids_named(&hostnet, "app")[0].clone();
    assert_eq!(ctd.sandbox_ip(&host_sandbox), None);
    let host_ns =
        std::fs::read_link("/proc/self/ns/net").expect("reading the test's own network namespace");
    let host_ns = host_ns.display().to_string();
    let in_hostnet = ctd
        .exec_printing(&host_app, &["readlink", "/proc/self/ns/net"])
        .unwrap_or_else(|e| panic!("readlink in hostnet pod: {e}"));
    assert_eq!(
        in_hostnet.trim(),
        host_ns,
        "hostNetwork pod is not in the host netns"
    );
    let in_web = ctd
        .exec_printing(&app, &["readlink", "/proc/self/ns/net"])
        .unwrap_or_else(|e| panic!("readlink in web pod: {e}"));
    assert_ne!(in_web.trim(), host_ns, "CNI pod runs in the host netns");

    // Editing the manifest gives a new pod (new UID) in place of the old.
    write_manifest(
        &dir,
        "web.yaml",
        &yaml_pod("web", &format!("echo v2; {LONG_RUNNING}"), ""),
    );
    wait_until(SETTLE, "the edited web pod replaces the old one", || {
        let sandboxes = ctd.sandbox_ids(&web);
        sandboxes.len() == 1
            && sandboxes[0] != sandbox
            && ctd.object(&sandbox).is_none()
            && ctd.object(&app).is_none()
            && ctd.pod_running(&web, &["app"])
    });
    let new_sandbox = ctd.sandbox_ids(&web)[0].clone();
    let new_uid = ctd
        .object(&new_sandbox)
        .map(|o| o.label(POD_UID_LABEL).to_string())
        .unwrap_or_default();
    assert!(!new_uid.is_empty());
    assert_ne!(
        new_uid, first_uid,
        "an edited static pod must get a new UID"
    );
    assert!(
        ctd.pod_running(&hostnet, &["app"]),
        "editing web disturbed hostnet"
    );

    // Deleting the manifest stops and removes everything of the pod.
    remove_manifest(&dir, "web.yaml");
    wait_until(
        SETTLE,
        "web-edge-1's sandbox and containers are removed",
        || ctd.pod_gone(&web),
    );
    assert!(
        ctd.pod_running(&hostnet, &["app"]),
        "removing web disturbed hostnet"
    );
    kubelet.assert_running();
}

/// A container that keeps exiting is restarted with growing back-off (no
/// second restart within 8 s of the first exit); restartPolicy Never leaves
/// an exited container alone.
#[test]
fn exited_containers_restart_with_backoff_unless_policy_is_never() {
    let ctd = PrivateContainerd::start();
    let mut kubelet = Tinylet::start(&ctd, NODE);
    let dir = kubelet.manifest_dir();
    let crash = kubelet.pod_name("crash");
    let once = kubelet.pod_name("once");

    write_manifest(
        &dir,
        "crash.yaml",
        &yaml_pod("crash", "sleep 1; exit 3", "  restartPolicy: Always\n"),
    );
    write_manifest(
        &dir,
        "once.yaml",
        &yaml_pod("once", "sleep 1; exit 3", "  restartPolicy: Never\n"),
    );

    // Attempts of the pod's `app` containers, and when attempt 0 ended.
    let attempts = |pod: &str| -> BTreeSet<u32> {
        ctd.container_ids_named(pod, "app")
            .iter()
            .filter_map(|id| ctd.object(id))
            .map(|o| o.attempt)
            .collect()
    };
    let first_exit = |pod: &str| -> Option<(i64, i64)> {
        ctd.container_ids_named(pod, "app")
            .iter()
            .filter_map(|id| ctd.object(id))
            .filter(|o| o.attempt == 0)
            .find_map(|o| ctd.container_exit(&o.id))
    };

    let mut exit = None;
    wait_until(SETTLE, "crash-edge-1's first container exits", || {
        exit = first_exit(&crash);
        exit.is_some()
    });
    let (finished_at, code) = exit.unwrap_or_default();
    assert_eq!(code, 3, "exit code of crash-edge-1's container");

    // Until 8 s after that exit: at most one restart (attempt 1).
    let window_end = finished_at + 8_000_000_000;
    let remaining = Duration::from_nanos((window_end - now_nanos()).max(0) as u64);
    holds_for(
        remaining,
        "no second restart of crash-edge-1 within 8 s of its first exit (back-off)",
        || attempts(&crash).iter().all(|&a| a <= 1),
    );
    wait_until(SETTLE, "crash-edge-1 is restarted (attempt 1)", || {
        attempts(&crash).contains(&1)
    });
    wait_until(
        SETTLE,
        "crash-edge-1 is restarted again after its back-off (attempt 2)",
        || attempts(&crash).contains(&2),
    );

    // restartPolicy Never: one container, exited, never restarted (by now
    // well past any back-off).
    wait_until(SETTLE, "once-edge-1's container exits", || {
        first_exit(&once).is_some()
    });
    let (_, once_code) = first_exit(&once).unwrap_or_default();
    assert_eq!(once_code, 3, "exit code of once-edge-1's container");
    holds_for(
        Duration::from_secs(3),
        "once-edge-1 (restartPolicy Never) is not restarted",
        || attempts(&once) == BTreeSet::from([0]),
    );
    let ids = ctd.container_ids_named(&once, "app");
    assert_eq!(ids.len(), 1, "once-edge-1 containers: {ids:?}");
    assert_ne!(ctd.task_status(&ids[0]), "RUNNING");
    kubelet.assert_running();
}

/// After SIGKILL or SIGTERM the pods keep running, and a restarted tinylet
/// adopts them: same sandbox, same container, nothing restarted or doubled.
/// What it adopted is its own: removing the manifests removes the pods.
///
/// `packaging/qemu-e2e.sh` runs this test with the aarch64 binary under
/// qemu-user (`TINYLET_E2E_BIN`, `TINYLET_E2E_WRAPPER`,
/// `TINYLET_E2E_TIME_SCALE`), so periods tinylet must act in are scaled.
#[test]
fn restarted_tinylet_adopts_running_pods() {
    let ctd = PrivateContainerd::start();
    let mut kubelet = Tinylet::start(&ctd, NODE);
    let dir = kubelet.manifest_dir();
    let keep = kubelet.pod_name("keep");

    write_manifest(&dir, "keep.yaml", &yaml_pod("keep", LONG_RUNNING, ""));
    wait_until(SETTLE, "keep-edge-1 runs", || {
        ctd.pod_running(&keep, &["app"])
    });
    let sandboxes = ctd.sandbox_ids(&keep);
    let containers = ctd.container_ids(&keep);
    assert_eq!((sandboxes.len(), containers.len()), (1, 1));

    let unchanged = |pod: &str, sandboxes: &[String], containers: &[String]| {
        let tasks = ctd.tasks();
        ctd.sandbox_ids(pod) == sandboxes
            && ctd.container_ids(pod) == containers
            && sandboxes
                .iter()
                .chain(containers)
                .all(|id| tasks.get(id).map(String::as_str) == Some("RUNNING"))
    };

    // SIGKILL: the pod runs on without tinylet, and is adopted on restart.
    kubelet.sigkill();
    holds_for(
        Duration::from_secs(1),
        "keep-edge-1 runs on after tinylet was killed",
        || unchanged(&keep, &sandboxes, &containers),
    );
    kubelet.restart();
    // Its first sync of the pod decides adoption; the pod stays as it was
    // until then and for a while after (later syncs change nothing either).
    let synced = format!("pod default/{keep}: actions");
    wait_until(SETTLE, "the restarted tinylet syncs keep-edge-1", || {
        assert!(
            unchanged(&keep, &sandboxes, &containers),
            "keep-edge-1 changed after tinylet restarted\n{}",
            kubelet.log_tail(60)
        );
        kubelet.log_since_start().contains(&synced)
    });
    holds_for(
        scaled(Duration::from_secs(6)),
        "the restarted tinylet keeps keep-edge-1's sandbox and container (no restart, no duplicate)",
        || unchanged(&keep, &sandboxes, &containers),
    );
    kubelet.assert_running();

    // SIGTERM: a clean exit that leaves pods running. A manifest added while
    // tinylet is down runs once it is back.
    let status = kubelet.sigterm();
    assert!(status.success(), "tinylet exited with {status} on SIGTERM");
    write_manifest(&dir, "late.yaml", &yaml_pod("late", LONG_RUNNING, ""));
    holds_for(
        Duration::from_secs(1),
        "keep-edge-1 runs on after tinylet stopped",
        || unchanged(&keep, &sandboxes, &containers),
    );
    kubelet.restart();
    let late = kubelet.pod_name("late");
    wait_until(SETTLE, "late-edge-1 (added while down) runs", || {
        ctd.pod_running(&late, &["app"])
    });
    holds_for(
        scaled(Duration::from_secs(5)),
        "the restarted tinylet keeps keep-edge-1's sandbox and container after SIGTERM",
        || unchanged(&keep, &sandboxes, &containers),
    );
    kubelet.assert_running();

    // The adopted pod and the new one go when their manifests go.
    remove_manifest(&dir, "keep.yaml");
    remove_manifest(&dir, "late.yaml");
    wait_until(SETTLE, "keep-edge-1 (adopted) is removed", || {
        ctd.pod_gone(&keep)
    });
    wait_until(SETTLE, "late-edge-1 is removed", || ctd.pod_gone(&late));
    kubelet.assert_running();
}

/// The private containerd's CRI side, driven directly with tinylet's CRI
/// client: a CNI sandbox gets an IP from the instance's subnet, a container
/// runs and exits with its code, and the harness's views (labels, attempt,
/// exit status) read what the CRI plugin stored.
#[test]
fn cri_client_runs_a_cni_sandbox_on_the_private_containerd() {
    use tinylet::cri::{api, ImageService, RemoteRuntime, RuntimeService};

    let ctd = PrivateContainerd::start();
    let cri = RemoteRuntime::new(&ctd.endpoint(), Duration::from_secs(30))
        .unwrap_or_else(|e| panic!("CRI client for {}: {e}", ctd.endpoint()));
    cri.wait_ready(Duration::from_secs(10))
        .unwrap_or_else(|e| panic!("CRI Version on {}: {e}", ctd.endpoint()));
    let status = cri.status().unwrap_or_else(|e| panic!("CRI Status: {e}"));
    for condition in &status.status.conditions {
        assert!(
            condition.status,
            "runtime condition not true: {condition:?}"
        );
    }

    let image = api::ImageSpec {
        image: BUSYBOX_IMAGE.to_string(),
        ..Default::default()
    };
    let present = cri
        .image_status(&image)
        .unwrap_or_else(|e| panic!("CRI ImageStatus {BUSYBOX_IMAGE}: {e}"));
    assert!(present.is_some(), "CRI does not see {BUSYBOX_IMAGE}");

    let pod_name = "cri-probe";
    let sandbox_config = api::PodSandboxConfig {
        metadata: protobuf::MessageField::some(api::PodSandboxMetadata {
            name: pod_name.to_string(),
            uid: "e2e-cri-probe-uid".to_string(),
            namespace: "default".to_string(),
            attempt: 0,
            ..Default::default()
        }),
        hostname: pod_name.to_string(),
        labels: [
            (POD_NAME_LABEL.to_string(), pod_name.to_string()),
            (POD_NAMESPACE_LABEL.to_string(), "default".to_string()),
            (POD_UID_LABEL.to_string(), "e2e-cri-probe-uid".to_string()),
        ]
        .into_iter()
        .collect(),
        ..Default::default()
    };
    let sandbox = cri
        .run_pod_sandbox(&sandbox_config, "")
        .unwrap_or_else(|e| panic!("CRI RunPodSandbox with CNI: {e}\n{}", ctd.log_tail(20)));
    let sandbox_status = cri
        .pod_sandbox_status(&sandbox)
        .unwrap_or_else(|e| panic!("CRI PodSandboxStatus: {e}"));
    let ip = sandbox_status
        .network
        .as_ref()
        .map(|n| n.ip.clone())
        .unwrap_or_default();
    assert!(
        ip.starts_with(&ctd.pod_ip_prefix()),
        "sandbox IP {ip:?} not in {}0/24",
        ctd.pod_ip_prefix()
    );
    assert_eq!(ctd.sandbox_ip(&sandbox).as_deref(), Some(ip.as_str()));
    assert_eq!(ctd.sandbox_ids(pod_name), vec![sandbox.clone()]);

    let container_config = |script: &str, attempt: u32| api::ContainerConfig {
        metadata: protobuf::MessageField::some(api::ContainerMetadata {
            name: "probe".to_string(),
            attempt,
            ..Default::default()
        }),
        image: protobuf::MessageField::some(image.clone()),
        command: vec!["sh".into(), "-c".into(), script.into()],
        labels: [
            (POD_NAME_LABEL.to_string(), pod_name.to_string()),
            (POD_NAMESPACE_LABEL.to_string(), "default".to_string()),
            (CONTAINER_NAME_LABEL.to_string(), "probe".to_string()),
        ]
        .into_iter()
        .collect(),
        annotations: [(
            "io.kubernetes.container.restartCount".to_string(),
            attempt.to_string(),
        )]
        .into_iter()
        .collect(),
        ..Default::default()
    };
    let running = cri
        .create_container(
            &sandbox,
            &container_config(LONG_RUNNING, 0),
            &sandbox_config,
        )
        .unwrap_or_else(|e| panic!("CRI CreateContainer: {e}"));
    cri.start_container(&running)
        .unwrap_or_else(|e| panic!("CRI StartContainer: {e}"));
    assert!(ctd.pod_running(pod_name, &["probe"]));
    let addr = ctd
        .exec_printing(&running, &["ip", "-4", "-o", "addr", "show", "eth0"])
        .unwrap_or_else(|e| panic!("ip addr in the probe pod: {e}"));
    assert!(addr.contains(&format!("inet {ip}/")), "eth0: {addr}");
    let object = ctd.object(&running).expect("probe container vanished");
    assert_eq!(object.label(CONTAINER_NAME_LABEL), "probe");
    assert_eq!(object.attempt, 0);
    assert_eq!(
        ctd.container_exit(&running),
        None,
        "a running container has no exit"
    );
    cri.stop_container(&running, 5)
        .unwrap_or_else(|e| panic!("CRI StopContainer: {e}"));
    assert_eq!(ctd.container_exit(&running).map(|(_, code)| code), Some(0));

    // A second attempt that exits by itself with code 3.
    let exiting = cri
        .create_container(&sandbox, &container_config("exit 3", 1), &sandbox_config)
        .unwrap_or_else(|e| panic!("CRI CreateContainer (attempt 1): {e}"));
    cri.start_container(&exiting)
        .unwrap_or_else(|e| panic!("CRI StartContainer (attempt 1): {e}"));
    wait_until(SETTLE, "the attempt-1 container exits", || {
        ctd.container_exit(&exiting).is_some()
    });
    assert_eq!(ctd.container_exit(&exiting).map(|(_, code)| code), Some(3));
    let object = ctd.object(&exiting).expect("attempt-1 container vanished");
    assert_eq!(object.attempt, 1, "{object:?}");
    assert_eq!(
        object
            .annotations
            .get("io.kubernetes.container.restartCount")
            .map(String::as_str),
        Some("1"),
        "{object:?}"
    );
    let cri_status = cri
        .container_status(&exiting)
        .unwrap_or_else(|e| panic!("CRI ContainerStatus: {e}"));
    assert_eq!(cri_status.exit_code, 3);

    // Teardown through CRI leaves nothing behind, lease included.
    for id in [&running, &exiting] {
        cri.remove_container(id)
            .unwrap_or_else(|e| panic!("CRI RemoveContainer {id}: {e}"));
    }
    cri.stop_pod_sandbox(&sandbox)
        .unwrap_or_else(|e| panic!("CRI StopPodSandbox: {e}"));
    cri.remove_pod_sandbox(&sandbox)
        .unwrap_or_else(|e| panic!("CRI RemovePodSandbox: {e}"));
    assert!(ctd.pod_gone(pod_name));
    assert_eq!(ctd.sandbox_ip(&sandbox), None, "lease not released");
}

/// Pods from two sources at once: one polled from a manifest URL (given in
/// a `--config` file), one from the manifest directory. Both run; garbage
/// from the URL changes nothing; the URL dropping its pod removes only that
/// pod.
#[test]
fn http_and_file_pods_run_side_by_side() {
    use crate::http_source::Server;

    let server = Server::start();
    server.set(200, yaml_pod("fromhttp", LONG_RUNNING, ""));
    let ctd = PrivateContainerd::start();
    let config = ctd.dir().join("kubelet-config.yaml");
    std::fs::write(
        &config,
        format!(
            "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n\
             staticPodURL: {}\nhttpCheckFrequency: 1s\nstaticPodURLHeader:\n  X-Node: [{NODE}]\n\
             cgroupDriver: systemd\n",
            server.url
        ),
    )
    .unwrap_or_else(|e| panic!("writing {}: {e}", config.display()));
    let config = config.display().to_string();
    let mut kubelet = Tinylet::start_with(&ctd, NODE, &["--config", &config]);
    let dir = kubelet.manifest_dir();
    write_manifest(
        &dir,
        "fromfile.yaml",
        &yaml_pod("fromfile", LONG_RUNNING, ""),
    );

    let from_http = kubelet.pod_name("fromhttp");
    let from_file = kubelet.pod_name("fromfile");
    wait_until(SETTLE, "fromhttp-edge-1 (manifest URL) runs", || {
        ctd.pod_running(&from_http, &["app"])
    });
    wait_until(SETTLE, "fromfile-edge-1 (manifest dir) runs", || {
        ctd.pod_running(&from_file, &["app"])
    });
    let requests = server.requests();
    assert!(
        requests
            .iter()
            .all(|r| r.headers.get("x-node").map(Vec::as_slice) == Some(&[NODE.to_string()][..])),
        "the configured header was not sent: {requests:?}"
    );
    let http_sandbox = ctd.sandbox_ids(&from_http);
    let file_sandbox = ctd.sandbox_ids(&from_file);
    assert_eq!((http_sandbox.len(), file_sandbox.len()), (1, 1));

    // Garbage from the URL: the last good state stays, nothing restarts.
    server.set(200, "kind: Pod\nmetadata: {name: [broken\n");
    holds_for(
        Duration::from_secs(4),
        "both pods keep running while the URL serves garbage",
        || {
            ctd.sandbox_ids(&from_http) == http_sandbox
                && ctd.pod_running(&from_http, &["app"])
                && ctd.sandbox_ids(&from_file) == file_sandbox
                && ctd.pod_running(&from_file, &["app"])
        },
    );

    // The URL no longer lists the pod: it goes, the file pod stays.
    server.set(200, r#"{"apiVersion":"v1","kind":"PodList","items":[]}"#);
    wait_until(SETTLE, "fromhttp-edge-1 is removed", || {
        ctd.pod_gone(&from_http)
    });
    assert_eq!(ctd.sandbox_ids(&from_file), file_sandbox);
    assert!(
        ctd.pod_running(&from_file, &["app"]),
        "removing the URL's pod disturbed the file pod"
    );
    kubelet.assert_running();
}
