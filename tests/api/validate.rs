//! DeviceConfig validation: each rule with a failing and a passing case, the
//! examples, and the ignored-field notes.

use std::path::Path;

use gpu_operator::api::cli::{Outcome, validate_text};
use gpu_operator::api::{
    DocumentKind, NOT_ACTED_ON_YET, Problem, document_problems, ignored_fields, parse_documents,
};

/// Problems of a DeviceConfig whose spec is `spec_yaml`.
fn problems(spec_yaml: &str) -> Vec<Problem> {
    let indented: String = spec_yaml
        .lines()
        .map(|line| format!("  {line}\n"))
        .collect();
    let text = format!(
        "apiVersion: amd.com/v1alpha1\nkind: DeviceConfig\nmetadata:\n  name: t\nspec:\n{indented}"
    );
    let docs = parse_documents(&text).unwrap_or_else(|e| panic!("parse: {e}\n{text}"));
    assert_eq!(docs.len(), 1);
    document_problems(&docs[0])
}

/// Asserts the problems of `spec_yaml` are exactly at `paths`.
#[track_caller]
fn assert_problems(spec_yaml: &str, paths: &[&str]) {
    let found = problems(spec_yaml);
    let found_paths: Vec<&str> = found.iter().map(|p| p.path.as_str()).collect();
    assert_eq!(
        found_paths, paths,
        "spec:\n{spec_yaml}\nproblems: {found:#?}"
    );
}

#[track_caller]
fn assert_valid(spec_yaml: &str) {
    assert_problems(spec_yaml, &[]);
}

#[test]
fn driver_type_enum() {
    assert_problems("driver:\n  driverType: gpu\n", &["spec.driver.driverType"]);
    assert_valid("driver:\n  driverType: vf-passthrough\n");
    let message = &problems("driver:\n  driverType: gpu\n")[0].message;
    assert_eq!(
        message,
        r#""gpu" is not one of container, vf-passthrough, pf-passthrough"#
    );
}

#[test]
fn service_type_enum() {
    assert_problems(
        "metricsExporter:\n  serviceType: LoadBalancer\n",
        &["spec.metricsExporter.serviceType"],
    );
    assert_valid("metricsExporter:\n  serviceType: NodePort\n");
}

#[test]
fn relabel_action_and_tls_version_enums() {
    let bad = "metricsExporter:\n  prometheus:\n    serviceMonitor:\n      relabelings:\n      - action: rename\n      \
               tlsConfig:\n        minVersion: TLS9\n";
    assert_problems(
        bad,
        &[
            "spec.metricsExporter.prometheus.serviceMonitor.relabelings[0].action",
            "spec.metricsExporter.prometheus.serviceMonitor.tlsConfig.minVersion",
        ],
    );
    assert_valid(
        "metricsExporter:\n  prometheus:\n    serviceMonitor:\n      metricRelabelings:\n      - action: Keep\n      \
         tlsConfig:\n        minVersion: TLS12\n        maxVersion: TLS13\n",
    );
}

#[test]
fn device_plugin_and_dra_are_exclusive() {
    // An absent devicePlugin runs no device plugin (the reference's CRD has
    // no default on the section), so DRA alone is valid, as upstream.
    assert_valid("draDriver:\n  enable: true\n");
    // Inside a present section enableDevicePlugin defaults to true.
    assert_problems(
        "draDriver:\n  enable: true\ndevicePlugin: {}\n",
        &["spec.draDriver.enable"],
    );
    assert_problems(
        "draDriver:\n  enable: true\ndevicePlugin:\n  enableDevicePlugin: true\n",
        &["spec.draDriver.enable"],
    );
    assert_valid("draDriver:\n  enable: true\ndevicePlugin:\n  enableDevicePlugin: false\n");
    assert_valid("draDriver:\n  enable: false\n");
}

#[test]
fn device_plugin_argument_keys_and_values() {
    assert_problems(
        "devicePlugin:\n  devicePluginArguments:\n    pulse: \"5\"\n",
        &["spec.devicePlugin.devicePluginArguments"],
    );
    assert_problems(
        "devicePlugin:\n  devicePluginArguments:\n    resource_naming_strategy: triple\n",
        &["spec.devicePlugin.devicePluginArguments.resource_naming_strategy"],
    );
    assert_problems(
        "devicePlugin:\n  devicePluginArguments:\n    driver_type: gpu\n",
        &["spec.devicePlugin.devicePluginArguments.driver_type"],
    );
    assert_valid(
        "devicePlugin:\n  devicePluginArguments:\n    resource_naming_strategy: mixed\n    driver_type: pf-passthrough\n",
    );
    // The reference judges the arguments only while the device plugin runs.
    assert_valid(
        "devicePlugin:\n  enableDevicePlugin: false\n  devicePluginArguments:\n    pulse: \"5\"\n",
    );
}

