//! The request path: authenticate, authorize, route, and run the verb against the registry.
//!
//! One [`ApiServer`] serves every connection. A request is read into a [`RequestInfo`]
//! (Kubernetes' reading of method + path), authenticated from its TLS client certificate or
//! bearer token, authorized by the Node authorizer then RBAC ([`crate::node_authz`]), and
//! then either answered from discovery / health /
//! version, or handed to the verb handlers in [`crate::verbs`]. Every error leaves through
//! [`response::error`] as a `Status`.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::SystemTime;

use bytes::Bytes;
use http::{HeaderMap, Method, Response, header};
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use rustls_pki_types::CertificateDer;
use skerry_api::ApiError;
use skerry_store::Store;
use tracing::Instrument;

use crate::auth::rbac::{self, Attributes, RbacSource};
use crate::auth::{self, Authenticator, UserInfo};
use crate::discovery;
use crate::request::{RequestInfo, parse_query};
use crate::response::{self, Body, Format, IncludeObject};
use crate::watch_cache::WatchCache;

/// The largest request body accepted (Kubernetes' `MaxRequestBodyBytes`, 3 MB): objects are
/// capped at 1.5 MiB by the store, and a patch or an apply of such an object needs headroom.
pub const REQUEST_BODY_BYTES_MAX: usize = 3 * 1024 * 1024;

/// Everything a request needs once it is read.
pub struct Request {
    pub info: RequestInfo,
    pub query: HashMap<String, String>,
    pub headers: HeaderMap,
    pub body: Bytes,
    pub user: UserInfo,
}

impl Request {
    pub fn param(&self, name: &str) -> Option<&str> {
        self.query.get(name).map(String::as_str)
    }

    /// A boolean query parameter, read as Kubernetes' parameter codec reads it (see
    /// [`crate::request::query_bool`]): `None` when absent, never an error.
    pub fn bool_param(&self, name: &str) -> Option<bool> {
        crate::request::query_bool(&self.query, name)
    }

    pub fn content_type(&self) -> &str {
        self.headers
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
    }

    /// The response format the client accepts.
    pub fn format(&self) -> Result<Format, ApiError> {
        let include = IncludeObject::parse(self.param("includeObject"))?;
        response::negotiate(
            self.headers
                .get(header::ACCEPT)
                .and_then(|v| v.to_str().ok()),
            include,
        )
    }

    /// `dryRun=All`: run everything but the write.
    pub fn dry_run(&self) -> Result<bool, ApiError> {
        match self.param("dryRun") {
            None | Some("") => Ok(false),
            Some("All") => Ok(true),
            Some(other) => Err(ApiError::bad_request(format!(
                "dryRun: Unsupported value: {other:?}: supported values: \"All\""
            ))),
        }
    }
}

/// The apiserver's shared state.
pub struct ApiServer {
    pub store: Store,
    /// `host:port` clients reach this server at (discovery's serverAddressByClientCIDRs).
    pub server_address: String,
    pub authenticator: Authenticator,
    /// One watch cache per stored resource, by resource name.
    pub caches: HashMap<&'static str, Arc<WatchCache>>,
    pub rbac: Arc<dyn RbacSource>,
    /// The Node authorizer, before RBAC in every decision ([`ApiServer::authorize_attributes`]).
    pub node_authorizer: crate::node_authz::NodeAuthorizer,
    pub metrics: crate::metrics::Metrics,
    /// Signs and checks service-account tokens (`kubectl create token`).
    pub token_issuer: Option<crate::auth::serviceaccount::TokenIssuer>,
    /// Where Services get their ClusterIPs.
    pub service_cidr: crate::ipalloc::ServiceCidr,
    /// Where NodePort and LoadBalancer Services get their node ports.
    pub node_port_range: crate::portalloc::PortRange,
    /// Leases for Events (their time to live).
    pub event_leases: crate::leases::LeaseManager,
    /// More `/metrics` text from the rest of the process.
    pub extra_metrics: Option<ExtraMetrics>,
    /// How `pods/log` reaches kubelets (`crate::podlogs`); `None`: no kubelet is reached.
    pub kubelet_client: Option<crate::podlogs::KubeletClient>,
    /// Whether the ServiceAccount admission plugin runs (`crate::serviceaccount_admission`).
    pub service_account_admission: bool,
    /// The compactor loop; aborted when the server is dropped.
    compactor: Option<tokio::task::JoinHandle<()>>,
}

