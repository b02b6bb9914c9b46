//! The image manager: a container's image present under its pull policy,
//! pulled through the CRI image service with the pod's pull secrets, the
//! per-pod pull back-off and the registry token bucket. Built only with the
//! `cri` feature (the default).

use std::sync::Arc;
use std::time::Instant;

use k8s_openapi::api::core::v1::{Container, Pod};
use log::{info, warn};
use parking_lot::Mutex;

use super::backoff::{PullBackoff, PullBucket};
use super::keyring::{Credential, Keyring};
use super::puller::{go_error, go_millis, Puller};
use super::{pull_policy, should_pull, ImageError, ImageOptions, PULL_FAILED_RESYNC};
use crate::cri::{api, ImageService};
use crate::events::{EventRecorder, EventType, ObjectRef};
use crate::image_reference::{apply_default_tag, parse_image_name};
use crate::pod::{pod_full_name, pod_namespace, pod_uid};
use crate::volume::{Keys, ObjectSource};

pub(crate) struct ImageManager {
    images: Arc<dyn ImageService>,
    puller: Puller,
    backoff: Mutex<PullBackoff>,
    /// Where pull secrets are read; None on a standalone node.
    secrets: Option<Arc<dyn ObjectSource>>,
}

impl ImageManager {
    pub(crate) fn new(images: Arc<dyn ImageService>, opts: ImageOptions) -> Self {
        ImageManager {
            puller: Puller::new(
                images.clone(),
                PullBucket::new(opts.registry_qps, opts.registry_burst, Instant::now())
                    .map(|b| Arc::new(Mutex::new(b))),
                opts.serialize_pulls,
            ),
            images,
            backoff: Mutex::new(PullBackoff::default()),
            secrets: None,
        }
    }

    /// Reads imagePullSecrets from `source` (the apiserver).
    pub(crate) fn set_secrets(&mut self, source: Arc<dyn ObjectSource>) {
        self.secrets = Some(source);
    }

    /// Forgets the back-off of a pod that is gone.
    pub(crate) fn forget_pod(&self, uid: &str) {
        self.backoff.lock().forget_pod(uid);
    }

    /// The pod's pull secrets that could be read, by `ns/name`; the names of
    /// those that could not are reported in an event and the log, and the
    /// pull goes on without them, as upstream.
    fn pull_secrets(&self, pod: &Pod, recorder: &EventRecorder) -> Vec<(String, Keys)> {
        let ns = pod_namespace(pod);
        let names: Vec<&str> = pod
            .spec
            .as_ref()
            .and_then(|s| s.image_pull_secrets.as_ref())
            .into_iter()
            .flatten()
            .map(|r| r.name.as_str())
            .filter(|n| !n.is_empty())
            .collect();
        let mut found = Vec::new();
        let mut failed: Vec<&str> = Vec::new();
        for name in names {
            let what = format!("{ns}/{name}");
            match &self.secrets {
                None => {
                    warn!(
                        "pod {}: image pull secret {what}: cannot be read on a standalone node (no --kubeconfig); pulling without it",
                        pod_full_name(pod)
                    );
                    failed.push(name);
                }
                Some(src) => match src.secret(ns, name) {
                    Ok(Some(data)) => found.push((what, data)),
                    Ok(None) => {
                        warn!(
                            "pod {}: image pull secret {what} not found; pulling without it",
                            pod_full_name(pod)
                        );
                        failed.push(name);
                    }
                    Err(e) => {
                        warn!(
                            "pod {}: image pull secret {what}: {e}; pulling without it",
                            pod_full_name(pod)
                        );
                        failed.push(name);
                    }
                },
            }
        }
        if !failed.is_empty() {
            recorder.event(
                &ObjectRef::pod(pod),
                EventType::Warning,
                "FailedToRetrieveImagePullSecret",
                format!(
                    "Unable to retrieve some image pull secrets ({}); attempting to pull the image may not succeed.",
                    failed.join(", ")
                ),
            );
        }
        found
    }

