//! The API client (upstream client-go, the parts a kubelet uses): kubeconfig
//! loading, blocking JSON requests over ureq with rustls, a client-side rate
//! limiter shared by all threads, watch streams and the reflector.
//!
//! API boundary: this is the only module that knows HTTP and TLS to the
//! apiserver. Everything else sees paths, JSON values and [`ApiError`].

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;

/// A kubeconfig resolved for one context: where the apiserver is and how to
/// authenticate. Paths inside the file are resolved against its directory.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct KubeConfig {
    /// The kubeconfig file this came from (for error messages).
    pub file: PathBuf,
    /// `https://host:port` (or `http://` in tests), without a trailing slash.
    pub server: String,
    /// PEM of the CA bundle that signs the server certificate, if given.
    pub ca_pem: Option<Vec<u8>>,
    pub insecure_skip_tls_verify: bool,
    /// PEM client certificate chain and key, if given.
    pub client_cert_pem: Option<Vec<u8>>,
    pub client_key_pem: Option<Vec<u8>>,
    /// A bearer token (from `token` or read once from `tokenFile`).
    pub token: Option<String>,
    /// `tokenFile`, re-read when the server answers 401.
    pub token_file: Option<PathBuf>,
}

/// Reads `path` and resolves its current context. Errors name the file and
/// the field (`users[0].user.client-certificate: ...`).
pub fn load_kubeconfig(path: &Path) -> Result<KubeConfig, String> {
    Err(format!(
        "{}: kubeconfig loading is not built yet",
        path.display()
    ))
}

/// Client settings.
#[derive(Debug, Clone)]
pub struct ClientOptions {
    /// Sustained requests per second (`--kube-api-qps`); 0 means unlimited.
    pub qps: f32,
    /// Requests allowed in a burst (`--kube-api-burst`).
    pub burst: u32,
    /// Deadline of one non-watch request.
    pub timeout: Duration,
    /// Sent as `User-Agent`, e.g. `tinylet/v0.1.0 (linux/amd64)`.
    pub user_agent: String,
}

/// The kind of PATCH body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PatchKind {
    /// `application/strategic-merge-patch+json`
    Strategic,
    /// `application/merge-patch+json`
    Merge,
    /// `application/json-patch+json`
    Json,
}

/// What went wrong with one request.
#[derive(Debug, Clone, PartialEq)]
pub enum ErrorKind {
    /// The server answered with a non-2xx status (the `Status` body decoded
    /// where there is one; `reason` empty when it has none).
    Status {
        code: u16,
        reason: String,
        message: String,
        /// `details.retryAfterSeconds` or the `Retry-After` header.
        retry_after: Option<u64>,
    },
    /// No answer: connection refused, reset, TLS failure, timeout.
    Transport(String),
    /// An answer that could not be decoded.
    Decode(String),
}

/// An error of one request: the verb and path with what went wrong.
/// Displays as `PATCH /api/v1/nodes/edge-1/status: 403 Forbidden: <message>`.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    pub verb: &'static str,
    pub path: String,
    pub kind: ErrorKind,
}

impl ApiError {
    pub fn code(&self) -> Option<u16> {
        match &self.kind {
            ErrorKind::Status { code, .. } => Some(*code),
            _ => None,
        }
    }
    pub fn reason(&self) -> &str {
        match &self.kind {
            ErrorKind::Status { reason, .. } => reason,
            _ => "",
        }
    }
    pub fn is_not_found(&self) -> bool {
        self.code() == Some(404)
    }
    /// 409 with reason Conflict (stale resourceVersion, failed precondition).
    pub fn is_conflict(&self) -> bool {
        self.code() == Some(409) && self.reason() != "AlreadyExists"
    }
    pub fn is_already_exists(&self) -> bool {
        self.code() == Some(409) && self.reason() == "AlreadyExists"
    }
    /// 410 Gone / reason Expired: the resourceVersion is too old.
    pub fn is_gone(&self) -> bool {
        self.code() == Some(410) || self.reason() == "Expired" || self.reason() == "Gone"
    }
    pub fn is_forbidden(&self) -> bool {
        self.code() == Some(403)
    }
    pub fn is_transport(&self) -> bool {
        matches!(self.kind, ErrorKind::Transport(_))
    }
}

