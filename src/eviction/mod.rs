//! The eviction manager (upstream `pkg/kubelet/eviction`): thresholds on
//! the node's signals (`memory.available`, `nodefs.available`,
//! `nodefs.inodesFree`, `imagefs.available`, `imagefs.inodesFree`,
//! `pid.available`), the node's pressure conditions, the admission of new
//! pods under pressure, and the choice of the pod to evict.
//!
//! This file is pure: threshold parsing (`--eviction-hard`,
//! `--eviction-soft`, `--eviction-soft-grace-period`,
//! `--eviction-minimum-reclaim`), which thresholds observations meet (with
//! grace periods, minimum reclaim and the pressure transition period, as
//! [`Tracker`]), the ranking of pods, the messages, and the local storage
//! limits (emptyDir `sizeLimit`, containers' and pods' ephemeral-storage
//! limits).
//!
//! A usage measured only in part (a walk of a volume or a log directory
//! that stopped at its budget, see `paths::disk_usage`) is never taken
//! for the lower bound it is: it is over every local storage limit, and
//! under disk pressure it ranks as the largest usage there is (over its
//! requests, first among the pods of its priority). A container cannot
//! hide what it writes by making it costly to count. `manager` is the `eviction-manager` thread that observes the
//! node every 10 s, reclaims node-level resources and asks the sync loop
//! to evict.

pub(crate) mod manager;

use std::collections::BTreeMap;
use std::fmt;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;

pub(crate) use crate::node::pressure::{Condition, State};
use crate::pod::is_critical;
use crate::quantity::{format_binary_si, format_decimal_si, parse_quantity};
use crate::stats::PodUsage;

/// The reason of an evicted pod and of a pod refused under pressure.
pub(crate) const REASON: &str = "Evicted";
/// How often the node is observed (upstream's monitoring interval).
pub(crate) const MONITORING_INTERVAL: Duration = Duration::from_secs(10);
/// `--eviction-hard`'s default on Linux.
pub(crate) const DEFAULT_HARD: &str =
    "memory.available<100Mi,nodefs.available<10%,nodefs.inodesFree<5%,imagefs.available<15%";
/// `--eviction-pressure-transition-period`'s default.
pub(crate) const DEFAULT_TRANSITION_PERIOD: Duration = Duration::from_secs(300);
/// An eviction signal.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) enum Signal {
    MemoryAvailable,
    NodeFsAvailable,
    NodeFsInodesFree,
    ImageFsAvailable,
    ImageFsInodesFree,
    PidAvailable,
}

impl Signal {
    pub(crate) const ALL: [Signal; 6] = [
        Signal::MemoryAvailable,
        Signal::NodeFsAvailable,
        Signal::NodeFsInodesFree,
        Signal::ImageFsAvailable,
        Signal::ImageFsInodesFree,
        Signal::PidAvailable,
    ];

    pub(crate) fn name(self) -> &'static str {
        match self {
            Signal::MemoryAvailable => "memory.available",
            Signal::NodeFsAvailable => "nodefs.available",
            Signal::NodeFsInodesFree => "nodefs.inodesFree",
            Signal::ImageFsAvailable => "imagefs.available",
            Signal::ImageFsInodesFree => "imagefs.inodesFree",
            Signal::PidAvailable => "pid.available",
        }
    }

    fn parse(name: &str) -> Result<Signal, String> {
        Signal::ALL
            .into_iter()
            .find(|s| s.name() == name)
            .ok_or_else(|| format!("unsupported eviction signal {name}"))
    }

    /// The node condition the signal drives.
    pub(crate) fn condition(self) -> Condition {
        match self {
            Signal::MemoryAvailable => Condition::Memory,
            Signal::PidAvailable => Condition::Pid,
            _ => Condition::Disk,
        }
    }

    /// The resource reclaimed for the signal (upstream `signalToResource`),
    /// named in the eviction message.
    pub(crate) fn resource(self) -> &'static str {
        match self {
            Signal::MemoryAvailable => "memory",
            Signal::NodeFsAvailable | Signal::ImageFsAvailable => "ephemeral-storage",
            Signal::NodeFsInodesFree | Signal::ImageFsInodesFree => "inodes",
            Signal::PidAvailable => "pids",
        }
    }

    /// Whether reclaiming node-level resources (images, dead containers,
    /// rotated logs) can relieve it.
    pub(crate) fn disk(self) -> bool {
        self.condition() == Condition::Disk
    }
}

