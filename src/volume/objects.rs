//! The Secret and ConfigMap manager (upstream's `pkg/kubelet/secret` and
//! `pkg/kubelet/configmap` over `util/manager`): the `ObjectSource` the
//! volume manager and env resolution read, with the three change detection
//! strategies of `configMapAndSecretChangeDetectionStrategy`.
//!
//! - `Watch` (the default): every object a pod on the node references (its
//!   volumes, `configMapKeyRef`/`secretKeyRef`, `envFrom`) is watched by
//!   name — a reflector over its namespace with `metadata.name=<name>`,
//!   which is what the Node authorizer allows — from the first pod that
//!   references it to the last. Reads come from the reflector's copy; one
//!   before its first list waits up to a second, as upstream. A watch that
//!   fails keeps the last content and is retried by the reflector with
//!   back-off. A change is announced to the sync loop with the UIDs of the
//!   pods that reference the object, so their workers rewrite the volumes
//!   at once instead of at the next periodic resync. An object marked
//!   `immutable` is not watched any further.
//! - `Cache`: a GET, kept for the node's TTL (annotation
//!   `node.alpha.kubernetes.io/ttl`, else one minute); a pod that is
//!   registered again (new, or its references changed) fetches afresh.
//! - `Get`: a GET at every read.
//!
//! Watches are bounded. They all run on one thread (`kube::WatchMux`), but
//! each holds an apiserver connection (HTTP/1.1 carries one watch at a
//! time, and the Node authorizer allows a watch of one name only), so the
//! node keeps at most [`NODE_WATCHES`] of them and gives one pod at most
//! [`POD_WATCHES`] (objects it shares with pods that already have them
//! watched count too). An object past either bound is read as under
//! `Cache`: a GET at a read, kept for the TTL; its changes reach the
//! pod's files at the pod's periodic resync. The pod gets a Warning event
//! (`ObjectsNotWatched`) naming them. Upstream pays an HTTP/2 stream per
//! object instead, without a bound; here a pod that references 1,100
//! ConfigMaps would otherwise hold 1,100 connections and file descriptors.
//! A slot freed (its object no longer referenced, or immutable) goes to
//! the next pod that syncs with objects not watched.
//!
//! An object read while no pod references it (a pull secret, a pod not
//! registered yet) is fetched with a GET in every mode.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::Sender;
use k8s_openapi::api::core::v1::Pod;
use log::{info, warn};
use parking_lot::{Condvar, Mutex};
use serde_json::Value;

use super::payload::{Fetched, Keys, Token};
use super::ObjectSource;
use crate::events::{EventRecorder, EventType};

/// `configMapAndSecretChangeDetectionStrategy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum Strategy {
    #[default]
    Watch,
    Cache,
    Get,
}

impl Strategy {
    pub(crate) fn parse(s: &str) -> Result<Strategy, String> {
        match s {
            "Watch" => Ok(Strategy::Watch),
            "Cache" => Ok(Strategy::Cache),
            "Get" => Ok(Strategy::Get),
            _ => Err(format!(
                "unknown change detection strategy {s:?} (Watch, Cache or Get)"
            )),
        }
    }
}

/// The kind of a referenced object.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum ObjectKind {
    Secret,
    ConfigMap,
}

impl ObjectKind {
    fn what(self) -> &'static str {
        match self {
            ObjectKind::Secret => "secret",
            ObjectKind::ConfigMap => "configmap",
        }
    }
}

/// One referenced object: kind, namespace, name.
pub(crate) type ObjectRef = (ObjectKind, String, String);

/// What a watch reports: the object's keys (None: it does not exist), and
/// whether it is immutable.
pub(crate) struct Observed {
    pub(crate) keys: Fetched,
    pub(crate) immutable: bool,
}

/// How the manager starts a watch of one object. The returned handle stops
/// the watch when dropped; `sink` gets every complete state after the first
/// list and after every change.
pub(crate) trait Watcher: Send + Sync {
    fn watch(
        &self,
        object: &ObjectRef,
        sink: Box<dyn FnMut(Observed) + Send>,
    ) -> Result<Box<dyn Send>, String>;
}

/// How long a read waits for a new watch's first list (upstream: 1 s).
const SYNC_WAIT: Duration = Duration::from_secs(1);
/// The TTL of the Cache strategy when the node has no TTL annotation.
pub(crate) const DEFAULT_TTL: Duration = Duration::from_secs(60);
/// Watches the node keeps at most (a connection and ~20 KiB each, on one
/// thread): with the agent's own ~50 open files this keeps it under 300
/// however many objects pods reference.
pub(crate) const NODE_WATCHES: usize = 200;
/// Watches one pod gets at most, so that one pod cannot take the node's
/// whole budget; a pod seldom references more than a handful of objects.
pub(crate) const POD_WATCHES: usize = 32;
/// Objects named in a Warning event; the rest are counted.
const NAMED_IN_EVENT: usize = 10;

/// What the manager keeps of one object.
#[derive(Default)]
struct Entry {
    /// The pods (UIDs) that reference it.
    pods: BTreeSet<String>,
    /// Watch: the last state the watch reported (None before its first
    /// list). Cache: the last GET and when it was made.
    keys: Option<Fetched>,
    fetched_at: Option<Instant>,
    /// Watch: the handle that keeps the watch going.
    watch: Option<Box<dyn Send>>,
    /// Watch: the object holds one of the node's watch slots (from the
    /// decision to watch it until it is dropped, immutable, or its watch
    /// could not start).
    slot: bool,
    /// Watch: the object is immutable, so its watch was stopped.
    immutable: bool,
}

