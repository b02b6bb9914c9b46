//! Tests of log reading on files in a temp dir and a fake runtime.

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use parking_lot::Mutex;

use super::stream::since_of;
use super::*;
use crate::cri::{api, RuntimeService};
use crate::runtime::fake::{wait_for, FakeRuntime, TEST_IMAGE};

fn temp_dir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!(
        "tinylet-logs-{tag}-{}-{:?}",
        std::process::id(),
        std::thread::current().id()
    ));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// `n` full records `line <i>` at 2021-01-01T00:00:<i>Z-ish times.
fn records(from: usize, to: usize) -> String {
    (from..to)
        .map(|i| {
            format!(
                "2021-01-01T00:{:02}:{:02}.5Z stdout F line {i}\n",
                i / 60 % 60,
                i % 60
            )
        })
        .collect()
}

fn read_all(files: Vec<LogFile>, opts: &LogOptions) -> String {
    let mut s = LogStream::new(None, "c".into(), files, opts, false).unwrap();
    let mut out = Vec::new();
    s.copy_to(&mut out).unwrap();
    String::from_utf8(out).unwrap()
}

fn read(path: &Path, opts: &LogOptions) -> String {
    read_all(log_files(path).unwrap(), opts)
}

fn query(q: &[(&str, &str)]) -> Result<LogOptions, String> {
    LogOptions::from_query(q.iter().map(|(k, v)| (k.to_string(), v.to_string())))
}

#[test]
fn query_parameters_are_decoded_and_bad_ones_named() {
    let o = query(&[
        ("follow", "true"),
        ("tailLines", "10"),
        ("limitBytes", "100"),
        ("timestamps", "1"),
        ("previous", "false"),
        ("sinceTime", "2021-01-01T00:00:00Z"),
        ("container", "ignored"),
    ])
    .unwrap();
    assert!(o.follow && o.timestamps && !o.previous);
    assert_eq!((o.tail_lines, o.limit_bytes), (Some(10), Some(100)));
    assert_eq!(o.since, Some(since_of("2021-01-01T00:00:00Z")));
    let o = query(&[("sinceSeconds", "60")]).unwrap();
    let ago = SystemTime::now().duration_since(o.since.unwrap()).unwrap();
    assert!(ago >= Duration::from_secs(59) && ago < Duration::from_secs(3600));
    for (q, name) in [
        (&[("tailLines", "x")][..], "tailLines"),
        (&[("tailLines", "-1")][..], "tailLines"),
        (&[("limitBytes", "0")][..], "limitBytes"),
        (&[("sinceSeconds", "0")][..], "sinceSeconds"),
        (&[("sinceTime", "yesterday")][..], "sinceTime"),
        (
            &[("sinceSeconds", "5"), ("sinceTime", "2021-01-01T00:00:00Z")][..],
            "sinceSeconds",
        ),
    ] {
        let e = query(q).unwrap_err();
        assert!(e.contains(name), "{q:?}: {e}");
    }
}

#[test]
fn partial_records_are_joined_and_timestamps_printed_once_per_line() {
    let d = temp_dir("partial");
    let log = d.join("0.log");
    std::fs::write(
        &log,
        "2021-01-01T00:00:01.123Z stdout P hel\n\
         2021-01-01T00:00:01.2Z stdout P lo \n\
         2021-01-01T00:00:01.3Z stdout F world\n\
         2021-01-01T00:00:02+01:00 stderr F oops\n\
         2021-01-01T00:00:03.000000001Z stdout F \n",
    )
    .unwrap();
    assert_eq!(read(&log, &LogOptions::default()), "hello world\noops\n\n");
    let ts = LogOptions {
        timestamps: true,
        ..Default::default()
    };
    assert_eq!(
        read(&log, &ts),
        "2021-01-01T00:00:01.123000000Z hello world\n\
         2021-01-01T00:00:02.000000000+01:00 oops\n\
         2021-01-01T00:00:03.000000001Z \n"
    );
}

#[test]
fn garbage_lines_are_skipped() {
    let d = temp_dir("garbage");
    let log = d.join("0.log");
    let long = "x".repeat(1000);
    std::fs::write(
        &log,
        format!(
            "not a record\n\
             2021-01-01T00:00:01Z stdout F good 1\n\
             yesterday stdout F bad time\n\
             2021-01-01T00:00:01Z stdlog F bad stream\n\
             2021-01-01T00:00:01Z stdout\n\
             {long}\n\
             \n\
             2021-01-01T00:00:02Z stdout F good 2\n"
        ),
    )
    .unwrap();
    assert_eq!(read(&log, &LogOptions::default()), "good 1\ngood 2\n");
    let tail = LogOptions {
        tail_lines: Some(5),
        ..Default::default()
    };
    assert_eq!(read(&log, &tail), "good 1\ngood 2\n");
}

