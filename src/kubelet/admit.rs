//! What the sync loop decides about a pod before any worker sees it:
//! validation of the names that become paths, admission (with the static
//! pods' name conflicts), and the refusals and evictions that turn a pod
//! Failed and stop it (upstream's `HandlePodAdditions` and `canAdmitPod`,
//! and the eviction manager's kill).

use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use log::{debug, warn};

use super::{source_of, Kubelet, FAILED_VALIDATION};
use crate::admission::{admit, admit_update, static_name_conflict, Rejection};
use crate::config::validation::{addressable, validate_api_pod};
use crate::events::{EventType, ObjectRef};
use crate::pod::{is_static_pod, pod_full_name, pod_uid};
use crate::pod_workers::UpdateType;

impl Kubelet {
    /// Validation of the names that become paths and runtime labels
    /// (`validate_api_pod`), for every pod before anything is made for it:
    /// local pods passed it at their source already, API and restored pods
    /// meet it here. An invalid pod never runs; like an admission refusal
    /// it is reported Failed (reason FailedValidation, the fields named)
    /// with a warning event, unless its name or namespace cannot address
    /// it in the API, in which case the log line is all there is.
    pub(super) fn validate(&mut self, pod: &Arc<Pod>) -> bool {
        let Err(e) = validate_api_pod(pod) else {
            return true;
        };
        let uid = pod_uid(pod);
        if !addressable(pod) {
            warn!(
                "pod {:?}/{:?} (uid {uid:?}): refused, and not reported as its name cannot address it: {e}",
                pod.metadata.namespace.as_deref().unwrap_or(""),
                pod.metadata.name.as_deref().unwrap_or("")
            );
            self.rejected.insert(uid.to_string(), pod.clone());
            return false;
        }
        warn!("pod {}: refused: {e}", pod_full_name(pod));
        let message = format!("Error validating pod: {e}");
        self.recorder.event(
            &ObjectRef::pod(pod),
            EventType::Warning,
            FAILED_VALIDATION,
            message.clone(),
        );
        let mut status = pod.status.clone().unwrap_or_default();
        status.phase = Some(crate::pod::FAILED.into());
        status.reason = Some(FAILED_VALIDATION.into());
        status.message = Some(message);
        self.reporter.set_status(pod, status);
        if pod.metadata.deletion_timestamp.is_some() {
            // Never ran: its API object can go at once.
            self.reporter.pod_finished(pod, true);
        } else {
            self.rejected.insert(uid.to_string(), pod.clone());
        }
        false
    }

    /// Admission (upstream `canAdmitPod`): a refused pod is reported as
    /// Failed with the reason, gets a warning event, and never runs.
    pub(super) fn admit(&mut self, pod: &Arc<Pod>) -> bool {
        let Some(node) = self.node.as_ref() else {
            self.record_admission(pod, true);
            return true;
        };
        let uid = pod_uid(pod);
        if let Some(state) = &self.pressure {
            if let Err(message) = crate::eviction::admit(pod, &state.conditions()) {
                warn!(
                    "pod {}: rejected by admission: {}: {message}",
                    pod_full_name(pod),
                    crate::eviction::REASON
                );
                let r = Rejection {
                    reason: crate::eviction::REASON.into(),
                    message,
                };
                self.reject(pod, r);
                return false;
            }
        }
        // Finished pods (a Job's, one past its active deadline) hold no
        // resources any more (upstream's filterOutTerminatedPods).
        let active: Vec<&Pod> = self
            .pods
            .values()
            .filter(|p| pod_uid(p) != uid && p.metadata.deletion_timestamp.is_none())
            .filter(|p| !self.reporter.is_terminal(pod_uid(p)))
            .map(|p| p.as_ref())
            .collect();
        let Err(r) = admit(pod, &active, &node()) else {
            self.record_admission(pod, true);
            return true;
        };
        warn!(
            "pod {}: rejected by admission: {}: {}",
            pod_full_name(pod),
            r.reason,
            r.message
        );
        self.reject(pod, r);
        false
    }

