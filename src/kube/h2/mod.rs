//! HTTP/2 (RFC 9113) for the heartbeat requests: one blocking TLS
//! connection, one request at a time on it.
//!
//! Upstream kubelet speaks HTTP/2 to the apiserver on every request. Here
//! only the heartbeat clone does (the node Lease renewed every 10 s and the
//! node status), because that is where it pays: after the first request
//! each header is an index into the HPACK table of the connection, so a
//! renewal's request head falls from about 330 bytes to about 15 and its
//! answer's from about 300 to under 100 (the apiserver's Date and Audit-Id
//! change each time; its flow-schema UIDs are indexed). Lists and watches
//! stay on HTTP/1.1, whose cost per request is nothing next to their
//! bodies.
//!
//! What is not needed is not here: no server push (turned off in our
//! SETTINGS), no priorities, no concurrent streams. Flow control is one
//! large window each way: the stream window covers the largest body read
//! ([`Limits::max_body`]), the connection's 1 GiB is topped up when
//! half is used. A server that does not pick "h2" in ALPN gets
//! [`H2Error::NotOffered`] and the caller goes on with HTTP/1.1.

mod hpack;

use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use super::nbhttp::Endpoint;

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

// Frame types.
const DATA: u8 = 0x0;
const HEADERS: u8 = 0x1;
const RST_STREAM: u8 = 0x3;
const SETTINGS: u8 = 0x4;
const PUSH_PROMISE: u8 = 0x5;
const PING: u8 = 0x6;
const GOAWAY: u8 = 0x7;
const WINDOW_UPDATE: u8 = 0x8;
const CONTINUATION: u8 = 0x9;

// Flags.
const END_STREAM: u8 = 0x1;
const ACK: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const PADDED: u8 = 0x8;
const PRIORITY: u8 = 0x20;

// Settings.
const SETTINGS_HEADER_TABLE_SIZE: u16 = 0x1;
const SETTINGS_ENABLE_PUSH: u16 = 0x2;
const SETTINGS_INITIAL_WINDOW_SIZE: u16 = 0x4;
const SETTINGS_MAX_FRAME_SIZE: u16 = 0x5;
const SETTINGS_MAX_HEADER_LIST_SIZE: u16 = 0x6;

/// RST_STREAM's REFUSED_STREAM: the server did not start on the request.
const REFUSED_STREAM: u32 = 0x7;

/// The frame size every peer must take, and the largest we read.
const MAX_FRAME: usize = 16_384;
/// The largest decoded answer head (as the HTTP/1.1 client's).
const MAX_HEADER_LIST: usize = 16 * 1024;
/// Our receive window for the connection.
const CONNECTION_WINDOW: u32 = 1 << 30;
/// The window both sides start with.
const DEFAULT_WINDOW: u32 = 65_535;

/// How a request went wrong.
#[derive(Debug)]
pub(crate) enum H2Error {
    /// The server did not choose HTTP/2: go on with HTTP/1.1.
    NotOffered,
    /// The request surely was not acted on (the connection was closed
    /// before any of the answer came, or the server refused the stream); it
    /// may be sent again on a new connection.
    Retryable(String),
    Failed(String),
}

/// An answer: status, the Retry-After seconds if given, the body.
pub(crate) struct Answer {
    pub(crate) status: u16,
    pub(crate) retry_after: Option<u64>,
    pub(crate) body: Vec<u8>,
}

/// One request: pseudo-headers come from these, `headers` follow them.
pub(crate) struct Request<'a> {
    pub(crate) method: &'a str,
    /// The path with its query.
    pub(crate) path: &'a str,
    pub(crate) headers: &'a [(&'a str, &'a str)],
    pub(crate) body: &'a [u8],
}

/// How long a request waits for the one before it on the connection. A
/// heartbeat takes milliseconds; one stuck on a silent server would hold
/// the next for its whole timeout.
const QUEUE_WAIT: Duration = Duration::from_millis(250);

