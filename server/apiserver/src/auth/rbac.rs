//! RBAC authorization: may this user do this verb on this resource (or non-resource URL)?
//!
//! [`authorize`] matches Kubernetes' RBAC authorizer rule for rule: members of `system:masters`
//! are allowed everything before RBAC is consulted (Kubernetes' privileged-group authorizer);
//! then every ClusterRoleBinding whose subjects name the user is followed to its ClusterRole,
//! and, for a namespaced request, every RoleBinding of that namespace to its Role or
//! ClusterRole. The first rule that allows the request allows it; otherwise the answer is "no
//! opinion" (denied), with the lookup errors (a binding to a missing role) as the reason.
//!
//! Rule matching: verbs, apiGroups, resources and resourceNames with `*`; a request for a
//! subresource is `resource/subresource` and is matched by that exact string, by `*`, or by
//! `*/subresource` (never by the bare `resource`); an empty resourceNames list matches every
//! name; nonResourceURLs match exactly, by `*`, or by a prefix ending in `*`.
//!
//! [`RbacSource`] hands out roles as `Arc`s and walks bindings by reference with a visitor that
//! can stop early, so a decision clones nothing and stops at the first binding that allows.
//!
//! Aggregated ClusterRoles ([`aggregate_cluster_roles`]) get the union of the rules of the
//! ClusterRoles their label selectors pick, as Kubernetes' clusterrole-aggregation controller
//! writes them, iterated to a fixed point so `admin` includes `edit` includes `view`.
//!
//! `docs/tricks.md` #12, one wildcard RBAC probe for owner-reference finalizers:
//! [`can_set_blocking_owner_finalizers`] first asks once whether the user may `update` the
//! `finalizers` of every resource in every group (`*/*`), which every controller bound to a
//! wildcard role passes; only if that fails does it resolve each owner reference's kind to its
//! resources (a RESTMapper lookup in Kubernetes, a catalogue lookup here) and authorize each.

use std::collections::{BTreeMap, HashMap};
use std::ops::ControlFlow;
use std::sync::Arc;

use k8s_openapi::api::rbac::v1::{
    ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding, Subject,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, OwnerReference};

use super::serviceaccount;
use super::{GROUP_MASTERS, UserInfo};

/// The wildcard of verbs, groups, resources and URLs (Kubernetes `rbacv1.VerbAll` etc.).
pub const ALL: &str = "*";

/// Rounds of [`aggregate_cluster_roles`] at most. Each round settles at least one more level
/// of a chain of aggregations (view → edit → admin is three); a round that changes nothing ends
/// early. Semi-arbitrary: a chain longer than this means a cycle, whose rules still converge to
/// the union but are left as they are after the last round.
pub const AGGREGATION_ROUNDS_MAX: usize = 16;

/// What is asked: Kubernetes' `authorizer.Attributes`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Attributes {
    /// Who asks.
    pub user: UserInfo,
    /// The verb: `get`, `list`, `watch`, `create`, `update`, `patch`, `delete`,
    /// `deletecollection`, or a special verb (`impersonate`, `escalate`, `bind`, `use`...).
    pub verb: String,
    /// The namespace; empty for cluster-scoped resources, all-namespace requests and
    /// non-resource URLs.
    pub namespace: String,
    /// The API group; empty for the core group.
    pub api_group: String,
    /// The resource (plural, lowercase).
    pub resource: String,
    /// The subresource (`status`, `log`, `scale`...), or empty.
    pub subresource: String,
    /// The object's name, or empty for collections and creates without a name.
    pub name: String,
    /// For a non-resource request (`/healthz`, `/api`), its path; `None` for a resource request.
    pub non_resource_path: Option<String>,
    /// A list's, watch's or deletecollection's field selector (`GetFieldSelector`); `None`
    /// without one or when it does not parse (upstream's parsing error: no requirements).
    pub field_selector: Option<skerry_api::selector::FieldSelector>,
}

impl Attributes {
    /// A resource request.
    pub fn resource(
        user: UserInfo,
        verb: &str,
        api_group: &str,
        resource: &str,
        namespace: &str,
        name: &str,
    ) -> Self {
        Attributes {
            user,
            verb: verb.to_string(),
            namespace: namespace.to_string(),
            api_group: api_group.to_string(),
            resource: resource.to_string(),
            subresource: String::new(),
            name: name.to_string(),
            non_resource_path: None,
            field_selector: None,
        }
    }

    /// The same request for a subresource.
    pub fn with_subresource(mut self, subresource: &str) -> Self {
        self.subresource = subresource.to_string();
        self
    }

    /// With the raw field selector `text`, as `GetAuthorizerAttributes` parses it: one that
    /// does not parse leaves no requirements.
    pub fn with_field_selector(mut self, text: Option<&str>) -> Self {
        self.field_selector =
            text.and_then(|t| skerry_api::selector::FieldSelector::parse_any(t).ok());
        self
    }

    /// A non-resource request for `path`.
    pub fn non_resource(user: UserInfo, verb: &str, path: &str) -> Self {
        Attributes {
            user,
            verb: verb.to_string(),
            non_resource_path: Some(path.to_string()),
            ..Attributes::default()
        }
    }

    /// Whether this is a resource request.
    pub fn is_resource_request(&self) -> bool {
        self.non_resource_path.is_none()
    }

    /// The sentence Kubernetes puts in a 403's message (`responsewriters.forbiddenMessage`),
    /// e.g. `User "jane" cannot list resource "secrets" in API group "" in the namespace "a"`.
    pub fn forbidden_message(&self) -> String {
        let user = &self.user.name;
        let verb = &self.verb;
        if let Some(path) = &self.non_resource_path {
            return format!("User {user:?} cannot {verb} path {path:?}");
        }
        let mut resource = self.resource.clone();
        if !self.subresource.is_empty() {
            resource = format!("{resource}/{}", self.subresource);
        }
        let group = &self.api_group;
        if self.namespace.is_empty() {
            format!(
                "User {user:?} cannot {verb} resource {resource:?} in API group {group:?} at the cluster scope"
            )
        } else {
            let namespace = &self.namespace;
            format!(
                "User {user:?} cannot {verb} resource {resource:?} in API group {group:?} in the namespace {namespace:?}"
            )
        }
    }
}

