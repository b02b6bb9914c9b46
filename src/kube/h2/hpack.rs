//! HPACK (RFC 7541), the header compression of HTTP/2: the static table, a
//! dynamic table per direction, an encoder that indexes every header it
//! sends (so a request repeated every few seconds costs a byte or two per
//! header after the first), and a decoder for what the server sends,
//! Huffman-coded strings included.
//!
//! The encoder never Huffman-codes: that would only shorten the first
//! request of a connection, which sends each string once.

use std::collections::VecDeque;
use std::sync::OnceLock;

/// The static table (RFC 7541 Appendix A); index 1 is the first entry.
const STATIC: [(&str, &str); 61] = [
    (":authority", ""),
    (":method", "GET"),
    (":method", "POST"),
    (":path", "/"),
    (":path", "/index.html"),
    (":scheme", "http"),
    (":scheme", "https"),
    (":status", "200"),
    (":status", "204"),
    (":status", "206"),
    (":status", "304"),
    (":status", "400"),
    (":status", "404"),
    (":status", "500"),
    ("accept-charset", ""),
    ("accept-encoding", "gzip, deflate"),
    ("accept-language", ""),
    ("accept-ranges", ""),
    ("accept", ""),
    ("access-control-allow-origin", ""),
    ("age", ""),
    ("allow", ""),
    ("authorization", ""),
    ("cache-control", ""),
    ("content-disposition", ""),
    ("content-encoding", ""),
    ("content-language", ""),
    ("content-length", ""),
    ("content-location", ""),
    ("content-range", ""),
    ("content-type", ""),
    ("cookie", ""),
    ("date", ""),
    ("etag", ""),
    ("expect", ""),
    ("expires", ""),
    ("from", ""),
    ("host", ""),
    ("if-match", ""),
    ("if-modified-since", ""),
    ("if-none-match", ""),
    ("if-range", ""),
    ("if-unmodified-since", ""),
    ("last-modified", ""),
    ("link", ""),
    ("location", ""),
    ("max-forwards", ""),
    ("proxy-authenticate", ""),
    ("proxy-authorization", ""),
    ("range", ""),
    ("referer", ""),
    ("refresh", ""),
    ("retry-after", ""),
    ("server", ""),
    ("set-cookie", ""),
    ("strict-transport-security", ""),
    ("transfer-encoding", ""),
    ("user-agent", ""),
    ("vary", ""),
    ("via", ""),
    ("www-authenticate", ""),
];

/// The dynamic table size both sides start with (SETTINGS_HEADER_TABLE_SIZE's
/// default); the decoder never allows more.
const DEFAULT_TABLE_SIZE: usize = 4096;

/// The bit length of each symbol's Huffman code (RFC 7541 Appendix B),
/// symbols 0 to 255 and EOS (256). The code is canonical: codes of one
/// length are consecutive, in symbol order, and each length's first code
/// follows the last of the length before, so the lengths are the whole code.
const HUFFMAN_LENGTHS: [u8; 257] = [
    13, 23, 28, 28, 28, 28, 28, 28, 28, 24, 30, 28, 28, 30, 28, 28, //
    28, 28, 28, 28, 28, 28, 30, 28, 28, 28, 28, 28, 28, 28, 28, 28, //
    6, 10, 10, 12, 13, 6, 8, 11, 10, 10, 8, 11, 8, 6, 6, 6, //
    5, 5, 5, 6, 6, 6, 6, 6, 6, 6, 7, 8, 15, 6, 12, 10, //
    13, 6, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, //
    7, 7, 7, 7, 7, 7, 7, 7, 8, 7, 8, 13, 19, 13, 14, 6, //
    15, 5, 6, 5, 6, 5, 6, 6, 6, 5, 7, 7, 6, 6, 6, 5, //
    6, 7, 6, 5, 5, 6, 7, 7, 7, 7, 7, 15, 11, 14, 13, 28, //
    20, 22, 20, 20, 22, 22, 22, 23, 22, 23, 23, 23, 23, 23, 24, 23, //
    24, 24, 22, 23, 24, 23, 23, 23, 23, 21, 22, 23, 22, 23, 23, 24, //
    22, 21, 20, 22, 22, 23, 23, 21, 23, 22, 22, 24, 21, 22, 23, 23, //
    21, 21, 22, 21, 23, 22, 23, 23, 20, 22, 22, 22, 23, 22, 22, 23, //
    26, 26, 20, 19, 22, 23, 22, 25, 26, 26, 26, 27, 27, 26, 24, 25, //
    19, 21, 26, 27, 27, 26, 27, 24, 21, 21, 26, 26, 28, 27, 27, 27, //
    20, 24, 20, 21, 22, 21, 21, 23, 22, 22, 25, 25, 24, 24, 26, 23, //
    26, 27, 26, 26, 27, 27, 27, 27, 27, 28, 27, 27, 27, 27, 27, 26, //
    30,
];

