//! AMD GPUs the PCI bus shows that amdgpu does not serve: unbound, or bound to
//! another driver (vfio-pci, say). Discovery sees only GPUs bound to amdgpu;
//! this names the others, so that "0 GPU(s)" on a GPU node comes with a hint.
//!
//! Read on demand by the commands a person runs (`discover`, `check`), never on
//! the agent's rescan path. Reads go through the host root; it must not decide
//! anything about the GPUs it lists.

use serde::Serialize;

use super::model::is_bdf;
use crate::host::reader::BoundedReader;
use crate::host::{HostRead, HostRoot, parse_hex};

const PCI_DEVICES: &str = "/sys/bus/pci/devices";
const AMD_VENDOR: u64 = 0x1002;
/// PCI base classes of GPUs: display controllers and processing accelerators.
const GPU_CLASSES: [u64; 2] = [0x03, 0x12];

/// An AMD GPU function that amdgpu does not drive.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct UnboundGpu {
    pub bdf: String,
    /// PCI device id, e.g. `0x74a1`.
    pub device_id: Option<String>,
    /// The driver bound instead, if any.
    pub driver: Option<String>,
}

impl std::fmt::Display for UnboundGpu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.bdf)?;
        if let Some(id) = &self.device_id {
            write!(f, " (device {id})")?;
        }
        match &self.driver {
            Some(driver) => write!(f, " bound to {driver}"),
            None => write!(f, " bound to no driver"),
        }
    }
}

/// An AMD GPU function on the PCI bus (display controller or processing
/// accelerator, vendor 0x1002), whatever drives it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PciGpuFunction {
    pub bdf: String,
    /// PCI device id.
    pub device_id: Option<u16>,
    /// The driver bound, if any.
    pub driver: Option<String>,
}

/// The AMD GPU functions under `/sys/bus/pci/devices`, bound or not.
/// Unreadable entries (hung ones included: reads are bounded as discovery's
/// are) are skipped.
pub fn amd_gpu_functions(host: &HostRoot) -> Vec<PciGpuFunction> {
    let reader = BoundedReader::new(host.clone(), BoundedReader::DEFAULT_MAX_THREADS);
    super::bounded::run_bounded(&reader, super::Limits::default(), |h| functions_with(h))
        .map(|(gpus, _)| gpus)
        .unwrap_or_default()
}

/// The AMD GPU functions under `/sys/bus/pci/devices` not bound to amdgpu:
/// a hint, not an inventory.
pub fn unbound_amd_gpus(host: &HostRoot) -> Vec<UnboundGpu> {
    amd_gpu_functions(host)
        .into_iter()
        .filter(|f| f.driver.as_deref() != Some("amdgpu"))
        .map(|f| UnboundGpu {
            device_id: f.device_id.map(|id| format!("{id:#06x}")),
            bdf: f.bdf,
            driver: f.driver,
        })
        .collect()
}

fn functions_with(host: &dyn HostRead) -> Vec<PciGpuFunction> {
    let Ok(names) = host.list_dir(PCI_DEVICES) else {
        return Vec::new();
    };
    let hex = |path: String| {
        host.read_optional_attr(&path)
            .ok()
            .flatten()
            .and_then(|v| parse_hex(&v))
    };
    names
        .into_iter()
        .filter(|name| is_bdf(name))
        .filter_map(|bdf| {
            let dir = format!("{PCI_DEVICES}/{bdf}");
            if hex(format!("{dir}/vendor")) != Some(AMD_VENDOR) {
                return None;
            }
            let class = hex(format!("{dir}/class"))?;
            if !GPU_CLASSES.contains(&(class >> 16)) {
                return None;
            }
            let device_id = hex(format!("{dir}/device")).and_then(|id| u16::try_from(id).ok());
            Some(PciGpuFunction {
                driver: bound_driver(host, &dir),
                bdf,
                device_id,
            })
        })
        .collect()
}

/// The driver a PCI function is bound to, from the `DRIVER=` line of its
/// `uevent` (present only while a driver is bound).
fn bound_driver(host: &dyn HostRead, dir: &str) -> Option<String> {
    let uevent = host.read_attr(&format!("{dir}/uevent")).ok()?;
    uevent
        .lines()
        .find_map(|line| line.strip_prefix("DRIVER="))
        .map(str::to_owned)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::simulate::{self, SimSpec};

    #[test]
    fn names_gpus_without_amdgpu_and_not_those_with_it() {
        let dir = tempfile::tempdir().unwrap();
        let host = HostRoot::new(dir.path());
        let mut spec = SimSpec::new("mi210", Some(2), None).unwrap();
        spec.driver_loaded = false;
        simulate::write_host(&host, &spec).unwrap();
        let unbound = unbound_amd_gpus(&host);
        assert_eq!(unbound.len(), 2, "{unbound:?}");
        assert_eq!(unbound[0].driver, None);
        assert!(unbound[0].to_string().ends_with("bound to no driver"));

        let bound = tempfile::tempdir().unwrap();
        let host = HostRoot::new(bound.path());
        simulate::write_host(&host, &SimSpec::new("mi210", Some(2), None).unwrap()).unwrap();
        assert_eq!(unbound_amd_gpus(&host), []);
        // Another driver, as after binding a GPU to vfio-pci for a VM.
        let first = &host.list_dir(PCI_DEVICES).unwrap()[0];
        let uevent = host.path(format!("{PCI_DEVICES}/{first}/uevent"));
        let text = std::fs::read_to_string(&uevent).unwrap();
        std::fs::write(&uevent, text.replace("DRIVER=amdgpu", "DRIVER=vfio-pci")).unwrap();
        let found = unbound_amd_gpus(&host);
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].driver.as_deref(), Some("vfio-pci"));
    }

    #[test]
    fn gfx_target_names() {
        use crate::device::gfx_target_name;
        assert_eq!(gfx_target_name(90402), "gfx942");
        assert_eq!(gfx_target_name(90010), "gfx90a");
        assert_eq!(gfx_target_name(110000), "gfx1100");
        assert_eq!(gfx_target_name(90008), "gfx908");
    }
}