#[test]
fn time_slicing_arguments_are_known_and_their_values_checked() {
    assert_valid(
        "devicePlugin:\n  devicePluginArguments:\n    time_slicing_replicas: \"4\"\n    time_slicing_rename: \"true\"\n    time_slicing_fail_requests_greater_than_one: \"false\"\n",
    );
    assert_valid("devicePlugin:\n  devicePluginArguments:\n    time_slicing_replicas: \"64\"\n");
    for bad in ["0", "65", "four", "-2"] {
        assert_problems(
            &format!(
                "devicePlugin:\n  devicePluginArguments:\n    time_slicing_replicas: \"{bad}\"\n"
            ),
            &["spec.devicePlugin.devicePluginArguments.time_slicing_replicas"],
        );
    }
    // DRA shares by the same count, with the device plugin off.
    assert_problems(
        "draDriver:\n  enable: true\ndevicePlugin:\n  enableDevicePlugin: false\n  devicePluginArguments:\n    time_slicing_replicas: \"0\"\n",
        &["spec.devicePlugin.devicePluginArguments.time_slicing_replicas"],
    );
    assert_problems(
        "devicePlugin:\n  devicePluginArguments:\n    time_slicing_rename: \"yes\"\n    time_slicing_fail_requests_greater_than_one: \"1\"\n",
        &[
            "spec.devicePlugin.devicePluginArguments.time_slicing_rename",
            "spec.devicePlugin.devicePluginArguments.time_slicing_fail_requests_greater_than_one",
        ],
    );
}

#[test]
fn node_labeller_arguments() {
    assert_problems(
        "devicePlugin:\n  nodeLabellerArguments:\n  - vram\n  - colour\n",
        &["spec.devicePlugin.nodeLabellerArguments[1]"],
    );
    assert_valid(
        "devicePlugin:\n  nodeLabellerArguments:\n  - -vram\n  - --firmware\n  - compute-memory-partition\n",
    );
}

#[test]
fn int_or_percent() {
    for bad in ["\"130%\"", "\"2\"", "-1", "\"-5%\"", "lots"] {
        assert_problems(
            &format!("driver:\n  upgradePolicy:\n    maxUnavailableNodes: {bad}\n"),
            &["spec.driver.upgradePolicy.maxUnavailableNodes"],
        );
    }
    for good in ["2", "0", "\"50%\"", "100%"] {
        assert_valid(&format!(
            "driver:\n  upgradePolicy:\n    maxUnavailableNodes: {good}\n"
        ));
    }
    let message = &problems("driver:\n  upgradePolicy:\n    maxUnavailableNodes: \"130%\"\n")[0];
    assert_eq!(
        message.to_string(),
        r#"spec.driver.upgradePolicy.maxUnavailableNodes: "130%" is not a percentage between 0% and 100%"#
    );
}

#[test]
fn durations() {
    assert_problems(
        "remediationWorkflow:\n  ttlForFailedWorkflows: 1 day\n  rebootTimeout: \"10\"\n",
        &[
            "spec.remediationWorkflow.ttlForFailedWorkflows",
            "spec.remediationWorkflow.rebootTimeout",
        ],
    );
    assert_valid("remediationWorkflow:\n  ttlForFailedWorkflows: 36h\n  rebootTimeout: 1h30m\n");
}

#[test]
fn service_monitor_interval() {
    assert_problems(
        "metricsExporter:\n  prometheus:\n    serviceMonitor:\n      interval: 1m30s\n",
        &["spec.metricsExporter.prometheus.serviceMonitor.interval"],
    );
    assert_valid("metricsExporter:\n  prometheus:\n    serviceMonitor:\n      interval: 45s\n");
}

