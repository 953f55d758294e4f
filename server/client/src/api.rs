//! The typed HTTP(S) client for the apiserver.
//!
//! [`Client`] owns the connections (hyper over rustls, HTTP/2 when the server offers it by
//! ALPN, HTTP/1.1 otherwise), the credentials and one [`crate::flowcontrol::TokenBucket`]
//! (client-go's QPS/burst); it is cheap to clone. [`Api<K>`] is a typed view on one resource
//! in one namespace (or all); [`MetadataApi`] is the metadata-only view
//! (`as=PartialObjectMetadata`) over a resource named at run time, which the garbage
//! collector reads (`docs/tricks.md` #29).
//!
//! What it carries from client-go (the client library, `docs/tricks.md` #15-21):
//! - Every request, watches included, first waits for a token of the client's bucket, so a
//!   controller that relists in a loop is slowed down instead of flooding the apiserver.
//! - Over HTTP/2 every request and every watch of a client is a stream of one connection
//!   (client-go multiplexes a process's watches the same way), kept alive by pings so a dead
//!   peer ends the watches instead of leaving them silent forever.
//! - Non-2xx answers become [`Error::Api`] with the server's `Status` (or one synthesized from
//!   the HTTP code when the body is not a Status, as `NewGenericServerResponse` does).
//! - JSON or protobuf ([`ContentType`]): protobuf bodies are sent and accepted, with JSON as
//!   the fallback the server may answer in; watches are newline-delimited JSON events or
//!   length-prefixed protobuf `WatchEvent`s.
//!
//! Invariants: non-watch requests are bounded by [`Config::timeout`] from the first byte sent
//! to the last byte read (the wait for a rate-limiter token is not counted); no response body
//! and no watch frame is read past a named bound; a watch stream ends after its first error.

use std::collections::BTreeMap;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Buf, Bytes, BytesMut};
use futures::StreamExt;
use futures::stream::BoxStream;
use http::header::{ACCEPT, AUTHORIZATION, CONTENT_TYPE, USER_AGENT};
use http::{HeaderValue, Uri};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper_util::client::legacy::connect::{Connected, Connection};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ListMeta, Status};
use rustls_pki_types::ServerName;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;

use crate::Error;
use crate::config::{Config, ContentType, Credentials};
use crate::flowcontrol::TokenBucket;
use crate::object::{ApiResource, Object, PartialObjectMetadata};

/// `application/json`.
const JSON: &str = "application/json";
/// Kubernetes' protobuf media type.
const PROTOBUF: &str = skerry_api::protobuf::CONTENT_TYPE;
/// What a protobuf client accepts: protobuf first, JSON for what the server only has in JSON
/// (client-go's `application/vnd.kubernetes.protobuf,application/json`).
const ACCEPT_PROTOBUF: &str = "application/vnd.kubernetes.protobuf, application/json";
/// A protobuf watch: the stream media type first, JSON as the fallback.
const ACCEPT_PROTOBUF_WATCH: &str =
    "application/vnd.kubernetes.protobuf;stream=watch, application/json";
/// The metadata-only form of one object (client-go's metadata client), JSON as the fallback
/// (a full object decodes as metadata too).
const ACCEPT_METADATA: &str =
    "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1, application/json";
/// The metadata-only form of a list.
const ACCEPT_METADATA_LIST: &str =
    "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1, application/json";

/// The ALPN protocols offered: HTTP/2 first so every request and watch of a client shares one
/// connection, HTTP/1.1 for servers without it.
const ALPN_PROTOCOLS: [&[u8]; 2] = [b"h2", b"http/1.1"];

/// Bound on opening one connection (TCP + TLS). client-go's dialer uses 30 s; the loopback
/// and a LAN answer in milliseconds, and a smaller bound surfaces a dead member sooner.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// An idle HTTP/2 connection is pinged this often, so a silently dead peer (a member
/// powered off mid-watch) is noticed (client-go's HTTP/2 `ReadIdleTimeout`, 30 s).
pub const HTTP2_PING_INTERVAL: Duration = Duration::from_secs(30);

/// A ping unanswered for this long closes the connection and fails its streams, which the
/// reflector turns into a re-watch (client-go's HTTP/2 `PingTimeout`, 15 s).
pub const HTTP2_PING_TIMEOUT: Duration = Duration::from_secs(15);

/// Idle pooled connections are closed after this long (Go's `http.Transport`
/// `IdleConnTimeout` default, 90 s).
pub const POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(90);

/// Bound on a whole response body that is not a watch. A LIST of 10,000 pods of 2 KiB is
/// 20 MiB; a client asking for much more should page. Semi-arbitrary; larger only moves the
/// point at which a runaway LIST exhausts memory.
pub const RESPONSE_BYTES_MAX: usize = 256 * 1024 * 1024;

/// Bound on one watch event. An object is at most 1.5 MiB in the store (3 MiB request body
/// with headroom); 16 MiB leaves room for any encoding of it and stops a corrupt length
/// prefix from making the client allocate gigabytes.
pub const WATCH_FRAME_BYTES_MAX: usize = 16 * 1024 * 1024;

/// How many times one request is retried when the server answers 429 or 5xx *with* a
/// `Retry-After` header (client-go's `maxRetries`, `rest/request.go`, default 10). Such an
/// answer says the request was not processed — the apiserver's max-in-flight limit, a member
/// still starting — so any verb is safe to resend; a 5xx without the header may have been
/// applied and goes back to the caller.
pub const RETRY_AFTER_RETRIES_MAX: u32 = 10;

/// Cap on one `Retry-After` wait. skerry's apiserver asks for 1 s (10 s for an eviction whose
/// budget is still being processed); the header is the server's input, and a controller must
/// not sleep for whatever a broken or hostile server names. Ten retries at the cap stay within
/// a few minutes.
pub const RETRY_AFTER_MAX: Duration = Duration::from_secs(10);

/// Bytes of a non-Status error body quoted in the synthesized Status message: enough for a
/// proxy's error page to be recognisable, short enough for a log line.
const ERROR_BODY_QUOTE_BYTES_MAX: usize = 512;

/// The one hyper client type used: pooled connections from [`Connector`], whole bodies out.
type HttpClient = hyper_util::client::legacy::Client<Connector, Full<Bytes>>;

/// A connection to one apiserver. Clones share connections and the rate limiter.
#[derive(Clone)]
pub struct Client {
    inner: Arc<Inner>,
}

struct Inner {
    http: HttpClient,
    /// `https://host:port` plus any path prefix of the configured server URL.
    base: String,
    /// `Authorization`, if a token is configured.
    authorization: Option<HeaderValue>,
    user_agent: HeaderValue,
    content_type: ContentType,
    timeout: Duration,
    /// client-go's QPS/burst limiter, shared by every clone: the limit is per client, not per
    /// `Api` view.
    limiter: TokenBucket,
}

