//! The node API's HTTP/1.1 requests and answers, and the workers that
//! serve them. A connection comes here from the poll thread (`poll`) only
//! once its TLS handshake is done and a whole request head is read, so a
//! worker never waits on a client to send: at most [`MAX_WORKERS`]
//! `server-worker/N` threads, started on demand and ended after a minute
//! idle, each serve the requests a connection has sent and hand a
//! kept-alive connection back; long sessions go to `server-session/N`
//! threads, at most [`MAX_SESSIONS`]. Every answer has a write deadline:
//! a whole `respond` answer, and each chunk of a `chunked` one, must be
//! taken by the client within [`WRITE_TIMEOUT`], however slowly it reads.
//! A handler that panics is caught: its connection is closed and the
//! pool's counts stay right.

use std::io::{self, Write};
use std::net::{IpAddr, Ipv4Addr, TcpListener};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};
use log::warn;
use parking_lot::Mutex;

use super::conn::Conn;
use super::head::RequestHead;
use crate::thread::spawn_named;

/// Open connections at most on the main and read-only ports. Each costs
/// a descriptor, its `Client` and, on the main port, a rustls connection:
/// about 10 KiB while a handshake trickles in (the node API bench: 200 of
/// them, +2 MiB anonymous memory), at most about 60 KiB for a client that
/// sends a whole [`MAX_HEAD`] head over TLS (the head and one record); so
/// 512 slow clients cost 5 to 30 MiB, returned when they are closed.
pub(crate) const MAX_CONNS: usize = 512;
/// Connections from one IP address still in their TLS handshake or first
/// request head at most; past it that address's oldest such one is
/// closed, not another client's.
pub(crate) const MAX_PENDING_PER_IP: usize = 256;
/// Request-serving threads at most.
pub(crate) const MAX_WORKERS: usize = 4;
/// Sessions (container logs, exec, attach, port-forward) at most, each
/// a thread (a 256 KiB stack, mostly untouched, and two 32 KiB buffers);
/// above what one caller may hold (`sessions::PER_USER`).
pub(crate) const MAX_SESSIONS: usize = 64;
/// The TLS handshake and the first request head must be in within this
/// from accept; a later request's head within this from its first byte.
pub(crate) const HEAD_TIMEOUT: Duration = Duration::from_secs(10);
/// A kept-alive connection without a new request is closed after this.
pub(crate) const IDLE_TIMEOUT: Duration = Duration::from_secs(90);
/// An answer, or one chunk of a streamed answer, must be taken within this.
pub(crate) const WRITE_TIMEOUT: Duration = Duration::from_secs(30);
/// A request head beyond this gets 431.
pub(crate) const MAX_HEAD: usize = 32 * 1024;
/// A worker with nothing to do for this long ends.
const WORKER_IDLE: Duration = Duration::from_secs(60);
const MAX_HEADERS: usize = 100;

/// The bounds a server holds its clients to (tests shorten them).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    pub(crate) max_conns: usize,
    pub(crate) max_pending_per_ip: usize,
    pub(crate) head_timeout: Duration,
    pub(crate) idle_timeout: Duration,
    pub(crate) write_timeout: Duration,
}

impl Limits {
    /// The main and read-only ports'.
    pub(crate) const DEFAULT: Limits = Limits {
        max_conns: MAX_CONNS,
        max_pending_per_ip: MAX_PENDING_PER_IP,
        head_timeout: HEAD_TIMEOUT,
        idle_timeout: IDLE_TIMEOUT,
        write_timeout: WRITE_TIMEOUT,
    };
}

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
    /// The client's address.
    pub(crate) peer: IpAddr,
    /// Bytes read and not yet served: a request head being read, or what
    /// came past the last one.
    pub buf: Vec<u8>,
    /// How much of `buf` is known to hold no head's end.
    pub(crate) scanned: usize,
    /// When the poll thread closes it: the head deadline while a
    /// handshake or head is read, else the idle one.
    pub(crate) deadline: Instant,
    /// Not yet served a request: still in its handshake or first head.
    pub(crate) fresh: bool,
    /// Kept alive with nothing of a next request yet.
    pub(crate) idle: bool,
    /// Whether the connection stays open after this answer.
    pub(crate) keep_alive: bool,
    pub(crate) write_timeout: Duration,
    pub(crate) _slot: Slot,
}

