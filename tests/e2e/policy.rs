//! End-to-end tests of the node's admission policy on a real, private
//! containerd: `--allow-privileged=false` holds when a manifest pod is
//! edited in place to become privileged, and pod sysctls are admitted as
//! upstream does (the safe set, `--allowed-unsafe-sysctls`, reason
//! SysctlForbidden).

use std::time::Duration;

use crate::e2e::{yaml_pod, LONG_RUNNING, NODE, SETTLE};
use crate::support::containerd::{
    holds_for, wait_until, write_manifest, PrivateContainerd, Tinylet,
};

/// A manifest pod with its own UID (so an edit keeps the UID and is an
/// update of the running pod) edited to run a privileged container under
/// `--allow-privileged=false`: the edit is refused with the reason in the
/// log, the running pod stops, and the privileged container never runs.
#[test]
fn an_edit_to_privileged_is_refused_and_the_pod_stops() {
    let ctd = PrivateContainerd::start();
    let kubelet = Tinylet::start_with(&ctd, NODE, &["--allow-privileged=false"]);
    let dir = kubelet.manifest_dir();
    let pod = kubelet.pod_name("guard");
    let plain = yaml_pod("guard", LONG_RUNNING, "").replace(
        "metadata:\n  name: guard\n",
        "metadata:\n  name: guard\n  uid: guard-uid-1\n",
    );
    assert!(plain.contains("uid: guard-uid-1"), "{plain}");
    write_manifest(&dir, "guard.yaml", &plain);
    wait_until(SETTLE, "the plain pod runs", || {
        ctd.pod_running(&pod, &["app"])
    });
    assert_eq!(ctd.container_ids(&pod).len(), 1);

    let privileged = plain.replace(
        "  - name: app\n",
        "  - name: app\n    securityContext:\n      privileged: true\n",
    );
    assert!(privileged.contains("privileged: true"), "{privileged}");
    write_manifest(&dir, "guard.yaml", &privileged);
    let line = format!(
        "pod default/{pod}: update rejected by admission: PrivilegedForbidden: \
         Pod specified privileged container \"app\""
    );
    wait_until(SETTLE, "the edit is refused in the log", || {
        kubelet.log_since_start().contains(&line)
    });
    wait_until(SETTLE, "the pod stops", || ctd.pod_gone(&pod));
    holds_for(
        Duration::from_secs(5),
        "no container of the refused pod runs",
        || ctd.container_ids(&pod).is_empty() && ctd.sandbox_ids(&pod).is_empty(),
    );
}

/// Sysctls: an unsafe one is refused with SysctlForbidden (and never runs),
/// one `--allowed-unsafe-sysctls` names runs with its value, a safe one
/// runs, and a net sysctl of a hostNetwork pod is refused.
#[test]
fn unsafe_sysctls_are_refused_unless_allowed() {
    let ctd = PrivateContainerd::start();
    let kubelet = Tinylet::start_with(&ctd, NODE, &["--allowed-unsafe-sysctls", "kernel.msg*"]);
    let dir = kubelet.manifest_dir();
    let with_sysctl = |name: &str, sysctl: &str, value: &str, host_net: bool| {
        let host = if host_net {
            "  hostNetwork: true\n"
        } else {
            ""
        };
        yaml_pod(
            name,
            LONG_RUNNING,
            &format!(
                "{host}  securityContext:\n    sysctls:\n    - name: {sysctl}\n      value: \"{value}\"\n"
            ),
        )
    };
    write_manifest(
        &dir,
        "unsafe.yaml",
        &with_sysctl("unsafe", "net.core.somaxconn", "1000", false),
    );
    write_manifest(
        &dir,
        "allowed.yaml",
        &with_sysctl("allowed", "kernel.msgmax", "12345", false),
    );
    write_manifest(
        &dir,
        "safe.yaml",
        &with_sysctl("safe", "net.ipv4.ip_unprivileged_port_start", "80", false),
    );
    write_manifest(
        &dir,
        "hostnet.yaml",
        &with_sysctl("hostnet", "net.ipv4.tcp_syncookies", "1", true),
    );
    let (unsafe_pod, allowed, safe, hostnet) = (
        kubelet.pod_name("unsafe"),
        kubelet.pod_name("allowed"),
        kubelet.pod_name("safe"),
        kubelet.pod_name("hostnet"),
    );
    wait_until(SETTLE, "the allowed and safe pods run", || {
        ctd.pod_running(&allowed, &["app"]) && ctd.pod_running(&safe, &["app"])
    });
    let id = &ctd.container_ids(&allowed)[0];
    assert_eq!(
        ctd.exec_printing(id, &["cat", "/proc/sys/kernel/msgmax"])
            .unwrap()
            .trim(),
        "12345"
    );
    let id = &ctd.container_ids(&safe)[0];
    assert_eq!(
        ctd.exec_printing(
            id,
            &["cat", "/proc/sys/net/ipv4/ip_unprivileged_port_start"]
        )
        .unwrap()
        .trim(),
        "80"
    );
    let log = kubelet.log_since_start();
    assert!(
        log.contains(&format!(
            "pod default/{unsafe_pod}: rejected by admission: SysctlForbidden: \
             forbidden sysctl: \"net.core.somaxconn\" not allowed"
        )),
        "{log}"
    );
    assert!(
        log.contains(&format!(
            "pod default/{hostnet}: rejected by admission: SysctlForbidden: \
             forbidden sysctl: \"net.ipv4.tcp_syncookies\" not allowed with host net enabled"
        )),
        "{log}"
    );
    holds_for(Duration::from_secs(3), "the refused pods never run", || {
        ctd.sandbox_ids(&unsafe_pod).is_empty() && ctd.sandbox_ids(&hostnet).is_empty()
    });
}

