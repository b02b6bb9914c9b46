//! The upstream kubelet's flags that tinylet accepts and ignores, with one
//! warning each at start: boolean ones (alone they mean true) and ones
//! with a value. README.md lists them; a test keeps the two the same.

/// Boolean flags of the upstream kubelet, v1.20 to v1.34, that tinylet
/// accepts and ignores (with a warning at start): the flags of
/// `cmd/kubelet/app/options` (KubeletFlags and the KubeletConfiguration
/// flags), the container runtime flags of v1.20, and the global flags the
/// kubelet registers (klog, cAdvisor, logging). Listed in README.md.
pub(crate) const IGNORED_BOOL_FLAGS: &[&str] = &[
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
    "skip-headers",
    "skip-log-headers",
    "storage-driver-secure",
];

/// Upstream kubelet flags with a value (v1.20 to v1.34, from the same
/// sources as `IGNORED_BOOL_FLAGS`) that tinylet accepts and ignores.
pub(crate) const IGNORED_VALUE_FLAGS: &[&str] = &[
    "application-metrics-count-limit",
    "azure-container-registry-config",
    "boot-id-file",
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
    "system-cgroups",
    "system-reserved-cgroup",
    "tls-cipher-suites",
    "topology-manager-policy",
    "topology-manager-policy-options",
    "topology-manager-scope",
    "vmodule",
    "volume-plugin-dir",
    "volume-stats-agg-period",
];

#[cfg(test)]
mod tests {
    use super::*;
    use crate::options::flags::{BOOL_FLAGS, FLAGS};

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
}
