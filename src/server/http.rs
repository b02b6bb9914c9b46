//! The node API's HTTP/1.1 machinery: one `server-poll` thread that accepts
//! on every listening socket and watches connections waiting for their
//! next request (poll(2)); at most [`MAX_WORKERS`] `server-worker/N`
//! threads, started on demand and ended after a minute idle, that each
//! serve one request of one connection and hand a kept-alive connection
//! back; long sessions on `server-session/N` threads, at most
//! [`MAX_SESSIONS`]. At most [`MAX_CONNS`] connections are open: past it
//! the oldest connection still waiting for a request is closed, or the
//! new one when none waits, so idle clients cannot grow memory.

use std::io::{self, Read, Write};
use std::net::TcpListener;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{bounded, Receiver, RecvTimeoutError, Sender};
use log::{debug, warn};
use parking_lot::Mutex;

use super::conn::Conn;
use super::head::RequestHead;
use crate::thread::{spawn_named, JoinOnDrop};

/// Open connections at most.
pub(crate) const MAX_CONNS: usize = 128;
/// Request-serving threads at most.
pub(crate) const MAX_WORKERS: usize = 4;
/// Long sessions (log follows, exec, attach, port-forward) at most, each
/// a thread (a 256 KiB stack, mostly untouched, and two 32 KiB buffers);
/// above what one caller may hold (`sessions::PER_USER`).
pub(crate) const MAX_SESSIONS: usize = 64;
/// The TLS handshake and a request head must arrive within this.
pub(crate) const HEAD_TIMEOUT: Duration = Duration::from_secs(10);
/// A kept-alive connection without a new request is closed after this.
pub(crate) const IDLE_TIMEOUT: Duration = Duration::from_secs(90);
/// Writing a non-streaming answer may take this long.
pub(crate) const WRITE_TIMEOUT: Duration = Duration::from_secs(30);
/// A request head beyond this gets 431.
pub(crate) const MAX_HEAD: usize = 32 * 1024;
/// A worker with nothing to do for this long ends.
const WORKER_IDLE: Duration = Duration::from_secs(60);
const MAX_HEADERS: usize = 100;

/// Which listener a connection came in on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Port {
    /// `--port`: TLS, authenticated, every endpoint.
    Main,
    /// `--read-only-port`: plain, unauthenticated, a few endpoints.
    ReadOnly,
    /// `--healthz-port`: plain, `/healthz` only.
    Healthz,
}

/// A listening socket and what it serves.
pub(crate) struct Listener {
    pub(crate) socket: TcpListener,
    pub(crate) port: Port,
    /// The TLS configuration of the main port.
    pub(crate) tls: Option<Arc<rustls::ServerConfig>>,
}

/// One client connection between requests or in one.
pub struct Client {
    pub(crate) conn: Conn,
    pub(crate) port: Port,
    /// Bytes read past the last request head.
    buf: Vec<u8>,
    deadline: Instant,
    /// Not yet served a request: the head deadline counts from accept.
    fresh: bool,
    /// Whether the connection stays open after this answer.
    pub(crate) keep_alive: bool,
    _slot: Slot,
}

/// Counts an open connection while it lives.
struct Slot(Arc<AtomicUsize>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// What a handler did with the connection.
pub(crate) enum Next {
    /// Answered in full; the connection may serve another request.
    Done,
    /// Answered; close the connection.
    Close,
    /// Goes on as a long session on a thread of its own.
    Session(Box<dyn FnOnce(Client) + Send>),
}

/// Serves one request.
pub(crate) trait Handler: Send + Sync + 'static {
    fn handle(&self, client: &mut Client, head: &RequestHead) -> Next;
}

/// The reason phrase of the statuses the server uses.
pub(crate) fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        413 => "Request Entity Too Large",
        429 => "Too Many Requests",
        431 => "Request Header Fields Too Large",
        500 => "Internal Server Error",
        501 => "Not Implemented",
        503 => "Service Unavailable",
        _ => "Unknown",
    }
}

