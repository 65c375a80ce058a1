//! The exporter's `config.json`, in AMD device-metrics-exporter's format, so that
//! the ConfigMap named by `metricsExporter.config.name` keeps working:
//!
//! ```json
//! {"ServerPort": 5000,
//!  "CommonConfig": {"MetricsFieldPrefix": "amd_",
//!                   "HealthService": {"Enable": true, "PollingRate": "30s"}},
//!  "GPUConfig": {"Fields": ["GPU_EDGE_TEMPERATURE", "GPU_HEALTH"],
//!                "Labels": ["VBIOS_VERSION"],
//!                "CustomLabels": {"CLUSTER_NAME": "lab"},
//!                "HealthThresholds": {"GPU_ECC_UNCORRECT_UMC": 4, "GPU_CPER_MAX_AGE": ""}}}
//! ```
//!
//! Semantics follow the reference: an empty or absent `Fields` exports every
//! field; the mandatory labels (`gpu_id`, `serial_number`, `card_model`,
//! `hostname`, `gpu_partition_id`, the partition types, `pod`, `namespace`,
//! `container`) cannot be removed; at most 10 custom labels, none of them named
//! like a built-in label except `CLUSTER_NAME`; an invalid prefix is replaced by
//! no prefix; `ServerPort` is ignored (the DeviceConfig's `metricsExporter.port`
//! wins, as under AMD's operator); `CommonConfig.HealthService.PollingRate` (a
//! Go duration, held between 30 s and 24 h as the reference holds it) is read
//! as the time between health samples, [`ExporterConfig::health_polling_rate`]; `GPU_CPER_MAX_AGE` is accepted, and since no
//! CPER records are read here, a non-zero age is a warning. Extension:
//! `HealthThresholds` also accepts `GPU_JUNCTION_TEMPERATURE`, the critical
//! junction temperature in °C.
//!
//! Nothing in a reference ConfigMap breaks the exporter: a value of the wrong
//! type is left out, with a warning naming its path, and the rest of the file
//! applies; a key the format does not have is a warning (once per path); the
//! reference's sections this implementation does not act on (`NICConfig`,
//! `IFOEConfig`, `Logging`, `Debug`, `ProfilerMetrics`, `ProfilerConfig`) are
//! accepted silently, and things it allows but this implementation does not do
//! are accepted with a warning. Only text that is not a JSON object is an
//! error. [`parse_config`] is pure.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::fields::{ECC_BLOCKS, is_known_field};
use crate::api::syntax::parse_duration;
use crate::api::tracked::read_lenient;

/// Labels every GPU series carries, as the reference's mandatory list;
/// configuration cannot remove them.
pub const MANDATORY_LABELS: &[&str] = &[
    "GPU_ID",
    "SERIAL_NUMBER",
    "CARD_MODEL",
    "HOSTNAME",
    "GPU_PARTITION_ID",
    "GPU_COMPUTE_PARTITION_TYPE",
    "GPU_MEMORY_PARTITION_TYPE",
    "DEPLOYMENT_MODE",
    "POD",
    "NAMESPACE",
    "CONTAINER",
    "JOB_ID",
    "JOB_USER",
    "JOB_PARTITION",
];

/// Optional labels this implementation can add when `Labels` asks for them.
pub const OPTIONAL_LABELS: &[&str] = &[
    "GPU_UUID",
    "VBIOS_VERSION",
    "DRIVER_VERSION",
    "CARD_SERIES",
    "CARD_VENDOR",
    "KFD_PROCESS_ID",
    "POD_UUID",
];

/// Built-in label names of the reference; custom labels may not reuse them
/// (except `CLUSTER_NAME`, which only custom labels set).
const RESERVED_LABELS: &[&str] = &[
    "GPU_UUID",
    "SERIAL_NUMBER",
    "GPU_ID",
    "POD",
    "NAMESPACE",
    "CONTAINER",
    "JOB_ID",
    "JOB_USER",
    "JOB_PARTITION",
    "CARD_SERIES",
    "CARD_MODEL",
    "CARD_VENDOR",
    "DRIVER_VERSION",
    "VBIOS_VERSION",
    "HOSTNAME",
    "GPU_PARTITION_ID",
    "GPU_COMPUTE_PARTITION_TYPE",
    "GPU_MEMORY_PARTITION_TYPE",
    "KFD_PROCESS_ID",
    "DEPLOYMENT_MODE",
];

