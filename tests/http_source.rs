//! The HTTP source against a tiny HTTP server in the test (a TcpListener
//! thread answering whatever the test sets): single pod, pod list, 404,
//! 500, empty body, garbage, invalid pods, oversize, unchanged bodies, the
//! headers sent, and how failures are logged.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Once};
use std::time::{Duration, Instant};

use crossbeam_channel::{bounded, Receiver};
use tinylet::config::{HttpSource, PodOperation, PodUpdate, MAX_MANIFEST_SIZE};
use tinylet::pod::{CONFIG_HASH_ANNOTATION_KEY, CONFIG_SOURCE_ANNOTATION_KEY, HTTP_SOURCE};
use tinylet::thread::{spawn_named, JoinOnDrop};

const NODE: &str = "node1";
const PERIOD: Duration = Duration::from_millis(40);
const WAIT: Duration = Duration::from_secs(10);
/// Long enough for several polls.
const QUIET: Duration = Duration::from_millis(400);

fn pod_yaml(name: &str, image: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\nspec:\n  containers:\n  - name: c\n    image: {image}\n"
    )
}

fn pod_list_json(pods: &[(&str, &str)]) -> String {
    let items: Vec<String> = pods
        .iter()
        .map(|(name, image)| {
            format!(
                r#"{{"metadata":{{"name":"{name}"}},"spec":{{"containers":[{{"name":"c","image":"{image}"}}]}}}}"#
            )
        })
        .collect();
    format!(
        r#"{{"apiVersion":"v1","kind":"PodList","items":[{}]}}"#,
        items.join(",")
    )
}

/// One request as the server saw it.
#[derive(Debug, Clone)]
pub struct Request {
    pub method: String,
    pub path: String,
    /// By lower-case name.
    pub headers: BTreeMap<String, Vec<String>>,
}

struct Reply {
    status: u16,
    body: Vec<u8>,
}

/// A one-request-per-connection HTTP/1.1 server on 127.0.0.1 (also used
/// by the end-to-end tests).
pub struct Server {
    /// Where it serves (any path gets the same reply).
    pub url: String,
    reply: Arc<Mutex<Reply>>,
    requests: Arc<Mutex<Vec<Request>>>,
    stop: Arc<AtomicBool>,
    addr: std::net::SocketAddr,
    thread: Option<JoinOnDrop<()>>,
}

impl Server {
    /// Starts serving 404 until [`Server::set`] says otherwise.
    pub fn start() -> Server {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
        let addr = listener.local_addr().expect("local addr");
        let reply = Arc::new(Mutex::new(Reply {
            status: 404,
            body: b"not yet".to_vec(),
        }));
        let requests = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (r, q, s) = (reply.clone(), requests.clone(), stop.clone());
        let thread = spawn_named("test-http-server", move || {
            for conn in listener.incoming() {
                if s.load(Ordering::SeqCst) {
                    break;
                }
                if let Ok(conn) = conn {
                    serve(conn, &r, &q);
                }
            }
        })
        .expect("server thread");
        Server {
            url: format!("http://{addr}/manifests/pods.yaml"),
            reply,
            requests,
            stop,
            addr,
            thread: Some(thread),
        }
    }

    /// What every following request gets.
    pub fn set(&self, status: u16, body: impl Into<Vec<u8>>) {
        *self.reply.lock().unwrap() = Reply {
            status,
            body: body.into(),
        };
    }

    pub fn requests(&self) -> Vec<Request> {
        self.requests.lock().unwrap().clone()
    }

