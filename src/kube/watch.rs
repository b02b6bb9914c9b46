//! Watch stream decoding: the body of a watch answer is a sequence of
//! `{"type":...,"object":{...}}` documents, each followed by a newline. The
//! chunks of the HTTP body do not line up with events, so the stream is read
//! line by line from a buffered reader, one event in memory at a time, with
//! a cap on the length of one line. A line over the cap is read past to its
//! newline without being kept (the apiserver escapes newlines inside JSON,
//! so one event is one line) and reported as [`WatchEvent::TooLarge`] with
//! the type and name found in it, and the stream goes on.

use std::io::{BufRead, BufReader, Read};

use serde_json::Value;

use super::list::ValueScanner;
use super::{status_from_value, ApiError, ErrorKind, WatchEvent};

/// The longest event we decode (a pod is a few KiB, a big ConfigMap 1 MiB):
/// the per-object cap of lists (see [`super::list::MAX_OBJECT`]).
pub const MAX_EVENT: usize = super::list::MAX_OBJECT;

/// The fields of an event that name it and its object.
pub(super) const EVENT_IDENTITY: &[&[&str]] = &[
    &["type"],
    &["object", "metadata", "namespace"],
    &["object", "metadata", "name"],
    &["object", "metadata", "resourceVersion"],
];

/// A line buffer that is this large after an event is dropped rather than
/// kept for the rest of the stream.
const KEEP_BUFFER: usize = 1024 * 1024;

/// The events of one watch request, decoded one at a time with bounded memory.
pub struct WatchStream {
    reader: BufReader<Box<dyn Read + Send>>,
    path: String,
    server: String,
    max_line: usize,
    line: Vec<u8>,
    /// Set after the end of the body or an error: no more events.
    done: bool,
}

/// What one read of a line gave.
enum Line {
    /// A complete line (or the last, unterminated one) is in the buffer.
    Some,
    /// The body ended with nothing pending.
    End,
    /// A line over the cap was read past, to its newline.
    TooLong(WatchEvent),
    /// The body ended inside a line over the cap.
    TooLongAtEnd(u64),
}

impl WatchStream {
    /// Events from the body `reader` of the watch request `path` to
    /// `server` (both for error messages); no line may be longer than
    /// `max_line` bytes ([`MAX_EVENT`] for the client's watches).
    pub fn new(
        reader: Box<dyn Read + Send>,
        path: &str,
        server: String,
        max_line: usize,
    ) -> WatchStream {
        WatchStream {
            reader: BufReader::with_capacity(64 * 1024, reader),
            path: path.to_string(),
            server,
            max_line,
            line: Vec::new(),
            done: false,
        }
    }

    /// True when the next event is already read in whole, so taking it
    /// will not wait for the network.
    pub fn has_buffered_event(&self) -> bool {
        self.reader.buffer().contains(&b'\n')
    }

    fn error(&self, kind: ErrorKind) -> ApiError {
        ApiError {
            verb: "GET",
            path: self.path.clone(),
            kind,
        }
    }

    /// Reads up to and including the next newline into `self.line` (without
    /// the newline), never holding more than `max_line` bytes.
    fn read_line(&mut self) -> std::io::Result<Line> {
        self.line.clear();
        if self.line.capacity() > KEEP_BUFFER {
            self.line = Vec::new();
        }
        loop {
            let available = self.reader.fill_buf()?;
            if available.is_empty() {
                return Ok(if self.line.is_empty() {
                    Line::End
                } else {
                    Line::Some
                });
            }
            let (take, found) = match available.iter().position(|b| *b == b'\n') {
                Some(i) => (i, true),
                None => (available.len(), false),
            };
            if self.line.len() + take > self.max_line {
                return self.skip_line();
            }
            self.line.extend_from_slice(&available[..take]);
            self.reader.consume(if found { take + 1 } else { take });
            if found {
                return Ok(Line::Some);
            }
        }
    }

