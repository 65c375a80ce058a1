//! Which of a ResourceClaim's allocated devices this node prepares: a pure
//! decision over the claim as read from the API.

use std::collections::BTreeMap;

use k8s_openapi::api::resource::v1::ResourceClaim;

use super::DRIVER_NAME;

/// One device of the claim allocated from this node's pool, with the claim's
/// requests it serves; for a shared device, the share (its ID and what it
/// consumes of the device's capacity, as the scheduler recorded it).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Allocated {
    pub device: String,
    pub request_names: Vec<String>,
    pub share_id: Option<String>,
    pub consumed_capacity: BTreeMap<String, String>,
}

/// The devices `claim` was allocated from `pool` (this node's), or why it
/// cannot be prepared here. `uid` is what the kubelet asked for: a claim
/// deleted and recreated under the same name is another claim.
pub fn allocated_here(
    claim: &ResourceClaim,
    uid: &str,
    pool: &str,
) -> Result<Vec<Allocated>, String> {
    let name = claim.metadata.name.as_deref().unwrap_or_default();
    let found = claim.metadata.uid.as_deref().unwrap_or_default();
    if found != uid {
        return Err(format!(
            "claim {name} has UID {found}, not {uid}: it was deleted and created again"
        ));
    }
    let Some(allocation) = claim.status.as_ref().and_then(|s| s.allocation.as_ref()) else {
        return Err(format!("claim {name} is not allocated"));
    };
    let ours: Vec<_> = allocation
        .devices
        .as_ref()
        .and_then(|d| d.results.as_ref())
        .into_iter()
        .flatten()
        .filter(|r| r.driver == DRIVER_NAME)
        .collect();
    if ours.is_empty() {
        return Err(format!(
            "claim {name} has no {DRIVER_NAME} device allocated"
        ));
    }
    // By device and share: two shares of one device are two allocations.
    let mut by_device: BTreeMap<(&str, Option<&str>), Allocated> = BTreeMap::new();
    for result in &ours {
        if result.pool != pool {
            return Err(format!(
                "claim {name} is allocated device {} of pool {}, not of this node's pool {pool}",
                result.device, result.pool
            ));
        }
        let share = result.share_id.as_deref();
        let allocated = by_device
            .entry((result.device.as_str(), share))
            .or_insert_with(|| Allocated {
                device: result.device.clone(),
                share_id: share.map(str::to_owned),
                ..Allocated::default()
            });
        if !allocated.request_names.contains(&result.request) {
            allocated.request_names.push(result.request.clone());
        }
        for (capacity, amount) in result.consumed_capacity.iter().flatten() {
            allocated
                .consumed_capacity
                .insert(capacity.clone(), amount.0.clone());
        }
    }
    Ok(by_device.into_values().collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::resource::v1::{
        AllocationResult, DeviceAllocationResult, DeviceRequestAllocationResult,
        ResourceClaimStatus,
    };

    pub(crate) fn claim(uid: &str, results: &[(&str, &str, &str, &str)]) -> ResourceClaim {
        let mut c = ResourceClaim::default();
        c.metadata.name = Some("c".into());
        c.metadata.uid = Some(uid.into());
        c.status = Some(ResourceClaimStatus {
            allocation: Some(AllocationResult {
                devices: Some(DeviceAllocationResult {
                    results: Some(
                        results
                            .iter()
                            .map(
                                |(request, driver, pool, device)| DeviceRequestAllocationResult {
                                    request: request.to_string(),
                                    driver: driver.to_string(),
                                    pool: pool.to_string(),
                                    device: device.to_string(),
                                    ..DeviceRequestAllocationResult::default()
                                },
                            )
                            .collect(),
                    ),
                    ..DeviceAllocationResult::default()
                }),
                ..AllocationResult::default()
            }),
            ..ResourceClaimStatus::default()
        });
        c
    }

    #[test]
    fn our_devices_in_our_pool_are_prepared_with_their_requests() {
        let c = claim(
            "u",
            &[
                ("a", DRIVER_NAME, "n1", "gpu-1-128"),
                ("b", DRIVER_NAME, "n1", "gpu-1-128"),
                ("a", DRIVER_NAME, "n1", "gpu-2-129"),
                ("nic", "net.example.com", "n1", "eth0"),
            ],
        );
        let got = allocated_here(&c, "u", "n1").unwrap();
        assert_eq!(
            got,
            vec![
                Allocated {
                    device: "gpu-1-128".into(),
                    request_names: vec!["a".into(), "b".into()],
                    ..Allocated::default()
                },
                Allocated {
                    device: "gpu-2-129".into(),
                    request_names: vec!["a".into()],
                    ..Allocated::default()
                },
            ]
        );
    }

    #[test]
    fn two_shares_of_one_device_are_two_allocations_with_what_they_consume() {
        use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
        let mut c = claim(
            "u",
            &[
                ("small", DRIVER_NAME, "n1", "gpu-1-128"),
                ("big", DRIVER_NAME, "n1", "gpu-1-128"),
            ],
        );
        let results = c
            .status
            .as_mut()
            .and_then(|s| s.allocation.as_mut())
            .and_then(|a| a.devices.as_mut())
            .and_then(|d| d.results.as_mut())
            .unwrap();
        for (result, (share, memory)) in results.iter_mut().zip([("s-1", "8Gi"), ("s-2", "64Gi")]) {
            result.share_id = Some(share.into());
            result.consumed_capacity = Some(BTreeMap::from([(
                "memory".to_owned(),
                Quantity(memory.into()),
            )]));
        }
        let got = allocated_here(&c, "u", "n1").unwrap();
        assert_eq!(got.len(), 2, "{got:?}");
        assert_eq!(got[0].share_id.as_deref(), Some("s-1"));
        assert_eq!(got[0].request_names, ["small"]);
        assert_eq!(got[0].consumed_capacity["memory"], "8Gi");
        assert_eq!(got[1].share_id.as_deref(), Some("s-2"));
        assert_eq!(got[1].consumed_capacity["memory"], "64Gi");
    }

    #[test]
    fn a_claim_that_is_not_ours_to_prepare_says_why() {
        let c = claim("u", &[("a", DRIVER_NAME, "n2", "gpu-1-128")]);
        assert!(
            allocated_here(&c, "u", "n1")
                .unwrap_err()
                .contains("pool n2")
        );
        assert!(
            allocated_here(&c, "other", "n2")
                .unwrap_err()
                .contains("UID")
        );
        let foreign = claim("u", &[("a", "net.example.com", "n1", "eth0")]);
        assert!(
            allocated_here(&foreign, "u", "n1")
                .unwrap_err()
                .contains("no gpu.amd.com")
        );
        let mut unallocated = claim("u", &[]);
        unallocated.status = None;
        assert!(
            allocated_here(&unallocated, "u", "n1")
                .unwrap_err()
                .contains("not allocated")
        );
    }
}
