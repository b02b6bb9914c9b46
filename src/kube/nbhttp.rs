//! One apiserver connection that never blocks, for the watch multiplexer
//! (`mux`): a TCP connect started without waiting, TLS driven record by
//! record with rustls' connection API, a request written as the socket
//! takes it, and the answer's HTTP/1.1 head and body (by Content-Length,
//! chunked, or to the close) decoded from whatever bytes have arrived.
//! The owner polls [`Conn::fd`] for [`Conn::interest`] and calls
//! [`Conn::pump`] when it is ready; nothing here waits or keeps time.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::fd::{AsRawFd, FromRawFd, RawFd};
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};

use super::KubeConfig;

/// The largest response head taken (an apiserver's is well under 1 KiB).
const MAX_HEAD: usize = 16 * 1024;
/// The longest chunk-size line (hex digits and extensions).
const MAX_CHUNK_LINE: usize = 1024;
/// Bytes read from the socket (or from TLS) at a time.
const READ_PIECE: usize = 16 * 1024;

/// Where the apiserver is and how to speak to it.
pub(crate) struct Endpoint {
    /// `host:port`, for the Host header and messages.
    pub(crate) authority: String,
    pub(crate) host: String,
    pub(crate) port: u16,
    /// None: plain HTTP (tests).
    pub(crate) tls: Option<(Arc<rustls::ClientConfig>, ServerName<'static>)>,
}

impl Endpoint {
    /// The endpoint of `config.server`, with TLS as the kubeconfig says
    /// (its CA or the system's roots, its client certificate, or no
    /// verification when `insecure-skip-tls-verify`).
    pub(crate) fn new(config: &KubeConfig) -> Result<Endpoint, String> {
        let file = config.file.display();
        let (scheme, rest) = config
            .server
            .split_once("://")
            .ok_or_else(|| format!("{file}: server {:?} has no scheme", config.server))?;
        let authority = rest.split('/').next().unwrap_or(rest).to_string();
        let default_port = match scheme {
            "https" => 443,
            "http" => 80,
            _ => {
                return Err(format!(
                    "{file}: server {:?}: unknown scheme",
                    config.server
                ))
            }
        };
        let (host, port) = split_host_port(&authority, default_port)
            .ok_or_else(|| format!("{file}: server {:?}: bad host or port", config.server))?;
        let tls = if scheme == "https" {
            let name = ServerName::try_from(host.clone())
                .map_err(|e| format!("{file}: server {:?}: {e}", config.server))?;
            Some((Arc::new(tls_config(config)?), name))
        } else {
            None
        };
        Ok(Endpoint {
            authority,
            host,
            port,
            tls,
        })
    }
}

/// `host:port` or `[v6]:port`, without the brackets in the host.
fn split_host_port(authority: &str, default_port: u16) -> Option<(String, u16)> {
    if let Some(rest) = authority.strip_prefix('[') {
        let (host, after) = rest.split_once(']')?;
        let port = match after.strip_prefix(':') {
            Some(p) => p.parse().ok()?,
            None if after.is_empty() => default_port,
            None => return None,
        };
        return Some((host.to_string(), port));
    }
    match authority.rsplit_once(':') {
        Some((host, port)) => Some((host.to_string(), port.parse().ok()?)),
        None => Some((authority.to_string(), default_port)),
    }
}

/// The rustls client settings of a kubeconfig, as the blocking client's.
fn tls_config(config: &KubeConfig) -> Result<rustls::ClientConfig, String> {
    let file = config.file.display();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("{file}: TLS: {e}"))?;
    let builder = if config.insecure_skip_tls_verify {
        builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(NoVerification::new()))
    } else {
        let mut roots = rustls::RootCertStore::empty();
        match &config.ca_pem {
            Some(pem) => {
                for cert in CertificateDer::pem_slice_iter(pem) {
                    let cert = cert.map_err(|e| format!("{file}: certificate authority: {e}"))?;
                    roots
                        .add(cert)
                        .map_err(|e| format!("{file}: certificate authority: {e}"))?;
                }
            }
            None => {
                // Roots that do not parse are left out, as by the blocking client.
                for der in crate::tls_roots::system_der() {
                    let _ = roots.add(CertificateDer::from(der.to_vec()));
                }
            }
        }
        builder.with_root_certificates(roots)
    };
    let mut tls = match (&config.client_cert_pem, &config.client_key_pem) {
        (Some(cert), Some(key)) => {
            let chain = CertificateDer::pem_slice_iter(cert)
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| format!("{file}: client certificate: {e}"))?;
            let key = PrivateKeyDer::from_pem_slice(key)
                .map_err(|e| format!("{file}: client key: {e}"))?;
            builder
                .with_client_auth_cert(chain, key)
                .map_err(|e| format!("{file}: client certificate: {e}"))?
        }
        _ => builder.with_no_client_auth(),
    };
    tls.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(tls)
}

