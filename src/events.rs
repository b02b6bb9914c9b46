//! Kubernetes event reporting (upstream client-go `tools/record`): the
//! [`EventRecorder`] that any thread calls to record an event, and the
//! [`EventBroadcaster`] handle of the `events` thread, which correlates
//! events and writes them to the apiserver through an [`EventSink`].
//!
//! Correlation follows upstream's event correlator, in its order:
//! 1. the aggregator: events alike except for their message (same source,
//!    involved object, type and reason), seen with 10 different messages
//!    within 10 minutes, are sent as one event with the message
//!    `(combined from similar events): <latest message>`;
//! 2. the logger: an event seen before (the same key, message included) is
//!    sent as a strategic-merge PATCH of the existing event raising its
//!    `count`, instead of a new event;
//! 3. the spam filter: a token bucket per source and involved object (burst
//!    25, one token back every 5 minutes); an event without a token is
//!    dropped. The logger has already counted it, so the next event sent for
//!    that key patches the count past it, as upstream does.
//!
//! Architecture invariant: recording never blocks. [`EventRecorder::event`]
//! does a `try_send` on a bounded queue; when it is full the event is
//! dropped with a rate-limited warning. The `events` thread owns all
//! correlation state; nothing else touches it.

use std::collections::hash_map::DefaultHasher;
use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crossbeam_channel::{bounded, select, Receiver, RecvTimeoutError, Sender, TrySendError};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use parking_lot::Mutex;
use serde_json::{json, Map, Value};

use crate::kube::{ApiError, Client, PatchKind};
use crate::thread::{spawn_named, JoinOnDrop};

/// Events queued for the `events` thread, as upstream's broadcaster queue.
pub(crate) const QUEUE_CAPACITY: usize = 1000;
/// Entries of each correlation cache (least recently used go first).
const CACHE_ENTRIES: usize = 4096;
/// Different messages of similar events that make the aggregator combine.
const AGGREGATE_MAX_EVENTS: usize = 10;
/// Window in which similar events count towards aggregation.
const AGGREGATE_INTERVAL: Duration = Duration::from_secs(600);
/// Tokens of one object's spam bucket when full.
const SPAM_BURST: f64 = 25.0;
/// Tokens per second returned to a spam bucket: one every 5 minutes.
const SPAM_QPS: f64 = 1.0 / 300.0;
/// At most one "queue is full" warning per this interval.
const DROP_LOG_INTERVAL: Duration = Duration::from_secs(10);
/// Prefix of an aggregated event's message.
const COMBINED_PREFIX: &str = "(combined from similar events): ";

/// The time source of event timestamps, names and correlation windows.
pub trait Clock: Send + Sync {
    fn now(&self) -> SystemTime;
}

/// The wall clock.
pub(crate) struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> SystemTime {
        SystemTime::now()
    }
}

/// Where events are written: the apiserver, or a fake in tests.
pub(crate) trait EventSink: Send {
    /// Creates `event` in `namespace`; returns the created object.
    fn create(&mut self, namespace: &str, event: &Value) -> Result<Value, ApiError>;
    /// Applies a strategic-merge `patch` to the event `name` in `namespace`.
    fn patch(&mut self, namespace: &str, name: &str, patch: &Value) -> Result<Value, ApiError>;
}

impl EventSink for Client {
    fn create(&mut self, namespace: &str, event: &Value) -> Result<Value, ApiError> {
        Client::create(
            self,
            &format!("/api/v1/namespaces/{namespace}/events"),
            event,
        )
    }

    fn patch(&mut self, namespace: &str, name: &str, patch: &Value) -> Result<Value, ApiError> {
        Client::patch(
            self,
            &format!("/api/v1/namespaces/{namespace}/events/{name}"),
            PatchKind::Strategic,
            patch,
        )
    }
}

/// The `type` of an event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum EventType {
    Normal,
    Warning,
}

impl EventType {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            EventType::Normal => "Normal",
            EventType::Warning => "Warning",
        }
    }
}

/// The object an event is about (an `ObjectReference`). Empty fields are
/// left out of the event's `involvedObject`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ObjectRef {
    /// `Pod` or `Node`.
    pub(crate) kind: &'static str,
    pub(crate) namespace: String,
    pub(crate) name: String,
    pub(crate) uid: String,
    /// `v1` for pods; empty for the node, as the kubelet sends it.
    pub(crate) api_version: &'static str,
    pub(crate) resource_version: String,
    /// `spec.containers{name}`, `spec.initContainers{name}` or empty.
    pub(crate) field_path: String,
}

impl ObjectRef {
    /// A reference to `pod` as a whole.
    pub(crate) fn pod(pod: &Pod) -> Self {
        let m = &pod.metadata;
        ObjectRef {
            kind: "Pod",
            namespace: m.namespace.clone().unwrap_or_default(),
            name: m.name.clone().unwrap_or_default(),
            uid: m.uid.clone().unwrap_or_default(),
            api_version: "v1",
            resource_version: m.resource_version.clone().unwrap_or_default(),
            field_path: String::new(),
        }
    }

