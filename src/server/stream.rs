//! Exec, attach and port-forward sessions of the node's API (upstream's
//! `getExec`, `getAttach`, `getPortForward` and `proxyStream`).
//!
//! tinylet does not speak SPDY or WebSocket here, as the upstream kubelet
//! does not: it finds the container (or the ready sandbox) in the runtime
//! by its CRI labels, asks the runtime for a streaming URL (CRI `Exec`,
//! `Attach`, `PortForward`), replays the client's upgrade request there
//! with all its headers, hands the answer's head back, and on `101` copies
//! bytes both ways until either side ends.
//!
//! The copy runs on the caller's thread: one `poll(2)` loop over both
//! non-blocking sockets, one bounded buffer per direction, and the client's
//! TLS driven by hand (rustls cannot split a connection into halves), so
//! neither side can stall the other and an idle session costs no CPU.

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpStream, ToSocketAddrs};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use protobuf::{EnumOrUnknown, MessageField};

use super::conn::Conn;
use super::head::RequestHead;
use crate::cri::{api, CriError, RuntimeService};
use crate::runtime::labels;

/// Which session a request asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamKind {
    Exec,
    Attach,
    PortForward,
}

/// Bytes buffered per direction (beside rustls's own output buffer, which
/// is held to the same size on a TLS client).
const BUF: usize = 32 * 1024;
/// The largest response head taken from the runtime's streaming server.
const HEAD_MAX: usize = 16 * 1024;
/// The largest error answer relayed from the streaming server.
const ERROR_BODY_MAX: usize = 64 * 1024;
/// Connecting to, writing to and hearing back from the streaming server.
const BACKEND_TIMEOUT: Duration = Duration::from_secs(10);
/// Once one side has ended, how long the rest may go without progress.
const LINGER: Duration = Duration::from_secs(10);

/// Serves one already-authorized request for `/exec/...`, `/attach/...` or
/// `/portForward/...` on `conn` to its end: answers errors itself (plain
/// text: 400 bad parameters, 404 pod or container not found, 500 runtime
/// errors), or gets the runtime's streaming URL, connects at once, replays
/// the client's request there and relays bytes both ways until either side
/// closes. `early` is what the client sent after its request head that
/// was read with it: it reaches the streaming server first, once that has
/// switched protocols. With `idle`, a session that moves no byte either way
/// for that long is closed (upstream's `streamingConnectionIdleTimeout`).
pub fn serve(
    kind: StreamKind,
    mut conn: Conn,
    head: &RequestHead,
    early: &[u8],
    runtime: &dyn RuntimeService,
    idle: Option<Duration>,
) -> io::Result<()> {
    match session_url(kind, head, runtime) {
        Ok(url) => proxy(conn, head, early, &url, idle),
        Err((code, body)) => answer(&mut conn, code, &body),
    }
}

/// A refusal: status code and plain-text body.
type Refusal = (u16, String);

/// `/run/<namespace>/<pod>[/<uid>]/<container>?cmd=...`: runs `cmd` (split
/// at white space, as upstream splits it) in the container through the
/// runtime's ExecSync, and gives its output, stdout then stderr.
pub(crate) fn run_in_container(
    head: &RequestHead,
    runtime: &dyn RuntimeService,
) -> Result<Vec<u8>, (u16, String)> {
    let segs = head.path_args();
    if segs.iter().any(|s| s.is_empty()) {
        return Err(not_routed());
    }
    let (ns, pod, uid, name) = match segs.as_slice() {
        [ns, pod, c] => (ns, pod, None, c),
        [ns, pod, uid, c] => (ns, pod, Some(uid.as_str()), c),
        _ => return Err(not_routed()),
    };
    let cmd: Vec<String> = head
        .query_value("cmd")
        .unwrap_or_default()
        .split_whitespace()
        .map(str::to_string)
        .collect();
    if cmd.is_empty() {
        return Err((400, "cmd is required".into()));
    }
    let id = find_container(runtime, ns, pod, uid, name)?;
    let resp = runtime
        .exec_sync(&id, &cmd, Duration::ZERO)
        .map_err(runtime_refusal)?;
    let mut out = resp.stdout;
    out.extend_from_slice(&resp.stderr);
    Ok(out)
}

fn not_routed() -> Refusal {
    (404, "404 page not found\n".into())
}

/// The streaming URL for the request, or the answer that refuses it.
fn session_url(
    kind: StreamKind,
    head: &RequestHead,
    runtime: &dyn RuntimeService,
) -> Result<String, Refusal> {
    if head.method != "GET" && head.method != "POST" {
        return Err((405, "405: Method Not Allowed".into()));
    }
    // "/exec/ns/pod/c" splits into "", "exec", "ns", "pod", "c".
    let segs = head.path_args();
    if segs.iter().any(|s| s.is_empty()) {
        return Err(not_routed());
    }
    match kind {
        StreamKind::Exec | StreamKind::Attach => {
            let (ns, pod, uid, name) = match segs.as_slice() {
                [ns, pod, c] => (ns, pod, None, c),
                [ns, pod, uid, c] => (ns, pod, Some(uid.as_str()), c),
                _ => return Err(not_routed()),
            };
            let o = StreamOptions::from_query(head)?;
            let cmd = head.query_values("command");
            // Upstream passes an empty command on and the runtime fails it
            // (a 500); it is the client's mistake, so it is a 400 here.
            if kind == StreamKind::Exec && cmd.is_empty() {
                return Err((400, "command is required".into()));
            }
            let id = find_container(runtime, ns, pod, uid, name)?;
            let url = if kind == StreamKind::Exec {
                let mut req = api::ExecRequest::new();
                req.container_id = id;
                req.cmd = cmd;
                (req.tty, req.stdin, req.stdout, req.stderr) = (o.tty, o.stdin, o.stdout, o.stderr);
                runtime.exec(req)
            } else {
                let mut req = api::AttachRequest::new();
                req.container_id = id;
                (req.tty, req.stdin, req.stdout, req.stderr) = (o.tty, o.stdin, o.stdout, o.stderr);
                runtime.attach(req)
            };
            url.map_err(runtime_refusal)
        }
        StreamKind::PortForward => {
            let (ns, pod, uid) = match segs.as_slice() {
                [ns, pod] => (ns, pod, None),
                [ns, pod, uid] => (ns, pod, Some(uid.as_str())),
                _ => return Err(not_routed()),
            };
            let ports = port_options(head)?;
            let id = find_sandbox(runtime, ns, pod, uid)?;
            let mut req = api::PortForwardRequest::new();
            req.pod_sandbox_id = id;
            req.port = ports;
            runtime.port_forward(req).map_err(runtime_refusal)
        }
    }
}

/// The streams an exec or attach asks for (upstream's
/// `remotecommand.NewOptions`: the apiserver's `input`, `output`, `error`
/// and `tty` parameters, each on when it is `1`).
struct StreamOptions {
    stdin: bool,
    stdout: bool,
    stderr: bool,
    tty: bool,
}