impl Client {
    /// A client over `conn` outside the poll thread (tests of handlers).
    pub fn detached(conn: Conn, port: Port) -> Client {
        Client {
            conn,
            port,
            buf: Vec::new(),
            deadline: Instant::now() + HEAD_TIMEOUT,
            fresh: true,
            keep_alive: false,
            _slot: Slot(Arc::new(AtomicUsize::new(1))),
        }
    }

    /// Takes the bytes the client sent past its request head that were
    /// read with it (a session passes them on before the connection's own).
    pub(crate) fn take_read_ahead(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.buf)
    }

    /// The client's verified certificate (DER), on a TLS connection.
    pub(crate) fn peer_cert(&self) -> Option<Vec<u8>> {
        match &self.conn {
            Conn::Tls(_, c) => c
                .peer_certificates()
                .and_then(|certs| certs.first())
                .map(|c| c.as_ref().to_vec()),
            Conn::Plain(_) => None,
        }
    }

    /// Writes a whole answer with its `Content-Length`.
    pub(crate) fn respond(
        &mut self,
        status: u16,
        content_type: &str,
        body: &[u8],
    ) -> io::Result<()> {
        let _ = self.conn.tcp().set_write_timeout(Some(WRITE_TIMEOUT));
        let head = format!(
            "HTTP/1.1 {status} {}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nX-Content-Type-Options: nosniff\r\n{}\r\n",
            reason(status),
            body.len(),
            if self.keep_alive { "" } else { "Connection: close\r\n" }
        );
        let mut out = Vec::with_capacity(head.len() + body.len());
        out.extend_from_slice(head.as_bytes());
        out.extend_from_slice(body);
        self.conn.write_all(&out)?;
        self.conn.flush()
    }

    /// Plain text answer.
    pub fn text(&mut self, status: u16, body: &str) -> io::Result<()> {
        self.respond(status, "text/plain; charset=utf-8", body.as_bytes())
    }

    /// Starts a streamed answer (`Transfer-Encoding: chunked`); the
    /// connection is closed after it.
    pub(crate) fn chunked(&mut self, status: u16, content_type: &str) -> io::Result<Chunked<'_>> {
        self.keep_alive = false;
        let head = format!(
            "HTTP/1.1 {status} {}\r\nContent-Type: {content_type}\r\nTransfer-Encoding: chunked\r\nX-Content-Type-Options: nosniff\r\nConnection: close\r\n\r\n",
            reason(status)
        );
        self.conn.write_all(head.as_bytes())?;
        self.conn.flush()?;
        Ok(Chunked(&mut self.conn))
    }
}

/// A chunked body: each write is one chunk, flushed at once.
pub(crate) struct Chunked<'a>(&'a mut Conn);

impl Chunked<'_> {
    /// The last chunk.
    pub(crate) fn finish(self) -> io::Result<()> {
        self.0.write_all(b"0\r\n\r\n")?;
        self.0.flush()
    }
}

impl Write for Chunked<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        let mut out = Vec::with_capacity(buf.len() + 12);
        out.extend_from_slice(format!("{:x}\r\n", buf.len()).as_bytes());
        out.extend_from_slice(buf);
        out.extend_from_slice(b"\r\n");
        self.0.write_all(&out)?;
        self.0.flush()?;
        Ok(buf.len())
    }

    /// Also tells when the client has gone (closed or reset its end), so
    /// that a stream with nothing new to write, such as a quiet log's
    /// follow, ends with it rather than holding its session.
    fn flush(&mut self) -> io::Result<()> {
        self.0.flush()?;
        if peer_gone(self.0.tcp()) {
            return Err(io::Error::new(
                io::ErrorKind::BrokenPipe,
                "the client closed the connection",
            ));
        }
        Ok(())
    }
}

