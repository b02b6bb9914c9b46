//! The prober thread with the fake runtime: exec probes through ExecSync,
//! results reaching the sync loop's channel, and the kills SyncPod makes of
//! a container whose liveness probe failed.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::cri::Code;
use k8s_openapi::api::core::v1::{ExecAction, Pod, Probe};

use super::*;
use crate::runtime::fake::{test_manager, test_pod, wait_for};

fn exec_probe(cmd: &str, period: i32, failure: i32) -> Probe {
    Probe {
        exec: Some(ExecAction {
            command: Some(vec![cmd.into()]),
        }),
        period_seconds: Some(period),
        failure_threshold: Some(failure),
        ..Default::default()
    }
}

fn probed_pod(uid: &str, liveness: Option<Probe>, readiness: Option<Probe>) -> Arc<Pod> {
    let mut p = test_pod(uid, "web");
    let c = &mut p.spec.as_mut().unwrap().containers[0];
    c.liveness_probe = liveness;
    c.readiness_probe = readiness;
    Arc::new(p)
}

/// Runs the pod on the fake and returns its runtime status.
fn run_pod(rm: &RuntimeManager, pod: &Pod) -> PodStatus {
    let st = rm.get_pod_status(pod_uid(pod), "web", "default").unwrap();
    rm.sync_pod(pod, &st, &mut Default::default())
        .result
        .unwrap();
    rm.get_pod_status(pod_uid(pod), "web", "default").unwrap()
}

#[test]
fn exec_liveness_failure_reaches_the_sync_loop_and_sync_pod_restarts() {
    let (fake, rm) = test_manager("prober-live");
    let results = Arc::new(ProbeResults::default());
    let rm = Arc::new(
        Arc::try_unwrap(rm)
            .ok()
            .unwrap()
            .with_probe_results(results.clone()),
    );
    let (tx, rx) = bounded(8);
    let prober = Prober::start(
        rm.clone(),
        results.clone(),
        EventRecorder::disabled(),
        None,
        tx,
        Limits::default(),
    )
    .unwrap();
    let pod = probed_pod(
        "u1",
        Some(exec_probe("healthy", 1, 1)),
        Some(exec_probe("ready", 1, 1)),
    );
    let status = run_pod(&rm, &pod);
    let id = status.latest("app").unwrap().id.clone();
    prober.handle().update_pod(&pod, &status, None);

    // Readiness: Failure at first, then Success after one passing run.
    assert_eq!(rx.recv_timeout(Duration::from_secs(5)).unwrap(), "u1");
    wait_for("ready", || {
        results.get(&id, ProbeKind::Readiness) == Some(ProbeResult::Success)
    });
    // The first ticks are spread over the first period after the start.
    wait_for("liveness ran", || {
        results.get(&id, ProbeKind::Liveness) == Some(ProbeResult::Success)
    });
    wait_for("both probes ran", || fake.count("ExecSync") >= 2);

    // The liveness command starts failing: the result turns, the sync loop
    // hears of the pod, and the next SyncPod replaces the container.
    fake.script_exec("healthy", Ok((1, "not healthy".into())));
    wait_for("liveness failure", || {
        results.get(&id, ProbeKind::Liveness) == Some(ProbeResult::Failure)
    });
    let deadline = Instant::now() + Duration::from_secs(5);
    while rx.recv_timeout(Duration::from_millis(50)).ok().as_deref() != Some("u1") {
        assert!(Instant::now() < deadline, "no update for u1");
    }
    let status = rm.get_pod_status("u1", "web", "default").unwrap();
    rm.sync_pod(&pod, &status, &mut Default::default())
        .result
        .unwrap();
    let after = rm.get_pod_status("u1", "web", "default").unwrap();
    let newest = after.latest("app").unwrap();
    assert_ne!(newest.id, id);
    assert_eq!(newest.state, ContainerState::Running);
    assert_eq!(newest.restart_count, 1);
    assert_eq!(fake.count("StopContainer"), 1);

    // Removing the pod drops its results.
    prober.handle().remove_pod(&pod);
    wait_for("results dropped", || results.is_empty());
}

