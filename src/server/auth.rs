//! Who may call the node's API (upstream `pkg/kubelet/server/auth.go` and
//! the apiserver's delegating authenticator and webhook authorizer).
//!
//! Authentication, in upstream's order: the verified client certificate's
//! subject (CN the user, each O a group; a certificate without a CN does
//! not authenticate), then a bearer token (the Authorization header, then
//! a WebSocket subprotocol) checked by the apiserver's TokenReview when the
//! token webhook is on. The first that succeeds
//! wins, and an authenticated user also gets `system:authenticated`. A
//! request with neither is anonymous, which the caller allows only when
//! [`Auth::anonymous`] gives a user; a refused token is an error, never
//! anonymous.
//!
//! Authorization: every request is a `nodes/<subresource>` request on the
//! node's own Node (`proxy` unless the path is a stats, metrics, logs or
//! spec path), with the verb from the HTTP method, asked of the apiserver
//! by SubjectAccessReview (`Webhook`) or allowed without asking
//! (`AlwaysAllow`). Answers are cached with their own TTLs in bounded
//! caches; errors (no answer, a bad answer) are never cached. No lock is
//! held across a request to the apiserver.

use std::collections::hash_map::RandomState;
use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::hash::{BuildHasher, Hash};
use std::time::{Duration, Instant};

use base64::Engine as _;
use parking_lot::Mutex;
use serde_json::{json, Value};

use super::head::RequestHead;
use super::route::Route;
use crate::kube::Client;
pub use crate::options::{AuthConfig, AuthorizationMode};
use crate::x509::subject;

/// Entries kept in each cache; the oldest is dropped for a new one.
pub(crate) const CACHE_ENTRIES: usize = 1024;

const TOKEN_REVIEWS: &str = "/apis/authentication.k8s.io/v1/tokenreviews";
const ACCESS_REVIEWS: &str = "/apis/authorization.k8s.io/v1/subjectaccessreviews";
const ALL_AUTHENTICATED: &str = "system:authenticated";
const ALL_UNAUTHENTICATED: &str = "system:unauthenticated";

/// An authenticated caller.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct User {
    pub name: String,
    pub groups: Vec<String>,
    /// The TokenReview's `uid` (empty for a certificate).
    pub uid: String,
    /// The TokenReview's `extra`: what scopes a token (a bound service
    /// account token's pod and node, say), for the authorizer to read.
    pub extra: BTreeMap<String, Vec<String>>,
}

/// An authorization decision with the attributes it was made on (the
/// server names them in its 403 text, as upstream).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    pub allowed: bool,
    pub verb: String,
    pub resource: String,
    pub subresource: String,
    /// The authorizer's reason, for the log only.
    pub reason: String,
}

/// Why a request could not be authenticated or authorized. Displayed in
/// the node's log; the client only gets the status code.
#[derive(Debug, Clone, PartialEq)]
pub enum AuthError {
    /// The client certificate could not be read.
    Certificate(String),
    /// The apiserver's TokenReview said the token is not valid.
    InvalidToken,
    /// The TokenReview failed or its answer could not be used.
    TokenReview(String),
    /// The SubjectAccessReview failed or its answer could not be used.
    AccessReview(String),
    /// The WebSocket bearer token subprotocol is malformed.
    TokenProtocol(String),
}

impl fmt::Display for AuthError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AuthError::Certificate(e) => write!(f, "client certificate: {e}"),
            AuthError::InvalidToken => write!(f, "invalid bearer token"),
            AuthError::TokenReview(e) => write!(f, "TokenReview: {e}"),
            AuthError::AccessReview(e) => write!(f, "SubjectAccessReview: {e}"),
            AuthError::TokenProtocol(e) => write!(f, "WebSocket token subprotocol: {e}"),
        }
    }
}

impl std::error::Error for AuthError {}

/// The node API's authenticator and authorizer; shared by the server's
/// threads.
pub struct Auth {
    cfg: AuthConfig,
    client: Option<Client>,
    /// Token answers by keyed hash of the token: the user, or none for a
    /// refused token.
    tokens: Mutex<TtlCache<u128, Option<User>>>,
    /// SubjectAccessReview answers by the review's spec: (allowed, reason).
    access: Mutex<TtlCache<String, (bool, String)>>,
    /// The secret keys of the token hash, fresh in each process.
    token_keys: (RandomState, RandomState),
}

impl Auth {
    pub fn new(cfg: AuthConfig, client: Option<Client>) -> Auth {
        Auth {
            cfg,
            client,
            tokens: Mutex::new(TtlCache::new(CACHE_ENTRIES)),
            access: Mutex::new(TtlCache::new(CACHE_ENTRIES)),
            token_keys: (RandomState::new(), RandomState::new()),
        }
    }

