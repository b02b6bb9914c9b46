//! The blocking API client: one ureq agent (rustls, HTTP/1.1 keep-alive
//! pool) per kubeconfig, shared by every clone together with the rate
//! limiter. It sends JSON, reads answers with a size cap (lists instead
//! one item at a time, with a cap per item), and turns every non-2xx answer
//! into an [`ApiError`] carrying the apiserver's `Status`.
//!
//! Every connection can be closed at once ([`Client::close_all_connections`],
//! upstream kubelet's answer to repeated heartbeat failures): requests and
//! watches blocked on a connection that went silent (an apiserver that
//! vanished behind a partition) fail at once and start over on new ones.

use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use serde_json::Value;
use ureq::http;
use ureq::tls::{Certificate, ClientCert, PemItem, PrivateKey, RootCerts, TlsConfig};

use super::list::{read_list, ListError, ListItem, ListMeta};
use super::ratelimit::TokenBucket;
use super::watch::WatchStream;
use super::{ApiError, ClientOptions, ErrorKind, KubeConfig, PatchKind};

/// The largest answer body read whole. Lists are not read whole
/// ([`Client::list`]), so this bounds single objects and `Status` bodies.
pub(crate) const MAX_BODY: u64 = 16 * 1024 * 1024;

/// How much of a body that is not a `Status` goes into an error message.
const SNIPPET: usize = 256;

/// A blocking client, cheap to clone; all clones share one connection
/// pool and, unless made by [`Client::with_own_limiter`], one rate limiter.
#[derive(Clone)]
pub struct Client {
    inner: Arc<Inner>,
    /// Deadline of one non-watch request made through this clone.
    timeout: Duration,
    /// False for a heartbeat clone, which takes no rate-limiter token.
    throttled: bool,
    /// The rate limiter this clone takes its tokens from: the one all
    /// clones share, or its own ([`Client::with_own_limiter`]).
    limiter: Arc<TokenBucket>,
    /// True for a heartbeat clone: its requests go over HTTP/2 where the
    /// server offers it (`super::h2`).
    http2: bool,
}

struct Inner {
    /// The agent whose pool holds the open connections. Replaced by a fresh
    /// one when every connection is closed; the lock is held only to clone
    /// or swap it, never across I/O.
    agent: Mutex<ureq::Agent>,
    /// Makes a fresh agent with these settings (and the same transport).
    new_agent: Box<dyn Fn(&ureq::config::Config) -> ureq::Agent + Send + Sync>,
    /// The TLS identity and the settings made from it; replaced when the
    /// client certificate is ([`Client::set_client_certificate`]).
    identity: Mutex<Identity>,
    options: ClientOptions,
    server: String,
    /// The shared rate limiter's settings, for clones with their own.
    qps: f32,
    burst: u32,
    /// The bearer token; replaced when `token_file` is re-read after a 401.
    token: Mutex<Option<String>>,
    token_file: Option<std::path::PathBuf>,
    user_agent: String,
    /// Run by `close_all_connections` (the watch multiplexer closes its own).
    on_close_all: Mutex<Vec<Box<dyn Fn() + Send + Sync>>>,
    /// The heartbeat clones' HTTP/2 connection.
    h2: super::h2::Slot,
    /// False when connections come from a test transport, or once the
    /// server has not chosen HTTP/2: heartbeats then go over HTTP/1.1.
    h2_possible: std::sync::atomic::AtomicBool,
}

/// What the connections are made with.
struct Identity {
    /// The kubeconfig, with the current client certificate.
    config: KubeConfig,
    /// The agent's settings made from it.
    agent_config: ureq::config::Config,
    /// The endpoint of connections made outside the agent (`mux`), made
    /// from `config` when first asked for.
    endpoint: Option<Arc<super::nbhttp::Endpoint>>,
}

/// A request body with its content type.
struct Payload {
    content_type: &'static str,
    bytes: Vec<u8>,
}

/// The size of each connection's input and output buffer, and the
/// largest response head taken.
const CONNECTION_BUFFER: usize = 16 * 1024;

/// How long an idle connection is kept for the next request (ureq's
/// default: 15 s). Longer than the lease's renewal interval in the
/// low-data profile (150 s), so that renewals reuse one connection rather
/// than pay a TLS handshake each (measured through the fake apiserver:
/// about 2.2 KB, more than the renewal itself; more with RSA
/// certificates). A v1.20 apiserver puts no idle timeout on its
/// connections; one that the server or a middlebox closed is noticed
/// before it is used, and one dropped silently costs its request's
/// timeout once, the next attempt going on a new connection.
const POOL_IDLE: Duration = Duration::from_secs(300);

impl Client {
    pub fn new(config: &KubeConfig, options: ClientOptions) -> Result<Client, String> {
        let agent_config = Self::agent_config(config, &options)?;
        let new_agent = |c: &ureq::config::Config| ureq::Agent::new_with_config(c.clone());
        Ok(Self::with_agent(
            config,
            agent_config,
            options,
            Box::new(new_agent),
            true,
        ))
    }

    /// A client whose connections come from `connector` (addresses from
    /// `resolver`) instead of TCP and TLS: an in-memory transport for tests
    /// and fuzzing. Everything above the transport is as in [`Client::new`].
    pub fn with_connector(
        config: &KubeConfig,
        options: ClientOptions,
        connector: impl ureq::unversioned::transport::Connector + Clone,
        resolver: impl ureq::unversioned::resolver::Resolver + Clone,
    ) -> Result<Client, String> {
        let agent_config = Self::agent_config(config, &options)?;
        let new_agent = move |c: &ureq::config::Config| {
            ureq::Agent::with_parts(c.clone(), connector.clone(), resolver.clone())
        };
        Ok(Self::with_agent(
            config,
            agent_config,
            options,
            Box::new(new_agent),
            false,
        ))
    }

    fn with_agent(
        config: &KubeConfig,
        agent_config: ureq::config::Config,
        options: ClientOptions,
        new_agent: Box<dyn Fn(&ureq::config::Config) -> ureq::Agent + Send + Sync>,
        real_transport: bool,
    ) -> Client {
        Client {
            timeout: options.timeout,
            throttled: true,
            http2: false,
            limiter: Arc::new(TokenBucket::new(options.qps, options.burst, Instant::now())),
            inner: Arc::new(Inner {
                agent: Mutex::new(new_agent(&agent_config)),
                new_agent,
                identity: Mutex::new(Identity {
                    config: config.clone(),
                    agent_config,
                    endpoint: None,
                }),
                options: options.clone(),
                server: config.server.trim_end_matches('/').to_string(),
                qps: options.qps,
                burst: options.burst,
                token: Mutex::new(config.token.clone()),
                token_file: config.token_file.clone(),
                user_agent: options.user_agent.clone(),
                on_close_all: Mutex::new(Vec::new()),
                h2: super::h2::Slot::new(super::h2::Limits {
                    max_body: MAX_BODY as u32,
                    idle: POOL_IDLE,
                }),
                h2_possible: std::sync::atomic::AtomicBool::new(real_transport),
            }),
        }
    }

    /// The agent's settings: TLS from the kubeconfig, no redirects, statuses
    /// as answers.
    fn agent_config(
        config: &KubeConfig,
        options: &ClientOptions,
    ) -> Result<ureq::config::Config, String> {
        let file = config.file.display();
        let mut tls = TlsConfig::builder();
        if let Some(pem) = &config.ca_pem {
            let certs =
                parse_certs(pem).map_err(|e| format!("{file}: certificate authority: {e}"))?;
            tls = tls.root_certs(RootCerts::new_with_certs(&certs));
        } else if !config.insecure_skip_tls_verify {
            // Without a CA in the kubeconfig the system's roots are trusted.
            tls = tls.root_certs(crate::tls_roots::system());
        }
        if config.insecure_skip_tls_verify {
            tls = tls.disable_verification(true);
        }
        if let (Some(cert), Some(key)) = (&config.client_cert_pem, &config.client_key_pem) {
            let chain =
                parse_certs(cert).map_err(|e| format!("{file}: client certificate: {e}"))?;
            let key = parse_key(key).map_err(|e| format!("{file}: client key: {e}"))?;
            tls = tls.client_cert(Some(ClientCert::new_with_certs(&chain, key)));
        }
        let agent_config = ureq::Agent::config_builder()
            .tls_config(tls.build())
            .http_status_as_error(false)
            .max_redirects(0)
            .user_agent(options.user_agent.as_str())
            .accept("application/json")
            .timeout_connect(Some(options.timeout))
            // ureq fills both buffers of every connection when it first
            // uses it (128 KiB each by default): with a watch per Secret or
            // ConfigMap a pod mounts, that was most of what each object
            // cost. Bodies stream through in pieces either way, and an
            // apiserver's response head is well under 1 KiB.
            .input_buffer_size(CONNECTION_BUFFER)
            .output_buffer_size(CONNECTION_BUFFER)
            .max_response_header_size(CONNECTION_BUFFER)
            .max_idle_age(POOL_IDLE)
            .build();
        Ok(agent_config)
    }

