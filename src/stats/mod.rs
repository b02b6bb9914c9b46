//! Statistics: `/stats/summary` (upstream's `stats/v1alpha1` Summary) and
//! `/metrics/resource` (what metrics-server reads).
//!
//! Containers come from the runtime: `ListPodSandbox` (ready sandboxes:
//! the pods and their start times), `ListContainers` (running containers,
//! their start times and CRI labels) and `ListContainerStats` (CPU,
//! memory, writable layer). The node comes from `/proc/stat`,
//! `/proc/meminfo`, `/proc/vmstat`, `/proc/net/dev` and statvfs of the
//! root dir; the image filesystem from CRI `ImageFsInfo`.
//!
//! `usageNanoCores` is a rate: the last cumulative CPU sample of the node
//! and of each container is kept between calls (entries of containers not
//! seen in a call are dropped) and the rate computed against it; the first
//! call has none, as upstream. Pods' CPU and memory are the sums of their
//! containers' (upstream reads the pod's cgroup through cAdvisor).
//!
//! A pod's network is its sandbox's `/proc/<pid>/net/dev` (the pid from
//! the runtime's verbose sandbox status); its volumes and containers'
//! logs are measured by walks of their directories (`paths::disk_usage`:
//! no depth bound, a budget of entries), kept for a minute in `cache` as
//! upstream's fsResourceAnalyzer keeps them, so summaries in a row walk
//! once; ephemeral storage sums them as upstream.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::path::Path;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use parking_lot::Mutex;
use serde_json::{json, Map, Value};

use crate::cri::{api, ImageService, RuntimeService};
use crate::metrics::process::{boot_time, clock_ticks};
use crate::metrics::registry::{header, sample_at};
use crate::node::machine::{fs_stats, FsStats};

mod cache;
mod usage;
use crate::runtime::labels;
pub(crate) use cache::{UsageCache, SUMMARY_MAX_AGE};
pub(crate) use usage::{ContainerUsage, PodUsage, VolumeUsage};

/// What the statistics need to know about the node.
pub struct NodeFacts<'a> {
    pub node_name: &'a str,
    /// `--root-dir`: its filesystem is the node's `fs`.
    pub root_dir: &'a Path,
    /// For the image filesystem (`runtime.imageFs`); left out when None.
    pub images: Option<&'a dyn ImageService>,
    /// Where /proc is (tests point it at a fake tree).
    pub proc_root: &'a Path,
    /// `--pod-logs-dir`: containers' `logs` are measured under it.
    pub logs_dir: &'a Path,
}

impl<'a> NodeFacts<'a> {
    pub(crate) fn new(node_name: &'a str, root_dir: &'a Path) -> Self {
        NodeFacts {
            node_name,
            root_dir,
            images: None,
            proc_root: Path::new("/proc"),
            logs_dir: Path::new("/var/log/pods"),
        }
    }
}

/// Previous cumulative CPU samples: id ("" for the node) → (time ns, usage ns).
static CPU_SAMPLES: Mutex<Option<HashMap<String, (i64, u64)>>> = Mutex::new(None);

fn nanos_since_epoch(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
}

fn time_of(nanos: i64) -> String {
    let d = Duration::from_nanos(u64::try_from(nanos).unwrap_or(0));
    crate::apitime::rfc3339(UNIX_EPOCH + d)
}

/// The node's cumulative CPU time in nanoseconds, from /proc/stat's `cpu`
/// line (user, nice, system, irq, softirq, steal; not idle or iowait).
fn node_cpu_nanos(proc_stat: &str, ticks: f64) -> Option<u64> {
    let line = proc_stat.lines().find(|l| l.starts_with("cpu "))?;
    let v: Vec<u64> = line
        .split_ascii_whitespace()
        .skip(1)
        .map(|f| f.parse().unwrap_or(0))
        .collect();
    let busy: u64 = [0usize, 1, 2, 5, 6, 7]
        .iter()
        .map(|i| v.get(*i).copied().unwrap_or(0))
        .sum();
    Some((busy as f64 / ticks * 1e9) as u64)
}

/// Values of a `key: value [kB]` or `key value` file, in bytes for kB.
fn kv(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let rest = l.strip_prefix(key)?;
        let rest = rest.strip_prefix(':').unwrap_or(rest);
        let mut f = rest.split_ascii_whitespace();
        let n: u64 = f.next()?.parse().ok()?;
        Some(if f.next() == Some("kB") { n * 1024 } else { n })
    })
}

