//! The apiserver's protobuf answers (`application/vnd.kubernetes.protobuf`),
//! read for the few fields the node uses. The node asks for one only where
//! the bytes matter: the node lease's renewal, whose JSON answer (the whole
//! Lease with its managedFields) is most of the node's idle traffic.
//!
//! An answer is the four bytes `k8s\0` and a `runtime.Unknown`: its
//! `typeMeta` (1: apiVersion 1, kind 2), `raw` (2: the object's own
//! message), `contentEncoding` (3) and `contentType` (4). Of the objects only
//! these fields are read, by their numbers in k8s.io/api's and
//! apimachinery's generated.proto:
//! - `Lease`: metadata 1 (`ObjectMeta`: ownerReferences 13), spec 2
//!   (`LeaseSpec`: holderIdentity 1, leaseDurationSeconds 2);
//! - `Status`: message 3, reason 4, details 5 (`StatusDetails`:
//!   retryAfterSeconds 5), code 6.
//!
//! Everything else is skipped by its wire type, as any protobuf reader
//! does; a wire type that does not exist is an error.

use protobuf::CodedInputStream;

/// What is asked for where a protobuf answer is welcome: protobuf, or JSON
/// from a server or proxy that has no protobuf for it.
pub(crate) const ACCEPT: &str = "application/vnd.kubernetes.protobuf, application/json";

const MAGIC: &[u8] = b"k8s\0";

/// Whether `body` is a protobuf answer (a JSON one never starts so).
pub(crate) fn is_protobuf(body: &[u8]) -> bool {
    body.starts_with(MAGIC)
}

/// The object in a protobuf answer: its kind and its own message.
#[derive(Debug, PartialEq)]
pub(crate) struct Object {
    pub(crate) kind: String,
    pub(crate) raw: Vec<u8>,
}

/// Opens the envelope of a protobuf answer.
pub(crate) fn unwrap(body: &[u8]) -> Result<Object, String> {
    let rest = body
        .strip_prefix(MAGIC)
        .ok_or("not a protobuf answer: no k8s envelope")?;
    let mut s = CodedInputStream::from_bytes(rest);
    let mut kind = String::new();
    let mut raw = Vec::new();
    while let Some(tag) = s.read_raw_tag_or_eof().map_err(text)? {
        match (tag >> 3, tag & 7) {
            (1, 2) => kind = string_field(&s.read_bytes().map_err(text)?, 2)?,
            (2, 2) => raw = s.read_bytes().map_err(text)?,
            (3, 2) => {
                let encoding = s.read_string().map_err(text)?;
                if !encoding.is_empty() {
                    return Err(format!("content encoding {encoding:?} is not supported"));
                }
            }
            _ => skip(tag, &mut s)?,
        }
    }
    Ok(Object { kind, raw })
}

/// What a lease renewal compares with what it wants.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct LeaseFields {
    pub(crate) holder_identity: Option<String>,
    pub(crate) lease_duration_seconds: Option<i64>,
    pub(crate) has_owner: bool,
}

/// The fields of a `Lease` message.
pub(crate) fn lease(raw: &[u8]) -> Result<LeaseFields, String> {
    let mut out = LeaseFields::default();
    let mut s = CodedInputStream::from_bytes(raw);
    while let Some(tag) = s.read_raw_tag_or_eof().map_err(text)? {
        match (tag >> 3, tag & 7) {
            (1, 2) => {
                let meta = s.read_bytes().map_err(text)?;
                out.has_owner |= has_field(&meta, 13)?;
            }
            (2, 2) => {
                let spec = s.read_bytes().map_err(text)?;
                let mut s = CodedInputStream::from_bytes(&spec);
                while let Some(tag) = s.read_raw_tag_or_eof().map_err(text)? {
                    match (tag >> 3, tag & 7) {
                        (1, 2) => out.holder_identity = Some(s.read_string().map_err(text)?),
                        (2, 0) => {
                            out.lease_duration_seconds =
                                Some(i64::from(s.read_int32().map_err(text)?))
                        }
                        _ => skip(tag, &mut s)?,
                    }
                }
            }
            _ => skip(tag, &mut s)?,
        }
    }
    Ok(out)
}

