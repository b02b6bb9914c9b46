//! The `tinylet` binary: flags, logging, signals, and wiring of the threads.

use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use crossbeam_channel::{bounded, Receiver};
use log::{error, info, warn};

use tinylet::config::{
    load_checkpoints, FileSource, HttpSource, NotificationMode, PodConfig, API_SOURCE, FILE_SOURCE,
    HTTP_SOURCE,
};
use tinylet::cri::RemoteRuntime;
use tinylet::kubelet::{Inputs, Kubelet};
use tinylet::options::{parse_args, Command, Options, USAGE};
use tinylet::pleg::{Pleg, PodCache, EVENTS_CAPACITY, RELIST_PERIOD};
use tinylet::pod_workers::{PodWorkers, WorkQueue};
use tinylet::runtime::RuntimeManager;
use tinylet::thread::spawn_named;

fn main() -> ExitCode {
    let opts = match parse_args(std::env::args().skip(1)) {
        Ok(Command::Run(o)) => *o,
        Ok(Command::Help) => {
            print!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Ok(Command::Version) => {
            println!("tinylet {}", env!("CARGO_PKG_VERSION"));
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("tinylet: {e}\nRun 'tinylet --help' for the flags.");
            return ExitCode::from(2);
        }
    };
    init_logging(opts.verbosity);
    match run(opts) {
        Ok(()) => ExitCode::SUCCESS,
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

/// The kubelet protects itself from the OOM killer; in a container or
/// without CAP_SYS_RESOURCE that may be refused, which is not fatal.
fn protect_from_oom() {
    if let Err(e) = std::fs::write("/proc/self/oom_score_adj", "-999") {
        info!("cannot set own oom_score_adj: {e} (continuing)");
    }
}

/// Connects to the runtime, retrying with back-off until it answers or a
/// signal arrives.
fn connect_runtime(opts: &Options, stop: &Receiver<()>) -> anyhow::Result<Option<RemoteRuntime>> {
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
                return Ok(Some(runtime));
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

/// glibc gives each thread that allocates its own arena, up to 8 per core,
/// and keeps what they free: with a thread per pod that held on to ~8 MiB
/// more after 50 pods came and went. Two arenas are plenty for tinylet.
fn limit_malloc_arenas() {
    // SAFETY: mallopt only changes allocator settings; called before the
    // other threads start.
    let ok = unsafe { libc::mallopt(libc::M_ARENA_MAX, 2) };
    if ok != 1 {
        log::debug!("mallopt(M_ARENA_MAX) refused; keeping glibc's default arenas");
    }
}

fn run(opts: Options) -> anyhow::Result<()> {
    let started = Instant::now();
    limit_malloc_arenas();
    if let Some(file) = &opts.config_file {
        info!("configuration file {}", file.display());
        for field in &opts.ignored_config_fields {
            log::debug!("--config {}: ignoring field {field}", file.display());
        }
    }
    let node = node_name(&opts)?;
    if let Some(p) = &opts.pod_manifest_path {
        check_manifest_path(p)?;
    }
    std::fs::create_dir_all(&opts.root_dir)
        .with_context(|| format!("--root-dir {}: cannot create", opts.root_dir.display()))?;
    protect_from_oom();
    let stop = watch_signals()?;
    info!(
        "tinylet {} starting as node {node:?}",
        env!("CARGO_PKG_VERSION")
    );

    let Some(remote) = connect_runtime(&opts, &stop)? else {
        return Ok(());
    };
    let remote = Arc::new(remote);
    let runtime = Arc::new(RuntimeManager::new(
        remote.clone(),
        remote,
        opts.root_dir.clone(),
        opts.pod_logs_dir.clone(),
    ));

    let cache = PodCache::new();
    let (pleg_tx, pleg_rx) = bounded(EVENTS_CAPACITY);
    let (config, updates) = PodConfig::new(NotificationMode::Incremental);
    // Checkpointed API pods come first, before any source can speak. They
    // neither register nor mark the API source: housekeeping waits for the
    // sources configured below, and the API source (once there is one)
    // decides about them with its first SET.
    if let Some(dir) = &opts.bootstrap_checkpoint_path {
        match load_checkpoints(dir) {
            Ok(found) if !found.pods.is_empty() => {
                warn!(
                    "restoring {} pod(s) from checkpoints in {}; no API source is configured, \
                     so nothing will update or remove them",
                    found.pods.len(),
                    dir.display()
                );
                config.restore(API_SOURCE, found.pods);
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
    let _file_source = match &opts.pod_manifest_path {
        Some(path) => {
            sources.push(FILE_SOURCE);
            Some(
                FileSource::start(
                    path.clone(),
                    node.clone(),
                    opts.file_check_frequency,
                    config.channel(FILE_SOURCE),
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
                    config.channel(HTTP_SOURCE),
                )
                .with_context(|| format!("--manifest-url {url}"))?,
            )
        }
        None => None,
    };
    let pleg = Pleg::start(runtime.clone(), cache.clone(), RELIST_PERIOD, pleg_tx)
        .context("starting the PLEG")?;

    // Capacity: a worker blocks on a full channel, which only delays its exit.
    let (done_tx, done_rx) = bounded(128);
    let queue = Arc::new(WorkQueue::default());
    let workers = PodWorkers::new(
        runtime,
        cache.clone(),
        queue.clone(),
        opts.sync_frequency,
        done_tx,
    );
    let config = Arc::new(config);
    let ready_config = config.clone();
    let sources_ready = Box::new(move || ready_config.seen_all_sources(&sources));
    let kubelet = Kubelet::new(
        workers,
        cache,
        queue,
        sources_ready,
        Inputs {
            updates,
            pleg: pleg_rx,
            worker_done: done_rx,
            stop,
        },
    );
    info!("started in {} ms", started.elapsed().as_millis());
    kubelet.run();
    drop(pleg);
    info!("stopped");
    Ok(())
}