/// A threshold's value: a quantity in base units, or a fraction of the
/// signal's capacity.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Value {
    Quantity(i128),
    Fraction(f32),
}

impl Value {
    /// In base units, against `capacity` (as upstream: float64 of the
    /// float32 fraction, truncated).
    pub(crate) fn of(self, capacity: i128) -> i128 {
        match self {
            Value::Quantity(q) => q,
            Value::Fraction(f) => (capacity as f64 * f64::from(f)) as i128,
        }
    }
}

/// One threshold: the signal below `value` is pressure.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Threshold {
    pub(crate) signal: Signal,
    pub(crate) value: Value,
    /// Zero for a hard threshold.
    pub(crate) grace_period: Duration,
    pub(crate) min_reclaim: Option<Value>,
}

impl Threshold {
    pub(crate) fn is_hard(&self) -> bool {
        self.grace_period.is_zero()
    }
}

/// The eviction settings as the flags and the configuration file give
/// them, keyed by signal name.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Settings {
    pub(crate) hard: BTreeMap<String, String>,
    pub(crate) soft: BTreeMap<String, String>,
    pub(crate) soft_grace_period: BTreeMap<String, String>,
    pub(crate) minimum_reclaim: BTreeMap<String, String>,
    pub(crate) pressure_transition_period: Duration,
    /// Seconds; the longest grace period given to a pod evicted for a
    /// soft threshold.
    pub(crate) max_pod_grace_period: i64,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            hard: parse_map(DEFAULT_HARD, '<').unwrap_or_default(),
            soft: BTreeMap::new(),
            soft_grace_period: BTreeMap::new(),
            minimum_reclaim: BTreeMap::new(),
            pressure_transition_period: DEFAULT_TRANSITION_PERIOD,
            max_pod_grace_period: 0,
        }
    }
}

/// Parses a map flag as the kubelet's: `k<v,k2<v2` (`--eviction-hard`,
/// `--eviction-soft`) or `k=v,...` (the grace periods and minimum
/// reclaims); spaces around keys and values are dropped, a later key wins.
pub(crate) fn parse_map(text: &str, sep: char) -> Result<BTreeMap<String, String>, String> {
    let mut out = BTreeMap::new();
    for pair in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (k, v) = pair
            .split_once(sep)
            .ok_or_else(|| format!("malformed pair {pair:?}, expect string{sep}string"))?;
        out.insert(k.trim().to_string(), v.trim().to_string());
    }
    Ok(out)
}

/// A threshold value: `<n>%` (0% and 100% turn the threshold off: None),
/// or a positive quantity.
fn parse_value(signal: Signal, text: &str) -> Result<Option<Value>, String> {
    if let Some(p) = text.strip_suffix('%') {
        if text == "0%" || text == "100%" {
            return Ok(None);
        }
        let p: f64 = p
            .parse()
            .map_err(|_| format!("{}: invalid percentage {text:?}", signal.name()))?;
        if p < 0.0 {
            return Err(format!(
                "eviction percentage threshold {} must be >= 0%: {text}",
                signal.name()
            ));
        }
        if p > 100.0 {
            return Err(format!(
                "eviction percentage threshold {} must be <= 100%: {text}",
                signal.name()
            ));
        }
        return Ok(Some(Value::Fraction(p as f32 / 100.0)));
    }
    let q = parse_quantity(text).map_err(|e| format!("{}: {e}", signal.name()))?;
    if q.is_negative() || q.digits == 0 {
        return Err(format!(
            "eviction threshold {} must be positive: {text}",
            signal.name()
        ));
    }
    Ok(Some(Value::Quantity(q.value())))
}