/// Whether the peer of `sock` has closed or reset the connection, by a
/// poll that does not wait. Bytes it sent meanwhile are left unread.
fn peer_gone(sock: &std::net::TcpStream) -> bool {
    let mut fd = libc::pollfd {
        fd: sock.as_raw_fd(),
        events: libc::POLLRDHUP,
        revents: 0,
    };
    // SAFETY: polls one initialised pollfd for an open socket, not waiting.
    let n = unsafe { libc::poll(&mut fd, 1, 0) };
    n > 0 && fd.revents & (libc::POLLRDHUP | libc::POLLHUP | libc::POLLERR) != 0
}

/// The running server; dropping it closes the listeners and every
/// waiting connection (requests being served finish).
pub struct Server {
    stop: Arc<AtomicBool>,
    wake: Arc<OwnedFd>,
    _poll: JoinOnDrop<()>,
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        wake(self.wake.as_raw_fd());
    }
}

fn wake(fd: RawFd) {
    // SAFETY: writes one byte from a live buffer to a pipe this server owns;
    // a full pipe (EAGAIN) already wakes the reader.
    unsafe {
        libc::write(fd, b"w".as_ptr().cast(), 1);
    }
}

struct Pool {
    jobs: Sender<Client>,
    queue: Receiver<Client>,
    /// Workers running, and how many wait for a job.
    counts: Mutex<(usize, usize)>,
    handler: Arc<dyn Handler>,
    back: Sender<Client>,
    wake: Arc<OwnedFd>,
    sessions: AtomicUsize,
    next_id: AtomicUsize,
}

/// Starts the poll thread over `listeners`.
pub(crate) fn start(listeners: Vec<Listener>, handler: Arc<dyn Handler>) -> io::Result<Server> {
    let mut fds = [0 as RawFd; 2];
    // SAFETY: pipe2 fills the two-element array on success.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_NONBLOCK | libc::O_CLOEXEC) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: both fds were just made and are owned here alone.
    let (wake_r, wake_w) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    let wake_w = Arc::new(wake_w);
    for l in &listeners {
        l.socket.set_nonblocking(true)?;
    }
    // Capacity: every open connection fits, so neither send ever waits.
    let (jobs, queue) = bounded(MAX_CONNS);
    let (back, back_rx) = bounded(MAX_CONNS);
    let pool = Arc::new(Pool {
        jobs,
        queue,
        counts: Mutex::new((0, 0)),
        handler,
        back,
        wake: wake_w.clone(),
        sessions: AtomicUsize::new(0),
        next_id: AtomicUsize::new(0),
    });
    let stop = Arc::new(AtomicBool::new(false));
    let poller = Poller {
        listeners,
        wake: wake_r,
        back: back_rx,
        pool,
        waiting: Vec::new(),
        open: Arc::new(AtomicUsize::new(0)),
        stop: stop.clone(),
    };
    let thread = spawn_named("server-poll", move || poller.run())?;
    Ok(Server {
        stop,
        wake: wake_w,
        _poll: thread,
    })
}

struct Poller {
    listeners: Vec<Listener>,
    wake: OwnedFd,
    back: Receiver<Client>,
    pool: Arc<Pool>,
    /// Connections waiting for a request, oldest first.
    waiting: Vec<Client>,
    open: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
}

