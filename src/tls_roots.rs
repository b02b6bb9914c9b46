//! The system's trusted certificate authorities, for HTTPS where no CA is
//! given (a manifest URL, a kubeconfig without one): read from the files
//! Go's crypto/x509 reads on Linux, so tinylet trusts what the upstream
//! kubelet trusts on the same machine, and carries no CA bundle of its own.
//!
//! `SSL_CERT_FILE` names a bundle and `SSL_CERT_DIR` (colon-separated)
//! directories of PEM files, as in Go; otherwise the first bundle found
//! among the distributions' usual paths is taken, else every PEM file in
//! the usual directories. Nothing found: an empty set, so a TLS handshake
//! fails naming an unknown issuer rather than trusting anything.

use std::path::Path;
use std::sync::{Arc, OnceLock};

use ureq::tls::{Certificate, PemItem, RootCerts};

/// Bundles, in Go's order (crypto/x509 root_linux.go).
const BUNDLES: &[&str] = &[
    "/etc/ssl/certs/ca-certificates.crt",
    "/etc/pki/tls/certs/ca-bundle.crt",
    "/etc/ssl/ca-bundle.pem",
    "/etc/pki/tls/cacert.pem",
    "/etc/pki/ca-trust/extracted/pem/tls-ca-bundle.pem",
    "/etc/ssl/cert.pem",
];

/// Directories of single certificates, in Go's order.
const DIRS: &[&str] = &["/etc/ssl/certs", "/etc/pki/tls/certs"];

/// The system's roots, read once per process.
pub(crate) fn system() -> RootCerts {
    static ROOTS: OnceLock<Arc<Vec<Certificate<'static>>>> = OnceLock::new();
    let certs = ROOTS.get_or_init(|| {
        let certs = load();
        if certs.is_empty() {
            log::warn!(
                "no trusted certificate authorities found (set SSL_CERT_FILE or install \
                 ca-certificates): HTTPS servers cannot be verified"
            );
        }
        Arc::new(certs)
    });
    RootCerts::Specific(certs.clone())
}

/// The system's roots as DER, for a rustls client built by hand (the
/// apiserver watch multiplexer's).
pub(crate) fn system_der() -> Vec<Vec<u8>> {
    match system() {
        RootCerts::Specific(certs) => certs.iter().map(|c| c.der().to_vec()).collect(),
        _ => Vec::new(),
    }
}

fn load() -> Vec<Certificate<'static>> {
    let file = std::env::var_os("SSL_CERT_FILE");
    let dirs = std::env::var_os("SSL_CERT_DIR");
    let mut certs = Vec::new();
    match &file {
        Some(f) => read_pem(Path::new(f), &mut certs),
        None => {
            if let Some(found) = BUNDLES.iter().map(Path::new).find(|p| p.is_file()) {
                read_pem(found, &mut certs);
            }
        }
    }
    let from_dirs: Vec<std::path::PathBuf> = match &dirs {
        Some(d) => std::env::split_paths(d).collect(),
        None if certs.is_empty() && file.is_none() => DIRS.iter().map(Into::into).collect(),
        None => Vec::new(),
    };
    for dir in from_dirs {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for e in entries.flatten() {
            read_pem(&e.path(), &mut certs);
        }
    }
    certs
}

/// Adds the certificates of one PEM file; an unreadable file or a bad
/// block is skipped (a bundle's other certificates still count).
fn read_pem(path: &Path, out: &mut Vec<Certificate<'static>>) {
    let Ok(bytes) = std::fs::read(path) else {
        return;
    };
    for item in ureq::tls::parse_pem(&bytes) {
        if let Ok(PemItem::Certificate(c)) = item {
            out.push(c);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bundle_and_a_directory_are_read_and_bad_blocks_skipped() {
        let dir = tempfile::tempdir().unwrap();
        let ca = |n: &str| {
            let out = std::process::Command::new("openssl")
                .args(["req", "-x509", "-newkey", "ec", "-pkeyopt"])
                .args(["ec_paramgen_curve:P-256", "-nodes", "-days", "1", "-subj"])
                .arg(format!("/CN={n}"))
                .args(["-keyout", "/dev/null"])
                .output()
                .unwrap();
            assert!(out.status.success());
            out.stdout
        };
        let (a, b) = (ca("a"), ca("b"));
        let mut bundle = a.clone();
        bundle.extend_from_slice(
            b"-----BEGIN CERTIFICATE-----\nnot base64!\n-----END CERTIFICATE-----\n",
        );
        bundle.extend_from_slice(&b);
        std::fs::write(dir.path().join("bundle.pem"), &bundle).unwrap();
        let mut certs = Vec::new();
        read_pem(&dir.path().join("bundle.pem"), &mut certs);
        assert_eq!(certs.len(), 2, "both good certificates of the bundle");
        read_pem(&dir.path().join("missing.pem"), &mut certs);
        assert_eq!(certs.len(), 2);
    }
}
