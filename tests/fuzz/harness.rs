//! The fuzz harness: one function per fuzz target, each feeding the bytes
//! to the entry point the node uses on that input and checking what every
//! answer must satisfy. The fuzz targets in `fuzz_targets/` call these, and
//! the main test binary (`tests/fuzz_regressions.rs`) replays the seed
//! corpus and every crash file kept under `regressions/` through them, so a
//! crash found once stays fixed.
//!
//! A function returns normally for any input; a panic (an assertion here, or
//! one in tinylet) is a finding.

use std::cell::OnceCell;
use std::io::{self, Read};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tinylet::config::Pod;
use tinylet::images::keyring::{urls_match, Keyring, DOCKER_CFG_KEY, DOCKER_CONFIG_JSON_KEY};
use tinylet::kube::{
    decode_object, load_kubeconfig, read_list, Client, ClientOptions, KubeConfig, ListError,
    ListItem, WatchEvent, WatchStream, MAX_EVENT, MAX_OBJECT,
};
use tinylet::volume::Keys;
use ureq::unversioned::resolver::{ResolvedSocketAddrs, Resolver};
use ureq::unversioned::transport::{
    Buffers, ConnectionDetails, Connector, LazyBuffers, NextTimeout, Transport,
};

/// A fuzz target's function: any input, never a panic.
pub type Harness = fn(&[u8]);

/// The fuzz targets, by name (the directories of `corpus/` and `regressions/`).
pub const TARGETS: [(&str, Harness); 6] = [
    ("manifest", manifest),
    ("kubeconfig", kubeconfig),
    ("watch_stream", watch_stream),
    ("http_response", http_response),
    ("docker_config_glob", docker_config_glob),
    ("list_stream", list_stream),
];

const NODE: &str = "edge-1";

/// `manifest`: the bytes are a static pod manifest, read as the file source
/// reads one file (one pod, YAML or JSON, then the static-pod defaults and
/// validation) and as the HTTP source reads a body (one pod or a `PodList`,
/// every item defaulted and validated).
pub fn manifest(data: &[u8]) {
    let file = "/etc/kubernetes/manifests/fuzz.yaml";
    match tinylet::config::parse_manifest(data, file, NODE) {
        Ok(pod) => {
            check_defaulted(&pod);
            check_sysctls(&pod);
        }
        Err(e) => assert!(!e.is_empty()),
    }
    // The same bytes as an `--allowed-unsafe-sysctls` list.
    let patterns: Vec<String> = String::from_utf8_lossy(data)
        .split(',')
        .map(str::to_string)
        .collect();
    if let Err(e) = tinylet::sysctl::Allowlist::new(&patterns) {
        assert!(!e.is_empty());
    }
    let url = "http://manifests.invalid/pods";
    match tinylet::config::parse_manifests(data, url, NODE) {
        Ok(pods) => pods.iter().for_each(check_defaulted),
        Err(e) => assert!(e.starts_with(url), "an error without the URL: {e}"),
    }
}

/// Sysctl admission of an accepted pod: an answer, and a refusal says
/// which sysctl is forbidden.
fn check_sysctls(pod: &Pod) {
    let allow = tinylet::sysctl::Allowlist::new(&["net.*".to_string(), "kernel.msg*".to_string()]);
    for list in [Ok(Default::default()), allow] {
        let list: tinylet::sysctl::Allowlist = list.expect("valid patterns");
        if let Err(r) = list.admit(pod) {
            assert!(r.starts_with("forbidden sysctl: "), "{r}");
        }
    }
}

/// What every pod a manifest source accepts has after the defaults.
fn check_defaulted(pod: &Pod) {
    let name = pod.metadata.name.as_deref().unwrap_or("");
    assert!(name.ends_with("-edge-1"), "name {name:?}");
    assert!(pod.metadata.uid.as_deref().is_some_and(|u| !u.is_empty()));
    let node = pod.spec.as_ref().and_then(|s| s.node_name.as_deref());
    assert_eq!(node, Some(NODE));
}

