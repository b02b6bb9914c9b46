//! The node API benchmark: what the server on `--port`, `--read-only-port`
//! and `--healthz-port` costs and how fast it relays, against a private
//! containerd and the real tinylet binary. It prints numbers (medians) and
//! judges them against issue 17's targets; it is not a test and fails only
//! when something does not work at all.
//!
//! What it measures:
//! 1. idle RSS and threads of a standalone node without the server and with
//!    all three ports on; and of a node joined to the integration tests'
//!    fake apiserver, whose main and healthz ports are on by default;
//! 2. RSS, threads and open fds of the standalone node while 1000 idle TCP
//!    connections sit on its main port, and after they closed, and whether
//!    it still answers `/healthz` meanwhile; then, while 200 clients trickle
//!    a TLS ClientHello on the main port a byte at a time (each reconnects
//!    when the server cuts it at its deadline), the latency of `/healthz` on
//!    the healthz port and of an authenticated `/pods` on the main port
//!    (medians; targets: 100 ms and 1 s), and RSS and fds then;
//! 3. the time from an exec request (SPDY, through the node's TLS port with
//!    a client certificate) to the first byte of its output, beside the
//!    same straight to the runtime's streaming URL (CRI `Exec`: the floor);
//! 4. a port-forward copying 100 MiB out of a pod, through the node and
//!    straight to the runtime's URL;
//! 5. the node's CPU while one client follows
//!    `/containerLogs?follow=true` of a container writing about 10 MB/s,
//!    beside its CPU with nobody following (both include the rotation and
//!    compression of that container's log), and the busiest threads.
//!
//!   cargo bench --bench node_api -- [--quick] [--runs N] [--mib N]
//!       [--conns N] [--slow N] [--follow-secs N] [--no-cluster] [--slow-only]
//!
//! `--slow-only` runs just the slow-client part (a minute or so).
//!
//! `TINYLET_E2E_BIN` picks the tinylet binary (default: the one cargo built
//! with the bench); `packaging/bench.sh` passes its release binary. Needs
//! root (it runs a private containerd). Without `--bench` on the command
//! line (`cargo test --all-targets` runs bench targets that way) it does
//! nothing.

use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};

#[path = "../tests/support/containerd.rs"]
mod containerd;
#[path = "../tests/support/fake_apiserver/mod.rs"]
mod fake_apiserver;
// The tests' stream clients; the bench uses only some of them.
#[allow(dead_code)]
#[path = "../tests/support/streams.rs"]
mod streams;

use containerd::{cpu_time, wait_until, write_manifest, PrivateContainerd, Tinylet, BUSYBOX_IMAGE};
use fake_apiserver::{FakeApiServer, KubeconfigAuth};
use streams::{Dial, Spdy, SpdyExec};
use tinylet::cri::{api, RemoteRuntime, RuntimeService};

const NODE: &str = "nodeapi";
const PLAIN_NODE: &str = "nodeapi-plain";
const EDGE_NODE: &str = "nodeapi-edge";
const EDGE_OFF_NODE: &str = "nodeapi-edge-off";
const LONG_RUNNING: &str = "trap 'exit 0' TERM; while :; do sleep 1; done";
/// About 10 MB/s: 1 MB of 101-byte lines, then a tenth of a second's rest.
const LOGGER: &str = "l=0123456789012345678901234567890123456789012345678901234567890123456789012345678901234567890123456789; \
     trap 'exit 0' TERM; while :; do yes $l | head -c 1000000; sleep 0.1; done";
const PF_PORT: &str = "8081";
const POD_SETTLE: Duration = Duration::from_secs(90);

struct Options {
    quick: bool,
    runs: usize,
    pf_runs: usize,
    mib: usize,
    conns: usize,
    slow: usize,
    slow_only: bool,
    follow: Duration,
    settle: Duration,
    samples: usize,
    cluster: bool,
}

fn parse(args: &[String]) -> Result<Options> {
    let quick = args.iter().any(|a| a == "--quick");
    let mut o = Options {
        quick,
        runs: if quick { 5 } else { 15 },
        pf_runs: if quick { 1 } else { 3 },
        mib: 100,
        conns: 1000,
        slow: 200,
        slow_only: false,
        follow: Duration::from_secs(10),
        settle: Duration::from_secs(if quick { 5 } else { 10 }),
        samples: if quick { 3 } else { 5 },
        cluster: true,
    };
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut number = || -> Result<u64> {
            let v = it.next().ok_or_else(|| anyhow!("{a} needs a value"))?;
            v.parse()
                .with_context(|| format!("{a} {v:?}: not a number"))
        };
        match a.as_str() {
            "--bench" | "--quick" => {}
            "--runs" => o.runs = number()?.max(1) as usize,
            "--mib" => o.mib = number()?.max(1) as usize,
            "--conns" => o.conns = number()? as usize,
            "--slow" => o.slow = number()? as usize,
            "--slow-only" => o.slow_only = true,
            "--follow-secs" => o.follow = Duration::from_secs(number()?.max(1)),
            "--no-cluster" => o.cluster = false,
            other => bail!("unknown option {other:?} (see the header of benches/node_api.rs)"),
        }
    }
    Ok(o)
}

