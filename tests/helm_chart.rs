//! The Helm chart (deploy/helm/gpu-operator) against the plain manifests it
//! is rendered from, and against AMD's chart whose values it reads.
//!
//! The chart renders the agents' RBAC, the admission policies, the
//! NetworkPolicy, the agent DaemonSet and node detection from byte-identical
//! copies of deploy/ (files/, and the CRDs in crds/): the first test fails
//! when a copy differs (deploy/helm/sync-files makes them), and
//! `default_rendering_is_what_deploy_applies` that the real `helm template`
//! renders the same objects as `kubectl apply -f deploy/` applies, with only
//! Helm's labels added. The other tests render with the chart's defaults,
//! AMD's default values file and the reference's e2e cases (ci/), and check
//! every rendering with k8s-openapi, `kubernetes-validate --strict` (Kubernetes
//! 1.34, built-in kinds) and `gpu-operator validate` (the DeviceConfig).
//!
//! They run the `helm` binary ($HELM, else `helm` on PATH; .ci/run installs
//! Helm v4.1.4) and skip, saying so, where there is none; REQUIRE_HELM=1
//! (set by .ci/run) turns the skip into a failure, and then also requires
//! kubernetes-validate.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use support::helm::helm_present;

use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, ServiceAccount};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use k8s_openapi::api::resource::v1::DeviceClass;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

const CHART: &str = "deploy/helm/gpu-operator";
const NAMESPACE: &str = "kube-amd-gpu";
const RELEASE: &str = "gpu-operator";
const KUBERNETES_VERSION: &str = "1.34.0";
/// Labels Helm's conventions add to every object of the release.
const HELM_LABELS: [&str; 4] = [
    "helm.sh/chart",
    "app.kubernetes.io/managed-by",
    "app.kubernetes.io/instance",
    "app.kubernetes.io/version",
];
/// The chart's copies of deploy/ (chart path, deploy/ path).
const COPIES: [(&str, &str); 8] = [
    ("files/10-rbac.yaml", "deploy/10-rbac.yaml"),
    (
        "files/27-default-dcm-config.yaml",
        "deploy/27-default-dcm-config.yaml",
    ),
    (
        "files/15-admission-policy.yaml",
        "deploy/15-admission-policy.yaml",
    ),
    ("files/20-daemonset.yaml", "deploy/20-daemonset.yaml"),
    (
        "files/25-networkpolicy.yaml",
        "deploy/25-networkpolicy.yaml",
    ),
    (
        "files/node-detection.yaml",
        "deploy/optional/node-detection.yaml",
    ),
    (
        "crds/deviceconfigs.amd.com.yaml",
        "deploy/crd/deviceconfigs.amd.com.yaml",
    ),
    (
        "crds/remediationworkflowstatuses.amd.com.yaml",
        "deploy/crd/remediationworkflowstatuses.amd.com.yaml",
    ),
];
/// The hook objects (kind, name) of a default rendering. Their rights on
/// DeviceConfigs are cluster-wide (the agents follow every namespace's);
/// with watchNamespace a Role and RoleBinding there hold them instead.
const HOOK_OBJECTS: [(&str, &str); 8] = [
    ("ServiceAccount", "gpu-operator-upgrade-crd"),
    ("ClusterRole", "gpu-operator-upgrade-crd"),
    ("ClusterRoleBinding", "gpu-operator-upgrade-crd"),
    ("Job", "gpu-operator-upgrade-crd"),
    ("ServiceAccount", "gpu-operator-uninstall"),
    ("ClusterRole", "gpu-operator-uninstall"),
    ("ClusterRoleBinding", "gpu-operator-uninstall"),
    ("Job", "gpu-operator-uninstall"),
];
/// AMD's chart's 21 top-level keys that do nothing here.
const IGNORED_KEYS: [&str; 7] = [
    "kmm",
    "kmmDevicePlugin",
    "kmmModuleLoader",
    "remediation",
    "managerConfig",
    "metricsService",
    "kubernetesClusterDomain",
];

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn chart() -> PathBuf {
    repo().join(CHART)
}

fn required() -> bool {
    std::env::var_os("REQUIRE_HELM").is_some()
}

/// Runs helm with its own empty home (no repositories, no cluster).
fn helm(helm: &Path, args: &[&str]) -> std::process::Output {
    let home = tempfile::tempdir().unwrap();
    support::helm::helm_with(helm, &home.path().join("no-kubeconfig"), args)
}

/// `helm template` of the chart in `namespace`: every object, in order.
fn template_in(helm_bin: &Path, namespace: &str, args: &[&str]) -> Vec<Value> {
    let mut all = vec!["template", RELEASE, CHART, "--namespace", namespace];
    all.extend_from_slice(args);
    let out = helm(helm_bin, &all);
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert!(
        out.status.success(),
        "helm {all:?} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let docs: Vec<Value> = serde_saphyr::from_multiple(&stdout)
        .unwrap_or_else(|e| panic!("helm {all:?} printed no YAML: {e}\n{stdout}"));
    docs.into_iter().filter(|d| !d.is_null()).collect()
}

fn template(helm_bin: &Path, args: &[&str]) -> Vec<Value> {
    template_in(helm_bin, NAMESPACE, args)
}

/// helm's error for values it must refuse.
fn template_error(helm_bin: &Path, args: &[&str]) -> String {
    let mut all = vec!["template", RELEASE, CHART, "--namespace", NAMESPACE];
    all.extend_from_slice(args);
    let out = helm(helm_bin, &all);
    assert!(!out.status.success(), "helm {all:?} should fail");
    String::from_utf8(out.stderr).unwrap()
}

/// The release notes, as `helm install` prints them (client-side dry run).
fn notes(helm_bin: &Path, args: &[&str]) -> String {
    let mut all = vec![
        "install",
        RELEASE,
        CHART,
        "--namespace",
        NAMESPACE,
        "--dry-run=client",
    ];
    all.extend_from_slice(args);
    let out = helm(helm_bin, &all);
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert!(
        out.status.success(),
        "helm {all:?}:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let at = stdout.find("\nNOTES:\n").expect("helm prints the notes");
    stdout[at + 8..].to_owned()
}

fn kind(doc: &Value) -> &str {
    doc["kind"].as_str().unwrap_or("")
}

fn name(doc: &Value) -> &str {
    doc["metadata"]["name"].as_str().unwrap_or("")
}

fn find<'a>(docs: &'a [Value], kind_: &str, name_: &str) -> Option<&'a Value> {
    docs.iter().find(|d| kind(d) == kind_ && name(d) == name_)
}

fn the<'a>(docs: &'a [Value], kind_: &str, name_: &str) -> &'a Value {
    find(docs, kind_, name_).unwrap_or_else(|| panic!("no {kind_} {name_} in the rendering"))
}

