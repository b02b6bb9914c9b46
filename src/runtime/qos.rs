//! Quality of service on the node (upstream `qos` and the pod container
//! manager's naming): each pod's cgroup parent under `kubepods` by QoS
//! class, for the cgroupfs or systemd driver, the OOM score adjustment of
//! its containers, and removing a finished pod's cgroup.
//!
//! The runtime creates the cgroups named here when it starts the sandbox;
//! the one pod-level limit written is `--pod-max-pids` (`pids.max`), before
//! the pod's containers start; the others are each container's own.

use std::path::Path;

use k8s_openapi::api::core::v1::{Container, Pod};

use crate::pod::qos_class;

/// How cgroups are named and managed (`--cgroup-driver`); it must match the
/// runtime's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CgroupDriver {
    /// Paths such as `/kubepods/burstable/pod<uid>`.
    #[default]
    Cgroupfs,
    /// Slices such as `kubepods-burstable-pod<uid>.slice`.
    Systemd,
}

impl CgroupDriver {
    pub(crate) fn parse(s: &str) -> Result<CgroupDriver, String> {
        match s {
            "cgroupfs" => Ok(CgroupDriver::Cgroupfs),
            "systemd" => Ok(CgroupDriver::Systemd),
            _ => Err(format!(
                "{s:?} is not a cgroup driver (cgroupfs or systemd)"
            )),
        }
    }
}

/// The OOM score adjustment of Guaranteed pods and node-critical pods.
pub(crate) const GUARANTEED_OOM_SCORE_ADJ: i64 = -997;
/// The OOM score adjustment of BestEffort pods.
pub(crate) const BEST_EFFORT_OOM_SCORE_ADJ: i64 = 1000;

/// The cgroup path elements of a pod: `kubepods`, its QoS class unless
/// Guaranteed, and `pod<uid>`.
fn pod_cgroup_names(class: &str, uid: &str) -> Vec<String> {
    let mut names = vec!["kubepods".to_string()];
    match class {
        "Burstable" => names.push("burstable".into()),
        "BestEffort" => names.push("besteffort".into()),
        _ => {}
    }
    names.push(format!("pod{uid}"));
    names
}

fn cgroup_name(names: &[String], driver: CgroupDriver) -> String {
    match driver {
        CgroupDriver::Cgroupfs => format!("/{}", names.join("/")),
        // systemd slice names: '-' separates the levels, so a '-' inside a
        // name becomes '_', as upstream escapes it.
        CgroupDriver::Systemd => {
            let escaped: Vec<String> = names.iter().map(|n| n.replace('-', "_")).collect();
            format!("{}.slice", escaped.join("-"))
        }
    }
}

/// The cgroup parent of a pod's sandbox (upstream `GetPodContainerName`).
pub(crate) fn pod_cgroup_parent(pod: &Pod, driver: CgroupDriver) -> String {
    let uid = pod.metadata.uid.as_deref().unwrap_or("");
    cgroup_name(&pod_cgroup_names(qos_class(pod), uid), driver)
}

/// The pod's cgroup directory, relative to a hierarchy's root: the
/// cgroupfs path, or for systemd the nested slices
/// (`kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid>.slice`).
fn pod_cgroup_dir(pod: &Pod, driver: CgroupDriver) -> String {
    let uid = pod.metadata.uid.as_deref().unwrap_or("");
    let names = pod_cgroup_names(qos_class(pod), uid);
    match driver {
        CgroupDriver::Cgroupfs => names.join("/"),
        CgroupDriver::Systemd => (1..=names.len())
            .map(|n| cgroup_name(&names[..n], driver))
            .collect::<Vec<_>>()
            .join("/"),
    }
}

/// Sets `pids.max` of the pod's cgroup under `cgroup_root`
/// (`/sys/fs/cgroup`; on cgroup v1 its `pids` hierarchy) to `limit`
/// (upstream's `--pod-max-pids`, which its pod container manager writes
/// when it makes the pod's cgroup). The runtime made the cgroup with the
/// sandbox; this runs before any of the pod's containers starts. The error
/// names the file.
pub(crate) fn set_pod_pids_limit(
    cgroup_root: &Path,
    driver: CgroupDriver,
    pod: &Pod,
    limit: i64,
) -> Result<(), String> {
    let uid = pod.metadata.uid.as_deref().unwrap_or("");
    if let Some(e) = crate::paths::uid_error(uid) {
        return Err(format!("pod UID {uid:?}: {e}"));
    }
    let base = if cgroup_root.join("cgroup.controllers").exists() {
        cgroup_root.to_path_buf()
    } else {
        cgroup_root.join("pids")
    };
    let file = base.join(pod_cgroup_dir(pod, driver)).join("pids.max");
    // Not created: the cgroup must be the runtime's, made with the sandbox.
    std::fs::OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(&file)
        .and_then(|mut f| std::io::Write::write_all(&mut f, limit.to_string().as_bytes()))
        .map_err(|e| format!("write {limit} to {}: {e}", file.display()))
}

