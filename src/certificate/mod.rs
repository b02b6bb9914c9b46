//! The node's own client certificate (upstream `pkg/kubelet/certificate`
//! and its `bootstrap`): TLS bootstrap with `--bootstrap-kubeconfig`.
//!
//! When the `--kubeconfig` file is missing, does not load, or holds a
//! client certificate that has expired, the node asks the cluster for one
//! with the bootstrap credentials (kubeadm's token): a new ECDSA P-256 key,
//! a `CertificateSigningRequest` for `CN=system:node:<node>`,
//! `O=system:nodes` to signer `kubernetes.io/kube-apiserver-client-kubelet`,
//! then a watch until it is approved and issued. The pair goes into the
//! cert dir's store (`kubelet-client-current.pem`) and `--kubeconfig` is
//! written to name it, with the bootstrap kubeconfig's server and CA. The
//! agent then starts as the node with those credentials.
//!
//! A denied or failed request is retried with a new key after a back-off;
//! an apiserver that cannot be reached, with the same key. Nothing else
//! runs meanwhile: the agent is not a node until it has its certificate.
//! `rotation` renews the pair later, with `--rotate-certificates`.

pub(crate) mod request;
pub(crate) mod rotation;
pub(crate) mod store;

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use base64::Engine as _;
use log::{info, warn};

use crate::kube::{load_kubeconfig, Client, ClientOptions, KubeConfig};
use request::{Error, Request};
use store::Store;

/// The client pair's name in the store.
pub(crate) const CLIENT_PAIR: &str = "kubelet-client";
/// The signer of node client certificates.
pub(crate) const CLIENT_SIGNER: &str = "kubernetes.io/kube-apiserver-client-kubelet";
/// The group every node's certificate names.
pub(crate) const NODES_GROUP: &str = "system:nodes";
/// The usages of a node client request. v1.20's approver recognizes
/// exactly these three for every key type; later ones also take them (and
/// drop `key encipherment` as optional for non-RSA keys).
pub(crate) const CLIENT_USAGES: &[&str] = &["digital signature", "key encipherment", "client auth"];
/// The serving pair's name in the store.
pub(crate) const SERVING_PAIR: &str = "kubelet-server";
/// The signer of node serving certificates; never approved automatically.
pub(crate) const SERVING_SIGNER: &str = "kubernetes.io/kubelet-serving";
/// The usages of a node serving request, as v1.20's validation wants them.
pub(crate) const SERVING_USAGES: &[&str] =
    &["digital signature", "key encipherment", "server auth"];

/// What a request asks for: always `O=system:nodes`,
/// `CN=system:node:<node>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Spec {
    pub(crate) signer: &'static str,
    pub(crate) usages: &'static [&'static str],
    pub(crate) node: String,
    /// Subject alternative names (serving only).
    pub(crate) dns_names: Vec<String>,
    pub(crate) ips: Vec<IpAddr>,
}

impl Spec {
    /// The node's client certificate: no names.
    pub(crate) fn client(node: &str) -> Spec {
        Spec {
            signer: CLIENT_SIGNER,
            usages: CLIENT_USAGES,
            node: node.to_string(),
            dns_names: Vec::new(),
            ips: Vec::new(),
        }
    }

    /// The node API's serving certificate for these names and addresses.
    pub(crate) fn serving(node: &str, dns_names: Vec<String>, ips: Vec<IpAddr>) -> Spec {
        Spec {
            signer: SERVING_SIGNER,
            usages: SERVING_USAGES,
            node: node.to_string(),
            dns_names,
            ips,
        }
    }
}

/// What bootstrapping needs to know.
#[derive(Debug, Clone)]
pub(crate) struct Bootstrap {
    /// `--kubeconfig`: read if good, written otherwise.
    pub(crate) kubeconfig: PathBuf,
    /// `--bootstrap-kubeconfig`: the credentials that may ask.
    pub(crate) bootstrap_kubeconfig: PathBuf,
    /// `--cert-dir`.
    pub(crate) cert_dir: PathBuf,
    pub(crate) node: String,
    pub(crate) client_options: ClientOptions,
    /// First and longest pause between tries.
    pub(crate) backoff: (Duration, Duration),
    /// How long one request is waited for before it is read again from
    /// the start (upstream: an hour).
    pub(crate) wait: Duration,
}

/// Where the node's credentials came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// `--kubeconfig` was good as it was.
    Existing,
    /// The store's current certificate was still good; the kubeconfig was
    /// written for it.
    FromStore,
    /// A new certificate was issued.
    Issued,
}

