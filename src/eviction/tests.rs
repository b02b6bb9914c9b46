//! Unit tests of the eviction thresholds, signals, ranking, admission and messages.

use super::*;
use crate::stats::{ContainerUsage, VolumeUsage};

fn settings(hard: &str, soft: &str, grace: &str, reclaim: &str) -> Settings {
    Settings {
        hard: parse_map(hard, '<').unwrap(),
        soft: parse_map(soft, '<').unwrap(),
        soft_grace_period: parse_map(grace, '=').unwrap(),
        minimum_reclaim: parse_map(reclaim, '=').unwrap(),
        ..Settings::default()
    }
}

#[test]
fn default_hard_thresholds() {
    let t = thresholds(&Settings::default()).unwrap();
    let by = |s: Signal| t.iter().find(|t| t.signal == s).copied().unwrap();
    assert_eq!(t.len(), 4);
    assert_eq!(
        by(Signal::MemoryAvailable).value,
        Value::Quantity(100 << 20)
    );
    assert_eq!(by(Signal::NodeFsAvailable).value, Value::Fraction(0.10));
    assert_eq!(by(Signal::NodeFsInodesFree).value, Value::Fraction(0.05));
    assert_eq!(by(Signal::ImageFsAvailable).value, Value::Fraction(0.15));
    assert!(t.iter().all(|t| t.is_hard() && t.min_reclaim.is_none()));
    assert_eq!(
        hard_value(&Settings::default(), Signal::MemoryAvailable),
        "100Mi"
    );
    assert_eq!(
        hard_value(&Settings::default(), Signal::NodeFsAvailable),
        "10%"
    );
    assert_eq!(hard_value(&Settings::default(), Signal::PidAvailable), "0");
}

#[test]
fn soft_thresholds_grace_periods_and_min_reclaim() {
    let s = settings(
        "memory.available<1Gi, pid.available<0%",
        "nodefs.available<20%",
        "nodefs.available=1m30s",
        "nodefs.available=500Mi,memory.available=5%",
    );
    let t = thresholds(&s).unwrap();
    // 0% turns a threshold off.
    assert_eq!(t.len(), 2);
    assert_eq!(t[0].signal, Signal::MemoryAvailable);
    assert_eq!(t[0].min_reclaim, Some(Value::Fraction(0.05)));
    assert_eq!(t[1].signal, Signal::NodeFsAvailable);
    assert_eq!(t[1].grace_period, Duration::from_secs(90));
    assert_eq!(t[1].min_reclaim, Some(Value::Quantity(500 << 20)));
    assert!(!t[1].is_hard());
}

#[test]
fn bad_thresholds_are_named() {
    for (s, want) in [
        (
            settings("memory.free<1Gi", "", "", ""),
            "unsupported eviction signal memory.free",
        ),
        (
            settings("", "memory.available<1Gi", "", ""),
            "grace period must be specified for the soft eviction threshold memory.available",
        ),
        (
            settings("memory.available<-1", "", "", ""),
            "eviction threshold memory.available must be positive",
        ),
        (
            settings("nodefs.available<120%", "", "", ""),
            "must be <= 100%",
        ),
        (
            settings("nodefs.available<lots", "", "", ""),
            "nodefs.available",
        ),
        (
            settings("", "", "nodefs.available=soon", ""),
            "grace period of nodefs.available",
        ),
    ] {
        let e = thresholds(&s).unwrap_err();
        assert!(e.contains(want), "{e}");
    }
    assert!(parse_map("memory.available=1Gi", '<')
        .unwrap_err()
        .contains("malformed pair"));
}

fn observe(signal: Signal, available: i128, capacity: i128) -> Observations {
    Observations::from([(
        signal,
        Observation {
            available,
            capacity,
        },
    )])
}

#[test]
fn thresholds_met_by_observations() {
    let t = thresholds(&settings(
        "nodefs.available<10%",
        "",
        "",
        "nodefs.available=5%",
    ))
    .unwrap();
    // 9 of 100 available: met; 10 is not below 10%.
    assert_eq!(
        thresholds_met(&t, &observe(Signal::NodeFsAvailable, 9, 100), false).len(),
        1
    );
    assert!(thresholds_met(&t, &observe(Signal::NodeFsAvailable, 10, 100), false).is_empty());
    // With the minimum reclaim, 14 is still short of 10% + 5%.
    assert_eq!(
        thresholds_met(&t, &observe(Signal::NodeFsAvailable, 14, 100), true).len(),
        1
    );
    assert!(thresholds_met(&t, &observe(Signal::NodeFsAvailable, 15, 100), true).is_empty());
    // No observation of a signal: nothing met.
    assert!(thresholds_met(&t, &Observations::new(), false).is_empty());
}

