//! End-to-end on a read-only root: tinylet in a mount namespace of its own
//! where everything but the kernel's filesystems, /run, its `--root-dir`
//! and its `--pod-logs-dir` is read-only (its working directory and
//! manifest dir included), against a private containerd outside it. A
//! write anywhere else fails with EROFS, which the tests look for.

use std::path::Path;
use std::time::Duration;

use serde_json::json;

use crate::e2e::{LONG_RUNNING, NODE, SETTLE};
use crate::support::containerd::{
    holds_for, remove_manifest, wait_until, write_manifest, PrivateContainerd, Tinylet,
    BUSYBOX_IMAGE, POD_UID_LABEL,
};

/// A static pod whose container writes to an emptyDir and to its log,
/// leaves a termination message, and then runs until stopped.
fn manifest(version: &str) -> String {
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "web"},
        "spec": {
            "terminationGracePeriodSeconds": 5,
            "volumes": [{"name": "scratch", "emptyDir": {}}],
            "containers": [{
                "name": "app",
                "image": BUSYBOX_IMAGE,
                "imagePullPolicy": "Never",
                "command": ["sh", "-c", format!(
                    "echo {version} > /scratch/version; echo {version} > /dev/termination-log; \
                     echo started {version}; {LONG_RUNNING}"
                )],
                "volumeMounts": [{"name": "scratch", "mountPath": "/scratch"}],
            }],
        },
    })
    .to_string()
}

/// The mount options of the mount at `mount_point` as process `pid` sees
/// it (from its /proc/PID/mountinfo), e.g. "ro,relatime".
fn mount_options(pid: u32, mount_point: &Path) -> Option<String> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/mountinfo")).ok()?;
    let want = mount_point.to_string_lossy();
    // The last one listed is the one on top.
    text.lines()
        .rev()
        .map(|l| l.split(' ').collect::<Vec<_>>())
        .find(|f| f.len() > 5 && f[4] == want)
        .map(|f| f[5].to_string())
}

/// What a write tinylet should not have made leaves in its log.
fn assert_no_write_refused(kubelet: &Tinylet) {
    let log = std::fs::read_to_string(kubelet.log_path()).unwrap_or_default();
    for needle in ["Read-only file system", "os error 30"] {
        assert!(
            !log.contains(needle),
            "tinylet tried to write outside --root-dir and --pod-logs-dir ({needle:?} in its log)\n{}",
            kubelet.log_tail(60)
        );
    }
}

