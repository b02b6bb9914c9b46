//! `RemoteRuntime`: the CRI traits over grpcio to a runtime's unix socket.
//!
//! One gRPC environment with a single completion queue (gRPC core's own
//! threads stay few), one channel, and blocking calls from whichever thread
//! asks (pod workers, PLEG, node status): the channel is shared, calls run
//! concurrently. Each call has the configured deadline; a failure is probed
//! once more (socket file, channel state) to tell "socket missing" from
//! "runtime down" from "runtime said no".

use std::sync::Arc;
use std::time::Duration;

use grpcio::{CallOption, Channel, ChannelBuilder, ConnectivityState, EnvBuilder, Environment};
use protobuf::MessageField;

use super::api;
use super::endpoint::Endpoint;
use super::error::{classify, CallContext, CriError, SocketState};
use super::grpc::{ImageServiceClient, RuntimeServiceClient};
use super::{ImageService, RuntimeService, SandboxStatusInfo, KUBE_RUNTIME_API_VERSION};

/// Largest message accepted either way, as the upstream kubelet allows
/// (a ListContainers on a busy node exceeds gRPC's 4 MiB default).
const MAX_MESSAGE_BYTES: i32 = 16 * 1024 * 1024;
/// Reconnect backoff after the runtime went away: start fast, and never wait
/// long, so that a restarted containerd is picked up within seconds.
const INITIAL_RECONNECT_BACKOFF: Duration = Duration::from_millis(100);
const MAX_RECONNECT_BACKOFF: Duration = Duration::from_secs(3);

/// A CRI client for one runtime endpoint (both services on one channel).
pub struct RemoteRuntime {
    endpoint: Endpoint,
    timeout: Duration,
    channel: Channel,
    runtime: RuntimeServiceClient,
    images: ImageServiceClient,
    // The channel keeps the environment alive too; held for clarity.
    _env: Arc<Environment>,
}

impl RemoteRuntime {
    /// Accepts "unix:///path", "unix:/path" or a bare "/path". Does not
    /// block; the first call connects.
    pub fn new(endpoint: &str, request_timeout: Duration) -> Result<Self, CriError> {
        let parsed = Endpoint::parse(endpoint).map_err(|reason| CriError::InvalidEndpoint {
            endpoint: endpoint.to_string(),
            reason,
        })?;
        if request_timeout.is_zero() {
            return Err(CriError::InvalidEndpoint {
                endpoint: endpoint.to_string(),
                reason: "the request timeout must be above zero".to_string(),
            });
        }
        let env = Arc::new(
            EnvBuilder::new()
                .cq_count(1)
                .name_prefix("grpc-cri")
                .build(),
        );
        let channel = ChannelBuilder::new(env.clone())
            .max_receive_message_len(MAX_MESSAGE_BYTES)
            .max_send_message_len(MAX_MESSAGE_BYTES)
            .initial_reconnect_backoff(INITIAL_RECONNECT_BACKOFF)
            .max_reconnect_backoff(MAX_RECONNECT_BACKOFF)
            .primary_user_agent(concat!("tinylet/", env!("CARGO_PKG_VERSION")))
            .connect(parsed.target());
        Ok(RemoteRuntime {
            runtime: RuntimeServiceClient::new(channel.clone()),
            images: ImageServiceClient::new(channel.clone()),
            channel,
            endpoint: parsed,
            timeout: request_timeout,
            _env: env,
        })
    }

    /// Blocks up to `within` for the runtime to answer Version (used at
    /// start-up; the caller retries with backoff). Unlike other calls this
    /// one waits for the connection instead of failing at once when the
    /// socket is not there yet.
    pub fn wait_ready(&self, within: Duration) -> Result<api::VersionResponse, CriError> {
        let req = version_request();
        let opt = CallOption::default().timeout(within).wait_for_ready(true);
        self.runtime
            .version_opt(&req, opt)
            .map_err(|e| self.failed("Version", within, e))
    }

    /// The endpoint as a gRPC target, `unix:///path`.
    pub fn endpoint(&self) -> &str {
        self.endpoint.target()
    }

