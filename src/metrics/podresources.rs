//! The kubelet PodResources API v1, generated from
//! `proto/k8s.io/kubelet/podresources/v1/api.proto` by `build.rs`.
//!
//! Generated code only; [`super::pods`] uses it.

#![allow(clippy::all, missing_docs)]

/// Messages, `pod_resources_lister_client` and `pod_resources_lister_server`.
pub mod v1 {
    include!(concat!(env!("OUT_DIR"), "/podresources/v1.rs"));
}

/// The kubelet's socket, relative to the pod-resources directory.
pub const SOCKET: &str = "kubelet.sock";
