//! The exporter's `config.json`, in AMD device-metrics-exporter's format, so that
//! the ConfigMap named by `metricsExporter.config.name` keeps working:
//!
//! ```json
//! {"ServerPort": 5000,
//!  "CommonConfig": {"MetricsFieldPrefix": "amd_", "HealthService": {"Enable": true}},
//!  "GPUConfig": {"Fields": ["GPU_EDGE_TEMPERATURE", "GPU_HEALTH"],
//!                "Labels": ["VBIOS_VERSION"],
//!                "CustomLabels": {"CLUSTER_NAME": "lab"},
//!                "HealthThresholds": {"GPU_ECC_UNCORRECT_UMC": 4}}}
//! ```
//!
//! Semantics follow the reference: an empty or absent `Fields` exports every
//! field; the mandatory labels (`gpu_id`, `serial_number`, `card_model`,
//! `hostname`, `gpu_partition_id`, the partition types, `pod`, `namespace`,
//! `container`) cannot be removed; at most 10 custom labels, none of them named
//! like a built-in label except `CLUSTER_NAME`; an invalid prefix is replaced by
//! no prefix; `ServerPort` is ignored (the DeviceConfig's `metricsExporter.port`
//! wins, as under AMD's operator). Extension: `HealthThresholds` also accepts
//! `GPU_JUNCTION_TEMPERATURE`, the critical junction temperature in °C.
//!
//! Things the format allows that this implementation does not do are accepted
//! with a warning rather than rejected, so a reference ConfigMap never breaks the
//! exporter. Only text that is not a JSON object of the right shape is an error.
//! [`parse_config`] is pure.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use super::fields::{ECC_BLOCKS, is_known_field};

/// Labels every series carries; configuration cannot remove them.
pub const MANDATORY_LABELS: &[&str] = &[
    "GPU_ID",
    "SERIAL_NUMBER",
    "CARD_MODEL",
    "HOSTNAME",
    "GPU_PARTITION_ID",
    "GPU_COMPUTE_PARTITION_TYPE",
    "GPU_MEMORY_PARTITION_TYPE",
    "POD",
    "NAMESPACE",
    "CONTAINER",
];

/// Optional labels this implementation can add when `Labels` asks for them.
pub const OPTIONAL_LABELS: &[&str] = &["GPU_UUID", "VBIOS_VERSION", "DRIVER_VERSION"];

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

/// The `HealthThresholds` key of the junction temperature extension.
pub const JUNCTION_THRESHOLD_KEY: &str = "GPU_JUNCTION_TEMPERATURE";

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
    pub health_thresholds: HealthThresholds,
    /// Prepended to every GPU metric name.
    pub prefix: String,
    /// `CommonConfig.HealthService.Enable`; the agent may use it to stop the
    /// health monitor.
    pub health_enabled: bool,
    /// What was accepted but ignored or corrected.
    pub warnings: Vec<String>,
}

