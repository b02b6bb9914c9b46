//! An in-process fake of the CRI services for unit tests: keeps sandboxes,
//! containers and images in memory with the runtime's semantics, records
//! every call, and can fail (or panic in) the next calls of a method.

use std::collections::HashMap;

use k8s_openapi::api::core::v1::{Container, Pod, PodSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use parking_lot::Mutex;
use protobuf::{EnumOrUnknown, MessageField};

use crate::cri::{api, Code, CriError, ImageService, RuntimeService};

/// The image the fakes have present.
pub(crate) const TEST_IMAGE: &str = "docker.io/tinylet/busybox:1";

/// A pod in namespace `default` with one container `app` running [`TEST_IMAGE`].
pub(crate) fn test_pod(uid: &str, name: &str) -> Pod {
    Pod {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some("default".into()),
            uid: Some(uid.into()),
            ..Default::default()
        },
        spec: Some(PodSpec {
            containers: vec![Container {
                name: "app".into(),
                image: Some(TEST_IMAGE.into()),
                ..Default::default()
            }],
            ..Default::default()
        }),
        status: None,
    }
}

/// A runtime manager over a fresh fake with [`TEST_IMAGE`] present, its
/// directories in a temp dir named after `tag` and the calling thread.
pub(crate) fn test_manager(
    tag: &str,
) -> (
    std::sync::Arc<FakeRuntime>,
    std::sync::Arc<super::RuntimeManager>,
) {
    let fake = std::sync::Arc::new(FakeRuntime::with_images(&[TEST_IMAGE]));
    let dir = std::env::temp_dir().join(format!(
        "tinylet-{tag}-{}-{:?}",
        std::process::id(),
        std::thread::current().id()
    ));
    let rm = super::RuntimeManager::new(fake.clone(), fake.clone(), dir.clone(), dir.join("logs"))
        .with_clock(fake.clone());
    (fake, std::sync::Arc::new(rm))
}

