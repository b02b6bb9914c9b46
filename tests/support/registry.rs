//! A private image registry for the pull tests: Debian's `docker-registry`
//! (distribution) with htpasswd auth on a free loopback port, plain HTTP
//! (containerd treats 127.0.0.1 registries as HTTP without configuration),
//! and `skopeo` to push the locally built OCI tarballs into it.
//!
//! One registry serves the whole test binary run: it starts at first use
//! (in well under a second) and a small watchdog shell stops it and removes
//! its directory once the test process is gone. Tests share it by pushing
//! to repositories of their own.

#![allow(dead_code)]

use std::fs;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// The login the registry accepts.
pub const USER: &str = "tinylet";
pub const PASSWORD: &str = "pull-me";

pub struct Registry {
    dir: PathBuf,
    port: u16,
}

fn run(cmd: &mut Command, what: &str) -> String {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("{what}: cannot run: {e} (run packaging/deps.sh)"));
    if !out.status.success() {
        panic!(
            "{what} failed ({}): {}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The status line of `GET /v2/`, or None while nothing answers.
fn probe(port: u16) -> Option<String> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    s.write_all(b"GET /v2/ HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
        .ok()?;
    let mut buf = [0u8; 64];
    let n = s.read(&mut buf).ok()?;
    let text = String::from_utf8_lossy(&buf[..n]).into_owned();
    text.lines().next().map(str::to_string)
}

impl Registry {
    /// The registry of this test run, started on first use.
    pub fn shared() -> &'static Registry {
        static REGISTRY: OnceLock<Registry> = OnceLock::new();
        REGISTRY.get_or_init(Registry::start)
    }

    fn start() -> Registry {
        for tool in ["docker-registry", "skopeo", "htpasswd"] {
            let found = Command::new("sh")
                .args(["-c", &format!("command -v {tool}")])
                .stdout(Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
            assert!(
                found,
                "the image pull tests need {tool}: run packaging/deps.sh \
                 (Debian packages docker-registry, skopeo, apache2-utils)"
            );
        }
        let dir = PathBuf::from(format!("/tmp/tl-registry.{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(dir.join("storage"))
            .unwrap_or_else(|e| panic!("creating {}: {e}", dir.display()));
        let entry = run(
            Command::new("htpasswd").args(["-Bbn", USER, PASSWORD]),
            "htpasswd -Bbn",
        );
        fs::write(dir.join("htpasswd"), entry.trim_end().to_string() + "\n")
            .unwrap_or_else(|e| panic!("writing htpasswd: {e}"));
        // A free port: bind one, let it go, and start there (retried when
        // another process takes it in between).
        for attempt in 0..5 {
            let port = TcpListener::bind("127.0.0.1:0")
                .and_then(|l| l.local_addr())
                .map(|a| a.port())
                .unwrap_or_else(|e| panic!("finding a free port: {e}"));
            let config = dir.join("config.yml");
            fs::write(
                &config,
                format!(
                    "version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: {}\n  delete:\n    enabled: true\nhttp:\n  addr: 127.0.0.1:{port}\nauth:\n  htpasswd:\n    realm: tinylet-tests\n    path: {}\n",
                    dir.join("storage").display(),
                    dir.join("htpasswd").display()
                ),
            )
            .unwrap_or_else(|e| panic!("writing {}: {e}", config.display()));
            let log = fs::File::create(dir.join("registry.log"))
                .unwrap_or_else(|e| panic!("creating the registry log: {e}"));
            // The watchdog: the registry lives as long as this test process.
            let script = r#"docker-registry serve "$1" & r=$!
while kill -0 "$2" 2>/dev/null && kill -0 "$r" 2>/dev/null; do sleep 0.5; done
kill "$r" 2>/dev/null; wait "$r" 2>/dev/null; rm -rf "$3""#;
            let spawned = Command::new("setsid")
                .args(["sh", "-c", script, "registry-watchdog"])
                .arg(&config)
                .arg(std::process::id().to_string())
                .arg(&dir)
                .stdin(Stdio::null())
                .stdout(
                    log.try_clone()
                        .unwrap_or_else(|e| panic!("duplicating the registry log: {e}")),
                )
                .stderr(log)
                .spawn();
            if let Err(e) = spawned {
                panic!("starting docker-registry: {e}");
            }
            let start = Instant::now();
            while start.elapsed() < Duration::from_secs(10) {
                if let Some(line) = probe(port) {
                    // An auth registry answers the API root with 401.
                    if line.contains(" 401") {
                        eprintln!(
                            "registry on 127.0.0.1:{port} ready in {:.2}s",
                            start.elapsed().as_secs_f64()
                        );
                        return Registry { dir, port };
                    }
                    break; // someone else's server took the port
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            eprintln!(
                "registry on port {port} not ready (attempt {attempt}): {}",
                fs::read_to_string(dir.join("registry.log")).unwrap_or_default()
            );
        }
        panic!(
            "docker-registry did not start; log: {}",
            fs::read_to_string(dir.join("registry.log")).unwrap_or_default()
        )
    }

    /// `127.0.0.1:PORT`, the registry part of image names.
    pub fn host(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// The image name `127.0.0.1:PORT/<repo>:<tag>`.
    pub fn image(&self, repo: &str, tag: &str) -> String {
        format!("{}/{repo}:{tag}", self.host())
    }

    /// Pushes an OCI archive as `repo:tag`; returns the manifest digest the
    /// registry holds (`sha256:...`).
    pub fn push(&self, archive: &Path, repo: &str, tag: &str) -> String {
        let digest_file = self
            .dir
            .join(format!("digest.{}.{}", repo.replace('/', "_"), tag));
        run(
            Command::new("skopeo")
                .args([
                    "--insecure-policy",
                    "copy",
                    "--quiet",
                    "--dest-tls-verify=false",
                ])
                .arg(format!("--dest-creds={USER}:{PASSWORD}"))
                .arg("--digestfile")
                .arg(&digest_file)
                .arg(format!("oci-archive:{}", archive.display()))
                .arg(format!("docker://{}", self.image(repo, tag))),
            &format!("skopeo copy {} to {repo}:{tag}", archive.display()),
        );
        fs::read_to_string(&digest_file)
            .unwrap_or_else(|e| panic!("reading {}: {e}", digest_file.display()))
            .trim()
            .to_string()
    }
}

/// The locally built test images as OCI archives (busybox, pause), built
/// or reused by `packaging/oci-image.sh` in the shared image cache.
pub fn oci_archives() -> (PathBuf, PathBuf) {
    let cache = std::env::var("TINYLET_IMAGE_CACHE")
        .unwrap_or_else(|_| "/var/cache/tinylet/images".to_string());
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("packaging/oci-image.sh");
    let out = run(
        Command::new("bash").arg(&script).arg(&cache),
        "packaging/oci-image.sh",
    );
    let mut lines = out.lines().map(PathBuf::from);
    match (lines.next(), lines.next()) {
        (Some(busybox), Some(pause)) => (busybox, pause),
        _ => panic!("packaging/oci-image.sh printed {out:?}, not two paths"),
    }
}
