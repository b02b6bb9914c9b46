//! Protobuf answers (`application/vnd.kubernetes.protobuf`) for a client that
//! asks for them first in its Accept header, as the real server gives them:
//! the `k8s\0` envelope around a `runtime.Unknown` whose `raw` is the
//! object's message, with the field numbers of k8s.io/api's and
//! apimachinery's generated.proto. Only the kinds a node asks for in
//! protobuf are encoded — Lease and Status — with the fields they carry
//! here; any other answer stays JSON, which the client also accepts (the
//! real server would encode every built-in kind).

use ::protobuf::CodedOutputStream;

use super::*;

pub(super) const MEDIA_TYPE: &str = "application/vnd.kubernetes.protobuf";

/// Whether an Accept header puts protobuf before JSON (or names no JSON).
pub(super) fn asked(accept: Option<&str>) -> bool {
    let Some(accept) = accept else { return false };
    let at = |t: &str| {
        accept
            .split(',')
            .position(|p| p.split(';').next().unwrap_or("").trim() == t)
    };
    match (at(MEDIA_TYPE), at("application/json")) {
        (Some(p), Some(j)) => p < j,
        (Some(_), None) => true,
        _ => false,
    }
}

/// The protobuf answer for a JSON object of a kind encoded here.
pub(super) fn encode(object: &Value) -> Option<Vec<u8>> {
    let (api_version, raw) = match object["kind"].as_str()? {
        "Lease" => ("coordination.k8s.io/v1", lease(object)),
        "Status" => ("v1", status(object)),
        _ => return None,
    };
    let kind = object["kind"].as_str()?;
    let type_meta = message(|s| {
        string(s, 1, api_version);
        string(s, 2, kind);
    });
    let mut out = b"k8s\0".to_vec();
    out.extend(message(|s| {
        bytes(s, 1, &type_meta);
        bytes(s, 2, &raw);
        string(s, 3, "");
        string(s, 4, "");
    }));
    Some(out)
}

fn lease(object: &Value) -> Vec<u8> {
    let spec = &object["spec"];
    let spec = message(|s| {
        if let Some(h) = spec["holderIdentity"].as_str() {
            string(s, 1, h);
        }
        if let Some(d) = spec["leaseDurationSeconds"].as_i64() {
            s.write_int32(2, d as i32).unwrap();
        }
        for (n, key) in [(3, "acquireTime"), (4, "renewTime")] {
            if let Some(t) = spec[key].as_str() {
                bytes(s, n, &time(t));
            }
        }
        if let Some(n) = spec["leaseTransitions"].as_i64() {
            s.write_int32(5, n as i32).unwrap();
        }
    });
    message(|s| {
        bytes(s, 1, &object_meta(&object["metadata"]));
        bytes(s, 2, &spec);
    })
}

fn object_meta(meta: &Value) -> Vec<u8> {
    message(|s| {
        for (n, key) in [
            (1, "name"),
            (3, "namespace"),
            (5, "uid"),
            (6, "resourceVersion"),
        ] {
            if let Some(v) = meta[key].as_str() {
                string(s, n, v);
            }
        }
        if let Some(t) = meta["creationTimestamp"].as_str() {
            bytes(s, 8, &time(t));
        }
        for r in meta["ownerReferences"].as_array().into_iter().flatten() {
            let owner = message(|s| {
                for (n, key) in [(1, "kind"), (3, "name"), (4, "uid"), (5, "apiVersion")] {
                    if let Some(v) = r[key].as_str() {
                        string(s, n, v);
                    }
                }
            });
            bytes(s, 13, &owner);
        }
        for m in meta["managedFields"].as_array().into_iter().flatten() {
            let entry = message(|s| {
                for (n, key) in [
                    (1, "manager"),
                    (2, "operation"),
                    (3, "apiVersion"),
                    (6, "fieldsType"),
                ] {
                    if let Some(v) = m[key].as_str() {
                        string(s, n, v);
                    }
                }
                if let Some(t) = m["time"].as_str() {
                    bytes(s, 4, &time(t));
                }
                if m["fieldsV1"].is_object() {
                    let raw = m["fieldsV1"].to_string();
                    bytes(s, 7, &message(|s| bytes(s, 1, raw.as_bytes())));
                }
            });
            bytes(s, 17, &entry);
        }
    })
}

fn status(object: &Value) -> Vec<u8> {
    message(|s| {
        bytes(s, 1, &[]);
        for (n, key) in [(2, "status"), (3, "message"), (4, "reason")] {
            if let Some(v) = object[key].as_str() {
                string(s, n, v);
            }
        }
        let d = &object["details"];
        if d.is_object() {
            let details = message(|s| {
                for (n, key) in [(1, "name"), (2, "group"), (3, "kind")] {
                    if let Some(v) = d[key].as_str() {
                        string(s, n, v);
                    }
                }
                for c in d["causes"].as_array().into_iter().flatten() {
                    let cause = message(|s| {
                        for (n, key) in [(1, "reason"), (2, "message"), (3, "field")] {
                            if let Some(v) = c[key].as_str() {
                                string(s, n, v);
                            }
                        }
                    });
                    bytes(s, 4, &cause);
                }
                if let Some(r) = d["retryAfterSeconds"].as_i64() {
                    s.write_int32(5, r as i32).unwrap();
                }
            });
            bytes(s, 5, &details);
        }
        if let Some(c) = object["code"].as_i64() {
            s.write_int32(6, c as i32).unwrap();
        }
    })
}

/// A `Time` or `MicroTime` message: seconds 1, nanos 2.
fn time(text: &str) -> Vec<u8> {
    let Ok(t) = text.parse::<Timestamp>() else {
        return Vec::new();
    };
    message(|s| {
        s.write_int64(1, t.as_second()).unwrap();
        if t.subsec_nanosecond() != 0 {
            s.write_int32(2, t.subsec_nanosecond()).unwrap();
        }
    })
}

fn message(write: impl FnOnce(&mut CodedOutputStream<'_>)) -> Vec<u8> {
    let mut out = Vec::new();
    {
        let mut s = CodedOutputStream::vec(&mut out);
        write(&mut s);
        s.flush().unwrap();
    }
    out
}

// Go's encoder writes a message's string and bytes fields even when empty
// (gogo-protobuf's non-nullable fields), as the recorded answers show.
fn string(s: &mut CodedOutputStream<'_>, n: u32, v: &str) {
    s.write_string(n, v).unwrap();
}

fn bytes(s: &mut CodedOutputStream<'_>, n: u32, v: &[u8]) {
    s.write_bytes(n, v).unwrap();
}
