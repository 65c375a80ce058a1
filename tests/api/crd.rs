//! The DeviceConfig CRD: identity, schema content, and the committed copy.

use std::path::Path;

#[test]
fn committed_crd_is_current() {
    let generated = gpu_operator::api::crd_yaml().expect("CRD renders as YAML");
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(gpu_operator::api::crd::COMMITTED_PATH);
    if std::env::var_os("GPU_OPERATOR_BLESS").is_some() {
        std::fs::create_dir_all(path.parent().expect("path has a parent"))
            .expect("create deploy/crd");
        std::fs::write(&path, &generated).expect("write CRD");
    }
    let committed = std::fs::read_to_string(&path).expect("committed CRD is readable");
    assert!(
        committed == generated,
        "{} is out of date; regenerate it with `gpu-operator crd > {}` (or GPU_OPERATOR_BLESS=1 cargo test --test api_crd)",
        path.display(),
        gpu_operator::api::crd::COMMITTED_PATH
    );
}

use serde_json::{Value, json};

fn crd_json() -> Value {
    serde_json::to_value(gpu_operator::api::crd()).expect("CRD converts to JSON")
}

fn version(crd: &Value) -> &Value {
    &crd["spec"]["versions"][0]
}

// Optional enum fields list `null` among their values because they are nullable
// (kube-derive's rendering of `Option<Enum>`), so an explicit `null` is accepted.

/// The schema node at a dotted path of property names under the root.
fn prop<'a>(root: &'a Value, path: &str) -> &'a Value {
    path.split('.').fold(root, |node, name| {
        let node = if node.get("items").is_some() {
            &node["items"]
        } else {
            node
        };
        let next = &node["properties"][name];
        assert!(!next.is_null(), "no property {name} in {path}");
        next
    })
}

#[test]
fn identity() {
    let crd = crd_json();
    assert_eq!(crd["metadata"]["name"], "deviceconfigs.amd.com");
    let spec = &crd["spec"];
    assert_eq!(spec["group"], "amd.com");
    assert_eq!(spec["scope"], "Namespaced");
    assert_eq!(spec["names"]["kind"], "DeviceConfig");
    assert_eq!(spec["names"]["plural"], "deviceconfigs");
    assert_eq!(spec["names"]["shortNames"], json!(["gpue"]));
    let v = version(&crd);
    assert_eq!(v["name"], "v1alpha1");
    assert_eq!(v["served"], true);
    assert_eq!(v["storage"], true);
    assert_eq!(v["subresources"], json!({"status": {}}));
    let columns: Vec<(&str, &str)> = v["additionalPrinterColumns"]
        .as_array()
        .expect("printer columns")
        .iter()
        .map(|c| {
            (
                c["name"].as_str().unwrap_or(""),
                c["jsonPath"].as_str().unwrap_or(""),
            )
        })
        .collect();
    assert_eq!(
        columns,
        vec![
            ("Ready", ".status.conditions[?(@.type==\"Ready\")].status"),
            ("Nodes", ".status.devicePlugin.nodesMatchingSelectorNumber"),
            ("Available", ".status.devicePlugin.availableNumber"),
            ("Age", ".metadata.creationTimestamp"),
        ]
    );
}

