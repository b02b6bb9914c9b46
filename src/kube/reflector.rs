//! The reflector (upstream client-go's reflector and store, for one
//! collection): a thread that lists, then watches from the list's
//! resourceVersion, keeps the objects by `namespace/name`, and hands the
//! complete current set to a sink after the list and after every change.
//!
//! The resourceVersion protocol it follows (see the apiserver fixtures):
//! - The first LIST asks for `resourceVersion=0`, served from the
//!   apiserver's watch cache. Every later LIST is a quorum read (no
//!   resourceVersion): it follows a 410 (the version we had is compacted
//!   away) or repeated watch failures, when the cache may be what is wrong.
//! - A WATCH starts from the last version seen: the list's, then that of
//!   every event and BOOKMARK. The server ends a watch cleanly after
//!   `timeoutSeconds` (random in [300, 600) s, so that many nodes do not
//!   rewatch in step); the reflector then watches again at once.
//! - A lost connection is retried from the same version after a back-off
//!   (1 s doubling to 10 s, with jitter); a 410, by relisting.
//!
//! Hostile or broken input. A line of the stream that is not a watch event
//! (not JSON, truncated, too deep or too long, an unknown type, no object,
//! an ERROR without a Status) ends the watch, which starts again from the
//! last version taken, so an event hidden in the garbage is not lost; three
//! such failures in a row relist. An event whose object cannot be taken
//! (another kind, no name, UID or numeric resourceVersion, a field of the
//! wrong type, outside the field selector) is skipped with an error naming
//! the request and the field, as client-go skips objects of an unexpected
//! type: its version is not taken, the store keeps what it had, and the
//! watch goes on.
//!
//! Size. A LIST page is read one item at a time and a watch one event at a
//! time, each with a cap per object ([`MAX_OBJECT`]) rather than per
//! answer, so any number of big objects is taken. One object over the cap
//! is skipped with its name and the request logged, and the rest of the
//! list or watch is used; a DELETED event over the cap still removes its
//! object by name.

use std::any::Any;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender, TryRecvError};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde_json::Value;

use super::list::{ListItem, MAX_OBJECT};
use super::{ApiError, Client, ErrorKind, ListWatch, WatchEvent};

/// Objects asked for in one LIST page (client-go's pager).
const PAGE: u32 = 500;
/// After a list or an event this large, freed memory is handed back.
const GIVE_BACK_AFTER: u64 = 4 * 1024 * 1024;
/// The watch lasts a random number of seconds in this range (the watch
/// multiplexer's too: `kube::mux`).
pub(super) const WATCH_MIN_SECS: u64 = 300;
pub(super) const WATCH_SPREAD_SECS: u64 = 300;
/// A read may wait this much longer than the watch's own timeout before
/// the connection is taken for dead.
pub(super) const IDLE_MARGIN: Duration = Duration::from_secs(30);
pub(super) const BACKOFF_START: Duration = Duration::from_secs(1);
/// client-go caps its back-off at 30 s to spare a big apiserver a storm of
/// reconnecting nodes; an edge node reconnects sooner, so that what changed
/// during an outage reaches it within seconds of the apiserver's return.
pub(super) const BACKOFF_CAP: Duration = Duration::from_secs(10);
/// Watch failures other than transport errors, in a row, before a relist.
pub(super) const FAILURES_BEFORE_RELIST: u32 = 3;
/// A watch that ends cleanly this soon without an event counts as a failure
/// (a server that closes at once must not make us spin).
pub(super) const SHORT_WATCH: Duration = Duration::from_secs(1);

/// Handle of a reflector thread (`reflector/<name>`): it lists, then watches
/// from the list's resourceVersion, keeps the objects by `namespace/name`,
/// and after the first list and after every change hands the complete set
/// to its sink. Dropping the handle tells the thread to stop; a thread
/// blocked in a read ends at its next event or read deadline (it is not
/// joined).
pub struct Reflector {
    /// Never sent on: dropping it disconnects the channel, which is the
    /// stop signal (it also wakes a back-off sleep at once).
    _stop: Sender<()>,
}

/// What a reflector can keep: an API object with metadata, decoded from
/// JSON, shared with the sink's thread.
pub(crate) trait Reflected:
    k8s_openapi::Metadata<Ty = ObjectMeta>
    + k8s_openapi::Resource
    + serde::de::DeserializeOwned
    + Send
    + Sync
    + 'static
{
}

impl<T> Reflected for T where
    T: k8s_openapi::Metadata<Ty = ObjectMeta>
        + k8s_openapi::Resource
        + serde::de::DeserializeOwned
        + Send
        + Sync
        + 'static
{
}

impl Reflector {
    pub(crate) fn start<T>(
        name: &str,
        client: Client,
        lw: ListWatch,
        sink: Box<dyn FnMut(Vec<Arc<T>>) + Send>,
    ) -> std::io::Result<Reflector>
    where
        T: Reflected,
    {
        Self::start_with_backoff(name, client, lw, sink, BACKOFF_START)
    }

