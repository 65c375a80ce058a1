//! Objects the leader owns on behalf of a DeviceConfig, built as plain data: the
//! metrics Service and the Prometheus ServiceMonitor, and the cluster-wide DRA
//! DeviceClass.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Service, ServicePort, ServiceSpec};
use k8s_openapi::api::resource::v1::{
    CELDeviceSelector, DeviceClass, DeviceClassSpec, DeviceSelector,
};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::{ApiResource, DynamicObject, ObjectMeta};
use kube::{Resource, ResourceExt};
use serde_json::json;

use crate::api::{DeviceConfig, ServiceType};

/// Labels on every agent pod (the DaemonSet in deploy/ sets them); the metrics
/// Service selects these.
pub const AGENT_POD_LABEL: (&str, &str) = ("app.kubernetes.io/name", "gpu-operator");
/// Name of the metrics port on the Service, referenced by the ServiceMonitor.
pub const METRICS_PORT_NAME: &str = "exporter-port";

/// `<deviceconfig>-metrics-exporter`, as the reference names it.
pub fn metrics_service_name(dc: &DeviceConfig) -> String {
    format!("{}-metrics-exporter", dc.name_any())
}

fn owned_meta(dc: &DeviceConfig, labels: BTreeMap<String, String>) -> ObjectMeta {
    ObjectMeta {
        name: Some(metrics_service_name(dc)),
        namespace: dc.namespace(),
        labels: Some(labels),
        owner_references: dc.controller_owner_ref(&()).map(|r| vec![r]),
        ..ObjectMeta::default()
    }
}

/// The label that marks objects the leader owns; the leader watches objects
/// carrying it so it can repair them.
pub const OWNED_LABEL: (&str, &str) = ("app.kubernetes.io/name", "gpu-operator-metrics");

/// Label selector matching every object the leader owns.
pub fn owned_label_selector() -> String {
    format!("{}={}", OWNED_LABEL.0, OWNED_LABEL.1)
}

fn service_labels(dc: &DeviceConfig) -> BTreeMap<String, String> {
    BTreeMap::from([
        (OWNED_LABEL.0.to_owned(), OWNED_LABEL.1.to_owned()),
        ("app.kubernetes.io/instance".to_owned(), dc.name_any()),
    ])
}

/// The metrics Service, or `None` when metrics are disabled.
pub fn metrics_service(dc: &DeviceConfig) -> Option<Service> {
    let spec = &dc.spec.metrics_exporter;
    if !spec.is_enabled() {
        return None;
    }
    let mut meta = owned_meta(dc, service_labels(dc));
    if !spec.service_annotations.is_empty() {
        meta.annotations = Some(spec.service_annotations.clone());
    }
    let node_port = matches!(spec.service_type, ServiceType::NodePort);
    Some(Service {
        metadata: meta,
        spec: Some(ServiceSpec {
            type_: Some(if node_port { "NodePort" } else { "ClusterIP" }.to_owned()),
            selector: Some(BTreeMap::from([(
                AGENT_POD_LABEL.0.to_owned(),
                AGENT_POD_LABEL.1.to_owned(),
            )])),
            ports: Some(vec![ServicePort {
                name: Some(METRICS_PORT_NAME.to_owned()),
                protocol: Some("TCP".into()),
                port: spec.port,
                target_port: Some(IntOrString::Int(spec.port)),
                node_port: spec.requested_node_port(),
                ..ServicePort::default()
            }]),
            ..ServiceSpec::default()
        }),
        ..Service::default()
    })
}

/// Where Prometheus finds its service account token in its pod.
pub const SERVICE_ACCOUNT_TOKEN_FILE: &str = "/var/run/secrets/kubernetes.io/serviceaccount/token";

/// What a scrape needs when `rbacConfig` protects the endpoint: HTTPS (unless
/// `disableHttps`), TLS without verification of the endpoint's certificate
/// (which is per node and often self-issued), and the scraper's service
/// account token for the TokenReview. The user's own `tlsConfig`,
/// `bearerTokenFile` or `authorization` take precedence.
pub fn protected_endpoint_defaults(
    rbac: &crate::api::KubeRbacConfig,
) -> Vec<(&'static str, serde_json::Value)> {
    if rbac.enable != Some(true) {
        return Vec::new();
    }
    let https = rbac.disable_https != Some(true);
    let mut fields = vec![
        ("scheme", json!(if https { "https" } else { "http" })),
        ("bearerTokenFile", json!(SERVICE_ACCOUNT_TOKEN_FILE)),
    ];
    if https {
        fields.push(("tlsConfig", json!({ "insecureSkipVerify": true })));
    }
    fields
}

pub fn service_monitor_resource() -> ApiResource {
    ApiResource {
        group: "monitoring.coreos.com".into(),
        version: "v1".into(),
        api_version: "monitoring.coreos.com/v1".into(),
        kind: "ServiceMonitor".into(),
        plural: "servicemonitors".into(),
    }
}

