//! Service-account tokens for projected volumes, requested from the apiserver
//! (`POST serviceaccounts/<name>/token`) and cached per request as the upstream kubelet's
//! token manager does (`pkg/kubelet/token/token_manager.go`: `GetServiceAccountToken`,
//! `requiresRefresh`, `keyFunc`, `DeleteServiceAccountToken`, `cleanup`).
//!
//! The rule: a cached token is used until it is older than 80 % of its life or than 24 hours,
//! each threshold moved earlier by a random jitter of up to 10 s so the node's pods do not all
//! refresh at once. A failed refresh keeps serving the cached token until it has expired.
//! Time comes from a [`Clock`], so tests move it instead of waiting out a token's life.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use k8s_openapi::api::authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::ServiceAccount;
use skerry_client::api::http_method::Method;
use skerry_client::{Api, Client};

/// A token is refreshed once older than this whatever its expiry (`maxTTL`).
pub const MAX_TTL: Duration = Duration::from_secs(24 * 60 * 60);
/// The largest random advance of a refresh (`maxJitter`), whole seconds as upstream rounds it.
pub const MAX_JITTER: Duration = Duration::from_secs(10);
/// The part of a token's life left when it is refreshed (`ExpirationSeconds*20/100`).
const REFRESH_REMAINING_PERCENT: i64 = 20;

/// Where tokens come from.
pub trait TokenSource: Send + Sync {
    /// `POST namespaces/<namespace>/serviceaccounts/<name>/token` with `request`; the answer
    /// carries `status.token` and `status.expirationTimestamp`.
    fn request_token(
        &self,
        namespace: &str,
        service_account: &str,
        request: &TokenRequest,
    ) -> impl Future<Output = Result<TokenRequest, String>> + Send;
}

/// [`TokenSource`] over the API with the node's client.
#[derive(Clone)]
pub struct ApiTokenSource {
    client: Client,
}

impl ApiTokenSource {
    /// Requests through `client`.
    pub fn new(client: Client) -> ApiTokenSource {
        ApiTokenSource { client }
    }
}

impl TokenSource for ApiTokenSource {
    async fn request_token(
        &self,
        namespace: &str,
        service_account: &str,
        request: &TokenRequest,
    ) -> Result<TokenRequest, String> {
        let api: Api<ServiceAccount> = self.client.api(Some(namespace));
        let mut body = serde_json::to_value(request).map_err(|e| e.to_string())?;
        body["apiVersion"] = "authentication.k8s.io/v1".into();
        body["kind"] = "TokenRequest".into();
        let answer = api
            .subresource(Method::Post, service_account, "token", Some(&body))
            .await
            .map_err(|e| e.to_string())?;
        serde_json::from_value(answer).map_err(|e| format!("decode the TokenRequest: {e}"))
    }
}

/// The time the manager reads.
pub trait Clock: Send + Sync {
    /// Now.
    fn now(&self) -> SystemTime;
}

/// The system's wall clock (token expiry is wall-clock time, set by the apiserver).
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> SystemTime {
        SystemTime::now()
    }
}

/// The cache of tokens by request.
pub struct TokenManager<T> {
    source: T,
    clock: Arc<dyn Clock>,
    cache: Mutex<HashMap<String, Cached>>,
}

/// A cached answer and the pod its request was bound to (taken from the request: an
/// apiserver need not echo `boundObjectRef`, and skerry's does not).
#[derive(Clone)]
struct Cached {
    token: TokenRequest,
    pod_uid: Option<String>,
}

impl<T: TokenSource> TokenManager<T> {
    /// A manager over `source` reading `clock`.
    pub fn new(source: T, clock: Arc<dyn Clock>) -> TokenManager<T> {
        TokenManager {
            source,
            clock,
            cache: Mutex::new(HashMap::new()),
        }
    }

    /// A token for `namespace/name` as `request` asks, from the cache when it needs no
    /// refresh (`GetServiceAccountToken`).
    pub async fn get_service_account_token(
        &self,
        namespace: &str,
        name: &str,
        request: &TokenRequest,
    ) -> Result<TokenRequest, String> {
        let key = key(name, namespace, request);
        let cached = self.lock().get(&key).map(|c| c.token.clone());
        if let Some(cached) = &cached
            && !requires_refresh(self.clock.now(), cached, jitter())
        {
            return Ok(cached.clone());
        }
        match self.source.request_token(namespace, name, request).await {
            Ok(fresh) => {
                let pod_uid = request
                    .spec
                    .bound_object_ref
                    .as_ref()
                    .filter(|r| r.kind.as_deref() == Some("Pod"))
                    .and_then(|r| r.uid.clone());
                self.lock().insert(
                    key,
                    Cached {
                        token: fresh.clone(),
                        pod_uid,
                    },
                );
                Ok(fresh)
            }
            Err(e) => match cached {
                None => Err(format!("failed to fetch token: {e}")),
                Some(cached) if self.expired(&cached) => {
                    Err(format!("token {key} expired and refresh failed: {e}"))
                }
                Some(cached) => {
                    tracing::error!(cache_key = %key, error = %e, "couldn't update token");
                    Ok(cached)
                }
            },
        }
    }

