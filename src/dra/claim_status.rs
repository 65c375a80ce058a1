//! ResourceClaim `status.devices` (KEP-4817, GA in Kubernetes 1.37): each
//! prepared device's entry, written by this node's plugin and removed on
//! unprepare, so that `kubectl describe resourceclaim` shows which GPU a pod
//! got and whether it is healthy.
//!
//! An entry carries the conditions `Ready` (the device is prepared) and
//! `Healthy` (the device plugin's health rules, as the health streams send
//! them), and `data` with the GPU's PCI address, the partition and the NUMA
//! node. Entries are written with server-side apply on the `status`
//! subresource under the plugin's field manager: `status.devices` is a list
//! map keyed by driver, pool, device and share, so the server merges our
//! entries beside other drivers' and removes ours when we stop applying them.
//!
//! This module owns the entries' content (pure) and the one task that writes
//! them. It must not decide health or what is prepared: it follows the
//! [`Published`] snapshot and the preparer's changes. A failed write never
//! fails Prepare or Unprepare: it is retried under the agent's retry policy
//! ([`with_retries`]), then logged, and tried again later.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::resource::v1::{AllocatedDeviceStatus, ResourceClaim};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::apimachinery::pkg::runtime::RawExtension;
use kube::Api;
use kube::api::Patch;
use serde_json::{Value, json};
use tokio::sync::{mpsc, watch};

use super::DRIVER_NAME;
use super::calls::with_retries;
use super::checkpoint::{self, Checkpoint, PreparedClaim, PreparedDevice};
use super::health::{self, Published};
use crate::api::field_manager;
use crate::plugin::Health;

/// The condition saying the device is prepared for the claim.
pub const READY: &str = "Ready";
/// The condition saying whether the device is healthy.
pub const HEALTHY: &str = "Healthy";
/// Wait before writing again what failed (unless a change comes first).
const RETRY_AFTER_FAILURE: Duration = Duration::from_secs(5);

/// The entry of one prepared device of this node: `Ready`, `Healthy` from
/// `published`, and `data` (PCI address, partition, NUMA node). A condition
/// whose status is what `previous` says keeps its transition time; a new or
/// changed one takes `now`. A device no longer on offer (a repartition) is
/// not healthy and has no data. Pure.
pub fn device_entry(
    prepared: &PreparedDevice,
    generation: Option<i64>,
    published: &Published,
    previous: Option<&AllocatedDeviceStatus>,
    now: &Time,
) -> AllocatedDeviceStatus {
    let device = published
        .devices
        .iter()
        .find(|d| d.name == prepared.device_name);
    let health = match (device, published.health.get(&prepared.device_name)) {
        (Some(_), Some(health)) => health.clone(),
        (Some(_), None) => Health::Healthy,
        (None, _) => Health::Unhealthy {
            reason: "the device is no longer on offer on this node".into(),
        },
    };
    let (healthy, reason) = match &health {
        Health::Healthy => ("True", "Healthy"),
        Health::Unhealthy { .. } => ("False", "Unhealthy"),
    };
    let condition = |type_: &str, status: &str, reason: &str, message: String| {
        let kept = previous
            .and_then(|p| p.conditions.as_ref())
            .and_then(|cs| cs.iter().find(|c| c.type_ == type_))
            .filter(|c| c.status == status)
            .map(|c| c.last_transition_time.clone());
        Condition {
            type_: type_.to_owned(),
            status: status.to_owned(),
            reason: reason.to_owned(),
            message,
            last_transition_time: kept.unwrap_or_else(|| now.clone()),
            observed_generation: generation,
        }
    };
    let data = device.map(|d| {
        let mut data = serde_json::Map::new();
        data.insert("pciAddress".into(), json!(d.gpu_bdf));
        // A layout device's share names the partitions it was given.
        match (d.partition, prepared.partitions.as_slice()) {
            (Some(partition), _) | (None, &[partition]) => {
                data.insert("partition".into(), json!(partition));
            }
            (None, []) => {}
            (None, several) => {
                data.insert("partitions".into(), json!(several));
            }
        }
        if let Some(layout) = &d.layout {
            data.insert("partitionProfile".into(), json!(layout.profile()));
        }
        if let Some(numa) = d.numa_node {
            data.insert("numaNode".into(), json!(numa));
        }
        RawExtension(Value::Object(data))
    });
    AllocatedDeviceStatus {
        driver: DRIVER_NAME.to_owned(),
        pool: prepared.pool_name.clone(),
        device: prepared.device_name.clone(),
        share_id: prepared.share_id.clone(),
        conditions: Some(vec![
            condition(
                READY,
                "True",
                "Prepared",
                format!("prepared on node {}", prepared.pool_name),
            ),
            condition(HEALTHY, healthy, reason, health::message(&health)),
        ]),
        data,
        network_data: None,
    }
}

