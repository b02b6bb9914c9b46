//! Container log rotation (upstream's container log manager): the
//! `container-log-manager` thread looks at every running container's log
//! every 10 s (the containers as the PLEG's last relist found them, each
//! one's log path asked of the runtime once: a pass costs the runtime
//! nothing, where upstream lists and inspects every container); one over `--container-log-max-size` is renamed to
//! `<log>.<UTC time YYYYmmdd-HHMMSS>` and the runtime is told to reopen the
//! log (CRI `ReopenContainerLog`; if that fails the file is renamed back,
//! to be tried again next time). Before that, older rotated files are
//! gzipped (`<name>.gz`, written as `<name>.tmp` and renamed) and the
//! oldest removed, so that at most `--container-log-max-files` files stay
//! per container, the live one included. Rotated files of removed
//! containers go with the container's log directory, as upstream.

use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use k8s_openapi::jiff::Timestamp;
use log::{debug, info, warn};
use parking_lot::Mutex;

use crate::cri::{api, RuntimeService};

/// How often logs are looked at (upstream's `logMonitorPeriod`).
pub(crate) const PERIOD: Duration = Duration::from_secs(10);
/// `--container-log-max-size`'s default: 10Mi.
pub(crate) const DEFAULT_MAX_SIZE: u64 = 10 * 1024 * 1024;
/// `--container-log-max-files`'s default.
pub(crate) const DEFAULT_MAX_FILES: usize = 5;

const COMPRESS_SUFFIX: &str = ".gz";
const TMP_SUFFIX: &str = ".tmp";

/// The IDs of the running containers, as another part of tinylet last
/// saw them (the PLEG's relist), so that a pass asks the runtime nothing.
pub(crate) type RunningContainers = Box<dyn Fn() -> Vec<String> + Send + Sync>;

/// The rotation policy over a runtime.
pub(crate) struct LogRotation {
    runtime: Arc<dyn RuntimeService>,
    max_size: u64,
    max_files: usize,
    /// Where the running containers come from; `None`: ListContainers.
    running: Option<RunningContainers>,
    /// Each running container's log path (ContainerStatus once per
    /// container: it never changes), forgotten when the container stops.
    paths: Mutex<HashMap<String, PathBuf>>,
    /// The last failure logged for each container, and whether the last
    /// pass found the runtime down: a failure is logged when it is new,
    /// not at every pass (10 s) while it lasts.
    failed: Mutex<Failures>,
}

/// Why one container's pass failed.
enum Failure {
    /// The runtime does not answer: nothing else is tried this pass.
    RuntimeDown(String),
    Other(String),
}

impl From<String> for Failure {
    fn from(e: String) -> Failure {
        Failure::Other(e)
    }
}

#[derive(Default)]
struct Failures {
    by_container: HashMap<String, String>,
    runtime_down: bool,
}

impl LogRotation {
    /// `max_files` below 2 is taken as 2 (the options refuse it earlier).
    pub(crate) fn new(runtime: Arc<dyn RuntimeService>, max_size: u64, max_files: usize) -> Self {
        LogRotation {
            runtime,
            max_size,
            max_files: max_files.max(2),
            running: None,
            paths: Mutex::new(HashMap::new()),
            failed: Mutex::new(Failures::default()),
        }
    }

    /// Takes the running containers from `running` instead of listing them.
    pub(crate) fn with_running(mut self, running: RunningContainers) -> Self {
        self.running = Some(running);
        self
    }

    /// One pass over the running containers; `now` names rotated files.
    /// A container that fails is logged and the others go on.
    pub(crate) fn rotate_logs(&self, now: SystemTime) -> Result<(), String> {
        let ids = match &self.running {
            Some(running) => running(),
            None => self
                .runtime
                .list_containers(None)
                .map_err(|e| format!("listing containers: {e}"))?
                .into_iter()
                .filter(|c| {
                    c.state.enum_value_or_default() == api::ContainerState::CONTAINER_RUNNING
                })
                .map(|c| c.id)
                .collect(),
        };
        let mut failed = self.failed.lock();
        let mut down = false;
        for id in &ids {
            match self.rotate_container(id, now) {
                Ok(()) => {
                    failed.by_container.remove(id);
                }
                // The runtime is down: the next pass tries them all again.
                Err(Failure::RuntimeDown(e)) => {
                    if !failed.runtime_down {
                        warn!("container log rotation: waiting for the runtime: {e}");
                    }
                    down = true;
                    break;
                }
                Err(Failure::Other(e)) => {
                    if failed.by_container.get(id) != Some(&e) {
                        warn!("container log rotation of {id}: {e}");
                        failed.by_container.insert(id.clone(), e);
                    }
                }
            }
        }
        if failed.runtime_down && !down {
            info!("container log rotation: the runtime answers again");
        }
        failed.runtime_down = down;
        failed.by_container.retain(|id, _| ids.contains(id));
        crate::malloc::shrink_map(&mut failed.by_container);
        drop(failed);
        let mut paths = self.paths.lock();
        paths.retain(|id, _| ids.contains(id));
        crate::malloc::shrink_map(&mut paths);
        Ok(())
    }

