//! Running one probe (upstream `prober.go` and `pkg/probe`): exec through
//! the runtime manager (CRI ExecSync with the probe's timeout), httpGet with
//! the kubelet's one httpGet client (`crate::httpget`: HTTPS without
//! verification, no proxy, no kept connections, same-host redirects followed
//! up to 10 as Go's client does for the kubelet), tcpSocket with a plain
//! connect. An errored run is tried up to three times; failures become
//! `Unhealthy` events with upstream's wording.

use std::net::{TcpStream, ToSocketAddrs};
use std::sync::Arc;
use std::time::Duration;

use log::debug;

use super::spec::{Action, HttpGet};
use super::worker::{Job, Outcome};
use crate::events::{EventRecorder, EventType, ObjectRef};
use crate::httpget::{self, Failure, Proxy};
use crate::pod::pod_full_name;
use crate::runtime::RuntimeManager;

/// Upstream reads at most this much of a probe's output or response body.
const MAX_OUTPUT: u64 = 10 * 1024;
/// Tries of a probe that errors (upstream `maxProbeRetries`).
const MAX_TRIES: usize = 3;

/// What one try found (upstream `probe.Result` with its output).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Found {
    Success(String),
    /// A success worth an event: a redirect to another host was not followed.
    Warning(String),
    Failure(String),
    /// The probe could not be run at all.
    Error(String),
}

/// `kube-probe/1.20`: the User-Agent upstream's HTTP probes send, with the
/// Kubernetes version tinylet reports.
pub(crate) fn user_agent() -> String {
    let v = crate::version::kubelet().trim_start_matches('v');
    let mut parts = v.split('.');
    let major = parts.next().unwrap_or("1");
    let minor = parts.next().unwrap_or("0");
    format!("kube-probe/{major}.{minor}")
}

/// The HTTP client of httpGet probes: the kubelet's httpGet agent with no
/// proxy, upstream's User-Agent and `Accept: */*` unless the probe sets its
/// own.
pub fn probe_agent() -> ureq::Agent {
    httpget::agent(&user_agent(), Proxy::Direct)
}

/// What a probe runner thread holds.
pub(crate) struct Runner {
    runtime: Arc<RuntimeManager>,
    agent: ureq::Agent,
    recorder: EventRecorder,
}

impl Runner {
    pub(crate) fn new(runtime: Arc<RuntimeManager>, recorder: EventRecorder) -> Runner {
        Runner {
            runtime,
            agent: probe_agent(),
            recorder,
        }
    }

    /// Runs the job (retrying errors), reports what it found as events and
    /// returns the outcome for the state machine.
    pub(crate) fn run(&self, job: &Job) -> Outcome {
        let mut found = self.probe_once(job);
        for _ in 1..MAX_TRIES {
            if !matches!(found, Found::Error(_)) {
                break;
            }
            found = self.probe_once(job);
        }
        let kind = job.kind.name();
        let obj = || ObjectRef::container(&job.pod, &job.container, false);
        let who = || {
            format!(
                "pod {}: container {:?}",
                pod_full_name(&job.pod),
                job.container
            )
        };
        match found {
            Found::Success(_) => Outcome::Success,
            Found::Warning(out) => {
                self.recorder.event(
                    &obj(),
                    EventType::Warning,
                    "ProbeWarning",
                    format!("{kind} probe warning: {out}"),
                );
                Outcome::Success
            }
            Found::Failure(out) => {
                debug!("{}: {kind} probe failed: {out}", who());
                self.recorder.event(
                    &obj(),
                    EventType::Warning,
                    "Unhealthy",
                    format!("{kind} probe failed: {out}"),
                );
                Outcome::Failure
            }
            Found::Error(e) => {
                debug!("{}: {kind} probe errored: {e}", who());
                self.recorder.event(
                    &obj(),
                    EventType::Warning,
                    "Unhealthy",
                    format!("{kind} probe errored: {e}"),
                );
                Outcome::Error
            }
        }
    }

    fn probe_once(&self, job: &Job) -> Found {
        match &job.action {
            Action::Exec(cmd) => self.exec(job, cmd),
            Action::Http(h) => match host(h.host.as_deref(), job) {
                Ok(host) => http_get(&self.agent, h, &host, job.timeout),
                Err(e) => Found::Error(e),
            },
            Action::Tcp { host: h, port } => match host(h.as_deref(), job) {
                Ok(host) => tcp_connect(&host, *port, job.timeout),
                Err(e) => Found::Error(e),
            },
            Action::Unsupported(e) => Found::Error(e.clone()),
        }
    }