/// The answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decision {
    /// Whether the request is allowed.
    pub allowed: bool,
    /// Why: the binding and role that allowed it, or why nothing could (empty when no rule
    /// matched and no lookup failed, as in Kubernetes).
    pub reason: String,
}

impl Decision {
    fn allow(reason: String) -> Self {
        Decision {
            allowed: true,
            reason,
        }
    }

    fn deny(reason: String) -> Self {
        Decision {
            allowed: false,
            reason,
        }
    }
}

/// The current RBAC objects. The lead implements it over the watch caches; [`RbacSnapshot`] is
/// an in-memory one.
///
/// Roles come out as `Arc`s, bindings are visited by reference: a decision copies no role and
/// no binding. A visitor returns `ControlFlow::Break(())` to stop the walk.
pub trait RbacSource: Send + Sync {
    /// The ClusterRole called `name`.
    fn cluster_role(&self, name: &str) -> Option<Arc<ClusterRole>>;
    /// The Role `namespace/name`.
    fn role(&self, namespace: &str, name: &str) -> Option<Arc<Role>>;
    /// Visits every ClusterRoleBinding.
    fn for_each_cluster_role_binding(
        &self,
        visit: &mut dyn FnMut(&ClusterRoleBinding) -> ControlFlow<()>,
    );
    /// Visits every RoleBinding in `namespace`.
    fn for_each_role_binding(
        &self,
        namespace: &str,
        visit: &mut dyn FnMut(&RoleBinding) -> ControlFlow<()>,
    );
}

/// Decides `attributes` against the RBAC objects of `source`, as Kubernetes' RBAC authorizer
/// (behind the `system:masters` privileged-group authorizer) does.
pub fn authorize(attributes: &Attributes, source: &dyn RbacSource) -> Decision {
    if attributes.user.in_group(GROUP_MASTERS) {
        // Kubernetes' privileged-group authorizer allows without a reason.
        return Decision::allow(String::new());
    }
    let user = &attributes.user;
    let mut allowed_by = None;
    let mut errors = Vec::new();

    source.for_each_cluster_role_binding(&mut |binding| {
        let Some(subject) = applies_to(user, binding.subjects.as_deref(), "") else {
            return ControlFlow::Continue(());
        };
        let role_ref = &binding.role_ref;
        let found = rules_of(source, &role_ref.kind, &role_ref.name, "", |rules| {
            rules.iter().any(|rule| rule_allows(attributes, rule))
        });
        match found {
            Ok(true) => {
                allowed_by = Some(format!(
                    "RBAC: allowed by ClusterRoleBinding {:?} of {} {:?} to {}",
                    binding.metadata.name.as_deref().unwrap_or_default(),
                    role_ref.kind,
                    role_ref.name,
                    describe_subject(subject, "")
                ));
                ControlFlow::Break(())
            }
            Ok(false) => ControlFlow::Continue(()),
            Err(e) => {
                errors.push(e);
                ControlFlow::Continue(())
            }
        }
    });
    if let Some(reason) = allowed_by {
        return Decision::allow(reason);
    }

    let namespace = attributes.namespace.as_str();
    if !namespace.is_empty() {
        source.for_each_role_binding(namespace, &mut |binding| {
            let Some(subject) = applies_to(user, binding.subjects.as_deref(), namespace) else {
                return ControlFlow::Continue(());
            };
            let role_ref = &binding.role_ref;
            let found = rules_of(source, &role_ref.kind, &role_ref.name, namespace, |rules| {
                rules.iter().any(|rule| rule_allows(attributes, rule))
            });
            match found {
                Ok(true) => {
                    allowed_by = Some(format!(
                        "RBAC: allowed by RoleBinding \"{}/{namespace}\" of {} {:?} to {}",
                        binding.metadata.name.as_deref().unwrap_or_default(),
                        role_ref.kind,
                        role_ref.name,
                        describe_subject(subject, namespace)
                    ));
                    ControlFlow::Break(())
                }
                Ok(false) => ControlFlow::Continue(()),
                Err(e) => {
                    errors.push(e);
                    ControlFlow::Continue(())
                }
            }
        });
        if let Some(reason) = allowed_by {
            return Decision::allow(reason);
        }
    }

    let reason = match errors.len() {
        0 => String::new(),
        1 => format!("RBAC: {}", errors[0]),
        _ => format!("RBAC: [{}]", errors.join(", ")),
    };
    Decision::deny(reason)
}

/// Runs `check` on the rules a role reference names, or says why there are none (Kubernetes'
/// `GetRoleReferenceRules`, with its error messages).
fn rules_of(
    source: &dyn RbacSource,
    kind: &str,
    name: &str,
    namespace: &str,
    check: impl FnOnce(&[PolicyRule]) -> bool,
) -> Result<bool, String> {
    match kind {
        "ClusterRole" => match source.cluster_role(name) {
            Some(role) => Ok(check(role.rules.as_deref().unwrap_or_default())),
            None => Err(format!(
                "clusterrole.rbac.authorization.k8s.io {name:?} not found"
            )),
        },
        "Role" => match source.role(namespace, name) {
            Some(role) => Ok(check(role.rules.as_deref().unwrap_or_default())),
            None => Err(format!("role.rbac.authorization.k8s.io {name:?} not found")),
        },
        other => Err(format!("unsupported role reference kind: {other:?}")),
    }
}