#[test]
fn an_exec_timeout_is_a_failure_and_other_errors_are_thrown_away() {
    let (fake, rm) = test_manager("prober-timeout");
    let pod = probed_pod("u2", Some(exec_probe("slow", 1, 1)), None);
    let status = run_pod(&rm, &pod);
    let id = status.latest("app").unwrap().id.clone();
    let runner = run::Runner::new(rm.clone(), EventRecorder::disabled());
    let job = Job {
        probe: 0,
        kind: ProbeKind::Liveness,
        action: spec::Action::Exec(vec!["slow".into()]),
        timeout: Duration::from_secs(1),
        pod: pod.clone(),
        container: "app".into(),
        container_id: id,
        pod_ip: None,
    };
    fake.script_exec("slow", Err(Code::DeadlineExceeded));
    assert_eq!(runner.run(&job), Outcome::Failure);
    fake.script_exec("slow", Err(Code::Internal));
    fake.clear_calls();
    assert_eq!(runner.run(&job), Outcome::Error);
    assert_eq!(fake.count("ExecSync"), 3, "an error is tried three times");
    fake.script_exec("slow", Ok((0, String::new())));
    assert_eq!(runner.run(&job), Outcome::Success);
}

#[test]
fn failed_probe_kills_follow_the_restart_policy() {
    let (_fake, rm) = test_manager("prober-kills");
    let mut p = (*probed_pod("u3", Some(exec_probe("x", 1, 1)), None)).clone();
    let c = &mut p.spec.as_mut().unwrap().containers[0];
    c.liveness_probe
        .as_mut()
        .unwrap()
        .termination_grace_period_seconds = Some(7);
    let pod = Arc::new(p);
    let status = run_pod(&rm, &pod);
    let id = status.latest("app").unwrap().id.clone();
    let results = ProbeResults::default();
    assert!(failed_probe_kills(&pod, &status, &results).is_empty());
    results.set_for_test(&id, ProbeKind::Liveness, ProbeResult::Failure);
    assert_eq!(
        failed_probe_kills(&pod, &status, &results),
        vec![ProbeKill {
            index: Some(0),
            id: id.clone(),
            name: "app".into(),
            message: "Container app failed liveness probe, will be restarted".into(),
            restart: true,
            grace: Some(7),
        }]
    );
    let mut never = (*pod).clone();
    never.spec.as_mut().unwrap().restart_policy = Some("Never".into());
    let kills = failed_probe_kills(&never, &status, &results);
    assert_eq!(kills[0].message, "Container app failed liveness probe");
    assert!(!kills[0].restart);
    // A startup failure counts when liveness stands.
    let results = ProbeResults::default();
    results.set_for_test(&id, ProbeKind::Startup, ProbeResult::Failure);
    assert_eq!(
        failed_probe_kills(&pod, &status, &results)[0].message,
        "Container app failed startup probe, will be restarted"
    );
}

#[test]
fn the_pod_ip_is_the_sandbox_ip_or_the_host_ip_under_host_networking() {
    let pod = probed_pod("u4", Some(exec_probe("x", 1, 1)), None);
    let status = PodStatus {
        ips: vec!["10.88.0.7".into()],
        ..Default::default()
    };
    assert_eq!(
        pod_input(&pod, &status, Some("192.168.1.2"))
            .pod_ip
            .as_deref(),
        Some("10.88.0.7")
    );
    let mut host = (*pod).clone();
    host.spec.as_mut().unwrap().host_network = Some(true);
    let host = Arc::new(host);
    let none = PodStatus::default();
    assert_eq!(
        pod_input(&host, &none, Some("192.168.1.2"))
            .pod_ip
            .as_deref(),
        Some("192.168.1.2")
    );
    assert_eq!(
        pod_input(&host, &none, None).pod_ip.as_deref(),
        Some("127.0.0.1")
    );
}

