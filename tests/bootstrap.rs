//! TLS bootstrap against the fake apiserver, acting as the csrapproving and
//! csrsigning controllers: a node with only a bootstrap token asks for its
//! client certificate, waits for it, writes `--kubeconfig` and joins with
//! it; a denied request is asked again with a new key; a certificate that
//! has expired is replaced through the bootstrap credentials; with
//! `--rotate-certificates` a short-lived certificate is renewed with the
//! node's own credentials before it ends, without a pod restarted or a
//! watch listed again.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant, SystemTime};

use base64::Engine as _;
use serde_json::Value;

use crate::support::agent::Agent;
use crate::support::fake_apiserver::FakeApiServer;
use crate::support::fake_cri::FakeCri;

const NODE: &str = "edge-1";

struct Joining {
    agent: Agent,
    api: FakeApiServer,
    cri: FakeCri,
    dir: tempfile::TempDir,
}

impl Joining {
    fn kubeconfig(&self) -> PathBuf {
        self.dir.path().join("kubelet.conf")
    }
    fn pki(&self) -> PathBuf {
        self.dir.path().join("pki")
    }
}

/// An agent started as kubeadm's unit starts the kubelet: a bootstrap
/// kubeconfig, a `--kubeconfig` path that may not exist yet, a cert dir.
/// `before` prepares the directory first.
fn join(before: impl FnOnce(&FakeApiServer, &Path)) -> Joining {
    join_with(before, &[])
}

fn join_with(before: impl FnOnce(&FakeApiServer, &Path), extra: &[&str]) -> Joining {
    let api = FakeApiServer::start_tls();
    let cri = FakeCri::start();
    let dir = tempfile::Builder::new()
        .prefix("tinylet-bootstrap")
        .tempdir()
        .expect("temp dir");
    before(&api, dir.path());
    let boot = api.bootstrap_kubeconfig(dir.path(), "abcdef");
    let kubeconfig = dir.path().join("kubelet.conf");
    let pki = dir.path().join("pki");
    let (boot, kubeconfig, pki) = (
        boot.display().to_string(),
        kubeconfig.display().to_string(),
        pki.display().to_string(),
    );
    let mut flags = vec![
        "--bootstrap-kubeconfig",
        &boot,
        "--kubeconfig",
        &kubeconfig,
        "--cert-dir",
        &pki,
        "--node-status-update-frequency",
        "1s",
    ];
    flags.extend_from_slice(extra);
    let agent = Agent::start(&cri.endpoint(), &flags);
    Joining {
        agent,
        api,
        cri,
        dir,
    }
}

fn wait_csr(j: &mut Joining, n: usize) -> Value {
    let api = &j.api;
    j.agent.wait(&format!("certificate request #{n}"), || {
        api.csrs().len() >= n
    });
    j.api.csrs()[n - 1].clone()
}

fn name(csr: &Value) -> String {
    csr["metadata"]["name"].as_str().unwrap_or("").to_string()
}

/// openssl's reading of a CSR object's request.
fn request_text(csr: &Value) -> String {
    let pem = base64::engine::general_purpose::STANDARD
        .decode(csr["spec"]["request"].as_str().unwrap_or(""))
        .expect("spec.request is base64");
    let dir = tempfile::tempdir().unwrap();
    fs::write(dir.path().join("r.pem"), &pem).unwrap();
    let out = Command::new("openssl")
        .args(["req", "-noout", "-text", "-verify", "-in"])
        .arg(dir.path().join("r.pem"))
        .output()
        .expect("run openssl");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // OpenSSL 3.0 writes `O = x`, 3.5 (Debian 13) `O=x`.
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
    .replace(" = ", "=")
}

fn wait_ready(j: &mut Joining) -> Value {
    let api = &j.api;
    j.agent.wait("the Node is Ready", || {
        api.node(NODE).is_some_and(|n| {
            n["status"]["conditions"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|c| c["type"] == "Ready" && c["status"] == "True")
        })
    });
    j.api.node(NODE).unwrap()
}

