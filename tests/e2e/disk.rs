//! End-to-end tests of a full and of a read-only `--root-dir`: tinylet's
//! root dir (with the `--bootstrap-checkpoint-path` inside it) is a small
//! tmpfs the test mounts, then fills up or remounts read-only while pods
//! run, and pods are added, changed and removed meanwhile (static pods
//! from the manifest dir, and an API pod through the fake apiserver).
//!
//! What must hold during the fault: tinylet keeps running, says which path
//! failed and why (ENOSPC, EROFS), leaves no half-written or temp file
//! behind (every checkpoint still verifies, every pod's etc-hosts is
//! whole), and the pods that ran are not touched. When the fault ends the
//! same tinylet converges: the new pods run, the changed one runs its new
//! version, the removed one is gone.

use std::collections::BTreeMap;
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::e2e::cluster::api_pod;
use crate::e2e::{yaml_pod, LONG_RUNNING, NODE, SETTLE};
use crate::support::containerd::{
    holds_for, remove_manifest, scaled, wait_until, write_manifest, PrivateContainerd, Tinylet,
    POD_UID_LABEL,
};
use crate::support::fake_apiserver::FakeApiServer;

/// Image GC off: on a build machine whose disk is over 85% full it would
/// remove the test images, which cannot be pulled again.
const NO_IMAGE_GC: [&str; 2] = ["--image-gc-high-threshold", "100"];
/// How long the fault lasts once the changes are in.
const FAULT: Duration = Duration::from_secs(15);

/// A tmpfs mounted on a directory for the test; unmounted when dropped.
pub(crate) struct Tmpfs {
    dir: PathBuf,
}

impl Tmpfs {
    pub(crate) fn mount(dir: &Path, size: &str) -> Tmpfs {
        fs::create_dir_all(dir).unwrap();
        run(&[
            "mount",
            "-t",
            "tmpfs",
            "-o",
            &format!("size={size},mode=0755"),
            "tmpfs",
            &dir.display().to_string(),
        ]);
        Tmpfs {
            dir: dir.to_path_buf(),
        }
    }

    fn remount(&self, mode: &str) {
        run(&[
            "mount",
            "-o",
            &format!("remount,{mode}"),
            &self.dir.display().to_string(),
        ]);
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        // Tinylet's drop unmounts everything below its root dir, this one
        // included; what is left (a test that failed early) goes here.
        let _ = Command::new("umount")
            .arg("-l")
            .arg(&self.dir)
            .stderr(std::process::Stdio::null())
            .status();
    }
}

fn run(args: &[&str]) {
    let status = Command::new(args[0])
        .args(&args[1..])
        .status()
        .unwrap_or_else(|e| panic!("running {}: {e}", args.join(" ")));
    assert!(status.success(), "{} failed ({status})", args.join(" "));
}

/// Writes zeros into `path` until the filesystem is full.
fn fill(path: &Path) -> u64 {
    let mut f = fs::File::create(path).unwrap();
    let chunk = vec![0u8; 64 * 1024];
    let mut written = 0u64;
    loop {
        match f.write(&chunk) {
            Ok(0) => break,
            Ok(n) => written += n as u64,
            Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => break,
            Err(e) => panic!("filling {}: {e}", path.display()),
        }
    }
    // Whatever fits in less than a chunk, too.
    loop {
        match f.write(&[0u8; 512]) {
            Ok(n) if n > 0 => written += n as u64,
            _ => break,
        }
    }
    written
}

/// A static pod with a downwardAPI volume (a file tinylet writes under the
/// root dir) that its container checks before it settles down.
fn pod_with_volume(name: &str) -> String {
    yaml_pod(
        name,
        &format!("test \"$(cat /podinfo/name)\" = {name}-{NODE} || exit 3; {LONG_RUNNING}"),
        r#"  volumes:
  - name: podinfo
    downwardAPI:
      items:
      - path: name
        fieldRef:
          fieldPath: metadata.name
"#,
    )
    .replace(
        "    command:",
        "    volumeMounts:\n    - name: podinfo\n      mountPath: /podinfo\n    command:",
    )
}

/// Every regular file below `dir` (symlinks and mount points of other
/// filesystems are not followed).
fn files_below(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let Ok(t) = e.file_type() else { continue };
        if t.is_dir() {
            files_below(&e.path(), out);
        } else if t.is_file() {
            out.push(e.path());
        }
    }
}

