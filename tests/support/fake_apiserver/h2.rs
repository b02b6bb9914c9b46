//! HTTP/2 (RFC 9113), the server side, on TLS connections whose client
//! chose "h2" by ALPN, as kube-apiserver v1.20 (Go's x/net/http2) serves
//! them: its SETTINGS (secure_serving.go: 256 KiB frames and stream
//! windows, 250 streams, a 250-stream connection window), a connection
//! WINDOW_UPDATE per request body read, and answers laid out as Go writes
//! them (fixtures 14b–14d): `:status`, the handler's headers sorted,
//! `content-length` (only for a body within Go's 4 KiB handler buffer),
//! `date`; the body in DATA frames, END_STREAM on the last, or on an empty
//! DATA frame after a body bigger than the buffer. HPACK is loona-hpack's
//! (not the agent's), which never Huffman-codes: header blocks are a
//! little bigger than Go's.
//!
//! The connection's thread takes requests one at a time: frames (of
//! several streams, interleaved) are read until a request is complete,
//! which is answered in full before more are read, unless the send windows
//! are shut. Stream errors are handled as connection errors (§5.4.1 allows
//! it): GOAWAY, then the connection closes.
//!
//! Watches stream as DATA frames, one per event, as the real server's
//! (fixture 14d): it took only the `WatchOut` seam in `watch`. While one
//! streams, frames are read only when the send windows are shut, so other
//! requests on that connection (and an RST_STREAM of the watch) wait for
//! its end; the node agent watches over HTTP/1.1.

use super::*;

use loona_hpack::{Decoder, Encoder};

const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

const DATA: u8 = 0x0;
const HEADERS: u8 = 0x1;
const PRIORITY: u8 = 0x2;
const RST_STREAM: u8 = 0x3;
const SETTINGS: u8 = 0x4;
const PUSH_PROMISE: u8 = 0x5;
const PING: u8 = 0x6;
const GOAWAY: u8 = 0x7;
const WINDOW_UPDATE: u8 = 0x8;
const CONTINUATION: u8 = 0x9;

const END_STREAM: u8 = 0x1;
const ACK: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const PADDED: u8 = 0x8;
const PRIORITY_FLAG: u8 = 0x20;

const NO_ERROR: u32 = 0x0;
const PROTOCOL_ERROR: u32 = 0x1;
const FLOW_CONTROL_ERROR: u32 = 0x3;
const STREAM_CLOSED: u32 = 0x5;
const FRAME_SIZE_ERROR: u32 = 0x6;
const COMPRESSION_ERROR: u32 = 0x9;
const ENHANCE_YOUR_CALM: u32 = 0xb;

/// The apiserver's MaxReadFrameSize, advertised as SETTINGS_MAX_FRAME_SIZE.
const MAX_READ_FRAME: usize = 256 * 1024;
const MAX_STREAMS: u32 = 250;
/// Go's SETTINGS_MAX_HEADER_LIST_SIZE: MaxHeaderBytes (1 MiB) + 320.
const MAX_HEADER_LIST: usize = (1 << 20) + 320;
/// The apiserver's MaxUploadBufferPerStream, as SETTINGS_INITIAL_WINDOW_SIZE.
const STREAM_WINDOW: i64 = 256 * 1024;
/// MaxUploadBufferPerConnection: a stream window per allowed stream.
const CONN_WINDOW: i64 = STREAM_WINDOW * MAX_STREAMS as i64;
/// The windows every connection and stream start with (RFC 9113 §6.9.2).
const DEFAULT_WINDOW: i64 = 65_535;
const MAX_WINDOW: i64 = (1 << 31) - 1;
/// Go's handler write buffer (handlerChunkWriteSize): a body up to this
/// size is sent when the handler returns, with its length.
const HANDLER_BUFFER: usize = 4096;
/// The HPACK dynamic table size both sides start with.
const TABLE_SIZE: usize = 4096;
/// How long a connection stays open after a GOAWAY for an error, reading
/// and dropping what the client still sends (Go's goAwayTimeout), so that
/// the GOAWAY is not lost to a reset.
const GOAWAY_LINGER: Duration = Duration::from_secs(1);