/// Counts an open connection while it lives.
pub(crate) struct Slot(pub(crate) Arc<AtomicUsize>);

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
    /// A new connection, accepted at `now`.
    pub(crate) fn accepted(
        conn: Conn,
        port: Port,
        peer: IpAddr,
        now: Instant,
        limits: &Limits,
        open: &Arc<AtomicUsize>,
    ) -> Client {
        open.fetch_add(1, Ordering::Relaxed);
        Client {
            conn,
            port,
            peer,
            buf: Vec::new(),
            scanned: 0,
            deadline: now + limits.head_timeout,
            fresh: true,
            idle: false,
            keep_alive: true,
            write_timeout: limits.write_timeout,
            _slot: Slot(open.clone()),
        }
    }

    /// A client over `conn` outside the poll thread (tests of handlers).
    pub fn detached(conn: Conn, port: Port) -> Client {
        let open = Arc::new(AtomicUsize::new(0));
        let peer = IpAddr::V4(Ipv4Addr::UNSPECIFIED);
        let mut c = Client::accepted(conn, port, peer, Instant::now(), &Limits::DEFAULT, &open);
        c.keep_alive = false;
        c
    }

    /// Takes the bytes the client sent past its request head that were
    /// read with it (a session passes them on before the connection's own).
    pub(crate) fn take_read_ahead(&mut self) -> Vec<u8> {
        self.scanned = 0;
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

    /// Writes a whole answer with its `Content-Length`, all of it within
    /// the write deadline.
    pub(crate) fn respond(
        &mut self,
        status: u16,
        content_type: &str,
        body: &[u8],
    ) -> io::Result<()> {
        let deadline = Instant::now() + self.write_timeout;
        let head = format!(
            "HTTP/1.1 {status} {}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nX-Content-Type-Options: nosniff\r\n{}\r\n",
            reason(status),
            body.len(),
            if self.keep_alive { "" } else { "Connection: close\r\n" }
        );
        let mut out = Vec::with_capacity(head.len() + body.len());
        out.extend_from_slice(head.as_bytes());
        out.extend_from_slice(body);
        self.conn.write_all_by(&out, deadline)
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
        let timeout = self.write_timeout;
        self.conn
            .write_all_by(head.as_bytes(), Instant::now() + timeout)?;
        Ok(Chunked {
            conn: &mut self.conn,
            timeout,
        })
    }
}

/// A chunked body: each write is one chunk, written in full within the
/// write timeout from its start.
pub(crate) struct Chunked<'a> {
    conn: &'a mut Conn,
    timeout: Duration,
}

