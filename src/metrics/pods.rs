//! Which pod holds which GPU, from the kubelet's PodResources API (`List` on
//! `<kubelet-dir>/pod-resources/kubelet.sock`).
//!
//! The kubelet reports devices by the IDs the device plugin advertised; they are
//! matched against [`crate::telemetry::devices::device_ids`], so both sides use the device
//! plugin's naming; a shared device's replicas (`<id>::<n>`) are their device,
//! and every container holding one of them is the device's. Only `amd.com/*`
//! resources are considered. A missing socket
//! (no kubelet, standalone mode) means no pod labels, not an error. [`assign`] is
//! pure; [`list`] does the I/O.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Serialize;
use tonic::transport::Endpoint;

use super::podresources::v1::pod_resources_lister_client::PodResourcesListerClient;
use super::podresources::v1::{ListPodResourcesRequest, ListPodResourcesResponse};
use crate::plugin::DeviceRef;
use crate::plugin::devices::{RESOURCE_NAMESPACE, parent_id};

/// The container a device is allocated to.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct PodRef {
    pub pod: String,
    pub namespace: String,
    pub container: String,
    /// The pod's UID and labels, from the API server (see
    /// [`super::pod_metadata`]); empty without one.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub uid: String,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
}

#[derive(Debug, thiserror::Error)]
pub enum PodResourcesError {
    #[error("{socket}: cannot connect to the kubelet's PodResources API: {source}")]
    Connect {
        socket: PathBuf,
        #[source]
        source: tonic::transport::Error,
    },
    #[error("{socket}: PodResources List failed: {status}")]
    List {
        socket: PathBuf,
        status: Box<tonic::Status>,
    },
    #[error("{socket}: PodResources List did not answer within {timeout:?}")]
    Timeout { socket: PathBuf, timeout: Duration },
    #[error("{socket}: the socket path is not UTF-8")]
    NonUtf8Path { socket: PathBuf },
}

/// Asks the kubelet which devices each container holds. `Ok(None)` when the
/// socket does not exist.
pub async fn list(
    socket: &Path,
    timeout: Duration,
) -> Result<Option<ListPodResourcesResponse>, PodResourcesError> {
    if !socket.exists() {
        return Ok(None);
    }
    let uri = socket
        .to_str()
        .map(|s| format!("unix://{s}"))
        .ok_or_else(|| PodResourcesError::NonUtf8Path {
            socket: socket.to_path_buf(),
        })?;
    let call = async {
        let channel = Endpoint::from_shared(uri)
            .map_err(|source| PodResourcesError::Connect {
                socket: socket.to_path_buf(),
                source,
            })?
            .connect()
            .await
            .map_err(|source| PodResourcesError::Connect {
                socket: socket.to_path_buf(),
                source,
            })?;
        PodResourcesListerClient::new(channel)
            .list(ListPodResourcesRequest {})
            .await
            .map(|r| Some(r.into_inner()))
            .map_err(|status| PodResourcesError::List {
                socket: socket.to_path_buf(),
                status: Box::new(status),
            })
    };
    tokio::time::timeout(timeout, call)
        .await
        .unwrap_or_else(|_| {
            Err(PodResourcesError::Timeout {
                socket: socket.to_path_buf(),
                timeout,
            })
        })
}

/// The containers holding each device: one, or several sharing it.
pub type DevicePods = BTreeMap<DeviceRef, Vec<PodRef>>;

/// The containers holding each known device, in the kubelet's order, each
/// once. Devices the kubelet reports that this host does not know (another
/// vendor, a stale checkpoint) are skipped.
pub fn assign(
    response: &ListPodResourcesResponse,
    ids: &BTreeMap<String, DeviceRef>,
) -> DevicePods {
    let prefix = format!("{RESOURCE_NAMESPACE}/");
    let mut out = BTreeMap::new();
    for pod in &response.pod_resources {
        for container in &pod.containers {
            for devices in container
                .devices
                .iter()
                .filter(|d| d.resource_name.starts_with(&prefix))
            {
                for id in &devices.device_ids {
                    if let Some(device) = ids.get(parent_id(id)) {
                        let holder = PodRef {
                            pod: pod.name.clone(),
                            namespace: pod.namespace.clone(),
                            container: container.name.clone(),
                            ..PodRef::default()
                        };
                        let holders: &mut Vec<PodRef> = out.entry(device.clone()).or_default();
                        if !holders.contains(&holder) {
                            holders.push(holder);
                        }
                    }
                }
            }
        }
    }
    out
}