/// The heartbeat connection of one client: at most one, opened when first
/// needed and again after it failed.
/// What the HTTP/1.1 client allows too.
#[derive(Clone, Copy)]
pub(crate) struct Limits {
    /// The largest answer body read (also our window for one stream).
    pub(crate) max_body: u32,
    /// How long an idle connection is used again.
    pub(crate) idle: Duration,
}

pub(crate) struct Slot {
    limits: Limits,
    conn: Mutex<Option<Connection>>,
    /// A clone of the open connection's socket, to shut it down while a
    /// request holds `conn` ([`Slot::close`]).
    socket: Mutex<Option<TcpStream>>,
    /// Counts [`Slot::close`] calls: a connection opened before the last
    /// one is not used again.
    closes: AtomicU64,
    /// The server did not choose HTTP/2: requests that were waiting for
    /// the connection learn it without trying again.
    not_offered: AtomicBool,
}

impl Slot {
    pub(crate) fn new(limits: Limits) -> Slot {
        Slot {
            limits,
            conn: Mutex::new(None),
            socket: Mutex::new(None),
            closes: AtomicU64::new(0),
            not_offered: AtomicBool::new(false),
        }
    }

    /// Sends `request` on the open connection, or on a new one to
    /// `endpoint`, and waits at most `timeout` for the whole answer. None
    /// when another request has held the connection for [`QUEUE_WAIT`]: the
    /// caller sends this one another way rather than wait behind one that
    /// may be stuck.
    pub(crate) fn send(
        &self,
        endpoint: &Endpoint,
        request: &Request<'_>,
        timeout: Duration,
    ) -> Option<Result<Answer, H2Error>> {
        let mut guard = self.conn.try_lock_for(QUEUE_WAIT)?;
        if self.not_offered.load(Ordering::SeqCst) {
            return Some(Err(H2Error::NotOffered));
        }
        let deadline = Instant::now() + timeout;
        let closes = self.closes.load(Ordering::SeqCst);
        let reused = guard
            .take()
            .filter(|c| c.usable() && c.opened_after == closes);
        let fresh = reused.is_none();
        let mut conn = match reused {
            Some(c) => c,
            None => match self.connect(endpoint, deadline) {
                Ok(c) => c,
                Err(e) => return Some(Err(e)),
            },
        };
        let mut result = conn.request(request, deadline);
        if !fresh && matches!(result, Err(H2Error::Retryable(_))) {
            // A connection the server had closed while it sat idle, or one
            // it is winding down: once more, on a new one.
            conn.shutdown();
            conn = match self.connect(endpoint, deadline) {
                Ok(c) => c,
                Err(e) => return Some(Err(e)),
            };
            result = conn.request(request, deadline);
        }
        if result.is_ok() && conn.usable() {
            *guard = Some(conn);
        } else {
            conn.shutdown();
            *self.socket.lock() = None;
        }
        Some(result)
    }

    /// Closes the connection, in use or idle: a request on it fails at once.
    pub(crate) fn close(&self) {
        self.closes.fetch_add(1, Ordering::SeqCst);
        if let Some(s) = self.socket.lock().take() {
            let _ = s.shutdown(Shutdown::Both);
        }
    }

    fn connect(&self, endpoint: &Endpoint, deadline: Instant) -> Result<Connection, H2Error> {
        let closes = self.closes.load(Ordering::SeqCst);
        let opened = Connection::open(endpoint, self.limits, deadline);
        if matches!(opened, Err(H2Error::NotOffered)) {
            self.not_offered.store(true, Ordering::SeqCst);
        }
        let mut conn = opened?;
        conn.opened_after = closes;
        log::info!("{}: heartbeats over HTTP/2", endpoint.authority);
        *self.socket.lock() = conn.tls.sock.try_clone().ok();
        Ok(conn)
    }
}

/// How long the time left until `deadline` is, as a socket timeout (never
/// zero, which would mean none).
fn left(deadline: Instant) -> io::Result<Duration> {
    let now = Instant::now();
    if now >= deadline {
        return Err(io::Error::new(io::ErrorKind::TimedOut, "timed out"));
    }
    Ok((deadline - now).max(Duration::from_millis(1)))
}

