//! The watch multiplexer against the test server: the reflector's protocol
//! for one object, many watches on one thread, stops, deadlines, TLS.

use std::sync::atomic::Ordering;
use std::sync::mpsc;

use serde_json::json;

use super::*;
use crate::kube::client::tests::options;
use crate::kube::testserver::{End, Recorded, Reply, TestServer};
use crate::kube::KubeConfig;

const CMS: &str = "/api/v1/namespaces/ns/configmaps";

fn quick() -> Timing {
    Timing {
        backoff_start: Duration::from_millis(20),
        idle_margin: Duration::from_millis(300),
        idle_exit: Duration::from_millis(300),
        watch_min_secs: 1,
        watch_spread_secs: 1,
    }
}

fn mux_for(url: String) -> WatchMux {
    let config = KubeConfig {
        server: url,
        ..KubeConfig::default()
    };
    let client = Client::new(&config, options()).unwrap();
    let mut mux = WatchMux::new(client).unwrap();
    mux.timing = quick();
    mux
}

fn cm(name: &str, rv: &str, v: &str) -> Value {
    json!({"kind": "ConfigMap", "apiVersion": "v1",
           "metadata": {"name": name, "namespace": "ns", "uid": format!("u-{name}"), "resourceVersion": rv},
           "data": {"k": v}})
}

fn list_of(rv: &str, items: Vec<Value>) -> Reply {
    Reply::json(
        200,
        json!({"kind": "ConfigMapList", "apiVersion": "v1", "metadata": {"resourceVersion": rv}, "items": items})
            .to_string(),
    )
}

fn event(kind: &str, obj: Value) -> Vec<u8> {
    let mut line = json!({"type": kind, "object": obj})
        .to_string()
        .into_bytes();
    line.push(b'\n');
    line
}

/// A sink that sends what it gets, as "name=value" or "absent".
fn sink(tx: mpsc::Sender<String>) -> ObjectSink {
    Box::new(move |obj: Option<Value>| {
        let text = match obj {
            Some(o) => format!(
                "{}={}",
                o["metadata"]["name"].as_str().unwrap_or("?"),
                o["data"]["k"].as_str().unwrap_or("?")
            ),
            None => "absent".into(),
        };
        let _ = tx.send(text);
    })
}

fn recv(rx: &mpsc::Receiver<String>) -> String {
    rx.recv_timeout(Duration::from_secs(10))
        .expect("the sink got nothing within 10 s")
}

fn is_watch(r: &Recorded) -> bool {
    r.target.contains("watch=true")
}

#[test]
fn lists_then_watches_and_hands_on_every_change() {
    let server = TestServer::start(|r| {
        if !is_watch(r) {
            return list_of("5", vec![cm("a", "5", "v1")]);
        }
        if r.target.contains("resourceVersion=5&") {
            Reply::Chunked {
                status: 200,
                chunks: vec![
                    event("MODIFIED", cm("a", "6", "v2")),
                    event(
                        "BOOKMARK",
                        json!({"kind": "ConfigMap", "metadata": {"resourceVersion": "9"}}),
                    ),
                    event("DELETED", cm("a", "7", "v2")),
                ],
                end: End::Clean,
            }
        } else {
            Reply::Chunked {
                status: 200,
                chunks: vec![],
                end: End::Silent,
            }
        }
    });
    let mux = mux_for(server.url());
    let (tx, rx) = mpsc::channel();
    let _w = mux.watch(CMS, "a", sink(tx)).unwrap();
    assert_eq!(recv(&rx), "a=v1");
    assert_eq!(recv(&rx), "a=v2");
    assert_eq!(recv(&rx), "absent");
    // The clean end is followed by a watch from the last version at once.
    let deadline = Instant::now() + Duration::from_secs(10);
    while server.targets().len() < 3 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    let t = server.targets();
    assert_eq!(
        t[0],
        format!("{CMS}?fieldSelector=metadata.name%3Da&resourceVersion=0")
    );
    assert!(
        t[1].starts_with(&format!(
            "{CMS}?fieldSelector=metadata.name%3Da&resourceVersion=5&allowWatchBookmarks=true&timeoutSeconds=1&watch=true"
        )),
        "{t:?}"
    );
    assert!(t[2].contains("resourceVersion=7&"), "{t:?}");
    // The list and the watches went on one connection.
    let reqs = server.requests();
    assert!(reqs.iter().all(|r| r.conn == reqs[0].conn), "{reqs:?}");
    assert_eq!(reqs[0].header("accept"), Some("application/json"));
}