#[test]
fn a_node_with_a_bootstrap_token_gets_its_certificate_and_joins_with_it() {
    let mut j = join(|_, _| {});
    let csr = wait_csr(&mut j, 1);

    // The request, field by field, as the csrapproving controller checks it.
    assert!(name(&csr).starts_with("node-csr-"), "{csr:#}");
    assert_eq!(
        csr["spec"]["signerName"], "kubernetes.io/kube-apiserver-client-kubelet",
        "{csr:#}"
    );
    assert_eq!(
        csr["spec"]["usages"],
        serde_json::json!(["digital signature", "key encipherment", "client auth"]),
        "{csr:#}"
    );
    assert_eq!(
        csr["spec"]["username"], "system:bootstrap:abcdef",
        "{csr:#}"
    );
    assert_eq!(csr["apiVersion"], "certificates.k8s.io/v1", "{csr:#}");
    let text = request_text(&csr);
    assert!(text.contains("verify OK"), "{text}");
    assert!(
        text.contains("Subject: O=system:nodes, CN=system:node:edge-1"),
        "{text}"
    );
    assert!(
        text.contains("id-ecPublicKey") && text.contains("prime256v1"),
        "{text}"
    );
    assert!(!text.contains("Alternative Name"), "{text}");

    // Nothing happens as the node before the certificate is there.
    std::thread::sleep(std::time::Duration::from_millis(500));
    assert!(j.api.node(NODE).is_none());
    assert!(!j.kubeconfig().exists());
    assert!(j.pki().join("kubelet-client.key.tmp").exists());

    assert!(j.api.approve_csr(&name(&csr), 2));
    wait_ready(&mut j);
    // Registered with the issued certificate, as the node itself.
    let creates: Vec<_> = j
        .api
        .requests()
        .into_iter()
        .filter(|r| r.verb == "POST" && r.path == "/api/v1/nodes")
        .collect();
    assert_eq!(creates.len(), 1, "{creates:?}");
    assert_eq!(creates[0].user, "system:node:edge-1");
    assert_eq!(creates[0].status, 201);

    // The files kubeadm and operators look for.
    let current = j.pki().join("kubelet-client-current.pem");
    let target = fs::read_link(&current).expect("kubelet-client-current.pem is a link");
    assert!(
        target.to_string_lossy().starts_with("kubelet-client-2"),
        "{target:?}"
    );
    let both = fs::read_to_string(&current).unwrap();
    assert!(both.contains("BEGIN CERTIFICATE") && both.contains("PRIVATE KEY"));
    let conf = fs::read_to_string(j.kubeconfig()).unwrap();
    assert!(
        conf.contains(&format!("client-certificate: \"{}\"", current.display())),
        "{conf}"
    );
    assert!(
        conf.contains(&format!("server: \"{}\"", j.api.url())),
        "{conf}"
    );
    assert!(conf.contains("certificate-authority-data: "), "{conf}");
    assert!(!conf.contains("token"), "{conf}");
    assert!(!j.pki().join("kubelet-client.key.tmp").exists());

    // A restart uses the kubeconfig as it is: no new request.
    j.agent.kill();
    j.agent.spawn();
    let api = &j.api;
    j.agent.wait("the restarted node renews its lease", || {
        api.requests()
            .iter()
            .filter(|r| r.path.ends_with("/leases/edge-1") && r.user == "system:node:edge-1")
            .count()
            >= 3
    });
    assert_eq!(j.api.csrs().len(), 1);
}

#[test]
fn a_denied_request_is_asked_again_with_a_new_key() {
    let mut j = join(|_, _| {});
    let first = wait_csr(&mut j, 1);
    assert!(j
        .api
        .deny_csr(&name(&first), "NotMine", "this node is unknown"));
    let second = wait_csr(&mut j, 2);
    assert_ne!(name(&first), name(&second));
    assert_ne!(first["spec"]["request"], second["spec"]["request"]);
    let log = j.agent.log();
    assert!(
        log.contains("the request was denied: NotMine: this node is unknown"),
        "{log}"
    );
    assert!(j.api.node(NODE).is_none());
    assert!(j.api.approve_csr(&name(&second), 2));
    wait_ready(&mut j);
}

