//! Incremental decoding of LIST answers. The body of a list is read as a
//! stream and its `items` are handed over one object at a time, so a page
//! of any total size is taken while at most one object is held in memory.
//! An object larger than the per-object cap is read past (its bytes are
//! counted, not kept) and reported with the name and namespace found in
//! it, wherever they are in the object; the rest of the list is used. The
//! list's `metadata` (resourceVersion, continue, remainingItemCount) is
//! read wherever it appears, before or after `items`.
//!
//! The byte scanner here ([`ValueScanner`]) finds where one JSON value
//! ends (strings with escapes, nesting) and picks a few string fields out
//! of it as the bytes go by; the watch stream uses it for the identity of
//! an event too large to keep.

use std::io::Read;

use serde_json::Value;

/// The largest object (one list item, one watch event) that is decoded.
/// etcd stores at most 1.5 MiB per object, but its JSON can be several
/// times larger (Go escapes `<`, `>`, `&` and control characters as six
/// bytes each), so a cap near the stored size (4 MiB, say) could skip an
/// object a real apiserver serves. 16 MiB takes every object a real
/// apiserver can hold and still bounds what a broken or hostile one can
/// make the node keep at once.
pub const MAX_OBJECT: usize = 16 * 1024 * 1024;

/// Nesting beyond this is refused (serde_json refuses beyond 128 anyway);
/// it bounds the scanner's stack on skipped objects.
const MAX_DEPTH: usize = 256;
/// The longest key or tracked string value kept by the scanner (names are
/// at most 253 bytes).
const MAX_TRACKED: usize = 1024;
/// The size of each read from the body.
const READ_SIZE: usize = 64 * 1024;

/// The fields of a list item that name it.
const ITEM_IDENTITY: &[&[&str]] = &[&["metadata", "namespace"], &["metadata", "name"]];

/// What the list's metadata says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListMeta {
    pub resource_version: String,
    /// The token of the next page, if there is one.
    pub(crate) continue_token: Option<String>,
    pub(crate) remaining_item_count: Option<u64>,
    /// Bytes of the body read.
    pub bytes: u64,
}

/// One element of `items`.
#[derive(Debug, Clone, PartialEq)]
pub enum ListItem {
    Object(Value),
    /// An object over the cap, read past: its index in `items`, its
    /// `namespace/name` (or what of it was found; empty if nothing) and
    /// its size.
    TooLarge {
        index: usize,
        key: String,
        bytes: u64,
    },
}

/// Why a list could not be read.
#[derive(Debug)]
pub enum ListError {
    /// Reading the body failed (the connection, a timeout).
    Read(std::io::Error),
    /// The body is not a list: the field and what is wrong, with the byte
    /// offset where the scanner found it.
    Invalid(String),
}

