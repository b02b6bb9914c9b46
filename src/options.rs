//! Command-line flags, named like the upstream kubelet's, and their parsing,
//! plus the subset of the kubelet's configuration file (`--config`) that
//! tinylet understands.
//!
//! Accepts `--flag value`, `--flag=value` and, as the kubelet does, a single
//! dash (`-v 4`). Durations use Go's syntax (`20s`, `1m30s`, `500ms`). Flags
//! given on the command line override the configuration file, as upstream.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::Value;

use crate::config::decode::parse_object;

#[derive(Debug, Clone, PartialEq)]
pub struct Options {
    pub container_runtime_endpoint: String,
    pub pod_manifest_path: Option<PathBuf>,
    pub hostname_override: Option<String>,
    pub root_dir: PathBuf,
    pub pod_logs_dir: PathBuf,
    pub file_check_frequency: Duration,
    /// Where pods are polled from (`--manifest-url`).
    pub manifest_url: Option<String>,
    /// Headers sent with every manifest URL request, in order.
    pub manifest_url_headers: Vec<(String, String)>,
    pub http_check_frequency: Duration,
    /// Checkpointed API pods restored at start (`--bootstrap-checkpoint-path`).
    pub bootstrap_checkpoint_path: Option<PathBuf>,
    /// The configuration file read (`--config`).
    pub config_file: Option<PathBuf>,
    /// Fields of the configuration file that tinylet does not use.
    pub ignored_config_fields: Vec<String>,
    /// Upstream kubelet flags given on the command line that tinylet accepts
    /// and does not use, each once, in the order first given.
    pub ignored_flags: Vec<String>,
    pub sync_frequency: Duration,
    pub runtime_request_timeout: Duration,
    pub verbosity: u8,
    /// The kubeconfig of the API server (`--kubeconfig`); none: standalone.
    pub kubeconfig: Option<PathBuf>,
    pub kube_api_qps: f32,
    pub kube_api_burst: u32,
    /// Register the node with the API server (`--register-node`).
    pub register_node: bool,
    pub node_status_update_frequency: Duration,
    pub node_status_report_frequency: Duration,
    pub node_lease_duration_seconds: u32,
    pub max_pods: u32,
    /// `--kube-reserved` / `--system-reserved`: resource name to quantity.
    pub kube_reserved: Vec<(String, String)>,
    pub system_reserved: Vec<(String, String)>,
    /// The node's InternalIP (`--node-ip`); default: the default route's.
    pub node_ip: Option<std::net::IpAddr>,
    /// Labels added at registration (`--node-labels`).
    pub node_labels: Vec<(String, String)>,
    /// Taints added at registration (`--register-with-taints`).
    pub register_with_taints: Vec<Taint>,
    /// Image garbage collection: `--image-gc-high-threshold`,
    /// `--image-gc-low-threshold`, `--minimum-image-ttl-duration`.
    pub image_gc: crate::images::gc::Policy,
    /// Dead instances kept per container
    /// (`--maximum-dead-containers-per-container`).
    pub max_dead_per_container: u32,
    /// Nameservers of dnsPolicy ClusterFirst pods (`--cluster-dns`).
    pub cluster_dns: Vec<std::net::IpAddr>,
    /// The cluster's DNS domain (`--cluster-domain`).
    pub cluster_domain: String,
    /// The resolver configuration of dnsPolicy Default pods (`--resolv-conf`);
    /// empty: none.
    pub resolv_conf: PathBuf,
    /// Whether privileged containers and host namespaces are allowed
    /// (`--allow-privileged`).
    pub allow_privileged: bool,
    /// How Secrets and ConfigMaps that pods use are kept current (the
    /// configuration file's `configMapAndSecretChangeDetectionStrategy`,
    /// which has no flag).
    pub change_detection: crate::volume::Strategy,
    /// Unsafe sysctls (names, or prefixes ending in `*`) pods may set on
    /// top of the safe set (`--allowed-unsafe-sysctls`).
    pub allowed_unsafe_sysctls: Vec<String>,
    /// Pods in cgroups by QoS class under `kubepods` (`--cgroups-per-qos`).
    pub cgroups_per_qos: bool,
    /// `cgroupfs` or `systemd`, as the runtime uses (`--cgroup-driver`).
    pub cgroup_driver: crate::runtime::qos::CgroupDriver,
    /// One image pull at a time (`--serialize-image-pulls`).
    pub serialize_image_pulls: bool,
    /// Image pulls per second, 0: unlimited (`--registry-qps`).
    pub registry_qps: f32,
    /// Image pulls in a burst (`--registry-burst`).
    pub registry_burst: u32,
    /// The node API's address and port (`--address`, `--port`).
    pub address: std::net::IpAddr,
    pub port: u16,
    /// The plain read-only port (`--read-only-port`); 0: off.
    pub read_only_port: u16,
    /// The plain healthz listener (`--healthz-bind-address`,
    /// `--healthz-port`); port 0: off.
    pub healthz_bind_address: std::net::IpAddr,
    pub healthz_port: u16,
    /// The node API's serving certificate and key (PEM); without them a
    /// self-signed pair under `cert_dir` (default `<root-dir>/pki`).
    pub tls_cert_file: Option<PathBuf>,
    pub tls_private_key_file: Option<PathBuf>,
    pub cert_dir: Option<PathBuf>,
    /// CA bundle that client certificates are verified against
    /// (`--client-ca-file`, `authentication.x509.clientCAFile`).
    pub client_ca_file: Option<PathBuf>,
    /// `--enable-server` as given; `None`: not given.
    pub enable_server: Option<bool>,
    /// Whether `--port` (`--healthz-port`) was given, in the flags or the
    /// file: a standalone node listens only where it is asked to (an
    /// address alone opens nothing).
    pub port_given: bool,
    pub healthz_given: bool,
    /// Who may call the node's API: `--anonymous-auth`, the token webhook,
    /// `--authorization-mode` and the cache TTLs (the configuration file's
    /// `authentication` and `authorization`). `node_name` is left empty:
    /// the caller sets it. `mode` is Webhook with a kubeconfig unless given.
    pub auth: AuthConfig,
    /// Run the file and URL sources' pods once and exit (`--runonce`).
    pub runonce: bool,
    /// How long `--runonce` waits for its pods (`--runonce-timeout`).
    pub runonce_timeout: Duration,
    /// A container's live log is rotated from this size on, in bytes
    /// (`--container-log-max-size`).
    pub container_log_max_size: u64,
    /// Log files kept per container, the live one included, at least 2
    /// (`--container-log-max-files`).
    pub container_log_max_files: usize,
    /// The eviction thresholds and their settings (`--eviction-*`).
    pub eviction: crate::eviction::Settings,
}

/// Where the node's API listens; `None`: that listener is off.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Listeners {
    pub main: Option<std::net::SocketAddr>,
    pub read_only: Option<std::net::SocketAddr>,
    pub healthz: Option<std::net::SocketAddr>,
}

impl Options {
    /// The listeners to open. A cluster node (`--kubeconfig`) opens the
    /// main port and the healthz port by default, as the apiserver and
    /// kubeadm need them; a standalone node opens each only when its flag
    /// (or `--enable-server`) is given, so nothing listens unasked.
    /// `--enable-server=false` closes the main and read-only ports, as
    /// upstream; a port of 0 closes its listener.
    pub fn listeners(&self) -> Listeners {
        use std::net::SocketAddr;
        let cluster = self.kubeconfig.is_some();
        let server = self.enable_server.unwrap_or(cluster || self.port_given);
        let main = (server && self.port != 0).then(|| SocketAddr::new(self.address, self.port));
        let read_only = (self.enable_server != Some(false) && self.read_only_port != 0)
            .then(|| SocketAddr::new(self.address, self.read_only_port));
        let healthz = (self.healthz_port != 0
            && (cluster || self.healthz_given || self.enable_server == Some(true)))
        .then(|| SocketAddr::new(self.healthz_bind_address, self.healthz_port));
        Listeners {
            main,
            read_only,
            healthz,
        }
    }

    /// The serving certificate's directory (`--cert-dir`).
    pub fn cert_dir(&self) -> PathBuf {
        self.cert_dir
            .clone()
            .unwrap_or_else(|| self.root_dir.join("pki"))
    }
}

/// A node taint: `key[=value]:Effect`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Taint {
    pub key: String,
    pub value: String,
    pub effect: String,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            container_runtime_endpoint: "unix:///run/containerd/containerd.sock".into(),
            pod_manifest_path: None,
            hostname_override: None,
            root_dir: PathBuf::from("/var/lib/tinylet"),
            pod_logs_dir: PathBuf::from("/var/log/pods"),
            file_check_frequency: Duration::from_secs(20),
            manifest_url: None,
            manifest_url_headers: Vec::new(),
            http_check_frequency: Duration::from_secs(20),
            bootstrap_checkpoint_path: None,
            config_file: None,
            ignored_config_fields: Vec::new(),
            ignored_flags: Vec::new(),
            sync_frequency: Duration::from_secs(60),
            runtime_request_timeout: Duration::from_secs(120),
            verbosity: 0,
            kubeconfig: None,
            kube_api_qps: 50.0,
            kube_api_burst: 100,
            register_node: true,
            node_status_update_frequency: Duration::from_secs(10),
            node_status_report_frequency: Duration::from_secs(5 * 60),
            node_lease_duration_seconds: 40,
            max_pods: 110,
            kube_reserved: Vec::new(),
            system_reserved: Vec::new(),
            node_ip: None,
            node_labels: Vec::new(),
            register_with_taints: Vec::new(),
            image_gc: crate::images::gc::Policy::default(),
            max_dead_per_container: 1,
            cluster_dns: Vec::new(),
            cluster_domain: String::new(),
            resolv_conf: PathBuf::from("/etc/resolv.conf"),
            allow_privileged: true,
            change_detection: crate::volume::Strategy::Watch,
            allowed_unsafe_sysctls: Vec::new(),
            cgroups_per_qos: true,
            cgroup_driver: crate::runtime::qos::CgroupDriver::Cgroupfs,
            serialize_image_pulls: true,
            registry_qps: 5.0,
            registry_burst: 10,
            address: std::net::IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED),
            port: 10250,
            read_only_port: 0,
            healthz_bind_address: std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST),
            healthz_port: 10248,
            tls_cert_file: None,
            tls_private_key_file: None,
            cert_dir: None,
            client_ca_file: None,
            enable_server: None,
            port_given: false,
            healthz_given: false,
            auth: AuthConfig::default(),
            runonce: false,
            runonce_timeout: Duration::from_secs(5 * 60),
            container_log_max_size: crate::logs::rotate::DEFAULT_MAX_SIZE,
            container_log_max_files: crate::logs::rotate::DEFAULT_MAX_FILES,
            eviction: crate::eviction::Settings::default(),
        }
    }
}

/// What the command line asks for.
#[derive(Debug, PartialEq)]
pub enum Command {
    Run(Box<Options>),
    /// `tinylet status ...`: what the local node runs.
    Status(Box<StatusOptions>),
    /// `tinylet status --help`.
    StatusHelp,
    Help,
    Version,
}

/// How `tinylet status` prints.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StatusOutput {
    Table,
    /// The table with each pod's containers below it.
    Wide,
    /// The `PodList` as JSON.
    Json,
}

/// The flags of `tinylet status`.
#[derive(Debug, Clone, PartialEq)]
pub struct StatusOptions {
    /// Redraw every 2 s until interrupted.
    pub watch: bool,
    pub output: StatusOutput,
    /// The node's read-only port; 0: not asked.
    pub read_only_port: u16,
    /// The node's main (TLS) port, asked with `kubeconfig`'s credentials.
    pub port: u16,
    pub kubeconfig: Option<PathBuf>,
    /// The main port's certificate (default `<root-dir>/pki/kubelet.crt`).
    pub tls_cert_file: Option<PathBuf>,
    pub container_runtime_endpoint: String,
    pub root_dir: PathBuf,
}

impl Default for StatusOptions {
    fn default() -> Self {
        let o = Options::default();
        StatusOptions {
            watch: false,
            output: StatusOutput::Table,
            read_only_port: 0,
            port: 10250,
            kubeconfig: None,
            tls_cert_file: None,
            container_runtime_endpoint: o.container_runtime_endpoint,
            root_dir: o.root_dir,
        }
    }
}

pub const STATUS_USAGE: &str = "\
Usage: tinylet status [flags]