/// Whether the pod is node-critical: in priority class
/// `system-node-critical` (upstream also requires a critical pod, which
/// every pod of that class is).
fn is_node_critical(pod: &Pod) -> bool {
    let spec = pod.spec.as_ref();
    spec.and_then(|s| s.priority_class_name.as_deref()) == Some("system-node-critical")
}

/// The OOM score adjustment of a container (upstream
/// `GetContainerOOMScoreAdjust`): -997 for Guaranteed and node-critical
/// pods, 1000 for BestEffort, and for Burstable 1000 less the container's
/// share of the node's memory (in thousandths) requested, kept within 3..999.
pub(crate) fn oom_score_adj(pod: &Pod, container: &Container, memory_capacity: i64) -> i64 {
    if is_node_critical(pod) {
        return GUARANTEED_OOM_SCORE_ADJ;
    }
    match qos_class(pod) {
        "Guaranteed" => return GUARANTEED_OOM_SCORE_ADJ,
        "BestEffort" => return BEST_EFFORT_OOM_SCORE_ADJ,
        _ => {}
    }
    let resources = container.resources.as_ref();
    let request = resources
        .and_then(|r| r.requests.as_ref())
        .and_then(|m| m.get("memory"))
        .or_else(|| {
            // An unset request takes the limit, as API defaulting does.
            resources
                .and_then(|r| r.limits.as_ref())
                .and_then(|m| m.get("memory"))
        })
        .and_then(|q| crate::quantity::parse_bytes(&q.0))
        .unwrap_or(0);
    let adj = if memory_capacity > 0 {
        // i128 for the product; a request far over the capacity saturates.
        let share = 1000 * i128::from(request) / i128::from(memory_capacity);
        1000 - i64::try_from(share).unwrap_or(i64::MAX)
    } else {
        BEST_EFFORT_OOM_SCORE_ADJ
    };
    let floor = 1000 + GUARANTEED_OOM_SCORE_ADJ;
    if adj < floor {
        floor
    } else if adj == BEST_EFFORT_OOM_SCORE_ADJ {
        BEST_EFFORT_OOM_SCORE_ADJ - 1
    } else {
        adj
    }
}

