//! Tests of the registry's text format and the metrics pages.

use std::time::Duration;

use super::registry::{CounterFamily, Histogram, DEF_BUCKETS};
use super::textformat::{parse, Sample};
use super::*;
use crate::cri::RuntimeService;

fn find<'a>(s: &'a [Sample], name: &str, labels: &[(&str, &str)]) -> Option<&'a Sample> {
    s.iter().find(|x| {
        x.name == name
            && labels
                .iter()
                .all(|(k, v)| x.labels.iter().any(|(a, b)| a == k && b == v))
    })
}

#[test]
fn histogram_buckets_are_cumulative_and_end_in_inf() {
    static H: Histogram = Histogram::new(DEF_BUCKETS);
    H.observe(Duration::from_millis(3)); // le 0.005
    H.observe(Duration::from_millis(10)); // le 0.01 (bounds are inclusive)
    H.observe(Duration::from_millis(700)); // le 1
    H.observe(Duration::from_secs(60)); // only +Inf
    let mut out = String::new();
    registry::header(&mut out, "h_seconds", "A test.", "histogram");
    H.render(&mut out, "h_seconds", &[("op", "x")]);
    let s = parse(&out).unwrap();
    let b = |le: &str| {
        find(&s, "h_seconds_bucket", &[("le", le), ("op", "x")])
            .unwrap()
            .value
    };
    assert_eq!(b("0.005"), 1.0);
    assert_eq!(b("0.01"), 2.0);
    assert_eq!(b("0.5"), 2.0);
    assert_eq!(b("1"), 3.0);
    assert_eq!(b("10"), 3.0);
    assert_eq!(b("+Inf"), 4.0);
    assert_eq!(find(&s, "h_seconds_count", &[]).unwrap().value, 4.0);
    let sum = find(&s, "h_seconds_sum", &[]).unwrap().value;
    assert!((sum - 60.713).abs() < 1e-9, "{sum}");
    assert!(
        out.starts_with("# HELP h_seconds A test.\n# TYPE h_seconds histogram\n"),
        "{out}"
    );
}