struct NodeMemory {
    total: u64,
    usage: u64,
    working_set: u64,
    rss: u64,
    faults: u64,
    major_faults: u64,
}

fn node_memory(meminfo: &str, vmstat: &str) -> Option<NodeMemory> {
    let total = kv(meminfo, "MemTotal")?;
    let free = kv(meminfo, "MemFree").unwrap_or(0);
    let usage = total.saturating_sub(free);
    let inactive_file = kv(meminfo, "Inactive(file)").unwrap_or(0);
    Some(NodeMemory {
        total,
        usage,
        working_set: usage.saturating_sub(inactive_file),
        rss: kv(meminfo, "AnonPages").unwrap_or(0),
        faults: kv(vmstat, "pgfault").unwrap_or(0),
        major_faults: kv(vmstat, "pgmajfault").unwrap_or(0),
    })
}

/// Interfaces of /proc/net/dev other than `lo`: (name, rx bytes, rx
/// errors, tx bytes, tx errors).
fn interfaces(net_dev: &str) -> Vec<(String, u64, u64, u64, u64)> {
    net_dev
        .lines()
        .filter_map(|l| {
            let (name, rest) = l.split_once(':')?;
            let name = name.trim();
            let f: Vec<u64> = rest
                .split_ascii_whitespace()
                .map(|v| v.parse().unwrap_or(0))
                .collect();
            if name == "lo" || f.len() < 11 {
                return None;
            }
            Some((name.to_string(), f[0], f[2], f[8], f[10]))
        })
        .collect()
}

fn fs_json(time: &str, fs: Option<FsStats>, used: Option<u64>, inodes_used: Option<u64>) -> Value {
    let mut m = Map::new();
    m.insert("time".into(), json!(time));
    if let Some(fs) = fs {
        m.insert("availableBytes".into(), json!(fs.available));
        m.insert("capacityBytes".into(), json!(fs.capacity));
        if fs.inodes > 0 {
            m.insert("inodesFree".into(), json!(fs.inodes_free));
            m.insert("inodes".into(), json!(fs.inodes));
        }
    }
    let used = used.or_else(|| fs.map(|f| f.capacity.saturating_sub(f.available)));
    if let Some(u) = used {
        m.insert("usedBytes".into(), json!(u));
    }
    let inodes_used = inodes_used.or_else(|| {
        fs.filter(|f| f.inodes > 0)
            .map(|f| f.inodes.saturating_sub(f.inodes_free))
    });
    if let Some(u) = inodes_used {
        m.insert("inodesUsed".into(), json!(u));
    }
    Value::Object(m)
}

/// One running container with its pod and its statistics.
struct ContainerRow {
    id: String,
    name: String,
    pod_uid: String,
    pod_name: String,
    namespace: String,
    created_at: i64,
    stats: Option<api::ContainerStats>,
}

struct PodRow {
    sandbox_id: String,
    uid: String,
    name: String,
    namespace: String,
    created_at: i64,
}

fn label<'a>(l: &'a HashMap<String, String>, k: &str) -> &'a str {
    l.get(k).map_or("", |s| s.as_str())
}

