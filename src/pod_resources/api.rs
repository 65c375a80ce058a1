//! The kubelet PodResources API v1, generated from
//! `proto/k8s.io/kubelet/podresources/v1/api.proto` by `build.rs`.
//!
//! Generated code only; [`super::list`] is its client here, and the test
//! kubelet serves it.

#![allow(clippy::all, missing_docs)]

/// Messages, `pod_resources_lister_client` and `pod_resources_lister_server`.
pub mod v1 {
    include!(concat!(env!("OUT_DIR"), "/podresources/v1.rs"));
}