impl Default for ExporterConfig {
    fn default() -> Self {
        Self {
            fields: None,
            labels: BTreeSet::new(),
            custom_labels: BTreeMap::new(),
            health_thresholds: HealthThresholds::default(),
            prefix: String::new(),
            health_enabled: true,
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

#[derive(Deserialize, Default)]
#[serde(default)]
struct RawConfig {
    #[serde(rename = "ServerPort")]
    _server_port: Option<serde_json::Value>,
    #[serde(rename = "GPUConfig")]
    gpu: Option<RawGpuConfig>,
    #[serde(rename = "CommonConfig")]
    common: Option<RawCommonConfig>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct RawGpuConfig {
    #[serde(rename = "Fields")]
    fields: Vec<String>,
    #[serde(rename = "Labels")]
    labels: Vec<String>,
    #[serde(rename = "CustomLabels")]
    custom_labels: BTreeMap<String, String>,
    #[serde(rename = "HealthThresholds")]
    health_thresholds: BTreeMap<String, serde_json::Number>,
    #[serde(rename = "Selector")]
    selector: Option<String>,
    #[serde(rename = "ExtraPodLabels")]
    extra_pod_labels: BTreeMap<String, String>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct RawCommonConfig {
    #[serde(rename = "MetricsFieldPrefix")]
    metrics_field_prefix: String,
    #[serde(rename = "HealthService")]
    health_service: Option<RawHealthService>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct RawHealthService {
    #[serde(rename = "Enable")]
    enable: Option<bool>,
}

/// Parses `config.json`. Blank text is the default configuration. Field names
/// this implementation does not export are accepted with a warning.
pub fn parse_config(text: &str) -> Result<ExporterConfig, ConfigError> {
    let mut config = ExporterConfig::default();
    if text.trim().is_empty() {
        return Ok(config);
    }
    // serde would also take an array for a struct; the format is an object.
    if !text.trim_start().starts_with('{') {
        return Err(ConfigError::NotAnObject);
    }
    let raw: RawConfig = serde_json::from_str(text).map_err(|e| ConfigError::Json {
        line: e.line(),
        column: e.column(),
        message: e.to_string(),
    })?;
    let warnings = &mut config.warnings;
    if let Some(common) = raw.common {
        let prefix = common.metrics_field_prefix;
        if prefix.is_empty() || is_metric_name(&prefix) {
            config.prefix = prefix;
        } else {
            warnings.push(format!(
                "MetricsFieldPrefix {prefix:?} is not a valid metric name prefix; no prefix is used"
            ));
        }
        if let Some(enable) = common.health_service.and_then(|h| h.enable) {
            config.health_enabled = enable;
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
        let upper = name.to_ascii_uppercase();
        if upper != "CLUSTER_NAME" && RESERVED_LABELS.contains(&upper.as_str()) {
            warnings.push(format!(
                "custom label {name} would replace a built-in label; ignored"
            ));
        } else if !is_label_name(&name) {
            warnings.push(format!(
                "custom label {name:?} is not a valid label name; ignored"
            ));
        } else if config.custom_labels.len() >= MAX_CUSTOM_LABELS {
            warnings.push(format!(
                "custom label {name} ignored: at most {MAX_CUSTOM_LABELS} custom labels are supported"
            ));
        } else {
            config
                .custom_labels
                .insert(name.to_ascii_lowercase(), value);
        }
    }
    for (key, value) in gpu.health_thresholds {
        let upper = key.to_ascii_uppercase();
        if upper == JUNCTION_THRESHOLD_KEY {
            match value.as_f64().filter(|v| v.is_finite()) {
                Some(celsius) => config.health_thresholds.junction_critical_c = Some(celsius),
                None => warnings.push(format!("{key}: {value} is not a temperature; ignored")),
            }
            continue;
        }
        let block = upper
            .strip_prefix("GPU_ECC_UNCORRECT_")
            .map(str::to_ascii_lowercase)
            .and_then(|suffix| ECC_BLOCKS.iter().find(|(_, s)| *s == suffix))
            .map(|(sysfs, _)| *sysfs);
        match (block, value.as_u64()) {
            (Some(block), Some(limit)) => {
                config
                    .health_thresholds
                    .ecc_uncorrectable
                    .insert(block.to_owned(), limit);
            }
            (Some(_), None) => warnings.push(format!(
                "health threshold {key}: {value} is not a non-negative integer; ignored"
            )),
            (None, _) => warnings.push(format!("unknown health threshold {key}; ignored")),
        }
    }
    if gpu.selector.is_some_and(|s| !s.trim().is_empty()) {
        warnings.push("GPUConfig.Selector is not supported; every GPU is exported".into());
    }
    if !gpu.extra_pod_labels.is_empty() {
        warnings.push("GPUConfig.ExtraPodLabels is not supported; ignored".into());
    }
    Ok(config)
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
                "Fields": ["gpu_edge_temperature", "GPU_HEALTH", "GPU_VOLTAGE"],
                "Labels": ["GPU_ID", "VBIOS_VERSION", "JOB_ID"],
                "CustomLabels": {"CLUSTER_NAME": "lab", "POD": "x", "bad-name": "y"},
                "HealthThresholds": {"GPU_ECC_UNCORRECT_UMC": 4, "GPU_ECC_UNCORRECT_BIF": 1,
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
        assert_eq!(config.health_thresholds.junction_critical_c, Some(95.5));
        let warnings = config.warnings.join("\n");
        for expected in [
            "GPU_VOLTAGE",
            "JOB_ID",
            "POD",
            "bad-name",
            "GPU_ECC_UNCORRECT_NOPE",
        ] {
            assert!(warnings.contains(expected), "{expected} in:\n{warnings}");
        }
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
        assert!(parse_config(r#"{"GPUConfig": {"Fields": "GPU_HEALTH"}}"#).is_err());
        assert!(matches!(parse_config("[]"), Err(ConfigError::NotAnObject)));
        assert!(parse_config(r#"{"GPUConfig": {"HealthThresholds": {"X": "1"}}}"#).is_err());
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
