//! End-to-end tests of the container spec as a user sees it inside the
//! container, on a real, private containerd: env vars from the downward
//! API and `$(VAR)` expansion, workingDir, a hostPort reached through the
//! CNI portmap plugin, runAsUser and the runAsNonRoot refusal, DNS and
//! /etc/hosts, QoS cgroups and OOM scores, the security context and a tty
//! as the process sees them, and termination messages read back from the
//! API status.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::e2e::{LONG_RUNNING, NODE, SETTLE};
use crate::support::containerd::{
    remove_manifest, wait_until, write_manifest, PrivateContainerd, Tinylet, BUSYBOX_IMAGE,
    POD_UID_LABEL,
};
use crate::support::fake_apiserver::FakeApiServer;

/// `GET /` over plain HTTP/1.0; the body, or why there is none.
fn http_get(addr: &str) -> Result<String, String> {
    let mut s = TcpStream::connect_timeout(
        &addr.parse().map_err(|e| format!("{addr}: {e}"))?,
        Duration::from_secs(2),
    )
    .map_err(|e| format!("connect {addr}: {e}"))?;
    s.set_read_timeout(Some(Duration::from_secs(5)))
        .map_err(|e| e.to_string())?;
    s.write_all(b"GET /index.html HTTP/1.0\r\n\r\n")
        .map_err(|e| format!("send to {addr}: {e}"))?;
    let mut text = String::new();
    s.read_to_string(&mut text)
        .map_err(|e| format!("read from {addr}: {e}"))?;
    match text.split_once("\r\n\r\n") {
        Some((head, body)) if head.starts_with("HTTP/1.") && head.contains(" 200 ") => {
            Ok(body.to_string())
        }
        _ => Err(format!("unexpected answer from {addr}: {text:?}")),
    }
}