    /// Forgets the tokens bound to the pod `pod_uid` (`DeleteServiceAccountToken`).
    pub fn delete_pod_tokens(&self, pod_uid: &str) {
        self.lock()
            .retain(|_, c| c.pod_uid.as_deref() != Some(pod_uid));
    }

    /// Drops expired tokens (upstream runs this every minute).
    pub fn cleanup(&self) {
        let now = self.clock.now();
        self.lock()
            .retain(|_, c| expiration(&c.token).is_none_or(|exp| now <= exp));
    }

    /// How many tokens are cached.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether no token is cached.
    pub fn is_empty(&self) -> bool {
        self.lock().is_empty()
    }

    fn expired(&self, tr: &TokenRequest) -> bool {
        expiration(tr).is_none_or(|exp| self.clock.now() > exp)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Cached>> {
        self.cache.lock().unwrap_or_else(|p| p.into_inner())
    }
}

fn expiration(tr: &TokenRequest) -> Option<SystemTime> {
    let ts = tr.status.as_ref()?.expiration_timestamp.0;
    Some(SystemTime::from(ts))
}

/// A random advance in whole seconds below [`MAX_JITTER`].
fn jitter() -> Duration {
    Duration::from_secs(rand::random_range(0..MAX_JITTER.as_secs()))
}

/// Whether a cached token must be refreshed at `now` (`requiresRefresh`): older than
/// [`MAX_TTL`] - jitter, or within 20 % of its life + jitter of its expiry. A token without
/// `expirationSeconds` is never refreshed (upstream logs it).
pub fn requires_refresh(now: SystemTime, tr: &TokenRequest, jitter: Duration) -> bool {
    let Some(seconds) = tr.spec.expiration_seconds else {
        tracing::error!("expiration seconds was nil for a token request");
        return false;
    };
    let Some(exp) = expiration(tr) else {
        return true;
    };
    let life = Duration::from_secs(u64::try_from(seconds).unwrap_or(0));
    let iat = exp.checked_sub(life).unwrap_or(SystemTime::UNIX_EPOCH);
    if now > iat + MAX_TTL.saturating_sub(jitter) {
        return true;
    }
    let remaining =
        Duration::from_secs(u64::try_from(seconds * REFRESH_REMAINING_PERCENT / 100).unwrap_or(0));
    let threshold = exp
        .checked_sub(remaining + jitter)
        .unwrap_or(SystemTime::UNIX_EPOCH);
    now > threshold
}

/// The cache key (`keyFunc`): name, namespace, audiences, expiry and bound object.
fn key(name: &str, namespace: &str, tr: &TokenRequest) -> String {
    let spec = &tr.spec;
    let bound = spec.bound_object_ref.as_ref();
    format!(
        "{name:?}/{namespace:?}/{:?}/{}/{:?}/{:?}/{:?}/{:?}",
        spec.audiences,
        spec.expiration_seconds.unwrap_or(0),
        bound.and_then(|b| b.kind.as_deref()),
        bound.and_then(|b| b.api_version.as_deref()),
        bound.and_then(|b| b.name.as_deref()),
        bound.and_then(|b| b.uid.as_deref()),
    )
}

/// The request a projected `serviceAccountToken` source makes: its audience (none: the
/// apiserver's own), its expiry, bound to the pod.
pub fn projected_request(
    audience: Option<&str>,
    expiration_seconds: Option<i64>,
    pod_name: &str,
    pod_uid: &str,
) -> TokenRequest {
    TokenRequest {
        spec: TokenRequestSpec {
            audiences: audience
                .filter(|a| !a.is_empty())
                .map(|a| vec![a.to_string()])
                .unwrap_or_default(),
            expiration_seconds,
            bound_object_ref: Some(BoundObjectReference {
                api_version: Some("v1".to_string()),
                kind: Some("Pod".to_string()),
                name: Some(pod_name.to_string()),
                uid: Some(pod_uid.to_string()),
            }),
        },
        ..Default::default()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "a test panics to fail")]
mod tests {
    use k8s_openapi::api::authentication::v1::TokenRequestStatus;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    use super::*;

    fn token(exp: SystemTime, seconds: i64) -> TokenRequest {
        TokenRequest {
            spec: TokenRequestSpec {
                expiration_seconds: Some(seconds),
                ..Default::default()
            },
            status: Some(TokenRequestStatus {
                token: "t".into(),
                expiration_timestamp: Time(jiff::Timestamp::try_from(exp).unwrap()),
            }),
            ..Default::default()
        }
    }

