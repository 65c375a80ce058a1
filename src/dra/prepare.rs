//! NodePrepareResources and NodeUnprepareResources: reads each claim, decides
//! with [`claims::allocated_here`], writes its CDI spec and keeps the
//! checkpoint.
//!
//! One claim's failure is that claim's error string; the others in the same
//! request are still prepared. Claims are read from the API concurrently and
//! outside any lock; the checkpoint is read, changed and written under one
//! lock for the whole process, so two plugin instances (one stopping, one
//! starting) never write over each other's entries.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::resource::v1::ResourceClaim;
use tokio::sync::{Mutex, watch};

use super::calls::with_retries;
use super::cdi::{self, ClaimDevice, DeviceNode};
use super::checkpoint::{Checkpoint, PreparedClaim, PreparedDevice};
use super::claim_status::StatusUpdates;
use super::claims::{Allocated, allocated_here};
use super::health::Published;
use crate::host::reader::BoundedReader;

/// Bound on reading one device number from sysfs.
const HOST_READ_TIMEOUT: Duration = Duration::from_secs(2);

/// Serialises every change of a checkpoint file in this process.
static CHECKPOINT_LOCK: Mutex<()> = Mutex::const_new(());

/// A claim the kubelet names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClaimRef {
    pub namespace: String,
    pub uid: String,
    pub name: String,
}

/// The result of one claim: its devices, or why not.
pub type Prepared = Result<Vec<PreparedDevice>, String>;

/// Reads a claim from the API server (bounded, transient errors retried).
async fn read_claim(
    client: &kube::Client,
    namespace: &str,
    name: &str,
) -> Result<ResourceClaim, String> {
    let api = kube::Api::<ResourceClaim>::namespaced(client.clone(), namespace);
    match with_retries(|| api.get_opt(name)).await {
        Err(e) => Err(format!("cannot read claim {namespace}/{name}: {e}")),
        Ok(None) => Err(format!("claim {namespace}/{name} not found")),
        Ok(Some(claim)) => Ok(claim),
    }
}

/// Prepares and unprepares claims for one node.
pub struct Preparer {
    pub(crate) node: String,
    pub(crate) cdi_dir: PathBuf,
    pub(crate) checkpoint_path: PathBuf,
    pub(crate) client: kube::Client,
    pub(crate) reader: BoundedReader,
    pub(crate) published: watch::Receiver<Arc<Published>>,
    /// Where prepared and unprepared claims go for their `status.devices`.
    pub(crate) status: StatusUpdates,
}

impl Preparer {
    /// The checkpoint as the file holds it now; must be called under
    /// [`CHECKPOINT_LOCK`].
    fn load(&self) -> Result<Checkpoint, String> {
        Checkpoint::load(&self.checkpoint_path).map_err(|e| e.to_string())
    }