impl Client {
    /// A client for `config` (server URL, CA, client certificate or token, QPS/burst,
    /// content type). A bad URL, CA, certificate or key is [`Error::Config`].
    pub fn new(config: Config) -> Result<Client, Error> {
        let uri: Uri = config
            .server
            .parse()
            .map_err(|e| Error::Config(format!("server URL {:?}: {e}", config.server)))?;
        let https = match uri.scheme_str() {
            Some("https") => true,
            Some("http") => false,
            _ => {
                return Err(Error::Config(format!(
                    "server URL {:?}: the scheme must be https or http",
                    config.server
                )));
            }
        };
        let host = uri
            .host()
            .filter(|h| !h.is_empty())
            .ok_or_else(|| Error::Config(format!("server URL {:?} has no host", config.server)))?;
        let authority = uri
            .authority()
            .ok_or_else(|| Error::Config(format!("server URL {:?} has no host", config.server)))?;
        let prefix = uri.path().trim_end_matches('/');
        let base = format!(
            "{}://{authority}{prefix}",
            if https { "https" } else { "http" }
        );

        let tls = if https {
            let server_name =
                ServerName::try_from(host.trim_start_matches('[').trim_end_matches(']'))
                    .map_err(|e| Error::Config(format!("server name {host:?}: {e}")))?
                    .to_owned();
            Some((
                TlsConnector::from(Arc::new(tls_config(&config)?)),
                server_name,
            ))
        } else {
            if matches!(config.credentials, Credentials::ClientCert { .. }) {
                return Err(Error::Config(
                    "a client certificate needs an https server URL".to_string(),
                ));
            }
            None
        };

        let authorization = match &config.credentials {
            Credentials::Token(token) => {
                let mut value = HeaderValue::from_str(&format!("Bearer {}", token.trim()))
                    .map_err(|_| {
                        Error::Config("the bearer token is not a valid header value".to_string())
                    })?;
                value.set_sensitive(true);
                Some(value)
            }
            _ => None,
        };
        let user_agent = HeaderValue::from_str(&config.user_agent).map_err(|_| {
            Error::Config(format!(
                "user agent {:?} is not a valid header value",
                config.user_agent
            ))
        })?;

        let connector = Connector {
            tls: tls.map(Arc::new),
        };
        let http = hyper_util::client::legacy::Client::builder(TokioExecutor::new())
            .timer(TokioTimer::new())
            .pool_timer(TokioTimer::new())
            .pool_idle_timeout(POOL_IDLE_TIMEOUT)
            .http2_keep_alive_interval(HTTP2_PING_INTERVAL)
            .http2_keep_alive_timeout(HTTP2_PING_TIMEOUT)
            .http2_keep_alive_while_idle(true)
            .build(connector);
        Ok(Client {
            inner: Arc::new(Inner {
                http,
                base,
                authorization,
                user_agent,
                content_type: config.content_type,
                timeout: config.timeout,
                limiter: TokenBucket::new(config.qps, config.burst),
            }),
        })
    }

    /// A client from kubectl's kubeconfig ([`Config::infer`]).
    pub fn try_default() -> Result<Client, Error> {
        Client::new(Config::infer()?)
    }

    /// The server URL requests go to (scheme, authority and any path prefix).
    pub fn base_url(&self) -> &str {
        &self.inner.base
    }

    /// The encoding this client sends bodies in and prefers answers in.
    pub fn content_type(&self) -> ContentType {
        self.inner.content_type
    }

    /// A typed API for `K` in `namespace` (`None`: all namespaces, or a cluster-scoped kind).
    pub fn api<K: Object + k8s_openapi::Resource>(&self, namespace: Option<&str>) -> Api<K> {
        Api {
            client: self.clone(),
            namespace: namespace.map(str::to_string),
            _k: std::marker::PhantomData,
        }
    }

    /// The metadata-only API for `resource` in `namespace`.
    pub fn metadata(&self, resource: ApiResource, namespace: Option<&str>) -> MetadataApi {
        MetadataApi {
            client: self.clone(),
            resource,
            namespace: namespace.map(str::to_string),
        }
    }

    /// A raw request (path with query), for what the typed APIs do not cover. Returns the
    /// status code and body; non-2xx answers are returned, not turned into errors.
    pub async fn request_raw(
        &self,
        method: http_method::Method,
        path_and_query: &str,
        body: Option<(&str, Vec<u8>)>,
    ) -> Result<(u16, Vec<u8>), Error> {
        let body = body.map(|(content_type, bytes)| (content_type.to_string(), Bytes::from(bytes)));
        let answer = self.call(method, path_and_query, body, JSON).await?;
        Ok((answer.code, answer.body.to_vec()))
    }

    /// Builds one request.
    fn request(
        &self,
        method: http_method::Method,
        path_and_query: &str,
        body: Option<(String, Bytes)>,
        accept: &str,
    ) -> Result<http::Request<Full<Bytes>>, Error> {
        let mut builder = http::Request::builder()
            .method(method.as_http())
            .uri(format!("{}{path_and_query}", self.inner.base))
            .header(ACCEPT, accept)
            .header(USER_AGENT, self.inner.user_agent.clone());
        if let Some(auth) = &self.inner.authorization {
            builder = builder.header(AUTHORIZATION, auth.clone());
        }
        let body = match body {
            Some((content_type, bytes)) => {
                builder = builder.header(CONTENT_TYPE, content_type);
                bytes
            }
            None => Bytes::new(),
        };
        builder
            .body(Full::new(body))
            .map_err(|e| Error::Transport(format!("building {path_and_query}: {e}")))
    }

    /// Sends one request now (no token) and returns the response head and body stream.
    async fn send_now(
        &self,
        method: http_method::Method,
        path_and_query: &str,
        request: http::Request<Full<Bytes>>,
    ) -> Result<http::Response<Incoming>, Error> {
        tracing::trace!(method = ?method, path = %path_and_query, "request");
        self.inner
            .http
            .request(request)
            .await
            .map_err(|e| Error::Transport(format!("{method:?} {path_and_query}: {}", chain(&e))))
    }

    /// One whole request/response exchange: waits for a token, then sends and reads the
    /// answer within the configured timeout.
    async fn call(
        &self,
        method: http_method::Method,
        path_and_query: &str,
        body: Option<(String, Bytes)>,
        accept: &str,
    ) -> Result<Answer, Error> {
        let mut retries = 0;
        loop {
            let request = self.request(method, path_and_query, body.clone(), accept)?;
            // Every attempt, retries included, waits for a token, as client-go's do.
            self.inner.limiter.acquire().await;
            let exchange = async {
                let response = self.send_now(method, path_and_query, request).await?;
                read_answer(response, path_and_query).await
            };
            let answer = match tokio::time::timeout(self.inner.timeout, exchange).await {
                Ok(answer) => answer?,
                Err(_) => {
                    return Err(Error::Transport(format!(
                        "{method:?} {path_and_query}: no answer within {:?}",
                        self.inner.timeout
                    )));
                }
            };
            match answer.retry_after {
                Some(wait) if retries < RETRY_AFTER_RETRIES_MAX => {
                    retries += 1;
                    tracing::debug!(
                        method = ?method,
                        path = %path_and_query,
                        code = answer.code,
                        ?wait,
                        retries,
                        "the server asked to retry later"
                    );
                    tokio::time::sleep(wait).await;
                }
                _ => return Ok(answer),
            }
        }
    }

    /// A request whose 2xx answer decodes as `T` (JSON or protobuf, as the server answered);
    /// anything else is an [`Error::Api`].
    async fn call_typed<T: DeserializeOwned>(
        &self,
        method: http_method::Method,
        path_and_query: &str,
        body: Option<(String, Bytes)>,
        accept: &str,
    ) -> Result<T, Error> {
        let answer = self.call(method, path_and_query, body, accept).await?;
        answer.ok()?.decode()
    }

    /// Opens a watch: waits for a token, sends the request, and waits (bounded by the
    /// configured timeout) for the response head; the stream itself is unbounded in time —
    /// the server ends it after `timeoutSeconds`.
    async fn watch_raw(&self, path_and_query: &str, accept: &str) -> Result<RawWatch, Error> {
        let timeout = self.inner.timeout;
        let method = http_method::Method::Get;
        let request = self.request(method, path_and_query, None, accept)?;
        // Watches wait for a token too, as client-go's do: a reflector that re-watches in a
        // tight loop is slowed down like any other caller.
        self.inner.limiter.acquire().await;
        let opened = tokio::time::timeout(timeout, self.send_now(method, path_and_query, request))
            .await
            .map_err(|_| {
                Error::Transport(format!(
                    "watch {path_and_query}: no answer within {timeout:?}"
                ))
            })??;
        if !opened.status().is_success() {
            let answer = tokio::time::timeout(timeout, read_answer(opened, path_and_query))
                .await
                .map_err(|_| {
                    Error::Transport(format!(
                        "watch {path_and_query}: no error body within {timeout:?}"
                    ))
                })??;
            return Err(answer.into_error());
        }
        let framing = if content_type_of(opened.headers()).starts_with(PROTOBUF) {
            Framing::Protobuf
        } else {
            Framing::Json
        };
        Ok(raw_events(opened.into_body(), framing))
    }