/// Every entry of a prepared claim, in the order of its devices. Pure.
pub fn claim_entries(
    devices: &[PreparedDevice],
    generation: Option<i64>,
    published: &Published,
    previous: &[AllocatedDeviceStatus],
    now: &Time,
) -> Vec<AllocatedDeviceStatus> {
    devices
        .iter()
        .map(|d| {
            let before = previous.iter().find(|p| {
                p.device == d.device_name && p.pool == d.pool_name && p.share_id == d.share_id
            });
            device_entry(d, generation, published, before, now)
        })
        .collect()
}

/// The server-side apply configuration of claim `namespace/name`'s status
/// holding exactly `entries` of this plugin (none: ours are removed, other
/// drivers' stay). Pure.
pub fn status_apply(namespace: &str, name: &str, entries: &[AllocatedDeviceStatus]) -> Value {
    json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace},
        "status": {"devices": entries},
    })
}

/// What the preparer tells the status writer.
#[derive(Debug)]
enum Change {
    Prepared {
        uid: String,
        claim: PreparedClaim,
    },
    Unprepared {
        uid: String,
        namespace: String,
        name: String,
    },
}

/// The preparer's side of the status writer: never waits, never fails.
#[derive(Clone, Debug)]
pub struct StatusUpdates(mpsc::UnboundedSender<Change>);

impl StatusUpdates {
    /// Claim `uid` is prepared with these devices: write its entries.
    pub fn prepared(&self, uid: &str, claim: &PreparedClaim) {
        let _ = self.0.send(Change::Prepared {
            uid: uid.to_owned(),
            claim: claim.clone(),
        });
    }

    /// Claim `uid` is unprepared: remove its entries.
    pub fn unprepared(&self, uid: &str, namespace: &str, name: &str) {
        let _ = self.0.send(Change::Unprepared {
            uid: uid.to_owned(),
            namespace: namespace.to_owned(),
            name: name.to_owned(),
        });
    }
}

/// A prepared claim and the entries the API holds for it (`None`: not
/// written yet, or the last write failed).
struct Followed {
    claim: PreparedClaim,
    written: Option<Vec<AllocatedDeviceStatus>>,
}

/// The writer's side of [`StatusUpdates`].
#[derive(Debug)]
pub struct StatusChanges(mpsc::UnboundedReceiver<Change>);

/// A connected pair: the preparer sends, [`follow`] writes.
pub fn channel() -> (StatusUpdates, StatusChanges) {
    let (tx, rx) = mpsc::unbounded_channel();
    (StatusUpdates(tx), StatusChanges(rx))
}

/// Keeps the entries of every prepared claim as `published` says, and
/// removes those of unprepared ones. `prepared` are the claims the
/// checkpoint held at start (written again, with health as it is now);
/// `published` must hold the first real snapshot, or they would be written
/// as gone. Ends when every [`StatusUpdates`] is dropped or `published`
/// closes.
pub async fn follow(
    client: kube::Client,
    mut published: watch::Receiver<Arc<Published>>,
    StatusChanges(mut changes): StatusChanges,
    at_start: Checkpoint,
    checkpoint_path: PathBuf,
) {
    let prepared = at_start.prepared_claims;
    let mut claims: BTreeMap<String, Followed> = prepared
        .into_iter()
        .map(|(uid, claim)| {
            (
                uid,
                Followed {
                    claim,
                    written: None,
                },
            )
        })
        .collect();
    // Unprepared claims whose entries are still to be removed: those the
    // checkpoint kept from before the start, then each unprepared one.
    let mut removals: BTreeMap<String, (String, String)> = at_start
        .status_removals
        .iter()
        .map(|(uid, c)| (uid.clone(), (c.namespace.clone(), c.name.clone())))
        .collect();
    loop {
        let (failed, removed) = sync(&client, &published, &mut claims, &mut removals).await;
        checkpoint::forget_status_removals(&checkpoint_path, &removed).await;
        tokio::select! {
            change = changes.recv() => match change {
                Some(Change::Prepared { uid, claim }) => {
                    removals.remove(&uid);
                    claims.insert(uid, Followed { claim, written: None });
                }
                Some(Change::Unprepared { uid, namespace, name }) => {
                    claims.remove(&uid);
                    removals.insert(uid, (namespace, name));
                }
                None => break,
            },
            changed = published.changed() => if changed.is_err() {
                break;
            },
            _ = tokio::time::sleep(RETRY_AFTER_FAILURE), if failed => {}
        }
    }
}

