//! One certificate request (client-go's `csr.RequestCertificate` and
//! `WaitForCertificate`): a `CertificateSigningRequest` is created, named
//! after its key, subject and usages so that asking again with the same
//! key finds the same object, then its status is watched until it is
//! issued, denied or failed.

use std::time::{Duration, Instant};

use base64::Engine as _;
use log::{debug, info};
use serde_json::{json, Value};

use crate::kube::{ApiError, Client, WatchEvent};

const V1: &str = "/apis/certificates.k8s.io/v1/certificatesigningrequests";
const V1BETA1: &str = "/apis/certificates.k8s.io/v1beta1/certificatesigningrequests";

/// How long one watch of the request may stay open before it is read
/// again (the server closes it at `timeoutSeconds`; the idle bound notices
/// a dead connection).
const WATCH_SECONDS: u64 = 300;

/// What a request is for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Request {
    /// `spec.signerName`.
    pub(crate) signer: &'static str,
    /// `spec.usages`, in the order they are sent.
    pub(crate) usages: &'static [&'static str],
    /// The PKCS#10 request, PEM.
    pub(crate) csr_pem: String,
    /// The name it is created under (see [`name`]).
    pub(crate) name: String,
    /// The DER SubjectPublicKeyInfo of the request's key.
    pub(crate) spki: Vec<u8>,
}

/// Why a request ended without a certificate.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Refused {
    /// The request was denied (condition `Denied`): its reason and message.
    Denied(String),
    /// The signer could not sign it (condition `Failed`).
    Failed(String),
}

/// How a request ended.
#[derive(Debug)]
pub(crate) enum Error {
    /// The cluster said no: ask again with a new key.
    Refused(Refused),
    /// The apiserver could not be reached or answered oddly: ask again
    /// with the same key later.
    Api(String),
    /// No answer within the deadline.
    TimedOut,
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Error::Refused(Refused::Denied(m)) => write!(f, "the request was denied: {m}"),
            Error::Refused(Refused::Failed(m)) => write!(f, "the signer failed it: {m}"),
            Error::Api(m) => write!(f, "{m}"),
            Error::TimedOut => write!(f, "no certificate was issued in time"),
        }
    }
}

impl From<ApiError> for Error {
    fn from(e: ApiError) -> Error {
        Error::Api(e.to_string())
    }
}

/// `node-csr-<digest>`: the digest (SHA-512/256, base64url) of the public
/// key, the subject's CN and organizations and the usages, each written
/// base64url with a `|` after it, as upstream names node requests.
pub(crate) fn name(
    spki_der: &[u8],
    common_name: &str,
    organizations: &[&str],
    usages: &[&str],
) -> String {
    let encode = |b: &[u8]| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(b);
    let mut input = String::new();
    let mut write = |b: &[u8]| {
        input.push_str(&encode(b));
        input.push('|');
    };
    write(spki_der);
    write(common_name.as_bytes());
    for o in organizations {
        write(o.as_bytes());
    }
    for u in usages {
        write(u.as_bytes());
    }
    let digest = ring::digest::digest(&ring::digest::SHA512_256, input.as_bytes());
    format!("node-csr-{}", encode(digest.as_ref()))
}

/// Creates the request (or finds it made by an earlier try with the same
/// key) and waits until `deadline` for its certificate: PEM, the chain as
/// the signer issued it.
pub(crate) fn request_certificate(
    client: &Client,
    req: &Request,
    deadline: Instant,
) -> Result<Vec<u8>, Error> {
    let collection = create(client, req)?;
    info!(
        "certificate request {} ({}) sent; waiting for it to be approved and issued",
        req.name, req.signer
    );
    wait(client, collection, &req.name, deadline)
}

