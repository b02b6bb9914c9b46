//! Crash tests: tinylet, a cluster node of the fake apiserver running pods
//! in a private real containerd, kills itself with SIGKILL at each of its
//! kill points (`src/fault.rs`, armed by `TINYLET_KILL_POINT`) during pod
//! start, in-place update, removal, graceful termination, status reporting
//! and housekeeping. After each crash it is started again, and the node must
//! converge to what was asked, exactly once: one sandbox per pod UID, one
//! container per container name and attempt, the newest spec running,
//! nothing left of removed pods (in containerd, in the API, in the root
//! dir), checkpoints whole, and the pods that were never touched still
//! running in the same containers.
//!
//! One containerd serves every point in turn (start-ups are the slow part);
//! each point has pods of its own, so a failure names its point.

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::e2e::{LONG_RUNNING, NODE};
use crate::support::containerd::{
    remove_manifest, scaled, tail, write_manifest, PrivateContainerd, Tinylet, BUSYBOX_IMAGE,
    CONTAINER_NAME_LABEL, KIND_LABEL, POD_NAME_LABEL, POD_UID_LABEL,
};
use crate::support::fake_apiserver::{FakeApiServer, MIRROR_ANNOTATION};

const NS: &str = "default";
const KILL_ENV: &str = "TINYLET_KILL_POINT";
/// The second image an in-place update switches to (a tag of busybox).
const IMAGE_V2: &str = "docker.io/tinylet/busybox:2";
/// How long convergence may take after a restart (generous: a loaded CI
/// machine, and graceful stops of up to 10 s).
const CONVERGE: Duration = Duration::from_secs(60);
/// How long the converged state must then hold (late duplicates show here).
const HOLD: Duration = Duration::from_millis(1500);

/// What one pod should look like once the node has converged.
#[derive(Clone, Debug)]
struct Want {
    /// Containers that must run (init containers are checked for duplicates
    /// only).
    containers: Vec<&'static str>,
    /// Container hashes (`io.kubernetes.container.hash`) of specs replaced
    /// since: the newest container must not have one of them. (The image
    /// name containerd records cannot tell, as both tags share one image.)
    replaced: Vec<String>,
    /// An API pod (its status must say Running) or a static pod (it must
    /// have a mirror pod).
    api: bool,
}

/// One CRI object with what the checks read.
#[derive(Clone, Debug)]
struct Obj {
    pod: String,
    uid: String,
    sandbox: bool,
    container: String,
    attempt: u32,
    hash: String,
}

struct Rig {
    api: FakeApiServer,
    ctd: PrivateContainerd,
    t: Tinylet,
    checkpoints: PathBuf,
    /// Runtime pod name → what it must look like.
    desired: BTreeMap<String, Want>,
    /// Runtime pod names that must be gone (from containerd and the API).
    gone: BTreeSet<String>,
    /// Containers that must never change: (pod, container ID).
    steady: Vec<(String, String)>,
    cache: RefCell<HashMap<String, Obj>>,
    /// (point, seconds from the restart to converged) per crash.
    figures: Vec<(String, f64)>,
}

fn static_manifest(name: &str, extra_spec: &str) -> String {
    format!(
        r#"apiVersion: v1
kind: Pod
metadata:
  name: {name}
spec:
  terminationGracePeriodSeconds: 5
{extra_spec}  containers:
  - name: app
    image: {BUSYBOX_IMAGE}
    imagePullPolicy: IfNotPresent
    command: ["sh", "-c", {LONG_RUNNING:?}]
"#
    )
}

fn api_pod(name: &str, grace: i64, pre_stop: bool) -> Value {
    let mut container = json!({
        "name": "app",
        "image": BUSYBOX_IMAGE,
        "imagePullPolicy": "IfNotPresent",
        "command": ["sh", "-c", LONG_RUNNING],
    });
    if pre_stop {
        container["lifecycle"] = json!({"preStop": {"exec": {"command": ["sleep", "1"]}}});
    }
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "nodeName": NODE,
            "automountServiceAccountToken": false,
            "terminationGracePeriodSeconds": grace,
            "containers": [container],
        },
    })
}

