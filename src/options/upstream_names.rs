//! The upstream kubelet's names, v1.20 to v1.34 (the wire facts only): the
//! KubeletConfiguration v1beta1 fields (`staging/src/k8s.io/kubelet/config/
//! v1beta1/types.go`, nested ones as dotted paths) and the flags
//! (`cmd/kubelet/app/options`: KubeletFlags, the KubeletConfiguration
//! flags, the container runtime flags of v1.20, the logging flags, and the
//! global klog and cAdvisor flags). The tests check that each is an entry
//! of the settings table, applied or ignored, or is named here as unknown.

use super::lookup::{all, by_field, by_flag, is_section};
use super::settings::Kind;
use super::tests::{config_file, parse, run};
use super::{usage, Command};

/// KubeletConfiguration v1beta1's fields.
const UPSTREAM_FIELDS: &[&str] = &[
    "enableServer",
    "staticPodPath",
    "podLogsDir",
    "syncFrequency",
    "fileCheckFrequency",
    "httpCheckFrequency",
    "staticPodURL",
    "staticPodURLHeader",
    "address",
    "port",
    "readOnlyPort",
    "tlsCertFile",
    "tlsPrivateKeyFile",
    "tlsCipherSuites",
    "tlsCurvePreferences",
    "tlsMinVersion",
    "rotateCertificates",
    "serverTLSBootstrap",
    "authentication",
    "authentication.x509.clientCAFile",
    "authentication.webhook.enabled",
    "authentication.webhook.cacheTTL",
    "authentication.anonymous.enabled",
    "authorization",
    "authorization.mode",
    "authorization.webhook.cacheAuthorizedTTL",
    "authorization.webhook.cacheUnauthorizedTTL",
    "registryPullQPS",
    "registryBurst",
    "imagePullCredentialsVerificationPolicy",
    "preloadedImagesVerificationAllowlist",
    "eventRecordQPS",
    "eventBurst",
    "enableDebuggingHandlers",
    "enableContentionProfiling",
    "healthzPort",
    "healthzBindAddress",
    "oomScoreAdj",
    "clusterDomain",
    "clusterDNS",
    "streamingConnectionIdleTimeout",
    "nodeStatusUpdateFrequency",
    "nodeStatusReportFrequency",
    "nodeLeaseDurationSeconds",
    "imageMinimumGCAge",
    "imageMaximumGCAge",
    "imageGCHighThresholdPercent",
    "imageGCLowThresholdPercent",
    "volumeStatsAggPeriod",
    "kubeletCgroups",
    "systemCgroups",
    "cgroupRoot",
    "cgroupsPerQOS",
    "cgroupDriver",
    "cpuManagerPolicy",
    "singleProcessOOMKill",
    "cpuManagerPolicyOptions",
    "cpuManagerReconcilePeriod",
    "draManagerReconcilePeriod",
    "memoryManagerPolicy",
    "topologyManagerPolicy",
    "topologyManagerScope",
    "topologyManagerPolicyOptions",
    "qosReserved",
    "runtimeRequestTimeout",
    "hairpinMode",
    "maxPods",
    "podCIDR",
    "podPidsLimit",
    "resolvConf",
    "runOnce",
    "cpuCFSQuota",
    "cpuCFSQuotaPeriod",
    "nodeStatusMaxImages",
    "maxOpenFiles",
    "contentType",
    "kubeAPIQPS",
    "kubeAPIBurst",
    "serializeImagePulls",
    "maxParallelImagePulls",
    "evictionHard",
    "evictionSoft",
    "evictionSoftGracePeriod",
    "evictionPressureTransitionPeriod",
    "evictionMaxPodGracePeriod",
    "evictionMinimumReclaim",
    "mergeDefaultEvictionSettings",
    "podsPerCore",
    "enableControllerAttachDetach",
    "protectKernelDefaults",
    "makeIPTablesUtilChains",
    "iptablesMasqueradeBit",
    "iptablesDropBit",
    "featureGates",
    "failSwapOn",
    "memorySwap",
    "containerLogMaxSize",
    "containerLogMaxFiles",
    "containerLogMaxWorkers",
    "containerLogMonitorInterval",
    "configMapAndSecretChangeDetectionStrategy",
    "systemReserved",
    "kubeReserved",
    "reservedSystemCPUs",
    "showHiddenMetricsForVersion",
    "systemReservedCgroup",
    "kubeReservedCgroup",
    "enforceNodeAllocatable",
    "allowedUnsafeSysctls",
    "volumePluginDir",
    "providerID",
    "kernelMemcgNotification",
    "logging",
    "enableSystemLogHandler",
    "enableSystemLogQuery",
    "shutdownGracePeriod",
    "shutdownGracePeriodCriticalPods",
    "shutdownGracePeriodByPodPriority",
    "crashLoopBackOff",
    "reservedMemory",
    "enableProfilingHandler",
    "enableDebugFlagsHandler",
    "seccompDefault",
    "memoryThrottlingFactor",
    "memoryReservationPolicy",
    "registerWithTaints",
    "registerNode",
    "tracing",
    "localStorageCapacityIsolation",
    "containerRuntimeEndpoint",
    "imageServiceEndpoint",
    "failCgroupV1",
    "userNamespaces",
];