    /// The body of a create/update: protobuf when the client speaks it and the kind has a
    /// protobuf schema, else JSON.
    fn body_of<T: Serialize>(&self, obj: &T, protobuf: bool) -> Result<(String, Bytes), Error> {
        let value = serde_json::to_value(obj)
            .map_err(|e| Error::Decode(format!("encoding the request body: {e}")))?;
        if protobuf
            && let (Some(api_version), Some(kind)) =
                (value["apiVersion"].as_str(), value["kind"].as_str())
            && let Ok(bytes) = skerry_api::protobuf::encode(api_version, kind, &value)
        {
            return Ok((PROTOBUF.to_string(), Bytes::from(bytes)));
        }
        json_body(&value)
    }
}

/// HTTP methods for [`Client::request_raw`].
pub mod http_method {
    /// The verbs the apiserver serves.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub enum Method {
        /// GET
        Get,
        /// POST
        Post,
        /// PUT
        Put,
        /// PATCH
        Patch,
        /// DELETE
        Delete,
    }

    impl Method {
        pub(crate) fn as_http(self) -> http::Method {
            match self {
                Method::Get => http::Method::GET,
                Method::Post => http::Method::POST,
                Method::Put => http::Method::PUT,
                Method::Patch => http::Method::PATCH,
                Method::Delete => http::Method::DELETE,
            }
        }
    }
}

/// A typed view on one resource.
pub struct Api<K> {
    client: Client,
    namespace: Option<String>,
    _k: std::marker::PhantomData<fn() -> K>,
}

impl<K> Clone for Api<K> {
    fn clone(&self) -> Self {
        Api {
            client: self.client.clone(),
            namespace: self.namespace.clone(),
            _k: std::marker::PhantomData,
        }
    }
}

/// One page of a LIST.
#[derive(Clone, Debug, Default)]
pub struct ObjectList<K> {
    /// `metadata` of the list: resourceVersion, continue, remainingItemCount.
    pub metadata: ListMeta,
    /// The items.
    pub items: Vec<K>,
}

/// One event of a watch stream.
#[derive(Clone, Debug)]
pub enum WatchEvent<K> {
    /// ADDED
    Added(K),
    /// MODIFIED
    Modified(K),
    /// DELETED (the object's last state)
    Deleted(K),
    /// BOOKMARK: a resource version reached, and its annotations
    /// (`k8s.io/initial-events-end: "true"` ends a WatchList's initial events).
    Bookmark {
        /// The bookmark's resource version.
        resource_version: String,
        /// The bookmark object's annotations.
        annotations: BTreeMap<String, String>,
    },
    /// ERROR: an in-stream Status (410 Expired when the start version was compacted).
    Error(Box<Status>),
}

/// A watch stream: events until the server ends it (timeout) or the connection fails.
pub type WatchStream<K> = BoxStream<'static, Result<WatchEvent<K>, Error>>;

/// Query parameters of a LIST.
#[derive(Clone, Debug, Default)]
pub struct ListParams {
    /// `labelSelector`
    pub label_selector: Option<String>,
    /// `fieldSelector`
    pub field_selector: Option<String>,
    /// `limit` (a page size); `None` or 0 asks for everything.
    pub limit: Option<u32>,
    /// `continue`
    pub continue_token: Option<String>,
    /// `resourceVersion` (`"0"`: any, from the cache).
    pub resource_version: Option<String>,
    /// `resourceVersionMatch` (`NotOlderThan`, `Exact`).
    pub resource_version_match: Option<String>,
    /// `timeoutSeconds`
    pub timeout_seconds: Option<u32>,
}

/// Query parameters of a WATCH.
#[derive(Clone, Debug, Default)]
pub struct WatchParams {
    /// `labelSelector`
    pub label_selector: Option<String>,
    /// `fieldSelector`
    pub field_selector: Option<String>,
    /// `resourceVersion` to start after.
    pub resource_version: Option<String>,
    /// `resourceVersionMatch` (WatchList sends `NotOlderThan`).
    pub resource_version_match: Option<String>,
    /// `allowWatchBookmarks`
    pub allow_bookmarks: bool,
    /// `sendInitialEvents` (WatchList)
    pub send_initial_events: Option<bool>,
    /// `timeoutSeconds`
    pub timeout_seconds: Option<u32>,
}

/// Parameters of create and update.
#[derive(Clone, Debug, Default)]
pub struct PostParams {
    /// `dryRun=All`
    pub dry_run: bool,
    /// `fieldManager`
    pub field_manager: Option<String>,
}

/// Parameters of a PATCH.
#[derive(Clone, Debug, Default)]
pub struct PatchParams {
    /// `fieldManager` (required for server-side apply).
    pub field_manager: Option<String>,
    /// `force` (server-side apply).
    pub force: bool,
    /// `dryRun=All`
    pub dry_run: bool,
}

/// A patch body and its content type.
#[derive(Clone, Debug)]
pub enum Patch {
    /// `application/json-patch+json`
    Json(Value),
    /// `application/merge-patch+json`
    Merge(Value),
    /// `application/strategic-merge-patch+json`
    Strategic(Value),
    /// `application/apply-patch+yaml` (sent as JSON)
    Apply(Value),
}

impl Patch {
    /// The patch's media type.
    pub fn content_type(&self) -> &'static str {
        match self {
            Patch::Json(_) => "application/json-patch+json",
            Patch::Merge(_) => "application/merge-patch+json",
            Patch::Strategic(_) => "application/strategic-merge-patch+json",
            Patch::Apply(_) => "application/apply-patch+yaml",
        }
    }

    fn body(&self) -> Result<(String, Bytes), Error> {
        let (Patch::Json(v) | Patch::Merge(v) | Patch::Strategic(v) | Patch::Apply(v)) = self;
        let bytes =
            serde_json::to_vec(v).map_err(|e| Error::Decode(format!("encoding the patch: {e}")))?;
        Ok((self.content_type().to_string(), Bytes::from(bytes)))
    }
}

/// Parameters of a DELETE (sent as a `DeleteOptions` body).
#[derive(Clone, Debug, Default, Serialize)]
pub struct DeleteParams {
    /// `propagationPolicy`: `Orphan`, `Background` or `Foreground`.
    pub propagation_policy: Option<String>,
    /// `gracePeriodSeconds`
    pub grace_period_seconds: Option<i64>,
    /// `preconditions.uid`
    pub precondition_uid: Option<String>,
    /// `preconditions.resourceVersion`
    pub precondition_resource_version: Option<String>,
    /// `dryRun=All`
    pub dry_run: bool,
}

impl DeleteParams {
    /// Foreground deletion: dependents first, then the owner.
    pub fn foreground() -> DeleteParams {
        DeleteParams {
            propagation_policy: Some("Foreground".to_string()),
            ..DeleteParams::default()
        }
    }
    /// Background deletion: the owner now, dependents by the garbage collector.
    pub fn background() -> DeleteParams {
        DeleteParams {
            propagation_policy: Some("Background".to_string()),
            ..DeleteParams::default()
        }
    }
    /// Orphan the dependents.
    pub fn orphan() -> DeleteParams {
        DeleteParams {
            propagation_policy: Some("Orphan".to_string()),
            ..DeleteParams::default()
        }
    }

    /// The `meta/v1` `DeleteOptions` this sends.
    pub fn to_delete_options(&self) -> Value {
        let mut options = json!({"kind": "DeleteOptions", "apiVersion": "v1"});
        if let Some(p) = &self.propagation_policy {
            options["propagationPolicy"] = json!(p);
        }
        if let Some(g) = self.grace_period_seconds {
            options["gracePeriodSeconds"] = json!(g);
        }
        let mut preconditions = serde_json::Map::new();
        if let Some(uid) = &self.precondition_uid {
            preconditions.insert("uid".to_string(), json!(uid));
        }
        if let Some(rv) = &self.precondition_resource_version {
            preconditions.insert("resourceVersion".to_string(), json!(rv));
        }
        if !preconditions.is_empty() {
            options["preconditions"] = Value::Object(preconditions);
        }
        if self.dry_run {
            options["dryRun"] = json!(["All"]);
        }
        options
    }
}