impl Drop for ApiServer {
    fn drop(&mut self) {
        if let Some(task) = self.compactor.take() {
            task.abort();
        }
    }
}

/// How an apiserver is set up.
pub struct Config {
    /// `host:port` clients reach this server at.
    pub server_address: String,
    pub authenticator: Authenticator,
    pub token_issuer: Option<crate::auth::serviceaccount::TokenIssuer>,
    /// Time between compaction rounds; `None` runs no compactor (tests).
    pub compaction_interval: Option<std::time::Duration>,
    /// `--service-cluster-ip-range`.
    pub service_cidr: crate::ipalloc::ServiceCidr,
    /// `--service-node-port-range`.
    pub node_port_range: crate::portalloc::PortRange,
    /// More metrics for `/metrics`, in the OpenMetrics text format (the process's other
    /// components: the controllers' workqueues). Called on every scrape.
    pub extra_metrics: Option<ExtraMetrics>,
    /// How `pods/log` reaches kubelets: TLS with the apiserver's kubelet-client certificate.
    pub kubelet_client: Option<crate::podlogs::KubeletClient>,
    /// Runs the ServiceAccount admission plugin. `skerry server` always does; test servers
    /// without a serviceaccount controller leave it off, as upstream's integration tests run
    /// kube-apiserver with `--disable-admission-plugins=ServiceAccount`: no pod could be
    /// created in a namespace nobody gives a `default` ServiceAccount.
    pub service_account_admission: bool,
}

/// A source of more `/metrics` text (OpenMetrics, its own `# EOF` line optional).
pub type ExtraMetrics = Arc<dyn Fn() -> String + Send + Sync>;

impl ApiServer {
    /// Starts one watch cache per stored resource and the compactor. Seed a new cluster's
    /// store first with [`crate::startup::bootstrap`].
    pub fn start(store: Store, config: Config) -> Arc<ApiServer> {
        let mut caches = HashMap::new();
        for resource in skerry_api::catalogue::stored() {
            caches.insert(
                resource.resource,
                WatchCache::start(resource, store.clone()),
            );
        }
        let cache = |name: &str| {
            caches
                .get(name)
                .cloned()
                .expect("RBAC resources are stored and cached")
        };
        let rbac = Arc::new(crate::rbac_cache::CacheRbac::new(
            cache("clusterroles"),
            cache("clusterrolebindings"),
            cache("roles"),
            cache("rolebindings"),
        ));
        let node_authorizer = crate::node_authz::NodeAuthorizer::new(
            caches
                .get("pods")
                .cloned()
                .expect("pods are stored and cached"),
            // Not served yet: the graph then holds no volume, as upstream's with none.
            caches.get("persistentvolumes").cloned(),
        );
        let compactor = config
            .compaction_interval
            .map(|interval| tokio::spawn(crate::compactor::run(store.clone(), interval)));
        Arc::new(ApiServer {
            store,
            server_address: config.server_address,
            authenticator: config.authenticator,
            caches,
            rbac,
            node_authorizer,
            metrics: crate::metrics::Metrics::new(),
            token_issuer: config.token_issuer,
            service_cidr: config.service_cidr,
            node_port_range: config.node_port_range,
            event_leases: crate::leases::LeaseManager::new(crate::leases::EVENT_TTL),
            extra_metrics: config.extra_metrics,
            kubelet_client: config.kubelet_client,
            service_account_admission: config.service_account_admission,
            compactor,
        })
    }
}

/// Whether `name` may stand in a path segment (apimachinery's `IsValidPathSegmentName`):
/// not `.` or `..`, no `/` or `%`.
fn valid_path_segment_name(name: &str) -> bool {
    !matches!(name, "." | "..") && !name.contains(['/', '%'])
}