Prints the pods and containers the local node runs. It asks, in order: the
read-only port (if --read-only-port is given), the main port with the node's
own credentials (if --kubeconfig is given), else the container runtime.

  -w, --watch                          redraw every 2s until interrupted
  -o, --output table|wide|json         wide adds each pod's containers; json prints
                                       the PodList
  --read-only-port int                 the node's read-only port (default 0: not asked)
  --port int                           the node's main port (default 10250)
  --kubeconfig string                  the node's kubeconfig: its client certificate
                                       authenticates to the main port
  --tls-cert-file string               the main port's certificate, trusted as is
                                       (default <root-dir>/pki/kubelet.crt)
  --container-runtime-endpoint string  CRI endpoint (default unix:///run/containerd/containerd.sock)
  --root-dir string                    tinylet's state directory (default /var/lib/tinylet)
";

/// Parses the arguments after `tinylet status`.
pub fn parse_status_args<I: IntoIterator<Item = String>>(args: I) -> Result<Command, String> {
    let mut o = StatusOptions::default();
    let mut it = args.into_iter();
    while let Some(arg) = it.next() {
        let Some(flag) = arg.strip_prefix("--").or_else(|| arg.strip_prefix('-')) else {
            return Err(format!("status: unexpected argument {arg:?}"));
        };
        let (name, inline) = match flag.split_once('=') {
            Some((n, v)) => (n.replace('_', "-"), Some(v.to_string())),
            None => (flag.replace('_', "-"), None),
        };
        let name = name.as_str();
        if name == "h" || name == "help" {
            return Ok(Command::StatusHelp);
        }
        if name == "w" || name == "watch" {
            o.watch = match inline {
                Some(v) => boolean(name, &v)?,
                None => true,
            };
            continue;
        }
        let v = match inline {
            Some(v) => v,
            None => it
                .next()
                .ok_or_else(|| format!("status: flag --{name} needs a value"))?,
        };
        let port = |v: &str| {
            v.parse::<u16>()
                .map_err(|_| format!("status: flag --{name}: invalid port {v:?} (want 0-65535)"))
        };
        match name {
            "o" | "output" => {
                o.output = match v.as_str() {
                    "table" | "" => StatusOutput::Table,
                    "wide" => StatusOutput::Wide,
                    "json" => StatusOutput::Json,
                    _ => {
                        return Err(format!(
                            "status: flag --output: {v:?} is not table, wide or json"
                        ))
                    }
                }
            }
            "read-only-port" => o.read_only_port = port(&v)?,
            "port" => o.port = port(&v)?,
            "kubeconfig" => o.kubeconfig = (!v.is_empty()).then(|| PathBuf::from(v)),
            "tls-cert-file" => o.tls_cert_file = (!v.is_empty()).then(|| PathBuf::from(v)),
            "container-runtime-endpoint" => o.container_runtime_endpoint = v,
            "root-dir" => o.root_dir = PathBuf::from(v),
            _ => return Err(format!("status: unknown flag --{name}")),
        }
    }
    Ok(Command::Status(Box::new(o)))
}

pub const USAGE: &str = "\
tinylet: a small Kubernetes node agent

Usage: tinylet [flags]
       tinylet status [flags]     what the local node runs (tinylet status --help)

Flags:
  --config file                        kubelet configuration file (KubeletConfiguration
                                       v1beta1; flags override it)
  --container-runtime-endpoint string  CRI endpoint (default unix:///run/containerd/containerd.sock)
  --pod-manifest-path string           directory (or file) of static pod manifests
  --manifest-url string                URL to poll for static pods (one Pod or a PodList)
  --manifest-url-header 'Name:value'   header for --manifest-url requests; repeatable,
                                       or comma-separated pairs
  --http-check-frequency duration      how often the manifest URL is polled (default 20s)
  --bootstrap-checkpoint-path string   directory of API pod checkpoints restored at start
  --hostname-override string           node name to use instead of the hostname
  --root-dir string                    directory for tinylet's state (default /var/lib/tinylet)
  --pod-logs-dir string                root of container log directories (default /var/log/pods)
  --container-log-max-size quantity    a container's log is rotated (renamed, reopened by the
                                       runtime) once it reaches this size (default 10Mi)
  --container-log-max-files int        log files kept per container, the live one included;
                                       older rotated ones are gzipped (default 5, at least 2)
  --file-check-frequency duration      how often the manifest path is re-listed (default 20s)
  --sync-frequency duration            how often a running pod is re-synced (default 1m0s)
  --runtime-request-timeout duration   deadline of each CRI call (default 2m0s)
  --cluster-dns list                   DNS server IPs (comma-separated) for pods with
                                       dnsPolicy ClusterFirst; without it they fall back to
                                       dnsPolicy Default
  --cluster-domain string              the cluster's DNS domain; ClusterFirst pods search
                                       <ns>.svc.<domain>, svc.<domain> and <domain>
  --resolv-conf string                 resolver configuration of dnsPolicy Default pods
                                       (default /etc/resolv.conf; \"\" for none)
  --allow-privileged bool              allow privileged containers and hostNetwork, hostPID
                                       and hostIPC pods; false refuses them at admission
                                       (default true)
  --allowed-unsafe-sysctls list        unsafe sysctls (names or prefixes ending in '*',
                                       comma-separated, namespaced only) that pods may set
                                       besides the safe ones; others are refused at admission
                                       (reason SysctlForbidden)
  --cgroups-per-qos bool               put each pod in a cgroup under kubepods/<QoS class>
                                       (default true)
  --cgroup-driver string               cgroupfs or systemd; must match the runtime's
                                       (default cgroupfs)
  --serialize-image-pulls bool         pull one image at a time (default true)
  --registry-qps float                 image pulls per second; a pull beyond it fails and
                                       backs off; 0: unlimited (default 5)
  --registry-burst int                 image pulls allowed in a burst, with --registry-qps
                                       above 0 (default 10)
  --runonce bool                       start the pods of --pod-manifest-path and --manifest-url
                                       once, wait until each runs or fails, print one line
                                       per pod and exit: 0 when all run, 1 otherwise;
                                       containers keep running (not with --kubeconfig)
  --runonce-timeout duration           how long --runonce waits for its pods (default 5m0s)

Cluster node (with --kubeconfig; without it tinylet runs static pods only):
  --kubeconfig string                  kubeconfig of the API server; joins the cluster as
                                       node --hostname-override (or the hostname)
  --kube-api-qps float                 sustained requests per second to the API server (default 50)
  --kube-api-burst int                 requests allowed in a burst (default 100)
  --register-node bool                 register the Node object (default true)
  --node-status-update-frequency duration
                                       how often node status is computed and sent when it
                                       changed (default 10s)
  --node-status-report-frequency duration
                                       how often node status is sent when nothing changed
                                       (default 5m0s)
  --node-lease-duration-seconds int    the node Lease's duration; it is renewed every quarter
                                       of it (default 40)
  --max-pods int                       pods this node admits (default 110)
  --kube-reserved list                 resources reserved for Kubernetes daemons,
                                       e.g. cpu=100m,memory=256Mi,ephemeral-storage=1Gi
  --system-reserved list               resources reserved for the system, same format
  --node-ip string                     the node's InternalIP (default: the address of the
                                       default route's interface)
  --node-labels list                   labels added at registration, k=v,k2=v2 (kubernetes.io
                                       and k8s.io keys only where NodeRestriction allows them)
  --register-with-taints list          taints added at registration, key=value:Effect,...

Node API authentication and authorization:
  --anonymous-auth bool                let requests without credentials in as
                                       system:anonymous (default false)
  --authentication-token-webhook bool  check bearer tokens by TokenReview (needs --kubeconfig)
  --authentication-token-webhook-cache-ttl duration
                                       how long TokenReview answers are kept (default 2m0s)
  --authorization-mode string          Webhook (SubjectAccessReview; the default with
                                       --kubeconfig) or AlwaysAllow; without either a
                                       standalone node refuses every request
  --authorization-webhook-cache-authorized-ttl duration
                                       how long allowed answers are kept (default 5m0s)
  --authorization-webhook-cache-unauthorized-ttl duration
                                       how long refused answers are kept (default 30s)

Garbage collection:
  --image-gc-high-threshold int        percent of the image filesystem in use that starts
                                       removing unused images; 100 turns it off (default 85)
  --image-gc-low-threshold int         percent image GC frees down to (default 80)
  --minimum-image-ttl-duration duration
                                       unused images younger than this are kept (default 2m0s)
  --maximum-dead-containers-per-container int
                                       exited instances kept per container; the newest is
                                       always kept (default 1)

Eviction (signals memory.available, nodefs.available, nodefs.inodesFree,
imagefs.available, imagefs.inodesFree, pid.available; quantities or percentages):
  --eviction-hard list                 thresholds that evict at once, signal<value,...
                                       (default memory.available<100Mi,nodefs.available<10%,
                                       nodefs.inodesFree<5%,imagefs.available<15%)
  --eviction-soft list                 thresholds that evict after their grace period
  --eviction-soft-grace-period list    grace periods of the soft thresholds, signal=duration,...
  --eviction-minimum-reclaim list      what is reclaimed beyond a threshold, signal=quantity,...
  --eviction-pressure-transition-period duration
                                       how long a pressure condition stays after its
                                       threshold is no longer met (default 5m0s)
  --eviction-max-pod-grace-period int  longest grace period (s) of a pod evicted for a soft
                                       threshold (default 0)

Node API (a cluster node serves --port and --healthz-port by default; a standalone
node serves each only when its flag or --enable-server is given):
  --address ip                         address of --port and --read-only-port (default 0.0.0.0)
  --port int                           HTTPS port of the node API: logs, exec, attach,
                                       port-forward, pods, metrics, healthz (default 10250)
  --read-only-port int                 plain HTTP port for healthz, pods, metrics and
                                       stats only; 0: off (default 0)
  --healthz-bind-address ip            address of --healthz-port (default 127.0.0.1)
  --healthz-port int                   plain HTTP port for /healthz; 0: off (default 10248)
  --tls-cert-file string               PEM serving certificate (chain) of --port; without it
                                       and --tls-private-key-file a self-signed pair is made
                                       once under --cert-dir
  --tls-private-key-file string        PEM private key of --tls-cert-file
  --cert-dir string                    where the self-signed pair is kept as kubelet.crt and
                                       kubelet.key (default <root-dir>/pki)
  --client-ca-file string              PEM CA bundle; client certificates it signed
                                       authenticate (CN: user, O: groups)
  --enable-server bool                 serve --port (and, standalone, --healthz-port); false
                                       turns the main and read-only ports off

  -v, --v int                          log verbosity: 0 info, 1-3 more info, 4+ debug, 6+ trace
  -h, --help                           print this help
      --version                        print the version, git commit, target and whether the
                                       binary is static

Other flags of the upstream kubelet (v1.20 and later), as kubeadm and distro units
pass them, are accepted with a warning and ignored (list in README.md). A boolean
flag alone means true; give another value as --flag=false.
";

pub use crate::apitime::parse_duration;

/// Parses `--manifest-url-header` values: `Name:value` pairs separated by
/// commas (upstream's format), each split at its first colon.
pub fn parse_header_pairs(v: &str) -> Result<Vec<(String, String)>, String> {
    let mut out = Vec::new();
    for pair in v.split(',') {
        let Some((name, value)) = pair.split_once(':') else {
            return Err(format!("{pair:?} is not Name:value"));
        };
        let name = name.trim();
        crate::config::http::check_header(name, value)?;
        out.push((name.to_string(), value.to_string()));
    }
    Ok(out)
}

pub fn parse_args<I: IntoIterator<Item = String>>(args: I) -> Result<Command, String> {
    // First collect the flags, so that the configuration file (wherever
    // --config stands) is applied first and the flags on top of it.
    let mut flags: Vec<(String, String)> = Vec::new();
    let mut ignored: Vec<String> = Vec::new();
    // A boolean flag just given without a value, for the hint when a stray
    // argument follows it.
    let mut last_bool: Option<String> = None;
    let mut it = args.into_iter().peekable();
    if it.peek().is_some_and(|a| a == "status") {
        it.next();
        return parse_status_args(it);
    }
    while let Some(arg) = it.next() {
        let Some(flag) = arg.strip_prefix("--").or_else(|| arg.strip_prefix('-')) else {
            return Err(match last_bool {
                Some(b) => format!(
                    "unexpected argument {arg:?} after boolean flag --{b} (give its value as --{b}={arg})"
                ),
                None => format!("unexpected argument {arg:?} (flags start with --)"),
            });
        };
        last_bool = None;
        let (raw, inline) = match flag.split_once('=') {
            Some((n, v)) => (n, Some(v.to_string())),
            None => (flag, None),
        };
        // As the kubelet's flag set does, `--node_ip` means `--node-ip`.
        let name = raw.replace('_', "-");
        let name = name.as_str();
        let kind = match name {
            "h" | "help" => return Ok(Command::Help),
            // `--version=false` asks for nothing, as upstream.
            "version" => match inline.as_deref().map(|v| boolean(name, v)) {
                Some(Ok(false)) => continue,
                _ => return Ok(Command::Version),
            },
            _ if FLAGS.contains(&name) => FlagKind::Own,
            _ if IGNORED_BOOL_FLAGS.contains(&name) => FlagKind::IgnoredBool,
            _ if IGNORED_VALUE_FLAGS.contains(&name) => FlagKind::IgnoredValue,
            _ => return Err(format!("unknown flag --{name}")),
        };
        let is_bool = kind == FlagKind::IgnoredBool || BOOL_FLAGS.contains(&name);
        let value = match inline {
            Some(v) => v,
            // As Go's flag parsing: a boolean flag alone is true and does not
            // take the next argument; `--flag false` is still read as before.
            None if is_bool => match it.next_if(|next| boolean(name, next).is_ok()) {
                Some(v) => v,
                None => {
                    last_bool = Some(name.to_string());
                    "true".to_string()
                }
            },
            None => it
                .next()
                .ok_or_else(|| format!("flag --{name} needs a value"))?,
        };
        if kind == FlagKind::Own {
            flags.push((name.to_string(), value));
            continue;
        }
        if is_bool {
            boolean(name, &value)?;
        }
        if !ignored.iter().any(|i| i == name) {
            ignored.push(name.to_string());
        }
    }
    let mut o = Options {
        ignored_flags: ignored,
        ..Options::default()
    };
    if let Some((_, path)) = flags.iter().rev().find(|(name, _)| name == "config") {
        let path = PathBuf::from(path);
        apply_config_file(&mut o, &path)?;
        o.config_file = Some(path);
    }
    let mut headers_from_flags = false;
    // A map flag's first use replaces the default (or the file's) map;
    // later uses add to it, as the kubelet's map flags do.
    let mut maps_from_flags: Vec<&str> = Vec::new();
    for (name, v) in flags {
        let name = name.as_str();
        let dur = |v: &str| parse_duration(v).map_err(|e| format!("flag --{name}: {e}"));
        match name {
            "config" => {}
            "manifest-url" => o.manifest_url = (!v.is_empty()).then_some(v),
            "manifest-url-header" => {
                if !headers_from_flags {
                    // The flags replace the file's headers as a whole.
                    o.manifest_url_headers.clear();
                    headers_from_flags = true;
                }
                let pairs = parse_header_pairs(&v).map_err(|e| format!("flag --{name}: {e}"))?;
                o.manifest_url_headers.extend(pairs);
            }
            "http-check-frequency" => o.http_check_frequency = dur(&v)?,
            "bootstrap-checkpoint-path" => {
                o.bootstrap_checkpoint_path = (!v.is_empty()).then(|| PathBuf::from(v));
            }
            "container-runtime-endpoint" => o.container_runtime_endpoint = v,
            "pod-manifest-path" => o.pod_manifest_path = (!v.is_empty()).then(|| PathBuf::from(v)),
            "hostname-override" => o.hostname_override = (!v.is_empty()).then_some(v),
            "root-dir" => o.root_dir = PathBuf::from(v),
            "pod-logs-dir" => o.pod_logs_dir = PathBuf::from(v),
            "container-log-max-size" => {
                o.container_log_max_size =
                    log_max_size(&v).map_err(|e| format!("flag --{name}: {e}"))?
            }
            "container-log-max-files" => {
                o.container_log_max_files =
                    log_max_files(number(name, &v)?).map_err(|e| format!("flag --{name}: {e}"))?
            }
            "file-check-frequency" => o.file_check_frequency = dur(&v)?,
            "sync-frequency" => o.sync_frequency = dur(&v)?,
            "runtime-request-timeout" => o.runtime_request_timeout = dur(&v)?,
            "kubeconfig" => o.kubeconfig = (!v.is_empty()).then(|| PathBuf::from(v)),
            "kube-api-qps" => {
                o.kube_api_qps = v
                    .parse::<f32>()
                    .ok()
                    .filter(|q| q.is_finite() && *q >= 0.0)
                    .ok_or_else(|| {
                        format!("flag --{name}: invalid rate {v:?} (want a number >= 0)")
                    })?;
            }
            "kube-api-burst" => o.kube_api_burst = number(name, &v)?,
            "register-node" => o.register_node = boolean(name, &v)?,
            "serialize-image-pulls" => o.serialize_image_pulls = boolean(name, &v)?,
            "registry-qps" => {
                o.registry_qps = v
                    .parse::<f32>()
                    .ok()
                    .filter(|q| q.is_finite() && *q >= 0.0)
                    .ok_or_else(|| {
                        format!("flag --{name}: invalid rate {v:?} (want a number >= 0)")
                    })?;
            }
            "registry-burst" => o.registry_burst = number(name, &v)?,
            "node-status-update-frequency" => o.node_status_update_frequency = dur(&v)?,
            "node-status-report-frequency" => o.node_status_report_frequency = dur(&v)?,
            "node-lease-duration-seconds" => o.node_lease_duration_seconds = number(name, &v)?,
            "max-pods" => o.max_pods = number(name, &v)?,
            "kube-reserved" => {
                o.kube_reserved = parse_pairs(&v, '=').map_err(|e| format!("flag --{name}: {e}"))?
            }
            "system-reserved" => {
                o.system_reserved =
                    parse_pairs(&v, '=').map_err(|e| format!("flag --{name}: {e}"))?
            }
            "node-ip" => {
                o.node_ip = if v.is_empty() {
                    None
                } else {
                    Some(
                        v.parse()
                            .map_err(|_| format!("flag --{name}: {v:?} is not an IP address"))?,
                    )
                };
            }
            "node-labels" => {
                o.node_labels = parse_node_labels(&v).map_err(|e| format!("flag --{name}: {e}"))?
            }
            "register-with-taints" => {
                o.register_with_taints =
                    parse_taints(&v).map_err(|e| format!("flag --{name}: {e}"))?;
            }
            "image-gc-high-threshold" => o.image_gc.high_threshold = number(name, &v)?,
            "image-gc-low-threshold" => o.image_gc.low_threshold = number(name, &v)?,
            "minimum-image-ttl-duration" => o.image_gc.min_age = dur(&v)?,
            "maximum-dead-containers-per-container" => o.max_dead_per_container = number(name, &v)?,
            "cluster-dns" => {
                o.cluster_dns = parse_ips(&v).map_err(|e| format!("flag --{name}: {e}"))?
            }
            "cluster-domain" => o.cluster_domain = v.trim_end_matches('.').to_string(),
            "resolv-conf" => o.resolv_conf = PathBuf::from(v),
            "allow-privileged" => o.allow_privileged = boolean(name, &v)?,
            "allowed-unsafe-sysctls" => {
                o.allowed_unsafe_sysctls = v
                    .split(',')
                    .map(str::trim)
                    .filter(|s| !s.is_empty())
                    .map(str::to_string)
                    .collect();
            }
            "cgroups-per-qos" => o.cgroups_per_qos = boolean(name, &v)?,
            "cgroup-driver" => {
                o.cgroup_driver = crate::runtime::qos::CgroupDriver::parse(&v)
                    .map_err(|e| format!("flag --{name}: {e}"))?
            }
            "address" | "healthz-bind-address" => {
                let ip = v
                    .parse()
                    .map_err(|_| format!("flag --{name}: {v:?} is not an IP address"))?;
                if name == "address" {
                    o.address = ip;
                } else {
                    o.healthz_bind_address = ip;
                }
            }
            "port" => {
                o.port = number(name, &v)?;
                o.port_given = true;
            }
            "healthz-port" => {
                o.healthz_port = number(name, &v)?;
                o.healthz_given = true;
            }
            "read-only-port" => o.read_only_port = number(name, &v)?,
            "tls-cert-file" => o.tls_cert_file = (!v.is_empty()).then(|| PathBuf::from(v)),
            "tls-private-key-file" => {
                o.tls_private_key_file = (!v.is_empty()).then(|| PathBuf::from(v))
            }
            "cert-dir" => o.cert_dir = (!v.is_empty()).then(|| PathBuf::from(v)),
            "client-ca-file" => o.client_ca_file = (!v.is_empty()).then(|| PathBuf::from(v)),
            "enable-server" => o.enable_server = Some(boolean(name, &v)?),
            "anonymous-auth" => o.auth.anonymous = boolean(name, &v)?,
            "authentication-token-webhook" => o.auth.token_webhook = boolean(name, &v)?,
            "authentication-token-webhook-cache-ttl" => o.auth.token_cache_ttl = dur(&v)?,
            "authorization-mode" => {
                o.auth.mode =
                    Some(AuthorizationMode::parse(&v).map_err(|e| format!("flag --{name}: {e}"))?);
            }
            "authorization-webhook-cache-authorized-ttl" => o.auth.authorized_ttl = dur(&v)?,
            "authorization-webhook-cache-unauthorized-ttl" => o.auth.unauthorized_ttl = dur(&v)?,
            "runonce" => o.runonce = boolean(name, &v)?,
            "runonce-timeout" => o.runonce_timeout = dur(&v)?,
            "eviction-hard"
            | "eviction-soft"
            | "eviction-soft-grace-period"
            | "eviction-minimum-reclaim" => {
                let e = &mut o.eviction;
                let (map, sep) = match name {
                    "eviction-hard" => (&mut e.hard, '<'),
                    "eviction-soft" => (&mut e.soft, '<'),
                    "eviction-soft-grace-period" => (&mut e.soft_grace_period, '='),
                    _ => (&mut e.minimum_reclaim, '='),
                };
                let pairs = crate::eviction::parse_map(&v, sep)
                    .map_err(|e| format!("flag --{name}: {e}"))?;
                if !maps_from_flags.contains(&name) {
                    map.clear();
                    maps_from_flags.push(FLAGS.iter().find(|f| **f == name).map_or("", |f| f));
                }
                map.extend(pairs);
            }
            "eviction-pressure-transition-period" => {
                o.eviction.pressure_transition_period = dur(&v)?
            }
            "eviction-max-pod-grace-period" => o.eviction.max_pod_grace_period = number(name, &v)?,
            "v" => {
                o.verbosity = v
                    .parse()
                    .map_err(|_| format!("flag --v: invalid level {v:?} (want 0-10)"))?;
            }
            _ => return Err(format!("unknown flag --{name}")),
        }
    }
    if let Some(url) = &o.manifest_url {
        crate::config::http::check_url(url).map_err(|e| match &o.config_file {
            Some(file) => format!(
                "flag --manifest-url (or staticPodURL in --config {}): {e}",
                file.display()
            ),
            None => format!("flag --manifest-url: {e}"),
        })?;
    }
    for (flag, field, d) in [
        (
            "file-check-frequency",
            "fileCheckFrequency",
            o.file_check_frequency,
        ),
        (
            "http-check-frequency",
            "httpCheckFrequency",
            o.http_check_frequency,
        ),
        ("sync-frequency", "syncFrequency", o.sync_frequency),
        (
            "node-status-update-frequency",
            "nodeStatusUpdateFrequency",
            o.node_status_update_frequency,
        ),
        (
            "node-status-report-frequency",
            "nodeStatusReportFrequency",
            o.node_status_report_frequency,
        ),
        (
            "runtime-request-timeout",
            "runtimeRequestTimeout",
            o.runtime_request_timeout,
        ),
    ] {
        if d.is_zero() {
            return Err(match &o.config_file {
                Some(file) => format!(
                    "flag --{flag} (or {field} in --config {}): must be greater than 0",
                    file.display()
                ),
                None => format!("flag --{flag}: must be greater than 0"),
            });
        }
    }
    if let Err(e) = crate::sysctl::Allowlist::new(&o.allowed_unsafe_sysctls) {
        return Err(match &o.config_file {
            Some(file) => format!(
                "flag --allowed-unsafe-sysctls (or allowedUnsafeSysctls in --config {}): {e}",
                file.display()
            ),
            None => format!("flag --allowed-unsafe-sysctls: {e}"),
        });
    }
    if o.tls_cert_file.is_some() != o.tls_private_key_file.is_some() {
        return Err(
            "flags --tls-cert-file and --tls-private-key-file (or tlsCertFile and \
             tlsPrivateKeyFile): give both or neither"
                .into(),
        );
    }
    crate::eviction::thresholds(&o.eviction).map_err(|e| match &o.config_file {
        Some(file) => format!(
            "eviction thresholds (flags or --config {}): {e}",
            file.display()
        ),
        None => format!("eviction thresholds (--eviction-*): {e}"),
    })?;
    o.image_gc.validate().map_err(|e| match &o.config_file {
        Some(file) => format!("{e} (flags or --config {})", file.display()),
        None => e,
    })?;
    resolve_auth(&mut o)?;
    if o.runonce {
        // Upstream's run-once mode takes the local sources' pods only.
        if o.kubeconfig.is_some() {
            return Err(
                "flag --runonce cannot be used with --kubeconfig: run-once mode runs \
                        only the pods of --pod-manifest-path and --manifest-url"
                    .into(),
            );
        }
        if o.pod_manifest_path.is_none() && o.manifest_url.is_none() {
            return Err(
                "flag --runonce needs --pod-manifest-path or --manifest-url: there are no pods to run"
                    .into(),
            );
        }
        if o.runonce_timeout.is_zero() {
            return Err("flag --runonce-timeout: must be greater than 0".into());
        }
    }
    Ok(Command::Run(Box::new(o)))
}

/// Webhook authorization by default on a cluster node; the webhooks need
/// the apiserver, so asking for one without `--kubeconfig` is an error.
fn resolve_auth(o: &mut Options) -> Result<(), String> {
    use AuthorizationMode;
    if o.kubeconfig.is_some() {
        o.auth.mode.get_or_insert(AuthorizationMode::Webhook);
        return Ok(());
    }
    let or_file = |field: &str| match &o.config_file {
        Some(file) => format!(" (or {field} in --config {})", file.display()),
        None => String::new(),
    };
    if o.auth.mode == Some(AuthorizationMode::Webhook) {
        return Err(format!(
            "flag --authorization-mode=Webhook{}: needs --kubeconfig (the apiserver answers SubjectAccessReviews); use AlwaysAllow on a standalone node",
            or_file("authorization.mode")
        ));
    }
    if o.auth.token_webhook {
        return Err(format!(
            "flag --authentication-token-webhook{}: needs --kubeconfig (the apiserver answers TokenReviews)",
            or_file("authentication.webhook.enabled")
        ));
    }
    Ok(())
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum FlagKind {
    /// A flag tinylet implements (in `FLAGS`).
    Own,
    /// An upstream kubelet flag tinylet ignores, boolean or with a value.
    IgnoredBool,
    IgnoredValue,
}

/// The flags tinylet implements.
const FLAGS: &[&str] = &[
    "config",
    "container-runtime-endpoint",
    "pod-manifest-path",
    "manifest-url",
    "manifest-url-header",
    "http-check-frequency",
    "bootstrap-checkpoint-path",
    "hostname-override",
    "root-dir",
    "pod-logs-dir",
    "container-log-max-size",
    "container-log-max-files",
    "file-check-frequency",
    "sync-frequency",
    "runtime-request-timeout",
    "v",
    "kubeconfig",
    "kube-api-qps",
    "kube-api-burst",
    "register-node",
    "node-status-update-frequency",
    "node-status-report-frequency",
    "node-lease-duration-seconds",
    "max-pods",
    "kube-reserved",
    "system-reserved",
    "node-ip",
    "node-labels",
    "register-with-taints",
    "image-gc-high-threshold",
    "image-gc-low-threshold",
    "minimum-image-ttl-duration",
    "maximum-dead-containers-per-container",
    "cluster-dns",
    "cluster-domain",
    "resolv-conf",
    "allow-privileged",
    "allowed-unsafe-sysctls",
    "cgroups-per-qos",
    "cgroup-driver",
    "serialize-image-pulls",
    "registry-qps",
    "registry-burst",
    "address",
    "port",
    "read-only-port",
    "healthz-bind-address",
    "healthz-port",
    "tls-cert-file",
    "tls-private-key-file",
    "cert-dir",
    "client-ca-file",
    "enable-server",
    "anonymous-auth",
    "authentication-token-webhook",
    "authentication-token-webhook-cache-ttl",
    "authorization-mode",
    "authorization-webhook-cache-authorized-ttl",
    "authorization-webhook-cache-unauthorized-ttl",
    "runonce",
    "runonce-timeout",
    "eviction-hard",
    "eviction-soft",
    "eviction-soft-grace-period",
    "eviction-minimum-reclaim",
    "eviction-pressure-transition-period",
    "eviction-max-pod-grace-period",
];

/// The boolean ones among `FLAGS`: alone they mean true.
const BOOL_FLAGS: &[&str] = &[
    "register-node",
    "serialize-image-pulls",
    "allow-privileged",
    "cgroups-per-qos",
    "enable-server",
    "anonymous-auth",
    "authentication-token-webhook",
    "runonce",
];

/// Boolean flags of the upstream kubelet, v1.20 to v1.34, that tinylet
/// accepts and ignores (with a warning at start): the flags of
/// `cmd/kubelet/app/options` (KubeletFlags and the KubeletConfiguration
/// flags), the container runtime flags of v1.20, and the global flags the
/// kubelet registers (klog, cAdvisor, logging). Listed in README.md.
pub const IGNORED_BOOL_FLAGS: &[&str] = &[
    "add-dir-header",
    "alsologtostderr",
    "contention-profiling",
    "cpu-cfs-quota",
    "docker-only",
    "docker-tls",
    "enable-cadvisor-json-endpoints",
    "enable-controller-attach-detach",
    "enable-debugging-handlers",
    "enable-load-reader",
    "exit-on-lock-contention",
    "experimental-allocatable-ignore-eviction",
    "experimental-check-node-capabilities-before-mount",
    "experimental-kernel-memcg-notification",
    "experimental-logging-sanitization",
    "fail-cgroupv1",
    "fail-swap-on",
    "keep-terminated-pod-volumes",
    "kernel-memcg-notification",
    "local-storage-capacity-isolation",
    "log-cadvisor-usage",
    "log-json-split-stream",
    "log-text-split-stream",
    "logtostderr",
    "make-iptables-util-chains",
    "one-output",
    "protect-kernel-defaults",
    "really-crash-for-testing",
    "redirect-container-streaming",
    "register-schedulable",
    "rotate-certificates",
    "rotate-server-certificates",
    "seccomp-default",
    "skip-headers",
    "skip-log-headers",
    "storage-driver-secure",
];

/// Upstream kubelet flags with a value (v1.20 to v1.34, from the same
/// sources as `IGNORED_BOOL_FLAGS`) that tinylet accepts and ignores.
pub const IGNORED_VALUE_FLAGS: &[&str] = &[
    "application-metrics-count-limit",
    "azure-container-registry-config",
    "boot-id-file",
    "bootstrap-kubeconfig",
    "cgroup-root",
    "chaos-chance",
    "cloud-config",
    "cloud-provider",
    "cni-bin-dir",
    "cni-cache-dir",
    "cni-conf-dir",
    "config-dir",
    "container-hints",
    "container-runtime",
    "containerd",
    "cpu-cfs-quota-period",
    "cpu-manager-policy",
    "cpu-manager-policy-options",
    "cpu-manager-reconcile-period",
    "docker",
    "docker-endpoint",
    "docker-env-metadata-whitelist",
    "docker-root",
    "docker-tls-ca",
    "docker-tls-cert",
    "docker-tls-key",
    "dynamic-config-dir",
    "enforce-node-allocatable",
    "event-burst",
    "event-qps",
    "event-storage-age-limit",
    "event-storage-event-limit",
    "experimental-bootstrap-kubeconfig",
    "experimental-dockershim-root-directory",
    "experimental-mounter-path",
    "feature-gates",
    "global-housekeeping-interval",
    "hairpin-mode",
    "housekeeping-interval",
    "image-credential-provider-bin-dir",
    "image-credential-provider-config",
    "image-pull-progress-deadline",
    "image-service-endpoint",
    "iptables-drop-bit",
    "iptables-masquerade-bit",
    "kube-api-content-type",
    "kube-reserved-cgroup",
    "kubelet-cgroups",
    "lock-file",
    "log-backtrace-at",
    "log-dir",
    "log-file",
    "log-file-max-size",
    "log-flush-frequency",
    "log-json-info-buffer-size",
    "log-text-info-buffer-size",
    "logging-format",
    "machine-id-file",
    "master-service-namespace",
    "max-open-files",
    "maximum-dead-containers",
    "memory-manager-policy",
    "minimum-container-ttl-duration",
    "network-plugin",
    "network-plugin-mtu",
    "node-status-max-images",
    "non-masquerade-cidr",
    "oom-score-adj",
    "pod-cidr",
    "pod-infra-container-image",
    "pod-max-pids",
    "pods-per-core",
    "provider-id",
    "qos-reserved",
    "reserved-cpus",
    "reserved-memory",
    "runtime-cgroups",
    "seccomp-profile-root",
    "stderrthreshold",
    "storage-driver-buffer-duration",
    "storage-driver-db",
    "storage-driver-host",
    "storage-driver-password",
    "storage-driver-table",
    "storage-driver-user",
    "streaming-connection-idle-timeout",
    "system-cgroups",
    "system-reserved-cgroup",
    "tls-cipher-suites",
    "tls-min-version",
    "topology-manager-policy",
    "topology-manager-policy-options",
    "topology-manager-scope",
    "vmodule",
    "volume-plugin-dir",
    "volume-stats-agg-period",
];

/// Parses a comma-separated list of IP addresses; empty input is none.
pub fn parse_ips(v: &str) -> Result<Vec<std::net::IpAddr>, String> {
    v.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| s.parse().map_err(|_| format!("{s:?} is not an IP address")))
        .collect()
}

/// `--container-log-max-size` / `containerLogMaxSize`: a quantity of bytes.
fn log_max_size(v: &str) -> Result<u64, String> {
    crate::quantity::parse_bytes(v)
        .and_then(|n| u64::try_from(n).ok())
        .ok_or_else(|| format!("invalid quantity {v:?} (want e.g. 10Mi)"))
}

/// `--container-log-max-files` / `containerLogMaxFiles`: upstream refuses
/// fewer than 2 (the live file and one rotated).
fn log_max_files(n: u64) -> Result<usize, String> {
    if n < 2 {
        return Err(format!("{n} must be greater than 1"));
    }
    Ok(usize::try_from(n).unwrap_or(usize::MAX))
}

fn number<T: std::str::FromStr>(flag: &str, v: &str) -> Result<T, String> {
    v.parse()
        .map_err(|_| format!("flag --{flag}: invalid number {v:?}"))
}

fn boolean(flag: &str, v: &str) -> Result<bool, String> {
    match v {
        "true" | "1" | "t" | "T" | "TRUE" | "True" => Ok(true),
        "false" | "0" | "f" | "F" | "FALSE" | "False" => Ok(false),
        _ => Err(format!("flag --{flag}: invalid boolean {v:?}")),
    }
}

/// Parses `k=v,k2=v2` (or with another separator); empty input is no pairs.
pub fn parse_pairs(v: &str, sep: char) -> Result<Vec<(String, String)>, String> {
    let mut out = Vec::new();
    for item in v.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let Some((k, val)) = item.split_once(sep) else {
            return Err(format!("{item:?} is not key{sep}value"));
        };
        if k.trim().is_empty() {
            return Err(format!("{item:?} has an empty key"));
        }
        out.push((k.trim().to_string(), val.trim().to_string()));
    }
    Ok(out)
}

/// Label keys in the kubernetes.io and k8s.io namespaces that a kubelet may
/// set on its own Node (NodeRestriction refuses the others).
const KUBELET_LABELS: &[&str] = &[
    "kubernetes.io/hostname",
    "kubernetes.io/arch",
    "kubernetes.io/os",
    "beta.kubernetes.io/arch",
    "beta.kubernetes.io/os",
    "beta.kubernetes.io/instance-type",
    "node.kubernetes.io/instance-type",
    "topology.kubernetes.io/region",
    "topology.kubernetes.io/zone",
    "failure-domain.beta.kubernetes.io/region",
    "failure-domain.beta.kubernetes.io/zone",
];

/// Label namespaces under kubernetes.io / k8s.io that a kubelet may use freely.
const KUBELET_LABEL_NAMESPACES: &[&str] = &["kubelet.kubernetes.io", "node.kubernetes.io"];

/// Parses `--node-labels`: `k=v` pairs whose keys are valid label keys and,
/// in the kubernetes.io and k8s.io namespaces, allowed for a kubelet (the
/// upstream kubelet refuses to start with the others, as NodeRestriction
/// would refuse them).
pub fn parse_node_labels(v: &str) -> Result<Vec<(String, String)>, String> {
    let pairs = parse_pairs(v, '=')?;
    for (k, _) in &pairs {
        let (prefix, name) = match k.split_once('/') {
            Some((p, n)) => (Some(p), n),
            None => (None, k.as_str()),
        };
        if name.is_empty() || name.len() > 63 {
            return Err(format!("label key {k:?}: name must be 1-63 characters"));
        }
        let Some(prefix) = prefix else { continue };
        let kube = prefix == "kubernetes.io"
            || prefix.ends_with(".kubernetes.io")
            || prefix == "k8s.io"
            || prefix.ends_with(".k8s.io");
        let allowed = KUBELET_LABELS.contains(&k.as_str())
            || KUBELET_LABEL_NAMESPACES
                .iter()
                .any(|ns| prefix == *ns || prefix.ends_with(&format!(".{ns}")));
        if kube && !allowed {
            return Err(format!(
                "label {k:?} is in the kubernetes.io or k8s.io namespace and not one a kubelet may set \
                 (allowed: {}, and keys under kubelet.kubernetes.io/ and node.kubernetes.io/)",
                KUBELET_LABELS.join(", ")
            ));
        }
    }
    Ok(pairs)
}

/// Parses `--register-with-taints`: `key=value:Effect` or `key:Effect`, with
/// Effect one of NoSchedule, PreferNoSchedule, NoExecute.
pub fn parse_taints(v: &str) -> Result<Vec<Taint>, String> {
    let mut out = Vec::new();
    for item in v.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let Some((kv, effect)) = item.rsplit_once(':') else {
            return Err(format!("taint {item:?}: want key=value:Effect"));
        };
        if !["NoSchedule", "PreferNoSchedule", "NoExecute"].contains(&effect) {
            return Err(format!(
                "taint {item:?}: effect {effect:?} is not NoSchedule, PreferNoSchedule or NoExecute"
            ));
        }
        let (key, value) = kv.split_once('=').unwrap_or((kv, ""));
        if key.is_empty() {
            return Err(format!("taint {item:?}: empty key"));
        }
        out.push(Taint {
            key: key.to_string(),
            value: value.to_string(),
            effect: effect.to_string(),
        });
    }
    Ok(out)
}