impl<K: Object + k8s_openapi::Resource> Api<K> {
    /// The client behind this view.
    pub fn client(&self) -> &Client {
        &self.client
    }
    /// The namespace of this view (`None`: all, or cluster-scoped).
    pub fn namespace(&self) -> Option<&str> {
        self.namespace.as_deref()
    }

    /// Whether requests of this view speak protobuf: the client asks for it and `K` has a
    /// protobuf schema (custom resources have none; Kubernetes serves them JSON only).
    fn protobuf(&self) -> bool {
        self.client.inner.content_type == ContentType::Protobuf
            && skerry_api::schema::definition_for_kind(K::API_VERSION, K::KIND).is_some()
    }

    fn accept(&self) -> &'static str {
        if self.protobuf() {
            ACCEPT_PROTOBUF
        } else {
            JSON
        }
    }

    fn collection(&self) -> String {
        ApiResource::of::<K>().collection_path(self.namespace.as_deref())
    }

    fn object_path(&self, name: &str, subresource: Option<&str>) -> String {
        object_path(&self.collection(), name, subresource)
    }

    /// GET one object.
    pub async fn get(&self, name: &str) -> Result<K, Error> {
        let path = self.object_path(name, None);
        self.client
            .call_typed(http_method::Method::Get, &path, None, self.accept())
            .await
    }
    /// GET one object, `None` on 404.
    pub async fn get_opt(&self, name: &str) -> Result<Option<K>, Error> {
        match self.get(name).await {
            Ok(k) => Ok(Some(k)),
            Err(e) if e.is_not_found() => Ok(None),
            Err(e) => Err(e),
        }
    }
    /// LIST (one page when `limit` is set).
    pub async fn list(&self, params: &ListParams) -> Result<ObjectList<K>, Error> {
        let path = with_query(&self.collection(), &list_query(params));
        let list: WireList<K> = self
            .client
            .call_typed(http_method::Method::Get, &path, None, self.accept())
            .await?;
        Ok(list.into())
    }
    /// WATCH.
    pub async fn watch(&self, params: &WatchParams) -> Result<WatchStream<K>, Error> {
        let path = with_query(&self.collection(), &watch_query(params));
        let accept = if self.protobuf() {
            ACCEPT_PROTOBUF_WATCH
        } else {
            JSON
        };
        let raw = self.client.watch_raw(&path, accept).await?;
        Ok(raw
            .map(|event| event.and_then(|e| e.typed(serde_json::from_value::<K>)))
            .boxed())
    }
    /// POST.
    pub async fn create(&self, params: &PostParams, obj: &K) -> Result<K, Error> {
        let path = with_query(&self.collection(), &post_query(params));
        let body = self.client.body_of(obj, self.protobuf())?;
        self.client
            .call_typed(http_method::Method::Post, &path, Some(body), self.accept())
            .await
    }
    /// PUT (409 on a stale resourceVersion).
    pub async fn replace(&self, name: &str, params: &PostParams, obj: &K) -> Result<K, Error> {
        let path = with_query(&self.object_path(name, None), &post_query(params));
        let body = self.client.body_of(obj, self.protobuf())?;
        self.client
            .call_typed(http_method::Method::Put, &path, Some(body), self.accept())
            .await
    }
    /// PUT on the status subresource.
    pub async fn replace_status(
        &self,
        name: &str,
        params: &PostParams,
        obj: &K,
    ) -> Result<K, Error> {
        let path = with_query(&self.object_path(name, Some("status")), &post_query(params));
        let body = self.client.body_of(obj, self.protobuf())?;
        self.client
            .call_typed(http_method::Method::Put, &path, Some(body), self.accept())
            .await
    }
    /// PATCH.
    pub async fn patch(&self, name: &str, params: &PatchParams, patch: &Patch) -> Result<K, Error> {
        let path = with_query(&self.object_path(name, None), &patch_query(params));
        self.client
            .call_typed(
                http_method::Method::Patch,
                &path,
                Some(patch.body()?),
                self.accept(),
            )
            .await
    }
    /// PATCH on the status subresource.
    pub async fn patch_status(
        &self,
        name: &str,
        params: &PatchParams,
        patch: &Patch,
    ) -> Result<K, Error> {
        let path = with_query(
            &self.object_path(name, Some("status")),
            &patch_query(params),
        );
        self.client
            .call_typed(
                http_method::Method::Patch,
                &path,
                Some(patch.body()?),
                self.accept(),
            )
            .await
    }
    /// DELETE. Returns the object when the server answers with it (it still has finalizers
    /// or a grace period), `None` when it answered with a Status (gone at once).
    pub async fn delete(&self, name: &str, params: &DeleteParams) -> Result<Option<K>, Error> {
        let path = self.object_path(name, None);
        let body = json_body(&params.to_delete_options())?;
        let value: Value = self
            .client
            .call_typed(
                http_method::Method::Delete,
                &path,
                Some(body),
                self.accept(),
            )
            .await?;
        if value["kind"] == "Status" {
            return Ok(None);
        }
        serde_json::from_value(value)
            .map(Some)
            .map_err(|e| Error::Decode(format!("a deleted {}: {e}", K::KIND)))
    }
    /// A subresource GET/PUT/POST/PATCH with a JSON body (`scale`, `binding`, `eviction`, ...).
    /// A PATCH body is sent as a merge patch.
    pub async fn subresource(
        &self,
        method: http_method::Method,
        name: &str,
        subresource: &str,
        body: Option<&Value>,
    ) -> Result<Value, Error> {
        let path = self.object_path(name, Some(subresource));
        let body = match body {
            Some(value) if method == http_method::Method::Patch => {
                Some(Patch::Merge(value.clone()).body()?)
            }
            Some(value) => Some(json_body(value)?),
            None => None,
        };
        self.client.call_typed(method, &path, body, JSON).await
    }
}

/// The metadata-only view on a resource named at run time.
#[derive(Clone)]
pub struct MetadataApi {
    client: Client,
    resource: ApiResource,
    namespace: Option<String>,
}

impl MetadataApi {
    /// The resource of this view.
    pub fn resource(&self) -> &ApiResource {
        &self.resource
    }
    fn collection(&self) -> String {
        self.resource.collection_path(self.namespace.as_deref())
    }
    /// The server answers `PartialObjectMetadata` as the type; the object's own type is
    /// what callers need (an ownerReference names it), so it is put back.
    fn own_type(&self, mut meta: PartialObjectMetadata) -> PartialObjectMetadata {
        if meta.kind.is_empty() || meta.kind == "PartialObjectMetadata" {
            meta.kind = self.resource.kind.clone();
            meta.api_version = self.resource.api_version();
        }
        meta
    }
    /// GET the metadata of one object.
    pub async fn get(&self, name: &str) -> Result<PartialObjectMetadata, Error> {
        let path = object_path(&self.collection(), name, None);
        let meta = self
            .client
            .call_typed(http_method::Method::Get, &path, None, ACCEPT_METADATA)
            .await?;
        Ok(self.own_type(meta))
    }
    /// LIST metadata.
    pub async fn list(
        &self,
        params: &ListParams,
    ) -> Result<ObjectList<PartialObjectMetadata>, Error> {
        let path = with_query(&self.collection(), &list_query(params));
        let list: WireList<PartialObjectMetadata> = self
            .client
            .call_typed(http_method::Method::Get, &path, None, ACCEPT_METADATA_LIST)
            .await?;
        let mut list: ObjectList<PartialObjectMetadata> = list.into();
        list.items = list.items.into_iter().map(|m| self.own_type(m)).collect();
        Ok(list)
    }
    /// WATCH metadata.
    pub async fn watch(
        &self,
        params: &WatchParams,
    ) -> Result<WatchStream<PartialObjectMetadata>, Error> {
        let path = with_query(&self.collection(), &watch_query(params));
        let raw = self.client.watch_raw(&path, ACCEPT_METADATA).await?;
        let this = self.clone();
        Ok(raw
            .map(move |event| {
                event.and_then(|e| {
                    e.typed(|v| {
                        serde_json::from_value::<PartialObjectMetadata>(v).map(|m| this.own_type(m))
                    })
                })
            })
            .boxed())
    }
    /// PATCH (e.g. removing a finalizer, or an ownerReference); returns the new metadata.
    pub async fn patch(
        &self,
        name: &str,
        params: &PatchParams,
        patch: &Patch,
    ) -> Result<PartialObjectMetadata, Error> {
        let path = with_query(
            &object_path(&self.collection(), name, None),
            &patch_query(params),
        );
        let meta = self
            .client
            .call_typed(
                http_method::Method::Patch,
                &path,
                Some(patch.body()?),
                ACCEPT_METADATA,
            )
            .await?;
        Ok(self.own_type(meta))
    }
    /// DELETE.
    pub async fn delete(&self, name: &str, params: &DeleteParams) -> Result<(), Error> {
        let path = object_path(&self.collection(), name, None);
        let body = json_body(&params.to_delete_options())?;
        let answer = self
            .client
            .call(
                http_method::Method::Delete,
                &path,
                Some(body),
                ACCEPT_METADATA,
            )
            .await?;
        answer.ok().map(|_| ())
    }
}

