//! The real `tinylet` binary against the fake CRI server: flags, start-up
//! with the runtime down, bad manifests, restart adoption and shutdown, with
//! every CRI call counted.

use std::fs;
use std::process::Command;
use std::time::{Duration, Instant};

use protobuf::EnumOrUnknown;
use tinylet::cri::api;

use crate::support::agent::{running_containers, Agent};
use crate::support::containerd::write_manifest;
use crate::support::fake_cri::FakeCri;

const BIN: &str = env!("CARGO_BIN_EXE_tinylet");

fn web(name: &str, cmd: &str) -> String {
    format!(
        r#"apiVersion: v1
kind: Pod
metadata:
  name: {name}
spec:
  terminationGracePeriodSeconds: 0
  containers:
  - name: app
    image: busybox:latest
    imagePullPolicy: IfNotPresent
    command: ["sh", "-c", "{cmd}"]
"#
    )
}

fn run_cmd(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(BIN).args(args).output().expect("run tinylet");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn flags_help_version_and_errors() {
    let (code, out, _) = run_cmd(&["--help"]);
    assert_eq!(code, 0);
    assert!(out.contains("--pod-manifest-path"), "{out}");
    let (code, out, _) = run_cmd(&["--version"]);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(code, 0);
    assert_eq!(
        lines.first(),
        Some(&tinylet::version::long().as_str()),
        "{out}"
    );
    assert!(
        out.starts_with(concat!("tinylet ", env!("CARGO_PKG_VERSION"), " (commit ")),
        "{out}"
    );
    assert_eq!(lines.len(), 2, "{out}");
    assert!(lines[1].starts_with("Kubernetes v"), "{out}");
    let (code, _, err) = run_cmd(&["--no-such-flag"]);
    assert_eq!(code, 2);
    assert!(err.contains("unknown flag --no-such-flag"), "{err}");
    let (code, _, err) = run_cmd(&["--sync-frequency", "often"]);
    assert_eq!(code, 2);
    assert!(err.contains("--sync-frequency"), "{err}");
    // A manifest path that is neither a file nor a directory is refused.
    let (code, _, err) = run_cmd(&[
        "--pod-manifest-path",
        "/dev/null",
        "--hostname-override",
        "n",
    ]);
    assert_ne!(code, 0);
    assert!(err.contains("/dev/null"), "{err}");
}

/// `tinylet --version | grep -q ...` and `--help | head -1`: a reader that
/// is gone before the output is written ends the command quietly, with
/// success, not with a panic about a broken pipe.
#[test]
fn help_and_version_into_a_closed_pipe_exit_quietly() {
    for arg in ["--version", "--help"] {
        let (reader, writer) = std::io::pipe().expect("a pipe");
        drop(reader);
        let out = Command::new(BIN)
            .arg(arg)
            .stdout(writer)
            .stderr(std::process::Stdio::piped())
            .output()
            .expect("run tinylet");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{arg}: {err}");
        assert!(err.is_empty(), "{arg} wrote to stderr: {err}");
    }
}

/// kubeadm's preflight runs `kubelet --version` and matches the whole output
/// against `Kubernetes vX.Y.Z`; the version is the operator's, from the
/// environment or the defaults file, and the same one the Node reports.
#[test]
fn run_as_kubelet_version_is_the_one_line_kubeadm_parses() {
    let dir = tempfile::tempdir().unwrap();
    let link = dir.path().join("kubelet");
    std::os::unix::fs::symlink(BIN, &link).unwrap();
    let version = |var: Option<&str>| {
        let mut cmd = Command::new(&link);
        cmd.arg("--version");
        match var {
            Some(v) => cmd.env(tinylet::version::KUBELET_VERSION_VAR, v),
            None => cmd.env_remove(tinylet::version::KUBELET_VERSION_VAR),
        };
        let out = cmd.output().expect("run kubelet link");
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (code, out, _) = version(Some("v1.20.15"));
    assert_eq!((code, out.as_str()), (0, "Kubernetes v1.20.15\n"));
    let (code, out, _) = version(Some("1.22.0"));
    assert_eq!((code, out.as_str()), (0, "Kubernetes v1.22.0\n"));
    // kubeadm's own regular expression, spelled out.
    let (_, out, _) = version(None);
    let v = out
        .trim()
        .strip_prefix("Kubernetes v")
        .unwrap_or_else(|| panic!("{out:?}"));
    let parts: Vec<&str> = v
        .split(['-', '+'])
        .next()
        .unwrap_or("")
        .split('.')
        .collect();
    assert!(
        parts.len() == 3 && parts.iter().all(|p| p.parse::<u32>().is_ok()),
        "{out:?}"
    );
    // A bad setting stops the run with the variable named, before anything.
    let (code, out, err) = version(Some("v1.20"));
    assert_eq!((code, out.as_str()), (2, ""));
    assert!(
        err.contains("TINYLET_KUBELET_VERSION=\"v1.20\": not a version"),
        "{err}"
    );
}

/// A unit's kubelet command line (kubeadm-flags.env and extra args): the
/// kubelet flags tinylet does not use are each named once in a warning at
/// start, and the pod runs.
#[test]
fn kubelet_flags_tinylet_does_not_use_are_warned_about_once() {
    let fake = FakeCri::start();
    let mut agent = Agent::start(
        &fake.endpoint(),
        &[
            "--container-runtime=remote",
            "--pod-infra-container-image=registry.k8s.io/pause:3.9",
            "--network-plugin=cni",
            "--fail-swap-on=false",
            "--cgroup-driver=cgroupfs",
            "--network-plugin",
            "cni",
            "--make-iptables-util-chains",
        ],
    );
    write_manifest(&agent.manifests(), "web.yaml", &web("web", "sleep 1000"));
    agent.wait("web runs", || running_containers(&fake, "web-edge-1") == 1);
    let log = agent.log();
    for flag in [
        "container-runtime",
        "pod-infra-container-image",
        "network-plugin",
        "fail-swap-on",
        "make-iptables-util-chains",
    ] {
        let line = format!("flag --{flag}: a kubelet flag tinylet does not use; ignored");
        assert_eq!(log.matches(&line).count(), 1, "{line:?} in\n{log}");
    }
    assert_eq!(
        log.matches("a kubelet flag tinylet does not use").count(),
        5,
        "{log}"
    );
}

#[test]
fn pod_runs_once_and_a_restarted_agent_adopts_it() {
    let fake = FakeCri::start();
    let mut agent = Agent::start(&fake.endpoint(), &[]);
    write_manifest(&agent.manifests(), "web.yaml", &web("web", "sleep 1000"));
    agent.wait("web runs", || running_containers(&fake, "web-edge-1") == 1);
    assert_eq!(fake.count("RunPodSandbox"), 1);
    let sandbox = &fake.sandboxes()[0];
    assert_eq!(
        sandbox
            .labels
            .get("io.kubernetes.pod.namespace")
            .map(String::as_str),
        Some("default")
    );
    let uid = sandbox
        .labels
        .get("io.kubernetes.pod.uid")
        .cloned()
        .unwrap_or_default();
    assert_eq!(
        uid.len(),
        32,
        "static pod UID is an MD5 hex digest: {uid:?}"
    );

    // SIGKILL, then start again: the pod is adopted, nothing is recreated.
    agent.kill();
    fake.clear_calls();
    agent.spawn();
    agent.wait("the agent relisted", || fake.count("ListContainers") >= 3);
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(fake.count("RunPodSandbox"), 0, "{:?}", fake.calls());
    assert_eq!(fake.count("CreateContainer"), 0, "{:?}", fake.calls());
    assert_eq!(fake.count("StopContainer"), 0, "{:?}", fake.calls());
    assert_eq!(running_containers(&fake, "web-edge-1"), 1);

    // SIGTERM: a clean exit that leaves the containers running.
    let status = agent.terminate();
    assert!(status.success(), "exit status {status}\n{}", agent.log());
    assert_eq!(fake.count("StopContainer"), 0);
    assert_eq!(fake.count("StopPodSandbox"), 0);
    assert_eq!(running_containers(&fake, "web-edge-1"), 1);
}

#[test]
fn runtime_down_at_start_is_retried_not_fatal() {
    let fake = FakeCri::start();
    fake.stop_server();
    let mut agent = Agent::start(&fake.endpoint(), &[]);
    write_manifest(&agent.manifests(), "web.yaml", &web("web", "sleep 1000"));
    let log = agent.log_path();
    agent.wait("a retry is logged", || {
        fs::read_to_string(&log)
            .unwrap_or_default()
            .contains("container runtime not ready")
    });
    assert!(agent.running());
    fake.start_server();
    agent.wait("web runs once the runtime is up", || {
        running_containers(&fake, "web-edge-1") == 1
    });
}

#[test]
fn a_bad_manifest_is_named_and_skipped() {
    let fake = FakeCri::start();
    let mut agent = Agent::start(&fake.endpoint(), &[]);
    let dir = agent.manifests();
    write_manifest(&dir, "bad.yaml", "apiVersion: v1\nkind: Pod\nmetadata: {name: bad}\nspec:\n  containers:\n  - name: app\n    image: busybox\n    command: [sleep, 3600]\n");
    write_manifest(&dir, "broken.json", "{\"kind\": \"Pod\", ");
    write_manifest(&dir, "good.yaml", &web("good", "sleep 1000"));
    agent.wait("good runs", || {
        running_containers(&fake, "good-edge-1") == 1
    });
    let log = agent.log();
    assert!(log.contains("bad.yaml"), "log names the bad file:\n{log}");
    assert!(
        log.contains("broken.json"),
        "log names the broken file:\n{log}"
    );
    assert_eq!(
        fake.count("RunPodSandbox"),
        1,
        "only the good pod runs: {:?}",
        fake.calls()
    );
    assert!(agent.running());
}

/// Manifests meant to hurt, each refused with a reason naming what is
/// wrong, while a good pod beside them runs and nothing else starts.
#[test]
fn a_hostile_corpus_is_refused_file_by_file_and_a_good_pod_runs() {
    let fake = FakeCri::start();
    let mut agent = Agent::start(&fake.endpoint(), &[]);
    let dir = agent.manifests();
    let mut x: u32 = 0x9e37_79b9;
    let garbage: Vec<u8> = (0..64 * 1024)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x as u8
        })
        .collect();
    let nest = format!("{}{}", "[".repeat(50_000), "]".repeat(50_000));
    let mut bomb = String::from(
        "apiVersion: v1\nkind: Pod\nmetadata: {name: bomb}\nx0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n",
    );
    for i in 1..10 {
        let refs = vec![format!("*a{}", i - 1); 9].join(", ");
        bomb.push_str(&format!("x{i}: &a{i} [{refs}]\n"));
    }
    let huge = format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: huge, annotations: {{a: \"{}\"}}}}\n",
        "x".repeat(11 << 20)
    );
    let many: Vec<String> = (0..5000)
        .map(|i| format!("  - {{name: c{i}, image: busybox}}\n"))
        .collect();
    let many = format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: many}}\nspec:\n  containers:\n{}",
        many.concat()
    );
    let corpus: Vec<(&str, Vec<u8>, &str)> = vec![
        ("garbage.yaml", garbage, "not UTF-8"),
        (
            "many.yaml",
            many.into_bytes(),
            "spec.containers: Too many: 5000: must have at most 250 items",
        ),
        ("huge.yaml", huge.into_bytes(), "over the limit"),
        (
            "deep.json",
            format!(r#"{{"apiVersion":"v1","kind":"Pod","metadata":{{"name":"deep"}},"spec":{nest}}}"#)
                .into_bytes(),
            "recursion limit",
        ),
        (
            "deep.yaml",
            format!("apiVersion: v1\nkind: Pod\nmetadata: {{name: deepy}}\nspec: {nest}\n").into_bytes(),
            "recursion limit",
        ),
        ("bomb.yaml", bomb.into_bytes(), "budget"),
        (
            "dupkeys.yaml",
            b"apiVersion: v1\nkind: Pod\nmetadata: {name: dup}\nmetadata: {name: dup2}\nspec: {containers: [{name: a, image: busybox}]}\n".to_vec(),
            "duplicate mapping key: metadata",
        ),
        (
            "types.yaml",
            b"apiVersion: v1\nkind: Pod\nmetadata: {name: [1, 2]}\nspec: {containers: nope}\n".to_vec(),
            "metadata.name: invalid type",
        ),
        (
            "name.yaml",
            b"apiVersion: v1\nkind: Pod\nmetadata: {name: Bad_Name!}\nspec: {containers: [{name: a, image: busybox}]}\n".to_vec(),
            "metadata.name: Invalid value",
        ),
        (
            "traverse.yaml",
            b"apiVersion: v1\nkind: Pod\nmetadata: {name: ../../etc}\nspec: {containers: [{name: a, image: busybox}]}\n".to_vec(),
            "metadata.name: Invalid value",
        ),
    ];
    for (name, bytes, _) in &corpus {
        let dot = dir.join(format!(".{name}"));
        fs::write(&dot, bytes).unwrap();
        fs::rename(&dot, dir.join(name)).unwrap();
    }
    write_manifest(&dir, "good.yaml", &web("good", "sleep 1000"));
    agent.wait("good runs", || {
        running_containers(&fake, "good-edge-1") == 1
    });
    let log_path = agent.log_path();
    agent.wait("every hostile file is named with its reason", || {
        let log = fs::read_to_string(&log_path).unwrap_or_default();
        corpus.iter().all(|(name, _, why)| {
            log.lines().any(|l| {
                l.contains("skipping static pod manifest")
                    && l.contains(&format!("/{name}: "))
                    && l.contains(why)
            })
        })
    });
    assert_eq!(
        fake.count("RunPodSandbox"),
        1,
        "only the good pod runs: {:?}",
        fake.calls()
    );
    assert!(agent.running());
    assert!(!agent.log().contains("panicked"), "{}", agent.log());
}

