//! The agent: every thread a node runs, started in order from its
//! [`Options`], and the sync loop run on the calling thread until the stop
//! channel speaks (or, with `--runonce`, until its pods are decided). The
//! binary only parses the flags, sets up logging and signals, and runs an
//! [`Agent`]; whatever starts a node starts this.
//!
//! The order matters and is upstream's: TLS bootstrap before any client;
//! the runtime before anything that asks it; the status manager, the
//! object manager and the node's controllers before the pod sources; the
//! sources before the PLEG and the workers. What is started is held until
//! the sync loop returns, and dropped in the reverse order (each handle
//! stops its thread).

mod setup;
mod start;

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use crossbeam_channel::{bounded, Receiver};
use log::info;

use crate::admission::NodeInfo;
use crate::config::{FileSource, HttpSource, PodConfig};
use crate::events::{EventBroadcaster, EventRecorder, EventType, ObjectRef};
use crate::eviction::Signal;
use crate::fieldpath::NodeAllocatable;
use crate::images::gc::{self as image_gc, ImageGc};
use crate::kube::{load_kubeconfig, Client, ClientOptions};
use crate::kubelet::{Inputs, Kubelet, PodView};
use crate::node::{initial_node_state, node_info};
use crate::options::Options;
use crate::pleg::{Pleg, PodCache, RunningPods, EVENTS_CAPACITY, RELIST_PERIOD};
use crate::pod::{API_SOURCE, FILE_SOURCE, HTTP_SOURCE};
use crate::pod_workers::PodWorkers;
use crate::prober::{Limits, ProbeResults, Prober, UPDATES_CAPACITY};
use crate::server::routes::State;
use crate::status::manager::{StatusManager, StatusReporter};
use crate::volume::{objects, ApiObjects, ApiWatcher, ObjectManager, ObjectSource, VolumeManager};

/// A node agent configured by its options.
pub struct Agent {
    opts: Options,
}

impl Agent {
    pub fn new(opts: Options) -> Agent {
        Agent { opts }
    }