    /// A clone for heartbeats (node lease, node status), as upstream's
    /// heartbeat client: requests end after `timeout`, and take no token
    /// from the rate limiter, so a busy node still reports it is alive.
    /// Its requests that read a whole answer go over the clients' one
    /// HTTP/2 connection when the server offers HTTP/2 (upstream speaks
    /// HTTP/2 on all of them), which makes a repeated request's head a few
    /// bytes; otherwise over the shared HTTP/1.1 pool.
    pub(crate) fn for_heartbeats(&self, timeout: Duration) -> Client {
        Client {
            inner: self.inner.clone(),
            timeout,
            throttled: false,
            limiter: self.limiter.clone(),
            http2: true,
        }
    }

    /// A clone with a rate limiter of its own (the same rate and burst):
    /// requests one tenant can multiply (the GETs of a pod's Secrets and
    /// ConfigMaps past the bounds on watches) then wait only for each
    /// other, never ahead of status, event and pod requests. The
    /// connection pool is shared.
    pub(crate) fn with_own_limiter(&self) -> Client {
        Client {
            inner: self.inner.clone(),
            timeout: self.timeout,
            throttled: self.throttled,
            http2: self.http2,
            limiter: Arc::new(TokenBucket::new(
                self.inner.qps,
                self.inner.burst,
                Instant::now(),
            )),
        }
    }

    /// Closes every connection of every clone: requests in flight, watches
    /// included, fail at once with a transport error, and later requests
    /// open new connections. Upstream kubelet does this when heartbeats keep
    /// failing, as a watch on a connection that went silent would otherwise
    /// wait for its read deadline (minutes).
    pub(crate) fn close_all_connections(&self) {
        let fresh = (self.inner.new_agent)(&self.inner.identity.lock().agent_config);
        let old = std::mem::replace(&mut *self.inner.agent.lock(), fresh);
        // Shuts down the old pool's sockets, idle and in use.
        old.shutdown();
        self.inner.h2.close();
        for hook in self.inner.on_close_all.lock().iter() {
            hook();
        }
    }

    /// Runs `hook` at every `close_all_connections`.
    pub(crate) fn on_close_all(&self, hook: Box<dyn Fn() + Send + Sync>) {
        self.inner.on_close_all.lock().push(hook);
    }

    /// Where and how to connect, for connections made outside the agent,
    /// with the current client certificate.
    pub(crate) fn endpoint(&self) -> Result<Arc<super::nbhttp::Endpoint>, String> {
        let mut identity = self.inner.identity.lock();
        if let Some(e) = &identity.endpoint {
            return Ok(e.clone());
        }
        let e = Arc::new(super::nbhttp::Endpoint::new(&identity.config)?);
        identity.endpoint = Some(e.clone());
        Ok(e)
    }

    /// Makes every later connection of every clone present this client
    /// certificate and key (PEM), then closes the open ones, so that
    /// requests and watches in flight fail at once and are made again with
    /// it (client-go's connection rotation). On an error nothing changes.
    pub(crate) fn set_client_certificate(
        &self,
        cert_pem: &[u8],
        key_pem: &[u8],
    ) -> Result<(), String> {
        let mut config = self.inner.identity.lock().config.clone();
        config.client_cert_pem = Some(cert_pem.to_vec());
        config.client_key_pem = Some(key_pem.to_vec());
        let agent_config = Self::agent_config(&config, &self.inner.options)?;
        let endpoint = match super::nbhttp::Endpoint::new(&config) {
            Ok(e) => Some(Arc::new(e)),
            Err(e) => return Err(e),
        };
        *self.inner.identity.lock() = Identity {
            config,
            agent_config,
            endpoint,
        };
        self.close_all_connections();
        Ok(())
    }

    /// Takes a rate-limiter token without waiting: how long the request
    /// must wait before it goes (zero for a heartbeat clone).
    pub(crate) fn reserve_token(&self, now: Instant) -> Duration {
        if self.throttled {
            self.limiter.reserve(now)
        } else {
            Duration::ZERO
        }
    }

    /// The bearer token requests carry now.
    pub(crate) fn bearer_token(&self) -> Option<String> {
        self.inner.token.lock().clone()
    }

    /// After a 401 to `verb path` sent with `sent`: re-reads the token
    /// file; true when the token changed (send the request again).
    pub(crate) fn token_after_401(&self, verb: &str, path: &str, sent: Option<&str>) -> bool {
        let Some(file) = &self.inner.token_file else {
            return false;
        };
        match super::kubeconfig::read_token_file(file) {
            Ok(fresh) if Some(fresh.as_str()) != sent => {
                log::info!(
                    "{verb} {path}: 401, using the new token in {}",
                    file.display()
                );
                *self.inner.token.lock() = Some(fresh);
                true
            }
            Ok(_) => false,
            Err(e) => {
                log::warn!("{verb} {path}: 401, and the token file: {e}");
                false
            }
        }
    }

    /// The deadline of one non-watch request.
    pub(crate) fn request_timeout(&self) -> Duration {
        self.timeout
    }

    pub fn user_agent(&self) -> &str {
        &self.inner.user_agent
    }

    /// `https://host:port` of the apiserver.
    pub fn server(&self) -> &str {
        &self.inner.server
    }

    /// GET `path` (absolute, with its query) and decode the JSON answer.
    pub(crate) fn get(&self, path: &str) -> Result<Value, ApiError> {
        self.json_call("GET", path, None)
    }
    /// POST `body` to `path`.
    pub(crate) fn create(&self, path: &str, body: &Value) -> Result<Value, ApiError> {
        self.json_call("POST", path, Some(json_payload("application/json", body)))
    }
    /// PUT `body` to `path`.
    pub(crate) fn replace(&self, path: &str, body: &Value) -> Result<Value, ApiError> {
        self.json_call("PUT", path, Some(json_payload("application/json", body)))
    }
    /// PATCH `path` with a body of the given kind.
    pub(crate) fn patch(
        &self,
        path: &str,
        kind: PatchKind,
        body: &Value,
    ) -> Result<Value, ApiError> {
        self.json_call("PATCH", path, Some(patch_payload(kind, body)))
    }

    /// PATCH `path` asking for the answer in protobuf (JSON from a server
    /// that has none), and hand back its body undecoded: a
    /// [`super::protobuf`] envelope or a JSON document. Errors are decoded
    /// from either kind of `Status`.
    pub(crate) fn patch_compact(
        &self,
        path: &str,
        kind: PatchKind,
        body: &Value,
    ) -> Result<Vec<u8>, ApiError> {
        self.call(
            "PATCH",
            path,
            Some(patch_payload(kind, body)),
            Some(super::protobuf::ACCEPT),
        )
    }

    /// DELETE `path` with a `DeleteOptions` body (`Value::Null` for none).
    pub(crate) fn delete(&self, path: &str, options: &Value) -> Result<Value, ApiError> {
        let payload = match options {
            Value::Null => None,
            v => Some(json_payload("application/json", v)),
        };
        self.json_call("DELETE", path, payload)
    }

