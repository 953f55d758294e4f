//! Service-account tokens: ES256 JSON Web Tokens shaped like Kubernetes' bound tokens, issued
//! and verified with the cluster's service-account key (ECDSA P-256).
//!
//! The JWS is written here with ring rather than taken from a JWT crate: one algorithm (ES256,
//! whose fixed 64-byte `r||s` signature is ring's `ECDSA_P256_SHA256_FIXED`), compact
//! serialisation only, and the claim checks are Kubernetes' own, so a crate would add an
//! algorithm-negotiation surface (the classic `alg: none` / HMAC-with-public-key confusions) and a
//! second crypto stack for ~100 lines. ring is already in the build through rustls.
//!
//! Claims follow Kubernetes' `serviceaccount.Claims`: `iss`, `sub =
//! system:serviceaccount:<ns>:<name>`, `aud`, `exp`, `nbf`, `iat`, `jti` and the private
//! `kubernetes.io` claim {namespace, serviceaccount {name, uid}, pod?, node?}. The header's `kid`
//! is Kubernetes' key id: unpadded base64url of the SHA-256 of the public key's PKIX DER.
//!
//! Invariants: a token is trusted only after its signature verifies with our key; a token whose
//! unverified `iss` is not ours is [`VerifyError::NotOurs`] (another authenticator may own it), as
//! Kubernetes' `hasCorrectIssuer` does; every other failure is a hard error.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use ring::rand::{SecureRandom, SystemRandom};
use ring::signature::{self, EcdsaKeyPair, KeyPair as _, UnparsedPublicKey};
use serde::{Deserialize, Serialize};

use super::UserInfo;

/// The prefix of every service-account user name (Kubernetes `ServiceAccountUsernamePrefix`).
pub const USER_PREFIX: &str = "system:serviceaccount:";
/// The group of every service account (Kubernetes `AllServiceAccountsGroup`).
pub const GROUP_ALL: &str = "system:serviceaccounts";
/// Prefix of the per-namespace service-account group (`system:serviceaccounts:<ns>`).
pub const GROUP_NAMESPACE_PREFIX: &str = "system:serviceaccounts:";

/// The issuer and audience Kubernetes' docs and kubeadm use by default
/// (`--service-account-issuer=https://kubernetes.default.svc.cluster.local`); pods reach the
/// apiserver under this name.
pub const ISSUER_DEFAULT: &str = "https://kubernetes.default.svc.cluster.local";

/// Clock skew tolerated on `exp`, `nbf` and `iat`: go-jose's `DefaultLeeway`, which Kubernetes'
/// validator uses through `jwt.Claims.Validate`.
pub const LEEWAY: Duration = Duration::from_secs(60);

/// The shortest token a TokenRequest may ask for (Kubernetes validation: `expirationSeconds`
/// at least 600).
pub const EXPIRATION_MIN: Duration = Duration::from_secs(600);
/// The token lifetime when a TokenRequest gives none (Kubernetes' default `expirationSeconds`).
pub const EXPIRATION_DEFAULT: Duration = Duration::from_secs(3600);

/// The longest token looked at. Our tokens are ~700 bytes; the bound keeps a hostile header
/// from costing more than a small decode. Semi-arbitrary, well above any JWT Kubernetes issues.
pub const TOKEN_BYTES_MAX: usize = 16 * 1024;

/// The JWS algorithm of every token we issue and the only one we accept.
const ALGORITHM: &str = "ES256";

/// DER of the PKIX AlgorithmIdentifier and BIT STRING header that precede an uncompressed P-256
/// point in a SubjectPublicKeyInfo (id-ecPublicKey, prime256v1), per RFC 5480.
const P256_SPKI_PREFIX: [u8; 26] = [
    0x30, 0x59, 0x30, 0x13, 0x06, 0x07, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01, 0x06, 0x08, 0x2a,
    0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07, 0x03, 0x42, 0x00,
];