    /// `start` with the first back-off step given (tests make it short).
    fn start_with_backoff<T>(
        name: &str,
        client: Client,
        lw: ListWatch,
        sink: Box<dyn FnMut(Vec<Arc<T>>) + Send>,
        backoff_start: Duration,
    ) -> std::io::Result<Reflector>
    where
        T: Reflected,
    {
        // Capacity 0 and nothing is ever sent: only the disconnection counts.
        let (stop_tx, stop_rx) = crossbeam_channel::bounded::<()>(0);
        let mut sink = sink;
        let actor = Actor {
            name: name.to_string(),
            client,
            lw,
            codec: Codec {
                kind: T::KIND,
                api_version: T::API_VERSION,
                decode: decode_stored::<T>,
                explain: decode_error_with_field,
            },
            // Every stored object was made by `decode_stored::<T>`.
            sink: Box::new(move |objects: Vec<Stored>| {
                sink(
                    objects
                        .into_iter()
                        .filter_map(|o| o.downcast::<T>().ok())
                        .collect(),
                )
            }),
            stop: stop_rx,
            store: BTreeMap::new(),
            rv: None,
            rng: XorShift::seeded(),
            backoff_start,
            backoff: backoff_start,
            failures: 0,
        };
        let thread = crate::thread::spawn_named(format!("reflector/{name}"), move || actor.run())?;
        // A thread blocked in a read cannot be interrupted; it notices the
        // stop at its next event or read deadline, so it is not joined.
        thread.detach();
        Ok(Reflector { _stop: stop_tx })
    }
}

/// What the thread does next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Next {
    /// LIST; `quorum` leaves out resourceVersion (a read from etcd).
    List {
        quorum: bool,
    },
    Watch,
}

/// A stored object, of the type the reflector was started for.
type Stored = Arc<dyn Any + Send + Sync>;

/// What the thread needs of the type it reflects, as plain values and
/// functions: the thread's code is not generic, so it exists once in the
/// binary however many types are reflected.
struct Codec {
    kind: &'static str,
    api_version: &'static str,
    /// Decodes an object into its `namespace/name` key and stored value.
    decode: fn(&Value) -> Result<(String, Stored), serde_json::Error>,
    /// Names the field a decoding error is about (`decode_error_with_field`).
    explain: fn(&Value, &str) -> String,
}

fn decode_stored<T>(obj: &Value) -> Result<(String, Stored), serde_json::Error>
where
    T: k8s_openapi::Metadata<Ty = ObjectMeta> + serde::de::DeserializeOwned + Send + Sync + 'static,
{
    decode_value::<T>(obj).map(|(key, t)| (key, Arc::new(t) as Stored))
}

struct Actor {
    name: String,
    client: Client,
    lw: ListWatch,
    codec: Codec,
    sink: Box<dyn FnMut(Vec<Stored>) + Send>,
    stop: Receiver<()>,
    store: BTreeMap<String, Stored>,
    /// The last resourceVersion seen (list, event or bookmark).
    rv: Option<String>,
    rng: XorShift,
    backoff_start: Duration,
    backoff: Duration,
    /// Watch failures in a row that were not transport errors.
    failures: u32,
}

/// Why the thread stops.
struct Stopped;

impl Actor {
    fn run(mut self) {
        let mut next = Next::List { quorum: false };
        loop {
            let step = match next {
                Next::List { quorum } => self.list(quorum),
                Next::Watch => self.watch(),
            };
            match step {
                Ok(n) => next = n,
                Err(Stopped) => return,
            }
        }
    }

    fn stopped(&self) -> bool {
        matches!(self.stop.try_recv(), Err(TryRecvError::Disconnected))
    }

    /// Sleeps for the current back-off (with jitter) and doubles it; a stop
    /// ends the sleep at once. `at_least` is a server's Retry-After.
    fn back_off(&mut self, at_least: Option<u64>) -> Result<(), Stopped> {
        let base = self.backoff;
        self.backoff = (self.backoff * 2).min(BACKOFF_CAP);
        let jitter = base.mul_f64(self.rng.unit() * 0.5);
        let mut wait = base + jitter;
        if let Some(secs) = at_least {
            wait = wait.max(Duration::from_secs(secs.min(BACKOFF_CAP.as_secs())));
        }
        match self.stop.recv_timeout(wait) {
            Err(RecvTimeoutError::Timeout) => Ok(()),
            // Nothing is ever sent; anything else is the stop.
            _ => Err(Stopped),
        }
    }

    fn query(&self, params: &[(&str, &str)]) -> String {
        let mut q = String::new();
        let mut push = |k: &str, v: &str| {
            q.push(if q.is_empty() && !self.lw.path.contains('?') {
                '?'
            } else {
                '&'
            });
            q.push_str(k);
            q.push('=');
            q.push_str(&percent_encode(v));
        };
        if let Some(fs) = &self.lw.field_selector {
            push("fieldSelector", fs);
        }
        for (k, v) in params {
            push(k, v);
        }
        format!("{}{}", self.lw.path, q)
    }

