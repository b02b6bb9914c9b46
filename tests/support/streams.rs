//! Clients of the streaming protocols kubectl speaks through the apiserver
//! to a node: SPDY/3.1 (`v4.channel.k8s.io` for exec and attach,
//! `portforward.k8s.io`) as client-go speaks it, and WebSocket with the
//! `v4.channel.k8s.io` channel framing; plus a loopback server that hands
//! one connection to `tinylet::server::stream::serve`, as the node's API
//! router does.
//!
//! Just enough of each protocol for tests and the bench: the clients are
//! blocking, read with a timeout, and keep what arrives per stream. They
//! dial plain TCP, or TLS over TCP (the node's main port) through [`Dial`].

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use tinylet::cri::RuntimeService;
use tinylet::server::conn::Conn;
use tinylet::server::head::RequestHead;
use tinylet::server::stream::{serve, StreamKind};

/// How long a client waits for the next byte before it gives up.
pub const READ_TIMEOUT: Duration = Duration::from_secs(60);

/// Reads an HTTP head (through the blank line), byte by byte so that
/// nothing after it is taken.
pub fn read_head(s: &mut impl Read) -> io::Result<Vec<u8>> {
    let mut head = Vec::new();
    let mut b = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if s.read(&mut b)? == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        head.push(b[0]);
        if head.len() > 64 * 1024 {
            return Err(io::Error::new(io::ErrorKind::InvalidData, "head too long"));
        }
    }
    Ok(head)
}

/// A loopback listener whose connections are each served, on their own
/// thread, by `serve(kind, ...)` against `runtime`; returns its address.
pub fn serve_on_loopback(kind: StreamKind, runtime: Arc<dyn RuntimeService>) -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    std::thread::spawn(move || {
        for sock in l.incoming() {
            let Ok(mut sock) = sock else { return };
            let runtime = runtime.clone();
            std::thread::spawn(move || {
                let Ok(raw) = read_head(&mut sock) else {
                    return;
                };
                let mut headers = [httparse::EMPTY_HEADER; 64];
                let mut req = httparse::Request::new(&mut headers);
                let Ok(httparse::Status::Complete(_)) = req.parse(&raw) else {
                    return;
                };
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
                if let Err(e) = serve(kind, Conn::Plain(sock), &head, &[], runtime.as_ref(), None) {
                    eprintln!("serve {}: {e}", head.target);
                }
            });
        }
    });
    addr
}

/// A client's connection: TCP, or TLS over TCP.
pub trait Duplex: Read + Write + Send {
    /// Ends the connection both ways.
    fn close(&mut self);
}

impl Duplex for TcpStream {
    fn close(&mut self) {
        let _ = self.shutdown(std::net::Shutdown::Both);
    }
}

impl Duplex for rustls::StreamOwned<rustls::ClientConnection, TcpStream> {
    fn close(&mut self) {
        self.conn.send_close_notify();
        let _ = self.flush();
        let _ = self.sock.shutdown(std::net::Shutdown::Both);
    }
}

/// Where a client connects: `addr` over plain TCP, or over TLS with
/// `tls` (server name `localhost`).
#[derive(Clone)]
pub struct Dial {
    pub addr: String,
    pub tls: Option<Arc<rustls::ClientConfig>>,
}

impl From<&str> for Dial {
    fn from(addr: &str) -> Dial {
        Dial {
            addr: addr.to_string(),
            tls: None,
        }
    }
}

impl From<&String> for Dial {
    fn from(addr: &String) -> Dial {
        Dial::from(addr.as_str())
    }
}

impl From<&Dial> for Dial {
    fn from(d: &Dial) -> Dial {
        d.clone()
    }
}

