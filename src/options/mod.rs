//! The kubelet's options: `Options`, what `main` and the rest of the crate
//! read, with upstream's defaults; the node API's authentication and
//! authorization settings; and the `Command` the command line asks for.
//!
//! Every setting is one entry of a table: `table` has the ones tinylet
//! uses, `ignored` the upstream ones it accepts and ignores (entries
//! without a setter). An entry names its flag, its KubeletConfiguration
//! v1beta1 field (a dotted path), its kind, its `--help` text, and how it
//! is set and read back; `settings` says what an entry and a kind are
//! (a kind reads a flag's text and a file's value alike), `lookup` finds
//! entries by flag and by field and reads `/configz` back through them.
//! From the table come: `flags` (`parse_args`: the command line, on top of
//! the configuration file wherever `--config` stands, then the checks that
//! span several settings), `config_file` (`apply_config_file`, the subset of
//! the file tinylet reads, zeros read as upstream's defaults), `help`
//! (`usage()`, `--help`) and the ignored flags' warnings. `status_cmd`
//! parses the flags of `tinylet status`. Durations use Go's syntax (`20s`,
//! `1m30s`, `500ms`). Adding a setting is one entry in `table` (and its
//! `Options` field with its default).

mod config_file;
mod flags;
mod help;
mod ignored;
mod lookup;
mod settings;
mod status_cmd;
mod table;
#[cfg(test)]
mod upstream_names;

use std::path::PathBuf;
use std::time::Duration;

use crate::node::taint::Taint;

pub(crate) use crate::apitime::parse_duration;
pub use config_file::{apply_config_file, CONFIG_API_VERSION, CONFIG_KIND};
pub use flags::{parse_args, parse_header_pairs, parse_ips, parse_node_labels, parse_pairs};
pub use help::usage;
pub use lookup::config_fields;
pub(crate) use lookup::configz;
pub use status_cmd::{parse_status_args, StatusOptions, StatusOutput, STATUS_USAGE};

