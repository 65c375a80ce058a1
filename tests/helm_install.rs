//! `helm install`, `helm upgrade` and `helm uninstall` of the chart, with the
//! real helm, against the API emulator, with a real agent that leads and
//! the real node detection: what an AMD GPU Operator user runs.
//!
//! The emulator runs no controllers, so the test plays the ones the chart
//! relies on: the Job controller runs the hooks' Jobs (our image: the real
//! binary, with the Job's arguments; tests/support/jobs.rs), and the
//! DaemonSet controller starts `gpu-operator detect` on every node and the
//! agent on the nodes the agent DaemonSet's affinity selects. Everything
//! above that is the real code path.
//!
//! Skipped, saying so, without helm; REQUIRE_HELM=1 (.ci/run) makes that a
//! failure.

mod support;

use std::path::Path;
use std::process::{Child, Command};
use std::time::Duration;

use gpu_operator::host::HostRoot;
use kube_emulator::{Emulator, EmulatorConfig};
use serde_json::{Value, json};
use support::agent_config::LeaderConfigBuilder;
use support::cluster::ours_on;
use support::helm::{helm_present, helm_with};
use support::node_rig::NodeRig;
use support::wait;

const NAMESPACE: &str = "kube-amd-gpu";
const CHART: &str = "deploy/helm/gpu-operator";
/// A whole install, leader election and teardown included; generous for a
/// loaded machine.
const PATIENCE: Duration = Duration::from_secs(90);

/// A Node as a kubelet registers it: Ready, with its hostname label.
fn node(name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux"}},
        "status": {"conditions": [{"type": "Ready", "status": "True"}],
                   "nodeInfo": {"bootID": format!("boot-{name}"), "kernelVersion": "6.8.0-49-generic"}}})
}

