//! End-to-end tests of image pulls: tinylet as a cluster node (fake
//! apiserver, real private containerd) pulling from a real registry on
//! loopback with htpasswd auth (`support::registry`), images pushed there
//! from the locally built OCI tarballs. Pull on first use with a pull
//! secret and the pulled image's ID in the status, Always re-checking a
//! re-pushed tag, a wrong password going to ErrImagePull and then
//! ImagePullBackOff, a secret created later making the pull work, and a
//! missing image with policy Never giving ErrImageNeverPull.
//!
//! All cases share one node (one containerd and tinylet start-up) and run
//! side by side as separate pods.

use std::time::{Duration, Instant};

use base64::Engine;
use serde_json::{json, Value};

use crate::e2e::{LONG_RUNNING, NODE, SETTLE};
use crate::support::containerd::{wait_until, PrivateContainerd, Tinylet, BUSYBOX_IMAGE};
use crate::support::fake_apiserver::FakeApiServer;
use crate::support::registry::{oci_archives, Registry, PASSWORD, USER};

const NS: &str = "default";

fn pull_pod(
    name: &str,
    image: &str,
    policy: Option<&str>,
    secrets: &[&str],
    script: &str,
) -> Value {
    let mut container = json!({
        "name": "app",
        "image": image,
        "command": ["sh", "-c", script],
    });
    if let Some(p) = policy {
        container["imagePullPolicy"] = json!(p);
    }
    let secrets: Vec<Value> = secrets.iter().map(|n| json!({"name": n})).collect();
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "nodeName": NODE,
            "automountServiceAccountToken": false,
            "terminationGracePeriodSeconds": 2,
            "imagePullSecrets": secrets,
            "containers": [container],
        },
    })
}

fn at<'a>(v: &'a Value, pointer: &str) -> &'a str {
    v.pointer(pointer).and_then(Value::as_str).unwrap_or("")
}

/// The first container's status of pod `name`, or Null.
fn cstatus(fake: &FakeApiServer, name: &str) -> Value {
    fake.pod(NS, name)
        .and_then(|p| p.pointer("/status/containerStatuses/0").cloned())
        .unwrap_or(Value::Null)
}

/// Messages of the events with `reason` about pod `name`.
fn events(fake: &FakeApiServer, name: &str, reason: &str) -> Vec<String> {
    fake.events()
        .iter()
        .filter(|e| at(e, "/involvedObject/name") == name && at(e, "/reason") == reason)
        .map(|e| at(e, "/message").to_string())
        .collect()
}

/// A `.dockerconfigjson` secret for the test registry.
fn docker_config_json(host: &str, user: &str, password: &str) -> String {
    let auth = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
    json!({"auths": {format!("http://{host}"): {"auth": auth}}}).to_string()
}

/// Waits until the first container of `name` waits with `reason`; returns
/// its message.
fn wait_waiting(fake: &FakeApiServer, name: &str, reason: &str, within: Duration) -> String {
    let mut message = String::new();
    wait_until(within, &format!("pod {name} waits with {reason}"), || {
        let c = cstatus(fake, name);
        message = at(&c, "/state/waiting/message").to_string();
        at(&c, "/state/waiting/reason") == reason
    });
    message
}

/// Waits until the first container of `name` runs; returns its status.
fn wait_running(fake: &FakeApiServer, name: &str, within: Duration) -> Value {
    let mut status = Value::Null;
    wait_until(within, &format!("pod {name} runs"), || {
        status = cstatus(fake, name);
        status.pointer("/state/running").is_some()
    });
    status
}

