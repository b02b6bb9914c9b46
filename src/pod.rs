//! What every layer needs to know about a pod, and nothing else (upstream
//! `pkg/kubelet/types` and the pod helpers of `pkg/apis/core`): its
//! identity (name, namespace, UID, full name), the config-source
//! annotations and source names, whether it is static, mirror or critical,
//! and its QoS class.
//!
//! This is the ground floor: it imports nothing of tinylet's but
//! `quantity`, so the sync loop, the runtime, volumes and status can all
//! read pod facts without importing each other.

use k8s_openapi::api::core::v1::Pod;

/// Pods read from the static manifest path.
pub const FILE_SOURCE: &str = "file";
/// Pods polled from a manifest URL.
pub const HTTP_SOURCE: &str = "http";
/// Pods bound to this node in the API server.
pub(crate) const API_SOURCE: &str = "api";

/// Which source a pod came from (`file`, `http`, `api`); set at merge time.
pub const CONFIG_SOURCE_ANNOTATION_KEY: &str = "kubernetes.io/config.source";
/// Set on the mirror pod that the API server holds for a static pod.
pub(crate) const CONFIG_MIRROR_ANNOTATION_KEY: &str = "kubernetes.io/config.mirror";
/// When the merge first saw the pod (RFC 3339 with nanoseconds).
pub(crate) const CONFIG_FIRST_SEEN_ANNOTATION_KEY: &str = "kubernetes.io/config.seen";
/// The static pod's generated UID (a hash of its source and content).
pub const CONFIG_HASH_ANNOTATION_KEY: &str = "kubernetes.io/config.hash";

/// The priority from which a pod is critical (upstream's
/// `SystemCriticalPriority`, the value of `system-cluster-critical`).
pub(crate) const SYSTEM_CRITICAL_PRIORITY: i32 = 2_000_000_000;

/// The pod's name, or "" when it has none.
pub(crate) fn pod_name(pod: &Pod) -> &str {
    pod.metadata.name.as_deref().unwrap_or("")
}

/// The pod's namespace; a pod without one is in `default`, as the API's
/// defaulting and the static-pod defaults put it.
pub(crate) fn pod_namespace(pod: &Pod) -> &str {
    pod.metadata.namespace.as_deref().unwrap_or("default")
}

/// The pod's UID, or "" when it has none.
pub(crate) fn pod_uid(pod: &Pod) -> &str {
    pod.metadata.uid.as_deref().unwrap_or("")
}

/// `namespace/name`: the key under which a pod is unique on the node, and
/// how logs, errors and events name it.
pub(crate) fn pod_full_name(pod: &Pod) -> String {
    format!("{}/{}", pod_namespace(pod), pod_name(pod))
}

/// The pod phases (`status.phase`).
pub(crate) const PENDING: &str = "Pending";
pub(crate) const RUNNING: &str = "Running";
pub(crate) const SUCCEEDED: &str = "Succeeded";
pub(crate) const FAILED: &str = "Failed";

/// The source the merge recorded on the pod (`file`, `http`, `api`).
pub(crate) fn config_source(pod: &Pod) -> Option<&str> {
    pod.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(CONFIG_SOURCE_ANNOTATION_KEY))
        .map(String::as_str)
}

/// A static pod: from a source other than the API server.
pub(crate) fn is_static_pod(pod: &Pod) -> bool {
    config_source(pod).is_some_and(|s| s != API_SOURCE)
}

/// True for the API server's copy of a static pod.
pub(crate) fn is_mirror_pod(pod: &Pod) -> bool {
    pod.metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(CONFIG_MIRROR_ANNOTATION_KEY))
}

/// A static or mirror pod, or one at a system-critical priority: never
/// evicted, never refused for pressure (upstream `IsCriticalPod`).
pub(crate) fn is_critical(pod: &Pod) -> bool {
    is_static_pod(pod)
        || is_mirror_pod(pod)
        || pod
            .spec
            .as_ref()
            .and_then(|s| s.priority)
            .is_some_and(|p| p >= SYSTEM_CRITICAL_PRIORITY)
}

