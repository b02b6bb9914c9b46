//! Streaming a container's log files as plain text: the CRI record parser
//! (a state machine fed with whatever a read returned, so no record is ever
//! held whole), the start position of a `tailLines` request (found by
//! reading backwards in blocks), and `follow` across rotations.

use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::FileExt;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::time::{Duration, Instant};

use k8s_openapi::jiff::Timestamp;
use log::warn;

use super::{LogFile, LogOptions};
use crate::cri::{api, RuntimeService};

/// The longest record head (`<time> <stream> <tag> `) taken; a line whose
/// head is longer is not a CRI record.
const MAX_HEADER: usize = 128;
/// Bytes read at a time, and the size of a write batch.
const BLOCK: usize = 32 * 1024;
/// How often `follow` asks the runtime whether the container still runs
/// while no data comes.
const STATE_CHECK: Duration = Duration::from_secs(1);
/// The longest sleep of `follow` between looks at an idle file.
const MAX_IDLE_SLEEP: Duration = Duration::from_millis(500);

/// Where reading starts in the first file read.
#[derive(Debug, Clone, Copy, PartialEq)]
enum StartAt {
    Offset(u64),
    /// Skip this many full (`F`) records first (compressed files, which
    /// cannot be read backwards).
    SkipLines(u64),
}

/// A container's log, ready to be copied out (see `super::open`).
pub struct LogStream<'a> {
    runtime: Option<&'a dyn RuntimeService>,
    container_id: String,
    files: Vec<LogFile>,
    first: usize,
    start: StartAt,
    follow: bool,
    limit: Option<u64>,
    parser: Parser,
}

impl<'a> LogStream<'a> {
    /// A stream over `files` (rotated ones oldest first, then the live
    /// one). With `follow`, the runtime is asked about `container_id` to
    /// know when to stop.
    pub(crate) fn new(
        runtime: Option<&'a dyn RuntimeService>,
        container_id: String,
        files: Vec<LogFile>,
        opts: &LogOptions,
        follow: bool,
    ) -> io::Result<Self> {
        let (first, start) = start_position(&files, opts)?;
        Ok(LogStream {
            runtime,
            container_id,
            files,
            first,
            start,
            follow,
            limit: opts
                .limit_bytes
                .map(|n| u64::try_from(n).unwrap_or(0).max(1)),
            parser: Parser::new(
                opts.since
                    .map(|s| Timestamp::try_from(s).unwrap_or(Timestamp::MIN)),
                opts.timestamps,
            ),
        })
    }

    /// Writes the log to `out` (plain text, as upstream's response body); in
    /// follow mode keeps going as the file grows and across a rotation, and
    /// returns once the container has exited and everything is written, or
    /// `out` fails. Flushes `out` after each batch.
    pub fn copy_to(&mut self, out: &mut dyn Write) -> io::Result<()> {
        let mut o = Out {
            w: out,
            batch: Vec::with_capacity(BLOCK),
            remain: self.limit,
        };
        let mut buf = vec![0u8; BLOCK];
        let last = self.files.len().saturating_sub(1);
        for i in self.first..self.files.len() {
            let f = self.files[i].clone();
            let start = if i == self.first {
                self.start
            } else {
                StartAt::Offset(0)
            };
            if let StartAt::SkipLines(n) = start {
                self.parser.skip_full = n;
            }
            if f.gzip {
                let file = match File::open(&f.path) {
                    Ok(file) => file,
                    // Removed by rotation since it was listed.
                    Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                    Err(e) => return Err(e),
                };
                let mut r = flate2::read::MultiGzDecoder::new(io::BufReader::new(file));
                self.pump(&mut r, &mut buf, &mut o, &f.path)?;
            } else {
                let mut file = match File::open(&f.path) {
                    Ok(file) => file,
                    Err(e) if e.kind() == io::ErrorKind::NotFound && i == last && self.follow => {
                        // The live file is being rotated: wait for the new one.
                        match self.wait_for_file(&f.path)? {
                            Some(file) => file,
                            None => break,
                        }
                    }
                    // Renamed or removed by a rotation since it was listed.
                    Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                    Err(e) => return Err(e),
                };
                if let StartAt::Offset(off) = start {
                    file.seek(SeekFrom::Start(off))?;
                }
                self.pump(&mut file, &mut buf, &mut o, &f.path)?;
                if i == last && self.follow && !o.done() {
                    self.follow_live(file, &f.path, &mut buf, &mut o)?;
                }
            }
            if o.done() {
                break;
            }
            self.parser.end_file();
        }
        self.parser.report_garbage();
        o.flush()
    }

