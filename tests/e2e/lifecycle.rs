//! End-to-end tests of the container lifecycle on a real, private
//! containerd: init containers and a sidecar, postStart and preStop hooks,
//! the grace period, a spec edit restarting one container (standalone), and
//! CrashLoopBackOff and restart policies as the API status shows them
//! (cluster node against the fake apiserver).
//!
//! Containers report what they see by appending lines to a file in a
//! hostPath volume the test reads.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::{json, Value};

use crate::e2e::{LONG_RUNNING, NODE, SETTLE};
use crate::support::containerd::{
    holds_for, remove_manifest, wait_until, write_manifest, PrivateContainerd, Tinylet,
    BUSYBOX_IMAGE,
};
use crate::support::fake_apiserver::FakeApiServer;

/// A directory of the test's that pods mount at `/work`.
fn shared_dir(ctd: &PrivateContainerd) -> PathBuf {
    let dir = ctd.dir().join("shared");
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("creating {}: {e}", dir.display()));
    dir
}

/// The lines the pod's containers appended to `/work/log`.
fn log_lines(dir: &Path) -> Vec<String> {
    std::fs::read_to_string(dir.join("log"))
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect()
}

/// A busybox container `name` running `sh -c script`, with `/work` mounted,
/// plus `extra` fields.
fn container(name: &str, script: &str, extra: Value) -> Value {
    let mut c = json!({
        "name": name,
        "image": BUSYBOX_IMAGE,
        "imagePullPolicy": "IfNotPresent",
        "command": ["sh", "-c", script],
        "volumeMounts": [{"name": "work", "mountPath": "/work"}],
    });
    if let (Some(c), Some(extra)) = (c.as_object_mut(), extra.as_object()) {
        c.extend(extra.clone());
    }
    c
}

/// A static pod manifest (JSON) mounting `dir` at `/work`.
fn manifest(name: &str, dir: &Path, spec: Value) -> String {
    let mut spec = spec;
    spec["volumes"] = json!([{"name": "work", "hostPath": {"path": dir.display().to_string()}}]);
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}).to_string()
}

fn now_nanos() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as i64)
        .unwrap_or(0)
}

/// `script` that appends `start-line` to the log, then runs until SIGTERM,
/// appending `stop-line` then.
fn logged(start: &str, stop: &str) -> String {
    format!(
        "echo {start} >> /work/log; trap 'echo {stop} >> /work/log; exit 0' TERM; \
         while :; do sleep 1; done"
    )
}

