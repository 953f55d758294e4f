//! A container's environment, as the upstream kubelet builds it before it asks the runtime to
//! create the container (`pkg/kubelet/kubelet_pods.go` `makeEnvironmentVariables`,
//! `getServiceEnvVarMap`, `podFieldSelectorRuntimeValue`; `pkg/kubelet/envvars/envvars.go`
//! `FromServices`; `pkg/kubelet/container/helpers.go` `ExpandContainerCommandAndArgs`,
//! `ExpandContainerVolumeMounts`).
//!
//! The order is the rule: `envFrom` sources first (later ones overwrite earlier ones), then
//! `env` in declaration order, each `value` expanded against everything resolved *before* it
//! and then the service variables, so `$(A)` in the third variable sees the first two but not
//! the fourth. Service variables come last and never replace a variable the container set.
//!
//! The ConfigMaps, Secrets and Services come through [`Lookup`], which the pod workers
//! implement over their informers; [`ApiLookup`] implements it over the API directly. A
//! ConfigMap or Secret that is not there is reported as the kubelet's watch-based managers
//! report it (`configmap "x" not found`, singular), and any failure is a
//! `CreateContainerConfigError` of the container ([`EnvError`]).

pub mod expansion;
pub mod fieldpath;

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{ConfigMap, Container, Pod, Secret, Service};
use skerry_client::{Api, Client, ListParams};

use self::fieldpath::Allocatable;

/// The namespace of the master service (`metav1.NamespaceDefault`).
const MASTER_NAMESPACE: &str = "default";
/// The services of the default namespace every pod gets variables for, even with
/// `enableServiceLinks: false` (`masterServices` in `kubelet_pods.go`).
const MASTER_SERVICES: [&str; 1] = ["kubernetes"];
/// A Service's `clusterIP` that means "headless": no variables (`v1.ClusterIPNone`).
const CLUSTER_IP_NONE: &str = "None";

/// The waiting reason of a container whose configuration could not be built
/// (`kuberuntime.ErrCreateContainerConfig`).
pub const REASON_CREATE_CONTAINER_CONFIG_ERROR: &str = "CreateContainerConfigError";
/// The event reason of a container that could not be created (`events.FailedToCreateContainer`).
pub const EVENT_FAILED: &str = "Failed";
/// The event reason of `envFrom` keys that are not variable names.
pub const EVENT_INVALID_ENV_NAMES: &str = "InvalidEnvironmentVariableNames";
/// `v1.EventTypeWarning`.
pub const EVENT_WARNING: &str = "Warning";

/// Why a lookup failed for a reason other than "not found" (which is `Ok(None)`).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct LookupError(pub String);

/// Where the kubelet reads the objects a pod references. The pod workers implement it over
/// their informers; [`ApiLookup`] over plain GETs and LISTs.
pub trait Lookup: Send + Sync {
    /// The ConfigMap `namespace/name`; `Ok(None)` when it does not exist.
    fn config_map(
        &self,
        namespace: &str,
        name: &str,
    ) -> impl Future<Output = Result<Option<Arc<ConfigMap>>, LookupError>> + Send;
    /// The Secret `namespace/name`; `Ok(None)` when it does not exist.
    fn secret(
        &self,
        namespace: &str,
        name: &str,
    ) -> impl Future<Output = Result<Option<Arc<Secret>>, LookupError>> + Send;
    /// Every Service of `namespace`. An informer that has not listed yet answers an error
    /// (upstream refuses to build an environment before the service lister synced once, so a
    /// pod never starts without `KUBERNETES_SERVICE_HOST`).
    fn services(
        &self,
        namespace: &str,
    ) -> impl Future<Output = Result<Vec<Arc<Service>>, LookupError>> + Send;
}

/// [`Lookup`] over the API: a GET per object, a LIST per namespace of Services.
#[derive(Clone)]
pub struct ApiLookup {
    client: Client,
}

impl ApiLookup {
    /// Reads through `client` (the node's credentials).
    pub fn new(client: Client) -> ApiLookup {
        ApiLookup { client }
    }
}