    /// Turns a grpcio failure into a `CriError`, probing the socket and the
    /// channel state to say why.
    fn failed(&self, method: &'static str, timeout: Duration, err: grpcio::Error) -> CriError {
        failed(&self.endpoint, &self.channel, method, timeout, err)
    }

    fn call<T>(
        &self,
        method: &'static str,
        f: impl FnOnce(CallOption) -> grpcio::Result<T>,
    ) -> Result<T, CriError> {
        self.call_with(method, self.timeout, f)
    }

    /// A call with its own deadline, timed for the runtime operation
    /// metrics (by method name only: this module knows nothing of pods).
    fn call_with<T>(
        &self,
        method: &'static str,
        timeout: Duration,
        f: impl FnOnce(CallOption) -> grpcio::Result<T>,
    ) -> Result<T, CriError> {
        let started = std::time::Instant::now();
        let result = f(CallOption::default().timeout(timeout));
        crate::metrics::runtime_operation(method, started.elapsed(), result.is_err());
        result.map_err(|e| self.failed(method, timeout, e))
    }

    fn invalid(&self, method: &'static str, reason: impl Into<String>) -> CriError {
        CriError::InvalidResponse {
            method,
            endpoint: self.endpoint.target().to_string(),
            reason: reason.into(),
        }
    }

    /// PodSandboxStatus, verbose or not: the status, checked, and `info`.
    fn sandbox_status(
        &self,
        pod_sandbox_id: &str,
        verbose: bool,
    ) -> Result<SandboxStatusInfo, CriError> {
        const METHOD: &str = "PodSandboxStatus";
        let mut req = api::PodSandboxStatusRequest::new();
        req.pod_sandbox_id = pod_sandbox_id.to_string();
        req.verbose = verbose;
        let resp = self.call(METHOD, |o| self.runtime.pod_sandbox_status_opt(&req, o))?;
        let Some(status) = resp.status.into_option() else {
            return Err(self.invalid(METHOD, format!("no status for sandbox {pod_sandbox_id}")));
        };
        if status.id.is_empty() {
            return Err(self.invalid(METHOD, format!("empty id for sandbox {pod_sandbox_id}")));
        }
        if status.metadata.is_none() {
            return Err(self.invalid(METHOD, format!("no metadata for sandbox {pod_sandbox_id}")));
        }
        Ok((status, resp.info))
    }
}

fn version_request() -> api::VersionRequest {
    let mut req = api::VersionRequest::new();
    req.version = KUBE_RUNTIME_API_VERSION.to_string();
    req
}

/// Turns a grpcio failure of `method` on `channel` into a `CriError`,
/// probing the socket and the channel state to say why.
fn failed(
    endpoint: &Endpoint,
    channel: &Channel,
    method: &'static str,
    timeout: Duration,
    err: grpcio::Error,
) -> CriError {
    let socket = SocketState::probe(endpoint.path());
    let connected =
        channel.check_connectivity_state(false) == ConnectivityState::GRPC_CHANNEL_READY;
    let ctx = CallContext {
        method,
        endpoint: endpoint.target(),
        path: endpoint.path(),
        timeout,
    };
    classify(&ctx, err, socket, connected)
}

impl RuntimeService for RemoteRuntime {
    fn subscribe_changes(&self) -> Result<Box<dyn super::events::ChangeStream>, CriError> {
        use super::events::{change_filters, GrpcChangeStream, SubscribeRequest, METHOD_SUBSCRIBE};
        let req = SubscribeRequest {
            filters: change_filters(),
        };
        // No deadline: the stream lasts until the runtime or the reader
        // ends it. Each failure is told apart as any call's is.
        let rx = grpcio::Client::new(self.channel.clone())
            .server_streaming(&METHOD_SUBSCRIBE, &req, CallOption::default())
            .map_err(|e| self.failed("Subscribe", Duration::ZERO, e))?;
        let endpoint = self.endpoint.clone();
        let channel = self.channel.clone();
        Ok(Box::new(GrpcChangeStream::new(
            rx,
            Box::new(move |e| failed(&endpoint, &channel, "Subscribe", Duration::ZERO, e)),
        )))
    }

    fn version(&self) -> Result<api::VersionResponse, CriError> {
        let req = version_request();
        self.call("Version", |o| self.runtime.version_opt(&req, o))
    }