const MAX_CUSTOM_LABELS: usize = 10;

/// The reference's cap on `ExtraPodLabels`.
const MAX_EXTRA_POD_LABELS: usize = 20;

/// The `HealthThresholds` key of the junction temperature extension.
pub const JUNCTION_THRESHOLD_KEY: &str = "GPU_JUNCTION_TEMPERATURE";

/// The `HealthThresholds` key of the reference's maximum age of a fatal CPER record.
pub const CPER_MAX_AGE_KEY: &str = "GPU_CPER_MAX_AGE";

/// The reference's bounds of `CommonConfig.HealthService.PollingRate`: a
/// shorter rate is raised to the minimum, a longer one lowered to the maximum.
pub const MIN_HEALTH_POLLING_RATE: Duration = Duration::from_secs(30);
pub const MAX_HEALTH_POLLING_RATE: Duration = Duration::from_secs(24 * 3600);

const POLLING_RATE_PATH: &str = "CommonConfig.HealthService.PollingRate";

/// Thresholds of the health checks that the exporter config can set.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct HealthThresholds {
    /// sysfs RAS block → uncorrectable errors tolerated (a GPU is unhealthy above
    /// it). Blocks not listed tolerate none.
    pub ecc_uncorrectable: BTreeMap<String, u64>,
    /// Critical junction temperature in °C; `None` uses the driver's limit.
    pub junction_critical_c: Option<f64>,
}

impl HealthThresholds {
    pub fn ecc_threshold(&self, sysfs_block: &str) -> u64 {
        self.ecc_uncorrectable
            .get(sysfs_block)
            .copied()
            .unwrap_or(0)
    }
}

/// A parsed exporter configuration.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ExporterConfig {
    /// Field names (`GPU_EDGE_TEMPERATURE`) to export; `None` means all.
    pub fields: Option<BTreeSet<String>>,
    /// Optional labels to add, from [`OPTIONAL_LABELS`].
    pub labels: BTreeSet<String>,
    /// Label name (lowercase) → value, added to every series.
    pub custom_labels: BTreeMap<String, String>,
    /// `ExtraPodLabels`: metric label name (lowercase) → the key of the pod
    /// label whose value it carries, on the series of a GPU a pod holds.
    pub extra_pod_labels: BTreeMap<String, String>,
    pub health_thresholds: HealthThresholds,
    /// Prepended to every GPU metric name.
    pub prefix: String,
    /// `CommonConfig.HealthService.Enable`; the agent may use it to stop the
    /// health monitor.
    pub health_enabled: bool,
    /// `CommonConfig.HealthService.PollingRate`: the time between health
    /// samples, within [`MIN_HEALTH_POLLING_RATE`] and
    /// [`MAX_HEALTH_POLLING_RATE`]. `None` (absent, empty or not a duration)
    /// leaves the health monitor's own interval.
    pub health_polling_rate: Option<Duration>,
    /// What was accepted but ignored or corrected.
    pub warnings: Vec<String>,
}

impl Default for ExporterConfig {
    fn default() -> Self {
        Self {
            fields: None,
            labels: BTreeSet::new(),
            custom_labels: BTreeMap::new(),
            extra_pod_labels: BTreeMap::new(),
            health_thresholds: HealthThresholds::default(),
            prefix: String::new(),
            health_enabled: true,
            health_polling_rate: None,
            warnings: Vec::new(),
        }
    }
}

impl ExporterConfig {
    /// Whether a field (upper-case name) is exported.
    pub fn exports(&self, field: &str) -> bool {
        self.fields.as_ref().is_none_or(|f| f.contains(field))
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("config.json line {line}, column {column}: {message}")]
    Json {
        line: usize,
        column: usize,
        message: String,
    },
    #[error("config.json must be a JSON object")]
    NotAnObject,
}

/// The reference's `MetricConfig`. Sections it has that this implementation
/// does not act on are read as any JSON, so that they are neither checked nor
/// reported as unknown.
#[derive(Deserialize, Default)]
#[serde(default, expecting = "a config.json object")]
struct RawConfig {
    #[serde(rename = "ServerPort")]
    _server_port: Option<Value>,
    #[serde(rename = "GPUConfig")]
    gpu: Option<RawGpuConfig>,
    #[serde(rename = "CommonConfig")]
    common: Option<RawCommonConfig>,
    #[serde(rename = "NICConfig")]
    _nic: Option<Value>,
    #[serde(rename = "IFOEConfig")]
    _ifoe: Option<Value>,
}

