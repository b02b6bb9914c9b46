//! Property tests of [`PodStorage::merge`]: seeded random sequences of
//! source updates (every op, with and without name conflicts),
//! checked after every step against a simple model of what each source
//! last said, and against the state a consumer rebuilds from the
//! notifications alone. Deterministic: a fixed seed per sequence, printed on
//! failure.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Container, PodSpec, PodStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{OwnerReference, Time};
use k8s_openapi::jiff::Timestamp;

use super::storage::PodStorage;
use super::{Pod, PodOperation, PodUpdate};
use crate::pod::{
    is_mirror_pod, pod_full_name, pod_uid, API_SOURCE, CONFIG_FIRST_SEEN_ANNOTATION_KEY,
    CONFIG_MIRROR_ANNOTATION_KEY, CONFIG_SOURCE_ANNOTATION_KEY, FILE_SOURCE, HTTP_SOURCE,
};

const SOURCES: [&str; 3] = [API_SOURCE, FILE_SOURCE, HTTP_SOURCE];
const SEQUENCES: u64 = 200;
const STEPS: usize = 40;
const PODS_PER_SOURCE: usize = 6;

/// xorshift64*: small, seeded, good enough to shuffle test inputs.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    fn chance(&mut self, percent: usize) -> bool {
        self.below(100) < percent
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Names {
    /// Every UID has a name of its own.
    Unique,
    /// UIDs share names within and across sources; some API pods are
    /// mirror pods.
    Colliding,
}

fn gen_pod(rng: &mut Rng, source: &str, index: usize, names: Names) -> Pod {
    let mut p = Pod::default();
    p.metadata.uid = Some(format!("{source}-{index}"));
    p.metadata.namespace = Some("default".into());
    p.metadata.name = Some(match names {
        Names::Unique => format!("{source}-p{index}"),
        Names::Colliding => format!("p{}", index % 3),
    });
    let mut annotations = BTreeMap::new();
    if names == Names::Colliding && source == API_SOURCE && index % 4 == 3 {
        annotations.insert(CONFIG_MIRROR_ANNOTATION_KEY.to_string(), "m".to_string());
    }
    if rng.chance(30) {
        annotations.insert("note".into(), format!("n{}", rng.below(2)));
    }
    if rng.chance(10) {
        // Sources may not set the node's own annotations; it must not matter.
        annotations.insert(CONFIG_FIRST_SEEN_ANNOTATION_KEY.into(), "bogus".into());
    }
    if !annotations.is_empty() {
        p.metadata.annotations = Some(annotations);
    }
    if rng.chance(30) {
        let mut labels = BTreeMap::new();
        labels.insert("tier".to_string(), format!("t{}", rng.below(2)));
        p.metadata.labels = Some(labels);
    }
    if rng.chance(10) {
        p.metadata.owner_references = Some(vec![OwnerReference {
            api_version: "v1".into(),
            kind: "Node".into(),
            name: "n".into(),
            uid: "node-uid".into(),
            ..Default::default()
        }]);
    }
    if rng.chance(10) {
        let ts = Timestamp::new(1_700_000_000 + rng.below(2) as i64, 0).unwrap_or_default();
        p.metadata.deletion_timestamp = Some(Time(ts));
        p.metadata.deletion_grace_period_seconds = Some(rng.below(2) as i64 * 30);
    }
    if rng.chance(40) {
        p.status = Some(PodStatus {
            phase: Some(["Pending", "Running", "Failed"][rng.below(3)].to_string()),
            ..Default::default()
        });
    }
    p.spec = Some(PodSpec {
        containers: vec![Container {
            name: "c".into(),
            image: Some(format!("img:{}", rng.below(3))),
            ..Default::default()
        }],
        ..Default::default()
    });
    p
}

fn gen_update(rng: &mut Rng, names: Names) -> (String, PodUpdate) {
    let source = SOURCES[rng.below(SOURCES.len())];
    let op = match rng.below(100) {
        0..=29 => PodOperation::Set,
        30..=49 => PodOperation::Add,
        50..=62 => PodOperation::Update,
        63..=72 => PodOperation::Delete,
        73..=89 => PodOperation::Remove,
        90..=97 => PodOperation::Restore,
        _ => PodOperation::Reconcile,
    };
    let count = rng.below(5);
    let mut pods = Vec::with_capacity(count + 1);
    for _ in 0..count {
        let index = rng.below(PODS_PER_SOURCE);
        pods.push(gen_pod(rng, source, index, names));
    }
    if !pods.is_empty() && rng.chance(10) {
        // The same pod twice in one update.
        let again = pods[rng.below(pods.len())].clone();
        pods.push(again);
    }
    let pods = pods.into_iter().map(Arc::new).collect();
    (source.to_string(), PodUpdate::new(op, source, pods))
}