/// Ready sandboxes (the newest per pod UID) and running containers with
/// their statistics.
fn collect(runtime: &dyn RuntimeService) -> Result<(Vec<PodRow>, Vec<ContainerRow>), String> {
    let sandboxes = runtime
        .list_pod_sandbox(None)
        .map_err(|e| format!("list sandboxes: {e}"))?;
    let mut pods: HashMap<String, PodRow> = HashMap::new();
    for s in sandboxes {
        if s.state.value() != api::PodSandboxState::SANDBOX_READY as i32 {
            continue;
        }
        let uid = label(&s.labels, labels::POD_UID);
        if uid.is_empty() {
            continue;
        }
        let meta = s.metadata.as_ref();
        let row = PodRow {
            sandbox_id: s.id.clone(),
            uid: uid.to_string(),
            name: meta.map_or_else(
                || label(&s.labels, labels::POD_NAME).to_string(),
                |m| m.name.clone(),
            ),
            namespace: meta.map_or_else(
                || label(&s.labels, labels::POD_NAMESPACE).to_string(),
                |m| m.namespace.clone(),
            ),
            created_at: s.created_at,
        };
        match pods.get(uid) {
            Some(old) if old.created_at >= row.created_at => {}
            _ => {
                pods.insert(row.uid.clone(), row);
            }
        }
    }
    let containers = runtime
        .list_containers(None)
        .map_err(|e| format!("list containers: {e}"))?;
    let mut stats: HashMap<String, api::ContainerStats> = runtime
        .list_container_stats(None)
        .map_err(|e| format!("list container stats: {e}"))?
        .into_iter()
        .filter_map(|s| Some((s.attributes.as_ref()?.id.clone(), s)))
        .collect();
    let mut rows = Vec::new();
    for c in containers {
        if c.state.value() != api::ContainerState::CONTAINER_RUNNING as i32 {
            continue;
        }
        let uid = label(&c.labels, labels::POD_UID);
        let Some(pod) = pods.get(uid) else { continue };
        let name = label(&c.labels, labels::CONTAINER_NAME);
        let name = if name.is_empty() {
            c.metadata.as_ref().map_or("", |m| m.name.as_str())
        } else {
            name
        };
        rows.push(ContainerRow {
            stats: stats.remove(&c.id),
            id: c.id,
            name: name.to_string(),
            pod_uid: pod.uid.clone(),
            pod_name: pod.name.clone(),
            namespace: pod.namespace.clone(),
            created_at: c.created_at,
        });
    }
    let mut pods: Vec<PodRow> = pods.into_values().collect();
    pods.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
    rows.sort_by(|a, b| (&a.pod_uid, &a.name).cmp(&(&b.pod_uid, &b.name)));
    Ok((pods, rows))
}

fn cpu_of(s: &api::ContainerStats) -> Option<(i64, u64)> {
    let cpu = s.cpu.as_ref()?;
    Some((cpu.timestamp, cpu.usage_core_nano_seconds.as_ref()?.value))
}

fn memory_of(s: &api::ContainerStats) -> Option<(i64, u64)> {
    let m = s.memory.as_ref()?;
    Some((m.timestamp, m.working_set_bytes.as_ref()?.value))
}

/// Rate in nanocores against the previous sample of `id`, which is then
/// replaced; None without a usable previous sample.
fn nano_cores(
    cache: &mut HashMap<String, (i64, u64)>,
    id: &str,
    (t, usage): (i64, u64),
) -> Option<u64> {
    let prev = cache.insert(id.to_string(), (t, usage));
    let (pt, pu) = prev?;
    if t <= pt || usage < pu {
        return None;
    }
    Some(((usage - pu) as f64 / (t - pt) as f64 * 1e9) as u64)
}

fn cpu_json(time: i64, usage: u64, rate: Option<u64>) -> Value {
    let mut m = Map::new();
    m.insert("time".into(), json!(time_of(time)));
    if let Some(r) = rate {
        m.insert("usageNanoCores".into(), json!(r));
    }
    m.insert("usageCoreNanoSeconds".into(), json!(usage));
    Value::Object(m)
}

fn read(root: &Path, name: &str) -> String {
    std::fs::read_to_string(root.join(name)).unwrap_or_default()
}

/// `GET /stats/summary`: upstream's Summary as JSON. An error names what
/// could not be read from the runtime.
pub fn stats_summary(runtime: &dyn RuntimeService, node: &NodeFacts) -> Result<String, String> {
    summary_with(runtime, node, UsageCache::shared(), Instant::now())
}