/// Writes what differs from what the API holds: whether a write failed in
/// a way a later try may cure, and the claims whose removals are done with.
async fn sync(
    client: &kube::Client,
    published: &watch::Receiver<Arc<Published>>,
    claims: &mut BTreeMap<String, Followed>,
    removals: &mut BTreeMap<String, (String, String)>,
) -> (bool, Vec<String>) {
    let snapshot = published.borrow().clone();
    let now = Time(k8s_openapi::jiff::Timestamp::now());
    let mut retry = false;
    let mut gone = Vec::new();
    for (uid, followed) in claims.iter_mut() {
        let previous = followed.written.as_deref().unwrap_or_default();
        let wanted = claim_entries(
            &followed.claim.devices,
            followed.claim.generation,
            &snapshot,
            previous,
            &now,
        );
        if followed.written.as_ref() == Some(&wanted) {
            continue;
        }
        let (namespace, name) = (&followed.claim.namespace, &followed.claim.name);
        match write(client, namespace, name, &wanted).await {
            Ok(()) => {
                tracing::info!(claim = %format!("{namespace}/{name}"), devices = wanted.len(), "wrote the claim's device status");
                followed.written = Some(wanted);
            }
            Err(Failure::Gone) => gone.push(uid.clone()),
            Err(Failure::Refused(e)) => {
                // Not tried again until what it says changes.
                tracing::warn!(claim = %format!("{namespace}/{name}"), error = %e, "the API server refused the claim's device status");
                followed.written = Some(wanted);
            }
            Err(Failure::Transient(e)) => {
                tracing::warn!(claim = %format!("{namespace}/{name}"), error = %e, "cannot write the claim's device status; will retry");
                retry = true;
            }
        }
    }
    for uid in gone {
        claims.remove(&uid);
    }
    let mut done = Vec::new();
    for (uid, (namespace, name)) in removals.iter() {
        match write(client, namespace, name, &[]).await {
            Ok(()) => {
                tracing::info!(claim = %format!("{namespace}/{name}"), "removed the claim's device status");
                done.push(uid.clone());
            }
            Err(Failure::Gone) => done.push(uid.clone()),
            Err(Failure::Refused(e)) => {
                tracing::warn!(claim = %format!("{namespace}/{name}"), error = %e, "the API server refused removing the claim's device status");
                done.push(uid.clone());
            }
            Err(Failure::Transient(e)) => {
                tracing::warn!(claim = %format!("{namespace}/{name}"), error = %e, "cannot remove the claim's device status; will retry");
                retry = true;
            }
        }
    }
    for uid in &done {
        removals.remove(uid);
    }
    (retry, done)
}

/// Why a status write did not happen.
enum Failure {
    /// The claim is gone: nothing to write.
    Gone,
    /// Refused for what it says or who sends it (400, 403, 409, 422).
    Refused(kube::Error),
    /// Unreachable, or the server erred: after the retries.
    Transient(kube::Error),
}