    /// Upstream's `TestRequiresRefresh` table, in our words.
    #[test]
    fn refreshed_at_eighty_percent_or_after_a_day() {
        let start = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let hour = token(start + Duration::from_secs(3600), 3600);
        let at = |s: u64| start + Duration::from_secs(s);
        assert!(!requires_refresh(at(0), &hour, Duration::ZERO));
        assert!(
            !requires_refresh(at(2880), &hour, Duration::ZERO),
            "exactly 80 %"
        );
        assert!(requires_refresh(at(2881), &hour, Duration::ZERO));
        // The jitter moves the threshold earlier.
        assert!(requires_refresh(at(2875), &hour, Duration::from_secs(9)));
        assert!(!requires_refresh(at(2870), &hour, Duration::from_secs(9)));
        // A two-day token is refreshed after 24 hours, long before 80 %.
        let long = token(start + Duration::from_secs(172_800), 172_800);
        assert!(!requires_refresh(at(86_400), &long, Duration::ZERO));
        assert!(requires_refresh(at(86_401), &long, Duration::ZERO));
        // No expirationSeconds: never.
        let mut none = hour.clone();
        none.spec.expiration_seconds = None;
        assert!(!requires_refresh(at(100_000), &none, Duration::ZERO));
    }

    struct Manual(std::sync::Mutex<SystemTime>);
    impl Clock for Manual {
        fn now(&self) -> SystemTime {
            *self.0.lock().unwrap()
        }
    }

    /// Answers a token expiring `life` after the clock's now, or fails when told to.
    struct Flaky {
        clock: Arc<Manual>,
        fail: std::sync::atomic::AtomicBool,
        calls: std::sync::atomic::AtomicUsize,
    }
    impl TokenSource for Flaky {
        async fn request_token(
            &self,
            _namespace: &str,
            _name: &str,
            request: &TokenRequest,
        ) -> Result<TokenRequest, String> {
            use std::sync::atomic::Ordering;
            let n = self.calls.fetch_add(1, Ordering::SeqCst);
            if self.fail.load(Ordering::SeqCst) {
                return Err("apiserver unreachable".into());
            }
            let seconds = request.spec.expiration_seconds.unwrap_or(3600);
            let exp = self.clock.now() + Duration::from_secs(u64::try_from(seconds).unwrap());
            let mut tr = token(exp, seconds);
            tr.spec = request.spec.clone();
            tr.status.as_mut().unwrap().token = format!("token-{n}");
            Ok(tr)
        }
    }

    #[tokio::test]
    async fn cached_until_due_then_served_stale_until_expiry_when_refresh_fails() {
        use std::sync::atomic::Ordering;
        let start = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let clock = Arc::new(Manual(std::sync::Mutex::new(start)));
        let source = Flaky {
            clock: clock.clone(),
            fail: false.into(),
            calls: 0.into(),
        };
        let manager = TokenManager::new(source, clock.clone());
        let request = projected_request(Some("vault"), Some(600), "web-0", "uid-1");
        let set = |s: u64| *clock.0.lock().unwrap() = start + Duration::from_secs(s);
        let get = || manager.get_service_account_token("shop", "robot", &request);
        let token_of = |tr: TokenRequest| tr.status.unwrap().token;

        assert_eq!(token_of(get().await.unwrap()), "token-0");
        set(100);
        assert_eq!(token_of(get().await.unwrap()), "token-0", "cached");
        // Past 80 %: refreshed.
        set(481);
        assert_eq!(token_of(get().await.unwrap()), "token-1");
        // Due again (the new token was issued at 481), but the apiserver fails: the cached
        // token is served while it is valid, then the failure is reported.
        manager.source.fail.store(true, Ordering::SeqCst);
        set(481 + 500);
        assert_eq!(token_of(get().await.unwrap()), "token-1", "stale but valid");
        set(481 + 601);
        let err = get().await.unwrap_err();
        assert!(
            err.contains("expired and refresh failed: apiserver unreachable"),
            "{err}"
        );
        // Expired tokens go on cleanup; a pod's tokens go with the pod.
        manager.cleanup();
        assert!(manager.is_empty());
        manager.source.fail.store(false, Ordering::SeqCst);
        get().await.unwrap();
        assert_eq!(manager.len(), 1);
        manager.delete_pod_tokens("other-uid");
        assert_eq!(manager.len(), 1);
        manager.delete_pod_tokens("uid-1");
        assert!(manager.is_empty());
        // A first request that fails says so.
        manager.source.fail.store(true, Ordering::SeqCst);
        assert_eq!(
            get().await.unwrap_err(),
            "failed to fetch token: apiserver unreachable"
        );
    }
}
