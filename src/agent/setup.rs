//! What the agent checks and sets up before it starts a thread: the node's
//! name, the manifest path and root dir it will use, its own OOM score and
//! open files limit; then the runtime it waits for and the node API it
//! serves.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use crossbeam_channel::Receiver;
use log::{info, warn};

use crate::cri::RemoteRuntime;
use crate::options::Options;
use crate::server::routes::State;

/// The checks and settings before any thread starts; returns the node's
/// name.
pub(super) fn prepare(opts: &Options) -> anyhow::Result<String> {
    crate::malloc::limit_arenas();
    warn_ignored(opts);
    let node = node_name(opts)?;
    crate::metrics::set_node_name(&node);
    if let Some(p) = &opts.pod_manifest_path {
        check_manifest_path(p)?;
    }
    check_root_dir(&opts.root_dir)?;
    protect_from_oom();
    raise_open_files(opts.max_open_files);
    info!("{} starting as node {node:?}", crate::version::long());
    Ok(node)
}

/// Logs what the flags and the config file named that tinylet does not use.
fn warn_ignored(opts: &Options) {
    for flag in &opts.ignored_flags {
        warn!("flag --{flag}: a kubelet flag tinylet does not use; ignored");
    }
    if let Some(file) = &opts.config_file {
        info!("configuration file {}", file.display());
        for field in &opts.ignored_config_fields {
            log::debug!("--config {}: ignoring field {field}", file.display());
        }
    }
}

fn node_name(opts: &Options) -> anyhow::Result<String> {
    let name = match &opts.hostname_override {
        Some(n) => n.clone(),
        None => std::fs::read_to_string("/proc/sys/kernel/hostname")
            .context("reading the hostname (set --hostname-override)")?,
    };
    let name = name.trim().to_lowercase();
    if name.is_empty() {
        bail!("the node name is empty (set --hostname-override)");
    }
    Ok(name)
}

fn check_manifest_path(path: &Path) -> anyhow::Result<()> {
    match std::fs::metadata(path) {
        Ok(m) if m.is_dir() => {
            std::fs::read_dir(path).with_context(|| {
                format!(
                    "--pod-manifest-path {}: cannot read directory",
                    path.display()
                )
            })?;
        }
        Ok(m) if m.is_file() => {
            std::fs::File::open(path).with_context(|| {
                format!("--pod-manifest-path {}: cannot read file", path.display())
            })?;
        }
        Ok(_) => bail!(
            "--pod-manifest-path {}: neither a directory nor a file",
            path.display()
        ),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            warn!(
                "--pod-manifest-path {}: does not exist yet; watching for it",
                path.display()
            );
        }
        Err(e) => return Err(e).with_context(|| format!("--pod-manifest-path {}", path.display())),
    }
    Ok(())
}

/// Creates `--root-dir` if needed and makes sure tinylet can write there
/// (a read-only filesystem, or a directory it may not write to, is refused
/// here, before any pod is touched) by creating and removing a file in it.
fn check_root_dir(dir: &Path) -> anyhow::Result<()> {
    let shown = dir.display();
    std::fs::create_dir_all(dir).with_context(|| format!("--root-dir {shown}: cannot create"))?;
    let probe = dir.join(format!(".tinylet-write-check-{}", std::process::id()));
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&probe)
        .with_context(|| format!("--root-dir {shown}: not writable"))?;
    std::fs::remove_file(&probe)
        .with_context(|| format!("--root-dir {shown}: cannot remove {}", probe.display()))?;
    // Private to root, as upstream's setupDataDirs makes it, whatever the
    // umask and whoever made it: pods' volumes, tokens among them, live
    // below. A narrower mode an administrator chose is kept. (The root
    // dir itself may be a symlink; it is followed here, as for any flag.)
    let meta = std::fs::metadata(dir).with_context(|| format!("--root-dir {shown}"))?;
    let mode = std::os::unix::fs::PermissionsExt::mode(&meta.permissions()) & 0o7777;
    let private = crate::paths::PRIVATE_DIR_MODE;
    if mode & !private & 0o777 != 0 {
        std::fs::set_permissions(
            dir,
            std::os::unix::fs::PermissionsExt::from_mode(mode & (private | 0o7000)),
        )
        .with_context(|| format!("--root-dir {shown}: cannot make it mode {private:o}"))?;
    }
    crate::paths::ensure_dir(&dir.join("pods"), private)
        .with_context(|| format!("--root-dir {shown}: cannot create its pods directory"))?;
    Ok(())
}