// ---- process figures -------------------------------------------------------

#[derive(Clone, Copy, Default)]
struct Mem {
    rss_kib: u64,
    anon_kib: u64,
    file_kib: u64,
    threads: u64,
    fds: u64,
}

fn mem(pid: u32) -> Result<Mem> {
    let path = format!("/proc/{pid}/status");
    let text = std::fs::read_to_string(&path).with_context(|| format!("reading {path}"))?;
    let field = |key: &str| -> Result<u64> {
        text.lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| anyhow!("{path}: no numeric {key}"))
    };
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count() as u64);
    Ok(Mem {
        rss_kib: field("VmRSS:")?,
        anon_kib: field("RssAnon:")?,
        file_kib: field("RssFile:")?,
        threads: field("Threads:")?,
        fds,
    })
}

fn median_u64(mut v: Vec<u64>) -> u64 {
    v.sort_unstable();
    v.get(v.len() / 2).copied().unwrap_or(0)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

/// `samples` readings a second apart; the median of each figure.
fn sample(t: &mut Tinylet, samples: usize) -> Result<Mem> {
    let pid = t.pid().ok_or_else(|| anyhow!("tinylet is not running"))?;
    let mut all = Vec::new();
    for i in 0..samples.max(1) {
        if i > 0 {
            std::thread::sleep(Duration::from_secs(1));
        }
        if !t.is_running() {
            bail!("tinylet exited; log tail:\n{}", t.log_tail(30));
        }
        all.push(mem(pid)?);
    }
    Ok(Mem {
        rss_kib: median_u64(all.iter().map(|m| m.rss_kib).collect()),
        anon_kib: median_u64(all.iter().map(|m| m.anon_kib).collect()),
        file_kib: median_u64(all.iter().map(|m| m.file_kib).collect()),
        threads: median_u64(all.iter().map(|m| m.threads).collect()),
        fds: median_u64(all.iter().map(|m| m.fds).collect()),
    })
}

fn mib(kib: u64) -> String {
    format!("{:.1} MiB", kib as f64 / 1024.0)
}

/// RSS with its anonymous and file-backed parts.
fn rss(m: &Mem) -> String {
    format!(
        "{} (anon {:.1}, file {:.1})",
        mib(m.rss_kib),
        m.anon_kib as f64 / 1024.0,
        m.file_kib as f64 / 1024.0
    )
}

fn verdict(ok: bool) -> &'static str {
    if ok {
        "met"
    } else {
        "MISSED"
    }
}

fn free_port() -> Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

fn port_free(port: u16) -> bool {
    TcpListener::bind(("0.0.0.0", port)).is_ok()
}

// ---- TLS with a client certificate -----------------------------------------

/// Accepts any server certificate: the node's is self-signed; the bench is
/// about the client side's cost, not the server's name.
#[derive(Debug)]
struct AnyServer(Arc<rustls::crypto::CryptoProvider>);

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

type TlsStream = rustls::StreamOwned<rustls::ClientConnection, TcpStream>;

fn openssl(dir: &Path, args: &[&str]) -> Result<()> {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .context("running openssl")?;
    if !out.status.success() {
        bail!(
            "openssl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// A CA and a client pair it signed under `dir`: (ca.crt, client.crt,
/// client.key).
fn make_certs(dir: &Path) -> Result<(PathBuf, PathBuf, PathBuf)> {
    std::fs::create_dir_all(dir)?;
    let ec = "-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes";
    let ca_args = format!("req -x509 {ec} -keyout ca.key -out ca.crt -days 2 -subj /CN=bench-ca");
    openssl(dir, &ca_args.split(' ').collect::<Vec<_>>())?;
    let csr_args =
        format!("req {ec} -keyout client.key -out client.csr -subj /CN=bench/O=system:masters");
    openssl(dir, &csr_args.split(' ').collect::<Vec<_>>())?;
    std::fs::write(dir.join("ext"), "extendedKeyUsage=clientAuth\n")?;
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            "client.csr",
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            "client.crt",
            "-days",
            "2",
            "-extfile",
            "ext",
        ],
    )?;
    Ok((
        dir.join("ca.crt"),
        dir.join("client.crt"),
        dir.join("client.key"),
    ))
}

fn tls_config(crt: &Path, key: &Path) -> Result<Arc<rustls::ClientConfig>> {
    use rustls::pki_types::pem::PemObject;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let certs = rustls::pki_types::CertificateDer::pem_file_iter(crt)
        .with_context(|| format!("reading {}", crt.display()))?
        .collect::<Result<Vec<_>, _>>()
        .with_context(|| format!("parsing {}", crt.display()))?;
    let key = rustls::pki_types::PrivateKeyDer::from_pem_file(key)
        .with_context(|| format!("reading {}", key.display()))?;
    let config = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AnyServer(provider)))
        .with_client_auth_cert(certs, key)?;
    Ok(Arc::new(config))
}