impl Chunked<'_> {
    /// The last chunk.
    pub(crate) fn finish(self) -> io::Result<()> {
        self.conn
            .write_all_by(b"0\r\n\r\n", Instant::now() + self.timeout)
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
        self.conn
            .write_all_by(&out, Instant::now() + self.timeout)?;
        Ok(buf.len())
    }

    /// Every chunk is written when `write` returns; this tells when the
    /// client has gone (closed or reset its end), so that a stream with
    /// nothing new to write, such as a quiet log's follow, ends with it
    /// rather than holding its session.
    fn flush(&mut self) -> io::Result<()> {
        if peer_gone(self.conn.tcp()) {
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

/// Wakes a poll thread through its pipe.
pub(crate) fn wake(fd: RawFd) {
    // SAFETY: writes one byte from a live buffer to a pipe this server owns;
    // a full pipe (EAGAIN) already wakes the reader.
    unsafe {
        libc::write(fd, b"w".as_ptr().cast(), 1);
    }
}

/// Where a connection whose head is in goes: the worker pool, or the
/// healthz thread's own serving (one request, then close).
pub(crate) trait Dispatch {
    fn dispatch(&self, c: Client);
}

/// The workers and sessions of the main and read-only ports.
pub(crate) struct Pool {
    jobs: Sender<Client>,
    queue: Receiver<Client>,
    /// Workers running, and how many wait for a job.
    counts: Mutex<(usize, usize)>,
    handler: Arc<dyn Handler>,
    /// Kept-alive connections back to the poll thread, which `wake` wakes.
    back: Sender<Client>,
    wake: Arc<OwnedFd>,
    limits: Limits,
    sessions: AtomicUsize,
    next_id: AtomicUsize,
}

impl Pool {
    pub(crate) fn new(
        handler: Arc<dyn Handler>,
        back: Sender<Client>,
        wake: Arc<OwnedFd>,
        limits: Limits,
    ) -> Pool {
        // Capacity: every open connection fits, so a send never waits.
        let (jobs, queue) = crossbeam_channel::bounded(limits.max_conns);
        Pool {
            jobs,
            queue,
            counts: Mutex::new((0, 0)),
            handler,
            back,
            wake,
            limits,
            sessions: AtomicUsize::new(0),
            next_id: AtomicUsize::new(0),
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
                // The connection goes with the panic; the worker stays.
                if catch_unwind(AssertUnwindSafe(|| self.serve(c))).is_err() {
                    warn!("node API: a request handler panicked; its connection is closed");
                }
            }
        }
    }

    /// Serves the requests of `c` whose heads are in; then hands it back
    /// to the poll thread (kept alive) or closes it.
    fn serve(self: &Arc<Self>, mut c: Client) {
        loop {
            c.fresh = false;
            let head = match parse_head(&mut c) {
                Parsed::Head(h) => h,
                Parsed::Refused(status) => {
                    c.keep_alive = false;
                    let _ = c.text(status, reason(status));
                    return;
                }
                Parsed::Partial => {
                    // Back to the poll thread for the rest.
                    let now = Instant::now();
                    c.idle = c.buf.is_empty();
                    c.deadline = now
                        + if c.idle {
                            self.limits.idle_timeout
                        } else {
                            self.limits.head_timeout
                        };
                    if self.back.try_send(c).is_ok() {
                        wake(self.wake.as_raw_fd());
                    }
                    return;
                }
            };
            match self.handler.handle(&mut c, &head) {
                Next::Done if c.keep_alive => {}
                Next::Done | Next::Close => return,
                Next::Session(run) => {
                    // The session's own blocking writes (an error answer)
                    // get a per-write timeout; its relay waits by poll.
                    let t = self.limits.write_timeout.max(Duration::from_millis(1));
                    let _ = c.conn.tcp().set_write_timeout(Some(t));
                    self.session(c, run);
                    return;
                }
            }
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
            if catch_unwind(AssertUnwindSafe(|| run(c))).is_err() {
                warn!("node API: a session panicked; its connection is closed");
            }
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

impl Dispatch for Arc<Pool> {
    fn dispatch(&self, c: Client) {
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
}

/// The healthz port's serving, on its own thread: one request per
/// connection, answered at once and closed. Its answers are a few hundred
/// bytes that a new connection's socket always takes, so it never waits
/// on a client (its write deadline is now).
pub(crate) struct Inline(pub(crate) Arc<dyn Handler>);

impl Dispatch for Inline {
    fn dispatch(&self, mut c: Client) {
        let served = catch_unwind(AssertUnwindSafe(|| match parse_head(&mut c) {
            Parsed::Head(head) => {
                c.keep_alive = false;
                self.0.handle(&mut c, &head);
            }
            Parsed::Refused(status) => {
                c.keep_alive = false;
                let _ = c.text(status, reason(status));
            }
            Parsed::Partial => {}
        }));
        if served.is_err() {
            warn!("node API: a healthz handler panicked; its connection is closed");
        }
    }
}

/// Whether `c.buf` holds a whole request head, or more than a head may be
/// (then the worker answers 431); remembers how far it looked.
pub(crate) fn head_in(c: &mut Client) -> bool {
    let from = c.scanned.saturating_sub(3);
    if c.buf[from..].windows(4).any(|w| w == b"\r\n\r\n") {
        return true;
    }
    c.scanned = c.buf.len();
    c.buf.len() > MAX_HEAD
}

enum Parsed {
    Head(RequestHead),
    /// Answer this status and close.
    Refused(u16),
    /// No whole head in the buffer yet.
    Partial,
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

/// Parses the request head at the start of `c.buf` (read there by the
/// poll thread) and takes it out; sets whether the connection is kept
/// alive after the answer.
fn parse_head(c: &mut Client) -> Parsed {
    let Some(end) = c.buf.windows(4).position(|w| w == b"\r\n\r\n") else {
        return if c.buf.len() > MAX_HEAD {
            Parsed::Refused(431)
        } else {
            Parsed::Partial
        };
    };
    let end = end + 4;
    if end > MAX_HEAD {
        return Parsed::Refused(431);
    }
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
        Err(httparse::Error::TooManyHeaders) => return Parsed::Refused(431),
        Ok(httparse::Status::Partial) | Err(_) => return Parsed::Refused(400),
    };
    c.buf.drain(..end);
    c.scanned = 0;
    if let Some(refused) = body_refused(&head) {
        return Parsed::Refused(refused);
    }
    Parsed::Head(head)
}