/// [`stats_summary`] with volume and log usage from `usage`, as of
/// `clock` (a fake one in tests).
fn summary_with(
    runtime: &dyn RuntimeService,
    node: &NodeFacts,
    usage: &UsageCache,
    clock: Instant,
) -> Result<String, String> {
    let now = nanos_since_epoch(SystemTime::now());
    let now_s = time_of(now);
    let proc_stat = read(node.proc_root, "stat");
    let (pods, rows) = collect(runtime)?;

    // Image filesystem: what the runtime says images use, on the
    // filesystem of its mountpoint.
    let image_fs = match node.images.map(|i| i.image_fs_info()) {
        Some(Ok(list)) => list.into_iter().next().map(|u| {
            let mount = u.fs_id.as_ref().map_or("", |f| f.mountpoint.as_str());
            let fs = (!mount.is_empty())
                .then(|| fs_stats(Path::new(mount)).ok())
                .flatten();
            let used = u.used_bytes.as_ref().map(|v| v.value);
            let inodes = u.inodes_used.as_ref().map(|v| v.value);
            (fs, used, inodes)
        }),
        Some(Err(e)) => return Err(format!("image filesystem: {e}")),
        None => None,
    };

    let mut guard = CPU_SAMPLES.lock();
    let cache = guard.get_or_insert_with(HashMap::new);
    let mut seen: Vec<&str> = Vec::with_capacity(rows.len());

    let mut node_json = Map::new();
    node_json.insert("nodeName".into(), json!(node.node_name));
    if let Some(b) = boot_time(&proc_stat) {
        node_json.insert("startTime".into(), json!(time_of(b as i64 * 1_000_000_000)));
    }
    if let Some(usage) = node_cpu_nanos(&proc_stat, clock_ticks()) {
        let rate = nano_cores(cache, "", (now, usage));
        node_json.insert("cpu".into(), cpu_json(now, usage, rate));
    }
    let meminfo = read(node.proc_root, "meminfo");
    let vmstat = read(node.proc_root, "vmstat");
    if let Some(m) = node_memory(&meminfo, &vmstat) {
        node_json.insert(
            "memory".into(),
            json!({
                "time": now_s,
                "availableBytes": m.total.saturating_sub(m.working_set),
                "usageBytes": m.usage,
                "workingSetBytes": m.working_set,
                "rssBytes": m.rss,
                "pageFaults": m.faults,
                "majorPageFaults": m.major_faults,
            }),
        );
    }
    if let Some(net) = network_json(&now_s, &read(node.proc_root, "net/dev")) {
        node_json.insert("network".into(), net);
    }
    let root_fs = fs_stats(node.root_dir).ok();
    node_json.insert("fs".into(), fs_json(&now_s, root_fs, None, None));
    if let Some((fs, used, inodes)) = image_fs {
        node_json.insert(
            "runtime".into(),
            json!({ "imageFs": fs_json(&now_s, fs, used, inodes) }),
        );
    }

    let mut pods_json = Vec::with_capacity(pods.len());
    for p in &pods {
        let mut containers = Vec::new();
        let (mut cpu_total, mut cpu_rate, mut cpu_t, mut any_cpu) = (0u64, Some(0u64), 0i64, false);
        let (mut mem_total, mut mem_t, mut any_mem) = (0u64, 0i64, false);
        // Upstream's ephemeral storage: containers' writable layers and
        // logs, and the local ephemeral volumes.
        let (mut eph_used, mut eph_inodes) = (None, None);
        let log_dir = pod_log_dir(node.logs_dir, p);
        for c in rows.iter().filter(|c| c.pod_uid == p.uid) {
            let mut cj = Map::new();
            cj.insert("name".into(), json!(c.name));
            cj.insert("startTime".into(), json!(time_of(c.created_at)));
            let mut rootfs = None;
            if let Some(s) = &c.stats {
                if let Some(sample) = cpu_of(s) {
                    seen.push(&c.id);
                    let rate = nano_cores(cache, &c.id, sample);
                    cj.insert("cpu".into(), cpu_json(sample.0, sample.1, rate));
                    cpu_total = cpu_total.saturating_add(sample.1);
                    cpu_rate = cpu_rate.zip(rate).map(|(a, b)| a.saturating_add(b));
                    cpu_t = cpu_t.max(sample.0);
                    any_cpu = true;
                }
                if let Some((t, ws)) = memory_of(s) {
                    cj.insert(
                        "memory".into(),
                        json!({"time": time_of(t), "workingSetBytes": ws}),
                    );
                    mem_total = mem_total.saturating_add(ws);
                    mem_t = mem_t.max(t);
                    any_mem = true;
                }
                if let Some(w) = s.writable_layer.as_ref() {
                    let used = w.used_bytes.as_ref().map(|v| v.value);
                    let inodes = w.inodes_used.as_ref().map(|v| v.value);
                    let fs = image_fs.as_ref().and_then(|f| f.0);
                    cj.insert(
                        "rootfs".into(),
                        fs_json(&time_of(w.timestamp), fs, used, inodes),
                    );
                    rootfs = Some((used, inodes));
                }
            }
            let logs = log_dir
                .as_ref()
                .and_then(|d| crate::paths::join(d, &c.name).ok())
                .and_then(|d| usage.usage(&d, clock, SUMMARY_MAX_AGE));
            if let Some(l) = logs {
                cj.insert(
                    "logs".into(),
                    fs_json(&now_s, root_fs, Some(l.bytes), Some(l.inodes)),
                );
            }
            // Upstream counts logs only beside a writable layer.
            if let Some((used, inodes)) = rootfs {
                add_usage(&mut eph_used, used);
                add_usage(&mut eph_inodes, inodes);
                if let Some(l) = logs {
                    add_usage(&mut eph_used, Some(l.bytes));
                    add_usage(&mut eph_inodes, Some(l.inodes));
                }
            }
            containers.push(Value::Object(cj));
        }
        let mut pj = Map::new();
        pj.insert(
            "podRef".into(),
            json!({"name": p.name, "namespace": p.namespace, "uid": p.uid}),
        );
        pj.insert("startTime".into(), json!(time_of(p.created_at)));
        pj.insert("containers".into(), Value::Array(containers));
        if any_cpu {
            pj.insert("cpu".into(), cpu_json(cpu_t, cpu_total, cpu_rate));
        }
        if any_mem {
            pj.insert(
                "memory".into(),
                json!({"time": time_of(mem_t), "workingSetBytes": mem_total}),
            );
        }
        let volumes = pod_volumes(node.root_dir, &p.uid, &now_s, usage, clock, SUMMARY_MAX_AGE);
        for v in volumes.iter().filter(|v| v.ephemeral) {
            add_usage(&mut eph_used, Some(v.used));
            add_usage(&mut eph_inodes, Some(v.inodes));
        }
        if !volumes.is_empty() {
            let list = volumes.into_iter().map(|v| v.json).collect();
            pj.insert("volume".into(), Value::Array(list));
        }
        if eph_used.is_some() {
            pj.insert(
                "ephemeral-storage".into(),
                fs_json(&now_s, root_fs, eph_used, eph_inodes),
            );
        }
        if let Some(net) = pod_network(runtime, p, node.proc_root, &now_s) {
            pj.insert("network".into(), net);
        }
        pods_json.push(Value::Object(pj));
    }
    // Forget containers that are gone, so the cache stays as large as
    // what runs.
    cache.retain(|k, _| k.is_empty() || seen.contains(&k.as_str()));
    drop(guard);
    usage.forget_older(clock, SUMMARY_MAX_AGE);

    let summary = json!({ "node": Value::Object(node_json), "pods": pods_json });
    serde_json::to_string_pretty(&summary).map_err(|e| format!("encode the summary: {e}"))
}