#[test]
fn taints() {
    let bad = "remediationWorkflow:\n  enable: true\n  config:\n    name: workflows\n  nodeRemediationTaints:\n  \
               - key: bad key!\n    value: has space\n    effect: Evict\n";
    assert_problems(
        bad,
        &[
            "spec.remediationWorkflow.nodeRemediationTaints[0].key",
            "spec.remediationWorkflow.nodeRemediationTaints[0].value",
            "spec.remediationWorkflow.nodeRemediationTaints[0].effect",
        ],
    );
    assert_valid(
        "remediationWorkflow:\n  enable: true\n  config:\n    name: workflows\n  nodeRemediationTaints:\n  \
         - key: amd.com/gpu-unhealthy\n    value: \"true\"\n    effect: NoExecute\n  - key: plain\n    \
         effect: PreferNoSchedule\n",
    );
    // As in the reference, taints are judged only while remediation is on.
    assert_valid(&bad.replace("enable: true", "enable: false"));
}

#[test]
fn labels() {
    assert_problems(
        "selector:\n  -bad: \"true\"\n  good: x y\n",
        &["spec.selector", "spec.selector.good"],
    );
    assert_problems(
        "remediationWorkflow:\n  enable: true\n  config:\n    name: w\n  nodeRemediationLabels:\n    \
         Example.com/x: \"y\"\n",
        &["spec.remediationWorkflow.nodeRemediationLabels"],
    );
    // Judged only while remediation is on, as in the reference.
    assert_valid("remediationWorkflow:\n  nodeRemediationLabels:\n    Example.com/x: \"y\"\n");
    assert_problems(
        "metricsExporter:\n  selector:\n    a: \"-b\"\n",
        &["spec.metricsExporter.selector.a"],
    );
    assert_problems(
        "metricsExporter:\n  serviceAnnotations:\n    not valid: \"1\"\n",
        &["spec.metricsExporter.serviceAnnotations"],
    );
    assert_valid(
        "selector:\n  feature.node.kubernetes.io/amd-gpu: \"true\"\nremediationWorkflow:\n  nodeRemediationLabels:\n    \
         amd.com/remediation: \"\"\nmetricsExporter:\n  serviceAnnotations:\n    prometheus.io/scrape: any value at all\n",
    );
}

#[test]
fn remediation_without_a_mapping_uses_the_builtin_one() {
    // The reference refuses it (its ConfigMap lookup fails); here the
    // built-in mapping (its former default ConfigMap) serves.
    assert_valid("remediationWorkflow:\n  enable: true\n");
    assert_valid("remediationWorkflow:\n  enable: true\n  config:\n    name: workflows\n");
    assert_valid(
        "remediationWorkflow:\n  enable: true\n  configMapImage: docker.io/rocm/remediation:v1\n",
    );
    assert_valid("remediationWorkflow:\n  enable: false\n");
}

#[test]
fn node_port_and_port_ranges() {
    for bad in ["29999", "32768"] {
        assert_problems(
            &format!("metricsExporter:\n  nodePort: {bad}\n"),
            &["spec.metricsExporter.nodePort"],
        );
    }
    for good in ["30000", "32767"] {
        assert_valid(&format!(
            "metricsExporter:\n  serviceType: NodePort\n  nodePort: {good}\n"
        ));
    }
    assert_problems(
        "metricsExporter:\n  port: 0\n",
        &["spec.metricsExporter.port"],
    );
    assert_problems(
        "metricsExporter:\n  port: 70000\n",
        &["spec.metricsExporter.port"],
    );
    assert_valid("metricsExporter:\n  port: 9400\n");
}

#[test]
fn counts_and_timeouts() {
    let bad = "driver:\n  upgradePolicy:\n    maxParallelUpgrades: -1\n    nodeDrainPolicy:\n      timeoutSeconds: -5\n      \
               gracePeriodSeconds: -2\n    podDeletionPolicy:\n      timeoutSeconds: -1\n\
               remediationWorkflow:\n  maxParallelWorkflows: -3\n";
    assert_problems(
        bad,
        &[
            "spec.driver.upgradePolicy.maxParallelUpgrades",
            "spec.driver.upgradePolicy.nodeDrainPolicy.timeoutSeconds",
            "spec.driver.upgradePolicy.podDeletionPolicy.timeoutSeconds",
            "spec.remediationWorkflow.maxParallelWorkflows",
        ],
    );
    assert_valid(
        "driver:\n  upgradePolicy:\n    maxParallelUpgrades: 0\n    nodeDrainPolicy:\n      timeoutSeconds: 0\n      \
         gracePeriodSeconds: -1\nremediationWorkflow:\n  maxParallelWorkflows: 0\n",
    );
    // Any negative grace period uses each pod's own (kubectl drain's rule);
    // the reference's own end-to-end tests store -2.
    assert_valid(
        "driver:\n  upgradePolicy:\n    nodeDrainPolicy:\n      gracePeriodSeconds: -2\n    \
         podDeletionPolicy:\n      gracePeriodSeconds: -30\n",
    );
}

