//! Container logs: reading them for the node API's `/containerLogs` and
//! rotating them (`rotate`).
//!
//! The runtime writes each container's output in the CRI log format, one
//! record a line: `<RFC3339Nano time> <stdout|stderr> <P|F> <content>`. A
//! `P` (partial) record is continued by the next ones up to an `F`. This
//! module finds a container's log by the CRI labels (`open`), picks where
//! to start (`tailLines` counted backwards, `sinceTime`), and streams the
//! records as plain text (`LogStream::copy_to`) with bounded memory: a
//! record's content is passed through as it is read, never gathered whole.
//! Rotated files (`<log>.<time>`, older ones `<log>.<time>.gz`) are read
//! before the live one when a tail or a since time reaches back into them.

pub(crate) mod rotate;
mod stream;

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use k8s_openapi::jiff::Timestamp;

use crate::cri::{api, RuntimeService};
use crate::runtime::labels;

pub(crate) use stream::LogStream;

/// What a `/containerLogs` request asks for (upstream's `PodLogOptions`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LogOptions {
    pub follow: bool,
    pub tail_lines: Option<i64>,
    pub limit_bytes: Option<i64>,
    pub timestamps: bool,
    pub previous: bool,
    /// From `sinceSeconds` (counted back from now) or `sinceTime`.
    pub since: Option<SystemTime>,
}

impl LogOptions {
    /// Decodes the query parameters as the apiserver sends them (`follow`,
    /// `tailLines`, `limitBytes`, `timestamps`, `previous`, `sinceSeconds`,
    /// `sinceTime`); others are ignored. A bad value, or both since
    /// parameters, is an error naming the parameter.
    pub(crate) fn from_query(
        pairs: impl Iterator<Item = (String, String)>,
    ) -> Result<LogOptions, String> {
        let mut o = LogOptions::default();
        let mut since_seconds = None;
        let mut since_time = None;
        for (k, v) in pairs {
            match k.as_str() {
                "follow" => o.follow = query_bool(&v),
                "timestamps" => o.timestamps = query_bool(&v),
                "previous" => o.previous = query_bool(&v),
                "tailLines" => {
                    let n = query_int(&k, &v)?;
                    if n < 0 {
                        return Err(format!(
                            "tailLines: must be greater than or equal to 0, got {n}"
                        ));
                    }
                    o.tail_lines = Some(n);
                }
                "limitBytes" => {
                    let n = query_int(&k, &v)?;
                    if n < 1 {
                        return Err(format!("limitBytes: must be greater than 0, got {n}"));
                    }
                    o.limit_bytes = Some(n);
                }
                "sinceSeconds" => {
                    let n = query_int(&k, &v)?;
                    if n < 1 {
                        return Err(format!("sinceSeconds: must be greater than 0, got {n}"));
                    }
                    since_seconds = Some(n);
                }
                "sinceTime" => {
                    let t: Timestamp = v.parse().map_err(|_| {
                        format!(
                            "sinceTime: {v:?} is not an RFC 3339 time (e.g. 2021-01-02T03:04:05Z)"
                        )
                    })?;
                    since_time = Some(SystemTime::from(t));
                }
                _ => {}
            }
        }
        o.since = match (since_seconds, since_time) {
            (Some(_), Some(_)) => {
                return Err("sinceSeconds, sinceTime: at most one of them may be specified".into())
            }
            (Some(s), None) => Some(
                SystemTime::now()
                    .checked_sub(Duration::from_secs(s.unsigned_abs()))
                    .unwrap_or(SystemTime::UNIX_EPOCH),
            ),
            (None, t) => t,
        };
        Ok(o)
    }
}

/// A boolean query parameter as the API's parameter codec reads it: only
/// `false` and `0` (any case) are false, anything else (even empty) true.
fn query_bool(v: &str) -> bool {
    !(v.eq_ignore_ascii_case("false") || v == "0")
}

fn query_int(name: &str, v: &str) -> Result<i64, String> {
    v.parse()
        .map_err(|_| format!("{name}: {v:?} is not an integer"))
}

/// Why a log cannot be served, by the HTTP status it maps to.
#[derive(Debug, Clone, PartialEq)]
pub enum LogError {
    /// 404: no such pod or container.
    NotFound(String),
    /// 400: the request cannot be served (no previous instance, not started).
    BadRequest(String),
    /// 500: the runtime failed, or the log file could not be read.
    Runtime(String),
}