/// Fields the table does not name: like any field it does not know, a
/// file's value is recorded as ignored (and logged at debug level).
const UNKNOWN_FIELDS: &[&str] = &[
    "tlsCurvePreferences",
    "imagePullCredentialsVerificationPolicy",
    "preloadedImagesVerificationAllowlist",
    "imageMaximumGCAge",
    "singleProcessOOMKill",
    "draManagerReconcilePeriod",
    "runOnce",
    "maxParallelImagePulls",
    "mergeDefaultEvictionSettings",
    "memorySwap",
    "containerLogMaxWorkers",
    "containerLogMonitorInterval",
    "showHiddenMetricsForVersion",
    "logging",
    "enableSystemLogHandler",
    "enableSystemLogQuery",
    "shutdownGracePeriod",
    "shutdownGracePeriodCriticalPods",
    "shutdownGracePeriodByPodPriority",
    "crashLoopBackOff",
    "enableProfilingHandler",
    "enableDebugFlagsHandler",
    "memoryThrottlingFactor",
    "memoryReservationPolicy",
    "tracing",
    "userNamespaces",
];

/// The kubelet's flags on Linux, and the Windows-only ones.
const UPSTREAM_FLAGS: &[&str] = &[
    // KubeletFlags.
    "config",
    "config-dir",
    "kubeconfig",
    "bootstrap-kubeconfig",
    "hostname-override",
    "node-ip",
    "cert-dir",
    "cloud-provider",
    "cloud-config",
    "root-dir",
    "seccomp-default",
    "node-labels",
    "lock-file",
    "exit-on-lock-contention",
    "minimum-container-ttl-duration",
    "maximum-dead-containers-per-container",
    "maximum-dead-containers",
    "register-schedulable",
    "keep-terminated-pod-volumes",
    "experimental-mounter-path",
    "experimental-allocatable-ignore-eviction",
    "experimental-check-node-capabilities-before-mount",
    "experimental-kernel-memcg-notification",
    "dynamic-config-dir",
    "non-masquerade-cidr",
    "master-service-namespace",
    "really-crash-for-testing",
    "chaos-chance",
    "seccomp-profile-root",
    "redirect-container-streaming",
    "windows-service",
    "windows-priorityclass",
    // The container runtime's (v1.20, and those left later).
    "container-runtime",
    "runtime-cgroups",
    "docker-endpoint",
    "image-pull-progress-deadline",
    "experimental-dockershim-root-directory",
    "pod-infra-container-image",
    "network-plugin",
    "network-plugin-mtu",
    "cni-conf-dir",
    "cni-bin-dir",
    "cni-cache-dir",
    "image-credential-provider-config",
    "image-credential-provider-bin-dir",
    // The KubeletConfiguration flags.
    "enable-server",
    "fail-swap-on",
    "fail-cgroupv1",
    "pod-manifest-path",
    "sync-frequency",
    "file-check-frequency",
    "http-check-frequency",
    "manifest-url",
    "manifest-url-header",
    "address",
    "port",
    "read-only-port",
    "container-runtime-endpoint",
    "image-service-endpoint",
    "anonymous-auth",
    "authentication-token-webhook",
    "authentication-token-webhook-cache-ttl",
    "client-ca-file",
    "authorization-mode",
    "authorization-webhook-cache-authorized-ttl",
    "authorization-webhook-cache-unauthorized-ttl",
    "tls-cert-file",
    "tls-private-key-file",
    "rotate-server-certificates",
    "tls-cipher-suites",
    "tls-min-version",
    "rotate-certificates",
    "registry-qps",
    "registry-burst",
    "event-qps",
    "event-burst",
    "enable-debugging-handlers",
    "enable-cadvisor-json-endpoints",
    "contention-profiling",
    "healthz-port",
    "healthz-bind-address",
    "oom-score-adj",
    "cluster-domain",
    "volume-plugin-dir",
    "cluster-dns",
    "streaming-connection-idle-timeout",
    "node-status-update-frequency",
    "minimum-image-ttl-duration",
    "image-gc-high-threshold",
    "image-gc-low-threshold",
    "volume-stats-agg-period",
    "feature-gates",
    "kubelet-cgroups",
    "system-cgroups",
    "provider-id",
    "cgroups-per-qos",
    "cgroup-driver",
    "cgroup-root",
    "cpu-manager-policy",
    "cpu-manager-policy-options",
    "cpu-manager-reconcile-period",
    "qos-reserved",
    "topology-manager-policy",
    "topology-manager-policy-options",
    "topology-manager-scope",
    "runtime-request-timeout",
    "hairpin-mode",
    "max-pods",
    "pod-cidr",
    "pod-max-pids",
    "resolv-conf",
    "runonce",
    "cpu-cfs-quota",
    "cpu-cfs-quota-period",
    "enable-controller-attach-detach",
    "make-iptables-util-chains",
    "iptables-masquerade-bit",
    "iptables-drop-bit",
    "container-log-max-size",
    "container-log-max-files",
    "allowed-unsafe-sysctls",
    "node-status-max-images",
    "kernel-memcg-notification",
    "local-storage-capacity-isolation",
    "max-open-files",
    "kube-api-content-type",
    "kube-api-qps",
    "kube-api-burst",
    "serialize-image-pulls",
    "eviction-hard",
    "eviction-soft",
    "eviction-soft-grace-period",
    "eviction-pressure-transition-period",
    "eviction-max-pod-grace-period",
    "eviction-minimum-reclaim",
    "pods-per-core",
    "protect-kernel-defaults",
    "reserved-cpus",
    "system-reserved",
    "kube-reserved",
    "enforce-node-allocatable",
    "system-reserved-cgroup",
    "kube-reserved-cgroup",
    "memory-manager-policy",
    "reserved-memory",
    "register-node",
    "register-with-taints",
    // Logging (component-base).
    "logging-format",
    "log-flush-frequency",
    "log-text-split-stream",
    "log-text-info-buffer-size",
    "log-json-split-stream",
    "log-json-info-buffer-size",
    "experimental-logging-sanitization",
    // Global: klog, the version, the credential provider.
    "v",
    "vmodule",
    "logtostderr",
    "alsologtostderr",
    "stderrthreshold",
    "log-backtrace-at",
    "log-dir",
    "log-file",
    "log-file-max-size",
    "skip-headers",
    "skip-log-headers",
    "add-dir-header",
    "one-output",
    "azure-container-registry-config",
    "version",
    "help",
    "h",
    // Global: cAdvisor's, on Linux.
    "docker-root",
    "housekeeping-interval",
    "application-metrics-count-limit",
    "boot-id-file",
    "container-hints",
    "containerd",
    "containerd-namespace",
    "docker",
    "docker-env-metadata-whitelist",
    "docker-only",
    "docker-tls",
    "docker-tls-ca",
    "docker-tls-cert",
    "docker-tls-key",
    "enable-load-reader",
    "event-storage-age-limit",
    "event-storage-event-limit",
    "global-housekeeping-interval",
    "log-cadvisor-usage",
    "machine-id-file",
    "storage-driver-user",
    "storage-driver-password",
    "storage-driver-host",
    "storage-driver-db",
    "storage-driver-table",
    "storage-driver-secure",
    "storage-driver-buffer-duration",
];

