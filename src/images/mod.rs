//! Images (upstream `pkg/kubelet/images`, image GC included, and the
//! pull-secret part of `credentialprovider`). Here, the image manager:
//! whether a container's image is pulled under its imagePullPolicy, the
//! per-pod image pull back-off, the registry token bucket
//! (`--registry-qps`/`--registry-burst`), the serialized puller
//! (`--serialize-image-pulls`), and the keyring that turns a pod's
//! imagePullSecrets into CRI `AuthConfig`s matched by registry host.
//!
//! `ImageManager::ensure_image` runs on the pod's worker thread. With
//! serialized pulls one `image-puller` thread does every pull, one at a
//! time, and the worker waits for its answer; otherwise the worker pulls
//! itself. The token bucket and the back-off table are shared by all
//! workers; their locks are held for arithmetic only, never across a CRI
//! call.
//!
//! The parts: `manager` (`ImageManager`), `keyring` (pull secrets to
//! logins), `backoff` (pull back-off and the token bucket), `puller` (one
//! pull, serialized or not), `gc` (image garbage collection). The reference grammar is the ground-floor
//! `crate::image_reference`.

pub mod backoff;
#[cfg(feature = "cri")]
pub(crate) mod gc;
pub mod keyring;
// What pulls through the CRI image service is built only with the `cri`
// feature (the default); the pull policy, the keyring and the back-off
// need no CRI client.
#[cfg(feature = "cri")]
mod manager;
#[cfg(feature = "cri")]
pub(crate) mod puller;

use std::time::Duration;

use k8s_openapi::api::core::v1::Container;

use crate::image_reference::parse_image_name;
#[cfg(feature = "cri")]
pub(crate) use manager::ImageManager;

/// After a failed pull the pod is synced again this soon, so its status
/// moves from ErrImagePull to ImagePullBackOff (with the back-off's message)
/// instead of waiting for the back-off to end in ErrImagePull.
pub(crate) const PULL_FAILED_RESYNC: Duration = Duration::from_secs(1);

/// `--serialize-image-pulls`, `--registry-qps`, `--registry-burst`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct ImageOptions {
    /// One pull at a time across all pods (upstream default true).
    pub(crate) serialize_pulls: bool,
    /// Pulls per second; 0: unlimited (upstream default 5).
    pub(crate) registry_qps: f32,
    /// Pulls allowed in a burst when `registry_qps` > 0 (upstream default 10).
    pub(crate) registry_burst: u32,
}

impl Default for ImageOptions {
    fn default() -> Self {
        ImageOptions {
            serialize_pulls: true,
            registry_qps: 5.0,
            registry_burst: 10,
        }
    }
}

/// The apiserver's default pull policy: Always when the tag is `latest`
/// (given or implied), IfNotPresent otherwise (another tag, a digest, or a
/// name that does not parse).
pub(crate) fn default_pull_policy(image: &str) -> &'static str {
    match parse_image_name(image) {
        Ok(r) if r.tag == "latest" => "Always",
        _ => "IfNotPresent",
    }
}

/// The container's imagePullPolicy, defaulted from its image.
pub(crate) fn pull_policy(c: &Container) -> &str {
    match c.image_pull_policy.as_deref() {
        Some(p) if !p.is_empty() => p,
        _ => default_pull_policy(c.image.as_deref().unwrap_or("")),
    }
}

/// Whether to pull: Never never does, Always always does, IfNotPresent
/// (and anything else) when the image is missing.
pub(crate) fn should_pull(policy: &str, present: bool) -> bool {
    match policy {
        "Never" => false,
        "Always" => true,
        _ => !present,
    }
}

/// Why a container's image is not there: the waiting reason (ErrImagePull,
/// ImagePullBackOff, ErrImageNeverPull, InvalidImageName, ImageInspectError)
/// and message as upstream reports them, and when to try again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ImageError {
    pub(crate) reason: &'static str,
    pub(crate) message: String,
    /// Sync again after this long (a back-off); None: the usual retry.
    pub(crate) retry_after: Option<Duration>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pull_policy_defaults_follow_the_tag() {
        assert_eq!(default_pull_policy("busybox"), "Always");
        assert_eq!(default_pull_policy("busybox:latest"), "Always");
        assert_eq!(
            default_pull_policy("docker.io/tinylet/busybox:1"),
            "IfNotPresent"
        );
        assert_eq!(default_pull_policy("localhost:5000/busybox"), "Always");
        assert_eq!(default_pull_policy("127.0.0.1:5000/a/b:v2"), "IfNotPresent");
        let digest = format!("busybox@sha256:{}", "a".repeat(64));
        assert_eq!(default_pull_policy(&digest), "IfNotPresent");
        let both = format!("busybox:latest@sha256:{}", "a".repeat(64));
        assert_eq!(default_pull_policy(&both), "Always");
        // A name that does not parse is not defaulted to Always.
        assert_eq!(default_pull_policy("Busy Box"), "IfNotPresent");
        let c = Container {
            image: Some("busybox".into()),
            image_pull_policy: Some("Never".into()),
            ..Default::default()
        };
        assert_eq!(pull_policy(&c), "Never");
    }

    #[test]
    fn policy_decisions() {
        assert!(should_pull("Always", true));
        assert!(should_pull("Always", false));
        assert!(!should_pull("IfNotPresent", true));
        assert!(should_pull("IfNotPresent", false));
        assert!(!should_pull("Never", true));
        assert!(!should_pull("Never", false));
    }
}
