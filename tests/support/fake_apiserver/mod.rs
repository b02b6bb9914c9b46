//! A fake kube-apiserver for integration tests: a std-only HTTP/1.1 server
//! (optionally HTTPS with client certificates, and then HTTP/2 too when the
//! client's ALPN asks for "h2") with an in-memory object
//! store that follows the wire behaviour recorded from a real v1.20 apiserver
//! (`shared/fixtures/apiserver/README.md`, "What a test double must
//! reproduce").
//!
//! What it does like the real one: nodes, node leases, pods (with status
//! subresources), core events, and the ConfigMaps, Secrets and Services a
//! node reads; create/get/list/watch/update/patch/delete
//! with a global resourceVersion that advances by one per write across all
//! types; list semantics for `resourceVersion` 0/empty/N, `resourceVersionMatch`,
//! `limit`/`continue`; watches from an RV with a bounded history, synthetic
//! ADDED for RV 0 or none, 410 ERROR events for compacted RVs, bookmarks only
//! with `allowWatchBookmarks` on cache-served watches, DELETED for objects
//! that stop matching a field selector; graceful pod deletion (deletionTimestamp
//! then MODIFIED-then-DELETED on grace 0); strategic-merge and merge patches
//! (conditional on the stored version, and a write only when something
//! changed); leases validated as the Lease strategy does, with no PUT
//! without a resourceVersion;
//! admission defaults for pods (service account token volume, tolerations,
//! QoS class, volume file modes), services (ports, clusterIPs) and nodes
//! (not-ready taint); bearer tokens, TLS client
//! certificates and anonymous requests; the Node authorizer and NodeRestriction
//! refusals with the recorded messages; TokenReview and SubjectAccessReview
//! (never stored: the request's spec echoed with the status filled in, from
//! the token table and the access rules a test sets; admins and nodes may
//! create them); `pods/<name>/ephemeralcontainers` only with the
//! EphemeralContainers gate, off by default as in v1.20 (404 without it);
//! Status bodies in the recorded key
//! order; recorded headers (APF, nosniff, chunking above 2048 bytes);
//! protobuf answers for Leases and Statuses to a client that asks for
//! protobuf first (other kinds stay JSON).
//!
//! What tests control: tokens and kubeconfigs, what SubjectAccessReviews
//! allow (`allow_access`), objects through handles that act
//! as the admin, every request recorded, and faults: the listener down,
//! open connections cut (the listener up), a
//! black hole (connections accepted, nothing ever answered on them, even
//! after it ends), watches cut mid-stream, history compaction, scripted error
//! answers, TokenReviews that fail (a 500, or the authenticator's error in
//! the answer) until told otherwise, raw bytes injected into open watch
//! streams, and the node lifecycle controller's "Kubelet stopped posting
//! node status". Feature gates: EphemeralContainers.
//!
//! Known simplifications: `managedFields` are approximated from the fields a
//! request sent (no schema), objects other than Status, events and list
//! envelopes are written with `kind`, `apiVersion` and `metadata` first and
//! other keys sorted, the pre-deadline bookmark is sent once (the real server
//! often sends it twice), JSON patch is refused with 415, only the
//! resources a kubelet reads or writes are served, there is no `kubernetes`
//! Service until a test creates one (the real server always has it) and
//! Services get no cluster IP allocated.
//!
//! Where things are: this module holds the public vocabulary (users,
//! credentials, recorded requests, kubeconfig choices) and small helpers
//! over JSON values, time and randomness; `server` the handle tests hold and
//! the connection threads; `http` the HTTP/1.1 and TLS plumbing; `h2` the
//! HTTP/2 framing; `dispatch`
//! routing, authentication and authorization; `handlers` the verbs;
//! `admission` and `reviews` what controllers and admission add; `store` the
//! objects and resourceVersions; `watch` the watch streams; `patch` the patch
//! formats and managedFields; `errors` the Status bodies.

#![allow(dead_code)]

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use k8s_openapi::jiff::Timestamp;
use parking_lot::{Condvar, Mutex};
use serde_json::{json, Map, Value};
use tinylet::thread::{spawn_with_stack, JoinOnDrop};

mod admission;
mod dispatch;
mod errors;
mod h2;
mod handlers;
mod http;
mod patch;
mod protobuf;
mod reviews;
mod server;
mod store;
mod watch;

use self::{
    admission::*, dispatch::*, errors::*, handlers::*, http::*, patch::*, reviews::*, server::*,
    store::*, watch::*,
};
pub use server::FakeApiServer;