/// POSTs the request, in `certificates.k8s.io/v1` or, from an apiserver
/// older than v1.19 that has no such version, `v1beta1`. Returns the
/// collection path used.
fn create(client: &Client, req: &Request) -> Result<&'static str, Error> {
    let request_b64 = base64::engine::general_purpose::STANDARD.encode(req.csr_pem.as_bytes());
    for (collection, version) in [(V1, "v1"), (V1BETA1, "v1beta1")] {
        let body = json!({
            "apiVersion": format!("certificates.k8s.io/{version}"),
            "kind": "CertificateSigningRequest",
            "metadata": {"name": req.name},
            "spec": {
                "request": request_b64,
                "signerName": req.signer,
                "usages": req.usages,
            },
        });
        match client.create(collection, &body) {
            Ok(_) => return Ok(collection),
            Err(e) if e.is_already_exists() => {
                // Made by an earlier try: it must be for the same key (the
                // name covers the subject, usages and names; the signature
                // differs at every try).
                let path = format!("{collection}/{}", req.name);
                let existing = client.get(&path)?;
                if !same_key(&existing, &req.spki) {
                    // Asked again with a new key, under a new name.
                    return Err(Error::Refused(Refused::Failed(format!(
                        "certificate request {} exists with another key or subject",
                        req.name
                    ))));
                }
                return Ok(collection);
            }
            Err(e) if e.is_not_found() && collection == V1 => {
                debug!("POST {V1}: 404; trying certificates.k8s.io/v1beta1");
            }
            Err(e) => return Err(e.into()),
        }
    }
    Err(Error::Api(
        "the apiserver serves no certificates.k8s.io version this node speaks".into(),
    ))
}

/// Whether a CSR object's request is for the key `spki`.
fn same_key(csr: &Value, spki: &[u8]) -> bool {
    use rustls::pki_types::pem::{PemObject, SectionKind};
    let Some(pem) = csr["spec"]["request"]
        .as_str()
        .and_then(|b| base64::engine::general_purpose::STANDARD.decode(b).ok())
    else {
        return false;
    };
    <(SectionKind, Vec<u8>)>::pem_slice_iter(&pem)
        .filter_map(Result::ok)
        .find(|(kind, _)| *kind == SectionKind::Csr)
        .is_some_and(|(_, der)| crate::x509::request_public_key(&der).is_ok_and(|k| k == spki))
}

/// Reads the request, then watches it until it is issued or refused.
fn wait(
    client: &Client,
    collection: &str,
    name: &str,
    deadline: Instant,
) -> Result<Vec<u8>, Error> {
    let object = format!("{collection}/{name}");
    loop {
        if Instant::now() >= deadline {
            return Err(Error::TimedOut);
        }
        let csr = client.get(&object)?;
        if let Some(done) = outcome(&csr) {
            return done;
        }
        let rv = csr["metadata"]["resourceVersion"].as_str().unwrap_or("");
        let left = deadline.saturating_duration_since(Instant::now()).as_secs();
        let seconds = left.clamp(1, WATCH_SECONDS);
        let path = format!(
            "{collection}?fieldSelector=metadata.name%3D{name}&resourceVersion={rv}\
             &watch=true&timeoutSeconds={seconds}"
        );
        let stream = match client.watch(&path, Duration::from_secs(seconds + 30)) {
            Ok(s) => s,
            // A gone resourceVersion or a closed connection: read it again.
            Err(e) if e.is_gone() || e.is_transport() => continue,
            Err(e) => return Err(e.into()),
        };
        for event in stream {
            match event {
                Ok(WatchEvent::Added(csr) | WatchEvent::Modified(csr)) => {
                    if let Some(done) = outcome(&csr) {
                        return done;
                    }
                }
                Ok(WatchEvent::Deleted(_)) => {
                    return Err(Error::Api(format!(
                        "certificate request {name} was deleted before it was issued"
                    )))
                }
                Ok(_) => {}
                Err(e) => {
                    debug!("watch of certificate request {name}: {e}");
                    break;
                }
            }
        }
    }
}

