//! `CriError`: what went wrong with a CRI call, named by call and endpoint,
//! and sorted into the cases callers act on differently: the socket is
//! missing, the runtime does not answer, the object was not found, or the
//! runtime refused the request. A refusal carries the runtime's gRPC status
//! as a [`Code`] of tinylet's own, so that no caller outside `cri` names
//! the gRPC library (a tidy test checks this).

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use grpcio::RpcStatusCode;

/// A gRPC status code as the runtime answered it (the canonical codes, by
/// their gRPC names), so that callers act on codes without naming the
/// gRPC library; a number outside the canonical set is `Other`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Code {
    Ok,
    Cancelled,
    Unknown,
    InvalidArgument,
    DeadlineExceeded,
    NotFound,
    AlreadyExists,
    PermissionDenied,
    ResourceExhausted,
    FailedPrecondition,
    Aborted,
    OutOfRange,
    Unimplemented,
    Internal,
    Unavailable,
    DataLoss,
    Unauthenticated,
    /// A number outside the canonical 0..=16 (`from_number` never gives
    /// `Other` for a canonical one).
    Other(i32),
}

impl Code {
    /// The code's number on the wire.
    pub(crate) fn number(self) -> i32 {
        match self {
            Code::Ok => 0,
            Code::Cancelled => 1,
            Code::Unknown => 2,
            Code::InvalidArgument => 3,
            Code::DeadlineExceeded => 4,
            Code::NotFound => 5,
            Code::AlreadyExists => 6,
            Code::PermissionDenied => 7,
            Code::ResourceExhausted => 8,
            Code::FailedPrecondition => 9,
            Code::Aborted => 10,
            Code::OutOfRange => 11,
            Code::Unimplemented => 12,
            Code::Internal => 13,
            Code::Unavailable => 14,
            Code::DataLoss => 15,
            Code::Unauthenticated => 16,
            Code::Other(n) => n,
        }
    }

    /// The code numbered `n`.
    pub(crate) fn from_number(n: i32) -> Code {
        match n {
            0 => Code::Ok,
            1 => Code::Cancelled,
            2 => Code::Unknown,
            3 => Code::InvalidArgument,
            4 => Code::DeadlineExceeded,
            5 => Code::NotFound,
            6 => Code::AlreadyExists,
            7 => Code::PermissionDenied,
            8 => Code::ResourceExhausted,
            9 => Code::FailedPrecondition,
            10 => Code::Aborted,
            11 => Code::OutOfRange,
            12 => Code::Unimplemented,
            13 => Code::Internal,
            14 => Code::Unavailable,
            15 => Code::DataLoss,
            16 => Code::Unauthenticated,
            n => Code::Other(n),
        }
    }
}

impl From<RpcStatusCode> for Code {
    fn from(code: RpcStatusCode) -> Code {
        Code::from_number(code.into())
    }
}

impl From<Code> for RpcStatusCode {
    fn from(code: Code) -> RpcStatusCode {
        RpcStatusCode::from(code.number())
    }
}

/// Method name used for errors that happen before any call is made.
pub(crate) const CONNECT: &str = "Connect";

/// A failed CRI call (or a failure to set up the client).
#[derive(Debug)]
pub enum CriError {
    /// The endpoint string cannot be used at all.
    InvalidEndpoint { endpoint: String, reason: String },
    /// The runtime's unix socket does not exist: the runtime is not running,
    /// or the endpoint is wrong.
    SocketMissing {
        method: &'static str,
        endpoint: String,
        path: PathBuf,
    },
    /// The socket exists but nothing answers on it (connection refused,
    /// gRPC `UNAVAILABLE`, or no connection before the deadline).
    Unavailable {
        method: &'static str,
        endpoint: String,
        detail: String,
    },
    /// The runtime was connected but did not answer within the deadline.
    Timeout {
        method: &'static str,
        endpoint: String,
        timeout: Duration,
    },
    /// The runtime answered with a gRPC error status.
    Status {
        method: &'static str,
        endpoint: String,
        code: Code,
        message: String,
    },
    /// The runtime answered, but the answer lacks something required
    /// (e.g. an empty sandbox ID).
    InvalidResponse {
        method: &'static str,
        endpoint: String,
        reason: String,
    },
    /// Any other gRPC-level failure (encoding, call setup).
    Transport {
        method: &'static str,
        endpoint: String,
        detail: String,
    },
}

impl CriError {
    /// A `Status` error, e.g. for fakes that mimic a runtime's answers.
    pub(crate) fn status(
        method: &'static str,
        endpoint: impl Into<String>,
        code: Code,
        message: impl Into<String>,
    ) -> CriError {
        CriError::Status {
            method,
            endpoint: endpoint.into(),
            code,
            message: message.into(),
        }
    }