    /// Reads `r` to its end through the parser.
    fn pump(
        &mut self,
        r: &mut dyn Read,
        buf: &mut [u8],
        o: &mut Out,
        path: &Path,
    ) -> io::Result<()> {
        loop {
            let n = match r.read(buf) {
                Ok(0) => return Ok(()),
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            self.parser.feed(&buf[..n], o, path)?;
            if o.done() {
                return Ok(());
            }
        }
    }

    /// Follows the live file at `path` (open as `file`, read to its end)
    /// until the container has exited and the log is drained.
    fn follow_live(
        &mut self,
        mut file: File,
        path: &Path,
        buf: &mut [u8],
        o: &mut Out,
    ) -> io::Result<()> {
        let mut pos = file.stream_position()?;
        let mut sleep = Duration::from_millis(20);
        let mut last_check = Instant::now();
        loop {
            let n = match file.read(buf) {
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            if n > 0 {
                pos += n as u64;
                self.parser.feed(&buf[..n], o, path)?;
                if o.done() {
                    return Ok(());
                }
                o.flush()?;
                sleep = Duration::from_millis(20);
                continue;
            }
            o.flush()?;
            match renewed(&file, path, pos)? {
                Renewed::No => {}
                Renewed::Truncated => {
                    file.seek(SeekFrom::Start(0))?;
                    pos = 0;
                    self.parser.end_file();
                    continue;
                }
                Renewed::New(new) => {
                    // What the runtime wrote to the old file before it
                    // reopened the log, then the new file.
                    self.pump(&mut file, buf, o, path)?;
                    self.parser.end_file();
                    file = new;
                    pos = 0;
                    continue;
                }
            }
            if last_check.elapsed() >= STATE_CHECK {
                last_check = Instant::now();
                if self.exited()? {
                    self.pump(&mut file, buf, o, path)?;
                    if let Renewed::New(mut new) = renewed(&file, path, u64::MAX)? {
                        self.parser.end_file();
                        self.pump(&mut new, buf, o, path)?;
                    }
                    return Ok(());
                }
            }
            std::thread::sleep(sleep);
            sleep = (sleep * 2).min(MAX_IDLE_SLEEP);
        }
    }

    /// Waits for a live file that is missing (between a rotation's rename
    /// and the runtime's reopen); `None` when the container ended first.
    fn wait_for_file(&self, path: &Path) -> io::Result<Option<File>> {
        loop {
            match File::open(path) {
                Ok(f) => return Ok(Some(f)),
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
            if self.exited()? {
                return Ok(None);
            }
            std::thread::sleep(STATE_CHECK);
        }
    }

    /// Whether the container has exited (or is gone) by the runtime. A
    /// runtime that cannot say ends the follow with that error, as
    /// upstream's does, rather than follow on blind.
    fn exited(&self) -> io::Result<bool> {
        let Some(rt) = self.runtime else {
            return Ok(true);
        };
        match rt.container_status(&self.container_id) {
            Ok(st) => Ok(st.state.enum_value_or_default() == api::ContainerState::CONTAINER_EXITED),
            Err(e) if e.is_not_found() => Ok(true),
            Err(e) => Err(io::Error::other(format!(
                "following the log of container {}: {e}",
                self.container_id
            ))),
        }
    }
}

enum Renewed {
    No,
    /// Same file, now shorter than what was read: start over.
    Truncated,
    /// Another file is at the path now (the old one was renamed away).
    New(File),
}

/// Whether the file at `path` is still `file`, read up to `pos`.
fn renewed(file: &File, path: &Path, pos: u64) -> io::Result<Renewed> {
    let now = match std::fs::metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Renewed::No),
        Err(e) => return Err(e),
    };
    let had = file.metadata()?;
    if now.ino() != had.ino() || now.dev() != had.dev() {
        return match File::open(path) {
            Ok(f) => Ok(Renewed::New(f)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Renewed::No),
            Err(e) => Err(e),
        };
    }
    if pos != u64::MAX && now.len() < pos {
        return Ok(Renewed::Truncated);
    }
    Ok(Renewed::No)
}

/// The file and position where a request starts reading.
fn start_position(files: &[LogFile], opts: &LogOptions) -> io::Result<(usize, StartAt)> {
    let last = files.len().saturating_sub(1);
    if let Some(n) = opts.tail_lines {
        let mut need = u64::try_from(n).unwrap_or(0);
        if need == 0 {
            let len = files.get(last).map_or(Ok(0), |f| file_len(&f.path))?;
            return Ok((last, StartAt::Offset(len)));
        }
        for (i, f) in files.iter().enumerate().rev() {
            let file = match File::open(&f.path) {
                Ok(file) => file,
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => return Err(e),
            };
            if f.gzip {
                let total = count_full_records(flate2::read::MultiGzDecoder::new(
                    io::BufReader::new(file),
                ))?;
                if total >= need {
                    return Ok((i, StartAt::SkipLines(total - need)));
                }
                need -= total;
            } else {
                let (offset, found) = tail_start(&file, need)?;
                if found >= need {
                    return Ok((i, StartAt::Offset(offset)));
                }
                need -= found;
            }
        }
        return Ok((0, StartAt::Offset(0)));
    }
    if let Some(since) = opts.since {
        // A rotated file holds only lines from before its rotation time
        // (whole seconds): skip those rotated before `since`.
        let first = files
            .iter()
            .position(|f| {
                f.rotated_at
                    .is_none_or(|t| t + Duration::from_secs(1) > since)
            })
            .unwrap_or(last);
        return Ok((first, StartAt::Offset(0)));
    }
    Ok((last, StartAt::Offset(0)))
}

fn file_len(path: &Path) -> io::Result<u64> {
    match std::fs::metadata(path) {
        Ok(m) => Ok(m.len()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(0),
        Err(e) => Err(e),
    }
}

/// Reading backwards in blocks: the offset where the last `need` full
/// lines of `file` start, and how many were found (fewer than `need` when
/// the file has fewer; the offset is then 0). A record still being written
/// (no newline yet) at the end is not counted but is read.
pub(crate) fn tail_start(file: &File, need: u64) -> io::Result<(u64, u64)> {
    let len = file.metadata()?.len();
    let mut buf = vec![0u8; BLOCK];
    let mut head = [0u8; MAX_HEADER];
    let mut found = 0u64;
    // The newline that ends the record starting after the newline at hand.
    let mut record_end: Option<u64> = None;
    let mut hi = len;
    // Is the record [start, end) a full line? Its head is read at `start`.
    let mut full_at = |start: u64| -> io::Result<bool> {
        let n = read_at_most(file, &mut head, start)?;
        Ok(header_len(&head[..n])
            .and_then(|h| parse_header(&head[..h]).ok())
            .is_some_and(|h| !h.partial))
    };
    while hi > 0 {
        let lo = hi.saturating_sub(BLOCK as u64);
        let block = &mut buf[..(hi - lo) as usize];
        file.read_exact_at(block, lo)?;
        for i in (0..block.len()).rev() {
            if block[i] != b'\n' {
                continue;
            }
            let nl = lo + i as u64;
            if let Some(end) = record_end {
                if full_at(nl + 1)? {
                    found += 1;
                    if found > need {
                        return Ok((end + 1, need));
                    }
                }
            }
            record_end = Some(nl);
        }
        hi = lo;
    }
    if let Some(end) = record_end {
        if full_at(0)? {
            found += 1;
            if found > need {
                return Ok((end + 1, need));
            }
        }
    }
    Ok((0, found))
}

fn read_at_most(file: &File, buf: &mut [u8], at: u64) -> io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match file.read_at(&mut buf[n..], at + n as u64) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

/// The number of full (`F`) records in `r`, read forwards.
fn count_full_records(mut r: impl Read) -> io::Result<u64> {
    let mut buf = vec![0u8; BLOCK];
    let mut head: Vec<u8> = Vec::with_capacity(MAX_HEADER);
    let mut at_start = true;
    let mut count = 0;
    loop {
        let n = match r.read(&mut buf) {
            Ok(0) => return Ok(count),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        for &b in &buf[..n] {
            if b == b'\n' {
                let full = header_len(&head)
                    .and_then(|h| parse_header(&head[..h]).ok())
                    .is_some_and(|h| !h.partial);
                count += u64::from(full);
                head.clear();
                at_start = true;
            } else if at_start {
                head.push(b);
                if head.len() >= MAX_HEADER {
                    at_start = false;
                }
            }
        }
    }
}

/// The length of the record head at the start of `b` (up to and with the
/// third space), if it ends before any newline.
fn header_len(b: &[u8]) -> Option<usize> {
    let mut spaces = 0;
    for (i, &c) in b.iter().enumerate() {
        match c {
            b'\n' => return None,
            b' ' => {
                spaces += 1;
                if spaces == 3 {
                    return Some(i + 1);
                }
            }
            _ => {}
        }
    }
    None
}

struct Header {
    time: Timestamp,
    partial: bool,
}

/// Parses a record head `<time> <stream> <tag> ` (with its final space).
fn parse_header(h: &[u8]) -> Result<Header, &'static str> {
    let h = h.strip_suffix(b" ").unwrap_or(h);
    let mut fields = h.splitn(3, |c| *c == b' ');
    let (Some(time), Some(stream), Some(tag)) = (fields.next(), fields.next(), fields.next())
    else {
        return Err("fewer than four fields");
    };
    if stream != b"stdout" && stream != b"stderr" {
        return Err("the stream is neither stdout nor stderr");
    }
    let time = std::str::from_utf8(time)
        .ok()
        .filter(|t| t.len() >= 20 && t.is_ascii())
        .and_then(|t| t.parse::<Timestamp>().ok())
        .ok_or("the time is not RFC 3339")?;
    // Tags are `:`-separated; the first says partial or full.
    let partial = tag.split(|c| *c == b':').next() == Some(b"P");
    Ok(Header { time, partial })
}

/// `time` (RFC 3339 as the runtime wrote it) with exactly nine fraction
/// digits, as upstream prints timestamps (its `RFC3339NanoFixed`).
fn fixed_nanos(time: &[u8], out: &mut Vec<u8>) {
    let (base, rest) = time.split_at(19.min(time.len()));
    out.extend_from_slice(base);
    let (digits, zone) = match rest.strip_prefix(b".") {
        Some(r) => {
            let d = r.iter().take_while(|c| c.is_ascii_digit()).count();
            r.split_at(d)
        }
        None => (&rest[..0], rest),
    };
    out.push(b'.');
    out.extend_from_slice(&digits[..digits.len().min(9)]);
    out.extend(std::iter::repeat_n(
        b'0',
        9usize.saturating_sub(digits.len()),
    ));
    if zone == b"+00:00" || zone == b"-00:00" || zone == b"z" {
        out.push(b'Z');
    } else {
        out.extend_from_slice(zone);
    }
}

/// The response body being written: batches, the byte limit.
struct Out<'w> {
    w: &'w mut dyn Write,
    batch: Vec<u8>,
    remain: Option<u64>,
}

impl Out<'_> {
    fn done(&self) -> bool {
        self.remain == Some(0)
    }

