//! The node API's waiting room: the threads that accept connections and
//! hold them while nothing is to be served. `server-poll` watches the
//! main and read-only ports and every connection there still in its TLS
//! handshake, its request head, or kept alive between requests, all at
//! once with poll(2): it reads whatever arrives without waiting
//! (`Conn::fill`, rustls driven record by record) and hands a connection
//! to the workers (`http::Pool`) only once a whole head is in. One
//! deadline, [`HEAD_TIMEOUT`](super::http::HEAD_TIMEOUT) from accept,
//! holds for the handshake and the first head together however the
//! client trickles them; then the connection is closed. `server-healthz`
//! does the same for `--healthz-port` alone and answers there itself, so
//! nothing on the other ports can delay a health check.
//!
//! Bounds: at most `max_conns` open (past it the oldest waiting
//! connection is closed, or the new one when none waits), and at most
//! `max_pending_per_ip` from one address still in a handshake or first
//! head (past it that address's oldest such one is closed). When accept
//! fails (out of descriptors), the listeners are left alone for a while,
//! 100 ms doubling up to 1 s, not polled again at once.

use std::io;
use std::net::IpAddr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{bounded, never, Receiver};
use log::{debug, info, warn};

use super::conn::Conn;
use super::http::{self, Client, Dispatch, Handler, Inline, Limits, Listener, Pool, MAX_HEAD};
use crate::thread::{spawn_named, JoinOnDrop};

/// The healthz port's bounds: few connections, a short head, and answers
/// written at once or never.
const HEALTHZ_LIMITS: Limits = Limits {
    max_conns: 128,
    max_pending_per_ip: 128,
    head_timeout: http::HEAD_TIMEOUT,
    idle_timeout: http::HEAD_TIMEOUT,
    write_timeout: Duration::ZERO,
};

/// The first pause of accepts after accept failed, and the longest.
const ACCEPT_PAUSE_MIN: Duration = Duration::from_millis(100);
const ACCEPT_PAUSE_MAX: Duration = Duration::from_secs(1);

/// The running server; dropping it closes the listeners and every
/// waiting connection (requests being served finish).
pub(crate) struct Server {
    stop: Arc<AtomicBool>,
    wakes: Vec<Arc<OwnedFd>>,
    _threads: Vec<JoinOnDrop<()>>,
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for w in &self.wakes {
            http::wake(w.as_raw_fd());
        }
    }
}

/// A pipe that wakes a poll thread: (read end, write end).
fn wake_pipe() -> io::Result<(OwnedFd, Arc<OwnedFd>)> {
    let mut fds = [0 as RawFd; 2];
    // SAFETY: pipe2 fills the two-element array on success.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_NONBLOCK | libc::O_CLOEXEC) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: both fds were just made and are owned here alone.
    let (r, w) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    Ok((r, Arc::new(w)))
}

/// Starts `server-poll` over the main and read-only listeners and
/// `server-healthz` over the healthz one.
pub(crate) fn start(listeners: Vec<Listener>, handler: Arc<dyn Handler>) -> io::Result<Server> {
    start_with(listeners, handler, Limits::DEFAULT, HEALTHZ_LIMITS)
}

/// [`start`] with other bounds (tests).
pub(crate) fn start_with(
    listeners: Vec<Listener>,
    handler: Arc<dyn Handler>,
    limits: Limits,
    healthz_limits: Limits,
) -> io::Result<Server> {
    for l in &listeners {
        l.socket.set_nonblocking(true)?;
    }
    let (healthz, main): (Vec<_>, Vec<_>) = listeners
        .into_iter()
        .partition(|l| l.port == http::Port::Healthz);
    let stop = Arc::new(AtomicBool::new(false));
    let mut server = Server {
        stop: stop.clone(),
        wakes: Vec::new(),
        _threads: Vec::new(),
    };
    if !main.is_empty() {
        let (wake_r, wake_w) = wake_pipe()?;
        // Capacity: every open connection fits, so a send never waits.
        let (back, back_rx) = bounded(limits.max_conns);
        let pool = Arc::new(Pool::new(handler.clone(), back, wake_w.clone(), limits));
        let poller = Poller::new(main, wake_r, back_rx, pool, limits, stop.clone());
        server.wakes.push(wake_w);
        server
            ._threads
            .push(spawn_named("server-poll", move || poller.run())?);
    }
    if !healthz.is_empty() {
        let (wake_r, wake_w) = wake_pipe()?;
        let inline = Inline(handler);
        let poller = Poller::new(healthz, wake_r, never(), inline, healthz_limits, stop);
        server.wakes.push(wake_w);
        server
            ._threads
            .push(spawn_named("server-healthz", move || poller.run())?);
    }
    Ok(server)
}