    /// The log path of container `id` (empty: it has none).
    fn log_path(&self, id: &str) -> Result<PathBuf, Failure> {
        if let Some(p) = self.paths.lock().get(id) {
            return Ok(p.clone());
        }
        let status = self.runtime.container_status(id).map_err(|e| {
            if e.is_unavailable() {
                Failure::RuntimeDown(e.to_string())
            } else {
                Failure::Other(e.to_string())
            }
        })?;
        let path = PathBuf::from(&status.log_path);
        self.paths.lock().insert(id.to_string(), path.clone());
        Ok(path)
    }

    fn rotate_container(&self, id: &str, now: SystemTime) -> Result<(), Failure> {
        let log = self.log_path(id)?;
        if log.as_os_str().is_empty() {
            return Ok(());
        }
        let size = match std::fs::metadata(&log) {
            Ok(m) => m.len(),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                // A rotation that failed half-way (renamed, not reopened,
                // not renamed back) lost the live file: have the runtime
                // make it again.
                self.runtime
                    .reopen_container_log(id)
                    .map_err(|e| format!("reopening the missing {}: {e}", log.display()))?;
                return Ok(());
            }
            Err(e) => return Err(format!("{}: {e}", log.display()).into()),
        };
        if size < self.max_size {
            return Ok(());
        }
        Ok(self.rotate_log(id, &log, now)?)
    }

    fn rotate_log(&self, id: &str, log: &Path, now: SystemTime) -> Result<(), String> {
        let rotated = self.cleanup(log)?;
        // Room for the file rotated now and the new live one.
        let keep = self.max_files - 2;
        let excess = rotated.len().saturating_sub(keep);
        for old in &rotated[..excess] {
            remove(old)?;
        }
        for old in &rotated[excess..] {
            if !old.to_string_lossy().ends_with(COMPRESS_SUFFIX) {
                compress(old)?;
            }
        }
        let stamp = Timestamp::try_from(now)
            .map(|t| t.strftime("%Y%m%d-%H%M%S").to_string())
            .map_err(|e| format!("the time for {}: {e}", log.display()))?;
        let mut name = log.as_os_str().to_owned();
        name.push(format!(".{stamp}"));
        let target = PathBuf::from(name);
        std::fs::rename(log, &target)
            .map_err(|e| format!("renaming {} to {}: {e}", log.display(), target.display()))?;
        if let Err(e) = self.runtime.reopen_container_log(id) {
            // Back, so that the next pass tries again rather than the
            // runtime writing on into a rotated file.
            if let Err(back) = std::fs::rename(&target, log) {
                warn!(
                    "renaming {} back to {} after a failed reopen: {back}",
                    target.display(),
                    log.display()
                );
            }
            return Err(format!("reopening the log {}: {e}", log.display()));
        }
        debug!(
            "rotated container log {} to {}",
            log.display(),
            target.display()
        );
        Ok(())
    }

    /// Removes every rotated log file of every container the runtime
    /// knows (running or exited), leaving the live ones: what the eviction
    /// manager reclaims under disk pressure. Returns the files removed and
    /// their bytes; a container that fails is logged and the others go on.
    pub(crate) fn remove_rotated(&self) -> Result<(usize, u64), String> {
        let containers = self
            .runtime
            .list_containers(None)
            .map_err(|e| format!("listing containers: {e}"))?;
        let (mut files, mut bytes) = (0, 0u64);
        for c in containers {
            let log = match self.runtime.container_status(&c.id) {
                Ok(s) if !s.log_path.is_empty() => PathBuf::from(s.log_path),
                Ok(_) => continue,
                Err(e) => {
                    warn!("rotated logs of {}: {e}", c.id);
                    continue;
                }
            };
            let rotated = match self.cleanup(&log) {
                Ok(r) => r,
                Err(e) => {
                    warn!("rotated logs of {}: {e}", c.id);
                    continue;
                }
            };
            for old in rotated {
                let size = std::fs::metadata(&old).map_or(0, |m| m.len());
                match remove(&old) {
                    Ok(()) => {
                        files += 1;
                        bytes += size;
                    }
                    Err(e) => warn!("{e}"),
                }
            }
        }
        Ok((files, bytes))
    }

    /// Removes leftovers of `log` (temp files of an unfinished compression,
    /// plain files whose compressed copy is done) and returns its rotated
    /// files, oldest first.
    fn cleanup(&self, log: &Path) -> Result<Vec<PathBuf>, String> {
        let (Some(dir), Some(base)) = (log.parent(), log.file_name().and_then(|n| n.to_str()))
        else {
            return Ok(Vec::new());
        };
        let prefix = format!("{base}.");
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .map_err(|e| format!("listing {}: {e}", dir.display()))?
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .filter(|n| n.starts_with(&prefix))
            .collect();
        names.sort();
        let mut rotated = Vec::new();
        for n in &names {
            let stamp = n[prefix.len()..].trim_end_matches(COMPRESS_SUFFIX);
            let unused = n.ends_with(TMP_SUFFIX)
                || (!n.ends_with(COMPRESS_SUFFIX)
                    && names
                        .iter()
                        .any(|o| o.strip_suffix(COMPRESS_SUFFIX) == Some(n)));
            if unused {
                remove(&dir.join(n))?;
            } else if super::parse_rotation_time(stamp).is_some() {
                rotated.push(dir.join(n));
            }
        }
        Ok(rotated)
    }
}