/// A TLS connection to the node's main port, handshake done.
fn tls_connect(config: &Arc<rustls::ClientConfig>, port: u16) -> io::Result<TlsStream> {
    let tcp = TcpStream::connect(("127.0.0.1", port))?;
    tcp.set_read_timeout(Some(streams::READ_TIMEOUT))?;
    tcp.set_write_timeout(Some(streams::READ_TIMEOUT))?;
    tcp.set_nodelay(true)?;
    let name = rustls::pki_types::ServerName::try_from("localhost").map_err(io::Error::other)?;
    let conn = rustls::ClientConnection::new(config.clone(), name).map_err(io::Error::other)?;
    let mut s = rustls::StreamOwned::new(conn, tcp);
    while s.conn.is_handshaking() {
        s.conn.complete_io(&mut s.sock)?;
    }
    Ok(s)
}

/// GET `path` on the main port; the status.
fn tls_status(config: &Arc<rustls::ClientConfig>, port: u16, path: &str) -> io::Result<u16> {
    let mut s = tls_connect(config, port)?;
    let req = format!("GET {path} HTTP/1.1\r\nHost: node\r\nConnection: close\r\n\r\n");
    s.write_all(req.as_bytes())?;
    let head = streams::read_head(&mut s)?;
    let text = String::from_utf8_lossy(&head);
    Ok(text
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0))
}

/// GET `path` on a plain port; the status (0 when nothing answers).
fn plain_status(port: u16, path: &str) -> u16 {
    let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) else {
        return 0;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
    let req = format!("GET {path} HTTP/1.1\r\nHost: node\r\nConnection: close\r\n\r\n");
    if s.write_all(req.as_bytes()).is_err() {
        return 0;
    }
    let Ok(head) = streams::read_head(&mut s) else {
        return 0;
    };
    String::from_utf8_lossy(&head)
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0)
}

// ---- pods and streams --------------------------------------------------------

fn pod(name: &str, script: &str) -> String {
    format!(
        r#"apiVersion: v1
kind: Pod
metadata:
  name: {name}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: app
    image: {BUSYBOX_IMAGE}
    imagePullPolicy: IfNotPresent
    command: ["sh", "-c", {script:?}]
"#
    )
}

/// `host:port` and path of a streaming URL.
fn split_url(url: &str) -> Result<(String, String)> {
    let rest = url
        .strip_prefix("http://")
        .ok_or_else(|| anyhow!("streaming URL {url:?} is not http://"))?;
    let i = rest.find('/').unwrap_or(rest.len());
    Ok((rest[..i].to_string(), rest[i..].to_string()))
}

fn pod_labels(pod: &str) -> std::collections::HashMap<String, String> {
    std::collections::HashMap::from([
        (
            "io.kubernetes.pod.namespace".to_string(),
            "default".to_string(),
        ),
        (
            "io.kubernetes.pod.name".to_string(),
            format!("{pod}-{NODE}"),
        ),
    ])
}

/// Time from the start of `conn()` (which connects and upgrades) to the
/// first byte of an `echo hi`'s stdout; checks the whole output.
fn exec_first_byte(conn: impl FnOnce() -> io::Result<Spdy>) -> Result<Duration> {
    let start = Instant::now();
    let mut e = SpdyExec::open_streams(conn()?, false, true, false, false)?;
    let out = e.stdout.ok_or_else(|| anyhow!("no stdout stream"))?;
    if !e.conn.until(|c| c.data.contains_key(&out))? {
        bail!("the exec closed without output");
    }
    let took = start.elapsed();
    let (stdout, _, status) = e.finish()?;
    if stdout != "hi\n" {
        bail!("exec stdout {stdout:?}, status {status:?}");
    }
    Ok(took)
}

/// Port-forwards to `PF_PORT` over `conn` and reads until `bytes` arrived
/// (keeping none of them); the time from the streams' opening, or None
/// when the pod's listener was not there yet.
fn pull(mut pf: Spdy, bytes: usize) -> Result<Option<Duration>> {
    let headers = |kind| [("streamtype", kind), ("port", PF_PORT), ("requestid", "1")];
    let error = pf.open(&headers("error"))?;
    let data = pf.open(&headers("data"))?;
    let start = Instant::now();
    let mut got = 0;
    while got < bytes {
        if !pf.step()? {
            break;
        }
        if let Some(d) = pf.data.get_mut(&data) {
            got += d.len();
            d.clear();
        }
        if pf.data.get(&error).is_some_and(|e| !e.is_empty()) {
            break;
        }
    }
    let took = start.elapsed();
    pf.close();
    Ok((got >= bytes).then_some(took))
}