/// An open HTTP/2 connection and its state.
struct Connection {
    tls: rustls::StreamOwned<rustls::ClientConnection, TcpStream>,
    authority: String,
    encoder: hpack::Encoder,
    decoder: hpack::Decoder,
    next_stream: u32,
    /// The server's limits on what we send.
    send_window: i64,
    stream_window_initial: i64,
    max_frame: usize,
    /// How much of our connection window is left.
    recv_window: i64,
    /// Frames to go out with the next write (acknowledgements, window
    /// updates), so they share its TLS record.
    pending: Vec<u8>,
    /// Nothing more may be sent: GOAWAY came, or the connection broke.
    done: bool,
    last_used: Instant,
    limits: Limits,
    /// The slot's close count when this was opened.
    opened_after: u64,
}

/// A frame as read: type, flags, stream, payload.
struct Frame {
    kind: u8,
    flags: u8,
    stream: u32,
    payload: Vec<u8>,
}

fn frame_into(out: &mut Vec<u8>, kind: u8, flags: u8, stream: u32, payload: &[u8]) {
    let len = payload.len() as u32;
    out.extend_from_slice(&len.to_be_bytes()[1..]);
    out.push(kind);
    out.push(flags);
    out.extend_from_slice(&(stream & 0x7fff_ffff).to_be_bytes());
    out.extend_from_slice(payload);
}

fn window_update(out: &mut Vec<u8>, stream: u32, increment: u32) {
    frame_into(out, WINDOW_UPDATE, 0, stream, &increment.to_be_bytes());
}

impl Connection {
    /// TCP, TLS with ALPN "h2", and our preface and SETTINGS (sent with the
    /// first request, not waited on: the server's SETTINGS are read with
    /// the first answer).
    fn open(endpoint: &Endpoint, limits: Limits, deadline: Instant) -> Result<Connection, H2Error> {
        let failed = |what: &str, e: &dyn std::fmt::Display| {
            H2Error::Failed(format!("{}: {what}: {e}", endpoint.authority))
        };
        let Some((config, name)) = &endpoint.tls else {
            // No cleartext HTTP/2 ("h2c"): a plain server is a test's.
            return Err(H2Error::NotOffered);
        };
        let addrs = (endpoint.host.as_str(), endpoint.port)
            .to_socket_addrs()
            .map_err(|e| failed("resolve", &e))?;
        let mut last = io::Error::new(io::ErrorKind::NotFound, "no address");
        let mut tcp = None;
        for addr in addrs {
            match left(deadline).and_then(|t| TcpStream::connect_timeout(&addr, t)) {
                Ok(s) => {
                    tcp = Some(s);
                    break;
                }
                Err(e) => last = e,
            }
        }
        let tcp = tcp.ok_or_else(|| failed("connect", &last))?;
        let _ = tcp.set_nodelay(true);
        let mut h2_config = rustls::ClientConfig::clone(config);
        h2_config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        let tls = rustls::ClientConnection::new(Arc::new(h2_config), name.clone())
            .map_err(|e| failed("TLS", &e))?;
        let mut tls = rustls::StreamOwned::new(tls, tcp);
        while tls.conn.is_handshaking() {
            let t = left(deadline).map_err(|e| failed("TLS handshake", &e))?;
            let _ = tls.sock.set_read_timeout(Some(t));
            let _ = tls.sock.set_write_timeout(Some(t));
            tls.conn
                .complete_io(&mut tls.sock)
                .map_err(|e| failed("TLS handshake", &e))?;
        }
        if tls.conn.alpn_protocol() != Some(b"h2") {
            let _ = tls.sock.shutdown(Shutdown::Both);
            return Err(H2Error::NotOffered);
        }
        let mut pending = PREFACE.to_vec();
        let mut settings = Vec::new();
        for (id, value) in [
            (SETTINGS_ENABLE_PUSH, 0),
            (SETTINGS_INITIAL_WINDOW_SIZE, limits.max_body),
            (SETTINGS_MAX_HEADER_LIST_SIZE, MAX_HEADER_LIST as u32),
        ] {
            settings.extend_from_slice(&id.to_be_bytes());
            settings.extend_from_slice(&value.to_be_bytes());
        }
        frame_into(&mut pending, SETTINGS, 0, 0, &settings);
        window_update(&mut pending, 0, CONNECTION_WINDOW - DEFAULT_WINDOW);
        Ok(Connection {
            tls,
            authority: endpoint.authority.clone(),
            encoder: hpack::Encoder::new(),
            decoder: hpack::Decoder::new(),
            next_stream: 1,
            send_window: i64::from(DEFAULT_WINDOW),
            stream_window_initial: i64::from(DEFAULT_WINDOW),
            max_frame: MAX_FRAME,
            recv_window: i64::from(CONNECTION_WINDOW),
            pending,
            done: false,
            last_used: Instant::now(),
            limits,
            opened_after: 0,
        })
    }