/// What is wrong with the files tinylet keeps under its root dir: temp
/// files left behind, checkpoints that do not verify, etc-hosts files that
/// are empty or cut. Empty when all is well. The filler is skipped.
fn root_dir_problems(root: &Path, filler: &Path) -> Vec<String> {
    let mut files = Vec::new();
    files_below(root, &mut files);
    let mut problems = volume_problems(root);
    for f in files.iter().filter(|f| f.as_path() != filler) {
        let name = f.file_name().unwrap().to_string_lossy().into_owned();
        let shown = f.display();
        if name.ends_with(".tmp") || name.starts_with("..data_tmp") {
            problems.push(format!("{shown}: a temp file left behind"));
        } else if name.starts_with("Pod_") {
            let text = fs::read_to_string(f).unwrap_or_default();
            match serde_json::from_str::<Value>(&text) {
                Ok(v) if v["Pod"]["metadata"]["uid"].is_string() && v["Checksum"].is_u64() => {}
                _ => problems.push(format!("{shown}: not a whole checkpoint: {text:.200}")),
            }
        } else if name == "etc-hosts" {
            let text = fs::read_to_string(f).unwrap_or_default();
            if !text.contains("127.0.0.1") || !text.ends_with('\n') {
                problems.push(format!("{shown}: not a whole hosts file: {text:?}"));
            }
        }
    }
    problems
}

/// Volume dirs (those with a `..data` link) below `dir` whose link does
/// not lead to a directory, or that hold more than one timestamped
/// `..<time>` directory (a failed update left its files).
fn volume_problems(dir: &Path) -> Vec<String> {
    let mut problems = Vec::new();
    let Ok(entries) = fs::read_dir(dir) else {
        return problems;
    };
    let mut timestamped = 0;
    let mut has_data = false;
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Ok(t) = e.file_type() else { continue };
        if name == "..data" {
            has_data = true;
        } else if t.is_dir() && name.starts_with("..") {
            timestamped += 1;
        } else if t.is_dir() {
            problems.extend(volume_problems(&e.path()));
        }
    }
    if has_data && (!dir.join("..data").is_dir() || timestamped != 1) {
        problems.push(format!(
            "{}: ..data does not lead to the one timestamped dir ({timestamped} of them)",
            dir.display()
        ));
    }
    problems
}

/// The checkpointed pod names under `dir`.
fn checkpointed(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("Pod_"))
        .filter_map(|e| {
            let v: Value = serde_json::from_str(&fs::read_to_string(e.path()).ok()?).ok()?;
            Some(v["Pod"]["metadata"]["name"].as_str()?.to_string())
        })
        .collect();
    names.sort();
    names
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    /// The tmpfs is filled up by a filler file.
    Full,
    /// The tmpfs is remounted read-only.
    ReadOnly,
}