    /// Makes sure the container's image is there under its pull policy and
    /// returns the image reference to create the container from. Events go
    /// to `recorder` about `container` (and the pod, for pull secrets).
    pub(crate) fn ensure_image(
        &self,
        pod: &Pod,
        c: &Container,
        sandbox: &api::PodSandboxConfig,
        recorder: &EventRecorder,
        container: &ObjectRef,
    ) -> Result<String, ImageError> {
        let who = pod_full_name(pod);
        let requested = c.image.as_deref().unwrap_or("");
        let event = |kind, reason: &str, message: String| {
            recorder.event(container, kind, reason, message);
        };
        let image = match apply_default_tag(requested) {
            Ok(i) => i,
            Err(e) => {
                let message = format!("Failed to apply default image tag {requested:?}: {e}");
                event(EventType::Warning, "InspectFailed", message.clone());
                return Err(ImageError {
                    reason: "InvalidImageName",
                    message,
                    retry_after: None,
                });
            }
        };
        let mut spec = api::ImageSpec::new();
        spec.image = image.clone();
        let policy = pull_policy(c);
        let present = if policy == "Always" {
            None
        } else {
            match self.images.image_status(&spec) {
                Ok(img) => img,
                Err(e) => {
                    let message =
                        format!("Failed to inspect image {requested:?}: {}", go_error(&e));
                    event(EventType::Warning, "InspectFailed", message.clone());
                    return Err(ImageError {
                        reason: "ImageInspectError",
                        message,
                        retry_after: None,
                    });
                }
            }
        };
        if !should_pull(policy, present.is_some()) {
            if let Some(img) = present {
                event(
                    EventType::Normal,
                    "Pulled",
                    format!("Container image {requested:?} already present on machine"),
                );
                return Ok(if img.id.is_empty() { image } else { img.id });
            }
            let message =
                format!("Container image {requested:?} is not present with pull policy of Never");
            event(EventType::Warning, "ErrImageNeverPull", message.clone());
            return Err(ImageError {
                reason: "ErrImageNeverPull",
                message,
                retry_after: None,
            });
        }

        let key = format!("{}_{requested}", pod_uid(pod));
        let backing_off = self
            .backoff
            .lock()
            .in_backoff(&key, Instant::now())
            .map(|(left, _, last)| (left, last.to_string()));
        if let Some((left, last)) = backing_off {
            let msg = format!("Back-off pulling image {requested:?}");
            event(EventType::Normal, "BackOff", msg.clone());
            return Err(ImageError {
                reason: "ImagePullBackOff",
                message: format!("{msg}: {last}"),
                retry_after: Some(left),
            });
        }

        let fail = |message: String| {
            let window = self.backoff.lock().failed(
                &key,
                Instant::now(),
                format!("ErrImagePull: {message}"),
            );
            info!(
                "pod {who}: pulling image {requested:?} failed; back-off {}s",
                window.as_secs()
            );
            ImageError {
                reason: "ErrImagePull",
                message,
                retry_after: Some(PULL_FAILED_RESYNC),
            }
        };
        let secrets = self.pull_secrets(pod, recorder);
        let keyring = match Keyring::from_secrets(&secrets) {
            Ok(k) => k,
            Err(e) => {
                event(
                    EventType::Warning,
                    "Failed",
                    format!("Failed to pull image {requested:?}: {e}"),
                );
                return Err(fail(e));
            }
        };
        // `image` parsed above, so this cannot fail; the repository is what
        // logins are matched against.
        let repo = parse_image_name(&image).map(|r| r.repo).unwrap_or_default();
        let creds: Vec<api::AuthConfig> = keyring
            .lookup(&repo)
            .iter()
            .map(Credential::auth_config)
            .collect();

        info!(
            "pod {who}: pulling image {requested:?} ({} credential(s))",
            creds.len()
        );
        event(
            EventType::Normal,
            "Pulling",
            format!("Pulling image {requested:?}"),
        );
        let started = Instant::now();
        let pulled = self.puller.pull(&spec, creds, sandbox);
        match pulled.result {
            Ok((image_ref, size)) => {
                event(
                    EventType::Normal,
                    "Pulled",
                    format!(
                        "Successfully pulled image {requested:?} in {} ({} including waiting). Image size: {size} bytes.",
                        go_millis(pulled.took),
                        go_millis(started.elapsed())
                    ),
                );
                self.backoff.lock().gc(Instant::now());
                Ok(image_ref)
            }
            Err(e) => {
                let mut message = e;
                let named_secrets = pod
                    .spec
                    .as_ref()
                    .and_then(|s| s.image_pull_secrets.as_ref())
                    .is_some_and(|v| !v.is_empty());
                if self.secrets.is_none() && named_secrets {
                    message.push_str(
                        " (the pod's imagePullSecrets were not used: a standalone node without --kubeconfig cannot read secrets)",
                    );
                }
                event(
                    EventType::Warning,
                    "Failed",
                    format!("Failed to pull image {requested:?}: {message}"),
                );
                Err(fail(message))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cri::CriError;
    use crate::images::backoff::PULL_BACKOFF_INITIAL;
    use crate::images::keyring::DOCKER_CONFIG_JSON_KEY;
    use base64::Engine;
    use serde_json::json;
    use std::time::Duration;

    // ---- ensure_image against the fake runtime ----

    use crate::runtime::fake::{test_pod, FakeRuntime, TEST_IMAGE};
    use k8s_openapi::api::core::v1::LocalObjectReference;

    struct Secrets(Vec<(String, Keys)>);

    impl ObjectSource for Secrets {
        fn secret(&self, ns: &str, name: &str) -> Result<crate::volume::Fetched, String> {
            let key = format!("{ns}/{name}");
            Ok(self
                .0
                .iter()
                .find(|(k, _)| *k == key)
                .map(|(_, v)| v.clone()))
        }
        fn config_map(&self, _: &str, _: &str) -> Result<crate::volume::Fetched, String> {
            Ok(None)
        }
        fn service_account_token(
            &self,
            _: &Pod,
            _: Option<&str>,
            _: i64,
        ) -> Result<crate::volume::Token, String> {
            Err("no tokens here".into())
        }
    }

    const PRIVATE: &str = "127.0.0.1:5000/test/busybox:1";

    fn setup(serialize: bool) -> (Arc<FakeRuntime>, ImageManager) {
        let fake = Arc::new(FakeRuntime::with_images(&[TEST_IMAGE]));
        let opts = ImageOptions {
            serialize_pulls: serialize,
            registry_qps: 0.0,
            registry_burst: 10,
        };
        (fake.clone(), ImageManager::new(fake, opts))
    }

    fn pod_with(image: &str, policy: Option<&str>, secrets: &[&str]) -> Pod {
        let mut p = test_pod("uid-1", "web");
        let spec = p.spec.as_mut().unwrap();
        spec.containers[0].image = Some(image.into());
        spec.containers[0].image_pull_policy = policy.map(String::from);
        if !secrets.is_empty() {
            spec.image_pull_secrets = Some(
                secrets
                    .iter()
                    .map(|n| LocalObjectReference {
                        name: n.to_string(),
                    })
                    .collect(),
            );
        }
        p
    }

    fn ensure(m: &ImageManager, pod: &Pod) -> Result<String, ImageError> {
        let c = &pod.spec.as_ref().unwrap().containers[0];
        let obj = ObjectRef::container(pod, &c.name, false);
        m.ensure_image(
            pod,
            c,
            &api::PodSandboxConfig::new(),
            &EventRecorder::disabled(),
            &obj,
        )
    }

    #[test]
    fn policies_decide_whether_the_runtime_is_asked_to_pull() {
        let (fake, m) = setup(false);
        // Present and IfNotPresent: no pull.
        let p = pod_with(TEST_IMAGE, Some("IfNotPresent"), &[]);
        assert_eq!(ensure(&m, &p).unwrap(), TEST_IMAGE);
        assert_eq!(fake.count("PullImage"), 0);
        // Present but Always: pulled again.
        fake.serve_image(TEST_IMAGE, None);
        let p = pod_with(TEST_IMAGE, Some("Always"), &[]);
        assert_eq!(ensure(&m, &p).unwrap(), TEST_IMAGE);
        assert_eq!(fake.count("PullImage"), 1);
        // Missing and Never: ErrImageNeverPull with upstream's message, no pull.
        let p = pod_with("example.com/missing:2", Some("Never"), &[]);
        let e = ensure(&m, &p).unwrap_err();
        assert_eq!(e.reason, "ErrImageNeverPull");
        assert_eq!(
            e.message,
            "Container image \"example.com/missing:2\" is not present with pull policy of Never"
        );
        assert_eq!(fake.count("PullImage"), 1);
        // No policy and no tag: Always, asked for with :latest.
        fake.serve_image("example.com/app:latest", None);
        let p = pod_with("example.com/app", None, &[]);
        assert_eq!(ensure(&m, &p).unwrap(), "example.com/app:latest");
        assert_eq!(fake.count("PullImage"), 2);
        let e = ensure(&m, &pod_with("Not An Image", None, &[])).unwrap_err();
        assert_eq!(e.reason, "InvalidImageName");
    }

    #[test]
    fn a_failed_pull_backs_off_per_pod_and_image() {
        let (fake, m) = setup(true);
        let p = pod_with(PRIVATE, None, &[]);
        fake.serve_image(PRIVATE, Some(("alice", "pw")));
        let e = ensure(&m, &p).unwrap_err();
        assert_eq!(e.reason, "ErrImagePull");
        assert!(
            e.message.starts_with("rpc error: code = Unknown desc = "),
            "{}",
            e.message
        );
        assert!(e.message.contains("401 Unauthorized"), "{}", e.message);
        assert_eq!(e.retry_after, Some(PULL_FAILED_RESYNC));
        // Within the window: no pull, ImagePullBackOff naming the failure.
        let again = ensure(&m, &p).unwrap_err();
        assert_eq!(again.reason, "ImagePullBackOff");
        assert_eq!(
            again.message,
            format!(
                "Back-off pulling image \"{PRIVATE}\": ErrImagePull: {}",
                e.message
            )
        );
        let left = again.retry_after.unwrap();
        assert!(
            left <= PULL_BACKOFF_INITIAL && left > PULL_BACKOFF_INITIAL - Duration::from_secs(5)
        );
        assert_eq!(fake.count("PullImage"), 1);
        // Another pod pulling the same image is not held back.
        let mut other = pod_with(PRIVATE, None, &[]);
        other.metadata.uid = Some("uid-2".into());
        assert_eq!(ensure(&m, &other).unwrap_err().reason, "ErrImagePull");
        assert_eq!(fake.count("PullImage"), 2);
        // A pod that is gone forgets its back-off.
        m.forget_pod("uid-1");
        assert_eq!(ensure(&m, &p).unwrap_err().reason, "ErrImagePull");
        assert_eq!(fake.count("PullImage"), 3);
    }

    #[test]
    fn pull_secrets_are_tried_in_order_and_matched_by_registry() {
        let (fake, mut m) = setup(true);
        fake.serve_image(PRIVATE, Some(("alice", "right")));
        let cfg = |user: &str, pass: &str, host: &str| {
            let mut k = Keys::new();
            let auth = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{pass}"));
            k.insert(
                DOCKER_CONFIG_JSON_KEY.into(),
                json!({"auths": {host: {"auth": auth}}})
                    .to_string()
                    .into_bytes(),
            );
            k
        };
        m.set_secrets(Arc::new(Secrets(vec![
            (
                "default/wrong".into(),
                cfg("mallory", "nope", "http://127.0.0.1:5000"),
            ),
            (
                "default/right".into(),
                cfg("alice", "right", "127.0.0.1:5000"),
            ),
            (
                "default/elsewhere".into(),
                cfg("bob", "x", "registry.example.com"),
            ),
        ])));
        // A missing secret is skipped; the others are tried in the pod's order.
        let p = pod_with(PRIVATE, None, &["missing", "wrong", "elsewhere", "right"]);
        assert_eq!(ensure(&m, &p).unwrap(), PRIVATE);
        assert_eq!(fake.pull_auths(), ["mallory", "alice"]);
        // Only the wrong one: both errors would be the same, reported once.
        let mut p = pod_with(PRIVATE, Some("Always"), &["wrong"]);
        p.metadata.uid = Some("uid-3".into());
        let e = ensure(&m, &p).unwrap_err();
        assert_eq!(e.reason, "ErrImagePull");
        assert!(e.message.contains("401"), "{}", e.message);
        assert_eq!(fake.pull_auths(), ["mallory", "alice", "mallory"]);
        // No matching login: anonymous.
        let mut p = pod_with(PRIVATE, Some("Always"), &["elsewhere"]);
        p.metadata.uid = Some("uid-4".into());
        assert!(ensure(&m, &p).is_err());
        assert_eq!(fake.pull_auths().last().map(String::as_str), Some(""));
    }

    #[test]
    fn a_standalone_node_says_why_pull_secrets_were_not_used() {
        let (fake, m) = setup(false);
        fake.serve_image(PRIVATE, Some(("alice", "pw")));
        let p = pod_with(PRIVATE, None, &["regcred"]);
        let e = ensure(&m, &p).unwrap_err();
        assert_eq!(e.reason, "ErrImagePull");
        assert!(
            e.message.contains("imagePullSecrets were not used")
                && e.message.contains("without --kubeconfig"),
            "{}",
            e.message
        );
        assert_eq!(fake.pull_auths(), [""]);
    }

    #[test]
    fn registry_qps_refuses_pulls_beyond_the_burst() {
        let fake = Arc::new(FakeRuntime::with_images(&[]));
        fake.serve_image(TEST_IMAGE, None);
        let m = ImageManager::new(
            fake.clone(),
            ImageOptions {
                serialize_pulls: true,
                registry_qps: 0.001,
                registry_burst: 1,
            },
        );
        let p = pod_with(TEST_IMAGE, Some("Always"), &[]);
        assert!(ensure(&m, &p).is_ok());
        let mut q = pod_with(TEST_IMAGE, Some("Always"), &[]);
        q.metadata.uid = Some("uid-2".into());
        let e = ensure(&m, &q).unwrap_err();
        assert_eq!(
            (e.reason, e.message.as_str()),
            ("ErrImagePull", "pull QPS exceeded")
        );
        assert_eq!(fake.count("PullImage"), 1);
    }

    /// Pulls that take 30 ms and count how many run at once.
    #[derive(Default)]
    struct SlowRegistry {
        running: std::sync::atomic::AtomicUsize,
        most: std::sync::atomic::AtomicUsize,
    }

    impl ImageService for SlowRegistry {
        fn list_images(&self, _: Option<api::ImageFilter>) -> Result<Vec<api::Image>, CriError> {
            Ok(Vec::new())
        }
        fn image_status(&self, _: &api::ImageSpec) -> Result<Option<api::Image>, CriError> {
            Ok(None)
        }
        fn pull_image(
            &self,
            image: &api::ImageSpec,
            _: Option<&api::AuthConfig>,
            _: Option<&api::PodSandboxConfig>,
        ) -> Result<String, CriError> {
            use std::sync::atomic::Ordering::SeqCst;
            let now = self.running.fetch_add(1, SeqCst) + 1;
            self.most.fetch_max(now, SeqCst);
            std::thread::sleep(Duration::from_millis(30));
            self.running.fetch_sub(1, SeqCst);
            Ok(image.image.clone())
        }
        fn remove_image(&self, _: &api::ImageSpec) -> Result<(), CriError> {
            Ok(())
        }
        fn image_fs_info(&self) -> Result<Vec<api::FilesystemUsage>, CriError> {
            Ok(Vec::new())
        }
    }

    fn most_pulls_at_once(serialize: bool) -> usize {
        let registry = Arc::new(SlowRegistry::default());
        let m = ImageManager::new(
            registry.clone(),
            ImageOptions {
                serialize_pulls: serialize,
                registry_qps: 0.0,
                registry_burst: 10,
            },
        );
        let pods: Vec<Pod> = (0..4)
            .map(|i| {
                let mut p = pod_with(&format!("example.com/app{i}:1"), None, &[]);
                p.metadata.uid = Some(format!("uid-{i}"));
                p
            })
            .collect();
        crate::thread::scope_named(|s| {
            for p in &pods {
                let m = &m;
                s.spawn("pull-test", move || assert!(ensure(m, p).is_ok()))
                    .expect("start a puller");
            }
        });
        registry.most.load(std::sync::atomic::Ordering::SeqCst)
    }

    #[test]
    fn serialized_pulls_run_one_at_a_time() {
        assert_eq!(most_pulls_at_once(true), 1);
        assert!(most_pulls_at_once(false) > 1, "parallel pulls overlapped");
    }
}
