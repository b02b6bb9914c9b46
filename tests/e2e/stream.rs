//! End-to-end tests of exec, attach and port-forward through
//! `server::stream::serve` on a real, private containerd: the clients in
//! `support::streams` speak SPDY/3.1 and WebSocket as kubectl (through the
//! apiserver) does, and serve relays them to containerd's streaming server.

use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use tinylet::cri::{RemoteRuntime, RuntimeService};
use tinylet::server::stream::StreamKind;

use crate::e2e::{LONG_RUNNING, NODE, SETTLE};
use crate::support::containerd::{
    wait_until, write_manifest, PrivateContainerd, Tinylet, BUSYBOX_IMAGE,
};
use crate::support::streams::{serve_on_loopback, Spdy, SpdyExec, WebSocket};

/// A static pod `name` with one container `app` running `script`.
fn pod(name: &str, script: &str, extra: &str) -> String {
    format!(
        r#"apiVersion: v1
kind: Pod
metadata:
  name: {name}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: app
    image: {BUSYBOX_IMAGE}
    imagePullPolicy: IfNotPresent
    command: ["sh", "-c", {script:?}]
{extra}"#
    )
}

/// A query value, percent-encoded.
pub(crate) fn enc(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

pub(crate) fn commands(args: &[&str]) -> String {
    args.iter()
        .map(|a| format!("command={}&", enc(a)))
        .collect()
}

/// The exit code an exec's error stream reports: 0 for `Success`, the
/// `ExitCode` cause of a `NonZeroExitCode` failure.
pub(crate) fn exit_code(status: &str) -> i64 {
    let v: Value = serde_json::from_str(status).unwrap_or_else(|e| panic!("{status:?}: {e}"));
    match v["status"].as_str() {
        Some("Success") => 0,
        _ => {
            assert_eq!(v["reason"], "NonZeroExitCode", "{status}");
            let cause = &v["details"]["causes"][0];
            assert_eq!(cause["reason"], "ExitCode", "{status}");
            cause["message"]
                .as_str()
                .and_then(|m| m.parse().ok())
                .unwrap_or(-1)
        }
    }
}

/// A private containerd with tinylet running the given pods, and the CRI
/// client `serve` uses.
fn setup(pods: &[(&str, String)]) -> (PrivateContainerd, Tinylet, Arc<dyn RuntimeService>) {
    let ctd = PrivateContainerd::start();
    let kubelet = Tinylet::start(&ctd, NODE);
    let dir = kubelet.manifest_dir();
    for (name, yaml) in pods {
        write_manifest(&dir, &format!("{name}.yaml"), yaml);
    }
    for (name, _) in pods {
        let full = format!("{name}-{NODE}");
        wait_until(SETTLE, &format!("{full} runs"), || {
            ctd.pod_running(&full, &["app"])
        });
    }
    let rt = RemoteRuntime::new(&ctd.endpoint(), Duration::from_secs(30)).unwrap();
    (ctd, kubelet, Arc::new(rt))
}

/// Exec with stdin and an exit code over SPDY and over WebSocket, exec
/// with a TTY, and an exec in a container that does not exist.
#[test]
fn exec_over_spdy_and_websocket_reaches_the_container() {
    let (_ctd, _kubelet, rt) = setup(&[("sh", pod("sh", LONG_RUNNING, ""))]);
    let addr = serve_on_loopback(StreamKind::Exec, rt).to_string();
    let script = commands(&["sh", "-c", "read x; echo got $x; echo oops >&2; exit 3"]);
    let target = format!("/exec/default/sh-{NODE}/app?{script}input=1&output=1&error=1");

    let mut spdy = SpdyExec::start(&addr, &target, true, true, true, false).unwrap();
    spdy.write_stdin(b"spdy\n", true).unwrap();
    let (out, err, status) = spdy.finish().unwrap();
    assert_eq!(out, "got spdy\n");
    assert_eq!(err, "oops\n");
    assert_eq!(exit_code(&status), 3, "{status}");

    let mut ws = WebSocket::connect(&addr, &target, "v4.channel.k8s.io").unwrap();
    ws.send(0, b"websocket\n").unwrap();
    ws.finish().unwrap();
    assert_eq!(ws.text(1), "got websocket\n");
    assert_eq!(ws.text(2), "oops\n");
    assert_eq!(exit_code(&ws.text(3)), 3, "{}", ws.text(3));

    // A terminal: output on stdout and a resize stream. The apiserver may
    // ask for stderr too; a terminal has none (the runtime refuses both).
    let script = commands(&["sh", "-c", "test -t 1 && stty size"]);
    let target = format!("/exec/default/sh-{NODE}/app?{script}output=1&error=1&tty=1");
    let mut tty = SpdyExec::start(&addr, &target, false, true, false, true).unwrap();
    tty.resize(100, 30).unwrap();
    let (out, _, status) = tty.finish().unwrap();
    assert!(out.ends_with("\r\n"), "a terminal's line end: {out:?}");
    assert_eq!(exit_code(&status), 0, "{status}");

    let target = format!("/exec/default/sh-{NODE}/nope?command=true&output=1");
    let e = SpdyExec::start(&addr, &target, false, true, false, false)
        .err()
        .expect("an exec in a missing container is refused");
    let e = e.to_string();
    assert!(e.contains("HTTP/1.1 404 "), "{e}");
    assert!(e.contains("container not found (\"nope\")"), "{e}");
}

/// Attach to a container's stdin and stdout, and port-forward to a
/// listener in a pod over SPDY and over WebSocket.
#[test]
fn attach_and_port_forward_over_spdy_and_websocket() {
    let nc = "while :; do echo hello-from-nc | nc -l -p 8080; done";
    let (_ctd, _kubelet, rt) = setup(&[
        ("cat", pod("cat", "cat", "    stdin: true\n")),
        ("nc", pod("nc", nc, "")),
    ]);

    let addr = serve_on_loopback(StreamKind::Attach, rt.clone()).to_string();
    let target = format!("/attach/default/cat-{NODE}/app?input=1&output=1");
    let mut attach = SpdyExec::start(&addr, &target, true, true, false, false).unwrap();
    attach.write_stdin(b"meow\n", false).unwrap();
    let stdout = attach.stdout.unwrap();
    let seen = attach
        .conn
        .until(|c| c.text(stdout).contains("meow\n"))
        .unwrap();
    assert!(seen, "attach stdout: {:?}", attach.conn.text(stdout));
    attach.conn.close();

    let addr = serve_on_loopback(StreamKind::PortForward, rt).to_string();
    let mut pf = Spdy::connect(
        &addr,
        &format!("/portForward/default/nc-{NODE}"),
        "portforward.k8s.io",
    )
    .unwrap();
    let headers = |kind| [("streamtype", kind), ("port", "8080"), ("requestid", "0")];
    let _error = pf.open(&headers("error")).unwrap();
    let data = pf.open(&headers("data")).unwrap();
    let seen = pf
        .until(|c| c.text(data).contains("hello-from-nc"))
        .unwrap();
    assert!(seen, "port-forward data: {:?}", pf.text(data));
    pf.close();

    // Over WebSocket the ports are in the query; each channel starts with
    // its port (little-endian), then the data (channel 0) follows. The
    // pod's loop starts a new listener after each connection.
    let target = format!("/portForward/default/nc-{NODE}?port=8080");
    let mut last = String::new();
    for _ in 0..50 {
        let mut ws = WebSocket::connect(&addr, &target, "v4.channel.k8s.io").unwrap();
        let seen = ws.until(|w| w.text(0).contains("hello-from-nc")).unwrap();
        let data = ws.channels.get(&0).cloned().unwrap_or_default();
        ws.close();
        if seen {
            assert_eq!(data[..2], 8080u16.to_le_bytes(), "{data:?}");
            return;
        }
        last = String::from_utf8_lossy(&data).into_owned();
        std::thread::sleep(Duration::from_millis(200));
    }
    panic!("WebSocket port-forward never answered: {last:?}");
}

/// `host:port` and path of a streaming URL.
fn split_url(url: &str) -> (String, String) {
    let rest = url
        .strip_prefix("http://")
        .expect("an http:// streaming URL");
    let i = rest.find('/').unwrap_or(rest.len());
    (rest[..i].to_string(), rest[i..].to_string())
}

/// Port-forwards to `port` and reads until `bytes` arrived; the time
/// taken from the stream's opening, or None when the listener was not
/// there yet (the pod's loop restarts it after each connection).
fn forward(addr: &str, target: &str, port: &str, bytes: usize) -> Option<Duration> {
    let mut pf = Spdy::connect(addr, target, "portforward.k8s.io").unwrap();
    let headers = |kind| [("streamtype", kind), ("port", port), ("requestid", "1")];
    let error = pf.open(&headers("error")).unwrap();
    let data = pf.open(&headers("data")).unwrap();
    let start = std::time::Instant::now();
    pf.until(|c| c.data.get(&data).map_or(0, Vec::len) >= bytes || c.data.contains_key(&error))
        .unwrap();
    let took = start.elapsed();
    let got = pf.data.get(&data).map_or(0, Vec::len);
    pf.close();
    (got >= bytes).then_some(took)
}

/// `forward` to wherever `place` says (a streaming URL serves once, so
/// the direct path needs a new one each time), until it delivers.
fn forward_retrying(
    mut place: impl FnMut() -> (String, String),
    port: &str,
    bytes: usize,
) -> Duration {
    for _ in 0..50 {
        let (addr, target) = place();
        if let Some(took) = forward(&addr, &target, port, bytes) {
            return took;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    panic!("port-forward to port {port} never delivered {bytes} bytes");
}

/// Time from an exec request to its first byte of output, and a bulk
/// port-forward's throughput, through `serve` and straight to the
/// runtime's streaming server (the floor), printed for the bench.
/// `TINYLET_STREAM_BENCH_MIB` sets the port-forward's size (default 16;
/// the bench uses 100). It asserts only that every byte arrives.
#[test]
fn exec_first_byte_and_port_forward_throughput_through_serve_and_directly() {
    use tinylet::cri::api;
    let mib: usize = std::env::var("TINYLET_STREAM_BENCH_MIB")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(16);
    let bytes = mib << 20;
    let bulk = format!("while :; do head -c {bytes} /dev/zero | nc -l -p 8081; done");
    let (_ctd, _kubelet, rt) = setup(&[
        ("sh", pod("sh", LONG_RUNNING, "")),
        ("bulk", pod("bulk", &bulk, "")),
    ]);
    let labels = |pod: &str| {
        std::collections::HashMap::from([
            (
                "io.kubernetes.pod.namespace".to_string(),
                "default".to_string(),
            ),
            (
                "io.kubernetes.pod.name".to_string(),
                format!("{pod}-{NODE}"),
            ),
        ])
    };

    // Exec: request to first byte of stdout.
    let exec_addr = serve_on_loopback(StreamKind::Exec, rt.clone()).to_string();
    let target = format!("/exec/default/sh-{NODE}/app?command=echo&command=hi&output=1");
    let first_byte = |addr: &str, target: &str| {
        let start = std::time::Instant::now();
        let mut e = SpdyExec::start(addr, target, false, true, false, false).unwrap();
        let out = e.stdout.unwrap();
        assert!(e.conn.until(|c| c.data.contains_key(&out)).unwrap());
        let took = start.elapsed();
        assert_eq!(e.finish().unwrap().0, "hi\n");
        took
    };
    let mut filter = api::ContainerFilter::new();
    filter.label_selector = labels("sh");
    let cid = rt.list_containers(Some(filter)).unwrap()[0].id.clone();
    let direct_exec = || {
        let start = std::time::Instant::now();
        let mut req = api::ExecRequest::new();
        req.container_id = cid.clone();
        req.cmd = vec!["echo".into(), "hi".into()];
        req.stdout = true;
        let (host, path) = split_url(&rt.exec(req).unwrap());
        let _ = first_byte(&host, &path);
        start.elapsed()
    };
    let (mut via, mut direct) = (Duration::MAX, Duration::MAX);
    for _ in 0..5 {
        via = via.min(first_byte(&exec_addr, &target));
        direct = direct.min(direct_exec());
    }

    // Port-forward: a bulk copy out of the pod.
    let pf_addr = serve_on_loopback(StreamKind::PortForward, rt.clone()).to_string();
    let pf_target = format!("/portForward/default/bulk-{NODE}");
    let through = forward_retrying(|| (pf_addr.clone(), pf_target.clone()), "8081", bytes);
    let mut filter = api::PodSandboxFilter::new();
    filter.label_selector = labels("bulk");
    let sid = rt.list_pod_sandbox(Some(filter)).unwrap()[0].id.clone();
    let floor = forward_retrying(
        || {
            let mut req = api::PortForwardRequest::new();
            req.pod_sandbox_id = sid.clone();
            split_url(&rt.port_forward(req).unwrap())
        },
        "8081",
        bytes,
    );
    let rate = |d: Duration| mib as f64 / d.as_secs_f64();
    eprintln!(
        "stream bench: exec request to first byte (best of 5): serve {:.1} ms, runtime directly {:.1} ms\n\
         stream bench: port-forward {mib} MiB: serve {:.0} MiB/s, runtime directly {:.0} MiB/s",
        via.as_secs_f64() * 1e3,
        direct.as_secs_f64() * 1e3,
        rate(through),
        rate(floor)
    );
}