/// Env from the downward API and expansion, command expansion, workingDir
/// and a hostPort, all seen from outside through the published port; the
/// container's env, user, /etc/hosts and resolv.conf seen with exec; a
/// runAsNonRoot pod on a root image refused and never created.
#[test]
fn container_spec_reaches_the_container() {
    let ctd = PrivateContainerd::start();
    let kubelet = Tinylet::start_with(
        &ctd,
        NODE,
        &[
            "--cluster-dns",
            "10.96.0.10",
            "--cluster-domain",
            "cluster.local",
        ],
    );
    let dir = kubelet.manifest_dir();
    // Unique per containerd instance, so parallel tests do not collide.
    let host_port = 20000 + ctd.cni_index();
    let web = format!(
        r#"apiVersion: v1
kind: Pod
metadata:
  name: web
  labels:
    tier: front
spec:
  terminationGracePeriodSeconds: 2
  hostname: www
  subdomain: shop
  containers:
  - name: app
    image: {BUSYBOX_IMAGE}
    imagePullPolicy: IfNotPresent
    workingDir: /tmp
    command: ["sh", "-c", "echo '$(GREETING)' > index.html; pwd >> index.html; exec httpd -f -p 8080 -h /tmp"]
    ports:
    - containerPort: 8080
      hostPort: {host_port}
    resources:
      limits:
        memory: 64Mi
    securityContext:
      runAsUser: 1000
      runAsGroup: 3000
    env:
    - name: WHO
      value: world
    - name: GREETING
      value: hello $(WHO) $$(WHO) $(NOPE)
    - name: POD_NAME
      valueFrom:
        fieldRef:
          fieldPath: metadata.name
    - name: POD_NAMESPACE
      valueFrom:
        fieldRef:
          fieldPath: metadata.namespace
    - name: POD_IP
      valueFrom:
        fieldRef:
          fieldPath: status.podIP
    - name: NODE_NAME
      valueFrom:
        fieldRef:
          fieldPath: spec.nodeName
    - name: TIER
      valueFrom:
        fieldRef:
          fieldPath: metadata.labels['tier']
    - name: MEM_MI
      valueFrom:
        resourceFieldRef:
          resource: limits.memory
          divisor: 1Mi
"#
    );
    write_manifest(&dir, "web.yaml", &web);
    write_manifest(
        &dir,
        "nonroot.yaml",
        &format!(
            r#"apiVersion: v1
kind: Pod
metadata:
  name: nonroot
spec:
  securityContext:
    runAsNonRoot: true
  containers:
  - name: app
    image: {BUSYBOX_IMAGE}
    imagePullPolicy: IfNotPresent
    command: ["sh", "-c", {LONG_RUNNING:?}]
"#
        ),
    );
    let web_pod = kubelet.pod_name("web");
    wait_until(SETTLE, "pod web runs", || {
        ctd.pod_running(&web_pod, &["app"])
    });
    let app = ctd.container_ids_named(&web_pod, "app")[0].clone();
    let sandbox = ctd.sandbox_ids(&web_pod)[0].clone();
    let pod_ip = ctd
        .sandbox_ip(&sandbox)
        .unwrap_or_else(|| panic!("no IP for sandbox {sandbox}"));

    // The published port on the bridge's gateway address (a local address
    // of this host), DNAT-ed by portmap to the pod.
    let gateway = format!("{}1:{host_port}", ctd.pod_ip_prefix());
    let mut body = Err(String::new());
    let start = Instant::now();
    while start.elapsed() < SETTLE {
        body = http_get(&gateway);
        if body.is_ok() {
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(
        body.as_deref(),
        Ok("hello world $(WHO) $(NOPE)\n/tmp\n"),
        "through hostPort {gateway}"
    );

    let env = ctd
        .exec_printing(&app, &["env"])
        .unwrap_or_else(|e| panic!("env in web: {e}"));
    for want in [
        "GREETING=hello world $(WHO) $(NOPE)".to_string(),
        format!("POD_NAME={web_pod}"),
        "POD_NAMESPACE=default".into(),
        format!("POD_IP={pod_ip}"),
        format!("NODE_NAME={NODE}"),
        "TIER=front".into(),
        "MEM_MI=64".into(),
    ] {
        assert!(
            env.lines().any(|l| l == want),
            "{want:?} not in the container's env:\n{env}"
        );
    }
    let id = ctd
        .exec_printing(&app, &["id"])
        .unwrap_or_else(|e| panic!("id in web: {e}"));
    assert!(id.starts_with("uid=1000 gid=3000"), "id: {id}");
    let hosts = ctd
        .exec_printing(&app, &["cat", "/etc/hosts"])
        .unwrap_or_else(|e| panic!("cat /etc/hosts in web: {e}"));
    assert!(
        hosts
            .lines()
            .any(|l| l == format!("{pod_ip}\twww.shop.default.svc.cluster.local\twww")),
        "/etc/hosts: {hosts}"
    );
    // `ctr tasks exec` can lose the output of a process that ends at once
    // on a loaded machine: an empty answer is asked again, a wrong one fails.
    let mut hostname = String::new();
    for _ in 0..5 {
        hostname = ctd
            .exec_printing(&app, &["hostname"])
            .unwrap_or_else(|e| panic!("hostname in web: {e}"));
        if !hostname.trim().is_empty() {
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(hostname.trim(), "www");
    let resolv = ctd
        .exec_printing(&app, &["cat", "/etc/resolv.conf"])
        .unwrap_or_else(|e| panic!("cat /etc/resolv.conf in web: {e}"));
    assert!(resolv.contains("nameserver 10.96.0.10"), "{resolv}");
    assert!(
        resolv.contains("search default.svc.cluster.local svc.cluster.local cluster.local"),
        "{resolv}"
    );
    assert!(resolv.contains("ndots:5"), "{resolv}");

    // QoS: a Burstable pod (a memory limit, no cpu) in its cgroup under
    // kubepods/burstable, with the OOM score of its share of the memory.
    let uid = ctd
        .object(&sandbox)
        .map(|o| o.label(POD_UID_LABEL).to_string())
        .unwrap_or_default();
    let cgroups = ctd
        .exec_printing(&app, &["cat", "/proc/self/cgroup"])
        .unwrap_or_else(|e| panic!("cat /proc/self/cgroup in web: {e}"));
    let pod_cgroup = format!("/kubepods/burstable/pod{uid}/");
    assert!(
        cgroups.lines().any(|l| l.contains(&pod_cgroup)),
        "{pod_cgroup} not in /proc/self/cgroup:\n{cgroups}"
    );
    let mem_total: i64 = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find_map(|l| l.strip_prefix("MemTotal:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<i64>().ok())
        })
        .expect("MemTotal in /proc/meminfo")
        * 1024;
    let want_oom = (1000 - 1000 * (64i64 << 20) / mem_total).clamp(3, 999);
    let oom = ctd
        .exec_printing(&app, &["cat", "/proc/self/oom_score_adj"])
        .unwrap_or_else(|e| panic!("cat /proc/self/oom_score_adj in web: {e}"));
    assert_eq!(oom.trim(), want_oom.to_string());

    // runAsNonRoot against an image that runs as root: refused, never created.
    let nonroot = kubelet.pod_name("nonroot");
    let want =
        format!("container has runAsNonRoot and image will run as root (pod: \"{nonroot}_default(");
    wait_until(SETTLE, "the runAsNonRoot refusal is logged", || {
        kubelet.log_tail(400).contains(&want)
    });
    assert!(
        ctd.container_ids(&nonroot).is_empty(),
        "a container was created for the refused pod"
    );

    // A removed pod leaves no cgroup behind.
    let cgroup_dirs: Vec<std::path::PathBuf> = [
        "/sys/fs/cgroup",
        "/sys/fs/cgroup/memory",
        "/sys/fs/cgroup/cpu",
    ]
    .iter()
    .map(|root| std::path::Path::new(root).join(pod_cgroup.trim_matches('/')))
    .filter(|p| p.exists())
    .collect();
    assert!(
        !cgroup_dirs.is_empty(),
        "no cgroup directory {pod_cgroup} on this host"
    );
    remove_manifest(&dir, "web.yaml");
    wait_until(SETTLE, "the removed pod's cgroups are gone", || {
        ctd.pod_gone(&web_pod) && cgroup_dirs.iter().all(|p| !p.exists())
    });
}

fn str_at<'a>(v: &'a Value, pointer: &str) -> &'a str {
    v.pointer(pointer).and_then(Value::as_str).unwrap_or("")
}

/// An API pod with one container running `script` once.
fn api_pod(name: &str, script: &str, container_extra: Value) -> Value {
    let mut container = json!({
        "name": "app",
        "image": BUSYBOX_IMAGE,
        "imagePullPolicy": "IfNotPresent",
        "command": ["sh", "-c", script],
    });
    if let (Some(c), Value::Object(extra)) = (container.as_object_mut(), container_extra) {
        c.extend(extra);
    }
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "nodeName": NODE,
            "automountServiceAccountToken": false,
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 2,
            "containers": [container],
        },
    })
}