fn pull_retrying(mut conn: impl FnMut() -> Result<Spdy>, bytes: usize) -> Result<Duration> {
    for _ in 0..50 {
        if let Some(took) = pull(conn()?, bytes)? {
            return Ok(took);
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    bail!("port-forward to port {PF_PORT} never delivered {bytes} bytes")
}

/// Follows `path` on the main port for `secs`; the bytes received.
fn follow(
    config: &Arc<rustls::ClientConfig>,
    port: u16,
    path: &str,
    secs: Duration,
) -> Result<u64> {
    let mut s = tls_connect(config, port)?;
    s.sock.set_read_timeout(Some(Duration::from_millis(500)))?;
    let req = format!("GET {path} HTTP/1.1\r\nHost: node\r\n\r\n");
    s.write_all(req.as_bytes())?;
    let start = Instant::now();
    let mut buf = vec![0u8; 64 * 1024];
    let mut got = 0u64;
    while start.elapsed() < secs {
        match s.read(&mut buf) {
            Ok(0) => bail!("the log follow ended after {got} bytes"),
            Ok(n) => got += n as u64,
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) => {}
            Err(e) => return Err(e).context("reading the log follow"),
        }
    }
    let _ = s.sock.shutdown(Shutdown::Both);
    Ok(got)
}

/// The node's CPU over `window` as a percentage of one core.
fn cpu_percent(pid: u32, window: Duration, during: impl FnOnce() -> Result<()>) -> Result<f64> {
    let c0 = cpu_time(pid).ok_or_else(|| anyhow!("tinylet is gone"))?;
    let t0 = Instant::now();
    during()?;
    if t0.elapsed() < window {
        std::thread::sleep(window - t0.elapsed());
    }
    let c1 = cpu_time(pid).ok_or_else(|| anyhow!("tinylet is gone"))?;
    Ok((c1 - c0).as_secs_f64() / t0.elapsed().as_secs_f64() * 100.0)
}

/// CPU ticks (utime + stime) per thread name of process `pid`.
fn thread_ticks(pid: u32) -> std::collections::BTreeMap<String, u64> {
    let mut out = std::collections::BTreeMap::new();
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return out;
    };
    for e in dir.flatten() {
        let Ok(stat) = std::fs::read_to_string(e.path().join("stat")) else {
            continue;
        };
        let (Some(open), Some(close)) = (stat.find('('), stat.rfind(')')) else {
            continue;
        };
        let name = stat[open + 1..close].to_string();
        let f: Vec<&str> = stat[close + 1..].split_whitespace().collect();
        let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
        *out.entry(name).or_insert(0) += ticks(11) + ticks(12);
    }
    out
}

/// The threads that used the most CPU between two `thread_ticks`, as
/// "name N%" of one core over `secs`.
fn busiest(
    before: &std::collections::BTreeMap<String, u64>,
    after: &std::collections::BTreeMap<String, u64>,
    secs: f64,
) -> String {
    let mut d: Vec<(u64, &String)> = after
        .iter()
        .map(|(n, t)| (t.saturating_sub(before.get(n).copied().unwrap_or(0)), n))
        .filter(|(t, _)| *t > 0)
        .collect();
    d.sort_unstable_by(|a, b| b.cmp(a));
    d.iter()
        .take(3)
        .map(|(t, n)| format!("{n} {:.1}%", *t as f64 / 100.0 / secs * 100.0))
        .collect::<Vec<_>>()
        .join(", ")
}

fn raise_fd_limit(want: u64) {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit and setrlimit only read and write `lim`.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0 && lim.rlim_cur < want {
            lim.rlim_cur = want.min(lim.rlim_max);
            libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
        }
    }
}

// ---- the run -------------------------------------------------------------------

#[derive(Default)]
struct Report {
    plain: Mem,
    server: Mem,
    edge: Option<Mem>,
    edge_ports: String,
    edge_off: Option<Mem>,
    tls_handshake: Vec<f64>,
    conns_open: usize,
    with_conns: Mem,
    healthz_with_conns: String,
    after_conns: Mem,
    slow_open: usize,
    slow_mem: Mem,
    slow_healthz: Vec<f64>,
    slow_pods: Vec<f64>,
    slow_failed: usize,
    exec_node: Vec<f64>,
    exec_floor: Vec<f64>,
    pf_node: Vec<f64>,
    pf_floor: Vec<f64>,
    log_rate: f64,
    cpu_quiet: f64,
    cpu_follow: f64,
    follow_threads: u64,
    follow_by_thread: String,
}

