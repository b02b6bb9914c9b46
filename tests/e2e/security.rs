//! End-to-end tests of what a hostile pod author must not reach, on a
//! real, private containerd: a symlink planted in an emptyDir and mounted
//! by subPath (refused with CreateContainerConfigError, nothing of the
//! host exposed or created, the pod's other containers run), a symlink
//! swapped in a loop while containers mounting it start, `subPathExpr`
//! expanded from the downward API, subPath of a downwardAPI volume (the
//! `..data` layout), and the subPath bind mounts gone with the pod; and an
//! emptyDir given its `fsGroup` once, never walked again by a restarted
//! tinylet over what the containers set.

use std::path::Path;
use std::time::Duration;

use serde_json::{json, Value};

use crate::e2e::{LONG_RUNNING, NODE, SETTLE};
use crate::support::containerd::{
    holds_for, scaled, wait_until, write_manifest, PrivateContainerd, Tinylet, BUSYBOX_IMAGE,
};
use crate::support::fake_apiserver::FakeApiServer;

fn str_at<'a>(v: &'a Value, pointer: &str) -> &'a str {
    v.pointer(pointer).and_then(Value::as_str).unwrap_or("")
}

fn container(name: &str, script: &str, mounts: Value) -> Value {
    json!({
        "name": name,
        "image": BUSYBOX_IMAGE,
        "imagePullPolicy": "IfNotPresent",
        "command": ["sh", "-c", script],
        "volumeMounts": mounts,
    })
}

fn api_pod(name: &str, spec: Value) -> Value {
    let mut pod = json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "labels": {"app": name}},
        "spec": {
            "nodeName": NODE,
            "automountServiceAccountToken": false,
            "terminationGracePeriodSeconds": 1,
        },
    });
    if let (Some(s), Value::Object(extra)) = (pod["spec"].as_object_mut(), spec) {
        s.extend(extra);
    }
    pod
}

/// The status of container `name` in `pod`.
fn container_status(pod: &Value, name: &str) -> Value {
    pod.pointer("/status/containerStatuses")
        .and_then(Value::as_array)
        .and_then(|l| l.iter().find(|c| str_at(c, "/name") == name))
        .cloned()
        .unwrap_or(Value::Null)
}

/// Mount points at or below `dir` in this (the host's) mount namespace.
fn mounts_below(dir: &Path) -> Vec<String> {
    let text = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let dir = dir.display().to_string();
    text.lines()
        .filter_map(|l| l.split(' ').nth(4))
        .filter(|p| p.starts_with(&dir))
        .map(str::to_string)
        .collect()
}