/// Runs the scenario for one fault; see the module doc.
fn root_dir_fault(fault: Fault) {
    let fake = FakeApiServer::start();
    let ctd = PrivateContainerd::start();
    // Tinylet::start puts its root dir here; the tmpfs goes there first.
    let root = ctd.dir().join(format!("tinylet-{NODE}")).join("root");
    let tmpfs = Tmpfs::mount(&root, "16m");
    let checkpoints = root.join("checkpoints");
    let kubeconfig = fake.node_kubeconfig(ctd.dir(), NODE);
    let kubelet = Tinylet::start_with(
        &ctd,
        NODE,
        &[
            "--kubeconfig",
            &kubeconfig.display().to_string(),
            "--bootstrap-checkpoint-path",
            &checkpoints.display().to_string(),
            NO_IMAGE_GC[0],
            NO_IMAGE_GC[1],
        ],
    );
    assert_eq!(kubelet.root_dir(), root);
    let pid = kubelet.pid().unwrap();
    let dir = kubelet.manifest_dir();
    write_manifest(&dir, "keep.yaml", &pod_with_volume("keep"));
    write_manifest(&dir, "change.yaml", &yaml_pod("change", LONG_RUNNING, ""));
    write_manifest(&dir, "gone.yaml", &yaml_pod("gone", LONG_RUNNING, ""));
    fake.create_pod(api_pod("api-keep"));
    let keep = kubelet.pod_name("keep");
    let change = kubelet.pod_name("change");
    let gone = kubelet.pod_name("gone");
    let new = kubelet.pod_name("new");
    for pod in [&keep, &change, &gone, "api-keep"] {
        wait_until(SETTLE, &format!("pod {pod} runs"), || {
            ctd.pod_running(pod, &["app"])
        });
    }
    wait_until(SETTLE, "api-keep is checkpointed", || {
        checkpointed(&checkpoints) == ["api-keep"]
    });
    let untouched: BTreeMap<String, Vec<String>> = [&keep, "api-keep"]
        .iter()
        .map(|p| {
            (
                p.to_string(),
                ctd.pod_objects(p).iter().map(|o| o.id.clone()).collect(),
            )
        })
        .collect();
    let uid_of = |pod: &str| {
        ctd.object(&ctd.sandbox_ids(pod)[0])
            .unwrap()
            .label(POD_UID_LABEL)
            .to_string()
    };
    let old_change_uid = uid_of(&change);
    let gone_uid = uid_of(&gone);
    let pods_dir = root.join("pods");
    assert!(pods_dir.join(&gone_uid).is_dir(), "no pod dir for {gone}");

    // The fault.
    let filler = root.join("filler");
    let log_from = fs::metadata(kubelet.log_path()).unwrap().len() as usize;
    let (errno_text, errno) = match fault {
        Fault::Full => {
            let bytes = fill(&filler);
            eprintln!("root dir filled: {bytes} bytes of filler");
            ("No space left on device (os error 28)", "ENOSPC")
        }
        Fault::ReadOnly => {
            tmpfs.remount("ro");
            ("Read-only file system (os error 30)", "EROFS")
        }
    };
    let fault_at = Instant::now();
    write_manifest(&dir, "new.yaml", &pod_with_volume("new"));
    write_manifest(
        &dir,
        "change.yaml",
        &yaml_pod("change", &format!("echo v2; {LONG_RUNNING}"), ""),
    );
    remove_manifest(&dir, "gone.yaml");
    fake.create_pod(api_pod("api-new"));

    let log = || {
        let text = fs::read(kubelet.log_path()).unwrap_or_default();
        String::from_utf8_lossy(&text[log_from.min(text.len())..]).into_owned()
    };
    // A clear error naming a path under the root dir and the errno.
    let root_shown = root.display().to_string();
    wait_until(
        SETTLE,
        &format!("tinylet reports {errno} on a path under the root dir"),
        || {
            log().lines().any(|l| {
                (l.contains(" WARN ") || l.contains(" ERROR "))
                    && l.contains(&root_shown)
                    && l.contains(errno_text)
            })
        },
    );
    wait_until(SETTLE, "the removed pod is gone from the runtime", || {
        ctd.pod_gone(&gone)
    });
    let rest = scaled(FAULT).saturating_sub(fault_at.elapsed());
    holds_for(
        rest,
        "the pods that ran are untouched and the root dir holds no broken file",
        || {
            untouched.iter().all(|(p, ids)| {
                ctd.pod_objects(p)
                    .iter()
                    .map(|o| o.id.clone())
                    .collect::<Vec<_>>()
                    == *ids
                    && ctd.pod_running(p, &["app"])
            }) && root_dir_problems(&root, &filler).is_empty()
        },
    );
    assert!(
        !ctd.pod_running(&new, &["app"]),
        "pod new runs although its files cannot be written"
    );
    let lines: Vec<String> = log()
        .lines()
        .filter(|l| l.contains(errno_text))
        .map(String::from)
        .collect();
    let warnings: Vec<&String> = lines
        .iter()
        .filter(|l| l.contains(" WARN ") || l.contains(" ERROR "))
        .collect();
    eprintln!(
        "{fault:?} root dir for {:.0}s: {} log lines name {errno}, {} of them warnings:\n{}",
        fault_at.elapsed().as_secs_f64(),
        lines.len(),
        warnings.len(),
        warnings
            .iter()
            .map(|l| l.chars().take(300).collect::<String>())
            .collect::<Vec<_>>()
            .join("\n")
    );

    // The fault ends; the same process converges.
    match fault {
        Fault::Full => fs::remove_file(&filler).unwrap(),
        Fault::ReadOnly => tmpfs.remount("rw"),
    }
    let back_at = Instant::now();
    for pod in [&new, &change, "api-new"] {
        wait_until(SETTLE, &format!("pod {pod} runs"), || {
            ctd.pod_running(pod, &["app"])
        });
    }
    let new_change_uid = uid_of(&change);
    assert_ne!(
        new_change_uid, old_change_uid,
        "the changed pod still runs its old version"
    );
    wait_until(SETTLE, "both API pods are checkpointed", || {
        checkpointed(&checkpoints) == ["api-keep", "api-new"]
    });
    // On a read-only disk the removed pods' dirs stayed; they go now.
    wait_until(SETTLE, "the removed pods' dirs are deleted", || {
        !pods_dir.join(&gone_uid).exists() && !pods_dir.join(&old_change_uid).exists()
    });
    eprintln!(
        "{fault:?} root dir over: everything converged {:.1}s later",
        back_at.elapsed().as_secs_f64()
    );
    assert!(ctd.pod_gone(&gone), "the removed pod came back");
    for (p, ids) in &untouched {
        let now: Vec<String> = ctd.pod_objects(p).iter().map(|o| o.id.clone()).collect();
        assert_eq!(&now, ids, "pod {p} was touched");
    }
    let problems = root_dir_problems(&root, &filler);
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    assert_eq!(kubelet.pid(), Some(pid), "tinylet was restarted");
    drop(kubelet);
    drop(tmpfs);
}

/// A full root dir: adding, changing and removing pods reports ENOSPC with
/// the path, breaks no file, and converges once space is freed.
#[test]
fn full_root_dir_breaks_nothing_and_converges_when_space_returns() {
    root_dir_fault(Fault::Full);
}

/// A root dir remounted read-only: the same, with EROFS, until it is
/// writable again.
#[test]
fn read_only_root_dir_breaks_nothing_and_converges_when_writable_again() {
    root_dir_fault(Fault::ReadOnly);
}
