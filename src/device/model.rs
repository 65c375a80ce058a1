//! The inventory: what discovery found, as plain data.
//!
//! These types are the contract between discovery and everything that consumes it
//! (device plugin, labeller, metrics, health, partitioning) and the JSON shape of
//! `gpu-operator discover --output json`. Keep field names stable.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Everything discovery knows about one host.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Inventory {
    pub driver: DriverState,
    pub gpus: Vec<Gpu>,
    /// Host-level problems: GPUs skipped because they vanished mid-scan or could
    /// not be read at all, KFD nodes that belong to no GPU, unreadable directories.
    #[serde(default)]
    pub warnings: Vec<String>,
}

/// State of the amdgpu kernel driver.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DriverState {
    /// `/sys/module/amdgpu` exists.
    pub loaded: bool,
    /// `/sys/module/amdgpu/version`: set by the out-of-tree (DKMS) driver, absent for
    /// the inbox driver.
    pub version: Option<String>,
    pub srcversion: Option<String>,
    /// `/dev/kfd` exists: the compute interface is usable.
    #[serde(default)]
    pub kfd_present: bool,
}

/// One GPU as the kernel exposes it: a PCI function bound to amdgpu. An MI250X
/// card is two of these (one per GCD); an MI300X in CPX mode is one with eight
/// partitions.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Gpu {
    /// PCI address, `dddd:bb:dd.f`, lowercase.
    pub bdf: String,
    #[serde(with = "hex16")]
    pub vendor_id: u16,
    #[serde(with = "hex16")]
    pub device_id: u16,
    #[serde(default, with = "hex16_opt")]
    pub revision: Option<u16>,
    #[serde(default, with = "hex16_opt")]
    pub subsystem_vendor_id: Option<u16>,
    #[serde(default, with = "hex16_opt")]
    pub subsystem_device_id: Option<u16>,
    /// Absent on SR-IOV virtual functions and some older boards.
    pub product_name: Option<String>,
    /// The board's part number (`product_number`, from its FRU EEPROM, as
    /// `product_name`); amd-smi's board model number.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub product_number: Option<String>,
    /// The board manufacturer (`manufacturer`, from the FRU EEPROM; newer
    /// kernels).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub manufacturer: Option<String>,
    #[serde(default)]
    pub serial_number: Option<String>,
    #[serde(default)]
    pub vbios_version: Option<String>,
    /// NUMA node of the PCI function; `-1` (no affinity) is kept as the kernel reports it.
    pub numa_node: Option<i32>,
    /// DRM card index (`/dev/dri/cardN`) of the GPU itself (partition 0 when partitioned).
    pub card: Option<u32>,
    /// DRM render minor (`/dev/dri/renderDN`).
    pub render_minor: Option<u32>,
    /// KFD topology node of the GPU itself (partition 0 when partitioned).
    pub kfd_node: Option<u32>,
    pub vram_bytes: Option<u64>,
    /// Compute units across the whole GPU (all partitions).
    pub cu_count: Option<u32>,
    pub simd_count: Option<u32>,
    /// Accelerator complex dies (XCCs) across the whole GPU: KFD's `num_xcc`.
    #[serde(default)]
    pub xcc_count: Option<u32>,
    /// e.g. 90402 for gfx942.
    pub gfx_target_version: Option<u32>,
    /// XGMI hive; GPUs with the same non-zero id are joined by XGMI. Decimal, as a
    /// string, since JSON readers lose precision on 64-bit integers.
    #[serde(default, with = "u64_string_opt")]
    pub hive_id: Option<u64>,
    #[serde(default, with = "u64_string_opt")]
    pub unique_id: Option<u64>,
    /// Current compute partition mode, lowercase (`spx`, `dpx`, `qpx`, `cpx`); `None`
    /// when the GPU is not partitionable.
    pub compute_partition: Option<String>,
    /// Current memory partition mode, lowercase (`nps1`, `nps4`).
    pub memory_partition: Option<String>,
    pub available_compute_partitions: Vec<String>,
    pub available_memory_partitions: Vec<String>,
    /// Firmware versions by engine, named as the reference labeller names them
    /// (`MEC`, `SDMA0`, `SMC`, ...): from `fw_version/*_fw_version`, or for MEC and
    /// SDMA0 from KFD when sysfs has none.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub firmware: BTreeMap<String, u32>,
    /// The partitions when the GPU is split into more than one; empty for a whole GPU.
    pub partitions: Vec<Partition>,
    /// What each partition's own KFD node reports of its size, one entry per
    /// entry of `partitions`, in the same order; empty for a whole GPU. The
    /// reference labeller labels partitions with these values.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub partition_sizes: Vec<NodeSize>,
    /// Links to other GPUs, one per peer, the fastest kind first.
    pub links: Vec<Link>,
    /// What could not be read or made sense of. The GPU is still reported.
    pub problems: Vec<String>,
}

