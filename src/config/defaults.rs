//! Static-pod defaults: what a pod read from a manifest file or URL gets
//! before it joins the merge (upstream `applyDefaults` in config/common.go).
//!
//! The identity is deterministic: the UID is an MD5 digest of the node name,
//! the source (file path or URL) and the pod as read, so the same manifest
//! gives the same UID across restarts and any change to it gives a new pod.

use md5::{Digest, Md5};

use k8s_openapi::api::core::v1::{PodStatus, Toleration};

use super::validation::{validate_pod, InvalidPod};
use super::Pod;
use crate::pod::{CONFIG_HASH_ANNOTATION_KEY, CONFIG_SOURCE_ANNOTATION_KEY, FILE_SOURCE};

/// The namespace of a static pod that names none.
pub(crate) const DEFAULT_NAMESPACE: &str = "default";

/// `NAME-NODENAME`, unique among nodes (the node name lower-cased).
pub fn generate_pod_name(name: &str, node_name: &str) -> String {
    format!("{}-{}", name, node_name.to_lowercase())
}

/// The UID a static pod gets when its manifest sets none: hex MD5 over
/// `host:NODE`, then `file:PATH` for files or `url:URL` for URLs, then the
/// pod's JSON encoding as read. (Upstream leaves the node out for URLs, so
/// two nodes polling one URL get pods with the same UID; here they don't.)
pub fn static_pod_uid(
    pod: &Pod,
    source_ref: &str,
    node_name: &str,
    source: &str,
) -> Result<String, InvalidPod> {
    let content = serde_json::to_vec(pod)
        .map_err(|e| InvalidPod::single("", format!("cannot encode pod for hashing: {e}")))?;
    let mut hasher = Md5::new();
    hasher.update(format!("host:{node_name}").as_bytes());
    if source == FILE_SOURCE {
        hasher.update(format!("file:{source_ref}").as_bytes());
    } else {
        hasher.update(format!("url:{source_ref}").as_bytes());
    }
    hasher.update(&content);
    let digest = hasher.finalize();
    Ok(digest.iter().map(|b| format!("{b:02x}")).collect())
}