/// Reads a LIST answer from `reader`, handing each item to `each` as it is
/// decoded; no item over `max_object` bytes is kept. Returns the list's
/// metadata once the body is read to its end.
pub fn read_list(
    reader: &mut dyn Read,
    max_object: usize,
    each: &mut dyn FnMut(ListItem),
) -> Result<ListMeta, ListError> {
    let mut input = Input {
        reader,
        buf: vec![0; READ_SIZE],
        pos: 0,
        end: 0,
        offset: 0,
        eof: false,
    };
    let invalid = |m: String| Err(ListError::Invalid(m));
    match input.peek_non_ws()? {
        Some(b'{') => input.pos += 1,
        Some(b) => {
            return invalid(format!(
                "expected a JSON object (a list), found {} at byte {}",
                show(b),
                input.at()
            ))
        }
        None => return invalid("the answer is empty".into()),
    }
    let mut meta: Option<Value> = None;
    let mut items_seen = false;
    let mut first = true;
    loop {
        match input.peek_non_ws()? {
            Some(b'}') if first => {
                input.pos += 1;
                break;
            }
            Some(b'"') => {}
            Some(b) => {
                return invalid(format!(
                    "expected a key, found {} at byte {}",
                    show(b),
                    input.at()
                ))
            }
            None => return invalid("the answer ended inside the list".into()),
        }
        first = false;
        let key = input.key()?;
        let field = key.clone().unwrap_or_else(|| "a long key".into());
        match input.peek_non_ws()? {
            Some(b':') => input.pos += 1,
            _ => return invalid(format!("{field}: expected `:` at byte {}", input.at())),
        }
        match key.as_deref() {
            Some("metadata") => {
                if meta.is_some() {
                    return invalid("metadata: appears twice".into());
                }
                let mut capture = Capture::new(max_object);
                input.value(&mut ValueScanner::new(&[]), &mut capture, "metadata")?;
                if capture.over {
                    return invalid(format!("metadata: larger than {max_object} bytes"));
                }
                let v: Value = serde_json::from_slice(&capture.bytes)
                    .map_err(|e| ListError::Invalid(format!("metadata: invalid JSON: {e}")))?;
                meta = Some(v);
            }
            Some("items") => {
                if items_seen {
                    return invalid("items: appears twice".into());
                }
                items_seen = true;
                read_items(&mut input, max_object, each)?;
            }
            _ => {
                let mut skip = Capture::new(0);
                input.value(&mut ValueScanner::new(&[]), &mut skip, &field)?;
            }
        }
        match input.peek_non_ws()? {
            Some(b',') => input.pos += 1,
            Some(b'}') => {
                input.pos += 1;
                break;
            }
            Some(b) => {
                return invalid(format!(
                    "{field}: expected `,` or `}}` after it, found {} at byte {}",
                    show(b),
                    input.at()
                ))
            }
            None => return invalid("the answer ended inside the list".into()),
        }
    }
    if let Some(b) = input.peek_non_ws()? {
        return invalid(format!(
            "unexpected {} after the list at byte {}",
            show(b),
            input.at()
        ));
    }
    let text = |k: &str| {
        meta.as_ref()
            .and_then(|m| m.get(k))
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
            .map(str::to_string)
    };
    let Some(resource_version) = text("resourceVersion") else {
        return invalid("a list without metadata.resourceVersion".into());
    };
    Ok(ListMeta {
        resource_version,
        continue_token: text("continue"),
        remaining_item_count: meta
            .as_ref()
            .and_then(|m| m.get("remainingItemCount"))
            .and_then(Value::as_u64),
        bytes: input.at(),
    })
}

/// Reads the value of `items`: `null` or a list, each element handed over
/// as it ends.
fn read_items(
    input: &mut Input<'_>,
    max_object: usize,
    each: &mut dyn FnMut(ListItem),
) -> Result<(), ListError> {
    match input.peek_non_ws()? {
        Some(b'[') => input.pos += 1,
        Some(b'n') => {
            let mut capture = Capture::new(16);
            input.value(&mut ValueScanner::new(&[]), &mut capture, "items")?;
            if capture.bytes.trim_ascii() == b"null" {
                return Ok(());
            }
            return Err(ListError::Invalid("items: expected a list".into()));
        }
        _ => return Err(ListError::Invalid("items: expected a list".into())),
    }
    if input.peek_non_ws()? == Some(b']') {
        input.pos += 1;
        return Ok(());
    }
    // One buffer for every item: cleared, not freed, between items, and
    // dropped with the list.
    let mut capture = Capture::new(max_object);
    for index in 0.. {
        let field = format!("items[{index}]");
        let mut scanner = ValueScanner::new(ITEM_IDENTITY);
        capture.reset();
        input.value(&mut scanner, &mut capture, &field)?;
        if capture.over {
            each(ListItem::TooLarge {
                index,
                key: scanner.key(0, 1),
                bytes: capture.total,
            });
        } else {
            let v: Value = serde_json::from_slice(&capture.bytes)
                .map_err(|e| ListError::Invalid(format!("{field}: invalid JSON: {e}")))?;
            each(ListItem::Object(v));
        }
        match input.peek_non_ws()? {
            Some(b',') => input.pos += 1,
            Some(b']') => {
                input.pos += 1;
                break;
            }
            Some(b) => {
                return Err(ListError::Invalid(format!(
                    "{field}: expected `,` or `]` after it, found {} at byte {}",
                    show(b),
                    input.at()
                )))
            }
            None => {
                return Err(ListError::Invalid(
                    "items: the answer ended inside the list".into(),
                ))
            }
        }
    }
    Ok(())
}

