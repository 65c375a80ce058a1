//! What the DRA driver publishes: one device per whole GPU or per current
//! partition, named and described as the reference DRA driver
//! (ROCm/k8s-gpu-dra-driver) names and describes them. The ResourceSlices
//! that carry them are [`super::slices`]'.
//!
//! With sharing ([`TimeSlicing`] with more than one replica), every device
//! allows multiple allocations (KEP-5075, consumable capacity) and each of its
//! capacities carries a request policy ([`share_policy`]): a claim that asks
//! for no capacity gets a 1/N share by default, `memory` goes in GiB steps,
//! `computeUnits` and `simdUnits` in steps of one XCC.
//!
//! Pure: the inventory, device health and the few host facts discovery does
//! not keep (each GPU's PCIe root) come in as plain data.

use std::collections::BTreeMap;

use k8s_openapi::api::resource::v1::{
    CapacityRequestPolicy, CapacityRequestPolicyRange, DeviceAttribute, DeviceCapacity,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use super::layouts::{self, Layout};
use crate::api::TimeSlicing;
use crate::device::{Gpu, Inventory, family, modes};
use crate::plugin::PluginDevice;

/// The step of shared `memory`: 1 GiB.
pub const MEMORY_STEP: u64 = 1 << 30;

/// The DRA driver name: the reference's, so DeviceClasses and claims carry over.
pub const DRIVER_NAME: &str = "gpu.amd.com";
/// `type` of a whole GPU.
pub const TYPE_GPU: &str = "amdgpu";
/// `type` of one compute partition of a GPU.
pub const TYPE_PARTITION: &str = "amdgpu-partition";
/// The standard attribute names of KEP-4381/5491, which schedulers and other
/// drivers' claims match across drivers.
pub const PCI_BUS_ID: &str = "resource.kubernetes.io/pciBusID";
pub const PCIE_ROOT: &str = "resource.kubernetes.io/pcieRoot";
/// The standard NUMA node attribute (KEP-6072, GA in 1.37), an int, which
/// claims match against CPU, memory and NIC drivers' devices.
pub const NUMA_NODE: &str = "resource.kubernetes.io/numaNode";
/// The driver version exactly as amdgpu reports it (`6.19.14.31400000`),
/// beside `driverVersion`, which must be a semantic version.
pub const DRIVER_VERSION_RAW: &str = "driverVersionRaw";
/// The API's limit on a string or version attribute's length.
pub const MAX_ATTRIBUTE_VALUE_LENGTH: usize = 64;

/// One device as published: a whole GPU, or one partition of a GPU in a
/// compute mode other than SPX.
#[derive(Clone, Debug, PartialEq)]
pub struct DraDevice {
    /// `gpu-<card>-<render minor>`, as the reference names devices; its
    /// prepare path parses the DRM nodes back out of the name, so ours keeps it.
    pub name: String,
    /// PCI address of the GPU the device is (or is part of).
    pub gpu_bdf: String,
    /// Partition index within the GPU; `None` for a whole GPU.
    pub partition: Option<u32>,
    pub card: u32,
    pub render_minor: u32,
    pub numa_node: Option<i64>,
    /// The device's XCCs, when KFD says: the step of shared compute.
    pub xcc_count: Option<u32>,
    pub attributes: BTreeMap<String, DeviceAttribute>,
    pub capacity: BTreeMap<String, DeviceCapacity>,
    /// The layout a device of on-demand partitioning stands for
    /// ([`super::layouts`]); `None` for a GPU or partition as it is. Such a
    /// device's `card` and `render_minor` are its GPU's now, by which its
    /// health is judged; the partitions it hands out are chosen on Prepare.
    pub layout: Option<Layout>,
    /// The value of the [`layouts::CONFLICT_TAINT_KEY`] taint a layout
    /// device carries while it cannot be had.
    pub conflict: Option<String>,
}

impl DraDevice {
    /// The device as the device plugin's health rules see it.
    pub fn as_plugin_device(&self) -> PluginDevice {
        PluginDevice {
            id: self.name.clone(),
            gpu_bdf: self.gpu_bdf.clone(),
            partition: self.partition,
            numa_node: self.numa_node,
            card: Some(self.card),
            render_minor: Some(self.render_minor),
        }
    }

    /// Host paths of its DRM nodes, card first.
    pub fn dri_nodes(&self) -> [String; 2] {
        dri_paths(self.card, self.render_minor)
    }
}

/// Host paths of the DRM nodes `card<card>` and `renderD<render>`.
pub fn dri_paths(card: u32, render_minor: u32) -> [String; 2] {
    [
        format!("/dev/dri/card{card}"),
        format!("/dev/dri/renderD{render_minor}"),
    ]
}

/// The name of a device with these DRM nodes.
pub fn device_name(card: u32, render_minor: u32) -> String {
    format!("gpu-{card}-{render_minor}")
}

/// Host facts discovery does not keep: the PCIe root complex (`pci0000:00`)
/// of each GPU, by PCI address.
pub type PcieRoots = BTreeMap<String, String>;

/// Every device of the inventory, sorted by name. A GPU or partition without a
/// DRM card and render node cannot be handed to a container and is left out
/// (the device plugin reports the same GPU unhealthy for the same reason).
pub fn devices_of(inventory: &Inventory, roots: &PcieRoots) -> Vec<DraDevice> {
    let mut out = Vec::new();
    for gpu in &inventory.gpus {
        let common = common_attributes(gpu, roots, inventory);
        let numa_node = gpu.numa_node.filter(|n| *n >= 0).map(i64::from);
        let whole = gpu.partitions.is_empty()
            || gpu
                .compute_partition
                .as_deref()
                .is_none_or(|mode| mode.is_empty() || mode == "spx");
        if whole {
            let (Some(card), Some(render)) = (gpu.card, gpu.render_minor) else {
                continue;
            };
            out.push(device(
                gpu,
                None,
                card,
                render,
                numa_node,
                common,
                TYPE_GPU,
                (gpu.vram_bytes, gpu.cu_count, gpu.simd_count, gpu.xcc_count),
            ));
            continue;
        }
        for (index, part) in gpu.partitions.iter().enumerate() {
            let (Some(card), Some(render)) = (part.card, part.render_minor) else {
                continue;
            };
            let size = gpu.partition_sizes.get(index).copied().unwrap_or_default();
            let count = gpu.partitions.len() as u64;
            let share = |whole: Option<u64>| whole.map(|w| w / count.max(1));
            let sizes = (
                size.vram_bytes.or(share(gpu.vram_bytes)),
                size.cu_count
                    .or(share(gpu.cu_count.map(u64::from)).map(|v| v as u32)),
                size.simd_count
                    .or(share(gpu.simd_count.map(u64::from)).map(|v| v as u32)),
                size.xcc_count
                    .or(share(gpu.xcc_count.map(u64::from)).map(|v| v as u32)),
            );
            out.push(device(
                gpu,
                Some(part.id),
                card,
                render,
                numa_node,
                common.clone(),
                TYPE_PARTITION,
                sizes,
            ));
        }
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    out.dedup_by(|a, b| a.name == b.name);
    out
}

#[allow(clippy::too_many_arguments)]
fn device(
    gpu: &Gpu,
    partition: Option<u32>,
    card: u32,
    render_minor: u32,
    numa_node: Option<i64>,
    mut attributes: BTreeMap<String, DeviceAttribute>,
    kind: &str,
    (memory, cus, simds, xccs): (Option<u64>, Option<u32>, Option<u32>, Option<u32>),
) -> DraDevice {
    attributes.insert("type".into(), string(kind));
    // The reference's own names for the PCI address: a partition names its GPU's.
    if partition.is_some() {
        attributes.insert("parentPciAddr".into(), string(&gpu.bdf));
        attributes.insert(
            "parentDeviceID".into(),
            string(&format!("0x{:04x}", gpu.device_id)),
        );
    } else {
        attributes.insert("pciAddr".into(), string(&gpu.bdf));
    }
    attributes.insert("cardIndex".into(), int(i64::from(card)));
    attributes.insert("renderIndex".into(), int(i64::from(render_minor)));
    let mut capacity = BTreeMap::new();
    // The reference publishes 0 when the size is unknown, never a guess.
    capacity.insert("memory".into(), quantity(memory.unwrap_or(0)));
    capacity.insert("computeUnits".into(), quantity(u64::from(cus.unwrap_or(0))));
    capacity.insert("simdUnits".into(), quantity(u64::from(simds.unwrap_or(0))));
    DraDevice {
        name: device_name(card, render_minor),
        gpu_bdf: gpu.bdf.clone(),
        partition,
        card,
        render_minor,
        numa_node,
        xcc_count: xccs.filter(|x| *x > 0),
        attributes,
        capacity,
        layout: None,
        conflict: None,
    }
}

/// What the node offers with partitions allocated on demand: each
/// partitionable GPU's layouts ([`super::layouts`]), and every other GPU as
/// [`devices_of`] offers it. Sorted by name.
pub fn layout_devices_of(inventory: &Inventory, roots: &PcieRoots) -> Vec<DraDevice> {
    let mut out = Vec::new();
    // The GPUs offered as they are, with the inventory's driver facts.
    let mut fixed = Inventory {
        driver: inventory.driver.clone(),
        ..Inventory::default()
    };
    for (index, gpu) in layouts::ordered(inventory).into_iter().enumerate() {
        let (Some(card), Some(render)) = (gpu.card, gpu.render_minor) else {
            continue;
        };
        if !layouts::partitionable(gpu) {
            fixed.gpus.push(gpu.clone());
            continue;
        }
        let common = common_attributes(gpu, roots, inventory);
        for (compute, memory) in layouts::layouts_of(gpu) {
            let layout = Layout {
                gpu_index: index as u32,
                partitions: modes::compute_partitions(&compute).unwrap_or(1),
                compute,
                memory,
            };
            out.push(DraDevice {
                name: layouts::layout_name(layout.gpu_index, &layout.compute, &layout.memory),
                gpu_bdf: gpu.bdf.clone(),
                partition: None,
                card,
                render_minor: render,
                numa_node: gpu.numa_node.filter(|n| *n >= 0).map(i64::from),
                xcc_count: gpu.xcc_count.filter(|x| *x > 0),
                attributes: layouts::layout_attributes(gpu, &layout, common.clone()),
                capacity: layouts::capacity_of(gpu, layout.partitions),
                layout: Some(layout),
                conflict: None,
            });
        }
    }
    out.extend(devices_of(&fixed, roots));
    out.sort_by(|a, b| a.name.cmp(&b.name));
    out
}

/// How a capacity of `value` is shared `replicas` ways in steps of `step`:
/// at least one step, at most the whole (in whole steps), one replica's
/// share by default. `None` where the API cannot express it (an unknown, 0
/// size; less than two steps, when a step of 1 is used instead, and a value
/// of 1): that capacity then goes whole to each claim that does not ask
/// for less. Pure.
pub fn share_policy(value: u64, replicas: u32, step: u64) -> Option<CapacityRequestPolicy> {
    // The API wants min + step within the value.
    let step = if step >= 1 && value >= step.saturating_mul(2) {
        step
    } else {
        1
    };
    if value < 2 {
        return None;
    }
    let max = value / step * step;
    let share = value / u64::from(replicas.max(1)) / step * step;
    let default = share.clamp(step, max);
    let q = |v: u64| Quantity(v.to_string());
    Some(CapacityRequestPolicy {
        default: Some(q(default)),
        valid_range: Some(CapacityRequestPolicyRange {
            min: q(step),
            max: Some(q(max)),
            step: Some(q(step)),
        }),
        valid_values: None,
    })
}

/// The device's capacities, with request policies when it is shared.
pub(super) fn shared_capacity(
    device: &DraDevice,
    sharing: &TimeSlicing,
) -> BTreeMap<String, DeviceCapacity> {
    let mut capacity = device.capacity.clone();
    if !sharing.is_shared() {
        return capacity;
    }
    for (name, entry) in &mut capacity {
        let Some(value) = quantity_value(&entry.value.0).and_then(|v| u64::try_from(v).ok()) else {
            continue;
        };
        let step = match name.as_str() {
            "memory" => MEMORY_STEP,
            // One XCC's worth, when the XCCs divide the units evenly.
            _ => device
                .xcc_count
                .map(u64::from)
                .filter(|x| value % x == 0)
                .map_or(1, |x| value / x),
        };
        entry.request_policy = share_policy(value, sharing.replicas, step);
    }
    capacity
}

/// Attributes a GPU's devices share, whole or partitioned.
fn common_attributes(
    gpu: &Gpu,
    roots: &PcieRoots,
    inventory: &Inventory,
) -> BTreeMap<String, DeviceAttribute> {
    let mut a = BTreeMap::new();
    if let Some(name) = gpu.product_name.as_deref().map(product_name)
        && !name.is_empty()
    {
        a.insert("productName".into(), string(&name));
    }
    if let Some(family) = gpu.gfx_target_version.and_then(family) {
        a.insert("family".into(), string(family));
    }
    a.insert(
        "deviceID".into(),
        string(&format!("0x{:04x}", gpu.device_id)),
    );
    if let Some(raw) = inventory.driver.version.as_deref().map(str::trim) {
        if let Some(semver) = semver_of(raw) {
            a.insert("driverVersion".into(), version_attr(semver));
        }
        // A longer string would cost the whole slice; the semver still says it.
        if !raw.is_empty() && raw.len() <= MAX_ATTRIBUTE_VALUE_LENGTH {
            a.insert(DRIVER_VERSION_RAW.into(), string(raw));
        }
    }
    if let Some(src) = inventory.driver.srcversion.as_deref()
        && !src.is_empty()
    {
        a.insert("driverSrcVersion".into(), string(src));
    }
    if gpu.supports_compute_partitioning()
        && let Some(profile) = gpu.partition_profile()
    {
        a.insert(
            "partitionProfile".into(),
            string(&profile.to_ascii_lowercase()),
        );
    }
    if let Some(numa) = gpu.numa_node.filter(|n| *n >= 0) {
        a.insert("numaNode".into(), int(i64::from(numa)));
        a.insert(NUMA_NODE.into(), int(i64::from(numa)));
    }
    a.insert(PCI_BUS_ID.into(), string(&gpu.bdf));
    if let Some(root) = roots.get(&gpu.bdf) {
        a.insert(PCIE_ROOT.into(), string(root));
    }
    a
}

/// The product name as the reference publishes it: spaces become `_`,
/// parentheses go, and the attribute's limit of 64 bytes (not characters: a
/// `™` is three) holds.
fn product_name(raw: &str) -> String {
    let mut out = String::new();
    for c in raw
        .trim()
        .chars()
        .filter(|c| !matches!(c, '(' | ')'))
        .map(|c| if c == ' ' { '_' } else { c })
    {
        if out.len() + c.len_utf8() > MAX_ATTRIBUTE_VALUE_LENGTH {
            break;
        }
        out.push(c);
    }
    out
}

/// A semantic version (2.0.0) from an amdgpu version string, which the API
/// requires of a version attribute: `6.12.12` stays, `6.8.5-2041575.22.04`
/// keeps its numbers and drops what is not a valid pre-release, `6.8` gains
/// a patch level. `None` when it does not start with a number.
pub fn semver_of(raw: &str) -> Option<String> {
    let core: String = raw
        .trim()
        .trim_start_matches('v')
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == '.')
        .collect();
    let mut parts: Vec<u64> = Vec::new();
    for part in core.split('.').filter(|p| !p.is_empty()).take(3) {
        parts.push(part.parse().ok()?);
    }
    if parts.is_empty() {
        return None;
    }
    parts.resize(3, 0);
    Some(format!("{}.{}.{}", parts[0], parts[1], parts[2]))
}

fn string(value: &str) -> DeviceAttribute {
    DeviceAttribute {
        string: Some(value.to_owned()),
        ..DeviceAttribute::default()
    }
}

fn int(value: i64) -> DeviceAttribute {
    DeviceAttribute {
        int: Some(value),
        ..DeviceAttribute::default()
    }
}

fn version_attr(value: String) -> DeviceAttribute {
    DeviceAttribute {
        version: Some(value),
        ..DeviceAttribute::default()
    }
}

fn quantity(value: u64) -> DeviceCapacity {
    DeviceCapacity {
        value: Quantity(value.to_string()),
        ..DeviceCapacity::default()
    }
}

/// The value of an integer quantity (`304`, `192Gi`, `1k`, `2e3`); `None`
/// for fractions and anything else, which then compare as written.
pub fn quantity_value(text: &str) -> Option<u128> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (digits, suffix) = text.split_at(split);
    let number: u128 = digits.parse().ok()?;
    let scale: u128 = match suffix {
        "" => 1,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        "Ti" => 1 << 40,
        "Pi" => 1 << 50,
        "Ei" => 1 << 60,
        "k" => 1_000,
        "M" => 1_000_000,
        "G" => 1_000_000_000,
        "T" => 1_000_000_000_000,
        "P" => 1_000_000_000_000_000,
        "E" => 1_000_000_000_000_000_000,
        exp if exp.starts_with(['e', 'E']) => 10u128.checked_pow(exp[1..].parse().ok()?)?,
        _ => return None,
    };
    number.checked_mul(scale)
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::device::{DriverState, NodeSize, Partition};

    pub(in crate::dra) fn gpu(bdf: &str, card: u32, render: u32) -> Gpu {
        Gpu {
            bdf: bdf.into(),
            vendor_id: 0x1002,
            device_id: 0x74a1,
            product_name: Some("AMD Instinct MI300X (OAM)".into()),
            numa_node: Some(0),
            card: Some(card),
            render_minor: Some(render),
            vram_bytes: Some(192 << 30),
            cu_count: Some(304),
            simd_count: Some(1216),
            gfx_target_version: Some(90402),
            compute_partition: Some("spx".into()),
            memory_partition: Some("nps1".into()),
            available_compute_partitions: vec!["spx".into(), "cpx".into()],
            available_memory_partitions: vec!["nps1".into(), "nps4".into()],
            ..Gpu::default()
        }
    }

    pub(in crate::dra) fn inventory(gpus: Vec<Gpu>) -> Inventory {
        Inventory {
            driver: DriverState {
                loaded: true,
                version: Some("6.12.12".into()),
                srcversion: Some("ABCDEF".into()),
                kfd_present: true,
            },
            gpus,
            ..Inventory::default()
        }
    }

    pub(in crate::dra) fn attr<'a>(d: &'a DraDevice, key: &str) -> &'a DeviceAttribute {
        d.attributes
            .get(key)
            .unwrap_or_else(|| panic!("{key} missing"))
    }

    #[test]
    fn a_whole_gpu_is_one_device_named_after_its_drm_nodes() {
        let roots = PcieRoots::from([("0000:05:00.0".to_string(), "pci0000:00".to_string())]);
        let devices = devices_of(&inventory(vec![gpu("0000:05:00.0", 1, 128)]), &roots);
        assert_eq!(devices.len(), 1);
        let d = &devices[0];
        assert_eq!(d.name, "gpu-1-128");
        assert_eq!(attr(d, "type").string.as_deref(), Some("amdgpu"));
        assert_eq!(
            attr(d, "productName").string.as_deref(),
            Some("AMD_Instinct_MI300X_OAM")
        );
        assert_eq!(attr(d, "family").string.as_deref(), Some("AI"));
        assert_eq!(attr(d, "deviceID").string.as_deref(), Some("0x74a1"));
        assert_eq!(attr(d, "driverVersion").version.as_deref(), Some("6.12.12"));
        assert_eq!(
            attr(d, "driverSrcVersion").string.as_deref(),
            Some("ABCDEF")
        );
        assert_eq!(
            attr(d, "partitionProfile").string.as_deref(),
            Some("spx_nps1")
        );
        assert_eq!(attr(d, "cardIndex").int, Some(1));
        assert_eq!(attr(d, "renderIndex").int, Some(128));
        assert_eq!(attr(d, "numaNode").int, Some(0));
        assert_eq!(attr(d, NUMA_NODE).int, Some(0));
        assert_eq!(
            attr(d, DRIVER_VERSION_RAW).string.as_deref(),
            Some("6.12.12")
        );
        assert_eq!(attr(d, "pciAddr").string.as_deref(), Some("0000:05:00.0"));
        assert_eq!(attr(d, PCI_BUS_ID).string.as_deref(), Some("0000:05:00.0"));
        assert_eq!(attr(d, PCIE_ROOT).string.as_deref(), Some("pci0000:00"));
        assert_eq!(d.capacity["memory"].value.0, (192u64 << 30).to_string());
        assert_eq!(d.capacity["computeUnits"].value.0, "304");
        assert_eq!(d.capacity["simdUnits"].value.0, "1216");
    }

    #[test]
    fn a_partitioned_gpu_is_one_device_per_partition_sized_by_its_kfd_node() {
        let mut g = gpu("0000:05:00.0", 1, 128);
        g.compute_partition = Some("cpx".into());
        g.memory_partition = Some("nps4".into());
        g.partitions = (0..8)
            .map(|i| Partition {
                id: i,
                card: Some(1 + i),
                render_minor: Some(128 + i),
                ..Partition::default()
            })
            .collect();
        g.partition_sizes = vec![
            NodeSize {
                cu_count: Some(38),
                simd_count: Some(152),
                vram_bytes: Some(24 << 30),
                xcc_count: Some(1),
            };
            8
        ];
        let devices = devices_of(&inventory(vec![g]), &PcieRoots::new());
        assert_eq!(devices.len(), 8);
        for d in &devices {
            assert_eq!(attr(d, "type").string.as_deref(), Some("amdgpu-partition"));
            assert_eq!(
                attr(d, "partitionProfile").string.as_deref(),
                Some("cpx_nps4")
            );
            assert_eq!(attr(d, PCI_BUS_ID).string.as_deref(), Some("0000:05:00.0"));
            assert_eq!(
                attr(d, "parentPciAddr").string.as_deref(),
                Some("0000:05:00.0")
            );
            assert_eq!(attr(d, "parentDeviceID").string.as_deref(), Some("0x74a1"));
            assert!(!d.attributes.contains_key("pciAddr"));
            assert_eq!(attr(d, NUMA_NODE).int, Some(0));
            assert_eq!(d.capacity["computeUnits"].value.0, "38");
            assert_eq!(d.capacity["memory"].value.0, (24u64 << 30).to_string());
            assert!(!d.attributes.contains_key(PCIE_ROOT), "no root known");
        }
        assert_eq!(devices[0].partition, Some(0));
    }

    #[test]
    fn a_long_product_name_is_cut_at_64_bytes_not_characters() {
        let name = product_name(&format!("AMD Instinct™ {}", "X".repeat(80)));
        assert!(
            name.len() <= MAX_ATTRIBUTE_VALUE_LENGTH,
            "{} bytes",
            name.len()
        );
        assert!(name.starts_with("AMD_Instinct™_X"), "{name}");
        assert_eq!(name.len(), MAX_ATTRIBUTE_VALUE_LENGTH);
    }

    #[test]
    fn a_gpu_without_drm_nodes_is_left_out() {
        let mut g = gpu("0000:05:00.0", 1, 128);
        g.render_minor = None;
        assert!(devices_of(&inventory(vec![g]), &PcieRoots::new()).is_empty());
    }

    #[test]
    fn versions_become_semver() {
        assert_eq!(semver_of("6.12.12").as_deref(), Some("6.12.12"));
        assert_eq!(semver_of("6.8.5-2041575.22.04").as_deref(), Some("6.8.5"));
        assert_eq!(semver_of("6.8").as_deref(), Some("6.8.0"));
        assert_eq!(semver_of("v1.2.3.4").as_deref(), Some("1.2.3"));
        assert_eq!(semver_of("inbox"), None);
        assert_eq!(semver_of("99999999999999999999999.1"), None);
    }

    #[test]
    fn shares_default_to_one_replica_in_whole_steps_within_the_device() {
        let policy = |value: u64, replicas: u32, step: u64| {
            let p = share_policy(value, replicas, step)?;
            let range = p.valid_range.unwrap();
            let n = |q: Option<Quantity>| q.map(|q| q.0.parse::<u64>().unwrap());
            Some((
                n(p.default),
                n(Some(range.min)),
                n(range.max),
                n(range.step),
            ))
        };
        let gib = MEMORY_STEP;
        // 192 GiB shared 4 ways: 48 GiB each by default, in GiB steps.
        assert_eq!(
            policy(192 * gib, 4, gib),
            Some((Some(48 * gib), Some(gib), Some(192 * gib), Some(gib)))
        );
        // 191.5 GiB: whole GiB only, so at most 191.
        assert_eq!(
            policy(191 * gib + gib / 2, 1, gib).unwrap().2,
            Some(191 * gib)
        );
        // 304 CUs in 8 XCCs of 38, 3 ways: 76 (two XCCs) by default.
        assert_eq!(
            policy(304, 3, 38),
            Some((Some(76), Some(38), Some(304), Some(38)))
        );
        // More replicas than steps: one step each.
        assert_eq!(policy(304, 64, 38).unwrap().0, Some(38));
        // One XCC's 38 CUs cannot be cut in XCCs: single units.
        assert_eq!(
            policy(38, 2, 38),
            Some((Some(19), Some(1), Some(38), Some(1)))
        );
        // Nothing to share.
        assert_eq!(policy(0, 4, 1), None);
        assert_eq!(policy(1, 4, 1), None);
    }
}
