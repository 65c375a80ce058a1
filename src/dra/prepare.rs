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
use tokio::sync::{Mutex, OwnedMutexGuard, watch};

use super::calls::with_retries;
use super::cdi::{self, ClaimDevice, DeviceNode};
// Every change of a checkpoint file in this process is made under it.
use super::checkpoint::{
    Checkpoint, ClaimName, LOCK as CHECKPOINT_LOCK, PreparedClaim, PreparedDevice,
};
use super::claim_status::StatusUpdates;
use super::claims::{Allocated, allocated_here};
use super::health::Published;
use super::layouts::{self, Change, Holds};
use crate::api::KernelModuleConfigSpec;
use crate::device::Inventory;
use crate::driver::reload::{self, ReloadSteps, Reloader};
use crate::host::reader::BoundedReader;
use crate::host::{AttrStore, HostRoot};
use crate::partition::{Limits, Plan, apply};

/// Bound on reading one device number from sysfs.
const HOST_READ_TIMEOUT: Duration = Duration::from_secs(2);

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
    /// Partitions allocated on demand; `None` when off.
    pub(crate) layouts: Option<LayoutWriter>,
}

/// What a Prepare of a layout device ([`layouts`]) changes the host with:
/// the same writer `partition apply` uses, and the driver manager's
/// `modprobe` for the reload a memory mode needs, loading again what the
/// driver manager loaded ([`reload`]).
#[derive(Clone)]
pub struct LayoutWriter {
    pub host: HostRoot,
    pub reader: BoundedReader,
    pub store: Arc<dyn AttrStore>,
    pub limits: Limits,
    /// `None` reloads nothing (a simulated host's driver takes a memory mode
    /// at once).
    pub reload: Option<Reloader>,
    /// The DeviceConfig's `driver.kernelModuleConfig`: what a reload takes
    /// when the operator does not manage the driver.
    pub not_managed: KernelModuleConfigSpec,
    /// What the layout devices' conflict taints are made of.
    pub state: watch::Sender<LayoutState>,
    /// Held through a whole Prepare and Unprepare: one layout change at a
    /// time, and a share's partitions chosen and recorded before the next.
    /// A change itself holds it until it ends, even if the Prepare that
    /// started it is given up (the kubelet's call timed out).
    pub lock: Arc<Mutex<()>>,
}

/// What decides which layout devices cannot be had now.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LayoutState {
    /// The memory mode of the layouts prepared claims hold.
    pub held_memory: Option<String>,
    /// GPUs (by index) a failed change could not put back, with their
    /// memory mode then.
    pub stuck: BTreeMap<u32, String>,
}

impl LayoutWriter {
    /// Writes `plan` (then reloads the driver when `reload`) and waits until
    /// the host shows it; the inventory then. A change that fails is undone
    /// the same way; a GPU that cannot be put back is marked stuck, which
    /// taints its layouts, until a later change of it succeeds. A reload
    /// that cannot be made (what runs cannot be loaded again as it was) is
    /// refused before anything is written; the driver manager holds off
    /// from the first write to the end of the undoing.
    async fn repartition(
        &self,
        plan: &Plan,
        reload: bool,
        before: &Inventory,
    ) -> Result<Inventory, String> {
        let reloading = match (&self.reload, reload) {
            (Some(reloader), true) => {
                let guard = reloader.handoff.begin().await;
                let steps = reload::plan(&self.host, &reloader.handoff.from(), &self.not_managed)
                    .await
                    .map_err(|e| format!("cannot reload amdgpu for the memory mode: {e}"))?;
                Some((guard, steps))
            }
            _ => None,
        };
        let steps = reloading.as_ref().map(|(_, steps)| steps);
        let done = self.change_layout(plan, steps, before).await;
        let indexes: Vec<u32> = plan.assignments.iter().map(|a| a.index as u32).collect();
        let failed = match done {
            Ok(inventory) => {
                self.state.send_if_modified(|state| {
                    let before = state.stuck.len();
                    state.stuck.retain(|index, _| !indexes.contains(index));
                    before != state.stuck.len()
                });
                return Ok(inventory);
            }
            Err(e) => e,
        };
        let now = crate::device::discover_off_runtime(&self.host).await;
        let back = layouts::undo(plan, &layouts::ordered(&now));
        match self.change_layout(&back, steps, &now).await {
            Ok(_) => Err(format!("{failed}; the GPUs are back in their layouts")),
            Err(undo_failed) => {
                let now = crate::device::discover_off_runtime(&self.host).await;
                let gpus = layouts::ordered(&now);
                self.state.send_modify(|state| {
                    for &index in &indexes {
                        let memory = gpus
                            .get(index as usize)
                            .and_then(|g| g.memory_partition.clone())
                            .unwrap_or_default();
                        state.stuck.insert(index, memory);
                    }
                });
                tracing::error!(error = %failed, undo = %undo_failed, "a layout change failed and could not be undone; its layouts are tainted");
                Err(format!(
                    "{failed}; putting the GPUs back failed too ({undo_failed}): their layouts carry {} until a change of them succeeds",
                    layouts::CONFLICT_TAINT_KEY
                ))
            }
        }
    }

