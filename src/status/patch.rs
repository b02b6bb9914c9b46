//! The strategic-merge patch the 1.20 kubelet sends for
//! `pods/<name>/status`: the diff between the status the apiserver holds
//! and a newly generated one, over the fields the kubelet owns, in the
//! shape the Go client marshals (upstream's status manager and
//! `CreateTwoWayMergePatch`). Pure, like the generation in `generate`.

use k8s_openapi::api::core::v1::PodStatus as ApiPodStatus;
use serde_json::{json, Map, Value};

/// The status fields the kubelet writes; a patch leaves the others alone.
const OWNED_FIELDS: [&str; 12] = [
    "conditions",
    "containerStatuses",
    "ephemeralContainerStatuses",
    "hostIP",
    "initContainerStatuses",
    "message",
    "phase",
    "podIP",
    "podIPs",
    "qosClass",
    "reason",
    "startTime",
];

/// The strategic-merge-patch body for `pods/<name>/status` that takes the
/// apiserver from `old` to `new`, as the 1.20 kubelet computes it: the uid
/// (so a recreated pod of the same name refuses it), each changed field;
/// container status lists whole (they have no merge key); conditions merged
/// by `type` and podIPs by `ip`, each changed element with only its changed
/// fields, and `$setElementOrder/<list>` giving the new order.
/// `$setElementOrder/conditions` is sent whenever conditions are, as in the
/// recorded kubelet-shaped patch; for podIPs it is sent only when the old
/// status had some.
pub(crate) fn status_patch(uid: &str, old: Option<&ApiPodStatus>, new: &ApiPodStatus) -> Value {
    json!({"metadata": {"uid": uid}, "status": status_diff(old, new)})
}

/// Whether `new` would change nothing the kubelet owns in `old`: the
/// reporter then skips the patch.
pub(crate) fn status_equal(old: &ApiPodStatus, new: &ApiPodStatus) -> bool {
    status_diff(Some(old), new).is_empty()
}

fn status_diff(old: Option<&ApiPodStatus>, new: &ApiPodStatus) -> Map<String, Value> {
    let o = old.map(go_shape).unwrap_or_default();
    let n = go_shape(new);
    let mut patch = Map::new();
    for key in OWNED_FIELDS {
        let (ov, nv) = (o.get(key), n.get(key));
        match key {
            "conditions" => list_diff(&mut patch, key, "type", ov, nv, true),
            "podIPs" => list_diff(&mut patch, key, "ip", ov, nv, false),
            _ if ov != nv => {
                patch.insert(key.into(), nv.cloned().unwrap_or(Value::Null));
            }
            _ => {}
        }
    }
    patch
}

/// A status as the Go client marshals it: empty strings and lists left
/// out, unset times inside conditions and container states as `null`, and
/// a container's `state` and `lastState` always present.
fn go_shape(s: &ApiPodStatus) -> Map<String, Value> {
    // Serializing these types cannot fail: times format with a fixed pattern.
    let Ok(Value::Object(mut m)) = serde_json::to_value(s) else {
        return Map::new();
    };
    m.retain(|_, v| {
        !matches!(v, Value::String(s) if s.is_empty())
            && !matches!(v, Value::Array(a) if a.is_empty())
    });
    if let Some(Value::Array(cs)) = m.get_mut("conditions") {
        for c in cs.iter_mut().filter_map(Value::as_object_mut) {
            for k in ["lastProbeTime", "lastTransitionTime"] {
                c.entry(k).or_insert(Value::Null);
            }
        }
    }
    for list in [
        "containerStatuses",
        "initContainerStatuses",
        "ephemeralContainerStatuses",
    ] {
        let Some(Value::Array(cs)) = m.get_mut(list) else {
            continue;
        };
        for c in cs.iter_mut().filter_map(Value::as_object_mut) {
            for k in ["state", "lastState"] {
                let st = c.entry(k).or_insert_with(|| json!({}));
                if let Some(Value::Object(r)) = st.get_mut("running") {
                    r.entry("startedAt").or_insert(Value::Null);
                }
                if let Some(Value::Object(t)) = st.get_mut("terminated") {
                    t.entry("startedAt").or_insert(Value::Null);
                    t.entry("finishedAt").or_insert(Value::Null);
                }
            }
        }
    }
    m
}

