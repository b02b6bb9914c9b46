//! `tinylet status`: what the local node runs, as a table (or the
//! `PodList` as JSON), for an operator on the box itself.
//!
//! Sources, first that answers: the read-only port (`GET /pods` over plain
//! HTTP on 127.0.0.1) when `--read-only-port` is given; the main port
//! (`GET /pods` over TLS on 127.0.0.1) with the credentials of
//! `--kubeconfig` (its client certificate), trusting the node's serving
//! certificate (`--tls-cert-file`, else `<root-dir>/pki/kubelet.crt`) when
//! `--kubeconfig` is given; else the container runtime (CRI sandboxes and
//! containers read back through their labels). One line on stderr says
//! which answered. Both HTTP sources go through [`crate::kube::Client`].
//!
//! The `/pods` answer is read leniently: only the fields the table shows,
//! each one optional. From the runtime, a pod's phase is derived from its
//! containers' states alone (Pending, Running, Succeeded, Failed) and a
//! running container counts as ready (the runtime knows no probes).

use std::collections::HashMap;
use std::process::ExitCode;
use std::time::Duration;

use serde_json::{json, Value};

use crate::cri::{api, RemoteRuntime, RuntimeService};
use crate::kube::{load_kubeconfig, Client, ClientOptions, KubeConfig};
use crate::options::{StatusOptions, StatusOutput};
use crate::pod::CONFIG_SOURCE_ANNOTATION_KEY;
use crate::runtime::labels;

/// How often `--watch` redraws.
pub(crate) const WATCH_PERIOD: Duration = Duration::from_secs(2);

/// Deadline of one request to the node or the runtime.
const TIMEOUT: Duration = Duration::from_secs(10);

/// Runs the subcommand: 0 when a source answered (every time, with
/// `--watch`, until interrupted), 1 when none did.
pub fn main(o: &StatusOptions) -> ExitCode {
    let mut shown_source = String::new();
    loop {
        match fetch(o) {
            Ok((source, list)) => {
                if source != shown_source {
                    eprintln!("tinylet status: from {source}");
                    shown_source = source;
                }
                let text = match o.output {
                    StatusOutput::Json => {
                        let mut t = serde_json::to_string_pretty(&list).unwrap_or_default();
                        t.push('\n');
                        t
                    }
                    out => render(&list, now_secs(), out == StatusOutput::Wide),
                };
                if o.watch && stdout_is_terminal() {
                    // Home and clear, so the table redraws in place.
                    print!("\x1b[H\x1b[2J");
                }
                print!("{text}");
                if o.watch {
                    println!();
                }
            }
            Err(e) => {
                eprintln!("tinylet status: {e}");
                if !o.watch {
                    return ExitCode::FAILURE;
                }
                shown_source.clear();
            }
        }
        if !o.watch {
            return ExitCode::SUCCESS;
        }
        std::thread::sleep(WATCH_PERIOD);
    }
}

fn stdout_is_terminal() -> bool {
    // SAFETY: isatty only inspects the descriptor.
    unsafe { libc::isatty(1) == 1 }
}

fn now_secs() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

/// The first source that answers: its description and the `PodList`.
fn fetch(o: &StatusOptions) -> Result<(String, Value), String> {
    let mut failures = Vec::new();
    if o.read_only_port != 0 {
        let server = format!("http://127.0.0.1:{}", o.read_only_port);
        let config = KubeConfig {
            server: server.clone(),
            ..KubeConfig::default()
        };
        match get_pods(&config) {
            Ok(list) => return Ok((format!("the read-only port, {server}/pods"), list)),
            Err(e) => failures.push(format!("the read-only port: {e}")),
        }
    }
    if let Some(path) = &o.kubeconfig {
        match main_port_config(o, path).and_then(|c| get_pods(&c).map(|l| (c.server, l))) {
            Ok((server, list)) => return Ok((format!("the main port, {server}/pods"), list)),
            Err(e) => failures.push(format!("the main port: {e}")),
        }
    }
    for f in &failures {
        eprintln!("tinylet status: {f}; trying the next source");
    }
    let list = from_runtime(&o.container_runtime_endpoint).map_err(|e| {
        format!(
            "the container runtime {}: {e}",
            o.container_runtime_endpoint
        )
    })?;
    Ok((
        format!("the container runtime, {}", o.container_runtime_endpoint),
        list,
    ))
}