#[test]
fn status_started_and_ready_follow_the_probe_results() {
    use crate::status::generate::{generate_pod_status, StatusContext};
    let (_fake, rm) = test_manager("prober-status");
    let mut p = (*probed_pod("u5", None, Some(exec_probe("ready", 1, 1)))).clone();
    p.spec.as_mut().unwrap().containers[0].startup_probe = Some(exec_probe("started", 1, 1));
    let pod = Arc::new(p);
    let status = run_pod(&rm, &pod);
    let id = status.latest("app").unwrap().id.clone();
    let results = ProbeResults::default();
    let reasons = Default::default();
    let generate = |results: Option<&ProbeResults>| {
        let ctx = StatusContext {
            host_ip: None,
            runtime_name: "containerd",
            waiting_reasons: &reasons,
            now: k8s_openapi::jiff::Timestamp::now(),
            probes: results,
        };
        let s = generate_pod_status(&pod, &status, None, &ctx);
        let c = &s.container_statuses.as_ref().unwrap()[0];
        let cond = |t: &str| {
            s.conditions
                .iter()
                .flatten()
                .find(|c| c.type_ == t)
                .map(|c| c.status.clone())
                .unwrap()
        };
        (c.started, c.ready, cond("ContainersReady"), cond("Ready"))
    };
    let not_ready = (Some(false), false, "False".to_string(), "False".to_string());
    assert_eq!(generate(None), not_ready);
    assert_eq!(generate(Some(&results)), not_ready);
    // Started, but the readiness probe has not passed yet.
    results.set_for_test(&id, ProbeKind::Startup, ProbeResult::Success);
    results.set_for_test(&id, ProbeKind::Readiness, ProbeResult::Failure);
    assert_eq!(
        generate(Some(&results)),
        (Some(true), false, "False".to_string(), "False".to_string())
    );
    results.set_for_test(&id, ProbeKind::Readiness, ProbeResult::Success);
    assert_eq!(
        generate(Some(&results)),
        (Some(true), true, "True".to_string(), "True".to_string())
    );
    // A readiness success does not count before the startup probe passed.
    results.set_for_test(&id, ProbeKind::Startup, ProbeResult::Unknown);
    assert_eq!(generate(Some(&results)), not_ready);
}

#[test]
fn sidecar_probes_run_gate_the_next_init_container_and_restart_it() {
    let (fake, rm) = test_manager("prober-side");
    let results = Arc::new(ProbeResults::default());
    let rm = Arc::new(
        Arc::try_unwrap(rm)
            .ok()
            .unwrap()
            .with_probe_results(results.clone())
            .with_startup_results(results.clone()),
    );
    let (tx, _rx) = bounded(64);
    let prober = Prober::start(
        rm.clone(),
        results.clone(),
        EventRecorder::disabled(),
        None,
        tx,
        Limits::default(),
    )
    .unwrap();
    let mut p = test_pod("u2", "web");
    let spec = p.spec.as_mut().unwrap();
    let mut side = spec.containers[0].clone();
    side.name = "side".into();
    side.restart_policy = Some("Always".into());
    side.startup_probe = Some(exec_probe("side-started", 1, 1));
    side.liveness_probe = Some(exec_probe("side-alive", 1, 1));
    spec.init_containers = Some(vec![side]);
    let pod = Arc::new(p);
    let has = super::worker::has_probes(&pod);
    assert!(has, "a sidecar's probes count");

    // The sidecar runs; the app waits for its startup probe.
    let status = run_pod(&rm, &pod);
    let side_id = status.latest("side").unwrap().id.clone();
    assert!(status.latest("app").is_none());
    prober.handle().update_pod(&pod, &status, None);
    wait_for("the sidecar's startup probe passed", || {
        results.get(&side_id, ProbeKind::Startup) == Some(ProbeResult::Success)
    });
    let status = run_pod(&rm, &pod);
    assert!(status.latest("app").is_some(), "the app starts after it");
    prober.handle().update_pod(&pod, &status, None);

    // Its liveness probe fails: SyncPod stops it, and it starts again.
    fake.script_exec("side-alive", Ok((1, "dead".into())));
    wait_for("the sidecar's liveness failure", || {
        results.get(&side_id, ProbeKind::Liveness) == Some(ProbeResult::Failure)
    });
    let status = rm.get_pod_status("u2", "web", "default").unwrap();
    rm.sync_pod(&pod, &status, &mut Default::default())
        .result
        .unwrap();
    let status = rm.get_pod_status("u2", "web", "default").unwrap();
    rm.sync_pod(&pod, &status, &mut Default::default())
        .result
        .unwrap();
    let after = rm.get_pod_status("u2", "web", "default").unwrap();
    let side = after.latest("side").unwrap();
    assert_ne!(side.id, side_id, "the sidecar was replaced");
    assert_eq!(side.state, ContainerState::Running);
    prober.handle().remove_pod(&pod);
}