impl Dial {
    /// Opens the connection (the TLS handshake happens with the first
    /// write).
    pub fn open(&self) -> io::Result<Box<dyn Duplex>> {
        let s = TcpStream::connect(&self.addr)?;
        s.set_read_timeout(Some(READ_TIMEOUT))?;
        s.set_write_timeout(Some(READ_TIMEOUT))?;
        s.set_nodelay(true)?;
        let Some(config) = &self.tls else {
            return Ok(Box::new(s));
        };
        let name = rustls::pki_types::ServerName::try_from("localhost")
            .map_err(|e| io::Error::other(e.to_string()))?;
        let conn = rustls::ClientConnection::new(config.clone(), name)
            .map_err(|e| io::Error::other(e.to_string()))?;
        Ok(Box::new(rustls::StreamOwned::new(conn, s)))
    }
}

/// Accepts any server certificate: the tests are about client ones.
#[derive(Debug)]
pub struct AnyServer(pub Arc<rustls::crypto::CryptoProvider>);

impl rustls::client::danger::ServerCertVerifier for AnyServer {
    fn verify_server_cert(
        &self,
        _: &rustls::pki_types::CertificateDer<'_>,
        _: &[rustls::pki_types::CertificateDer<'_>],
        _: &rustls::pki_types::ServerName<'_>,
        _: &[u8],
        _: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }
    fn verify_tls12_signature(
        &self,
        m: &[u8],
        c: &rustls::pki_types::CertificateDer<'_>,
        d: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(m, c, d, &self.0.signature_verification_algorithms)
    }
    fn verify_tls13_signature(
        &self,
        m: &[u8],
        c: &rustls::pki_types::CertificateDer<'_>,
        d: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(m, c, d, &self.0.signature_verification_algorithms)
    }
    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// A TLS client configuration that takes any server certificate, with
/// the client pair `cert` (certificate and key PEM files) or none.
pub fn tls_config(cert: Option<(&Path, &Path)>) -> Arc<rustls::ClientConfig> {
    use rustls::pki_types::pem::PemObject;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .unwrap()
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AnyServer(provider)));
    let config = match cert {
        Some((c, k)) => {
            let certs = rustls::pki_types::CertificateDer::pem_file_iter(c)
                .unwrap()
                .collect::<Result<Vec<_>, _>>()
                .unwrap();
            let key = rustls::pki_types::PrivateKeyDer::from_pem_file(k).unwrap();
            builder.with_client_auth_cert(certs, key).unwrap()
        }
        None => builder.with_no_client_auth(),
    };
    Arc::new(config)
}

/// Sends `GET`/`POST target` with the given headers on a new connection;
/// returns it with the response head unread.
fn send_upgrade(
    dial: &Dial,
    method: &str,
    target: &str,
    headers: &[(&str, &str)],
) -> io::Result<Box<dyn Duplex>> {
    let mut s = dial.open()?;
    let mut req = format!("{method} {target} HTTP/1.1\r\nHost: {}\r\n", dial.addr);
    for (n, v) in headers {
        req.push_str(&format!("{n}: {v}\r\n"));
    }
    req.push_str("\r\n");
    s.write_all(req.as_bytes())?;
    Ok(s)
}

/// Reads the response head: the connection when it is `101 Switching
/// Protocols`, otherwise an error with the head and what of its body
/// arrives.
fn expect_101(mut s: Box<dyn Duplex>) -> io::Result<Box<dyn Duplex>> {
    let head = String::from_utf8_lossy(&read_head(&mut s)?).into_owned();
    if head.starts_with("HTTP/1.1 101 ") {
        return Ok(s);
    }
    let mut body = Vec::new();
    let _ = s.take(64 * 1024).read_to_end(&mut body);
    Err(io::Error::other(format!(
        "no upgrade: {head}{}",
        String::from_utf8_lossy(&body)
    )))
}

/// The request headers of a SPDY/3.1 upgrade for `protocol`.
fn spdy_headers(protocol: &str) -> [(&str, &str); 3] {
    [
        ("Connection", "Upgrade"),
        ("Upgrade", "SPDY/3.1"),
        ("X-Stream-Protocol-Version", protocol),
    ]
}

