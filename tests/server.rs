//! The node API of the real `tinylet` binary (against the fake CRI): TLS
//! with client certificates, the read-only and healthz ports, `/pods`,
//! and the limits that keep slow, oversized and idle clients harmless.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::support::agent::{running_containers, Agent};
use crate::support::containerd::write_manifest;
use crate::support::fake_cri::FakeCri;
use crate::support::streams::tls_config;

const POD: &str = r#"apiVersion: v1
kind: Pod
metadata:
  name: web
spec:
  containers:
  - name: app
    image: busybox:latest
    imagePullPolicy: IfNotPresent
    command: ["sleep", "1000"]
"#;

pub(crate) fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

/// Sends `raw` and reads the whole answer (the request asks to close).
fn exchange(stream: &mut impl ReadWrite, raw: &[u8]) -> (u16, String) {
    stream.write_all(raw).expect("send");
    let mut out = Vec::new();
    let _ = stream.read_to_end(&mut out);
    let text = String::from_utf8_lossy(&out).into_owned();
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let body = text
        .split_once("\r\n\r\n")
        .map_or("", |(_, b)| b)
        .to_string();
    (status, body)
}

trait ReadWrite: Read + Write {}
impl<T: Read + Write> ReadWrite for T {}

fn get(port: u16, path: &str) -> (u16, String) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let req = format!("GET {path} HTTP/1.1\r\nHost: node\r\nConnection: close\r\n\r\n");
    exchange(&mut s, req.as_bytes())
}

fn wait_listening(agent: &mut Agent, port: u16) {
    agent.wait("the port listens", || {
        TcpStream::connect(("127.0.0.1", port)).is_ok()
    });
}

/// A TLS GET to the main port, with the client pair `cert` (PEM files).
fn tls_get(port: u16, path: &str, cert: Option<(&Path, &Path)>) -> Result<(u16, String), String> {
    tls_get_within(port, path, cert, Duration::from_secs(30))
}

/// `tls_get`, waiting at most `bound` for each read.
fn tls_get_within(
    port: u16,
    path: &str,
    cert: Option<(&Path, &Path)>,
    bound: Duration,
) -> Result<(u16, String), String> {
    let config = tls_config(cert);
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    let conn = rustls::ClientConnection::new(config, name).unwrap();
    let tcp = TcpStream::connect(("127.0.0.1", port)).map_err(|e| e.to_string())?;
    tcp.set_read_timeout(Some(bound)).unwrap();
    let mut tls = rustls::StreamOwned::new(conn, tcp);
    let req = format!("GET {path} HTTP/1.1\r\nHost: node\r\nConnection: close\r\n\r\n");
    tls.write_all(req.as_bytes()).map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    match tls.read_to_end(&mut out) {
        Ok(_) => {}
        // The server closes without close_notify after the answer.
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof && !out.is_empty() => {}
        Err(e) => return Err(e.to_string()),
    }
    let text = String::from_utf8_lossy(&out).into_owned();
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let body = text
        .split_once("\r\n\r\n")
        .map_or("", |(_, b)| b)
        .to_string();
    Ok((status, body))
}

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("run openssl");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A CA (`<name>-ca.crt`) and a client pair it signed
/// (`<name>-client.crt`, `<name>-client.key`) under `dir`.
pub(crate) fn make_ca_and_client(dir: &Path, name: &str) {
    let ec = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
    ];
    let ca_key = format!("{name}-ca.key");
    let ca = format!("{name}-ca.crt");
    let mut args = vec!["req", "-x509"];
    args.extend(ec);
    args.extend(["-keyout", &ca_key, "-out", &ca, "-days", "2", "-subj"]);
    let subj = format!("/CN={name}-ca");
    args.push(&subj);
    openssl(dir, &args);
    make_client(dir, name, &format!("{name}-client"), "/CN=client/O=testers");
}