impl Entry {
    /// Watch: read as under `Cache` (no slot, and not stopped as immutable).
    fn cached(&self) -> bool {
        !self.slot && !self.immutable
    }
}

#[derive(Default)]
struct State {
    objects: HashMap<ObjectRef, Entry>,
    /// Pod UID → the objects it references.
    pods: HashMap<String, BTreeSet<ObjectRef>>,
    /// Watch: the objects that hold a slot.
    slots: usize,
}

impl State {
    /// Drops `object` (no pod references it any more), freeing its slot.
    fn drop_object(&mut self, object: &ObjectRef) -> Option<Entry> {
        let e = self.objects.remove(object)?;
        if e.slot {
            self.slots -= 1;
        }
        Some(e)
    }
}

pub struct ObjectManager {
    /// GETs and TokenRequests.
    api: Arc<dyn ObjectSource>,
    /// Watch: the GETs of objects past the bounds on watches (by default
    /// `api`; in the agent a client with a rate limiter of its own, so that
    /// a pod with a thousand objects delays no one else's requests).
    overflow: Arc<dyn ObjectSource>,
    strategy: Strategy,
    watcher: Option<Arc<dyn Watcher>>,
    /// The Cache strategy's TTL (the node's annotation, when it has one).
    ttl: Box<dyn Fn() -> Duration + Send + Sync>,
    /// Where the UIDs of pods whose objects changed are sent (the sync loop
    /// dispatches a sync of each).
    notify: Option<Sender<String>>,
    /// Where a pod whose objects are not all watched is told so.
    recorder: EventRecorder,
    /// Watch: the node's and each pod's bound on watches.
    node_watches: usize,
    pod_watches: usize,
    state: Arc<(Mutex<State>, Condvar)>,
}

impl ObjectManager {
    /// `watcher` is needed for `Strategy::Watch` (without one, reads are as
    /// under Cache).
    pub(crate) fn new(
        api: Arc<dyn ObjectSource>,
        strategy: Strategy,
        watcher: Option<Arc<dyn Watcher>>,
        ttl: Box<dyn Fn() -> Duration + Send + Sync>,
        notify: Option<Sender<String>>,
    ) -> ObjectManager {
        ObjectManager {
            overflow: api.clone(),
            api,
            strategy,
            watcher,
            ttl,
            notify,
            recorder: EventRecorder::disabled(),
            node_watches: NODE_WATCHES,
            pod_watches: POD_WATCHES,
            state: Arc::new((Mutex::new(State::default()), Condvar::new())),
        }
    }

    /// The GETs of objects past the bounds on watches go to `source`.
    pub(crate) fn with_overflow_source(mut self, source: Arc<dyn ObjectSource>) -> ObjectManager {
        self.overflow = source;
        self
    }

    /// Pods whose objects are not all watched get a Warning event here.
    pub(crate) fn with_recorder(mut self, recorder: EventRecorder) -> ObjectManager {
        self.recorder = recorder;
        self
    }

    /// Other bounds on watches than [`NODE_WATCHES`] and [`POD_WATCHES`].
    #[cfg(test)]
    fn with_watch_bounds(mut self, node: usize, pod: usize) -> ObjectManager {
        self.node_watches = node;
        self.pod_watches = pod;
        self
    }

    /// Watch: the objects that are watched (or whose watch is starting).
    #[cfg(test)]
    fn watched(&self) -> usize {
        self.state.0.lock().slots
    }

    /// The number of objects referenced by registered pods (watched, in Watch).
    pub fn objects(&self) -> usize {
        self.state.0.lock().objects.len()
    }

    fn fetch(&self, object: &ObjectRef) -> Result<Fetched, String> {
        fetch_from(&*self.api, object)
    }

    fn read(&self, object: ObjectRef) -> Result<Fetched, String> {
        match self.strategy {
            Strategy::Get => self.fetch(&object),
            Strategy::Cache => self.read_cached(object, &*self.api),
            Strategy::Watch => self.read_watched(object),
        }
    }

    /// Reads `object` as under `Cache`, a GET from `source` when the copy
    /// is older than the TTL.
    fn read_cached(&self, object: ObjectRef, source: &dyn ObjectSource) -> Result<Fetched, String> {
        let ttl = (self.ttl)();
        {
            let st = self.state.0.lock();
            match st.objects.get(&object) {
                None => {
                    drop(st);
                    return fetch_from(source, &object);
                }
                Some(e) => {
                    if let (Some(keys), Some(at)) = (&e.keys, e.fetched_at) {
                        if at.elapsed() < ttl {
                            return Ok(keys.clone());
                        }
                    }
                }
            }
        }
        // No lock across the GET. A failed refresh of an object fetched
        // before keeps what was fetched, as upstream.
        let got = fetch_from(source, &object);
        let mut st = self.state.0.lock();
        let entry = st.objects.get_mut(&object);
        match (got, entry) {
            (Ok(keys), Some(e)) => {
                e.keys = Some(keys.clone());
                e.fetched_at = Some(Instant::now());
                Ok(keys)
            }
            (Ok(keys), None) => Ok(keys),
            (Err(err), Some(e)) => match &e.keys {
                Some(keys) => {
                    warn!(
                        "{} {}/{}: refresh failed, using the copy from before: {err}",
                        object.0.what(),
                        object.1,
                        object.2
                    );
                    Ok(keys.clone())
                }
                None => Err(err),
            },
            (Err(err), None) => Err(err),
        }
    }

