//! The idle control-plane bytes benchmark (issue 29): what a node with 10
//! running pods costs the link to its apiserver in a day, TLS included,
//! for the default profile and for the low-data profile README.md
//! documents, beside the targets (10 MB and 2 MB a day).
//!
//! Each profile is the real tinylet binary joined, with a client
//! certificate over TLS, to a fake apiserver of its own through a counting
//! relay (`tests/support/relay.rs`) that counts every byte each way, and
//! run by the fake CRI (the runtime plays no part in what the node sends
//! the apiserver, except the images the node status lists). A third node
//! runs the default profile against a server that refuses lease patches,
//! so that it renews by PUT as tinylet did before: the difference is what
//! the merge patch saves. The nodes run side by side. Once every pod runs
//! and a settling time has passed, the bytes and the requests (by kind,
//! from the fake's log) are counted over one window and scaled to a day.
//! The window is long enough for lease renewals and for every watch to end
//! and start again (their timeouts are 5 to 10 minutes); a longer one
//! gives a truer figure. MB here is 10^6 bytes.
//!
//!   cargo bench --bench idle_bytes -- [--pods N] [--window-secs N]
//!                                     [--settle-secs N] [--quick]
//!
//! `--quick` is a 60 s window (no watch re-established: not a figure to
//! judge). Without `--bench` on the command line it does nothing. Needs
//! root (the pods' service account token volumes are tmpfs mounts).

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use serde_json::{json, Value};

// Shared with the tests, which use more of them than this bench does.
#[allow(dead_code)]
#[path = "../tests/support/agent.rs"]
mod agent;
#[path = "../tests/support/fake_apiserver/mod.rs"]
mod fake_apiserver;
#[path = "../tests/support/fake_cri.rs"]
mod fake_cri;
#[allow(dead_code)]
#[path = "../tests/support/relay.rs"]
mod relay;

use agent::{running_containers, Agent};
use fake_apiserver::{FakeApiServer, KubeconfigAuth, RecordedRequest};
use fake_cri::FakeCri;
use relay::{Counts, Relay};

const NODE: &str = "edge-1";
const NODE_USER: &str = "system:node:edge-1";
const NS: &str = "default";
const DAY: f64 = 86_400.0;
const MB: f64 = 1e6;

/// The low-data profile's flags, as README.md documents them.
const LOW_DATA: &[&str] = &[
    "--node-lease-duration-seconds",
    "600",
    "--node-status-report-frequency",
    "1h",
];

struct Options {
    pods: usize,
    window: Duration,
    settle: Duration,
}

fn parse(args: &[String]) -> Result<Options> {
    let mut o = Options {
        pods: 10,
        window: Duration::from_secs(660),
        settle: Duration::from_secs(20),
    };
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut number = || -> Result<u64> {
            let v = it.next().ok_or_else(|| anyhow!("{a} needs a value"))?;
            v.parse()
                .with_context(|| format!("{a} {v:?}: not a number"))
        };
        match a.as_str() {
            "--bench" => {}
            "--quick" => o.window = Duration::from_secs(60),
            "--pods" => o.pods = number()?.max(1) as usize,
            "--window-secs" => o.window = Duration::from_secs(number()?.max(10)),
            "--settle-secs" => o.settle = Duration::from_secs(number()?),
            other => bail!("unknown option {other:?} (see the header of benches/idle_bytes.rs)"),
        }
    }
    Ok(o)
}

/// One node: its fake apiserver, the relay in front of it, its runtime and
/// the agent. The agent is declared first so it is killed first.
struct Node {
    name: &'static str,
    agent: Agent,
    relay: Relay,
    api: FakeApiServer,
    _cri: FakeCri,
    _dir: tempfile::TempDir,
}

/// What one node sent and received in the window.
struct Figures {
    name: &'static str,
    window: Duration,
    bytes: Counts,
    /// By kind: how many, and the bytes of their bodies.
    requests: BTreeMap<String, (usize, usize)>,
}

impl Figures {
    fn per_day(&self) -> f64 {
        self.bytes.total() as f64 * DAY / self.window.as_secs_f64()
    }
}

fn pod(name: &str) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NS, "labels": {"app": "idle-bytes"}},
        "spec": {
            "nodeName": NODE,
            "terminationGracePeriodSeconds": 0,
            "containers": [{
                "name": "app",
                "image": "busybox:latest",
                "imagePullPolicy": "IfNotPresent",
                "command": ["sleep", "100000"],
            }],
        },
    })
}

fn start(name: &'static str, flags: &[&str], refuse_lease_patches: bool) -> Result<Node> {
    let api = FakeApiServer::start_tls();
    if refuse_lease_patches {
        api.fail_next(
            "PATCH",
            "/leases/",
            415,
            "UnsupportedMediaType",
            "the body of the request was in an unknown format",
            usize::MAX,
        );
    }
    let relay = Relay::start(api.addr()).context("starting the relay")?;
    let dir = tempfile::Builder::new().prefix("idle-bytes").tempdir()?;
    let kubeconfig =
        api.write_kubeconfig(dir.path(), NODE_USER, KubeconfigAuth::client_cert_files());
    // The node talks to the relay, which passes the TLS bytes through.
    let text = std::fs::read_to_string(&kubeconfig)?;
    let relayed = text.replace(&api.url(), &format!("https://{}", relay.addr()));
    if relayed == text {
        bail!("the kubeconfig does not name {}", api.url());
    }
    std::fs::write(&kubeconfig, relayed)?;
    let cri = FakeCri::start();
    let kubeconfig = kubeconfig.display().to_string();
    let mut args = vec!["--kubeconfig", kubeconfig.as_str()];
    args.extend_from_slice(flags);
    let agent = Agent::start(&cri.endpoint(), &args);
    Ok(Node {
        name,
        agent,
        relay,
        api,
        _cri: cri,
        _dir: dir,
    })
}

