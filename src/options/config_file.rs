//! The subset of the kubelet's configuration file (`--config`, a
//! KubeletConfiguration v1beta1 in YAML or JSON) that tinylet understands:
//! `apply_config_file` sets the fields the settings table has a setter
//! for and records the others. `tests/tidy.rs` checks, through
//! `config_fields`, that the packaged configuration file names every field
//! read here.

use std::path::Path;

use serde_json::{Map, Value};

use super::lookup;
use super::{parse_duration, Options};
use crate::config::decode::parse_object;

/// The `apiVersion` and `kind` of a kubelet configuration file.
pub const CONFIG_API_VERSION: &str = "kubelet.config.k8s.io/v1beta1";

pub const CONFIG_KIND: &str = "KubeletConfiguration";

/// Largest configuration file read.
const CONFIG_FILE_MAX: u64 = 1024 * 1024;

/// `v` is the zero (`0s`, `0`, `""`) that upstream's v1beta1 defaulting
/// replaces in the fields that are not pointers in `KubeletConfiguration`
/// (the entries marked `zero`). kubeadm writes its config.yaml with these
/// zeros spelled out (`fileCheckFrequency: 0s`), so a zero there leaves the
/// setting as it was (its default, or a flag). Pointer fields
/// (`healthzPort`, `kubeAPIQPS`, `podPidsLimit`, the image GC thresholds
/// ...) keep an explicit zero, as upstream.
fn is_zero(v: &Value) -> bool {
    match v {
        Value::String(s) => s.is_empty() || parse_duration(s).is_ok_and(|d| d.is_zero()),
        Value::Number(n) => n.as_f64() == Some(0.0),
        _ => false,
    }
}

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
    apply_object(o, "", &fields).map_err(|(field, msg)| err(&field, msg))
}

