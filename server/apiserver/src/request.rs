//! What a request asks for, read from its method, path and query the way Kubernetes'
//! `RequestInfoFactory` reads them: API group and version, namespace, resource, name,
//! subresource and verb. Authorization, routing and metrics all use this one reading.
//!
//! It also holds the one reading of boolean query parameters ([`query_bool`]): Kubernetes
//! decodes `watch`, `allowWatchBookmarks`, `sendInitialEvents`, `force`, `orphanDependents`
//! and every other boolean option through its parameter codec, which never refuses a value —
//! only `0` and `false` (in any case) are false, so Python's `watch=True` and even `watch=yes`
//! or a bare `watch` are watches. The one exception, `pretty`, is Go's `strconv.ParseBool`
//! ([`parse_go_bool`]).

use std::collections::HashMap;

/// Subresources of a namespace that are not resources inside it
/// (`/api/v1/namespaces/ns/status` is the namespace's status, not a resource `status`).
const NAMESPACE_SUBRESOURCES: &[&str] = &["status", "finalize"];

/// A request for an API resource, or a plain path (`/version`, `/healthz`, `/openapi/v2`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestInfo {
    /// `get`, `list`, `watch`, `create`, `update`, `patch`, `delete`, `deletecollection`
    /// for resources; the lower-case HTTP method for other paths (RBAC's nonResourceURLs).
    pub verb: String,
    pub resource_request: bool,
    /// `""` for the core group.
    pub group: String,
    pub version: String,
    pub namespace: Option<String>,
    pub resource: String,
    pub subresource: Option<String>,
    pub name: Option<String>,
    pub path: String,
    /// A list's, watch's or deletecollection's `?fieldSelector=` as sent, for the
    /// authorizers (`AuthorizeWithSelectors`, on by default since 1.32); `None` otherwise.
    pub field_selector: Option<String>,
}

impl RequestInfo {
    /// Reads a request. `query` is the parsed query string (`watch=true` makes a list a
    /// watch, as does the legacy `/watch/` path segment).
    pub fn parse(method: &http::Method, path: &str, query: &HashMap<String, String>) -> Self {
        let non_resource = || RequestInfo {
            verb: method.as_str().to_ascii_lowercase(),
            resource_request: false,
            group: String::new(),
            version: String::new(),
            namespace: None,
            resource: String::new(),
            subresource: None,
            name: None,
            path: path.to_string(),
            field_selector: None,
        };
        let trimmed = path.trim_matches('/');
        let mut parts: Vec<&str> = trimmed.split('/').collect();
        let (group, version) = match parts.first() {
            Some(&"api") if parts.len() >= 2 => {
                let v = parts[1].to_string();
                parts.drain(..2);
                (String::new(), v)
            }
            Some(&"apis") if parts.len() >= 3 => {
                let g = parts[1].to_string();
                let v = parts[2].to_string();
                parts.drain(..3);
                (g, v)
            }
            _ => return non_resource(),
        };
        if parts.is_empty() || parts[0].is_empty() {
            // `/api/v1`, `/apis/apps/v1`: discovery, not a resource.
            return non_resource();
        }
        let mut verb = match *method {
            http::Method::POST => "create",
            http::Method::GET | http::Method::HEAD => "get",
            http::Method::PUT => "update",
            http::Method::PATCH => "patch",
            http::Method::DELETE => "delete",
            _ => "",
        }
        .to_string();
        let mut legacy_watch = false;
        if parts[0] == "watch" {
            legacy_watch = true;
            parts.remove(0);
        }
        let mut namespace = None;
        if parts.first() == Some(&"namespaces") && parts.len() > 1 {
            namespace = Some(parts[1].to_string());
            // `namespaces/<ns>/<resource>...`, except the namespace's own subresources.
            if parts.len() > 2 && !NAMESPACE_SUBRESOURCES.contains(&parts[2]) {
                parts.drain(..2);
            }
        }
        let resource = parts.first().map(|s| s.to_string()).unwrap_or_default();
        let name = parts.get(1).map(|s| s.to_string());
        let subresource = parts.get(2).map(|s| s.to_string());
        // A namespace object is named by its path, not namespaced.
        if resource == "namespaces" {
            namespace = None;
        }
        if verb == "get" && name.is_none() {
            let watch_param = query_bool(query, "watch").unwrap_or(false);
            verb = if legacy_watch || watch_param {
                "watch".into()
            } else {
                "list".into()
            };
        } else if verb == "get" && legacy_watch {
            // `GET /api/v1/watch/namespaces/ns/pods/name`: a watch of one object. A named GET
            // with `?watch=true` stays a GET, as in Kubernetes (only a collection reads the
            // parameter).
            verb = "watch".into();
        }
        if verb == "delete" && name.is_none() {
            verb = "deletecollection".into();
        }
        // k8s.io/apiserver/pkg/endpoints/filters/authorization.go (`GetAuthorizerAttributes`)
        // reads selectors only for the verbs that take them.
        let field_selector = matches!(verb.as_str(), "list" | "watch" | "deletecollection")
            .then(|| query.get("fieldSelector").cloned())
            .flatten();
        RequestInfo {
            verb,
            resource_request: true,
            group,
            version,
            namespace,
            resource,
            subresource,
            name,
            path: path.to_string(),
            field_selector,
        }
    }
}

