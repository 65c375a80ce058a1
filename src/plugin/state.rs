//! The snapshot one resource server answers from, and the pure answers derived
//! from it: the `ListAndWatch` device list and `Allocate` responses.
//!
//! A [`ResourceState`] is immutable; the service replaces it through a
//! `tokio::sync::watch` channel whenever devices or their health change. This
//! module must not do I/O.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use super::api::{self, v1beta1};
use super::devices::{PluginDevice, TimeSlicing, resource_name};
use super::health::Health;
use super::preferred::{Topology, preferred_allocation, preferred_replicas};

/// Always handed to containers: the single KFD compute interface of the host.
pub const KFD_PATH: &str = "/dev/kfd";

/// A device together with its current health.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AdvertisedDevice {
    pub device: PluginDevice,
    pub health: Health,
}

/// Everything a resource server needs to answer the kubelet.
#[derive(Clone, Debug, Default)]
pub struct ResourceState {
    /// Short resource name (`gpu`, `cpx_nps4`).
    pub short_name: String,
    pub devices: Vec<AdvertisedDevice>,
    pub topology: Arc<Topology>,
    /// How the devices are shared (replicas, the one-replica rule).
    pub sharing: TimeSlicing,
    index: HashMap<String, usize>,
}

/// Why `Allocate` refused a device.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AllocateError {
    #[error("unknown device id {id:?} for {resource}")]
    Unknown { id: String, resource: String },
    #[error("device {id:?} of {resource} is unhealthy: {reason}")]
    Unhealthy {
        id: String,
        resource: String,
        reason: String,
    },
    /// NVIDIA's plugin's wording, so that runbooks match.
    #[error(
        "request for '{resource}: {requested}' too large: maximum request size for shared resources is 1"
    )]
    SharedRequestTooLarge { resource: String, requested: usize },
}

impl From<AllocateError> for tonic::Status {
    fn from(e: AllocateError) -> Self {
        match e {
            AllocateError::Unknown { .. } | AllocateError::SharedRequestTooLarge { .. } => {
                tonic::Status::invalid_argument(e.to_string())
            }
            AllocateError::Unhealthy { .. } => tonic::Status::failed_precondition(e.to_string()),
        }
    }
}

impl ResourceState {
    pub fn new(
        short_name: impl Into<String>,
        devices: Vec<AdvertisedDevice>,
        topology: Arc<Topology>,
    ) -> Self {
        let index = devices
            .iter()
            .enumerate()
            .map(|(i, d)| (d.device.id.clone(), i))
            .collect();
        Self {
            short_name: short_name.into(),
            devices,
            topology,
            sharing: TimeSlicing::default(),
            index,
        }
    }

    /// The same, its devices shared as `sharing` says.
    pub fn shared(self, sharing: TimeSlicing) -> Self {
        Self { sharing, ..self }
    }

    /// The `GetPreferredAllocation` answer for one container.
    pub fn preferred(
        &self,
        available: &[String],
        must_include: &[String],
        size: usize,
    ) -> Vec<String> {
        if self.sharing.is_shared() {
            preferred_replicas(&self.topology, available, must_include, size)
        } else {
            preferred_allocation(&self.topology, available, must_include, size)
        }
    }

    /// `amd.com/<short>`.
    pub fn resource_name(&self) -> String {
        resource_name(&self.short_name)
    }

    pub fn get(&self, id: &str) -> Option<&AdvertisedDevice> {
        self.index.get(id).map(|&i| &self.devices[i])
    }

    pub fn healthy_count(&self) -> usize {
        self.devices
            .iter()
            .filter(|d| d.health.is_healthy())
            .count()
    }

    /// The device list as `ListAndWatch` sends it. A device without a NUMA node
    /// carries no topology, which tells the kubelet's topology manager that it
    /// has no preference.
    pub fn list(&self) -> Vec<v1beta1::Device> {
        self.devices
            .iter()
            .map(|d| v1beta1::Device {
                id: d.device.id.clone(),
                health: if d.health.is_healthy() {
                    api::HEALTHY
                } else {
                    api::UNHEALTHY
                }
                .to_owned(),
                topology: d.device.numa_node.map(|id| v1beta1::TopologyInfo {
                    nodes: vec![v1beta1::NumaNode { id }],
                }),
            })
            .collect()
    }