    /// The object (sandbox, container, image) does not exist: gRPC
    /// `NOT_FOUND`, or another status whose text says "not found", as
    /// containerd sometimes answers.
    pub fn is_not_found(&self) -> bool {
        match self {
            CriError::Status { code, message, .. } => {
                *code == Code::NotFound || message.to_ascii_lowercase().contains("not found")
            }
            _ => false,
        }
    }

    /// The runtime cannot be reached: socket missing, connection refused,
    /// `UNAVAILABLE`, or no connection before the deadline. Worth retrying
    /// later; says nothing about the request itself.
    pub fn is_unavailable(&self) -> bool {
        matches!(
            self,
            CriError::SocketMissing { .. } | CriError::Unavailable { .. }
        )
    }

    /// The CRI method that failed, e.g. `"RunPodSandbox"`; `"Connect"` for
    /// errors before any call.
    pub fn method(&self) -> &str {
        match self {
            CriError::InvalidEndpoint { .. } => CONNECT,
            CriError::SocketMissing { method, .. }
            | CriError::Unavailable { method, .. }
            | CriError::Timeout { method, .. }
            | CriError::Status { method, .. }
            | CriError::InvalidResponse { method, .. }
            | CriError::Transport { method, .. } => method,
        }
    }

    /// The call ran out of time (its deadline, or a time limit inside the
    /// runtime such as an ExecSync timeout).
    pub(crate) fn is_timeout(&self) -> bool {
        match self {
            CriError::Timeout { .. } => true,
            CriError::Status { code, .. } => *code == Code::DeadlineExceeded,
            _ => false,
        }
    }

    /// The gRPC status code, when the runtime answered with one.
    pub fn code(&self) -> Option<Code> {
        match self {
            CriError::Status { code, .. } => Some(*code),
            _ => None,
        }
    }
}

impl fmt::Display for CriError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CriError::InvalidEndpoint { endpoint, reason } => {
                write!(f, "invalid container runtime endpoint {endpoint:?}: {reason}")
            }
            CriError::SocketMissing {
                method,
                endpoint,
                path,
            } => write!(
                f,
                "CRI {method} on {endpoint}: socket {} does not exist (is the container runtime running?)",
                path.display()
            ),
            CriError::Unavailable {
                method,
                endpoint,
                detail,
            } => write!(f, "CRI {method} on {endpoint}: runtime unavailable: {detail}"),
            CriError::Timeout {
                method,
                endpoint,
                timeout,
            } => write!(
                f,
                "CRI {method} on {endpoint}: no answer within {}",
                fmt_duration(*timeout)
            ),
            CriError::Status {
                method,
                endpoint,
                code,
                message,
            } => {
                write!(f, "CRI {method} on {endpoint} failed: {}", code_name(*code))?;
                if !message.is_empty() {
                    write!(f, ": {message}")?;
                }
                Ok(())
            }
            CriError::InvalidResponse {
                method,
                endpoint,
                reason,
            } => write!(f, "CRI {method} on {endpoint}: invalid response: {reason}"),
            CriError::Transport {
                method,
                endpoint,
                detail,
            } => write!(f, "CRI {method} on {endpoint}: {detail}"),
        }
    }
}

impl std::error::Error for CriError {}

/// What was found at the socket path after a failed connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SocketState {
    Missing,
    NotASocket,
    Present,
}

impl SocketState {
    pub(crate) fn probe(path: &std::path::Path) -> SocketState {
        use std::os::unix::fs::FileTypeExt;
        match std::fs::metadata(path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => SocketState::Missing,
            // Unreadable for another reason (permissions): let the gRPC
            // error speak for itself.
            Err(_) => SocketState::Present,
            Ok(m) if m.file_type().is_socket() => SocketState::Present,
            Ok(_) => SocketState::NotASocket,
        }
    }
}

/// Everything `classify` needs to know about the failed call.
pub(crate) struct CallContext<'a> {
    pub(crate) method: &'static str,
    pub(crate) endpoint: &'a str,
    pub(crate) path: &'a std::path::Path,
    pub(crate) timeout: Duration,
}

