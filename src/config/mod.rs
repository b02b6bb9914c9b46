//! Pod configuration: where the pods this node should run come from, and how
//! the views of the different sources are merged into one ordered stream of
//! changes for the sync loop (upstream `pkg/kubelet/config`).
//!
//! The module owns the pod sources (the static manifest path in `file`, the
//! manifest URL in `http`, the pods bound to this node in the API server in
//! `api`, pod checkpoints in `checkpoint`), the static-pod defaults and their validation,
//! manifest decoding, and [`PodConfig`]: one Mux listener thread per source
//! feeding [`storage::PodStorage::merge`], which turns each source's update
//! into the minimal ADD/UPDATE/DELETE/REMOVE/RECONCILE/RESTORE (or SET)
//! notifications on a bounded channel, in order.

pub mod api;
pub mod checkpoint;
pub mod decode;
pub mod defaults;
pub mod file;
pub mod http;
#[cfg(test)]
mod merge_props;
mod pod_config;
pub mod storage;
pub mod validation;

pub use k8s_openapi::api::core::v1::Pod;

pub use api::ApiSource;
pub use checkpoint::{load_checkpoints, write_checkpoint, Checkpoints};
pub use decode::{decode_pod, decode_pod_or_list, DecodeError};
pub use defaults::{apply_static_defaults, generate_pod_name, static_pod_uid};
pub use file::{parse_manifest, FileSource, DEFAULT_FILE_CHECK_FREQUENCY, MAX_MANIFEST_SIZE};
pub use http::{parse_manifests, HttpSource, DEFAULT_HTTP_CHECK_FREQUENCY, HTTP_REQUEST_TIMEOUT};
pub use pod_config::{
    PodConfig, EVENTS_CHANNEL_CAPACITY, SOURCE_CHANNEL_CAPACITY, UPDATES_CHANNEL_CAPACITY,
};
pub use validation::{FieldError, InvalidPod};

/// Pods read from the static manifest path.
pub const FILE_SOURCE: &str = "file";
/// Pods polled from a manifest URL.
pub const HTTP_SOURCE: &str = "http";
/// Pods bound to this node in the API server.
pub const API_SOURCE: &str = "api";
/// Pseudo-source of a full re-send of the merged state ([`PodConfig::sync`]).
pub const ALL_SOURCE: &str = "*";

/// Which source a pod came from (`file`, `http`, `api`); set at merge time.
pub const CONFIG_SOURCE_ANNOTATION_KEY: &str = "kubernetes.io/config.source";
/// Set on the mirror pod that the API server holds for a static pod.
pub const CONFIG_MIRROR_ANNOTATION_KEY: &str = "kubernetes.io/config.mirror";
/// When the merge first saw the pod (RFC 3339 with nanoseconds).
pub const CONFIG_FIRST_SEEN_ANNOTATION_KEY: &str = "kubernetes.io/config.seen";
/// The static pod's generated UID (a hash of its source and content).
pub const CONFIG_HASH_ANNOTATION_KEY: &str = "kubernetes.io/config.hash";

/// What a [`PodUpdate`] means. Sources send SET, ADD, UPDATE, DELETE, REMOVE
/// and RESTORE; the merged stream carries ADD, UPDATE, DELETE, REMOVE,
/// RECONCILE, RESTORE, and SET in the snapshot notification modes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PodOperation {
    /// The complete set of pods of a source (or, merged, of all sources).
    Set,
    /// Pods new to the source.
    Add,
    /// Pods gracefully deleted (they gained a deletion timestamp).
    Delete,
    /// Pods gone from the source.
    Remove,
    /// Pods whose spec, labels, annotations or deletion fields changed.
    Update,
    /// Pods whose status alone changed; the node reconciles its own status.
    Reconcile,
    /// Pods restored from a checkpoint; they are not authoritative and do not
    /// mark their source as seen.
    Restore,
}

/// An event the config layer raises about a pod (so far: a pod ignored
/// because its full name is taken), for whoever reports events; the merge
/// also logs it. Mirrors the fields of a Kubernetes `Event`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodEvent {
    /// `namespace/name` of the pod the event is about.
    pub pod_full_name: String,
    pub pod_uid: String,
    /// The source the pod came from.
    pub source: String,
    /// `Warning` or `Normal`.
    pub event_type: &'static str,
    pub reason: &'static str,
    pub message: String,
}

/// One message on a source channel or on the merged updates channel.
#[derive(Debug, Clone, PartialEq)]
pub struct PodUpdate {
    pub pods: Vec<Pod>,
    pub op: PodOperation,
    pub source: String,
}

impl PodUpdate {
    pub fn new(op: PodOperation, source: &str, pods: Vec<Pod>) -> PodUpdate {
        PodUpdate {
            pods,
            op,
            source: source.to_string(),
        }
    }
}

/// How [`PodConfig`] reports changes (upstream `PodConfigNotificationMode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotificationMode {
    /// Every change is delivered as a SET of the full merged state.
    Snapshot,
    /// Additions and removals give a SET of the full merged state; changes to
    /// existing pods give UPDATE and DELETE.
    SnapshotAndUpdates,
    /// ADD, UPDATE, DELETE, REMOVE, RECONCILE and RESTORE (the node agent's mode).
    Incremental,
}

/// `namespace/name`, the key under which a pod must be unique in a source.
pub fn pod_full_name(pod: &Pod) -> String {
    format!(
        "{}/{}",
        pod.metadata.namespace.as_deref().unwrap_or(""),
        pod.metadata.name.as_deref().unwrap_or("")
    )
}

/// The pod's UID, or "" when it has none.
pub fn pod_uid(pod: &Pod) -> &str {
    pod.metadata.uid.as_deref().unwrap_or("")
}
