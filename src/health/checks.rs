//! The health checks: pure functions from one health sample of a GPU (and the
//! inventory) to the problems found, each a short sentence for people.
//!
//! A value that could not be read is no evidence: it fails no check (a hung
//! sysfs file must not make a GPU unhealthy by itself). Sentences avoid values
//! that change every sample (the current temperature), so that the Node
//! condition built from them is rewritten only when something really changes.

use std::collections::{BTreeMap, BTreeSet};

use crate::device::{Gpu, Inventory};
use crate::telemetry::config::HealthThresholds;
use crate::telemetry::fields::ecc_suffix;
use crate::telemetry::sample::{GpuReadings, HostSample};

/// Junction limit when neither the configuration nor the driver gives one.
pub const DEFAULT_JUNCTION_CRITICAL_C: f64 = 105.0;

/// What the checks compare against.
#[derive(Clone, Debug, PartialEq)]
pub struct Thresholds {
    /// ECC and junction thresholds from the exporter config.
    pub limits: HealthThresholds,
    /// Report PCIe links running below their maximum width or speed. Links that
    /// save power by slowing down when idle make this noisy on some hosts.
    pub pcie_link: bool,
}

impl Default for Thresholds {
    fn default() -> Self {
        Self {
            limits: HealthThresholds::default(),
            pcie_link: true,
        }
    }
}

/// The PCI function is there and bound to amdgpu.
pub fn check_presence(r: &GpuReadings) -> Option<String> {
    if r.present == Some(false) {
        return Some(format!("PCI device {} is gone", r.bdf));
    }
    if r.bound == Some(false) {
        return Some(format!("PCI device {} is not bound to amdgpu", r.bdf));
    }
    None
}

/// `/dev/kfd` exists (every GPU needs it).
pub fn check_kfd(kfd_present: Option<bool>) -> Option<String> {
    (kfd_present == Some(false)).then(|| "/dev/kfd does not exist".to_owned())
}

/// Every DRM node of the GPU and its partitions exists.
pub fn check_nodes(r: &GpuReadings) -> Vec<String> {
    r.missing_nodes
        .iter()
        .map(|node| format!("{node} does not exist"))
        .collect()
}

/// Uncorrectable errors of each RAS block stay within their threshold.
pub fn check_ecc(r: &GpuReadings, limits: &HealthThresholds) -> Vec<String> {
    r.ecc
        .iter()
        .filter_map(|(block, count)| {
            let limit = limits.ecc_threshold(block);
            (count.ue > limit).then(|| {
                let name = ecc_suffix(block).unwrap_or(block).to_ascii_uppercase();
                format!(
                    "{} uncorrectable ECC errors in {name} (threshold {limit})",
                    count.ue
                )
            })
        })
        .collect()
}

/// The junction temperature stays below the critical limit: the configured one,
/// else the driver's (`temp*_crit`), else [`DEFAULT_JUNCTION_CRITICAL_C`].
pub fn check_junction(r: &GpuReadings, limits: &HealthThresholds) -> Option<String> {
    let temp = r.temperature.junction_c?;
    let limit = limits
        .junction_critical_c
        .or(r.temperature.junction_crit_c)
        .unwrap_or(DEFAULT_JUNCTION_CRITICAL_C);
    (temp >= limit).then(|| format!("junction temperature at or above the critical {limit} °C"))
}

/// The PCIe link runs at its maximum width and speed.
pub fn check_pcie(r: &GpuReadings) -> Vec<String> {
    let mut problems = Vec::new();
    let p = &r.pcie;
    if let (Some(width), Some(max)) = (p.width, p.max_width)
        && width < max
    {
        problems.push(format!("PCIe link width x{width} below its maximum x{max}"));
    }
    if let (Some(speed), Some(max)) = (p.speed_gts, p.max_speed_gts)
        && speed < max
    {
        problems.push(format!(
            "PCIe link speed {speed} GT/s below its maximum {max} GT/s"
        ));
    }
    problems
}

/// All checks of one GPU that is in the inventory.
pub fn check_gpu(
    readings: Option<&GpuReadings>,
    kfd_present: Option<bool>,
    thresholds: &Thresholds,
) -> Vec<String> {
    let mut problems = Vec::new();
    if let Some(r) = readings {
        problems.extend(check_presence(r));
    }
    problems.extend(check_kfd(kfd_present));
    if let Some(r) = readings {
        problems.extend(check_nodes(r));
        problems.extend(check_ecc(r, &thresholds.limits));
        problems.extend(check_junction(r, &thresholds.limits));
        if thresholds.pcie_link {
            problems.extend(check_pcie(r));
        }
    }
    problems
}

/// GPUs seen since the monitor started that the inventory no longer has.
pub fn missing_gpus<'a>(seen: &'a BTreeSet<String>, inventory: &Inventory) -> Vec<&'a str> {
    let present: BTreeSet<&str> = inventory.gpus.iter().map(|g| g.bdf.as_str()).collect();
    seen.iter()
        .map(String::as_str)
        .filter(|bdf| !present.contains(bdf))
        .collect()
}