/// The Adler-32 of SPDY/3's header dictionary, which a zlib stream with a
/// preset dictionary names in its header.
const SPDY3_DICTIONARY_ADLER32: u32 = 0xe3c6_a7c2;

/// One SPDY/3.1 client connection.
pub struct Spdy {
    sock: Box<dyn Duplex>,
    next_id: u32,
    zlib_started: bool,
    /// Data received per stream.
    pub data: HashMap<u32, Vec<u8>>,
    /// Streams the server has finished (FIN or reset).
    pub finished: Vec<u32>,
    /// Whether the server has closed the connection.
    pub closed: bool,
}

/// A SPDY frame as the client reads it.
enum Frame {
    Data {
        id: u32,
        fin: bool,
        payload: Vec<u8>,
    },
    Control {
        kind: u16,
        flags: u8,
        payload: Vec<u8>,
    },
}

impl Spdy {
    /// Upgrades `target` to SPDY/3.1 with `protocol` as the stream
    /// protocol (`v4.channel.k8s.io`, `portforward.k8s.io`).
    pub fn connect(dial: impl Into<Dial>, target: &str, protocol: &str) -> io::Result<Spdy> {
        let s = send_upgrade(&dial.into(), "POST", target, &spdy_headers(protocol))?;
        Ok(Spdy::on(expect_101(s)?))
    }

    fn on(sock: Box<dyn Duplex>) -> Spdy {
        Spdy {
            sock,
            next_id: 1,
            zlib_started: false,
            data: HashMap::new(),
            finished: Vec::new(),
            closed: false,
        }
    }

    /// Like `connect`, but opens the streams `streams` names (their
    /// headers) right after the upgrade request, before the answer is
    /// read, as a client may; returns their IDs too.
    pub fn connect_eager(
        dial: impl Into<Dial>,
        target: &str,
        protocol: &str,
        streams: &[&[(&str, &str)]],
    ) -> io::Result<(Spdy, Vec<u32>)> {
        let s = send_upgrade(&dial.into(), "POST", target, &spdy_headers(protocol))?;
        let mut spdy = Spdy::on(s);
        let mut ids = Vec::new();
        for headers in streams {
            ids.push(spdy.open(headers)?);
        }
        spdy.sock = expect_101(spdy.sock)?;
        Ok((spdy, ids))
    }

    /// A header block: the name/value pairs in one zlib stream for the
    /// whole connection (with the SPDY/3 dictionary named in its header),
    /// written as a stored deflate block and a sync flush, which a zlib
    /// reader with the dictionary takes like any compressed block.
    fn header_block(&mut self, headers: &[(&str, &str)]) -> Vec<u8> {
        let mut raw = (headers.len() as u32).to_be_bytes().to_vec();
        for (n, v) in headers {
            raw.extend((n.len() as u32).to_be_bytes());
            raw.extend(n.as_bytes());
            raw.extend((v.len() as u32).to_be_bytes());
            raw.extend(v.as_bytes());
        }
        let mut out = Vec::new();
        if !self.zlib_started {
            // CMF 0x78 (deflate, 32 KiB window), FLG 0x20 (FDICT; 0x7820
            // is a multiple of 31, as the check bits require).
            out.extend([0x78, 0x20]);
            out.extend(SPDY3_DICTIONARY_ADLER32.to_be_bytes());
            self.zlib_started = true;
        }
        let len = raw.len() as u16;
        out.push(0x00);
        out.extend(len.to_le_bytes());
        out.extend((!len).to_le_bytes());
        out.extend(raw);
        out.extend([0x00, 0x00, 0x00, 0xff, 0xff]);
        out
    }

    fn control(&mut self, kind: u16, flags: u8, payload: &[u8]) -> io::Result<()> {
        let mut f = vec![0x80, 0x03];
        f.extend(kind.to_be_bytes());
        f.push(flags);
        f.extend(&(payload.len() as u32).to_be_bytes()[1..]);
        f.extend(payload);
        self.sock.write_all(&f)?;
        self.sock.flush()
    }