/// The ServiceMonitor, or `None` when metrics or the monitor are disabled.
pub fn service_monitor(dc: &DeviceConfig) -> Option<DynamicObject> {
    let spec = &dc.spec.metrics_exporter;
    if !spec.is_enabled() || !spec.wants_service_monitor() {
        return None;
    }
    let monitor = spec.prometheus.as_ref()?.service_monitor.as_ref()?;
    let mut labels = service_labels(dc);
    labels.extend(monitor.labels.clone());
    let mut endpoint = json!({
        "port": METRICS_PORT_NAME,
        "path": "/metrics",
        "honorLabels": monitor.honor_labels,
    });
    let fields = [
        ("interval", serde_json::to_value(&monitor.interval)),
        (
            "honorTimestamps",
            serde_json::to_value(monitor.honor_timestamps),
        ),
        ("relabelings", serde_json::to_value(&monitor.relabelings)),
        (
            "metricRelabelings",
            serde_json::to_value(&monitor.metric_relabelings),
        ),
        (
            "authorization",
            serde_json::to_value(&monitor.authorization),
        ),
        (
            "bearerTokenFile",
            serde_json::to_value(&monitor.bearer_token_file),
        ),
        ("tlsConfig", serde_json::to_value(&monitor.tls_config)),
    ];
    for (name, value) in fields {
        match value {
            Ok(serde_json::Value::Null) => {}
            Ok(serde_json::Value::Array(items)) if items.is_empty() => {}
            Ok(value) => endpoint[name] = value,
            Err(e) => {
                tracing::warn!(field = name, error = %e, "cannot render ServiceMonitor field")
            }
        }
    }
    for (name, value) in protected_endpoint_defaults(&spec.rbac_config) {
        if endpoint.get(name).is_none()
            && !(name == "bearerTokenFile" && endpoint.get("authorization").is_some())
        {
            endpoint[name] = value;
        }
    }
    let mut body = json!({
        "selector": { "matchLabels": service_labels(dc) },
        "namespaceSelector": { "matchNames": [dc.namespace().unwrap_or_default()] },
        "endpoints": [endpoint],
    });
    if let Some(attach) = &monitor.attach_metadata
        && let Ok(value) = serde_json::to_value(attach)
    {
        body["attachMetadata"] = value;
    }
    let mut object = DynamicObject::new(&metrics_service_name(dc), &service_monitor_resource())
        .within(&dc.namespace().unwrap_or_default());
    object.metadata = owned_meta(dc, labels);
    object.data = json!({ "spec": body });
    Some(object)
}

/// Label on the DeviceClass the leader creates for DRA.
pub const DEVICE_CLASS_LABEL: (&str, &str) = ("app.kubernetes.io/managed-by", "gpu-operator");
/// The CEL selector of [`device_class`]: every device of our DRA driver.
pub const DEVICE_CLASS_SELECTOR: &str = "device.driver == 'gpu.amd.com'";
/// The extended resource that DRA serves through [`device_class`] (KEP-5004):
/// pods that ask for `amd.com/gpu: 1` get a GPU from DRA on DRA nodes.
pub const DEVICE_CLASS_EXTENDED_RESOURCE: &str = "amd.com/gpu";

/// The DeviceClass `gpu.amd.com`, as the reference DRA driver's chart ships
/// it: every device of driver `gpu.amd.com`, and `amd.com/gpu` as its
/// extended resource name (honoured from Kubernetes 1.36, where the
/// DRAExtendedResource gate is beta and on; dropped by older API servers).
pub fn device_class() -> DeviceClass {
    DeviceClass {
        metadata: ObjectMeta {
            name: Some(crate::dra::DRIVER_NAME.to_owned()),
            labels: Some(BTreeMap::from([(
                DEVICE_CLASS_LABEL.0.to_owned(),
                DEVICE_CLASS_LABEL.1.to_owned(),
            )])),
            ..ObjectMeta::default()
        },
        spec: DeviceClassSpec {
            selectors: Some(vec![DeviceSelector {
                cel: Some(CELDeviceSelector {
                    expression: DEVICE_CLASS_SELECTOR.to_owned(),
                }),
            }]),
            extended_resource_name: Some(DEVICE_CLASS_EXTENDED_RESOURCE.to_owned()),
            ..DeviceClassSpec::default()
        },
    }
}