/// Every document of a YAML file of the repository.
fn file_docs(path: &str) -> Vec<Value> {
    let text = std::fs::read_to_string(repo().join(path)).unwrap();
    let docs: Vec<Value> = serde_saphyr::from_multiple(&text).unwrap();
    docs.into_iter().filter(|d| !d.is_null()).collect()
}

/// `doc` without the labels Helm adds; metadata.labels goes when only those
/// were there.
fn without_helm_labels(doc: &Value) -> Value {
    let mut doc = doc.clone();
    let metadata = doc["metadata"].as_object_mut().unwrap();
    if let Some(labels) = metadata.get_mut("labels").and_then(Value::as_object_mut) {
        for label in HELM_LABELS {
            labels.remove(label);
        }
        if labels.is_empty() {
            metadata.remove("labels");
        }
    }
    doc
}

/// Parses `doc` as `T` and requires that writing it back gives the same JSON,
/// as tests/deploy_manifests.rs does: nothing k8s-openapi does not know.
fn typed<T: DeserializeOwned + Serialize>(doc: &Value) -> T {
    let object: T = serde_json::from_value(doc.clone())
        .unwrap_or_else(|e| panic!("{} {}: {e}", kind(doc), name(doc)));
    assert_eq!(
        &serde_json::to_value(&object).unwrap(),
        doc,
        "{} {} does not round-trip through k8s-openapi (unknown or misplaced field?)",
        kind(doc),
        name(doc)
    );
    object
}

fn container_images(pod: &Value) -> Vec<String> {
    ["initContainers", "containers"]
        .iter()
        .flat_map(|c| pod[c].as_array().cloned().unwrap_or_default())
        .map(|c| c["image"].as_str().unwrap().to_owned())
        .collect()
}

fn pod_spec(doc: &Value) -> &Value {
    &doc["spec"]["template"]["spec"]
}

/// kubernetes-validate, or None after saying why it is not run.
fn kubernetes_validate() -> Option<PathBuf> {
    let found = std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
        .map(|dir| dir.join("kubernetes-validate"))
        .find(|p| p.is_file());
    if found.is_none() {
        assert!(
            !required(),
            "REQUIRE_HELM is set but kubernetes-validate is not on PATH \
             (pip install kubernetes-validate==1.37.0)"
        );
        println!("kubernetes-validate not found: the renderings were not validated by it");
    }
    found
}