fn add_usage(total: &mut Option<u64>, v: Option<u64>) {
    if let Some(v) = v {
        *total = Some(total.unwrap_or(0).saturating_add(v));
    }
}

/// `<logs-dir>/<namespace>_<name>_<uid>`, as the runtime module names it;
/// None for names that cannot make one directory there.
fn pod_log_dir(logs_dir: &Path, p: &PodRow) -> Option<std::path::PathBuf> {
    if crate::paths::uid_error(&p.uid).is_some() {
        return None;
    }
    crate::paths::join(logs_dir, &format!("{}_{}_{}", p.namespace, p.name, p.uid)).ok()
}

/// Which pods [`pod_usage`] measures, and how fresh their logs' and
/// volumes' usage must be.
pub(crate) struct Measure<'a> {
    /// Whether to measure the pod of this UID.
    pub(crate) pods: &'a dyn Fn(&str) -> bool,
    /// A kept usage younger than this is used as it is.
    pub(crate) max_age: Duration,
    pub(crate) cache: &'a UsageCache,
    pub(crate) now: Instant,
}

/// What each running pod `measure` selects uses (by UID), for the
/// eviction manager: its running containers' working sets, writable
/// layers and logs, and its volumes, measured as the summary measures
/// them, with walks that stopped short marked so.
pub(crate) fn pod_usage(
    runtime: &dyn RuntimeService,
    root_dir: &Path,
    logs_dir: &Path,
    measure: &Measure,
) -> Result<HashMap<String, PodUsage>, String> {
    let (pods, rows) = collect(runtime)?;
    let mut out = HashMap::with_capacity(pods.len());
    for p in pods.iter().filter(|p| (measure.pods)(&p.uid)) {
        let log_dir = pod_log_dir(logs_dir, p);
        let mut u = PodUsage::default();
        for c in rows.iter().filter(|c| c.pod_uid == p.uid) {
            let logs = log_dir
                .as_ref()
                .and_then(|d| crate::paths::join(d, &c.name).ok())
                .and_then(|d| measure.cache.usage(&d, measure.now, measure.max_age));
            let w = c.stats.as_ref().and_then(|s| s.writable_layer.as_ref());
            u.containers.push(ContainerUsage {
                name: c.name.clone(),
                memory_working_set: c.stats.as_ref().and_then(memory_of).map(|m| m.1),
                rootfs_bytes: w.and_then(|w| w.used_bytes.as_ref()).map(|v| v.value),
                rootfs_inodes: w.and_then(|w| w.inodes_used.as_ref()).map(|v| v.value),
                logs_bytes: logs.map(|l| l.bytes),
                logs_inodes: logs.map(|l| l.inodes),
                logs_incomplete: logs.is_some_and(|l| !l.complete),
            });
        }
        let volumes = pod_volumes(
            root_dir,
            &p.uid,
            "",
            measure.cache,
            measure.now,
            measure.max_age,
        );
        u.volumes = volumes
            .into_iter()
            .map(|v| VolumeUsage {
                name: v.name,
                ephemeral: v.ephemeral,
                bytes: v.used,
                inodes: v.inodes,
                incomplete: v.incomplete,
            })
            .collect();
        out.insert(p.uid.clone(), u);
    }
    measure.cache.forget_older(measure.now, SUMMARY_MAX_AGE);
    Ok(out)
}