/// Termination messages reach the API status: the file's content (File),
/// the log's tail when a failed container wrote none
/// (FallbackToLogsOnError), the file over the log when both exist; a
/// container whose process went over its memory limit is OOMKilled; a
/// runAsNonRoot refusal is the container's CreateContainerConfigError; with
/// `--allow-privileged=false` a hostNetwork pod fails admission.
#[test]
fn termination_messages_and_config_errors_reach_the_api_status() {
    let fake = FakeApiServer::start();
    let ctd = PrivateContainerd::start();
    let kubeconfig = fake.node_kubeconfig(ctd.dir(), NODE);
    let kubeconfig = kubeconfig.display().to_string();
    let _kubelet = Tinylet::start_with(
        &ctd,
        NODE,
        &["--kubeconfig", &kubeconfig, "--allow-privileged=false"],
    );

    fake.create_pod(api_pod(
        "file",
        "echo -n 'bye from file' > /dev/termination-log; echo noise; exit 0",
        json!({}),
    ));
    fake.create_pod(api_pod(
        "custom",
        "echo -n 'custom path' > /tmp/why; exit 7",
        json!({"terminationMessagePath": "/tmp/why"}),
    ));
    fake.create_pod(api_pod(
        "logs",
        // stdout and stderr reach the log through separate pipes: a pause
        // keeps their order in the file certain.
        "echo first line; sleep 1; echo 'last words' >&2; exit 3",
        json!({"terminationMessagePolicy": "FallbackToLogsOnError"}),
    ));
    fake.create_pod(api_pod(
        "both",
        "echo -n 'from file' > /dev/termination-log; echo from log; exit 4",
        json!({"terminationMessagePolicy": "FallbackToLogsOnError"}),
    ));
    // dd's 64 MiB block is more than the 16 MiB limit allows. containerd
    // learns of an OOM kill by an event from the shim, which watches only
    // once the task runs and may report after a process's exit (then it
    // says Error): dd starts a second late and the shell outlives it.
    fake.create_pod(api_pod(
        "oom",
        "sleep 1; dd if=/dev/zero of=/dev/null bs=64M count=1; sleep 1; exit 1",
        json!({"resources": {"limits": {"memory": "16Mi"}}}),
    ));
    let mut hostnet = api_pod("hostnet", LONG_RUNNING, json!({}));
    hostnet["spec"]["hostNetwork"] = json!(true);
    fake.create_pod(hostnet);
    fake.create_pod(api_pod(
        "nonroot",
        LONG_RUNNING,
        json!({"securityContext": {"runAsNonRoot": true}}),
    ));

    let terminated = |name: &str| -> Option<Value> {
        let pod = fake.pod("default", name)?;
        pod.pointer("/status/containerStatuses/0/state/terminated")
            .cloned()
    };
    for (name, code, message) in [
        ("file", 0, "bye from file"),
        ("custom", 7, "custom path"),
        ("logs", 3, "first line\nlast words\n"),
        ("both", 4, "from file"),
    ] {
        wait_until(
            SETTLE,
            &format!("pod {name} reports its container terminated"),
            || terminated(name).is_some(),
        );
        let t = terminated(name).unwrap_or_default();
        assert_eq!(t["exitCode"], json!(code), "{name}: {t}");
        assert_eq!(str_at(&t, "/message"), message, "{name}: {t}");
    }

    // The memory limit is enforced: the kernel kills the container and the
    // status says so.
    wait_until(SETTLE, "pod oom reports its container terminated", || {
        terminated("oom").is_some()
    });
    let t = terminated("oom").unwrap_or_default();
    assert_eq!(str_at(&t, "/reason"), "OOMKilled", "oom: {t}");

    wait_until(
        SETTLE,
        "pod nonroot reports CreateContainerConfigError",
        || {
            fake.pod("default", "nonroot").is_some_and(|p| {
                str_at(&p, "/status/containerStatuses/0/state/waiting/reason")
                    == "CreateContainerConfigError"
            })
        },
    );
    let pod = fake.pod("default", "nonroot").unwrap_or_default();
    let uid = str_at(&pod, "/metadata/uid");
    assert_eq!(
        str_at(&pod, "/status/containerStatuses/0/state/waiting/message"),
        format!(
            "container has runAsNonRoot and image will run as root (pod: \"nonroot_default({uid})\", container: app)"
        )
    );
    assert!(ctd.container_ids("nonroot").is_empty());

    // --allow-privileged=false: a hostNetwork pod is refused at admission.
    wait_until(
        SETTLE,
        "pod hostnet is refused with PrivilegedForbidden",
        || {
            fake.pod("default", "hostnet").is_some_and(|p| {
                str_at(&p, "/status/phase") == "Failed"
                    && str_at(&p, "/status/reason") == "PrivilegedForbidden"
            })
        },
    );
    let pod = fake.pod("default", "hostnet").unwrap_or_default();
    assert_eq!(
        str_at(&pod, "/status/message"),
        "Pod was rejected: Pod specified host networking, but privileged pods are disallowed on this node (--allow-privileged=false)"
    );
    assert!(ctd.sandbox_ids("hostnet").is_empty());
}