fn run(o: &Options, r: &mut Report) -> Result<()> {
    let ctd = PrivateContainerd::start();
    let (ca, crt, key) = make_certs(&ctd.dir().join("bench-certs"))?;
    let tls = tls_config(&crt, &key)?;
    let v2: &[&str] = &["--v", "2"];

    // 1. Idle, standalone, without the server.
    if !o.slow_only {
        let mut t = Tinylet::start_with(&ctd, PLAIN_NODE, v2);
        std::thread::sleep(o.settle);
        r.plain = sample(&mut t, o.samples)?;
        eprintln!(
            "node_api: standalone, no server, idle: RSS {}, {} threads",
            rss(&r.plain),
            r.plain.threads
        );
        t.sigterm();
    }

    // 1. Idle, standalone, with all three ports.
    let (port, ro, hz) = (free_port()?, free_port()?, free_port()?);
    let ports = [port.to_string(), ro.to_string(), hz.to_string()];
    let ca_s = ca.display().to_string();
    let mut args: Vec<&str> = vec![
        "--address",
        "127.0.0.1",
        "--port",
        &ports[0],
        "--read-only-port",
        &ports[1],
        "--healthz-port",
        &ports[2],
        "--client-ca-file",
        &ca_s,
        "--authorization-mode",
        "AlwaysAllow",
    ];
    args.extend(v2);
    let mut t = Tinylet::start_with(&ctd, NODE, &args);
    wait_until(
        Duration::from_secs(60),
        "the healthz port answers 200",
        || plain_status(hz, "/healthz") == 200,
    );
    std::thread::sleep(o.settle);
    r.server = sample(&mut t, o.samples)?;
    eprintln!(
        "node_api: standalone, server on, idle: RSS {}, {} threads",
        rss(&r.server),
        r.server.threads
    );
    let pid = t.pid().ok_or_else(|| anyhow!("tinylet is not running"))?;

    // 2. Idle connections on the main port.
    raise_fd_limit(o.conns.max(o.slow) as u64 + 256);
    if !o.slow_only {
        idle_conns(o, r, &mut t, &tls, port)?;
    }
    slow_clients(o, r, &mut t, &tls, port, hz)?;
    if o.slow_only {
        t.sigterm();
        return Ok(());
    }

    // 3. and 4. Exec and port-forward, through the node and directly.
    let bytes = o.mib << 20;
    let dir = t.manifest_dir();
    write_manifest(&dir, "sh.yaml", &pod("sh", LONG_RUNNING));
    let bulk = format!("while :; do head -c {bytes} /dev/zero | nc -l -p {PF_PORT}; done");
    write_manifest(&dir, "bulk.yaml", &pod("bulk", &bulk));
    for name in ["sh", "bulk"] {
        let full = format!("{name}-{NODE}");
        wait_until(POD_SETTLE, &format!("{full} runs"), || {
            ctd.pod_running(&full, &["app"])
        });
    }
    let rt = RemoteRuntime::new(&ctd.endpoint(), Duration::from_secs(30))?;
    let mut filter = api::ContainerFilter::new();
    filter.label_selector = pod_labels("sh");
    let cid = rt
        .list_containers(Some(filter))?
        .first()
        .map(|c| c.id.clone())
        .ok_or_else(|| anyhow!("no container of sh-{NODE}"))?;
    let host = format!("127.0.0.1:{port}");
    let exec_target = format!("/exec/default/sh-{NODE}/app?command=echo&command=hi&output=1");
    let node_exec = || {
        Spdy::connect(
            Dial {
                addr: host.clone(),
                tls: Some(tls.clone()),
            },
            &exec_target,
            "v4.channel.k8s.io",
        )
    };
    let direct_exec = || -> io::Result<Spdy> {
        let mut req = api::ExecRequest::new();
        req.container_id = cid.clone();
        req.cmd = vec!["echo".into(), "hi".into()];
        req.stdout = true;
        let url = rt.exec(req).map_err(io::Error::other)?;
        let (h, p) = split_url(&url).map_err(io::Error::other)?;
        Spdy::connect(&h, &p, "v4.channel.k8s.io")
    };
    for _ in 0..o.runs {
        let t0 = Instant::now();
        let s = tls_connect(&tls, port)?;
        r.tls_handshake.push(t0.elapsed().as_secs_f64() * 1e3);
        let _ = s.sock.shutdown(Shutdown::Both);
    }
    // One of each first, so that neither pays for a cold start.
    exec_first_byte(node_exec)?;
    exec_first_byte(direct_exec)?;
    for _ in 0..o.runs {
        r.exec_node
            .push(exec_first_byte(node_exec)?.as_secs_f64() * 1e3);
        r.exec_floor
            .push(exec_first_byte(direct_exec)?.as_secs_f64() * 1e3);
    }
    eprintln!(
        "node_api: exec to first byte, median of {}: node {:.1} ms, runtime directly {:.1} ms",
        o.runs,
        median(r.exec_node.clone()),
        median(r.exec_floor.clone())
    );
    let mut filter = api::PodSandboxFilter::new();
    filter.label_selector = pod_labels("bulk");
    let sid = rt
        .list_pod_sandbox(Some(filter))?
        .first()
        .map(|s| s.id.clone())
        .ok_or_else(|| anyhow!("no sandbox of bulk-{NODE}"))?;
    let pf_target = format!("/portForward/default/bulk-{NODE}");
    for _ in 0..o.pf_runs {
        let through = pull_retrying(
            || {
                Ok(Spdy::connect(
                    Dial {
                        addr: host.clone(),
                        tls: Some(tls.clone()),
                    },
                    &pf_target,
                    "portforward.k8s.io",
                )?)
            },
            bytes,
        )?;
        let floor = pull_retrying(
            || {
                let mut req = api::PortForwardRequest::new();
                req.pod_sandbox_id = sid.clone();
                let (h, p) = split_url(&rt.port_forward(req)?)?;
                Ok(Spdy::connect(&h, &p, "portforward.k8s.io")?)
            },
            bytes,
        )?;
        r.pf_node.push(o.mib as f64 / through.as_secs_f64());
        r.pf_floor.push(o.mib as f64 / floor.as_secs_f64());
    }
    eprintln!(
        "node_api: port-forward {} MiB, median of {}: node {:.0} MiB/s, runtime directly {:.0} MiB/s",
        o.mib,
        o.pf_runs,
        median(r.pf_node.clone()),
        median(r.pf_floor.clone())
    );
    // The bulk pod's loop would otherwise keep 100 MiB ready in a pipe.
    containerd::remove_manifest(&dir, "bulk.yaml");

    // 5. logs -f of a container writing about 10 MB/s.
    write_manifest(&dir, "logger.yaml", &pod("logger", LOGGER));
    let full = format!("logger-{NODE}");
    wait_until(POD_SETTLE, &format!("{full} runs"), || {
        ctd.pod_running(&full, &["app"])
    });
    // Past two of the log manager's checks (every 10 s): from then on each
    // check rotates the live file and compresses the one before, so that
    // both windows below carry the same rotation work.
    std::thread::sleep(Duration::from_secs(22));
    r.cpu_quiet = cpu_percent(pid, o.follow, || Ok(()))?;
    let path = format!("/containerLogs/default/{full}/app?follow=true");
    let mut got = 0;
    let mut threads = 0;
    let mut by_thread = String::new();
    r.cpu_follow = cpu_percent(pid, o.follow, || {
        let before = thread_ticks(pid);
        got = follow(&tls, port, &path, o.follow)?;
        // The session's thread is gone once the follow ended: read first.
        by_thread = busiest(&before, &thread_ticks(pid), o.follow.as_secs_f64());
        threads = mem(pid).map_or(0, |m| m.threads);
        Ok(())
    })?;
    r.follow_by_thread = by_thread;
    r.follow_threads = threads;
    r.log_rate = got as f64 / 1e6 / o.follow.as_secs_f64();
    eprintln!(
        "node_api: logs -f: {:.1} MB/s followed; node CPU {:.1}% following, {:.1}% with nobody following",
        r.log_rate, r.cpu_follow, r.cpu_quiet
    );
    containerd::remove_manifest(&dir, "logger.yaml");
    containerd::remove_manifest(&dir, "sh.yaml");
    wait_until(POD_SETTLE, "the bench's pods are gone", || {
        ["sh", "bulk", "logger"]
            .iter()
            .all(|p| ctd.pod_gone(&format!("{p}-{NODE}")))
    });
    t.sigterm();

    // 1. Connected to the fake apiserver: the server's defaults, and off.
    if o.cluster {
        let (m, ports) = connected(&ctd, o, EDGE_NODE, true)?;
        r.edge = Some(m);
        r.edge_ports = ports;
        r.edge_off = Some(connected(&ctd, o, EDGE_OFF_NODE, false)?.0);
    }
    Ok(())
}