    /// A reference to one container of `pod` (`init` for an init container;
    /// an ephemeral container is found by its name).
    pub(crate) fn container(pod: &Pod, container_name: &str, init: bool) -> Self {
        let ephemeral = !init
            && pod.spec.as_ref().is_some_and(|s| {
                !s.containers.iter().any(|c| c.name == container_name)
                    && s.ephemeral_containers
                        .iter()
                        .flatten()
                        .any(|e| e.name == container_name)
            });
        let list = match (init, ephemeral) {
            (true, _) => "initContainers",
            (false, true) => "ephemeralContainers",
            (false, false) => "containers",
        };
        ObjectRef {
            field_path: format!("spec.{list}{{{container_name}}}"),
            ..ObjectRef::pod(pod)
        }
    }

    /// A reference to the node `name`. Like the kubelet, the node's name
    /// stands in for its UID and there is no namespace, so the event goes to
    /// `default`.
    pub(crate) fn node(name: &str) -> Self {
        ObjectRef {
            kind: "Node",
            namespace: String::new(),
            name: name.to_string(),
            uid: name.to_string(),
            api_version: "",
            resource_version: String::new(),
            field_path: String::new(),
        }
    }
}

/// One recorded event on its way to the `events` thread.
#[derive(Clone, Debug)]
pub(crate) struct Recorded {
    pub(crate) obj: ObjectRef,
    pub(crate) kind: EventType,
    pub(crate) reason: String,
    pub(crate) message: String,
    time: SystemTime,
}

/// Records events; cheap to clone and usable from any thread.
#[derive(Clone)]
pub struct EventRecorder {
    /// `None` when disabled (standalone mode).
    inner: Option<Arc<RecorderInner>>,
}

struct RecorderInner {
    tx: Sender<Recorded>,
    clock: Arc<dyn Clock>,
    /// Dropped since the last warning.
    dropped_unreported: AtomicU64,
    dropped_total: AtomicU64,
    last_drop_log: Mutex<Option<Instant>>,
}

impl EventRecorder {
    /// A recorder that logs events at debug level and sends none.
    pub(crate) fn disabled() -> Self {
        EventRecorder { inner: None }
    }

    /// Records an event about `obj`. Never blocks: when the queue is full
    /// the event is dropped.
    pub(crate) fn event(
        &self,
        obj: &ObjectRef,
        kind: EventType,
        reason: &str,
        message: impl Into<String>,
    ) {
        let message = message.into();
        log::debug!(
            "event {} {}/{}{}{}: {} {}: {}",
            obj.kind,
            obj.namespace,
            obj.name,
            if obj.field_path.is_empty() { "" } else { " " },
            obj.field_path,
            kind.as_str(),
            reason,
            message
        );
        let Some(inner) = &self.inner else {
            return;
        };
        let rec = Recorded {
            obj: obj.clone(),
            kind,
            reason: reason.to_string(),
            message,
            time: inner.clock.now(),
        };
        match inner.tx.try_send(rec) {
            Ok(()) => {}
            // Full: drop it; the apiserver is slow or gone and upstream drops
            // too. The warning is rate-limited, with a count.
            Err(TrySendError::Full(_)) => inner.note_drop(),
            Err(TrySendError::Disconnected(_)) => {
                log::debug!("event dropped: the events thread has stopped")
            }
        }
    }

    /// A recorder whose events a test reads from the returned channel
    /// (capacity 64) instead of an `events` thread.
    #[cfg(test)]
    pub(crate) fn capture() -> (Self, Receiver<Recorded>) {
        let (tx, rx) = bounded(64);
        let inner = RecorderInner {
            tx,
            clock: Arc::new(SystemClock),
            dropped_unreported: AtomicU64::new(0),
            dropped_total: AtomicU64::new(0),
            last_drop_log: Mutex::new(None),
        };
        (
            EventRecorder {
                inner: Some(Arc::new(inner)),
            },
            rx,
        )
    }

    /// Events dropped so far because the queue was full.
    pub fn dropped(&self) -> u64 {
        self.inner
            .as_ref()
            .map_or(0, |i| i.dropped_total.load(Ordering::Relaxed))
    }
}

impl RecorderInner {
    fn note_drop(&self) {
        self.dropped_total.fetch_add(1, Ordering::Relaxed);
        self.dropped_unreported.fetch_add(1, Ordering::Relaxed);
        // try_lock: a caller that finds another one reporting just counts.
        let Some(mut last) = self.last_drop_log.try_lock() else {
            return;
        };
        if last.is_some_and(|t| t.elapsed() < DROP_LOG_INTERVAL) {
            return;
        }
        *last = Some(Instant::now());
        let n = self.dropped_unreported.swap(0, Ordering::Relaxed);
        log::warn!("event queue is full: dropped {n} events since the last report");
    }
}

/// Settings of the `events` thread.
#[derive(Clone)]
pub(crate) struct BroadcasterOptions {
    pub(crate) clock: Arc<dyn Clock>,
    /// Capacity of the event queue.
    pub(crate) queue: usize,
    /// Attempts to write one event when the apiserver cannot be reached.
    pub(crate) tries: u32,
    /// Pause between attempts (the first one is shortened at random, so that
    /// nodes do not retry in step after an apiserver outage).
    pub(crate) retry_delay: Duration,
}

impl Default for BroadcasterOptions {
    fn default() -> Self {
        BroadcasterOptions {
            clock: Arc::new(SystemClock),
            queue: QUEUE_CAPACITY,
            tries: 3,
            retry_delay: Duration::from_secs(10),
        }
    }
}