/// The kubeconfig's credentials, pointed at the local main port and
/// trusting the node's serving certificate.
fn main_port_config(o: &StatusOptions, kubeconfig: &std::path::Path) -> Result<KubeConfig, String> {
    let mut config = load_kubeconfig(kubeconfig)?;
    let cert = o
        .tls_cert_file
        .clone()
        .unwrap_or_else(|| o.root_dir.join("pki").join("kubelet.crt"));
    let pem = std::fs::read(&cert)
        .map_err(|e| format!("the node's certificate {}: {e}", cert.display()))?;
    config.server = format!("https://127.0.0.1:{}", o.port);
    config.ca_pem = Some(pem);
    config.insecure_skip_tls_verify = false;
    Ok(config)
}

/// `GET /pods` from the node `config` points at.
fn get_pods(config: &KubeConfig) -> Result<Value, String> {
    let client = Client::new(
        config,
        ClientOptions {
            qps: 0.0,
            burst: 1,
            timeout: TIMEOUT,
            user_agent: format!("tinylet-status/v{}", env!("CARGO_PKG_VERSION")),
        },
    )?;
    let list = client.get("/pods").map_err(|e| e.to_string())?;
    match list.get("items") {
        Some(Value::Array(_)) | Some(Value::Null) | None if list.is_object() => Ok(list),
        _ => Err(format!(
            "GET {}/pods: the answer is not a PodList (no items list)",
            config.server
        )),
    }
}