/// The kubelet protects itself from the OOM killer; in a container or
/// without CAP_SYS_RESOURCE that may be refused, which is not fatal.
fn protect_from_oom() {
    if let Err(e) = std::fs::write("/proc/self/oom_score_adj", "-999") {
        info!("cannot set own oom_score_adj: {e} (continuing)");
    }
}

/// Raises the open files limit to `--max-open-files` (capped at the hard
/// limit), as upstream; failing is not fatal, as upstream.
fn raise_open_files(wanted: u64) {
    match crate::rlimit::raise_open_files(wanted) {
        Ok(l) if l.soft < wanted => info!(
            "open files limit: {} (was {}): --max-open-files {wanted} capped at the hard limit",
            l.soft, l.was
        ),
        Ok(l) => info!(
            "open files limit: {} (was {}, hard limit {})",
            l.soft, l.was, l.hard
        ),
        Err(e) => warn!("cannot set the open files limit to {wanted}: {e} (continuing)"),
    }
}

/// Connects to the runtime, retrying with back-off until it answers or a
/// signal arrives. Returns the runtime and its name (`containerd`).
pub(super) fn connect_runtime(
    opts: &Options,
    stop: &Receiver<()>,
) -> anyhow::Result<Option<(RemoteRuntime, String)>> {
    let runtime = RemoteRuntime::new(
        &opts.container_runtime_endpoint,
        opts.runtime_request_timeout,
    )
    .with_context(|| {
        format!(
            "--container-runtime-endpoint {}",
            opts.container_runtime_endpoint
        )
    })?;
    let mut delay = Duration::from_millis(500);
    let started = Instant::now();
    loop {
        match runtime.wait_ready(Duration::from_secs(5)) {
            Ok(v) => {
                info!(
                    "container runtime {} {} (CRI {}) at {}",
                    v.runtime_name,
                    v.runtime_version,
                    v.runtime_api_version,
                    opts.container_runtime_endpoint
                );
                return Ok(Some((runtime, v.runtime_name)));
            }
            Err(e) if opts.runonce && started.elapsed() >= opts.runonce_timeout => {
                bail!(
                    "container runtime not ready within --runonce-timeout {}s: {e}",
                    opts.runonce_timeout.as_secs()
                );
            }
            Err(e) => {
                warn!(
                    "container runtime not ready: {e}; retrying in {:.1}s",
                    delay.as_secs_f32()
                );
                if stop.recv_timeout(delay).is_ok() {
                    return Ok(None);
                }
                delay = (delay * 2).min(Duration::from_secs(30));
            }
        }
    }
}

/// Starts the node API on the listeners the flags ask for (none: `None`).
/// The main port's TLS pair comes from the flags or is made once under
/// `--cert-dir` for the node's name and IPs.
pub(super) fn start_server(
    opts: &Options,
    node: &str,
    state: State,
) -> anyhow::Result<(
    Option<crate::server::Server>,
    Option<Arc<crate::server::tls::ServingCert>>,
)> {
    let listeners = opts.listeners();
    let tls = match listeners.main {
        Some(_) => {
            let ips: Vec<std::net::IpAddr> =
                crate::node::machine::node_addresses(opts.node_ip, node)
                    .unwrap_or_default()
                    .into_iter()
                    .filter_map(|(_, a)| a.parse().ok())
                    .collect();
            let cert_dir = opts.cert_dir();
            let files = opts
                .tls_cert_file
                .as_deref()
                .zip(opts.tls_private_key_file.as_deref());
            let serving = crate::server::tls::Serving {
                files,
                cert_dir: &cert_dir,
                host: node,
                ips: &ips,
            };
            Some(
                crate::server::tls::server_config(
                    &serving,
                    opts.client_ca_file.as_deref(),
                    opts.tls_min_version,
                )
                .map_err(anyhow::Error::msg)?,
            )
        }
        None => None,
    };
    let (tls, current) = match tls {
        Some((config, current)) => (Some(config), Some(current)),
        None => (None, None),
    };
    let server = crate::server::start(opts, tls, state).map_err(anyhow::Error::msg)?;
    for (what, addr) in [
        ("node API (HTTPS)", listeners.main),
        ("read-only API (HTTP)", listeners.read_only),
        ("healthz (HTTP)", listeners.healthz),
    ] {
        if let (Some(addr), Some(_)) = (addr, &server) {
            info!("{what} listening on {addr}");
        }
    }
    Ok((server, current))
}