impl StreamOptions {
    fn from_query(head: &RequestHead) -> Result<StreamOptions, Refusal> {
        let on = |name| head.query_value(name).as_deref() == Some("1");
        let mut o = StreamOptions {
            stdin: on("input"),
            stdout: on("output"),
            stderr: on("error"),
            tty: on("tty"),
        };
        // A terminal has one output stream: upstream drops stderr (the
        // runtime refuses tty with stderr).
        if o.tty {
            o.stderr = false;
        }
        if !o.stdin && !o.stdout && !o.stderr {
            return Err((
                400,
                "you must specify at least 1 of stdin, stdout, stderr".into(),
            ));
        }
        Ok(o)
    }
}

/// The ports of a WebSocket port-forward (`port`, repeated or
/// comma-separated), as upstream's `portforward.NewV4Options` reads them;
/// SPDY clients name their ports per stream instead.
fn port_options(head: &RequestHead) -> Result<Vec<i32>, Refusal> {
    if !is_websocket(head) {
        return Ok(Vec::new());
    }
    let values = head.query_values("port");
    if values.is_empty() {
        return Err((400, "query parameter \"port\" is required".into()));
    }
    let mut ports = Vec::new();
    for value in &values {
        if value.is_empty() {
            return Err((400, "query parameter \"port\" cannot be empty".into()));
        }
        for p in value.split(',') {
            let port: u16 = p.parse().map_err(|_| {
                let why = if !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()) {
                    "value out of range"
                } else {
                    "invalid syntax"
                };
                (
                    400,
                    format!(
                        "unable to parse {value:?} as a port: strconv.ParseUint: parsing {p:?}: {why}"
                    ),
                )
            })?;
            if port < 1 {
                return Err((400, format!("port {value:?} must be > 0")));
            }
            ports.push(i32::from(port));
        }
    }
    Ok(ports)
}

fn pod_selector(ns: &str, pod: &str, uid: Option<&str>) -> HashMap<String, String> {
    let mut sel = HashMap::from([
        (labels::POD_NAMESPACE.to_string(), ns.to_string()),
        (labels::POD_NAME.to_string(), pod.to_string()),
    ]);
    if let Some(uid) = uid {
        sel.insert(labels::POD_UID.to_string(), uid.to_string());
    }
    sel
}

/// The newest running container `name` of the pod. Upstream looks the pod
/// up in its pod manager first; here the runtime is asked, and a pod with
/// no sandbox at all is the pod that does not exist.
fn find_container(
    runtime: &dyn RuntimeService,
    ns: &str,
    pod: &str,
    uid: Option<&str>,
    name: &str,
) -> Result<String, Refusal> {
    let mut filter = api::ContainerFilter::new();
    filter.label_selector = pod_selector(ns, pod, uid);
    filter
        .label_selector
        .insert(labels::CONTAINER_NAME.to_string(), name.to_string());
    let mut state = api::ContainerStateValue::new();
    state.state = EnumOrUnknown::new(api::ContainerState::CONTAINER_RUNNING);
    filter.state = MessageField::some(state);
    let found = runtime
        .list_containers(Some(filter))
        .map_err(runtime_refusal)?;
    if let Some(c) = found.iter().max_by_key(|c| c.created_at) {
        return Ok(c.id.clone());
    }
    if list_sandboxes(runtime, ns, pod, None)?.is_empty() {
        return Err((404, "pod does not exist".into()));
    }
    // Upstream answers a missing container with a 500; it is a 404 here,
    // as the container is what the request named and did not find.
    Err((404, format!("container not found ({name:?})")))
}

/// The newest ready sandbox of the pod.
fn find_sandbox(
    runtime: &dyn RuntimeService,
    ns: &str,
    pod: &str,
    uid: Option<&str>,
) -> Result<String, Refusal> {
    let all = list_sandboxes(runtime, ns, pod, None)?;
    if all.is_empty() {
        return Err((404, "pod does not exist".into()));
    }
    let ours = |s: &&api::PodSandbox| {
        uid.is_none_or(|u| s.labels.get(labels::POD_UID).map(String::as_str) == Some(u))
    };
    if !all.iter().any(|s| ours(&s)) {
        return Err((404, "pod not found".into()));
    }
    all.iter()
        .filter(ours)
        .filter(|s| s.state.enum_value() == Ok(api::PodSandboxState::SANDBOX_READY))
        .max_by_key(|s| s.created_at)
        .map(|s| s.id.clone())
        // Upstream: a 500 with this text; see find_container.
        .ok_or_else(|| (404, format!("pod not found (\"{pod}_{ns}\")")))
}

fn list_sandboxes(
    runtime: &dyn RuntimeService,
    ns: &str,
    pod: &str,
    uid: Option<&str>,
) -> Result<Vec<api::PodSandbox>, Refusal> {
    let mut filter = api::PodSandboxFilter::new();
    filter.label_selector = pod_selector(ns, pod, uid);
    runtime
        .list_pod_sandbox(Some(filter))
        .map_err(runtime_refusal)
}

/// A failed CRI call as upstream's `streaming.WriteError` answers it: 404
/// for a runtime's NotFound, else 500, with the runtime's own message
/// (never the socket or anything else of tinylet's).
fn runtime_refusal(e: CriError) -> Refusal {
    log::warn!("server: streaming request: {e}");
    let code = if e.code() == Some(crate::cri::Code::NotFound) {
        404
    } else {
        500
    };
    let body = match &e {
        CriError::Status { message, .. } => message.clone(),
        _ => "the container runtime did not answer".into(),
    };
    (code, body)
}

/// Any `Connection` header naming `upgrade` (upstream's `IsUpgradeRequest`).
fn is_upgrade(head: &RequestHead) -> bool {
    head.headers.iter().any(|(n, v)| {
        n.eq_ignore_ascii_case("connection") && v.to_ascii_lowercase().contains("upgrade")
    })
}

/// Upstream's `IsWebSocketRequest`: the first `Connection` header names
/// `upgrade` and `Upgrade` is `websocket`.
fn is_websocket(head: &RequestHead) -> bool {
    head.header("connection")
        .is_some_and(|v| v.to_ascii_lowercase().contains("upgrade"))
        && head
            .header("upgrade")
            .is_some_and(|v| v.eq_ignore_ascii_case("websocket"))
}