#[test]
fn tracker_grace_min_reclaim_and_transition_period() {
    let t = thresholds(&settings(
        "nodefs.available<10%",
        "memory.available<500",
        "memory.available=30s",
        "nodefs.available=5%",
    ))
    .unwrap();
    let mut tr = Tracker::default();
    let t0 = Instant::now();
    let period = Duration::from_secs(60);
    let mut low = observe(Signal::NodeFsAvailable, 5, 100);
    low.insert(
        Signal::MemoryAvailable,
        Observation {
            available: 100,
            capacity: 1000,
        },
    );
    let s = tr.step(&t, &low, period, t0);
    assert_eq!(s.conditions, vec![Condition::Memory, Condition::Disk]);
    // The hard one drives eviction at once, the soft one after 30 s.
    assert_eq!(s.thresholds.len(), 1);
    assert_eq!(s.thresholds[0].signal, Signal::NodeFsAvailable);
    let s = tr.step(&t, &low, period, t0 + Duration::from_secs(31));
    assert_eq!(s.thresholds.len(), 2);

    // Back above the threshold but not its minimum reclaim: still met.
    let mid = observe(Signal::NodeFsAvailable, 12, 100);
    let s = tr.step(&t, &mid, period, t0 + Duration::from_secs(40));
    assert_eq!(s.thresholds.len(), 1);
    // Reclaimed: nothing to act on, but the conditions stay for the
    // transition period after they were last seen.
    let ok = observe(Signal::NodeFsAvailable, 50, 100);
    let s = tr.step(&t, &ok, period, t0 + Duration::from_secs(50));
    assert!(s.thresholds.is_empty());
    assert_eq!(s.conditions, vec![Condition::Memory, Condition::Disk]);
    let s = tr.step(&t, &ok, period, t0 + Duration::from_secs(95));
    assert_eq!(s.conditions, vec![Condition::Disk]);
    let s = tr.step(&t, &ok, period, t0 + Duration::from_secs(101));
    assert!(s.conditions.is_empty());

    let state = State::default();
    state.set(&[Condition::Disk, Condition::Pid]);
    assert!(state.has(Condition::Disk) && !state.has(Condition::Memory));
    assert_eq!(state.conditions(), vec![Condition::Disk, Condition::Pid]);
}

fn pod(name: &str, spec: serde_json::Value) -> Pod {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "namespace": "default", "uid": name},
        "spec": spec,
    }))
    .unwrap()
}

fn container(requests: serde_json::Value) -> serde_json::Value {
    serde_json::json!({"name": "c", "image": "i", "resources": {"requests": requests}})
}

fn disk_usage(bytes: u64) -> PodUsage {
    PodUsage {
        containers: vec![ContainerUsage {
            name: "c".into(),
            memory_working_set: Some(bytes),
            rootfs_bytes: Some(bytes),
            rootfs_inodes: Some(1),
            logs_bytes: Some(0),
            logs_inodes: Some(1),
            logs_incomplete: false,
        }],
        volumes: vec![],
    }
}

#[test]
fn ranking_for_disk_and_memory() {
    use serde_json::json;
    // a: within its request; b: over, priority 0; c: over, priority 10,
    // biggest; d: over, priority 0, using more than b.
    let a = pod(
        "a",
        json!({"containers": [container(json!({"ephemeral-storage": "1Gi", "memory": "1Gi"}))]}),
    );
    let b = pod("b", json!({"containers": [container(json!({}))]}));
    let c = pod(
        "c",
        json!({"priority": 10, "containers": [container(json!({}))]}),
    );
    let d = pod("d", json!({"containers": [container(json!({}))]}));
    let usage: std::collections::HashMap<&str, PodUsage> = [
        ("a", disk_usage(500 << 20)),
        ("b", disk_usage(10 << 20)),
        ("c", disk_usage(900 << 20)),
        ("d", disk_usage(20 << 20)),
    ]
    .into_iter()
    .collect();
    for signal in [Signal::NodeFsAvailable, Signal::MemoryAvailable] {
        let mut pods: Vec<&Pod> = vec![&a, &b, &c, &d];
        rank(&mut pods, signal, &|p: &Pod| {
            usage.get(p.metadata.name.as_deref().unwrap())
        });
        let names: Vec<&str> = pods
            .iter()
            .map(|p| p.metadata.name.as_deref().unwrap())
            .collect();
        assert_eq!(names, ["d", "b", "c", "a"], "{signal}");
    }
}