#[derive(Deserialize, Default)]
#[serde(default, expecting = "a GPUConfig object")]
struct RawGpuConfig {
    #[serde(rename = "Fields")]
    fields: Vec<String>,
    #[serde(rename = "Labels")]
    labels: Vec<String>,
    #[serde(rename = "CustomLabels")]
    custom_labels: BTreeMap<String, String>,
    /// Read key by key: names ignore case, and each value is judged alone.
    #[serde(rename = "HealthThresholds")]
    health_thresholds: BTreeMap<String, Value>,
    #[serde(rename = "Selector")]
    selector: Option<String>,
    #[serde(rename = "ExtraPodLabels")]
    extra_pod_labels: BTreeMap<String, String>,
    #[serde(rename = "ProfilerMetrics")]
    _profiler_metrics: Option<Value>,
    #[serde(rename = "ProfilerConfig")]
    _profiler_config: Option<Value>,
}

#[derive(Deserialize, Default)]
#[serde(default, expecting = "a CommonConfig object")]
struct RawCommonConfig {
    #[serde(rename = "MetricsFieldPrefix")]
    metrics_field_prefix: String,
    #[serde(rename = "HealthService")]
    health_service: Option<RawHealthService>,
    #[serde(rename = "Logging")]
    _logging: Option<Value>,
    #[serde(rename = "Debug")]
    _debug: Option<Value>,
}

#[derive(Deserialize, Default)]
#[serde(default, expecting = "a HealthService object")]
struct RawHealthService {
    #[serde(rename = "Enable")]
    enable: Option<bool>,
    #[serde(rename = "PollingRate")]
    polling_rate: Option<String>,
}