    /// Whether a new request may go on this connection: not closed, no
    /// stream ids used up, not idle for so long that the server or a
    /// middlebox has likely dropped it.
    fn usable(&self) -> bool {
        !self.done && self.next_stream < 0x7fff_0000 && self.last_used.elapsed() < self.limits.idle
    }

    fn shutdown(&mut self) {
        self.done = true;
        let _ = self.tls.sock.shutdown(Shutdown::Both);
    }

    fn failed(&self, what: &str) -> H2Error {
        H2Error::Failed(format!("{}: {what}", self.authority))
    }

    fn request(&mut self, req: &Request<'_>, deadline: Instant) -> Result<Answer, H2Error> {
        let result = self.exchange(req, deadline);
        self.last_used = Instant::now();
        if result.is_err() {
            self.done = true;
        }
        result
    }

    fn exchange(&mut self, req: &Request<'_>, deadline: Instant) -> Result<Answer, H2Error> {
        let stream = self.next_stream;
        self.next_stream += 2;
        let mut headers = vec![
            (":method", req.method),
            (":scheme", "https"),
            (":authority", self.authority.as_str()),
            (":path", req.path),
        ];
        headers.extend_from_slice(req.headers);
        let block = self.encoder.encode(&headers);
        if block.len() > self.max_frame {
            return Err(self.failed("the request head is larger than a frame"));
        }
        let mut out = std::mem::take(&mut self.pending);
        let flags = if req.body.is_empty() {
            END_HEADERS | END_STREAM
        } else {
            END_HEADERS
        };
        frame_into(&mut out, HEADERS, flags, stream, &block);
        let mut stream_window = self.stream_window_initial;
        let mut body = req.body;
        // No answer byte has come yet: a closed connection is retryable.
        let mut answered = false;
        while !body.is_empty() {
            let room = self
                .send_window
                .min(stream_window)
                .min(self.max_frame as i64);
            if room <= 0 {
                // Out of window: send what we have and wait for WINDOW_UPDATE.
                self.write(&out, deadline, answered)?;
                out.clear();
                let before = (self.send_window, stream_window);
                while (self.send_window, stream_window) == before {
                    let f = self.read_frame(deadline, answered)?;
                    if f.stream == stream && f.kind == WINDOW_UPDATE {
                        stream_window += i64::from(increment(&f.payload)?);
                    } else if f.stream == stream {
                        // The server answered before taking the whole body.
                        return Err(self.failed("the server answered before the body was sent"));
                    } else {
                        self.control(&f, deadline)?;
                        answered = true;
                    }
                }
                continue;
            }
            let n = (room as usize).min(body.len());
            let flags = if n == body.len() { END_STREAM } else { 0 };
            frame_into(&mut out, DATA, flags, stream, &body[..n]);
            self.send_window -= n as i64;
            stream_window -= n as i64;
            body = &body[n..];
        }
        self.write(&out, deadline, answered)?;
        self.read_answer(stream, deadline, answered)
    }

