//! The kubelet's metrics (`/metrics`, `/metrics/probes`); the statistics
//! (`/metrics/resource`, `/stats/summary`) are `crate::stats`.
//!
//! Metrics are process-global statics (see [`registry`]) with upstream's
//! names, label names and bucket boundaries; the places that record them
//! call the small functions below (an atomic add each). Process metrics
//! are read from `/proc/self` when the page is rendered. This module sits
//! on the ground floor (it imports nothing of tinylet), so the CRI and
//! API clients can record into it.
//!

pub(crate) mod process;
pub mod registry;

use std::time::Duration;

use parking_lot::Mutex;

use registry::{header, sample, Counter, CounterFamily, Gauge, Histogram};
use registry::{DEF_BUCKETS, RUNTIME_BUCKETS};

// ---- CRI operations -------------------------------------------------------

/// CRI methods and upstream's `operation_type` for each.
const OPERATIONS: &[(&str, &str)] = &[
    ("Version", "version"),
    ("Status", "status"),
    ("RunPodSandbox", "run_podsandbox"),
    ("StopPodSandbox", "stop_podsandbox"),
    ("RemovePodSandbox", "remove_podsandbox"),
    ("PodSandboxStatus", "podsandbox_status"),
    ("ListPodSandbox", "list_podsandbox"),
    ("CreateContainer", "create_container"),
    ("StartContainer", "start_container"),
    ("StopContainer", "stop_container"),
    ("RemoveContainer", "remove_container"),
    ("ListContainers", "list_containers"),
    ("ContainerStatus", "container_status"),
    ("ExecSync", "exec_sync"),
    ("Exec", "exec"),
    ("Attach", "attach"),
    ("PortForward", "port_forward"),
    ("ReopenContainerLog", "reopen_container_log"),
    ("ListContainerStats", "list_container_stats"),
    ("ListImages", "list_images"),
    ("ImageStatus", "image_status"),
    ("PullImage", "pull_image"),
    ("RemoveImage", "remove_image"),
    ("ImageFsInfo", "image_fs_info"),
];
const OPS: usize = OPERATIONS.len();

struct RuntimeOp {
    total: Counter,
    errors: Counter,
    duration: Histogram,
}

#[allow(clippy::declare_interior_mutable_const)]
const RUNTIME_OP: RuntimeOp = RuntimeOp {
    total: Counter::new(),
    errors: Counter::new(),
    duration: Histogram::new(RUNTIME_BUCKETS),
};
static RUNTIME_OPS: [RuntimeOp; OPS] = [RUNTIME_OP; OPS];

/// Records one CRI call by its method name (as the CRI client names it):
/// how long it took and whether it failed. Unknown methods are ignored.
pub(crate) fn runtime_operation(method: &str, took: Duration, failed: bool) {
    let Some(i) = OPERATIONS.iter().position(|(m, _)| *m == method) else {
        return;
    };
    let op = &RUNTIME_OPS[i];
    op.total.inc();
    op.duration.observe(took);
    if failed {
        op.errors.inc();
    }
}

// ---- the kubelet's own ----------------------------------------------------

static NODE_NAME: Mutex<String> = Mutex::new(String::new());
static RUNNING_PODS: Gauge = Gauge::new();
/// Containers by state: created, running, exited, unknown.
static RUNNING_CONTAINERS: [Gauge; 4] = [Gauge::new(), Gauge::new(), Gauge::new(), Gauge::new()];
const CONTAINER_STATES: [&str; 4] = ["created", "running", "exited", "unknown"];
static POD_START: Histogram = Histogram::new(DEF_BUCKETS);
/// Pod worker syncs by operation type: create, update, sync, kill.
static POD_WORKER: [Histogram; 4] = [
    Histogram::new(DEF_BUCKETS),
    Histogram::new(DEF_BUCKETS),
    Histogram::new(DEF_BUCKETS),
    Histogram::new(DEF_BUCKETS),
];
const WORKER_OPERATIONS: [&str; 4] = ["create", "update", "sync", "kill"];
static PLEG_RELIST_DURATION: Histogram = Histogram::new(DEF_BUCKETS);
static PLEG_RELIST_INTERVAL: Histogram = Histogram::new(DEF_BUCKETS);
static HTTP_REQUESTS: CounterFamily = CounterFamily::new();
static REST_CLIENT_REQUESTS: CounterFamily = CounterFamily::new();
static PROBES: CounterFamily = CounterFamily::new();
static EVICTIONS: CounterFamily = CounterFamily::new();

/// Sets the node's name for `kubelet_node_name`.
pub(crate) fn set_node_name(name: &str) {
    let mut n = NODE_NAME.lock();
    n.clear();
    n.push_str(name);
}

/// Sets the running pods (with a ready sandbox) and the containers by the
/// state the PLEG sees (created, running, exited, unknown: the order of
/// `kubelet_running_containers`' series), after a relist.
pub(crate) fn set_running(pods: u64, containers: [u64; 4]) {
    RUNNING_PODS.set(pods);
    for (g, v) in RUNNING_CONTAINERS.iter().zip(containers) {
        g.set(v);
    }
}