/// The first resourceVersion written; watches and exact lists below it are
/// answered as compacted, like a cluster with older, compacted history.
pub const FIRST_RV: u64 = 100;
/// Events kept for watches; older ones are folded into the compacted base.
const MAX_HISTORY: usize = 1000;
/// Bodies above this size are sent chunked (Go net/http's pre-chunking buffer).
const CHUNK_THRESHOLD: usize = 2048;
/// How long a cache-served list waits for a future resourceVersion.
const TOO_LARGE_RV_WAIT: Duration = Duration::from_secs(3);
/// A watch without timeoutSeconds.
const DEFAULT_WATCH_TIMEOUT: Duration = Duration::from_secs(1800);
/// How often waiting threads look at the fault flags.
const POLL: Duration = Duration::from_millis(20);
const CONN_STACK: usize = 1024 * 1024;
const MAX_HEADER_LINE: usize = 16 * 1024;
const MAX_BODY: usize = 8 * 1024 * 1024;

pub const MIRROR_ANNOTATION: &str = "kubernetes.io/config.mirror";
pub const NODE_LEASE_NAMESPACE: &str = "kube-node-lease";
const SA_MOUNT_PATH: &str = "/var/run/secrets/kubernetes.io/serviceaccount";
/// The audience of tokens requested without one (`--api-audiences`).
const TOKEN_AUDIENCE: &str = "https://kubernetes.default.svc.cluster.local";
/// The ConfigMap the root-CA publisher puts in every namespace.
pub const ROOT_CA_CONFIGMAP: &str = "kube-root-ca.crt";
/// Its content (and the SA token secrets' `ca.crt`) in the fake.
pub const FAKE_ROOT_CA: &str =
    "-----BEGIN CERTIFICATE-----\nfake root CA\n-----END CERTIFICATE-----\n";

/// An authenticated identity.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct User {
    pub name: String,
    pub groups: Vec<String>,
}

impl User {
    pub fn new(name: &str, groups: &[&str]) -> User {
        User {
            name: name.to_string(),
            groups: groups.iter().map(|g| g.to_string()).collect(),
        }
    }

    fn anonymous() -> User {
        User::new("system:anonymous", &["system:unauthenticated"])
    }

    fn admin() -> User {
        User::new("admin", &["system:masters", "system:authenticated"])
    }

    fn is_admin(&self) -> bool {
        self.groups.iter().any(|g| g == "system:masters")
    }

    /// The node name of a `system:node:<name>` user in group system:nodes.
    fn node_name(&self) -> Option<&str> {
        let name = self.name.strip_prefix("system:node:")?;
        self.groups
            .iter()
            .any(|g| g == "system:nodes")
            .then_some(name)
    }

    fn flow(&self) -> (&'static str, &'static str) {
        if self.node_name().is_some() {
            (
                "7f796b97-e7c0-42ea-a3d5-76b128ebf445",
                "682f6917-91ea-41da-ae57-637ce68b6052",
            )
        } else if self.is_admin() {
            (
                "3a7e8e7d-564b-4815-8463-9cbb4a4779a6",
                "a33cf214-5476-45f9-b456-80bb87a440c1",
            )
        } else {
            (
                "ac09a02a-603e-4fbb-8382-07ff8f212c64",
                "12f01a0c-819f-40b4-acd5-26c722a95661",
            )
        }
    }
}

/// The groups a kubeconfig user gets: system:nodes for `system:node:*`,
/// system:masters for anyone else.
fn default_groups(user: &str) -> Vec<&'static str> {
    if user.starts_with("system:node:") {
        vec!["system:nodes", "system:authenticated"]
    } else {
        vec!["system:masters", "system:authenticated"]
    }
}

/// One request as the server answered it.
#[derive(Clone, Debug)]
pub struct RecordedRequest {
    /// The HTTP method.
    pub verb: String,
    pub path: String,
    /// The raw query string, without `?`.
    pub query: String,
    /// The authenticated user name ("" when authentication failed).
    pub user: String,
    /// The status code sent (200 for a watch), 0 when none was sent.
    pub status: u16,
    /// The request's Content-Type ("" without one).
    pub content_type: String,
    /// The request's Accept ("" without one).
    pub accept: String,
    pub body: String,
    /// When it was recorded: after the server acted on it (a write is in the
    /// store and its watch event queued), before the answer was sent.
    pub at: Instant,
    /// It came over HTTP/2 (TLS with ALPN "h2"); false for HTTP/1.1.
    pub http2: bool,
}

/// How TokenReviews fail while `FakeApiServer::fail_token_reviews` says so.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TokenReviewFailure {
    /// 500 InternalError with a Status body: a review the apiserver could
    /// not make.
    InternalError,
    /// 201 with `status.error` and no `authenticated`: the apiserver's own
    /// token authenticator failed (its webhook unreachable, say), as
    /// upstream's TokenReview storage answers then.
    AuthenticatorError,
}

/// How the kubeconfig's user authenticates.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Credential {
    /// `token:` inline.
    Token,
    /// `tokenFile: token`, relative to the kubeconfig.
    TokenFile,
    /// `client-certificate: client.crt` and `client-key: client.key` (TLS only).
    ClientCertFiles,
    /// `client-certificate-data` and `client-key-data` (TLS only).
    ClientCertData,
    /// No credentials: anonymous.
    Anonymous,
}