/// Init containers run in order, each to its end, before the app; a
/// sidecar (restartable init container) starts first, holds the next init
/// container back until its startup probe passes, keeps running beside the
/// app, is restarted alone when it dies, and is stopped after the app.
#[test]
fn init_containers_finish_first_and_a_sidecar_outlives_them() {
    let ctd = PrivateContainerd::start();
    let mut kubelet = Tinylet::start(&ctd, NODE);
    let dir = shared_dir(&ctd);
    let pod = kubelet.pod_name("init");
    let spec = json!({
        "terminationGracePeriodSeconds": 10,
        "initContainers": [
            // The sidecar is up (its startup probe passes) 3 s after its
            // start; only then may setup start.
            container(
                "side",
                "trap 'echo side-stop >> /work/log; exit 0' TERM; echo side-start >> /work/log; \
                 sleep 3; echo side-up >> /work/log; touch /tmp/up; while :; do sleep 1; done",
                json!({
                    "restartPolicy": "Always",
                    "startupProbe": {
                        "exec": {"command": ["test", "-f", "/tmp/up"]},
                        "periodSeconds": 1,
                        "failureThreshold": 30,
                    },
                }),
            ),
            container(
                "setup",
                "echo setup-start >> /work/log; sleep 2; echo setup-done >> /work/log",
                json!({}),
            ),
        ],
        // The app stops slowly, so a sidecar stopped with it would log first.
        "containers": [container(
            "app",
            "test -f /work/log && grep -q setup-done /work/log && echo app-start >> /work/log; \
             trap 'sleep 1; echo app-stop >> /work/log; exit 0' TERM; while :; do sleep 1; done",
            json!({}),
        )],
    });
    write_manifest(
        &kubelet.manifest_dir(),
        "init.json",
        &manifest("init", &dir, spec),
    );

    wait_until(SETTLE, "init-edge-1's app and sidecar run", || {
        ctd.pod_running(&pod, &["side", "app"])
    });
    let setup = ctd.container_ids_named(&pod, "setup");
    assert_eq!(setup.len(), 1, "setup ran once: {setup:?}");
    assert_eq!(ctd.container_exit(&setup[0]).map(|e| e.1), Some(0));
    wait_until(SETTLE, "the app logs its start", || {
        log_lines(&dir).contains(&"app-start".to_string())
    });
    assert_eq!(
        log_lines(&dir),
        [
            "side-start",
            "side-up",
            "setup-start",
            "setup-done",
            "app-start"
        ],
        "order of starts: setup waits for the sidecar's startup probe"
    );

    // The sidecar dies: it alone is started again.
    let side = ctd.container_ids_named(&pod, "side")[0].clone();
    let app = ctd.container_ids_named(&pod, "app")[0].clone();
    ctd.ctr(&["tasks", "kill", "--signal", "SIGKILL", &side]);
    wait_until(SETTLE, "a new sidecar container runs", || {
        let ids = ctd.container_ids_named(&pod, "side");
        ids.iter()
            .any(|id| *id != side && ctd.task_status(id) == "RUNNING")
    });
    assert_eq!(ctd.container_ids_named(&pod, "app"), vec![app.clone()]);
    assert_eq!(ctd.task_status(&app), "RUNNING");
    assert_eq!(
        ctd.container_ids_named(&pod, "setup"),
        setup,
        "setup ran again"
    );

    // Removal: the app stops first, then the sidecar.
    remove_manifest(&kubelet.manifest_dir(), "init.json");
    wait_until(SETTLE, "init-edge-1 is removed", || ctd.pod_gone(&pod));
    let lines = log_lines(&dir);
    let at = |l: &str| lines.iter().rposition(|x| x == l);
    assert!(
        at("app-stop").is_some() && at("app-stop") < at("side-stop"),
        "the sidecar must stop after the app: {lines:?}"
    );
    kubelet.assert_running();
}