#[test]
fn critical_pods_and_admission() {
    use serde_json::json;
    let best_effort = pod("be", json!({"containers": [container(json!({}))]}));
    let burstable = pod(
        "bu",
        json!({"containers": [container(json!({"memory": "1Mi"}))]}),
    );
    let critical = pod(
        "cr",
        json!({"priority": 2000001000, "containers": [container(json!({}))]}),
    );
    let mut static_pod = best_effort.clone();
    static_pod.metadata.annotations = Some(
        [(
            "kubernetes.io/config.source".to_string(),
            "file".to_string(),
        )]
        .into_iter()
        .collect(),
    );
    assert!(is_critical(&critical) && is_critical(&static_pod));
    assert!(!is_critical(&best_effort));

    let mem = [Condition::Memory];
    assert_eq!(
        admit(&best_effort, &mem).unwrap_err(),
        "The node had condition: [MemoryPressure]. "
    );
    assert!(admit(&burstable, &mem).is_ok());
    assert!(admit(&critical, &mem).is_ok());
    let tolerant = pod(
        "t",
        json!({"containers": [container(json!({}))], "tolerations": [
            {"key": "node.kubernetes.io/memory-pressure", "operator": "Exists", "effect": "NoSchedule"}
        ]}),
    );
    assert!(admit(&tolerant, &mem).is_ok());
    let disk = [Condition::Memory, Condition::Disk];
    assert_eq!(
        admit(&burstable, &disk).unwrap_err(),
        "The node had condition: [MemoryPressure DiskPressure]. "
    );
    assert!(admit(&static_pod, &disk).is_ok());
    assert!(admit(&best_effort, &[]).is_ok());
}

#[test]
fn messages() {
    use serde_json::json;
    let p = pod(
        "p",
        json!({"containers": [container(json!({"ephemeral-storage": "1Mi"}))]}),
    );
    assert_eq!(
        eviction_message(Signal::NodeFsAvailable, &p, Some(&disk_usage(3 << 20))),
        "The node was low on resource: ephemeral-storage. Container c was using 3Mi, which exceeds its request of 1Mi. "
    );
    assert_eq!(
        eviction_message(Signal::MemoryAvailable, &p, Some(&disk_usage(3 << 20))),
        "The node was low on resource: memory. Container c was using 3Mi, which exceeds its request of 0. "
    );
    assert_eq!(
        eviction_message(Signal::NodeFsInodesFree, &p, None),
        "The node was low on resource: inodes. "
    );
}

