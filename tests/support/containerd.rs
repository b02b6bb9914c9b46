//! The end-to-end harness: a private, real containerd per test (started and
//! stopped by `packaging/containerd-private.sh`, the same script the demo and
//! CI use), views of the CRI objects it holds through `ctr`, and the real
//! `tinylet` binary run against it.
//!
//! Everything a test creates lives under one temp dir (containerd's root and
//! state, the CNI config and leases, tinylet's manifest and root dirs, both
//! logs), so tests can run in parallel and leave nothing behind.

#![allow(dead_code)]

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Label containerd's CRI plugin puts on every object it creates: `sandbox`
/// or `container`.
pub const KIND_LABEL: &str = "io.cri-containerd.kind";
pub const POD_NAME_LABEL: &str = "io.kubernetes.pod.name";
pub const POD_NAMESPACE_LABEL: &str = "io.kubernetes.pod.namespace";
pub const POD_UID_LABEL: &str = "io.kubernetes.pod.uid";
pub const CONTAINER_NAME_LABEL: &str = "io.kubernetes.container.name";

/// The images `containerd-private.sh` imports into namespace k8s.io.
pub const BUSYBOX_IMAGE: &str = "docker.io/tinylet/busybox:1";
pub const PAUSE_IMAGE: &str = "docker.io/tinylet/pause:1";

const CTR_TIMEOUT: &str = "10s";

/// The tinylet binary the end-to-end tests run: `TINYLET_E2E_BIN` when set
/// (another build of it, e.g. the aarch64 release binary), else the one
/// cargo built with the tests.
pub fn tinylet_bin() -> PathBuf {
    match std::env::var_os("TINYLET_E2E_BIN") {
        Some(p) if !p.is_empty() => PathBuf::from(p),
        _ => PathBuf::from(env!("CARGO_BIN_EXE_tinylet")),
    }
}

/// A program the binary runs under, from `TINYLET_E2E_WRAPPER`: an emulator
/// such as `qemu-aarch64-static` that runs the guest in its own process, so
/// the process the tests start, signal and kill is tinylet itself.
pub fn tinylet_wrapper() -> Option<PathBuf> {
    std::env::var_os("TINYLET_E2E_WRAPPER")
        .filter(|p| !p.is_empty())
        .map(PathBuf::from)
}

/// How many times slower than native tinylet runs here, from
/// `TINYLET_E2E_TIME_SCALE` (a positive number; 1 when unset). Under an
/// emulator every step takes several times longer.
pub fn time_scale() -> f64 {
    let Some(raw) = std::env::var_os("TINYLET_E2E_TIME_SCALE") else {
        return 1.0;
    };
    let text = raw.to_string_lossy();
    match text.trim().parse::<f64>() {
        Ok(f) if f.is_finite() && f >= 1.0 => f,
        _ => panic!("TINYLET_E2E_TIME_SCALE={text:?}: expected a number of at least 1"),
    }
}

/// `d` stretched by `time_scale()`: for timeouts, and for periods tinylet
/// must have had time to act in.
pub fn scaled(d: Duration) -> Duration {
    d.mul_f64(time_scale())
}

fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn script() -> PathBuf {
    repo_root().join("packaging/containerd-private.sh")
}

/// Makes a fresh, short directory under /tmp (unix socket paths must stay
/// short). Unique across threads and processes.
fn unique_dir(prefix: &str) -> PathBuf {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    for attempt in 0..100u32 {
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let dir = PathBuf::from(format!(
            "/tmp/{prefix}.{}.{n}.{:x}",
            std::process::id(),
            nanos.wrapping_add(attempt)
        ));
        match fs::create_dir(&dir) {
            Ok(()) => return dir,
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => panic!("creating test dir {}: {e}", dir.display()),
        }
    }
    panic!("could not create a unique test dir under /tmp")
}

/// Names what the end-to-end tests need and this machine lacks; never skips.
fn check_prerequisites() {
    let mut missing = Vec::new();
    for tool in [
        "containerd",
        "ctr",
        "runc",
        "containerd-shim-runc-v2",
        "ip",
        "iptables",
        "flock",
    ] {
        let found = Command::new("sh")
            .args(["-c", &format!("command -v {tool}")])
            .stdout(Stdio::null())
            .status()
            .map(|s| s.success())
            .unwrap_or(false);
        if !found {
            missing.push(tool.to_string());
        }
    }
    for plugin in ["bridge", "host-local", "portmap", "loopback"] {
        let p = Path::new("/usr/lib/cni").join(plugin);
        if !p.exists() {
            missing.push(p.display().to_string());
        }
    }
    if !Path::new("/bin/busybox").exists() {
        missing.push("/bin/busybox (package busybox-static)".into());
    }
    if !missing.is_empty() {
        panic!(
            "the end-to-end tests need a real containerd and its tools; missing: {}. \
             Install them with `bash packaging/deps.sh` (Debian packages containerd, runc, \
             containernetworking-plugins, busybox-static, iproute2, iptables).",
            missing.join(", ")
        );
    }
    let uid = Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    if uid != "0" {
        panic!(
            "the end-to-end tests run a private containerd and need root (uid 0), running as uid {uid:?}"
        );
    }
}