    /// Prepares each claim; the answer is by claim UID.
    pub async fn prepare(&self, claims: &[ClaimRef]) -> BTreeMap<String, Prepared> {
        let mut out: BTreeMap<String, Prepared> = BTreeMap::new();
        // Prepared before, and its spec still there: the same answer, nothing
        // read or written.
        {
            let _lock = CHECKPOINT_LOCK.lock().await;
            match self.load() {
                Ok(checkpoint) => {
                    for claim in claims {
                        if let Some(done) = checkpoint.prepared_claims.get(&claim.uid)
                            && cdi::spec_path(&self.cdi_dir, &claim.uid)
                                .is_ok_and(|path| path.exists())
                        {
                            out.insert(claim.uid.clone(), Ok(done.devices.clone()));
                        }
                    }
                }
                Err(e) => {
                    for claim in claims {
                        out.insert(claim.uid.clone(), Err(e.clone()));
                    }
                    return out;
                }
            }
        }
        let todo: Vec<&ClaimRef> = claims
            .iter()
            .filter(|c| !out.contains_key(&c.uid))
            .collect();
        if todo.is_empty() {
            return out;
        }
        let objects = futures::future::join_all(
            todo.iter()
                .map(|c| read_claim(&self.client, &c.namespace, &c.name)),
        )
        .await;
        let mut specs: Vec<(&ClaimRef, String, Vec<PreparedDevice>)> = Vec::new();
        for (claim, object) in todo.iter().zip(objects) {
            let result = match object.and_then(|o| allocated_here(&o, &claim.uid, &self.node)) {
                Ok(allocated) => self.claim_spec(claim, &allocated).await,
                Err(e) => Err(e),
            };
            match result {
                Ok((spec, devices)) => specs.push((claim, spec, devices)),
                Err(e) => {
                    out.insert(claim.uid.clone(), Err(e));
                }
            }
        }
        if specs.is_empty() {
            self.log(claims, &out);
            return out;
        }
        let _lock = CHECKPOINT_LOCK.lock().await;
        let mut checkpoint = match self.load() {
            Ok(c) => c,
            Err(e) => {
                for (claim, ..) in &specs {
                    out.insert(claim.uid.clone(), Err(e.clone()));
                }
                return out;
            }
        };
        let mut written = Vec::new();
        for (claim, spec, devices) in specs {
            // The spec before its entry: see `checkpoint` for why.
            let path = match cdi::spec_path(&self.cdi_dir, &claim.uid) {
                Ok(path) => path,
                Err(e) => {
                    out.insert(claim.uid.clone(), Err(e));
                    continue;
                }
            };
            if let Err(e) = cdi::write_spec(&path, &spec) {
                out.insert(
                    claim.uid.clone(),
                    Err(format!("cannot write CDI spec {}: {e}", path.display())),
                );
                continue;
            }
            checkpoint.kept_specs.remove(&claim.uid);
            let prepared = PreparedClaim {
                namespace: claim.namespace.clone(),
                name: claim.name.clone(),
                devices: devices.clone(),
            };
            checkpoint
                .prepared_claims
                .insert(claim.uid.clone(), prepared.clone());
            written.push((claim.uid.clone(), prepared));
        }
        let saved = checkpoint.save(&self.checkpoint_path).map_err(|e| {
            format!(
                "cannot write checkpoint {}: {e}",
                self.checkpoint_path.display()
            )
        });
        for (uid, prepared) in written {
            if saved.is_ok() {
                self.status.prepared(&uid, &prepared);
            }
            out.insert(uid, saved.clone().map(|()| prepared.devices));
        }
        self.log(claims, &out);
        out
    }

    fn log(&self, claims: &[ClaimRef], out: &BTreeMap<String, Prepared>) {
        for claim in claims {
            let name = format!("{}/{}", claim.namespace, claim.name);
            match out.get(&claim.uid) {
                Some(Ok(devices)) => {
                    tracing::info!(claim = %name, uid = %claim.uid, devices = devices.len(), "prepared claim");
                }
                Some(Err(e)) => {
                    tracing::warn!(claim = %name, uid = %claim.uid, error = %e, "cannot prepare claim");
                }
                None => {}
            }
        }
    }

    /// The CDI spec and the answer for a claim's devices on this node.
    async fn claim_spec(
        &self,
        claim: &ClaimRef,
        allocated: &[Allocated],
    ) -> Result<(String, Vec<PreparedDevice>), String> {
        let published = self.published.borrow().clone();
        let kfd = self
            .device_node("/dev/kfd", "/sys/class/kfd/kfd/dev")
            .await?;
        let mut devices = Vec::with_capacity(allocated.len());
        let mut answer = Vec::with_capacity(allocated.len());
        for a in allocated {
            let Some(device) = published.devices.iter().find(|d| d.name == a.device) else {
                return Err(format!(
                    "device {} of claim {}/{} is not a device of this node",
                    a.device, claim.namespace, claim.name
                ));
            };
            // Two shares of one device in one claim: one CDI device (a spec
            // naming a device twice is refused), an answer for each share.
            let listed = devices.iter().any(|d: &ClaimDevice| d.name == device.name);
            let mut nodes = Vec::with_capacity(2);
            for path in device.dri_nodes().into_iter().filter(|_| !listed) {
                let name = path.trim_start_matches("/dev/dri/");
                nodes.push(
                    self.device_node(&path, &format!("/sys/class/drm/{name}/dev"))
                        .await?,
                );
            }
            if !listed {
                devices.push(ClaimDevice {
                    name: device.name.clone(),
                    nodes,
                });
            }
            answer.push(PreparedDevice {
                request_names: a.request_names.clone(),
                pool_name: self.node.clone(),
                device_name: device.name.clone(),
                cdi_device_ids: vec![cdi::cdi_device_id(&claim.uid, &device.name)],
                share_id: a.share_id.clone(),
                consumed_capacity: a.consumed_capacity.clone(),
            });
        }
        Ok((
            cdi::claim_spec(&claim.uid, &kfd, &devices, &self.node),
            answer,
        ))
    }