#[test]
fn registry_pulls_follow_policy_secrets_and_back_off() {
    let reg = Registry::shared();
    let (busybox, pause) = oci_archives();
    let host = reg.host();
    let d_busybox = reg.push(&busybox, "test/first", "1");
    for repo in ["test/wrong", "test/later", "test/moving"] {
        assert_eq!(
            reg.push(&busybox, repo, "1"),
            d_busybox,
            "skopeo pushes reproducibly"
        );
    }

    let fake = FakeApiServer::start();
    let ctd = PrivateContainerd::start();
    let kubeconfig = fake.node_kubeconfig(ctd.dir(), NODE);
    let kubeconfig = kubeconfig.display().to_string();
    let _kubelet = Tinylet::start_with(&ctd, NODE, &["--kubeconfig", &kubeconfig]);
    wait_until(SETTLE, "node edge-1 is registered", || {
        fake.node(NODE).is_some()
    });

    let right = docker_config_json(&host, USER, PASSWORD);
    fake.create_secret(NS, "regcred", &[(".dockerconfigjson", &right)]);
    // The legacy format, with a wrong password.
    let wrong = json!({host.clone(): {"username": USER, "password": "wrong"}}).to_string();
    fake.create_secret(NS, "badcred", &[(".dockercfg", &wrong)]);

    let first = reg.image("test/first", "1");
    let wrong_img = reg.image("test/wrong", "1");
    let later = reg.image("test/later", "1");
    let moving = reg.image("test/moving", "1");
    let absent = reg.image("test/absent", "1");
    fake.create_pod(pull_pod("first", &first, None, &["regcred"], LONG_RUNNING));
    fake.create_pod(pull_pod(
        "wrong",
        &wrong_img,
        None,
        &["badcred"],
        LONG_RUNNING,
    ));
    fake.create_pod(pull_pod("later", &later, None, &["late"], LONG_RUNNING));
    fake.create_pod(pull_pod("never", &absent, Some("Never"), &[], LONG_RUNNING));
    // Exits after a few seconds and is restarted: Always pulls again.
    fake.create_pod(pull_pod(
        "always",
        &moving,
        Some("Always"),
        &["regcred"],
        "sleep 4",
    ));

    // Pull on first use with the right secret; the pulled image's digest
    // is the container's imageID.
    let st = wait_running(&fake, "first", SETTLE);
    let image_id = at(&st, "/imageID");
    assert!(
        image_id.starts_with(&format!("{host}/test/"))
            && image_id.ends_with(&format!("@{d_busybox}")),
        "imageID {image_id:?} is not the pushed manifest {d_busybox} in {host}"
    );
    assert_eq!(at(&st, "/image"), first);
    let pulled = events(&fake, "first", "Pulled");
    assert!(
        pulled.iter().any(
            |m| m.starts_with(&format!("Successfully pulled image \"{first}\" in "))
                && m.contains(" including waiting). Image size: ")
        ),
        "Pulled events of first: {pulled:?}"
    );
    assert_eq!(
        events(&fake, "first", "Pulling"),
        [format!("Pulling image \"{first}\"")]
    );

    // Always: the tag moves to another image while the container runs; its
    // restart pulls again and runs the new one.
    let st = wait_running(&fake, "always", SETTLE);
    assert!(
        at(&st, "/imageID").ends_with(&format!("@{d_busybox}")),
        "{st}"
    );
    let d_pause = reg.push(&pause, "test/moving", "1");
    assert_ne!(d_pause, d_busybox);
    wait_until(SETTLE, "always restarts from the re-pushed tag", || {
        let st = cstatus(&fake, "always");
        st["restartCount"].as_i64().unwrap_or(0) >= 1
            && at(&st, "/imageID").ends_with(&format!("@{d_pause}"))
    });
    // A missing image with policy Never: no pull, ErrImageNeverPull.
    let msg = wait_waiting(&fake, "never", "ErrImageNeverPull", SETTLE);
    assert_eq!(
        msg,
        format!("Container image \"{absent}\" is not present with pull policy of Never")
    );
    assert!(events(&fake, "never", "Pulling").is_empty());

    // A wrong password: ErrImagePull, then ImagePullBackOff naming it.
    let msg = wait_waiting(&fake, "wrong", "ImagePullBackOff", SETTLE);
    assert!(
        msg.starts_with(&format!(
            "Back-off pulling image \"{wrong_img}\": ErrImagePull: "
        )) && msg.contains("401 Unauthorized"),
        "ImagePullBackOff message: {msg:?}"
    );
    let failed = events(&fake, "wrong", "Failed");
    assert!(
        failed.iter().any(|m| m == "Error: ErrImagePull")
            && failed.iter().any(|m| m
                .starts_with(&format!("Failed to pull image \"{wrong_img}\": "))
                && m.contains("401 Unauthorized")),
        "Failed events of wrong: {failed:?}"
    );
    assert!(
        events(&fake, "wrong", "BackOff")
            .contains(&format!("Back-off pulling image \"{wrong_img}\"")),
        "BackOff events: {:?}",
        events(&fake, "wrong", "BackOff")
    );

    // A secret that does not exist yet: pulled without it (401) and backing
    // off; once the secret exists the next pull works.
    wait_waiting(&fake, "later", "ImagePullBackOff", SETTLE);
    let missing = events(&fake, "later", "FailedToRetrieveImagePullSecret");
    assert_eq!(
        missing.first().map(String::as_str),
        Some("Unable to retrieve some image pull secrets (late); attempting to pull the image may not succeed."),
        "{missing:?}"
    );
    let created = Instant::now();
    fake.create_secret(NS, "late", &[(".dockerconfigjson", &right)]);
    wait_running(&fake, "later", SETTLE);
    eprintln!(
        "later runs {:.1}s after its secret was created",
        created.elapsed().as_secs_f64()
    );

    let pulls = events(&fake, "always", "Pulling");
    assert!(!pulls.is_empty(), "{pulls:?}");
}

