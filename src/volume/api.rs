//! The apiserver as the volume manager's `ObjectSource`: GET of a Secret or
//! ConfigMap (the Node authorizer allows those a pod bound to this node
//! references) and TokenRequest for a pod's service account.

use std::time::SystemTime;

use base64::Engine;
use k8s_openapi::api::core::v1::Pod;
use serde_json::{json, Value};

use super::payload::{Fetched, Keys, Token};
use super::ObjectSource;
use crate::kube::Client;

pub(crate) struct ApiObjects {
    client: Client,
}

impl ApiObjects {
    pub(crate) fn new(client: Client) -> Self {
        ApiObjects { client }
    }

    fn get(&self, path: &str) -> Result<Option<Value>, String> {
        match self.client.get(path) {
            Ok(v) => Ok(Some(v)),
            Err(e) if e.is_not_found() => Ok(None),
            Err(e) => Err(e.to_string()),
        }
    }
}

/// `data` (base64, as Secrets carry it) or `data` as text plus `binaryData`
/// (ConfigMaps) into bytes by key.
pub(crate) fn decode_keys(obj: &Value, what: &str) -> Result<Keys, String> {
    let secret = obj.get("kind").and_then(Value::as_str) == Some("Secret");
    let field = |name: &str| -> Result<Vec<(&String, &str)>, String> {
        match obj.get(name) {
            None | Some(Value::Null) => Ok(Vec::new()),
            Some(Value::Object(m)) => m
                .iter()
                .map(|(key, v)| {
                    v.as_str()
                        .map(|s| (key, s))
                        .ok_or_else(|| format!("{what}: {name}[{key:?}] is not a string"))
                })
                .collect(),
            Some(_) => Err(format!("{what}: {name} is not an object")),
        }
    };
    keys_of(field("data")?, field("binaryData")?, secret, what)
}