/// The `apiVersion` and `kind` of a kubelet configuration file.
pub const CONFIG_API_VERSION: &str = "kubelet.config.k8s.io/v1beta1";
pub const CONFIG_KIND: &str = "KubeletConfiguration";

/// Largest configuration file read.
const CONFIG_FILE_MAX: u64 = 1024 * 1024;

/// Applies the fields tinylet knows from a KubeletConfiguration file (YAML
/// or JSON) to `o`; the others are recorded in `o.ignored_config_fields`.
/// Errors name the file and the field.
pub fn apply_config_file(o: &mut Options, path: &Path) -> Result<(), String> {
    let file = path.display();
    let md = std::fs::metadata(path).map_err(|e| format!("--config {file}: {e}"))?;
    if md.len() > CONFIG_FILE_MAX {
        return Err(format!(
            "--config {file}: {} bytes, over the limit of {CONFIG_FILE_MAX}",
            md.len()
        ));
    }
    let bytes = std::fs::read(path).map_err(|e| format!("--config {file}: {e}"))?;
    let doc = parse_object(&bytes).map_err(|e| format!("--config {file}: {e}"))?;
    let Value::Object(fields) = doc else {
        return Err(format!("--config {file}: not an object"));
    };
    let err = |field: &str, msg: String| format!("--config {file}: {field}: {msg}");
    for (field, want) in [("apiVersion", CONFIG_API_VERSION), ("kind", CONFIG_KIND)] {
        match fields.get(field) {
            Some(Value::String(v)) if v == want => {}
            Some(other) => return Err(err(field, format!("expected {want:?}, found {other}"))),
            None => return Err(err(field, format!("Required value ({want:?})"))),
        }
    }
    let string = |field: &str, v: &Value| -> Result<String, String> {
        v.as_str()
            .map(str::to_string)
            .ok_or_else(|| err(field, format!("expected a string, found {v}")))
    };
    let unsigned = |field: &str, v: &Value| -> Result<u32, String> {
        v.as_u64()
            .and_then(|n| u32::try_from(n).ok())
            .ok_or_else(|| err(field, format!("expected a non-negative integer, found {v}")))
    };
    let percent = |field: &str, v: &Value| -> Result<u8, String> {
        v.as_u64()
            .filter(|n| *n <= 100)
            .map(|n| n as u8)
            .ok_or_else(|| {
                err(
                    field,
                    format!("expected a percentage from 0 to 100, found {v}"),
                )
            })
    };
    let duration = |field: &str, v: &Value| -> Result<Duration, String> {
        let s = string(field, v)?;
        parse_duration(&s).map_err(|e| err(field, e))
    };
    for (field, v) in &fields {
        match field.as_str() {
            "apiVersion" | "kind" => {}
            "staticPodPath" => {
                let s = string(field, v)?;
                o.pod_manifest_path = (!s.is_empty()).then(|| PathBuf::from(s));
            }
            "staticPodURL" => {
                let s = string(field, v)?;
                o.manifest_url = (!s.is_empty()).then_some(s);
            }
            "staticPodURLHeader" => {
                let Value::Object(map) = v else {
                    return Err(err(field, format!("expected a map of lists, found {v}")));
                };
                o.manifest_url_headers.clear();
                for (name, values) in map {
                    let at = format!("{field}.{name}");
                    let Value::Array(values) = values else {
                        return Err(err(
                            &at,
                            format!("expected a list of strings, found {values}"),
                        ));
                    };
                    for (i, value) in values.iter().enumerate() {
                        let at = format!("{at}[{i}]");
                        let value = string(&at, value)?;
                        crate::config::http::check_header(name, &value).map_err(|e| err(&at, e))?;
                        o.manifest_url_headers.push((name.clone(), value));
                    }
                }
            }
            "fileCheckFrequency" => o.file_check_frequency = duration(field, v)?,
            "httpCheckFrequency" => o.http_check_frequency = duration(field, v)?,
            "syncFrequency" => o.sync_frequency = duration(field, v)?,
            "runtimeRequestTimeout" => o.runtime_request_timeout = duration(field, v)?,
            "containerRuntimeEndpoint" => o.container_runtime_endpoint = string(field, v)?,
            "podLogsDir" => o.pod_logs_dir = PathBuf::from(string(field, v)?),
            "containerLogMaxSize" => {
                o.container_log_max_size =
                    log_max_size(&string(field, v)?).map_err(|e| err(field, e))?
            }
            "containerLogMaxFiles" => {
                let n = v.as_u64().ok_or_else(|| {
                    err(field, format!("expected a non-negative integer, found {v}"))
                })?;
                o.container_log_max_files = log_max_files(n).map_err(|e| err(field, e))?;
            }
            "kubeAPIQPS" => {
                o.kube_api_qps = v
                    .as_f64()
                    .filter(|q| *q >= 0.0)
                    .ok_or_else(|| err(field, format!("expected a number >= 0, found {v}")))?
                    as f32;
            }
            "kubeAPIBurst" => o.kube_api_burst = unsigned(field, v)?,
            "serializeImagePulls" => {
                o.serialize_image_pulls = v
                    .as_bool()
                    .ok_or_else(|| err(field, format!("expected true or false, found {v}")))?;
            }
            "registryPullQPS" => {
                o.registry_qps = v
                    .as_f64()
                    .filter(|q| *q >= 0.0)
                    .ok_or_else(|| err(field, format!("expected a number >= 0, found {v}")))?
                    as f32;
            }
            "registryBurst" => o.registry_burst = unsigned(field, v)?,
            "maxPods" => o.max_pods = unsigned(field, v)?,
            "evictionHard"
            | "evictionSoft"
            | "evictionSoftGracePeriod"
            | "evictionMinimumReclaim" => {
                let Value::Object(map) = v else {
                    return Err(err(field, format!("expected a map of strings, found {v}")));
                };
                let mut out = std::collections::BTreeMap::new();
                for (k, val) in map {
                    out.insert(k.clone(), string(&format!("{field}.{k}"), val)?);
                }
                let e = &mut o.eviction;
                let map = match field.as_str() {
                    "evictionHard" => &mut e.hard,
                    "evictionSoft" => &mut e.soft,
                    "evictionSoftGracePeriod" => &mut e.soft_grace_period,
                    "evictionMinimumReclaim" => &mut e.minimum_reclaim,
                    _ => continue,
                };
                *map = out;
            }
            "evictionPressureTransitionPeriod" => {
                o.eviction.pressure_transition_period = duration(field, v)?
            }
            "evictionMaxPodGracePeriod" => {
                o.eviction.max_pod_grace_period = v
                    .as_i64()
                    .ok_or_else(|| err(field, format!("expected an integer, found {v}")))?
            }
            "imageGCHighThresholdPercent" => o.image_gc.high_threshold = percent(field, v)?,
            "imageGCLowThresholdPercent" => o.image_gc.low_threshold = percent(field, v)?,
            "imageMinimumGCAge" => o.image_gc.min_age = duration(field, v)?,
            "nodeLeaseDurationSeconds" => o.node_lease_duration_seconds = unsigned(field, v)?,
            "nodeStatusUpdateFrequency" => o.node_status_update_frequency = duration(field, v)?,
            "nodeStatusReportFrequency" => o.node_status_report_frequency = duration(field, v)?,
            "clusterDNS" => {
                let Value::Array(items) = v else {
                    return Err(err(
                        field,
                        format!("expected a list of IP addresses, found {v}"),
                    ));
                };
                o.cluster_dns.clear();
                for (i, item) in items.iter().enumerate() {
                    let at = format!("{field}[{i}]");
                    let s = string(&at, item)?;
                    o.cluster_dns.push(
                        s.parse()
                            .map_err(|_| err(&at, format!("{s:?} is not an IP address")))?,
                    );
                }
            }
            "clusterDomain" => {
                o.cluster_domain = string(field, v)?.trim_end_matches('.').to_string()
            }
            "resolvConf" => o.resolv_conf = PathBuf::from(string(field, v)?),
            "cgroupsPerQOS" => {
                o.cgroups_per_qos = v
                    .as_bool()
                    .ok_or_else(|| err(field, format!("expected true or false, found {v}")))?;
            }
            "configMapAndSecretChangeDetectionStrategy" => {
                o.change_detection = crate::volume::Strategy::parse(&string(field, v)?)
                    .map_err(|e| err(field, e))?;
            }
            "cgroupDriver" => {
                o.cgroup_driver = crate::runtime::qos::CgroupDriver::parse(&string(field, v)?)
                    .map_err(|e| err(field, e))?;
            }
            // Not a KubeletConfiguration field: tinylet's own, like its flag.
            "allowPrivileged" => {
                o.allow_privileged = v
                    .as_bool()
                    .ok_or_else(|| err(field, format!("expected true or false, found {v}")))?;
            }
            "allowedUnsafeSysctls" => {
                let Value::Array(items) = v else {
                    return Err(err(
                        field,
                        format!("expected a list of sysctl names or patterns, found {v}"),
                    ));
                };
                o.allowed_unsafe_sysctls.clear();
                for (i, item) in items.iter().enumerate() {
                    o.allowed_unsafe_sysctls
                        .push(string(&format!("{field}[{i}]"), item)?);
                }
            }
            "registerNode" => {
                o.register_node = v
                    .as_bool()
                    .ok_or_else(|| err(field, format!("expected true or false, found {v}")))?;
            }
            "kubeReserved" | "systemReserved" => {
                let Value::Object(map) = v else {
                    return Err(err(
                        field,
                        format!("expected a map of quantities, found {v}"),
                    ));
                };
                let mut pairs = Vec::new();
                for (name, q) in map {
                    pairs.push((name.clone(), string(&format!("{field}.{name}"), q)?));
                }
                if field == "kubeReserved" {
                    o.kube_reserved = pairs;
                } else {
                    o.system_reserved = pairs;
                }
            }
            "registerWithTaints" => {
                let Value::Array(items) = v else {
                    return Err(err(field, format!("expected a list of taints, found {v}")));
                };
                o.register_with_taints.clear();
                for (i, t) in items.iter().enumerate() {
                    let at = format!("{field}[{i}]");
                    let get = |k: &str| t.get(k).and_then(Value::as_str).unwrap_or("");
                    let text = if get("value").is_empty() {
                        format!("{}:{}", get("key"), get("effect"))
                    } else {
                        format!("{}={}:{}", get("key"), get("value"), get("effect"))
                    };
                    let mut parsed = parse_taints(&text).map_err(|e| err(&at, e))?;
                    if parsed.len() != 1 {
                        return Err(err(&at, "expected one taint with key and effect".into()));
                    }
                    o.register_with_taints.append(&mut parsed);
                }
            }
            "address" | "healthzBindAddress" => {
                let text = string(field, v)?;
                let ip = text
                    .parse()
                    .map_err(|_| err(field, format!("{text:?} is not an IP address")))?;
                if field == "address" {
                    o.address = ip;
                } else {
                    o.healthz_bind_address = ip;
                }
            }
            "port" | "readOnlyPort" | "healthzPort" => {
                let port = v
                    .as_u64()
                    .and_then(|n| u16::try_from(n).ok())
                    .ok_or_else(|| {
                        err(field, format!("expected a port from 0 to 65535, found {v}"))
                    })?;
                match field.as_str() {
                    "port" => {
                        o.port = port;
                        o.port_given = true;
                    }
                    "readOnlyPort" => o.read_only_port = port,
                    _ => {
                        o.healthz_port = port;
                        o.healthz_given = true;
                    }
                }
            }
            "tlsCertFile" | "tlsPrivateKeyFile" => {
                let s = string(field, v)?;
                let path = (!s.is_empty()).then(|| PathBuf::from(s));
                if field == "tlsCertFile" {
                    o.tls_cert_file = path;
                } else {
                    o.tls_private_key_file = path;
                }
            }
            "enableServer" => {
                o.enable_server = Some(
                    v.as_bool()
                        .ok_or_else(|| err(field, format!("expected true or false, found {v}")))?,
                );
            }
            "authentication" | "authorization" => {
                let Value::Object(section) = v else {
                    return Err(err(field, format!("expected an object, found {v}")));
                };
                for (key, sub) in section {
                    let at = format!("{field}.{key}");
                    match (field.as_str(), key.as_str()) {
                        ("authorization", "mode") => {
                            o.auth.mode = Some(
                                AuthorizationMode::parse(&string(&at, sub)?)
                                    .map_err(|e| err(&at, e))?,
                            );
                        }
                        ("authentication", "x509") => {
                            let ca = sub.get("clientCAFile").unwrap_or(&Value::Null);
                            if !ca.is_null() {
                                let s = string(&format!("{at}.clientCAFile"), ca)?;
                                o.client_ca_file = (!s.is_empty()).then(|| PathBuf::from(s));
                            }
                        }
                        ("authentication", "anonymous" | "webhook")
                        | ("authorization", "webhook") => {
                            let Value::Object(inner) = sub else {
                                return Err(err(&at, format!("expected an object, found {sub}")));
                            };
                            for (name, x) in inner {
                                let at = format!("{at}.{name}");
                                let flag = |x: &Value| {
                                    x.as_bool().ok_or_else(|| {
                                        err(&at, format!("expected true or false, found {x}"))
                                    })
                                };
                                match (field.as_str(), key.as_str(), name.as_str()) {
                                    ("authentication", "anonymous", "enabled") => {
                                        o.auth.anonymous = flag(x)?
                                    }
                                    ("authentication", "webhook", "enabled") => {
                                        o.auth.token_webhook = flag(x)?
                                    }
                                    ("authentication", "webhook", "cacheTTL") => {
                                        o.auth.token_cache_ttl = duration(&at, x)?
                                    }
                                    ("authorization", "webhook", "cacheAuthorizedTTL") => {
                                        o.auth.authorized_ttl = duration(&at, x)?
                                    }
                                    ("authorization", "webhook", "cacheUnauthorizedTTL") => {
                                        o.auth.unauthorized_ttl = duration(&at, x)?
                                    }
                                    _ => o.ignored_config_fields.push(at),
                                }
                            }
                        }
                        _ => o.ignored_config_fields.push(at),
                    }
                }
            }
            _ => o.ignored_config_fields.push(field.clone()),
        }
    }
    Ok(())
}