    /// Lists all pages, replaces the store and publishes it.
    fn list(&mut self, quorum: bool) -> Result<Next, Stopped> {
        if quorum {
            log::info!("reflector {}: relisting {}", self.name, self.lw.path);
        }
        let page = PAGE.to_string();
        let mut store = BTreeMap::new();
        let mut continue_token: Option<String> = None;
        let mut bytes = 0u64;
        let rv = loop {
            let mut params = vec![("limit", page.as_str())];
            match &continue_token {
                Some(token) => params.push(("continue", token.as_str())),
                None if !quorum => params.push(("resourceVersion", "0")),
                None => {}
            }
            let path = self.query(&params);
            let answer = self.client.list(&path, MAX_OBJECT, &mut |item| match item {
                ListItem::Object(obj) => {
                    if let Some((key, obj)) = self.decode(&path, obj) {
                        store.insert(key, obj);
                    }
                }
                ListItem::TooLarge { index, key, bytes } => log::error!(
                    "reflector {}: GET {path}: skipping items[{index}] {key:?}: {bytes} bytes, over the {MAX_OBJECT}-byte limit of one object",
                    self.name
                ),
            });
            if self.stopped() {
                return Err(Stopped);
            }
            let list = match answer {
                Ok(list) => list,
                // An expired continue token too: the list starts again
                // from its first page, from etcd.
                Err(e) if e.is_gone() => {
                    log::info!("reflector {}: {e}; relisting", self.name);
                    return Ok(Next::List { quorum: true });
                }
                Err(e) => {
                    log::warn!("reflector {}: {e}", self.name);
                    self.back_off(retry_after(&e))?;
                    return Ok(Next::List { quorum });
                }
            };
            bytes += list.bytes;
            match list.continue_token {
                Some(token) => continue_token = Some(token),
                None => break list.resource_version,
            }
        };
        if bytes > GIVE_BACK_AFTER {
            // The pages' buffers and decoded values are freed: hand the
            // pages back rather than keep the peak.
            crate::malloc::give_back();
        }
        self.store = store;
        self.rv = Some(rv);
        self.failures = 0;
        self.publish()?;
        Ok(Next::Watch)
    }

    /// Runs one watch to its end and says what comes next.
    fn watch(&mut self) -> Result<Next, Stopped> {
        let rv = self.rv.clone().unwrap_or_default();
        let secs = WATCH_MIN_SECS + self.rng.next() % WATCH_SPREAD_SECS;
        let secs_text = secs.to_string();
        let path = self.query(&[
            ("resourceVersion", &rv),
            ("allowWatchBookmarks", "true"),
            ("timeoutSeconds", &secs_text),
            ("watch", "true"),
        ]);
        let started = Instant::now();
        let stream = match self
            .client
            .watch(&path, Duration::from_secs(secs) + IDLE_MARGIN)
        {
            Ok(s) => s,
            Err(e) => return self.watch_failed(e, 0),
        };
        let mut events = 0u64;
        let mut stream = stream;
        // Changes not yet handed to the sink. A burst of events that arrived
        // together is handed over once, as one complete set, instead of
        // once per event (each hand-over copies every object).
        let mut unpublished = false;
        while let Some(event) = stream.next() {
            if self.stopped() {
                return Err(Stopped);
            }
            let event = match event {
                Ok(ev) => ev,
                Err(e) => {
                    if unpublished {
                        self.publish()?;
                    }
                    return self.watch_failed(e, events);
                }
            };
            match event {
                WatchEvent::Added(obj) | WatchEvent::Modified(obj) => {
                    events += 1;
                    let rv = resource_version(&obj).map(str::to_string);
                    if let Some((key, obj)) = self.decode(&path, obj) {
                        self.rv = rv;
                        self.store.insert(key, obj);
                        unpublished = true;
                    }
                }
                WatchEvent::Deleted(obj) => {
                    events += 1;
                    let key = key_of_value(&obj);
                    match resource_version(&obj).and_then(|rv| check_rv(rv).ok()) {
                        Some(rv) if !key.is_empty() && !key.ends_with('/') => {
                            self.rv = Some(rv.to_string());
                            if self.store.remove(&key).is_some() {
                                unpublished = true;
                            }
                        }
                        _ => log::error!(
                            "reflector {}: GET {path}: skipping a DELETED event for {key:?}: {}",
                            self.name,
                            identity_problem(&obj)
                                .unwrap_or_else(|| "metadata.name is missing".into())
                        ),
                    }
                }
                WatchEvent::Bookmark { resource_version } => match check_rv(&resource_version) {
                    Ok(_) => self.rv = Some(resource_version),
                    Err(e) => log::error!(
                        "reflector {}: GET {path}: skipping a BOOKMARK: {e}",
                        self.name
                    ),
                },
                WatchEvent::TooLarge {
                    event_type,
                    key,
                    resource_version,
                    bytes,
                } => {
                    events += 1;
                    log::error!(
                        "reflector {}: GET {path}: skipping a {event_type} event for {key:?}: {bytes} bytes, over the {MAX_OBJECT}-byte limit of one object",
                        self.name
                    );
                    // A deletion needs only the name: the object goes
                    // even though its last state was not read.
                    let rv = resource_version.filter(|rv| check_rv(rv).is_ok());
                    if event_type == "DELETED" && !key.is_empty() && !key.ends_with('/') {
                        if let Some(rv) = rv {
                            self.rv = Some(rv);
                            if self.store.remove(&key).is_some() {
                                unpublished = true;
                            }
                        }
                    }
                    crate::malloc::give_back();
                }
                WatchEvent::Error(e) => {
                    if unpublished {
                        self.publish()?;
                    }
                    return self.watch_failed(e, events);
                }
            }
            if unpublished && !stream.has_buffered_event() {
                self.publish()?;
                unpublished = false;
            }
        }
        if unpublished {
            self.publish()?;
        }
        if events > 0 || started.elapsed() >= SHORT_WATCH {
            // The connection worked: the next failure starts a new back-off.
            self.backoff = self.backoff_start;
            self.failures = 0;
        } else {
            log::warn!(
                "reflector {}: GET {path}: the watch ended at once without an event",
                self.name
            );
            self.back_off(None)?;
        }
        Ok(Next::Watch)
    }