/// A client pair (`<client>.crt`, `<client>.key`) with `subject`, signed by
/// the CA `make_ca_and_client` made as `<ca>` in `dir`.
fn make_client(dir: &Path, ca: &str, client: &str, subject: &str) {
    let ec = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
    ];
    let ca_key = format!("{ca}-ca.key");
    let ca = format!("{ca}-ca.crt");
    let key = format!("{client}.key");
    let csr = format!("{client}.csr");
    let crt = format!("{client}.crt");
    let mut args = vec!["req"];
    args.extend(ec);
    args.extend(["-keyout", &key, "-out", &csr, "-subj", subject]);
    openssl(dir, &args);
    std::fs::write(dir.join("ext"), "extendedKeyUsage=clientAuth\n").unwrap();
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            &csr,
            "-CA",
            &ca,
            "-CAkey",
            &ca_key,
            "-CAcreateserial",
            "-out",
            &crt,
            "-days",
            "2",
            "-extfile",
            "ext",
        ],
    );
}

#[test]
fn tls_client_certificates_and_the_self_signed_pair() {
    let certs = tempfile::tempdir().unwrap();
    make_ca_and_client(certs.path(), "good");
    make_ca_and_client(certs.path(), "other");
    let fake = FakeCri::start();
    let port = free_port();
    let port_s = port.to_string();
    let ca = certs.path().join("good-ca.crt");
    let mut agent = Agent::start(
        &fake.endpoint(),
        &[
            "--port",
            &port_s,
            "--address",
            "127.0.0.1",
            "--client-ca-file",
            ca.to_str().unwrap(),
            // A standalone node authorizes nobody unless told to.
            "--authorization-mode",
            "AlwaysAllow",
        ],
    );
    wait_listening(&mut agent, port);
    let good = (
        certs.path().join("good-client.crt"),
        certs.path().join("good-client.key"),
    );
    let other = (
        certs.path().join("other-client.crt"),
        certs.path().join("other-client.key"),
    );
    // The port listens before the first relist: until then /healthz says
    // "pleg has yet to be successful" (500), as upstream's does.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
    let (status, body) = loop {
        let (status, body) =
            tls_get(port, "/healthz", Some((&good.0, &good.1))).expect("the CA's client is served");
        if status != 500
            || !body.contains("pleg has yet to be successful")
            || std::time::Instant::now() > deadline
        {
            break (status, body);
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    assert_eq!((status, body.as_str()), (200, "ok"));
    let (status, body) = tls_get(port, "/healthz", None).expect("a client without a certificate");
    assert_eq!((status, body.as_str()), (401, "Unauthorized"));
    assert!(
        tls_get(port, "/healthz", Some((&other.0, &other.1))).is_err(),
        "a certificate from another CA was taken"
    );

    // The self-signed pair: private key, and the same bytes after a restart.
    let pki = agent.root_dir().join("pki");
    let key_mode = {
        use std::os::unix::fs::PermissionsExt;
        std::fs::metadata(pki.join("kubelet.key"))
            .unwrap()
            .permissions()
            .mode()
            & 0o777
    };
    assert_eq!(key_mode, 0o600);
    let before = (
        std::fs::read(pki.join("kubelet.crt")).unwrap(),
        std::fs::read(pki.join("kubelet.key")).unwrap(),
    );
    agent.restart_with(&[]);
    wait_listening(&mut agent, port);
    assert_eq!(
        tls_get(port, "/healthz/ping", Some((&good.0, &good.1)))
            .unwrap()
            .0,
        200
    );
    let after = (
        std::fs::read(pki.join("kubelet.crt")).unwrap(),
        std::fs::read(pki.join("kubelet.key")).unwrap(),
    );
    assert!(before == after, "the self-signed pair was made again");
}

#[test]
fn read_only_and_healthz_ports_serve_their_paths_only() {
    let fake = FakeCri::start();
    let (ro, hz) = (free_port(), free_port());
    let (ro_s, hz_s) = (ro.to_string(), hz.to_string());
    let mut agent = Agent::start(
        &fake.endpoint(),
        &[
            "--read-only-port",
            &ro_s,
            "--address",
            "127.0.0.1",
            "--healthz-port",
            &hz_s,
        ],
    );
    write_manifest(&agent.manifests(), "web.yaml", POD);
    agent.wait("web runs", || running_containers(&fake, "web-edge-1") == 1);
    wait_listening(&mut agent, ro);
    agent.wait("/pods lists web", || {
        let (status, body) = get(ro, "/pods");
        status == 200 && body.contains("\"name\":\"web-edge-1\"")
    });
    let (_, body) = get(ro, "/pods");
    let list: serde_json::Value = serde_json::from_str(&body).expect("a PodList");
    assert_eq!(list["kind"], "PodList");
    assert_eq!(list["apiVersion"], "v1");
    assert_eq!(list["items"][0]["metadata"]["namespace"], "default");
    assert_eq!(get(ro, "/containerLogs/default/web-edge-1/app").0, 404);
    assert_eq!(get(ro, "/configz").0, 404);
    agent.wait("/runningpods/ lists web", || {
        let (status, body) = get(ro, "/runningpods/");
        status == 200 && body.contains("web-edge-1")
    });
    assert_eq!(get(hz, "/healthz"), (200, "ok".to_string()));
    assert_eq!(get(hz, "/healthz/syncloop"), (200, "ok".to_string()));
    assert_eq!(get(hz, "/pods").0, 404);
    // The main port is not opened unasked on a standalone node.
    assert!(
        !agent.log().contains("node API (HTTPS) listening"),
        "{}",
        agent.log()
    );
}

/// The thread names of the agent's process (found by its root dir).
fn server_threads(agent: &Agent) -> usize {
    let root = agent.root_dir().display().to_string();
    let mut count = 0;
    for p in std::fs::read_dir("/proc").unwrap().flatten() {
        let cmd = std::fs::read(p.path().join("cmdline")).unwrap_or_default();
        if !String::from_utf8_lossy(&cmd).contains(&root) {
            continue;
        }
        for t in std::fs::read_dir(p.path().join("task"))
            .into_iter()
            .flatten()
            .flatten()
        {
            let comm = std::fs::read_to_string(t.path().join("comm")).unwrap_or_default();
            if comm.starts_with("server-") {
                count += 1;
            }
        }
    }
    count
}

#[test]
fn slow_oversized_and_idle_clients_do_not_stop_the_server() {
    let fake = FakeCri::start();
    let ro = free_port();
    let ro_s = ro.to_string();
    let mut agent = Agent::start(
        &fake.endpoint(),
        &["--read-only-port", &ro_s, "--address", "127.0.0.1"],
    );
    wait_listening(&mut agent, ro);
    agent.wait("healthy", || get(ro, "/healthz").0 == 200);

    // A slow client: half a head, then nothing. Others are served
    // meanwhile, and it is cut after the head timeout.
    let mut slow = TcpStream::connect(("127.0.0.1", ro)).unwrap();
    slow.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
        .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(get(ro, "/healthz"), (200, "ok".to_string()));
    slow.set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    let started = Instant::now();
    let mut buf = [0u8; 64];
    let n = slow.read(&mut buf).unwrap_or(0);
    assert_eq!(n, 0, "the slow client got an answer");
    assert!(
        started.elapsed() < Duration::from_secs(50),
        "the slow client was not cut"
    );

    // An oversized head: 431.
    let big = format!(
        "GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: {}\r\n\r\n",
        "a".repeat(40 * 1024)
    );
    let mut s = TcpStream::connect(("127.0.0.1", ro)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    assert_eq!(exchange(&mut s, big.as_bytes()).0, 431);

    // 1000 idle connections: /healthz is still answered and the server's
    // threads stay within the pool's bounds.
    let mut idle = Vec::new();
    for _ in 0..1000 {
        if let Ok(s) = TcpStream::connect(("127.0.0.1", ro)) {
            idle.push(s);
        }
    }
    assert!(idle.len() >= 900, "only {} connections", idle.len());
    assert_eq!(get(ro, "/healthz"), (200, "ok".to_string()));
    assert_eq!(get(ro, "/pods").0, 200);
    let threads = server_threads(&agent);
    assert!(
        (1..=1 + 4 + 16).contains(&threads),
        "{threads} server threads with 1000 idle clients"
    );
    drop(idle);
    assert!(agent.running());
}

/// A follow of `web`'s log on the main port as the client pair `cert`:
/// the status and, for 200, the open connection once the log's first line
/// arrived; for another status, the body.
fn follow(
    port: u16,
    cert: (&Path, &Path),
) -> (
    u16,
    Option<rustls::StreamOwned<rustls::ClientConnection, TcpStream>>,
    String,
) {
    let config = tls_config(Some(cert));
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    let conn = rustls::ClientConnection::new(config, name).unwrap();
    let tcp = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    tcp.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut tls = rustls::StreamOwned::new(conn, tcp);
    let req =
        "GET /containerLogs/default/web-edge-1/app?follow=true HTTP/1.1\r\nHost: node\r\n\r\n";
    tls.write_all(req.as_bytes()).expect("send");
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let text = String::from_utf8_lossy(&got).into_owned();
        if let Some((head, body)) = text.split_once("\r\n\r\n") {
            let status = head
                .split(' ')
                .nth(1)
                .and_then(|s| s.parse().ok())
                .unwrap_or(0);
            if status == 200 && body.contains("hello") {
                return (status, Some(tls), body.to_string());
            }
            if status != 200 && head.contains("Content-Length") {
                let len: usize = head
                    .lines()
                    .find_map(|l| l.strip_prefix("Content-Length: "))
                    .and_then(|v| v.trim().parse().ok())
                    .unwrap_or(0);
                if body.len() >= len {
                    return (status, None, body.to_string());
                }
            }
        }
        match tls.read(&mut buf) {
            Ok(0) | Err(_) => {
                let text = String::from_utf8_lossy(&got).into_owned();
                panic!("the follow ended early: {text:?}");
            }
            Ok(n) => got.extend_from_slice(&buf[..n]),
        }
    }
}

/// A node whose main port authenticates by client certificates of `ca`
/// and allows every caller, running `web` with a line in its log.
fn node_with_a_log(fake: &FakeCri, certs: &Path, extra: &[&str]) -> (Agent, u16) {
    let port = free_port();
    let port_s = port.to_string();
    let ca = certs.join("good-ca.crt");
    let mut args = vec![
        "--port",
        &port_s,
        "--address",
        "127.0.0.1",
        "--client-ca-file",
        ca.to_str().unwrap(),
        "--authorization-mode",
        "AlwaysAllow",
    ];
    args.extend_from_slice(extra);
    let mut agent = Agent::start(&fake.endpoint(), &args);
    write_manifest(&agent.manifests(), "web.yaml", POD);
    agent.wait("web runs", || running_containers(fake, "web-edge-1") == 1);
    let log = fake.containers_named("app")[0].log_path.clone();
    assert!(!log.is_empty(), "the container has no log path");
    let log = Path::new(&log);
    std::fs::create_dir_all(log.parent().unwrap()).unwrap();
    std::fs::write(log, "2026-11-28T13:00:00.000000000Z stdout F hello\n").unwrap();
    wait_listening(&mut agent, port);
    (agent, port)
}

/// One caller cannot take every session of the node: alice's follows of
/// one namespace stop at her share (429, saying why), and bob is still
/// served; a follow she closes gives its place back.
#[test]
fn one_user_cannot_take_every_log_follow() {
    let certs = tempfile::tempdir().unwrap();
    make_ca_and_client(certs.path(), "good");
    make_client(certs.path(), "good", "alice", "/CN=alice");
    make_client(certs.path(), "good", "bob", "/CN=bob");
    let pair = |who: &str| {
        (
            certs.path().join(format!("{who}.crt")),
            certs.path().join(format!("{who}.key")),
        )
    };
    let (alice, bob) = (pair("alice"), pair("bob"));
    let fake = FakeCri::start();
    let (mut agent, port) = node_with_a_log(&fake, certs.path(), &[]);

    let mut held = Vec::new();
    let mut refusals = Vec::new();
    for _ in 0..17 {
        match follow(port, (&alice.0, &alice.1)) {
            (200, Some(conn), _) => held.push(conn),
            (status, _, body) => refusals.push((status, body)),
        }
    }
    assert_eq!(held.len(), 8, "alice's follows held: {refusals:?}");
    for (status, body) in &refusals {
        assert_eq!(*status, 429, "{body}");
        assert!(
            body.contains("too many sessions")
                && body.contains("\"alice\"")
                && body.contains("\"default\""),
            "{body}"
        );
    }
    let (status, bob_follow, body) = follow(port, (&bob.0, &bob.1));
    assert_eq!(
        status, 200,
        "bob was refused while alice holds hers: {body}"
    );
    assert!(bob_follow.is_some());

    // Alice closes one: once its session has ended, she gets one more.
    drop(held.pop());
    agent.wait(
        "alice's closed follow gives its place back",
        || match follow(port, (&alice.0, &alice.1)) {
            (200, Some(conn), _) => {
                held.push(conn);
                true
            }
            _ => false,
        },
    );
    assert_eq!(held.len(), 8);
    assert!(agent.running());
}

/// `--streaming-connection-idle-timeout`: a follow of a log that stays
/// quiet is closed after that long (before, it was held for as long as the
/// container ran).
#[test]
fn a_quiet_follow_is_closed_after_the_idle_timeout() {
    let certs = tempfile::tempdir().unwrap();
    make_ca_and_client(certs.path(), "good");
    let client = (
        certs.path().join("good-client.crt"),
        certs.path().join("good-client.key"),
    );
    let fake = FakeCri::start();
    let (_agent, port) = node_with_a_log(
        &fake,
        certs.path(),
        &["--streaming-connection-idle-timeout", "1s"],
    );
    let (status, conn, _) = follow(port, (&client.0, &client.1));
    assert_eq!(status, 200);
    let mut conn = conn.unwrap();
    let started = Instant::now();
    let mut rest = Vec::new();
    let mut buf = [0u8; 1024];
    // Read until the server closes (or the 30 s read timeout says it never did).
    let closed = loop {
        match conn.read(&mut buf) {
            Ok(0) => break true,
            Ok(n) => rest.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => break true,
            Err(e)
                if e.kind() == std::io::ErrorKind::WouldBlock
                    || e.kind() == std::io::ErrorKind::TimedOut =>
            {
                break false
            }
            Err(_) => break true,
        }
    };
    assert!(closed, "the quiet follow was still open after 30 s");
    assert!(
        started.elapsed() >= Duration::from_millis(500),
        "closed after {:?}, before the idle timeout",
        started.elapsed()
    );
    assert!(
        !String::from_utf8_lossy(&rest).contains("0\r\n\r\n"),
        "an idle close is not the log's end: {rest:?}"
    );
}

/// The agent's process id (found by its root dir, as `server_threads`).
fn agent_pid(agent: &Agent) -> u32 {
    let root = agent.root_dir().display().to_string();
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .find_map(|p| {
            let pid: u32 = p.file_name().to_str()?.parse().ok()?;
            let cmd = std::fs::read(p.path().join("cmdline")).ok()?;
            String::from_utf8_lossy(&cmd).contains(&root).then_some(pid)
        })
        .expect("the agent's process")
}

/// Requests nobody authenticated, with made-up methods and 16 KiB path
/// roots, leave `kubelet_http_requests_total` with upstream's buckets (an
/// unknown root or method is `other`) and the process's memory where it
/// was: before, each root became a series kept for good (RSS grew by
/// 42 MiB here).
#[test]
fn a_flood_of_made_up_paths_neither_adds_series_nor_memory() {
    let fake = FakeCri::start();
    let ro = free_port();
    let ro_s = ro.to_string();
    let mut agent = Agent::start(
        &fake.endpoint(),
        &["--read-only-port", &ro_s, "--address", "127.0.0.1"],
    );
    wait_listening(&mut agent, ro);
    agent.wait("healthy", || get(ro, "/healthz").0 == 200);
    let pid = agent_pid(&agent);
    let rss = || crate::support::churn::Footprint::of(pid).rss_kib;
    // A warm-up with the same shape, so that the buffers a request needs
    // are there before the first reading.
    let flood = |n: usize, tag: &str| {
        let filler = "x".repeat(16 * 1024);
        let mut s = TcpStream::connect(("127.0.0.1", ro)).expect("connect");
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        let mut buf = vec![0u8; 4096];
        for i in 0..n {
            let method = if i % 2 == 0 {
                "GET".to_string()
            } else {
                format!("M{tag}{i}")
            };
            let req = format!("{method} /{tag}{i}{filler}/x HTTP/1.1\r\nHost: node\r\n\r\n");
            if s.write_all(req.as_bytes()).is_err() {
                s = TcpStream::connect(("127.0.0.1", ro)).expect("connect");
                s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
                continue;
            }
            // Each is answered 404 (or 405), and the connection kept.
            match s.read(&mut buf) {
                Ok(n) if n > 0 => {}
                _ => {
                    s = TcpStream::connect(("127.0.0.1", ro)).expect("connect");
                    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
                }
            }
        }
    };
    flood(200, "warm");
    let before = rss();
    flood(3000, "flood");
    let after = rss();
    // A generous bound: the unbounded labels kept 3000 x 16 KiB.
    assert!(
        after.saturating_sub(before) < 16 * 1024,
        "RSS grew from {before} KiB to {after} KiB"
    );
    let (status, metrics) = get(ro, "/metrics");
    assert_eq!(status, 200);
    let series: Vec<&str> = metrics
        .lines()
        .filter(|l| l.starts_with("kubelet_http_requests_total{"))
        .collect();
    assert!(series.len() <= 20, "{} series: {series:?}", series.len());
    assert!(
        series
            .iter()
            .any(|l| l.contains("method=\"other\",path=\"other\",server_type=\"readonly\"")),
        "{series:?}"
    );
    assert!(!metrics.contains("flood"), "a made-up path became a label");
    assert!(agent.running());
}

/// What a TLS client sends first (its ClientHello), as on the wire.
fn client_hello() -> Vec<u8> {
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    let mut conn = rustls::ClientConnection::new(tls_config(None), name).unwrap();
    let mut out = Vec::new();
    while conn.wants_write() {
        conn.write_tls(&mut out).unwrap();
    }
    out
}

/// Whether the server closed `s` (end of stream or reset) within `bound`.
fn cut_within(s: &TcpStream, bound: Duration) -> bool {
    s.set_read_timeout(Some(bound)).unwrap();
    let mut buf = [0u8; 256];
    loop {
        match (&*s).read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return true,
            Err(_) => return false,
        }
    }
}

/// A client that trickles its TLS handshake or its request head
/// a byte a second holds no worker. With 200 such handshakes on the main
/// port and some such heads on the plain ports, `/healthz` and an
/// authenticated `/pods` are answered at once (they waited forever when
/// four of them held the four workers), and each slow connection is cut
/// at its one deadline from accept however it trickles.
#[test]
fn slow_handshakes_and_heads_hold_no_worker() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    let certs = tempfile::tempdir().unwrap();
    make_ca_and_client(certs.path(), "good");
    let fake = FakeCri::start();
    let (port, ro, hz) = (free_port(), free_port(), free_port());
    let (port_s, ro_s, hz_s) = (port.to_string(), ro.to_string(), hz.to_string());
    let ca = certs.path().join("good-ca.crt");
    let mut agent = Agent::start(
        &fake.endpoint(),
        &[
            "--port",
            &port_s,
            "--read-only-port",
            &ro_s,
            "--healthz-port",
            &hz_s,
            "--address",
            "127.0.0.1",
            "--client-ca-file",
            ca.to_str().unwrap(),
            "--authorization-mode",
            "AlwaysAllow",
        ],
    );
    let good = (
        certs.path().join("good-client.crt"),
        certs.path().join("good-client.key"),
    );
    let cert = Some((good.0.as_path(), good.1.as_path()));
    for p in [port, ro, hz] {
        wait_listening(&mut agent, p);
    }
    agent.wait("healthy", || get(hz, "/healthz").0 == 200);

    // Each slow client gets one more byte of its first flight a second and
    // never the last one.
    let hello = client_hello();
    let head = b"GET /pods HTTP/1.1\r\nHost: node\r\nX-Padding: 0123456789\r\n\r\n".to_vec();
    let mut slow: Vec<(TcpStream, Vec<u8>)> = Vec::new();
    for _ in 0..200 {
        let s = TcpStream::connect(("127.0.0.1", port)).expect("connect");
        slow.push((s, hello.clone()));
    }
    for p in [ro, hz] {
        for _ in 0..10 {
            let s = TcpStream::connect(("127.0.0.1", p)).expect("connect");
            slow.push((s, head.clone()));
        }
    }
    let opened = Instant::now();
    let first_tls = slow[0].0.try_clone().unwrap();
    let first_plain = slow[200].0.try_clone().unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let trickle = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut sent = 0;
            while !stop.load(Ordering::Relaxed) {
                for (s, bytes) in &mut slow {
                    if sent + 1 < bytes.len() {
                        let _ = s.write_all(&bytes[sent..sent + 1]);
                    }
                }
                sent += 1;
                std::thread::sleep(Duration::from_secs(1));
            }
        })
    };
    std::thread::sleep(Duration::from_secs(2));

    // Answered at once: "forever" before, a few seconds is generous.
    let bound = Duration::from_secs(5);
    let mut s = TcpStream::connect(("127.0.0.1", hz)).expect("connect");
    s.set_read_timeout(Some(bound)).unwrap();
    let req = b"GET /healthz HTTP/1.1\r\nHost: node\r\nConnection: close\r\n\r\n";
    assert_eq!(
        exchange(&mut s, req),
        (200, "ok".to_string()),
        "/healthz on the healthz port beside 220 slow clients"
    );
    let (status, body) =
        tls_get_within(port, "/pods", cert, bound).expect("/pods on the main port");
    assert_eq!(status, 200, "/pods on the main port: {body}");
    let mut s = TcpStream::connect(("127.0.0.1", ro)).expect("connect");
    s.set_read_timeout(Some(bound)).unwrap();
    assert_eq!(
        exchange(&mut s, req).0,
        200,
        "/healthz on the read-only port"
    );

    // One deadline from accept (10 s), however the client trickles.
    assert!(
        cut_within(&first_tls, Duration::from_secs(20)),
        "a trickled handshake was not cut"
    );
    assert!(
        cut_within(&first_plain, Duration::from_secs(5)),
        "a trickled head was not cut"
    );
    assert!(
        opened.elapsed() < Duration::from_secs(20),
        "cut only after {:?}",
        opened.elapsed()
    );
    stop.store(true, Ordering::Relaxed);
    trickle.join().unwrap();

    // One TLS connection, kept alive: two requests in one record, a pause
    // (it waits on the poll thread), then a third. Nothing decrypted with
    // a head is lost between the poll thread and the workers.
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    let conn = rustls::ClientConnection::new(tls_config(cert), name).unwrap();
    let tcp = TcpStream::connect(("127.0.0.1", port)).unwrap();
    tcp.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut tls = rustls::StreamOwned::new(conn, tcp);
    let two =
        b"GET /healthz HTTP/1.1\r\nHost: node\r\n\r\nGET /pods HTTP/1.1\r\nHost: node\r\n\r\n";
    tls.write_all(two).unwrap();
    let mut seen = Vec::new();
    let mut buf = [0u8; 16384];
    while count(&seen, b"HTTP/1.1 200 OK") < 2 {
        let n = tls.read(&mut buf).expect("two answers");
        assert!(n > 0, "closed after {}", String::from_utf8_lossy(&seen));
        seen.extend_from_slice(&buf[..n]);
    }
    std::thread::sleep(Duration::from_millis(500));
    tls.write_all(b"GET /healthz/ping HTTP/1.1\r\nHost: node\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut rest = Vec::new();
    match tls.read_to_end(&mut rest) {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof && !rest.is_empty() => {}
        Err(e) => panic!("the third answer: {e}"),
    }
    let rest = String::from_utf8_lossy(&rest);
    assert!(
        rest.starts_with("HTTP/1.1 200 OK") && rest.ends_with("\r\n\r\nok"),
        "{rest}"
    );
    assert!(agent.running());
}