#[test]
fn a_readiness_change_goes_to_the_status_manager_and_not_the_sync_loop() {
    use crate::status::manager::{StatusInputs, StatusReporter};
    let (_fake, rm) = test_manager("prober-direct");
    let results = Arc::new(ProbeResults::default());
    let reporter = StatusReporter::standalone();
    let (tx, rx) = bounded(8);
    let prober = Prober::start(
        rm.clone(),
        results.clone(),
        EventRecorder::disabled(),
        Some(Box::new(reporter.clone())),
        tx,
        Limits::default(),
    )
    .unwrap();
    let pod = probed_pod("u3", None, Some(exec_probe("ready", 1, 1)));
    let status = run_pod(&rm, &pod);
    // What the pod's worker reports after its sync: running, not ready.
    let inputs = StatusInputs {
        runtime: status.clone(),
        waiting_reasons: Default::default(),
        host_ip: None,
        runtime_name: "containerd".into(),
        failed: None,
    };
    let first = reporter.report(&pod, inputs, Some(&results), true);
    assert_eq!(first.phase.as_deref(), Some("Running"));
    prober.handle().update_pod(&pod, &status, None);

    let ready = || {
        let s = reporter.status("u3").unwrap();
        let c = &s.container_statuses.as_ref().unwrap()[0];
        let cond = |t: &str| {
            s.conditions
                .iter()
                .flatten()
                .find(|c| c.type_ == t)
                .map(|c| c.status.clone())
        };
        (c.ready, cond("ContainersReady"), cond("Ready"))
    };
    wait_for("ready in the pod's status", || {
        ready() == (true, Some("True".into()), Some("True".into()))
    });
    // No sync was asked for: the readiness probe's results went straight
    // to the status manager.
    assert!(rx.try_recv().is_err());
    prober.handle().remove_pod(&pod);
}