    fn read_answer(
        &mut self,
        stream: u32,
        deadline: Instant,
        mut answered: bool,
    ) -> Result<Answer, H2Error> {
        let mut status = None;
        let mut retry_after = None;
        let mut body = Vec::new();
        loop {
            let f = self.read_frame(deadline, answered)?;
            if f.stream != stream {
                self.control(&f, deadline)?;
                if f.kind == GOAWAY && last_stream(&f.payload)? < stream {
                    return Err(H2Error::Retryable(format!(
                        "{}: the server is closing the connection (GOAWAY) without this request",
                        self.authority
                    )));
                }
                continue;
            }
            answered = true;
            match f.kind {
                HEADERS => {
                    let block = self.header_block(&f, deadline)?;
                    let list = self
                        .decoder
                        .decode(&block, MAX_HEADER_LIST)
                        .map_err(|e| self.failed(&format!("the answer's head: {e}")))?;
                    if status.is_none() {
                        let code = list
                            .iter()
                            .find(|(n, _)| n == ":status")
                            .and_then(|(_, v)| std::str::from_utf8(v).ok()?.parse::<u16>().ok())
                            .ok_or_else(|| self.failed("an answer without a :status"))?;
                        if (100..200).contains(&code) {
                            // An interim answer; the real one follows.
                            continue;
                        }
                        status = Some(code);
                        retry_after = list
                            .iter()
                            .find(|(n, _)| n == "retry-after")
                            .and_then(|(_, v)| std::str::from_utf8(v).ok()?.trim().parse().ok());
                    }
                    // Later HEADERS are trailers, which nothing here reads.
                }
                DATA => {
                    if status.is_none() {
                        return Err(self.failed("DATA before the answer's head"));
                    }
                    self.recv_window -= f.payload.len() as i64;
                    let data =
                        unpad(&f).ok_or_else(|| self.failed("a DATA frame with bad padding"))?;
                    let max = self.limits.max_body;
                    if body.len() + data.len() > max as usize {
                        return Err(H2Error::Failed(format!(
                            "the answer is larger than {max} bytes"
                        )));
                    }
                    body.extend_from_slice(data);
                }
                RST_STREAM => {
                    let code = increment(&f.payload).unwrap_or(0);
                    let message = format!(
                        "{}: the server reset the stream (code {code})",
                        self.authority
                    );
                    return Err(if code == REFUSED_STREAM {
                        H2Error::Retryable(message)
                    } else {
                        H2Error::Failed(message)
                    });
                }
                WINDOW_UPDATE | PRIORITY_FRAME => {}
                PUSH_PROMISE => return Err(self.failed("PUSH_PROMISE, which we turned off")),
                _ => {}
            }
            if f.flags & END_STREAM != 0 && matches!(f.kind, HEADERS | DATA) {
                if self.recv_window < i64::from(CONNECTION_WINDOW / 2) {
                    let top_up = i64::from(CONNECTION_WINDOW) - self.recv_window;
                    window_update(&mut self.pending, 0, top_up as u32);
                    self.recv_window = i64::from(CONNECTION_WINDOW);
                }
                return match status {
                    Some(status) => Ok(Answer {
                        status,
                        retry_after,
                        body,
                    }),
                    None => Err(self.failed("the stream ended before the answer's head")),
                };
            }
        }
    }

    /// The whole header block of a HEADERS frame and its CONTINUATIONs.
    fn header_block(&mut self, f: &Frame, deadline: Instant) -> Result<Vec<u8>, H2Error> {
        let mut block =
            fragment(f).ok_or_else(|| self.failed("a HEADERS frame with bad padding"))?;
        let mut flags = f.flags;
        while flags & END_HEADERS == 0 {
            let c = self.read_frame(deadline, true)?;
            if c.kind != CONTINUATION || c.stream != f.stream {
                return Err(self.failed("a header block interrupted"));
            }
            if block.len() + c.payload.len() > MAX_HEADER_LIST * 2 {
                return Err(self.failed("an answer's head too large"));
            }
            block.extend_from_slice(&c.payload);
            flags = c.flags;
        }
        Ok(block)
    }

