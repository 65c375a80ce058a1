//! What the amdgpu driver's sysfs attributes mean: where they live for a GPU and
//! how their text turns into numbers.
//!
//! Pure functions only; reading happens in [`super::sample`] through the
//! [`crate::host::reader::BoundedReader`]. Units follow the kernel's documentation
//! (Documentation/gpu/amdgpu/thermal.rst and driver-core.rst): hwmon temperatures
//! in millidegrees Celsius, power in microwatts, energy in microjoules, memory
//! sizes in bytes.

use serde::Serialize;

/// The PCI function of a GPU as sysfs names it. `/sys/bus/pci/devices/<bdf>` is a
/// link to the device's real directory on hosts and in simulated roots alike.
pub fn device_dir(bdf: &str) -> String {
    format!("/sys/bus/pci/devices/{bdf}")
}

/// Present while the PCI function is bound to amdgpu.
pub fn driver_link(bdf: &str) -> String {
    format!("/sys/bus/pci/drivers/amdgpu/{bdf}")
}

/// The compute interface every GPU container needs.
pub const KFD_PATH: &str = "/dev/kfd";

/// A text that is not what the kernel writes for an attribute.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("cannot parse {what} from {text:?}")]
pub struct ParseError {
    pub what: &'static str,
    pub text: String,
}

impl ParseError {
    fn new(what: &'static str, text: &str) -> Self {
        Self {
            what,
            text: text.chars().take(80).collect(),
        }
    }
}

/// The levels of a `pp_dpm_*` clock attribute and which one is current.
#[derive(Clone, Debug, PartialEq)]
pub struct DpmLevels {
    /// Frequencies in MHz, in the order the kernel lists them.
    pub levels_mhz: Vec<f64>,
    /// Index into `levels_mhz` of the level marked `*`, if any.
    pub current: Option<usize>,
    /// Index of the deep-sleep level (`S: 19Mhz`), where the ASIC has one.
    pub deep_sleep: Option<usize>,
}

impl DpmLevels {
    pub fn current_mhz(&self) -> Option<f64> {
        self.current.and_then(|i| self.levels_mhz.get(i).copied())
    }

    /// The lowest and highest operating levels (the deep-sleep level left
    /// out), as rocm-smi's "valid range" shows them.
    pub fn range(&self) -> Option<ClockRange> {
        let operating = self
            .levels_mhz
            .iter()
            .enumerate()
            .filter(|(i, _)| Some(*i) != self.deep_sleep)
            .map(|(_, mhz)| *mhz);
        let (min, max) = operating.fold(None, |acc: Option<(f64, f64)>, mhz| {
            Some(acc.map_or((mhz, mhz), |(lo, hi)| (lo.min(mhz), hi.max(mhz))))
        })?;
        Some(ClockRange {
            min_mhz: min,
            max_mhz: max,
        })
    }
}

/// The lowest and highest level of a DPM clock, MHz.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct ClockRange {
    pub min_mhz: f64,
    pub max_mhz: f64,
}

/// The DPM clock tables amdgpu writes as `pp_dpm_<name>`: the GFX clock,
/// memory, SoC, and each VCN instance's video and decoder clocks (the
/// second instance's where it has clocks of its own, Navi3x).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Dpm {
    Sclk,
    Mclk,
    Socclk,
    Vclk,
    Vclk1,
    Dclk,
    Dclk1,
}

impl Dpm {
    /// The attribute's file name in the GPU's sysfs directory.
    pub fn file(self) -> &'static str {
        match self {
            Dpm::Sclk => "pp_dpm_sclk",
            Dpm::Mclk => "pp_dpm_mclk",
            Dpm::Socclk => "pp_dpm_socclk",
            Dpm::Vclk => "pp_dpm_vclk",
            Dpm::Vclk1 => "pp_dpm_vclk1",
            Dpm::Dclk => "pp_dpm_dclk",
            Dpm::Dclk1 => "pp_dpm_dclk1",
        }
    }
}

/// Parses `pp_dpm_sclk` / `pp_dpm_mclk`: one level a line, `N: <freq>Mhz`, the
/// current one followed by `*`. Some ASICs add a deep-sleep level `S: 19Mhz`.
pub fn parse_dpm(text: &str) -> Result<DpmLevels, ParseError> {
    let mut levels = DpmLevels {
        levels_mhz: Vec::new(),
        current: None,
        deep_sleep: None,
    };
    for line in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
        let bad = || ParseError::new("a DPM clock level", line);
        let (label, rest) = line.split_once(':').ok_or_else(bad)?;
        if label.trim() == "S" {
            levels.deep_sleep = Some(levels.levels_mhz.len());
        }
        let rest = rest.trim();
        let (freq, marked) = match rest.strip_suffix('*') {
            Some(freq) => (freq.trim(), true),
            None => (rest, false),
        };
        let lower = freq.to_ascii_lowercase();
        let number = lower.strip_suffix("mhz").ok_or_else(bad)?.trim();
        let mhz: f64 = number.parse().map_err(|_| bad())?;
        if marked {
            levels.current = Some(levels.levels_mhz.len());
        }
        levels.levels_mhz.push(mhz);
    }
    if levels.levels_mhz.is_empty() {
        return Err(ParseError::new("DPM clock levels", text));
    }
    Ok(levels)
}