/// The first subject of a binding in `binding_namespace` ("" for a ClusterRoleBinding) that
/// names `user` (Kubernetes' `appliesTo`).
fn applies_to<'a>(
    user: &UserInfo,
    subjects: Option<&'a [Subject]>,
    binding_namespace: &str,
) -> Option<&'a Subject> {
    subjects?
        .iter()
        .find(|subject| subject_applies(user, subject, binding_namespace))
}

/// Whether one subject names `user`. A ServiceAccount subject without a namespace means the
/// binding's own namespace (so it never matches from a ClusterRoleBinding).
pub fn subject_applies(user: &UserInfo, subject: &Subject, binding_namespace: &str) -> bool {
    match subject.kind.as_str() {
        "User" => user.name == subject.name,
        "Group" => user.in_group(&subject.name),
        "ServiceAccount" => {
            let namespace = subject
                .namespace
                .as_deref()
                .filter(|ns| !ns.is_empty())
                .unwrap_or(binding_namespace);
            !namespace.is_empty()
                && user.name == serviceaccount::user_name(namespace, &subject.name)
        }
        _ => false,
    }
}

fn describe_subject(subject: &Subject, binding_namespace: &str) -> String {
    if subject.kind == "ServiceAccount" {
        let namespace = subject
            .namespace
            .as_deref()
            .filter(|ns| !ns.is_empty())
            .unwrap_or(binding_namespace);
        format!("{} \"{}/{namespace}\"", subject.kind, subject.name)
    } else {
        format!("{} {:?}", subject.kind, subject.name)
    }
}

/// Whether one rule allows the request (Kubernetes' `RuleAllows`).
pub fn rule_allows(attributes: &Attributes, rule: &PolicyRule) -> bool {
    if !rule.verbs.iter().any(|v| v == ALL || *v == attributes.verb) {
        return false;
    }
    match &attributes.non_resource_path {
        Some(path) => non_resource_url_matches(rule, path),
        None => {
            api_group_matches(rule, &attributes.api_group)
                && resource_matches(rule, &attributes.resource, &attributes.subresource)
                && resource_name_matches(rule, &attributes.name)
        }
    }
}

fn api_group_matches(rule: &PolicyRule, group: &str) -> bool {
    rule.api_groups
        .iter()
        .flatten()
        .any(|g| g == ALL || g == group)
}

fn resource_matches(rule: &PolicyRule, resource: &str, subresource: &str) -> bool {
    rule.resources.iter().flatten().any(|r| {
        if r == ALL {
            return true;
        }
        if subresource.is_empty() {
            return r == resource;
        }
        // `resource/subresource` exactly, or `*/subresource`.
        match r.split_once('/') {
            Some((rule_resource, rule_subresource)) => {
                rule_subresource == subresource
                    && (rule_resource == resource || rule_resource == ALL)
            }
            None => false,
        }
    })
}

fn resource_name_matches(rule: &PolicyRule, name: &str) -> bool {
    match rule.resource_names.as_deref() {
        None | Some([]) => true,
        Some(names) => names.iter().any(|n| n == name),
    }
}

fn non_resource_url_matches(rule: &PolicyRule, path: &str) -> bool {
    rule.non_resource_urls.iter().flatten().any(|url| {
        url == ALL
            || url == path
            || url
                .strip_suffix('*')
                .is_some_and(|_| path.starts_with(url.trim_end_matches('*')))
    })
}

/// Fills the rules of every ClusterRole with an `aggregationRule`: the rules of the other
/// ClusterRoles its selectors pick, in selector order then name order, without duplicates
/// (Kubernetes' clusterrole-aggregation controller), repeated until nothing changes so chains
/// of aggregated roles settle.
pub fn aggregate_cluster_roles(roles: &mut [ClusterRole]) {
    for _ in 0..AGGREGATION_ROUNDS_MAX {
        let mut changed = false;
        for index in 0..roles.len() {
            let Some(rule) = roles[index].aggregation_rule.as_ref() else {
                continue;
            };
            let own_name = roles[index].metadata.name.clone().unwrap_or_default();
            // A selector that does not convert fails the role's whole sync in Kubernetes'
            // controller, which then leaves the role's rules as they are.
            let Ok(selectors) = rule
                .cluster_role_selectors
                .iter()
                .flatten()
                .map(skerry_api::selector::LabelSelector::from_api)
                .collect::<Result<Vec<_>, _>>()
            else {
                continue;
            };
            let mut aggregated: Vec<PolicyRule> = Vec::new();
            for selector in &selectors {
                let mut picked: Vec<&ClusterRole> = roles
                    .iter()
                    .filter(|r| r.metadata.name.as_deref().unwrap_or_default() != own_name)
                    .filter(|r| selector.matches_opt(r.metadata.labels.as_ref()))
                    .collect();
                picked.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
                for role in picked {
                    for policy_rule in role.rules.iter().flatten() {
                        if !aggregated.contains(policy_rule) {
                            aggregated.push(policy_rule.clone());
                        }
                    }
                }
            }
            if roles[index].rules.as_ref() != Some(&aggregated) {
                roles[index].rules = Some(aggregated);
                changed = true;
            }
        }
        if !changed {
            return;
        }
    }
}

/// Whether a label selector picks an object with `labels` (Kubernetes'
/// `LabelSelectorAsSelector` through [`skerry_api::selector::LabelSelector`]: an empty
/// selector picks everything; one that does not convert, such as an unknown operator, picks
/// nothing).
pub fn selector_matches(
    selector: &LabelSelector,
    labels: Option<&BTreeMap<String, String>>,
) -> bool {
    skerry_api::selector::LabelSelector::from_api(selector).is_ok_and(|s| s.matches_opt(labels))
}

