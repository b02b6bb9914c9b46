//! Command-line flags, named like the upstream kubelet's, and their
//! parsing: `parse_args` collects them, applies the configuration file
//! (wherever `--config` stands) and then the flags on top of it, and checks
//! what depends on several of them.
//!
//! Accepts `--flag value`, `--flag=value` and, as the kubelet does, a single
//! dash (`-v 4`); `_` is `-` in flag names. A boolean flag alone means true.

use std::path::PathBuf;

use super::config_file::apply_config_file;
use super::ignored::{IGNORED_BOOL_FLAGS, IGNORED_VALUE_FLAGS};
use super::status_cmd::parse_status_args;
use super::{
    boolean, log_max_files, log_max_size, parse_duration, AuthorizationMode, Command, Options,
    TlsMinVersion,
};
use crate::node::taint::parse_taints;

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
  --max-open-files int                 open files tinylet may hold: its soft RLIMIT_NOFILE is
                                       raised to this, capped at the hard limit (default 1000000)
  --cluster-dns list                   DNS server IPs (comma-separated) for pods with
                                       dnsPolicy ClusterFirst; without it they fall back to
                                       dnsPolicy Default
  --cluster-domain string              the cluster's DNS domain; ClusterFirst pods search
                                       <ns>.svc.<domain>, svc.<domain> and <domain>
  --resolv-conf string                 resolver configuration of dnsPolicy Default pods
                                       (default /etc/resolv.conf; \"\" for none)
  --allow-privileged bool              allow privileged containers and hostNetwork, hostPID
                                       and hostIPC pods; false refuses them at admission,
                                       and capabilities beyond the runtime's default set and
                                       procMount Unmasked too (default true)
  --allowed-unsafe-sysctls list        unsafe sysctls (names or prefixes ending in '*',
                                       comma-separated, namespaced only) that pods may set
                                       besides the safe ones; others are refused at admission
                                       (reason SysctlForbidden)
  --cgroups-per-qos bool               put each pod in a cgroup under kubepods/<QoS class>
                                       (default true)
  --cgroup-driver string               cgroupfs or systemd; must match the runtime's
                                       (default cgroupfs)
  --seccomp-default bool               containers without a seccomp profile get the
                                       runtime's default profile (default false)
  --pod-max-pids int                   the most processes a pod may run, set as pids.max
                                       on its cgroup (needs --cgroups-per-qos); -1: no
                                       limit (default -1)
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
  --bootstrap-kubeconfig string        TLS bootstrap: when --kubeconfig is missing or its
                                       client certificate is not valid, ask the cluster with
                                       these credentials (kubeadm's token) for one, keep it in
                                       --cert-dir as kubelet-client-current.pem, and write
                                       --kubeconfig to use it; waits until it is issued
  --rotate-certificates bool           ask for a new client certificate at 70-90% of the
                                       current one's life, as TLS bootstrap keeps it
                                       (kubelet-client-current.pem), and switch connections
                                       over to it (default false; kubeadm's config sets it)
  --rotate-server-certificates bool    serverTLSBootstrap: ask the cluster's kubelet-serving
                                       signer for the node API's certificate (the node's
                                       names and IPs), serve it once an admin approves it
                                       (until then the self-signed one), and renew it
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
                                       kubelet.key, and the bootstrapped client pair as
                                       kubelet-client-current.pem (default <root-dir>/pki)
  --client-ca-file string              PEM CA bundle; client certificates it signed
                                       authenticate (CN: user, O: groups)
  --enable-server bool                 serve --port (and, standalone, --healthz-port); false
                                       turns the main and read-only ports off
  --tls-min-version string             oldest TLS version of --port: VersionTLS12 or
                                       VersionTLS13 (default VersionTLS12; TLS 1.0 and 1.1
                                       are not spoken)
  --streaming-connection-idle-timeout duration
                                       a log follow, exec, attach or port-forward session
                                       with no traffic either way for this long is closed;
                                       0: never (default 4h0m0s)

  -v, --v int                          log verbosity: 0 info, 1-3 more info, 4+ debug, 6+ trace
  -h, --help                           print this help
      --version                        print the version, git commit, target and whether the
                                       binary is static, then `Kubernetes vX.Y.Z`; run through a
                                       link named kubelet, only that line (what kubeadm reads)

Environment:
  TINYLET_KUBELET_VERSION              the Kubernetes version tinylet reports: --version, the
                                       Node's kubeletVersion, the probes' User-Agent; set it to
                                       the cluster's to pass kubeadm's version check. Read
                                       from /etc/default/tinylet when not in the environment
                                       (default v1.20.2, the API level tinylet implements)

Other flags of the upstream kubelet (v1.20 and later), as kubeadm and distro units
pass them, are accepted with a warning and ignored (list in README.md). A boolean
flag alone means true; give another value as --flag=false.
";

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
            "bootstrap-kubeconfig" | "experimental-bootstrap-kubeconfig" => {
                o.bootstrap_kubeconfig = (!v.is_empty()).then(|| PathBuf::from(v))
            }
            "kube-api-qps" => o.kube_api_qps = rate(name, &v)?,
            "kube-api-burst" => o.kube_api_burst = number(name, &v)?,
            "register-node" => o.register_node = boolean(name, &v)?,
            "rotate-certificates" => o.rotate_certificates = boolean(name, &v)?,
            "rotate-server-certificates" => o.server_tls_bootstrap = boolean(name, &v)?,
            "serialize-image-pulls" => o.serialize_image_pulls = boolean(name, &v)?,
            "registry-qps" => o.registry_qps = rate(name, &v)?,
            "registry-burst" => o.registry_burst = number(name, &v)?,
            "node-status-update-frequency" => o.node_status_update_frequency = dur(&v)?,
            "node-status-report-frequency" => o.node_status_report_frequency = dur(&v)?,
            "node-lease-duration-seconds" => o.node_lease_duration_seconds = number(name, &v)?,
            "max-pods" => o.max_pods = number(name, &v)?,
            "max-open-files" => {
                o.max_open_files =
                    number::<u64>(name, &v)
                        .ok()
                        .filter(|n| *n > 0)
                        .ok_or_else(|| {
                            format!("flag --{name}: invalid number {v:?} (want one above 0)")
                        })?
            }
            "kube-reserved" | "system-reserved" => {
                let reserved: Vec<(String, String)> = crate::node::machine::parse_reserved(&v)
                    .map_err(|e| format!("flag --{name}: {e}"))?
                    .into_iter()
                    .collect();
                if name == "kube-reserved" {
                    o.kube_reserved = reserved;
                } else {
                    o.system_reserved = reserved;
                }
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
            "seccomp-default" => o.seccomp_default = boolean(name, &v)?,
            "pod-max-pids" => o.pod_pids_limit = number(name, &v)?,
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
            "tls-min-version" => {
                o.tls_min_version =
                    TlsMinVersion::parse(&v).map_err(|e| format!("flag --{name}: {e}"))?
            }
            "streaming-connection-idle-timeout" => o.streaming_idle_timeout = dur(&v)?,
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
    // The limit is written on the pod's cgroup: without one it would be
    // silently lost.
    if o.pod_pids_limit > 0 && !o.cgroups_per_qos {
        return Err(
            "flag --pod-max-pids (or podPidsLimit) needs --cgroups-per-qos (cgroupsPerQOS): \
             the limit is set on each pod's cgroup"
                .into(),
        );
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
    if o.bootstrap_kubeconfig.is_some() && o.kubeconfig.is_none() {
        return Err(
            "flag --bootstrap-kubeconfig: needs --kubeconfig, the file the bootstrapped \
             credentials are written to"
                .into(),
        );
    }
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
pub(super) const FLAGS: &[&str] = &[
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
    "bootstrap-kubeconfig",
    "experimental-bootstrap-kubeconfig",
    "rotate-certificates",
    "rotate-server-certificates",
    "kube-api-qps",
    "kube-api-burst",
    "register-node",
    "node-status-update-frequency",
    "node-status-report-frequency",
    "node-lease-duration-seconds",
    "max-pods",
    "max-open-files",
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
    "seccomp-default",
    "pod-max-pids",
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
    "tls-min-version",
    "streaming-connection-idle-timeout",
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
pub(super) const BOOL_FLAGS: &[&str] = &[
    "register-node",
    "rotate-certificates",
    "rotate-server-certificates",
    "serialize-image-pulls",
    "allow-privileged",
    "cgroups-per-qos",
    "seccomp-default",
    "enable-server",
    "anonymous-auth",
    "authentication-token-webhook",
    "runonce",
];

/// Parses a comma-separated list of IP addresses; empty input is none.
pub fn parse_ips(v: &str) -> Result<Vec<std::net::IpAddr>, String> {
    v.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| s.parse().map_err(|_| format!("{s:?} is not an IP address")))
        .collect()
}

fn number<T: std::str::FromStr>(flag: &str, v: &str) -> Result<T, String> {
    v.parse()
        .map_err(|_| format!("flag --{flag}: invalid number {v:?}"))
}

/// A rate in requests per second: a finite number, 0 or more.
fn rate(flag: &str, v: &str) -> Result<f32, String> {
    v.parse::<f32>()
        .ok()
        .filter(|q| q.is_finite() && *q >= 0.0)
        .ok_or_else(|| format!("flag --{flag}: invalid rate {v:?} (want a number >= 0)"))
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

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::node::taint::Taint;
    use crate::options::tests::{config_file, headers, parse, run};

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
            "--max-open-files=4096",
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
        assert_eq!(o.max_open_files, 4096);
        assert_eq!(run(&[]).max_open_files, 1_000_000);
        assert_eq!(
            parse(&["--max-open-files", "0"]),
            Err("flag --max-open-files: invalid number \"0\" (want one above 0)".into())
        );
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
            (
                &["--system-reserved", "gpu=1"][..],
                "flag --system-reserved: entry \"gpu=1\": unknown resource \"gpu\"",
            ),
            (
                &["--kube-reserved", "memory=-1Gi"][..],
                "quantity \"-1Gi\" is negative",
            ),
        ] {
            let e = parse(args).unwrap_err();
            assert!(e.contains(want), "{args:?}: {e}");
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
            o.bootstrap_kubeconfig,
            Some(PathBuf::from("/etc/kubernetes/bootstrap-kubelet.conf"))
        );
        // Bootstrapping writes --kubeconfig: without it there is nowhere to.
        let e = parse(&[
            "--bootstrap-kubeconfig",
            "/etc/kubernetes/bootstrap-kubelet.conf",
        ])
        .unwrap_err();
        assert!(
            e.starts_with("flag --bootstrap-kubeconfig: needs --kubeconfig"),
            "{e}"
        );
        assert_eq!(
            o.pod_manifest_path,
            Some(PathBuf::from("/etc/kubernetes/manifests"))
        );
        assert_eq!(o.verbosity, 2);
        // Nothing ignored: nothing to warn about.
        assert!(run(&["--max-pods=3"]).ignored_flags.is_empty());
        // Security settings are used, never only warned about.
        let o = run(&["--seccomp-default", "--pod-max-pids", "512"]);
        assert!(o.ignored_flags.is_empty(), "{:?}", o.ignored_flags);
        assert!(o.seccomp_default);
        assert_eq!(o.pod_pids_limit, 512);
        let e = parse_args(["--pod-max-pids=512", "--cgroups-per-qos=false"].map(String::from))
            .err()
            .unwrap_or_default();
        assert!(
            e.contains("--pod-max-pids") && e.contains("--cgroups-per-qos"),
            "{e}"
        );
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
}