    /// GET the LIST `path` and hand its items to `each` one at a time as
    /// they are read: a page of any size is taken, no item over
    /// `max_object` bytes is kept (it comes as [`ListItem::TooLarge`]).
    /// The answer's head has the request deadline, and so has each read of
    /// the body, rather than the whole body: a big list over a slow link
    /// is read as long as it flows (upstream puts no deadline on it).
    pub fn list(
        &self,
        path: &str,
        max_object: usize,
        each: &mut dyn FnMut(ListItem),
    ) -> Result<ListMeta, ApiError> {
        let response = self.send("GET", path, None, Some(self.timeout), None)?;
        if !response.status().is_success() {
            return Err(self.status_error("GET", path, response));
        }
        let mut reader = response.into_body().into_reader();
        read_list(&mut reader, max_object, each).map_err(|e| ApiError {
            verb: "GET",
            path: path.to_string(),
            kind: match e {
                ListError::Read(e) => ErrorKind::Transport(format!(
                    "{}: reading the answer: {}",
                    self.inner.server,
                    ureq::Error::from(e)
                )),
                ListError::Invalid(m) => ErrorKind::Decode(m),
            },
        })
    }

    /// Opens a watch (`path` carries `watch=true` or is a watch path with its
    /// query). Events are decoded one at a time as they arrive; the stream
    /// ends (`None`) when the server closes it. A read that waits longer
    /// than `idle` fails with a transport error, so a dead connection is
    /// noticed.
    pub fn watch(&self, path: &str, idle: Duration) -> Result<WatchStream, ApiError> {
        let response = self.send("GET", path, None, Some(idle), None)?;
        if !response.status().is_success() {
            return Err(self.status_error("GET", path, response));
        }
        let reader = response.into_body().into_reader();
        Ok(WatchStream::new(
            Box::new(reader),
            path,
            self.inner.server.clone(),
            super::watch::MAX_EVENT,
        ))
    }

    /// One request whose answer is a JSON document.
    fn json_call(
        &self,
        verb: &'static str,
        path: &str,
        payload: Option<Payload>,
    ) -> Result<Value, ApiError> {
        let bytes = self.call(verb, path, payload, None)?;
        if bytes.iter().all(u8::is_ascii_whitespace) {
            return Ok(Value::Null);
        }
        serde_json::from_slice(&bytes).map_err(|e| ApiError {
            verb,
            path: path.to_string(),
            kind: ErrorKind::Decode(format!("invalid JSON: {e}")),
        })
    }

    /// One request whose answer's body is read whole; `accept` is what it
    /// asks for when not JSON.
    fn call(
        &self,
        verb: &'static str,
        path: &str,
        payload: Option<Payload>,
        accept: Option<&'static str>,
    ) -> Result<Vec<u8>, ApiError> {
        if self.http2 {
            if let Some(answer) = self.call_h2(verb, path, payload.as_ref(), accept) {
                return answer;
            }
        }
        let response = self.send(verb, path, payload.as_ref(), None, accept)?;
        if !response.status().is_success() {
            return Err(self.status_error(verb, path, response));
        }
        self.read_body(verb, path, response)
    }

    /// Sends one request after taking a rate-limiter token. A 401 with a
    /// token file re-reads the file and, when the token changed, sends the
    /// request once more. `watch_idle` marks a watch: no overall deadline,
    /// only one on each read.
    fn send(
        &self,
        verb: &'static str,
        path: &str,
        payload: Option<&Payload>,
        watch_idle: Option<Duration>,
        accept: Option<&'static str>,
    ) -> Result<http::Response<ureq::Body>, ApiError> {
        let mut retried = false;
        loop {
            if self.throttled {
                self.limiter.acquire();
            }
            let token = self.inner.token.lock().clone();
            let response =
                self.send_once(verb, path, payload, watch_idle, accept, token.as_deref())?;
            if response.status() == http::StatusCode::UNAUTHORIZED
                && !retried
                && self.token_after_401(verb, path, token.as_deref())
            {
                retried = true;
                continue;
            }
            return Ok(response);
        }
    }

    fn send_once(
        &self,
        verb: &'static str,
        path: &str,
        payload: Option<&Payload>,
        watch_idle: Option<Duration>,
        accept: Option<&'static str>,
        token: Option<&str>,
    ) -> Result<http::Response<ureq::Body>, ApiError> {
        let url = format!("{}{}", self.inner.server, path);
        let mut builder = http::Request::builder().method(verb).uri(&url);
        if let Some(accept) = accept {
            builder = builder.header("Accept", accept);
        }
        if let Some(token) = token {
            builder = builder.header("Authorization", format!("Bearer {token}"));
        }
        if let Some(p) = payload {
            builder = builder.header("Content-Type", p.content_type);
        }
        let transport = |message: String| ApiError {
            verb,
            path: path.to_string(),
            kind: ErrorKind::Transport(message),
        };
        let agent = self.inner.agent.lock().clone();
        let result = match payload {
            Some(p) => {
                let request = builder
                    .body(p.bytes.as_slice())
                    .map_err(|e| transport(format!("cannot build the request for {url}: {e}")))?;
                agent.run(self.configure(&agent, request, watch_idle))
            }
            None => {
                let request = builder
                    .body(())
                    .map_err(|e| transport(format!("cannot build the request for {url}: {e}")))?;
                agent.run(self.configure(&agent, request, watch_idle))
            }
        };
        let code = result.as_ref().ok().map(|r| r.status().as_u16());
        crate::metrics::rest_client_request(code, verb, self.host());
        result.map_err(|e| transport(format!("{}: {e}", self.inner.server)))
    }

    /// `host:port` of the apiserver, as the request metrics name it.
    fn host(&self) -> &str {
        let server = self.inner.server.as_str();
        let host = server.split_once("://").map_or(server, |(_, h)| h);
        host.split('/').next().unwrap_or(host)
    }

    /// One request over the HTTP/2 connection, with the same 401 handling
    /// as [`Client::send`]. None when it must go over HTTP/1.1 instead:
    /// the server does not offer HTTP/2 (then no later request tries), or
    /// another heartbeat is on the connection (rather than wait behind it).
    fn call_h2(
        &self,
        verb: &'static str,
        path: &str,
        payload: Option<&Payload>,
        accept: Option<&'static str>,
    ) -> Option<Result<Vec<u8>, ApiError>> {
        use super::h2::H2Error;
        use std::sync::atomic::Ordering;
        if !self.inner.h2_possible.load(Ordering::Relaxed) {
            return None;
        }
        let endpoint = self.endpoint().ok()?;
        if endpoint.tls.is_none() {
            self.inner.h2_possible.store(false, Ordering::Relaxed);
            return None;
        }
        // A server URL with a path prefix keeps it, as over HTTP/1.1.
        let server = self.inner.server.as_str();
        let after_scheme = server.split_once("://").map_or(server, |(_, r)| r);
        let prefix = after_scheme.find('/').map_or("", |i| &after_scheme[i..]);
        let full_path = format!("{prefix}{path}");
        let length = payload.map(|p| p.bytes.len().to_string());
        let mut retried = false;
        loop {
            let token = self.inner.token.lock().clone();
            let authorization = token.as_ref().map(|t| format!("Bearer {t}"));
            let mut headers = vec![
                ("accept", accept.unwrap_or("application/json")),
                ("user-agent", self.inner.user_agent.as_str()),
            ];
            if let Some(a) = &authorization {
                headers.push(("authorization", a.as_str()));
            }
            if let (Some(p), Some(n)) = (payload, &length) {
                headers.push(("content-type", p.content_type));
                headers.push(("content-length", n.as_str()));
            }
            let request = super::h2::Request {
                method: verb,
                path: &full_path,
                headers: &headers,
                body: payload.map_or(&[][..], |p| p.bytes.as_slice()),
            };
            let answer = match self.inner.h2.send(&endpoint, &request, self.timeout)? {
                Ok(a) => a,
                Err(H2Error::NotOffered) => {
                    // Said once, by whichever heartbeat learned it first.
                    if self.inner.h2_possible.swap(false, Ordering::Relaxed) {
                        log::info!(
                            "{}: no HTTP/2 offered; heartbeats go over HTTP/1.1",
                            self.inner.server
                        );
                    }
                    return None;
                }
                Err(H2Error::Retryable(message) | H2Error::Failed(message)) => {
                    crate::metrics::rest_client_request(None, verb, self.host());
                    return Some(Err(ApiError {
                        verb,
                        path: path.to_string(),
                        kind: ErrorKind::Transport(message),
                    }));
                }
            };
            crate::metrics::rest_client_request(Some(answer.status), verb, self.host());
            if answer.status == 401
                && !retried
                && self.token_after_401(verb, path, token.as_deref())
            {
                retried = true;
                continue;
            }
            if (200..300).contains(&answer.status) {
                return Some(Ok(answer.body));
            }
            let text = http::StatusCode::from_u16(answer.status)
                .ok()
                .and_then(|s| s.canonical_reason())
                .unwrap_or("unknown status");
            let kind = status_kind(answer.status, text, answer.retry_after, &answer.body);
            return Some(Err(ApiError {
                verb,
                path: path.to_string(),
                kind,
            }));
        }
    }