/// A `PodList` made from the runtime's sandboxes and containers.
fn from_runtime(endpoint: &str) -> Result<Value, String> {
    let rt = RemoteRuntime::new(endpoint, TIMEOUT).map_err(|e| e.to_string())?;
    let sandboxes = rt.list_pod_sandbox(None).map_err(|e| e.to_string())?;
    let containers = rt.list_containers(None).map_err(|e| e.to_string())?;
    // The newest sandbox of each pod UID.
    let mut newest: HashMap<&str, &api::PodSandbox> = HashMap::new();
    for s in &sandboxes {
        let Some(uid) = s.labels.get(labels::POD_UID) else {
            continue;
        };
        match newest.get(uid.as_str()) {
            Some(old) if old.created_at >= s.created_at => {}
            _ => {
                newest.insert(uid, s);
            }
        }
    }
    let mut pods: Vec<&api::PodSandbox> = newest.into_values().collect();
    pods.sort_by(|a, b| {
        let key = |s: &api::PodSandbox| {
            (
                s.labels.get(labels::POD_NAMESPACE).cloned(),
                s.labels.get(labels::POD_NAME).cloned(),
            )
        };
        key(a).cmp(&key(b))
    });
    let mut items = Vec::new();
    for sandbox in pods {
        let get = |k: &str| sandbox.labels.get(k).cloned().unwrap_or_default();
        let uid = get(labels::POD_UID);
        // The newest instance of each of the pod's containers.
        let mut mine: Vec<&api::Container> = Vec::new();
        for c in containers
            .iter()
            .filter(|c| c.labels.get(labels::POD_UID) == Some(&uid))
        {
            let name = c.labels.get(labels::CONTAINER_NAME);
            match mine
                .iter_mut()
                .find(|m| m.labels.get(labels::CONTAINER_NAME) == name)
            {
                Some(m) if m.created_at >= c.created_at => {}
                Some(m) => *m = c,
                None => mine.push(c),
            }
        }
        mine.sort_by_key(|c| c.created_at);
        let ready_sandbox = sandbox.state.enum_value() == Ok(api::PodSandboxState::SANDBOX_READY);
        let ip = if ready_sandbox {
            rt.pod_sandbox_status(&sandbox.id)
                .ok()
                .and_then(|s| s.network.into_option())
                .map(|n| n.ip)
                .filter(|ip| !ip.is_empty())
        } else {
            None
        };
        let mut statuses = Vec::new();
        let (mut running, mut exited, mut failed) = (0, 0, 0);
        for c in &mine {
            let state = c
                .state
                .enum_value()
                .unwrap_or(api::ContainerState::CONTAINER_UNKNOWN);
            let state_json = match state {
                api::ContainerState::CONTAINER_RUNNING => {
                    running += 1;
                    json!({"running": {}})
                }
                api::ContainerState::CONTAINER_EXITED => {
                    exited += 1;
                    let (code, reason) = rt
                        .container_status(&c.id)
                        .map(|s| (s.exit_code, s.reason))
                        .unwrap_or((-1, String::new()));
                    if code != 0 {
                        failed += 1;
                    }
                    json!({"terminated": {"exitCode": code, "reason": reason}})
                }
                api::ContainerState::CONTAINER_CREATED => {
                    json!({"waiting": {"reason": "ContainerCreating"}})
                }
                _ => json!({"waiting": {"reason": "Unknown"}}),
            };
            statuses.push(json!({
                "name": c.labels.get(labels::CONTAINER_NAME).cloned().unwrap_or_default(),
                "containerID": c.id,
                "image": c.image.as_ref().map(|i| i.image.clone()).unwrap_or_default(),
                "imageID": c.image_ref,
                "ready": state == api::ContainerState::CONTAINER_RUNNING,
                "restartCount": labels::parse_restart_count(&c.annotations),
                "state": state_json,
            }));
        }
        let n = mine.len();
        let phase = if n == 0 || (running == 0 && exited < n) {
            "Pending"
        } else if running > 0 {
            "Running"
        } else if failed > 0 {
            "Failed"
        } else {
            "Succeeded"
        };
        let mut annotations = serde_json::Map::new();
        if let Some(s) = sandbox.annotations.get(CONFIG_SOURCE_ANNOTATION_KEY) {
            annotations.insert(CONFIG_SOURCE_ANNOTATION_KEY.into(), json!(s));
        }
        let created = std::time::UNIX_EPOCH
            + Duration::from_nanos(u64::try_from(sandbox.created_at).unwrap_or(0));
        let spec: Vec<Value> = statuses
            .iter()
            .map(|s| json!({"name": s["name"], "image": s["image"]}))
            .collect();
        let mut status = json!({"phase": phase, "containerStatuses": statuses});
        if let Some(ip) = ip {
            status["podIP"] = json!(ip);
        }
        items.push(json!({
            "metadata": {
                "name": get(labels::POD_NAME),
                "namespace": get(labels::POD_NAMESPACE),
                "uid": uid,
                "creationTimestamp": crate::apitime::rfc3339(created),
                "annotations": annotations,
            },
            "spec": {"containers": spec},
            "status": status,
        }));
    }
    Ok(json!({"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": items}))
}

/// kubectl's age: `5s`, `3m10s`, `2h`, `4d` (apimachinery's HumanDuration).
pub(crate) fn human_age(secs: i64) -> String {
    if secs < -1 {
        return "<invalid>".into();
    }
    if secs < 0 {
        return "0s".into();
    }
    if secs < 120 {
        return format!("{secs}s");
    }
    let minutes = secs / 60;
    if minutes < 10 {
        return match secs % 60 {
            0 => format!("{minutes}m"),
            s => format!("{minutes}m{s}s"),
        };
    }
    if minutes < 180 {
        return format!("{minutes}m");
    }
    let hours = secs / 3600;
    if hours < 8 {
        return match minutes % 60 {
            0 => format!("{hours}h"),
            m => format!("{hours}h{m}m"),
        };
    }
    if hours < 48 {
        return format!("{hours}h");
    }
    let days = hours / 24;
    if hours < 24 * 8 {
        return match hours % 24 {
            0 => format!("{days}d"),
            h => format!("{days}d{h}h"),
        };
    }
    if hours < 24 * 365 * 2 {
        return format!("{days}d");
    }
    let years = days / 365;
    if hours < 24 * 365 * 8 {
        return match days % 365 {
            0 => format!("{years}y"),
            d => format!("{years}y{d}d"),
        };
    }
    format!("{years}y")
}

/// Seconds since the epoch of an RFC 3339 time.
fn parse_time(s: &str) -> Option<i64> {
    s.parse::<k8s_openapi::jiff::Timestamp>()
        .ok()
        .map(|t| t.as_second())
}

