//! Pod configuration: where the pods this node should run come from, and how
//! the views of the different sources are merged into one ordered stream of
//! changes for the sync loop (upstream `pkg/kubelet/config`).
//!
//! The module owns the pod sources (the static manifest path in `file`, the
//! manifest URL in `http`, the pods bound to this node in the API server in
//! `api`, pod checkpoints in `checkpoint`), the static-pod defaults and their validation,
//! manifest decoding, and [`PodConfig`]: one `pod-config` thread that owns the
//! merged state and selects over every source's channel, feeding
//! [`storage::PodStorage::merge`], which turns each source's update
//! into the minimal ADD/UPDATE/DELETE/REMOVE/RECONCILE/RESTORE (or SET)
//! notifications on a bounded channel, in order.

pub(crate) mod api;
pub mod checkpoint;
pub(crate) mod decode;
pub(crate) mod defaults;
pub mod file;
pub mod http;
#[cfg(test)]
mod merge_props;
mod pod_config;
pub mod storage;
pub(crate) mod validation;

use std::sync::Arc;

use crate::events::{EventType, ObjectRef};

pub use k8s_openapi::api::core::v1::Pod;

pub(crate) use api::ApiSource;
pub use checkpoint::{load_checkpoints, write_checkpoint, Checkpoints};
pub use decode::{decode_pod, decode_pod_or_list, DecodeError};
pub use defaults::{apply_static_defaults, generate_pod_name, static_pod_uid};
pub use file::{parse_manifest, FileSource, DEFAULT_FILE_CHECK_FREQUENCY, MAX_MANIFEST_SIZE};
pub use http::{parse_manifests, HttpSource, DEFAULT_HTTP_CHECK_FREQUENCY, HTTP_REQUEST_TIMEOUT};
pub(crate) use pod_config::PodConfig;

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
/// because its full name is taken), for the event recorder; the merge also
/// logs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PodEvent {
    /// The pod the event is about.
    pub(crate) object: ObjectRef,
    /// The source the pod came from.
    pub(crate) source: String,
    pub(crate) event_type: EventType,
    pub(crate) reason: &'static str,
    pub(crate) message: String,
}

/// One message on a source channel or on the merged updates channel.
///
/// Pods travel as shared `Arc`s from the source (the API reflector's own
/// copies) through the merge to the sync loop and the pod workers; the
/// merge copies a pod only to set the node's annotations on it.
#[derive(Debug, Clone, PartialEq)]
pub struct PodUpdate {
    pub pods: Vec<Arc<Pod>>,
    pub op: PodOperation,
    pub source: String,
}

impl PodUpdate {
    pub(crate) fn new(op: PodOperation, source: &str, pods: Vec<Arc<Pod>>) -> PodUpdate {
        PodUpdate {
            pods,
            op,
            source: source.to_string(),
        }
    }
}
