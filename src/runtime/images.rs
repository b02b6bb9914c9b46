//! Images (upstream `pkg/kubelet/images` and the pull-secret part of
//! `credentialprovider`): whether a container's image is pulled under its
//! imagePullPolicy, the per-pod image pull back-off, the registry token
//! bucket (`--registry-qps`/`--registry-burst`), the serialized puller
//! (`--serialize-image-pulls`), and the keyring that turns a pod's
//! imagePullSecrets into CRI `AuthConfig`s matched by registry host.
//!
//! `ImageManager::ensure_image` runs on the pod's worker thread. With
//! serialized pulls one `image-puller` thread does every pull, one at a
//! time, and the worker waits for its answer; otherwise the worker pulls
//! itself. The token bucket and the back-off table are shared by all
//! workers; their locks are held for arithmetic only, never across a CRI
//! call.

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use base64::Engine;
use crossbeam_channel::{bounded, Sender};
use k8s_openapi::api::core::v1::{Container, Pod};
use log::{info, warn};
use parking_lot::Mutex;
use serde_json::Value;

use super::labels::{pod_full_name, pod_namespace, pod_uid};
use crate::cri::{api, CriError, ImageService};
use crate::events::{EventRecorder, EventType, ObjectRef};
use crate::volume::{Keys, ObjectSource};

/// Upstream's image pull back-off: 10 s doubling up to 5 min, per pod and image.
pub const PULL_BACKOFF_INITIAL: Duration = Duration::from_secs(10);
pub const PULL_BACKOFF_MAX: Duration = Duration::from_secs(300);
/// After a failed pull the pod is synced again this soon, so its status
/// moves from ErrImagePull to ImagePullBackOff (with the back-off's message)
/// instead of waiting for the back-off to end in ErrImagePull.
pub const PULL_FAILED_RESYNC: Duration = Duration::from_secs(1);
/// Pull requests queued for the serial puller (upstream's
/// `maxImagePullRequests`).
const SERIAL_QUEUE: usize = 10;

/// The secret keys upstream reads pull credentials from.
pub const DOCKER_CONFIG_JSON_KEY: &str = ".dockerconfigjson";
pub const DOCKER_CFG_KEY: &str = ".dockercfg";

/// The registry Docker Hub's legacy credentials are stored under.
const DEFAULT_REGISTRY_HOST: &str = "index.docker.io";

/// `--serialize-image-pulls`, `--registry-qps`, `--registry-burst`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ImageOptions {
    /// One pull at a time across all pods (upstream default true).
    pub serialize_pulls: bool,
    /// Pulls per second; 0: unlimited (upstream default 5).
    pub registry_qps: f32,
    /// Pulls allowed in a burst when `registry_qps` > 0 (upstream default 10).
    pub registry_burst: u32,
}

impl Default for ImageOptions {
    fn default() -> Self {
        ImageOptions {
            serialize_pulls: true,
            registry_qps: 5.0,
            registry_burst: 10,
        }
    }
}

// ---- pull policy ----------------------------------------------------------

/// The apiserver's default pull policy: Always when the tag is `latest`
/// (given or implied), IfNotPresent otherwise (another tag, a digest, or a
/// name that does not parse).
pub fn default_pull_policy(image: &str) -> &'static str {
    match parse_image_name(image) {
        Ok(r) if r.tag == "latest" => "Always",
        _ => "IfNotPresent",
    }
}

/// The container's imagePullPolicy, defaulted from its image.
pub fn pull_policy(c: &Container) -> &str {
    match c.image_pull_policy.as_deref() {
        Some(p) if !p.is_empty() => p,
        _ => default_pull_policy(c.image.as_deref().unwrap_or("")),
    }
}

/// Whether to pull: Never never does, Always always does, IfNotPresent
/// (and anything else) when the image is missing.
pub fn should_pull(policy: &str, present: bool) -> bool {
    match policy {
        "Never" => false,
        "Always" => true,
        _ => !present,
    }
}

// ---- image references -----------------------------------------------------

/// A parsed image reference (upstream `parsers.ParseImageName`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageName {
    /// The normalized repository: `docker.io/library/busybox`.
    pub repo: String,
    /// The tag; `latest` when neither tag nor digest is given.
    pub tag: String,
    pub digest: String,
}

fn is_name_component(s: &str) -> bool {
    // [a-z0-9]+ separated by '.', '_', '__' or runs of '-'.
    let b = s.as_bytes();
    let alnum = |c: u8| c.is_ascii_lowercase() || c.is_ascii_digit();
    if b.is_empty() || !alnum(b[0]) || !alnum(b[b.len() - 1]) {
        return false;
    }
    let mut i = 0;
    while i < b.len() {
        if alnum(b[i]) {
            i += 1;
            continue;
        }
        let start = i;
        while i < b.len() && !alnum(b[i]) {
            i += 1;
        }
        let sep = &s[start..i];
        if !(sep == "." || sep == "_" || sep == "__" || sep.bytes().all(|c| c == b'-')) {
            return false;
        }
    }
    true
}

fn is_domain(s: &str) -> bool {
    let (host, port) = match s.rsplit_once(':') {
        Some((h, p)) if !h.starts_with('[') || h.ends_with(']') => (h, Some(p)),
        _ => (s, None),
    };
    if port.is_some_and(|p| p.is_empty() || !p.bytes().all(|c| c.is_ascii_digit())) {
        return false;
    }
    if let Some(v6) = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
        return !v6.is_empty() && v6.bytes().all(|c| c.is_ascii_hexdigit() || c == b':');
    }
    !host.is_empty()
        && host.split('.').all(|label| {
            let b = label.as_bytes();
            !b.is_empty()
                && b[0].is_ascii_alphanumeric()
                && b[b.len() - 1].is_ascii_alphanumeric()
                && b.iter().all(|c| c.is_ascii_alphanumeric() || *c == b'-')
        })
}

fn is_tag(s: &str) -> bool {
    let b = s.as_bytes();
    let word = |c: u8| c.is_ascii_alphanumeric() || c == b'_';
    !b.is_empty()
        && b.len() <= 128
        && word(b[0])
        && b.iter().all(|c| word(*c) || *c == b'.' || *c == b'-')
}

fn is_digest(s: &str) -> bool {
    let Some((alg, hex)) = s.split_once(':') else {
        return false;
    };
    !alg.is_empty()
        && alg.as_bytes()[0].is_ascii_alphabetic()
        && alg
            .bytes()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'+' | b'.'))
        && hex.len() >= 32
        && hex.bytes().all(|c| c.is_ascii_hexdigit())
}

/// Parses and normalizes an image reference the way Docker does: a first
/// component without `.` or `:` (and not `localhost`) is a Docker Hub path,
/// and Docker Hub names without a `/` live under `library/`.
pub fn parse_image_name(image: &str) -> Result<ImageName, String> {
    let bad =
        |why: &str| format!("couldn't parse image name {image:?}: invalid reference format{why}");
    let (rest, digest) = match image.split_once('@') {
        Some((r, d)) => (r, d),
        None => (image, ""),
    };
    if !digest.is_empty() && !is_digest(digest) {
        return Err(bad(""));
    }
    let (name, tag) = match rest.rsplit_once(':') {
        Some((n, t)) if !t.contains('/') => (n, t),
        _ => (rest, ""),
    };
    if (image.contains('@') && digest.is_empty()) || (rest.ends_with(':') && tag.is_empty()) {
        return Err(bad(""));
    }
    if !tag.is_empty() && !is_tag(tag) {
        return Err(bad(""));
    }
    let (domain, remainder) = match name.split_once('/') {
        Some((d, r))
            if d.contains('.') || d.contains(':') || d == "localhost" || d.to_lowercase() != d =>
        {
            (d, r.to_string())
        }
        _ => ("docker.io", name.to_string()),
    };
    let domain = if domain == DEFAULT_REGISTRY_HOST {
        "docker.io"
    } else {
        domain
    };
    let remainder = if domain == "docker.io" && !remainder.contains('/') {
        format!("library/{remainder}")
    } else {
        remainder
    };
    if remainder.to_lowercase() != remainder {
        return Err(bad(&format!(
            ": repository name ({remainder}) must be lowercase"
        )));
    }
    if !is_domain(domain) || !remainder.split('/').all(is_name_component) {
        return Err(bad(""));
    }
    let repo = format!("{domain}/{remainder}");
    if repo.len() > 255 {
        return Err(bad(
            ": repository name must not be more than 255 characters",
        ));
    }
    let tag = if tag.is_empty() && digest.is_empty() {
        "latest"
    } else {
        tag
    };
    Ok(ImageName {
        repo,
        tag: tag.to_string(),
        digest: digest.to_string(),
    })
}

