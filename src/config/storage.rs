//! `PodStorage`: the merged, per-source view of the desired pods and the
//! rules that turn one source's update into the minimal notifications for the
//! sync loop (upstream `podStorage.merge` in config/config.go).
//!
//! This is plain data with no locks or threads: [`PodStorage::merge`]
//! returns the notifications in the order they must be delivered, and its
//! one owner (the `pod-config` thread in `pod_config.rs`) sends them before
//! it merges anything else, so that deliveries never interleave.
//!
//! Pods are stored as the `Arc`s their source sent: a known pod that did
//! not change costs no copy, and a notification shares the stored pod. A
//! pod is copied only when the merge writes to it: the node's annotations
//! on a new or held pod, a changed spec or status on a known one.
//!
//! The rules, per source and keyed by UID:
//! - ADD, UPDATE and DELETE insert or update the pods they carry; REMOVE
//!   takes them out; SET replaces the source's pods (and marks the source as
//!   seen); RESTORE brings checkpointed pods the source does not know yet.
//! - A known pod whose spec, labels, annotations (other than the node's own),
//!   deletion timestamp or grace period, or owner references changed is
//!   *updated*, or *deleted* when it now has a deletion timestamp; one whose
//!   status alone changed is *reconciled*. A pod gone from its source is
//!   *removed*.
//! - Full names (`namespace/name`) are unique among the merged pods. Within
//!   one update the first pod with a name wins and later ones are dropped
//!   (as upstream). A pod whose name already belongs to another merged pod
//!   (of another source, or another UID of the same source) is *held*: kept
//!   aside, logged and reported as an event once, and merged (as an ADD) as
//!   soon as the name is free, unless its source drops it first. Mirror pods
//!   (annotation `kubernetes.io/config.mirror`) are exempt: they share their
//!   static pod's name by design. Names are unique among the local sources'
//!   pods (file, URL) and, apart, among the API's: an API pod with a static
//!   pod's name is not held but passed on, and the sync loop refuses it
//!   (the node's static pod wins, whichever came first), so that a pod
//!   bound to the node cannot hold a static pod off it.
//!
//! Deviation from upstream: restored pods are stored like the source's own
//! pods, without marking the source as seen, so that its first SET removes
//! the ones it no longer has and leaves unchanged ones alone. Upstream hands
//! them on without storing them, and never removes those its source lost.
//!
//! The notifications are upstream's incremental mode, the one its kubelet
//! uses (ADD, UPDATE, DELETE, REMOVE, RECONCILE and RESTORE); the snapshot
//! modes, which only other consumers of upstream's package use, are not
//! kept.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use k8s_openapi::jiff::Timestamp;

use super::{Pod, PodEvent, PodOperation, PodUpdate};
use crate::events::{EventType, ObjectRef};
use crate::pod::{
    is_mirror_pod, pod_full_name, pod_uid, CONFIG_FIRST_SEEN_ANNOTATION_KEY,
    CONFIG_MIRROR_ANNOTATION_KEY, CONFIG_SOURCE_ANNOTATION_KEY,
};

/// Annotations the node itself manages; a source changing them is not a
/// change to the pod.
const LOCAL_ANNOTATIONS: [&str; 3] = [
    CONFIG_SOURCE_ANNOTATION_KEY,
    CONFIG_MIRROR_ANNOTATION_KEY,
    CONFIG_FIRST_SEEN_ANNOTATION_KEY,
];

/// The reason of the event raised for a pod whose name is taken.
pub(crate) const FAILED_VALIDATION_REASON: &str = "FailedValidation";

/// A pod kept aside because another merged pod has its full name.
#[derive(Debug, Clone)]
struct Held {
    /// Arrival order: when a name becomes free, the earliest claimant wins.
    since: u64,
    pod: Arc<Pod>,
}

/// Which merged pod owns each name key (see [`name_key`]): (source, UID).
type Names = HashMap<String, (String, String)>;

/// The key a pod of `source` claims in [`Names`]: its full name, apart for
/// API pods, so that an API pod never holds a local (static) pod back nor
/// waits for one; the sync loop settles such a conflict.
fn name_key(source: &str, full_name: &str) -> String {
    if source == crate::pod::API_SOURCE {
        format!("{}\0{full_name}", crate::pod::API_SOURCE)
    } else {
        full_name.to_string()
    }
}

/// The pods of every source, keyed by source name and then by UID.
pub struct PodStorage {
    pods: BTreeMap<String, BTreeMap<String, Arc<Pod>>>,
    /// Pods waiting for their full name to become free, by source and UID.
    held: BTreeMap<String, BTreeMap<String, Held>>,
    next_held: u64,
    /// Sources that have delivered at least one SET.
    sources_seen: HashSet<String>,
    /// Events raised by merges and not yet taken.
    events: Vec<PodEvent>,
    /// The first-seen timestamp source (the wall clock outside tests).
    now: fn() -> String,
}

/// What a merge found, before it is turned into notifications.
#[derive(Default)]
struct Changes {
    adds: Vec<Arc<Pod>>,
    updates: Vec<Arc<Pod>>,
    deletes: Vec<Arc<Pod>>,
    removes: Vec<Arc<Pod>>,
    reconciles: Vec<Arc<Pod>>,
    restores: Vec<Arc<Pod>>,
    /// Held pods of *other* sources that this merge let in.
    admitted: BTreeMap<String, Vec<Arc<Pod>>>,
}

/// How an incoming copy of a known pod differs from the stored one.
#[derive(Debug, PartialEq, Eq)]
enum Difference {
    None,
    /// Spec, labels, annotations, owners or deletion fields changed.
    Update,
    /// Like `Update`, and the pod now has a deletion timestamp.
    GracefulDelete,
    /// Only the status changed.
    Reconcile,
}

/// The current time as RFC 3339 with nanoseconds, as the first-seen
/// annotation records it.
pub(crate) fn now_rfc3339() -> String {
    let since = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    let secs = i64::try_from(since.as_secs()).unwrap_or(i64::MAX);
    match Timestamp::new(secs, since.subsec_nanos() as i32) {
        Ok(ts) => ts.to_string(),
        Err(_) => Timestamp::UNIX_EPOCH.to_string(),
    }
}

fn set_annotation(pod: &mut Pod, key: &str, value: String) {
    pod.metadata
        .annotations
        .get_or_insert_with(Default::default)
        .insert(key.to_string(), value);
}

impl PodStorage {
    pub(crate) fn new() -> PodStorage {
        PodStorage::with_clock(now_rfc3339)
    }

    /// A storage whose first-seen timestamps come from `now`.
    pub(crate) fn with_clock(now: fn() -> String) -> PodStorage {
        PodStorage {
            pods: BTreeMap::new(),
            held: BTreeMap::new(),
            next_held: 0,
            sources_seen: HashSet::new(),
            events: Vec::new(),
            now,
        }
    }