impl std::fmt::Display for LogError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LogError::NotFound(m) | LogError::BadRequest(m) | LogError::Runtime(m) => {
                f.write_str(m)
            }
        }
    }
}

/// Finds the container `container` of pod `namespace/pod` in the runtime
/// (by its CRI labels; the newest instance, or the one before it with
/// `previous`) and opens its log as `opts` asks.
///
/// When the pod was recreated under a new UID, the UID with the newest
/// container is taken. Without the pod's spec here, a container the pod
/// declares but that never started is reported as not found (upstream
/// answers 400 "waiting to start" from the pod's status).
pub fn open<'a>(
    runtime: &'a dyn RuntimeService,
    namespace: &str,
    pod: &str,
    container: &str,
    opts: &LogOptions,
) -> Result<LogStream<'a>, LogError> {
    let runtime_err = |e: crate::cri::CriError| LogError::Runtime(e.to_string());
    let mut filter = api::ContainerFilter::new();
    filter
        .label_selector
        .insert(labels::POD_NAMESPACE.into(), namespace.into());
    filter
        .label_selector
        .insert(labels::POD_NAME.into(), pod.into());
    filter
        .label_selector
        .insert(labels::CONTAINER_NAME.into(), container.into());
    let mut found = runtime.list_containers(Some(filter)).map_err(runtime_err)?;
    if found.is_empty() {
        let mut sf = api::PodSandboxFilter::new();
        sf.label_selector
            .insert(labels::POD_NAMESPACE.into(), namespace.into());
        sf.label_selector
            .insert(labels::POD_NAME.into(), pod.into());
        let sandboxes = runtime.list_pod_sandbox(Some(sf)).map_err(runtime_err)?;
        return Err(if sandboxes.is_empty() {
            LogError::NotFound(format!("pod {pod:?} does not exist"))
        } else {
            LogError::NotFound(format!("container {container:?} not found in pod {pod:?}"))
        });
    }
    // The pod UID of the newest instance; older UIDs are pods gone by.
    let newest_uid = found
        .iter()
        .max_by_key(|c| c.created_at)
        .and_then(|c| c.labels.get(labels::POD_UID).cloned())
        .unwrap_or_default();
    found.retain(|c| c.labels.get(labels::POD_UID).cloned().unwrap_or_default() == newest_uid);
    found.sort_by_key(|c| (labels::parse_restart_count(&c.annotations), c.created_at));
    let chosen = if opts.previous {
        match found.len().checked_sub(2).and_then(|i| found.get(i)) {
            Some(c) => c,
            None => {
                return Err(LogError::BadRequest(format!(
                    "previous terminated container {container:?} in pod {pod:?} not found"
                )))
            }
        }
    } else {
        match found.last() {
            Some(c) => c,
            None => {
                return Err(LogError::NotFound(format!(
                    "container {container:?} not found in pod {pod:?}"
                )))
            }
        }
    };
    let status = runtime.container_status(&chosen.id).map_err(runtime_err)?;
    let state = status.state.enum_value_or_default();
    if state == api::ContainerState::CONTAINER_CREATED {
        return Err(LogError::BadRequest(format!(
            "container {container:?} in pod {pod:?} is waiting to start: ContainerCreating"
        )));
    }
    if status.log_path.is_empty() {
        return Err(LogError::BadRequest(format!(
            "container {container:?} in pod {pod:?} has no log file"
        )));
    }
    let follow = opts.follow && state == api::ContainerState::CONTAINER_RUNNING;
    let path = PathBuf::from(&status.log_path);
    if state == api::ContainerState::CONTAINER_EXITED {
        let finished = SystemTime::UNIX_EPOCH
            + Duration::from_nanos(u64::try_from(status.finished_at).unwrap_or(0));
        settle(&path, finished, SETTLE);
    }
    let files = log_files(&path).map_err(|e| {
        LogError::Runtime(format!("listing the log files of {}: {e}", path.display()))
    })?;
    LogStream::new(Some(runtime), chosen.id.clone(), files, opts, follow)
        .map_err(|e| LogError::Runtime(format!("reading {}: {e}", path.display())))
}

