//! The `tinylet` binary: flags, logging and signals; the threads are the
//! library's [`Agent`].

use std::path::Path;
use std::process::ExitCode;

use anyhow::Context;
use crossbeam_channel::{bounded, Receiver};
use log::{error, info, warn};

use tinylet::agent::Agent;
use tinylet::options::{parse_args, usage, Command};
use tinylet::thread::spawn_named;

/// Whether this process was started through a file named `kubelet` (the
/// package's link to tinylet, run by kubeadm and the `kubelet` unit).
fn invoked_as_kubelet() -> bool {
    std::env::args_os()
        .next()
        .and_then(|a| Path::new(&a).file_name().map(|n| n == "kubelet"))
        .unwrap_or(false)
}

fn main() -> ExitCode {
    // The Kubernetes version to report, before anything can print or send
    // it: `--version` included, as kubeadm's preflight reads it.
    let from_env = std::env::var(tinylet::version::KUBELET_VERSION_VAR).ok();
    let defaults = Path::new(tinylet::version::DEFAULTS_FILE);
    match tinylet::version::resolve_kubelet(from_env, defaults) {
        Ok(v) => tinylet::version::set_kubelet(v),
        Err(e) => {
            eprintln!("tinylet: {e}");
            return ExitCode::from(2);
        }
    }
    let opts = match parse_args(std::env::args().skip(1)) {
        Ok(Command::Run(o)) => *o,
        Ok(Command::Status(o)) => return tinylet::status_cmd::main(&o),
        Ok(Command::StatusHelp) => {
            return tinylet::version::print_stdout(tinylet::options::STATUS_USAGE)
        }
        Ok(Command::Help) => return tinylet::version::print_stdout(&usage()),
        Ok(Command::Version) => {
            // Run as `kubelet` (the package's link, which kubeadm runs), the
            // one line kubeadm parses; as `tinylet`, the build, then that.
            let mut text = String::new();
            if !invoked_as_kubelet() {
                text = format!("{}\n", tinylet::version::long());
            }
            text.push_str(&tinylet::version::kubernetes_line());
            text.push('\n');
            return tinylet::version::print_stdout(&text);
        }
        Err(e) => {
            eprintln!("tinylet: {e}\nRun 'tinylet --help' for the flags.");
            return ExitCode::from(2);
        }
    };
    tinylet::malloc::reexec_with_tunables();
    init_logging(opts.verbosity);
    tinylet::fault::init();
    match Agent::new(opts).run(watch_signals) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            error!("{e:#}");
            ExitCode::FAILURE
        }
    }
}

fn init_logging(verbosity: u8) {
    let level = match verbosity {
        0..=3 => log::LevelFilter::Info,
        4..=5 => log::LevelFilter::Debug,
        _ => log::LevelFilter::Trace,
    };
    env_logger::Builder::new()
        .filter_level(level)
        // Keep gRPC's and the HTTP client's own chatter out unless asked for.
        .filter_module("grpcio", log::LevelFilter::Warn)
        .filter_module("ureq", log::LevelFilter::Warn)
        .filter_module("ureq_proto", log::LevelFilter::Warn)
        .filter_module("rustls", log::LevelFilter::Warn)
        .parse_env("RUST_LOG")
        .format_timestamp_millis()
        .init();
}

/// SIGTERM and SIGINT stop the agent; a second one exits at once.
fn watch_signals() -> anyhow::Result<Receiver<()>> {
    use signal_hook::consts::{SIGINT, SIGTERM};
    let mut signals = signal_hook::iterator::Signals::new([SIGTERM, SIGINT])
        .context("installing signal handlers")?;
    let (tx, rx) = bounded(1);
    spawn_named("signals", move || {
        let mut seen = 0;
        for sig in signals.forever() {
            seen += 1;
            if seen > 1 {
                warn!("second signal {sig}: exiting now");
                std::process::exit(1);
            }
            info!("signal {sig}: shutting down (containers keep running)");
            let _ = tx.try_send(());
        }
    })
    .context("starting the signal thread")?
    .detach();
    Ok(rx)
}