impl Gpu {
    /// True when the kernel offers compute partition modes for this GPU.
    pub fn supports_compute_partitioning(&self) -> bool {
        !self.available_compute_partitions.is_empty()
    }

    pub fn supports_memory_partitioning(&self) -> bool {
        !self.available_memory_partitions.is_empty()
    }

    /// `cpx_nps4`-style name of the current partition layout, when partitionable.
    pub fn partition_profile(&self) -> Option<String> {
        match (&self.compute_partition, &self.memory_partition) {
            (Some(c), Some(m)) => Some(format!("{c}_{m}")),
            _ => None,
        }
    }
}

/// One compute partition of a GPU, backed by its own KFD node and DRM nodes.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Partition {
    /// Index of the partition within its GPU, from 0.
    pub id: u32,
    pub card: Option<u32>,
    pub render_minor: Option<u32>,
    pub kfd_node: Option<u32>,
    /// The platform device behind the partition's DRM nodes (`amdgpu_xcp_N` or
    /// `amdgpu_xcp.N`); `None` for partition 0, whose nodes are the GPU's own.
    #[serde(default)]
    pub platform_device: Option<String>,
}

/// The compute and memory size one KFD node reports: a whole GPU, or one
/// partition of it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeSize {
    /// `simd_count / simd_per_cu` of the node.
    pub cu_count: Option<u32>,
    pub simd_count: Option<u32>,
    /// The node's framebuffer memory banks.
    pub vram_bytes: Option<u64>,
    /// The node's XCCs (KFD's `num_xcc`).
    #[serde(default)]
    pub xcc_count: Option<u32>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LinkKind {
    Xgmi,
    Pcie,
    Other,
}