/// Applies the static-pod defaults and validates the result.
///
/// `source_ref` is the manifest's file path or URL, `source` is
/// [`FILE_SOURCE`] or [`super::HTTP_SOURCE`]. The first-seen annotation is
/// not set here: the merge sets it when it first sees the pod.
pub fn apply_static_defaults(
    pod: &mut Pod,
    source_ref: &str,
    node_name: &str,
    source: &str,
) -> Result<(), InvalidPod> {
    let name = match pod.metadata.name.as_deref() {
        Some(n) if !n.is_empty() => n.to_string(),
        _ => return Err(InvalidPod::single("metadata.name", "Required value")),
    };

    let uid = match pod.metadata.uid.as_deref() {
        Some(uid) if !uid.is_empty() => uid.to_string(),
        _ => {
            let uid = static_pod_uid(pod, source_ref, node_name, source)?;
            log::debug!("generated UID {uid} for pod {name:?} from {source_ref}");
            pod.metadata.uid = Some(uid.clone());
            uid
        }
    };

    let full_name = generate_pod_name(&name, node_name);
    let namespace = match pod.metadata.namespace.as_deref() {
        Some(ns) if !ns.is_empty() => ns.to_string(),
        _ => DEFAULT_NAMESPACE.to_string(),
    };
    pod.metadata.self_link = Some(format!("/api/v1/namespaces/{namespace}/pods/{full_name}"));
    pod.metadata.name = Some(full_name);
    pod.metadata.namespace = Some(namespace);

    let spec = pod.spec.get_or_insert_with(Default::default);
    spec.node_name = Some(node_name.to_string());
    if source == FILE_SOURCE {
        // Static pods are not evicted for node problems: tolerate every
        // NoExecute taint, unless the manifest already does.
        let tolerations = spec.tolerations.get_or_insert_with(Vec::new);
        let wanted = Toleration {
            operator: Some("Exists".to_string()),
            effect: Some("NoExecute".to_string()),
            ..Default::default()
        };
        let present = tolerations.iter().any(|t| {
            t.key.as_deref().unwrap_or("").is_empty()
                && t.operator.as_deref() == Some("Exists")
                && t.effect.as_deref() == Some("NoExecute")
        });
        if !present {
            tolerations.push(wanted);
        }
    }

    let annotations = pod
        .metadata
        .annotations
        .get_or_insert_with(Default::default);
    annotations.insert(CONFIG_HASH_ANNOTATION_KEY.to_string(), uid);
    annotations.insert(CONFIG_SOURCE_ANNOTATION_KEY.to_string(), source.to_string());

    pod.status.get_or_insert_with(PodStatus::default).phase = Some("Pending".to_string());

    validate_pod(pod)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::decode_pod;
    use crate::pod::HTTP_SOURCE;

    const MANIFEST: &str = "apiVersion: v1
kind: Pod
metadata:
  name: web
  annotations: {team: edge}
spec:
  containers:
  - name: nginx
    image: nginx:1.25
";

    fn defaulted(yaml: &str, path: &str, node: &str, source: &str) -> Pod {
        let mut pod = decode_pod(yaml.as_bytes()).unwrap();
        apply_static_defaults(&mut pod, path, node, source).unwrap();
        pod
    }

    fn uid(pod: &Pod) -> String {
        pod.metadata.uid.clone().unwrap()
    }

    #[test]
    fn uid_is_stable_and_depends_on_content_node_and_path() {
        let base = defaulted(MANIFEST, "/etc/m/web.yaml", "node1", FILE_SOURCE);
        let again = defaulted(MANIFEST, "/etc/m/web.yaml", "node1", FILE_SOURCE);
        assert_eq!(uid(&base), uid(&again));
        assert_eq!(uid(&base).len(), 32);
        assert!(uid(&base).bytes().all(|b| b.is_ascii_hexdigit()));

        // The same pod in JSON, with other whitespace and comments, is the same pod.
        let json = r#"{"apiVersion":"v1","kind":"Pod","metadata":{"name":"web",
            "annotations":{"team":"edge"}},"spec":{"containers":[{"name":"nginx","image":"nginx:1.25"}]}}"#;
        let from_json = defaulted(json, "/etc/m/web.yaml", "node1", FILE_SOURCE);
        assert_eq!(uid(&base), uid(&from_json));

        let changed = MANIFEST.replace("nginx:1.25", "nginx:1.26");
        let variants = [
            defaulted(&changed, "/etc/m/web.yaml", "node1", FILE_SOURCE),
            defaulted(MANIFEST, "/etc/m/web.yaml", "node2", FILE_SOURCE),
            defaulted(MANIFEST, "/etc/m/web2.yaml", "node1", FILE_SOURCE),
            defaulted(MANIFEST, "http://h/web.yaml", "node1", HTTP_SOURCE),
            defaulted(MANIFEST, "/etc/m/web.yaml", "node1", HTTP_SOURCE),
        ];
        for v in &variants {
            assert_ne!(uid(v), uid(&base));
        }
    }

    #[test]
    fn url_pods_differ_per_node_and_are_stable() {
        let a = defaulted(MANIFEST, "http://h/m", "node1", HTTP_SOURCE);
        let again = defaulted(MANIFEST, "http://h/m", "node1", HTTP_SOURCE);
        let other_node = defaulted(MANIFEST, "http://h/m", "node2", HTTP_SOURCE);
        assert_eq!(uid(&a), uid(&again));
        assert_ne!(uid(&a), uid(&other_node));
    }

    #[test]
    fn explicit_uid_is_kept() {
        let yaml = MANIFEST.replace("  name: web\n", "  name: web\n  uid: abc-123\n");
        let pod = defaulted(&yaml, "/m/web.yaml", "node1", FILE_SOURCE);
        assert_eq!(uid(&pod), "abc-123");
        let annotations = pod.metadata.annotations.unwrap();
        assert_eq!(annotations[CONFIG_HASH_ANNOTATION_KEY], "abc-123");
    }

    #[test]
    fn defaults_are_applied() {
        let pod = defaulted(MANIFEST, "/etc/m/web.yaml", "Node1", FILE_SOURCE);
        assert_eq!(pod.metadata.name.as_deref(), Some("web-node1"));
        assert_eq!(pod.metadata.namespace.as_deref(), Some("default"));
        assert_eq!(
            pod.metadata.self_link.as_deref(),
            Some("/api/v1/namespaces/default/pods/web-node1")
        );
        let spec = pod.spec.as_ref().unwrap();
        assert_eq!(spec.node_name.as_deref(), Some("Node1"));
        let tolerations = spec.tolerations.as_ref().unwrap();
        assert_eq!(tolerations.len(), 1);
        assert_eq!(tolerations[0].operator.as_deref(), Some("Exists"));
        assert_eq!(tolerations[0].effect.as_deref(), Some("NoExecute"));
        assert_eq!(tolerations[0].key, None);
        let annotations = pod.metadata.annotations.as_ref().unwrap();
        assert_eq!(annotations[CONFIG_HASH_ANNOTATION_KEY], uid(&pod));
        assert_eq!(annotations[CONFIG_SOURCE_ANNOTATION_KEY], "file");
        assert_eq!(annotations["team"], "edge");
        assert!(!annotations.contains_key(crate::pod::CONFIG_FIRST_SEEN_ANNOTATION_KEY));
        assert_eq!(
            pod.status.as_ref().unwrap().phase.as_deref(),
            Some("Pending")
        );
    }

    #[test]
    fn namespace_kept_and_http_pods_get_no_toleration() {
        let yaml = MANIFEST.replace("  name: web\n", "  name: web\n  namespace: edge\n");
        let pod = defaulted(&yaml, "http://h/m", "node1", HTTP_SOURCE);
        assert_eq!(pod.metadata.namespace.as_deref(), Some("edge"));
        assert_eq!(pod.spec.as_ref().unwrap().tolerations, None);
        let annotations = pod.metadata.annotations.as_ref().unwrap();
        assert_eq!(annotations[CONFIG_SOURCE_ANNOTATION_KEY], "http");
    }

    #[test]
    fn existing_toleration_is_not_duplicated() {
        let yaml =
            format!("{MANIFEST}  tolerations:\n  - operator: Exists\n    effect: NoExecute\n");
        let pod = defaulted(&yaml, "/m/web.yaml", "node1", FILE_SOURCE);
        assert_eq!(pod.spec.unwrap().tolerations.unwrap().len(), 1);
    }

    #[test]
    fn invalid_pods_are_rejected_naming_the_field() {
        let cases = [
            ("kind: Pod\nspec: {containers: [{name: c, image: i}]}\n", "metadata.name"),
            ("metadata: {name: Web}\nspec: {containers: [{name: c, image: i}]}\n", "metadata.name"),
            ("metadata: {name: web}\nspec: {containers: []}\n", "spec.containers"),
            ("metadata: {name: web}\n", "spec.containers"),
            (
                "metadata: {name: web}\nspec: {containers: [{name: c, image: i}, {name: c, image: i}]}\n",
                "spec.containers[1].name",
            ),
        ];
        for (yaml, field) in cases {
            let mut pod = decode_pod(yaml.as_bytes()).unwrap();
            let err =
                apply_static_defaults(&mut pod, "/m/x.yaml", "node1", FILE_SOURCE).unwrap_err();
            assert!(err.names_field(field), "{yaml}: {err}");
        }
    }
}