/// An init container plants `ln -s <host dir> /data/x`; a container
/// mounting `subPath: x` is refused with CreateContainerConfigError naming
/// the mount and never created (the host directory is not exposed),
/// `subPath: x/etc/tinylet-probe` creates nothing on the host, and the
/// bystander
/// mounting another volume runs. `subPathExpr: $(POD_NAME)` lands in a
/// per-pod directory of a shared hostPath, and subPath of a downwardAPI
/// volume's file reads the file. Deleting the pods leaves no mount.
#[test]
fn sub_paths_stay_inside_their_volume() {
    let fake = FakeApiServer::start();
    let ctd = PrivateContainerd::start();
    let kubelet = crate::e2e::start_joined(&ctd, &fake);
    // The host directory the planted link points at: the test's own, never
    // the host's `/`, so that a broken check exposes nothing that matters.
    let outside = ctd.dir().join("outside");
    std::fs::create_dir_all(&outside).unwrap_or_else(|e| panic!("{}: {e}", outside.display()));
    let exposed = outside.join("exposed-by-subpath");
    let probe = outside.join("etc/tinylet-probe");
    let plant = format!("ln -s {} /data/x", outside.display());

    fake.create_pod(api_pod(
        "plant",
        json!({
            "restartPolicy": "Always",
            "volumes": [{"name": "data", "emptyDir": {}}, {"name": "other", "emptyDir": {}}],
            "initContainers": [container("plant", &plant, json!([{"name": "data", "mountPath": "/data"}]))],
            "containers": [
                container(
                    "app",
                    &format!("touch /mnt/exposed-by-subpath; {LONG_RUNNING}"),
                    json!([{"name": "data", "mountPath": "/mnt", "subPath": "x"}]),
                ),
                container(
                    "probe",
                    LONG_RUNNING,
                    json!([{"name": "data", "mountPath": "/mnt", "subPath": "x/etc/tinylet-probe"}]),
                ),
                container("bystander", LONG_RUNNING, json!([{"name": "other", "mountPath": "/other"}])),
            ],
        }),
    ));
    let shared = ctd.dir().join("shared");
    std::fs::create_dir_all(&shared).unwrap_or_else(|e| panic!("{}: {e}", shared.display()));
    let mut expr = container(
        "app",
        &format!("echo hi > /out/file; {LONG_RUNNING}"),
        json!([{"name": "shared", "mountPath": "/out", "subPathExpr": "$(POD_NAME)"}]),
    );
    expr["env"] =
        json!([{"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}]);
    fake.create_pod(api_pod(
        "expr",
        json!({
            "volumes": [{"name": "shared", "hostPath": {"path": shared.display().to_string()}}],
            "containers": [expr],
        }),
    ));
    fake.create_pod(api_pod(
        "downward",
        json!({
            "volumes": [{"name": "info", "downwardAPI": {"items": [
                {"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}},
            ]}}],
            "containers": [container(
                "app",
                LONG_RUNNING,
                json!([{"name": "info", "mountPath": "/etc/podlabels", "subPath": "labels"}]),
            )],
        }),
    ));

    wait_until(SETTLE, "the bystander runs", || {
        ctd.pod_running("plant", &["bystander"])
    });
    for name in ["app", "probe"] {
        wait_until(
            SETTLE,
            &format!("plant/{name} reports CreateContainerConfigError"),
            || {
                fake.pod("default", "plant").is_some_and(|p| {
                    str_at(&container_status(&p, name), "/state/waiting/reason")
                        == "CreateContainerConfigError"
                })
            },
        );
    }
    let pod = fake.pod("default", "plant").unwrap_or_default();
    let message = container_status(&pod, "app");
    let message = str_at(&message, "/state/waiting/message");
    assert!(
        message.contains("container \"app\"")
            && message.contains("volumeMounts \"data\"")
            && message.contains("subPath \"x\"")
            && message.contains("symlink"),
        "{message}"
    );
    assert!(
        ctd.container_ids_named("plant", "app").is_empty(),
        "app was created"
    );
    assert!(
        ctd.container_ids_named("plant", "probe").is_empty(),
        "probe was created"
    );
    assert!(!exposed.exists(), "the host directory was mounted into app");
    assert!(!probe.exists(), "{} was made on the host", probe.display());

    wait_until(SETTLE, "pod expr runs", || {
        ctd.pod_running("expr", &["app"])
    });
    wait_until(SETTLE, "expr's file lands in its own directory", || {
        shared.join("expr").join("file").is_file()
    });
    assert!(
        !shared.join("file").exists(),
        "the whole hostPath was mounted"
    );

    wait_until(SETTLE, "pod downward runs", || {
        ctd.pod_running("downward", &["app"])
    });
    let app = ctd.container_ids_named("downward", "app")[0].clone();
    let labels = ctd
        .exec_printing(&app, &["cat", "/etc/podlabels"])
        .unwrap_or_else(|e| panic!("cat /etc/podlabels: {e}"));
    assert_eq!(labels.trim(), "app=\"downward\"");

    let root = kubelet.root_dir();
    assert!(
        !mounts_below(&root.join("pods")).is_empty(),
        "the subPaths are bind mounts under the root dir"
    );
    for name in ["plant", "expr", "downward"] {
        fake.delete_pod("default", name, Some(0));
    }
    for name in ["plant", "expr", "downward"] {
        wait_until(SETTLE, &format!("pod {name} is gone"), || {
            ctd.pod_gone(name) && fake.pod("default", name).is_none()
        });
    }
    wait_until(SETTLE, "no mount is left under the root dir", || {
        mounts_below(&root).is_empty()
    });
    assert!(
        shared.join("expr").join("file").is_file(),
        "the hostPath's files stay"
    );
    assert!(!probe.exists());
}

/// A container swaps a symlink to a host directory and a directory at
/// `s` in a loop while other containers mounting `subPath: s` start and
/// restart: what they write never reaches the host directory.
#[test]
fn a_symlink_swapped_in_a_loop_never_redirects_a_sub_path() {
    let fake = FakeApiServer::start();
    let ctd = PrivateContainerd::start();
    let _kubelet = crate::e2e::start_joined(&ctd, &fake);
    let host = ctd.dir().join("race-host");
    std::fs::create_dir_all(&host).unwrap_or_else(|e| panic!("{}: {e}", host.display()));
    let swap = format!(
        "while :; do rm -rf /data/s; ln -s {} /data/s; rm -f /data/s; mkdir /data/s; done",
        host.display()
    );
    let mut containers = vec![container(
        "swapper",
        &swap,
        json!([{"name": "data", "mountPath": "/data"}]),
    )];
    for i in 0..6 {
        containers.push(container(
            &format!("victim{i}"),
            "touch /m/marker-$HOSTNAME-$$; sleep 1; exit 0",
            json!([{"name": "data", "mountPath": "/m", "subPath": "s"}]),
        ));
    }
    fake.create_pod(api_pod(
        "race",
        json!({
            "restartPolicy": "Always",
            "volumes": [{"name": "data", "emptyDir": {}}],
            "containers": containers,
        }),
    ));
    wait_until(SETTLE, "the swapper runs", || {
        ctd.pod_running("race", &["swapper"])
    });
    let empty = || {
        std::fs::read_dir(&host)
            .map(|d| d.count() == 0)
            .unwrap_or(false)
    };
    holds_for(
        Duration::from_secs(15),
        "nothing written through subPath s reaches the host directory",
        empty,
    );
    // The race was run: some victims got a directory and started.
    assert!(
        (0..6).any(|i| !ctd
            .container_ids_named("race", &format!("victim{i}"))
            .is_empty()),
        "no victim ever started"
    );
    fake.delete_pod("default", "race", Some(0));
    wait_until(SETTLE, "pod race is gone", || ctd.pod_gone("race"));
    assert!(empty(), "a marker reached the host directory");
}

/// The group and permission bits of `p` (not following a symlink).
fn gid_mode(p: &Path) -> Option<(u32, u32)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::symlink_metadata(p)
        .ok()
        .map(|m| (m.gid(), m.mode() & 0o7777))
}

/// A root container sees its emptyDir with the pod's `fsGroup` (and the
/// set-group-ID bit), then gives a file and the volume back to group 0
/// and narrows their modes. After tinylet restarts and syncs the pod, both
/// keep what the container set: the volume is not walked again (before,
/// the root's group differing from `fsGroup` made every restart walk the
/// tree, path by path, as root).
#[test]
fn a_restarted_tinylet_leaves_an_empty_dir_as_its_containers_set_it() {
    let ctd = PrivateContainerd::start();
    let mut kubelet = Tinylet::start(&ctd, NODE);
    let script = format!(
        "stat -c '%g %a' /data > /data/seen; echo x > /data/f; chgrp 0 /data/f /data; \
         chmod 600 /data/f; chmod 755 /data; touch /data/done; {LONG_RUNNING}"
    );
    let manifest = format!(
        r#"apiVersion: v1
kind: Pod
metadata:
  name: owned
spec:
  terminationGracePeriodSeconds: 2
  securityContext:
    fsGroup: 2000
  volumes:
  - name: data
    emptyDir: {{}}
  containers:
  - name: app
    image: {BUSYBOX_IMAGE}
    imagePullPolicy: IfNotPresent
    command: ["sh", "-c", {script:?}]
    volumeMounts:
    - name: data
      mountPath: /data
"#
    );
    write_manifest(&kubelet.manifest_dir(), "owned.yaml", &manifest);
    let pod = kubelet.pod_name("owned");
    let pods = kubelet.root_dir().join("pods");
    let mut volume = None;
    wait_until(SETTLE, "the container has changed its volume", || {
        volume = std::fs::read_dir(&pods)
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.path().join("volumes/kubernetes.io~empty-dir/data"))
            .find(|d| d.join("done").exists());
        volume.is_some()
    });
    let volume = volume.unwrap_or_default();
    let seen = std::fs::read_to_string(volume.join("seen")).unwrap_or_default();
    assert_eq!(
        seen.trim(),
        "2000 2777",
        "the volume as the container first saw it"
    );
    let set = || (gid_mode(&volume), gid_mode(&volume.join("f")));
    assert_eq!(set(), (Some((0, 0o755)), Some((0, 0o600))));
    let pod_dir = volume.ancestors().nth(3).unwrap_or(&pods).to_path_buf();
    assert!(
        pod_dir
            .join("plugins/kubernetes.io~empty-dir/data/ready")
            .is_file(),
        "no ready marker in {}",
        pod_dir.display()
    );
    let container = ctd.container_ids_named(&pod, "app");

    kubelet.restart();
    let synced = format!("pod default/{pod}: actions");
    wait_until(SETTLE, "the restarted tinylet syncs the pod", || {
        kubelet.log_since_start().contains(&synced)
    });
    holds_for(
        scaled(Duration::from_secs(3)),
        "the volume and its file keep the group and modes the container set",
        || set() == (Some((0, 0o755)), Some((0, 0o600))),
    );
    assert_eq!(
        ctd.container_ids_named(&pod, "app"),
        container,
        "the pod was not adopted as it was"
    );
    kubelet.assert_running();
}
