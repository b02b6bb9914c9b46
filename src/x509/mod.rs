//! X.509 as tinylet reads it: a small DER reader for what it needs from a
//! certificate (the subject's CN and O for client certificates, the
//! validity for rotation), written for these few fields instead of a
//! general parser. What it writes is in `write`.

mod write;

pub(crate) use write::{csr, generate_key, pem, self_signed, CsrSubject};

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// One DER element: (tag, contents, the rest after it).
pub(crate) fn der(buf: &[u8]) -> Result<(u8, &[u8], &[u8]), String> {
    let (&tag, rest) = buf.split_first().ok_or("truncated (no tag)")?;
    if tag & 0x1f == 0x1f {
        return Err(format!("unsupported multi-byte tag {tag:#04x}"));
    }
    let (&first, mut rest) = rest.split_first().ok_or("truncated (no length)")?;
    let len = if first < 0x80 {
        first as usize
    } else {
        let n = (first & 0x7f) as usize;
        if n == 0 || n > 4 {
            return Err(format!("unsupported length form {first:#04x}"));
        }
        if rest.len() < n {
            return Err("truncated length".into());
        }
        let len = rest[..n].iter().fold(0usize, |l, b| l << 8 | *b as usize);
        rest = &rest[n..];
        len
    };
    if rest.len() < len {
        return Err(format!(
            "element {tag:#04x} of {len} bytes, {} left",
            rest.len()
        ));
    }
    Ok((tag, &rest[..len], &rest[len..]))
}

/// The contents of an element that must have `want` as its tag.
pub(crate) fn expect<'a>(
    buf: &'a [u8],
    want: u8,
    what: &str,
) -> Result<(&'a [u8], &'a [u8]), String> {
    let (tag, body, rest) = der(buf).map_err(|e| format!("{what}: {e}"))?;
    if tag != want {
        return Err(format!(
            "{what}: expected tag {want:#04x}, found {tag:#04x}"
        ));
    }
    Ok((body, rest))
}

const OID_CN: &[u8] = &[0x55, 0x04, 0x03];
const OID_O: &[u8] = &[0x55, 0x04, 0x0a];

/// The subject's common name (the last one, none when empty) and
/// organizations, in order, from a certificate's DER.
pub(crate) fn subject(cert: &[u8]) -> Result<(Option<String>, Vec<String>), String> {
    let (certificate, _) = expect(cert, 0x30, "Certificate")?;
    let (tbs, _) = expect(certificate, 0x30, "TBSCertificate")?;
    let mut rest = tbs;
    // [0] EXPLICIT version, optional.
    if rest.first() == Some(&0xa0) {
        rest = der(rest).map_err(|e| format!("version: {e}"))?.2;
    }
    for what in ["serialNumber", "signature", "issuer", "validity"] {
        rest = der(rest).map_err(|e| format!("{what}: {e}"))?.2;
    }
    let (mut name, _) = expect(rest, 0x30, "subject")?;
    let (mut cn, mut orgs) = (None, Vec::new());
    while !name.is_empty() {
        let (rdn, after) = expect(name, 0x31, "subject RDN")?;
        name = after;
        let mut rdn = rdn;
        while !rdn.is_empty() {
            let (atv, after) = expect(rdn, 0x30, "subject attribute")?;
            rdn = after;
            let (oid, value) = expect(atv, 0x06, "attribute type")?;
            if oid != OID_CN && oid != OID_O {
                continue;
            }
            let (tag, bytes, _) = der(value).map_err(|e| format!("attribute value: {e}"))?;
            let text = directory_string(tag, bytes)?;
            if oid == OID_CN {
                cn = Some(text);
            } else {
                orgs.push(text);
            }
        }
    }
    Ok((cn.filter(|c| !c.is_empty()), orgs))
}

/// A DirectoryString (or IA5String) as text.
fn directory_string(tag: u8, bytes: &[u8]) -> Result<String, String> {
    match tag {
        // UTF8String, PrintableString, IA5String.
        0x0c | 0x13 | 0x16 => String::from_utf8(bytes.to_vec())
            .map_err(|_| format!("string {tag:#04x} is not valid UTF-8")),
        // T61String, read as Latin-1 as Go does.
        0x14 => Ok(bytes.iter().map(|&b| b as char).collect()),
        // BMPString: UTF-16BE.
        0x1e if bytes.len().is_multiple_of(2) => {
            let units = bytes.chunks(2).map(|c| u16::from_be_bytes([c[0], c[1]]));
            char::decode_utf16(units)
                .collect::<Result<String, _>>()
                .map_err(|_| "BMPString is not valid UTF-16".to_string())
        }
        _ => Err(format!("unsupported string type {tag:#04x}")),
    }
}

/// The SubjectPublicKeyInfo of a PKCS#10 request (its whole DER element).
pub(crate) fn request_public_key(csr: &[u8]) -> Result<&[u8], String> {
    let (request, _) = expect(csr, 0x30, "CertificationRequest")?;
    let (info, _) = expect(request, 0x30, "CertificationRequestInfo")?;
    let rest = der(info).map_err(|e| format!("version: {e}"))?.2;
    let rest = der(rest).map_err(|e| format!("subject: {e}"))?.2;
    let (_, body, after) = der(rest).map_err(|e| format!("subjectPKInfo: {e}"))?;
    let header = rest.len() - body.len() - after.len();
    Ok(&rest[..header + body.len()])
}