/// Problems of every GPU: those in the inventory, checked against the sample,
/// and those seen before but now missing. GPUs without problems map to an empty
/// list.
pub fn evaluate(
    inventory: &Inventory,
    sample: &HostSample,
    seen: &BTreeSet<String>,
    thresholds: &Thresholds,
) -> BTreeMap<String, Vec<String>> {
    let mut out: BTreeMap<String, Vec<String>> = inventory
        .gpus
        .iter()
        .map(|gpu: &Gpu| {
            (
                gpu.bdf.clone(),
                check_gpu(sample.gpus.get(&gpu.bdf), sample.kfd_present, thresholds),
            )
        })
        .collect();
    let count = seen.len();
    for bdf in missing_gpus(seen, inventory) {
        out.insert(
            bdf.to_owned(),
            vec![format!(
                "GPU {bdf} is missing: {} of the {count} GPUs seen since start remain",
                inventory.gpus.len()
            )],
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::telemetry::sysfs::EccCount;

    fn good() -> GpuReadings {
        let mut r = GpuReadings::bound_gpu("0000:05:00.0")
            .with_ecc("umc", 0, 9)
            .with_ecc("pcie_bif", 0, 0);
        r.temperature.junction_c = Some(70.0);
        r.temperature.junction_crit_c = Some(105.0);
        r.pcie.width = Some(16);
        r.pcie.max_width = Some(16);
        r.pcie.speed_gts = Some(32.0);
        r.pcie.max_speed_gts = Some(32.0);
        r
    }

    #[test]
    fn a_good_sample_passes_every_check() {
        let problems = check_gpu(Some(&good()), Some(true), &Thresholds::default());
        assert!(problems.is_empty(), "{problems:?}");
    }

    #[test]
    fn presence_and_binding() {
        assert_eq!(check_presence(&good()), None);
        let mut r = good();
        r.bound = Some(false);
        assert!(check_presence(&r).unwrap().contains("not bound to amdgpu"));
        r.present = Some(false);
        assert!(check_presence(&r).unwrap().contains("is gone"));
        // Unknown (read timed out) is not a failure.
        r.present = None;
        r.bound = None;
        assert_eq!(check_presence(&r), None);
    }

    #[test]
    fn kfd_and_device_nodes() {
        assert_eq!(check_kfd(Some(true)), None);
        assert_eq!(check_kfd(None), None);
        assert_eq!(check_kfd(Some(false)).unwrap(), "/dev/kfd does not exist");
        assert!(check_nodes(&good()).is_empty());
        let mut r = good();
        r.missing_nodes = vec!["/dev/dri/renderD129".into()];
        assert_eq!(check_nodes(&r), ["/dev/dri/renderD129 does not exist"]);
    }

    #[test]
    fn ecc_above_threshold() {
        let limits = HealthThresholds::default();
        assert!(
            check_ecc(&good(), &limits).is_empty(),
            "correctable errors are fine"
        );
        let mut r = good();
        r.ecc.insert(
            "umc".into(),
            EccCount {
                ue: 2,
                ce: 9,
                de: None,
            },
        );
        r.ecc.insert(
            "pcie_bif".into(),
            EccCount {
                ue: 1,
                ce: 0,
                de: None,
            },
        );
        assert_eq!(
            check_ecc(&r, &limits),
            [
                "1 uncorrectable ECC errors in BIF (threshold 0)",
                "2 uncorrectable ECC errors in UMC (threshold 0)"
            ]
        );
        let mut tolerant = HealthThresholds::default();
        tolerant.ecc_uncorrectable.insert("umc".into(), 2);
        tolerant.ecc_uncorrectable.insert("pcie_bif".into(), 5);
        assert!(check_ecc(&r, &tolerant).is_empty());
    }

    #[test]
    fn junction_against_configured_driver_and_default_limits() {
        let mut limits = HealthThresholds::default();
        assert_eq!(check_junction(&good(), &limits), None);
        let mut r = good();
        r.temperature.junction_c = Some(106.0);
        assert!(check_junction(&r, &limits).unwrap().contains("105 °C"));
        limits.junction_critical_c = Some(110.0);
        assert_eq!(check_junction(&r, &limits), None, "configured limit wins");
        limits.junction_critical_c = None;
        r.temperature.junction_crit_c = None;
        r.temperature.junction_c = Some(DEFAULT_JUNCTION_CRITICAL_C - 1.0);
        assert_eq!(check_junction(&r, &limits), None);
        r.temperature.junction_c = Some(DEFAULT_JUNCTION_CRITICAL_C);
        assert!(check_junction(&r, &limits).is_some());
        r.temperature.junction_c = None;
        assert_eq!(check_junction(&r, &limits), None);
    }

    #[test]
    fn degraded_pcie_link() {
        assert!(check_pcie(&good()).is_empty());
        let mut r = good();
        r.pcie.width = Some(8);
        r.pcie.speed_gts = Some(16.0);
        assert_eq!(
            check_pcie(&r),
            [
                "PCIe link width x8 below its maximum x16",
                "PCIe link speed 16 GT/s below its maximum 32 GT/s"
            ]
        );
        let no_pcie = Thresholds {
            pcie_link: false,
            ..Thresholds::default()
        };
        assert!(check_gpu(Some(&r), Some(true), &no_pcie).is_empty());
    }

    #[test]
    fn missing_gpus_are_reported_against_what_was_seen() {
        let inventory = Inventory {
            gpus: vec![Gpu {
                bdf: "0000:05:00.0".into(),
                ..Gpu::default()
            }],
            ..Inventory::default()
        };
        let seen: BTreeSet<String> = ["0000:05:00.0", "0000:27:00.0"].map(String::from).into();
        assert_eq!(missing_gpus(&seen, &inventory), ["0000:27:00.0"]);
        let mut sample = HostSample {
            kfd_present: Some(true),
            ..HostSample::default()
        };
        sample.gpus.insert("0000:05:00.0".into(), good());
        let problems = evaluate(&inventory, &sample, &seen, &Thresholds::default());
        assert_eq!(problems["0000:05:00.0"], Vec::<String>::new());
        assert_eq!(
            problems["0000:27:00.0"],
            ["GPU 0000:27:00.0 is missing: 1 of the 2 GPUs seen since start remain"]
        );
    }
}