#[test]
fn tail_counts_lines_backwards_across_blocks_and_rotated_files() {
    let d = temp_dir("tail");
    let log = d.join("0.log");
    // Older, compressed: lines 0..1000; newest rotated: 1000..2000; live:
    // 2000..5000 (over 100 KiB, several read blocks).
    let gz = d.join("0.log.20210101-000000.gz");
    let mut enc = flate2::write::GzEncoder::new(
        std::fs::File::create(&gz).unwrap(),
        flate2::Compression::fast(),
    );
    enc.write_all(records(0, 1000).as_bytes()).unwrap();
    enc.finish().unwrap();
    std::fs::write(d.join("0.log.20210101-000100"), records(1000, 2000)).unwrap();
    // A partial line in the live file counts once, with its end.
    let mut live = records(2000, 4000);
    live.push_str("2021-01-01T01:00:00Z stdout P joined \n");
    live.push_str(&records(4000, 5000));
    std::fs::write(&log, live).unwrap();
    let tail = |n| LogOptions {
        tail_lines: Some(n),
        ..Default::default()
    };
    let got = read(&log, &tail(3));
    assert_eq!(got, "line 4997\nline 4998\nline 4999\n");
    let got = read(&log, &tail(1000));
    assert!(got.starts_with("joined line 4000\n"), "{}", &got[..40]);
    assert_eq!(got.lines().count(), 1000);
    let got = read(&log, &tail(3000));
    assert!(got.starts_with("line 2000\n"), "{}", &got[..40]);
    assert_eq!(got.lines().count(), 3000);
    // Into the newest rotated file, then into the compressed one.
    let got = read(&log, &tail(3002));
    assert!(
        got.starts_with("line 1998\nline 1999\nline 2000\n"),
        "{}",
        &got[..40]
    );
    assert_eq!(got.lines().count(), 3002);
    let got = read(&log, &tail(4002));
    assert!(
        got.starts_with("line 998\nline 999\nline 1000\n"),
        "{}",
        &got[..40]
    );
    assert_eq!(got.lines().count(), 4002);
    let got = read(&log, &tail(100_000));
    assert!(got.starts_with("line 0\n"));
    assert_eq!(got.lines().count(), 5000);
    assert_eq!(read(&log, &tail(0)), "");
    // Without tail or since, only the live file, as upstream.
    let got = read(&log, &LogOptions::default());
    assert!(got.starts_with("line 2000\n"));
}

#[test]
fn since_skips_earlier_lines_and_rotated_files_before_it() {
    let d = temp_dir("since");
    let log = d.join("0.log");
    std::fs::write(d.join("0.log.20210101-000100"), records(0, 60)).unwrap();
    std::fs::write(&log, records(60, 120)).unwrap();
    let since = |t| LogOptions {
        since: Some(since_of(t)),
        ..Default::default()
    };
    let got = read(&log, &since("2021-01-01T00:00:58Z"));
    assert!(got.starts_with("line 58\nline 59\nline 60\n"), "{got}");
    assert_eq!(got.lines().count(), 62);
    let got = read(&log, &since("2021-01-01T00:01:30Z"));
    assert!(got.starts_with("line 90\n"), "{got}");
    // A rotated file older than since is not even opened.
    let files = log_files(&log).unwrap();
    assert_eq!(files.len(), 2);
    std::fs::write(d.join("0.log.20210101-000100"), "garbage\n").unwrap();
    assert!(read(&log, &since("2021-01-01T00:01:30Z")).starts_with("line 90\n"));
}

#[test]
fn limit_bytes_cuts_the_output() {
    let d = temp_dir("limit");
    let log = d.join("0.log");
    std::fs::write(&log, records(0, 100)).unwrap();
    let o = LogOptions {
        limit_bytes: Some(10),
        ..Default::default()
    };
    assert_eq!(read(&log, &o), "line 0\nlin");
    let o = LogOptions {
        limit_bytes: Some(5),
        timestamps: true,
        ..Default::default()
    };
    assert_eq!(read(&log, &o), "2021-");
}

/// A writer that records the size of its largest write.
#[derive(Default)]
struct Counting {
    total: usize,
    largest: usize,
    tail: Vec<u8>,
}

