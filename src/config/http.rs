//! The HTTP source: pods polled from a manifest URL (`--manifest-url`),
//! sent to the merge as a SET of all of them (upstream `config/http.go`).
//!
//! One thread, `config-http`, polls the URL at start and then
//! `--http-check-frequency` after each poll ends, with ureq and a 10 s
//! timeout per request. The body is one Pod or a PodList, in YAML or JSON,
//! at most [`MAX_MANIFEST_SIZE`] bytes.
//!
//! - A body equal to the last one is not parsed again and sends nothing.
//! - A body that can't be decoded, or with any pod that fails the static
//!   pod defaults and validation, is refused as a whole: the last good
//!   state stays in force (a typo in one item never stops the others).
//! - A non-200 answer or a failed request is an error and changes nothing.
//! - An empty body sends an empty SET (so the source counts as seen, and
//!   its pods go) and is logged as an error.
//!
//! The first three failures in a row are logged as warnings, later ones at
//! debug level, and the first success after failures once at info level.

use std::io;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{bounded, select, Receiver, Sender};

use super::decode::decode_pod_or_list;
use super::defaults::apply_static_defaults;
use super::file::MAX_MANIFEST_SIZE;
use super::{Pod, PodOperation, PodUpdate};
use crate::pod::HTTP_SOURCE;
use crate::thread::{spawn_with_stack, JoinOnDrop};

/// How often the URL is polled (`--http-check-frequency`).
pub const DEFAULT_HTTP_CHECK_FREQUENCY: Duration = Duration::from_secs(20);

/// Deadline of one request, connection and body included.
pub const HTTP_REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// Failures in a row logged as warnings before the rest go to debug.
const LOUD_FAILURES: u32 = 3;

/// How long dropping the source waits for a request in flight before it
/// lets the thread finish on its own.
const STOP_WAIT: Duration = Duration::from_millis(500);

/// The poller parses untrusted YAML and JSON and runs TLS; give it the
/// same stack as the file source's lister.
const POLLER_STACK: usize = 1024 * 1024;

/// A running HTTP source; dropping it stops its thread.
pub struct HttpSource {
    /// Never sent on: dropping it tells the poller to stop.
    stop: Option<Sender<()>>,
    poller: Option<JoinOnDrop<()>>,
}

/// Checks that `name: value` can be sent as an HTTP header.
pub(crate) fn check_header(name: &str, value: &str) -> Result<(), String> {
    // RFC 9110 token characters.
    let token = |c: char| c.is_ascii_alphanumeric() || "!#$%&'*+-.^_`|~".contains(c);
    if name.is_empty() || !name.chars().all(token) {
        return Err(format!("header name {name:?} is not a valid HTTP token"));
    }
    if value
        .chars()
        .any(|c| (c.is_control() && c != '\t') || c == '\u{7f}')
    {
        return Err(format!("header {name}: the value has control characters"));
    }
    Ok(())
}

/// Checks that `url` is one the source can poll (http or https).
pub(crate) fn check_url(url: &str) -> Result<(), String> {
    let lower = url.to_ascii_lowercase();
    let rest = lower
        .strip_prefix("http://")
        .or_else(|| lower.strip_prefix("https://"));
    match rest {
        Some(rest) if !rest.is_empty() && !rest.starts_with('/') => Ok(()),
        _ => Err(format!(
            "manifest URL {url:?} must be http://HOST/... or https://HOST/..."
        )),
    }
}