/// `--authorization-mode`: the two modes the kubelet accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuthorizationMode {
    AlwaysAllow,
    Webhook,
}

impl AuthorizationMode {
    pub fn parse(s: &str) -> Result<AuthorizationMode, String> {
        match s {
            "AlwaysAllow" => Ok(AuthorizationMode::AlwaysAllow),
            "Webhook" => Ok(AuthorizationMode::Webhook),
            _ => Err(format!(
                "unknown authorization mode {s:?} (want AlwaysAllow or Webhook)"
            )),
        }
    }
}

/// The node API's authentication and authorization settings, resolved
/// from the flags and the configuration file (`server::auth` uses them).
#[derive(Debug, Clone, PartialEq)]
pub struct AuthConfig {
    /// The Node every request is authorized against.
    pub node_name: String,
    /// `--anonymous-auth` (tinylet's default: false).
    pub anonymous: bool,
    /// `--authentication-token-webhook`.
    pub token_webhook: bool,
    /// `--authentication-token-webhook-cache-ttl`, for accepted and
    /// refused tokens alike; zero: no cache.
    pub token_cache_ttl: Duration,
    /// `--authorization-mode`; none (standalone without the flag): every
    /// request is refused.
    pub mode: Option<AuthorizationMode>,
    /// `--authorization-webhook-cache-authorized-ttl`.
    pub authorized_ttl: Duration,
    /// `--authorization-webhook-cache-unauthorized-ttl`.
    pub unauthorized_ttl: Duration,
}

