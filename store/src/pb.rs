//! The generated wire types: etcd's `mvccpb` and `etcdserverpb` packages and skerry's own apply
//! command, with tonic clients and servers for every etcd service.

#![allow(clippy::all, clippy::pedantic, missing_docs, reason = "generated code")]

pub mod mvccpb {
    tonic::include_proto!("mvccpb");
    // The proto3 JSON mapping with etcd's field names, for the HTTP gateway (see build.rs).
    include!(concat!(env!("OUT_DIR"), "/mvccpb.serde.rs"));
}

pub mod etcdserverpb {
    tonic::include_proto!("etcdserverpb");
    include!(concat!(env!("OUT_DIR"), "/etcdserverpb.serde.rs"));
}

/// skerry's own packages, nested as their proto package names so generated paths resolve.
pub mod skerry {
    pub mod store {
        pub mod v1 {
            tonic::include_proto!("skerry.store.v1");
        }
    }
}

pub use skerry::store::v1 as command;
