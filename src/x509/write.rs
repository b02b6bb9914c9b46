//! What tinylet writes in X.509, with a small DER encoder and ring's
//! ECDSA P-256: the node API's self-signed serving certificate (the node's
//! name, `localhost`, 127.0.0.1 and the node's IPs, valid for a year, as
//! upstream's `GenerateSelfSignedCertKey`) and the PKCS#10 requests of
//! TLS bootstrap and rotation.

use std::net::IpAddr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use ring::rand::{SecureRandom, SystemRandom};
use ring::signature::{EcdsaKeyPair, KeyPair, ECDSA_P256_SHA256_ASN1_SIGNING};

/// ecdsa-with-SHA256
const OID_ECDSA_SHA256: &[u8] = &[0x06, 0x08, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x04, 0x03, 0x02];
/// id-ecPublicKey
const OID_EC_PUBLIC_KEY: &[u8] = &[0x06, 0x07, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01];
/// prime256v1
const OID_P256: &[u8] = &[0x06, 0x08, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07];
const OID_COMMON_NAME: &[u8] = &[0x06, 0x03, 0x55, 0x04, 0x03];
const OID_ORGANIZATION: &[u8] = &[0x06, 0x03, 0x55, 0x04, 0x0a];
/// PKCS#9 extensionRequest
const OID_EXTENSION_REQUEST: &[u8] = &[
    0x06, 0x09, 0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x09, 0x0e,
];
const OID_KEY_USAGE: &[u8] = &[0x06, 0x03, 0x55, 0x1d, 0x0f];
const OID_EXT_KEY_USAGE: &[u8] = &[0x06, 0x03, 0x55, 0x1d, 0x25];
const OID_BASIC_CONSTRAINTS: &[u8] = &[0x06, 0x03, 0x55, 0x1d, 0x13];
const OID_SUBJECT_ALT_NAME: &[u8] = &[0x06, 0x03, 0x55, 0x1d, 0x11];
const OID_SERVER_AUTH: &[u8] = &[0x06, 0x08, 0x2b, 0x06, 0x01, 0x05, 0x05, 0x07, 0x03, 0x01];

/// A DER tag-length-value.
fn tlv(tag: u8, content: &[u8]) -> Vec<u8> {
    let mut out = vec![tag];
    let n = content.len();
    if n < 0x80 {
        out.push(n as u8);
    } else {
        let bytes = n.to_be_bytes();
        let skip = bytes.iter().take_while(|b| **b == 0).count();
        out.push(0x80 | (bytes.len() - skip) as u8);
        out.extend_from_slice(&bytes[skip..]);
    }
    out.extend_from_slice(content);
    out
}

fn seq(parts: &[&[u8]]) -> Vec<u8> {
    tlv(0x30, &parts.concat())
}

fn bit_string(bytes: &[u8]) -> Vec<u8> {
    tlv(0x03, &[&[0u8][..], bytes].concat())
}

fn name(common_name: &str) -> Vec<u8> {
    let atv = seq(&[OID_COMMON_NAME, &tlv(0x0c, common_name.as_bytes())]);
    seq(&[&tlv(0x31, &atv)])
}

fn utc_time(t: SystemTime) -> Vec<u8> {
    let secs = t
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let text = k8s_openapi::jiff::Timestamp::from_second(i64::try_from(secs).unwrap_or(0))
        .map(|ts| ts.strftime("%y%m%d%H%M%SZ").to_string())
        .unwrap_or_else(|_| "700101000000Z".into());
    tlv(0x17, text.as_bytes())
}

fn extension(oid: &[u8], critical: bool, value: &[u8]) -> Vec<u8> {
    let crit: &[u8] = if critical { &[0x01, 0x01, 0xff] } else { &[] };
    seq(&[oid, crit, &tlv(0x04, value)])
}

/// A self-signed pair: the certificate and the PKCS#8 key, both DER.
pub(crate) struct SelfSigned {
    pub(crate) cert_der: Vec<u8>,
    pub(crate) key_pkcs8: Vec<u8>,
}