    /// The answer for one container: `/dev/kfd` plus the DRM card and render
    /// node of every device, read-write, at the same path inside the container.
    /// Paths are host paths as the container runtime sees them, never mapped
    /// under the agent's host root. Fails on the first unknown or unhealthy ID,
    /// and, when shared devices are given one replica per container at most,
    /// on a request for more. Replicas of one device give its nodes once.
    pub fn allocate_container(
        &self,
        ids: &[String],
    ) -> Result<v1beta1::ContainerAllocateResponse, AllocateError> {
        if self.sharing.is_shared() && self.sharing.fail_requests_greater_than_one && ids.len() > 1
        {
            return Err(AllocateError::SharedRequestTooLarge {
                resource: self.resource_name(),
                requested: ids.len(),
            });
        }
        let mut paths = vec![KFD_PATH.to_owned()];
        let mut seen = BTreeSet::from([KFD_PATH.to_owned()]);
        for id in ids {
            let Some(d) = self.get(id) else {
                return Err(AllocateError::Unknown {
                    id: id.clone(),
                    resource: self.resource_name(),
                });
            };
            if let Health::Unhealthy { reason } = &d.health {
                return Err(AllocateError::Unhealthy {
                    id: id.clone(),
                    resource: self.resource_name(),
                    reason: reason.clone(),
                });
            }
            for node in d.device.dri_nodes() {
                if seen.insert(node.clone()) {
                    paths.push(node);
                }
            }
        }
        Ok(v1beta1::ContainerAllocateResponse {
            devices: paths
                .into_iter()
                .map(|path| v1beta1::DeviceSpec {
                    container_path: path.clone(),
                    host_path: path,
                    permissions: "rw".to_owned(),
                })
                .collect(),
            ..Default::default()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state() -> ResourceState {
        let dev = |id: &str, card: u32, numa: Option<i64>, health: Health| AdvertisedDevice {
            device: PluginDevice {
                id: id.into(),
                gpu_bdf: "0000:05:00.0".into(),
                partition: None,
                numa_node: numa,
                card: Some(card),
                render_minor: Some(128 + card),
            },
            health,
        };
        ResourceState::new(
            "gpu",
            vec![
                dev("a", 0, Some(1), Health::Healthy),
                dev("b", 1, None, Health::Healthy),
                dev(
                    "c",
                    2,
                    Some(0),
                    Health::Unhealthy {
                        reason: "/dev/dri/renderD130 does not exist".into(),
                    },
                ),
            ],
            Arc::default(),
        )
    }

    #[test]
    fn list_carries_health_and_numa() {
        let list = state().list();
        assert_eq!(list.len(), 3);
        assert_eq!(list[0].health, "Healthy");
        assert_eq!(list[0].topology.as_ref().unwrap().nodes[0].id, 1);
        assert_eq!(list[1].topology, None);
        assert_eq!(list[2].health, "Unhealthy");
    }

    #[test]
    fn allocate_hands_out_kfd_and_each_devices_nodes() {
        let resp = state()
            .allocate_container(&["b".into(), "a".into(), "a".into()])
            .unwrap();
        let paths: Vec<_> = resp.devices.iter().map(|d| d.host_path.as_str()).collect();
        assert_eq!(
            paths,
            [
                "/dev/kfd",
                "/dev/dri/card1",
                "/dev/dri/renderD129",
                "/dev/dri/card0",
                "/dev/dri/renderD128"
            ]
        );
        assert!(
            resp.devices
                .iter()
                .all(|d| d.permissions == "rw" && d.container_path == d.host_path)
        );
    }

    #[test]
    fn shared_devices_refuse_more_than_one_replica_only_when_asked() {
        let sharing = TimeSlicing {
            replicas: 2,
            rename: false,
            fail_requests_greater_than_one: true,
        };
        let s = state().shared(sharing);
        let err = s.allocate_container(&["a".into(), "b".into()]).unwrap_err();
        let status = tonic::Status::from(err);
        assert_eq!(status.code(), tonic::Code::InvalidArgument);
        assert_eq!(
            status.message(),
            "request for 'amd.com/gpu: 2' too large: maximum request size for shared resources is 1"
        );
        assert!(s.allocate_container(&["a".into()]).is_ok());
        let lenient = state().shared(TimeSlicing {
            fail_requests_greater_than_one: false,
            ..sharing
        });
        assert!(
            lenient
                .allocate_container(&["a".into(), "b".into()])
                .is_ok()
        );
    }

    #[test]
    fn allocate_rejects_unknown_and_unhealthy_ids() {
        let s = state();
        let err = s
            .allocate_container(&["a".into(), "zz".into()])
            .unwrap_err();
        assert!(matches!(&err, AllocateError::Unknown { id, .. } if id == "zz"));
        let status = tonic::Status::from(err);
        assert_eq!(status.code(), tonic::Code::InvalidArgument);
        assert!(status.message().contains("\"zz\"") && status.message().contains("amd.com/gpu"));

        let status = tonic::Status::from(s.allocate_container(&["c".into()]).unwrap_err());
        assert_eq!(status.code(), tonic::Code::FailedPrecondition);
        assert!(status.message().contains("\"c\"") && status.message().contains("renderD130"));
    }
}