impl Default for AuthConfig {
    fn default() -> Self {
        AuthConfig {
            node_name: String::new(),
            anonymous: false,
            token_webhook: false,
            token_cache_ttl: Duration::from_secs(2 * 60),
            mode: None,
            authorized_ttl: Duration::from_secs(5 * 60),
            unauthorized_ttl: Duration::from_secs(30),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Command, String> {
        parse_args(args.iter().map(|s| s.to_string()))
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("20s"), Ok(Duration::from_secs(20)));
        assert_eq!(parse_duration("1m30s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("1.5h"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse_duration("0"), Ok(Duration::ZERO));
        assert!(parse_duration("20").is_err());
        assert!(parse_duration("s").is_err());
        assert!(parse_duration("5parsecs").is_err());
        assert!(parse_duration("").is_err());
    }

    #[test]
    fn flags_in_both_forms() {
        let Ok(Command::Run(o)) = parse(&[
            "--container-runtime-endpoint",
            "unix:///tmp/c.sock",
            "--pod-manifest-path=/etc/m",
            "--hostname-override",
            "edge-1",
            "--root-dir",
            "/tmp/r",
            "--file-check-frequency=5s",
            "--sync-frequency",
            "30s",
            "-v",
            "4",
        ]) else {
            panic!("parse failed");
        };
        assert_eq!(o.container_runtime_endpoint, "unix:///tmp/c.sock");
        assert_eq!(o.pod_manifest_path, Some(PathBuf::from("/etc/m")));
        assert_eq!(o.hostname_override.as_deref(), Some("edge-1"));
        assert_eq!(o.root_dir, PathBuf::from("/tmp/r"));
        assert_eq!(o.file_check_frequency, Duration::from_secs(5));
        assert_eq!(o.sync_frequency, Duration::from_secs(30));
        assert_eq!(o.verbosity, 4);
        assert_eq!(
            parse(&["--v=2"]).map(|c| matches!(c, Command::Run(o) if o.verbosity == 2)),
            Ok(true)
        );
    }

    #[test]
    fn bad_flags_are_named() {
        assert_eq!(parse(&["--bogus"]), Err("unknown flag --bogus".into()));
        assert_eq!(
            parse(&["--root-dir"]),
            Err("flag --root-dir needs a value".into())
        );
        assert!(parse(&["--sync-frequency", "soon"])
            .unwrap_err()
            .contains("--sync-frequency"));
        assert!(parse(&["--v", "loud"]).unwrap_err().contains("--v"));
        assert!(parse(&["stray"]).unwrap_err().contains("stray"));
        assert_eq!(parse(&["--help"]), Ok(Command::Help));
        assert_eq!(parse(&["--version"]), Ok(Command::Version));
    }

    fn run(args: &[&str]) -> Options {
        match parse(args) {
            Ok(Command::Run(o)) => *o,
            other => panic!("{args:?}: {other:?}"),
        }
    }

    fn headers(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(n, v)| (n.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn manifest_url_flags() {
        let o = run(&[
            "--manifest-url",
            "http://cfg.local/pods",
            "--manifest-url-header",
            "Authorization:Bearer a:b",
            "--manifest-url-header=X-A:1,X-B:two words",
            "--http-check-frequency=5s",
            "--bootstrap-checkpoint-path",
            "/var/lib/tinylet/checkpoints",
        ]);
        assert_eq!(o.manifest_url.as_deref(), Some("http://cfg.local/pods"));
        assert_eq!(
            o.manifest_url_headers,
            headers(&[
                ("Authorization", "Bearer a:b"),
                ("X-A", "1"),
                ("X-B", "two words")
            ])
        );
        assert_eq!(o.http_check_frequency, Duration::from_secs(5));
        assert_eq!(
            o.bootstrap_checkpoint_path,
            Some(PathBuf::from("/var/lib/tinylet/checkpoints"))
        );
        let defaults = run(&[]);
        assert_eq!(defaults.manifest_url, None);
        assert_eq!(defaults.http_check_frequency, Duration::from_secs(20));
        assert!(parse(&["--manifest-url-header", "NoColon"])
            .unwrap_err()
            .contains("--manifest-url-header"));
        assert!(parse(&["--manifest-url-header", "Bad Name:v"])
            .unwrap_err()
            .contains("Bad Name"));
        assert!(parse(&["--manifest-url", "ftp://h/x"])
            .unwrap_err()
            .starts_with("flag --manifest-url: "));
        assert_eq!(
            parse(&["--http-check-frequency", "0"]),
            Err("flag --http-check-frequency: must be greater than 0".into())
        );
    }

    #[test]
    fn cluster_flags() {
        let o = run(&[
            "--kubeconfig",
            "/etc/kubernetes/kubelet.conf",
            "--kube-api-qps=5",
            "--kube-api-burst",
            "10",
            "--node-status-update-frequency=4s",
            "--node-lease-duration-seconds",
            "20",
            "--max-pods=30",
            "--kube-reserved",
            "cpu=100m,memory=256Mi",
            "--node-ip",
            "192.0.2.7",
            "--node-labels",
            "tier=edge,node.kubernetes.io/site=a,kubernetes.io/hostname=x",
            "--register-with-taints",
            "dedicated=edge:NoSchedule,spot:NoExecute",
            "--register-node=false",
        ]);
        assert_eq!(
            o.kubeconfig,
            Some(PathBuf::from("/etc/kubernetes/kubelet.conf"))
        );
        assert_eq!((o.kube_api_qps, o.kube_api_burst), (5.0, 10));
        assert_eq!(o.node_status_update_frequency, Duration::from_secs(4));
        assert_eq!(o.node_status_report_frequency, Duration::from_secs(300));
        assert_eq!((o.node_lease_duration_seconds, o.max_pods), (20, 30));
        assert_eq!(
            o.kube_reserved,
            headers(&[("cpu", "100m"), ("memory", "256Mi")])
        );
        assert_eq!(o.node_ip, Some("192.0.2.7".parse().unwrap()));
        assert_eq!(o.node_labels.len(), 3);
        assert_eq!(
            o.register_with_taints,
            vec![
                Taint {
                    key: "dedicated".into(),
                    value: "edge".into(),
                    effect: "NoSchedule".into()
                },
                Taint {
                    key: "spot".into(),
                    value: "".into(),
                    effect: "NoExecute".into()
                },
            ]
        );
        assert!(!o.register_node);
        let d = run(&[]);
        assert_eq!(
            (d.kube_api_qps, d.kube_api_burst, d.max_pods),
            (50.0, 100, 110)
        );
        assert!(d.register_node && d.kubeconfig.is_none());

        for (args, want) in [
            (
                &["--node-labels", "kubernetes.io/role=master"][..],
                "kubernetes.io/role",
            ),
            (
                &["--node-labels", "node-restriction.kubernetes.io/x=y"][..],
                "node-restriction",
            ),
            (
                &["--register-with-taints", "a=b:Sometimes"][..],
                "Sometimes",
            ),
            (&["--node-ip", "edge"][..], "--node-ip"),
            (&["--kube-api-qps", "-1"][..], "--kube-api-qps"),
            (&["--max-pods", "many"][..], "--max-pods"),
            (&["--kube-reserved", "cpu"][..], "--kube-reserved"),
        ] {
            let e = parse(args).unwrap_err();
            assert!(e.contains(want), "{args:?}: {e}");
        }
    }

    const CONFIG: &str = "apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
staticPodPath: /etc/kubernetes/manifests
staticPodURL: http://cfg.local/pods
staticPodURLHeader:
  Authorization: [\"Bearer t\"]
  X-Multi: [a, b]
fileCheckFrequency: 7s
httpCheckFrequency: 1m
syncFrequency: 30s
containerRuntimeEndpoint: unix:///run/crio/crio.sock
podLogsDir: /srv/logs
runtimeRequestTimeout: 15s
kubeAPIQPS: 7
kubeAPIBurst: 14
maxPods: 50
nodeStatusUpdateFrequency: 20s
kubeReserved: {cpu: 200m}
registerWithTaints: [{key: k, value: v, effect: NoSchedule}]
authentication: {anonymous: {enabled: false}}
cgroupDriver: systemd
configMapAndSecretChangeDetectionStrategy: Cache
";

    #[test]
    fn eviction_flags_and_config_fields() {
        let o = run(&[]);
        assert_eq!(o.eviction, crate::eviction::Settings::default());
        assert_eq!(o.eviction.hard.len(), 4);
        // The first use replaces the default map, later ones add to it.
        let o = run(&[
            "--eviction-hard",
            "memory.available<1Gi",
            "--eviction-hard=nodefs.available<5%",
            "--eviction-soft",
            "memory.available<2Gi",
            "--eviction-soft-grace-period",
            "memory.available=1m",
            "--eviction-minimum-reclaim",
            "nodefs.available=1Gi",
            "--eviction-pressure-transition-period",
            "30s",
            "--eviction-max-pod-grace-period",
            "20",
        ]);
        let e = &o.eviction;
        assert_eq!(
            e.hard
                .iter()
                .map(|(k, v)| format!("{k}<{v}"))
                .collect::<Vec<_>>(),
            ["memory.available<1Gi", "nodefs.available<5%"]
        );
        assert_eq!(e.soft["memory.available"], "2Gi");
        assert_eq!(e.soft_grace_period["memory.available"], "1m");
        assert_eq!(e.minimum_reclaim["nodefs.available"], "1Gi");
        assert_eq!(e.pressure_transition_period, Duration::from_secs(30));
        assert_eq!(e.max_pod_grace_period, 20);
        assert!(!o.ignored_flags.iter().any(|f| f.starts_with("eviction")));

        let dir = tempfile::tempdir().unwrap();
        let file = config_file(
            &dir,
            "k.yaml",
            "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n\
             evictionHard: {imagefs.available: 20%}\n\
             evictionSoft: {nodefs.available: 30%}\n\
             evictionSoftGracePeriod: {nodefs.available: 2m}\n\
             evictionPressureTransitionPeriod: 1m\nevictionMaxPodGracePeriod: 5\n",
        );
        let o = run(&["--config", &file]);
        assert_eq!(o.eviction.hard.len(), 1);
        assert_eq!(o.eviction.hard["imagefs.available"], "20%");
        assert_eq!(o.eviction.soft["nodefs.available"], "30%");
        assert_eq!(
            o.eviction.pressure_transition_period,
            Duration::from_secs(60)
        );
        assert_eq!(o.eviction.max_pod_grace_period, 5);

        for (args, want) in [
            (
                &["--eviction-hard", "memory.free<1Gi"][..],
                "unsupported eviction signal memory.free",
            ),
            (
                &["--eviction-soft", "memory.available<1Gi"][..],
                "grace period must be specified",
            ),
            (
                &["--eviction-hard", "memory.available=1Gi"][..],
                "flag --eviction-hard: malformed pair",
            ),
        ] {
            let e = parse(args).unwrap_err();
            assert!(e.contains(want), "{args:?}: {e}");
        }
    }

    fn config_file(dir: &tempfile::TempDir, name: &str, text: &str) -> String {
        let path = dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        path.display().to_string()
    }

    #[test]
    fn the_change_detection_strategy_defaults_to_watch_and_refuses_others() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(run(&[]).change_detection, crate::volume::Strategy::Watch);
        let file = config_file(&dir, "get.yaml", "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nconfigMapAndSecretChangeDetectionStrategy: Get\n");
        assert_eq!(
            run(&["--config", &file]).change_detection,
            crate::volume::Strategy::Get
        );
        let file = config_file(&dir, "bad.yaml", "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nconfigMapAndSecretChangeDetectionStrategy: Poll\n");
        let e = parse(&["--config", &file]).unwrap_err();
        assert!(
            e.contains("configMapAndSecretChangeDetectionStrategy") && e.contains("Poll"),
            "{e}"
        );
    }

    #[test]
    fn config_file_fields_and_flag_precedence() {
        let dir = tempfile::tempdir().unwrap();
        let file = config_file(&dir, "kubelet.yaml", CONFIG);
        let o = run(&["--config", &file]);
        assert_eq!(o.config_file, Some(PathBuf::from(&file)));
        assert_eq!(
            o.pod_manifest_path,
            Some(PathBuf::from("/etc/kubernetes/manifests"))
        );
        assert_eq!(o.manifest_url.as_deref(), Some("http://cfg.local/pods"));
        assert_eq!(
            o.manifest_url_headers,
            headers(&[
                ("Authorization", "Bearer t"),
                ("X-Multi", "a"),
                ("X-Multi", "b")
            ])
        );
        assert_eq!(o.file_check_frequency, Duration::from_secs(7));
        assert_eq!(o.http_check_frequency, Duration::from_secs(60));
        assert_eq!(o.sync_frequency, Duration::from_secs(30));
        assert_eq!(o.container_runtime_endpoint, "unix:///run/crio/crio.sock");
        assert_eq!(o.pod_logs_dir, PathBuf::from("/srv/logs"));
        assert_eq!(o.runtime_request_timeout, Duration::from_secs(15));
        // `authentication` is read (its x509 client CA) by the node API.
        assert!(
            o.ignored_config_fields.is_empty(),
            "{:?}",
            o.ignored_config_fields
        );
        assert!(!o.auth.anonymous);
        assert_eq!(o.cgroup_driver, crate::runtime::qos::CgroupDriver::Systemd);
        assert_eq!(o.change_detection, crate::volume::Strategy::Cache);
        assert_eq!(
            (o.kube_api_qps, o.kube_api_burst, o.max_pods),
            (7.0, 14, 50)
        );
        assert_eq!(o.node_status_update_frequency, Duration::from_secs(20));
        assert_eq!(o.kube_reserved, headers(&[("cpu", "200m")]));
        assert_eq!(o.register_with_taints.len(), 1);

        // Flags win, wherever --config stands; header flags replace the
        // file's headers as a whole.
        let o = run(&[
            "--pod-manifest-path",
            "/m",
            "--file-check-frequency=2s",
            "--manifest-url-header",
            "X-Flag:1",
            "--config",
            &file,
        ]);
        assert_eq!(o.pod_manifest_path, Some(PathBuf::from("/m")));
        assert_eq!(o.file_check_frequency, Duration::from_secs(2));
        assert_eq!(o.manifest_url_headers, headers(&[("X-Flag", "1")]));
        assert_eq!(o.http_check_frequency, Duration::from_secs(60));

        // JSON works too.
        let json = config_file(
            &dir,
            "kubelet.json",
            r#"{"apiVersion":"kubelet.config.k8s.io/v1beta1","kind":"KubeletConfiguration","staticPodPath":"/j"}"#,
        );
        assert_eq!(
            run(&["--config", &json]).pod_manifest_path,
            Some(PathBuf::from("/j"))
        );
    }

    #[test]
    fn config_file_errors_name_file_and_field() {
        let dir = tempfile::tempdir().unwrap();
        let head = "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n";
        let cases = [
            (
                "dur.yaml",
                format!("{head}fileCheckFrequency: soon\n"),
                "fileCheckFrequency: invalid duration",
            ),
            (
                "zero.yaml",
                format!("{head}httpCheckFrequency: 0s\n"),
                "httpCheckFrequency in --config",
            ),
            (
                "type.yaml",
                format!("{head}staticPodPath: 3\n"),
                "staticPodPath: expected a string",
            ),
            (
                "hdr.yaml",
                format!("{head}staticPodURLHeader: {{A: b}}\n"),
                "staticPodURLHeader.A: expected a list",
            ),
            (
                "hdrval.yaml",
                format!("{head}staticPodURLHeader: {{A: [1]}}\n"),
                "staticPodURLHeader.A[0]: expected a string",
            ),
            (
                "hdrname.yaml",
                format!("{head}staticPodURLHeader: {{\"B C\": [x]}}\n"),
                "staticPodURLHeader.B C[0]: header name",
            ),
            (
                "kind.yaml",
                "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: Pod\n".to_string(),
                "kind: expected \"KubeletConfiguration\"",
            ),
            (
                "nokind.yaml",
                "apiVersion: kubelet.config.k8s.io/v1beta1\n".to_string(),
                "kind: Required value",
            ),
            (
                "api.yaml",
                "apiVersion: v1\nkind: KubeletConfiguration\n".to_string(),
                "apiVersion: expected",
            ),
            ("syntax.yaml", "kind: [\n".to_string(), "invalid YAML"),
            ("list.yaml", "- a\n".to_string(), "must be an object"),
        ];
        for (name, text, want) in cases {
            let file = config_file(&dir, name, &text);
            let err = parse(&["--config", &file]).unwrap_err();
            assert!(
                err.starts_with("--config ") || err.starts_with("flag --"),
                "{name}: {err}"
            );
            assert!(err.contains(&file), "{name}: {err}");
            assert!(err.contains(want), "{name}: {err}");
        }
        let missing = dir.path().join("absent.yaml").display().to_string();
        let err = parse(&["--config", &missing]).unwrap_err();
        assert!(
            err.contains(&missing) && err.contains("No such file"),
            "{err}"
        );
    }

    #[test]
    fn container_spec_flags_and_fields() {
        let Ok(Command::Run(o)) = parse(&[]) else {
            panic!("parse failed");
        };
        assert!(o.cluster_dns.is_empty());
        assert_eq!(o.resolv_conf, PathBuf::from("/etc/resolv.conf"));
        assert!(o.allow_privileged);
        let Ok(Command::Run(o)) = parse(&[
            "--cluster-dns=10.96.0.10,fd00::a",
            "--cluster-domain",
            "cluster.local.",
            "--resolv-conf=",
            "--allow-privileged=false",
        ]) else {
            panic!("parse failed");
        };
        assert_eq!(
            o.cluster_dns,
            vec![
                "10.96.0.10".parse::<std::net::IpAddr>().unwrap(),
                "fd00::a".parse().unwrap()
            ]
        );
        assert_eq!(o.cluster_domain, "cluster.local");
        assert_eq!(o.resolv_conf, PathBuf::new());
        assert!(!o.allow_privileged);
        assert!(o.cgroups_per_qos);
        let Ok(Command::Run(o)) = parse(&["--cgroups-per-qos=false", "--cgroup-driver", "systemd"])
        else {
            panic!("parse failed");
        };
        assert!(!o.cgroups_per_qos);
        assert_eq!(o.cgroup_driver, crate::runtime::qos::CgroupDriver::Systemd);
        assert!(parse(&["--cgroup-driver", "cgroupsfs"]).is_err());
        let e = parse(&["--cluster-dns", "10.96.0.x"]).unwrap_err();
        assert!(
            e.contains("--cluster-dns") && e.contains("10.96.0.x"),
            "{e}"
        );

        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("k.yaml");
        std::fs::write(
            &file,
            "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n\
             clusterDNS: [10.0.0.10]\nclusterDomain: corp.local\nresolvConf: /run/resolv.conf\n\
             allowPrivileged: false\ncgroupsPerQOS: false\ncgroupDriver: systemd\n",
        )
        .unwrap();
        let mut o = Options::default();
        apply_config_file(&mut o, &file).unwrap();
        assert_eq!(
            o.cluster_dns,
            vec!["10.0.0.10".parse::<std::net::IpAddr>().unwrap()]
        );
        assert_eq!(o.cluster_domain, "corp.local");
        assert_eq!(o.resolv_conf, PathBuf::from("/run/resolv.conf"));
        assert!(!o.allow_privileged);
        assert!(!o.cgroups_per_qos);
        assert_eq!(o.cgroup_driver, crate::runtime::qos::CgroupDriver::Systemd);
        std::fs::write(
            &file,
            "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nclusterDNS: [nope]\n",
        )
        .unwrap();
        let e = apply_config_file(&mut o, &file).unwrap_err();
        assert!(e.contains("clusterDNS[0]"), "{e}");
    }

    #[test]
    fn image_pull_flags_and_config_fields() {
        let d = run(&[]);
        assert_eq!(
            (d.serialize_image_pulls, d.registry_qps, d.registry_burst),
            (true, 5.0, 10)
        );
        let o = run(&[
            "--serialize-image-pulls=false",
            "--registry-qps",
            "0",
            "--registry-burst=3",
        ]);
        assert_eq!(
            (o.serialize_image_pulls, o.registry_qps, o.registry_burst),
            (false, 0.0, 3)
        );
        for (args, want) in [
            (&["--registry-qps", "-2"][..], "--registry-qps"),
            (&["--registry-burst", "x"][..], "--registry-burst"),
            (
                &["--serialize-image-pulls", "maybe"][..],
                "--serialize-image-pulls",
            ),
        ] {
            let e = parse(args).unwrap_err();
            assert!(e.contains(want), "{args:?}: {e}");
        }
        let dir = tempfile::tempdir().unwrap();
        let file = config_file(
            &dir,
            "kubelet.yaml",
            "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n\
             serializeImagePulls: false\nregistryPullQPS: 2\nregistryBurst: 4\n",
        );
        let o = run(&["--config", &file]);
        assert_eq!(
            (o.serialize_image_pulls, o.registry_qps, o.registry_burst),
            (false, 2.0, 4)
        );
        assert!(
            o.ignored_config_fields.is_empty(),
            "{:?}",
            o.ignored_config_fields
        );
        // Flags win over the file.
        let o = run(&["--config", &file, "--registry-qps", "9"]);
        assert_eq!((o.registry_qps, o.registry_burst), (9.0, 4));
        let bad = config_file(
            &dir,
            "bad.yaml",
            "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n\
             registryPullQPS: -1\n",
        );
        let e = parse(&["--config", &bad]).unwrap_err();
        assert!(e.contains("registryPullQPS"), "{e}");
    }

    #[test]
    fn container_log_flags_and_config_fields() {
        let d = run(&[]);
        assert_eq!(
            (d.container_log_max_size, d.container_log_max_files),
            (10 << 20, 5)
        );
        let o = run(&[
            "--container-log-max-size",
            "1Ki",
            "--container-log-max-files=2",
        ]);
        assert_eq!(
            (o.container_log_max_size, o.container_log_max_files),
            (1024, 2)
        );
        assert!(o.ignored_flags.is_empty(), "{:?}", o.ignored_flags);
        for (args, want) in [
            (
                &["--container-log-max-size", "ten"][..],
                "--container-log-max-size",
            ),
            (
                &["--container-log-max-size", "-1Mi"][..],
                "--container-log-max-size",
            ),
            (
                &["--container-log-max-files", "1"][..],
                "--container-log-max-files",
            ),
            (
                &["--container-log-max-files", "x"][..],
                "--container-log-max-files",
            ),
        ] {
            let e = parse(args).unwrap_err();
            assert!(e.contains(want), "{args:?}: {e}");
        }
        let dir = tempfile::tempdir().unwrap();
        let file = config_file(
            &dir,
            "kubelet.yaml",
            "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n\
             containerLogMaxSize: 5Mi\ncontainerLogMaxFiles: 3\n",
        );
        let o = run(&["--config", &file]);
        assert_eq!(
            (o.container_log_max_size, o.container_log_max_files),
            (5 << 20, 3)
        );
        assert!(
            o.ignored_config_fields.is_empty(),
            "{:?}",
            o.ignored_config_fields
        );
        let o = run(&["--config", &file, "--container-log-max-files", "7"]);
        assert_eq!(o.container_log_max_files, 7);
        for (text, field) in [
            ("containerLogMaxFiles: 1", "containerLogMaxFiles"),
            ("containerLogMaxSize: 10", "containerLogMaxSize"),
            ("containerLogMaxSize: lots", "containerLogMaxSize"),
        ] {
            let bad = config_file(
                &dir,
                "bad.yaml",
                &format!(
                    "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n{text}\n"
                ),
            );
            let e = parse(&["--config", &bad]).unwrap_err();
            assert!(e.contains(field), "{text}: {e}");
        }
    }

    /// A kubeadm-flags.env line (plus KUBELET_EXTRA_ARGS) as a distro unit
    /// expands it: the kubelet flags tinylet has no use for are accepted and
    /// named once each; the ones it implements still work.
    #[test]
    fn kubeadm_flags_env_line_parses_with_warnings() {
        let dir = tempfile::tempdir().unwrap();
        let config = config_file(
            &dir,
            "config.yaml",
            "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n\
             cgroupDriver: systemd\nstaticPodPath: /etc/kubernetes/manifests\n",
        );
        let kubeadm_flags = "--container-runtime=remote \
            --container-runtime-endpoint=unix:///run/containerd/containerd.sock \
            --pod-infra-container-image=registry.k8s.io/pause:3.9 --network-plugin=cni \
            --node-ip=192.0.2.10 --cgroup-driver=systemd --fail-swap-on=false";
        let unit_flags = format!(
            "--bootstrap-kubeconfig=/etc/kubernetes/bootstrap-kubelet.conf \
             --kubeconfig=/etc/kubernetes/kubelet.conf --config={config}"
        );
        let extra_args =
            "--network-plugin cni --rotate-certificates --v=2 --feature-gates=A=true,B=false";
        let line = format!("{kubeadm_flags} {unit_flags} {extra_args}");
        let o = run(&line.split_whitespace().collect::<Vec<_>>());
        assert_eq!(
            o.ignored_flags,
            [
                "container-runtime",
                "pod-infra-container-image",
                "network-plugin",
                "fail-swap-on",
                "bootstrap-kubeconfig",
                "rotate-certificates",
                "feature-gates",
            ]
        );
        assert_eq!(
            o.container_runtime_endpoint,
            "unix:///run/containerd/containerd.sock"
        );
        assert_eq!(o.node_ip, Some("192.0.2.10".parse().unwrap()));
        assert_eq!(o.cgroup_driver, crate::runtime::qos::CgroupDriver::Systemd);
        assert_eq!(
            o.kubeconfig,
            Some(PathBuf::from("/etc/kubernetes/kubelet.conf"))
        );
        assert_eq!(
            o.pod_manifest_path,
            Some(PathBuf::from("/etc/kubernetes/manifests"))
        );
        assert_eq!(o.verbosity, 2);
        // Nothing ignored: nothing to warn about.
        assert!(run(&["--max-pods=3"]).ignored_flags.is_empty());
    }

    #[test]
    fn a_flag_no_kubelet_knows_is_an_error_naming_it() {
        assert_eq!(
            parse(&["--fail-swap-on=false", "--no-such-flag=1"]),
            Err("unknown flag --no-such-flag".into())
        );
        assert_eq!(
            parse(&["--pod-infra-container-imag", "pause"]),
            Err("unknown flag --pod-infra-container-imag".into())
        );
        assert_eq!(
            parse(&["--network-plugin=cni", "network"]),
            Err("unexpected argument \"network\" (flags start with --)".into())
        );
        // As the kubelet's flag set: `_` is `-` in flag names.
        let o = run(&["--network_plugin=cni", "--max_pods", "9"]);
        assert_eq!(o.ignored_flags, ["network-plugin"]);
        assert_eq!(o.max_pods, 9);
    }

    /// Boolean flags (ignored or not) do not take the next argument unless
    /// it is a boolean value; flags with a value take the next argument
    /// whatever it looks like.
    #[test]
    fn boolean_flags_stand_alone_and_valued_flags_take_the_next_argument() {
        let o = run(&[
            "--fail-swap-on",
            "--node-ip",
            "192.0.2.1",
            "--make-iptables-util-chains",
            "--register-node",
            "--max-pods",
            "7",
            "--allow-privileged",
        ]);
        assert_eq!(
            o.ignored_flags,
            ["fail-swap-on", "make-iptables-util-chains"]
        );
        assert_eq!(o.node_ip, Some("192.0.2.1".parse().unwrap()));
        assert_eq!(o.max_pods, 7);
        assert!(o.register_node && o.allow_privileged);

        // A valued flag takes the next argument even when it starts with --.
        let o = run(&["--network-plugin", "--fail-swap-on", "--max-pods", "4"]);
        assert_eq!(o.ignored_flags, ["network-plugin"]);
        assert_eq!(o.max_pods, 4);

        // `--flag=false`, and as tinylet always took it, `--flag false`.
        let o = run(&[
            "--fail-swap-on=false",
            "--register-node",
            "false",
            "--cgroups-per-qos=0",
            "--skip-headers",
            "f",
            "--max-pods",
            "5",
        ]);
        assert_eq!(o.ignored_flags, ["fail-swap-on", "skip-headers"]);
        assert!(!o.register_node && !o.cgroups_per_qos);
        assert_eq!(o.max_pods, 5);

        for (args, want) in [
            (
                &["--fail-swap-on=maybe"][..],
                "flag --fail-swap-on: invalid boolean \"maybe\"",
            ),
            (
                &["--fail-swap-on", "maybe"][..],
                "after boolean flag --fail-swap-on",
            ),
            (
                &["--register-node", "no"][..],
                "after boolean flag --register-node",
            ),
            (
                &["--network-plugin"][..],
                "flag --network-plugin needs a value",
            ),
            (
                &["--eviction-hard"][..],
                "flag --eviction-hard needs a value",
            ),
        ] {
            let e = parse(args).unwrap_err();
            assert!(e.contains(want), "{args:?}: {e}");
        }
        // The kubelet's `--version=false` asks for nothing.
        assert_eq!(run(&["--version=false", "--max-pods", "2"]).max_pods, 2);
        assert_eq!(parse(&["--version=raw"]), Ok(Command::Version));
    }

    /// Nothing listens unasked on a standalone node; a cluster node serves
    /// the main and healthz ports by default; the file's fields are read.
    #[test]
    fn node_api_listeners_follow_the_mode_and_the_flags() {
        use std::net::SocketAddr;
        let addr = |s: &str| Some(s.parse::<SocketAddr>().unwrap());
        let l = run(&[]).listeners();
        assert_eq!((l.main, l.read_only, l.healthz), (None, None, None));
        let l = run(&["--kubeconfig", "/k"]).listeners();
        assert_eq!(l.main, addr("0.0.0.0:10250"));
        assert_eq!(l.healthz, addr("127.0.0.1:10248"));
        assert_eq!(l.read_only, None);
        let l = run(&[
            "--kubeconfig",
            "/k",
            "--enable-server=false",
            "--healthz-port",
            "0",
        ])
        .listeners();
        assert_eq!((l.main, l.healthz), (None, None));
        let l = run(&["--port", "11250", "--read-only-port", "10255"]).listeners();
        assert_eq!(l.main, addr("0.0.0.0:11250"));
        assert_eq!(l.read_only, addr("0.0.0.0:10255"));
        assert_eq!(l.healthz, None);
        let l = run(&[
            "--healthz-bind-address",
            "127.0.0.2",
            "--address",
            "127.0.0.1",
        ])
        .listeners();
        assert_eq!((l.main, l.healthz), (None, None));
        let l = run(&["--healthz-bind-address", "127.0.0.2", "--healthz-port", "1"]).listeners();
        assert_eq!((l.main, l.healthz), (None, addr("127.0.0.2:1")));
        let l = run(&["--enable-server"]).listeners();
        assert_eq!((l.main.is_some(), l.healthz.is_some()), (true, true));
        assert!(parse(&["--tls-cert-file", "/c"])
            .unwrap_err()
            .contains("--tls-private-key-file"));

        let dir = tempfile::tempdir().unwrap();
        let path = config_file(
            &dir,
            "k.yaml",
            "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n\
             address: 127.0.0.1\nport: 12250\nreadOnlyPort: 12255\nhealthzPort: 12248\n\
             healthzBindAddress: 127.0.0.1\ntlsCertFile: /c.crt\ntlsPrivateKeyFile: /c.key\n\
             authentication:\n  x509:\n    clientCAFile: /ca.crt\n",
        );
        let o = run(&["--config", &path]);
        let l = o.listeners();
        assert_eq!(l.main, addr("127.0.0.1:12250"));
        assert_eq!(l.read_only, addr("127.0.0.1:12255"));
        assert_eq!(l.healthz, addr("127.0.0.1:12248"));
        assert_eq!(o.client_ca_file, Some(PathBuf::from("/ca.crt")));
        assert_eq!(o.tls_cert_file, Some(PathBuf::from("/c.crt")));
        let bad = config_file(
            &dir,
            "bad.yaml",
            "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nport: 70000\n",
        );
        let e = parse(&["--config", &bad]).unwrap_err();
        assert!(e.contains("port") && e.contains("bad.yaml"), "{e}");
    }

    #[test]
    fn auth_flags_and_config_sections() {
        use super::{AuthConfig, AuthorizationMode};
        // Standalone: nothing asked, nothing allowed; anonymous off.
        let o = run(&[]);
        assert_eq!(o.auth, AuthConfig::default());
        assert_eq!(o.auth.mode, None);
        assert!(!o.auth.anonymous && !o.auth.token_webhook);
        assert_eq!(
            (
                o.auth.token_cache_ttl,
                o.auth.authorized_ttl,
                o.auth.unauthorized_ttl
            ),
            (
                Duration::from_secs(120),
                Duration::from_secs(300),
                Duration::from_secs(30)
            )
        );
        // A cluster node authorizes by webhook unless told otherwise.
        let o = run(&["--kubeconfig", "/k"]);
        assert_eq!(o.auth.mode, Some(AuthorizationMode::Webhook));
        let o = run(&[
            "--kubeconfig",
            "/k",
            "--anonymous-auth",
            "--authentication-token-webhook=true",
            "--authentication-token-webhook-cache-ttl=10s",
            "--authorization-mode",
            "AlwaysAllow",
            "--authorization-webhook-cache-authorized-ttl",
            "1m",
            "--authorization-webhook-cache-unauthorized-ttl=0s",
        ]);
        assert!(o.auth.anonymous && o.auth.token_webhook);
        assert_eq!(o.auth.token_cache_ttl, Duration::from_secs(10));
        assert_eq!(o.auth.mode, Some(AuthorizationMode::AlwaysAllow));
        assert_eq!(o.auth.authorized_ttl, Duration::from_secs(60));
        assert_eq!(o.auth.unauthorized_ttl, Duration::ZERO);
        assert!(o.ignored_flags.is_empty(), "{:?}", o.ignored_flags);
        assert_eq!(
            run(&["--authorization-mode=AlwaysAllow"]).auth.mode,
            Some(AuthorizationMode::AlwaysAllow)
        );

        // The webhooks need the apiserver.
        let e = parse(&["--authorization-mode=Webhook"]).unwrap_err();
        assert!(
            e.contains("--authorization-mode=Webhook") && e.contains("--kubeconfig"),
            "{e}"
        );
        let e = parse(&["--authentication-token-webhook"]).unwrap_err();
        assert!(
            e.contains("--authentication-token-webhook") && e.contains("--kubeconfig"),
            "{e}"
        );
        let e = parse(&["--authorization-mode=RBAC"]).unwrap_err();
        assert!(
            e.contains("flag --authorization-mode") && e.contains("RBAC"),
            "{e}"
        );
        assert!(parse(&["--anonymous-auth=maybe"]).is_err());

        // The configuration file's sections, as upstream names them; flags win.
        let dir = tempfile::tempdir().unwrap();
        let file = config_file(
            &dir,
            "auth.yaml",
            "apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
authentication:
  anonymous: {enabled: true}
  webhook: {enabled: true, cacheTTL: 45s}
  x509: {clientCAFile: /etc/kubernetes/pki/ca.crt}
authorization:
  mode: Webhook
  webhook: {cacheAuthorizedTTL: 7m, cacheUnauthorizedTTL: 5s}
",
        );
        let o = run(&["--config", &file, "--kubeconfig", "/k"]);
        assert!(o.auth.anonymous && o.auth.token_webhook);
        assert_eq!(o.auth.token_cache_ttl, Duration::from_secs(45));
        assert_eq!(o.auth.mode, Some(AuthorizationMode::Webhook));
        assert_eq!(o.auth.authorized_ttl, Duration::from_secs(420));
        assert_eq!(o.auth.unauthorized_ttl, Duration::from_secs(5));
        assert!(
            o.ignored_config_fields.is_empty(),
            "{:?}",
            o.ignored_config_fields
        );
        assert_eq!(
            o.client_ca_file.as_deref(),
            Some(Path::new("/etc/kubernetes/pki/ca.crt"))
        );
        let o = run(&[
            "--config",
            &file,
            "--kubeconfig=/k",
            "--anonymous-auth=false",
            "--authorization-mode=AlwaysAllow",
        ]);
        assert!(!o.auth.anonymous);
        assert_eq!(o.auth.mode, Some(AuthorizationMode::AlwaysAllow));
        // Without a kubeconfig the file's webhooks are refused, naming it.
        let e = parse(&["--config", &file]).unwrap_err();
        assert!(e.contains("authorization.mode") && e.contains(&file), "{e}");

        for (text, field) in [
            ("authentication: yes", "authentication"),
            (
                "authentication: {anonymous: {enabled: 1}}",
                "authentication.anonymous.enabled",
            ),
            (
                "authentication: {webhook: {cacheTTL: soon}}",
                "authentication.webhook.cacheTTL",
            ),
            ("authorization: {mode: Node}", "authorization.mode"),
            ("authorization: {webhook: []}", "authorization.webhook"),
        ] {
            let file = config_file(
                &dir,
                "bad.yaml",
                &format!(
                    "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n{text}\n"
                ),
            );
            let e = parse(&["--config", &file]).unwrap_err();
            assert!(e.contains(&file) && e.contains(field), "{text}: {e}");
        }
    }

    /// The ignored flags are sorted, distinct, none is one tinylet
    /// implements, and README.md's table lists exactly them.
    #[test]
    fn ignored_flags_are_documented_and_apart_from_the_implemented_ones() {
        for list in [IGNORED_BOOL_FLAGS, IGNORED_VALUE_FLAGS] {
            assert!(list.windows(2).all(|w| w[0] < w[1]), "{list:?}");
        }
        let ignored: Vec<&str> = IGNORED_BOOL_FLAGS
            .iter()
            .chain(IGNORED_VALUE_FLAGS)
            .copied()
            .collect();
        for name in &ignored {
            assert!(
                !FLAGS.contains(name) && !["help", "h", "version", "v"].contains(name),
                "--{name} is both implemented and ignored"
            );
        }
        assert!(
            !IGNORED_BOOL_FLAGS
                .iter()
                .any(|b| IGNORED_VALUE_FLAGS.contains(b)),
            "a flag is both boolean and valued"
        );
        for b in BOOL_FLAGS {
            assert!(FLAGS.contains(b), "{b}");
        }

        let readme =
            std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap();
        let heading = "### Kubelet flags that are accepted and ignored";
        let section = &readme[readme.find(heading).expect(heading)..];
        let section = &section[heading.len()..];
        let section = &section[..section.find("\n#").unwrap_or(section.len())];
        let mut documented: Vec<String> = Vec::new();
        for row in section.lines().filter(|l| l.starts_with("| ")) {
            let Some(flags) = row.trim_end_matches('|').rsplit('|').next() else {
                continue;
            };
            // Notes in parentheses name other flags; the list is outside them.
            let mut depth = 0;
            let mut outside = String::new();
            for ch in flags.chars() {
                match ch {
                    '(' => depth += 1,
                    ')' => depth -= 1,
                    _ if depth == 0 => outside.push(ch),
                    _ => {}
                }
            }
            for item in outside.split('`').skip(1).step_by(2) {
                if let Some(name) = item.strip_prefix("--") {
                    documented.push(name.to_string());
                }
            }
        }
        documented.sort();
        let mut want: Vec<String> = ignored.iter().map(|s| s.to_string()).collect();
        want.sort();
        assert_eq!(documented, want, "README.md's table of ignored flags");
    }

    #[test]
    fn runonce_needs_a_local_source_and_refuses_a_kubeconfig() {
        let o = run(&["--runonce", "--pod-manifest-path", "/m"]);
        assert!(o.runonce);
        assert_eq!(o.runonce_timeout, Duration::from_secs(300));
        assert!(o.ignored_flags.is_empty());
        let o = run(&[
            "--runonce=true",
            "--manifest-url",
            "http://h/p",
            "--runonce-timeout=30s",
        ]);
        assert_eq!(o.runonce_timeout, Duration::from_secs(30));
        assert!(!run(&["--runonce=false", "--kubeconfig", "/k"]).runonce);
        let err = parse(&[
            "--runonce",
            "--pod-manifest-path",
            "/m",
            "--kubeconfig",
            "/k",
        ])
        .unwrap_err();
        assert!(
            err.contains("--runonce cannot be used with --kubeconfig"),
            "{err}"
        );
        let err = parse(&["--runonce"]).unwrap_err();
        assert!(
            err.contains("--pod-manifest-path or --manifest-url"),
            "{err}"
        );
        let err = parse(&[
            "--runonce",
            "--pod-manifest-path",
            "/m",
            "--runonce-timeout",
            "0",
        ])
        .unwrap_err();
        assert!(err.contains("--runonce-timeout"), "{err}");
    }

    #[test]
    fn the_status_subcommand_has_its_own_flags() {
        assert_eq!(parse(&["status"]), Ok(Command::Status(Box::default())));
        let Ok(Command::Status(o)) = parse(&[
            "status",
            "-w",
            "-o",
            "json",
            "--read-only-port=10255",
            "--port",
            "10260",
            "--kubeconfig",
            "/k",
            "--root-dir",
            "/r",
            "--container-runtime-endpoint",
            "unix:///c.sock",
        ]) else {
            panic!("status flags")
        };
        assert!(o.watch);
        assert_eq!(o.output, StatusOutput::Json);
        assert_eq!((o.read_only_port, o.port), (10255, 10260));
        assert_eq!(o.kubeconfig, Some(PathBuf::from("/k")));
        assert_eq!(o.root_dir, PathBuf::from("/r"));
        assert_eq!(o.container_runtime_endpoint, "unix:///c.sock");
        assert_eq!(parse(&["status", "--help"]), Ok(Command::StatusHelp));
        for (args, want) in [
            (&["status", "-o", "yaml"][..], "not table, wide or json"),
            (&["status", "--port", "70000"][..], "invalid port"),
            (&["status", "--pod-manifest-path", "/m"][..], "unknown flag"),
            (&["status", "stray"][..], "unexpected argument"),
            (&["status", "--port"][..], "needs a value"),
        ] {
            let err = parse(args).unwrap_err();
            assert!(err.contains(want), "{args:?}: {err}");
        }
        // Only as the first argument is it the subcommand.
        assert!(parse(&["--v", "2", "status"]).is_err());
    }
}