/// A pod whose 100 exec probes (50 containers, liveness and readiness,
/// timeout one hour) never answer beside a pod whose liveness probe fails:
/// the hog has two runs out and no more, the second pod's probes still run
/// each period and its liveness failure reaches the sync loop; once the
/// hung runs end and the pods go, the runners end too.
#[test]
fn hanging_probes_of_one_pod_do_not_starve_another_pods_probes() {
    let (fake, rm) = test_manager("prober-hog");
    let results = Arc::new(ProbeResults::default());
    let (tx, rx) = bounded(64);
    let prober = Prober::start(
        rm.clone(),
        results.clone(),
        EventRecorder::disabled(),
        None,
        tx,
        Limits {
            idle: Duration::from_millis(300),
            ..Limits::default()
        },
    )
    .unwrap();
    let gate = fake.hang_exec("hang");
    let mut hang = exec_probe("hang", 1, 1);
    hang.timeout_seconds = Some(3600);
    let mut hog = test_pod("u-hog", "hog");
    let spec = hog.spec.as_mut().unwrap();
    let app = spec.containers[0].clone();
    spec.containers = (0..50)
        .map(|i| {
            let mut c = app.clone();
            c.name = format!("c{i}");
            c.liveness_probe = Some(hang.clone());
            c.readiness_probe = Some(hang.clone());
            c
        })
        .collect();
    let hog = Arc::new(hog);
    let st = rm.get_pod_status("u-hog", "hog", "default").unwrap();
    rm.sync_pod(&hog, &st, &mut Default::default())
        .result
        .unwrap();
    let st = rm.get_pod_status("u-hog", "hog", "default").unwrap();
    prober.handle().update_pod(&hog, &st, None);
    let hung = || {
        fake.execs()
            .iter()
            .filter(|(_, cmd)| cmd[0] == "hang")
            .count()
    };
    wait_for("the hog's probes hang", || hung() >= 1);

    let victim = probed_pod(
        "u-victim",
        Some(exec_probe("alive", 1, 1)),
        Some(exec_probe("ready", 1, 1)),
    );
    let status = run_pod(&rm, &victim);
    let id = status.latest("app").unwrap().id.clone();
    fake.script_exec("alive", Ok((1, "dead".into())));
    prober.handle().update_pod(&victim, &status, None);
    // Generous bounds: with period 1 s these take about 2 s; before, they
    // never came while the hog's runs held every runner.
    let runs = |cmd: &str| fake.execs().iter().filter(|(_, c)| c[0] == cmd).count();
    let deadline = Instant::now() + Duration::from_secs(10);
    while runs("ready") < 3 {
        assert!(
            Instant::now() < deadline,
            "the victim's readiness probe ran {} times in 10 s; the hog's {} runs hang",
            runs("ready"),
            hung()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(
        results.get(&id, ProbeKind::Liveness),
        Some(ProbeResult::Failure),
        "the victim's liveness probe ran and failed"
    );
    let deadline = Instant::now() + Duration::from_secs(5);
    while rx.recv_timeout(Duration::from_millis(50)).ok().as_deref() != Some("u-victim") {
        assert!(Instant::now() < deadline, "no update for the victim");
    }
    // The hog waits for itself: two of its runs are out, the rest queued.
    assert_eq!(hung(), 2, "runs of the hog's hanging probes");
    assert!(prober.runners() <= 4, "{} runners", prober.runners());
    prober.handle().remove_pod(&hog);
    prober.handle().remove_pod(&victim);
    wait_for("the pods' results dropped", || results.is_empty());
    drop(gate);
    wait_for("the idle runners ended", || prober.runners() == 0);
    assert_eq!(hung(), 2, "the hog's queued runs went with it");
}

/// A run that panics counts as errored; its runner and its probe carry on.
#[test]
fn a_panicking_run_leaves_the_runner_and_the_probe_running() {
    let (fake, rm) = test_manager("prober-panic");
    let results = Arc::new(ProbeResults::default());
    let (tx, _rx) = bounded(8);
    let prober = Prober::start(
        rm.clone(),
        results.clone(),
        EventRecorder::disabled(),
        None,
        tx,
        Limits {
            base: 1,
            max: 1,
            ..Limits::default()
        },
    )
    .unwrap();
    let pod = probed_pod("u-panic", None, Some(exec_probe("ready", 1, 1)));
    let status = run_pod(&rm, &pod);
    let id = status.latest("app").unwrap().id.clone();
    fake.panic_next("ExecSync", 1);
    prober.handle().update_pod(&pod, &status, None);
    wait_for("the probe ran again on the one runner", || {
        results.get(&id, ProbeKind::Readiness) == Some(ProbeResult::Success)
    });
    assert_eq!(prober.runners(), 1);
    prober.handle().remove_pod(&pod);
}