/// What each source last said, by UID: the reference for the merge.
#[derive(Default)]
struct Model {
    sources: BTreeMap<String, BTreeMap<String, Arc<Pod>>>,
    seen: HashSet<String>,
}

impl Model {
    fn apply(&mut self, source: &str, update: &PodUpdate) {
        // Within one update, the first pod with a name wins.
        let mut names = HashSet::new();
        let deduped: Vec<&Arc<Pod>> = update
            .pods
            .iter()
            .filter(|p| names.insert(pod_full_name(p)))
            .collect();
        let state = self.sources.entry(source.to_string()).or_default();
        match update.op {
            PodOperation::Add | PodOperation::Update | PodOperation::Delete => {
                for p in deduped {
                    state.insert(pod_uid(p).to_string(), p.clone());
                }
            }
            PodOperation::Remove => {
                for p in &update.pods {
                    state.remove(pod_uid(p));
                }
            }
            PodOperation::Set => {
                self.seen.insert(source.to_string());
                *state = deduped
                    .into_iter()
                    .map(|p| (pod_uid(p).to_string(), p.clone()))
                    .collect();
            }
            PodOperation::Restore => {
                for p in deduped {
                    state
                        .entry(pod_uid(p).to_string())
                        .or_insert_with(|| p.clone());
                }
            }
            PodOperation::Reconcile => {}
        }
    }
}

/// A pod as far as the merge promises to keep it: without the node's own
/// annotations, with empty maps and lists as absent.
fn normalized(p: &Pod) -> Pod {
    let mut p = p.clone();
    if let Some(a) = p.metadata.annotations.as_mut() {
        a.remove(CONFIG_SOURCE_ANNOTATION_KEY);
        a.remove(CONFIG_FIRST_SEEN_ANNOTATION_KEY);
    }
    if p.metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.is_empty())
    {
        p.metadata.annotations = None;
    }
    p
}

/// The state a consumer of the notifications holds, by UID.
#[derive(Default)]
struct Consumer {
    pods: BTreeMap<String, Arc<Pod>>,
}

impl Consumer {
    fn apply(&mut self, u: &PodUpdate) -> Result<(), String> {
        use PodOperation::*;
        match u.op {
            Set => return Err("a SET is never sent to the sync loop".to_string()),
            Remove => {
                for p in &u.pods {
                    if self.pods.remove(pod_uid(p)).is_none() {
                        return Err(format!("REMOVE of {} that was never added", pod_uid(p)));
                    }
                }
            }
            Add | Restore => {
                for p in &u.pods {
                    if self
                        .pods
                        .insert(pod_uid(p).to_string(), p.clone())
                        .is_some()
                    {
                        return Err(format!("{:?} of {} that is known", u.op, pod_uid(p)));
                    }
                }
            }
            Update | Delete | Reconcile => {
                for p in &u.pods {
                    if self
                        .pods
                        .insert(pod_uid(p).to_string(), p.clone())
                        .is_none()
                    {
                        return Err(format!("{:?} of {} that is unknown", u.op, pod_uid(p)));
                    }
                }
            }
        }
        Ok(())
    }
}