/// Flags the table does not name: an error, `unknown flag --x`. The
/// Windows ones are not a Linux kubelet's flags either; cAdvisor's
/// containerd namespace is the only Linux one tinylet refuses.
const UNKNOWN_FLAGS: &[&str] = &[
    "containerd-namespace",
    "windows-service",
    "windows-priorityclass",
];

/// Flags `parse_args` reads itself: they ask for something else than a run.
const COMMANDS: &[&str] = &["help", "h", "version"];

#[test]
fn every_upstream_field_is_in_the_table_or_named_unknown() {
    for f in UPSTREAM_FIELDS {
        let known = by_field(f).is_some() || is_section(f);
        assert!(
            known != UNKNOWN_FIELDS.contains(f),
            "{f}: in the table {known}, named unknown {}",
            !known
        );
    }
    for f in UNKNOWN_FIELDS {
        assert!(UPSTREAM_FIELDS.contains(f), "{f} is not an upstream field");
    }
    // An unknown field, and a field the table ignores, is recorded as
    // ignored, not an error.
    let dir = tempfile::tempdir().unwrap();
    let ignored: Vec<&str> = all()
        .filter(|s| !s.applied())
        .filter_map(|s| s.field)
        .collect();
    assert!(ignored.len() > 30, "{ignored:?}");
    let mut text =
        String::from("apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n");
    for f in UNKNOWN_FIELDS.iter().chain(&ignored) {
        text.push_str(&format!("{f}: x\n"));
    }
    let file = config_file(&dir, "upstream.yaml", &text);
    let mut o = run(&["--config", &file]).ignored_config_fields;
    o.sort();
    let mut want: Vec<String> = UNKNOWN_FIELDS
        .iter()
        .chain(&ignored)
        .map(|f| f.to_string())
        .collect();
    want.sort();
    assert_eq!(o, want);
}

