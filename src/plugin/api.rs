//! The kubelet device plugin API v1beta1, generated from
//! `proto/k8s.io/kubelet/deviceplugin/v1beta1/api.proto` by `build.rs`.
//!
//! Generated code only; the behaviour lives in the sibling modules.

#![allow(clippy::all, missing_docs)]

/// Messages, `registration_client`/`registration_server` and
/// `device_plugin_client`/`device_plugin_server`.
pub mod v1beta1 {
    include!(concat!(env!("OUT_DIR"), "/deviceplugin/v1beta1.rs"));
}

/// API version sent in `RegisterRequest.version`.
pub const VERSION: &str = "v1beta1";
/// `Device.health` of a device that can be allocated.
pub const HEALTHY: &str = "Healthy";
/// `Device.health` of a device that must not be allocated.
pub const UNHEALTHY: &str = "Unhealthy";
/// Name of the kubelet's registration socket inside the device plugin directory.
pub const KUBELET_SOCKET: &str = "kubelet.sock";