/// Why a connection ends.
enum Fail {
    Io(io::Error),
    /// A connection error: GOAWAY with this code and reason.
    Proto(u32, &'static str),
}

impl From<io::Error> for Fail {
    fn from(e: io::Error) -> Fail {
        Fail::Io(e)
    }
}

type H2Result<T> = Result<T, Fail>;

fn fail<T>(code: u32, why: &'static str) -> H2Result<T> {
    Err(Fail::Proto(code, why))
}

/// Appends one frame.
fn frame(out: &mut Vec<u8>, kind: u8, flags: u8, id: u32, payload: &[u8]) {
    out.extend_from_slice(&(payload.len() as u32).to_be_bytes()[1..]);
    out.push(kind);
    out.push(flags);
    out.extend_from_slice(&id.to_be_bytes());
    out.extend_from_slice(payload);
}

/// A frame's payload without its padding (PADDED flag).
fn unpad(flags: u8, p: &[u8]) -> H2Result<&[u8]> {
    if flags & PADDED == 0 {
        return Ok(p);
    }
    let Some((&pad, rest)) = p.split_first() else {
        return fail(FRAME_SIZE_ERROR, "PADDED frame without a pad length");
    };
    match rest.len().checked_sub(pad as usize) {
        Some(n) => Ok(&rest[..n]),
        None => fail(PROTOCOL_ERROR, "padding longer than the frame"),
    }
}

/// A stream whose request is being received: its header fields (pseudo
/// ones included), the body so far, and its receive window.
struct Incoming {
    fields: Vec<(String, String)>,
    body: Vec<u8>,
    /// Flow-controlled bytes received and not yet given back.
    unacked: i64,
    window: i64,
}

/// One HTTP/2 connection, server side.
struct H2<'a> {
    io: &'a mut BufReader<Conn>,
    /// Frames to write, sent by `flush` in one write.
    out: Vec<u8>,
    enc: Encoder<'static>,
    dec: Decoder<'static>,
    /// A table size the client's SETTINGS asked for, to announce at the
    /// start of the next header block.
    table_update: Option<usize>,
    /// The client's SETTINGS_MAX_FRAME_SIZE and SETTINGS_INITIAL_WINDOW_SIZE.
    peer_frame: usize,
    peer_window: i64,
    send_conn: i64,
    /// Send windows of the streams not answered in full yet.
    send: HashMap<u32, i64>,
    recv_conn: i64,
    incoming: HashMap<u32, Incoming>,
    /// A header block waiting for CONTINUATION: stream, HEADERS flags, bytes.
    block: Option<(u32, u8, Vec<u8>)>,
    /// Complete requests not answered yet, with the body bytes to give back
    /// to the connection window.
    ready: VecDeque<(u32, Request, i64)>,
    last_stream: u32,
    /// The client sent GOAWAY.
    closing: bool,
}

/// Serves one connection whose TLS handshake chose "h2", until it closes.
pub(super) fn serve(shared: &Arc<Shared>, io: &mut BufReader<Conn>) {
    let mut h = H2 {
        io,
        out: Vec::new(),
        enc: Encoder::new(),
        dec: Decoder::new(),
        table_update: None,
        peer_frame: 16_384,
        peer_window: DEFAULT_WINDOW,
        send_conn: DEFAULT_WINDOW,
        send: HashMap::new(),
        recv_conn: CONN_WINDOW,
        incoming: HashMap::new(),
        block: None,
        ready: VecDeque::new(),
        last_stream: 0,
        closing: false,
    };
    h.dec.set_max_allowed_table_size(TABLE_SIZE);
    match h.start().and_then(|_| h.run(shared)) {
        Err(Fail::Proto(code, why)) => h.goaway(code, why),
        // The client's GOAWAY is answered with ours, as Go's server does.
        Ok(()) if h.closing => h.goaway(NO_ERROR, ""),
        _ => {}
    }
}