/// Parses `config.json`. Blank text is the default configuration. Values of
/// the wrong type, unknown keys and field names this implementation does not
/// export are accepted with a warning.
pub fn parse_config(text: &str) -> Result<ExporterConfig, ConfigError> {
    let mut config = ExporterConfig::default();
    if text.trim().is_empty() {
        return Ok(config);
    }
    // serde would also take an array for a struct; the format is an object.
    if !text.trim_start().starts_with('{') {
        return Err(ConfigError::NotAnObject);
    }
    let value: Value = serde_json::from_str(text).map_err(|e| ConfigError::Json {
        line: e.line(),
        column: e.column(),
        message: e.to_string(),
    })?;
    let read = read_lenient::<RawConfig>(&value, "").map_err(|_| ConfigError::NotAnObject)?;
    let warnings = &mut config.warnings;
    for rejected in read.rejected {
        warnings.push(format!("{rejected}; ignored"));
    }
    for path in read.unknown {
        warnings.push(format!("{path}: unknown field; ignored"));
    }
    let raw = read.value;
    if let Some(common) = raw.common {
        let prefix = common.metrics_field_prefix;
        if prefix.is_empty() || is_metric_name(&prefix) {
            config.prefix = prefix;
        } else {
            warnings.push(format!(
                "MetricsFieldPrefix {prefix:?} is not a valid metric name prefix; no prefix is used"
            ));
        }
        let health = common.health_service.unwrap_or_default();
        if let Some(enable) = health.enable {
            config.health_enabled = enable;
        }
        if let Some(rate) = health.polling_rate {
            config.health_polling_rate = polling_rate(&rate, warnings);
        }
    }
    let Some(gpu) = raw.gpu else {
        return Ok(config);
    };
    if !gpu.fields.is_empty() {
        let mut fields = BTreeSet::new();
        for field in gpu.fields {
            let field = field.trim().to_ascii_uppercase();
            if !is_known_field(&field) {
                warnings.push(format!(
                    "field {field} is not exported by this implementation; ignored"
                ));
            }
            fields.insert(field);
        }
        config.fields = Some(fields);
    }
    for label in gpu.labels {
        let label = label.trim().to_ascii_uppercase();
        if MANDATORY_LABELS.contains(&label.as_str()) {
            continue;
        }
        if OPTIONAL_LABELS.contains(&label.as_str()) {
            config.labels.insert(label);
        } else {
            warnings.push(format!(
                "label {label} is not supported by this implementation; ignored"
            ));
        }
    }
    for (name, value) in gpu.custom_labels {
        // CLUSTER_NAME is built in, but only custom labels set it.
        let reserved = !name.eq_ignore_ascii_case("CLUSTER_NAME");
        let taken = (config.custom_labels.len(), MAX_CUSTOM_LABELS);
        if let Some(name) = label_name("custom label", &name, reserved, taken, warnings) {
            config.custom_labels.insert(name, value);
        }
    }
    for (key, value) in gpu.health_thresholds {
        let upper = key.to_ascii_uppercase();
        if upper == CPER_MAX_AGE_KEY {
            if let Some(warning) = cper_max_age(&key, &value) {
                warnings.push(warning);
            }
            continue;
        }
        if upper == JUNCTION_THRESHOLD_KEY {
            match value.as_f64().filter(|v| v.is_finite()) {
                Some(celsius) => config.health_thresholds.junction_critical_c = Some(celsius),
                None => warnings.push(format!("{key}: {value} is not a temperature; ignored")),
            }
            continue;
        }
        // Every sysfs spelling of the block (MI200's `mca.mp0` is MP0).
        let blocks: Vec<&str> = upper
            .strip_prefix("GPU_ECC_UNCORRECT_")
            .map(str::to_ascii_lowercase)
            .map(|suffix| {
                ECC_BLOCKS
                    .iter()
                    .filter(|(_, s)| *s == suffix)
                    .map(|(sysfs, _)| *sysfs)
                    .collect()
            })
            .unwrap_or_default();
        match (blocks.is_empty(), value.as_u64()) {
            (false, Some(limit)) => {
                for block in blocks {
                    config
                        .health_thresholds
                        .ecc_uncorrectable
                        .insert(block.to_owned(), limit);
                }
            }
            (false, None) => warnings.push(format!(
                "health threshold {key}: {value} is not a non-negative integer; ignored"
            )),
            (true, _) => warnings.push(format!("unknown health threshold {key}; ignored")),
        }
    }
    if gpu.selector.is_some_and(|s| !s.trim().is_empty()) {
        warnings.push("GPUConfig.Selector is not supported; every GPU is exported".into());
    }
    for (name, pod_label) in gpu.extra_pod_labels {
        let taken = (config.extra_pod_labels.len(), MAX_EXTRA_POD_LABELS);
        if let Some(name) = label_name("extra pod label", &name, true, taken, warnings) {
            config.extra_pod_labels.insert(name, pod_label);
        }
    }
    Ok(config)
}

/// A label name the config adds (`what`: "custom label"), lower case, or
/// `None` with a warning: when `reserved` and a built-in label's, when not a
/// label name, or when `(taken, max)` leaves no room.
fn label_name(
    what: &str,
    name: &str,
    reserved: bool,
    (taken, max): (usize, usize),
    warnings: &mut Vec<String>,
) -> Option<String> {
    let upper = name.to_ascii_uppercase();
    let problem = if reserved && RESERVED_LABELS.contains(&upper.as_str()) {
        format!("{what} {name} would replace a built-in label; ignored")
    } else if !is_label_name(name) {
        format!("{what} {name:?} is not a valid label name; ignored")
    } else if taken >= max {
        format!("{what} {name} ignored: at most {max} are supported")
    } else {
        return Some(name.to_ascii_lowercase());
    };
    warnings.push(problem);
    None
}

/// `PollingRate` as the reference reads it: empty is unset, a rate outside the
/// bounds is held to them. One that is not a duration is left out (the
/// reference falls back to its 30 s default; here the monitor's own interval
/// stays).
fn polling_rate(text: &str, warnings: &mut Vec<String>) -> Option<Duration> {
    if text.is_empty() {
        return None;
    }
    let rate = match go_duration(text) {
        Ok(rate) => rate,
        Err(why) => {
            warnings.push(format!(
                "{POLLING_RATE_PATH}: {why}; ignored, health keeps its own interval"
            ));
            return None;
        }
    };
    let held = match rate {
        Some(rate) if rate > MAX_HEALTH_POLLING_RATE => MAX_HEALTH_POLLING_RATE,
        Some(rate) if rate >= MIN_HEALTH_POLLING_RATE => return Some(rate),
        _ => MIN_HEALTH_POLLING_RATE,
    };
    warnings.push(format!(
        "{POLLING_RATE_PATH}: {text:?} is outside 30s to 24h; {}s is used",
        held.as_secs()
    ));
    Some(held)
}