fn remove(p: &Path) -> Result<(), String> {
    match std::fs::remove_file(p) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(format!("removing {}: {e}", p.display())),
    }
}

/// Gzips `path` to `<path>.gz` through `<path>.tmp`, then removes `path`.
///
/// The compressor's state (a few hundred KiB) is built on the stack before
/// it is boxed in an unoptimised build, which overflows the manager's small
/// stack: the work runs on a short-lived thread with room, whose touched
/// stack pages go back to the system when it ends, rather than on a
/// manager stack made large and resident for good.
fn compress(path: &Path) -> Result<(), String> {
    let owned = path.to_path_buf();
    crate::thread::spawn_with_stack("container-log-gzip", 4 << 20, move || compress_here(&owned))
        .map_err(|e| format!("compressing {}: starting a thread: {e}", path.display()))?
        .join()
        .map_err(|_| format!("compressing {}: the thread panicked", path.display()))?
}

fn compress_here(path: &Path) -> Result<(), String> {
    let with = |suffix: &str| {
        let mut s = path.as_os_str().to_owned();
        s.push(suffix);
        PathBuf::from(s)
    };
    let (tmp, gz) = (with(TMP_SUFFIX), with(COMPRESS_SUFFIX));
    let run = || -> io::Result<()> {
        let mut src = File::open(path)?;
        let out = File::create(&tmp)?;
        // The fastest level (upstream: gzip's default, 6). A container
        // writing 10 MB/s makes a 10 MiB file a second to compress; level 1
        // does that with less than half the CPU, and text logs still shrink
        // several times over.
        let mut enc =
            flate2::write::GzEncoder::new(io::BufWriter::new(out), flate2::Compression::fast());
        io::copy(&mut src, &mut enc)?;
        enc.finish()?
            .into_inner()
            .map_err(|e| e.into_error())?
            .sync_all()?;
        std::fs::rename(&tmp, &gz)?;
        std::fs::remove_file(path)
    };
    run().map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        format!("compressing {}: {e}", path.display())
    })?;
    debug!("compressed {}", path.display());
    Ok(())
}

/// The running `container-log-manager` thread; dropping it stops the thread.
pub(crate) struct LogRotationThread {
    _stop: crossbeam_channel::Sender<()>,
    _thread: crate::thread::JoinOnDrop<()>,
}

