//! A tiny HTTP/1.1 server for the API client's tests: it records every
//! request and answers from a script (a closure), with plain or chunked
//! bodies, connections that drop in the middle of a body or go silent, and
//! optionally TLS with a required client certificate.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;

use crate::thread::JoinOnDrop;

/// One request as the server read it.
#[derive(Debug, Clone)]
pub(crate) struct Recorded {
    pub(crate) method: String,
    /// Path with its query, as sent.
    pub(crate) target: String,
    /// Header names in lower case.
    pub(crate) headers: Vec<(String, String)>,
    pub(crate) body: Vec<u8>,
    /// Which accepted connection it came on (0, 1, ...).
    pub(crate) conn: usize,
}

impl Recorded {
    pub(crate) fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

/// How the body of an answer is sent and how the answer ends.
pub(crate) enum Reply {
    /// A body with Content-Length.
    Full {
        status: u16,
        headers: Vec<(&'static str, String)>,
        body: Vec<u8>,
    },
    /// A chunked body, one HTTP chunk per element, then `end`.
    Chunked {
        status: u16,
        chunks: Vec<Vec<u8>>,
        end: End,
    },
}

pub(crate) enum End {
    /// The terminating chunk; the connection stays open for the next request.
    Clean,
    /// The connection closes without the terminating chunk.
    Drop,
    /// Nothing more is sent until the client goes away.
    Silent,
}

impl Reply {
    pub(crate) fn json(status: u16, body: impl Into<Vec<u8>>) -> Reply {
        Reply::Full {
            status,
            headers: vec![("Content-Type", "application/json".into())],
            body: body.into(),
        }
    }
}

type Script = dyn Fn(&Recorded) -> Reply + Send + Sync;

pub(crate) struct TestServer {
    addr: SocketAddr,
    tls: bool,
    requests: Arc<Mutex<Vec<Recorded>>>,
    stop: Arc<AtomicBool>,
    _accept: Option<JoinOnDrop<()>>,
}

impl TestServer {
    pub(crate) fn start(script: impl Fn(&Recorded) -> Reply + Send + Sync + 'static) -> TestServer {
        Self::start_with(None, script)
    }

    pub(crate) fn start_tls(
        tls: Arc<rustls::ServerConfig>,
        script: impl Fn(&Recorded) -> Reply + Send + Sync + 'static,
    ) -> TestServer {
        Self::start_with(Some(tls), script)
    }

    fn start_with(
        tls: Option<Arc<rustls::ServerConfig>>,
        script: impl Fn(&Recorded) -> Reply + Send + Sync + 'static,
    ) -> TestServer {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let requests = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let script: Arc<Script> = Arc::new(script);
        let is_tls = tls.is_some();
        let (reqs, stopping) = (requests.clone(), stop.clone());
        let accept = crate::thread::spawn_named("test-apiserver", move || {
            for (conn_id, conn) in listener.incoming().enumerate() {
                if stopping.load(Ordering::SeqCst) {
                    return;
                }
                let Ok(tcp) = conn else { continue };
                let (reqs, script, tls) = (reqs.clone(), script.clone(), tls.clone());
                let t = crate::thread::spawn_named("test-apiserver-conn", move || {
                    let _ = tcp.set_read_timeout(Some(Duration::from_secs(20)));
                    match tls {
                        Some(cfg) => {
                            let Ok(conn) = rustls::ServerConnection::new(cfg) else {
                                return;
                            };
                            serve(
                                rustls::StreamOwned::new(conn, tcp),
                                conn_id,
                                &reqs,
                                &*script,
                            );
                        }
                        None => serve(tcp, conn_id, &reqs, &*script),
                    }
                });
                if let Ok(t) = t {
                    t.detach();
                }
            }
        })
        .unwrap();
        TestServer {
            addr,
            tls: is_tls,
            requests,
            stop,
            _accept: Some(accept),
        }
    }

    pub(crate) fn url(&self) -> String {
        let scheme = if self.tls { "https" } else { "http" };
        format!("{scheme}://{}", self.addr)
    }

    pub(crate) fn requests(&self) -> Vec<Recorded> {
        self.requests.lock().clone()
    }

