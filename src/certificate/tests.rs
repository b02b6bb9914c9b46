//! Tests of TLS bootstrap that need no apiserver: the store and the
//! kubeconfig it writes, the checks of an existing kubeconfig, the pending
//! key. The requests themselves are tested against the fake apiserver
//! (`tests/bootstrap.rs`).

use super::*;
use std::fs;

/// A bootstrap kubeconfig with a token and CA data, like kubeadm's.
fn bootstrap_kubeconfig(dir: &Path) -> PathBuf {
    let path = dir.join("bootstrap-kubelet.conf");
    let ca = base64::engine::general_purpose::STANDARD.encode(b"CA PEM\n");
    fs::write(
        &path,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- cluster:\n    certificate-authority-data: {ca}\n    \
             server: https://10.0.0.1:6443\n  name: kubernetes\ncontexts:\n- context:\n    \
             cluster: kubernetes\n    user: tls-bootstrap-token-user\n  name: tls-bootstrap-token-user@kubernetes\n\
             current-context: tls-bootstrap-token-user@kubernetes\npreferences: {{}}\n\
             users:\n- name: tls-bootstrap-token-user\n  user:\n    token: abcdef.0123456789abcdef\n"
        ),
    )
    .unwrap();
    path
}

fn settings(dir: &Path) -> Bootstrap {
    Bootstrap {
        kubeconfig: dir.join("kubelet.conf"),
        bootstrap_kubeconfig: bootstrap_kubeconfig(dir),
        cert_dir: dir.join("pki"),
        node: "edge-1".into(),
        client_options: ClientOptions {
            qps: 0.0,
            burst: 10,
            timeout: Duration::from_secs(1),
            user_agent: "test".into(),
        },
        backoff: (Duration::from_millis(10), Duration::from_millis(20)),
        wait: Duration::from_secs(1),
    }
}

#[test]
fn the_written_kubeconfig_names_the_current_pair_with_the_bootstraps_server_and_ca() {
    let dir = tempfile::tempdir().unwrap();
    let b = settings(dir.path());
    let (cert, key) = store::tests::openssl_pair(dir.path(), 2);
    let store = Store::new(&b.cert_dir, CLIENT_PAIR);
    store.update(&cert, &key, SystemTime::now()).unwrap();

    // A missing kubeconfig with a good pair in the store: written, no request.
    assert_eq!(load_client_cert(&b), Ok(Outcome::FromStore));
    let config = load_kubeconfig(&b.kubeconfig).unwrap();
    assert_eq!(config.server, "https://10.0.0.1:6443");
    assert_eq!(config.ca_pem.as_deref(), Some(&b"CA PEM\n"[..]));
    assert_eq!(config.token, None);
    assert!(config.client_cert_pem.is_some() && config.client_key_pem.is_some());
    let text = fs::read_to_string(&b.kubeconfig).unwrap();
    let current = b.cert_dir.join("kubelet-client-current.pem");
    assert!(
        text.contains(&format!("client-certificate: \"{}\"", current.display())),
        "{text}"
    );
    assert!(
        text.contains(&format!("client-key: \"{}\"", current.display())),
        "{text}"
    );
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        fs::metadata(&b.kubeconfig).unwrap().permissions().mode() & 0o777,
        0o600
    );

    // Now it is good as it is.
    assert_eq!(still_valid(&b.kubeconfig, SystemTime::now()), Ok(()));
    assert_eq!(load_client_cert(&b), Ok(Outcome::Existing));
    // Past the certificate's end it is not.
    let later = SystemTime::now() + Duration::from_secs(3 * 86_400);
    let e = still_valid(&b.kubeconfig, later).unwrap_err();
    assert!(e.contains("not now"), "{e}");
}

#[test]
fn kubeconfigs_that_cannot_serve_as_they_are_say_why() {
    let dir = tempfile::tempdir().unwrap();
    let now = SystemTime::now();
    let missing = dir.path().join("nope.conf");
    assert_eq!(still_valid(&missing, now), Err("does not exist".into()));
    // A token alone is not a node's client certificate.
    let token_only = bootstrap_kubeconfig(dir.path());
    assert_eq!(
        still_valid(&token_only, now),
        Err("names no client certificate".into())
    );
    let broken = dir.path().join("broken.conf");
    fs::write(&broken, "clusters: [").unwrap();
    assert!(still_valid(&broken, now).is_err());
}

#[test]
fn no_bootstrap_kubeconfig_is_an_error_naming_the_flag() {
    let dir = tempfile::tempdir().unwrap();
    let mut b = settings(dir.path());
    b.bootstrap_kubeconfig = dir.path().join("absent.conf");
    let e = load_client_cert(&b).unwrap_err();
    assert!(e.starts_with("--bootstrap-kubeconfig: "), "{e}");
    assert!(e.contains("absent.conf"), "{e}");
    assert!(!b.kubeconfig.exists());
}

#[test]
fn a_pending_key_is_kept_until_used_and_replaced_when_unusable() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::new(dir.path(), CLIENT_PAIR);
    let first = pending_key(&store).unwrap();
    assert_eq!(pending_key(&store).unwrap(), first);
    use std::os::unix::fs::PermissionsExt;
    let mode = fs::metadata(store.pending_key_path())
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);
    fs::write(store.pending_key_path(), "junk").unwrap();
    let second = pending_key(&store).unwrap();
    assert_ne!(second, first);
}