    /// True when every source in `sources` has delivered a SET.
    pub fn seen_sources<'a>(&self, sources: impl IntoIterator<Item = &'a str>) -> bool {
        sources.into_iter().all(|s| self.sources_seen.contains(s))
    }

    /// All merged pods of all sources (by source name, then UID), shared.
    #[cfg(test)]
    pub(crate) fn merged_state(&self) -> Vec<Arc<Pod>> {
        self.pods
            .values()
            .flat_map(|m| m.values().cloned())
            .collect()
    }

    /// The merged pods of one source.
    pub fn source_pods(&self, source: &str) -> Vec<Arc<Pod>> {
        self.pods
            .get(source)
            .map(|m| m.values().cloned().collect())
            .unwrap_or_default()
    }

    /// The pods of one source held back because their name is taken, in
    /// arrival order.
    pub fn held_pods(&self, source: &str) -> Vec<Arc<Pod>> {
        let mut held: Vec<&Held> = self
            .held
            .get(source)
            .map(|m| m.values().collect())
            .unwrap_or_default();
        held.sort_by_key(|h| h.since);
        held.into_iter().map(|h| h.pod.clone()).collect()
    }

    /// The events raised since the last call.
    pub(crate) fn take_events(&mut self) -> Vec<PodEvent> {
        std::mem::take(&mut self.events)
    }

    /// Applies `update` from `source` and returns the notifications to
    /// deliver, in order.
    pub(crate) fn merge(&mut self, source: &str, update: PodUpdate) -> Vec<PodUpdate> {
        let seen_before = self.sources_seen.contains(source);
        let mut names = self.name_index();
        let mut changes = Changes::default();
        self.apply(source, update, &mut names, &mut changes);
        self.admit_held(source, &mut names, &mut changes);
        let first_set = !seen_before && self.sources_seen.contains(source);
        self.notifications(source, changes, first_set)
    }

    /// Who owns each full name among the merged pods (mirror pods own none).
    fn name_index(&self) -> Names {
        let mut names = Names::new();
        for (source, pods) in &self.pods {
            for (uid, pod) in pods {
                if !is_mirror_pod(pod) {
                    names
                        .entry(name_key(source, &pod_full_name(pod)))
                        .or_insert_with(|| (source.clone(), uid.clone()));
                }
            }
        }
        names
    }

    fn apply(&mut self, source: &str, update: PodUpdate, names: &mut Names, c: &mut Changes) {
        let op = update.op;
        match op {
            PodOperation::Add | PodOperation::Update | PodOperation::Delete => {
                log::debug!(
                    "{op:?} of {} pod(s) from source {source}",
                    update.pods.len()
                );
                for pod in self.filter_duplicates(source, update.pods) {
                    let uid = pod_uid(&pod).to_string();
                    if let Some(existing) = self.stored_mut(source, &uid) {
                        classify(existing, pod, c);
                    } else if let Some(held) = self.held_mut(source, &uid) {
                        held.pod = annotated(pod, source);
                    } else {
                        self.admit_or_hold(source, pod, None, names, false, c);
                    }
                }
            }
            PodOperation::Remove => {
                log::debug!(
                    "REMOVE of {} pod(s) from source {source}",
                    update.pods.len()
                );
                for pod in &update.pods {
                    let uid = pod_uid(pod);
                    let removed = self.pods.get_mut(source).and_then(|m| m.remove(uid));
                    if let Some(existing) = removed {
                        release_name(names, source, &existing);
                        c.removes.push(existing);
                    } else if let Some(m) = self.held.get_mut(source) {
                        m.remove(uid);
                    }
                }
            }
            PodOperation::Set => {
                log::debug!("SET of {} pod(s) from source {source}", update.pods.len());
                self.sources_seen.insert(source.to_string());
                let mut old = self.pods.remove(source).unwrap_or_default();
                let mut old_held = self.held.remove(source).unwrap_or_default();
                for pod in old.values() {
                    release_name(names, source, pod);
                }
                for pod in self.filter_duplicates(source, update.pods) {
                    let uid = pod_uid(&pod).to_string();
                    if let Some(mut existing) = old.remove(&uid) {
                        if !is_mirror_pod(&existing) {
                            names.insert(
                                name_key(source, &pod_full_name(&existing)),
                                (source.to_string(), uid.clone()),
                            );
                        }
                        classify(&mut existing, pod, c);
                        self.pods
                            .entry(source.to_string())
                            .or_default()
                            .insert(uid, existing);
                    } else {
                        let since = old_held.remove(&uid).map(|h| h.since);
                        self.admit_or_hold(source, pod, since, names, false, c);
                    }
                }
                c.removes.extend(old.into_values());
                for dropped in old_held.into_values() {
                    log::debug!(
                        "source {source} no longer has held pod {}",
                        pod_full_name(&dropped.pod)
                    );
                }
            }
            PodOperation::Restore => {
                log::debug!(
                    "RESTORE of {} pod(s) for source {source}",
                    update.pods.len()
                );
                for pod in self.filter_duplicates(source, update.pods) {
                    let uid = pod_uid(&pod).to_string();
                    if self.stored_mut(source, &uid).is_some()
                        || self.held_mut(source, &uid).is_some()
                    {
                        // The source's own word beats a checkpoint.
                        log::debug!(
                            "source {source} already has pod {} ({uid}); checkpoint ignored",
                            pod_full_name(&pod)
                        );
                        continue;
                    }
                    self.admit_or_hold(source, pod, None, names, true, c);
                }
            }
            PodOperation::Reconcile => {
                log::warn!(
                    "source {source} sent a RECONCILE, which only the merge produces; ignored"
                );
            }
        }
    }

    fn stored_mut(&mut self, source: &str, uid: &str) -> Option<&mut Arc<Pod>> {
        self.pods.get_mut(source).and_then(|m| m.get_mut(uid))
    }

    fn held_mut(&mut self, source: &str, uid: &str) -> Option<&mut Held> {
        self.held.get_mut(source).and_then(|m| m.get_mut(uid))
    }

    /// Drops every pod whose full name already came earlier in the same
    /// update (upstream `filterInvalidPods`). The source annotation is set
    /// where a pod is stored ([`annotated`]): a known pod's copy keeps the
    /// stored one's, and an unchanged pod is not copied.
    fn filter_duplicates(&mut self, source: &str, pods: Vec<Arc<Pod>>) -> Vec<Arc<Pod>> {
        let mut names = HashSet::new();
        let mut kept = Vec::with_capacity(pods.len());
        for (index, pod) in pods.into_iter().enumerate() {
            let full_name = pod_full_name(&pod);
            if !names.insert(full_name.clone()) {
                let message = format!(
                    "Error validating pod {full_name} (uid {:?}) from {source} due to duplicate pod \
                     name {full_name:?} at index {index} of the same update, ignoring",
                    pod_uid(&pod)
                );
                log::warn!("config: {message}");
                self.raise(source, &pod, message);
                continue;
            }
            kept.push(pod);
        }
        kept
    }

    fn raise(&mut self, source: &str, pod: &Pod, message: String) {
        self.events.push(PodEvent {
            object: ObjectRef::pod(pod),
            source: source.to_string(),
            event_type: EventType::Warning,
            reason: FAILED_VALIDATION_REASON,
            message,
        });
    }

    /// Merges `pod`, new to `source`'s merged pods, if its full name is
    /// free; otherwise holds it. `since` is set when the pod was held
    /// before (it keeps its place and is not reported again).
    fn admit_or_hold(
        &mut self,
        source: &str,
        pod: Arc<Pod>,
        since: Option<u64>,
        names: &mut Names,
        restore: bool,
        c: &mut Changes,
    ) {
        let uid = pod_uid(&pod).to_string();
        let full_name = pod_full_name(&pod);
        if !is_mirror_pod(&pod) {
            if let Some((owner_source, owner_uid)) = names.get(&name_key(source, &full_name)) {
                let since = match since {
                    Some(since) => since,
                    None => {
                        let message = format!(
                            "Error validating pod {full_name} (uid {uid:?}) from {source} due to \
                             duplicate pod name {full_name:?}: pod {owner_uid:?} from \
                             {owner_source} has it, ignoring this one until that name is free"
                        );
                        log::warn!("config: {message}");
                        self.raise(source, &pod, message);
                        self.next_held += 1;
                        self.next_held
                    }
                };
                let pod = annotated(pod, source);
                self.held
                    .entry(source.to_string())
                    .or_default()
                    .insert(uid, Held { since, pod });
                return;
            }
            names.insert(
                name_key(source, &full_name),
                (source.to_string(), uid.clone()),
            );
        }
        log::debug!("source {source}: new pod {full_name} ({uid})");
        let mut pod = annotated(pod, source);
        set_annotation(
            Arc::make_mut(&mut pod),
            CONFIG_FIRST_SEEN_ANNOTATION_KEY,
            (self.now)(),
        );
        if restore {
            c.restores.push(pod.clone());
        } else {
            c.adds.push(pod.clone());
        }
        self.pods
            .entry(source.to_string())
            .or_default()
            .insert(uid, pod);
    }

    /// Merges the held pods whose name is free now, earliest first.
    fn admit_held(&mut self, merging: &str, names: &mut Names, c: &mut Changes) {
        let mut waiting: Vec<(u64, String, String)> = self
            .held
            .iter()
            .flat_map(|(source, m)| {
                m.iter()
                    .map(move |(uid, h)| (h.since, source.clone(), uid.clone()))
            })
            .collect();
        waiting.sort();
        for (_, source, uid) in waiting {
            let Some(m) = self.held.get_mut(&source) else {
                continue;
            };
            let Some(held) = m.get(&uid) else { continue };
            let full_name = pod_full_name(&held.pod);
            if names.contains_key(&name_key(&source, &full_name)) {
                continue;
            }
            let Some(Held { mut pod, .. }) = m.remove(&uid) else {
                continue;
            };
            log::info!("config: pod {full_name} ({uid}) from {source}: its name is free now");
            names.insert(name_key(&source, &full_name), (source.clone(), uid.clone()));
            set_annotation(
                Arc::make_mut(&mut pod),
                CONFIG_FIRST_SEEN_ANNOTATION_KEY,
                (self.now)(),
            );
            self.pods
                .entry(source.clone())
                .or_default()
                .insert(uid, pod.clone());
            if source == merging {
                c.adds.push(pod);
            } else {
                c.admitted.entry(source).or_default().push(pod);
            }
        }
    }

    fn notifications(&self, source: &str, c: Changes, first_set: bool) -> Vec<PodUpdate> {
        let mut out = Vec::new();
        let mut push = |op, pods: Vec<Arc<Pod>>| out.push(PodUpdate::new(op, source, pods));
        let announce_source =
            first_set && c.adds.is_empty() && c.updates.is_empty() && c.deletes.is_empty();
        if !c.removes.is_empty() {
            push(PodOperation::Remove, c.removes);
        }
        if !c.adds.is_empty() {
            push(PodOperation::Add, c.adds);
        }
        if !c.updates.is_empty() {
            push(PodOperation::Update, c.updates);
        }
        if !c.deletes.is_empty() {
            push(PodOperation::Delete, c.deletes);
        }
        if !c.restores.is_empty() {
            push(PodOperation::Restore, c.restores);
        }
        if announce_source {
            // An empty ADD tells the sync loop that this source is ready.
            push(PodOperation::Add, Vec::new());
        }
        if !c.reconciles.is_empty() {
            push(PodOperation::Reconcile, c.reconciles);
        }
        for (other, pods) in c.admitted {
            out.push(PodUpdate::new(PodOperation::Add, &other, pods));
        }
        out
    }
}