    /// The targets of the requests so far.
    pub(crate) fn targets(&self) -> Vec<String> {
        self.requests().into_iter().map(|r| r.target).collect()
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wakes the accept loop so that it sees the flag.
        let _ = TcpStream::connect(self.addr);
    }
}

/// Serves requests on one connection until it closes or a reply ends it.
fn serve<S: Read + Write>(
    stream: S,
    conn: usize,
    requests: &Mutex<Vec<Recorded>>,
    script: &Script,
) {
    let mut reader = BufReader::new(stream);
    loop {
        let Ok(Some(req)) = read_request(&mut reader, conn) else {
            return;
        };
        requests.lock().push(req.clone());
        let reply = script(&req);
        let keep = write_reply(reader.get_mut(), reply);
        match keep {
            Ok(true) => {}
            Ok(false) => {
                // Silent: wait for the client to go away.
                let mut sink = [0u8; 1024];
                while matches!(reader.read(&mut sink), Ok(n) if n > 0) {}
                return;
            }
            Err(_) => return,
        }
    }
}

fn read_request<R: BufRead>(reader: &mut R, conn: usize) -> io::Result<Option<Recorded>> {
    let mut line = String::new();
    if reader.read_line(&mut line)? == 0 {
        return Ok(None);
    }
    let mut parts = line.split_whitespace();
    let method = parts.next().unwrap_or("").to_string();
    let target = parts.next().unwrap_or("").to_string();
    let mut headers = Vec::new();
    loop {
        let mut h = String::new();
        if reader.read_line(&mut h)? == 0 {
            return Ok(None);
        }
        let h = h.trim_end();
        if h.is_empty() {
            break;
        }
        if let Some((k, v)) = h.split_once(':') {
            headers.push((k.trim().to_ascii_lowercase(), v.trim().to_string()));
        }
    }
    let len = headers
        .iter()
        .find(|(k, _)| k == "content-length")
        .and_then(|(_, v)| v.parse::<usize>().ok())
        .unwrap_or(0);
    let mut body = vec![0; len];
    reader.read_exact(&mut body)?;
    Ok(Some(Recorded {
        method,
        target,
        headers,
        body,
        conn,
    }))
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        201 => "Created",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        409 => "Conflict",
        410 => "Gone",
        500 => "Internal Server Error",
        503 => "Service Unavailable",
        _ => "Whatever",
    }
}

/// Writes a reply; `Ok(false)` when the connection must go silent and
/// `Err` when it must close.
fn write_reply<W: Write>(w: &mut W, reply: Reply) -> io::Result<bool> {
    match reply {
        Reply::Full {
            status,
            headers,
            body,
        } => {
            let mut head = format!("HTTP/1.1 {status} {}\r\n", reason(status));
            for (k, v) in headers {
                head.push_str(&format!("{k}: {v}\r\n"));
            }
            head.push_str(&format!("Content-Length: {}\r\n\r\n", body.len()));
            w.write_all(head.as_bytes())?;
            w.write_all(&body)?;
            w.flush()?;
            Ok(true)
        }
        Reply::Chunked {
            status,
            chunks,
            end,
        } => {
            let head = format!(
                "HTTP/1.1 {status} {}\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n",
                reason(status)
            );
            w.write_all(head.as_bytes())?;
            w.flush()?;
            for c in chunks {
                w.write_all(format!("{:x}\r\n", c.len()).as_bytes())?;
                w.write_all(&c)?;
                w.write_all(b"\r\n")?;
                w.flush()?;
                // Separate reads on the client side, as a real stream has.
                std::thread::sleep(Duration::from_millis(2));
            }
            match end {
                End::Clean => {
                    w.write_all(b"0\r\n\r\n")?;
                    w.flush()?;
                    Ok(true)
                }
                End::Drop => Err(io::Error::other("drop the connection")),
                End::Silent => Ok(false),
            }
        }
    }
}

/// The directory of the recorded apiserver exchanges: beside the repository
/// in a checkout, or the shared copy.
pub(crate) fn fixtures_dir() -> PathBuf {
    let beside = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../shared/fixtures/apiserver");
    if beside.is_dir() {
        return beside;
    }
    PathBuf::from("/work/shared/fixtures/apiserver")
}

/// The body of a recorded response (after the blank line that ends its
/// headers).
pub(crate) fn fixture_body(name: &str) -> Vec<u8> {
    let path = fixtures_dir().join(format!("{name}.response.txt"));
    let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let at = bytes
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .unwrap_or_else(|| panic!("{}: no end of headers", path.display()));
    bytes[at + 4..].to_vec()
}

/// The lines (events) of a recorded watch body, each with its newline.
pub(crate) fn fixture_lines(name: &str) -> Vec<Vec<u8>> {
    fixture_body(name)
        .split_inclusive(|b| *b == b'\n')
        .filter(|l| l.iter().any(|b| !b.is_ascii_whitespace()))
        .map(<[u8]>::to_vec)
        .collect()
}

/// A reader that hands out its data in the given pieces, one per read, so
/// decoders meet their input split at every place a test chooses.
pub(crate) struct Pieces(pub(crate) std::collections::VecDeque<Vec<u8>>);

impl std::io::Read for Pieces {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let Some(mut piece) = self.0.pop_front() else {
            return Ok(0);
        };
        let n = piece.len().min(buf.len());
        buf[..n].copy_from_slice(&piece[..n]);
        if n < piece.len() {
            self.0.push_front(piece.split_off(n));
        }
        Ok(n)
    }
}