/// The longest Huffman code.
const MAX_CODE: usize = 30;
const EOS: u16 = 256;

/// The canonical code, arranged for decoding one bit at a time.
struct Canonical {
    /// The first code of each length.
    first: [u32; MAX_CODE + 1],
    /// How many codes have each length.
    count: [u32; MAX_CODE + 1],
    /// Where each length's symbols start in `symbols`.
    start: [u16; MAX_CODE + 1],
    /// The symbols by code length, then symbol.
    symbols: [u16; 257],
}

fn canonical() -> &'static Canonical {
    static CODE: OnceLock<Canonical> = OnceLock::new();
    CODE.get_or_init(|| {
        let mut c = Canonical {
            first: [0; MAX_CODE + 1],
            count: [0; MAX_CODE + 1],
            start: [0; MAX_CODE + 1],
            symbols: [0; 257],
        };
        for &l in &HUFFMAN_LENGTHS {
            c.count[usize::from(l)] += 1;
        }
        let (mut code, mut at) = (0u32, 0u16);
        for len in 1..=MAX_CODE {
            c.first[len] = code;
            c.start[len] = at;
            at += c.count[len] as u16;
            code = (code + c.count[len]) << 1;
        }
        let mut next = c.start;
        for (sym, &l) in HUFFMAN_LENGTHS.iter().enumerate() {
            let l = usize::from(l);
            c.symbols[usize::from(next[l])] = sym as u16;
            next[l] += 1;
        }
        c
    })
}

/// Appends the Huffman-decoded `src` to `out`. The padding must be the
/// start of EOS (all ones) and shorter than a byte; EOS itself is an error.
fn huffman_decode(src: &[u8], out: &mut Vec<u8>) -> Result<(), String> {
    let c = canonical();
    let (mut code, mut len) = (0u32, 0usize);
    for &byte in src {
        for shift in (0..8).rev() {
            code = code << 1 | u32::from(byte >> shift & 1);
            len += 1;
            if len > MAX_CODE {
                return Err("a Huffman code longer than any".into());
            }
            let i = code.wrapping_sub(c.first[len]);
            if i < c.count[len] {
                let sym = c.symbols[usize::from(c.start[len]) + i as usize];
                if sym == EOS {
                    return Err("EOS inside a Huffman string".into());
                }
                out.push(sym as u8);
                code = 0;
                len = 0;
            }
        }
    }
    if len > 7 || code != (1 << len) - 1 {
        return Err("bad Huffman padding".into());
    }
    Ok(())
}

/// Entries added by one side, newest first, with their RFC size (name +
/// value + 32) kept under the table's limit.
#[derive(Default)]
struct Table {
    entries: VecDeque<(Vec<u8>, Vec<u8>)>,
    size: usize,
    max: usize,
}

impl Table {
    fn new(max: usize) -> Table {
        Table {
            max,
            ..Table::default()
        }
    }
    fn evict_to(&mut self, max: usize) {
        while self.size > max {
            match self.entries.pop_back() {
                Some((n, v)) => self.size -= n.len() + v.len() + 32,
                None => break,
            }
        }
    }
    fn set_max(&mut self, max: usize) {
        self.max = max;
        self.evict_to(max);
    }
    fn add(&mut self, name: &[u8], value: &[u8]) {
        let size = name.len() + value.len() + 32;
        if size > self.max {
            // An entry larger than the table empties it (RFC 7541 4.4).
            self.entries.clear();
            self.size = 0;
            return;
        }
        self.evict_to(self.max - size);
        self.entries.push_front((name.to_vec(), value.to_vec()));
        self.size += size;
    }
    /// The entry at HPACK index `i` (static, then this table).
    fn get(&self, i: usize) -> Option<(&[u8], &[u8])> {
        match i {
            0 => None,
            1..=61 => {
                let (n, v) = STATIC[i - 1];
                Some((n.as_bytes(), v.as_bytes()))
            }
            _ => self
                .entries
                .get(i - 62)
                .map(|(n, v)| (n.as_slice(), v.as_slice())),
        }
    }
    /// (index of a full match, index of a name match).
    fn find(&self, name: &[u8], value: &[u8]) -> (Option<usize>, Option<usize>) {
        let mut by_name = None;
        let stat = STATIC.iter().map(|(n, v)| (n.as_bytes(), v.as_bytes()));
        let dynamic = self
            .entries
            .iter()
            .map(|(n, v)| (n.as_slice(), v.as_slice()));
        for (i, (n, v)) in stat.chain(dynamic).enumerate() {
            if n == name {
                if v == value {
                    return (Some(i + 1), by_name);
                }
                by_name.get_or_insert(i + 1);
            }
        }
        (None, by_name)
    }
}