/// When accepts may be tried again after accept failed.
#[derive(Debug, Default)]
pub(crate) struct AcceptBackoff {
    /// Accepts wait until then.
    until: Option<Instant>,
    /// The current pause; zero when accept last succeeded.
    pause: Duration,
}

impl AcceptBackoff {
    /// Accept failed at `now`: pause, twice as long as the last pause when
    /// it failed again since (up to a second). True on the first failure
    /// of a run, which is worth a warning.
    pub(crate) fn failed(&mut self, now: Instant) -> bool {
        let first = self.pause.is_zero();
        self.pause = if first {
            ACCEPT_PAUSE_MIN
        } else {
            (self.pause * 2).min(ACCEPT_PAUSE_MAX)
        };
        self.until = Some(now + self.pause);
        first
    }

    /// Accept succeeded: no pause. True when it ends a run of failures.
    pub(crate) fn succeeded(&mut self) -> bool {
        let was = !self.pause.is_zero();
        self.pause = Duration::ZERO;
        self.until = None;
        was
    }

    /// Whether the listeners are to be polled at `now`.
    pub(crate) fn accepting(&self, now: Instant) -> bool {
        self.until.is_none_or(|u| now >= u)
    }

    /// How long until accepts resume, while paused.
    pub(crate) fn resumes_in(&self, now: Instant) -> Option<Duration> {
        self.until
            .filter(|u| *u > now)
            .map(|u| u.saturating_duration_since(now))
    }
}

struct Poller<D> {
    listeners: Vec<Listener>,
    wake: OwnedFd,
    back: Receiver<Client>,
    sink: D,
    /// Connections waiting for a whole request head, oldest first.
    waiting: Vec<Client>,
    open: Arc<AtomicUsize>,
    limits: Limits,
    backoff: AcceptBackoff,
    stop: Arc<AtomicBool>,
}

impl<D: Dispatch> Poller<D> {
    fn new(
        listeners: Vec<Listener>,
        wake: OwnedFd,
        back: Receiver<Client>,
        sink: D,
        limits: Limits,
        stop: Arc<AtomicBool>,
    ) -> Poller<D> {
        Poller {
            listeners,
            wake,
            back,
            sink,
            waiting: Vec::new(),
            open: Arc::new(AtomicUsize::new(0)),
            limits,
            backoff: AcceptBackoff::default(),
            stop,
        }
    }