    fn status(&self) -> Result<api::StatusResponse, CriError> {
        let req = api::StatusRequest::new();
        let resp = self.call("Status", |o| self.runtime.status_opt(&req, o))?;
        if resp.status.is_none() {
            return Err(self.invalid("Status", "no runtime status in the response"));
        }
        Ok(resp)
    }

    fn status_info(&self) -> Result<std::collections::HashMap<String, String>, CriError> {
        let mut req = api::StatusRequest::new();
        req.verbose = true;
        let resp = self.call("Status", |o| self.runtime.status_opt(&req, o))?;
        Ok(resp.info)
    }

    fn run_pod_sandbox(
        &self,
        config: &api::PodSandboxConfig,
        runtime_handler: &str,
    ) -> Result<String, CriError> {
        let mut req = api::RunPodSandboxRequest::new();
        req.config = MessageField::some(config.clone());
        req.runtime_handler = runtime_handler.to_string();
        let resp = self.call("RunPodSandbox", |o| {
            self.runtime.run_pod_sandbox_opt(&req, o)
        })?;
        if resp.pod_sandbox_id.is_empty() {
            return Err(self.invalid("RunPodSandbox", "empty pod_sandbox_id"));
        }
        Ok(resp.pod_sandbox_id)
    }

    fn stop_pod_sandbox(&self, pod_sandbox_id: &str) -> Result<(), CriError> {
        let mut req = api::StopPodSandboxRequest::new();
        req.pod_sandbox_id = pod_sandbox_id.to_string();
        self.call("StopPodSandbox", |o| {
            self.runtime.stop_pod_sandbox_opt(&req, o)
        })?;
        Ok(())
    }

    fn remove_pod_sandbox(&self, pod_sandbox_id: &str) -> Result<(), CriError> {
        let mut req = api::RemovePodSandboxRequest::new();
        req.pod_sandbox_id = pod_sandbox_id.to_string();
        self.call("RemovePodSandbox", |o| {
            self.runtime.remove_pod_sandbox_opt(&req, o)
        })?;
        Ok(())
    }

    fn pod_sandbox_status(&self, pod_sandbox_id: &str) -> Result<api::PodSandboxStatus, CriError> {
        Ok(self.sandbox_status(pod_sandbox_id, false)?.0)
    }

    fn pod_sandbox_status_info(&self, pod_sandbox_id: &str) -> Result<SandboxStatusInfo, CriError> {
        self.sandbox_status(pod_sandbox_id, true)
    }

    fn list_pod_sandbox(
        &self,
        filter: Option<api::PodSandboxFilter>,
    ) -> Result<Vec<api::PodSandbox>, CriError> {
        let mut req = api::ListPodSandboxRequest::new();
        req.filter = MessageField::from_option(filter);
        let resp = self.call("ListPodSandbox", |o| {
            self.runtime.list_pod_sandbox_opt(&req, o)
        })?;
        Ok(resp.items)
    }

    fn create_container(
        &self,
        pod_sandbox_id: &str,
        config: &api::ContainerConfig,
        sandbox_config: &api::PodSandboxConfig,
    ) -> Result<String, CriError> {
        let mut req = api::CreateContainerRequest::new();
        req.pod_sandbox_id = pod_sandbox_id.to_string();
        req.config = MessageField::some(config.clone());
        req.sandbox_config = MessageField::some(sandbox_config.clone());
        let resp = self.call("CreateContainer", |o| {
            self.runtime.create_container_opt(&req, o)
        })?;
        if resp.container_id.is_empty() {
            return Err(self.invalid("CreateContainer", "empty container_id"));
        }
        Ok(resp.container_id)
    }

    fn start_container(&self, container_id: &str) -> Result<(), CriError> {
        let mut req = api::StartContainerRequest::new();
        req.container_id = container_id.to_string();
        self.call("StartContainer", |o| {
            self.runtime.start_container_opt(&req, o)
        })?;
        Ok(())
    }