/// Handle of the `events` thread. Dropping it stops the thread and joins it;
/// queued events are dropped. A write in flight is finished first (bounded by
/// the client's request timeout), a pause between retries is cut short.
pub(crate) struct EventBroadcaster {
    // Drop order matters: the stop sender goes first, then the join.
    _stop: Sender<()>,
    _thread: JoinOnDrop<()>,
}

impl EventBroadcaster {
    /// Starts the `events` thread writing to `sink` as `component` (e.g.
    /// `kubelet`) on `host` (the node name), with the default options.
    pub(crate) fn start(
        sink: Box<dyn EventSink>,
        component: &str,
        host: &str,
    ) -> std::io::Result<(EventBroadcaster, EventRecorder)> {
        Self::start_with(sink, component, host, BroadcasterOptions::default())
    }

    /// As [`EventBroadcaster::start`], with the given options.
    pub(crate) fn start_with(
        sink: Box<dyn EventSink>,
        component: &str,
        host: &str,
        options: BroadcasterOptions,
    ) -> std::io::Result<(EventBroadcaster, EventRecorder)> {
        // Full: the recorder drops the event (see EventRecorder::event).
        let (tx, inbox) = bounded(options.queue);
        // Never sent on: dropping the handle disconnects it, which stops the
        // thread. The inbox cannot do that, recorders hold its senders.
        let (stop_tx, stop) = bounded(0);
        let actor = Actor {
            sink,
            correlator: Correlator::new(component, host),
            clock: options.clock.clone(),
            tries: options.tries.max(1),
            retry_delay: options.retry_delay,
            stop,
        };
        let thread = spawn_named("events", move || actor.run(inbox))?;
        let recorder = EventRecorder {
            inner: Some(Arc::new(RecorderInner {
                tx,
                clock: options.clock,
                dropped_unreported: AtomicU64::new(0),
                dropped_total: AtomicU64::new(0),
                last_drop_log: Mutex::new(None),
            })),
        };
        Ok((
            EventBroadcaster {
                _stop: stop_tx,
                _thread: thread,
            },
            recorder,
        ))
    }
}

/// The `events` thread's state.
struct Actor {
    sink: Box<dyn EventSink>,
    correlator: Correlator,
    clock: Arc<dyn Clock>,
    tries: u32,
    retry_delay: Duration,
    stop: Receiver<()>,
}

/// Why the thread should go on or end.
enum Flow {
    Continue,
    Stop,
}

impl Actor {
    fn run(mut self, inbox: Receiver<Recorded>) {
        loop {
            select! {
                // Only ever disconnects: the handle was dropped.
                recv(self.stop) -> _ => return,
                recv(inbox) -> msg => match msg {
                    Ok(rec) => {
                        if let Flow::Stop = self.handle(rec) {
                            return;
                        }
                    }
                    // Every recorder is gone: nothing more can come.
                    Err(_) => return,
                },
            }
        }
    }

    fn handle(&mut self, rec: Recorded) -> Flow {
        let now = self.clock.now();
        let Some(out) = self.correlator.correlate(&rec, now) else {
            log::debug!(
                "event {} for {} {}/{} dropped by the spam filter",
                rec.reason,
                rec.obj.kind,
                rec.obj.namespace,
                rec.obj.name
            );
            return Flow::Continue;
        };
        let mut tries = 0;
        loop {
            let err = match self.write(&out) {
                Ok(()) => return Flow::Continue,
                Err(e) if e.is_already_exists() => {
                    log::debug!("event {}/{} already exists", out.namespace, out.name);
                    return Flow::Continue;
                }
                Err(e) if e.is_transport() => e,
                Err(e) => {
                    log::warn!(
                        "event {}/{} rejected, dropped: {e}",
                        out.namespace,
                        out.name
                    );
                    return Flow::Continue;
                }
            };
            tries += 1;
            if tries >= self.tries {
                log::warn!(
                    "event {}/{} dropped after {tries} attempts: {err}",
                    out.namespace,
                    out.name
                );
                return Flow::Continue;
            }
            log::debug!(
                "event {}/{} not written, will retry: {err}",
                out.namespace,
                out.name
            );
            let delay = if tries == 1 {
                jittered(self.retry_delay)
            } else {
                self.retry_delay
            };
            match self.stop.recv_timeout(delay) {
                Err(RecvTimeoutError::Timeout) => {}
                _ => return Flow::Stop,
            }
        }
    }

    /// One attempt: the patch if there is one, a create when there is none
    /// or the event to patch is gone.
    fn write(&mut self, out: &Outgoing) -> Result<(), ApiError> {
        if let Some(patch) = &out.patch {
            match self.sink.patch(&out.namespace, &out.name, patch) {
                Ok(_) => return Ok(()),
                Err(e) if e.is_not_found() => {}
                Err(e) => return Err(e),
            }
        }
        self.sink.create(&out.namespace, &out.event).map(|_| ())
    }
}

/// `d` scaled by a fraction taken from the wall clock's sub-second digits
/// (a cheap source of spread; it need not be a good random number).
fn jittered(d: Duration) -> Duration {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |t| t.subsec_nanos());
    d.mul_f64(f64::from(nanos) / 1e9)
}

/// What the correlator decided to send.
#[derive(Debug, Clone, PartialEq)]
struct Outgoing {
    namespace: String,
    name: String,
    /// The whole event, for a create.
    event: Value,
    /// The strategic-merge patch of an event sent before.
    patch: Option<Value>,
}