    /// The request's user from its client certificate (`peer_cert`: the
    /// leaf's DER, already verified against `--client-ca-file`) or its
    /// bearer token. None: the request carries no credentials.
    pub fn authenticate(
        &self,
        peer_cert: Option<&[u8]>,
        head: &RequestHead,
    ) -> Result<Option<User>, AuthError> {
        // As upstream's union: a certificate that fails does not stop a
        // token from authenticating the request.
        let mut cert_error = None;
        if let Some(der) = peer_cert {
            match subject(der) {
                Ok((Some(cn), orgs)) => return Ok(Some(with_authenticated(cn, orgs))),
                Ok((None, _)) => {}
                Err(e) => cert_error = Some(AuthError::Certificate(e)),
            }
        }
        if !self.cfg.token_webhook {
            return cert_error.map_or(Ok(None), Err);
        }
        // Then the Authorization header, then the WebSocket protocol
        // header, each tried when the one before did not authenticate.
        let mut error = cert_error;
        if let Some(token) = bearer_token(head) {
            match self.review_token(token) {
                Ok(user) => return Ok(Some(user)),
                Err(e) => error = Some(e),
            }
        }
        match protocol_token(head) {
            Ok(Some(token)) => match self.review_token(&token) {
                Ok(user) => return Ok(Some(user)),
                Err(e) => error = Some(e),
            },
            Ok(None) => {}
            Err(e) => error = Some(e),
        }
        error.map_or(Ok(None), Err)
    }

    /// The anonymous user, when `--anonymous-auth` allows one.
    pub fn anonymous(&self) -> Option<User> {
        self.cfg.anonymous.then(|| User {
            name: "system:anonymous".into(),
            groups: vec![ALL_UNAUTHENTICATED.into()],
            ..User::default()
        })
    }

    /// Whether `user` may make this request.
    pub fn authorize(&self, user: &User, head: &RequestHead) -> Result<Decision, AuthError> {
        self.authorize_route(user, &head.method, Route::of(head))
    }

    /// Whether `user` may make a `method` request on `route`.
    pub(crate) fn authorize_route(
        &self,
        user: &User,
        method: &str,
        route: Route,
    ) -> Result<Decision, AuthError> {
        let (verb, subresource) = attributes(method, route);
        let mut decision = Decision {
            allowed: false,
            verb: verb.to_string(),
            resource: "nodes".into(),
            subresource: subresource.to_string(),
            reason: String::new(),
        };
        match self.cfg.mode {
            None => decision.reason = "no authorization mode (standalone)".into(),
            Some(AuthorizationMode::AlwaysAllow) => decision.allowed = true,
            Some(AuthorizationMode::Webhook) => {
                let (allowed, reason) = self.review_access(user, verb, subresource)?;
                decision.allowed = allowed;
                decision.reason = reason;
            }
        }
        Ok(decision)
    }

    fn token_key(&self, token: &str) -> u128 {
        let half = |s: &RandomState| s.hash_one(token) as u128;
        half(&self.token_keys.0) << 64 | half(&self.token_keys.1)
    }

    /// The user of a bearer token, from the cache or the apiserver's
    /// TokenReview.
    fn review_token(&self, token: &str) -> Result<User, AuthError> {
        let key = self.token_key(token);
        if let Some(answer) = self.tokens.lock().get(&key, Instant::now()) {
            return answer.ok_or(AuthError::InvalidToken);
        }
        let Some(client) = &self.client else {
            return Err(AuthError::TokenReview("no API client".into()));
        };
        let body = json!({
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenReview",
            "spec": {"token": token},
        });
        let answer = client
            .create(TOKEN_REVIEWS, &body)
            .map_err(|e| AuthError::TokenReview(e.to_string()))?;
        let user = token_review_user(&answer).map_err(AuthError::TokenReview)?;
        let ttl = self.cfg.token_cache_ttl;
        if !ttl.is_zero() {
            self.tokens
                .lock()
                .insert(key, user.clone(), deadline(Instant::now(), ttl));
        }
        user.ok_or(AuthError::InvalidToken)
    }

