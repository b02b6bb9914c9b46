//! The real `tinylet` binary run by a test against the fake CRI server (or
//! any endpoint), with temp dirs of its own: started, killed, restarted and
//! stopped by the test, its log shown when the test fails.

use std::fs;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use protobuf::EnumOrUnknown;
use tinylet::cri::api;

use super::fake_cri::FakeCri;

const BIN: &str = env!("CARGO_BIN_EXE_tinylet");

/// The binary with its own temp dirs, killed on drop; its log is printed
/// when the test fails.
pub struct Agent {
    child: Option<Child>,
    dir: tempfile::TempDir,
    args: Vec<String>,
    /// Shell commands run before the binary, in the shell that then
    /// becomes it (a umask, a ulimit; `None`: started directly).
    prelude: Option<String>,
}

/// The Kubernetes version every agent started here reports.
pub const REPORTED_VERSION: &str = "v1.20.7";

impl Agent {
    /// Starts the binary against `endpoint` with node `edge-1`, a manifest
    /// dir, root and log dirs of its own, and `extra` flags.
    pub fn start(endpoint: &str, extra: &[&str]) -> Agent {
        let mut a = Agent::new(endpoint, extra);
        a.spawn();
        a
    }

    /// Like `start`, with the binary started under `umask` (through `sh`,
    /// which sets it and then becomes the binary).
    pub fn start_with_umask(endpoint: &str, extra: &[&str], umask: u32) -> Agent {
        Agent::start_after(endpoint, extra, &format!("umask {umask:03o}"))
    }

    /// Like `start`, with the binary started by `sh` after `prelude` (shell
    /// commands that set what the binary inherits, e.g. `ulimit -Sn 1024`).
    pub fn start_after(endpoint: &str, extra: &[&str], prelude: &str) -> Agent {
        let mut a = Agent::new(endpoint, extra);
        a.prelude = Some(prelude.to_string());
        a.spawn();
        a
    }

    /// Like `start`, with at most `n` open files (soft and hard limit,
    /// set through `sh` as the umask is).
    pub fn start_with_nofile(endpoint: &str, extra: &[&str], n: u64) -> Agent {
        Agent::start_after(endpoint, extra, &format!("ulimit -n {n}"))
    }

    fn new(endpoint: &str, extra: &[&str]) -> Agent {
        let dir = tempfile::Builder::new()
            .prefix("tinylet-agent")
            .tempdir()
            .expect("temp dir");
        fs::create_dir_all(dir.path().join("manifests")).expect("manifest dir");
        let args = vec![
            "--container-runtime-endpoint".to_string(),
            endpoint.to_string(),
            "--pod-manifest-path".into(),
            dir.path().join("manifests").display().to_string(),
            "--hostname-override".into(),
            "edge-1".into(),
            "--root-dir".into(),
            dir.path().join("root").display().to_string(),
            "--pod-logs-dir".into(),
            dir.path().join("logs").display().to_string(),
            "--v".into(),
            "4".into(),
            // Image GC would remove the fake's images on a machine whose
            // disk is over 85% full; its own test sets its thresholds.
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
        let mut args = args;
        args.extend(extra.iter().map(|s| s.to_string()));
        Agent {
            child: None,
            dir,
            args,
            prelude: None,
        }
    }

    pub fn spawn(&mut self) {
        let log = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path())
            .expect("log file");
        let mut cmd = match &self.prelude {
            None => Command::new(BIN),
            Some(prelude) => {
                let mut c = Command::new("sh");
                c.arg("-c")
                    .arg(format!("{prelude} && exec \"$0\" \"$@\""))
                    .arg(BIN);
                c
            }
        };
        // The reported Kubernetes version, set as an operator would (and so
        // that a defaults file on the test machine cannot change it).
        cmd.env(tinylet::version::KUBELET_VERSION_VAR, REPORTED_VERSION);
        let child = cmd
            .args(&self.args)
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("dup log"))
            .stderr(log)
            .spawn()
            .expect("spawn tinylet");
        self.child = Some(child);
    }

    /// Kills the binary and starts it again with `extra` flags added.
    pub fn restart_with(&mut self, extra: &[&str]) {
        self.kill();
        self.args.extend(extra.iter().map(|s| s.to_string()));
        self.spawn();
    }

    pub fn manifests(&self) -> PathBuf {
        self.dir.path().join("manifests")
    }

    /// Its `--root-dir`.
    pub fn root_dir(&self) -> PathBuf {
        self.dir.path().join("root")
    }

    pub fn log_path(&self) -> PathBuf {
        self.dir.path().join("tinylet.log")
    }

    pub fn log(&self) -> String {
        fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    /// The process ID of the running binary.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    pub fn running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    pub fn terminate(&mut self) -> ExitStatus {
        let mut c = self.child.take().expect("running");
        let ok = Command::new("kill")
            .args(["-TERM", &c.id().to_string()])
            .status()
            .expect("kill");
        assert!(ok.success());
        let end = Instant::now() + Duration::from_secs(15);
        loop {
            if let Ok(Some(s)) = c.try_wait() {
                return s;
            }
            assert!(
                Instant::now() < end,
                "no exit after SIGTERM\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits (15 s at most) for the binary to exit on its own.
    pub fn wait_exit(&mut self) -> ExitStatus {
        let end = Instant::now() + Duration::from_secs(15);
        loop {
            let c = self.child.as_mut().expect("running");
            if let Ok(Some(s)) = c.try_wait() {
                self.child = None;
                return s;
            }
            assert!(Instant::now() < end, "no exit\n{}", self.log());
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn wait(&mut self, what: &str, mut f: impl FnMut() -> bool) {
        let end = Instant::now() + Duration::from_secs(15);
        while !f() {
            assert!(
                self.running(),
                "tinylet exited while waiting until {what}\n{}",
                self.log()
            );
            assert!(
                Instant::now() < end,
                "timed out waiting until {what}\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        self.kill();
        // Volumes it mounted (tmpfs for secrets) outlive the process, as
        // they must for its containers; the test's temp dir must not.
        if let Err(e) = tinylet::mount::unmount_below(self.dir.path()) {
            eprintln!("unmounting below {}: {e}", self.dir.path().display());
        }
        if std::thread::panicking() {
            eprintln!("--- tinylet log ---\n{}", self.log());
        }
    }
}

/// How many containers of pod `pod` are RUNNING in the fake.
pub fn running_containers(fake: &FakeCri, pod: &str) -> usize {
    fake.container_statuses()
        .iter()
        .filter(|c| {
            c.labels.get("io.kubernetes.pod.name").map(String::as_str) == Some(pod)
                && c.state == EnumOrUnknown::new(api::ContainerState::CONTAINER_RUNNING)
        })
        .count()
}
