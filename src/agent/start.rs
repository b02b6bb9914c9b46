//! The agent's parts that take more than a line to start: the runtime
//! manager with the node's settings, the node's status and lease
//! controllers, the eviction manager, the two certificate rotations, the
//! checkpointed pods, and run-once's report.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use crossbeam_channel::{bounded, Sender};
use log::{error, info, warn};

use k8s_openapi::api::core::v1::Pod;

use crate::config::{load_checkpoints, PodConfig};
use crate::cri::RemoteRuntime;
use crate::events::EventRecorder;
use crate::eviction::manager::{Eviction, EvictionManager};
use crate::eviction::Signal;
use crate::fieldpath::NodeAllocatable;
use crate::images::gc::ImageGcHandle;
use crate::images::ImageOptions;
use crate::kube::KubeConfig;
use crate::kube::{Client, ClientOptions};
use crate::kubelet::PodView;
use crate::node::lease::LeaseController;
use crate::node::state::{NodeStateReader, NodeStateWriter};
use crate::node::status::{NodeConfig, NodeStatusController};
use crate::options::Options;
use crate::pod::API_SOURCE;
use crate::prober::ProbeResults;
use crate::runtime::services::Services;
use crate::runtime::{NodeSettings, RuntimeManager};

/// Starts renewing the client certificate TLS bootstrap keeps, when the
/// kubeconfig names the cert dir's pair; the sender stops the thread when
/// dropped. `None` (with a warning) when the pair is not the cert dir's.
pub(super) fn client_rotation(
    opts: &Options,
    node: &str,
    client: &Client,
    kubeconfig: &KubeConfig,
    client_options: &ClientOptions,
    recorder: &EventRecorder,
) -> anyhow::Result<Option<Sender<()>>> {
    use crate::certificate::{self, rotation::Kind, store::Store};
    let store = Store::new(&opts.cert_dir(), certificate::CLIENT_PAIR);
    if let Err(why) = certificate::managed(kubeconfig, &store) {
        warn!("--rotate-certificates: {why}; the client certificate is not rotated");
        return Ok(None);
    }
    let user = client.clone();
    let stop = rotate(
        store,
        certificate::Spec::client(node),
        Kind::Client {
            bootstrap_kubeconfig: opts.bootstrap_kubeconfig.clone(),
            client_options: client_options.clone(),
        },
        Box::new(move |p| user.set_client_certificate(&p.cert_pem, &p.key_pem)),
        client,
        recorder,
    )
    .context("starting the certificate rotation thread")?;
    Ok(Some(stop))
}

/// Starts the serving certificate's requests and renewals
/// (serverTLSBootstrap) for the node's names and addresses; the sender
/// stops the thread when dropped.
pub(super) fn serving_rotation(
    opts: &Options,
    node: &str,
    client: &Client,
    current: Arc<crate::server::tls::ServingCert>,
    recorder: &EventRecorder,
) -> anyhow::Result<Sender<()>> {
    use crate::certificate::{rotation::Kind, store::Store, Spec};
    let mut dns = Vec::new();
    let mut ips = Vec::new();
    for (kind, addr) in crate::node::machine::node_addresses(opts.node_ip, node).unwrap_or_default()
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
        dns.push(node.to_string());
    }
    rotate(
        Store::new(&opts.cert_dir(), crate::certificate::SERVING_PAIR),
        Spec::serving(node, dns, ips),
        Kind::Serving,
        Box::new(move |p| current.set_pem(&p.cert_pem, &p.key_pem)),
        client,
        recorder,
    )
    .context("starting the serving certificate thread")
}

/// Starts a pair's rotation thread: requests every 2 s to 5 min apart
/// after a failure, each waited for up to 15 minutes. The sender stops the
/// thread when dropped.
fn rotate(
    store: crate::certificate::store::Store,
    spec: crate::certificate::Spec,
    kind: crate::certificate::rotation::Kind,
    on_issued: crate::certificate::rotation::OnIssued,
    client: &Client,
    recorder: &EventRecorder,
) -> std::io::Result<Sender<()>> {
    let (stop_tx, stop_rx) = bounded::<()>(1);
    crate::certificate::rotation::Rotation {
        store,
        spec,
        kind,
        client: client.clone(),
        on_issued,
        backoff: (Duration::from_secs(2), Duration::from_secs(300)),
        wait: Duration::from_secs(900),
        recorder: recorder.clone(),
    }
    .start(stop_rx)?
    .detach();
    Ok(stop_tx)
}

/// The runtime manager with the node's settings (DNS, cgroups, seccomp,
/// the PID limit), its allocatable read from the node state, the probe
/// results and the image pull settings.
pub(super) fn runtime_manager(
    opts: &Options,
    remote: &Arc<RemoteRuntime>,
    node_state: &NodeStateReader,
    host_ip: &Option<String>,
    recorder: &EventRecorder,
    probe_results: &Arc<ProbeResults>,
) -> RuntimeManager {
    let node_state = node_state.clone();
    RuntimeManager::new(
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
                crate::node::machine::read_machine_info().memory_capacity,
            )
            .unwrap_or(i64::MAX),
        },
        Box::new(move || NodeAllocatable::from_map(&node_state.read().allocatable)),
    )
    .with_probe_results(probe_results.clone())
    .with_startup_results(probe_results.clone())
    .with_image_options(ImageOptions {
        serialize_pulls: opts.serialize_image_pulls,
        registry_qps: opts.registry_qps,
        registry_burst: opts.registry_burst,
    })
}

