//! HTTP/1.1 plumbing: reading requests with bounded lines and bodies,
//! writing responses (chunked above the threshold), plain and TLS
//! connections, and the identity in a client certificate. HTTP/2 framing
//! is in `h2`; the request and answer types here serve both.

use super::*;

pub(super) struct Request {
    pub(super) method: String,
    pub(super) path: String,
    pub(super) raw_query: String,
    query: Vec<(String, String)>,
    headers: Vec<(String, String)>,
    pub(super) body: Vec<u8>,
    pub(super) close: bool,
    /// It came over HTTP/2 (`super::h2`).
    pub(super) http2: bool,
}

impl Request {
    /// A request from its parts: `target` is split at `?` into the path and
    /// the raw query, whose pairs are percent-decoded; header names must be
    /// lowercase already.
    pub(super) fn new(
        method: String,
        target: &str,
        headers: Vec<(String, String)>,
        body: Vec<u8>,
        close: bool,
        http2: bool,
    ) -> Request {
        let (path, raw_query) = match target.split_once('?') {
            Some((p, q)) => (p.to_string(), q.to_string()),
            None => (target.to_string(), String::new()),
        };
        let query = raw_query
            .split('&')
            .filter(|p| !p.is_empty())
            .map(|p| match p.split_once('=') {
                Some((k, v)) => (percent_decode(k), percent_decode(v)),
                None => (percent_decode(p), String::new()),
            })
            .collect();
        Request {
            method,
            path,
            raw_query,
            query,
            headers,
            body,
            close,
            http2,
        }
    }
    pub(super) fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
    pub(super) fn param(&self, name: &str) -> Option<&str> {
        self.query
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
    pub(super) fn manager(&self) -> String {
        self.header("user-agent")
            .unwrap_or("")
            .split('/')
            .next()
            .unwrap_or("")
            .to_string()
    }
}

pub(super) fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'%' if i + 2 < b.len() => {
                let hex = std::str::from_utf8(&b[i + 1..i + 3]).unwrap_or("");
                match u8::from_str_radix(hex, 16) {
                    Ok(v) => {
                        out.push(v);
                        i += 3;
                        continue;
                    }
                    Err(_) => out.push(b'%'),
                }
            }
            b'+' => out.push(b' '),
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn read_line_limited<R: BufRead>(r: &mut R) -> io::Result<Option<String>> {
    let mut buf = Vec::new();
    let n = r
        .by_ref()
        .take(MAX_HEADER_LINE as u64)
        .read_until(b'\n', &mut buf)?;
    if n == 0 {
        return Ok(None);
    }
    while buf.last().is_some_and(|c| *c == b'\n' || *c == b'\r') {
        buf.pop();
    }
    Ok(Some(String::from_utf8_lossy(&buf).into_owned()))
}

pub(super) fn read_request<R: BufRead>(r: &mut R) -> io::Result<Option<Request>> {
    let line = loop {
        match read_line_limited(r)? {
            None => return Ok(None),
            Some(l) if l.is_empty() => continue,
            Some(l) => break l,
        }
    };
    let mut parts = line.split(' ');
    let method = parts.next().unwrap_or("").to_string();
    let target = parts.next().unwrap_or("").to_string();
    let version = parts.next().unwrap_or("").to_string();
    let mut headers = Vec::new();
    loop {
        let Some(l) = read_line_limited(r)? else {
            return Ok(None);
        };
        if l.is_empty() {
            break;
        }
        if let Some((k, v)) = l.split_once(':') {
            headers.push((k.trim().to_ascii_lowercase(), v.trim().to_string()));
        }
    }
    let header = |n: &str| headers.iter().find(|(k, _)| k == n).map(|(_, v)| v.clone());
    let mut body = Vec::new();
    if header("transfer-encoding").is_some_and(|v| v.eq_ignore_ascii_case("chunked")) {
        loop {
            let size_line = read_line_limited(r)?.unwrap_or_default();
            let size = usize::from_str_radix(size_line.split(';').next().unwrap_or("").trim(), 16)
                .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "bad chunk size"))?;
            if size == 0 {
                while read_line_limited(r)?.is_some_and(|l| !l.is_empty()) {}
                break;
            }
            if body.len() + size > MAX_BODY {
                return Err(io::Error::new(io::ErrorKind::InvalidData, "body too large"));
            }
            let start = body.len();
            body.resize(start + size, 0);
            r.read_exact(&mut body[start..])?;
            read_line_limited(r)?;
        }
    } else if let Some(len) = header("content-length") {
        let len: usize = len
            .parse()
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "bad content-length"))?;
        if len > MAX_BODY {
            return Err(io::Error::new(io::ErrorKind::InvalidData, "body too large"));
        }
        body.resize(len, 0);
        r.read_exact(&mut body)?;
    }
    let close = header("connection").is_some_and(|v| v.eq_ignore_ascii_case("close"))
        || version == "HTTP/1.0";
    Ok(Some(Request::new(
        method, &target, headers, body, close, false,
    )))
}

