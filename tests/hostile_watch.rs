//! Hostile watch streams: the real `tinylet` binary (fake CRI) reads its
//! pods watch from the fake apiserver, into which raw lines are injected:
//! not JSON, truncated, unknown types, missing parts, objects of another
//! kind or for another node, wrong field types, bad resourceVersions, a
//! 20 MiB line (skipped, and the stream read on), deep nesting. Each is
//! refused with an error naming the request and what is wrong; the pods
//! that run are not touched; the watch recovers and the next valid pod
//! runs.

use std::fs;
use std::time::Instant;

use serde_json::json;

use crate::cluster::{api_pod, Cluster};

/// The start of the log lines that name the pods watch.
const WATCH_PATH: &str = "GET /api/v1/pods?fieldSelector=spec.nodeName%3Dedge-1";

/// A pod object as a watch event carries it, with `metadata` replaced.
fn pod_object(metadata: serde_json::Value) -> serde_json::Value {
    json!({
        "kind": "Pod",
        "apiVersion": "v1",
        "metadata": metadata,
        "spec": {
            "nodeName": "edge-1",
            "containers": [{"name": "app", "image": "busybox:latest", "command": ["sleep", "1000"]}],
        },
        "status": {},
    })
}

fn line(kind: &str, object: serde_json::Value) -> Vec<u8> {
    format!("{}\n", json!({"type": kind, "object": object})).into_bytes()
}

/// Every malformed kind: its name, the bytes, and the text the error must
/// carry (on a line that also names the watch request).
fn malformed() -> Vec<(&'static str, Vec<u8>, &'static str)> {
    let meta = |name: &str| json!({"name": name, "namespace": "default", "uid": format!("uid-{name}"), "resourceVersion": "999999"});
    let without = |name: &str, field: &str| {
        let mut m = meta(name);
        m.as_object_mut().unwrap().remove(field);
        pod_object(m)
    };
    let mut wrong_types = pod_object(meta("wrong-types"));
    wrong_types["spec"]["containers"] = json!("nope");
    let mut other_node = pod_object(meta("elsewhere"));
    other_node["spec"]["nodeName"] = json!("edge-2");
    let mut bad_rv = pod_object(meta("bad-rv"));
    bad_rv["metadata"]["resourceVersion"] = json!("12abc");
    let mut no_metadata = pod_object(meta("x"));
    no_metadata.as_object_mut().unwrap().remove("metadata");
    let node = json!({"kind": "Node", "apiVersion": "v1", "metadata": meta("a-node"), "spec": {}});
    let huge = format!(
        "{{\"type\":\"ADDED\",\"object\":{{\"kind\":\"Pod\",\"metadata\":{{\"name\":\"{}\"}}}}}}\n",
        "h".repeat(20 * 1024 * 1024)
    );
    let depth = 100_000;
    let deep = format!(
        "{{\"type\":\"ADDED\",\"object\":{{\"kind\":\"Pod\",\"spec\":{}{}}}}}\n",
        "[".repeat(depth),
        "]".repeat(depth)
    );
    vec![
        ("not JSON", b"this is not JSON\n".to_vec(), "cannot decode the answer: invalid watch event: expected"),
        (
            "truncated JSON",
            b"{\"type\":\"ADDED\",\"object\":{\"kind\":\"Pod\",\"metadata\":{\"name\":\"tr\n".to_vec(),
            "invalid watch event: EOF while parsing",
        ),
        ("unknown type", line("SURPRISE", pod_object(meta("s"))), "unknown watch event type \"SURPRISE\""),
        ("missing type", b"{\"object\":{}}\n".to_vec(), "a watch event without a type"),
        ("missing object", b"{\"type\":\"ADDED\"}\n".to_vec(), "a watch event of type \"ADDED\" without an object"),
        ("object of another kind", line("ADDED", node), "skipping \"default/a-node\": kind: \"Node\" where a Pod was expected"),
        ("pod without metadata", line("ADDED", no_metadata), "metadata is missing or not an object"),
        ("pod without name", line("ADDED", without("x", "name")), "metadata.name is missing"),
        ("pod without uid", line("ADDED", without("no-uid", "uid")), "skipping \"default/no-uid\": metadata.uid is missing"),
        (
            "pod without resourceVersion",
            line("MODIFIED", without("no-rv", "resourceVersion")),
            "skipping \"default/no-rv\": metadata.resourceVersion is missing",
        ),
        (
            "wrong types (spec.containers a string)",
            line("ADDED", wrong_types),
            "cannot decode it as a Pod: spec.containers: invalid type: string \"nope\", expected a sequence",
        ),
        (
            "ERROR with a non-Status object",
            line("ERROR", pod_object(meta("err"))),
            "an ERROR watch event whose object is not a Status (kind \"Pod\")",
        ),
        (
            "BOOKMARK without resourceVersion",
            line("BOOKMARK", json!({"kind": "Pod", "apiVersion": "v1", "metadata": {}})),
            "a BOOKMARK without metadata.resourceVersion",
        ),
        (
            "BOOKMARK with a non-numeric resourceVersion",
            line("BOOKMARK", json!({"kind": "Pod", "apiVersion": "v1", "metadata": {"resourceVersion": "soon"}})),
            "skipping a BOOKMARK: metadata.resourceVersion: \"soon\" is not a number",
        ),
        (
            "non-numeric resourceVersion",
            line("ADDED", bad_rv),
            "skipping \"default/bad-rv\": metadata.resourceVersion: \"12abc\" is not a number",
        ),
        (
            "a 20 MiB line",
            huge.into_bytes(),
            "bytes, over the 16777216-byte limit of one object",
        ),
        ("deeply nested JSON", deep.into_bytes(), "recursion limit exceeded"),
        (
            "a pod for another node",
            line("ADDED", other_node),
            "skipping \"default/elsewhere\": spec.nodeName: \"edge-2\" is outside the field selector spec.nodeName=edge-1",
        ),
    ]
}