/// `insecure-skip-tls-verify: true`: any server certificate is taken
/// (signatures are still checked, so the handshake is a real one).
#[derive(Debug)]
struct NoVerification(Arc<rustls::crypto::CryptoProvider>);

impl NoVerification {
    fn new() -> NoVerification {
        NoVerification(Arc::new(rustls::crypto::ring::default_provider()))
    }
}

impl rustls::client::danger::ServerCertVerifier for NoVerification {
    fn verify_server_cert(
        &self,
        _: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        _: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }
    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }
    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }
    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// Starts a TCP connection to `addr` without waiting for it.
fn connect(addr: SocketAddr) -> io::Result<TcpStream> {
    let family = match addr {
        SocketAddr::V4(_) => libc::AF_INET,
        SocketAddr::V6(_) => libc::AF_INET6,
    };
    // SAFETY: plain socket(2); the fd is owned by the TcpStream below.
    let fd = unsafe {
        libc::socket(
            family,
            libc::SOCK_STREAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
            0,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fd was just made and nothing else owns it.
    let stream = unsafe { TcpStream::from_raw_fd(fd) };
    // SAFETY: the sockaddr structs are fully initialised (zeroed, then the
    // fields set) and live across the call; the length is theirs.
    let rc = unsafe {
        match addr {
            SocketAddr::V4(a) => {
                let mut sa: libc::sockaddr_in = std::mem::zeroed();
                sa.sin_family = libc::AF_INET as libc::sa_family_t;
                sa.sin_port = a.port().to_be();
                sa.sin_addr.s_addr = u32::from(*a.ip()).to_be();
                libc::connect(
                    fd,
                    (&sa as *const libc::sockaddr_in).cast(),
                    std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
                )
            }
            SocketAddr::V6(a) => {
                let mut sa: libc::sockaddr_in6 = std::mem::zeroed();
                sa.sin6_family = libc::AF_INET6 as libc::sa_family_t;
                sa.sin6_port = a.port().to_be();
                sa.sin6_addr.s6_addr = a.ip().octets();
                sa.sin6_flowinfo = a.flowinfo();
                sa.sin6_scope_id = a.scope_id();
                libc::connect(
                    fd,
                    (&sa as *const libc::sockaddr_in6).cast(),
                    std::mem::size_of::<libc::sockaddr_in6>() as libc::socklen_t,
                )
            }
        }
    };
    if rc != 0 {
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EINPROGRESS) {
            return Err(e);
        }
    }
    let _ = stream.set_nodelay(true);
    Ok(stream)
}

/// The answer's head.
#[derive(Debug, Clone)]
pub(crate) struct Head {
    pub(crate) status: u16,
    pub(crate) retry_after: Option<u64>,
    /// The server closes the connection after this answer.
    pub(crate) close: bool,
}

/// How the body ends.
#[derive(Debug)]
enum Framing {
    Length(u64),
    Chunked(Chunk),
    /// To the end of the connection.
    Close,
}

#[derive(Debug)]
enum Chunk {
    /// Reading a chunk-size line.
    Size(Vec<u8>),
    Data(u64),
    /// The CRLF after a chunk's data.
    DataEnd,
    /// Trailer lines after the last chunk, up to an empty one.
    Trailer(Vec<u8>),
}

/// What [`Conn::take_body`] found.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Body {
    /// More is to come.
    More,
    /// The body is complete.
    Done,
}