    /// Writes `plan`, reloads amdgpu with `reload`'s steps if any, and
    /// waits until the host shows the plan.
    async fn change_layout(
        &self,
        plan: &Plan,
        reload: Option<&ReloadSteps>,
        before: &Inventory,
    ) -> Result<Inventory, String> {
        apply::write_plan(plan, before, self.store.clone(), &self.reader, self.limits)
            .await
            .map_err(|e| e.to_string())?;
        if let (Some(steps), Some(reloader)) = (reload, &self.reload) {
            reload::run(&self.host, &reloader.commands, steps)
                .await
                .map_err(|e| format!("cannot reload amdgpu for the memory mode: {e}"))?;
        }
        apply::seen_on_host(&self.host, plan, self.limits.appear)
            .await
            .map_err(|e| e.to_string())
    }
}

/// One Prepare call's part in layout changes: the lock it holds, and what
/// it has given out so far.
#[derive(Default)]
struct Batch {
    /// `None` while a change holds it (or when layouts are off).
    guard: Option<OwnedMutexGuard<()>>,
    given: Option<Given>,
}

/// What one Prepare call has given out so far, beside the checkpoint: the
/// GPUs held and each layout device's partitions taken.
#[derive(Default)]
struct Given {
    holds: Holds,
    taken: BTreeMap<String, std::collections::BTreeSet<u32>>,
}

impl Given {
    /// From the claims the checkpoint holds, with `gpus` (in PCI order)
    /// naming each device's GPU.
    fn of(checkpoint: &Checkpoint, gpus: &[&crate::device::Gpu]) -> Self {
        let mut given = Self::default();
        for device in checkpoint.prepared_claims.values().flat_map(|c| &c.devices) {
            if let Some(bdf) = layouts::gpu_of_device(&device.device_name, gpus) {
                given
                    .holds
                    .entry(bdf)
                    .or_default()
                    .insert(device.device_name.clone());
            }
            given
                .taken
                .entry(device.device_name.clone())
                .or_default()
                .extend(device.partitions.iter().copied());
        }
        given
    }
}

impl Preparer {
    /// The checkpoint as the file holds it now; must be called under
    /// [`CHECKPOINT_LOCK`].
    fn load(&self) -> Result<Checkpoint, String> {
        Checkpoint::load(&self.checkpoint_path).map_err(|e| e.to_string())
    }