#[test]
fn an_expired_certificate_is_replaced_through_the_bootstrap_credentials() {
    // The node was off past its certificate's end: the store and
    // kubelet.conf as the agent left them, the certificate expired.
    let mut j = join(|api, dir| {
        let pki = dir.join("pki");
        fs::create_dir_all(&pki).unwrap();
        let (cert, key) = api.client_cert_for_days("system:node:edge-1", &["system:nodes"], -1);
        fs::write(
            pki.join("kubelet-client-2020-01-01-00-00-00.pem"),
            cert + &key,
        )
        .unwrap();
        std::os::unix::fs::symlink(
            "kubelet-client-2020-01-01-00-00-00.pem",
            pki.join("kubelet-client-current.pem"),
        )
        .unwrap();
        let current = pki.join("kubelet-client-current.pem");
        let ca = base64::engine::general_purpose::STANDARD.encode(api.ca_pem().unwrap());
        fs::write(
            dir.join("kubelet.conf"),
            format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- cluster:\n    server: {}\n    \
                 certificate-authority-data: {ca}\n  name: default-cluster\ncontexts:\n- context:\n    \
                 cluster: default-cluster\n    user: default-auth\n  name: default-context\n\
                 current-context: default-context\nusers:\n- name: default-auth\n  user:\n    \
                 client-certificate: {p}\n    client-key: {p}\n",
                api.url(),
                p = current.display()
            ),
        )
        .unwrap();
    });
    let csr = wait_csr(&mut j, 1);
    let log = j.agent.log();
    assert!(log.contains("not now; bootstrapping"), "{log}");
    assert!(log.contains("is not valid now"), "{log}");
    assert_eq!(csr["spec"]["username"], "system:bootstrap:abcdef");
    assert!(j.api.approve_csr(&name(&csr), 2));
    wait_ready(&mut j);
    let target = fs::read_link(j.pki().join("kubelet-client-current.pem")).unwrap();
    assert_ne!(
        target,
        PathBuf::from("kubelet-client-2020-01-01-00-00-00.pem")
    );
    // The old pair is kept, as client-go's store keeps it.
    assert!(j
        .pki()
        .join("kubelet-client-2020-01-01-00-00-00.pem")
        .exists());
}

