//! Which pods hold which GPU, from the kubelet's PodResources API (`List` on
//! `<kubelet-dir>/pod-resources/kubelet.sock`): the socket's place
//! ([`socket`]), the client ([`list`]) and the pure mapping of its answer to
//! devices ([`assign`], [`pods_of`]) and to one GPU, DRA claims included
//! ([`pods_holding`]). The generated protocol is [`api`].
//!
//! Both the metrics exporter (pod labels, the reference's health socket) and
//! the agent's side of remediation (the pods a GPU reset would pull a GPU
//! from) read it, so it sits below both. This module must not render, cache
//! or publish what it finds, nor talk to the Kubernetes API (pod UIDs and
//! labels are the exporter's, [`crate::metrics::pod_metadata`]); each caller
//! decides what a missing or failing kubelet means for it.

pub mod api;
mod client;
mod holders;

use std::path::{Path, PathBuf};

pub use client::{PodResourcesError, list};
pub use holders::{DevicePods, PodRef, assign, pods_holding, pods_of};

/// The kubelet's socket, relative to the pod-resources directory.
const SOCKET: &str = "kubelet.sock";

/// The kubelet's PodResources socket for a `podResourceAPISocketPath` value
/// (the directory of the socket): at its default it follows `kubelet_dir`,
/// like the device plugin's socket directory does.
pub fn socket(spec_dir: &str, kubelet_dir: &Path) -> PathBuf {
    let dir = if spec_dir.is_empty() || spec_dir == crate::api::types::DEFAULT_POD_RESOURCES_PATH {
        kubelet_dir.join("pod-resources")
    } else {
        PathBuf::from(spec_dir)
    };
    dir.join(SOCKET)
}