#[test]
fn an_expired_version_relists_from_etcd_and_an_absent_object_is_none() {
    let server = TestServer::start(|r| {
        if !is_watch(r) {
            return list_of("5", vec![]);
        }
        Reply::Chunked {
            status: 200,
            chunks: vec![event(
                "ERROR",
                json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Expired", "code": 410, "message": "too old resource version: 5 (7)"}),
            )],
            end: End::Silent,
        }
    });
    let mux = mux_for(server.url());
    let (tx, rx) = mpsc::channel();
    let _w = mux.watch(CMS, "gone", sink(tx)).unwrap();
    assert_eq!(recv(&rx), "absent");
    assert_eq!(recv(&rx), "absent");
    let t = server.targets();
    assert!(t[0].ends_with("&resourceVersion=0"), "{t:?}");
    assert!(is_watch(&server.requests()[1]));
    assert_eq!(t[2], format!("{CMS}?fieldSelector=metadata.name%3Dgone"));
}

#[test]
fn many_watches_share_one_thread_and_a_stopped_one_closes_its_connection() {
    let server = TestServer::start(|r| {
        if !is_watch(r) {
            let name = r
                .target
                .split("metadata.name%3D")
                .nth(1)
                .and_then(|s| s.split('&').next())
                .unwrap_or("")
                .to_string();
            return list_of("5", vec![cm(&name, "5", "v1")]);
        }
        Reply::Chunked {
            status: 200,
            chunks: vec![],
            end: End::Silent,
        }
    });
    let mux = mux_for(server.url());
    let (tx, rx) = mpsc::channel();
    let watches: Vec<ObjectWatch> = (0..40)
        .map(|i| {
            mux.watch(CMS, &format!("cm-{i}"), sink(tx.clone()))
                .unwrap()
        })
        .collect();
    let mut got: Vec<String> = (0..40).map(|_| recv(&rx)).collect();
    got.sort();
    let mut want: Vec<String> = (0..40).map(|i| format!("cm-{i}=v1")).collect();
    want.sort();
    assert_eq!(got, want);
    assert_eq!(mux.started.load(Ordering::Relaxed), 1);
    // All forty are watching, each on its own connection.
    let deadline = Instant::now() + Duration::from_secs(10);
    while server.requests().iter().filter(|r| is_watch(r)).count() < 40 {
        assert!(Instant::now() < deadline, "not all watches started");
        std::thread::sleep(Duration::from_millis(10));
    }
    drop(watches);
    // With no watch left the thread ends, and a new watch starts it again.
    let deadline = Instant::now() + Duration::from_secs(10);
    while mux.running() {
        assert!(Instant::now() < deadline, "the thread did not end");
        std::thread::sleep(Duration::from_millis(20));
    }
    let _w = mux.watch(CMS, "again", sink(tx)).unwrap();
    assert_eq!(recv(&rx), "again=v1");
    assert_eq!(mux.started.load(Ordering::Relaxed), 2);
}

