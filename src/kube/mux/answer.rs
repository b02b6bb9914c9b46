//! The watch multiplexer's reading of answers: the head, a list's body,
//! a watch's event lines (one at a time, a line over the cap read past
//! with only its type, name and version kept), and what each event does to
//! the watch.

use std::time::Instant;

use log::{error, warn};
use serde_json::Value;

use super::{Engine, Failure, Phase, Req, MAX_ERROR_BODY, MAX_LIST_BODY, SHORT_WATCH};
use crate::kube::list::{read_list, ListError, ListItem, ValueScanner, MAX_OBJECT};
use crate::kube::nbhttp::Body;
use crate::kube::reflector::{check_rv, resource_version};
use crate::kube::watch::{decode_event, EVENT_IDENTITY};
use crate::kube::{ApiError, ErrorKind, WatchEvent};

impl Engine {
    /// Takes whatever of the answer has arrived.
    pub(super) fn take_answer(&mut self, id: u64, now: Instant) {
        let Some(w) = self.watches.get_mut(&id) else {
            return;
        };
        let (Phase::Out(out), Some(conn)) = (&mut w.phase, w.conn.as_mut()) else {
            return;
        };
        if out.head.is_none() {
            match conn.head() {
                Ok(None) => return,
                Ok(Some(h)) => {
                    crate::metrics::rest_client_request(
                        Some(h.status),
                        "GET",
                        &self.endpoint.authority,
                    );
                    if h.status == 401
                        && !out.retried_401
                        && self
                            .client
                            .token_after_401("GET", &out.path, out.bearer.as_deref())
                    {
                        let (req, quorum) = (out.req, out.quorum);
                        // The answer is not read: a new connection.
                        w.conn = None;
                        self.send(id, req, quorum, now, true);
                        return;
                    }
                    if (200..300).contains(&h.status) && out.req == Req::Watch {
                        out.deadline = now + out.idle;
                    } else {
                        out.deadline = now + self.client.request_timeout();
                    }
                    out.head = Some(h);
                }
                Err(what) => {
                    let e = self.transport_of(id, &what);
                    if let Some(w) = self.watches.get_mut(&id) {
                        w.conn = None;
                    }
                    self.fail(id, Failure::Api(e), now);
                    return;
                }
            }
        }
        let Some(head) = out.head.clone() else {
            return;
        };
        let ok = (200..300).contains(&head.status);
        if ok && out.req == Req::Watch {
            self.take_watch_body(id, now);
            return;
        }
        // A list, or an error: the whole body, capped.
        let cap = if ok { MAX_LIST_BODY } else { MAX_ERROR_BODY };
        let mut over = false;
        let buf = &mut out.buf;
        let taken = conn.take_body(&mut |b| {
            if buf.len() + b.len() > cap {
                over = true;
            } else {
                buf.extend_from_slice(b);
            }
        });
        if over {
            let e = ApiError {
                verb: "GET",
                path: out.path.clone(),
                kind: ErrorKind::Decode(format!("the answer is larger than {cap} bytes")),
            };
            w.conn = None;
            self.fail(id, Failure::Api(e), now);
            return;
        }
        match taken {
            Ok(Body::More) => {}
            Ok(Body::Done) => {
                let body = std::mem::take(&mut out.buf);
                if head.close {
                    w.conn = None;
                }
                if ok {
                    self.listed(id, &body, now);
                } else {
                    let e = ApiError {
                        verb: "GET",
                        path: out.path.clone(),
                        kind: crate::kube::client::status_kind(
                            head.status,
                            "",
                            head.retry_after,
                            &body,
                        ),
                    };
                    let f = if e.is_gone() {
                        Failure::Gone(e.to_string())
                    } else {
                        Failure::Api(e)
                    };
                    self.fail(id, f, now);
                }
            }
            Err(what) => {
                let e = self.transport_of(id, &what);
                if let Some(w) = self.watches.get_mut(&id) {
                    w.conn = None;
                }
                self.fail(id, Failure::Api(e), now);
            }
        }
    }