/// Starts the node-status thread (registration, status, pressure
/// conditions; it owns the node state) and the lease thread, on the
/// heartbeat client.
#[allow(clippy::too_many_arguments)]
pub(super) fn node_controllers(
    opts: &Options,
    node: &str,
    client: &Client,
    remote: &Arc<RemoteRuntime>,
    state_writer: NodeStateWriter,
    state: &NodeStateReader,
    pressure: &Arc<crate::eviction::State>,
    recorder: &EventRecorder,
) -> anyhow::Result<(NodeStatusController, LeaseController)> {
    // Upstream's heartbeat client: unthrottled, and a request ends after
    // the shorter of the status update period and the lease duration, so a
    // silent apiserver is noticed within one period; never under 5 s, so
    // that a slow answer on a loaded machine is not taken for an outage.
    let heartbeat_timeout = opts
        .node_status_update_frequency
        .min(Duration::from_secs(u64::from(
            opts.node_lease_duration_seconds,
        )))
        .max(Duration::from_secs(5));
    let heartbeats = client.for_heartbeats(heartbeat_timeout);
    // The lease thread tells the node-status thread of each heartbeat
    // recovery; when full, the one waiting stands for it.
    let (recovered_tx, recovered_rx) = bounded(1);
    let status = NodeStatusController::start(
        heartbeats.clone(),
        remote.clone(),
        remote.clone(),
        NodeConfig {
            name: node.to_string(),
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
            eviction_hard_memory: crate::eviction::hard_value(
                &opts.eviction,
                Signal::MemoryAvailable,
            )
            .to_string(),
            eviction_hard_nodefs: crate::eviction::hard_value(
                &opts.eviction,
                Signal::NodeFsAvailable,
            )
            .to_string(),
            pressure: (!opts.runonce).then(|| pressure.clone()),
        },
        state_writer,
        recovered_rx,
        recorder.clone(),
    )
    .context("starting the node status thread")?;
    let lease = LeaseController::start(
        heartbeats,
        node.to_string(),
        opts.node_lease_duration_seconds,
        state.clone(),
        recovered_tx,
    )
    .context("starting the node lease thread")?;
    Ok((status, lease))
}

/// Starts the eviction manager on the flags' thresholds; it ranks the pods
/// the pod view lists and hands its evictions to `evictions`.
pub(super) fn eviction_manager(
    opts: &Options,
    remote: &Arc<RemoteRuntime>,
    image_gc: Option<ImageGcHandle>,
    pod_view: &Arc<PodView>,
    pressure: &Arc<crate::eviction::State>,
    evictions: Sender<Eviction>,
) -> anyhow::Result<EvictionManager> {
    let thresholds = crate::eviction::thresholds(&opts.eviction)
        .map_err(|e| anyhow::anyhow!("eviction thresholds: {e}"))?;
    let view = pod_view.clone();
    EvictionManager::start(
        crate::eviction::manager::Config {
            thresholds,
            transition_period: opts.eviction.pressure_transition_period,
            max_pod_grace_period: opts.eviction.max_pod_grace_period,
            root_dir: opts.root_dir.clone(),
            logs_dir: opts.pod_logs_dir.clone(),
            interval: crate::eviction::MONITORING_INTERVAL,
            log_max_size: opts.container_log_max_size,
            log_max_files: opts.container_log_max_files,
        },
        remote.clone(),
        remote.clone(),
        image_gc,
        Box::new(move || view.pods()),
        pressure.clone(),
        evictions,
    )
    .context("starting the eviction manager thread")
}

/// Hands the pod config the API pods checkpointed in `dir`. They neither
/// register nor mark the API source: housekeeping waits for the sources
/// configured after this, and the API source (once there is one) decides
/// about them with its first SET. A directory that cannot be listed
/// restores nothing, with an error.
pub(super) fn restore_checkpoints(
    dir: &Path,
    config: &PodConfig,
    has_client: bool,
    services: Option<&Services>,
) {
    match load_checkpoints(dir) {
        Ok(found) if !found.pods.is_empty() => {
            if has_client {
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
            if let Some(services) = services {
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

/// Prints a line per run-once pod with its outcome; true when every pod
/// runs.
pub(super) fn report_runonce(monitor: crate::runonce::Monitor, pods: &[Arc<Pod>]) -> bool {
    let outcomes = monitor.outcomes();
    let mut all_run = outcomes.len() == pods.len();
    let mut out = String::new();
    for (pod, outcome) in pods.iter().zip(&outcomes) {
        all_run &= *outcome == crate::runonce::Outcome::Running;
        out.push_str(&crate::runonce::line(pod, outcome));
        out.push('\n');
    }
    print!("{out}");
    all_run
}