/// The fields of a `Status` message the node's errors carry.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct StatusFields {
    pub(crate) message: String,
    pub(crate) reason: String,
    pub(crate) code: i32,
    pub(crate) retry_after_seconds: Option<i32>,
}

/// The fields of a `Status` message.
pub(crate) fn status(raw: &[u8]) -> Result<StatusFields, String> {
    let mut out = StatusFields::default();
    let mut s = CodedInputStream::from_bytes(raw);
    while let Some(tag) = s.read_raw_tag_or_eof().map_err(text)? {
        match (tag >> 3, tag & 7) {
            (3, 2) => out.message = s.read_string().map_err(text)?,
            (4, 2) => out.reason = s.read_string().map_err(text)?,
            (5, 2) => {
                let details = s.read_bytes().map_err(text)?;
                let mut s = CodedInputStream::from_bytes(&details);
                while let Some(tag) = s.read_raw_tag_or_eof().map_err(text)? {
                    match (tag >> 3, tag & 7) {
                        (5, 0) => out.retry_after_seconds = Some(s.read_int32().map_err(text)?),
                        _ => skip(tag, &mut s)?,
                    }
                }
            }
            (6, 0) => out.code = s.read_int32().map_err(text)?,
            _ => skip(tag, &mut s)?,
        }
    }
    Ok(out)
}

/// The string field `number` of a message (empty when absent).
fn string_field(message: &[u8], number: u32) -> Result<String, String> {
    let mut s = CodedInputStream::from_bytes(message);
    let mut out = String::new();
    while let Some(tag) = s.read_raw_tag_or_eof().map_err(text)? {
        if tag == number << 3 | 2 {
            out = s.read_string().map_err(text)?;
        } else {
            skip(tag, &mut s)?;
        }
    }
    Ok(out)
}

/// Whether a message has field `number` at least once.
fn has_field(message: &[u8], number: u32) -> Result<bool, String> {
    let mut s = CodedInputStream::from_bytes(message);
    let mut found = false;
    while let Some(tag) = s.read_raw_tag_or_eof().map_err(text)? {
        found |= tag >> 3 == number;
        skip(tag, &mut s)?;
    }
    Ok(found)
}

fn skip(tag: u32, s: &mut CodedInputStream<'_>) -> Result<(), String> {
    protobuf::rt::skip_field_for_tag(tag, s).map_err(text)
}