/// A reference to an object a token is bound to (`kubernetes.io.pod`, `.node`,
/// `.serviceaccount`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ObjectRef {
    /// The object's name.
    pub name: String,
    /// The object's uid.
    pub uid: String,
}

/// The private `kubernetes.io` claim.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct KubernetesClaims {
    /// The service account's namespace.
    pub namespace: String,
    /// The service account.
    pub serviceaccount: ObjectRef,
    /// The pod the token is bound to, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<ObjectRef>,
    /// The node the token is bound to, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<ObjectRef>,
}

/// The claims of a service-account token.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Claims {
    /// Issuer.
    pub iss: String,
    /// Subject: `system:serviceaccount:<ns>:<name>`.
    pub sub: String,
    /// Audiences (a JSON string or array on the wire; always an array when we write it).
    #[serde(deserialize_with = "string_or_array")]
    pub aud: Vec<String>,
    /// Expiry, seconds since the Unix epoch.
    pub exp: i64,
    /// Not before, seconds since the Unix epoch.
    pub nbf: i64,
    /// Issued at, seconds since the Unix epoch.
    pub iat: i64,
    /// Token id.
    #[serde(default)]
    pub jti: String,
    /// The bound objects.
    #[serde(rename = "kubernetes.io")]
    pub kubernetes: KubernetesClaims,
}

impl Claims {
    /// The user the token authenticates, as Kubernetes builds it: the service-account user
    /// name and uid, groups `system:serviceaccounts` and `system:serviceaccounts:<ns>`, and the
    /// bound pod, node and token id in `extra`.
    pub fn user_info(&self) -> UserInfo {
        let namespace = &self.kubernetes.namespace;
        let mut user = UserInfo::authenticated(
            user_name(namespace, &self.kubernetes.serviceaccount.name),
            self.kubernetes.serviceaccount.uid.clone(),
            vec![
                GROUP_ALL.to_string(),
                format!("{GROUP_NAMESPACE_PREFIX}{namespace}"),
            ],
        );
        let mut extra = BTreeMap::new();
        if let Some(pod) = &self.kubernetes.pod {
            extra.insert(EXTRA_POD_NAME.to_string(), vec![pod.name.clone()]);
            extra.insert(EXTRA_POD_UID.to_string(), vec![pod.uid.clone()]);
        }
        if let Some(node) = &self.kubernetes.node {
            extra.insert(EXTRA_NODE_NAME.to_string(), vec![node.name.clone()]);
            extra.insert(EXTRA_NODE_UID.to_string(), vec![node.uid.clone()]);
        }
        if !self.jti.is_empty() {
            extra.insert(
                EXTRA_CREDENTIAL_ID.to_string(),
                vec![format!("JTI={}", self.jti)],
            );
        }
        user.extra = extra;
        user
    }
}

/// `extra` key of the bound pod's name (Kubernetes `PodNameKey`).
pub const EXTRA_POD_NAME: &str = "authentication.kubernetes.io/pod-name";
/// `extra` key of the bound pod's uid (Kubernetes `PodUIDKey`).
pub const EXTRA_POD_UID: &str = "authentication.kubernetes.io/pod-uid";
/// `extra` key of the bound node's name (Kubernetes `NodeNameKey`).
pub const EXTRA_NODE_NAME: &str = "authentication.kubernetes.io/node-name";
/// `extra` key of the bound node's uid (Kubernetes `NodeUIDKey`).
pub const EXTRA_NODE_UID: &str = "authentication.kubernetes.io/node-uid";
/// `extra` key of the token id (Kubernetes `CredentialIDKey`, value `JTI=<jti>`).
pub const EXTRA_CREDENTIAL_ID: &str = "authentication.kubernetes.io/credential-id";

/// `system:serviceaccount:<namespace>:<name>`.
pub fn user_name(namespace: &str, name: &str) -> String {
    format!("{USER_PREFIX}{namespace}:{name}")
}

