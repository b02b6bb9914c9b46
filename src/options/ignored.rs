//! The upstream kubelet's flags (v1.20 to v1.34) and configuration file
//! fields that tinylet accepts and ignores, with one warning each at start:
//! entries of the settings table without a setter. The flags are those of
//! `cmd/kubelet/app/options` (KubeletFlags and the KubeletConfiguration
//! flags), the container runtime flags of v1.20, and the global flags the
//! kubelet registers (klog, cAdvisor, logging). A flag that stands for a
//! KubeletConfiguration field names it too, so that the file's field is
//! ignored the same way (a zero there being its default, as upstream).
//! README.md lists the flags; a test keeps the two the same.

use super::settings::{flag, Kind, Section, Setting};

/// A boolean flag: alone it means true.
const fn boolean(name: &'static str) -> Setting {
    flag(name, Kind::Bool, Section::Hidden, "")
}

/// A flag with a value.
const fn valued(name: &'static str) -> Setting {
    flag(name, Kind::Str, Section::Hidden, "")
}

/// The boolean ones first, then the ones with a value, each sorted.
pub(super) static IGNORED: &[Setting] = &[
    boolean("add-dir-header"),
    boolean("alsologtostderr"),
    boolean("contention-profiling").field("enableContentionProfiling"),
    boolean("cpu-cfs-quota").field("cpuCFSQuota"),
    boolean("docker-only"),
    boolean("docker-tls"),
    boolean("enable-cadvisor-json-endpoints"),
    boolean("enable-controller-attach-detach").field("enableControllerAttachDetach"),
    boolean("enable-debugging-handlers").field("enableDebuggingHandlers"),
    boolean("enable-load-reader"),
    boolean("exit-on-lock-contention"),
    boolean("experimental-allocatable-ignore-eviction"),
    boolean("experimental-check-node-capabilities-before-mount"),
    boolean("experimental-kernel-memcg-notification"),
    boolean("experimental-logging-sanitization"),
    boolean("fail-cgroupv1").field("failCgroupV1"),
    boolean("fail-swap-on").field("failSwapOn"),
    boolean("keep-terminated-pod-volumes"),
    boolean("kernel-memcg-notification").field("kernelMemcgNotification"),
    boolean("local-storage-capacity-isolation").field("localStorageCapacityIsolation"),
    boolean("log-cadvisor-usage"),
    boolean("log-json-split-stream"),
    boolean("log-text-split-stream"),
    boolean("logtostderr"),
    boolean("make-iptables-util-chains").field("makeIPTablesUtilChains"),
    boolean("one-output"),
    boolean("protect-kernel-defaults").field("protectKernelDefaults"),
    boolean("really-crash-for-testing"),
    boolean("redirect-container-streaming"),
    boolean("register-schedulable"),
    boolean("skip-headers"),
    boolean("skip-log-headers"),
    boolean("storage-driver-secure"),
    valued("application-metrics-count-limit"),
    valued("azure-container-registry-config"),
    valued("boot-id-file"),
    valued("cgroup-root").field("cgroupRoot"),
    valued("chaos-chance"),
    valued("cloud-config"),
    valued("cloud-provider"),
    valued("cni-bin-dir"),
    valued("cni-cache-dir"),
    valued("cni-conf-dir"),
    valued("config-dir"),
    valued("container-hints"),
    valued("container-runtime"),
    valued("containerd"),
    valued("cpu-cfs-quota-period").field("cpuCFSQuotaPeriod"),
    valued("cpu-manager-policy")
        .field("cpuManagerPolicy")
        .zero(),
    valued("cpu-manager-policy-options").field("cpuManagerPolicyOptions"),
    valued("cpu-manager-reconcile-period")
        .field("cpuManagerReconcilePeriod")
        .zero(),
    valued("docker"),
    valued("docker-endpoint"),
    valued("docker-env-metadata-whitelist"),
    valued("docker-root"),
    valued("docker-tls-ca"),
    valued("docker-tls-cert"),
    valued("docker-tls-key"),
    valued("dynamic-config-dir"),
    valued("enforce-node-allocatable").field("enforceNodeAllocatable"),
    valued("event-burst").field("eventBurst").zero(),
    valued("event-qps").field("eventRecordQPS"),
    valued("event-storage-age-limit"),
    valued("event-storage-event-limit"),
    valued("experimental-dockershim-root-directory"),
    valued("experimental-mounter-path"),
    valued("feature-gates").field("featureGates"),
    valued("global-housekeeping-interval"),
    valued("hairpin-mode").field("hairpinMode").zero(),
    valued("housekeeping-interval"),
    valued("image-credential-provider-bin-dir"),
    valued("image-credential-provider-config"),
    valued("image-pull-progress-deadline"),
    valued("image-service-endpoint").field("imageServiceEndpoint"),
    valued("iptables-drop-bit").field("iptablesDropBit"),
    valued("iptables-masquerade-bit").field("iptablesMasqueradeBit"),
    valued("kube-api-content-type").field("contentType").zero(),
    valued("kube-reserved-cgroup").field("kubeReservedCgroup"),
    valued("kubelet-cgroups").field("kubeletCgroups"),
    valued("lock-file"),
    valued("log-backtrace-at"),
    valued("log-dir"),
    valued("log-file"),
    valued("log-file-max-size"),
    valued("log-flush-frequency"),
    valued("log-json-info-buffer-size"),
    valued("log-text-info-buffer-size"),
    valued("logging-format"),
    valued("machine-id-file"),
    valued("master-service-namespace"),
    valued("maximum-dead-containers"),
    valued("memory-manager-policy").field("memoryManagerPolicy"),
    valued("minimum-container-ttl-duration"),
    valued("network-plugin"),
    valued("network-plugin-mtu"),
    valued("node-status-max-images").field("nodeStatusMaxImages"),
    valued("non-masquerade-cidr"),
    valued("oom-score-adj").field("oomScoreAdj"),
    valued("pod-cidr").field("podCIDR"),
    valued("pod-infra-container-image"),
    valued("pods-per-core").field("podsPerCore"),
    valued("provider-id").field("providerID"),
    valued("qos-reserved").field("qosReserved"),
    valued("reserved-cpus").field("reservedSystemCPUs"),
    valued("reserved-memory").field("reservedMemory"),
    valued("runtime-cgroups"),
    valued("seccomp-profile-root"),
    valued("stderrthreshold"),
    valued("storage-driver-buffer-duration"),
    valued("storage-driver-db"),
    valued("storage-driver-host"),
    valued("storage-driver-password"),
    valued("storage-driver-table"),
    valued("storage-driver-user"),
    valued("system-cgroups").field("systemCgroups"),
    valued("system-reserved-cgroup").field("systemReservedCgroup"),
    valued("tls-cipher-suites").field("tlsCipherSuites"),
    valued("topology-manager-policy")
        .field("topologyManagerPolicy")
        .zero(),
    valued("topology-manager-policy-options").field("topologyManagerPolicyOptions"),
    valued("topology-manager-scope")
        .field("topologyManagerScope")
        .zero(),
    valued("vmodule"),
    valued("volume-plugin-dir").field("volumePluginDir").zero(),
    valued("volume-stats-agg-period")
        .field("volumeStatsAggPeriod")
        .zero(),
];