    /// Runs the node until a message on the channel `stop` gives (or its
    /// sender goes), or, with `--runonce`, until its pods are decided.
    /// `stop` is called once TLS bootstrap is done, so that a signal during
    /// the bootstrap still ends the process at once (nothing runs yet, and
    /// every file it writes is written whole). False: `--runonce` pods that
    /// did not all run.
    pub fn run(self, stop: impl FnOnce() -> anyhow::Result<Receiver<()>>) -> anyhow::Result<bool> {
        let opts = self.opts;
        let started = Instant::now();
        let node = setup::prepare(&opts)?;
        let client_options = client_options(&opts);
        // TLS bootstrap, before anything starts: the node has no credentials
        // of its own until the cluster issues them.
        if let (Some(bootstrap), Some(kubeconfig)) = (&opts.bootstrap_kubeconfig, &opts.kubeconfig)
        {
            crate::certificate::load_client_cert(&crate::certificate::Bootstrap {
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
        let stop = stop()?;

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

        let Some((remote, runtime_name)) = setup::connect_runtime(&opts, &stop)? else {
            return Ok(!opts.runonce);
        };
        let remote = Arc::new(remote);

        // The node-status thread owns the node state; the rest read snapshots.
        let (node_state_writer, node_state) = crate::node::state::publish(initial_node_state(
            &node,
            &opts.root_dir,
            opts.max_pods,
            &opts.node_labels,
            &opts.kube_reserved,
            &opts.system_reserved,
            crate::eviction::hard_value(&opts.eviction, Signal::MemoryAvailable),
            crate::eviction::hard_value(&opts.eviction, Signal::NodeFsAvailable),
        ));
        let host_ip = crate::node::machine::node_addresses(opts.node_ip, &node)
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
        // Renewing the client certificate TLS bootstrap keeps. The thread
        // ends when this returns (its files are written whole).
        let _rotation_stop = match (opts.rotate_certificates, &client, &kubeconfig) {
            (true, Some(c), Some(kc)) => {
                start::client_rotation(&opts, &node, c, kc, &client_options, &recorder)?
            }
            _ => None,
        };
        let (_status_manager, reporter) = match &client {
            Some(c) => {
                let (m, r) = StatusManager::start(c.clone(), node_state.clone(), node.clone())
                    .context("starting the status manager")?;
                (Some(m), r)
            }
            None => (None, StatusReporter::standalone()),
        };
        let probe_results = Arc::new(ProbeResults::default());
        let mut runtime = start::runtime_manager(
            &opts,
            &remote,
            &node_state,
            &host_ip,
            &recorder,
            &probe_results,
        );
        // Capacity: when full, the prober keeps the pod's UID and sends it
        // again 100 ms later; nothing is lost and the prober never blocks.
        // The object manager sends here too (a pod whose Secret or ConfigMap
        // changed); when full, its pods get the change at their next
        // periodic resync.
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
        // env's ConfigMaps and Secrets are read from the apiserver through
        // the object manager (watched, as the volumes'), imagePullSecrets
        // through it too but with a GET at each pull (no pod registers
        // them), and service variables come from its Services; a standalone
        // node has none of them.
        let services = client
            .as_ref()
            .map(|_| Arc::new(crate::runtime::services::Services::default()));
        let _services_reflector = match (&client, &services) {
            (Some(c), Some(services)) => {
                runtime = runtime
                    .with_pull_secrets(match &objects {
                        Some(o) => o.clone(),
                        None => Arc::new(ApiObjects::new(c.clone())),
                    })
                    .with_services(services.clone());
                Some(
                    crate::runtime::services::start(c.clone(), services.clone())
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
            Some(
                image_gc::start(gc, opts.image_gc.enabled())
                    .context("starting the image GC thread")?,
            )
        } else {
            None
        };
        let pressure = Arc::new(crate::eviction::State::default());
        // Which containers run, the log manager learns from the PLEG's relists.
        let cache = PodCache::new();
        let seen = cache.clone();
        let _log_rotation = crate::logs::rotate::start(
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
                let (status, lease) = start::node_controllers(
                    &opts,
                    &node,
                    c,
                    &remote,
                    node_state_writer,
                    &node_state,
                    &pressure,
                    &recorder,
                )?;
                (Some(status), Some(lease))
            }
            None => (None, None),
        };

        let health = Arc::new(crate::health::Health::new(opts.sync_frequency));
        let pod_view = Arc::new(PodView::default());
        // The eviction manager hands its evictions to the sync loop, one at
        // a time: it waits for each pod's cleanup anyway.
        let (eviction_tx, eviction_rx) = crossbeam_channel::bounded(1);
        let _eviction_manager = if opts.runonce {
            None
        } else {
            Some(start::eviction_manager(
                &opts,
                &remote,
                image_gc.as_ref().map(|g| g.handle()),
                &pod_view,
                &pressure,
                eviction_tx,
            )?)
        };
        let running_pods = Arc::new(RunningPods::default());
        let (_server, serving_cert) = setup::start_server(
            &opts,
            &node,
            State {
                health: health.clone(),
                pods: pod_view.clone(),
                statuses: reporter.clone(),
                running: running_pods.clone(),
                cache: cache.clone(),
                configz: crate::server::configz(&opts),
                auth: crate::server::auth::Auth::new(
                    crate::server::auth::AuthConfig {
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
                sessions: crate::server::sessions::Sessions::new(opts.streaming_idle_timeout),
            },
        )?;
        // serverTLSBootstrap: a serving certificate from the cluster's
        // signer, in use as soon as it is issued; until then the pair the
        // server has.
        let _serving_stop = match (opts.server_tls_bootstrap, &client, serving_cert) {
            (true, Some(c), Some(current)) => Some(start::serving_rotation(
                &opts, &node, c, current, &recorder,
            )?),
            _ => None,
        };
        let (pleg_tx, pleg_rx) = bounded(EVENTS_CAPACITY);
        let (config, updates) = PodConfig::new(recorder.clone());
        // Checkpointed API pods come first, before any source can speak.
        if let Some(dir) = opts
            .bootstrap_checkpoint_path
            .as_ref()
            .filter(|_| !opts.runonce)
        {
            start::restore_checkpoints(dir, &config, client.is_some(), services.as_deref());
        }
        // The sources housekeeping waits for: every one configured here.
        let mut sources: Vec<&'static str> = Vec::new();
        // With --runonce the sources send to this channel instead, which
        // gives their first SET once; they are stopped after it.
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
        // The sync loop's admission decisions, so that only admitted pods
        // are checkpointed.
        let admissions = Arc::new(crate::config::checkpoint::Admissions::default());
        let _api_source = match &client {
            Some(c) => {
                sources.push(API_SOURCE);
                Some(
                    crate::config::ApiSource::start(
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
            // Every source's first list (the HTTP source's first poll has
            // its request deadline), then no more watching.
            let wait = crate::config::http::HTTP_REQUEST_TIMEOUT + Duration::from_secs(5);
            let sets = crate::runonce::first_sets(&once_rx, &sources, wait);
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
        // Capacity: a worker blocks on a full channel, which only delays
        // it; the sync loop drains it at every turn.
        let (reports_tx, reports_rx) = bounded(128);
        let workers = PodWorkers::new(runtime, cache.clone(), opts.sync_frequency, reports_tx)
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
            crate::sysctl::Allowlist::new(&opts.allowed_unsafe_sysctls)
                .map_err(|e| anyhow::anyhow!("flag --allowed-unsafe-sysctls: {e}"))?,
        );
        let (monitor, stop) = match once_pods {
            Some(pods) => {
                let (m, stop) = crate::runonce::Monitor::start(
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
            sources_ready,
            Inputs {
                updates,
                pleg: pleg_rx,
                worker_reports: reports_rx,
                probes: probe_rx,
                stop,
            },
        )
        .with_orphan_sweeper(crate::volume::sweeper::OrphanSweeper::new(
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
        let all_run = match monitor {
            Some((monitor, pods)) => start::report_runonce(monitor, &pods),
            None => true,
        };
        info!("stopped");
        Ok(all_run)
    }
}

/// The apiserver client's settings: the flags' QPS and burst, a 30 s
/// deadline a request, and the kubelet's User-Agent shape.
fn client_options(opts: &Options) -> ClientOptions {
    ClientOptions {
        qps: opts.kube_api_qps,
        burst: opts.kube_api_burst,
        timeout: Duration::from_secs(30),
        user_agent: format!(
            "tinylet/v{} ({}/{})",
            env!("CARGO_PKG_VERSION"),
            std::env::consts::OS,
            crate::node::machine::go_arch()
        ),
    }
}