    /// Admission of a changed spec: a pod edited in place (a manifest pod
    /// with its own UID) must still pass the checks that guard the node
    /// (`--allow-privileged`, sysctls). A refused edit is rejected as a new
    /// pod would be, and what runs of the pod stops, as an edit replaces
    /// it. Upstream admits only new pods: there a changed static pod gets a
    /// new UID, and the API forbids such edits of API pods.
    pub(super) fn admit_update(&mut self, pod: &Arc<Pod>) -> bool {
        let Some(node) = self.node.as_ref() else {
            return true;
        };
        let Err(r) = admit_update(pod, &node()) else {
            return true;
        };
        warn!(
            "pod {}: update rejected by admission: {}: {}; stopping the pod",
            pod_full_name(pod),
            r.reason,
            r.message
        );
        self.reject(pod, r);
        // What runs is stopped as its own spec says (grace period, preStop).
        let running = self
            .pods
            .remove(pod_uid(pod))
            .unwrap_or_else(|| pod.clone());
        self.dispatch(running, UpdateType::Kill, None);
        false
    }

    /// A static pod and API pods with its full name: the node's static pod
    /// wins. An API pod named as a static pod is refused (false); a static
    /// pod refuses and stops the API pods that have its name, then starts
    /// once they are gone (its worker waits for the name). Upstream has no
    /// such rule (the pod manager keeps the last pod of a name), so a pod
    /// bound to the node could hold a static pod off it.
    pub(super) fn settle_name_conflicts(&mut self, pod: &Arc<Pod>) -> bool {
        let full_name = pod_full_name(pod);
        let uid = pod_uid(pod);
        if !is_static_pod(pod) {
            let owner = self
                .pods
                .values()
                .find(|p| is_static_pod(p) && pod_uid(p) != uid && pod_full_name(p) == full_name);
            let Some(owner) = owner else {
                return true;
            };
            let r = static_name_conflict(&full_name, source_of(owner));
            warn!(
                "pod {full_name} ({uid}) from {}: rejected: {}: {}",
                source_of(pod),
                r.reason,
                r.message
            );
            self.reject(pod, r);
            return false;
        }
        let squatters: Vec<Arc<Pod>> = self
            .pods
            .values()
            .filter(|p| !is_static_pod(p) && pod_uid(p) != uid && pod_full_name(p) == full_name)
            .cloned()
            .collect();
        for p in squatters {
            let r = static_name_conflict(&full_name, source_of(pod));
            warn!(
                "pod {full_name} ({}) from {}: rejected: {}: {}; stopping it",
                pod_uid(&p),
                source_of(&p),
                r.reason,
                r.message
            );
            self.reject(&p, r);
            self.pods.remove(pod_uid(&p));
            self.dispatch(p, UpdateType::Kill, None);
        }
        true
    }

    pub(super) fn record_admission(&self, pod: &Pod, admitted: bool) {
        if let Some(a) = &self.admissions {
            a.record(pod_uid(pod), admitted);
        }
    }

    /// Reports `pod` as refused: a warning event, status Failed with the
    /// reason, and never run again.
    pub(super) fn reject(&mut self, pod: &Arc<Pod>, r: Rejection) {
        self.record_admission(pod, false);
        let uid = pod_uid(pod);
        self.recorder.event(
            &ObjectRef::pod(pod),
            EventType::Warning,
            &r.reason,
            r.message.clone(),
        );
        let mut status = pod.status.clone().unwrap_or_default();
        status.phase = Some(crate::pod::FAILED.into());
        status.reason = Some(r.reason);
        status.message = Some(format!("Pod was rejected: {}", r.message));
        self.reporter.set_status(pod, status);
        self.rejected.insert(uid.to_string(), pod.clone());
    }

    /// Evicts a pod for the eviction manager (upstream `killPodNow` with
    /// the eviction's status): a warning event, status Failed with reason
    /// Evicted and the manager's message, and its worker stops it with the
    /// given grace period; it never runs again.
    pub(super) fn evict(&mut self, e: crate::eviction::manager::Eviction) {
        let uid = pod_uid(&e.pod);
        let Some(pod) = self.pods.remove(uid) else {
            debug!("pod {}: gone before its eviction", pod_full_name(&e.pod));
            return;
        };
        self.record_admission(&pod, false);
        self.recorder.event(
            &ObjectRef::pod(&pod),
            EventType::Warning,
            crate::eviction::REASON,
            e.message.clone(),
        );
        let mut status = self
            .reporter
            .status(uid)
            .or_else(|| pod.status.clone())
            .unwrap_or_default();
        status.phase = Some(crate::pod::FAILED.into());
        status.reason = Some(crate::eviction::REASON.into());
        status.message = Some(e.message);
        self.reporter.set_status(&pod, status);
        self.rejected.insert(uid.to_string(), pod.clone());
        self.dispatch(pod, UpdateType::Kill, Some(e.grace_period));
    }
}