fn str_at<'a>(v: &'a Value, pointer: &str) -> &'a str {
    v.pointer(pointer).and_then(Value::as_str).unwrap_or("")
}

impl Rig {
    fn start() -> Rig {
        let api = FakeApiServer::start();
        let ctd = PrivateContainerd::start();
        ctd.ctr(&["images", "tag", BUSYBOX_IMAGE, IMAGE_V2]);
        let kubeconfig = api.node_kubeconfig(ctd.dir(), NODE);
        let checkpoints = ctd.dir().join("checkpoints");
        let t = Tinylet::start_with(
            &ctd,
            NODE,
            &[
                "--kubeconfig",
                &kubeconfig.display().to_string(),
                "--bootstrap-checkpoint-path",
                &checkpoints.display().to_string(),
                // Dead containers go at the next sync (prune-dead).
                "--maximum-dead-containers-per-container",
                "0",
            ],
        );
        Rig {
            api,
            ctd,
            t,
            checkpoints,
            desired: BTreeMap::new(),
            gone: BTreeSet::new(),
            steady: Vec::new(),
            cache: RefCell::new(HashMap::new()),
            figures: Vec::new(),
        }
    }

    fn add_static(&mut self, name: &str, extra_spec: &str) {
        write_manifest(
            &self.t.manifest_dir(),
            &format!("{name}.yaml"),
            &static_manifest(name, extra_spec),
        );
        self.desired.insert(
            format!("{name}-{NODE}"),
            Want {
                containers: vec!["app"],
                replaced: Vec::new(),
                api: false,
            },
        );
    }

    fn remove_static(&mut self, name: &str) {
        remove_manifest(&self.t.manifest_dir(), &format!("{name}.yaml"));
        let pod = format!("{name}-{NODE}");
        self.desired.remove(&pod);
        self.gone.insert(pod);
    }

    fn add_api(&mut self, name: &str, grace: i64, pre_stop: bool) {
        self.api.create_pod(api_pod(name, grace, pre_stop));
        self.desired.insert(
            name.to_string(),
            Want {
                containers: vec!["app"],
                replaced: Vec::new(),
                api: true,
            },
        );
    }

    fn update_api_image(&mut self, name: &str) {
        let old: Vec<String> = self
            .objects()
            .into_iter()
            .filter(|(_, o)| o.pod == name && !o.sandbox)
            .map(|(_, o)| o.hash)
            .collect();
        assert!(!old.is_empty(), "{name} has no container to update");
        assert!(self.api.update_pod(NS, name, |p| {
            p["spec"]["containers"][0]["image"] = json!(IMAGE_V2);
        }));
        if let Some(w) = self.desired.get_mut(name) {
            w.replaced.extend(old);
        }
    }

    fn delete_api(&mut self, name: &str, grace: i64) {
        self.api.delete_pod(NS, name, Some(grace));
        self.desired.remove(name);
        self.gone.insert(name.to_string());
    }

    /// The UID of the running pod `pod` (from its sandbox's labels).
    fn uid_of(&self, pod: &str) -> String {
        let objs = self.objects();
        objs.iter()
            .find(|(_, o)| o.pod == pod && o.sandbox)
            .map(|(_, o)| o.uid.clone())
            .unwrap_or_else(|| panic!("pod {pod} has no sandbox"))
    }

    /// Every CRI object in containerd (their metadata never changes, so it
    /// is read once per ID).
    fn objects(&self) -> Vec<(String, Obj)> {
        let ids = self.ctd.ids("");
        let mut cache = self.cache.borrow_mut();
        let mut out = Vec::new();
        for id in ids {
            if let Some(o) = cache.get(&id) {
                out.push((id, o.clone()));
                continue;
            }
            let Some(cri) = self.ctd.object(&id) else {
                continue; // removed meanwhile
            };
            let o = Obj {
                pod: cri.label(POD_NAME_LABEL).to_string(),
                uid: cri.label(POD_UID_LABEL).to_string(),
                sandbox: cri.label(KIND_LABEL) == "sandbox",
                container: cri.label(CONTAINER_NAME_LABEL).to_string(),
                attempt: cri.attempt,
                hash: cri
                    .annotations
                    .get("io.kubernetes.container.hash")
                    .cloned()
                    .unwrap_or_default(),
            };
            cache.insert(id.clone(), o.clone());
            out.push((id, o));
        }
        out
    }