impl Write for Counting {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.total += b.len();
        self.largest = self.largest.max(b.len());
        self.tail = b[b.len().saturating_sub(16)..].to_vec();
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[test]
fn a_huge_line_without_newline_is_streamed_not_buffered() {
    let d = temp_dir("huge");
    let log = d.join("0.log");
    let mut f = std::fs::File::create(&log).unwrap();
    f.write_all(b"2021-01-01T00:00:00Z stdout F ").unwrap();
    let chunk = vec![b'a'; 1 << 20];
    for _ in 0..5 {
        f.write_all(&chunk).unwrap();
    }
    f.write_all(b"\n2021-01-01T00:00:01Z stdout F end\n")
        .unwrap();
    // And once more with no newline at all.
    let log2 = d.join("1.log");
    let mut f2 = std::fs::File::create(&log2).unwrap();
    f2.write_all(b"2021-01-01T00:00:00Z stdout P ").unwrap();
    for _ in 0..5 {
        f2.write_all(&chunk).unwrap();
    }
    for (path, total, end) in [
        (&log, (5 << 20) + 5, &b"end\n"[..]),
        (&log2, 5 << 20, &b"aaaa"[..]),
    ] {
        let mut s = LogStream::new(
            None,
            "c".into(),
            log_files(path).unwrap(),
            &LogOptions {
                tail_lines: Some(10),
                ..Default::default()
            },
            false,
        )
        .unwrap();
        let mut w = Counting::default();
        s.copy_to(&mut w).unwrap();
        assert_eq!(w.total, total);
        assert!(w.tail.ends_with(end));
        assert!(w.largest <= 128 * 1024, "a write of {} bytes", w.largest);
    }
}

#[derive(Clone, Default)]
struct Shared(Arc<Mutex<Vec<u8>>>);

impl Write for Shared {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Shared {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock()).into_owned()
    }
}

/// A running container `name` of pod default/web (uid u1) with restart
/// count `restart`, its log at `log`.
fn container(fake: &FakeRuntime, name: &str, restart: u32, log: &Path) -> String {
    let ids = HashMap::from([
        (labels::POD_NAMESPACE.to_string(), "default".to_string()),
        (labels::POD_NAME.to_string(), "web".to_string()),
        (labels::POD_UID.to_string(), "u1".to_string()),
    ]);
    let mut sb = api::PodSandboxConfig::new();
    sb.labels = ids.clone();
    let sid = fake.run_pod_sandbox(&sb, "").unwrap();
    let mut c = api::ContainerConfig::new();
    c.labels = ids;
    c.labels.insert(labels::CONTAINER_NAME.into(), name.into());
    c.annotations
        .insert(labels::CONTAINER_RESTART_COUNT.into(), restart.to_string());
    let mut image = api::ImageSpec::new();
    image.image = TEST_IMAGE.into();
    c.image = Some(image).into();
    let mut meta = api::ContainerMetadata::new();
    meta.name = name.into();
    meta.attempt = restart;
    c.metadata = Some(meta).into();
    let id = fake.create_container(&sid, &c, &sb).unwrap();
    fake.start_container(&id).unwrap();
    fake.set_log_path(&id, log);
    id
}

#[test]
fn open_finds_the_latest_and_the_previous_instance() {
    let d = temp_dir("open");
    let fake = FakeRuntime::with_images(&[TEST_IMAGE]);
    let first = container(&fake, "app", 0, &d.join("0.log"));
    std::fs::write(d.join("0.log"), records(0, 2)).unwrap();
    let copy = |o: &LogOptions| -> Result<String, LogError> {
        let mut s = open(&fake, "default", "web", "app", o)?;
        let mut out = Vec::new();
        s.copy_to(&mut out).unwrap();
        Ok(String::from_utf8(out).unwrap())
    };
    let previous = LogOptions {
        previous: true,
        ..Default::default()
    };
    let e = copy(&previous).unwrap_err();
    assert!(
        matches!(&e, LogError::BadRequest(m) if m.contains("previous terminated container")),
        "{e:?}"
    );
    fake.exit_container(&first, 1);
    container(&fake, "app", 1, &d.join("1.log"));
    std::fs::write(d.join("1.log"), records(10, 11)).unwrap();
    assert_eq!(copy(&LogOptions::default()).unwrap(), "line 10\n");
    assert_eq!(copy(&previous).unwrap(), "line 0\nline 1\n");
    assert!(matches!(
        open(&fake, "default", "web", "other", &previous).err(),
        Some(LogError::NotFound(m)) if m.contains("\"other\"")
    ));
    assert!(matches!(
        open(&fake, "default", "nope", "app", &previous).err(),
        Some(LogError::NotFound(m)) if m.contains("does not exist")
    ));
    fake.fail_next("ListContainers", 1);
    assert!(matches!(
        open(&fake, "default", "web", "app", &previous).err(),
        Some(LogError::Runtime(_))
    ));
}

