//! The API client (upstream client-go, the parts a kubelet uses): kubeconfig
//! loading, blocking JSON requests over ureq with rustls, a client-side rate
//! limiter shared by all threads, lists and watch streams decoded one object
//! at a time, the reflector, and the watch multiplexer (`mux`: many
//! single-object watches on one thread, over non-blocking connections).
//!
//! API boundary: this is the only module that knows HTTP and TLS to the
//! apiserver. Everything else sees paths, JSON values and [`ApiError`].

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use serde_json::Value;

mod client;
mod h2;
mod kubeconfig;
mod list;
mod mux;
mod nbhttp;
pub(crate) mod protobuf;
mod ratelimit;
mod reflector;
mod watch;

#[cfg(test)]
pub(crate) mod testserver;
#[cfg(test)]
pub(crate) use client::tests::client_for;

pub use client::Client;
pub use kubeconfig::load_kubeconfig;
pub use list::{read_list, ListError, ListItem, ListMeta, MAX_OBJECT};
pub(crate) use mux::WatchMux;
pub use reflector::{decode_object, Reflector};
pub use watch::{WatchStream, MAX_EVENT};

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
pub(crate) enum PatchKind {
    /// `application/strategic-merge-patch+json`
    Strategic,
    /// `application/merge-patch+json`
    Merge,
}

/// The fields of a `Status` object; `code` is used when the object has none.
pub(crate) fn status_from_value(s: &Value, code: u16, header_retry: Option<u64>) -> ErrorKind {
    let text = |k: &str| s.get(k).and_then(Value::as_str).unwrap_or("").to_string();
    let code = s
        .get("code")
        .and_then(Value::as_u64)
        .and_then(|c| u16::try_from(c).ok())
        .filter(|c| *c != 0)
        .unwrap_or(code);
    let retry_after = s
        .get("details")
        .and_then(|d| d.get("retryAfterSeconds"))
        .and_then(Value::as_u64)
        .or(header_retry);
    ErrorKind::Status {
        code,
        reason: text("reason"),
        message: text("message"),
        retry_after,
    }
}

/// What went wrong with one request.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum ErrorKind {
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
    pub(crate) verb: &'static str,
    pub(crate) path: String,
    pub(crate) kind: ErrorKind,
}

impl ApiError {
    pub(crate) fn code(&self) -> Option<u16> {
        match &self.kind {
            ErrorKind::Status { code, .. } => Some(*code),
            _ => None,
        }
    }
    pub(crate) fn reason(&self) -> &str {
        match &self.kind {
            ErrorKind::Status { reason, .. } => reason,
            _ => "",
        }
    }
    pub(crate) fn is_not_found(&self) -> bool {
        self.code() == Some(404)
    }
    /// 409 with reason Conflict (stale resourceVersion, failed precondition).
    pub(crate) fn is_conflict(&self) -> bool {
        self.code() == Some(409) && self.reason() != "AlreadyExists"
    }
    pub(crate) fn is_already_exists(&self) -> bool {
        self.code() == Some(409) && self.reason() == "AlreadyExists"
    }
    /// 410 Gone / reason Expired: the resourceVersion is too old.
    pub(crate) fn is_gone(&self) -> bool {
        self.code() == Some(410) || self.reason() == "Expired" || self.reason() == "Gone"
    }
    pub fn is_forbidden(&self) -> bool {
        self.code() == Some(403)
    }
    pub(crate) fn is_transport(&self) -> bool {
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
            } if reason.is_empty() => write!(f, "{code}: {message}"),
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
    /// An event over the per-object cap, read past and not decoded: what
    /// was found in it (its type, `namespace/name`, resourceVersion; empty
    /// or None when not found) and its size.
    TooLarge {
        event_type: String,
        key: String,
        resource_version: Option<String>,
        bytes: u64,
    },
}

/// What a reflector lists and watches: a collection path and an optional
/// field selector (`spec.nodeName=edge-1`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ListWatch {
    /// The collection, e.g. `/api/v1/pods`.
    pub(crate) path: String,
    pub(crate) field_selector: Option<String>,
}
