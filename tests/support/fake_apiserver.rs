//! A fake kube-apiserver for integration tests: a std-only HTTP/1.1 server
//! (optionally HTTPS with client certificates) with an in-memory object
//! store that follows the wire behaviour recorded from a real v1.20 apiserver
//! (`shared/fixtures/apiserver/README.md`, "What a test double must
//! reproduce").
//!
//! What it does like the real one: nodes, node leases, pods (with status
//! subresources) and core events; create/get/list/watch/update/patch/delete
//! with a global resourceVersion that advances by one per write across all
//! types; list semantics for `resourceVersion` 0/empty/N, `resourceVersionMatch`,
//! `limit`/`continue`; watches from an RV with a bounded history, synthetic
//! ADDED for RV 0 or none, 410 ERROR events for compacted RVs, bookmarks only
//! with `allowWatchBookmarks` on cache-served watches, DELETED for objects
//! that stop matching a field selector; graceful pod deletion (deletionTimestamp
//! then MODIFIED-then-DELETED on grace 0); strategic-merge and merge patches;
//! admission defaults for pods (service account token volume, tolerations,
//! QoS class) and nodes (not-ready taint); bearer tokens, TLS client
//! certificates and anonymous requests; the Node authorizer and NodeRestriction
//! refusals with the recorded messages; TokenReview and SubjectAccessReview
//! (never stored: the request's spec echoed with the status filled in, from
//! the token table and the access rules a test sets; admins and nodes may
//! create them); Status bodies in the recorded key
//! order; recorded headers (APF, nosniff, chunking above 2048 bytes).
//!
//! What tests control: tokens and kubeconfigs, what SubjectAccessReviews
//! allow (`allow_access`), objects through handles that act
//! as the admin, every request recorded, and faults: the listener down, a
//! black hole (connections accepted, nothing ever answered on them, even
//! after it ends), watches cut mid-stream, history compaction, scripted error
//! answers, raw bytes injected into open watch streams, and the node
//! lifecycle controller's "Kubelet stopped posting node status".
//!
//! Known simplifications: `managedFields` are approximated from the fields a
//! request sent (no schema), objects other than Status, events and list
//! envelopes are written with `kind`, `apiVersion` and `metadata` first and
//! other keys sorted, the pre-deadline bookmark is sent once (the real server
//! often sends it twice), JSON patch is refused with 415, and only the
//! resources a kubelet writes are served.

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
    pub body: String,
    /// When it was recorded: after the server acted on it (a write is in the
    /// store and its watch event queued), before the answer was sent.
    pub at: Instant,
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
// Resources

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Res {
    Pods,
    Nodes,
    Leases,
    Events,
    Secrets,
    ConfigMaps,
    /// Only its `token` subresource (TokenRequest) is served.
    ServiceAccounts,
    Services,
}

/// The resource of a plural name; panics on one the fake does not serve.
fn res_named(resource: &str) -> Res {
    [
        Res::Pods,
        Res::Nodes,
        Res::Leases,
        Res::Events,
        Res::Secrets,
        Res::ConfigMaps,
        Res::ServiceAccounts,
        Res::Services,
    ]
    .into_iter()
    .find(|r| r.resource() == resource)
    .unwrap_or_else(|| panic!("the fake apiserver serves no resource {resource:?}"))
}