/// Makes sure `--kubeconfig` holds a client certificate that is good now,
/// asking the cluster for one if needed; blocks until it does. An error is
/// one no retry can fix (no bootstrap kubeconfig, a cert dir that cannot
/// be written).
pub(crate) fn load_client_cert(b: &Bootstrap) -> Result<Outcome, String> {
    match still_valid(&b.kubeconfig, SystemTime::now()) {
        Ok(()) => return Ok(Outcome::Existing),
        Err(why) => info!(
            "--kubeconfig {}: {why}; bootstrapping",
            b.kubeconfig.display()
        ),
    }
    let boot = load_kubeconfig(&b.bootstrap_kubeconfig)
        .map_err(|e| format!("--bootstrap-kubeconfig: {e}"))?;
    let store = Store::new(&b.cert_dir, CLIENT_PAIR);
    match store.current() {
        Ok(Some(pair)) if pair.valid_at(SystemTime::now()) => {
            write_kubeconfig(&b.kubeconfig, &boot, &pair.path)?;
            info!(
                "--kubeconfig {}: written for the certificate in {}",
                b.kubeconfig.display(),
                pair.path.display()
            );
            return Ok(Outcome::FromStore);
        }
        Ok(Some(pair)) => warn!(
            "the client certificate {} is not valid now (valid {} to {}): \
             asking for a new one with the bootstrap credentials",
            pair.path.display(),
            crate::apitime::rfc3339(pair.not_before),
            crate::apitime::rfc3339(pair.not_after),
        ),
        Ok(None) => {}
        Err(e) => warn!("{e}: asking for a new client certificate"),
    }
    store::create_dir(&b.cert_dir).map_err(|e| format!("--cert-dir: {e}"))?;
    let client = Client::new(&boot, b.client_options.clone())
        .map_err(|e| format!("--bootstrap-kubeconfig: {e}"))?;
    info!(
        "asking {} for a client certificate for node {:?}",
        client.server(),
        b.node
    );
    let mut pause = b.backoff.0;
    loop {
        match ask(&client, &store, &Spec::client(&b.node), b.wait) {
            Ok(()) => break,
            Err(e) => {
                if let Error::Refused(_) = e {
                    // The next try gets a new key, and so a new request.
                    let _ = std::fs::remove_file(store.pending_key_path());
                }
                warn!(
                    "client certificate for node {:?}: {e}; asking again in {}s",
                    b.node,
                    pause.as_secs_f32()
                );
                std::thread::sleep(pause);
                pause = (pause * 2).min(b.backoff.1);
            }
        }
    }
    let current = store.current_path();
    write_kubeconfig(&b.kubeconfig, &boot, &current)?;
    info!(
        "client certificate issued: {}; --kubeconfig {} written",
        current.display(),
        b.kubeconfig.display()
    );
    Ok(Outcome::Issued)
}

/// One request with the pending key (made now if there is none); the
/// issued pair goes into `store`.
fn ask(client: &Client, store: &Store, spec: &Spec, wait: Duration) -> Result<(), Error> {
    let key_pkcs8 = pending_key(store).map_err(Error::Api)?;
    let common_name = format!("system:node:{}", spec.node);
    let subject = crate::x509::CsrSubject {
        organizations: &[NODES_GROUP],
        common_name: &common_name,
        dns_names: &spec.dns_names,
        ips: &spec.ips,
    };
    let (csr_der, spki) = crate::x509::csr(&key_pkcs8, &subject).map_err(Error::Api)?;
    // The names go into the digest too: a serving request for other
    // addresses is another request.
    let mut digested: Vec<String> = spec.usages.iter().map(|u| u.to_string()).collect();
    digested.extend(spec.dns_names.iter().cloned());
    digested.extend(spec.ips.iter().map(|ip| ip.to_string()));
    let digested: Vec<&str> = digested.iter().map(String::as_str).collect();
    let req = Request {
        signer: spec.signer,
        usages: spec.usages,
        csr_pem: crate::x509::pem("CERTIFICATE REQUEST", &csr_der),
        name: request::name(&spki, &common_name, &[NODES_GROUP], &digested),
        spki,
    };
    if spec.signer == SERVING_SIGNER {
        info!(
            "serving certificate request {}: {SERVING_SIGNER} requests are not approved \
             automatically; approve it with `kubectl certificate approve {}`",
            req.name, req.name
        );
    }
    let cert = request::request_certificate(client, &req, Instant::now() + wait)?;
    let key_pem = crate::x509::pem("PRIVATE KEY", &key_pkcs8);
    store
        .update(&cert, key_pem.as_bytes(), SystemTime::now())
        .map_err(|e| Error::Api(format!("the issued certificate: {e}")))?;
    let _ = std::fs::remove_file(store.pending_key_path());
    Ok(())
}