#[test]
fn label_values_and_help_are_escaped() {
    static F: CounterFamily = CounterFamily::new();
    let nasty = "a\"b\\c\nd";
    F.inc(&[nasty, "x"]);
    F.inc(&[nasty, "x"]);
    F.inc(&["plain", "x"]);
    let mut out = String::new();
    registry::header(&mut out, "f_total", "Help with \\ and\nnewline.", "counter");
    F.render(&mut out, "f_total", &["k", "j"]);
    assert!(
        out.contains("# HELP f_total Help with \\\\ and\\nnewline.\n"),
        "{out}"
    );
    assert!(out.contains(r#"f_total{k="a\"b\\c\nd",j="x"} 2"#), "{out}");
    let s = parse(&out).unwrap();
    assert_eq!(find(&s, "f_total", &[("k", nasty)]).unwrap().value, 2.0);
    assert_eq!(find(&s, "f_total", &[("k", "plain")]).unwrap().value, 1.0);
    F.remove_where(|k| k[0] == "plain");
    assert_eq!(F.get(&["plain", "x"]), 0);
    assert_eq!(F.get(&[nasty, "x"]), 2);
}

#[test]
fn the_parser_refuses_broken_pages() {
    for bad in [
        "x 1\n",                                            // no TYPE
        "# HELP x h\n# TYPE x gauge\nx{a=\"1} 1\n",          // unterminated
        "# HELP x h\n# TYPE x gauge\nx{a=\"\\q\"} 1\n",      // bad escape
        "# HELP x h\n# TYPE x gauge\n1x 1\n",               // bad name
        "# HELP x h\n# TYPE x gauge\nx one\n",              // bad value
        "# HELP h h\n# TYPE h histogram\nh_bucket{le=\"1\"} 2\nh_bucket{le=\"+Inf\"} 1\nh_sum 0\nh_count 1\n",
        "# HELP h h\n# TYPE h histogram\nh_bucket{le=\"1\"} 1\nh_sum 0\nh_count 1\n",
    ] {
        assert!(parse(bad).is_err(), "{bad:?} passed");
    }
}

#[test]
fn the_metrics_page_has_the_kubelets_names_and_parses() {
    set_node_name("node-\"q\"");
    runtime_operation("ListPodSandbox", Duration::from_millis(2), false);
    runtime_operation("PullImage", Duration::from_secs(4), true);
    runtime_operation("NoSuchCall", Duration::from_secs(4), true);
    set_running(3, [1, 4, 2, 0]);
    pod_started(Duration::from_millis(1500));
    pod_worker_sync(WorkerOperation::Create, Duration::from_millis(40));
    pleg_relist(Duration::from_millis(8), Some(Duration::from_secs(1)));
    http_request("GET", "stats", "readwrite", false);
    rest_client_request(Some(201), "POST", "10.0.0.1:6443");
    rest_client_request(None, "GET", "10.0.0.1:6443");
    eviction("nodefs.available");

    let mut out = String::new();
    render_metrics(&mut out);
    let s = parse(&out).unwrap_or_else(|e| panic!("{e}\n{out}"));
    assert!(
        find(
            &s,
            "kubelet_evictions",
            &[("eviction_signal", "nodefs.available")]
        )
        .unwrap()
        .value
            >= 1.0
    );
    assert_eq!(
        find(&s, "kubelet_node_name", &[("node", "node-\"q\"")])
            .unwrap()
            .value,
        1.0
    );
    assert_eq!(find(&s, "kubelet_running_pods", &[]).unwrap().value, 3.0);
    let cs = |st| {
        find(&s, "kubelet_running_containers", &[("container_state", st)])
            .unwrap()
            .value
    };
    assert_eq!(
        (cs("created"), cs("running"), cs("exited"), cs("unknown")),
        (1.0, 4.0, 2.0, 0.0)
    );
    let ops = |n, op| find(&s, n, &[("operation_type", op)]).map(|x| x.value);
    assert!(ops("kubelet_runtime_operations_total", "list_podsandbox") >= Some(1.0));
    assert!(ops("kubelet_runtime_operations_errors_total", "pull_image") >= Some(1.0));
    assert!(
        find(
            &s,
            "kubelet_runtime_operations_duration_seconds_bucket",
            &[("operation_type", "pull_image"), ("le", "7.62939453125")]
        )
        .unwrap()
        .value
            >= 1.0
    );
    assert!(
        find(
            &s,
            "kubelet_pod_start_duration_seconds_bucket",
            &[("le", "2.5")]
        )
        .unwrap()
        .value
            >= 1.0
    );
    assert!(ops("kubelet_pod_worker_duration_seconds_count", "create") >= Some(1.0));
    assert!(
        find(&s, "kubelet_pleg_relist_duration_seconds_count", &[])
            .unwrap()
            .value
            >= 1.0
    );
    assert!(
        find(
            &s,
            "kubelet_pleg_relist_interval_seconds_bucket",
            &[("le", "1")]
        )
        .unwrap()
        .value
            >= 1.0
    );
    let http = [
        ("method", "GET"),
        ("path", "stats"),
        ("server_type", "readwrite"),
        ("long_running", "false"),
    ];
    assert!(
        find(&s, "kubelet_http_requests_total", &http)
            .unwrap()
            .value
            >= 1.0
    );
    let rest = |code| {
        find(
            &s,
            "rest_client_requests_total",
            &[("code", code), ("host", "10.0.0.1:6443")],
        )
        .map(|x| x.value)
    };
    assert!(rest("201") >= Some(1.0));
    assert!(rest("<error>") >= Some(1.0));
    for p in [
        "process_resident_memory_bytes",
        "process_cpu_seconds_total",
        "process_open_fds",
        "process_start_time_seconds",
    ] {
        let v = find(&s, p, &[])
            .unwrap_or_else(|| panic!("{p} missing"))
            .value;
        // A young test process may not have used a whole clock tick yet.
        assert!(v > 0.0 || p == "process_cpu_seconds_total", "{p} {v}");
    }
    assert!(
        out.contains("# HELP kubelet_running_pods [ALPHA] "),
        "{out}"
    );
}

#[test]
fn probe_metrics_count_results_and_go_with_the_probe() {
    probe_result(
        "Readiness",
        "successful",
        "app",
        "web",
        "ns1",
        "uid-probe-1",
    );
    probe_result(
        "Readiness",
        "successful",
        "app",
        "web",
        "ns1",
        "uid-probe-1",
    );
    probe_result("Readiness", "failed", "app", "web", "ns1", "uid-probe-1");
    probe_result("Liveness", "successful", "app", "web", "ns1", "uid-probe-1");
    let page = || {
        let mut out = String::new();
        render_probe_metrics(&mut out);
        parse(&out).unwrap_or_else(|e| panic!("{e}\n{out}"))
    };
    let s = page();
    let get = |s: &[Sample], t, r| {
        find(
            s,
            "prober_probe_total",
            &[
                ("probe_type", t),
                ("result", r),
                ("container", "app"),
                ("pod", "web"),
                ("namespace", "ns1"),
                ("pod_uid", "uid-probe-1"),
            ],
        )
        .map(|x| x.value)
    };
    assert_eq!(get(&s, "Readiness", "successful"), Some(2.0));
    assert_eq!(get(&s, "Readiness", "failed"), Some(1.0));
    probe_removed("Readiness", "app", "uid-probe-1");
    let s = page();
    assert_eq!(get(&s, "Readiness", "successful"), None);
    assert_eq!(get(&s, "Liveness", "successful"), Some(1.0));
}

/// A fake runtime running pod `web` (ns `ns1`) with containers `app` and
/// `side`, plus an exited container; returns the running containers' IDs.
#[test]
fn cri_calls_are_counted_by_operation_with_their_errors() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("absent.sock");
    let rt =
        crate::cri::RemoteRuntime::new(sock.to_str().unwrap(), Duration::from_secs(5)).unwrap();
    let before = (RUNTIME_OPS[5].total.get(), RUNTIME_OPS[5].errors.get());
    assert_eq!(OPERATIONS[5].1, "podsandbox_status");
    assert!(rt.pod_sandbox_status("x").is_err());
    assert!(rt
        .exec_sync("x", &["true".into()], Duration::from_secs(1))
        .is_err());
    assert_eq!(RUNTIME_OPS[5].total.get(), before.0 + 1);
    assert_eq!(RUNTIME_OPS[5].errors.get(), before.1 + 1);
    let mut out = String::new();
    render_metrics(&mut out);
    let s = parse(&out).unwrap();
    let exec = [("operation_type", "exec_sync")];
    assert!(
        find(&s, "kubelet_runtime_operations_errors_total", &exec)
            .unwrap()
            .value
            >= 1.0
    );
    assert!(
        find(
            &s,
            "kubelet_runtime_operations_duration_seconds_count",
            &exec
        )
        .unwrap()
        .value
            >= 1.0
    );
}