impl ApiServer {
    /// Serves one HTTP request from a connection whose verified client certificate chain is
    /// `peer_certs` (empty without one).
    pub async fn handle(
        self: Arc<Self>,
        req: hyper::Request<Incoming>,
        peer_certs: Arc<Vec<CertificateDer<'static>>>,
    ) -> Response<Body> {
        let started = std::time::Instant::now();
        let (parts, body) = req.into_parts();
        let path = parts.uri.path().to_string();
        let query = parse_query(parts.uri.query());
        let info = RequestInfo::parse(&parts.method, &path, &query);
        let span = tracing::debug_span!(
            "request",
            verb = %info.verb,
            resource = %info.resource,
            namespace = info.namespace.as_deref().unwrap_or(""),
            name = info.name.as_deref().unwrap_or(""),
        );
        let verb = info.verb.clone();
        let resource_label = info.resource.clone();
        // Watch frames and the OpenAPI documents are never indented (Kubernetes streams the
        // former with its non-pretty stream serializer and serves the latter from kube-openapi);
        // `/version` always is (`responsewriters.WriteRawJSON`).
        // A proxied answer is the kubelet's, passed through as it streams.
        let pretty = path == "/version"
            || (verb != "watch"
                && !path.starts_with("/openapi/")
                && !crate::nodeproxy::handles(&info)
                && response::wants_pretty(
                    query.get("pretty").map(String::as_str),
                    parts
                        .headers
                        .get(header::USER_AGENT)
                        .and_then(|v| v.to_str().ok()),
                ));
        let mut response = self
            .respond(parts, body, path, query, info, peer_certs)
            .instrument(span)
            .await;
        if pretty {
            response = response::prettify(response).await;
        }
        self.metrics.observe_request(
            &verb,
            &resource_label,
            response.status().as_u16(),
            started.elapsed(),
        );
        response
    }