/// A bounded map that forgets the least recently used entry first. The
/// entries hold no heap data of their own and the oldest is found by a scan
/// when the map is full (events are rare): long-lived small allocations
/// spread over the heap would keep its pages resident after a burst.
struct Lru<V> {
    cap: usize,
    tick: u64,
    /// key -> (tick of last use, value)
    map: HashMap<u64, (u64, V)>,
}

impl<V> Lru<V> {
    fn new(cap: usize) -> Self {
        Lru {
            cap,
            tick: 0,
            map: HashMap::new(),
        }
    }

    /// The entry of `key`, made by `make` when absent; marks it used.
    fn get_or_insert_with(&mut self, key: u64, make: impl FnOnce() -> V) -> &mut V {
        self.tick += 1;
        let tick = self.tick;
        if !self.map.contains_key(&key) && self.map.len() >= self.cap {
            let oldest = self
                .map
                .iter()
                .min_by_key(|(_, (t, _))| *t)
                .map(|(k, _)| *k);
            if let Some(oldest) = oldest {
                self.map.remove(&oldest);
            }
        }
        let entry = self.map.entry(key).or_insert_with(|| (tick, make()));
        entry.0 = tick;
        &mut entry.1
    }
}

/// Hash of the key fields. The caches key on 64-bit hashes instead of the
/// joined strings to stay small; with at most 4096 entries a collision is
/// about one in 10^12.
fn key_of(parts: &[&str]) -> u64 {
    let mut h = DefaultHasher::new();
    for p in parts {
        p.hash(&mut h);
    }
    h.finish()
}

struct AggregateRecord {
    /// Hashes of the different messages seen.
    messages: MessageSet,
    last: SystemTime,
}

/// At most [`AGGREGATE_MAX_EVENTS`] message hashes, inline.
#[derive(Default)]
struct MessageSet {
    hashes: [u64; AGGREGATE_MAX_EVENTS],
    len: usize,
}

impl MessageSet {
    fn insert(&mut self, h: u64) {
        if !self.hashes[..self.len].contains(&h) && self.len < AGGREGATE_MAX_EVENTS {
            self.hashes[self.len] = h;
            self.len += 1;
        }
    }
    fn remove_one(&mut self) {
        self.len = self.len.saturating_sub(1);
    }
    fn clear(&mut self) {
        self.len = 0;
    }
    fn len(&self) -> usize {
        self.len
    }
}

/// An event sent before: its name and firstTimestamp derive from `first`.
struct LogRecord {
    count: u64,
    first: SystemTime,
}

struct Bucket {
    tokens: f64,
    last: SystemTime,
}

/// Upstream's event correlator: aggregator, logger and spam filter, as a
/// plain state machine stepped by the `events` thread (or a test).
struct Correlator {
    component: String,
    host: String,
    aggregates: Lru<AggregateRecord>,
    logs: Lru<LogRecord>,
    buckets: Lru<Bucket>,
}

impl Correlator {
    fn new(component: &str, host: &str) -> Self {
        Correlator {
            component: component.to_string(),
            host: host.to_string(),
            aggregates: Lru::new(CACHE_ENTRIES),
            logs: Lru::new(CACHE_ENTRIES),
            buckets: Lru::new(CACHE_ENTRIES),
        }
    }

    /// What to send for `rec` at `now`, or `None` when the spam filter drops it.
    fn correlate(&mut self, rec: &Recorded, now: SystemTime) -> Option<Outgoing> {
        let o = &rec.obj;
        let (c, h, t) = (&*self.component, &*self.host, rec.kind.as_str());

        // 1. Aggregation of similar events.
        let aggregate_key = key_of(&[
            c,
            h,
            o.kind,
            &o.namespace,
            &o.name,
            &o.uid,
            o.api_version,
            t,
            &rec.reason,
        ]);
        let record = self
            .aggregates
            .get_or_insert_with(aggregate_key, || AggregateRecord {
                messages: MessageSet::default(),
                last: UNIX_EPOCH,
            });
        if now
            .duration_since(record.last)
            .is_ok_and(|d| d > AGGREGATE_INTERVAL)
        {
            record.messages.clear();
        }
        record.messages.insert(key_of(&[&rec.message]));
        record.last = now;
        let (key, message, time) = if record.messages.len() < AGGREGATE_MAX_EVENTS {
            let key = key_of(&[
                c,
                h,
                o.kind,
                &o.namespace,
                &o.name,
                &o.field_path,
                &o.uid,
                o.api_version,
                t,
                &rec.reason,
                &rec.message,
            ]);
            (key, rec.message.clone(), rec.time)
        } else {
            // Keep the set one below the threshold: every further different
            // message is combined again.
            record.messages.remove_one();
            (
                aggregate_key,
                format!("{COMBINED_PREFIX}{}", rec.message),
                now,
            )
        };

        // 2. The logger: a repeat patches the event sent before.
        let stamp = rfc3339(time);
        let log = self.logs.get_or_insert_with(key, || LogRecord {
            count: 0,
            first: time,
        });
        log.count += 1;
        let (count, first_time) = (log.count, log.first);
        // The key covers the object's name: the same name every time.
        let name = format!("{}.{:x}", o.name, unix_nanos(first_time));
        let first = rfc3339(first_time);
        let patch = (count > 1)
            .then(|| json!({"count": count, "lastTimestamp": stamp, "message": message}));
        let namespace = if o.namespace.is_empty() {
            "default".to_string()
        } else {
            o.namespace.clone()
        };
        let source = (c, h);
        let out = Outgoing {
            event: event_body(
                source,
                rec,
                &namespace,
                &name,
                &message,
                (&first, &stamp),
                count,
            ),
            namespace,
            name,
            patch,
        };

        // 3. The spam filter, per source and object.
        let spam_key = key_of(&[
            c,
            h,
            o.kind,
            &o.namespace,
            &o.name,
            &o.uid,
            o.api_version,
            t,
        ]);
        let bucket = self.buckets.get_or_insert_with(spam_key, || Bucket {
            tokens: SPAM_BURST,
            last: now,
        });
        let elapsed = now.duration_since(bucket.last).unwrap_or_default();
        bucket.tokens = (bucket.tokens + elapsed.as_secs_f64() * SPAM_QPS).min(SPAM_BURST);
        bucket.last = bucket.last.max(now);
        if bucket.tokens < 1.0 {
            return None;
        }
        bucket.tokens -= 1.0;
        Some(out)
    }
}