    /// Reads past the rest of a line over the cap (what is in `self.line`
    /// and the reader's buffer is its start), keeping nothing of it but the
    /// fields that name it.
    fn skip_line(&mut self) -> std::io::Result<Line> {
        let mut scanner = ValueScanner::new(EVENT_IDENTITY);
        // The scanner stops at the end of the event's JSON or at a syntax
        // error; what it found so far is what is reported.
        let mut scanning = true;
        let mut scan = |scanner: &mut ValueScanner, data: &[u8]| {
            if scanning && !matches!(scanner.feed(data), Ok(None)) {
                scanning = false;
            }
        };
        scan(&mut scanner, &self.line);
        let mut bytes = self.line.len() as u64;
        // Drop the line's buffer rather than keep it for the stream.
        self.line = Vec::new();
        loop {
            let available = self.reader.fill_buf()?;
            if available.is_empty() {
                return Ok(Line::TooLongAtEnd(bytes));
            }
            let (take, found) = match available.iter().position(|b| *b == b'\n') {
                Some(i) => (i, true),
                None => (available.len(), false),
            };
            scan(&mut scanner, &available[..take]);
            bytes += take as u64;
            self.reader.consume(if found { take + 1 } else { take });
            if found {
                let text = |i: usize| scanner.found(i).map(str::to_string);
                return Ok(Line::TooLong(WatchEvent::TooLarge {
                    event_type: text(0).unwrap_or_default(),
                    key: scanner.key(1, 2),
                    resource_version: text(3),
                    bytes,
                }));
            }
        }
    }

    /// Decodes one event line.
    fn decode(&self, line: &[u8]) -> Result<WatchEvent, ApiError> {
        decode_event(line, &self.path)
    }
}

/// Decodes one event line of the watch request `path`.
pub(super) fn decode_event(line: &[u8], path: &str) -> Result<WatchEvent, ApiError> {
    let error = |kind: ErrorKind| ApiError {
        verb: "GET",
        path: path.to_string(),
        kind,
    };
    let decode_err = |m: String| error(ErrorKind::Decode(m));
    let mut event: Value = serde_json::from_slice(line)
        .map_err(|e| decode_err(format!("invalid watch event: {e}")))?;
    let kind = match event.get("type").and_then(Value::as_str) {
        Some(t) => t.to_string(),
        None => return Err(decode_err("a watch event without a type".into())),
    };
    let object = match event.get_mut("object").map(Value::take) {
        Some(o @ Value::Object(_)) => o,
        _ => {
            return Err(decode_err(format!(
                "a watch event of type {kind:?} without an object"
            )))
        }
    };
    match kind.as_str() {
        "ADDED" => Ok(WatchEvent::Added(object)),
        "MODIFIED" => Ok(WatchEvent::Modified(object)),
        "DELETED" => Ok(WatchEvent::Deleted(object)),
        "BOOKMARK" => {
            let rv = object
                .get("metadata")
                .and_then(|m| m.get("resourceVersion"))
                .and_then(Value::as_str)
                .filter(|rv| !rv.is_empty())
                .ok_or_else(|| decode_err("a BOOKMARK without metadata.resourceVersion".into()))?;
            Ok(WatchEvent::Bookmark {
                resource_version: rv.to_string(),
            })
        }
        // The Status of an ERROR event has its own code (410 for an
        // expired resourceVersion); 500 if it has none.
        "ERROR" if object.get("kind").and_then(Value::as_str) != Some("Status") => {
            Err(decode_err(format!(
                "an ERROR watch event whose object is not a Status (kind {})",
                object
                    .get("kind")
                    .map_or_else(|| "missing".to_string(), Value::to_string)
            )))
        }
        "ERROR" => Ok(WatchEvent::Error(error(status_from_value(
            &object, 500, None,
        )))),
        other => Err(decode_err(format!("unknown watch event type {other:?}"))),
    }
}

impl Iterator for WatchStream {
    type Item = Result<WatchEvent, ApiError>;

