//! The access layer: who is asking (authentication) and may they (RBAC authorization).
//!
//! # Layout
//! - [`x509`]: the TLS server configuration with an optional client-certificate verifier, and
//!   the user a verified client certificate names (CN → user, O → groups).
//! - [`token`]: `--token-auth-file`, Kubernetes' static token CSV, and the `Authorization:
//!   Bearer` header.
//! - [`serviceaccount`]: service-account tokens, ES256 JWTs shaped like Kubernetes' bound
//!   tokens, issued and verified with the cluster's service-account key.
//! - [`rbac`]: `authorize(attributes, source)`, Kubernetes' RBAC rule matching over ClusterRoles,
//!   Roles and their bindings, plus one wildcard RBAC probe for owner-reference finalizers
//!   (`docs/tricks.md` #12) in [`rbac::can_set_blocking_owner_finalizers`].
//! - [`bootstrap`]: Kubernetes' default ClusterRoles and ClusterRoleBindings.
//!
//! [`Authenticator`] chains the authenticators in Kubernetes' order: a verified client
//! certificate first, then a bearer token (static file, then service-account JWT); with neither,
//! the request is anonymous.
//!
//! Invariants: every authenticated [`UserInfo`] carries [`GROUP_AUTHENTICATED`] and the anonymous
//! one carries only [`GROUP_UNAUTHENTICATED`], so RBAC bindings to those groups mean what they
//! mean in Kubernetes; a bearer token that is present but not recognised is an error (401), never
//! a fall back to anonymous (Kubernetes' bearer-token authenticator does the same).

pub mod bootstrap;
pub mod rbac;
pub mod serviceaccount;
pub mod token;
pub mod x509;

use std::collections::BTreeMap;
use std::time::SystemTime;

use rustls_pki_types::CertificateDer;

/// The group every authenticated user is in (Kubernetes `user.AllAuthenticated`).
pub const GROUP_AUTHENTICATED: &str = "system:authenticated";
/// The group of the anonymous user (Kubernetes `user.AllUnauthenticated`).
pub const GROUP_UNAUTHENTICATED: &str = "system:unauthenticated";
/// The group RBAC never consults: its members are allowed everything (Kubernetes
/// `user.SystemPrivilegedGroup`, bound to cluster-admin as well).
pub const GROUP_MASTERS: &str = "system:masters";
/// The name of the anonymous user (Kubernetes `user.Anonymous`).
pub const USER_ANONYMOUS: &str = "system:anonymous";

/// Paths an anonymous request may reach; everything else answers 401 before authorization.
/// They are the non-resource URLs of Kubernetes' `system:public-info-viewer` role, which is
/// bound to `system:unauthenticated` (without the `/version/` alias, which skerry does not
/// serve).
pub const ANONYMOUS_PATHS: [&str; 4] = ["/livez", "/readyz", "/version", "/healthz"];

/// Who made a request, as Kubernetes' `user.Info` has it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct UserInfo {
    /// The user name: a certificate's CN, a token file's second column,
    /// `system:serviceaccount:<ns>:<name>`, or [`USER_ANONYMOUS`].
    pub name: String,
    /// A unique id, when the authenticator knows one (token file's third column, the service
    /// account's uid); empty otherwise.
    pub uid: String,
    /// Groups, in the order the authenticator gave them, followed by [`GROUP_AUTHENTICATED`]
    /// or [`GROUP_UNAUTHENTICATED`].
    pub groups: Vec<String>,
    /// Extra attributes (Kubernetes' `extra`), such as the pod a service-account token is bound
    /// to.
    pub extra: BTreeMap<String, Vec<String>>,
}

impl UserInfo {
    /// An authenticated user with `groups`, plus [`GROUP_AUTHENTICATED`] unless already there
    /// (Kubernetes' `AuthenticatedGroupAdder`).
    pub fn authenticated(
        name: impl Into<String>,
        uid: impl Into<String>,
        groups: Vec<String>,
    ) -> Self {
        let mut groups = groups;
        if !groups.iter().any(|g| g == GROUP_AUTHENTICATED) {
            groups.push(GROUP_AUTHENTICATED.to_string());
        }
        UserInfo {
            name: name.into(),
            uid: uid.into(),
            groups,
            extra: BTreeMap::new(),
        }
    }

    /// The anonymous user: `system:anonymous` in `system:unauthenticated`.
    pub fn anonymous() -> Self {
        UserInfo {
            name: USER_ANONYMOUS.to_string(),
            uid: String::new(),
            groups: vec![GROUP_UNAUTHENTICATED.to_string()],
            extra: BTreeMap::new(),
        }
    }

