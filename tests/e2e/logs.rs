//! End-to-end tests of container logs on a real, private containerd: the
//! log of a restarted container and of the instance before it
//! (`previous`), as `/containerLogs` serves them, and rotation with a tiny
//! `--container-log-max-size` while a `follow` keeps reading across it;
//! the whole output of short-lived containers read as soon as they exit.

use std::collections::BTreeSet;
use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tinylet::cri::{RemoteRuntime, RuntimeService};
use tinylet::logs::{open, LogOptions};

use crate::e2e::{NODE, SETTLE};
use crate::support::containerd::{
    remove_manifest, wait_until, write_manifest, PrivateContainerd, Tinylet, BUSYBOX_IMAGE,
};

fn manifest(name: &str, script: &str) -> String {
    format!(
        r#"apiVersion: v1
kind: Pod
metadata:
  name: {name}
spec:
  terminationGracePeriodSeconds: 1
  volumes:
  - name: data
    emptyDir: {{}}
  containers:
  - name: app
    image: {BUSYBOX_IMAGE}
    imagePullPolicy: IfNotPresent
    command: ["sh", "-c", {script:?}]
    volumeMounts:
    - name: data
      mountPath: /data
"#
    )
}

fn read(cri: &RemoteRuntime, pod: &str, opts: &LogOptions) -> Result<String, String> {
    let mut s = open(cri, "default", pod, "app", opts).map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    s.copy_to(&mut out).map_err(|e| e.to_string())?;
    String::from_utf8(out).map_err(|e| e.to_string())
}

#[test]
fn previous_reads_the_first_run_and_the_live_log_the_second() {
    let ctd = PrivateContainerd::start();
    let kubelet = Tinylet::start(&ctd, NODE);
    let cri = RemoteRuntime::new(&ctd.endpoint(), Duration::from_secs(30)).expect("CRI client");
    let script = "if [ -f /data/ran ]; then echo second run; \
                  trap 'exit 0' TERM; while :; do sleep 1; done; \
                  else touch /data/ran; echo first line; echo first run >&2; exit 3; fi";
    write_manifest(
        &kubelet.manifest_dir(),
        "talker.yaml",
        &manifest("talker", script),
    );
    let pod = format!("talker-{NODE}");
    let live = LogOptions::default();
    let previous = LogOptions {
        previous: true,
        ..Default::default()
    };
    // The restart comes after the 10 s back-off.
    wait_until(SETTLE * 3, "the second run logged", || {
        read(&cri, &pod, &live).is_ok_and(|s| s == "second run\n")
    });
    // stdout and stderr reach the file through separate pipes, so their
    // order is the runtime's: compare the lines as a set.
    let first = read(&cri, &pod, &previous).unwrap();
    let mut lines: Vec<&str> = first.lines().collect();
    lines.sort_unstable();
    assert_eq!(lines, ["first line", "first run"], "{first:?}");
    assert!(first.ends_with('\n'), "{first:?}");
    let stamped = read(
        &cri,
        &pod,
        &LogOptions {
            timestamps: true,
            ..Default::default()
        },
    )
    .unwrap();
    // Upstream's fixed form: nine fraction digits.
    let (time, rest) = stamped.split_once(' ').expect("a timestamp");
    assert_eq!(rest, "second run\n");
    assert!(
        time.as_bytes().get(19) == Some(&b'.')
            && time
                .get(20..29)
                .is_some_and(|d| d.bytes().all(|c| c.is_ascii_digit()))
            && time
                .get(29..)
                .is_some_and(|z| !z.starts_with(|c: char| c.is_ascii_digit())),
        "{stamped:?}"
    );
    let e = open(&cri, "default", &pod, "nope", &live).err();
    assert!(
        matches!(e, Some(tinylet::logs::LogError::NotFound(_))),
        "{e:?}"
    );
    remove_manifest(&kubelet.manifest_dir(), "talker.yaml");
    wait_until(SETTLE, "the pod is gone", || ctd.pod_gone(&pod));
}

#[derive(Clone, Default)]
struct Shared(Arc<Mutex<Vec<u8>>>);

impl Write for Shared {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Shared {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap_or_else(|e| e.into_inner())).into_owned()
    }
}

/// The numbers of `line <n>` lines, checked to follow each other.
fn numbers(text: &str) -> Vec<u64> {
    let v: Vec<u64> = text
        .lines()
        .map(|l| {
            l.strip_prefix("line ")
                .and_then(|n| n.parse().ok())
                .unwrap_or_else(|| panic!("unexpected line {l:?}"))
        })
        .collect();
    for w in v.windows(2) {
        assert_eq!(w[1], w[0] + 1, "a gap or a repeat in the followed log");
    }
    v
}

