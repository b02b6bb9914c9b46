//! What the runtime reports of pods (upstream `kubecontainer.Pod` and
//! `PodStatus`): the types read back from the CRI runtime, and the two
//! reads that fill them, `get_pods` (a relist: every sandbox and container
//! carrying tinylet's labels, grouped by pod) and `get_pod_status` (one
//! pod's sandboxes and containers inspected in detail, newest first).

use k8s_openapi::api::core::v1::LifecycleHandler;
use protobuf::EnumOrUnknown;

use super::{labels, termination, RuntimeManager};
use crate::cri::{api, CriError};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum ContainerState {
    Created,
    Running,
    Exited,
    #[default]
    Unknown,
}

impl ContainerState {
    fn from_cri(s: EnumOrUnknown<api::ContainerState>) -> Self {
        match s.enum_value() {
            Ok(api::ContainerState::CONTAINER_CREATED) => ContainerState::Created,
            Ok(api::ContainerState::CONTAINER_RUNNING) => ContainerState::Running,
            Ok(api::ContainerState::CONTAINER_EXITED) => ContainerState::Exited,
            _ => ContainerState::Unknown,
        }
    }
}

/// One container as the runtime reports it (upstream `kubecontainer.Status`).
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct ContainerStatus {
    pub(crate) id: String,
    pub(crate) name: String,
    pub(crate) state: ContainerState,
    pub(crate) created_at: i64,
    pub(crate) started_at: i64,
    pub(crate) finished_at: i64,
    pub(crate) exit_code: i32,
    pub(crate) image: String,
    pub(crate) image_ref: String,
    pub(crate) hash: u64,
    pub(crate) restart_count: u32,
    pub(crate) reason: String,
    pub(crate) message: String,
    /// The pod's grace period and the container's preStop hook as recorded
    /// on the container, for stopping it when its pod spec is gone.
    pub(crate) grace_period: Option<i64>,
    pub(crate) pre_stop: Option<LifecycleHandler>,
}

/// Everything the runtime knows of one pod, newest first.
#[derive(Debug, Clone, Default)]
pub struct PodStatus {
    pub uid: String,
    pub(crate) name: String,
    pub(crate) namespace: String,
    pub(crate) ips: Vec<String>,
    pub(crate) sandbox_statuses: Vec<api::PodSandboxStatus>,
    pub(crate) container_statuses: Vec<ContainerStatus>,
}

impl PodStatus {
    /// The newest status of the container named `name`.
    pub(crate) fn latest(&self, name: &str) -> Option<&ContainerStatus> {
        self.container_statuses.iter().find(|c| c.name == name)
    }
}

/// A sandbox or container in a relist: just enough to diff states.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RuntimeContainer {
    pub(crate) id: String,
    pub(crate) name: String,
    pub(crate) state: ContainerState,
}

/// A pod as found by listing the runtime (upstream `kubecontainer.Pod`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct RuntimePod {
    pub(crate) uid: String,
    pub(crate) name: String,
    pub(crate) namespace: String,
    pub(crate) sandboxes: Vec<RuntimeContainer>,
    pub(crate) containers: Vec<RuntimeContainer>,
}