/// A throwaway self-signed P-256 certificate and its key, made for these
/// tests only.
const PEM_CERT: &str = concat!(
    "-----BEGIN CERTIFICATE-----\n",
    "MIIBeTCCAR+gAwIBAgIUdGR2teN4UGoe49XYypA568CmTHMwCgYIKoZIzj0EAwIw\n",
    "EjEQMA4GA1UEAwwHZnV6ei1jYTAeFw0yNjExMjQwMjUxMzBaFw0zNjExMjEwMjUx\n",
    "MzBaMBIxEDAOBgNVBAMMB2Z1enotY2EwWTATBgcqhkjOPQIBBggqhkjOPQMBBwNC\n",
    "AAS/NSou0itI41fVAQz+4rZelQ9gEana/XA6lI8MiZF/sgB/YmRQ/ebBAurg4zGm\n",
    "c2ystgNQ5ZZ7F8KNMdI8WRG4o1MwUTAdBgNVHQ4EFgQUKJlkb2mItEVqtN1b+Q2T\n",
    "H9VzUp8wHwYDVR0jBBgwFoAUKJlkb2mItEVqtN1b+Q2TH9VzUp8wDwYDVR0TAQH/\n",
    "BAUwAwEB/zAKBggqhkjOPQQDAgNIADBFAiBzAR/sP/MYYQoKniZ8rfWdUQcGgb8C\n",
    "Uisppr6y2Waa3wIhAPHE/c/SiXCF48Ugd2qzgMKLJWJFjhd7I3IiMbFRFoZY\n",
    "-----END CERTIFICATE-----\n",
);
const PEM_KEY: &str = concat!(
    "-----BEGIN PRIVATE KEY-----\n",
    "MIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQg2AZ2tdIM89AU5+R/\n",
    "1wySk836obLSeVugEmhDuijM2AyhRANCAAS/NSou0itI41fVAQz+4rZelQ9gEana\n",
    "/XA6lI8MiZF/sgB/YmRQ/ebBAurg4zGmc2ystgNQ5ZZ7F8KNMdI8WRG4\n",
    "-----END PRIVATE KEY-----\n",
);

thread_local! {
    /// A private directory holding `kubeconfig` and the files the seeds
    /// name (`ca.crt`, `client.crt`, `client.key`, `token`).
    static KUBECONFIG_DIR: OnceCell<(tempfile::TempDir, PathBuf)> = const { OnceCell::new() };
}

/// `kubeconfig`: the bytes are a kubeconfig file, loaded by
/// `load_kubeconfig` (current context, cluster and user, base64 data, the
/// files it names) and, when it loads, turned into a `Client` (certificates
/// and key parsed into the TLS settings) as the node does at start. No
/// request is sent.
pub fn kubeconfig(data: &[u8]) {
    KUBECONFIG_DIR.with(|cell| {
        let (_, path) = cell.get_or_init(|| {
            let dir = tempfile::tempdir().expect("a temporary directory");
            for (name, text) in [
                ("ca.crt", PEM_CERT),
                ("client.crt", PEM_CERT),
                ("client.key", PEM_KEY),
                ("token", "a-token\n"),
            ] {
                std::fs::write(dir.path().join(name), text).expect("write a referenced file");
            }
            let path = dir.path().join("kubeconfig");
            (dir, path)
        });
        std::fs::write(path, data).expect("write the kubeconfig");
        let file = path.display().to_string();
        match load_kubeconfig(path) {
            Ok(config) => {
                let server = &config.server;
                assert!(server.starts_with("https://") || server.starts_with("http://"));
                if let Err(e) = Client::new(&config, client_options()) {
                    assert!(e.starts_with(&file), "an error without the file: {e}");
                }
            }
            Err(e) => assert!(e.starts_with(&file), "an error without the file: {e}"),
        }
    });
}

fn client_options() -> ClientOptions {
    ClientOptions {
        qps: 0.0,
        burst: 1,
        timeout: Duration::from_secs(10),
        user_agent: "tinylet-fuzz".into(),
    }
}

/// A body handed out `piece` bytes per read, then its end or a reset.
struct Pieces {
    data: Vec<u8>,
    pos: usize,
    piece: usize,
    fail_at_end: bool,
}

impl Read for Pieces {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let left = self.data.len() - self.pos;
        if left == 0 && self.fail_at_end {
            return Err(io::Error::new(io::ErrorKind::ConnectionReset, "reset"));
        }
        let n = left.min(self.piece).min(buf.len());
        buf[..n].copy_from_slice(&self.data[self.pos..self.pos + n]);
        self.pos += n;
        Ok(n)
    }
}

const WATCH_PATH: &str = "/api/v1/pods?fieldSelector=spec.nodeName%3Dedge-1&watch=true";

/// `watch_stream`: the bytes are the body of a watch answer, read by the
/// client's `WatchStream` (newline framing, the line cap, event decoding),
/// every object decoded as the reflector stores a pod.
///
/// Input: one control byte, then the body. The control byte sets the size
/// of the reads the body arrives in (bits 0-5: 1 to 64 bytes, so events
/// split across reads at every offset), a line cap of 256 bytes instead of
/// the client's (bit 6), and a read error instead of the body's end (bit 7).
pub fn watch_stream(data: &[u8]) {
    let Some((&control, body)) = data.split_first() else {
        return;
    };
    let reader = Pieces {
        data: body.to_vec(),
        pos: 0,
        piece: 1 + usize::from(control & 0x3f),
        fail_at_end: control & 0x80 != 0,
    };
    let max_line = if control & 0x40 != 0 { 256 } else { MAX_EVENT };
    let stream = WatchStream::new(
        Box::new(reader),
        WATCH_PATH,
        "https://apiserver.invalid:6443".to_string(),
        max_line,
    );
    read_events(stream, body.len());
}

