//! Typed decoding per served kind: the catalogue names each resource's OpenAPI definition,
//! and this maps it to the k8s-openapi type that [`crate::strict`] decodes into.

use k8s_openapi::api::{
    apps, authentication, authorization, autoscaling, coordination, core, discovery, policy, rbac,
    scheduling,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::DeleteOptions;

use crate::catalogue::ResourceInfo;
use crate::status::ApiError;
use crate::strict::{self, Decoded, FieldValidation};

macro_rules! by_definition {
    ($definition:expr, $call:ident, $args:tt ; $($name:literal => $ty:ty),* $(,)?) => {
        match $definition {
            $($name => strict::$call::<$ty> $args,)*
            other => Err(ApiError::internal(format!("no typed decoder for {other}"))),
        }
    };
}

macro_rules! kinds {
    ($definition:expr, $call:ident, $args:tt) => {
        by_definition!($definition, $call, $args ;
            "io.k8s.api.core.v1.Namespace" => core::v1::Namespace,
            "io.k8s.api.core.v1.Pod" => core::v1::Pod,
            "io.k8s.api.core.v1.Node" => core::v1::Node,
            "io.k8s.api.core.v1.Service" => core::v1::Service,
            "io.k8s.api.core.v1.Endpoints" => core::v1::Endpoints,
            "io.k8s.api.core.v1.ConfigMap" => core::v1::ConfigMap,
            "io.k8s.api.core.v1.Secret" => core::v1::Secret,
            "io.k8s.api.core.v1.ServiceAccount" => core::v1::ServiceAccount,
            "io.k8s.api.core.v1.Event" => core::v1::Event,
            "io.k8s.api.core.v1.Binding" => core::v1::Binding,
            "io.k8s.api.apps.v1.Deployment" => apps::v1::Deployment,
            "io.k8s.api.apps.v1.ReplicaSet" => apps::v1::ReplicaSet,
            "io.k8s.api.apps.v1.DaemonSet" => apps::v1::DaemonSet,
            "io.k8s.api.apps.v1.StatefulSet" => apps::v1::StatefulSet,
            "io.k8s.api.policy.v1.PodDisruptionBudget" => policy::v1::PodDisruptionBudget,
            "io.k8s.api.scheduling.v1.PriorityClass" => scheduling::v1::PriorityClass,
            "io.k8s.api.discovery.v1.EndpointSlice" => discovery::v1::EndpointSlice,
            "io.k8s.api.coordination.v1.Lease" => coordination::v1::Lease,
            "io.k8s.api.rbac.v1.Role" => rbac::v1::Role,
            "io.k8s.api.rbac.v1.RoleBinding" => rbac::v1::RoleBinding,
            "io.k8s.api.rbac.v1.ClusterRole" => rbac::v1::ClusterRole,
            "io.k8s.api.rbac.v1.ClusterRoleBinding" => rbac::v1::ClusterRoleBinding,
            "io.k8s.api.authorization.v1.SelfSubjectAccessReview" => authorization::v1::SelfSubjectAccessReview,
            "io.k8s.api.authorization.v1.SubjectAccessReview" => authorization::v1::SubjectAccessReview,
            "io.k8s.api.authorization.v1.LocalSubjectAccessReview" => authorization::v1::LocalSubjectAccessReview,
            "io.k8s.api.authentication.v1.SelfSubjectReview" => authentication::v1::SelfSubjectReview,
            "io.k8s.api.authentication.v1.TokenReview" => authentication::v1::TokenReview,
            "io.k8s.api.authentication.v1.TokenRequest" => authentication::v1::TokenRequest,
            "io.k8s.api.autoscaling.v1.Scale" => autoscaling::v1::Scale,
            "io.k8s.apimachinery.pkg.apis.meta.v1.DeleteOptions" => DeleteOptions,
        )
    };
}

/// Decodes a JSON request body for `resource` strictly (see [`crate::strict`]).
pub fn decode_body(
    resource: &ResourceInfo,
    body: &[u8],
    validation: FieldValidation,
) -> Result<Decoded, ApiError> {
    let api_version = resource.api_version();
    kinds!(
        resource.definition,
        decode,
        (body, validation, (&api_version, resource.kind))
    )
}

/// Decodes a JSON body of the kind `definition` with the given type meta defaults (a
/// subresource body: `Scale`, `Binding`, `TokenRequest`, `DeleteOptions`).
pub fn decode_definition(
    definition: &str,
    body: &[u8],
    validation: FieldValidation,
    type_meta: (&str, &str),
) -> Result<Decoded, ApiError> {
    kinds!(definition, decode, (body, validation, type_meta))
}

/// Re-checks an object built by the server (a patched object, a protobuf body turned into
/// JSON) against `resource`'s type: unknown fields become warnings or, under Strict, errors.
pub fn decode_value(
    resource: &ResourceInfo,
    value: serde_json::Value,
    validation: FieldValidation,
) -> Result<Decoded, ApiError> {
    kinds!(resource.definition, decode_parsed, (value, validation))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalogue::RESOURCES;

    #[test]
    fn every_served_kind_has_a_decoder() {
        for r in RESOURCES {
            let body = format!(
                r#"{{"apiVersion":"{}","kind":"{}","metadata":{{"name":"x"}}}}"#,
                r.api_version(),
                r.kind
            );
            match decode_body(r, body.as_bytes(), FieldValidation::Ignore) {
                Ok(d) => assert_eq!(d.object["metadata"]["name"], "x"),
                // Kinds with required fields refuse a bare object; that is a 400, not a
                // missing decoder.
                Err(e) => assert_eq!(e.code, 400, "{}: {}", r.resource, e.message),
            }
        }
    }
}
