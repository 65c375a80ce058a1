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
            ("Upgraded", ".status.driverUpgrade.complete"),
            ("Upgrading", ".status.driverUpgrade.inProgress"),
            ("Upgrade-Failed", ".status.driverUpgrade.failed"),
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

/// Problems `validate` finds in a DeviceConfig with this spec (JSON), or the
/// parse error when the spec does not even read as a DeviceConfig.
fn validate_spec(spec: &Value) -> Result<Vec<String>, String> {
    let text = serde_json::to_string(&json!({
        "apiVersion": "amd.com/v1alpha1", "kind": "DeviceConfig",
        "metadata": {"name": "t"}, "spec": spec
    }))
    .expect("JSON");
    let docs = gpu_operator::api::parse_documents(&text).map_err(|e| e.to_string())?;
    Ok(gpu_operator::api::document_problems(&docs[0])
        .into_iter()
        .map(|p| p.path)
        .collect())
}

/// Sets `value` at the dotted `path` under an empty spec.
fn spec_with(path: &str, value: Value) -> Value {
    path.rsplit('.')
        .fold(value, |inner, name| json!({ name: inner }))
}

/// Where the reference CRD has a marker, ours has it too, so that what the
/// API server rejects upstream it rejects here, and `validate` rejects it as
/// well (standalone mode has no API server). Each row: the schema node (a
/// `{}` step is a map's values), a value the reference rejects and one it
/// accepts, checked against the generated CRD's pattern and through
/// `validate`.
#[test]
fn values_the_reference_crd_rejects_are_rejected_by_schema_and_validate() {
    let crd = crd_json();
    let spec = &version(&crd)["schema"]["openAPIV3Schema"]["properties"]["spec"];
    let node = |path: &str| -> Value {
        let (props, map_values) = match path.strip_suffix("{}") {
            Some(p) => (p, true),
            None => (path, false),
        };
        let found = prop(spec, props);
        if map_values {
            found["additionalProperties"].clone()
        } else {
            found.clone()
        }
    };
    let image = "docker.io/rocm/k8s-device-plugin:v1.31.0";
    // (schema path, where validate reports it, rejected, accepted)
    let rows: &[(&str, &str, Value, Value)] = &[
        (
            "devicePlugin.kubeletSocketPath",
            "devicePlugin.kubeletSocketPath",
            json!("relative/dir"),
            json!("/var/snap/microk8s/common/var/lib/kubelet/device-plugins"),
        ),
        (
            "draDriver.image",
            "draDriver.image",
            json!("Rocm/K8s:Latest"),
            json!(image),
        ),
        (
            "remediationWorkflow.configMapImage",
            "remediationWorkflow.configMapImage",
            json!("registry/Remediation"),
            json!("rocm/remediation-workflows:v1"),
        ),
        (
            "remediationWorkflow.testerImage",
            "remediationWorkflow.testerImage",
            json!("two words"),
            json!(image),
        ),
        (
            "devicePlugin.devicePluginImage",
            "devicePlugin.devicePluginImage",
            json!("UPPER/case"),
            json!(image),
        ),
        (
            "devicePlugin.nodeLabellerImage",
            "devicePlugin.nodeLabellerImage",
            json!("x//y"),
            json!(image),
        ),
        (
            "metricsExporter.image",
            "metricsExporter.image",
            json!("a:b:c"),
            json!("rocm/device-metrics-exporter:v1.4.0"),
        ),
        (
            "metricsExporter.rbacConfig.image",
            "metricsExporter.rbacConfig.image",
            json!(""),
            json!("quay.io/brancz/kube-rbac-proxy:v0.18.1"),
        ),
        (
            "testRunner.image",
            "testRunner.image",
            json!("-bad"),
            json!("docker.io/rocm/test-runner:v1.4.0"),
        ),
        (
            "configManager.image",
            "configManager.image",
            json!("image@sha256:XYZ"),
            json!("rocm/device-config-manager@sha256:0abc"),
        ),
        (
            "commonConfig.utilsContainer.image",
            "commonConfig.utilsContainer.image",
            json!("bad image"),
            json!("docker.io/rocm/gpu-operator-utils:latest"),
        ),
        (
            "driver.image",
            "driver.image",
            json!("Registry/Driver"),
            json!("image-registry:5000/$MOD_NAMESPACE/amdgpu_kmod"),
        ),
        (
            "remediationWorkflow.rebootTimeout",
            "remediationWorkflow.rebootTimeout",
            json!("500ms"),
            json!("1h30m"),
        ),
        (
            "metricsExporter.resource.limits{}",
            "metricsExporter.resource.limits.cpu",
            json!("two cores"),
            json!("1500m"),
        ),
        (
            "metricsExporter.resource.requests{}",
            "metricsExporter.resource.requests.memory",
            json!("1 GB"),
            json!("1Gi"),
        ),
    ];
    for (schema_path, field, rejected, accepted) in rows {
        let pattern = node(schema_path)["pattern"]
            .as_str()
            .unwrap_or_else(|| panic!("{schema_path} has no pattern"))
            .to_owned();
        // Go's RE2 reads `\0` as NUL (an octal escape); `regex` wants `\x00`.
        let re =
            regex::Regex::new(&pattern.replace(r"\0", r"\x00")).expect("the CRD pattern compiles");
        let as_text = |v: &Value| v.as_str().unwrap_or_default().to_owned();
        assert!(
            !re.is_match(&as_text(rejected)),
            "{schema_path}: schema accepts {rejected}"
        );
        assert!(
            re.is_match(&as_text(accepted)),
            "{schema_path}: schema rejects {accepted}"
        );
        // The value inside its section (a map value goes under its key).
        let value_path = field;
        assert_eq!(
            validate_spec(&spec_with(value_path, rejected.clone())),
            Ok(vec![format!("spec.{field}")]),
            "validate accepts {rejected} at {field}"
        );
        assert_eq!(
            validate_spec(&spec_with(value_path, accepted.clone())),
            Ok(vec![]),
            "validate rejects {accepted} at {field}"
        );
    }

    // maxParallelWorkflows: minimum 0, as in the reference.
    assert_eq!(
        prop(spec, "remediationWorkflow.maxParallelWorkflows")["minimum"],
        json!(0.0)
    );
    assert_eq!(
        validate_spec(&spec_with(
            "remediationWorkflow.maxParallelWorkflows",
            json!(-1)
        )),
        Ok(vec![
            "spec.remediationWorkflow.maxParallelWorkflows".to_owned()
        ])
    );
    assert_eq!(
        validate_spec(&spec_with(
            "remediationWorkflow.maxParallelWorkflows",
            json!(3)
        )),
        Ok(vec![])
    );

    // Secret and ConfigMap key selectors require `key` (and have no default
    // for it); a selector without one does not read as a DeviceConfig.
    let monitor = "metricsExporter.prometheus.serviceMonitor";
    for selector in [
        "authorization.credentials",
        "tlsConfig.ca.configMap",
        "tlsConfig.ca.secret",
        "tlsConfig.cert.configMap",
        "tlsConfig.cert.secret",
        "tlsConfig.keySecret",
    ] {
        let node = prop(spec, &format!("{monitor}.{selector}"));
        assert_eq!(node["required"], json!(["key"]), "{selector}");
        assert!(
            node["properties"]["key"].get("default").is_none(),
            "{selector}"
        );
        let path = format!("{monitor}.{selector}");
        let without_key = validate_spec(&spec_with(&path, json!({"name": "tls"})));
        assert!(
            without_key.as_ref().is_err_and(|e| e.contains("key")),
            "{selector}: {without_key:?}"
        );
        assert_eq!(
            validate_spec(&spec_with(&path, json!({"name": "tls", "key": "ca.crt"}))),
            Ok(vec![]),
            "{selector}"
        );
    }

    // resource.claims: a list keyed by name, so a name may appear once.
    let claims = prop(spec, "metricsExporter.resource.claims");
    assert_eq!(claims["x-kubernetes-list-type"], json!("map"));
    assert_eq!(claims["x-kubernetes-list-map-keys"], json!(["name"]));
    assert_eq!(
        validate_spec(&spec_with(
            "metricsExporter.resource",
            json!({"claims": [{"name": "gpu"}, {"name": "gpu"}]})
        )),
        Ok(vec![
            "spec.metricsExporter.resource.claims[1].name".to_owned()
        ])
    );

    // Enums of ignored fields: the CRD rejects unknown values, so does validate.
    for (path, rejected, accepted) in [
        (
            "devicePlugin.devicePluginImagePullPolicy",
            "Sometimes",
            "Always",
        ),
        (
            "commonConfig.utilsContainer.imagePullPolicy",
            "always",
            "Never",
        ),
        (
            "testRunner.upgradePolicy.upgradeStrategy",
            "Sideways",
            "OnDelete",
        ),
    ] {
        let values = &prop(spec, path)["enum"];
        assert!(
            !values
                .as_array()
                .is_some_and(|v| v.contains(&json!(rejected))),
            "{path}"
        );
        assert!(
            values
                .as_array()
                .is_some_and(|v| v.contains(&json!(accepted))),
            "{path}"
        );
        assert_eq!(
            validate_spec(&spec_with(path, json!(rejected))),
            Ok(vec![format!("spec.{path}")])
        );
        assert_eq!(validate_spec(&spec_with(path, json!(accepted))), Ok(vec![]));
    }

    // Kept from before: a negative grace period is allowed (the reference's
    // own tests store -2).
    assert_eq!(
        validate_spec(&spec_with(
            "driver.upgradePolicy.nodeDrainPolicy.gracePeriodSeconds",
            json!(-2)
        )),
        Ok(vec![])
    );
}
