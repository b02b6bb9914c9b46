//! The `tinylet` binary: flags, logging, signals, and wiring of the threads.

use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use crossbeam_channel::{bounded, Receiver};
use log::{error, info, warn};

use tinylet::admission::NodeInfo;
use tinylet::config::{
    load_checkpoints, ApiSource, FileSource, HttpSource, NotificationMode, PodConfig,
};
use tinylet::cri::RemoteRuntime;
use tinylet::events::{EventBroadcaster, EventRecorder, EventType, ObjectRef};
use tinylet::eviction::Signal;
use tinylet::fieldpath::NodeAllocatable;
use tinylet::images::gc::{self as image_gc, ImageGc};
use tinylet::images::ImageOptions;
use tinylet::kube::{load_kubeconfig, Client, ClientOptions};
use tinylet::kubelet::{Inputs, Kubelet, PodView};
use tinylet::node::lease::LeaseController;
use tinylet::node::status::{NodeConfig, NodeStatusController};
use tinylet::node::{initial_node_state, node_info};
use tinylet::options::{parse_args, Command, Options, USAGE};
use tinylet::pleg::{Pleg, PodCache, RunningPods, EVENTS_CAPACITY, RELIST_PERIOD};
use tinylet::pod::{API_SOURCE, FILE_SOURCE, HTTP_SOURCE};
use tinylet::pod_workers::{PodWorkers, WorkQueue};
use tinylet::prober::{Limits, ProbeResults, Prober, UPDATES_CAPACITY};
use tinylet::runtime::NodeSettings;
use tinylet::runtime::RuntimeManager;
use tinylet::server::routes::State;
use tinylet::status::manager::{StatusManager, StatusReporter};
use tinylet::thread::spawn_named;
use tinylet::volume::{
    objects, ApiObjects, ApiWatcher, ObjectManager, ObjectSource, VolumeManager,
};

/// Whether this process was started through a file named `kubelet` (the
/// package's link to tinylet, run by kubeadm and the `kubelet` unit).
fn invoked_as_kubelet() -> bool {
    std::env::args_os()
        .next()
        .and_then(|a| Path::new(&a).file_name().map(|n| n == "kubelet"))
        .unwrap_or(false)
}

fn main() -> ExitCode {
    // The Kubernetes version to report, before anything can print or send
    // it: `--version` included, as kubeadm's preflight reads it.
    let from_env = std::env::var(tinylet::version::KUBELET_VERSION_VAR).ok();
    let defaults = Path::new(tinylet::version::DEFAULTS_FILE);
    match tinylet::version::resolve_kubelet(from_env, defaults) {
        Ok(v) => tinylet::version::set_kubelet(v),
        Err(e) => {
            eprintln!("tinylet: {e}");
            return ExitCode::from(2);
        }
    }
    let opts = match parse_args(std::env::args().skip(1)) {
        Ok(Command::Run(o)) => *o,
        Ok(Command::Status(o)) => return tinylet::status_cmd::main(&o),
        Ok(Command::StatusHelp) => {
            return tinylet::version::print_stdout(tinylet::options::STATUS_USAGE)
        }
        Ok(Command::Help) => return tinylet::version::print_stdout(USAGE),
        Ok(Command::Version) => {
            // Run as `kubelet` (the package's link, which kubeadm runs), the
            // one line kubeadm parses; as `tinylet`, the build, then that.
            let mut text = String::new();
            if !invoked_as_kubelet() {
                text = format!("{}\n", tinylet::version::long());
            }
            text.push_str(&tinylet::version::kubernetes_line());
            text.push('\n');
            return tinylet::version::print_stdout(&text);
        }
        Err(e) => {
            eprintln!("tinylet: {e}\nRun 'tinylet --help' for the flags.");
            return ExitCode::from(2);
        }
    };
    tinylet::malloc::reexec_with_tunables();
    init_logging(opts.verbosity);
    tinylet::fault::init();
    match run(opts) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            error!("{e:#}");
            ExitCode::FAILURE
        }
    }
}

fn init_logging(verbosity: u8) {
    let level = match verbosity {
        0..=3 => log::LevelFilter::Info,
        4..=5 => log::LevelFilter::Debug,
        _ => log::LevelFilter::Trace,
    };
    env_logger::Builder::new()
        .filter_level(level)
        // Keep gRPC's and the HTTP client's own chatter out unless asked for.
        .filter_module("grpcio", log::LevelFilter::Warn)
        .filter_module("ureq", log::LevelFilter::Warn)
        .filter_module("ureq_proto", log::LevelFilter::Warn)
        .filter_module("rustls", log::LevelFilter::Warn)
        .parse_env("RUST_LOG")
        .format_timestamp_millis()
        .init();
}

