//! The labels and annotations tinylet puts on CRI sandboxes and containers,
//! and reading them back.
//!
//! These keys are wire facts shared with the upstream kubelet: a runtime's
//! objects carry everything tinylet needs to adopt them after a restart, so
//! the runtime stays the source of truth for what runs.

use std::collections::HashMap;

use k8s_openapi::api::core::v1::{Container, LifecycleHandler, Pod};
use md5::{Digest, Md5};

use crate::pod::{pod_name, pod_namespace, pod_uid};

pub const POD_NAME: &str = "io.kubernetes.pod.name";
pub(crate) const POD_NAMESPACE: &str = "io.kubernetes.pod.namespace";
pub const POD_UID: &str = "io.kubernetes.pod.uid";
pub(crate) const CONTAINER_NAME: &str = "io.kubernetes.container.name";

pub const CONTAINER_HASH: &str = "io.kubernetes.container.hash";
pub(crate) const CONTAINER_RESTART_COUNT: &str = "io.kubernetes.container.restartCount";
pub(crate) const TERMINATION_MESSAGE_PATH: &str = "io.kubernetes.container.terminationMessagePath";
pub(crate) const TERMINATION_MESSAGE_POLICY: &str =
    "io.kubernetes.container.terminationMessagePolicy";
/// On a sandbox: the hash of what it was made from (`actions::sandbox_hash`).
pub(crate) const SANDBOX_HASH: &str = "tinylet.io/sandbox-hash";
pub(crate) const POD_TERMINATION_GRACE_PERIOD: &str = "io.kubernetes.pod.terminationGracePeriod";
pub(crate) const CONTAINER_PRE_STOP_HANDLER: &str = "io.kubernetes.container.preStopHandler";

/// Labels of a pod sandbox: the pod's own labels plus the three identity labels.
pub(crate) fn sandbox_labels(pod: &Pod) -> HashMap<String, String> {
    let mut labels: HashMap<String, String> = pod
        .metadata
        .labels
        .as_ref()
        .map(|l| l.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
        .unwrap_or_default();
    labels.insert(POD_NAME.into(), pod_name(pod).into());
    labels.insert(POD_NAMESPACE.into(), pod_namespace(pod).into());
    labels.insert(POD_UID.into(), pod_uid(pod).into());
    labels
}

/// Annotations of a pod sandbox: the pod's own annotations.
pub(crate) fn sandbox_annotations(pod: &Pod) -> HashMap<String, String> {
    pod.metadata
        .annotations
        .as_ref()
        .map(|a| a.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
        .unwrap_or_default()
}

/// Labels of a container: identity only (pod labels stay on the sandbox).
pub(crate) fn container_labels(pod: &Pod, container: &Container) -> HashMap<String, String> {
    HashMap::from([
        (POD_NAME.to_string(), pod_name(pod).to_string()),
        (POD_NAMESPACE.to_string(), pod_namespace(pod).to_string()),
        (POD_UID.to_string(), pod_uid(pod).to_string()),
        (CONTAINER_NAME.to_string(), container.name.clone()),
    ])
}

/// Annotations of a container: what tinylet needs to read back after a restart.
pub(crate) fn container_annotations(
    pod: &Pod,
    container: &Container,
    restart_count: u32,
) -> HashMap<String, String> {
    let mut a = HashMap::from([
        (
            CONTAINER_HASH.to_string(),
            format!("{:x}", container_hash(container)),
        ),
        (
            CONTAINER_RESTART_COUNT.to_string(),
            restart_count.to_string(),
        ),
        (
            TERMINATION_MESSAGE_PATH.to_string(),
            container
                .termination_message_path
                .clone()
                .unwrap_or_else(|| "/dev/termination-log".into()),
        ),
        (
            TERMINATION_MESSAGE_POLICY.to_string(),
            container
                .termination_message_policy
                .clone()
                .unwrap_or_else(|| "File".into()),
        ),
    ]);
    if let Some(g) = pod
        .spec
        .as_ref()
        .and_then(|s| s.termination_grace_period_seconds)
    {
        a.insert(POD_TERMINATION_GRACE_PERIOD.into(), g.to_string());
    }
    // So that a container whose pod is gone from every source still gets
    // its preStop hook when it is stopped.
    if let Some(h) = container
        .lifecycle
        .as_ref()
        .and_then(|l| l.pre_stop.as_ref())
    {
        if let Ok(json) = serde_json::to_string(h) {
            a.insert(CONTAINER_PRE_STOP_HANDLER.into(), json);
        }
    }
    a
}

/// The pod's grace period recorded on a container, if any.
pub(crate) fn parse_grace_period(annotations: &HashMap<String, String>) -> Option<i64> {
    annotations
        .get(POD_TERMINATION_GRACE_PERIOD)
        .and_then(|g| g.parse().ok())
}

/// The preStop hook recorded on a container, if any. An annotation that
/// does not decode is ignored: the container is then stopped without it.
pub(crate) fn parse_pre_stop(annotations: &HashMap<String, String>) -> Option<LifecycleHandler> {
    annotations
        .get(CONTAINER_PRE_STOP_HANDLER)
        .and_then(|h| serde_json::from_str(h).ok())
}

/// A stable hash of a container's spec. A running container whose hash differs
/// from its spec's is restarted. Serialization of the typed struct has a fixed
/// field order, so the same spec hashes the same across restarts of tinylet.
pub fn container_hash(container: &Container) -> u64 {
    let json = serde_json::to_vec(container).unwrap_or_default();
    let digest = Md5::digest(&json);
    let mut b = [0u8; 8];
    b.copy_from_slice(&digest[..8]);
    u64::from_be_bytes(b)
}

pub(crate) fn parse_hash(annotations: &HashMap<String, String>) -> u64 {
    annotations
        .get(CONTAINER_HASH)
        .and_then(|h| u64::from_str_radix(h, 16).ok())
        .unwrap_or(0)
}

pub(crate) fn parse_restart_count(annotations: &HashMap<String, String>) -> u32 {
    annotations
        .get(CONTAINER_RESTART_COUNT)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hash_is_stable_and_follows_the_spec() {
        let a = Container {
            name: "app".into(),
            image: Some("busybox".into()),
            command: Some(vec!["sleep".into(), "1".into()]),
            ..Default::default()
        };
        let mut b = a.clone();
        assert_eq!(container_hash(&a), container_hash(&b));
        b.command = Some(vec!["sleep".into(), "2".into()]);
        assert_ne!(container_hash(&a), container_hash(&b));
        let ann = container_annotations(&Pod::default(), &a, 3);
        assert_eq!(parse_hash(&ann), container_hash(&a));
        assert_eq!(parse_restart_count(&ann), 3);
    }
}