/// A string field of `v` at `path`, or "".
fn text<'a>(v: &'a Value, path: &[&str]) -> &'a str {
    path.iter()
        .try_fold(v, |v, k| v.get(k))
        .and_then(Value::as_str)
        .unwrap_or("")
}

/// A container status's state in a word: `Running`, `Waiting: <reason>`,
/// `Terminated: <reason> (exit <code>)`.
fn container_state(s: &Value) -> String {
    let state = &s["state"];
    if state.get("running").is_some_and(|r| !r.is_null()) {
        return "Running".into();
    }
    if let Some(t) = state.get("terminated").filter(|t| t.is_object()) {
        let code = t.get("exitCode").and_then(Value::as_i64).unwrap_or(0);
        return match text(t, &["reason"]) {
            "" => format!("Terminated (exit {code})"),
            r => format!("Terminated: {r} (exit {code})"),
        };
    }
    match text(state, &["waiting", "reason"]) {
        "" => "Waiting".into(),
        r => format!("Waiting: {r}"),
    }
}

/// The table of `list`'s pods at time `now` (seconds since the epoch);
/// `wide` adds a row per container below its pod.
pub(crate) fn render(list: &Value, now: i64, wide: bool) -> String {
    let mut rows: Vec<[String; 8]> = vec![[
        "NAMESPACE",
        "NAME",
        "PHASE",
        "READY",
        "RESTARTS",
        "AGE",
        "IP",
        "SOURCE",
    ]
    .map(String::from)];
    let empty = Vec::new();
    let items = list
        .get("items")
        .and_then(Value::as_array)
        .unwrap_or(&empty);
    for pod in items {
        let statuses = pod
            .pointer("/status/containerStatuses")
            .and_then(Value::as_array)
            .unwrap_or(&empty);
        let total = pod
            .pointer("/spec/containers")
            .and_then(Value::as_array)
            .map_or(statuses.len(), Vec::len);
        let ready = statuses
            .iter()
            .filter(|s| s.get("ready").and_then(Value::as_bool) == Some(true))
            .count();
        let restarts: i64 = statuses
            .iter()
            .filter_map(|s| s.get("restartCount").and_then(Value::as_i64))
            .sum();
        let age = parse_time(text(pod, &["metadata", "creationTimestamp"]))
            .or_else(|| parse_time(text(pod, &["status", "startTime"])))
            .map_or_else(|| "<unknown>".into(), |t| human_age(now - t));
        let or = |s: &str, none: &str| if s.is_empty() { none } else { s }.to_string();
        let source = pod
            .pointer("/metadata/annotations")
            .and_then(|a| a.get(CONFIG_SOURCE_ANNOTATION_KEY))
            .and_then(Value::as_str)
            .unwrap_or("");
        rows.push([
            text(pod, &["metadata", "namespace"]).to_string(),
            text(pod, &["metadata", "name"]).to_string(),
            or(text(pod, &["status", "phase"]), "Unknown"),
            format!("{ready}/{total}"),
            restarts.to_string(),
            age,
            or(text(pod, &["status", "podIP"]), "<none>"),
            or(source, "<none>"),
        ]);
        if wide {
            for s in statuses {
                let ready = s.get("ready").and_then(Value::as_bool) == Some(true);
                rows.push([
                    String::new(),
                    format!("  {}", text(s, &["name"])),
                    container_state(s),
                    format!("{}/1", u8::from(ready)),
                    s.get("restartCount")
                        .and_then(Value::as_i64)
                        .unwrap_or(0)
                        .to_string(),
                    String::new(),
                    String::new(),
                    text(s, &["image"]).to_string(),
                ]);
            }
        }
    }
    align(&rows)
}