impl Poller {
    fn run(mut self) {
        let mut fds: Vec<libc::pollfd> = Vec::new();
        while !self.stop.load(Ordering::Relaxed) {
            fds.clear();
            let pfd = |fd: RawFd| libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            };
            fds.push(pfd(self.wake.as_raw_fd()));
            fds.extend(self.listeners.iter().map(|l| pfd(l.socket.as_raw_fd())));
            fds.extend(self.waiting.iter().map(|c| pfd(c.conn.tcp().as_raw_fd())));
            let now = Instant::now();
            let timeout = self
                .waiting
                .iter()
                .map(|c| c.deadline.saturating_duration_since(now))
                .min()
                .unwrap_or(Duration::from_secs(60))
                .min(Duration::from_secs(60));
            let ms = timeout.as_millis().clamp(1, 60_000) as libc::c_int;
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
            for (i, mut c) in std::mem::take(&mut self.waiting).into_iter().enumerate() {
                let ev = fds.get(first + i).map_or(0, |f| f.revents);
                if ev & libc::POLLIN != 0 {
                    if !c.fresh {
                        c.deadline = now + HEAD_TIMEOUT;
                    }
                    self.pool.dispatch(c);
                } else if ev & (libc::POLLHUP | libc::POLLERR | libc::POLLNVAL) != 0 {
                    // The client went away.
                } else if now >= c.deadline {
                    debug!("node API: closing a connection idle past its deadline");
                } else {
                    keep.push(c);
                }
            }
            self.waiting = keep;
            for i in 0..self.listeners.len() {
                if fds[1 + i].revents != 0 {
                    self.accept(i, now);
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
            while let Ok(mut c) = self.back.try_recv() {
                c.deadline = Instant::now() + IDLE_TIMEOUT;
                self.waiting.push(c);
            }
        }
    }

    fn accept(&mut self, i: usize, now: Instant) {
        loop {
            let (stream, _) = match self.listeners[i].socket.accept() {
                Ok(s) => s,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    // Out of descriptors, or the like: try again at the next turn.
                    warn!("node API: accept: {e}");
                    return;
                }
            };
            if self.open.load(Ordering::Relaxed) >= MAX_CONNS {
                if self.waiting.is_empty() {
                    debug!("node API: {MAX_CONNS} connections open; closing a new one");
                    continue;
                }
                // The oldest connection still waiting makes room.
                self.waiting.remove(0);
            }
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
            self.open.fetch_add(1, Ordering::Relaxed);
            self.waiting.push(Client {
                conn,
                port: l.port,
                buf: Vec::new(),
                deadline: now + HEAD_TIMEOUT,
                fresh: true,
                keep_alive: true,
                _slot: Slot(self.open.clone()),
            });
        }
    }
}

impl Pool {
    fn dispatch(self: &Arc<Self>, c: Client) {
        let mut counts = self.counts.lock();
        if self.jobs.try_send(c).is_err() {
            return;
        }
        let (workers, idle) = *counts;
        if workers < MAX_WORKERS && self.queue.len() > idle {
            let id = self.next_id.fetch_add(1, Ordering::Relaxed);
            let pool = self.clone();
            match spawn_named(format!("server-worker/{id}"), move || pool.work()) {
                Ok(t) => {
                    t.detach();
                    counts.0 += 1;
                }
                Err(e) => warn!("node API: cannot start a worker: {e}"),
            }
        }
    }

    fn work(self: Arc<Self>) {
        loop {
            self.counts.lock().1 += 1;
            let got = self.queue.recv_timeout(WORKER_IDLE);
            {
                let mut counts = self.counts.lock();
                counts.1 -= 1;
                match &got {
                    Err(RecvTimeoutError::Timeout) if self.queue.is_empty() => {
                        counts.0 -= 1;
                        return;
                    }
                    Err(RecvTimeoutError::Disconnected) => {
                        counts.0 -= 1;
                        return;
                    }
                    _ => {}
                }
            }
            if let Ok(c) = got {
                self.serve(c);
            }
        }
    }

