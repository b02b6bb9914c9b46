//! A fake CRI runtime for integration tests: a real grpcio server speaking
//! `runtime.v1` on a unix socket in a temp dir, with in-memory sandboxes,
//! containers and images that follow containerd's observable semantics
//! closely enough to drive the real binary.
//!
//! What it does like containerd: sandboxes are READY until stopped, then
//! NOTREADY; containers go CREATED -> RUNNING -> EXITED with timestamps in
//! nanoseconds and exit codes; labels, annotations and metadata are echoed
//! back; the image is reported by its normalized tag; host-network sandboxes
//! refuse a hostname and `net.*` sysctls (runc does); list filters (id or unique id prefix, state, sandbox, label
//! equality) are honoured; status and stop calls on unknown IDs answer
//! NOT_FOUND while removals of unknown IDs succeed (they are idempotent);
//! reusing a sandbox or container name (same metadata and attempt) is refused;
//! removing a sandbox removes its containers; images are matched by
//! normalized reference (`busybox` = `docker.io/library/busybox:latest`) or
//! ID, and a pull of an image the fake registry does not have fails with a
//! registry-like "not found" error.
//!
//! What tests control: every call is recorded as `"Method key"`; the next N
//! calls of a method can be made to fail with a chosen status; a running
//! container can be made to exit (a crash); the gRPC server can be stopped
//! and started again on the same socket with the state kept (a runtime
//! restart).

#![allow(dead_code)]

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use grpcio::{
    EnvBuilder, Environment, RpcContext, RpcStatus, RpcStatusCode, Server, ServerBuilder,
    ServerCredentials, UnarySink,
};
use parking_lot::Mutex;
use protobuf::{EnumOrUnknown, MessageField};
use tinylet::cri::api;
use tinylet::cri::grpc;

/// Images present when the fake starts.
pub const DEFAULT_IMAGES: &[&str] = &[
    "registry.k8s.io/pause:3.9",
    "docker.io/library/busybox:latest",
    "docker.io/library/nginx:latest",
];

/// Exit code of a container stopped with no grace period (SIGKILL).
pub const EXIT_KILLED: i32 = 137;
/// Exit code of a container stopped within its grace period (SIGTERM).
pub const EXIT_TERMINATED: i32 = 143;

/// A running fake runtime. Dropping it stops the server and deletes the
/// socket directory.
pub struct FakeCri {
    state: Arc<Mutex<State>>,
    env: Arc<Environment>,
    // Dropped before `dir`, so the socket is closed before its directory goes.
    server: Mutex<Option<Server>>,
    socket: PathBuf,
    dir: tempfile::TempDir,
}

impl FakeCri {
    /// Starts a fake runtime with [`DEFAULT_IMAGES`] present.
    pub fn start() -> FakeCri {
        let dir = tempfile::Builder::new()
            .prefix("fake-cri")
            .tempdir()
            .expect("fake CRI: creating a temp dir for the socket");
        let socket = dir.path().join("cri.sock");
        let env = Arc::new(
            EnvBuilder::new()
                .cq_count(1)
                .name_prefix("fake-cri")
                .build(),
        );
        let mut state = State::default();
        for image in DEFAULT_IMAGES {
            state.add_image(image);
        }
        state.image_fs = dir.path().display().to_string();
        let fake = FakeCri {
            state: Arc::new(Mutex::new(state)),
            env,
            server: Mutex::new(None),
            socket,
            dir,
        };
        fake.start_server();
        fake
    }

    /// `unix:///path/to/cri.sock`, for `--container-runtime-endpoint`.
    pub fn endpoint(&self) -> String {
        format!("unix://{}", self.socket.display())
    }

    /// The socket file.
    pub fn socket_path(&self) -> &Path {
        &self.socket
    }

    /// (Re)starts the gRPC server on the same socket; state is kept.
    pub fn start_server(&self) {
        let mut slot = self.server.lock();
        if slot.is_some() {
            return;
        }
        // A socket file left by a previous server would make bind fail.
        let _ = std::fs::remove_file(&self.socket);
        let handlers = Handlers {
            state: self.state.clone(),
        };
        let mut server = ServerBuilder::new(self.env.clone())
            .register_service(grpc::create_runtime_service(handlers.clone()))
            .register_service(grpc::create_image_service(handlers))
            .build()
            .expect("fake CRI: building the gRPC server");
        server
            .add_listening_port(self.endpoint(), ServerCredentials::insecure())
            .unwrap_or_else(|e| panic!("fake CRI: binding {}: {e}", self.endpoint()));
        server.start();
        *slot = Some(server);
    }

    /// Stops the gRPC server and removes the socket, as when the runtime
    /// goes down. State is kept for [`FakeCri::start_server`].
    pub fn stop_server(&self) {
        let server = self.server.lock().take();
        drop(server);
        let _ = std::fs::remove_file(&self.socket);
    }

    /// Every call so far, in order, as `"Method key"` (just `"Method"` for
    /// calls without a key). Keys: `ns/name` for RunPodSandbox,
    /// `ns/pod/container` for CreateContainer, the ID for calls on one
    /// sandbox or container, the image as given for image calls.
    pub fn calls(&self) -> Vec<String> {
        self.state
            .lock()
            .calls
            .iter()
            .map(|(m, k)| {
                if k.is_empty() {
                    m.clone()
                } else {
                    format!("{m} {k}")
                }
            })
            .collect()
    }

    /// The keys of the calls to one method, in order.
    pub fn calls_to(&self, method: &str) -> Vec<String> {
        self.state
            .lock()
            .calls
            .iter()
            .filter(|(m, _)| m == method)
            .map(|(_, k)| k.clone())
            .collect()
    }