/// The key of the request in flight: read back from the store, or made
/// and kept there (0600) before it is used.
fn pending_key(store: &Store) -> Result<Vec<u8>, String> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::PrivatePkcs8KeyDer;
    let path = store.pending_key_path();
    if let Ok(key) = PrivatePkcs8KeyDer::from_pem_file(&path) {
        let der = key.secret_pkcs8_der().to_vec();
        // A key another tool left there, of a kind tinylet cannot sign
        // with, is replaced.
        if crate::x509::csr(
            &der,
            &crate::x509::CsrSubject {
                organizations: &[],
                common_name: "check",
                dns_names: &[],
                ips: &[],
            },
        )
        .is_ok()
        {
            return Ok(der);
        }
    }
    let der = crate::x509::generate_key()?;
    let pem = crate::x509::pem("PRIVATE KEY", &der);
    crate::atomic_file::write_file(
        &path,
        pem.as_bytes(),
        0o600,
        crate::atomic_file::Durability::Fsync,
    )
    .map_err(|e| format!("keeping the new key: {e}"))?;
    Ok(der)
}

/// Whether the kubeconfig's client certificate is the store's current
/// pair (what TLS bootstrap writes), the one rotation renews. Upstream's
/// manager takes over any kubeconfig's certificate; tinylet rotates only
/// the pair it keeps, and leaves certificates an operator placed alone.
pub(crate) fn managed(kubeconfig: &KubeConfig, store: &Store) -> Result<(), String> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::CertificateDer;
    let leaf = |pem: &[u8]| {
        CertificateDer::pem_slice_iter(pem)
            .next()
            .and_then(Result::ok)
    };
    let Some(cert) = &kubeconfig.client_cert_pem else {
        return Err(format!(
            "{} names no client certificate",
            kubeconfig.file.display()
        ));
    };
    let current = store.current()?.ok_or_else(|| {
        format!(
            "{} has no pair yet (TLS bootstrap makes it)",
            store.current_path().display()
        )
    })?;
    if leaf(cert).is_none() || leaf(cert) != leaf(&current.cert_pem) {
        return Err(format!(
            "{}'s client certificate is not {}, the pair TLS bootstrap keeps",
            kubeconfig.file.display(),
            current.path.display()
        ));
    }
    Ok(())
}

/// Whether a kubeconfig can be used as it is: it loads, names a client
/// certificate and key, and every certificate in the chain is valid now
/// (upstream's `isClientConfigStillValid`). The error says why not.
fn still_valid(path: &Path, now: SystemTime) -> Result<(), String> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::CertificateDer;
    if !path.exists() {
        return Err("does not exist".into());
    }
    let config = load_kubeconfig(path)?;
    let (Some(cert), Some(_)) = (&config.client_cert_pem, &config.client_key_pem) else {
        return Err("names no client certificate".into());
    };
    let mut n = 0;
    for der in CertificateDer::pem_slice_iter(cert) {
        let der = der.map_err(|e| format!("client certificate: {e}"))?;
        let (from, to) =
            crate::x509::validity(&der).map_err(|e| format!("client certificate: {e}"))?;
        if now < from || now >= to {
            return Err(format!(
                "its client certificate is valid from {} to {}, not now",
                crate::apitime::rfc3339(from),
                crate::apitime::rfc3339(to)
            ));
        }
        n += 1;
    }
    if n == 0 {
        return Err("its client certificate holds no certificate".into());
    }
    Ok(())
}

/// Writes the node's kubeconfig (0600): the bootstrap kubeconfig's server
/// and CA, the client pair at `pair`, in upstream's layout
/// (`default-cluster`, `default-auth`, `default-context`).
fn write_kubeconfig(path: &Path, boot: &KubeConfig, pair: &Path) -> Result<(), String> {
    let q = |s: &str| serde_json::Value::from(s).to_string();
    let mut cluster = format!("    server: {}\n", q(&boot.server));
    if let Some(ca) = &boot.ca_pem {
        let data = base64::engine::general_purpose::STANDARD.encode(ca);
        cluster.push_str(&format!("    certificate-authority-data: {data}\n"));
    }
    if boot.insecure_skip_tls_verify {
        cluster.push_str("    insecure-skip-tls-verify: true\n");
    }
    let pair = pair.display().to_string();
    let text = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- cluster:\n{cluster}  name: default-cluster\n\
         contexts:\n- context:\n    cluster: default-cluster\n    namespace: default\n    \
         user: default-auth\n  name: default-context\ncurrent-context: default-context\n\
         preferences: {{}}\nusers:\n- name: default-auth\n  user:\n    \
         client-certificate: {p}\n    client-key: {p}\n",
        p = q(&pair)
    );
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    }
    crate::atomic_file::write_file(
        path,
        text.as_bytes(),
        0o600,
        crate::atomic_file::Durability::Fsync,
    )
    .map_err(|e| format!("--kubeconfig: {e}"))?;
    // What was written must load as the node's credentials.
    load_kubeconfig(path).map(|_| ())
}

#[cfg(test)]
mod tests;