/// The security context as the process sees it: capabilities dropped and
/// added, no new privileges, a read-only root filesystem, a pod sysctl, and
/// a tty. The container checks each itself and exits with a code naming
/// the first that failed (0: all held).
#[test]
fn security_context_and_tty_reach_the_process() {
    let ctd = PrivateContainerd::start();
    let kubelet = Tinylet::start(&ctd, NODE);
    // NET_BIND_SERVICE is capability 10: CapEff 0x400 with every other
    // capability dropped.
    let script = "grep -q '^NoNewPrivs:[[:space:]]*1' /proc/self/status || exit 11; \
        [ \"$(awk '/^CapEff/ {print $2}' /proc/self/status)\" = 0000000000000400 ] || exit 12; \
        if touch /rootfs-probe 2>/dev/null; then exit 13; fi; \
        set -- $(cat /proc/sys/net/ipv4/ping_group_range); [ \"$1 $2\" = '0 65535' ] || exit 14; \
        [ -t 1 ] || exit 15; exit 0";
    // The pod's user, groups, fsGroup and seccomp profile, as a second
    // container sees them.
    let user_script = "[ \"$(id -u)\" = 1000 ] || exit 16; [ \"$(id -g)\" = 3000 ] || exit 17; \
        case \" $(id -G) \" in *' 2000 '*) ;; *) exit 18;; esac; \
        case \" $(id -G) \" in *' 4000 '*) ;; *) exit 19;; esac; \
        grep -q '^Seccomp:[[:space:]]*2' /proc/self/status || exit 20; \
        touch /scratch/f || exit 21; [ \"$(stat -c %g /scratch/f)\" = 2000 ] || exit 22; \
        [ \"$(stat -c %g /podinfo/..data/name)\" = 2000 ] || exit 23; \
        cat /podinfo/name >/dev/null || exit 24; exit 0";
    let manifest = format!(
        r#"apiVersion: v1
kind: Pod
metadata:
  name: secure
spec:
  restartPolicy: Never
  terminationGracePeriodSeconds: 2
  securityContext:
    sysctls:
    - name: net.ipv4.ping_group_range
      value: "0 65535"
    runAsUser: 1000
    runAsGroup: 3000
    fsGroup: 2000
    supplementalGroups: [4000]
    seccompProfile:
      type: RuntimeDefault
  volumes:
  - name: scratch
    emptyDir: {{}}
  - name: podinfo
    downwardAPI:
      items:
      - path: name
        mode: 0600
        fieldRef:
          fieldPath: metadata.name
  containers:
  - name: app
    image: {BUSYBOX_IMAGE}
    imagePullPolicy: IfNotPresent
    stdin: true
    tty: true
    command: ["sh", "-c", {script:?}]
    securityContext:
      runAsUser: 0
      runAsGroup: 0
      seccompProfile:
        type: Unconfined
      allowPrivilegeEscalation: false
      readOnlyRootFilesystem: true
      capabilities:
        drop: ["ALL"]
        add: ["NET_BIND_SERVICE"]
  - name: user
    image: {BUSYBOX_IMAGE}
    imagePullPolicy: IfNotPresent
    command: ["sh", "-c", {user_script:?}]
    volumeMounts:
    - name: scratch
      mountPath: /scratch
    - name: podinfo
      mountPath: /podinfo
"#
    );
    write_manifest(&kubelet.manifest_dir(), "secure.yaml", &manifest);
    let pod = kubelet.pod_name("secure");
    let exit = |name: &str| {
        ctd.container_ids_named(&pod, name)
            .first()
            .and_then(|id| ctd.container_exit(id))
            .map(|e| e.1)
    };
    wait_until(SETTLE, "the checking containers end", || {
        exit("app").is_some() && exit("user").is_some()
    });
    assert_eq!(
        exit("app"),
        Some(0),
        "11: no_new_privs, 12: capabilities, 13: read-only root, 14: sysctl, 15: tty"
    );
    assert_eq!(
        exit("user"),
        Some(0),
        "16: runAsUser, 17: runAsGroup, 18: fsGroup, 19: supplementalGroups, 20: seccomp, \
         21/22: emptyDir writable with the fsGroup, 23/24: volume file group"
    );
}
