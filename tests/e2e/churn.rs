//! Pod churn, CI-sized, on a real containerd: 40 static pods created,
//! updated (spec and metadata), deleted and re-created at 10 changes a
//! second for 30 s (`support::churn` has the mix). Afterwards the runtime
//! holds exactly the final desired set (one sandbox per pod with its UID,
//! one running container with the latest spec, nothing of deleted pods), no
//! pod name ever ran twice at once, and once every pod went, tinylet's
//! threads and file descriptors are back to their idle baseline. Memory and
//! times are printed, not asserted: `benches/churn.rs` is the full-size run
//! that judges them.

use std::time::{Duration, Instant};

use crate::support::churn::{self, LoopLine, Plan};
use crate::support::containerd::{scaled, PrivateContainerd, Tinylet};

#[test]
fn churned_pods_converge_exactly_once_and_threads_and_fds_return() {
    let wall = Instant::now();
    let ctd = PrivateContainerd::start();
    let mut tl = Tinylet::start_with(&ctd, "churn-ci", churn::TINYLET_FLAGS);
    let plan = Plan {
        pods: 40,
        rate: 10.0,
        churn: Duration::from_secs(30),
        seed: 10,
        settle: Duration::from_secs(10),
        converge_within: scaled(Duration::from_secs(120)),
    };
    let r = churn::run(&ctd, &mut tl, &plan);
    let table = r.table(&plan);
    eprintln!(
        "churn (CI size), {:.0} s wall:\n{table}",
        wall.elapsed().as_secs_f64()
    );
    assert!(
        r.converge.is_some() && r.removal.is_some() && r.problems.is_empty(),
        "did not converge to the final desired set:\n{table}"
    );
    assert!(r.side_by_side.is_empty(), "a pod name ran twice:\n{table}");
    // Each kind of change happened.
    for kind in [
        "create",
        "update spec",
        "update metadata",
        "delete",
        "re-create, same content",
        "re-create, new content",
    ] {
        assert!(
            r.changes.get(kind).is_some_and(|n| *n > 0),
            "no {kind}:\n{table}"
        );
    }
    // One worker thread per desired pod while the final set runs.
    assert!(
        r.with_final_set.threads >= r.baseline.threads + r.desired_at_end,
        "{table}"
    );
    assert!(r.returned(), "threads or fds above the baseline:\n{table}");
    assert!(r.exit_ok, "no clean exit on SIGTERM:\n{table}");
    let line = r.loop_line.as_ref().expect("the sync loop's shutdown line");
    assert!(line.turns > 0 && line.longest_wait_ms.is_some(), "{table}");
    // A generous no-stall bound: the loop only dispatches.
    assert!(
        Duration::from_millis(line.longest_turn_ms) < scaled(Duration::from_secs(5)),
        "the sync loop stalled:\n{table}"
    );
}

#[test]
fn the_shutdown_line_parses() {
    let l = LoopLine::parse(
        "x\n[2026-01-01T00:00:00Z INFO  tinylet::kubelet] sync loop: 1234 turns, \
             longest 56 ms (config Add, 3 pods); longest pod worker wait 789 ms (default/web-n)\n",
    )
    .unwrap();
    assert_eq!(l.turns, 1234);
    assert_eq!(l.longest_turn_ms, 56);
    assert_eq!(l.longest_turn_kind, "config Add, 3 pods");
    assert_eq!(l.longest_wait_ms, Some(789));
    assert_eq!(l.longest_wait_pod, "default/web-n");
    let none =
        LoopLine::parse("sync loop: 0 turns, longest 0 ms; longest pod worker wait none").unwrap();
    assert_eq!(none.longest_wait_ms, None);
    assert_eq!(none.longest_turn_kind, "");
}