    /// (allowed, reason) for `user` doing `verb` on the node's
    /// `subresource`, from the cache or a SubjectAccessReview.
    fn review_access(
        &self,
        user: &User,
        verb: &str,
        subresource: &str,
    ) -> Result<(bool, String), AuthError> {
        let mut attrs = serde_json::Map::new();
        // The API's omitempty fields: namespace and group are empty here,
        // and so is the verb of a method upstream has no verb for.
        if !verb.is_empty() {
            attrs.insert("verb".into(), verb.into());
        }
        attrs.insert("version".into(), "v1".into());
        attrs.insert("resource".into(), "nodes".into());
        attrs.insert("subresource".into(), subresource.into());
        attrs.insert("name".into(), self.cfg.node_name.as_str().into());
        let mut spec = serde_json::Map::new();
        spec.insert("resourceAttributes".into(), Value::Object(attrs));
        spec.insert("user".into(), user.name.as_str().into());
        if !user.groups.is_empty() {
            spec.insert("groups".into(), json!(user.groups));
        }
        // As upstream's webhook authorizer sends them (omitempty): without
        // them a scoped token would be authorized as if unscoped.
        if !user.extra.is_empty() {
            spec.insert("extra".into(), json!(user.extra));
        }
        if !user.uid.is_empty() {
            spec.insert("uid".into(), user.uid.as_str().into());
        }
        let spec = Value::Object(spec);
        // Keyed, as upstream, by the whole spec.
        let key = spec.to_string();
        if let Some(answer) = self.access.lock().get(&key, Instant::now()) {
            return Ok(answer);
        }
        let Some(client) = &self.client else {
            return Err(AuthError::AccessReview("no API client".into()));
        };
        let body = json!({
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SubjectAccessReview",
            "spec": spec,
        });
        let answer = client
            .create(ACCESS_REVIEWS, &body)
            .map_err(|e| AuthError::AccessReview(e.to_string()))?;
        let (allowed, reason) = access_review_status(&answer).map_err(AuthError::AccessReview)?;
        let ttl = match allowed {
            true => self.cfg.authorized_ttl,
            false => self.cfg.unauthorized_ttl,
        };
        if !ttl.is_zero() {
            self.access.lock().insert(
                key,
                (allowed, reason.clone()),
                deadline(Instant::now(), ttl),
            );
        }
        Ok((allowed, reason))
    }
}

/// When an answer cached at `now` for `ttl` expires: a TTL too long for
/// the clock (the flags take any duration) is cut to a year.
fn deadline(now: Instant, ttl: Duration) -> Instant {
    const YEAR: Duration = Duration::from_secs(365 * 24 * 3600);
    now.checked_add(ttl.min(YEAR)).unwrap_or(now)
}

/// A user authenticated by certificate or token, with
/// `system:authenticated` added as upstream's group adder does (unless it,
/// or `system:unauthenticated`, is there already).
fn with_authenticated(name: String, mut groups: Vec<String>) -> User {
    if !groups
        .iter()
        .any(|g| g == ALL_AUTHENTICATED || g == ALL_UNAUTHENTICATED)
    {
        groups.push(ALL_AUTHENTICATED.into());
    }
    User {
        name,
        groups,
        ..User::default()
    }
}