#[test]
fn schema_carries_the_reference_defaults_enums_patterns_and_bounds() {
    let crd = crd_json();
    let spec = &version(&crd)["schema"]["openAPIV3Schema"]["properties"]["spec"];
    let default = |path: &str| prop(spec, path)["default"].clone();
    assert_eq!(default("driver.enable"), json!(true));
    assert_eq!(default("driver.driverType"), json!("container"));
    assert_eq!(
        prop(spec, "driver.driverType")["enum"],
        json!(["container", "vf-passthrough", "pf-passthrough"])
    );
    assert_eq!(
        default("driver.upgradePolicy.maxParallelUpgrades"),
        json!(1)
    );
    assert_eq!(
        prop(spec, "driver.upgradePolicy.maxParallelUpgrades")["minimum"],
        json!(0.0)
    );
    assert_eq!(
        default("driver.upgradePolicy.maxUnavailableNodes"),
        json!("25%")
    );
    assert_eq!(
        prop(spec, "driver.upgradePolicy.maxUnavailableNodes")["x-kubernetes-int-or-string"],
        json!(true)
    );
    assert_eq!(
        default("driver.upgradePolicy.nodeDrainPolicy.force"),
        json!(false)
    );
    assert_eq!(
        default("driver.upgradePolicy.nodeDrainPolicy.timeoutSeconds"),
        json!(300)
    );
    assert_eq!(
        default("driver.upgradePolicy.nodeDrainPolicy.gracePeriodSeconds"),
        json!(-1)
    );
    assert_eq!(
        default("driver.upgradePolicy.nodeDrainPolicy.ignoreDaemonSets"),
        json!(true)
    );
    assert_eq!(
        default("driver.upgradePolicy.podDeletionPolicy.timeoutSeconds"),
        json!(300)
    );
    assert_eq!(default("driver.upgradePolicy.rebootRequired"), json!(true));
    assert_eq!(default("devicePlugin.enableDevicePlugin"), json!(true));
    assert_eq!(default("devicePlugin.enableNodeLabeller"), json!(true));
    assert_eq!(
        default("devicePlugin.kubeletSocketPath"),
        json!("/var/lib/kubelet/device-plugins")
    );
    assert_eq!(
        default("devicePlugin.upgradePolicy.maxUnavailable"),
        json!(1)
    );
    assert_eq!(
        prop(spec, "devicePlugin.upgradePolicy.upgradeStrategy")["enum"],
        json!(["RollingUpdate", "OnDelete", null])
    );
    assert_eq!(
        prop(spec, "devicePlugin.devicePluginImagePullPolicy")["enum"],
        json!(["Always", "IfNotPresent", "Never", null])
    );
    assert_eq!(default("draDriver.enable"), json!(false));
    assert_eq!(default("metricsExporter.port"), json!(5000));
    assert_eq!(default("metricsExporter.serviceType"), json!("ClusterIP"));
    assert_eq!(
        prop(spec, "metricsExporter.serviceType")["enum"],
        json!(["ClusterIP", "NodePort"])
    );
    assert_eq!(
        prop(spec, "metricsExporter.nodePort")["minimum"],
        json!(30000.0)
    );
    assert_eq!(
        prop(spec, "metricsExporter.nodePort")["maximum"],
        json!(32767.0)
    );
    assert_eq!(
        default("metricsExporter.podResourceAPISocketPath"),
        json!("/var/lib/kubelet/pod-resources")
    );
    assert_eq!(
        default("metricsExporter.resource"),
        json!({"limits": {"cpu": "2", "memory": "4G"}, "requests": {"cpu": "500m", "memory": "512M"}})
    );
    assert_eq!(
        prop(spec, "metricsExporter.prometheus.serviceMonitor.interval")["pattern"],
        json!("^([0-9]+)(ms|s|m|h)$")
    );
    assert_eq!(
        default("metricsExporter.prometheus.serviceMonitor.honorLabels"),
        json!(true)
    );
    assert_eq!(
        default("testRunner.logsLocation.mountPath"),
        json!("/var/log/amd-test-runner")
    );
    assert_eq!(
        default("testRunner.logsLocation.hostPath"),
        json!("/var/log/amd-test-runner")
    );
    assert_eq!(
        default("remediationWorkflow.ttlForFailedWorkflows"),
        json!("24h")
    );
    assert_eq!(
        prop(spec, "remediationWorkflow.ttlForFailedWorkflows")["pattern"],
        json!(r"^([0-9]+(\.[0-9]+)?(ns|us|µs|ms|s|m|h))+$")
    );
    assert_eq!(
        default("remediationWorkflow.maxParallelWorkflows"),
        json!(0)
    );
    assert_eq!(
        default("remediationWorkflow.autoStartWorkflow"),
        json!(true)
    );
    assert_eq!(default("remediationWorkflow.rebootTimeout"), json!("15m"));
    assert!(prop(spec, "devicePlugin.devicePluginImage")["pattern"].is_string());
    // Sections without a reference default get none: the API server then
    // fills `enable: true` only into a written driver or devicePlugin section,
    // and an absent one stays absent (off), as with the reference CRD.
    for section in [
        "driver",
        "devicePlugin",
        "metricsExporter",
        "testRunner",
        "configManager",
        "draDriver",
        "remediationWorkflow",
        "commonConfig",
    ] {
        assert!(
            prop(spec, section).get("default").is_none(),
            "{section} has a default"
        );
    }
    assert!(prop(spec, "driver.upgradePolicy").get("default").is_none());
    assert!(
        prop(spec, "metricsExporter.enable")
            .get("default")
            .is_none()
    );
}

/// Kubernetes' structural schema rules, as far as they can be checked locally.
fn check_structural(node: &Value, path: &str, errors: &mut Vec<String>) {
    let Some(map) = node.as_object() else {
        errors.push(format!("{path}: not an object"));
        return;
    };
    for forbidden in [
        "$ref",
        "anyOf",
        "oneOf",
        "allOf",
        "not",
        "x-kubernetes-preserve-unknown-fields",
    ] {
        if map.contains_key(forbidden) {
            errors.push(format!("{path}: has {forbidden}"));
        }
    }
    if !map.contains_key("type") && map.get("x-kubernetes-int-or-string") != Some(&json!(true)) {
        errors.push(format!("{path}: has no type"));
    }
    if map.contains_key("properties") && map.contains_key("additionalProperties") {
        errors.push(format!(
            "{path}: has both properties and additionalProperties"
        ));
    }
    if let (Some(values), Some(default)) = (
        map.get("enum").and_then(Value::as_array),
        map.get("default"),
    ) && !values.contains(default)
    {
        errors.push(format!("{path}: default {default} is not in its enum"));
    }
    if let Some(properties) = map.get("properties").and_then(Value::as_object) {
        for (name, child) in properties {
            check_structural(child, &format!("{path}.{name}"), errors);
        }
    }
    for key in ["items", "additionalProperties"] {
        if let Some(child) = map.get(key).filter(|child| child.is_object()) {
            check_structural(child, &format!("{path}[{key}]"), errors);
        }
    }
}

#[test]
fn schema_is_structural_and_preserves_no_unknown_fields() {
    let crd = crd_json();
    let mut errors = Vec::new();
    check_structural(
        &version(&crd)["schema"]["openAPIV3Schema"],
        "openAPIV3Schema",
        &mut errors,
    );
    assert!(errors.is_empty(), "{errors:#?}");
}