    /// Authenticates, authorizes and routes one request (inside its span).
    async fn respond(
        self: &Arc<Self>,
        parts: http::request::Parts,
        body: Incoming,
        path: String,
        query: HashMap<String, String>,
        info: RequestInfo,
        peer_certs: Arc<Vec<CertificateDer<'static>>>,
    ) -> Response<Body> {
        let authorization = parts
            .headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok());
        let user =
            match self
                .authenticator
                .authenticate(&peer_certs, authorization, SystemTime::now())
            {
                Ok(user) => user,
                Err(e) => {
                    tracing::debug!(error = %e, "authentication failed");
                    return response::error(&ApiError::unauthorized());
                }
            };
        if user.is_anonymous() && !auth::anonymous_allowed(&path) {
            return response::error(&ApiError::unauthorized());
        }
        let user = match self.impersonate(user, &parts.headers) {
            Ok(user) => user,
            Err(e) => return response::error(&e),
        };
        match self.authorize(&info, &user) {
            Err(e) => response::error(&e),
            // exec, attach, port-forward: the connection itself is upgraded and proxied.
            Ok(()) if crate::podexec::handles(&info) => {
                crate::podexec::serve(self, parts, &info, &user)
                    .await
                    .unwrap_or_else(|e| response::error(&e))
            }
            // nodes/proxy: the body and the answer stream through to the node's kubelet.
            Ok(()) if crate::nodeproxy::handles(&info) => {
                crate::nodeproxy::serve(self, parts, body, &info)
                    .await
                    .unwrap_or_else(|e| response::error(&e))
            }
            Ok(()) => {
                let body = if matches!(parts.method, Method::GET | Method::HEAD) {
                    Ok(Bytes::new())
                } else {
                    read_body(body).await
                };
                match body {
                    Err(e) => response::error(&e),
                    Ok(body) => {
                        let request = Request {
                            info,
                            query,
                            headers: parts.headers,
                            body,
                            user,
                        };
                        match self.route(request).await {
                            Ok(r) => r,
                            Err(e) => response::error(&e),
                        }
                    }
                }
            }
        }
    }

    /// Runs one store operation, recording its latency as `etcd_request_duration_seconds`
    /// (Kubernetes' name for the store's latency as the apiserver sees it).
    pub async fn timed<T>(
        &self,
        operation: &str,
        resource: &skerry_api::ResourceInfo,
        operation_future: impl std::future::Future<Output = T>,
    ) -> T {
        let started = std::time::Instant::now();
        let out = operation_future.await;
        self.metrics
            .observe_store(operation, resource.resource, started.elapsed());
        out
    }

    /// Kubernetes' impersonation (`kubectl --as=jane --as-group=devs`): the requester needs
    /// the `impersonate` verb on each `users`/`groups`/`serviceaccounts` it names, and the
    /// request then runs as that user. Without the headers the user is unchanged.
    fn impersonate(&self, requester: UserInfo, headers: &HeaderMap) -> Result<UserInfo, ApiError> {
        let value = |h: &str| {
            headers
                .get(h)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string)
        };
        let groups: Vec<String> = headers
            .get_all("impersonate-group")
            .iter()
            .filter_map(|v| v.to_str().ok().map(str::to_string))
            .collect();
        let Some(name) = value("impersonate-user") else {
            if !groups.is_empty() || value("impersonate-uid").is_some() {
                return Err(ApiError::internal(
                    "requested impersonation of groups or a uid without a user: impersonate a user too",
                ));
            }
            return Ok(requester);
        };
        let mut checks = Vec::new();
        match crate::auth::serviceaccount::split_user_name(&name) {
            Some((namespace, account)) => checks.push(Attributes::resource(
                requester.clone(),
                "impersonate",
                "",
                "serviceaccounts",
                namespace,
                account,
            )),
            None => checks.push(Attributes::resource(
                requester.clone(),
                "impersonate",
                "",
                "users",
                "",
                &name,
            )),
        }
        for g in &groups {
            checks.push(Attributes::resource(
                requester.clone(),
                "impersonate",
                "",
                "groups",
                "",
                g,
            ));
        }
        for attributes in &checks {
            if !self.authorize_attributes(attributes).allowed {
                let what = if attributes.resource == "groups" {
                    "group"
                } else {
                    "user"
                };
                return Err(ApiError::forbidden(format!(
                    "{} {:?} is forbidden: User {:?} cannot impersonate resource {:?} in API group \"\" at the cluster scope",
                    attributes.resource, attributes.name, requester.name, attributes.resource
                ))
                .with_detail_kind(what));
            }
        }
        let mut impersonated = match crate::auth::serviceaccount::split_user_name(&name) {
            Some((namespace, _)) => {
                let mut all = vec![
                    crate::auth::serviceaccount::GROUP_ALL.to_string(),
                    format!(
                        "{}{namespace}",
                        crate::auth::serviceaccount::GROUP_NAMESPACE_PREFIX
                    ),
                ];
                all.extend(groups);
                UserInfo::authenticated(name, "", all)
            }
            None => {
                UserInfo::authenticated(name, value("impersonate-uid").unwrap_or_default(), groups)
            }
        };
        impersonated.extra.clear();
        Ok(impersonated)
    }

    /// The authorizer chain's decision (`system:masters`, Node, RBAC: [`crate::node_authz`]),
    /// for requests, impersonation and the access reviews alike.
    pub fn authorize_attributes(&self, attributes: &Attributes) -> rbac::Decision {
        crate::node_authz::authorize(attributes, &self.node_authorizer, self.rbac.as_ref())
    }

    pub(crate) fn authorize(&self, info: &RequestInfo, user: &UserInfo) -> Result<(), ApiError> {
        // A list or watch pinned to one name by `metadata.name=` is asked as that name
        // (k8s.io/apiserver/pkg/endpoints/request/requestinfo.go), so a node may watch its
        // own Node and RBAC's resourceNames apply.
        let selected_name = info
            .field_selector
            .as_deref()
            .filter(|_| info.name.is_none() && matches!(info.verb.as_str(), "list" | "watch"))
            .and_then(|text| skerry_api::selector::FieldSelector::parse_any(text).ok())
            .and_then(|s| s.exact_name().map(str::to_string))
            .filter(|n| valid_path_segment_name(n));
        let name = info.name.clone().or(selected_name);
        let attributes = if info.resource_request {
            let mut a = Attributes::resource(
                user.clone(),
                &info.verb,
                &info.group,
                &info.resource,
                info.namespace.as_deref().unwrap_or(""),
                name.as_deref().unwrap_or(""),
            )
            .with_field_selector(info.field_selector.as_deref());
            if let Some(sub) = &info.subresource {
                a = a.with_subresource(sub);
            }
            a
        } else {
            Attributes::non_resource(user.clone(), &info.verb, &info.path)
        };
        let decision = self.authorize_attributes(&attributes);
        if decision.allowed {
            return Ok(());
        }
        let mut message = if info.resource_request {
            let resource = skerry_api::status::qualified(&info.group, &info.resource);
            match &name {
                Some(name) => format!(
                    "{resource} {name:?} is forbidden: {}",
                    attributes.forbidden_message()
                ),
                None => format!(
                    "{resource} is forbidden: {}",
                    attributes.forbidden_message()
                ),
            }
        } else {
            format!("forbidden: {}", attributes.forbidden_message())
        };
        // The authorizers' reasons follow the sentence (`responsewriters.Forbidden`).
        if !decision.reason.is_empty() {
            message = format!("{message}: {}", decision.reason);
        }
        let mut e = ApiError::forbidden(message);
        if info.resource_request {
            e.group = Some(info.group.clone());
            e.kind = Some(info.resource.clone());
            e.name = name;
        }
        Err(e)
    }

    async fn route(self: &Arc<Self>, req: Request) -> Result<Response<Body>, ApiError> {
        if req.info.resource_request {
            return crate::verbs::serve(self, req).await;
        }
        let path = req.info.path.trim_end_matches('/');
        let get_only = |r: Result<Response<Body>, ApiError>| {
            if req.info.verb == "get" || req.info.verb == "head" {
                r
            } else {
                Err(ApiError::method_not_allowed(format!(
                    "the server does not allow this method on the requested resource ({path})"
                )))
            }
        };
        match path {
            "/version" => get_only(Ok(response::json(200, &discovery::version(), &[]))),
            "/healthz" | "/livez" => get_only(Ok(response::bytes(
                200,
                "text/plain; charset=utf-8",
                "ok",
                &[],
            ))),
            "/readyz" => get_only(self.readyz().await),
            "/metrics" => get_only(Ok(self.metrics.render(self))),
            "/api" => get_only(match req.format()? {
                Format::AggregatedDiscovery => Ok(response::json_as(
                    200,
                    &discovery::aggregated(true),
                    discovery::AGGREGATED_CONTENT_TYPE,
                )),
                _ => Ok(response::json(
                    200,
                    &discovery::legacy_api_versions(&self.server_address),
                    &[],
                )),
            }),
            "/apis" => get_only(match req.format()? {
                Format::AggregatedDiscovery => Ok(response::json_as(
                    200,
                    &discovery::aggregated(false),
                    discovery::AGGREGATED_CONTENT_TYPE,
                )),
                _ => Ok(response::json(200, &discovery::legacy_api_groups(), &[])),
            }),
            "/openapi/v2" => get_only(crate::openapi::v2(&req)),
            "/openapi/v3" => get_only(crate::openapi::v3_index(&req)),
            p if p.starts_with("/openapi/v3/") => {
                get_only(crate::openapi::v3(&req, &p["/openapi/v3/".len()..]))
            }
            p => {
                let parts: Vec<&str> = p.trim_start_matches('/').split('/').collect();
                let doc = match parts.as_slice() {
                    ["api", version] => discovery::resource_list("", version),
                    ["apis", group] => discovery::legacy_api_group(group),
                    ["apis", group, version] => discovery::resource_list(group, version),
                    _ => None,
                };
                match doc {
                    Some(doc) => get_only(Ok(response::json(200, &doc, &[]))),
                    None => Err(ApiError::no_route(p)),
                }
            }
        }
    }

    /// Ready when the store answers a linearizable read (a member cut off from its quorum is
    /// not ready) and every watch cache has loaded.
    async fn readyz(&self) -> Result<Response<Body>, ApiError> {
        let barrier =
            tokio::time::timeout(READYZ_STORE_TIMEOUT, self.store.linearizable_barrier()).await;
        let store_ok = matches!(barrier, Ok(Ok(())));
        let caches_ok = self.caches.values().all(|c| c.is_ready());
        if store_ok && caches_ok {
            return Ok(response::bytes(200, "text/plain; charset=utf-8", "ok", &[]));
        }
        let mut text = String::new();
        text.push_str(if store_ok {
            "[+]etcd ok\n"
        } else {
            "[-]etcd failed: no quorum read\n"
        });
        text.push_str(if caches_ok {
            "[+]watch-cache ok\n"
        } else {
            "[-]watch-cache failed: still loading\n"
        });
        text.push_str("readyz check failed\n");
        Ok(response::bytes(500, "text/plain; charset=utf-8", text, &[]))
    }
}

/// How long `/readyz` waits for a quorum read: longer than an election (1 s) so a leader
/// change does not flap readiness, shorter than kubelet-style probe timeouts.
const READYZ_STORE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

/// Reads a request body, refusing one over [`REQUEST_BODY_BYTES_MAX`] with 413.
async fn read_body(body: Incoming) -> Result<Bytes, ApiError> {
    match Limited::new(body, REQUEST_BODY_BYTES_MAX).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(e) => {
            if e.downcast_ref::<http_body_util::LengthLimitError>()
                .is_some()
            {
                Err(ApiError::request_entity_too_large(REQUEST_BODY_BYTES_MAX))
            } else {
                Err(ApiError::bad_request(format!(
                    "reading the request body: {e}"
                )))
            }
        }
    }
}
