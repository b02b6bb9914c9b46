//! The watch multiplexer: one thread, `watch-mux`, that lists and watches
//! any number of single named objects (the Secrets and ConfigMaps pods
//! reference), each on its own apiserver connection, all driven at once
//! with poll(2) over non-blocking sockets (`nbhttp`). The Node authorizer
//! allows a node to watch such an object only by name, and HTTP/1.1
//! carries one watch per connection, so a connection per object is what
//! upstream's HTTP/2 streams become here; what is saved is the thread and
//! its buffers per object (a reflector thread each, before).
//!
//! Each watch follows the reflector's protocol (`reflector`) for a store
//! of one object: LIST with `fieldSelector=metadata.name=<name>` (first
//! from the watch cache, `resourceVersion=0`; after a 410 or repeated
//! failures a quorum read), then WATCH from the list's resourceVersion
//! with bookmarks and a random `timeoutSeconds` in [300, 600), again at
//! once when the server ends it; a lost connection is watched again from
//! the last version after a back-off (1 s doubling to 10 s, with jitter),
//! a 410 relists, three failures that are not transport errors in a row
//! relist. Requests take a token from the client's rate limiter without
//! waiting for it (the watch waits its turn on the poll timer), a 401
//! re-reads the token file once, and answers are counted as the blocking
//! client's. The sink gets the object (None: it does not exist) after
//! every list and every change.
//!
//! Deadlines: the answer's head within the client's request timeout; a
//! watch whose connection is silent longer than its `timeoutSeconds` plus
//! 30 s is taken for dead. [`Client::close_all_connections`] closes these
//! connections too. The thread starts with the first watch and ends after
//! a minute without any.

use std::collections::HashMap;
use std::net::{SocketAddr, ToSocketAddrs};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::Arc;
use std::time::{Duration, Instant};

use log::{error, info, warn};
use parking_lot::Mutex;
use serde_json::Value;

use super::list::{ValueScanner, MAX_OBJECT};
use super::nbhttp::{Conn, Endpoint, Head};
// Watches last, back off and relist as the reflector's do.
use super::reflector::{
    percent_encode, XorShift, BACKOFF_CAP, BACKOFF_START, FAILURES_BEFORE_RELIST, IDLE_MARGIN,
    SHORT_WATCH, WATCH_MIN_SECS, WATCH_SPREAD_SECS,
};
use super::{ApiError, Client, ErrorKind};

/// What a watch hands on: the object, or None when it does not exist.
pub(crate) type ObjectSink = Box<dyn FnMut(Option<Value>) + Send>;

/// The thread ends after this long without a watch.
const IDLE_EXIT: Duration = Duration::from_secs(60);
/// A list answer (one object at most) or an error body larger than this
/// is not read.
const MAX_LIST_BODY: usize = MAX_OBJECT + 64 * 1024;
const MAX_ERROR_BODY: usize = 64 * 1024;
/// Addresses of the apiserver are looked up again after this long.
const RESOLVE_TTL: Duration = Duration::from_secs(60);

/// Timings, shortened by tests.
#[derive(Clone, Copy)]
struct Timing {
    backoff_start: Duration,
    idle_margin: Duration,
    idle_exit: Duration,
    watch_min_secs: u64,
    watch_spread_secs: u64,
}

const TIMING: Timing = Timing {
    backoff_start: BACKOFF_START,
    idle_margin: IDLE_MARGIN,
    idle_exit: IDLE_EXIT,
    watch_min_secs: WATCH_MIN_SECS,
    watch_spread_secs: WATCH_SPREAD_SECS,
};

/// Starts watches on the shared thread, starting it when it is not
/// running. Dropping it stops the thread and every watch.
pub(crate) struct WatchMux {
    client: Client,
    endpoint: Arc<Endpoint>,
    timing: Timing,
    /// The running thread's share (None before the first watch, and after
    /// it ended).
    current: Arc<Mutex<Option<Arc<Shared>>>>,
    /// Threads started so far (tests).
    started: std::sync::atomic::AtomicUsize,
}

/// What the thread and the handles share.
struct Shared {
    queue: Mutex<Queue>,
    wake_r: OwnedFd,
    wake_w: OwnedFd,
}

