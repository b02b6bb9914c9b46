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
fn enc(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

fn commands(args: &[&str]) -> String {
    args.iter()
        .map(|a| format!("command={}&", enc(a)))
        .collect()
}

/// The exit code an exec's error stream reports: 0 for `Success`, the
/// `ExitCode` cause of a `NonZeroExitCode` failure.
fn exit_code(status: &str) -> i64 {
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

    // A terminal: output on stdout, no stderr stream, and a resize stream.
    let script = commands(&["sh", "-c", "test -t 1 && stty size"]);
    let target = format!("/exec/default/sh-{NODE}/app?{script}output=1&tty=1");
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
/// listener in a pod, both over SPDY.
#[test]
fn attach_and_port_forward_over_spdy() {
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
}
