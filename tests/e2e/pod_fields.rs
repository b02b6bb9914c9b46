//! End-to-end tests of pod lifecycle fields on a real, private containerd:
//! `activeDeadlineSeconds` (the pod stopped and Failed with
//! DeadlineExceeded), `hostUsers: false` refused at admission, readiness gates (Ready waits for a condition another
//! controller sets on the API pod, which tinylet's patches keep),
//! `shareProcessNamespace` (one container sees another's processes), a
//! liveness kill with the probe's own grace period, and an
//! ephemeral container added to a running pod (`kubectl debug`).

use std::time::Duration;

use serde_json::{json, Value};

use crate::e2e::cluster::{api_pod, str_at, NS};
use crate::e2e::node_api::{client_dial, wait_listening};
use crate::e2e::{start_joined, LONG_RUNNING, NODE, SETTLE};
use crate::server::{free_port, make_ca_and_client};
use crate::support::containerd::{
    holds_for, wait_until, write_manifest, PrivateContainerd, Tinylet, BUSYBOX_IMAGE,
};
use crate::support::fake_apiserver::FakeApiServer;
use crate::support::streams::SpdyExec;

fn condition<'a>(pod: &'a Value, type_: &str) -> Option<&'a Value> {
    pod["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == type_)
}

/// A pod past its active deadline has its container stopped (and never
/// started again) and is reported Failed with reason DeadlineExceeded, with
/// a DeadlineExceeded event.
#[test]
fn e2e_active_deadline_stops_the_pod_and_fails_it() {
    let fake = FakeApiServer::start();
    let ctd = PrivateContainerd::start();
    let _kubelet = start_joined(&ctd, &fake);
    let mut pod = api_pod("job");
    pod["spec"]["activeDeadlineSeconds"] = json!(3);
    fake.create_pod(pod);
    wait_until(SETTLE, "job runs", || ctd.pod_running("job", &["app"]));

    wait_until(SETTLE, "job is Failed with DeadlineExceeded", || {
        fake.pod(NS, "job").is_some_and(|p| {
            str_at(&p, "/status/phase") == "Failed"
                && str_at(&p, "/status/reason") == "DeadlineExceeded"
        })
    });
    let p = fake.pod(NS, "job").unwrap();
    assert_eq!(
        str_at(&p, "/status/message"),
        "Pod was active on the node longer than the specified deadline"
    );
    wait_until(SETTLE, "job's container is stopped", || {
        let ids = ctd.container_ids("job");
        ids.len() == 1 && ctd.container_exit(&ids[0]).is_some()
    });
    assert!(
        fake.events()
            .iter()
            .any(|e| e["reason"] == "DeadlineExceeded" && e["involvedObject"]["name"] == "job"),
        "a DeadlineExceeded event"
    );
    holds_for(Duration::from_secs(3), "job is not started again", || {
        !ctd.pod_running("job", &["app"]) && ctd.container_ids("job").len() == 1
    });
}

/// A pod asking for a user namespace, which containerd cannot give through
/// CRI, is refused at admission: Failed with reason
/// UserNamespacesNotSupported, nothing made for it, and the pod beside it
/// runs.
#[test]
fn e2e_a_pod_without_host_users_is_refused_with_a_reason() {
    let fake = FakeApiServer::start();
    let ctd = PrivateContainerd::start();
    let _kubelet = start_joined(&ctd, &fake);
    let mut pod = api_pod("userns");
    pod["spec"]["hostUsers"] = json!(false);
    fake.create_pod(pod);
    fake.create_pod(api_pod("plain"));
    wait_until(SETTLE, "userns is refused", || {
        fake.pod(NS, "userns").is_some_and(|p| {
            str_at(&p, "/status/phase") == "Failed"
                && str_at(&p, "/status/reason") == "UserNamespacesNotSupported"
        })
    });
    let p = fake.pod(NS, "userns").unwrap();
    assert!(
        str_at(&p, "/status/message").contains("spec.hostUsers"),
        "{}",
        p["status"]
    );
    wait_until(SETTLE, "plain runs", || ctd.pod_running("plain", &["app"]));
    assert!(ctd.sandbox_ids("userns").is_empty());
}