impl Lookup for ApiLookup {
    async fn config_map(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<Arc<ConfigMap>>, LookupError> {
        let api: Api<ConfigMap> = self.client.api(Some(namespace));
        api.get_opt(name)
            .await
            .map(|o| o.map(Arc::new))
            .map_err(|e| LookupError(e.to_string()))
    }

    async fn secret(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<Arc<Secret>>, LookupError> {
        let api: Api<Secret> = self.client.api(Some(namespace));
        api.get_opt(name)
            .await
            .map(|o| o.map(Arc::new))
            .map_err(|e| LookupError(e.to_string()))
    }

    async fn services(&self, namespace: &str) -> Result<Vec<Arc<Service>>, LookupError> {
        let api: Api<Service> = self.client.api(Some(namespace));
        api.list(&ListParams::default())
            .await
            .map(|l| l.items.into_iter().map(Arc::new).collect())
            .map_err(|e| LookupError(e.to_string()))
    }
}

/// The message of a ConfigMap that is not there, as the kubelet's object managers word it.
pub fn config_map_not_found(name: &str) -> String {
    format!("configmap \"{name}\" not found")
}

/// The message of a Secret that is not there, as the kubelet's object managers word it.
pub fn secret_not_found(name: &str) -> String {
    format!("secret \"{name}\" not found")
}

/// A container's configuration could not be built: its waiting reason is
/// [`REASON_CREATE_CONTAINER_CONFIG_ERROR`] and the message is this error's text.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct EnvError {
    /// Upstream's error text (`couldn't find key k in ConfigMap ns/name`, ...).
    pub message: String,
}

impl EnvError {
    fn new(message: impl Into<String>) -> EnvError {
        EnvError {
            message: message.into(),
        }
    }

    /// The container's waiting reason.
    pub fn reason(&self) -> &'static str {
        REASON_CREATE_CONTAINER_CONFIG_ERROR
    }

    /// The Warning event the kubelet records on the pod (`Failed`, `Error: <message>`).
    pub fn event(&self) -> PodEvent {
        PodEvent {
            type_: EVENT_WARNING,
            reason: EVENT_FAILED,
            message: format!("Error: {}", self.message),
        }
    }
}

/// An event to record on the pod.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodEvent {
    /// `Normal` or `Warning`.
    pub type_: &'static str,
    /// The machine-readable reason.
    pub reason: &'static str,
    /// The message.
    pub message: String,
}

/// What [`make_environment`] needs besides the lookups.
#[derive(Clone, Copy, Debug)]
pub struct EnvInput<'a> {
    /// The pod.
    pub pod: &'a Pod,
    /// One of its containers (or init containers).
    pub container: &'a Container,
    /// The pod's IPs, the node's preferred family first (`status.podIP` is the first).
    pub pod_ips: &'a [String],
    /// The node's IPs, its primary first (`status.hostIP` is the first).
    pub host_ips: &'a [String],
    /// The node's allocatable resources: the limits of a container that sets none.
    pub node_allocatable: &'a Allocatable,
}

/// A container's environment.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Environment {
    /// Name and value: the container's own variables sorted by name, then the service
    /// variables it does not override, sorted by name.
    pub vars: Vec<(String, String)>,
    /// Events to record on the pod (skipped `envFrom` keys).
    pub events: Vec<PodEvent>,
}

impl Environment {
    /// The variables as a map (what `$(VAR)` in command, args and `subPathExpr` sees).
    pub fn to_map(&self) -> BTreeMap<String, String> {
        self.vars.iter().cloned().collect()
    }
}