    /// Unprepares each claim: its checkpoint entry goes, then its spec. A claim
    /// never prepared (or already unprepared) succeeds.
    pub async fn unprepare(&self, claims: &[ClaimRef]) -> BTreeMap<String, Result<(), String>> {
        let mut out = BTreeMap::new();
        // A UID that is not one names no spec of ours: refused before any
        // path is made of it, as prepare refuses it.
        let (claims, refused): (Vec<&ClaimRef>, Vec<&ClaimRef>) = claims
            .iter()
            .partition(|c| cdi::claim_uid_problem(&c.uid).is_none());
        for claim in refused {
            let why = cdi::claim_uid_problem(&claim.uid).unwrap_or_default();
            tracing::warn!(claim = %format!("{}/{}", claim.namespace, claim.name), error = %why, "cannot unprepare claim");
            out.insert(claim.uid.clone(), Err(why));
        }
        let _lock = CHECKPOINT_LOCK.lock().await;
        // The claims whose entries were ours: their status entries go.
        let mut had_entries = Vec::new();
        let saved = match self.load() {
            Ok(mut checkpoint) => {
                let mut changed = false;
                for claim in &claims {
                    if checkpoint.prepared_claims.remove(&claim.uid).is_some() {
                        changed = true;
                        had_entries.push(claim.uid.clone());
                    }
                    changed |= checkpoint.kept_specs.remove(&claim.uid);
                }
                if !changed {
                    Ok(())
                } else {
                    checkpoint.save(&self.checkpoint_path).map_err(|e| {
                        format!(
                            "cannot write checkpoint {}: {e}",
                            self.checkpoint_path.display()
                        )
                    })
                }
            }
            Err(e) => Err(e),
        };
        // Out of the checkpoint: the kubelet will not unprepare it again,
        // so its entries go now, whatever happens to its spec.
        for claim in claims.iter().filter(|c| had_entries.contains(&c.uid)) {
            if saved.is_ok() {
                self.status
                    .unprepared(&claim.uid, &claim.namespace, &claim.name);
            }
        }
        for claim in claims {
            let result = saved.clone().and_then(|()| {
                let spec_path = cdi::spec_path(&self.cdi_dir, &claim.uid)?;
                cdi::remove_spec(&spec_path)
                    .map_err(|e| format!("cannot remove CDI spec {}: {e}", spec_path.display()))
            });
            let name = format!("{}/{}", claim.namespace, claim.name);
            match &result {
                Ok(()) => tracing::info!(claim = %name, uid = %claim.uid, "unprepared claim"),
                Err(e) => {
                    tracing::warn!(claim = %name, uid = %claim.uid, error = %e, "cannot unprepare claim");
                }
            }
            out.insert(claim.uid.clone(), result);
        }
        out
    }

    /// A character device's numbers, from its sysfs `dev` attribute
    /// (`major:minor`), which is what the kernel gave the host's node.
    async fn device_node(&self, path: &str, sysfs_dev: &str) -> Result<DeviceNode, String> {
        let text = self
            .reader
            .read_attr(sysfs_dev, HOST_READ_TIMEOUT)
            .await
            .map_err(|e| format!("cannot read the device numbers of {path}: {e}"))?;
        let (major, minor) =
            parse_dev(&text).ok_or_else(|| format!("{sysfs_dev}: {text:?} is not major:minor"))?;
        Ok(DeviceNode {
            path: path.to_owned(),
            major,
            minor,
        })
    }
}

/// `major:minor` of a sysfs `dev` attribute.
pub fn parse_dev(text: &str) -> Option<(u32, u32)> {
    let (major, minor) = text.trim().split_once(':')?;
    Some((major.parse().ok()?, minor.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_numbers_parse_from_sysfs() {
        assert_eq!(parse_dev("226:128\n"), Some((226, 128)));
        assert_eq!(parse_dev("226"), None);
        assert_eq!(parse_dev("a:b"), None);
    }
}