// ---------------------------------------------------------------------------------------
// Paths and queries.

/// `collection/name[/subresource]`, the name percent-encoded as one path segment.
fn object_path(collection: &str, name: &str, subresource: Option<&str>) -> String {
    let mut path = format!("{collection}/{}", path_segment(name));
    if let Some(sub) = subresource {
        path.push('/');
        path.push_str(&path_segment(sub));
    }
    path
}

/// Percent-encodes everything but RFC 3986's unreserved characters, so a name can never add
/// a path segment or a query (Kubernetes names cannot hold such characters, but a caller's
/// typo must fail as a 404, not reach another URL).
fn path_segment(segment: &str) -> String {
    let mut out = String::with_capacity(segment.len());
    for byte in segment.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~' | b':') {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

fn with_query(path: &str, query: &[(&str, String)]) -> String {
    if query.is_empty() {
        return path.to_string();
    }
    let mut serializer = form_urlencoded::Serializer::new(String::new());
    for (key, value) in query {
        serializer.append_pair(key, value);
    }
    format!("{path}?{}", serializer.finish())
}

fn push_opt<'a>(query: &mut Vec<(&'a str, String)>, key: &'a str, value: &Option<String>) {
    if let Some(v) = value.as_deref().filter(|v| !v.is_empty()) {
        query.push((key, v.to_string()));
    }
}

fn list_query(p: &ListParams) -> Vec<(&'static str, String)> {
    let mut q = Vec::new();
    push_opt(&mut q, "labelSelector", &p.label_selector);
    push_opt(&mut q, "fieldSelector", &p.field_selector);
    if let Some(limit) = p.limit.filter(|l| *l > 0) {
        q.push(("limit", limit.to_string()));
    }
    push_opt(&mut q, "continue", &p.continue_token);
    push_opt(&mut q, "resourceVersion", &p.resource_version);
    push_opt(&mut q, "resourceVersionMatch", &p.resource_version_match);
    if let Some(t) = p.timeout_seconds {
        q.push(("timeoutSeconds", t.to_string()));
    }
    q
}

fn watch_query(p: &WatchParams) -> Vec<(&'static str, String)> {
    let mut q = vec![("watch", "true".to_string())];
    push_opt(&mut q, "labelSelector", &p.label_selector);
    push_opt(&mut q, "fieldSelector", &p.field_selector);
    push_opt(&mut q, "resourceVersion", &p.resource_version);
    push_opt(&mut q, "resourceVersionMatch", &p.resource_version_match);
    if p.allow_bookmarks {
        q.push(("allowWatchBookmarks", "true".to_string()));
    }
    if let Some(send) = p.send_initial_events {
        q.push(("sendInitialEvents", send.to_string()));
    }
    if let Some(t) = p.timeout_seconds {
        q.push(("timeoutSeconds", t.to_string()));
    }
    q
}

fn post_query(p: &PostParams) -> Vec<(&'static str, String)> {
    let mut q = Vec::new();
    if p.dry_run {
        q.push(("dryRun", "All".to_string()));
    }
    push_opt(&mut q, "fieldManager", &p.field_manager);
    q
}

fn patch_query(p: &PatchParams) -> Vec<(&'static str, String)> {
    let mut q = Vec::new();
    if p.dry_run {
        q.push(("dryRun", "All".to_string()));
    }
    push_opt(&mut q, "fieldManager", &p.field_manager);
    if p.force {
        q.push(("force", "true".to_string()));
    }
    q
}

fn json_body(value: &Value) -> Result<(String, Bytes), Error> {
    let bytes = serde_json::to_vec(value)
        .map_err(|e| Error::Decode(format!("encoding the request body: {e}")))?;
    Ok((JSON.to_string(), Bytes::from(bytes)))
}

// ---------------------------------------------------------------------------------------
// Answers.

/// A whole response.
struct Answer {
    code: u16,
    content_type: String,
    body: Bytes,
    /// Set when the answer is a 429 or 5xx with a valid `Retry-After` (capped at
    /// [`RETRY_AFTER_MAX`]): the server did not process the request and asks for it again.
    retry_after: Option<Duration>,
}

impl Answer {
    /// The answer if 2xx, else its [`Error::Api`].
    fn ok(self) -> Result<Answer, Error> {
        if (200..300).contains(&self.code) {
            Ok(self)
        } else {
            Err(self.into_error())
        }
    }

    /// The body as `T`, from JSON or protobuf as the `Content-Type` says.
    fn decode<T: DeserializeOwned>(&self) -> Result<T, Error> {
        let value = if self.content_type.starts_with(PROTOBUF) {
            let (type_meta, mut value) = skerry_api::protobuf::decode(&self.body)
                .map_err(|e| Error::Decode(format!("protobuf body: {e}")))?;
            restore_type_meta(&mut value, &type_meta.api_version, &type_meta.kind);
            value
        } else {
            serde_json::from_slice::<Value>(&self.body)
                .map_err(|e| Error::Decode(format!("JSON body: {e}")))?
        };
        serde_json::from_value(value).map_err(|e| {
            Error::Decode(format!(
                "the body is not a {}: {e}",
                std::any::type_name::<T>()
            ))
        })
    }

    /// The [`Error::Api`] of a non-2xx answer: the server's `Status`, or one synthesized from
    /// the HTTP code (client-go's `NewGenericServerResponse`).
    fn into_error(self) -> Error {
        let status = self
            .decode::<Value>()
            .ok()
            .filter(|v| v["kind"] == "Status")
            .and_then(|v| serde_json::from_value::<Status>(v).ok());
        let mut status = status.unwrap_or_else(|| {
            let quote = String::from_utf8_lossy(
                &self.body[..self.body.len().min(ERROR_BODY_QUOTE_BYTES_MAX)],
            );
            Status {
                status: Some("Failure".to_string()),
                code: Some(i32::from(self.code)),
                reason: Some(reason_for_code(self.code).to_string()),
                message: Some(format!(
                    "the server answered {} ({}): {}",
                    self.code,
                    reason_for_code(self.code),
                    quote.trim()
                )),
                ..Status::default()
            }
        });
        if status.code.is_none_or(|c| c == 0) {
            status.code = Some(i32::from(self.code));
        }
        Error::Api(Box::new(status))
    }
}