fn text(e: protobuf::Error) -> String {
    format!("invalid protobuf: {e}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use protobuf::CodedOutputStream;

    fn message(write: impl FnOnce(&mut CodedOutputStream<'_>)) -> Vec<u8> {
        let mut out = Vec::new();
        {
            let mut s = CodedOutputStream::vec(&mut out);
            write(&mut s);
            s.flush().unwrap();
        }
        out
    }

    fn envelope(kind: &str, raw: &[u8]) -> Vec<u8> {
        let type_meta = message(|s| {
            s.write_string(1, "v1").unwrap();
            s.write_string(2, kind).unwrap();
        });
        let mut out = MAGIC.to_vec();
        out.extend(message(|s| {
            s.write_bytes(1, &type_meta).unwrap();
            s.write_bytes(2, raw).unwrap();
            s.write_string(3, "").unwrap();
            s.write_string(4, "").unwrap();
        }));
        out
    }

    #[test]
    fn a_lease_gives_its_holder_duration_and_whether_it_has_an_owner() {
        let owner = message(|s| s.write_string(4, "Node").unwrap());
        let meta = message(|s| {
            s.write_string(1, "edge-1").unwrap();
            s.write_bytes(13, &owner).unwrap();
            s.write_string(6, "281").unwrap();
        });
        let time = message(|s| s.write_int64(1, 1_700_000_000).unwrap());
        let spec = message(|s| {
            s.write_string(1, "edge-1").unwrap();
            s.write_int32(2, 40).unwrap();
            s.write_bytes(4, &time).unwrap();
        });
        let raw = message(|s| {
            s.write_bytes(1, &meta).unwrap();
            s.write_bytes(2, &spec).unwrap();
        });
        let body = envelope("Lease", &raw);
        assert!(is_protobuf(&body));
        let object = unwrap(&body).unwrap();
        assert_eq!(object.kind, "Lease");
        assert_eq!(
            lease(&object.raw).unwrap(),
            LeaseFields {
                holder_identity: Some("edge-1".into()),
                lease_duration_seconds: Some(40),
                has_owner: true,
            }
        );
        let bare = message(|s| {
            s.write_bytes(1, &message(|s| s.write_string(1, "x").unwrap()))
                .unwrap()
        });
        assert_eq!(lease(&bare).unwrap(), LeaseFields::default());
    }

    #[test]
    fn a_status_gives_its_message_reason_code_and_retry() {
        let details = message(|s| {
            s.write_string(1, "edge-1").unwrap();
            s.write_int32(5, 3).unwrap();
        });
        let raw = message(|s| {
            s.write_string(2, "Failure").unwrap();
            s.write_string(3, "too many requests").unwrap();
            s.write_string(4, "TooManyRequests").unwrap();
            s.write_bytes(5, &details).unwrap();
            s.write_int32(6, 429).unwrap();
        });
        assert_eq!(
            status(&raw).unwrap(),
            StatusFields {
                message: "too many requests".into(),
                reason: "TooManyRequests".into(),
                code: 429,
                retry_after_seconds: Some(3),
            }
        );
    }

    fn recorded(name: &str) -> Vec<u8> {
        let path = format!(
            "{}/tests/fixtures/protobuf/{name}.pb",
            env!("CARGO_MANIFEST_DIR")
        );
        std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
    }

    /// Answers recorded from the real v1.20.2 server.
    #[test]
    fn the_real_servers_answers_decode() {
        let object = unwrap(&recorded("lease-patch-200")).unwrap();
        assert_eq!(object.kind, "Lease");
        assert_eq!(
            lease(&object.raw).unwrap(),
            LeaseFields {
                holder_identity: Some("edge-1".into()),
                lease_duration_seconds: Some(40),
                has_owner: false,
            }
        );
        let object = unwrap(&recorded("lease-patch-404")).unwrap();
        assert_eq!(object.kind, "Status");
        let s = status(&object.raw).unwrap();
        assert_eq!((s.code, s.reason.as_str()), (404, "NotFound"));
        assert_eq!(
            s.message,
            r#"leases.coordination.k8s.io "edge-1" not found"#
        );
        assert_eq!(s.retry_after_seconds, Some(0));
        let s = status(&unwrap(&recorded("lease-patch-403")).unwrap().raw).unwrap();
        assert_eq!((s.code, s.reason.as_str()), (403, "Forbidden"));
        assert!(s
            .message
            .ends_with("can only access node lease with the same name as the requesting node"));
    }

    #[test]
    fn broken_envelopes_are_errors_not_panics() {
        assert!(!is_protobuf(b"{\"kind\":\"Lease\"}"));
        assert!(unwrap(b"{}").is_err());
        let body = envelope("Lease", b"\x0a\x05ab");
        // The raw object is cut short: its reader says so.
        let object = unwrap(&body).unwrap();
        assert!(lease(&object.raw).is_err());
        let mut cut = envelope("Lease", &[0x12, 0x00]);
        cut.truncate(cut.len() - 3);
        assert!(unwrap(&cut).is_err());
        // Wire type 7 does not exist.
        assert!(status(&[0x0f]).is_err());
        let mut encoded = MAGIC.to_vec();
        encoded.extend(message(|s| s.write_string(3, "gzip").unwrap()));
        assert!(unwrap(&encoded).unwrap_err().contains("gzip"));
    }
}