#[test]
fn a_crashing_container_restarts_with_back_off_and_a_removed_pod_is_torn_down() {
    let fake = FakeCri::start();
    let mut agent = Agent::start(&fake.endpoint(), &[]);
    write_manifest(
        &agent.manifests(),
        "crash.yaml",
        &web("crash", "sleep 1000"),
    );
    agent.wait("crash runs", || {
        running_containers(&fake, "crash-edge-1") == 1
    });

    let first = fake.containers_named("app")[0].id.clone();
    fake.exit_container(&first, 3);
    // The first restart is immediate (upstream: no back-off before it).
    let running_other = || {
        fake.containers_named("app")
            .into_iter()
            .find(|c| {
                c.id != first
                    && c.state == EnumOrUnknown::new(api::ContainerState::CONTAINER_RUNNING)
            })
            .map(|c| c.id)
    };
    agent.wait("first restart", || running_other().is_some());
    assert_eq!(fake.count("CreateContainer"), 2);
    let second = running_other().expect("a second, running container");
    let attempt = fake
        .containers_named("app")
        .iter()
        .find(|c| c.id == second)
        .and_then(|c| c.metadata.as_ref().map(|m| m.attempt));
    assert_eq!(attempt, Some(1));
    fake.exit_container(&second, 3);
    // The second exit falls in the 10 s back-off window: no restart for a while.
    let quiet_until = Instant::now() + Duration::from_secs(7);
    while Instant::now() < quiet_until {
        assert_eq!(
            fake.count("CreateContainer"),
            2,
            "restarted inside the back-off\n{}",
            agent.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(agent.log().contains("back-off"), "{}", agent.log());

    fs::remove_file(agent.manifests().join("crash.yaml")).expect("remove manifest");
    agent.wait("pod removed", || {
        fake.sandboxes().is_empty() && fake.containers().is_empty()
    });
}

#[test]
fn image_gc_removes_unused_images_but_never_used_pinned_or_sandbox_ones() {
    let fake = FakeCri::start();
    fake.add_images(
        &["docker.io/library/old:1", "docker.io/library/older:1"],
        false,
    );
    fake.add_images(&["docker.io/library/keep-me:1"], true);
    fake.set_sandbox_image("registry.k8s.io/pause:3.9");
    let mut agent = Agent::start(&fake.endpoint(), &[]);
    write_manifest(&agent.manifests(), "web.yaml", &web("web", "sleep 1000"));
    agent.wait("web runs", || running_containers(&fake, "web-edge-1") == 1);
    let container = fake.containers_named("app")[0].id.clone();

    // Any use of the disk is above a 1% high threshold: everything that may
    // go, goes (down to 0%).
    agent.restart_with(&[
        "--image-gc-high-threshold",
        "1",
        "--image-gc-low-threshold",
        "0",
        "--minimum-image-ttl-duration",
        "0s",
    ]);
    let tags = |fake: &FakeCri| -> Vec<String> {
        let mut t: Vec<String> = fake
            .images()
            .into_iter()
            .flat_map(|i| i.repo_tags)
            .collect();
        t.sort();
        t
    };
    agent.wait("the unused images are removed", || {
        let t = tags(&fake);
        !t.iter().any(|i| i.contains("old") || i.contains("nginx"))
    });
    let left = tags(&fake);
    for kept in [
        "docker.io/library/busybox:latest",
        "docker.io/library/keep-me:1",
        "registry.k8s.io/pause:3.9",
    ] {
        assert!(left.iter().any(|t| t == kept), "{kept} removed: {left:?}");
    }
    assert_eq!(
        fake.count("RemoveImage"),
        3,
        "{:?}",
        fake.calls_to("RemoveImage")
    );
    assert_eq!(
        fake.containers_named("app")[0].id,
        container,
        "the pod's container was left alone"
    );

    // Bad thresholds are refused at start, naming the flags.
    let (code, _, err) = run_cmd(&[
        "--image-gc-high-threshold",
        "70",
        "--image-gc-low-threshold",
        "80",
    ]);
    assert_ne!(code, 0);
    assert!(
        err.contains("--image-gc-low-threshold 80 must be less than --image-gc-high-threshold 70"),
        "{err}"
    );
}

/// A static pod's YAML with `uid` (none when empty), and `volumes` (YAML
/// flow list) mounted by its container.
fn pod_with(name: &str, uid: &str, volumes: &str, mounts: &str) -> String {
    let uid = if uid.is_empty() {
        String::new()
    } else {
        format!("\n  uid: {uid:?}")
    };
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}{uid}\nspec:\n  terminationGracePeriodSeconds: 0\n  volumes: {volumes}\n  containers:\n  - name: app\n    image: busybox:latest\n    imagePullPolicy: IfNotPresent\n    command: [sleep, \"1000\"]\n    volumeMounts: {mounts}\n"
    )
}

/// The UID the runtime's sandbox of `pod` carries.
fn sandbox_uid(fake: &FakeCri, pod: &str) -> Option<String> {
    fake.sandboxes()
        .iter()
        .find(|s| s.labels.get("io.kubernetes.pod.name").map(String::as_str) == Some(pod))
        .and_then(|s| s.labels.get("io.kubernetes.pod.uid").cloned())
}

/// Pod UIDs and volume names that would make paths outside the pod's own
/// directories (`..` is the root dir itself, `/` the host's root, a volume
/// named `/etc` the host's /etc) are refused file by file with the field
/// named; removing their manifests afterwards touches nothing, and a
/// bystander's emptyDir data, the root dir and the host directory named by
/// a volume stay as they were. (The host directory is a stand-in in the
/// test's temp dir: the same absolute-name attack as `/etc`, which is in
/// the corpus too, but one whose damage a broken build would do to the
/// test alone.)
#[test]
fn uids_and_volume_names_that_leave_their_directories_are_refused() {
    let fake = FakeCri::start();
    let mut agent = Agent::start(&fake.endpoint(), &[]);
    let dir = agent.manifests();
    let root = agent.root_dir();
    let base = root.parent().expect("root has a parent").to_path_buf();
    write_manifest(
        &dir,
        "bystander.yaml",
        &pod_with(
            "bystander",
            "",
            "[{name: data, emptyDir: {}}]",
            "[{name: data, mountPath: /data}]",
        ),
    );
    agent.wait("the bystander runs", || {
        running_containers(&fake, "bystander-edge-1") == 1
    });
    let uid = sandbox_uid(&fake, "bystander-edge-1").expect("bystander's UID");
    let data = root
        .join("pods")
        .join(&uid)
        .join("volumes/kubernetes.io~empty-dir/data");
    fs::write(data.join("keep"), "precious").expect("write into the bystander's emptyDir");

    let host = base.join("host-etc");
    fs::create_dir(&host).unwrap();
    fs::write(host.join("passwd"), "root:x:0:0").unwrap();
    std::os::unix::fs::symlink("passwd", host.join("link")).unwrap();
    let host_name = host.display().to_string();

    let downward = |name: &str| {
        format!("[{{name: {name:?}, downwardAPI: {{items: [{{path: name, fieldRef: {{fieldPath: metadata.name}}}}]}}}}]")
    };
    let mount = |name: &str| format!("[{{name: {name:?}, mountPath: /v}}]");
    let corpus: Vec<(&str, String, &str)> = vec![
        (
            "uid-dotdot.yaml",
            pod_with("dotdot", "..", "[]", "[]"),
            "metadata.uid",
        ),
        (
            "uid-root.yaml",
            pod_with("slash", "/", "[]", "[]"),
            "metadata.uid",
        ),
        (
            "uid-nested.yaml",
            pod_with("nested", "a/b", "[]", "[]"),
            "metadata.uid",
        ),
        (
            "vol-etc.yaml",
            pod_with("voletc", "", &downward("/etc"), &mount("/etc")),
            "spec.volumes[0].name",
        ),
        (
            "vol-host.yaml",
            pod_with("volhost", "", &downward(&host_name), &mount(&host_name)),
            "spec.volumes[0].name",
        ),
        (
            "vol-up.yaml",
            pod_with(
                "volup",
                "",
                "[{name: ../x, emptyDir: {}}]",
                "[{name: ../x, mountPath: /v}]",
            ),
            "spec.volumes[0].name",
        ),
        (
            "vol-nested.yaml",
            pod_with(
                "volnested",
                "",
                "[{name: a/b, emptyDir: {}}]",
                "[{name: a/b, mountPath: /v}]",
            ),
            "spec.volumes[0].name",
        ),
    ];
    for (name, yaml, _) in &corpus {
        write_manifest(&dir, name, yaml);
    }
    let log_path = agent.log_path();
    agent.wait("every hostile file is named with the field", || {
        let log = fs::read_to_string(&log_path).unwrap_or_default();
        corpus.iter().all(|(name, _, field)| {
            log.lines().any(|l| {
                l.contains("skipping static pod manifest")
                    && l.contains(&format!("/{name}: "))
                    && l.contains(field)
            })
        })
    });
    // Gone again: a pod that had run would be torn down now.
    for (name, _, _) in &corpus {
        fs::remove_file(dir.join(name)).unwrap();
    }
    let end = Instant::now() + Duration::from_secs(4);
    while Instant::now() < end {
        assert_eq!(running_containers(&fake, "bystander-edge-1"), 1);
        assert_eq!(
            fs::read_to_string(data.join("keep")).ok().as_deref(),
            Some("precious"),
            "the bystander's data\n{}",
            agent.log()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(
        fake.count("RunPodSandbox"),
        1,
        "only the bystander runs: {:?}",
        fake.calls()
    );
    assert!(root.join("pods").join(&uid).is_dir());
    let mut left: Vec<String> = fs::read_dir(&host)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    left.sort();
    assert_eq!(left, ["link", "passwd"], "the host directory is untouched");
    assert_eq!(fs::read_to_string(host.join("link")).unwrap(), "root:x:0:0");
    assert!(agent.running());
    assert!(!agent.log().contains("panicked"), "{}", agent.log());
}

/// Under umask 000 the root dir and pod dirs are still 0750, a tmpfs
/// volume (projected) and the atomic writer's directories 0755, the
/// files the modes their spec gives, log directories 0755: never wider.
#[test]
fn modes_hold_whatever_the_umask() {
    use std::os::unix::fs::MetadataExt;
    let fake = FakeCri::start();
    let mut agent = Agent::start_with_umask(&fake.endpoint(), &[], 0o000);
    let volumes = "[{name: info, projected: {sources: [{downwardAPI: {items: [{path: name, fieldRef: {fieldPath: metadata.name}}, {path: sub/ns, mode: 0400, fieldRef: {fieldPath: metadata.namespace}}]}}]}}, {name: plain, downwardAPI: {items: [{path: name, fieldRef: {fieldPath: metadata.name}}]}}]";
    let mounts = "[{name: info, mountPath: /info}, {name: plain, mountPath: /plain}]";
    write_manifest(
        &agent.manifests(),
        "modes.yaml",
        &pod_with("modes", "", volumes, mounts),
    );
    agent.wait("the pod runs", || {
        running_containers(&fake, "modes-edge-1") == 1
    });
    let uid = sandbox_uid(&fake, "modes-edge-1").expect("the pod's UID");
    let root = agent.root_dir();
    let pod = root.join("pods").join(&uid);
    let vols = pod.join("volumes");
    let mode = |p: &std::path::Path| {
        fs::symlink_metadata(p)
            .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
            .mode()
            & 0o7777
    };
    let logs = root.parent().unwrap().join("logs");
    let pod_logs = fs::read_dir(&logs)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.to_string_lossy().contains(&uid))
        .expect("the pod's log directory");
    let expected = [
        (root.clone(), 0o750),
        (root.join("pods"), 0o750),
        (pod.clone(), 0o750),
        (vols.clone(), 0o750),
        (vols.join("kubernetes.io~projected"), 0o750),
        (vols.join("kubernetes.io~projected/info"), 0o755),
        (vols.join("kubernetes.io~projected/info/..data/"), 0o755),
        (vols.join("kubernetes.io~projected/info/..data/sub"), 0o755),
        (vols.join("kubernetes.io~projected/info/..data/name"), 0o644),
        (
            vols.join("kubernetes.io~projected/info/..data/sub/ns"),
            0o400,
        ),
        (vols.join("kubernetes.io~downward-api/plain"), 0o755),
        (vols.join("kubernetes.io~downward-api/plain/..data/"), 0o755),
        (
            vols.join("kubernetes.io~downward-api/plain/..data/name"),
            0o644,
        ),
        (pod.join("etc-hosts"), 0o644),
        (pod.join("containers"), 0o750),
        (pod.join("containers/app"), 0o750),
        (pod_logs.clone(), 0o755),
        (pod_logs.join("app"), 0o755),
    ];
    let wrong: Vec<String> = expected
        .iter()
        .filter(|(p, m)| mode(p) != *m)
        .map(|(p, m)| format!("{}: {:o}, want {m:o}", p.display(), mode(p)))
        .collect();
    assert!(wrong.is_empty(), "{wrong:#?}");
    assert!(
        tinylet::mount::is_mount_point(&vols.join("kubernetes.io~projected/info")).unwrap(),
        "the projected volume is a tmpfs"
    );
}

/// The soft and hard open files limits of `pid`, from `/proc/<pid>/limits`.
fn open_files_limits(pid: u32) -> (u64, u64) {
    let text = fs::read_to_string(format!("/proc/{pid}/limits")).expect("limits");
    let line = text
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .expect("Max open files");
    let mut numbers = line
        .split_whitespace()
        .filter_map(|w| w.parse::<u64>().ok());
    (numbers.next().unwrap(), numbers.next().unwrap())
}

/// `--max-open-files` was accepted and ignored, so under
/// systemd's soft limit of 1024 the agent ran out of descriptors. Started
/// from 1024, it raises its soft limit to the flag's value, or to the hard
/// limit when that is lower (the default, 1,000,000, is over most).
#[test]
fn the_open_files_limit_is_raised_to_max_open_files_capped_at_the_hard_limit() {
    let fake = FakeCri::start();
    let (_, hard) = open_files_limits(std::process::id());
    let wanted = 4096.min(hard);
    let mut agent = Agent::start_after(
        &fake.endpoint(),
        &["--max-open-files", &wanted.to_string()],
        "ulimit -Sn 1024",
    );
    let pid = agent.pid().expect("running");
    let line = format!("open files limit: {wanted} (was 1024");
    let log = agent.log_path();
    agent.wait("the limit is logged", || log_has(&log, &line));
    assert_eq!(open_files_limits(pid), (wanted, hard));

    let mut agent = Agent::start_after(&fake.endpoint(), &[], "ulimit -Sn 1024");
    let pid = agent.pid().expect("running");
    let want = 1_000_000.min(hard);
    let line = format!("open files limit: {want} (was 1024");
    let log = agent.log_path();
    agent.wait("the default limit is logged", || log_has(&log, &line));
    assert_eq!(open_files_limits(pid), (want, hard));
}

fn log_has(log: &std::path::Path, needle: &str) -> bool {
    fs::read_to_string(log).is_ok_and(|text| text.contains(needle))
}

/// CPU seconds (user and system) the process `pid` has used.
fn cpu_seconds(pid: u32) -> f64 {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).expect("read /proc/PID/stat");
    // The fields after the command name, which is in parentheses.
    let rest = &stat[stat.rfind(')').expect("stat has a command") + 2..];
    let fields: Vec<&str> = rest.split(' ').collect();
    // utime and stime are the 14th and 15th fields, in USER_HZ (100) ticks.
    let ticks: u64 =
        fields[11].parse::<u64>().expect("utime") + fields[12].parse::<u64>().expect("stime");
    ticks as f64 / 100.0
}

/// Sandboxes the runtime keeps listing, not ready and without containers
/// (their containers removed under CRI's feet, as `ctr containers rm`
/// does), whose removal the runtime answers but does not do: tinylet
/// removes each once, tries again a minute later, and logs each once (and
/// the one retry once), instead of stopping and "removing" them at every
/// housekeeping; over a minute it uses under 1% of a core.
#[test]
fn leftover_sandboxes_that_stay_are_tried_again_with_back_off_not_every_housekeeping() {
    const PODS: usize = 20;
    let fake = FakeCri::start();
    let mut agent = Agent::start(&fake.endpoint(), &[]);
    for i in 0..PODS {
        write_manifest(
            &agent.manifests(),
            &format!("p{i}.yaml"),
            &web(&format!("p{i}"), "sleep 1000"),
        );
    }
    agent.wait("every pod runs", || {
        (0..PODS).all(|i| running_containers(&fake, &format!("p{i}-edge-1")) == 1)
    });
    // Stopped (the pods keep running), their manifests removed, and the
    // runtime left holding what the issue saw.
    assert!(agent.terminate().success());
    for i in 0..PODS {
        fs::remove_file(agent.manifests().join(format!("p{i}.yaml"))).expect("remove manifest");
    }
    for sb in fake.sandboxes() {
        fake.strand_sandbox(&sb.id);
    }
    fake.keep_removed_sandboxes(true);
    assert!(fake.containers().is_empty());
    fake.clear_calls();
    let log_before = agent.log().len();

    agent.spawn();
    let pid = agent.pid().expect("running");
    agent.wait("every leftover is removed once", || {
        fake.count("RemovePodSandbox") >= PODS
    });
    let started = Instant::now();
    let cpu_start = cpu_seconds(pid);
    std::thread::sleep(Duration::from_secs(62));
    let cpu = cpu_seconds(pid) - cpu_start;
    let window = started.elapsed().as_secs_f64();
    assert!(agent.running(), "tinylet exited\n{}", agent.log());

    let removals = fake.count("RemovePodSandbox");
    let stops = fake.count("StopPodSandbox");
    let log = agent.log()[log_before..].to_string();
    let found = log.matches("is left in the runtime").count();
    let stayed = log.matches("is still in the runtime").count();
    let old_line = log.matches("runs but no source has it").count();
    assert_eq!(
        fake.sandboxes().len(),
        PODS,
        "the runtime still lists them all"
    );
    // Once at start-up, and at most once more a minute later: not every 2 s
    // (which would be 30 tries each).
    assert!(
        (PODS..=2 * PODS).contains(&removals) && stops <= 2 * PODS,
        "{removals} removals and {stops} stops of {PODS} leftover sandboxes in {window:.0} s\n{log}"
    );
    assert_eq!(
        found, PODS,
        "each leftover is logged once when found\n{log}"
    );
    assert!(
        stayed <= PODS,
        "the retry is logged once a pod: {stayed} lines\n{log}"
    );
    assert_eq!(
        old_line, 0,
        "a sandbox that is not ready is not a running pod\n{log}"
    );
    assert!(
        cpu < 0.01 * window,
        "tinylet used {cpu:.2} s of CPU in {window:.0} s beside {PODS} leftovers (over 1% of a core)"
    );
}