#[derive(Debug, Clone, PartialEq)]
pub struct Options {
    pub container_runtime_endpoint: String,
    pub pod_manifest_path: Option<PathBuf>,
    pub(crate) hostname_override: Option<String>,
    pub(crate) root_dir: PathBuf,
    pub(crate) pod_logs_dir: PathBuf,
    pub(crate) file_check_frequency: Duration,
    /// Where pods are polled from (`--manifest-url`).
    pub(crate) manifest_url: Option<String>,
    /// Headers sent with every manifest URL request, in order.
    pub(crate) manifest_url_headers: Vec<(String, String)>,
    pub(crate) http_check_frequency: Duration,
    /// Checkpointed API pods restored at start (`--bootstrap-checkpoint-path`).
    pub(crate) bootstrap_checkpoint_path: Option<PathBuf>,
    /// The configuration file read (`--config`).
    pub(crate) config_file: Option<PathBuf>,
    /// Fields of the configuration file that tinylet does not use.
    pub ignored_config_fields: Vec<String>,
    /// Upstream kubelet flags given on the command line that tinylet accepts
    /// and does not use, each once, in the order first given.
    pub(crate) ignored_flags: Vec<String>,
    pub(crate) sync_frequency: Duration,
    pub(crate) runtime_request_timeout: Duration,
    pub verbosity: u8,
    /// The kubeconfig of the API server (`--kubeconfig`); none: standalone.
    pub(crate) kubeconfig: Option<PathBuf>,
    pub(crate) kube_api_qps: f32,
    pub(crate) kube_api_burst: u32,
    /// Register the node with the API server (`--register-node`).
    pub(crate) register_node: bool,
    pub(crate) node_status_update_frequency: Duration,
    pub(crate) node_status_report_frequency: Duration,
    pub(crate) node_lease_duration_seconds: u32,
    pub(crate) max_pods: u32,
    /// The soft `RLIMIT_NOFILE` set at start, capped at the hard limit
    /// (`--max-open-files`, `maxOpenFiles`).
    pub(crate) max_open_files: u64,
    /// `--kube-reserved` / `--system-reserved`: resource name to quantity.
    pub(crate) kube_reserved: Vec<(String, String)>,
    pub(crate) system_reserved: Vec<(String, String)>,
    /// The node's InternalIP (`--node-ip`); default: the default route's.
    pub(crate) node_ip: Option<std::net::IpAddr>,
    /// Labels added at registration (`--node-labels`).
    pub(crate) node_labels: Vec<(String, String)>,
    /// Taints added at registration (`--register-with-taints`).
    pub(crate) register_with_taints: Vec<Taint>,
    /// Image garbage collection: `--image-gc-high-threshold`,
    /// `--image-gc-low-threshold`, `--minimum-image-ttl-duration`.
    pub(crate) image_gc: crate::images::gc::Policy,
    /// Dead instances kept per container
    /// (`--maximum-dead-containers-per-container`).
    pub(crate) max_dead_per_container: u32,
    /// Nameservers of dnsPolicy ClusterFirst pods (`--cluster-dns`).
    pub(crate) cluster_dns: Vec<std::net::IpAddr>,
    /// The cluster's DNS domain (`--cluster-domain`).
    pub(crate) cluster_domain: String,
    /// The resolver configuration of dnsPolicy Default pods (`--resolv-conf`);
    /// empty: none.
    pub(crate) resolv_conf: PathBuf,
    /// Whether privileged containers and host namespaces are allowed
    /// (`--allow-privileged`).
    pub(crate) allow_privileged: bool,
    /// How Secrets and ConfigMaps that pods use are kept current (the
    /// configuration file's `configMapAndSecretChangeDetectionStrategy`,
    /// which has no flag).
    pub(crate) change_detection: crate::volume::Strategy,
    /// Unsafe sysctls (names, or prefixes ending in `*`) pods may set on
    /// top of the safe set (`--allowed-unsafe-sysctls`).
    pub(crate) allowed_unsafe_sysctls: Vec<String>,
    /// Pods in cgroups by QoS class under `kubepods` (`--cgroups-per-qos`).
    pub(crate) cgroups_per_qos: bool,
    /// `cgroupfs` or `systemd`, as the runtime uses (`--cgroup-driver`).
    pub(crate) cgroup_driver: crate::runtime::qos::CgroupDriver,
    /// Containers without a seccomp profile get the runtime's default
    /// (`--seccomp-default`, `seccompDefault`).
    pub(crate) seccomp_default: bool,
    /// The most processes a pod's cgroup may hold (`--pod-max-pids`,
    /// `podPidsLimit`); negative: no limit.
    pub(crate) pod_pids_limit: i64,
    /// One image pull at a time (`--serialize-image-pulls`).
    pub(crate) serialize_image_pulls: bool,
    /// Image pulls per second, 0: unlimited (`--registry-qps`).
    pub(crate) registry_qps: f32,
    /// Image pulls in a burst (`--registry-burst`).
    pub(crate) registry_burst: u32,
    /// The node API's address and port (`--address`, `--port`).
    pub(crate) address: std::net::IpAddr,
    pub(crate) port: u16,
    /// The plain read-only port (`--read-only-port`); 0: off.
    pub(crate) read_only_port: u16,
    /// The plain healthz listener (`--healthz-bind-address`,
    /// `--healthz-port`); port 0: off.
    pub(crate) healthz_bind_address: std::net::IpAddr,
    pub(crate) healthz_port: u16,
    /// The node API's serving certificate and key (PEM); without them a
    /// self-signed pair under `cert_dir` (default `<root-dir>/pki`).
    pub(crate) tls_cert_file: Option<PathBuf>,
    pub(crate) tls_private_key_file: Option<PathBuf>,
    pub(crate) cert_dir: Option<PathBuf>,
    /// `--bootstrap-kubeconfig`: credentials that may ask the cluster for
    /// the node's client certificate when `--kubeconfig` has none that is
    /// good (TLS bootstrap).
    pub(crate) bootstrap_kubeconfig: Option<PathBuf>,
    /// `--rotate-certificates` (`rotateCertificates`): renew the client
    /// certificate TLS bootstrap got before it expires.
    pub(crate) rotate_certificates: bool,
    /// `serverTLSBootstrap` (`--rotate-server-certificates`): the node API's
    /// serving certificate comes from the cluster's kubelet-serving signer.
    pub(crate) server_tls_bootstrap: bool,
    /// CA bundle that client certificates are verified against
    /// (`--client-ca-file`, `authentication.x509.clientCAFile`).
    pub(crate) client_ca_file: Option<PathBuf>,
    /// `--enable-server` as given; `None`: not given.
    pub(crate) enable_server: Option<bool>,
    /// Whether `--port` (`--healthz-port`) was given, in the flags or the
    /// file: a standalone node listens only where it is asked to (an
    /// address alone opens nothing).
    pub(crate) port_given: bool,
    pub(crate) healthz_given: bool,
    /// Who may call the node's API: `--anonymous-auth`, the token webhook,
    /// `--authorization-mode` and the cache TTLs (the configuration file's
    /// `authentication` and `authorization`). `node_name` is left empty:
    /// the caller sets it. `mode` is Webhook with a kubeconfig unless given.
    pub(crate) auth: AuthConfig,
    /// Run the file and URL sources' pods once and exit (`--runonce`).
    pub(crate) runonce: bool,
    /// How long `--runonce` waits for its pods (`--runonce-timeout`).
    pub(crate) runonce_timeout: Duration,
    /// A container's live log is rotated from this size on, in bytes
    /// (`--container-log-max-size`).
    pub(crate) container_log_max_size: u64,
    /// Log files kept per container, the live one included, at least 2
    /// (`--container-log-max-files`).
    pub(crate) container_log_max_files: usize,
    /// The eviction thresholds and their settings (`--eviction-*`).
    pub(crate) eviction: crate::eviction::Settings,
    /// A long session of the node API (a log follow, exec, attach,
    /// port-forward) with no traffic either way for this long is closed
    /// (`--streaming-connection-idle-timeout`,
    /// `streamingConnectionIdleTimeout`); zero: never.
    pub(crate) streaming_idle_timeout: Duration,
    /// The oldest TLS version the main port speaks (`--tls-min-version`,
    /// `tlsMinVersion`).
    pub(crate) tls_min_version: TlsMinVersion,
}