    fn stop_container(&self, container_id: &str, timeout_secs: i64) -> Result<(), CriError> {
        let mut req = api::StopContainerRequest::new();
        req.container_id = container_id.to_string();
        req.timeout = timeout_secs.max(0);
        // The runtime may take the whole grace period before answering, so
        // the deadline is the grace period on top of the usual one, as
        // upstream does.
        let grace = Duration::from_secs(req.timeout.unsigned_abs());
        let timeout = self.timeout.saturating_add(grace);
        self.call_with("StopContainer", timeout, |o| {
            self.runtime.stop_container_opt(&req, o)
        })?;
        Ok(())
    }

    fn remove_container(&self, container_id: &str) -> Result<(), CriError> {
        let mut req = api::RemoveContainerRequest::new();
        req.container_id = container_id.to_string();
        self.call("RemoveContainer", |o| {
            self.runtime.remove_container_opt(&req, o)
        })?;
        Ok(())
    }

    fn list_containers(
        &self,
        filter: Option<api::ContainerFilter>,
    ) -> Result<Vec<api::Container>, CriError> {
        let mut req = api::ListContainersRequest::new();
        req.filter = MessageField::from_option(filter);
        let resp = self.call("ListContainers", |o| {
            self.runtime.list_containers_opt(&req, o)
        })?;
        Ok(resp.containers)
    }

    fn container_status(&self, container_id: &str) -> Result<api::ContainerStatus, CriError> {
        const METHOD: &str = "ContainerStatus";
        let mut req = api::ContainerStatusRequest::new();
        req.container_id = container_id.to_string();
        let resp = self.call(METHOD, |o| self.runtime.container_status_opt(&req, o))?;
        let Some(status) = resp.status.into_option() else {
            return Err(self.invalid(METHOD, format!("no status for container {container_id}")));
        };
        if status.id.is_empty() {
            return Err(self.invalid(METHOD, format!("empty id for container {container_id}")));
        }
        if status.metadata.is_none() {
            return Err(self.invalid(METHOD, format!("no metadata for container {container_id}")));
        }
        Ok(status)
    }

    fn exec_sync(
        &self,
        container_id: &str,
        cmd: &[String],
        timeout: Duration,
    ) -> Result<api::ExecSyncResponse, CriError> {
        let mut req = api::ExecSyncRequest::new();
        req.container_id = container_id.to_string();
        req.cmd = cmd.to_vec();
        // Whole seconds, rounded up, as the CRI field counts them.
        let secs = timeout.as_secs() + u64::from(timeout.subsec_nanos() > 0);
        req.timeout = i64::try_from(secs).unwrap_or(i64::MAX);
        // The runtime answers once the command ends or its time is up; the
        // call itself gets the usual deadline on top, as upstream does.
        let deadline = self.timeout.saturating_add(timeout);
        self.call_with("ExecSync", deadline, |o| {
            self.runtime.exec_sync_opt(&req, o)
        })
    }

    fn exec(&self, req: api::ExecRequest) -> Result<String, CriError> {
        let resp = self.call("Exec", |o| self.runtime.exec_opt(&req, o))?;
        Ok(resp.url)
    }

    fn attach(&self, req: api::AttachRequest) -> Result<String, CriError> {
        let resp = self.call("Attach", |o| self.runtime.attach_opt(&req, o))?;
        Ok(resp.url)
    }

    fn port_forward(&self, req: api::PortForwardRequest) -> Result<String, CriError> {
        let resp = self.call("PortForward", |o| self.runtime.port_forward_opt(&req, o))?;
        Ok(resp.url)
    }

    fn reopen_container_log(&self, container_id: &str) -> Result<(), CriError> {
        let mut req = api::ReopenContainerLogRequest::new();
        req.container_id = container_id.to_string();
        self.call("ReopenContainerLog", |o| {
            self.runtime.reopen_container_log_opt(&req, o)
        })?;
        Ok(())
    }

    fn list_container_stats(
        &self,
        filter: Option<api::ContainerStatsFilter>,
    ) -> Result<Vec<api::ContainerStats>, CriError> {
        let mut req = api::ListContainerStatsRequest::new();
        req.filter = MessageField::from_option(filter);
        let resp = self.call("ListContainerStats", |o| {
            self.runtime.list_container_stats_opt(&req, o)
        })?;
        Ok(resp.stats)
    }
}