/// One connection: connecting, then carrying one request and answer at a
/// time (kept alive between them when the server allows).
pub(crate) struct Conn {
    sock: TcpStream,
    tls: Option<rustls::ClientConnection>,
    connecting: bool,
    /// Plaintext to send (without TLS; with TLS it goes to rustls at once).
    out: Vec<u8>,
    /// Plaintext received and not yet taken.
    input: Vec<u8>,
    /// The peer closed its side.
    eof: bool,
    head: Option<Head>,
    framing: Option<Framing>,
}

impl Conn {
    /// Starts connecting to `addr` of `endpoint`.
    pub(crate) fn open(endpoint: &Endpoint, addr: SocketAddr) -> io::Result<Conn> {
        let sock = connect(addr)?;
        let tls = match &endpoint.tls {
            Some((config, name)) => Some(
                rustls::ClientConnection::new(config.clone(), name.clone())
                    .map_err(io::Error::other)?,
            ),
            None => None,
        };
        Ok(Conn {
            sock,
            tls,
            connecting: true,
            out: Vec::new(),
            input: Vec::new(),
            eof: false,
            head: None,
            framing: None,
        })
    }

    pub(crate) fn fd(&self) -> RawFd {
        self.sock.as_raw_fd()
    }

    /// The poll(2) events this connection waits for.
    pub(crate) fn interest(&self) -> i16 {
        let writing = self.connecting
            || !self.out.is_empty()
            || self.tls.as_ref().is_some_and(|t| t.wants_write());
        libc::POLLIN | if writing { libc::POLLOUT } else { 0 }
    }

    /// Queues a request (a whole head; no body). The previous answer must
    /// have been taken whole.
    pub(crate) fn send(&mut self, request: &[u8]) -> io::Result<()> {
        self.head = None;
        self.framing = None;
        match &mut self.tls {
            Some(tls) => tls.writer().write_all(request),
            None => {
                self.out.extend_from_slice(request);
                Ok(())
            }
        }
    }

    /// Moves whatever the socket is ready for, without waiting: finishes
    /// the connect, writes what is queued, reads what has arrived. Returns
    /// whether anything was read (progress, for idle deadlines).
    pub(crate) fn pump(&mut self) -> io::Result<bool> {
        if self.connecting {
            let mut err: libc::c_int = 0;
            let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
            // SAFETY: getsockopt writes one c_int into `err`, which lives
            // across the call, and its length into `len`.
            let rc = unsafe {
                libc::getsockopt(
                    self.sock.as_raw_fd(),
                    libc::SOL_SOCKET,
                    libc::SO_ERROR,
                    (&mut err as *mut libc::c_int).cast(),
                    &mut len,
                )
            };
            if rc != 0 {
                return Err(io::Error::last_os_error());
            }
            if err != 0 {
                return Err(io::Error::from_raw_os_error(err));
            }
            // Still in progress: not writable yet.
            if self.sock.peer_addr().is_err() {
                return Ok(false);
            }
            self.connecting = false;
        }
        self.write_out()?;
        let progress = self.read_in()?;
        // Reading can make TLS want to answer (a key update, an alert).
        self.write_out()?;
        Ok(progress)
    }

    fn write_out(&mut self) -> io::Result<()> {
        match &mut self.tls {
            Some(tls) => {
                while tls.wants_write() {
                    match tls.write_tls(&mut self.sock) {
                        Ok(_) => {}
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                        Err(e) => return Err(e),
                    }
                }
            }
            None => {
                while !self.out.is_empty() {
                    match self.sock.write(&self.out) {
                        Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                        Ok(n) => {
                            self.out.drain(..n);
                        }
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                        Err(e) => return Err(e),
                    }
                }
                if self.out.is_empty() && self.out.capacity() > READ_PIECE {
                    self.out = Vec::new();
                }
            }
        }
        Ok(())
    }

