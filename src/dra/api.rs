//! The kubelet's plugin registration, DRA and DRA resource health APIs,
//! generated from `proto/k8s.io/kubelet/{pluginregistration,dra,dra-health}`
//! by `build.rs`.
//!
//! Generated code only; the behaviour lives in the sibling modules.

#![allow(clippy::all, missing_docs)]

/// `pluginregistration.Registration`, served by every kubelet plugin on its
/// registration socket.
pub mod registration {
    include!(concat!(
        env!("OUT_DIR"),
        "/pluginregistration/pluginregistration.rs"
    ));
}

/// `k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin` (Kubernetes 1.34 and later).
pub mod dra_v1 {
    include!(concat!(
        env!("OUT_DIR"),
        "/dra-v1/k8s.io.kubelet.pkg.apis.dra.v1.rs"
    ));
}

/// `k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin` (Kubernetes 1.32 and later).
pub mod dra_v1beta1 {
    include!(concat!(
        env!("OUT_DIR"),
        "/dra-v1beta1/k8s.io.kubelet.pkg.apis.dra.v1beta1.rs"
    ));
}

/// `v1alpha1.DRAResourceHealth`, the health stream kubelets up to 1.36 call.
pub mod health_v1alpha1 {
    include!(concat!(env!("OUT_DIR"), "/dra-health-v1alpha1/v1alpha1.rs"));
}

/// `v1beta1.DRAResourceHealth`.
pub mod health_v1beta1 {
    include!(concat!(env!("OUT_DIR"), "/dra-health-v1beta1/v1beta1.rs"));
}

/// `v1.DRAResourceHealth`, which newer kubelets prefer.
pub mod health_v1 {
    include!(concat!(env!("OUT_DIR"), "/dra-health-v1/v1.rs"));
}

/// `PluginInfo.type` of a DRA plugin.
pub const PLUGIN_TYPE: &str = "DRAPlugin";
/// The services this plugin offers, as `PluginInfo.supported_versions` names
/// them. The kubelet picks the DRA and the health version it prefers among
/// those listed; newest first here too, for kubelets that take the first
/// they know.
pub const SUPPORTED_VERSIONS: &[&str] = &[
    "v1.DRAPlugin",
    "v1beta1.DRAPlugin",
    "v1.DRAResourceHealth",
    "v1beta1.DRAResourceHealth",
    "v1alpha1.DRAResourceHealth",
];