/// Reads a watch to its end as the reflector does, decoding every object;
/// `len` bounds the number of events.
fn read_events(mut stream: WatchStream, len: usize) {
    let mut events = 0usize;
    while let Some(event) = stream.next() {
        let _ = stream.has_buffered_event();
        events += 1;
        assert!(events <= len + 1, "more events than bytes");
        match event {
            Ok(WatchEvent::Added(obj) | WatchEvent::Modified(obj) | WatchEvent::Deleted(obj)) => {
                let _ = decode_object::<Pod>(obj);
            }
            Ok(WatchEvent::Bookmark { resource_version }) => assert!(!resource_version.is_empty()),
            Ok(WatchEvent::TooLarge { bytes, .. }) => assert!(bytes > 0),
            Ok(WatchEvent::Error(e)) | Err(e) => {
                assert!(e.to_string().starts_with("GET /api/v1/pods?"), "{e}");
            }
        }
    }
}

/// One connection's bytes from the server, handed out `piece` bytes per
/// read; what the client sends is discarded. Its end is the end of the
/// connection, as a socket's read of 0 bytes.
#[derive(Debug)]
struct Wire {
    response: Arc<[u8]>,
    pos: usize,
    piece: usize,
    buffers: LazyBuffers,
}

impl Transport for Wire {
    fn buffers(&mut self) -> &mut dyn Buffers {
        &mut self.buffers
    }

    fn transmit_output(
        &mut self,
        _amount: usize,
        _timeout: NextTimeout,
    ) -> Result<(), ureq::Error> {
        Ok(())
    }

    fn await_input(&mut self, _timeout: NextTimeout) -> Result<bool, ureq::Error> {
        let buf = self.buffers.input_append_buf();
        let n = (self.response.len() - self.pos)
            .min(self.piece)
            .min(buf.len());
        buf[..n].copy_from_slice(&self.response[self.pos..self.pos + n]);
        self.buffers.input_appended(n);
        self.pos += n;
        Ok(n > 0)
    }

    fn is_open(&mut self) -> bool {
        // Never pooled: every request gets a fresh connection and the
        // whole answer again.
        false
    }
}

/// Connects every request to a new [`Wire`] with the same answer.
#[derive(Debug, Clone)]
struct WireConnector {
    response: Arc<[u8]>,
    piece: usize,
}

impl Connector for WireConnector {
    type Out = Wire;

    fn connect(
        &self,
        details: &ConnectionDetails,
        _chained: Option<()>,
    ) -> Result<Option<Wire>, ureq::Error> {
        Ok(Some(Wire {
            response: self.response.clone(),
            pos: 0,
            piece: self.piece,
            buffers: LazyBuffers::new(
                details.config.input_buffer_size(),
                details.config.output_buffer_size(),
            ),
        }))
    }
}

/// Resolves every host to one address without DNS (the connector ignores it).
#[derive(Debug, Clone)]
struct NoDns;

impl Resolver for NoDns {
    fn resolve(
        &self,
        _uri: &ureq::http::Uri,
        _config: &ureq::config::Config,
        _timeout: NextTimeout,
    ) -> Result<ResolvedSocketAddrs, ureq::Error> {
        let mut addrs = self.empty();
        addrs.push(SocketAddr::from(([127, 0, 0, 1], 6443)));
        Ok(addrs)
    }
}

const LIST_PATH: &str =
    "/api/v1/pods?fieldSelector=spec.nodeName%3Dedge-1&limit=500&resourceVersion=0";

