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

// Go's encoder (gogo-protobuf, proto2 with non-nullable fields) writes
// every string, number and embedded message of a struct even when empty or
// zero; only pointer fields (the LeaseSpec's, a Status's details) and maps
// and lists are left out when unset. The recorded answers
// (tests/fixtures/protobuf) show this layout, and the conformance tests
// hold the fake to it.

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
    let text = |key: &str| meta[key].as_str().unwrap_or("");
    message(|s| {
        for (n, key) in [
            (1, "name"),
            (2, "generateName"),
            (3, "namespace"),
            (4, "selfLink"),
            (5, "uid"),
            (6, "resourceVersion"),
        ] {
            string(s, n, text(key));
        }
        s.write_int64(7, meta["generation"].as_i64().unwrap_or(0))
            .unwrap();
        bytes(s, 8, &time(text("creationTimestamp")));
        for (n, key) in [(11, "labels"), (12, "annotations")] {
            for (k, v) in meta[key].as_object().into_iter().flatten() {
                let entry = message(|s| {
                    string(s, 1, k);
                    string(s, 2, v.as_str().unwrap_or(""));
                });
                bytes(s, n, &entry);
            }
        }
        for r in meta["ownerReferences"].as_array().into_iter().flatten() {
            let owner = message(|s| {
                for (n, key) in [(1, "kind"), (3, "name"), (4, "uid"), (5, "apiVersion")] {
                    string(s, n, r[key].as_str().unwrap_or(""));
                }
                for (n, key) in [(6, "controller"), (7, "blockOwnerDeletion")] {
                    if let Some(b) = r[key].as_bool() {
                        s.write_bool(n, b).unwrap();
                    }
                }
            });
            bytes(s, 13, &owner);
        }
        string(s, 15, text("clusterName"));
        for m in meta["managedFields"].as_array().into_iter().flatten() {
            let entry = message(|s| {
                for (n, key) in [(1, "manager"), (2, "operation"), (3, "apiVersion")] {
                    string(s, n, m[key].as_str().unwrap_or(""));
                }
                if let Some(t) = m["time"].as_str() {
                    bytes(s, 4, &time(t));
                }
                string(s, 6, m["fieldsType"].as_str().unwrap_or(""));
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
    let text = |v: &Value, key: &str| v[key].as_str().unwrap_or("").to_string();
    message(|s| {
        // ListMeta: selfLink, resourceVersion, continue.
        let list_meta = message(|s| {
            for n in 1..=3 {
                string(s, n, "");
            }
        });
        bytes(s, 1, &list_meta);
        for (n, key) in [(2, "status"), (3, "message"), (4, "reason")] {
            string(s, n, &text(object, key));
        }
        let d = &object["details"];
        if d.is_object() {
            let details = message(|s| {
                for (n, key) in [(1, "name"), (2, "group"), (3, "kind")] {
                    string(s, n, &text(d, key));
                }
                for c in d["causes"].as_array().into_iter().flatten() {
                    let cause = message(|s| {
                        for (n, key) in [(1, "reason"), (2, "message"), (3, "field")] {
                            string(s, n, &text(c, key));
                        }
                    });
                    bytes(s, 4, &cause);
                }
                s.write_int32(5, d["retryAfterSeconds"].as_i64().unwrap_or(0) as i32)
                    .unwrap();
                string(s, 6, &text(d, "uid"));
            });
            bytes(s, 5, &details);
        }
        s.write_int32(6, object["code"].as_i64().unwrap_or(0) as i32)
            .unwrap();
    })
}

/// A `Time` or `MicroTime` message: seconds 1, nanos 2.
fn time(text: &str) -> Vec<u8> {
    // An unset (zero) time is an empty message, as metav1.Time marshals it.
    let Ok(t) = text.parse::<Timestamp>() else {
        return Vec::new();
    };
    message(|s| {
        s.write_int64(1, t.as_second()).unwrap();
        s.write_int32(2, t.subsec_nanosecond()).unwrap();
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

fn string(s: &mut CodedOutputStream<'_>, n: u32, v: &str) {
    s.write_string(n, v).unwrap();
}

fn bytes(s: &mut CodedOutputStream<'_>, n: u32, v: &[u8]) {
    s.write_bytes(n, v).unwrap();
}