/// A pod went from first seen to running in `d`.
pub(crate) fn pod_started(d: Duration) {
    POD_START.observe(d);
}

/// What a pod worker's turn did, for `kubelet_pod_worker_duration_seconds`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WorkerOperation {
    Create = 0,
    Update = 1,
    Sync = 2,
    Kill = 3,
}

/// A pod worker's sync took `d`.
pub(crate) fn pod_worker_sync(op: WorkerOperation, d: Duration) {
    POD_WORKER[op as usize].observe(d);
}

/// One PLEG relist took `took`, `interval` after the previous one began.
pub(crate) fn pleg_relist(took: Duration, interval: Option<Duration>) {
    PLEG_RELIST_DURATION.observe(took);
    if let Some(i) = interval {
        PLEG_RELIST_INTERVAL.observe(i);
    }
}

/// The methods `kubelet_http_requests_total` names, as upstream's server
/// buckets them (its `metricsMethodBuckets`); any other is `other`.
const HTTP_METHODS: &[&str] = &[
    "OPTIONS", "GET", "HEAD", "POST", "PUT", "DELETE", "TRACE", "CONNECT",
];

/// The path roots `kubelet_http_requests_total` names: upstream's buckets
/// (each root its server registers), whether or not tinylet serves them
/// all; any other root is `other`.
pub(crate) const HTTP_PATH_ROOTS: &[&str] = &[
    "healthz",
    "pods",
    "stats",
    "metrics",
    "metrics/cadvisor",
    "metrics/probes",
    "metrics/resource",
    "checkpoint",
    "run",
    "exec",
    "attach",
    "portForward",
    "containerLogs",
    "configz",
    "runningpods",
    "pprof",
    "logs",
    "debug",
];

/// The label value of whatever a caller sent that is not in `known`.
pub(crate) const OTHER: &str = "other";

/// One request to the node's API: `path` is the root of the request's
/// path (its first element, and the second under `metrics/`), `server_type`
/// `readonly` or `readwrite`, `long_running` for streaming and follow
/// requests. Recorded before authentication, so a method or root that is
/// not one of upstream's buckets counts as `other`, as upstream's do:
/// whatever strangers send, the family keeps a few dozen series.
pub(crate) fn http_request(method: &str, path: &str, server_type: &str, long_running: bool) {
    let long = if long_running { "true" } else { "false" };
    let method = HTTP_METHODS
        .iter()
        .find(|m| **m == method)
        .copied()
        .unwrap_or(OTHER);
    let path = HTTP_PATH_ROOTS
        .iter()
        .find(|p| **p == path)
        .copied()
        .unwrap_or(OTHER);
    let server_type = match server_type {
        "readonly" => "readonly",
        _ => "readwrite",
    };
    HTTP_REQUESTS.inc(&[method, path, server_type, long]);
}

/// The label values of every `kubelet_http_requests_total` series.
#[cfg(test)]
pub(crate) fn http_request_series() -> Vec<Vec<String>> {
    HTTP_REQUESTS.label_sets()
}

/// One answer (or failure, `code` None) of the apiserver to `method` on
/// `host` (`host:port`).
pub(crate) fn rest_client_request(code: Option<u16>, method: &str, host: &str) {
    let mut buf = [0u8; 8];
    let code = match code {
        Some(c) => format_u16(c, &mut buf),
        None => "<error>",
    };
    REST_CLIENT_REQUESTS.inc(&[code, method, host]);
}

fn format_u16(mut v: u16, buf: &mut [u8; 8]) -> &str {
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b'0' + (v % 10) as u8;
        v /= 10;
        if v == 0 {
            break;
        }
    }
    std::str::from_utf8(&buf[i..]).unwrap_or("0")
}

/// The eviction manager evicted a pod for `signal` (a threshold's signal,
/// or `emptydirfs.limit`, `ephemeralpodfs.limit`,
/// `ephemeralcontainerfs.limit` for local storage limits).
pub(crate) fn eviction(signal: &str) {
    EVICTIONS.inc(&[signal]);
}

/// A probe ran and gave `result` (`successful`, `failed` or `unknown`).
pub(crate) fn probe_result(
    probe_type: &str,
    result: &str,
    container: &str,
    pod: &str,
    namespace: &str,
    pod_uid: &str,
) {
    PROBES.inc(&[probe_type, result, container, pod, namespace, pod_uid]);
}

/// A probe stopped: its series go, as upstream deletes them with the worker.
pub(crate) fn probe_removed(probe_type: &str, container: &str, pod_uid: &str) {
    PROBES.remove_where(|k| k[0] == probe_type && k[2] == container && k[5] == pod_uid);
}

const ALPHA: &str = "[ALPHA] ";

fn alpha_header(out: &mut String, name: &str, help: &str, kind: &str) {
    let mut h = String::with_capacity(ALPHA.len() + help.len());
    h.push_str(ALPHA);
    h.push_str(help);
    header(out, name, &h, kind);
}