    /// How many times `method` (e.g. "RunPodSandbox") was called.
    pub fn count(&self, method: &str) -> usize {
        self.state
            .lock()
            .calls
            .iter()
            .filter(|(m, _)| m == method)
            .count()
    }

    /// The timeout (seconds) of every served StopContainer, in order, with
    /// the container ID as given.
    pub fn stop_timeouts(&self) -> Vec<(String, i64)> {
        self.state.lock().stop_timeouts.clone()
    }

    /// Forgets the recorded calls.
    pub fn clear_calls(&self) {
        self.state.lock().calls.clear();
    }

    /// Makes the next `n` calls of `method` fail with `code` (they are still
    /// recorded, and change no state).
    pub fn fail_next(&self, method: &str, n: usize, code: RpcStatusCode) {
        self.state.lock().failures.insert(
            method.to_string(),
            Injected {
                remaining: n,
                code,
                message: format!("injected failure of {method}"),
            },
        );
    }

    /// All sandboxes, ordered by creation.
    pub fn sandboxes(&self) -> Vec<api::PodSandboxStatus> {
        let st = self.state.lock();
        let mut v: Vec<_> = st.sandboxes.values().map(|s| s.status.clone()).collect();
        v.sort_by_key(|s| s.created_at);
        v
    }

    /// All containers, ordered by creation.
    pub fn containers(&self) -> Vec<api::Container> {
        let st = self.state.lock();
        let mut v: Vec<_> = st.containers.values().map(FakeContainer::summary).collect();
        v.sort_by_key(|c| c.created_at);
        v
    }

    /// Full status of every container, ordered by creation.
    pub fn container_statuses(&self) -> Vec<api::ContainerStatus> {
        let st = self.state.lock();
        let mut v: Vec<_> = st.containers.values().map(|c| c.status.clone()).collect();
        v.sort_by_key(|c| c.created_at);
        v
    }

    /// Containers whose `io.kubernetes.container.name` label (or metadata
    /// name) is `name`.
    pub fn containers_named(&self, name: &str) -> Vec<api::ContainerStatus> {
        self.container_statuses()
            .into_iter()
            .filter(|c| {
                c.labels
                    .get("io.kubernetes.container.name")
                    .map(String::as_str)
                    == Some(name)
                    || c.metadata.as_ref().is_some_and(|m| m.name == name)
            })
            .collect()
    }

    /// The environment (in request order) the newest container whose
    /// metadata name is `name` was created with; None if there is none.
    pub fn container_env(&self, name: &str) -> Option<Vec<(String, String)>> {
        let st = self.state.lock();
        st.containers
            .values()
            .filter(|c| c.status.metadata.as_ref().is_some_and(|m| m.name == name))
            .max_by_key(|c| c.status.created_at)
            .map(|c| c.envs.clone())
    }

    /// Replaces the set of present images.
    pub fn set_images(&self, images: &[&str]) {
        let mut st = self.state.lock();
        st.images.clear();
        for image in images {
            st.add_image(image);
        }
    }

    /// Images present now, plus `pinned` ones the runtime marks pinned.
    pub fn add_images(&self, images: &[&str], pinned: bool) {
        let mut st = self.state.lock();
        for image in images {
            st.add_image(image);
            let reference = normalize_image(image);
            if let Some(img) = st.images.get_mut(&reference) {
                img.pinned = pinned;
            }
        }
    }

    /// Names the sandbox image a verbose Status reports.
    pub fn set_sandbox_image(&self, image: &str) {
        self.state.lock().sandbox_image = Some(normalize_image(image));
    }

    /// Images present now.
    pub fn images(&self) -> Vec<api::Image> {
        self.state.lock().images.values().cloned().collect()
    }

    /// Images the fake registry can serve to PullImage (in addition to
    /// those already present).
    pub fn set_pullable(&self, images: &[&str]) {
        self.state.lock().pullable = images.iter().map(|i| normalize_image(i)).collect();
    }

    /// Sets a runtime condition reported by Status (e.g. "NetworkReady").
    pub fn set_condition(&self, kind: &str, status: bool) {
        self.state
            .lock()
            .conditions
            .insert(kind.to_string(), status);
    }

    /// Makes a running container exit with `code`, as if its process ended.
    /// Panics if there is no such container.
    pub fn exit_container(&self, id: &str, code: i32) {
        let mut st = self.state.lock();
        let c = st
            .containers
            .get_mut(id)
            .unwrap_or_else(|| panic!("fake CRI: exit_container: no container {id}"));
        c.exit(code, now_ns());
    }

    /// Leaves the sandbox `id` as containerd does once its containers were
    /// removed under CRI's feet (`ctr containers rm`): not ready, and with
    /// none of its containers listed. Panics if there is no such sandbox.
    pub fn strand_sandbox(&self, id: &str) {
        let mut st = self.state.lock();
        let sb = st
            .sandboxes
            .get_mut(id)
            .unwrap_or_else(|| panic!("fake CRI: strand_sandbox: no sandbox {id}"));
        sb.status.state = EnumOrUnknown::new(api::PodSandboxState::SANDBOX_NOTREADY);
        st.containers.retain(|_, c| c.pod_sandbox_id != id);
    }

    /// While `keep` holds, RemovePodSandbox answers success and removes
    /// nothing (a runtime that lists a sandbox it says it removed).
    pub fn keep_removed_sandboxes(&self, keep: bool) {
        self.state.lock().keep_removed_sandboxes = keep;
    }