    fn read_in(&mut self) -> io::Result<bool> {
        let mut progress = false;
        let mut piece = [0u8; READ_PIECE];
        match &mut self.tls {
            None => loop {
                match self.sock.read(&mut piece) {
                    Ok(0) => {
                        self.eof = true;
                        return Ok(progress);
                    }
                    Ok(n) => {
                        progress = true;
                        self.input.extend_from_slice(&piece[..n]);
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(progress),
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(e),
                }
            },
            Some(tls) => loop {
                let mut blocked = false;
                match tls.read_tls(&mut self.sock) {
                    Ok(0) => self.eof = true,
                    Ok(_) => progress = true,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => blocked = true,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(e) => return Err(e),
                }
                let state = tls.process_new_packets().map_err(|e| {
                    // Tell the server why, if the socket still takes it.
                    let _ = tls.write_tls(&mut self.sock);
                    io::Error::new(io::ErrorKind::InvalidData, e)
                })?;
                let mut plain = state.plaintext_bytes_to_read();
                while plain > 0 {
                    let n = tls.reader().read(&mut piece)?;
                    if n == 0 {
                        break;
                    }
                    self.input.extend_from_slice(&piece[..n]);
                    plain = plain.saturating_sub(n);
                }
                if state.peer_has_closed() {
                    self.eof = true;
                }
                if self.eof || blocked {
                    return Ok(progress);
                }
            },
        }
    }

    /// The answer's head, once it is in (`Ok(None)` before). The
    /// head's own bytes are consumed; the body's stay for `take_body`.
    pub(crate) fn head(&mut self) -> Result<Option<Head>, String> {
        if let Some(h) = &self.head {
            return Ok(Some(h.clone()));
        }
        let mut headers = [httparse::EMPTY_HEADER; 64];
        let mut response = httparse::Response::new(&mut headers);
        let used = match response.parse(&self.input) {
            Ok(httparse::Status::Complete(n)) => n,
            Ok(httparse::Status::Partial) => {
                if self.input.len() > MAX_HEAD {
                    return Err(format!("the answer's head is over {MAX_HEAD} bytes"));
                }
                if self.eof {
                    return Err(if self.input.is_empty() {
                        "the server closed the connection without an answer".into()
                    } else {
                        "the server closed the connection inside the answer's head".into()
                    });
                }
                return Ok(None);
            }
            Err(e) => return Err(format!("invalid answer head: {e}")),
        };
        let status = response.code.unwrap_or(0);
        let mut length = None;
        let mut chunked = false;
        let mut close = response.version == Some(0);
        let mut retry_after = None;
        for h in response.headers.iter() {
            let value = std::str::from_utf8(h.value).unwrap_or("").trim();
            if h.name.eq_ignore_ascii_case("content-length") {
                length = Some(
                    value
                        .parse::<u64>()
                        .map_err(|_| format!("invalid Content-Length {value:?}"))?,
                );
            } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
                chunked = value
                    .rsplit(',')
                    .next()
                    .is_some_and(|v| v.trim().eq_ignore_ascii_case("chunked"));
            } else if h.name.eq_ignore_ascii_case("connection") {
                close = value
                    .split(',')
                    .any(|v| v.trim().eq_ignore_ascii_case("close"));
            } else if h.name.eq_ignore_ascii_case("retry-after") {
                retry_after = value.parse().ok();
            }
        }
        let framing = if chunked {
            Framing::Chunked(Chunk::Size(Vec::new()))
        } else if let Some(n) = length {
            Framing::Length(n)
        } else {
            close = true;
            Framing::Close
        };
        self.input.drain(..used);
        let head = Head {
            status,
            retry_after,
            close,
        };
        self.head = Some(head.clone());
        self.framing = Some(framing);
        Ok(Some(head))
    }