/// Last `lines` lines of a file, or a note saying why there are none.
pub fn tail(path: &Path, lines: usize) -> String {
    match fs::read(path) {
        Ok(bytes) => {
            let text = String::from_utf8_lossy(&bytes);
            let all: Vec<&str> = text.lines().collect();
            let start = all.len().saturating_sub(lines);
            all[start..].join("\n")
        }
        Err(e) => format!("(cannot read {}: {e})", path.display()),
    }
}

/// One CRI object (sandbox or container) as containerd stores it.
#[derive(Debug, Clone)]
pub struct CriObject {
    pub id: String,
    pub labels: BTreeMap<String, String>,
    /// `metadata.attempt` of the CRI config (0 when absent).
    pub attempt: u32,
    /// Annotations of the CRI config (the kubelet's restart count, hash...).
    pub annotations: BTreeMap<String, String>,
    pub created_at: String,
}

impl CriObject {
    pub fn is_sandbox(&self) -> bool {
        self.labels.get(KIND_LABEL).map(String::as_str) == Some("sandbox")
    }

    pub fn label(&self, key: &str) -> &str {
        self.labels.get(key).map(String::as_str).unwrap_or("")
    }
}

/// A containerd with its own root, state, sockets, CNI network and images,
/// stopped (tasks killed, mounts and bridge removed) when dropped.
pub struct PrivateContainerd {
    dir: PathBuf,
    stopped: bool,
}