/// Reads a whole response, at most [`RESPONSE_BYTES_MAX`].
async fn read_answer(response: http::Response<Incoming>, path: &str) -> Result<Answer, Error> {
    let code = response.status().as_u16();
    let content_type = content_type_of(response.headers()).to_string();
    let retry_after = retry_after(code, response.headers());
    let body = Limited::new(response.into_body(), RESPONSE_BYTES_MAX)
        .collect()
        .await
        .map_err(|e| Error::Transport(format!("reading the answer to {path}: {e}")))?
        .to_bytes();
    Ok(Answer {
        code,
        content_type,
        body,
        retry_after,
    })
}

/// client-go's `checkWait`: a 429 or 5xx with `Retry-After: <seconds>` asks for a retry after
/// that long (capped at [`RETRY_AFTER_MAX`]). Other codes, a missing header, or one that is not
/// a non-negative integer (the HTTP-date form included, as client-go) ask for nothing.
fn retry_after(code: u16, headers: &http::HeaderMap) -> Option<Duration> {
    if code != 429 && !(500..=599).contains(&code) {
        return None;
    }
    let seconds: u64 = headers
        .get(http::header::RETRY_AFTER)?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()?;
    Some(Duration::from_secs(seconds).min(RETRY_AFTER_MAX))
}

fn content_type_of(headers: &http::HeaderMap) -> &str {
    headers
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
}

/// Protobuf items and objects carry their type in the envelope, not in the object; put it
/// back where the JSON form has it.
fn restore_type_meta(value: &mut Value, api_version: &str, kind: &str) {
    if let Some(object) = value.as_object_mut() {
        if !api_version.is_empty() && !object.contains_key("apiVersion") {
            object.insert("apiVersion".to_string(), json!(api_version));
        }
        if !kind.is_empty() && !object.contains_key("kind") {
            object.insert("kind".to_string(), json!(kind));
        }
    }
}

/// The `StatusReason` client-go gives an HTTP code when the body is not a Status.
fn reason_for_code(code: u16) -> &'static str {
    match code {
        400 => "BadRequest",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "NotFound",
        405 => "MethodNotAllowed",
        406 => "NotAcceptable",
        409 => "Conflict",
        410 => "Gone",
        413 => "RequestEntityTooLarge",
        415 => "UnsupportedMediaType",
        422 => "Invalid",
        429 => "TooManyRequests",
        500 => "InternalError",
        503 => "ServiceUnavailable",
        504 => "Timeout",
        _ => "Unknown",
    }
}

/// A list as it comes over the wire (`items` may be `null`, as Go writes an empty slice).
#[derive(serde::Deserialize)]
struct WireList<K> {
    #[serde(default)]
    metadata: ListMeta,
    #[serde(default = "Option::default")]
    items: Option<Vec<K>>,
}

impl<K> From<WireList<K>> for ObjectList<K> {
    fn from(list: WireList<K>) -> Self {
        ObjectList {
            metadata: list.metadata,
            items: list.items.unwrap_or_default(),
        }
    }
}

/// An error and its causes, outermost first (hyper's own message alone says "client error
/// (Connect)"; the cause — an unknown CA, a refused connection — is further down).
fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        out.push_str(": ");
        out.push_str(&cause.to_string());
        source = cause.source();
    }
    out
}

// ---------------------------------------------------------------------------------------
// Watch streams.

/// How a watch body is cut into events.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Framing {
    /// One JSON `{"type": ..., "object": ...}` per line.
    Json,
    /// A 4-byte big-endian length, then a `metav1.WatchEvent` message.
    Protobuf,
}

/// One event before its object is typed.
#[derive(Debug)]
struct RawEvent {
    event_type: String,
    object: Value,
}

type RawWatch = BoxStream<'static, Result<RawEvent, Error>>;

impl RawEvent {
    /// The typed event, with `decode` turning an object into `K`.
    fn typed<K>(
        self,
        decode: impl FnOnce(Value) -> Result<K, serde_json::Error>,
    ) -> Result<WatchEvent<K>, Error> {
        let wrap = |e: serde_json::Error| {
            Error::Decode(format!("the object of a {} event: {e}", self.event_type))
        };
        match self.event_type.as_str() {
            "ADDED" => decode(self.object).map(WatchEvent::Added).map_err(wrap),
            "MODIFIED" => decode(self.object).map(WatchEvent::Modified).map_err(wrap),
            "DELETED" => decode(self.object).map(WatchEvent::Deleted).map_err(wrap),
            "BOOKMARK" => {
                let meta = &self.object["metadata"];
                let resource_version = meta["resourceVersion"]
                    .as_str()
                    .ok_or_else(|| {
                        Error::Decode("a BOOKMARK without metadata.resourceVersion".to_string())
                    })?
                    .to_string();
                let annotations = meta["annotations"]
                    .as_object()
                    .map(|a| {
                        a.iter()
                            .filter_map(|(k, v)| v.as_str().map(|v| (k.clone(), v.to_string())))
                            .collect()
                    })
                    .unwrap_or_default();
                Ok(WatchEvent::Bookmark {
                    resource_version,
                    annotations,
                })
            }
            "ERROR" => serde_json::from_value::<Status>(self.object)
                .map(|s| WatchEvent::Error(Box::new(s)))
                .map_err(|e| Error::Decode(format!("the Status of an ERROR event: {e}"))),
            other => Err(Error::Decode(format!("unknown watch event type {other:?}"))),
        }
    }
}

/// The state of a watch body being cut into events.
struct Framer {
    body: Incoming,
    framing: Framing,
    buffer: BytesMut,
    /// Bytes of `buffer` already searched for a newline (JSON), so a long line is scanned
    /// once, not once per chunk.
    scanned: usize,
    done: bool,
}

/// The events of a watch body, ending after the first error.
fn raw_events(body: Incoming, framing: Framing) -> RawWatch {
    let framer = Framer {
        body,
        framing,
        buffer: BytesMut::new(),
        scanned: 0,
        done: false,
    };
    futures::stream::unfold(framer, |mut framer| async move {
        if framer.done {
            return None;
        }
        let next = framer.next_event().await;
        match next {
            Ok(Some(event)) => Some((Ok(event), framer)),
            Ok(None) => None,
            Err(e) => {
                framer.done = true;
                Some((Err(e), framer))
            }
        }
    })
    .boxed()
}

impl Framer {
    async fn next_event(&mut self) -> Result<Option<RawEvent>, Error> {
        loop {
            if let Some(event) = self.split_event()? {
                return Ok(Some(event));
            }
            match self.body.frame().await {
                Some(Ok(frame)) => {
                    if let Ok(data) = frame.into_data() {
                        self.buffer.extend_from_slice(&data);
                    }
                }
                Some(Err(e)) => {
                    return Err(Error::Transport(format!("watch stream: {}", chain(&e))));
                }
                None => {
                    if self.buffer.iter().all(u8::is_ascii_whitespace) {
                        return Ok(None);
                    }
                    return Err(Error::Decode(format!(
                        "watch stream ended inside an event ({} bytes pending)",
                        self.buffer.len()
                    )));
                }
            }
        }
    }

    /// One whole event off the front of the buffer, if it holds one.
    fn split_event(&mut self) -> Result<Option<RawEvent>, Error> {
        match self.framing {
            Framing::Json => loop {
                let Some(at) = self.buffer[self.scanned..].iter().position(|b| *b == b'\n') else {
                    self.scanned = self.buffer.len();
                    return self.check_bound(self.buffer.len()).map(|()| None);
                };
                let line = self.buffer.split_to(self.scanned + at + 1);
                self.scanned = 0;
                if line.iter().all(u8::is_ascii_whitespace) {
                    continue;
                }
                return parse_json_event(&line).map(Some);
            },
            Framing::Protobuf => {
                let Some(prefix) = self.buffer.first_chunk::<4>() else {
                    return Ok(None);
                };
                let len = u32::from_be_bytes(*prefix) as usize;
                self.check_bound(len)?;
                if self.buffer.len() < 4 + len {
                    return Ok(None);
                }
                self.buffer.advance(4);
                let message = self.buffer.split_to(len).freeze();
                parse_protobuf_event(&message).map(Some)
            }
        }
    }