    /// Hands the body bytes that have arrived to `each`, in order, and
    /// says whether the body is complete. A connection that ends before
    /// the body does is an error.
    pub(crate) fn take_body(&mut self, each: &mut dyn FnMut(&[u8])) -> Result<Body, String> {
        let Some(framing) = &mut self.framing else {
            return Err("no answer head yet".into());
        };
        let input = &self.input;
        let mut at = 0;
        let done = loop {
            match framing {
                Framing::Close => {
                    if at < input.len() {
                        each(&input[at..]);
                        at = input.len();
                    }
                    break self.eof;
                }
                Framing::Length(left) => {
                    let n = (*left).min((input.len() - at) as u64) as usize;
                    if n > 0 {
                        each(&input[at..at + n]);
                        at += n;
                        *left -= n as u64;
                    }
                    if *left == 0 {
                        break true;
                    }
                    if self.eof {
                        return Err("the connection ended inside the answer's body".into());
                    }
                    break false;
                }
                Framing::Chunked(chunk) => {
                    if at == input.len() {
                        if self.eof {
                            return Err("the connection ended inside the answer's body".into());
                        }
                        break false;
                    }
                    let in_trailer = matches!(chunk, Chunk::Trailer(_));
                    match chunk {
                        Chunk::Size(line) | Chunk::Trailer(line) => {
                            let rest = &input[at..];
                            let nl = rest.iter().position(|b| *b == b'\n');
                            let take = nl.map_or(rest.len(), |i| i + 1);
                            line.extend_from_slice(&rest[..take]);
                            at += take;
                            if line.len() > MAX_CHUNK_LINE {
                                return Err("a chunk line over 1024 bytes".into());
                            }
                            if nl.is_none() {
                                continue;
                            }
                            let text = std::str::from_utf8(line).unwrap_or("").trim().to_string();
                            if in_trailer {
                                if text.is_empty() {
                                    break true;
                                }
                                line.clear();
                                continue;
                            }
                            let size = text.split(';').next().unwrap_or("").trim();
                            let size = u64::from_str_radix(size, 16)
                                .map_err(|_| format!("invalid chunk size {size:?}"))?;
                            *chunk = if size == 0 {
                                Chunk::Trailer(Vec::new())
                            } else {
                                Chunk::Data(size)
                            };
                        }
                        Chunk::Data(left) => {
                            let n = (*left).min((input.len() - at) as u64) as usize;
                            each(&input[at..at + n]);
                            at += n;
                            *left -= n as u64;
                            if *left == 0 {
                                *chunk = Chunk::DataEnd;
                            }
                        }
                        Chunk::DataEnd => {
                            // The CRLF (or a bare LF) after the data.
                            match input[at] {
                                b'\r' => at += 1,
                                b'\n' => {
                                    at += 1;
                                    *chunk = Chunk::Size(Vec::new());
                                }
                                _ => return Err("a chunk not followed by CRLF".into()),
                            }
                        }
                    }
                }
            }
        };
        self.input.drain(..at);
        if self.input.is_empty() && self.input.capacity() > 2 * READ_PIECE {
            self.input = Vec::new();
        }
        if done {
            self.framing = None;
        }
        Ok(if done { Body::Done } else { Body::More })
    }

