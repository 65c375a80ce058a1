//! Objects the leader owns on behalf of a DeviceConfig, built as plain data: the
//! metrics Service and the Prometheus ServiceMonitor, and the cluster-wide DRA
//! DeviceClass `gpu.amd.com` (the per-layout ones are `device_classes.rs`'s).

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

/// On the metrics Service and ServiceMonitor of a DeviceConfig outside the
/// agents' namespace: its `namespace/name` (an owner reference cannot cross
/// namespaces), which maps a changed Service back to its DeviceConfig.
pub const DEVICE_CONFIG_ANNOTATION: &str = "amd.com/deviceconfig";

/// Where the leader keeps the metrics Service and ServiceMonitor of `dc`:
/// the agents' namespace, since a Service selects pods of its own
/// namespace only and the agents serve the metrics; the DeviceConfig's own
/// when the agents' is not known (a leader without a Lease).
pub fn owned_namespace(dc: &DeviceConfig, agents_namespace: Option<&str>) -> String {
    agents_namespace.map_or_else(|| dc.namespace().unwrap_or_default(), str::to_owned)
}

/// Whether `dc` lives where its owned objects do (see [`owned_namespace`]).
fn beside_the_agents(dc: &DeviceConfig, agents_namespace: Option<&str>) -> bool {
    agents_namespace.is_none_or(|ns| dc.namespace().as_deref() == Some(ns))
}

/// `<deviceconfig>-metrics-exporter`, as the reference names it, for a
/// DeviceConfig in the agents' namespace. One elsewhere shares that
/// namespace with every other DeviceConfig's Service, so its name carries
/// its namespace and a hash of `namespace/name`:
/// `<namespace>-<name>-metrics-<8 hex>` (at most 63 characters, other
/// characters than letters and digits as `-`). It cannot be another
/// DeviceConfig's: names of the first kind end in `exporter`, which is not
/// hex, and two of the second kind differ in their hash.
pub fn metrics_service_name(dc: &DeviceConfig, agents_namespace: Option<&str>) -> String {
    let name = dc.name_any();
    if beside_the_agents(dc, agents_namespace) {
        return format!("{name}-metrics-exporter");
    }
    let namespace = dc.namespace().unwrap_or_default();
    let digest = ring::digest::digest(
        &ring::digest::SHA256,
        format!("{namespace}/{name}").as_bytes(),
    );
    let hash: String = digest.as_ref()[..4]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let mut base: String = format!("{namespace}-{name}")
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .collect();
    const SUFFIX: usize = "-metrics-".len() + 8;
    base.truncate(63 - SUFFIX);
    format!("{}-metrics-{hash}", base.trim_end_matches('-'))
}

fn owned_meta(
    dc: &DeviceConfig,
    agents_namespace: Option<&str>,
    labels: BTreeMap<String, String>,
) -> ObjectMeta {
    let beside = beside_the_agents(dc, agents_namespace);
    ObjectMeta {
        name: Some(metrics_service_name(dc, agents_namespace)),
        namespace: Some(owned_namespace(dc, agents_namespace)),
        labels: Some(labels),
        annotations: (!beside).then(|| {
            BTreeMap::from([(
                DEVICE_CONFIG_ANNOTATION.to_owned(),
                format!("{}/{}", dc.namespace().unwrap_or_default(), dc.name_any()),
            )])
        }),
        // An owner in another namespace counts as absent: the garbage
        // collector would delete the object at once.
        owner_references: beside
            .then(|| dc.controller_owner_ref(&()).map(|r| vec![r]))
            .flatten(),
        ..ObjectMeta::default()
    }
}

/// The DeviceConfig an owned Service or ServiceMonitor belongs to: its
/// controller owner reference, or [`DEVICE_CONFIG_ANNOTATION`].
pub fn owner_of(meta: &ObjectMeta) -> Option<kube::runtime::reflector::ObjectRef<DeviceConfig>> {
    use kube::runtime::reflector::ObjectRef;
    let owned = meta
        .owner_references
        .iter()
        .flatten()
        .find(|r| r.controller == Some(true) && r.kind == "DeviceConfig")
        .map(|r| ObjectRef::new(&r.name).within(meta.namespace.as_deref().unwrap_or_default()));
    owned.or_else(|| {
        let (namespace, name) = meta
            .annotations
            .as_ref()?
            .get(DEVICE_CONFIG_ANNOTATION)?
            .split_once('/')?;
        Some(ObjectRef::new(name).within(namespace))
    })
}

/// The label that marks objects the leader owns; the leader watches objects
/// carrying it so it can repair them.
pub const OWNED_LABEL: (&str, &str) = ("app.kubernetes.io/name", "gpu-operator-metrics");