/// Polls `f` every 5 ms for up to 5 s; panics naming `what` on time-out.
pub(crate) fn wait_for(what: &str, f: impl Fn() -> bool) {
    let end = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while !f() {
        assert!(
            std::time::Instant::now() < end,
            "timed out waiting for {what}"
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

/// What a scripted `ExecSync` answers: exit code and stdout, or an error code.
pub(crate) type ExecAnswer = Result<(i32, String), Code>;

#[derive(Default)]
struct State {
    /// Scripted ExecSync answers by the command's first word; others
    /// follow `exec`.
    scripted: HashMap<String, ExecAnswer>,
    /// Commands (by first word) whose ExecSync hangs until its gate is
    /// dropped or its timeout passes.
    hanging: HashMap<String, crossbeam_channel::Receiver<()>>,
    next_id: u64,
    clock: i64,
    sandboxes: Vec<(api::PodSandboxConfig, api::PodSandboxStatus)>,
    containers: Vec<(String, api::ContainerStatus)>,
    /// ListContainerStats answers by container ID: (cumulative CPU ns,
    /// working set bytes, writable layer bytes), stamped with the clock.
    stats: HashMap<String, (u64, u64, u64)>,
    images: Vec<String>,
    calls: Vec<String>,
    fail: HashMap<String, usize>,
    /// Calls that find the runtime gone (its socket missing).
    unreachable: HashMap<String, usize>,
    /// Methods whose next calls panic, and how many.
    panic: HashMap<String, usize>,
    /// StopContainer calls: (container name, timeout).
    stops: Vec<(String, i64)>,
    /// ExecSync calls: (container name, command).
    execs: Vec<(String, Vec<String>)>,
    exec: ExecBehaviour,
    /// Images a pull can fetch, with the login the registry wants.
    registry: HashMap<String, Option<(String, String)>>,
    /// The username of each PullImage call ("" without credentials).
    pull_auths: Vec<String>,
}

/// What the fake's ExecSync does.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct ExecBehaviour {
    pub(crate) exit_code: i32,
    /// Seconds the command takes on the fake clock.
    pub(crate) takes_secs: u64,
    /// Real time the call blocks, for hooks that outlive their deadline.
    pub(crate) blocks: Option<std::time::Duration>,
}

/// Holds the commands of [`FakeRuntime::hang_exec`] hanging; dropping it
/// lets them end.
pub(crate) struct ExecGate {
    _open: crossbeam_channel::Sender<()>,
}

#[derive(Default)]
pub(crate) struct FakeRuntime {
    state: Mutex<State>,
    /// What `subscribe_changes` hands out next, in order; when none is
    /// left it answers Unimplemented, as a runtime without events does.
    change_streams: Mutex<std::collections::VecDeque<Box<dyn crate::cri::events::ChangeStream>>>,
}

fn not_found(method: &'static str, what: &str) -> CriError {
    CriError::status(method, "fake", Code::NotFound, format!("{what} not found"))
}

fn selected(labels: &HashMap<String, String>, selector: &HashMap<String, String>) -> bool {
    selector.iter().all(|(k, v)| labels.get(k) == Some(v))
}

impl FakeRuntime {
    pub(crate) fn with_images(images: &[&str]) -> Self {
        let f = FakeRuntime::default();
        f.state.lock().images = images.iter().map(|s| s.to_string()).collect();
        f
    }

    /// Queues a stream for the next `subscribe_changes`.
    pub(crate) fn push_change_stream(&self, s: Box<dyn crate::cri::events::ChangeStream>) {
        self.change_streams.lock().push_back(s);
    }

    pub(crate) fn calls(&self) -> Vec<String> {
        self.state.lock().calls.clone()
    }

    pub(crate) fn count(&self, method: &str) -> usize {
        self.state
            .lock()
            .calls
            .iter()
            .filter(|c| c.as_str() == method)
            .count()
    }

    pub(crate) fn clear_calls(&self) {
        self.state.lock().calls.clear();
    }

    /// The fake's clock: runtime timestamps (created, started, finished) come from it.
    pub(crate) fn now(&self) -> std::time::SystemTime {
        let ns = self.state.lock().clock;
        std::time::UNIX_EPOCH + std::time::Duration::from_nanos(ns.max(0) as u64)
    }

    /// Moves the fake's clock forward.
    pub(crate) fn advance(&self, d: std::time::Duration) {
        self.state.lock().clock += i64::try_from(d.as_nanos()).unwrap_or(i64::MAX);
    }

    /// StopContainer calls so far: (container name, timeout), in order.
    pub(crate) fn stops(&self) -> Vec<(String, i64)> {
        self.state.lock().stops.clone()
    }

    /// ExecSync calls so far: (container name, command), in order.
    pub(crate) fn execs(&self) -> Vec<(String, Vec<String>)> {
        self.state.lock().execs.clone()
    }

    pub(crate) fn set_exec(&self, b: ExecBehaviour) {
        self.state.lock().exec = b;
    }

    /// The ID of the newest container named `name`.
    pub(crate) fn container_id(&self, name: &str) -> Option<String> {
        let s = self.state.lock();
        s.containers
            .iter()
            .rev()
            .find(|(_, c)| c.metadata.as_ref().is_some_and(|m| m.name == name))
            .map(|(_, c)| c.id.clone())
    }

    /// Lets a pull fetch `image`, with `login` required when given.
    pub(crate) fn serve_image(&self, image: &str, login: Option<(&str, &str)>) {
        self.state.lock().registry.insert(
            image.to_string(),
            login.map(|(u, p)| (u.to_string(), p.to_string())),
        );
    }

    /// The username sent with each PullImage call, in order ("" for none).
    pub(crate) fn pull_auths(&self) -> Vec<String> {
        self.state.lock().pull_auths.clone()
    }

    /// The next `n` calls of `method` fail with UNAVAILABLE.
    pub(crate) fn fail_next(&self, method: &str, n: usize) {
        self.state.lock().fail.insert(method.into(), n);
    }

    /// The next `n` calls of `method` find the runtime gone, as when its
    /// socket is missing.
    pub(crate) fn unreachable_next(&self, method: &str, n: usize) {
        self.state.lock().unreachable.insert(method.into(), n);
    }

    /// The next `n` calls of `method` panic (with the fake's lock held, as
    /// a bug in a real call could), for tests of panic containment.
    pub(crate) fn panic_next(&self, method: &str, n: usize) {
        self.state.lock().panic.insert(method.into(), n);
    }

    /// Scripts what `ExecSync` of a command starting with `cmd0` answers.
    pub(crate) fn script_exec(&self, cmd0: &str, answer: ExecAnswer) {
        self.state.lock().scripted.insert(cmd0.into(), answer);
    }

    /// Makes `ExecSync` of a command starting with `cmd0` hang as a command
    /// that never ends would: until its timeout passes (then it answers
    /// DEADLINE_EXCEEDED, as the runtime does) or the returned gate is
    /// dropped (then it exits 0).
    pub(crate) fn hang_exec(&self, cmd0: &str) -> ExecGate {
        let (tx, rx) = crossbeam_channel::bounded(0);
        self.state.lock().hanging.insert(cmd0.into(), rx);
        ExecGate { _open: tx }
    }

    /// Makes a running container exit with `code`.
    /// Sets what ListContainerStats answers for a container: cumulative
    /// CPU nanoseconds, working set bytes, writable layer bytes.
    pub(crate) fn set_stats(&self, id: &str, cpu_nanos: u64, working_set: u64, writable: u64) {
        self.state
            .lock()
            .stats
            .insert(id.to_string(), (cpu_nanos, working_set, writable));
    }

    pub(crate) fn exit_container(&self, id: &str, code: i32) {
        let mut s = self.state.lock();
        s.clock += 1_000_000_000;
        let now = s.clock;
        if let Some((_, c)) = s.containers.iter_mut().find(|(_, c)| c.id == id) {
            c.state = EnumOrUnknown::new(api::ContainerState::CONTAINER_EXITED);
            c.exit_code = code;
            c.finished_at = now;
        }
    }

    /// Sets the log path `ContainerStatus` reports for container `id`.
    pub(crate) fn set_log_path(&self, id: &str, path: &std::path::Path) {
        let mut s = self.state.lock();
        if let Some((_, c)) = s.containers.iter_mut().find(|(_, c)| c.id == id) {
            c.log_path = path.to_string_lossy().into_owned();
        }
    }

    pub(crate) fn containers(&self) -> Vec<api::ContainerStatus> {
        self.state
            .lock()
            .containers
            .iter()
            .map(|(_, c)| c.clone())
            .collect()
    }

    pub(crate) fn sandboxes(&self) -> Vec<api::PodSandboxStatus> {
        self.state
            .lock()
            .sandboxes
            .iter()
            .map(|(_, s)| s.clone())
            .collect()
    }

    fn begin(&self, method: &'static str) -> Result<parking_lot::MutexGuard<'_, State>, CriError> {
        let mut s = self.state.lock();
        s.calls.push(method.to_string());
        s.clock += 1_000_000;
        if let Some(n) = s.panic.get_mut(method).filter(|n| **n > 0) {
            *n -= 1;
            panic!("injected panic in {method}");
        }
        if let Some(n) = s.unreachable.get_mut(method).filter(|n| **n > 0) {
            *n -= 1;
            return Err(CriError::SocketMissing {
                method,
                endpoint: "unix:///fake.sock".into(),
                path: "/fake.sock".into(),
            });
        }
        if let Some(n) = s.fail.get_mut(method) {
            if *n > 0 {
                *n -= 1;
                return Err(CriError::status(
                    method,
                    "fake",
                    Code::Unavailable,
                    "injected failure",
                ));
            }
        }
        Ok(s)
    }
}

impl RuntimeService for FakeRuntime {
    fn subscribe_changes(&self) -> Result<Box<dyn crate::cri::events::ChangeStream>, CriError> {
        self.change_streams.lock().pop_front().ok_or_else(|| {
            CriError::status("Subscribe", "fake", Code::Unimplemented, "no event stream")
        })
    }

    fn version(&self) -> Result<api::VersionResponse, CriError> {
        drop(self.begin("Version")?);
        let mut v = api::VersionResponse::new();
        v.runtime_name = "fake".into();
        Ok(v)
    }

    fn status(&self) -> Result<api::StatusResponse, CriError> {
        drop(self.begin("Status")?);
        Ok(api::StatusResponse::new())
    }

    fn run_pod_sandbox(
        &self,
        config: &api::PodSandboxConfig,
        _h: &str,
    ) -> Result<String, CriError> {
        let mut s = self.begin("RunPodSandbox")?;
        s.next_id += 1;
        let id = format!("sandbox-{}", s.next_id);
        let mut st = api::PodSandboxStatus::new();
        st.id = id.clone();
        st.metadata = config.metadata.clone();
        st.state = EnumOrUnknown::new(api::PodSandboxState::SANDBOX_READY);
        st.created_at = s.clock;
        st.labels = config.labels.clone();
        st.annotations = config.annotations.clone();
        let mut net = api::PodSandboxNetworkStatus::new();
        net.ip = format!("10.88.0.{}", s.next_id);
        st.network = MessageField::some(net);
        let mut linux = api::LinuxPodSandboxStatus::new();
        let mut ns = api::Namespace::new();
        ns.options = config
            .linux
            .as_ref()
            .and_then(|l| l.security_context.as_ref())
            .and_then(|sc| sc.namespace_options.as_ref())
            .cloned()
            .into();
        linux.namespaces = MessageField::some(ns);
        st.linux = MessageField::some(linux);
        s.sandboxes.push((config.clone(), st));
        Ok(id)
    }

    fn stop_pod_sandbox(&self, id: &str) -> Result<(), CriError> {
        let mut s = self.begin("StopPodSandbox")?;
        let now = s.clock;
        if !s.sandboxes.iter().any(|(_, st)| st.id == id) {
            return Err(not_found("StopPodSandbox", id));
        }
        for (_, st) in s.sandboxes.iter_mut().filter(|(_, st)| st.id == id) {
            st.state = EnumOrUnknown::new(api::PodSandboxState::SANDBOX_NOTREADY);
        }
        for (_, c) in s.containers.iter_mut().filter(|(sb, _)| sb == id) {
            if c.state.enum_value() == Ok(api::ContainerState::CONTAINER_RUNNING) {
                c.state = EnumOrUnknown::new(api::ContainerState::CONTAINER_EXITED);
                c.exit_code = 137;
                c.finished_at = now;
            }
        }
        Ok(())
    }

    fn remove_pod_sandbox(&self, id: &str) -> Result<(), CriError> {
        let mut s = self.begin("RemovePodSandbox")?;
        s.sandboxes.retain(|(_, st)| st.id != id);
        s.containers.retain(|(sb, _)| sb != id);
        Ok(())
    }

    fn pod_sandbox_status(&self, id: &str) -> Result<api::PodSandboxStatus, CriError> {
        let s = self.begin("PodSandboxStatus")?;
        s.sandboxes
            .iter()
            .find(|(_, st)| st.id == id)
            .map(|(_, st)| st.clone())
            .ok_or_else(|| not_found("PodSandboxStatus", id))
    }

    fn list_pod_sandbox(
        &self,
        filter: Option<api::PodSandboxFilter>,
    ) -> Result<Vec<api::PodSandbox>, CriError> {
        let s = self.begin("ListPodSandbox")?;
        let sel = filter.map(|f| f.label_selector).unwrap_or_default();
        Ok(s.sandboxes
            .iter()
            .filter(|(_, st)| selected(&st.labels, &sel))
            .map(|(_, st)| {
                let mut p = api::PodSandbox::new();
                p.id = st.id.clone();
                p.metadata = st.metadata.clone();
                p.state = st.state;
                p.created_at = st.created_at;
                p.labels = st.labels.clone();
                p.annotations = st.annotations.clone();
                p
            })
            .collect())
    }

    fn create_container(
        &self,
        sandbox_id: &str,
        config: &api::ContainerConfig,
        _sc: &api::PodSandboxConfig,
    ) -> Result<String, CriError> {
        let mut s = self.begin("CreateContainer")?;
        if !s.sandboxes.iter().any(|(_, st)| st.id == sandbox_id) {
            return Err(not_found("CreateContainer", sandbox_id));
        }
        let image = config
            .image
            .as_ref()
            .map(|i| i.image.clone())
            .unwrap_or_default();
        if !s.images.contains(&image) {
            return Err(CriError::status(
                "CreateContainer",
                "fake",
                Code::NotFound,
                format!("image {image} not found"),
            ));
        }
        s.next_id += 1;
        let id = format!("container-{}", s.next_id);
        let mut st = api::ContainerStatus::new();
        st.id = id.clone();
        st.metadata = config.metadata.clone();
        st.state = EnumOrUnknown::new(api::ContainerState::CONTAINER_CREATED);
        st.created_at = s.clock;
        st.image = config.image.clone();
        st.labels = config.labels.clone();
        st.annotations = config.annotations.clone();
        st.mounts = config.mounts.clone();
        s.containers.push((sandbox_id.to_string(), st));
        Ok(id)
    }

    fn start_container(&self, id: &str) -> Result<(), CriError> {
        let mut s = self.begin("StartContainer")?;
        let now = s.clock;
        let c = s
            .containers
            .iter_mut()
            .find(|(_, c)| c.id == id)
            .ok_or_else(|| not_found("StartContainer", id))?;
        c.1.state = EnumOrUnknown::new(api::ContainerState::CONTAINER_RUNNING);
        c.1.started_at = now;
        Ok(())
    }

    fn stop_container(&self, id: &str, timeout: i64) -> Result<(), CriError> {
        let mut s = self.begin("StopContainer")?;
        let now = s.clock;
        let name = s
            .containers
            .iter()
            .find(|(_, c)| c.id == id)
            .and_then(|(_, c)| c.metadata.as_ref().map(|m| m.name.clone()))
            .unwrap_or_default();
        s.stops.push((name, timeout));
        let c = s
            .containers
            .iter_mut()
            .find(|(_, c)| c.id == id)
            .ok_or_else(|| not_found("StopContainer", id))?;
        if c.1.state.enum_value() == Ok(api::ContainerState::CONTAINER_RUNNING) {
            c.1.state = EnumOrUnknown::new(api::ContainerState::CONTAINER_EXITED);
            c.1.exit_code = 143;
            c.1.finished_at = now;
        }
        Ok(())
    }

    fn remove_container(&self, id: &str) -> Result<(), CriError> {
        let mut s = self.begin("RemoveContainer")?;
        s.containers.retain(|(_, c)| c.id != id);
        Ok(())
    }

    fn list_containers(
        &self,
        filter: Option<api::ContainerFilter>,
    ) -> Result<Vec<api::Container>, CriError> {
        let s = self.begin("ListContainers")?;
        let sel = filter.map(|f| f.label_selector).unwrap_or_default();
        Ok(s.containers
            .iter()
            .filter(|(_, c)| selected(&c.labels, &sel))
            .map(|(sb, c)| {
                let mut x = api::Container::new();
                x.id = c.id.clone();
                x.pod_sandbox_id = sb.clone();
                x.metadata = c.metadata.clone();
                x.state = c.state;
                x.created_at = c.created_at;
                x.labels = c.labels.clone();
                x.annotations = c.annotations.clone();
                x
            })
            .collect())
    }

    fn container_status(&self, id: &str) -> Result<api::ContainerStatus, CriError> {
        let s = self.begin("ContainerStatus")?;
        s.containers
            .iter()
            .find(|(_, c)| c.id == id)
            .map(|(_, c)| c.clone())
            .ok_or_else(|| not_found("ContainerStatus", id))
    }

    fn exec_sync(
        &self,
        id: &str,
        cmd: &[String],
        timeout: std::time::Duration,
    ) -> Result<api::ExecSyncResponse, CriError> {
        self.exec(id, cmd, timeout)
    }

    fn list_container_stats(
        &self,
        _filter: Option<api::ContainerStatsFilter>,
    ) -> Result<Vec<api::ContainerStats>, CriError> {
        let s = self.begin("ListContainerStats")?;
        let value = |v: u64| {
            protobuf::MessageField::some(api::UInt64Value {
                value: v,
                ..Default::default()
            })
        };
        Ok(s.containers
            .iter()
            .filter_map(|(_, c)| {
                let (cpu, mem, disk) = *s.stats.get(&c.id)?;
                let mut st = api::ContainerStats::new();
                let mut a = api::ContainerAttributes::new();
                a.id = c.id.clone();
                a.metadata = c.metadata.clone();
                a.labels = c.labels.clone();
                a.annotations = c.annotations.clone();
                st.attributes = protobuf::MessageField::some(a);
                let mut u = api::CpuUsage::new();
                u.timestamp = s.clock;
                u.usage_core_nano_seconds = value(cpu);
                st.cpu = protobuf::MessageField::some(u);
                let mut m = api::MemoryUsage::new();
                m.timestamp = s.clock;
                m.working_set_bytes = value(mem);
                st.memory = protobuf::MessageField::some(m);
                let mut w = api::FilesystemUsage::new();
                w.timestamp = s.clock;
                w.used_bytes = value(disk);
                st.writable_layer = protobuf::MessageField::some(w);
                Some(st)
            })
            .collect())
    }

    /// As a runtime does: opens the container's log path anew (creating
    /// the file), so a renamed log is continued in a new file.
    fn reopen_container_log(&self, id: &str) -> Result<(), CriError> {
        let s = self.begin("ReopenContainerLog")?;
        let (_, c) = s
            .containers
            .iter()
            .find(|(_, c)| c.id == id)
            .ok_or_else(|| not_found("ReopenContainerLog", id))?;
        if c.state.enum_value() != Ok(api::ContainerState::CONTAINER_RUNNING) {
            return Err(CriError::status(
                "ReopenContainerLog",
                "fake",
                Code::FailedPrecondition,
                "container is not running",
            ));
        }
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&c.log_path)
            .map_err(|e| {
                CriError::status("ReopenContainerLog", "fake", Code::Internal, e.to_string())
            })?;
        Ok(())
    }
}

impl crate::events::Clock for FakeRuntime {
    fn now(&self) -> std::time::SystemTime {
        FakeRuntime::now(self)
    }
}

impl FakeRuntime {
    fn exec(
        &self,
        id: &str,
        cmd: &[String],
        timeout: std::time::Duration,
    ) -> Result<api::ExecSyncResponse, CriError> {
        let b = {
            let mut s = self.begin("ExecSync")?;
            let c = s
                .containers
                .iter()
                .find(|(_, c)| c.id == id)
                .map(|(_, c)| c.clone())
                .ok_or_else(|| not_found("ExecSync", id))?;
            if c.state.enum_value() != Ok(api::ContainerState::CONTAINER_RUNNING) {
                return Err(CriError::status(
                    "ExecSync",
                    "fake",
                    Code::Unknown,
                    format!("container {id} is not running"),
                ));
            }
            let name = c
                .metadata
                .as_ref()
                .map(|m| m.name.clone())
                .unwrap_or_default();
            s.execs.push((name, cmd.to_vec()));
            let first = cmd.first().map(String::as_str).unwrap_or("");
            if let Some(gate) = s.hanging.get(first).cloned() {
                drop(s);
                return match gate.recv_timeout(timeout) {
                    Err(crossbeam_channel::RecvTimeoutError::Timeout) => Err(CriError::status(
                        "ExecSync",
                        "fake",
                        Code::DeadlineExceeded,
                        "timed out",
                    )),
                    _ => Ok(api::ExecSyncResponse::new()),
                };
            }
            if let Some(answer) = s.scripted.get(first).cloned() {
                return match answer {
                    Ok((code, out)) => {
                        let mut r = api::ExecSyncResponse::new();
                        r.exit_code = code;
                        r.stdout = out.into_bytes();
                        Ok(r)
                    }
                    Err(code) => Err(CriError::status("ExecSync", "fake", code, "scripted")),
                };
            }
            let b = s.exec;
            s.clock += i64::try_from(b.takes_secs).unwrap_or(0) * 1_000_000_000;
            b
        };
        if let Some(d) = b.blocks {
            std::thread::sleep(d);
        }
        let mut r = api::ExecSyncResponse::new();
        r.exit_code = b.exit_code;
        if b.exit_code != 0 {
            r.stderr = b"hook failed".to_vec();
        }
        Ok(r)
    }
}

impl ImageService for FakeRuntime {
    fn list_images(&self, _f: Option<api::ImageFilter>) -> Result<Vec<api::Image>, CriError> {
        let s = self.begin("ListImages")?;
        Ok(s.images
            .iter()
            .map(|i| {
                let mut img = api::Image::new();
                img.id = i.clone();
                img
            })
            .collect())
    }

    fn image_status(&self, image: &api::ImageSpec) -> Result<Option<api::Image>, CriError> {
        let s = self.begin("ImageStatus")?;
        Ok(s.images.iter().find(|i| **i == image.image).map(|i| {
            let mut img = api::Image::new();
            img.id = i.clone();
            img
        }))
    }

    fn pull_image(
        &self,
        image: &api::ImageSpec,
        auth: Option<&api::AuthConfig>,
        _s: Option<&api::PodSandboxConfig>,
    ) -> Result<String, CriError> {
        let mut s = self.begin("PullImage")?;
        let user = auth.map(|a| a.username.clone()).unwrap_or_default();
        s.pull_auths.push(user);
        let fail = |code, msg: String| Err(CriError::status("PullImage", "fake", code, msg));
        match s.registry.get(&image.image).cloned() {
            None => fail(
                Code::Unknown,
                format!(
                    "failed to resolve reference {:?}: no registry reachable",
                    image.image
                ),
            ),
            Some(Some((u, p))) if auth.is_none_or(|a| a.username != u || a.password != p) => fail(
                Code::Unknown,
                format!("failed to pull {:?}: 401 Unauthorized", image.image),
            ),
            Some(_) => {
                if !s.images.contains(&image.image) {
                    s.images.push(image.image.clone());
                }
                Ok(image.image.clone())
            }
        }
    }

    fn remove_image(&self, image: &api::ImageSpec) -> Result<(), CriError> {
        let mut s = self.begin("RemoveImage")?;
        s.images.retain(|i| *i != image.image);
        Ok(())
    }

    fn image_fs_info(&self) -> Result<Vec<api::FilesystemUsage>, CriError> {
        let _s = self.begin("ImageFsInfo")?;
        let mut u = api::FilesystemUsage::new();
        u.fs_id = protobuf::MessageField::some(api::FilesystemIdentifier {
            mountpoint: "/".into(),
            ..Default::default()
        });
        Ok(vec![u])
    }
}