#[test]
fn every_upstream_flag_is_in_the_table_or_named_unknown() {
    for f in UPSTREAM_FLAGS {
        let known = by_flag(f).is_some() || COMMANDS.contains(f);
        assert!(
            known != UNKNOWN_FLAGS.contains(f),
            "--{f}: in the table {known}, named unknown {}",
            !known
        );
    }
    for f in UNKNOWN_FLAGS {
        assert!(UPSTREAM_FLAGS.contains(f), "--{f} is not an upstream flag");
        assert_eq!(
            parse(&[&format!("--{f}"), "x"]),
            Err(format!("unknown flag --{f}"))
        );
        assert_eq!(
            parse(&[&format!("--{f}=x")]),
            Err(format!("unknown flag --{f}"))
        );
    }
    // And every flag of the table is one of upstream's, but tinylet's own
    // and those of kubelets older than v1.20 that it still takes.
    let own = [
        "pod-logs-dir",
        "node-status-report-frequency",
        "node-lease-duration-seconds",
        "bootstrap-checkpoint-path",
        "experimental-bootstrap-kubeconfig",
        "allow-privileged",
        "runonce-timeout",
    ];
    let strangers: Vec<&str> = all()
        .flat_map(|s| s.flag.iter().chain(s.aliases))
        .filter(|name| !UPSTREAM_FLAGS.contains(name) && !own.contains(name))
        .copied()
        .collect();
    assert!(strangers.is_empty(), "not upstream flags: {strangers:?}");
    assert_eq!(parse(&["--help"]), Ok(Command::Help));
}

