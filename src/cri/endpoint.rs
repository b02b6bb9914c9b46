//! Parsing of the runtime endpoint flag (`--container-runtime-endpoint`) into
//! a unix socket path and the gRPC target string for it.

use std::path::{Path, PathBuf};

/// Longest socket path the kernel accepts (`sun_path` is 108 bytes, one of
/// which is the terminating NUL).
pub(crate) const MAX_SOCKET_PATH: usize = 107;

/// A validated unix-socket endpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Endpoint {
    path: PathBuf,
    target: String,
}

impl Endpoint {
    /// Accepts `unix:///abs/path`, `unix:/abs/path` or a bare `/abs/path`.
    /// Other schemes (`tcp://`, `npipe://`) and relative paths are refused,
    /// with the reason in the error text.
    pub(crate) fn parse(endpoint: &str) -> Result<Endpoint, String> {
        let endpoint = endpoint.trim();
        if endpoint.is_empty() {
            return Err("the endpoint is empty".to_string());
        }
        if endpoint.contains('\0') {
            return Err("the endpoint contains a NUL byte".to_string());
        }
        let path = if let Some(rest) = endpoint.strip_prefix("unix://") {
            if !rest.starts_with('/') {
                return Err(format!(
                    "\"unix://{rest}\" has no absolute path; write unix:///{rest} for /{rest}"
                ));
            }
            rest
        } else if let Some(rest) = endpoint.strip_prefix("unix:") {
            rest
        } else if let Some((scheme, _)) = endpoint.split_once("://") {
            return Err(format!(
                "scheme \"{scheme}\" is not supported; only unix sockets are"
            ));
        } else {
            endpoint
        };
        if !path.starts_with('/') {
            return Err(format!("socket path \"{path}\" is not absolute"));
        }
        if path.len() > MAX_SOCKET_PATH {
            return Err(format!(
                "socket path is {} bytes long; unix sockets allow at most {MAX_SOCKET_PATH}",
                path.len()
            ));
        }
        Ok(Endpoint {
            path: PathBuf::from(path),
            target: format!("unix://{path}"),
        })
    }

    /// The socket file.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// The target string for `grpcio::ChannelBuilder::connect`
    /// (`unix:///abs/path`).
    pub(crate) fn target(&self) -> &str {
        &self.target
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_the_three_spellings() {
        for s in [
            "unix:///run/containerd/containerd.sock",
            "unix:/run/containerd/containerd.sock",
            "/run/containerd/containerd.sock",
            "  unix:///run/containerd/containerd.sock\n",
        ] {
            let e = Endpoint::parse(s).unwrap();
            assert_eq!(
                e.path(),
                Path::new("/run/containerd/containerd.sock"),
                "{s}"
            );
            assert_eq!(e.target(), "unix:///run/containerd/containerd.sock", "{s}");
        }
    }

    #[test]
    fn refuses_other_schemes_and_relative_paths() {
        let tcp = Endpoint::parse("tcp://127.0.0.1:1234").unwrap_err();
        assert!(tcp.contains("\"tcp\" is not supported"), "{tcp}");
        let rel = Endpoint::parse("run/containerd.sock").unwrap_err();
        assert!(rel.contains("not absolute"), "{rel}");
        let rel = Endpoint::parse("unix:run/containerd.sock").unwrap_err();
        assert!(rel.contains("not absolute"), "{rel}");
        let two_slashes = Endpoint::parse("unix://run/containerd.sock").unwrap_err();
        assert!(
            two_slashes.contains("unix:///run/containerd.sock"),
            "{two_slashes}"
        );
        assert!(Endpoint::parse("").unwrap_err().contains("empty"));
        assert!(Endpoint::parse("/a\0b").unwrap_err().contains("NUL"));
    }

    #[test]
    fn refuses_paths_too_long_for_a_socket() {
        let long = format!("/{}", "x".repeat(MAX_SOCKET_PATH));
        let err = Endpoint::parse(&long).unwrap_err();
        assert!(err.contains("at most 107"), "{err}");
        let fits = format!("/{}", "x".repeat(MAX_SOCKET_PATH - 1));
        assert!(Endpoint::parse(&fits).is_ok());
    }
}
