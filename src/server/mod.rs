//! The node's API (upstream's kubelet server): the HTTPS server on
//! `--port` (10250) that the apiserver calls for logs, exec, attach and
//! port-forward, Prometheus and metrics-server read, and the plain
//! health and read-only ports. It reads the node's state and the runtime,
//! and never changes a pod.
//!
//! `poll` accepts and holds connections until a whole request head is in
//! (handshakes and heads read without waiting, on one deadline each),
//! `http` serves requests on bounded workers (answers with write
//! deadlines), `conn` is a connection plain or TLS, `tls` and `cert` the
//! main port's TLS, `auth` who may ask,
//! `routes` what each path answers, `stream` the exec, attach and
//! port-forward sessions relayed to the runtime's streaming server,
//! `sessions` how many of those (and log follows) each caller may hold.

pub mod auth;
pub mod conn;
pub mod head;
pub mod http;
pub(crate) mod poll;
pub(crate) mod route;
pub(crate) mod routes;
pub(crate) mod sessions;
pub mod stream;
pub(crate) mod tls;

use std::net::{SocketAddr, TcpListener};
use std::sync::Arc;

use serde_json::{json, Value};

use crate::options::Options;

pub(crate) use poll::Server;

/// Binds `addr`; a port in use (or any other error) names the flag.
fn bind(addr: SocketAddr, flag: &str) -> Result<TcpListener, String> {
    TcpListener::bind(addr).map_err(|e| format!("{flag} {addr}: cannot listen: {e}"))
}

/// Opens the listeners `opts` asks for and starts the server over them;
/// `None` when none is asked for. `tls` is the main port's configuration
/// (required when it listens).
pub(crate) fn start(
    opts: &Options,
    tls: Option<Arc<rustls::ServerConfig>>,
    state: routes::State,
) -> Result<Option<Server>, String> {
    let want = opts.listeners();
    let mut listeners = Vec::new();
    if let Some(addr) = want.main {
        let Some(tls) = tls else {
            return Err("--port: no TLS configuration".into());
        };
        listeners.push(http::Listener {
            socket: bind(addr, "--port")?,
            port: http::Port::Main,
            tls: Some(tls),
        });
    }
    if let Some(addr) = want.read_only {
        listeners.push(http::Listener {
            socket: bind(addr, "--read-only-port")?,
            port: http::Port::ReadOnly,
            tls: None,
        });
    }
    if let Some(addr) = want.healthz {
        listeners.push(http::Listener {
            socket: bind(addr, "--healthz-port")?,
            port: http::Port::Healthz,
            tls: None,
        });
    }
    if listeners.is_empty() {
        return Ok(None);
    }
    poll::start(listeners, Arc::new(state))
        .map(Some)
        .map_err(|e| format!("starting the node API server: {e}"))
}

/// `/configz`: the effective settings under upstream's
/// KubeletConfiguration field names, for the fields tinylet has.
pub(crate) fn configz(opts: &Options) -> String {
    let path = |p: &Option<std::path::PathBuf>| {
        p.as_ref()
            .map_or(Value::Null, |p| Value::String(p.display().to_string()))
    };
    let listeners = opts.listeners();
    let cfg = json!({
        "kubeletconfig": {
            "enableServer": listeners.main.is_some(),
            "staticPodPath": path(&opts.pod_manifest_path),
            "staticPodURL": opts.manifest_url,
            "syncFrequency": crate::apitime::go_duration(opts.sync_frequency),
            "fileCheckFrequency": crate::apitime::go_duration(opts.file_check_frequency),
            "httpCheckFrequency": crate::apitime::go_duration(opts.http_check_frequency),
            "address": opts.address.to_string(),
            "port": opts.port,
            "readOnlyPort": opts.read_only_port,
            "healthzPort": opts.healthz_port,
            "healthzBindAddress": opts.healthz_bind_address.to_string(),
            "tlsCertFile": path(&opts.tls_cert_file),
            "tlsPrivateKeyFile": path(&opts.tls_private_key_file),
            "tlsMinVersion": opts.tls_min_version.name(),
            "streamingConnectionIdleTimeout": crate::apitime::go_duration(opts.streaming_idle_timeout),
            "authentication": {
                "x509": {"clientCAFile": path(&opts.client_ca_file)},
                "webhook": {
                    "enabled": opts.auth.token_webhook,
                    "cacheTTL": crate::apitime::go_duration(opts.auth.token_cache_ttl),
                },
                "anonymous": {"enabled": opts.auth.anonymous},
            },
            "authorization": {
                "mode": match opts.auth.mode {
                    Some(crate::options::AuthorizationMode::AlwaysAllow) => "AlwaysAllow",
                    Some(crate::options::AuthorizationMode::Webhook) => "Webhook",
                    None => "",
                },
                "webhook": {
                    "cacheAuthorizedTTL": crate::apitime::go_duration(opts.auth.authorized_ttl),
                    "cacheUnauthorizedTTL": crate::apitime::go_duration(opts.auth.unauthorized_ttl),
                },
            },
            "containerLogMaxSize": crate::quantity::format_binary_si(i128::from(opts.container_log_max_size) * 1000),
            "containerLogMaxFiles": opts.container_log_max_files,
            "registryPullQPS": opts.registry_qps,
            "registryBurst": opts.registry_burst,
            "clusterDomain": opts.cluster_domain,
            "clusterDNS": opts.cluster_dns.iter().map(|ip| ip.to_string()).collect::<Vec<_>>(),
            "nodeStatusUpdateFrequency": crate::apitime::go_duration(opts.node_status_update_frequency),
            "nodeStatusReportFrequency": crate::apitime::go_duration(opts.node_status_report_frequency),
            "nodeLeaseDurationSeconds": opts.node_lease_duration_seconds,
            "imageMinimumGCAge": crate::apitime::go_duration(opts.image_gc.min_age),
            "imageGCHighThresholdPercent": opts.image_gc.high_threshold,
            "imageGCLowThresholdPercent": opts.image_gc.low_threshold,
            "cgroupsPerQOS": opts.cgroups_per_qos,
            "cgroupDriver": format!("{:?}", opts.cgroup_driver).to_lowercase(),
            "runtimeRequestTimeout": crate::apitime::go_duration(opts.runtime_request_timeout),
            "maxPods": opts.max_pods,
            "resolvConf": opts.resolv_conf.display().to_string(),
            "serializeImagePulls": opts.serialize_image_pulls,
            "kubeAPIQPS": opts.kube_api_qps,
            "kubeAPIBurst": opts.kube_api_burst,
            "registerNode": opts.register_node,
            "containerRuntimeEndpoint": opts.container_runtime_endpoint,
            "podLogsDir": opts.pod_logs_dir.display().to_string(),
        }
    });
    cfg.to_string()
}