/// A boolean query parameter as Kubernetes' parameter codec reads it
/// (apimachinery `runtime.Convert_Slice_string_To_bool` and `Convert_Slice_string_To_Pointer_bool`,
/// which every `ListOptions`, `PatchOptions` and `DeleteOptions` boolean goes through): absent
/// is `None`; `0`, or `false` in any case (Go's `strings.EqualFold`), is false; anything else,
/// the empty value of `?watch` or `?watch=` included, is true. No value is an error.
pub fn query_bool(query: &HashMap<String, String>, name: &str) -> Option<bool> {
    query.get(name).map(|value| parse_query_bool(value))
}

/// One present value of a boolean query parameter (see [`query_bool`]).
pub fn parse_query_bool(value: &str) -> bool {
    !(value == "0" || equal_fold_false(value))
}

/// Whether `value` is `false` under Go's `strings.EqualFold` (simple Unicode case folding):
/// ASCII letters in either case, and for the `s` also U+017F LATIN SMALL LETTER LONG S, which
/// folds to it.
fn equal_fold_false(value: &str) -> bool {
    let mut chars = value.chars();
    for want in ['f', 'a', 'l', 's', 'e'] {
        match chars.next() {
            Some(c) if c.to_ascii_lowercase() == want => {}
            Some('\u{17F}') if want == 's' => {}
            _ => return false,
        }
    }
    chars.next().is_none()
}