impl fmt::Display for ApiError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}: ", self.verb, self.path)?;
        match &self.kind {
            ErrorKind::Status {
                code,
                reason,
                message,
                ..
            } => write!(f, "{code} {reason}: {message}"),
            ErrorKind::Transport(m) => write!(f, "{m}"),
            ErrorKind::Decode(m) => write!(f, "cannot decode the answer: {m}"),
        }
    }
}

impl std::error::Error for ApiError {}

/// One event of a watch stream.
#[derive(Debug, Clone, PartialEq)]
pub enum WatchEvent {
    Added(Value),
    Modified(Value),
    Deleted(Value),
    /// Only the resourceVersion of a BOOKMARK is kept.
    Bookmark {
        resource_version: String,
    },
    /// An ERROR event: the `Status` it carried, as an error of the watch
    /// request (410 Expired means relist).
    Error(ApiError),
}

/// A blocking client, cheap to clone; all clones share one rate limiter and
/// connection pool.
#[derive(Clone)]
pub struct Client {
    inner: Arc<()>,
}

impl Client {
    pub fn new(_config: &KubeConfig, _options: ClientOptions) -> Result<Client, String> {
        Err("the API client is not built yet".into())
    }

    /// `https://host:port` of the apiserver.
    pub fn server(&self) -> &str {
        let _ = &self.inner;
        ""
    }

    /// GET `path` (absolute, with its query) and decode the JSON answer.
    pub fn get(&self, path: &str) -> Result<Value, ApiError> {
        Err(unbuilt("GET", path))
    }
    /// POST `body` to `path`.
    pub fn create(&self, path: &str, _body: &Value) -> Result<Value, ApiError> {
        Err(unbuilt("POST", path))
    }
    /// PUT `body` to `path`.
    pub fn replace(&self, path: &str, _body: &Value) -> Result<Value, ApiError> {
        Err(unbuilt("PUT", path))
    }
    /// PATCH `path` with a body of the given kind.
    pub fn patch(&self, path: &str, _kind: PatchKind, _body: &Value) -> Result<Value, ApiError> {
        Err(unbuilt("PATCH", path))
    }
    /// DELETE `path` with a `DeleteOptions` body (`Value::Null` for none).
    pub fn delete(&self, path: &str, _options: &Value) -> Result<Value, ApiError> {
        Err(unbuilt("DELETE", path))
    }
    /// Opens a watch (`path` carries `watch=true` or is a watch path with its
    /// query). Events are decoded one at a time as they arrive; the stream
    /// ends (`None`) when the server closes it. A read that waits longer
    /// than `idle` fails with a transport error, so a dead connection is
    /// noticed.
    pub fn watch(&self, path: &str, _idle: Duration) -> Result<WatchStream, ApiError> {
        Err(unbuilt("GET", path))
    }
}

fn unbuilt(verb: &'static str, path: &str) -> ApiError {
    ApiError {
        verb,
        path: path.to_string(),
        kind: ErrorKind::Transport("the API client is not built yet".into()),
    }
}

/// The events of one watch request, decoded one at a time with bounded memory.
pub struct WatchStream {
    _private: (),
}

impl Iterator for WatchStream {
    type Item = Result<WatchEvent, ApiError>;
    fn next(&mut self) -> Option<Self::Item> {
        None
    }
}

/// What a reflector lists and watches: a collection path and an optional
/// field selector (`spec.nodeName=edge-1`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListWatch {
    /// The collection, e.g. `/api/v1/pods`.
    pub path: String,
    pub field_selector: Option<String>,
}

/// Handle of a reflector thread (`reflector/<name>`): it lists, then watches
/// from the list's resourceVersion, keeps the objects by `namespace/name`,
/// and after the first list and after every change hands the complete set
/// to its sink. Dropping the handle tells the thread to stop; a thread
/// blocked in a read ends at its next event or read deadline (it is not
/// joined).
pub struct Reflector {
    _private: (),
}

impl Reflector {
    pub fn start<T>(
        name: &str,
        _client: Client,
        _lw: ListWatch,
        _sink: Box<dyn FnMut(Vec<Arc<T>>) + Send>,
    ) -> std::io::Result<Reflector>
    where
        T: k8s_openapi::Metadata<Ty = k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta>
            + serde::de::DeserializeOwned
            + Send
            + Sync
            + 'static,
    {
        Err(std::io::Error::other(format!(
            "reflector {name}: not built yet"
        )))
    }
}