/// postStart runs right after the start; on removal preStop (an httpGet to
/// the pod) runs before SIGTERM; the grace period covers the preStop hook
/// and the rest goes to the stop, after which a container that ignores
/// SIGTERM is killed.
#[test]
fn lifecycle_hooks_run_and_the_grace_period_is_honoured() {
    let ctd = PrivateContainerd::start();
    let mut kubelet = Tinylet::start(&ctd, NODE);
    let dir = shared_dir(&ctd);
    let pod = kubelet.pod_name("hooks");
    // One HTTP answer on :8080, then a log line once the request was served.
    let serve_once = "(printf 'HTTP/1.0 200 OK\\r\\nContent-Length: 0\\r\\n\\r\\n' | \
                      nc -l -p 8080 > /work/request; echo prestop-served >> /work/log) & ";
    let spec = json!({
        "terminationGracePeriodSeconds": 6,
        "containers": [
            container(
                "app",
                &format!("{serve_once}{}", logged("start", "term")),
                json!({"lifecycle": {
                    "postStart": {"exec": {"command": ["sh", "-c", "echo poststart >> /work/log"]}},
                    "preStop": {"httpGet": {"path": "/prestop", "port": 8080}},
                }}),
            ),
            // Ignores SIGTERM: killed when the grace period ends.
            container("stubborn", "trap '' TERM; while :; do sleep 1; done", json!({})),
            // preStop takes 4 of the 6 s; StopContainer gets the other 2.
            container(
                "slowstop",
                "trap '' TERM; while :; do sleep 1; done",
                json!({"lifecycle": {"preStop": {"exec": {"command": ["sleep", "4"]}}}}),
            ),
        ],
    });
    write_manifest(
        &kubelet.manifest_dir(),
        "hooks.json",
        &manifest("hooks", &dir, spec),
    );
    wait_until(SETTLE, "hooks-edge-1 runs", || {
        ctd.pod_running(&pod, &["app", "stubborn", "slowstop"])
    });
    wait_until(SETTLE, "the postStart hook logs", || {
        log_lines(&dir).contains(&"poststart".to_string())
    });
    assert_eq!(log_lines(&dir), ["start", "poststart"]);
    let stubborn = ctd.container_ids_named(&pod, "stubborn")[0].clone();
    let slowstop = ctd.container_ids_named(&pod, "slowstop")[0].clone();
    let app = ctd.container_ids_named(&pod, "app")[0].clone();

    let removed_at = now_nanos();
    remove_manifest(&kubelet.manifest_dir(), "hooks.json");
    let mut exits = None;
    wait_until(SETTLE, "all three containers of hooks-edge-1 ended", || {
        exits = [&app, &stubborn, &slowstop]
            .iter()
            .map(|id| ctd.container_exit(id))
            .collect::<Option<Vec<_>>>();
        exits.is_some()
    });
    let exits = exits.unwrap_or_default();
    let after = |i: usize| Duration::from_nanos((exits[i].0 - removed_at).max(0) as u64);

    let lines = log_lines(&dir);
    assert_eq!(
        lines,
        ["start", "poststart", "prestop-served", "term"],
        "preStop before SIGTERM"
    );
    let request = std::fs::read_to_string(dir.join("request")).unwrap_or_default();
    assert!(
        request.starts_with("GET /prestop HTTP/1.1"),
        "request: {request:?}"
    );
    assert!(request.contains("kube-lifecycle/"), "request: {request:?}");
    assert_eq!(exits[0].1, 0, "app ended on SIGTERM");

    // Killed (SIGKILL) once the 6 s were over, not at once, not after 30 s.
    assert_eq!(exits[1].1, 137, "stubborn was killed");
    assert!(
        after(1) >= Duration::from_secs(5) && after(1) < Duration::from_secs(10),
        "stubborn ended {:?} after the removal",
        after(1)
    );
    // The 4 s preStop came out of the 6 s: killed at about 6 s, not 10.
    assert_eq!(exits[2].1, 137, "slowstop was killed");
    assert!(
        after(2) >= Duration::from_secs(5) && after(2) < Duration::from_secs(9),
        "slowstop ended {:?} after the removal",
        after(2)
    );
    wait_until(SETTLE, "hooks-edge-1 is removed", || ctd.pod_gone(&pod));
    kubelet.assert_running();
}

/// Editing one container of a static pod that keeps its UID restarts that
/// container only: same sandbox, the other container untouched.
#[test]
fn a_spec_edit_restarts_only_the_changed_container() {
    let ctd = PrivateContainerd::start();
    let mut kubelet = Tinylet::start(&ctd, NODE);
    let pod = kubelet.pod_name("edit");
    let yaml = |b_script: &str| {
        format!(
            r#"apiVersion: v1
kind: Pod
metadata:
  name: edit
  uid: 5b0c1e4e-edit-4c1e-9e2a-0000000000e1
spec:
  terminationGracePeriodSeconds: 5
  containers:
  - name: a
    image: {BUSYBOX_IMAGE}
    imagePullPolicy: IfNotPresent
    command: ["sh", "-c", {LONG_RUNNING:?}]
  - name: b
    image: {BUSYBOX_IMAGE}
    imagePullPolicy: IfNotPresent
    command: ["sh", "-c", {b_script:?}]
"#
        )
    };
    write_manifest(&kubelet.manifest_dir(), "edit.yaml", &yaml(LONG_RUNNING));
    wait_until(SETTLE, "edit-edge-1 runs", || {
        ctd.pod_running(&pod, &["a", "b"])
    });
    let sandbox = ctd.sandbox_ids(&pod);
    let a = ctd.container_ids_named(&pod, "a");
    let b = ctd.container_ids_named(&pod, "b")[0].clone();

    write_manifest(
        &kubelet.manifest_dir(),
        "edit.yaml",
        &yaml(&format!("echo v2; {LONG_RUNNING}")),
    );
    let mut new_b = None;
    wait_until(SETTLE, "a new container b runs", || {
        new_b = ctd
            .container_ids_named(&pod, "b")
            .into_iter()
            .find(|id| *id != b && ctd.task_status(id) == "RUNNING");
        new_b.is_some()
    });
    let new_b = new_b.unwrap_or_default();
    assert_eq!(
        ctd.container_exit(&b).map(|e| e.1),
        Some(0),
        "old b ended on SIGTERM"
    );
    assert_eq!(ctd.object(&new_b).map(|o| o.attempt), Some(1));
    holds_for(
        Duration::from_secs(3),
        "sandbox and container a are untouched",
        || {
            ctd.sandbox_ids(&pod) == sandbox
                && ctd.container_ids_named(&pod, "a") == a
                && ctd.task_status(&a[0]) == "RUNNING"
        },
    );
    kubelet.assert_running();
}