/// The thresholds of `s` (upstream `ParseThresholdConfig`): hard ones,
/// then soft ones with their grace periods (each soft threshold needs
/// one), each with its minimum reclaim. Errors name the signal.
pub(crate) fn thresholds(s: &Settings) -> Result<Vec<Threshold>, String> {
    let mut graces = BTreeMap::new();
    for (name, v) in &s.soft_grace_period {
        let signal = Signal::parse(name)?;
        let d = crate::apitime::parse_duration(v)
            .map_err(|e| format!("grace period of {name}: {e}"))?;
        graces.insert(signal, d);
    }
    let mut reclaims = BTreeMap::new();
    for (name, v) in &s.minimum_reclaim {
        let signal = Signal::parse(name)?;
        if let Some(p) = v.strip_suffix('%') {
            let p: f64 = p
                .parse()
                .ok()
                .filter(|p| (0.0..=100.0).contains(p))
                .ok_or_else(|| format!("minimum reclaim of {name}: invalid percentage {v:?}"))?;
            reclaims.insert(signal, Value::Fraction(p as f32 / 100.0));
        } else {
            let q = parse_quantity(v).map_err(|e| format!("minimum reclaim of {name}: {e}"))?;
            if q.is_negative() {
                return Err(format!("minimum reclaim of {name} must be positive: {v}"));
            }
            reclaims.insert(signal, Value::Quantity(q.value()));
        }
    }
    let mut out = Vec::new();
    for (soft, map) in [(false, &s.hard), (true, &s.soft)] {
        for (name, v) in map {
            let signal = Signal::parse(name)?;
            let Some(value) = parse_value(signal, v)? else {
                continue;
            };
            let grace_period = if soft {
                *graces.get(&signal).ok_or_else(|| {
                    format!("grace period must be specified for the soft eviction threshold {name}")
                })?
            } else {
                Duration::ZERO
            };
            out.push(Threshold {
                signal,
                value,
                grace_period,
                min_reclaim: reclaims.get(&signal).copied(),
            });
        }
    }
    Ok(out)
}

/// The hard threshold's text of `signal` (for allocatable), "0" when
/// there is none.
pub(crate) fn hard_value(s: &Settings, signal: Signal) -> &str {
    s.hard
        .get(signal.name())
        .filter(|v| *v != "0%" && *v != "100%")
        .map_or("0", String::as_str)
}

/// What a signal measures: available and capacity, in base units.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Observation {
    pub(crate) available: i128,
    pub(crate) capacity: i128,
}

pub(crate) type Observations = BTreeMap<Signal, Observation>;

/// The thresholds `observations` meet (a signal without an observation
/// meets none); with `enforce_min_reclaim`, available must also be back
/// above threshold plus minimum reclaim.
pub(crate) fn thresholds_met(
    thresholds: &[Threshold],
    observations: &Observations,
    enforce_min_reclaim: bool,
) -> Vec<Threshold> {
    thresholds
        .iter()
        .filter(|t| {
            let Some(o) = observations.get(&t.signal) else {
                return false;
            };
            let mut want = t.value.of(o.capacity);
            if enforce_min_reclaim {
                want += t.min_reclaim.map_or(0, |m| m.of(o.capacity));
            }
            o.available < want
        })
        .copied()
        .collect()
}

/// What the manager remembers between observations (upstream's
/// `thresholdsFirstObservedAt`, `nodeConditionsLastObservedAt` and
/// `thresholdsMet`), stepped with a given time so tests need no clock.
#[derive(Debug, Default)]
pub(crate) struct Tracker {
    first_observed: Vec<(Threshold, Instant)>,
    conditions_last_observed: BTreeMap<Condition, Instant>,
    met: Vec<Threshold>,
}

/// One step's outcome: the pressure conditions to report and the
/// thresholds whose grace periods are over (they drive evictions).
#[derive(Debug, Default, Clone, PartialEq)]
pub(crate) struct Step {
    pub(crate) conditions: Vec<Condition>,
    pub(crate) thresholds: Vec<Threshold>,
}

