//! End-to-end tests of probes on a real, private containerd: exec, httpGet
//! (busybox `httpd`, port by name) and tcpSocket (busybox `nc`) liveness
//! probes restarting their container once the target inside it goes away;
//! and, with tinylet joined to the fake apiserver, readiness following a
//! file inside the container into the API status, and a liveness failure
//! reported with upstream's events; a pod whose exec and tcpSocket probes
//! hang for an hour beside a pod whose liveness probe fails, which is
//! restarted on time all the same. Also an HTTPS probe against a server
//! with an untrusted certificate (no containerd needed).

use std::collections::BTreeSet;
use std::net::{TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::e2e::{LONG_RUNNING, NODE, SETTLE};
use crate::support::containerd::{
    holds_for, wait_until, write_manifest, PrivateContainerd, Tinylet, BUSYBOX_IMAGE,
};
use crate::support::fake_apiserver::FakeApiServer;
use tinylet::prober::run::{http_get, probe_agent, Found};
use tinylet::prober::spec::HttpGet;

/// A static pod with one container `app` running `sh -c SCRIPT`, with
/// `extra` (YAML at the container's indentation) added to the container.
fn probed_pod(name: &str, script: &str, extra: &str) -> String {
    format!(
        r#"apiVersion: v1
kind: Pod
metadata:
  name: {name}
spec:
  terminationGracePeriodSeconds: 5
  containers:
  - name: app
    image: {BUSYBOX_IMAGE}
    imagePullPolicy: IfNotPresent
    command: ["sh", "-c", {script:?}]
{extra}"#
    )
}

/// Attempts (restart counts) of the pod's `app` containers in containerd.
fn attempts(ctd: &PrivateContainerd, pod: &str) -> BTreeSet<u32> {
    ctd.container_ids_named(pod, "app")
        .iter()
        .filter_map(|id| ctd.object(id))
        .map(|o| o.attempt)
        .collect()
}

/// The running `app` container of the pod with the given attempt.
fn running_attempt(ctd: &PrivateContainerd, pod: &str, attempt: u32) -> Option<String> {
    ctd.container_ids_named(pod, "app")
        .into_iter()
        .filter(|id| ctd.object(id).is_some_and(|o| o.attempt == attempt))
        .find(|id| ctd.task_status(id) == "RUNNING")
}

/// Exec, httpGet and tcpSocket liveness probes pass while their target is
/// there, and restart the container (attempt 1) once it is gone; the
/// restarted container then passes again and is left running.
#[test]
fn liveness_probes_restart_containers_exec_http_and_tcp() {
    let ctd = PrivateContainerd::start();
    let mut kubelet = Tinylet::start(&ctd, NODE);
    let dir = kubelet.manifest_dir();

    write_manifest(
        &dir,
        "exec.yaml",
        &probed_pod(
            "exec",
            &format!("touch /tmp/healthy; {LONG_RUNNING}"),
            r#"    livenessProbe:
      exec:
        command: ["cat", "/tmp/healthy"]
      periodSeconds: 1
      failureThreshold: 2
"#,
        ),
    );
    write_manifest(
        &dir,
        "http.yaml",
        &probed_pod(
            "http",
            &format!(
                "mkdir -p /www && echo ok > /www/healthz && httpd -p 8080 -h /www; {LONG_RUNNING}"
            ),
            r#"    ports:
    - name: web
      containerPort: 8080
    livenessProbe:
      httpGet:
        path: /healthz
        port: web
      periodSeconds: 1
      failureThreshold: 2
"#,
        ),
    );
    write_manifest(
        &dir,
        "tcp.yaml",
        &probed_pod(
            "tcp",
            &format!("nc -ll -p 9000 -e true & {LONG_RUNNING}"),
            r#"    livenessProbe:
      tcpSocket:
        port: 9000
      periodSeconds: 1
      failureThreshold: 2
"#,
        ),
    );
    let pods: Vec<String> = ["exec", "http", "tcp"]
        .iter()
        .map(|n| kubelet.pod_name(n))
        .collect();
    for pod in &pods {
        wait_until(SETTLE, &format!("{pod} runs"), || {
            ctd.pod_running(pod, &["app"])
        });
    }
    // Passing probes leave the containers alone.
    holds_for(
        Duration::from_secs(5),
        "no container restarted while its liveness probe passes",
        || {
            pods.iter()
                .all(|p| attempts(&ctd, p) == BTreeSet::from([0]))
        },
    );

    // Take each probe's target away.
    let breaks: [(&str, &[&str]); 3] = [
        ("exec", &["rm", "/tmp/healthy"]),
        ("http", &["rm", "/www/healthz"]),
        ("tcp", &["killall", "nc"]),
    ];
    for (pod, (name, cmd)) in pods.iter().zip(breaks) {
        let id = running_attempt(&ctd, pod, 0)
            .unwrap_or_else(|| panic!("{name}: no running first container"));
        ctd.exec(&id, cmd)
            .unwrap_or_else(|e| panic!("{name}: {cmd:?} in the container: {e}"));
    }
    for pod in &pods {
        wait_until(
            SETTLE,
            &format!("{pod} is restarted by its liveness probe (attempt 1 running)"),
            || running_attempt(&ctd, pod, 1).is_some(),
        );
    }
    let log = kubelet.log_tail(2000);
    let restarts = log
        .matches("Container app failed liveness probe, will be restarted")
        .count();
    assert!(restarts >= 3, "tinylet log: {log}");
    // The new containers pass their probes and keep running.
    holds_for(
        Duration::from_secs(5),
        "the restarted containers pass their probes and stay",
        || {
            pods.iter()
                .all(|p| attempts(&ctd, p).iter().all(|a| *a <= 1))
        },
    );
    kubelet.assert_running();
}

/// A loopback TCP port whose accept queue is full: a connect to it hangs
/// (the kernel drops the SYNs) until the caller gives up, as to a host
/// that drops packets. Keep both while the port must stay full.
fn black_hole() -> (TcpListener, TcpStream, u16) {
    let l = TcpListener::bind("127.0.0.1:0").expect("binding a loopback port");
    // A backlog of 0 holds one connection that nobody accepts.
    // SAFETY: listen(2) on a socket this function owns.
    let rc = unsafe { libc::listen(l.as_raw_fd(), 0) };
    assert_eq!(rc, 0, "listen: {}", std::io::Error::last_os_error());
    let addr = l.local_addr().expect("the port's address");
    let filler = TcpStream::connect(addr).expect("the first connection");
    assert!(
        TcpStream::connect_timeout(&addr, Duration::from_millis(500)).is_err(),
        "a connect to the full port must hang"
    );
    (l, filler, addr.port())
}

/// A pod of six containers, each with an exec liveness probe `sleep 3600`
/// and a tcpSocket readiness probe to a full loopback port, every second
/// with an hour's timeout: twelve probe runs that hang. Beside it a pod's
/// liveness probe still runs every second: it is restarted once its
/// target goes, and the hog has at most two exec runs out.
#[test]
fn hanging_probes_of_one_pod_leave_another_pods_liveness_probe_on_time() {
    let (_listener, _filler, port) = black_hole();
    let ctd = PrivateContainerd::start();
    let mut kubelet = Tinylet::start(&ctd, NODE);
    let dir = kubelet.manifest_dir();
    let names: Vec<String> = (0..6).map(|i| format!("c{i}")).collect();
    let containers: String = names
        .iter()
        .map(|n| {
            format!(
                r#"  - name: {n}
    image: {BUSYBOX_IMAGE}
    imagePullPolicy: IfNotPresent
    command: ["sh", "-c", {LONG_RUNNING:?}]
    livenessProbe:
      exec:
        command: ["sleep", "3600"]
      periodSeconds: 1
      timeoutSeconds: 3600
    readinessProbe:
      tcpSocket:
        host: 127.0.0.1
        port: {port}
      periodSeconds: 1
      timeoutSeconds: 3600
"#
            )
        })
        .collect();
    write_manifest(
        &dir,
        "hog.yaml",
        &format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: hog\nspec:\n  \
             terminationGracePeriodSeconds: 5\n  containers:\n{containers}"
        ),
    );
    let hog = kubelet.pod_name("hog");
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    wait_until(SETTLE, "the hog runs", || ctd.pod_running(&hog, &refs));
    // The hog's runs go out at once and hang.
    std::thread::sleep(Duration::from_secs(3));
    let sleeps = || {
        names
            .iter()
            .flat_map(|n| ctd.container_ids_named(&hog, n))
            .filter_map(|id| ctd.exec_printing(&id, &["ps", "-o", "args"]).ok())
            .map(|ps| ps.lines().filter(|l| l.trim() == "sleep 3600").count())
            .sum::<usize>()
    };

    write_manifest(
        &dir,
        "victim.yaml",
        &probed_pod(
            "victim",
            &format!("touch /tmp/healthy; {LONG_RUNNING}"),
            r#"    livenessProbe:
      exec:
        command: ["cat", "/tmp/healthy"]
      periodSeconds: 1
      failureThreshold: 2
"#,
        ),
    );
    let victim = kubelet.pod_name("victim");
    wait_until(SETTLE, "the victim runs", || {
        ctd.pod_running(&victim, &["app"])
    });
    let id = running_attempt(&ctd, &victim, 0).expect("the victim's first container");
    ctd.exec(&id, &["rm", "/tmp/healthy"])
        .unwrap_or_else(|e| panic!("rm /tmp/healthy: {e}"));
    let t0 = Instant::now();
    // Two failed runs a second apart, the kill, the start: a few seconds;
    // before, never, with every runner held by the hog.
    wait_until(
        SETTLE,
        "the victim is restarted by its liveness probe (attempt 1 running)",
        || running_attempt(&ctd, &victim, 1).is_some(),
    );
    eprintln!(
        "the victim was restarted {} ms after its target went",
        t0.elapsed().as_millis()
    );
    let out = sleeps();
    assert!(out <= 2, "{out} exec runs of the hog out at once");
    assert!(ctd.pod_running(&hog, &refs), "the hog is left alone");
    kubelet.assert_running();
}