/// The namespace and name in a service-account user name, if it is one.
pub fn split_user_name(user: &str) -> Option<(&str, &str)> {
    let rest = user.strip_prefix(USER_PREFIX)?;
    let (namespace, name) = rest.split_once(':')?;
    (!namespace.is_empty() && !name.is_empty() && !name.contains(':')).then_some((namespace, name))
}

/// What a token is asked for (a TokenRequest, or the token controller).
#[derive(Clone, Debug)]
pub struct TokenRequest {
    /// The service account's namespace.
    pub namespace: String,
    /// The service account's name.
    pub name: String,
    /// The service account's uid.
    pub uid: String,
    /// Audiences; empty means the issuer's default audiences.
    pub audiences: Vec<String>,
    /// Lifetime; at least [`EXPIRATION_MIN`].
    pub expiration: Duration,
    /// The pod the token is bound to.
    pub pod: Option<ObjectRef>,
    /// The node the token is bound to.
    pub node: Option<ObjectRef>,
}

/// Why the key cannot be used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum KeyError {
    /// Not a PKCS#8 ECDSA P-256 private key that ring accepts.
    #[error("service-account signing key is not a PKCS#8 ECDSA P-256 key: {0}")]
    Private(String),
    /// Not an uncompressed P-256 point or P-256 SubjectPublicKeyInfo.
    #[error("service-account public key is not an ECDSA P-256 key")]
    Public,
}

/// Why a token cannot be issued.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum IssueError {
    /// The lifetime is below [`EXPIRATION_MIN`].
    #[error("may not specify a duration less than {} seconds", EXPIRATION_MIN.as_secs())]
    TooShort,
    /// The clock is before 1970 or the expiry overflows.
    #[error("the clock reads a time tokens cannot carry")]
    Clock,
    /// The system random source failed.
    #[error("the system random source failed")]
    Random,
}

/// Why a bearer token is not a valid service-account token.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum VerifyError {
    /// Not a JWT, or one from another issuer: another authenticator may know it.
    #[error("not a service-account token of this issuer")]
    NotOurs,
    /// Longer than [`TOKEN_BYTES_MAX`].
    #[error("token is longer than {TOKEN_BYTES_MAX} bytes")]
    TooLong,
    /// Our issuer, but the header or claims are not what we write.
    #[error("malformed service account token: {0}")]
    Malformed(String),
    /// The signature does not verify with our key. The text is go-jose's, which Kubernetes'
    /// JWT authenticator passes on (a TokenReview shows it).
    #[error("go-jose/go-jose: error in cryptographic primitive")]
    BadSignature,
    /// Past `exp` (plus [`LEEWAY`]).
    #[error("service account token has expired")]
    Expired,
    /// Before `nbf` (minus [`LEEWAY`]).
    #[error("service account token is not valid yet")]
    NotYetValid,
    /// `iat` in the future (beyond [`LEEWAY`]).
    #[error("service account token is issued in the future")]
    IssuedInFuture,
    /// No audience of the token is one asked for: Kubernetes' text, lists in Go's `%q` form
    /// (`["a" "b"]`).
    #[error(
        "token audiences {} is invalid for the target audiences {}",
        go_quoted_list(token),
        go_quoted_list(accepted)
    )]
    WrongAudience {
        /// The token's audiences.
        token: Vec<String>,
        /// The audiences asked for (the server's own, or a TokenReview's).
        accepted: Vec<String>,
    },
    /// `sub` does not match the `kubernetes.io` claim.
    #[error("service account token subject {0:?} does not match its kubernetes.io claim")]
    InconsistentSubject(String),
}

/// Signs service-account tokens with the cluster's private key.
pub struct TokenIssuer {
    key: EcdsaKeyPair,
    key_id: String,
    issuer: String,
    audiences: Vec<String>,
    /// ring's system random source: signing ECDSA needs a fresh nonce per signature.
    random: SystemRandom,
}