    /// Polls until `cond` holds or `timeout` passes; returns whether it held.
    pub fn wait_until(&self, timeout: Duration, mut cond: impl FnMut(&FakeCri) -> bool) -> bool {
        let deadline = Instant::now() + timeout;
        loop {
            if cond(self) {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for FakeCri {
    fn drop(&mut self) {
        self.stop_server();
    }
}

// ---------------------------------------------------------------------------
// State
// ---------------------------------------------------------------------------

struct Injected {
    remaining: usize,
    code: RpcStatusCode,
    message: String,
}

struct FakeSandbox {
    status: api::PodSandboxStatus,
    log_directory: String,
}

impl FakeSandbox {
    fn state(&self) -> api::PodSandboxState {
        self.status.state.enum_value_or_default()
    }

    fn summary(&self) -> api::PodSandbox {
        let s = &self.status;
        let mut p = api::PodSandbox::new();
        p.id = s.id.clone();
        p.metadata = s.metadata.clone();
        p.state = s.state;
        p.created_at = s.created_at;
        p.labels = s.labels.clone();
        p.annotations = s.annotations.clone();
        p.runtime_handler = s.runtime_handler.clone();
        p
    }
}

struct FakeContainer {
    pod_sandbox_id: String,
    status: api::ContainerStatus,
    /// The environment of its CreateContainer request.
    envs: Vec<(String, String)>,
}

impl FakeContainer {
    fn state(&self) -> api::ContainerState {
        self.status.state.enum_value_or_default()
    }

    fn summary(&self) -> api::Container {
        let s = &self.status;
        let mut c = api::Container::new();
        c.id = s.id.clone();
        c.pod_sandbox_id = self.pod_sandbox_id.clone();
        c.metadata = s.metadata.clone();
        c.image = s.image.clone();
        c.image_ref = s.image_ref.clone();
        c.image_id = s.image_id.clone();
        c.state = s.state;
        c.created_at = s.created_at;
        c.labels = s.labels.clone();
        c.annotations = s.annotations.clone();
        c
    }

    /// RUNNING -> EXITED with the given code; anything else is left alone.
    fn exit(&mut self, code: i32, now: i64) {
        if self.state() != api::ContainerState::CONTAINER_RUNNING {
            return;
        }
        self.status.state = EnumOrUnknown::new(api::ContainerState::CONTAINER_EXITED);
        self.status.finished_at = now;
        self.status.exit_code = code;
        self.status.reason = if code == 0 { "Completed" } else { "Error" }.to_string();
    }
}

struct State {
    next_id: u64,
    last_ns: i64,
    sandboxes: BTreeMap<String, FakeSandbox>,
    containers: BTreeMap<String, FakeContainer>,
    /// Present images by normalized reference.
    images: BTreeMap<String, api::Image>,
    /// Normalized references the fake registry can serve.
    pullable: Vec<String>,
    conditions: BTreeMap<String, bool>,
    calls: Vec<(String, String)>,
    /// (container ID as given, timeout) of each StopContainer that was served.
    stop_timeouts: Vec<(String, i64)>,
    failures: HashMap<String, Injected>,
    /// Reported as `config.sandboxImage` in a verbose Status, when set.
    sandbox_image: Option<String>,
    /// The mount point ImageFsInfo reports (default: the fake's own dir).
    image_fs: String,
    /// RemovePodSandbox succeeds without removing (`keep_removed_sandboxes`).
    keep_removed_sandboxes: bool,
}

impl Default for State {
    fn default() -> Self {
        let mut conditions = BTreeMap::new();
        conditions.insert("RuntimeReady".to_string(), true);
        conditions.insert("NetworkReady".to_string(), true);
        State {
            next_id: 0,
            last_ns: 0,
            sandboxes: BTreeMap::new(),
            containers: BTreeMap::new(),
            images: BTreeMap::new(),
            pullable: Vec::new(),
            conditions,
            calls: Vec::new(),
            stop_timeouts: Vec::new(),
            failures: HashMap::new(),
            sandbox_image: None,
            image_fs: String::new(),
            keep_removed_sandboxes: false,
        }
    }
}

type Reply<T> = Result<T, RpcStatus>;

fn status(code: RpcStatusCode, message: impl Into<String>) -> RpcStatus {
    RpcStatus::with_message(code, message.into())
}

fn not_found(kind: &str, id: &str) -> RpcStatus {
    // containerd's wording for a missing object.
    status(
        RpcStatusCode::NOT_FOUND,
        format!("an error occurred when try to find {kind} {id:?}: not found"),
    )
}

impl State {
    /// A 64-hex-digit ID like containerd's, distinct for every call.
    fn new_id(&mut self) -> String {
        self.next_id += 1;
        let mut x = self.next_id.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        let mut out = String::with_capacity(64);
        for _ in 0..4 {
            x ^= x >> 31;
            x = x.wrapping_mul(0xBF58_476D_1CE4_E5B9);
            x ^= x >> 29;
            out.push_str(&format!("{x:016x}"));
        }
        out
    }

    /// Strictly increasing nanosecond timestamps, so creation order is total.
    fn now(&mut self) -> i64 {
        let t = now_ns().max(self.last_ns + 1);
        self.last_ns = t;
        t
    }

    fn add_image(&mut self, image: &str) {
        let reference = normalize_image(image);
        let id = format!("sha256:{}", self.new_id());
        let mut img = api::Image::new();
        img.id = id;
        img.repo_tags = vec![reference.clone()];
        img.size = 1_000_000;
        let mut spec = api::ImageSpec::new();
        spec.image = reference.clone();
        img.spec = MessageField::some(spec);
        self.images.insert(reference, img);
    }

    fn find_image(&self, image: &str) -> Option<&api::Image> {
        self.images
            .get(&normalize_image(image))
            .or_else(|| self.images.values().find(|i| i.id == image))
    }

    /// Exact ID, or a prefix matching exactly one ID (containerd accepts
    /// truncated IDs).
    fn resolve<'a, V>(map: &'a BTreeMap<String, V>, id: &str) -> Option<&'a str> {
        if id.is_empty() {
            return None;
        }
        if let Some((k, _)) = map.get_key_value(id) {
            return Some(k.as_str());
        }
        let mut matches = map.keys().filter(|k| k.starts_with(id));
        match (matches.next(), matches.next()) {
            (Some(k), None) => Some(k.as_str()),
            _ => None,
        }
    }

    fn version(&mut self) -> Reply<api::VersionResponse> {
        let mut r = api::VersionResponse::new();
        r.version = "0.1.0".to_string();
        r.runtime_name = "fake-cri".to_string();
        r.runtime_version = "1.0.0".to_string();
        r.runtime_api_version = "v1".to_string();
        Ok(r)
    }

    fn image_fs_info(&mut self) -> Reply<api::ImageFsInfoResponse> {
        let mut u = api::FilesystemUsage::new();
        u.timestamp = now_ns();
        u.fs_id = MessageField::some(api::FilesystemIdentifier {
            mountpoint: self.image_fs.clone(),
            ..Default::default()
        });
        u.used_bytes = MessageField::some(api::UInt64Value {
            value: self.images.values().map(|i| i.size).sum(),
            ..Default::default()
        });
        let mut r = api::ImageFsInfoResponse::new();
        r.image_filesystems.push(u);
        Ok(r)
    }

    fn status(&mut self, verbose: bool) -> Reply<api::StatusResponse> {
        let mut rs = api::RuntimeStatus::new();
        for (kind, ok) in &self.conditions {
            let mut c = api::RuntimeCondition::new();
            c.type_ = kind.clone();
            c.status = *ok;
            if !ok {
                c.reason = format!("{kind}False");
                c.message = format!("{kind} is false (set by the test)");
            }
            rs.conditions.push(c);
        }
        let mut r = api::StatusResponse::new();
        r.status = MessageField::some(rs);
        if let (true, Some(img)) = (verbose, &self.sandbox_image) {
            r.info.insert(
                "config".into(),
                serde_json::json!({"sandboxImage": img}).to_string(),
            );
        }
        Ok(r)
    }

    fn run_pod_sandbox(
        &mut self,
        req: api::RunPodSandboxRequest,
    ) -> Reply<api::RunPodSandboxResponse> {
        let Some(config) = req.config.into_option() else {
            return Err(status(
                RpcStatusCode::INVALID_ARGUMENT,
                "sandbox config is required",
            ));
        };
        let Some(meta) = config.metadata.as_ref() else {
            return Err(status(
                RpcStatusCode::INVALID_ARGUMENT,
                "sandbox config must include metadata",
            ));
        };
        if meta.name.is_empty() || meta.uid.is_empty() || meta.namespace.is_empty() {
            return Err(status(
                RpcStatusCode::INVALID_ARGUMENT,
                "sandbox metadata needs name, uid and namespace",
            ));
        }
        let name = format!(
            "{}_{}_{}_{}",
            meta.name, meta.namespace, meta.uid, meta.attempt
        );
        if let Some(other) = self.sandboxes.values().find(|s| {
            s.status.metadata.as_ref().is_some_and(|m| {
                format!("{}_{}_{}_{}", m.name, m.namespace, m.uid, m.attempt) == name
            })
        }) {
            return Err(status(
                RpcStatusCode::UNKNOWN,
                format!(
                    "failed to reserve sandbox name {name:?}: name {name:?} is reserved for {:?}",
                    other.status.id
                ),
            ));
        }
        let ns_opts = config
            .linux
            .as_ref()
            .and_then(|l| l.security_context.as_ref())
            .and_then(|s| s.namespace_options.as_ref())
            .cloned()
            .unwrap_or_default();
        let host_network = ns_opts.network.enum_value_or_default() == api::NamespaceMode::NODE;
        // runc refuses both in the host's namespaces, and containerd passes
        // that on.
        const RUNC_FAILED: &str = "failed to create containerd task: failed to create shim task: \
                                   OCI runtime create failed: runc create failed";
        if host_network && !config.hostname.is_empty() {
            return Err(status(
                RpcStatusCode::UNKNOWN,
                format!("{RUNC_FAILED}: unable to set hostname without a private UTS namespace: unknown"),
            ));
        }
        let net_sysctl = config
            .linux
            .as_ref()
            .and_then(|l| l.sysctls.keys().find(|k| k.starts_with("net.")));
        if let (true, Some(key)) = (host_network, net_sysctl) {
            return Err(status(
                RpcStatusCode::UNKNOWN,
                format!(
                    "{RUNC_FAILED}: sysctl {key:?} not allowed in host network namespace: unknown"
                ),
            ));
        }
        let id = self.new_id();
        let created = self.now();

        let mut st = api::PodSandboxStatus::new();
        st.id = id.clone();
        st.metadata = config.metadata.clone();
        st.state = EnumOrUnknown::new(api::PodSandboxState::SANDBOX_READY);
        st.created_at = created;
        let mut net = api::PodSandboxNetworkStatus::new();
        if !host_network {
            net.ip = format!(
                "10.88.{}.{}",
                (self.next_id / 250) % 250,
                self.next_id % 250 + 2
            );
        }
        st.network = MessageField::some(net);
        let mut ns = api::Namespace::new();
        ns.options = MessageField::some(ns_opts);
        let mut linux = api::LinuxPodSandboxStatus::new();
        linux.namespaces = MessageField::some(ns);
        st.linux = MessageField::some(linux);
        st.labels = config.labels.clone();
        st.annotations = config.annotations.clone();
        st.runtime_handler = req.runtime_handler;
        self.sandboxes.insert(
            id.clone(),
            FakeSandbox {
                status: st,
                log_directory: config.log_directory.clone(),
            },
        );
        let mut r = api::RunPodSandboxResponse::new();
        r.pod_sandbox_id = id;
        Ok(r)
    }

    fn stop_pod_sandbox(
        &mut self,
        req: api::StopPodSandboxRequest,
    ) -> Reply<api::StopPodSandboxResponse> {
        let Some(id) = Self::resolve(&self.sandboxes, &req.pod_sandbox_id).map(str::to_string)
        else {
            return Err(not_found("sandbox", &req.pod_sandbox_id));
        };
        let now = self.now();
        for c in self
            .containers
            .values_mut()
            .filter(|c| c.pod_sandbox_id == id)
        {
            c.exit(EXIT_KILLED, now);
        }
        if let Some(sb) = self.sandboxes.get_mut(&id) {
            sb.status.state = EnumOrUnknown::new(api::PodSandboxState::SANDBOX_NOTREADY);
        }
        Ok(api::StopPodSandboxResponse::new())
    }

    fn remove_pod_sandbox(
        &mut self,
        req: api::RemovePodSandboxRequest,
    ) -> Reply<api::RemovePodSandboxResponse> {
        if self.keep_removed_sandboxes {
            return Ok(api::RemovePodSandboxResponse::new());
        }
        // Idempotent: removing what is gone succeeds.
        if let Some(id) = Self::resolve(&self.sandboxes, &req.pod_sandbox_id).map(str::to_string) {
            self.containers.retain(|_, c| c.pod_sandbox_id != id);
            self.sandboxes.remove(&id);
        }
        Ok(api::RemovePodSandboxResponse::new())
    }

    fn pod_sandbox_status(
        &mut self,
        req: api::PodSandboxStatusRequest,
    ) -> Reply<api::PodSandboxStatusResponse> {
        let Some(id) = Self::resolve(&self.sandboxes, &req.pod_sandbox_id) else {
            return Err(not_found("sandbox", &req.pod_sandbox_id));
        };
        let mut r = api::PodSandboxStatusResponse::new();
        r.status = MessageField::some(self.sandboxes[id].status.clone());
        Ok(r)
    }

    fn list_pod_sandbox(
        &mut self,
        req: api::ListPodSandboxRequest,
    ) -> Reply<api::ListPodSandboxResponse> {
        let filter = req.filter.into_option().unwrap_or_default();
        let id = if filter.id.is_empty() {
            None
        } else {
            match Self::resolve(&self.sandboxes, &filter.id) {
                Some(id) => Some(id.to_string()),
                None => return Ok(api::ListPodSandboxResponse::new()),
            }
        };
        let mut items: Vec<api::PodSandbox> = self
            .sandboxes
            .values()
            .filter(|s| id.as_deref().is_none_or(|id| s.status.id == id))
            .filter(|s| {
                filter
                    .state
                    .as_ref()
                    .is_none_or(|want| s.state() == want.state.enum_value_or_default())
            })
            .filter(|s| labels_match(&s.status.labels, &filter.label_selector))
            .map(FakeSandbox::summary)
            .collect();
        items.sort_by_key(|s| s.created_at);
        let mut r = api::ListPodSandboxResponse::new();
        r.items = items;
        Ok(r)
    }

    fn create_container(
        &mut self,
        req: api::CreateContainerRequest,
    ) -> Reply<api::CreateContainerResponse> {
        let Some(sandbox_id) =
            Self::resolve(&self.sandboxes, &req.pod_sandbox_id).map(str::to_string)
        else {
            return Err(not_found("sandbox", &req.pod_sandbox_id));
        };
        let sandbox = &self.sandboxes[&sandbox_id];
        if sandbox.state() != api::PodSandboxState::SANDBOX_READY {
            return Err(status(
                RpcStatusCode::FAILED_PRECONDITION,
                format!("sandbox {sandbox_id:?} is not ready"),
            ));
        }
        let log_directory = sandbox.log_directory.clone();
        let Some(config) = req.config.into_option() else {
            return Err(status(
                RpcStatusCode::INVALID_ARGUMENT,
                "container config is required",
            ));
        };
        let Some(meta) = config.metadata.as_ref() else {
            return Err(status(
                RpcStatusCode::INVALID_ARGUMENT,
                "container config must include metadata",
            ));
        };
        if meta.name.is_empty() {
            return Err(status(
                RpcStatusCode::INVALID_ARGUMENT,
                "container name is required",
            ));
        }
        if let Some(other) = self.containers.values().find(|c| {
            c.pod_sandbox_id == sandbox_id
                && c.status
                    .metadata
                    .as_ref()
                    .is_some_and(|m| m.name == meta.name && m.attempt == meta.attempt)
        }) {
            return Err(status(
                RpcStatusCode::UNKNOWN,
                format!(
                    "failed to reserve container name {:?} (attempt {}) in sandbox {sandbox_id:?}: reserved for {:?}",
                    meta.name, meta.attempt, other.status.id
                ),
            ));
        }
        let image_name = config
            .image
            .as_ref()
            .map(|i| i.image.clone())
            .unwrap_or_default();
        let Some(image) = self.find_image(&image_name).cloned() else {
            return Err(status(
                RpcStatusCode::NOT_FOUND,
                format!("failed to get image {image_name:?}: not found"),
            ));
        };
        let id = self.new_id();
        let created = self.now();
        let mut st = api::ContainerStatus::new();
        st.id = id.clone();
        st.metadata = config.metadata.clone();
        st.state = EnumOrUnknown::new(api::ContainerState::CONTAINER_CREATED);
        st.created_at = created;
        // containerd reports the image by its normalized tag, whatever the
        // spec said.
        let mut spec = config.image.clone().unwrap_or_default();
        if let Some(tag) = image.repo_tags.first() {
            spec.image = tag.clone();
        }
        st.image = MessageField::some(spec);
        st.image_ref = image.id.clone();
        st.image_id = image.id.clone();
        st.labels = config.labels.clone();
        st.annotations = config.annotations.clone();
        st.mounts = config.mounts.clone();
        if !config.log_path.is_empty() {
            st.log_path = Path::new(&log_directory)
                .join(&config.log_path)
                .to_string_lossy()
                .into_owned();
        }
        if let Some(res) = config.linux.as_ref().and_then(|l| l.resources.as_ref()) {
            let mut cr = api::ContainerResources::new();
            cr.linux = MessageField::some(res.clone());
            st.resources = MessageField::some(cr);
        }
        self.containers.insert(
            id.clone(),
            FakeContainer {
                pod_sandbox_id: sandbox_id,
                status: st,
                envs: config
                    .envs
                    .iter()
                    .map(|kv| (kv.key.clone(), kv.value.clone()))
                    .collect(),
            },
        );
        let mut r = api::CreateContainerResponse::new();
        r.container_id = id;
        Ok(r)
    }

    fn start_container(
        &mut self,
        req: api::StartContainerRequest,
    ) -> Reply<api::StartContainerResponse> {
        let Some(id) = Self::resolve(&self.containers, &req.container_id).map(str::to_string)
        else {
            return Err(not_found("container", &req.container_id));
        };
        let now = self.now();
        let c = &self.containers[&id];
        let sandbox_ready = self
            .sandboxes
            .get(&c.pod_sandbox_id)
            .is_some_and(|s| s.state() == api::PodSandboxState::SANDBOX_READY);
        if !sandbox_ready {
            return Err(status(
                RpcStatusCode::FAILED_PRECONDITION,
                format!(
                    "sandbox {:?} of container {id:?} is not ready",
                    c.pod_sandbox_id
                ),
            ));
        }
        if c.state() != api::ContainerState::CONTAINER_CREATED {
            return Err(status(
                RpcStatusCode::FAILED_PRECONDITION,
                format!(
                    "container {id:?} is in {:?} state, not CONTAINER_CREATED",
                    c.state()
                ),
            ));
        }
        if let Some(c) = self.containers.get_mut(&id) {
            c.status.state = EnumOrUnknown::new(api::ContainerState::CONTAINER_RUNNING);
            c.status.started_at = now;
        }
        Ok(api::StartContainerResponse::new())
    }

    fn stop_container(
        &mut self,
        req: api::StopContainerRequest,
    ) -> Reply<api::StopContainerResponse> {
        let Some(id) = Self::resolve(&self.containers, &req.container_id).map(str::to_string)
        else {
            return Err(not_found("container", &req.container_id));
        };
        self.stop_timeouts
            .push((req.container_id.clone(), req.timeout));
        let now = self.now();
        let code = if req.timeout > 0 {
            EXIT_TERMINATED
        } else {
            EXIT_KILLED
        };
        if let Some(c) = self.containers.get_mut(&id) {
            c.exit(code, now);
        }
        Ok(api::StopContainerResponse::new())
    }

    fn remove_container(
        &mut self,
        req: api::RemoveContainerRequest,
    ) -> Reply<api::RemoveContainerResponse> {
        // Idempotent: removing what is gone succeeds; a running one is killed.
        if let Some(id) = Self::resolve(&self.containers, &req.container_id).map(str::to_string) {
            self.containers.remove(&id);
        }
        Ok(api::RemoveContainerResponse::new())
    }

    fn list_containers(
        &mut self,
        req: api::ListContainersRequest,
    ) -> Reply<api::ListContainersResponse> {
        let filter = req.filter.into_option().unwrap_or_default();
        let id = if filter.id.is_empty() {
            None
        } else {
            match Self::resolve(&self.containers, &filter.id) {
                Some(id) => Some(id.to_string()),
                None => return Ok(api::ListContainersResponse::new()),
            }
        };
        let sandbox = if filter.pod_sandbox_id.is_empty() {
            None
        } else {
            match Self::resolve(&self.sandboxes, &filter.pod_sandbox_id) {
                Some(id) => Some(id.to_string()),
                None => return Ok(api::ListContainersResponse::new()),
            }
        };
        let mut containers: Vec<api::Container> = self
            .containers
            .values()
            .filter(|c| id.as_deref().is_none_or(|id| c.status.id == id))
            .filter(|c| sandbox.as_deref().is_none_or(|s| c.pod_sandbox_id == s))
            .filter(|c| {
                filter
                    .state
                    .as_ref()
                    .is_none_or(|want| c.state() == want.state.enum_value_or_default())
            })
            .filter(|c| labels_match(&c.status.labels, &filter.label_selector))
            .map(FakeContainer::summary)
            .collect();
        containers.sort_by_key(|c| c.created_at);
        let mut r = api::ListContainersResponse::new();
        r.containers = containers;
        Ok(r)
    }

    fn container_status(
        &mut self,
        req: api::ContainerStatusRequest,
    ) -> Reply<api::ContainerStatusResponse> {
        let Some(id) = Self::resolve(&self.containers, &req.container_id) else {
            return Err(not_found("container", &req.container_id));
        };
        let mut r = api::ContainerStatusResponse::new();
        r.status = MessageField::some(self.containers[id].status.clone());
        Ok(r)
    }

    fn list_images(&mut self, req: api::ListImagesRequest) -> Reply<api::ListImagesResponse> {
        let wanted = req
            .filter
            .as_ref()
            .and_then(|f| f.image.as_ref())
            .map(|i| i.image.clone())
            .filter(|i| !i.is_empty());
        let mut r = api::ListImagesResponse::new();
        r.images = match wanted {
            Some(w) => self.find_image(&w).cloned().into_iter().collect(),
            None => self.images.values().cloned().collect(),
        };
        Ok(r)
    }

    fn image_status(&mut self, req: api::ImageStatusRequest) -> Reply<api::ImageStatusResponse> {
        let image = req
            .image
            .as_ref()
            .map(|i| i.image.as_str())
            .unwrap_or_default();
        let mut r = api::ImageStatusResponse::new();
        // Absent: OK with the image unset, as the CRI says.
        r.image = MessageField::from_option(self.find_image(image).cloned());
        Ok(r)
    }

    fn pull_image(&mut self, req: api::PullImageRequest) -> Reply<api::PullImageResponse> {
        let image = req
            .image
            .as_ref()
            .map(|i| i.image.clone())
            .unwrap_or_default();
        if image.is_empty() {
            return Err(status(RpcStatusCode::INVALID_ARGUMENT, "image is required"));
        }
        let reference = normalize_image(&image);
        if self.find_image(&image).is_none() {
            if !self.pullable.contains(&reference) {
                return Err(status(
                    RpcStatusCode::UNKNOWN,
                    format!(
                        "failed to pull and unpack image {reference:?}: failed to resolve reference {reference:?}: {reference}: not found"
                    ),
                ));
            }
            self.add_image(&reference);
        }
        let mut r = api::PullImageResponse::new();
        r.image_ref = self
            .find_image(&image)
            .map(|i| i.id.clone())
            .unwrap_or_default();
        Ok(r)
    }

    fn remove_image(&mut self, req: api::RemoveImageRequest) -> Reply<api::RemoveImageResponse> {
        let image = req
            .image
            .as_ref()
            .map(|i| i.image.as_str())
            .unwrap_or_default();
        if let Some(id) = self.find_image(image).map(|i| i.id.clone()) {
            self.images.retain(|_, i| i.id != id);
        }
        Ok(api::RemoveImageResponse::new())
    }
}

fn labels_match(labels: &HashMap<String, String>, selector: &HashMap<String, String>) -> bool {
    selector.iter().all(|(k, v)| labels.get(k) == Some(v))
}

/// `busybox` -> `docker.io/library/busybox:latest`, as containerd's CRI
/// plugin normalizes references. IDs (`sha256:...`) are left alone.
pub fn normalize_image(image: &str) -> String {
    if image.starts_with("sha256:") {
        return image.to_string();
    }
    let (first, _) = image.split_once('/').unwrap_or(("", image));
    let has_domain =
        !first.is_empty() && (first.contains('.') || first.contains(':') || first == "localhost");
    let mut full = if has_domain {
        image.to_string()
    } else if image.contains('/') {
        format!("docker.io/{image}")
    } else {
        format!("docker.io/library/{image}")
    };
    let last = full.rsplit('/').next().unwrap_or_default();
    if !last.contains(':') && !last.contains('@') {
        full.push_str(":latest");
    }
    full
}

fn now_ns() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

// ---------------------------------------------------------------------------
// gRPC handlers
// ---------------------------------------------------------------------------

#[derive(Clone)]
struct Handlers {
    state: Arc<Mutex<State>>,
}

impl Handlers {
    /// Records the call, applies an injected failure if one is pending,
    /// otherwise runs `f` on the state, and sends the answer.
    fn handle<T: Send + 'static>(
        &self,
        ctx: RpcContext,
        sink: UnarySink<T>,
        method: &str,
        key: String,
        f: impl FnOnce(&mut State) -> Reply<T>,
    ) {
        let result = {
            let mut st = self.state.lock();
            st.calls.push((method.to_string(), key));
            let injected = match st.failures.get_mut(method) {
                Some(inj) if inj.remaining > 0 => {
                    inj.remaining -= 1;
                    Some(status(inj.code, inj.message.clone()))
                }
                _ => None,
            };
            match injected {
                Some(e) => Err(e),
                None => f(&mut st),
            }
        };
        let send = match result {
            Ok(resp) => sink.success(resp),
            Err(e) => sink.fail(e),
        };
        ctx.spawn(async move {
            let _ = send.await;
        });
    }
}

fn pod_key(config: &MessageField<api::PodSandboxConfig>) -> String {
    config
        .as_ref()
        .and_then(|c| c.metadata.as_ref())
        .map(|m| format!("{}/{}", m.namespace, m.name))
        .unwrap_or_default()
}

fn image_key(spec: &MessageField<api::ImageSpec>) -> String {
    spec.as_ref().map(|i| i.image.clone()).unwrap_or_default()
}

impl grpc::RuntimeService for Handlers {
    fn version(
        &mut self,
        ctx: RpcContext,
        _req: api::VersionRequest,
        sink: UnarySink<api::VersionResponse>,
    ) {
        self.handle(ctx, sink, "Version", String::new(), |st| st.version());
    }