#[derive(Default)]
struct Queue {
    adds: Vec<Spec>,
    stops: Vec<u64>,
    next_id: u64,
    close_all: bool,
    stop: bool,
    /// The thread has ended: nothing more is taken.
    exited: bool,
}

/// A watch to start.
struct Spec {
    id: u64,
    collection: String,
    name: String,
    sink: ObjectSink,
}

/// One watch; dropping it ends the watch and closes its connection.
pub(crate) struct ObjectWatch {
    id: u64,
    shared: Arc<Shared>,
}

impl Drop for ObjectWatch {
    fn drop(&mut self) {
        let mut q = self.shared.queue.lock();
        if !q.exited {
            q.stops.push(self.id);
            drop(q);
            self.shared.wake();
        }
    }
}

impl Shared {
    fn new() -> std::io::Result<Shared> {
        let mut fds = [0 as RawFd; 2];
        // SAFETY: pipe2 fills the two-element array on success.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_NONBLOCK | libc::O_CLOEXEC) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: both fds were just made and are owned here alone.
        let (r, w) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        Ok(Shared {
            queue: Mutex::new(Queue::default()),
            wake_r: r,
            wake_w: w,
        })
    }

    fn wake(&self) {
        // SAFETY: one byte from a live buffer to our own pipe; a full pipe
        // (EAGAIN) already wakes the reader.
        unsafe {
            libc::write(self.wake_w.as_raw_fd(), b"w".as_ptr().cast(), 1);
        }
    }

    fn drain_wakes(&self) {
        let mut buf = [0u8; 64];
        // SAFETY: reads into a live buffer of its length from our own
        // non-blocking pipe.
        while unsafe { libc::read(self.wake_r.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) } > 0
        {
        }
    }
}

impl WatchMux {
    /// A multiplexer for `client`'s apiserver; no thread until the first
    /// watch.
    pub(crate) fn new(client: Client) -> Result<WatchMux, String> {
        let endpoint = client.endpoint()?;
        let current: Arc<Mutex<Option<Arc<Shared>>>> = Arc::new(Mutex::new(None));
        // Once per multiplexer, whichever thread runs when it is called.
        let hook = Arc::downgrade(&current);
        client.on_close_all(Box::new(move || {
            let Some(current) = hook.upgrade() else {
                return;
            };
            let running = current.lock();
            if let Some(shared) = running.as_ref() {
                shared.queue.lock().close_all = true;
                shared.wake();
            }
        }));
        Ok(WatchMux {
            client,
            endpoint,
            timing: TIMING,
            current,
            started: std::sync::atomic::AtomicUsize::new(0),
        })
    }

    /// Watches the object `name` of the collection `collection` (e.g.
    /// `/api/v1/namespaces/ns/configmaps`); `sink` runs on the thread.
    pub(crate) fn watch(
        &self,
        collection: &str,
        name: &str,
        sink: ObjectSink,
    ) -> std::io::Result<ObjectWatch> {
        let mut current = self.current.lock();
        let mut spec = Some(Spec {
            id: 0,
            collection: collection.to_string(),
            name: name.to_string(),
            sink,
        });
        loop {
            if let Some(shared) = current.as_ref() {
                let mut q = shared.queue.lock();
                if !q.exited {
                    let id = q.next_id;
                    q.next_id += 1;
                    let Some(mut s) = spec.take() else {
                        return Err(std::io::Error::other("no watch to start"));
                    };
                    s.id = id;
                    q.adds.push(s);
                    drop(q);
                    shared.wake();
                    return Ok(ObjectWatch {
                        id,
                        shared: shared.clone(),
                    });
                }
            }
            let shared = Arc::new(Shared::new()?);
            let engine = Engine {
                client: self.client.clone(),
                endpoint: self.endpoint.clone(),
                shared: shared.clone(),
                timing: self.timing,
                watches: HashMap::new(),
                addrs: Vec::new(),
                resolved_at: None,
                next_addr: 0,
                rng: XorShift::seeded(),
            };
            // Not joined: it ends by itself once stopped or idle.
            crate::thread::spawn_named("watch-mux", move || engine.run())?.detach();
            self.started
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            *current = Some(shared);
        }
    }