/// Adds to `patch` the strategic-merge diff of a list merged by `key`.
fn list_diff(
    patch: &mut Map<String, Value>,
    name: &str,
    key: &str,
    old: Option<&Value>,
    new: Option<&Value>,
    always_order: bool,
) {
    let list = |v: Option<&Value>| {
        v.and_then(Value::as_array)
            .filter(|a| !a.is_empty())
            .cloned()
    };
    let keys = |l: &[Value]| -> Vec<Value> {
        l.iter()
            .map(|e| json!({ key: e.get(key).cloned().unwrap_or(Value::Null) }))
            .collect()
    };
    let order_name = format!("$setElementOrder/{name}");
    match (list(old), list(new)) {
        (None, None) => {}
        (Some(_), None) => {
            patch.insert(name.into(), Value::Null);
        }
        (None, Some(n)) => {
            if always_order {
                patch.insert(order_name, Value::Array(keys(&n)));
            }
            patch.insert(name.into(), Value::Array(n));
        }
        (Some(o), Some(n)) => {
            let mut items = Vec::new();
            for e in &n {
                let k = e.get(key);
                match o.iter().find(|p| p.get(key) == k) {
                    None => items.push(e.clone()),
                    Some(prev) => {
                        let mut d = element_diff(prev, e);
                        if !d.is_empty() {
                            d.insert(key.into(), k.cloned().unwrap_or(Value::Null));
                            items.push(Value::Object(d));
                        }
                    }
                }
            }
            for p in &o {
                if !n.iter().any(|e| e.get(key) == p.get(key)) {
                    items.push(json!({"$patch": "delete", key: p.get(key)}));
                }
            }
            if !items.is_empty() || keys(&o) != keys(&n) {
                patch.insert(order_name, Value::Array(keys(&n)));
            }
            if !items.is_empty() {
                patch.insert(name.into(), Value::Array(items));
            }
        }
    }
}

