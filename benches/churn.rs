//! The churn load program: static pods created, updated (a spec change that
//! replaces the container, and a metadata-only change), deleted and
//! re-created under the same name through the file source at a fixed rate,
//! against a private containerd and the tinylet binary. It prints a table:
//! the change mix, the time to converge to the final desired set, whether
//! every desired pod runs exactly once with its latest spec and nothing of
//! deleted pods is left, the sync loop's longest turn and the longest pod
//! worker wait (from tinylet's shutdown line), and tinylet's threads, file
//! descriptors and RSS idle before, at their peak, with the final set, and
//! a settle period after every pod went. The churn itself and the checks
//! live in `tests/support/churn.rs`, shared with the CI-sized test
//! `tests/e2e/churn.rs`.
//!
//! It exits non-zero when the promise breaks: no convergence within the
//! bound, a pod twice or a leftover, a pod name running twice at once,
//! threads or fds above the baseline, RSS more than 2 MiB above it, or no
//! clean exit on SIGTERM. Needs root (it runs a private containerd).
//!
//!   cargo bench --bench churn -- [--pods 250] [--rate 20] [--secs 180]
//!       [--settle 60] [--seed 1] [--converge-within 300] [--keep-log PATH]
//!       [--v 2]
//!
//! `TINYLET_E2E_BIN` picks another tinylet binary (default: the one cargo
//! built with the bench, in release). Without `--bench` on the command line
//! (`cargo test --all-targets` runs bench targets that way) it does nothing.

use std::process::ExitCode;
use std::time::{Duration, Instant};

// The test support modules, at the crate root so that `churn`'s
// `super::containerd` resolves as it does under `tests/support`.
#[path = "../tests/support/churn.rs"]
mod churn;
#[path = "../tests/support/containerd.rs"]
mod containerd;

use churn::Plan;
use containerd::{PrivateContainerd, Tinylet};

/// RSS may stay this much above the idle baseline once every pod went.
const RSS_SLACK_KIB: u64 = 2048;

struct Options {
    plan: Plan,
    keep_log: Option<String>,
    /// tinylet's `--v`.
    verbosity: String,
}

fn parse(args: &[String]) -> Result<Options, String> {
    let mut plan = Plan {
        pods: 250,
        rate: 20.0,
        churn: Duration::from_secs(180),
        seed: 1,
        settle: Duration::from_secs(60),
        converge_within: Duration::from_secs(300),
    };
    let mut keep_log = None;
    let mut verbosity = "2".to_string();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut value = |name: &str| -> Result<String, String> {
            it.next()
                .cloned()
                .ok_or_else(|| format!("{name} needs a value"))
        };
        let number = |name: &str, v: String| -> Result<u64, String> {
            v.parse::<u64>().map_err(|e| format!("{name} {v:?}: {e}"))
        };
        match a.as_str() {
            "--bench" => {}
            "--pods" => plan.pods = number(a, value(a)?)? as usize,
            "--rate" => {
                let v = value(a)?;
                plan.rate = v.parse().map_err(|e| format!("--rate {v:?}: {e}"))?;
            }
            "--secs" => plan.churn = Duration::from_secs(number(a, value(a)?)?),
            "--settle" => plan.settle = Duration::from_secs(number(a, value(a)?)?),
            "--seed" => plan.seed = number(a, value(a)?)?,
            "--converge-within" => {
                plan.converge_within = Duration::from_secs(number(a, value(a)?)?)
            }
            "--keep-log" => keep_log = Some(value(a)?),
            "--v" => verbosity = number(a, value(a)?)?.to_string(),
            other => return Err(format!("unknown option {other:?}")),
        }
    }
    if plan.pods == 0 || plan.rate.is_nan() || plan.rate <= 0.0 {
        return Err("--pods and --rate must be above zero".into());
    }
    Ok(Options {
        plan,
        keep_log,
        verbosity,
    })
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if !args.iter().any(|a| a == "--bench") {
        return ExitCode::SUCCESS;
    }
    let o = match parse(&args) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("churn: {e}");
            return ExitCode::from(2);
        }
    };
    let wall = Instant::now();
    let ctd = PrivateContainerd::start();
    let mut tl = Tinylet::start_with(
        &ctd,
        "churn-node",
        &[&["--v", o.verbosity.as_str()], churn::TINYLET_FLAGS].concat(),
    );
    let r = churn::run(&ctd, &mut tl, &o.plan);
    if let Some(path) = &o.keep_log {
        if let Err(e) = std::fs::copy(tl.log_path(), path) {
            eprintln!("churn: copying the tinylet log to {path}: {e}");
        }
    }
    println!(
        "churn: tinylet {}\n{}",
        containerd::tinylet_bin().display(),
        r.table(&o.plan)
    );
    let mut broken = Vec::new();
    if r.converge.is_none() || r.removal.is_none() {
        broken.push("did not converge within the bound".to_string());
    }
    if !r.problems.is_empty() {
        broken.push(format!("{} duplicates or leftovers", r.problems.len()));
    }
    if !r.side_by_side.is_empty() {
        broken.push("a pod name ran twice at once".into());
    }
    if r.removal.is_some() && !r.returned() {
        broken.push("threads or fds above the baseline".into());
    }
    if r.removal.is_some() && r.after.rss_kib > r.baseline.rss_kib + RSS_SLACK_KIB {
        broken.push("RSS more than 2 MiB above the baseline".into());
    }
    if !r.exit_ok {
        broken.push("no clean exit on SIGTERM".into());
    }
    if r.loop_line.is_none() {
        broken.push("no sync loop shutdown line".into());
    }
    println!(
        "churn: {:.0} s wall; {}",
        wall.elapsed().as_secs_f64(),
        if broken.is_empty() {
            "PASS".to_string()
        } else {
            format!("FAIL: {}", broken.join("; "))
        }
    );
    if broken.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