/// Whether `current` is the class [`device_class`] makes. An API server
/// without DRAExtendedResource drops `extendedResourceName`; such a class is
/// applied again at each recheck, in case the feature was turned on since.
pub fn device_class_current(current: &DeviceClass) -> bool {
    let wanted = device_class();
    current.spec.selectors == wanted.spec.selectors
        && current.spec.extended_resource_name == wanted.spec.extended_resource_name
        && current
            .labels()
            .get(DEVICE_CLASS_LABEL.0)
            .is_some_and(|v| v == DEVICE_CLASS_LABEL.1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::DeviceConfigSpec;

    fn dc(spec: serde_json::Value) -> DeviceConfig {
        let spec: DeviceConfigSpec = serde_json::from_value(spec).unwrap();
        let mut dc = DeviceConfig::new("gpus", spec);
        dc.metadata.namespace = Some("kube-amd-gpu".into());
        dc.metadata.uid = Some("u1".into());
        dc
    }

    #[test]
    fn service_follows_the_spec() {
        assert!(
            metrics_service(&dc(json!({}))).is_none(),
            "metrics are off by default"
        );
        let svc = metrics_service(&dc(json!({"metricsExporter": {
            "enable": true, "port": 5001, "serviceType": "NodePort", "nodePort": 32500,
            "serviceAnnotations": {"a": "b"}}})))
        .unwrap();
        assert_eq!(svc.metadata.name.as_deref(), Some("gpus-metrics-exporter"));
        assert_eq!(
            svc.metadata.owner_references.as_ref().unwrap()[0].kind,
            "DeviceConfig"
        );
        assert_eq!(svc.metadata.annotations.unwrap()["a"], "b");
        let spec = svc.spec.unwrap();
        assert_eq!(spec.type_.as_deref(), Some("NodePort"));
        let port = &spec.ports.unwrap()[0];
        assert_eq!((port.port, port.node_port), (5001, Some(32500)));
        let cluster_ip =
            metrics_service(&dc(json!({"metricsExporter": {"enable": true}}))).unwrap();
        let port = &cluster_ip.spec.unwrap().ports.unwrap()[0];
        assert_eq!((port.port, port.node_port), (5000, None));
    }

    #[test]
    fn service_monitor_only_when_asked() {
        assert!(service_monitor(&dc(json!({"metricsExporter": {"enable": true}}))).is_none());
        let sm = service_monitor(&dc(json!({"metricsExporter": {"enable": true, "prometheus": {
            "serviceMonitor": {"enable": true, "interval": "30s", "labels": {"release": "prom"}}}}})))
        .unwrap();
        assert_eq!(sm.metadata.labels.as_ref().unwrap()["release"], "prom");
        let endpoint = &sm.data["spec"]["endpoints"][0];
        assert_eq!(endpoint["interval"], "30s");
        assert_eq!(endpoint["port"], METRICS_PORT_NAME);
        assert_eq!(endpoint["honorLabels"], true);
        assert!(endpoint.get("relabelings").is_none());
        assert!(
            endpoint.get("scheme").is_none(),
            "plain HTTP without rbacConfig"
        );
        assert!(endpoint.get("bearerTokenFile").is_none());
    }

    #[test]
    fn a_protected_endpoint_is_scraped_over_https_with_the_service_account_token() {
        let monitor = json!({"serviceMonitor": {"enable": true}});
        let sm = service_monitor(&dc(json!({"metricsExporter": {"enable": true,
            "prometheus": monitor, "rbacConfig": {"enable": true}}})))
        .unwrap();
        let endpoint = &sm.data["spec"]["endpoints"][0];
        assert_eq!(endpoint["scheme"], "https");
        assert_eq!(endpoint["bearerTokenFile"], SERVICE_ACCOUNT_TOKEN_FILE);
        assert_eq!(endpoint["tlsConfig"], json!({"insecureSkipVerify": true}));

        let sm = service_monitor(&dc(json!({"metricsExporter": {"enable": true,
            "prometheus": monitor, "rbacConfig": {"enable": true, "disableHttps": true}}})))
        .unwrap();
        let endpoint = &sm.data["spec"]["endpoints"][0];
        assert_eq!(endpoint["scheme"], "http");
        assert_eq!(endpoint["bearerTokenFile"], SERVICE_ACCOUNT_TOKEN_FILE);
        assert!(endpoint.get("tlsConfig").is_none());

        // The user's own settings win.
        let sm = service_monitor(&dc(json!({"metricsExporter": {"enable": true,
            "prometheus": {"serviceMonitor": {"enable": true,
                "tlsConfig": {"serverName": "gpu-metrics"},
                "authorization": {"type": "Bearer", "credentials": {"name": "s", "key": "t"}}}},
            "rbacConfig": {"enable": true}}})))
        .unwrap();
        let endpoint = &sm.data["spec"]["endpoints"][0];
        assert_eq!(endpoint["tlsConfig"]["serverName"], "gpu-metrics");
        assert!(endpoint["tlsConfig"].get("insecureSkipVerify").is_none());
        assert!(
            endpoint.get("bearerTokenFile").is_none(),
            "authorization and bearerTokenFile exclude each other"
        );
        assert_eq!(endpoint["scheme"], "https");
    }
}