/// Builds a container's environment (`makeEnvironmentVariables`).
pub async fn make_environment<L: Lookup>(
    input: EnvInput<'_>,
    lookup: &L,
) -> Result<Environment, EnvError> {
    let EnvInput { pod, container, .. } = input;
    let namespace = pod.metadata.namespace.as_deref().unwrap_or_default();
    let spec = pod
        .spec
        .as_ref()
        .ok_or_else(|| EnvError::new("pod has no spec"))?;
    let enable_service_links = spec.enable_service_links.ok_or_else(|| {
        EnvError::new("nil pod.spec.enableServiceLinks encountered, cannot construct envvars")
    })?;
    let service_env = service_env_map(namespace, enable_service_links, lookup).await?;

    let mut config_maps: BTreeMap<String, Arc<ConfigMap>> = BTreeMap::new();
    let mut secrets: BTreeMap<String, Arc<Secret>> = BTreeMap::new();
    let mut env: BTreeMap<String, String> = BTreeMap::new();
    let mut events = Vec::new();

    for from in container.env_from.iter().flatten() {
        let prefix = from.prefix.as_deref().unwrap_or_default();
        let (kind, name, pairs): (&str, &str, Vec<(String, String)>) =
            if let Some(source) = &from.config_map_ref {
                let optional = source.optional.unwrap_or(false);
                let Some(cm) =
                    config_map_cached(&mut config_maps, lookup, namespace, &source.name, optional)
                        .await?
                else {
                    continue;
                };
                let pairs = cm
                    .data
                    .iter()
                    .flatten()
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect();
                ("configMap", source.name.as_str(), pairs)
            } else if let Some(source) = &from.secret_ref {
                let optional = source.optional.unwrap_or(false);
                let Some(secret) =
                    secret_cached(&mut secrets, lookup, namespace, &source.name, optional).await?
                else {
                    continue;
                };
                let pairs = secret
                    .data
                    .iter()
                    .flatten()
                    .map(|(k, v)| (k.clone(), String::from_utf8_lossy(&v.0).into_owned()))
                    .collect();
                ("secret", source.name.as_str(), pairs)
            } else {
                continue;
            };
        let mut invalid = Vec::new();
        for (key, value) in pairs {
            let key = format!("{prefix}{key}");
            if !is_env_var_name(&key) {
                invalid.push(key);
                continue;
            }
            env.insert(key, value);
        }
        if !invalid.is_empty() {
            invalid.sort();
            events.push(PodEvent {
                type_: EVENT_WARNING,
                reason: EVENT_INVALID_ENV_NAMES,
                message: format!(
                    "Keys [{}] from the EnvFrom {kind} {namespace}/{name} were skipped since they are considered invalid environment variable names.",
                    invalid.join(", ")
                ),
            });
        }
    }

    for var in container.env.iter().flatten() {
        let mut value = var.value.clone().unwrap_or_default();
        if !value.is_empty() {
            let contexts = [&env, &service_env];
            value = expansion::expand(&value, &expansion::mapping_for(&contexts));
        } else if let Some(from) = &var.value_from {
            if let Some(field) = &from.field_ref {
                value = pod_field_value(&input, field.api_version.as_deref(), &field.field_path)
                    .map_err(EnvError::new)?;
            } else if let Some(selector) = &from.resource_field_ref {
                value = resource_value(&input, selector).map_err(EnvError::new)?;
            } else if let Some(key_ref) = &from.config_map_key_ref {
                let optional = key_ref.optional.unwrap_or(false);
                let Some(cm) =
                    config_map_cached(&mut config_maps, lookup, namespace, &key_ref.name, optional)
                        .await?
                else {
                    continue;
                };
                match cm.data.as_ref().and_then(|d| d.get(&key_ref.key)) {
                    Some(v) => value = v.clone(),
                    None if optional => continue,
                    None => {
                        return Err(EnvError::new(format!(
                            "couldn't find key {} in ConfigMap {namespace}/{}",
                            key_ref.key, key_ref.name
                        )));
                    }
                }
            } else if let Some(key_ref) = &from.secret_key_ref {
                let optional = key_ref.optional.unwrap_or(false);
                let Some(secret) =
                    secret_cached(&mut secrets, lookup, namespace, &key_ref.name, optional).await?
                else {
                    continue;
                };
                match secret.data.as_ref().and_then(|d| d.get(&key_ref.key)) {
                    Some(v) => value = String::from_utf8_lossy(&v.0).into_owned(),
                    None if optional => continue,
                    None => {
                        return Err(EnvError::new(format!(
                            "couldn't find key {} in Secret {namespace}/{}",
                            key_ref.key, key_ref.name
                        )));
                    }
                }
            }
        }
        env.insert(var.name.clone(), value);
    }

    let mut vars: Vec<(String, String)> = env.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
    vars.extend(
        service_env
            .into_iter()
            .filter(|(k, _)| !env.contains_key(k)),
    );
    Ok(Environment { vars, events })
}

async fn config_map_cached<L: Lookup>(
    cache: &mut BTreeMap<String, Arc<ConfigMap>>,
    lookup: &L,
    namespace: &str,
    name: &str,
    optional: bool,
) -> Result<Option<Arc<ConfigMap>>, EnvError> {
    if let Some(cm) = cache.get(name) {
        return Ok(Some(cm.clone()));
    }
    match lookup.config_map(namespace, name).await {
        Ok(Some(cm)) => {
            cache.insert(name.to_string(), cm.clone());
            Ok(Some(cm))
        }
        Ok(None) if optional => Ok(None),
        Ok(None) => Err(EnvError::new(config_map_not_found(name))),
        Err(e) => Err(EnvError::new(e.0)),
    }
}