    /// The connection can carry another request.
    pub(crate) fn reusable(&self) -> bool {
        !self.eof && self.head.as_ref().is_some_and(|h| !h.close) && self.framing.is_none()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conn_with(input: &[u8]) -> Conn {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let endpoint = Endpoint {
            authority: addr.to_string(),
            host: "127.0.0.1".into(),
            port: addr.port(),
            tls: None,
        };
        let mut c = Conn::open(&endpoint, addr).unwrap();
        c.input = input.to_vec();
        c
    }

    fn body_of(c: &mut Conn) -> (Vec<u8>, Result<Body, String>) {
        let mut got = Vec::new();
        let r = c.take_body(&mut |b| got.extend_from_slice(b));
        (got, r)
    }

    #[test]
    fn chunked_body_split_anywhere_is_joined() {
        let whole = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5;ext=1\r\nhello\r\n6\r\n world\r\n0\r\nX-Trailer: y\r\n\r\n";
        for split in 0..whole.len() {
            let mut c = conn_with(&whole[..split]);
            let mut got = Vec::new();
            let mut done = false;
            let mut head = c.head().unwrap();
            if head.is_some() {
                done = c.take_body(&mut |b| got.extend_from_slice(b)).unwrap() == Body::Done;
            }
            c.input.extend_from_slice(&whole[split..]);
            if head.is_none() {
                head = c.head().unwrap();
            }
            assert_eq!(head.unwrap().status, 200);
            if !done {
                done = c.take_body(&mut |b| got.extend_from_slice(b)).unwrap() == Body::Done;
            }
            assert!(done, "split at {split}");
            assert_eq!(got, b"hello world", "split at {split}");
            assert!(c.input.is_empty());
            assert!(c.reusable());
        }
    }

    #[test]
    fn content_length_body_leaves_the_next_bytes() {
        let mut c =
            conn_with(b"HTTP/1.1 410 Gone\r\nContent-Length: 3\r\nRetry-After: 7\r\n\r\nabcNEXT");
        let h = c.head().unwrap().unwrap();
        assert_eq!((h.status, h.retry_after, h.close), (410, Some(7), false));
        let (got, r) = body_of(&mut c);
        assert_eq!((got.as_slice(), r), (&b"abc"[..], Ok(Body::Done)));
        assert_eq!(c.input, b"NEXT");
    }

    #[test]
    fn body_to_the_close_and_truncated_bodies() {
        let mut c = conn_with(b"HTTP/1.0 200 OK\r\n\r\nall of it");
        assert!(c.head().unwrap().unwrap().close);
        assert_eq!(body_of(&mut c).1, Ok(Body::More));
        c.eof = true;
        assert_eq!(body_of(&mut c).1, Ok(Body::Done));
        assert!(!c.reusable());

        let mut c = conn_with(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort");
        c.head().unwrap();
        c.eof = true;
        assert!(body_of(&mut c)
            .1
            .unwrap_err()
            .contains("inside the answer's body"));

        let mut c = conn_with(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhel");
        c.head().unwrap();
        c.eof = true;
        let (got, r) = body_of(&mut c);
        assert_eq!(got, b"hel");
        assert!(r.unwrap_err().contains("inside the answer's body"));
    }

    #[test]
    fn bad_heads_and_chunks_are_errors_naming_what() {
        let mut c = conn_with(b"NOT HTTP\r\n\r\n");
        assert!(c.head().unwrap_err().contains("invalid answer head"));
        let mut c = conn_with(&[b'a'; MAX_HEAD + 1]);
        assert!(c.head().is_err());
        let mut c = conn_with(b"HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n");
        assert!(c.head().unwrap_err().contains("Content-Length"));
        let mut c = conn_with(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n");
        c.head().unwrap();
        assert!(body_of(&mut c).1.unwrap_err().contains("chunk size"));
        let mut c = conn_with(b"HTTP/1.1 200 OK\r\n");
        assert_eq!(c.head().unwrap().map(|h| h.status), None);
        c.eof = true;
        assert!(c.head().unwrap_err().contains("closed"));
    }

    #[test]
    fn host_and_port_of_servers() {
        assert_eq!(
            split_host_port("10.0.0.1:6443", 443),
            Some(("10.0.0.1".into(), 6443))
        );
        assert_eq!(
            split_host_port("[::1]:6443", 443),
            Some(("::1".into(), 6443))
        );
        assert_eq!(split_host_port("[::1]", 443), Some(("::1".into(), 443)));
        assert_eq!(
            split_host_port("api.example", 443),
            Some(("api.example".into(), 443))
        );
        assert_eq!(split_host_port("api:x", 443), None);
    }
}