#[test]
fn rotation_keeps_few_files_and_follow_reads_across_it() {
    let ctd = PrivateContainerd::start();
    let kubelet = Tinylet::start_with(
        &ctd,
        NODE,
        &[
            "--container-log-max-size",
            "1Ki",
            "--container-log-max-files",
            "3",
        ],
    );
    let endpoint = ctd.endpoint();
    let cri = RemoteRuntime::new(&endpoint, Duration::from_secs(30)).expect("CRI client");
    // About 1.5 KB of log a second.
    let script = "trap 'exit 0' TERM; i=0; while :; do n=0; \
                  while [ $n -lt 30 ]; do echo line $i; i=$((i+1)); n=$((n+1)); done; \
                  sleep 1; done";
    write_manifest(
        &kubelet.manifest_dir(),
        "chatty.yaml",
        &manifest("chatty", script),
    );
    let pod = format!("chatty-{NODE}");
    wait_until(SETTLE, "the container logged", || {
        read(&cri, &pod, &LogOptions::default()).is_ok_and(|s| s.contains("line 1\n"))
    });
    let out = Shared::default();
    // The result comes through a channel and the thread is not joined, so
    // a failed check cannot hang the test on a follow that never ends.
    let (done_tx, done_rx) = crossbeam_channel::bounded(1);
    {
        let (out, pod) = (out.clone(), pod.clone());
        tinylet::thread::spawn_named("follow", move || {
            let cri = RemoteRuntime::new(&endpoint, Duration::from_secs(30))
                .map_err(|e| e.to_string())?;
            let opts = LogOptions {
                follow: true,
                ..Default::default()
            };
            let mut out = out;
            let result = open(&cri, "default", &pod, "app", &opts)
                .map_err(|e| e.to_string())?
                .copy_to(&mut out)
                .map_err(|e| e.to_string());
            let _ = done_tx.send(result.clone());
            result
        })
        .unwrap()
        .detach();
    }
    let ids = ctd.container_ids_named(&pod, "app");
    let id = ids.first().expect("the container");
    let log_path = cri.container_status(id).expect("its status").log_path;
    let log_dir = std::path::Path::new(&log_path)
        .parent()
        .expect("the log's directory")
        .to_path_buf();
    let rotated = || -> BTreeSet<String> {
        std::fs::read_dir(&log_dir)
            .map(|d| {
                d.filter_map(|e| e.ok()?.file_name().into_string().ok())
                    .filter(|n| n.starts_with("0.log."))
                    .collect()
            })
            .unwrap_or_default()
    };
    // Two rotations after the follow began, and a compressed file.
    let mut seen = BTreeSet::new();
    let before = rotated();
    wait_until(SETTLE * 4, "two rotations", || {
        let now = rotated();
        assert!(now.len() <= 2, "more than 3 files: {now:?}");
        seen.extend(
            now.difference(&before)
                .filter(|n| !n.ends_with(".gz"))
                .cloned(),
        );
        seen.len() >= 2 && now.iter().any(|n| n.ends_with(".gz"))
    });
    let lines_so_far = numbers(&out.text()).len();
    wait_until(SETTLE, "more lines followed", || {
        numbers(&out.text()).len() > lines_so_far + 30
    });
    // The follow ends with the container.
    remove_manifest(&kubelet.manifest_dir(), "chatty.yaml");
    let result = done_rx
        .recv_timeout(SETTLE)
        .expect("the follow ended with the container");
    assert_eq!(result, Ok(()));
    let got = numbers(&out.text());
    assert!(got.len() > lines_so_far + 30, "{} lines", got.len());
    wait_until(SETTLE, "the pod is gone", || ctd.pod_gone(&pod));
}

/// containerd reports a container exited before its log writer is done
/// with the last output; under load a read right then found the log empty.
/// 100 pods that print one line and exit, each log read the moment the
/// runtime says its container exited, while the other end-to-end tests
/// keep the machine busy.
#[test]
fn the_log_of_a_container_read_as_it_exits_has_its_whole_output() {
    let ctd = PrivateContainerd::start();
    let kubelet = Tinylet::start(&ctd, NODE);
    let cri = RemoteRuntime::new(&ctd.endpoint(), Duration::from_secs(30)).expect("CRI client");
    const PODS: usize = 100;
    for i in 0..PODS {
        let m = format!(
            r#"apiVersion: v1
kind: Pod
metadata:
  name: brief-{i}
spec:
  restartPolicy: Never
  terminationGracePeriodSeconds: 1
  containers:
  - name: app
    image: {BUSYBOX_IMAGE}
    imagePullPolicy: IfNotPresent
    command: ["sh", "-c", "echo output of pod {i}"]
"#
        );
        write_manifest(&kubelet.manifest_dir(), &format!("brief-{i}.yaml"), &m);
    }
    let mut pending: BTreeSet<usize> = (0..PODS).collect();
    let mut empty = Vec::new();
    wait_until(
        SETTLE * 6,
        "every brief pod's container exited and its log read",
        || {
            let exited: Vec<usize> = cri
                .list_containers(None)
                .unwrap_or_default()
                .into_iter()
                .filter(|c| {
                    c.state.enum_value_or_default()
                        == tinylet::cri::api::ContainerState::CONTAINER_EXITED
                })
                .filter_map(|c| {
                    c.labels
                        .get("io.kubernetes.pod.name")
                        .and_then(|n| n.strip_prefix("brief-"))
                        .and_then(|n| n.split('-').next())
                        .and_then(|n| n.parse::<usize>().ok())
                })
                .filter(|i| pending.contains(i))
                .collect();
            // Read at once, all of this turn's together (a read just after an
            // exit may wait up to a second for the writer).
            let reads: Vec<(usize, String)> = std::thread::scope(|scope| {
                let handles: Vec<_> = exited
                    .iter()
                    .map(|&i| {
                        let cri = &cri;
                        scope.spawn(move || {
                            let pod = format!("brief-{i}-{NODE}");
                            (
                                i,
                                read(cri, &pod, &LogOptions::default()).unwrap_or_else(|e| e),
                            )
                        })
                    })
                    .collect();
                handles.into_iter().filter_map(|h| h.join().ok()).collect()
            });
            for (i, got) in reads {
                if got != format!("output of pod {i}\n") {
                    empty.push((i, got));
                }
                pending.remove(&i);
            }
            pending.is_empty()
        },
    );
    assert!(
        empty.is_empty(),
        "logs read at the exit without the output: {empty:?}"
    );
    for i in 0..PODS {
        remove_manifest(&kubelet.manifest_dir(), &format!("brief-{i}.yaml"));
    }
}