/// A byte for an error message.
fn show(b: u8) -> String {
    if b.is_ascii_graphic() {
        format!("`{}`", b as char)
    } else {
        format!("byte 0x{b:02x}")
    }
}

/// The body, read in pieces.
struct Input<'a> {
    reader: &'a mut dyn Read,
    buf: Vec<u8>,
    pos: usize,
    end: usize,
    /// Bytes of the body before `buf[0]`.
    offset: u64,
    eof: bool,
}

impl Input<'_> {
    /// True when there is a byte at `pos`, reading more if needed.
    fn fill(&mut self) -> Result<bool, ListError> {
        if self.pos < self.end {
            return Ok(true);
        }
        if self.eof {
            return Ok(false);
        }
        self.offset += self.end as u64;
        self.pos = 0;
        self.end = 0;
        loop {
            match self.reader.read(&mut self.buf) {
                Ok(0) => {
                    self.eof = true;
                    return Ok(false);
                }
                Ok(n) => {
                    self.end = n;
                    return Ok(true);
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(ListError::Read(e)),
            }
        }
    }

    /// The offset in the body of the next byte.
    fn at(&self) -> u64 {
        self.offset + self.pos as u64
    }

    /// The next byte that is not whitespace, left unread; None at the end.
    fn peek_non_ws(&mut self) -> Result<Option<u8>, ListError> {
        while self.fill()? {
            let b = self.buf[self.pos];
            if !b.is_ascii_whitespace() {
                return Ok(Some(b));
            }
            self.pos += 1;
        }
        Ok(None)
    }

    /// Reads one JSON value into `capture` (up to its cap), with `scanner`
    /// picking out its fields. `field` names it in errors.
    fn value(
        &mut self,
        scanner: &mut ValueScanner,
        capture: &mut Capture,
        field: &str,
    ) -> Result<(), ListError> {
        loop {
            if !self.fill()? {
                return scanner.finish().map_err(|m| {
                    ListError::Invalid(format!("{field}: {m} at byte {}", self.at()))
                });
            }
            let data = &self.buf[self.pos..self.end];
            match scanner.feed(data) {
                Ok(Some(n)) => {
                    capture.push(&data[..n]);
                    self.pos += n;
                    return Ok(());
                }
                Ok(None) => {
                    capture.push(data);
                    self.pos = self.end;
                }
                Err((i, m)) => {
                    return Err(ListError::Invalid(format!(
                        "{field}: {m} at byte {}",
                        self.at() + i as u64
                    )))
                }
            }
        }
    }

    /// Reads a key (the next byte is its `"`); None for a key too long to
    /// be one the list has.
    fn key(&mut self) -> Result<Option<String>, ListError> {
        let mut capture = Capture::new(MAX_TRACKED);
        self.value(&mut ValueScanner::new(&[]), &mut capture, "a key")?;
        if capture.over {
            return Ok(None);
        }
        serde_json::from_slice::<String>(&capture.bytes)
            .map(Some)
            .map_err(|e| ListError::Invalid(format!("a key: invalid JSON: {e}")))
    }
}

/// The bytes of one value, kept up to a cap and counted beyond it.
struct Capture {
    bytes: Vec<u8>,
    max: usize,
    total: u64,
    /// The value is over the cap: its bytes were dropped.
    over: bool,
}

impl Capture {
    fn new(max: usize) -> Capture {
        Capture {
            bytes: Vec::new(),
            max,
            total: 0,
            over: false,
        }
    }

    fn reset(&mut self) {
        self.bytes.clear();
        self.total = 0;
        self.over = false;
    }

    fn push(&mut self, data: &[u8]) {
        self.total += data.len() as u64;
        if self.over {
            return;
        }
        if self.bytes.len() + data.len() > self.max {
            self.over = true;
            // Nothing of an object over the cap is kept.
            self.bytes = Vec::new();
        } else {
            self.bytes.extend_from_slice(data);
        }
    }
}

/// One open object or list inside the scanned value.
struct Frame {
    object: bool,
    /// In an object: the next string is a key.
    expect_key: bool,
    /// In an object at a tracked depth: the key of the current member.
    key: Option<String>,
}