/// The log line, written after `from`, that names the watch and holds `needle`.
fn logged_after(log: &str, from: usize, needle: &str) -> Option<String> {
    log.get(from..)?
        .lines()
        .find(|l| l.contains(WATCH_PATH) && l.contains(needle))
        .map(str::to_string)
}

#[test]
fn malformed_watch_events_are_refused_and_the_watch_recovers() {
    let mut c = Cluster::start(&[]);
    c.api.create_pod(api_pod("a"));
    c.api.create_pod(api_pod("b"));
    c.wait_running("a");
    c.wait_running("b");
    let sandboxes_before: Vec<String> = {
        let mut ids: Vec<String> = c.cri.sandboxes().iter().map(|s| s.id.clone()).collect();
        ids.sort();
        ids
    };
    let log_path = c.agent.log_path();
    let mut covered = Vec::new();
    for (i, (kind, bytes, needle)) in malformed().into_iter().enumerate() {
        let api = &c.api;
        c.agent
            .wait(&format!("a pods watch is open before {kind}"), || {
                api.open_watches("pods") > 0
            });
        let from = fs::read_to_string(&log_path).unwrap_or_default().len();
        let runs_before = c.cri.count("RunPodSandbox");
        let creates_before = c.cri.count("CreateContainer");
        let injected_at = Instant::now();
        // A watch the agent left may still count until the fake writes to
        // it; the agent's current one gets the bytes too.
        assert!(
            c.api.inject_watch("pods", &bytes) >= 1,
            "{kind}: no open pods watch"
        );
        drop(bytes);
        let mut found = None;
        c.agent.wait(
            &format!("{kind}: an error naming the watch and {needle:?}"),
            || {
                found = logged_after(
                    &fs::read_to_string(&log_path).unwrap_or_default(),
                    from,
                    needle,
                );
                found.is_some()
            },
        );
        let line = found.unwrap_or_default();
        assert!(
            line.contains(" ERROR "),
            "{kind}: not logged as an error: {line}"
        );
        // Later valid events are applied: a new pod runs.
        let valid = format!("valid-{i}");
        c.api.create_pod(api_pod(&valid));
        c.wait_running(&valid);
        let recovered = injected_at.elapsed();
        // Exactly that pod started: nothing was restarted or doubled.
        assert_eq!(
            c.cri.count("RunPodSandbox"),
            runs_before + 1,
            "{kind}: {:?}",
            c.cri.calls()
        );
        assert_eq!(
            c.cri.count("CreateContainer"),
            creates_before + 1,
            "{kind}: {:?}",
            c.cri.calls()
        );
        covered.push(format!("{kind} ({:.1}s)", recovered.as_secs_f64()));
        eprintln!(
            "hostile watch: {kind}: refused, next pod ran {:.1}s after the injection: {line}",
            recovered.as_secs_f64()
        );
    }
    // The pods from before run on in their first sandboxes, and nothing of
    // the refused objects ever ran.
    let first: Vec<String> = c
        .cri
        .sandboxes()
        .iter()
        .filter(|s| {
            s.metadata
                .as_ref()
                .is_some_and(|m| m.name == "a" || m.name == "b")
        })
        .map(|s| s.id.clone())
        .collect();
    let mut first = first;
    first.sort();
    assert_eq!(first, sandboxes_before);
    assert_eq!(crate::support::agent::running_containers(&c.cri, "a"), 1);
    assert_eq!(crate::support::agent::running_containers(&c.cri, "b"), 1);
    for name in [
        "elsewhere",
        "bad-rv",
        "no-uid",
        "no-rv",
        "wrong-types",
        "a-node",
        "s",
        "err",
    ] {
        assert!(
            !c.cri
                .sandboxes()
                .iter()
                .any(|s| s.metadata.as_ref().is_some_and(|m| m.name == name)),
            "the refused pod {name} got a sandbox"
        );
    }
    assert!(c.agent.running(), "tinylet exited:\n{}", c.agent.log());
    let log = c.agent.log();
    assert!(!log.contains("panicked"), "{log}");
    eprintln!("hostile watch kinds covered: {}", covered.join("; "));
}