/// Ready stays False (ReadinessGatesNotReady) while the gate's condition is
/// missing, and becomes True once a controller sets it True on the API pod;
/// tinylet's status patches leave that condition as the controller set it.
#[test]
fn e2e_readiness_gate_holds_ready_until_its_condition_is_true() {
    let fake = FakeApiServer::start();
    let ctd = PrivateContainerd::start();
    let _kubelet = start_joined(&ctd, &fake);
    let mut pod = api_pod("gated");
    pod["spec"]["readinessGates"] = json!([{"conditionType": "example.com/lb"}]);
    fake.create_pod(pod);
    wait_until(SETTLE, "gated runs, Ready False for its gate", || {
        fake.pod(NS, "gated").is_some_and(|p| {
            str_at(&p, "/status/phase") == "Running"
                && condition(&p, "ContainersReady").is_some_and(|c| c["status"] == "True")
                && condition(&p, "Ready").is_some_and(|c| {
                    c["status"] == "False" && c["reason"] == "ReadinessGatesNotReady"
                })
        })
    });
    let ready = |p: &Value| condition(p, "Ready").is_some_and(|c| c["status"] == "True");
    holds_for(Duration::from_secs(2), "gated stays unready", || {
        fake.pod(NS, "gated").is_some_and(|p| !ready(&p))
    });

    // The load balancer controller's condition.
    assert!(fake.update_pod(NS, "gated", |p| {
        if let Some(cs) = p["status"]["conditions"].as_array_mut() {
            cs.push(json!({
                "type": "example.com/lb",
                "status": "True",
                "lastTransitionTime": "2024-01-01T00:00:00Z",
            }));
        }
    }));
    wait_until(SETTLE, "gated becomes Ready", || {
        fake.pod(NS, "gated").is_some_and(|p| ready(&p))
    });
    let p = fake.pod(NS, "gated").unwrap();
    let gate = condition(&p, "example.com/lb").expect("the gate's condition is kept");
    assert_eq!(gate["status"], "True");
    assert_eq!(gate["lastTransitionTime"], "2024-01-01T00:00:00Z");
}

/// With `shareProcessNamespace`, a container sees the processes of the
/// pod's other container; without it, it does not.
#[test]
fn e2e_share_process_namespace_shows_the_other_containers_processes() {
    let ctd = PrivateContainerd::start();
    let tl = Tinylet::start(&ctd, NODE);
    let manifest = |name: &str, share: bool| {
        format!(
            r#"apiVersion: v1
kind: Pod
metadata:
  name: {name}
spec:
  terminationGracePeriodSeconds: 1
  shareProcessNamespace: {share}
  containers:
  - name: app
    image: {BUSYBOX_IMAGE}
    imagePullPolicy: IfNotPresent
    command: ["sh", "-c", {LONG_RUNNING:?}]
  - name: side
    image: {BUSYBOX_IMAGE}
    imagePullPolicy: IfNotPresent
    command: ["sleep", "4242"]
"#
        )
    };
    write_manifest(&tl.manifest_dir(), "shared.yaml", &manifest("shared", true));
    write_manifest(&tl.manifest_dir(), "apart.yaml", &manifest("apart", false));
    let ps_in_app = |pod: &str| {
        let name = tl.pod_name(pod);
        wait_until(SETTLE, &format!("{name} runs"), || {
            ctd.pod_running(&name, &["app", "side"])
        });
        let ids = ctd.container_ids_named(&name, "app");
        ctd.exec_printing(&ids[0], &["ps", "-o", "args"])
            .unwrap_or_default()
    };
    let shared = ps_in_app("shared");
    assert!(shared.contains("sleep 4242"), "ps in app:\n{shared}");
    let apart = ps_in_app("apart");
    assert!(!apart.contains("sleep 4242"), "ps in app:\n{apart}");
}

