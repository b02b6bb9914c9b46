//! `PodStorage`: the merged, per-source view of the desired pods and the
//! rules that turn one source's update into the minimal notifications for the
//! sync loop (upstream `podStorage.merge` in config/config.go).
//!
//! This is plain data with no locks or threads: [`PodStorage::merge`]
//! returns the notifications in the order they must be delivered, and the
//! caller (the Mux listener in `pod_config.rs`) sends them while it still
//! holds the lock around the storage, so that deliveries never interleave.

use std::collections::{BTreeMap, HashSet};
use std::time::{SystemTime, UNIX_EPOCH};

use k8s_openapi::jiff::Timestamp;

use super::{
    pod_full_name, pod_uid, NotificationMode, Pod, PodOperation, PodUpdate,
    CONFIG_FIRST_SEEN_ANNOTATION_KEY, CONFIG_MIRROR_ANNOTATION_KEY, CONFIG_SOURCE_ANNOTATION_KEY,
};

/// Annotations the node itself manages; a source changing them is not a
/// change to the pod.
const LOCAL_ANNOTATIONS: [&str; 3] = [
    CONFIG_SOURCE_ANNOTATION_KEY,
    CONFIG_MIRROR_ANNOTATION_KEY,
    CONFIG_FIRST_SEEN_ANNOTATION_KEY,
];

/// The pods of every source, keyed by source name and then by UID.
pub struct PodStorage {
    mode: NotificationMode,
    pods: BTreeMap<String, BTreeMap<String, Pod>>,
    /// Sources that have delivered at least one SET.
    sources_seen: HashSet<String>,
    /// The first-seen timestamp source (the wall clock outside tests).
    now: fn() -> String,
}

/// What a merge found, before it is shaped by the notification mode.
#[derive(Default)]
struct Changes {
    adds: Vec<Pod>,
    updates: Vec<Pod>,
    deletes: Vec<Pod>,
    removes: Vec<Pod>,
    reconciles: Vec<Pod>,
    restores: Vec<Pod>,
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
pub fn now_rfc3339() -> String {
    let since = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    let secs = i64::try_from(since.as_secs()).unwrap_or(i64::MAX);
    match Timestamp::new(secs, since.subsec_nanos() as i32) {
        Ok(ts) => ts.to_string(),
        Err(_) => Timestamp::UNIX_EPOCH.to_string(),
    }
}

impl PodStorage {
    pub fn new(mode: NotificationMode) -> PodStorage {
        PodStorage::with_clock(mode, now_rfc3339)
    }

    /// A storage whose first-seen timestamps come from `now`.
    pub fn with_clock(mode: NotificationMode, now: fn() -> String) -> PodStorage {
        PodStorage {
            mode,
            pods: BTreeMap::new(),
            sources_seen: HashSet::new(),
            now,
        }
    }

    pub fn mode(&self) -> NotificationMode {
        self.mode
    }

    /// True when every source in `sources` has delivered a SET.
    pub fn seen_sources<'a>(&self, sources: impl IntoIterator<Item = &'a str>) -> bool {
        sources.into_iter().all(|s| self.sources_seen.contains(s))
    }

    /// Copies of all pods of all sources (by source name, then UID).
    pub fn merged_state(&self) -> Vec<Pod> {
        self.pods
            .values()
            .flat_map(|m| m.values().cloned())
            .collect()
    }

    /// The current pods of one source.
    pub fn source_pods(&self, source: &str) -> Vec<Pod> {
        self.pods
            .get(source)
            .map(|m| m.values().cloned().collect())
            .unwrap_or_default()
    }

    /// Applies `update` from `source` and returns the notifications to
    /// deliver, in order.
    pub fn merge(&mut self, source: &str, update: PodUpdate) -> Vec<PodUpdate> {
        let seen_before = self.sources_seen.contains(source);
        let changes = self.apply(source, update);
        let first_set = !seen_before && self.sources_seen.contains(source);
        self.notifications(source, changes, first_set)
    }

