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
pub mod routes;
pub mod sessions;
pub mod stream;
pub mod tls;

use std::net::{SocketAddr, TcpListener};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};

use crate::options::Options;

pub use poll::Server;

/// Binds `addr`; a port in use (or any other error) names the flag.
fn bind(addr: SocketAddr, flag: &str) -> Result<TcpListener, String> {
    TcpListener::bind(addr).map_err(|e| format!("{flag} {addr}: cannot listen: {e}"))
}

/// Opens the listeners `opts` asks for and starts the server over them;
/// `None` when none is asked for. `tls` is the main port's configuration
/// (required when it listens).
pub fn start(
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

/// A duration as Go prints it: `1m0s`, `20s`, `1h0m0s`, `500ms`.
pub(crate) fn go_duration(d: Duration) -> String {
    let total = d.as_secs();
    let ms = d.subsec_millis();
    if total == 0 {
        return if ms == 0 {
            "0s".into()
        } else {
            format!("{ms}ms")
        };
    }
    let (h, m, s) = (total / 3600, total / 60 % 60, total % 60);
    let secs = if ms == 0 {
        format!("{s}s")
    } else {
        format!("{s}.{}s", format!("{ms:03}").trim_end_matches('0'))
    };
    match (h, m) {
        (0, 0) => secs,
        (0, m) => format!("{m}m{secs}"),
        (h, m) => format!("{h}h{m}m{secs}"),
    }
}

/// A byte count as the API writes a quantity: `10Mi`, `512Ki`, or bytes.
fn binary_quantity(n: u64) -> String {
    const UNITS: [(u64, &str); 3] = [(1 << 30, "Gi"), (1 << 20, "Mi"), (1 << 10, "Ki")];
    match UNITS.iter().find(|(u, _)| n >= *u && n.is_multiple_of(*u)) {
        Some((u, suffix)) => format!("{}{suffix}", n / u),
        None => n.to_string(),
    }
}

/// `/configz`: the effective settings under upstream's
/// KubeletConfiguration field names, for the fields tinylet has.
pub fn configz(opts: &Options) -> String {
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
            "syncFrequency": go_duration(opts.sync_frequency),
            "fileCheckFrequency": go_duration(opts.file_check_frequency),
            "httpCheckFrequency": go_duration(opts.http_check_frequency),
            "address": opts.address.to_string(),
            "port": opts.port,
            "readOnlyPort": opts.read_only_port,
            "healthzPort": opts.healthz_port,
            "healthzBindAddress": opts.healthz_bind_address.to_string(),
            "tlsCertFile": path(&opts.tls_cert_file),
            "tlsPrivateKeyFile": path(&opts.tls_private_key_file),
            "tlsMinVersion": opts.tls_min_version.name(),
            "streamingConnectionIdleTimeout": go_duration(opts.streaming_idle_timeout),
            "authentication": {
                "x509": {"clientCAFile": path(&opts.client_ca_file)},
                "webhook": {
                    "enabled": opts.auth.token_webhook,
                    "cacheTTL": go_duration(opts.auth.token_cache_ttl),
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
                    "cacheAuthorizedTTL": go_duration(opts.auth.authorized_ttl),
                    "cacheUnauthorizedTTL": go_duration(opts.auth.unauthorized_ttl),
                },
            },
            "containerLogMaxSize": binary_quantity(opts.container_log_max_size),
            "containerLogMaxFiles": opts.container_log_max_files,
            "registryPullQPS": opts.registry_qps,
            "registryBurst": opts.registry_burst,
            "clusterDomain": opts.cluster_domain,
            "clusterDNS": opts.cluster_dns.iter().map(|ip| ip.to_string()).collect::<Vec<_>>(),
            "nodeStatusUpdateFrequency": go_duration(opts.node_status_update_frequency),
            "nodeStatusReportFrequency": go_duration(opts.node_status_report_frequency),
            "nodeLeaseDurationSeconds": opts.node_lease_duration_seconds,
            "imageMinimumGCAge": go_duration(opts.image_gc.min_age),
            "imageGCHighThresholdPercent": opts.image_gc.high_threshold,
            "imageGCLowThresholdPercent": opts.image_gc.low_threshold,
            "cgroupsPerQOS": opts.cgroups_per_qos,
            "cgroupDriver": format!("{:?}", opts.cgroup_driver).to_lowercase(),
            "runtimeRequestTimeout": go_duration(opts.runtime_request_timeout),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_counts_print_as_quantities() {
        assert_eq!(binary_quantity(10 << 20), "10Mi");
        assert_eq!(binary_quantity(1024), "1Ki");
        assert_eq!(binary_quantity(1536), "1536");
        assert_eq!(binary_quantity(0), "0");
    }

    #[test]
    fn durations_print_as_go_does() {
        assert_eq!(go_duration(Duration::from_secs(60)), "1m0s");
        assert_eq!(go_duration(Duration::from_secs(20)), "20s");
        assert_eq!(go_duration(Duration::from_secs(3600)), "1h0m0s");
        assert_eq!(go_duration(Duration::from_millis(500)), "500ms");
        assert_eq!(go_duration(Duration::ZERO), "0s");
    }
}