    /// Opens a stream (SYN_STREAM) with the given headers; its ID.
    pub fn open(&mut self, headers: &[(&str, &str)]) -> io::Result<u32> {
        let id = self.next_id;
        self.next_id += 2;
        let mut p = id.to_be_bytes().to_vec();
        p.extend(0u32.to_be_bytes());
        p.extend([0, 0]);
        let block = self.header_block(headers);
        p.extend(block);
        self.control(1, 0, &p)?;
        Ok(id)
    }

    /// Sends data on a stream; `fin` ends the client's side of it.
    pub fn send(&mut self, id: u32, data: &[u8], fin: bool) -> io::Result<()> {
        for (i, chunk) in data.chunks(0xff_ffff).enumerate() {
            let last = (i + 1) * 0xff_ffff >= data.len();
            self.frame(id, chunk, fin && last)?;
        }
        if data.is_empty() {
            self.frame(id, &[], fin)?;
        }
        Ok(())
    }

    fn frame(&mut self, id: u32, data: &[u8], fin: bool) -> io::Result<()> {
        let mut f = (id & 0x7fff_ffff).to_be_bytes().to_vec();
        f.push(u8::from(fin));
        f.extend(&(data.len() as u32).to_be_bytes()[1..]);
        f.extend(data);
        self.sock.write_all(&f)?;
        self.sock.flush()
    }

    fn read_frame(&mut self) -> io::Result<Option<Frame>> {
        let mut h = [0u8; 8];
        match self.sock.read_exact(&mut h) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
            Err(e) if e.kind() == io::ErrorKind::ConnectionReset => return Ok(None),
            Err(e) => return Err(e),
        }
        let len = u32::from_be_bytes([0, h[5], h[6], h[7]]) as usize;
        let mut payload = vec![0u8; len];
        self.sock.read_exact(&mut payload)?;
        Ok(Some(if h[0] & 0x80 != 0 {
            Frame::Control {
                kind: u16::from_be_bytes([h[2], h[3]]),
                flags: h[4],
                payload,
            }
        } else {
            Frame::Data {
                id: u32::from_be_bytes([h[0], h[1], h[2], h[3]]) & 0x7fff_ffff,
                fin: h[4] & 1 != 0,
                payload,
            }
        }))
    }

    /// Reads one frame and keeps what it says; false once the connection
    /// is closed. The server's header blocks are not decompressed: the
    /// client opened every stream and knows which is which.
    pub fn step(&mut self) -> io::Result<bool> {
        let Some(frame) = self.read_frame()? else {
            self.closed = true;
            return Ok(false);
        };
        match frame {
            Frame::Data { id, fin, payload } => {
                self.data.entry(id).or_default().extend(payload);
                if fin {
                    self.finished.push(id);
                }
            }
            // SYN_REPLY, HEADERS: a FIN flag ends the stream.
            Frame::Control {
                kind: 2 | 8,
                flags,
                payload,
            } if payload.len() >= 4 => {
                if flags & 1 != 0 {
                    let id = u32::from_be_bytes([payload[0], payload[1], payload[2], payload[3]]);
                    self.finished.push(id & 0x7fff_ffff);
                }
            }
            // RST_STREAM.
            Frame::Control {
                kind: 3, payload, ..
            } if payload.len() >= 4 => {
                let id = u32::from_be_bytes([payload[0], payload[1], payload[2], payload[3]]);
                self.finished.push(id & 0x7fff_ffff);
            }
            // PING: answered with itself.
            Frame::Control {
                kind: 6, payload, ..
            } => self.control(6, 0, &payload)?,
            // GOAWAY: the server ends the session.
            Frame::Control { kind: 7, .. } => {}
            // SETTINGS, WINDOW_UPDATE and the rest need nothing here.
            Frame::Control { .. } => {}
        }
        Ok(true)
    }

    /// Steps until `done` says so or the connection closes; whether
    /// `done` was met.
    pub fn until(&mut self, mut done: impl FnMut(&Spdy) -> bool) -> io::Result<bool> {
        while !done(self) {
            if !self.step()? {
                return Ok(done(self));
            }
        }
        Ok(true)
    }

    /// What arrived on a stream, as text.
    pub fn text(&self, id: u32) -> String {
        String::from_utf8_lossy(self.data.get(&id).map_or(&[][..], |d| d)).into_owned()
    }

    /// Closes the connection.
    pub fn close(mut self) {
        self.sock.close();
    }
}