/// SIGTERM and SIGINT stop the agent; a second one exits at once.
fn watch_signals() -> anyhow::Result<Receiver<()>> {
    use signal_hook::consts::{SIGINT, SIGTERM};
    let mut signals = signal_hook::iterator::Signals::new([SIGTERM, SIGINT])
        .context("installing signal handlers")?;
    let (tx, rx) = bounded(1);
    spawn_named("signals", move || {
        let mut seen = 0;
        for sig in signals.forever() {
            seen += 1;
            if seen > 1 {
                warn!("second signal {sig}: exiting now");
                std::process::exit(1);
            }
            info!("signal {sig}: shutting down (containers keep running)");
            let _ = tx.try_send(());
        }
    })
    .context("starting the signal thread")?
    .detach();
    Ok(rx)
}

fn node_name(opts: &Options) -> anyhow::Result<String> {
    let name = match &opts.hostname_override {
        Some(n) => n.clone(),
        None => std::fs::read_to_string("/proc/sys/kernel/hostname")
            .context("reading the hostname (set --hostname-override)")?,
    };
    let name = name.trim().to_lowercase();
    if name.is_empty() {
        bail!("the node name is empty (set --hostname-override)");
    }
    Ok(name)
}

fn check_manifest_path(path: &Path) -> anyhow::Result<()> {
    match std::fs::metadata(path) {
        Ok(m) if m.is_dir() => {
            std::fs::read_dir(path).with_context(|| {
                format!(
                    "--pod-manifest-path {}: cannot read directory",
                    path.display()
                )
            })?;
        }
        Ok(m) if m.is_file() => {
            std::fs::File::open(path).with_context(|| {
                format!("--pod-manifest-path {}: cannot read file", path.display())
            })?;
        }
        Ok(_) => bail!(
            "--pod-manifest-path {}: neither a directory nor a file",
            path.display()
        ),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            warn!(
                "--pod-manifest-path {}: does not exist yet; watching for it",
                path.display()
            );
        }
        Err(e) => return Err(e).with_context(|| format!("--pod-manifest-path {}", path.display())),
    }
    Ok(())
}

/// Creates `--root-dir` if needed and makes sure tinylet can write there
/// (a read-only filesystem, or a directory it may not write to, is refused
/// here, before any pod is touched) by creating and removing a file in it.
fn check_root_dir(dir: &Path) -> anyhow::Result<()> {
    let shown = dir.display();
    std::fs::create_dir_all(dir).with_context(|| format!("--root-dir {shown}: cannot create"))?;
    let probe = dir.join(format!(".tinylet-write-check-{}", std::process::id()));
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&probe)
        .with_context(|| format!("--root-dir {shown}: not writable"))?;
    std::fs::remove_file(&probe)
        .with_context(|| format!("--root-dir {shown}: cannot remove {}", probe.display()))?;
    // Private to root, as upstream's setupDataDirs makes it, whatever the
    // umask and whoever made it: pods' volumes, tokens among them, live
    // below. A narrower mode an administrator chose is kept. (The root
    // dir itself may be a symlink; it is followed here, as for any flag.)
    let meta = std::fs::metadata(dir).with_context(|| format!("--root-dir {shown}"))?;
    let mode = std::os::unix::fs::PermissionsExt::mode(&meta.permissions()) & 0o7777;
    let private = tinylet::paths::PRIVATE_DIR_MODE;
    if mode & !private & 0o777 != 0 {
        std::fs::set_permissions(
            dir,
            std::os::unix::fs::PermissionsExt::from_mode(mode & (private | 0o7000)),
        )
        .with_context(|| format!("--root-dir {shown}: cannot make it mode {private:o}"))?;
    }
    tinylet::paths::ensure_dir(&dir.join("pods"), private)
        .with_context(|| format!("--root-dir {shown}: cannot create its pods directory"))?;
    Ok(())
}

/// The kubelet protects itself from the OOM killer; in a container or
/// without CAP_SYS_RESOURCE that may be refused, which is not fatal.
fn protect_from_oom() {
    if let Err(e) = std::fs::write("/proc/self/oom_score_adj", "-999") {
        info!("cannot set own oom_score_adj: {e} (continuing)");
    }
}

/// Raises the open files limit to `--max-open-files` (capped at the hard
/// limit), as upstream; failing is not fatal, as upstream.
fn raise_open_files(wanted: u64) {
    match tinylet::rlimit::raise_open_files(wanted) {
        Ok(l) if l.soft < wanted => info!(
            "open files limit: {} (was {}): --max-open-files {wanted} capped at the hard limit",
            l.soft, l.was
        ),
        Ok(l) => info!(
            "open files limit: {} (was {}, hard limit {})",
            l.soft, l.was, l.hard
        ),
        Err(e) => warn!("cannot set the open files limit to {wanted}: {e} (continuing)"),
    }
}