#[test]
fn a_silent_watch_is_dropped_after_its_timeout_and_watched_again() {
    let server = TestServer::start(|r| {
        if !is_watch(r) {
            return list_of("5", vec![cm("a", "5", "v1")]);
        }
        Reply::Chunked {
            status: 200,
            chunks: vec![],
            end: End::Silent,
        }
    });
    let mux = mux_for(server.url());
    let (tx, rx) = mpsc::channel();
    let _w = mux.watch(CMS, "a", sink(tx)).unwrap();
    assert_eq!(recv(&rx), "a=v1");
    // timeoutSeconds=1 plus the 300 ms margin, then a back-off of ~20 ms.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let reqs = server.requests();
        let watches: Vec<&Recorded> = reqs.iter().filter(|r| is_watch(r)).collect();
        if watches.len() >= 2 {
            assert_ne!(
                watches[0].conn, watches[1].conn,
                "a dead connection was reused"
            );
            assert!(watches[1].target.contains("resourceVersion=5&"));
            break;
        }
        assert!(Instant::now() < deadline, "no second watch: {reqs:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn errors_back_off_and_a_garbled_stream_is_watched_again_from_the_last_version() {
    let server = TestServer::start(|r| {
        if !is_watch(r) {
            return list_of("5", vec![cm("a", "5", "v1")]);
        }
        if r.target.contains("resourceVersion=5&") {
            let mut chunks = vec![event("MODIFIED", cm("a", "6", "v2"))];
            chunks.push(b"{not json\n".to_vec());
            return Reply::Chunked {
                status: 200,
                chunks,
                end: End::Silent,
            };
        }
        Reply::json(
            500,
            json!({"kind": "Status", "status": "Failure", "code": 500, "message": "etcd"})
                .to_string(),
        )
    });
    let mux = mux_for(server.url());
    let (tx, rx) = mpsc::channel();
    let _w = mux.watch(CMS, "a", sink(tx)).unwrap();
    assert_eq!(recv(&rx), "a=v1");
    assert_eq!(recv(&rx), "a=v2");
    // Three failures that are not the network's in a row: a quorum relist.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let t = server.targets();
        if let Some(i) = t.iter().rposition(|t| t.ends_with("metadata.name%3Da")) {
            let after_garbage: Vec<&String> = t[2..i].iter().collect();
            assert!(
                after_garbage
                    .iter()
                    .all(|t| t.contains("resourceVersion=6&")),
                "{t:?}"
            );
            assert!(after_garbage.len() >= 2, "{t:?}");
            break;
        }
        assert!(Instant::now() < deadline, "no relist: {t:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn an_event_over_the_cap_is_skipped_and_a_deletion_over_it_still_counts() {
    let big = "x".repeat(super::super::watch::MAX_EVENT + 10);
    let server = TestServer::start(move |r| {
        if !is_watch(r) {
            return list_of("5", vec![cm("a", "5", "v1")]);
        }
        if r.target.contains("resourceVersion=5&") {
            Reply::Chunked {
                status: 200,
                chunks: vec![
                    event("MODIFIED", cm("a", "6", &big)),
                    event("MODIFIED", cm("a", "7", "v3")),
                    event("DELETED", cm("a", "8", &big)),
                ],
                end: End::Silent,
            }
        } else {
            Reply::Chunked {
                status: 200,
                chunks: vec![],
                end: End::Silent,
            }
        }
    });
    let mux = mux_for(server.url());
    let (tx, rx) = mpsc::channel();
    let _w = mux.watch(CMS, "a", sink(tx)).unwrap();
    assert_eq!(recv(&rx), "a=v1");
    assert_eq!(recv(&rx), "a=v3");
    assert_eq!(recv(&rx), "absent");
}

#[test]
fn over_tls_with_a_client_certificate_as_the_kubeconfig_says() {
    use crate::kube::client::tests::tls::{Setup, CLIENT_FILES};
    let s = Setup::with(|r| {
        if !is_watch(r) {
            return list_of("5", vec![cm("a", "5", "tls")]);
        }
        Reply::Chunked {
            status: 200,
            chunks: vec![event("MODIFIED", cm("a", "6", "tls2"))],
            end: End::Silent,
        }
    });
    let client = s.client(&s.ca_data(), CLIENT_FILES);
    let mut mux = WatchMux::new(client).unwrap();
    mux.timing = quick();
    let (tx, rx) = mpsc::channel();
    let _w = mux.watch(CMS, "a", sink(tx)).unwrap();
    assert_eq!(recv(&rx), "a=tls");
    assert_eq!(recv(&rx), "a=tls2");

    // Without the CA the handshake fails and nothing reaches the server.
    let client = s.client("", CLIENT_FILES);
    let mut mux = WatchMux::new(client).unwrap();
    mux.timing = quick();
    let (tx, rx) = mpsc::channel();
    let before = s.server.requests().len();
    let _w = mux.watch(CMS, "b", sink(tx)).unwrap();
    assert!(rx.recv_timeout(Duration::from_millis(500)).is_err());
    assert_eq!(s.server.requests().len(), before);
}

#[test]
fn closing_all_connections_drops_the_watches_connections() {
    let server = TestServer::start(|r| {
        if !is_watch(r) {
            return list_of("5", vec![cm("a", "5", "v1")]);
        }
        Reply::Chunked {
            status: 200,
            chunks: vec![],
            end: End::Silent,
        }
    });
    let config = KubeConfig {
        server: server.url(),
        ..KubeConfig::default()
    };
    let client = Client::new(&config, options()).unwrap();
    let mut mux = WatchMux::new(client.clone()).unwrap();
    mux.timing = quick();
    mux.timing.watch_min_secs = 600;
    let (tx, rx) = mpsc::channel();
    let _w = mux.watch(CMS, "a", sink(tx)).unwrap();
    assert_eq!(recv(&rx), "a=v1");
    let watching = |n: usize| {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let reqs = server.requests();
            let w: Vec<usize> = reqs
                .iter()
                .filter(|r| is_watch(r))
                .map(|r| r.conn)
                .collect();
            if w.len() >= n {
                return w;
            }
            assert!(Instant::now() < deadline, "{reqs:?}");
            std::thread::sleep(Duration::from_millis(10));
        }
    };
    watching(1);
    client.close_all_connections();
    let w = watching(2);
    assert_ne!(w[0], w[1]);
}

#[test]
fn a_401_rereads_the_token_file_and_asks_again() {
    let server = TestServer::start(|r| {
        if r.header("authorization") != Some("Bearer new") {
            return Reply::json(
                401,
                json!({"kind": "Status", "status": "Failure", "code": 401, "reason": "Unauthorized"})
                    .to_string(),
            );
        }
        if !is_watch(r) {
            return list_of("5", vec![cm("a", "5", "v1")]);
        }
        Reply::Chunked {
            status: 200,
            chunks: vec![],
            end: End::Silent,
        }
    });
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("token");
    std::fs::write(&file, "new\n").unwrap();
    let config = KubeConfig {
        server: server.url(),
        token: Some("old".into()),
        token_file: Some(file),
        ..KubeConfig::default()
    };
    let mut mux = WatchMux::new(Client::new(&config, options()).unwrap()).unwrap();
    mux.timing = quick();
    let (tx, rx) = mpsc::channel();
    let _w = mux.watch(CMS, "a", sink(tx)).unwrap();
    assert_eq!(recv(&rx), "a=v1");
    let auth: Vec<Option<String>> = server
        .requests()
        .iter()
        .take(2)
        .map(|r| r.header("authorization").map(str::to_string))
        .collect();
    assert_eq!(
        auth,
        [
            Some("Bearer old".to_string()),
            Some("Bearer new".to_string())
        ]
    );
}

#[test]
fn a_panicking_sink_is_caught_and_its_watch_lists_again() {
    let server = TestServer::start(|r| {
        if !is_watch(r) {
            return list_of("5", vec![cm("a", "5", "v1")]);
        }
        Reply::Chunked {
            status: 200,
            chunks: vec![],
            end: End::Silent,
        }
    });
    let mux = mux_for(server.url());
    let (tx, rx) = mpsc::channel();
    let mut calls = 0;
    let _w = mux
        .watch(
            CMS,
            "a",
            Box::new(move |obj: Option<Value>| {
                calls += 1;
                assert!(calls > 1, "a sink that panics once");
                let _ = tx.send(format!("{}", obj.is_some()));
            }),
        )
        .unwrap();
    assert_eq!(recv(&rx), "true");
    assert!(mux.running());
    let t = server.targets();
    assert!(t.len() >= 2, "{t:?}");
    assert!(t[0].ends_with("&resourceVersion=0"), "{t:?}");
    assert_eq!(
        t[1],
        format!("{CMS}?fieldSelector=metadata.name%3Da"),
        "a quorum relist"
    );
}