    fn put(&mut self, b: &[u8]) -> io::Result<()> {
        let take = match self.remain {
            Some(r) => b.len().min(usize::try_from(r).unwrap_or(usize::MAX)),
            None => b.len(),
        };
        self.batch.extend_from_slice(&b[..take]);
        if let Some(r) = &mut self.remain {
            *r -= take as u64;
        }
        if self.batch.len() >= BLOCK {
            self.flush()?;
        }
        Ok(())
    }

    fn flush(&mut self) -> io::Result<()> {
        if !self.batch.is_empty() {
            self.w.write_all(&self.batch)?;
            self.batch.clear();
        }
        // Even with nothing to write: the writer may tell that its reader
        // has gone, which ends a follow of a quiet log.
        self.w.flush()
    }
}

#[derive(Debug, Clone, Copy)]
enum State {
    /// Gathering a record's head.
    Header,
    /// Passing a record's content through (or dropping it).
    Content {
        emit: bool,
        partial: bool,
        skipped_by_count: bool,
    },
    /// Dropping the rest of a line that is not a CRI record.
    Garbage,
}

/// The CRI record parser. Only a record's head (at most `MAX_HEADER`
/// bytes) is ever buffered.
struct Parser {
    state: State,
    head: Vec<u8>,
    spaces: u8,
    /// The next record starts a line (the last one was full).
    at_line_start: bool,
    since: Option<Timestamp>,
    timestamps: bool,
    /// Full records still to skip (a tail in a compressed file).
    skip_full: u64,
    garbage: u64,
    garbage_path: String,
}