impl Res {
    fn resource(self) -> &'static str {
        match self {
            Res::Pods => "pods",
            Res::Nodes => "nodes",
            Res::Leases => "leases",
            Res::Events => "events",
            Res::Secrets => "secrets",
            Res::ConfigMaps => "configmaps",
            Res::ServiceAccounts => "serviceaccounts",
            Res::Services => "services",
        }
    }
    fn group(self) -> &'static str {
        match self {
            Res::Leases => "coordination.k8s.io",
            _ => "",
        }
    }
    fn kind(self) -> &'static str {
        match self {
            Res::Pods => "Pod",
            Res::Nodes => "Node",
            Res::Leases => "Lease",
            Res::Events => "Event",
            Res::Secrets => "Secret",
            Res::ConfigMaps => "ConfigMap",
            Res::ServiceAccounts => "ServiceAccount",
            Res::Services => "Service",
        }
    }
    fn api_version(self) -> &'static str {
        match self {
            Res::Leases => "coordination.k8s.io/v1",
            _ => "v1",
        }
    }
    fn namespaced(self) -> bool {
        self != Res::Nodes
    }
    /// `pods`, `leases.coordination.k8s.io`: the GroupResource string.
    fn qualified(self) -> String {
        if self.group().is_empty() {
            self.resource().to_string()
        } else {
            format!("{}.{}", self.resource(), self.group())
        }
    }
    fn field_labels(self) -> &'static [&'static str] {
        match self {
            Res::Pods => &[
                "metadata.name",
                "metadata.namespace",
                "spec.nodeName",
                "spec.restartPolicy",
                "spec.schedulerName",
                "spec.serviceAccountName",
                "status.phase",
                "status.podIP",
                "status.nominatedNodeName",
            ],
            Res::Nodes => &["metadata.name", "spec.unschedulable"],
            Res::Leases | Res::ConfigMaps | Res::ServiceAccounts | Res::Services => {
                &["metadata.name", "metadata.namespace"]
            }
            Res::Secrets => &["metadata.name", "metadata.namespace", "type"],
            Res::Events => &[
                "metadata.name",
                "metadata.namespace",
                "involvedObject.kind",
                "involvedObject.namespace",
                "involvedObject.name",
                "involvedObject.uid",
                "involvedObject.apiVersion",
                "involvedObject.resourceVersion",
                "involvedObject.fieldPath",
                "reason",
                "reportingComponent",
                "source",
                "type",
            ],
        }
    }
    /// The object a 1.20 bookmark carries: the empty typed object with only
    /// the resourceVersion set.
    fn bookmark(self, rv: u64) -> String {
        let meta = format!(r#""metadata":{{"resourceVersion":"{rv}","creationTimestamp":null}}"#);
        let head = format!(
            r#"{{"kind":"{}","apiVersion":"{}",{meta}"#,
            self.kind(),
            self.api_version()
        );
        match self {
            Res::Pods => format!(r#"{head},"spec":{{"containers":null}},"status":{{}}}}"#),
            Res::Nodes => format!(
                r#"{head},"spec":{{}},"status":{{"daemonEndpoints":{{"kubeletEndpoint":{{"Port":0}}}},"nodeInfo":{{"machineID":"","systemUUID":"","bootID":"","kernelVersion":"","osImage":"","containerRuntimeVersion":"","kubeletVersion":"","kubeProxyVersion":"","operatingSystem":"","architecture":""}}}}}}"#
            ),
            Res::Leases => format!(r#"{head},"spec":{{}}}}"#),
            Res::Secrets | Res::ConfigMaps | Res::ServiceAccounts => format!("{head}}}"),
            Res::Services => format!(r#"{head},"spec":{{}},"status":{{"loadBalancer":{{}}}}}}"#),
            Res::Events => format!(
                r#"{head},"involvedObject":{{}},"source":{{}},"firstTimestamp":null,"lastTimestamp":null,"eventTime":null,"reportingComponent":"","reportingInstance":""}}"#
            ),
        }
    }
}

type Key = (Res, String, String);

// ---------------------------------------------------------------------------
// Status bodies

/// A failure answered as a `Status` body.
#[derive(Clone, Debug, Default)]
struct Status {
    code: u16,
    reason: Option<String>,
    message: String,
    details: Option<Box<Details>>,
    /// Authorization refusals carry `X-Content-Type-Options: nosniff`.
    nosniff: bool,
    retry_after: Option<u64>,
}

#[derive(Clone, Debug, Default)]
struct Details {
    name: String,
    group: String,
    kind: String,
    uid: String,
    /// (reason, message, field)
    causes: Vec<(String, String, String)>,
    retry_after_seconds: u64,
}

/// Go's `'%s'`.
fn sq(s: &str) -> String {
    format!("'{s}'")
}

fn q(s: &str) -> String {
    // Go's %q for the plain strings used here.
    format!("{s:?}")
}

fn js(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_default()
}

impl Status {
    fn new(code: u16, reason: &str, message: impl Into<String>) -> Status {
        Status {
            code,
            reason: (!reason.is_empty()).then(|| reason.to_string()),
            message: message.into(),
            ..Status::default()
        }
    }

    fn with_details(mut self, d: Details) -> Status {
        self.details = Some(Box::new(d));
        self
    }

    /// The body, in the key order the apiserver writes.
    fn json(&self) -> String {
        let mut s =
            String::from(r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure""#);
        s += &format!(r#","message":{}"#, js(&self.message));
        if let Some(r) = &self.reason {
            s += &format!(r#","reason":{}"#, js(r));
        }
        if let Some(d) = &self.details {
            let mut parts = Vec::new();
            if !d.name.is_empty() {
                parts.push(format!(r#""name":{}"#, js(&d.name)));
            }
            if !d.group.is_empty() {
                parts.push(format!(r#""group":{}"#, js(&d.group)));
            }
            if !d.kind.is_empty() {
                parts.push(format!(r#""kind":{}"#, js(&d.kind)));
            }
            if !d.uid.is_empty() {
                parts.push(format!(r#""uid":{}"#, js(&d.uid)));
            }
            if !d.causes.is_empty() {
                let causes: Vec<String> = d
                    .causes
                    .iter()
                    .map(|(r, m, f)| {
                        let mut c = Vec::new();
                        if !r.is_empty() {
                            c.push(format!(r#""reason":{}"#, js(r)));
                        }
                        if !m.is_empty() {
                            c.push(format!(r#""message":{}"#, js(m)));
                        }
                        if !f.is_empty() {
                            c.push(format!(r#""field":{}"#, js(f)));
                        }
                        format!("{{{}}}", c.join(","))
                    })
                    .collect();
                parts.push(format!(r#""causes":[{}]"#, causes.join(",")));
            }
            if d.retry_after_seconds > 0 {
                parts.push(format!(r#""retryAfterSeconds":{}"#, d.retry_after_seconds));
            }
            s += &format!(r#","details":{{{}}}"#, parts.join(","));
        }
        s += &format!(r#","code":{}}}"#, self.code);
        s
    }
}

fn details(res: Res, name: &str) -> Details {
    Details {
        name: name.to_string(),
        group: res.group().to_string(),
        kind: res.resource().to_string(),
        ..Details::default()
    }
}

fn not_found(res: Res, name: &str) -> Status {
    Status::new(
        404,
        "NotFound",
        format!("{} {} not found", res.qualified(), q(name)),
    )
    .with_details(details(res, name))
}

fn already_exists(res: Res, name: &str) -> Status {
    Status::new(
        409,
        "AlreadyExists",
        format!("{} {} already exists", res.qualified(), q(name)),
    )
    .with_details(details(res, name))
}

fn conflict_modified(res: Res, name: &str) -> Status {
    Status::new(
        409,
        "Conflict",
        format!(
            "Operation cannot be fulfilled on {} {}: the object has been modified; please apply your changes to the latest version and try again",
            res.qualified(),
            q(name)
        ),
    )
    .with_details(details(res, name))
}

/// A refusal by admission (NodeRestriction, ServiceAccount): no "User ... cannot" part.
fn admission_forbidden(res: Res, name: &str, why: impl std::fmt::Display) -> Status {
    Status::new(
        403,
        "Forbidden",
        format!("{} {} is forbidden: {why}", res.qualified(), q(name)),
    )
    .with_details(details(res, name))
}

fn bad_request(message: impl Into<String>) -> Status {
    Status::new(400, "BadRequest", message)
}

/// 422 Invalid with details.kind the Kind, as the apiserver writes it.
fn invalid(res: Res, name: &str, causes: Vec<(String, String, String)>) -> Status {
    let mut msgs: Vec<String> = Vec::new();
    for (_, m, f) in &causes {
        let full = format!("{f}: {m}");
        if !msgs.contains(&full) {
            msgs.push(full);
        }
    }
    let summary = if msgs.len() == 1 {
        msgs[0].clone()
    } else {
        format!("[{}]", msgs.join(", "))
    };
    Status::new(
        422,
        "Invalid",
        format!("{} {} is invalid: {summary}", res.kind(), q(name)),
    )
    .with_details(Details {
        name: name.to_string(),
        group: res.group().to_string(),
        kind: res.kind().to_string(),
        causes,
        ..Details::default()
    })
}

fn expired(message: &str) -> Status {
    Status::new(410, "Expired", message)
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

// ---------------------------------------------------------------------------
// Patches

/// The list fields a strategic merge patch merges by key; every other list
/// is replaced whole.
fn merge_key(field: &str) -> Option<&'static str> {
    Some(match field {
        "conditions" | "addresses" => "type",
        "podIPs" => "ip",
        "containers" | "initContainers" | "ephemeralContainers" | "volumes" | "env" => "name",
        "imagePullSecrets" => "name",
        "volumeMounts" => "mountPath",
        "ports" => "containerPort",
        "ownerReferences" => "uid",
        _ => return None,
    })
}

fn merge_patch(orig: &Value, patch: &Value) -> Value {
    match (orig, patch) {
        (Value::Object(o), Value::Object(p)) => {
            let mut out = o.clone();
            for (k, v) in p {
                if v.is_null() {
                    out.remove(k);
                } else {
                    let merged = merge_patch(o.get(k).unwrap_or(&Value::Null), v);
                    out.insert(k.clone(), merged);
                }
            }
            Value::Object(out)
        }
        (_, Value::Object(p)) => merge_patch(&json!({}), &Value::Object(p.clone())),
        _ => patch.clone(),
    }
}

fn strip_directives(v: &Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.iter()
                .filter(|(k, _)| !k.starts_with('$'))
                .map(|(k, v)| (k.clone(), strip_directives(v)))
                .collect(),
        ),
        Value::Array(a) => Value::Array(a.iter().map(strip_directives).collect()),
        other => other.clone(),
    }
}

fn smp(orig: &Value, patch: &Value) -> Result<Value, String> {
    let Some(p) = patch.as_object() else {
        return Ok(patch.clone());
    };
    match p.get("$patch").and_then(|v| v.as_str()) {
        Some("replace") => return Ok(strip_directives(patch)),
        Some("delete") => return Ok(Value::Null),
        Some(other) => return Err(format!("unknown patch type: {other}")),
        None => {}
    }
    let mut out = orig.as_object().cloned().unwrap_or_default();
    if let Some(keep) = p.get("$retainKeys").and_then(|v| v.as_array()) {
        let keep: Vec<&str> = keep.iter().filter_map(|k| k.as_str()).collect();
        out.retain(|k, _| keep.contains(&k.as_str()));
    }
    for (k, v) in p {
        if k.starts_with('$') {
            if let Some(field) = k.strip_prefix("$deleteFromPrimitiveList/") {
                if let (Some(Value::Array(list)), Some(del)) = (out.get_mut(field), v.as_array()) {
                    list.retain(|x| !del.contains(x));
                }
            }
            continue;
        }
        if v.is_null() {
            out.remove(k);
            continue;
        }
        let cur = out.get(k).cloned().unwrap_or(Value::Null);
        let merged = match v {
            Value::Object(_) => {
                let base = if cur.is_object() { cur } else { json!({}) };
                smp(&base, v)?
            }
            Value::Array(items) => match merge_key(k) {
                Some(mk) if items.iter().all(|i| i.is_object()) => {
                    let order = p
                        .get(&format!("$setElementOrder/{k}"))
                        .and_then(|o| o.as_array());
                    merge_list(
                        cur.as_array().cloned().unwrap_or_default(),
                        items,
                        mk,
                        order,
                    )?
                }
                _ => strip_directives(v),
            },
            _ => v.clone(),
        };
        if merged.is_null() {
            out.remove(k);
        } else {
            out.insert(k.clone(), merged);
        }
    }
    Ok(Value::Object(out))
}

fn merge_list(
    mut list: Vec<Value>,
    patch: &[Value],
    mk: &str,
    order: Option<&Vec<Value>>,
) -> Result<Value, String> {
    for item in patch {
        let key = &item[mk];
        match item.get("$patch").and_then(|v| v.as_str()) {
            Some("delete") => list.retain(|e| &e[mk] != key),
            Some("replace") => {
                let rest: Vec<Value> = patch
                    .iter()
                    .filter(|i| i.get("$patch").is_none())
                    .map(strip_directives)
                    .collect();
                return Ok(Value::Array(rest));
            }
            Some(other) => return Err(format!("unknown patch type: {other}")),
            None => match list.iter().position(|e| &e[mk] == key) {
                Some(i) => list[i] = smp(&list[i], item)?,
                None => list.push(strip_directives(item)),
            },
        }
    }
    if let Some(order) = order {
        let keys: Vec<&Value> = order.iter().map(|o| &o[mk]).collect();
        let mut ordered: Vec<Value> = Vec::new();
        for k in &keys {
            if let Some(i) = list.iter().position(|e| &&e[mk] == k) {
                ordered.push(list.remove(i));
            }
        }
        ordered.extend(list);
        list = ordered;
    }
    Ok(Value::Array(list))
}

// ---------------------------------------------------------------------------
// managedFields (approximated from the fields a request sent)

fn fields_of(v: &Value, depth: usize) -> Value {
    let mut out = Map::new();
    if let Some(m) = v.as_object() {
        if depth > 1 && !m.is_empty() {
            out.insert(".".into(), json!({}));
        }
        for (k, child) in m {
            if k.starts_with('$') {
                continue;
            }
            let inner = match child {
                Value::Object(c) if !c.is_empty() => fields_of(child, depth + 1),
                Value::Array(items) => match merge_key(k) {
                    Some(mk) if !items.is_empty() && items.iter().all(|i| i.is_object()) => {
                        let mut lm = Map::new();
                        lm.insert(".".into(), json!({}));
                        for i in items {
                            let key = format!("k:{{{}:{}}}", js(mk), i[mk]);
                            lm.insert(key, fields_of(i, 2));
                        }
                        Value::Object(lm)
                    }
                    _ => json!({}),
                },
                _ => json!({}),
            };
            out.insert(format!("f:{k}"), inner);
        }
    }
    Value::Object(out)
}

fn union(a: &mut Value, b: &Value) {
    if let (Some(am), Some(bm)) = (a.as_object_mut(), b.as_object()) {
        for (k, v) in bm {
            match am.get_mut(k) {
                Some(x) => union(x, v),
                None => {
                    am.insert(k.clone(), v.clone());
                }
            }
        }
    }
}

/// The fields a request set, without identity metadata and directives.
fn owned_fields(sent: &Value) -> Value {
    let mut v = strip_directives(sent);
    if let Some(m) = v.as_object_mut() {
        m.remove("kind");
        m.remove("apiVersion");
        if let Some(meta) = m.get_mut("metadata").and_then(|x| x.as_object_mut()) {
            for k in [
                "name",
                "namespace",
                "uid",
                "resourceVersion",
                "creationTimestamp",
                "managedFields",
                "selfLink",
                "generateName",
                "deletionTimestamp",
                "deletionGracePeriodSeconds",
                "generation",
            ] {
                meta.remove(k);
            }
            if meta.is_empty() {
                m.remove("metadata");
            }
        }
    }
    v
}

fn record_manager(
    obj: &mut Value,
    manager: &str,
    api_version: &str,
    sent: &Value,
    subresource_status: bool,
) {
    let mut fields = owned_fields(sent);
    if subresource_status {
        fields = json!({ "status": fields.get("status").cloned().unwrap_or(json!({})) });
    }
    let fields_v1 = fields_of(&fields, 0);
    if fields_v1.as_object().is_none_or(|m| m.is_empty()) {
        return;
    }
    let meta = obj_mut(obj, "metadata");
    let entries = meta.entry("managedFields").or_insert_with(|| json!([]));
    if !entries.is_array() {
        *entries = json!([]);
    }
    let list = entries.as_array_mut().expect("made an array above");
    let time = now_secs();
    if let Some(e) = list
        .iter_mut()
        .find(|e| e["manager"] == manager && e["operation"] == "Update")
    {
        union(&mut e["fieldsV1"], &fields_v1);
        e["time"] = json!(time);
    } else {
        list.push(json!({
            "manager": manager,
            "operation": "Update",
            "apiVersion": api_version,
            "time": time,
            "fieldsType": "FieldsV1",
            "fieldsV1": fields_v1,
        }));
    }
}

// ---------------------------------------------------------------------------
// Selectors

#[derive(Clone, Debug, Default)]
struct Filter {
    namespace: Option<String>,
    name: Option<String>,
    /// (field, equal?, value)
    fields: Vec<(String, bool, String)>,
    /// (key, op, value): op is "=", "!=", "exists", "!exists"
    labels: Vec<(String, String, String)>,
}

impl Filter {
    fn parse(
        res: Res,
        namespace: Option<&str>,
        name: Option<&str>,
        fs: &str,
        ls: &str,
    ) -> Result<Filter, Status> {
        let mut f = Filter {
            namespace: namespace.map(str::to_string),
            name: name.map(str::to_string),
            ..Filter::default()
        };
        for term in fs.split(',').filter(|t| !t.is_empty()) {
            let (field, eq, value) = if let Some((a, b)) = term.split_once("!=") {
                (a, false, b)
            } else if let Some((a, b)) = term.split_once("==") {
                (a, true, b)
            } else if let Some((a, b)) = term.split_once('=') {
                (a, true, b)
            } else {
                return Err(bad_request(format!("invalid field selector: {term}")));
            };
            if !res.field_labels().contains(&field) {
                return Err(bad_request(format!("field label not supported: {field}")));
            }
            f.fields.push((field.to_string(), eq, value.to_string()));
        }
        for term in ls.split(',').filter(|t| !t.is_empty()) {
            let t = if let Some((a, b)) = term.split_once("!=") {
                (a, "!=", b)
            } else if let Some((a, b)) = term.split_once("==") {
                (a, "=", b)
            } else if let Some((a, b)) = term.split_once('=') {
                (a, "=", b)
            } else if let Some(a) = term.strip_prefix('!') {
                (a, "!exists", "")
            } else {
                (term, "exists", "")
            };
            f.labels.push((
                t.0.trim().to_string(),
                t.1.to_string(),
                t.2.trim().to_string(),
            ));
        }
        Ok(f)
    }

    fn is_filtered(&self) -> bool {
        !self.fields.is_empty() || !self.labels.is_empty()
    }

    fn matches(&self, obj: &Value) -> bool {
        if let Some(ns) = &self.namespace {
            if sv(obj, &["metadata", "namespace"]) != ns {
                return false;
            }
        }
        if let Some(n) = &self.name {
            if sv(obj, &["metadata", "name"]) != n {
                return false;
            }
        }
        for (field, eq, value) in &self.fields {
            let path: Vec<&str> = field.split('.').collect();
            let mut cur = obj;
            for p in &path {
                cur = &cur[*p];
            }
            let actual = match cur {
                Value::String(s) => s.clone(),
                Value::Bool(b) => b.to_string(),
                Value::Null => {
                    if field == "spec.unschedulable" {
                        "false".into()
                    } else {
                        String::new()
                    }
                }
                other => other.to_string(),
            };
            if (actual == *value) != *eq {
                return false;
            }
        }
        let labels = &obj["metadata"]["labels"];
        for (k, op, v) in &self.labels {
            let actual = labels.get(k).and_then(|x| x.as_str());
            let ok = match op.as_str() {
                "=" => actual == Some(v.as_str()),
                "!=" => actual != Some(v.as_str()),
                "exists" => actual.is_some(),
                _ => actual.is_none(),
            };
            if !ok {
                return false;
            }
        }
        true
    }
}

// ---------------------------------------------------------------------------
// The store

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum EventType {
    Added,
    Modified,
    Deleted,
}

#[derive(Clone, Debug)]
struct Event {
    rv: u64,
    res: Res,
    kind: EventType,
    key: Key,
    obj: Value,
    prev: Option<Value>,
}

struct Fault {
    verb: String,
    path_contains: String,
    status: Status,
    remaining: usize,
}

struct State {
    rv: u64,
    objects: BTreeMap<Key, Value>,
    /// The objects as of `compacted`.
    base: BTreeMap<Key, Value>,
    /// Writes after `compacted`, oldest first.
    log: VecDeque<Event>,
    compacted: u64,
    /// The last RV the watch cache of each type saw.
    type_rv: HashMap<Res, u64>,
    tokens: HashMap<String, User>,
    requests: Vec<RecordedRequest>,
    faults: Vec<Fault>,
    bookmark_interval: Duration,
    sa_suffix: String,
    /// TokenRequests answered so far (each token is distinct).
    tokens_issued: u64,
    /// What SubjectAccessReviews allow (RBAC bindings, in effect).
    access_rules: Vec<AccessRule>,
}

/// One grant a SubjectAccessReview finds: a ClusterRoleBinding of a role
/// with one rule, to a user or a group.
#[derive(Clone, Debug)]
struct AccessRule {
    binding: String,
    /// A user name, or a group the user is in.
    subject: String,
    /// A verb or "*".
    verb: String,
    /// `resource/subresource`, `resource/*` or "*".
    resource: String,
}

impl State {
    fn new() -> State {
        State {
            rv: FIRST_RV,
            objects: BTreeMap::new(),
            base: BTreeMap::new(),
            log: VecDeque::new(),
            compacted: FIRST_RV,
            type_rv: HashMap::new(),
            tokens: HashMap::new(),
            requests: Vec::new(),
            faults: Vec::new(),
            bookmark_interval: Duration::from_secs(60),
            sa_suffix: name_suffix(),
            tokens_issued: 0,
            access_rules: Vec::new(),
        }
    }

    fn type_rv(&self, res: Res) -> u64 {
        self.type_rv.get(&res).copied().unwrap_or(FIRST_RV)
    }

    /// The pods bound to `node`.
    fn pods_on<'a>(&'a self, node: &'a str) -> impl Iterator<Item = &'a Value> + 'a {
        self.objects
            .iter()
            .filter(|((res, _, _), _)| *res == Res::Pods)
            .map(|(_, p)| p)
            .filter(move |p| sv(p, &["spec", "nodeName"]) == node)
    }

    fn get(&self, res: Res, ns: &str, name: &str) -> Option<&Value> {
        self.objects.get(&(res, ns.to_string(), name.to_string()))
    }

    /// Stores a write: the next RV, the history event, the type's cache RV.
    fn write(&mut self, key: Key, kind: EventType, mut obj: Value) -> Value {
        self.rv += 1;
        let rv = self.rv;
        obj_mut(&mut obj, "metadata").insert("resourceVersion".into(), json!(rv.to_string()));
        let prev = match kind {
            EventType::Deleted => self.objects.remove(&key),
            _ => self.objects.insert(key.clone(), obj.clone()),
        };
        self.type_rv.insert(key.0, rv);
        self.log.push_back(Event {
            rv,
            res: key.0,
            kind,
            key,
            obj: obj.clone(),
            prev,
        });
        while self.log.len() > MAX_HISTORY {
            self.fold_oldest();
        }
        obj
    }

    fn fold_oldest(&mut self) {
        if let Some(e) = self.log.pop_front() {
            match e.kind {
                EventType::Deleted => {
                    self.base.remove(&e.key);
                }
                _ => {
                    self.base.insert(e.key, e.obj);
                }
            }
            self.compacted = e.rv;
        }
    }

    fn compact(&mut self) {
        while !self.log.is_empty() {
            self.fold_oldest();
        }
        self.compacted = self.rv;
    }

    /// The objects as of `rv` (rv >= compacted).
    fn objects_at(&self, rv: u64) -> BTreeMap<Key, Value> {
        let mut m = self.base.clone();
        for e in self.log.iter().take_while(|e| e.rv <= rv) {
            match e.kind {
                EventType::Deleted => {
                    m.remove(&e.key);
                }
                _ => {
                    m.insert(e.key.clone(), e.obj.clone());
                }
            }
        }
        m
    }
}

// ---------------------------------------------------------------------------
// HTTP plumbing

struct Request {
    method: String,
    path: String,
    raw_query: String,
    query: Vec<(String, String)>,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
    close: bool,
}

impl Request {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
    fn param(&self, name: &str) -> Option<&str> {
        self.query
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
    fn manager(&self) -> String {
        self.header("user-agent")
            .unwrap_or("")
            .split('/')
            .next()
            .unwrap_or("")
            .to_string()
    }
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'%' if i + 2 < b.len() => {
                let hex = std::str::from_utf8(&b[i + 1..i + 3]).unwrap_or("");
                match u8::from_str_radix(hex, 16) {
                    Ok(v) => {
                        out.push(v);
                        i += 3;
                        continue;
                    }
                    Err(_) => out.push(b'%'),
                }
            }
            b'+' => out.push(b' '),
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn read_line_limited<R: BufRead>(r: &mut R) -> io::Result<Option<String>> {
    let mut buf = Vec::new();
    let n = r
        .by_ref()
        .take(MAX_HEADER_LINE as u64)
        .read_until(b'\n', &mut buf)?;
    if n == 0 {
        return Ok(None);
    }
    while buf.last().is_some_and(|c| *c == b'\n' || *c == b'\r') {
        buf.pop();
    }
    Ok(Some(String::from_utf8_lossy(&buf).into_owned()))
}

fn read_request<R: BufRead>(r: &mut R) -> io::Result<Option<Request>> {
    let line = loop {
        match read_line_limited(r)? {
            None => return Ok(None),
            Some(l) if l.is_empty() => continue,
            Some(l) => break l,
        }
    };
    let mut parts = line.split(' ');
    let method = parts.next().unwrap_or("").to_string();
    let target = parts.next().unwrap_or("").to_string();
    let version = parts.next().unwrap_or("").to_string();
    let mut headers = Vec::new();
    loop {
        let Some(l) = read_line_limited(r)? else {
            return Ok(None);
        };
        if l.is_empty() {
            break;
        }
        if let Some((k, v)) = l.split_once(':') {
            headers.push((k.trim().to_ascii_lowercase(), v.trim().to_string()));
        }
    }
    let header = |n: &str| headers.iter().find(|(k, _)| k == n).map(|(_, v)| v.clone());
    let mut body = Vec::new();
    if header("transfer-encoding").is_some_and(|v| v.eq_ignore_ascii_case("chunked")) {
        loop {
            let size_line = read_line_limited(r)?.unwrap_or_default();
            let size = usize::from_str_radix(size_line.split(';').next().unwrap_or("").trim(), 16)
                .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "bad chunk size"))?;
            if size == 0 {
                while read_line_limited(r)?.is_some_and(|l| !l.is_empty()) {}
                break;
            }
            if body.len() + size > MAX_BODY {
                return Err(io::Error::new(io::ErrorKind::InvalidData, "body too large"));
            }
            let start = body.len();
            body.resize(start + size, 0);
            r.read_exact(&mut body[start..])?;
            read_line_limited(r)?;
        }
    } else if let Some(len) = header("content-length") {
        let len: usize = len
            .parse()
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "bad content-length"))?;
        if len > MAX_BODY {
            return Err(io::Error::new(io::ErrorKind::InvalidData, "body too large"));
        }
        body.resize(len, 0);
        r.read_exact(&mut body)?;
    }
    let close = header("connection").is_some_and(|v| v.eq_ignore_ascii_case("close"))
        || version == "HTTP/1.0";
    let (path, raw_query) = match target.split_once('?') {
        Some((p, q)) => (p.to_string(), q.to_string()),
        None => (target.clone(), String::new()),
    };
    let query = raw_query
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| match p.split_once('=') {
            Some((k, v)) => (percent_decode(k), percent_decode(v)),
            None => (percent_decode(p), String::new()),
        })
        .collect();
    Ok(Some(Request {
        method,
        path,
        raw_query,
        query,
        headers,
        body,
        close,
    }))
}

struct Resp {
    code: u16,
    body: Vec<u8>,
    content_type: &'static str,
    nosniff: bool,
    /// APF flow schema and priority level UIDs (absent on 401s).
    flow: Option<(&'static str, &'static str)>,
    retry_after: Option<u64>,
}

impl Resp {
    fn object(code: u16, v: &Value) -> Resp {
        Resp::json(code, encode(v) + "\n")
    }
    fn json(code: u16, body: String) -> Resp {
        Resp {
            code,
            body: body.into_bytes(),
            content_type: "application/json",
            nosniff: false,
            flow: None,
            retry_after: None,
        }
    }
    fn status(s: &Status) -> Resp {
        let mut r = Resp::json(s.code, s.json() + "\n");
        r.nosniff = s.nosniff;
        r.retry_after = s.retry_after;
        r
    }
    fn text(body: &str) -> Resp {
        Resp {
            code: 200,
            body: body.as_bytes().to_vec(),
            content_type: "text/plain; charset=utf-8",
            nosniff: true,
            flow: None,
            retry_after: None,
        }
    }
}

fn reason_phrase(code: u16) -> &'static str {
    match code {
        200 => "OK",
        201 => "Created",
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        409 => "Conflict",
        410 => "Gone",
        415 => "Unsupported Media Type",
        422 => "Unprocessable Entity",
        429 => "Too Many Requests",
        500 => "Internal Server Error",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        504 => "Gateway Timeout",
        _ => "Unknown",
    }
}

fn write_response<W: Write>(w: &mut W, r: &Resp) -> io::Result<()> {
    let mut head = format!(
        "HTTP/1.1 {} {}\r\nCache-Control: no-cache, private\r\nContent-Type: {}\r\n",
        r.code,
        reason_phrase(r.code),
        r.content_type
    );
    if let Some(s) = r.retry_after {
        head += &format!("Retry-After: {s}\r\n");
    }
    if r.nosniff {
        head += "X-Content-Type-Options: nosniff\r\n";
    }
    if let Some((fs, pl)) = r.flow {
        head += &format!(
            "X-Kubernetes-Pf-Flowschema-Uid: {fs}\r\nX-Kubernetes-Pf-Prioritylevel-Uid: {pl}\r\n"
        );
    }
    head += &format!("Date: {}\r\n", http_date());
    let mut out = head.into_bytes();
    if r.body.len() > CHUNK_THRESHOLD {
        out.extend_from_slice(b"Transfer-Encoding: chunked\r\n\r\n");
        out.extend_from_slice(format!("{:x}\r\n", r.body.len()).as_bytes());
        out.extend_from_slice(&r.body);
        out.extend_from_slice(b"\r\n0\r\n\r\n");
    } else {
        out.extend_from_slice(format!("Content-Length: {}\r\n\r\n", r.body.len()).as_bytes());
        out.extend_from_slice(&r.body);
    }
    w.write_all(&out)?;
    w.flush()
}

fn write_chunk<W: Write>(w: &mut W, data: &[u8]) -> io::Result<()> {
    let mut out = format!("{:x}\r\n", data.len()).into_bytes();
    out.extend_from_slice(data);
    out.extend_from_slice(b"\r\n");
    w.write_all(&out)?;
    w.flush()
}

enum Conn {
    Plain(TcpStream),
    Tls(Box<rustls::StreamOwned<rustls::ServerConnection, TcpStream>>),
}

impl Conn {
    fn tcp(&self) -> &TcpStream {
        match self {
            Conn::Plain(s) => s,
            Conn::Tls(s) => &s.sock,
        }
    }
    fn cert_user(&self) -> Option<User> {
        match self {
            Conn::Plain(_) => None,
            Conn::Tls(s) => {
                let cert = s.conn.peer_certificates()?.first()?;
                let (cn, orgs) = cert_subject(cert.as_ref())?;
                let mut groups = orgs;
                groups.push("system:authenticated".into());
                Some(User { name: cn, groups })
            }
        }
    }
}

impl Read for Conn {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Conn::Plain(s) => s.read(buf),
            Conn::Tls(s) => s.read(buf),
        }
    }
}

impl Write for Conn {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Conn::Plain(s) => s.write(buf),
            Conn::Tls(s) => s.write(buf),
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        match self {
            Conn::Plain(s) => s.flush(),
            Conn::Tls(s) => s.flush(),
        }
    }
}

/// Reads (CN, [O]) from a DER certificate's subject.
fn cert_subject(cert: &[u8]) -> Option<(String, Vec<String>)> {
    fn der(buf: &[u8]) -> Option<(u8, &[u8], &[u8])> {
        let (&tag, rest) = buf.split_first()?;
        let (&l0, rest) = rest.split_first()?;
        let (len, rest) = if l0 < 0x80 {
            (l0 as usize, rest)
        } else {
            let n = (l0 & 0x7f) as usize;
            if n == 0 || n > 4 || rest.len() < n {
                return None;
            }
            let len = rest[..n].iter().fold(0usize, |a, b| (a << 8) | *b as usize);
            (len, &rest[n..])
        };
        (rest.len() >= len).then(|| (tag, &rest[..len], &rest[len..]))
    }
    let (_, cert, _) = der(cert)?;
    let (_, mut tbs, _) = der(cert)?;
    let (tag, _, rest) = der(tbs)?;
    if tag == 0xa0 {
        tbs = rest;
    }
    for _ in 0..4 {
        let (_, _, rest) = der(tbs)?;
        tbs = rest;
    }
    let (_, mut subject, _) = der(tbs)?;
    let mut cn = None;
    let mut orgs = Vec::new();
    while !subject.is_empty() {
        let (_, mut set, rest) = der(subject)?;
        subject = rest;
        while !set.is_empty() {
            let (_, atv, rest) = der(set)?;
            set = rest;
            let (_, oid, rest) = der(atv)?;
            let (_, val, _) = der(rest)?;
            let val = String::from_utf8(val.to_vec()).ok()?;
            match oid {
                [0x55, 0x04, 0x03] => cn = Some(val),
                [0x55, 0x04, 0x0a] => orgs.push(val),
                _ => {}
            }
        }
    }
    Some((cn?, orgs))
}

// ---------------------------------------------------------------------------
// The server

struct Shared {
    state: Mutex<State>,
    changed: Condvar,
    stop: AtomicBool,
    black_hole: AtomicBool,
    /// Bumped by drop_watches: open watches with an older value cut their connection.
    watch_gen: AtomicU64,
    /// Raw bytes for open watches, by resource, numbered in order.
    injected: Mutex<Vec<Injection>>,
    next_injection: AtomicU64,
    /// Watches streaming now, by resource.
    open_watches: Mutex<HashMap<Res, usize>>,
    conns: Mutex<HashMap<u64, TcpStream>>,
    next_conn: AtomicU64,
    threads: Mutex<Vec<JoinOnDrop<()>>>,
    tls: Option<Arc<rustls::ServerConfig>>,
}

/// Raw bytes for the watches of one resource, with their number.
type Injection = (u64, Res, Arc<Vec<u8>>);

struct Acceptor {
    quit: Arc<AtomicBool>,
    thread: JoinOnDrop<()>,
}

struct Tls {
    dir: tempfile::TempDir,
    ca_pem: String,
}

/// A running fake apiserver. Dropping it stops the server and its threads.
pub struct FakeApiServer {
    shared: Arc<Shared>,
    addr: SocketAddr,
    acceptor: Mutex<Option<Acceptor>>,
    tls: Option<Tls>,
}

impl FakeApiServer {
    /// Serves plain HTTP on 127.0.0.1.
    pub fn start() -> FakeApiServer {
        FakeApiServer::start_with(None)
    }

    /// Serves HTTPS on 127.0.0.1 with a CA and server certificate generated by
    /// the `openssl` CLI; client certificates signed by that CA authenticate
    /// as CN = user, O = groups.
    pub fn start_tls() -> FakeApiServer {
        let dir = tempfile::tempdir().expect("temp dir for TLS material");
        let d = dir.path();
        openssl(
            d,
            &[
                "req",
                "-x509",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:prime256v1",
                "-nodes",
                "-keyout",
                "ca.key",
                "-out",
                "ca.crt",
                "-subj",
                "/CN=fake-apiserver-ca",
                "-days",
                "2",
                "-addext",
                "basicConstraints=critical,CA:TRUE",
                "-addext",
                "keyUsage=critical,keyCertSign,cRLSign",
            ],
        );
        std::fs::write(
            d.join("server.ext"),
            "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\nbasicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature\n",
        )
        .expect("write server.ext");
        issue_cert(d, "server", "/CN=kube-apiserver", "server.ext");
        let read = |f: &str| std::fs::read(d.join(f)).unwrap_or_else(|e| panic!("read {f}: {e}"));
        use rustls::pki_types::pem::PemObject;
        use rustls::pki_types::{CertificateDer, PrivateKeyDer};
        let ca_pem = String::from_utf8(read("ca.crt")).expect("ca.crt is PEM");
        let ca = CertificateDer::from_pem_slice(ca_pem.as_bytes()).expect("parse ca.crt");
        let chain = vec![
            CertificateDer::from_pem_slice(&read("server.crt")).expect("parse server.crt"),
            ca.clone(),
        ];
        let key = PrivateKeyDer::from_pem_slice(&read("server.key")).expect("parse server.key");
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut roots = rustls::RootCertStore::empty();
        roots.add(ca).expect("add CA to the client root store");
        let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
            Arc::new(roots),
            provider.clone(),
        )
        .allow_unauthenticated()
        .build()
        .expect("client verifier");
        let mut config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("protocol versions")
            .with_client_cert_verifier(verifier)
            .with_single_cert(chain, key)
            .expect("server certificate");
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        let mut s = FakeApiServer::start_with(Some(Arc::new(config)));
        s.tls = Some(Tls { dir, ca_pem });
        s
    }

    fn start_with(tls: Option<Arc<rustls::ServerConfig>>) -> FakeApiServer {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
        let addr = listener.local_addr().expect("local addr");
        let shared = Arc::new(Shared {
            state: Mutex::new(State::new()),
            changed: Condvar::new(),
            stop: AtomicBool::new(false),
            black_hole: AtomicBool::new(false),
            watch_gen: AtomicU64::new(0),
            injected: Mutex::new(Vec::new()),
            next_injection: AtomicU64::new(1),
            open_watches: Mutex::new(HashMap::new()),
            conns: Mutex::new(HashMap::new()),
            next_conn: AtomicU64::new(0),
            threads: Mutex::new(Vec::new()),
            tls,
        });
        let acceptor = start_acceptor(&shared, listener);
        FakeApiServer {
            shared,
            addr,
            acceptor: Mutex::new(Some(acceptor)),
            tls: None,
        }
    }

    /// `http://127.0.0.1:PORT` or `https://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        format!("{scheme}://{}", self.addr)
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The CA certificate (PEM) in TLS mode.
    pub fn ca_pem(&self) -> Option<String> {
        self.tls.as_ref().map(|t| t.ca_pem.clone())
    }

    /// Registers a bearer token for `user` in `groups` (system:authenticated is added).
    pub fn add_token(&self, token: &str, user: &str, groups: &[&str]) {
        let mut u = User::new(user, groups);
        if !u.groups.iter().any(|g| g == "system:authenticated") {
            u.groups.push("system:authenticated".into());
        }
        self.shared.state.lock().tokens.insert(token.to_string(), u);
    }

    /// Lets SubjectAccessReviews allow `subject` (a user name or a group)
    /// to `verb` (or "*") `resource` (`nodes/proxy`, `nodes/*` or "*"), as a
    /// ClusterRoleBinding named `binding` would.
    pub fn allow_access(&self, binding: &str, subject: &str, verb: &str, resource: &str) {
        self.shared.state.lock().access_rules.push(AccessRule {
            binding: binding.to_string(),
            subject: subject.to_string(),
            verb: verb.to_string(),
            resource: resource.to_string(),
        });
    }

    /// Issues a client certificate for `user` in `groups`, signed by the
    /// fake's CA: (certificate PEM, PKCS#8 key PEM). TLS mode only.
    pub fn client_cert(&self, user: &str, groups: &[&str]) -> (String, String) {
        let tls = self
            .tls
            .as_ref()
            .expect("client certificates need start_tls");
        let d = tls.dir.path();
        let stem = format!("client-{}", rand_u64());
        std::fs::write(
            d.join(format!("{stem}.ext")),
            "extendedKeyUsage=clientAuth\nbasicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature\n",
        )
        .expect("write client ext");
        let mut subj = format!("/CN={user}");
        for g in groups {
            subj += &format!("/O={g}");
        }
        issue_cert(d, &stem, &subj, &format!("{stem}.ext"));
        let read = |f: String| {
            std::fs::read_to_string(d.join(&f)).unwrap_or_else(|e| panic!("read {f}: {e}"))
        };
        (read(format!("{stem}.crt")), read(format!("{stem}.key")))
    }

    /// A node's kubeconfig (user `system:node:<node>`, a bearer token) in
    /// `dir`, as the tests that run a connected node write it.
    pub fn node_kubeconfig(&self, dir: &Path, node: &str) -> PathBuf {
        self.write_kubeconfig(dir, &format!("system:node:{node}"), KubeconfigAuth::token())
    }

    /// Writes `dir/kubeconfig` (and the files it names, relative to it) for
    /// `user`; a token or certificate is made for the user, in group
    /// system:nodes for `system:node:*` users and system:masters otherwise.
    pub fn write_kubeconfig(&self, dir: &Path, user: &str, auth: KubeconfigAuth) -> PathBuf {
        let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s.as_bytes());
        let groups = default_groups(user);
        let new_token = || {
            let token = format!("fake-token-{:016x}", rand_u64());
            self.add_token(&token, user, &groups);
            token
        };
        let write = |name: &str, content: &str| {
            std::fs::write(dir.join(name), content).unwrap_or_else(|e| panic!("write {name}: {e}"));
        };
        let user_yaml = match auth.credential {
            Credential::Token => format!("    token: {}\n", new_token()),
            Credential::TokenFile => {
                write("token", &format!("{}\n", new_token()));
                "    tokenFile: token\n".to_string()
            }
            Credential::ClientCertFiles => {
                let (cert, key) = self.client_cert(user, &groups);
                write("client.crt", &cert);
                write("client.key", &key);
                "    client-certificate: client.crt\n    client-key: client.key\n".to_string()
            }
            Credential::ClientCertData => {
                let (cert, key) = self.client_cert(user, &groups);
                format!(
                    "    client-certificate-data: {}\n    client-key-data: {}\n",
                    b64(&cert),
                    b64(&key)
                )
            }
            Credential::Anonymous => String::new(),
        };
        let user_yaml = if user_yaml.is_empty() {
            "  user: {}\n".to_string()
        } else {
            format!("  user:\n{user_yaml}")
        };
        let trust = match (&self.tls, auth.trust) {
            (None, _) => String::new(),
            (Some(t), ServerTrust::CaFile) => {
                write("ca.crt", &t.ca_pem);
                "    certificate-authority: ca.crt\n".to_string()
            }
            (Some(t), ServerTrust::CaData) => {
                format!("    certificate-authority-data: {}\n", b64(&t.ca_pem))
            }
            (Some(_), ServerTrust::InsecureSkipVerify) => {
                "    insecure-skip-tls-verify: true\n".to_string()
            }
        };
        let yaml = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster:\n    server: {}\n{trust}contexts:\n- name: fake\n  context:\n    cluster: fake\n    user: fake-user\ncurrent-context: fake\nusers:\n- name: fake-user\n{user_yaml}preferences: {{}}\n",
            self.url()
        );
        let path = dir.join("kubeconfig");
        std::fs::write(&path, yaml).expect("write kubeconfig");
        path
    }

    // -- objects, as the admin ------------------------------------------------

    fn admin_ctx() -> Ctx {
        Ctx {
            user: User::admin(),
            manager: "kubectl".into(),
        }
    }

    fn locked<T>(&self, f: impl FnOnce(&mut State) -> T) -> T {
        let mut st = self.shared.state.lock();
        let out = f(&mut st);
        drop(st);
        self.shared.changed.notify_all();
        out
    }

    /// Creates a pod as the admin (admission defaults applied); panics on refusal.
    pub fn create_pod(&self, pod: Value) -> Value {
        let ns = pod["metadata"]["namespace"]
            .as_str()
            .unwrap_or("default")
            .to_string();
        self.locked(|st| create(st, &Self::admin_ctx(), Res::Pods, &ns, pod))
            .unwrap_or_else(|s| panic!("create pod: {}", s.json()))
    }

    /// Creates a node as the admin; panics on refusal.
    pub fn create_node(&self, node: Value) -> Value {
        self.locked(|st| create(st, &Self::admin_ctx(), Res::Nodes, "", node))
            .unwrap_or_else(|s| panic!("create node: {}", s.json()))
    }

    /// Creates a Secret as the admin; `data` values are plain text (encoded
    /// here). Panics on refusal.
    pub fn create_secret(&self, ns: &str, name: &str, data: &[(&str, &str)]) -> Value {
        let b64 = base64::engine::general_purpose::STANDARD;
        let data: Map<String, Value> = data
            .iter()
            .map(|(k, v)| (k.to_string(), json!(b64.encode(v))))
            .collect();
        let obj = json!({"metadata": {"name": name}, "type": "Opaque", "data": data});
        self.locked(|st| create(st, &Self::admin_ctx(), Res::Secrets, ns, obj))
            .unwrap_or_else(|s| panic!("create secret: {}", s.json()))
    }

    /// Creates a ConfigMap as the admin; panics on refusal.
    pub fn create_config_map(&self, ns: &str, name: &str, data: &[(&str, &str)]) -> Value {
        let data: Map<String, Value> = data
            .iter()
            .map(|(k, v)| (k.to_string(), json!(v)))
            .collect();
        let obj = json!({"metadata": {"name": name}, "data": data});
        self.locked(|st| create(st, &Self::admin_ctx(), Res::ConfigMaps, ns, obj))
            .unwrap_or_else(|s| panic!("create configmap: {}", s.json()))
    }

    /// Creates a Service as the admin with `clusterIP` (`None` or "" for
    /// none) and `ports` (`[{"name", "port", "protocol"}]`); panics on
    /// refusal.
    pub fn create_service(&self, ns: &str, name: &str, cluster_ip: &str, ports: Value) -> Value {
        let obj = json!({
            "metadata": {"name": name},
            "spec": {"clusterIP": cluster_ip, "ports": ports},
        });
        self.locked(|st| create(st, &Self::admin_ctx(), Res::Services, ns, obj))
            .unwrap_or_else(|s| panic!("create service: {}", s.json()))
    }

    /// Deletes a Service as the admin; false if it did not exist.
    pub fn delete_service(&self, ns: &str, name: &str) -> bool {
        self.locked(|st| {
            delete(
                st,
                &Self::admin_ctx(),
                Res::Services,
                ns,
                name,
                &DeleteOptions::default(),
            )
            .is_ok()
        })
    }

    /// Replaces a Secret's data as the admin would with a PUT (a MODIFIED
    /// event); `data` values are plain text. False if it does not exist.
    pub fn update_secret(&self, ns: &str, name: &str, data: &[(&str, &str)]) -> bool {
        let b64 = base64::engine::general_purpose::STANDARD;
        let data: Map<String, Value> = data
            .iter()
            .map(|(k, v)| (k.to_string(), json!(b64.encode(v))))
            .collect();
        self.replace_data(Res::Secrets, ns, name, data)
    }

    /// Replaces a ConfigMap's data as the admin would with a PUT (a
    /// MODIFIED event). False if it does not exist.
    pub fn update_config_map(&self, ns: &str, name: &str, data: &[(&str, &str)]) -> bool {
        let data: Map<String, Value> = data
            .iter()
            .map(|(k, v)| (k.to_string(), json!(v)))
            .collect();
        self.replace_data(Res::ConfigMaps, ns, name, data)
    }

    fn replace_data(&self, res: Res, ns: &str, name: &str, data: Map<String, Value>) -> bool {
        self.locked(|st| {
            let key = (res, ns.to_string(), name.to_string());
            let Some(old) = st.objects.get(&key).cloned() else {
                return false;
            };
            let mut new = old.clone();
            new["data"] = Value::Object(data);
            if new != old {
                st.write(key, EventType::Modified, new);
            }
            true
        })
    }

    /// TokenRequests answered so far.
    pub fn tokens_issued(&self) -> u64 {
        self.shared.state.lock().tokens_issued
    }

    pub fn pod(&self, ns: &str, name: &str) -> Option<Value> {
        self.shared.state.lock().get(Res::Pods, ns, name).cloned()
    }

    pub fn pods(&self) -> Vec<Value> {
        self.all(Res::Pods)
    }

    fn all(&self, res: Res) -> Vec<Value> {
        self.shared
            .state
            .lock()
            .objects
            .iter()
            .filter(|(k, _)| k.0 == res)
            .map(|(_, v)| v.clone())
            .collect()
    }

    /// Adds an ephemeral container to a pod as `kubectl debug` does through
    /// the `pods/<name>/ephemeralcontainers` subresource, with its rules
    /// (`ephemeral_update`); watchers get a MODIFIED event. False if the
    /// pod does not exist or the container is refused.
    pub fn add_ephemeral_container(&self, ns: &str, name: &str, container: Value) -> bool {
        self.locked(|st| {
            let key = (Res::Pods, ns.to_string(), name.to_string());
            let Some(old) = st.objects.get(&key).cloned() else {
                return false;
            };
            let mut list = old["spec"]["ephemeralContainers"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            list.push(container);
            match ephemeral_update(&old, list) {
                Ok(new) => {
                    st.write(key, EventType::Modified, new);
                    true
                }
                Err(_) => false,
            }
        })
    }

    /// Changes a pod as the admin would with a PUT (a MODIFIED event); false if
    /// it does not exist.
    pub fn update_pod(&self, ns: &str, name: &str, f: impl FnOnce(&mut Value)) -> bool {
        self.locked(|st| {
            let key = (Res::Pods, ns.to_string(), name.to_string());
            let Some(old) = st.objects.get(&key).cloned() else {
                return false;
            };
            let mut new = old.clone();
            f(&mut new);
            for k in ["name", "namespace", "uid", "creationTimestamp"] {
                new["metadata"][k] = old["metadata"][k].clone();
            }
            if new != old {
                st.write(key, EventType::Modified, new);
            }
            true
        })
    }

    /// Deletes a pod as the admin with the HTTP semantics (graceful when bound
    /// and grace > 0); the pod as answered, or None if it does not exist.
    pub fn delete_pod(&self, ns: &str, name: &str, grace: Option<i64>) -> Option<Value> {
        let opts = DeleteOptions {
            grace,
            ..DeleteOptions::default()
        };
        self.locked(|st| delete(st, &Self::admin_ctx(), Res::Pods, ns, name, &opts))
            .ok()
            .and_then(Deleted::object)
    }

    pub fn node(&self, name: &str) -> Option<Value> {
        self.shared.state.lock().get(Res::Nodes, "", name).cloned()
    }

    pub fn nodes(&self) -> Vec<Value> {
        self.all(Res::Nodes)
    }

    /// Deletes a node (as a controller would); false if it did not exist.
    pub fn delete_node(&self, name: &str) -> bool {
        self.locked(|st| {
            delete(
                st,
                &Self::admin_ctx(),
                Res::Nodes,
                "",
                name,
                &DeleteOptions::default(),
            )
            .is_ok()
        })
    }

    /// The node lease `kube-node-lease/<name>`.
    pub fn lease(&self, name: &str) -> Option<Value> {
        self.shared
            .state
            .lock()
            .get(Res::Leases, NODE_LEASE_NAMESPACE, name)
            .cloned()
    }

    pub fn events(&self) -> Vec<Value> {
        self.all(Res::Events)
    }

    /// The current global resourceVersion.
    pub fn resource_version(&self) -> u64 {
        self.shared.state.lock().rv
    }

    // -- requests ---------------------------------------------------------------

    pub fn requests(&self) -> Vec<RecordedRequest> {
        self.shared.state.lock().requests.clone()
    }

    /// Requests with this HTTP method (case-insensitive) whose path starts with `path_prefix`.
    pub fn count(&self, verb: &str, path_prefix: &str) -> usize {
        self.shared
            .state
            .lock()
            .requests
            .iter()
            .filter(|r| r.verb.eq_ignore_ascii_case(verb) && r.path.starts_with(path_prefix))
            .count()
    }

    pub fn clear_requests(&self) {
        self.shared.state.lock().requests.clear();
    }

    // -- faults ---------------------------------------------------------------

    /// When down, the listener is closed (connections are refused) and open
    /// connections are cut; up again listens on the same port.
    pub fn set_down(&self, down: bool) {
        let mut acceptor = self.acceptor.lock();
        if down {
            if let Some(a) = acceptor.take() {
                stop_acceptor(a, self.addr);
            }
            self.shared.cut_all();
        } else if acceptor.is_none() {
            let deadline = Instant::now() + Duration::from_secs(5);
            let listener = loop {
                match TcpListener::bind(self.addr) {
                    Ok(l) => break l,
                    Err(e) if Instant::now() < deadline => {
                        let _ = e;
                        std::thread::sleep(POLL);
                    }
                    Err(e) => panic!("rebind {}: {e}", self.addr),
                }
            };
            *acceptor = Some(start_acceptor(&self.shared, listener));
        }
    }

    /// A black hole (an apiserver gone silent behind a partition): new
    /// connections are accepted but nothing is answered on them, not even a
    /// TLS handshake; a request read on any connection gets no answer; open
    /// watches send nothing more, not bookmarks nor the end of the stream.
    /// Turning it off serves new connections and connections that were idle
    /// throughout, but every connection that had a request or a watch in the
    /// hole stays silent for good, as if the server had forgotten it (a
    /// restart or a lost NAT entry behind the partition), until the client
    /// closes it: only a client timeout gets out of it. Requests read in the
    /// hole are recorded with status 0.
    pub fn set_black_hole(&self, on: bool) {
        self.shared.black_hole.store(on, Ordering::SeqCst);
        self.shared.changed.notify_all();
    }

    /// Cuts every open watch connection mid-stream, without the terminating chunk.
    pub fn drop_watches(&self) {
        self.shared.watch_gen.fetch_add(1, Ordering::SeqCst);
        self.shared.changed.notify_all();
    }

    /// Writes `raw` as it is (no newline added) into every watch of
    /// `resource` ("pods", "nodes", "leases", ...) open now, after the events
    /// it has already sent; returns how many watches there were. Watches
    /// opened later do not get it.
    pub fn inject_watch(&self, resource: &str, raw: &[u8]) -> usize {
        let res = res_named(resource);
        let open = self.open_watches(resource);
        let raw = Arc::new(raw.to_vec());
        // Under the state lock, as watches take injections and events
        // together: bytes injected before a write are sent before its event.
        let _guard = self.shared.state.lock();
        let id = self.shared.next_injection.fetch_add(1, Ordering::SeqCst);
        self.shared.injected.lock().push((id, res, raw));
        self.shared.changed.notify_all();
        open
    }

    /// How many watches of `resource` are streaming now.
    pub fn open_watches(&self, resource: &str) -> usize {
        let res = res_named(resource);
        self.shared
            .open_watches
            .lock()
            .get(&res)
            .copied()
            .unwrap_or(0)
    }

    /// What the node lifecycle controller writes when a node's heartbeats
    /// stopped for its grace period: the Ready and pressure conditions
    /// become Unknown ("Kubelet stopped posting node status."), their
    /// heartbeat times kept. Only the conditions (the controller also
    /// taints the node); false if the Node does not exist.
    pub fn mark_node_unknown(&self, name: &str) -> bool {
        self.locked(|st| {
            let key = (Res::Nodes, String::new(), name.to_string());
            let Some(mut node) = st.objects.get(&key).cloned() else {
                return false;
            };
            let now = now_secs();
            let kinds = ["Ready", "MemoryPressure", "DiskPressure", "PIDPressure"];
            let conditions = obj_mut_list(&mut node["status"], "conditions");
            for kind in kinds {
                let at = conditions.iter().position(|c| c["type"] == kind);
                let c = match at {
                    Some(i) => &mut conditions[i],
                    None => {
                        conditions.push(json!({"type": kind, "lastHeartbeatTime": now}));
                        conditions.last_mut().expect("just pushed")
                    }
                };
                if c["status"] != "Unknown" {
                    c["lastTransitionTime"] = json!(now);
                }
                c["status"] = json!("Unknown");
                c["reason"] = json!("NodeStatusUnknown");
                c["message"] = json!("Kubelet stopped posting node status.");
            }
            st.write(key, EventType::Modified, node);
            true
        })
    }

    /// Forgets all history: watches from older RVs get the 410 ERROR event and
    /// exact lists at older RVs get 410.
    pub fn compact(&self) {
        self.locked(|st| st.compact());
    }

    /// The next `times` requests with this HTTP method (or "*") whose path
    /// contains `path_contains` are answered with a Status of `code`.
    pub fn fail_next(
        &self,
        verb: &str,
        path_contains: &str,
        code: u16,
        reason: &str,
        message: &str,
        times: usize,
    ) {
        self.shared.state.lock().faults.push(Fault {
            verb: verb.to_string(),
            path_contains: path_contains.to_string(),
            status: Status::new(code, reason, message),
            remaining: times,
        });
    }

    /// How often open watches that may carry bookmarks get one (the real
    /// server: about 60 s); one more is sent shortly before the watch's deadline.
    pub fn set_bookmark_interval(&self, every: Duration) {
        self.shared.state.lock().bookmark_interval = every;
    }
}

impl Drop for FakeApiServer {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        self.shared.changed.notify_all();
        if let Some(a) = self.acceptor.lock().take() {
            stop_acceptor(a, self.addr);
        }
        self.shared.cut_all();
        let threads = std::mem::take(&mut *self.shared.threads.lock());
        drop(threads);
    }
}

impl Shared {
    fn cut_all(&self) {
        for (_, s) in self.conns.lock().iter() {
            let _ = s.shutdown(Shutdown::Both);
        }
    }
}

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("run the openssl CLI");
    assert!(
        out.status.success(),
        "openssl {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn issue_cert(dir: &Path, stem: &str, subject: &str, ext: &str) {
    let key = format!("{stem}.key");
    let csr = format!("{stem}.csr");
    let crt = format!("{stem}.crt");
    openssl(
        dir,
        &[
            "req",
            "-new",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-keyout",
            &key,
            "-out",
            &csr,
            "-subj",
            subject,
        ],
    );
    let serial = format!("{}", rand_u64() >> 2);
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            &csr,
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-set_serial",
            &serial,
            "-out",
            &crt,
            "-days",
            "2",
            "-extfile",
            ext,
        ],
    );
}

fn start_acceptor(shared: &Arc<Shared>, listener: TcpListener) -> Acceptor {
    let quit = Arc::new(AtomicBool::new(false));
    let (s, q) = (shared.clone(), quit.clone());
    let thread = spawn_with_stack("fake-apiserver-accept", 128 * 1024, move || {
        for conn in listener.incoming() {
            if q.load(Ordering::SeqCst) || s.stop.load(Ordering::SeqCst) {
                break;
            }
            if let Ok(stream) = conn {
                spawn_conn(&s, stream);
            }
        }
    })
    .expect("start the accept thread");
    Acceptor { quit, thread }
}

fn stop_acceptor(a: Acceptor, addr: SocketAddr) {
    a.quit.store(true, Ordering::SeqCst);
    let _ = TcpStream::connect_timeout(&addr, Duration::from_secs(1));
    drop(a.thread);
}

fn spawn_conn(shared: &Arc<Shared>, stream: TcpStream) {
    let id = shared.next_conn.fetch_add(1, Ordering::SeqCst);
    if let Ok(clone) = stream.try_clone() {
        shared.conns.lock().insert(id, clone);
    }
    let s = shared.clone();
    let spawned = spawn_with_stack("fake-apiserver-conn", CONN_STACK, move || {
        serve_conn(&s, stream);
        s.conns.lock().remove(&id);
    });
    match spawned {
        Ok(handle) => {
            let mut threads = shared.threads.lock();
            threads.retain(|t| !t.is_finished());
            threads.push(handle);
        }
        Err(_) => {
            shared.conns.lock().remove(&id);
        }
    }
}

/// Keeps a connection that is in the black hole: nothing is ever written on
/// it; what the client sends is read and dropped, so that its closing is
/// seen and the thread ends. Returns when the client closed the connection
/// or the server stops.
fn hold_silent(shared: &Shared, tcp: &TcpStream) {
    let _ = tcp.set_read_timeout(Some(POLL * 5));
    let mut buf = [0u8; 4096];
    let mut r = tcp;
    while !shared.stop.load(Ordering::SeqCst) {
        match r.read(&mut buf) {
            Ok(0) => return,
            Ok(_) => {}
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => return,
        }
    }
}

fn serve_conn(shared: &Arc<Shared>, tcp: TcpStream) {
    if shared.tls.is_some() && shared.black_hole.load(Ordering::SeqCst) {
        // Not even the TLS handshake is answered.
        hold_silent(shared, &tcp);
        let _ = tcp.shutdown(Shutdown::Both);
        return;
    }
    let conn = match &shared.tls {
        None => Conn::Plain(tcp),
        Some(cfg) => match rustls::ServerConnection::new(cfg.clone()) {
            Ok(c) => Conn::Tls(Box::new(rustls::StreamOwned::new(c, tcp))),
            Err(_) => return,
        },
    };
    let mut reader = BufReader::new(conn);
    loop {
        if shared.stop.load(Ordering::SeqCst) {
            break;
        }
        let req = match read_request(&mut reader) {
            Ok(Some(r)) => r,
            _ => break,
        };
        if shared.black_hole.load(Ordering::SeqCst) {
            record(&mut shared.state.lock(), &req, "", 0);
            // Never answered, even after the black hole ends.
            hold_silent(shared, reader.get_ref().tcp());
            break;
        }
        if !handle(shared, &mut reader, req) {
            break;
        }
    }
    let _ = reader.get_ref().tcp().shutdown(Shutdown::Both);
}

fn record(st: &mut State, req: &Request, user: &str, status: u16) {
    st.requests.push(RecordedRequest {
        verb: req.method.clone(),
        path: req.path.clone(),
        query: req.raw_query.clone(),
        user: user.to_string(),
        status,
        body: String::from_utf8_lossy(&req.body).into_owned(),
        at: Instant::now(),
    });
}

/// Answers one request; false when the connection must close.
fn handle(shared: &Arc<Shared>, reader: &mut BufReader<Conn>, req: Request) -> bool {
    let cert_user = reader.get_ref().cert_user();
    let mut st = shared.state.lock();
    let (user, outcome) = dispatch(shared, &mut st, &req, cert_user);
    let name = user.as_ref().map(|u| u.name.clone()).unwrap_or_default();
    let code = match &outcome {
        Outcome::Reply(resp) => resp.code,
        Outcome::Watch(_) => 200,
    };
    record(&mut st, &req, &name, code);
    drop(st);
    shared.changed.notify_all();
    match outcome {
        Outcome::Reply(mut resp) => {
            if let Some(u) = &user {
                resp.flow = Some(u.flow());
            }
            write_response(reader.get_mut(), &resp).is_ok() && !req.close
        }
        Outcome::Watch(plan) => run_watch(shared, reader.get_mut(), plan) && !req.close,
    }
}

enum Outcome {
    Reply(Resp),
    Watch(WatchPlan),
}

struct Ctx {
    user: User,
    manager: String,
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct Target {
    res: Res,
    ns: String,
    name: Option<String>,
    sub: Option<String>,
}

fn parse_target(path: &str) -> Option<Target> {
    let segs: Vec<&str> = path.trim_end_matches('/').split('/').skip(1).collect();
    let rest: &[&str] = match segs.as_slice() {
        ["api", "v1", rest @ ..] => rest,
        ["apis", "coordination.k8s.io", "v1", rest @ ..] => rest,
        _ => return None,
    };
    let core = segs[0] == "api";
    let (ns, rest) = match rest {
        ["namespaces", ns, rest @ ..] if !rest.is_empty() => (ns.to_string(), rest),
        _ => (String::new(), rest),
    };
    let res = match (core, rest.first()?) {
        (true, &"pods") => Res::Pods,
        (true, &"nodes") => Res::Nodes,
        (true, &"events") => Res::Events,
        (true, &"secrets") => Res::Secrets,
        (true, &"configmaps") => Res::ConfigMaps,
        (true, &"serviceaccounts") => Res::ServiceAccounts,
        (true, &"services") => Res::Services,
        (false, &"leases") => Res::Leases,
        _ => return None,
    };
    if res == Res::Nodes && !ns.is_empty() {
        return None;
    }
    let name = rest.get(1).map(|s| percent_decode(s));
    let sub = rest.get(2).map(|s| s.to_string());
    if rest.len() > 3 {
        return None;
    }
    match (res, sub.as_deref()) {
        (Res::ServiceAccounts, Some("token")) => {}
        (Res::ServiceAccounts, _) => return None,
        (_, None)
        | (Res::Pods | Res::Nodes, Some("status"))
        | (Res::Pods, Some("ephemeralcontainers")) => {}
        _ => return None,
    }
    Some(Target { res, ns, name, sub })
}

fn authenticate(st: &State, req: &Request, cert_user: Option<User>) -> Result<User, Resp> {
    if let Some(auth) = req.header("authorization") {
        let token = auth.strip_prefix("Bearer ").map(str::trim).unwrap_or("");
        return match st.tokens.get(token) {
            Some(u) => Ok(u.clone()),
            None => Err(Resp::status(&Status::new(
                401,
                "Unauthorized",
                "Unauthorized",
            ))),
        };
    }
    Ok(cert_user.unwrap_or_else(User::anonymous))
}

fn verb_of(req: &Request, t: &Target) -> &'static str {
    let watch = matches!(req.param("watch"), Some("true") | Some("1"));
    match (req.method.as_str(), t.name.is_some()) {
        ("GET", _) if watch => "watch",
        ("GET", true) => "get",
        ("GET", false) => "list",
        ("POST", _) => "create",
        ("PUT", _) => "update",
        ("PATCH", _) => "patch",
        ("DELETE", true) => "delete",
        ("DELETE", false) => "deletecollection",
        _ => "unknown",
    }
}

fn is_public_path(path: &str) -> bool {
    matches!(
        path,
        "/version" | "/version/" | "/healthz" | "/livez" | "/readyz"
    )
}

fn authz_forbidden(user: &User, verb: &str, t: &Target, reason: &str) -> Status {
    let mut resource = t.res.resource().to_string();
    if let Some(sub) = &t.sub {
        resource = format!("{resource}/{sub}");
    }
    let mut msg = if t.ns.is_empty() {
        format!(
            "User {} cannot {verb} resource {} in API group {} at the cluster scope",
            q(&user.name),
            q(&resource),
            q(t.res.group())
        )
    } else {
        format!(
            "User {} cannot {verb} resource {} in API group {} in the namespace {}",
            q(&user.name),
            q(&resource),
            q(t.res.group()),
            q(&t.ns)
        )
    };
    if !reason.is_empty() {
        msg = format!("{msg}: {reason}");
    }
    let name = t.name.clone().unwrap_or_default();
    let mut s = if name.is_empty() {
        Status::new(
            403,
            "Forbidden",
            format!("{} is forbidden: {msg}", t.res.qualified()),
        )
    } else {
        Status::new(
            403,
            "Forbidden",
            format!("{} {} is forbidden: {msg}", t.res.qualified(), q(&name)),
        )
    }
    .with_details(details(t.res, &name));
    s.nosniff = true;
    s
}

/// The Node authorizer (with the 1.20 system:node rules) and RBAC for
/// everyone else (who, without bindings, may only read the public paths).
fn authorize(st: &State, user: &User, verb: &str, t: &Target) -> Result<(), Status> {
    if user.is_admin() {
        return Ok(());
    }
    let Some(node) = user.node_name() else {
        return Err(authz_forbidden(user, verb, t, ""));
    };
    let allowed: &[&str] = match (t.res, t.sub.as_deref()) {
        (Res::Secrets | Res::ConfigMaps, _) => {
            // The Node authorizer's graph: only objects that a pod bound
            // to this node references, and only by name.
            if !["get", "list", "watch"].contains(&verb) {
                return Err(authz_forbidden(
                    user,
                    verb,
                    t,
                    "can only read resources of this type",
                ));
            }
            let Some(name) = t.name.as_deref() else {
                return Err(authz_forbidden(user, verb, t, "No Object name found"));
            };
            let kind = if t.res == Res::Secrets {
                "secret"
            } else {
                "configmap"
            };
            let related = st.pods_on(node).any(|p| {
                sv(p, &["metadata", "namespace"]) == t.ns
                    && pod_refs(p, kind).iter().any(|n| n == name)
            });
            if !related {
                return Err(authz_forbidden(
                    user,
                    verb,
                    t,
                    &format!(
                        "no relationship found between node {} and this object",
                        sq(node)
                    ),
                ));
            }
            return Ok(());
        }
        (Res::ServiceAccounts, _) => {
            if verb != "create" || t.sub.as_deref() != Some("token") {
                return Err(authz_forbidden(
                    user,
                    verb,
                    t,
                    "can only create tokens for individual service accounts",
                ));
            }
            let Some(name) = t.name.as_deref() else {
                return Err(authz_forbidden(user, verb, t, "No Object name found"));
            };
            let related = st.pods_on(node).any(|p| {
                sv(p, &["metadata", "namespace"]) == t.ns
                    && sv(p, &["spec", "serviceAccountName"]) == name
            });
            if !related {
                return Err(authz_forbidden(
                    user,
                    verb,
                    t,
                    &format!(
                        "no relationship found between node {} and this object",
                        sq(node)
                    ),
                ));
            }
            return Ok(());
        }
        (Res::Nodes, None) => &["get", "list", "watch", "create", "update", "patch"],
        (Res::Nodes, Some(_)) => &["get", "update", "patch"],
        (Res::Pods, None) => &["get", "list", "watch", "create", "delete"],
        (Res::Pods, Some(_)) => &["get", "update", "patch"],
        (Res::Events, _) => &["create", "update", "patch"],
        // system:node reads every Service, for pods' service variables.
        (Res::Services, _) => &["get", "list", "watch"],
        (Res::Leases, _) => {
            if !["get", "create", "update", "patch", "delete"].contains(&verb) {
                return Err(authz_forbidden(
                    user,
                    verb,
                    t,
                    "can only get, create, update, patch, or delete a node lease",
                ));
            }
            if t.ns != NODE_LEASE_NAMESPACE {
                return Err(authz_forbidden(
                    user,
                    verb,
                    t,
                    &format!(
                        "can only access leases in the {} system namespace",
                        q(NODE_LEASE_NAMESPACE)
                    ),
                ));
            }
            if verb != "create" && t.name.as_deref() != Some(node) {
                return Err(authz_forbidden(
                    user,
                    verb,
                    t,
                    "can only access node lease with the same name as the requesting node",
                ));
            }
            return Ok(());
        }
    };
    if allowed.contains(&verb) {
        Ok(())
    } else {
        Err(authz_forbidden(user, verb, t, ""))
    }
}

fn take_fault(st: &mut State, req: &Request) -> Option<Status> {
    let i = st.faults.iter().position(|f| {
        f.remaining > 0
            && (f.verb == "*" || f.verb.eq_ignore_ascii_case(&req.method))
            && req.path.contains(&f.path_contains)
    })?;
    let f = &mut st.faults[i];
    f.remaining -= 1;
    let s = f.status.clone();
    if f.remaining == 0 {
        st.faults.remove(i);
    }
    Some(s)
}

const VERSION_BODY: &str = "{\n  \"major\": \"1\",\n  \"minor\": \"20\",\n  \"gitVersion\": \"v1.20.2\",\n  \"gitCommit\": \"faecb196815e248d3ecfb03c680a4507229c2a56\",\n  \"gitTreeState\": \"archive\",\n  \"buildDate\": \"2026-11-21T23:52:21Z\",\n  \"goVersion\": \"go1.19.8\",\n  \"compiler\": \"gc\",\n  \"platform\": \"linux/amd64\"\n}";

const HEALTH_CHECKS: &[&str] = &[
    "ping",
    "log",
    "etcd",
    "poststarthook/start-kube-apiserver-admission-initializer",
    "poststarthook/generic-apiserver-start-informers",
    "poststarthook/priority-and-fairness-config-consumer",
    "poststarthook/priority-and-fairness-filter",
    "poststarthook/start-apiextensions-informers",
    "poststarthook/start-apiextensions-controllers",
    "poststarthook/crd-informer-synced",
    "poststarthook/bootstrap-controller",
    "poststarthook/rbac/bootstrap-roles",
    "poststarthook/scheduling/bootstrap-system-priority-classes",
    "poststarthook/priority-and-fairness-config-producer",
    "poststarthook/start-cluster-authentication-info-controller",
    "poststarthook/start-kube-aggregator-informers",
    "poststarthook/apiservice-registration-controller",
    "poststarthook/apiservice-status-available-controller",
    "poststarthook/kube-apiserver-autoregistration",
    "autoregister-completion",
    "poststarthook/apiservice-openapi-controller",
];

/// Acts on one request under the state lock, which the caller holds until
/// the request is recorded: a test that sees the request's effect also
/// sees it in the request log.
fn dispatch(
    shared: &Arc<Shared>,
    st: &mut parking_lot::MutexGuard<'_, State>,
    req: &Request,
    cert_user: Option<User>,
) -> (Option<User>, Outcome) {
    let user = match authenticate(st, req, cert_user) {
        Ok(u) => u,
        Err(resp) => return (None, Outcome::Reply(resp)),
    };
    let u = user.clone();
    let reply = move |r: Resp| (Some(u.clone()), Outcome::Reply(r));
    if let Some(s) = take_fault(st, req) {
        return reply(Resp::status(&s));
    }
    if let Some(review) = review_kind(&req.path) {
        return reply(create_review(st, &user, req, review).unwrap_or_else(|s| Resp::status(&s)));
    }
    let Some(t) = parse_target(&req.path) else {
        // Non-resource paths.
        if !is_public_path(&req.path) && !user.is_admin() {
            let mut s = Status::new(
                403,
                "Forbidden",
                format!(
                    "forbidden: User {} cannot {} path {}",
                    q(&user.name),
                    req.method.to_ascii_lowercase(),
                    q(&req.path)
                ),
            )
            .with_details(Details::default());
            s.nosniff = true;
            return reply(Resp::status(&s));
        }
        return reply(match req.path.as_str() {
            "/version" | "/version/" => Resp::json(200, VERSION_BODY.to_string()),
            "/healthz" | "/livez" | "/readyz" if req.param("verbose").is_some() => {
                let mut body: String = HEALTH_CHECKS
                    .iter()
                    .map(|c| format!("[+]{c} ok\n"))
                    .collect();
                body += &format!("{} check passed\n", req.path.trim_start_matches('/'));
                Resp::text(&body)
            }
            "/healthz" | "/livez" | "/readyz" => Resp::text("ok"),
            _ => Resp::status(
                &Status::new(
                    404,
                    "NotFound",
                    "the server could not find the requested resource",
                )
                .with_details(Details::default()),
            ),
        });
    };
    let verb = verb_of(req, &t);
    // As the apiserver's request info: a list or watch whose field
    // selector requires one metadata.name is authorized as a request for
    // that name (what lets a node watch a Secret it may read).
    let by_name = match (verb, &t.name) {
        ("list" | "watch", None) => req
            .param("fieldSelector")
            .unwrap_or("")
            .split(',')
            .find_map(|term| {
                term.strip_prefix("metadata.name==")
                    .or_else(|| term.strip_prefix("metadata.name="))
            })
            .map(|n| Target {
                name: Some(n.to_string()),
                ..t.clone()
            }),
        _ => None,
    };
    if let Err(s) = authorize(st, &user, verb, by_name.as_ref().unwrap_or(&t)) {
        return reply(Resp::status(&s));
    }
    let ctx = Ctx {
        user: user.clone(),
        manager: req.manager(),
    };
    if t.sub.as_deref() == Some("ephemeralcontainers") {
        return reply(
            ephemeral_containers(st, verb, &t, req)
                .map(|v| Resp::object(200, &v))
                .unwrap_or_else(|s| Resp::status(&s)),
        );
    }
    let result = match verb {
        "watch" => match watch_plan(st, req, &t) {
            Ok(plan) => return (Some(user), Outcome::Watch(plan)),
            Err(s) => Err(s),
        },
        "list" => {
            let r = list(st, shared, req, &t);
            return reply(r.unwrap_or_else(|s| Resp::status(&s)));
        }
        "get" => get(st, &t).map(|v| Resp::object(200, &v)),
        "create" => parse_body(req).and_then(|body| {
            if t.res == Res::ServiceAccounts {
                return create_token(st, &ctx, &t, &body).map(|v| Resp::object(201, &v));
            }
            if t.name.is_some() {
                return Err(Status::new(
                    405,
                    "MethodNotAllowed",
                    "the server does not allow this method on the requested resource",
                ));
            }
            create(st, &ctx, t.res, &t.ns, body).map(|v| Resp::object(201, &v))
        }),
        "update" => parse_body(req)
            .and_then(|body| update(st, &ctx, &t, body).map(|v| Resp::object(200, &v))),
        "patch" => patch(st, &ctx, &t, req).map(|v| Resp::object(200, &v)),
        "delete" => DeleteOptions::parse(req).and_then(|opts| {
            let name = t.name.clone().unwrap_or_default();
            delete(st, &ctx, t.res, &t.ns, &name, &opts).map(Deleted::into_resp)
        }),
        _ => Err(Status::new(
            405,
            "MethodNotAllowed",
            "the server does not allow this method on the requested resource",
        )),
    };
    reply(result.unwrap_or_else(|s| Resp::status(&s)))
}

fn parse_body(req: &Request) -> Result<Value, Status> {
    let v: Value = serde_json::from_slice(&req.body)
        .map_err(|e| bad_request(format!("the body of the request could not be decoded: {e}")))?;
    if !v.is_object() {
        return Err(bad_request("the body of the request is not a JSON object"));
    }
    Ok(v)
}

// ---------------------------------------------------------------------------
// Verbs

/// `pods/<name>/ephemeralcontainers` as v1.20 serves it (what `kubectl
/// debug` uses): GET, PUT and PATCH of an `EphemeralContainers` object, the
/// pod's metadata and its `spec.ephemeralContainers`. Only that list
/// changes, and only by additions (`ephemeral_update`).
fn ephemeral_containers(
    st: &mut State,
    verb: &str,
    t: &Target,
    req: &Request,
) -> Result<Value, Status> {
    let name = t.name.clone().unwrap_or_default();
    let pod = get(st, t)?;
    let view = |pod: &Value| {
        json!({
            "kind": "EphemeralContainers",
            "apiVersion": "v1",
            "metadata": pod["metadata"].clone(),
            "ephemeralContainers": pod["spec"]
                .get("ephemeralContainers")
                .cloned()
                .unwrap_or_else(|| json!([])),
        })
    };
    let old = view(&pod);
    let new = match verb {
        "get" => return Ok(old),
        "update" => parse_body(req)?,
        "patch" => {
            let patch: Value = serde_json::from_slice(&req.body).map_err(|e| {
                bad_request(format!("the body of the request could not be decoded: {e}"))
            })?;
            match req.header("content-type").unwrap_or("").split(';').next() {
                Some("application/strategic-merge-patch+json") => {
                    smp(&old, &patch).map_err(bad_request)?
                }
                Some("application/merge-patch+json") => merge_patch(&old, &patch),
                _ => {
                    return Err(Status::new(
                        415,
                        "UnsupportedMediaType",
                        "unsupported patch type",
                    ))
                }
            }
        }
        _ => {
            return Err(Status::new(
                405,
                "MethodNotAllowed",
                "the server does not allow this method on the requested resource",
            ))
        }
    };
    let sent_rv = sv(&new, &["metadata", "resourceVersion"]);
    if !sent_rv.is_empty() && sent_rv != sv(&pod, &["metadata", "resourceVersion"]) {
        return Err(conflict_modified(Res::Pods, &name));
    }
    let list = new["ephemeralContainers"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let updated =
        ephemeral_update(&pod, list).map_err(|causes| invalid(Res::Pods, &name, causes))?;
    if updated == pod {
        return Ok(old);
    }
    let key = (Res::Pods, t.ns.clone(), name);
    Ok(view(&st.write(key, EventType::Modified, updated)))
}

/// The pod with `list` as its ephemeral containers, or the validation
/// causes (upstream's ValidateEphemeralContainersUpdate): each one that was
/// there stays, unchanged; a new one needs a name unique among all the
/// pod's containers and an image.
fn ephemeral_update(pod: &Value, list: Vec<Value>) -> Result<Value, Vec<(String, String, String)>> {
    let old = pod["spec"]["ephemeralContainers"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let mut causes = Vec::new();
    let mut cause = |field: String, reason: &str, message: String| {
        causes.push((reason.to_string(), message, field))
    };
    for (i, o) in old.iter().enumerate() {
        match list.iter().find(|n| n["name"] == o["name"]) {
            None => cause(
                format!("ephemeralContainers[{i}]"),
                "FieldValueForbidden",
                "Forbidden: existing ephemeral containers may not be removed".into(),
            ),
            Some(n) if n != o => cause(
                format!("ephemeralContainers[{i}]"),
                "FieldValueForbidden",
                "Forbidden: existing ephemeral containers may not be changed".into(),
            ),
            Some(_) => {}
        }
    }
    let mut names: Vec<&str> = ["initContainers", "containers"]
        .iter()
        .flat_map(|k| pod["spec"][k].as_array().into_iter().flatten())
        .map(|c| sv(c, &["name"]))
        .collect();
    for (i, c) in list.iter().enumerate() {
        let n = sv(c, &["name"]);
        if n.is_empty() {
            cause(
                format!("ephemeralContainers[{i}].name"),
                "FieldValueRequired",
                "Required value".into(),
            );
        } else if names.contains(&n) {
            cause(
                format!("ephemeralContainers[{i}].name"),
                "FieldValueDuplicate",
                format!("Duplicate value: {}", q(n)),
            );
        }
        names.push(n);
        if sv(c, &["image"]).is_empty() {
            cause(
                format!("ephemeralContainers[{i}].image"),
                "FieldValueRequired",
                "Required value".into(),
            );
        }
    }
    if !causes.is_empty() {
        return Err(causes);
    }
    let mut new = pod.clone();
    obj_mut(&mut new, "spec").insert("ephemeralContainers".into(), Value::Array(list));
    Ok(new)
}

fn get(st: &State, t: &Target) -> Result<Value, Status> {
    let name = t.name.as_deref().unwrap_or("");
    st.get(t.res, &t.ns, name)
        .cloned()
        .ok_or_else(|| not_found(t.res, name))
}

fn list_json(res: Res, rv: u64, cont: Option<(String, Option<usize>)>, items: &[Value]) -> String {
    let mut meta = format!(r#""resourceVersion":"{rv}""#);
    if let Some((token, remaining)) = cont {
        meta += &format!(r#","continue":{}"#, js(&token));
        if let Some(n) = remaining {
            meta += &format!(r#","remainingItemCount":{n}"#);
        }
    }
    let items: Vec<String> = items.iter().map(|i| encode(&strip_kind(i))).collect();
    format!(
        r#"{{"kind":"{}List","apiVersion":"{}","metadata":{{{meta}}},"items":[{}]}}"#,
        res.kind(),
        res.api_version(),
        items.join(",")
    ) + "\n"
}

fn continue_token(rv: u64, after: &Key) -> String {
    let raw =
        json!({"v": "meta.k8s.io/v1", "rv": rv, "start": format!("{}/{}\u{0}", after.1, after.2)});
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(raw.to_string())
}

fn parse_continue(token: &str) -> Option<(u64, String, String)> {
    let raw = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(token)
        .ok()?;
    let v: Value = serde_json::from_slice(&raw).ok()?;
    let rv = v["rv"].as_u64()?;
    let start = v["start"].as_str()?.trim_end_matches('\u{0}');
    let (ns, name) = start.split_once('/')?;
    Some((rv, ns.to_string(), name.to_string()))
}

fn list_options_invalid(message: &str) -> Status {
    Status::new(
        422,
        "Invalid",
        format!(
            "ListOptions.meta.k8s.io \"\" is invalid: resourceVersionMatch: Forbidden: {message}"
        ),
    )
    .with_details(Details {
        group: "meta.k8s.io".into(),
        kind: "ListOptions".into(),
        causes: vec![(
            "FieldValueForbidden".into(),
            format!("Forbidden: {message}"),
            "resourceVersionMatch".into(),
        )],
        ..Details::default()
    })
}

fn too_large(rv: u64, current: u64, retry: u64) -> Status {
    let mut s = Status::new(
        504,
        "Timeout",
        format!("Timeout: Too large resource version: {rv}, current: {current}"),
    )
    .with_details(Details {
        causes: vec![(
            "ResourceVersionTooLarge".into(),
            "Too large resource version".into(),
            String::new(),
        )],
        retry_after_seconds: retry,
        ..Details::default()
    });
    if retry > 0 {
        s.retry_after = Some(retry);
    }
    s
}

/// What a list is served from: the objects, the list's RV, whether it is
/// paginated, and the (namespace, name) a continued list starts after.
type ListSource = (BTreeMap<Key, Value>, u64, bool, Option<(String, String)>);

fn list(
    st: &mut parking_lot::MutexGuard<'_, State>,
    shared: &Shared,
    req: &Request,
    t: &Target,
) -> Result<Resp, Status> {
    let ns = (!t.ns.is_empty()).then_some(t.ns.as_str());
    let filter = Filter::parse(
        t.res,
        ns,
        None,
        req.param("fieldSelector").unwrap_or(""),
        req.param("labelSelector").unwrap_or(""),
    )?;
    let rv_param = req.param("resourceVersion").unwrap_or("");
    let rv_match = req.param("resourceVersionMatch").unwrap_or("");
    let limit: usize = req.param("limit").and_then(|l| l.parse().ok()).unwrap_or(0);
    let cont = req.param("continue").unwrap_or("");
    if !rv_match.is_empty() && rv_param.is_empty() {
        return Err(list_options_invalid(
            "resourceVersionMatch is forbidden unless resourceVersion is provided",
        ));
    }
    if rv_match == "Exact" && rv_param == "0" {
        return Err(list_options_invalid(
            "resourceVersionMatch \"exact\" is forbidden for resourceVersion \"0\"",
        ));
    }
    let rv: Option<u64> = if rv_param.is_empty() {
        None
    } else {
        Some(rv_param.parse().map_err(|_| {
            bad_request(format!(
                "resourceVersion: Invalid value: {}: must be a number",
                q(rv_param)
            ))
        })?)
    };
    // (objects, list RV, paginate, start after)
    let (objects, list_rv, paginate, after): ListSource = if !cont.is_empty() {
        let Some((crv, cns, cname)) = parse_continue(cont) else {
            return Err(bad_request("continue key is not valid: incorrect encoded start resourceVersion (version meta.k8s.io/v1)"));
        };
        if crv < st.compacted {
            return Err(expired("The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter."));
        }
        (st.objects_at(crv), crv, true, Some((cns, cname)))
    } else {
        match rv {
            None => (st.objects.clone(), st.rv, limit > 0, None),
            Some(0) => (st.objects.clone(), st.type_rv(t.res), false, None),
            Some(n) if rv_match == "Exact" || (limit > 0 && rv_match.is_empty()) => {
                if n > st.rv {
                    return Err(Status::new(
                        500,
                        "",
                        "etcdserver: mvcc: required revision is a future revision",
                    ));
                }
                if n < st.compacted {
                    return Err(expired(
                        "The resourceVersion for the provided list is too old.",
                    ));
                }
                (st.objects_at(n), n, limit > 0, None)
            }
            Some(n) if limit > 0 => {
                // NotOlderThan, from etcd.
                if n > st.rv {
                    return Err(too_large(n, st.rv, 0));
                }
                (st.objects.clone(), st.rv, true, None)
            }
            Some(n) => {
                // From the watch cache: wait for it to catch up.
                let deadline = Instant::now() + TOO_LARGE_RV_WAIT;
                while st.type_rv(t.res) < n {
                    if Instant::now() >= deadline || shared.stop.load(Ordering::SeqCst) {
                        let cur = st.type_rv(t.res);
                        return Err(too_large(n, cur, 1));
                    }
                    shared.changed.wait_for(st, POLL);
                }
                (st.objects.clone(), st.type_rv(t.res), false, None)
            }
        }
    };
    let mut items: Vec<(&Key, &Value)> = objects
        .iter()
        .filter(|(k, v)| k.0 == t.res && filter.matches(v))
        .filter(|(k, _)| match &after {
            Some((ans, aname)) => (&k.1, &k.2) > (ans, aname),
            None => true,
        })
        .collect();
    let mut cont_out = None;
    if paginate && limit > 0 && items.len() > limit {
        let remaining = items.len() - limit;
        items.truncate(limit);
        let last = items[limit - 1].0;
        cont_out = Some((
            continue_token(list_rv, last),
            (!filter.is_filtered()).then_some(remaining),
        ));
    }
    let values: Vec<Value> = items.into_iter().map(|(_, v)| v.clone()).collect();
    Ok(Resp::json(
        200,
        list_json(t.res, list_rv, cont_out, &values),
    ))
}

fn finish_metadata(obj: &mut Value, res: Res) {
    let m = obj.as_object_mut().expect("objects are JSON objects");
    m.insert("kind".into(), json!(res.kind()));
    m.insert("apiVersion".into(), json!(res.api_version()));
}

fn create(
    st: &mut State,
    ctx: &Ctx,
    res: Res,
    path_ns: &str,
    body: Value,
) -> Result<Value, Status> {
    let mut obj = body;
    let sent = obj.clone();
    {
        let meta = obj_mut(&mut obj, "metadata");
        for k in [
            "uid",
            "resourceVersion",
            "selfLink",
            "managedFields",
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
            "generation",
        ] {
            meta.remove(k);
        }
        if res.namespaced() {
            let ns = meta
                .get("namespace")
                .and_then(|v| v.as_str())
                .unwrap_or("")
                .to_string();
            if ns.is_empty() {
                meta.insert("namespace".into(), json!(path_ns));
            } else if ns != path_ns {
                return Err(bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request",
                ));
            }
        } else {
            meta.remove("namespace");
        }
        let name = meta
            .get("name")
            .and_then(|v| v.as_str())
            .unwrap_or("")
            .to_string();
        if name.is_empty() {
            let generate = meta
                .get("generateName")
                .and_then(|v| v.as_str())
                .unwrap_or("")
                .to_string();
            if generate.is_empty() {
                return Err(invalid(
                    res,
                    "",
                    vec![(
                        "FieldValueRequired".into(),
                        "Required value: name or generateName is required".into(),
                        "metadata.name".into(),
                    )],
                ));
            }
            meta.insert("name".into(), json!(format!("{generate}{}", name_suffix())));
        }
    }
    let name = st_name(&obj);
    let ns = if res.namespaced() {
        path_ns.to_string()
    } else {
        String::new()
    };
    let node = ctx.user.node_name().map(str::to_string);
    match res {
        Res::Pods => {
            admit_pod_create(st, &mut obj, node.as_deref())?;
            let sa = sv(&obj, &["spec", "serviceAccountName"]).to_string();
            if !sa.is_empty() {
                publish_namespace_objects(st, path_ns, &sa);
            }
        }
        Res::Nodes => {
            if let Some(node) = &node {
                if name != *node {
                    return Err(admission_forbidden(
                        res,
                        &name,
                        format!(
                            "node {} is not allowed to modify node {}",
                            q(node),
                            q(&name)
                        ),
                    ));
                }
                let labels = label_keys(&obj);
                let bad = forbidden_labels(&labels);
                if !bad.is_empty() {
                    return Err(admission_forbidden(
                        res,
                        &name,
                        format!(
                            "node {} is not allowed to set the following labels: {}",
                            q(node),
                            bad.join(", ")
                        ),
                    ));
                }
            }
            default_node(&mut obj);
        }
        Res::Leases => {
            if let Some(node) = &node {
                if name != *node {
                    return Err(admission_forbidden(
                        res,
                        &name,
                        "can only access node lease with the same name as the requesting node",
                    ));
                }
            }
        }
        Res::Events => default_event(&mut obj),
        Res::Secrets | Res::ConfigMaps | Res::ServiceAccounts => {}
        Res::Services => default_service(&mut obj),
    }
    let key = (res, ns, name.clone());
    if st.objects.contains_key(&key) {
        return Err(already_exists(res, &name));
    }
    finish_metadata(&mut obj, res);
    {
        let meta = obj_mut(&mut obj, "metadata");
        meta.insert("uid".into(), json!(new_uid()));
        meta.insert("creationTimestamp".into(), json!(now_secs()));
    }
    record_manager(&mut obj, &ctx.manager, res.api_version(), &sent, false);
    Ok(st.write(key, EventType::Added, obj))
}

/// The lifetime of the fake's service account tokens when the request names
/// none (the API's default).
const TOKEN_SECONDS: i64 = 3600;

/// The review APIs the kubelet's webhooks call: (group, resource, kind).
fn review_kind(path: &str) -> Option<(&'static str, &'static str, &'static str)> {
    match path.trim_end_matches('/') {
        "/apis/authentication.k8s.io/v1/tokenreviews" => {
            Some(("authentication.k8s.io", "tokenreviews", "TokenReview"))
        }
        "/apis/authorization.k8s.io/v1/subjectaccessreviews" => Some((
            "authorization.k8s.io",
            "subjectaccessreviews",
            "SubjectAccessReview",
        )),
        _ => None,
    }
}

/// A TokenReview or SubjectAccessReview: never stored, answered 201 with
/// the request's spec and the status filled in. Admins and nodes may
/// create them (the bootstrap policy's node rules), others get RBAC's 403.
fn create_review(
    st: &State,
    user: &User,
    req: &Request,
    (group, resource, kind): (&str, &str, &str),
) -> Result<Resp, Status> {
    if req.method != "POST" {
        return Err(Status::new(
            405,
            "MethodNotAllowed",
            "the server does not allow this method on the requested resource",
        ));
    }
    if !user.is_admin() && user.node_name().is_none() {
        let mut s = Status::new(
            403,
            "Forbidden",
            format!(
                "{resource}.{group} is forbidden: User {} cannot create resource {} in API group {} at the cluster scope",
                q(&user.name),
                q(resource),
                q(group)
            ),
        )
        .with_details(Details {
            group: group.to_string(),
            kind: resource.to_string(),
            ..Details::default()
        });
        s.nosniff = true;
        return Err(s);
    }
    let body = parse_body(req)?;
    let api_version = format!("{group}/v1");
    if body
        .get("kind")
        .and_then(Value::as_str)
        .is_some_and(|k| k != kind)
        || body
            .get("apiVersion")
            .and_then(Value::as_str)
            .is_some_and(|v| v != api_version)
    {
        return Err(bad_request(format!(
            "the API version in the data ({}) does not match the expected API version ({api_version})",
            sv(&body, &["apiVersion"])
        )));
    }
    let spec = body.get("spec").cloned().unwrap_or_else(|| json!({}));
    let status = if kind == "TokenReview" {
        let token = sv(&spec, &["token"]);
        if token.is_empty() {
            return Err(bad_request(
                "token is required for TokenReview in authentication",
            ));
        }
        match st.tokens.get(token) {
            Some(u) => json!({
                "authenticated": true,
                "user": {"username": u.name, "groups": u.groups},
                "audiences": ["https://kubernetes.default.svc.cluster.local"],
            }),
            None => json!({"user": {}}),
        }
    } else {
        let name = sv(&spec, &["user"]);
        let groups: Vec<&str> = spec
            .get("groups")
            .and_then(Value::as_array)
            .map(|g| g.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        if name.is_empty() && groups.is_empty() {
            return Err(invalid_review(
                "spec.user",
                "at least one of user or group must be specified",
            ));
        }
        let Some(attrs) = spec.get("resourceAttributes") else {
            return Err(invalid_review(
                "spec.resourceAttributes",
                "exactly one of nonResourceAttributes or resourceAttributes must be specified",
            ));
        };
        let verb = sv(attrs, &["verb"]);
        let mut res = sv(attrs, &["resource"]).to_string();
        if !sv(attrs, &["subresource"]).is_empty() {
            res = format!("{res}/{}", sv(attrs, &["subresource"]));
        }
        let base = res.split('/').next().unwrap_or_default().to_string();
        let grant = st.access_rules.iter().find(|r| {
            (r.subject == name || groups.contains(&r.subject.as_str()))
                && (r.verb == "*" || r.verb == verb)
                && (r.resource == "*" || r.resource == res || r.resource == format!("{base}/*"))
        });
        if groups.contains(&"system:masters") {
            json!({"allowed": true})
        } else if let Some(r) = grant {
            let to = match r.subject == name {
                true => format!("User {}", q(name)),
                false => format!("Group {}", q(&r.subject)),
            };
            json!({
                "allowed": true,
                "reason": format!(
                    "RBAC: allowed by ClusterRoleBinding {} of ClusterRole {} to {to}",
                    q(&r.binding),
                    q(&r.binding)
                ),
            })
        } else {
            json!({"allowed": false})
        }
    };
    let answer = json!({
        "kind": kind,
        "apiVersion": api_version,
        "metadata": {"creationTimestamp": null},
        "spec": spec,
        "status": status,
    });
    Ok(Resp::object(201, &answer))
}

fn invalid_review(field: &str, message: &str) -> Status {
    Status::new(
        422,
        "Invalid",
        format!("SubjectAccessReview.authorization.k8s.io \"\" is invalid: {field}: Invalid value: \"null\": {message}"),
    )
}

/// TokenRequest (`POST .../serviceaccounts/<name>/token`), with
/// NodeRestriction's rules for nodes: the token must be bound to a pod that
/// exists with that UID and runs on the node.
fn create_token(st: &mut State, ctx: &Ctx, t: &Target, body: &Value) -> Result<Value, Status> {
    let sa = t.name.clone().unwrap_or_default();
    let spec = &body["spec"];
    let seconds = spec["expirationSeconds"].as_i64().unwrap_or(TOKEN_SECONDS);
    if seconds < 600 {
        return Err(invalid(
            Res::ServiceAccounts,
            &sa,
            vec![(
                "FieldValueInvalid".into(),
                format!(
                    "Invalid value: {seconds}: may not specify a duration less than 10 minutes"
                ),
                "spec.expirationSeconds".into(),
            )],
        ));
    }
    let bound = &spec["boundObjectRef"];
    let res = Res::ServiceAccounts;
    if let Some(node) = ctx.user.node_name() {
        if !bound.is_object() {
            return Err(admission_forbidden(
                res,
                &sa,
                "node requested token not bound to a pod",
            ));
        }
        if bound["kind"] != "Pod" {
            return Err(admission_forbidden(
                res,
                &sa,
                format!("node requested token bound to a {}", sv(bound, &["kind"])),
            ));
        }
        let pod = st.get(Res::Pods, &t.ns, sv(bound, &["name"]));
        let Some(pod) = pod else {
            return Err(admission_forbidden(
                res,
                &sa,
                format!("pods {} not found", q(sv(bound, &["name"]))),
            ));
        };
        if sv(pod, &["metadata", "uid"]) != sv(bound, &["uid"]) {
            return Err(admission_forbidden(
                res,
                &sa,
                format!(
                    "the UID in the bound object reference ({}) does not match the UID in record. The object might have been deleted and then recreated",
                    sv(bound, &["uid"])
                ),
            ));
        }
        if sv(pod, &["spec", "nodeName"]) != node {
            return Err(admission_forbidden(
                res,
                &sa,
                "node requested token bound to a pod scheduled on a different node",
            ));
        }
    }
    st.tokens_issued += 1;
    let audiences = match spec["audiences"].as_array() {
        Some(a) if !a.is_empty() => Value::Array(a.clone()),
        _ => json!([TOKEN_AUDIENCE]),
    };
    let token = format!(
        "fake-token.{}.{sa}.{}.{}",
        t.ns,
        sv(bound, &["name"]),
        st.tokens_issued
    );
    Ok(json!({
        "kind": "TokenRequest",
        "apiVersion": "authentication.k8s.io/v1",
        "metadata": {"name": sa, "namespace": t.ns, "creationTimestamp": null},
        "spec": {"audiences": audiences, "expirationSeconds": seconds, "boundObjectRef": bound},
        "status": {"token": token, "expirationTimestamp": add_secs(&now_secs(), seconds)},
    }))
}

/// What the token and root-CA controllers publish in a namespace once it is
/// used: the `<sa>-token-<suffix>` Secret and the `kube-root-ca.crt` ConfigMap.
fn publish_namespace_objects(st: &mut State, ns: &str, sa: &str) {
    let secret = format!("{sa}-token-{}", st.sa_suffix);
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    if st.get(Res::Secrets, ns, &secret).is_none() {
        let obj = json!({
            "metadata": {
                "name": secret,
                "annotations": {"kubernetes.io/service-account.name": sa},
            },
            "type": "kubernetes.io/service-account-token",
            "data": {
                "ca.crt": b64(FAKE_ROOT_CA),
                "namespace": b64(ns),
                "token": b64(&format!("fake-secret-token.{ns}.{sa}")),
            },
        });
        let _ = create(st, &FakeApiServer::admin_ctx(), Res::Secrets, ns, obj);
    }
    if st.get(Res::ConfigMaps, ns, ROOT_CA_CONFIGMAP).is_none() {
        let obj = json!({
            "metadata": {"name": ROOT_CA_CONFIGMAP},
            "data": {"ca.crt": FAKE_ROOT_CA},
        });
        let _ = create(st, &FakeApiServer::admin_ctx(), Res::ConfigMaps, ns, obj);
    }
}

fn st_name(obj: &Value) -> String {
    sv(obj, &["metadata", "name"]).to_string()
}

fn label_keys(obj: &Value) -> Vec<String> {
    obj["metadata"]["labels"]
        .as_object()
        .map(|m| m.keys().cloned().collect())
        .unwrap_or_default()
}

/// Labels a node may not set on itself (NodeRestriction).
fn forbidden_labels(keys: &[String]) -> Vec<String> {
    const ALLOWED: &[&str] = &[
        "kubernetes.io/hostname",
        "kubernetes.io/arch",
        "kubernetes.io/os",
        "beta.kubernetes.io/instance-type",
        "node.kubernetes.io/instance-type",
        "failure-domain.beta.kubernetes.io/region",
        "failure-domain.beta.kubernetes.io/zone",
        "topology.kubernetes.io/region",
        "topology.kubernetes.io/zone",
        "beta.kubernetes.io/arch",
        "beta.kubernetes.io/os",
    ];
    let mut bad: Vec<String> = keys
        .iter()
        .filter(|k| {
            let Some((ns, _)) = k.split_once('/') else {
                return false;
            };
            if ns == "node-restriction.kubernetes.io"
                || ns.ends_with(".node-restriction.kubernetes.io")
            {
                return true;
            }
            let reserved = ns == "kubernetes.io"
                || ns.ends_with(".kubernetes.io")
                || ns == "k8s.io"
                || ns.ends_with(".k8s.io");
            let kubelet_ns = ["kubelet.kubernetes.io", "node.kubernetes.io"]
                .iter()
                .any(|a| ns == *a || ns.ends_with(&format!(".{a}")));
            reserved && !kubelet_ns && !ALLOWED.contains(&k.as_str())
        })
        .cloned()
        .collect();
    bad.sort();
    bad
}

fn default_node(obj: &mut Value) {
    let spec = obj_mut(obj, "spec");
    let taint = json!({"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"});
    let taints = spec.entry("taints").or_insert_with(|| json!([]));
    if let Some(list) = taints.as_array_mut() {
        if !list
            .iter()
            .any(|t| t["key"] == "node.kubernetes.io/not-ready")
        {
            list.push(taint);
        }
    }
    let status = obj_mut(obj, "status");
    status
        .entry("daemonEndpoints")
        .or_insert_with(|| json!({"kubeletEndpoint": {"Port": 0}}));
    let info = status.entry("nodeInfo").or_insert_with(|| json!({}));
    if let Some(m) = info.as_object_mut() {
        for k in [
            "machineID",
            "systemUUID",
            "bootID",
            "kernelVersion",
            "osImage",
            "containerRuntimeVersion",
            "kubeletVersion",
            "kubeProxyVersion",
            "operatingSystem",
            "architecture",
        ] {
            m.entry(k).or_insert_with(|| json!(""));
        }
    }
}

fn default_event(obj: &mut Value) {
    let m = obj.as_object_mut().expect("objects are JSON objects");
    m.entry("involvedObject").or_insert_with(|| json!({}));
    m.entry("source").or_insert_with(|| json!({}));
    for k in ["firstTimestamp", "lastTimestamp", "eventTime"] {
        m.entry(k).or_insert(Value::Null);
    }
    for k in ["reportingComponent", "reportingInstance"] {
        m.entry(k).or_insert_with(|| json!(""));
    }
}

/// Secret names a pod refers to (volumes, env, envFrom, image pull secrets).
fn pod_refs(pod: &Value, kind: &str) -> Vec<String> {
    let spec = &pod["spec"];
    let mut out = Vec::new();
    let (vol_key, vol_name, env_key, envfrom_key) = match kind {
        "secret" => ("secret", "secretName", "secretKeyRef", "secretRef"),
        _ => ("configMap", "name", "configMapKeyRef", "configMapRef"),
    };
    for v in spec["volumes"].as_array().into_iter().flatten() {
        if let Some(n) = v[vol_key][vol_name].as_str() {
            out.push(n.to_string());
        }
        for s in v["projected"]["sources"].as_array().into_iter().flatten() {
            if let Some(n) = s[vol_key]["name"].as_str() {
                out.push(n.to_string());
            }
        }
    }
    for list in ["containers", "initContainers", "ephemeralContainers"] {
        for c in spec[list].as_array().into_iter().flatten() {
            for e in c["env"].as_array().into_iter().flatten() {
                if let Some(n) = e["valueFrom"][env_key]["name"].as_str() {
                    out.push(n.to_string());
                }
            }
            for e in c["envFrom"].as_array().into_iter().flatten() {
                if let Some(n) = e[envfrom_key]["name"].as_str() {
                    out.push(n.to_string());
                }
            }
        }
    }
    if kind == "secret" {
        for s in spec["imagePullSecrets"].as_array().into_iter().flatten() {
            if let Some(n) = s["name"].as_str() {
                out.push(n.to_string());
            }
        }
    }
    out
}

fn admit_pod_create(st: &State, pod: &mut Value, node: Option<&str>) -> Result<(), Status> {
    let name = st_name(pod);
    let res = Res::Pods;
    let mirror = pod["metadata"]["annotations"]
        .get(MIRROR_ANNOTATION)
        .is_some();
    // ServiceAccount admission (mutating, so before NodeRestriction).
    if mirror {
        if !sv(pod, &["spec", "serviceAccountName"]).is_empty() {
            return Err(admission_forbidden(
                res,
                &name,
                "a mirror pod may not reference service accounts",
            ));
        }
        if !pod_refs(pod, "secret").is_empty() {
            return Err(admission_forbidden(
                res,
                &name,
                "a mirror pod may not reference secrets",
            ));
        }
        let projects_token = pod["spec"]["volumes"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|v| v["projected"]["sources"].as_array().into_iter().flatten())
            .any(|s| s.get("serviceAccountToken").is_some());
        if projects_token {
            return Err(admission_forbidden(
                res,
                &name,
                "a mirror pod may not use ServiceAccountToken volume projections",
            ));
        }
    } else if pod["spec"]["automountServiceAccountToken"] != json!(false) {
        let spec = obj_mut(pod, "spec");
        default_key(spec, "serviceAccountName", json!("default"));
        let sa = spec["serviceAccountName"]
            .as_str()
            .unwrap_or("default")
            .to_string();
        spec.insert("serviceAccount".into(), json!(sa));
        let vol = format!("{sa}-token-{}", st.sa_suffix);
        let volumes = spec.entry("volumes").or_insert_with(|| json!([]));
        if let Some(list) = volumes.as_array_mut() {
            if !list.iter().any(|v| v["name"] == vol.as_str()) {
                list.push(json!({"name": vol, "secret": {"secretName": vol, "defaultMode": 420}}));
            }
        }
        for key in ["initContainers", "containers"] {
            for c in spec
                .get_mut(key)
                .and_then(|v| v.as_array_mut())
                .into_iter()
                .flatten()
            {
                let mounts = obj_mut_list(c, "volumeMounts");
                if !mounts.iter().any(|m| m["mountPath"] == SA_MOUNT_PATH) {
                    mounts.push(json!({"name": vol, "readOnly": true, "mountPath": SA_MOUNT_PATH}));
                }
            }
        }
    } else {
        let spec = obj_mut(pod, "spec");
        default_key(spec, "serviceAccountName", json!("default"));
        let sa = spec["serviceAccountName"].clone();
        spec.insert("serviceAccount".into(), sa);
    }
    default_pod(pod);
    // NodeRestriction.
    if let Some(node) = node {
        if !mirror {
            return Err(admission_forbidden(
                res,
                &name,
                format!(
                    "pod does not have {} annotation, node {} can only create mirror pods",
                    q(MIRROR_ANNOTATION),
                    q(node)
                ),
            ));
        }
        if sv(pod, &["spec", "nodeName"]) != node {
            return Err(admission_forbidden(
                res,
                &name,
                format!(
                    "node {} can only create pods with spec.nodeName set to itself",
                    q(node)
                ),
            ));
        }
        let owners = pod["metadata"]["ownerReferences"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        if owners.len() > 1 {
            return Err(admission_forbidden(
                res,
                &name,
                format!(
                    "node {} can only create pods with a single owner reference set to itself",
                    q(node)
                ),
            ));
        }
        let Some(owner) = owners.first() else {
            return Err(admission_forbidden(
                res,
                &name,
                format!(
                    "node {} can only create pods with an owner reference set to itself",
                    q(node)
                ),
            ));
        };
        if owner["apiVersion"] != "v1" || owner["kind"] != "Node" || owner["name"] != node {
            return Err(admission_forbidden(
                res,
                &name,
                format!(
                    "node {} can only create pods with an owner reference set to itself",
                    q(node)
                ),
            ));
        }
        if owner["controller"] != json!(true) {
            return Err(admission_forbidden(
                res,
                &name,
                format!(
                    "node {} can only create pods with a controller owner reference set to itself",
                    q(node)
                ),
            ));
        }
        if owner["blockOwnerDeletion"] == json!(true) {
            return Err(admission_forbidden(
                res,
                &name,
                format!(
                    "node {} must not set blockOwnerDeletion on an owner reference",
                    q(node)
                ),
            ));
        }
        let Some(node_obj) = st.get(Res::Nodes, "", node) else {
            return Err(not_found(Res::Nodes, node));
        };
        let node_uid = sv(node_obj, &["metadata", "uid"]);
        if sv(owner, &["uid"]) != node_uid {
            return Err(admission_forbidden(
                res,
                &name,
                format!(
                    "node {node} UID mismatch: expected {} got {}",
                    sv(owner, &["uid"]),
                    node_uid
                ),
            ));
        }
        if !pod_refs(pod, "configmap").is_empty() {
            return Err(admission_forbidden(
                res,
                &name,
                format!(
                    "node {} can not create pods that reference configmaps",
                    q(node)
                ),
            ));
        }
        let pvc = pod["spec"]["volumes"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|v| v.get("persistentVolumeClaim").is_some());
        if pvc {
            return Err(admission_forbidden(
                res,
                &name,
                format!(
                    "node {} can not create pods that reference persistentvolumeclaims",
                    q(node)
                ),
            ));
        }
    }
    // The pod strategy: a new pod is Pending with its QoS class.
    let qos = qos_class(&pod["spec"]);
    pod.as_object_mut()
        .expect("objects are JSON objects")
        .insert(
            "status".into(),
            json!({"phase": "Pending", "qosClass": qos}),
        );
    Ok(())
}

fn obj_mut_list<'a>(v: &'a mut Value, key: &str) -> &'a mut Vec<Value> {
    if !v.is_object() {
        *v = json!({});
    }
    let m = v.as_object_mut().expect("made an object above");
    let e = m.entry(key.to_string()).or_insert_with(|| json!([]));
    if !e.is_array() {
        *e = json!([]);
    }
    e.as_array_mut().expect("made an array above")
}

fn default_pull_policy(image: &str) -> &'static str {
    if image.contains('@') {
        return "IfNotPresent";
    }
    let last = image.rsplit('/').next().unwrap_or(image);
    match last.split_once(':') {
        Some((_, "latest")) | None => "Always",
        Some(_) => "IfNotPresent",
    }
}

/// API defaulting and the Priority and DefaultTolerationSeconds plugins.
fn default_pod(pod: &mut Value) {
    let spec = obj_mut(pod, "spec");
    default_key(spec, "restartPolicy", json!("Always"));
    default_key(spec, "terminationGracePeriodSeconds", json!(30));
    default_key(spec, "dnsPolicy", json!("ClusterFirst"));
    default_key(spec, "securityContext", json!({}));
    default_key(spec, "schedulerName", json!("default-scheduler"));
    default_key(spec, "enableServiceLinks", json!(true));
    default_key(spec, "priority", json!(0));
    default_key(spec, "preemptionPolicy", json!("PreemptLowerPriority"));
    for key in ["initContainers", "containers"] {
        for c in spec
            .get_mut(key)
            .and_then(|v| v.as_array_mut())
            .into_iter()
            .flatten()
        {
            let Some(cm) = c.as_object_mut() else {
                continue;
            };
            let image = cm
                .get("image")
                .and_then(|v| v.as_str())
                .unwrap_or("")
                .to_string();
            default_key(cm, "resources", json!({}));
            default_key(cm, "terminationMessagePath", json!("/dev/termination-log"));
            default_key(cm, "terminationMessagePolicy", json!("File"));
            default_key(cm, "imagePullPolicy", json!(default_pull_policy(&image)));
            // Requests default to limits.
            if let Some(res) = cm.get_mut("resources").and_then(|r| r.as_object_mut()) {
                if let Some(limits) = res.get("limits").and_then(|l| l.as_object()).cloned() {
                    let req = res.entry("requests").or_insert_with(|| json!({}));
                    if let Some(rm) = req.as_object_mut() {
                        for (k, v) in limits {
                            rm.entry(k).or_insert(v);
                        }
                    }
                }
            }
        }
    }
    let list = spec.entry("tolerations").or_insert_with(|| json!([]));
    if let Some(list) = list.as_array_mut() {
        for taint in [
            "node.kubernetes.io/not-ready",
            "node.kubernetes.io/unreachable",
        ] {
            let tolerated = list.iter().any(|t| {
                let effect_ok = matches!(t["effect"].as_str(), None | Some("") | Some("NoExecute"));
                let key_ok = match t["key"].as_str() {
                    None | Some("") => t["operator"] == "Exists",
                    Some(k) => k == taint,
                };
                effect_ok && key_ok
            });
            if !tolerated {
                list.push(json!({"key": taint, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}));
            }
        }
    }
    if spec
        .get("tolerations")
        .and_then(|t| t.as_array())
        .is_some_and(|t| t.is_empty())
    {
        spec.remove("tolerations");
    }
}

fn qos_class(spec: &Value) -> &'static str {
    let mut any = false;
    let mut guaranteed = true;
    for key in ["initContainers", "containers"] {
        for c in spec[key].as_array().into_iter().flatten() {
            let req = &c["resources"]["requests"];
            let lim = &c["resources"]["limits"];
            for r in ["cpu", "memory"] {
                if req.get(r).is_some() || lim.get(r).is_some() {
                    any = true;
                }
                match (req.get(r), lim.get(r)) {
                    (_, None) => guaranteed = false,
                    (Some(a), Some(b)) if a != b => guaranteed = false,
                    _ => {}
                }
            }
        }
    }
    if !any {
        "BestEffort"
    } else if guaranteed {
        "Guaranteed"
    } else {
        "Burstable"
    }
}

/// What an update may change: the status subresource takes only status,
/// the main resource keeps the old status (for pods and nodes).
fn apply_strategy(res: Res, sub: Option<&str>, old: &Value, new: &mut Value) {
    let m = new.as_object_mut().expect("objects are JSON objects");
    match (res, sub) {
        (Res::Pods | Res::Nodes, Some("status")) => {
            m.insert("spec".into(), old["spec"].clone());
            if res == Res::Pods {
                let refs = old["metadata"]["ownerReferences"].clone();
                let meta = obj_mut(new, "metadata");
                if refs.is_null() {
                    meta.remove("ownerReferences");
                } else {
                    meta.insert("ownerReferences".into(), refs);
                }
            }
        }
        (Res::Pods | Res::Nodes, None) => {
            m.insert("status".into(), old["status"].clone());
        }
        _ => {}
    }
    finish_metadata(new, res);
    let meta = obj_mut(new, "metadata");
    for k in [
        "name",
        "namespace",
        "creationTimestamp",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
        "managedFields",
    ] {
        match old["metadata"].get(k) {
            Some(v) => {
                meta.insert(k.into(), v.clone());
            }
            None => {
                meta.remove(k);
            }
        }
    }
    meta.remove("selfLink");
}

fn update(st: &mut State, ctx: &Ctx, t: &Target, body: Value) -> Result<Value, Status> {
    let name = t.name.clone().unwrap_or_default();
    let body_name = st_name(&body);
    if !body_name.is_empty() && body_name != name {
        return Err(bad_request(format!(
            "the name of the object ({body_name}) does not match the name on the URL ({name})"
        )));
    }
    let old = get(st, t)?;
    let sent_rv = sv(&body, &["metadata", "resourceVersion"]).to_string();
    if !sent_rv.is_empty() && sent_rv != sv(&old, &["metadata", "resourceVersion"]) {
        return Err(conflict_modified(t.res, &name));
    }
    let mut new = body.clone();
    if sv(&new, &["metadata", "uid"]).is_empty() {
        obj_mut(&mut new, "metadata").insert("uid".into(), old["metadata"]["uid"].clone());
    }
    finish_update(st, ctx, t, old, new, &body)
}

fn patch(st: &mut State, ctx: &Ctx, t: &Target, req: &Request) -> Result<Value, Status> {
    let name = t.name.clone().unwrap_or_default();
    let ctype = req
        .header("content-type")
        .unwrap_or("")
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_string();
    let patch: Value = serde_json::from_slice(&req.body)
        .map_err(|e| bad_request(format!("the body of the request could not be decoded: {e}")))?;
    let old = get(st, t)?;
    let patched = match ctype.as_str() {
        "application/strategic-merge-patch+json" => smp(&old, &patch).map_err(bad_request)?,
        "application/merge-patch+json" => merge_patch(&old, &patch),
        _ => {
            return Err(Status::new(
                415,
                "UnsupportedMediaType",
                format!("the body of the request was in an unknown format - accepted media types include: application/strategic-merge-patch+json, application/merge-patch+json (got {ctype:?})"),
            ))
        }
    };
    let sent_rv = sv(&patch, &["metadata", "resourceVersion"]).to_string();
    if !sent_rv.is_empty() && sent_rv != sv(&old, &["metadata", "resourceVersion"]) {
        return Err(conflict_modified(t.res, &name));
    }
    if !patched.is_object() {
        return Err(bad_request("the patch removed the whole object"));
    }
    finish_update(st, ctx, t, old, patched, &patch)
}

fn finish_update(
    st: &mut State,
    ctx: &Ctx,
    t: &Target,
    old: Value,
    mut new: Value,
    sent: &Value,
) -> Result<Value, Status> {
    let name = t.name.clone().unwrap_or_default();
    apply_strategy(t.res, t.sub.as_deref(), &old, &mut new);
    // Validation: the uid is immutable.
    let new_uid = sv(&new, &["metadata", "uid"]).to_string();
    let old_uid = sv(&old, &["metadata", "uid"]).to_string();
    if new_uid != old_uid {
        let cause = (
            "FieldValueInvalid".to_string(),
            format!("Invalid value: {}: field is immutable", q(&new_uid)),
            "metadata.uid".to_string(),
        );
        let causes = if t.res == Res::Pods {
            vec![cause.clone(), cause]
        } else {
            vec![cause]
        };
        return Err(invalid(t.res, &name, causes));
    }
    // NodeRestriction.
    if let Some(node) = ctx.user.node_name() {
        match t.res {
            Res::Nodes => {
                if name != node {
                    return Err(admission_forbidden(
                        t.res,
                        &name,
                        format!(
                            "node {} is not allowed to modify node {}",
                            q(node),
                            q(&name)
                        ),
                    ));
                }
                if old["spec"]["taints"] != new["spec"]["taints"] {
                    return Err(admission_forbidden(
                        t.res,
                        &name,
                        format!("node {} is not allowed to modify taints", q(node)),
                    ));
                }
                let old_labels = &old["metadata"]["labels"];
                let new_labels = &new["metadata"]["labels"];
                let mut changed: Vec<String> = label_keys(&new)
                    .into_iter()
                    .filter(|k| old_labels.get(k) != new_labels.get(k))
                    .collect();
                changed.extend(
                    label_keys(&old)
                        .into_iter()
                        .filter(|k| new_labels.get(k).is_none()),
                );
                let bad = forbidden_labels(&changed);
                if !bad.is_empty() {
                    return Err(admission_forbidden(
                        t.res,
                        &name,
                        format!("is not allowed to modify labels: {}", bad.join(", ")),
                    ));
                }
            }
            Res::Pods if t.sub.is_some() => {
                if sv(&old, &["spec", "nodeName"]) != node {
                    return Err(admission_forbidden(
                        t.res,
                        &name,
                        format!("node {} can only update pod status for pods with spec.nodeName set to itself", q(node)),
                    ));
                }
                if old["metadata"]["labels"] != new["metadata"]["labels"] {
                    return Err(admission_forbidden(
                        t.res,
                        &name,
                        format!("node {} cannot update labels through pod status", q(node)),
                    ));
                }
            }
            _ => {}
        }
    }
    let mut cmp_old = old.clone();
    let mut cmp_new = new.clone();
    for v in [&mut cmp_old, &mut cmp_new] {
        let meta = obj_mut(v, "metadata");
        meta.remove("managedFields");
        meta.remove("resourceVersion");
    }
    if cmp_old == cmp_new {
        return Ok(old);
    }
    record_manager(
        &mut new,
        &ctx.manager,
        t.res.api_version(),
        sent,
        t.sub.as_deref() == Some("status"),
    );
    let key = (t.res, t.ns.clone(), name);
    Ok(st.write(key, EventType::Modified, new))
}

#[derive(Clone, Debug, Default)]
struct DeleteOptions {
    grace: Option<i64>,
    uid: Option<String>,
    resource_version: Option<String>,
}

impl DeleteOptions {
    fn parse(req: &Request) -> Result<DeleteOptions, Status> {
        let mut o = DeleteOptions::default();
        if !req.body.is_empty() {
            let v: Value = serde_json::from_slice(&req.body).map_err(|e| {
                bad_request(format!("the body of the request could not be decoded: {e}"))
            })?;
            o.grace = v["gracePeriodSeconds"].as_i64();
            o.uid = v["preconditions"]["uid"].as_str().map(str::to_string);
            o.resource_version = v["preconditions"]["resourceVersion"]
                .as_str()
                .map(str::to_string);
        }
        if let Some(g) = req.param("gracePeriodSeconds").and_then(|g| g.parse().ok()) {
            o.grace = Some(g);
        }
        Ok(o)
    }
}

/// What a DELETE answers: pods return the pod, other resources a success Status.
enum Deleted {
    Object(Value),
    Status(Details),
}

impl Deleted {
    fn into_resp(self) -> Resp {
        match self {
            Deleted::Object(v) => Resp::object(200, &v),
            Deleted::Status(d) => {
                let failure = Status::new(200, "", "").with_details(d).json();
                // Reuse the details rendering of Status::json.
                let start = failure.find(r#""details":"#).unwrap_or(0);
                let end = failure.rfind(r#","code":"#).unwrap_or(failure.len());
                Resp::json(
                    200,
                    format!(
                        r#"{{"kind":"Status","apiVersion":"v1","metadata":{{}},"status":"Success",{}}}"#,
                        &failure[start..end]
                    ) + "\n",
                )
            }
        }
    }

    fn object(self) -> Option<Value> {
        match self {
            Deleted::Object(v) => Some(v),
            Deleted::Status(_) => None,
        }
    }
}

/// The API's Service defaults that service variables read: type
/// ClusterIP and each port's protocol TCP.
fn default_service(obj: &mut Value) {
    let spec = obj_mut(obj, "spec");
    spec.entry("type").or_insert_with(|| json!("ClusterIP"));
    if let Some(Value::Array(ports)) = spec.get_mut("ports") {
        for p in ports.iter_mut().filter_map(Value::as_object_mut) {
            p.entry("protocol").or_insert_with(|| json!("TCP"));
        }
    }
}

fn delete(
    st: &mut State,
    ctx: &Ctx,
    res: Res,
    ns: &str,
    name: &str,
    opts: &DeleteOptions,
) -> Result<Deleted, Status> {
    let key = (res, ns.to_string(), name.to_string());
    let Some(old) = st.objects.get(&key).cloned() else {
        return Err(not_found(res, name));
    };
    if let Some(node) = ctx.user.node_name() {
        if res == Res::Pods && sv(&old, &["spec", "nodeName"]) != node {
            return Err(admission_forbidden(
                res,
                name,
                format!(
                    "node {} can only delete pods with spec.nodeName set to itself",
                    q(node)
                ),
            ));
        }
    }
    let precondition = |what: &str, want: &str, have: &str, tail: &str| {
        Status::new(
            409,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on {} {}: the {what} in the precondition ({want}) does not match the {what} in record ({have}). {tail}",
                res.kind(),
                q(name)
            ),
        )
        .with_details(Details {
            name: name.to_string(),
            kind: res.kind().to_string(),
            ..Details::default()
        })
    };
    if let Some(uid) = &opts.uid {
        let have = sv(&old, &["metadata", "uid"]);
        if uid != have {
            return Err(precondition(
                "UID",
                uid,
                have,
                "The object might have been deleted and then recreated",
            ));
        }
    }
    if let Some(rv) = &opts.resource_version {
        let have = sv(&old, &["metadata", "resourceVersion"]);
        if rv != have {
            return Err(precondition(
                "ResourceVersion",
                rv,
                have,
                "The object might have been modified",
            ));
        }
    }
    if res != Res::Pods {
        let uid = sv(&old, &["metadata", "uid"]).to_string();
        st.write(key, EventType::Deleted, old);
        let mut d = details(res, name);
        d.uid = uid;
        return Ok(Deleted::Status(d));
    }
    // Pods: graceful deletion.
    let meta = &old["metadata"];
    let mut pod = old.clone();
    if meta.get("deletionTimestamp").is_some_and(|v| !v.is_null()) {
        let existing = meta["deletionGracePeriodSeconds"].as_i64();
        match (existing, opts.grace) {
            (None | Some(0), _) => {}
            (Some(cur), Some(g)) if g < cur => {
                let g = g.max(0);
                let ts = add_secs(sv(&old, &["metadata", "deletionTimestamp"]), g - cur);
                let m = obj_mut(&mut pod, "metadata");
                m.insert("deletionTimestamp".into(), json!(ts));
                m.insert("deletionGracePeriodSeconds".into(), json!(g));
                pod = st.write(key.clone(), EventType::Modified, pod);
                if g > 0 {
                    return Ok(Deleted::Object(pod));
                }
            }
            _ => return Ok(Deleted::Object(old)),
        }
    } else {
        let terminal = matches!(sv(&old, &["status", "phase"]), "Succeeded" | "Failed");
        let unscheduled = sv(&old, &["spec", "nodeName"]).is_empty();
        let mut g = opts
            .grace
            .or_else(|| old["spec"]["terminationGracePeriodSeconds"].as_i64())
            .unwrap_or(30);
        if terminal || unscheduled {
            g = 0;
        }
        if g < 0 {
            g = 1;
        }
        let ts = add_secs(&now_secs(), g);
        let m = obj_mut(&mut pod, "metadata");
        m.insert("deletionTimestamp".into(), json!(ts));
        m.insert("deletionGracePeriodSeconds".into(), json!(g));
        pod = st.write(key.clone(), EventType::Modified, pod);
        if g > 0 {
            return Ok(Deleted::Object(pod));
        }
    }
    let finalizers = pod["metadata"]["finalizers"]
        .as_array()
        .is_some_and(|f| !f.is_empty());
    if !finalizers {
        st.write(key, EventType::Deleted, pod.clone());
    }
    Ok(Deleted::Object(pod))
}

// ---------------------------------------------------------------------------
// Watches

enum WatchStart {
    /// No resourceVersion: from etcd, synthetic ADDED, no bookmarks.
    Now,
    /// resourceVersion=0: from the cache, synthetic ADDED.
    Zero,
    From(u64),
}

struct WatchPlan {
    res: Res,
    filter: Filter,
    start: WatchStart,
    bookmarks: bool,
    timeout: Duration,
}

fn watch_plan(_st: &State, req: &Request, t: &Target) -> Result<WatchPlan, Status> {
    let ns = (!t.ns.is_empty()).then_some(t.ns.as_str());
    let filter = Filter::parse(
        t.res,
        ns,
        t.name.as_deref(),
        req.param("fieldSelector").unwrap_or(""),
        req.param("labelSelector").unwrap_or(""),
    )?;
    let rv = req.param("resourceVersion").unwrap_or("");
    let start = match rv {
        "" => WatchStart::Now,
        "0" => WatchStart::Zero,
        n => WatchStart::From(n.parse().map_err(|_| {
            bad_request(format!(
                "resourceVersion: Invalid value: {}: must be a number",
                q(n)
            ))
        })?),
    };
    let timeout = req
        .param("timeoutSeconds")
        .and_then(|s| s.parse::<u64>().ok())
        .map(Duration::from_secs)
        .unwrap_or(DEFAULT_WATCH_TIMEOUT);
    Ok(WatchPlan {
        res: t.res,
        filter,
        bookmarks: req.param("allowWatchBookmarks") == Some("true")
            && !matches!(start, WatchStart::Now),
        start,
        timeout,
    })
}

fn event_line(kind: &str, obj: &str) -> String {
    format!(r#"{{"type":"{kind}","object":{obj}}}"#) + "\n"
}

fn too_old_line(rv: u64, oldest: u64) -> String {
    let s = Status::new(
        410,
        "Expired",
        format!("too old resource version: {rv} ({oldest})"),
    );
    event_line("ERROR", &s.json())
}

/// The event a watcher with this filter sees for a write, if any.
fn convert(e: &Event, f: &Filter) -> Option<String> {
    let new_ok = f.matches(&e.obj);
    let old_ok = e.prev.as_ref().is_some_and(|p| f.matches(p));
    let (kind, obj) = match e.kind {
        EventType::Added if new_ok => ("ADDED", e.obj.clone()),
        EventType::Deleted if new_ok || old_ok => ("DELETED", e.obj.clone()),
        EventType::Modified => match (new_ok, old_ok) {
            (true, true) => ("MODIFIED", e.obj.clone()),
            (true, false) => ("ADDED", e.obj.clone()),
            (false, true) => {
                let mut prev = e.prev.clone().unwrap_or(Value::Null);
                obj_mut(&mut prev, "metadata")
                    .insert("resourceVersion".into(), json!(e.rv.to_string()));
                ("DELETED", prev)
            }
            (false, false) => return None,
        },
        _ => return None,
    };
    Some(event_line(kind, &encode(&obj)))
}

/// Counts a watch as open while it lives.
struct OpenWatch<'a> {
    shared: &'a Shared,
    res: Res,
}

impl<'a> OpenWatch<'a> {
    fn new(shared: &'a Shared, res: Res) -> OpenWatch<'a> {
        *shared.open_watches.lock().entry(res).or_insert(0) += 1;
        OpenWatch { shared, res }
    }
}

impl Drop for OpenWatch<'_> {
    fn drop(&mut self) {
        if let Some(n) = self.shared.open_watches.lock().get_mut(&self.res) {
            *n = n.saturating_sub(1);
        }
    }
}

/// Injected bytes for `res` numbered above `after`, and the last number seen.
fn injections(shared: &Shared, res: Res, after: u64) -> (Vec<Arc<Vec<u8>>>, u64) {
    let list = shared.injected.lock();
    let last = list.last().map_or(after, |(id, _, _)| (*id).max(after));
    let raw = list
        .iter()
        .filter(|(id, r, _)| *id > after && *r == res)
        .map(|(_, _, b)| b.clone())
        .collect();
    (raw, last)
}

/// Streams a watch; false when the connection must close.
fn run_watch(shared: &Arc<Shared>, out: &mut Conn, plan: WatchPlan) -> bool {
    let _open = OpenWatch::new(shared, plan.res);
    // Only bytes injected from now on are for this watch.
    let mut injected_seen = {
        let _guard = shared.state.lock();
        shared.next_injection.load(Ordering::SeqCst) - 1
    };
    let head = format!(
        "HTTP/1.1 200 OK\r\nCache-Control: no-cache, private\r\nContent-Type: application/json\r\nDate: {}\r\nTransfer-Encoding: chunked\r\n\r\n",
        http_date()
    );
    if out
        .write_all(head.as_bytes())
        .and_then(|_| out.flush())
        .is_err()
    {
        return false;
    }
    let gen = shared.watch_gen.load(Ordering::SeqCst);
    let st = shared.state.lock();
    let mut initial = Vec::new();
    let (mut pos, start_rv) = match plan.start {
        WatchStart::From(n) if n < st.compacted => {
            let line = too_old_line(n, st.compacted);
            drop(st);
            return write_chunk(out, line.as_bytes())
                .and_then(|_| out.write_all(b"0\r\n\r\n"))
                .is_ok();
        }
        WatchStart::From(n) => (n, n),
        WatchStart::Zero | WatchStart::Now => {
            for (k, v) in st.objects.iter() {
                if k.0 == plan.res && plan.filter.matches(v) {
                    initial.push(event_line("ADDED", &encode(v)));
                }
            }
            (st.rv, st.type_rv(plan.res))
        }
    };
    drop(st);
    let cut = |out: &mut Conn| {
        let _ = out.tcp().shutdown(Shutdown::Both);
        false
    };
    for line in initial {
        if write_chunk(out, line.as_bytes()).is_err() {
            return false;
        }
    }
    let started = Instant::now();
    let deadline = started + plan.timeout;
    let mut next_bookmark: Option<Instant> = None;
    let mut pre_deadline_sent = false;
    loop {
        if shared.stop.load(Ordering::SeqCst) || shared.watch_gen.load(Ordering::SeqCst) != gen {
            return cut(out);
        }
        if shared.black_hole.load(Ordering::SeqCst) {
            // Nothing more is sent, not even the end of the stream, and not
            // after the black hole ends either.
            hold_silent(shared, out.tcp());
            return cut(out);
        }

        let now = Instant::now();
        if now >= deadline {
            return out
                .write_all(b"0\r\n\r\n")
                .and_then(|_| out.flush())
                .is_ok();
        }
        let mut st = shared.state.lock();
        let interval = st.bookmark_interval.max(Duration::from_millis(10));
        let nb = *next_bookmark.get_or_insert(started + interval);
        let lead = interval.min(Duration::from_secs(2));
        let pre_deadline = deadline.checked_sub(lead).unwrap_or(started);
        if st.rv <= pos {
            let wake = [nb, pre_deadline, deadline]
                .into_iter()
                .filter(|t| *t > now)
                .min()
                .unwrap_or(now);
            let wait = wake
                .saturating_duration_since(now)
                .min(POLL * 5)
                .max(Duration::from_millis(1));
            shared.changed.wait_for(&mut st, wait);
        }
        if pos < st.compacted {
            let line = too_old_line(pos, st.compacted);
            drop(st);
            return write_chunk(out, line.as_bytes())
                .and_then(|_| out.write_all(b"0\r\n\r\n"))
                .is_ok();
        }
        let (raw, seen) = injections(shared, plan.res, injected_seen);
        injected_seen = seen;
        let lines: Vec<String> = st
            .log
            .iter()
            .filter(|e| e.rv > pos && e.res == plan.res)
            .filter_map(|e| convert(e, &plan.filter))
            .collect();
        pos = pos.max(st.rv);
        let cache_rv = st.type_rv(plan.res);
        drop(st);
        for bytes in raw {
            if write_chunk(out, &bytes).is_err() {
                return false;
            }
        }
        for line in lines {
            if write_chunk(out, line.as_bytes()).is_err() {
                return false;
            }
        }
        if plan.bookmarks {
            let now = Instant::now();
            let mut due = false;
            if now >= nb {
                due = true;
                next_bookmark = Some(nb + interval);
            }
            if !pre_deadline_sent && now >= pre_deadline && now < deadline {
                due = true;
                pre_deadline_sent = true;
            }
            if due && cache_rv > start_rv {
                let line = event_line("BOOKMARK", &plan.res.bookmark(cache_rv));
                if write_chunk(out, line.as_bytes()).is_err() {
                    return false;
                }
            }
        }
    }
}
