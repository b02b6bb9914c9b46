//! The settings tinylet uses, one entry each, in the order of `--help`:
//! the flag, the KubeletConfiguration field, the kind, the help text,
//! the setter and the getter (`/configz`, and the default `--help`
//! shows). `ignored::IGNORED` holds the ones accepted and ignored.

use std::path::PathBuf;

use serde_json::{json, Value};

use super::settings::Kind::*;
use super::settings::Section::*;
use super::settings::{field, flag, Setting};
use super::{log_max_files, log_max_size, AuthorizationMode, TlsMinVersion};

fn dur(d: std::time::Duration) -> Value {
    Value::String(crate::apitime::go_duration(d))
}

fn path(p: &Option<PathBuf>) -> Value {
    p.as_ref()
        .map_or(Value::Null, |p| Value::String(p.display().to_string()))
}

fn display(p: &std::path::Path) -> Value {
    Value::String(p.display().to_string())
}

fn pairs(p: &[(String, String)]) -> Value {
    let map: serde_json::Map<String, Value> = p
        .iter()
        .map(|(k, v)| (k.clone(), Value::String(v.clone())))
        .collect();
    Value::Object(map)
}

fn map(m: &std::collections::BTreeMap<String, String>) -> Value {
    json!(m)
}

pub(super) static SETTINGS: &[Setting] = &[
    // parse_args reads the file before the other flags.
    flag(
        "config",
        Path,
        General,
        "kubelet configuration file (KubeletConfiguration\nv1beta1; flags override it)",
    )
    .metavar("file")
    .put(|_, _| {}),
    flag("container-runtime-endpoint", Str, General, "CRI endpoint")
        .field("containerRuntimeEndpoint")
        .put(|o, v| o.container_runtime_endpoint = v.string())
        .get(|o| json!(o.container_runtime_endpoint))
        .shown(),
    flag(
        "pod-manifest-path",
        Path,
        General,
        "directory (or file) of static pod manifests",
    )
    .field("staticPodPath")
    .put(|o, v| o.pod_manifest_path = v.path())
    .get(|o| path(&o.pod_manifest_path)),
    flag(
        "manifest-url",
        Str,
        General,
        "URL to poll for static pods (one Pod or a PodList)",
    )
    .field("staticPodURL")
    .put(|o, v| o.manifest_url = v.nonempty())
    .get(|o| json!(o.manifest_url)),
    flag(
        "manifest-url-header",
        Headers,
        General,
        "header for --manifest-url requests; repeatable,\nor comma-separated pairs",
    )
    .field("staticPodURLHeader")
    .put(|o, v| v.merge_into(&mut o.manifest_url_headers))
    .get(|o| {
        let mut m = serde_json::Map::new();
        for (name, value) in &o.manifest_url_headers {
            let list = m.entry(name.clone()).or_insert_with(|| json!([]));
            if let Value::Array(list) = list {
                list.push(json!(value));
            }
        }
        Value::Object(m)
    }),
    flag(
        "http-check-frequency",
        Duration,
        General,
        "how often the manifest URL is polled",
    )
    .field("httpCheckFrequency")
    .zero()
    .put(|o, v| o.http_check_frequency = v.dur())
    .get(|o| dur(o.http_check_frequency))
    .shown(),
    flag(
        "bootstrap-checkpoint-path",
        Path,
        General,
        "directory of API pod checkpoints restored at start",
    )
    .put(|o, v| o.bootstrap_checkpoint_path = v.path()),
    flag(
        "hostname-override",
        Str,
        General,
        "node name to use instead of the hostname",
    )
    .put(|o, v| o.hostname_override = v.nonempty()),
    flag("root-dir", Path, General, "directory for tinylet's state")
        .put(|o, v| o.root_dir = PathBuf::from(v.string()))
        .get(|o| display(&o.root_dir))
        .shown(),
    flag(
        "pod-logs-dir",
        Path,
        General,
        "root of container log directories",
    )
    .field("podLogsDir")
    .put(|o, v| o.pod_logs_dir = PathBuf::from(v.string()))
    .get(|o| display(&o.pod_logs_dir))
    .shown(),
    flag(
        "container-log-max-size",
        Quantity,
        General,
        "a container's log is rotated (renamed, reopened by the\nruntime) once it reaches this size",
    )
    .field("containerLogMaxSize")
    .zero()
    .check(|o, v| log_max_size(&v.string()).map(|n| o.container_log_max_size = n))
    .get(|o| {
        json!(crate::quantity::format_binary_si(
            i128::from(o.container_log_max_size) * 1000
        ))
    })
    .shown(),
    flag(
        "container-log-max-files",
        U64,
        General,
        "log files kept per container, the live one included;\nolder rotated ones are gzipped (default {}, at least 2)",
    )
    .field("containerLogMaxFiles")
    .check(|o, v| log_max_files(v.uint()).map(|n| o.container_log_max_files = n))
    .get(|o| json!(o.container_log_max_files))
    .shown(),
    flag(
        "file-check-frequency",
        Duration,
        General,
        "how often the manifest path is re-listed",
    )
    .field("fileCheckFrequency")
    .zero()
    .put(|o, v| o.file_check_frequency = v.dur())
    .get(|o| dur(o.file_check_frequency))
    .shown(),
    flag(
        "sync-frequency",
        Duration,
        General,
        "how often a running pod is re-synced",
    )
    .field("syncFrequency")
    .zero()
    .put(|o, v| o.sync_frequency = v.dur())
    .get(|o| dur(o.sync_frequency))
    .shown(),
    flag(
        "runtime-request-timeout",
        Duration,
        General,
        "deadline of each CRI call",
    )
    .field("runtimeRequestTimeout")
    .zero()
    .put(|o, v| o.runtime_request_timeout = v.dur())
    .get(|o| dur(o.runtime_request_timeout))
    .shown(),
    flag(
        "max-open-files",
        PositiveU64,
        General,
        "open files tinylet may hold: its soft RLIMIT_NOFILE is\nraised to this, capped at the hard limit",
    )
    .field("maxOpenFiles")
    .zero()
    .put(|o, v| o.max_open_files = v.uint())
    .get(|o| json!(o.max_open_files))
    .shown(),
    flag(
        "cluster-dns",
        IpList,
        General,
        "DNS server IPs (comma-separated) for pods with\ndnsPolicy ClusterFirst; without it they fall back to\ndnsPolicy Default",
    )
    .field("clusterDNS")
    .put(|o, v| o.cluster_dns = v.ips())
    .get(|o| json!(o.cluster_dns.iter().map(|ip| ip.to_string()).collect::<Vec<_>>())),
    flag(
        "cluster-domain",
        Str,
        General,
        "the cluster's DNS domain; ClusterFirst pods search\n<ns>.svc.<domain>, svc.<domain> and <domain>",
    )
    .field("clusterDomain")
    .put(|o, v| o.cluster_domain = v.string().trim_end_matches('.').to_string())
    .get(|o| json!(o.cluster_domain)),
    flag(
        "resolv-conf",
        Path,
        General,
        "resolver configuration of dnsPolicy Default pods\n(default {}; \"\" for none)",
    )
    .field("resolvConf")
    .zero()
    .put(|o, v| o.resolv_conf = PathBuf::from(v.string()))
    .get(|o| display(&o.resolv_conf))
    .shown(),
    flag(
        "allow-privileged",
        Bool,
        General,
        "allow privileged containers and hostNetwork, hostPID\nand hostIPC pods; false refuses them at admission,\nand capabilities beyond the runtime's default set and\nprocMount Unmasked too",
    )
    // Not a KubeletConfiguration field: tinylet's own, like its flag.
    .field("allowPrivileged")
    .put(|o, v| o.allow_privileged = v.bool())
    .get(|o| json!(o.allow_privileged))
    .shown(),
    flag(
        "allowed-unsafe-sysctls",
        Names,
        General,
        "unsafe sysctls (names or prefixes ending in '*',\ncomma-separated, namespaced only) that pods may set\nbesides the safe ones; others are refused at admission\n(reason SysctlForbidden)",
    )
    .field("allowedUnsafeSysctls")
    .put(|o, v| o.allowed_unsafe_sysctls = v.list())
    .get(|o| json!(o.allowed_unsafe_sysctls)),
    flag(
        "cgroups-per-qos",
        Bool,
        General,
        "put each pod in a cgroup under kubepods/<QoS class>\n(default {})",
    )
    .field("cgroupsPerQOS")
    .put(|o, v| o.cgroups_per_qos = v.bool())
    .get(|o| json!(o.cgroups_per_qos))
    .shown(),
    flag(
        "cgroup-driver",
        Str,
        General,
        "cgroupfs or systemd; must match the runtime's\n(default {})",
    )
    .field("cgroupDriver")
    .zero()
    .check(|o, v| crate::runtime::qos::CgroupDriver::parse(&v.string()).map(|d| o.cgroup_driver = d))
    .get(|o| json!(format!("{:?}", o.cgroup_driver).to_lowercase()))
    .shown(),
    flag(
        "seccomp-default",
        Bool,
        General,
        "containers without a seccomp profile get the\nruntime's default profile",
    )
    .field("seccompDefault")
    .put(|o, v| o.seccomp_default = v.bool())
    .get(|o| json!(o.seccomp_default))
    .shown(),
    flag(
        "pod-max-pids",
        I64("a whole number"),
        General,
        "the most processes a pod may run, set as pids.max\non its cgroup (needs --cgroups-per-qos); -1: no\nlimit",
    )
    .field("podPidsLimit")
    .put(|o, v| o.pod_pids_limit = v.int())
    .get(|o| json!(o.pod_pids_limit))
    .shown(),
    flag(
        "serialize-image-pulls",
        Bool,
        General,
        "pull one image at a time",
    )
    .field("serializeImagePulls")
    .put(|o, v| o.serialize_image_pulls = v.bool())
    .get(|o| json!(o.serialize_image_pulls))
    .shown(),
    flag(
        "registry-qps",
        Rate,
        General,
        "image pulls per second; a pull beyond it fails and\nbacks off; 0: unlimited",
    )
    .field("registryPullQPS")
    .put(|o, v| o.registry_qps = v.float())
    .get(|o| json!(o.registry_qps))
    .shown(),
    flag(
        "registry-burst",
        U32,
        General,
        "image pulls allowed in a burst, with --registry-qps\nabove 0",
    )
    .field("registryBurst")
    .zero()
    .put(|o, v| o.registry_burst = v.u32())
    .get(|o| json!(o.registry_burst))
    .shown(),
    flag(
        "runonce",
        Bool,
        General,
        "start the pods of --pod-manifest-path and --manifest-url\nonce, wait until each runs or fails, print one line\nper pod and exit: 0 when all run, 1 otherwise;\ncontainers keep running (not with --kubeconfig)",
    )
    .put(|o, v| o.runonce = v.bool()),
    flag(
        "runonce-timeout",
        Duration,
        General,
        "how long --runonce waits for its pods",
    )
    .put(|o, v| o.runonce_timeout = v.dur())
    .get(|o| dur(o.runonce_timeout))
    .shown(),
    flag(
        "kubeconfig",
        Path,
        Cluster,
        "kubeconfig of the API server; joins the cluster as\nnode --hostname-override (or the hostname)",
    )
    .put(|o, v| o.kubeconfig = v.path()),
    flag(
        "bootstrap-kubeconfig",
        Path,
        Cluster,
        "TLS bootstrap: when --kubeconfig is missing or its\nclient certificate is not valid, ask the cluster with\nthese credentials (kubeadm's token) for one, keep it in\n--cert-dir as kubelet-client-current.pem, and write\n--kubeconfig to use it; waits until it is issued",
    )
    .aliases(&["experimental-bootstrap-kubeconfig"])
    .put(|o, v| o.bootstrap_kubeconfig = v.path()),
    flag(
        "rotate-certificates",
        Bool,
        Cluster,
        "ask for a new client certificate at 70-90% of the\ncurrent one's life, as TLS bootstrap keeps it\n(kubelet-client-current.pem), and switch connections\nover to it (default {}; kubeadm's config sets it)",
    )
    .field("rotateCertificates")
    .put(|o, v| o.rotate_certificates = v.bool())
    .get(|o| json!(o.rotate_certificates))
    .shown(),
    flag(
        "rotate-server-certificates",
        Bool,
        Cluster,
        "serverTLSBootstrap: ask the cluster's kubelet-serving\nsigner for the node API's certificate (the node's\nnames and IPs), serve it once an admin approves it\n(until then the self-signed one), and renew it",
    )
    .field("serverTLSBootstrap")
    .put(|o, v| o.server_tls_bootstrap = v.bool())
    .get(|o| json!(o.server_tls_bootstrap)),
    flag(
        "kube-api-qps",
        Rate,
        Cluster,
        "sustained requests per second to the API server",
    )
    .field("kubeAPIQPS")
    .put(|o, v| o.kube_api_qps = v.float())
    .get(|o| json!(o.kube_api_qps))
    .shown(),
    flag("kube-api-burst", U32, Cluster, "requests allowed in a burst")
        .field("kubeAPIBurst")
        .zero()
        .put(|o, v| o.kube_api_burst = v.u32())
        .get(|o| json!(o.kube_api_burst))
        .shown(),
    flag("register-node", Bool, Cluster, "register the Node object")
        .field("registerNode")
        .put(|o, v| o.register_node = v.bool())
        .get(|o| json!(o.register_node))
        .shown(),
    flag(
        "node-status-update-frequency",
        Duration,
        Cluster,
        "how often node status is computed and sent when it\nchanged",
    )
    .field("nodeStatusUpdateFrequency")
    .zero()
    .put(|o, v| o.node_status_update_frequency = v.dur())
    .get(|o| dur(o.node_status_update_frequency))
    .shown(),
    flag(
        "node-status-report-frequency",
        Duration,
        Cluster,
        "how often node status is sent when nothing changed\n(default {})",
    )
    .field("nodeStatusReportFrequency")
    .zero()
    .put(|o, v| o.node_status_report_frequency = v.dur())
    .get(|o| dur(o.node_status_report_frequency))
    .shown(),
    flag(
        "node-lease-duration-seconds",
        U32,
        Cluster,
        "the node Lease's duration; it is renewed every quarter\nof it",
    )
    .field("nodeLeaseDurationSeconds")
    .zero()
    .put(|o, v| o.node_lease_duration_seconds = v.u32())
    .get(|o| json!(o.node_lease_duration_seconds))
    .shown(),
    flag("max-pods", U32, Cluster, "pods this node admits")
        .field("maxPods")
        .zero()
        .put(|o, v| o.max_pods = v.u32())
        .get(|o| json!(o.max_pods))
        .shown(),
    flag(
        "kube-reserved",
        Reserved,
        Cluster,
        "resources reserved for Kubernetes daemons,\ne.g. cpu=100m,memory=256Mi,ephemeral-storage=1Gi",
    )
    .field("kubeReserved")
    .put(|o, v| v.merge_into(&mut o.kube_reserved))
    .get(|o| pairs(&o.kube_reserved)),
    flag(
        "system-reserved",
        Reserved,
        Cluster,
        "resources reserved for the system, same format",
    )
    .field("systemReserved")
    .put(|o, v| v.merge_into(&mut o.system_reserved))
    .get(|o| pairs(&o.system_reserved)),
    flag(
        "node-ip",
        Str,
        Cluster,
        "the node's InternalIP (default: the address of the\ndefault route's interface)",
    )
    .check(|o, v| {
        let v = v.string();
        o.node_ip = match v.as_str() {
            "" => None,
            _ => Some(v.parse().map_err(|_| format!("{v:?} is not an IP address"))?),
        };
        Ok(())
    }),
    flag(
        "node-labels",
        Labels,
        Cluster,
        "labels added at registration, k=v,k2=v2 (kubernetes.io\nand k8s.io keys only where NodeRestriction allows them)",
    )
    .put(|o, v| v.merge_into(&mut o.node_labels)),
    flag(
        "register-with-taints",
        Taints,
        Cluster,
        "taints added at registration, key=value:Effect,...",
    )
    .field("registerWithTaints")
    .put(|o, v| o.register_with_taints = v.taints()),
    flag(
        "anonymous-auth",
        Bool,
        Auth,
        "let requests without credentials in as\nsystem:anonymous",
    )
    .field("authentication.anonymous.enabled")
    .put(|o, v| o.auth.anonymous = v.bool())
    .get(|o| json!(o.auth.anonymous))
    .shown(),
    flag(
        "authentication-token-webhook",
        Bool,
        Auth,
        "check bearer tokens by TokenReview (needs --kubeconfig)",
    )
    .field("authentication.webhook.enabled")
    .put(|o, v| o.auth.token_webhook = v.bool())
    .get(|o| json!(o.auth.token_webhook)),
    flag(
        "authentication-token-webhook-cache-ttl",
        Duration,
        Auth,
        "how long TokenReview answers are kept",
    )
    .field("authentication.webhook.cacheTTL")
    .zero()
    .put(|o, v| o.auth.token_cache_ttl = v.dur())
    .get(|o| dur(o.auth.token_cache_ttl))
    .shown(),
    flag(
        "authorization-mode",
        Str,
        Auth,
        "Webhook (SubjectAccessReview; the default with\n--kubeconfig) or AlwaysAllow; without either a\nstandalone node refuses every request",
    )
    .field("authorization.mode")
    .zero()
    .check(|o, v| AuthorizationMode::parse(&v.string()).map(|m| o.auth.mode = Some(m)))
    .get(|o| {
        json!(match o.auth.mode {
            Some(AuthorizationMode::AlwaysAllow) => "AlwaysAllow",
            Some(AuthorizationMode::Webhook) => "Webhook",
            None => "",
        })
    }),
    flag(
        "authorization-webhook-cache-authorized-ttl",
        Duration,
        Auth,
        "how long allowed answers are kept",
    )
    .field("authorization.webhook.cacheAuthorizedTTL")
    .zero()
    .put(|o, v| o.auth.authorized_ttl = v.dur())
    .get(|o| dur(o.auth.authorized_ttl))
    .shown(),
    flag(
        "authorization-webhook-cache-unauthorized-ttl",
        Duration,
        Auth,
        "how long refused answers are kept",
    )
    .field("authorization.webhook.cacheUnauthorizedTTL")
    .zero()
    .put(|o, v| o.auth.unauthorized_ttl = v.dur())
    .get(|o| dur(o.auth.unauthorized_ttl))
    .shown(),
    flag(
        "image-gc-high-threshold",
        Percent,
        Gc,
        "percent of the image filesystem in use that starts\nremoving unused images; 100 turns it off",
    )
    .field("imageGCHighThresholdPercent")
    .put(|o, v| o.image_gc.high_threshold = v.u8())
    .get(|o| json!(o.image_gc.high_threshold))
    .shown(),
    flag(
        "image-gc-low-threshold",
        Percent,
        Gc,
        "percent image GC frees down to",
    )
    .field("imageGCLowThresholdPercent")
    .put(|o, v| o.image_gc.low_threshold = v.u8())
    .get(|o| json!(o.image_gc.low_threshold))
    .shown(),
    flag(
        "minimum-image-ttl-duration",
        Duration,
        Gc,
        "unused images younger than this are kept",
    )
    .field("imageMinimumGCAge")
    .zero()
    .put(|o, v| o.image_gc.min_age = v.dur())
    .get(|o| dur(o.image_gc.min_age))
    .shown(),
    flag(
        "maximum-dead-containers-per-container",
        U32,
        Gc,
        "exited instances kept per container; the newest is\nalways kept",
    )
    .put(|o, v| o.max_dead_per_container = v.u32())
    .get(|o| json!(o.max_dead_per_container))
    .shown(),
    flag(
        "eviction-hard",
        Map('<'),
        Eviction,
        "thresholds that evict at once, signal<value,...\n(default {})",
    )
    .field("evictionHard")
    .put(|o, v| v.merge_into(&mut o.eviction.hard))
    .get(|o| map(&o.eviction.hard))
    .default_text(
        "memory.available<100Mi,nodefs.available<10%,\nnodefs.inodesFree<5%,imagefs.available<15%",
    ),
    flag(
        "eviction-soft",
        Map('<'),
        Eviction,
        "thresholds that evict after their grace period",
    )
    .field("evictionSoft")
    .put(|o, v| v.merge_into(&mut o.eviction.soft))
    .get(|o| map(&o.eviction.soft)),
    flag(
        "eviction-soft-grace-period",
        Map('='),
        Eviction,
        "grace periods of the soft thresholds, signal=duration,...",
    )
    .field("evictionSoftGracePeriod")
    .put(|o, v| v.merge_into(&mut o.eviction.soft_grace_period))
    .get(|o| map(&o.eviction.soft_grace_period)),
    flag(
        "eviction-minimum-reclaim",
        Map('='),
        Eviction,
        "what is reclaimed beyond a threshold, signal=quantity,...",
    )
    .field("evictionMinimumReclaim")
    .put(|o, v| v.merge_into(&mut o.eviction.minimum_reclaim))
    .get(|o| map(&o.eviction.minimum_reclaim)),
    flag(
        "eviction-pressure-transition-period",
        Duration,
        Eviction,
        "how long a pressure condition stays after its\nthreshold is no longer met",
    )
    .field("evictionPressureTransitionPeriod")
    .zero()
    .put(|o, v| o.eviction.pressure_transition_period = v.dur())
    .get(|o| dur(o.eviction.pressure_transition_period))
    .shown(),
    flag(
        "eviction-max-pod-grace-period",
        I64("an integer"),
        Eviction,
        "longest grace period (s) of a pod evicted for a soft\nthreshold",
    )
    .field("evictionMaxPodGracePeriod")
    .put(|o, v| o.eviction.max_pod_grace_period = v.int())
    .get(|o| json!(o.eviction.max_pod_grace_period))
    .shown(),
    flag(
        "address",
        Ip,
        NodeApi,
        "address of --port and --read-only-port",
    )
    .field("address")
    .zero()
    .put(|o, v| o.address = v.ip())
    .get(|o| json!(o.address.to_string()))
    .shown(),
    flag(
        "port",
        Port,
        NodeApi,
        "HTTPS port of the node API: logs, exec, attach,\nport-forward, pods, metrics, healthz",
    )
    .field("port")
    .zero()
    .put(|o, v| {
        o.port = v.u16();
        o.port_given = true;
    })
    .get(|o| json!(o.port))
    .shown(),
    flag(
        "read-only-port",
        Port,
        NodeApi,
        "plain HTTP port for healthz, pods, metrics and\nstats only; 0: off",
    )
    .field("readOnlyPort")
    .put(|o, v| o.read_only_port = v.u16())
    .get(|o| json!(o.read_only_port))
    .shown(),
    flag(
        "healthz-bind-address",
        Ip,
        NodeApi,
        "address of --healthz-port",
    )
    .field("healthzBindAddress")
    .zero()
    .put(|o, v| o.healthz_bind_address = v.ip())
    .get(|o| json!(o.healthz_bind_address.to_string()))
    .shown(),
    flag(
        "healthz-port",
        Port,
        NodeApi,
        "plain HTTP port for /healthz; 0: off",
    )
    .field("healthzPort")
    .put(|o, v| {
        o.healthz_port = v.u16();
        o.healthz_given = true;
    })
    .get(|o| json!(o.healthz_port))
    .shown(),
    flag(
        "tls-cert-file",
        Path,
        NodeApi,
        "PEM serving certificate (chain) of --port; without it\nand --tls-private-key-file a self-signed pair is made\nonce under --cert-dir",
    )
    .field("tlsCertFile")
    .put(|o, v| o.tls_cert_file = v.path())
    .get(|o| path(&o.tls_cert_file)),
    flag(
        "tls-private-key-file",
        Path,
        NodeApi,
        "PEM private key of --tls-cert-file",
    )
    .field("tlsPrivateKeyFile")
    .put(|o, v| o.tls_private_key_file = v.path())
    .get(|o| path(&o.tls_private_key_file)),
    flag(
        "cert-dir",
        Path,
        NodeApi,
        "where the self-signed pair is kept as kubelet.crt and\nkubelet.key, and the bootstrapped client pair as\nkubelet-client-current.pem",
    )
    .put(|o, v| o.cert_dir = v.path())
    .default_text("<root-dir>/pki"),
    flag(
        "client-ca-file",
        Path,
        NodeApi,
        "PEM CA bundle; client certificates it signed\nauthenticate (CN: user, O: groups)",
    )
    .field("authentication.x509.clientCAFile")
    .null_is_absent()
    .put(|o, v| o.client_ca_file = v.path())
    .get(|o| path(&o.client_ca_file)),
    flag(
        "enable-server",
        Bool,
        NodeApi,
        "serve --port (and, standalone, --healthz-port); false\nturns the main and read-only ports off",
    )
    .field("enableServer")
    .put(|o, v| o.enable_server = Some(v.bool()))
    .get(|o| json!(o.listeners().main.is_some())),
    flag(
        "tls-min-version",
        Str,
        NodeApi,
        "oldest TLS version of --port: VersionTLS12 or\nVersionTLS13 (default {}; TLS 1.0 and 1.1\nare not spoken)",
    )
    .field("tlsMinVersion")
    .check(|o, v| TlsMinVersion::parse(&v.string()).map(|t| o.tls_min_version = t))
    .get(|o| json!(o.tls_min_version.name()))
    .shown(),
    flag(
        "streaming-connection-idle-timeout",
        Duration,
        NodeApi,
        "a log follow, exec, attach or port-forward session\nwith no traffic either way for this long is closed;\n0: never",
    )
    .field("streamingConnectionIdleTimeout")
    .zero()
    .put(|o, v| o.streaming_idle_timeout = v.dur())
    .get(|o| dur(o.streaming_idle_timeout))
    .shown(),
    flag(
        "v",
        Level,
        Logging,
        "log verbosity: 0 info, 1-3 more info, 4+ debug, 6+ trace",
    )
    .put(|o, v| o.verbosity = v.u8()),
    field(
        "configMapAndSecretChangeDetectionStrategy",
        Str,
        "how Secrets and ConfigMaps that pods use are kept current: Watch, Cache or Get",
    )
    .zero()
    .check(|o, v| crate::volume::Strategy::parse(&v.string()).map(|s| o.change_detection = s))
    .get(|o| json!(format!("{:?}", o.change_detection))),
];