    /// Watches on the thread now (tests).
    #[cfg(test)]
    fn running(&self) -> bool {
        self.current
            .lock()
            .as_ref()
            .is_some_and(|s| !s.queue.lock().exited)
    }
}

impl Drop for WatchMux {
    fn drop(&mut self) {
        if let Some(shared) = self.current.lock().take() {
            shared.queue.lock().stop = true;
            shared.wake();
        }
    }
}

/// Which request a watch has out.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Req {
    List,
    Watch,
}

/// Where a watch is.
enum Phase {
    /// The next request goes out at `at`; `token`: its rate-limiter token
    /// is taken.
    Waiting {
        at: Instant,
        next: Req,
        quorum: bool,
        token: bool,
    },
    /// A request is out.
    Out(Box<Out>),
}

/// A request that is out and its answer so far.
struct Out {
    req: Req,
    quorum: bool,
    path: String,
    /// The token it was sent with (a 401 re-reads the file once).
    bearer: Option<String>,
    started: Instant,
    /// The answer's head (or the next read of a watch) must come by then.
    deadline: Instant,
    /// For a watch: how long it may be silent.
    idle: Duration,
    head: Option<Head>,
    /// A list's or an error's body; a watch's unfinished line.
    buf: Vec<u8>,
    /// A watch line over the cap being read past.
    skipping: Option<(ValueScanner, u64)>,
    events: u64,
    retried_401: bool,
}

struct Watch {
    collection: String,
    name: String,
    sink: ObjectSink,
    rv: Option<String>,
    failures: u32,
    backoff: Duration,
    phase: Phase,
    conn: Option<Conn>,
}

/// How a request ended badly.
enum Failure {
    Api(ApiError),
    /// Relist (a 410, or the stream's own ERROR 410).
    Gone(String),
}

struct Engine {
    client: Client,
    endpoint: Arc<Endpoint>,
    shared: Arc<Shared>,
    timing: Timing,
    watches: HashMap<u64, Watch>,
    addrs: Vec<SocketAddr>,
    resolved_at: Option<Instant>,
    next_addr: usize,
    rng: XorShift,
}