    fn status(
        &mut self,
        ctx: RpcContext,
        req: api::StatusRequest,
        sink: UnarySink<api::StatusResponse>,
    ) {
        self.handle(ctx, sink, "Status", String::new(), |st| {
            st.status(req.verbose)
        });
    }

    fn run_pod_sandbox(
        &mut self,
        ctx: RpcContext,
        req: api::RunPodSandboxRequest,
        sink: UnarySink<api::RunPodSandboxResponse>,
    ) {
        let key = pod_key(&req.config);
        self.handle(ctx, sink, "RunPodSandbox", key, |st| {
            st.run_pod_sandbox(req)
        });
    }

    fn stop_pod_sandbox(
        &mut self,
        ctx: RpcContext,
        req: api::StopPodSandboxRequest,
        sink: UnarySink<api::StopPodSandboxResponse>,
    ) {
        let key = req.pod_sandbox_id.clone();
        self.handle(ctx, sink, "StopPodSandbox", key, |st| {
            st.stop_pod_sandbox(req)
        });
    }

    fn remove_pod_sandbox(
        &mut self,
        ctx: RpcContext,
        req: api::RemovePodSandboxRequest,
        sink: UnarySink<api::RemovePodSandboxResponse>,
    ) {
        let key = req.pod_sandbox_id.clone();
        self.handle(ctx, sink, "RemovePodSandbox", key, |st| {
            st.remove_pod_sandbox(req)
        });
    }

