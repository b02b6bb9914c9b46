//! Tests of the statistics: the summary's shape and rates, and the
//! resource metrics, against the fake runtime and a fake /proc.

use serde_json::Value;

use super::*;
use crate::cri::{api, RuntimeService};
use crate::metrics::textformat::{parse, Sample};
use crate::runtime::fake::{FakeRuntime, TEST_IMAGE};
use crate::runtime::labels;

fn find<'a>(s: &'a [Sample], name: &str, labels: &[(&str, &str)]) -> Option<&'a Sample> {
    s.iter().find(|x| {
        x.name == name
            && labels
                .iter()
                .all(|(k, v)| x.labels.iter().any(|(a, b)| a == k && b == v))
    })
}

fn running_pod(fake: &FakeRuntime, uid: &str) -> Vec<String> {
    let mut sb = api::PodSandboxConfig::new();
    let mut meta = api::PodSandboxMetadata::new();
    meta.name = "web".into();
    meta.namespace = "ns1".into();
    meta.uid = uid.into();
    sb.metadata = protobuf::MessageField::some(meta);
    sb.labels = HashMap::from([
        (labels::POD_UID.to_string(), uid.to_string()),
        (labels::POD_NAME.to_string(), "web".to_string()),
        (labels::POD_NAMESPACE.to_string(), "ns1".to_string()),
    ]);
    let sandbox = fake.run_pod_sandbox(&sb, "").unwrap();
    let mut ids = Vec::new();
    for (name, start) in [("app", true), ("side", true), ("old", false)] {
        let mut c = api::ContainerConfig::new();
        let mut m = api::ContainerMetadata::new();
        m.name = name.into();
        c.metadata = protobuf::MessageField::some(m);
        let mut img = api::ImageSpec::new();
        img.image = TEST_IMAGE.into();
        c.image = protobuf::MessageField::some(img);
        c.labels = sb.labels.clone();
        c.labels.insert(labels::CONTAINER_NAME.into(), name.into());
        let id = fake.create_container(&sandbox, &c, &sb).unwrap();
        if start {
            fake.start_container(&id).unwrap();
            ids.push(id);
        } else {
            fake.set_stats(&id, 1, 1, 1);
        }
    }
    ids
}

fn fake_proc(dir: &std::path::Path) {
    std::fs::create_dir_all(dir.join("net")).unwrap();
    std::fs::write(
        dir.join("stat"),
        "cpu  1000 0 500 9000 100 0 0 0 0 0\ncpu0 1000 0 500 9000 100 0 0 0 0 0\nbtime 1700000000\n",
    )
    .unwrap();
    std::fs::write(
        dir.join("meminfo"),
        "MemTotal:       1000 kB\nMemFree:         200 kB\nMemAvailable:    500 kB\nInactive(file):  100 kB\nAnonPages:       300 kB\n",
    )
    .unwrap();
    std::fs::write(dir.join("vmstat"), "pgfault 77\npgmajfault 3\n").unwrap();
    std::fs::write(
        dir.join("net/dev"),
        "Inter-|   Receive |  Transmit\n face |bytes packets errs drop fifo frame compressed multicast|bytes packets errs drop fifo colls carrier compressed\n    lo: 5 1 0 0 0 0 0 0 5 1 0 0 0 0 0 0\n  eth0: 100 2 1 0 0 0 0 0 200 3 4 0 0 0 0 0\n",
    )
    .unwrap();
}

/// The CPU rate cache is process-wide and keyed by container ID, and every
/// fake runtime numbers its containers the same way: tests that read
/// statistics take turns, or one's samples would become another's baseline.
fn one_at_a_time() -> parking_lot::MutexGuard<'static, ()> {
    static SAMPLES: parking_lot::Mutex<()> = parking_lot::Mutex::new(());
    SAMPLES.lock()
}