/// The warning `GPU_CPER_MAX_AGE` is worth, if any: empty and `0` are the
/// reference's "no age filter", which is what reading no CPER records amounts to.
fn cper_max_age(key: &str, value: &Value) -> Option<String> {
    let Some(text) = value.as_str() else {
        return Some(format!(
            "health threshold {key}: {value} is not a duration such as \"1h\"; ignored"
        ));
    };
    if text.is_empty() {
        return None;
    }
    match go_duration(text) {
        Ok(Some(age)) if age.is_zero() => None,
        Ok(Some(_)) => Some(format!(
            "health threshold {key}: CPER records are not read by this implementation; ignored"
        )),
        Ok(None) => Some(format!(
            "health threshold {key}: {text:?} is negative; ignored"
        )),
        Err(why) => Some(format!("health threshold {key}: {why}; ignored")),
    }
}

/// A Go duration (`30s`, `1h30m`, `0`, optionally signed) as the reference's
/// `time.ParseDuration` reads the forms people write; `Ok(None)` when negative.
fn go_duration(text: &str) -> Result<Option<Duration>, String> {
    let (negative, unsigned) = match text.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, text.strip_prefix('+').unwrap_or(text)),
    };
    let duration = if unsigned == "0" {
        Duration::ZERO
    } else {
        parse_duration(unsigned)?
    };
    Ok((!negative || duration.is_zero()).then_some(duration))
}

/// `[a-zA-Z_:][a-zA-Z0-9_:]*`
pub fn is_metric_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == ':')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
}