impl TokenIssuer {
    /// An issuer from a PKCS#8 DER P-256 private key; `audiences` are used when a request
    /// names none (Kubernetes: the API audiences, by default the issuer).
    pub fn new(pkcs8_der: &[u8], issuer: &str, audiences: Vec<String>) -> Result<Self, KeyError> {
        let random = SystemRandom::new();
        let key = EcdsaKeyPair::from_pkcs8(
            &signature::ECDSA_P256_SHA256_FIXED_SIGNING,
            pkcs8_der,
            &random,
        )
        .map_err(|e| KeyError::Private(e.to_string()))?;
        let key_id = key_id(key.public_key().as_ref());
        Ok(TokenIssuer {
            key,
            key_id,
            issuer: issuer.to_string(),
            audiences,
            random,
        })
    }

    /// The `kid` of every token this issuer signs.
    pub fn key_id(&self) -> &str {
        &self.key_id
    }

    /// The verifier for this issuer's tokens, accepting `audiences`.
    pub fn verifier(&self, audiences: Vec<String>) -> TokenVerifier {
        TokenVerifier {
            public_key: self.key.public_key().as_ref().to_vec(),
            issuers: vec![self.issuer.clone()],
            audiences,
        }
    }

    /// Signs a token for `request`, valid from `now` for `request.expiration`.
    pub fn issue(&self, request: &TokenRequest, now: SystemTime) -> Result<String, IssueError> {
        if request.expiration < EXPIRATION_MIN {
            return Err(IssueError::TooShort);
        }
        let now_secs = unix_seconds(now).ok_or(IssueError::Clock)?;
        let lifetime =
            i64::try_from(request.expiration.as_secs()).map_err(|_| IssueError::Clock)?;
        let exp = now_secs.checked_add(lifetime).ok_or(IssueError::Clock)?;
        let mut id = [0u8; 16];
        self.random.fill(&mut id).map_err(|_| IssueError::Random)?;
        let audiences = if request.audiences.is_empty() {
            self.audiences.clone()
        } else {
            request.audiences.clone()
        };
        let claims = Claims {
            iss: self.issuer.clone(),
            sub: user_name(&request.namespace, &request.name),
            aud: audiences,
            exp,
            nbf: now_secs,
            iat: now_secs,
            jti: uuid_v4(id),
            kubernetes: KubernetesClaims {
                namespace: request.namespace.clone(),
                serviceaccount: ObjectRef {
                    name: request.name.clone(),
                    uid: request.uid.clone(),
                },
                pod: request.pod.clone(),
                node: request.node.clone(),
            },
        };
        let header = serde_json::json!({ "alg": ALGORITHM, "kid": self.key_id });
        let mut token = URL_SAFE_NO_PAD.encode(header.to_string());
        token.push('.');
        let payload = serde_json::to_vec(&claims).expect("claims always serialise to JSON");
        token.push_str(&URL_SAFE_NO_PAD.encode(payload));
        let signature = self
            .key
            .sign(&self.random, token.as_bytes())
            .map_err(|_| IssueError::Random)?;
        token.push('.');
        token.push_str(&URL_SAFE_NO_PAD.encode(signature.as_ref()));
        Ok(token)
    }
}

/// Verifies service-account tokens with the cluster's public key.
#[derive(Clone, Debug)]
pub struct TokenVerifier {
    /// The uncompressed P-256 point.
    public_key: Vec<u8>,
    issuers: Vec<String>,
    audiences: Vec<String>,
}

impl TokenVerifier {
    /// A verifier from a public key, either a PKIX SubjectPublicKeyInfo DER or the bare
    /// uncompressed point, accepting tokens of `issuers` for any of `audiences`.
    pub fn new(
        public_key: &[u8],
        issuers: Vec<String>,
        audiences: Vec<String>,
    ) -> Result<Self, KeyError> {
        let point = public_key
            .strip_prefix(&P256_SPKI_PREFIX[..])
            .unwrap_or(public_key);
        if point.len() != 65 || point[0] != 0x04 {
            return Err(KeyError::Public);
        }
        Ok(TokenVerifier {
            public_key: point.to_vec(),
            issuers,
            audiences,
        })
    }