impl Parser {
    fn new(since: Option<Timestamp>, timestamps: bool) -> Self {
        Parser {
            state: State::Header,
            head: Vec::with_capacity(MAX_HEADER),
            spaces: 0,
            at_line_start: true,
            since,
            timestamps,
            skip_full: 0,
            garbage: 0,
            garbage_path: String::new(),
        }
    }

    /// Forgets a record cut by the end of a file.
    fn end_file(&mut self) {
        self.state = State::Header;
        self.head.clear();
        self.spaces = 0;
    }

    fn bad(&mut self, path: &Path, why: &str) {
        self.garbage += 1;
        if self.garbage == 1 {
            self.garbage_path = path.display().to_string();
            warn!(
                "container log {}: skipped a line that is not in the CRI log format ({why})",
                path.display()
            );
        }
    }

    fn report_garbage(&mut self) {
        if self.garbage > 1 {
            warn!(
                "container log {}: skipped {} lines in all that are not in the CRI log format",
                self.garbage_path, self.garbage
            );
        }
        self.garbage = 0;
    }

    fn feed(&mut self, mut data: &[u8], out: &mut Out, path: &Path) -> io::Result<()> {
        while !data.is_empty() && !out.done() {
            match self.state {
                State::Header => {
                    let mut used = data.len();
                    for (i, &b) in data.iter().enumerate() {
                        if b == b'\n' {
                            self.bad(path, "a line without a tag");
                            self.end_file();
                            used = i + 1;
                            break;
                        }
                        self.head.push(b);
                        if b == b' ' {
                            self.spaces += 1;
                            if self.spaces == 3 {
                                used = i + 1;
                                self.begin_record(out, path)?;
                                break;
                            }
                        }
                        if self.head.len() >= MAX_HEADER {
                            self.bad(path, "no record head in its first bytes");
                            self.end_file();
                            self.state = State::Garbage;
                            used = i + 1;
                            break;
                        }
                    }
                    data = &data[used..];
                }
                State::Content {
                    emit,
                    partial,
                    skipped_by_count,
                } => match data.iter().position(|c| *c == b'\n') {
                    Some(k) => {
                        if emit {
                            out.put(&data[..k])?;
                            if !partial {
                                out.put(b"\n")?;
                            }
                        }
                        if skipped_by_count && !partial {
                            self.skip_full = self.skip_full.saturating_sub(1);
                        }
                        self.at_line_start = !partial;
                        self.state = State::Header;
                        data = &data[k + 1..];
                    }
                    None => {
                        if emit {
                            out.put(data)?;
                        }
                        data = &[];
                    }
                },
                State::Garbage => match data.iter().position(|c| *c == b'\n') {
                    Some(k) => {
                        self.state = State::Header;
                        data = &data[k + 1..];
                    }
                    None => data = &[],
                },
            }
        }
        Ok(())
    }

