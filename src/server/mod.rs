//! The node's API (upstream's kubelet server): the HTTPS server on
//! `--port` (10250) that the apiserver calls for logs, exec, attach and
//! port-forward, Prometheus and metrics-server read, and the plain
//! health and read-only ports. It reads the node's state and the runtime,
//! and never changes a pod.
//!
//! `poll` accepts and holds connections until a whole request head is in
//! (handshakes and heads read without waiting, on one deadline each),
//! `http` serves requests on bounded workers (answers with write
//! deadlines), `conn` is a connection plain or TLS, `tls` and `cert` the
//! main port's TLS, `auth` who may ask,
//! `routes` what each path answers, `stream` the exec, attach and
//! port-forward sessions relayed to the runtime's streaming server,
//! `sessions` how many of those (and log follows) each caller may hold.

pub mod auth;
pub mod conn;
pub mod head;
pub mod http;
pub(crate) mod poll;
pub(crate) mod route;
pub(crate) mod routes;
pub(crate) mod sessions;
pub mod stream;
pub(crate) mod tls;

use std::net::{SocketAddr, TcpListener};
use std::sync::Arc;

use crate::options::Options;

pub(crate) use poll::Server;

/// Binds `addr`; a port in use (or any other error) names the flag.
fn bind(addr: SocketAddr, flag: &str) -> Result<TcpListener, String> {
    TcpListener::bind(addr).map_err(|e| format!("{flag} {addr}: cannot listen: {e}"))
}

/// Opens the listeners `opts` asks for and starts the server over them;
/// `None` when none is asked for. `tls` is the main port's configuration
/// (required when it listens).
pub(crate) fn start(
    opts: &Options,
    tls: Option<Arc<rustls::ServerConfig>>,
    state: routes::State,
) -> Result<Option<Server>, String> {
    let want = opts.listeners();
    let mut listeners = Vec::new();
    if let Some(addr) = want.main {
        let Some(tls) = tls else {
            return Err("--port: no TLS configuration".into());
        };
        listeners.push(http::Listener {
            socket: bind(addr, "--port")?,
            port: http::Port::Main,
            tls: Some(tls),
        });
    }
    if let Some(addr) = want.read_only {
        listeners.push(http::Listener {
            socket: bind(addr, "--read-only-port")?,
            port: http::Port::ReadOnly,
            tls: None,
        });
    }
    if let Some(addr) = want.healthz {
        listeners.push(http::Listener {
            socket: bind(addr, "--healthz-port")?,
            port: http::Port::Healthz,
            tls: None,
        });
    }
    if listeners.is_empty() {
        return Ok(None);
    }
    poll::start(listeners, Arc::new(state))
        .map(Some)
        .map_err(|e| format!("starting the node API server: {e}"))
}

/// `/configz`: the effective settings under upstream's
/// KubeletConfiguration field names, as the options' settings table
/// reads them back.
pub(crate) fn configz(opts: &Options) -> String {
    crate::options::configz(opts)
}