/// Network statistics of `/proc/…/net/dev` text, upstream's shape: the
/// default interface (`eth0`, else the first) at the top level and every
/// interface but `lo` in `interfaces`. None without interfaces.
fn network_json(now_s: &str, net_dev: &str) -> Option<Value> {
    let ifaces = interfaces(net_dev);
    if ifaces.is_empty() {
        return None;
    }
    let list: Vec<Value> = ifaces
        .iter()
        .map(|(n, rx, rxe, tx, txe)| {
            json!({"name": n, "rxBytes": rx, "rxErrors": rxe, "txBytes": tx, "txErrors": txe})
        })
        .collect();
    let main = ifaces.iter().position(|i| i.0 == "eth0").unwrap_or(0);
    let mut net = Map::new();
    net.insert("time".into(), json!(now_s));
    if let Value::Object(first) = &list[main] {
        net.extend(first.clone());
    }
    net.insert("interfaces".into(), Value::Array(list));
    Some(Value::Object(net))
}

/// A pod's network, read in its sandbox's network namespace: the
/// sandbox's pid from the runtime's verbose status (containerd's `info`
/// JSON has `pid`), then `<proc>/<pid>/net/dev`. None for hostNetwork
/// pods (upstream gives them none of their own) and when the runtime
/// does not tell the pid.
fn pod_network(
    runtime: &dyn RuntimeService,
    p: &PodRow,
    proc_root: &Path,
    now_s: &str,
) -> Option<Value> {
    let (status, info) = match runtime.pod_sandbox_status_info(&p.sandbox_id) {
        Ok(v) => v,
        Err(e) => {
            log::debug!("network statistics of pod {}/{}: {e}", p.namespace, p.name);
            return None;
        }
    };
    let host_network = status
        .linux
        .as_ref()
        .and_then(|l| l.namespaces.as_ref())
        .and_then(|n| n.options.as_ref())
        .is_some_and(|o| o.network.enum_value() == Ok(api::NamespaceMode::NODE));
    if host_network {
        return None;
    }
    let pid = info
        .get("info")
        .and_then(|text| serde_json::from_str::<Value>(text).ok())
        .and_then(|v| v.get("pid")?.as_u64())
        .filter(|pid| *pid > 0)?;
    network_json(now_s, &read(proc_root, &format!("{pid}/net/dev")))
}

/// One volume's statistics.
struct VolumeUse {
    name: String,
    ephemeral: bool,
    used: u64,
    inodes: u64,
    incomplete: bool,
    json: Value,
}

/// Volume plugin directories measured, and whether their volumes are
/// local ephemeral storage (upstream: disk emptyDir and configMap; a
/// memory emptyDir, a tmpfs mount here, is not).
const VOLUME_PLUGINS: [(&str, bool); 5] = [
    ("kubernetes.io~empty-dir", true),
    ("kubernetes.io~configmap", true),
    ("kubernetes.io~secret", false),
    ("kubernetes.io~projected", false),
    ("kubernetes.io~downward-api", false),
];