    fn configure<S: ureq::AsSendBody>(
        &self,
        agent: &ureq::Agent,
        request: http::Request<S>,
        watch_idle: Option<Duration>,
    ) -> http::Request<S> {
        let config = agent.configure_request(request);
        match watch_idle {
            // A watch lasts as long as the server keeps it open; only a
            // silent connection is an error. The answer's head comes at
            // once from a live apiserver, so waiting for it has the deadline
            // of any request.
            Some(idle) => config
                .timeout_per_read(Some(idle))
                .timeout_recv_response(Some(self.timeout.min(idle)))
                .build(),
            None => config.timeout_global(Some(self.timeout)).build(),
        }
    }

    /// Reads a whole body of at most [`MAX_BODY`] bytes.
    fn read_body(
        &self,
        verb: &'static str,
        path: &str,
        response: http::Response<ureq::Body>,
    ) -> Result<Vec<u8>, ApiError> {
        let mut body = response.into_body();
        body.with_config()
            .limit(MAX_BODY)
            .read_to_vec()
            .map_err(|e| ApiError {
                verb,
                path: path.to_string(),
                kind: match e {
                    ureq::Error::BodyExceedsLimit(_) => {
                        ErrorKind::Decode(format!("the answer is larger than {MAX_BODY} bytes"))
                    }
                    e => ErrorKind::Transport(format!(
                        "{}: reading the answer: {e}",
                        self.inner.server
                    )),
                },
            })
    }

    /// The error for a non-2xx answer, from its `Status` body if it is one.
    fn status_error(
        &self,
        verb: &'static str,
        path: &str,
        response: http::Response<ureq::Body>,
    ) -> ApiError {
        let code = response.status().as_u16();
        let status_text = response
            .status()
            .canonical_reason()
            .unwrap_or("unknown status")
            .to_string();
        let header_retry = response
            .headers()
            .get("Retry-After")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok());
        let body = match self.read_body(verb, path, response) {
            Ok(b) => b,
            // The status is what matters; a body we could not read is
            // described in the message instead.
            Err(e) => format!("({})", kind_text(&e.kind)).into_bytes(),
        };
        let kind = status_kind(code, &status_text, header_retry, &body);
        ApiError {
            verb,
            path: path.to_string(),
            kind,
        }
    }
}

fn kind_text(kind: &ErrorKind) -> String {
    match kind {
        ErrorKind::Transport(m) | ErrorKind::Decode(m) => m.clone(),
        ErrorKind::Status { message, .. } => message.clone(),
    }
}

/// Decodes a non-2xx answer: the fields of a `Status` body, or the status
/// text and the start of whatever else the body holds.
pub(crate) fn status_kind(
    code: u16,
    status_text: &str,
    header_retry: Option<u64>,
    body: &[u8],
) -> ErrorKind {
    if let Some(kind) = protobuf_status(code, header_retry, body) {
        return kind;
    }
    let status: Option<Value> = serde_json::from_slice(body).ok();
    if let Some(s) = status.filter(|s| s.get("kind").and_then(Value::as_str) == Some("Status")) {
        return super::status_from_value(&s, code, header_retry);
    }
    let text = String::from_utf8_lossy(body);
    let text = text.trim();
    let message = if text.is_empty() {
        status_text.to_string()
    } else {
        let mut end = text.len().min(SNIPPET);
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        let more = if end < text.len() { "..." } else { "" };
        format!("{status_text}: {}{more}", &text[..end])
    };
    ErrorKind::Status {
        code,
        reason: String::new(),
        message,
        retry_after: header_retry,
    }
}

/// A protobuf `Status` body's fields, as [`super::status_from_value`] reads
/// a JSON one; none when the body is not one.
fn protobuf_status(code: u16, header_retry: Option<u64>, body: &[u8]) -> Option<ErrorKind> {
    use super::protobuf;
    if !protobuf::is_protobuf(body) {
        return None;
    }
    let status = protobuf::unwrap(body)
        .ok()
        .filter(|o| o.kind == "Status")
        .and_then(|o| protobuf::status(&o.raw).ok())?;
    Some(ErrorKind::Status {
        code: u16::try_from(status.code)
            .ok()
            .filter(|c| *c != 0)
            .unwrap_or(code),
        reason: status.reason,
        message: status.message,
        // Protobuf always carries the field; 0 is JSON's omitted one.
        retry_after: status
            .retry_after_seconds
            .and_then(|s| u64::try_from(s).ok())
            .filter(|s| *s > 0)
            .or(header_retry),
    })
}

fn patch_payload(kind: PatchKind, body: &Value) -> Payload {
    let content_type = match kind {
        PatchKind::Strategic => "application/strategic-merge-patch+json",
        PatchKind::Merge => "application/merge-patch+json",
    };
    json_payload(content_type, body)
}

fn json_payload(content_type: &'static str, body: &Value) -> Payload {
    Payload {
        content_type,
        // Serializing a Value to a Vec cannot fail: its keys are strings.
        bytes: serde_json::to_vec(body).unwrap_or_default(),
    }
}

fn parse_certs(pem: &[u8]) -> Result<Vec<Certificate<'static>>, String> {
    let mut certs = Vec::new();
    for item in ureq::tls::parse_pem(pem) {
        match item {
            Ok(PemItem::Certificate(c)) => certs.push(c),
            Ok(_) => {}
            Err(e) => return Err(format!("invalid PEM: {e}")),
        }
    }
    if certs.is_empty() {
        return Err("no PEM certificate found".into());
    }
    Ok(certs)
}