    fn next(&mut self) -> Option<Self::Item> {
        while !self.done {
            match self.read_line() {
                Ok(Line::End) => self.done = true,
                Ok(Line::TooLong(event)) => return Some(Ok(event)),
                Ok(Line::TooLongAtEnd(bytes)) => {
                    // Nothing to resynchronise on: the watch ends as when
                    // its connection drops, and starts again from the last
                    // version taken.
                    self.done = true;
                    return Some(Err(self.error(ErrorKind::Transport(format!(
                        "{}: the watch ended inside an event of {bytes} bytes, over the {}-byte limit",
                        self.server, self.max_line
                    )))));
                }
                Err(e) => {
                    self.done = true;
                    let e = ureq::Error::from(e);
                    return Some(Err(self.error(ErrorKind::Transport(format!(
                        "{}: reading the watch: {e}",
                        self.server
                    )))));
                }
                Ok(Line::Some) => {
                    if self.line.iter().all(u8::is_ascii_whitespace) {
                        continue;
                    }
                    let line = std::mem::take(&mut self.line);
                    let event = self.decode(&line);
                    self.line = line;
                    if event.is_err() {
                        self.done = true;
                    }
                    return Some(event);
                }
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io;

    use crate::kube::testserver::Pieces;

    fn stream(pieces: &[&str], max: usize) -> WatchStream {
        let r = Pieces(pieces.iter().map(|p| p.as_bytes().to_vec()).collect());
        WatchStream::new(
            Box::new(r),
            "/api/v1/pods?watch=true",
            "http://s".into(),
            max,
        )
    }

    #[test]
    fn events_split_across_reads_and_joined_in_one() {
        let s = stream(
            &[
                r#"{"type":"ADDED","object":{"metadata":{"na"#,
                r#"me":"a"}}}"#,
                "\n{\"type\":\"MODIFIED\",\"object\":{\"metadata\":{\"name\":\"b\"}}}\n{\"type\":\"DELETED\",\"object\":{\"metadata\":{\"name\":\"c\"}}}\n",
                "{\"type\":\"BOOKMARK\",\"object\":{\"metadata\":{\"resourceVersion\":\"9\"}}}\n",
            ],
            1024,
        );
        let events: Vec<_> = s.map(|e| e.unwrap()).collect();
        assert_eq!(
            events,
            vec![
                WatchEvent::Added(serde_json::json!({"metadata":{"name":"a"}})),
                WatchEvent::Modified(serde_json::json!({"metadata":{"name":"b"}})),
                WatchEvent::Deleted(serde_json::json!({"metadata":{"name":"c"}})),
                WatchEvent::Bookmark {
                    resource_version: "9".into()
                },
            ]
        );
    }

    #[test]
    fn an_event_over_the_cap_is_skipped_with_its_name_and_the_stream_goes_on() {
        // The name after the big field, as a server that sorts its keys
        // writes it.
        let long = format!(
            "{{\"type\":\"MODIFIED\",\"object\":{{\"metadata\":{{\"annotations\":{{\"a\":\"{}\"}},\"name\":\"big\",\"namespace\":\"ns\",\"resourceVersion\":\"12\"}}}}}}\n",
            "y\\\"\\n".repeat(100)
        );
        let next = "{\"type\":\"ADDED\",\"object\":{\"metadata\":{\"name\":\"a\"}}}\n";
        for piece in [1, 7, 64, 1000] {
            let body = format!("{long}{next}");
            let pieces: Vec<String> = body
                .as_bytes()
                .chunks(piece)
                .map(|c| String::from_utf8_lossy(c).into_owned())
                .collect();
            let pieces: Vec<&str> = pieces.iter().map(String::as_str).collect();
            let events: Vec<_> = stream(&pieces, 100).map(|e| e.unwrap()).collect();
            assert_eq!(
                events,
                vec![
                    WatchEvent::TooLarge {
                        event_type: "MODIFIED".into(),
                        key: "ns/big".into(),
                        resource_version: Some("12".into()),
                        bytes: long.len() as u64 - 1,
                    },
                    WatchEvent::Added(serde_json::json!({"metadata":{"name":"a"}})),
                ],
                "pieces of {piece}"
            );
        }
    }

    #[test]
    fn a_stream_that_ends_inside_an_event_over_the_cap_is_a_transport_error() {
        let long = format!(
            "{{\"type\":\"ADDED\",\"object\":{{\"x\":\"{}",
            "y".repeat(200)
        );
        let mut s = stream(&[&long], 100);
        let e = s.next().unwrap().unwrap_err();
        assert!(e.is_transport(), "{e}");
        assert_eq!(
            e.to_string(),
            "GET /api/v1/pods?watch=true: http://s: the watch ended inside an event of 231 bytes, over the 100-byte limit"
        );
        assert!(s.next().is_none());
    }

    #[test]
    fn unknown_type_and_garbage_name_the_request() {
        let mut s = stream(&["{\"type\":\"SURPRISE\",\"object\":{}}\n"], 100);
        assert_eq!(
            s.next().unwrap().unwrap_err().to_string(),
            "GET /api/v1/pods?watch=true: cannot decode the answer: unknown watch event type \"SURPRISE\""
        );
        assert!(s.next().is_none());
        let mut s = stream(&["not json\n"], 100);
        let e = s.next().unwrap().unwrap_err();
        assert!(matches!(e.kind, ErrorKind::Decode(_)), "{e}");
        let mut s = stream(
            &["{\"type\":\"ERROR\",\"object\":{\"kind\":\"Pod\",\"code\":410}}\n"],
            100,
        );
        assert_eq!(
            s.next().unwrap().unwrap_err().to_string(),
            "GET /api/v1/pods?watch=true: cannot decode the answer: an ERROR watch event whose object is not a Status (kind \"Pod\")"
        );
        let mut s = stream(&["{\"type\":\"BOOKMARK\",\"object\":{}}\n"], 100);
        assert_eq!(
            s.next().unwrap().unwrap_err().to_string(),
            "GET /api/v1/pods?watch=true: cannot decode the answer: a BOOKMARK without metadata.resourceVersion"
        );
    }

    #[test]
    fn last_line_without_newline_and_blank_lines() {
        let s = stream(&["\n\n{\"type\":\"ADDED\",\"object\":{}}"], 100);
        let events: Vec<_> = s.map(|e| e.unwrap()).collect();
        assert_eq!(events, vec![WatchEvent::Added(serde_json::json!({}))]);
    }

    #[test]
    fn read_error_is_a_transport_error() {
        struct Broken;
        impl Read for Broken {
            fn read(&mut self, _: &mut [u8]) -> io::Result<usize> {
                Err(io::Error::new(io::ErrorKind::ConnectionReset, "reset"))
            }
        }
        let mut s = WatchStream::new(Box::new(Broken), "/w", "http://s".into(), 10);
        let e = s.next().unwrap().unwrap_err();
        assert!(e.is_transport());
        assert_eq!(
            e.to_string(),
            "GET /w: http://s: reading the watch: io: reset"
        );
        assert!(s.next().is_none());
    }

    mod over_http {
        use super::*;
        use crate::kube::client::tests::client_for;
        use crate::kube::testserver::{fixture_body, fixture_lines, End, Reply, TestServer};
        use std::time::Duration;

        const PATH: &str = "/api/v1/pods?fieldSelector=spec.nodeName%3Dedge-1&resourceVersion=401&allowWatchBookmarks=true&timeoutSeconds=30&watch=true";

        fn rv_of(v: &Value) -> &str {
            v["metadata"]["resourceVersion"].as_str().unwrap()
        }

        #[test]
        fn a_recorded_stream_in_chunks_that_split_events() {
            let l = fixture_lines("05a-pods-watch-node-timeout30");
            assert_eq!(l.len(), 7);
            let cat = |parts: &[&[u8]]| parts.concat();
            let chunks = vec![
                l[0][..100].to_vec(),
                l[0][100..].to_vec(),
                // Two events in one chunk.
                cat(&[&l[1], &l[2]]),
                l[3][..10].to_vec(),
                cat(&[&l[3][10..], &l[4][..20]]),
                cat(&[&l[4][20..], &l[5], &l[6]]),
            ];
            let server = TestServer::start(move |_| Reply::Chunked {
                status: 200,
                chunks: chunks.clone(),
                end: End::Clean,
            });
            let stream = client_for(&server)
                .watch(PATH, Duration::from_secs(10))
                .unwrap();
            let events: Vec<WatchEvent> = stream.map(Result::unwrap).collect();
            assert_eq!(events.len(), 7, "{events:?}");
            let summary: Vec<String> = events
                .iter()
                .map(|e| match e {
                    WatchEvent::Added(v) => format!("ADDED {} {}", v["metadata"]["name"], rv_of(v)),
                    WatchEvent::Modified(v) => {
                        format!("MODIFIED {} {}", v["metadata"]["name"], rv_of(v))
                    }
                    WatchEvent::Deleted(v) => {
                        format!("DELETED {} {}", v["metadata"]["name"], rv_of(v))
                    }
                    WatchEvent::Bookmark { resource_version } => {
                        format!("BOOKMARK {resource_version}")
                    }
                    WatchEvent::Error(e) => format!("ERROR {e}"),
                    WatchEvent::TooLarge { key, .. } => format!("TOO LARGE {key}"),
                })
                .collect();
            assert_eq!(
                summary,
                [
                    "ADDED \"app-3\" 402",
                    "MODIFIED \"app-2\" 403",
                    "MODIFIED \"app-1\" 404",
                    "MODIFIED \"app-1\" 405",
                    "DELETED \"app-1\" 406",
                    "BOOKMARK 406",
                    "BOOKMARK 406",
                ]
            );
            assert_eq!(server.targets(), [PATH]);
        }

        #[test]
        fn an_error_410_event_carries_its_status() {
            let server = TestServer::start(|_| Reply::Chunked {
                status: 200,
                chunks: vec![fixture_body("06a-pods-watch-rv1-too-old")],
                end: End::Clean,
            });
            let mut stream = client_for(&server)
                .watch(
                    "/api/v1/pods?resourceVersion=1&watch=true",
                    Duration::from_secs(10),
                )
                .unwrap();
            let Some(Ok(WatchEvent::Error(e))) = stream.next() else {
                panic!("not an ERROR event")
            };
            assert!(e.is_gone());
            assert_eq!(
                e.to_string(),
                "GET /api/v1/pods?resourceVersion=1&watch=true: 410 Expired: too old resource version: 1 (388)"
            );
            assert!(stream.next().is_none());
        }

        #[test]
        fn a_watch_answered_with_an_error_status_is_err() {
            let server = TestServer::start(|_| {
                Reply::json(
                    410,
                    fixture_body("06d-pods-list-rv1-exact-after-compaction"),
                )
            });
            let e = client_for(&server)
                .watch("/api/v1/pods?watch=true", Duration::from_secs(10))
                .err()
                .unwrap();
            assert!(e.is_gone(), "{e}");
            assert_eq!(e.reason(), "Expired");
        }

        #[test]
        fn a_silent_connection_fails_after_the_idle_time() {
            let l = fixture_lines("05a-pods-watch-node-timeout30");
            let first = l[0].clone();
            let server = TestServer::start(move |_| Reply::Chunked {
                status: 200,
                chunks: vec![first.clone()],
                end: End::Silent,
            });
            let mut stream = client_for(&server)
                .watch(PATH, Duration::from_millis(300))
                .unwrap();
            assert!(matches!(stream.next(), Some(Ok(WatchEvent::Added(_)))));
            let e = stream.next().unwrap().unwrap_err();
            assert!(e.is_transport(), "{e}");
            assert!(e.to_string().contains("timeout"), "{e}");
            assert!(stream.next().is_none());
        }

        #[test]
        fn closing_all_connections_ends_a_silent_watch_at_once() {
            let l = fixture_lines("05a-pods-watch-node-timeout30");
            let first = l[0].clone();
            let server = TestServer::start(move |_| Reply::Chunked {
                status: 200,
                chunks: vec![first.clone()],
                end: End::Silent,
            });
            let client = client_for(&server);
            let mut stream = client.watch(PATH, Duration::from_secs(60)).unwrap();
            assert!(matches!(stream.next(), Some(Ok(WatchEvent::Added(_)))));
            let closer = client.clone();
            let started = std::time::Instant::now();
            let t = crate::thread::spawn_named("test-closer", move || {
                std::thread::sleep(Duration::from_millis(300));
                closer.close_all_connections();
            })
            .unwrap();
            // Either a transport error or the end of the body: never a hang.
            match stream.next() {
                None => {}
                Some(Err(e)) => assert!(e.is_transport(), "{e}"),
                Some(Ok(ev)) => panic!("an event from a closed connection: {ev:?}"),
            }
            assert!(started.elapsed() < Duration::from_secs(10));
            drop(t);
            // The client works on, over a new connection.
            let mut again = client.watch(PATH, Duration::from_secs(60)).unwrap();
            assert!(matches!(again.next(), Some(Ok(WatchEvent::Added(_)))));
        }

        #[test]
        fn a_dropped_connection_is_a_transport_error() {
            let l = fixture_lines("05a-pods-watch-node-timeout30");
            let first = l[0].clone();
            let server = TestServer::start(move |_| Reply::Chunked {
                status: 200,
                chunks: vec![first.clone()],
                end: End::Drop,
            });
            let mut stream = client_for(&server)
                .watch(PATH, Duration::from_secs(10))
                .unwrap();
            assert!(matches!(stream.next(), Some(Ok(WatchEvent::Added(_)))));
            let e = stream.next().unwrap().unwrap_err();
            assert!(e.is_transport(), "{e}");
            assert!(stream.next().is_none());
        }
    }
}