impl Engine {
    /// Serves the watches until stopped or idle. A panic (in a sink, or a
    /// bug here) is caught: every watch drops its connection and lists
    /// again after a second, and the thread goes on.
    fn run(mut self) {
        loop {
            let served = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.serve()));
            if served.is_ok() {
                return;
            }
            error!(
                "watch-mux: a panic while serving {} watches; each lists again",
                self.watches.len()
            );
            let again = Instant::now() + self.timing.backoff_start;
            for w in self.watches.values_mut() {
                w.conn = None;
                w.phase = Phase::Waiting {
                    at: again,
                    next: Req::List,
                    quorum: true,
                    token: false,
                };
            }
        }
    }

    fn serve(&mut self) {
        let mut idle_since = Instant::now();
        let mut fds: Vec<libc::pollfd> = Vec::new();
        let mut ids: Vec<u64> = Vec::new();
        loop {
            let now = Instant::now();
            if !self.take_commands(now) {
                return;
            }
            if self.watches.is_empty() {
                if now.duration_since(idle_since) >= self.timing.idle_exit {
                    let mut q = self.shared.queue.lock();
                    if q.adds.is_empty() {
                        q.exited = true;
                        return;
                    }
                    continue;
                }
            } else {
                idle_since = now;
            }
            let keys: Vec<u64> = self.watches.keys().copied().collect();
            for id in &keys {
                self.advance(*id, now);
            }
            // What to wait for, and until when.
            fds.clear();
            ids.clear();
            fds.push(libc::pollfd {
                fd: self.shared.wake_r.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            });
            let mut until: Option<Instant> = None;
            let mut earliest = |t: Instant| {
                until = Some(until.map_or(t, |u: Instant| u.min(t)));
            };
            for (id, w) in &self.watches {
                match &w.phase {
                    Phase::Waiting { at, .. } => earliest(*at),
                    Phase::Out(out) => {
                        earliest(out.deadline);
                        if let Some(c) = &w.conn {
                            fds.push(libc::pollfd {
                                fd: c.fd(),
                                events: c.interest(),
                                revents: 0,
                            });
                            ids.push(*id);
                        }
                    }
                }
            }
            if self.watches.is_empty() {
                earliest(idle_since + self.timing.idle_exit);
            }
            let ms = match until {
                None => -1,
                Some(t) => {
                    let left = t.saturating_duration_since(Instant::now());
                    // Rounded up, so that a deadline is past when poll returns.
                    left.as_millis().min(i32::MAX as u128) as i32
                        + i32::from(left.subsec_nanos() % 1_000_000 != 0)
                }
            };
            // SAFETY: fds is a live, initialised array of its length.
            let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) };
            if n < 0 {
                let e = std::io::Error::last_os_error();
                if e.kind() != std::io::ErrorKind::Interrupted {
                    error!("watch-mux: poll: {e}");
                    std::thread::sleep(Duration::from_millis(100));
                }
                continue;
            }
            if fds[0].revents != 0 {
                self.shared.drain_wakes();
            }
            for (pfd, id) in fds[1..].iter().zip(&ids) {
                if pfd.revents != 0 {
                    self.ready(*id);
                }
            }
        }
    }

    /// Takes the handles' commands; false when the thread is to end.
    fn take_commands(&mut self, now: Instant) -> bool {
        let (adds, stops, close_all) = {
            let mut q = self.shared.queue.lock();
            if q.stop {
                q.exited = true;
                return false;
            }
            let close_all = std::mem::take(&mut q.close_all);
            (
                std::mem::take(&mut q.adds),
                std::mem::take(&mut q.stops),
                close_all,
            )
        };
        for id in stops {
            self.watches.remove(&id);
        }
        if !adds.is_empty() || close_all {
            crate::malloc::shrink_map(&mut self.watches);
        }
        for s in adds {
            self.watches.insert(
                s.id,
                Watch {
                    collection: s.collection,
                    name: s.name,
                    sink: s.sink,
                    rv: None,
                    failures: 0,
                    backoff: self.timing.backoff_start,
                    phase: Phase::Waiting {
                        at: now,
                        next: Req::List,
                        quorum: false,
                        token: false,
                    },
                    conn: None,
                },
            );
        }
        if close_all {
            let ids: Vec<u64> = self.watches.keys().copied().collect();
            for id in ids {
                if let Some(w) = self.watches.get_mut(&id) {
                    w.conn = None;
                    if let Phase::Out(out) = &w.phase {
                        let e = transport(
                            &self.endpoint,
                            &self.client,
                            out,
                            "every apiserver connection was closed",
                        );
                        self.fail(id, Failure::Api(e), now);
                    }
                }
            }
        }
        true
    }

    /// Sends a waiting watch's request when its time has come, and fails
    /// one whose deadline passed.
    fn advance(&mut self, id: u64, now: Instant) {
        let Some(w) = self.watches.get_mut(&id) else {
            return;
        };
        match &mut w.phase {
            Phase::Waiting {
                at,
                next,
                quorum,
                token,
            } => {
                if now < *at {
                    return;
                }
                if !*token {
                    *token = true;
                    let wait = self.client.reserve_token(now);
                    if !wait.is_zero() {
                        *at = now + wait;
                        return;
                    }
                }
                let (req, quorum) = (*next, *quorum);
                self.send(id, req, quorum, now, false);
            }
            Phase::Out(out) => {
                if now >= out.deadline {
                    let what = if out.head.is_some() {
                        format!("the watch was silent for {} s", out.idle.as_secs())
                    } else {
                        format!(
                            "no answer within {} s",
                            out.deadline.duration_since(out.started).as_secs()
                        )
                    };
                    let e = transport(&self.endpoint, &self.client, out, &what);
                    w.conn = None;
                    self.fail(id, Failure::Api(e), now);
                }
            }
        }
    }

    fn transport(&self, out: &Out, what: &str) -> ApiError {
        transport(&self.endpoint, &self.client, out, what)
    }

    /// The path of the next request of `w`.
    fn path(&mut self, id: u64, req: Req, quorum: bool) -> (String, Duration) {
        let t = self.timing;
        let secs = t.watch_min_secs + self.rng.next() % t.watch_spread_secs.max(1);
        let Some(w) = self.watches.get(&id) else {
            return (String::new(), Duration::ZERO);
        };
        let mut q = format!(
            "{}?fieldSelector={}",
            w.collection,
            percent_encode(&format!("metadata.name={}", w.name))
        );
        match req {
            Req::List => {
                if !quorum {
                    q.push_str("&resourceVersion=0");
                }
                (q, Duration::ZERO)
            }
            Req::Watch => {
                let rv = w.rv.clone().unwrap_or_default();
                q.push_str(&format!(
                    "&resourceVersion={}&allowWatchBookmarks=true&timeoutSeconds={secs}&watch=true",
                    percent_encode(&rv)
                ));
                (q, Duration::from_secs(secs) + self.timing.idle_margin)
            }
        }
    }

    /// Sends `req` on the watch's connection (a new one when it has none
    /// that can take it).
    fn send(&mut self, id: u64, req: Req, quorum: bool, now: Instant, retried_401: bool) {
        let (path, idle) = self.path(id, req, quorum);
        let bearer = self.client.bearer_token();
        let out = Box::new(Out {
            req,
            quorum,
            path,
            bearer,
            started: now,
            deadline: now + self.client.request_timeout(),
            idle,
            head: None,
            buf: Vec::new(),
            skipping: None,
            events: 0,
            retried_401,
        });
        let reuse = self
            .watches
            .get(&id)
            .and_then(|w| w.conn.as_ref())
            .is_some_and(Conn::reusable);
        if !reuse {
            match self.open() {
                Ok(c) => {
                    if let Some(w) = self.watches.get_mut(&id) {
                        w.conn = Some(c);
                    }
                }
                Err(e) => {
                    let e = self.transport(&out, &format!("connecting: {e}"));
                    if let Some(w) = self.watches.get_mut(&id) {
                        w.phase = Phase::Out(out);
                    }
                    self.fail(id, Failure::Api(e), now);
                    return;
                }
            }
        }
        let mut request = format!(
            "GET {} HTTP/1.1\r\nHost: {}\r\nUser-Agent: {}\r\nAccept: application/json\r\n",
            out.path,
            self.endpoint.authority,
            self.client.user_agent()
        );
        if let Some(t) = &out.bearer {
            request.push_str(&format!("Authorization: Bearer {t}\r\n"));
        }
        request.push_str("\r\n");
        let Some(w) = self.watches.get_mut(&id) else {
            return;
        };
        let sent = match w.conn.as_mut() {
            Some(c) => c
                .send(request.as_bytes())
                .and_then(|()| c.pump().map(|_| ())),
            None => Err(std::io::Error::other("no connection")),
        };
        let failed = sent.err().map(|e| format!("sending the request: {e}"));
        w.phase = Phase::Out(out);
        if let Some(what) = failed {
            w.conn = None;
            if let Phase::Out(out) = &w.phase {
                let e = transport(&self.endpoint, &self.client, out, &what);
                self.fail(id, Failure::Api(e), now);
            }
            return;
        }
        // On loopback the answer can be in already: poll would not say so
        // again, so it is taken now.
        self.take_answer(id, now);
    }

    /// A new connection to the apiserver, to its addresses in turn, with
    /// the client's current certificate.
    fn open(&mut self) -> Result<Conn, String> {
        let now = Instant::now();
        self.endpoint = self.client.endpoint()?;
        if self.addrs.is_empty() || self.resolved_at.is_none_or(|t| now - t > RESOLVE_TTL) {
            let ep = &self.endpoint;
            match (ep.host.as_str(), ep.port).to_socket_addrs() {
                Ok(a) => {
                    self.addrs = a.collect();
                    self.resolved_at = Some(now);
                }
                Err(e) if self.addrs.is_empty() => {
                    return Err(format!("looking up {}: {e}", ep.host));
                }
                Err(_) => {}
            }
        }
        if self.addrs.is_empty() {
            return Err(format!("{} has no address", self.endpoint.host));
        }
        let addr = self.addrs[self.next_addr % self.addrs.len()];
        Conn::open(&self.endpoint, addr).map_err(|e| {
            // The next connection tries the next address.
            self.next_addr = self.next_addr.wrapping_add(1);
            format!("{addr}: {e}")
        })
    }

    /// The watch's connection is ready: move its bytes and take what came.
    fn ready(&mut self, id: u64) {
        let now = Instant::now();
        let Some(w) = self.watches.get_mut(&id) else {
            return;
        };
        let Phase::Out(out) = &mut w.phase else {
            return;
        };
        let Some(conn) = w.conn.as_mut() else {
            return;
        };
        let progress = match conn.pump() {
            Ok(p) => p,
            Err(e) => {
                let what = format!("{e}");
                let e = self.transport_of(id, &what);
                if let Some(w) = self.watches.get_mut(&id) {
                    w.conn = None;
                }
                self.fail(id, Failure::Api(e), now);
                return;
            }
        };
        if progress && out.head.is_some() {
            // A body that flows is read as long as it flows.
            out.deadline = now
                + if out.req == Req::Watch {
                    out.idle
                } else {
                    self.client.request_timeout()
                };
        }
        self.take_answer(id, now);
    }

    fn transport_of(&self, id: u64, what: &str) -> ApiError {
        match self.watches.get(&id).map(|w| &w.phase) {
            Some(Phase::Out(out)) => self.transport(out, what),
            _ => ApiError {
                verb: "GET",
                path: String::new(),
                kind: ErrorKind::Transport(what.to_string()),
            },
        }
    }

    /// The back-off to wait now (with jitter); doubles the next one.
    fn next_backoff(&mut self, id: u64) -> Duration {
        let Some(w) = self.watches.get_mut(&id) else {
            return Duration::ZERO;
        };
        let base = w.backoff;
        w.backoff = (w.backoff * 2).min(BACKOFF_CAP);
        base + base.mul_f64(self.rng.unit() * 0.5)
    }

    /// A request failed: relist, or wait and try again.
    fn fail(&mut self, id: u64, f: Failure, now: Instant) {
        let Some(w) = self.watches.get_mut(&id) else {
            return;
        };
        let (req, was_quorum, events) = match &w.phase {
            Phase::Out(out) => (out.req, out.quorum, out.events),
            Phase::Waiting { next, quorum, .. } => (*next, *quorum, 0),
        };
        if events > 0 {
            w.backoff = self.timing.backoff_start;
            w.failures = 0;
        }
        let e = match f {
            Failure::Gone(message) => {
                info!("watch-mux: {message}; relisting");
                w.rv = None;
                w.phase = Phase::Waiting {
                    at: now,
                    next: Req::List,
                    quorum: true,
                    token: false,
                };
                return;
            }
            Failure::Api(e) => e,
        };
        if matches!(e.kind, ErrorKind::Decode(_)) {
            error!("watch-mux: {e}");
        } else {
            warn!("watch-mux: {e}");
        }
        let retry_after = match &e.kind {
            ErrorKind::Status { retry_after, .. } => *retry_after,
            _ => None,
        };
        let mut next = req;
        let mut quorum = false;
        if req == Req::List {
            quorum = was_quorum;
        } else if !e.is_transport() {
            w.failures += 1;
            if w.failures >= FAILURES_BEFORE_RELIST {
                w.failures = 0;
                next = Req::List;
                quorum = true;
            }
        }
        let mut wait = self.next_backoff(id);
        if let Some(secs) = retry_after {
            wait = wait.max(Duration::from_secs(secs.min(BACKOFF_CAP.as_secs())));
        }
        if let Some(w) = self.watches.get_mut(&id) {
            w.phase = Phase::Waiting {
                at: now + wait,
                next,
                quorum,
                token: false,
            };
        }
    }
}

/// A transport error of the request `out` (counted when no answer came).
fn transport(endpoint: &Endpoint, client: &Client, out: &Out, what: &str) -> ApiError {
    if out.head.is_none() {
        crate::metrics::rest_client_request(None, "GET", &endpoint.authority);
    }
    ApiError {
        verb: "GET",
        path: out.path.clone(),
        kind: ErrorKind::Transport(format!("{}: {what}", client.server())),
    }
}

mod answer;
#[cfg(test)]
mod tests;