/// Makes a key and a certificate for `host` (the CN and a DNS name),
/// `localhost`, and `ips` (127.0.0.1 is always among them).
pub(crate) fn self_signed(
    host: &str,
    ips: &[IpAddr],
    now: SystemTime,
) -> Result<SelfSigned, String> {
    let rng = SystemRandom::new();
    let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_ASN1_SIGNING, &rng)
        .map_err(|_| "generating an ECDSA P-256 key failed".to_string())?;
    let key = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_ASN1_SIGNING, pkcs8.as_ref(), &rng)
        .map_err(|_| "reading the generated key failed".to_string())?;

    let mut serial = [0u8; 16];
    rng.fill(&mut serial)
        .map_err(|_| "no random numbers for the serial".to_string())?;
    // Positive and minimally encoded.
    serial[0] = 0x40 | (serial[0] & 0x3f);

    let mut alt = Vec::new();
    for dns in [host, "localhost"] {
        alt.extend(tlv(0x82, dns.as_bytes()));
    }
    let mut all_ips: Vec<IpAddr> = vec![IpAddr::from([127, 0, 0, 1])];
    for ip in ips {
        if !all_ips.contains(ip) {
            all_ips.push(*ip);
        }
    }
    for ip in &all_ips {
        match ip {
            IpAddr::V4(v4) => alt.extend(tlv(0x87, &v4.octets())),
            IpAddr::V6(v6) => alt.extend(tlv(0x87, &v6.octets())),
        }
    }
    let extensions = seq(&[
        // digitalSignature, keyEncipherment
        &extension(OID_KEY_USAGE, true, &[0x03, 0x02, 0x05, 0xa0]),
        &extension(OID_EXT_KEY_USAGE, false, &seq(&[OID_SERVER_AUTH])),
        &extension(OID_BASIC_CONSTRAINTS, true, &seq(&[])),
        &extension(OID_SUBJECT_ALT_NAME, false, &tlv(0x30, &alt)),
    ]);
    let unix = now
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let subject = name(&format!("{host}@{unix}"));
    let algorithm = seq(&[OID_ECDSA_SHA256]);
    let tbs = seq(&[
        &[0xa0, 0x03, 0x02, 0x01, 0x02], // version v3
        &tlv(0x02, &serial),
        &algorithm,
        &subject,
        &seq(&[
            &utc_time(now - Duration::from_secs(3600)),
            &utc_time(now + Duration::from_secs(365 * 24 * 3600)),
        ]),
        &subject,
        &seq(&[
            &seq(&[OID_EC_PUBLIC_KEY, OID_P256]),
            &bit_string(key.public_key().as_ref()),
        ]),
        &tlv(0xa3, &extensions),
    ]);
    let sig = key
        .sign(&rng, &tbs)
        .map_err(|_| "signing the certificate failed".to_string())?;
    Ok(SelfSigned {
        cert_der: seq(&[&tbs, &algorithm, &bit_string(sig.as_ref())]),
        key_pkcs8: pkcs8.as_ref().to_vec(),
    })
}

/// A new ECDSA P-256 key, PKCS#8 DER.
pub(crate) fn generate_key() -> Result<Vec<u8>, String> {
    let rng = SystemRandom::new();
    EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_ASN1_SIGNING, &rng)
        .map(|k| k.as_ref().to_vec())
        .map_err(|_| "generating an ECDSA P-256 key failed".to_string())
}

/// A certificate request's subject and names.
pub(crate) struct CsrSubject<'a> {
    pub(crate) organizations: &'a [&'a str],
    pub(crate) common_name: &'a str,
    pub(crate) dns_names: &'a [String],
    pub(crate) ips: &'a [IpAddr],
}