/// The keys of `data` (base64 for a Secret, text for a ConfigMap) and
/// `binaryData` (base64) as bytes.
pub(crate) fn keys_of<'a, S: AsRef<str> + 'a>(
    data: impl IntoIterator<Item = (&'a String, S)>,
    binary_data: impl IntoIterator<Item = (&'a String, S)>,
    secret: bool,
    what: &str,
) -> Result<Keys, String> {
    let b64 = base64::engine::general_purpose::STANDARD;
    let mut keys = Keys::new();
    for (key, s) in data {
        let s = s.as_ref();
        let bytes = if secret {
            b64.decode(s)
                .map_err(|e| format!("{what}: data[{key:?}]: not base64: {e}"))?
        } else {
            s.as_bytes().to_vec()
        };
        keys.insert(key.clone(), bytes);
    }
    for (key, s) in binary_data {
        let bytes = b64
            .decode(s.as_ref())
            .map_err(|e| format!("{what}: binaryData[{key:?}]: not base64: {e}"))?;
        keys.insert(key.clone(), bytes);
    }
    Ok(keys)
}

/// The body of a TokenRequest for `pod`'s service account.
pub(crate) fn token_request(pod: &Pod, audience: Option<&str>, expiration_seconds: i64) -> Value {
    let mut spec = json!({
        "expirationSeconds": expiration_seconds,
        "boundObjectRef": {
            "apiVersion": "v1",
            "kind": "Pod",
            "name": pod.metadata.name.as_deref().unwrap_or(""),
            "uid": pod.metadata.uid.as_deref().unwrap_or(""),
        },
    });
    if let Some(a) = audience {
        spec["audiences"] = json!([a]);
    }
    json!({
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenRequest",
        "spec": spec,
    })
}

/// The token and its expiry from a TokenRequest answer.
pub(crate) fn token_of(answer: &Value, what: &str) -> Result<Token, String> {
    let status = &answer["status"];
    let token = status["token"]
        .as_str()
        .filter(|t| !t.is_empty())
        .ok_or_else(|| format!("{what}: status.token is missing"))?;
    let expires = status["expirationTimestamp"]
        .as_str()
        .ok_or_else(|| format!("{what}: status.expirationTimestamp is missing"))?;
    let ts: k8s_openapi::jiff::Timestamp = expires
        .parse()
        .map_err(|e| format!("{what}: status.expirationTimestamp {expires:?}: {e}"))?;
    let expires = SystemTime::from(ts);
    Ok(Token {
        token: token.to_string(),
        expires,
    })
}

impl ObjectSource for ApiObjects {
    fn secret(&self, namespace: &str, name: &str) -> Result<Fetched, String> {
        let path = format!("/api/v1/namespaces/{namespace}/secrets/{name}");
        match self.get(&path)? {
            Some(v) => decode_keys(&v, &format!("secret {namespace}/{name}")).map(Some),
            None => Ok(None),
        }
    }

    fn config_map(&self, namespace: &str, name: &str) -> Result<Fetched, String> {
        let path = format!("/api/v1/namespaces/{namespace}/configmaps/{name}");
        match self.get(&path)? {
            Some(v) => decode_keys(&v, &format!("configmap {namespace}/{name}")).map(Some),
            None => Ok(None),
        }
    }

    fn service_account_token(
        &self,
        pod: &Pod,
        audience: Option<&str>,
        expiration_seconds: i64,
    ) -> Result<Token, String> {
        let ns = pod.metadata.namespace.as_deref().unwrap_or("default");
        let sa = pod
            .spec
            .as_ref()
            .and_then(|s| s.service_account_name.as_deref())
            .filter(|s| !s.is_empty())
            .unwrap_or("default");
        let path = format!("/api/v1/namespaces/{ns}/serviceaccounts/{sa}/token");
        let answer = self
            .client
            .create(&path, &token_request(pod, audience, expiration_seconds))
            .map_err(|e| e.to_string())?;
        token_of(&answer, &format!("token for serviceaccount {ns}/{sa}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secret_data_is_base64_and_configmap_data_is_text() {
        let secret =
            json!({"kind": "Secret", "data": {"namespace": "ZGVmYXVsdA==", "token": "dDE="}});
        let k = decode_keys(&secret, "secret default/x").unwrap();
        assert_eq!(k["namespace"], b"default");
        assert_eq!(k["token"], b"t1");

        let cm =
            json!({"kind": "ConfigMap", "data": {"ca.crt": "PEM"}, "binaryData": {"b": "AAE="}});
        let k = decode_keys(&cm, "configmap default/c").unwrap();
        assert_eq!(k["ca.crt"], b"PEM");
        assert_eq!(k["b"], [0u8, 1]);

        let e = decode_keys(
            &json!({"kind": "Secret", "data": {"a": "%%%"}}),
            "secret ns/s",
        )
        .unwrap_err();
        assert!(e.contains("secret ns/s: data[\"a\"]: not base64"), "{e}");
        let e = decode_keys(
            &json!({"kind": "ConfigMap", "data": {"a": 1}}),
            "configmap ns/c",
        )
        .unwrap_err();
        assert!(e.contains("data[\"a\"] is not a string"), "{e}");
        let e =
            decode_keys(&json!({"kind": "ConfigMap", "data": []}), "configmap ns/c").unwrap_err();
        assert!(e.contains("data is not an object"), "{e}");
    }

    #[test]
    fn token_requests_are_bound_to_the_pod() {
        let mut pod = Pod::default();
        pod.metadata.name = Some("web".into());
        pod.metadata.uid = Some("u-1".into());
        let body = token_request(&pod, None, 3607);
        assert_eq!(body["kind"], "TokenRequest");
        assert_eq!(body["apiVersion"], "authentication.k8s.io/v1");
        assert_eq!(body["spec"]["expirationSeconds"], 3607);
        assert_eq!(body["spec"]["boundObjectRef"]["kind"], "Pod");
        assert_eq!(body["spec"]["boundObjectRef"]["uid"], "u-1");
        assert!(body["spec"].get("audiences").is_none());
        let body = token_request(&pod, Some("vault"), 600);
        assert_eq!(body["spec"]["audiences"], json!(["vault"]));
    }

    #[test]
    fn a_token_answer_needs_the_token_and_its_expiry() {
        let ok = json!({"status": {"token": "jwt", "expirationTimestamp": "2030-01-01T00:00:00Z"}});
        let t = token_of(&ok, "token").unwrap();
        assert_eq!(t.token, "jwt");
        let e = token_of(&json!({"status": {"token": "jwt"}}), "token for sa").unwrap_err();
        assert!(e.contains("status.expirationTimestamp is missing"), "{e}");
        let e = token_of(&json!({"status": {}}), "token for sa").unwrap_err();
        assert!(e.contains("status.token is missing"), "{e}");
        let bad = json!({"status": {"token": "jwt", "expirationTimestamp": "soon"}});
        assert!(token_of(&bad, "t").is_err());
    }
}