    /// The head is complete in `self.head`: decide what to do with the
    /// record's content.
    fn begin_record(&mut self, out: &mut Out, path: &Path) -> io::Result<()> {
        let head = std::mem::take(&mut self.head);
        self.spaces = 0;
        let parsed = parse_header(&head);
        let result = match parsed {
            Err(why) => {
                self.bad(path, why);
                self.state = State::Garbage;
                Ok(())
            }
            Ok(h) => {
                let skipped_by_count = self.skip_full > 0;
                let emit = !skipped_by_count && self.since.is_none_or(|s| h.time >= s);
                if emit && self.timestamps && self.at_line_start {
                    let mut prefix = Vec::with_capacity(40);
                    let time_len = head.iter().position(|c| *c == b' ').unwrap_or(0);
                    fixed_nanos(&head[..time_len], &mut prefix);
                    prefix.push(b' ');
                    out.put(&prefix)?;
                }
                self.state = State::Content {
                    emit,
                    partial: h.partial,
                    skipped_by_count,
                };
                Ok(())
            }
        };
        self.head = head;
        self.head.clear();
        result
    }
}

/// Converts a runtime log time for comparisons in tests.
#[cfg(test)]
pub(crate) fn since_of(s: &str) -> std::time::SystemTime {
    s.parse::<Timestamp>()
        .map(std::time::SystemTime::from)
        .unwrap_or(std::time::SystemTime::UNIX_EPOCH)
}