impl HttpSource {
    /// Starts polling `url` every `period` (zero means
    /// [`DEFAULT_HTTP_CHECK_FREQUENCY`]), sending `headers` with every
    /// request and a SET of the pods on `updates` whenever they change.
    /// Fails (`InvalidInput`) for a URL that is not http(s) or a header
    /// that can't be sent, and when the thread can't be started.
    pub fn start(
        url: String,
        headers: Vec<(String, String)>,
        node_name: String,
        period: Duration,
        updates: Sender<PodUpdate>,
    ) -> io::Result<HttpSource> {
        let invalid = |msg: String| io::Error::new(io::ErrorKind::InvalidInput, msg);
        check_url(&url).map_err(invalid)?;
        for (name, value) in &headers {
            check_header(name, value).map_err(invalid)?;
        }
        let period = if period.is_zero() {
            DEFAULT_HTTP_CHECK_FREQUENCY
        } else {
            period
        };
        let tls = ureq::tls::TlsConfig::builder()
            .root_certs(crate::tls_roots::system())
            .build();
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .tls_config(tls)
            .timeout_global(Some(HTTP_REQUEST_TIMEOUT))
            .http_status_as_error(false)
            .user_agent(format!("tinylet/{}", env!("CARGO_PKG_VERSION")))
            .build()
            .into();
        let (stop_tx, stop_rx) = bounded(0);
        log::info!("config: polling {url} for pods every {period:?}");
        let poller = Poller {
            url,
            headers,
            node_name,
            period,
            updates,
            stop: stop_rx,
            agent,
            last_body: None,
            last_outcome: Ok(()),
            last_sent: None,
            failures: 0,
        };
        let handle = spawn_with_stack("config-http", POLLER_STACK, move || poller.run())?;
        Ok(HttpSource {
            stop: Some(stop_tx),
            poller: Some(handle),
        })
    }
}

impl Drop for HttpSource {
    fn drop(&mut self) {
        drop(self.stop.take());
        let Some(poller) = self.poller.take() else {
            return;
        };
        let deadline = Instant::now() + STOP_WAIT;
        while !poller.is_finished() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        if poller.is_finished() {
            if poller.join().is_err() {
                log::error!("config: the HTTP source thread panicked");
            }
        } else {
            // A request is in flight; it ends within its timeout and the
            // thread then sees the stop.
            log::debug!("config: HTTP source stops after its request in flight");
            poller.detach();
        }
    }
}

/// Why a poll did not bring a new state.
enum PollError {
    /// The source is stopping (or nobody reads its updates).
    Stopped,
    Failed(String),
}

struct Poller {
    url: String,
    headers: Vec<(String, String)>,
    node_name: String,
    period: Duration,
    updates: Sender<PodUpdate>,
    stop: Receiver<()>,
    agent: ureq::Agent,
    /// The last body received, and what came of it.
    last_body: Option<Vec<u8>>,
    last_outcome: Result<(), String>,
    /// The pods of the last SET sent; None before the first.
    last_sent: Option<Vec<Arc<Pod>>>,
    /// Failed polls in a row.
    failures: u32,
}

impl Poller {
    fn run(mut self) {
        loop {
            match self.poll() {
                Ok(()) => {
                    if self.failures > 0 {
                        log::info!(
                            "config: reading pods from {} works again after {} failure(s)",
                            self.url,
                            self.failures
                        );
                    }
                    self.failures = 0;
                }
                Err(PollError::Stopped) => break,
                Err(PollError::Failed(e)) => {
                    self.failures += 1;
                    if self.failures < LOUD_FAILURES {
                        log::warn!("config: failed to read pods from {}: {e}", self.url);
                    } else if self.failures == LOUD_FAILURES {
                        log::warn!(
                            "config: failed to read pods from {}: {e} (further failures in a row \
                             are logged at debug level)",
                            self.url
                        );
                    } else {
                        log::debug!("config: failed to read pods from {}: {e}", self.url);
                    }
                }
            }
            select! {
                recv(self.stop) -> _ => break,
                default(self.period) => {}
            }
        }
        log::debug!("config: HTTP source for {} stopped", self.url);
    }

    fn poll(&mut self) -> Result<(), PollError> {
        let body = self.fetch().map_err(PollError::Failed)?;
        if body.is_empty() {
            self.last_body = Some(body);
            self.last_outcome = Err("zero-length body".to_string());
            self.send(Vec::new())?;
            return Err(PollError::Failed(format!(
                "zero-length body from {}; it now has no pods",
                self.url
            )));
        }
        if self.last_body.as_ref() == Some(&body) {
            return self.last_outcome.clone().map_err(PollError::Failed);
        }
        let parsed = self.parse(&body);
        self.last_body = Some(body);
        self.last_outcome = parsed.as_ref().map(|_| ()).map_err(String::clone);
        let pods =
            parsed.map_err(|e| PollError::Failed(format!("{e}; keeping the last good pods")))?;
        self.send(pods)
    }