/// How long after a container's exit its log may still be being written,
/// and how long its size must stay put to count as written.
pub(crate) struct Settle {
    pub(crate) after_exit: Duration,
    pub(crate) quiet: Duration,
}

/// containerd reports a container exited once its output pipes are drained,
/// but writes what it drained to the log file on a goroutine of its own
/// that may still be at it (under load, for a second or more): a log read
/// right after the exit can miss the last lines, or all of them.
const SETTLE: Settle = Settle {
    after_exit: Duration::from_secs(1),
    quiet: Duration::from_millis(100),
};

/// Waits, for a container that exited less than `s.after_exit` ago, until
/// that much time has passed since its exit and the live log file's size
/// has not changed for `s.quiet`; at most twice `s.after_exit` in all. A
/// container that exited before that is read at once.
pub(crate) fn settle(live: &Path, finished: SystemTime, s: Settle) {
    let start = std::time::Instant::now();
    let since_exit = SystemTime::now()
        .duration_since(finished)
        .unwrap_or(Duration::ZERO);
    if since_exit >= s.after_exit {
        return;
    }
    std::thread::sleep(s.after_exit - since_exit);
    let size = || std::fs::metadata(live).map(|m| m.len()).ok();
    let mut last = size();
    while start.elapsed() < s.after_exit * 2 {
        std::thread::sleep(s.quiet);
        let now = size();
        if now == last {
            return;
        }
        last = now;
    }
}

/// One file of a container's log, oldest first.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct LogFile {
    pub(crate) path: PathBuf,
    pub(crate) gzip: bool,
    /// When it was rotated (from its name); `None` for the live file.
    pub(crate) rotated_at: Option<SystemTime>,
}

/// The rotation time in a rotated file's name suffix (`20260102-150405`).
pub(crate) fn parse_rotation_time(s: &str) -> Option<SystemTime> {
    let b = s.as_bytes();
    if b.len() != 15
        || b[8] != b'-'
        || !b
            .iter()
            .enumerate()
            .all(|(i, c)| i == 8 || c.is_ascii_digit())
    {
        return None;
    }
    let iso = format!(
        "{}-{}-{}T{}:{}:{}Z",
        &s[0..4],
        &s[4..6],
        &s[6..8],
        &s[9..11],
        &s[11..13],
        &s[13..15]
    );
    iso.parse::<Timestamp>().ok().map(SystemTime::from)
}

/// The rotated files of `live` (oldest first: by the time in their names),
/// then `live` itself. Temporary files of an unfinished compression are
/// left out.
pub(crate) fn log_files(live: &Path) -> std::io::Result<Vec<LogFile>> {
    let mut files = rotated_files(live)?;
    files.push(LogFile {
        path: live.to_path_buf(),
        gzip: false,
        rotated_at: None,
    });
    Ok(files)
}

/// The rotated files of `live`, oldest first.
pub(crate) fn rotated_files(live: &Path) -> std::io::Result<Vec<LogFile>> {
    let (Some(dir), Some(base)) = (live.parent(), live.file_name().and_then(|n| n.to_str())) else {
        return Ok(Vec::new());
    };
    let prefix = format!("{base}.");
    let mut out: Vec<(String, LogFile)> = Vec::new();
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    for entry in entries {
        let entry = entry?;
        let name = entry.file_name();
        let Some(rest) = name.to_str().and_then(|n| n.strip_prefix(&prefix)) else {
            continue;
        };
        let (stamp, gzip) = match rest.strip_suffix(".gz") {
            Some(s) => (s, true),
            None => (rest, false),
        };
        if let Some(t) = parse_rotation_time(stamp) {
            out.push((
                stamp.to_string(),
                LogFile {
                    path: entry.path(),
                    gzip,
                    rotated_at: Some(t),
                },
            ));
        }
    }
    // Same stamp compressed and not (a crash mid-compression): keep the
    // plain one, which is whole.
    out.sort_by(|a, b| a.0.cmp(&b.0).then(a.1.gzip.cmp(&b.1.gzip)));
    out.dedup_by(|later, earlier| later.0 == earlier.0);
    Ok(out.into_iter().map(|(_, f)| f).collect())
}

#[cfg(test)]
mod tests;