    /// Acts on a frame that is not our stream's: connection control, or a
    /// frame of a stream we have given up on.
    fn control(&mut self, f: &Frame, deadline: Instant) -> Result<(), H2Error> {
        match (f.kind, f.stream) {
            (SETTINGS, 0) if f.flags & ACK == 0 => {
                if !f.payload.len().is_multiple_of(6) {
                    return Err(self.failed("a SETTINGS frame of a bad length"));
                }
                for s in f.payload.chunks_exact(6) {
                    let id = u16::from_be_bytes([s[0], s[1]]);
                    let value = u32::from_be_bytes([s[2], s[3], s[4], s[5]]);
                    match id {
                        SETTINGS_HEADER_TABLE_SIZE => self.encoder.set_limit(value as usize),
                        SETTINGS_INITIAL_WINDOW_SIZE if value <= 0x7fff_ffff => {
                            self.stream_window_initial = i64::from(value);
                        }
                        SETTINGS_MAX_FRAME_SIZE if (16_384..=16_777_215).contains(&value) => {
                            self.max_frame = value as usize;
                        }
                        SETTINGS_INITIAL_WINDOW_SIZE | SETTINGS_MAX_FRAME_SIZE => {
                            return Err(self.failed("a SETTINGS value out of range"));
                        }
                        _ => {}
                    }
                }
                frame_into(&mut self.pending, SETTINGS, ACK, 0, &[]);
            }
            (PING, 0) if f.flags & ACK == 0 => {
                frame_into(&mut self.pending, PING, ACK, 0, &f.payload);
            }
            (WINDOW_UPDATE, 0) => self.send_window += i64::from(increment(&f.payload)?),
            (GOAWAY, 0) => self.done = true,
            (DATA, _) => self.recv_window -= f.payload.len() as i64,
            (HEADERS, _) => {
                // Decoded all the same, to keep the HPACK table in step.
                if f.flags & END_HEADERS == 0 {
                    return Err(self.failed("a split header block on another stream"));
                }
                let block =
                    fragment(f).ok_or_else(|| self.failed("a HEADERS frame with bad padding"))?;
                self.decoder
                    .decode(&block, MAX_HEADER_LIST)
                    .map_err(|e| self.failed(&format!("a head on another stream: {e}")))?;
            }
            (PUSH_PROMISE, _) => return Err(self.failed("PUSH_PROMISE, which we turned off")),
            _ => {}
        }
        if !self.pending.is_empty() && matches!(f.kind, SETTINGS | PING) {
            // Acknowledged now: a server may wait for it.
            let out = std::mem::take(&mut self.pending);
            self.write(&out, deadline, true)?;
        }
        Ok(())
    }

    fn io_error(&self, what: &str, e: io::Error, answered: bool) -> H2Error {
        let message = format!("{}: {what}: {e}", self.authority);
        let closed = matches!(
            e.kind(),
            io::ErrorKind::UnexpectedEof
                | io::ErrorKind::ConnectionReset
                | io::ErrorKind::ConnectionAborted
                | io::ErrorKind::BrokenPipe
        );
        if closed && !answered {
            H2Error::Retryable(message)
        } else {
            H2Error::Failed(message)
        }
    }

    fn write(&mut self, bytes: &[u8], deadline: Instant, answered: bool) -> Result<(), H2Error> {
        let t = left(deadline).map_err(|e| self.io_error("sending", e, true))?;
        let _ = self.tls.sock.set_write_timeout(Some(t));
        let r = self.tls.write_all(bytes).and_then(|()| self.tls.flush());
        r.map_err(|e| self.io_error("sending", e, answered))
    }