    fn exec(&self, job: &Job, cmd: &[String]) -> Found {
        match self.runtime.exec_sync(&job.container_id, cmd, job.timeout) {
            Ok(r) => {
                let mut out = r.stdout;
                out.extend_from_slice(&r.stderr);
                out.truncate(MAX_OUTPUT as usize);
                let out = String::from_utf8_lossy(&out).into_owned();
                if r.exit_code == 0 {
                    Found::Success(out)
                } else {
                    Found::Failure(out)
                }
            }
            Err(e) if e.is_timeout() => {
                Found::Failure(format!("command {:?} timed out", cmd.join(" ")))
            }
            Err(e) => Found::Error(e.to_string()),
        }
    }
}

/// The host to connect to: the probe's own, else the pod's IP.
fn host(own: Option<&str>, job: &Job) -> Result<String, String> {
    own.map(str::to_string)
        .or_else(|| job.pod_ip.clone())
        .ok_or_else(|| "the pod has no IP yet".to_string())
}

fn host_port(host: &str, port: u16) -> String {
    if host.contains(':') && !host.starts_with('[') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// The probe's URL, as upstream's `formatURL` builds it.
pub(crate) fn probe_url(h: &HttpGet, host: &str) -> String {
    let path = if h.path.starts_with('/') {
        h.path.clone()
    } else {
        format!("/{}", h.path)
    };
    format!("{}://{}{path}", h.scheme, host_port(host, h.port))
}

/// An HTTP GET probe: 200-399 passes; redirects to the same host are
/// followed, one to another host ends the probe with a warning.
pub fn http_get(agent: &ureq::Agent, h: &HttpGet, host: &str, timeout: Duration) -> Found {
    // The probe's own headers win over the agent's User-Agent and Accept.
    let headers: Vec<(&str, &str)> = h
        .headers
        .iter()
        .map(|(name, value)| (name.as_str(), value.as_str()))
        .collect();
    let resp = match httpget::get(agent, &probe_url(h, host), &headers, timeout) {
        Ok(r) => r,
        Err(Failure::Request { url, error }) => {
            return Found::Failure(format!("Get {url:?}: {}", go_error(&error, &url)))
        }
        Err(Failure::TooManyRedirects(message)) => return Found::Failure(message),
    };
    let body = match resp.body {
        Ok(b) => String::from_utf8_lossy(&b).into_owned(),
        Err(e) => return Found::Error(format!("reading the response of {}: {e}", resp.url)),
    };
    match resp.status {
        200..=299 => Found::Success(body),
        300..=399 => Found::Warning(format!("Probe terminated redirects, Response body: {body}")),
        status => Found::Failure(format!("HTTP probe failed with statuscode: {status}")),
    }
}

/// A client error in the words Go's client uses, where there is a match.
fn go_error(e: &ureq::Error, url: &str) -> String {
    let dial = || {
        let (_, rest) = url.split_once("://").unwrap_or(("", url));
        format!("dial tcp {}", rest.split('/').next().unwrap_or(rest))
    };
    match e {
        ureq::Error::Timeout(_) => {
            "context deadline exceeded (Client.Timeout exceeded while awaiting headers)".into()
        }
        ureq::Error::Io(io) => io_error(io, &dial()),
        ureq::Error::ConnectionFailed => format!("{}: connect: connection refused", dial()),
        other => other.to_string(),
    }
}

fn io_error(e: &std::io::Error, dial: &str) -> String {
    use std::io::ErrorKind;
    match e.kind() {
        ErrorKind::ConnectionRefused => format!("{dial}: connect: connection refused"),
        ErrorKind::TimedOut | ErrorKind::WouldBlock => format!("{dial}: i/o timeout"),
        ErrorKind::ConnectionReset => format!("{dial}: read: connection reset by peer"),
        _ => format!("{dial}: {e}"),
    }
}

/// A TCP probe: connecting within the timeout passes.
pub(crate) fn tcp_connect(host: &str, port: u16, timeout: Duration) -> Found {
    let target = host_port(host, port);
    let dial = format!("dial tcp {target}");
    let addrs = match (host.trim_matches(['[', ']']), port).to_socket_addrs() {
        Ok(a) => a.collect::<Vec<_>>(),
        Err(e) => return Found::Failure(format!("{dial}: lookup {host}: {e}")),
    };
    let mut last = None;
    for addr in addrs {
        match TcpStream::connect_timeout(&addr, timeout) {
            Ok(_) => return Found::Success(String::new()),
            Err(e) => last = Some(e),
        }
    }
    Found::Failure(match last {
        Some(e) => io_error(&e, &dial),
        None => format!("{dial}: no address"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{BufRead, BufReader, Write};
    use std::net::TcpListener;

    /// A one-thread HTTP server answering each request with the next of
    /// `answers` (status line and extra headers); returns its port and what
    /// it received.
    fn server(
        answers: Vec<(&'static str, String)>,
    ) -> (u16, crate::thread::JoinOnDrop<Vec<String>>) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let t = crate::thread::spawn_named("test-http", move || {
            let mut seen = Vec::new();
            for (status, headers) in answers {
                let (mut s, _) = l.accept().unwrap();
                let mut r = BufReader::new(s.try_clone().unwrap());
                let mut req = String::new();
                loop {
                    let mut line = String::new();
                    r.read_line(&mut line).unwrap();
                    if line == "\r\n" || line.is_empty() {
                        break;
                    }
                    req.push_str(&line);
                }
                seen.push(req);
                let body = "hello";
                write!(
                    s,
                    "HTTP/1.1 {status}\r\n{headers}Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                )
                .unwrap();
            }
            seen
        })
        .unwrap();
        (port, t)
    }

    fn get(port: u16, path: &str, headers: Vec<(String, String)>) -> HttpGet {
        HttpGet {
            scheme: "http".into(),
            host: None,
            port,
            path: path.into(),
            headers,
        }
    }

    fn agent() -> ureq::Agent {
        probe_agent()
    }

    #[test]
    fn http_success_failure_and_upstream_headers() {
        let (port, t) = server(vec![
            ("200 OK", String::new()),
            ("503 Service Unavailable", String::new()),
        ]);
        let a = agent();
        let h = get(port, "healthz", vec![("X-Custom".into(), "yes".into())]);
        assert_eq!(
            http_get(&a, &h, "127.0.0.1", Duration::from_secs(2)),
            Found::Success("hello".into())
        );
        assert_eq!(
            http_get(&a, &h, "127.0.0.1", Duration::from_secs(2)),
            Found::Failure("HTTP probe failed with statuscode: 503".into())
        );
        let seen = t.join().unwrap();
        let first = seen[0].to_ascii_lowercase();
        assert!(first.starts_with("get /healthz http/1.1\r\n"), "{first}");
        assert!(first.contains("user-agent: kube-probe/1.20\r\n"), "{first}");
        assert!(first.contains("accept: */*\r\n"), "{first}");
        assert!(first.contains("x-custom: yes\r\n"), "{first}");
    }

    #[test]
    fn http_follows_same_host_redirects_and_warns_on_others() {
        let (port, t) = server(vec![
            ("302 Found", "Location: /ready\r\n".into()),
            ("200 OK", String::new()),
            (
                "301 Moved Permanently",
                "Location: http://elsewhere.test/x\r\n".into(),
            ),
        ]);
        let a = agent();
        let h = get(port, "/", vec![]);
        assert_eq!(
            http_get(&a, &h, "127.0.0.1", Duration::from_secs(2)),
            Found::Success("hello".into())
        );
        assert_eq!(
            http_get(&a, &h, "127.0.0.1", Duration::from_secs(2)),
            Found::Warning("Probe terminated redirects, Response body: hello".into())
        );
        let seen = t.join().unwrap();
        assert!(seen[1].starts_with("GET /ready "), "{:?}", seen[1]);
    }

    #[test]
    fn refused_connections_fail_in_gos_words() {
        // A port nothing listens on: bind, note it, close.
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        assert_eq!(
            tcp_connect("127.0.0.1", port, Duration::from_secs(1)),
            Found::Failure(format!(
                "dial tcp 127.0.0.1:{port}: connect: connection refused"
            ))
        );
        let a = agent();
        assert_eq!(
            http_get(&a, &get(port, "/", vec![]), "127.0.0.1", Duration::from_secs(1)),
            Found::Failure(format!(
                "Get \"http://127.0.0.1:{port}/\": dial tcp 127.0.0.1:{port}: connect: connection refused"
            ))
        );
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let open = l.local_addr().unwrap().port();
        assert_eq!(
            tcp_connect("127.0.0.1", open, Duration::from_secs(1)),
            Found::Success(String::new())
        );
    }

    #[test]
    fn urls_and_locations() {
        let h = get(8080, "healthz?full=1", vec![]);
        assert_eq!(
            probe_url(&h, "10.0.0.1"),
            "http://10.0.0.1:8080/healthz?full=1"
        );
        assert_eq!(
            probe_url(&h, "fd00::1"),
            "http://[fd00::1]:8080/healthz?full=1"
        );
    }
}