/// Writes a plain-text answer and ends the connection.
fn answer(conn: &mut Conn, code: u16, body: &str) -> io::Result<()> {
    let reason = match code {
        400 => "Bad Request",
        404 => "Not Found",
        405 => "Method Not Allowed",
        _ => "Internal Server Error",
    };
    let text = format!(
        "HTTP/1.1 {code} {reason}\r\nContent-Type: text/plain; charset=utf-8\r\n\
         X-Content-Type-Options: nosniff\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    conn.write_all(text.as_bytes())?;
    conn.flush()?;
    close(conn);
    Ok(())
}

/// Ends the client connection: TLS close_notify (best effort), then FIN.
fn close(conn: &mut Conn) {
    if let Some((sock, tls)) = conn.tls_mut() {
        tls.send_close_notify();
        while tls.wants_write() {
            if !matches!(tls.write_tls(sock), Ok(n) if n > 0) {
                break;
            }
        }
    }
    let _ = conn.tcp().shutdown(Shutdown::Both);
}

/// `host:port` and `path?query` of an `http://` streaming URL.
fn split_url(url: &str) -> Option<(&str, &str)> {
    let rest = url.strip_prefix("http://")?;
    let (host, path) = match rest.find('/') {
        Some(i) => rest.split_at(i),
        None => (rest, "/"),
    };
    (!host.is_empty() && !host.contains('@')).then_some((host, path))
}

/// Replays the request to the streaming server and relays its answer.
fn proxy(
    mut conn: Conn,
    head: &RequestHead,
    early: &[u8],
    url: &str,
    idle: Option<Duration>,
) -> io::Result<()> {
    if !is_upgrade(head) {
        return answer(&mut conn, 500, "Upgrade request required\n");
    }
    // containerd's streaming server is plain HTTP unless configured with
    // TLS; a TLS streaming server is not supported.
    let Some((host, path)) = split_url(url) else {
        log::warn!("server: streaming URL {url:?} is not http://host/path");
        return answer(&mut conn, 500, "unsupported streaming URL\n");
    };
    let mut backend = match connect(host) {
        Ok(s) => s,
        Err(e) => return answer(&mut conn, 500, &format!("dial tcp {host}: {e}\n")),
    };
    let mut req = format!("{} {path} HTTP/1.1\r\nHost: {host}\r\n", head.method);
    for (n, v) in &head.headers {
        if !n.eq_ignore_ascii_case("host") {
            req.push_str(&format!("{n}: {v}\r\n"));
        }
    }
    req.push_str("\r\n");
    let mut from_backend = Buf::new();
    let status = match backend
        .write_all(req.as_bytes())
        .and_then(|()| read_head(&mut backend, &mut from_backend))
    {
        Ok(s) => s,
        Err(e) => {
            log::warn!("server: streaming server {host}: {e}");
            return answer(&mut conn, 500, &format!("error proxying to {host}: {e}\n"));
        }
    };
    if status.code != 101 {
        return relay_error(conn, backend, from_backend, status);
    }
    // Still blocking, within the backend's write timeout: at most a
    // request head's worth.
    backend.write_all(early)?;
    set_keepalive(conn.tcp());
    conn.tcp().set_nonblocking(true)?;
    backend.set_nonblocking(true)?;
    if let Some((_, tls)) = conn.tls_mut() {
        tls.set_buffer_limit(Some(BUF));
    }
    let result = relay(&mut conn, &mut backend, from_backend, idle);
    close(&mut conn);
    let _ = backend.shutdown(Shutdown::Both);
    result
}

fn connect(host: &str) -> io::Result<TcpStream> {
    let mut last = io::Error::new(io::ErrorKind::NotFound, "no address");
    for addr in host.to_socket_addrs()? {
        match TcpStream::connect_timeout(&addr, BACKEND_TIMEOUT) {
            Ok(s) => {
                s.set_read_timeout(Some(BACKEND_TIMEOUT))?;
                s.set_write_timeout(Some(BACKEND_TIMEOUT))?;
                s.set_nodelay(true)?;
                return Ok(s);
            }
            Err(e) => last = e,
        }
    }
    Err(last)
}

/// What the streaming server's response head says.
struct Status {
    code: u16,
    head_len: usize,
    content_length: Option<usize>,
}

/// Reads the response head into `buf` (with whatever followed it).
fn read_head(backend: &mut TcpStream, buf: &mut Buf) -> io::Result<Status> {
    let bad = |why: &str| io::Error::new(io::ErrorKind::InvalidData, why.to_string());
    loop {
        let mut headers = [httparse::EMPTY_HEADER; 32];
        let mut resp = httparse::Response::new(&mut headers);
        match resp.parse(buf.pending()) {
            Ok(httparse::Status::Complete(head_len)) => {
                let content_length = resp
                    .headers
                    .iter()
                    .find(|h| h.name.eq_ignore_ascii_case("content-length"))
                    .and_then(|h| std::str::from_utf8(h.value).ok()?.trim().parse().ok());
                return Ok(Status {
                    code: resp.code.ok_or_else(|| bad("no status code"))?,
                    head_len,
                    content_length,
                });
            }
            Ok(httparse::Status::Partial) => {}
            Err(e) => return Err(bad(&format!("bad response head: {e}"))),
        }
        if buf.pending().len() >= HEAD_MAX {
            return Err(bad("response head too large"));
        }
        let space = buf.space();
        let room = space.len().min(HEAD_MAX);
        match backend.read(&mut space[..room])? {
            0 => return Err(bad("connection closed before a response")),
            n => buf.fill(n),
        }
    }
}

/// Hands a refusal of the streaming server to the client (head and a
/// bounded body) and ends both connections.
fn relay_error(mut conn: Conn, mut backend: TcpStream, mut buf: Buf, st: Status) -> io::Result<()> {
    let want = st.head_len
        + st.content_length
            .unwrap_or(ERROR_BODY_MAX)
            .min(ERROR_BODY_MAX);
    let deadline = Instant::now() + BACKEND_TIMEOUT;
    let mut sent = 0;
    while sent < want {
        let part = &buf.pending()[..buf.pending().len().min(want - sent)];
        conn.write_all(part)?;
        sent += part.len();
        let n = part.len();
        buf.consume(n);
        if sent >= want || Instant::now() > deadline {
            break;
        }
        match backend.read(buf.space()) {
            Ok(0) | Err(_) => break,
            Ok(n) => buf.fill(n),
        }
    }
    conn.flush()?;
    close(&mut conn);
    let _ = backend.shutdown(Shutdown::Both);
    Ok(())
}

/// TCP keep-alive on the client's socket, so that a client that vanished
/// without a FIN ends its session within minutes; an idle session whose
/// client still answers stays open.
fn set_keepalive(sock: &TcpStream) {
    let fd = sock.as_raw_fd();
    let set = |level, name, value: libc::c_int| {
        // SAFETY: setsockopt on an open socket with a pointer to an int.
        unsafe {
            libc::setsockopt(
                fd,
                level,
                name,
                (&value as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        }
    };
    set(libc::SOL_SOCKET, libc::SO_KEEPALIVE, 1);
    set(libc::IPPROTO_TCP, libc::TCP_KEEPIDLE, 60);
    set(libc::IPPROTO_TCP, libc::TCP_KEEPINTVL, 15);
    set(libc::IPPROTO_TCP, libc::TCP_KEEPCNT, 4);
    // Unacknowledged data (a client gone while output is pending) ends it too.
    set(libc::IPPROTO_TCP, libc::TCP_USER_TIMEOUT, 120_000);
}

/// A bounded byte buffer: data in `start..end`.
struct Buf {
    data: Box<[u8]>,
    start: usize,
    end: usize,
}

impl Buf {
    fn new() -> Buf {
        Buf {
            data: vec![0; BUF].into_boxed_slice(),
            start: 0,
            end: 0,
        }
    }
    fn pending(&self) -> &[u8] {
        &self.data[self.start..self.end]
    }
    fn is_empty(&self) -> bool {
        self.start == self.end
    }
    fn has_space(&self) -> bool {
        self.end - self.start < self.data.len()
    }
    fn consume(&mut self, n: usize) {
        self.start += n;
        if self.start == self.end {
            (self.start, self.end) = (0, 0);
        }
    }
    /// The free room after the data (moved to the front first if needed).
    fn space(&mut self) -> &mut [u8] {
        if self.end == self.data.len() && self.start > 0 {
            self.data.copy_within(self.start..self.end, 0);
            (self.start, self.end) = (0, self.end - self.start);
        }
        &mut self.data[self.end..]
    }
    fn fill(&mut self, n: usize) {
        self.end += n;
    }
}

/// The outcome of one non-blocking read.
enum Got {
    Data,
    Nothing,
    End,
}

fn would_block(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
    )
}

fn read_into(r: &mut impl Read, buf: &mut Buf) -> io::Result<Got> {
    match r.read(buf.space()) {
        Ok(0) => Ok(Got::End),
        Ok(n) => {
            buf.fill(n);
            Ok(Got::Data)
        }
        Err(e) if would_block(&e) => Ok(Got::Nothing),
        Err(e) => Err(e),
    }
}

/// Writes what it can of `buf` to `w`; true when something went.
fn write_from(w: &mut impl Write, buf: &mut Buf) -> io::Result<bool> {
    if buf.is_empty() {
        return Ok(false);
    }
    match w.write(buf.pending()) {
        Ok(0) => Err(io::ErrorKind::WriteZero.into()),
        Ok(n) => {
            buf.consume(n);
            Ok(true)
        }
        Err(e) if would_block(&e) => Ok(false),
        Err(e) => Err(e),
    }
}

/// Reads from the client into `buf`: plain, or through its TLS state.
fn client_read(conn: &mut Conn, buf: &mut Buf) -> io::Result<Got> {
    let (sock, tls) = match conn {
        Conn::Plain(sock) => return read_into(sock, buf),
        Conn::Tls(sock, tls) => (sock, tls),
    };
    loop {
        match tls.reader().read(buf.space()) {
            Ok(0) => return Ok(Got::End),
            Ok(n) => {
                buf.fill(n);
                return Ok(Got::Data);
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(Got::End),
            Err(e) => return Err(e),
        }
        if !tls.wants_read() {
            return Ok(Got::Nothing);
        }
        match tls.read_tls(sock) {
            Ok(0) => return Ok(Got::End),
            Ok(_) => {
                tls.process_new_packets()
                    .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
            }
            Err(e) if would_block(&e) => return Ok(Got::Nothing),
            Err(e) => return Err(e),
        }
    }
}

/// Writes `buf` to the client: plain, or through its TLS state (as much
/// as rustls takes, then its records as far as the socket takes them).
fn client_write(conn: &mut Conn, buf: &mut Buf) -> io::Result<bool> {
    let (sock, tls) = match conn {
        Conn::Plain(sock) => return write_from(sock, buf),
        Conn::Tls(sock, tls) => (sock, tls),
    };
    let mut moved = false;
    if !buf.is_empty() {
        let n = tls.writer().write(buf.pending())?;
        buf.consume(n);
        moved = n > 0;
    }
    while tls.wants_write() {
        match tls.write_tls(sock) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(_) => moved = true,
            Err(e) if would_block(&e) => break,
            Err(e) => return Err(e),
        }
    }
    Ok(moved)
}

/// Whether the client has output waiting for its socket.
fn client_has_output(conn: &mut Conn, buf: &Buf) -> bool {
    match conn.tls_mut() {
        Some((_, tls)) => tls.wants_write(),
        None => !buf.is_empty(),
    }
}

/// Whether waiting for the client's socket to be readable makes sense.
fn client_takes_input(conn: &mut Conn, buf: &Buf) -> bool {
    buf.has_space() && conn.tls_mut().is_none_or(|(_, tls)| tls.wants_read())
}

/// Copies bytes both ways until either side ends (the other then gets
/// what was still buffered for it, within [`LINGER`] of no progress), or
/// no byte moved either way for `idle`.
fn relay(
    conn: &mut Conn,
    backend: &mut TcpStream,
    mut to_client: Buf,
    idle: Option<Duration>,
) -> io::Result<()> {
    let mut to_backend = Buf::new();
    let mut client_ended = false;
    let mut backend_ended = false;
    let mut backend_shut = false;
    let mut last_moved = Instant::now();
    loop {
        loop {
            let mut moved = false;
            if !backend_ended && to_client.has_space() {
                match read_into(backend, &mut to_client) {
                    Ok(Got::Data) => moved = true,
                    Ok(Got::Nothing) => {}
                    Ok(Got::End) | Err(_) => backend_ended = true,
                }
            }
            moved |= client_write(conn, &mut to_client)?;
            // Tried whenever there is room, not only when the socket could
            // be read: rustls may hold the rest of a record that did not
            // fit last time, and wants no read from the socket until it
            // is taken.
            if !client_ended && to_backend.has_space() {
                match client_read(conn, &mut to_backend) {
                    Ok(Got::Data) => moved = true,
                    Ok(Got::Nothing) => {}
                    Ok(Got::End) | Err(_) => client_ended = true,
                }
            }
            if !backend_shut {
                match write_from(backend, &mut to_backend) {
                    Ok(m) => moved |= m,
                    Err(_) => {
                        // The backend is gone: nothing more reaches it.
                        (backend_ended, backend_shut) = (true, true);
                        to_backend = Buf::new();
                    }
                }
            }
            if !moved {
                break;
            }
            last_moved = Instant::now();
        }
        // Everything the backend said has reached the client: done.
        if backend_ended && to_client.is_empty() && !client_has_output(conn, &to_client) {
            return Ok(());
        }
        // The client ended: pass the end on once its bytes are through, and
        // let the backend's last words reach a client that only half-closed.
        if client_ended && to_backend.is_empty() && !backend_shut {
            let _ = backend.shutdown(Shutdown::Write);
            backend_shut = true;
        }
        let backend_events = if backend_ended || !to_client.has_space() {
            0
        } else {
            libc::POLLIN
        } | if to_backend.is_empty() || backend_shut {
            0
        } else {
            libc::POLLOUT
        };
        let client_events = if !client_ended && client_takes_input(conn, &to_backend) {
            libc::POLLIN
        } else {
            0
        } | if client_has_output(conn, &to_client) {
            libc::POLLOUT
        } else {
            0
        };
        let mut fds = [
            libc::pollfd {
                fd: conn.tcp().as_raw_fd(),
                events: client_events,
                revents: 0,
            },
            libc::pollfd {
                // A side with nothing to wait for is left out, so that its
                // hang-up cannot wake the loop again and again.
                fd: if backend_events == 0 {
                    -1
                } else {
                    backend.as_raw_fd()
                },
                events: backend_events,
                revents: 0,
            },
        ];
        let timeout = if client_ended || backend_ended {
            LINGER.as_millis() as libc::c_int
        } else if let Some(idle) = idle {
            let left = idle.saturating_sub(last_moved.elapsed());
            if left.is_zero() {
                log::debug!(
                    "server: session idle for {}; closing it",
                    crate::apitime::go_duration(idle)
                );
                return Ok(());
            }
            // Rounded up, so that the wake-up comes at or after the deadline.
            left.as_millis()
                .saturating_add(1)
                .min(libc::c_int::MAX as u128) as libc::c_int
        } else {
            -1
        };
        // SAFETY: two valid pollfd entries.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), 2, timeout) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if n == 0 && (client_ended || backend_ended) {
            // One side ended and the rest made no progress for LINGER.
            return Ok(());
        }
        if fds[0].revents & (libc::POLLERR | libc::POLLHUP | libc::POLLNVAL) != 0 {
            // The client's connection is broken (reset, or closed both ways).
            return Ok(());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::thread::spawn_named;
    use crossbeam_channel::{bounded, Receiver};
    use parking_lot::Mutex;
    use std::net::TcpListener;
    use std::sync::Arc;

    const MIB: usize = 1 << 20;

    /// A runtime with one ready sandbox (pod `default/web`, uid `u1`) and
    /// one running container `app`; every streaming URL points at `url`.
    struct Runtime {
        url: String,
        sandboxes: Vec<api::PodSandbox>,
        containers: Vec<api::Container>,
        exec: Mutex<Option<api::ExecRequest>>,
    }

    fn labelled(ls: &[(&str, &str)]) -> HashMap<String, String> {
        ls.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn matches(sel: &HashMap<String, String>, labels: &HashMap<String, String>) -> bool {
        sel.iter().all(|(k, v)| labels.get(k) == Some(v))
    }

    impl Runtime {
        fn new(url: String) -> Runtime {
            let pod = [
                (labels::POD_NAMESPACE, "default"),
                (labels::POD_NAME, "web"),
                (labels::POD_UID, "u1"),
            ];
            let mut sb = api::PodSandbox::new();
            sb.id = "sb1".into();
            sb.labels = labelled(&pod);
            sb.state = EnumOrUnknown::new(api::PodSandboxState::SANDBOX_READY);
            let mut c = api::Container::new();
            c.id = "c1".into();
            c.labels = labelled(&pod);
            c.labels.insert(labels::CONTAINER_NAME.into(), "app".into());
            c.state = EnumOrUnknown::new(api::ContainerState::CONTAINER_RUNNING);
            Runtime {
                url,
                sandboxes: vec![sb],
                containers: vec![c],
                exec: Mutex::new(None),
            }
        }
    }

    fn no(method: &'static str) -> CriError {
        CriError::status(method, "", crate::cri::Code::Unimplemented, "no")
    }

    impl RuntimeService for Runtime {
        fn version(&self) -> Result<api::VersionResponse, CriError> {
            Err(no("Version"))
        }
        fn status(&self) -> Result<api::StatusResponse, CriError> {
            Err(no("Status"))
        }
        fn run_pod_sandbox(&self, _: &api::PodSandboxConfig, _: &str) -> Result<String, CriError> {
            Err(no("RunPodSandbox"))
        }
        fn stop_pod_sandbox(&self, _: &str) -> Result<(), CriError> {
            Err(no("StopPodSandbox"))
        }
        fn remove_pod_sandbox(&self, _: &str) -> Result<(), CriError> {
            Err(no("RemovePodSandbox"))
        }
        fn pod_sandbox_status(&self, _: &str) -> Result<api::PodSandboxStatus, CriError> {
            Err(no("PodSandboxStatus"))
        }
        fn list_pod_sandbox(
            &self,
            filter: Option<api::PodSandboxFilter>,
        ) -> Result<Vec<api::PodSandbox>, CriError> {
            let f = filter.unwrap_or_default();
            Ok(self
                .sandboxes
                .iter()
                .filter(|s| matches(&f.label_selector, &s.labels))
                .cloned()
                .collect())
        }
        fn create_container(
            &self,
            _: &str,
            _: &api::ContainerConfig,
            _: &api::PodSandboxConfig,
        ) -> Result<String, CriError> {
            Err(no("CreateContainer"))
        }
        fn start_container(&self, _: &str) -> Result<(), CriError> {
            Err(no("StartContainer"))
        }
        fn stop_container(&self, _: &str, _: i64) -> Result<(), CriError> {
            Err(no("StopContainer"))
        }
        fn remove_container(&self, _: &str) -> Result<(), CriError> {
            Err(no("RemoveContainer"))
        }
        fn list_containers(
            &self,
            filter: Option<api::ContainerFilter>,
        ) -> Result<Vec<api::Container>, CriError> {
            let f = filter.unwrap_or_default();
            Ok(self
                .containers
                .iter()
                .filter(|c| matches(&f.label_selector, &c.labels))
                .filter(|c| f.state.as_ref().is_none_or(|s| s.state == c.state))
                .cloned()
                .collect())
        }
        fn container_status(&self, _: &str) -> Result<api::ContainerStatus, CriError> {
            Err(no("ContainerStatus"))
        }
        fn exec_sync(
            &self,
            _: &str,
            _: &[String],
            _: Duration,
        ) -> Result<api::ExecSyncResponse, CriError> {
            Err(no("ExecSync"))
        }
        fn exec(&self, req: api::ExecRequest) -> Result<String, CriError> {
            *self.exec.lock() = Some(req);
            Ok(self.url.clone())
        }
        fn attach(&self, _: api::AttachRequest) -> Result<String, CriError> {
            Ok(self.url.clone())
        }
        fn port_forward(&self, req: api::PortForwardRequest) -> Result<String, CriError> {
            if req.pod_sandbox_id != "sb1" {
                return Err(CriError::status(
                    "PortForward",
                    "",
                    crate::cri::Code::NotFound,
                    "no such sandbox",
                ));
            }
            Ok(self.url.clone())
        }
    }

    /// A stuck relay fails the test instead of hanging it.
    fn bound_waits(s: &TcpStream) {
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        s.set_write_timeout(Some(Duration::from_secs(30))).unwrap();
        small_buffers(s.as_raw_fd());
    }

    /// Small socket buffers, so that the kernel cannot hide a relay that
    /// stops reading one side while it waits to write the other.
    fn small_buffers(fd: std::os::fd::RawFd) {
        for opt in [libc::SO_RCVBUF, libc::SO_SNDBUF] {
            let v: libc::c_int = 16 * 1024;
            // SAFETY: setsockopt on an open socket with a pointer to an int.
            let rc = unsafe {
                libc::setsockopt(
                    fd,
                    libc::SOL_SOCKET,
                    opt,
                    (&v as *const libc::c_int).cast(),
                    std::mem::size_of::<libc::c_int>() as libc::socklen_t,
                )
            };
            assert_eq!(rc, 0);
        }
    }

    fn read_until_head_end(s: &mut impl Read) -> Vec<u8> {
        let mut head = Vec::new();
        let mut b = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") {
            match s.read(&mut b) {
                Ok(1) => head.push(b[0]),
                _ => break,
            }
        }
        head
    }

    /// What the fake streaming server does after the request head.
    #[derive(Clone, Copy)]
    enum Backend {
        /// 101, then echoes until EOF, then closes.
        Echo,
        /// 101, then sends 1 MiB while it reads 1 MiB, then closes.
        Duplex,
        /// 101, then sends until the connection breaks.
        Flood,
        /// 404 with a body.
        NotFound,
    }

    fn pattern(seed: u8, n: usize) -> Vec<u8> {
        (0..n).map(|i| (i % 251) as u8 ^ seed).collect()
    }

    /// A fake streaming server for one connection; the receiver gets the
    /// request head it read, then what it received, once it is done.
    /// Test threads are detached, so that a stuck relay fails its test
    /// (a receive times out) instead of hanging it in a join.
    fn backend(mode: Backend) -> (String, Receiver<Vec<u8>>) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}/exec/tok?x=1", l.local_addr().unwrap());
        let (tx, rx) = bounded(4);
        spawn_named("test-backend", move || {
            let (mut s, _) = l.accept().unwrap();
            let _ = tx.send(read_until_head_end(&mut s));
            if let Backend::NotFound = mode {
                let _ =
                    s.write_all(b"HTTP/1.1 404 Not Found\r\nContent-Length: 9\r\n\r\nno token!");
                std::thread::sleep(Duration::from_millis(200));
                return;
            }
            s.write_all(
                b"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: test\r\n\r\n",
            )
            .unwrap();
            let mut got = Vec::new();
            let mut buf = [0u8; 16384];
            match mode {
                Backend::Echo => loop {
                    match s.read(&mut buf) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => {
                            got.extend_from_slice(&buf[..n]);
                            if s.write_all(&buf[..n]).is_err() {
                                break;
                            }
                        }
                    }
                },
                Backend::Duplex => {
                    let mut w = s.try_clone().unwrap();
                    let writer = spawn_named("test-backend-w", move || {
                        let _ = w.write_all(&pattern(0x55, MIB));
                    })
                    .unwrap();
                    while got.len() < MIB {
                        match s.read(&mut buf) {
                            Ok(0) | Err(_) => break,
                            Ok(n) => got.extend_from_slice(&buf[..n]),
                        }
                    }
                    drop(writer);
                }
                Backend::Flood => while s.write_all(&buf).is_ok() {},
                Backend::NotFound => {}
            }
            let _ = tx.send(got);
        })
        .unwrap()
        .detach();
        (url, rx)
    }

    fn head(target: &str, upgrade: bool) -> RequestHead {
        let mut headers = vec![("Host".to_string(), "node:10250".to_string())];
        if upgrade {
            headers.push(("Connection".into(), "Upgrade".into()));
            headers.push(("Upgrade".into(), "SPDY/3.1".into()));
            headers.push((
                "X-Stream-Protocol-Version".into(),
                "v4.channel.k8s.io".into(),
            ));
        }
        RequestHead {
            method: "POST".into(),
            target: target.into(),
            headers,
        }
    }

    fn request_text(h: &RequestHead) -> String {
        let mut t = format!("{} {} HTTP/1.1\r\n", h.method, h.target);
        for (n, v) in &h.headers {
            t.push_str(&format!("{n}: {v}\r\n"));
        }
        t + "\r\n"
    }

    /// Serves `h` on a loopback connection over plain TCP; returns the
    /// client's end and a receiver of serve's result.
    fn start_plain(
        kind: StreamKind,
        h: RequestHead,
        rt: Arc<Runtime>,
    ) -> (TcpStream, Receiver<io::Result<()>>) {
        start_plain_idle(kind, h, rt, None)
    }

    /// As [`start_plain`], with an idle timeout.
    fn start_plain_idle(
        kind: StreamKind,
        h: RequestHead,
        rt: Arc<Runtime>,
        idle: Option<Duration>,
    ) -> (TcpStream, Receiver<io::Result<()>>) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        small_buffers(l.as_raw_fd());
        let mut client = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        bound_waits(&client);
        let (server, _) = l.accept().unwrap();
        client.write_all(request_text(&h).as_bytes()).unwrap();
        let (tx, rx) = bounded(1);
        spawn_named("test-serve", move || {
            let mut server = server;
            read_until_head_end(&mut server);
            let _ = tx.send(serve(kind, Conn::Plain(server), &h, &[], rt.as_ref(), idle));
        })
        .unwrap()
        .detach();
        (client, rx)
    }

    fn answer_of(kind: StreamKind, target: &str, upgrade: bool) -> String {
        let rt = Arc::new(Runtime::new("http://127.0.0.1:1/x".into()));
        let (mut c, rx) = start_plain(kind, head(target, upgrade), rt);
        let mut out = String::new();
        c.read_to_string(&mut out).unwrap();
        rx.recv_timeout(Duration::from_secs(30)).unwrap().unwrap();
        out
    }

    #[test]
    fn bad_requests_are_answered_without_the_runtime_streaming() {
        use StreamKind::*;
        for (kind, target, upgrade, want) in [
            (Exec, "/exec/default/web/app", true, "400 Bad Request"),
            (
                Exec,
                "/exec/default/web/app?command=ls",
                true,
                "at least 1 of stdin, stdout, stderr",
            ),
            (
                Exec,
                "/exec/default/web/app?output=1",
                true,
                "command is required",
            ),
            (
                Exec,
                "/exec/default/nope/app?command=ls&output=1",
                true,
                "404 Not Found",
            ),
            (
                Exec,
                "/exec/default/nope/app?command=ls&output=1",
                true,
                "pod does not exist",
            ),
            (
                Exec,
                "/exec/default/web/db?command=ls&output=1",
                true,
                "container not found (\"db\")",
            ),
            (
                Exec,
                "/exec/default/web/u2/app?command=ls&output=1",
                true,
                "container not found",
            ),
            (
                Exec,
                "/exec/default/web?command=ls&output=1",
                true,
                "404 page not found",
            ),
            (
                Exec,
                "/exec/default/web/app/x/y?command=ls&output=1",
                true,
                "404 page not found",
            ),
            (
                Attach,
                "/attach/default/web//app?output=1",
                true,
                "404 page not found",
            ),
            (
                Attach,
                "/attach/default/web/app?output=1",
                false,
                "500 Internal",
            ),
            (
                Attach,
                "/attach/default/web/app?output=1",
                false,
                "Upgrade request required",
            ),
            (
                PortForward,
                "/portForward/default/web/u2",
                true,
                "pod not found",
            ),
            (
                PortForward,
                "/portForward/default/gone",
                true,
                "pod does not exist",
            ),
        ] {
            let out = answer_of(kind, target, upgrade);
            assert!(out.contains(want), "{target}: want {want:?} in {out:?}");
        }
        // A WebSocket port-forward names its ports in the query.
        let rt = Arc::new(Runtime::new("http://127.0.0.1:1/x".into()));
        for (q, want) in [
            ("", "query parameter \"port\" is required"),
            ("?port=", "query parameter \"port\" cannot be empty"),
            ("?port=80,x", "unable to parse \"80,x\" as a port"),
            ("?port=0", "port \"0\" must be > 0"),
        ] {
            let mut h = head(&format!("/portForward/default/web{q}"), false);
            h.headers.push(("Connection".into(), "Upgrade".into()));
            h.headers.push(("Upgrade".into(), "websocket".into()));
            let (mut c, rx) = start_plain(StreamKind::PortForward, h, rt.clone());
            let mut out = String::new();
            c.read_to_string(&mut out).unwrap();
            rx.recv_timeout(Duration::from_secs(30)).unwrap().unwrap();
            assert!(out.starts_with("HTTP/1.1 400 "), "{q}: {out}");
            assert!(out.contains(want), "{q}: want {want:?} in {out:?}");
        }
    }

    #[test]
    fn exec_options_reach_the_runtime_and_a_refusal_of_its_server_is_relayed() {
        let (url, heads) = backend(Backend::NotFound);
        let rt = Arc::new(Runtime::new(url));
        let target = "/exec/default/web/u1/app?command=sh&command=-c&command=echo+hi&input=1&output=1&error=1&tty=1";
        let (mut c, rx) = start_plain(StreamKind::Exec, head(target, true), rt.clone());
        let mut out = String::new();
        c.read_to_string(&mut out).unwrap();
        rx.recv_timeout(Duration::from_secs(30)).unwrap().unwrap();
        assert!(out.starts_with("HTTP/1.1 404 Not Found\r\n"), "{out}");
        assert!(out.ends_with("\r\n\r\nno token!"), "{out}");
        let req = rt.exec.lock().clone().unwrap();
        assert_eq!(req.container_id, "c1");
        assert_eq!(req.cmd, ["sh", "-c", "echo hi"]);
        // A terminal has no separate stderr.
        assert!(req.tty && req.stdin && req.stdout && !req.stderr);
        let sent = String::from_utf8(heads.recv().unwrap()).unwrap();
        assert!(
            sent.starts_with("POST /exec/tok?x=1 HTTP/1.1\r\n"),
            "{sent}"
        );
        assert!(
            sent.contains("\r\nX-Stream-Protocol-Version: v4.channel.k8s.io\r\n"),
            "{sent}"
        );
        assert!(sent.contains("\r\nUpgrade: SPDY/3.1\r\n"), "{sent}");
        assert!(!sent.contains("node:10250"), "Host replaced: {sent}");
    }

    /// Writes 1 MiB before reading anything, then reads slowly: the relay
    /// must keep taking the client's bytes while the backend's wait.
    fn duplex_mebibyte(client: &mut (impl Read + Write), got: &Receiver<Vec<u8>>) {
        let head = read_until_head_end(client);
        assert!(
            head.starts_with(b"HTTP/1.1 101 "),
            "{}",
            String::from_utf8_lossy(&head)
        );
        // Once the backend's bytes are on their way, the client's must
        // still go through while the client reads none of them.
        let mut back = vec![0u8; 1];
        client.read_exact(&mut back).unwrap();
        let sent = pattern(0xaa, MIB);
        for chunk in sent.chunks(50_000) {
            client.write_all(chunk).unwrap();
        }
        client.flush().unwrap();
        std::thread::sleep(Duration::from_millis(200));
        let mut buf = [0u8; 4096];
        loop {
            match client.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => back.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => break,
                Err(e) => panic!("client read: {e}"),
            }
            if back.len() % (64 * 1024) < 4096 {
                std::thread::sleep(Duration::from_millis(2));
            }
        }
        assert!(
            back == pattern(0x55, MIB),
            "backend's MiB: {} bytes",
            back.len()
        );
        let _head = got.recv_timeout(Duration::from_secs(30)).unwrap();
        let received = got.recv_timeout(Duration::from_secs(30)).unwrap();
        assert!(received == sent, "client's MiB: {} bytes", received.len());
    }

    #[test]
    fn a_mebibyte_each_way_with_a_slow_reader_over_plain_tcp() {
        let (url, got) = backend(Backend::Duplex);
        let rt = Arc::new(Runtime::new(url));
        let target = "/exec/default/web/app?command=cat&input=1&output=1";
        let (mut c, rx) = start_plain(StreamKind::Exec, head(target, true), rt);
        duplex_mebibyte(&mut c, &got);
        rx.recv_timeout(Duration::from_secs(30)).unwrap().unwrap();
    }

    #[test]
    fn a_session_without_traffic_for_the_idle_timeout_is_closed() {
        let (url, got) = backend(Backend::Echo);
        let rt = Arc::new(Runtime::new(url));
        let target = "/attach/default/web/app?input=1&output=1";
        let idle = Some(Duration::from_millis(300));
        let (mut c, rx) = start_plain_idle(StreamKind::Attach, head(target, true), rt, idle);
        assert!(read_until_head_end(&mut c).starts_with(b"HTTP/1.1 101 "));
        // Traffic keeps it open past the timeout ...
        for _ in 0..4 {
            c.write_all(b"ping").unwrap();
            let mut b = [0u8; 4];
            c.read_exact(&mut b).unwrap();
            assert_eq!(&b, b"ping");
            std::thread::sleep(Duration::from_millis(100));
        }
        // ... and silence both ways closes it (without the timeout neither
        // side would ever end it: the receive below would time out).
        rx.recv_timeout(Duration::from_secs(30))
            .expect("the idle session was closed")
            .unwrap();
        let mut rest = Vec::new();
        let _ = c.read_to_end(&mut rest);
        assert!(rest.is_empty(), "{rest:?}");
        got.recv_timeout(Duration::from_secs(30)).unwrap();
        assert_eq!(got.recv_timeout(Duration::from_secs(30)).unwrap().len(), 16);
    }

    #[test]
    fn a_client_that_goes_away_ends_the_session() {
        // The backend waits for more (echo): the client's FIN is passed on.
        let (url, got) = backend(Backend::Echo);
        let rt = Arc::new(Runtime::new(url));
        let target = "/attach/default/web/app?input=1&output=1";
        let (mut c, rx) = start_plain(StreamKind::Attach, head(target, true), rt);
        assert!(read_until_head_end(&mut c).starts_with(b"HTTP/1.1 101 "));
        c.write_all(b"ping").unwrap();
        let mut b = [0u8; 4];
        c.read_exact(&mut b).unwrap();
        assert_eq!(&b, b"ping");
        drop(c);
        rx.recv_timeout(Duration::from_secs(30)).unwrap().unwrap();
        got.recv_timeout(Duration::from_secs(30)).unwrap();
        assert_eq!(got.recv_timeout(Duration::from_secs(30)).unwrap(), b"ping");

        // The backend floods a client that stops reading and vanishes.
        let (url, _got) = backend(Backend::Flood);
        let rt = Arc::new(Runtime::new(url));
        let (mut c, rx) = start_plain(StreamKind::Attach, head(target, true), rt);
        assert!(read_until_head_end(&mut c).starts_with(b"HTTP/1.1 101 "));
        let mut b = [0u8; 1000];
        c.read_exact(&mut b).unwrap();
        // Unread data makes close() send a reset.
        drop(c);
        let _ = rx.recv_timeout(Duration::from_secs(30)).unwrap();
    }

    /// CPU time (user + system, in clock ticks) a thread of this process
    /// has used so far.
    fn cpu_ticks(tid: libc::pid_t) -> u64 {
        let stat = std::fs::read_to_string(format!("/proc/self/task/{tid}/stat")).unwrap();
        // The fields after the command (which ends with the last ')').
        let rest = &stat[stat.rfind(')').unwrap() + 2..];
        let f: Vec<&str> = rest.split(' ').collect();
        f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap()
    }

    #[test]
    fn an_idle_session_waits_without_using_the_cpu() {
        let (url, _got) = backend(Backend::Echo);
        let rt = Arc::new(Runtime::new(url));
        let h = head("/attach/default/web/app?input=1&output=1", true);
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        bound_waits(&c);
        let (server, _) = l.accept().unwrap();
        c.write_all(request_text(&h).as_bytes()).unwrap();
        let (tx, rx) = bounded(2);
        spawn_named("test-serve", move || {
            // SAFETY: gettid has no preconditions.
            let _ = tx.send(Ok(unsafe { libc::gettid() }));
            let mut server = server;
            read_until_head_end(&mut server);
            let _ = tx.send(
                serve(
                    StreamKind::Attach,
                    Conn::Plain(server),
                    &h,
                    &[],
                    rt.as_ref(),
                    // The default idle timeout: a deadline, no wake-ups.
                    Some(Duration::from_secs(4 * 3600)),
                )
                .map(|()| 0),
            );
        })
        .unwrap()
        .detach();
        let tid = rx.recv().unwrap().unwrap();
        assert!(read_until_head_end(&mut c).starts_with(b"HTTP/1.1 101 "));
        c.write_all(b"x").unwrap();
        c.read_exact(&mut [0u8; 1]).unwrap();
        let before = cpu_ticks(tid);
        std::thread::sleep(Duration::from_secs(1));
        let used = cpu_ticks(tid) - before;
        // A loop that spins would use about a second (100 ticks).
        assert!(used < 30, "an idle second cost {used} ticks");
        // Still alive and relaying after the pause.
        c.write_all(b"y").unwrap();
        let mut b = [0u8; 1];
        c.read_exact(&mut b).unwrap();
        assert_eq!(&b, b"y");
        drop(c);
        rx.recv_timeout(Duration::from_secs(30)).unwrap().unwrap();
    }

    mod tls {
        use super::*;
        use rustls::pki_types::pem::PemObject;
        use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
        use std::path::Path;
        use std::process::Command;

        fn openssl(dir: &Path, args: &[&str]) {
            let out = Command::new("openssl")
                .args(args)
                .current_dir(dir)
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "openssl {args:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }

        /// A CA and a server certificate for 127.0.0.1; the configs of
        /// both ends.
        fn configs(dir: &Path) -> (Arc<rustls::ServerConfig>, Arc<rustls::ClientConfig>) {
            let ec = [
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:prime256v1",
                "-nodes",
            ];
            let mut args = vec!["req", "-x509", "-days", "2", "-subj", "/CN=test-ca"];
            args.extend(ec);
            args.extend([
                "-keyout",
                "ca.key",
                "-out",
                "ca.crt",
                "-addext",
                "basicConstraints=critical,CA:TRUE",
                "-addext",
                "keyUsage=critical,keyCertSign",
            ]);
            openssl(dir, &args);
            std::fs::write(
                dir.join("s.ext"),
                "subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\n",
            )
            .unwrap();
            let mut args = vec![
                "req",
                "-subj",
                "/CN=127.0.0.1",
                "-keyout",
                "s.key",
                "-out",
                "s.csr",
            ];
            args.extend(ec);
            openssl(dir, &args);
            openssl(
                dir,
                &[
                    "x509",
                    "-req",
                    "-in",
                    "s.csr",
                    "-CA",
                    "ca.crt",
                    "-CAkey",
                    "ca.key",
                    "-CAcreateserial",
                    "-days",
                    "2",
                    "-out",
                    "s.crt",
                    "-extfile",
                    "s.ext",
                ],
            );
            let provider = Arc::new(rustls::crypto::ring::default_provider());
            let chain = vec![CertificateDer::from_pem_file(dir.join("s.crt")).unwrap()];
            let key = PrivateKeyDer::from_pem_file(dir.join("s.key")).unwrap();
            let server = rustls::ServerConfig::builder_with_provider(provider.clone())
                .with_safe_default_protocol_versions()
                .unwrap()
                .with_no_client_auth()
                .with_single_cert(chain, key)
                .unwrap();
            let mut roots = rustls::RootCertStore::empty();
            roots
                .add(CertificateDer::from_pem_file(dir.join("ca.crt")).unwrap())
                .unwrap();
            let client = rustls::ClientConfig::builder_with_provider(provider)
                .with_safe_default_protocol_versions()
                .unwrap()
                .with_root_certificates(roots)
                .with_no_client_auth();
            (Arc::new(server), Arc::new(client))
        }

        /// The client's end, the backend's receiver, serve's result, and
        /// the certificates' directory.
        type TlsSession = (
            rustls::StreamOwned<rustls::ClientConnection, TcpStream>,
            Receiver<Vec<u8>>,
            Receiver<io::Result<()>>,
            tempfile::TempDir,
        );

        /// A TLS client of a session over a fresh connection; the
        /// receiver gets serve's result.
        fn start_tls(backend_mode: Backend) -> TlsSession {
            let dir = tempfile::tempdir().unwrap();
            let (server_cfg, client_cfg) = configs(dir.path());
            let (url, got) = backend(backend_mode);
            let rt = Arc::new(Runtime::new(url));
            let h = head("/exec/default/web/app?command=cat&input=1&output=1", true);
            let l = TcpListener::bind("127.0.0.1:0").unwrap();
            small_buffers(l.as_raw_fd());
            let sock = TcpStream::connect(l.local_addr().unwrap()).unwrap();
            bound_waits(&sock);
            let (server_sock, _) = l.accept().unwrap();
            let (tx, rx) = bounded(1);
            let hs = h.clone();
            spawn_named("test-serve", move || {
                let tls = rustls::ServerConnection::new(server_cfg).unwrap();
                let mut conn = Conn::Tls(server_sock, Box::new(tls));
                read_until_head_end(&mut conn);
                let _ = tx.send(serve(StreamKind::Exec, conn, &hs, &[], rt.as_ref(), None));
            })
            .unwrap()
            .detach();
            let name = ServerName::try_from("127.0.0.1").unwrap();
            let tls = rustls::ClientConnection::new(client_cfg, name).unwrap();
            let mut client = rustls::StreamOwned::new(tls, sock);
            client.write_all(request_text(&h).as_bytes()).unwrap();
            (client, got, rx, dir)
        }

        #[test]
        fn a_mebibyte_each_way_with_a_slow_reader_over_tls() {
            let (mut client, got, rx, _dir) = start_tls(Backend::Duplex);
            duplex_mebibyte(&mut client, &got);
            rx.recv_timeout(Duration::from_secs(30)).unwrap().unwrap();
        }

        #[test]
        fn a_tls_client_that_closes_ends_the_session() {
            let (mut client, got, rx, _dir) = start_tls(Backend::Echo);
            assert!(read_until_head_end(&mut client).starts_with(b"HTTP/1.1 101 "));
            client.write_all(b"ping").unwrap();
            let mut b = [0u8; 4];
            client.read_exact(&mut b).unwrap();
            assert_eq!(&b, b"ping");
            client.conn.send_close_notify();
            client.flush().unwrap();
            rx.recv_timeout(Duration::from_secs(30)).unwrap().unwrap();
            got.recv_timeout(Duration::from_secs(30)).unwrap();
            assert_eq!(got.recv_timeout(Duration::from_secs(30)).unwrap(), b"ping");
        }
    }
}