    /// The audiences this verifier accepts for requests to the API server: Kubernetes'
    /// `--api-audiences` (by default the issuer).
    pub fn audiences(&self) -> &[String] {
        &self.audiences
    }

    /// Verifies `token` at time `now` for a request to this server (its own audiences) and
    /// returns its claims.
    pub fn verify(&self, token: &str, now: SystemTime) -> Result<Claims, VerifyError> {
        self.verify_for(token, now, &self.audiences)
            .map(|(claims, _)| claims)
    }

    /// Verifies `token` at time `now` for the audiences `requested` (a TokenReview's, or this
    /// server's), as Kubernetes' `jwtTokenAuthenticator.AuthenticateToken` does: the token's
    /// audiences must meet the requested ones, unless this server has no audiences of its own.
    /// Returns the claims and that intersection, in the token's order.
    pub fn verify_for(
        &self,
        token: &str,
        now: SystemTime,
        requested: &[String],
    ) -> Result<(Claims, Vec<String>), VerifyError> {
        if token.len() > TOKEN_BYTES_MAX {
            return Err(VerifyError::TooLong);
        }
        let mut parts = token.split('.');
        let (Some(header), Some(payload), Some(signature), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(VerifyError::NotOurs);
        };
        // Peek at the issuer before anything else, as Kubernetes does: a JWT of another issuer
        // belongs to another authenticator.
        let payload = URL_SAFE_NO_PAD
            .decode(payload)
            .map_err(|_| VerifyError::NotOurs)?;
        let peek: serde_json::Value =
            serde_json::from_slice(&payload).map_err(|_| VerifyError::NotOurs)?;
        let Some(iss) = peek.get("iss").and_then(|v| v.as_str()) else {
            return Err(VerifyError::NotOurs);
        };
        if !self.issuers.iter().any(|i| i == iss) {
            return Err(VerifyError::NotOurs);
        }

        let header_json = URL_SAFE_NO_PAD
            .decode(header)
            .map_err(|e| VerifyError::Malformed(format!("header: {e}")))?;
        let header_value: serde_json::Value = serde_json::from_slice(&header_json)
            .map_err(|e| VerifyError::Malformed(format!("header: {e}")))?;
        match header_value.get("alg").and_then(|v| v.as_str()) {
            Some(ALGORITHM) => {}
            other => {
                return Err(VerifyError::Malformed(format!(
                    "algorithm {other:?}, expected {ALGORITHM}"
                )));
            }
        }
        let signature = URL_SAFE_NO_PAD
            .decode(signature)
            .map_err(|_| VerifyError::BadSignature)?;
        let signed_len = token.len() - token.rsplit('.').next().map_or(0, str::len) - 1;
        UnparsedPublicKey::new(&signature::ECDSA_P256_SHA256_FIXED, &self.public_key)
            .verify(&token.as_bytes()[..signed_len], &signature)
            .map_err(|_| VerifyError::BadSignature)?;

        let claims: Claims = serde_json::from_slice(&payload)
            .map_err(|e| VerifyError::Malformed(format!("claims: {e}")))?;
        // Kubernetes checks the audiences before the claims' times.
        let audiences: Vec<String> = claims
            .aud
            .iter()
            .filter(|a| requested.contains(a))
            .cloned()
            .collect();
        if audiences.is_empty() && !self.audiences.is_empty() {
            return Err(VerifyError::WrongAudience {
                token: claims.aud.clone(),
                accepted: requested.to_vec(),
            });
        }
        let now = unix_seconds(now).ok_or(VerifyError::Expired)?;
        let leeway = LEEWAY.as_secs() as i64;
        if now > claims.exp.saturating_add(leeway) {
            return Err(VerifyError::Expired);
        }
        if now < claims.nbf.saturating_sub(leeway) {
            return Err(VerifyError::NotYetValid);
        }
        if now < claims.iat.saturating_sub(leeway) {
            return Err(VerifyError::IssuedInFuture);
        }
        let service_account = &claims.kubernetes.serviceaccount;
        if claims.kubernetes.namespace.is_empty()
            || service_account.name.is_empty()
            || claims.sub != user_name(&claims.kubernetes.namespace, &service_account.name)
        {
            return Err(VerifyError::InconsistentSubject(claims.sub.clone()));
        }
        Ok((claims, audiences))
    }
}