/// Builds an image of its own (another ID than the test images) tagged
/// `spare` and imports it into `ctd`, unused by any container.
pub(crate) fn import_spare_image(ctd: &PrivateContainerd, spare: &str) {
    let out = std::process::Command::new("bash")
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/packaging/oci-image.sh"
        ))
        .arg(ctd.dir())
        .arg(spare)
        .output()
        .expect("running oci-image.sh");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let tar = String::from_utf8_lossy(&out.stdout).trim().to_string();
    ctd.ctr(&[
        "images",
        "import",
        "--snapshotter",
        &ctd.snapshotter(),
        &tar,
    ]);
}

/// Image GC on real containerd: with the image filesystem "full" (a 1%
/// high threshold), an unused image is removed; the image a running pod
/// uses and the runtime's sandbox image stay, and the pod is untouched.
#[test]
fn image_gc_removes_an_unused_image_and_keeps_used_and_sandbox_images() {
    let ctd = PrivateContainerd::start();
    let spare = "docker.io/tinylet/spare:1";
    import_spare_image(&ctd, spare);
    let images = |ctd: &PrivateContainerd| ctd.ctr(&["images", "ls", "-q"]);
    assert!(images(&ctd).contains(spare), "{}", images(&ctd));

    let mut kubelet = Tinylet::start(&ctd, NODE);
    crate::support::containerd::write_manifest(
        &kubelet.manifest_dir(),
        "web.yaml",
        &crate::e2e::yaml_pod("web", LONG_RUNNING, ""),
    );
    let web = kubelet.pod_name("web");
    wait_until(SETTLE, "web runs", || ctd.pod_running(&web, &["app"]));
    let before = ctd.container_ids(&web);

    kubelet.restart_with(&[
        "--image-gc-high-threshold",
        "1",
        "--image-gc-low-threshold",
        "0",
        "--minimum-image-ttl-duration",
        "0s",
    ]);
    wait_until(SETTLE, "the unused image is removed", || {
        !images(&ctd).contains(spare)
    });
    let left = images(&ctd);
    for kept in [BUSYBOX_IMAGE, "docker.io/tinylet/pause:1"] {
        assert!(left.contains(kept), "{kept} was removed: {left}");
    }
    assert!(ctd.pod_running(&web, &["app"]));
    assert_eq!(ctd.container_ids(&web), before, "the pod was left alone");
    kubelet.assert_running();
}