impl PrivateContainerd {
    /// Starts a containerd under a fresh temp dir and waits until it answers
    /// with both test images imported. Panics, naming what is missing, when
    /// the machine lacks containerd, runc or the CNI plugins.
    pub fn start() -> PrivateContainerd {
        check_prerequisites();
        remember_panics();
        let dir = unique_dir("tl-e2e");
        let started = Instant::now();
        let out = Command::new("bash")
            .arg(script())
            .arg("start")
            .arg(&dir)
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("running {} start: {e}", script().display()));
        let ctd = PrivateContainerd {
            dir,
            stopped: false,
        };
        if !out.status.success() {
            panic!(
                "starting a private containerd in {} failed ({}):\n{}{}\n--- containerd.log ---\n{}",
                ctd.dir.display(),
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr),
                tail(&ctd.log_path(), 30)
            );
        }
        eprintln!(
            "private containerd in {} ready in {:.2}s: {}",
            ctd.dir.display(),
            started.elapsed().as_secs_f64(),
            String::from_utf8_lossy(&out.stderr).trim()
        );
        ctd
    }

    /// The temp dir holding everything of this instance.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn socket(&self) -> PathBuf {
        self.dir.join("containerd.sock")
    }

    /// The CRI endpoint, as `--container-runtime-endpoint` takes it.
    pub fn endpoint(&self) -> String {
        format!("unix://{}", self.socket().display())
    }

    pub fn log_path(&self) -> PathBuf {
        self.dir.join("containerd.log")
    }

    /// N of this instance's CNI network: bridge `tinyletN`, 10.199.N.0/24.
    pub fn cni_index(&self) -> u32 {
        let p = self.dir.join("cni-index");
        let text =
            fs::read_to_string(&p).unwrap_or_else(|e| panic!("reading {}: {e}", p.display()));
        text.trim()
            .parse()
            .unwrap_or_else(|e| panic!("{} holds {:?}: {e}", p.display(), text.trim()))
    }

    /// The snapshotter the CRI plugin uses (overlayfs, or native).
    pub fn snapshotter(&self) -> String {
        let p = self.dir.join("snapshotter");
        fs::read_to_string(&p)
            .unwrap_or_else(|e| panic!("reading {}: {e}", p.display()))
            .trim()
            .to_string()
    }

    /// The pod subnet's prefix, e.g. "10.199.7.".
    pub fn pod_ip_prefix(&self) -> String {
        format!("10.199.{}.", self.cni_index())
    }

    /// Runs `ctr` against this containerd in namespace k8s.io.
    pub fn try_ctr(&self, args: &[&str]) -> Result<String, String> {
        let sock = self.socket();
        let out = Command::new("ctr")
            .arg("--address")
            .arg(&sock)
            .args(["--timeout", CTR_TIMEOUT, "--namespace", "k8s.io"])
            .args(args)
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("running ctr {}: {e}", args.join(" ")))?;
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        } else {
            Err(format!(
                "ctr {} failed ({}): {}",
                args.join(" "),
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            ))
        }
    }

    /// Runs `ctr` against this containerd in namespace k8s.io; panics with
    /// its stderr when it fails.
    pub fn ctr(&self, args: &[&str]) -> String {
        match self.try_ctr(args) {
            Ok(out) => out,
            Err(e) => panic!("{e}"),
        }
    }

    /// IDs of the containerd containers matching a `ctr` filter.
    pub fn ids(&self, filter: &str) -> Vec<String> {
        let out = self.ctr(&["containers", "ls", "-q", filter]);
        let mut ids: Vec<String> = out
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .map(String::from)
            .collect();
        ids.sort();
        ids
    }

    /// IDs of the CRI sandboxes of the pod named `pod_name` (e.g. "web-edge-1").
    pub fn sandbox_ids(&self, pod_name: &str) -> Vec<String> {
        self.ids(&format!(
            "labels.\"{POD_NAME_LABEL}\"=={pod_name},labels.\"{KIND_LABEL}\"==sandbox"
        ))
    }

    /// IDs of the CRI (application) containers of the pod named `pod_name`.
    pub fn container_ids(&self, pod_name: &str) -> Vec<String> {
        self.ids(&format!(
            "labels.\"{POD_NAME_LABEL}\"=={pod_name},labels.\"{KIND_LABEL}\"==container"
        ))
    }

    /// IDs of the CRI containers of one container of a pod.
    pub fn container_ids_named(&self, pod_name: &str, container: &str) -> Vec<String> {
        self.ids(&format!(
            "labels.\"{POD_NAME_LABEL}\"=={pod_name},labels.\"{KIND_LABEL}\"==container,labels.\"{CONTAINER_NAME_LABEL}\"=={container}"
        ))
    }

    /// Every CRI object (sandboxes and containers) of the pod.
    pub fn pod_objects(&self, pod_name: &str) -> Vec<CriObject> {
        self.ids(&format!("labels.\"{POD_NAME_LABEL}\"=={pod_name}"))
            .iter()
            .filter_map(|id| self.object(id))
            .collect()
    }

    /// One CRI object, or None when it is gone.
    pub fn object(&self, id: &str) -> Option<CriObject> {
        let text = self.try_ctr(&["containers", "info", id]).ok()?;
        let info: serde_json::Value = serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("ctr containers info {id}: not JSON ({e}): {text}"));
        let labels = string_map(info.get("Labels"));
        let created_at = info
            .get("CreatedAt")
            .and_then(|v| v.as_str())
            .unwrap_or("")
            .to_string();
        let (attempt, annotations) = cri_config(&info);
        Some(CriObject {
            id: id.to_string(),
            labels,
            attempt,
            annotations,
            created_at,
        })
    }

    /// Task states by container ID, as `ctr tasks ls` shows them (RUNNING,
    /// STOPPED, CREATED, PAUSED...). Containers without a task are absent.
    pub fn tasks(&self) -> BTreeMap<String, String> {
        let out = self.ctr(&["tasks", "ls"]);
        out.lines()
            .skip(1)
            .filter_map(|line| {
                let mut f = line.split_whitespace();
                let id = f.next()?;
                let _pid = f.next()?;
                let status = f.next()?;
                Some((id.to_string(), status.to_string()))
            })
            .collect()
    }

    /// The task state of one container ("" when it has no task).
    pub fn task_status(&self, id: &str) -> String {
        self.tasks().remove(id).unwrap_or_default()
    }

    /// True when the pod has exactly one sandbox and one container per name
    /// in `containers`, all with RUNNING tasks.
    pub fn pod_running(&self, pod_name: &str, containers: &[&str]) -> bool {
        let sandboxes = self.sandbox_ids(pod_name);
        if sandboxes.len() != 1 {
            return false;
        }
        let tasks = self.tasks();
        let running = |id: &String| tasks.get(id).map(String::as_str) == Some("RUNNING");
        if !running(&sandboxes[0]) {
            return false;
        }
        containers.iter().all(|name| {
            let ids = self.container_ids_named(pod_name, name);
            ids.len() == 1 && running(&ids[0])
        })
    }

    /// True when the runtime holds nothing of the pod any more.
    pub fn pod_gone(&self, pod_name: &str) -> bool {
        self.ids(&format!("labels.\"{POD_NAME_LABEL}\"=={pod_name}"))
            .is_empty()
    }

    /// How a CRI container ended, from the status file containerd's CRI
    /// plugin keeps for it: `(finished_at, exit_code)` with `finished_at` in
    /// Unix nanoseconds, or None while it has not finished (or is gone).
    pub fn container_exit(&self, id: &str) -> Option<(i64, i64)> {
        let p = self
            .dir
            .join("root/io.containerd.grpc.v1.cri/containers")
            .join(id)
            .join("status");
        let text = fs::read_to_string(p).ok()?;
        let v: serde_json::Value = serde_json::from_str(&text).ok()?;
        let status = v.get("Status").unwrap_or(&v);
        let finished = status.get("FinishedAt")?.as_i64()?;
        if finished <= 0 {
            return None;
        }
        let code = status.get("ExitCode").and_then(|c| c.as_i64()).unwrap_or(0);
        Some((finished, code))
    }

    /// `exec` of a command that always prints, asked again (at most three
    /// times) while it printed nothing: under load, containerd 1.6 can
    /// lose an exec's output ("error copying stdout" in its log) and
    /// still report success.
    pub fn exec_printing(&self, id: &str, cmd: &[&str]) -> Result<String, String> {
        let mut out = self.exec(id, cmd)?;
        for _ in 0..2 {
            if !out.trim().is_empty() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(200));
            out = self.exec(id, cmd)?;
        }
        Ok(out)
    }

    /// Runs a command inside a running container (`ctr tasks exec`).
    pub fn exec(&self, id: &str, cmd: &[&str]) -> Result<String, String> {
        static EXEC: AtomicU64 = AtomicU64::new(0);
        let exec_id = format!("e2e-{}", EXEC.fetch_add(1, Ordering::Relaxed));
        let mut args = vec!["tasks", "exec", "--exec-id", exec_id.as_str(), id];
        args.extend_from_slice(cmd);
        self.try_ctr(&args)
    }

    /// host-local IPAM leases of this instance's network: IP → sandbox ID.
    pub fn ip_leases(&self) -> BTreeMap<String, String> {
        let mut leases = BTreeMap::new();
        let net_dir = self
            .dir
            .join("cni-ipam")
            .join(format!("tinylet-{}", self.cni_index()));
        let Ok(entries) = fs::read_dir(&net_dir) else {
            return leases;
        };
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if !name.starts_with("10.") {
                continue;
            }
            if let Ok(content) = fs::read_to_string(entry.path()) {
                let owner = content.lines().next().unwrap_or("").trim().to_string();
                leases.insert(name, owner);
            }
        }
        leases
    }

    /// The IP host-local leased to a sandbox, if any.
    pub fn sandbox_ip(&self, sandbox_id: &str) -> Option<String> {
        self.ip_leases()
            .into_iter()
            .find(|(_, owner)| owner == sandbox_id)
            .map(|(ip, _)| ip)
    }

    /// The last lines of containerd's log.
    pub fn log_tail(&self, lines: usize) -> String {
        tail(&self.log_path(), lines)
    }

    /// The last `lines` warning and error lines of containerd's log.
    pub fn log_problems(&self, lines: usize) -> String {
        let text = fs::read_to_string(self.log_path()).unwrap_or_default();
        let problems: Vec<&str> = text
            .lines()
            .filter(|l| l.contains("level=error") || l.contains("level=warning"))
            .collect();
        let start = problems.len().saturating_sub(lines);
        if problems.is_empty() {
            "(none)".to_string()
        } else {
            problems[start..].join("\n")
        }
    }

    /// The pid of the containerd daemon while it runs.
    pub fn daemon_pid(&self) -> Option<u32> {
        let text = fs::read_to_string(self.dir.join("containerd.pid")).ok()?;
        let pid: u32 = text.trim().parse().ok()?;
        let comm = fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
        (comm.trim() == "containerd" && process_alive(pid)).then_some(pid)
    }

    /// Stops the containerd daemon alone with `signal` ("TERM" as an admin's
    /// `systemctl stop` does, "KILL" as a crash does) and waits until it is
    /// gone. Its shims, and the containers they hold, keep running, as they
    /// do on a real node; `start_daemon` brings it back on the same state.
    pub fn stop_daemon(&mut self, signal: &str) {
        let pid = self
            .daemon_pid()
            .unwrap_or_else(|| panic!("containerd in {} is not running", self.dir.display()));
        let status = Command::new("kill")
            .args([&format!("-{signal}"), &pid.to_string()])
            .status()
            .unwrap_or_else(|e| panic!("running kill -{signal} {pid}: {e}"));
        assert!(status.success(), "kill -{signal} {pid} failed ({status})");
        let start = Instant::now();
        while process_alive(pid) {
            if start.elapsed() > Duration::from_secs(20) {
                panic!("containerd {pid} still runs 20 s after SIG{signal}");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Starts the containerd daemon again with the same config, root and
    /// state (after `stop_daemon`) and waits until it answers.
    pub fn start_daemon(&mut self) {
        assert!(
            self.daemon_pid().is_none(),
            "containerd in {} runs already",
            self.dir.display()
        );
        let dir = self.dir.display().to_string();
        // Started from a shell that exits at once, so containerd is nobody's
        // child here (no zombie), in a session of its own, as `start` does.
        let out = Command::new("bash")
            .args([
                "-c",
                r#"rm -f "$1/containerd.sock" "$1/containerd.sock.ttrpc"
setsid containerd --config "$1/config.toml" --log-level info </dev/null >>"$1/containerd.log" 2>&1 &
echo $! >"$1/containerd.pid""#,
                "bash",
                &dir,
            ])
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("starting containerd in {dir}: {e}"));
        assert!(
            out.status.success(),
            "starting containerd in {dir} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let start = Instant::now();
        loop {
            let answered = Command::new("ctr")
                .arg("--address")
                .arg(self.socket())
                .args(["--timeout", "1s", "version"])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .map(|s| s.success())
                .unwrap_or(false);
            if answered {
                return;
            }
            if start.elapsed() > Duration::from_secs(30) {
                panic!(
                    "containerd in {dir} did not answer within 30 s of its restart\n{}",
                    self.log_tail(30)
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Stops containerd and cleans up (also done on drop).
    pub fn stop(&mut self) -> Result<(), String> {
        if self.stopped {
            return Ok(());
        }
        self.stopped = true;
        let out = Command::new("bash")
            .arg(script())
            .arg("stop")
            .arg(&self.dir)
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("running {} stop: {e}", script().display()))?;
        if out.status.success() {
            Ok(())
        } else {
            Err(format!(
                "stopping the private containerd in {} failed ({}): {}",
                self.dir.display(),
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            ))
        }
    }
}

impl Drop for PrivateContainerd {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "--- containerd.log ({}): warnings and errors ---\n{}",
                self.log_path().display(),
                self.log_problems(30)
            );
            if let Some(head) = PANIC_HEAD.with(|h| h.borrow_mut().take()) {
                eprintln!("--- the test failed at {head}");
            }
        }
        match self.stop() {
            Ok(()) => {
                if let Err(e) = fs::remove_dir_all(&self.dir) {
                    eprintln!("removing {}: {e}", self.dir.display());
                }
            }
            // Mounts may remain: never delete through them.
            Err(e) => eprintln!("{e}; leaving {} in place", self.dir.display()),
        }
    }
}

/// String-to-string map from a JSON object (missing or null: empty).
fn string_map(v: Option<&serde_json::Value>) -> BTreeMap<String, String> {
    v.and_then(|v| v.as_object())
        .map(|m| {
            m.iter()
                .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
                .collect()
        })
        .unwrap_or_default()
}

/// The CRI plugin keeps each object's CRI config as JSON in a container
/// extension ("io.cri-containerd.container.metadata" or
/// "...sandbox.metadata"); `ctr` prints its bytes base64-encoded. Returns the
/// config's `metadata.attempt` and `annotations`.
fn cri_config(info: &serde_json::Value) -> (u32, BTreeMap<String, String>) {
    let Some(exts) = info.get("Extensions").and_then(|e| e.as_object()) else {
        return (0, BTreeMap::new());
    };
    for (key, ext) in exts {
        if !key.starts_with("io.cri-containerd.") {
            continue;
        }
        let Some(encoded) = ext.get("value").and_then(|v| v.as_str()) else {
            continue;
        };
        let Some(bytes) = base64_decode(encoded) else {
            continue;
        };
        let Ok(meta) = serde_json::from_slice::<serde_json::Value>(&bytes) else {
            continue;
        };
        let config = meta.pointer("/Metadata/Config");
        let attempt = config
            .and_then(|c| c.pointer("/metadata/attempt"))
            .and_then(|a| a.as_u64())
            .unwrap_or(0) as u32;
        let annotations = string_map(config.and_then(|c| c.get("annotations")));
        return (attempt, annotations);
    }
    (0, BTreeMap::new())
}

/// Standard base64 (with or without padding); None on a foreign character.
fn base64_decode(s: &str) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(s.len() * 3 / 4);
    let mut acc: u32 = 0;
    let mut bits = 0;
    for c in s.bytes() {
        let v = match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            b'=' => break,
            b'\n' | b'\r' => continue,
            _ => return None,
        };
        acc = (acc << 6) | u32::from(v);
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
            acc &= (1 << bits) - 1;
        }
    }
    Some(out)
}