/// The pod's QoS class (upstream `GetPodQOS`): only cpu and memory count,
/// init containers count like the others, and an unset request takes the
/// limit, as API defaulting does. A quantity that does not parse is
/// ignored (the apiserver would have refused it).
pub(crate) fn qos_class(pod: &Pod) -> &'static str {
    use std::collections::BTreeMap;
    let Some(spec) = pod.spec.as_ref() else {
        return "BestEffort";
    };
    let mut requests: BTreeMap<&str, u128> = BTreeMap::new();
    let mut limits: BTreeMap<&str, u128> = BTreeMap::new();
    let mut guaranteed = true;
    let inits = spec.init_containers.as_deref().unwrap_or(&[]);
    for c in spec.containers.iter().chain(inits) {
        let res = c.resources.as_ref();
        let lim = res.and_then(|r| r.limits.as_ref());
        let req = res.and_then(|r| r.requests.as_ref());
        for name in ["cpu", "memory"] {
            let limit = lim.and_then(|m| m.get(name));
            let request = req.and_then(|m| m.get(name)).or(limit);
            // In billionths, exactly; zero and negative quantities do not count.
            let positive = |q: Option<&k8s_openapi::apimachinery::pkg::api::resource::Quantity>| {
                q.and_then(|q| crate::quantity::parse_quantity_wide(&q.0, 9))
                    .filter(|v| *v > 0)
            };
            if let Some(v) = positive(request) {
                let sum = requests.entry(name).or_default();
                *sum = sum.saturating_add(v);
            }
            match positive(limit) {
                Some(v) => {
                    let sum = limits.entry(name).or_default();
                    *sum = sum.saturating_add(v);
                }
                None => guaranteed = false,
            }
        }
    }
    if requests.is_empty() && limits.is_empty() {
        "BestEffort"
    } else if guaranteed && requests == limits {
        "Guaranteed"
    } else {
        "Burstable"
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    fn qos_pod(containers: Value, inits: Value) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "q"},
            "spec": {"containers": containers, "initContainers": inits}
        }))
        .unwrap()
    }

    fn res(requests: Value, limits: Value) -> Value {
        json!({"name": "c", "resources": {"requests": requests, "limits": limits}})
    }

    #[test]
    fn qos_classes() {
        let none = json!({"name": "c"});
        let both = json!({"cpu": "1", "memory": "1Gi"});
        let cases = [
            ("no resources", json!([none]), json!([]), "BestEffort"),
            (
                "zero quantities",
                json!([res(json!({"cpu": "0"}), json!({"memory": "0"}))]),
                json!([]),
                "BestEffort",
            ),
            (
                "other resources only",
                json!([res(
                    json!({"ephemeral-storage": "1Gi"}),
                    json!({"ephemeral-storage": "1Gi"})
                )]),
                json!([]),
                "BestEffort",
            ),
            (
                "requests only",
                json!([res(json!({"cpu": "100m"}), json!({}))]),
                json!([]),
                "Burstable",
            ),
            (
                "limits only: requests default to them",
                json!([res(json!({}), both.clone())]),
                json!([]),
                "Guaranteed",
            ),
            (
                "equal in other units",
                json!([res(
                    json!({"cpu": "1000m", "memory": "1073741824"}),
                    both.clone()
                )]),
                json!([]),
                "Guaranteed",
            ),
            (
                "request below limit",
                json!([res(json!({"cpu": "500m", "memory": "1Gi"}), both.clone())]),
                json!([]),
                "Burstable",
            ),
            (
                "cpu limit only",
                json!([res(json!({}), json!({"cpu": "1"}))]),
                json!([]),
                "Burstable",
            ),
            (
                "one container without limits",
                json!([res(json!({}), both.clone()), none.clone()]),
                json!([]),
                "Burstable",
            ),
            (
                "two guaranteed containers",
                json!([
                    res(json!({}), both.clone()),
                    res(both.clone(), json!({"cpu": "1", "memory": "1Gi"}))
                ]),
                json!([]),
                "Guaranteed",
            ),
            (
                "init container without limits",
                json!([res(json!({}), both.clone())]),
                json!([none.clone()]),
                "Burstable",
            ),
            (
                "guaranteed init container",
                json!([res(json!({}), both.clone())]),
                json!([res(json!({}), json!({"cpu": "200m", "memory": "64Mi"}))]),
                "Guaranteed",
            ),
            (
                "only an init container asks",
                json!([none.clone()]),
                json!([res(json!({"memory": "64Mi"}), json!({}))]),
                "Burstable",
            ),
        ];
        for (what, containers, inits, want) in cases {
            assert_eq!(qos_class(&qos_pod(containers, inits)), want, "{what}");
        }
    }

    #[test]
    fn huge_quantities_saturate_instead_of_overflowing() {
        let big = "9".repeat(60);
        let pod = qos_pod(
            json!([
                res(json!({}), json!({"cpu": big, "memory": big})),
                res(json!({}), json!({"cpu": big, "memory": big}))
            ]),
            json!([]),
        );
        assert_eq!(qos_class(&pod), "Guaranteed");
    }

    #[test]
    fn identity_and_source() {
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": "web", "uid": "u1",
                "annotations": {"kubernetes.io/config.source": "file"}}
        }))
        .unwrap();
        assert_eq!(pod_full_name(&pod), "default/web");
        assert_eq!(pod_uid(&pod), "u1");
        assert_eq!(config_source(&pod), Some("file"));
        assert!(is_static_pod(&pod));
        assert!(!is_mirror_pod(&pod));
        assert!(is_critical(&pod));
        let mut api = pod.clone();
        api.metadata.annotations = Some(
            [(
                CONFIG_SOURCE_ANNOTATION_KEY.to_string(),
                API_SOURCE.to_string(),
            )]
            .into(),
        );
        assert!(!is_static_pod(&api) && !is_critical(&api));
        api.spec = Some(Default::default());
        api.spec.as_mut().unwrap().priority = Some(SYSTEM_CRITICAL_PRIORITY);
        assert!(is_critical(&api));
        let mut mirror = api.clone();
        mirror.metadata.annotations =
            Some([(CONFIG_MIRROR_ANNOTATION_KEY.to_string(), "h".to_string())].into());
        assert!(is_mirror_pod(&mirror) && !is_static_pod(&mirror));
    }
}