impl Tracker {
    pub(crate) fn step(
        &mut self,
        thresholds: &[Threshold],
        observations: &Observations,
        transition_period: Duration,
        now: Instant,
    ) -> Step {
        let mut met = thresholds_met(thresholds, observations, false);
        // Those met before stay until their minimum reclaim is done.
        for t in thresholds_met(&self.met, observations, true) {
            if !met.contains(&t) {
                met.push(t);
            }
        }
        let first_observed: Vec<(Threshold, Instant)> = met
            .iter()
            .map(|t| {
                let at = self
                    .first_observed
                    .iter()
                    .find(|(o, _)| o == t)
                    .map_or(now, |(_, at)| *at);
                (*t, at)
            })
            .collect();
        for t in &met {
            self.conditions_last_observed
                .insert(t.signal.condition(), now);
        }
        self.conditions_last_observed
            .retain(|_, at| now.saturating_duration_since(*at) < transition_period);
        let conditions: Vec<Condition> = self.conditions_last_observed.keys().copied().collect();
        let due: Vec<Threshold> = first_observed
            .iter()
            .filter(|(t, at)| now.saturating_duration_since(*at) >= t.grace_period)
            .map(|(t, _)| *t)
            .collect();
        self.first_observed = first_observed;
        self.met = due.clone();
        Step {
            conditions,
            thresholds: due,
        }
    }
}

/// The eviction admission check (upstream's eviction `Admit`): under
/// memory pressure only BestEffort pods are refused (unless they tolerate
/// the memory-pressure taint), under any other pressure every pod; critical
/// pods always pass. Err is the message, "The node had condition: [..]. ".
pub(crate) fn admit(pod: &Pod, conditions: &[Condition]) -> Result<(), String> {
    if conditions.is_empty() || is_critical(pod) {
        return Ok(());
    }
    if conditions == [Condition::Memory] {
        let best_effort = crate::pod::qos_class(pod) == "BestEffort";
        let tolerates = pod
            .spec
            .as_ref()
            .and_then(|s| s.tolerations.as_ref())
            .is_some_and(|ts| {
                ts.iter().any(|t| {
                    let key_ok = match t.key.as_deref() {
                        None | Some("") => t.operator.as_deref() == Some("Exists"),
                        Some(k) => k == "node.kubernetes.io/memory-pressure",
                    };
                    let effect_ok =
                        matches!(t.effect.as_deref(), None | Some("") | Some("NoSchedule"));
                    let value_ok = t.operator.as_deref() == Some("Exists")
                        || t.value.as_deref().unwrap_or("").is_empty();
                    key_ok && effect_ok && value_ok
                })
            });
        if !best_effort || tolerates {
            return Ok(());
        }
    }
    let names: Vec<&str> = conditions.iter().map(|c| c.type_name()).collect();
    Err(format!("The node had condition: [{}]. ", names.join(" ")))
}

/// One container's resource by name from its limits or requests, in base
/// units; None when unset or not a quantity.
fn container_resource(
    r: Option<&BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>>,
    name: &str,
) -> Option<i128> {
    let q = r?.get(name)?;
    parse_quantity(&q.0).ok().map(|q| q.value())
}

/// The usage an incompletely measured pod ranks with under disk
/// pressure: more than any request and any measured usage.
const UNMEASURED: i128 = i64::MAX as i128;

/// The sentence eviction messages add when a usage was measured only in
/// part.
const UNMEASURED_TEXT: &str = "Its usage could not be measured in full and counts as over. ";

fn priority(pod: &Pod) -> i32 {
    pod.spec.as_ref().and_then(|s| s.priority).unwrap_or(0)
}

