//! Termination messages (upstream `getTerminationMessage` and
//! `readLastStringFromContainerLogs`): what an exited container wrote to
//! its terminationMessagePath, or with FallbackToLogsOnError after a
//! failure and no message, the tail of its log.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

use super::labels::{TERMINATION_MESSAGE_PATH, TERMINATION_MESSAGE_POLICY};
use crate::cri::api;

/// The most of a termination message file that is read (its end).
pub(crate) const MAX_MESSAGE_BYTES: u64 = 4096;
/// The most log lines, and bytes of them, a message from the logs takes.
pub(crate) const MAX_LOG_LINES: usize = 80;
pub(crate) const MAX_LOG_BYTES: usize = 2048;
/// How much of a log's end is read to find those lines.
const LOG_READ_BYTES: u64 = 256 * 1024;

/// The status message of a container: the runtime's, followed (after
/// ": ") by its termination message once it has exited.
pub(crate) fn status_message(st: &api::ContainerStatus) -> String {
    if st.state.enum_value() != Ok(api::ContainerState::CONTAINER_EXITED) {
        return st.message.clone();
    }
    let annotation = |k: &str| st.annotations.get(k).map(String::as_str).unwrap_or("");
    let fallback = annotation(TERMINATION_MESSAGE_POLICY) == "FallbackToLogsOnError"
        && st.exit_code != 0
        && st.reason != "ContainerCannotRun";
    let (mut text, check_logs) = file_message(st, annotation(TERMINATION_MESSAGE_PATH), fallback);
    if check_logs {
        text = log_message(Path::new(&st.log_path));
    }
    match (st.message.is_empty(), text.is_empty()) {
        (_, true) => st.message.clone(),
        (true, false) => text,
        (false, false) => format!("{}: {text}", st.message),
    }
}