/// A list as Go's `%q` prints a `[]string`: `["a" "b"]`.
pub fn go_quoted_list(items: &[String]) -> String {
    let quoted: Vec<String> = items
        .iter()
        .map(|i| serde_json::Value::String(i.clone()).to_string())
        .collect();
    format!("[{}]", quoted.join(" "))
}

/// Kubernetes' key id: unpadded base64url of SHA-256 over the PKIX DER of the public key.
pub fn key_id(uncompressed_point: &[u8]) -> String {
    let mut spki = Vec::with_capacity(P256_SPKI_PREFIX.len() + uncompressed_point.len());
    spki.extend_from_slice(&P256_SPKI_PREFIX);
    spki.extend_from_slice(uncompressed_point);
    URL_SAFE_NO_PAD.encode(ring::digest::digest(&ring::digest::SHA256, &spki))
}

fn unix_seconds(time: SystemTime) -> Option<i64> {
    i64::try_from(time.duration_since(UNIX_EPOCH).ok()?.as_secs()).ok()
}

/// Formats 16 random bytes as a version-4 UUID (RFC 9562 §5.4), as Kubernetes' `jti`.
fn uuid_v4(mut bytes: [u8; 16]) -> String {
    bytes[6] = (bytes[6] & 0x0f) | 0x40;
    bytes[8] = (bytes[8] & 0x3f) | 0x80;
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    )
}