/// Part 2: idle connections on the main port.
fn idle_conns(
    o: &Options,
    r: &mut Report,
    t: &mut Tinylet,
    tls: &Arc<rustls::ClientConfig>,
    port: u16,
) -> Result<()> {
    let addr: SocketAddr = ([127, 0, 0, 1], port).into();
    let mut held = Vec::with_capacity(o.conns);
    for _ in 0..o.conns {
        if let Ok(s) = TcpStream::connect_timeout(&addr, Duration::from_secs(2)) {
            held.push(s);
        }
    }
    r.conns_open = held.len();
    std::thread::sleep(Duration::from_secs(2));
    r.with_conns = sample(t, o.samples)?;
    let h0 = Instant::now();
    r.healthz_with_conns = match tls_status(tls, port, "/healthz") {
        Ok(code) => format!("{code} in {:.0} ms", h0.elapsed().as_secs_f64() * 1e3),
        Err(e) => format!("failed: {e}"),
    };
    drop(held);
    std::thread::sleep(Duration::from_secs(3));
    r.after_conns = sample(t, o.samples)?;
    eprintln!(
        "node_api: {} idle connections: RSS {}, {} threads, {} fds; /healthz {}; after: RSS {}, {} threads, {} fds",
        r.conns_open,
        rss(&r.with_conns),
        r.with_conns.threads,
        r.with_conns.fds,
        r.healthz_with_conns,
        rss(&r.after_conns),
        r.after_conns.threads,
        r.after_conns.fds
    );

    Ok(())
}

/// What a TLS client sends first (its ClientHello), as on the wire.
fn client_hello(config: &Arc<rustls::ClientConfig>) -> Result<Vec<u8>> {
    let name = rustls::pki_types::ServerName::try_from("localhost")?;
    let mut conn = rustls::ClientConnection::new(config.clone(), name)?;
    let mut out = Vec::new();
    while conn.wants_write() {
        conn.write_tls(&mut out)?;
    }
    Ok(out)
}