    fn read_frame(&mut self, deadline: Instant, answered: bool) -> Result<Frame, H2Error> {
        let mut head = [0u8; 9];
        self.read_exact(&mut head, deadline, answered)?;
        let len = usize::from(head[0]) << 16 | usize::from(head[1]) << 8 | usize::from(head[2]);
        if len > MAX_FRAME {
            return Err(self.failed("a frame larger than we allow"));
        }
        let mut payload = vec![0; len];
        self.read_exact(&mut payload, deadline, true)?;
        Ok(Frame {
            kind: head[3],
            flags: head[4],
            stream: u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff,
            payload,
        })
    }

    fn read_exact(
        &mut self,
        buf: &mut [u8],
        deadline: Instant,
        answered: bool,
    ) -> Result<(), H2Error> {
        let mut at = 0;
        while at < buf.len() {
            let t = left(deadline).map_err(|e| self.io_error("waiting for the answer", e, true))?;
            let _ = self.tls.sock.set_read_timeout(Some(t));
            match self.tls.read(&mut buf[at..]) {
                Ok(0) => {
                    let e = io::Error::new(io::ErrorKind::UnexpectedEof, "connection closed");
                    return Err(self.io_error("reading", e, answered || at > 0));
                }
                Ok(n) => at += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    let e = io::Error::new(io::ErrorKind::TimedOut, "timed out");
                    return Err(self.io_error("waiting for the answer", e, true));
                }
                Err(e) => return Err(self.io_error("reading", e, answered || at > 0)),
            }
        }
        Ok(())
    }
}

/// PRIORITY frames carry nothing we use.
const PRIORITY_FRAME: u8 = 0x2;

/// A frame's payload without its padding; None when the padding is bad.
fn unpad(f: &Frame) -> Option<&[u8]> {
    if f.flags & PADDED == 0 {
        return Some(&f.payload);
    }
    let pad = usize::from(*f.payload.first()?);
    f.payload
        .len()
        .checked_sub(1 + pad)
        .map(|end| &f.payload[1..1 + end])
}

/// A HEADERS frame's header block fragment, without padding and priority.
fn fragment(f: &Frame) -> Option<Vec<u8>> {
    let b = unpad(f)?;
    let b = if f.flags & PRIORITY != 0 {
        b.get(5..)?
    } else {
        b
    };
    Some(b.to_vec())
}

/// A WINDOW_UPDATE's increment (or RST_STREAM's code: both are one word).
fn increment(payload: &[u8]) -> Result<u32, H2Error> {
    match payload {
        [a, b, c, d] => Ok(u32::from_be_bytes([*a, *b, *c, *d]) & 0x7fff_ffff),
        _ => Err(H2Error::Failed("a frame of a bad length".into())),
    }
}

/// A GOAWAY's last stream id.
fn last_stream(payload: &[u8]) -> Result<u32, H2Error> {
    match payload.get(..4) {
        Some(w) => increment(w),
        None => Err(H2Error::Failed("a GOAWAY frame too short".into())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_are_laid_out_as_the_wire_says() {
        let mut out = Vec::new();
        frame_into(&mut out, HEADERS, END_HEADERS, 3, b"abc");
        assert_eq!(out, [0, 0, 3, 1, 4, 0, 0, 0, 3, b'a', b'b', b'c']);
        out.clear();
        window_update(&mut out, 0, 0x1234_5678);
        assert_eq!(out, [0, 0, 4, 8, 0, 0, 0, 0, 0, 0x12, 0x34, 0x56, 0x78]);
    }

    #[test]
    fn padding_is_taken_off_and_bad_padding_refused() {
        let f = |flags, payload: &[u8]| Frame {
            kind: DATA,
            flags,
            stream: 1,
            payload: payload.to_vec(),
        };
        assert_eq!(unpad(&f(0, b"xy")), Some(&b"xy"[..]));
        assert_eq!(unpad(&f(PADDED, &[2, b'x', 0, 0])), Some(&b"x"[..]));
        assert_eq!(unpad(&f(PADDED, &[3, b'x', 0])), None);
        assert_eq!(unpad(&f(PADDED, &[])), None);
        assert!(last_stream(&[0, 0]).is_err());
        assert_eq!(increment(&[0xff, 0, 0, 1]).ok(), Some(0x7f00_0001));
    }
}