    fn pod_sandbox_status(
        &mut self,
        ctx: RpcContext,
        req: api::PodSandboxStatusRequest,
        sink: UnarySink<api::PodSandboxStatusResponse>,
    ) {
        let key = req.pod_sandbox_id.clone();
        self.handle(ctx, sink, "PodSandboxStatus", key, |st| {
            st.pod_sandbox_status(req)
        });
    }

    fn list_pod_sandbox(
        &mut self,
        ctx: RpcContext,
        req: api::ListPodSandboxRequest,
        sink: UnarySink<api::ListPodSandboxResponse>,
    ) {
        self.handle(ctx, sink, "ListPodSandbox", String::new(), |st| {
            st.list_pod_sandbox(req)
        });
    }

    fn create_container(
        &mut self,
        ctx: RpcContext,
        req: api::CreateContainerRequest,
        sink: UnarySink<api::CreateContainerResponse>,
    ) {
        let name = req
            .config
            .as_ref()
            .and_then(|c| c.metadata.as_ref())
            .map(|m| m.name.clone())
            .unwrap_or_default();
        let key = format!("{}/{name}", pod_key(&req.sandbox_config));
        self.handle(ctx, sink, "CreateContainer", key, |st| {
            st.create_container(req)
        });
    }

    fn start_container(
        &mut self,
        ctx: RpcContext,
        req: api::StartContainerRequest,
        sink: UnarySink<api::StartContainerResponse>,
    ) {
        let key = req.container_id.clone();
        self.handle(ctx, sink, "StartContainer", key, |st| {
            st.start_container(req)
        });
    }