/// Connects to the runtime, retrying with back-off until it answers or a
/// signal arrives. Returns the runtime and its name (`containerd`).
fn connect_runtime(
    opts: &Options,
    stop: &Receiver<()>,
) -> anyhow::Result<Option<(RemoteRuntime, String)>> {
    let runtime = RemoteRuntime::new(
        &opts.container_runtime_endpoint,
        opts.runtime_request_timeout,
    )
    .with_context(|| {
        format!(
            "--container-runtime-endpoint {}",
            opts.container_runtime_endpoint
        )
    })?;
    let mut delay = Duration::from_millis(500);
    let started = Instant::now();
    loop {
        match runtime.wait_ready(Duration::from_secs(5)) {
            Ok(v) => {
                info!(
                    "container runtime {} {} (CRI {}) at {}",
                    v.runtime_name,
                    v.runtime_version,
                    v.runtime_api_version,
                    opts.container_runtime_endpoint
                );
                return Ok(Some((runtime, v.runtime_name)));
            }
            Err(e) if opts.runonce && started.elapsed() >= opts.runonce_timeout => {
                bail!(
                    "container runtime not ready within --runonce-timeout {}s: {e}",
                    opts.runonce_timeout.as_secs()
                );
            }
            Err(e) => {
                warn!(
                    "container runtime not ready: {e}; retrying in {:.1}s",
                    delay.as_secs_f32()
                );
                if stop.recv_timeout(delay).is_ok() {
                    return Ok(None);
                }
                delay = (delay * 2).min(Duration::from_secs(30));
            }
        }
    }
}

/// Starts the node API on the listeners the flags ask for (none: `None`).
/// The main port's TLS pair comes from the flags or is made once under
/// `--cert-dir` for the node's name and IPs.
fn start_server(
    opts: &Options,
    node: &str,
    state: State,
) -> anyhow::Result<(
    Option<tinylet::server::Server>,
    Option<Arc<tinylet::server::tls::ServingCert>>,
)> {
    let listeners = opts.listeners();
    let tls = match listeners.main {
        Some(_) => {
            let ips: Vec<std::net::IpAddr> =
                tinylet::node::machine::node_addresses(opts.node_ip, node)
                    .unwrap_or_default()
                    .into_iter()
                    .filter_map(|(_, a)| a.parse().ok())
                    .collect();
            let cert_dir = opts.cert_dir();
            let files = opts
                .tls_cert_file
                .as_deref()
                .zip(opts.tls_private_key_file.as_deref());
            let serving = tinylet::server::tls::Serving {
                files,
                cert_dir: &cert_dir,
                host: node,
                ips: &ips,
            };
            Some(
                tinylet::server::tls::server_config(
                    &serving,
                    opts.client_ca_file.as_deref(),
                    opts.tls_min_version,
                )
                .map_err(anyhow::Error::msg)?,
            )
        }
        None => None,
    };
    let (tls, current) = match tls {
        Some((config, current)) => (Some(config), Some(current)),
        None => (None, None),
    };
    let server = tinylet::server::start(opts, tls, state).map_err(anyhow::Error::msg)?;
    for (what, addr) in [
        ("node API (HTTPS)", listeners.main),
        ("read-only API (HTTP)", listeners.read_only),
        ("healthz (HTTP)", listeners.healthz),
    ] {
        if let (Some(addr), Some(_)) = (addr, &server) {
            info!("{what} listening on {addr}");
        }
    }
    Ok((server, current))
}