#[cfg(test)]
mod tests {
    use super::*;
    use crate::options::lookup::all;

    /// The ignored flags are sorted (the boolean ones, then the others),
    /// distinct, none is one tinylet implements, and README.md's table
    /// lists exactly them.
    #[test]
    fn ignored_flags_are_documented_and_apart_from_the_implemented_ones() {
        let names = |bool: bool| -> Vec<&str> {
            IGNORED
                .iter()
                .filter(|s| (s.kind == Kind::Bool) == bool)
                .filter_map(|s| s.flag)
                .collect()
        };
        for list in [names(true), names(false)] {
            assert!(list.windows(2).all(|w| w[0] < w[1]), "{list:?}");
        }
        for s in IGNORED {
            assert!(!s.applied() && s.aliases.is_empty());
            assert!(matches!(s.kind, Kind::Bool | Kind::Str), "{:?}", s.flag);
        }
        let ignored: Vec<&str> = all()
            .filter(|s| !s.applied())
            .filter_map(|s| s.flag)
            .collect();
        assert_eq!(ignored.len(), IGNORED.len());
        for name in &ignored {
            assert!(
                !all().any(|s| s.applied() && s.named(name))
                    && !["help", "h", "version", "v"].contains(name),
                "--{name} is both implemented and ignored"
            );
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
}