async fn secret_cached<L: Lookup>(
    cache: &mut BTreeMap<String, Arc<Secret>>,
    lookup: &L,
    namespace: &str,
    name: &str,
    optional: bool,
) -> Result<Option<Arc<Secret>>, EnvError> {
    if let Some(secret) = cache.get(name) {
        return Ok(Some(secret.clone()));
    }
    match lookup.secret(namespace, name).await {
        Ok(Some(secret)) => {
            cache.insert(name.to_string(), secret.clone());
            Ok(Some(secret))
        }
        Ok(None) if optional => Ok(None),
        Ok(None) => Err(EnvError::new(secret_not_found(name))),
        Err(e) => Err(EnvError::new(e.0)),
    }
}

/// A `fieldRef`'s value for an env var (`podFieldSelectorRuntimeValue`): the node and pod
/// fields the kubelet knows, the metadata ones through [`fieldpath::extract_field_path`].
fn pod_field_value(
    input: &EnvInput<'_>,
    api_version: Option<&str>,
    path: &str,
) -> Result<String, String> {
    let path = fieldpath::convert_field_label(api_version, path)?;
    let spec = input.pod.spec.as_ref();
    match path.as_str() {
        "spec.nodeName" => Ok(spec.and_then(|s| s.node_name.clone()).unwrap_or_default()),
        "spec.serviceAccountName" => Ok(spec
            .and_then(|s| s.service_account_name.clone())
            .unwrap_or_default()),
        "status.hostIP" => input
            .host_ips
            .first()
            .cloned()
            .ok_or_else(|| "the node has no IP address".to_string()),
        "status.hostIPs" => {
            if input.host_ips.is_empty() {
                return Err("the node has no IP address".to_string());
            }
            Ok(input.host_ips.join(","))
        }
        "status.podIP" => Ok(input.pod_ips.first().cloned().unwrap_or_default()),
        "status.podIPs" => Ok(input.pod_ips.join(",")),
        _ => fieldpath::extract_field_path(input.pod, &path),
    }
}

/// A `resourceFieldRef`'s value for an env var: the pod's containers and this container with
/// their missing limits defaulted to the node's allocatable (`defaultPodLimitsForDownwardAPI`,
/// then `containerResourceRuntimeValue`). Upstream defaults the app containers of the pod
/// only, so a `containerName` naming an init container reads that container's own limits.
fn resource_value(
    input: &EnvInput<'_>,
    selector: &k8s_openapi::api::core::v1::ResourceFieldSelector,
) -> Result<String, String> {
    match selector.container_name.as_deref().filter(|n| !n.is_empty()) {
        None => {
            let container = fieldpath::merge_limits(input.container, input.node_allocatable);
            fieldpath::container_resource_value(selector, &container)
        }
        Some(name) => {
            let found = fieldpath::find_container(input.pod, name)?;
            let is_app = input
                .pod
                .spec
                .as_ref()
                .is_some_and(|s| s.containers.iter().any(|c| c.name == name));
            let container = if is_app {
                fieldpath::merge_limits(found, input.node_allocatable)
            } else {
                found.clone()
            };
            fieldpath::container_resource_value(selector, &container)
        }
    }
}

/// The service variables of a pod in `namespace` (`getServiceEnvVarMap`): its namespace's
/// Services when links are enabled, and the master service from `default` always; a Service
/// of the pod's namespace named like a master service wins over the master one.
pub async fn service_env_map<L: Lookup>(
    namespace: &str,
    enable_service_links: bool,
    lookup: &L,
) -> Result<BTreeMap<String, String>, EnvError> {
    let failed = |_| EnvError::new("failed to list services when setting up env vars");
    let mut chosen: BTreeMap<String, Arc<Service>> = BTreeMap::new();
    let master = lookup.services(MASTER_NAMESPACE).await.map_err(failed)?;
    for service in &master {
        let name = service.metadata.name.clone().unwrap_or_default();
        if is_service_ip_set(service) && MASTER_SERVICES.contains(&name.as_str()) {
            chosen.insert(name, service.clone());
        }
    }
    if enable_service_links {
        let own = if namespace == MASTER_NAMESPACE {
            master
        } else {
            lookup.services(namespace).await.map_err(failed)?
        };
        for service in own {
            if !is_service_ip_set(&service) {
                continue;
            }
            let name = service.metadata.name.clone().unwrap_or_default();
            if namespace == MASTER_NAMESPACE && MASTER_SERVICES.contains(&name.as_str()) {
                continue;
            }
            chosen.insert(name, service);
        }
    }
    let mut out = BTreeMap::new();
    for service in chosen.values() {
        for (name, value) in service_variables(service) {
            out.insert(name, value);
        }
    }
    Ok(out)
}