/// The token of `Authorization: Bearer <token>` (scheme case-insensitive);
/// none for another scheme or an empty token, as upstream.
pub(crate) fn bearer_token(head: &RequestHead) -> Option<&str> {
    let value = head.header("authorization")?.trim();
    let mut parts = value.splitn(3, ' ');
    let scheme = parts.next()?;
    let token = parts.next()?;
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

/// The WebSocket subprotocol that carries a bearer token (browsers cannot
/// set an Authorization header on a WebSocket).
const TOKEN_PROTOCOL_PREFIX: &str = "base64url.bearer.authorization.k8s.io.";
const PROTOCOL_HEADER: &str = "sec-websocket-protocol";

/// The token of a `base64url.bearer.authorization.k8s.io.<token>`
/// WebSocket subprotocol, as upstream reads it: at most one, unpadded
/// base64url of UTF-8, and another subprotocol beside it (the one the
/// server will answer with).
fn protocol_token(head: &RequestHead) -> Result<Option<String>, AuthError> {
    let bad = |what: &str| Err(AuthError::TokenProtocol(what.to_string()));
    let (mut token, mut others) = (None, 0);
    let protocols = head
        .headers
        .iter()
        .filter(|(n, _)| n.eq_ignore_ascii_case(PROTOCOL_HEADER))
        .flat_map(|(_, v)| v.split(','))
        .map(str::trim);
    for protocol in protocols {
        let Some(encoded) = protocol.strip_prefix(TOKEN_PROTOCOL_PREFIX) else {
            others += 1;
            continue;
        };
        if token.is_some() {
            return bad("more than one token subprotocol");
        }
        let Ok(bytes) = base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(encoded) else {
            return bad("the token is not unpadded base64url");
        };
        let Ok(text) = String::from_utf8(bytes) else {
            return bad("the token is not UTF-8");
        };
        token = Some(text);
    }
    match token {
        Some(t) if t.is_empty() => Ok(None),
        Some(_) if others == 0 => bad("no other subprotocol beside the token"),
        t => Ok(t),
    }
}

/// Removes the bearer token subprotocol from the request's
/// `Sec-WebSocket-Protocol` headers, as upstream does once the token
/// authenticated the request: the session is relayed to the runtime
/// without the caller's token.
pub(crate) fn strip_token_protocol(head: &mut RequestHead) {
    head.headers.retain_mut(|(name, value)| {
        if !name.eq_ignore_ascii_case(PROTOCOL_HEADER) {
            return true;
        }
        let kept: Vec<&str> = value
            .split(',')
            .map(str::trim)
            .filter(|p| !p.is_empty() && !p.starts_with(TOKEN_PROTOCOL_PREFIX))
            .collect();
        *value = kept.join(",");
        !value.is_empty()
    });
}

/// The user of a TokenReview answer: Some for an authenticated token, None
/// for a refused one; Err for an answer that says neither (its `error`, or
/// a field of the wrong type), which is not cached.
fn token_review_user(answer: &Value) -> Result<Option<User>, String> {
    let status = answer
        .get("status")
        .filter(|s| s.is_object())
        .ok_or("the answer has no status")?;
    let authenticated = match status.get("authenticated") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(v) => {
            return Err(format!(
                "status.authenticated: expected a boolean, found {v}"
            ))
        }
    };
    if !authenticated {
        return match status.get("error").and_then(Value::as_str) {
            Some(e) if !e.is_empty() => Err(format!("status.error: {e}")),
            _ => Ok(None),
        };
    }
    let user = status.get("user").unwrap_or(&Value::Null);
    let name = match user.get("username") {
        Some(Value::String(s)) if !s.is_empty() => s.clone(),
        Some(v) => return Err(format!("status.user.username: expected a name, found {v}")),
        None => return Err("status.user.username: missing".into()),
    };
    let groups = match user.get("groups") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(items)) => {
            let mut groups = Vec::with_capacity(items.len());
            for (i, g) in items.iter().enumerate() {
                let g = g.as_str().ok_or_else(|| {
                    format!("status.user.groups[{i}]: expected a string, found {g}")
                })?;
                groups.push(g.to_string());
            }
            groups
        }
        Some(v) => return Err(format!("status.user.groups: expected a list, found {v}")),
    };
    let uid = match user.get("uid") {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(s)) => s.clone(),
        Some(v) => return Err(format!("status.user.uid: expected a string, found {v}")),
    };
    let mut extra = BTreeMap::new();
    match user.get("extra") {
        None | Some(Value::Null) => {}
        Some(Value::Object(map)) => {
            for (key, values) in map {
                let at = format!("status.user.extra[{key:?}]");
                let values = match values {
                    Value::Null => Vec::new(),
                    Value::Array(items) => items
                        .iter()
                        .map(|v| {
                            v.as_str().map(str::to_string).ok_or_else(|| {
                                format!("{at}: expected a list of strings, found {values}")
                            })
                        })
                        .collect::<Result<Vec<_>, _>>()?,
                    v => return Err(format!("{at}: expected a list of strings, found {v}")),
                };
                extra.insert(key.clone(), values);
            }
        }
        Some(v) => return Err(format!("status.user.extra: expected a map, found {v}")),
    }
    let mut user = with_authenticated(name, groups);
    user.uid = uid;
    user.extra = extra;
    Ok(Some(user))
}

/// (allowed, reason) of a SubjectAccessReview answer. Neither allowed nor
/// denied is no opinion, which refuses the request as upstream's kubelet
/// does.
fn access_review_status(answer: &Value) -> Result<(bool, String), String> {
    let status = answer
        .get("status")
        .filter(|s| s.is_object())
        .ok_or("the answer has no status")?;
    let allowed = match status.get("allowed") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(v) => return Err(format!("status.allowed: expected a boolean, found {v}")),
    };
    let reason = status
        .get("reason")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let error = status
        .get("evaluationError")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let reason = match (reason.is_empty(), error.is_empty()) {
        (_, true) => reason.to_string(),
        (true, false) => error.to_string(),
        (false, false) => format!("{reason} ({error})"),
    };
    Ok((allowed, reason))
}

/// The verb and the `nodes` subresource of a request, as upstream's
/// kubelet maps them (v1.20). The verb comes from the method by
/// upstream's table, which has no entry for HEAD or other methods (their
/// verb is empty, so only a `*` rule allows them); the subresource is the
/// route's ([`Route::subresource`]).
///
/// One deviation: `/exec`, `/attach`, `/portForward` and `/run` always ask
/// `create`, whatever the method. Upstream's kubelet maps by method only,
/// so a WebSocket exec (an upgrade GET, kubectl's default since 1.30) is
/// authorized as `get` on `nodes/proxy`: a grant monitoring agents commonly
/// hold for `/metrics` and `/pods` then runs commands in every container
/// of the node (upstream documents `nodes/proxy` `get` as not read-only; a
/// change to ask `create` there was proposed and not merged). The
/// apiserver has asked `create` for WebSocket upgrades to `pods/exec`,
/// `pods/attach` and `pods/portforward` since 1.35
/// (`AuthorizePodWebsocketUpgradeCreatePermission`); the node does the
/// same for its own paths. kubectl through the apiserver is unaffected:
/// the apiserver's kubelet client holds `create` on `nodes/proxy`.
pub(crate) fn attributes(method: &str, route: Route) -> (&'static str, &'static str) {
    let verb = match method {
        _ if route.always_creates() => "create",
        "POST" => "create",
        "GET" => "get",
        "PUT" => "update",
        "PATCH" => "patch",
        "DELETE" => "delete",
        _ => "",
    };
    (verb, route.subresource())
}

