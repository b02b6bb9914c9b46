//! Watches: where a watch starts, events converted through its filter,
//! bookmarks, 410 for compacted resourceVersions, injected bytes, and the
//! streaming loop.

use super::*;

enum WatchStart {
    /// No resourceVersion: from etcd, synthetic ADDED, no bookmarks.
    Now,
    /// resourceVersion=0: from the cache, synthetic ADDED.
    Zero,
    From(u64),
}

pub(super) struct WatchPlan {
    res: Res,
    filter: Filter,
    start: WatchStart,
    bookmarks: bool,
    timeout: Duration,
}

pub(super) fn watch_plan(_st: &State, req: &Request, t: &Target) -> Result<WatchPlan, Status> {
    let ns = (!t.ns.is_empty()).then_some(t.ns.as_str());
    let filter = Filter::parse(
        t.res,
        ns,
        t.name.as_deref(),
        req.param("fieldSelector").unwrap_or(""),
        req.param("labelSelector").unwrap_or(""),
    )?;
    let rv = req.param("resourceVersion").unwrap_or("");
    let start = match rv {
        "" => WatchStart::Now,
        "0" => WatchStart::Zero,
        n => WatchStart::From(n.parse().map_err(|_| {
            bad_request(format!(
                "resourceVersion: Invalid value: {}: must be a number",
                q(n)
            ))
        })?),
    };
    let timeout = req
        .param("timeoutSeconds")
        .and_then(|s| s.parse::<u64>().ok())
        .map(Duration::from_secs)
        .unwrap_or(DEFAULT_WATCH_TIMEOUT);
    Ok(WatchPlan {
        res: t.res,
        filter,
        bookmarks: req.param("allowWatchBookmarks") == Some("true")
            && !matches!(start, WatchStart::Now),
        start,
        timeout,
    })
}

fn event_line(kind: &str, obj: &str) -> String {
    format!(r#"{{"type":"{kind}","object":{obj}}}"#) + "\n"
}

fn too_old_line(rv: u64, oldest: u64) -> String {
    let s = Status::new(
        410,
        "Expired",
        format!("too old resource version: {rv} ({oldest})"),
    );
    event_line("ERROR", &s.json())
}

/// The event a watcher with this filter sees for a write, if any.
fn convert(e: &Event, f: &Filter) -> Option<String> {
    let new_ok = f.matches(&e.obj);
    let old_ok = e.prev.as_ref().is_some_and(|p| f.matches(p));
    let (kind, obj) = match e.kind {
        EventType::Added if new_ok => ("ADDED", e.obj.clone()),
        EventType::Deleted if new_ok || old_ok => ("DELETED", e.obj.clone()),
        EventType::Modified => match (new_ok, old_ok) {
            (true, true) => ("MODIFIED", e.obj.clone()),
            (true, false) => ("ADDED", e.obj.clone()),
            (false, true) => {
                let mut prev = e.prev.clone().unwrap_or(Value::Null);
                obj_mut(&mut prev, "metadata")
                    .insert("resourceVersion".into(), json!(e.rv.to_string()));
                ("DELETED", prev)
            }
            (false, false) => return None,
        },
        _ => return None,
    };
    Some(event_line(kind, &encode(&obj)))
}

/// Counts a watch as open while it lives.
struct OpenWatch<'a> {
    shared: &'a Shared,
    res: Res,
}

impl<'a> OpenWatch<'a> {
    fn new(shared: &'a Shared, res: Res) -> OpenWatch<'a> {
        *shared.open_watches.lock().entry(res).or_insert(0) += 1;
        OpenWatch { shared, res }
    }
}

impl Drop for OpenWatch<'_> {
    fn drop(&mut self) {
        if let Some(n) = self.shared.open_watches.lock().get_mut(&self.res) {
            *n = n.saturating_sub(1);
        }
    }
}

/// Injected bytes for `res` numbered above `after`, and the last number seen.
pub(super) fn injections(shared: &Shared, res: Res, after: u64) -> (Vec<Arc<Vec<u8>>>, u64) {
    let list = shared.injected.lock();
    let last = list.last().map_or(after, |(id, _, _)| (*id).max(after));
    let raw = list
        .iter()
        .filter(|(id, r, _)| *id > after && *r == res)
        .map(|(_, _, b)| b.clone())
        .collect();
    (raw, last)
}

/// Where a watch streams: an HTTP/1.1 chunked body (`Conn`) or an HTTP/2
/// stream (`super::h2`).
pub(super) trait WatchOut {
    /// The answer's head: 200, JSON, no length.
    fn head(&mut self) -> io::Result<()>;
    /// A piece of the body, sent now.
    fn data(&mut self, bytes: &[u8]) -> io::Result<()>;
    /// The end of the body (the terminating chunk, or END_STREAM).
    fn end(&mut self) -> io::Result<()>;
    /// The connection, to cut or to hold silent.
    fn tcp(&self) -> &TcpStream;
}