/// A PKCS#10 request signed by `key_pkcs8` (an ECDSA P-256 key): the DER
/// of the request and of the key's SubjectPublicKeyInfo. The subject lists
/// the organizations, then the CN, as Go writes a `pkix.Name`; DNS names
/// and IPs, if any, go in a subjectAltName extension request.
pub(crate) fn csr(
    key_pkcs8: &[u8],
    subject: &CsrSubject<'_>,
) -> Result<(Vec<u8>, Vec<u8>), String> {
    let rng = SystemRandom::new();
    let key = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_ASN1_SIGNING, key_pkcs8, &rng)
        .map_err(|_| "the key is not an ECDSA P-256 key in PKCS#8".to_string())?;
    let mut rdns = Vec::new();
    for o in subject.organizations {
        rdns.extend(tlv(
            0x31,
            &seq(&[OID_ORGANIZATION, &tlv(0x0c, o.as_bytes())]),
        ));
    }
    rdns.extend(tlv(
        0x31,
        &seq(&[OID_COMMON_NAME, &tlv(0x0c, subject.common_name.as_bytes())]),
    ));
    let spki = seq(&[
        &seq(&[OID_EC_PUBLIC_KEY, OID_P256]),
        &bit_string(key.public_key().as_ref()),
    ]);
    let mut alt = Vec::new();
    for dns in subject.dns_names {
        alt.extend(tlv(0x82, dns.as_bytes()));
    }
    for ip in subject.ips {
        match ip {
            IpAddr::V4(v4) => alt.extend(tlv(0x87, &v4.octets())),
            IpAddr::V6(v6) => alt.extend(tlv(0x87, &v6.octets())),
        }
    }
    // [0] attributes: an extensionRequest with the names, or none.
    let attributes = if alt.is_empty() {
        tlv(0xa0, &[])
    } else {
        let extensions = seq(&[&extension(OID_SUBJECT_ALT_NAME, false, &tlv(0x30, &alt))]);
        tlv(
            0xa0,
            &seq(&[OID_EXTENSION_REQUEST, &tlv(0x31, &extensions)]),
        )
    };
    let info = seq(&[&[0x02, 0x01, 0x00], &tlv(0x30, &rdns), &spki, &attributes]);
    let sig = key
        .sign(&rng, &info)
        .map_err(|_| "signing the certificate request failed".to_string())?;
    let algorithm = seq(&[OID_ECDSA_SHA256]);
    Ok((seq(&[&info, &algorithm, &bit_string(sig.as_ref())]), spki))
}