/// `GET /metrics`: the kubelet's metrics and the process's.
pub(crate) fn render_metrics(out: &mut String) {
    let node = NODE_NAME.lock().clone();
    alpha_header(
        out,
        "kubelet_node_name",
        "The node's name. The count is always 1.",
        "gauge",
    );
    sample(out, "kubelet_node_name", &[("node", &node)], 1.0);

    alpha_header(
        out,
        "kubelet_running_pods",
        "Number of pods that have a running pod sandbox",
        "gauge",
    );
    sample(out, "kubelet_running_pods", &[], RUNNING_PODS.get() as f64);
    alpha_header(
        out,
        "kubelet_running_containers",
        "Number of containers currently running",
        "gauge",
    );
    for (state, g) in CONTAINER_STATES.iter().zip(&RUNNING_CONTAINERS) {
        sample(
            out,
            "kubelet_running_containers",
            &[("container_state", state)],
            g.get() as f64,
        );
    }

    alpha_header(
        out,
        "kubelet_pod_start_duration_seconds",
        "Duration in seconds for a single pod to go from pending to running.",
        "histogram",
    );
    POD_START.render(out, "kubelet_pod_start_duration_seconds", &[]);

    alpha_header(
        out,
        "kubelet_pod_worker_duration_seconds",
        "Duration in seconds to sync a single pod. Broken down by operation type: create, update, or sync",
        "histogram",
    );
    for (op, h) in WORKER_OPERATIONS.iter().zip(&POD_WORKER) {
        if h.count() > 0 {
            h.render(
                out,
                "kubelet_pod_worker_duration_seconds",
                &[("operation_type", op)],
            );
        }
    }

    alpha_header(
        out,
        "kubelet_pleg_relist_duration_seconds",
        "Duration in seconds for relisting pods in PLEG.",
        "histogram",
    );
    PLEG_RELIST_DURATION.render(out, "kubelet_pleg_relist_duration_seconds", &[]);
    alpha_header(
        out,
        "kubelet_pleg_relist_interval_seconds",
        "Interval in seconds between relisting in PLEG.",
        "histogram",
    );
    PLEG_RELIST_INTERVAL.render(out, "kubelet_pleg_relist_interval_seconds", &[]);

    alpha_header(
        out,
        "kubelet_runtime_operations_total",
        "Cumulative number of runtime operations by operation type.",
        "counter",
    );
    for ((_, op), m) in OPERATIONS.iter().zip(&RUNTIME_OPS) {
        if m.total.get() > 0 {
            let v = m.total.get() as f64;
            sample(
                out,
                "kubelet_runtime_operations_total",
                &[("operation_type", op)],
                v,
            );
        }
    }
    alpha_header(
        out,
        "kubelet_runtime_operations_errors_total",
        "Cumulative number of runtime operation errors by operation type.",
        "counter",
    );
    for ((_, op), m) in OPERATIONS.iter().zip(&RUNTIME_OPS) {
        if m.errors.get() > 0 {
            let v = m.errors.get() as f64;
            let name = "kubelet_runtime_operations_errors_total";
            sample(out, name, &[("operation_type", op)], v);
        }
    }
    alpha_header(
        out,
        "kubelet_runtime_operations_duration_seconds",
        "Duration in seconds of runtime operations. Broken down by operation type.",
        "histogram",
    );
    for ((_, op), m) in OPERATIONS.iter().zip(&RUNTIME_OPS) {
        if m.duration.count() > 0 {
            let name = "kubelet_runtime_operations_duration_seconds";
            m.duration.render(out, name, &[("operation_type", op)]);
        }
    }

    alpha_header(
        out,
        "kubelet_http_requests_total",
        "Number of the http requests received since the server started",
        "counter",
    );
    HTTP_REQUESTS.render(
        out,
        "kubelet_http_requests_total",
        &["method", "path", "server_type", "long_running"],
    );

    alpha_header(
        out,
        "kubelet_evictions",
        "Cumulative number of pod evictions by eviction signal",
        "counter",
    );
    EVICTIONS.render(out, "kubelet_evictions", &["eviction_signal"]);

    alpha_header(
        out,
        "rest_client_requests_total",
        "Number of HTTP requests, partitioned by status code, method, and host.",
        "counter",
    );
    REST_CLIENT_REQUESTS.render(
        out,
        "rest_client_requests_total",
        &["code", "method", "host"],
    );

    process::render(out);
}

/// `GET /metrics/probes`: `prober_probe_total`.
pub(crate) fn render_probe_metrics(out: &mut String) {
    alpha_header(
        out,
        "prober_probe_total",
        "Cumulative number of a liveness, readiness or startup probe for a container by result.",
        "counter",
    );
    PROBES.render(
        out,
        "prober_probe_total",
        &[
            "probe_type",
            "result",
            "container",
            "pod",
            "namespace",
            "pod_uid",
        ],
    );
}

#[cfg(test)]
mod tests;
#[cfg(test)]
pub(crate) mod textformat;