// ---- cluster node: what the API status says ----

fn api_pod(name: &str, policy: &str, script: &str) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "nodeName": NODE,
            "automountServiceAccountToken": false,
            "terminationGracePeriodSeconds": 2,
            "restartPolicy": policy,
            "containers": [{
                "name": "app",
                "image": BUSYBOX_IMAGE,
                "imagePullPolicy": "IfNotPresent",
                "command": ["sh", "-c", script],
            }],
        },
    })
}

fn str_at<'a>(v: &'a Value, pointer: &str) -> &'a str {
    v.pointer(pointer).and_then(Value::as_str).unwrap_or("")
}

/// Waits until `check` holds for the API object of `name`; panics with its
/// last status otherwise.
fn wait_api(fake: &FakeApiServer, name: &str, what: &str, check: impl Fn(&Value) -> bool) {
    let mut last = Value::Null;
    let start = std::time::Instant::now();
    while start.elapsed() < SETTLE * 3 {
        if let Some(p) = fake.pod("default", name) {
            if check(&p) {
                return;
            }
            last = p["status"].clone();
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    panic!("{name}: timed out waiting until {what}; status: {last}");
}

/// A crashing container waits in CrashLoopBackOff with upstream's message
/// and a window that doubles; restartPolicy OnFailure restarts only a
/// failure, Never none, and a failed init container under Never fails the
/// pod before its app ever runs.
#[test]
fn crash_loop_back_off_and_restart_policies_in_the_api_status() {
    let fake = FakeApiServer::start();
    let ctd = PrivateContainerd::start();
    let kubeconfig = fake.node_kubeconfig(ctd.dir(), NODE);
    let kubeconfig = kubeconfig.display().to_string();
    let mut kubelet = Tinylet::start_with(&ctd, NODE, &["--kubeconfig", &kubeconfig]);
    wait_until(SETTLE, "node edge-1 is registered", || {
        fake.node(NODE).is_some()
    });

    let crash = fake.create_pod(api_pod("crash", "Always", "sleep 1; exit 3"));
    let crash_uid = str_at(&crash, "/metadata/uid").to_string();
    fake.create_pod(api_pod("onfailure-ok", "OnFailure", "sleep 1; exit 0"));
    fake.create_pod(api_pod("onfailure-bad", "OnFailure", "sleep 1; exit 1"));
    fake.create_pod(api_pod("never-bad", "Never", "sleep 1; exit 1"));
    let mut init = api_pod("init-never", "Never", LONG_RUNNING);
    init["spec"]["initContainers"] = json!([{
        "name": "setup",
        "image": BUSYBOX_IMAGE,
        "imagePullPolicy": "IfNotPresent",
        "command": ["sh", "-c", "exit 4"],
    }]);
    fake.create_pod(init);
    let mut hookfail = api_pod("hookfail", "Always", LONG_RUNNING);
    hookfail["spec"]["containers"][0]["lifecycle"] =
        json!({"postStart": {"exec": {"command": ["sh", "-c", "exit 7"]}}});
    fake.create_pod(hookfail);

    let waiting = |p: &Value| {
        (
            str_at(p, "/status/containerStatuses/0/state/waiting/reason").to_string(),
            str_at(p, "/status/containerStatuses/0/state/waiting/message").to_string(),
        )
    };
    for window in ["10s", "20s"] {
        let want = format!(
            "back-off {window} restarting failed container=app pod=crash_default({crash_uid})"
        );
        wait_api(&fake, "crash", &format!("it waits: {want}"), |p| {
            waiting(p) == ("CrashLoopBackOff".to_string(), want.clone())
        });
    }
    let p = fake.pod("default", "crash").unwrap_or_default();
    assert_eq!(
        p.pointer("/status/containerStatuses/0/lastState/terminated/exitCode"),
        Some(&json!(3)),
        "status: {}",
        p["status"]
    );
    assert_eq!(str_at(&p, "/status/phase"), "Running");
    // The third restart comes only when the 20 s window after the second
    // run's exit is over.
    let run = |attempt: u32| {
        ctd.container_ids_named("crash", "app")
            .into_iter()
            .filter_map(|id| ctd.object(&id))
            .find(|o| o.attempt == attempt)
    };
    wait_until(SETTLE * 2, "crash's app is started a third time", || {
        run(3).is_some()
    });
    let third = run(3).expect("attempt 3 vanished");
    let second = run(2).expect("attempt 2 was removed too early");
    let created = third
        .created_at
        .parse::<k8s_openapi::jiff::Timestamp>()
        .unwrap_or_else(|e| panic!("CreatedAt {:?}: {e}", third.created_at))
        .as_nanosecond();
    let (exited, _) = ctd
        .container_exit(&second.id)
        .expect("attempt 2 has no exit");
    let gap = Duration::from_nanos((created - i128::from(exited)).max(0) as u64);
    assert!(
        gap >= Duration::from_secs(19),
        "the restart after the 20 s window came {gap:?} after the exit"
    );

    wait_api(&fake, "onfailure-ok", "it Succeeded", |p| {
        str_at(p, "/status/phase") == "Succeeded"
    });
    let p = fake.pod("default", "onfailure-ok").unwrap_or_default();
    assert_eq!(
        p.pointer("/status/containerStatuses/0/restartCount"),
        Some(&json!(0))
    );
    wait_api(&fake, "onfailure-bad", "it was restarted", |p| {
        p.pointer("/status/containerStatuses/0/restartCount")
            .and_then(Value::as_i64)
            .is_some_and(|n| n >= 1)
    });
    let p = fake.pod("default", "onfailure-bad").unwrap_or_default();
    assert_ne!(str_at(&p, "/status/phase"), "Failed");
    wait_api(&fake, "never-bad", "it Failed", |p| {
        str_at(p, "/status/phase") == "Failed"
    });
    let p = fake.pod("default", "never-bad").unwrap_or_default();
    assert_eq!(
        p.pointer("/status/containerStatuses/0/restartCount"),
        Some(&json!(0))
    );
    assert_eq!(
        p.pointer("/status/containerStatuses/0/state/terminated/exitCode"),
        Some(&json!(1))
    );

    wait_api(&fake, "init-never", "it Failed", |p| {
        str_at(p, "/status/phase") == "Failed"
    });
    let p = fake.pod("default", "init-never").unwrap_or_default();
    assert_eq!(
        p.pointer("/status/initContainerStatuses/0/state/terminated/exitCode"),
        Some(&json!(4)),
        "status: {}",
        p["status"]
    );
    assert!(
        ctd.container_ids_named("init-never", "app").is_empty(),
        "the app of a pod whose init container failed must never run"
    );

    // A failing postStart hook: events as upstream, the container killed
    // and started again.
    let event = |reason: &str| {
        fake.events().into_iter().find(|e| {
            str_at(e, "/involvedObject/name") == "hookfail"
                && str_at(e, "/involvedObject/fieldPath") == "spec.containers{app}"
                && str_at(e, "/reason") == reason
        })
    };
    wait_until(SETTLE, "a FailedPostStartHook event for hookfail", || {
        event("FailedPostStartHook").is_some()
    });
    let failed = event("FailedPostStartHook").unwrap_or_default();
    assert_eq!(str_at(&failed, "/message"), "PostStartHook failed");
    assert_eq!(str_at(&failed, "/type"), "Warning");
    let killing = event("Killing").unwrap_or_default();
    assert_eq!(str_at(&killing, "/message"), "FailedPostStartHook");
    wait_api(&fake, "hookfail", "its container was started again", |p| {
        p.pointer("/status/containerStatuses/0/restartCount")
            .and_then(Value::as_i64)
            .is_some_and(|n| n >= 1)
    });
    kubelet.assert_running();
}