#[test]
fn summary_has_upstreams_shape_with_rates_from_the_second_call() {
    let _samples = one_at_a_time();
    let fake = FakeRuntime::with_images(&[TEST_IMAGE]);
    let uid = "uid-summary-1";
    let ids = running_pod(&fake, uid);
    fake.set_stats(&ids[0], 2_000_000_000, 10 << 20, 4096);
    fake.set_stats(&ids[1], 1_000_000_000, 5 << 20, 1024);
    let dir = tempfile::tempdir().unwrap();
    let proc_root = dir.path().join("proc");
    fake_proc(&proc_root);

    let text = summary_with_proc(&fake, Some(&fake), dir.path(), &proc_root).unwrap();
    let v: Value = serde_json::from_str(&text).unwrap();
    let node = &v["node"];
    assert_eq!(node["nodeName"], "node-a");
    assert_eq!(node["startTime"], "2023-11-14T22:13:20Z");
    assert!(node["cpu"]["usageCoreNanoSeconds"].as_u64().unwrap() > 0);
    assert_eq!(node["memory"]["usageBytes"], 800 * 1024);
    assert_eq!(node["memory"]["workingSetBytes"], 700 * 1024);
    assert_eq!(node["memory"]["availableBytes"], 300 * 1024);
    assert_eq!(node["memory"]["rssBytes"], 300 * 1024);
    assert_eq!(node["memory"]["pageFaults"], 77);
    assert_eq!(node["memory"]["majorPageFaults"], 3);
    assert_eq!(node["network"]["name"], "eth0");
    assert_eq!(node["network"]["rxBytes"], 100);
    assert_eq!(node["network"]["txErrors"], 4);
    assert_eq!(node["network"]["interfaces"].as_array().unwrap().len(), 1);
    assert!(node["fs"]["capacityBytes"].as_u64().unwrap() > 0);
    assert!(
        node["runtime"]["imageFs"]["capacityBytes"]
            .as_u64()
            .unwrap()
            > 0
    );

    let pods = v["pods"].as_array().unwrap();
    assert_eq!(pods.len(), 1);
    let pod = &pods[0];
    assert_eq!(pod["podRef"]["name"], "web");
    assert_eq!(pod["podRef"]["namespace"], "ns1");
    assert_eq!(pod["podRef"]["uid"], uid);
    let names: Vec<&str> = pod["containers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["app", "side"], "the exited container is left out");
    let app = &pod["containers"][0];
    assert_eq!(app["cpu"]["usageCoreNanoSeconds"], 2_000_000_000u64);
    assert!(
        app["cpu"].get("usageNanoCores").is_none(),
        "no rate without a previous sample"
    );
    assert_eq!(app["memory"]["workingSetBytes"], 10 << 20);
    assert_eq!(app["rootfs"]["usedBytes"], 4096);
    assert_eq!(pod["memory"]["workingSetBytes"], 15 << 20);
    assert_eq!(pod["cpu"]["usageCoreNanoSeconds"], 3_000_000_000u64);
    assert_eq!(pod["ephemeral-storage"]["usedBytes"], 5120);

    // One second later on the runtime's clock, half a core more for app.
    fake.advance(Duration::from_secs(1));
    fake.set_stats(&ids[0], 2_500_000_000, 10 << 20, 4096);
    let text = summary_with_proc(&fake, Some(&fake), dir.path(), &proc_root).unwrap();
    let v: Value = serde_json::from_str(&text).unwrap();
    let rate = v["pods"][0]["containers"][0]["cpu"]["usageNanoCores"]
        .as_u64()
        .unwrap();
    // The fake's clock also moves a little per call.
    assert!((490_000_000..=500_000_000).contains(&rate), "{rate}");
    assert_eq!(v["pods"][0]["containers"][1]["cpu"]["usageNanoCores"], 0);
}

#[test]
fn summary_fails_naming_the_runtime_call() {
    let _samples = one_at_a_time();
    let fake = FakeRuntime::with_images(&[TEST_IMAGE]);
    fake.fail_next("ListContainerStats", 1);
    let dir = tempfile::tempdir().unwrap();
    let err = summary_with_proc(&fake, None, dir.path(), dir.path()).unwrap_err();
    assert!(err.contains("list container stats"), "{err}");
}

#[test]
fn resource_metrics_have_the_series_metrics_server_reads() {
    let _samples = one_at_a_time();
    let fake = FakeRuntime::with_images(&[TEST_IMAGE]);
    let ids = running_pod(&fake, "uid-resource-1");
    fake.set_stats(&ids[0], 2_000_000_000, 10 << 20, 0);
    fake.set_stats(&ids[1], 1_000_000_000, 5 << 20, 0);
    let out = resource_page(&fake);
    let s = parse(&out).unwrap_or_else(|e| panic!("{e}\n{out}"));
    assert_eq!(
        find(&s, "node_cpu_usage_seconds_total", &[]).unwrap().value,
        5.0
    );
    assert_eq!(
        find(&s, "node_memory_working_set_bytes", &[])
            .unwrap()
            .value,
        1048576.0
    );
    let c = [("container", "app"), ("namespace", "ns1"), ("pod", "web")];
    assert_eq!(
        find(&s, "container_cpu_usage_seconds_total", &c)
            .unwrap()
            .value,
        2.0
    );
    assert_eq!(
        find(&s, "container_memory_working_set_bytes", &c)
            .unwrap()
            .value,
        10485760.0
    );
    assert!(find(&s, "container_start_time_seconds", &c).is_some());
    let p = [("namespace", "ns1"), ("pod", "web")];
    assert_eq!(
        find(&s, "pod_cpu_usage_seconds_total", &p).unwrap().value,
        3.0
    );
    assert_eq!(
        find(&s, "pod_memory_working_set_bytes", &p).unwrap().value,
        15728640.0
    );
    assert_eq!(find(&s, "scrape_error", &[]).unwrap().value, 0.0);
    assert!(find(
        &s,
        "container_cpu_usage_seconds_total",
        &[("container", "old")]
    )
    .is_none());

    fake.fail_next("ListContainers", 1);
    let out = resource_page(&fake);
    let s = parse(&out).unwrap_or_else(|e| panic!("{e}\n{out}"));
    assert_eq!(find(&s, "scrape_error", &[]).unwrap().value, 1.0);
    assert!(find(&s, "container_cpu_usage_seconds_total", &[]).is_none());
}

#[test]
fn resource_metrics_read_the_node_from_the_proc_root() {
    let fake = FakeRuntime::with_images(&[TEST_IMAGE]);
    let dir = tempfile::tempdir().unwrap();
    let proc_root = dir.path().join("proc");
    fake_proc(&proc_root);
    let mut out = String::new();
    render_resource_metrics_at(&fake, &proc_root, &mut out).unwrap();
    let s = parse(&out).unwrap_or_else(|e| panic!("{e}\n{out}"));
    // user + nice + system + irq + softirq + steal = 1500 ticks.
    let ticks = crate::metrics::process::clock_ticks();
    let cpu = find(&s, "node_cpu_usage_seconds_total", &[]).unwrap().value;
    assert!((cpu - 1500.0 / ticks).abs() < 1e-6, "{cpu}");
    // MemTotal - MemFree - Inactive(file).
    assert_eq!(
        find(&s, "node_memory_working_set_bytes", &[])
            .unwrap()
            .value,
        (700 * 1024) as f64
    );
    assert_eq!(find(&s, "scrape_error", &[]).unwrap().value, 0.0);
}

#[test]
fn summary_measures_volumes_and_logs_and_sums_ephemeral_storage() {
    let _samples = one_at_a_time();
    let fake = FakeRuntime::with_images(&[TEST_IMAGE]);
    let uid = "uid-volumes-1";
    let ids = running_pod(&fake, uid);
    fake.set_stats(&ids[0], 1, 1 << 20, 4096);
    fake.set_stats(&ids[1], 1, 1 << 20, 1024);
    let dir = tempfile::tempdir().unwrap();
    let proc_root = dir.path().join("proc");
    fake_proc(&proc_root);
    let vols = dir.path().join("pods").join(uid).join("volumes");
    let data = vols.join("kubernetes.io~empty-dir/data");
    std::fs::create_dir_all(&data).unwrap();
    std::fs::write(data.join("f"), vec![1u8; 8192]).unwrap();
    let tok = vols.join("kubernetes.io~secret/tok");
    std::fs::create_dir_all(&tok).unwrap();
    crate::mount::ensure_tmpfs(&tok, 0).unwrap();
    std::fs::write(tok.join("token"), vec![2u8; 8192]).unwrap();
    let app_logs = dir.path().join("logs/ns1_web_uid-volumes-1/app");
    std::fs::create_dir_all(&app_logs).unwrap();
    std::fs::write(app_logs.join("0.log"), vec![b'x'; 4096]).unwrap();

    let text = summary_with_proc(&fake, None, dir.path(), &proc_root);
    crate::mount::unmount_below(dir.path()).unwrap();
    let v: Value = serde_json::from_str(&text.unwrap()).unwrap();
    let pod = &v["pods"][0];
    let names: Vec<&str> = pod["volume"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["data", "tok"], "{pod:#}");
    let used = |i: usize| pod["volume"][i]["usedBytes"].as_u64().unwrap();
    assert!(used(0) >= 8192, "{pod:#}");
    assert!(used(1) >= 8192, "{pod:#}");
    assert_eq!(pod["volume"][0]["inodesUsed"], 2);
    assert!(pod["volume"][1]["capacityBytes"].as_u64().unwrap() > 0);
    let app = &pod["containers"][0];
    let logs = app["logs"]["usedBytes"].as_u64().unwrap();
    assert!(logs >= 4096, "{app:#}");
    assert!(
        pod["containers"][1].get("logs").is_none(),
        "side has no log dir"
    );
    // Writable layers, app's logs and the disk emptyDir; not the secret
    // (tmpfs, not local ephemeral storage).
    assert_eq!(
        pod["ephemeral-storage"]["usedBytes"].as_u64().unwrap(),
        4096 + 1024 + logs + used(0),
        "{pod:#}"
    );
    assert!(pod.get("network").is_none(), "the fake tells no pid");
}

#[test]
fn summaries_in_a_row_walk_each_volume_once_a_minute() {
    let _samples = one_at_a_time();
    let fake = FakeRuntime::with_images(&[TEST_IMAGE]);
    let uid = "uid-cached-1";
    running_pod(&fake, uid);
    let dir = tempfile::tempdir().unwrap();
    let proc_root = dir.path().join("proc");
    fake_proc(&proc_root);
    let data = dir
        .path()
        .join("pods")
        .join(uid)
        .join("volumes/kubernetes.io~empty-dir/data");
    std::fs::create_dir_all(&data).unwrap();
    std::fs::write(data.join("f"), vec![1u8; 8192]).unwrap();
    let app_logs = dir.path().join("logs/ns1_web_uid-cached-1/app");
    std::fs::create_dir_all(&app_logs).unwrap();

    let cache = UsageCache::new(1000);
    let t0 = Instant::now();
    let volume_used = |at: Instant| -> u64 {
        let text = summary_cached(&fake, dir.path(), &proc_root, &cache, at).unwrap();
        let v: Value = serde_json::from_str(&text).unwrap();
        v["pods"][0]["volume"][0]["usedBytes"].as_u64().unwrap()
    };
    let first = volume_used(t0);
    assert!(first >= 8192, "{first}");
    // The volume and the log dirs of app and side (side has none: that
    // is kept too).
    assert_eq!(cache.walks(), 3);

    // More written; the next summaries within the minute give what was
    // measured, without walking.
    std::fs::write(data.join("g"), vec![1u8; 1 << 20]).unwrap();
    assert_eq!(volume_used(t0), first);
    assert_eq!(volume_used(t0 + Duration::from_secs(59)), first);
    assert_eq!(cache.walks(), 3);

    // A minute on, measured again.
    let later = volume_used(t0 + SUMMARY_MAX_AGE);
    assert!(later >= first + (1 << 20), "{later}");
    assert_eq!(cache.walks(), 6);

    // What nothing asks for any more is dropped after two minutes.
    cache.forget_older(t0 + SUMMARY_MAX_AGE * 3, SUMMARY_MAX_AGE);
    assert_eq!(cache.len(), 0);
}

#[test]
fn the_eviction_manager_learns_which_walks_stopped_short() {
    let _samples = one_at_a_time();
    let fake = FakeRuntime::with_images(&[TEST_IMAGE]);
    let (small, big) = ("uid-walk-small", "uid-walk-big");
    running_pod(&fake, small);
    running_pod(&fake, big);
    let dir = tempfile::tempdir().unwrap();
    let volume = |uid: &str| {
        let d = dir
            .path()
            .join("pods")
            .join(uid)
            .join("volumes/kubernetes.io~empty-dir/data");
        std::fs::create_dir_all(&d).unwrap();
        d
    };
    std::fs::write(volume(small).join("f"), vec![1u8; 4096]).unwrap();
    // More entries than the walk looks at, with 1 MiB where the walk
    // does not get to.
    let many = volume(big);
    for i in 0..40 {
        std::fs::write(many.join(format!("f{i}")), b"x").unwrap();
    }
    let hidden = many.join("z/z/z");
    std::fs::create_dir_all(&hidden).unwrap();
    std::fs::write(hidden.join("blob"), vec![1u8; 1 << 20]).unwrap();

    let cache = UsageCache::new(20);
    let measure = Measure {
        pods: &|uid| uid != "uid-other",
        max_age: Duration::ZERO,
        cache: &cache,
        now: Instant::now(),
    };
    let logs = dir.path().join("logs");
    let usage = pod_usage(&fake, dir.path(), &logs, &measure).unwrap();
    let data = |uid: &str| usage[uid].volumes[0].clone();
    assert!(!data(small).incomplete, "{:?}", data(small));
    assert!(!usage[small].disk_incomplete());
    assert!(data(big).incomplete, "{:?}", data(big));
    assert!(data(big).inodes <= 20, "{:?}", data(big));
    assert!(usage[big].disk_incomplete());

    // Only the pods asked for are measured.
    let only_small = Measure {
        pods: &|uid| uid == small,
        ..measure
    };
    let usage = pod_usage(&fake, dir.path(), &logs, &only_small).unwrap();
    assert_eq!(usage.keys().collect::<Vec<_>>(), [small]);
}