/// Error counts of one RAS block.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct EccCount {
    /// Uncorrectable errors.
    pub ue: u64,
    /// Correctable errors.
    pub ce: u64,
    /// Deferred errors (`de:`): detected, not yet consumed. Kernels that
    /// collect RAS through ACA (MI300) add this line for UMC; `None` where
    /// the block's file has no such line.
    pub de: Option<u64>,
}

/// Parses `ras/<block>_err_count`: `ue: N` and `ce: N`, and `de: N` where the
/// kernel reports deferred errors, one a line, in any order.
pub fn parse_ras_count(text: &str) -> Result<EccCount, ParseError> {
    let (mut ue, mut ce, mut de) = (None, None, None);
    for line in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
        let bad = || ParseError::new("a RAS error count", line);
        let (key, value) = line.split_once(':').ok_or_else(bad)?;
        let value: u64 = value.trim().parse().map_err(|_| bad())?;
        match key.trim() {
            "ue" => ue = Some(value),
            "ce" => ce = Some(value),
            "de" => de = Some(value),
            _ => {}
        }
    }
    match (ue, ce) {
        (Some(ue), Some(ce)) => Ok(EccCount { ue, ce, de }),
        _ => Err(ParseError::new("RAS error counts (ue and ce)", text)),
    }
}

/// Parses `current_link_speed` / `max_link_speed` (`32.0 GT/s PCIe`, `8 GT/s`)
/// into GT/s. `Unknown` (link down, or a virtual function) is `Ok(None)`.
pub fn parse_link_speed(text: &str) -> Result<Option<f64>, ParseError> {
    let text = text.trim();
    if text.eq_ignore_ascii_case("unknown") || text.is_empty() {
        return Ok(None);
    }
    let bad = || ParseError::new("a PCIe link speed", text);
    let (number, _) = text.split_once("GT/s").ok_or_else(bad)?;
    number.trim().parse::<f64>().map(Some).map_err(|_| bad())
}

/// Parses `current_link_width` / `max_link_width` (`16`). The kernel writes 0 or
/// 255 when the width is unknown; those are `Ok(None)`.
pub fn parse_link_width(text: &str) -> Result<Option<u32>, ParseError> {
    let text = text.trim();
    let width: u32 = text
        .parse()
        .map_err(|_| ParseError::new("a PCIe link width", text))?;
    Ok((width != 0 && width != 255).then_some(width))
}

/// Parses a plain unsigned integer attribute (`gpu_busy_percent`, `mem_info_*`,
/// `pcie_replay_count`, hwmon `*_input`).
pub fn parse_u64(text: &str, what: &'static str) -> Result<u64, ParseError> {
    text.trim().parse().map_err(|_| ParseError::new(what, text))
}

/// Millidegrees Celsius (hwmon `temp*_input`, `temp*_crit`) to degrees. hwmon
/// values are signed.
pub fn parse_millidegrees(text: &str) -> Result<f64, ParseError> {
    let value: i64 = text
        .trim()
        .parse()
        .map_err(|_| ParseError::new("a temperature in millidegrees", text))?;
    Ok(value as f64 / 1000.0)
}

/// Microwatts (hwmon `power1_average`, `power1_input`) to watts.
pub fn microwatts_to_watts(value: u64) -> f64 {
    value as f64 / 1_000_000.0
}

/// Bytes to MiB, the unit the reference exporter reports memory in ("MB").
pub fn bytes_to_mib(value: u64) -> f64 {
    value as f64 / (1024.0 * 1024.0)
}

/// Which temperature an hwmon `temp*_label` names. amdgpu labels them `edge`,
/// `junction` and `mem`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Sensor {
    Edge,
    Junction,
    Memory,
}

