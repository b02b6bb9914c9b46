//! `--runonce` against the fake CRI server: the local pods are started
//! once, one line per pod is printed, the exit code says whether all run,
//! and the containers stay.

use std::process::Command;

use crate::e2e::{yaml_pod, LONG_RUNNING, NODE, SETTLE};
use crate::support::agent::{running_containers, Agent};
use crate::support::containerd::{write_manifest, PrivateContainerd, Tinylet};
use crate::support::fake_cri::FakeCri;

const BIN: &str = env!("CARGO_BIN_EXE_tinylet");

fn pod(name: &str, image: &str, policy: &str) -> String {
    format!(
        r#"apiVersion: v1
kind: Pod
metadata:
  name: {name}
spec:
  restartPolicy: {policy}
  terminationGracePeriodSeconds: 0
  containers:
  - name: app
    image: {image}
    imagePullPolicy: IfNotPresent
    command: ["sleep", "3600"]
"#
    )
}

/// The binary's stdout lines among its log (log lines carry a timestamp
/// and a level; the report's lines are `<namespace>/<name>: ...`).
fn report(agent: &Agent) -> Vec<String> {
    agent
        .log()
        .lines()
        .filter(|l| l.starts_with("default/"))
        .map(str::to_string)
        .collect()
}

/// Starts `--runonce` on the manifests in `dir` (not the agent's own dir,
/// which is empty at start).
fn runonce(fake: &FakeCri, dir: &std::path::Path, extra: &[&str]) -> Agent {
    let mut args = vec![
        "--runonce",
        "--pod-manifest-path",
        dir.to_str().expect("utf-8 path"),
        "--runonce-timeout",
        "60s",
    ];
    args.extend_from_slice(extra);
    Agent::start(&fake.endpoint(), &args)
}

#[test]
fn runonce_starts_every_pod_reports_running_exits_0_and_leaves_them_running() {
    let fake = FakeCri::start();
    let dir = tempfile::tempdir().expect("temp dir");
    write_manifest(dir.path(), "a-web.yaml", &pod("web", "busybox", "Always"));
    write_manifest(dir.path(), "b-db.yaml", &pod("db", "nginx", "Always"));
    let mut agent = runonce(&fake, dir.path(), &[]);
    let status = agent.wait_exit();
    assert_eq!(status.code(), Some(0), "{}", agent.log());
    assert_eq!(
        report(&agent),
        ["default/web-edge-1: running", "default/db-edge-1: running"],
        "{}",
        agent.log()
    );
    // Nothing was stopped on the way out.
    assert_eq!(running_containers(&fake, "web-edge-1"), 1);
    assert_eq!(running_containers(&fake, "db-edge-1"), 1);
    assert_eq!(fake.count("StopContainer"), 0);
    assert_eq!(fake.count("StopPodSandbox"), 0);
}

#[test]
fn runonce_with_an_image_that_cannot_be_pulled_or_a_refused_pod_says_failed_and_exits_1() {
    let fake = FakeCri::start();
    let dir = tempfile::tempdir().expect("temp dir");
    write_manifest(dir.path(), "a-web.yaml", &pod("web", "busybox", "Always"));
    write_manifest(
        dir.path(),
        "b-bad.yaml",
        &pod("bad", "registry.invalid/no/such:1", "Always"),
    );
    // Refused at admission: an unsafe sysctl nobody allowed.
    let refused = pod("sys", "busybox", "Always").replace(
        "spec:\n",
        "spec:\n  securityContext:\n    sysctls:\n    - name: kernel.msgmax\n      value: \"65536\"\n",
    );
    write_manifest(dir.path(), "c-sys.yaml", &refused);
    let mut agent = runonce(&fake, dir.path(), &[]);
    let status = agent.wait_exit();
    assert_eq!(status.code(), Some(1), "{}", agent.log());
    let lines = report(&agent);
    assert_eq!(lines.len(), 3, "{lines:?}\n{}", agent.log());
    assert_eq!(lines[0], "default/web-edge-1: running");
    assert!(
        lines[1].starts_with("default/bad-edge-1: failed: container app: ErrImagePull"),
        "{lines:?}"
    );
    assert!(
        lines[2].starts_with("default/sys-edge-1: failed: SysctlForbidden"),
        "{lines:?}"
    );
    assert_eq!(running_containers(&fake, "sys-edge-1"), 0);
    assert_eq!(running_containers(&fake, "web-edge-1"), 1);
}