/// The whole static-pod lifecycle with only --root-dir, --pod-logs-dir and
/// /run writable: a pod starts (its emptyDir, /etc/hosts, termination log
/// and log directory made), a spec edit replaces it, a restarted tinylet
/// adopts it, and removing the manifest removes it.
#[test]
fn static_pod_lifecycle_on_a_read_only_root() {
    let ctd = PrivateContainerd::start();
    let mut kubelet = Tinylet::start_read_only_root(&ctd, NODE, &[]);
    let dir = kubelet.manifest_dir();
    let web = kubelet.pod_name("web");

    write_manifest(&dir, "web.yaml", &manifest("v1"));
    wait_until(SETTLE, "web-edge-1 runs on a read-only root", || {
        ctd.pod_running(&web, &["app"])
    });

    // The premise: in tinylet's namespace / and its working directory are
    // read-only, the two dirs it may write to are not.
    let pid = kubelet.pid().expect("tinylet pid");
    let opts = |p: &Path| mount_options(pid, p).unwrap_or_default();
    let root_opts = opts(Path::new("/"));
    assert!(
        root_opts.split(',').any(|o| o == "ro"),
        "/ is {root_opts:?}"
    );
    for writable in [kubelet.root_dir(), kubelet.logs_dir()] {
        let o = opts(&writable);
        assert!(
            o.split(',').any(|o| o == "rw"),
            "{} is {o:?}",
            writable.display()
        );
    }
    let cwd = std::fs::read_link(format!("/proc/{pid}/cwd")).expect("tinylet's cwd");
    assert_eq!(cwd, kubelet.base_dir());

    // What tinylet wrote is under --root-dir and --pod-logs-dir.
    let sandbox = ctd.sandbox_ids(&web)[0].clone();
    let app = ctd.container_ids_named(&web, "app")[0].clone();
    let uid = ctd
        .object(&sandbox)
        .map(|o| o.label(POD_UID_LABEL).to_string())
        .unwrap_or_default();
    assert!(!uid.is_empty());
    let pod_dir = kubelet.root_dir().join("pods").join(&uid);
    let hosts = std::fs::read_to_string(pod_dir.join("etc-hosts"))
        .unwrap_or_else(|e| panic!("{}/etc-hosts: {e}", pod_dir.display()));
    assert!(hosts.contains("web"), "etc-hosts: {hosts}");
    assert_eq!(
        ctd.exec_printing(&app, &["cat", "/scratch/version"])
            .as_deref(),
        Ok("v1\n")
    );
    let log_dir = kubelet
        .logs_dir()
        .join(format!("default_{web}_{uid}"))
        .join("app");
    wait_until(SETTLE, "the container's log is in --pod-logs-dir", || {
        std::fs::read_to_string(log_dir.join("0.log")).is_ok_and(|l| l.contains("started v1"))
    });

    // A spec edit replaces the pod.
    write_manifest(&dir, "web.yaml", &manifest("v2"));
    wait_until(SETTLE, "the edited web pod replaces the old one", || {
        let sandboxes = ctd.sandbox_ids(&web);
        sandboxes.len() == 1
            && sandboxes[0] != sandbox
            && ctd.object(&app).is_none()
            && ctd.pod_running(&web, &["app"])
    });
    let sandbox = ctd.sandbox_ids(&web)[0].clone();
    let app = ctd.container_ids_named(&web, "app")[0].clone();
    assert_eq!(
        ctd.exec_printing(&app, &["cat", "/scratch/version"])
            .as_deref(),
        Ok("v2\n")
    );
    wait_until(SETTLE, "the old pod's directory is removed", || {
        !pod_dir.exists()
    });

    // A restarted tinylet (in a fresh namespace) adopts the pod.
    kubelet.sigkill();
    kubelet.restart();
    holds_for(
        Duration::from_secs(6),
        "web-edge-1 is adopted: same sandbox and container, running",
        || {
            ctd.sandbox_ids(&web) == [sandbox.clone()]
                && ctd.container_ids_named(&web, "app") == [app.clone()]
                && ctd.pod_running(&web, &["app"])
        },
    );

    // Removing the manifest removes the pod and its directory.
    remove_manifest(&dir, "web.yaml");
    wait_until(SETTLE, "web-edge-1 is removed", || ctd.pod_gone(&web));
    wait_until(
        SETTLE,
        "the pod's directory under --root-dir is removed",
        || std::fs::read_dir(kubelet.root_dir().join("pods")).is_ok_and(|d| d.count() == 0),
    );
    kubelet.assert_running();
    assert_no_write_refused(&kubelet);
}

/// A `--root-dir` on a read-only filesystem is refused at start, naming the
/// path and the reason, before tinylet so much as connects to the runtime.
#[test]
fn a_read_only_root_dir_is_refused_at_start() {
    let ctd = PrivateContainerd::start();
    let mut kubelet = Tinylet::start_read_only_root_dir(&ctd, NODE, &[]);
    write_manifest(&kubelet.manifest_dir(), "web.yaml", &manifest("v1"));
    let status = kubelet.wait_for_exit(SETTLE);
    assert!(!status.success(), "tinylet exited with {status}");
    let log = std::fs::read_to_string(kubelet.log_path()).unwrap_or_default();
    let want = format!(
        "--root-dir {}: not writable: Read-only file system (os error 30)",
        kubelet.root_dir().display()
    );
    assert!(log.contains(&want), "no {want:?} in the log:\n{log}");
    assert!(
        !log.contains("container runtime"),
        "tinylet went on to the runtime:\n{log}"
    );
    let held = ctd.ctr(&["containers", "ls", "-q"]);
    assert!(held.trim().is_empty(), "containerd holds {held:?}");
}