/// The owner references of an object being written that newly block their owner's deletion:
/// `blockOwnerDeletion: true` now, and absent or not blocking in `old` (matched by uid), as
/// Kubernetes' `newBlockingOwnerDeletionRefs`.
pub fn new_blocking_owner_refs<'a>(
    new: &'a [OwnerReference],
    old: Option<&[OwnerReference]>,
) -> Vec<&'a OwnerReference> {
    let old_by_uid: HashMap<&str, &OwnerReference> = old
        .unwrap_or_default()
        .iter()
        .map(|r| (r.uid.as_str(), r))
        .collect();
    new.iter()
        .filter(|r| r.block_owner_deletion == Some(true))
        .filter(|r| {
            old_by_uid
                .get(r.uid.as_str())
                .is_none_or(|old| old.block_owner_deletion != Some(true))
        })
        .collect()
}

/// Whether `user` may set `blockOwnerDeletion` on `owners` (the references from
/// [`new_blocking_owner_refs`]) of an object in `namespace`: they need `update` on each owner's
/// `finalizers` subresource (Kubernetes' OwnerReferencesPermissionEnforcement admission).
///
/// One probe first: `update` of `*/finalizers` in group `*`, cluster-wide. If it passes, no owner
/// is resolved at all; `resolve` (kind → resources, the caller's catalogue) runs only when it
/// fails, once per owner.
pub fn can_set_blocking_owner_finalizers(
    user: &UserInfo,
    namespace: &str,
    owners: &[&OwnerReference],
    resolve: &mut dyn FnMut(&OwnerReference) -> Result<Vec<String>, String>,
    source: &dyn RbacSource,
) -> Decision {
    if owners.is_empty() {
        return Decision::allow(String::new());
    }
    let probe = Attributes {
        user: user.clone(),
        verb: "update".to_string(),
        api_group: ALL.to_string(),
        resource: ALL.to_string(),
        subresource: "finalizers".to_string(),
        ..Attributes::default()
    };
    let decision = authorize(&probe, source);
    if decision.allowed {
        return decision;
    }
    let mut last = decision;
    for owner in owners {
        let group = match owner.api_version.split_once('/') {
            Some((group, _version)) => group,
            None => "",
        };
        let resources = match resolve(owner) {
            Ok(resources) => resources,
            Err(e) => {
                return Decision::deny(format!(
                    "cannot set blockOwnerDeletion in this case because cannot find RESTMapping for APIVersion {} Kind {}: {e}",
                    owner.api_version, owner.kind
                ));
            }
        };
        for resource in resources {
            let attributes = Attributes::resource(
                user.clone(),
                "update",
                group,
                &resource,
                namespace,
                &owner.name,
            )
            .with_subresource("finalizers");
            let decision = authorize(&attributes, source);
            if !decision.allowed {
                return Decision::deny(format!(
                    "cannot set blockOwnerDeletion if an ownerReference refers to a resource you can't set finalizers on: {}",
                    decision.reason
                ));
            }
            last = decision;
        }
    }
    last
}

/// An in-memory [`RbacSource`]: the bootstrap policy before the watch caches are up, and tests.
#[derive(Debug, Default, Clone)]
pub struct RbacSnapshot {
    cluster_roles: HashMap<String, Arc<ClusterRole>>,
    roles: HashMap<(String, String), Arc<Role>>,
    cluster_role_bindings: Vec<Arc<ClusterRoleBinding>>,
    role_bindings: HashMap<String, Vec<Arc<RoleBinding>>>,
}

impl RbacSnapshot {
    /// Kubernetes' bootstrap policy: [`super::bootstrap`]'s roles (aggregated) and bindings.
    pub fn bootstrap() -> Self {
        let mut snapshot = RbacSnapshot::default();
        for role in super::bootstrap::cluster_roles() {
            snapshot.insert_cluster_role(role);
        }
        for binding in super::bootstrap::cluster_role_bindings() {
            snapshot.insert_cluster_role_binding(binding);
        }
        snapshot
    }

    /// Adds or replaces a ClusterRole (by name).
    pub fn insert_cluster_role(&mut self, role: ClusterRole) {
        let name = role.metadata.name.clone().unwrap_or_default();
        self.cluster_roles.insert(name, Arc::new(role));
    }

    /// Adds or replaces a Role (by namespace and name).
    pub fn insert_role(&mut self, role: Role) {
        let key = (
            role.metadata.namespace.clone().unwrap_or_default(),
            role.metadata.name.clone().unwrap_or_default(),
        );
        self.roles.insert(key, Arc::new(role));
    }

    /// Adds a ClusterRoleBinding.
    pub fn insert_cluster_role_binding(&mut self, binding: ClusterRoleBinding) {
        self.cluster_role_bindings.push(Arc::new(binding));
    }

    /// Adds a RoleBinding to its namespace.
    pub fn insert_role_binding(&mut self, binding: RoleBinding) {
        let namespace = binding.metadata.namespace.clone().unwrap_or_default();
        self.role_bindings
            .entry(namespace)
            .or_default()
            .push(Arc::new(binding));
    }
}

impl RbacSource for RbacSnapshot {
    fn cluster_role(&self, name: &str) -> Option<Arc<ClusterRole>> {
        self.cluster_roles.get(name).cloned()
    }

    fn role(&self, namespace: &str, name: &str) -> Option<Arc<Role>> {
        self.roles
            .get(&(namespace.to_string(), name.to_string()))
            .cloned()
    }

    fn for_each_cluster_role_binding(
        &self,
        visit: &mut dyn FnMut(&ClusterRoleBinding) -> ControlFlow<()>,
    ) {
        for binding in &self.cluster_role_bindings {
            if visit(binding).is_break() {
                return;
            }
        }
    }