    fn apply(&mut self, source: &str, update: PodUpdate) -> Changes {
        let mut changes = Changes::default();
        let now = self.now;
        match update.op {
            PodOperation::Add | PodOperation::Update | PodOperation::Delete => {
                log::debug!(
                    "{:?} of {} pod(s) from source {source}",
                    update.op,
                    update.pods.len()
                );
                let pods = self.pods.entry(source.to_string()).or_default();
                let mut previous = BTreeMap::new();
                update_pods(source, update.pods, &mut previous, pods, &mut changes, now);
            }
            PodOperation::Remove => {
                let pods = self.pods.entry(source.to_string()).or_default();
                for pod in &update.pods {
                    if let Some(existing) = pods.remove(pod_uid(pod)) {
                        changes.removes.push(existing);
                    }
                }
            }
            PodOperation::Set => {
                log::debug!("SET of {} pod(s) from source {source}", update.pods.len());
                self.sources_seen.insert(source.to_string());
                let pods = self.pods.entry(source.to_string()).or_default();
                let mut previous = std::mem::take(pods);
                update_pods(source, update.pods, &mut previous, pods, &mut changes, now);
                changes.removes.extend(previous.into_values());
            }
            PodOperation::Restore => {
                // Checkpointed pods are handed on as they are: they are not the
                // source's word, so they neither enter the storage nor mark the
                // source as seen.
                changes.restores = update.pods;
            }
            PodOperation::Reconcile => {
                log::warn!(
                    "source {source} sent a RECONCILE, which only the merge produces; ignored"
                );
            }
        }
        changes
    }