/// `[a-zA-Z_][a-zA-Z0-9_]*`
pub fn is_label_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::telemetry::fields::ecc_suffix;

    /// Every one of `expected` is part of some warning.
    fn assert_warns(config: &ExporterConfig, expected: &[&str]) {
        let warnings = config.warnings.join("\n");
        for expected in expected {
            assert!(warnings.contains(expected), "{expected} in:\n{warnings}");
        }
    }

    #[test]
    fn blank_text_is_the_default() {
        let config = parse_config("  \n").unwrap();
        assert_eq!(config, ExporterConfig::default());
        assert!(config.exports("GPU_EDGE_TEMPERATURE"));
        assert_eq!(parse_config("{}").unwrap(), ExporterConfig::default());
    }

    #[test]
    fn reference_config_is_understood() {
        let text = r#"{
            "ServerPort": 5000,
            "CommonConfig": {"MetricsFieldPrefix": "amd_", "HealthService": {"Enable": false},
                             "Logging": {"Level": "info"}},
            "GPUConfig": {
                "Fields": ["gpu_edge_temperature", "GPU_HEALTH", "GPU_AFID_ERRORS"],
                "Labels": ["GPU_ID", "VBIOS_VERSION", "JOB_ID", "NOT_A_LABEL"],
                "CustomLabels": {"CLUSTER_NAME": "lab", "POD": "x", "bad-name": "y"},
                "HealthThresholds": {"GPU_ECC_UNCORRECT_UMC": 4, "GPU_ECC_UNCORRECT_BIF": 1,
                                     "GPU_ECC_UNCORRECT_MP0": 2,
                                     "GPU_JUNCTION_TEMPERATURE": 95.5,
                                     "GPU_ECC_UNCORRECT_NOPE": 1},
                "ProfilerMetrics": {"all": false}
            },
            "NICConfig": {"Fields": []}
        }"#;
        let config = parse_config(text).unwrap();
        assert_eq!(config.prefix, "amd_");
        assert!(!config.health_enabled);
        assert!(config.exports("GPU_EDGE_TEMPERATURE"));
        assert!(config.exports("GPU_HEALTH"));
        assert!(!config.exports("GPU_PACKAGE_POWER"));
        assert_eq!(config.labels.iter().collect::<Vec<_>>(), ["VBIOS_VERSION"]);
        assert_eq!(
            config.custom_labels,
            BTreeMap::from([("cluster_name".to_owned(), "lab".to_owned())])
        );
        assert_eq!(config.health_thresholds.ecc_threshold("umc"), 4);
        assert_eq!(config.health_thresholds.ecc_threshold("pcie_bif"), 1);
        assert_eq!(config.health_thresholds.ecc_threshold("gfx"), 0);
        // MP0 under both of the kernel's names for it.
        assert_eq!(config.health_thresholds.ecc_threshold("mp0"), 2);
        assert_eq!(config.health_thresholds.ecc_threshold("mca.mp0"), 2);
        assert_eq!(config.health_thresholds.junction_critical_c, Some(95.5));
        assert_warns(
            &config,
            &[
                "GPU_AFID_ERRORS",
                "NOT_A_LABEL",
                "POD",
                "bad-name",
                "GPU_ECC_UNCORRECT_NOPE",
            ],
        );
        // A mandatory label asked for is no news.
        assert!(!config.warnings.join("\n").contains("JOB_ID"));
    }

    #[test]
    fn bad_prefix_falls_back_to_none() {
        let config = parse_config(r#"{"CommonConfig": {"MetricsFieldPrefix": "9-bad"}}"#).unwrap();
        assert_eq!(config.prefix, "");
        assert_eq!(config.warnings.len(), 1);
    }

    #[test]
    fn too_many_custom_labels_are_cut() {
        let labels: Vec<String> = (0..12).map(|i| format!("\"l{i:02}\": \"v\"")).collect();
        let text = format!(
            r#"{{"GPUConfig": {{"CustomLabels": {{{}}}}}}}"#,
            labels.join(",")
        );
        let config = parse_config(&text).unwrap();
        assert_eq!(config.custom_labels.len(), 10);
        assert_eq!(config.warnings.len(), 2);
    }

    #[test]
    fn malformed_text_is_an_error_with_a_position() {
        let err = parse_config("{\n  \"GPUConfig\": [").unwrap_err();
        assert!(matches!(err, ConfigError::Json { line: 2, .. }), "{err}");
        assert!(matches!(parse_config("[]"), Err(ConfigError::NotAnObject)));
        assert!(matches!(
            parse_config("{} {}"),
            Err(ConfigError::Json { .. })
        ));
    }

    /// The shapes of the reference's `example/config.json` and
    /// `example/config-gpu.json` (a shortened copy written here, not theirs):
    /// every section they have, `PollingRate` and the string-valued
    /// `GPU_CPER_MAX_AGE` included.
    const REFERENCE_SHAPES: &str = r#"{
      "ServerPort": 5000,
      "CommonConfig": {
        "MetricsFieldPrefix": "amd_",
        "HealthService": {"Enable": true, "PollingRate": "30s"},
        "Logging": {"Level": "info", "MaxFileSizeMB": 10, "MaxBackups": 3, "MaxAgeDays": 7},
        "Debug": {"EnableAPI": false}
      },
      "GPUConfig": {
        "Fields": ["GPU_EDGE_TEMPERATURE", "GPU_ECC_UNCORRECT_UMC", "GPU_HEALTH"],
        "Labels": ["GPU_UUID", "SERIAL_NUMBER", "CARD_MODEL", "VBIOS_VERSION", "HOSTNAME"],
        "HealthThresholds": {
          "GPU_ECC_UNCORRECT_SDMA": 0, "GPU_ECC_UNCORRECT_GFX": 0, "GPU_ECC_UNCORRECT_MMHUB": 0,
          "GPU_ECC_UNCORRECT_ATHUB": 0, "GPU_ECC_UNCORRECT_BIF": 0, "GPU_ECC_UNCORRECT_HDP": 0,
          "GPU_ECC_UNCORRECT_XGMI_WAFL": 0, "GPU_ECC_UNCORRECT_DF": 0, "GPU_ECC_UNCORRECT_SMN": 0,
          "GPU_ECC_UNCORRECT_SEM": 0, "GPU_ECC_UNCORRECT_MP0": 0, "GPU_ECC_UNCORRECT_MP1": 0,
          "GPU_ECC_UNCORRECT_FUSE": 0, "GPU_ECC_UNCORRECT_UMC": 0, "GPU_ECC_UNCORRECT_MCA": 0,
          "GPU_ECC_UNCORRECT_VCN": 0, "GPU_ECC_UNCORRECT_JPEG": 0, "GPU_ECC_UNCORRECT_IH": 0,
          "GPU_ECC_UNCORRECT_MPIO": 0,
          "GPU_CPER_MAX_AGE": ""
        },
        "CustomLabels": {"CLUSTER_NAME": "lab-cluster"},
        "ExtraPodLabels": {"WORKLOAD_ID": "example.com/workload"},
        "ProfilerMetrics": {"all": false, "node-a": true},
        "ProfilerConfig": {"SamplingInterval": 1000, "PtlDelay": 0}
      },
      "NICConfig": {
        "Fields": ["NIC_TOTAL"],
        "Labels": ["NIC_ID"],
        "CustomLabels": {"CLUSTER_NAME": "lab-cluster"},
        "ExtraPodLabels": {"WORKLOAD_ID": "example.com/workload"},
        "HealthCheckConfig": {"InterfaceAdminDownAsUnhealthy": false}
      },
      "IFOEConfig": {
        "Fields": ["IFOE_TOTAL_DEVICES"],
        "Labels": ["GPU_UUID"],
        "CustomLabels": {"CLUSTER_NAME": "lab-cluster"},
        "ExtraPodLabels": {"WORKLOAD_ID": "example.com/workload"}
      }
    }"#;

    #[test]
    fn the_references_example_configs_apply_as_written() {
        let config = parse_config(REFERENCE_SHAPES).unwrap();
        assert_eq!(config.prefix, "amd_");
        assert_eq!(
            config.custom_labels,
            BTreeMap::from([("cluster_name".to_owned(), "lab-cluster".to_owned())])
        );
        assert!(config.health_enabled);
        assert_eq!(config.health_polling_rate, Some(Duration::from_secs(30)));
        assert_eq!(
            config.labels.iter().collect::<Vec<_>>(),
            ["GPU_UUID", "VBIOS_VERSION"]
        );
        assert!(config.exports("GPU_HEALTH") && !config.exports("GPU_PACKAGE_POWER"));
        assert_eq!(
            config.health_thresholds.ecc_uncorrectable.len(),
            ECC_BLOCKS.len()
        );
        assert!(
            config
                .health_thresholds
                .ecc_uncorrectable
                .values()
                .all(|&n| n == 0)
        );
        assert_eq!(
            config.extra_pod_labels,
            BTreeMap::from([("workload_id".to_owned(), "example.com/workload".to_owned())])
        );
        // Only what this implementation really does not do is worth a word.
        assert!(config.warnings.is_empty(), "{:?}", config.warnings);
    }

    #[test]
    fn a_bad_value_is_left_out_with_a_warning_and_the_rest_applies() {
        let text = r#"{
            "CommonConfig": {"MetricsFieldPrefix": "amd_", "HealthService": {"Enable": "no"}},
            "GPUConfig": {
                "Fields": ["GPU_HEALTH", 5, "GPU_EDGE_TEMPERATURE"],
                "Labels": "VBIOS_VERSION",
                "CustomLabels": {"CLUSTER_NAME": "lab", "RACK": 3},
                "HealthThresholds": {"GPU_ECC_UNCORRECT_UMC": "4", "GPU_ECC_UNCORRECT_GFX": 2,
                                     "GPU_CPER_MAX_AGE": 0}
            }
        }"#;
        let config = parse_config(text).unwrap();
        assert_eq!(config.prefix, "amd_");
        assert!(
            config.health_enabled,
            "the bad Enable is left out: the default stays"
        );
        assert_eq!(
            config.fields,
            Some(BTreeSet::from([
                "GPU_HEALTH".into(),
                "GPU_EDGE_TEMPERATURE".into()
            ]))
        );
        assert!(config.labels.is_empty());
        assert_eq!(
            config.custom_labels.keys().collect::<Vec<_>>(),
            ["cluster_name"]
        );
        assert_eq!(config.health_thresholds.ecc_threshold("gfx"), 2);
        assert_eq!(config.health_thresholds.ecc_threshold("umc"), 0);
        assert_warns(
            &config,
            &[
                "CommonConfig.HealthService.Enable: ",
                "GPUConfig.Fields[1]: ",
                "GPUConfig.Labels: ",
                "GPUConfig.CustomLabels.RACK: ",
                "GPU_ECC_UNCORRECT_UMC: \"4\" is not a non-negative integer",
                "GPU_CPER_MAX_AGE: 0 is not a duration",
            ],
        );
        assert_eq!(config.warnings.len(), 6, "{:?}", config.warnings);
        // A whole section of the wrong type goes, and only it.
        let config =
            parse_config(r#"{"GPUConfig": "all", "CommonConfig": {"MetricsFieldPrefix": "amd_"}}"#)
                .unwrap();
        assert_eq!(config.prefix, "amd_");
        assert!(config.exports("GPU_POWER_USAGE"));
        assert_eq!(config.warnings.len(), 1);
        assert!(
            config.warnings[0].starts_with("GPUConfig: ")
                && config.warnings[0].contains("a GPUConfig object"),
            "{:?}",
            config.warnings
        );
    }

    #[test]
    fn unknown_keys_are_reported_once_each() {
        let text = r#"{
            "Extra": 1, "Extra": 2,
            "CommonConfig": {"HealthService": {"Enabled": false}},
            "GPUConfig": {"Fieldz": ["GPU_HEALTH"], "Labels": [1, 2, "VBIOS_VERSION"]}
        }"#;
        let config = parse_config(text).unwrap();
        let unknown: Vec<&String> = config
            .warnings
            .iter()
            .filter(|w| w.ends_with("unknown field; ignored"))
            .collect();
        assert_eq!(
            unknown,
            [
                "CommonConfig.HealthService.Enabled: unknown field; ignored",
                "Extra: unknown field; ignored",
                "GPUConfig.Fieldz: unknown field; ignored",
            ],
            "{:?}",
            config.warnings
        );
        assert!(config.health_enabled);
        assert_eq!(config.labels.iter().collect::<Vec<_>>(), ["VBIOS_VERSION"]);
        assert!(
            config
                .warnings
                .iter()
                .any(|w| w.starts_with("GPUConfig.Labels[1]: "))
        );
    }

    #[test]
    fn polling_rate_is_held_to_the_references_bounds() {
        let rate = |value: &str| {
            let config = parse_config(&format!(
                r#"{{"CommonConfig": {{"HealthService": {{"PollingRate": {value}}}}}}}"#
            ))
            .unwrap();
            (config.health_polling_rate, config.warnings.len())
        };
        let secs = |n| Some(Duration::from_secs(n));
        assert_eq!(rate(r#""30s""#), (secs(30), 0));
        assert_eq!(rate(r#""5m""#), (secs(300), 0));
        assert_eq!(rate(r#""23h10m15s""#), (secs(23 * 3600 + 615), 0));
        assert_eq!(rate(r#""10s""#), (secs(30), 1));
        assert_eq!(rate(r#""0""#), (secs(30), 1));
        assert_eq!(rate(r#""-1h""#), (secs(30), 1));
        assert_eq!(rate(r#""48h""#), (secs(24 * 3600), 1));
        assert_eq!(rate(r#""""#), (None, 0));
        // Go's durations have no days: the reference does not take "1d" either.
        assert_eq!(rate(r#""1d""#), (None, 1));
        assert_eq!(rate("30"), (None, 1));
        assert_eq!(parse_config("{}").unwrap().health_polling_rate, None);
    }

    #[test]
    fn cper_max_age_is_accepted_and_a_real_age_is_a_warning() {
        let warnings = |value: &str| {
            parse_config(&format!(
                r#"{{"GPUConfig": {{"HealthThresholds": {{"GPU_CPER_MAX_AGE": {value}}}}}}}"#
            ))
            .unwrap()
            .warnings
        };
        assert!(warnings(r#""""#).is_empty());
        assert!(warnings(r#""0""#).is_empty());
        assert!(warnings(r#""1h""#)[0].contains("CPER records are not read"));
        assert!(warnings(r#""-1h""#)[0].contains("negative"));
        assert!(warnings(r#""soon""#)[0].contains("not a duration"));
        assert!(warnings("null")[0].contains("not a duration"));
    }

    #[test]
    fn names() {
        assert!(is_metric_name("amd_"));
        assert!(is_metric_name("a:b"));
        assert!(!is_metric_name("1a"));
        assert!(!is_metric_name(""));
        assert!(is_label_name("cluster_name"));
        assert!(!is_label_name("a:b"));
        assert_eq!(ecc_suffix("pcie_bif"), Some("bif"));
        assert_eq!(ecc_suffix("nope"), None);
    }
}