/// Frees `pod`'s full name if `pod` owns it.
fn release_name(names: &mut Names, source: &str, pod: &Pod) {
    let key = name_key(source, &pod_full_name(pod));
    if names
        .get(&key)
        .is_some_and(|(s, u)| s == source && u == pod_uid(pod))
    {
        names.remove(&key);
    }
}

/// `pod` with `source` as its source annotation, copied only if it has
/// another one (or none).
fn annotated(mut pod: Arc<Pod>, source: &str) -> Arc<Pod> {
    let current = pod
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(CONFIG_SOURCE_ANNOTATION_KEY));
    if current.map(String::as_str) != Some(source) {
        set_annotation(
            Arc::make_mut(&mut pod),
            CONFIG_SOURCE_ANNOTATION_KEY,
            source.to_string(),
        );
    }
    pod
}

/// Brings the stored pod up to date and records what kind of change it was.
fn classify(existing: &mut Arc<Pod>, incoming: Arc<Pod>, c: &mut Changes) {
    match check_and_update(existing, incoming) {
        Difference::Update => c.updates.push(existing.clone()),
        Difference::GracefulDelete => c.deletes.push(existing.clone()),
        Difference::Reconcile => c.reconciles.push(existing.clone()),
        Difference::None => {}
    }
}

fn is_local_annotation(key: &str) -> bool {
    LOCAL_ANNOTATIONS.contains(&key)
}

/// Equal apart from the annotations the node manages itself.
fn annotations_equal(
    a: &Option<BTreeMap<String, String>>,
    b: &Option<BTreeMap<String, String>>,
) -> bool {
    let strip = |m: &Option<BTreeMap<String, String>>| {
        m.iter()
            .flatten()
            .filter(|(k, _)| !is_local_annotation(k))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect::<BTreeMap<_, _>>()
    };
    strip(a) == strip(b)
}

fn empty_is_none<T>(v: &Option<Vec<T>>) -> Option<&Vec<T>> {
    v.as_ref().filter(|v| !v.is_empty())
}