/// Go's `strconv.ParseBool`: `1 t T TRUE true True` and `0 f F FALSE false False`, anything
/// else `None`. Kubernetes reads only `pretty` this way (`negotiation.isPrettyPrint`).
pub fn parse_go_bool(value: &str) -> Option<bool> {
    match value {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Some(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Some(false),
        _ => None,
    }
}

/// Parses a query string into a map (the last value of a repeated key wins, as Go's
/// `url.Values.Get` returns the first; Kubernetes clients never repeat them).
pub fn parse_query(query: Option<&str>) -> HashMap<String, String> {
    let mut map = HashMap::new();
    if let Some(q) = query {
        for (k, v) in form_urlencoded::parse(q.as_bytes()) {
            map.entry(k.into_owned()).or_insert_with(|| v.into_owned());
        }
    }
    map
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::Method;

    fn info(method: Method, path: &str, query: &str) -> RequestInfo {
        RequestInfo::parse(&method, path, &parse_query(Some(query)))
    }

    #[test]
    fn reads_resources_like_kubernetes() {
        let i = info(Method::GET, "/api/v1/namespaces/default/pods/web", "");
        assert_eq!(
            (
                i.verb.as_str(),
                i.namespace.as_deref(),
                i.resource.as_str(),
                i.name.as_deref()
            ),
            ("get", Some("default"), "pods", Some("web"))
        );
        let i = info(
            Method::GET,
            "/apis/apps/v1/namespaces/ns/deployments",
            "watch=true",
        );
        assert_eq!((i.verb.as_str(), i.group.as_str()), ("watch", "apps"));
        let i = info(Method::GET, "/api/v1/pods", "");
        assert_eq!((i.verb.as_str(), i.namespace), ("list", None));
        let i = info(
            Method::PATCH,
            "/apis/apps/v1/namespaces/ns/deployments/d/scale",
            "",
        );
        assert_eq!(
            (i.verb.as_str(), i.subresource.as_deref()),
            ("patch", Some("scale"))
        );
        let i = info(Method::DELETE, "/api/v1/namespaces/ns/configmaps", "");
        assert_eq!(i.verb, "deletecollection");
        let i = info(Method::GET, "/api/v1/watch/namespaces/ns/pods", "");
        assert_eq!(i.verb, "watch");
    }

    #[test]
    fn boolean_parameters_read_as_kubernetes_parameter_codec_reads_them() {
        // strconv.ParseBool's spellings, then what the codec accepts beyond them: only `0`
        // and a case-folded `false` are false.
        let table = [
            ("1", true),
            ("t", true),
            ("T", true),
            ("TRUE", true),
            ("true", true),
            ("True", true),
            ("0", false),
            ("f", true),
            ("F", true),
            ("FALSE", false),
            ("false", false),
            ("False", false),
            ("fAlSe", false),
            ("fal\u{17F}e", false),
            ("yes", true),
            ("no", true),
            ("", true),
            ("00", true),
            (" false", true),
            ("falsey", true),
        ];
        for (value, want) in table {
            assert_eq!(parse_query_bool(value), want, "{value:?}");
        }
        let query = parse_query(Some("watch=True&force&sendInitialEvents=0"));
        assert_eq!(query_bool(&query, "watch"), Some(true));
        assert_eq!(
            query_bool(&query, "force"),
            Some(true),
            "a bare key is true"
        );
        assert_eq!(query_bool(&query, "sendInitialEvents"), Some(false));
        assert_eq!(query_bool(&query, "allowWatchBookmarks"), None);
    }

    #[test]
    fn pretty_reads_as_go_parse_bool() {
        for value in ["1", "t", "T", "TRUE", "true", "True"] {
            assert_eq!(parse_go_bool(value), Some(true), "{value}");
        }
        for value in ["0", "f", "F", "FALSE", "false", "False"] {
            assert_eq!(parse_go_bool(value), Some(false), "{value}");
        }
        for value in ["", "yes", "tRUE", "fAlse", "2"] {
            assert_eq!(parse_go_bool(value), None, "{value}");
        }
    }

    #[test]
    fn every_watch_spelling_kubernetes_accepts_makes_a_watch() {
        for query in [
            "watch=true",
            "watch=True",
            "watch=t",
            "watch=1",
            "watch=yes",
            "watch=",
            "watch",
        ] {
            let i = info(Method::GET, "/api/v1/namespaces/ns/pods", query);
            assert_eq!(i.verb, "watch", "{query}");
        }
        for query in ["watch=false", "watch=False", "watch=FALSE", "watch=0", ""] {
            let i = info(Method::GET, "/api/v1/namespaces/ns/pods", query);
            assert_eq!(i.verb, "list", "{query}");
        }
        // Only a collection reads `watch`: a named GET stays a GET; the legacy path watches.
        let i = info(Method::GET, "/api/v1/namespaces/ns/pods/p", "watch=true");
        assert_eq!(i.verb, "get");
        let i = info(Method::GET, "/api/v1/watch/namespaces/ns/pods/p", "");
        assert_eq!(i.verb, "watch");
    }

    #[test]
    fn namespaces_are_named_by_their_path() {
        let i = info(Method::GET, "/api/v1/namespaces/kube-system", "");
        assert_eq!(
            (i.resource.as_str(), i.name.as_deref(), i.namespace),
            ("namespaces", Some("kube-system"), None)
        );
        let i = info(Method::PUT, "/api/v1/namespaces/ns/finalize", "");
        assert_eq!(
            (
                i.resource.as_str(),
                i.name.as_deref(),
                i.subresource.as_deref()
            ),
            ("namespaces", Some("ns"), Some("finalize"))
        );
        let i = info(Method::GET, "/api/v1/namespaces", "");
        assert_eq!(i.verb, "list");
    }

    #[test]
    fn other_paths_are_not_resources() {
        for p in [
            "/version",
            "/api",
            "/apis",
            "/api/v1",
            "/apis/apps/v1",
            "/openapi/v2",
            "/healthz",
        ] {
            let i = info(Method::GET, p, "");
            assert!(!i.resource_request, "{p}");
            assert_eq!(i.verb, "get");
        }
    }
}
