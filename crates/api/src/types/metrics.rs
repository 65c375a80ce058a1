//! The DeviceConfig's `metricsExporter` section, wire format only: the
//! exporter, its Prometheus ServiceMonitor and the endpoint's access control
//! (`rbacConfig`). It must not interpret fields (`semantics`) nor judge them
//! (`validate`).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{ResourceRequirements, Toleration};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::super::enums::{PullPolicy, ServiceType, TlsVersion};
use super::{
    ABSOLUTE_PATH_PATTERN, DEFAULT_POD_RESOURCES_PATH, DaemonSetUpgradeSpec, IMAGE_PATTERN,
    INTERVAL_PATTERN, LocalObjectRef, PROMETHEUS_LABEL_PATTERN, is_default,
};

/// Prometheus integration.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", default)]
pub struct PrometheusConfig {
    /// Create a ServiceMonitor for the metrics endpoint.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub service_monitor: Option<ServiceMonitorConfig>,
}

/// Attach node metadata to discovered targets.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", default)]
pub struct AttachMetadata {
    /// Attach node metadata (needs list/watch on Nodes).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node: Option<bool>,
}

// `key` is required, as in the reference (and in Kubernetes' own selector
// types): it has no default, so a selector without one does not parse.
/// A key of a Secret in the DeviceConfig's namespace.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[schemars(extend("x-kubernetes-map-type" = "atomic"))]
pub struct SecretKeySelector {
    /// The key of the Secret.
    pub key: String,
    /// Name of the Secret.
    #[serde(default)]
    pub name: String,
    /// Whether the Secret or its key may be missing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub optional: Option<bool>,
}

/// A key of a ConfigMap in the DeviceConfig's namespace.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[schemars(extend("x-kubernetes-map-type" = "atomic"))]
pub struct ConfigMapKeySelector {
    /// The key of the ConfigMap.
    pub key: String,
    /// Name of the ConfigMap.
    #[serde(default)]
    pub name: String,
    /// Whether the ConfigMap or its key may be missing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub optional: Option<bool>,
}

/// Data from a Secret or a ConfigMap.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", default)]
pub struct SecretOrConfigMap {
    /// ConfigMap holding the data.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub config_map: Option<ConfigMapKeySelector>,
    /// Secret holding the data.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub secret: Option<SecretKeySelector>,
}

/// Prometheus authorization for scraping the endpoint.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", default)]
pub struct SafeAuthorization {
    /// Authentication type (default "Bearer"; "Basic" is not supported).
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    pub type_: Option<String>,
    /// Secret key holding the credentials.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub credentials: Option<SecretKeySelector>,
}

/// TLS settings Prometheus uses to scrape the endpoint.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", default)]
pub struct TlsConfig {
    /// Certificate authority for verifying the server.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ca: Option<SecretOrConfigMap>,
    /// Path to the CA certificate in the Prometheus container.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ca_file: Option<String>,
    /// Client certificate for client authentication.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cert: Option<SecretOrConfigMap>,
    /// Path to the client certificate in the Prometheus container.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cert_file: Option<String>,
    /// Disable target certificate verification.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub insecure_skip_verify: Option<bool>,
    /// Path to the client key in the Prometheus container.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key_file: Option<String>,
    /// Secret holding the client key.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key_secret: Option<SecretKeySelector>,
    /// Highest TLS version accepted.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_version: Option<TlsVersion>,
    /// Lowest TLS version accepted.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub min_version: Option<TlsVersion>,
    /// Server name used to verify the target's certificate.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub server_name: Option<String>,
}

/// A Prometheus relabeling rule.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", default)]
pub struct RelabelConfig {
    /// Action to perform on a regex match.
    #[schemars(extend("enum" = super::super::enums::RELABEL_ACTIONS))]
    pub action: String,
    /// Modulus of the hash of the source label values (HashMod).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub modulus: Option<i64>,
    /// Regular expression matched against the extracted value.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub regex: Option<String>,
    /// Replacement value; regex capture groups are available.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub replacement: Option<String>,
    /// Separator between concatenated source label values.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub separator: Option<String>,
    /// Labels whose values are concatenated and matched.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    #[schemars(inner(regex(pattern = PROMETHEUS_LABEL_PATTERN)))]
    pub source_labels: Vec<String>,
    /// Label the result is written to.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub target_label: Option<String>,
}

impl Default for RelabelConfig {
    fn default() -> Self {
        Self {
            action: "replace".into(),
            modulus: None,
            regex: None,
            replacement: None,
            separator: None,
            source_labels: Vec::new(),
            target_label: None,
        }
    }
}

/// ServiceMonitor settings.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", default)]
pub struct ServiceMonitorConfig {
    /// Create the ServiceMonitor.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub enable: Option<bool>,
    /// Scrape interval: a number and one unit of ms, s, m or h (e.g. "30s").
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = INTERVAL_PATTERN))]
    pub interval: Option<String>,
    /// Attach node metadata to targets.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub attach_metadata: Option<AttachMetadata>,
    /// Keep the metric's labels when they collide with target labels.
    pub honor_labels: bool,
    /// Honor timestamps exposed by the endpoint.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub honor_timestamps: Option<bool>,
    /// Labels of the ServiceMonitor object.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// Relabelings applied to targets before scraping.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub relabelings: Vec<RelabelConfig>,
    /// Relabelings applied to scraped samples.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub metric_relabelings: Vec<RelabelConfig>,
    /// Authorization for scraping.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub authorization: Option<SafeAuthorization>,
    /// Bearer token file (deprecated; use authorization).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bearer_token_file: Option<String>,
    /// TLS settings for scraping.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls_config: Option<TlsConfig>,
}