impl WatchOut for Conn {
    fn head(&mut self) -> io::Result<()> {
        let head = format!(
            "HTTP/1.1 200 OK\r\nCache-Control: no-cache, private\r\nContent-Type: application/json\r\nDate: {}\r\nTransfer-Encoding: chunked\r\n\r\n",
            http_date()
        );
        self.write_all(head.as_bytes())?;
        self.flush()
    }
    fn data(&mut self, bytes: &[u8]) -> io::Result<()> {
        write_chunk(self, bytes)
    }
    fn end(&mut self) -> io::Result<()> {
        self.write_all(b"0\r\n\r\n")?;
        self.flush()
    }
    fn tcp(&self) -> &TcpStream {
        Conn::tcp(self)
    }
}

/// Streams a watch; false when the connection must close.
pub(super) fn run_watch<W: WatchOut>(shared: &Arc<Shared>, out: &mut W, plan: WatchPlan) -> bool {
    let _open = OpenWatch::new(shared, plan.res);
    // Only bytes injected from now on are for this watch.
    let mut injected_seen = {
        let _guard = shared.state.lock();
        shared.next_injection.load(Ordering::SeqCst) - 1
    };
    if out.head().is_err() {
        return false;
    }
    let gen = shared.watch_gen.load(Ordering::SeqCst);
    let st = shared.state.lock();
    let mut initial = Vec::new();
    let (mut pos, start_rv) = match plan.start {
        WatchStart::From(n) if n < st.compacted => {
            let line = too_old_line(n, st.compacted);
            drop(st);
            return out.data(line.as_bytes()).and_then(|_| out.end()).is_ok();
        }
        WatchStart::From(n) => (n, n),
        WatchStart::Zero | WatchStart::Now => {
            for (k, v) in st.objects.iter() {
                if k.0 == plan.res && plan.filter.matches(v) {
                    initial.push(event_line("ADDED", &encode(v)));
                }
            }
            (st.rv, st.type_rv(plan.res))
        }
    };
    drop(st);
    let cut = |out: &mut W| {
        let _ = out.tcp().shutdown(Shutdown::Both);
        false
    };
    for line in initial {
        if out.data(line.as_bytes()).is_err() {
            return false;
        }
    }
    let started = Instant::now();
    let deadline = started + plan.timeout;
    let mut next_bookmark: Option<Instant> = None;
    let mut pre_deadline_sent = false;
    loop {
        if shared.stop.load(Ordering::SeqCst) || shared.watch_gen.load(Ordering::SeqCst) != gen {
            return cut(out);
        }
        if shared.black_hole.load(Ordering::SeqCst) {
            // Nothing more is sent, not even the end of the stream, and not
            // after the black hole ends either.
            hold_silent(shared, out.tcp());
            return cut(out);
        }

        let now = Instant::now();
        if now >= deadline {
            return out.end().is_ok();
        }
        let mut st = shared.state.lock();
        let interval = st.bookmark_interval.max(Duration::from_millis(10));
        let nb = *next_bookmark.get_or_insert(started + interval);
        let lead = interval.min(Duration::from_secs(2));
        let pre_deadline = deadline.checked_sub(lead).unwrap_or(started);
        if st.rv <= pos {
            let wake = [nb, pre_deadline, deadline]
                .into_iter()
                .filter(|t| *t > now)
                .min()
                .unwrap_or(now);
            let wait = wake
                .saturating_duration_since(now)
                .min(POLL * 5)
                .max(Duration::from_millis(1));
            shared.changed.wait_for(&mut st, wait);
        }
        if pos < st.compacted {
            let line = too_old_line(pos, st.compacted);
            drop(st);
            return out.data(line.as_bytes()).and_then(|_| out.end()).is_ok();
        }
        let (raw, seen) = injections(shared, plan.res, injected_seen);
        injected_seen = seen;
        let lines: Vec<String> = st
            .log
            .iter()
            .filter(|e| e.rv > pos && e.res == plan.res)
            .filter_map(|e| convert(e, &plan.filter))
            .collect();
        pos = pos.max(st.rv);
        let cache_rv = st.type_rv(plan.res);
        drop(st);
        for bytes in raw {
            if out.data(&bytes).is_err() {
                return false;
            }
        }
        for line in lines {
            if out.data(line.as_bytes()).is_err() {
                return false;
            }
        }
        if plan.bookmarks {
            let now = Instant::now();
            let mut due = false;
            if now >= nb {
                due = true;
                next_bookmark = Some(nb + interval);
            }
            if !pre_deadline_sent && now >= pre_deadline && now < deadline {
                due = true;
                pre_deadline_sent = true;
            }
            if due && cache_rv > start_rv {
                let line = event_line("BOOKMARK", &plan.res.bookmark(cache_rv));
                if out.data(line.as_bytes()).is_err() {
                    return false;
                }
            }
        }
    }
}
