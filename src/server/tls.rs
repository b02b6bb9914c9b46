//! TLS of the node API's main port: the serving pair from
//! `--tls-cert-file`/`--tls-private-key-file`, or a self-signed one kept
//! under `--cert-dir`; with `--client-ca-file`, client certificates are
//! asked for (not required) and verified against that CA, so a
//! certificate from another CA fails the handshake and a client without
//! one goes on to authentication as anonymous.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use log::{info, warn};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

use crate::atomic_file::{write_file, Durability};
use crate::options::TlsMinVersion;

/// Names of the self-signed pair under `--cert-dir`, as upstream's.
pub(crate) const CERT_FILE: &str = "kubelet.crt";
pub(crate) const KEY_FILE: &str = "kubelet.key";

/// Where the serving pair comes from.
pub(crate) struct Serving<'a> {
    /// `--tls-cert-file` and `--tls-private-key-file`, when given.
    pub(crate) files: Option<(&'a Path, &'a Path)>,
    /// `--cert-dir`, for the self-signed pair.
    pub(crate) cert_dir: &'a Path,
    /// The node's name and IPs, for a new self-signed pair.
    pub(crate) host: &'a str,
    pub(crate) ips: &'a [IpAddr],
}

fn load_pair(
    cert: &Path,
    key: &Path,
) -> Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>), String> {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .map_err(|e| format!("{}: {e}", cert.display()))?
        .collect::<Result<_, _>>()
        .map_err(|e| format!("{}: {e}", cert.display()))?;
    if certs.is_empty() {
        return Err(format!("{}: no CERTIFICATE block", cert.display()));
    }
    let key = PrivateKeyDer::from_pem_file(key).map_err(|e| format!("{}: {e}", key.display()))?;
    Ok((certs, key))
}

/// The self-signed pair's paths under `dir`, made when missing or
/// unreadable (then both are replaced), else reused as they are.
pub(crate) fn ensure_self_signed(
    dir: &Path,
    host: &str,
    ips: &[IpAddr],
) -> Result<(PathBuf, PathBuf), String> {
    let cert = dir.join(CERT_FILE);
    let key = dir.join(KEY_FILE);
    match load_pair(&cert, &key) {
        Ok(_) => return Ok((cert, key)),
        Err(e) if cert.exists() || key.exists() => {
            warn!("self-signed serving certificate: {e}; making a new pair")
        }
        Err(_) => {}
    }
    crate::paths::ensure_dir(dir, crate::paths::PRIVATE_DIR_MODE)
        .map_err(|e| format!("--cert-dir {}: {e}", dir.display()))?;
    let pair = crate::x509::self_signed(host, ips, std::time::SystemTime::now())?;
    write_file(
        &key,
        crate::x509::pem("PRIVATE KEY", &pair.key_pkcs8).as_bytes(),
        0o600,
        Durability::Fsync,
    )
    .map_err(|e| format!("{}: {e}", key.display()))?;
    write_file(
        &cert,
        crate::x509::pem("CERTIFICATE", &pair.cert_der).as_bytes(),
        0o644,
        Durability::Fsync,
    )
    .map_err(|e| format!("{}: {e}", cert.display()))?;
    info!(
        "made a self-signed serving certificate {} for {host}",
        cert.display()
    );
    Ok((cert, key))
}

/// The serving certificate the main port presents, replaceable while it
/// serves (`serverTLSBootstrap`): each handshake takes the current one.
#[derive(Debug)]
pub(crate) struct ServingCert(parking_lot::RwLock<Arc<rustls::sign::CertifiedKey>>);

impl ServingCert {
    fn new(
        certs: Vec<CertificateDer<'static>>,
        key: PrivateKeyDer<'static>,
    ) -> Result<ServingCert, String> {
        Ok(ServingCert(parking_lot::RwLock::new(Arc::new(certified(
            certs, key,
        )?))))
    }

