//! The CRI client: generated `runtime.v1` messages ([`api`]) and grpcio stubs
//! ([`grpc`]) behind two small blocking traits, [`RuntimeService`] and
//! [`ImageService`], and their implementation over a unix socket,
//! [`RemoteRuntime`]. Every call carries a deadline; every error is a
//! [`CriError`] naming the call and the endpoint.
//!
//! Callers (the runtime manager, PLEG, node status) depend on the traits
//! only, so that unit tests can put an in-process fake behind them.

pub mod api;
mod endpoint;
mod error;
pub(crate) mod events;
pub mod grpc;
mod remote;

use std::time::Duration;

pub use error::{Code, CriError};
pub use remote::RemoteRuntime;

/// Deadline of one CRI call, like the upstream kubelet's
/// `--runtime-request-timeout` default.
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(2 * 60);

/// The CRI version tinylet announces in `Version` requests.
pub(crate) const KUBE_RUNTIME_API_VERSION: &str = "0.1.0";

/// A sandbox's status and the runtime's verbose `info` about it.
pub(crate) type SandboxStatusInfo = (
    api::PodSandboxStatus,
    std::collections::HashMap<String, String>,
);

/// Pod sandboxes and containers (CRI `RuntimeService`).
pub trait RuntimeService: Send + Sync {
    /// Runtime name and versions.
    fn version(&self) -> Result<api::VersionResponse, CriError>;
    /// Runtime conditions (RuntimeReady, NetworkReady).
    fn status(&self) -> Result<api::StatusResponse, CriError>;
    /// The runtime's free-form verbose status (`info`: JSON values by key).
    /// Runtimes that offer none answer an empty map.
    fn status_info(&self) -> Result<std::collections::HashMap<String, String>, CriError> {
        Ok(std::collections::HashMap::new())
    }
    /// Subscribes to the runtime's own events for the CRI namespace's tasks
    /// and containers (containerd's event service on the same socket).
    /// Runtimes without one (CRI-O) answer `Unimplemented`; the default.
    fn subscribe_changes(&self) -> Result<Box<dyn events::ChangeStream>, CriError> {
        Err(CriError::status(
            "Subscribe",
            "",
            Code::Unimplemented,
            "this runtime has no event stream",
        ))
    }
    /// Creates and starts a sandbox; returns its ID.
    fn run_pod_sandbox(
        &self,
        config: &api::PodSandboxConfig,
        runtime_handler: &str,
    ) -> Result<String, CriError>;
    fn stop_pod_sandbox(&self, pod_sandbox_id: &str) -> Result<(), CriError>;
    fn remove_pod_sandbox(&self, pod_sandbox_id: &str) -> Result<(), CriError>;
    fn pod_sandbox_status(&self, pod_sandbox_id: &str) -> Result<api::PodSandboxStatus, CriError>;
    /// A sandbox's status with the runtime's free-form verbose `info`
    /// (containerd's `info` key holds JSON with the sandbox's `pid`).
    /// Runtimes that offer none answer an empty map.
    fn pod_sandbox_status_info(&self, pod_sandbox_id: &str) -> Result<SandboxStatusInfo, CriError> {
        Ok((
            self.pod_sandbox_status(pod_sandbox_id)?,
            std::collections::HashMap::new(),
        ))
    }
    fn list_pod_sandbox(
        &self,
        filter: Option<api::PodSandboxFilter>,
    ) -> Result<Vec<api::PodSandbox>, CriError>;
    /// Creates a container in a sandbox; returns its ID.
    fn create_container(
        &self,
        pod_sandbox_id: &str,
        config: &api::ContainerConfig,
        sandbox_config: &api::PodSandboxConfig,
    ) -> Result<String, CriError>;
    fn start_container(&self, container_id: &str) -> Result<(), CriError>;
    /// Stops a container, killing it after `timeout_secs` (0: at once).
    fn stop_container(&self, container_id: &str, timeout_secs: i64) -> Result<(), CriError>;
    fn remove_container(&self, container_id: &str) -> Result<(), CriError>;
    fn list_containers(
        &self,
        filter: Option<api::ContainerFilter>,
    ) -> Result<Vec<api::Container>, CriError>;
    fn container_status(&self, container_id: &str) -> Result<api::ContainerStatus, CriError>;
    /// Runs `cmd` in a running container and waits for it to finish, at
    /// most `timeout` (zero: no limit); the answer has its exit code and
    /// output.
    fn exec_sync(
        &self,
        container_id: &str,
        cmd: &[String],
        timeout: Duration,
    ) -> Result<api::ExecSyncResponse, CriError>;

    // The calls below serve the node's API (streaming sessions, log
    // rotation, statistics). Fakes that do not model them answer
    // UNIMPLEMENTED, as a runtime without them would.

    /// A URL on the runtime's streaming server for one exec session.
    fn exec(&self, req: api::ExecRequest) -> Result<String, CriError> {
        let _ = req;
        Err(unimplemented("Exec"))
    }
    /// A URL on the runtime's streaming server for one attach session.
    fn attach(&self, req: api::AttachRequest) -> Result<String, CriError> {
        let _ = req;
        Err(unimplemented("Attach"))
    }
    /// A URL on the runtime's streaming server for one port-forward session.
    fn port_forward(&self, req: api::PortForwardRequest) -> Result<String, CriError> {
        let _ = req;
        Err(unimplemented("PortForward"))
    }
    /// Makes the runtime reopen a container's log file after a rename.
    fn reopen_container_log(&self, container_id: &str) -> Result<(), CriError> {
        let _ = container_id;
        Err(unimplemented("ReopenContainerLog"))
    }
    /// Usage statistics of the containers the filter selects.
    fn list_container_stats(
        &self,
        filter: Option<api::ContainerStatsFilter>,
    ) -> Result<Vec<api::ContainerStats>, CriError> {
        let _ = filter;
        Err(unimplemented("ListContainerStats"))
    }
}

fn unimplemented(method: &'static str) -> CriError {
    CriError::status(
        method,
        "",
        Code::Unimplemented,
        "not supported by this runtime",
    )
}

/// Images (CRI `ImageService`).
pub trait ImageService: Send + Sync {
    fn list_images(&self, filter: Option<api::ImageFilter>) -> Result<Vec<api::Image>, CriError>;
    /// `None` when the image is not present.
    fn image_status(&self, image: &api::ImageSpec) -> Result<Option<api::Image>, CriError>;
    /// Pulls an image; returns the image reference the runtime reports.
    fn pull_image(
        &self,
        image: &api::ImageSpec,
        auth: Option<&api::AuthConfig>,
        sandbox_config: Option<&api::PodSandboxConfig>,
    ) -> Result<String, CriError>;
    fn remove_image(&self, image: &api::ImageSpec) -> Result<(), CriError>;
    /// The filesystems images are stored on, with the bytes images use.
    fn image_fs_info(&self) -> Result<Vec<api::FilesystemUsage>, CriError>;
}