    /// Serves requests of `c` while its client sends them without pause;
    /// then hands it back to the poll thread or closes it.
    fn serve(self: &Arc<Self>, mut c: Client) {
        loop {
            c.fresh = false;
            let head = match read_head(&mut c) {
                Ok(h) => h,
                Err(Some(status)) => {
                    c.keep_alive = false;
                    let _ = c.text(status, reason(status));
                    return;
                }
                Err(None) => return,
            };
            if let Some(refused) = body_refused(&head) {
                c.keep_alive = false;
                let _ = c.text(refused, reason(refused));
                return;
            }
            match self.handler.handle(&mut c, &head) {
                Next::Done if c.keep_alive => {}
                Next::Done | Next::Close => return,
                Next::Session(run) => {
                    self.session(c, run);
                    return;
                }
            }
            if c.buf.is_empty() && !c.conn.holds_input() {
                // Nothing more sent yet: back to the poll thread.
                if self.back.try_send(c).is_ok() {
                    wake(self.wake.as_raw_fd());
                }
                return;
            }
            c.deadline = Instant::now() + HEAD_TIMEOUT;
        }
    }

    fn session(self: &Arc<Self>, mut c: Client, run: Box<dyn FnOnce(Client) + Send>) {
        if self.sessions.fetch_add(1, Ordering::Relaxed) >= MAX_SESSIONS {
            self.sessions.fetch_sub(1, Ordering::Relaxed);
            c.keep_alive = false;
            let _ = c.text(
                503,
                &format!("too many sessions on this node ({MAX_SESSIONS}); try again later\n"),
            );
            return;
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let pool = self.clone();
        let started = spawn_named(format!("server-session/{id}"), move || {
            run(c);
            pool.sessions.fetch_sub(1, Ordering::Relaxed);
        });
        match started {
            Ok(t) => t.detach(),
            Err(e) => {
                self.sessions.fetch_sub(1, Ordering::Relaxed);
                warn!("node API: cannot start a session: {e}");
            }
        }
    }
}

/// A request with a body is refused (413): no endpoint takes one.
fn body_refused(head: &RequestHead) -> Option<u16> {
    if head.header("transfer-encoding").is_some() {
        return Some(413);
    }
    match head
        .header("content-length")
        .map(|v| v.trim().parse::<u64>())
    {
        None | Some(Ok(0)) => None,
        Some(Ok(_)) => Some(413),
        Some(Err(_)) => Some(400),
    }
}

/// Reads and parses one request head before the client's deadline.
/// `Err(Some(status))`: answer that and close; `Err(None)`: just close.
fn read_head(c: &mut Client) -> Result<RequestHead, Option<u16>> {
    let mut chunk = [0u8; 4096];
    loop {
        if let Some(end) = c.buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let end = end + 4;
            let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
            let mut req = httparse::Request::new(&mut headers);
            let head = match req.parse(&c.buf[..end]) {
                Ok(httparse::Status::Complete(_)) => {
                    let version = req.version.unwrap_or(1);
                    let head = RequestHead {
                        method: req.method.unwrap_or("").to_string(),
                        target: req.path.unwrap_or("").to_string(),
                        headers: req
                            .headers
                            .iter()
                            .map(|h| {
                                (
                                    h.name.to_string(),
                                    String::from_utf8_lossy(h.value).into_owned(),
                                )
                            })
                            .collect(),
                    };
                    let conn = head.header("connection").unwrap_or("").to_ascii_lowercase();
                    c.keep_alive = if version == 0 {
                        conn.contains("keep-alive")
                    } else {
                        !conn.contains("close")
                    };
                    head
                }
                Err(httparse::Error::TooManyHeaders) => return Err(Some(431)),
                _ => return Err(Some(400)),
            };
            c.buf.drain(..end);
            return Ok(head);
        }
        if c.buf.len() > MAX_HEAD {
            return Err(Some(431));
        }
        let left = c.deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            debug!(
                "node API: no request head within {}s; closing",
                HEAD_TIMEOUT.as_secs()
            );
            return Err(None);
        }
        let _ = c.conn.tcp().set_read_timeout(Some(left));
        match c.conn.read(&mut chunk) {
            Ok(0) => return Err(None),
            Ok(n) => c.buf.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => {
                debug!("node API: reading a request: {e}");
                return Err(None);
            }
        }
    }
}