    /// Handles a watch that failed after delivering `events`: relist after a
    /// 410 or after repeated failures that are not transport errors, else
    /// wait and watch again.
    fn watch_failed(&mut self, e: ApiError, events: u64) -> Result<Next, Stopped> {
        if events > 0 {
            // It worked for a while: this is a new failure, not another one.
            self.backoff = self.backoff_start;
            self.failures = 0;
        }
        if e.is_gone() {
            log::info!("reflector {}: {e}; relisting", self.name);
            return Ok(Next::List { quorum: true });
        }
        if matches!(e.kind, ErrorKind::Decode(_)) {
            // Not an outage: the stream itself is broken or hostile.
            log::error!("reflector {}: {e}", self.name);
        } else {
            log::warn!("reflector {}: {e}", self.name);
        }
        if !e.is_transport() {
            self.failures += 1;
        }
        self.back_off(retry_after(&e))?;
        if self.failures >= FAILURES_BEFORE_RELIST {
            self.failures = 0;
            return Ok(Next::List { quorum: true });
        }
        Ok(Next::Watch)
    }

    /// Decodes one object; one that does not decode is logged and skipped.
    /// `metadata.managedFields` is dropped first: nothing on a node reads it,
    /// and it is often the largest part of an object (upstream informers
    /// strip it with a transform for the same reason).
    fn decode(&self, path: &str, mut obj: Value) -> Option<(String, Stored)> {
        if let Some(meta) = obj.get_mut("metadata").and_then(Value::as_object_mut) {
            meta.remove("managedFields");
        }
        let key = key_of_value(&obj);
        if let Some(why) = self.refusal(&obj) {
            log::error!(
                "reflector {}: GET {path}: skipping {key:?}: {why}",
                self.name
            );
            return None;
        }
        match (self.codec.decode)(&obj) {
            Ok(decoded) => Some(decoded),
            Err(e) => {
                log::error!(
                    "reflector {}: GET {path}: skipping {key:?}: cannot decode it as a {}: {}",
                    self.name,
                    self.codec.kind,
                    (self.codec.explain)(&obj, &e.to_string())
                );
                None
            }
        }
    }

    /// Why an object from a list or an ADDED or MODIFIED event cannot be
    /// taken, naming the field; None when it can.
    fn refusal(&self, obj: &Value) -> Option<String> {
        let text = |k: &str| obj.get(k).and_then(Value::as_str);
        // Watch events carry kind and apiVersion; list items do not.
        if let Some(kind) = text("kind") {
            if kind != self.codec.kind {
                return Some(format!(
                    "kind: {kind:?} where a {} was expected",
                    self.codec.kind
                ));
            }
        }
        if let Some(v) = text("apiVersion") {
            if v != self.codec.api_version {
                return Some(format!(
                    "apiVersion: {v:?} where {:?} was expected",
                    self.codec.api_version
                ));
            }
        }
        if let Some(why) = identity_problem(obj) {
            return Some(why);
        }
        let selector = self.lw.field_selector.as_deref()?;
        selector_mismatch(obj, selector)
    }

    fn publish(&mut self) -> Result<(), Stopped> {
        if self.stopped() {
            return Err(Stopped);
        }
        (self.sink)(self.store.values().cloned().collect());
        Ok(())
    }
}

/// Decodes one listed or watched object as the reflector stores it, with
/// its `namespace/name` key. `metadata.managedFields` is dropped first:
/// nothing on a node reads it, and it is often the largest part of an
/// object (upstream informers strip it with a transform for the same
/// reason). The error comes with the key read from the raw object.
pub fn decode_object<T>(mut obj: Value) -> Result<(String, T), (String, serde_json::Error)>
where
    T: k8s_openapi::Metadata<Ty = ObjectMeta> + serde::de::DeserializeOwned,
{
    if let Some(meta) = obj.get_mut("metadata").and_then(Value::as_object_mut) {
        meta.remove("managedFields");
    }
    decode_value(&obj).map_err(|e| (key_of_value(&obj), e))
}

