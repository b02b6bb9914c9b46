//! `tinylet status` against a small HTTP server in the test that serves a
//! canned `/pods` PodList as the node's read-only port would, and its
//! fallback when no source answers; then against the real binary running
//! static pods on the fake CRI, from its read-only port and from the
//! runtime.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::process::Command;
use std::sync::{Arc, Mutex};

const BIN: &str = env!("CARGO_BIN_EXE_tinylet");

/// A PodList as the node's `/pods` gives it, with fields the table does not
/// use, and one item of odd shape.
const POD_LIST: &str = r#"{"kind":"PodList","apiVersion":"v1","metadata":{},"items":[
 {"metadata":{"name":"web-edge-1","namespace":"default","uid":"u1",
   "creationTimestamp":"2020-01-01T00:00:00Z",
   "annotations":{"kubernetes.io/config.source":"file","kubernetes.io/config.hash":"u1"}},
  "spec":{"containers":[{"name":"app","image":"busybox"},{"name":"side","image":"nginx"}],
   "restartPolicy":"Always"},
  "status":{"phase":"Running","podIP":"10.88.0.9","conditions":[{"type":"Ready","status":"False"}],
   "containerStatuses":[
    {"name":"app","ready":true,"restartCount":4,"image":"busybox","imageID":"sha256:1",
     "state":{"running":{"startedAt":"2020-01-01T00:00:01Z"}}},
    {"name":"side","ready":false,"restartCount":1,"image":"nginx","imageID":"",
     "state":{"waiting":{"reason":"CrashLoopBackOff","message":"back-off"}}}]}},
 {"metadata":{"name":"lonely","namespace":"kube-system",
   "annotations":{"kubernetes.io/config.source":"api"}},
  "status":{"phase":"Pending"}}
]}"#;