    fn fetch(&self) -> Result<Vec<u8>, String> {
        let mut request = self.agent.get(&self.url);
        for (name, value) in &self.headers {
            request = request.header(name.as_str(), value.as_str());
        }
        let mut response = request
            .call()
            .map_err(|e| format!("GET {}: {e}", self.url))?;
        let status = response.status();
        if status != ureq::http::StatusCode::OK {
            return Err(format!("GET {}: {status}", self.url));
        }
        response
            .body_mut()
            .with_config()
            .limit(MAX_MANIFEST_SIZE)
            .read_to_vec()
            .map_err(|e| match e {
                ureq::Error::BodyExceedsLimit(limit) => format!(
                    "GET {}: the body is over the limit of {limit} bytes",
                    self.url
                ),
                e => format!("GET {}: reading the body: {e}", self.url),
            })
    }

    fn parse(&self, body: &[u8]) -> Result<Vec<Pod>, String> {
        parse_manifests(body, &self.url, &self.node_name)
    }

    /// Sends a SET unless it equals the last one sent.
    fn send(&mut self, pods: Vec<Pod>) -> Result<(), PollError> {
        // Shared from here on: the SET and `last_sent` hold the same pods.
        let pods: Vec<Arc<Pod>> = pods.into_iter().map(Arc::new).collect();
        if self.last_sent.as_ref() == Some(&pods) {
            return Ok(());
        }
        log::debug!("config: {} pod(s) from {}", pods.len(), self.url);
        let update = PodUpdate::new(PodOperation::Set, HTTP_SOURCE, pods.clone());
        // Blocks while the source channel is full, but never past a stop.
        select! {
            send(self.updates, update) -> res => {
                if res.is_err() {
                    log::debug!("config: pod config is gone, HTTP source stops");
                    return Err(PollError::Stopped);
                }
            }
            recv(self.stop) -> _ => return Err(PollError::Stopped),
        }
        self.last_sent = Some(pods);
        Ok(())
    }
}

/// Decodes a body served at the manifest URL `url` (one pod or a `PodList`)
/// and applies the static-pod defaults to every pod, as the HTTP source does;
/// any failure refuses the whole body, and the error names the URL.
pub fn parse_manifests(body: &[u8], url: &str, node_name: &str) -> Result<Vec<Pod>, String> {
    let mut pods = decode_pod_or_list(body).map_err(|e| format!("{url}: cannot decode: {e}"))?;
    let single = pods.len() == 1;
    for (i, pod) in pods.iter_mut().enumerate() {
        let name = pod.metadata.name.clone().unwrap_or_default();
        apply_static_defaults(pod, url, node_name, HTTP_SOURCE).map_err(|e| {
            if single {
                format!("{url}: {e}")
            } else {
                format!("{url}: items[{i}] (pod {name:?}): {e}")
            }
        })?;
    }
    Ok(pods)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_are_checked() {
        assert_eq!(check_header("Authorization", "Bearer abc\tdef"), Ok(()));
        assert_eq!(check_header("X-Node_1", ""), Ok(()));
        for (name, value) in [
            ("", "v"),
            ("Bad Name", "v"),
            ("a:b", "v"),
            ("X", "a\r\nInjected: 1"),
        ] {
            assert!(check_header(name, value).is_err(), "{name:?}: {value:?}");
        }
    }

    #[test]
    fn start_refuses_bad_urls_and_headers() {
        let (tx, _rx) = bounded(1);
        for (url, headers) in [
            ("ftp://h/x", vec![]),
            ("h/x", vec![]),
            ("http://", vec![]),
            ("https:///x", vec![]),
            (
                "http://h/x",
                vec![("Bad Name".to_string(), "v".to_string())],
            ),
        ] {
            let err = HttpSource::start(
                url.to_string(),
                headers,
                "n".into(),
                Duration::from_secs(1),
                tx.clone(),
            )
            .err()
            .map(|e| e.kind());
            assert_eq!(err, Some(io::ErrorKind::InvalidInput), "{url}");
        }
    }
}
