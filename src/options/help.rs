//! `--help`, rendered from the settings table: its sections in order,
//! each entry's `--flag kind` column and its text, wrapped as the entry
//! wrote it, with the default `Options::default()` has (or the entry's
//! own text for it).

use serde_json::Value;

use super::lookup::all;
use super::settings::{Section, Setting, Shown};
use super::Options;

const HELP_HEAD: &str = "\
tinylet: a small Kubernetes node agent

Usage: tinylet [flags]
       tinylet status [flags]     what the local node runs (tinylet status --help)
";

/// The sections of `--help` in order, with their headings.
const HELP_SECTIONS: &[(Section, &str)] = &[
    (Section::General, "Flags:"),
    (
        Section::Cluster,
        "Cluster node (with --kubeconfig; without it tinylet runs static pods only):",
    ),
    (Section::Auth, "Node API authentication and authorization:"),
    (Section::Gc, "Garbage collection:"),
    (
        Section::Eviction,
        "Eviction (signals memory.available, nodefs.available, nodefs.inodesFree,\n\
         imagefs.available, imagefs.inodesFree, pid.available; quantities or percentages):",
    ),
    (
        Section::NodeApi,
        "Node API (a cluster node serves --port and --healthz-port by default; a standalone\n\
         node serves each only when its flag or --enable-server is given):",
    ),
    (Section::Logging, ""),
];

/// Rows after the settings: what the command line asks for besides a run.
const HELP_COMMANDS: &[(&str, &str)] = &[
    ("-h, --help", "print this help"),
    (
        "    --version",
        "print the version, git commit, target and whether the\n\
         binary is static, then `Kubernetes vX.Y.Z`; run through a\n\
         link named kubelet, only that line (what kubeadm reads)",
    ),
];

const HELP_ENVIRONMENT: (&str, &str) = (
    "TINYLET_KUBELET_VERSION",
    "the Kubernetes version tinylet reports: --version, the\n\
     Node's kubeletVersion, the probes' User-Agent; set it to\n\
     the cluster's to pass kubeadm's version check. Read\n\
     from /etc/default/tinylet when not in the environment\n\
     (default v1.20.2, the API level tinylet implements)",
);

const HELP_TAIL: &str = "
Other flags of the upstream kubelet (v1.20 and later), as kubeadm and distro units
pass them, are accepted with a warning and ignored (list in README.md). A boolean
flag alone means true; give another value as --flag=false.
";

/// Where the text of a row starts.
const HELP_COLUMN: usize = 39;

/// `--help`, from the table.
pub fn usage() -> String {
    let defaults = Options::default();
    let mut out = String::from(HELP_HEAD);
    for (section, heading) in HELP_SECTIONS {
        out.push('\n');
        if !heading.is_empty() {
            out.push_str(heading);
            out.push('\n');
        }
        for s in all().filter(|s| s.section == *section) {
            let Some(name) = s.flag else { continue };
            let word = s.metavar.unwrap_or(s.kind.name());
            let left = if name.len() == 1 {
                format!("-{name}, --{name} {word}")
            } else {
                format!("--{name} {word}")
            };
            row(&mut out, &left, &doc(s, &defaults));
        }
    }
    for (left, text) in HELP_COMMANDS {
        row(&mut out, left, text);
    }
    out.push_str("\nEnvironment:\n");
    row(&mut out, HELP_ENVIRONMENT.0, HELP_ENVIRONMENT.1);
    out.push_str(HELP_TAIL);
    out
}

/// An entry's text with its default.
fn doc(s: &Setting, defaults: &Options) -> String {
    let value = match s.shown {
        Shown::No => None,
        Shown::Text(t) => Some(t.to_string()),
        Shown::Getter => s.get.map(|g| help_value(&g(defaults))),
    };
    match value {
        None => s.doc.to_string(),
        Some(v) if s.doc.contains("{}") => s.doc.replacen("{}", &v, 1),
        Some(v) => format!("{} (default {v})", s.doc),
    }
}

/// A getter's value as `--help` writes it: `5`, not `5.0`.
fn help_value(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Number(n) => match (n.as_i64(), n.as_u64(), n.as_f64()) {
            (Some(i), _, _) => i.to_string(),
            (_, Some(u), _) => u.to_string(),
            (_, _, Some(f)) if f.fract() == 0.0 && f.abs() < 1e15 => format!("{f:.0}"),
            _ => n.to_string(),
        },
        other => other.to_string(),
    }
}

/// One row: the left column, then the text from `HELP_COLUMN` on (on the
/// next line when the left column is too wide).
fn row(out: &mut String, left: &str, text: &str) {
    let width = HELP_COLUMN - 2;
    let mut lines = text.split('\n');
    let first = lines.next().unwrap_or("");
    if left.len() + 2 <= width {
        out.push_str(&format!("  {left:<width$}{first}\n"));
    } else {
        out.push_str(&format!("  {left}\n{:HELP_COLUMN$}{first}\n", ""));
    }
    for line in lines {
        out.push_str(&format!("{:HELP_COLUMN$}{line}\n", ""));
    }
}