/// Serves `body` with `status` to every connection; returns its port and
/// the request lines it saw.
fn serve(status: &'static str, body: &'static str) -> (u16, Arc<Mutex<Vec<String>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { continue };
            let mut reader = BufReader::new(conn.try_clone().expect("clone"));
            let mut line = String::new();
            let _ = reader.read_line(&mut line);
            log.lock().expect("lock").push(line.trim_end().to_string());
            // The rest of the head.
            loop {
                let mut h = String::new();
                match reader.read_line(&mut h) {
                    Ok(0) | Err(_) => break,
                    Ok(_) if h == "\r\n" => break,
                    Ok(_) => {}
                }
            }
            let _ = write!(
                conn,
                "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    (port, seen)
}

fn status(args: &[&str]) -> (i32, String, String) {
    // No runtime here: the last source fails fast.
    status_at("unix:///nonexistent/cri.sock", args)
}

/// `tinylet status` with `args` and the runtime at `endpoint`: the exit
/// code, stdout and stderr.
fn status_at(endpoint: &str, args: &[&str]) -> (i32, String, String) {
    let out = Command::new(BIN)
        .arg("status")
        .args(args)
        .args(["--container-runtime-endpoint", endpoint])
        .output()
        .expect("run tinylet status");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn words(line: &str) -> Vec<&str> {
    line.split_whitespace().collect()
}

#[test]
fn status_reads_the_read_only_port_and_prints_the_table() {
    let (port, seen) = serve("200 OK", POD_LIST);
    let port = port.to_string();
    let (code, out, err) = status(&["--read-only-port", &port]);
    assert_eq!(code, 0, "{err}");
    assert!(
        err.contains(&format!(
            "from the read-only port, http://127.0.0.1:{port}/pods"
        )),
        "{err}"
    );
    assert_eq!(seen.lock().unwrap()[0], "GET /pods HTTP/1.1");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 3, "{out}");
    assert_eq!(
        words(lines[0]),
        [
            "NAMESPACE",
            "NAME",
            "PHASE",
            "READY",
            "RESTARTS",
            "AGE",
            "IP",
            "SOURCE"
        ]
    );
    let web = words(lines[1]);
    assert_eq!(
        [web[0], web[1], web[2], web[3], web[4], web[6], web[7]],
        [
            "default",
            "web-edge-1",
            "Running",
            "1/2",
            "5",
            "10.88.0.9",
            "file"
        ],
        "{out}"
    );
    // Created in 2020: years old.
    assert!(web[5].contains('y'), "{out}");
    assert_eq!(
        words(lines[2]),
        [
            "kube-system",
            "lonely",
            "Pending",
            "0/0",
            "0",
            "<unknown>",
            "<none>",
            "api"
        ]
    );
    // Columns line up: every cell of a column starts where its header does.
    let col = |l: &str, name: &str| l.find(name).expect(name);
    assert_eq!(col(lines[0], "PHASE"), col(lines[1], "Running"));
    assert_eq!(col(lines[0], "PHASE"), col(lines[2], "Pending"));
    assert_eq!(col(lines[0], "SOURCE"), col(lines[1], "file"));
    assert_eq!(col(lines[0], "SOURCE"), col(lines[2], "api"));

    let (code, out, _) = status(&["--read-only-port", &port, "-o", "wide"]);
    assert_eq!(code, 0);
    let side = out
        .lines()
        .find(|l| l.trim_start().starts_with("side "))
        .expect("a row for container side");
    assert_eq!(
        words(side),
        ["side", "Waiting:", "CrashLoopBackOff", "0/1", "1", "nginx"]
    );

    let (code, out, _) = status(&["--read-only-port", &port, "-o", "json"]);
    assert_eq!(code, 0);
    let list: serde_json::Value = serde_json::from_str(&out).expect("-o json is JSON");
    assert_eq!(list["kind"], "PodList");
    assert_eq!(list["items"][0]["metadata"]["name"], "web-edge-1");
    assert_eq!(list["items"][0]["status"]["conditions"][0]["type"], "Ready");
}

#[test]
fn status_without_any_source_answering_names_each_and_exits_1() {
    // A port nothing listens on.
    let closed = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = closed.local_addr().expect("addr").port().to_string();
    drop(closed);
    let (code, out, err) = status(&["--read-only-port", &port]);
    assert_eq!(code, 1, "{err}");
    assert!(out.is_empty(), "{out}");
    assert!(err.contains("the read-only port:"), "{err}");
    assert!(err.contains(&format!("127.0.0.1:{port}")), "{err}");
    assert!(
        err.contains("the container runtime unix:///nonexistent/cri.sock"),
        "{err}"
    );

    // An answer that is not a PodList, or an error status, is no answer.
    for (code_line, body) in [("200 OK", "[1, 2]"), ("500 Internal Server Error", "{}")] {
        let (port, _) = serve(code_line, body);
        let (code, _, err) = status(&["--read-only-port", &port.to_string()]);
        assert_eq!(code, 1, "{err}");
        assert!(err.contains("the read-only port: GET "), "{err}");
        assert!(err.contains("/pods"), "{err}");
    }
}

#[test]
fn status_watch_asks_again_and_redraws_until_interrupted() {
    let (port, seen) = serve("200 OK", POD_LIST);
    let child = Command::new(BIN)
        .args(["status", "--watch", "--read-only-port", &port.to_string()])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("run tinylet status --watch");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while seen.lock().unwrap().len() < 2 {
        assert!(
            std::time::Instant::now() < deadline,
            "--watch asked only once in 30s"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    // Ctrl-C.
    let pid = child.id().to_string();
    let ok = Command::new("kill")
        .args(["-INT", &pid])
        .status()
        .expect("kill");
    assert!(ok.success());
    let out = child.wait_with_output().expect("wait");
    let out = String::from_utf8_lossy(&out.stdout);
    let headers = out.lines().filter(|l| l.starts_with("NAMESPACE ")).count();
    assert!(headers >= 2, "one table per turn:\n{out}");
}

/// The main port: TLS on 127.0.0.1 with the node's self-signed serving
/// certificate (`<root-dir>/pki/kubelet.crt`), client certificates from a
/// CA required. `tinylet status --kubeconfig` authenticates with the
/// kubeconfig's client certificate and trusts that serving certificate.
mod main_port {
    use std::io::{BufRead, BufReader, Write};
    use std::net::TcpListener;
    use std::path::Path;
    use std::process::Command;
    use std::sync::{Arc, Mutex};

    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};

    fn openssl(dir: &Path, args: &[&str]) {
        let out = Command::new("openssl")
            .args(args)
            .current_dir(dir)
            .output()
            .expect("run openssl");
        assert!(
            out.status.success(),
            "openssl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    const EC: [&str; 5] = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
    ];

    /// ca.crt/key (clients), client.crt/key (signed by it), and the node's
    /// self-signed pki/kubelet.crt/key (SAN 127.0.0.1).
    fn make_pki(dir: &Path) {
        std::fs::create_dir_all(dir.join("pki")).expect("pki dir");
        let mut args = vec!["req", "-x509", "-days", "2", "-subj", "/CN=client-ca"];
        args.extend(EC);
        args.extend([
            "-keyout",
            "ca.key",
            "-out",
            "ca.crt",
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign,cRLSign",
        ]);
        openssl(dir, &args);
        std::fs::write(
            dir.join("client.ext"),
            "extendedKeyUsage=clientAuth\nbasicConstraints=CA:FALSE\n",
        )
        .expect("ext");
        let mut args = vec![
            "req",
            "-subj",
            "/O=system:nodes/CN=system:node:edge-1",
            "-keyout",
            "client.key",
            "-out",
            "client.csr",
        ];
        args.extend(EC);
        openssl(dir, &args);
        openssl(
            dir,
            &[
                "x509",
                "-req",
                "-in",
                "client.csr",
                "-CA",
                "ca.crt",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-days",
                "2",
                "-out",
                "client.crt",
                "-extfile",
                "client.ext",
            ],
        );
        let mut args = vec!["req", "-x509", "-days", "2", "-subj", "/CN=edge-1@1"];
        args.extend(EC);
        args.extend([
            "-keyout",
            "pki/kubelet.key",
            "-out",
            "pki/kubelet.crt",
            "-addext",
            "subjectAltName=DNS:edge-1,DNS:localhost,IP:127.0.0.1",
            "-addext",
            "basicConstraints=critical,CA:FALSE",
            "-addext",
            "extendedKeyUsage=serverAuth",
        ]);
        openssl(dir, &args);
    }

    /// Serves POD_LIST over TLS; records the client certificate count of
    /// each request.
    fn serve(dir: &Path) -> (u16, Arc<Mutex<Vec<usize>>>) {
        let chain: Vec<_> = CertificateDer::pem_file_iter(dir.join("pki/kubelet.crt"))
            .expect("cert")
            .collect::<Result<_, _>>()
            .expect("cert");
        let key = PrivateKeyDer::from_pem_file(dir.join("pki/kubelet.key")).expect("key");
        let mut roots = rustls::RootCertStore::empty();
        roots
            .add(CertificateDer::from_pem_file(dir.join("ca.crt")).expect("ca"))
            .expect("ca");
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
            Arc::new(roots),
            provider.clone(),
        )
        .build()
        .expect("verifier");
        let config = Arc::new(
            rustls::ServerConfig::builder_with_provider(provider)
                .with_safe_default_protocol_versions()
                .expect("versions")
                .with_client_cert_verifier(verifier)
                .with_single_cert(chain, key)
                .expect("server config"),
        );
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let log = seen.clone();
        std::thread::spawn(move || {
            for sock in listener.incoming() {
                let Ok(sock) = sock else { continue };
                let Ok(conn) = rustls::ServerConnection::new(config.clone()) else {
                    continue;
                };
                let mut tls = rustls::StreamOwned::new(conn, sock);
                let mut line = String::new();
                let mut reader = BufReader::new(&mut tls);
                if reader.read_line(&mut line).is_err() {
                    continue;
                }
                loop {
                    let mut h = String::new();
                    match reader.read_line(&mut h) {
                        Ok(0) | Err(_) => break,
                        Ok(_) if h == "\r\n" => break,
                        Ok(_) => {}
                    }
                }
                let certs = tls.conn.peer_certificates().map_or(0, <[_]>::len);
                log.lock().expect("lock").push(certs);
                let body = super::POD_LIST;
                let _ = write!(
                    tls,
                    "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
                tls.conn.send_close_notify();
                let _ = tls.flush();
            }
        });
        (port, seen)
    }

    #[test]
    fn status_asks_the_main_port_with_the_kubeconfig_client_certificate() {
        let dir = tempfile::tempdir().expect("temp dir");
        let d = dir.path();
        make_pki(d);
        let (port, seen) = serve(d);
        // The kubeconfig's server is the apiserver's; status asks 127.0.0.1.
        let kubeconfig = d.join("kubelet.conf");
        std::fs::write(
            &kubeconfig,
            "apiVersion: v1\nkind: Config\ncurrent-context: c\ncontexts:\n- name: c\n  context: {cluster: k, user: u}\nclusters:\n- name: k\n  cluster:\n    server: https://192.0.2.1:6443\n    certificate-authority: ca.crt\nusers:\n- name: u\n  user:\n    client-certificate: client.crt\n    client-key: client.key\n",
        )
        .expect("kubeconfig");
        let port = port.to_string();
        let run = |extra: &[&str]| {
            let out = Command::new(super::BIN)
                .args(["status", "--port", &port, "--kubeconfig"])
                .arg(&kubeconfig)
                .args([
                    "--container-runtime-endpoint",
                    "unix:///nonexistent/cri.sock",
                ])
                .args(extra)
                .output()
                .expect("run tinylet status");
            (
                out.status.code().unwrap_or(-1),
                String::from_utf8_lossy(&out.stdout).into_owned(),
                String::from_utf8_lossy(&out.stderr).into_owned(),
            )
        };
        let root = d.display().to_string();
        let (code, out, err) = run(&["--root-dir", &root]);
        assert_eq!(code, 0, "{err}");
        assert!(
            err.contains(&format!(
                "from the main port, https://127.0.0.1:{port}/pods"
            )),
            "{err}"
        );
        assert!(
            out.lines()
                .any(|l| l.starts_with("default ") && l.contains("web-edge-1")),
            "{out}"
        );
        assert_eq!(
            seen.lock().unwrap().as_slice(),
            [1],
            "one request, with a client certificate"
        );

        // --tls-cert-file names the certificate instead of the root dir's.
        let cert = d.join("pki/kubelet.crt").display().to_string();
        let (code, _, err) = run(&["--root-dir", "/nonexistent", "--tls-cert-file", &cert]);
        assert_eq!(code, 0, "{err}");

        // Another certificate than the node's is not trusted.
        let (code, _, err) = run(&["--tls-cert-file", &d.join("ca.crt").display().to_string()]);
        assert_eq!(code, 1, "{err}");
        assert!(err.contains("the main port:"), "{err}");
    }
}

/// The real binary with two static pods on the fake CRI, and `tinylet
/// status` asking it: from the read-only port when one is given, else (or
/// when it does not answer) from the runtime itself.
mod live_node {
    use serde_json::Value;

    use super::{status_at, words};
    use crate::server::free_port;
    use crate::support::agent::{running_containers, Agent};
    use crate::support::containerd::write_manifest;
    use crate::support::fake_cri::FakeCri;

    /// The static pods: (namespace, manifest name); each runs as
    /// `<name>-edge-1`.
    const PODS: [(&str, &str); 2] = [("default", "web"), ("infra", "cache")];

    fn manifest(ns: &str, name: &str) -> String {
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  namespace: {ns}\nspec:\n  \
             containers:\n  - name: app\n    image: busybox:latest\n    \
             imagePullPolicy: IfNotPresent\n    command: [sleep, \"1000\"]\n"
        )
    }

    /// The agent with `extra` flags, once both static pods run.
    fn node_with_pods(cri: &FakeCri, extra: &[&str]) -> Agent {
        let mut agent = Agent::start(&cri.endpoint(), extra);
        for (ns, name) in PODS {
            write_manifest(
                &agent.manifests(),
                &format!("{name}.yaml"),
                &manifest(ns, name),
            );
        }
        agent.wait("both static pods run", || {
            PODS.iter()
                .all(|(_, name)| running_containers(cri, &format!("{name}-edge-1")) == 1)
        });
        agent
    }

    /// The pod IP the fake runtime gave the sandbox of `pod`.
    fn sandbox_ip(cri: &FakeCri, pod: &str) -> String {
        cri.sandboxes()
            .iter()
            .find(|s| s.metadata.as_ref().is_some_and(|m| m.name == pod))
            .and_then(|s| s.network.as_ref().map(|n| n.ip.clone()))
            .unwrap_or_else(|| panic!("no sandbox for {pod}"))
    }

    /// The table's rows (without the header) as words, by pod name; every
    /// row has the eight columns.
    fn rows(out: &str) -> Vec<Vec<String>> {
        let mut lines = out.lines();
        let header = lines.next().map(words).unwrap_or_default();
        assert_eq!(
            header,
            [
                "NAMESPACE",
                "NAME",
                "PHASE",
                "READY",
                "RESTARTS",
                "AGE",
                "IP",
                "SOURCE"
            ],
            "{out}"
        );
        let mut rows: Vec<Vec<String>> = lines
            .map(|l| words(l).into_iter().map(str::to_string).collect())
            .collect();
        rows.sort_by(|a, b| a.get(1).cmp(&b.get(1)));
        for r in &rows {
            assert_eq!(r.len(), 8, "{out}");
        }
        rows
    }

    /// Both pods, Running with their one container ready, no restarts,
    /// the runtime's IPs, from the manifest dir; ages as kubectl prints
    /// them.
    fn assert_rows(cri: &FakeCri, out: &str) {
        let rows = rows(out);
        assert_eq!(rows.len(), 2, "{out}");
        // Sorted by name: cache, then web.
        for (row, (ns, name)) in rows.iter().zip([PODS[1], PODS[0]]) {
            let pod = format!("{name}-edge-1");
            let ip = sandbox_ip(cri, &pod);
            assert_eq!(
                [&row[0], &row[1], &row[2], &row[3], &row[4], &row[6], &row[7]],
                [ns, pod.as_str(), "Running", "1/1", "0", ip.as_str(), "file"],
                "{out}"
            );
            let age = &row[5];
            assert!(
                age.ends_with('s') || age.ends_with('m'),
                "a pod started seconds ago: {age}\n{out}"
            );
        }
    }

    /// How many rows of a table say Running with every container ready.
    fn running_and_ready(out: &str) -> usize {
        out.lines()
            .skip(1)
            .map(words)
            .filter(|w| {
                w.get(2) == Some(&"Running")
                    && w.get(3)
                        .and_then(|r| r.split_once('/'))
                        .is_some_and(|(ready, all)| ready == all && ready != "0")
            })
            .count()
    }

    /// `-o json` is a PodList with both pods, Running.
    fn assert_json(out: &str) {
        let list: Value = serde_json::from_str(out).expect("-o json is JSON");
        assert_eq!(list["kind"], "PodList", "{out}");
        let mut pods: Vec<(String, String, String)> = list["items"]
            .as_array()
            .expect("items")
            .iter()
            .map(|p| {
                let s = |v: &Value| v.as_str().unwrap_or_default().to_string();
                (
                    s(&p["metadata"]["namespace"]),
                    s(&p["metadata"]["name"]),
                    s(&p["status"]["phase"]),
                )
            })
            .collect();
        pods.sort();
        let want = |ns: &str, name: &str| {
            (
                ns.to_string(),
                format!("{name}-edge-1"),
                "Running".to_string(),
            )
        };
        assert_eq!(
            pods,
            [want("default", "web"), want("infra", "cache")],
            "{out}"
        );
        for p in list["items"].as_array().into_iter().flatten() {
            assert_eq!(p["status"]["containerStatuses"][0]["ready"], true, "{p}");
            assert_eq!(
                p["metadata"]["annotations"]["kubernetes.io/config.source"], "file",
                "{p}"
            );
        }
    }

    #[test]
    fn status_reads_a_running_nodes_read_only_port() {
        let cri = FakeCri::start();
        let ro = free_port().to_string();
        let mut agent = node_with_pods(&cri, &["--read-only-port", &ro, "--address", "127.0.0.1"]);
        // The node reports a pod Running and ready only after its sync
        // and a status update: ask until it does.
        let ask = |args: &[&str]| status_at("unix:///nonexistent/cri.sock", args);
        let mut last = (0, String::new(), String::new());
        agent.wait("tinylet status shows both pods Running and ready", || {
            last = ask(&["--read-only-port", &ro]);
            last.0 == 0 && running_and_ready(&last.1) == 2
        });
        let (_, out, err) = last;
        assert_rows(&cri, &out);
        assert_eq!(
            err.trim_end(),
            format!("tinylet status: from the read-only port, http://127.0.0.1:{ro}/pods"),
            "only the source is named"
        );

        let (code, out, err) = ask(&["--read-only-port", &ro, "-o", "json"]);
        assert_eq!(code, 0, "{err}");
        assert!(err.contains(&format!("127.0.0.1:{ro}/pods")), "{err}");
        assert_json(&out);
    }

    #[test]
    fn status_without_the_read_only_port_asks_the_runtime() {
        let cri = FakeCri::start();
        let _agent = node_with_pods(&cri, &[]);
        let endpoint = cri.endpoint();

        // No read-only port given: straight to the runtime.
        let (code, out, err) = status_at(&endpoint, &[]);
        assert_eq!(code, 0, "{err}");
        assert_eq!(
            err.trim_end(),
            format!("tinylet status: from the container runtime, {endpoint}")
        );
        assert_rows(&cri, &out);

        // A read-only port that nothing serves: named, then the runtime.
        let closed = free_port().to_string();
        let (code, out, err) = status_at(&endpoint, &["--read-only-port", &closed, "-o", "json"]);
        assert_eq!(code, 0, "{err}");
        let lines: Vec<&str> = err.lines().collect();
        assert_eq!(lines.len(), 2, "{err}");
        assert!(
            lines[0].starts_with("tinylet status: the read-only port: ")
                && lines[0].contains(&format!("127.0.0.1:{closed}"))
                && lines[0].ends_with("; trying the next source"),
            "{err}"
        );
        assert_eq!(
            lines[1],
            format!("tinylet status: from the container runtime, {endpoint}")
        );
        assert_json(&out);
    }
}