/// Decodes `obj` (read in place, so that it is still there to name the
/// field when decoding fails) and gives its `namespace/name` key.
fn decode_value<T>(obj: &Value) -> Result<(String, T), serde_json::Error>
where
    T: k8s_openapi::Metadata<Ty = ObjectMeta> + serde::de::DeserializeOwned,
{
    let t = T::deserialize(obj)?;
    let meta = t.metadata();
    let key = match &meta.namespace {
        Some(ns) if !ns.is_empty() => format!("{ns}/{}", meta.name.as_deref().unwrap_or("")),
        _ => meta.name.clone().unwrap_or_default(),
    };
    Ok((key, t))
}

fn retry_after(e: &ApiError) -> Option<u64> {
    match &e.kind {
        ErrorKind::Status { retry_after, .. } => *retry_after,
        _ => None,
    }
}

/// The resourceVersion of an object's raw metadata, if it is a string.
pub(super) fn resource_version(obj: &Value) -> Option<&str> {
    obj.get("metadata")?.get("resourceVersion")?.as_str()
}

/// A resourceVersion we may watch from: etcd's revision, a decimal number.
pub(super) fn check_rv(rv: &str) -> Result<&str, String> {
    if !rv.is_empty() && rv.len() <= 20 && rv.bytes().all(|b| b.is_ascii_digit()) {
        Ok(rv)
    } else {
        Err(format!("metadata.resourceVersion: {rv:?} is not a number"))
    }
}

/// What is missing or wrong in an object's name, UID and resourceVersion.
fn identity_problem(obj: &Value) -> Option<String> {
    let Some(meta) = obj.get("metadata").filter(|m| m.is_object()) else {
        return Some("metadata is missing or not an object".into());
    };
    for field in ["name", "uid", "resourceVersion"] {
        match meta.get(field) {
            Some(Value::String(s)) if !s.is_empty() => {}
            None | Some(Value::Null) => return Some(format!("metadata.{field} is missing")),
            Some(Value::String(_)) => return Some(format!("metadata.{field} is empty")),
            Some(other) => {
                return Some(format!(
                    "metadata.{field}: expected a string, found {}",
                    crate::document::kind_of(other)
                ))
            }
        }
    }
    resource_version(obj).and_then(|rv| check_rv(rv).err())
}

/// The first term of a field selector (`a.b=v,c!=w`) that `obj` does not
/// satisfy, described; None when it satisfies all. A missing field is the
/// empty string, as the apiserver takes it.
fn selector_mismatch(obj: &Value, selector: &str) -> Option<String> {
    for term in selector.split(',').filter(|t| !t.is_empty()) {
        let (field, want, equal) = if let Some((f, v)) = term.split_once("!=") {
            (f, v, false)
        } else if let Some((f, v)) = term.split_once("==") {
            (f, v, true)
        } else if let Some((f, v)) = term.split_once('=') {
            (f, v, true)
        } else {
            continue;
        };
        let mut at = Some(obj);
        for part in field.split('.') {
            at = at.and_then(|v| v.get(part));
        }
        let have = match at {
            None | Some(Value::Null) => String::new(),
            Some(Value::String(s)) => s.clone(),
            Some(other) => other.to_string(),
        };
        if (have == want) != equal {
            return Some(format!(
                "{field}: {have:?} is outside the field selector {selector}"
            ));
        }
    }
    None
}

/// Why `obj` does not decode: the error with the path of the field it is
/// about (`spec.containers: invalid type: ...`), found by the leaf of `obj`
/// that the error's "invalid type" part describes. Decoding again from text
/// would give a line to map back, but would also build a second copy of the
/// object's (large) deserializer into the binary.
fn decode_error_with_field(obj: &Value, message: &str) -> String {
    match crate::document::locate_error(obj, message) {
        Some(path) => format!("{path}: {message}"),
        None => message.to_string(),
    }
}

/// `namespace/name` (or `name`) from an object's raw metadata.
fn key_of_value(obj: &Value) -> String {
    let field = |k: &str| {
        obj.get("metadata")
            .and_then(|m| m.get(k))
            .and_then(Value::as_str)
            .unwrap_or("")
    };
    match field("namespace") {
        "" => field("name").to_string(),
        ns => format!("{ns}/{}", field("name")),
    }
}

