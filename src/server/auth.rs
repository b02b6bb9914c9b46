//! Authentication and authorization of the node API's main port.
//!
//! A minimal stand-in with the final interface: a verified client
//! certificate is user `x509`, a request without one has no credentials,
//! and every authenticated user is allowed.

use super::head::RequestHead;

/// An authenticated user.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct User {
    pub name: String,
    pub groups: Vec<String>,
}

/// Why a request could not be authenticated or authorized (not a refusal:
/// the server answers 500 and logs it).
#[derive(Debug)]
pub struct AuthError(pub String);

impl std::fmt::Display for AuthError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

#[derive(Default)]
pub struct Auth {}

impl Auth {
    /// The request's user; `None` when it brings no credentials.
    /// `peer_cert` is the client's verified leaf certificate (DER).
    pub fn authenticate(
        &self,
        peer_cert: Option<&[u8]>,
        _head: &RequestHead,
    ) -> Result<Option<User>, AuthError> {
        Ok(peer_cert.map(|_| User {
            name: "x509".into(),
            groups: Vec::new(),
        }))
    }

    /// Whether `user` may make this request.
    pub fn authorize(&self, _user: &User, _head: &RequestHead) -> Result<bool, AuthError> {
        Ok(true)
    }
}