    fn notifications(&self, source: &str, c: Changes, first_set: bool) -> Vec<PodUpdate> {
        let mut out = Vec::new();
        let mut push = |op, pods: Vec<Pod>| out.push(PodUpdate::new(op, source, pods));
        match self.mode {
            NotificationMode::Incremental => {
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
            }
            NotificationMode::SnapshotAndUpdates => {
                if !c.removes.is_empty() || !c.adds.is_empty() || first_set {
                    push(PodOperation::Set, self.merged_state());
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
            }
            NotificationMode::Snapshot => {
                let changed = !c.updates.is_empty()
                    || !c.deletes.is_empty()
                    || !c.adds.is_empty()
                    || !c.removes.is_empty();
                if changed || first_set {
                    push(PodOperation::Set, self.merged_state());
                }
                if !c.restores.is_empty() {
                    push(PodOperation::Restore, c.restores);
                }
            }
        }
        out
    }
}

/// Merges `incoming` into `pods`. A pod already known (in `pods`, or in
/// `previous` for a SET, from where it is moved) is compared and updated in
/// place; an unknown one is added. Duplicate full names keep the first pod.
fn update_pods(
    source: &str,
    incoming: Vec<Pod>,
    previous: &mut BTreeMap<String, Pod>,
    pods: &mut BTreeMap<String, Pod>,
    changes: &mut Changes,
    now: fn() -> String,
) {
    let mut names = HashSet::new();
    for (index, mut pod) in incoming.into_iter().enumerate() {
        let full_name = pod_full_name(&pod);
        if !names.insert(full_name.clone()) {
            log::warn!(
                "source {source}: pod {full_name} (index {index}, uid {:?}) has the same name as an \
                 earlier pod in the same update; ignoring it",
                pod_uid(&pod)
            );
            continue;
        }
        pod.metadata
            .annotations
            .get_or_insert_with(Default::default)
            .insert(CONFIG_SOURCE_ANNOTATION_KEY.to_string(), source.to_string());
        let uid = pod_uid(&pod).to_string();
        if !pods.contains_key(&uid) {
            if let Some(existing) = previous.remove(&uid) {
                pods.insert(uid.clone(), existing);
            }
        }
        match pods.get_mut(&uid) {
            Some(existing) => match check_and_update(existing, pod) {
                Difference::Update => changes.updates.push(existing.clone()),
                Difference::GracefulDelete => changes.deletes.push(existing.clone()),
                Difference::Reconcile => changes.reconciles.push(existing.clone()),
                Difference::None => {}
            },
            None => {
                log::debug!("source {source}: new pod {full_name} ({uid})");
                pod.metadata
                    .annotations
                    .get_or_insert_with(Default::default)
                    .insert(CONFIG_FIRST_SEEN_ANNOTATION_KEY.to_string(), now());
                changes.adds.push(pod.clone());
                pods.insert(uid, pod);
            }
        }
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
fn check_and_update(existing: &mut Pod, incoming: Pod) -> Difference {
    if !differ_semantically(existing, &incoming) {
        if existing.status != incoming.status {
            existing.status = incoming.status;
            return Difference::Reconcile;
        }
        return Difference::None;
    }
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
    use crate::config::{API_SOURCE, FILE_SOURCE};
    use k8s_openapi::api::core::v1::{Container, PodSpec, PodStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use PodOperation::*;

    fn fixed_clock() -> String {
        "2024-01-02T03:04:05.000000006Z".to_string()
    }

    fn pod(uid: &str, name: &str, image: &str) -> Pod {
        let mut p = Pod::default();
        p.metadata.uid = Some(uid.to_string());
        p.metadata.name = Some(name.to_string());
        p.metadata.namespace = Some("default".to_string());
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
        p.metadata
            .annotations
            .get_or_insert_with(Default::default)
            .insert(k.to_string(), v.to_string());
        p
    }

    fn deleting(mut p: Pod) -> Pod {
        let ts = Timestamp::new(1_700_000_000, 0).unwrap();
        p.metadata.deletion_timestamp = Some(Time(ts));
        p.metadata.deletion_grace_period_seconds = Some(30);
        p
    }

    fn upd(op: PodOperation, pods: Vec<Pod>) -> PodUpdate {
        PodUpdate::new(op, API_SOURCE, pods)
    }

    /// (op, source, names) of each notification, for compact assertions.
    fn summary(out: &[PodUpdate]) -> Vec<(PodOperation, String, Vec<String>)> {
        out.iter()
            .map(|u| {
                let names = u
                    .pods
                    .iter()
                    .map(|p| p.metadata.name.clone().unwrap_or_default())
                    .collect();
                (u.op, u.source.clone(), names)
            })
            .collect()
    }

    fn s(op: PodOperation, names: &[&str]) -> (PodOperation, String, Vec<String>) {
        (
            op,
            API_SOURCE.to_string(),
            names.iter().map(|n| n.to_string()).collect(),
        )
    }

    struct Case {
        name: &'static str,
        mode: NotificationMode,
        /// Updates merged before the one under test; their output is ignored.
        setup: Vec<PodUpdate>,
        update: PodUpdate,
        want: Vec<(PodOperation, String, Vec<String>)>,
    }

    #[test]
    fn merge_cases() {
        use NotificationMode::*;
        let a = || pod("uid-a", "a", "img:1");
        let b = || pod("uid-b", "b", "img:1");
        let cases = vec![
            Case {
                name: "incremental: ADD of a new pod",
                mode: Incremental,
                setup: vec![],
                update: upd(Add, vec![a()]),
                want: vec![s(Add, &["a"])],
            },
            Case {
                name: "incremental: ADD of a known pod with a new spec is an UPDATE",
                mode: Incremental,
                setup: vec![upd(Add, vec![a()])],
                update: upd(Add, vec![pod("uid-a", "a", "img:2")]),
                want: vec![s(Update, &["a"])],
            },
            Case {
                name: "incremental: identical ADD is a no-op",
                mode: Incremental,
                setup: vec![upd(Add, vec![a()])],
                update: upd(Add, vec![a()]),
                want: vec![],
            },
            Case {
                name: "incremental: UPDATE with a label change",
                mode: Incremental,
                setup: vec![upd(Add, vec![a()])],
                update: upd(Update, vec![with_label(a(), "tier", "web")]),
                want: vec![s(Update, &["a"])],
            },
            Case {
                name: "incremental: UPDATE with an annotation change",
                mode: Incremental,
                setup: vec![upd(Add, vec![a()])],
                update: upd(Update, vec![with_annotation(a(), "note", "x")]),
                want: vec![s(Update, &["a"])],
            },
            Case {
                name: "incremental: a change of the node's own annotations is no change",
                mode: Incremental,
                setup: vec![upd(Add, vec![a()])],
                update: upd(
                    Update,
                    vec![with_annotation(
                        a(),
                        CONFIG_FIRST_SEEN_ANNOTATION_KEY,
                        "later",
                    )],
                ),
                want: vec![],
            },
            Case {
                name: "incremental: status-only change is a RECONCILE",
                mode: Incremental,
                setup: vec![upd(Add, vec![a()])],
                update: upd(Update, vec![with_phase(a(), "Running")]),
                want: vec![s(Reconcile, &["a"])],
            },
            Case {
                name: "incremental: spec and status change is an UPDATE only",
                mode: Incremental,
                setup: vec![upd(Add, vec![a()])],
                update: upd(
                    Update,
                    vec![with_phase(pod("uid-a", "a", "img:2"), "Running")],
                ),
                want: vec![s(Update, &["a"])],
            },
            Case {
                name: "incremental: deletion timestamp is a DELETE",
                mode: Incremental,
                setup: vec![upd(Add, vec![a(), b()])],
                update: upd(Delete, vec![deleting(a())]),
                want: vec![s(Delete, &["a"])],
            },
            Case {
                name: "incremental: deletion timestamp arriving in an UPDATE is a DELETE",
                mode: Incremental,
                setup: vec![upd(Add, vec![a()])],
                update: upd(Update, vec![deleting(a())]),
                want: vec![s(Delete, &["a"])],
            },
            Case {
                name: "incremental: REMOVE of a known pod",
                mode: Incremental,
                setup: vec![upd(Add, vec![a(), b()])],
                update: upd(Remove, vec![a()]),
                want: vec![s(Remove, &["a"])],
            },
            Case {
                name: "incremental: REMOVE of an unknown pod is a no-op",
                mode: Incremental,
                setup: vec![upd(Add, vec![b()])],
                update: upd(Remove, vec![a()]),
                want: vec![],
            },
            Case {
                name: "incremental: first SET from a source",
                mode: Incremental,
                setup: vec![],
                update: upd(Set, vec![a(), b()]),
                want: vec![s(Add, &["a", "b"])],
            },
            Case {
                name: "incremental: empty first SET sends an empty ADD",
                mode: Incremental,
                setup: vec![],
                update: upd(Set, vec![]),
                want: vec![s(Add, &[])],
            },
            Case {
                name: "incremental: first SET with only known pods sends an empty ADD",
                mode: Incremental,
                setup: vec![upd(Add, vec![a()])],
                update: upd(Set, vec![a()]),
                want: vec![s(Add, &[])],
            },
            Case {
                name: "incremental: second empty SET is silent",
                mode: Incremental,
                setup: vec![upd(Set, vec![])],
                update: upd(Set, vec![]),
                want: vec![],
            },
            Case {
                name: "incremental: SET without a pod REMOVEs it, in order before ADD and UPDATE",
                mode: Incremental,
                setup: vec![upd(Set, vec![a(), b()])],
                update: upd(
                    Set,
                    vec![pod("uid-b", "b", "img:2"), pod("uid-c", "c", "img:1")],
                ),
                want: vec![s(Remove, &["a"]), s(Add, &["c"]), s(Update, &["b"])],
            },
            Case {
                name: "incremental: SET with status change only",
                mode: Incremental,
                setup: vec![upd(Set, vec![a()])],
                update: upd(Set, vec![with_phase(a(), "Running")]),
                want: vec![s(Reconcile, &["a"])],
            },
            Case {
                name: "incremental: duplicate full names keep the first",
                mode: Incremental,
                setup: vec![],
                update: upd(Add, vec![a(), pod("uid-other", "a", "img:9"), b()]),
                want: vec![s(Add, &["a", "b"])],
            },
            Case {
                name: "incremental: RESTORE is handed on and not stored",
                mode: Incremental,
                setup: vec![],
                update: upd(Restore, vec![a()]),
                want: vec![s(Restore, &["a"])],
            },
            Case {
                name: "incremental: RECONCILE from a source is ignored",
                mode: Incremental,
                setup: vec![upd(Add, vec![a()])],
                update: upd(Reconcile, vec![with_phase(a(), "Running")]),
                want: vec![],
            },
            Case {
                name: "snapshot: first empty SET sends an empty SET",
                mode: Snapshot,
                setup: vec![],
                update: upd(Set, vec![]),
                want: vec![s(Set, &[])],
            },
            Case {
                name: "snapshot: an update sends the whole state",
                mode: Snapshot,
                setup: vec![upd(Set, vec![a(), b()])],
                update: upd(Update, vec![pod("uid-a", "a", "img:2")]),
                want: vec![s(Set, &["a", "b"])],
            },
            Case {
                name: "snapshot: a removal sends the whole state",
                mode: Snapshot,
                setup: vec![upd(Set, vec![a(), b()])],
                update: upd(Set, vec![b()]),
                want: vec![s(Set, &["b"])],
            },
            Case {
                name: "snapshot: a status-only change sends nothing",
                mode: Snapshot,
                setup: vec![upd(Set, vec![a()])],
                update: upd(Set, vec![with_phase(a(), "Running")]),
                want: vec![],
            },
            Case {
                name: "snapshot and updates: an addition sends the whole state",
                mode: SnapshotAndUpdates,
                setup: vec![upd(Set, vec![a()])],
                update: upd(Add, vec![b()]),
                want: vec![s(Set, &["a", "b"])],
            },
            Case {
                name: "snapshot and updates: a change sends UPDATE",
                mode: SnapshotAndUpdates,
                setup: vec![upd(Set, vec![a(), b()])],
                update: upd(Update, vec![pod("uid-a", "a", "img:2")]),
                want: vec![s(Update, &["a"])],
            },
            Case {
                name: "snapshot and updates: a graceful deletion sends DELETE",
                mode: SnapshotAndUpdates,
                setup: vec![upd(Set, vec![a(), b()])],
                update: upd(Update, vec![deleting(a())]),
                want: vec![s(Delete, &["a"])],
            },
            Case {
                name: "snapshot and updates: removal plus change sends SET then UPDATE",
                mode: SnapshotAndUpdates,
                setup: vec![upd(Set, vec![a(), b()])],
                update: upd(Set, vec![pod("uid-b", "b", "img:2")]),
                want: vec![s(Set, &["b"]), s(Update, &["b"])],
            },
            Case {
                name: "snapshot and updates: first SET of known pods sends SET",
                mode: SnapshotAndUpdates,
                setup: vec![upd(Add, vec![a()])],
                update: upd(Set, vec![a()]),
                want: vec![s(Set, &["a"])],
            },
        ];
        for case in cases {
            let mut storage = PodStorage::with_clock(case.mode, fixed_clock);
            for u in case.setup {
                storage.merge(API_SOURCE, u);
            }
            let out = storage.merge(API_SOURCE, case.update);
            assert_eq!(summary(&out), case.want, "{}", case.name);
        }
    }

    #[test]
    fn merged_pods_carry_source_and_first_seen_annotations() {
        let mut storage = PodStorage::with_clock(NotificationMode::Incremental, fixed_clock);
        let out = storage.merge(
            FILE_SOURCE,
            PodUpdate::new(Set, FILE_SOURCE, vec![pod("u", "a", "i:1")]),
        );
        let added = &out[0].pods[0];
        let ann = added.metadata.annotations.as_ref().unwrap();
        assert_eq!(ann[CONFIG_SOURCE_ANNOTATION_KEY], "file");
        assert_eq!(ann[CONFIG_FIRST_SEEN_ANNOTATION_KEY], fixed_clock());

        // An update keeps the first-seen time and takes the new annotations.
        let changed = with_annotation(pod("u", "a", "i:2"), "k", "v");
        let out = storage.merge(FILE_SOURCE, PodUpdate::new(Set, FILE_SOURCE, vec![changed]));
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
    }

    #[test]
    fn real_clock_is_rfc3339() {
        let now = now_rfc3339();
        assert!(now.parse::<Timestamp>().is_ok(), "{now}");
        assert!(now.ends_with('Z') && now.contains('T'), "{now}");
    }

    #[test]
    fn sources_seen_and_merged_state() {
        let mut storage = PodStorage::new(NotificationMode::Incremental);
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
        storage.merge(
            FILE_SOURCE,
            PodUpdate::new(Set, FILE_SOURCE, vec![pod("u2", "b", "i")]),
        );
        assert!(storage.seen_sources([FILE_SOURCE]));
        assert!(!storage.seen_sources([FILE_SOURCE, API_SOURCE]));
        let names: Vec<_> = storage
            .merged_state()
            .into_iter()
            .map(|p| p.metadata.name.unwrap())
            .collect();
        assert_eq!(names, ["a", "b"]);
    }

    #[test]
    fn sources_are_independent() {
        let mut storage = PodStorage::new(NotificationMode::Incremental);
        storage.merge(API_SOURCE, upd(Set, vec![pod("u1", "a", "i")]));
        let out = storage.merge(FILE_SOURCE, PodUpdate::new(Set, FILE_SOURCE, vec![]));
        assert_eq!(out.len(), 1);
        assert_eq!((out[0].op, out[0].pods.len()), (Add, 0));
        assert_eq!(storage.merged_state().len(), 1);
    }
}