/// The validity of a certificate from its DER: (notBefore, notAfter).
pub fn validity(cert: &[u8]) -> Result<(SystemTime, SystemTime), String> {
    let (certificate, _) = expect(cert, 0x30, "Certificate")?;
    let (tbs, _) = expect(certificate, 0x30, "TBSCertificate")?;
    let mut rest = tbs;
    if rest.first() == Some(&0xa0) {
        rest = der(rest).map_err(|e| format!("version: {e}"))?.2;
    }
    for what in ["serialNumber", "signature", "issuer"] {
        rest = der(rest).map_err(|e| format!("{what}: {e}"))?.2;
    }
    let (validity, _) = expect(rest, 0x30, "validity")?;
    let (tag, not_before, rest) = der(validity).map_err(|e| format!("notBefore: {e}"))?;
    let not_before = time(tag, not_before).map_err(|e| format!("notBefore: {e}"))?;
    let (tag, not_after, _) = der(rest).map_err(|e| format!("notAfter: {e}"))?;
    let not_after = time(tag, not_after).map_err(|e| format!("notAfter: {e}"))?;
    Ok((not_before, not_after))
}

/// A UTCTime (`YYMMDDHHMMSSZ`, years 1950–2049) or GeneralizedTime
/// (`YYYYMMDDHHMMSSZ`), the two forms RFC 5280 allows.
fn time(tag: u8, bytes: &[u8]) -> Result<SystemTime, String> {
    let text = std::str::from_utf8(bytes).map_err(|_| "time is not ASCII".to_string())?;
    let digits = text
        .strip_suffix('Z')
        .filter(|d| d.bytes().all(|b| b.is_ascii_digit()))
        .ok_or_else(|| format!("time {text:?} is not digits ending in Z"))?;
    let full = match (tag, digits.len()) {
        (0x17, 12) => {
            let yy: u32 = digits[..2].parse().map_err(|_| "bad year")?;
            let century = if yy < 50 { "20" } else { "19" };
            format!("{century}{digits}")
        }
        (0x18, 14) => digits.to_string(),
        _ => {
            return Err(format!(
                "time {text:?} with tag {tag:#04x} is not UTCTime or GeneralizedTime"
            ))
        }
    };
    let n = |r: std::ops::Range<usize>| full[r].parse::<i64>().unwrap_or(-1);
    let (year, month, day) = (n(0..4), n(4..6), n(6..8));
    let (hour, minute, second) = (n(8..10), n(10..12), n(12..14));
    if !(1..=12).contains(&month)
        || !(1..=31).contains(&day)
        || hour > 23
        || minute > 59
        || second > 60
    {
        return Err(format!("time {text:?} is out of range"));
    }
    // Days since 1970-01-01 in the proleptic Gregorian calendar.
    let (y, m) = if month <= 2 {
        (year - 1, month + 9)
    } else {
        (year, month - 3)
    };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * m + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    let secs = days * 86_400 + hour * 3600 + minute * 60 + second;
    let secs = u64::try_from(secs).map_err(|_| format!("time {text:?} is before 1970"))?;
    Ok(UNIX_EPOCH + Duration::from_secs(secs))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_in_both_forms_read_as_unix_seconds() {
        let at = |tag, s: &str| {
            time(tag, s.as_bytes()).map(|t| t.duration_since(UNIX_EPOCH).unwrap().as_secs())
        };
        assert_eq!(at(0x17, "700101000000Z"), Ok(0));
        assert_eq!(at(0x17, "261128183455Z"), Ok(1_795_890_895));
        assert_eq!(at(0x18, "20261128183455Z"), Ok(1_795_890_895));
        assert_eq!(at(0x17, "000229120000Z"), Ok(951_825_600));
        assert_eq!(at(0x18, "99991231235959Z"), Ok(253_402_300_799));
        for bad in [
            "",
            "Z",
            "2611281834Z",
            "261328183455Z",
            "261128183455",
            "26112818345xZ",
        ] {
            assert!(at(0x17, bad).is_err(), "{bad}");
        }
        assert!(at(0x18, "261128183455Z").is_err());
        assert!(at(0x17, "491231235959Z").is_ok());
        assert!(at(0x18, "19691231235959Z").is_err());
    }

    #[test]
    fn validity_is_read_from_an_openssl_certificate() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("c.der");
        let status = std::process::Command::new("openssl")
            .args(["req", "-x509", "-nodes", "-days", "3"])
            .args(["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"])
            .arg("-keyout")
            .arg(dir.path().join("k.pem"))
            .args(["-subj", "/CN=x", "-outform", "DER", "-out"])
            .arg(&out)
            .stderr(std::process::Stdio::null())
            .status()
            .expect("run openssl");
        assert!(status.success());
        let der = std::fs::read(out).unwrap();
        let (from, to) = validity(&der).unwrap();
        let now = SystemTime::now();
        assert!(from <= now && now.duration_since(from).unwrap() < Duration::from_secs(120));
        let life = to.duration_since(from).unwrap();
        assert_eq!(life, Duration::from_secs(3 * 86_400));
        for n in 0..der.len() {
            assert!(validity(&der[..n]).is_err(), "truncated at {n}");
        }
    }
}