/// `IsServiceIPSet`: a cluster IP that is neither empty nor `None`.
fn is_service_ip_set(service: &Service) -> bool {
    service
        .spec
        .as_ref()
        .and_then(|s| s.cluster_ip.as_deref())
        .is_some_and(|ip| !ip.is_empty() && ip != CLUSTER_IP_NONE)
}

/// One Service's variables (`envvars.FromServices`): `<NAME>_SERVICE_HOST`,
/// `<NAME>_SERVICE_PORT` (the first port), `<NAME>_SERVICE_PORT_<PORTNAME>` for named ports,
/// and the Docker link variables `<NAME>_PORT`, `<NAME>_PORT_<port>_<PROTO>[_PROTO|_PORT|_ADDR]`.
pub fn service_variables(service: &Service) -> Vec<(String, String)> {
    let Some(spec) = service.spec.as_ref() else {
        return Vec::new();
    };
    let ip = spec.cluster_ip.clone().unwrap_or_default();
    let ports = spec.ports.as_deref().unwrap_or_default();
    let Some(first) = ports.first() else {
        return Vec::new();
    };
    let prefix = env_name(service.metadata.name.as_deref().unwrap_or_default());
    let mut out = vec![(format!("{prefix}_SERVICE_HOST"), ip.clone())];
    let port_var = format!("{prefix}_SERVICE_PORT");
    out.push((port_var.clone(), first.port.to_string()));
    for port in ports {
        if let Some(name) = port.name.as_deref().filter(|n| !n.is_empty()) {
            out.push((
                format!("{port_var}_{}", env_name(name)),
                port.port.to_string(),
            ));
        }
    }
    for (i, port) in ports.iter().enumerate() {
        let protocol = port
            .protocol
            .as_deref()
            .filter(|p| !p.is_empty())
            .unwrap_or("TCP");
        let lower = protocol.to_lowercase();
        let host_port = if ip.contains(':') {
            format!("[{ip}]:{}", port.port)
        } else {
            format!("{ip}:{}", port.port)
        };
        let url = format!("{lower}://{host_port}");
        if i == 0 {
            out.push((format!("{prefix}_PORT"), url.clone()));
        }
        let port_prefix = format!("{prefix}_PORT_{}_{}", port.port, protocol.to_uppercase());
        out.push((port_prefix.clone(), url));
        out.push((format!("{port_prefix}_PROTO"), lower));
        out.push((format!("{port_prefix}_PORT"), port.port.to_string()));
        out.push((format!("{port_prefix}_ADDR"), ip.clone()));
    }
    out
}

/// `makeEnvVariableName`: upper case, `-` as `_`.
fn env_name(name: &str) -> String {
    name.replace('-', "_").to_uppercase()
}

/// apimachinery's `IsEnvVarName`, which the kubelet applies to `envFrom` keys:
/// `[-._a-zA-Z][-._a-zA-Z0-9]*`, and neither `.`, `..` nor a `..` prefix.
pub fn is_env_var_name(name: &str) -> bool {
    let mut chars = name.chars();
    let Some(first) = chars.next() else {
        return false;
    };
    let body = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_');
    if !(first.is_ascii_alphabetic() || matches!(first, '-' | '.' | '_')) || !chars.all(body) {
        return false;
    }
    name != "." && !name.starts_with("..")
}

/// A container's `command` and `args` with `$(VAR)` expanded against its environment
/// (`ExpandContainerCommandAndArgs`; unknown references stay as written).
pub fn expand_command_and_args(
    container: &Container,
    env: &BTreeMap<String, String>,
) -> (Vec<String>, Vec<String>) {
    let contexts = [env];
    let mapping = expansion::mapping_for(&contexts);
    let expand_all = |items: Option<&Vec<String>>| -> Vec<String> {
        items
            .into_iter()
            .flatten()
            .map(|s| expansion::expand(s, &mapping))
            .collect()
    };
    (
        expand_all(container.command.as_ref()),
        expand_all(container.args.as_ref()),
    )
}