#[test]
fn absolute_paths() {
    assert_problems(
        "devicePlugin:\n  kubeletSocketPath: var/lib/kubelet\nmetricsExporter:\n  podResourceAPISocketPath: pod-resources\n\
         testRunner:\n  logsLocation:\n    hostPath: logs\n",
        &[
            "spec.devicePlugin.kubeletSocketPath",
            "spec.metricsExporter.podResourceAPISocketPath",
            "spec.testRunner.logsLocation.hostPath",
        ],
    );
    assert_valid(
        "devicePlugin:\n  kubeletSocketPath: /var/snap/microk8s/common/var/lib/kubelet/device-plugins\n\
         metricsExporter:\n  podResourceAPISocketPath: /var/snap/microk8s/common/var/lib/kubelet/pod-resources/\n",
    );
    // Empty matches the CRD's path pattern and means the default, as in the
    // reference's code (validate must not be stricter than the CRD).
    assert_valid(
        "devicePlugin:\n  kubeletSocketPath: \"\"\nmetricsExporter:\n  podResourceAPISocketPath: \"\"\n",
    );
}

#[test]
fn object_references_need_a_name() {
    assert_problems(
        "remediationWorkflow:\n  config: {}\nmetricsExporter:\n  rbacConfig:\n    secret:\n      name: \"\"\n",
        &[
            "spec.metricsExporter.rbacConfig.secret.name",
            "spec.remediationWorkflow.config.name",
        ],
    );
    assert_valid("remediationWorkflow:\n  config:\n    name: w\n");
}

#[test]
fn static_authorization_needs_a_client_name() {
    assert_problems(
        "metricsExporter:\n  rbacConfig:\n    staticAuthorization:\n      enable: true\n",
        &["spec.metricsExporter.rbacConfig.staticAuthorization.clientName"],
    );
    assert_valid(
        "metricsExporter:\n  rbacConfig:\n    staticAuthorization:\n      enable: true\n      clientName: prom\n",
    );
}

#[test]
fn unknown_fields_and_api_version() {
    assert_problems("driver:\n  enabel: false\n", &["spec.driver.enabel"]);
    let text = "apiVersion: amd.com/v1beta1\nkind: DeviceConfig\nmetadata:\n  name: t\nspec: {}\n";
    let docs = parse_documents(text).expect("parses");
    let found = document_problems(&docs[0]);
    assert_eq!(
        found.iter().map(|p| p.path.as_str()).collect::<Vec<_>>(),
        vec!["apiVersion"]
    );
    let text = "apiVersion: amd.com/v1alpha1\nkind: DeviceConfig\nmetadata:\n  name: t\nspec: {}\n";
    assert_eq!(
        document_problems(&parse_documents(text).expect("parses")[0]),
        vec![]
    );
    let nameless = "apiVersion: amd.com/v1alpha1\nkind: DeviceConfig\nspec: {}\n";
    let found = document_problems(&parse_documents(nameless).expect("parses")[0]);
    assert_eq!(
        found,
        vec![Problem::new(
            "metadata.name",
            "is missing; every Kubernetes object needs a name"
        )]
    );
}

#[test]
fn ignored_fields_are_notes_not_problems() {
    let spec = "devicePlugin:\n  devicePluginImage: rocm/k8s-device-plugin:v1.31\n  devicePluginImagePullPolicy: Always\n  \
                devicePluginTolerations:\n  - operator: Exists\ncommonConfig:\n  initContainerImage: busybox\n";
    assert_valid(spec);
    let text = format!(
        "apiVersion: amd.com/v1alpha1\nkind: DeviceConfig\nmetadata:\n  name: t\nspec:\n{}",
        spec.lines().map(|l| format!("  {l}\n")).collect::<String>()
    );
    let docs = parse_documents(&text).expect("parses");
    let DocumentKind::DeviceConfig { config, .. } = &docs[0].kind else {
        panic!("a DeviceConfig")
    };
    // No driver section: nothing to install, so no note for it.
    assert_eq!(
        ignored_fields(&config.spec),
        vec![
            "spec.devicePlugin.devicePluginImage",
            "spec.devicePlugin.devicePluginImagePullPolicy",
            "spec.devicePlugin.devicePluginTolerations",
            "spec.commonConfig.initContainerImage",
        ]
    );
}