/// An ephemeral container added to a running API pod starts in its sandbox,
/// in its target's process namespace, is reported in
/// `ephemeralContainerStatuses`, can be attached to through the node API,
/// and restarts nothing; once it exits it is never started again.
#[test]
fn e2e_an_ephemeral_container_added_to_a_running_pod_runs_once() {
    let fake = FakeApiServer::start();
    // Off in a default v1.20, as in the fake.
    fake.set_ephemeral_containers(true);
    let ctd = PrivateContainerd::start();
    let certs = tempfile::tempdir().unwrap();
    make_ca_and_client(certs.path(), "good");
    let ca = certs.path().join("good-ca.crt").display().to_string();
    let port = free_port();
    let kubeconfig = fake.node_kubeconfig(ctd.dir(), NODE);
    let args = [
        "--kubeconfig",
        &kubeconfig.display().to_string(),
        "--port",
        &port.to_string(),
        "--address",
        "127.0.0.1",
        "--client-ca-file",
        &ca,
        "--authorization-mode",
        "AlwaysAllow",
    ]
    .map(String::from);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let _kubelet = Tinylet::start_with(&ctd, NODE, &args);
    fake.create_pod(api_pod("dbg"));
    wait_until(SETTLE, "dbg runs", || ctd.pod_running("dbg", &["app"]));
    let app = ctd.container_ids_named("dbg", "app");
    let sandbox = ctd.sandbox_ids("dbg");

    assert!(fake.add_ephemeral_container(
        NS,
        "dbg",
        json!({
            "name": "debugger",
            "image": BUSYBOX_IMAGE,
            "imagePullPolicy": "IfNotPresent",
            "command": ["sh", "-c", "read line; echo got-$line"],
            "targetContainerName": "app",
            "stdin": true,
        }),
    ));
    wait_until(SETTLE, "the ephemeral container runs", || {
        ctd.pod_running("dbg", &["app", "debugger"])
    });
    let debugger = ctd.container_ids_named("dbg", "debugger");
    assert_eq!(debugger.len(), 1);
    // It shares the process namespace of its target. (An exec right after
    // the start may fail on a loaded machine: tried again until it answers.)
    let mut ps = String::new();
    wait_until(SETTLE, "the debugger sees its target's processes", || {
        ps = match ctd.exec_printing(&debugger[0], &["ps", "-o", "args"]) {
            Ok(out) => out,
            Err(e) => format!("exec failed: {e}"),
        };
        !ps.starts_with("exec failed")
    });
    assert!(ps.contains("while :"), "ps in the debugger:\n{ps}");
    wait_until(SETTLE, "its status is reported", || {
        fake.pod(NS, "dbg").is_some_and(|p| {
            str_at(&p, "/status/ephemeralContainerStatuses/0/name") == "debugger"
                && str_at(&p, "/status/ephemeralContainerStatuses/0/containerID")
                    == format!("containerd://{}", debugger[0])
        })
    });
    // kubectl debug -i attaches to it: what it reads comes from the
    // session, what it writes goes back.
    wait_listening(port);
    let main = client_dial(certs.path(), port);
    let target = "/attach/default/dbg/debugger?input=1&output=1";
    let mut attach = SpdyExec::start(&main, target, true, true, false, false).unwrap();
    attach.write_stdin(b"meow\n", false).unwrap();
    let out = attach.stdout.unwrap();
    let seen = attach
        .conn
        .until(|c| c.text(out).contains("got-meow"))
        .unwrap();
    assert!(seen, "attach stdout: {:?}", attach.conn.text(out));
    attach.conn.close();
    // Its exit is reported, and it is never started again.
    wait_until(SETTLE, "its exit is reported", || {
        fake.pod(NS, "dbg").is_some_and(|p| {
            p.pointer("/status/ephemeralContainerStatuses/0/state/terminated/exitCode")
                == Some(&json!(0))
        })
    });
    holds_for(
        Duration::from_secs(3),
        "the debugger is not restarted",
        || ctd.container_ids_named("dbg", "debugger") == debugger,
    );
    // Nothing else was restarted or recreated.
    assert_eq!(ctd.container_ids_named("dbg", "app"), app);
    assert_eq!(ctd.sandbox_ids("dbg"), sandbox);
    assert!(ctd.pod_running("dbg", &["app"]));
    let p = fake.pod(NS, "dbg").unwrap();
    assert_eq!(
        p.pointer("/status/containerStatuses/0/restartCount"),
        Some(&json!(0))
    );
    assert_eq!(str_at(&p, "/status/phase"), "Running");
}

/// A failed liveness probe's kill uses the probe's
/// `terminationGracePeriodSeconds` over the pod's: a container that ignores
/// SIGTERM in a pod with a two-minute grace period is restarted within
/// seconds, not after two minutes.
#[test]
fn e2e_a_liveness_kill_uses_the_probe_grace_period() {
    let ctd = PrivateContainerd::start();
    let tl = Tinylet::start(&ctd, NODE);
    let manifest = format!(
        r#"apiVersion: v1
kind: Pod
metadata:
  name: stubborn
spec:
  terminationGracePeriodSeconds: 120
  containers:
  - name: app
    image: {BUSYBOX_IMAGE}
    imagePullPolicy: IfNotPresent
    command: ["sh", "-c", "trap '' TERM; while :; do sleep 1; done"]
    livenessProbe:
      exec:
        command: ["false"]
      periodSeconds: 1
      failureThreshold: 1
      terminationGracePeriodSeconds: 1
"#
    );
    write_manifest(&tl.manifest_dir(), "stubborn.yaml", &manifest);
    let name = tl.pod_name("stubborn");
    wait_until(SETTLE, &format!("{name} runs"), || {
        ctd.pod_running(&name, &["app"])
    });
    // The pod's 120 s would outlast this wait; the probe's 1 s does not.
    wait_until(SETTLE, "app is killed and started again", || {
        ctd.container_ids_named(&name, "app").len() >= 2
    });
}