/// Label selector matching every object the leader owns.
pub fn owned_label_selector() -> String {
    format!("{}={}", OWNED_LABEL.0, OWNED_LABEL.1)
}

/// The labels of the owned objects, which the ServiceMonitor selects by:
/// `app.kubernetes.io/instance` is the DeviceConfig's name, or for one
/// outside the agents' namespace its Service's name, unique there too.
fn service_labels(dc: &DeviceConfig, agents_namespace: Option<&str>) -> BTreeMap<String, String> {
    let instance = if beside_the_agents(dc, agents_namespace) {
        dc.name_any()
    } else {
        metrics_service_name(dc, agents_namespace)
    };
    BTreeMap::from([
        (OWNED_LABEL.0.to_owned(), OWNED_LABEL.1.to_owned()),
        ("app.kubernetes.io/instance".to_owned(), instance),
    ])
}

/// The metrics Service, or `None` when metrics are disabled. It lives in
/// the agents' namespace ([`owned_namespace`]) and selects them.
pub fn metrics_service(dc: &DeviceConfig, agents_namespace: Option<&str>) -> Option<Service> {
    let spec = &dc.spec.metrics_exporter;
    if !spec.is_enabled() {
        return None;
    }
    let mut meta = owned_meta(dc, agents_namespace, service_labels(dc, agents_namespace));
    if !spec.service_annotations.is_empty() {
        meta.annotations
            .get_or_insert_with(BTreeMap::new)
            .extend(spec.service_annotations.clone());
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

/// The ServiceMonitor, or `None` when metrics or the monitor are disabled;
/// beside the Service it selects.
pub fn service_monitor(dc: &DeviceConfig, agents_namespace: Option<&str>) -> Option<DynamicObject> {
    let spec = &dc.spec.metrics_exporter;
    if !spec.is_enabled() || !spec.wants_service_monitor() {
        return None;
    }
    let monitor = spec.prometheus.as_ref()?.service_monitor.as_ref()?;
    // The user's labels, then ours: they mark the object as the leader's
    // (its watch and deploy/15-admission-policy.yaml go by them).
    let mut labels: BTreeMap<String, String> = monitor.labels.clone().into_iter().collect();
    labels.extend(service_labels(dc, agents_namespace));
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
    let namespace = owned_namespace(dc, agents_namespace);
    let mut body = json!({
        "selector": { "matchLabels": service_labels(dc, agents_namespace) },
        "namespaceSelector": { "matchNames": [namespace] },
        "endpoints": [endpoint],
    });
    if let Some(attach) = &monitor.attach_metadata
        && let Ok(value) = serde_json::to_value(attach)
    {
        body["attachMetadata"] = value;
    }
    let mut object = DynamicObject::new(
        &metrics_service_name(dc, agents_namespace),
        &service_monitor_resource(),
    )
    .within(&namespace);
    object.metadata = owned_meta(dc, agents_namespace, labels);
    object.data = json!({ "spec": body });
    Some(object)
}

/// Label on the DeviceClass the leader creates for DRA.
pub const DEVICE_CLASS_LABEL: (&str, &str) = ("app.kubernetes.io/managed-by", "gpu-operator");
/// The CEL selector of [`device_class`]: every device of our DRA driver.
pub const DEVICE_CLASS_SELECTOR: &str = "device.driver == 'gpu.amd.com'";

/// The class that serves [`EXTENDED_RESOURCE`] (KEP-5004), named after it.
/// Not `gpu.amd.com`: on a `draDriver.autoPartition` node that class also
/// selects the layout devices a GPU can take (`gpu-0-cpx-nps4`), which
/// AutoPartition's claims pick by CEL; through it, a pod asking for
/// `amd.com/gpu: 1` could be given one CPX share and have its GPU
/// repartitioned.
pub const EXTENDED_RESOURCE_CLASS: &str = "amd-gpu.gpu.amd.com";
/// The CEL selector of [`extended_resource_class`]: devices of our driver
/// as they are (whole GPUs, and partitions that exist: these carry no
/// `computePartition`), and of the layout devices only the whole GPU's
/// (`spx`). `has()` first: reading an attribute a device lacks fails the
/// allocation instead of skipping the device.
pub const EXTENDED_RESOURCE_CLASS_SELECTOR: &str = "device.driver == 'gpu.amd.com' && \
    (!has(device.attributes['gpu.amd.com'].computePartition) || \
    device.attributes['gpu.amd.com'].computePartition == 'spx')";
/// The extended resource that DRA serves through [`extended_resource_class`]:
/// pods that ask for `amd.com/gpu: 1` get a GPU from DRA on DRA nodes.
pub const EXTENDED_RESOURCE: &str = "amd.com/gpu";

/// The DeviceClass `gpu.amd.com`, as the reference DRA driver's chart ships
/// it: every device of driver `gpu.amd.com`. Claims name it, with their own
/// CEL selectors (AutoPartition's `computePartition == "cpx"`, say). It
/// serves no extended resource: [`extended_resource_class`] does.
pub fn device_class() -> DeviceClass {
    operator_device_class(
        crate::dra::DRIVER_NAME,
        DEVICE_CLASS_SELECTOR.to_owned(),
        None,
    )
}

/// The DeviceClass [`EXTENDED_RESOURCE_CLASS`], serving `amd.com/gpu`
/// (honoured from Kubernetes 1.36, where the DRAExtendedResource gate is
/// beta and on; dropped by older API servers): a whole GPU, or a partition
/// the node already has, never a share of a layout made on demand.
pub fn extended_resource_class() -> DeviceClass {
    operator_device_class(
        EXTENDED_RESOURCE_CLASS,
        EXTENDED_RESOURCE_CLASS_SELECTOR.to_owned(),
        Some(EXTENDED_RESOURCE.to_owned()),
    )
}

/// A DeviceClass the operator keeps: `name`, carrying
/// [`DEVICE_CLASS_LABEL`], selecting by the CEL `selector`, and serving
/// `extended_resource` (KEP-5004), if any.
pub fn operator_device_class(
    name: &str,
    selector: String,
    extended_resource: Option<String>,
) -> DeviceClass {
    DeviceClass {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            labels: Some(BTreeMap::from([(
                DEVICE_CLASS_LABEL.0.to_owned(),
                DEVICE_CLASS_LABEL.1.to_owned(),
            )])),
            ..ObjectMeta::default()
        },
        spec: DeviceClassSpec {
            selectors: Some(vec![DeviceSelector {
                cel: Some(CELDeviceSelector {
                    expression: selector,
                }),
            }]),
            extended_resource_name: extended_resource,
            ..DeviceClassSpec::default()
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::DeviceConfigSpec;

    /// The agents' namespace, where `dc` makes its DeviceConfigs.
    const AGENTS: Option<&str> = Some("kube-amd-gpu");

    fn dc(spec: serde_json::Value) -> DeviceConfig {
        dc_in("kube-amd-gpu", "gpus", spec)
    }

    fn dc_in(namespace: &str, name: &str, spec: serde_json::Value) -> DeviceConfig {
        let spec: DeviceConfigSpec = serde_json::from_value(spec).unwrap();
        let mut dc = DeviceConfig::new(name, spec);
        dc.metadata.namespace = Some(namespace.into());
        dc.metadata.uid = Some("u1".into());
        dc
    }

    #[test]
    fn service_follows_the_spec() {
        assert!(
            metrics_service(&dc(json!({})), AGENTS).is_none(),
            "metrics are off by default"
        );
        let svc = metrics_service(
            &dc(json!({"metricsExporter": {
            "enable": true, "port": 5001, "serviceType": "NodePort", "nodePort": 32500,
            "serviceAnnotations": {"a": "b"}}})),
            AGENTS,
        )
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
            metrics_service(&dc(json!({"metricsExporter": {"enable": true}})), AGENTS).unwrap();
        let port = &cluster_ip.spec.unwrap().ports.unwrap()[0];
        assert_eq!((port.port, port.node_port), (5000, None));
    }

    #[test]
    fn a_device_config_elsewhere_gets_its_service_beside_the_agents() {
        let spec = json!({"metricsExporter": {"enable": true, "serviceAnnotations": {"a": "b"},
            "prometheus": {"serviceMonitor": {"enable": true}}}});
        let elsewhere = dc_in("team-a", "gpus", spec.clone());
        let svc = metrics_service(&elsewhere, AGENTS).unwrap();
        let name = svc.metadata.name.clone().unwrap();
        assert!(name.starts_with("team-a-gpus-metrics-"), "{name}");
        assert_eq!(name.len(), "team-a-gpus-metrics-".len() + 8, "{name}");
        // A Service selects pods of its own namespace only: the agents'.
        assert_eq!(svc.metadata.namespace.as_deref(), Some("kube-amd-gpu"));
        assert_eq!(
            svc.spec.as_ref().unwrap().selector.as_ref().unwrap()[AGENT_POD_LABEL.0],
            AGENT_POD_LABEL.1
        );
        // No owner reference across namespaces (the garbage collector would
        // take the owner for gone); the annotation names the DeviceConfig.
        assert!(svc.metadata.owner_references.is_none());
        let annotations = svc.metadata.annotations.clone().unwrap();
        assert_eq!(annotations[DEVICE_CONFIG_ANNOTATION], "team-a/gpus");
        assert_eq!(annotations["a"], "b");
        assert_eq!(
            owner_of(&svc.metadata),
            Some(kube::runtime::reflector::ObjectRef::new("gpus").within("team-a"))
        );
        let inside = metrics_service(&dc(spec.clone()), AGENTS).unwrap();
        assert_eq!(
            owner_of(&inside.metadata),
            Some(kube::runtime::reflector::ObjectRef::new("gpus").within("kube-amd-gpu"))
        );
        // Its monitor sits beside it and selects it alone: not the Service
        // of a DeviceConfig of the same name in the agents' namespace.
        let sm = service_monitor(&elsewhere, AGENTS).unwrap();
        assert_eq!(sm.metadata.namespace.as_deref(), Some("kube-amd-gpu"));
        assert_eq!(sm.metadata.name.as_deref(), Some(name.as_str()));
        assert_eq!(
            sm.data["spec"]["namespaceSelector"]["matchNames"],
            json!(["kube-amd-gpu"])
        );
        let selector = &sm.data["spec"]["selector"]["matchLabels"];
        assert_eq!(selector["app.kubernetes.io/instance"], name.as_str());
        let inside_labels = inside.metadata.labels.unwrap();
        assert_ne!(
            inside_labels["app.kubernetes.io/instance"],
            selector["app.kubernetes.io/instance"]
        );
        // Without a known agents' namespace, everything stays in the
        // DeviceConfig's own, as before.
        let alone = metrics_service(&elsewhere, None).unwrap();
        assert_eq!(alone.metadata.namespace.as_deref(), Some("team-a"));
        assert_eq!(
            alone.metadata.name.as_deref(),
            Some("gpus-metrics-exporter")
        );
    }

    #[test]
    fn names_of_services_elsewhere_are_valid_and_distinct() {
        let spec = json!({});
        let name = |ns: &str, n: &str| metrics_service_name(&dc_in(ns, n, spec.clone()), AGENTS);
        // Namespace and name joined by '-' may meet: the hash tells them apart.
        assert_ne!(name("a-b", "c"), name("a", "b-c"));
        // No name of a DeviceConfig in the agents' namespace can take it.
        let elsewhere = name("team-a", "x");
        assert!(!elsewhere.ends_with("-metrics-exporter"));
        // Long names and dots: a DNS-1035 label of at most 63 characters.
        let long = name(&"n".repeat(63), &format!("{}.v2", "d".repeat(200)));
        assert!(long.len() <= 63, "{long}");
        assert!(
            long.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-'),
            "{long}"
        );
        assert_ne!(
            long,
            name(&"n".repeat(63), &format!("{}.v3", "d".repeat(200)))
        );
        // Stable across versions: an upgraded leader finds the Service it
        // made (the first 4 bytes of sha256("team-a/x")).
        assert_eq!(elsewhere, "team-a-x-metrics-e7fbb913");
    }

    #[test]
    fn service_monitor_only_when_asked() {
        assert!(
            service_monitor(&dc(json!({"metricsExporter": {"enable": true}})), AGENTS).is_none()
        );
        let sm = service_monitor(&dc(json!({"metricsExporter": {"enable": true, "prometheus": {
            "serviceMonitor": {"enable": true, "interval": "30s", "labels": {"release": "prom"}}}}})), AGENTS)
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
        let sm = service_monitor(
            &dc(json!({"metricsExporter": {"enable": true,
            "prometheus": monitor, "rbacConfig": {"enable": true}}})),
            AGENTS,
        )
        .unwrap();
        let endpoint = &sm.data["spec"]["endpoints"][0];
        assert_eq!(endpoint["scheme"], "https");
        assert_eq!(endpoint["bearerTokenFile"], SERVICE_ACCOUNT_TOKEN_FILE);
        assert_eq!(endpoint["tlsConfig"], json!({"insecureSkipVerify": true}));

        let sm = service_monitor(
            &dc(json!({"metricsExporter": {"enable": true,
            "prometheus": monitor, "rbacConfig": {"enable": true, "disableHttps": true}}})),
            AGENTS,
        )
        .unwrap();
        let endpoint = &sm.data["spec"]["endpoints"][0];
        assert_eq!(endpoint["scheme"], "http");
        assert_eq!(endpoint["bearerTokenFile"], SERVICE_ACCOUNT_TOKEN_FILE);
        assert!(endpoint.get("tlsConfig").is_none());

        // The user's own settings win.
        let sm = service_monitor(
            &dc(json!({"metricsExporter": {"enable": true,
            "prometheus": {"serviceMonitor": {"enable": true,
                "tlsConfig": {"serverName": "gpu-metrics"},
                "authorization": {"type": "Bearer", "credentials": {"name": "s", "key": "t"}}}},
            "rbacConfig": {"enable": true}}})),
            AGENTS,
        )
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