#[test]
fn local_storage_limits() {
    use serde_json::json;
    let p = pod(
        "p",
        json!({
            "containers": [{"name": "c", "image": "i",
                "resources": {"limits": {"ephemeral-storage": "100Mi"}}}],
            "volumes": [
                {"name": "scratch", "emptyDir": {"sizeLimit": "1Mi"}},
                {"name": "ram", "emptyDir": {"medium": "Memory", "sizeLimit": "1Ki"}},
            ],
        }),
    );
    let mut u = disk_usage(1 << 20);
    u.volumes = vec![
        VolumeUsage {
            name: "scratch".into(),
            ephemeral: true,
            bytes: 512 << 10,
            inodes: 1,
            incomplete: false,
        },
        VolumeUsage {
            name: "ram".into(),
            ephemeral: false,
            bytes: 1 << 20,
            inodes: 1,
            incomplete: false,
        },
    ];
    // Within every limit (a memory emptyDir is not counted).
    assert_eq!(local_storage_violation(&p, &u), None);
    assert!(has_local_storage_limits(&p));
    let plain = pod(
        "q",
        json!({"containers": [container(json!({"ephemeral-storage": "1Mi"}))],
               "volumes": [{"name": "ram", "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}},
                           {"name": "disk", "emptyDir": {}}]}),
    );
    assert!(!has_local_storage_limits(&plain));
    u.volumes[0].bytes = (1 << 20) + 4096;
    assert_eq!(
        local_storage_violation(&p, &u).unwrap(),
        (
            "emptydirfs.limit",
            "Usage of EmptyDir volume \"scratch\" exceeds the limit \"1Mi\". ".to_string()
        )
    );
    u.volumes[0].bytes = 4096;
    u.containers[0].rootfs_bytes = Some(101 << 20);
    assert_eq!(
        local_storage_violation(&p, &u).unwrap(),
        (
            "ephemeralpodfs.limit",
            "Pod ephemeral local storage usage exceeds the total limit of containers 100Mi. "
                .to_string()
        )
    );
}

#[test]
fn a_container_over_its_own_limit_within_the_pod_total() {
    use serde_json::json;
    let p = pod(
        "p",
        json!({"containers": [
            {"name": "c", "image": "i", "resources": {"limits": {"ephemeral-storage": "10Mi"}}},
            {"name": "d", "image": "i", "resources": {"limits": {"ephemeral-storage": "1G"}}},
        ]}),
    );
    let mut u = disk_usage(20 << 20);
    u.containers.push(ContainerUsage {
        name: "d".into(),
        ..Default::default()
    });
    assert_eq!(
        local_storage_violation(&p, &u).unwrap(),
        (
            "ephemeralcontainerfs.limit",
            "Container c exceeded its local ephemeral storage limit \"10Mi\". ".to_string()
        )
    );
    u.containers[0].rootfs_bytes = Some(10 << 20);
    assert_eq!(local_storage_violation(&p, &u), None);
}

/// A pod whose emptyDir walk stopped short, having seen only `seen` bytes.
fn unmeasured_volume(seen: u64) -> PodUsage {
    let mut u = disk_usage(0);
    u.volumes = vec![VolumeUsage {
        name: "scratch".into(),
        ephemeral: true,
        bytes: seen,
        inodes: 1_000_000,
        incomplete: true,
    }];
    u
}

#[test]
fn a_usage_measured_in_part_is_over_every_local_storage_limit() {
    use serde_json::json;
    let sized = pod(
        "p",
        json!({"containers": [{"name": "c", "image": "i"}],
               "volumes": [{"name": "scratch", "emptyDir": {"sizeLimit": "20Mi"}}]}),
    );
    // What was seen is far under the limit; it was not all.
    let u = unmeasured_volume(4096);
    assert_eq!(
        local_storage_violation(&sized, &u).unwrap(),
        (
            "emptydirfs.limit",
            "Usage of EmptyDir volume \"scratch\" exceeds the limit \"20Mi\". \
             Its usage could not be measured in full and counts as over. "
                .to_string()
        )
    );
    let mut whole = u.clone();
    whole.volumes[0].incomplete = false;
    assert_eq!(local_storage_violation(&sized, &whole), None);

    // The pod's ephemeral-storage limit: the volume counts toward it.
    let limited = pod(
        "q",
        json!({"containers": [{"name": "c", "image": "i",
                   "resources": {"limits": {"ephemeral-storage": "1Gi"}}}],
               "volumes": [{"name": "scratch", "emptyDir": {}}]}),
    );
    assert_eq!(
        local_storage_violation(&limited, &u).map(|v| v.0),
        Some("ephemeralpodfs.limit")
    );
    assert_eq!(local_storage_violation(&limited, &whole), None);
    // A volume that is not local ephemeral storage does not count.
    let mut tmpfs = u.clone();
    tmpfs.volumes[0].ephemeral = false;
    assert_eq!(local_storage_violation(&limited, &tmpfs), None);
    // A container's logs measured in part: over its own limit.
    let mut logs = whole.clone();
    logs.containers[0].logs_incomplete = true;
    assert_eq!(
        local_storage_violation(&limited, &logs).map(|v| v.0),
        Some("ephemeralpodfs.limit")
    );
}

#[test]
fn a_usage_measured_in_part_ranks_first_under_disk_pressure() {
    use serde_json::json;
    // big: a pod honestly over its request by 900Mi; hider: one whose
    // walk stopped after 4 KiB; both priority 0. low: priority -5, over
    // its request: lower priority goes first whatever the usage, as
    // upstream. high: priority 10, measured in part too.
    let big = pod("big", json!({"containers": [container(json!({}))]}));
    let hider = pod(
        "hider",
        json!({"containers": [container(json!({"ephemeral-storage": "1Gi"}))]}),
    );
    let low = pod(
        "low",
        json!({"priority": -5, "containers": [container(json!({}))]}),
    );
    let high = pod(
        "high",
        json!({"priority": 10, "containers": [container(json!({}))]}),
    );
    let usage: std::collections::HashMap<&str, PodUsage> = [
        ("big", disk_usage(900 << 20)),
        ("hider", unmeasured_volume(4096)),
        ("low", disk_usage(1 << 20)),
        ("high", unmeasured_volume(4096)),
    ]
    .into_iter()
    .collect();
    let by = |signal| {
        let mut pods: Vec<&Pod> = vec![&big, &high, &low, &hider];
        rank(&mut pods, signal, &|p: &Pod| {
            usage.get(p.metadata.name.as_deref().unwrap())
        });
        pods.iter()
            .map(|p| p.metadata.name.clone().unwrap())
            .collect::<Vec<_>>()
    };
    for signal in [Signal::NodeFsAvailable, Signal::NodeFsInodesFree] {
        assert_eq!(by(signal), ["low", "hider", "big", "high"], "{signal}");
    }
    // Memory is measured otherwise: the walk does not matter there.
    assert_eq!(by(Signal::MemoryAvailable)[..2], ["low", "big"]);
    let m = eviction_message(Signal::NodeFsAvailable, &hider, usage.get("hider"));
    assert!(
        m.ends_with("Its usage could not be measured in full and counts as over. "),
        "{m}"
    );
}