/// The core/v1 Event object, as the kubelet sends it: `source` is (component,
/// host), `times` (firstTimestamp, lastTimestamp).
fn event_body(
    source: (&str, &str),
    rec: &Recorded,
    namespace: &str,
    name: &str,
    message: &str,
    times: (&str, &str),
    count: u64,
) -> Value {
    let o = &rec.obj;
    let mut involved = Map::new();
    for (field, value) in [
        ("kind", o.kind),
        ("namespace", &o.namespace),
        ("name", &o.name),
        ("uid", &o.uid),
        ("apiVersion", o.api_version),
        ("resourceVersion", &o.resource_version),
        ("fieldPath", &o.field_path),
    ] {
        if !value.is_empty() {
            involved.insert(field.to_string(), Value::from(value));
        }
    }
    json!({
        "kind": "Event",
        "apiVersion": "v1",
        "metadata": {"name": name, "namespace": namespace, "creationTimestamp": null},
        "involvedObject": involved,
        "reason": rec.reason,
        "message": message,
        "source": {"component": source.0, "host": source.1},
        "firstTimestamp": times.0,
        "lastTimestamp": times.1,
        "count": count,
        "type": rec.kind.as_str(),
        "eventTime": null,
        "reportingComponent": "",
        "reportingInstance": "",
    })
}

fn unix_nanos(t: SystemTime) -> u128 {
    t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos())
}