    /// Whether this is the anonymous user.
    pub fn is_anonymous(&self) -> bool {
        self.name == USER_ANONYMOUS
    }

    /// Whether the user is in `group`.
    pub fn in_group(&self, group: &str) -> bool {
        self.groups.iter().any(|g| g == group)
    }
}

/// Whether an anonymous request for `path` (no query) may go on to authorization.
pub fn anonymous_allowed(path: &str) -> bool {
    ANONYMOUS_PATHS.contains(&path)
}

/// Why a request could not be authenticated; the caller answers 401 Unauthorized.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AuthError {
    /// A bearer token no authenticator recognises (Kubernetes: "invalid bearer token").
    #[error("invalid bearer token")]
    UnknownToken,
    /// A service-account token that names our issuer but fails verification.
    #[error("invalid bearer token: {0}")]
    ServiceAccountToken(#[source] serviceaccount::VerifyError),
    /// A verified client certificate we cannot read a user from.
    #[error("client certificate: {0}")]
    Certificate(#[source] x509::CertificateUserError),
}

/// The error of Kubernetes' bearer-token authenticator when no token authenticator knows a
/// token (`bearertoken.invalidToken`).
pub const INVALID_BEARER_TOKEN: &str = "invalid bearer token";

/// What a TokenReview learns about a token: Kubernetes' `authenticator.Response` (the user and
/// the audiences it was authenticated for) when it authenticates, otherwise the error text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TokenReview {
    /// The user, when the token authenticated.
    pub user: Option<UserInfo>,
    /// The audiences the token was authenticated for: the requested audiences that the token
    /// (or, for an audience-agnostic static token, this server) has.
    pub audiences: Vec<String>,
    /// Why it did not authenticate, as Kubernetes words it; `None` when it did.
    pub error: Option<String>,
}

/// The authenticators of one apiserver, tried in Kubernetes' order.
pub struct Authenticator {
    /// `--token-auth-file`, if given.
    pub token_file: Option<token::TokenFile>,
    /// The service-account token verifier, if the server has a service-account key.
    pub service_accounts: Option<serviceaccount::TokenVerifier>,
}

impl Authenticator {
    /// This server's audiences (Kubernetes' `--api-audiences`, by default the service-account
    /// issuer): the ones its service-account verifier accepts; none without one.
    pub fn api_audiences(&self) -> &[String] {
        self.service_accounts
            .as_ref()
            .map_or(&[], serviceaccount::TokenVerifier::audiences)
    }

    /// Authenticates `token` for `audiences` (empty: this server's) at time `now`, as
    /// Kubernetes' TokenReview does (`pkg/registry/authentication/tokenreview`): the token goes
    /// through the bearer-token chain alone, in an `Authorization: Bearer <token>` header, with
    /// the audiences in its context.
    ///
    /// - A static token is audience-agnostic (`authenticator.WrapAudienceAgnosticToken`): it
    ///   authenticates only when the requested audiences include one of this server's, and
    ///   reports those.
    /// - A service-account token must share an audience with the requested ones (unless this
    ///   server has none) and reports the shared ones.
    /// - A header that carries no token (the token is blank) authenticates as the anonymous
    ///   user, as Kubernetes' chain with anonymous authentication on does.
    /// - Otherwise the error is Kubernetes': `invalid bearer token` when no authenticator knew
    ///   the token, and `[invalid bearer token, <why>]` when the service-account authenticator
    ///   refused it (the first is the error of kube-apiserver's loopback-token authenticator,
    ///   which the chain tries first and whose error Kubernetes aggregates with the others).
    pub fn review_token(&self, token: &str, audiences: &[String], now: SystemTime) -> TokenReview {
        let requested: Vec<String> = if audiences.is_empty() {
            self.api_audiences().to_vec()
        } else {
            audiences.to_vec()
        };
        let header = format!("Bearer {token}");
        let Some(token) = token::bearer_token(&header) else {
            return TokenReview {
                user: Some(UserInfo::anonymous()),
                audiences: requested,
                error: None,
            };
        };
        if let Some(user) = self.token_file.as_ref().and_then(|f| f.authenticate(token)) {
            let shared: Vec<String> = self
                .api_audiences()
                .iter()
                .filter(|a| requested.contains(a))
                .cloned()
                .collect();
            // Without audiences in the context the wrapper is no filter at all.
            if requested.is_empty() || !shared.is_empty() {
                return TokenReview {
                    user: Some(user),
                    audiences: shared,
                    error: None,
                };
            }
        }
        let mut errors = vec![INVALID_BEARER_TOKEN.to_string()];
        if let Some(verifier) = &self.service_accounts {
            match verifier.verify_for(token, now, &requested) {
                Ok((claims, shared)) => {
                    return TokenReview {
                        user: Some(claims.user_info()),
                        audiences: shared,
                        error: None,
                    };
                }
                Err(serviceaccount::VerifyError::NotOurs) => {}
                Err(e) => errors.push(e.to_string()),
            }
        }
        TokenReview {
            user: None,
            audiences: Vec::new(),
            error: Some(aggregate(&errors)),
        }
    }