fn labels(pod: &Pod) -> Option<&BTreeMap<String, String>> {
    pod.metadata.labels.as_ref().filter(|m| !m.is_empty())
}

fn differ_semantically(existing: &Pod, incoming: &Pod) -> bool {
    existing.spec != incoming.spec
        || labels(existing) != labels(incoming)
        || existing.metadata.deletion_timestamp != incoming.metadata.deletion_timestamp
        || existing.metadata.deletion_grace_period_seconds
            != incoming.metadata.deletion_grace_period_seconds
        || empty_is_none(&existing.metadata.owner_references)
            != empty_is_none(&incoming.metadata.owner_references)
        || !annotations_equal(
            &existing.metadata.annotations,
            &incoming.metadata.annotations,
        )
}

/// Brings `existing` up to date with `incoming` and says what kind of change
/// it was. The node's own annotations (first seen, source, mirror) survive.
/// The stored pod is copied (if shared) only when it changes, and
/// `incoming` is taken apart without a copy when nobody else holds it.
fn check_and_update(existing: &mut Arc<Pod>, incoming: Arc<Pod>) -> Difference {
    if !differ_semantically(existing, &incoming) {
        if existing.status != incoming.status {
            let status = match Arc::try_unwrap(incoming) {
                Ok(pod) => pod.status,
                Err(shared) => shared.status.clone(),
            };
            Arc::make_mut(existing).status = status;
            return Difference::Reconcile;
        }
        return Difference::None;
    }
    let incoming = Arc::unwrap_or_clone(incoming);
    let existing = Arc::make_mut(existing);
    let graceful_delete = incoming.metadata.deletion_timestamp.is_some();
    let mut annotations: BTreeMap<String, String> =
        incoming.metadata.annotations.unwrap_or_default();
    if let Some(old) = existing.metadata.annotations.as_ref() {
        for key in LOCAL_ANNOTATIONS {
            if let Some(v) = old.get(key) {
                annotations.insert(key.to_string(), v.clone());
            }
        }
    }
    existing.metadata.annotations = Some(annotations);
    existing.spec = incoming.spec;
    existing.metadata.labels = incoming.metadata.labels;
    existing.metadata.deletion_timestamp = incoming.metadata.deletion_timestamp;
    existing.metadata.deletion_grace_period_seconds =
        incoming.metadata.deletion_grace_period_seconds;
    existing.metadata.owner_references = incoming.metadata.owner_references;
    existing.metadata.generation = incoming.metadata.generation;
    existing.status = incoming.status;
    if graceful_delete {
        Difference::GracefulDelete
    } else {
        Difference::Update
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pod::{API_SOURCE, FILE_SOURCE, HTTP_SOURCE};
    use k8s_openapi::api::core::v1::{Container, PodSpec, PodStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{OwnerReference, Time};
    use PodOperation::*;

    fn fixed_clock() -> String {
        "2024-01-02T03:04:05.000000006Z".to_string()
    }

    fn pod_in(uid: &str, name: &str, namespace: &str, image: &str) -> Pod {
        let mut p = Pod::default();
        p.metadata.uid = Some(uid.to_string());
        p.metadata.name = Some(name.to_string());
        p.metadata.namespace = Some(namespace.to_string());
        p.spec = Some(PodSpec {
            containers: vec![Container {
                name: "c".to_string(),
                image: Some(image.to_string()),
                ..Default::default()
            }],
            ..Default::default()
        });
        p
    }

    fn pod(uid: &str, name: &str, image: &str) -> Pod {
        pod_in(uid, name, "default", image)
    }

    fn with_phase(mut p: Pod, phase: &str) -> Pod {
        p.status = Some(PodStatus {
            phase: Some(phase.to_string()),
            ..Default::default()
        });
        p
    }

    fn with_label(mut p: Pod, k: &str, v: &str) -> Pod {
        p.metadata
            .labels
            .get_or_insert_with(Default::default)
            .insert(k.to_string(), v.to_string());
        p
    }

    fn with_annotation(mut p: Pod, k: &str, v: &str) -> Pod {
        set_annotation(&mut p, k, v.to_string());
        p
    }

    fn deleting(mut p: Pod) -> Pod {
        let ts = Timestamp::new(1_700_000_000, 0).unwrap();
        p.metadata.deletion_timestamp = Some(Time(ts));
        p.metadata.deletion_grace_period_seconds = Some(30);
        p
    }

    fn owned(mut p: Pod) -> Pod {
        p.metadata.owner_references = Some(vec![OwnerReference {
            api_version: "apps/v1".into(),
            kind: "ReplicaSet".into(),
            name: "rs".into(),
            uid: "rs-uid".into(),
            ..Default::default()
        }]);
        p
    }

    fn mirror(p: Pod) -> Pod {
        with_annotation(p, CONFIG_MIRROR_ANNOTATION_KEY, "hash")
    }

    /// An update from the API source.
    fn upd(op: PodOperation, pods: Vec<Pod>) -> PodUpdate {
        from(API_SOURCE, op, pods)
    }

    /// An update from the named source.
    fn from(source: &str, op: PodOperation, pods: Vec<Pod>) -> PodUpdate {
        PodUpdate::new(op, source, pods.into_iter().map(Arc::new).collect())
    }

    type Summary = Vec<(PodOperation, String, Vec<String>)>;

    /// (op, source, uids) of each notification, for compact assertions.
    fn summary(out: &[PodUpdate]) -> Summary {
        out.iter()
            .map(|u| {
                let uids = u.pods.iter().map(|p| pod_uid(p).to_string()).collect();
                (u.op, u.source.clone(), uids)
            })
            .collect()
    }

    /// A notification from the API source carrying the pods with these UIDs.
    fn s(op: PodOperation, uids: &[&str]) -> (PodOperation, String, Vec<String>) {
        sf(API_SOURCE, op, uids)
    }

    fn sf(source: &str, op: PodOperation, uids: &[&str]) -> (PodOperation, String, Vec<String>) {
        (
            op,
            source.to_string(),
            uids.iter().map(|n| n.to_string()).collect(),
        )
    }

    /// Merges each update from the source its `source` field names.
    fn run(storage: &mut PodStorage, updates: Vec<PodUpdate>) -> Vec<PodUpdate> {
        let mut out = Vec::new();
        for u in updates {
            let source = u.source.clone();
            out.extend(storage.merge(&source, u));
        }
        out
    }

    struct Case {
        name: &'static str,
        /// Updates merged before the one under test; their output is ignored.
        setup: Vec<PodUpdate>,
        update: PodUpdate,
        want: Summary,
    }

    fn case(name: &'static str, setup: Vec<PodUpdate>, update: PodUpdate, want: Summary) -> Case {
        Case {
            name,
            setup,
            update,
            want,
        }
    }

    /// Every input op (upstream config_test.go's incremental cases are the
    /// checklist), plus name conflicts and restores.
    #[test]
    fn merge_cases() {
        let a = || pod("a", "a", "img:1");
        let a2 = || pod("a", "a", "img:2");
        let b = || pod("b", "b", "img:1");
        let c = || pod("c", "c", "img:1");
        let cases =
            vec![
            // ---- Incremental: ADD
            case(
                "incremental: ADD of a new pod",
                vec![],
                upd(Add, vec![a()]),
                vec![s(Add, &["a"])],
            ),
            case(
                "incremental: ADD of a pod with an empty namespace",
                vec![],
                upd(Add, vec![pod_in("e", "foo", "", "i")]),
                vec![s(Add, &["e"])],
            ),
            case(
                "incremental: the same name in another namespace is another pod",
                vec![upd(Add, vec![pod_in("d1", "foo", "default", "i")])],
                upd(Add, vec![pod_in("d2", "foo", "new", "i")]),
                vec![s(Add, &["d2"])],
            ),
            case(
                "incremental: ADD of a known pod with a new spec is an UPDATE",
                vec![upd(Add, vec![a()])],
                upd(Add, vec![a2()]),
                vec![s(Update, &["a"])],
            ),
            case(
                "incremental: identical ADD is a no-op",
                vec![upd(Add, vec![a()])],
                upd(Add, vec![a()]),
                vec![],
            ),
            case(
                "incremental: ADD with a status change only is a RECONCILE",
                vec![upd(Set, vec![a(), b()])],
                upd(Add, vec![with_phase(a(), "Running"), b()]),
                vec![s(Reconcile, &["a"])],
            ),
            case(
                "incremental: ADD with spec and status changes is an UPDATE only",
                vec![upd(Set, vec![a(), b()])],
                upd(Add, vec![with_phase(a2(), "Running"), b()]),
                vec![s(Update, &["a"])],
            ),
            case(
                "incremental: duplicate names within one update keep the first",
                vec![],
                upd(Add, vec![a(), pod("other", "a", "img:9"), b()]),
                vec![s(Add, &["a", "b"])],
            ),
            // ---- Incremental: UPDATE
            case(
                "incremental: UPDATE with a label change",
                vec![upd(Add, vec![a()])],
                upd(Update, vec![with_label(a(), "tier", "web")]),
                vec![s(Update, &["a"])],
            ),
            case(
                "incremental: UPDATE with a changed label value",
                vec![upd(Add, vec![with_label(a(), "k", "v")])],
                upd(Update, vec![with_label(a(), "k", "w")]),
                vec![s(Update, &["a"])],
            ),
            case(
                "incremental: UPDATE with an added annotation",
                vec![upd(Add, vec![a()])],
                upd(Update, vec![with_annotation(a(), "note", "x")]),
                vec![s(Update, &["a"])],
            ),
            case(
                "incremental: UPDATE with a changed annotation",
                vec![upd(Add, vec![with_annotation(a(), "note", "x")])],
                upd(Update, vec![with_annotation(a(), "note", "y")]),
                vec![s(Update, &["a"])],
            ),
            case(
                "incremental: UPDATE with a removed annotation",
                vec![upd(
                    Add,
                    vec![with_annotation(with_annotation(a(), "n1", "x"), "n2", "y")],
                )],
                upd(Update, vec![with_annotation(a(), "n1", "x")]),
                vec![s(Update, &["a"])],
            ),
            case(
                "incremental: a change of the node's own annotations is no change",
                vec![upd(Add, vec![a()])],
                upd(
                    Update,
                    vec![with_annotation(
                        a(),
                        CONFIG_FIRST_SEEN_ANNOTATION_KEY,
                        "later",
                    )],
                ),
                vec![],
            ),
            case(
                "incremental: UPDATE with new owner references",
                vec![upd(Add, vec![a()])],
                upd(Update, vec![owned(a())]),
                vec![s(Update, &["a"])],
            ),
            case(
                "incremental: a generation change alone is no change",
                vec![upd(Add, vec![a()])],
                upd(Update, {
                    let mut p = a();
                    p.metadata.generation = Some(7);
                    vec![p]
                }),
                vec![],
            ),
            case(
                "incremental: status-only change is a RECONCILE",
                vec![upd(Add, vec![a()])],
                upd(Update, vec![with_phase(a(), "Running")]),
                vec![s(Reconcile, &["a"])],
            ),
            case(
                "incremental: spec and status change is an UPDATE only",
                vec![upd(Add, vec![a()])],
                upd(Update, vec![with_phase(a2(), "Running")]),
                vec![s(Update, &["a"])],
            ),
            case(
                "incremental: UPDATE of an unknown pod is an ADD",
                vec![],
                upd(Update, vec![a()]),
                vec![s(Add, &["a"])],
            ),
            // ---- Incremental: DELETE
            case(
                "incremental: deletion timestamp is a DELETE",
                vec![upd(Add, vec![a(), b()])],
                upd(Delete, vec![deleting(a())]),
                vec![s(Delete, &["a"])],
            ),
            case(
                "incremental: deletion timestamp arriving in an UPDATE is a DELETE",
                vec![upd(Add, vec![a()])],
                upd(Update, vec![deleting(a())]),
                vec![s(Delete, &["a"])],
            ),
            case(
                "incremental: a shorter grace period of a deleted pod is a DELETE again",
                vec![upd(Add, vec![deleting(a())])],
                upd(Update, {
                    let mut p = deleting(a());
                    p.metadata.deletion_grace_period_seconds = Some(0);
                    vec![p]
                }),
                vec![s(Delete, &["a"])],
            ),
            case(
                "incremental: DELETE of an unknown pod adds it",
                vec![],
                upd(Delete, vec![deleting(a())]),
                vec![s(Add, &["a"])],
            ),
            // ---- Incremental: REMOVE
            case(
                "incremental: REMOVE of a known pod",
                vec![upd(Add, vec![a(), b()])],
                upd(Remove, vec![a()]),
                vec![s(Remove, &["a"])],
            ),
            case(
                "incremental: REMOVE of an unknown pod is a no-op",
                vec![upd(Add, vec![b()])],
                upd(Remove, vec![a()]),
                vec![],
            ),
            // ---- Incremental: SET
            case(
                "incremental: first SET from a source",
                vec![],
                upd(Set, vec![a(), b()]),
                vec![s(Add, &["a", "b"])],
            ),
            case(
                "incremental: empty first SET sends an empty ADD",
                vec![],
                upd(Set, vec![]),
                vec![s(Add, &[])],
            ),
            case(
                "incremental: first SET with only known pods sends an empty ADD",
                vec![upd(Add, vec![a()])],
                upd(Set, vec![a()]),
                vec![s(Add, &[])],
            ),
            case(
                "incremental: first SET that only reconciles also announces the source",
                vec![upd(Add, vec![a()])],
                upd(Set, vec![with_phase(a(), "Running")]),
                vec![s(Add, &[]), s(Reconcile, &["a"])],
            ),
            case(
                "incremental: first SET that removes also announces the source",
                vec![upd(Add, vec![a()])],
                upd(Set, vec![]),
                vec![s(Remove, &["a"]), s(Add, &[])],
            ),
            case(
                "incremental: second empty SET is silent",
                vec![upd(Set, vec![])],
                upd(Set, vec![]),
                vec![],
            ),
            case(
                "incremental: ADD after an empty SET",
                vec![upd(Set, vec![]), upd(Set, vec![])],
                upd(Add, vec![a()]),
                vec![s(Add, &["a"])],
            ),
            case(
                "incremental: SET without a pod REMOVEs it, in order before ADD and UPDATE",
                vec![upd(Set, vec![a(), b()])],
                upd(Set, vec![pod("b", "b", "img:2"), c()]),
                vec![s(Remove, &["a"]), s(Add, &["c"]), s(Update, &["b"])],
            ),
            case(
                "incremental: SET with status change only",
                vec![upd(Set, vec![a()])],
                upd(Set, vec![with_phase(a(), "Running")]),
                vec![s(Reconcile, &["a"])],
            ),
            case(
                "incremental: identical SET is silent",
                vec![upd(Set, vec![a(), b()])],
                upd(Set, vec![b(), a()]),
                vec![],
            ),
            case(
                "incremental: SET with every kind of change, in upstream's order",
                vec![upd(Set, vec![a(), b(), pod("d", "d", "i"), pod("r", "r", "i")])],
                upd(
                    Set,
                    vec![
                        a2(),
                        deleting(b()),
                        c(),
                        with_phase(pod("r", "r", "i"), "Running"),
                    ],
                ),
                vec![
                    s(Remove, &["d"]),
                    s(Add, &["c"]),
                    s(Update, &["a"]),
                    s(Delete, &["b"]),
                    s(Reconcile, &["r"]),
                ],
            ),
            // ---- Incremental: RESTORE and RECONCILE
            case(
                "incremental: RESTORE is handed on as RESTORE",
                vec![],
                upd(Restore, vec![a()]),
                vec![s(Restore, &["a"])],
            ),
            case(
                "incremental: RESTORE of a pod the source already sent is ignored",
                vec![upd(Set, vec![a()])],
                upd(Restore, vec![a2(), b()]),
                vec![s(Restore, &["b"])],
            ),
            case(
                "incremental: the first SET after a RESTORE removes what the source lost",
                vec![upd(Restore, vec![a(), b()])],
                upd(Set, vec![a(), c()]),
                vec![s(Remove, &["b"]), s(Add, &["c"])],
            ),
            case(
                "incremental: the first SET after a RESTORE of the same pods announces the source",
                vec![upd(Restore, vec![a()])],
                upd(Set, vec![a()]),
                vec![s(Add, &[])],
            ),
            case(
                "incremental: the first SET after a RESTORE updates changed pods",
                vec![upd(Restore, vec![a()])],
                upd(Set, vec![a2()]),
                vec![s(Update, &["a"])],
            ),
            case(
                "incremental: RECONCILE from a source is ignored",
                vec![upd(Add, vec![a()])],
                upd(Reconcile, vec![with_phase(a(), "Running")]),
                vec![],
            ),
            // ---- Incremental: names across sources
            case(
                "incremental: a name taken by another source holds the pod",
                vec![from(FILE_SOURCE, Set, vec![pod("f", "web", "i")])],
                from(HTTP_SOURCE, Set, vec![pod("h", "web", "j"), b()]),
                vec![sf(HTTP_SOURCE, Add, &["b"])],
            ),
            case(
                "incremental: a held pod comes in once the name is free",
                vec![
                    from(FILE_SOURCE, Set, vec![pod("f", "web", "i")]),
                    from(HTTP_SOURCE, Set, vec![pod("h", "web", "j")]),
                ],
                from(FILE_SOURCE, Set, vec![]),
                vec![sf(FILE_SOURCE, Remove, &["f"]), sf(HTTP_SOURCE, Add, &["h"])],
            ),
            case(
                "incremental: a held pod its source dropped never comes in",
                vec![
                    from(FILE_SOURCE, Set, vec![pod("f", "web", "i")]),
                    from(HTTP_SOURCE, Set, vec![pod("h", "web", "j")]),
                    from(HTTP_SOURCE, Set, vec![]),
                ],
                from(FILE_SOURCE, Set, vec![]),
                vec![sf(FILE_SOURCE, Remove, &["f"])],
            ),
            case(
                "incremental: a held pod removed by REMOVE never comes in",
                vec![
                    upd(Add, vec![pod("a1", "a", "i")]),
                    from(FILE_SOURCE, Set, vec![pod("f", "a", "j")]),
                    from(FILE_SOURCE, Remove, vec![pod("f", "a", "j")]),
                ],
                upd(Remove, vec![pod("a1", "a", "i")]),
                vec![s(Remove, &["a1"])],
            ),
            case(
                "incremental: a second UID with a taken name waits within a source too",
                vec![upd(Add, vec![pod("a1", "a", "i")])],
                upd(Add, vec![pod("a2", "a", "j")]),
                vec![],
            ),
            case(
                "incremental: ...and comes in right after the first is removed",
                vec![
                    upd(Add, vec![pod("a1", "a", "i")]),
                    upd(Add, vec![pod("a2", "a", "j")]),
                ],
                upd(Remove, vec![pod("a1", "a", "i")]),
                vec![s(Remove, &["a1"]), s(Add, &["a2"])],
            ),
            case(
                "incremental: a SET replacing a pod by a new UID of the same name",
                vec![from(FILE_SOURCE, Set, vec![pod("f1", "web", "i")])],
                from(FILE_SOURCE, Set, vec![pod("f2", "web", "j")]),
                vec![sf(FILE_SOURCE, Remove, &["f1"]), sf(FILE_SOURCE, Add, &["f2"])],
            ),
            case(
                "incremental: the earliest held pod wins a freed name",
                vec![
                    from(FILE_SOURCE, Set, vec![pod("f", "web", "i")]),
                    from(HTTP_SOURCE, Set, vec![pod("h", "web", "j")]),
                    upd(Set, vec![pod("k", "web", "k")]),
                ],
                from(FILE_SOURCE, Set, vec![]),
                vec![sf(FILE_SOURCE, Remove, &["f"]), sf(HTTP_SOURCE, Add, &["h"])],
            ),
            case(
                "incremental: an UPDATE of a held pod is what comes in later",
                vec![
                    from(FILE_SOURCE, Set, vec![pod("f", "web", "i")]),
                    from(HTTP_SOURCE, Add, vec![pod("h", "web", "old")]),
                    from(HTTP_SOURCE, Update, vec![pod("h", "web", "new")]),
                ],
                from(FILE_SOURCE, Set, vec![]),
                vec![sf(FILE_SOURCE, Remove, &["f"]), sf(HTTP_SOURCE, Add, &["h"])],
            ),
            case(
                "incremental: mirror pods share their static pod's name",
                vec![from(FILE_SOURCE, Set, vec![pod("f", "web", "i")])],
                upd(Set, vec![mirror(pod("m", "web", "i"))]),
                vec![s(Add, &["m"])],
            ),
            case(
                "incremental: a restored pod whose name is taken is held",
                vec![upd(Add, vec![pod("a0", "web", "i")])],
                upd(Restore, vec![pod("r", "web", "i"), b()]),
                vec![s(Restore, &["b"])],
            ),
        ];
        let mut failures = Vec::new();
        for case in cases {
            let mut storage = PodStorage::with_clock(fixed_clock);
            run(&mut storage, case.setup);
            let source = case.update.source.clone();
            let out = storage.merge(&source, case.update);
            let got = summary(&out);
            if got != case.want {
                failures.push(format!(
                    "{}:\n   got {got:?}\n  want {:?}",
                    case.name, case.want
                ));
            }
        }
        assert!(failures.is_empty(), "{}", failures.join("\n"));
    }

    /// Pods are shared, not copied: a notification carries the stored
    /// pod itself, a pod the update leaves alone stays the one stored,
    /// and a status change replaces only that pod.
    #[test]
    fn stored_pods_are_shared_and_copied_only_when_they_change() {
        let mut storage = PodStorage::with_clock(fixed_clock);
        let a = Arc::new(pod("a", "a", "i"));
        let b = Arc::new(pod("b", "b", "i"));
        let out = storage.merge(
            API_SOURCE,
            PodUpdate::new(Set, API_SOURCE, vec![a, b.clone()]),
        );
        assert_eq!(out[0].op, Add);
        let stored = |s: &PodStorage, uid: &str| {
            s.source_pods(API_SOURCE)
                .into_iter()
                .find(|p| pod_uid(p) == uid)
                .unwrap()
        };
        let (a1, b1) = (stored(&storage, "a"), stored(&storage, "b"));
        assert!(out[0].pods.iter().any(|p| Arc::ptr_eq(p, &a1)));
        assert!(out[0].pods.iter().any(|p| Arc::ptr_eq(p, &b1)));

        // The next event: a's status changed, b did not.
        let a2 = Arc::new(with_phase(pod("a", "a", "i"), "Running"));
        let out = storage.merge(API_SOURCE, PodUpdate::new(Set, API_SOURCE, vec![a2, b]));
        assert_eq!(summary(&out), [(Reconcile, "api".into(), vec!["a".into()])]);
        assert!(Arc::ptr_eq(&out[0].pods[0], &stored(&storage, "a")));
        assert!(
            Arc::ptr_eq(&b1, &stored(&storage, "b")),
            "an unchanged pod is not copied"
        );
        // What was handed out before is left as it was.
        assert!(a1.status.is_none());
        let ann = stored(&storage, "a").metadata.annotations.clone().unwrap();
        assert_eq!(ann[CONFIG_SOURCE_ANNOTATION_KEY], "api");
        assert_eq!(ann[CONFIG_FIRST_SEEN_ANNOTATION_KEY], fixed_clock());
    }

    #[test]
    fn notifications_carry_the_stored_pod() {
        let mut storage = PodStorage::with_clock(fixed_clock);
        storage.merge(API_SOURCE, upd(Add, vec![pod("a", "a", "i:1")]));
        // REMOVE carries the pod as stored (the updated copy), not the
        // caller's.
        storage.merge(API_SOURCE, upd(Update, vec![pod("a", "a", "i:2")]));
        let out = storage.merge(API_SOURCE, upd(Remove, vec![pod("a", "a", "ignored")]));
        let image = out[0].pods[0].spec.as_ref().unwrap().containers[0]
            .image
            .clone();
        assert_eq!(image.as_deref(), Some("i:2"));

        // DELETE carries the deletion fields.
        storage.merge(API_SOURCE, upd(Add, vec![pod("b", "b", "i")]));
        let out = storage.merge(API_SOURCE, upd(Delete, vec![deleting(pod("b", "b", "i"))]));
        assert_eq!(
            out[0].pods[0].metadata.deletion_grace_period_seconds,
            Some(30)
        );
        assert!(out[0].pods[0].metadata.deletion_timestamp.is_some());

        // RECONCILE carries the new status.
        let out = storage.merge(
            API_SOURCE,
            upd(
                Update,
                vec![with_phase(deleting(pod("b", "b", "i")), "Failed")],
            ),
        );
        assert_eq!(out[0].op, Reconcile);
        let phase = out[0].pods[0].status.as_ref().unwrap().phase.clone();
        assert_eq!(phase.as_deref(), Some("Failed"));
    }

    #[test]
    fn merged_pods_carry_source_and_first_seen_annotations() {
        let mut storage = PodStorage::with_clock(fixed_clock);
        let out = storage.merge(
            FILE_SOURCE,
            from(FILE_SOURCE, Set, vec![pod("u", "a", "i:1")]),
        );
        let added = &out[0].pods[0];
        let ann = added.metadata.annotations.as_ref().unwrap();
        assert_eq!(ann[CONFIG_SOURCE_ANNOTATION_KEY], "file");
        assert_eq!(ann[CONFIG_FIRST_SEEN_ANNOTATION_KEY], fixed_clock());

        // An update keeps the first-seen time and takes the new annotations.
        let changed = with_annotation(pod("u", "a", "i:2"), "k", "v");
        let out = storage.merge(FILE_SOURCE, from(FILE_SOURCE, Set, vec![changed]));
        assert_eq!(out[0].op, Update);
        let ann = out[0].pods[0].metadata.annotations.as_ref().unwrap();
        assert_eq!(ann[CONFIG_FIRST_SEEN_ANNOTATION_KEY], fixed_clock());
        assert_eq!(ann[CONFIG_SOURCE_ANNOTATION_KEY], "file");
        assert_eq!(ann["k"], "v");
        assert_eq!(
            storage.source_pods(FILE_SOURCE)[0]
                .spec
                .as_ref()
                .unwrap()
                .containers[0]
                .image,
            Some("i:2".to_string())
        );

        // The source annotation is the merging source's, whatever the pod says.
        let lying = with_annotation(pod("v", "b", "i"), CONFIG_SOURCE_ANNOTATION_KEY, "api");
        let out = storage.merge(FILE_SOURCE, from(FILE_SOURCE, Add, vec![lying]));
        let ann = out[0].pods[0].metadata.annotations.as_ref().unwrap();
        assert_eq!(ann[CONFIG_SOURCE_ANNOTATION_KEY], "file");
    }

    #[test]
    fn real_clock_is_rfc3339() {
        let now = now_rfc3339();
        assert!(now.parse::<Timestamp>().is_ok(), "{now}");
        assert!(now.ends_with('Z') && now.contains('T'), "{now}");
    }

    #[test]
    fn sources_seen_and_merged_state() {
        let mut storage = PodStorage::new();
        assert!(storage.seen_sources([]));
        assert!(!storage.seen_sources([FILE_SOURCE]));
        storage.merge(API_SOURCE, upd(Add, vec![pod("u1", "a", "i")]));
        assert!(
            !storage.seen_sources([API_SOURCE]),
            "ADD does not mark a source seen"
        );
        storage.merge(API_SOURCE, upd(Restore, vec![pod("u9", "z", "i")]));
        assert!(
            !storage.seen_sources([API_SOURCE]),
            "RESTORE does not mark a source seen"
        );
        storage.merge(API_SOURCE, upd(Remove, vec![pod("u9", "z", "i")]));
        assert!(!storage.seen_sources([API_SOURCE]));
        storage.merge(
            FILE_SOURCE,
            from(FILE_SOURCE, Set, vec![pod("u2", "b", "i")]),
        );
        assert!(storage.seen_sources([FILE_SOURCE]));
        assert!(!storage.seen_sources([FILE_SOURCE, API_SOURCE]));
        let names: Vec<_> = storage
            .merged_state()
            .into_iter()
            .map(|p| p.metadata.name.clone().unwrap())
            .collect();
        assert_eq!(names, ["a", "b"]);
    }

    #[test]
    fn sources_are_independent() {
        let mut storage = PodStorage::new();
        storage.merge(API_SOURCE, upd(Set, vec![pod("u1", "a", "i")]));
        let out = storage.merge(FILE_SOURCE, from(FILE_SOURCE, Set, vec![]));
        assert_eq!(out.len(), 1);
        assert_eq!((out[0].op, out[0].pods.len()), (Add, 0));
        assert_eq!(storage.merged_state().len(), 1);
    }

    #[test]
    fn name_conflicts_raise_one_event_each() {
        let mut storage = PodStorage::with_clock(fixed_clock);
        storage.merge(
            FILE_SOURCE,
            from(FILE_SOURCE, Set, vec![pod("f", "web", "i")]),
        );
        assert!(storage.take_events().is_empty());

        // Within one update: dropped, one event.
        storage.merge(
            API_SOURCE,
            upd(Add, vec![pod("a1", "a", "i"), pod("a2", "a", "j")]),
        );
        let events = storage.take_events();
        assert_eq!(events.len(), 1, "{events:?}");
        assert_eq!(events[0].object.uid, "a2");
        assert_eq!(events[0].reason, FAILED_VALIDATION_REASON);
        assert_eq!(events[0].event_type, EventType::Warning);
        assert!(
            events[0].message.contains("duplicate pod name"),
            "{}",
            events[0].message
        );
        assert!(storage.held_pods(API_SOURCE).is_empty());

        // Across sources: held, one event naming both sides, not repeated
        // when the source sends the pod again.
        storage.merge(
            HTTP_SOURCE,
            from(HTTP_SOURCE, Set, vec![pod("h", "web", "j")]),
        );
        let events = storage.take_events();
        assert_eq!(events.len(), 1, "{events:?}");
        let e = &events[0];
        assert_eq!((e.source.as_str(), e.object.uid.as_str()), ("http", "h"));
        assert_eq!(
            (
                e.object.kind,
                e.object.namespace.as_str(),
                e.object.name.as_str()
            ),
            ("Pod", "default", "web")
        );
        assert!(
            e.message.contains("\"f\"") && e.message.contains("file"),
            "{}",
            e.message
        );
        storage.merge(
            HTTP_SOURCE,
            from(HTTP_SOURCE, Set, vec![pod("h", "web", "j2")]),
        );
        assert!(storage.take_events().is_empty());
        let held = storage.held_pods(HTTP_SOURCE);
        assert_eq!(held.len(), 1);
        assert_eq!(
            held[0].spec.as_ref().unwrap().containers[0]
                .image
                .as_deref(),
            Some("j2"),
            "the held copy follows its source"
        );
        assert!(storage.source_pods(HTTP_SOURCE).is_empty());
    }

    /// A held pod admitted later gets its first-seen time then, and the
    /// node's own annotations.
    #[test]
    fn admitted_pods_are_annotated() {
        fn late_clock() -> String {
            "2030-01-01T00:00:00Z".to_string()
        }
        let mut storage = PodStorage::with_clock(late_clock);
        storage.merge(
            FILE_SOURCE,
            from(FILE_SOURCE, Set, vec![pod("f", "web", "i")]),
        );
        storage.merge(
            HTTP_SOURCE,
            from(HTTP_SOURCE, Set, vec![pod("h", "web", "j")]),
        );
        let out = storage.merge(FILE_SOURCE, from(FILE_SOURCE, Set, vec![]));
        let admitted = &out[1];
        assert_eq!((admitted.op, admitted.source.as_str()), (Add, "http"));
        let ann = admitted.pods[0].metadata.annotations.as_ref().unwrap();
        assert_eq!(ann[CONFIG_SOURCE_ANNOTATION_KEY], "http");
        assert_eq!(ann[CONFIG_FIRST_SEEN_ANNOTATION_KEY], late_clock());
    }

    /// An API pod and a static pod with one name are both passed on,
    /// whichever came first: the sync loop refuses the API pod, so it can
    /// never hold the static pod back.
    #[test]
    fn api_pods_neither_hold_nor_wait_for_static_pods() {
        let mut storage = PodStorage::with_clock(fixed_clock);
        let out = storage.merge(API_SOURCE, upd(Set, vec![pod("squat", "web", "i")]));
        assert_eq!((out[0].op, out[0].pods.len()), (Add, 1));
        let out = storage.merge(
            FILE_SOURCE,
            from(FILE_SOURCE, Set, vec![pod("f", "web", "j")]),
        );
        assert_eq!((out[0].op, out[0].pods.len()), (Add, 1), "{out:?}");
        assert!(storage.held_pods(FILE_SOURCE).is_empty());
        let out = storage.merge(API_SOURCE, upd(Add, vec![pod("late", "web2", "i")]));
        assert_eq!(out[0].op, Add);
        storage.merge(
            HTTP_SOURCE,
            from(HTTP_SOURCE, Set, vec![pod("h", "web2", "k")]),
        );
        assert!(storage.held_pods(HTTP_SOURCE).is_empty());
        // Local sources still hold each other's names, and API pods each
        // other's.
        storage.merge(
            HTTP_SOURCE,
            from(
                HTTP_SOURCE,
                Set,
                vec![pod("h", "web2", "k"), pod("h2", "web", "k")],
            ),
        );
        assert_eq!(storage.held_pods(HTTP_SOURCE).len(), 1);
        storage.merge(API_SOURCE, upd(Add, vec![pod("squat2", "web", "i")]));
        assert_eq!(storage.held_pods(API_SOURCE).len(), 1);
        assert!(storage.take_events().len() >= 2);
    }
}