    /// Prepares each claim; the answer is by claim UID.
    pub async fn prepare(&self, claims: &[ClaimRef]) -> BTreeMap<String, Prepared> {
        let mut batch = Batch {
            guard: match &self.layouts {
                Some(writer) => Some(writer.lock.clone().lock_owned().await),
                None => None,
            },
            given: None,
        };
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
        let mut specs: Vec<(&ClaimRef, String, Vec<PreparedDevice>, Option<i64>)> = Vec::new();
        for (claim, object) in todo.iter().zip(objects) {
            let generation = object.as_ref().ok().and_then(|o| o.metadata.generation);
            let result = match object.and_then(|o| allocated_here(&o, &claim.uid, &self.node)) {
                Ok(allocated) => self.claim_spec(claim, &allocated, &mut batch).await,
                Err(e) => Err(e),
            };
            match result {
                Ok((spec, devices)) => specs.push((claim, spec, devices, generation)),
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
        for (claim, spec, devices, generation) in specs {
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
            checkpoint.status_removals.remove(&claim.uid);
            let prepared = PreparedClaim {
                namespace: claim.namespace.clone(),
                name: claim.name.clone(),
                devices: devices.clone(),
                generation,
                unknown: Default::default(),
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
        self.note_holds(&checkpoint);
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
        batch: &mut Batch,
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
            if let Some(layout) = &device.layout {
                let (claim_devices, prepared) = self
                    .layout_share(claim, a, &device.name, layout, batch)
                    .await?;
                devices.extend(claim_devices);
                answer.push(prepared);
                continue;
            }
            // Two shares of one device in one claim: one CDI device (a spec
            // naming a device twice is refused), an answer for each share.
            let listed = devices.iter().any(|d: &ClaimDevice| d.name == device.name);
            if !listed {
                devices.push(ClaimDevice {
                    name: device.name.clone(),
                    nodes: self.drm_nodes(device.card, device.render_minor).await?,
                });
            }
            answer.push(PreparedDevice {
                request_names: a.request_names.clone(),
                pool_name: self.node.clone(),
                device_name: device.name.clone(),
                cdi_device_ids: vec![cdi::cdi_device_id(&claim.uid, &device.name)],
                share_id: a.share_id.clone(),
                consumed_capacity: a.consumed_capacity.clone(),
                partitions: Vec::new(),
                unknown: Default::default(),
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
        let _one_change = match &self.layouts {
            Some(writer) => Some(writer.lock.lock().await),
            None => None,
        };
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
                        // Kept until the status writer has removed them.
                        checkpoint.status_removals.insert(
                            claim.uid.clone(),
                            ClaimName {
                                namespace: claim.namespace.clone(),
                                name: claim.name.clone(),
                            },
                        );
                    }
                    changed |= checkpoint.kept_specs.remove(&claim.uid);
                }
                self.note_holds(&checkpoint);
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

    /// Records the memory mode prepared layout devices hold, for the
    /// conflict taints.
    pub(crate) fn note_holds(&self, checkpoint: &Checkpoint) {
        if let Some(writer) = &self.layouts {
            let held = layouts::held_memory(
                checkpoint
                    .prepared_claims
                    .values()
                    .flat_map(|c| &c.devices)
                    .map(|d| d.device_name.as_str()),
            );
            writer.state.send_if_modified(|state| {
                let changed = state.held_memory != held;
                state.held_memory = held;
                changed
            });
        }
    }

    /// One share of a layout device: the GPU put in the layout if it is not
    /// (and nothing holds what changes), then the lowest free partitions
    /// given to the share. Its CDI devices and its answer.
    async fn layout_share(
        &self,
        claim: &ClaimRef,
        allocated: &Allocated,
        name: &str,
        layout: &layouts::Layout,
        batch: &mut Batch,
    ) -> Result<(Vec<ClaimDevice>, PreparedDevice), String> {
        let Some(writer) = &self.layouts else {
            return Err(format!(
                "device {name} is a partition layout, but this node does not allocate partitions on demand"
            ));
        };
        let before = crate::device::discover_off_runtime(&writer.host).await;
        let given = match &mut batch.given {
            Some(given) => given,
            None => {
                let checkpoint = {
                    let _lock = CHECKPOINT_LOCK.lock().await;
                    self.load()?
                };
                batch
                    .given
                    .insert(Given::of(&checkpoint, &layouts::ordered(&before)))
            }
        };
        let inventory = match layouts::change_for(
            &layouts::ordered(&before),
            layout,
            name,
            &given.holds,
        ) {
            Change::None => before,
            Change::Refused(why) => return Err(format!("cannot put {name} in place: {why}")),
            Change::Write { plan, reload } => {
                tracing::info!(claim = %format!("{}/{}", claim.namespace, claim.name), device = %name, reload, "repartitioning for a claim");
                // On a task of its own, holding the lock until it ends: a
                // Prepare given up midway (the kubelet's call timed out)
                // must not leave a change half made or undone.
                let (changer, guard) = (writer.clone(), batch.guard.take());
                let change = tokio::spawn(async move {
                    let result = changer.repartition(&plan, reload, &before).await;
                    (result, guard)
                });
                let (result, guard) = change
                    .await
                    .map_err(|e| format!("cannot put {name} in place: the change ended: {e}"))?;
                batch.guard = guard;
                result.map_err(|why| format!("cannot put {name} in place: {why}"))?
            }
        };
        let gpus = layouts::ordered(&inventory);
        let Some(gpu) = gpus
            .get(layout.gpu_index as usize)
            .filter(|g| layouts::runs(g, layout))
        else {
            return Err(format!(
                "GPU {} does not run {} after the change",
                layout.gpu_index,
                layout.profile()
            ));
        };
        let bdf = gpu.bdf.clone();
        let nodes_of: Vec<(Option<u32>, Option<u32>)> = if gpu.partitions.is_empty() {
            vec![(gpu.card, gpu.render_minor)]
        } else {
            gpu.partitions
                .iter()
                .map(|p| (p.card, p.render_minor))
                .collect()
        };
        let taken = given.taken.entry(name.to_owned()).or_default();
        let wanted = layouts::partitions_wanted(&allocated.consumed_capacity);
        let slots = layouts::assign(nodes_of.len() as u32, taken, wanted).ok_or_else(|| {
            format!(
                "{name} has {} partitions and {} are given out: none left for {wanted} more",
                nodes_of.len(),
                taken.len()
            )
        })?;
        let mut devices = Vec::with_capacity(slots.len());
        for &slot in &slots {
            let (Some(card), Some(render)) = nodes_of[slot as usize] else {
                return Err(format!("partition {slot} of GPU {bdf} has no DRM nodes"));
            };
            devices.push(ClaimDevice {
                name: format!("{name}-p{slot}"),
                nodes: self.drm_nodes(card, render).await?,
            });
        }
        // Given only once everything it needs was read.
        taken.extend(slots.iter().copied());
        given.holds.entry(bdf).or_default().insert(name.to_owned());
        let prepared = PreparedDevice {
            request_names: allocated.request_names.clone(),
            pool_name: self.node.clone(),
            device_name: name.to_owned(),
            cdi_device_ids: devices
                .iter()
                .map(|d| cdi::cdi_device_id(&claim.uid, &d.name))
                .collect(),
            share_id: allocated.share_id.clone(),
            consumed_capacity: allocated.consumed_capacity.clone(),
            partitions: slots,
            unknown: Default::default(),
        };
        Ok((devices, prepared))
    }

    /// The DRM nodes `card<card>` and `renderD<render>` with the numbers
    /// the kernel gave them.
    async fn drm_nodes(&self, card: u32, render: u32) -> Result<Vec<DeviceNode>, String> {
        let mut nodes = Vec::with_capacity(2);
        for path in super::devices::dri_paths(card, render) {
            let file = path.trim_start_matches("/dev/dri/");
            nodes.push(
                self.device_node(&path, &format!("/sys/class/drm/{file}/dev"))
                    .await?,
            );
        }
        Ok(nodes)
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
