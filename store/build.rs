//! Compiles etcd's v3 API and skerry's command protos with `protox` (pure Rust, so a machine
//! without `protoc` builds) and generates prost messages plus tonic clients and servers.
//!
//! It also generates the proto3 JSON mapping of etcd's messages with `pbjson-build`, for the
//! HTTP gateway (`grpc::gateway`). etcd's gateway (grpc-gateway v1, `runtime.JSONPb{OrigName:
//! true}` in etcd 3.4's `embed/serve.go`) writes each field under the name etcd's `rpc.proto`
//! gives it. skerry's protos spell a few of them in snake case (`id`, `ttl`, `peer_urls`, where
//! etcd has `ID`, `TTL`, `peerURLs`), so before generating, every field's `json_name` is set to
//! etcd's name ([`ETCD_FIELD_NAMES`], else the proto name): pbjson writes `json_name` and reads
//! both it and the proto name. grpc-gateway also reads the lowerCamelCase JSON name
//! (`rangeEnd`), which the generated readers are then taught as a third spelling.

use std::collections::HashMap;

use prost::Message as _;

/// `(message, skerry's field name, etcd's field name)` where the two differ (etcd 3.4's
/// `etcdserver/etcdserverpb/rpc.proto`).
const ETCD_FIELD_NAMES: &[(&str, &str, &str)] = &[
    ("LeaseGrantRequest", "ttl", "TTL"),
    ("LeaseGrantRequest", "id", "ID"),
    ("LeaseGrantResponse", "id", "ID"),
    ("LeaseGrantResponse", "ttl", "TTL"),
    ("LeaseRevokeRequest", "id", "ID"),
    ("LeaseKeepAliveRequest", "id", "ID"),
    ("LeaseKeepAliveResponse", "id", "ID"),
    ("LeaseKeepAliveResponse", "ttl", "TTL"),
    ("LeaseTimeToLiveRequest", "id", "ID"),
    ("LeaseTimeToLiveResponse", "id", "ID"),
    ("LeaseTimeToLiveResponse", "ttl", "TTL"),
    ("LeaseTimeToLiveResponse", "granted_ttl", "grantedTTL"),
    ("LeaseStatus", "id", "ID"),
    ("Member", "id", "ID"),
    ("Member", "peer_urls", "peerURLs"),
    ("Member", "client_urls", "clientURLs"),
    ("Member", "is_learner", "isLearner"),
    ("MemberAddRequest", "peer_urls", "peerURLs"),
    ("MemberAddRequest", "is_learner", "isLearner"),
    ("MemberRemoveRequest", "id", "ID"),
    ("MemberUpdateRequest", "id", "ID"),
    ("MemberUpdateRequest", "peer_urls", "peerURLs"),
    ("MemberPromoteRequest", "id", "ID"),
    ("MoveLeaderRequest", "target_id", "targetID"),
    ("AlarmRequest", "member_id", "memberID"),
    ("AlarmMember", "member_id", "memberID"),
    ("StatusResponse", "db_size", "dbSize"),
    ("StatusResponse", "raft_index", "raftIndex"),
    ("StatusResponse", "raft_term", "raftTerm"),
    ("StatusResponse", "raft_applied_index", "raftAppliedIndex"),
    ("StatusResponse", "db_size_in_use", "dbSizeInUse"),
    ("StatusResponse", "is_learner", "isLearner"),
];

/// The packages the gateway speaks.
const JSON_PACKAGES: &[&str] = &[".etcdserverpb", ".mvccpb"];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protos = ["proto/kv.proto", "proto/rpc.proto", "proto/command.proto"];
    for proto in protos {
        println!("cargo:rerun-if-changed={proto}");
    }
    let file_descriptors = protox::compile(protos, ["proto"])?;

    let mut json = file_descriptors.clone();
    let renames: HashMap<(&str, &str), &str> = ETCD_FIELD_NAMES
        .iter()
        .map(|(message, field, etcd)| ((*message, *field), *etcd))
        .collect();
    for file in &mut json.file {
        for message in &mut file.message_type {
            rename_fields(message, &renames);
        }
    }
    let out_dir = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
    pbjson_build::Builder::new()
        .register_descriptors(&json.encode_to_vec())?
        // grpc-gateway v1's decoder skips fields it does not know.
        .ignore_unknown_fields()
        .build(JSON_PACKAGES)?;
    for package in JSON_PACKAGES {
        let path = out_dir.join(format!("{}.serde.rs", package.trim_start_matches('.')));
        let generated = std::fs::read_to_string(&path)?;
        std::fs::write(&path, accept_camel_case(&generated))?;
    }

    tonic_prost_build::configure()
        // Keys and values are shared between the store, watch events and responses without copies.
        .bytes(".")
        .compile_fds(file_descriptors)?;
    Ok(())
}

/// Sets every field's `json_name` to etcd's name for it, nested messages included.
fn rename_fields(
    message: &mut prost_types::DescriptorProto,
    renames: &HashMap<(&str, &str), &str>,
) {
    let message_name = message.name().to_string();
    for field in &mut message.field {
        let name = field.name().to_string();
        let etcd = renames
            .get(&(message_name.as_str(), name.as_str()))
            .map_or(name.clone(), |etcd| (*etcd).to_string());
        field.json_name = Some(etcd);
    }
    for nested in &mut message.nested_type {
        rename_fields(nested, renames);
    }
}

/// protoc's JSON name of a field: underscores dropped, the letter after each one upper-cased.
fn lower_camel(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    let mut upper = false;
    for c in name.chars() {
        if c == '_' {
            upper = true;
        } else if upper {
            out.extend(c.to_uppercase());
            upper = false;
        } else {
            out.push(c);
        }
    }
    out
}

/// Adds the lowerCamelCase spelling to each field-name arm of the generated readers
/// (`"range_end" => Ok(GeneratedField::RangeEnd)` also matches `"rangeEnd"`).
fn accept_camel_case(generated: &str) -> String {
    let mut out = String::with_capacity(generated.len() + generated.len() / 8);
    for line in generated.lines() {
        let arm = line
            .split_once(" => Ok(GeneratedField::")
            .filter(|(names, _)| names.trim_start().starts_with('"'));
        if let Some((names, rest)) = arm {
            let indent = &names[..names.len() - names.trim_start().len()];
            let mut spellings: Vec<String> = names
                .trim()
                .split(" | ")
                .map(|quoted| quoted.trim_matches('"').to_string())
                .collect();
            let camel: Vec<String> = spellings.iter().map(|s| lower_camel(s)).collect();
            for c in camel {
                if !spellings.contains(&c) {
                    spellings.push(c);
                }
            }
            let arms: Vec<String> = spellings.iter().map(|s| format!("\"{s}\"")).collect();
            out.push_str(indent);
            out.push_str(&arms.join(" | "));
            out.push_str(" => Ok(GeneratedField::");
            out.push_str(rest);
        } else {
            out.push_str(line);
        }
        out.push('\n');
    }
    out
}