/// Starts the `container-log-manager` thread: a pass every 10 s.
pub(crate) fn start(
    runtime: Arc<dyn RuntimeService>,
    max_size: u64,
    max_files: usize,
    running: RunningContainers,
) -> io::Result<LogRotationThread> {
    let rotation = LogRotation::new(runtime, max_size, max_files).with_running(running);
    let (stop_tx, stop_rx) = crossbeam_channel::bounded::<()>(0);
    let thread = crate::thread::spawn_named("container-log-manager", move || loop {
        // A stop (or the handle dropped) ends the wait early.
        if !matches!(
            stop_rx.recv_timeout(PERIOD),
            Err(crossbeam_channel::RecvTimeoutError::Timeout)
        ) {
            break;
        }
        if let Err(e) = rotation.rotate_logs(SystemTime::now()) {
            warn!("container log rotation: {e}");
        }
    })?;
    Ok(LogRotationThread {
        _stop: stop_tx,
        _thread: thread,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::fake::{FakeRuntime, TEST_IMAGE};
    use std::io::Read;

    fn setup(tag: &str) -> (Arc<FakeRuntime>, String, PathBuf) {
        let d = std::env::temp_dir().join(format!(
            "tinylet-rotate-{tag}-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        let fake = Arc::new(FakeRuntime::with_images(&[TEST_IMAGE]));
        let sb = api::PodSandboxConfig::new();
        let sid = fake.run_pod_sandbox(&sb, "").unwrap();
        let mut c = api::ContainerConfig::new();
        let mut image = api::ImageSpec::new();
        image.image = TEST_IMAGE.into();
        c.image = Some(image).into();
        let id = fake.create_container(&sid, &c, &sb).unwrap();
        fake.start_container(&id).unwrap();
        let log = d.join("0.log");
        fake.set_log_path(&id, &log);
        (fake, id, log)
    }

    fn at(s: &str) -> SystemTime {
        SystemTime::from(s.parse::<Timestamp>().unwrap())
    }

    fn names(log: &Path) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(log.parent().unwrap())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        v.sort();
        v
    }

    fn gunzip(p: &Path) -> String {
        let mut s = String::new();
        flate2::read::GzDecoder::new(File::open(p).unwrap())
            .read_to_string(&mut s)
            .unwrap();
        s
    }

    /// Given the running containers, a pass asks the runtime nothing but
    /// each new container's log path, once.
    #[test]
    fn passes_over_the_relisted_containers_read_each_log_path_once() {
        let (fake, id, log) = setup("paths");
        let ids = Arc::new(Mutex::new(vec![id.clone()]));
        let seen = ids.clone();
        let rot = LogRotation::new(fake.clone(), 100, 5)
            .with_running(Box::new(move || seen.lock().clone()));
        std::fs::write(&log, "small").unwrap();
        fake.clear_calls();
        for _ in 0..3 {
            rot.rotate_logs(at("2021-01-02T03:04:05Z")).unwrap();
        }
        assert_eq!(fake.count("ListContainers"), 0, "{:?}", fake.calls());
        assert_eq!(fake.count("ContainerStatus"), 1, "{:?}", fake.calls());
        std::fs::write(&log, "x".repeat(100)).unwrap();
        rot.rotate_logs(at("2021-01-02T03:04:05Z")).unwrap();
        assert_eq!(names(&log), ["0.log", "0.log.20210102-030405"]);
        // Gone from the relist: forgotten, and read again if it comes back.
        ids.lock().clear();
        rot.rotate_logs(at("2021-01-02T03:05:05Z")).unwrap();
        assert!(rot.paths.lock().is_empty());
        ids.lock().push(id);
        rot.rotate_logs(at("2021-01-02T03:05:05Z")).unwrap();
        assert_eq!(fake.count("ContainerStatus"), 2, "{:?}", fake.calls());
    }

    /// While the runtime is down a pass stops at its first unanswered
    /// call: containers not yet read are asked again at the next pass, one
    /// call each pass, not one per container.
    #[test]
    fn a_pass_stops_at_a_runtime_that_is_down() {
        let (fake, id, log) = setup("down");
        std::fs::write(&log, "small").unwrap();
        let ids = vec![id.clone(), "gone-1".to_string(), "gone-2".to_string()];
        let rot =
            LogRotation::new(fake.clone(), 100, 5).with_running(Box::new(move || ids.clone()));
        fake.unreachable_next("ContainerStatus", 3);
        fake.clear_calls();
        for _ in 0..3 {
            rot.rotate_logs(at("2021-01-02T03:04:05Z")).unwrap();
        }
        assert_eq!(fake.count("ContainerStatus"), 3, "{:?}", fake.calls());
        assert!(rot.failed.lock().runtime_down);
        // Back: every container is read, the unknown ones fail on their own.
        rot.rotate_logs(at("2021-01-02T03:04:05Z")).unwrap();
        assert_eq!(fake.count("ContainerStatus"), 6, "{:?}", fake.calls());
        let failed = rot.failed.lock();
        assert!(!failed.runtime_down);
        let mut failing: Vec<&String> = failed.by_container.keys().collect();
        failing.sort();
        assert_eq!(failing, ["gone-1", "gone-2"]);
    }

    #[test]
    fn a_big_log_is_renamed_reopened_and_older_ones_compressed() {
        let (fake, _id, log) = setup("big");
        let rot = LogRotation::new(fake.clone(), 100, 5);
        std::fs::write(&log, "small").unwrap();
        rot.rotate_logs(at("2021-01-02T03:04:05Z")).unwrap();
        assert_eq!(names(&log), ["0.log"]);
        assert_eq!(fake.count("ReopenContainerLog"), 0);
        std::fs::write(&log, "x".repeat(100)).unwrap();
        rot.rotate_logs(at("2021-01-02T03:04:05Z")).unwrap();
        assert_eq!(names(&log), ["0.log", "0.log.20210102-030405"]);
        assert_eq!(fake.count("ReopenContainerLog"), 1);
        assert_eq!(std::fs::read_to_string(&log).unwrap(), "");
        std::fs::write(&log, "y".repeat(200)).unwrap();
        // On a thread with the manager's stack: compressing must fit.
        let rot = Arc::new(rot);
        let on_thread = rot.clone();
        crate::thread::spawn_named("rotate-test", move || {
            on_thread.rotate_logs(at("2021-01-02T03:05:00Z"))
        })
        .unwrap()
        .join()
        .unwrap()
        .unwrap();
        assert_eq!(
            names(&log),
            ["0.log", "0.log.20210102-030405.gz", "0.log.20210102-030500"]
        );
        assert_eq!(
            gunzip(&log.with_file_name("0.log.20210102-030405.gz")),
            "x".repeat(100)
        );
        // What reading sees: the rotated files, then the live one.
        let files = super::super::log_files(&log).unwrap();
        assert_eq!(files.len(), 3);
        assert!(files[0].gzip && !files[1].gzip && files[2].rotated_at.is_none());
    }

    #[test]
    fn at_most_max_files_stay_and_leftovers_are_cleaned() {
        let (fake, _id, log) = setup("max");
        let dir = log.parent().unwrap().to_path_buf();
        for n in [
            "0.log.20210101-000001.gz",
            "0.log.20210101-000002.gz",
            "0.log.20210101-000003",
            // Compressed, but the plain one was not removed yet.
            "0.log.20210101-000004",
            "0.log.20210101-000004.gz",
            "0.log.20210101-000005.tmp",
            "1.log",
        ] {
            std::fs::write(dir.join(n), "old").unwrap();
        }
        std::fs::write(&log, "z".repeat(10)).unwrap();
        LogRotation::new(fake.clone(), 10, 3)
            .rotate_logs(at("2021-01-02T00:00:00Z"))
            .unwrap();
        assert_eq!(
            names(&log),
            [
                "0.log",
                "0.log.20210101-000004.gz",
                "0.log.20210102-000000",
                "1.log"
            ]
        );
    }

    #[test]
    fn a_failed_reopen_renames_the_log_back() {
        let (fake, id, log) = setup("reopen");
        std::fs::write(&log, "x".repeat(50)).unwrap();
        fake.fail_next("ReopenContainerLog", 1);
        let rot = LogRotation::new(fake.clone(), 10, 5);
        rot.rotate_logs(at("2021-01-02T00:00:00Z")).unwrap();
        assert_eq!(names(&log), ["0.log"]);
        assert_eq!(std::fs::read_to_string(&log).unwrap(), "x".repeat(50));
        // Next time it works; an exited container is left alone.
        rot.rotate_logs(at("2021-01-02T00:00:10Z")).unwrap();
        assert_eq!(names(&log), ["0.log", "0.log.20210102-000010"]);
        std::fs::write(&log, "x".repeat(50)).unwrap();
        fake.exit_container(&id, 0);
        rot.rotate_logs(at("2021-01-02T00:00:20Z")).unwrap();
        assert_eq!(names(&log), ["0.log", "0.log.20210102-000010"]);
    }
}