/// Runs the agent until a signal (or, with `--runonce`, until its pods are
/// decided). False: `--runonce` pods that did not all run.
fn run(opts: Options) -> anyhow::Result<bool> {
    let started = Instant::now();
    tinylet::malloc::limit_arenas();
    for flag in &opts.ignored_flags {
        warn!("flag --{flag}: a kubelet flag tinylet does not use; ignored");
    }
    if let Some(file) = &opts.config_file {
        info!("configuration file {}", file.display());
        for field in &opts.ignored_config_fields {
            log::debug!("--config {}: ignoring field {field}", file.display());
        }
    }
    let node = node_name(&opts)?;
    tinylet::metrics::set_node_name(&node);
    if let Some(p) = &opts.pod_manifest_path {
        check_manifest_path(p)?;
    }
    check_root_dir(&opts.root_dir)?;
    protect_from_oom();
    raise_open_files(opts.max_open_files);
    info!("{} starting as node {node:?}", tinylet::version::long());
    let client_options = ClientOptions {
        qps: opts.kube_api_qps,
        burst: opts.kube_api_burst,
        timeout: Duration::from_secs(30),
        user_agent: format!(
            "tinylet/v{} ({}/{})",
            env!("CARGO_PKG_VERSION"),
            std::env::consts::OS,
            tinylet::node::machine::go_arch()
        ),
    };
    // TLS bootstrap, before anything starts: the node has no credentials
    // of its own until the cluster issues them. A signal meanwhile ends the
    // process at once (nothing runs yet; every file is written whole).
    if let (Some(bootstrap), Some(kubeconfig)) = (&opts.bootstrap_kubeconfig, &opts.kubeconfig) {
        tinylet::certificate::load_client_cert(&tinylet::certificate::Bootstrap {
            kubeconfig: kubeconfig.clone(),
            bootstrap_kubeconfig: bootstrap.clone(),
            cert_dir: opts.cert_dir(),
            node: node.clone(),
            client_options: client_options.clone(),
            backoff: (Duration::from_secs(1), Duration::from_secs(300)),
            wait: Duration::from_secs(3600),
        })
        .map_err(anyhow::Error::msg)?;
    }
    let stop = watch_signals()?;

    // The API client first: a bad kubeconfig is an error before anything starts.
    let (client, kubeconfig) = match &opts.kubeconfig {
        Some(path) => {
            let kubeconfig = load_kubeconfig(path).map_err(anyhow::Error::msg)?;
            let client = Client::new(&kubeconfig, client_options.clone())
                .map_err(|e| anyhow::anyhow!("--kubeconfig {}: {e}", path.display()))?;
            info!("API server {} (node {node:?})", client.server());
            (Some(client), Some(kubeconfig))
        }
        None => (None, None),
    };

    let Some((remote, runtime_name)) = connect_runtime(&opts, &stop)? else {
        return Ok(!opts.runonce);
    };
    let remote = Arc::new(remote);

    // The node-status thread owns the node state; the rest read snapshots.
    let (node_state_writer, node_state) = tinylet::node::state::publish(initial_node_state(
        &node,
        &opts.root_dir,
        opts.max_pods,
        &opts.node_labels,
        &opts.kube_reserved,
        &opts.system_reserved,
        tinylet::eviction::hard_value(&opts.eviction, Signal::MemoryAvailable),
        tinylet::eviction::hard_value(&opts.eviction, Signal::NodeFsAvailable),
    ));
    let host_ip = tinylet::node::machine::node_addresses(opts.node_ip, &node)
        .ok()
        .and_then(|a| {
            a.into_iter()
                .find(|(t, _)| t == "InternalIP")
                .map(|(_, a)| a)
        });
    let (_events, recorder) = match &client {
        Some(c) => {
            let (b, r) = EventBroadcaster::start(Box::new(c.clone()), "kubelet", &node)
                .context("starting the event thread")?;
            (Some(b), r)
        }
        None => (None, EventRecorder::disabled()),
    };
    recorder.event(
        &ObjectRef::node(&node),
        EventType::Normal,
        "Starting",
        "Starting kubelet.".to_string(),
    );
    // Renewing the client certificate TLS bootstrap keeps. The thread ends
    // when this returns (its files are written whole).
    let mut _rotation_stop = None;
    if let (true, Some(c), Some(kc)) = (opts.rotate_certificates, &client, &kubeconfig) {
        use tinylet::certificate::{self, rotation::Kind, rotation::Rotation, store::Store};
        let store = Store::new(&opts.cert_dir(), certificate::CLIENT_PAIR);
        match certificate::managed(kc, &store) {
            Ok(()) => {
                let (stop_tx, stop_rx) = bounded::<()>(1);
                let user = c.clone();
                Rotation {
                    store,
                    spec: certificate::Spec::client(&node),
                    kind: Kind::Client {
                        bootstrap_kubeconfig: opts.bootstrap_kubeconfig.clone(),
                        client_options: client_options.clone(),
                    },
                    client: c.clone(),
                    on_issued: Box::new(move |p| {
                        user.set_client_certificate(&p.cert_pem, &p.key_pem)
                    }),
                    backoff: (Duration::from_secs(2), Duration::from_secs(300)),
                    wait: Duration::from_secs(900),
                    recorder: recorder.clone(),
                }
                .start(stop_rx)
                .context("starting the certificate rotation thread")?
                .detach();
                _rotation_stop = Some(stop_tx);
            }
            Err(why) => {
                warn!("--rotate-certificates: {why}; the client certificate is not rotated")
            }
        }
    }
    let (_status_manager, reporter) = match &client {
        Some(c) => {
            let (m, r) = StatusManager::start(c.clone(), node_state.clone(), node.clone())
                .context("starting the status manager")?;
            (Some(m), r)
        }
        None => (None, StatusReporter::standalone()),
    };
    let probe_results = Arc::new(ProbeResults::default());
    let mut runtime = RuntimeManager::new(
        remote.clone(),
        remote.clone(),
        opts.root_dir.clone(),
        opts.pod_logs_dir.clone(),
    )
    .with_recorder(recorder.clone())
    .with_max_dead_per_container(opts.max_dead_per_container)
    .with_node(
        NodeSettings {
            cluster_dns: opts.cluster_dns.iter().map(|ip| ip.to_string()).collect(),
            cluster_domain: opts.cluster_domain.clone(),
            resolv_conf: opts.resolv_conf.clone(),
            host_ips: host_ip.iter().cloned().collect(),
            seccomp_profile_root: opts.root_dir.join("seccomp"),
            seccomp_default: opts.seccomp_default,
            cgroups_per_qos: opts.cgroups_per_qos,
            cgroup_driver: opts.cgroup_driver,
            pod_pids_limit: opts.pod_pids_limit,
            memory_capacity: i64::try_from(
                tinylet::node::machine::read_machine_info().memory_capacity,
            )
            .unwrap_or(i64::MAX),
        },
        {
            let node_state = node_state.clone();
            Box::new(move || NodeAllocatable::from_map(&node_state.read().allocatable))
        },
    )
    .with_probe_results(probe_results.clone())
    .with_startup_results(probe_results.clone())
    .with_image_options(ImageOptions {
        serialize_pulls: opts.serialize_image_pulls,
        registry_qps: opts.registry_qps,
        registry_burst: opts.registry_burst,
    });
    // Capacity: when full, the prober keeps the pod's UID and sends it again
    // 100 ms later; nothing is lost and the prober never blocks. The object
    // manager sends here too (a pod whose Secret or ConfigMap changed); when
    // full, its pods get the change at their next periodic resync.
    let (probe_tx, probe_rx) = bounded(UPDATES_CAPACITY);
    let objects: Option<Arc<dyn ObjectSource>> = client.as_ref().map(|c| {
        let state = node_state.clone();
        let objects: Arc<dyn ObjectSource> = Arc::new(
            ObjectManager::new(
                Arc::new(ApiObjects::new(c.clone())),
                opts.change_detection,
                Some(Arc::new(ApiWatcher::new(c.clone()))),
                Box::new(move || state.read().object_ttl.unwrap_or(objects::DEFAULT_TTL)),
                Some(probe_tx.clone()),
            )
            .with_overflow_source(Arc::new(ApiObjects::new(c.with_own_limiter())))
            .with_recorder(recorder.clone()),
        );
        objects
    });
    // env's ConfigMaps and Secrets are read from the apiserver through the
    // object manager (watched, as the volumes'), imagePullSecrets through it
    // too but with a GET at each pull (no pod registers them), and service
    // variables come from its Services; a standalone node has none of them.
    let services = client
        .as_ref()
        .map(|_| Arc::new(tinylet::runtime::services::Services::default()));
    let _services_reflector = match (&client, &services) {
        (Some(c), Some(services)) => {
            runtime = runtime
                .with_pull_secrets(match &objects {
                    Some(o) => o.clone(),
                    None => Arc::new(ApiObjects::new(c.clone())),
                })
                .with_services(services.clone());
            Some(
                tinylet::runtime::services::start(c.clone(), services.clone())
                    .context("starting the Services reflector")?,
            )
        }
        _ => None,
    };
    let runtime = Arc::new(runtime);
    // Run-once mode leaves images alone: it only starts its pods.
    // The image-gc thread also serves the eviction manager's reclaim, so
    // it runs with image GC off too (without its periodic passes).
    let image_gc = if !opts.runonce {
        let gc = ImageGc::new(
            remote.clone(),
            remote.clone(),
            opts.image_gc,
            recorder.clone(),
            &node,
        );
        Some(image_gc::start(gc, opts.image_gc.enabled()).context("starting the image GC thread")?)
    } else {
        None
    };
    let pressure = Arc::new(tinylet::eviction::State::default());
    // Which containers run, the log manager learns from the PLEG's relists.
    let cache = PodCache::new();
    let seen = cache.clone();
    let _log_rotation = tinylet::logs::rotate::start(
        remote.clone(),
        opts.container_log_max_size,
        opts.container_log_max_files,
        Box::new(move || seen.running_container_ids()),
    )
    .context("starting the container log manager thread")?;
    let allocatable = NodeAllocatable::from_map(&node_state.read().allocatable);
    let volume_manager = VolumeManager::new(
        opts.root_dir.clone(),
        objects.clone(),
        allocatable,
        recorder.clone(),
    );
    let (_node_status, _lease) = match &client {
        Some(c) => {
            // Upstream's heartbeat client: unthrottled, and a request ends
            // after the shorter of the status update period and the lease
            // duration, so a silent apiserver is noticed within one period;
            // never under 5 s, so that a slow answer on a loaded machine is
            // not taken for an outage.
            let heartbeat_timeout = opts
                .node_status_update_frequency
                .min(Duration::from_secs(u64::from(
                    opts.node_lease_duration_seconds,
                )))
                .max(Duration::from_secs(5));
            let heartbeats = c.for_heartbeats(heartbeat_timeout);
            // The lease thread tells the node-status thread of each
            // heartbeat recovery; when full, the one waiting stands for it.
            let (recovered_tx, recovered_rx) = bounded(1);
            let status = NodeStatusController::start(
                heartbeats.clone(),
                remote.clone(),
                remote.clone(),
                NodeConfig {
                    name: node.clone(),
                    register: opts.register_node,
                    labels: opts.node_labels.clone(),
                    taints: opts.register_with_taints.clone(),
                    update_frequency: opts.node_status_update_frequency,
                    report_frequency: opts.node_status_report_frequency,
                    max_pods: opts.max_pods,
                    kube_reserved: opts.kube_reserved.clone(),
                    system_reserved: opts.system_reserved.clone(),
                    node_ip: opts.node_ip,
                    root_dir: opts.root_dir.clone(),
                    kubelet_port: opts.listeners().main.map_or(0, |a| a.port()),
                    eviction_hard_memory: tinylet::eviction::hard_value(
                        &opts.eviction,
                        Signal::MemoryAvailable,
                    )
                    .to_string(),
                    eviction_hard_nodefs: tinylet::eviction::hard_value(
                        &opts.eviction,
                        Signal::NodeFsAvailable,
                    )
                    .to_string(),
                    pressure: (!opts.runonce).then(|| pressure.clone()),
                },
                node_state_writer,
                recovered_rx,
                recorder.clone(),
            )
            .context("starting the node status thread")?;
            let lease = LeaseController::start(
                heartbeats,
                node.clone(),
                opts.node_lease_duration_seconds,
                node_state.clone(),
                recovered_tx,
            )
            .context("starting the node lease thread")?;
            (Some(status), Some(lease))
        }
        None => (None, None),
    };

    let health = Arc::new(tinylet::health::Health::new(opts.sync_frequency));
    let pod_view = Arc::new(PodView::default());
    // The eviction manager hands its evictions to the sync loop, one at a
    // time: it waits for each pod's cleanup anyway.
    let (eviction_tx, eviction_rx) = crossbeam_channel::bounded(1);
    let _eviction_manager = if opts.runonce {
        None
    } else {
        let thresholds = tinylet::eviction::thresholds(&opts.eviction)
            .map_err(|e| anyhow::anyhow!("eviction thresholds: {e}"))?;
        Some(
            tinylet::eviction::manager::EvictionManager::start(
                tinylet::eviction::manager::Config {
                    thresholds,
                    transition_period: opts.eviction.pressure_transition_period,
                    max_pod_grace_period: opts.eviction.max_pod_grace_period,
                    root_dir: opts.root_dir.clone(),
                    logs_dir: opts.pod_logs_dir.clone(),
                    interval: tinylet::eviction::MONITORING_INTERVAL,
                    log_max_size: opts.container_log_max_size,
                    log_max_files: opts.container_log_max_files,
                },
                remote.clone(),
                remote.clone(),
                image_gc.as_ref().map(|g| g.handle()),
                {
                    let view = pod_view.clone();
                    Box::new(move || view.pods())
                },
                pressure.clone(),
                eviction_tx,
            )
            .context("starting the eviction manager thread")?,
        )
    };
    let running_pods = Arc::new(RunningPods::default());
    let (_server, serving_cert) = start_server(
        &opts,
        &node,
        State {
            health: health.clone(),
            pods: pod_view.clone(),
            statuses: reporter.clone(),
            running: running_pods.clone(),
            cache: cache.clone(),
            configz: tinylet::server::configz(&opts),
            auth: tinylet::server::auth::Auth::new(
                tinylet::server::auth::AuthConfig {
                    node_name: node.clone(),
                    ..opts.auth.clone()
                },
                client.clone(),
            ),
            runtime: remote.clone(),
            images: remote.clone(),
            node_name: node.clone(),
            root_dir: opts.root_dir.clone(),
            logs_dir: opts.pod_logs_dir.clone(),
            sessions: tinylet::server::sessions::Sessions::new(opts.streaming_idle_timeout),
        },
    )?;
    // serverTLSBootstrap: a serving certificate from the cluster's signer,
    // in use as soon as it is issued; until then the pair the server has.
    let mut _serving_stop = None;
    if let (true, Some(c), Some(current)) = (opts.server_tls_bootstrap, &client, serving_cert) {
        use tinylet::certificate::{rotation::Kind, rotation::Rotation, store::Store, Spec};
        let mut dns = Vec::new();
        let mut ips = Vec::new();
        for (kind, addr) in
            tinylet::node::machine::node_addresses(opts.node_ip, &node).unwrap_or_default()
        {
            match (kind.as_str(), addr.parse::<std::net::IpAddr>()) {
                ("InternalIP" | "ExternalIP", Ok(ip)) if !ips.contains(&ip) => ips.push(ip),
                ("Hostname" | "InternalDNS" | "ExternalDNS", Err(_)) if !dns.contains(&addr) => {
                    dns.push(addr)
                }
                _ => {}
            }
        }
        // At least one name, as the serving signer wants: the node's.
        if dns.is_empty() && ips.is_empty() {
            dns.push(node.clone());
        }
        let (stop_tx, stop_rx) = bounded::<()>(1);
        Rotation {
            store: Store::new(&opts.cert_dir(), tinylet::certificate::SERVING_PAIR),
            spec: Spec::serving(&node, dns, ips),
            kind: Kind::Serving,
            client: c.clone(),
            on_issued: Box::new(move |p| current.set_pem(&p.cert_pem, &p.key_pem)),
            backoff: (Duration::from_secs(2), Duration::from_secs(300)),
            wait: Duration::from_secs(900),
            recorder: recorder.clone(),
        }
        .start(stop_rx)
        .context("starting the serving certificate thread")?
        .detach();
        _serving_stop = Some(stop_tx);
    }
    let (pleg_tx, pleg_rx) = bounded(EVENTS_CAPACITY);
    let (config, updates) = PodConfig::new(NotificationMode::Incremental);
    // Checkpointed API pods come first, before any source can speak. They
    // neither register nor mark the API source: housekeeping waits for the
    // sources configured below, and the API source (once there is one)
    // decides about them with its first SET.
    if let Some(dir) = opts
        .bootstrap_checkpoint_path
        .as_ref()
        .filter(|_| !opts.runonce)
    {
        match load_checkpoints(dir) {
            Ok(found) if !found.pods.is_empty() => {
                if client.is_some() {
                    info!(
                        "restoring {} pod(s) from checkpoints in {} until the API server answers",
                        found.pods.len(),
                        dir.display()
                    );
                } else {
                    warn!(
                        "restoring {} pod(s) from checkpoints in {}; no API source is configured, \
                         so nothing will update or remove them",
                        found.pods.len(),
                        dir.display()
                    );
                }
                if let Some(services) = &services {
                    services.restored(found.pods.iter().filter_map(|p| p.metadata.uid.clone()));
                }
                config.restore(API_SOURCE, found.pods.into_iter().map(Arc::new).collect());
            }
            Ok(_) => {}
            Err(e) => error!(
                "--bootstrap-checkpoint-path {}: cannot list checkpoints: {e}; none restored",
                dir.display()
            ),
        }
    }
    // The sources housekeeping waits for: every one configured here.
    let mut sources: Vec<&'static str> = Vec::new();
    // With --runonce the sources send to this channel instead, which gives
    // their first SET once; they are stopped after it.
    let (once_tx, once_rx) = bounded(4);
    let source_channel = |source: &str| match opts.runonce {
        true => once_tx.clone(),
        false => config.channel(source),
    };
    let _file_source = match &opts.pod_manifest_path {
        Some(path) => {
            sources.push(FILE_SOURCE);
            Some(
                FileSource::start(
                    path.clone(),
                    node.clone(),
                    opts.file_check_frequency,
                    source_channel(FILE_SOURCE),
                )
                .with_context(|| format!("starting the file source for {}", path.display()))?,
            )
        }
        None => None,
    };
    let _http_source = match &opts.manifest_url {
        Some(url) => {
            sources.push(HTTP_SOURCE);
            Some(
                HttpSource::start(
                    url.clone(),
                    opts.manifest_url_headers.clone(),
                    node.clone(),
                    opts.http_check_frequency,
                    source_channel(HTTP_SOURCE),
                )
                .with_context(|| format!("--manifest-url {url}"))?,
            )
        }
        None => None,
    };
    // The sync loop's admission decisions, so that only admitted pods are
    // checkpointed.
    let admissions = Arc::new(tinylet::config::checkpoint::Admissions::default());
    let _api_source = match &client {
        Some(c) => {
            sources.push(API_SOURCE);
            Some(
                ApiSource::start(
                    c.clone(),
                    &node,
                    config.channel(API_SOURCE),
                    opts.bootstrap_checkpoint_path.clone(),
                    admissions.clone(),
                )
                .context("starting the API server pod source")?,
            )
        }
        None => None,
    };
    let once_pods = if opts.runonce {
        // Every source's first list (the HTTP source's first poll has its
        // request deadline), then no more watching.
        let wait = tinylet::config::http::HTTP_REQUEST_TIMEOUT + Duration::from_secs(5);
        let sets = tinylet::runonce::first_sets(&once_rx, &sources, wait);
        drop(_file_source);
        drop(_http_source);
        let mut pods = Vec::new();
        for set in sets.map_err(anyhow::Error::msg)? {
            pods.extend(set.pods.iter().cloned());
            let source = set.source.clone();
            config
                .channel(&source)
                .send(set)
                .map_err(|_| anyhow::anyhow!("the pod config stopped"))?;
        }
        info!("runonce: starting {} pod(s)", pods.len());
        Some(pods)
    } else {
        None
    };
    let pleg = Pleg::start_with(
        runtime.clone(),
        cache.clone(),
        RELIST_PERIOD,
        pleg_tx,
        Some(health.clone()),
        Some(running_pods),
    )
    .context("starting the PLEG")?;

    let prober = Prober::start(
        runtime.clone(),
        probe_results,
        recorder.clone(),
        Some(Box::new(reporter.clone())),
        probe_tx,
        // Every pod the node may hold gets its share of runners.
        Limits::for_pods(usize::try_from(opts.max_pods).unwrap_or(usize::MAX)),
    )
    .context("starting the prober")?;
    // Capacity: a worker blocks on a full channel, which only delays its exit.
    let (done_tx, done_rx) = bounded(128);
    let queue = Arc::new(WorkQueue::default());
    let workers = PodWorkers::new(
        runtime,
        cache.clone(),
        queue.clone(),
        opts.sync_frequency,
        done_tx,
    )
    .with_status(reporter.clone(), host_ip, runtime_name)
    .with_volumes(Arc::new(volume_manager))
    .with_prober(prober.handle());
    let config = Arc::new(config);
    let ready_config = config.clone();
    // Run-once mode never removes what no source wants: it only starts.
    let runonce = opts.runonce;
    let sources_ready = Box::new(move || !runonce && ready_config.seen_all_sources(&sources));
    let allow_privileged = opts.allow_privileged;
    // Checked when the flags were read; an error here cannot happen.
    let sysctls = Arc::new(
        tinylet::sysctl::Allowlist::new(&opts.allowed_unsafe_sysctls)
            .map_err(|e| anyhow::anyhow!("flag --allowed-unsafe-sysctls: {e}"))?,
    );
    let (monitor, stop) = match once_pods {
        Some(pods) => {
            let (m, stop) = tinylet::runonce::Monitor::start(
                pods.clone(),
                reporter.clone(),
                opts.runonce_timeout,
                stop,
            )
            .context("starting the runonce thread")?;
            (Some((m, pods)), stop)
        }
        None => (None, stop),
    };
    let kubelet = Kubelet::new(
        workers,
        cache,
        queue,
        sources_ready,
        Inputs {
            updates,
            pleg: pleg_rx,
            worker_done: done_rx,
            probes: probe_rx,
            stop,
        },
    )
    .with_orphan_sweeper(tinylet::volume::sweeper::OrphanSweeper::new(
        opts.root_dir.clone(),
    ))
    .with_code_page_drops()
    .with_admissions(admissions)
    .with_health(health)
    .with_pod_view(pod_view)
    .with_eviction(
        pressure,
        // Without a manager (run-once) nothing is ever evicted.
        if _eviction_manager.is_some() {
            eviction_rx
        } else {
            crossbeam_channel::never()
        },
    )
    .with_cluster(
        reporter,
        recorder,
        Box::new(move || NodeInfo {
            allow_privileged,
            sysctls: sysctls.clone(),
            ..node_info(&node_state.read())
        }),
    );
    info!("started in {} ms", started.elapsed().as_millis());
    kubelet.run();
    drop(prober);
    drop(pleg);
    let mut all_run = true;
    if let Some((monitor, pods)) = monitor {
        let outcomes = monitor.outcomes();
        let mut out = String::new();
        for (pod, outcome) in pods.iter().zip(&outcomes) {
            all_run &= *outcome == tinylet::runonce::Outcome::Running;
            out.push_str(&tinylet::runonce::line(pod, outcome));
            out.push('\n');
        }
        all_run &= outcomes.len() == pods.len();
        print!("{out}");
    }
    info!("stopped");
    Ok(all_run)
}