    /// Authenticates one request from its verified client certificate chain (empty when the
    /// client sent none) and its `Authorization` header, at time `now`.
    ///
    /// A certificate with a CN wins; then a bearer token; with neither, the anonymous user.
    pub fn authenticate(
        &self,
        peer_certs: &[CertificateDer<'_>],
        authorization: Option<&str>,
        now: SystemTime,
    ) -> Result<UserInfo, AuthError> {
        if let Some(user) =
            x509::user_from_peer_certs(peer_certs).map_err(AuthError::Certificate)?
        {
            return Ok(user);
        }
        let Some(token) = authorization.and_then(token::bearer_token) else {
            return Ok(UserInfo::anonymous());
        };
        if let Some(user) = self
            .token_file
            .as_ref()
            .and_then(|file| file.authenticate(token))
        {
            return Ok(user);
        }
        if let Some(verifier) = &self.service_accounts {
            match verifier.verify(token, now) {
                Ok(claims) => return Ok(claims.user_info()),
                Err(serviceaccount::VerifyError::NotOurs) => {}
                Err(e) => return Err(AuthError::ServiceAccountToken(e)),
            }
        }
        Err(AuthError::UnknownToken)
    }
}

/// apimachinery's `utilerrors.NewAggregate(errs).Error()`: one message alone, several as
/// `[a, b]`, repeated messages once.
fn aggregate(errors: &[String]) -> String {
    let mut seen: Vec<&str> = Vec::new();
    for e in errors {
        if !seen.contains(&e.as_str()) {
            seen.push(e);
        }
    }
    match seen.as_slice() {
        [one] => one.to_string(),
        many => format!("[{}]", many.join(", ")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn authenticated_group_is_added_once() {
        let user = UserInfo::authenticated("alice", "", vec!["dev".into()]);
        assert_eq!(
            user.groups,
            vec!["dev".to_string(), GROUP_AUTHENTICATED.to_string()]
        );
        let user = UserInfo::authenticated("bob", "", vec![GROUP_AUTHENTICATED.into()]);
        assert_eq!(user.groups, vec![GROUP_AUTHENTICATED.to_string()]);
    }

    #[test]
    fn anonymous_reaches_only_public_paths() {
        for path in ["/livez", "/readyz", "/version", "/healthz"] {
            assert!(anonymous_allowed(path), "{path}");
        }
        for path in ["/api", "/api/v1/pods", "/livez/etcd", "/versionx", "/"] {
            assert!(!anonymous_allowed(path), "{path}");
        }
        let anonymous = UserInfo::anonymous();
        assert!(anonymous.is_anonymous());
        assert!(anonymous.in_group(GROUP_UNAUTHENTICATED));
        assert!(!anonymous.in_group(GROUP_AUTHENTICATED));
    }

    fn reviewer() -> (Authenticator, serviceaccount::TokenIssuer) {
        use ring::rand::SystemRandom;
        use ring::signature::{ECDSA_P256_SHA256_FIXED_SIGNING, EcdsaKeyPair};
        let pkcs8 =
            EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &SystemRandom::new())
                .expect("generate a key");
        let api = vec![serviceaccount::ISSUER_DEFAULT.to_string()];
        let issuer = serviceaccount::TokenIssuer::new(
            pkcs8.as_ref(),
            serviceaccount::ISSUER_DEFAULT,
            api.clone(),
        )
        .expect("issuer");
        let auth = Authenticator {
            token_file: Some(
                token::TokenFile::parse("s3cret,alice,1001,\"dev,ops\"\n").expect("valid file"),
            ),
            service_accounts: Some(issuer.verifier(api)),
        };
        (auth, issuer)
    }

    fn sa_token(issuer: &serviceaccount::TokenIssuer, audiences: &[&str]) -> String {
        let request = serviceaccount::TokenRequest {
            namespace: "shop".into(),
            name: "robot".into(),
            uid: "robot-uid".into(),
            audiences: audiences.iter().map(|a| a.to_string()).collect(),
            expiration: serviceaccount::EXPIRATION_DEFAULT,
            pod: None,
            node: None,
        };
        issuer.issue(&request, SystemTime::now()).expect("issue")
    }

    #[test]
    fn token_reviews_honour_audiences_as_kubernetes_does() {
        let (auth, issuer) = reviewer();
        let now = SystemTime::now();
        let api = serviceaccount::ISSUER_DEFAULT.to_string();
        // A static token: this server's audiences, and only when they are asked for.
        let review = auth.review_token("s3cret", &[], now);
        assert_eq!(review.user.as_ref().map(|u| u.name.as_str()), Some("alice"));
        assert_eq!(review.audiences, std::slice::from_ref(&api));
        assert_eq!(review.error, None);
        let review = auth.review_token("s3cret", &["vault".into()], now);
        assert_eq!(review.user, None);
        assert_eq!(review.error.as_deref(), Some(INVALID_BEARER_TOKEN));
        // Only the first word of the token is a token, as in a header.
        let review = auth.review_token("s3cret trailing", &[], now);
        assert_eq!(review.user.map(|u| u.name), Some("alice".to_string()));

        // A service-account token for the API server.
        let token = sa_token(&issuer, &[]);
        let review = auth.review_token(&token, &[], now);
        let user = review.user.expect("authenticated");
        assert_eq!(user.name, "system:serviceaccount:shop:robot");
        assert_eq!(user.uid, "robot-uid");
        assert_eq!(review.audiences, std::slice::from_ref(&api));
        // ... is not one for `vault`.
        let review = auth.review_token(&token, &["vault".into()], now);
        assert_eq!(review.user, None);
        assert_eq!(
            review.error.as_deref(),
            Some(
                format!(
                    "[invalid bearer token, token audiences [\"{api}\"] is invalid for the target audiences [\"vault\"]]"
                )
                .as_str()
            )
        );
        // A token for `vault` authenticates for `vault` (and not for the API server).
        let vault = sa_token(&issuer, &["vault", "other"]);
        let review = auth.review_token(&vault, &["vault".into()], now);
        assert!(review.user.is_some());
        assert_eq!(review.audiences, ["vault"]);
        assert!(auth.review_token(&vault, &[], now).user.is_none());
        assert!(
            auth.authenticate(&[], Some(&format!("Bearer {vault}")), now)
                .is_err()
        );

        // A token nobody knows, and one signed by another key.
        let review = auth.review_token("garbage", &[], now);
        assert_eq!(
            (review.user, review.error.as_deref()),
            (None, Some(INVALID_BEARER_TOKEN))
        );
        let (_, stranger) = reviewer();
        let review = auth.review_token(&sa_token(&stranger, &[]), &[], now);
        assert_eq!(
            review.error.as_deref(),
            Some("[invalid bearer token, go-jose/go-jose: error in cryptographic primitive]")
        );
        // A header with no token in it is anonymous, as Kubernetes' chain ends.
        let review = auth.review_token("   ", &[], now);
        assert!(review.user.expect("anonymous").is_anonymous());
        assert_eq!(review.audiences, [api]);
    }

    #[test]
    fn errors_aggregate_as_apimachinery_does() {
        assert_eq!(aggregate(&["a".into()]), "a");
        assert_eq!(aggregate(&["a".into(), "b".into()]), "[a, b]");
        assert_eq!(aggregate(&["a".into(), "a".into()]), "a");
    }

    #[test]
    fn chain_order_token_then_anonymous() {
        let file = token::TokenFile::parse("s3cret,alice,1001,\"dev,ops\"\n").expect("valid file");
        let auth = Authenticator {
            token_file: Some(file),
            service_accounts: None,
        };
        let now = SystemTime::now();
        let user = auth
            .authenticate(&[], Some("Bearer s3cret"), now)
            .expect("known token");
        assert_eq!(user.name, "alice");
        assert_eq!(user.uid, "1001");
        assert_eq!(user.groups, ["dev", "ops", GROUP_AUTHENTICATED]);
        // No credentials at all: anonymous.
        assert!(
            auth.authenticate(&[], None, now)
                .expect("anonymous")
                .is_anonymous()
        );
        // A wrong token is refused, not downgraded to anonymous.
        assert!(matches!(
            auth.authenticate(&[], Some("Bearer nope"), now),
            Err(AuthError::UnknownToken)
        ));
        // Another scheme is no bearer token: anonymous, as in Kubernetes.
        assert!(
            auth.authenticate(&[], Some("Basic YWxpY2U6eA=="), now)
                .expect("anonymous")
                .is_anonymous()
        );
    }
}