impl Default for ServiceMonitorConfig {
    fn default() -> Self {
        Self {
            enable: None,
            interval: None,
            attach_metadata: None,
            honor_labels: true,
            honor_timestamps: None,
            labels: BTreeMap::new(),
            relabelings: Vec::new(),
            metric_relabelings: Vec::new(),
            authorization: None,
            bearer_token_file: None,
            tls_config: None,
        }
    }
}

/// Static authorization by client certificate common name.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", default)]
pub struct StaticAuthConfig {
    /// Authorize clients by certificate CN.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub enable: Option<bool>,
    /// The expected client certificate CN.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub client_name: Option<String>,
}

/// Access control on the metrics endpoint (kube-rbac-proxy in the reference).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", default)]
pub struct KubeRbacConfig {
    /// Protect the metrics endpoint with authentication and authorization.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub enable: Option<bool>,
    /// kube-rbac-proxy image. Ignored in this design.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = IMAGE_PATTERN))]
    pub image: Option<String>,
    /// Serve plain HTTP instead of HTTPS.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub disable_https: Option<bool>,
    /// TLS certificate Secret; a self-signed certificate is generated when unset.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub secret: Option<LocalObjectRef>,
    /// ConfigMap with the client CA (key ca.crt) for mutual TLS.
    #[serde(rename = "clientCAConfigMap", skip_serializing_if = "Option::is_none")]
    pub client_ca_config_map: Option<LocalObjectRef>,
    /// Authorize by client certificate CN instead of SubjectAccessReviews.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub static_authorization: Option<StaticAuthConfig>,
}

/// Which metrics are collected.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default)]
pub struct MetricsConfig {
    /// Name of the ConfigMap that lists the metrics to export.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

/// GPU metrics for Prometheus.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", default)]
pub struct MetricsExporterSpec {
    /// Serve GPU metrics.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub enable: Option<bool>,
    /// Metrics exporter image. Ignored in this design.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = IMAGE_PATTERN))]
    pub image: Option<String>,
    /// Prometheus integration.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prometheus: Option<PrometheusConfig>,
    /// Pull secret for the exporter image. Ignored in this design.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub image_registry_secret: Option<LocalObjectRef>,
    /// Exporter image pull policy. Ignored in this design.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub image_pull_policy: Option<PullPolicy>,
    /// Exporter tolerations. Ignored in this design.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tolerations: Vec<Toleration>,
    /// Port the metrics endpoint listens on.
    pub port: i32,
    /// Service type: ClusterIP or NodePort.
    pub service_type: ServiceType,
    /// Node port (30000-32767) when serviceType is NodePort; assigned when unset.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 30000, max = 32767))]
    pub node_port: Option<i32>,
    /// Metrics selection.
    #[serde(skip_serializing_if = "is_default")]
    pub config: MetricsConfig,
    /// Access control on the metrics endpoint.
    #[serde(skip_serializing_if = "is_default")]
    pub rbac_config: KubeRbacConfig,
    /// Node selector for metrics; empty reuses spec.selector.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub selector: BTreeMap<String, String>,
    /// Update policy of the exporter DaemonSet. Ignored in this design.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub upgrade_policy: Option<DaemonSetUpgradeSpec>,
    /// Host directory of the kubelet pod-resources socket.
    #[serde(rename = "podResourceAPISocketPath")]
    #[schemars(regex(pattern = ABSOLUTE_PATH_PATTERN))]
    pub pod_resource_api_socket_path: String,
    /// Exporter pod resources. Ignored in this design.
    pub resource: ResourceRequirements,
    /// Exporter pod annotations. Ignored in this design.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub pod_annotations: BTreeMap<String, String>,
    /// Annotations of the metrics Service.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub service_annotations: BTreeMap<String, String>,
    /// Run the exporter in the host network namespace. Ignored in this design.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub host_network: Option<bool>,
}

/// The reference's default exporter pod resources.
pub fn default_exporter_resources() -> ResourceRequirements {
    let pair = |cpu: &str, memory: &str| {
        BTreeMap::from([
            ("cpu".to_string(), Quantity(cpu.into())),
            ("memory".to_string(), Quantity(memory.into())),
        ])
    };
    ResourceRequirements {
        claims: None,
        limits: Some(pair("2", "4G")),
        requests: Some(pair("500m", "512M")),
    }
}

impl Default for MetricsExporterSpec {
    fn default() -> Self {
        Self {
            enable: None,
            image: None,
            prometheus: None,
            image_registry_secret: None,
            image_pull_policy: None,
            tolerations: Vec::new(),
            port: 5000,
            service_type: ServiceType::default(),
            node_port: None,
            config: MetricsConfig::default(),
            rbac_config: KubeRbacConfig::default(),
            selector: BTreeMap::new(),
            upgrade_policy: None,
            pod_resource_api_socket_path: DEFAULT_POD_RESOURCES_PATH.into(),
            resource: default_exporter_resources(),
            pod_annotations: BTreeMap::new(),
            service_annotations: BTreeMap::new(),
            host_network: None,
        }
    }
}