fn parse_key(pem: &[u8]) -> Result<PrivateKey<'static>, String> {
    for item in ureq::tls::parse_pem(pem) {
        match item {
            Ok(PemItem::PrivateKey(k)) => return Ok(k),
            Ok(_) => {}
            Err(e) => return Err(format!("invalid PEM: {e}")),
        }
    }
    Err("no PEM private key found".into())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::kube::testserver::{fixture_body, Reply, TestServer};
    use serde_json::json;

    pub(crate) fn options() -> ClientOptions {
        ClientOptions {
            qps: 0.0,
            burst: 0,
            timeout: Duration::from_secs(10),
            user_agent: "tinylet/v0.1.0 (linux/amd64)".into(),
        }
    }

    pub(crate) fn client_for(server: &TestServer) -> Client {
        let config = KubeConfig {
            server: server.url(),
            token: Some("t0k3n".into()),
            ..KubeConfig::default()
        };
        Client::new(&config, options()).unwrap()
    }

    #[test]
    fn protobuf_status_bodies_are_decoded_like_json_ones() {
        let body = std::fs::read(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/protobuf/lease-patch-404.pb"
        ))
        .unwrap();
        match status_kind(404, "Not Found", None, &body) {
            ErrorKind::Status {
                code,
                reason,
                message,
                retry_after,
            } => {
                assert_eq!((code, reason.as_str()), (404, "NotFound"));
                assert_eq!(message, r#"leases.coordination.k8s.io "edge-1" not found"#);
                // details.retryAfterSeconds 0 is "none", as in JSON's
                // omitted field; the header's value stands.
                assert_eq!(retry_after, None);
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_node_restriction_403_reads_well_in_a_log_line() {
        let server = TestServer::start(|_| {
            Reply::json(403, fixture_body("02b-node-status-patch-other-node-403"))
        });
        let client = client_for(&server);
        let patch = json!({"status": {"conditions": []}});
        let e = client
            .patch("/api/v1/nodes/edge-2/status", PatchKind::Strategic, &patch)
            .unwrap_err();
        assert_eq!(
            e.to_string(),
            "PATCH /api/v1/nodes/edge-2/status: 403 Forbidden: nodes \"edge-2\" is forbidden: node \"edge-1\" is not allowed to modify node \"edge-2\""
        );
        assert!(e.is_forbidden());
        assert_eq!(e.reason(), "Forbidden");
        let reqs = server.requests();
        assert_eq!(reqs.len(), 1);
        let r = &reqs[0];
        assert_eq!(r.method, "PATCH");
        assert_eq!(r.target, "/api/v1/nodes/edge-2/status");
        assert_eq!(
            r.header("content-type"),
            Some("application/strategic-merge-patch+json")
        );
        assert_eq!(r.header("accept"), Some("application/json"));
        assert_eq!(r.header("user-agent"), Some("tinylet/v0.1.0 (linux/amd64)"));
        assert_eq!(r.header("authorization"), Some("Bearer t0k3n"));
        assert_eq!(serde_json::from_slice::<Value>(&r.body).unwrap(), patch);
    }

    #[test]
    fn conflict_and_already_exists_and_not_found_from_fixtures() {
        let server = TestServer::start(|r| match r.method.as_str() {
            "POST" => Reply::json(409, fixture_body("01b-node-create-again-409")),
            "PUT" => Reply::json(409, fixture_body("03d-lease-put-stale-rv-409")),
            _ => Reply::json(404, fixture_body("03a-lease-get-404")),
        });
        let client = client_for(&server);
        let e = client.create("/api/v1/nodes", &json!({})).unwrap_err();
        assert!(e.is_already_exists() && !e.is_conflict(), "{e}");
        let path = "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/edge-1";
        let e = client.replace(path, &json!({})).unwrap_err();
        assert!(e.is_conflict() && !e.is_already_exists(), "{e}");
        let e = client.get(path).unwrap_err();
        assert!(e.is_not_found(), "{e}");
        assert_eq!(e.reason(), "NotFound");
    }

    #[test]
    fn retry_after_from_status_details() {
        let server = TestServer::start(|_| {
            Reply::json(504, fixture_body("06i-pods-list-rv-future-nolimit-cache"))
        });
        let e = client_for(&server).get("/api/v1/pods").unwrap_err();
        match e.kind {
            ErrorKind::Status {
                code,
                reason,
                retry_after,
                ..
            } => {
                assert_eq!(
                    (code, reason.as_str(), retry_after),
                    (504, "Timeout", Some(1))
                );
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_body_that_is_not_a_status_gives_status_text_and_a_snippet() {
        let long = format!("upstream connect error {}", "x".repeat(1000));
        let server = TestServer::start(move |_| Reply::Full {
            status: 503,
            headers: vec![("Retry-After", "7".into())],
            body: long.clone().into_bytes(),
        });
        let e = client_for(&server).get("/healthz").unwrap_err();
        let ErrorKind::Status {
            code,
            reason,
            message,
            retry_after,
        } = &e.kind
        else {
            panic!("{e:?}")
        };
        assert_eq!((*code, reason.as_str(), *retry_after), (503, "", Some(7)));
        assert!(message.starts_with("Service Unavailable: upstream connect error xxx"));
        assert!(message.ends_with("x..."), "{message}");
        assert!(message.len() < 300, "{}", message.len());
        assert!(e
            .to_string()
            .starts_with("GET /healthz: 503: Service Unavailable: upstream"));
    }

    #[test]
    fn get_decodes_the_answer_and_reuses_the_connection() {
        let server =
            TestServer::start(|_| Reply::json(200, fixture_body("04h-pods-list-node-rv0")));
        let client = client_for(&server);
        let path = "/api/v1/pods?fieldSelector=spec.nodeName%3Dedge-1&limit=500&resourceVersion=0";
        let list = client.get(path).unwrap();
        assert_eq!(list["metadata"]["resourceVersion"], "401");
        assert_eq!(list["items"][1]["metadata"]["name"], "app-2");
        client.clone().get(path).unwrap();
        let reqs = server.requests();
        assert_eq!(reqs.len(), 2);
        assert_eq!(reqs[0].target, path);
        assert_eq!(reqs[0].conn, reqs[1].conn, "a second connection was opened");
    }

    #[test]
    fn delete_sends_its_options_and_create_its_object() {
        let server = TestServer::start(|_| Reply::json(200, r#"{"kind":"Pod"}"#));
        let client = client_for(&server);
        let options = json!({"kind":"DeleteOptions","apiVersion":"v1","gracePeriodSeconds":0});
        let v = client
            .delete("/api/v1/namespaces/default/pods/app-1", &options)
            .unwrap();
        assert_eq!(v, json!({"kind":"Pod"}));
        client
            .delete("/api/v1/namespaces/default/pods/app-2", &Value::Null)
            .unwrap();
        client
            .create("/api/v1/namespaces/default/events", &json!({"a": 1}))
            .unwrap();
        let reqs = server.requests();
        assert_eq!(reqs[0].method, "DELETE");
        assert_eq!(reqs[0].header("content-type"), Some("application/json"));
        assert_eq!(
            serde_json::from_slice::<Value>(&reqs[0].body).unwrap(),
            options
        );
        assert_eq!(reqs[1].method, "DELETE");
        assert!(reqs[1].body.is_empty());
        assert_eq!(reqs[1].header("content-type"), None);
        assert_eq!(reqs[2].method, "POST");
        assert_eq!(reqs[2].body, br#"{"a":1}"#);
    }

    #[test]
    fn a_body_over_the_cap_is_a_decode_error() {
        let server = TestServer::start(|_| Reply::json(200, vec![b' '; MAX_BODY as usize + 1]));
        let e = client_for(&server).get("/api/v1/pods").unwrap_err();
        assert_eq!(
            e.to_string(),
            "GET /api/v1/pods: cannot decode the answer: the answer is larger than 16777216 bytes"
        );
    }

    #[test]
    fn a_list_larger_than_the_body_cap_is_read_one_item_at_a_time() {
        // 20 items of 1 MiB in 1 MiB chunks: 20 MiB, over MAX_BODY.
        let filler = "x".repeat(1024 * 1024);
        let item = |i: usize| {
            format!(r#"{{"metadata":{{"name":"p{i}","namespace":"default"}},"data":"{filler}"}}"#)
        };
        let mut chunks = vec![br#"{"kind":"PodList","apiVersion":"v1","items":["#.to_vec()];
        for i in 0..20 {
            let sep = if i == 0 { "" } else { "," };
            chunks.push(format!("{sep}{}", item(i)).into_bytes());
        }
        chunks.push(br#"],"metadata":{"resourceVersion":"77","continue":"c"}}"#.to_vec());
        let total: usize = chunks.iter().map(Vec::len).sum();
        assert!(total as u64 > MAX_BODY);
        let server = TestServer::start(move |_| crate::kube::testserver::Reply::Chunked {
            status: 200,
            chunks: chunks.clone(),
            end: crate::kube::testserver::End::Clean,
        });
        let client = client_for(&server);
        let mut names = Vec::new();
        let meta = client
            .list(
                "/api/v1/pods?limit=500",
                2 * 1024 * 1024,
                &mut |i| match i {
                    ListItem::Object(v) => {
                        names.push(v["metadata"]["name"].as_str().unwrap().to_string())
                    }
                    other => panic!("{other:?}"),
                },
            )
            .unwrap();
        assert_eq!(names.len(), 20);
        assert_eq!(names[19], "p19");
        assert_eq!(
            (
                meta.resource_version.as_str(),
                meta.continue_token.as_deref()
            ),
            ("77", Some("c"))
        );
        assert_eq!(meta.bytes, total as u64);
        // The same list with a cap under one item: each is skipped, named.
        let mut skipped = Vec::new();
        client
            .list("/api/v1/pods?limit=500", 1024 * 1024, &mut |i| match i {
                ListItem::TooLarge { key, .. } => skipped.push(key),
                other => panic!("{other:?}"),
            })
            .unwrap();
        assert_eq!(skipped.len(), 20);
        assert_eq!(skipped[3], "default/p3");
    }

    #[test]
    fn a_list_error_names_the_request_and_the_field() {
        let server = TestServer::start(|r| {
            if r.target.contains("continue=") {
                Reply::json(
                    410,
                    fixture_body("06d-pods-list-rv1-exact-after-compaction"),
                )
            } else {
                Reply::json(
                    200,
                    r#"{"metadata":{"resourceVersion":"1"},"items":[{},{"a":}]}"#,
                )
            }
        });
        let client = client_for(&server);
        let mut n = 0;
        let e = client
            .list("/api/v1/pods?limit=500", 1024, &mut |_| n += 1)
            .unwrap_err();
        assert_eq!(
            e.to_string(),
            "GET /api/v1/pods?limit=500: cannot decode the answer: items[1]: invalid JSON: expected value at line 1 column 6"
        );
        assert_eq!(n, 1);
        let e = client
            .list("/api/v1/pods?limit=500&continue=x", 1024, &mut |_| {})
            .unwrap_err();
        assert!(e.is_gone(), "{e}");
    }

    #[test]
    fn invalid_json_is_a_decode_error() {
        let server = TestServer::start(|_| Reply::json(200, "{not json"));
        let e = client_for(&server).get("/version").unwrap_err();
        assert!(matches!(e.kind, ErrorKind::Decode(_)), "{e}");
        assert!(e
            .to_string()
            .starts_with("GET /version: cannot decode the answer: invalid JSON"));
    }

    #[test]
    fn a_401_rereads_the_token_file_and_retries_once() {
        let server = TestServer::start(|r| {
            if r.header("authorization") == Some("Bearer new") {
                Reply::json(200, "{}")
            } else {
                Reply::json(401, fixture_body("10b-invalid-bearer-token-pods-list"))
            }
        });
        let dir = tempfile::tempdir().unwrap();
        let token_file = dir.path().join("token");
        std::fs::write(&token_file, "old\n").unwrap();
        let config = KubeConfig {
            server: server.url(),
            token: Some("old".into()),
            token_file: Some(token_file.clone()),
            ..KubeConfig::default()
        };
        let client = Client::new(&config, options()).unwrap();
        // The file has not changed: the 401 is the answer, with no retry.
        let e = client.get("/api/v1/pods").unwrap_err();
        assert_eq!(
            e.to_string(),
            "GET /api/v1/pods: 401 Unauthorized: Unauthorized"
        );
        assert_eq!(server.requests().len(), 1);
        // Rotated: one retry with the new token, which is then kept.
        std::fs::write(&token_file, "new\n").unwrap();
        client.get("/api/v1/pods").unwrap();
        client.get("/api/v1/pods").unwrap();
        let auth: Vec<_> = server
            .requests()
            .iter()
            .map(|r| r.header("authorization").unwrap_or("").to_string())
            .collect();
        assert_eq!(
            auth,
            ["Bearer old", "Bearer old", "Bearer new", "Bearer new"]
        );
    }

    #[test]
    fn each_answer_is_counted_by_code_method_and_host() {
        let server = TestServer::start(|r| {
            if r.target.starts_with("/missing") {
                Reply::json(404, r#"{"kind":"Status","code":404,"reason":"NotFound"}"#)
            } else {
                Reply::json(200, "{}")
            }
        });
        let client = client_for(&server);
        let host = server.url().trim_start_matches("http://").to_string();
        let count = |code: &str| {
            let mut out = String::new();
            crate::metrics::render_metrics(&mut out);
            let series = format!(
                "rest_client_requests_total{{code=\"{code}\",method=\"GET\",host=\"{host}\"}} "
            );
            out.lines()
                .find_map(|l| l.strip_prefix(&series))
                .map_or(0, |v| v.parse::<u64>().unwrap())
        };
        client.get("/api/v1/nodes/a").unwrap();
        client.get("/api/v1/nodes/b").unwrap();
        assert!(client.get("/missing").is_err());
        assert_eq!((count("200"), count("404")), (2, 1));
    }

    #[test]
    fn connection_refused_is_a_transport_error_naming_the_server() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        drop(listener);
        let config = KubeConfig {
            server: url.clone(),
            ..KubeConfig::default()
        };
        let e = Client::new(&config, options())
            .unwrap()
            .get("/version")
            .unwrap_err();
        assert!(e.is_transport(), "{e}");
        assert!(
            e.to_string().starts_with(&format!("GET /version: {url}: ")),
            "{e}"
        );
    }

    #[test]
    fn bad_pem_in_the_kubeconfig_is_refused_by_new() {
        let config = KubeConfig {
            file: "/etc/k.conf".into(),
            server: "https://h:1".into(),
            ca_pem: Some(b"not a pem".to_vec()),
            ..KubeConfig::default()
        };
        let e = Client::new(&config, options()).err().unwrap();
        assert_eq!(
            e,
            "/etc/k.conf: certificate authority: no PEM certificate found"
        );
    }

    /// TLS against a rustls server that requires a client certificate
    /// signed by its CA; the certificates are made with the openssl CLI.
    pub(crate) mod tls {
        use super::*;
        use rustls::pki_types::pem::PemObject;
        use rustls::pki_types::{CertificateDer, PrivateKeyDer};
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

        /// ca.crt/key, server.crt/key (SAN IP:127.0.0.1), client.crt/key.
        pub(super) fn make_pki(dir: &Path) {
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
                "keyUsage=critical,keyCertSign,cRLSign",
            ]);
            openssl(dir, &args);
            for (name, cn, ext) in [
                (
                    "server",
                    "/CN=127.0.0.1",
                    "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\nbasicConstraints=CA:FALSE\n",
                ),
                (
                    "client",
                    "/O=system:nodes/CN=system:node:edge-1",
                    "extendedKeyUsage=clientAuth\nbasicConstraints=CA:FALSE\n",
                ),
            ] {
                let (key, csr, crt, extfile) = (
                    format!("{name}.key"),
                    format!("{name}.csr"),
                    format!("{name}.crt"),
                    format!("{name}.ext"),
                );
                std::fs::write(dir.join(&extfile), ext).unwrap();
                let mut args = vec!["req", "-subj", cn, "-keyout", &key, "-out", &csr];
                args.extend(ec);
                openssl(dir, &args);
                openssl(
                    dir,
                    &[
                        "x509", "-req", "-in", &csr, "-CA", "ca.crt", "-CAkey", "ca.key",
                        "-CAcreateserial", "-days", "2", "-out", &crt, "-extfile", &extfile,
                    ],
                );
            }
        }

        pub(super) fn server_config(dir: &Path) -> Arc<rustls::ServerConfig> {
            let chain: Vec<_> = CertificateDer::pem_file_iter(dir.join("server.crt"))
                .unwrap()
                .collect::<Result<_, _>>()
                .unwrap();
            let key = PrivateKeyDer::from_pem_file(dir.join("server.key")).unwrap();
            let mut roots = rustls::RootCertStore::empty();
            roots
                .add(CertificateDer::from_pem_file(dir.join("ca.crt")).unwrap())
                .unwrap();
            let provider = Arc::new(rustls::crypto::ring::default_provider());
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                Arc::new(roots),
                provider.clone(),
            )
            .build()
            .unwrap();
            Arc::new(
                rustls::ServerConfig::builder_with_provider(provider)
                    .with_safe_default_protocol_versions()
                    .unwrap()
                    .with_client_cert_verifier(verifier)
                    .with_single_cert(chain, key)
                    .unwrap(),
            )
        }

        /// A PKI, a TLS server answering `/version`, and a kubeconfig
        /// writer: `cluster` and `user` are the YAML lines of each.
        pub(crate) struct Setup {
            dir: tempfile::TempDir,
            pub(crate) server: TestServer,
        }

        impl Setup {
            pub(super) fn new() -> Setup {
                Setup::with(|_| Reply::json(200, fixture_body("13a-version")))
            }

            /// The server answers from `script`.
            pub(crate) fn with(
                script: impl Fn(&crate::kube::testserver::Recorded) -> Reply + Send + Sync + 'static,
            ) -> Setup {
                let dir = tempfile::tempdir().unwrap();
                make_pki(dir.path());
                let server = TestServer::start_tls(server_config(dir.path()), script);
                Setup { dir, server }
            }

            pub(crate) fn client(&self, cluster: &str, user: &str) -> Client {
                let text = format!(
                    "apiVersion: v1\nkind: Config\ncurrent-context: c\ncontexts:\n- name: c\n  context: {{cluster: k, user: u}}\nclusters:\n- name: k\n  cluster:\n    server: {}\n{cluster}users:\n- name: u\n  user:\n{user}",
                    self.server.url()
                );
                let path = self.dir.path().join("kubelet.conf");
                std::fs::write(&path, text).unwrap();
                let config = crate::kube::load_kubeconfig(&path).unwrap();
                Client::new(&config, options()).unwrap()
            }

            pub(crate) fn ca_data(&self) -> String {
                use base64::Engine;
                let pem = std::fs::read(self.dir.path().join("ca.crt")).unwrap();
                let b64 = base64::engine::general_purpose::STANDARD.encode(pem);
                format!("    certificate-authority-data: {b64}\n")
            }
        }

        pub(crate) const CLIENT_FILES: &str =
            "    client-certificate: client.crt\n    client-key: client.key\n";

        #[test]
        fn ca_data_and_client_certificate_files() {
            let s = Setup::new();
            let client = s.client(&s.ca_data(), CLIENT_FILES);
            let v = client.get("/version").unwrap();
            assert_eq!(v["gitVersion"], "v1.20.2");
            assert!(client.server().starts_with("https://127.0.0.1:"));
        }

        #[test]
        fn insecure_skip_tls_verify_without_a_ca() {
            let s = Setup::new();
            let client = s.client("    insecure-skip-tls-verify: true\n", CLIENT_FILES);
            assert_eq!(client.get("/version").unwrap()["gitVersion"], "v1.20.2");
        }

        #[test]
        fn no_ca_fails_with_a_tls_error_naming_the_server() {
            let s = Setup::new();
            let e = s.client("", CLIENT_FILES).get("/version").unwrap_err();
            assert!(e.is_transport(), "{e}");
            let text = e.to_string();
            let prefix = format!("GET /version: {}: ", s.server.url());
            assert!(text.starts_with(&prefix), "{text}");
            assert!(text.contains("certificate"), "{text}");
            assert!(s.server.requests().is_empty());
        }

        #[test]
        fn no_client_certificate_is_refused_by_the_server() {
            let s = Setup::new();
            let e = s
                .client(&s.ca_data(), "    token: x\n")
                .get("/version")
                .unwrap_err();
            assert!(e.is_transport(), "{e}");
            assert!(s.server.requests().is_empty());
        }
    }

    /// The heartbeat clone's HTTP/2, against a server scripted frame by
    /// frame (HPACK by loona-hpack, not ours).
    mod h2_heartbeats {
        use super::*;
        use std::io::{Read, Write};
        use std::net::{TcpListener, TcpStream};
        use std::sync::mpsc;

        type Tls = rustls::StreamOwned<rustls::ServerConnection, TcpStream>;

        /// The server side of one connection.
        struct Peer {
            s: Tls,
            decoder: loona_hpack::Decoder<'static>,
            encoder: loona_hpack::Encoder<'static>,
            /// What it read so far, for the test to look at.
            seen: Seen,
        }

        /// Frame types and flags, in the order the peer read them.
        type Seen = Vec<(u8, u8)>;

        /// A request as the peer read it: its stream, headers, body and
        /// the size of its header block.
        struct Req {
            stream: u32,
            headers: Vec<(String, String)>,
            body: Vec<u8>,
            block: usize,
        }

        impl Req {
            fn header(&self, name: &str) -> Option<&str> {
                self.headers
                    .iter()
                    .find(|(n, _)| n == name)
                    .map(|(_, v)| v.as_str())
            }
        }

        impl Peer {
            fn read_frame(&mut self) -> Option<(u8, u8, u32, Vec<u8>)> {
                let mut head = [0u8; 9];
                self.s.read_exact(&mut head).ok()?;
                let len = (head[0] as usize) << 16 | (head[1] as usize) << 8 | head[2] as usize;
                let mut payload = vec![0; len];
                self.s.read_exact(&mut payload).ok()?;
                let stream = u32::from_be_bytes([head[5], head[6], head[7], head[8]]);
                self.seen.push((head[3], head[4]));
                Some((head[3], head[4], stream, payload))
            }

            fn send(&mut self, kind: u8, flags: u8, stream: u32, payload: &[u8]) {
                let mut out = (payload.len() as u32).to_be_bytes()[1..].to_vec();
                out.extend_from_slice(&[kind, flags]);
                out.extend_from_slice(&stream.to_be_bytes());
                out.extend_from_slice(payload);
                let _ = self.s.write_all(&out);
                let _ = self.s.flush();
            }

            /// The next whole request; None when the client went away.
            fn request(&mut self) -> Option<Req> {
                let (mut block, mut body, mut stream) = (Vec::new(), Vec::new(), 0);
                loop {
                    let (kind, flags, id, payload) = self.read_frame()?;
                    match kind {
                        0x1 | 0x9 => {
                            stream = id;
                            block.extend_from_slice(&payload);
                        }
                        0x0 => body.extend_from_slice(&payload),
                        _ => continue,
                    }
                    if flags & 0x1 != 0 {
                        let size = block.len();
                        let headers = self
                            .decoder
                            .decode(&block)
                            .expect("our header block decodes")
                            .into_iter()
                            .map(|(n, v)| {
                                (String::from_utf8(n).unwrap(), String::from_utf8(v).unwrap())
                            })
                            .collect();
                        return Some(Req {
                            stream,
                            headers,
                            body,
                            block: size,
                        });
                    }
                }
            }

            fn head(&mut self, status: &str) -> Vec<u8> {
                let headers = [
                    (&b":status"[..], status.as_bytes()),
                    (b"content-type", b"application/json"),
                ];
                self.encoder.encode(headers.iter().copied())
            }

            fn answer(&mut self, stream: u32, status: &str, body: &[u8]) {
                let block = self.head(status);
                self.send(0x1, 0x4, stream, &block);
                self.send(0x0, 0x1, stream, body);
            }
        }

        /// A TLS server that offers only "h2" and runs `script` on each
        /// connection (numbered from 0) once the client's preface is read
        /// and the server's SETTINGS are sent.
        struct H2Server {
            dir: tempfile::TempDir,
            addr: std::net::SocketAddr,
        }

        impl H2Server {
            fn start(script: impl Fn(usize, &mut Peer) + Send + Sync + 'static) -> H2Server {
                let dir = tempfile::tempdir().unwrap();
                tls::make_pki(dir.path());
                let mut config = (*tls::server_config(dir.path())).clone();
                config.alpn_protocols = vec![b"h2".to_vec()];
                let config = Arc::new(config);
                let listener = TcpListener::bind("127.0.0.1:0").unwrap();
                let addr = listener.local_addr().unwrap();
                let script = Arc::new(script);
                // Detached: it serves until the test process ends.
                let accept = crate::thread::spawn_named("test-h2", move || {
                    for (n, tcp) in listener.incoming().enumerate() {
                        let Ok(tcp) = tcp else { continue };
                        let _ = tcp.set_read_timeout(Some(Duration::from_secs(20)));
                        let (config, script) = (config.clone(), script.clone());
                        let t = crate::thread::spawn_named("test-h2-conn", move || {
                            let conn = rustls::ServerConnection::new(config).unwrap();
                            let mut peer = Peer {
                                s: rustls::StreamOwned::new(conn, tcp),
                                decoder: loona_hpack::Decoder::new(),
                                encoder: loona_hpack::Encoder::new(),
                                seen: Vec::new(),
                            };
                            let mut preface = [0u8; 24];
                            if peer.s.read_exact(&mut preface).is_err() {
                                return;
                            }
                            assert_eq!(&preface, b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n");
                            peer.send(0x4, 0, 0, &[]);
                            script(n, &mut peer);
                        });
                        if let Ok(t) = t {
                            t.detach();
                        }
                    }
                })
                .unwrap();
                accept.detach();
                H2Server { dir, addr }
            }

            /// A heartbeat clone with the node's client certificate.
            fn heartbeats(&self, timeout: Duration) -> Client {
                let ca = std::fs::read(self.dir.path().join("ca.crt")).unwrap();
                let config = KubeConfig {
                    server: format!("https://{}", self.addr),
                    ca_pem: Some(ca),
                    client_cert_pem: Some(
                        std::fs::read(self.dir.path().join("client.crt")).unwrap(),
                    ),
                    client_key_pem: Some(
                        std::fs::read(self.dir.path().join("client.key")).unwrap(),
                    ),
                    ..KubeConfig::default()
                };
                Client::new(&config, options())
                    .unwrap()
                    .for_heartbeats(timeout)
            }
        }

        const LEASE: &str = "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/edge-1";

        #[test]
        fn heartbeats_share_one_connection_and_repeat_their_heads_in_a_few_bytes() {
            let (tx, rx) = mpsc::channel();
            let server = H2Server::start(move |conn, peer| {
                while let Some(req) = peer.request() {
                    peer.answer(req.stream, "200", br#"{"kind":"Lease"}"#);
                    let _ = tx.send((conn, req, peer.seen.clone()));
                }
            });
            let client = server.heartbeats(Duration::from_secs(5));
            let patch = json!({"spec": {"renewTime": "2026-12-03T06:00:00.000000Z"}});
            for _ in 0..3 {
                let v = client.patch(LEASE, PatchKind::Merge, &patch).unwrap();
                assert_eq!(v["kind"], "Lease");
            }
            let reqs: Vec<(usize, Req, Seen)> = (0..3).map(|_| rx.recv().unwrap()).collect();
            assert!(reqs.iter().all(|(conn, _, _)| *conn == 0), "one connection");
            let (_, first, _) = &reqs[0];
            assert_eq!(first.header(":method"), Some("PATCH"));
            assert_eq!(first.header(":path"), Some(LEASE));
            assert_eq!(first.header(":scheme"), Some("https"));
            assert_eq!(
                first.header("content-type"),
                Some("application/merge-patch+json")
            );
            assert_eq!(first.header("accept"), Some("application/json"));
            assert_eq!(
                first.header("user-agent"),
                Some("tinylet/v0.1.0 (linux/amd64)")
            );
            assert_eq!(first.body, serde_json::to_vec(&patch).unwrap());
            let ids: Vec<u32> = reqs.iter().map(|(_, r, _)| r.stream).collect();
            assert_eq!(ids, [1, 3, 5]);
            // Every header indexed: one byte each.
            let (_, third, seen) = &reqs[2];
            assert_eq!(third.block, third.headers.len(), "{:?}", third.headers);
            assert!(first.block > 100);
            // Push turned off in the client's SETTINGS, the server's
            // SETTINGS acknowledged, the connection window opened.
            assert_eq!(seen[0], (0x4, 0));
            assert!(seen.contains(&(0x4, 0x1)), "{seen:?}");
            assert!(seen.contains(&(0x8, 0)), "{seen:?}");
        }

        #[test]
        fn a_goaway_or_refused_stream_is_sent_again_on_a_new_connection() {
            for goaway in [true, false] {
                let server = H2Server::start(move |conn, peer| {
                    if conn == 0 {
                        let Some(req) = peer.request() else { return };
                        peer.answer(req.stream, "200", br#"{"conn":0}"#);
                        let Some(req) = peer.request() else { return };
                        if goaway {
                            // Last stream 1: the second request was not taken.
                            peer.send(0x7, 0, 0, &[0, 0, 0, 1, 0, 0, 0, 0]);
                        } else {
                            peer.send(0x3, 0, req.stream, &7u32.to_be_bytes());
                        }
                        let _ = peer.request();
                        return;
                    }
                    while let Some(req) = peer.request() {
                        let body = json!({ "conn": conn }).to_string();
                        peer.answer(req.stream, "200", body.as_bytes());
                    }
                });
                let client = server.heartbeats(Duration::from_secs(5));
                assert_eq!(client.get("/version").unwrap(), json!({"conn": 0}));
                // Refused on connection 0, sent again on a new one.
                assert_eq!(
                    client.get("/version").unwrap(),
                    json!({"conn": 1}),
                    "goaway {goaway}"
                );
                assert_eq!(
                    client.get("/version").unwrap(),
                    json!({"conn": 1}),
                    "goaway {goaway}"
                );
            }
        }

        #[test]
        fn interim_heads_pings_continuations_and_padding_are_read() {
            let (tx, rx) = mpsc::channel();
            let server = H2Server::start(move |_, peer| {
                let Some(req) = peer.request() else { return };
                let s = req.stream;
                // A 103, a PING, then the head split in two frames, then the
                // body in two padded DATA frames.
                let early = peer.head("103");
                peer.send(0x1, 0x4, s, &early);
                peer.send(0x6, 0, 0, b"12345678");
                let head = peer.head("200");
                let (a, b) = head.split_at(head.len() / 2);
                peer.send(0x1, 0, s, a);
                peer.send(0x9, 0x4, s, b);
                peer.send(0x0, 0x8, s, &[2, b'{', b'"', 0, 0]);
                peer.send(0x0, 0x9, s, &[1, b'a', b'"', b':', b'1', b'}', 0]);
                // The PING's acknowledgement comes back.
                while let Some((kind, flags, _, payload)) = peer.read_frame() {
                    if kind == 0x6 {
                        let _ = tx.send((flags, payload));
                        break;
                    }
                }
            });
            let client = server.heartbeats(Duration::from_secs(5));
            assert_eq!(client.get("/x").unwrap(), json!({"a": 1}));
            let (flags, payload) = rx.recv_timeout(Duration::from_secs(5)).unwrap();
            assert_eq!((flags, payload.as_slice()), (1, &b"12345678"[..]));
        }

        #[test]
        fn error_answers_carry_their_status_and_a_silent_server_times_out() {
            let server = H2Server::start(move |conn, peer| {
                let Some(req) = peer.request() else { return };
                if conn == 0 {
                    let body = json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                        "message": "leases \"edge-1\" is forbidden: refused", "reason": "Forbidden", "code": 403});
                    peer.answer(req.stream, "403", body.to_string().as_bytes());
                    // Then the next request gets no answer at all.
                    let _ = peer.request();
                    std::thread::sleep(Duration::from_secs(3));
                    return;
                }
                peer.answer(req.stream, "200", b"{}");
            });
            let client = server.heartbeats(Duration::from_secs(1));
            let e = client.get(LEASE).unwrap_err();
            assert!(matches!(e.kind, ErrorKind::Status { code: 403, .. }), "{e}");
            assert!(e.to_string().contains("is forbidden: refused"), "{e}");
            let started = Instant::now();
            let e = client.get(LEASE).unwrap_err();
            assert!(e.is_transport(), "{e}");
            assert!(
                started.elapsed() < Duration::from_secs(3),
                "{:?}",
                started.elapsed()
            );
            // The next request opens a new connection, which answers.
            assert_eq!(client.get(LEASE).unwrap(), json!({}));
        }

        #[test]
        fn a_server_without_http2_gets_http1_from_then_on() {
            let s = tls::Setup::new();
            let client = s
                .client(&s.ca_data(), tls::CLIENT_FILES)
                .for_heartbeats(Duration::from_secs(5));
            for _ in 0..2 {
                assert_eq!(client.get("/version").unwrap()["gitVersion"], "v1.20.2");
            }
            let reqs = s.server.requests();
            assert_eq!(reqs.len(), 2);
            // Connection 0 tried HTTP/2 and closed; both requests went on
            // the next one.
            assert!(reqs.iter().all(|r| r.conn == 1), "{reqs:?}");
        }
    }
}