fn string_or_array<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum OneOrMany {
        One(String),
        Many(Vec<String>),
    }
    Ok(match OneOrMany::deserialize(d)? {
        OneOrMany::One(one) => vec![one],
        OneOrMany::Many(many) => many,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::GROUP_AUTHENTICATED;

    fn key() -> Vec<u8> {
        let random = SystemRandom::new();
        EcdsaKeyPair::generate_pkcs8(&signature::ECDSA_P256_SHA256_FIXED_SIGNING, &random)
            .expect("generate")
            .as_ref()
            .to_vec()
    }

    fn request() -> TokenRequest {
        TokenRequest {
            namespace: "team-a".into(),
            name: "builder".into(),
            uid: "0b6c-uid".into(),
            audiences: Vec::new(),
            expiration: EXPIRATION_DEFAULT,
            pod: Some(ObjectRef {
                name: "builder-7f".into(),
                uid: "pod-uid".into(),
            }),
            node: None,
        }
    }

    fn issuer(pkcs8: &[u8]) -> TokenIssuer {
        TokenIssuer::new(pkcs8, ISSUER_DEFAULT, vec![ISSUER_DEFAULT.to_string()]).expect("issuer")
    }

    #[test]
    fn issued_token_verifies_to_the_service_account_user() {
        let issuer = issuer(&key());
        let verifier = issuer.verifier(vec![ISSUER_DEFAULT.to_string()]);
        let now = SystemTime::now();
        let token = issuer.issue(&request(), now).expect("issue");
        let claims = verifier.verify(&token, now).expect("verify");
        assert_eq!(claims.sub, "system:serviceaccount:team-a:builder");
        assert_eq!(claims.aud, [ISSUER_DEFAULT]);
        assert_eq!(claims.exp - claims.iat, 3600);
        let user = claims.user_info();
        assert_eq!(user.name, "system:serviceaccount:team-a:builder");
        assert_eq!(user.uid, "0b6c-uid");
        assert_eq!(
            user.groups,
            [
                "system:serviceaccounts",
                "system:serviceaccounts:team-a",
                GROUP_AUTHENTICATED
            ]
        );
        assert_eq!(user.extra[EXTRA_POD_NAME], ["builder-7f"]);
        assert_eq!(
            user.extra[EXTRA_CREDENTIAL_ID],
            [format!("JTI={}", claims.jti)]
        );
        // The header carries Kubernetes' key id.
        let header = token.split('.').next().expect("header");
        let header: serde_json::Value =
            serde_json::from_slice(&URL_SAFE_NO_PAD.decode(header).expect("b64")).expect("json");
        assert_eq!(header["alg"], "ES256");
        assert_eq!(header["kid"], issuer.key_id());
        assert_eq!(issuer.key_id().len(), 43, "base64url of 32 bytes, unpadded");
    }

    #[test]
    fn expired_token_is_refused() {
        let issuer = issuer(&key());
        let verifier = issuer.verifier(vec![ISSUER_DEFAULT.to_string()]);
        let issued = SystemTime::now() - Duration::from_secs(7200);
        let token = issuer.issue(&request(), issued).expect("issue");
        assert!(matches!(
            verifier.verify(&token, SystemTime::now()),
            Err(VerifyError::Expired)
        ));
        // Within the leeway it still passes; just past it, it does not.
        let exp = issued + EXPIRATION_DEFAULT;
        assert!(verifier.verify(&token, exp + LEEWAY).is_ok());
        assert!(matches!(
            verifier.verify(&token, exp + LEEWAY + Duration::from_secs(1)),
            Err(VerifyError::Expired)
        ));
    }

    #[test]
    fn future_token_is_refused() {
        let issuer = issuer(&key());
        let verifier = issuer.verifier(vec![ISSUER_DEFAULT.to_string()]);
        let now = SystemTime::now();
        let token = issuer
            .issue(&request(), now + Duration::from_secs(600))
            .expect("issue");
        assert!(matches!(
            verifier.verify(&token, now),
            Err(VerifyError::NotYetValid)
        ));
    }

    #[test]
    fn token_signed_by_another_key_is_refused() {
        let ours = issuer(&key());
        let theirs = issuer(&key());
        let now = SystemTime::now();
        let token = theirs.issue(&request(), now).expect("issue");
        let verifier = ours.verifier(vec![ISSUER_DEFAULT.to_string()]);
        assert!(matches!(
            verifier.verify(&token, now),
            Err(VerifyError::BadSignature)
        ));
    }

    #[test]
    fn tampered_claims_are_refused() {
        let issuer = issuer(&key());
        let verifier = issuer.verifier(vec![ISSUER_DEFAULT.to_string()]);
        let now = SystemTime::now();
        let token = issuer.issue(&request(), now).expect("issue");
        let parts: Vec<&str> = token.split('.').collect();
        let mut claims: serde_json::Value =
            serde_json::from_slice(&URL_SAFE_NO_PAD.decode(parts[1]).expect("b64")).expect("json");
        claims["kubernetes.io"]["namespace"] = "kube-system".into();
        claims["sub"] = "system:serviceaccount:kube-system:builder".into();
        let forged = format!(
            "{}.{}.{}",
            parts[0],
            URL_SAFE_NO_PAD.encode(claims.to_string()),
            parts[2]
        );
        assert!(matches!(
            verifier.verify(&forged, now),
            Err(VerifyError::BadSignature)
        ));
        // alg "none" with no signature is refused before any signature check.
        let none = format!(
            "{}.{}.",
            URL_SAFE_NO_PAD.encode(r#"{"alg":"none"}"#),
            URL_SAFE_NO_PAD.encode(claims.to_string())
        );
        assert!(matches!(
            verifier.verify(&none, now),
            Err(VerifyError::Malformed(_))
        ));
    }

    #[test]
    fn wrong_audience_and_foreign_issuer() {
        let issuer = issuer(&key());
        let now = SystemTime::now();
        let mut req = request();
        req.audiences = vec!["vault".into()];
        let token = issuer.issue(&req, now).expect("issue");
        let verifier = issuer.verifier(vec![ISSUER_DEFAULT.to_string()]);
        assert!(matches!(
            verifier.verify(&token, now),
            Err(VerifyError::WrongAudience { .. })
        ));
        let other =
            TokenIssuer::new(&key(), "https://elsewhere", vec!["x".into()]).expect("issuer");
        let foreign = other.issue(&request(), now).expect("issue");
        assert!(matches!(
            verifier.verify(&foreign, now),
            Err(VerifyError::NotOurs)
        ));
        assert!(matches!(
            verifier.verify("opaque-token", now),
            Err(VerifyError::NotOurs)
        ));
        let long = "a".repeat(TOKEN_BYTES_MAX + 1);
        assert!(matches!(
            verifier.verify(&long, now),
            Err(VerifyError::TooLong)
        ));
    }

    #[test]
    fn requested_audiences_meet_the_token_s() {
        let issuer = issuer(&key());
        let now = SystemTime::now();
        let mut req = request();
        req.audiences = vec!["vault".into(), ISSUER_DEFAULT.into(), "ci".into()];
        let token = issuer.issue(&req, now).expect("issue");
        let verifier = issuer.verifier(vec![ISSUER_DEFAULT.to_string()]);
        // The intersection, in the token's order.
        let (_, audiences) = verifier
            .verify_for(&token, now, &["ci".into(), "vault".into()])
            .expect("verify");
        assert_eq!(audiences, ["vault", "ci"]);
        let (_, audiences) = verifier
            .verify_for(&token, now, verifier.audiences())
            .expect("verify");
        assert_eq!(audiences, [ISSUER_DEFAULT]);
        let err = verifier
            .verify_for(&token, now, &["other".into()])
            .expect_err("no common audience");
        assert_eq!(
            err.to_string(),
            format!(
                "token audiences [\"vault\" \"{ISSUER_DEFAULT}\" \"ci\"] is invalid for the target audiences [\"other\"]"
            )
        );
        // An expired token with no common audience is refused for its audience first.
        let old = issuer
            .issue(&req, now - Duration::from_secs(7200))
            .expect("issue");
        assert!(matches!(
            verifier.verify_for(&old, now, &["other".into()]),
            Err(VerifyError::WrongAudience { .. })
        ));
    }

    #[test]
    fn short_expiration_is_refused_and_public_key_forms_load() {
        let pkcs8 = key();
        let issuer = issuer(&pkcs8);
        let mut req = request();
        req.expiration = Duration::from_secs(599);
        assert!(matches!(
            issuer.issue(&req, SystemTime::now()),
            Err(IssueError::TooShort)
        ));
        let pair = EcdsaKeyPair::from_pkcs8(
            &signature::ECDSA_P256_SHA256_FIXED_SIGNING,
            &pkcs8,
            &SystemRandom::new(),
        )
        .expect("pair");
        let point = pair.public_key().as_ref().to_vec();
        let mut spki = P256_SPKI_PREFIX.to_vec();
        spki.extend_from_slice(&point);
        let now = SystemTime::now();
        let token = issuer.issue(&request(), now).expect("issue");
        for form in [point.clone(), spki] {
            let verifier = TokenVerifier::new(
                &form,
                vec![ISSUER_DEFAULT.into()],
                vec![ISSUER_DEFAULT.into()],
            )
            .expect("verifier");
            assert!(verifier.verify(&token, now).is_ok());
        }
        assert!(TokenVerifier::new(&point[1..], vec![], vec![]).is_err());
        assert!(TokenIssuer::new(b"not a key", ISSUER_DEFAULT, vec![]).is_err());
    }

    #[test]
    fn user_names_split() {
        assert_eq!(
            split_user_name("system:serviceaccount:ns:sa"),
            Some(("ns", "sa"))
        );
        assert_eq!(split_user_name("system:serviceaccount:ns"), None);
        assert_eq!(split_user_name("system:serviceaccount::sa"), None);
        assert_eq!(split_user_name("alice"), None);
    }
}