/// Removes the (empty) cgroups a finished pod `uid` left under
/// `cgroup_root` (`/sys/fs/cgroup`), whatever its QoS class was, on cgroup
/// v2 and in every v1 hierarchy. Best effort: a cgroup still in use or
/// already gone stays as it is. Only for the cgroupfs driver: a systemd
/// slice is a unit, not to be removed behind systemd's back.
pub(crate) fn remove_pod_cgroups(cgroup_root: &Path, driver: CgroupDriver, uid: &str) {
    // A UID that is not one plain path element names no cgroup of ours.
    if driver != CgroupDriver::Cgroupfs || crate::paths::uid_error(uid).is_some() {
        return;
    }
    let mut bases = vec![cgroup_root.to_path_buf()];
    if !cgroup_root.join("cgroup.controllers").exists() {
        // v1: one hierarchy per directory.
        if let Ok(entries) = std::fs::read_dir(cgroup_root) {
            bases = entries.flatten().map(|e| e.path()).collect();
        }
    }
    for class in ["Guaranteed", "Burstable", "BestEffort"] {
        let rel = pod_cgroup_names(class, uid).join("/");
        for base in &bases {
            let dir = base.join(&rel);
            match std::fs::remove_dir(&dir) {
                Ok(()) => log::debug!("removed cgroup {}", dir.display()),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => log::debug!("cannot remove cgroup {}: {e}", dir.display()),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(containers: serde_json::Value, extra: serde_json::Value) -> Pod {
        let mut spec = serde_json::json!({ "containers": containers });
        if let (Some(s), serde_json::Value::Object(e)) = (spec.as_object_mut(), extra) {
            s.extend(e);
        }
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "uid": "1234-ab"},
            "spec": spec
        }))
        .unwrap()
    }

    #[test]
    fn cgroup_parents_by_class_and_driver() {
        let none = serde_json::json!({});
        let best = pod(serde_json::json!([{"name": "a"}]), none.clone());
        let burst = pod(
            serde_json::json!([{"name": "a", "resources": {"requests": {"memory": "1Gi"}}}]),
            none.clone(),
        );
        let guar = pod(
            serde_json::json!([{"name": "a", "resources": {"limits": {"memory": "1Gi", "cpu": "1"}}}]),
            none,
        );
        use CgroupDriver::*;
        assert_eq!(
            pod_cgroup_parent(&best, Cgroupfs),
            "/kubepods/besteffort/pod1234-ab"
        );
        assert_eq!(
            pod_cgroup_parent(&burst, Cgroupfs),
            "/kubepods/burstable/pod1234-ab"
        );
        assert_eq!(pod_cgroup_parent(&guar, Cgroupfs), "/kubepods/pod1234-ab");
        assert_eq!(
            pod_cgroup_parent(&best, Systemd),
            "kubepods-besteffort-pod1234_ab.slice"
        );
        assert_eq!(
            pod_cgroup_parent(&guar, Systemd),
            "kubepods-pod1234_ab.slice"
        );
        assert_eq!(CgroupDriver::parse("systemd"), Ok(Systemd));
        assert!(CgroupDriver::parse("cgroupsfs").is_err());
    }

    #[test]
    fn oom_score_adj_as_upstream() {
        let gi: i64 = 1 << 30;
        let none = serde_json::json!({});
        let best = pod(serde_json::json!([{"name": "a"}]), none.clone());
        let c = |p: &Pod| p.spec.as_ref().unwrap().containers[0].clone();
        assert_eq!(oom_score_adj(&best, &c(&best), 4 * gi), 1000);
        let guar = pod(
            serde_json::json!([{"name": "a", "resources": {"limits": {"memory": "1Gi", "cpu": "1"}}}]),
            none.clone(),
        );
        assert_eq!(oom_score_adj(&guar, &c(&guar), 4 * gi), -997);
        let burst = |req: &str| {
            pod(
                serde_json::json!([{"name": "a", "resources": {"requests": {"memory": req}}},
                                   {"name": "b"}]),
                serde_json::json!({}),
            )
        };
        let p = burst("1Gi");
        assert_eq!(oom_score_adj(&p, &c(&p), 4 * gi), 750);
        let p = burst("4Gi");
        assert_eq!(oom_score_adj(&p, &c(&p), 4 * gi), 3);
        let p = burst("1");
        assert_eq!(oom_score_adj(&p, &c(&p), 4 * gi), 999);
        // The container without a request in a Burstable pod.
        let b = p.spec.as_ref().unwrap().containers[1].clone();
        assert_eq!(oom_score_adj(&p, &b, 4 * gi), 999);
        let critical = pod(
            serde_json::json!([{"name": "a"}]),
            serde_json::json!({"priorityClassName": "system-node-critical"}),
        );
        assert_eq!(oom_score_adj(&critical, &c(&critical), 4 * gi), -997);
    }

    #[test]
    fn pod_pids_limit_goes_to_the_pods_own_cgroup() {
        use CgroupDriver::*;
        let best = pod(serde_json::json!([{"name": "a"}]), serde_json::json!({}));
        for (v2, driver, dir) in [
            (true, Cgroupfs, "kubepods/besteffort/pod1234-ab"),
            (false, Cgroupfs, "pids/kubepods/besteffort/pod1234-ab"),
            (
                true,
                Systemd,
                "kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod1234_ab.slice",
            ),
        ] {
            let root = tempfile::tempdir().unwrap();
            if v2 {
                std::fs::write(root.path().join("cgroup.controllers"), "pids").unwrap();
            }
            // The runtime has not made the cgroup: an error naming the file.
            let e = set_pod_pids_limit(root.path(), driver, &best, 64).unwrap_err();
            assert!(e.contains(&format!("{dir}/pids.max")), "{e}");
            let cg = root.path().join(dir);
            std::fs::create_dir_all(&cg).unwrap();
            std::fs::write(cg.join("pids.max"), "max").unwrap();
            set_pod_pids_limit(root.path(), driver, &best, 64).unwrap();
            assert_eq!(std::fs::read_to_string(cg.join("pids.max")).unwrap(), "64");
        }
        // A UID that is no plain path element names no cgroup.
        let mut evil = best.clone();
        evil.metadata.uid = Some("../../x".into());
        let root = tempfile::tempdir().unwrap();
        assert!(set_pod_pids_limit(root.path(), Cgroupfs, &evil, 1).is_err());
    }

    #[test]
    fn removes_empty_pod_cgroups_in_every_hierarchy() {
        let root = tempfile::tempdir().unwrap();
        // A v1 layout: two hierarchies; one pod cgroup still busy.
        for h in ["cpu", "memory"] {
            std::fs::create_dir_all(root.path().join(h).join("kubepods/burstable/pod1234-ab"))
                .unwrap();
        }
        std::fs::create_dir_all(
            root.path()
                .join("memory/kubepods/besteffort/pod1234-ab/busy"),
        )
        .unwrap();
        remove_pod_cgroups(root.path(), CgroupDriver::Cgroupfs, "1234-ab");
        for h in ["cpu", "memory"] {
            assert!(!root
                .path()
                .join(h)
                .join("kubepods/burstable/pod1234-ab")
                .exists());
            assert!(root.path().join(h).join("kubepods/burstable").exists());
        }
        assert!(root
            .path()
            .join("memory/kubepods/besteffort/pod1234-ab")
            .exists());
        // v2: one tree.
        let v2 = tempfile::tempdir().unwrap();
        std::fs::write(v2.path().join("cgroup.controllers"), "cpu memory").unwrap();
        std::fs::create_dir_all(v2.path().join("kubepods/pod1234-ab")).unwrap();
        remove_pod_cgroups(v2.path(), CgroupDriver::Systemd, "1234-ab");
        assert!(v2.path().join("kubepods/pod1234-ab").exists());
        remove_pod_cgroups(v2.path(), CgroupDriver::Cgroupfs, "1234-ab");
        assert!(!v2.path().join("kubepods/pod1234-ab").exists());
    }
}