/// Appends `value` as an HPACK integer with an `n`-bit prefix, the bits
/// above it in the first byte being `flags`.
fn put_int(out: &mut Vec<u8>, flags: u8, n: u32, mut value: usize) {
    let max = (1usize << n) - 1;
    if value < max {
        out.push(flags | value as u8);
        return;
    }
    out.push(flags | max as u8);
    value -= max;
    while value >= 128 {
        out.push(value as u8 & 0x7f | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

fn put_str(out: &mut Vec<u8>, s: &[u8]) {
    put_int(out, 0, 7, s.len());
    out.extend_from_slice(s);
}

/// The request side: header lists to header blocks.
pub(crate) struct Encoder {
    table: Table,
    /// A smaller table the server asked for, announced at the start of the
    /// next block.
    resize: Option<usize>,
}

impl Encoder {
    pub(crate) fn new() -> Encoder {
        Encoder {
            table: Table::new(DEFAULT_TABLE_SIZE),
            resize: None,
        }
    }

    /// The server's SETTINGS_HEADER_TABLE_SIZE: the table is kept within
    /// it (never above the default, which is all this side uses).
    pub(crate) fn set_limit(&mut self, limit: usize) {
        let max = limit.min(DEFAULT_TABLE_SIZE);
        if max != self.table.max {
            self.table.set_max(max);
            self.resize = Some(max);
        }
    }

    /// One header block: every header is indexed, so the next block that
    /// repeats it costs one byte for it.
    pub(crate) fn encode(&mut self, headers: &[(&str, &str)]) -> Vec<u8> {
        let mut out = Vec::new();
        if let Some(size) = self.resize.take() {
            put_int(&mut out, 0x20, 5, size);
        }
        for (name, value) in headers {
            let (n, v) = (name.as_bytes(), value.as_bytes());
            match self.table.find(n, v) {
                (Some(i), _) => put_int(&mut out, 0x80, 7, i),
                (None, by_name) => {
                    match by_name {
                        Some(i) => put_int(&mut out, 0x40, 6, i),
                        None => {
                            out.push(0x40);
                            put_str(&mut out, n);
                        }
                    }
                    put_str(&mut out, v);
                    self.table.add(n, v);
                }
            }
        }
        out
    }
}

/// The answer side: header blocks to header lists.
pub(crate) struct Decoder {
    table: Table,
}

impl Decoder {
    pub(crate) fn new() -> Decoder {
        Decoder {
            table: Table::new(DEFAULT_TABLE_SIZE),
        }
    }

    /// Decodes one whole header block. The decoded list may hold at most
    /// `max_list` bytes (names and values); a larger one is an error, as is
    /// any malformed block: after an error the connection must be dropped,
    /// since this table may no longer be the server's.
    pub(crate) fn decode(
        &mut self,
        block: &[u8],
        max_list: usize,
    ) -> Result<Vec<(String, Vec<u8>)>, String> {
        let mut headers = Vec::new();
        let mut total = 0usize;
        let mut r = Reader { b: block, at: 0 };
        while r.at < block.len() {
            let first = block[r.at];
            let (name, value, index) = if first & 0x80 != 0 {
                let i = r.int(7)?;
                let (n, v) = self.entry(i)?;
                (n, v, false)
            } else if first & 0xe0 == 0x20 {
                let size = r.int(5)?;
                if size > DEFAULT_TABLE_SIZE {
                    return Err(format!("a table size update to {size}, over the limit"));
                }
                self.table.set_max(size);
                continue;
            } else {
                // Literal: with incremental indexing (01), without (0000)
                // or never indexed (0001).
                let (prefix, index) = if first & 0x40 != 0 {
                    (6, true)
                } else {
                    (4, false)
                };
                let i = r.int(prefix)?;
                let name = if i == 0 {
                    r.string()?
                } else {
                    self.entry(i)?.0
                };
                (name, r.string()?, index)
            };
            total += name.len() + value.len();
            if total > max_list {
                return Err(format!("a header list over {max_list} bytes"));
            }
            if index {
                self.table.add(&name, &value);
            }
            let name = String::from_utf8(name).map_err(|_| "a header name that is not UTF-8")?;
            headers.push((name, value));
        }
        Ok(headers)
    }

    fn entry(&self, i: usize) -> Result<(Vec<u8>, Vec<u8>), String> {
        self.table
            .get(i)
            .map(|(n, v)| (n.to_vec(), v.to_vec()))
            .ok_or_else(|| format!("header index {i} is not in the table"))
    }
}

struct Reader<'a> {
    b: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn byte(&mut self) -> Result<u8, String> {
        let b = *self.b.get(self.at).ok_or("a header block cut short")?;
        self.at += 1;
        Ok(b)
    }
    fn int(&mut self, n: u32) -> Result<usize, String> {
        let max = (1usize << n) - 1;
        let mut value = usize::from(self.byte()?) & max;
        if value < max {
            return Ok(value);
        }
        let mut shift = 0;
        loop {
            let b = self.byte()?;
            if shift > 28 {
                return Err("an HPACK integer too large".into());
            }
            value += usize::from(b & 0x7f) << shift;
            shift += 7;
            if b & 0x80 == 0 {
                return Ok(value);
            }
        }
    }
    fn string(&mut self) -> Result<Vec<u8>, String> {
        let huffman = *self.b.get(self.at).ok_or("a header block cut short")? & 0x80 != 0;
        let len = self.int(7)?;
        let end = self
            .at
            .checked_add(len)
            .filter(|e| *e <= self.b.len())
            .ok_or("a header string runs past its block")?;
        let raw = &self.b[self.at..end];
        self.at = end;
        if huffman {
            let mut out = Vec::with_capacity(len * 8 / 5);
            huffman_decode(raw, &mut out)?;
            Ok(out)
        } else {
            Ok(raw.to_vec())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(s: &str) -> Vec<u8> {
        let s: String = s.split_whitespace().collect();
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex"))
            .collect()
    }

    fn text(h: &[(String, Vec<u8>)]) -> Vec<(String, String)> {
        h.iter()
            .map(|(n, v)| (n.clone(), String::from_utf8_lossy(v).into_owned()))
            .collect()
    }

    fn pairs(p: &[(&str, &str)]) -> Vec<(String, String)> {
        p.iter()
            .map(|(n, v)| (n.to_string(), v.to_string()))
            .collect()
    }

    /// The test-only encoder of the canonical code, from the lengths.
    fn huffman_encode(s: &[u8]) -> Vec<u8> {
        let c = canonical();
        let code_of = |sym: usize| {
            let l = usize::from(HUFFMAN_LENGTHS[sym]);
            let rank = c.symbols[usize::from(c.start[l])..]
                .iter()
                .position(|&x| usize::from(x) == sym)
                .expect("symbol listed");
            (c.first[l] + rank as u32, l)
        };
        let (mut acc, mut bits, mut out) = (0u64, 0usize, Vec::new());
        for &b in s {
            let (code, l) = code_of(usize::from(b));
            acc = acc << l | u64::from(code);
            bits += l;
            while bits >= 8 {
                bits -= 8;
                out.push((acc >> bits) as u8);
            }
        }
        if bits > 0 {
            out.push(((acc << (8 - bits)) | ((1 << (8 - bits)) - 1)) as u8);
        }
        out
    }

    #[test]
    fn the_rfc_huffman_request_examples_decode() {
        // RFC 7541 C.4: three requests on one connection, Huffman-coded.
        let mut d = Decoder::new();
        let one = hex("8286 8441 8cf1 e3c2 e5f2 3a6b a0ab 90f4 ff");
        assert_eq!(
            text(&d.decode(&one, 4096).expect("C.4.1")),
            pairs(&[
                (":method", "GET"),
                (":scheme", "http"),
                (":path", "/"),
                (":authority", "www.example.com")
            ])
        );
        let two = hex("8286 84be 5886 a8eb 1064 9cbf");
        assert_eq!(
            text(&d.decode(&two, 4096).expect("C.4.2")),
            pairs(&[
                (":method", "GET"),
                (":scheme", "http"),
                (":path", "/"),
                (":authority", "www.example.com"),
                ("cache-control", "no-cache")
            ])
        );
        let three = hex("8287 85bf 4088 25a8 49e9 5ba9 7d7f 8925 a849 e95b b8e8 b4bf");
        assert_eq!(
            text(&d.decode(&three, 4096).expect("C.4.3")),
            pairs(&[
                (":method", "GET"),
                (":scheme", "https"),
                (":path", "/index.html"),
                (":authority", "www.example.com"),
                ("custom-key", "custom-value")
            ])
        );
        assert_eq!(d.table.size, 164);
    }

    #[test]
    fn the_rfc_huffman_response_examples_decode_with_eviction() {
        // RFC 7541 C.6: a 256-byte table, so entries are evicted.
        let mut d = Decoder::new();
        d.table.set_max(256);
        let one = hex(
            "4882 6402 5885 aec3 771a 4b61 96d0 7abe 9410 54d4 44a8 2005 9504 0b81 66e0 82a6
             2d1b ff6e 919d 29ad 1718 63c7 8f0b 97c8 e9ae 82ae 43d3",
        );
        assert_eq!(
            text(&d.decode(&one, 4096).expect("C.6.1")),
            pairs(&[
                (":status", "302"),
                ("cache-control", "private"),
                ("date", "Mon, 21 Oct 2013 20:13:21 GMT"),
                ("location", "https://www.example.com")
            ])
        );
        let two = hex("4883 640e ffc1 c0bf");
        assert_eq!(
            text(&d.decode(&two, 4096).expect("C.6.2")),
            pairs(&[
                (":status", "307"),
                ("cache-control", "private"),
                ("date", "Mon, 21 Oct 2013 20:13:21 GMT"),
                ("location", "https://www.example.com")
            ])
        );
        let three = hex(
            "88c1 6196 d07a be94 1054 d444 a820 0595 040b 8166 e084 a62d 1bff c05a 839b d9ab
             77ad 94e7 821d d7f2 e6c7 b335 dfdf cd5b 3960 d5af 2708 7f36 72c1 ab27 0fb5 291f
             9587 3160 65c0 03ed 4ee5 b106 3d50 07",
        );
        assert_eq!(
            text(&d.decode(&three, 4096).expect("C.6.3")),
            pairs(&[
                (":status", "200"),
                ("cache-control", "private"),
                ("date", "Mon, 21 Oct 2013 20:13:22 GMT"),
                ("location", "https://www.example.com"),
                ("content-encoding", "gzip"),
                (
                    "set-cookie",
                    "foo=ASDJKHQKBZXOQWEOPIUAXQWEOIU; max-age=3600; version=1"
                )
            ])
        );
        assert_eq!(d.table.size, 215);
    }

    #[test]
    fn every_huffman_code_agrees_with_another_implementation() {
        // Each byte value alone and all of them in a row, encoded from the
        // lengths here and decoded by loona-hpack's own table.
        let all: Vec<u8> = (0..=255).collect();
        let mut inputs: Vec<Vec<u8>> = all.iter().map(|b| vec![*b]).collect();
        inputs.push(all.clone());
        inputs.push(b"application/vnd.kubernetes.protobuf".to_vec());
        for input in inputs {
            let coded = huffman_encode(&input);
            let theirs = loona_hpack::huffman::HuffmanDecoder::new()
                .decode(&coded)
                .expect("loona decodes");
            assert_eq!(theirs, input);
            let mut ours = Vec::new();
            huffman_decode(&coded, &mut ours).expect("ours decodes");
            assert_eq!(ours, input);
        }
    }

    #[test]
    fn bad_huffman_strings_are_errors() {
        let mut out = Vec::new();
        // Padding of a whole byte of ones.
        let mut coded = huffman_encode(b"a");
        coded.push(0xff);
        assert!(huffman_decode(&coded, &mut out).is_err());
        // Padding with a zero bit: 'a' is 00011 (5 bits), then 000.
        assert!(huffman_decode(&[0b0001_1000], &mut out).is_err());
        // EOS spelled out: thirty ones, then padding.
        assert!(huffman_decode(&[0xff, 0xff, 0xff, 0xff], &mut out).is_err());
    }

    #[test]
    fn our_blocks_decode_elsewhere_and_repeats_cost_a_byte_a_header() {
        let headers = [
            (":method", "PATCH"),
            (":scheme", "https"),
            (":authority", "10.0.0.1:6443"),
            (
                ":path",
                "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/edge-1",
            ),
            (
                "accept",
                "application/vnd.kubernetes.protobuf, application/json",
            ),
            ("content-type", "application/merge-patch+json"),
            (
                "user-agent",
                "tinylet/0.1.0 (linux/amd64) kubernetes/v1.20.2",
            ),
            ("authorization", "Bearer abc.def"),
        ];
        let mut ours = Encoder::new();
        let mut theirs = loona_hpack::Decoder::new();
        let first = ours.encode(&headers);
        let second = ours.encode(&headers);
        assert_eq!(second.len(), headers.len(), "{second:02x?}");
        for block in [first, second] {
            let got: Vec<(String, String)> = theirs
                .decode(&block)
                .expect("loona decodes our block")
                .into_iter()
                .map(|(n, v)| {
                    (
                        String::from_utf8(n).expect("name"),
                        String::from_utf8(v).expect("value"),
                    )
                })
                .collect();
            assert_eq!(got, pairs(&headers));
        }
        // Their blocks (indexed names, literals, the dynamic table) decode
        // here, twice in a row.
        let mut enc = loona_hpack::Encoder::new();
        let mut d = Decoder::new();
        let owned: Vec<(Vec<u8>, Vec<u8>)> = headers
            .iter()
            .map(|(n, v)| (n.as_bytes().to_vec(), v.as_bytes().to_vec()))
            .collect();
        for _ in 0..2 {
            let block = enc.encode(owned.iter().map(|(n, v)| (&n[..], &v[..])));
            assert_eq!(
                text(&d.decode(&block, 4096).expect("decode")),
                pairs(&headers)
            );
        }
    }

    #[test]
    fn a_smaller_table_from_the_server_is_announced_and_kept() {
        let mut e = Encoder::new();
        e.encode(&[("x-a", "1")]);
        e.set_limit(0);
        let block = e.encode(&[("x-a", "1")]);
        assert_eq!(block[0], 0x20, "a size update to 0 comes first");
        assert!(e.table.entries.is_empty());
        // With no table the header is a literal each time.
        let again = e.encode(&[("x-a", "1")]);
        assert_eq!(again, block[1..]);
        let mut d = loona_hpack::Decoder::new();
        let mut both = block.clone();
        both.extend_from_slice(&again);
        assert_eq!(d.decode(&both).expect("loona decodes").len(), 2);
    }

    #[test]
    fn random_blocks_are_decoded_or_refused_without_a_panic() {
        // A fixed xorshift sequence: short blocks of random bytes, and
        // valid blocks with one byte changed, into one decoder (its table
        // carries over, as on a connection).
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let mut d = Decoder::new();
        let mut e = Encoder::new();
        for i in 0..20_000 {
            let mut block = if i % 2 == 0 {
                (0..next() % 48).map(|_| next() as u8).collect::<Vec<u8>>()
            } else {
                e.encode(&[("x-n", &i.to_string()), (":path", "/api")])
            };
            if i % 2 == 1 && !block.is_empty() {
                let at = (next() as usize) % block.len();
                block[at] ^= 1 << (next() % 8);
            }
            if let Ok(list) = d.decode(&block, 4096) {
                assert!(list.iter().map(|(n, v)| n.len() + v.len()).sum::<usize>() <= 4096);
            }
            assert!(d.table.size <= d.table.max && d.table.max <= DEFAULT_TABLE_SIZE);
        }
    }

    #[test]
    fn malformed_blocks_and_big_lists_are_errors_not_panics() {
        let mut d = Decoder::new();
        for bad in [
            vec![0xbe],                                     // index 62: empty dynamic table
            vec![0x80],                                     // index 0
            vec![0x40, 0x05, b'a'],                         // name runs past the block
            vec![0x3f, 0xff, 0xff, 0x7f],                   // table size update over the limit
            vec![0x7f, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f], // integer too large
            vec![0x40, 0x81, 0x00, 0x00],                   // Huffman name with bad padding
        ] {
            assert!(d.decode(&bad, 4096).is_err(), "{bad:02x?}");
        }
        let mut d = Decoder::new();
        let mut block = vec![0x00, 0x01, b'x', 0x7f, 0xe9, 0x06];
        block.extend(std::iter::repeat_n(b'v', 1000));
        assert!(d.decode(&block, 500).is_err());
        assert_eq!(d.decode(&block, 2000).expect("fits").len(), 1);
    }
}