/// The checks every rendering must pass: each object of a known kind
/// round-trips through k8s-openapi; built-in kinds pass kubernetes-validate
/// --strict for Kubernetes 1.34; each DeviceConfig passes `gpu-operator
/// validate`. `what` names the rendering in failures.
fn check_rendering(what: &str, docs: &[Value]) {
    let dir = tempfile::tempdir().unwrap();
    let mut builtin = String::new();
    let mut device_configs = String::new();
    for doc in docs {
        match kind(doc) {
            "Namespace" => drop(typed::<k8s_openapi::api::core::v1::Namespace>(doc)),
            "ServiceAccount" => drop(typed::<ServiceAccount>(doc)),
            "ClusterRole" => drop(typed::<ClusterRole>(doc)),
            "ClusterRoleBinding" => drop(typed::<ClusterRoleBinding>(doc)),
            "Role" => drop(typed::<Role>(doc)),
            "RoleBinding" => drop(typed::<RoleBinding>(doc)),
            "DaemonSet" => drop(typed::<DaemonSet>(doc)),
            "Job" => drop(typed::<Job>(doc)),
            "ConfigMap" => drop(typed::<ConfigMap>(doc)),
            "Lease" => drop(typed::<Lease>(doc)),
            "NetworkPolicy" => drop(typed::<NetworkPolicy>(doc)),
            "ValidatingAdmissionPolicy" => drop(typed::<ValidatingAdmissionPolicy>(doc)),
            "ValidatingAdmissionPolicyBinding" => {
                drop(typed::<ValidatingAdmissionPolicyBinding>(doc))
            }
            "DeviceClass" => drop(typed::<DeviceClass>(doc)),
            // Byte-identical to deploy/crd/ (the_charts_copies_are_the_deploy_files);
            // its schema's enums hold nulls, which k8s-openapi does not write back.
            "CustomResourceDefinition" => {
                serde_json::from_value::<CustomResourceDefinition>(doc.clone())
                    .unwrap_or_else(|e| panic!("{what}: CRD {}: {e}", name(doc)));
            }
            // Custom resources: kubernetes-validate has no schema for them.
            "DeviceConfig" => {
                device_configs.push_str("---\n");
                device_configs.push_str(&serde_json::to_string(doc).unwrap());
                device_configs.push('\n');
                continue;
            }
            "NodeFeatureRule" => {
                assert_eq!(doc["apiVersion"], "nfd.k8s-sigs.io/v1alpha1");
                continue;
            }
            other => panic!("{what}: kind {other} has no check here; add one"),
        }
        builtin.push_str("---\n");
        builtin.push_str(&serde_json::to_string(doc).unwrap());
        builtin.push('\n');
    }
    if let Some(validate) = kubernetes_validate() {
        let path = dir.path().join("builtin.yaml");
        std::fs::write(&path, &builtin).unwrap();
        let out = Command::new(validate)
            .args([
                "--strict",
                "--quiet",
                "--kubernetes-version",
                KUBERNETES_VERSION,
            ])
            .arg(&path)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{what}: kubernetes-validate --strict:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    if !device_configs.is_empty() {
        let path = dir.path().join("deviceconfigs.yaml");
        std::fs::write(&path, &device_configs).unwrap();
        let out = Command::new(env!("CARGO_BIN_EXE_gpu-operator"))
            .arg("validate")
            .arg(&path)
            .env("NO_COLOR", "1")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{what}: gpu-operator validate:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// The values files of ci/, by file name.
fn ci_values() -> Vec<String> {
    let mut files: Vec<String> = std::fs::read_dir(chart().join("ci"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|f| f.ends_with("-values.yaml"))
        .collect();
    files.sort();
    files
}

// ---------------------------------------------------------------------------
// No drift from deploy/

#[test]
fn the_charts_copies_are_the_deploy_files() {
    let mut stale = Vec::new();
    for (copy, source) in COPIES {
        let copied = std::fs::read(chart().join(copy))
            .unwrap_or_else(|e| panic!("{CHART}/{copy}: {e}; run deploy/helm/sync-files"));
        let original = std::fs::read(repo().join(source)).unwrap();
        if copied != original {
            stale.push(format!("{CHART}/{copy} differs from {source}"));
        }
    }
    assert!(
        stale.is_empty(),
        "{}\ndeploy/ is the source: run deploy/helm/sync-files",
        stale.join("\n")
    );
    // Nothing else in files/ and crds/ that no test compares.
    for dir in ["files", "crds"] {
        for entry in std::fs::read_dir(chart().join(dir)).unwrap() {
            let file = format!("{dir}/{}", entry.unwrap().file_name().to_string_lossy());
            assert!(
                COPIES.iter().any(|(copy, _)| *copy == file),
                "{CHART}/{file} is not a copy of a deploy/ file"
            );
        }
    }
    // The sync script copies exactly these.
    let script = std::fs::read_to_string(repo().join("deploy/helm/sync-files")).unwrap();
    for (_, source) in COPIES {
        assert!(script.contains(source), "deploy/helm/sync-files: {source}");
    }
}

#[test]
fn the_default_device_config_spec_is_deploys() {
    let values: Value =
        serde_saphyr::from_str(&std::fs::read_to_string(chart().join("values.yaml")).unwrap())
            .unwrap();
    let deployed = file_docs("deploy/30-deviceconfig.yaml");
    assert_eq!(
        values["deviceConfig"]["spec"], deployed[0]["spec"],
        "values.yaml deviceConfig.spec must be the spec of deploy/30-deviceconfig.yaml"
    );
}

#[test]
fn default_rendering_is_what_deploy_applies() {
    let Some(helm_bin) = helm_present("default_rendering_is_what_deploy_applies") else {
        return;
    };
    let rendered = template(&helm_bin, &[]);
    let mut expected: Vec<(String, Value)> = Vec::new();
    for file in [
        "deploy/10-rbac.yaml",
        "deploy/15-admission-policy.yaml",
        "deploy/20-daemonset.yaml",
        "deploy/25-networkpolicy.yaml",
        "deploy/27-default-dcm-config.yaml",
        "deploy/optional/node-detection.yaml",
    ] {
        expected.extend(file_docs(file).into_iter().map(|d| (file.to_owned(), d)));
    }
    let mut matched = BTreeSet::new();
    for (file, doc) in &expected {
        let got = the(&rendered, kind(doc), name(doc));
        // Helm's labels are added to each object, nothing else.
        for label in HELM_LABELS {
            assert!(
                got["metadata"]["labels"].get(label).is_some(),
                "{} {}: no {label}",
                kind(doc),
                name(doc)
            );
        }
        assert_eq!(
            &without_helm_labels(got),
            doc,
            "{} {} rendered by the chart differs from {file}",
            kind(doc),
            name(doc)
        );
        matched.insert((kind(doc).to_owned(), name(doc).to_owned()));
    }
    // The DeviceConfig: deploy/30-deviceconfig.yaml, which Helm keeps when it
    // leaves the manifest (the pre-delete hook deletes it).
    let deployed = &file_docs("deploy/30-deviceconfig.yaml")[0];
    let mut got = without_helm_labels(the(&rendered, "DeviceConfig", "default"));
    assert_eq!(
        got["metadata"]["annotations"],
        json!({"helm.sh/resource-policy": "keep"})
    );
    got["metadata"]
        .as_object_mut()
        .unwrap()
        .remove("annotations");
    assert_eq!(&got, deployed, "the default DeviceConfig");
    matched.insert(("DeviceConfig".into(), "default".into()));
    // And the hooks; nothing else (no Namespace: `helm install
    // --create-namespace` makes it).
    for (k, n) in HOOK_OBJECTS {
        the(&rendered, k, n);
        matched.insert((k.into(), n.into()));
    }
    let all: BTreeSet<(String, String)> = rendered
        .iter()
        .map(|d| (kind(d).to_owned(), name(d).to_owned()))
        .collect();
    assert_eq!(all, matched, "objects rendered by default");
    assert_eq!(all.len(), rendered.len(), "no object rendered twice");
}

#[test]
fn another_namespace_moves_every_namespaced_object_and_the_policies_with_it() {
    let Some(helm_bin) = helm_present("another_namespace_moves_every_namespaced_object") else {
        return;
    };
    let rendered = template_in(&helm_bin, "gpu-system", &[]);
    let text = serde_json::to_string(&rendered).unwrap();
    assert!(!text.contains(NAMESPACE), "kube-amd-gpu left in:\n{text}");
    for doc in &rendered {
        if let Some(ns) = doc["metadata"]["namespace"].as_str() {
            // Events about Nodes go to "default" (deploy/10-rbac.yaml).
            assert!(
                ns == "gpu-system" || name(doc) == "gpu-operator-node-events",
                "{} {} in {ns}",
                kind(doc),
                name(doc)
            );
        }
    }
    let leader = the(
        &rendered,
        "ValidatingAdmissionPolicy",
        "gpu-operator-leader-only",
    );
    assert!(
        leader["spec"]["matchConditions"][0]["expression"]
            .as_str()
            .unwrap()
            .contains("'system:serviceaccount:gpu-system:gpu-operator'")
    );
    let detect = the(
        &rendered,
        "ValidatingAdmissionPolicy",
        "gpu-operator-detect-own-node-labels",
    );
    assert!(
        detect["spec"]["matchConditions"][0]["expression"]
            .as_str()
            .unwrap()
            .contains("'system:serviceaccount:gpu-system:gpu-operator-detect'")
    );
    let binding = the(
        &rendered,
        "ValidatingAdmissionPolicyBinding",
        "gpu-operator-leader-only",
    );
    assert_eq!(binding["spec"]["paramRef"]["namespace"], "gpu-system");
    let uninstall = the(&rendered, "Job", "gpu-operator-uninstall");
    assert_eq!(
        pod_spec(uninstall)["containers"][0]["args"],
        json!([
            "uninstall",
            "--namespace",
            "gpu-system",
            "--all-namespaces",
            "--timeout",
            "300s"
        ])
    );
}

#[test]
fn watch_namespace_follows_device_configs_there_only() {
    let Some(helm_bin) = helm_present("watch_namespace_follows_device_configs_there_only") else {
        return;
    };
    // The default: every namespace, as deploy/ binds it.
    let rendered = template(&helm_bin, &[]);
    let binding = the(
        &rendered,
        "ClusterRoleBinding",
        "gpu-operator-deviceconfigs",
    );
    assert_eq!(binding["roleRef"]["name"], "gpu-operator-deviceconfigs");
    let agent = &pod_spec(the(&rendered, "DaemonSet", "gpu-operator"))["containers"][0];
    assert!(
        agent["env"]
            .as_array()
            .unwrap()
            .iter()
            .all(|e| e["name"] != "WATCH_NAMESPACE"),
        "{agent}"
    );
    // One namespace: the agents are told, and the rights that follow
    // DeviceConfigs are bound there alone; the hooks read and delete
    // DeviceConfigs there only.
    let rendered = template(&helm_bin, &["--set=watchNamespace=team-a"]);
    assert!(
        find(
            &rendered,
            "ClusterRoleBinding",
            "gpu-operator-deviceconfigs"
        )
        .is_none()
    );
    let binding = the(&rendered, "RoleBinding", "gpu-operator-deviceconfigs");
    assert_eq!(binding["metadata"]["namespace"], "team-a");
    assert_eq!(
        binding["roleRef"],
        json!({"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
               "name": "gpu-operator-deviceconfigs"})
    );
    assert_eq!(
        binding["subjects"],
        json!([{"kind": "ServiceAccount", "name": "gpu-operator", "namespace": NAMESPACE}])
    );
    let agent = &pod_spec(the(&rendered, "DaemonSet", "gpu-operator"))["containers"][0];
    assert!(
        agent["env"]
            .as_array()
            .unwrap()
            .contains(&json!({"name": "WATCH_NAMESPACE", "value": "team-a"})),
        "{agent}"
    );
    for (hook, args) in [
        (
            "gpu-operator-upgrade-crd",
            json!([
                "crd",
                "--apply",
                "--refuse-while-upgrading",
                "--namespace",
                "team-a"
            ]),
        ),
        (
            "gpu-operator-uninstall",
            json!(["uninstall", "--namespace", "team-a", "--timeout", "300s"]),
        ),
    ] {
        assert_eq!(
            pod_spec(the(&rendered, "Job", hook))["containers"][0]["args"],
            args
        );
        let role = the(&rendered, "Role", hook);
        assert_eq!(role["metadata"]["namespace"], "team-a");
        assert_eq!(role["rules"][0]["resources"], json!(["deviceconfigs"]));
        let binding = the(&rendered, "RoleBinding", hook);
        assert_eq!(binding["metadata"]["namespace"], "team-a");
        assert_eq!(
            binding["subjects"],
            json!([{"kind": "ServiceAccount", "name": hook, "namespace": NAMESPACE}])
        );
        // No right on DeviceConfigs elsewhere.
        let cluster_rules = &the(&rendered, "ClusterRole", hook)["rules"];
        assert!(
            cluster_rules
                .as_array()
                .unwrap()
                .iter()
                .all(|r| r["apiGroups"] != json!(["amd.com"])),
            "{hook}: {cluster_rules}"
        );
    }
    // The DeviceConfig the chart installs is where it is followed.
    assert_eq!(
        the(&rendered, "DeviceConfig", "default")["metadata"]["namespace"],
        "team-a"
    );
    let notes = notes(&helm_bin, &["--set=watchNamespace=team-a"]);
    assert!(
        notes.contains("follow DeviceConfigs in namespace team-a only"),
        "{notes}"
    );
    assert!(!notes.contains("do nothing here"), "{notes}");
    check_rendering("watchNamespace=team-a", &rendered);
    // Not a namespace name: the schema says so.
    let error = template_error(&helm_bin, &["--set=watchNamespace=Team_A"]);
    assert!(error.contains("watchNamespace"), "{error}");
}

// ---------------------------------------------------------------------------
// Every rendering is valid

#[test]
fn helm_lint_is_clean_with_every_values_file() {
    let Some(helm_bin) = helm_present("helm_lint_is_clean_with_every_values_file") else {
        return;
    };
    let mut runs = vec![vec!["lint", "--strict", CHART]];
    let files: Vec<String> = ci_values()
        .into_iter()
        .map(|f| format!("{CHART}/ci/{f}"))
        .collect();
    for file in &files {
        runs.push(vec!["lint", "--strict", CHART, "-f", file]);
    }
    for args in runs {
        let out = helm(&helm_bin, &args);
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "helm {args:?}:\n{stdout}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            !stdout.contains("[WARNING]") && !stdout.contains("[ERROR]"),
            "helm {args:?}:\n{stdout}"
        );
    }
}

#[test]
fn every_rendering_is_valid() {
    let Some(helm_bin) = helm_present("every_rendering_is_valid") else {
        return;
    };
    let mut cases: Vec<(String, Vec<String>)> = vec![("default values".into(), vec![])];
    for file in ci_values() {
        cases.push((
            file.clone(),
            vec!["-f".into(), format!("{CHART}/ci/{file}")],
        ));
    }
    // Every optional object at once, and every value that changes a pod.
    cases.push((
        "everything on".into(),
        [
            "--set=draDriver.deviceClass.create=true",
            "--set=defaultDCMConfigMap.install=true",
            "--set-json=defaultDCMConfigMap.data.config\\.json=\"{}\"",
            "--set=node-feature-discovery.enabled=true",
            "--set=global.imagePullSecrets[0].name=pull",
            "--set=global.proxy.env.HTTPS_PROXY=http://proxy:3128",
            "--set=controllerManager.manager.imagePullSecrets=more",
            "--set=controllerManager.manager.extraArgs[0]=--check-secret-references",
            "--set=controllerManager.manager.nodeSelector.pool=gpu",
            "--set=controllerManager.manager.resources.limits.memory=256Mi",
            "--set=metricsExporter.serviceAccount.annotations.a=b",
        ]
        .map(String::from)
        .to_vec(),
    ));
    for (what, args) in &cases {
        let mut all: Vec<&str> = vec!["--include-crds"];
        all.extend(args.iter().map(String::as_str));
        let rendered = template(&helm_bin, &all);
        check_rendering(what, &rendered);
        // Every pod runs our image, from no registry but ours.
        let agents = the(&rendered, "DaemonSet", "gpu-operator");
        let image = container_images(pod_spec(agents))[0].clone();
        for doc in &rendered {
            if matches!(kind(doc), "DaemonSet" | "Job") {
                for other in container_images(pod_spec(doc)) {
                    assert_eq!(other, image, "{what}: {} {}", kind(doc), name(doc));
                }
            }
        }
        // One DeviceConfig, in the release namespace.
        let configs: Vec<&Value> = rendered
            .iter()
            .filter(|d| kind(d) == "DeviceConfig")
            .collect();
        assert_eq!(configs.len(), 1, "{what}");
        assert_eq!(configs[0]["metadata"]["namespace"], NAMESPACE, "{what}");
    }
}

/// The reference e2e cases (ci/*-values.yaml but AMD's defaults) reach the
/// DeviceConfig as written: every section the case sets is in the spec with
/// the case's fields (empty placeholders left out).
#[test]
fn the_reference_e2e_cases_reach_the_device_config() {
    let Some(helm_bin) = helm_present("the_reference_e2e_cases_reach_the_device_config") else {
        return;
    };
    for file in ci_values() {
        if file == "reference-default-values.yaml" {
            continue;
        }
        let path = format!("{CHART}/ci/{file}");
        let values: Value =
            serde_saphyr::from_str(&std::fs::read_to_string(repo().join(&path)).unwrap()).unwrap();
        let rendered = template(&helm_bin, &["-f", &path]);
        let spec = &the(&rendered, "DeviceConfig", "default")["spec"];
        for (section, fields) in values["deviceConfig"]["spec"].as_object().unwrap() {
            match fields {
                Value::Object(fields) => {
                    for (field, value) in fields {
                        assert_eq!(
                            &spec[section][field], value,
                            "{file}: spec.{section}.{field}"
                        );
                    }
                }
                value => assert_eq!(&spec[section], value, "{file}: spec.{section}"),
            }
        }
    }
}

// ---------------------------------------------------------------------------
// AMD's values

#[test]
fn amds_default_values_install_unchanged_and_the_notes_name_what_is_ignored() {
    let Some(helm_bin) = helm_present("amds_default_values_install_unchanged") else {
        return;
    };
    let file = format!("{CHART}/ci/reference-default-values.yaml");
    let values: Value =
        serde_saphyr::from_str(&std::fs::read_to_string(repo().join(&file)).unwrap()).unwrap();
    assert_eq!(
        values.as_object().unwrap().len(),
        21,
        "AMD's chart has 21 top-level keys"
    );
    let rendered = template(&helm_bin, &["-f", &file]);
    // AMD's controller image is not ours: the agents keep theirs.
    let agents = the(&rendered, "DaemonSet", "gpu-operator");
    assert_eq!(
        container_images(pod_spec(agents)),
        vec![format!("gpu-operator:{}", env!("CARGO_PKG_VERSION"))]
    );
    // Its controller's placement (control-plane affinity) is not the agents':
    // they still require a GPU node, and still tolerate amd.com/gpu.
    let deployed = &file_docs("deploy/20-daemonset.yaml")[0];
    assert_eq!(pod_spec(agents)["affinity"], pod_spec(deployed)["affinity"]);
    let tolerations = pod_spec(agents)["tolerations"].as_array().unwrap();
    assert_eq!(
        tolerations[0],
        json!({"key": "amd.com/gpu", "operator": "Exists"})
    );
    assert_eq!(
        tolerations[1]["key"], "amd-dcm",
        "the reference's partition taint, which the agent must outlast"
    );
    assert_eq!(tolerations.len(), 4, "and the two of the values file");
    // NFD is said to run there, but `helm template` has no cluster that
    // serves its kind: node detection, and no rule that would fail the
    // install.
    assert!(find(&rendered, "NodeFeatureRule", "amd-gpu-label-nfd-rule").is_none());
    assert!(find(&rendered, "DaemonSet", "gpu-operator-detect").is_some());
    // Its partition profiles are installed where the agents read them.
    let dcm = the(&rendered, "ConfigMap", "default-dcm-config");
    let profiles =
        gpu_operator::partition::ProfileSet::parse(dcm["data"]["config.json"].as_str().unwrap())
            .unwrap();
    assert!(profiles.profiles.contains_key("cpx_nps4_all"));

    let notes = notes(&helm_bin, &["-f", &file]);
    for key in IGNORED_KEYS {
        assert!(
            notes.contains(&format!("  - {key} is ignored: ")),
            "the notes do not name {key}:\n{notes}"
        );
    }
    for line in [
        "controllerManager.manager.image (docker.io/rocm/amd-gpu-operator) is AMD's controller image",
        "controllerManager.manager.resources.limits.cpu (1000m) throttles the agents",
        "controllerManager.affinity is ignored",
        "controllerManager.nodeSelector is ignored",
        "controllerManager.replicas is ignored",
        "controllerManager.env is ignored",
        "controllerManager.manager.args is ignored",
        "controllerManager.manager.containerSecurityContext is ignored",
        "node-feature-discovery.worker is ignored",
    ] {
        assert!(notes.contains(line), "the notes lack {line:?}:\n{notes}");
    }
    // The default values set none of them.
    let quiet = notes_of_defaults(&helm_bin);
    assert!(!quiet.contains("do nothing here"), "{quiet}");
    assert!(
        quiet.contains(&format!(
            "kubectl -n {NAMESPACE} get lease gpu-operator-leader"
        )),
        "{quiet}"
    );
    assert!(
        quiet.contains("kubectl get gpue -A"),
        "the checks of deploy/README.md: {quiet}"
    );
}

fn notes_of_defaults(helm_bin: &Path) -> String {
    notes(helm_bin, &[])
}

#[test]
fn the_values_schema_refuses_wrong_types_clearly() {
    let Some(helm_bin) = helm_present("the_values_schema_refuses_wrong_types_clearly") else {
        return;
    };
    for (set, message) in [
        (
            "--set=deviceConfig.spec.selector=3",
            "at '/deviceConfig/spec/selector': got number, want object",
        ),
        (
            "--set=global.imagePullSecrets=x",
            "at '/global/imagePullSecrets': got string, want array",
        ),
        (
            "--set-json=global.imagePullSecrets=[\"x\"]",
            "at '/global/imagePullSecrets/0': got string, want object",
        ),
        (
            "--set=upgradeCRD=yes",
            "at '/upgradeCRD': got string, want boolean",
        ),
        (
            "--set=controllerManager.manager.image.digest=latest",
            "at '/controllerManager/manager/image/digest'",
        ),
        (
            "--set=deviceConfig.spec.metricsExporter.port=70000",
            "at '/deviceConfig/spec/metricsExporter/port'",
        ),
        (
            "--set=node-feature-discovery.enabled=1",
            "at '/node-feature-discovery/enabled': got number, want boolean",
        ),
    ] {
        let err = template_error(&helm_bin, &[set]);
        assert!(
            err.contains("values don't meet the specifications of the schema")
                && err.contains(message),
            "{set}: {err}"
        );
    }
}

// ---------------------------------------------------------------------------
// What the values do

#[test]
fn nodes_are_found_by_nfd_or_by_node_detection() {
    let Some(helm_bin) = helm_present("nodes_are_found_by_nfd_or_by_node_detection") else {
        return;
    };
    let nfd_api = "--api-versions=nfd.k8s-sigs.io/v1alpha1/NodeFeatureRule";
    // (args, NodeFeatureRule rendered, node detection rendered). What the
    // cluster serves decides, not node-feature-discovery.enabled: this
    // chart installs no NFD, and a rule on a cluster without it fails the
    // install, while no detection there would leave the GPU nodes agentless.
    for (args, rule, detect) in [
        // No NFD: node detection, and no rule a cluster without NFD refuses.
        (vec![], false, true),
        (vec!["--set=nodeDetection.enabled=false"], false, false),
        // NFD said to run, but the cluster does not serve its kind (AMD's
        // values on a cluster without NFD): detection, no rule.
        (
            vec!["--set=node-feature-discovery.enabled=true"],
            false,
            true,
        ),
        // The cluster serves NodeFeatureRules: the rule, no second labeller.
        (vec![nfd_api], true, false),
        (
            vec![nfd_api, "--set=node-feature-discovery.enabled=true"],
            true,
            false,
        ),
        (
            vec![nfd_api, "--set=installdefaultNFDRule=false"],
            false,
            false,
        ),
    ] {
        let rendered = template(&helm_bin, &args);
        let got_rule = find(&rendered, "NodeFeatureRule", "amd-gpu-label-nfd-rule");
        assert_eq!(got_rule.is_some(), rule, "{args:?}: the NodeFeatureRule");
        let detection = [
            ("ServiceAccount", "gpu-operator-detect"),
            ("ClusterRole", "gpu-operator-detect"),
            ("ClusterRoleBinding", "gpu-operator-detect"),
            ("DaemonSet", "gpu-operator-detect"),
        ];
        for (k, n) in detection {
            assert_eq!(find(&rendered, k, n).is_some(), detect, "{args:?}: {k} {n}");
        }
        if let Some(rule) = got_rule {
            check_nfd_rule(rule);
        }
        if detect {
            check_node_detection(&rendered);
        }
    }
}

/// The rule labels what the agents select, by PCI vendor 1002 and device ID.
fn check_nfd_rule(rule: &Value) {
    let rules: BTreeMap<&str, &Value> = rule["spec"]["rules"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| (r["name"].as_str().unwrap(), r))
        .collect();
    for (rule_name, label, device) in [
        ("amd-gpu", "feature.node.kubernetes.io/amd-gpu", "74a1"), // MI300X
        ("amd-gpu", "feature.node.kubernetes.io/amd-gpu", "740f"), // MI210
        ("amd-vgpu", "feature.node.kubernetes.io/amd-vgpu", "74b5"), // MI300X VF
    ] {
        let r = rules[rule_name];
        assert_eq!(r["labels"], json!({label: "true"}));
        let expressions = &r["matchFeatures"][0]["matchExpressions"];
        assert_eq!(r["matchFeatures"][0]["feature"], "pci.device");
        assert_eq!(
            expressions["vendor"],
            json!({"op": "In", "value": ["1002"]})
        );
        assert!(
            expressions["device"]["value"]
                .as_array()
                .unwrap()
                .contains(&json!(device)),
            "{rule_name}: {device}"
        );
    }
    // No device ID is both a GPU and a virtual function.
    let ids = |n: &str| -> BTreeSet<String> {
        rules[n]["matchFeatures"][0]["matchExpressions"]["device"]["value"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap().to_owned())
            .collect()
    };
    assert!(ids("amd-gpu").is_disjoint(&ids("amd-vgpu")));
    // NFD's rule and `gpu-operator detect` label the same devices.
    let hex = |table: &[(u16, &str)]| -> BTreeSet<String> {
        table.iter().map(|(id, _)| format!("{id:04x}")).collect()
    };
    use gpu_operator::detect::{GPU_DEVICE_IDS, MODEL_LABELS, VF_DEVICE_IDS};
    assert_eq!(ids("amd-gpu"), hex(GPU_DEVICE_IDS));
    assert_eq!(ids("amd-vgpu"), hex(VF_DEVICE_IDS));
    for (id, label) in MODEL_LABELS {
        let rule = rules
            .values()
            .find(|r| r["labels"].get(*label).is_some())
            .unwrap_or_else(|| panic!("no rule sets {label}"));
        assert_eq!(
            rule["matchFeatures"][0]["matchExpressions"]["device"]["value"],
            json!([format!("{id:04x}")])
        );
    }
}

/// Node detection: every Linux node, unprivileged, its own ServiceAccount
/// with get and patch on Nodes, the labels the agents select.
fn check_node_detection(rendered: &[Value]) {
    let ds = the(rendered, "DaemonSet", "gpu-operator-detect");
    let pod = pod_spec(ds);
    assert_eq!(pod["serviceAccountName"], "gpu-operator-detect");
    assert!(pod.get("affinity").is_none(), "no GPU affinity: every node");
    assert_eq!(pod["nodeSelector"], json!({"kubernetes.io/os": "linux"}));
    assert_eq!(pod["tolerations"], json!([{"operator": "Exists"}]));
    assert!(pod.get("hostNetwork").is_none() && pod.get("hostPID").is_none());
    let container = &pod["containers"][0];
    assert_eq!(container["args"], json!(["detect"]));
    let env: BTreeMap<&str, &Value> = container["env"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| (e["name"].as_str().unwrap(), e))
        .collect();
    assert_eq!(
        env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"],
        "spec.nodeName"
    );
    assert_eq!(env["GPU_OPERATOR_HOST_ROOT"]["value"], "/host");
    assert_eq!(
        container["resources"],
        json!({"requests": {"cpu": "5m", "memory": "16Mi"}, "limits": {"memory": "32Mi"}})
    );
    let security = &container["securityContext"];
    assert_eq!(security["privileged"], false);
    assert_eq!(security["allowPrivilegeEscalation"], false);
    assert_eq!(security["readOnlyRootFilesystem"], true);
    assert_eq!(security["capabilities"], json!({"drop": ["ALL"]}));
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
    assert_eq!(
        container["volumeMounts"],
        json!([{"name": "host-sys", "mountPath": "/host/sys", "readOnly": true,
                "recursiveReadOnly": "IfPossible"}])
    );
    assert_eq!(
        pod["volumes"],
        json!([{"name": "host-sys", "hostPath": {"path": "/sys", "type": "Directory"}}])
    );
    let role = the(rendered, "ClusterRole", "gpu-operator-detect");
    assert_eq!(
        role["rules"],
        json!([{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "patch"]}])
    );
    let binding = the(rendered, "ClusterRoleBinding", "gpu-operator-detect");
    assert_eq!(binding["roleRef"]["name"], "gpu-operator-detect");
    assert_eq!(
        binding["subjects"],
        json!([{"kind": "ServiceAccount", "name": "gpu-operator-detect",
                "namespace": NAMESPACE}])
    );
    // Its pods are not agents: the metrics Service and NetworkPolicy select
    // app.kubernetes.io/name=gpu-operator.
    assert_eq!(
        ds["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/name"],
        "gpu-operator-detect"
    );
}

#[test]
fn the_hooks_run_the_operators_image_with_the_least_rbac() {
    let Some(helm_bin) = helm_present("the_hooks_run_the_operators_image_with_the_least_rbac")
    else {
        return;
    };
    let rendered = template(&helm_bin, &[]);
    let agents = the(&rendered, "DaemonSet", "gpu-operator");
    let image = container_images(pod_spec(agents));
    for (hook, when, args) in [
        (
            "gpu-operator-upgrade-crd",
            "pre-upgrade",
            json!([
                "crd",
                "--apply",
                "--refuse-while-upgrading",
                "--all-namespaces"
            ]),
        ),
        (
            "gpu-operator-uninstall",
            "pre-delete",
            json!([
                "uninstall",
                "--namespace",
                NAMESPACE,
                "--all-namespaces",
                "--timeout",
                "300s"
            ]),
        ),
    ] {
        for doc in rendered.iter().filter(|d| name(d) == hook) {
            let annotations = &doc["metadata"]["annotations"];
            assert_eq!(annotations["helm.sh/hook"], when, "{} {hook}", kind(doc));
            assert_eq!(
                annotations["helm.sh/hook-delete-policy"],
                "before-hook-creation,hook-succeeded",
                "{} {hook}",
                kind(doc)
            );
        }
        let job = the(&rendered, "Job", hook);
        // The Job after its ServiceAccount and RBAC.
        let weight = |k: &str| {
            the(&rendered, k, hook)["metadata"]["annotations"]["helm.sh/hook-weight"]
                .as_str()
                .unwrap()
                .parse::<i32>()
                .unwrap()
        };
        assert!(weight("Job") > weight("ServiceAccount"));
        assert!(weight("Job") > weight("ClusterRole"));
        assert!(weight("Job") > weight("ClusterRoleBinding"));
        assert_eq!(job["spec"]["backoffLimit"], 0);
        let pod = pod_spec(job);
        assert_eq!(pod["serviceAccountName"], hook);
        assert_eq!(pod["restartPolicy"], "Never");
        assert_eq!(container_images(pod), image, "the operator's own image");
        assert_eq!(pod["containers"][0]["args"], args);
        assert!(pod["containers"][0].get("command").is_none());
        assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
        let binding = the(&rendered, "ClusterRoleBinding", hook);
        assert_eq!(binding["roleRef"]["name"], hook);
        assert_eq!(
            binding["subjects"],
            json!([{"kind": "ServiceAccount", "name": hook, "namespace": NAMESPACE}])
        );
    }
    let crd_rules = &the(&rendered, "ClusterRole", "gpu-operator-upgrade-crd")["rules"];
    assert_eq!(
        crd_rules,
        &json!([
            {"apiGroups": ["apiextensions.k8s.io"], "resources": ["customresourcedefinitions"],
             "verbs": ["create"]},
            {"apiGroups": ["apiextensions.k8s.io"], "resources": ["customresourcedefinitions"],
             "resourceNames": ["deviceconfigs.amd.com", "remediationworkflowstatuses.amd.com"],
             "verbs": ["get", "patch"]},
            // The DeviceConfigs of every namespace, which the agents follow.
            {"apiGroups": ["amd.com"], "resources": ["deviceconfigs"], "verbs": ["get", "list"]}
        ])
    );
    // The two CRDs the hook applies are the chart's.
    let names: Vec<String> = [
        "crds/deviceconfigs.amd.com.yaml",
        "crds/remediationworkflowstatuses.amd.com.yaml",
    ]
    .iter()
    .map(|f| name(&file_docs(&format!("{CHART}/{f}"))[0]).to_owned())
    .collect();
    assert_eq!(json!(names), crd_rules[1]["resourceNames"]);
    let upgrade_binding = the(&rendered, "ClusterRoleBinding", "gpu-operator-upgrade-crd");
    assert_eq!(
        upgrade_binding["roleRef"]["name"],
        "gpu-operator-upgrade-crd"
    );
    // Every DeviceConfig goes first (every namespace's), then the labels
    // `detect` set: Nodes listed and patched, no more.
    assert_eq!(
        the(&rendered, "ClusterRole", "gpu-operator-uninstall")["rules"],
        json!([{"apiGroups": [""], "resources": ["nodes"], "verbs": ["list", "patch"]},
               {"apiGroups": ["amd.com"], "resources": ["deviceconfigs"],
                "verbs": ["list", "watch", "get", "delete"]}])
    );
    assert_eq!(
        the(&rendered, "ClusterRoleBinding", "gpu-operator-uninstall")["subjects"],
        json!([{"kind": "ServiceAccount", "name": "gpu-operator-uninstall", "namespace": NAMESPACE}])
    );
    // upgradeCRD=false: no pre-upgrade hook at all.
    let rendered = template(&helm_bin, &["--set=upgradeCRD=false"]);
    assert!(
        rendered
            .iter()
            .all(|d| name(d) != "gpu-operator-upgrade-crd")
    );
    assert!(find(&rendered, "Job", "gpu-operator-uninstall").is_some());
}

#[test]
fn the_default_device_config_follows_install_and_upgrade() {
    let Some(helm_bin) = helm_present("the_default_device_config_follows_install_and_upgrade")
    else {
        return;
    };
    for (args, rendered) in [
        (vec![], true),
        (vec!["--set=crds.defaultCR.install=false"], false),
        (vec!["--is-upgrade"], false),
        (
            vec!["--is-upgrade", "--set=crds.defaultCR.upgrade=true"],
            true,
        ),
    ] {
        let docs = template(&helm_bin, &args);
        assert_eq!(
            find(&docs, "DeviceConfig", "default").is_some(),
            rendered,
            "{args:?}"
        );
    }
    // Global pull secrets go first into commonConfig, as in AMD's chart.
    let docs = template(
        &helm_bin,
        &[
            "--set=global.imagePullSecrets[0].name=global",
            "--set=deviceConfig.spec.commonConfig.imageRegistrySecrets[0].name=own",
        ],
    );
    assert_eq!(
        the(&docs, "DeviceConfig", "default")["spec"]["commonConfig"]["imageRegistrySecrets"],
        json!([{"name": "global"}, {"name": "own"}])
    );
}

#[test]
fn controller_manager_values_reach_the_agent_daemonset() {
    let Some(helm_bin) = helm_present("controller_manager_values_reach_the_agent_daemonset") else {
        return;
    };
    let digest = format!("sha256:{}", "ab".repeat(32));
    let digest_arg = format!("--set=controllerManager.manager.image.digest={digest}");
    let rendered = template(
        &helm_bin,
        &[
            "--set=controllerManager.manager.image.repository=registry.example.com/gpu-operator",
            "--set=controllerManager.manager.image.tag=0.1.0",
            &digest_arg,
            "--set=controllerManager.manager.imagePullPolicy=Always",
            "--set=controllerManager.manager.imagePullSecrets=extra",
            "--set=global.imagePullSecrets[0].name=global",
            "--set=controllerManager.manager.resources.limits.memory=256Mi",
            "--set=controllerManager.manager.tolerations[0].key=dedicated",
            "--set=controllerManager.manager.tolerations[0].operator=Exists",
            "--set=controllerManager.manager.nodeSelector.pool=gpu",
            "--set=controllerManager.manager.affinity.podAntiAffinity.requiredDuringSchedulingIgnoredDuringExecution[0].topologyKey=kubernetes.io/hostname",
            "--set=controllerManager.manager.extraArgs[0]=--check-secret-references",
            "--set=global.proxy.env.NO_PROXY=.svc",
            "--set=global.proxy.env.HTTPS_PROXY=http://proxy:3128",
        ],
    );
    let deployed = &file_docs("deploy/20-daemonset.yaml")[0];
    let agents = the(&rendered, "DaemonSet", "gpu-operator");
    let pod = pod_spec(agents);
    let container = &pod["containers"][0];
    let image = format!("registry.example.com/gpu-operator:0.1.0@{digest}");
    assert_eq!(container["image"], image.as_str());
    assert_eq!(container["imagePullPolicy"], "Always");
    assert_eq!(
        pod["imagePullSecrets"],
        json!([{"name": "global"}, {"name": "extra"}])
    );
    // Merged over the DaemonSet's own.
    assert_eq!(
        container["resources"],
        json!({"requests": {"cpu": "50m", "memory": "32Mi"}, "limits": {"memory": "256Mi"}})
    );
    assert_eq!(
        pod["tolerations"],
        json!([{"key": "amd.com/gpu", "operator": "Exists"},
               {"key": "amd-dcm", "operator": "Equal", "value": "up", "effect": "NoExecute"},
               {"key": "dedicated", "operator": "Exists"}])
    );
    assert_eq!(pod["nodeSelector"], json!({"pool": "gpu"}));
    assert_eq!(
        pod["affinity"]["nodeAffinity"],
        pod_spec(deployed)["affinity"]["nodeAffinity"],
        "the GPU node affinity stays"
    );
    assert!(pod["affinity"]["podAntiAffinity"].is_object());
    assert_eq!(
        container["args"],
        json!(["agent", "--check-secret-references"])
    );
    let env = container["env"].as_array().unwrap();
    let deployed_env = pod_spec(deployed)["containers"][0]["env"]
        .as_array()
        .unwrap();
    assert_eq!(&env[..deployed_env.len()], &deployed_env[..]);
    assert_eq!(
        &env[deployed_env.len()..],
        &[
            json!({"name": "HTTPS_PROXY", "value": "http://proxy:3128"}),
            json!({"name": "NO_PROXY", "value": ".svc"})
        ]
    );
    // The same image and pull secrets for node detection and the hooks.
    for (k, n) in [
        ("DaemonSet", "gpu-operator-detect"),
        ("Job", "gpu-operator-upgrade-crd"),
        ("Job", "gpu-operator-uninstall"),
    ] {
        let pod = pod_spec(the(&rendered, k, n));
        assert_eq!(container_images(pod), vec![image.clone()], "{k} {n}");
        assert_eq!(
            pod["imagePullSecrets"],
            json!([{"name": "global"}, {"name": "extra"}]),
            "{k} {n}"
        );
    }
    // A nodeAffinity of the user's replaces the GPU requirement, as documented.
    let rendered = template(
        &helm_bin,
        &[
            "--set=controllerManager.manager.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchExpressions[0].key=gpu,controllerManager.manager.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchExpressions[0].operator=Exists",
        ],
    );
    let pod = pod_spec(the(&rendered, "DaemonSet", "gpu-operator"));
    assert_eq!(
        pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"],
        json!({"nodeSelectorTerms": [{"matchExpressions": [{"key": "gpu", "operator": "Exists"}]}]})
    );
}

#[test]
fn service_account_annotations_of_every_operand_go_to_the_one_service_account() {
    let Some(helm_bin) = helm_present("service_account_annotations_go_to_the_one_service_account")
    else {
        return;
    };
    let sections = [
        "controllerManager",
        "nodeLabeller",
        "metricsExporter",
        "testRunner",
        "configManager",
        "utilsContainer",
        "draDriver",
    ];
    let sets: Vec<String> = sections
        .iter()
        .map(|s| format!("--set={s}.serviceAccount.annotations.from-{s}=yes"))
        .collect();
    let mut args: Vec<&str> = sets.iter().map(String::as_str).collect();
    // The same annotation, with the same value, from two sections is fine.
    args.push("--set-string=nodeLabeller.serviceAccount.annotations.shared=1");
    args.push("--set-string=metricsExporter.serviceAccount.annotations.shared=1");
    let rendered = template(&helm_bin, &args);
    let account = the(&rendered, "ServiceAccount", "gpu-operator");
    let mut expected: BTreeMap<String, String> = sections
        .iter()
        .map(|s| (format!("from-{s}"), "yes".to_owned()))
        .collect();
    expected.insert("shared".into(), "1".into());
    assert_eq!(account["metadata"]["annotations"], json!(expected));
    // Ignored: KMM's.
    let rendered = template(
        &helm_bin,
        &["--set=kmmDevicePlugin.serviceAccount.annotations.kmm=yes"],
    );
    assert!(
        the(&rendered, "ServiceAccount", "gpu-operator")["metadata"]
            .get("annotations")
            .is_none()
    );
    // Two values for one annotation: refused, naming both.
    let err = template_error(
        &helm_bin,
        &[
            "--set=testRunner.serviceAccount.annotations.role=a",
            "--set=configManager.serviceAccount.annotations.role=b",
        ],
    );
    assert!(
        err.contains("ServiceAccount annotation role")
            && err.contains("testRunner.serviceAccount.annotations")
            && err.contains("configManager.serviceAccount.annotations"),
        "{err}"
    );
}

#[test]
fn the_device_class_is_the_one_the_leader_keeps() {
    let Some(helm_bin) = helm_present("the_device_class_is_the_one_the_leader_keeps") else {
        return;
    };
    let rendered = template(&helm_bin, &[]);
    assert!(find(&rendered, "DeviceClass", "gpu.amd.com").is_none());
    assert!(find(&rendered, "DeviceClass", "amd-gpu.gpu.amd.com").is_none());
    let rendered = template(&helm_bin, &["--set=draDriver.deviceClass.create=true"]);
    let label = gpu_operator::cluster::resources::DEVICE_CLASS_LABEL;
    for leaders in [
        gpu_operator::cluster::resources::device_class(),
        gpu_operator::cluster::resources::extended_resource_class(),
    ] {
        let name = leaders.metadata.name.clone().unwrap();
        let class: DeviceClass = typed(the(&rendered, "DeviceClass", &name));
        assert_eq!(class.spec, leaders.spec, "{name}");
        // Helm's, not the operator's: the leader leaves it alone (docs/dra.md).
        assert_ne!(
            class
                .metadata
                .labels
                .unwrap()
                .get(label.0)
                .map(String::as_str),
            Some(label.1)
        );
    }
    // Not on a cluster without resource.k8s.io/v1 (before 1.34): helm
    // template assumes every API of its own Kubernetes version, so only
    // the rendering's condition is checked here.
    let template_text =
        std::fs::read_to_string(chart().join("templates/deviceclass.yaml")).unwrap();
    assert!(template_text.contains(".Capabilities.APIVersions.Has \"resource.k8s.io/v1\""));
}