    fn for_each_role_binding(
        &self,
        namespace: &str,
        visit: &mut dyn FnMut(&RoleBinding) -> ControlFlow<()>,
    ) {
        for binding in self.role_bindings.get(namespace).into_iter().flatten() {
            if visit(binding).is_break() {
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::GROUP_AUTHENTICATED;
    use k8s_openapi::api::rbac::v1::{AggregationRule, RoleRef};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelectorRequirement, ObjectMeta};

    fn user(name: &str, groups: &[&str]) -> UserInfo {
        UserInfo::authenticated(name, "", groups.iter().map(|g| g.to_string()).collect())
    }

    fn rule(verbs: &[&str], groups: &[&str], resources: &[&str]) -> PolicyRule {
        PolicyRule {
            verbs: verbs.iter().map(|s| s.to_string()).collect(),
            api_groups: Some(groups.iter().map(|s| s.to_string()).collect()),
            resources: Some(resources.iter().map(|s| s.to_string()).collect()),
            ..PolicyRule::default()
        }
    }

    fn subject(kind: &str, name: &str, namespace: Option<&str>) -> Subject {
        Subject {
            kind: kind.into(),
            name: name.into(),
            namespace: namespace.map(str::to_string),
            api_group: None,
        }
    }

    fn meta(name: &str, namespace: Option<&str>) -> ObjectMeta {
        ObjectMeta {
            name: Some(name.into()),
            namespace: namespace.map(str::to_string),
            ..ObjectMeta::default()
        }
    }

    fn role_binding(
        name: &str,
        namespace: &str,
        kind: &str,
        role: &str,
        subjects: Vec<Subject>,
    ) -> RoleBinding {
        RoleBinding {
            metadata: meta(name, Some(namespace)),
            role_ref: RoleRef {
                api_group: "rbac.authorization.k8s.io".into(),
                kind: kind.into(),
                name: role.into(),
            },
            subjects: Some(subjects),
        }
    }

    fn cluster_role_binding(name: &str, role: &str, subjects: Vec<Subject>) -> ClusterRoleBinding {
        ClusterRoleBinding {
            metadata: meta(name, None),
            role_ref: RoleRef {
                api_group: "rbac.authorization.k8s.io".into(),
                kind: "ClusterRole".into(),
                name: role.into(),
            },
            subjects: Some(subjects),
        }
    }

    fn can(
        source: &dyn RbacSource,
        user: &UserInfo,
        verb: &str,
        group: &str,
        resource: &str,
        namespace: &str,
    ) -> bool {
        let (resource, subresource) = resource.split_once('/').unwrap_or((resource, ""));
        let attributes = Attributes::resource(user.clone(), verb, group, resource, namespace, "")
            .with_subresource(subresource);
        authorize(&attributes, source).allowed
    }

    /// A restricted user: a Role allowing get and list of pods in namespace `team-a`.
    fn restricted() -> (RbacSnapshot, UserInfo) {
        let mut policy = RbacSnapshot::bootstrap();
        policy.insert_role(Role {
            metadata: meta("pod-reader", Some("team-a")),
            rules: Some(vec![rule(&["get", "list"], &[""], &["pods"])]),
        });
        policy.insert_role_binding(role_binding(
            "jane-reads-pods",
            "team-a",
            "Role",
            "pod-reader",
            vec![subject("User", "jane", None)],
        ));
        (policy, user("jane", &[]))
    }

    #[test]
    fn restricted_user_reads_pods_in_one_namespace_only() {
        let (policy, jane) = restricted();
        assert!(can(&policy, &jane, "get", "", "pods", "team-a"));
        assert!(can(&policy, &jane, "list", "", "pods", "team-a"));
        // Other verbs, namespaces, resources, groups and subresources are denied.
        assert!(!can(&policy, &jane, "watch", "", "pods", "team-a"));
        assert!(!can(&policy, &jane, "delete", "", "pods", "team-a"));
        assert!(!can(&policy, &jane, "get", "", "pods", "team-b"));
        assert!(
            !can(&policy, &jane, "list", "", "pods", ""),
            "all-namespace list"
        );
        assert!(!can(&policy, &jane, "get", "", "secrets", "team-a"));
        assert!(!can(&policy, &jane, "get", "apps", "pods", "team-a"));
        assert!(!can(&policy, &jane, "get", "", "pods/log", "team-a"));
        assert!(!can(&policy, &jane, "create", "", "pods/exec", "team-a"));
        // Another user is not the subject.
        assert!(!can(
            &policy,
            &user("john", &[]),
            "get",
            "",
            "pods",
            "team-a"
        ));
        // The allow says which binding allowed it.
        let decision = authorize(
            &Attributes::resource(jane.clone(), "get", "", "pods", "team-a", "web"),
            &policy,
        );
        assert_eq!(
            decision.reason,
            "RBAC: allowed by RoleBinding \"jane-reads-pods/team-a\" of Role \"pod-reader\" to User \"jane\""
        );
        // The bootstrap discovery roles still apply to her.
        let discovery = Attributes::non_resource(jane.clone(), "get", "/apis/apps/v1");
        assert!(authorize(&discovery, &policy).allowed);
        let forbidden = Attributes::resource(jane, "list", "", "secrets", "team-a", "");
        assert_eq!(
            forbidden.forbidden_message(),
            "User \"jane\" cannot list resource \"secrets\" in API group \"\" in the namespace \"team-a\""
        );
    }

    #[test]
    fn view_cannot_read_secrets() {
        let mut policy = RbacSnapshot::bootstrap();
        policy.insert_role_binding(role_binding(
            "v",
            "team-a",
            "ClusterRole",
            "view",
            vec![subject("User", "viewer", None)],
        ));
        let viewer = user("viewer", &[]);
        assert!(can(&policy, &viewer, "get", "", "pods", "team-a"));
        assert!(can(
            &policy,
            &viewer,
            "watch",
            "apps",
            "deployments",
            "team-a"
        ));
        assert!(can(&policy, &viewer, "get", "", "pods/log", "team-a"));
        assert!(!can(&policy, &viewer, "get", "", "secrets", "team-a"));
        assert!(!can(&policy, &viewer, "list", "", "secrets", "team-a"));
        assert!(!can(&policy, &viewer, "create", "", "pods", "team-a"));
        assert!(!can(&policy, &viewer, "get", "", "pods", "team-b"));
    }

    #[test]
    fn edit_cannot_touch_roles() {
        let mut policy = RbacSnapshot::bootstrap();
        policy.insert_role_binding(role_binding(
            "e",
            "team-a",
            "ClusterRole",
            "edit",
            vec![subject("Group", "devs", None)],
        ));
        policy.insert_role_binding(role_binding(
            "a",
            "team-a",
            "ClusterRole",
            "admin",
            vec![subject("User", "boss", None)],
        ));
        let dev = user("dev1", &["devs"]);
        assert!(can(
            &policy,
            &dev,
            "create",
            "apps",
            "deployments",
            "team-a"
        ));
        assert!(can(&policy, &dev, "get", "", "secrets", "team-a"));
        assert!(can(
            &policy,
            &dev,
            "update",
            "apps",
            "deployments/scale",
            "team-a"
        ));
        for verb in ["get", "list", "create", "update", "delete"] {
            assert!(
                !can(
                    &policy,
                    &dev,
                    verb,
                    "rbac.authorization.k8s.io",
                    "roles",
                    "team-a"
                ),
                "{verb}"
            );
            assert!(
                !can(
                    &policy,
                    &dev,
                    verb,
                    "rbac.authorization.k8s.io",
                    "rolebindings",
                    "team-a"
                ),
                "{verb}"
            );
        }
        // admin aggregates edit and adds roles.
        let boss = user("boss", &[]);
        assert!(can(
            &policy,
            &boss,
            "create",
            "rbac.authorization.k8s.io",
            "rolebindings",
            "team-a"
        ));
        assert!(can(
            &policy,
            &boss,
            "create",
            "apps",
            "deployments",
            "team-a"
        ));
        assert!(can(&policy, &boss, "get", "", "pods", "team-a"));
        assert!(!can(
            &policy,
            &boss,
            "create",
            "rbac.authorization.k8s.io",
            "clusterroles",
            ""
        ));
    }

    #[test]
    fn masters_are_allowed_everything() {
        let policy = RbacSnapshot::default();
        let admin = user("kubernetes-admin", &["system:masters"]);
        assert!(can(&policy, &admin, "delete", "", "nodes", ""));
        assert!(can(
            &policy,
            &admin,
            "escalate",
            "rbac.authorization.k8s.io",
            "clusterroles",
            ""
        ));
        let decision = authorize(
            &Attributes::non_resource(admin, "post", "/anything"),
            &policy,
        );
        // Kubernetes' privileged-group authorizer gives no reason (a SubjectAccessReview
        // shows none).
        assert_eq!((decision.allowed, decision.reason.as_str()), (true, ""));
        // The same name without the group has nothing.
        assert!(!can(
            &policy,
            &user("kubernetes-admin", &[]),
            "get",
            "",
            "pods",
            "default"
        ));
    }

    #[test]
    fn wildcards_and_subresources_match_as_in_kubernetes() {
        let attributes = |resource: &str, subresource: &str| {
            Attributes::resource(user("u", &[]), "get", "apps", resource, "ns", "x")
                .with_subresource(subresource)
        };
        let pods_rule = rule(&["get"], &["apps"], &["deployments"]);
        assert!(rule_allows(&attributes("deployments", ""), &pods_rule));
        assert!(!rule_allows(
            &attributes("deployments", "scale"),
            &pods_rule
        ));
        let star = rule(&["*"], &["*"], &["*"]);
        assert!(rule_allows(&attributes("deployments", "scale"), &star));
        let star_scale = rule(&["get"], &["*"], &["*/scale"]);
        assert!(rule_allows(
            &attributes("deployments", "scale"),
            &star_scale
        ));
        assert!(rule_allows(
            &attributes("replicasets", "scale"),
            &star_scale
        ));
        assert!(!rule_allows(
            &attributes("deployments", "status"),
            &star_scale
        ));
        assert!(!rule_allows(&attributes("deployments", ""), &star_scale));
        let exact = rule(&["get"], &["apps"], &["deployments/scale"]);
        assert!(rule_allows(&attributes("deployments", "scale"), &exact));
        assert!(!rule_allows(&attributes("replicasets", "scale"), &exact));
        let mut named = rule(&["get"], &["apps"], &["deployments"]);
        named.resource_names = Some(vec!["x".into()]);
        assert!(rule_allows(&attributes("deployments", ""), &named));
        let mut other = attributes("deployments", "");
        other.name = "y".into();
        assert!(!rule_allows(&other, &named));
        other.name = String::new();
        assert!(!rule_allows(&other, &named), "a list is not a named get");
        // Resource rules never match non-resource requests, and vice versa.
        let urls = PolicyRule {
            verbs: vec!["get".into()],
            non_resource_urls: Some(vec!["/healthz".into(), "/apis/*".into()]),
            ..PolicyRule::default()
        };
        let path = |p: &str| Attributes::non_resource(user("u", &[]), "get", p);
        assert!(rule_allows(&path("/healthz"), &urls));
        assert!(rule_allows(&path("/apis/"), &urls));
        assert!(rule_allows(&path("/apis/apps/v1"), &urls));
        assert!(!rule_allows(&path("/apis"), &urls));
        assert!(!rule_allows(&path("/healthz/etcd"), &urls));
        assert!(!rule_allows(&attributes("deployments", ""), &urls));
        assert!(!rule_allows(&path("/healthz"), &star));
    }

    #[test]
    fn service_account_and_group_subjects() {
        let mut policy = RbacSnapshot::default();
        policy.insert_cluster_role(ClusterRole {
            metadata: meta("reader", None),
            rules: Some(vec![rule(&["get"], &[""], &["configmaps"])]),
            aggregation_rule: None,
        });
        // A ServiceAccount subject without a namespace means the RoleBinding's namespace.
        policy.insert_role_binding(role_binding(
            "sa",
            "team-a",
            "ClusterRole",
            "reader",
            vec![subject("ServiceAccount", "bot", None)],
        ));
        let bot_a = user(
            "system:serviceaccount:team-a:bot",
            &["system:serviceaccounts"],
        );
        let bot_b = user(
            "system:serviceaccount:team-b:bot",
            &["system:serviceaccounts"],
        );
        assert!(can(&policy, &bot_a, "get", "", "configmaps", "team-a"));
        assert!(!can(&policy, &bot_b, "get", "", "configmaps", "team-a"));
        // In a ClusterRoleBinding it needs its namespace, or matches nobody.
        policy.insert_cluster_role_binding(cluster_role_binding(
            "sa-nons",
            "reader",
            vec![subject("ServiceAccount", "bot", None)],
        ));
        assert!(!can(&policy, &bot_b, "get", "", "configmaps", "team-c"));
        policy.insert_cluster_role_binding(cluster_role_binding(
            "sa-b",
            "reader",
            vec![subject("ServiceAccount", "bot", Some("team-b"))],
        ));
        assert!(can(&policy, &bot_b, "get", "", "configmaps", "team-c"));
        // Groups.
        policy.insert_cluster_role_binding(cluster_role_binding(
            "all",
            "reader",
            vec![subject("Group", GROUP_AUTHENTICATED, None)],
        ));
        assert!(can(
            &policy,
            &user("anyone", &[]),
            "get",
            "",
            "configmaps",
            "x"
        ));
        assert!(!can(
            &policy,
            &UserInfo::anonymous(),
            "get",
            "",
            "configmaps",
            "x"
        ));
    }

    #[test]
    fn missing_roles_are_reported_in_the_denial() {
        let mut policy = RbacSnapshot::default();
        policy.insert_cluster_role_binding(cluster_role_binding(
            "gone",
            "nope",
            vec![subject("User", "u", None)],
        ));
        policy.insert_role_binding(role_binding(
            "gone",
            "ns",
            "Role",
            "missing",
            vec![subject("User", "u", None)],
        ));
        let decision = authorize(
            &Attributes::resource(user("u", &[]), "get", "", "pods", "ns", ""),
            &policy,
        );
        assert!(!decision.allowed);
        assert_eq!(
            decision.reason,
            "RBAC: [clusterrole.rbac.authorization.k8s.io \"nope\" not found, role.rbac.authorization.k8s.io \"missing\" not found]"
        );
        let nobody = authorize(
            &Attributes::resource(user("v", &[]), "get", "", "pods", "ns", ""),
            &policy,
        );
        assert_eq!(
            nobody,
            Decision {
                allowed: false,
                reason: String::new()
            }
        );
    }

    #[test]
    fn aggregation_follows_selectors_to_a_fixed_point() {
        let labelled = |name: &str, label: &str, rules: Vec<PolicyRule>| ClusterRole {
            metadata: ObjectMeta {
                name: Some(name.into()),
                labels: Some([(label.to_string(), "true".to_string())].into()),
                ..ObjectMeta::default()
            },
            rules: Some(rules),
            aggregation_rule: None,
        };
        let aggregating = |name: &str, label: &str, own_label: Option<&str>| ClusterRole {
            metadata: ObjectMeta {
                name: Some(name.into()),
                labels: own_label.map(|l| [(l.to_string(), "true".to_string())].into()),
                ..ObjectMeta::default()
            },
            rules: None,
            aggregation_rule: Some(AggregationRule {
                cluster_role_selectors: Some(vec![LabelSelector {
                    match_labels: Some([(label.to_string(), "true".to_string())].into()),
                    match_expressions: None,
                }]),
            }),
        };
        let read = rule(&["get"], &[""], &["pods"]);
        let write = rule(&["create"], &[""], &["pods"]);
        // Outer role first, so one pass is not enough.
        let mut roles = vec![
            aggregating("outer", "to-outer", None),
            aggregating("inner", "to-inner", Some("to-outer")),
            labelled("read", "to-inner", vec![read.clone()]),
            labelled("write", "to-outer", vec![write.clone(), read.clone()]),
        ];
        aggregate_cluster_roles(&mut roles);
        assert_eq!(roles[1].rules, Some(vec![read.clone()]));
        assert_eq!(
            roles[0].rules,
            Some(vec![read, write]),
            "union without duplicates, by name"
        );
    }

    /// The copy of the selector matcher this file had read an invalid selector as "picks
    /// nothing" and went on aggregating the role's other selectors; Kubernetes' controller
    /// fails the role's sync on it and leaves the role's rules as they are.
    #[test]
    fn an_invalid_aggregation_selector_leaves_the_role_as_it_is() {
        let read = rule(&["get"], &[""], &["pods"]);
        let own = rule(&["list"], &[""], &["pods"]);
        let selector = |operator: &str| LabelSelector {
            match_labels: None,
            match_expressions: Some(vec![LabelSelectorRequirement {
                key: "to-outer".into(),
                operator: operator.into(),
                values: None,
            }]),
        };
        let mut roles = vec![
            ClusterRole {
                metadata: ObjectMeta {
                    name: Some("outer".into()),
                    ..ObjectMeta::default()
                },
                rules: Some(vec![own.clone()]),
                aggregation_rule: Some(AggregationRule {
                    cluster_role_selectors: Some(vec![selector("Exists"), selector("Near")]),
                }),
            },
            ClusterRole {
                metadata: ObjectMeta {
                    name: Some("read".into()),
                    labels: Some([("to-outer".to_string(), "true".to_string())].into()),
                    ..ObjectMeta::default()
                },
                rules: Some(vec![read.clone()]),
                aggregation_rule: None,
            },
        ];
        aggregate_cluster_roles(&mut roles);
        assert_eq!(roles[0].rules, Some(vec![own]), "unchanged");
        // With the valid selector alone it aggregates.
        roles[0].aggregation_rule = Some(AggregationRule {
            cluster_role_selectors: Some(vec![selector("Exists")]),
        });
        aggregate_cluster_roles(&mut roles);
        assert_eq!(roles[0].rules, Some(vec![read]));
    }

    #[test]
    fn label_selector_expressions() {
        let labels: BTreeMap<String, String> = [("tier".to_string(), "web".to_string())].into();
        let expression = |operator: &str, values: &[&str]| LabelSelector {
            match_labels: None,
            match_expressions: Some(vec![LabelSelectorRequirement {
                key: "tier".into(),
                operator: operator.into(),
                values: Some(values.iter().map(|v| v.to_string()).collect()),
            }]),
        };
        assert!(selector_matches(
            &expression("In", &["web", "db"]),
            Some(&labels)
        ));
        assert!(!selector_matches(
            &expression("NotIn", &["web"]),
            Some(&labels)
        ));
        assert!(selector_matches(&expression("NotIn", &["web"]), None));
        assert!(selector_matches(&expression("Exists", &[]), Some(&labels)));
        assert!(!selector_matches(
            &expression("DoesNotExist", &[]),
            Some(&labels)
        ));
        assert!(!selector_matches(&expression("Bogus", &[]), Some(&labels)));
        assert!(
            selector_matches(&LabelSelector::default(), None),
            "empty selects everything"
        );
    }

    fn owner(
        api_version: &str,
        kind: &str,
        name: &str,
        uid: &str,
        block: Option<bool>,
    ) -> OwnerReference {
        OwnerReference {
            api_version: api_version.into(),
            kind: kind.into(),
            name: name.into(),
            uid: uid.into(),
            block_owner_deletion: block,
            controller: Some(true),
        }
    }

    #[test]
    fn only_newly_blocking_owner_refs_are_checked() {
        let old = [
            owner("apps/v1", "ReplicaSet", "a", "1", Some(true)),
            owner("v1", "Pod", "b", "2", None),
        ];
        let new = [
            owner("apps/v1", "ReplicaSet", "a", "1", Some(true)),
            owner("v1", "Pod", "b", "2", Some(true)),
            owner("v1", "Service", "c", "3", Some(true)),
            owner("v1", "Service", "d", "4", Some(false)),
        ];
        let names: Vec<&str> = new_blocking_owner_refs(&new, Some(&old))
            .iter()
            .map(|r| r.name.as_str())
            .collect();
        assert_eq!(names, ["b", "c"]);
        assert_eq!(new_blocking_owner_refs(&new, None).len(), 3);
    }

    #[test]
    fn wildcard_probe_short_circuits_owner_resolution() {
        let policy = RbacSnapshot::bootstrap();
        let owners = [owner("apps/v1", "ReplicaSet", "web-1", "u1", Some(true))];
        let blocking: Vec<&OwnerReference> = owners.iter().collect();
        let resolved = std::cell::Cell::new(0);
        let mut resolve = |r: &OwnerReference| -> Result<Vec<String>, String> {
            resolved.set(resolved.get() + 1);
            match r.kind.as_str() {
                "ReplicaSet" => Ok(vec!["replicasets".into()]),
                other => Err(format!("no kind {other}")),
            }
        };
        // The garbage collector's role allows update on */* (including finalizers): one probe,
        // no resolution.
        let gc = user(
            "system:serviceaccount:kube-system:generic-garbage-collector",
            &["system:serviceaccounts"],
        );
        let decision =
            can_set_blocking_owner_finalizers(&gc, "team-a", &blocking, &mut resolve, &policy);
        assert!(decision.allowed, "{decision:?}");
        assert_eq!(resolved.get(), 0);

        // The deployment controller has only `update deployments/finalizers`: the probe fails,
        // then its owner (a Deployment) is resolved and allowed.
        let dc = user(
            "system:serviceaccount:kube-system:deployment-controller",
            &["system:serviceaccounts"],
        );
        let deployment = [owner("apps/v1", "Deployment", "web", "u2", Some(true))];
        let blocking: Vec<&OwnerReference> = deployment.iter().collect();
        let mut resolve_deployments = |_: &OwnerReference| -> Result<Vec<String>, String> {
            resolved.set(resolved.get() + 1);
            Ok(vec!["deployments".into()])
        };
        let decision = can_set_blocking_owner_finalizers(
            &dc,
            "team-a",
            &blocking,
            &mut resolve_deployments,
            &policy,
        );
        assert!(decision.allowed, "{decision:?}");
        assert_eq!(resolved.get(), 1);

        // But it may not block a ReplicaSet's deletion.
        let blocking: Vec<&OwnerReference> = owners.iter().collect();
        let decision =
            can_set_blocking_owner_finalizers(&dc, "team-a", &blocking, &mut resolve, &policy);
        assert!(!decision.allowed);
        assert!(
            decision.reason.starts_with("cannot set blockOwnerDeletion if an ownerReference refers to a resource you can't set finalizers on"),
            "{}",
            decision.reason
        );
        // An owner kind the catalogue does not know.
        let unknown = [owner("example.com/v1", "Widget", "w", "u3", Some(true))];
        let blocking: Vec<&OwnerReference> = unknown.iter().collect();
        let decision =
            can_set_blocking_owner_finalizers(&dc, "team-a", &blocking, &mut resolve, &policy);
        assert!(
            decision
                .reason
                .contains("cannot find RESTMapping for APIVersion example.com/v1 Kind Widget"),
            "{}",
            decision.reason
        );
    }
}