pub fn parse_temp_label(text: &str) -> Option<Sensor> {
    match text.trim() {
        "edge" => Some(Sensor::Edge),
        "junction" | "hotspot" => Some(Sensor::Junction),
        "mem" | "memory" => Some(Sensor::Memory),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dpm_current_level_is_the_starred_one() {
        let levels = parse_dpm("0: 500Mhz\n1: 1500Mhz *\n2: 2100Mhz\n").unwrap();
        assert_eq!(levels.levels_mhz, [500.0, 1500.0, 2100.0]);
        assert_eq!(levels.current_mhz(), Some(1500.0));
        // Deep-sleep level and kernels that write MHz with other case and spacing.
        let levels = parse_dpm("S: 19Mhz *\n0: 900MHz\n1: 1300 Mhz\n").unwrap();
        assert_eq!(levels.current_mhz(), Some(19.0));
        assert_eq!(levels.levels_mhz, [19.0, 900.0, 1300.0]);
        // No level marked: levels but no current value.
        assert_eq!(parse_dpm("0: 900Mhz\n").unwrap().current_mhz(), None);
    }

    #[test]
    fn dpm_range_is_the_operating_levels() {
        let range = |text: &str| {
            parse_dpm(text)
                .unwrap()
                .range()
                .map(|r| (r.min_mhz, r.max_mhz))
        };
        assert_eq!(
            range("0: 500Mhz\n1: 1420Mhz *\n2: 2100Mhz\n"),
            Some((500.0, 2100.0))
        );
        // The deep-sleep level is no operating level.
        assert_eq!(
            range("S: 19Mhz *\n0: 900Mhz\n1: 1300Mhz\n"),
            Some((900.0, 1300.0))
        );
        assert_eq!(range("0: 1300Mhz *\n"), Some((1300.0, 1300.0)));
        assert_eq!(range("S: 19Mhz *\n"), None);
    }

    #[test]
    fn dpm_rejects_garbage() {
        assert!(parse_dpm("").is_err());
        assert!(parse_dpm("0: fast *").is_err());
        assert!(parse_dpm("500Mhz").is_err());
        let err = parse_dpm("0: 12GHz").unwrap_err();
        assert!(err.to_string().contains("DPM"), "{err}");
    }

    #[test]
    fn ras_counts() {
        assert_eq!(
            parse_ras_count("ue: 2\nce: 5\n").unwrap(),
            EccCount {
                ue: 2,
                ce: 5,
                de: None
            }
        );
        assert_eq!(
            parse_ras_count("ue: 0\nce: 1\nde: 4\n").unwrap(),
            EccCount {
                ue: 0,
                ce: 1,
                de: Some(4)
            }
        );
        assert_eq!(
            parse_ras_count("ce: 7\nue: 0").unwrap(),
            EccCount {
                ue: 0,
                ce: 7,
                de: None
            }
        );
        // What the kernel answers during a GPU reset is no count.
        assert!(parse_ras_count("Query currently inaccessible\n").is_err());
        assert!(parse_ras_count("ue: 1\n").is_err());
        assert!(parse_ras_count("ue: x\nce: 1").is_err());
        assert!(parse_ras_count("").is_err());
    }

    #[test]
    fn link_speed_and_width() {
        assert_eq!(parse_link_speed("32.0 GT/s PCIe\n").unwrap(), Some(32.0));
        assert_eq!(parse_link_speed("2.5 GT/s PCIe").unwrap(), Some(2.5));
        assert_eq!(parse_link_speed("8 GT/s").unwrap(), Some(8.0));
        assert_eq!(parse_link_speed("Unknown").unwrap(), None);
        assert!(parse_link_speed("fast").is_err());
        assert!(parse_link_speed("x GT/s").is_err());
        assert_eq!(parse_link_width("16\n").unwrap(), Some(16));
        assert_eq!(parse_link_width("255").unwrap(), None);
        assert_eq!(parse_link_width("0").unwrap(), None);
        assert!(parse_link_width("x16").is_err());
    }

    #[test]
    fn units() {
        assert_eq!(parse_millidegrees("45000\n").unwrap(), 45.0);
        assert_eq!(parse_millidegrees("-5500").unwrap(), -5.5);
        assert!(parse_millidegrees("hot").is_err());
        assert_eq!(microwatts_to_watts(140_000_000), 140.0);
        assert_eq!(bytes_to_mib(192 << 30), 196_608.0);
        assert_eq!(parse_u64(" 42\n", "a number").unwrap(), 42);
        assert!(parse_u64("-1", "a number").is_err());
    }

    #[test]
    fn temperature_labels() {
        assert_eq!(parse_temp_label("edge\n"), Some(Sensor::Edge));
        assert_eq!(parse_temp_label("junction"), Some(Sensor::Junction));
        assert_eq!(parse_temp_label("mem"), Some(Sensor::Memory));
        assert_eq!(parse_temp_label("vddgfx"), None);
    }

    #[test]
    fn paths() {
        assert_eq!(
            device_dir("0000:05:00.0"),
            "/sys/bus/pci/devices/0000:05:00.0"
        );
        assert_eq!(
            driver_link("0000:05:00.0"),
            "/sys/bus/pci/drivers/amdgpu/0000:05:00.0"
        );
    }
}
