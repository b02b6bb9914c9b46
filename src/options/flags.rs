//! Command-line flags, named like the upstream kubelet's, and their
//! parsing: `parse_args` collects them, applies the configuration file
//! (wherever `--config` stands) and then the flags on top of it, as the
//! settings table (`settings`) says, and checks what depends on several
//! of them.
//!
//! Accepts `--flag value`, `--flag=value` and, as the kubelet does, a single
//! dash (`-v 4`); `_` is `-` in flag names. A boolean flag alone means true.

use std::path::PathBuf;

use super::config_file::apply_config_file;
use super::lookup;
use super::settings::{Kind, Setting, Val};
use super::status_cmd::parse_status_args;
use super::{boolean, AuthorizationMode, Command, Options};

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
    let mut flags: Vec<(&'static Setting, String, String)> = Vec::new();
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
        let setting = match name {
            "h" | "help" => return Ok(Command::Help),
            // `--version=false` asks for nothing, as upstream.
            "version" => match inline.as_deref().map(|v| boolean(name, v)) {
                Some(Ok(false)) => continue,
                _ => return Ok(Command::Version),
            },
            _ => lookup::by_flag(name).ok_or_else(|| format!("unknown flag --{name}"))?,
        };
        let is_bool = setting.kind == Kind::Bool;
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
        if setting.applied() {
            flags.push((setting, name.to_string(), value));
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
    if let Some((_, _, path)) = flags.iter().rev().find(|(s, _, _)| s.named("config")) {
        let path = PathBuf::from(path);
        apply_config_file(&mut o, &path)?;
        o.config_file = Some(path);
    }
    // A map flag's first use replaces the default (or the file's) map;
    // later uses add to it, as the kubelet's map flags do.
    let mut used: Vec<&str> = Vec::new();
    for (setting, name, v) in flags {
        let canonical = setting.flag.unwrap_or_default();
        let first = !used.contains(&canonical);
        used.push(canonical);
        let mut val = setting
            .kind
            .parse_flag(&v)
            .map_err(|e| format!("flag --{name}: {e}"))?;
        if let Val::Pairs { replace, .. } = &mut val {
            *replace = first || !setting.kind.additive();
        }
        setting
            .apply(&mut o, val)
            .map_err(|e| format!("flag --{name}: {e}"))?;
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

/// Parses a comma-separated list of IP addresses; empty input is none.
pub fn parse_ips(v: &str) -> Result<Vec<std::net::IpAddr>, String> {
    v.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| s.parse().map_err(|_| format!("{s:?} is not an IP address")))
        .collect()
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