#[test]
fn follow_picks_up_appended_lines_continues_across_a_rename_and_ends_with_the_container() {
    let d = temp_dir("follow");
    let log = d.join("0.log");
    let fake = Arc::new(FakeRuntime::with_images(&[TEST_IMAGE]));
    let id = container(&fake, "app", 0, &log);
    std::fs::write(&log, records(0, 3)).unwrap();
    let out = Shared::default();
    let (rt, w) = (fake.clone(), out.clone());
    // The result comes through a channel (the thread is not joined), so a
    // follow that never ends fails the test instead of hanging it.
    let (done_tx, done_rx) = crossbeam_channel::bounded(1);
    crate::thread::spawn_named("follow-test", move || {
        let mut w = w;
        let o = LogOptions {
            follow: true,
            tail_lines: Some(1),
            ..Default::default()
        };
        let r = open(&*rt, "default", "web", "app", &o)
            .map_err(|e| e.to_string())
            .and_then(|mut s| s.copy_to(&mut w).map_err(|e| e.to_string()));
        let _ = done_tx.send(r);
    })
    .unwrap()
    .detach();
    wait_for("the tail", || out.text() == "line 2\n");
    let append = |s: &str| {
        let mut f = std::fs::OpenOptions::new().append(true).open(&log).unwrap();
        f.write_all(s.as_bytes()).unwrap();
    };
    append(&records(3, 5));
    wait_for("appended lines", || out.text().ends_with("line 4\n"));
    // Rotation: the file is renamed, the runtime still writes a line to it,
    // then reopens the log and writes to the new file.
    let rotated = d.join("0.log.20210101-000000");
    std::fs::rename(&log, &rotated).unwrap();
    let mut old = std::fs::OpenOptions::new()
        .append(true)
        .open(&rotated)
        .unwrap();
    old.write_all(records(5, 6).as_bytes()).unwrap();
    std::fs::write(&log, records(6, 8)).unwrap();
    wait_for("lines after the rotation", || {
        out.text().ends_with("line 7\n")
    });
    // A line written just before the end is still delivered.
    append(&records(8, 9));
    fake.exit_container(&id, 0);
    let r = done_rx.recv_timeout(Duration::from_secs(30));
    assert_eq!(r, Ok(Ok(())), "the follow did not end with the container");
    assert_eq!(
        out.text(),
        "line 2\nline 3\nline 4\nline 5\nline 6\nline 7\nline 8\n"
    );
}

/// containerd writes an exited container's last output a moment after it
/// reports the exit: a read just after waits for the file to stop growing.
#[test]
fn a_log_read_right_after_the_exit_waits_for_the_last_lines() {
    let dir = tempfile::tempdir().unwrap();
    let live = dir.path().join("0.log");
    std::fs::write(&live, "").unwrap();
    let s = || Settle {
        after_exit: Duration::from_millis(300),
        quiet: Duration::from_millis(50),
    };
    // The writer is late: nothing yet, then a line 150 ms after the exit,
    // then another 400 ms after it.
    let finished = SystemTime::now();
    let writer = {
        let live = live.clone();
        crate::thread::spawn_named("late-writer", move || {
            std::thread::sleep(Duration::from_millis(150));
            let mut f = std::fs::OpenOptions::new()
                .append(true)
                .open(&live)
                .unwrap();
            f.write_all(b"2026-11-28T19:00:00.000000000Z stdout F one\n")
                .unwrap();
            std::thread::sleep(Duration::from_millis(250));
            f.write_all(b"2026-11-28T19:00:00.000000001Z stdout F two\n")
                .unwrap();
        })
        .unwrap()
    };
    let started = std::time::Instant::now();
    settle(&live, finished, s());
    writer.join().unwrap();
    assert!(
        started.elapsed() >= Duration::from_millis(400),
        "{:?}",
        started.elapsed()
    );
    let text = std::fs::read_to_string(&live).unwrap();
    assert!(text.contains(" two\n"), "{text}");

    // An exit long ago: read at once; a file that never changes: waited
    // for `after_exit` and `quiet` only.
    let started = std::time::Instant::now();
    settle(&live, SystemTime::now() - Duration::from_secs(5), s());
    assert!(started.elapsed() < Duration::from_millis(50));
    let started = std::time::Instant::now();
    settle(&live, SystemTime::now(), s());
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(340) && took < Duration::from_millis(600),
        "{took:?}"
    );
    // A file that keeps growing is read by twice `after_exit` at most.
    let busy = live.clone();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flag = stop.clone();
    let grower = crate::thread::spawn_named("grower", move || {
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(&busy)
            .unwrap();
        while !flag.load(std::sync::atomic::Ordering::SeqCst) {
            f.write_all(b"x").unwrap();
            std::thread::sleep(Duration::from_millis(10));
        }
    })
    .unwrap();
    let started = std::time::Instant::now();
    settle(&live, SystemTime::now(), s());
    let took = started.elapsed();
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    grower.join().unwrap();
    assert!(took < Duration::from_millis(800), "{took:?}");
}