    fn check_bound(&self, len: usize) -> Result<(), Error> {
        if len > WATCH_FRAME_BYTES_MAX {
            return Err(Error::Decode(format!(
                "a watch event of {len} bytes, more than the {WATCH_FRAME_BYTES_MAX} allowed"
            )));
        }
        Ok(())
    }
}

fn parse_json_event(line: &[u8]) -> Result<RawEvent, Error> {
    #[derive(serde::Deserialize)]
    struct Wire {
        #[serde(rename = "type")]
        event_type: String,
        #[serde(default)]
        object: Value,
    }
    let wire: Wire = serde_json::from_slice(line)
        .map_err(|e| Error::Decode(format!("a JSON watch event: {e}")))?;
    Ok(RawEvent {
        event_type: wire.event_type,
        object: wire.object,
    })
}

/// A `metav1.WatchEvent` message: field 1 `type` (string), field 2 `object` (a
/// `RawExtension` whose field 1 `raw` holds the object in the `k8s\0` envelope). Unknown
/// fields are skipped, as gogo-protobuf does.
fn parse_protobuf_event(mut message: &[u8]) -> Result<RawEvent, Error> {
    let mut event_type = None;
    let mut raw: &[u8] = &[];
    while !message.is_empty() {
        let (number, value, rest) = read_field(message)?;
        message = rest;
        match (number, value) {
            (1, Some(text)) => {
                event_type = Some(
                    std::str::from_utf8(text)
                        .map_err(|_| Error::Decode("a watch event type is not UTF-8".to_string()))?
                        .to_string(),
                );
            }
            (2, Some(mut extension)) => {
                while !extension.is_empty() {
                    let (number, value, rest) = read_field(extension)?;
                    extension = rest;
                    if let (1, Some(bytes)) = (number, value) {
                        raw = bytes;
                    }
                }
            }
            _ => {}
        }
    }
    let event_type =
        event_type.ok_or_else(|| Error::Decode("a protobuf watch event without a type".into()))?;
    let (type_meta, mut object) = skerry_api::protobuf::decode(raw)
        .map_err(|e| Error::Decode(format!("the object of a {event_type} event: {e}")))?;
    restore_type_meta(&mut object, &type_meta.api_version, &type_meta.kind);
    Ok(RawEvent { event_type, object })
}

/// One protobuf field: its number, its bytes if length-delimited (`None` for a skipped
/// scalar), and what follows.
type Field<'a> = (u64, Option<&'a [u8]>, &'a [u8]);

/// The first field of `input`.
fn read_field(input: &[u8]) -> Result<Field<'_>, Error> {
    let malformed = |what: &str| Error::Decode(format!("a malformed protobuf watch event: {what}"));
    let (key, rest) = read_varint(input).ok_or_else(|| malformed("bad key"))?;
    let number = key >> 3;
    match key & 7 {
        0 => {
            let (_, rest) = read_varint(rest).ok_or_else(|| malformed("bad varint"))?;
            Ok((number, None, rest))
        }
        1 => rest
            .get(8..)
            .map(|rest| (number, None, rest))
            .ok_or_else(|| malformed("truncated fixed64")),
        2 => {
            let (len, rest) = read_varint(rest).ok_or_else(|| malformed("bad length"))?;
            let len = usize::try_from(len).map_err(|_| malformed("length overflows"))?;
            if len > rest.len() {
                return Err(malformed("length past the end"));
            }
            let (value, rest) = rest.split_at(len);
            Ok((number, Some(value), rest))
        }
        5 => rest
            .get(4..)
            .map(|rest| (number, None, rest))
            .ok_or_else(|| malformed("truncated fixed32")),
        _ => Err(malformed("unsupported wire type")),
    }
}

/// A varint of at most 10 bytes (64 bits at 7 a byte).
fn read_varint(input: &[u8]) -> Option<(u64, &[u8])> {
    /// The longest varint: 64 bits at 7 per byte.
    const VARINT_BYTES_MAX: usize = 10;
    let mut value = 0u64;
    for (i, byte) in input.iter().take(VARINT_BYTES_MAX).enumerate() {
        value |= u64::from(byte & 0x7f) << (7 * i);
        if byte & 0x80 == 0 {
            return Some((value, &input[i + 1..]));
        }
    }
    None
}

// ---------------------------------------------------------------------------------------
// Transport: TLS configuration and the connector.

/// The rustls configuration of `config` (`skerry_tls`'s client builders): its CA as the only
/// root (or no verification when `insecure`), its client certificate if any, ALPN `h2` then
/// `http/1.1`.
fn tls_config(config: &Config) -> Result<rustls::ClientConfig, Error> {
    use skerry_tls::config::{self as tls, ConfigError};
    let refused = |e: ConfigError| {
        Error::Config(match e {
            ConfigError::TrustAnchor(e) => format!("CA certificate: {e}"),
            ConfigError::CertificateAndKey(e) => format!("client certificate and key: {e}"),
            e => e.to_string(),
        })
    };
    let identity = match &config.credentials {
        Credentials::ClientCert { cert_pem, key_pem } => {
            let chain = tls::certs_from_pem(cert_pem.as_bytes())
                .map_err(|e| Error::Config(format!("client certificate PEM: {e}")))?;
            if chain.is_empty() {
                return Err(Error::Config(
                    "the client certificate PEM holds no certificate".to_string(),
                ));
            }
            let key = tls::key_from_pem(key_pem.as_bytes())
                .map_err(|e| Error::Config(format!("client key PEM: {e}")))?;
            Some((chain, key))
        }
        _ => None,
    };
    if config.insecure {
        return tls::insecure_client_config(identity, &ALPN_PROTOCOLS).map_err(refused);
    }
    let ca_pem = config.ca_pem.as_deref().ok_or_else(|| {
        Error::Config(
            "an https server needs a CA certificate (certificate-authority-data) or insecure-skip-tls-verify"
                .to_string(),
        )
    })?;
    let cas = tls::certs_from_pem(ca_pem.as_bytes())
        .map_err(|e| Error::Config(format!("CA certificate PEM: {e}")))?;
    if cas.is_empty() {
        return Err(Error::Config("the CA PEM holds no certificate".to_string()));
    }
    let roots = tls::roots(cas).map_err(refused)?;
    tls::client_config(Arc::new(roots), identity, &ALPN_PROTOCOLS).map_err(refused)
}

/// Opens connections for hyper's pool: TCP, then TLS with the configured server name.
#[derive(Clone)]
struct Connector {
    /// The TLS connector and the name the serving certificate must carry; `None` for http.
    tls: Option<Arc<(TlsConnector, ServerName<'static>)>>,
}

impl tower_service::Service<Uri> for Connector {
    type Response = TokioIo<Stream>;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, io::Error>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), io::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let tls = self.tls.clone();
        Box::pin(async move {
            let host = uri
                .host()
                .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "URL without a host"))?
                .trim_start_matches('[')
                .trim_end_matches(']')
                .to_string();
            let port = uri
                .port_u16()
                .unwrap_or(if tls.is_some() { 443 } else { 80 });
            let connect = async {
                let tcp = TcpStream::connect((host.as_str(), port)).await?;
                // Requests are small and latency-bound; do not wait to coalesce them.
                tcp.set_nodelay(true)?;
                match &tls {
                    None => Ok::<_, io::Error>(Stream::Plain(tcp)),
                    Some(tls) => {
                        let (connector, name) = &**tls;
                        let stream = connector.connect(name.clone(), tcp).await?;
                        Ok(Stream::Tls(Box::new(stream)))
                    }
                }
            };
            let stream = tokio::time::timeout(CONNECT_TIMEOUT, connect)
                .await
                .map_err(|_| {
                    io::Error::new(
                        io::ErrorKind::TimedOut,
                        format!("connecting to {host}:{port} took over {CONNECT_TIMEOUT:?}"),
                    )
                })??;
            Ok(TokioIo::new(stream))
        })
    }
}