/// Sorts a grpcio error into a `CriError`. `socket` and `connected` are
/// probed by the caller after the failure (kept out of here so this stays a
/// pure function): whether the socket file exists, and whether the channel
/// reached READY (which tells a deadline spent connecting from one spent
/// waiting for the runtime's answer).
pub(crate) fn classify(
    ctx: &CallContext<'_>,
    err: grpcio::Error,
    socket: SocketState,
    connected: bool,
) -> CriError {
    let method = ctx.method;
    let endpoint = ctx.endpoint.to_string();
    let status = match err {
        grpcio::Error::RpcFailure(status) => status,
        grpcio::Error::RpcFinished(Some(status)) => status,
        other => {
            return CriError::Transport {
                method,
                endpoint,
                detail: other.to_string(),
            }
        }
    };
    let code = status.code();
    let unreachable = code == RpcStatusCode::UNAVAILABLE
        || (code == RpcStatusCode::DEADLINE_EXCEEDED && !connected);
    if unreachable {
        return match socket {
            SocketState::Missing => CriError::SocketMissing {
                method,
                endpoint,
                path: ctx.path.to_path_buf(),
            },
            SocketState::NotASocket => CriError::Unavailable {
                method,
                endpoint,
                detail: format!("{} exists but is not a unix socket", ctx.path.display()),
            },
            SocketState::Present if code == RpcStatusCode::DEADLINE_EXCEEDED => {
                CriError::Unavailable {
                    method,
                    endpoint,
                    detail: format!("no connection within {}", fmt_duration(ctx.timeout)),
                }
            }
            SocketState::Present => CriError::Unavailable {
                method,
                endpoint,
                detail: if status.message().is_empty() {
                    "connection failed".to_string()
                } else {
                    status.message().to_string()
                },
            },
        };
    }
    if code == RpcStatusCode::DEADLINE_EXCEEDED {
        return CriError::Timeout {
            method,
            endpoint,
            timeout: ctx.timeout,
        };
    }
    CriError::Status {
        method,
        endpoint,
        code: code.into(),
        message: status.message().to_string(),
    }
}

/// `NOT_FOUND` rather than grpcio's `5-NOT_FOUND`.
fn code_name(code: Code) -> String {
    let text = RpcStatusCode::from(code).to_string();
    match text.split_once('-') {
        Some((_, name)) => name.to_string(),
        None => text,
    }
}