#[test]
fn ignored_fields_with_defaults_are_noted_when_changed() {
    let text = |spec: &str| {
        format!(
            "apiVersion: amd.com/v1alpha1\nkind: DeviceConfig\nmetadata:\n  name: t\nspec:\n{spec}"
        )
    };
    let notes = |spec: &str| {
        let docs = parse_documents(&text(spec)).expect("parses");
        let DocumentKind::DeviceConfig { config, .. } = &docs[0].kind else {
            panic!("a DeviceConfig")
        };
        ignored_fields(&config.spec)
    };
    let defaults = "  metricsExporter:\n    resource:\n      limits:\n        cpu: \"2\"\n        memory: 4G\n      \
                    requests:\n        cpu: 500m\n        memory: 512M\n  testRunner:\n    logsLocation:\n      \
                    mountPath: /var/log/amd-test-runner\n";
    // Nothing: the defaults are unchanged, and without a driver section
    // there is no driver to install.
    assert_eq!(notes(defaults), Vec::<String>::new());
    // A present driver section defaults to enable: true, which the agent
    // acts on: nothing to note either.
    assert_eq!(
        notes(&format!("  driver: {{}}\n{defaults}")),
        Vec::<String>::new()
    );
    let changed = "  metricsExporter:\n    resource:\n      limits:\n        cpu: \"1\"\n  testRunner:\n    \
                   logsLocation:\n      mountPath: /logs\n";
    assert_eq!(
        notes(changed),
        vec![
            "spec.metricsExporter.resource",
            "spec.testRunner.logsLocation.mountPath"
        ]
    );
}

fn examples() -> Vec<std::path::PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/examples");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("read {}: {e}", dir.display()))
        .map(|entry| entry.expect("directory entry").path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "yaml"))
        .collect();
    files.sort();
    files
}

#[test]
fn every_example_is_valid() {
    let files = examples();
    assert!(
        files.len() >= 4,
        "the full example and three realistic ones: {files:?}"
    );
    for path in files {
        let text = std::fs::read_to_string(&path).expect("example is readable");
        let report = validate_text(&path.display().to_string(), &text, true);
        assert_eq!(
            report.outcome,
            Outcome::Valid,
            "{}",
            report.lines.join("\n")
        );
    }
}

#[test]
fn full_example_lists_its_ignored_fields() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/examples/deviceconfig-full.yaml");
    let text = std::fs::read_to_string(&path).expect("example is readable");
    let report = validate_text("full.yaml", &text, true);
    let notes: Vec<&String> = report
        .lines
        .iter()
        .filter(|line| line.contains(": note: "))
        .collect();
    for path in [
        "spec.driver.image",
        "spec.devicePlugin.devicePluginImage",
        "spec.devicePlugin.nodeLabellerTolerations",
        "spec.draDriver.upgradePolicy",
        "spec.metricsExporter.podAnnotations",
        "spec.testRunner.image",
        "spec.configManager.configManagerTolerations",
        "spec.commonConfig.utilsContainer",
        "spec.remediationWorkflow.testerImage",
    ] {
        assert!(
            notes
                .iter()
                .any(|line| line.contains(&format!("note: {path}: ignored in this design"))),
            "no note for {path} in:\n{}",
            report.lines.join("\n")
        );
    }
    // Fields whose feature is not built yet say so; honoured fields (the
    // driver's upgradePolicy among them) are not listed.
    assert!(
        !notes
            .iter()
            .any(|line| line.contains("note: spec.driver.upgradePolicy:")),
        "rolling upgrades act on upgradePolicy:\n{}",
        report.lines.join("\n")
    );
    // Remediation is acted on: no remediationWorkflow field is "not acted
    // on yet"; what it does not use is ignored, with why.
    assert!(
        !notes
            .iter()
            .any(|line| line.contains("note: spec.remediationWorkflow")
                && line.contains("not acted on yet")),
        "remediation is built:\n{}",
        report.lines.join("\n")
    );
    // (ttlForFailedWorkflows is at its default there, so not noted.)
    let path = "spec.remediationWorkflow.configMapImage";
    assert!(
        notes
            .iter()
            .any(|line| line.contains(&format!("note: {path}: ignored in this design"))),
        "no note for {path} in:\n{}",
        report.lines.join("\n")
    );
    assert!(
        !notes
            .iter()
            .any(|line| line.contains("note: spec.metricsExporter.port"))
    );
    let quiet = validate_text("full.yaml", &text, false);
    assert!(quiet.lines.iter().all(|line| !line.contains("note:")));
}

