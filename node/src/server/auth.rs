//! Who calls the kubelet's API and what they may do, as upstream's webhook modes
//! (`pkg/kubelet/server/auth.go`, `NodeAuthorizerAttributesGetter`; the kubelet's
//! `--authentication-token-webhook` and `--authorization-mode=Webhook`): a client
//! certificate the cluster CA signed names the user (CN) and groups (O); otherwise a bearer
//! token is sent to the apiserver as a TokenReview; the request is then a
//! SubjectAccessReview of `nodes/<subresource>` on this node.

use http::{HeaderMap, Method, header};
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use rustls_pki_types::CertificateDer;
use skerry_client::{Api, Client, PostParams};

/// A caller, as authentication found it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct User {
    /// The user's name.
    pub name: String,
    /// Its groups.
    pub groups: Vec<String>,
    /// Its UID (tokens only).
    pub uid: Option<String>,
}

/// What authentication concluded.
#[derive(Debug)]
pub enum Authenticated {
    /// A known user.
    User(User),
    /// No credentials, or ones the apiserver refused.
    Anonymous,
    /// The apiserver could not be asked.
    Error(String),
}

/// The authorization attributes of a request (upstream `GetRequestAttributes`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Attributes {
    /// The verb of the method (`get`, `create`, ...).
    pub verb: &'static str,
    /// The `nodes` subresource: `stats`, `metrics`, `log` or `proxy`.
    pub subresource: &'static str,
    /// The node's name.
    pub name: String,
}

impl Attributes {
    /// The attributes of `method` on `path` of node `node`: `stats` for `/stats`, `metrics`
    /// for `/metrics`, `log` for `/logs`, `proxy` for everything else (`/pods`,
    /// `/containerLogs`, `/healthz`), as upstream's `NodeAuthorizerAttributesGetter`.
    pub fn of(method: &Method, path: &str, node: &str) -> Attributes {
        let verb = match *method {
            Method::POST => "create",
            Method::GET => "get",
            Method::PUT => "update",
            Method::PATCH => "patch",
            Method::DELETE => "delete",
            _ => "",
        };
        let under = |prefix: &str| {
            path == prefix
                || path
                    .strip_prefix(prefix)
                    .is_some_and(|rest| rest.starts_with('/'))
        };
        let subresource = if under("/stats") {
            "stats"
        } else if under("/metrics") {
            "metrics"
        } else if under("/logs") {
            "log"
        } else {
            "proxy"
        };
        Attributes {
            verb,
            subresource,
            name: node.to_string(),
        }
    }
}

/// The reviews, asked of the apiserver as the node.
pub struct Auth {
    token_reviews: Api<TokenReview>,
    access_reviews: Api<SubjectAccessReview>,
}

impl Auth {
    /// Reviews asked through `client` (the node's own credentials, which the `system:node`
    /// role lets create both reviews).
    pub fn new(client: &Client) -> Auth {
        Auth {
            token_reviews: client.api(None),
            access_reviews: client.api(None),
        }
    }

    /// The caller: the verified client certificate's subject, else the bearer token's
    /// review.
    pub async fn authenticate(
        &self,
        peer: &[CertificateDer<'static>],
        headers: &HeaderMap,
    ) -> Authenticated {
        if let Some(leaf) = peer.first() {
            return match skerry_tls::pki::inspect(leaf) {
                Ok(info) => match info.common_name {
                    Some(name) if !name.is_empty() => Authenticated::User(User {
                        name,
                        groups: info.organizations,
                        uid: None,
                    }),
                    _ => Authenticated::Anonymous,
                },
                Err(_) => Authenticated::Anonymous,
            };
        }
        let Some(token) = bearer(headers) else {
            return Authenticated::Anonymous;
        };
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: Some(token.to_string()),
                audiences: None,
            },
            ..TokenReview::default()
        };
        match self
            .token_reviews
            .create(&PostParams::default(), &review)
            .await
        {
            Ok(r) => match r.status {
                Some(s) if s.authenticated == Some(true) => match s.user {
                    Some(u) if u.username.as_deref().is_some_and(|n| !n.is_empty()) => {
                        Authenticated::User(User {
                            name: u.username.unwrap_or_default(),
                            groups: u.groups.unwrap_or_default(),
                            uid: u.uid,
                        })
                    }
                    _ => Authenticated::Anonymous,
                },
                _ => Authenticated::Anonymous,
            },
            Err(e) => Authenticated::Error(e.to_string()),
        }
    }

    /// Whether `user` may do `attrs`: a SubjectAccessReview.
    pub async fn authorize(&self, user: &User, attrs: &Attributes) -> Result<bool, String> {
        let review = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: Some(user.name.clone()),
                groups: Some(user.groups.clone()),
                uid: user.uid.clone(),
                resource_attributes: Some(ResourceAttributes {
                    verb: Some(attrs.verb.to_string()),
                    group: Some(String::new()),
                    version: Some("v1".to_string()),
                    resource: Some("nodes".to_string()),
                    subresource: Some(attrs.subresource.to_string()),
                    name: Some(attrs.name.clone()),
                    ..ResourceAttributes::default()
                }),
                ..SubjectAccessReviewSpec::default()
            },
            ..SubjectAccessReview::default()
        };
        let r = self
            .access_reviews
            .create(&PostParams::default(), &review)
            .await
            .map_err(|e| e.to_string())?;
        Ok(r.status.is_some_and(|s| s.allowed))
    }
}

/// The token of an `Authorization: Bearer <token>` header.
fn bearer(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_map_to_node_subresources_as_upstream() {
        for (method, path, verb, sub) in [
            (Method::GET, "/containerLogs/ns/p/c", "get", "proxy"),
            (Method::GET, "/pods", "get", "proxy"),
            (Method::GET, "/healthz", "get", "proxy"),
            (Method::GET, "/stats/summary", "get", "stats"),
            (Method::GET, "/stats", "get", "stats"),
            (Method::GET, "/statsx", "get", "proxy"),
            (Method::GET, "/metrics/cadvisor", "get", "metrics"),
            (Method::GET, "/logs/syslog", "get", "log"),
            (Method::POST, "/exec/ns/p/c", "create", "proxy"),
        ] {
            let a = Attributes::of(&method, path, "n1");
            assert_eq!((a.verb, a.subresource), (verb, sub), "{path}");
            assert_eq!(a.name, "n1");
        }
    }

    #[test]
    fn bearer_tokens_are_read_from_the_header() {
        let mut h = HeaderMap::new();
        assert_eq!(bearer(&h), None);
        h.insert(
            header::AUTHORIZATION,
            "Bearer abc".parse().unwrap_or_else(|_| unreachable!()),
        );
        assert_eq!(bearer(&h), Some("abc"));
        h.insert(
            header::AUTHORIZATION,
            "Basic abc".parse().unwrap_or_else(|_| unreachable!()),
        );
        assert_eq!(bearer(&h), None);
    }
}