thread_local! {
    /// The log of the tinylet the current test thread runs, for `wait_until`.
    static CURRENT_LOG: RefCell<Option<PathBuf>> = const { RefCell::new(None) };
    /// Its pid while it is meant to be running: waits fail fast if it dies.
    static CURRENT_PID: RefCell<Option<u32>> = const { RefCell::new(None) };
    /// Set once a panic message carried the log tail, so drop does not
    /// print it a second time.
    static LOG_SHOWN: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    /// The first lines of this thread's panic message, for `remember_panics`.
    static PANIC_HEAD: RefCell<Option<String>> = const { RefCell::new(None) };
}

/// Keeps the head of each test thread's panic message, so that the drop
/// of its containerd can repeat it after the logs it prints: a CI record
/// that keeps only the end of the output still says why the test failed.
fn remember_panics() {
    static HOOK: std::sync::Once = std::sync::Once::new();
    HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let payload = info.payload();
            let text = payload
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            let head: Vec<&str> = text.lines().take(6).collect();
            let at = info
                .location()
                .map(|l| format!("{}:{}", l.file(), l.line()))
                .unwrap_or_default();
            PANIC_HEAD.with(|h| *h.borrow_mut() = Some(format!("{at}: {}", head.join("\n"))));
            previous(info);
        }));
    });
}