    fn read_watched(&self, object: ObjectRef) -> Result<Fetched, String> {
        let (lock, synced) = &*self.state;
        let deadline = Instant::now() + SYNC_WAIT;
        let mut st = lock.lock();
        loop {
            match st.objects.get(&object) {
                None => {
                    drop(st);
                    return self.fetch(&object);
                }
                Some(e) => {
                    if e.cached() {
                        // Not watched (over the bounds, or its watch could
                        // not start): read as under Cache.
                        drop(st);
                        return self.read_cached(object, &*self.overflow);
                    }
                    if let Some(keys) = &e.keys {
                        return Ok(keys.clone());
                    }
                }
            }
            if synced.wait_until(&mut st, deadline).timed_out() {
                return Err(format!(
                    "failed to sync {} cache: timed out waiting for the condition",
                    object.0.what()
                ));
            }
        }
    }

    /// Starts watching `object` (Watch strategy), with a sink that keeps its
    /// state and announces changes to the pods that reference it.
    fn start_watch(&self, object: &ObjectRef) -> Option<Box<dyn Send>> {
        let watcher = self.watcher.as_ref()?;
        let state = Arc::downgrade(&self.state);
        let notify = self.notify.clone();
        let key = object.clone();
        let sink = Box::new(move |seen: Observed| {
            let Some(state) = state.upgrade() else { return };
            let (lock, synced) = &*state;
            let mut st = lock.lock();
            let Some(e) = st.objects.get_mut(&key) else {
                return;
            };
            if !e.slot {
                // A watch of an object dropped since (or stopped as
                // immutable) that has not noticed yet.
                return;
            }
            let changed = e.keys.as_ref().is_some_and(|k| *k != seen.keys);
            e.keys = Some(seen.keys);
            let mut stop = None;
            if seen.immutable {
                // Immutable: its content can no longer change, and its
                // slot goes to an object that can.
                e.immutable = true;
                e.slot = false;
                stop = e.watch.take();
            }
            let pods: Vec<String> = if changed {
                e.pods.iter().cloned().collect()
            } else {
                Vec::new()
            };
            if seen.immutable {
                st.slots -= 1;
            }
            drop(st);
            synced.notify_all();
            drop(stop);
            if changed {
                info!(
                    "{} {}/{} changed; syncing the {} pod(s) that use it",
                    key.0.what(),
                    key.1,
                    key.2,
                    pods.len()
                );
            }
            if let Some(tx) = &notify {
                for uid in pods {
                    // A full channel only delays the rewrite to the pod's
                    // periodic resync.
                    if tx.try_send(uid).is_err() {
                        warn!(
                            "{} {}/{} changed; the sync loop is busy, its pods pick it up at their next resync",
                            key.0.what(),
                            key.1,
                            key.2
                        );
                        break;
                    }
                }
            }
        });
        match watcher.watch(object, sink) {
            Ok(handle) => Some(handle),
            Err(e) => {
                warn!(
                    "{} {}/{}: cannot watch it, reading it by GET at most once per TTL: {e}",
                    object.0.what(),
                    object.1,
                    object.2
                );
                None
            }
        }
    }

    /// Registers the objects `pod` references; objects no other pod
    /// references any more are dropped (their watches stop). Watch: the
    /// pod's new objects are watched while the bounds allow, the others are
    /// read as under Cache, and the pod is told which in a Warning event.
    /// At a sync with the same references, objects of the pod that are not
    /// watched take the slots freed since.
    pub(crate) fn register(&self, pod: &Pod) {
        let uid = crate::pod::pod_uid(pod).to_string();
        let wanted = references(pod);
        let mut dropped = Vec::new();
        let mut added = Vec::new();
        let mut unwatched = Vec::new();
        {
            let mut st = self.state.0.lock();
            let same = st.pods.get(&uid).is_some_and(|had| *had == wanted);
            if same {
                if self.strategy == Strategy::Watch && st.slots < self.node_watches {
                    added = self.grant_slots(&mut st, &wanted);
                }
                drop(st);
                self.start_watches(added);
                return;
            }
            let had = st.pods.remove(&uid).unwrap_or_default();
            for o in had.difference(&wanted) {
                if let Some(e) = st.objects.get_mut(o) {
                    e.pods.remove(&uid);
                    if e.pods.is_empty() {
                        dropped.extend(st.drop_object(o));
                    }
                }
            }
            for o in &wanted {
                let e = st.objects.entry(o.clone()).or_default();
                e.pods.insert(uid.clone());
                if self.strategy == Strategy::Cache || e.cached() {
                    // Fetched afresh at the next read, as upstream does
                    // for a pod that is added or updated.
                    e.fetched_at = None;
                }
            }
            if self.strategy == Strategy::Watch {
                added = self.grant_slots(&mut st, &wanted);
                unwatched = wanted
                    .iter()
                    .filter(|o| st.objects.get(*o).is_some_and(Entry::cached))
                    .cloned()
                    .collect();
            }
            if !wanted.is_empty() {
                st.pods.insert(uid, wanted);
            }
        }
        drop(dropped);
        if !unwatched.is_empty() {
            self.warn_unwatched(pod, &unwatched);
        }
        self.start_watches(added);
    }

    /// Gives slots to the objects of `wanted` that have none, while the
    /// node's and the pod's bounds allow (objects of the pod watched for
    /// other pods count towards its bound); returns the objects to watch.
    fn grant_slots(&self, st: &mut State, wanted: &BTreeSet<ObjectRef>) -> Vec<ObjectRef> {
        let mut pod_slots = wanted
            .iter()
            .filter(|o| st.objects.get(*o).is_some_and(|e| e.slot))
            .count();
        let mut granted = Vec::new();
        for o in wanted {
            if st.slots >= self.node_watches || pod_slots >= self.pod_watches {
                break;
            }
            let Some(e) = st.objects.get_mut(o) else {
                continue;
            };
            if e.cached() {
                e.slot = true;
                st.slots += 1;
                pod_slots += 1;
                granted.push(o.clone());
            }
        }
        granted
    }

