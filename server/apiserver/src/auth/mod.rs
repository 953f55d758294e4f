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

/// The authenticators of one apiserver, tried in Kubernetes' order.
pub struct Authenticator {
    /// `--token-auth-file`, if given.
    pub token_file: Option<token::TokenFile>,
    /// The service-account token verifier, if the server has a service-account key.
    pub service_accounts: Option<serviceaccount::TokenVerifier>,
}

impl Authenticator {
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