/// Applies the fields of the object at `prefix` (`""`: the file's top,
/// `authentication`, ...); an error is the field's path and what is wrong.
fn apply_object(
    o: &mut Options,
    prefix: &str,
    fields: &Map<String, Value>,
) -> Result<(), (String, String)> {
    for (key, v) in fields {
        if prefix.is_empty() && (key == "apiVersion" || key == "kind") {
            continue;
        }
        let path = if prefix.is_empty() {
            key.clone()
        } else {
            format!("{prefix}.{key}")
        };
        if let Some(s) = lookup::by_field(&path) {
            if (s.zero_is_default && is_zero(v)) || (s.null_is_absent && v.is_null()) {
                continue;
            }
            if !s.applied() {
                o.ignored_config_fields.push(path);
                continue;
            }
            let val = s.kind.parse_json(&path, v)?;
            s.apply(o, val).map_err(|e| (path, e))?;
        } else if lookup::is_section(&path) {
            let Value::Object(inner) = v else {
                return Err((path, format!("expected an object, found {v}")));
            };
            apply_object(o, &path, inner)?;
        } else {
            o.ignored_config_fields.push(path);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;
    use std::time::Duration;

    use super::*;
    use crate::options::tests::{config_file, headers, parse, run};
    use crate::options::AuthorizationMode;
    use crate::options::Command;

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
maxOpenFiles: 65536
nodeStatusUpdateFrequency: 20s
kubeReserved: {cpu: 200m}
registerWithTaints: [{key: k, value: v, effect: NoSchedule}]
authentication: {anonymous: {enabled: false}}
cgroupDriver: systemd
configMapAndSecretChangeDetectionStrategy: Cache
";

    #[test]
    fn tls_min_version_and_the_streaming_idle_timeout_are_read_not_ignored() {
        let dir = tempfile::tempdir().unwrap();
        let o = run(&[]);
        assert_eq!(o.tls_min_version, crate::options::TlsMinVersion::Tls12);
        assert_eq!(o.streaming_idle_timeout, Duration::from_secs(4 * 3600));
        let head = "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n";
        let file = config_file(
            &dir,
            "c.yaml",
            &format!("{head}tlsMinVersion: VersionTLS13\nstreamingConnectionIdleTimeout: 5m\n"),
        );
        let o = run(&["--config", &file]);
        assert_eq!(o.tls_min_version, crate::options::TlsMinVersion::Tls13);
        assert_eq!(o.streaming_idle_timeout, Duration::from_secs(300));
        assert!(
            o.ignored_config_fields.is_empty(),
            "{:?}",
            o.ignored_config_fields
        );
        assert!(o.ignored_flags.is_empty(), "{:?}", o.ignored_flags);
        // Flags override the file.
        let o = run(&[
            "--config",
            &file,
            "--tls-min-version=VersionTLS12",
            "--streaming-connection-idle-timeout",
            "0s",
        ]);
        assert_eq!(o.tls_min_version, crate::options::TlsMinVersion::Tls12);
        assert!(o.streaming_idle_timeout.is_zero());
        // TLS 1.0 and 1.1 are refused at start, naming where they came from.
        let e = parse(&["--tls-min-version", "VersionTLS10"]).unwrap_err();
        assert!(
            e.contains("--tls-min-version") && e.contains("VersionTLS10"),
            "{e}"
        );
        let old = config_file(
            &dir,
            "old.yaml",
            &format!("{head}tlsMinVersion: VersionTLS11\n"),
        );
        let e = parse(&["--config", &old]).unwrap_err();
        assert!(e.contains("tlsMinVersion") && e.contains("old.yaml"), "{e}");
        let e = parse(&["--streaming-connection-idle-timeout", "soon"]).unwrap_err();
        assert!(e.contains("--streaming-connection-idle-timeout"), "{e}");
    }

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
        assert_eq!(o.max_open_files, 65536);
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
    fn a_config_kubeadm_wrote_reads_its_zeros_as_the_defaults() {
        let dir = tempfile::tempdir().unwrap();
        let text = include_str!("../../tests/support/kubeadm/config-v1.20.2.yaml");
        let file = config_file(&dir, "config.yaml", text);
        // As kubeadm's drop-in starts the kubelet.
        let kubeconfig = ["--kubeconfig", "/etc/kubernetes/kubelet.conf"];
        let o = run(&["--config", &file, kubeconfig[0], kubeconfig[1]]);
        let d = run(&[]);
        // Every zero duration and count kubeadm spelled out is the default.
        assert_eq!(o.file_check_frequency, d.file_check_frequency);
        assert_eq!(o.http_check_frequency, d.http_check_frequency);
        assert_eq!(o.sync_frequency, d.sync_frequency);
        assert_eq!(o.runtime_request_timeout, d.runtime_request_timeout);
        assert_eq!(o.streaming_idle_timeout, Duration::from_secs(4 * 3600));
        assert_eq!(
            o.node_status_update_frequency,
            d.node_status_update_frequency
        );
        assert_eq!(
            o.node_status_report_frequency,
            d.node_status_report_frequency
        );
        assert_eq!(o.image_gc.min_age, d.image_gc.min_age);
        assert_eq!(
            o.eviction.pressure_transition_period,
            d.eviction.pressure_transition_period
        );
        assert_eq!(o.auth.token_cache_ttl, Duration::from_secs(120));
        assert_eq!(o.auth.authorized_ttl, d.auth.authorized_ttl);
        assert_eq!(o.auth.unauthorized_ttl, d.auth.unauthorized_ttl);
        // What it set is taken.
        assert_eq!(
            o.client_ca_file,
            Some(PathBuf::from("/etc/kubernetes/pki/ca.crt"))
        );
        assert!(!o.auth.anonymous && o.auth.token_webhook);
        assert_eq!(o.auth.mode, Some(AuthorizationMode::Webhook));
        assert_eq!(
            o.cluster_dns,
            ["10.96.0.10".parse::<std::net::IpAddr>().unwrap()]
        );
        assert_eq!(o.cluster_domain, "cluster.local");
        assert_eq!(o.healthz_port, 10248);
        assert_eq!(
            o.pod_manifest_path,
            Some(PathBuf::from("/etc/kubernetes/manifests"))
        );
        assert!(o.rotate_certificates && !d.rotate_certificates);
        // A zero read as the default is not an ignored field either.
        for f in &o.ignored_config_fields {
            assert!(
                !lookup::by_field(f).is_some_and(|s| s.zero_is_default),
                "{f} ignored: {:?}",
                o.ignored_config_fields
            );
        }
        // A pointer field keeps its zero: healthzPort 0 turns healthz off.
        let head = "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n";
        let off = config_file(
            &dir,
            "off.yaml",
            &format!("{head}healthzPort: 0\nmaxPods: 0\n"),
        );
        let o = run(&["--config", &off]);
        assert_eq!((o.healthz_port, o.max_pods), (0, d.max_pods));
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
                format!("{head}httpCheckFrequency: -1s\n"),
                "httpCheckFrequency",
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
                "reserved.yaml",
                format!("{head}kubeReserved: {{gpu: \"1\"}}\n"),
                "kubeReserved.gpu: unknown resource \"gpu\"",
            ),
            (
                "negative.yaml",
                format!("{head}systemReserved: {{memory: -1Gi}}\n"),
                "systemReserved.memory: quantity \"-1Gi\" is negative",
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
             allowPrivileged: false\ncgroupsPerQOS: false\ncgroupDriver: systemd\n\
             seccompDefault: true\npodPidsLimit: 1024\n",
        )
        .unwrap();
        let mut o = Options::default();
        assert!(!o.seccomp_default && o.pod_pids_limit == -1);
        apply_config_file(&mut o, &file).unwrap();
        assert!(o.seccomp_default);
        assert_eq!(o.pod_pids_limit, 1024);
        assert!(
            o.ignored_config_fields.is_empty(),
            "{:?}",
            o.ignored_config_fields
        );
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

    #[test]
    fn auth_flags_and_config_sections() {
        use crate::options::{AuthConfig, AuthorizationMode};
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
}