impl H2<'_> {
    fn flush(&mut self) -> H2Result<()> {
        let out = std::mem::take(&mut self.out);
        let w = self.io.get_mut();
        w.write_all(&out)?;
        w.flush()?;
        Ok(())
    }

    fn tcp(&self) -> &TcpStream {
        self.io.get_ref().tcp()
    }

    /// Appends a WINDOW_UPDATE giving `n` bytes back (none if 0), on the
    /// connection's receive window for stream 0.
    fn window_update(&mut self, id: u32, n: i64) {
        if n > 0 {
            frame(
                &mut self.out,
                WINDOW_UPDATE,
                0,
                id,
                &(n as u32).to_be_bytes(),
            );
            if id == 0 {
                self.recv_conn += n;
            }
        }
    }

    /// Sends GOAWAY (with the reason as debug data), then lingers until the client closes (at most
    /// GOAWAY_LINGER) so that it reads the GOAWAY before the connection ends.
    fn goaway(&mut self, code: u32, why: &str) {
        let mut p = self.last_stream.to_be_bytes().to_vec();
        p.extend_from_slice(&code.to_be_bytes());
        p.extend_from_slice(why.as_bytes());
        frame(&mut self.out, GOAWAY, 0, 0, &p);
        if self.flush().is_err() {
            return;
        }
        let mut tcp = self.tcp();
        let _ = tcp.shutdown(Shutdown::Write);
        let deadline = Instant::now() + GOAWAY_LINGER;
        let mut buf = [0u8; 4096];
        while let Some(left) = deadline.checked_duration_since(Instant::now()) {
            if left.is_zero() || tcp.set_read_timeout(Some(left)).is_err() {
                return;
            }
            if !matches!(tcp.read(&mut buf), Ok(n) if n > 0) {
                return;
            }
        }
    }

    /// Our SETTINGS and connection window, then the client's preface and
    /// its SETTINGS, which must come first.
    fn start(&mut self) -> H2Result<()> {
        let mut settings = Vec::new();
        for (k, v) in [
            (0x5u16, MAX_READ_FRAME as u32),
            (0x3, MAX_STREAMS),
            (0x6, MAX_HEADER_LIST as u32),
            (0x4, STREAM_WINDOW as u32),
        ] {
            settings.extend_from_slice(&k.to_be_bytes());
            settings.extend_from_slice(&v.to_be_bytes());
        }
        frame(&mut self.out, SETTINGS, 0, 0, &settings);
        let more = (CONN_WINDOW - DEFAULT_WINDOW) as u32;
        frame(&mut self.out, WINDOW_UPDATE, 0, 0, &more.to_be_bytes());
        self.flush()?;
        let mut preface = [0u8; 24];
        self.io.read_exact(&mut preface)?;
        if &preface != PREFACE {
            return fail(PROTOCOL_ERROR, "bad connection preface");
        }
        let (kind, flags, id, p) = self.read_frame()?;
        if kind != SETTINGS || flags & ACK != 0 {
            return fail(PROTOCOL_ERROR, "the first frame is not SETTINGS");
        }
        self.on_frame(kind, flags, id, p)
    }

    /// Answers requests until the connection ends.
    fn run(&mut self, shared: &Arc<Shared>) -> H2Result<()> {
        while !shared.stop.load(Ordering::SeqCst) {
            let Some((id, req, replenish)) = self.next_request()? else {
                return Ok(());
            };
            if shared.black_hole.load(Ordering::SeqCst) {
                record(&mut shared.state.lock(), &req, "", 0);
                // Never answered, even after the black hole ends.
                hold_silent(shared, self.tcp());
                return Ok(());
            }
            // As Go's server once the handler has read the body: the
            // connection's window back (the stream is half-closed).
            self.window_update(0, replenish);
            let cert_user = self.io.get_ref().cert_user();
            match answer(shared, &req, cert_user) {
                Outcome::Reply(resp) => self.respond(id, &resp)?,
                Outcome::Watch(plan) => {
                    let mut w = H2Watch {
                        h: self,
                        id,
                        reset: false,
                    };
                    if !run_watch(shared, &mut w, plan) && !w.reset {
                        return Ok(());
                    }
                }
            }
        }
        Ok(())
    }

    /// The next complete request; None when the client sent GOAWAY.
    fn next_request(&mut self) -> H2Result<Option<(u32, Request, i64)>> {
        loop {
            if let Some(r) = self.ready.pop_front() {
                return Ok(Some(r));
            }
            if self.closing {
                return Ok(None);
            }
            self.next_frame()?;
        }
    }

    fn next_frame(&mut self) -> H2Result<()> {
        let (kind, flags, id, p) = self.read_frame()?;
        self.on_frame(kind, flags, id, p)
    }

    fn read_frame(&mut self) -> H2Result<(u8, u8, u32, Vec<u8>)> {
        let mut h = [0u8; 9];
        self.io.read_exact(&mut h)?;
        let len = u32::from_be_bytes([0, h[0], h[1], h[2]]) as usize;
        if len > MAX_READ_FRAME {
            return fail(
                FRAME_SIZE_ERROR,
                "frame larger than SETTINGS_MAX_FRAME_SIZE",
            );
        }
        let id = u32::from_be_bytes([h[5], h[6], h[7], h[8]]) & 0x7fff_ffff;
        let mut p = vec![0; len];
        self.io.read_exact(&mut p)?;
        Ok((h[3], h[4], id, p))
    }

    fn on_frame(&mut self, kind: u8, flags: u8, id: u32, p: Vec<u8>) -> H2Result<()> {
        if matches!(&self.block, Some((b, _, _)) if kind != CONTINUATION || id != *b) {
            return fail(PROTOCOL_ERROR, "a header block interrupted");
        }
        let on_stream = !matches!(kind, SETTINGS | PING | GOAWAY | WINDOW_UPDATE);
        if on_stream && kind <= CONTINUATION && id == 0 {
            return fail(PROTOCOL_ERROR, "a stream frame on stream 0");
        }
        if !on_stream && kind != WINDOW_UPDATE && id != 0 {
            return fail(PROTOCOL_ERROR, "a connection frame on a stream");
        }
        match kind {
            DATA => self.on_data(flags, id, &p),
            HEADERS => {
                let mut b = unpad(flags, &p)?;
                if flags & PRIORITY_FLAG != 0 {
                    let Some(rest) = b.get(5..) else {
                        return fail(FRAME_SIZE_ERROR, "HEADERS too short for its priority");
                    };
                    b = rest;
                }
                self.block = Some((id, flags, b.to_vec()));
                self.header_block_part(flags)
            }
            CONTINUATION => {
                let Some((_, _, block)) = &mut self.block else {
                    return fail(PROTOCOL_ERROR, "CONTINUATION without HEADERS");
                };
                if block.len() + p.len() > MAX_HEADER_LIST {
                    return fail(ENHANCE_YOUR_CALM, "header block too large");
                }
                block.extend_from_slice(&p);
                self.header_block_part(flags)
            }
            PRIORITY if p.len() != 5 => fail(FRAME_SIZE_ERROR, "PRIORITY of a wrong size"),
            RST_STREAM if p.len() != 4 => fail(FRAME_SIZE_ERROR, "RST_STREAM of a wrong size"),
            RST_STREAM if id > self.last_stream => {
                fail(PROTOCOL_ERROR, "RST_STREAM of an idle stream")
            }
            RST_STREAM => {
                // Dropped, received in part or in whole; its body's bytes
                // go back to the connection window.
                self.send.remove(&id);
                let mut back = self.incoming.remove(&id).map_or(0, |s| s.unacked);
                self.ready.retain(|(i, _, n)| {
                    back += if *i == id { *n } else { 0 };
                    *i != id
                });
                self.window_update(0, back);
                self.flush()
            }
            SETTINGS => self.on_settings(flags, &p),
            PUSH_PROMISE => fail(PROTOCOL_ERROR, "PUSH_PROMISE from a client"),
            PING if p.len() != 8 => fail(FRAME_SIZE_ERROR, "PING of a wrong size"),
            PING if flags & ACK == 0 => {
                frame(&mut self.out, PING, ACK, 0, &p);
                self.flush()
            }
            GOAWAY => {
                self.closing = true;
                Ok(())
            }
            WINDOW_UPDATE => self.on_window_update(id, &p),
            // PRIORITY, PING acknowledgements, unknown types.
            _ => Ok(()),
        }
    }

    fn on_window_update(&mut self, id: u32, p: &[u8]) -> H2Result<()> {
        let Ok(b) = <[u8; 4]>::try_from(p) else {
            return fail(FRAME_SIZE_ERROR, "WINDOW_UPDATE of a wrong size");
        };
        let inc = i64::from(u32::from_be_bytes(b) & 0x7fff_ffff);
        if inc == 0 {
            return fail(PROTOCOL_ERROR, "WINDOW_UPDATE of 0");
        }
        let window = if id == 0 {
            &mut self.send_conn
        } else if let Some(w) = self.send.get_mut(&id) {
            w
        } else if id > self.last_stream {
            return fail(PROTOCOL_ERROR, "WINDOW_UPDATE of an idle stream");
        } else {
            return Ok(()); // a stream answered already
        };
        *window += inc;
        if *window > MAX_WINDOW {
            return fail(FLOW_CONTROL_ERROR, "window above 2^31-1");
        }
        Ok(())
    }

    fn on_settings(&mut self, flags: u8, p: &[u8]) -> H2Result<()> {
        if flags & ACK != 0 {
            return match p.is_empty() {
                true => Ok(()),
                false => fail(FRAME_SIZE_ERROR, "SETTINGS ACK with a payload"),
            };
        }
        if !p.len().is_multiple_of(6) {
            return fail(FRAME_SIZE_ERROR, "SETTINGS of a wrong size");
        }
        for s in p.chunks_exact(6) {
            let v = u32::from_be_bytes([s[2], s[3], s[4], s[5]]);
            match u16::from_be_bytes([s[0], s[1]]) {
                0x1 => {
                    // Our encoder never uses more than both sides start
                    // with; the size is announced even when unchanged, as
                    // Go's encoder does.
                    let size = (v as usize).min(TABLE_SIZE);
                    self.enc.set_max_table_size(size);
                    self.table_update = Some(size);
                }
                0x2 if v > 1 => return fail(PROTOCOL_ERROR, "ENABLE_PUSH not 0 or 1"),
                0x4 => {
                    let v = i64::from(v);
                    if v > MAX_WINDOW {
                        return fail(FLOW_CONTROL_ERROR, "INITIAL_WINDOW_SIZE above 2^31-1");
                    }
                    let delta = v - self.peer_window;
                    self.peer_window = v;
                    for w in self.send.values_mut() {
                        *w += delta;
                        if *w > MAX_WINDOW {
                            return fail(FLOW_CONTROL_ERROR, "window above 2^31-1");
                        }
                    }
                }
                0x5 if !(16_384..=16_777_215).contains(&v) => {
                    return fail(PROTOCOL_ERROR, "MAX_FRAME_SIZE out of range")
                }
                0x5 => self.peer_frame = v as usize,
                _ => {}
            }
        }
        frame(&mut self.out, SETTINGS, ACK, 0, &[]);
        self.flush()
    }

    fn on_data(&mut self, flags: u8, id: u32, p: &[u8]) -> H2Result<()> {
        let n = p.len() as i64;
        self.recv_conn -= n;
        if self.recv_conn < 0 {
            return fail(FLOW_CONTROL_ERROR, "DATA beyond the connection window");
        }
        let data = unpad(flags, p)?;
        let Some(s) = self.incoming.get_mut(&id) else {
            return fail(STREAM_CLOSED, "DATA on a stream not open");
        };
        s.window -= n;
        if s.window < 0 {
            return fail(FLOW_CONTROL_ERROR, "DATA beyond the stream window");
        }
        if s.body.len() + data.len() > MAX_BODY {
            return fail(ENHANCE_YOUR_CALM, "request body too large");
        }
        s.body.extend_from_slice(data);
        s.unacked += n;
        if flags & END_STREAM != 0 {
            return self.complete(id);
        }
        if s.unacked >= STREAM_WINDOW / 2 {
            // A body still arriving, as Go's handler reads it: both
            // windows back, so that bodies above a window can finish.
            let back = std::mem::take(&mut s.unacked);
            s.window += back;
            self.window_update(0, back);
            self.window_update(id, back);
            self.flush()?;
        }
        Ok(())
    }

    /// After a HEADERS or CONTINUATION frame: decodes the block if complete.
    fn header_block_part(&mut self, flags: u8) -> H2Result<()> {
        if flags & END_HEADERS == 0 {
            return Ok(());
        }
        let Some((id, flags, block)) = self.block.take() else {
            return Ok(());
        };
        let mut fields = Vec::new();
        let mut size = 0;
        let decoded = self.dec.decode_with_cb(&block, |k, v| {
            size += k.len() + v.len() + 32;
            if size <= MAX_HEADER_LIST {
                let k = String::from_utf8_lossy(&k).to_ascii_lowercase();
                fields.push((k, String::from_utf8_lossy(&v).into_owned()));
            }
        });
        if decoded.is_err() {
            return fail(COMPRESSION_ERROR, "bad header block");
        }
        if size > MAX_HEADER_LIST {
            return fail(ENHANCE_YOUR_CALM, "header list too large");
        }
        let end = flags & END_STREAM != 0;
        if self.incoming.contains_key(&id) {
            // Trailers: they must end the stream; their fields are dropped.
            return match end {
                true => self.complete(id),
                false => fail(PROTOCOL_ERROR, "trailers without END_STREAM"),
            };
        }
        if id % 2 == 0 || id <= self.last_stream {
            return fail(PROTOCOL_ERROR, "HEADERS on a stream not new");
        }
        if self.incoming.len() >= MAX_STREAMS as usize {
            return fail(
                PROTOCOL_ERROR,
                "more streams than SETTINGS_MAX_CONCURRENT_STREAMS",
            );
        }
        self.last_stream = id;
        self.send.insert(id, self.peer_window);
        let s = Incoming {
            fields,
            body: Vec::new(),
            unacked: 0,
            window: STREAM_WINDOW,
        };
        self.incoming.insert(id, s);
        match end {
            true => self.complete(id),
            false => Ok(()),
        }
    }

    /// A stream's request is complete: it joins `ready`.
    fn complete(&mut self, id: u32) -> H2Result<()> {
        let Some(s) = self.incoming.remove(&id) else {
            return Ok(());
        };
        let (mut method, mut path, mut authority) = (None, None, None);
        let mut headers = Vec::new();
        for (k, v) in s.fields {
            match k.as_str() {
                ":method" => method = Some(v),
                ":path" => path = Some(v),
                ":authority" => authority = Some(v),
                k if k.starts_with(':') => {}
                _ => headers.push((k, v)),
            }
        }
        let (Some(method), Some(path)) = (method, path) else {
            return fail(PROTOCOL_ERROR, "a request without :method or :path");
        };
        if let Some(a) = authority.filter(|_| !headers.iter().any(|(k, _)| k == "host")) {
            headers.insert(0, ("host".to_string(), a));
        }
        let req = Request::new(method, &path, headers, s.body, false, true);
        self.ready.push_back((id, req, s.unacked));
        Ok(())
    }

    /// Appends a header block (HEADERS, then CONTINUATION at the client's
    /// frame size).
    fn headers(&mut self, id: u32, fields: &[(String, String)], end_stream: bool) {
        let mut block = Vec::new();
        if let Some(size) = self.table_update.take() {
            let mut n = loona_hpack::encoder::encode_integer(size, 5);
            n[0] |= 0x20;
            block.extend_from_slice(&n);
        }
        let fields = fields.iter().map(|(k, v)| (k.as_bytes(), v.as_bytes()));
        block.extend_from_slice(&self.enc.encode(fields));
        let parts: Vec<&[u8]> = block.chunks(self.peer_frame).collect();
        for (i, part) in parts.iter().enumerate() {
            let kind = if i == 0 { HEADERS } else { CONTINUATION };
            let mut flags = if i + 1 == parts.len() { END_HEADERS } else { 0 };
            if i == 0 && end_stream {
                flags |= END_STREAM;
            }
            frame(&mut self.out, kind, flags, id, part);
        }
    }

    /// Appends `body` as DATA frames within the send windows and the
    /// client's frame size, END_STREAM on the last if `end`. When the
    /// windows are shut, what is appended goes out and frames are read
    /// until they open. False if the client reset the stream.
    fn data(&mut self, id: u32, body: &[u8], end: bool) -> H2Result<bool> {
        let mut rest = body;
        loop {
            let Some(&window) = self.send.get(&id) else {
                return Ok(false);
            };
            let n = window.min(self.send_conn).max(0) as usize;
            let n = n.min(self.peer_frame).min(rest.len());
            if n == 0 && !rest.is_empty() {
                self.flush()?;
                self.next_frame()?;
                continue;
            }
            let (chunk, more) = rest.split_at(n);
            rest = more;
            self.send_conn -= n as i64;
            self.send.insert(id, window - n as i64);
            let last = rest.is_empty();
            frame(
                &mut self.out,
                DATA,
                if end && last { END_STREAM } else { 0 },
                id,
                chunk,
            );
            if last {
                if end {
                    self.send.remove(&id);
                }
                return Ok(true);
            }
        }
    }

    /// Writes a whole answer, in one write when the windows allow.
    fn respond(&mut self, id: u32, resp: &Resp) -> H2Result<()> {
        let body = resp.body();
        let mut fields = vec![(":status".to_string(), resp.code.to_string())];
        fields.extend(
            resp.fields()
                .into_iter()
                .map(|(k, v)| (k.to_ascii_lowercase(), v)),
        );
        let whole = body.len() <= HANDLER_BUFFER;
        if whole {
            fields.push(("content-length".to_string(), body.len().to_string()));
        }
        fields.push(("date".to_string(), http_date()));
        self.headers(id, &fields, body.is_empty());
        if body.is_empty() {
            self.send.remove(&id);
        } else if self.data(id, body, whole)? && !whole {
            // Go's handler wrote past its buffer: the end comes apart.
            frame(&mut self.out, DATA, END_STREAM, id, &[]);
            self.send.remove(&id);
        }
        self.flush()
    }
}