    /// What is not yet (or no longer) as asked; empty when converged.
    fn problems(&self) -> Vec<String> {
        let mut p = Vec::new();
        let objs = self.objects();
        let tasks = self.ctd.tasks();
        let running = |id: &str| tasks.get(id).map(String::as_str) == Some("RUNNING");
        let mut by_pod: BTreeMap<&str, Vec<&(String, Obj)>> = BTreeMap::new();
        for o in &objs {
            by_pod.entry(o.1.pod.as_str()).or_default().push(o);
        }
        let mut desired_uids = BTreeSet::new();
        for (pod, want) in &self.desired {
            let Some(objs) = by_pod.get(pod.as_str()) else {
                p.push(format!("{pod}: nothing in containerd"));
                continue;
            };
            let uids: BTreeSet<&str> = objs.iter().map(|(_, o)| o.uid.as_str()).collect();
            if uids.len() != 1 {
                p.push(format!("{pod}: objects of {} UIDs: {uids:?}", uids.len()));
                continue;
            }
            desired_uids.extend(uids.iter().map(|u| u.to_string()));
            let sandboxes: Vec<&str> = objs
                .iter()
                .filter(|(_, o)| o.sandbox)
                .map(|(id, _)| id.as_str())
                .collect();
            match sandboxes.as_slice() {
                [s] if running(s) => {}
                [s] => p.push(format!("{pod}: sandbox {s:.12} not running")),
                _ => p.push(format!(
                    "{pod}: {} sandboxes: {sandboxes:?}",
                    sandboxes.len()
                )),
            }
            let mut attempts: BTreeMap<(&str, u32), Vec<&str>> = BTreeMap::new();
            for (id, o) in objs.iter().filter(|(_, o)| !o.sandbox) {
                attempts
                    .entry((o.container.as_str(), o.attempt))
                    .or_default()
                    .push(id);
            }
            for ((name, attempt), ids) in &attempts {
                if ids.len() > 1 {
                    p.push(format!(
                        "{pod}: {} containers {name:?} of attempt {attempt}: {ids:?}",
                        ids.len()
                    ));
                }
            }
            for name in &want.containers {
                let newest = objs
                    .iter()
                    .filter(|(_, o)| !o.sandbox && o.container == *name)
                    .max_by_key(|(_, o)| o.attempt);
                match newest {
                    None => p.push(format!("{pod}: no container {name:?}")),
                    Some((id, _)) if !running(id) => {
                        p.push(format!("{pod}: container {name:?} ({id:.12}) not running"))
                    }
                    Some((id, o)) if want.replaced.contains(&o.hash) => p.push(format!(
                        "{pod}: container {name:?} ({id:.12}) runs a replaced spec (hash {})",
                        o.hash
                    )),
                    Some((id, _)) if want.api => {
                        let status = self.api.pod(NS, pod).map(|v| v["status"].clone());
                        let status = status.unwrap_or(Value::Null);
                        let cid = format!("containerd://{id}");
                        if str_at(&status, "/phase") != "Running"
                            || str_at(&status, "/containerStatuses/0/containerID") != cid
                            || status
                                .pointer("/containerStatuses/0/state/running")
                                .is_none()
                        {
                            p.push(format!("{pod}: API status does not say Running in {cid}"));
                        }
                    }
                    Some(_) => {
                        let mirror = self.api.pod(NS, pod);
                        let is_mirror = mirror.as_ref().is_some_and(|m| {
                            !str_at(
                                m,
                                &format!(
                                    "/metadata/annotations/{}",
                                    MIRROR_ANNOTATION.replace('/', "~1")
                                ),
                            )
                            .is_empty()
                        });
                        if !is_mirror {
                            p.push(format!("{pod}: no mirror pod in the API"));
                        }
                    }
                }
            }
        }
        for pod in by_pod.keys() {
            if !self.desired.contains_key(*pod) {
                p.push(format!("{pod}: left in containerd though not wanted"));
            }
        }
        for pod in &self.gone {
            if self.api.pod(NS, pod).is_some() {
                p.push(format!("{pod}: still in the API"));
            }
        }
        for (pod, id) in &self.steady {
            if !running(id) {
                p.push(format!(
                    "{pod}: steady container {id:.12} no longer running"
                ));
            }
        }
        // The root dir holds only the directories of pods that run.
        let pods_dir = self.t.root_dir().join("pods");
        for e in std::fs::read_dir(&pods_dir).into_iter().flatten().flatten() {
            let uid = e.file_name().to_string_lossy().to_string();
            if !desired_uids.contains(&uid) {
                p.push(format!(
                    "pod directory {uid} left in {}",
                    pods_dir.display()
                ));
            }
        }
        p.extend(checkpoint_problems(&self.checkpoints));
        p
    }