/// One row of `docs/deviceconfig.md`'s field tables.
struct DocRow {
    /// The `### \`section\`` it is under.
    section: String,
    /// The field paths its first cell names: "`imageSign.keySecret`,
    /// `.certSecret`" names `imageSign.keySecret` and `imageSign.certSecret`.
    fields: Vec<String>,
    line: String,
}

/// The field table rows of `docs/deviceconfig.md`, and the sections with a
/// "Not acted on yet" banner.
fn doc_rows() -> (Vec<DocRow>, Vec<String>) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/deviceconfig.md");
    let text = std::fs::read_to_string(&path).expect("docs/deviceconfig.md is readable");
    let mut rows = Vec::new();
    let mut banners = Vec::new();
    let mut section: Option<String> = None;
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("### `") {
            section = rest.split('`').next().map(str::to_owned);
            continue;
        }
        if line.starts_with("## ") || line.starts_with("#### ") {
            section = None;
            continue;
        }
        let Some(section) = &section else { continue };
        if line.starts_with("> **Not acted on yet.**") {
            banners.push(section.clone());
        }
        let Some(first) = line
            .strip_prefix("| `")
            .map(|rest| rest.split(" | ").next().unwrap_or(""))
        else {
            continue;
        };
        let mut fields = Vec::new();
        let mut parent = String::new();
        for token in format!("`{first}").split('`').skip(1).step_by(2) {
            if let Some(relative) = token.strip_prefix('.') {
                fields.push(format!("{parent}.{relative}"));
            } else {
                parent = token.rsplit_once('.').map_or(token, |(p, _)| p).to_owned();
                fields.push(token.to_owned());
            }
        }
        rows.push(DocRow {
            section: section.clone(),
            fields,
            line: line.to_owned(),
        });
    }
    (rows, banners)
}

/// `docs/deviceconfig.md` must not describe as working what is only
/// accepted: every field `validate` notes as "not acted on yet" has each of
/// its rows marked **Not acted on yet.**, and every marked row (or section
/// banner) is such a field, so the marks stay true as features land.
#[test]
fn docs_mark_exactly_the_fields_not_acted_on_yet() {
    let (rows, banners) = doc_rows();
    assert!(
        rows.len() > 50,
        "the field tables were not found: {}",
        rows.len()
    );
    let split = |path: &str| -> (String, String) {
        let rest = path.strip_prefix("spec.").expect("paths start with spec.");
        let (section, field) = rest.split_once('.').expect("section.field");
        (section.to_owned(), field.to_owned())
    };
    let names = |field: &str, row_field: &str| {
        row_field == field || row_field.starts_with(&format!("{field}."))
    };
    for path in NOT_ACTED_ON_YET {
        let (section, field) = split(path);
        let matching: Vec<&String> = rows
            .iter()
            .filter(|row| row.section == section && row.fields.iter().any(|f| names(&field, f)))
            .map(|row| &row.line)
            .collect();
        assert!(
            !matching.is_empty(),
            "{path}: no row in docs/deviceconfig.md"
        );
        for row in matching {
            assert!(
                row.contains("**Not acted on yet"),
                "{path} is not marked:\n{row}"
            );
        }
    }
    for row in &rows {
        if !row.line.contains("Not acted on yet") {
            continue;
        }
        let listed = NOT_ACTED_ON_YET.iter().any(|path| {
            let (section, field) = split(path);
            section == row.section && row.fields.iter().any(|f| names(&field, f))
        });
        assert!(
            listed,
            "marked in the docs but not in NOT_ACTED_ON_YET (crates/api/src/validate/notes.rs):\n{}",
            row.line
        );
    }
    for section in banners {
        assert!(
            NOT_ACTED_ON_YET.contains(&format!("spec.{section}.enable").as_str()),
            "the {section} section says it is not acted on yet, but its enable is"
        );
    }
}