/// Orders `pods` for eviction under `signal` (upstream's rankers): for
/// memory, pods whose usage exceeds their requests first, then lower
/// priority, then more usage above requests; for disk the same with
/// writable layers, logs and local volumes (inodes for the inode
/// signals, whose requests are 0); for pids, lower priority first.
/// `usage` gives a pod's statistics (a pod without any uses nothing); a
/// pod whose disk usage was measured only in part ranks, for the disk
/// signals, as using [`UNMEASURED`]: over its requests and above every
/// pod of its priority, so that lower-priority pods over their requests
/// still go first, as they would against any usage.
pub(crate) fn rank<'a>(
    pods: &mut [&'a Pod],
    signal: Signal,
    usage: &dyn Fn(&Pod) -> Option<&'a PodUsage>,
) {
    let measure = |p: &Pod| -> (i128, i128) {
        let requests = crate::admission::pod_requests(p);
        let u = usage(p);
        match signal {
            Signal::MemoryAvailable => (
                u.map_or(0, |u| i128::from(u.memory())),
                i128::from(requests.memory),
            ),
            Signal::NodeFsInodesFree | Signal::ImageFsInodesFree
                if u.is_some_and(PodUsage::disk_incomplete) =>
            {
                (UNMEASURED, 0)
            }
            Signal::NodeFsInodesFree | Signal::ImageFsInodesFree => {
                (u.map_or(0, |u| i128::from(u.disk(true))), 0)
            }
            _ if u.is_some_and(PodUsage::disk_incomplete) => {
                (UNMEASURED, i128::from(requests.ephemeral_storage))
            }
            _ => (
                u.map_or(0, |u| i128::from(u.disk(false))),
                i128::from(requests.ephemeral_storage),
            ),
        }
    };
    let mut keyed: Vec<(bool, i32, i128, &'a Pod)> = pods
        .iter()
        .map(|p| {
            let (used, requested) = measure(p);
            if signal == Signal::PidAvailable {
                return (false, priority(p), 0, *p);
            }
            // Exceeding first (false sorts first), lower priority first,
            // more above requests first.
            (used <= requested, priority(p), -(used - requested), *p)
        })
        .collect();
    keyed.sort_by_key(|k| (k.0, k.1, k.2));
    for (slot, k) in pods.iter_mut().zip(keyed) {
        *slot = k.3;
    }
}

/// The message of a pod evicted for `signal` (upstream
/// `evictionMessage`): the resource, and each container whose usage
/// exceeds its request.
pub(crate) fn eviction_message(signal: Signal, pod: &Pod, usage: Option<&PodUsage>) -> String {
    let resource = signal.resource();
    let mut m = format!("The node was low on resource: {resource}. ");
    let (Some(u), Some(spec)) = (usage, pod.spec.as_ref()) else {
        return m;
    };
    for cs in &u.containers {
        let Some(c) = spec.containers.iter().find(|c| c.name == cs.name) else {
            continue;
        };
        let used = match signal {
            Signal::MemoryAvailable => cs.memory_working_set,
            Signal::NodeFsAvailable | Signal::ImageFsAvailable => {
                cs.rootfs_bytes.zip(cs.logs_bytes).map(|(a, b)| a + b)
            }
            _ => None,
        };
        let Some(used) = used else { continue };
        let requests = c.resources.as_ref().and_then(|r| r.requests.as_ref());
        let request_text = requests
            .and_then(|r| r.get(resource))
            .map_or_else(|| "0".to_string(), |q| canonical(&q.0));
        let requested = container_resource(requests, resource).unwrap_or(0);
        if i128::from(used) > requested {
            m.push_str(&format!(
                "Container {} was using {}, which exceeds its request of {request_text}. ",
                c.name,
                format_binary_si(i128::from(used) * 1000)
            ));
        }
    }
    if signal.disk() && u.disk_incomplete() {
        m.push_str(UNMEASURED_TEXT);
    }
    m
}

/// A quantity's text as apimachinery prints it back: binary suffixes stay
/// binary, others decimal.
pub(crate) fn canonical(text: &str) -> String {
    let Ok(q) = parse_quantity(text) else {
        return text.to_string();
    };
    if text.ends_with('i') {
        format_binary_si(q.milli_value())
    } else {
        format_decimal_si(q.milli_value())
    }
}

/// Whether the pod sets a local storage limit at all: a disk-backed
/// emptyDir with a `sizeLimit`, or a container's ephemeral-storage limit.
/// Only such pods need measuring when the node is not under pressure.
pub(crate) fn has_local_storage_limits(pod: &Pod) -> bool {
    let Some(spec) = pod.spec.as_ref() else {
        return false;
    };
    let empty_dir = spec.volumes.iter().flatten().any(|v| {
        v.empty_dir
            .as_ref()
            .is_some_and(|e| e.size_limit.is_some() && e.medium.as_deref() != Some("Memory"))
    });
    empty_dir
        || spec.containers.iter().any(|c| {
            c.resources
                .as_ref()
                .and_then(|r| r.limits.as_ref())
                .is_some_and(|l| l.contains_key("ephemeral-storage"))
        })
}

/// Whether the pod is over a local storage limit (upstream
/// `localStorageEviction`): the signal it counts under in
/// `kubelet_evictions`, and the message: a disk-backed emptyDir over
/// its `sizeLimit`, else the pod's usage over the sum of its containers'
/// ephemeral-storage limits, else a container's writable layer and logs
/// over its own limit.
pub(crate) fn local_storage_violation(
    pod: &Pod,
    usage: &PodUsage,
) -> Option<(&'static str, String)> {
    let spec = pod.spec.as_ref()?;
    for v in spec.volumes.iter().flatten() {
        let Some(ed) = v.empty_dir.as_ref() else {
            continue;
        };
        if ed.medium.as_deref() == Some("Memory") {
            continue;
        }
        let Some(limit) = ed.size_limit.as_ref() else {
            continue;
        };
        let Ok(size) = parse_quantity(&limit.0) else {
            continue;
        };
        let used = usage.volumes.iter().find(|u| u.name == v.name);
        if let Some(u) = used {
            if size.value() > 0 && (u.incomplete || i128::from(u.bytes) > size.value()) {
                return Some((
                    "emptydirfs.limit",
                    format!(
                        "Usage of EmptyDir volume {:?} exceeds the limit {:?}. {}",
                        v.name,
                        canonical(&limit.0),
                        if u.incomplete { UNMEASURED_TEXT } else { "" }
                    ),
                ));
            }
        }
    }
    let limit_of = |c: &k8s_openapi::api::core::v1::Container| {
        container_resource(
            c.resources.as_ref().and_then(|r| r.limits.as_ref()),
            "ephemeral-storage",
        )
    };
    let limits: Vec<i128> = spec.containers.iter().filter_map(limit_of).collect();
    if !limits.is_empty() {
        let total: i128 = limits.iter().sum();
        let unmeasured = usage.disk_incomplete();
        if total > 0 && (unmeasured || i128::from(usage.disk(false)) > total) {
            return Some((
                "ephemeralpodfs.limit",
                format!(
                    "Pod ephemeral local storage usage exceeds the total limit of containers {}. {}",
                    format_binary_si(total * 1000),
                    if unmeasured { UNMEASURED_TEXT } else { "" }
                ),
            ));
        }
    }
    for cs in &usage.containers {
        let Some(c) = spec.containers.iter().find(|c| c.name == cs.name) else {
            continue;
        };
        let Some(limit) = limit_of(c) else { continue };
        let used = i128::from(cs.rootfs_bytes.unwrap_or(0) + cs.logs_bytes.unwrap_or(0));
        if limit > 0 && (cs.logs_incomplete || used > limit) {
            let text = c
                .resources
                .as_ref()
                .and_then(|r| r.limits.as_ref())
                .and_then(|l| l.get("ephemeral-storage"))
                .map_or_else(String::new, |q| canonical(&q.0));
            return Some((
                "ephemeralcontainerfs.limit",
                format!(
                    "Container {} exceeded its local ephemeral storage limit {text:?}. {}",
                    c.name,
                    if cs.logs_incomplete {
                        UNMEASURED_TEXT
                    } else {
                        ""
                    }
                ),
            ));
        }
    }
    None
}

impl fmt::Display for Signal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests;
