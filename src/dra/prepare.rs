//! NodePrepareResources and NodeUnprepareResources: reads each claim, decides
//! with [`claims::allocated_here`], writes its CDI spec and keeps the
//! checkpoint.
//!
//! One claim's failure is that claim's error string; the others in the same
//! request are still prepared. Calls are serialised (one lock over the
//! checkpoint), which also makes a repeated call see the first one's result.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::resource::v1::ResourceClaim;
use tokio::sync::{Mutex, watch};

use super::cdi::{self, ClaimDevice, DeviceNode};
use super::checkpoint::{Checkpoint, PreparedClaim, PreparedDevice};
use super::claims::allocated_here;
use super::health::Published;
use crate::host::reader::BoundedReader;

/// Bound on reading one claim from the API server.
const CLAIM_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// Bound on reading one device number from sysfs.
const HOST_READ_TIMEOUT: Duration = Duration::from_secs(2);

/// A claim the kubelet names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClaimRef {
    pub namespace: String,
    pub uid: String,
    pub name: String,
}

/// Reads a claim from the API server, bounded.
async fn read_claim(
    client: &kube::Client,
    namespace: &str,
    name: &str,
) -> Result<ResourceClaim, String> {
    let api = kube::Api::<ResourceClaim>::namespaced(client.clone(), namespace);
    match tokio::time::timeout(CLAIM_READ_TIMEOUT, api.get_opt(name)).await {
        Err(_) => Err(format!(
            "cannot read claim {namespace}/{name}: no answer within {CLAIM_READ_TIMEOUT:?}"
        )),
        Ok(Err(e)) => Err(format!("cannot read claim {namespace}/{name}: {e}")),
        Ok(Ok(None)) => Err(format!("claim {namespace}/{name} not found")),
        Ok(Ok(Some(claim))) => Ok(claim),
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
    pub(crate) checkpoint: Mutex<Checkpoint>,
}

impl Preparer {
    /// Prepares each claim; the answer is by claim UID.
    pub async fn prepare(
        &self,
        claims: &[ClaimRef],
    ) -> BTreeMap<String, Result<Vec<PreparedDevice>, String>> {
        let mut checkpoint = self.checkpoint.lock().await;
        let mut out = BTreeMap::new();
        for claim in claims {
            let result = self.prepare_one(&mut checkpoint, claim).await;
            if let Err(e) = &result {
                tracing::warn!(claim = %format!("{}/{}", claim.namespace, claim.name), uid = %claim.uid, error = %e, "cannot prepare claim");
            }
            out.insert(claim.uid.clone(), result);
        }
        out
    }

    async fn prepare_one(
        &self,
        checkpoint: &mut Checkpoint,
        claim: &ClaimRef,
    ) -> Result<Vec<PreparedDevice>, String> {
        let spec_path = cdi::spec_path(&self.cdi_dir, &claim.uid);
        // Prepared before, and its spec is still there: the same answer, no write.
        if let Some(done) = checkpoint.prepared_claims.get(&claim.uid)
            && spec_path.exists()
        {
            return Ok(done.devices.clone());
        }
        let object = read_claim(&self.client, &claim.namespace, &claim.name).await?;
        let allocated = allocated_here(&object, &claim.uid, &self.node)?;
        let published = self.published.borrow().clone();
        let kfd = self
            .device_node("/dev/kfd", "/sys/class/kfd/kfd/dev")
            .await?;
        let mut devices = Vec::with_capacity(allocated.len());
        let mut answer = Vec::with_capacity(allocated.len());
        for a in &allocated {
            let Some(device) = published.devices.iter().find(|d| d.name == a.device) else {
                return Err(format!(
                    "device {} of claim {}/{} is not a device of this node",
                    a.device, claim.namespace, claim.name
                ));
            };
            let mut nodes = Vec::with_capacity(2);
            for path in device.dri_nodes() {
                let name = path.trim_start_matches("/dev/dri/");
                nodes.push(
                    self.device_node(&path, &format!("/sys/class/drm/{name}/dev"))
                        .await?,
                );
            }
            devices.push(ClaimDevice {
                name: device.name.clone(),
                nodes,
            });
            answer.push(PreparedDevice {
                request_names: a.request_names.clone(),
                pool_name: self.node.clone(),
                device_name: device.name.clone(),
                cdi_device_ids: vec![cdi::cdi_device_id(&claim.uid, &device.name)],
            });
        }
        let spec = cdi::claim_spec(&claim.uid, &kfd, &devices, &self.node);
        cdi::write_spec(&spec_path, &spec)
            .map_err(|e| format!("cannot write CDI spec {}: {e}", spec_path.display()))?;
        checkpoint.prepared_claims.insert(
            claim.uid.clone(),
            PreparedClaim {
                namespace: claim.namespace.clone(),
                name: claim.name.clone(),
                devices: answer.clone(),
            },
        );
        if let Err(e) = checkpoint.save(&self.checkpoint_path) {
            checkpoint.prepared_claims.remove(&claim.uid);
            return Err(format!(
                "cannot write checkpoint {}: {e}",
                self.checkpoint_path.display()
            ));
        }
        tracing::info!(claim = %format!("{}/{}", claim.namespace, claim.name), uid = %claim.uid, devices = answer.len(), "prepared claim");
        Ok(answer)
    }

    /// Unprepares each claim: its checkpoint entry goes, then its spec. A claim
    /// never prepared (or already unprepared) succeeds.
    pub async fn unprepare(&self, claims: &[ClaimRef]) -> BTreeMap<String, Result<(), String>> {
        let mut checkpoint = self.checkpoint.lock().await;
        let mut out = BTreeMap::new();
        for claim in claims {
            let mut result = Ok(());
            if checkpoint.prepared_claims.remove(&claim.uid).is_some()
                && let Err(e) = checkpoint.save(&self.checkpoint_path)
            {
                result = Err(format!(
                    "cannot write checkpoint {}: {e}",
                    self.checkpoint_path.display()
                ));
            }
            let spec_path = cdi::spec_path(&self.cdi_dir, &claim.uid);
            if result.is_ok()
                && let Err(e) = cdi::remove_spec(&spec_path)
            {
                result = Err(format!(
                    "cannot remove CDI spec {}: {e}",
                    spec_path.display()
                ));
            }
            if result.is_ok() {
                tracing::info!(claim = %format!("{}/{}", claim.namespace, claim.name), uid = %claim.uid, "unprepared claim");
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