    /// Starts the watches of objects just given a slot, outside the lock
    /// (their sink takes it, and may run before the handle is stored: a
    /// first list is not a reason to stop). A watch that cannot start
    /// gives its slot back and its object is read as under Cache.
    fn start_watches(&self, objects: Vec<ObjectRef>) {
        for o in objects {
            let mut handle = self.start_watch(&o);
            let mut st = self.state.0.lock();
            let mut freed = false;
            if let Some(e) = st.objects.get_mut(&o) {
                if e.slot && handle.is_none() {
                    e.slot = false;
                    freed = true;
                } else if e.slot && e.watch.is_none() {
                    e.watch = handle.take();
                }
            }
            if freed {
                st.slots -= 1;
            }
            drop(st);
            // Readers waiting for its first list read it another way.
            self.state.1.notify_all();
            // Not kept (the object went, or is immutable): the watch stops.
            drop(handle);
        }
    }

    /// Tells `pod` which of its objects are not watched, and why.
    fn warn_unwatched(&self, pod: &Pod, unwatched: &[ObjectRef]) {
        let total = references(pod).len();
        let mut names: Vec<String> = unwatched
            .iter()
            .take(NAMED_IN_EVENT)
            .map(|(kind, _, name)| format!("{} {name}", kind.what()))
            .collect();
        if unwatched.len() > NAMED_IN_EVENT {
            names.push(format!("and {} more", unwatched.len() - NAMED_IN_EVENT));
        }
        let message = format!(
            "{} of the {total} Secrets and ConfigMaps this pod references are not watched \
             (the node watches at most {} objects, and at most {} for one pod): they are \
             read from the API server at most once per {} s, and their changes reach the \
             pod at its periodic sync: {}",
            unwatched.len(),
            self.node_watches,
            self.pod_watches,
            (self.ttl)().as_secs(),
            names.join(", ")
        );
        warn!("pod {}: {message}", crate::pod::pod_full_name(pod));
        self.recorder.event(
            &crate::events::ObjectRef::pod(pod),
            EventType::Warning,
            "ObjectsNotWatched",
            message,
        );
    }

    /// Forgets the pod `uid`; objects no pod references any more go.
    pub(crate) fn unregister(&self, uid: &str) {
        let dropped: Vec<Entry> = {
            let mut st = self.state.0.lock();
            let Some(had) = st.pods.remove(uid) else {
                return;
            };
            let mut dropped = Vec::new();
            for o in had {
                if let Some(e) = st.objects.get_mut(&o) {
                    e.pods.remove(uid);
                    if e.pods.is_empty() {
                        dropped.extend(st.drop_object(&o));
                    }
                }
            }
            crate::malloc::shrink_map(&mut st.objects);
            crate::malloc::shrink_map(&mut st.pods);
            dropped
        };
        drop(dropped);
    }
}

impl ObjectSource for ObjectManager {
    fn secret(&self, namespace: &str, name: &str) -> Result<Fetched, String> {
        self.read((ObjectKind::Secret, namespace.into(), name.into()))
    }

    fn config_map(&self, namespace: &str, name: &str) -> Result<Fetched, String> {
        self.read((ObjectKind::ConfigMap, namespace.into(), name.into()))
    }

    fn service_account_token(
        &self,
        pod: &Pod,
        audience: Option<&str>,
        expiration_seconds: i64,
    ) -> Result<Token, String> {
        self.api
            .service_account_token(pod, audience, expiration_seconds)
    }

    fn register_pod(&self, pod: &Pod) {
        self.register(pod);
    }

    fn unregister_pod(&self, uid: &str) {
        self.unregister(uid);
    }
}

/// A GET of `object` from `source`.
fn fetch_from(source: &dyn ObjectSource, object: &ObjectRef) -> Result<Fetched, String> {
    let (kind, ns, name) = object;
    match kind {
        ObjectKind::Secret => source.secret(ns, name),
        ObjectKind::ConfigMap => source.config_map(ns, name),
    }
}

/// The Secrets and ConfigMaps `pod` references in its volumes (also
/// projected sources) and its containers' env (upstream's
/// `VisitPodSecretNames`/`VisitPodConfigmapNames`, without
/// imagePullSecrets, which are read at each pull).
pub(crate) fn references(pod: &Pod) -> BTreeSet<ObjectRef> {
    let ns = pod.metadata.namespace.as_deref().unwrap_or("default");
    let mut out = BTreeSet::new();
    let mut add = |kind: ObjectKind, name: &str| {
        if !name.is_empty() {
            out.insert((kind, ns.to_string(), name.to_string()));
        }
    };
    let Some(spec) = pod.spec.as_ref() else {
        return out;
    };
    for v in spec.volumes.iter().flatten() {
        if let Some(s) = &v.secret {
            add(ObjectKind::Secret, s.secret_name.as_deref().unwrap_or(""));
        }
        if let Some(c) = &v.config_map {
            add(ObjectKind::ConfigMap, &c.name);
        }
        for src in v.projected.iter().flat_map(|p| p.sources.iter().flatten()) {
            if let Some(s) = &src.secret {
                add(ObjectKind::Secret, &s.name);
            }
            if let Some(c) = &src.config_map {
                add(ObjectKind::ConfigMap, &c.name);
            }
        }
    }
    let containers = spec
        .containers
        .iter()
        .chain(spec.init_containers.iter().flatten());
    for c in containers {
        for f in c.env_from.iter().flatten() {
            if let Some(r) = &f.config_map_ref {
                add(ObjectKind::ConfigMap, &r.name);
            }
            if let Some(r) = &f.secret_ref {
                add(ObjectKind::Secret, &r.name);
            }
        }
        for e in c.env.iter().flatten() {
            let Some(from) = &e.value_from else { continue };
            if let Some(r) = &from.config_map_key_ref {
                add(ObjectKind::ConfigMap, &r.name);
            }
            if let Some(r) = &from.secret_key_ref {
                add(ObjectKind::Secret, &r.name);
            }
        }
    }
    out
}