/// What the string being scanned is.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Role {
    Untracked,
    Key,
    /// The value of the target of this index.
    Target(usize),
}

/// Finds where one JSON value ends, fed its bytes in pieces, and keeps the
/// string values at a few paths (`["metadata", "name"]`) wherever they
/// appear. It checks only the structure (strings, brackets, nesting),
/// which is what finding the end needs; a kept value is checked in full by
/// serde_json.
pub(crate) struct ValueScanner {
    targets: &'static [&'static [&'static str]],
    /// The first string value found at each target.
    found: Vec<Option<String>>,
    /// Keys are kept down to this depth (the longest target's).
    key_depth: usize,
    stack: Vec<Frame>,
    started: bool,
    in_scalar: bool,
    in_string: bool,
    escape: bool,
    role: Role,
    scratch: Vec<u8>,
    scratch_over: bool,
}

impl ValueScanner {
    pub(crate) fn new(targets: &'static [&'static [&'static str]]) -> ValueScanner {
        ValueScanner {
            targets,
            found: vec![None; targets.len()],
            key_depth: targets.iter().map(|t| t.len()).max().unwrap_or(0),
            stack: Vec::new(),
            started: false,
            in_scalar: false,
            in_string: false,
            escape: false,
            role: Role::Untracked,
            scratch: Vec::new(),
            scratch_over: false,
        }
    }

    /// The string found at target `i`.
    pub(crate) fn found(&self, i: usize) -> Option<&str> {
        self.found.get(i)?.as_deref()
    }

    /// `namespace/name` from the targets at `ns` and `name` (`name` alone
    /// without a namespace; empty when neither was found).
    pub(crate) fn key(&self, ns: usize, name: usize) -> String {
        match (self.found(ns), self.found(name)) {
            (Some(ns), Some(name)) if !ns.is_empty() => format!("{ns}/{name}"),
            (Some(ns), None) if !ns.is_empty() => format!("{ns}/"),
            (_, name) => name.unwrap_or("").to_string(),
        }
    }

    /// Feeds the next bytes of the value. `Ok(Some(n))`: the value ended
    /// with `data[n - 1]` (whitespace before it included); `Ok(None)`: all
    /// of `data` belongs to it. An error carries the index in `data`.
    pub(crate) fn feed(&mut self, data: &[u8]) -> Result<Option<usize>, (usize, String)> {
        let mut i = 0;
        while i < data.len() {
            if self.in_string {
                if self.escape {
                    self.escape = false;
                    self.track(&data[i..i + 1]);
                    i += 1;
                    continue;
                }
                let rest = &data[i..];
                match rest.iter().position(|&b| b == b'"' || b == b'\\') {
                    None => {
                        self.track(rest);
                        i = data.len();
                    }
                    Some(p) if rest[p] == b'\\' => {
                        self.track(&rest[..=p]);
                        self.escape = true;
                        i += p + 1;
                    }
                    Some(p) => {
                        self.track(&rest[..p]);
                        i += p + 1;
                        self.end_string();
                        if self.stack.is_empty() {
                            return Ok(Some(i));
                        }
                    }
                }
                continue;
            }
            let b = data[i];
            if self.in_scalar {
                if !(b.is_ascii_whitespace() || b",:]}\"{[".contains(&b)) {
                    i += 1;
                    continue;
                }
                self.in_scalar = false;
                if self.stack.is_empty() {
                    return Ok(Some(i));
                }
            }
            if b.is_ascii_whitespace() {
                i += 1;
                continue;
            }
            if self.stack.is_empty() {
                if self.started {
                    // The value ended before this byte (a scalar).
                    return Ok(Some(i));
                }
                if b",:]}".contains(&b) {
                    return Err((i, format!("expected a value, found {}", show(b))));
                }
                self.started = true;
            }
            match b {
                b'"' => {
                    self.role = self.string_role();
                    self.in_string = true;
                    self.scratch.clear();
                    self.scratch_over = false;
                }
                b'{' | b'[' => {
                    if self.stack.len() >= MAX_DEPTH {
                        return Err((i, format!("nested deeper than {MAX_DEPTH} levels")));
                    }
                    self.stack.push(Frame {
                        object: b == b'{',
                        expect_key: b == b'{',
                        key: None,
                    });
                }
                b'}' | b']' => {
                    let object = b == b'}';
                    match self.stack.pop() {
                        Some(f) if f.object == object => {}
                        _ => return Err((i, format!("unexpected {}", show(b)))),
                    }
                    if self.stack.is_empty() {
                        return Ok(Some(i + 1));
                    }
                }
                b',' => {
                    if let Some(f) = self.stack.last_mut() {
                        if f.object {
                            f.expect_key = true;
                            f.key = None;
                        }
                    }
                }
                b':' => {
                    if let Some(f) = self.stack.last_mut() {
                        f.expect_key = false;
                    }
                }
                _ => self.in_scalar = true,
            }
            i += 1;
        }
        Ok(None)
    }

    /// The input ended: Ok if the value was complete (a scalar at the top
    /// ends with the input).
    pub(crate) fn finish(&self) -> Result<(), String> {
        if !self.started {
            Err("expected a value, found the end of the answer".into())
        } else if self.in_string || !self.stack.is_empty() {
            Err("the answer ended inside a value".into())
        } else {
            Ok(())
        }
    }

    fn string_role(&self) -> Role {
        let depth = self.stack.len();
        let Some(top) = self.stack.last() else {
            return Role::Untracked;
        };
        if top.object && top.expect_key {
            return if depth <= self.key_depth {
                Role::Key
            } else {
                Role::Untracked
            };
        }
        let at = self.targets.iter().position(|t| {
            t.len() == depth
                && self
                    .stack
                    .iter()
                    .zip(t.iter())
                    .all(|(f, k)| f.object && f.key.as_deref() == Some(*k))
        });
        match at {
            Some(t) if self.found[t].is_none() => Role::Target(t),
            _ => Role::Untracked,
        }
    }

    fn track(&mut self, bytes: &[u8]) {
        if self.role == Role::Untracked || self.scratch_over {
            return;
        }
        if self.scratch.len() + bytes.len() > MAX_TRACKED {
            self.scratch_over = true;
        } else {
            self.scratch.extend_from_slice(bytes);
        }
    }

    fn end_string(&mut self) {
        self.in_string = false;
        let role = std::mem::replace(&mut self.role, Role::Untracked);
        if role == Role::Untracked {
            return;
        }
        let text = if self.scratch_over {
            None
        } else {
            let mut quoted = Vec::with_capacity(self.scratch.len() + 2);
            quoted.push(b'"');
            quoted.extend_from_slice(&self.scratch);
            quoted.push(b'"');
            serde_json::from_slice::<String>(&quoted).ok()
        };
        match role {
            Role::Key => {
                if let Some(f) = self.stack.last_mut() {
                    f.key = text;
                    f.expect_key = false;
                }
            }
            Role::Target(t) => self.found[t] = text,
            Role::Untracked => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::io;

    use crate::kube::testserver::Pieces;

    /// Reads `body` handed out `piece` bytes at a time.
    fn read(body: &[u8], piece: usize, max: usize) -> (Result<ListMeta, ListError>, Vec<ListItem>) {
        let mut r = Pieces(body.chunks(piece).map(<[u8]>::to_vec).collect());
        let mut items = Vec::new();
        let meta = read_list(&mut r, max, &mut |i| items.push(i));
        (meta, items)
    }

    fn invalid(r: Result<ListMeta, ListError>) -> String {
        match r {
            Err(ListError::Invalid(m)) => m,
            other => panic!("not an invalid list: {other:?}"),
        }
    }

    fn pod(ns: &str, name: &str, filler: &str) -> Value {
        json!({"metadata": {"annotations": {"a": filler}, "name": name, "namespace": ns,
               "resourceVersion": "7"}, "spec": {"containers": [{"name": "c", "image": "i"}]}})
    }

    #[test]
    fn items_split_across_reads_at_every_size() {
        let items = vec![
            pod("default", "a", "x \" \\ } ] { [ \u{e9}"),
            pod("kube-system", "b", "y"),
            json!(5),
            json!("s"),
        ];
        let body = serde_json::to_vec(&json!({
            "kind": "PodList", "apiVersion": "v1",
            "metadata": {"resourceVersion": "401", "continue": "tok", "remainingItemCount": 3},
            "items": items,
        }))
        .unwrap();
        for piece in [1, 2, 3, 7, 64, body.len()] {
            let (meta, got) = read(&body, piece, 1 << 20);
            let meta = meta.unwrap();
            assert_eq!(
                (
                    meta.resource_version.as_str(),
                    meta.continue_token.as_deref()
                ),
                ("401", Some("tok"))
            );
            assert_eq!(meta.remaining_item_count, Some(3));
            assert_eq!(meta.bytes, body.len() as u64);
            let want: Vec<ListItem> = items.iter().cloned().map(ListItem::Object).collect();
            assert_eq!(got, want, "pieces of {piece}");
        }
    }

    #[test]
    fn metadata_after_items_and_whitespace_everywhere() {
        let body = b" { \"items\" : [ {\"metadata\":{\"name\":\"a\"}} ,\n {\"metadata\":{\"name\":\"b\"}} ] ,\r\n \"metadata\" : {\"resourceVersion\":\"9\"} , \"kind\" : \"PodList\" }\n ";
        let (meta, got) = read(body, 5, 1024);
        let meta = meta.unwrap();
        assert_eq!(meta.resource_version, "9");
        assert_eq!(meta.continue_token, None);
        assert_eq!(got.len(), 2);
        let (meta, got) = read(
            br#"{"metadata":{"resourceVersion":"9"},"items":null}"#,
            3,
            64,
        );
        assert_eq!(meta.unwrap().resource_version, "9");
        assert!(got.is_empty());
        let (meta, got) = read(br#"{"items":[],"metadata":{"resourceVersion":"9"}}"#, 3, 64);
        assert_eq!(meta.unwrap().resource_version, "9");
        assert!(got.is_empty());
    }

    #[test]
    fn an_item_over_the_cap_is_skipped_with_its_name_and_the_others_kept() {
        let big = "z".repeat(5000);
        // The name after the big annotation, as a server that sorts its
        // keys writes it; and one whose name comes first.
        let items = vec![
            pod("default", "small-1", "x"),
            pod("default", "huge-1", &big),
            json!({"metadata": {"name": "huge-2", "annotations": {"a": big}}}),
            pod("other", "small-2", "y"),
        ];
        let body = serde_json::to_vec(&json!({
            "metadata": {"resourceVersion": "12"},
            "items": items,
        }))
        .unwrap();
        for piece in [1, 100, body.len()] {
            let (meta, got) = read(&body, piece, 4096);
            assert_eq!(meta.unwrap().resource_version, "12");
            let skipped: Vec<(usize, &str)> = got
                .iter()
                .filter_map(|i| match i {
                    ListItem::TooLarge { index, key, bytes } => {
                        assert!(*bytes > 5000, "{bytes}");
                        Some((*index, key.as_str()))
                    }
                    ListItem::Object(_) => None,
                })
                .collect();
            assert_eq!(skipped, [(1, "default/huge-1"), (2, "huge-2")]);
            let kept: Vec<&Value> = got
                .iter()
                .filter_map(|i| match i {
                    ListItem::Object(v) => Some(v),
                    ListItem::TooLarge { .. } => None,
                })
                .collect();
            assert_eq!(kept, [&items[0], &items[3]]);
        }
    }

    #[test]
    fn malformed_lists_give_clear_errors() {
        let cases: &[(&[u8], &str)] = &[
            (b"", "the answer is empty"),
            (
                b"[1]",
                "expected a JSON object (a list), found `[` at byte 0",
            ),
            (b"{\"items\":[]}", "a list without metadata.resourceVersion"),
            (
                b"{\"metadata\":{},\"items\":[]}",
                "a list without metadata.resourceVersion",
            ),
            (
                b"{\"metadata\":{\"resourceVersion\":\"1\"},\"items\":{}}",
                "items: expected a list",
            ),
            (
                b"{\"metadata\":{\"resourceVersion\":\"1\"},\"items\":[{]}",
                "items[0]: unexpected `]` at byte 46",
            ),
            (
                b"{\"metadata\":{\"resourceVersion\":\"1\"},\"items\":[{},{\"a\":}]}",
                "items[1]: invalid JSON: expected value at line 1 column 6",
            ),
            (
                b"{\"metadata\":{\"resourceVersion\":\"1\"},\"items\":[{},]}",
                "items[1]: expected a value, found `]` at byte 48",
            ),
            (
                b"{\"metadata\":{\"resourceVersion\":\"1\"},\"items\":[{} {}]}",
                "items[0]: expected `,` or `]` after it, found `{` at byte 48",
            ),
            (
                b"{\"metadata\":{\"resourceVersion\":\"1\"},\"items\":[{\"a\":\"",
                "items[0]: the answer ended inside a value at byte 51",
            ),
            (
                b"{\"metadata\":{\"resourceVersion\":\"1\"},\"items\":[]",
                "the answer ended inside the list",
            ),
            (
                b"{\"metadata\":{\"resourceVersion\":\"1\"}} x",
                "unexpected `x` after the list at byte 37",
            ),
            (
                b"{\"metadata\":{\"resourceVersion\":\"1\"} \"items\":[]}",
                "metadata: expected `,` or `}` after it, found `\"` at byte 36",
            ),
            (
                b"{\"metadata\":[,]}",
                "metadata: invalid JSON: expected value at line 1 column 2",
            ),
            (
                b"{\"metadata\":,}",
                "metadata: expected a value, found `,` at byte 12",
            ),
            (b"{\"items\":[],\"items\":[]}", "items: appears twice"),
            (b"{5:1}", "expected a key, found `5` at byte 1"),
        ];
        for (body, want) in cases {
            let (meta, _) = read(body, 3, 1024);
            assert_eq!(invalid(meta), *want, "{}", String::from_utf8_lossy(body));
        }
        let deep = format!("{{\"items\":[{}", "[".repeat(MAX_DEPTH + 1));
        let (meta, _) = read(deep.as_bytes(), 50, 1 << 20);
        assert_eq!(
            invalid(meta),
            "items[0]: nested deeper than 256 levels at byte 266"
        );
        let (meta, _) = read(b"{\"metadata\":{\"resourceVersion\":\"123456789\"}}", 3, 8);
        assert_eq!(invalid(meta), "metadata: larger than 8 bytes");
    }

    #[test]
    fn a_read_error_is_reported_as_such() {
        struct Broken(bool);
        impl Read for Broken {
            fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
                if std::mem::replace(&mut self.0, true) {
                    return Err(io::Error::new(io::ErrorKind::ConnectionReset, "reset"));
                }
                buf[..9].copy_from_slice(b"{\"items\":");
                Ok(9)
            }
        }
        let r = read_list(&mut Broken(false), 100, &mut |_| {});
        assert!(matches!(r, Err(ListError::Read(e)) if e.kind() == io::ErrorKind::ConnectionReset));
    }

    #[test]
    fn the_scanner_finds_fields_in_any_order_and_stops_at_the_value_end() {
        const EVENT: &[&[&str]] = &[
            &["type"],
            &["object", "metadata", "namespace"],
            &["object", "metadata", "name"],
        ];
        let text = br#"{"object":{"spec":{"name":"not-this","metadata":{"name":"nor-this"}},"metadata":{"a":["name"],"name":"p\u0031","namespace":"ns"}},"type":"ADDED"} trailing"#;
        let mut s = ValueScanner::new(EVENT);
        let mut end = None;
        for (at, piece) in text.chunks(3).enumerate() {
            if let Some(n) = s.feed(piece).unwrap() {
                end = Some(at * 3 + n);
                break;
            }
        }
        assert_eq!(end, Some(text.len() - " trailing".len()));
        assert_eq!(s.found(0), Some("ADDED"));
        assert_eq!(s.key(1, 2), "ns/p1");
        // A scalar ends at the first byte after it.
        let mut s = ValueScanner::new(&[]);
        assert_eq!(s.feed(b"  12"), Ok(None));
        assert_eq!(s.feed(b"3,"), Ok(Some(1)));
        assert_eq!(s.finish(), Ok(()));
    }
}