/// `t` as RFC 3339 in whole seconds (`metav1.Time`).
fn rfc3339(t: SystemTime) -> String {
    let secs = t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    i64::try_from(secs)
        .ok()
        .and_then(|s| Timestamp::from_second(s).ok())
        .unwrap_or(Timestamp::UNIX_EPOCH)
        .to_string()
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;

    use crossbeam_channel::unbounded;

    use super::*;
    use crate::kube::ErrorKind;
    use crate::runtime::fake::{test_pod, wait_for};

    /// The body of the recorded POST in fixture 12a (apiserver v1.20).
    const FIXTURE_12A: &str = r#"{"kind":"Event","apiVersion":"v1","metadata":{"name":"app-2.18ea379df4956c3f","namespace":"default","creationTimestamp":null},"involvedObject":{"kind":"Pod","namespace":"default","name":"app-2","uid":"dc1cfbb9-8f16-4fdd-9cba-c55943046cdc","apiVersion":"v1","resourceVersion":"403","fieldPath":"spec.containers{sleeper}"},"reason":"Started","message":"Started container sleeper","source":{"component":"kubelet","host":"edge-1"},"firstTimestamp":"2026-11-22T00:49:13Z","lastTimestamp":"2026-11-22T00:49:13Z","count":1,"type":"Normal","eventTime":null,"reportingComponent":"","reportingInstance":""}"#;
    /// The body of the recorded PATCH in fixture 12b.
    const FIXTURE_12B: &str = r#"{"count":2,"lastTimestamp":"2026-11-22T00:49:14Z","message":"Started container sleeper"}"#;
    /// The body of the recorded POST in fixture 12c.
    const FIXTURE_12C: &str = r#"{"kind":"Event","apiVersion":"v1","metadata":{"name":"edge-1.18ea379e3471bcf2","namespace":"default","creationTimestamp":null},"involvedObject":{"kind":"Node","name":"edge-1","uid":"edge-1"},"reason":"NodeReady","message":"Node edge-1 status is now: NodeReady","source":{"component":"kubelet","host":"edge-1"},"firstTimestamp":"2026-11-22T00:49:14Z","lastTimestamp":"2026-11-22T00:49:14Z","count":1,"type":"Normal","eventTime":null,"reportingComponent":"","reportingInstance":""}"#;

    fn at_nanos(n: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_nanos(n)
    }

    /// The time of fixture 12a's event name.
    fn t0() -> SystemTime {
        at_nanos(0x18ea379df4956c3f)
    }

    fn fixture_pod() -> Pod {
        let mut pod = test_pod("dc1cfbb9-8f16-4fdd-9cba-c55943046cdc", "app-2");
        pod.metadata.resource_version = Some("403".into());
        pod
    }

    fn rec(obj: &ObjectRef, reason: &str, message: &str, time: SystemTime) -> Recorded {
        Recorded {
            obj: obj.clone(),
            kind: EventType::Normal,
            reason: reason.into(),
            message: message.into(),
            time,
        }
    }

    fn correlator() -> Correlator {
        Correlator::new("kubelet", "edge-1")
    }

    #[test]
    fn object_refs_name_the_container_and_the_node() {
        let pod = fixture_pod();
        assert_eq!(
            ObjectRef::container(&pod, "app", false).field_path,
            "spec.containers{app}"
        );
        let init = ObjectRef::container(&pod, "setup", true);
        assert_eq!(init.field_path, "spec.initContainers{setup}");
        assert_eq!(init.uid, "dc1cfbb9-8f16-4fdd-9cba-c55943046cdc");
        assert_eq!(init.resource_version, "403");
        assert_eq!(ObjectRef::pod(&pod).field_path, "");
        let mut debugged = pod.clone();
        debugged.spec.as_mut().unwrap().ephemeral_containers =
            Some(vec![k8s_openapi::api::core::v1::EphemeralContainer {
                name: "debugger".into(),
                ..Default::default()
            }]);
        assert_eq!(
            ObjectRef::container(&debugged, "debugger", false).field_path,
            "spec.ephemeralContainers{debugger}"
        );
        let node = ObjectRef::node("edge-1");
        assert_eq!((node.kind, node.uid.as_str()), ("Node", "edge-1"));
    }

    #[test]
    fn a_new_event_is_created_as_in_fixture_12a() {
        let obj = ObjectRef::container(&fixture_pod(), "sleeper", false);
        let out = correlator()
            .correlate(
                &rec(&obj, "Started", "Started container sleeper", t0()),
                t0(),
            )
            .unwrap();
        let want: Value = serde_json::from_str(FIXTURE_12A).unwrap();
        assert_eq!(out.event, want);
        assert_eq!(out.namespace, "default");
        assert_eq!(out.name, "app-2.18ea379df4956c3f");
        assert_eq!(out.patch, None);
    }

    #[test]
    fn a_node_event_goes_to_default_as_in_fixture_12c() {
        let t = at_nanos(0x18ea379e3471bcf2);
        let obj = ObjectRef::node("edge-1");
        let out = correlator()
            .correlate(
                &rec(&obj, "NodeReady", "Node edge-1 status is now: NodeReady", t),
                t,
            )
            .unwrap();
        let want: Value = serde_json::from_str(FIXTURE_12C).unwrap();
        assert_eq!(out.event, want);
        assert_eq!(out.namespace, "default");
    }

    #[test]
    fn identical_events_patch_the_count_of_the_first() {
        let obj = ObjectRef::container(&fixture_pod(), "sleeper", false);
        let mut c = correlator();
        let msg = "Started container sleeper";
        let first = c.correlate(&rec(&obj, "Started", msg, t0()), t0()).unwrap();
        assert_eq!(first.patch, None);

        let t1 = t0() + Duration::from_secs(1);
        let second = c.correlate(&rec(&obj, "Started", msg, t1), t1).unwrap();
        let want: Value = serde_json::from_str(FIXTURE_12B).unwrap();
        assert_eq!(second.patch, Some(want));
        assert_eq!(second.name, first.name);
        // The create fallback (when the event is gone) carries the count.
        assert_eq!(second.event["count"], 2);
        assert_eq!(second.event["firstTimestamp"], "2026-11-22T00:49:13Z");
        assert_eq!(second.event["lastTimestamp"], "2026-11-22T00:49:14Z");

        let t2 = t0() + Duration::from_secs(2);
        let third = c.correlate(&rec(&obj, "Started", msg, t2), t2).unwrap();
        assert_eq!(third.patch.as_ref().unwrap()["count"], 3);
        assert_eq!(third.name, first.name);

        // Another message is another event.
        let other = c.correlate(&rec(&obj, "Started", "other", t2), t2).unwrap();
        assert_eq!(other.patch, None);
        assert_ne!(other.name, first.name);
    }

    #[test]
    fn similar_events_are_combined_from_the_tenth_message() {
        let obj = ObjectRef::pod(&fixture_pod());
        let mut c = correlator();
        let mut t = t0();
        for i in 0..9 {
            t += Duration::from_secs(1);
            let out = c
                .correlate(&rec(&obj, "Failed", &format!("m{i}"), t), t)
                .unwrap();
            assert_eq!(out.event["message"], format!("m{i}"));
            assert_eq!(out.patch, None);
        }
        t += Duration::from_secs(1);
        let tenth = c.correlate(&rec(&obj, "Failed", "m9", t), t).unwrap();
        assert_eq!(tenth.event["message"], "(combined from similar events): m9");
        assert_eq!(tenth.name, format!("app-2.{:x}", unix_nanos(t)));
        assert_eq!(tenth.patch, None);

        t += Duration::from_secs(1);
        let eleventh = c.correlate(&rec(&obj, "Failed", "m10", t), t).unwrap();
        assert_eq!(eleventh.name, tenth.name);
        let patch = eleventh.patch.unwrap();
        assert_eq!(patch["count"], 2);
        assert_eq!(patch["message"], "(combined from similar events): m10");

        // Another reason is not similar.
        let other = c.correlate(&rec(&obj, "Killing", "k", t), t).unwrap();
        assert_eq!(other.event["message"], "k");

        // After ten quiet minutes the count starts again.
        t += AGGREGATE_INTERVAL + Duration::from_secs(1);
        let later = c.correlate(&rec(&obj, "Failed", "m11", t), t).unwrap();
        assert_eq!(later.event["message"], "m11");
    }

    #[test]
    fn the_spam_filter_drops_the_26th_event_of_one_object() {
        let a = ObjectRef::pod(&fixture_pod());
        let b = ObjectRef::pod(&test_pod("uid-b", "app-b"));
        let mut c = correlator();
        let t = t0();
        for i in 0..25 {
            assert!(
                c.correlate(&rec(&a, "Pulled", "same", t), t).is_some(),
                "event {i}"
            );
        }
        assert!(c.correlate(&rec(&a, "Pulled", "same", t), t).is_none());
        assert!(c.correlate(&rec(&a, "Other", "x", t), t).is_none());
        assert!(c.correlate(&rec(&b, "Pulled", "same", t), t).is_some());

        // One token comes back every 5 minutes.
        let later = t + Duration::from_secs(300);
        let out = c
            .correlate(&rec(&a, "Pulled", "same", later), later)
            .unwrap();
        // The dropped events were counted: the patch says so.
        assert_eq!(out.patch.unwrap()["count"], 27);
        assert!(c
            .correlate(&rec(&a, "Pulled", "same", later), later)
            .is_none());
    }

    #[test]
    fn caches_forget_the_least_recently_used_entry() {
        let mut lru = Lru::new(2);
        *lru.get_or_insert_with(1, || 10) += 1;
        lru.get_or_insert_with(2, || 20);
        // Use 1 again, so 2 is the oldest when 3 comes.
        assert_eq!(*lru.get_or_insert_with(1, || 0), 11);
        lru.get_or_insert_with(3, || 30);
        assert_eq!(lru.map.len(), 2);
        assert_eq!(*lru.get_or_insert_with(1, || 0), 11);
        assert_eq!(*lru.get_or_insert_with(2, || 0), 0);
    }

    // --- through the thread, with a fake sink ---

    #[derive(Clone, Debug, PartialEq)]
    enum Call {
        Create {
            ns: String,
            body: Value,
        },
        Patch {
            ns: String,
            name: String,
            body: Value,
        },
    }

    #[derive(Default)]
    struct FakeState {
        calls: Vec<Call>,
        /// The outcome of the next calls; `None` or empty: success.
        errors: VecDeque<Option<ApiError>>,
    }

    /// Records calls and fails them as scripted. With a gate, every create
    /// reports on `entered` and then waits for a message on `release`.
    struct FakeSink {
        state: Arc<Mutex<FakeState>>,
        gate: Option<(Sender<()>, Receiver<()>)>,
    }

    impl FakeSink {
        fn outcome(&mut self, call: Call) -> Result<Value, ApiError> {
            let mut s = self.state.lock();
            s.calls.push(call);
            match s.errors.pop_front().flatten() {
                Some(e) => Err(e),
                None => Ok(json!({})),
            }
        }
    }

    impl EventSink for FakeSink {
        fn create(&mut self, namespace: &str, event: &Value) -> Result<Value, ApiError> {
            if let Some((entered, release)) = &self.gate {
                entered.send(()).unwrap();
                release.recv().unwrap();
            }
            self.outcome(Call::Create {
                ns: namespace.into(),
                body: event.clone(),
            })
        }
        fn patch(&mut self, namespace: &str, name: &str, patch: &Value) -> Result<Value, ApiError> {
            self.outcome(Call::Patch {
                ns: namespace.into(),
                name: name.into(),
                body: patch.clone(),
            })
        }
    }

    fn status_error(code: u16, reason: &str) -> ApiError {
        ApiError {
            verb: "POST",
            path: "/api/v1/namespaces/default/events".into(),
            kind: ErrorKind::Status {
                code,
                reason: reason.into(),
                message: "scripted".into(),
                retry_after: None,
            },
        }
    }

    fn transport_error() -> ApiError {
        ApiError {
            verb: "POST",
            path: "/api/v1/namespaces/default/events".into(),
            kind: ErrorKind::Transport("connection refused".into()),
        }
    }

    struct FakeClock(Mutex<SystemTime>);

    impl Clock for FakeClock {
        fn now(&self) -> SystemTime {
            let mut t = self.0.lock();
            *t += Duration::from_millis(1);
            *t
        }
    }

    fn start(
        errors: Vec<Option<ApiError>>,
        retry_delay: Duration,
    ) -> (EventBroadcaster, EventRecorder, Arc<Mutex<FakeState>>) {
        let state = Arc::new(Mutex::new(FakeState {
            calls: Vec::new(),
            errors: errors.into(),
        }));
        let sink = FakeSink {
            state: state.clone(),
            gate: None,
        };
        let options = BroadcasterOptions {
            clock: Arc::new(FakeClock(Mutex::new(t0()))),
            retry_delay,
            ..BroadcasterOptions::default()
        };
        let (b, r) =
            EventBroadcaster::start_with(Box::new(sink), "kubelet", "edge-1", options).unwrap();
        (b, r, state)
    }

    fn messages(state: &Mutex<FakeState>) -> Vec<(&'static str, Value)> {
        state
            .lock()
            .calls
            .iter()
            .map(|c| match c {
                Call::Create { body, .. } => ("create", body["message"].clone()),
                Call::Patch { body, .. } => ("patch", body["message"].clone()),
            })
            .collect()
    }

    #[test]
    fn the_thread_creates_then_patches_and_recreates_a_deleted_event() {
        let not_found = status_error(404, "NotFound");
        let (_b, r, state) = start(vec![None, None, Some(not_found)], Duration::from_millis(1));
        let obj = ObjectRef::container(&fixture_pod(), "sleeper", false);
        for _ in 0..3 {
            r.event(
                &obj,
                EventType::Normal,
                "Started",
                "Started container sleeper",
            );
        }
        wait_for("four calls", || state.lock().calls.len() >= 4);
        let calls = state.lock().calls.clone();
        let Call::Create { ns, body } = &calls[0] else {
            panic!("first call {:?}", calls[0]);
        };
        assert_eq!(ns, "default");
        let name = body["metadata"]["name"].as_str().unwrap();
        assert!(name.starts_with("app-2."), "{name}");
        let Call::Patch {
            ns,
            name: patched,
            body,
        } = &calls[1]
        else {
            panic!("second call {:?}", calls[1]);
        };
        assert_eq!((ns.as_str(), patched.as_str()), ("default", name));
        assert_eq!(body["count"], 2);
        // The third is a patch that finds the event gone, then a create.
        assert!(matches!(&calls[2], Call::Patch { body, .. } if body["count"] == 3));
        let Call::Create { body, .. } = &calls[3] else {
            panic!("fourth call {:?}", calls[3]);
        };
        assert_eq!(body["metadata"]["name"], name);
        assert_eq!(body["count"], 3);
        assert_eq!(body["type"], "Normal");
    }

    #[test]
    fn already_exists_is_done_and_other_rejections_are_not_retried() {
        let (_b, r, state) = start(
            vec![
                Some(status_error(409, "AlreadyExists")),
                Some(status_error(403, "Forbidden")),
            ],
            Duration::from_millis(1),
        );
        let obj = ObjectRef::node("edge-1");
        for m in ["a", "b", "c"] {
            r.event(&obj, EventType::Warning, "Test", m);
        }
        wait_for("three calls", || state.lock().calls.len() >= 3);
        // Calls are made in order; a retry would come before the next event.
        assert_eq!(
            messages(&state),
            vec![
                ("create", json!("a")),
                ("create", json!("b")),
                ("create", json!("c"))
            ]
        );
    }

    #[test]
    fn a_transport_error_is_retried_then_the_event_dropped() {
        let (_b, r, state) = start(vec![Some(transport_error()); 4], Duration::from_millis(1));
        let obj = ObjectRef::node("edge-1");
        r.event(&obj, EventType::Normal, "Test", "a");
        r.event(&obj, EventType::Normal, "Test", "b");
        wait_for("five calls", || state.lock().calls.len() >= 5);
        assert_eq!(
            messages(&state),
            vec![
                ("create", json!("a")),
                ("create", json!("a")),
                ("create", json!("a")),
                ("create", json!("b")),
                ("create", json!("b")),
            ]
        );
    }

    #[test]
    fn a_full_queue_drops_events_without_blocking() {
        let state = Arc::new(Mutex::new(FakeState::default()));
        let (entered_tx, entered) = unbounded();
        let (release, release_rx) = unbounded();
        let sink = FakeSink {
            state: state.clone(),
            gate: Some((entered_tx, release_rx)),
        };
        let options = BroadcasterOptions {
            clock: Arc::new(FakeClock(Mutex::new(t0()))),
            queue: 2,
            ..BroadcasterOptions::default()
        };
        let (b, r) =
            EventBroadcaster::start_with(Box::new(sink), "kubelet", "edge-1", options).unwrap();
        let obj = ObjectRef::node("edge-1");
        r.event(&obj, EventType::Normal, "Test", "m0");
        // The thread holds m0 in the sink; the queue takes two more.
        entered.recv_timeout(Duration::from_secs(5)).unwrap();
        for i in 1..=10 {
            r.event(&obj, EventType::Normal, "Test", format!("m{i}"));
        }
        assert_eq!(r.dropped(), 8);
        for _ in 0..3 {
            release.send(()).unwrap();
        }
        wait_for("three creates", || state.lock().calls.len() >= 3);
        drop(b);
        assert_eq!(
            messages(&state),
            vec![
                ("create", json!("m0")),
                ("create", json!("m1")),
                ("create", json!("m2"))
            ]
        );
    }

    #[test]
    fn dropping_the_broadcaster_stops_a_backing_off_thread_promptly() {
        let (b, r, state) = start(vec![Some(transport_error())], Duration::from_secs(600));
        let obj = ObjectRef::node("edge-1");
        r.event(&obj, EventType::Normal, "Test", "a");
        wait_for("the first attempt", || state.lock().calls.len() == 1);
        let started = Instant::now();
        drop(b);
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "drop took {:?}",
            started.elapsed()
        );
        // Recording after the stop neither blocks nor panics.
        r.event(&obj, EventType::Normal, "Test", "b");
        assert_eq!(state.lock().calls.len(), 1);
    }
}