/// On real containerd: a container that exits 3 under restartPolicy Never
/// fails its pod; the other pod runs and stays running after the exit.
#[test]
fn e2e_runonce_reports_a_container_that_exited_under_never_as_failed() {
    let ctd = PrivateContainerd::start();
    let dir = tempfile::tempdir().expect("temp dir");
    write_manifest(dir.path(), "a-web.yaml", &yaml_pod("web", LONG_RUNNING, ""));
    write_manifest(
        dir.path(),
        "b-job.yaml",
        &yaml_pod("job", "exit 3", "  restartPolicy: Never\n"),
    );
    let manifests = dir.path().display().to_string();
    let mut tl = Tinylet::start_with(
        &ctd,
        NODE,
        &["--runonce", "--pod-manifest-path", &manifests],
    );
    let status = tl.wait_for_exit(SETTLE * 2);
    let log = tl.log_since_start();
    let lines: Vec<&str> = log.lines().filter(|l| l.starts_with("default/")).collect();
    assert_eq!(status.code(), Some(1), "{log}");
    assert_eq!(
        lines,
        [
            "default/web-edge-1: running",
            "default/job-edge-1: failed: container app exited with code 3 (Error)"
        ],
        "{log}"
    );
    assert!(ctd.pod_running("web-edge-1", &["app"]), "{log}");
}

#[test]
fn runonce_is_refused_with_a_kubeconfig_or_without_local_pods() {
    for args in [
        &[
            "--runonce",
            "--pod-manifest-path",
            "/nonexistent",
            "--kubeconfig",
            "/nonexistent/kubelet.conf",
        ][..],
        &["--runonce"][..],
    ] {
        let out = Command::new(BIN).args(args).output().expect("run tinylet");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains("--runonce"), "{err}");
    }
}

/// Serves `body` at any path to every connection (a manifest URL).
fn serve(body: String) -> u16 {
    use std::io::{BufRead, BufReader, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("addr").port();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { continue };
            let mut reader = BufReader::new(conn.try_clone().expect("clone"));
            loop {
                let mut h = String::new();
                match reader.read_line(&mut h) {
                    Ok(0) | Err(_) => break,
                    Ok(_) if h == "\r\n" => break,
                    Ok(_) => {}
                }
            }
            let _ = write!(
                conn,
                "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    port
}

#[test]
fn runonce_runs_the_pods_of_both_the_manifest_path_and_the_manifest_url() {
    let fake = FakeCri::start();
    let dir = tempfile::tempdir().expect("temp dir");
    write_manifest(dir.path(), "web.yaml", &pod("web", "busybox", "Always"));
    let port = serve(pod("remote", "nginx", "Always"));
    let url = format!("http://127.0.0.1:{port}/pods.yaml");
    let mut agent = runonce(&fake, dir.path(), &["--manifest-url", &url]);
    let status = agent.wait_exit();
    assert_eq!(status.code(), Some(0), "{}", agent.log());
    assert_eq!(
        report(&agent),
        [
            "default/web-edge-1: running",
            "default/remote-edge-1: running"
        ],
        "{}",
        agent.log()
    );
    assert_eq!(running_containers(&fake, "remote-edge-1"), 1);
}

#[test]
fn runonce_gives_up_on_a_runtime_that_never_answers_within_its_timeout() {
    let fake = FakeCri::start();
    fake.stop_server();
    let dir = tempfile::tempdir().expect("temp dir");
    write_manifest(dir.path(), "web.yaml", &pod("web", "busybox", "Always"));
    let mut agent = Agent::start(
        &fake.endpoint(),
        &[
            "--runonce",
            "--pod-manifest-path",
            dir.path().to_str().expect("utf-8 path"),
            "--runonce-timeout",
            "1s",
        ],
    );
    let status = agent.wait_exit();
    assert_eq!(status.code(), Some(1), "{}", agent.log());
    assert!(
        agent
            .log()
            .contains("container runtime not ready within --runonce-timeout"),
        "{}",
        agent.log()
    );
}