    /// Presents this pair (PEM: the chain, leaf first; the key) from the
    /// next handshake on. On an error the current one stays.
    pub(crate) fn set_pem(&self, cert_pem: &[u8], key_pem: &[u8]) -> Result<(), String> {
        let certs = CertificateDer::pem_slice_iter(cert_pem)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| format!("certificate: {e}"))?;
        if certs.is_empty() {
            return Err("no CERTIFICATE block".into());
        }
        let key = PrivateKeyDer::from_pem_slice(key_pem).map_err(|e| format!("key: {e}"))?;
        *self.0.write() = Arc::new(certified(certs, key)?);
        Ok(())
    }
}

fn certified(
    certs: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
) -> Result<rustls::sign::CertifiedKey, String> {
    let signer =
        rustls::crypto::ring::sign::any_supported_type(&key).map_err(|e| format!("key: {e}"))?;
    let pair = rustls::sign::CertifiedKey::new(certs, signer);
    pair.keys_match()
        .map_err(|e| format!("the key is not the certificate's: {e}"))?;
    Ok(pair)
}

impl rustls::server::ResolvesServerCert for ServingCert {
    fn resolve(
        &self,
        _: rustls::server::ClientHello<'_>,
    ) -> Option<Arc<rustls::sign::CertifiedKey>> {
        Some(self.0.read().clone())
    }
}