fn current_log_tail(lines: usize) -> String {
    LOG_SHOWN.with(|s| s.set(true));
    CURRENT_LOG.with(|l| match l.borrow().as_ref() {
        Some(p) => format!("--- tinylet log ({}) ---\n{}", p.display(), tail(p, lines)),
        None => "(no tinylet started on this thread)".to_string(),
    })
}

/// Panics when the tinylet this thread started (and did not stop on
/// purpose) has exited: waiting on would only time out.
fn check_tinylet_alive(what: &str) {
    let Some(pid) = CURRENT_PID.with(|p| *p.borrow()) else {
        return;
    };
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let state = stat
        .rsplit_once(") ")
        .and_then(|(_, rest)| rest.split_whitespace().next())
        .unwrap_or("gone");
    if state == "Z" || state == "gone" {
        CURRENT_PID.with(|p| *p.borrow_mut() = None);
        panic!(
            "tinylet (pid {pid}) exited while waiting until {what}\n{}",
            current_log_tail(60)
        );
    }
}

/// Polls `f` every 100 ms until it returns true; panics after `timeout`
/// naming `what` and showing the tail of this thread's tinylet log.
///
/// `timeout` is stretched by `time_scale()`.
pub fn wait_until(timeout: Duration, what: &str, mut f: impl FnMut() -> bool) {
    let timeout = scaled(timeout);
    let start = Instant::now();
    loop {
        if f() {
            return;
        }
        check_tinylet_alive(what);
        if start.elapsed() >= timeout {
            panic!(
                "timed out after {:.1}s waiting until {what}\n{}",
                timeout.as_secs_f64(),
                current_log_tail(60)
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Polls `f` every 100 ms for `period` and panics (naming `what`, with the
/// tinylet log tail) the first time it returns false.
pub fn holds_for(period: Duration, what: &str, mut f: impl FnMut() -> bool) {
    let start = Instant::now();
    while start.elapsed() < period {
        check_tinylet_alive(what);
        if !f() {
            panic!(
                "after {:.1}s this no longer held: {what}\n{}",
                start.elapsed().as_secs_f64(),
                current_log_tail(60)
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Writes a manifest into `dir` atomically: a dotfile first, then renamed
/// in, so a watcher never reads it half-written.
pub fn write_manifest(dir: &Path, name: &str, content: &str) {
    let tmp = dir.join(format!(".{name}.tmp"));
    let dest = dir.join(name);
    let mut f =
        fs::File::create(&tmp).unwrap_or_else(|e| panic!("creating {}: {e}", tmp.display()));
    f.write_all(content.as_bytes())
        .and_then(|()| f.sync_all())
        .unwrap_or_else(|e| panic!("writing {}: {e}", tmp.display()));
    drop(f);
    fs::rename(&tmp, &dest)
        .unwrap_or_else(|e| panic!("renaming {} to {}: {e}", tmp.display(), dest.display()));
}

/// Removes a manifest from `dir`.
pub fn remove_manifest(dir: &Path, name: &str) {
    let p = dir.join(name);
    fs::remove_file(&p).unwrap_or_else(|e| panic!("removing {}: {e}", p.display()));
}

/// Runs `$TL_BIN "$@"` in the private mount namespace `unshare --mount`
/// made for it, with every mount read-only except the kernel's (/proc,
/// /sys, /dev), /run, what an admin mounted under /mnt or /media, and the
/// directories in `$TL_WRITABLE` (colon-separated; bound onto themselves
/// first, so they stay writable). The working directory is `$TL_WORKDIR`,
/// read-only as well. Refuses to remount anything unless it really is in a
/// namespace other than `$TL_PARENT_NS`, and checks the result before
/// starting tinylet. Mounts in a private namespace never reach the host's.
const READ_ONLY_ROOT_SH: &str = r#"
set -eu
fail() { echo "read-only root harness: $*" >&2; exit 97; }
[ "$(readlink /proc/self/ns/mnt)" != "$TL_PARENT_NS" ] || fail "not in a mount namespace of its own"
IFS=:
for d in $TL_WRITABLE; do mount --bind "$d" "$d"; done
unset IFS
awk '{print $5}' /proc/self/mountinfo | sort -u | while read -r mp; do
  case "$mp" in
    /proc|/proc/*|/sys|/sys/*|/dev|/dev/*|/run|/run/*|/mnt|/mnt/*|/media|/media/*) continue ;;
  esac
  case ":$TL_WRITABLE:" in *":$mp:"*) continue ;; esac
  # Another test's container mount can go meanwhile (its directory
  # removed in the parent namespace): nothing can write there then.
  mount -o remount,bind,ro "$mp" 2>/dev/null || [ ! -e "$mp" ] || fail "cannot remount $mp read-only"
done
touch "$TL_WORKDIR/.rw-probe" 2>/dev/null && fail "$TL_WORKDIR is still writable"
IFS=:
for d in $TL_WRITABLE; do
  touch "$d/.rw-probe" && rm "$d/.rw-probe" || fail "$d is not writable"
done
unset IFS
cd "$TL_WORKDIR"
exec "$TL_BIN" "$@"
"#;

/// Where the tinylet of a test may write, when it runs on a read-only root.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Root {
    /// As any other process of the test: everything writable.
    Writable,
    /// A read-only root with `--root-dir` and `--pod-logs-dir` writable.
    ReadOnly,
    /// A read-only root where even `--root-dir` is read-only.
    ReadOnlyRootDir,
}

/// The real `tinylet` binary, run against a private containerd with its
/// stderr in a log file; killed when dropped (the log tail is printed when
/// the test is failing).
pub struct Tinylet {
    child: Option<Child>,
    args: Vec<String>,
    /// Environment variables set for the process (kept across restarts).
    env: Vec<(String, String)>,
    base: PathBuf,
    log: PathBuf,
    node: String,
    root: Root,
}

impl Tinylet {
    /// Starts tinylet for node `node` with its manifest and root dirs under
    /// the containerd's temp dir.
    pub fn start(ctd: &PrivateContainerd, node: &str) -> Tinylet {
        Tinylet::start_with(ctd, node, &[])
    }

    /// Like `start`, with extra flags.
    pub fn start_with(ctd: &PrivateContainerd, node: &str, extra: &[&str]) -> Tinylet {
        Tinylet::start_in(ctd, node, extra, Root::Writable)
    }

    /// Like `start_with`, on a read-only root: tinylet runs in a mount
    /// namespace of its own where only the kernel's filesystems, /run, its
    /// `--root-dir` and its `--pod-logs-dir` (`logs_dir`) are writable; its
    /// working directory (`base_dir`) and manifest dir are read-only. The
    /// containerd stays outside and writes as usual.
    pub fn start_read_only_root(ctd: &PrivateContainerd, node: &str, extra: &[&str]) -> Tinylet {
        Tinylet::start_in(ctd, node, extra, Root::ReadOnly)
    }

    /// Like `start_read_only_root`, with `--root-dir` read-only too.
    pub fn start_read_only_root_dir(
        ctd: &PrivateContainerd,
        node: &str,
        extra: &[&str],
    ) -> Tinylet {
        Tinylet::start_in(ctd, node, extra, Root::ReadOnlyRootDir)
    }

    fn start_in(ctd: &PrivateContainerd, node: &str, extra: &[&str], root_mode: Root) -> Tinylet {
        let base = ctd.dir().join(format!("tinylet-{node}"));
        let manifests = base.join("manifests");
        let root = base.join("root");
        let logs = base.join("logs");
        for d in [&manifests, &root, &logs] {
            fs::create_dir_all(d).unwrap_or_else(|e| panic!("creating {}: {e}", d.display()));
        }
        let mut args: Vec<String> = vec![
            "--container-runtime-endpoint".into(),
            ctd.endpoint(),
            "--pod-manifest-path".into(),
            manifests.display().to_string(),
            "--hostname-override".into(),
            node.into(),
            "--root-dir".into(),
            root.display().to_string(),
            "--v".into(),
            "4".into(),
            // Image GC would remove the test images on a machine whose disk
            // is over 85% full; its own tests set their thresholds.
            "--image-gc-high-threshold".into(),
            "100".into(),
            // The disk eviction thresholds (nodefs.available<10%,
            // imagefs.available<15%) would be met on a build machine whose
            // disk is that full: pods refused and evicted. The eviction tests
            // add their own thresholds to this one.
            "--eviction-hard".into(),
            "memory.available<100Mi".into(),
            // A node with a kubeconfig serves its API on 10250 and 10248 by
            // default; parallel tests would fight over them. Tests of the
            // server give their own ports.
            "--port".into(),
            "0".into(),
            "--healthz-port".into(),
            "0".into(),
        ];
        if root_mode != Root::Writable {
            // The default, /var/log/pods, is read-only there.
            args.extend(["--pod-logs-dir".into(), logs.display().to_string()]);
        }
        args.extend(extra.iter().map(|s| s.to_string()));
        let log = base.join("tinylet.log");
        CURRENT_LOG.with(|l| *l.borrow_mut() = Some(log.clone()));
        let mut t = Tinylet {
            child: None,
            args,
            env: Vec::new(),
            base,
            log,
            node: node.into(),
            root: root_mode,
        };
        t.spawn();
        t
    }

    fn spawn(&mut self) {
        let bin = tinylet_bin();
        let wrapper = tinylet_wrapper();
        let shown = match &wrapper {
            Some(w) => format!("{} {}", w.display(), bin.display()),
            None => bin.display().to_string(),
        };
        let mut log = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .unwrap_or_else(|e| panic!("opening {}: {e}", self.log.display()));
        let _ = writeln!(log, "=== e2e: starting {shown} {}", self.args.join(" "));
        let stdout = log
            .try_clone()
            .unwrap_or_else(|e| panic!("duplicating {}: {e}", self.log.display()));
        let mut cmd = match self.root {
            Root::Writable => match &wrapper {
                Some(w) => {
                    let mut c = Command::new(w);
                    c.arg(&bin);
                    c
                }
                None => Command::new(&bin),
            },
            Root::ReadOnly | Root::ReadOnlyRootDir => {
                let parent_ns = fs::read_link("/proc/self/ns/mnt")
                    .unwrap_or_else(|e| panic!("reading /proc/self/ns/mnt: {e}"));
                let mut writable = vec![self.logs_dir().display().to_string()];
                if self.root == Root::ReadOnly {
                    writable.push(self.root_dir().display().to_string());
                }
                let mut c = Command::new("unshare");
                c.args(["--mount", "--propagation", "private", "sh", "-c"])
                    .args([READ_ONLY_ROOT_SH, "sh"])
                    .env("TL_PARENT_NS", parent_ns)
                    .env("TL_WRITABLE", writable.join(":"))
                    .env("TL_WORKDIR", &self.base)
                    .env("TL_BIN", &bin);
                c
            }
        };
        let child = cmd
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .args(&self.args)
            .stdin(Stdio::null())
            .stdout(stdout)
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("spawning {shown}: {e}"));
        CURRENT_PID.with(|p| *p.borrow_mut() = Some(child.id()));
        self.child = Some(child);
    }

    /// The static pod manifest dir (`--pod-manifest-path`).
    pub fn manifest_dir(&self) -> PathBuf {
        self.base.join("manifests")
    }

    /// `--root-dir`.
    pub fn root_dir(&self) -> PathBuf {
        self.base.join("root")
    }

    /// `--pod-logs-dir` on a read-only root (otherwise the default,
    /// /var/log/pods, is used).
    pub fn logs_dir(&self) -> PathBuf {
        self.base.join("logs")
    }

    /// The dir holding the manifest, root and log dirs; the working
    /// directory on a read-only root.
    pub fn base_dir(&self) -> &Path {
        &self.base
    }

    pub fn node(&self) -> &str {
        &self.node
    }

    /// The name a static pod from manifest `name` gets: `NAME-NODE`.
    pub fn pod_name(&self, name: &str) -> String {
        format!("{name}-{}", self.node)
    }

    pub fn log_path(&self) -> &Path {
        &self.log
    }

    pub fn log_tail(&self, lines: usize) -> String {
        tail(&self.log, lines)
    }

    /// What the process started last (by `start` or `restart`) has logged.
    pub fn log_since_start(&self) -> String {
        let text = fs::read_to_string(&self.log).unwrap_or_default();
        match text.rfind("=== e2e: starting ") {
            Some(i) => text[i..].to_string(),
            None => text,
        }
    }

    /// The log tail for a panic message (drop then does not repeat it).
    fn shown_log_tail(&self, lines: usize) -> String {
        LOG_SHOWN.with(|s| s.set(true));
        self.log_tail(lines)
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }

    /// True while the process runs (false once it exited or was killed).
    pub fn is_running(&mut self) -> bool {
        match self.child.as_mut() {
            Some(c) => matches!(c.try_wait(), Ok(None)),
            None => false,
        }
    }

    /// Asserts the process is still running, with its log when not.
    pub fn assert_running(&mut self) {
        if let Some(c) = self.child.as_mut() {
            if let Ok(Some(status)) = c.try_wait() {
                panic!(
                    "tinylet exited unexpectedly ({status})\n--- tinylet log ---\n{}",
                    self.shown_log_tail(60)
                );
            }
        } else {
            panic!("tinylet is not running (it was stopped by the test)");
        }
    }

    fn signal(&mut self, sig: &str) {
        let Some(pid) = self.pid() else {
            panic!("tinylet is not running; cannot send SIG{sig}");
        };
        let status = Command::new("kill")
            .args([&format!("-{sig}"), &pid.to_string()])
            .status()
            .unwrap_or_else(|e| panic!("running kill -{sig} {pid}: {e}"));
        assert!(status.success(), "kill -{sig} {pid} failed ({status})");
    }

    /// Sends SIGTERM and waits (up to 30 s, scaled) for a clean exit; returns the
    /// exit status.
    pub fn sigterm(&mut self) -> ExitStatus {
        self.forget_pid();
        self.signal("TERM");
        let status = self.wait_exit(scaled(Duration::from_secs(30)), "exit after SIGTERM");
        self.child = None;
        status
    }

    /// Waits (up to `timeout`) for the process to exit by itself; returns
    /// its exit status.
    pub fn wait_for_exit(&mut self, timeout: Duration) -> ExitStatus {
        self.forget_pid();
        let status = self.wait_exit(timeout, "exit");
        self.child = None;
        status
    }

    /// Kills the process with SIGKILL and reaps it.
    pub fn sigkill(&mut self) {
        self.forget_pid();
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Sets (or with `None` removes) an environment variable for the next
    /// start of the process.
    pub fn set_env(&mut self, key: &str, value: Option<&str>) {
        self.env.retain(|(k, _)| k != key);
        if let Some(v) = value {
            self.env.push((key.to_string(), v.to_string()));
        }
    }

    /// Kills the binary and starts it again with `extra` flags added.
    pub fn restart_with(&mut self, extra: &[&str]) {
        self.args.extend(extra.iter().map(|s| s.to_string()));
        self.restart();
    }

    /// Starts the binary again with the same flags (after `sigterm` or
    /// `sigkill`; a still-running process is killed first).
    pub fn restart(&mut self) {
        self.sigkill();
        CURRENT_LOG.with(|l| *l.borrow_mut() = Some(self.log.clone()));
        self.spawn();
    }

    /// Stops `wait_until` from watching this process (it is being stopped).
    fn forget_pid(&self) {
        let pid = self.pid();
        CURRENT_PID.with(|p| {
            let mut p = p.borrow_mut();
            if *p == pid {
                *p = None;
            }
        });
    }

    fn wait_exit(&mut self, timeout: Duration, what: &str) -> ExitStatus {
        let start = Instant::now();
        loop {
            let Some(c) = self.child.as_mut() else {
                panic!("tinylet is not running");
            };
            match c.try_wait() {
                Ok(Some(status)) => return status,
                Ok(None) => {}
                Err(e) => panic!("waiting for tinylet: {e}"),
            }
            if start.elapsed() >= timeout {
                panic!(
                    "tinylet did not {what} within {:.0}s\n--- tinylet log ---\n{}",
                    timeout.as_secs_f64(),
                    self.shown_log_tail(60)
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Tinylet {
    fn drop(&mut self) {
        self.sigkill();
        // Volumes it mounted (tmpfs for secrets) outlive the process, as
        // they must for its containers; the test's temp dirs must not.
        if let Err(e) = tinylet::mount::unmount_below(&self.root_dir()) {
            eprintln!("unmounting below {}: {e}", self.root_dir().display());
        }
        if std::thread::panicking() && !LOG_SHOWN.with(|s| s.get()) {
            eprintln!(
                "--- tinylet log ({}) ---\n{}",
                self.log.display(),
                self.log_tail(80)
            );
        }
        CURRENT_LOG.with(|l| {
            let mut l = l.borrow_mut();
            if l.as_deref() == Some(self.log.as_path()) {
                *l = None;
            }
        });
    }
}

/// True while process `pid` exists and is not a zombie.
pub fn process_alive(pid: u32) -> bool {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let state = stat
        .rsplit_once(") ")
        .and_then(|(_, rest)| rest.split_whitespace().next())
        .unwrap_or("");
    !state.is_empty() && state != "Z"
}

/// CPU time (user + system) process `pid` has used so far, from
/// `/proc/<pid>/stat`; None once it is gone.
pub fn cpu_time(pid: u32) -> Option<Duration> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, rest) = stat.rsplit_once(") ")?;
    // Fields after the command: state is field 3, utime 14, stime 15.
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    // SAFETY: sysconf has no preconditions.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    let ticks = if ticks > 0 { ticks as u64 } else { 100 };
    Some(Duration::from_millis((utime + stime) * 1000 / ticks))
}