/// A Secret or ConfigMap as a watch keeps it: only what becomes files.
#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct KeyObject<K> {
    #[serde(default)]
    data: Option<BTreeMap<String, String>>,
    #[serde(default)]
    binary_data: Option<BTreeMap<String, String>>,
    #[serde(default)]
    immutable: Option<bool>,
    #[serde(skip)]
    _kind: std::marker::PhantomData<K>,
}

/// The kind markers of `KeyObject`.
pub(crate) struct SecretKind;
pub(crate) struct ConfigMapKind;

impl<K> KeyObject<K> {
    /// Its keys as bytes (Secret `data` is base64).
    fn keys(&self, secret: bool, what: &str) -> Result<Keys, String> {
        super::api::keys_of(
            self.data.iter().flatten(),
            self.binary_data.iter().flatten(),
            secret,
            what,
        )
    }
}

/// The `Watcher` of a node with an apiserver: every object on the one
/// `watch-mux` thread, each on its own connection (the manager bounds how
/// many).
pub(crate) struct ApiWatcher {
    mux: Result<crate::kube::WatchMux, String>,
}

impl ApiWatcher {
    pub(crate) fn new(client: crate::kube::Client) -> ApiWatcher {
        ApiWatcher {
            mux: crate::kube::WatchMux::new(client),
        }
    }
}

/// Turns what the watch hands on into what the manager keeps: the keys of
/// a `KeyObject<K>`, or None when the object does not exist. An object
/// whose keys cannot be read keeps the pods' last content.
fn observe<K>(what: &str, secret: bool, obj: Option<Value>) -> Option<Observed>
where
    KeyObject<K>: serde::de::DeserializeOwned,
{
    let Some(obj) = obj else {
        return Some(Observed {
            keys: None,
            immutable: false,
        });
    };
    let decoded = serde_json::from_value::<KeyObject<K>>(obj)
        .map_err(|e| format!("{what}: {e}"))
        .and_then(|o| Ok((o.keys(secret, what)?, o.immutable == Some(true))));
    match decoded {
        Ok((keys, immutable)) => Some(Observed {
            keys: Some(keys),
            immutable,
        }),
        Err(e) => {
            // Keep what the pods have; the next good version replaces it.
            warn!("{e}; keeping its last content");
            None
        }
    }
}

impl Watcher for ApiWatcher {
    fn watch(
        &self,
        object: &ObjectRef,
        mut sink: Box<dyn FnMut(Observed) + Send>,
    ) -> Result<Box<dyn Send>, String> {
        let mux = self.mux.as_ref().map_err(Clone::clone)?;
        let (kind, ns, name) = object;
        let secret = *kind == ObjectKind::Secret;
        let what = format!("{} {ns}/{name}", kind.what());
        let segment = match kind {
            ObjectKind::Secret => "secrets",
            ObjectKind::ConfigMap => "configmaps",
        };
        let collection = format!("/api/v1/namespaces/{ns}/{segment}");
        let handle = mux
            .watch(
                &collection,
                name,
                Box::new(move |obj: Option<Value>| {
                    let seen = if secret {
                        observe::<SecretKind>(&what, true, obj)
                    } else {
                        observe::<ConfigMapKind>(&what, false, obj)
                    };
                    if let Some(seen) = seen {
                        sink(seen);
                    }
                }),
            )
            .map_err(|e| format!("starting its watch: {e}"))?;
        Ok(Box::new(handle))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{
        ConfigMapEnvSource, ConfigMapVolumeSource, Container, EnvFromSource, EnvVar, EnvVarSource,
        PodSpec, SecretKeySelector, Volume,
    };
    use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};

    /// The apiserver's GETs: a version number per read, or failures.
    #[derive(Default)]
    struct Gets {
        count: AtomicU32,
        version: AtomicU32,
        down: AtomicBool,
    }

    impl ObjectSource for Gets {
        fn secret(&self, _ns: &str, name: &str) -> Result<Fetched, String> {
            self.config_map(_ns, name)
        }
        fn config_map(&self, _ns: &str, name: &str) -> Result<Fetched, String> {
            self.count.fetch_add(1, Ordering::SeqCst);
            if self.down.load(Ordering::SeqCst) {
                return Err("connection refused".into());
            }
            let v = self.version.load(Ordering::SeqCst);
            Ok(Some(keys(name, &v.to_string())))
        }
        fn service_account_token(&self, _: &Pod, _: Option<&str>, _: i64) -> Result<Token, String> {
            Err("no tokens here".into())
        }
    }

    fn keys(k: &str, v: &str) -> Keys {
        [(k.to_string(), v.as_bytes().to_vec())].into()
    }

    /// One started watch: its object, its sink, whether it stopped.
    type Started = (ObjectRef, Box<dyn FnMut(Observed) + Send>, Arc<AtomicBool>);

    /// Watches that the test drives.
    #[derive(Default)]
    struct Watches {
        sinks: Mutex<Vec<Started>>,
        /// Listed before `watch` returns (a fast first list).
        at_once: Mutex<Option<Keys>>,
        /// `watch` fails (no thread could be started).
        refuse: AtomicBool,
    }

    struct Stops(Arc<AtomicBool>);
    impl Drop for Stops {
        fn drop(&mut self) {
            self.0.store(true, Ordering::SeqCst);
        }
    }