    /// Waits until `n` more requests than `since` were served.
    fn wait_polls(&self, since: usize, n: usize) {
        let deadline = Instant::now() + WAIT;
        while self.requests().len() < since + n {
            assert!(Instant::now() < deadline, "the source stopped polling");
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect(self.addr);
        drop(self.thread.take());
    }
}

fn serve(conn: TcpStream, reply: &Mutex<Reply>, requests: &Mutex<Vec<Request>>) {
    let _ = conn.set_read_timeout(Some(Duration::from_secs(5)));
    let mut reader = BufReader::new(&conn);
    let mut line = String::new();
    if reader.read_line(&mut line).is_err() || line.is_empty() {
        return;
    }
    let mut parts = line.split_whitespace();
    let method = parts.next().unwrap_or_default().to_string();
    let path = parts.next().unwrap_or_default().to_string();
    let mut headers: BTreeMap<String, Vec<String>> = BTreeMap::new();
    loop {
        let mut h = String::new();
        if reader.read_line(&mut h).is_err() || h.trim_end().is_empty() {
            break;
        }
        if let Some((name, value)) = h.trim_end().split_once(':') {
            headers
                .entry(name.trim().to_ascii_lowercase())
                .or_default()
                .push(value.trim().to_string());
        }
    }
    requests.lock().unwrap().push(Request {
        method,
        path,
        headers,
    });
    let (status, body) = {
        let r = reply.lock().unwrap();
        (r.status, r.body.clone())
    };
    let reason = match status {
        200 => "OK",
        404 => "Not Found",
        500 => "Internal Server Error",
        _ => "Other",
    };
    let mut out = &conn;
    let _ = write!(
        out,
        "HTTP/1.1 {status} {reason}\r\nContent-Length: {}\r\nContent-Type: application/yaml\r\nConnection: close\r\n\r\n",
        body.len()
    );
    let _ = out.write_all(&body);
    let _ = out.flush();
}

fn start_source(server: &Server, headers: &[(&str, &str)]) -> (HttpSource, Receiver<PodUpdate>) {
    let (tx, rx) = bounded(16);
    let headers = headers
        .iter()
        .map(|(n, v)| (n.to_string(), v.to_string()))
        .collect();
    let source = HttpSource::start(server.url.clone(), headers, NODE.into(), PERIOD, tx)
        .expect("HTTP source starts");
    (source, rx)
}

fn names(u: &PodUpdate) -> Vec<String> {
    u.pods
        .iter()
        .map(|p| p.metadata.name.clone().unwrap_or_default())
        .collect()
}

fn next_set(rx: &Receiver<PodUpdate>) -> PodUpdate {
    let u = rx.recv_timeout(WAIT).expect("no SET from the HTTP source");
    assert_eq!((u.op, u.source.as_str()), (PodOperation::Set, HTTP_SOURCE));
    u
}

fn assert_quiet(rx: &Receiver<PodUpdate>, what: &str) {
    if let Ok(u) = rx.recv_timeout(QUIET) {
        panic!("{what}: unexpected {:?} of {:?}", u.op, names(&u));
    }
}

#[test]
fn http_single_pod_with_headers_and_defaults() {
    let server = Server::start();
    server.set(200, pod_yaml("web", "nginx:1"));
    let (_source, rx) = start_source(
        &server,
        &[
            ("Authorization", "Bearer s3cret"),
            ("X-Tier", "a"),
            ("X-Tier", "b"),
        ],
    );
    let u = next_set(&rx);
    assert_eq!(names(&u), ["web-node1"]);
    let pod = &u.pods[0];
    let uid = pod.metadata.uid.clone().expect("a generated UID");
    assert_eq!(uid.len(), 32);
    let ann = pod.metadata.annotations.as_ref().expect("annotations");
    assert_eq!(ann[CONFIG_SOURCE_ANNOTATION_KEY], "http");
    assert_eq!(ann[CONFIG_HASH_ANNOTATION_KEY], uid);
    assert_eq!(pod.metadata.namespace.as_deref(), Some("default"));
    let spec = pod.spec.as_ref().expect("spec");
    assert_eq!(spec.node_name.as_deref(), Some(NODE));
    assert_eq!(spec.tolerations, None, "only file pods get the toleration");
    assert_eq!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Pending")
    );

    let req = &server.requests()[0];
    assert_eq!(
        (req.method.as_str(), req.path.as_str()),
        ("GET", "/manifests/pods.yaml")
    );
    assert_eq!(req.headers["authorization"], ["Bearer s3cret"]);
    assert_eq!(req.headers["x-tier"], ["a", "b"]);
    assert!(
        req.headers["user-agent"][0].starts_with("tinylet/"),
        "{:?}",
        req.headers
    );

    // A second source (a restart) gives the same UID; another node another.
    drop(_source);
    let (_again, rx2) = start_source(&server, &[]);
    assert_eq!(
        next_set(&rx2).pods[0].metadata.uid.as_deref(),
        Some(uid.as_str())
    );
    let (tx, rx3) = bounded(4);
    let _other = HttpSource::start(server.url.clone(), vec![], "node2".into(), PERIOD, tx)
        .expect("HTTP source starts");
    let other = next_set(&rx3);
    assert_eq!(names(&other), ["web-node2"]);
    assert_ne!(other.pods[0].metadata.uid.as_deref(), Some(uid.as_str()));
}