/// Whether a nodeSelectorTerm list selects `labels` (In, NotIn, Exists,
/// DoesNotExist, as the scheduler reads them).
fn affinity_selects(terms: &Value, labels: &Value) -> bool {
    terms.as_array().into_iter().flatten().any(|term| {
        term["matchExpressions"]
            .as_array()
            .into_iter()
            .flatten()
            .all(|e| {
                let value = labels[e["key"].as_str().unwrap_or_default()].as_str();
                let values: Vec<&str> = e["values"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(Value::as_str)
                    .collect();
                match e["operator"].as_str() {
                    Some("In") => value.is_some_and(|v| values.contains(&v)),
                    Some("NotIn") => !value.is_some_and(|v| values.contains(&v)),
                    Some("Exists") => value.is_some(),
                    Some("DoesNotExist") => value.is_none(),
                    _ => false,
                }
            })
    })
}

/// The DaemonSet controller's part for node detection: `gpu-operator
/// detect` with the container's arguments, for `node` on `host`.
fn start_detect(emu: &Emulator, daemonset: &Value, node: &str, host: &Path) -> Child {
    let container = &daemonset["spec"]["template"]["spec"]["containers"][0];
    let args: Vec<String> = container["args"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|a| a.as_str().map(str::to_owned))
        .collect();
    Command::new(env!("CARGO_BIN_EXE_gpu-operator"))
        .args(&args)
        .env("NODE_NAME", node)
        .env("GPU_OPERATOR_HOST_ROOT", host)
        .env("KUBECONFIG", emu.kubeconfig_path())
        .env("RUST_LOG", "warn")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("detect starts")
}

/// The agent of `rig`'s node, as its pod runs it (DeviceConfigs of every
/// namespace, the builder's `namespace: None`), leading when it wins the
/// Lease.
fn start_agent(rig: &mut NodeRig, client: kube::Client) {
    let config = rig
        .agent_config()
        .rescan_interval(Duration::from_millis(300))
        .leader(Some(
            LeaderConfigBuilder::new(NAMESPACE, &rig.name, &rig.name)
                .fast_lease()
                .teardown_timeout(Duration::from_secs(20))
                .build(),
        ))
        .build();
    rig.start_agent_with(client, config);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn helm_install_upgrade_and_uninstall_leave_nothing_of_ours_on_any_node() {
    let Some(helm) = helm_present("helm_install_upgrade_and_uninstall") else {
        return;
    };
    let emu = Emulator::start(EmulatorConfig::default()).await.unwrap();
    let kubeconfig = emu.kubeconfig_path().to_path_buf();
    // A GPU node and a CPU node, nobody has labelled; the GPU node has a
    // kubelet, for the agent the chart's DaemonSet runs there.
    for name in ["gpu-0", "cpu-0"] {
        emu.create(node(name)).unwrap();
    }
    let mut gpu_node = NodeRig::builder("gpu-0")
        .profile("mi210", Some(2), None)
        .kubelet()
        .join(emu.client())
        .start()
        .await;
    let cpu_node = NodeRig::builder("cpu-0").join(emu.client()).start().await;
    let hosts: Vec<(String, HostRoot)> = [&gpu_node, &cpu_node]
        .map(|rig| (rig.name.clone(), rig.host.clone()))
        .to_vec();
    let jobs = support::jobs::run_jobs(emu.client(), NAMESPACE, kubeconfig.clone());
    let run_helm = |args: Vec<String>| {
        let (helm, kubeconfig) = (helm.clone(), kubeconfig.clone());
        tokio::task::spawn_blocking(move || {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            helm_with(&helm, &kubeconfig, &args)
        })
    };
    let said = |out: &std::process::Output| {
        format!(
            "exit {:?}\n{}\n{}",
            out.status.code(),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    };

    // 1. Install, with the chart's defaults.
    let out = run_helm(
        [
            "install",
            "gpu-operator",
            CHART,
            "-n",
            NAMESPACE,
            "--create-namespace",
        ]
        .map(str::to_owned)
        .to_vec(),
    )
    .await
    .unwrap();
    assert!(out.status.success(), "helm install: {}", said(&out));
    let notes = String::from_utf8_lossy(&out.stdout);
    assert!(notes.contains("gpu-operator-detect"), "{notes}");
    // The DaemonSet controller: detect on every node.
    let detect_ds = emu
        .get("apps/v1", "DaemonSet", NAMESPACE, "gpu-operator-detect")
        .expect("node detection is installed where no NFD runs");
    let mut detects: Vec<Child> = hosts
        .iter()
        .map(|(name, host)| start_detect(&emu, &detect_ds, name, host.root()))
        .collect();
    let labels =
        |name: &str| emu.get("v1", "Node", "", name).unwrap()["metadata"]["labels"].clone();
    wait::eventually_within(
        "the GPU node labelled",
        PATIENCE,
        || labels("gpu-0")["feature.node.kubernetes.io/amd-gpu"] == "true",
        || format!("{}", labels("gpu-0")),
    )
    .await;
    // The agent DaemonSet's affinity: the GPU node, not the CPU node.
    let agents_ds = emu
        .get("apps/v1", "DaemonSet", NAMESPACE, "gpu-operator")
        .unwrap();
    let terms = &agents_ds["spec"]["template"]["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        ["nodeSelectorTerms"];
    assert!(affinity_selects(terms, &labels("gpu-0")));
    assert!(
        !affinity_selects(terms, &labels("cpu-0")),
        "{}",
        labels("cpu-0")
    );
    // So the GPU node gets an agent, beside its kubelet.
    start_agent(&mut gpu_node, emu.client());
    let device_config = || emu.get("amd.com/v1alpha1", "DeviceConfig", NAMESPACE, "default");
    let ready = |dc: &Value| {
        dc["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|c| c["type"] == "Ready" && c["status"] == "True")
    };
    wait::eventually_within(
        "the default DeviceConfig ready on the GPU node",
        PATIENCE,
        || device_config().is_some_and(|dc| ready(&dc)),
        || format!("{:?}", device_config()),
    )
    .await;
    let agent_status = || {
        emu.get("v1", "Node", "", "gpu-0").unwrap()["metadata"]["annotations"]
            ["amd.com/gpu-agent-status"]
            .as_str()
            .map(str::to_owned)
            .unwrap_or_default()
    };
    assert!(
        agent_status().contains("kube-amd-gpu/default"),
        "{}",
        agent_status()
    );
    assert!(ours_on(&emu.get("v1", "Node", "", "cpu-0").unwrap()).is_empty());

    // 2. Upgrade with a changed DeviceConfig: the pre-upgrade hook applies
    //    the CRDs, and the agent follows the new spec.
    let out = run_helm(
        [
            "upgrade",
            "gpu-operator",
            CHART,
            "-n",
            NAMESPACE,
            "--set",
            "crds.defaultCR.upgrade=true",
            "--set",
            "deviceConfig.spec.testRunner.enable=true",
        ]
        .map(str::to_owned)
        .to_vec(),
    )
    .await
    .unwrap();
    assert!(out.status.success(), "helm upgrade: {}", said(&out));
    let ran = jobs.runs();
    assert!(
        ran.iter().any(|r| r.name == "gpu-operator-upgrade-crd"
            && r.args
                == [
                    "crd",
                    "--apply",
                    "--refuse-while-upgrading",
                    "--all-namespaces"
                ]
            && r.code == Some(0)),
        "{ran:?}"
    );
    wait::eventually_within(
        "the agent runs the test runner the upgrade enabled",
        PATIENCE,
        || agent_status().contains("testRunner"),
        agent_status,
    )
    .await;

    // 3. Uninstall: the pre-delete hook removes the DeviceConfigs, waits for
    //    the leader to clean the nodes, and removes detect's labels; then
    //    Helm deletes the rest.
    let out = run_helm(
        ["uninstall", "gpu-operator", "-n", NAMESPACE]
            .map(str::to_owned)
            .to_vec(),
    )
    .await
    .unwrap();
    assert!(out.status.success(), "helm uninstall: {}", said(&out));
    let ran = jobs.runs();
    assert!(
        ran.iter()
            .any(|r| r.name == "gpu-operator-uninstall" && r.code == Some(0)),
        "{ran:?}"
    );
    assert!(device_config().is_none());
    for kind in ["DaemonSet", "ServiceAccount"] {
        assert!(
            emu.get(
                if kind == "DaemonSet" { "apps/v1" } else { "v1" },
                kind,
                NAMESPACE,
                "gpu-operator"
            )
            .is_none(),
            "{kind} gpu-operator is gone"
        );
    }
    // The DaemonSets are gone: so are their pods.
    for child in &mut detects {
        let _ = child.kill();
        let _ = child.wait();
    }
    gpu_node.stop_agent().await;
    for (name, _) in &hosts {
        let node = emu.get("v1", "Node", "", name).unwrap();
        assert_eq!(ours_on(&node), Vec::<String>::new(), "{name}: {node:#}");
    }
}

/// AMD's own default values file installs unchanged on a cluster without
/// node-feature-discovery (it says NFD is enabled, since AMD's chart
/// installs it): node detection instead of a rule the cluster would refuse.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn amds_default_values_install_on_a_cluster_without_nfd() {
    let Some(helm) = helm_present("amds_default_values_install_on_a_cluster_without_nfd") else {
        return;
    };
    let emu = Emulator::start(EmulatorConfig::default()).await.unwrap();
    let kubeconfig = emu.kubeconfig_path().to_path_buf();
    let out = tokio::task::spawn_blocking(move || {
        helm_with(
            &helm,
            &kubeconfig,
            &[
                "install",
                "amd-gpu-operator",
                CHART,
                "-n",
                NAMESPACE,
                "--create-namespace",
                "-f",
                &format!("{CHART}/ci/reference-default-values.yaml"),
            ],
        )
    })
    .await
    .unwrap();
    let notes = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{notes}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        emu.get("apps/v1", "DaemonSet", NAMESPACE, "gpu-operator-detect")
            .is_some()
    );
    assert!(
        emu.get("apps/v1", "DaemonSet", NAMESPACE, "gpu-operator")
            .is_some()
    );
    assert!(
        notes.contains("does not install NFD"),
        "the notes say why there is node detection: {notes}"
    );
}