    impl Watcher for Watches {
        fn watch(
            &self,
            object: &ObjectRef,
            sink: Box<dyn FnMut(Observed) + Send>,
        ) -> Result<Box<dyn Send>, String> {
            if self.refuse.load(Ordering::SeqCst) {
                return Err("Resource temporarily unavailable".into());
            }
            let stopped = Arc::new(AtomicBool::new(false));
            let mut sink = sink;
            if let Some(keys) = self.at_once.lock().clone() {
                sink(Observed {
                    keys: Some(keys),
                    immutable: false,
                });
            }
            self.sinks
                .lock()
                .push((object.clone(), sink, stopped.clone()));
            Ok(Box::new(Stops(stopped)))
        }
    }

    impl Watches {
        fn send(&self, i: usize, keys: Fetched, immutable: bool) {
            let mut sinks = self.sinks.lock();
            (sinks[i].1)(Observed { keys, immutable });
        }
        fn stopped(&self, i: usize) -> bool {
            self.sinks.lock()[i].2.load(Ordering::SeqCst)
        }
    }

    fn pod(uid: &str, config_maps: &[&str]) -> Pod {
        let mut p = Pod::default();
        p.metadata.name = Some(uid.into());
        p.metadata.namespace = Some("ns".into());
        p.metadata.uid = Some(uid.into());
        p.spec = Some(PodSpec {
            volumes: Some(
                config_maps
                    .iter()
                    .map(|c| Volume {
                        name: format!("v-{c}"),
                        config_map: Some(ConfigMapVolumeSource {
                            name: c.to_string(),
                            ..Default::default()
                        }),
                        ..Default::default()
                    })
                    .collect(),
            ),
            ..Default::default()
        });
        p
    }

    fn cm(name: &str) -> ObjectRef {
        (ObjectKind::ConfigMap, "ns".into(), name.into())
    }

    struct Rig {
        gets: Arc<Gets>,
        watches: Arc<Watches>,
        ttl: Arc<AtomicU64>,
        notified: crossbeam_channel::Receiver<String>,
        m: ObjectManager,
    }

    fn rig(strategy: Strategy) -> Rig {
        let gets = Arc::new(Gets::default());
        let watches = Arc::new(Watches::default());
        let ttl = Arc::new(AtomicU64::new(60));
        let (tx, notified) = crossbeam_channel::bounded(16);
        let t = ttl.clone();
        let m = ObjectManager::new(
            gets.clone(),
            strategy,
            Some(watches.clone()),
            Box::new(move || Duration::from_secs(t.load(Ordering::SeqCst))),
            Some(tx),
        );
        Rig {
            gets,
            watches,
            ttl,
            notified,
            m,
        }
    }