#[test]
fn http_pod_list_and_unchanged_bodies() {
    let server = Server::start();
    server.set(200, pod_list_json(&[("a", "busybox"), ("b", "busybox:2")]));
    let (_source, rx) = start_source(&server, &[]);
    assert_eq!(names(&next_set(&rx)), ["a-node1", "b-node1"]);

    // The same body again and again: polled, but nothing sent.
    let seen = server.requests().len();
    server.wait_polls(seen, 5);
    assert_quiet(&rx, "unchanged body");

    // The same pods in YAML with other formatting: not the same body, but
    // the same pods, so still nothing sent.
    server.set(
        200,
        "apiVersion: v1\nkind: PodList\nitems:\n- metadata: {name: a}\n  spec: {containers: [{name: c, image: busybox}]}\n- metadata: {name: b}\n  spec: {containers: [{name: c, image: 'busybox:2'}]}\n",
    );
    let seen = server.requests().len();
    server.wait_polls(seen, 3);
    assert_quiet(&rx, "same pods in another encoding");

    // A change.
    server.set(200, pod_list_json(&[("b", "busybox:3")]));
    let u = next_set(&rx);
    assert_eq!(names(&u), ["b-node1"]);
    assert_eq!(
        u.pods[0].spec.as_ref().unwrap().containers[0]
            .image
            .as_deref(),
        Some("busybox:3")
    );
    // An empty list is a valid answer: no pods.
    server.set(200, r#"{"kind":"PodList","apiVersion":"v1","items":[]}"#);
    assert!(next_set(&rx).pods.is_empty());
}

#[test]
fn http_errors_keep_the_last_good_state() {
    let server = Server::start();
    // 404 from the start: the source sends nothing (it is not seen).
    let (_source, rx) = start_source(&server, &[]);
    server.wait_polls(0, 3);
    assert_quiet(&rx, "404 at start");

    server.set(200, pod_yaml("web", "nginx:1"));
    let good = next_set(&rx);
    assert_eq!(names(&good), ["web-node1"]);

    let cases: Vec<(&str, u16, Vec<u8>)> = vec![
        ("500", 500, pod_yaml("web", "nginx:9").into_bytes()),
        ("404", 404, b"gone".to_vec()),
        ("garbage", 200, b"{{{ this is : not [ yaml".to_vec()),
        ("binary", 200, vec![0xff, 0xfe, 0x00, 0x01]),
        (
            "wrong kind",
            200,
            b"kind: Service\nmetadata: {name: s}\n".to_vec(),
        ),
        (
            "invalid pod",
            200,
            pod_yaml("Web_Bad", "nginx").into_bytes(),
        ),
        (
            "invalid image",
            200,
            pod_yaml("web", "Nginx:Bad").into_bytes(),
        ),
        (
            "one invalid item refuses the list",
            200,
            pod_list_json(&[("ok", "busybox"), ("bad", "")]).into_bytes(),
        ),
        ("oversize", 200, {
            let mut big = pod_yaml("big", "busybox").into_bytes();
            big.extend(b"# ");
            big.extend(std::iter::repeat_n(b'x', MAX_MANIFEST_SIZE as usize));
            big
        }),
    ];
    for (what, status, body) in cases {
        server.set(status, body);
        let seen = server.requests().len();
        server.wait_polls(seen, 2);
        assert_quiet(&rx, what);
    }

    // Back to the good body: it differs from the last body seen, but gives
    // the pods already sent, so nothing is sent.
    server.set(200, pod_yaml("web", "nginx:1"));
    let seen = server.requests().len();
    server.wait_polls(seen, 2);
    assert_quiet(&rx, "recovered to the same state");

    // A zero-length body empties the source (and marks it as seen)...
    server.set(200, Vec::new());
    assert!(next_set(&rx).pods.is_empty());
    let seen = server.requests().len();
    server.wait_polls(seen, 2);
    assert_quiet(&rx, "repeated empty body");
    // ...and the same good body as before the empty one brings the pod back.
    server.set(200, pod_yaml("web", "nginx:1"));
    let back = next_set(&rx);
    assert_eq!(back.pods, good.pods);
}

#[test]
fn http_empty_body_first_marks_the_source_seen() {
    let server = Server::start();
    server.set(200, Vec::new());
    let (_source, rx) = start_source(&server, &[]);
    assert!(next_set(&rx).pods.is_empty());
}

#[test]
fn http_source_stops_when_dropped() {
    let server = Server::start();
    server.set(200, pod_yaml("web", "nginx"));
    let (source, rx) = start_source(&server, &[]);
    next_set(&rx);
    drop(source);
    let after_drop = server.requests().len();
    std::thread::sleep(QUIET);
    assert!(server.requests().len() <= after_drop + 1);
}

#[test]
fn http_source_stops_when_nobody_listens() {
    let server = Server::start();
    server.set(200, pod_yaml("web", "nginx"));
    let (source, rx) = start_source(&server, &[]);
    next_set(&rx);
    drop(rx);
    // The next change finds nobody to send to, and the source ends.
    server.set(200, pod_yaml("web", "nginx:2"));
    std::thread::sleep(QUIET);
    let polls = server.requests().len();
    std::thread::sleep(QUIET);
    assert_eq!(server.requests().len(), polls, "still polling for nobody");
    drop(source);
}

/// Records the config module's log lines, for the failure-logging test.
struct Capture {
    records: Mutex<Vec<(log::Level, String)>>,
}

impl log::Log for Capture {
    fn enabled(&self, metadata: &log::Metadata) -> bool {
        metadata.target().starts_with("tinylet::config::http")
    }

    fn log(&self, record: &log::Record) {
        if self.enabled(record.metadata()) {
            if let Ok(mut r) = self.records.lock() {
                r.push((record.level(), record.args().to_string()));
            }
        }
    }

    fn flush(&self) {}
}

static CAPTURE: Capture = Capture {
    records: Mutex::new(Vec::new()),
};
static INSTALL: Once = Once::new();

fn captured(url: &str) -> Vec<(log::Level, String)> {
    CAPTURE
        .records
        .lock()
        .unwrap()
        .iter()
        .filter(|(_, msg)| msg.contains(url))
        .cloned()
        .collect()
}

#[test]
fn http_failures_are_logged_loudly_three_times_then_quietly() {
    INSTALL.call_once(|| {
        log::set_logger(&CAPTURE).expect("no other logger in the test binary");
        log::set_max_level(log::LevelFilter::Debug);
    });
    let server = Server::start();
    server.set(500, "boom");
    let (_source, rx) = start_source(&server, &[]);
    let failures = |url: &str| {
        captured(url)
            .into_iter()
            .filter(|(_, m)| m.contains("failed to read pods"))
            .collect::<Vec<_>>()
    };
    let deadline = Instant::now() + WAIT;
    while failures(&server.url).len() < 6 {
        assert!(Instant::now() < deadline, "failures not logged");
        std::thread::sleep(Duration::from_millis(10));
    }
    server.set(200, pod_yaml("web", "nginx"));
    next_set(&rx);
    let deadline = Instant::now() + WAIT;
    while !captured(&server.url)
        .iter()
        .any(|(_, m)| m.contains("works again"))
    {
        assert!(Instant::now() < deadline, "recovery not logged");
        std::thread::sleep(Duration::from_millis(10));
    }
    let levels: Vec<log::Level> = failures(&server.url).iter().map(|(l, _)| *l).collect();
    assert_eq!(&levels[..3], [log::Level::Warn; 3], "{levels:?}");
    assert!(
        levels[3..].iter().all(|l| *l == log::Level::Debug),
        "{levels:?}"
    );
    assert!(failures(&server.url)[0].1.contains("500"));
    let recovered: Vec<_> = captured(&server.url)
        .into_iter()
        .filter(|(_, m)| m.contains("works again"))
        .collect();
    assert_eq!(recovered.len(), 1);
    assert_eq!(recovered[0].0, log::Level::Info);

    // Later successes log nothing more about recovering.
    let seen = server.requests().len();
    server.wait_polls(seen, 3);
    let again = captured(&server.url)
        .into_iter()
        .filter(|(_, m)| m.contains("works again"))
        .count();
    assert_eq!(again, 1);
}