    fn stop_container(
        &mut self,
        ctx: RpcContext,
        req: api::StopContainerRequest,
        sink: UnarySink<api::StopContainerResponse>,
    ) {
        let key = req.container_id.clone();
        self.handle(ctx, sink, "StopContainer", key, |st| st.stop_container(req));
    }

    fn remove_container(
        &mut self,
        ctx: RpcContext,
        req: api::RemoveContainerRequest,
        sink: UnarySink<api::RemoveContainerResponse>,
    ) {
        let key = req.container_id.clone();
        self.handle(ctx, sink, "RemoveContainer", key, |st| {
            st.remove_container(req)
        });
    }

    fn list_containers(
        &mut self,
        ctx: RpcContext,
        req: api::ListContainersRequest,
        sink: UnarySink<api::ListContainersResponse>,
    ) {
        self.handle(ctx, sink, "ListContainers", String::new(), |st| {
            st.list_containers(req)
        });
    }

    fn container_status(
        &mut self,
        ctx: RpcContext,
        req: api::ContainerStatusRequest,
        sink: UnarySink<api::ContainerStatusResponse>,
    ) {
        let key = req.container_id.clone();
        self.handle(ctx, sink, "ContainerStatus", key, |st| {
            st.container_status(req)
        });
    }
}

impl grpc::ImageService for Handlers {
    fn list_images(
        &mut self,
        ctx: RpcContext,
        req: api::ListImagesRequest,
        sink: UnarySink<api::ListImagesResponse>,
    ) {
        self.handle(ctx, sink, "ListImages", String::new(), |st| {
            st.list_images(req)
        });
    }

    fn image_status(
        &mut self,
        ctx: RpcContext,
        req: api::ImageStatusRequest,
        sink: UnarySink<api::ImageStatusResponse>,
    ) {
        let key = image_key(&req.image);
        self.handle(ctx, sink, "ImageStatus", key, |st| st.image_status(req));
    }

    fn pull_image(
        &mut self,
        ctx: RpcContext,
        req: api::PullImageRequest,
        sink: UnarySink<api::PullImageResponse>,
    ) {
        let key = image_key(&req.image);
        self.handle(ctx, sink, "PullImage", key, |st| st.pull_image(req));
    }

    fn remove_image(
        &mut self,
        ctx: RpcContext,
        req: api::RemoveImageRequest,
        sink: UnarySink<api::RemoveImageResponse>,
    ) {
        let key = image_key(&req.image);
        self.handle(ctx, sink, "RemoveImage", key, |st| st.remove_image(req));
    }

    fn image_fs_info(
        &mut self,
        ctx: RpcContext,
        _req: api::ImageFsInfoRequest,
        sink: UnarySink<api::ImageFsInfoResponse>,
    ) {
        self.handle(ctx, sink, "ImageFsInfo", String::new(), |st| {
            st.image_fs_info()
        });
    }
}