fn fmt_duration(d: Duration) -> String {
    if d.subsec_millis() == 0 {
        format!("{}s", d.as_secs())
    } else {
        format!("{}ms", d.as_millis())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use grpcio::RpcStatus;
    use std::path::Path;

    fn ctx() -> CallContext<'static> {
        CallContext {
            method: "RunPodSandbox",
            endpoint: "unix:///run/test.sock",
            path: Path::new("/run/test.sock"),
            timeout: Duration::from_secs(2),
        }
    }

    fn rpc(code: RpcStatusCode, msg: &str) -> grpcio::Error {
        grpcio::Error::RpcFailure(RpcStatus::with_message(code, msg.to_string()))
    }

    #[test]
    fn unavailable_with_missing_socket_is_socket_missing() {
        let e = classify(
            &ctx(),
            rpc(RpcStatusCode::UNAVAILABLE, "failed to connect"),
            SocketState::Missing,
            false,
        );
        assert!(matches!(e, CriError::SocketMissing { .. }), "{e:?}");
        assert!(e.is_unavailable());
        assert!(!e.is_not_found());
        assert_eq!(e.method(), "RunPodSandbox");
        let text = e.to_string();
        assert!(text.contains("RunPodSandbox"), "{text}");
        assert!(text.contains("unix:///run/test.sock"), "{text}");
        assert!(text.contains("/run/test.sock does not exist"), "{text}");
    }

    #[test]
    fn unavailable_with_socket_present_is_runtime_down() {
        let e = classify(
            &ctx(),
            rpc(RpcStatusCode::UNAVAILABLE, "Connection refused"),
            SocketState::Present,
            false,
        );
        assert!(matches!(e, CriError::Unavailable { .. }), "{e:?}");
        assert!(e.is_unavailable());
        assert!(e.to_string().contains("Connection refused"), "{e}");

        let e = classify(
            &ctx(),
            rpc(RpcStatusCode::UNAVAILABLE, ""),
            SocketState::NotASocket,
            false,
        );
        assert!(e.is_unavailable());
        assert!(e.to_string().contains("not a unix socket"), "{e}");
    }

    #[test]
    fn deadline_before_connecting_is_unavailable_after_is_timeout() {
        let e = classify(
            &ctx(),
            rpc(RpcStatusCode::DEADLINE_EXCEEDED, "Deadline Exceeded"),
            SocketState::Present,
            false,
        );
        assert!(e.is_unavailable(), "{e:?}");
        assert!(e.to_string().contains("no connection within 2s"), "{e}");

        let e = classify(
            &ctx(),
            rpc(RpcStatusCode::DEADLINE_EXCEEDED, "Deadline Exceeded"),
            SocketState::Missing,
            false,
        );
        assert!(matches!(e, CriError::SocketMissing { .. }), "{e:?}");

        let e = classify(
            &ctx(),
            rpc(RpcStatusCode::DEADLINE_EXCEEDED, "Deadline Exceeded"),
            SocketState::Present,
            true,
        );
        assert!(matches!(e, CriError::Timeout { .. }), "{e:?}");
        assert!(!e.is_unavailable());
        assert!(e.to_string().contains("no answer within 2s"), "{e}");
    }

    #[test]
    fn not_found_by_code_or_by_text() {
        let e = classify(
            &ctx(),
            rpc(RpcStatusCode::NOT_FOUND, "sandbox \"abc\" does not exist"),
            SocketState::Present,
            true,
        );
        assert!(e.is_not_found());
        assert!(!e.is_unavailable());
        assert_eq!(e.code(), Some(Code::NotFound));
        assert!(e.to_string().contains("failed: NOT_FOUND: sandbox"), "{e}");

        let e = classify(
            &ctx(),
            rpc(
                RpcStatusCode::UNKNOWN,
                "an error occurred when try to find container \"x\": not found",
            ),
            SocketState::Present,
            true,
        );
        assert!(e.is_not_found(), "{e:?}");

        let e = classify(
            &ctx(),
            rpc(RpcStatusCode::INVALID_ARGUMENT, "bad config"),
            SocketState::Present,
            true,
        );
        assert!(!e.is_not_found());
        assert!(!e.is_unavailable());
        assert_eq!(
            e.to_string(),
            "CRI RunPodSandbox on unix:///run/test.sock failed: INVALID_ARGUMENT: bad config"
        );
    }

    #[test]
    fn other_grpc_errors_are_transport() {
        let e = classify(
            &ctx(),
            grpcio::Error::RemoteStopped,
            SocketState::Present,
            true,
        );
        assert!(matches!(e, CriError::Transport { .. }), "{e:?}");
        assert!(!e.is_unavailable());
        assert!(!e.is_not_found());
    }

    #[test]
    fn status_constructor_and_method() {
        let e = CriError::status("StartContainer", "fake", Code::NotFound, "gone");
        assert!(e.is_not_found());
        assert_eq!(e.method(), "StartContainer");
        let e = CriError::InvalidEndpoint {
            endpoint: "tcp://x".into(),
            reason: "nope".into(),
        };
        assert_eq!(e.method(), CONNECT);
    }

    #[test]
    fn codes_keep_their_numbers_and_grpc_names() {
        for n in -2..20 {
            assert_eq!(Code::from_number(n).number(), n);
            assert_eq!(i32::from(RpcStatusCode::from(Code::from_number(n))), n);
        }
        for (grpc, code) in [
            (RpcStatusCode::NOT_FOUND, Code::NotFound),
            (RpcStatusCode::UNAVAILABLE, Code::Unavailable),
            (RpcStatusCode::DEADLINE_EXCEEDED, Code::DeadlineExceeded),
            (RpcStatusCode::UNIMPLEMENTED, Code::Unimplemented),
            (RpcStatusCode::PERMISSION_DENIED, Code::PermissionDenied),
            (RpcStatusCode::UNAUTHENTICATED, Code::Unauthenticated),
        ] {
            assert_eq!(Code::from(grpc), code);
        }
        assert_eq!(Code::from_number(99), Code::Other(99));
        let e = classify(
            &ctx(),
            rpc(RpcStatusCode::ALREADY_EXISTS, "name in use"),
            SocketState::Present,
            true,
        );
        assert_eq!(e.code(), Some(Code::AlreadyExists));
        assert!(
            e.to_string()
                .ends_with("failed: ALREADY_EXISTS: name in use"),
            "{e}"
        );
        let e = CriError::status("StartContainer", "fake", Code::Other(99), "odd");
        assert!(
            e.to_string().ends_with("failed: INVALID_STATUS_CODE: odd"),
            "{e}"
        );
    }

    #[test]
    fn socket_probe_tells_missing_from_plain_file() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        let file = dir.join("not-a-socket");
        std::fs::write(&file, b"x").unwrap();
        assert_eq!(
            SocketState::probe(&dir.join("absent")),
            SocketState::Missing
        );
        assert_eq!(SocketState::probe(&file), SocketState::NotASocket);
        let sock = dir.join("s.sock");
        let _listener = std::os::unix::net::UnixListener::bind(&sock).unwrap();
        assert_eq!(SocketState::probe(&sock), SocketState::Present);
    }
}
