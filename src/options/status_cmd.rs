//! The flags of `tinylet status` (the subcommand `crate::status_cmd`
//! runs), parsed apart from the kubelet's own.

use std::path::PathBuf;

use super::{boolean, Command, Options};

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
    pub(crate) watch: bool,
    pub(crate) output: StatusOutput,
    /// The node's read-only port; 0: not asked.
    pub(crate) read_only_port: u16,
    /// The node's main (TLS) port, asked with `kubeconfig`'s credentials.
    pub(crate) port: u16,
    pub(crate) kubeconfig: Option<PathBuf>,
    /// The main port's certificate (default `<root-dir>/pki/kubelet.crt`).
    pub(crate) tls_cert_file: Option<PathBuf>,
    pub(crate) container_runtime_endpoint: String,
    pub(crate) root_dir: PathBuf,
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::options::tests::parse;

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
