//! DeviceConfig types: defaults as the reference applies them, round trips of the
//! full and minimal examples, and the YAML spellings real files contain.

use std::path::Path;

use gpu_operator::api::{
    DeviceConfig, DeviceConfigSpec, DocumentKind, DriverType, Operand, ServiceType,
    default_exporter_resources, parse_device_configs, parse_documents, to_yaml,
};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde_json::{Value, json};

fn example(name: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("deploy/examples")
        .join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

fn fixture(name: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/deviceconfig")
        .join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

fn one(text: &str) -> DeviceConfig {
    let mut configs = parse_device_configs(text).unwrap_or_else(|e| panic!("parse: {e}\n{text}"));
    assert_eq!(configs.len(), 1, "one DeviceConfig in\n{text}");
    configs.remove(0)
}

fn with_spec(spec_yaml: &str) -> DeviceConfig {
    let indented: String = spec_yaml
        .lines()
        .map(|line| format!("  {line}\n"))
        .collect();
    one(&format!(
        "apiVersion: amd.com/v1alpha1\nkind: DeviceConfig\nmetadata:\n  name: t\nspec:\n{indented}"
    ))
}

fn json_of(config: &DeviceConfig) -> Value {
    serde_json::to_value(config).expect("DeviceConfig converts to JSON")
}

/// Serializes to YAML and parses again.
fn round_trip(config: &DeviceConfig) -> (String, DeviceConfig) {
    let yaml = to_yaml(config).expect("DeviceConfig serializes");
    let again = one(&yaml);
    (yaml, again)
}

#[test]
fn minimal_spec_gets_the_reference_defaults_and_writes_back_empty() {
    let config = one(&fixture("minimal.yaml"));
    let spec = &config.spec;
    assert_eq!(spec, &DeviceConfigSpec::default());
    // What the reference operator sees for `spec: {}`: the CRD puts no
    // default on `driver` or `devicePlugin`, so their `true` switches are
    // unset, and its code reads an unset switch as off.
    assert_eq!((&spec.driver, &spec.device_plugin), (&None, &None));
    assert!(!spec.is_enabled(Operand::Driver));
    assert!(!spec.is_enabled(Operand::DevicePlugin));
    assert!(!spec.is_enabled(Operand::NodeLabeller));
    assert_eq!(spec.driver().driver_type, DriverType::Container);
    assert!(spec.driver().upgrade_policy.is_none());
    assert!(!spec.dra_driver.enable);
    assert_eq!(spec.metrics_exporter.enable, None);
    assert_eq!(spec.metrics_exporter.port, 5000);
    assert_eq!(spec.metrics_exporter.service_type, ServiceType::ClusterIP);
    assert_eq!(
        spec.metrics_exporter.pod_resource_api_socket_path,
        "/var/lib/kubelet/pod-resources"
    );
    assert_eq!(spec.metrics_exporter.resource, default_exporter_resources());
    assert_eq!(
        spec.test_runner.logs_location.host_path,
        "/var/log/amd-test-runner"
    );
    assert_eq!(
        spec.test_runner.logs_location.mount_path,
        "/var/log/amd-test-runner"
    );
    assert_eq!(spec.remediation_workflow.ttl_for_failed_workflows, "24h");
    assert_eq!(spec.remediation_workflow.reboot_timeout, "15m");
    assert_eq!(spec.remediation_workflow.max_parallel_workflows, 0);
    assert!(spec.remediation_workflow.auto_start_workflow);
    assert!(spec.selector.is_empty());

    // Nothing the user did not write is added on write-back.
    assert_eq!(json_of(&config)["spec"], json!({}));
    let (yaml, again) = round_trip(&config);
    assert!(yaml.contains("spec: {}"), "{yaml}");
    assert_eq!(again, config);
}

#[test]
fn a_document_without_spec_means_spec_empty() {
    let config = one("apiVersion: amd.com/v1alpha1\nkind: DeviceConfig\nmetadata:\n  name: bare\n");
    assert_eq!(config.spec, DeviceConfigSpec::default());
    let config =
        one("apiVersion: amd.com/v1alpha1\nkind: DeviceConfig\nmetadata:\n  name: bare\nspec:\n");
    assert_eq!(config.spec, DeviceConfigSpec::default());
}

/// The reference's CRD has no default on `driver` or `devicePlugin`: their
/// `true` switches exist only in a section that is written, and its code reads
/// an absent one as off. A written section, even empty, gets the defaults and
/// keeps them on write-back, as the API server stores it.
#[test]
fn an_absent_section_is_off_and_an_empty_one_gets_its_defaults() {
    // The shape of the reference's examples that leave devicePlugin out.
    let only_driver_and_metrics =
        with_spec("driver:\n  enable: false\nmetricsExporter:\n  enable: true\n");
    let spec = &only_driver_and_metrics.spec;
    assert!(spec.device_plugin.is_none());
    assert!(!spec.is_enabled(Operand::DevicePlugin));
    assert!(!spec.is_enabled(Operand::NodeLabeller));
    assert!(spec.is_enabled(Operand::MetricsExporter));
    assert!(
        json_of(&only_driver_and_metrics)["spec"]
            .get("devicePlugin")
            .is_none()
    );

    let empty_sections = with_spec("driver: {}\ndevicePlugin: {}\n");
    let spec = &empty_sections.spec;
    assert!(spec.is_enabled(Operand::Driver));
    assert!(spec.is_enabled(Operand::DevicePlugin));
    assert!(spec.is_enabled(Operand::NodeLabeller));
    assert_eq!(
        spec.device_plugin().kubelet_socket_path,
        "/var/lib/kubelet/device-plugins"
    );
    let written = &json_of(&empty_sections)["spec"];
    assert_eq!(written["driver"]["enable"], json!(true));
    assert_eq!(written["driver"]["driverType"], json!("container"));
    assert_eq!(
        written["devicePlugin"],
        json!({
            "enableDevicePlugin": true,
            "enableNodeLabeller": true,
            "kubeletSocketPath": "/var/lib/kubelet/device-plugins"
        })
    );
    let (_, again) = round_trip(&empty_sections);
    assert_eq!(again, empty_sections, "presence survives a round trip");

    // One switch written: the other takes its default inside the section.
    let labeller_off = with_spec("devicePlugin:\n  enableNodeLabeller: false\n");
    assert!(labeller_off.spec.is_enabled(Operand::DevicePlugin));
    assert!(!labeller_off.spec.is_enabled(Operand::NodeLabeller));
    // `null` is no section at all.
    assert_eq!(with_spec("devicePlugin: null\n").spec.device_plugin, None);
}

#[test]
fn nested_defaults_apply_once_their_section_is_present() {
    let config = with_spec(
        "driver:\n  upgradePolicy:\n    enable: true\n    nodeDrainPolicy: {}\n    podDeletionPolicy: {}\n  imageBuild: {}\n\
         metricsExporter:\n  prometheus:\n    serviceMonitor:\n      relabelings:\n      - targetLabel: x\n\
         devicePlugin:\n  upgradePolicy: {}\n\
         remediationWorkflow:\n  nodeDrainPolicy:\n    force: true\n",
    );
    let policy = config
        .spec
        .driver()
        .upgrade_policy
        .as_ref()
        .expect("upgradePolicy is kept");
    assert_eq!(policy.enable, Some(true));
    assert_eq!(policy.max_parallel_upgrades, 1);
    assert_eq!(
        policy.max_unavailable_nodes,
        IntOrString::String("25%".into())
    );
    assert!(policy.reboot_required);
    let drain = policy
        .node_drain_policy
        .as_ref()
        .expect("nodeDrainPolicy is kept");
    assert!(!drain.force);
    assert_eq!(
        (drain.timeout_seconds, drain.grace_period_seconds),
        (300, -1)
    );
    assert!(drain.ignore_daemon_sets);
    let deletion = policy
        .pod_deletion_policy
        .as_ref()
        .expect("podDeletionPolicy is kept");
    assert_eq!(
        (
            deletion.timeout_seconds,
            deletion.grace_period_seconds,
            deletion.force
        ),
        (300, -1, false)
    );
    assert_eq!(
        config.spec.driver().image_build.base_image_registry,
        "docker.io"
    );
    let monitor = config
        .spec
        .metrics_exporter
        .prometheus
        .as_ref()
        .and_then(|p| p.service_monitor.as_ref());
    let monitor = monitor.expect("serviceMonitor is kept");
    assert!(monitor.honor_labels);
    assert_eq!(monitor.relabelings[0].action, "replace");
    assert_eq!(
        config
            .spec
            .device_plugin()
            .upgrade_policy
            .as_ref()
            .map(|p| p.max_unavailable),
        Some(1)
    );
    let rw_drain = config
        .spec
        .remediation_workflow
        .node_drain_policy
        .as_ref()
        .expect("kept");
    assert!(rw_drain.force);
    assert_eq!(rw_drain.timeout_seconds, 300);

    // Written back as the API server would store it: defaults filled in inside
    // the sections the user wrote, nothing invented outside them.
    let spec = &json_of(&config)["spec"];
    assert_eq!(
        spec["driver"]["upgradePolicy"],
        json!({
            "enable": true,
            "maxParallelUpgrades": 1,
            "maxUnavailableNodes": "25%",
            "nodeDrainPolicy": {"force": false, "timeoutSeconds": 300, "gracePeriodSeconds": -1, "ignoreDaemonSets": true},
            "podDeletionPolicy": {"force": false, "timeoutSeconds": 300, "gracePeriodSeconds": -1},
            "rebootRequired": true
        })
    );
    assert_eq!(
        spec["devicePlugin"],
        json!({
            "enableDevicePlugin": true,
            "enableNodeLabeller": true,
            "kubeletSocketPath": "/var/lib/kubelet/device-plugins",
            "upgradePolicy": {"maxUnavailable": 1}
        })
    );
    assert!(spec.get("testRunner").is_none());
    assert!(spec.get("configManager").is_none());
    let (_, again) = round_trip(&config);
    assert_eq!(again, config);
}

#[test]
fn fields_without_a_default_keep_what_was_written() {
    let config = with_spec(
        "driver:\n  blacklist: false\n  version: \"6.4\"\nmetricsExporter:\n  enable: false\n",
    );
    let spec = &json_of(&config)["spec"];
    assert_eq!(spec["driver"]["blacklist"], json!(false));
    assert_eq!(spec["driver"]["version"], json!("6.4"));
    assert_eq!(spec["metricsExporter"]["enable"], json!(false));
    assert!(spec["driver"].get("useSourceImage").is_none());
    assert!(spec["driver"].get("image").is_none());

    let unset = with_spec("driver:\n  version: \"6.4\"\n");
    assert!(json_of(&unset)["spec"]["driver"].get("blacklist").is_none());
    assert!(json_of(&unset)["spec"].get("metricsExporter").is_none());
}

/// Every field the issue lists, as a JSON pointer into the full example.
const FULL_EXAMPLE_FIELDS: &[&str] = &[
    "/spec/selector",
    "/spec/driver/enable",
    "/spec/driver/driverType",
    "/spec/driver/vfioConfig/deviceIDs",
    "/spec/driver/kernelModuleConfig/loadArgs",
    "/spec/driver/kernelModuleConfig/unloadArgs",
    "/spec/driver/kernelModuleConfig/parameters",
    "/spec/driver/blacklist",
    "/spec/driver/useSourceImage",
    "/spec/driver/amdgpuInstallerRepoURL",
    "/spec/driver/version",
    "/spec/driver/image",
    "/spec/driver/imageRegistryTLS/insecure",
    "/spec/driver/imageRegistryTLS/insecureSkipTLSVerify",
    "/spec/driver/imageRegistrySecret/name",
    "/spec/driver/imageSign/keySecret/name",
    "/spec/driver/imageSign/certSecret/name",
    "/spec/driver/imageBuild/baseImageRegistry",
    "/spec/driver/imageBuild/sourceImageRepo",
    "/spec/driver/imageBuild/packageRepoURL",
    "/spec/driver/imageBuild/gpgKeyURL",
    "/spec/driver/imageBuild/baseImageRegistryTLS/insecure",
    "/spec/driver/tolerations/0/key",
    "/spec/driver/upgradePolicy/enable",
    "/spec/driver/upgradePolicy/maxParallelUpgrades",
    "/spec/driver/upgradePolicy/maxUnavailableNodes",
    "/spec/driver/upgradePolicy/nodeDrainPolicy/force",
    "/spec/driver/upgradePolicy/nodeDrainPolicy/timeoutSeconds",
    "/spec/driver/upgradePolicy/nodeDrainPolicy/gracePeriodSeconds",
    "/spec/driver/upgradePolicy/nodeDrainPolicy/ignoreDaemonSets",
    "/spec/driver/upgradePolicy/nodeDrainPolicy/ignoreNamespaces/0",
    "/spec/driver/upgradePolicy/podDeletionPolicy/force",
    "/spec/driver/upgradePolicy/podDeletionPolicy/timeoutSeconds",
    "/spec/driver/upgradePolicy/podDeletionPolicy/gracePeriodSeconds",
    "/spec/driver/upgradePolicy/rebootRequired",
    "/spec/devicePlugin/enableDevicePlugin",
    "/spec/devicePlugin/enableNodeLabeller",
    "/spec/devicePlugin/devicePluginImage",
    "/spec/devicePlugin/devicePluginImagePullPolicy",
    "/spec/devicePlugin/devicePluginTolerations/0/key",
    "/spec/devicePlugin/devicePluginArguments/resource_naming_strategy",
    "/spec/devicePlugin/devicePluginArguments/driver_type",
    "/spec/devicePlugin/nodeLabellerImage",
    "/spec/devicePlugin/nodeLabellerImagePullPolicy",
    "/spec/devicePlugin/nodeLabellerTolerations/0/key",
    "/spec/devicePlugin/nodeLabellerArguments/0",
    "/spec/devicePlugin/imageRegistrySecret/name",
    "/spec/devicePlugin/upgradePolicy/upgradeStrategy",
    "/spec/devicePlugin/upgradePolicy/maxUnavailable",
    "/spec/devicePlugin/kubeletSocketPath",
    "/spec/devicePlugin/hostNetwork",
    "/spec/draDriver/enable",
    "/spec/draDriver/image",
    "/spec/draDriver/imagePullPolicy",
    "/spec/draDriver/tolerations/0/key",
    "/spec/draDriver/imageRegistrySecret/name",
    "/spec/draDriver/upgradePolicy/upgradeStrategy",
    "/spec/draDriver/cmdLineArguments/v",
    "/spec/draDriver/selector",
    "/spec/metricsExporter/enable",
    "/spec/metricsExporter/image",
    "/spec/metricsExporter/imageRegistrySecret/name",
    "/spec/metricsExporter/imagePullPolicy",
    "/spec/metricsExporter/tolerations/0/key",
    "/spec/metricsExporter/port",
    "/spec/metricsExporter/serviceType",
    "/spec/metricsExporter/nodePort",
    "/spec/metricsExporter/config/name",
    "/spec/metricsExporter/prometheus/serviceMonitor/enable",
    "/spec/metricsExporter/prometheus/serviceMonitor/interval",
    "/spec/metricsExporter/prometheus/serviceMonitor/attachMetadata/node",
    "/spec/metricsExporter/prometheus/serviceMonitor/honorLabels",
    "/spec/metricsExporter/prometheus/serviceMonitor/honorTimestamps",
    "/spec/metricsExporter/prometheus/serviceMonitor/labels/release",
    "/spec/metricsExporter/prometheus/serviceMonitor/relabelings/0/targetLabel",
    "/spec/metricsExporter/prometheus/serviceMonitor/metricRelabelings/0/regex",
    "/spec/metricsExporter/prometheus/serviceMonitor/authorization/credentials/key",
    "/spec/metricsExporter/prometheus/serviceMonitor/bearerTokenFile",
    "/spec/metricsExporter/prometheus/serviceMonitor/tlsConfig/ca/configMap/key",
    "/spec/metricsExporter/rbacConfig/enable",
    "/spec/metricsExporter/rbacConfig/image",
    "/spec/metricsExporter/rbacConfig/disableHttps",
    "/spec/metricsExporter/rbacConfig/secret/name",
    "/spec/metricsExporter/rbacConfig/clientCAConfigMap/name",
    "/spec/metricsExporter/rbacConfig/staticAuthorization/enable",
    "/spec/metricsExporter/rbacConfig/staticAuthorization/clientName",
    "/spec/metricsExporter/selector",
    "/spec/metricsExporter/upgradePolicy/upgradeStrategy",
    "/spec/metricsExporter/podResourceAPISocketPath",
    "/spec/metricsExporter/resource/limits/cpu",
    "/spec/metricsExporter/podAnnotations",
    "/spec/metricsExporter/serviceAnnotations",
    "/spec/metricsExporter/hostNetwork",
    "/spec/testRunner/enable",
    "/spec/testRunner/image",
    "/spec/testRunner/imagePullPolicy",
    "/spec/testRunner/tolerations/0/key",
    "/spec/testRunner/imageRegistrySecret/name",
    "/spec/testRunner/config/name",
    "/spec/testRunner/selector",
    "/spec/testRunner/upgradePolicy/upgradeStrategy",
    "/spec/testRunner/logsLocation/mountPath",
    "/spec/testRunner/logsLocation/hostPath",
    "/spec/testRunner/logsLocation/logsExportSecrets/0/name",
    "/spec/configManager/enable",
    "/spec/configManager/image",
    "/spec/configManager/imagePullPolicy",
    "/spec/configManager/imageRegistrySecret/name",
    "/spec/configManager/config/name",
    "/spec/configManager/selector",
    "/spec/configManager/upgradePolicy/upgradeStrategy",
    "/spec/configManager/configManagerTolerations/0/key",
    "/spec/commonConfig/initContainerImage",
    "/spec/commonConfig/imageRegistrySecrets/0/name",
    "/spec/commonConfig/utilsContainer/image",
    "/spec/commonConfig/utilsContainer/imagePullPolicy",
    "/spec/commonConfig/utilsContainer/imageRegistrySecret/name",
    "/spec/remediationWorkflow/enable",
    "/spec/remediationWorkflow/config/name",
    "/spec/remediationWorkflow/ttlForFailedWorkflows",
    "/spec/remediationWorkflow/testerImage",
    "/spec/remediationWorkflow/maxParallelWorkflows",
    "/spec/remediationWorkflow/nodeRemediationTaints/0/effect",
    "/spec/remediationWorkflow/nodeRemediationLabels",
    "/spec/remediationWorkflow/nodeDrainPolicy/timeoutSeconds",
    "/spec/remediationWorkflow/autoStartWorkflow",
    "/spec/remediationWorkflow/configMapImage",
    "/spec/remediationWorkflow/rebootTimeout",
];

#[test]
fn full_example_round_trips_every_field() {
    let text = example("deviceconfig-full.yaml");
    let config = one(&text);
    let written = json_of(&config);
    let missing: Vec<&&str> = FULL_EXAMPLE_FIELDS
        .iter()
        .filter(|path| written.pointer(path).is_none())
        .collect();
    assert!(missing.is_empty(), "fields lost on write-back: {missing:?}");

    let (yaml, again) = round_trip(&config);
    assert_eq!(
        again, config,
        "YAML write-back changed the DeviceConfig:\n{yaml}"
    );

    // Every value in the example survives (the example spells out all defaults,
    // so the written-back JSON equals the source document).
    let source: Value = {
        let documents: Vec<Value> = serde_saphyr::from_multiple(&text).expect("example is YAML");
        documents.into_iter().next().expect("one document")
    };
    assert_eq!(written["spec"], source["spec"]);
}

#[test]
fn realistic_examples_parse() {
    for name in [
        "deviceconfig-inbox-driver.yaml",
        "deviceconfig-driver-upgrade.yaml",
        "deviceconfig-dra.yaml",
    ] {
        let config = one(&example(name));
        let (_, again) = round_trip(&config);
        assert_eq!(again, config, "{name}");
    }
}

#[test]
fn yaml_1_1_spellings_and_quoted_numbers_parse() {
    let config = one(&fixture("yaml11.yaml"));
    let spec = &config.spec;
    let driver = spec.driver.as_ref().expect("driver is written");
    assert!(!driver.enable, "enable: False");
    assert_eq!(driver.blacklist, Some(true), "blacklist: yes");
    assert_eq!(
        driver.version.as_deref(),
        Some("6.4"),
        "unquoted number in a string field"
    );
    let policy = driver.upgrade_policy.as_ref().expect("upgradePolicy");
    assert_eq!(policy.enable, Some(true), "enable: True");
    assert_eq!(policy.max_parallel_upgrades, 3, "quoted number");
    assert_eq!(
        policy.max_unavailable_nodes,
        IntOrString::Int(2),
        "unquoted int-or-string"
    );
    assert_eq!(
        policy.node_drain_policy.as_ref().map(|d| d.timeout_seconds),
        Some(600),
        "quoted number"
    );
    assert!(
        spec.is_enabled(Operand::NodeLabeller),
        "enableNodeLabeller: TRUE"
    );
    assert_eq!(spec.metrics_exporter.enable, Some(true), "enable: True");
    assert_eq!(spec.metrics_exporter.port, 5000, "port: \"5000\"");
    assert_eq!(
        spec.metrics_exporter.node_port,
        Some(32500),
        "nodePort: '32500'"
    );
    assert_eq!(
        spec.selector
            .get("feature.node.kubernetes.io/amd-gpu")
            .map(String::as_str),
        Some("true")
    );
    assert_eq!(
        spec.dra_driver
            .cmd_line_arguments
            .get("v")
            .map(String::as_str),
        Some("4")
    );
    assert_eq!(
        spec.remediation_workflow.max_parallel_workflows, 4,
        "unquoted number for an int field"
    );
}

#[test]
fn other_documents_are_kept_apart_from_device_configs() {
    let text = "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: kube-amd-gpu\n---\n\
                apiVersion: amd.com/v1alpha1\nkind: DeviceConfig\nmetadata:\n  name: a\n  namespace: kube-amd-gpu\nspec: {}\n---\n\
                apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: d\nspec:\n  selector:\n    matchLabels:\n      app: d\n";
    let docs = parse_documents(text).expect("parses");
    assert_eq!(docs.len(), 3);
    assert!(matches!(&docs[0].kind, DocumentKind::Other { kind: Some(k), .. } if k == "Namespace"));
    assert!(matches!(&docs[1].kind, DocumentKind::DeviceConfig { .. }));
    assert!(
        matches!(&docs[2].kind, DocumentKind::Other { kind: Some(k), .. } if k == "Deployment")
    );
    assert_eq!((docs[0].line, docs[1].line, docs[2].line), (1, 6, 13));
    assert!(
        parse_device_configs(text).is_err(),
        "standalone mode wants DeviceConfigs only"
    );
}

#[test]
fn unknown_fields_are_recorded_with_their_paths() {
    let text = "apiVersion: amd.com/v1alpha1\nkind: DeviceConfig\nmetadata:\n  name: a\nspec:\n  driver:\n    enabel: true\n  \
                remediationWorkflow:\n    nodeRemediationTaints:\n    - key: k\n      effect: NoSchedule\n      colour: red\nextra: 1\n";
    let docs = parse_documents(text).expect("parses");
    let DocumentKind::DeviceConfig { unknown_fields, .. } = &docs[0].kind else {
        panic!("a DeviceConfig")
    };
    assert_eq!(
        unknown_fields,
        &vec![
            "extra".to_string(),
            "spec.driver.enabel".to_string(),
            "spec.remediationWorkflow.nodeRemediationTaints[0].colour".to_string()
        ]
    );
}

#[test]
fn kind_after_spec_still_reads_the_spec() {
    let text = "spec:\n  driver:\n    enable: false\n    colour: red\napiVersion: amd.com/v1alpha1\nkind: DeviceConfig\nmetadata:\n  name: late\n";
    let docs = parse_documents(text).expect("parses");
    let DocumentKind::DeviceConfig {
        config,
        unknown_fields,
        ..
    } = &docs[0].kind
    else {
        panic!("a DeviceConfig")
    };
    assert_eq!(config.spec.driver.as_ref().map(|d| d.enable), Some(false));
    assert_eq!(unknown_fields, &vec!["spec.driver.colour".to_string()]);
}

#[test]
fn parse_errors_point_at_line_and_column() {
    let err = parse_documents("apiVersion: amd.com/v1alpha1\nkind: DeviceConfig\nspec:\n  metricsExporter:\n    port: lots\n")
        .expect_err("port is not a number");
    assert_eq!(err.line, 5, "{err}");
    assert_eq!(err.column, 11, "{err}");
    assert!(
        err.message.contains("whole number") && err.message.contains("\"lots\""),
        "{err}"
    );
    let err = parse_documents("spec:\n  driver: [unclosed\n").expect_err("bad syntax");
    assert_eq!((err.line, err.column), (2, 11), "{err}");
    assert!(err.message.contains("unclosed"), "{err}");
}

#[test]
fn status_round_trips() {
    let text = "apiVersion: amd.com/v1alpha1\nkind: DeviceConfig\nmetadata:\n  name: s\nspec: {}\nstatus:\n  \
                driver:\n    nodesMatchingSelectorNumber: 3\n    desiredNumber: 3\n    availableNumber: 2\n  \
                nodeModuleStatus:\n    node-a:\n      containerImage: amdgpu-6.4.1\n      kernelVersion: 6.8.0-45-generic\n      \
                status: Upgrade-Complete\n      bootId: 0b1d\n  conditions:\n  - type: Ready\n    status: \"False\"\n    \
                reason: NoMatchingNodes\n    message: none\n    lastTransitionTime: \"2025-01-01T00:00:00Z\"\n  observedGeneration: 4\n";
    let config = one(text);
    let status = config.status.as_ref().expect("status");
    assert_eq!(status.driver.available_number, 2);
    assert_eq!(
        status.node_module_status["node-a"].status,
        Some(gpu_operator::api::UpgradeState::Complete)
    );
    assert_eq!(
        status.conditions[0].reason,
        gpu_operator::api::REASON_NO_MATCHING_NODES
    );
    assert_eq!(status.observed_generation, 4);
    let (_, again) = round_trip(&config);
    assert_eq!(again, config);
}