/// The end of a request, if its status has one: the certificate once
/// approved and issued, or why it was refused.
fn outcome(csr: &Value) -> Option<Result<Vec<u8>, Error>> {
    let conditions = csr["status"]["conditions"].as_array();
    let mut approved = false;
    for c in conditions.into_iter().flatten() {
        let ty = c["type"].as_str().unwrap_or("");
        // v1 conditions carry a status; v1beta1 ones may not.
        if c["status"].as_str().is_some_and(|s| s != "True") {
            continue;
        }
        let why = || {
            let reason = c["reason"].as_str().unwrap_or("");
            let message = c["message"].as_str().unwrap_or("");
            match (reason, message) {
                ("", "") => "no reason given".to_string(),
                (r, "") => r.to_string(),
                ("", m) => m.to_string(),
                (r, m) => format!("{r}: {m}"),
            }
        };
        match ty {
            "Denied" => return Some(Err(Error::Refused(Refused::Denied(why())))),
            "Failed" => return Some(Err(Error::Refused(Refused::Failed(why())))),
            "Approved" => approved = true,
            _ => {}
        }
    }
    let issued = csr["status"]["certificate"].as_str().unwrap_or("");
    if !approved || issued.is_empty() {
        return None;
    }
    Some(
        base64::engine::general_purpose::STANDARD
            .decode(issued)
            .map_err(|e| Error::Api(format!("status.certificate is not base64: {e}"))),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_name_depends_on_key_subject_and_usages_only() {
        let usages = ["digital signature", "key encipherment", "client auth"];
        let a = name(b"key-1", "system:node:edge-1", &["system:nodes"], &usages);
        assert!(a.starts_with("node-csr-"), "{a}");
        // SHA-512/256 in base64url without padding: 43 characters.
        assert_eq!(a.len(), "node-csr-".len() + 43, "{a}");
        assert!(a["node-csr-".len()..]
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_'));
        assert_eq!(
            a,
            name(b"key-1", "system:node:edge-1", &["system:nodes"], &usages)
        );
        assert_ne!(
            a,
            name(b"key-2", "system:node:edge-1", &["system:nodes"], &usages)
        );
        assert_ne!(
            a,
            name(b"key-1", "system:node:edge-2", &["system:nodes"], &usages)
        );
        assert_ne!(a, name(b"key-1", "system:node:edge-1", &[], &usages));
        assert_ne!(
            a,
            name(
                b"key-1",
                "system:node:edge-1",
                &["system:nodes"],
                &usages[..2]
            )
        );
        // The delimiter keeps fields apart.
        assert_ne!(name(b"k", "ab", &["c"], &[]), name(b"k", "a", &["bc"], &[]));
    }

    #[test]
    fn a_status_ends_the_wait_only_when_issued_or_refused() {
        let cert = base64::engine::general_purpose::STANDARD.encode(b"PEM");
        let pending = json!({"status": {}});
        assert!(outcome(&pending).is_none());
        // Approved but not yet signed: still waiting.
        let approved = json!({"status": {"conditions": [{"type": "Approved", "status": "True"}]}});
        assert!(outcome(&approved).is_none());
        // Signed without approval is not taken.
        assert!(outcome(&json!({"status": {"certificate": cert}})).is_none());
        let issued = json!({"status": {
            "conditions": [{"type": "Approved", "status": "True", "reason": "AutoApproved"}],
            "certificate": cert,
        }});
        assert_eq!(outcome(&issued).unwrap().unwrap(), b"PEM");
        // v1beta1 conditions have no status.
        let beta = json!({"status": {"conditions": [{"type": "Approved"}], "certificate": cert}});
        assert_eq!(outcome(&beta).unwrap().unwrap(), b"PEM");
        let denied = json!({"status": {"conditions": [
            {"type": "Denied", "status": "True", "reason": "NotMine", "message": "wrong node"}
        ]}});
        match outcome(&denied) {
            Some(Err(Error::Refused(Refused::Denied(m)))) => assert_eq!(m, "NotMine: wrong node"),
            other => panic!("{other:?}"),
        }
        let failed = json!({"status": {"conditions": [
            {"type": "Approved", "status": "True"},
            {"type": "Failed", "status": "True", "message": "signer down"}
        ]}});
        match outcome(&failed) {
            Some(Err(Error::Refused(Refused::Failed(m)))) => assert_eq!(m, "signer down"),
            other => panic!("{other:?}"),
        }
        // A condition whose status is False does not count.
        let not_denied = json!({"status": {"conditions": [{"type": "Denied", "status": "False"}]}});
        assert!(outcome(&not_denied).is_none());
        let bad = json!({"status": {"conditions": [{"type": "Approved"}], "certificate": "%%"}});
        assert!(matches!(outcome(&bad), Some(Err(Error::Api(_)))));
    }
}