/// Columns padded to their widest cell plus three spaces, as kubectl's
/// tab writer does; no trailing spaces.
fn align(rows: &[[String; 8]]) -> String {
    let mut widths = [0usize; 8];
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    for row in rows {
        let mut line = String::new();
        for (i, cell) in row.iter().enumerate() {
            line.push_str(cell);
            if i + 1 < row.len() {
                let pad = widths[i] - cell.chars().count() + 3;
                line.extend(std::iter::repeat_n(' ', pad));
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ages_read_as_kubectl_prints_them() {
        let cases = [
            (-5, "<invalid>"),
            (-1, "0s"),
            (5, "5s"),
            (119, "119s"),
            (120, "2m"),
            (190, "3m10s"),
            (600, "10m"),
            (179 * 60, "179m"),
            (3 * 3600, "3h"),
            (3 * 3600 + 25 * 60, "3h25m"),
            (8 * 3600, "8h"),
            (47 * 3600, "47h"),
            (2 * 86400, "2d"),
            (4 * 86400 + 5 * 3600, "4d5h"),
            (8 * 86400, "8d"),
            (400 * 86400, "400d"),
            (3 * 365 * 86400, "3y"),
            (3 * 365 * 86400 + 10 * 86400, "3y10d"),
            (9 * 365 * 86400 + 10 * 86400, "9y"),
        ];
        for (secs, want) in cases {
            assert_eq!(human_age(secs), want, "{secs}s");
        }
    }

    fn list() -> Value {
        json!({"kind": "PodList", "items": [
            {"metadata": {"name": "web-edge-1", "namespace": "default",
                "creationTimestamp": "2026-01-01T00:00:00Z",
                "annotations": {"kubernetes.io/config.source": "file"}},
             "spec": {"containers": [{"name": "app"}, {"name": "sidecar"}]},
             "status": {"phase": "Running", "podIP": "10.88.0.7", "containerStatuses": [
                {"name": "app", "ready": true, "restartCount": 2, "image": "busybox",
                 "state": {"running": {"startedAt": "2026-01-01T00:00:01Z"}}},
                {"name": "sidecar", "ready": false, "restartCount": 1, "image": "nginx",
                 "state": {"waiting": {"reason": "CrashLoopBackOff"}}}]}},
            {"metadata": {"name": "api-pod", "namespace": "kube-system",
                "creationTimestamp": "2025-12-28T00:00:00Z",
                "annotations": {"kubernetes.io/config.source": "api"}},
             "spec": {"containers": [{"name": "c"}]},
             "status": {"phase": "Pending"}},
            // Anything may be missing or of another type.
            {"metadata": {"name": 7}, "status": "odd"}
        ]})
    }

    #[test]
    fn the_table_counts_ready_containers_and_restarts_and_aligns_columns() {
        let now = parse_time("2026-01-01T00:03:10Z").unwrap();
        let table = render(&list(), now, false);
        let want = "\
NAMESPACE     NAME         PHASE     READY   RESTARTS   AGE         IP          SOURCE
default       web-edge-1   Running   1/2     3          3m10s       10.88.0.7   file
kube-system   api-pod      Pending   0/1     0          4d          <none>      api
                           Unknown   0/0     0          <unknown>   <none>      <none>
";
        assert_eq!(table, want);
    }

    #[test]
    fn wide_lists_each_container_below_its_pod() {
        let now = parse_time("2026-01-01T00:03:10Z").unwrap();
        let table = render(&list(), now, true);
        let lines: Vec<&str> = table.lines().collect();
        assert!(lines[1].starts_with("default "), "{table}");
        let app: Vec<&str> = lines[2].split_whitespace().collect();
        assert_eq!(app, ["app", "Running", "1/1", "2", "busybox"], "{table}");
        let sidecar: Vec<&str> = lines[3].split_whitespace().collect();
        assert_eq!(
            sidecar,
            [
                "sidecar",
                "Waiting:",
                "CrashLoopBackOff",
                "0/1",
                "1",
                "nginx"
            ],
            "{table}"
        );
        assert!(lines[4].starts_with("kube-system "), "{table}");
    }

    #[test]
    fn an_empty_or_odd_list_gives_the_header_only() {
        let header = "NAMESPACE   NAME   PHASE   READY   RESTARTS   AGE   IP   SOURCE\n";
        assert_eq!(render(&json!({"items": []}), 0, false), header);
        assert_eq!(render(&json!({}), 0, false), header);
        assert_eq!(render(&json!({"items": "x"}), 0, true), header);
    }
}