/// The changed fields of one list element (conditions and pod IPs hold
/// only scalars), with `null` for a field that went away.
fn element_diff(old: &Value, new: &Value) -> Map<String, Value> {
    let empty = Map::new();
    let o = old.as_object().unwrap_or(&empty);
    let n = new.as_object().unwrap_or(&empty);
    let mut d = Map::new();
    for (k, v) in n {
        if o.get(k) != Some(v) {
            d.insert(k.clone(), v.clone());
        }
    }
    for k in o.keys() {
        if !n.contains_key(k) {
            d.insert(k.clone(), Value::Null);
        }
    }
    d
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;
    use std::path::{Path, PathBuf};

    use k8s_openapi::api::core::v1::{Pod, PodCondition};

    use crate::runtime::ContainerState;
    use crate::status::generate::tests::{
        exited, gen, gen_with, ns, pod, rec, rt, sandbox, time, ts, APP_ID, IMAGE_ID, NOW, T0,
    };
    use crate::status::generate::{condition, generate_pod_status, StatusContext};

    fn fixtures_dir() -> PathBuf {
        let local = Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/fixtures/apiserver");
        if local.is_dir() {
            local
        } else {
            PathBuf::from("/work/shared/fixtures/apiserver")
        }
    }

    /// The body of a recorded request or response: after the blank CRLF line.
    fn fixture_body(name: &str) -> String {
        let path = fixtures_dir().join(name);
        let text =
            std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let at = text.find("\r\n\r\n").expect("blank line after the headers");
        text[at + 4..].trim_end().to_string()
    }

    fn fixture_pod(name: &str) -> Pod {
        serde_json::from_str(&fixture_body(name)).unwrap()
    }

    #[test]
    fn patch_matches_recorded_running_patch_07a() {
        // app-2 as created (status: Pending, BestEffort), now running.
        let p = fixture_pod("04f-admin-pod-create-app-2.response.txt");
        let mut r = rec(
            "sleeper",
            APP_ID,
            ContainerState::Running,
            ns("2026-11-22T00:48:18Z"),
        );
        r.started_at = ns("2026-11-22T00:48:19Z") + 123_456_789;
        r.image_ref = IMAGE_ID.into();
        let runtime = rt(vec![r]);
        let s = gen_with(&p, &runtime, None, &[]);
        let uid = p.metadata.uid.as_deref().unwrap();
        let patch = status_patch(uid, p.status.as_ref(), &s);
        let want = fixture_body("07a-pod-status-patch-smp-running.request.txt");
        let want_value: Value = serde_json::from_str(&want).unwrap();
        assert_eq!(patch, want_value);
        // Byte for byte, key order included.
        assert_eq!(serde_json::to_string(&patch).unwrap(), want);
    }

    #[test]
    fn patch_matches_recorded_terminated_patch_08b() {
        // app-3 after the graceful delete; its status is the running one.
        let p = fixture_pod("08a-admin-pod-delete-grace30-app-3.response.txt");
        let mut r = exited(
            "sleeper",
            "f35c8f0a7a8e5000ed6893b01bde5c368101793381d8199a6213f683e4dde81e",
            137,
            ns("2026-11-22T00:48:18Z"),
        );
        r.started_at = ns("2026-11-22T00:48:19Z");
        r.finished_at = ns("2026-11-22T00:48:31Z") + 5;
        r.reason = "Error".into();
        r.image_ref = IMAGE_ID.into();
        let mut runtime = rt(vec![r]);
        runtime.ips = vec!["10.88.0.7".into()];
        let reasons = BTreeMap::new();
        let ctx = StatusContext {
            host_ip: Some("10.0.2.15"),
            runtime_name: "containerd",
            waiting_reasons: &reasons,
            now: ts("2026-11-22T00:48:31Z"),
            probes: None,
        };
        let s = generate_pod_status(&p, &runtime, p.status.as_ref(), &ctx);
        let uid = p.metadata.uid.as_deref().unwrap();
        let patch = status_patch(uid, p.status.as_ref(), &s);
        let want = fixture_body("08b-pod-status-patch-smp-terminated.request.txt");
        assert_eq!(patch, serde_json::from_str::<Value>(&want).unwrap());
        assert_eq!(serde_json::to_string(&patch).unwrap(), want);
    }

    #[test]
    fn unchanged_status_needs_no_patch() {
        let p = pod("Always", &[], &["app"]);
        let running = rt(vec![rec("app", "a1", ContainerState::Running, 1)]);
        let first = gen(&p, &running);
        // As the apiserver hands it back (its own JSON round trip).
        let stored: ApiPodStatus =
            serde_json::from_value(serde_json::to_value(&first).unwrap()).unwrap();
        let again = gen_with(&p, &running, Some(&stored), &[]);
        assert!(status_equal(&stored, &again));
        assert_eq!(
            status_patch("u1", Some(&stored), &again),
            json!({"metadata": {"uid": "u1"}, "status": {}})
        );
        // A field the kubelet does not own is left alone.
        let mut foreign = stored.clone();
        foreign.nominated_node_name = Some("other".into());
        assert!(status_equal(&foreign, &again));

        let crashed = rt(vec![exited("app", "a1", 1, 1)]);
        let changed = gen_with(&p, &crashed, Some(&stored), &[]);
        assert!(!status_equal(&stored, &changed));
    }

    #[test]
    fn patch_lists_and_removed_fields() {
        let p = pod("Always", &[], &["app"]);
        let mut runtime = rt(vec![rec("app", "a1", ContainerState::Running, 1)]);
        let mut old = gen(&p, &runtime);
        old.conditions.as_mut().unwrap().push(PodCondition {
            last_transition_time: time(T0),
            ..condition("ContainersReady", true, None, None)
        });
        // A condition type the old status had and the new does not.
        if let Some(cs) = old.conditions.as_mut() {
            cs.retain(|c| c.type_ != "ContainersReady");
            cs.insert(0, condition("Stale", true, None, None));
        }
        runtime.ips = vec!["10.88.0.9".into()];
        runtime.sandbox_statuses = vec![sandbox(true)];
        let mut new = gen_with(&p, &runtime, Some(&old), &[]);
        new.conditions
            .as_mut()
            .unwrap()
            .retain(|c| c.type_ != "Stale");
        let patch = status_patch("u1", Some(&old), &new);
        let status = &patch["status"];
        assert_eq!(
            status["$setElementOrder/conditions"],
            json!([{"type": "Initialized"}, {"type": "Ready"}, {"type": "ContainersReady"}, {"type": "PodScheduled"}])
        );
        assert_eq!(
            status["conditions"],
            json!([
                {"lastProbeTime": null, "lastTransitionTime": NOW, "status": "True", "type": "ContainersReady"},
                {"$patch": "delete", "type": "Stale"}
            ])
        );
        assert_eq!(status["podIP"], json!("10.88.0.9"));
        assert_eq!(
            status["$setElementOrder/podIPs"],
            json!([{"ip": "10.88.0.9"}])
        );
        assert_eq!(
            status["podIPs"],
            json!([{"ip": "10.88.0.9"}, {"$patch": "delete", "ip": "10.88.0.6"}])
        );
        assert!(status.get("containerStatuses").is_none(), "unchanged");

        // Ready turns False then True again: reason and message are removed.
        let crashed = rt(vec![exited("app", "a1", 1, 1)]);
        let mut down = gen_with(&p, &crashed, Some(&new), &[]);
        for c in down.conditions.iter_mut().flatten() {
            c.last_transition_time = time(T0);
        }
        let up = gen_with(&p, &runtime, Some(&down), &[]);
        let patch = status_patch("u1", Some(&down), &up);
        let ready = patch["status"]["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["type"] == "Ready")
            .unwrap()
            .clone();
        assert_eq!(
            ready,
            json!({"lastTransitionTime": NOW, "message": null, "reason": null, "status": "True", "type": "Ready"})
        );
        assert_eq!(
            patch["status"]["containerStatuses"][0]["state"]["running"]["startedAt"],
            json!("1970-01-01T00:00:01Z")
        );

        // The sandbox went away: the pod IPs are removed.
        let mut gone = runtime.clone();
        gone.sandbox_statuses = vec![sandbox(false)];
        let s = gen_with(&p, &gone, Some(&up), &[]);
        let patch = status_patch("u1", Some(&up), &s);
        assert_eq!(patch["status"]["podIP"], Value::Null);
        assert!(patch["status"].as_object().unwrap().contains_key("podIP"));
        assert_eq!(patch["status"]["podIPs"], Value::Null);
        assert!(patch["status"].as_object().unwrap().contains_key("podIPs"));
    }
}
