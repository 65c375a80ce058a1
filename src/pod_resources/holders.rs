//! Which pod holds which GPU, from a PodResources `List` answer. Pure.
//!
//! The kubelet reports devices by the IDs the device plugin advertised; they are
//! matched against [`crate::telemetry::devices::device_ids`], so both sides use the device
//! plugin's naming; a shared device's replicas (`<id>::<n>`) are their device,
//! and every container holding one of them is the device's. Only `amd.com/*`
//! resources are considered. DRA claims are matched by our driver's device
//! names ([`pods_holding`]).

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;

use super::api::v1::ListPodResourcesResponse;
use crate::plugin::DeviceRef;
use crate::plugin::devices::{RESOURCE_NAMESPACE, parent_id};

/// The container a device is allocated to.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct PodRef {
    pub pod: String,
    pub namespace: String,
    pub container: String,
    /// The pod's UID and labels, from the API server (see
    /// [`crate::metrics::pod_metadata`]); empty without one.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub uid: String,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
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

/// The pods (`namespace/name`, sorted) that hold GPU `bdf` or one of its
/// partitions: through the device plugin, as [`assign`] assigns them
/// (`device_ids` are the advertised IDs; a shared device's replicas are
/// their device), or through DRA
/// (`dra_devices`: our driver's device name to GPU address). Pure.
pub fn pods_holding(
    response: &ListPodResourcesResponse,
    device_ids: &BTreeMap<String, DeviceRef>,
    dra_devices: &BTreeMap<String, String>,
    bdf: &str,
) -> Vec<String> {
    let mut pods: BTreeSet<String> = assign(response, device_ids)
        .iter()
        .filter(|(device, _)| device.bdf == bdf)
        .flat_map(|(_, holders)| holders)
        .map(|holder| format!("{}/{}", holder.namespace, holder.pod))
        .collect();
    for pod in &response.pod_resources {
        let by_claim = pod
            .containers
            .iter()
            .flat_map(|c| &c.dynamic_resources)
            .flat_map(|r| &r.claim_resources)
            .filter(|c| c.driver_name == crate::dra::DRIVER_NAME)
            .any(|c| dra_devices.get(&c.device_name).is_some_and(|b| b == bdf));
        if by_claim {
            pods.insert(format!("{}/{}", pod.namespace, pod.name));
        }
    }
    pods.into_iter().collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pod_resources::api::v1::{ContainerDevices, ContainerResources, PodResources};

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

    #[test]
    fn the_pods_on_a_gpu_are_found_through_the_plugin_and_dra() {
        use crate::pod_resources::api::v1::{
            ClaimResource, ContainerDevices, ContainerResources, DynamicResource, PodResources,
        };
        let pod =
            |name: &str, devices: Vec<ContainerDevices>, dra: Vec<DynamicResource>| PodResources {
                name: name.into(),
                namespace: "ml".into(),
                containers: vec![ContainerResources {
                    name: "main".into(),
                    devices,
                    dynamic_resources: dra,
                    ..ContainerResources::default()
                }],
            };
        let plugin = |resource: &str, id: &str| ContainerDevices {
            resource_name: resource.into(),
            device_ids: vec![id.into()],
            topology: None,
        };
        let claim = |driver: &str, device: &str| DynamicResource {
            claim_name: "gpu".into(),
            claim_namespace: "ml".into(),
            claim_resources: vec![ClaimResource {
                driver_name: driver.into(),
                device_name: device.into(),
                ..ClaimResource::default()
            }],
        };
        let response = ListPodResourcesResponse {
            pod_resources: vec![
                pod(
                    "on-gpu",
                    vec![plugin("amd.com/gpu", "0000:03:00.0")],
                    vec![],
                ),
                pod(
                    "on-a-share",
                    vec![plugin("amd.com/gpu", "0000:03:00.0::3")],
                    vec![],
                ),
                pod(
                    "on-partition",
                    vec![plugin("amd.com/cpx_nps1", "amdgpu_xcp_2")],
                    vec![],
                ),
                pod(
                    "elsewhere",
                    vec![plugin("amd.com/gpu", "0000:04:00.0")],
                    vec![],
                ),
                pod(
                    "other-vendor",
                    vec![plugin("example.com/gpu", "0000:03:00.0")],
                    vec![],
                ),
                pod(
                    "by-claim",
                    vec![],
                    vec![claim(crate::dra::DRIVER_NAME, "gpu-1-129")],
                ),
                pod(
                    "foreign-claim",
                    vec![],
                    vec![claim("example.com", "gpu-1-129")],
                ),
            ],
        };
        let ids = BTreeMap::from([
            (
                "0000:03:00.0".to_owned(),
                DeviceRef::partition("0000:03:00.0", 0),
            ),
            (
                "amdgpu_xcp_2".to_owned(),
                DeviceRef::partition("0000:03:00.0", 2),
            ),
            ("0000:04:00.0".to_owned(), DeviceRef::gpu("0000:04:00.0")),
        ]);
        let dra = BTreeMap::from([("gpu-1-129".to_owned(), "0000:03:00.0".to_owned())]);
        assert_eq!(
            pods_holding(&response, &ids, &dra, "0000:03:00.0"),
            [
                "ml/by-claim",
                "ml/on-a-share",
                "ml/on-gpu",
                "ml/on-partition"
            ]
        );
    }
}