pub(super) struct Resp {
    pub(super) code: u16,
    body: Vec<u8>,
    content_type: &'static str,
    nosniff: bool,
    /// APF flow schema and priority level UIDs (absent on 401s).
    pub(super) flow: Option<(&'static str, &'static str)>,
    retry_after: Option<u64>,
}

impl Resp {
    pub(super) fn object(code: u16, v: &Value) -> Resp {
        Resp::json(code, encode(v) + "\n")
    }
    pub(super) fn json(code: u16, body: String) -> Resp {
        Resp {
            code,
            body: body.into_bytes(),
            content_type: "application/json",
            nosniff: false,
            flow: None,
            retry_after: None,
        }
    }
    pub(super) fn status(s: &Status) -> Resp {
        let mut r = Resp::json(s.code, s.json() + "\n");
        r.nosniff = s.nosniff;
        r.retry_after = s.retry_after;
        r
    }
    /// The same answer in protobuf when the request asks for protobuf
    /// first and the body is of a kind [`super::protobuf`] encodes.
    pub(super) fn negotiated(mut self, accept: Option<&str>) -> Resp {
        if self.content_type != "application/json" || !super::protobuf::asked(accept) {
            return self;
        }
        let Ok(object) = serde_json::from_slice::<Value>(&self.body) else {
            return self;
        };
        if let Some(body) = super::protobuf::encode(&object) {
            self.body = body;
            self.content_type = super::protobuf::MEDIA_TYPE;
        }
        self
    }
    pub(super) fn text(body: &str) -> Resp {
        Resp {
            code: 200,
            body: body.as_bytes().to_vec(),
            content_type: "text/plain; charset=utf-8",
            nosniff: true,
            flow: None,
            retry_after: None,
        }
    }
}

fn reason_phrase(code: u16) -> &'static str {
    match code {
        200 => "OK",
        201 => "Created",
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        409 => "Conflict",
        410 => "Gone",
        415 => "Unsupported Media Type",
        422 => "Unprocessable Entity",
        429 => "Too Many Requests",
        500 => "Internal Server Error",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        504 => "Gateway Timeout",
        _ => "Unknown",
    }
}

impl Resp {
    /// The header fields of the answer before the body's length and the
    /// date, in the order both HTTP/1.1 and HTTP/2 write them (Go sorts the
    /// handler's header map by name).
    pub(super) fn fields(&self) -> Vec<(&'static str, String)> {
        let mut out = vec![
            ("Cache-Control", "no-cache, private".to_string()),
            ("Content-Type", self.content_type.to_string()),
        ];
        if let Some(s) = self.retry_after {
            out.push(("Retry-After", s.to_string()));
        }
        if self.nosniff {
            out.push(("X-Content-Type-Options", "nosniff".to_string()));
        }
        if let Some((fs, pl)) = self.flow {
            out.push(("X-Kubernetes-Pf-Flowschema-Uid", fs.to_string()));
            out.push(("X-Kubernetes-Pf-Prioritylevel-Uid", pl.to_string()));
        }
        out
    }

    pub(super) fn body(&self) -> &[u8] {
        &self.body
    }
}

pub(super) fn write_response<W: Write>(w: &mut W, r: &Resp) -> io::Result<()> {
    let mut head = format!("HTTP/1.1 {} {}\r\n", r.code, reason_phrase(r.code));
    for (k, v) in r.fields() {
        head += &format!("{k}: {v}\r\n");
    }
    head += &format!("Date: {}\r\n", http_date());
    let mut out = head.into_bytes();
    if r.body.len() > CHUNK_THRESHOLD {
        out.extend_from_slice(b"Transfer-Encoding: chunked\r\n\r\n");
        out.extend_from_slice(format!("{:x}\r\n", r.body.len()).as_bytes());
        out.extend_from_slice(&r.body);
        out.extend_from_slice(b"\r\n0\r\n\r\n");
    } else {
        out.extend_from_slice(format!("Content-Length: {}\r\n\r\n", r.body.len()).as_bytes());
        out.extend_from_slice(&r.body);
    }
    w.write_all(&out)?;
    w.flush()
}