/// A watch streaming on one HTTP/2 stream.
struct H2Watch<'a, 'b> {
    h: &'a mut H2<'b>,
    id: u32,
    /// The client reset the stream: the watch ends, the connection stays.
    reset: bool,
}

impl H2Watch<'_, '_> {
    fn io(&mut self, r: H2Result<()>) -> io::Result<()> {
        match r {
            Ok(()) => Ok(()),
            Err(Fail::Io(e)) => Err(e),
            Err(Fail::Proto(code, why)) => {
                self.h.goaway(code, why);
                Err(io::Error::new(io::ErrorKind::InvalidData, why))
            }
        }
    }
}

impl WatchOut for H2Watch<'_, '_> {
    fn head(&mut self) -> io::Result<()> {
        let fields = [
            (":status", "200".to_string()),
            ("cache-control", "no-cache, private".to_string()),
            ("content-type", "application/json".to_string()),
            ("date", http_date()),
        ]
        .map(|(k, v)| (k.to_string(), v));
        self.h.headers(self.id, &fields, false);
        let r = self.h.flush();
        self.io(r)
    }
    fn data(&mut self, bytes: &[u8]) -> io::Result<()> {
        match self.h.data(self.id, bytes, false) {
            Ok(false) => {
                self.reset = true;
                Err(io::ErrorKind::ConnectionReset.into())
            }
            r => {
                let r = r.and_then(|_| self.h.flush());
                self.io(r)
            }
        }
    }
    fn end(&mut self) -> io::Result<()> {
        if self.h.send.remove(&self.id).is_some() {
            frame(&mut self.h.out, DATA, END_STREAM, self.id, &[]);
        }
        let r = self.h.flush();
        self.io(r)
    }
    fn tcp(&self) -> &TcpStream {
        self.h.tcp()
    }
}