impl LinkKind {
    /// Maps a KFD `io_links` / `p2p_links` `type` value.
    pub fn from_kfd_type(value: u64) -> Self {
        match value {
            11 => LinkKind::Xgmi,
            2 => LinkKind::Pcie,
            _ => LinkKind::Other,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Link {
    pub to_bdf: String,
    pub kind: LinkKind,
    /// KFD link weight: lower is closer.
    pub weight: u32,
}

/// Formats a PCI address the way sysfs names it.
pub fn format_bdf(domain: u32, bus: u8, device: u8, function: u8) -> String {
    format!("{domain:04x}:{bus:02x}:{device:02x}.{function:x}")
}

/// Splits a KFD `location_id` into (bus, device, function).
pub fn split_location_id(location_id: u64) -> (u8, u8, u8) {
    (
        ((location_id >> 8) & 0xff) as u8,
        ((location_id >> 3) & 0x1f) as u8,
        (location_id & 0x7) as u8,
    )
}

/// The LLVM target name of a KFD `gfx_target_version`: major, then minor and
/// stepping as one hex digit each (`90402` is `gfx942`, `90010` is `gfx90a`,
/// `110000` is `gfx1100`).
pub fn gfx_target_name(version: u32) -> String {
    format!(
        "gfx{}{:x}{:x}",
        version / 10000,
        version / 100 % 100,
        version % 100
    )
}

/// Family acronym of a `gfx_target_version` (major*10000 + minor*100 + stepping),
/// as the reference labeller (and DRA driver) name amdgpu families.
pub fn family(gfx_target_version: u32) -> Option<&'static str> {
    let major = gfx_target_version / 10000;
    let minor = gfx_target_version / 100 % 100;
    let step = gfx_target_version % 100;
    Some(match (major, minor, step) {
        (6, ..) => "SI",
        (7, ..) => "CI",
        (8, 0, 1) => "CZ",
        (8, ..) => "VI",
        (9, 0, 2 | 0xc) | (9, 0, 9) => "RV",
        (9, ..) => "AI",
        (10, 3, 3) => "VGH",
        (10, 3, 5) => "YC",
        (10, 3, 6) => "GC_10_3_6",
        (10, 3, 7) => "GC_10_3_7",
        (10, ..) => "NV",
        (11, 0, 3) => "GC_11_0_1",
        (11, 0, _) => "GC_11_0_0",
        (11, 5, _) => "GC_11_5_0",
        (12, 0, _) => "GC_12_0_0",
        _ => return None,
    })
}

/// True for `dddd:bb:dd.f`, the form of PCI device directory names.
pub fn is_bdf(name: &str) -> bool {
    let b = name.as_bytes();
    b.len() == 12
        && b[4] == b':'
        && b[7] == b':'
        && b[10] == b'.'
        && b.iter()
            .enumerate()
            .all(|(i, c)| matches!(i, 4 | 7 | 10) || c.is_ascii_hexdigit())
}

mod hex16 {
    use serde::{Deserialize, Deserializer, Serializer, de::Error};

    pub fn serialize<S: Serializer>(value: &u16, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&format!("0x{value:04x}"))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<u16, D::Error> {
        let text = String::deserialize(d)?;
        crate::host::parse_hex(&text)
            .and_then(|v| u16::try_from(v).ok())
            .ok_or_else(|| D::Error::custom(format!("{text:?} is not a 16-bit hex number")))
    }
}

mod hex16_opt {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(value: &Option<u16>, s: S) -> Result<S::Ok, S::Error> {
        match value {
            Some(v) => super::hex16::serialize(v, s),
            None => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u16>, D::Error> {
        #[derive(Deserialize)]
        struct Wrap(#[serde(with = "super::hex16")] u16);
        Ok(Option::<Wrap>::deserialize(d)?.map(|Wrap(v)| v))
    }
}

mod u64_string_opt {
    use serde::{Deserialize, Deserializer, Serializer, de::Error};

    pub fn serialize<S: Serializer>(value: &Option<u64>, s: S) -> Result<S::Ok, S::Error> {
        match value {
            Some(v) => s.serialize_str(&v.to_string()),
            None => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
        Option::<String>::deserialize(d)?
            .map(|text| text.parse().map_err(D::Error::custom))
            .transpose()
    }
}

/// GPUs as tests build them.
#[cfg(test)]
impl Gpu {
    /// An MI300X at `bdf` that can be split in SPX or CPX (NPS1), split into
    /// `partitions` (0 or 1: whole, in SPX), each partition with its index
    /// only: tests fill in the nodes they need.
    pub(crate) fn split_into(bdf: &str, partitions: u32) -> Gpu {
        Gpu {
            bdf: bdf.into(),
            device_id: 0x74a1,
            available_compute_partitions: vec!["spx".into(), "cpx".into()],
            available_memory_partitions: vec!["nps1".into()],
            compute_partition: Some(if partitions > 1 { "cpx" } else { "spx" }.into()),
            memory_partition: Some("nps1".into()),
            partitions: (0..partitions)
                .filter(|_| partitions > 1)
                .map(|id| Partition {
                    id,
                    ..Partition::default()
                })
                .collect(),
            ..Gpu::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn location_id_maps_to_bdf() {
        // From the MI300X CPX capture: partitions of the GPU at bus 0x05 are 1280..1287.
        let (bus, dev, func) = split_location_id(1283);
        assert_eq!(format_bdf(0, bus, dev, func), "0000:05:00.3");
        let (bus, dev, func) = split_location_id(25344);
        assert_eq!(format_bdf(0, bus, dev, func), "0000:63:00.0");
    }

    #[test]
    fn bdf_shape() {
        assert!(is_bdf("0000:05:00.0"));
        assert!(is_bdf("0001:c1:1f.7"));
        assert!(!is_bdf("module"));
        assert!(!is_bdf("0000:05:00.0x"));
        assert!(!is_bdf("0000-05:00.0"));
    }

    #[test]
    fn gpu_json_round_trips() {
        let gpu = Gpu {
            bdf: "0000:05:00.0".into(),
            vendor_id: 0x1002,
            device_id: 0x74a1,
            hive_id: Some(15188982192727901047),
            numa_node: Some(-1),
            ..Gpu::default()
        };
        let json = serde_json::to_value(&gpu).unwrap();
        assert_eq!(json["vendor_id"], "0x1002");
        assert_eq!(json["hive_id"], "15188982192727901047");
        let back: Gpu = serde_json::from_value(json).unwrap();
        assert_eq!(back, gpu);
    }
}