/// The main port's TLS configuration, speaking TLS 1.2 and 1.3 or, from
/// `min` `VersionTLS13`, 1.3 only (rustls has neither 1.0 nor 1.1:
/// `TlsMinVersion` refuses those when the flags are read). Errors name
/// the flag and the file. The certificate presented can be replaced
/// through the returned handle.
pub(crate) fn server_config(
    serving: &Serving,
    client_ca: Option<&Path>,
    min: TlsMinVersion,
) -> Result<(Arc<rustls::ServerConfig>, Arc<ServingCert>), String> {
    let (certs, key) = match serving.files {
        Some((cert, key)) => load_pair(cert, key)
            .map_err(|e| format!("--tls-cert-file/--tls-private-key-file: {e}"))?,
        None => {
            let (cert, key) = ensure_self_signed(serving.cert_dir, serving.host, serving.ips)
                .map_err(|e| format!("--cert-dir: {e}"))?;
            load_pair(&cert, &key).map_err(|e| format!("--cert-dir: {e}"))?
        }
    };
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let versions: &[&'static rustls::SupportedProtocolVersion] = match min {
        TlsMinVersion::Tls12 => &[&rustls::version::TLS13, &rustls::version::TLS12],
        TlsMinVersion::Tls13 => &[&rustls::version::TLS13],
    };
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(versions)
        .map_err(|e| format!("--tls-min-version {}: {e}", min.name()))?;
    let builder = match client_ca {
        Some(path) => {
            let shown = path.display();
            let mut roots = rustls::RootCertStore::empty();
            let iter = CertificateDer::pem_file_iter(path)
                .map_err(|e| format!("--client-ca-file {shown}: {e}"))?;
            for cert in iter {
                let cert = cert.map_err(|e| format!("--client-ca-file {shown}: {e}"))?;
                roots
                    .add(cert)
                    .map_err(|e| format!("--client-ca-file {shown}: {e}"))?;
            }
            if roots.is_empty() {
                return Err(format!("--client-ca-file {shown}: no CERTIFICATE block"));
            }
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                Arc::new(roots),
                provider,
            )
            .allow_unauthenticated()
            .build()
            .map_err(|e| format!("--client-ca-file {shown}: {e}"))?;
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    };
    let current = Arc::new(
        ServingCert::new(certs, key)
            .map_err(|e| format!("--tls-cert-file/--tls-private-key-file: {e}"))?,
    );
    let mut config = builder.with_cert_resolver(current.clone());
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok((Arc::new(config), current))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn the_self_signed_pair_is_made_once_private_and_reused() {
        let dir = tempfile::tempdir().unwrap();
        let pki = dir.path().join("pki");
        let (cert, key) = ensure_self_signed(&pki, "edge-1", &[]).unwrap();
        let mode = std::fs::metadata(&key).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let first = (std::fs::read(&cert).unwrap(), std::fs::read(&key).unwrap());
        ensure_self_signed(&pki, "edge-1", &[]).unwrap();
        let again = (std::fs::read(&cert).unwrap(), std::fs::read(&key).unwrap());
        assert_eq!(first, again, "the pair was made again");
        // An unreadable pair is replaced.
        std::fs::write(&key, "garbage").unwrap();
        ensure_self_signed(&pki, "edge-1", &[]).unwrap();
        assert_ne!(std::fs::read(&cert).unwrap(), first.0);
        let serving = Serving {
            files: None,
            cert_dir: &pki,
            host: "edge-1",
            ips: &[],
        };
        let _ = server_config(&serving, None, TlsMinVersion::Tls12).unwrap();
    }

    /// Whether a client speaking only `versions` completes a handshake
    /// with `server` (in memory, trusting the self-signed pair in `pki`).
    fn handshakes(
        server: Arc<rustls::ServerConfig>,
        pki: &Path,
        versions: &[&'static rustls::SupportedProtocolVersion],
    ) -> bool {
        let mut roots = rustls::RootCertStore::empty();
        for cert in CertificateDer::pem_file_iter(pki.join(CERT_FILE)).unwrap() {
            roots.add(cert.unwrap()).unwrap();
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let client = rustls::ClientConfig::builder_with_provider(provider)
            .with_protocol_versions(versions)
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        let name = rustls::pki_types::ServerName::try_from("edge-1").unwrap();
        let mut c = rustls::ClientConnection::new(Arc::new(client), name).unwrap();
        let mut s = rustls::ServerConnection::new(server).unwrap();
        for _ in 0..10 {
            let mut wire = Vec::new();
            while c.wants_write() {
                c.write_tls(&mut wire).unwrap();
            }
            if s.read_tls(&mut &wire[..]).is_err() || s.process_new_packets().is_err() {
                return false;
            }
            let mut back = Vec::new();
            while s.wants_write() {
                s.write_tls(&mut back).unwrap();
            }
            if c.read_tls(&mut &back[..]).is_err() || c.process_new_packets().is_err() {
                return false;
            }
            if !c.is_handshaking() && !s.is_handshaking() {
                return true;
            }
        }
        false
    }

    #[test]
    fn the_minimum_tls_version_is_what_the_main_port_speaks() {
        let dir = tempfile::tempdir().unwrap();
        let pki = dir.path().join("pki");
        let serving = Serving {
            files: None,
            cert_dir: &pki,
            host: "edge-1",
            ips: &[],
        };
        let tls12: &[&'static rustls::SupportedProtocolVersion] = &[&rustls::version::TLS12];
        let tls13: &[&'static rustls::SupportedProtocolVersion] = &[&rustls::version::TLS13];
        let default = server_config(&serving, None, TlsMinVersion::Tls12)
            .unwrap()
            .0;
        assert!(handshakes(default.clone(), &pki, tls12));
        assert!(handshakes(default, &pki, tls13));
        let only13 = server_config(&serving, None, TlsMinVersion::Tls13)
            .unwrap()
            .0;
        assert!(
            !handshakes(only13.clone(), &pki, tls12),
            "a TLS 1.2 client got in"
        );
        assert!(handshakes(only13, &pki, tls13));

        // Upstream's names; TLS 1.0 and 1.1 refused with the reason.
        assert_eq!(
            TlsMinVersion::parse("VersionTLS13"),
            Ok(TlsMinVersion::Tls13)
        );
        assert_eq!(TlsMinVersion::parse(""), Ok(TlsMinVersion::Tls12));
        for old in ["VersionTLS10", "VersionTLS11"] {
            let e = TlsMinVersion::parse(old).unwrap_err();
            assert!(e.contains("TLS 1.2 and 1.3 only"), "{e}");
        }
        assert!(TlsMinVersion::parse("TLS1.3").is_err());
    }
}