fn check_step(
    storage: &PodStorage,
    model: &Model,
    consumer: &Consumer,
    names: Names,
) -> Result<(), String> {
    // The merged state, by source.
    let mut merged: BTreeMap<String, BTreeMap<String, Arc<Pod>>> = BTreeMap::new();
    for p in storage.merged_state() {
        let source = p
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(CONFIG_SOURCE_ANNOTATION_KEY))
            .cloned()
            .ok_or_else(|| format!("pod {} without a source annotation", pod_uid(&p)))?;
        if p.metadata
            .annotations
            .as_ref()
            .is_none_or(|a| !a.contains_key(CONFIG_FIRST_SEEN_ANNOTATION_KEY))
        {
            return Err(format!(
                "pod {} without a first-seen annotation",
                pod_uid(&p)
            ));
        }
        merged
            .entry(source)
            .or_default()
            .insert(pod_uid(&p).to_string(), p);
    }

    for source in SOURCES {
        let said = model.sources.get(source).cloned().unwrap_or_default();
        let stored = merged.get(source).cloned().unwrap_or_default();
        let held: BTreeMap<String, Arc<Pod>> = storage
            .held_pods(source)
            .into_iter()
            .map(|p| (pod_uid(&p).to_string(), p))
            .collect();
        if names == Names::Unique && !held.is_empty() {
            return Err(format!("{source}: pods held without a name conflict"));
        }
        // Every pod the source has is merged or held, once, as it was sent.
        for (uid, want) in &said {
            let got = match (stored.get(uid), held.get(uid)) {
                (Some(p), None) | (None, Some(p)) => p,
                (None, None) => return Err(format!("{source}: pod {uid} lost")),
                (Some(_), Some(_)) => return Err(format!("{source}: pod {uid} merged and held")),
            };
            if normalized(got) != normalized(want) {
                return Err(format!(
                    "{source}: pod {uid} differs from what the source sent\n got {:?}\nwant {:?}",
                    normalized(got),
                    normalized(want)
                ));
            }
        }
        for uid in stored.keys().chain(held.keys()) {
            if !said.contains_key(uid) {
                return Err(format!(
                    "{source}: pod {uid} kept though its source dropped it"
                ));
            }
        }
        if storage.seen_sources([source]) != model.seen.contains(source) {
            return Err(format!("{source}: seen is wrong"));
        }
    }

    // Names are unique among merged pods (mirror pods aside) of the local
    // sources, and apart among the API's (the sync loop settles a conflict
    // between the two), and a pod is held only while another merged pod of
    // its side has its name.
    let side = |source: &str, p: &Pod| {
        let api = if source == API_SOURCE { "api " } else { "" };
        format!("{api}{}", pod_full_name(p))
    };
    let mut owners: HashMap<String, String> = HashMap::new();
    for (source, pods) in &merged {
        for p in pods.values() {
            if is_mirror_pod(p) {
                continue;
            }
            if let Some(other) = owners.insert(side(source, p), pod_uid(p).to_string()) {
                return Err(format!(
                    "pods {other} and {} are both merged as {}",
                    pod_uid(p),
                    pod_full_name(p)
                ));
            }
        }
    }
    for source in SOURCES {
        for p in storage.held_pods(source) {
            if !owners.contains_key(&side(source, &p)) {
                return Err(format!(
                    "{source}: pod {} held though {} is free",
                    pod_uid(&p),
                    pod_full_name(&p)
                ));
            }
        }
    }

    // The notifications alone rebuild the merged state.
    let merged_by_uid: BTreeMap<String, Arc<Pod>> =
        merged.into_values().flat_map(|m| m.into_iter()).collect();
    let got: BTreeMap<_, Pod> = consumer
        .pods
        .iter()
        .map(|(k, p)| (k.clone(), (**p).clone()))
        .collect();
    let want: BTreeMap<_, Pod> = merged_by_uid
        .into_iter()
        .map(|(k, p)| (k, Arc::unwrap_or_clone(p)))
        .collect();
    if got != want {
        let got_keys: Vec<_> = got.keys().collect();
        let want_keys: Vec<_> = want.keys().collect();
        return Err(format!(
            "the consumer's state differs from the merged state: {got_keys:?} vs {want_keys:?}"
        ));
    }
    Ok(())
}

fn run_sequence(seed: u64, names: Names) -> Result<(), String> {
    let mut rng = Rng::new(seed);
    let mut storage = PodStorage::new();
    let mut model = Model::default();
    let mut consumer = Consumer::default();
    let mut log = Vec::new();
    for step in 0..STEPS {
        let (source, update) = gen_update(&mut rng, names);
        log.push(format!(
            "{step}: {source} {:?} {:?}",
            update.op,
            update.pods.iter().map(|p| pod_uid(p)).collect::<Vec<_>>()
        ));
        let first_set = update.op == PodOperation::Set && !model.seen.contains(&source);
        model.apply(&source, &update);
        let out = storage.merge(&source, update);
        if first_set && !out.iter().any(|u| u.source == source) {
            return Err(format!(
                "{}\nfirst SET of {source} sent nothing",
                log.join("\n")
            ));
        }
        for u in &out {
            consumer
                .apply(u)
                .map_err(|e| format!("{}\n{e}", log.join("\n")))?;
        }
        check_step(&storage, &model, &consumer, names)
            .map_err(|e| format!("{}\n{e}", log.join("\n")))?;
    }
    Ok(())
}

#[test]
fn random_sequences_keep_the_merge_consistent() {
    for names in [Names::Unique, Names::Colliding] {
        for seed in 0..SEQUENCES {
            if let Err(e) = run_sequence(seed, names) {
                panic!("seed {seed}, {names:?} names:\n{e}");
            }
        }
    }
}

/// The generator itself: every op and both kinds of name conflict occur,
/// so the property above is not vacuous.
#[test]
fn the_generator_covers_every_op_and_conflict() {
    let mut rng = Rng::new(7);
    let mut ops = HashSet::new();
    let mut storage = PodStorage::new();
    let mut held_seen = false;
    let mut dup_in_update = false;
    for _ in 0..2000 {
        let (source, update) = gen_update(&mut rng, Names::Colliding);
        ops.insert(format!("{:?}", update.op));
        let mut names = HashSet::new();
        dup_in_update |= !update.pods.iter().all(|p| names.insert(pod_full_name(p)));
        storage.merge(&source, update);
        held_seen |= SOURCES.iter().any(|s| !storage.held_pods(s).is_empty());
    }
    assert_eq!(ops.len(), 7, "{ops:?}");
    assert!(held_seen, "no pod was ever held");
    assert!(dup_in_update, "no update had a duplicate name");
}