impl ImageService for RemoteRuntime {
    fn list_images(&self, filter: Option<api::ImageFilter>) -> Result<Vec<api::Image>, CriError> {
        let mut req = api::ListImagesRequest::new();
        req.filter = MessageField::from_option(filter);
        let resp = self.call("ListImages", |o| self.images.list_images_opt(&req, o))?;
        Ok(resp.images)
    }

    fn image_status(&self, image: &api::ImageSpec) -> Result<Option<api::Image>, CriError> {
        const METHOD: &str = "ImageStatus";
        let mut req = api::ImageStatusRequest::new();
        req.image = MessageField::some(image.clone());
        let resp = self.call(METHOD, |o| self.images.image_status_opt(&req, o))?;
        match resp.image.into_option() {
            Some(img) if img.id.is_empty() => Err(self.invalid(
                METHOD,
                format!("image {:?} is reported without an id", image.image),
            )),
            other => Ok(other),
        }
    }

    fn pull_image(
        &self,
        image: &api::ImageSpec,
        auth: Option<&api::AuthConfig>,
        sandbox_config: Option<&api::PodSandboxConfig>,
    ) -> Result<String, CriError> {
        let mut req = api::PullImageRequest::new();
        req.image = MessageField::some(image.clone());
        req.auth = MessageField::from_option(auth.cloned());
        req.sandbox_config = MessageField::from_option(sandbox_config.cloned());
        let resp = self.call("PullImage", |o| self.images.pull_image_opt(&req, o))?;
        if resp.image_ref.is_empty() {
            return Err(self.invalid(
                "PullImage",
                format!("empty image_ref for image {:?}", image.image),
            ));
        }
        Ok(resp.image_ref)
    }

    fn remove_image(&self, image: &api::ImageSpec) -> Result<(), CriError> {
        let mut req = api::RemoveImageRequest::new();
        req.image = MessageField::some(image.clone());
        self.call("RemoveImage", |o| self.images.remove_image_opt(&req, o))?;
        Ok(())
    }

    fn image_fs_info(&self) -> Result<Vec<api::FilesystemUsage>, CriError> {
        let req = api::ImageFsInfoRequest::new();
        let resp = self.call("ImageFsInfo", |o| self.images.image_fs_info_opt(&req, o))?;
        Ok(resp.image_filesystems)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DEFAULT: Duration = crate::cri::DEFAULT_REQUEST_TIMEOUT;

    #[test]
    fn new_refuses_bad_endpoints_without_connecting() {
        let err = RemoteRuntime::new("tcp://127.0.0.1:1", DEFAULT)
            .err()
            .unwrap();
        assert!(matches!(err, CriError::InvalidEndpoint { .. }), "{err:?}");
        assert!(err.to_string().contains("tcp://127.0.0.1:1"), "{err}");
        let err = RemoteRuntime::new("/run/x.sock", Duration::ZERO)
            .err()
            .unwrap();
        assert!(err.to_string().contains("timeout"), "{err}");
    }

    #[test]
    fn missing_socket_is_reported_as_such() {
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("absent.sock");
        let rt = RemoteRuntime::new(&format!("unix://{}", sock.display()), DEFAULT).unwrap();
        assert_eq!(rt.endpoint(), format!("unix://{}", sock.display()));
        let err = rt.version().unwrap_err();
        assert!(matches!(err, CriError::SocketMissing { .. }), "{err:?}");
        assert!(err.is_unavailable());
        assert_eq!(err.method(), "Version");

        let err = rt.wait_ready(Duration::from_millis(300)).unwrap_err();
        assert!(err.is_unavailable(), "{err:?}");
        assert_eq!(err.method(), "Version");
    }

    #[test]
    fn refused_connection_on_a_stale_socket_is_runtime_down() {
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("stale.sock");
        // Bind and drop: the socket file stays, nobody listens.
        drop(std::os::unix::net::UnixListener::bind(&sock).unwrap());
        let rt = RemoteRuntime::new(sock.to_str().unwrap(), DEFAULT).unwrap();
        let err = rt.list_pod_sandbox(None).unwrap_err();
        assert!(matches!(err, CriError::Unavailable { .. }), "{err:?}");
        assert_eq!(err.method(), "ListPodSandbox");
        assert!(err.to_string().contains("stale.sock"), "{err}");
    }
}