/// PEM text of one DER block.
pub(crate) fn pem(label: &str, der: &[u8]) -> String {
    use base64::Engine as _;
    let b64 = base64::engine::general_purpose::STANDARD.encode(der);
    let mut out = format!("-----BEGIN {label}-----\n");
    for line in b64.as_bytes().chunks(64) {
        out.push_str(&String::from_utf8_lossy(line));
        out.push('\n');
    }
    out.push_str(&format!("-----END {label}-----\n"));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// openssl's reading of a request: `openssl req -text -verify`.
    fn openssl_reads(der: &[u8]) -> String {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("r.der"), der).unwrap();
        let out = std::process::Command::new("openssl")
            .args(["req", "-inform", "DER", "-noout", "-text", "-verify", "-in"])
            .arg(dir.path().join("r.der"))
            .output()
            .expect("run openssl");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let mut text = String::from_utf8_lossy(&out.stdout).into_owned();
        text.push_str(&String::from_utf8_lossy(&out.stderr));
        // OpenSSL 3.0 writes `O = x`, 3.5 (Debian 13) `O=x`.
        text.replace(" = ", "=")
    }

    #[test]
    fn a_client_request_has_the_node_subject_and_no_names() {
        let key = generate_key().unwrap();
        let subject = CsrSubject {
            organizations: &["system:nodes"],
            common_name: "system:node:edge-1",
            dns_names: &[],
            ips: &[],
        };
        let (der, spki) = csr(&key, &subject).unwrap();
        let text = openssl_reads(&der);
        assert!(
            text.contains("verify OK")
                || text.contains("Certificate request self-signature verify OK"),
            "{text}"
        );
        assert!(
            text.contains("Subject: O=system:nodes, CN=system:node:edge-1"),
            "{text}"
        );
        assert!(text.contains("ecdsa-with-SHA256"), "{text}");
        assert!(!text.contains("Subject Alternative Name"), "{text}");
        // The SPKI is the key's public half.
        let rng = SystemRandom::new();
        let pair = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_ASN1_SIGNING, &key, &rng).unwrap();
        assert!(spki.ends_with(pair.public_key().as_ref()));
        // The request's key reads back as the one it was made with.
        assert_eq!(crate::x509::request_public_key(&der).unwrap(), &spki[..]);
        for n in 0..der.len() {
            let _ = crate::x509::request_public_key(&der[..n]);
        }
        // Another key gives another request.
        let (other, _) = csr(&generate_key().unwrap(), &subject).unwrap();
        assert_ne!(der, other);
        assert!(csr(b"not a key", &subject).is_err());
    }

    #[test]
    fn a_serving_request_carries_its_names() {
        let key = generate_key().unwrap();
        let ips: Vec<IpAddr> = vec!["10.1.2.3".parse().unwrap(), "fd00::1".parse().unwrap()];
        let (der, _) = csr(
            &key,
            &CsrSubject {
                organizations: &["system:nodes"],
                common_name: "system:node:edge-1",
                dns_names: &["edge-1".to_string()],
                ips: &ips,
            },
        )
        .unwrap();
        let text = openssl_reads(&der);
        assert!(text.contains("X509v3 Subject Alternative Name"), "{text}");
        assert!(
            // The IPv6 address as OpenSSL 3.0 (FD00:0:0:0:0:0:0:1) or later (FD00::1) writes it.
            text.contains("DNS:edge-1, IP Address:10.1.2.3, IP Address:FD00:")
                && (text.contains("FD00:0:0:0:0:0:0:1") || text.contains("FD00::1")),
            "{text}"
        );
    }

    #[test]
    fn lengths_are_der() {
        assert_eq!(tlv(0x04, &[1, 2]), [0x04, 2, 1, 2]);
        let long = tlv(0x04, &[0u8; 300]);
        assert_eq!(&long[..4], &[0x04, 0x82, 0x01, 0x2c]);
    }

    #[test]
    fn a_generated_certificate_verifies_for_its_names_with_rustls() {
        let ip: IpAddr = "10.1.2.3".parse().unwrap();
        let pair = self_signed("edge-1", &[ip], SystemTime::now()).unwrap();
        let cert = rustls::pki_types::CertificateDer::from(pair.cert_der.clone());
        let ee = webpki_like_check(&cert);
        assert!(ee, "rustls refused the certificate");
        // The key is one rustls can serve with.
        let key = rustls::pki_types::PrivateKeyDer::Pkcs8(pair.key_pkcs8.clone().into());
        rustls::crypto::ring::sign::any_supported_type(&key).unwrap();
    }

    /// The certificate as a trust anchor and end entity at once, checked by
    /// rustls' own WebPKI verifier for each of its names.
    fn webpki_like_check(cert: &rustls::pki_types::CertificateDer<'static>) -> bool {
        use rustls::client::danger::ServerCertVerifier;
        let mut roots = rustls::RootCertStore::empty();
        if roots.add(cert.clone()).is_err() {
            return false;
        }
        let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
        let Ok(v) = rustls::client::WebPkiServerVerifier::builder_with_provider(
            std::sync::Arc::new(roots),
            provider,
        )
        .build() else {
            return false;
        };
        ["edge-1", "localhost", "127.0.0.1", "10.1.2.3"]
            .iter()
            .all(|n| {
                let name = rustls::pki_types::ServerName::try_from(*n).unwrap();
                v.verify_server_cert(cert, &[], &name, &[], rustls::pki_types::UnixTime::now())
                    .is_ok()
            })
    }
}