/// Part 2, slow clients: `o.slow` connections on the main port each send
/// one more byte of a ClientHello every half second and never its last
/// byte; one cut by the server (at its deadline) connects again. Meanwhile
/// `/healthz` on the healthz port and `/pods` on the main port (client
/// certificate, a new connection each) are timed.
fn slow_clients(
    o: &Options,
    r: &mut Report,
    t: &mut Tinylet,
    tls: &Arc<rustls::ClientConfig>,
    port: u16,
    hz: u16,
) -> Result<()> {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    let hello = client_hello(tls)?;
    let addr: SocketAddr = ([127, 0, 0, 1], port).into();
    let stop = Arc::new(AtomicBool::new(false));
    let open = Arc::new(AtomicUsize::new(0));
    let n = o.slow;
    let trickler = {
        let (stop, open) = (stop.clone(), open.clone());
        std::thread::Builder::new()
            .name("slow-clients".into())
            .spawn(move || {
                let connect = || TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok();
                let mut conns: Vec<(Option<TcpStream>, usize)> =
                    (0..n).map(|_| (connect(), 0)).collect();
                while !stop.load(Ordering::Relaxed) {
                    for (s, sent) in conns.iter_mut() {
                        let ok = match s {
                            Some(sock) if *sent + 1 < hello.len() => {
                                sock.write_all(&hello[*sent..*sent + 1]).is_ok()
                            }
                            Some(_) => true,
                            None => false,
                        };
                        *sent += 1;
                        if !ok {
                            *s = connect();
                            *sent = 0;
                        }
                    }
                    open.store(
                        conns.iter().filter(|c| c.0.is_some()).count(),
                        Ordering::Relaxed,
                    );
                    std::thread::sleep(Duration::from_millis(500));
                }
            })?
    };
    std::thread::sleep(Duration::from_secs(3));
    r.slow_open = open.load(Ordering::Relaxed);
    r.slow_mem = sample(t, o.samples)?;
    for _ in 0..o.runs {
        let t0 = Instant::now();
        if plain_status(hz, "/healthz") == 200 {
            r.slow_healthz.push(t0.elapsed().as_secs_f64() * 1e3);
        } else {
            r.slow_failed += 1;
        }
        let t0 = Instant::now();
        match tls_status(tls, port, "/pods") {
            Ok(200) => r.slow_pods.push(t0.elapsed().as_secs_f64() * 1e3),
            _ => r.slow_failed += 1,
        }
        std::thread::sleep(Duration::from_millis(300));
    }
    stop.store(true, Ordering::Relaxed);
    let _ = trickler.join();
    eprintln!(
        "node_api: {} slow TLS clients: /healthz median {:.1} ms, /pods median {:.1} ms, {} failed; RSS {}, {} fds",
        r.slow_open,
        median(r.slow_healthz.clone()),
        median(r.slow_pods.clone()),
        r.slow_failed,
        rss(&r.slow_mem),
        r.slow_mem.fds
    );
    Ok(())
}

/// Idle figures of a node joined to a fresh fake apiserver, with the
/// server's listeners as by default or all off; and which ports it used.
fn connected(
    ctd: &PrivateContainerd,
    o: &Options,
    node: &str,
    server: bool,
) -> Result<(Mem, String)> {
    let fake = FakeApiServer::start();
    let kc_dir = ctd.dir().join(format!("kubeconfig-{node}"));
    std::fs::create_dir_all(&kc_dir)?;
    let kubeconfig = fake.write_kubeconfig(
        &kc_dir,
        &format!("system:node:{node}"),
        KubeconfigAuth::token(),
    );
    let mut args: Vec<String> = vec![
        "--kubeconfig".into(),
        kubeconfig.display().to_string(),
        "--v".into(),
        "2".into(),
    ];
    // The defaults (10250, 10248) unless something else holds them.
    let mut main_port = 10250;
    let mut notes = Vec::new();
    if !server {
        args.extend(["--enable-server=false".into(), "--healthz-port=0".into()]);
        notes.push("--enable-server=false --healthz-port=0".to_string());
    } else {
        // Named even when they are the defaults: the tests' harness
        // closes both unless asked.
        let mut healthz_port = 10248;
        if !port_free(10250) {
            main_port = free_port()?;
            notes.push(format!("--port {main_port}: 10250 is taken"));
        }
        if !port_free(10248) {
            healthz_port = free_port()?;
            notes.push(format!("--healthz-port {healthz_port}: 10248 is taken"));
        }
        args.extend(["--port".into(), main_port.to_string()]);
        args.extend(["--healthz-port".into(), healthz_port.to_string()]);
    }
    let ports = if notes.is_empty() {
        "ports 10250, 10248 by default".into()
    } else {
        notes.join(", ")
    };
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut t = Tinylet::start_with(ctd, node, &refs);
    wait_until(Duration::from_secs(60), "the Node is Ready", || {
        fake.node(node).is_some_and(|n| {
            n["status"]["conditions"].as_array().is_some_and(|cs| {
                cs.iter()
                    .any(|c| c["type"] == "Ready" && c["status"] == "True")
            })
        })
    });
    if server {
        wait_until(Duration::from_secs(30), "the main port listens", || {
            TcpStream::connect(("127.0.0.1", main_port)).is_ok()
        });
    }
    std::thread::sleep(o.settle);
    let m = sample(&mut t, o.samples)?;
    eprintln!(
        "node_api: connected, server {}, idle: RSS {}, {} threads",
        if server { "on by default" } else { "off" },
        rss(&m),
        m.threads
    );
    t.sigterm();
    Ok((m, ports))
}