/// `http_response`: the bytes are the raw HTTP/1.1 answer of the apiserver
/// (status line, headers, a plain, `Content-Length` or chunked body),
/// served through an in-memory transport under ureq to the API client,
/// which sends a LIST and a watch as the reflector does and reads both
/// answers through its own code: `Client::list` (status, `Status` errors,
/// the list read one item at a time), the items decoded as pods, and
/// `Client::watch` read to its end as in `watch_stream`.
///
/// Input: one control byte, then the answer. The control byte sets the size
/// of the reads the answer arrives in: bits 0-6 give 1 to 128 bytes, bit 7
/// hands it out whole.
pub fn http_response(data: &[u8]) {
    let Some((&control, response)) = data.split_first() else {
        return;
    };
    let piece = if control & 0x80 != 0 {
        usize::MAX
    } else {
        1 + usize::from(control & 0x7f)
    };
    let connector = WireConnector {
        response: Arc::from(response),
        piece,
    };
    let config = KubeConfig {
        server: "http://apiserver.invalid:6443".into(),
        token: Some("a-token".into()),
        ..KubeConfig::default()
    };
    let client = Client::with_connector(&config, client_options(), connector, NoDns)
        .expect("a client without TLS settings");
    let mut items = 0usize;
    match client.list(LIST_PATH, MAX_OBJECT, &mut |item| {
        items += 1;
        take_item(item);
    }) {
        Ok(meta) => {
            assert!(!meta.resource_version.is_empty());
            assert!(items as u64 <= meta.bytes, "more items than bytes");
        }
        Err(e) => assert!(e.to_string().starts_with("GET /api/v1/pods?"), "{e}"),
    }
    match client.watch(WATCH_PATH, Duration::from_secs(330)) {
        Ok(stream) => read_events(stream, response.len()),
        Err(e) => assert!(e.to_string().starts_with("GET /api/v1/pods?"), "{e}"),
    }
}

/// `docker_config_glob`: the registry-key matching of image pull secrets.
/// The first line is a docker config key (host labels may hold `*`, `?`,
/// `[...]` and `\` escapes) and the second an image repository; they go
/// through `urls_match`, which must answer in time linear-ish in their
/// lengths whatever the pattern. The rest of the input is read as a
/// `.dockerconfigjson` and as a `.dockercfg` secret value, and the keyring
/// looked up for the repository.
pub fn docker_config_glob(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let mut lines = text.splitn(3, '\n');
    let key = lines.next().unwrap_or("");
    let repo = lines.next().unwrap_or("");
    let secret = lines.next().unwrap_or("");
    let _ = urls_match(key, repo);
    // A key without wildcards or a port matches itself, and a `*` in place
    // of its first host label still does.
    if !key.contains(['*', '?', '[', '\\', ':']) {
        assert!(urls_match(key, key), "{key:?} does not match itself");
        let first_label_end = key.find(['.', '/']).unwrap_or(key.len());
        let starred = format!("*{}", &key[first_label_end..]);
        assert!(
            urls_match(&starred, key),
            "{starred:?} does not match {key:?}"
        );
    }
    for secret_key in [DOCKER_CONFIG_JSON_KEY, DOCKER_CFG_KEY] {
        let mut keys = Keys::new();
        keys.insert(secret_key.to_string(), secret.as_bytes().to_vec());
        match Keyring::from_secrets(&[("ns/fuzz".to_string(), keys)]) {
            Ok(keyring) => {
                let _ = keyring.lookup(repo);
            }
            Err(e) => assert!(e.starts_with("secret ns/fuzz: "), "{e}"),
        }
    }
}

/// An item of a list, decoded as the reflector stores a pod.
fn take_item(item: ListItem) {
    match item {
        ListItem::Object(obj) => {
            let _ = decode_object::<Pod>(obj);
        }
        ListItem::TooLarge { bytes, .. } => assert!(bytes > 0),
    }
}

/// `list_stream`: the bytes are the body of a LIST answer, read by the
/// incremental list decoder (`read_list`: items one at a time, the cap per
/// item, metadata before or after the items), every item decoded as the
/// reflector stores a pod.
///
/// Input: one control byte, then the body. The control byte sets the size
/// of the reads the body arrives in (bits 0-5: 1 to 64 bytes, so items
/// split across reads at every offset), a cap of 256 bytes per item
/// instead of the client's (bit 6), and a read error instead of the body's
/// end (bit 7).
pub fn list_stream(data: &[u8]) {
    let Some((&control, body)) = data.split_first() else {
        return;
    };
    let mut reader = Pieces {
        data: body.to_vec(),
        pos: 0,
        piece: 1 + usize::from(control & 0x3f),
        fail_at_end: control & 0x80 != 0,
    };
    let max_object = if control & 0x40 != 0 { 256 } else { MAX_OBJECT };
    let mut items = 0usize;
    let mut over = 0u64;
    let result = read_list(&mut reader, max_object, &mut |item| {
        items += 1;
        if let ListItem::TooLarge { bytes, .. } = &item {
            assert!(*bytes > max_object as u64, "{bytes} bytes skipped");
            over += bytes;
        }
        take_item(item);
    });
    assert!(items <= body.len(), "more items than bytes");
    match result {
        Ok(meta) => {
            assert!(!meta.resource_version.is_empty());
            assert_eq!(meta.bytes, body.len() as u64);
            assert!(over <= meta.bytes);
        }
        Err(ListError::Read(e)) => assert!(reader.fail_at_end, "a read error: {e}"),
        Err(ListError::Invalid(m)) => assert!(!m.is_empty()),
    }
}