/// How the kubeconfig's cluster trusts the server (TLS only; ignored for http).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ServerTrust {
    /// `certificate-authority: ca.crt`, relative to the kubeconfig.
    CaFile,
    /// `certificate-authority-data`.
    CaData,
    /// `insecure-skip-tls-verify: true`.
    InsecureSkipVerify,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KubeconfigAuth {
    pub credential: Credential,
    pub trust: ServerTrust,
}

impl KubeconfigAuth {
    pub fn new(credential: Credential, trust: ServerTrust) -> KubeconfigAuth {
        KubeconfigAuth { credential, trust }
    }
    pub fn token() -> KubeconfigAuth {
        KubeconfigAuth::new(Credential::Token, ServerTrust::CaFile)
    }
    pub fn token_file() -> KubeconfigAuth {
        KubeconfigAuth::new(Credential::TokenFile, ServerTrust::CaFile)
    }
    pub fn client_cert_files() -> KubeconfigAuth {
        KubeconfigAuth::new(Credential::ClientCertFiles, ServerTrust::CaFile)
    }
    pub fn client_cert_data() -> KubeconfigAuth {
        KubeconfigAuth::new(Credential::ClientCertData, ServerTrust::CaData)
    }
}

// ---------------------------------------------------------------------------
// Small helpers over serde_json::Value

fn sv<'a>(v: &'a Value, path: &[&str]) -> &'a str {
    let mut cur = v;
    for p in path {
        cur = &cur[*p];
    }
    cur.as_str().unwrap_or("")
}

fn obj_mut<'a>(v: &'a mut Value, key: &str) -> &'a mut Map<String, Value> {
    if !v.is_object() {
        *v = json!({});
    }
    let m = v.as_object_mut().expect("made an object above");
    let e = m.entry(key.to_string()).or_insert_with(|| json!({}));
    if !e.is_object() {
        *e = json!({});
    }
    e.as_object_mut().expect("made an object above")
}

fn default_key(m: &mut Map<String, Value>, key: &str, value: Value) {
    let absent = m
        .get(key)
        .is_none_or(|v| v.is_null() || v.as_str() == Some(""));
    if absent {
        m.insert(key.to_string(), value);
    }
}

fn strip_kind(v: &Value) -> Value {
    let mut v = v.clone();
    if let Some(m) = v.as_object_mut() {
        m.remove("kind");
        m.remove("apiVersion");
    }
    v
}

/// An object as the apiserver writes it: kind, apiVersion, metadata first.
fn encode(v: &Value) -> String {
    let Some(m) = v.as_object() else {
        return v.to_string();
    };
    let mut parts = Vec::new();
    for k in ["kind", "apiVersion", "metadata"] {
        if let Some(x) = m.get(k) {
            parts.push(format!("{}:{}", js(k), x));
        }
    }
    for (k, x) in m {
        if !matches!(k.as_str(), "kind" | "apiVersion" | "metadata") {
            parts.push(format!("{}:{}", js(k), x));
        }
    }
    format!("{{{}}}", parts.join(","))
}

fn rv_of(v: &Value) -> u64 {
    sv(v, &["metadata", "resourceVersion"]).parse().unwrap_or(0)
}

// ---------------------------------------------------------------------------
// Time and randomness

fn now() -> Timestamp {
    Timestamp::now()
}

fn time_secs(t: Timestamp) -> String {
    t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}

fn now_secs() -> String {
    time_secs(now())
}

fn http_date() -> String {
    now().strftime("%a, %d %b %Y %H:%M:%S GMT").to_string()
}

fn add_secs(t: &str, secs: i64) -> String {
    match t.parse::<Timestamp>() {
        Ok(ts) => match Timestamp::from_second(ts.as_second() + secs) {
            Ok(x) => time_secs(x),
            Err(_) => t.to_string(),
        },
        Err(_) => t.to_string(),
    }
}

fn rand_u64() -> u64 {
    static STATE: AtomicU64 = AtomicU64::new(0);
    static SEED: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    let seed = *SEED.get_or_init(|| {
        let t = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos() as u64;
        t ^ (std::process::id() as u64).rotate_left(32)
    });
    let mut z = STATE
        .fetch_add(0x9E37_79B9_7F4A_7C15, Ordering::Relaxed)
        .wrapping_add(seed);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

fn new_uid() -> String {
    let a = rand_u64();
    let b = rand_u64();
    let mut bytes = [0u8; 16];
    bytes[..8].copy_from_slice(&a.to_be_bytes());
    bytes[8..].copy_from_slice(&b.to_be_bytes());
    bytes[6] = (bytes[6] & 0x0f) | 0x40;
    bytes[8] = (bytes[8] & 0x3f) | 0x80;
    let h: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &h[..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..]
    )
}

/// Five characters from the apiserver's name-suffix alphabet.
fn name_suffix() -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let mut r = rand_u64();
    (0..5)
        .map(|_| {
            let c = ALPHABET[(r % ALPHABET.len() as u64) as usize] as char;
            r /= ALPHABET.len() as u64;
            c
        })
        .collect()
}