/// The oldest TLS version the node API's main port accepts, by upstream's
/// names. rustls speaks TLS 1.2 and 1.3 only, so `VersionTLS10` and
/// `VersionTLS11` are refused at start rather than silently raised.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum TlsMinVersion {
    /// `VersionTLS12`, and upstream's default (Go's servers' minimum).
    #[default]
    Tls12,
    /// `VersionTLS13`.
    Tls13,
}

impl TlsMinVersion {
    /// Parses upstream's names; empty is the default.
    pub(crate) fn parse(v: &str) -> Result<TlsMinVersion, String> {
        match v {
            "" | "VersionTLS12" => Ok(TlsMinVersion::Tls12),
            "VersionTLS13" => Ok(TlsMinVersion::Tls13),
            "VersionTLS10" | "VersionTLS11" => Err(format!(
                "{v} is not supported: the node API speaks TLS 1.2 and 1.3 only \
                 (use VersionTLS12 or VersionTLS13)"
            )),
            _ => Err(format!(
                "{v:?} is not a TLS version (VersionTLS12 or VersionTLS13)"
            )),
        }
    }

    /// Upstream's name of the version.
    pub(crate) fn name(self) -> &'static str {
        match self {
            TlsMinVersion::Tls12 => "VersionTLS12",
            TlsMinVersion::Tls13 => "VersionTLS13",
        }
    }
}

/// Where the node's API listens; `None`: that listener is off.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Listeners {
    pub(crate) main: Option<std::net::SocketAddr>,
    pub(crate) read_only: Option<std::net::SocketAddr>,
    pub(crate) healthz: Option<std::net::SocketAddr>,
}

impl Options {
    /// The listeners to open. A cluster node (`--kubeconfig`) opens the
    /// main port and the healthz port by default, as the apiserver and
    /// kubeadm need them; a standalone node opens each only when its flag
    /// (or `--enable-server`) is given, so nothing listens unasked.
    /// `--enable-server=false` closes the main and read-only ports, as
    /// upstream; a port of 0 closes its listener.
    pub(crate) fn listeners(&self) -> Listeners {
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
    pub(crate) fn cert_dir(&self) -> PathBuf {
        self.cert_dir
            .clone()
            .unwrap_or_else(|| self.root_dir.join("pki"))
    }
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
            max_open_files: crate::rlimit::DEFAULT_MAX_OPEN_FILES,
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
            seccomp_default: false,
            pod_pids_limit: -1,
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
            bootstrap_kubeconfig: None,
            rotate_certificates: false,
            server_tls_bootstrap: false,
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
            streaming_idle_timeout: Duration::from_secs(4 * 3600),
            tls_min_version: TlsMinVersion::Tls12,
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

// Value checks that the flags and the configuration file share.

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

/// `--authorization-mode`: the two modes the kubelet accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuthorizationMode {
    AlwaysAllow,
    Webhook,
}

impl AuthorizationMode {
    pub(crate) fn parse(s: &str) -> Result<AuthorizationMode, String> {
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

/// A boolean flag's value, as Go's `strconv.ParseBool` reads it.
pub(super) fn boolean(flag: &str, v: &str) -> Result<bool, String> {
    settings::parse_bool(v).ok_or_else(|| format!("flag --{flag}: invalid boolean {v:?}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    // The helpers below are shared by the tests of the submodules.

    pub(super) fn parse(args: &[&str]) -> Result<Command, String> {
        parse_args(args.iter().map(|s| s.to_string()))
    }

    pub(super) fn run(args: &[&str]) -> Options {
        match parse(args) {
            Ok(Command::Run(o)) => *o,
            other => panic!("{args:?}: {other:?}"),
        }
    }

    pub(super) fn headers(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(n, v)| (n.to_string(), v.to_string()))
            .collect()
    }

    pub(super) fn config_file(dir: &tempfile::TempDir, name: &str, text: &str) -> String {
        let path = dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        path.display().to_string()
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
}