/// The message file mounted at `path`, and whether the logs are to be read
/// instead (fallback wanted and no message written).
fn file_message(st: &api::ContainerStatus, path: &str, fallback: bool) -> (String, bool) {
    if path.is_empty() {
        return (String::new(), fallback);
    }
    let Some(mount) = st.mounts.iter().find(|m| m.container_path == path) else {
        return (String::new(), fallback);
    };
    match read_tail(Path::new(&mount.host_path), MAX_MESSAGE_BYTES) {
        Ok(data) => {
            let empty = data.is_empty();
            (
                String::from_utf8_lossy(&data).into_owned(),
                fallback && empty,
            )
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => (String::new(), fallback),
        Err(e) => (
            format!("Error on reading termination log {}: {e}", mount.host_path),
            false,
        ),
    }
}

/// The last `max` bytes of a file.
fn read_tail(path: &Path, max: u64) -> std::io::Result<Vec<u8>> {
    let mut f = File::open(path)?;
    let len = f.metadata()?.len();
    if len > max {
        f.seek(SeekFrom::Start(len - max))?;
    }
    let mut data = Vec::new();
    f.take(max).read_to_end(&mut data)?;
    Ok(data)
}

/// The tail of a container's CRI log: the content of its last
/// [`MAX_LOG_LINES`] lines, at most the last [`MAX_LOG_BYTES`] of it.
fn log_message(path: &Path) -> String {
    match read_tail(path, LOG_READ_BYTES) {
        Ok(data) => log_tail(&data),
        Err(e) => format!("Error on reading termination message from logs: {e}"),
    }
}

/// [`log_message`] over the bytes of a log's end: lines in the CRI format
/// `<time> <stream> <P|F> <content>`, a partial (`P`) line continued by the
/// next. The first line may be cut by the read and is skipped if so.
pub(crate) fn log_tail(data: &[u8]) -> String {
    let text = String::from_utf8_lossy(data);
    let mut lines: Vec<&str> = text.split('\n').collect();
    if lines.last() == Some(&"") {
        lines.pop();
    }
    if data.len() as u64 >= LOG_READ_BYTES && !lines.is_empty() {
        lines.remove(0);
    }
    let start = lines.len().saturating_sub(MAX_LOG_LINES);
    let mut out = String::new();
    for line in &lines[start..] {
        let mut parts = line.splitn(4, ' ');
        let (_time, _stream, tag) = (parts.next(), parts.next(), parts.next());
        let content = parts.next().unwrap_or("");
        out.push_str(content);
        if tag != Some("P") {
            out.push('\n');
        }
    }
    if out.len() > MAX_LOG_BYTES {
        let mut cut = out.len() - MAX_LOG_BYTES;
        while !out.is_char_boundary(cut) {
            cut += 1;
        }
        out.drain(..cut);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use protobuf::EnumOrUnknown;

    fn exited(dir: &Path, code: i32, policy: &str) -> api::ContainerStatus {
        let mut st = api::ContainerStatus::new();
        st.state = EnumOrUnknown::new(api::ContainerState::CONTAINER_EXITED);
        st.exit_code = code;
        st.annotations.insert(
            TERMINATION_MESSAGE_PATH.into(),
            "/dev/termination-log".into(),
        );
        st.annotations
            .insert(TERMINATION_MESSAGE_POLICY.into(), policy.into());
        let mut m = api::Mount::new();
        m.container_path = "/dev/termination-log".into();
        m.host_path = dir.join("msg").to_string_lossy().into_owned();
        st.mounts.push(m);
        st.log_path = dir.join("0.log").to_string_lossy().into_owned();
        st
    }

    #[test]
    fn message_file_then_logs_on_error() {
        let dir = tempfile::tempdir().unwrap();
        let log = "2024-01-01T00:00:00.000000001Z stdout F first\n\
                   2024-01-01T00:00:00.000000002Z stderr P part\n\
                   2024-01-01T00:00:00.000000003Z stderr F ial\n";
        std::fs::write(dir.path().join("0.log"), log).unwrap();

        // No file written: File gives nothing, FallbackToLogsOnError the log.
        let st = exited(dir.path(), 1, "File");
        assert_eq!(status_message(&st), "");
        let st = exited(dir.path(), 1, "FallbackToLogsOnError");
        assert_eq!(status_message(&st), "first\npartial\n");
        // A success never falls back.
        let st = exited(dir.path(), 0, "FallbackToLogsOnError");
        assert_eq!(status_message(&st), "");

        // An empty file falls back; a written one wins, after the runtime's message.
        std::fs::write(dir.path().join("msg"), "").unwrap();
        assert_eq!(
            status_message(&exited(dir.path(), 2, "FallbackToLogsOnError")),
            "first\npartial\n"
        );
        std::fs::write(dir.path().join("msg"), "bye").unwrap();
        let mut st = exited(dir.path(), 2, "FallbackToLogsOnError");
        assert_eq!(status_message(&st), "bye");
        st.message = "oom".into();
        assert_eq!(status_message(&st), "oom: bye");
        // Not exited: the runtime's message only.
        st.state = EnumOrUnknown::new(api::ContainerState::CONTAINER_RUNNING);
        assert_eq!(status_message(&st), "oom");
    }

    #[test]
    fn caps_as_upstream() {
        let dir = tempfile::tempdir().unwrap();
        let big: String = (0..5000)
            .map(|i| char::from(b'a' + (i % 26) as u8))
            .collect();
        std::fs::write(dir.path().join("msg"), &big).unwrap();
        let got = status_message(&exited(dir.path(), 1, "File"));
        assert_eq!(got.len(), 4096);
        assert!(big.ends_with(&got));

        let lines: String = (0..100)
            .map(|i| format!("2024-01-01T00:00:00Z stdout F line {i}\n"))
            .collect();
        let tail = log_tail(lines.as_bytes());
        assert_eq!(tail.lines().count(), 80);
        assert!(
            tail.starts_with("line 20\n") && tail.ends_with("line 99\n"),
            "{tail}"
        );
        let long: String = (0..10)
            .map(|i| format!("2024-01-01T00:00:00Z stdout F {i}{}\n", "x".repeat(500)))
            .collect();
        let tail = log_tail(long.as_bytes());
        assert_eq!(tail.len(), 2048);
        assert!(tail.ends_with(&format!("9{}\n", "x".repeat(500))));
    }
}