    #[test]
    fn pods_reference_volume_projected_and_env_objects() {
        let mut p = pod("a", &["c1"]);
        let spec = p.spec.as_mut().unwrap();
        spec.containers = vec![Container {
            name: "c".into(),
            env_from: Some(vec![EnvFromSource {
                config_map_ref: Some(ConfigMapEnvSource {
                    name: "env-cm".into(),
                    optional: None,
                }),
                ..Default::default()
            }]),
            env: Some(vec![EnvVar {
                name: "X".into(),
                value_from: Some(EnvVarSource {
                    secret_key_ref: Some(SecretKeySelector {
                        name: "env-s".into(),
                        key: "k".into(),
                        optional: None,
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            }]),
            ..Default::default()
        }];
        let refs: Vec<ObjectRef> = references(&p).into_iter().collect();
        assert_eq!(
            refs,
            vec![
                (ObjectKind::Secret, "ns".into(), "env-s".into()),
                cm("c1"),
                cm("env-cm"),
            ]
        );
    }

    #[test]
    fn watch_reads_come_from_the_watch_and_changes_reach_the_pods() {
        let r = rig(Strategy::Watch);
        r.m.register(&pod("a", &["c1"]));
        r.m.register(&pod("b", &["c1"]));
        // One watch for the object, however many pods use it.
        assert_eq!(r.watches.sinks.lock().len(), 1);
        assert_eq!(r.watches.sinks.lock()[0].0, cm("c1"));

        // Not listed yet: a read waits for the first list (bounded).
        let watches = r.watches.clone();
        let lister = crate::thread::spawn_named("lister", move || {
            std::thread::sleep(Duration::from_millis(100));
            watches.send(0, Some(keys("k", "v1")), false);
        })
        .unwrap();
        assert_eq!(r.m.config_map("ns", "c1").unwrap(), Some(keys("k", "v1")));
        lister.join().unwrap();
        assert!(
            r.notified.try_recv().is_err(),
            "the first list is no change"
        );

        r.watches.send(0, Some(keys("k", "v2")), false);
        assert_eq!(r.m.config_map("ns", "c1").unwrap(), Some(keys("k", "v2")));
        let mut told: Vec<String> = r.notified.try_iter().collect();
        told.sort();
        assert_eq!(told, ["a", "b"]);
        // The same content again (a relist) is no change.
        r.watches.send(0, Some(keys("k", "v2")), false);
        assert!(r.notified.try_recv().is_err());
        // Deleted: not found.
        r.watches.send(0, None, false);
        assert_eq!(r.m.config_map("ns", "c1").unwrap(), None);
        assert_eq!(r.gets.count.load(Ordering::SeqCst), 0, "no GETs");

        // The watch stops with the last pod that uses it.
        r.m.unregister("a");
        assert!(!r.watches.stopped(0));
        r.m.register(&pod("b", &[]));
        assert!(r.watches.stopped(0));
        assert_eq!(r.m.objects(), 0);
        // An object no pod references is read by GET.
        assert!(r.m.config_map("ns", "c1").unwrap().is_some());
        assert_eq!(r.gets.count.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn a_watch_that_never_lists_fails_reads_and_one_that_breaks_keeps_the_last() {
        let r = rig(Strategy::Watch);
        r.m.register(&pod("a", &["c1", "c2"]));
        let e = r.m.config_map("ns", "c1").unwrap_err();
        assert!(e.contains("failed to sync configmap cache"), "{e}");
        // c2 listed once, then its watch fails for good: the last stays.
        r.watches.send(1, Some(keys("k", "v1")), false);
        for _ in 0..3 {
            assert_eq!(r.m.config_map("ns", "c2").unwrap(), Some(keys("k", "v1")));
        }
        assert_eq!(r.gets.count.load(Ordering::SeqCst), 0);
    }

    #[test]
    fn a_watch_that_lists_before_it_is_stored_keeps_going() {
        let r = rig(Strategy::Watch);
        *r.watches.at_once.lock() = Some(keys("k", "v1"));
        r.m.register(&pod("a", &["c1"]));
        assert!(!r.watches.stopped(0), "the watch runs on");
        r.watches.send(0, Some(keys("k", "v2")), false);
        assert_eq!(r.m.config_map("ns", "c1").unwrap(), Some(keys("k", "v2")));
        assert_eq!(r.notified.try_recv().unwrap(), "a");
        // Registered again with one more object: still one watch for c1.
        r.m.register(&pod("a", &["c1", "c2"]));
        let started: Vec<ObjectRef> = r.watches.sinks.lock().iter().map(|s| s.0.clone()).collect();
        assert_eq!(started, [cm("c1"), cm("c2")]);
        assert_eq!(r.gets.count.load(Ordering::SeqCst), 0);
    }

    #[test]
    fn an_immutable_object_is_not_watched_any_further() {
        let r = rig(Strategy::Watch);
        r.m.register(&pod("a", &["c1"]));
        r.watches.send(0, Some(keys("k", "v1")), true);
        assert!(r.watches.stopped(0));
        assert_eq!(r.m.config_map("ns", "c1").unwrap(), Some(keys("k", "v1")));
        assert_eq!(r.gets.count.load(Ordering::SeqCst), 0);
    }

    /// The objects watches were started for, in order.
    fn started(r: &Rig) -> Vec<ObjectRef> {
        r.watches.sinks.lock().iter().map(|s| s.0.clone()).collect()
    }

    #[test]
    fn watches_are_bounded_per_pod_and_per_node_and_the_rest_is_cached() {
        let mut r = rig(Strategy::Watch);
        r.m = r.m.with_watch_bounds(3, 2);
        // A pod with five objects: two are watched, three read by GET
        // and kept for the TTL.
        r.m.register(&pod("a", &["c1", "c2", "c3", "c4", "c5"]));
        assert_eq!(started(&r), [cm("c1"), cm("c2")]);
        assert_eq!(r.m.watched(), 2);
        r.gets.version.store(1, Ordering::SeqCst);
        for _ in 0..3 {
            assert_eq!(r.m.config_map("ns", "c3").unwrap(), Some(keys("c3", "1")));
        }
        assert_eq!(r.gets.count.load(Ordering::SeqCst), 1, "once per TTL");
        r.watches.send(0, Some(keys("k", "w")), false);
        assert_eq!(r.m.config_map("ns", "c1").unwrap(), Some(keys("k", "w")));
        assert_eq!(r.gets.count.load(Ordering::SeqCst), 1, "c1 is watched");

        // Another pod: what is left of the node's bound, however many its
        // own would allow.
        r.m.register(&pod("b", &["c6", "c7"]));
        assert_eq!(started(&r), [cm("c1"), cm("c2"), cm("c6")]);
        assert_eq!(r.m.watched(), 3);
        assert_eq!(r.m.objects(), 7);

        // Pod a goes, and its watches stop. At b's next sync its object
        // without a watch takes a freed slot.
        r.m.unregister("a");
        assert!(r.watches.stopped(0) && r.watches.stopped(1));
        assert!(!r.watches.stopped(2));
        assert_eq!(r.m.watched(), 1);
        r.m.register(&pod("b", &["c6", "c7"]));
        assert_eq!(started(&r), [cm("c1"), cm("c2"), cm("c6"), cm("c7")]);
        assert_eq!(r.m.watched(), 2);
        // Its watch now answers, not the cache.
        r.watches.send(3, Some(keys("k", "c7")), false);
        assert_eq!(r.m.config_map("ns", "c7").unwrap(), Some(keys("k", "c7")));

        // An immutable object gives its slot back.
        r.watches.send(2, Some(keys("k", "c6")), true);
        assert_eq!(r.m.watched(), 1);
        r.m.unregister("b");
        assert_eq!((r.m.watched(), r.m.objects()), (0, 0));
    }

    #[test]
    fn objects_past_the_bounds_are_read_from_the_overflow_source_alone() {
        let mut r = rig(Strategy::Watch);
        let overflow = Arc::new(Gets::default());
        overflow.version.store(7, Ordering::SeqCst);
        r.m =
            r.m.with_watch_bounds(3, 1)
                .with_overflow_source(overflow.clone());
        r.m.register(&pod("a", &["c1", "c2", "c3"]));
        assert_eq!(r.m.config_map("ns", "c2").unwrap(), Some(keys("c2", "7")));
        assert_eq!(r.m.config_map("ns", "c3").unwrap(), Some(keys("c3", "7")));
        assert_eq!(overflow.count.load(Ordering::SeqCst), 2);
        // Objects no pod references (a pull secret) go to the shared source.
        r.m.config_map("ns", "other").unwrap();
        assert_eq!(r.gets.count.load(Ordering::SeqCst), 1);
        assert_eq!(overflow.count.load(Ordering::SeqCst), 2);
    }

    #[test]
    fn watched_objects_become_keys_and_an_unreadable_version_is_not_handed_on() {
        let seen = observe::<SecretKind>(
            "secret ns/s",
            true,
            Some(serde_json::json!({"metadata": {"name": "s"}, "data": {"k": "djE="}, "immutable": true})),
        )
        .unwrap();
        assert_eq!((seen.keys, seen.immutable), (Some(keys("k", "v1")), true));
        let gone = observe::<ConfigMapKind>("configmap ns/c", false, None).unwrap();
        assert_eq!((gone.keys, gone.immutable), (None, false));
        let bad = serde_json::json!({"metadata": {"name": "s"}, "data": {"k": "%%"}});
        assert!(observe::<SecretKind>("secret ns/s", true, Some(bad)).is_none());
        let wrong_type = serde_json::json!({"metadata": {"name": "c"}, "data": 5});
        assert!(observe::<ConfigMapKind>("configmap ns/c", false, Some(wrong_type)).is_none());
    }

    #[test]
    fn a_watch_that_cannot_start_gives_its_slot_back_and_is_cached() {
        let r = rig(Strategy::Watch);
        r.watches.refuse.store(true, Ordering::SeqCst);
        r.m.register(&pod("a", &["c1"]));
        assert_eq!(r.m.watched(), 0);
        r.gets.version.store(1, Ordering::SeqCst);
        assert_eq!(r.m.config_map("ns", "c1").unwrap(), Some(keys("c1", "1")));
        assert_eq!(r.m.config_map("ns", "c1").unwrap(), Some(keys("c1", "1")));
        assert_eq!(r.gets.count.load(Ordering::SeqCst), 1, "once per TTL");
        // Watches work again: the next sync of the pod watches it.
        r.watches.refuse.store(false, Ordering::SeqCst);
        r.m.register(&pod("a", &["c1"]));
        assert_eq!(started(&r), [cm("c1")]);
        assert_eq!(r.m.watched(), 1);
    }

    #[test]
    fn get_reads_the_apiserver_every_time() {
        let r = rig(Strategy::Get);
        r.m.register(&pod("a", &["c1"]));
        assert!(r.watches.sinks.lock().is_empty(), "no watches");
        for v in 1..=3 {
            r.gets.version.store(v, Ordering::SeqCst);
            assert_eq!(
                r.m.config_map("ns", "c1").unwrap(),
                Some(keys("c1", &v.to_string()))
            );
        }
        assert_eq!(r.gets.count.load(Ordering::SeqCst), 3);
    }

    #[test]
    fn cache_keeps_a_get_for_the_ttl_and_a_failed_refresh_keeps_the_last() {
        let r = rig(Strategy::Cache);
        r.m.register(&pod("a", &["c1"]));
        assert!(r.watches.sinks.lock().is_empty(), "no watches");
        r.gets.version.store(1, Ordering::SeqCst);
        assert_eq!(r.m.config_map("ns", "c1").unwrap(), Some(keys("c1", "1")));
        r.gets.version.store(2, Ordering::SeqCst);
        assert_eq!(r.m.config_map("ns", "c1").unwrap(), Some(keys("c1", "1")));
        assert_eq!(r.gets.count.load(Ordering::SeqCst), 1, "within the TTL");

        // Past the TTL: read again.
        r.ttl.store(0, Ordering::SeqCst);
        assert_eq!(r.m.config_map("ns", "c1").unwrap(), Some(keys("c1", "2")));
        assert_eq!(r.gets.count.load(Ordering::SeqCst), 2);
        r.gets.down.store(true, Ordering::SeqCst);
        assert_eq!(r.m.config_map("ns", "c1").unwrap(), Some(keys("c1", "2")));
        r.gets.down.store(false, Ordering::SeqCst);

        // A pod registered anew (its references changed) reads afresh.
        r.ttl.store(60, Ordering::SeqCst);
        r.gets.version.store(3, Ordering::SeqCst);
        r.m.register(&pod("a", &["c1", "c2"]));
        assert_eq!(r.m.config_map("ns", "c1").unwrap(), Some(keys("c1", "3")));
        // Unchanged references: the cached copy stays.
        r.gets.version.store(4, Ordering::SeqCst);
        r.m.register(&pod("a", &["c1", "c2"]));
        assert_eq!(r.m.config_map("ns", "c1").unwrap(), Some(keys("c1", "3")));
        r.m.unregister("a");
        assert_eq!(r.m.objects(), 0);
    }

    #[test]
    fn watched_objects_decode_as_the_api_sends_them() {
        let secret: KeyObject<SecretKind> = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "s", "namespace": "ns"},
            "type": "Opaque",
            "data": {"k": "djE="},
            "immutable": true,
        }))
        .unwrap();
        assert_eq!(secret.keys(true, "secret ns/s").unwrap(), keys("k", "v1"));
        assert_eq!(secret.immutable, Some(true));
        let c: KeyObject<ConfigMapKind> = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "c"},
            "data": {"k": "text"},
            "binaryData": {"b": "AAE="},
        }))
        .unwrap();
        let k = c.keys(false, "configmap ns/c").unwrap();
        assert_eq!(k["k"], b"text");
        assert_eq!(k["b"], [0u8, 1]);
        let bad: KeyObject<SecretKind> = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "s"}, "data": {"k": "%%"},
        }))
        .unwrap();
        let e = bad.keys(true, "secret ns/s").unwrap_err();
        assert!(e.contains("secret ns/s: data[\"k\"]: not base64"), "{e}");
    }
}