/// The streams of one exec or attach over SPDY (`v4.channel.k8s.io`).
pub struct SpdyExec {
    pub conn: Spdy,
    pub error: u32,
    pub stdin: Option<u32>,
    pub stdout: Option<u32>,
    pub stderr: Option<u32>,
    pub resize: Option<u32>,
}

impl SpdyExec {
    /// Connects to `target` (whose query names the streams) and opens the
    /// streams it asks for, in client-go's order.
    pub fn start(
        dial: impl Into<Dial>,
        target: &str,
        stdin: bool,
        stdout: bool,
        stderr: bool,
        tty: bool,
    ) -> io::Result<SpdyExec> {
        let conn = Spdy::connect(dial, target, "v4.channel.k8s.io")?;
        SpdyExec::open_streams(conn, stdin, stdout, stderr, tty)
    }

    /// Opens the streams of an exec or attach on an upgraded connection.
    pub fn open_streams(
        mut conn: Spdy,
        stdin: bool,
        stdout: bool,
        stderr: bool,
        tty: bool,
    ) -> io::Result<SpdyExec> {
        let error = conn.open(&[("streamtype", "error")])?;
        let mut open = |on: bool, kind: &str| -> io::Result<Option<u32>> {
            if on {
                conn.open(&[("streamtype", kind)]).map(Some)
            } else {
                Ok(None)
            }
        };
        let stdin = open(stdin, "stdin")?;
        let stdout = open(stdout, "stdout")?;
        let stderr = open(stderr, "stderr")?;
        let resize = open(tty, "resize")?;
        Ok(SpdyExec {
            conn,
            error,
            stdin,
            stdout,
            stderr,
            resize,
        })
    }

    /// Sends stdin (and with `close`, its end).
    pub fn write_stdin(&mut self, data: &[u8], close: bool) -> io::Result<()> {
        let id = self
            .stdin
            .ok_or_else(|| io::Error::other("no stdin stream"))?;
        self.conn.send(id, data, close)
    }

    /// Sends a terminal size on the resize stream.
    pub fn resize(&mut self, width: u16, height: u16) -> io::Result<()> {
        let id = self
            .resize
            .ok_or_else(|| io::Error::other("no resize stream"))?;
        let size = format!("{{\"Width\":{width},\"Height\":{height}}}");
        self.conn.send(id, size.as_bytes(), false)
    }

    /// Reads until the server closes the connection or the error stream
    /// ends; returns stdout, stderr and the error stream's Status.
    pub fn finish(&mut self) -> io::Result<(String, String, String)> {
        let error = self.error;
        self.conn
            .until(|c| c.finished.contains(&error) && c.data.contains_key(&error))?;
        // What is left of the output follows until the server closes.
        let _ = self.conn.until(|_| false);
        let text = |id: Option<u32>| id.map(|id| self.conn.text(id)).unwrap_or_default();
        Ok((
            text(self.stdout),
            text(self.stderr),
            self.conn.text(self.error),
        ))
    }
}

/// One WebSocket client connection (`v4.channel.k8s.io` framing: the
/// first byte of each binary message is the channel).
pub struct WebSocket {
    sock: Box<dyn Duplex>,
    /// Data received per channel.
    pub channels: HashMap<u8, Vec<u8>>,
    /// Whether the server closed (close frame or EOF).
    pub closed: bool,
}