    /// A list answer: hand the object on and watch from its version.
    fn listed(&mut self, id: u64, body: &[u8], now: Instant) {
        let Some(w) = self.watches.get_mut(&id) else {
            return;
        };
        let Phase::Out(out) = &w.phase else {
            return;
        };
        let path = out.path.clone();
        let mut found = None;
        let mut problem = None;
        let name = w.name.clone();
        let meta = read_list(&mut &body[..], MAX_OBJECT, &mut |item| match item {
            ListItem::Object(obj) => {
                let named = obj
                    .get("metadata")
                    .and_then(|m| m.get("name"))
                    .and_then(Value::as_str)
                    == Some(name.as_str());
                if named {
                    found = Some(obj);
                } else {
                    problem = Some("an item outside the field selector".to_string());
                }
            }
            ListItem::TooLarge { index, key, bytes } => {
                problem = Some(format!(
                    "items[{index}] {key:?}: {bytes} bytes, over the {MAX_OBJECT}-byte limit of one object"
                ));
            }
        });
        let meta = match meta {
            Ok(m) => m,
            Err(e) => {
                let e = ApiError {
                    verb: "GET",
                    path,
                    kind: match e {
                        ListError::Read(e) => ErrorKind::Transport(e.to_string()),
                        ListError::Invalid(m) => ErrorKind::Decode(m),
                    },
                };
                self.fail(id, Failure::Api(e), now);
                return;
            }
        };
        if let Some(p) = problem {
            error!("watch-mux: GET {path}: skipping {p}");
        }
        if let Err(e) = check_rv(&meta.resource_version) {
            let e = ApiError {
                verb: "GET",
                path,
                kind: ErrorKind::Decode(format!("the list's {e}")),
            };
            self.fail(id, Failure::Api(e), now);
            return;
        }
        w.rv = Some(meta.resource_version);
        w.failures = 0;
        w.backoff = self.timing.backoff_start;
        w.phase = Phase::Waiting {
            at: now,
            next: Req::Watch,
            quorum: false,
            token: false,
        };
        (w.sink)(found);
        // Watch at once (on the same connection when it stays open).
        self.advance(id, now);
    }

    /// Takes the complete event lines of a watch's body.
    fn take_watch_body(&mut self, id: u64, now: Instant) {
        let Some(w) = self.watches.get_mut(&id) else {
            return;
        };
        let (Phase::Out(out), Some(conn)) = (&mut w.phase, w.conn.as_mut()) else {
            return;
        };
        let mut lines: Vec<Result<WatchEvent, ApiError>> = Vec::new();
        let path = out.path.clone();
        let taken = conn.take_body(&mut |mut data| {
            while !data.is_empty() {
                let nl = data.iter().position(|b| *b == b'\n');
                let piece = &data[..nl.unwrap_or(data.len())];
                data = match nl {
                    Some(i) => &data[i + 1..],
                    None => &[],
                };
                if let Some((scanner, bytes)) = &mut out.skipping {
                    let _ = scanner.feed(piece);
                    *bytes += piece.len() as u64;
                } else if out.buf.len() + piece.len() > crate::kube::watch::MAX_EVENT {
                    let mut scanner = ValueScanner::new(EVENT_IDENTITY);
                    let _ = scanner.feed(&out.buf);
                    let _ = scanner.feed(piece);
                    let bytes = (out.buf.len() + piece.len()) as u64;
                    out.buf = Vec::new();
                    out.skipping = Some((scanner, bytes));
                } else {
                    out.buf.extend_from_slice(piece);
                }
                if nl.is_none() {
                    break;
                }
                if let Some((scanner, bytes)) = out.skipping.take() {
                    let text = |i: usize| scanner.found(i).map(str::to_string);
                    lines.push(Ok(WatchEvent::TooLarge {
                        event_type: text(0).unwrap_or_default(),
                        key: scanner.key(1, 2),
                        resource_version: text(3),
                        bytes,
                    }));
                } else if !out.buf.iter().all(u8::is_ascii_whitespace) {
                    lines.push(decode_event(&out.buf, &path));
                    out.buf.clear();
                } else {
                    out.buf.clear();
                }
            }
        });
        if out.buf.capacity() > 64 * 1024 && out.buf.is_empty() {
            out.buf = Vec::new();
        }
        let ended = match taken {
            Ok(Body::Done) => Ok(()),
            Ok(Body::More) => Err(None),
            Err(what) => Err(Some(what)),
        };
        for event in lines {
            if !self.event(id, event, now) {
                return;
            }
        }
        match ended {
            Err(None) => {}
            Err(Some(what)) => {
                let e = self.transport_of(id, &what);
                if let Some(w) = self.watches.get_mut(&id) {
                    w.conn = None;
                }
                self.fail(id, Failure::Api(e), now);
            }
            Ok(()) => {
                let Some(w) = self.watches.get_mut(&id) else {
                    return;
                };
                let Phase::Out(out) = &w.phase else { return };
                if out.skipping.is_some() || !out.buf.is_empty() {
                    let e = self.transport_of(id, "the watch ended inside an event");
                    self.fail(id, Failure::Api(e), now);
                    return;
                }
                if out.events > 0 || now.duration_since(out.started) >= SHORT_WATCH {
                    w.backoff = self.timing.backoff_start;
                    w.failures = 0;
                    if out.head.as_ref().is_some_and(|h| h.close) {
                        w.conn = None;
                    }
                    w.phase = Phase::Waiting {
                        at: now,
                        next: Req::Watch,
                        quorum: false,
                        token: false,
                    };
                } else {
                    warn!(
                        "watch-mux: GET {}: the watch ended at once without an event",
                        out.path
                    );
                    let wait = self.next_backoff(id);
                    if let Some(w) = self.watches.get_mut(&id) {
                        w.phase = Phase::Waiting {
                            at: now + wait,
                            next: Req::Watch,
                            quorum: false,
                            token: false,
                        };
                    }
                }
            }
        }
    }