/// Percent-encodes a query value (everything but the unreserved characters).
pub(super) fn percent_encode(v: &str) -> String {
    let mut out = String::with_capacity(v.len());
    for b in v.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// A small xorshift generator for jitter; no cryptographic use.
pub(super) struct XorShift(u64);

impl XorShift {
    pub(super) fn seeded() -> XorShift {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        let seed = nanos ^ (u64::from(std::process::id()) << 32) ^ 0x9E37_79B9_7F4A_7C15;
        XorShift(if seed == 0 { 1 } else { seed })
    }

    pub(super) fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }

    /// A number in [0, 1).
    pub(super) fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kube::client::tests::client_for;
    use crate::kube::testserver::{fixture_body, fixture_lines, End, Reply, TestServer};
    use k8s_openapi::api::core::v1::Pod;
    use std::sync::atomic::{AtomicUsize, Ordering};

    const PODS: &str = "/api/v1/pods";
    const NODE: &str = "spec.nodeName=edge-1";

    /// A sink that sends `ns/name@rv` lists to the returned receiver
    /// (bounded; a test that stops reading blocks the reflector, which is
    /// what it wants).
    type Sink = Box<dyn FnMut(Vec<Arc<Pod>>) + Send>;

    fn recording_sink() -> (Sink, Receiver<Vec<String>>) {
        let (tx, rx) = crossbeam_channel::bounded(100);
        let sink = Box::new(move |pods: Vec<Arc<Pod>>| {
            let names = pods
                .iter()
                .map(|p| {
                    let m = &p.metadata;
                    format!(
                        "{}/{}@{}",
                        m.namespace.as_deref().unwrap_or(""),
                        m.name.as_deref().unwrap_or(""),
                        m.resource_version.as_deref().unwrap_or("")
                    )
                })
                .collect();
            let _ = tx.send(names);
        });
        (sink, rx)
    }

    /// Waits until the server has seen `n` requests.
    fn wait_for_requests(server: &TestServer, n: usize) -> Vec<String> {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let targets = server.targets();
            if targets.len() >= n || Instant::now() > deadline {
                return targets;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Takes the timeoutSeconds out of a watch target, checking its range.
    fn without_timeout(target: &str) -> String {
        let Some(at) = target.find("&timeoutSeconds=") else {
            return target.to_string();
        };
        let rest = &target[at + "&timeoutSeconds=".len()..];
        let end = rest.find('&').unwrap_or(rest.len());
        let secs: u64 = rest[..end].parse().unwrap();
        assert!((300..600).contains(&secs), "{target}");
        format!("{}{}", &target[..at], &rest[end..])
    }

    /// Waits for the reflector thread to end: its sink (and the sender in
    /// it) is dropped with it.
    fn assert_stops(rx: &Receiver<Vec<String>>) {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match rx.recv_deadline(deadline) {
                Ok(_) => {}
                Err(crossbeam_channel::RecvTimeoutError::Disconnected) => return,
                Err(e) => panic!("the reflector did not stop: {e}"),
            }
        }
    }

    #[test]
    fn lists_watches_relists_after_410_and_rewatches_after_a_drop() {
        let watches = AtomicUsize::new(0);
        let lines = fixture_lines("05a-pods-watch-node-timeout30");
        let later = fixture_lines("05k-pods-watch-node-timed-timeout90");
        let bad = br#"{"type":"ADDED","object":{"kind":"Pod","apiVersion":"v1","metadata":{"name":"bad","namespace":"default","resourceVersion":"406"},"spec":{"containers":"nope"}}}
"#
        .to_vec();
        let server = TestServer::start(move |r| {
            if !r.target.contains("watch=true") {
                return if r.target.contains("resourceVersion=0") {
                    Reply::json(200, fixture_body("04h-pods-list-node-rv0"))
                } else {
                    Reply::json(200, fixture_body("04i-pods-list-node-quorum"))
                };
            }
            let (chunks, end) = match watches.fetch_add(1, Ordering::SeqCst) {
                // The recorded stream, ending at its timeout.
                0 => (lines.clone(), End::Clean),
                // An undecodable object, one event, then the connection drops.
                1 => (vec![bad.clone(), later[0].clone()], End::Drop),
                2 => (vec![fixture_body("06a-pods-watch-rv1-too-old")], End::Clean),
                _ => (vec![], End::Clean),
            };
            Reply::Chunked {
                status: 200,
                chunks,
                end,
            }
        });
        let (sink, rx) = recording_sink();
        let lw = ListWatch {
            path: PODS.into(),
            field_selector: Some(NODE.into()),
        };
        let reflector = Reflector::start::<Pod>("pods", client_for(&server), lw, sink).unwrap();

        let targets = wait_for_requests(&server, 6);
        let targets: Vec<String> = targets.iter().map(|t| without_timeout(t)).collect();
        let fs = "fieldSelector=spec.nodeName%3Dedge-1";
        let watch = |rv: &str| {
            format!("{PODS}?{fs}&resourceVersion={rv}&allowWatchBookmarks=true&watch=true")
        };
        assert_eq!(
            targets[..6],
            [
                format!("{PODS}?{fs}&limit=500&resourceVersion=0"),
                watch("401"),
                // The stream ended after BOOKMARK 406.
                watch("406"),
                // The connection dropped after MODIFIED 407.
                watch("407"),
                // ERROR 410: a quorum list.
                format!("{PODS}?{fs}&limit=500"),
                watch("401"),
            ]
        );

        let s = |v: &[&str]| v.iter().map(|x| format!("default/{x}")).collect::<Vec<_>>();
        // Every state the events pass through, in order. Events that arrive
        // together are handed over once, so some of the states in between
        // may be skipped; the state at the end of each read is not.
        let states = [
            s(&["app-1@399", "app-2@400"]),
            s(&["app-1@399", "app-2@400", "app-3@402"]),
            s(&["app-1@399", "app-2@403", "app-3@402"]),
            s(&["app-1@404", "app-2@403", "app-3@402"]),
            s(&["app-1@405", "app-2@403", "app-3@402"]),
            // The end of the first watch.
            s(&["app-2@403", "app-3@402"]),
            // "bad" was skipped; the end of the second watch.
            s(&["app-2@407", "app-3@402"]),
            // The relist after the 410.
            s(&["app-1@399", "app-2@400"]),
        ];
        let mut seen = Vec::new();
        while seen.last() != Some(&(states.len() - 1)) {
            let set = rx.recv_timeout(Duration::from_secs(10)).unwrap();
            let from = seen.last().map_or(0, |i| i + 1);
            let at = states[from..]
                .iter()
                .position(|st| *st == set)
                .map(|i| i + from)
                .unwrap_or_else(|| panic!("unexpected set {set:?} after states {seen:?}"));
            seen.push(at);
        }
        for milestone in [0, 5, 6, 7] {
            assert!(
                seen.contains(&milestone),
                "state {milestone} never handed over: {seen:?}"
            );
        }
        drop(reflector);
        assert_stops(&rx);
    }

    #[test]
    fn watch_events_over_the_cap_are_skipped_and_a_deletion_still_removes() {
        let lines = fixture_lines("05a-pods-watch-node-timeout30");
        let big = |kind: &str, name: &str, rv: &str| {
            // The name after the bulk, as a server that sorts keys writes it.
            format!(
                "{{\"type\":\"{kind}\",\"object\":{{\"kind\":\"Pod\",\"apiVersion\":\"v1\",\"metadata\":{{\"annotations\":{{\"a\":\"{}\"}},\"name\":\"{name}\",\"namespace\":\"default\",\"resourceVersion\":\"{rv}\",\"uid\":\"u\"}}}}}}\n",
                "x".repeat(MAX_OBJECT)
            )
            .into_bytes()
        };
        let chunks = vec![
            lines[0].clone(),
            big("MODIFIED", "app-2", "403"),
            big("DELETED", "app-1", "404"),
        ];
        let watches = AtomicUsize::new(0);
        let server = TestServer::start(move |r| {
            if !r.target.contains("watch=true") {
                return Reply::json(200, fixture_body("04h-pods-list-node-rv0"));
            }
            let chunks = match watches.fetch_add(1, Ordering::SeqCst) {
                0 => chunks.clone(),
                _ => vec![],
            };
            Reply::Chunked {
                status: 200,
                chunks,
                end: End::Clean,
            }
        });
        let (sink, rx) = recording_sink();
        let lw = ListWatch {
            path: PODS.into(),
            field_selector: None,
        };
        let reflector = Reflector::start::<Pod>("pods", client_for(&server), lw, sink).unwrap();
        let want = ["default/app-2@400", "default/app-3@402"];
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let set = rx.recv_deadline(deadline).unwrap();
            if set == want {
                break;
            }
        }
        let targets = wait_for_requests(&server, 3);
        // The deletion's version was taken; the skipped MODIFIED's not.
        assert_eq!(
            without_timeout(&targets[2]),
            format!("{PODS}?resourceVersion=404&allowWatchBookmarks=true&watch=true")
        );
        drop(reflector);
        assert_stops(&rx);
    }

    #[test]
    fn a_list_410_relists_from_etcd_following_continue_pages() {
        let list: Value = serde_json::from_slice(&fixture_body("04h-pods-list-node-rv0")).unwrap();
        let page = |item: &Value, cont: Option<&str>| {
            let mut meta = serde_json::json!({"resourceVersion": "401"});
            if let Some(c) = cont {
                meta["continue"] = c.into();
            }
            serde_json::json!({"kind":"PodList","apiVersion":"v1","metadata":meta,"items":[item]})
                .to_string()
        };
        let page1 = page(&list["items"][0], Some("tok/en="));
        let page2 = page(&list["items"][1], None);
        let server = TestServer::start(move |r| {
            if r.target.contains("watch=true") {
                Reply::Chunked {
                    status: 200,
                    chunks: vec![],
                    end: End::Clean,
                }
            } else if r.target.contains("resourceVersion=0") {
                Reply::json(
                    410,
                    fixture_body("06d-pods-list-rv1-exact-after-compaction"),
                )
            } else if r.target.contains("continue=") {
                Reply::json(200, page2.clone())
            } else {
                Reply::json(200, page1.clone())
            }
        });
        let (sink, rx) = recording_sink();
        let lw = ListWatch {
            path: "/api/v1/namespaces/default/pods".into(),
            field_selector: None,
        };
        let reflector = Reflector::start::<Pod>("ns", client_for(&server), lw, sink).unwrap();
        let first = rx.recv_timeout(Duration::from_secs(10)).unwrap();
        assert_eq!(first, ["default/app-1@399", "default/app-2@400"]);
        let targets = wait_for_requests(&server, 4);
        let p = "/api/v1/namespaces/default/pods";
        assert_eq!(
            targets[..3],
            [
                format!("{p}?limit=500&resourceVersion=0"),
                format!("{p}?limit=500"),
                format!("{p}?limit=500&continue=tok%2Fen%3D"),
            ]
        );
        assert_eq!(
            without_timeout(&targets[3]),
            format!("{p}?resourceVersion=401&allowWatchBookmarks=true&watch=true")
        );
        // The empty watches end at once: the reflector backs off, and a
        // drop ends that wait.
        drop(reflector);
        assert_stops(&rx);
    }

    #[test]
    fn repeated_watch_failures_that_are_not_transport_errors_relist() {
        let server = TestServer::start(move |r| {
            if r.target.contains("watch=true") {
                Reply::json(
                    500,
                    r#"{"kind":"Status","status":"Failure","message":"boom","code":500}"#,
                )
            } else {
                Reply::json(200, fixture_body("04h-pods-list-node-rv0"))
            }
        });
        let (sink, rx) = recording_sink();
        let lw = ListWatch {
            path: PODS.into(),
            field_selector: None,
        };
        let client = client_for(&server);
        let reflector =
            Reflector::start_with_backoff::<Pod>("r", client, lw, sink, Duration::from_millis(5))
                .unwrap();
        let targets = wait_for_requests(&server, 6);
        let targets: Vec<String> = targets.iter().map(|t| without_timeout(t)).collect();
        let watch = format!("{PODS}?resourceVersion=401&allowWatchBookmarks=true&watch=true");
        assert_eq!(
            targets[..6],
            [
                format!("{PODS}?limit=500&resourceVersion=0"),
                watch.clone(),
                watch.clone(),
                watch.clone(),
                format!("{PODS}?limit=500"),
                watch,
            ]
        );
        assert_eq!(rx.recv().unwrap().len(), 2);
        assert_eq!(rx.recv().unwrap().len(), 2);
        drop(reflector);
        assert_stops(&rx);
    }

    #[test]
    fn malformed_objects_are_described_by_their_field() {
        let pod = serde_json::json!({
            "kind": "Pod",
            "metadata": {"name": "p", "namespace": "default", "uid": "u", "resourceVersion": "7"},
            "spec": {"nodeName": "edge-1", "containers": "nope"},
        });
        let e = serde_json::from_value::<Pod>(pod.clone()).unwrap_err();
        assert_eq!(
            decode_error_with_field(&pod, &e.to_string()),
            "spec.containers: invalid type: string \"nope\", expected a sequence"
        );
        let port = serde_json::json!({
            "metadata": {"name": "p", "uid": "u", "resourceVersion": "7"},
            "spec": {"containers": [{"name": "a", "image": "x"}, {"name": "b", "ports": [{"containerPort": "80"}]}]},
        });
        let e = serde_json::from_value::<Pod>(port.clone()).unwrap_err();
        assert_eq!(
            decode_error_with_field(&port, &e.to_string()),
            "spec.containers[1].ports[0].containerPort: invalid type: string \"80\", expected i32"
        );

        let with = |meta: Value| serde_json::json!({"metadata": meta});
        assert_eq!(
            identity_problem(&serde_json::json!({"spec": {}})).as_deref(),
            Some("metadata is missing or not an object")
        );
        assert_eq!(
            identity_problem(&with(serde_json::json!({"uid": "u"}))).as_deref(),
            Some("metadata.name is missing")
        );
        assert_eq!(
            identity_problem(&with(
                serde_json::json!({"name": "n", "resourceVersion": "1"})
            ))
            .as_deref(),
            Some("metadata.uid is missing")
        );
        assert_eq!(
            identity_problem(&with(serde_json::json!({"name": "n", "uid": 5}))).as_deref(),
            Some("metadata.uid: expected a string, found a number")
        );
        assert_eq!(
            identity_problem(&with(
                serde_json::json!({"name": "n", "uid": "u", "resourceVersion": "12a"})
            ))
            .as_deref(),
            Some("metadata.resourceVersion: \"12a\" is not a number")
        );
        assert_eq!(
            identity_problem(&with(
                serde_json::json!({"name": "n", "uid": "u", "resourceVersion": "12"})
            )),
            None
        );
        assert_eq!(
            selector_mismatch(&pod, "spec.nodeName=edge-2").as_deref(),
            Some("spec.nodeName: \"edge-1\" is outside the field selector spec.nodeName=edge-2")
        );
        assert_eq!(selector_mismatch(&pod, "spec.nodeName=edge-1"), None);
        assert_eq!(
            selector_mismatch(&pod, "spec.nodeName==edge-1,metadata.name!=p").as_deref(),
            Some("metadata.name: \"p\" is outside the field selector spec.nodeName==edge-1,metadata.name!=p")
        );
        assert!(selector_mismatch(&pod, "status.phase=Running").is_some());
    }

    #[test]
    fn keys_and_query_encoding() {
        assert_eq!(
            percent_encode("spec.nodeName=edge-1"),
            "spec.nodeName%3Dedge-1"
        );
        assert_eq!(percent_encode("a b/~_"), "a%20b%2F~_");
        assert_eq!(
            key_of_value(&serde_json::json!({"metadata":{"namespace":"ns","name":"n"}})),
            "ns/n"
        );
        assert_eq!(
            key_of_value(&serde_json::json!({"metadata":{"name":"node"}})),
            "node"
        );
        let mut rng = XorShift(7);
        for _ in 0..1000 {
            let u = rng.unit();
            assert!((0.0..1.0).contains(&u));
        }
    }
}
