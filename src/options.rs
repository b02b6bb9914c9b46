//! Command-line flags, named like the upstream kubelet's, and their parsing.
//!
//! Accepts `--flag value`, `--flag=value` and, as the kubelet does, a single
//! dash (`-v 4`). Durations use Go's syntax (`20s`, `1m30s`, `500ms`).

use std::path::PathBuf;
use std::time::Duration;

#[derive(Debug, Clone, PartialEq)]
pub struct Options {
    pub container_runtime_endpoint: String,
    pub pod_manifest_path: Option<PathBuf>,
    pub hostname_override: Option<String>,
    pub root_dir: PathBuf,
    pub pod_logs_dir: PathBuf,
    pub file_check_frequency: Duration,
    pub sync_frequency: Duration,
    pub runtime_request_timeout: Duration,
    pub verbosity: u8,
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
            sync_frequency: Duration::from_secs(60),
            runtime_request_timeout: Duration::from_secs(120),
            verbosity: 0,
        }
    }
}

/// What the command line asks for.
#[derive(Debug, PartialEq)]
pub enum Command {
    Run(Options),
    Help,
    Version,
}

pub const USAGE: &str = "\
tinylet: a small Kubernetes node agent

Usage: tinylet [flags]

Flags:
  --container-runtime-endpoint string  CRI endpoint (default unix:///run/containerd/containerd.sock)
  --pod-manifest-path string           directory (or file) of static pod manifests
  --hostname-override string           node name to use instead of the hostname
  --root-dir string                    directory for tinylet's state (default /var/lib/tinylet)
  --pod-logs-dir string                root of container log directories (default /var/log/pods)
  --file-check-frequency duration      how often the manifest path is re-listed (default 20s)
  --sync-frequency duration            how often a running pod is re-synced (default 1m0s)
  --runtime-request-timeout duration   deadline of each CRI call (default 2m0s)
  -v, --v int                          log verbosity: 0 info, 1-3 more info, 4+ debug, 6+ trace
  -h, --help                           print this help
      --version                        print the version
";

/// Parses a Go-style duration: a sequence of number+unit (ns, us, ms, s, m, h).
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let bad = || format!("invalid duration {s:?} (want e.g. 20s, 1m30s, 500ms)");
    if s == "0" {
        return Ok(Duration::ZERO);
    }
    let mut total = 0f64;
    let mut rest = s;
    if rest.is_empty() {
        return Err(bad());
    }
    while !rest.is_empty() {
        let num_end = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(bad)?;
        let n: f64 = rest[..num_end].parse().map_err(|_| bad())?;
        rest = &rest[num_end..];
        let unit_end = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let mult = match &rest[..unit_end] {
            "ns" => 1e-9,
            "us" | "µs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return Err(bad()),
        };
        total += n * mult;
        rest = &rest[unit_end..];
    }
    Ok(Duration::from_secs_f64(total))
}

pub fn parse_args<I: IntoIterator<Item = String>>(args: I) -> Result<Command, String> {
    let mut o = Options::default();
    let mut it = args.into_iter();
    while let Some(arg) = it.next() {
        let Some(flag) = arg.strip_prefix("--").or_else(|| arg.strip_prefix('-')) else {
            return Err(format!("unexpected argument {arg:?} (flags start with --)"));
        };
        let (name, inline) = match flag.split_once('=') {
            Some((n, v)) => (n, Some(v.to_string())),
            None => (flag, None),
        };
        match name {
            "h" | "help" => return Ok(Command::Help),
            "version" => return Ok(Command::Version),
            _ => {}
        }
        let mut value = || -> Result<String, String> {
            match inline.clone() {
                Some(v) => Ok(v),
                None => it
                    .next()
                    .ok_or_else(|| format!("flag --{name} needs a value")),
            }
        };
        let dur = |v: String| parse_duration(&v).map_err(|e| format!("flag --{name}: {e}"));
        match name {
            "container-runtime-endpoint" => o.container_runtime_endpoint = value()?,
            "pod-manifest-path" => {
                let v = value()?;
                o.pod_manifest_path = (!v.is_empty()).then(|| PathBuf::from(v));
            }
            "hostname-override" => {
                let v = value()?;
                o.hostname_override = (!v.is_empty()).then_some(v);
            }
            "root-dir" => o.root_dir = PathBuf::from(value()?),
            "pod-logs-dir" => o.pod_logs_dir = PathBuf::from(value()?),
            "file-check-frequency" => o.file_check_frequency = dur(value()?)?,
            "sync-frequency" => o.sync_frequency = dur(value()?)?,
            "runtime-request-timeout" => o.runtime_request_timeout = dur(value()?)?,
            "v" => {
                let v = value()?;
                o.verbosity = v
                    .parse()
                    .map_err(|_| format!("flag --v: invalid level {v:?} (want 0-10)"))?;
            }
            _ => return Err(format!("unknown flag --{name}")),
        }
    }
    if o.file_check_frequency.is_zero() {
        return Err("flag --file-check-frequency: must be greater than 0".into());
    }
    if o.sync_frequency.is_zero() {
        return Err("flag --sync-frequency: must be greater than 0".into());
    }
    if o.runtime_request_timeout.is_zero() {
        return Err("flag --runtime-request-timeout: must be greater than 0".into());
    }
    Ok(Command::Run(o))
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
}