impl RuntimeManager {
    /// Lists every pod the runtime holds that carries tinylet's labels.
    pub(crate) fn get_pods(&self) -> Result<Vec<RuntimePod>, CriError> {
        let sandboxes = self.runtime.list_pod_sandbox(None)?;
        let containers = self.runtime.list_containers(None)?;
        let mut pods: Vec<RuntimePod> = Vec::new();
        fn entry<'a>(
            pods: &'a mut Vec<RuntimePod>,
            labels: &std::collections::HashMap<String, String>,
        ) -> Option<&'a mut RuntimePod> {
            let uid = labels.get(labels::POD_UID)?;
            let i = match pods.iter().position(|p| &p.uid == uid) {
                Some(i) => i,
                None => {
                    pods.push(RuntimePod {
                        uid: uid.clone(),
                        name: labels.get(labels::POD_NAME).cloned().unwrap_or_default(),
                        namespace: labels
                            .get(labels::POD_NAMESPACE)
                            .cloned()
                            .unwrap_or_default(),
                        ..Default::default()
                    });
                    pods.len() - 1
                }
            };
            pods.get_mut(i)
        }
        for s in sandboxes {
            if let Some(p) = entry(&mut pods, &s.labels) {
                p.sandboxes.push(RuntimeContainer {
                    id: s.id.clone(),
                    name: String::new(),
                    state: if s.state.enum_value() == Ok(api::PodSandboxState::SANDBOX_READY) {
                        ContainerState::Running
                    } else {
                        ContainerState::Exited
                    },
                });
            }
        }
        for c in containers {
            if let Some(p) = entry(&mut pods, &c.labels) {
                p.containers.push(RuntimeContainer {
                    id: c.id.clone(),
                    name: c
                        .labels
                        .get(labels::CONTAINER_NAME)
                        .cloned()
                        .unwrap_or_default(),
                    state: ContainerState::from_cri(c.state),
                });
            }
        }
        Ok(pods)
    }

    /// Inspects one pod's sandboxes and containers in detail.
    pub(crate) fn get_pod_status(
        &self,
        uid: &str,
        name: &str,
        namespace: &str,
    ) -> Result<PodStatus, CriError> {
        let mut sf = api::PodSandboxFilter::new();
        sf.label_selector.insert(labels::POD_UID.into(), uid.into());
        let mut sandboxes = self.runtime.list_pod_sandbox(Some(sf))?;
        sandboxes.sort_by_key(|s| std::cmp::Reverse(s.created_at));
        let mut status = PodStatus {
            uid: uid.into(),
            name: name.into(),
            namespace: namespace.into(),
            ..Default::default()
        };
        for (i, s) in sandboxes.iter().enumerate() {
            match self.runtime.pod_sandbox_status(&s.id) {
                Ok(st) => {
                    if i == 0 && st.state.enum_value() == Ok(api::PodSandboxState::SANDBOX_READY) {
                        if let Some(n) = st.network.as_ref() {
                            if !n.ip.is_empty() {
                                status.ips.push(n.ip.clone());
                            }
                            status
                                .ips
                                .extend(n.additional_ips.iter().map(|ip| ip.ip.clone()));
                        }
                    }
                    status.sandbox_statuses.push(st);
                }
                // Removed between the list and the inspect: it is gone.
                Err(e) if e.is_not_found() => {}
                Err(e) => return Err(e),
            }
        }
        let mut cf = api::ContainerFilter::new();
        cf.label_selector.insert(labels::POD_UID.into(), uid.into());
        for c in self.runtime.list_containers(Some(cf))? {
            match self.runtime.container_status(&c.id) {
                Ok(st) => status.container_statuses.push(ContainerStatus {
                    id: st.id.clone(),
                    name: st
                        .labels
                        .get(labels::CONTAINER_NAME)
                        .cloned()
                        .or_else(|| st.metadata.as_ref().map(|m| m.name.clone()))
                        .unwrap_or_default(),
                    state: ContainerState::from_cri(st.state),
                    created_at: st.created_at,
                    started_at: st.started_at,
                    finished_at: st.finished_at,
                    exit_code: st.exit_code,
                    image: st
                        .image
                        .as_ref()
                        .map(|i| i.image.clone())
                        .unwrap_or_default(),
                    image_ref: st.image_ref.clone(),
                    hash: labels::parse_hash(&st.annotations),
                    restart_count: labels::parse_restart_count(&st.annotations),
                    reason: st.reason.clone(),
                    message: termination::status_message(&st),
                    grace_period: labels::parse_grace_period(&st.annotations),
                    pre_stop: labels::parse_pre_stop(&st.annotations),
                }),
                Err(e) if e.is_not_found() => {}
                Err(e) => return Err(e),
            }
        }
        status
            .container_statuses
            .sort_by_key(|c| std::cmp::Reverse(c.created_at));
        Ok(status)
    }
}