/// Polls `f` for up to `secs` seconds.
fn within(j: &mut Joining, secs: u64, what: &str, mut f: impl FnMut(&Joining) -> bool) {
    let end = Instant::now() + Duration::from_secs(secs);
    while !f(j) {
        assert!(
            j.agent.running(),
            "tinylet exited while waiting until {what}\n{}",
            j.agent.log()
        );
        assert!(
            Instant::now() < end,
            "timed out waiting until {what}\n{}",
            j.agent.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Lists and watches of the node's pods.
fn pod_requests(api: &FakeApiServer, watches: bool) -> usize {
    api.requests()
        .iter()
        .filter(|r| {
            r.verb == "GET" && r.path == "/api/v1/pods" && r.query.contains("watch=true") == watches
        })
        .count()
}

#[test]
fn the_client_certificate_is_renewed_before_it_ends_without_losing_a_watch_or_a_pod() {
    let mut j = join_with(
        |_, _| {},
        &[
            "--rotate-certificates",
            "--node-lease-duration-seconds",
            "4",
        ],
    );
    let first = wait_csr(&mut j, 1);
    // Valid 12 s: renewed 8.4 to 10.8 s after it starts.
    let issued = SystemTime::now();
    assert!(j
        .api
        .approve_csr_for(&name(&first), Duration::from_secs(12)));
    wait_ready(&mut j);
    j.api.create_pod(crate::cluster::api_pod("steady"));
    let api = &j.api;
    j.agent.wait("the pod runs", || {
        api.pod("default", "steady")
            .is_some_and(|p| p["status"]["phase"] == "Running")
    });
    let lists = pod_requests(&j.api, false);
    let watches = pod_requests(&j.api, true);
    let creates = j.cri.count("CreateContainer");

    // The renewal, asked with the node's own certificate (the approver's
    // selfnodeclient rule), the same request otherwise.
    within(&mut j, 20, "a second certificate request", |j| {
        j.api.csrs().len() >= 2
    });
    let second = j.api.csrs()[1].clone();
    assert_eq!(
        second["spec"]["username"], "system:node:edge-1",
        "{second:#}"
    );
    assert_eq!(second["spec"]["signerName"], first["spec"]["signerName"]);
    assert_eq!(second["spec"]["usages"], first["spec"]["usages"]);
    assert_ne!(second["spec"]["request"], first["spec"]["request"]);
    let text = request_text(&second);
    assert!(
        text.contains("Subject: O=system:nodes, CN=system:node:edge-1"),
        "{text}"
    );
    // Not before 70% of its life (it starts up to 2 s before `issued`).
    let asked_after = SystemTime::now().duration_since(issued).unwrap();
    assert!(
        asked_after >= Duration::from_secs(6),
        "asked after {asked_after:?}"
    );
    assert!(j.api.approve_csr(&name(&second), 2));
    within(&mut j, 10, "the renewal is in use", |j| {
        j.agent.log().contains("client certificate renewed")
    });

    // Past the first certificate's end the node still renews its lease:
    // its connections present the new one (the fake refuses an expired one).
    let first_end = issued + Duration::from_secs(13);
    if let Ok(left) = first_end.duration_since(SystemTime::now()) {
        std::thread::sleep(left);
    }
    let renewals = |api: &FakeApiServer| {
        api.requests()
            .iter()
            .filter(|r| r.verb == "PATCH" && r.path.ends_with("/leases/edge-1") && r.status == 200)
            .count()
    };
    let before = renewals(&j.api);
    within(
        &mut j,
        10,
        "two lease renewals after the first certificate ended",
        |j| renewals(&j.api) >= before + 2,
    );

    // Nothing was lost: the pod watch was closed with every connection and
    // resumed without a list, the pod was not restarted, and the store
    // moved on.
    assert!(
        pod_requests(&j.api, true) > watches,
        "the pod watch was not made again"
    );
    assert_eq!(
        pod_requests(&j.api, false),
        lists,
        "the pods were listed again"
    );
    assert_eq!(j.cri.count("CreateContainer"), creates);
    assert_eq!(
        j.api.pod("default", "steady").unwrap()["status"]["phase"],
        "Running"
    );
    let dated: Vec<_> = fs::read_dir(j.pki())
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("kubelet-client-2"))
        .collect();
    assert_eq!(dated.len(), 2, "{dated:?}");
    assert_eq!(j.api.csrs().len(), 2);
}

#[test]
fn a_certificate_that_expires_before_its_renewal_is_replaced_through_the_bootstrap_credentials() {
    let mut j = join_with(
        |_, _| {},
        &[
            "--rotate-certificates",
            "--node-lease-duration-seconds",
            "4",
        ],
    );
    let first = wait_csr(&mut j, 1);
    let issued = SystemTime::now();
    assert!(j.api.approve_csr_for(&name(&first), Duration::from_secs(8)));
    wait_ready(&mut j);
    // The renewal is asked for, and left unanswered past the end of the
    // certificate it would replace; then it is denied.
    within(&mut j, 20, "a renewal request", |j| j.api.csrs().len() >= 2);
    let second = j.api.csrs()[1].clone();
    assert_eq!(second["spec"]["username"], "system:node:edge-1");
    if let Ok(left) = (issued + Duration::from_secs(9)).duration_since(SystemTime::now()) {
        std::thread::sleep(left);
    }
    assert!(j.api.deny_csr(&name(&second), "Late", "too late"));
    // The node's own certificate cannot ask any more: the bootstrap token does.
    within(&mut j, 20, "a request with the bootstrap token", |j| {
        j.api.csrs().len() >= 3
    });
    let third = j.api.csrs()[2].clone();
    assert_eq!(
        third["spec"]["username"], "system:bootstrap:abcdef",
        "{third:#}"
    );
    let log = j.agent.log();
    assert!(
        log.contains("expired at") && log.contains("asking with the bootstrap credentials"),
        "{log}"
    );
    assert!(j.api.approve_csr(&name(&third), 2));
    // Back: the event says what happened, and the node renews its lease.
    let api = &j.api;
    j.agent.wait("a ClientCertificateExpired event", || {
        api.events()
            .iter()
            .any(|e| e["reason"] == "ClientCertificateExpired")
    });
    let event = j
        .api
        .events()
        .into_iter()
        .find(|e| e["reason"] == "ClientCertificateExpired")
        .unwrap();
    assert_eq!(event["type"], "Warning");
    assert_eq!(event["involvedObject"]["kind"], "Node");
    let renewed = |api: &FakeApiServer| {
        api.requests()
            .iter()
            .filter(|r| r.verb == "PATCH" && r.path.ends_with("/leases/edge-1") && r.status == 200)
            .count()
    };
    let before = renewed(&j.api);
    within(&mut j, 10, "lease renewals with the new certificate", |j| {
        renewed(&j.api) >= before + 2
    });
}

/// Whether the node API at `port` presents a certificate `ca` signs for
/// the node's name (openssl s_client, verifying).
fn serves_ca_signed(port: u16, ca: &Path) -> bool {
    let out = Command::new("openssl")
        .args([
            "s_client",
            "-connect",
            &format!("127.0.0.1:{port}"),
            "-CAfile",
        ])
        .arg(ca)
        .args(["-verify_return_error", "-verify_hostname", "edge-1"])
        .stdin(std::process::Stdio::null())
        .output()
        .expect("run openssl s_client");
    out.status.success()
        && String::from_utf8_lossy(&out.stdout).contains("Verify return code: 0 (ok)")
}

#[test]
fn with_server_tls_bootstrap_the_node_api_serves_what_the_cluster_issued_once_approved() {
    let port = crate::server::free_port();
    let port_flag = port.to_string();
    let mut j = join_with(
        |_, _| {},
        &["--rotate-server-certificates", "--port", &port_flag],
    );
    let client = wait_csr(&mut j, 1);
    assert!(j.api.approve_csr(&name(&client), 2));
    wait_ready(&mut j);

    // The serving request: the node's names, asked as the node.
    let serving = wait_csr(&mut j, 2);
    assert_eq!(
        serving["spec"]["signerName"], "kubernetes.io/kubelet-serving",
        "{serving:#}"
    );
    assert_eq!(
        serving["spec"]["usages"],
        serde_json::json!(["digital signature", "key encipherment", "server auth"])
    );
    assert_eq!(serving["spec"]["username"], "system:node:edge-1");
    let text = request_text(&serving);
    assert!(
        text.contains("Subject: O=system:nodes, CN=system:node:edge-1"),
        "{text}"
    );
    // The node's name and its InternalIP (the default route's address).
    assert!(text.contains("DNS:edge-1, IP Address:"), "{text}");
    let log = j.agent.log();
    assert!(
        log.contains(&format!(
            "approve it with `kubectl certificate approve {}`",
            name(&serving)
        )),
        "{log}"
    );

    // Until it is approved the node API serves its self-signed pair.
    let ca = j.dir.path().join("cluster-ca.crt");
    fs::write(&ca, j.api.ca_pem().unwrap()).unwrap();
    assert!(
        !serves_ca_signed(port, &ca),
        "served a CA-signed certificate before approval"
    );
    let (code, _) = {
        let out = Command::new("openssl")
            .args(["s_client", "-connect", &format!("127.0.0.1:{port}")])
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap();
        (out.status.code(), ())
    };
    assert_eq!(
        code,
        Some(0),
        "the node API does not answer TLS before approval"
    );

    assert!(j.api.approve_csr(&name(&serving), 2));
    within(
        &mut j,
        10,
        "the node API serves the issued certificate",
        |_| serves_ca_signed(port, &ca),
    );
    let current = j.pki().join("kubelet-server-current.pem");
    assert!(fs::read_link(&current).is_ok(), "no {}", current.display());
    assert_eq!(j.api.csrs().len(), 2);

    // A restart serves the stored pair at once, without asking again.
    j.agent.kill();
    j.agent.spawn();
    within(
        &mut j,
        10,
        "the restarted node API serves the stored certificate",
        |_| serves_ca_signed(port, &ca),
    );
    assert_eq!(j.api.csrs().len(), 2);
}