impl WebSocket {
    /// Upgrades `target` (GET) to a WebSocket with `protocol`.
    pub fn connect(dial: impl Into<Dial>, target: &str, protocol: &str) -> io::Result<WebSocket> {
        let s = send_upgrade(
            &dial.into(),
            "GET",
            target,
            &[
                ("Connection", "Upgrade"),
                ("Upgrade", "websocket"),
                ("Sec-WebSocket-Version", "13"),
                ("Sec-WebSocket-Key", "dGlueWxldCB0ZXN0IGtleQ=="),
                ("Sec-WebSocket-Protocol", protocol),
            ],
        )?;
        let sock = expect_101(s)?;
        Ok(WebSocket {
            sock,
            channels: HashMap::new(),
            closed: false,
        })
    }

    fn frame(&mut self, opcode: u8, payload: &[u8]) -> io::Result<()> {
        let mut f = vec![0x80 | opcode];
        match payload.len() {
            n if n < 126 => f.push(0x80 | n as u8),
            n if n < 65536 => {
                f.push(0x80 | 126);
                f.extend((n as u16).to_be_bytes());
            }
            n => {
                f.push(0x80 | 127);
                f.extend((n as u64).to_be_bytes());
            }
        }
        let mask = [0x5a, 0x3c, 0x96, 0x0f];
        f.extend(mask);
        f.extend(payload.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
        self.sock.write_all(&f)?;
        self.sock.flush()
    }

    /// Sends `data` on `channel` (0 is stdin) as one binary message.
    pub fn send(&mut self, channel: u8, data: &[u8]) -> io::Result<()> {
        let mut p = vec![channel];
        p.extend(data);
        self.frame(2, &p)
    }

    /// Reads one frame and keeps it; false once the server closed.
    pub fn step(&mut self) -> io::Result<bool> {
        let mut h = [0u8; 2];
        match self.sock.read_exact(&mut h) {
            Ok(()) => {}
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::UnexpectedEof | io::ErrorKind::ConnectionReset
                ) =>
            {
                self.closed = true;
                return Ok(false);
            }
            Err(e) => return Err(e),
        }
        let opcode = h[0] & 0x0f;
        let len = match h[1] & 0x7f {
            126 => {
                let mut b = [0u8; 2];
                self.sock.read_exact(&mut b)?;
                u16::from_be_bytes(b) as usize
            }
            127 => {
                let mut b = [0u8; 8];
                self.sock.read_exact(&mut b)?;
                u64::from_be_bytes(b) as usize
            }
            n => n as usize,
        };
        let mut mask = [0u8; 4];
        if h[1] & 0x80 != 0 {
            self.sock.read_exact(&mut mask)?;
        }
        let mut payload = vec![0u8; len];
        self.sock.read_exact(&mut payload)?;
        if h[1] & 0x80 != 0 {
            for (i, b) in payload.iter_mut().enumerate() {
                *b ^= mask[i % 4];
            }
        }
        match opcode {
            // Continuation frames are not expected from this server.
            0..=2 => {
                if let Some((&ch, rest)) = payload.split_first() {
                    self.channels.entry(ch).or_default().extend(rest);
                }
            }
            8 => {
                self.closed = true;
                return Ok(false);
            }
            9 => self.frame(10, &payload)?,
            _ => {}
        }
        Ok(true)
    }

    /// Steps until `done` says so or the server closes; whether `done`
    /// was met.
    pub fn until(&mut self, mut done: impl FnMut(&WebSocket) -> bool) -> io::Result<bool> {
        while !done(self) {
            if !self.step()? {
                return Ok(done(self));
            }
        }
        Ok(true)
    }

    /// Closes the connection.
    pub fn close(mut self) {
        self.sock.close();
    }

    /// Reads until the server closes.
    pub fn finish(&mut self) -> io::Result<()> {
        while self.step()? {}
        Ok(())
    }

    pub fn text(&self, channel: u8) -> String {
        String::from_utf8_lossy(self.channels.get(&channel).map_or(&[][..], |d| d)).into_owned()
    }
}