// ---------------------------------------------------------------------------
// Caches

/// A map whose entries expire, bounded: when full, the oldest entry
/// (by insertion) makes room for a new one.
pub struct TtlCache<K, V> {
    entries: HashMap<K, (u64, Instant, V)>,
    /// Insertion order: sequence number to key.
    order: BTreeMap<u64, K>,
    next: u64,
    cap: usize,
}

impl<K: Hash + Eq + Clone, V: Clone> TtlCache<K, V> {
    pub(crate) fn new(cap: usize) -> Self {
        TtlCache {
            entries: HashMap::new(),
            order: BTreeMap::new(),
            next: 0,
            cap: cap.max(1),
        }
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The value of `key` unless it expired by `now` (then it is dropped).
    pub(crate) fn get(&mut self, key: &K, now: Instant) -> Option<V> {
        let (seq, expires, value) = self.entries.get(key)?;
        if now < *expires {
            return Some(value.clone());
        }
        let seq = *seq;
        self.entries.remove(key);
        self.order.remove(&seq);
        None
    }

    pub(crate) fn insert(&mut self, key: K, value: V, expires: Instant) {
        if let Some((seq, _, _)) = self.entries.remove(&key) {
            self.order.remove(&seq);
        }
        while self.entries.len() >= self.cap {
            let Some((_, oldest)) = self.order.pop_first() else {
                break;
            };
            self.entries.remove(&oldest);
        }
        let seq = self.next;
        self.next += 1;
        self.order.insert(seq, key.clone());
        self.entries.insert(key, (seq, expires, value));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attrs(h: &RequestHead) -> (&'static str, &'static str) {
        attributes(&h.method, Route::of(h))
    }

    fn head(method: &str, target: &str) -> RequestHead {
        RequestHead {
            method: method.into(),
            target: target.into(),
            headers: Vec::new(),
        }
    }

    /// A self-signed certificate's DER with this subject, made by openssl.
    fn cert(subject: &str) -> Vec<u8> {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("c.der");
        let status = std::process::Command::new("openssl")
            .args(["req", "-x509", "-utf8", "-nodes", "-days", "1"])
            .args(["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"])
            .arg("-keyout")
            .arg(dir.path().join("k.pem"))
            .args(["-subj", subject, "-outform", "DER", "-out"])
            .arg(&out)
            .stderr(std::process::Stdio::null())
            .status()
            .expect("run openssl");
        assert!(status.success(), "openssl req -subj {subject}");
        std::fs::read(out).unwrap()
    }

    #[test]
    fn subject_gives_the_common_name_and_organizations_in_order() {
        let der = cert("/O=system:masters/CN=apiserver-kubelet-client/O=dev team");
        assert_eq!(
            subject(&der).unwrap(),
            (
                Some("apiserver-kubelet-client".to_string()),
                vec!["system:masters".to_string(), "dev team".to_string()]
            )
        );
        let der = cert("/CN=jürgen/OU=not a group");
        assert_eq!(subject(&der).unwrap(), (Some("jürgen".to_string()), vec![]));
        // No CN: the certificate names no user.
        let der = cert("/O=only-a-group");
        assert_eq!(subject(&der).unwrap(), (None, vec!["only-a-group".into()]));

        let auth = Auth::new(AuthConfig::default(), None);
        let der = cert("/CN=alice/O=ops");
        let user = auth
            .authenticate(Some(&der), &head("GET", "/pods"))
            .unwrap();
        assert_eq!(
            user,
            Some(User {
                name: "alice".into(),
                groups: vec!["ops".into(), ALL_AUTHENTICATED.into()],
                ..User::default()
            })
        );
        let der = cert("/O=ops");
        assert_eq!(auth.authenticate(Some(&der), &head("GET", "/")), Ok(None));
    }

    #[test]
    fn malformed_certificates_are_errors_never_panics() {
        let der = cert("/CN=alice/O=ops");
        // Every truncation, and every single-byte corruption of the part
        // before and in the subject: an error or some subject, no panic.
        for n in 0..der.len() {
            assert!(subject(&der[..n]).is_err(), "truncated at {n}");
        }
        for i in 0..der.len().min(400) {
            for x in [0x00, 0x80, 0x84, 0xff, 0x1f] {
                let mut bad = der.clone();
                bad[i] ^= x;
                let _ = subject(&bad);
            }
        }
        for garbage in [
            &b""[..],
            &[0x30],
            &[0x30, 0x80, 0, 0],
            &[0x30, 0x85, 1, 1, 1, 1, 1],
            &[0x30, 0x84, 0xff, 0xff, 0xff, 0xff],
            &[0x30, 0x02, 0x30, 0x00],
            b"-----BEGIN CERTIFICATE-----",
        ] {
            assert!(subject(garbage).is_err(), "{garbage:?}");
        }
        let auth = Auth::new(AuthConfig::default(), None);
        let e = auth
            .authenticate(Some(&der[..der.len() / 2]), &head("GET", "/pods"))
            .unwrap_err();
        assert!(matches!(e, AuthError::Certificate(_)), "{e}");
    }

    #[test]
    fn every_upstream_path_maps_to_its_subresource() {
        for (path, want) in [
            ("/stats/summary", "stats"),
            ("/stats", "stats"),
            ("/stats/", "stats"),
            ("/stats/container", "stats"),
            ("/statsfoo", "proxy"),
            ("/metrics", "metrics"),
            ("/metrics/cadvisor", "metrics"),
            ("/metrics/probes", "metrics"),
            ("/metrics/resource", "metrics"),
            ("/metricsx", "proxy"),
            ("/logs/", "log"),
            ("/logs", "log"),
            ("/logs/syslog", "log"),
            ("/spec/", "spec"),
            ("/spec", "spec"),
            ("/containerLogs/ns/pod/c", "proxy"),
            ("/exec/ns/pod/c", "proxy"),
            ("/attach/ns/pod/c", "proxy"),
            ("/portForward/ns/pod", "proxy"),
            ("/run/ns/pod/c", "proxy"),
            ("/pods", "proxy"),
            ("/runningpods/", "proxy"),
            ("/healthz", "proxy"),
            ("/configz", "proxy"),
            ("/debug/pprof/", "proxy"),
            ("/", "proxy"),
            // Decoded as Go's URL.Path; the query is not the path.
            ("/%73tats/summary", "stats"),
            ("/pods?x=/stats/", "proxy"),
            ("/metrics?x=1", "metrics"),
        ] {
            assert_eq!(attrs(&head("GET", path)).1, want, "{path}");
        }
    }

    #[test]
    fn verbs_follow_upstreams_method_table() {
        for (method, want) in [
            ("GET", "get"),
            ("POST", "create"),
            ("PUT", "update"),
            ("PATCH", "patch"),
            ("DELETE", "delete"),
            // Upstream's table has no HEAD or OPTIONS: no verb.
            ("HEAD", ""),
            ("OPTIONS", ""),
            ("get", ""),
        ] {
            assert_eq!(attrs(&head(method, "/pods")).0, want, "{method}");
            assert_eq!(
                attrs(&head(method, "/containerLogs/a/b/c")).0,
                want,
                "{method}"
            );
        }
    }

    #[test]
    fn exec_attach_port_forward_and_run_always_ask_create() {
        for path in [
            "/exec/ns/pod/c?command=sh",
            "/exec/ns/pod/uid/c",
            "/attach/ns/pod/c",
            "/portForward/ns/pod",
            "/run/ns/pod/c",
            "/exec",
            // Decoded as Go's URL.Path.
            "/%65xec/ns/pod/c",
        ] {
            // A WebSocket upgrade is a GET; SPDY's a POST.
            for method in ["GET", "POST", "HEAD", "OPTIONS", "PUT"] {
                assert_eq!(
                    attrs(&head(method, path)),
                    ("create", "proxy"),
                    "{method} {path}"
                );
            }
        }
        for (path, want) in [
            ("/execute", "get"),
            ("/runningpods/", "get"),
            ("/pods/exec", "get"),
            ("/stats/exec", "get"),
        ] {
            assert_eq!(attrs(&head("GET", path)).0, want, "{path}");
        }
    }

    #[test]
    fn bearer_tokens_as_upstream_reads_the_header() {
        let with = |v: &str| RequestHead {
            headers: vec![("Authorization".into(), v.into())],
            ..head("GET", "/pods")
        };
        assert_eq!(bearer_token(&with("Bearer abc")), Some("abc"));
        assert_eq!(bearer_token(&with("  bearer abc  ")), Some("abc"));
        assert_eq!(bearer_token(&with("Bearer abc def")), Some("abc"));
        assert_eq!(bearer_token(&with("Bearer  abc")), None);
        assert_eq!(bearer_token(&with("Bearer")), None);
        assert_eq!(bearer_token(&with("Basic YTpi")), None);
        assert_eq!(bearer_token(&head("GET", "/")), None);

        // Without the token webhook a token is not a credential; anonymous
        // only when enabled.
        let auth = Auth::new(AuthConfig::default(), None);
        assert_eq!(auth.authenticate(None, &with("Bearer abc")), Ok(None));
        assert_eq!(auth.anonymous(), None);
        let auth = Auth::new(
            AuthConfig {
                anonymous: true,
                ..AuthConfig::default()
            },
            None,
        );
        let anon = auth.anonymous().unwrap();
        assert_eq!(
            (anon.name.as_str(), anon.groups.as_slice()),
            ("system:anonymous", &[ALL_UNAUTHENTICATED.to_string()][..])
        );
    }

    #[test]
    fn websocket_token_subprotocols_as_upstream_reads_them() {
        let with = |values: &[&str]| RequestHead {
            headers: values
                .iter()
                .map(|v| ("Sec-WebSocket-Protocol".to_string(), v.to_string()))
                .collect(),
            ..head("GET", "/exec/ns/p/c")
        };
        // "tok-1" in unpadded base64url.
        let p = "base64url.bearer.authorization.k8s.io.dG9rLTE";
        assert_eq!(
            protocol_token(&with(&[&format!("v4.channel.k8s.io, {p}")])),
            Ok(Some("tok-1".into()))
        );
        assert_eq!(
            protocol_token(&with(&[p, "channel.k8s.io"])),
            Ok(Some("tok-1".into()))
        );
        assert_eq!(protocol_token(&with(&["v4.channel.k8s.io"])), Ok(None));
        assert_eq!(protocol_token(&head("GET", "/")), Ok(None));
        assert_eq!(
            protocol_token(&with(&["x, base64url.bearer.authorization.k8s.io."])),
            Ok(None)
        );
        for bad in [
            vec![p],
            vec!["x", p, p],
            vec!["x, base64url.bearer.authorization.k8s.io.dG9rLTE="],
            vec!["x, base64url.bearer.authorization.k8s.io.!!"],
            // 0xff is not UTF-8.
            vec!["x, base64url.bearer.authorization.k8s.io._w"],
        ] {
            assert!(
                matches!(
                    protocol_token(&with(&bad)),
                    Err(AuthError::TokenProtocol(_))
                ),
                "{bad:?}"
            );
        }

        let mut h = with(&[&format!("v4.channel.k8s.io, {p}"), p]);
        h.headers.push(("Upgrade".into(), "websocket".into()));
        strip_token_protocol(&mut h);
        assert_eq!(
            h.headers,
            [
                (
                    "Sec-WebSocket-Protocol".to_string(),
                    "v4.channel.k8s.io".to_string()
                ),
                ("Upgrade".to_string(), "websocket".to_string())
            ]
        );

        // Without the token webhook the subprotocol is not a credential.
        let auth = Auth::new(AuthConfig::default(), None);
        assert_eq!(auth.authenticate(None, &with(&[p])), Ok(None));
    }

    #[test]
    fn token_review_answers_are_read_strictly() {
        let user = |v: Value| token_review_user(&v);
        assert_eq!(
            user(json!({"status": {"authenticated": true,
                "user": {"username": "sa", "groups": ["system:serviceaccounts"]}}})),
            Ok(Some(User {
                name: "sa".into(),
                groups: vec!["system:serviceaccounts".into(), ALL_AUTHENTICATED.into()],
                ..User::default()
            }))
        );
        // A bound token's uid and extra come with the user.
        let scoped = user(json!({"status": {"authenticated": true, "user": {
            "username": "system:serviceaccount:ns:sa", "uid": "u-1",
            "extra": {"authentication.kubernetes.io/pod-name": ["web"],
                      "authentication.kubernetes.io/node-name": ["edge-1"], "empty": null}}}}))
        .unwrap()
        .unwrap();
        assert_eq!(scoped.uid, "u-1");
        assert_eq!(
            scoped.extra,
            BTreeMap::from([
                (
                    "authentication.kubernetes.io/node-name".to_string(),
                    vec!["edge-1".to_string()]
                ),
                (
                    "authentication.kubernetes.io/pod-name".to_string(),
                    vec!["web".to_string()]
                ),
                ("empty".to_string(), vec![]),
            ])
        );
        assert_eq!(
            user(json!({"status": {"authenticated": true,
                "user": {"username": "x", "groups": [ALL_AUTHENTICATED]}}}))
            .unwrap()
            .unwrap()
            .groups,
            [ALL_AUTHENTICATED]
        );
        assert_eq!(user(json!({"status": {"user": {}}})), Ok(None));
        assert_eq!(user(json!({"status": {"authenticated": false}})), Ok(None));
        for bad in [
            json!({}),
            json!([]),
            json!({"status": "yes"}),
            json!({"status": {"authenticated": "true"}}),
            json!({"status": {"authenticated": false, "error": "webhook down"}}),
            json!({"status": {"authenticated": true}}),
            json!({"status": {"authenticated": true, "user": {"username": ""}}}),
            json!({"status": {"authenticated": true, "user": {"username": "u", "groups": "g"}}}),
            json!({"status": {"authenticated": true, "user": {"username": "u", "groups": [1]}}}),
            json!({"status": {"authenticated": true, "user": {"username": "u", "uid": 7}}}),
            json!({"status": {"authenticated": true, "user": {"username": "u", "extra": ["a"]}}}),
            json!({"status": {"authenticated": true, "user": {"username": "u", "extra": {"k": "v"}}}}),
            json!({"status": {"authenticated": true, "user": {"username": "u", "extra": {"k": [1]}}}}),
        ] {
            assert!(user(bad.clone()).is_err(), "{bad}");
        }

        let status = |v: Value| access_review_status(&v);
        assert_eq!(
            status(json!({"status": {"allowed": true, "reason": "r"}})),
            Ok((true, "r".into()))
        );
        assert_eq!(
            status(json!({"status": {"allowed": false, "denied": true}})),
            Ok((false, String::new()))
        );
        assert_eq!(status(json!({"status": {}})), Ok((false, String::new())));
        assert!(status(json!({"status": {"allowed": "true"}})).is_err());
        assert!(status(json!({"kind": "Status"})).is_err());
    }

    #[test]
    fn authorization_without_webhook_allows_only_when_asked() {
        let user = User {
            name: "u".into(),
            ..User::default()
        };
        let cfg = |mode| AuthConfig {
            mode,
            ..AuthConfig::default()
        };
        let allow = Auth::new(cfg(Some(AuthorizationMode::AlwaysAllow)), None);
        let d = allow
            .authorize(&user, &head("POST", "/exec/a/b/c"))
            .unwrap();
        assert!(d.allowed);
        assert_eq!(
            (d.verb.as_str(), d.resource.as_str(), d.subresource.as_str()),
            ("create", "nodes", "proxy")
        );
        let none = Auth::new(cfg(None), None);
        assert!(
            !none
                .authorize(&user, &head("GET", "/pods"))
                .unwrap()
                .allowed
        );
        // Webhook without a client: an error, not an answer.
        let webhook = Auth::new(cfg(Some(AuthorizationMode::Webhook)), None);
        assert!(webhook.authorize(&user, &head("GET", "/pods")).is_err());
        assert_eq!(
            AuthorizationMode::parse("Webhook"),
            Ok(AuthorizationMode::Webhook)
        );
        assert!(AuthorizationMode::parse("RBAC").is_err());
    }

    #[test]
    fn cache_entries_expire_at_their_deadline() {
        let t0 = Instant::now();
        let mut c = TtlCache::new(8);
        c.insert("a", 1, t0 + Duration::from_secs(120));
        c.insert("b", 2, t0 + Duration::from_secs(30));
        assert_eq!(c.get(&"a", t0 + Duration::from_secs(119)), Some(1));
        assert_eq!(c.get(&"b", t0 + Duration::from_secs(29)), Some(2));
        assert_eq!(c.get(&"b", t0 + Duration::from_secs(30)), None);
        assert_eq!(c.len(), 1);
        assert_eq!(c.get(&"a", t0 + Duration::from_secs(120)), None);
        assert!(c.is_empty());
        // Inserting again renews an entry.
        c.insert("a", 3, t0 + Duration::from_secs(200));
        assert_eq!(c.get(&"a", t0 + Duration::from_secs(150)), Some(3));
    }

    #[test]
    fn a_ttl_of_any_length_gives_a_deadline() {
        let now = Instant::now();
        let year = Duration::from_secs(365 * 24 * 3600);
        assert_eq!(deadline(now, Duration::MAX), now + year);
        assert_eq!(deadline(now, Duration::from_secs(u64::MAX)), now + year);
        assert_eq!(
            deadline(now, Duration::from_secs(30)),
            now + Duration::from_secs(30)
        );
    }

    #[test]
    fn a_full_cache_drops_its_oldest_entry() {
        let far = Instant::now() + Duration::from_secs(3600);
        let mut c = TtlCache::new(3);
        for k in 0..3 {
            c.insert(k, k, far);
        }
        // Re-inserting 0 makes it the newest; 1 is now the oldest.
        c.insert(0, 10, far);
        c.insert(3, 3, far);
        assert_eq!(c.len(), 3);
        assert_eq!(c.get(&1, Instant::now()), None);
        assert_eq!(c.get(&0, Instant::now()), Some(10));
        for k in 4..10_000 {
            c.insert(k, k, far);
        }
        assert_eq!(c.len(), 3);
        assert_eq!(c.order.len(), 3);
        assert_eq!(c.get(&9_999, Instant::now()), Some(9_999));
        assert_eq!(c.get(&9_996, Instant::now()), None);
    }
}