    fn run(mut self) {
        let mut fds: Vec<libc::pollfd> = Vec::new();
        while !self.stop.load(Ordering::Relaxed) {
            let now = Instant::now();
            let accepting = self.backoff.accepting(now);
            fds.clear();
            let pfd = |fd: RawFd, events: libc::c_short| libc::pollfd {
                fd,
                events,
                revents: 0,
            };
            fds.push(pfd(self.wake.as_raw_fd(), libc::POLLIN));
            let listen = if accepting { libc::POLLIN } else { 0 };
            fds.extend(
                self.listeners
                    .iter()
                    .map(|l| pfd(l.socket.as_raw_fd(), listen)),
            );
            fds.extend(self.waiting.iter().map(|c| {
                let out = if c.conn.wants_write() {
                    libc::POLLOUT
                } else {
                    0
                };
                pfd(c.conn.tcp().as_raw_fd(), libc::POLLIN | out)
            }));
            // Nothing to time out: wait for a client or the wake pipe alone,
            // so an idle node's server threads do not wake.
            let timeout = self
                .waiting
                .iter()
                .map(|c| c.deadline.saturating_duration_since(now))
                .chain(self.backoff.resumes_in(now))
                .min();
            // Rounded up: a deadline is not polled for again just short of it.
            let ms = timeout.map_or(-1, |t| {
                t.as_micros().div_ceil(1000).clamp(1, 60_000) as libc::c_int
            });
            // SAFETY: `fds` is a live array of initialised pollfds.
            let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) };
            if n < 0 {
                let e = io::Error::last_os_error();
                if e.kind() != io::ErrorKind::Interrupted {
                    warn!("node API: poll: {e}");
                    std::thread::sleep(Duration::from_millis(100));
                }
                continue;
            }
            let now = Instant::now();
            // Waiting connections first, by the indices polled.
            let first = 1 + self.listeners.len();
            let mut keep = Vec::with_capacity(self.waiting.len());
            for (i, c) in std::mem::take(&mut self.waiting).into_iter().enumerate() {
                let ev = fds.get(first + i).map_or(0, |f| f.revents);
                let c = if ev != 0 { self.turn(c, now) } else { Some(c) };
                match c {
                    Some(c) if now >= c.deadline => {
                        debug!(
                            "node API: closing a connection {} past its deadline",
                            if c.idle {
                                "idle"
                            } else {
                                "without a request head"
                            }
                        );
                    }
                    Some(c) => keep.push(c),
                    None => {}
                }
            }
            self.waiting = keep;
            if accepting {
                for i in 0..self.listeners.len() {
                    if fds[1 + i].revents != 0 {
                        self.accept(i, now);
                    }
                }
            }
            if fds[0].revents != 0 {
                let mut sink = [0u8; 64];
                // SAFETY: reads into a live buffer from the pipe this thread owns.
                while unsafe {
                    libc::read(self.wake.as_raw_fd(), sink.as_mut_ptr().cast(), sink.len())
                } > 0
                {}
            }
            while let Ok(c) = self.back.try_recv() {
                self.waiting.push(c);
            }
        }
    }

    /// Reads what `c` sent; hands it on when its head is in. `None` when
    /// it left this thread (to a worker, or closed).
    fn turn(&mut self, mut c: Client, now: Instant) -> Option<Client> {
        let filled = match c.conn.fill(&mut c.buf, MAX_HEAD + 1) {
            Ok(f) => f,
            Err(e) => {
                debug!("node API: reading a request: {e}");
                return None;
            }
        };
        if filled.received && c.idle {
            // A kept-alive connection's next request has begun.
            c.idle = false;
            c.deadline = now + self.limits.head_timeout;
        }
        if !c.buf.is_empty() && http::head_in(&mut c) {
            self.sink.dispatch(c);
            return None;
        }
        if filled.eof {
            return None;
        }
        Some(c)
    }

    fn accept(&mut self, i: usize, now: Instant) {
        loop {
            let (stream, peer) = match self.listeners[i].socket.accept() {
                Ok(s) => s,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                // The one connection went before it was taken.
                Err(e) if e.kind() == io::ErrorKind::ConnectionAborted => continue,
                Err(e) => {
                    // Out of descriptors (EMFILE, ENFILE) or memory: the
                    // listener stays readable, so polling it again at once
                    // would spin. Leave it for a while.
                    if self.backoff.failed(now) {
                        warn!("node API: accept: {e}; pausing new connections");
                    } else {
                        debug!("node API: accept: {e}; pausing new connections again");
                    }
                    return;
                }
            };
            if self.backoff.succeeded() {
                info!("node API: accepting connections again");
            }
            let peer = peer.ip();
            self.make_room(peer);
            if self.open.load(Ordering::Relaxed) >= self.limits.max_conns {
                debug!(
                    "node API: {} connections open; closing a new one",
                    self.limits.max_conns
                );
                continue;
            }
            // The socket stays blocking for sessions; the server's own
            // reads and writes never wait on it (`Conn`).
            let _ = stream.set_nonblocking(false);
            let _ = stream.set_nodelay(true);
            let l = &self.listeners[i];
            let conn = match &l.tls {
                Some(cfg) => match rustls::ServerConnection::new(cfg.clone()) {
                    Ok(tls) => Conn::Tls(stream, Box::new(tls)),
                    Err(e) => {
                        warn!("node API: TLS: {e}");
                        continue;
                    }
                },
                None => Conn::Plain(stream),
            };
            let c = Client::accepted(conn, l.port, peer, now, &self.limits, &self.open);
            self.waiting.push(c);
        }
    }

    /// Closes a waiting connection for a new one from `peer` when that
    /// address already has its share of connections in their first head,
    /// or all connections are open.
    fn make_room(&mut self, peer: IpAddr) {
        let pending = |c: &Client| c.fresh && c.peer == peer;
        if self.waiting.iter().filter(|c| pending(c)).count() >= self.limits.max_pending_per_ip {
            if let Some(i) = self.waiting.iter().position(pending) {
                debug!("node API: {peer} has too many connections without a request; closing its oldest");
                self.waiting.remove(i);
                return;
            }
        }
        if self.open.load(Ordering::Relaxed) >= self.limits.max_conns && !self.waiting.is_empty() {
            // The oldest connection still waiting makes room.
            self.waiting.remove(0);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server::head::RequestHead;
    use crate::server::http::{Next, Port};
    use std::io::{Read, Write};
    use std::net::{TcpListener, TcpStream};

    /// Answers by path: `/ok`; `/big` (32 MiB in one answer); `/chunks`
    /// (32 MiB in 64 KiB chunks, more than loopback buffers hold); `/panic`; `/session-panic`; `/session`
    /// (a session that answers). Tells `done` how each write went.
    struct Test {
        done: crossbeam_channel::Sender<(String, bool)>,
    }

    impl Handler for Test {
        fn handle(&self, c: &mut Client, head: &RequestHead) -> Next {
            let path = head.path().to_string();
            let result = match path.as_str() {
                "/ok" => c.text(200, "ok"),
                "/big" => c.respond(200, "text/plain", &vec![b'x'; 32 << 20]),
                "/chunks" => c.chunked(200, "text/plain").and_then(|mut body| {
                    for _ in 0..512 {
                        body.write_all(&[b'y'; 64 << 10])?;
                    }
                    body.finish()
                }),
                "/panic" => panic!("a handler's bug"),
                "/session-panic" => return Next::Session(Box::new(|_| panic!("a session's bug"))),
                "/session" => {
                    return Next::Session(Box::new(|mut c| {
                        let _ = c.text(200, "session");
                    }))
                }
                _ => c.text(404, "no"),
            };
            let _ = self.done.send((path, result.is_ok()));
            if result.is_ok() {
                Next::Done
            } else {
                Next::Close
            }
        }
    }

    const SHORT: Limits = Limits {
        max_conns: 64,
        max_pending_per_ip: 64,
        head_timeout: Duration::from_secs(10),
        idle_timeout: Duration::from_secs(10),
        write_timeout: Duration::from_secs(1),
    };

    fn serve() -> (Server, u16, crossbeam_channel::Receiver<(String, bool)>) {
        let (done, rx) = crossbeam_channel::unbounded();
        let socket = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = socket.local_addr().unwrap().port();
        let listener = Listener {
            socket,
            port: Port::ReadOnly,
            tls: None,
        };
        let server = start_with(
            vec![listener],
            Arc::new(Test { done }),
            SHORT,
            HEALTHZ_LIMITS,
        )
        .unwrap();
        (server, port, rx)
    }

    fn ask(port: u16, path: &str) -> String {
        let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        write!(
            s,
            "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        )
        .unwrap();
        let mut out = Vec::new();
        let _ = s.read_to_end(&mut out);
        String::from_utf8_lossy(&out).into_owned()
    }

    #[test]
    fn a_client_that_does_not_read_holds_a_worker_only_until_the_write_deadline() {
        let (_server, port, done) = serve();
        for path in ["/big", "/chunks"] {
            // Never read, or a byte at a time: the kernel's buffers fill
            // and the answer stalls.
            let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
            write!(s, "GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
            let stop = Arc::new(AtomicBool::new(false));
            let drain = {
                let (stop, mut s) = (stop.clone(), s.try_clone().unwrap());
                crate::thread::spawn_named("slow-reader", move || {
                    let mut byte = [0u8; 1];
                    while !stop.load(Ordering::Relaxed) && matches!(s.read(&mut byte), Ok(1)) {
                        std::thread::sleep(Duration::from_millis(20));
                    }
                })
                .unwrap()
            };
            // A second late by the deadline; "forever" without one.
            let (what, ok) = done
                .recv_timeout(Duration::from_secs(10))
                .expect("the answer ended");
            assert_eq!(
                (what.as_str(), ok),
                (path, false),
                "the slow reader was not cut"
            );
            stop.store(true, Ordering::Relaxed);
            let _ = s.shutdown(std::net::Shutdown::Both);
            drop(drain);
        }
        assert!(ask(port, "/ok").ends_with("\r\n\r\nok"));
    }

    #[test]
    fn panics_in_handlers_and_sessions_keep_the_pool_whole() {
        let (_server, port, _done) = serve();
        // More panics than workers, then more than sessions.
        for _ in 0..http::MAX_WORKERS + 2 {
            assert_eq!(ask(port, "/panic"), "", "a panicking handler answered");
        }
        for _ in 0..http::MAX_SESSIONS + 2 {
            assert_eq!(ask(port, "/session-panic"), "");
        }
        let ok = ask(port, "/ok");
        assert!(
            ok.starts_with("HTTP/1.1 200 ") && ok.ends_with("ok"),
            "{ok:?}"
        );
        let session = ask(port, "/session");
        assert!(session.starts_with("HTTP/1.1 200 "), "{session:?}");
    }

    #[test]
    fn a_head_split_anywhere_and_pipelined_requests_are_served() {
        let (_server, port, _done) = serve();
        let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let two = b"GET /ok HTTP/1.1\r\nHost: x\r\n\r\nGET /ok HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
        for b in two.chunks(7) {
            s.write_all(b).unwrap();
            std::thread::sleep(Duration::from_millis(5));
        }
        let mut out = Vec::new();
        let _ = s.read_to_end(&mut out);
        let text = String::from_utf8_lossy(&out);
        assert_eq!(text.matches("HTTP/1.1 200 OK").count(), 2, "{text}");
    }

    #[test]
    fn accept_failures_pause_accepting_a_while_doubling_up_to_a_second() {
        let mut b = AcceptBackoff::default();
        let t0 = Instant::now();
        assert!(b.accepting(t0));
        assert_eq!(b.resumes_in(t0), None);
        assert!(b.failed(t0), "the first failure is worth a warning");
        assert!(!b.accepting(t0));
        assert!(!b.accepting(t0 + Duration::from_millis(99)));
        assert!(b.accepting(t0 + ACCEPT_PAUSE_MIN));
        assert_eq!(b.resumes_in(t0), Some(ACCEPT_PAUSE_MIN));
        let mut pauses = Vec::new();
        let mut now = t0;
        for _ in 0..6 {
            now += Duration::from_secs(2);
            assert!(!b.failed(now), "warned again in the same run");
            pauses.push(b.resumes_in(now).unwrap().as_millis());
        }
        assert_eq!(pauses, [200, 400, 800, 1000, 1000, 1000]);
        assert!(b.succeeded());
        assert!(b.accepting(now));
        assert!(!b.succeeded());
        assert!(b.failed(now), "a new run warns again");
        assert_eq!(b.resumes_in(now), Some(ACCEPT_PAUSE_MIN));
    }
}