fn str_at<'a>(v: &'a Value, pointer: &str) -> &'a str {
    v.pointer(pointer).and_then(Value::as_str).unwrap_or("")
}

fn condition(pod: &Value, kind: &str) -> String {
    pod["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["type"] == kind)
        .map(|c| str_at(c, "/status").to_string())
        .unwrap_or_default()
}

/// (containerStatuses[0].ready, Ready, ContainersReady) of the API pod.
fn readiness(fake: &FakeApiServer, name: &str) -> Option<(bool, String, String)> {
    let pod = fake.pod("default", name)?;
    let ready = pod.pointer("/status/containerStatuses/0/ready") == Some(&json!(true));
    Some((
        ready,
        condition(&pod, "Ready"),
        condition(&pod, "ContainersReady"),
    ))
}

/// A cluster node: readiness follows a file inside the container into the
/// API status (container `ready`, Ready and ContainersReady) both ways, and
/// a failing liveness probe restarts the container with upstream's
/// Unhealthy and Killing events, the status showing the restart.
#[test]
fn readiness_follows_a_file_into_the_api_status_and_liveness_kills_are_events() {
    let fake = FakeApiServer::start();
    let ctd = PrivateContainerd::start();
    let kubeconfig = fake.node_kubeconfig(ctd.dir(), NODE);
    let kubeconfig = kubeconfig.display().to_string();
    let mut kubelet = Tinylet::start_with(&ctd, NODE, &["--kubeconfig", &kubeconfig]);
    wait_until(SETTLE, "node edge-1 is registered", || {
        fake.node(NODE).is_some()
    });
    let probe = |file: &str, failures: i32| {
        json!({
            "exec": {"command": ["cat", file]},
            "periodSeconds": 1,
            "failureThreshold": failures,
        })
    };
    fake.create_pod(json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "probed", "namespace": "default"},
        "spec": {
            "nodeName": NODE,
            "automountServiceAccountToken": false,
            "terminationGracePeriodSeconds": 5,
            "containers": [{
                "name": "app",
                "image": BUSYBOX_IMAGE,
                "imagePullPolicy": "IfNotPresent",
                "command": ["sh", "-c", format!("touch /tmp/alive; {LONG_RUNNING}")],
                "readinessProbe": probe("/tmp/ready", 1),
                "livenessProbe": probe("/tmp/alive", 1),
            }],
        },
    }));
    wait_until(SETTLE, "API pod probed runs in containerd", || {
        ctd.pod_running("probed", &["app"])
    });
    let id = running_attempt(&ctd, "probed", 0).expect("probed: no running container");
    let not_ready = Some((false, "False".to_string(), "False".to_string()));
    let ready = Some((true, "True".to_string(), "True".to_string()));
    wait_until(SETTLE, "the status shows the running container", || {
        fake.pod("default", "probed").is_some_and(|p| {
            p.pointer("/status/containerStatuses/0/state/running")
                .is_some()
        })
    });
    holds_for(
        Duration::from_secs(3),
        "probed is not ready without /tmp/ready",
        || readiness(&fake, "probed") == not_ready,
    );

    ctd.exec(&id, &["touch", "/tmp/ready"])
        .unwrap_or_else(|e| panic!("touch /tmp/ready: {e}"));
    let t0 = Instant::now();
    wait_until(SETTLE, "probed turns ready in the API", || {
        readiness(&fake, "probed") == ready
    });
    eprintln!(
        "readiness reached the API {} ms after the file appeared",
        t0.elapsed().as_millis()
    );
    ctd.exec(&id, &["rm", "/tmp/ready"])
        .unwrap_or_else(|e| panic!("rm /tmp/ready: {e}"));
    wait_until(SETTLE, "probed turns unready in the API", || {
        readiness(&fake, "probed") == not_ready
    });
    let events_about = |reason: &str, prefix: &str| {
        fake.events().into_iter().any(|e| {
            e["reason"] == reason
                && e["type"]
                    == if reason == "Killing" {
                        "Normal"
                    } else {
                        "Warning"
                    }
                && e["involvedObject"]["name"] == "probed"
                && e["involvedObject"]["fieldPath"] == "spec.containers{app}"
                && str_at(&e, "/message").starts_with(prefix)
        })
    };
    wait_until(SETTLE, "an Unhealthy event for the readiness probe", || {
        events_about(
            "Unhealthy",
            "Readiness probe failed: cat: can't open '/tmp/ready'",
        )
    });

    ctd.exec(&id, &["rm", "/tmp/alive"])
        .unwrap_or_else(|e| panic!("rm /tmp/alive: {e}"));
    wait_until(SETTLE, "probed is restarted (attempt 1 running)", || {
        running_attempt(&ctd, "probed", 1).is_some()
    });
    wait_until(
        SETTLE,
        "Unhealthy and Killing events for the liveness probe",
        || {
            events_about(
                "Unhealthy",
                "Liveness probe failed: cat: can't open '/tmp/alive'",
            ) && events_about(
                "Killing",
                "Container app failed liveness probe, will be restarted",
            )
        },
    );
    let new_id = running_attempt(&ctd, "probed", 1).expect("attempt 1 vanished");
    wait_until(SETTLE, "the status shows the restart", || {
        fake.pod("default", "probed").is_some_and(|p| {
            p.pointer("/status/containerStatuses/0/restartCount") == Some(&json!(1))
                && str_at(&p, "/status/containerStatuses/0/containerID")
                    == format!("containerd://{new_id}")
                && p.pointer("/status/containerStatuses/0/lastState/terminated")
                    .is_some()
        })
    });
    // The new container has no /tmp/ready: not ready again.
    assert_eq!(readiness(&fake, "probed"), not_ready);
    kubelet.assert_running();
}

/// An httpGet probe with scheme HTTPS passes against a server whose
/// certificate nothing here trusts: probes skip verification, as upstream.
#[test]
fn https_probes_skip_certificate_verification() {
    let server = FakeApiServer::start_tls();
    let h = HttpGet {
        scheme: "https".into(),
        host: None,
        port: server.addr().port(),
        path: "/healthz".into(),
        headers: vec![],
    };
    assert_eq!(
        http_get(&probe_agent(), &h, "127.0.0.1", Duration::from_secs(5)),
        Found::Success("ok".into())
    );
    let plain = HttpGet {
        scheme: "http".into(),
        ..h
    };
    assert!(
        matches!(
            http_get(&probe_agent(), &plain, "127.0.0.1", Duration::from_secs(5)),
            Found::Failure(_)
        ),
        "plain HTTP to a TLS port must fail"
    );
}