pub(super) fn write_chunk<W: Write>(w: &mut W, data: &[u8]) -> io::Result<()> {
    let mut out = format!("{:x}\r\n", data.len()).into_bytes();
    out.extend_from_slice(data);
    out.extend_from_slice(b"\r\n");
    w.write_all(&out)?;
    w.flush()
}

pub(super) enum Conn {
    Plain(TcpStream),
    Tls(Box<rustls::StreamOwned<rustls::ServerConnection, TcpStream>>),
}

impl Conn {
    pub(super) fn tcp(&self) -> &TcpStream {
        match self {
            Conn::Plain(s) => s,
            Conn::Tls(s) => &s.sock,
        }
    }
    /// The client certificate's user; `Err` when it is not valid now. As
    /// the apiserver's x509 authenticator, this is checked at every
    /// request, not once at the handshake: a connection made with a
    /// certificate that has since expired is no longer authenticated by it.
    pub(super) fn cert_user(&self) -> Result<Option<User>, ()> {
        match self {
            Conn::Plain(_) => Ok(None),
            Conn::Tls(s) => {
                let Some(cert) = s.conn.peer_certificates().and_then(|c| c.first()) else {
                    return Ok(None);
                };
                let now = SystemTime::now();
                match tinylet::x509::validity(cert.as_ref()) {
                    Ok((from, to)) if from <= now && now < to => {}
                    _ => return Err(()),
                }
                let Some((cn, orgs)) = cert_subject(cert.as_ref()) else {
                    return Ok(None);
                };
                let mut groups = orgs;
                groups.push("system:authenticated".into());
                Ok(Some(User { name: cn, groups }))
            }
        }
    }
}

impl Read for Conn {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Conn::Plain(s) => s.read(buf),
            Conn::Tls(s) => s.read(buf),
        }
    }
}

impl Write for Conn {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Conn::Plain(s) => s.write(buf),
            Conn::Tls(s) => s.write(buf),
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        match self {
            Conn::Plain(s) => s.flush(),
            Conn::Tls(s) => s.flush(),
        }
    }
}

/// Reads (CN, [O]) from a DER certificate's subject.
fn cert_subject(cert: &[u8]) -> Option<(String, Vec<String>)> {
    fn der(buf: &[u8]) -> Option<(u8, &[u8], &[u8])> {
        let (&tag, rest) = buf.split_first()?;
        let (&l0, rest) = rest.split_first()?;
        let (len, rest) = if l0 < 0x80 {
            (l0 as usize, rest)
        } else {
            let n = (l0 & 0x7f) as usize;
            if n == 0 || n > 4 || rest.len() < n {
                return None;
            }
            let len = rest[..n].iter().fold(0usize, |a, b| (a << 8) | *b as usize);
            (len, &rest[n..])
        };
        (rest.len() >= len).then(|| (tag, &rest[..len], &rest[len..]))
    }
    let (_, cert, _) = der(cert)?;
    let (_, mut tbs, _) = der(cert)?;
    let (tag, _, rest) = der(tbs)?;
    if tag == 0xa0 {
        tbs = rest;
    }
    for _ in 0..4 {
        let (_, _, rest) = der(tbs)?;
        tbs = rest;
    }
    let (_, mut subject, _) = der(tbs)?;
    let mut cn = None;
    let mut orgs = Vec::new();
    while !subject.is_empty() {
        let (_, mut set, rest) = der(subject)?;
        subject = rest;
        while !set.is_empty() {
            let (_, atv, rest) = der(set)?;
            set = rest;
            let (_, oid, rest) = der(atv)?;
            let (_, val, _) = der(rest)?;
            let val = String::from_utf8(val.to_vec()).ok()?;
            match oid {
                [0x55, 0x04, 0x03] => cn = Some(val),
                [0x55, 0x04, 0x0a] => orgs.push(val),
                _ => {}
            }
        }
    }
    Some((cn?, orgs))
}