/// The pods of a device: its own entry, or for a partition of a GPU
/// allocated whole, the GPU's; none when no container holds it.
pub fn pods_of<'a>(pods: &'a DevicePods, device: &DeviceRef) -> &'a [PodRef] {
    pods.get(device)
        .or_else(|| pods.get(&DeviceRef::gpu(device.bdf.clone())))
        .map_or(&[], Vec::as_slice)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::podresources::v1::{ContainerDevices, ContainerResources, PodResources};

    fn response() -> ListPodResourcesResponse {
        let devices = |resource: &str, ids: &[&str]| ContainerDevices {
            resource_name: resource.into(),
            device_ids: ids.iter().map(|s| s.to_string()).collect(),
            topology: None,
        };
        ListPodResourcesResponse {
            pod_resources: vec![
                PodResources {
                    name: "train".into(),
                    namespace: "ml".into(),
                    containers: vec![ContainerResources {
                        name: "worker".into(),
                        devices: vec![
                            devices("amd.com/gpu", &["0000:05:00.0", "amdgpu_xcp_3"]),
                            devices("example.com/nic", &["0000:27:00.0"]),
                        ],
                        ..ContainerResources::default()
                    }],
                },
                PodResources {
                    name: "other".into(),
                    namespace: "default".into(),
                    containers: vec![ContainerResources {
                        name: "c".into(),
                        devices: vec![devices("amd.com/cpx_nps4", &["unknown-id"])],
                        ..ContainerResources::default()
                    }],
                },
            ],
        }
    }

    #[test]
    fn devices_map_to_their_containers() {
        let ids = BTreeMap::from([
            (
                "0000:05:00.0".to_owned(),
                DeviceRef::partition("0000:05:00.0", 0),
            ),
            (
                "amdgpu_xcp_3".to_owned(),
                DeviceRef::partition("0000:05:00.0", 4),
            ),
            ("0000:27:00.0".to_owned(), DeviceRef::gpu("0000:27:00.0")),
        ]);
        let pods = assign(&response(), &ids);
        let train = PodRef {
            pod: "train".into(),
            namespace: "ml".into(),
            container: "worker".into(),
            ..PodRef::default()
        };
        assert_eq!(
            pods,
            BTreeMap::from([
                (DeviceRef::partition("0000:05:00.0", 0), vec![train.clone()]),
                (DeviceRef::partition("0000:05:00.0", 4), vec![train.clone()]),
            ]),
            "the NIC resource and the unknown ID are not GPUs"
        );
        assert_eq!(
            pods_of(&pods, &DeviceRef::partition("0000:05:00.0", 4)),
            [train]
        );
        assert!(pods_of(&pods, &DeviceRef::partition("0000:05:00.0", 1)).is_empty());
    }

    #[test]
    fn a_partition_of_a_gpu_allocated_whole_belongs_to_that_pod() {
        let pod = PodRef {
            pod: "p".into(),
            ..PodRef::default()
        };
        let pods = BTreeMap::from([(DeviceRef::gpu("0000:05:00.0"), vec![pod.clone()])]);
        assert_eq!(
            pods_of(&pods, &DeviceRef::partition("0000:05:00.0", 2)),
            [pod]
        );
    }

    #[test]
    fn replicas_of_a_shared_gpu_list_every_container_once() {
        let holder = |pod: &str, container: &str, ids: &[&str]| PodResources {
            name: pod.into(),
            namespace: "ml".into(),
            containers: vec![ContainerResources {
                name: container.into(),
                devices: vec![ContainerDevices {
                    resource_name: "amd.com/gpu".into(),
                    device_ids: ids.iter().map(|s| s.to_string()).collect(),
                    topology: None,
                }],
                ..ContainerResources::default()
            }],
        };
        let response = ListPodResourcesResponse {
            pod_resources: vec![
                holder("a", "main", &["0000:05:00.0::0", "0000:05:00.0::1"]),
                holder("b", "main", &["0000:05:00.0::2"]),
                holder("c", "main", &["0000:27:00.0::0"]),
            ],
        };
        let ids = BTreeMap::from([
            ("0000:05:00.0".to_owned(), DeviceRef::gpu("0000:05:00.0")),
            ("0000:27:00.0".to_owned(), DeviceRef::gpu("0000:27:00.0")),
        ]);
        let pods = assign(&response, &ids);
        let names: Vec<&str> = pods_of(&pods, &DeviceRef::gpu("0000:05:00.0"))
            .iter()
            .map(|p| p.pod.as_str())
            .collect();
        assert_eq!(
            names,
            ["a", "b"],
            "two replicas in one container count once"
        );
        assert_eq!(pods_of(&pods, &DeviceRef::gpu("0000:27:00.0")).len(), 1);
    }

    #[tokio::test]
    async fn a_missing_socket_is_no_pods() {
        let dir = tempfile::tempdir().unwrap();
        let answer = list(&dir.path().join("kubelet.sock"), Duration::from_secs(1))
            .await
            .unwrap();
        assert!(answer.is_none());
    }
}