/// No two entries share a flag, an alias or a field; every applied flag
/// has its line in --help; booleans are `Kind::Bool`.
#[test]
fn the_table_is_sane() {
    let mut flags: Vec<&str> = all()
        .flat_map(|s| s.flag.iter().chain(s.aliases))
        .copied()
        .collect();
    let n = flags.len();
    flags.sort();
    flags.dedup();
    assert_eq!(flags.len(), n, "a flag is named twice");
    let mut fields: Vec<&str> = all().filter_map(|s| s.field).collect();
    let n = fields.len();
    fields.sort();
    fields.dedup();
    assert_eq!(fields.len(), n, "a field is named twice");
    for f in &fields {
        assert!(!is_section(f), "{f} is a field and holds fields");
    }

    let help = usage();
    for s in all().filter(|s| s.applied()) {
        assert!(s.flag.is_some() || s.field.is_some(), "{}", s.doc);
        assert!(!s.doc.is_empty(), "{:?} {:?}", s.flag, s.field);
        let Some(name) = s.flag else { continue };
        let row = format!("--{name} {}", s.metavar.unwrap_or(s.kind.name()));
        assert!(
            help.lines()
                .any(|l| l.trim_start().ends_with(&row) || l.contains(&format!("{row} "))),
            "--{name} has no line in --help"
        );
        for alias in s.aliases {
            assert!(!help.contains(&format!("--{alias} ")), "{alias}");
        }
    }
    // Booleans: the ones that stand alone are Kind::Bool, and a Bool takes
    // no value from the next argument.
    let defaults = crate::options::Options::default();
    for s in all() {
        let Some(name) = s.flag else { continue };
        let alone = parse(&[&format!("--{name}")]);
        if s.kind == Kind::Bool {
            assert!(
                !matches!(&alone, Err(e) if e.contains("needs a value")),
                "--{name}: {alone:?}"
            );
        } else {
            assert_eq!(alone, Err(format!("flag --{name} needs a value")));
        }
        if let Some(get) = s.get {
            let v = get(&defaults);
            assert_eq!(v.is_boolean(), s.kind == Kind::Bool, "--{name}: {v}");
        }
    }
}

/// `/configz` keeps the fields and values it had before the table, and
/// nests the dotted ones.
#[test]
fn configz_shows_the_table_s_fields() {
    let o = run(&["--kubeconfig", "/k", "--client-ca-file", "/ca.crt"]);
    let v: serde_json::Value = serde_json::from_str(&super::configz(&o)).unwrap();
    let c = &v["kubeletconfig"];
    let want = serde_json::json!({
        "enableServer": true,
        "staticPodPath": null,
        "staticPodURL": null,
        "syncFrequency": "1m0s",
        "fileCheckFrequency": "20s",
        "httpCheckFrequency": "20s",
        "address": "0.0.0.0",
        "port": 10250,
        "readOnlyPort": 0,
        "healthzPort": 10248,
        "healthzBindAddress": "127.0.0.1",
        "tlsCertFile": null,
        "tlsPrivateKeyFile": null,
        "tlsMinVersion": "VersionTLS12",
        "streamingConnectionIdleTimeout": "4h0m0s",
        "authentication": {
            "x509": {"clientCAFile": "/ca.crt"},
            "webhook": {"enabled": false, "cacheTTL": "2m0s"},
            "anonymous": {"enabled": false},
        },
        "authorization": {
            "mode": "Webhook",
            "webhook": {"cacheAuthorizedTTL": "5m0s", "cacheUnauthorizedTTL": "30s"},
        },
        "containerLogMaxSize": "10Mi",
        "containerLogMaxFiles": 5,
        "registryPullQPS": 5.0,
        "registryBurst": 10,
        "clusterDomain": "",
        "clusterDNS": [],
        "nodeStatusUpdateFrequency": "10s",
        "nodeStatusReportFrequency": "5m0s",
        "nodeLeaseDurationSeconds": 40,
        "imageMinimumGCAge": "2m0s",
        "imageGCHighThresholdPercent": 85,
        "imageGCLowThresholdPercent": 80,
        "cgroupsPerQOS": true,
        "cgroupDriver": "cgroupfs",
        "runtimeRequestTimeout": "2m0s",
        "maxPods": 110,
        "resolvConf": "/etc/resolv.conf",
        "serializeImagePulls": true,
        "kubeAPIQPS": 50.0,
        "kubeAPIBurst": 100,
        "registerNode": true,
        "containerRuntimeEndpoint": "unix:///run/containerd/containerd.sock",
        "podLogsDir": "/var/log/pods",
    });
    let serde_json::Value::Object(want) = want else {
        unreachable!()
    };
    for (k, w) in &want {
        assert_eq!(&c[k], w, "{k}");
    }
    // Fields the old /configz did not have.
    assert_eq!(c["maxOpenFiles"], 1_000_000);
    assert_eq!(c["evictionHard"]["memory.available"], "100Mi");
    assert_eq!(c["configMapAndSecretChangeDetectionStrategy"], "Watch");
    assert_eq!(c["podPidsLimit"], -1);
    // Only fields: no flag-only setting (root-dir) is in it.
    assert!(c.get("rootDir").is_none() && c.get("root-dir").is_none());
}