fn count(hay: &[u8], needle: &[u8]) -> usize {
    hay.windows(needle.len()).filter(|w| *w == needle).count()
}

/// User and system CPU (clock ticks) of the agent's thread named `name`.
fn thread_ticks(agent: &Agent, name: &str) -> Option<u64> {
    let root = agent.root_dir().display().to_string();
    for p in std::fs::read_dir("/proc").ok()?.flatten() {
        let cmd = std::fs::read(p.path().join("cmdline")).unwrap_or_default();
        if !String::from_utf8_lossy(&cmd).contains(&root) {
            continue;
        }
        for t in std::fs::read_dir(p.path().join("task")).ok()?.flatten() {
            let comm = std::fs::read_to_string(t.path().join("comm")).unwrap_or_default();
            if comm.trim_end() != name {
                continue;
            }
            let stat = std::fs::read_to_string(t.path().join("stat")).ok()?;
            let after = stat.rsplit_once(')')?.1;
            let fields: Vec<&str> = after.split_whitespace().collect();
            // Fields 14 and 15 of stat(5), counted from the state (3).
            let utime: u64 = fields.get(11)?.parse().ok()?;
            let stime: u64 = fields.get(12)?.parse().ok()?;
            return Some(utime + stime);
        }
    }
    None
}

/// When accept fails for want of descriptors, the poll thread
/// leaves the listeners alone a while instead of polling them again at
/// once (it spun, a core's worth, for as long as the backlog waited), and
/// the port serves again once descriptors are free.
#[test]
fn accept_out_of_descriptors_pauses_and_recovers() {
    let fake = FakeCri::start();
    let ro = free_port();
    let ro_s = ro.to_string();
    let mut agent = Agent::start_with_nofile(
        &fake.endpoint(),
        &["--read-only-port", &ro_s, "--address", "127.0.0.1"],
        64,
    );
    wait_listening(&mut agent, ro);
    agent.wait("healthy", || get(ro, "/healthz").0 == 200);
    let mut held = Vec::new();
    for _ in 0..100 {
        let addr = std::net::SocketAddr::from(([127, 0, 0, 1], ro));
        if let Ok(s) = TcpStream::connect_timeout(&addr, Duration::from_secs(1)) {
            held.push(s);
        }
    }
    let end = Instant::now() + Duration::from_secs(5);
    while !agent.log().contains("pausing new connections") {
        assert!(
            Instant::now() < end,
            "accept never failed with {} connections\n{}",
            held.len(),
            agent.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let before = thread_ticks(&agent, "server-poll").expect("a server-poll thread");
    std::thread::sleep(Duration::from_secs(3));
    let spent = thread_ticks(&agent, "server-poll").expect("a server-poll thread") - before;
    // Paused, a few wake-ups a second; spinning takes most of a core
    // (300 ticks in 3 s), and still far over this on a busy machine.
    assert!(
        spent < 30,
        "server-poll took {spent} ticks of CPU in 3 s while accept failed"
    );
    drop(held);
    agent.wait("served again", || get(ro, "/healthz").0 == 200);
    assert!(agent.log().contains("accepting connections again"));
}