/// The image as the runtime is asked for it: with `:latest` appended when
/// it names neither tag nor digest (the name itself stays short).
pub fn apply_default_tag(image: &str) -> Result<String, String> {
    let r = parse_image_name(image)?;
    if r.digest.is_empty() && !image.ends_with(&format!(":{}", r.tag)) {
        Ok(format!("{image}:{}", r.tag))
    } else {
        Ok(image.to_string())
    }
}

// ---- keyring --------------------------------------------------------------

/// One registry login from a docker config.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Credential {
    pub username: String,
    pub password: String,
}

impl Credential {
    /// The CRI form. The server address stays empty, as upstream sends it:
    /// the runtime then uses the login for the host the image is on.
    pub fn auth_config(&self) -> api::AuthConfig {
        let mut a = api::AuthConfig::new();
        a.username = self.username.clone();
        a.password = self.password.clone();
        a
    }
}

/// Registry logins by registry key (a host, or a host and path), matched
/// against an image's repository most specific first (upstream
/// `BasicDockerKeyring`).
#[derive(Debug, Default)]
pub struct Keyring {
    /// Keys, deduplicated, in reverse lexical order: `quay.io/coreos`
    /// before `quay.io`.
    index: Vec<String>,
    creds: HashMap<String, Vec<Credential>>,
}

/// The registry key of a docker config location: any scheme dropped, a
/// `/v1/` or `/v2/` path prefix dropped, the host alone when no path is left.
pub fn registry_key(location: &str) -> Option<String> {
    let rest = location
        .strip_prefix("https://")
        .or_else(|| location.strip_prefix("http://"))
        .unwrap_or(location);
    let rest = rest.split(['?', '#']).next().unwrap_or(rest);
    let (host, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, ""),
    };
    if host.bytes().any(|c| c.is_ascii_control() || c == b' ') || split_host_port(host).is_none() {
        return None;
    }
    let path = if path.starts_with("/v1/") || path.starts_with("/v2/") {
        &path[3..]
    } else {
        path
    };
    if path.is_empty() || path == "/" {
        Some(host.to_string())
    } else {
        Some(format!("{host}{path}"))
    }
}

/// `host[:port]` into host and port ("" without one); None for a port that
/// is not a number.
fn split_host_port(hostport: &str) -> Option<(&str, &str)> {
    if let Some(rest) = hostport.strip_prefix('[') {
        let (h, after) = rest.split_once(']')?;
        return match after.strip_prefix(':') {
            Some(p) if p.bytes().all(|c| c.is_ascii_digit()) => Some((h, p)),
            None if after.is_empty() => Some((h, "")),
            _ => None,
        };
    }
    match hostport.rsplit_once(':') {
        Some((h, p)) if !h.contains(':') => p.bytes().all(|c| c.is_ascii_digit()).then_some((h, p)),
        Some(_) => Some((hostport, "")),
        None => Some((hostport, "")),
    }
}

/// One element of a parsed host-label pattern.
#[derive(Debug, PartialEq)]
enum GlobToken {
    /// `*`: any run of characters other than `/`.
    Star,
    /// `?`: any one character other than `/`.
    Any,
    /// A character, given as is or escaped with `\`.
    Char(char),
    /// `[...]` or `[^...]`: inclusive ranges (a lone character is lo == hi).
    Class {
        negated: bool,
        ranges: Vec<(char, char)>,
    },
}

/// Parses a pattern with Go's `filepath.Match` syntax; None when it is
/// malformed (an unclosed or empty class, a `-` or `]` where a class
/// character belongs, a trailing `\`), which Go reports as ErrBadPattern.
fn parse_glob(pattern: &str) -> Option<Vec<GlobToken>> {
    /// A class character, `\` escapes included: Go's `getEsc`, which also
    /// wants something after it (the class's `]` at least).
    fn class_char(chars: &[char], i: &mut usize) -> Option<char> {
        let mut c = *chars.get(*i)?;
        if c == '-' || c == ']' {
            return None;
        }
        if c == '\\' {
            *i += 1;
            c = *chars.get(*i)?;
        }
        *i += 1;
        (*i < chars.len()).then_some(c)
    }
    let chars: Vec<char> = pattern.chars().collect();
    let mut tokens = Vec::new();
    let mut i = 0;
    while let Some(&c) = chars.get(i) {
        i += 1;
        let token = match c {
            '*' => GlobToken::Star,
            '?' => GlobToken::Any,
            '\\' => {
                let escaped = *chars.get(i)?;
                i += 1;
                GlobToken::Char(escaped)
            }
            '[' => {
                let negated = chars.get(i) == Some(&'^');
                if negated {
                    i += 1;
                }
                let mut ranges = Vec::new();
                loop {
                    if chars.get(i) == Some(&']') && !ranges.is_empty() {
                        i += 1;
                        break;
                    }
                    let lo = class_char(&chars, &mut i)?;
                    let hi = if chars.get(i) == Some(&'-') {
                        i += 1;
                        class_char(&chars, &mut i)?
                    } else {
                        lo
                    };
                    ranges.push((lo, hi));
                }
                GlobToken::Class { negated, ranges }
            }
            c => GlobToken::Char(c),
        };
        tokens.push(token);
    }
    Some(tokens)
}

/// Whether one (non-star) token takes the character `c`.
fn glob_token_matches(token: &GlobToken, c: char) -> bool {
    match token {
        GlobToken::Star => false,
        GlobToken::Any => c != '/',
        GlobToken::Char(p) => *p == c,
        GlobToken::Class { negated, ranges } => {
            ranges.iter().any(|&(lo, hi)| lo <= c && c <= hi) != *negated
        }
    }
}

/// Matches one host label against a pattern with Go's `filepath.Match`
/// semantics (upstream's `URLsMatch` uses it): `*`, `?`, `[a-z]`, `[^a]`,
/// `\x`; a malformed pattern matches nothing. Iterative, with only the
/// last `*` ever re-tried, so the time is at most pattern length times
/// text length: a key of many `*`s cannot hold a pod's worker.
fn glob_match(pattern: &str, text: &str) -> bool {
    let Some(tokens) = parse_glob(pattern) else {
        return false;
    };
    let text: Vec<char> = text.chars().collect();
    let (mut p, mut t) = (0, 0);
    // The last `*` seen and the text position it currently stops at.
    let mut star: Option<(usize, usize)> = None;
    while t < text.len() {
        match tokens.get(p) {
            Some(GlobToken::Star) => {
                star = Some((p, t));
                p += 1;
            }
            Some(token) if glob_token_matches(token, text[t]) => {
                p += 1;
                t += 1;
            }
            _ => {
                // Let the last `*` take one more character, if it may.
                let Some((star_p, star_t)) = star else {
                    return false;
                };
                if text[star_t] == '/' {
                    return false;
                }
                star = Some((star_p, star_t + 1));
                p = star_p + 1;
                t = star_t + 1;
            }
        }
    }
    tokens[p..].iter().all(|token| *token == GlobToken::Star)
}

/// Whether the registry key `glob` (host labels may hold wildcards) covers
/// the repository `target`: same port, same number of host labels, each
/// label matching, and the key's path a prefix of the target's.
pub fn urls_match(glob: &str, target: &str) -> bool {
    fn split(s: &str) -> Option<(Vec<&str>, &str, &str)> {
        let (hostport, path) = match s.find('/') {
            Some(i) => (&s[..i], &s[i..]),
            None => (s, ""),
        };
        let (host, port) = split_host_port(hostport)?;
        Some((host.split('.').collect(), port, path))
    }
    let (Some((g_parts, g_port, g_path)), Some((t_parts, t_port, t_path))) =
        (split(glob), split(target))
    else {
        return false;
    };
    g_port == t_port
        && g_parts.len() == t_parts.len()
        && t_path.starts_with(g_path)
        && g_parts.iter().zip(&t_parts).all(|(g, t)| glob_match(g, t))
}