    /// Applies one watch event; false when the watch ended.
    fn event(&mut self, id: u64, event: Result<WatchEvent, ApiError>, now: Instant) -> bool {
        let Some(w) = self.watches.get_mut(&id) else {
            return false;
        };
        let Phase::Out(out) = &mut w.phase else {
            return false;
        };
        let path = out.path.clone();
        let named = |obj: &Value| {
            obj.get("metadata")
                .and_then(|m| m.get("name"))
                .and_then(Value::as_str)
                == Some(w.name.as_str())
        };
        let rv_of = |obj: &Value| {
            resource_version(obj)
                .and_then(|rv| check_rv(rv).ok())
                .map(str::to_string)
        };
        match event {
            Ok(WatchEvent::Added(obj)) | Ok(WatchEvent::Modified(obj)) => {
                out.events += 1;
                match (named(&obj), rv_of(&obj)) {
                    (true, Some(rv)) => {
                        w.rv = Some(rv);
                        w.backoff = self.timing.backoff_start;
                        w.failures = 0;
                        (w.sink)(Some(obj));
                    }
                    _ => error!(
                        "watch-mux: GET {path}: skipping an event for another object or one without a numeric metadata.resourceVersion"
                    ),
                }
            }
            Ok(WatchEvent::Deleted(obj)) => {
                out.events += 1;
                match (named(&obj), rv_of(&obj)) {
                    (true, Some(rv)) => {
                        w.rv = Some(rv);
                        (w.sink)(None);
                    }
                    _ => error!(
                        "watch-mux: GET {path}: skipping a DELETED event for another object or one without a numeric metadata.resourceVersion"
                    ),
                }
            }
            Ok(WatchEvent::Bookmark { resource_version }) => match check_rv(&resource_version) {
                Ok(_) => w.rv = Some(resource_version),
                Err(e) => error!("watch-mux: GET {path}: skipping a BOOKMARK: {e}"),
            },
            Ok(WatchEvent::TooLarge {
                event_type,
                key,
                resource_version,
                bytes,
            }) => {
                out.events += 1;
                error!(
                    "watch-mux: GET {path}: skipping a {event_type} event for {key:?}: {bytes} bytes, over the {MAX_OBJECT}-byte limit of one object"
                );
                let rv = resource_version.filter(|rv| check_rv(rv).is_ok());
                let name_ok = key.rsplit('/').next() == Some(w.name.as_str());
                if event_type == "DELETED" && name_ok {
                    if let Some(rv) = rv {
                        w.rv = Some(rv);
                        (w.sink)(None);
                    }
                }
                crate::malloc::give_back();
            }
            Ok(WatchEvent::Error(e)) | Err(e) => {
                // The stream is over: the server ends it after an ERROR,
                // and a line that is not an event leaves nothing to trust.
                w.conn = None;
                let f = if e.is_gone() {
                    Failure::Gone(e.to_string())
                } else {
                    Failure::Api(e)
                };
                self.fail(id, f, now);
                return false;
            }
        }
        true
    }
}