    /// Waits until `problems` is empty and stays so for `HOLD`; returns the
    /// seconds it took to converge.
    fn converge(&self, after: &str) -> f64 {
        let start = Instant::now();
        let deadline = start + scaled(CONVERGE);
        loop {
            assert_alive(&self.t, after);
            let problems = self.problems();
            if problems.is_empty() {
                let took = start.elapsed().as_secs_f64();
                let held = Instant::now();
                while held.elapsed() < HOLD {
                    let problems = self.problems();
                    assert!(
                        problems.is_empty(),
                        "{after}: converged, then no longer: {problems:#?}\n{}",
                        self.t.log_tail(80)
                    );
                    std::thread::sleep(Duration::from_millis(100));
                }
                return took;
            }
            if Instant::now() > deadline {
                panic!(
                    "{after}: not converged within {:?}: {problems:#?}\n--- tinylet log ---\n{}",
                    scaled(CONVERGE),
                    self.t.log_tail(100)
                );
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Stops tinylet cleanly, runs `while_down`, starts it with the kill
    /// point armed, runs `action`, waits for the SIGKILL, starts it again
    /// unarmed and waits until the node has converged.
    fn crash(
        &mut self,
        point: &str,
        context: &str,
        while_down: impl FnOnce(&mut Rig),
        action: impl FnOnce(&mut Rig),
    ) {
        self.crash_with(point, |_| context.to_string(), while_down, action)
    }

    /// Like `crash`, with the context made once `while_down` has run.
    fn crash_with(
        &mut self,
        point: &str,
        context: impl FnOnce(&Rig) -> String,
        while_down: impl FnOnce(&mut Rig),
        action: impl FnOnce(&mut Rig),
    ) {
        let status = self.t.sigterm();
        assert!(status.success(), "tinylet exited with {status} on SIGTERM");
        while_down(self);
        let context = context(self);
        self.t
            .set_env(KILL_ENV, Some(&format!("{point}@{context}")));
        self.t.restart();
        action(self);
        let status = self.t.wait_for_exit(scaled(CONVERGE));
        let log = self.t.log_since_start();
        assert_eq!(
            status.signal(),
            Some(libc::SIGKILL),
            "{point}@{context}: tinylet did not kill itself ({status})\n{}",
            tail(self.t.log_path(), 60)
        );
        assert!(
            log.contains(&format!("kill point {point} reached")),
            "{point}@{context}: killed, but not by its kill point\n{}",
            tail(self.t.log_path(), 60)
        );
        self.t.set_env(KILL_ENV, None);
        let restarted = Instant::now();
        self.t.restart();
        self.converge(&format!("after a crash at {point}@{context}"));
        self.figures.push((
            format!("{point}@{context}"),
            restarted.elapsed().as_secs_f64(),
        ));
    }
}

fn assert_alive(t: &Tinylet, what: &str) {
    let Some(pid) = t.pid() else {
        panic!("{what}: tinylet is not running");
    };
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let state = stat
        .rsplit_once(") ")
        .and_then(|(_, rest)| rest.split_whitespace().next())
        .unwrap_or("gone");
    assert!(
        state != "Z" && state != "gone",
        "{what}: tinylet exited\n{}",
        t.log_tail(80)
    );
}

/// Checkpoints that are not whole JSON documents with a pod.
fn checkpoint_problems(dir: &Path) -> Vec<String> {
    let mut p = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let name = e.file_name().to_string_lossy().to_string();
        if name.starts_with('.') {
            continue; // a temp file, never read as a checkpoint
        }
        let text = std::fs::read_to_string(e.path()).unwrap_or_default();
        let ok = serde_json::from_str::<Value>(&text)
            .ok()
            .is_some_and(|v| v["Pod"]["metadata"]["uid"].is_string());
        if !ok {
            p.push(format!("checkpoint {name} is not a whole checkpoint"));
        }
    }
    p
}

/// Init container, volumes: a pod that meets every start-up point.
const INIT_AND_VOLUMES: &str = r#"  volumes:
  - name: scratch
    emptyDir: {medium: Memory}
  - name: info
    downwardAPI:
      items:
      - path: name
        fieldRef: {fieldPath: metadata.name}
  initContainers:
  - name: init
    image: docker.io/tinylet/busybox:1
    imagePullPolicy: IfNotPresent
    command: ["true"]
"#;

#[test]
fn a_crash_at_any_kill_point_loses_and_doubles_nothing() {
    let mut r = Rig::start();

    // Pods that no point touches: their containers must never change.
    r.add_static("steady", "");
    r.add_api("steady-api", 5, false);
    r.converge("the first start");
    for pod in [format!("steady-{NODE}"), "steady-api".to_string()] {
        for (id, o) in r.objects() {
            if o.pod == pod && !o.sandbox {
                r.steady.push((pod.clone(), id));
            }
        }
    }
    assert_eq!(r.steady.len(), 2, "{:?}", r.steady);

    // Pod start, from the file source.
    let start_points: &[(&str, &str, &str)] = &[
        ("manifest-read", "s01", ""),
        ("sync-begin", "s02", ""),
        ("volumes-set-up", "s03", INIT_AND_VOLUMES),
        ("sandbox-create", "s04", INIT_AND_VOLUMES),
        ("sandbox-created", "s05", INIT_AND_VOLUMES),
        ("container-created", "s06", ""),
        ("container-started", "s07", INIT_AND_VOLUMES),
        ("pleg-relist", "s08", ""),
        ("mirror-create", "s09", ""),
    ];
    for (point, name, extra) in start_points {
        let context = match *point {
            "manifest-read" => format!("{name}.yaml"),
            // The init container: killed between it and the app.
            "container-started" => format!("{name}-{NODE}/init"),
            _ => format!("{name}-{NODE}"),
        };
        r.crash(point, &context, |_| {}, |r| r.add_static(name, extra));
    }

    // Pod start from the API: the checkpoint and the first status.
    // A checkpoint staged, not yet renamed into place (the pod is created
    // while tinylet is down, so that its UID names the file).
    r.crash_with(
        "file-staged",
        |r| {
            let pod = r.api.pod(NS, "a10").expect("a10 created");
            format!("Pod_{}", str_at(&pod, "/metadata/uid"))
        },
        |r| r.add_api("a10", 5, false),
        |_| {},
    );
    r.crash(
        "status-patch",
        "default/a11",
        |_| {},
        |r| r.add_api("a11", 5, false),
    );

    // In-place update: a new image replaces the container, sandbox kept.
    for (point, name) in [
        ("container-kill", "a12"),
        ("container-stopped", "a13"),
        ("container-created", "a14"),
        ("container-started", "a15"),
    ] {
        r.add_api(name, 5, false);
        r.converge(&format!("{name} before its update"));
        r.crash(
            point,
            &format!("default/{name}/app"),
            |_| {},
            |r| r.update_api_image(name),
        );
    }

    // Removal of a static pod: every step of its teardown.
    for (point, name, extra) in [
        ("pod-kill", "s16", ""),
        ("containers-stopped", "s17", ""),
        ("sandbox-stopped", "s18", ""),
        ("volumes-torn-down", "s19", INIT_AND_VOLUMES),
        ("containers-removed", "s20", ""),
        ("sandboxes-removed", "s21", INIT_AND_VOLUMES),
    ] {
        r.add_static(name, extra);
        r.converge(&format!("{name} before its removal"));
        let context = match point {
            "containers-removed" | "sandboxes-removed" => r.uid_of(&format!("{name}-{NODE}")),
            _ => format!("{name}-{NODE}"),
        };
        r.crash(point, &context, |_| {}, |r| r.remove_static(name));
    }

    // Graceful termination of API pods: the preStop hook, the stop, and
    // the final delete of the API object.
    r.add_api("a22", 10, true);
    r.add_api("a23", 10, true);
    r.add_api("a24", 5, false);
    r.converge("a22-a24 before their deletion");
    r.crash(
        "pre-stop",
        "default/a22/app",
        |_| {},
        |r| r.delete_api("a22", 10),
    );
    r.crash(
        "container-kill",
        "default/a23/app",
        |_| {},
        |r| r.delete_api("a23", 10),
    );
    r.crash(
        "api-delete",
        "default/a24",
        |_| {},
        |r| r.delete_api("a24", 5),
    );

    // Housekeeping: a manifest removed while tinylet was down, and a pod
    // directory a crash left behind.
    r.add_static("s25", "");
    r.converge("s25 before tinylet goes down");
    r.crash(
        "housekeeping-orphan",
        &format!("default/s25-{NODE}"),
        |r| r.remove_static("s25"),
        |_| {},
    );
    let left = "2c5e0000-0000-4000-8000-00000000kill";
    r.crash(
        "orphan-dir",
        left,
        |r| {
            let dir =
                r.t.root_dir()
                    .join("pods")
                    .join(left)
                    .join("volumes/kubernetes.io~empty-dir/x");
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(dir.join("data"), "left by a crash").unwrap();
        },
        |_| {},
    );

    // Dead-container GC: a container that fails once and then runs; its
    // dead first instance is removed at the sync after the restart.
    r.crash(
        "prune-dead",
        &format!("default/s27-{NODE}"),
        |_| {},
        |r| {
            write_manifest(
                &r.t.manifest_dir(),
                "s27.yaml",
                &format!(
                    r#"apiVersion: v1
kind: Pod
metadata:
  name: s27
spec:
  terminationGracePeriodSeconds: 5
  volumes:
  - name: data
    emptyDir: {{}}
  containers:
  - name: app
    image: {BUSYBOX_IMAGE}
    imagePullPolicy: IfNotPresent
    volumeMounts:
    - {{name: data, mountPath: /data}}
    command: ["sh", "-c", "[ -e /data/ran ] || {{ touch /data/ran; exit 1; }}; {LONG_RUNNING}"]
"#
                ),
            );
            r.desired.insert(
                format!("s27-{NODE}"),
                Want {
                    containers: vec!["app"],
                    replaced: Vec::new(),
                    api: false,
                },
            );
        },
    );

    let points: BTreeSet<&str> = r
        .figures
        .iter()
        .filter_map(|(p, _)| p.split('@').next())
        .collect();
    eprintln!(
        "kill points: {} crashes at {} distinct points; restart to converged (s):",
        r.figures.len(),
        points.len()
    );
    for (p, s) in &r.figures {
        eprintln!("  {p:<55} {s:.1}");
    }
    assert!(points.len() >= 20, "only {} distinct points", points.len());
    r.t.assert_running();
}