/// `--pod-max-pids=12 --seccomp-default`: the pod's cgroup gets
/// `pids.max` 12 before its container starts, a fork bomb in the container
/// stops at it, and the container (with no profile of its own) runs under
/// a seccomp filter.
#[test]
fn the_pod_process_limit_and_the_default_seccomp_profile_hold() {
    let ctd = PrivateContainerd::start();
    let kubelet = Tinylet::start_with(&ctd, NODE, &["--pod-max-pids=12", "--seccomp-default"]);
    let pod = kubelet.pod_name("capped");
    write_manifest(
        &kubelet.manifest_dir(),
        "capped.yaml",
        &yaml_pod("capped", LONG_RUNNING, ""),
    );
    wait_until(SETTLE, "the pod runs", || ctd.pod_running(&pod, &["app"]));
    let uid = ctd
        .pod_objects(&pod)
        .iter()
        .map(|o| o.label("io.kubernetes.pod.uid").to_string())
        .find(|u| !u.is_empty())
        .expect("the pod's UID label");
    let cgroup = ["/sys/fs/cgroup/pids", "/sys/fs/cgroup"]
        .iter()
        .map(|root| std::path::Path::new(root).join(format!("kubepods/besteffort/pod{uid}")))
        .find(|d| d.join("pids.max").exists())
        .expect("the pod's pids cgroup");
    let read = |f: &str| {
        std::fs::read_to_string(cgroup.join(f))
            .unwrap_or_default()
            .trim()
            .to_string()
    };
    assert_eq!(read("pids.max"), "12");

    let id = ctd.container_ids(&pod).pop().expect("the app container");
    // The seccomp check goes first: once the fork bomb has filled the pod's
    // pids cgroup, a later exec can fail in runc's own clones, depending on
    // when runc moves its init process into the cgroup.
    let status = ctd.exec_printing(&id, &["grep", "^Seccomp:", "/proc/1/status"]);
    assert!(
        matches!(&status, Ok(out) if out.split_whitespace().nth(1) == Some("2")),
        "the container runs without a seccomp filter: {status:?}"
    );

    let bomb = ctd.exec(
        &id,
        &[
            "sh",
            "-c",
            "i=0; while [ $i -lt 40 ]; do sleep 600 & i=$((i+1)); done; echo all-forked",
        ],
    );
    assert!(
        !matches!(&bomb, Ok(out) if out.contains("all-forked")),
        "40 forks went through a limit of 12: {bomb:?}"
    );
    let current: u64 = read("pids.current").parse().unwrap_or(u64::MAX);
    assert!(current <= 12, "pids.current {current} over the limit");
}