/// A volume mount's `subPathExpr` expanded against the container's environment
/// (`ExpandContainerVolumeMounts`): a reference to a missing or empty variable is an error
/// naming every such variable, sorted.
pub fn expand_subpath_expr(expr: &str, env: &BTreeMap<String, String>) -> Result<String, String> {
    let missing = std::cell::RefCell::new(std::collections::BTreeSet::new());
    let mapping = |name: &str| -> Option<String> {
        match env.get(name) {
            Some(v) if !v.is_empty() => Some(v.clone()),
            _ => {
                missing.borrow_mut().insert(name.to_string());
                Some(String::new())
            }
        }
    };
    let out = expansion::expand(expr, &mapping);
    let missing = missing.into_inner();
    if !missing.is_empty() {
        return Err(format!(
            "missing value for {}",
            missing.into_iter().collect::<Vec<_>>().join(", ")
        ));
    }
    Ok(out)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "a test panics to fail")]
mod tests {
    use super::*;

    #[test]
    fn env_var_names_as_apimachinery_checks_them() {
        for ok in ["A", "a_b", "-x", ".x", "_1", "A.B-C", "x..y"] {
            assert!(is_env_var_name(ok), "{ok}");
        }
        for bad in ["", "1A", "A B", "A=B", ".", "..", "..x", "é", "A$"] {
            assert!(!is_env_var_name(bad), "{bad}");
        }
    }

    #[test]
    fn subpath_expr_needs_every_variable() {
        let env: BTreeMap<String, String> = [
            ("POD".to_string(), "web-0".to_string()),
            ("EMPTY".to_string(), String::new()),
        ]
        .into();
        assert_eq!(
            expand_subpath_expr("logs/$(POD)", &env).unwrap(),
            "logs/web-0"
        );
        assert_eq!(
            expand_subpath_expr("$(Z)/$(EMPTY)/$(POD)/$(A)", &env).unwrap_err(),
            "missing value for A, EMPTY, Z"
        );
        assert_eq!(expand_subpath_expr("$$(POD)", &env).unwrap(), "$(POD)");
    }

    #[test]
    fn service_variables_with_docker_links() {
        let service: Service = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "my-db", "namespace": "shop"},
            "spec": {"clusterIP": "10.0.0.11", "ports": [
                {"port": 5432, "protocol": "TCP"},
                {"name": "metrics-http", "port": 9187, "protocol": "UDP"},
            ]},
        }))
        .unwrap();
        let vars: BTreeMap<_, _> = service_variables(&service).into_iter().collect();
        let want: BTreeMap<String, String> = [
            ("MY_DB_SERVICE_HOST", "10.0.0.11"),
            ("MY_DB_SERVICE_PORT", "5432"),
            ("MY_DB_SERVICE_PORT_METRICS_HTTP", "9187"),
            ("MY_DB_PORT", "tcp://10.0.0.11:5432"),
            ("MY_DB_PORT_5432_TCP", "tcp://10.0.0.11:5432"),
            ("MY_DB_PORT_5432_TCP_PROTO", "tcp"),
            ("MY_DB_PORT_5432_TCP_PORT", "5432"),
            ("MY_DB_PORT_5432_TCP_ADDR", "10.0.0.11"),
            ("MY_DB_PORT_9187_UDP", "udp://10.0.0.11:9187"),
            ("MY_DB_PORT_9187_UDP_PROTO", "udp"),
            ("MY_DB_PORT_9187_UDP_PORT", "9187"),
            ("MY_DB_PORT_9187_UDP_ADDR", "10.0.0.11"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        assert_eq!(vars, want);
        let v6: Service = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "v6"},
            "spec": {"clusterIP": "fd00::1", "ports": [{"port": 80}]},
        }))
        .unwrap();
        let vars: BTreeMap<_, _> = service_variables(&v6).into_iter().collect();
        assert_eq!(
            vars["V6_PORT"], "tcp://[fd00::1]:80",
            "IPv6 joined as JoinHostPort does"
        );
    }
}