/// The pod's volumes under `<root-dir>/pods/<uid>/volumes/<plugin>/<name>`:
/// used bytes and inodes by a walk (kept in `cache`, `max_age` at most),
/// capacity from statvfs, sorted by name.
fn pod_volumes(
    root_dir: &Path,
    uid: &str,
    now_s: &str,
    cache: &UsageCache,
    now: Instant,
    max_age: Duration,
) -> Vec<VolumeUse> {
    let Ok(pod) = crate::paths::pod_dir(root_dir, uid) else {
        return Vec::new();
    };
    let Ok(pod_dev) = std::fs::metadata(&pod).map(|m| std::os::unix::fs::MetadataExt::dev(&m))
    else {
        return Vec::new();
    };
    let mut out: Vec<(String, VolumeUse)> = Vec::new();
    for (plugin, local) in VOLUME_PLUGINS {
        let Ok(entries) = std::fs::read_dir(pod.join("volumes").join(plugin)) else {
            continue;
        };
        for e in entries.flatten().take(1024) {
            let Ok(name) = e.file_name().into_string() else {
                continue;
            };
            let path = e.path();
            let Some(u) = cache.usage(&path, now, max_age) else {
                continue;
            };
            let mut json = fs_json(now_s, fs_stats(&path).ok(), Some(u.bytes), Some(u.inodes));
            if let Value::Object(m) = &mut json {
                m.insert("name".into(), json!(name));
            }
            let v = VolumeUse {
                name: name.clone(),
                ephemeral: local && u.dev == pod_dev,
                used: u.bytes,
                inodes: u.inodes,
                incomplete: !u.complete,
                json,
            };
            out.push((name, v));
        }
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out.into_iter().map(|(_, v)| v).collect()
}

fn ms(nanos: i64) -> Option<i64> {
    (nanos > 0).then_some(nanos / 1_000_000)
}

/// `GET /metrics/resource`: node, pod and container CPU and memory, as
/// upstream's resource metrics (samples with their timestamps). When the
/// runtime cannot be read, `scrape_error` is 1 and only the node is
/// given, as upstream; the error is returned only when nothing at all
/// could be read.
pub fn render_resource_metrics(
    runtime: &dyn RuntimeService,
    out: &mut String,
) -> Result<(), String> {
    render_resource_metrics_at(runtime, Path::new("/proc"), out)
}

/// [`render_resource_metrics`] with the node read from `proc_root`.
pub(crate) fn render_resource_metrics_at(
    runtime: &dyn RuntimeService,
    proc_root: &Path,
    out: &mut String,
) -> Result<(), String> {
    let now = nanos_since_epoch(SystemTime::now());
    let node_cpu = node_cpu_nanos(&read(proc_root, "stat"), clock_ticks());
    let node_mem = node_memory(&read(proc_root, "meminfo"), &read(proc_root, "vmstat"));
    let collected = collect(runtime);
    if let (Err(e), None, None) = (&collected, node_cpu, node_mem.as_ref()) {
        return Err(e.clone());
    }
    render_resource(
        out,
        now,
        node_cpu,
        node_mem.map(|m| m.working_set),
        collected,
    );
    Ok(())
}

type Collected = Result<(Vec<PodRow>, Vec<ContainerRow>), String>;

fn render_resource(
    out: &mut String,
    now: i64,
    node_cpu: Option<u64>,
    node_ws: Option<u64>,
    collected: Collected,
) {
    let help = |out: &mut String, name: &str, text: &str, kind: &str| {
        header(out, name, &format!("[ALPHA] {text}"), kind);
    };
    if let Some(c) = node_cpu {
        help(
            out,
            "node_cpu_usage_seconds_total",
            "Cumulative cpu time consumed by the node in core-seconds",
            "counter",
        );
        sample_at(
            out,
            "node_cpu_usage_seconds_total",
            &[],
            c as f64 / 1e9,
            ms(now),
        );
    }
    if let Some(m) = node_ws {
        help(
            out,
            "node_memory_working_set_bytes",
            "Current working set of the node in bytes",
            "gauge",
        );
        sample_at(out, "node_memory_working_set_bytes", &[], m as f64, ms(now));
    }
    let (pods, rows) = match collected {
        Ok(v) => v,
        Err(e) => {
            log::warn!("resource metrics: {e}");
            help(
                out,
                "scrape_error",
                "1 if there was an error while getting container metrics, 0 otherwise",
                "gauge",
            );
            let _ = writeln!(out, "scrape_error 1");
            return;
        }
    };
    let lbl = |c: &ContainerRow| {
        [
            ("container", c.name.clone()),
            ("namespace", c.namespace.clone()),
            ("pod", c.pod_name.clone()),
        ]
    };
    let family = |out: &mut String,
                  name: &str,
                  text: &str,
                  kind: &str,
                  f: &dyn Fn(&ContainerRow) -> Option<(f64, i64)>| {
        help(out, name, text, kind);
        for c in &rows {
            if let Some((v, t)) = f(c) {
                let l = lbl(c);
                let l: Vec<(&str, &str)> = l.iter().map(|(k, v)| (*k, v.as_str())).collect();
                sample_at(out, name, &l, v, ms(t));
            }
        }
    };
    family(
        out,
        "container_cpu_usage_seconds_total",
        "Cumulative cpu time consumed by the container in core-seconds",
        "counter",
        &|c| {
            let (t, u) = cpu_of(c.stats.as_ref()?)?;
            Some((u as f64 / 1e9, t))
        },
    );
    family(
        out,
        "container_memory_working_set_bytes",
        "Current working set of the container in bytes",
        "gauge",
        &|c| {
            let (t, w) = memory_of(c.stats.as_ref()?)?;
            Some((w as f64, t))
        },
    );
    family(
        out,
        "container_start_time_seconds",
        "Start time of the container since unix epoch in seconds",
        "gauge",
        &|c| Some((c.created_at as f64 / 1e9, c.created_at)),
    );
    let pod_sums =
        |f: &dyn Fn(&api::ContainerStats) -> Option<(i64, u64)>| -> Vec<(&PodRow, u64, i64)> {
            pods.iter()
                .filter_map(|p| {
                    let mut any = false;
                    let (mut sum, mut t) = (0u64, 0i64);
                    for c in rows.iter().filter(|c| c.pod_uid == p.uid) {
                        if let Some((ts, v)) = c.stats.as_ref().and_then(f) {
                            any = true;
                            sum = sum.saturating_add(v);
                            t = t.max(ts);
                        }
                    }
                    any.then_some((p, sum, t))
                })
                .collect()
        };
    help(
        out,
        "pod_cpu_usage_seconds_total",
        "Cumulative cpu time consumed by the pod in core-seconds",
        "counter",
    );
    for (p, v, t) in pod_sums(&cpu_of) {
        let l = [
            ("namespace", p.namespace.as_str()),
            ("pod", p.name.as_str()),
        ];
        sample_at(
            out,
            "pod_cpu_usage_seconds_total",
            &l,
            v as f64 / 1e9,
            ms(t),
        );
    }
    help(
        out,
        "pod_memory_working_set_bytes",
        "Current working set of the pod in bytes",
        "gauge",
    );
    for (p, v, t) in pod_sums(&memory_of) {
        let l = [
            ("namespace", p.namespace.as_str()),
            ("pod", p.name.as_str()),
        ];
        sample_at(out, "pod_memory_working_set_bytes", &l, v as f64, ms(t));
    }
    help(
        out,
        "scrape_error",
        "1 if there was an error while getting container metrics, 0 otherwise",
        "gauge",
    );
    let _ = writeln!(out, "scrape_error 0");
}

#[cfg(test)]
pub(crate) fn summary_with_proc(
    runtime: &dyn RuntimeService,
    images: Option<&dyn ImageService>,
    root: &Path,
    proc_root: &Path,
) -> Result<String, String> {
    let node = NodeFacts {
        node_name: "node-a",
        root_dir: root,
        images,
        proc_root,
        logs_dir: &root.join("logs"),
    };
    stats_summary(runtime, &node)
}

/// [`summary_with_proc`] with its own usage cache and clock.
#[cfg(test)]
pub(crate) fn summary_cached(
    runtime: &dyn RuntimeService,
    root: &Path,
    proc_root: &Path,
    usage: &UsageCache,
    clock: Instant,
) -> Result<String, String> {
    let node = NodeFacts {
        node_name: "node-a",
        root_dir: root,
        images: None,
        proc_root,
        logs_dir: &root.join("logs"),
    };
    summary_with(runtime, &node, usage, clock)
}

#[cfg(test)]
pub(crate) fn resource_page(runtime: &dyn RuntimeService) -> String {
    let mut out = String::new();
    render_resource(
        &mut out,
        1_700_000_000_000_000_000,
        Some(5_000_000_000),
        Some(1 << 20),
        collect(runtime),
    );
    out
}

#[cfg(test)]
mod tests;