async fn write(
    client: &kube::Client,
    namespace: &str,
    name: &str,
    entries: &[AllocatedDeviceStatus],
) -> Result<(), Failure> {
    let api: Api<ResourceClaim> = Api::namespaced(client.clone(), namespace);
    let params = field_manager::apply(field_manager::DRA);
    let patch = Patch::Apply(status_apply(namespace, name, entries));
    match with_retries(|| api.patch_status(name, &params, &patch)).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Err(Failure::Gone),
        Err(e) if crate::node_writer::is_transient(&e) => Err(Failure::Transient(e)),
        Err(e) => Err(Failure::Refused(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dra::DraDevice;

    fn at(second: i64) -> Time {
        Time(k8s_openapi::jiff::Timestamp::from_second(second).unwrap())
    }

    fn prepared(device: &str) -> PreparedDevice {
        PreparedDevice {
            request_names: vec!["gpu".into()],
            pool_name: "node-1".into(),
            device_name: device.into(),
            cdi_device_ids: vec![],
            share_id: None,
            consumed_capacity: BTreeMap::new(),
            partitions: Vec::new(),
            unknown: Default::default(),
        }
    }

    fn published(health: Health) -> Published {
        let device = DraDevice {
            name: "gpu-1-129".into(),
            gpu_bdf: "0000:c1:00.0".into(),
            partition: Some(2),
            card: 1,
            render_minor: 129,
            numa_node: Some(1),
            xcc_count: None,
            attributes: BTreeMap::new(),
            capacity: BTreeMap::new(),
            layout: None,
            conflict: None,
        };
        Published {
            health: BTreeMap::from([(device.name.clone(), health)]),
            devices: vec![device],
        }
    }

    fn condition<'a>(entry: &'a AllocatedDeviceStatus, type_: &str) -> &'a Condition {
        entry
            .conditions
            .iter()
            .flatten()
            .find(|c| c.type_ == type_)
            .unwrap()
    }

    #[test]
    fn a_prepared_device_is_ready_healthy_and_says_where_it_is() {
        let entry = device_entry(
            &prepared("gpu-1-129"),
            Some(3),
            &published(Health::Healthy),
            None,
            &at(100),
        );
        assert!(
            entry
                .conditions
                .iter()
                .flatten()
                .all(|c| c.observed_generation == Some(3)),
            "the claim's generation read for the Prepare"
        );
        assert_eq!(
            (
                entry.driver.as_str(),
                entry.pool.as_str(),
                entry.device.as_str()
            ),
            (DRIVER_NAME, "node-1", "gpu-1-129")
        );
        assert_eq!(condition(&entry, READY).status, "True");
        assert_eq!(condition(&entry, HEALTHY).status, "True");
        assert_eq!(
            entry.data.unwrap().0,
            json!({"pciAddress": "0000:c1:00.0", "partition": 2, "numaNode": 1})
        );
    }

    #[test]
    fn a_health_change_moves_only_the_health_condition() {
        let healthy = device_entry(
            &prepared("gpu-1-129"),
            None,
            &published(Health::Healthy),
            None,
            &at(100),
        );
        let sick = device_entry(
            &prepared("gpu-1-129"),
            None,
            &published(Health::Unhealthy {
                reason: "uncorrectable ECC: 7 on umc".into(),
            }),
            Some(&healthy),
            &at(200),
        );
        let health = condition(&sick, HEALTHY);
        assert_eq!(
            (health.status.as_str(), health.reason.as_str()),
            ("False", "Unhealthy")
        );
        assert_eq!(health.message, "uncorrectable ECC: 7 on umc");
        assert_eq!(health.last_transition_time, at(200));
        assert_eq!(condition(&sick, READY).last_transition_time, at(100));
        // Nothing changed: the same entry, so nothing is written again.
        let again = claim_entries(
            &[prepared("gpu-1-129")],
            None,
            &published(Health::Unhealthy {
                reason: "uncorrectable ECC: 7 on umc".into(),
            }),
            std::slice::from_ref(&sick),
            &at(300),
        );
        assert_eq!(again, vec![sick]);
    }

    #[test]
    fn a_device_no_longer_on_offer_is_not_healthy_and_has_no_data() {
        let entry = device_entry(
            &prepared("gpu-9-137"),
            None,
            &published(Health::Healthy),
            None,
            &at(1),
        );
        assert_eq!(condition(&entry, HEALTHY).status, "False");
        assert!(entry.data.is_none());
    }

    #[test]
    fn the_apply_names_the_claim_and_only_our_entries() {
        let mut shared = prepared("gpu-1-129");
        shared.share_id = Some("s-1".into());
        let entries = claim_entries(&[shared], None, &published(Health::Healthy), &[], &at(1));
        let body = status_apply("team-a", "c", &entries);
        assert_eq!(body["kind"], "ResourceClaim");
        assert_eq!(
            body["metadata"],
            json!({"name": "c", "namespace": "team-a"})
        );
        assert_eq!(body["status"]["devices"][0]["shareID"], "s-1");
        assert_eq!(body["status"]["devices"][0]["driver"], DRIVER_NAME);
        assert_eq!(
            status_apply("team-a", "c", &[])["status"]["devices"],
            json!([])
        );
    }
}
