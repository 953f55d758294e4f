//! The generated wire types: etcd's `mvccpb` and `etcdserverpb` packages and skerry's own apply
//! command, with tonic clients and servers for every etcd service.

#![allow(clippy::all, clippy::pedantic, missing_docs, reason = "generated code")]

pub mod mvccpb {
    tonic::include_proto!("mvccpb");
}

pub mod etcdserverpb {
    tonic::include_proto!("etcdserverpb");
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