/// Whether `repo` is on Docker Hub (whose logins may be stored under
/// `index.docker.io`).
fn is_default_registry_match(repo: &str) -> bool {
    match repo.split_once('/') {
        None => !repo.is_empty(),
        Some(("", _)) => false,
        Some((first, _)) => {
            first == "docker.io" || first == DEFAULT_REGISTRY_HOST || !first.contains(['.', ':'])
        }
    }
}

/// One docker config entry: `username`/`password`, or `auth`, which is
/// base64 of `username:password` and wins when present.
fn credential_of(entry: &Value, what: &str) -> Result<Credential, String> {
    let field = |k: &str| -> Result<String, String> {
        match entry.get(k) {
            None | Some(Value::Null) => Ok(String::new()),
            Some(Value::String(s)) => Ok(s.clone()),
            Some(other) => Err(format!("{what}: {k} is not a string: {other}")),
        }
    };
    let mut cred = Credential {
        username: field("username")?,
        password: field("password")?,
    };
    let auth = field("auth")?;
    if !auth.is_empty() {
        let trimmed = auth.trim();
        let decoded = if trimmed.ends_with('=') {
            base64::engine::general_purpose::STANDARD.decode(trimmed)
        } else {
            base64::engine::general_purpose::STANDARD_NO_PAD.decode(trimmed)
        }
        .map_err(|e| format!("{what}: auth is not base64: {e}"))?;
        let text = String::from_utf8_lossy(&decoded);
        let Some((u, p)) = text.split_once(':') else {
            return Err(format!(
                "{what}: auth must be formatted as base64(username:password)"
            ));
        };
        cred = Credential {
            username: u.to_string(),
            password: p.to_string(),
        };
    }
    Ok(cred)
}

impl Keyring {
    /// Adds the login for a docker config location; a location that is not
    /// a registry address is skipped with a warning, as upstream does.
    pub fn add(&mut self, location: &str, cred: Credential) {
        let Some(key) = registry_key(location) else {
            warn!("image pull secret entry {location:?} is not a registry address; ignoring it");
            return;
        };
        if !self.index.contains(&key) {
            self.index.push(key.clone());
            self.index.sort_by(|a, b| b.cmp(a));
        }
        self.creds.entry(key).or_default().push(cred);
    }

    /// Adds every entry of a docker config object (`{location: entry}`).
    pub fn add_config(&mut self, config: &Value, what: &str) -> Result<(), String> {
        let Some(map) = config.as_object() else {
            return Err(format!("{what}: not a JSON object"));
        };
        for (location, entry) in map {
            let cred = credential_of(entry, &format!("{what}: {location:?}"))?;
            self.add(location, cred);
        }
        Ok(())
    }

    /// The keyring of a pod's pull secrets, in the pod's order: each
    /// secret's `.dockerconfigjson` (`{"auths": {...}}`) or, lacking that,
    /// its `.dockercfg` (the bare map). Other secrets add nothing.
    pub fn from_secrets(secrets: &[(String, Keys)]) -> Result<Keyring, String> {
        let mut k = Keyring::default();
        for (name, data) in secrets {
            if let Some(bytes) = data.get(DOCKER_CONFIG_JSON_KEY).filter(|b| !b.is_empty()) {
                let what = format!("secret {name}: {DOCKER_CONFIG_JSON_KEY}");
                let v: Value = serde_json::from_slice(bytes).map_err(|e| format!("{what}: {e}"))?;
                match v.get("auths") {
                    None | Some(Value::Null) => {}
                    Some(auths) => k.add_config(auths, &format!("{what}: auths"))?,
                }
            } else if let Some(bytes) = data.get(DOCKER_CFG_KEY).filter(|b| !b.is_empty()) {
                let what = format!("secret {name}: {DOCKER_CFG_KEY}");
                let v: Value = serde_json::from_slice(bytes).map_err(|e| format!("{what}: {e}"))?;
                k.add_config(&v, &what)?;
            }
        }
        Ok(k)
    }

    /// Every login whose key covers `repo` (a normalized repository, e.g.
    /// `registry.example.com:5000/team/app`), most specific key first; when
    /// none does and the repository is on Docker Hub, the logins stored
    /// under `index.docker.io`.
    pub fn lookup(&self, repo: &str) -> Vec<Credential> {
        let mut out: Vec<Credential> = Vec::new();
        for key in &self.index {
            if urls_match(key, repo) {
                out.extend(self.creds[key].iter().cloned());
            }
        }
        if out.is_empty() && is_default_registry_match(repo) {
            if let Some(c) = self.creds.get(DEFAULT_REGISTRY_HOST) {
                out.extend(c.iter().cloned());
            }
        }
        out
    }
}

// ---- pull back-off ----------------------------------------------------------

#[derive(Debug, Clone)]
struct BackoffEntry {
    window: Duration,
    last_failure: Instant,
    /// `ErrImagePull: <message>` of the failure that opened the window.
    last_error: String,
}

/// Image pull back-off by `<pod uid>_<image>` (upstream `flowcontrol.Backoff`
/// without jitter): a failure opens a window of 10 s, each failure after
/// that doubles it up to 5 min; an entry quiet for twice the maximum starts
/// over. Instants are arguments so tests step a fake clock.
#[derive(Debug, Default)]
pub struct PullBackoff {
    entries: HashMap<String, BackoffEntry>,
}

impl PullBackoff {
    fn expired(e: &BackoffEntry, now: Instant) -> bool {
        now.saturating_duration_since(e.last_failure) > PULL_BACKOFF_MAX * 2
    }

    /// While `key` is backing off at `now`: the time left, the window and
    /// the error that opened it.
    pub fn in_backoff(&self, key: &str, now: Instant) -> Option<(Duration, Duration, &str)> {
        let e = self.entries.get(key)?;
        if Self::expired(e, now) {
            return None;
        }
        let since = now.saturating_duration_since(e.last_failure);
        e.window
            .checked_sub(since)
            .filter(|d| !d.is_zero())
            .map(|left| (left, e.window, e.last_error.as_str()))
    }

    /// Records a failed pull of `key` at `now`; returns the new window.
    pub fn failed(&mut self, key: &str, now: Instant, error: String) -> Duration {
        let window = match self.entries.get(key) {
            Some(e) if !Self::expired(e, now) => (e.window * 2).min(PULL_BACKOFF_MAX),
            _ => PULL_BACKOFF_INITIAL,
        };
        self.entries.insert(
            key.to_string(),
            BackoffEntry {
                window,
                last_failure: now,
                last_error: error,
            },
        );
        window
    }

    /// Drops entries quiet for twice the maximum.
    pub fn gc(&mut self, now: Instant) {
        self.entries.retain(|_, e| !Self::expired(e, now));
    }