fn wait_until(
    node: &mut Node,
    what: &str,
    limit: Duration,
    mut f: impl FnMut(&Node) -> bool,
) -> Result<()> {
    let end = Instant::now() + limit;
    while !f(node) {
        if !node.agent.running() {
            bail!(
                "{}: tinylet exited while waiting until {what}\n{}",
                node.name,
                node.agent.log()
            );
        }
        if Instant::now() > end {
            bail!(
                "{}: timed out waiting until {what}\n{}",
                node.name,
                node.agent.log()
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok(())
}

fn ready_with_pods(node: &mut Node, pods: usize) -> Result<()> {
    wait_until(node, "the Node is Ready", Duration::from_secs(30), |n| {
        n.api.node(NODE).is_some_and(|n| {
            n["status"]["conditions"].as_array().is_some_and(|cs| {
                cs.iter()
                    .any(|c| c["type"] == "Ready" && c["status"] == "True")
            })
        })
    })?;
    for i in 0..pods {
        node.api.create_pod(pod(&format!("idle-{i}")));
    }
    wait_until(
        node,
        "every pod is Running",
        Duration::from_secs(120),
        |n| {
            (0..pods).all(|i| {
                let name = format!("idle-{i}");
                running_containers(&n._cri, &name) == 1
                    && n.api
                        .pod(NS, &name)
                        .is_some_and(|p| p["status"]["phase"] == "Running")
            })
        },
    )
}

/// The kind of a request, for the counts.
fn kind(r: &RecordedRequest) -> String {
    let watch = r
        .query
        .split('&')
        .any(|kv| kv == "watch=true" || kv == "watch=1");
    let what = if r.path.contains("/leases/") {
        "lease".to_string()
    } else if r.path == format!("/api/v1/nodes/{NODE}/status") {
        "node status".to_string()
    } else if r
        .path
        .starts_with(&format!("/api/v1/namespaces/{NS}/pods/"))
    {
        "pod".to_string()
    } else {
        r.path.clone()
    };
    if watch {
        format!("watch {}", r.path)
    } else {
        format!("{what} {} {}", r.verb, r.status)
    }
}

fn snapshot(node: &Node) -> (Counts, usize) {
    (node.relay.counts(), node.api.requests().len())
}

fn figures(node: &Node, before: (Counts, usize), window: Duration) -> Figures {
    let mut requests: BTreeMap<String, (usize, usize)> = BTreeMap::new();
    for r in node.api.requests().iter().skip(before.1) {
        let e = requests.entry(kind(r)).or_default();
        e.0 += 1;
        e.1 += r.body.len();
    }
    Figures {
        name: node.name,
        window,
        bytes: node.relay.counts().since(&before.0),
        requests,
    }
}

fn report(o: &Options, all: &[Figures]) {
    println!();
    println!(
        "idle control-plane bytes, {} pods, window {} s (scaled to a day; MB = 10^6 bytes)",
        o.pods,
        all.first().map_or(0, |f| f.window.as_secs())
    );
    println!(
        "{:<44} {:>10} {:>10} {:>6} {:>10} {:>8}",
        "profile", "up B", "down B", "conns", "MB/day", "target"
    );
    for f in all {
        let target = match f.name {
            n if n.starts_with("low-data") => "<= 2",
            n if n.starts_with("default (merge") => "<= 10",
            _ => "",
        };
        println!(
            "{:<44} {:>10} {:>10} {:>6} {:>10.2} {:>8}",
            f.name,
            f.bytes.up,
            f.bytes.down,
            f.bytes.connections,
            f.per_day() / MB,
            target
        );
    }
    for f in all {
        println!(
            "\n{}: requests in the window (count, request body bytes)",
            f.name
        );
        for (k, (n, body)) in &f.requests {
            println!("  {n:>5} {body:>8}  {k}");
        }
    }
}

fn run(o: &Options) -> Result<()> {
    let mut nodes = vec![
        start("default (merge-patch renewals)", &[], false)?,
        start("default, renewals by PUT (as before)", &[], true)?,
        start("low-data (lease 600 s, report 1h)", LOW_DATA, false)?,
    ];
    for n in &mut nodes {
        ready_with_pods(n, o.pods)?;
        eprintln!("idle_bytes: {}: {} pods running", n.name, o.pods);
    }
    std::thread::sleep(o.settle);
    let before: Vec<_> = nodes.iter().map(snapshot).collect();
    eprintln!("idle_bytes: counting for {} s", o.window.as_secs());
    let started = Instant::now();
    while started.elapsed() < o.window {
        std::thread::sleep(Duration::from_secs(1));
        for n in &mut nodes {
            if !n.agent.running() {
                bail!("{}: tinylet exited\n{}", n.name, n.agent.log());
            }
        }
    }
    let window = started.elapsed();
    let all: Vec<Figures> = nodes
        .iter()
        .zip(before)
        .map(|(n, b)| figures(n, b, window))
        .collect();
    report(o, &all);
    Ok(())
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if !args.iter().any(|a| a == "--bench") {
        return ExitCode::SUCCESS;
    }
    let o = match parse(&args) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("idle_bytes: {e:#}");
            return ExitCode::FAILURE;
        }
    };
    match run(&o) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("idle_bytes: {e:#}");
            ExitCode::FAILURE
        }
    }
}