fn print_report(o: &Options, r: &Report) {
    let row = |cols: [&str; 5]| {
        println!(
            "{:<44} {:<34} {:<44} {:<10} {}",
            cols[0], cols[1], cols[2], cols[3], cols[4]
        );
    };
    println!();
    println!(
        "node API: tinylet {}{}",
        containerd::tinylet_bin().display(),
        if o.quick { " (quick)" } else { "" }
    );
    row(["node API", "tinylet", "beside", "target", "verdict"]);
    row(["--------", "-------", "------", "------", "-------"]);
    let healthz = median(r.slow_healthz.clone());
    let pods = median(r.slow_pods.clone());
    row([
        &format!(
            "/healthz, {} slow TLS clients (median of {})",
            r.slow_open, o.runs
        ),
        &format!("{healthz:.1} ms"),
        &format!("{} requests failed", r.slow_failed),
        "< 100 ms",
        verdict(healthz < 100.0 && r.slow_failed == 0),
    ]);
    row([
        &format!("/pods (client cert), {} slow TLS clients", r.slow_open),
        &format!("{pods:.1} ms"),
        &format!("RSS {}, {} fds then", rss(&r.slow_mem), r.slow_mem.fds),
        "< 1 s",
        verdict(pods < 1000.0 && r.slow_failed == 0),
    ]);
    if o.slow_only {
        return;
    }
    let standalone_ok = r.server.rss_kib < 8 * 1024;
    row([
        "RSS standalone idle, server on",
        &rss(&r.server),
        &format!("{} without the server", rss(&r.plain)),
        "< 8 MiB",
        verdict(standalone_ok),
    ]);
    row([
        "threads standalone idle, server on",
        &r.server.threads.to_string(),
        &format!("{} without the server", r.plain.threads),
        "",
        "",
    ]);
    if let Some(m) = &r.edge {
        let off = r.edge_off.as_ref();
        row([
            "RSS connected idle, server on",
            &rss(m),
            &off.map_or(String::new(), |o| format!("{} server off", rss(o))),
            "< 10 MiB",
            verdict(m.rss_kib < 10 * 1024),
        ]);
        row([
            "threads connected idle, server on",
            &m.threads.to_string(),
            &off.map_or(String::new(), |o| format!("{} server off", o.threads)),
            "",
            "",
        ]);
        row(["  (connected node's ports)", &r.edge_ports, "", "", ""]);
    }
    // Bounded: no thread per connection, fds at most the connection cap
    // (the server's MAX_CONNS, 512) above idle, and memory back within
    // 2 MiB once they closed.
    let bounded = r.with_conns.threads <= r.server.threads + 4
        && r.with_conns.fds <= r.server.fds + 512
        && r.after_conns.rss_kib <= r.server.rss_kib + 2048;
    row([
        &format!("RSS with {} idle connections", r.conns_open),
        &mib(r.with_conns.rss_kib),
        &format!("{} after they closed", mib(r.after_conns.rss_kib)),
        "bounded",
        verdict(bounded),
    ]);
    row([
        &format!("threads / fds with {} idle conns", r.conns_open),
        &format!("{} / {}", r.with_conns.threads, r.with_conns.fds),
        &format!(
            "{} / {} after; {} / {} idle",
            r.after_conns.threads, r.after_conns.fds, r.server.threads, r.server.fds
        ),
        "bounded",
        "",
    ]);
    row([
        "/healthz while they are open",
        &r.healthz_with_conns,
        "",
        "",
        "",
    ]);
    row([
        &format!("TLS handshake, client cert (median of {})", o.runs),
        &format!("{:.1} ms", median(r.tls_handshake.clone())),
        "",
        "",
        "",
    ]);
    row([
        &format!("exec request -> first byte (median of {})", o.runs),
        &format!("{:.1} ms", median(r.exec_node.clone())),
        &format!("{:.1} ms runtime directly", median(r.exec_floor.clone())),
        "",
        "",
    ]);
    row([
        &format!("port-forward {} MiB (median of {})", o.mib, o.pf_runs),
        &format!("{:.0} MiB/s", median(r.pf_node.clone())),
        &format!("{:.0} MiB/s runtime directly", median(r.pf_floor.clone())),
        "",
        "",
    ]);
    row([
        &format!("logs -f, {:.1} MB/s, CPU (% of a core)", r.log_rate),
        &format!("{:.1}%", r.cpu_follow),
        &format!("{:.1}% nobody following", r.cpu_quiet),
        "< 10%",
        verdict(r.cpu_follow < 10.0),
    ]);
    row([
        "threads while following; the busiest",
        &r.follow_threads.to_string(),
        &r.follow_by_thread,
        "",
        "",
    ]);
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if !args.iter().any(|a| a == "--bench") {
        return ExitCode::SUCCESS;
    }
    let o = match parse(&args) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("node_api: {e:#}");
            return ExitCode::from(2);
        }
    };
    let mut r = Report::default();
    let result = run(&o, &mut r);
    print_report(&o, &r);
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("node_api: {e:#}");
            ExitCode::FAILURE
        }
    }
}