    /// Forgets the keys of a pod that is gone.
    pub fn forget_pod(&mut self, uid: &str) {
        let prefix = format!("{uid}_");
        self.entries.retain(|k, _| !k.starts_with(&prefix));
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

// ---- registry token bucket -----------------------------------------------

/// A token bucket that refuses instead of waiting (upstream's throttled
/// image service: a pull beyond the rate fails with "pull QPS exceeded").
#[derive(Debug)]
pub struct PullBucket {
    qps: f64,
    burst: f64,
    tokens: f64,
    last: Instant,
}

impl PullBucket {
    /// None when `qps` is 0 (unlimited).
    pub fn new(qps: f32, burst: u32, now: Instant) -> Option<PullBucket> {
        if !(qps.is_finite() && qps > 0.0) {
            return None;
        }
        let burst = f64::from(burst.max(1));
        Some(PullBucket {
            qps: f64::from(qps),
            burst,
            tokens: burst,
            last: now,
        })
    }

    /// Takes a token if one is there at `now`.
    pub fn try_accept(&mut self, now: Instant) -> bool {
        let elapsed = now.saturating_duration_since(self.last);
        if now > self.last {
            self.last = now;
        }
        self.tokens = (self.tokens + elapsed.as_secs_f64() * self.qps).min(self.burst);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

// ---- the puller -------------------------------------------------------------

/// A CRI error the way the kubelet prints gRPC errors in events and status
/// (`rpc error: code = Unknown desc = ...`); other failures as they are.
pub fn go_error(e: &CriError) -> String {
    use crate::cri::Code as C;
    let Some(code) = e.code() else {
        return e.to_string();
    };
    let message = match e {
        CriError::Status { message, .. } => message.as_str(),
        _ => "",
    };
    let name = match code {
        C::Ok => "OK",
        C::Cancelled => "Canceled",
        C::InvalidArgument => "InvalidArgument",
        C::DeadlineExceeded => "DeadlineExceeded",
        C::NotFound => "NotFound",
        C::AlreadyExists => "AlreadyExists",
        C::PermissionDenied => "PermissionDenied",
        C::ResourceExhausted => "ResourceExhausted",
        C::FailedPrecondition => "FailedPrecondition",
        C::Aborted => "Aborted",
        C::OutOfRange => "OutOfRange",
        C::Unimplemented => "Unimplemented",
        C::Internal => "Internal",
        C::Unavailable => "Unavailable",
        C::DataLoss => "DataLoss",
        C::Unauthenticated => "Unauthenticated",
        C::Unknown | C::Other(_) => "Unknown",
    };
    format!("rpc error: code = {name} desc = {message}")
}

/// Several failures as one message, duplicates once, like upstream's
/// aggregate error: `a`, or `[a, b]`.
pub fn aggregate(errors: &[String]) -> String {
    let mut seen: Vec<&str> = Vec::new();
    for e in errors {
        if !seen.contains(&e.as_str()) {
            seen.push(e);
        }
    }
    match seen.as_slice() {
        [one] => one.to_string(),
        many => format!("[{}]", many.join(", ")),
    }
}

/// What one pull gave.
#[derive(Debug)]
struct Pulled {
    result: Result<(String, u64), String>,
    /// The pull itself, without the wait for the serial puller.
    took: Duration,
}

type Job = Box<dyn FnOnce() + Send>;

/// The `image-puller` thread of serialized pulls. `tx` is declared first so
/// it is dropped first: the thread's queue closes and it ends before the
/// join.
struct SerialQueue {
    tx: Sender<Job>,
    _thread: crate::thread::JoinOnDrop<()>,
}

impl SerialQueue {
    fn start() -> std::io::Result<SerialQueue> {
        // Capacity: a worker blocks on a full queue, which only adds to the
        // wait for its pull.
        let (tx, rx) = bounded::<Job>(SERIAL_QUEUE);
        let thread = crate::thread::spawn_named("image-puller", move || {
            for job in rx {
                job();
            }
        })?;
        Ok(SerialQueue {
            tx,
            _thread: thread,
        })
    }
}

/// Pulls through the token bucket, on the serial puller or the caller's thread.
struct Puller {
    images: Arc<dyn ImageService>,
    bucket: Option<Arc<Mutex<PullBucket>>>,
    serialize: bool,
    /// Started at the first pull; None when the thread could not start
    /// (pulls then run on the caller's thread).
    serial: OnceLock<Option<SerialQueue>>,
}

/// One pull with the credentials in order (none: anonymous), then the
/// image's size.
fn pull_now(
    images: &dyn ImageService,
    bucket: Option<&Mutex<PullBucket>>,
    spec: &api::ImageSpec,
    creds: &[api::AuthConfig],
    sandbox: &api::PodSandboxConfig,
) -> Pulled {
    let start = Instant::now();
    if let Some(b) = bucket {
        if !b.lock().try_accept(Instant::now()) {
            return Pulled {
                result: Err("pull QPS exceeded".into()),
                took: start.elapsed(),
            };
        }
    }
    let result = if creds.is_empty() {
        images
            .pull_image(spec, None, Some(sandbox))
            .map_err(|e| go_error(&e))
    } else {
        let mut errors = Vec::new();
        let mut ok = None;
        for auth in creds {
            match images.pull_image(spec, Some(auth), Some(sandbox)) {
                Ok(r) => {
                    ok = Some(r);
                    break;
                }
                Err(e) => errors.push(go_error(&e)),
            }
        }
        ok.ok_or_else(|| aggregate(&errors))
    };
    let result = result.map(|image_ref| {
        let size = match images.image_status(spec) {
            Ok(Some(img)) => img.size,
            _ => 0,
        };
        (image_ref, size)
    });
    Pulled {
        result,
        took: start.elapsed(),
    }
}

impl Puller {
    fn pull(
        &self,
        spec: &api::ImageSpec,
        creds: Vec<api::AuthConfig>,
        sandbox: &api::PodSandboxConfig,
    ) -> Pulled {
        let queue = if self.serialize {
            self.serial
                .get_or_init(|| match SerialQueue::start() {
                    Ok(q) => Some(q),
                    Err(e) => {
                        warn!("cannot start the image-puller thread ({e}); pulling on each pod's worker");
                        None
                    }
                })
                .as_ref()
        } else {
            None
        };
        let Some(queue) = queue else {
            return pull_now(
                self.images.as_ref(),
                self.bucket.as_deref(),
                spec,
                &creds,
                sandbox,
            );
        };
        let (reply_tx, reply_rx) = bounded(1);
        let images = self.images.clone();
        let bucket = self.bucket.clone();
        let spec = spec.clone();
        let sandbox = sandbox.clone();
        let job: Job = Box::new(move || {
            let p = pull_now(images.as_ref(), bucket.as_deref(), &spec, &creds, &sandbox);
            // The worker may have gone (tinylet stopping): nobody to tell.
            let _ = reply_tx.send(p);
        });
        let failed = |why: &str| Pulled {
            result: Err(why.to_string()),
            took: Duration::ZERO,
        };
        if queue.tx.send(job).is_err() {
            return failed("the image-puller thread has stopped");
        }
        reply_rx
            .recv()
            .unwrap_or_else(|_| failed("the image-puller thread has stopped"))
    }
}

// ---- the image manager ------------------------------------------------------

/// Why a container's image is not there: the waiting reason (ErrImagePull,
/// ImagePullBackOff, ErrImageNeverPull, InvalidImageName, ImageInspectError)
/// and message as upstream reports them, and when to try again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageError {
    pub reason: &'static str,
    pub message: String,
    /// Sync again after this long (a back-off); None: the usual retry.
    pub retry_after: Option<Duration>,
}

/// Go's printing of a duration truncated to milliseconds: `150ms`, `1.5s`,
/// `2m3.004s`.
pub fn go_millis(d: Duration) -> String {
    let ms = d.as_millis();
    if ms == 0 {
        return "0s".into();
    }
    if ms < 1000 {
        return format!("{ms}ms");
    }
    let frac = |ms: u128| {
        let s = format!("{:03}", ms % 1000);
        let s = s.trim_end_matches('0');
        if s.is_empty() {
            String::new()
        } else {
            format!(".{s}")
        }
    };
    let secs = ms / 1000;
    let (h, m, s) = (secs / 3600, (secs / 60) % 60, secs % 60);
    let tail = format!("{s}{}s", frac(ms));
    if h > 0 {
        format!("{h}h{m}m{tail}")
    } else if m > 0 {
        format!("{m}m{tail}")
    } else {
        tail
    }
}

pub struct ImageManager {
    images: Arc<dyn ImageService>,
    puller: Puller,
    backoff: Mutex<PullBackoff>,
    /// Where pull secrets are read; None on a standalone node.
    secrets: Option<Arc<dyn ObjectSource>>,
}

impl ImageManager {
    pub fn new(images: Arc<dyn ImageService>, opts: ImageOptions) -> Self {
        ImageManager {
            puller: Puller {
                images: images.clone(),
                bucket: PullBucket::new(opts.registry_qps, opts.registry_burst, Instant::now())
                    .map(|b| Arc::new(Mutex::new(b))),
                serialize: opts.serialize_pulls,
                serial: OnceLock::new(),
            },
            images,
            backoff: Mutex::new(PullBackoff::default()),
            secrets: None,
        }
    }

    /// Reads imagePullSecrets from `source` (the apiserver).
    pub fn set_secrets(&mut self, source: Arc<dyn ObjectSource>) {
        self.secrets = Some(source);
    }

    /// Forgets the back-off of a pod that is gone.
    pub fn forget_pod(&self, uid: &str) {
        self.backoff.lock().forget_pod(uid);
    }

    /// The pod's pull secrets that could be read, by `ns/name`; the names of
    /// those that could not are reported in an event and the log, and the
    /// pull goes on without them, as upstream.
    fn pull_secrets(&self, pod: &Pod, recorder: &EventRecorder) -> Vec<(String, Keys)> {
        let ns = pod_namespace(pod);
        let names: Vec<&str> = pod
            .spec
            .as_ref()
            .and_then(|s| s.image_pull_secrets.as_ref())
            .into_iter()
            .flatten()
            .map(|r| r.name.as_str())
            .filter(|n| !n.is_empty())
            .collect();
        let mut found = Vec::new();
        let mut failed: Vec<&str> = Vec::new();
        for name in names {
            let what = format!("{ns}/{name}");
            match &self.secrets {
                None => {
                    warn!(
                        "pod {}: image pull secret {what}: cannot be read on a standalone node (no --kubeconfig); pulling without it",
                        pod_full_name(pod)
                    );
                    failed.push(name);
                }
                Some(src) => match src.secret(ns, name) {
                    Ok(Some(data)) => found.push((what, data)),
                    Ok(None) => {
                        warn!(
                            "pod {}: image pull secret {what} not found; pulling without it",
                            pod_full_name(pod)
                        );
                        failed.push(name);
                    }
                    Err(e) => {
                        warn!(
                            "pod {}: image pull secret {what}: {e}; pulling without it",
                            pod_full_name(pod)
                        );
                        failed.push(name);
                    }
                },
            }
        }
        if !failed.is_empty() {
            recorder.event(
                &ObjectRef::pod(pod),
                EventType::Warning,
                "FailedToRetrieveImagePullSecret",
                format!(
                    "Unable to retrieve some image pull secrets ({}); attempting to pull the image may not succeed.",
                    failed.join(", ")
                ),
            );
        }
        found
    }

    /// Makes sure the container's image is there under its pull policy and
    /// returns the image reference to create the container from. Events go
    /// to `recorder` about `container` (and the pod, for pull secrets).
    pub fn ensure_image(
        &self,
        pod: &Pod,
        c: &Container,
        sandbox: &api::PodSandboxConfig,
        recorder: &EventRecorder,
        container: &ObjectRef,
    ) -> Result<String, ImageError> {
        let who = pod_full_name(pod);
        let requested = c.image.as_deref().unwrap_or("");
        let event = |kind, reason: &str, message: String| {
            recorder.event(container, kind, reason, message);
        };
        let image = match apply_default_tag(requested) {
            Ok(i) => i,
            Err(e) => {
                let message = format!("Failed to apply default image tag {requested:?}: {e}");
                event(EventType::Warning, "InspectFailed", message.clone());
                return Err(ImageError {
                    reason: "InvalidImageName",
                    message,
                    retry_after: None,
                });
            }
        };
        let mut spec = api::ImageSpec::new();
        spec.image = image.clone();
        let policy = pull_policy(c);
        let present = if policy == "Always" {
            None
        } else {
            match self.images.image_status(&spec) {
                Ok(img) => img,
                Err(e) => {
                    let message =
                        format!("Failed to inspect image {requested:?}: {}", go_error(&e));
                    event(EventType::Warning, "InspectFailed", message.clone());
                    return Err(ImageError {
                        reason: "ImageInspectError",
                        message,
                        retry_after: None,
                    });
                }
            }
        };
        if !should_pull(policy, present.is_some()) {
            if let Some(img) = present {
                event(
                    EventType::Normal,
                    "Pulled",
                    format!("Container image {requested:?} already present on machine"),
                );
                return Ok(if img.id.is_empty() { image } else { img.id });
            }
            let message =
                format!("Container image {requested:?} is not present with pull policy of Never");
            event(EventType::Warning, "ErrImageNeverPull", message.clone());
            return Err(ImageError {
                reason: "ErrImageNeverPull",
                message,
                retry_after: None,
            });
        }

        let key = format!("{}_{requested}", pod_uid(pod));
        let backing_off = self
            .backoff
            .lock()
            .in_backoff(&key, Instant::now())
            .map(|(left, _, last)| (left, last.to_string()));
        if let Some((left, last)) = backing_off {
            let msg = format!("Back-off pulling image {requested:?}");
            event(EventType::Normal, "BackOff", msg.clone());
            return Err(ImageError {
                reason: "ImagePullBackOff",
                message: format!("{msg}: {last}"),
                retry_after: Some(left),
            });
        }

        let fail = |message: String| {
            let window = self.backoff.lock().failed(
                &key,
                Instant::now(),
                format!("ErrImagePull: {message}"),
            );
            info!(
                "pod {who}: pulling image {requested:?} failed; back-off {}s",
                window.as_secs()
            );
            ImageError {
                reason: "ErrImagePull",
                message,
                retry_after: Some(PULL_FAILED_RESYNC),
            }
        };
        let secrets = self.pull_secrets(pod, recorder);
        let keyring = match Keyring::from_secrets(&secrets) {
            Ok(k) => k,
            Err(e) => {
                event(
                    EventType::Warning,
                    "Failed",
                    format!("Failed to pull image {requested:?}: {e}"),
                );
                return Err(fail(e));
            }
        };
        // `image` parsed above, so this cannot fail; the repository is what
        // logins are matched against.
        let repo = parse_image_name(&image).map(|r| r.repo).unwrap_or_default();
        let creds: Vec<api::AuthConfig> = keyring
            .lookup(&repo)
            .iter()
            .map(Credential::auth_config)
            .collect();

        info!(
            "pod {who}: pulling image {requested:?} ({} credential(s))",
            creds.len()
        );
        event(
            EventType::Normal,
            "Pulling",
            format!("Pulling image {requested:?}"),
        );
        let started = Instant::now();
        let pulled = self.puller.pull(&spec, creds, sandbox);
        match pulled.result {
            Ok((image_ref, size)) => {
                event(
                    EventType::Normal,
                    "Pulled",
                    format!(
                        "Successfully pulled image {requested:?} in {} ({} including waiting). Image size: {size} bytes.",
                        go_millis(pulled.took),
                        go_millis(started.elapsed())
                    ),
                );
                self.backoff.lock().gc(Instant::now());
                Ok(image_ref)
            }
            Err(e) => {
                let mut message = e;
                let named_secrets = pod
                    .spec
                    .as_ref()
                    .and_then(|s| s.image_pull_secrets.as_ref())
                    .is_some_and(|v| !v.is_empty());
                if self.secrets.is_none() && named_secrets {
                    message.push_str(
                        " (the pod's imagePullSecrets were not used: a standalone node without --kubeconfig cannot read secrets)",
                    );
                }
                event(
                    EventType::Warning,
                    "Failed",
                    format!("Failed to pull image {requested:?}: {message}"),
                );
                Err(fail(message))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn cred(u: &str) -> Credential {
        Credential {
            username: u.into(),
            password: format!("{u}-pw"),
        }
    }

    fn users(v: Vec<Credential>) -> Vec<String> {
        v.into_iter().map(|c| c.username).collect()
    }

    #[test]
    fn pull_policy_defaults_follow_the_tag() {
        assert_eq!(default_pull_policy("busybox"), "Always");
        assert_eq!(default_pull_policy("busybox:latest"), "Always");
        assert_eq!(
            default_pull_policy("docker.io/tinylet/busybox:1"),
            "IfNotPresent"
        );
        assert_eq!(default_pull_policy("localhost:5000/busybox"), "Always");
        assert_eq!(default_pull_policy("127.0.0.1:5000/a/b:v2"), "IfNotPresent");
        let digest = format!("busybox@sha256:{}", "a".repeat(64));
        assert_eq!(default_pull_policy(&digest), "IfNotPresent");
        let both = format!("busybox:latest@sha256:{}", "a".repeat(64));
        assert_eq!(default_pull_policy(&both), "Always");
        // A name that does not parse is not defaulted to Always.
        assert_eq!(default_pull_policy("Busy Box"), "IfNotPresent");
        let c = Container {
            image: Some("busybox".into()),
            image_pull_policy: Some("Never".into()),
            ..Default::default()
        };
        assert_eq!(pull_policy(&c), "Never");
    }

    #[test]
    fn policy_decisions() {
        assert!(should_pull("Always", true));
        assert!(should_pull("Always", false));
        assert!(!should_pull("IfNotPresent", true));
        assert!(should_pull("IfNotPresent", false));
        assert!(!should_pull("Never", true));
        assert!(!should_pull("Never", false));
    }

    #[test]
    fn image_names_normalize_like_docker() {
        let p = |s: &str| parse_image_name(s).unwrap();
        assert_eq!(p("busybox").repo, "docker.io/library/busybox");
        assert_eq!(p("busybox").tag, "latest");
        assert_eq!(p("tinylet/busybox:1").repo, "docker.io/tinylet/busybox");
        assert_eq!(
            p("index.docker.io/busybox").repo,
            "docker.io/library/busybox"
        );
        assert_eq!(p("localhost/app").repo, "localhost/app");
        let r = p("127.0.0.1:5000/test/busybox:1");
        assert_eq!(
            (r.repo.as_str(), r.tag.as_str()),
            ("127.0.0.1:5000/test/busybox", "1")
        );
        let d = format!("quay.io/coreos/etcd@sha256:{}", "0".repeat(64));
        let r = p(&d);
        assert_eq!((r.tag.as_str(), r.digest.len()), ("", 71));
        for bad in [
            "",
            "upper/Case",
            "a b",
            "busybox:",
            "busybox@sha256:12",
            "-x",
        ] {
            assert!(parse_image_name(bad).is_err(), "{bad:?} parsed");
        }
        assert_eq!(apply_default_tag("busybox").unwrap(), "busybox:latest");
        assert_eq!(
            apply_default_tag("localhost:5000/a").unwrap(),
            "localhost:5000/a:latest"
        );
        assert_eq!(apply_default_tag("a/b:1").unwrap(), "a/b:1");
        assert_eq!(apply_default_tag(&d).unwrap(), d);
    }

    #[test]
    fn registry_keys_drop_scheme_and_api_version() {
        let k = |s: &str| registry_key(s).unwrap();
        assert_eq!(k("https://index.docker.io/v1/"), "index.docker.io");
        assert_eq!(k("http://127.0.0.1:5000"), "127.0.0.1:5000");
        assert_eq!(k("registry.example.com/team"), "registry.example.com/team");
        assert_eq!(
            k("https://registry.example.com/v2/team"),
            "registry.example.com/team"
        );
        assert_eq!(k("*.example.com"), "*.example.com");
        assert_eq!(registry_key("host:port"), None);
    }

    #[test]
    fn url_matching_with_wildcards_ports_and_paths() {
        assert!(urls_match("example.com", "example.com/a/b"));
        assert!(urls_match("*.example.com", "registry.example.com/a"));
        assert!(
            !urls_match("*.example.com", "example.com/a"),
            "label count differs"
        );
        assert!(
            !urls_match("*.example.com", "a.b.example.com/a"),
            "label count differs"
        );
        assert!(urls_match("*.*.example.com", "a.b.example.com/x"));
        assert!(urls_match("reg?.example.com", "reg1.example.com/x"));
        assert!(urls_match("reg[0-9].example.com", "reg7.example.com/x"));
        assert!(!urls_match("reg[^0-9].example.com", "reg7.example.com/x"));
        assert!(
            !urls_match("reg[0-9.example.com", "reg7.example.com/x"),
            "malformed"
        );
        assert!(urls_match("127.0.0.1:5000", "127.0.0.1:5000/test/busybox"));
        assert!(!urls_match("127.0.0.1:5000", "127.0.0.1:5001/test/busybox"));
        assert!(
            !urls_match("127.0.0.1", "127.0.0.1:5000/test/busybox"),
            "ports must match"
        );
        assert!(urls_match("example.com/team", "example.com/team/app"));
        assert!(!urls_match("example.com/team", "example.com/other/app"));
        assert!(!urls_match("example.com", "example.org/a"));
    }

    #[test]
    fn glob_follows_go_filepath_match() {
        assert!(glob_match("", ""));
        assert!(!glob_match("", "a"));
        assert!(glob_match("*", ""));
        assert!(glob_match("a*", "abc"));
        assert!(glob_match("a*c", "abbbc"));
        assert!(glob_match("*c", "abc"));
        assert!(!glob_match("a*c", "abcd"));
        assert!(glob_match("a*b*c", "axxbyyc"));
        assert!(glob_match("a*b?c", "axbbyc"));
        assert!(!glob_match("a*", "a/b"), "a star stops at /");
        assert!(!glob_match("a?b", "a/b"), "? does not take /");
        assert!(glob_match("[a-c]x", "bx"));
        assert!(glob_match("[^a-c]x", "dx"));
        assert!(!glob_match("[^a-c]x", "ax"));
        assert!(glob_match("[ab0-9]", "7"));
        assert!(glob_match("[\\]]", "]"));
        assert!(glob_match("[\\-]", "-"));
        assert!(glob_match("\\*", "*"));
        assert!(!glob_match("\\*", "a"));
        assert!(glob_match("é?", "éa"), "? takes one character, not a byte");
        // Patterns Go's filepath.Match calls malformed never match, even
        // where the text would.
        for bad in [
            "[", "[]", "[]a]", "[^]", "[a-]", "[-a]", "a\\", "[a", "[a-\\", "*[",
        ] {
            assert!(parse_glob(bad).is_none(), "{bad:?} is malformed");
            assert!(!glob_match(bad, "a"), "{bad:?}");
            assert!(!glob_match(bad, ""), "{bad:?}");
        }
    }

    #[test]
    fn many_stars_against_a_long_host_finish() {
        // A backtracking matcher takes exponential time on these; this one
        // must simply return (no time is asserted).
        let host = "a".repeat(250);
        let stars = "*".repeat(20);
        assert!(!glob_match(&format!("{stars}b"), &host));
        assert!(!glob_match(&format!("{}b", "*a".repeat(20)), &host));
        assert!(glob_match(&format!("{stars}a"), &host));
        let key = format!("{stars}b.example.com");
        let target = format!("{host}.example.com/app");
        assert!(!urls_match(&key, &target));
        let mut k = Keyring::default();
        k.add(&key, cred("stars"));
        k.add(&format!("{stars}.example.com"), cred("match"));
        assert_eq!(users(k.lookup(&target)), ["match"]);
    }

    #[test]
    fn lookup_is_most_specific_first_then_docker_hub_fallback() {
        let mut k = Keyring::default();
        k.add("quay.io", cred("host"));
        k.add("https://quay.io/coreos", cred("path"));
        k.add("qua[xy].io", cred("wild"));
        k.add("https://index.docker.io/v1/", cred("hub"));
        k.add("quay.io", cred("host2"));
        assert_eq!(
            users(k.lookup("quay.io/coreos/etcd")),
            ["path", "host", "host2", "wild"]
        );
        assert_eq!(
            users(k.lookup("quay.io/other/app")),
            ["host", "host2", "wild"]
        );
        assert_eq!(users(k.lookup("docker.io/library/busybox")), ["hub"]);
        assert!(k.lookup("gcr.example.com/app").is_empty());
    }

    #[test]
    fn secrets_in_both_formats_and_the_auth_field() {
        let json_secret = json!({"auths": {
            "http://127.0.0.1:5000": {"auth": base64::engine::general_purpose::STANDARD.encode("alice:s3cr:et")},
            "other.example.com": {"username": "bob", "password": "pw"},
        }});
        let cfg_secret = json!({"127.0.0.1:5000": {"username": "carol", "password": "pw2"}});
        let mut a = Keys::new();
        a.insert(
            DOCKER_CONFIG_JSON_KEY.into(),
            json_secret.to_string().into_bytes(),
        );
        let mut b = Keys::new();
        b.insert(DOCKER_CFG_KEY.into(), cfg_secret.to_string().into_bytes());
        let mut opaque = Keys::new();
        opaque.insert("password".into(), b"x".to_vec());
        let k = Keyring::from_secrets(&[
            ("ns/a".into(), a),
            ("ns/opaque".into(), opaque),
            ("ns/b".into(), b),
        ])
        .unwrap();
        let found = k.lookup("127.0.0.1:5000/test/busybox");
        assert_eq!(
            found,
            [
                Credential {
                    username: "alice".into(),
                    password: "s3cr:et".into()
                },
                Credential {
                    username: "carol".into(),
                    password: "pw2".into()
                }
            ]
        );
        let a = found[0].auth_config();
        assert_eq!(
            (a.username.as_str(), a.server_address.as_str()),
            ("alice", "")
        );

        // Unpadded auth decodes too; a bad one names the secret and entry.
        let mut c = Keys::new();
        let unpadded = base64::engine::general_purpose::STANDARD_NO_PAD.encode("u:p1");
        c.insert(
            DOCKER_CFG_KEY.into(),
            json!({"r.example.com": {"auth": unpadded}})
                .to_string()
                .into_bytes(),
        );
        let k = Keyring::from_secrets(&[("ns/c".into(), c)]).unwrap();
        assert_eq!(k.lookup("r.example.com/x")[0].password, "p1");
        let mut d = Keys::new();
        d.insert(
            DOCKER_CFG_KEY.into(),
            json!({"r.example.com": {"auth": base64::engine::general_purpose::STANDARD.encode("nocolon")}})
                .to_string()
                .into_bytes(),
        );
        let e = Keyring::from_secrets(&[("ns/d".into(), d)]).unwrap_err();
        assert!(
            e.contains("secret ns/d: .dockercfg") && e.contains("base64(username:password)"),
            "{e}"
        );
        let mut bad = Keys::new();
        bad.insert(DOCKER_CONFIG_JSON_KEY.into(), b"{not json".to_vec());
        let e = Keyring::from_secrets(&[("ns/bad".into(), bad)]).unwrap_err();
        assert!(e.starts_with("secret ns/bad: .dockerconfigjson: "), "{e}");
    }

    #[test]
    fn pull_backoff_doubles_to_five_minutes_and_resets_when_quiet() {
        let t0 = Instant::now();
        let s = Duration::from_secs;
        let mut b = PullBackoff::default();
        assert!(b.in_backoff("uid_img", t0).is_none());
        assert_eq!(b.failed("uid_img", t0, "ErrImagePull: 401".into()), s(10));
        let (left, window, last) = b.in_backoff("uid_img", t0 + s(4)).unwrap();
        assert_eq!((left, window, last), (s(6), s(10), "ErrImagePull: 401"));
        assert!(b.in_backoff("uid_img", t0 + s(10)).is_none());
        assert!(b.in_backoff("other_img", t0 + s(1)).is_none());
        let t1 = t0 + s(11);
        assert_eq!(b.failed("uid_img", t1, "e".into()), s(20));
        assert_eq!(b.in_backoff("uid_img", t1 + s(19)).unwrap().0, s(1));
        let mut t = t1;
        for _ in 0..10 {
            t += s(1);
            b.failed("uid_img", t, "e".into());
        }
        assert_eq!(b.in_backoff("uid_img", t).unwrap().1, PULL_BACKOFF_MAX);
        // Quiet for more than twice the maximum: starts over at 10 s.
        let late = t + PULL_BACKOFF_MAX * 2 + s(1);
        assert!(b.in_backoff("uid_img", late).is_none());
        b.gc(late);
        assert!(b.is_empty());
        assert_eq!(b.failed("uid_img", late, "e".into()), s(10));
        b.failed("other_img", late, "e".into());
        b.forget_pod("uid");
        assert_eq!(b.len(), 1);
    }

    #[test]
    fn pull_bucket_refuses_beyond_burst_and_refills_at_qps() {
        let t0 = Instant::now();
        assert!(PullBucket::new(0.0, 10, t0).is_none(), "0 qps: unlimited");
        let mut b = PullBucket::new(5.0, 2, t0).unwrap();
        assert!(b.try_accept(t0));
        assert!(b.try_accept(t0));
        assert!(!b.try_accept(t0));
        assert!(!b.try_accept(t0 + Duration::from_millis(100)));
        assert!(b.try_accept(t0 + Duration::from_millis(200)));
        assert!(!b.try_accept(t0 + Duration::from_millis(200)));
        // Refill stops at the burst.
        let later = t0 + Duration::from_secs(60);
        assert!(b.try_accept(later) && b.try_accept(later) && !b.try_accept(later));
    }

    #[test]
    fn messages_print_like_go() {
        assert_eq!(go_millis(Duration::from_micros(150_400)), "150ms");
        assert_eq!(go_millis(Duration::from_millis(8658)), "8.658s");
        assert_eq!(go_millis(Duration::from_millis(1500)), "1.5s");
        assert_eq!(go_millis(Duration::from_secs(2)), "2s");
        assert_eq!(go_millis(Duration::from_millis(123_004)), "2m3.004s");
        assert_eq!(go_millis(Duration::ZERO), "0s");
        let e = CriError::status(
            "PullImage",
            "unix:///x",
            crate::cri::Code::Unknown,
            "failed to pull: 401 Unauthorized",
        );
        assert_eq!(
            go_error(&e),
            "rpc error: code = Unknown desc = failed to pull: 401 Unauthorized"
        );
        assert_eq!(aggregate(&["a".into()]), "a");
        assert_eq!(aggregate(&["a".into(), "a".into()]), "a");
        assert_eq!(aggregate(&["a".into(), "b".into(), "a".into()]), "[a, b]");
    }

    // ---- ensure_image against the fake runtime ----

    use crate::runtime::fake::{test_pod, FakeRuntime, TEST_IMAGE};
    use k8s_openapi::api::core::v1::LocalObjectReference;

    struct Secrets(Vec<(String, Keys)>);

    impl ObjectSource for Secrets {
        fn secret(&self, ns: &str, name: &str) -> Result<crate::volume::Fetched, String> {
            let key = format!("{ns}/{name}");
            Ok(self
                .0
                .iter()
                .find(|(k, _)| *k == key)
                .map(|(_, v)| v.clone()))
        }
        fn config_map(&self, _: &str, _: &str) -> Result<crate::volume::Fetched, String> {
            Ok(None)
        }
        fn service_account_token(
            &self,
            _: &Pod,
            _: Option<&str>,
            _: i64,
        ) -> Result<crate::volume::Token, String> {
            Err("no tokens here".into())
        }
    }

    const PRIVATE: &str = "127.0.0.1:5000/test/busybox:1";

    fn setup(serialize: bool) -> (Arc<FakeRuntime>, ImageManager) {
        let fake = Arc::new(FakeRuntime::with_images(&[TEST_IMAGE]));
        let opts = ImageOptions {
            serialize_pulls: serialize,
            registry_qps: 0.0,
            registry_burst: 10,
        };
        (fake.clone(), ImageManager::new(fake, opts))
    }

    fn pod_with(image: &str, policy: Option<&str>, secrets: &[&str]) -> Pod {
        let mut p = test_pod("uid-1", "web");
        let spec = p.spec.as_mut().unwrap();
        spec.containers[0].image = Some(image.into());
        spec.containers[0].image_pull_policy = policy.map(String::from);
        if !secrets.is_empty() {
            spec.image_pull_secrets = Some(
                secrets
                    .iter()
                    .map(|n| LocalObjectReference {
                        name: n.to_string(),
                    })
                    .collect(),
            );
        }
        p
    }

    fn ensure(m: &ImageManager, pod: &Pod) -> Result<String, ImageError> {
        let c = &pod.spec.as_ref().unwrap().containers[0];
        let obj = ObjectRef::container(pod, &c.name, false);
        m.ensure_image(
            pod,
            c,
            &api::PodSandboxConfig::new(),
            &EventRecorder::disabled(),
            &obj,
        )
    }

    #[test]
    fn policies_decide_whether_the_runtime_is_asked_to_pull() {
        let (fake, m) = setup(false);
        // Present and IfNotPresent: no pull.
        let p = pod_with(TEST_IMAGE, Some("IfNotPresent"), &[]);
        assert_eq!(ensure(&m, &p).unwrap(), TEST_IMAGE);
        assert_eq!(fake.count("PullImage"), 0);
        // Present but Always: pulled again.
        fake.serve_image(TEST_IMAGE, None);
        let p = pod_with(TEST_IMAGE, Some("Always"), &[]);
        assert_eq!(ensure(&m, &p).unwrap(), TEST_IMAGE);
        assert_eq!(fake.count("PullImage"), 1);
        // Missing and Never: ErrImageNeverPull with upstream's message, no pull.
        let p = pod_with("example.com/missing:2", Some("Never"), &[]);
        let e = ensure(&m, &p).unwrap_err();
        assert_eq!(e.reason, "ErrImageNeverPull");
        assert_eq!(
            e.message,
            "Container image \"example.com/missing:2\" is not present with pull policy of Never"
        );
        assert_eq!(fake.count("PullImage"), 1);
        // No policy and no tag: Always, asked for with :latest.
        fake.serve_image("example.com/app:latest", None);
        let p = pod_with("example.com/app", None, &[]);
        assert_eq!(ensure(&m, &p).unwrap(), "example.com/app:latest");
        assert_eq!(fake.count("PullImage"), 2);
        let e = ensure(&m, &pod_with("Not An Image", None, &[])).unwrap_err();
        assert_eq!(e.reason, "InvalidImageName");
    }

    #[test]
    fn a_failed_pull_backs_off_per_pod_and_image() {
        let (fake, m) = setup(true);
        let p = pod_with(PRIVATE, None, &[]);
        fake.serve_image(PRIVATE, Some(("alice", "pw")));
        let e = ensure(&m, &p).unwrap_err();
        assert_eq!(e.reason, "ErrImagePull");
        assert!(
            e.message.starts_with("rpc error: code = Unknown desc = "),
            "{}",
            e.message
        );
        assert!(e.message.contains("401 Unauthorized"), "{}", e.message);
        assert_eq!(e.retry_after, Some(PULL_FAILED_RESYNC));
        // Within the window: no pull, ImagePullBackOff naming the failure.
        let again = ensure(&m, &p).unwrap_err();
        assert_eq!(again.reason, "ImagePullBackOff");
        assert_eq!(
            again.message,
            format!(
                "Back-off pulling image \"{PRIVATE}\": ErrImagePull: {}",
                e.message
            )
        );
        let left = again.retry_after.unwrap();
        assert!(
            left <= PULL_BACKOFF_INITIAL && left > PULL_BACKOFF_INITIAL - Duration::from_secs(5)
        );
        assert_eq!(fake.count("PullImage"), 1);
        // Another pod pulling the same image is not held back.
        let mut other = pod_with(PRIVATE, None, &[]);
        other.metadata.uid = Some("uid-2".into());
        assert_eq!(ensure(&m, &other).unwrap_err().reason, "ErrImagePull");
        assert_eq!(fake.count("PullImage"), 2);
        // A pod that is gone forgets its back-off.
        m.forget_pod("uid-1");
        assert_eq!(ensure(&m, &p).unwrap_err().reason, "ErrImagePull");
        assert_eq!(fake.count("PullImage"), 3);
    }

    #[test]
    fn pull_secrets_are_tried_in_order_and_matched_by_registry() {
        let (fake, mut m) = setup(true);
        fake.serve_image(PRIVATE, Some(("alice", "right")));
        let cfg = |user: &str, pass: &str, host: &str| {
            let mut k = Keys::new();
            let auth = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{pass}"));
            k.insert(
                DOCKER_CONFIG_JSON_KEY.into(),
                json!({"auths": {host: {"auth": auth}}})
                    .to_string()
                    .into_bytes(),
            );
            k
        };
        m.set_secrets(Arc::new(Secrets(vec![
            (
                "default/wrong".into(),
                cfg("mallory", "nope", "http://127.0.0.1:5000"),
            ),
            (
                "default/right".into(),
                cfg("alice", "right", "127.0.0.1:5000"),
            ),
            (
                "default/elsewhere".into(),
                cfg("bob", "x", "registry.example.com"),
            ),
        ])));
        // A missing secret is skipped; the others are tried in the pod's order.
        let p = pod_with(PRIVATE, None, &["missing", "wrong", "elsewhere", "right"]);
        assert_eq!(ensure(&m, &p).unwrap(), PRIVATE);
        assert_eq!(fake.pull_auths(), ["mallory", "alice"]);
        // Only the wrong one: both errors would be the same, reported once.
        let mut p = pod_with(PRIVATE, Some("Always"), &["wrong"]);
        p.metadata.uid = Some("uid-3".into());
        let e = ensure(&m, &p).unwrap_err();
        assert_eq!(e.reason, "ErrImagePull");
        assert!(e.message.contains("401"), "{}", e.message);
        assert_eq!(fake.pull_auths(), ["mallory", "alice", "mallory"]);
        // No matching login: anonymous.
        let mut p = pod_with(PRIVATE, Some("Always"), &["elsewhere"]);
        p.metadata.uid = Some("uid-4".into());
        assert!(ensure(&m, &p).is_err());
        assert_eq!(fake.pull_auths().last().map(String::as_str), Some(""));
    }

    #[test]
    fn a_standalone_node_says_why_pull_secrets_were_not_used() {
        let (fake, m) = setup(false);
        fake.serve_image(PRIVATE, Some(("alice", "pw")));
        let p = pod_with(PRIVATE, None, &["regcred"]);
        let e = ensure(&m, &p).unwrap_err();
        assert_eq!(e.reason, "ErrImagePull");
        assert!(
            e.message.contains("imagePullSecrets were not used")
                && e.message.contains("without --kubeconfig"),
            "{}",
            e.message
        );
        assert_eq!(fake.pull_auths(), [""]);
    }

    #[test]
    fn registry_qps_refuses_pulls_beyond_the_burst() {
        let fake = Arc::new(FakeRuntime::with_images(&[]));
        fake.serve_image(TEST_IMAGE, None);
        let m = ImageManager::new(
            fake.clone(),
            ImageOptions {
                serialize_pulls: true,
                registry_qps: 0.001,
                registry_burst: 1,
            },
        );
        let p = pod_with(TEST_IMAGE, Some("Always"), &[]);
        assert!(ensure(&m, &p).is_ok());
        let mut q = pod_with(TEST_IMAGE, Some("Always"), &[]);
        q.metadata.uid = Some("uid-2".into());
        let e = ensure(&m, &q).unwrap_err();
        assert_eq!(
            (e.reason, e.message.as_str()),
            ("ErrImagePull", "pull QPS exceeded")
        );
        assert_eq!(fake.count("PullImage"), 1);
    }

    /// Pulls that take 30 ms and count how many run at once.
    #[derive(Default)]
    struct SlowRegistry {
        running: std::sync::atomic::AtomicUsize,
        most: std::sync::atomic::AtomicUsize,
    }

    impl ImageService for SlowRegistry {
        fn list_images(&self, _: Option<api::ImageFilter>) -> Result<Vec<api::Image>, CriError> {
            Ok(Vec::new())
        }
        fn image_status(&self, _: &api::ImageSpec) -> Result<Option<api::Image>, CriError> {
            Ok(None)
        }
        fn pull_image(
            &self,
            image: &api::ImageSpec,
            _: Option<&api::AuthConfig>,
            _: Option<&api::PodSandboxConfig>,
        ) -> Result<String, CriError> {
            use std::sync::atomic::Ordering::SeqCst;
            let now = self.running.fetch_add(1, SeqCst) + 1;
            self.most.fetch_max(now, SeqCst);
            std::thread::sleep(Duration::from_millis(30));
            self.running.fetch_sub(1, SeqCst);
            Ok(image.image.clone())
        }
        fn remove_image(&self, _: &api::ImageSpec) -> Result<(), CriError> {
            Ok(())
        }
        fn image_fs_info(&self) -> Result<Vec<api::FilesystemUsage>, CriError> {
            Ok(Vec::new())
        }
    }

    fn most_pulls_at_once(serialize: bool) -> usize {
        let registry = Arc::new(SlowRegistry::default());
        let m = ImageManager::new(
            registry.clone(),
            ImageOptions {
                serialize_pulls: serialize,
                registry_qps: 0.0,
                registry_burst: 10,
            },
        );
        let pods: Vec<Pod> = (0..4)
            .map(|i| {
                let mut p = pod_with(&format!("example.com/app{i}:1"), None, &[]);
                p.metadata.uid = Some(format!("uid-{i}"));
                p
            })
            .collect();
        crate::thread::scope_named(|s| {
            for p in &pods {
                let m = &m;
                s.spawn("pull-test", move || assert!(ensure(m, p).is_ok()))
                    .expect("start a puller");
            }
        });
        registry.most.load(std::sync::atomic::Ordering::SeqCst)
    }

    #[test]
    fn serialized_pulls_run_one_at_a_time() {
        assert_eq!(most_pulls_at_once(true), 1);
        assert!(most_pulls_at_once(false) > 1, "parallel pulls overlapped");
    }
}