/// A connection, plain or TLS.
enum Stream {
    Plain(TcpStream),
    Tls(Box<TlsStream<TcpStream>>),
}

impl Connection for Stream {
    fn connected(&self) -> Connected {
        match self {
            Stream::Tls(tls) if tls.get_ref().1.alpn_protocol() == Some(b"h2") => {
                Connected::new().negotiated_h2()
            }
            _ => Connected::new(),
        }
    }
}

impl AsyncRead for Stream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Stream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Stream::Plain(s) => s.is_write_vectored(),
            Stream::Tls(s) => s.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_flush(cx),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "a test panics to fail")]
mod tests {
    use super::*;

    #[test]
    fn queries_are_form_urlencoded() {
        let q = list_query(&ListParams {
            label_selector: Some("app in (a,b),tier!=x".into()),
            limit: Some(5),
            continue_token: Some("abc+/=".into()),
            ..ListParams::default()
        });
        assert_eq!(
            with_query("/api/v1/pods", &q),
            "/api/v1/pods?labelSelector=app+in+%28a%2Cb%29%2Ctier%21%3Dx&limit=5&continue=abc%2B%2F%3D"
        );
        let w = watch_query(&WatchParams {
            resource_version: Some("12".into()),
            allow_bookmarks: true,
            send_initial_events: Some(true),
            resource_version_match: Some("NotOlderThan".into()),
            ..WatchParams::default()
        });
        assert_eq!(
            with_query("/p", &w),
            "/p?watch=true&resourceVersion=12&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true&sendInitialEvents=true"
        );
        assert_eq!(with_query("/p", &list_query(&ListParams::default())), "/p");
        assert_eq!(
            object_path("/c", "a/b?c", Some("status")),
            "/c/a%2Fb%3Fc/status"
        );
    }

    #[test]
    fn delete_options_body() {
        let params = DeleteParams {
            propagation_policy: Some("Foreground".into()),
            grace_period_seconds: Some(0),
            precondition_uid: Some("u".into()),
            precondition_resource_version: Some("7".into()),
            dry_run: true,
        };
        assert_eq!(
            params.to_delete_options(),
            json!({"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": "Foreground",
                   "gracePeriodSeconds": 0, "preconditions": {"uid": "u", "resourceVersion": "7"},
                   "dryRun": ["All"]})
        );
        assert_eq!(
            DeleteParams::default().to_delete_options(),
            json!({"kind": "DeleteOptions", "apiVersion": "v1"})
        );
    }

    #[test]
    fn retry_after_is_read_as_client_go_reads_it() {
        let headers = |value: &str| {
            let mut headers = http::HeaderMap::new();
            headers.insert(
                http::header::RETRY_AFTER,
                http::HeaderValue::from_str(value).unwrap(),
            );
            headers
        };
        assert_eq!(
            retry_after(429, &headers("1")),
            Some(Duration::from_secs(1))
        );
        assert_eq!(retry_after(503, &headers(" 0 ")), Some(Duration::ZERO));
        assert_eq!(
            retry_after(429, &headers("86400")),
            Some(RETRY_AFTER_MAX),
            "a server cannot park a client for a day"
        );
        assert_eq!(retry_after(409, &headers("1")), None, "only 429 and 5xx");
        assert_eq!(retry_after(500, &http::HeaderMap::new()), None);
        assert_eq!(retry_after(429, &headers("-1")), None);
        assert_eq!(
            retry_after(429, &headers("Wed, 21 Oct 2015 07:28:00 GMT")),
            None,
            "the HTTP-date form is ignored, as client-go ignores it"
        );
    }

    #[test]
    fn non_status_errors_are_synthesized() {
        let answer = Answer {
            code: 503,
            content_type: "text/html".into(),
            body: Bytes::from_static(b"<h1>upstream down</h1>"),
            retry_after: None,
        };
        let e = answer.into_error();
        assert!(e.is_retryable());
        let Error::Api(status) = e else {
            panic!("not an API error")
        };
        assert_eq!(status.code, Some(503));
        assert_eq!(status.reason.as_deref(), Some("ServiceUnavailable"));
        assert!(status.message.unwrap_or_default().contains("upstream down"));
        let gone = Answer {
            code: 410,
            content_type: JSON.into(),
            body: Bytes::from_static(
                br#"{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"Expired","code":410,"message":"too old"}"#,
            ),
            retry_after: None,
        };
        assert!(gone.into_error().is_gone());
    }

    #[test]
    fn protobuf_watch_events_decode() {
        // A WatchEvent as the apiserver frames it: type, then RawExtension{raw: envelope}.
        let pod = json!({"apiVersion": "v1", "kind": "Pod",
                         "metadata": {"name": "a", "namespace": "d", "resourceVersion": "5"}});
        let raw = skerry_api::protobuf::encode("v1", "Pod", &pod).unwrap();
        let mut extension = vec![0x0a];
        put_varint(&mut extension, raw.len());
        extension.extend_from_slice(&raw);
        let mut message = vec![0x0a, 5];
        message.extend_from_slice(b"ADDED");
        message.push(0x12);
        put_varint(&mut message, extension.len());
        message.extend_from_slice(&extension);
        let event = parse_protobuf_event(&message).unwrap();
        assert_eq!(event.event_type, "ADDED");
        let typed = event
            .typed(serde_json::from_value::<k8s_openapi::api::core::v1::Pod>)
            .unwrap();
        let WatchEvent::Added(p) = typed else {
            panic!("not ADDED")
        };
        assert_eq!(p.metadata.resource_version.as_deref(), Some("5"));
        assert!(parse_protobuf_event(&message[..message.len() - 1]).is_err());
    }

    fn put_varint(out: &mut Vec<u8>, mut value: usize) {
        while value >= 0x80 {
            out.push((value & 0x7f) as u8 | 0x80);
            value >>= 7;
        }
        out.push(value as u8);
    }

    #[test]
    fn bookmark_and_error_events() {
        let event = parse_json_event(
            br#"{"type":"BOOKMARK","object":{"kind":"Pod","apiVersion":"v1","metadata":{"resourceVersion":"42","annotations":{"k8s.io/initial-events-end":"true"}}}}"#,
        )
        .unwrap();
        let WatchEvent::<PartialObjectMetadata>::Bookmark {
            resource_version,
            annotations,
        } = event.typed(serde_json::from_value).unwrap()
        else {
            panic!("not a bookmark")
        };
        assert_eq!(resource_version, "42");
        assert_eq!(annotations["k8s.io/initial-events-end"], "true");
        let error = parse_json_event(
            br#"{"type":"ERROR","object":{"kind":"Status","apiVersion":"v1","code":410,"reason":"Expired"}}"#,
        )
        .unwrap();
        let WatchEvent::<PartialObjectMetadata>::Error(status) =
            error.typed(serde_json::from_value).unwrap()
        else {
            panic!("not an error")
        };
        assert_eq!(status.code, Some(410));
        assert!(parse_json_event(b"{not json").is_err());
    }

    #[test]
    fn bad_configs_are_config_errors() {
        let bad = |config: Config| match Client::new(config) {
            Err(Error::Config(m)) => m,
            Err(e) => panic!("expected a config error, got {e}"),
            Ok(_) => panic!("expected a config error, got a client"),
        };
        assert!(bad(Config::new("ftp://x")).contains("scheme"));
        assert!(bad(Config::new("not a url")).contains("server URL"));
        assert!(bad(Config::new("https://h:1")).contains("CA certificate"));
        let mut garbage_ca = Config::new("https://h:1");
        garbage_ca.ca_pem = Some("not pem".into());
        assert!(bad(garbage_ca).contains("no certificate"));
        let mut insecure = Config::new("https://h:1");
        insecure.insecure = true;
        insecure.credentials = Credentials::ClientCert {
            cert_pem: "x".into(),
            key_pem: "y".into(),
        };
        assert!(bad(insecure).contains("client"));
    }
}
