//! The commands an install's life runs against the cluster, as the real
//! binary runs them (the Helm chart's hooks and its detect DaemonSet):
//! `crd --apply`, `uninstall` and `detect`, against the API emulator, with
//! an agent that leads where a leader is needed.

mod support;

use std::process::{Command, Output};
use std::time::Duration;

use gpu_operator::host::HostRoot;
use gpu_operator::simulate::{self, SimSpec};
use kube::Api;
use kube::api::{Patch, PatchParams};
use kube_emulator::{Emulator, EmulatorConfig};
use serde_json::{Value, json};
use support::agent_config::LeaderConfigBuilder;
use support::cluster::{self, NAMESPACE, TestCluster, ours_on};
use support::fixtures::DeviceConfigBuilder;
use support::node_rig::NodeRig;
use support::wait;

/// Runs the real binary with `args` against the emulator; off the runtime,
/// since the emulator serves on it.
async fn gpu_operator(kubeconfig: &std::path::Path, args: &[&str]) -> Output {
    let (kubeconfig, args) = (
        kubeconfig.to_path_buf(),
        args.iter().map(|a| a.to_string()).collect::<Vec<_>>(),
    );
    tokio::task::spawn_blocking(move || {
        Command::new(env!("CARGO_BIN_EXE_gpu-operator"))
            .args(&args)
            .env("KUBECONFIG", kubeconfig)
            .env_remove("POD_NAMESPACE")
            .env("RUST_LOG", "warn")
            .output()
            .expect("gpu-operator runs")
    })
    .await
    .expect("the command's thread")
}

fn said(out: &Output) -> String {
    format!(
        "exit {:?}\nstdout: {}\nstderr: {}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Writes the driver upgrade states of DeviceConfig "gpus" in `configs`'
/// namespace, as the leader would.
async fn set_upgrade_states(configs: &Api<gpu_operator::api::DeviceConfig>, states: Value) {
    configs
        .patch_status(
            "gpus",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"nodeModuleStatus": states}})),
        )
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crd_apply_installs_and_upgrades_the_crds_and_refuses_during_a_driver_upgrade() {
    let emu = Emulator::start(EmulatorConfig::default()).await.unwrap();
    let kubeconfig = emu.kubeconfig_path().to_path_buf();
    let crds = || {
        [
            "deviceconfigs.amd.com",
            "remediationworkflowstatuses.amd.com",
        ]
        .map(|name| {
            emu.get(
                "apiextensions.k8s.io/v1",
                "CustomResourceDefinition",
                "",
                name,
            )
            .is_some()
        })
    };
    assert_eq!(crds(), [false, false]);
    // No CRD yet: nothing can be upgrading, and both get installed.
    let out = gpu_operator(&kubeconfig, &["crd", "--apply", "--refuse-while-upgrading"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", said(&out));
    assert_eq!(crds(), [true, true]);
    // The CRD as this binary defines it, whoever wrote it before.
    let served = emu
        .get(
            "apiextensions.k8s.io/v1",
            "CustomResourceDefinition",
            "",
            "deviceconfigs.amd.com",
        )
        .unwrap();
    assert_eq!(
        served["spec"]["versions"],
        serde_json::to_value(gpu_operator::api::crd()).unwrap()["spec"]["versions"]
    );
    // Again: nothing changes, no error.
    let out = gpu_operator(&kubeconfig, &["crd", "--apply"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", said(&out));
    // A node in the middle of a driver upgrade: refused, naming it.
    emu.create(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}))
        .unwrap();
    emu.create(DeviceConfigBuilder::new(NAMESPACE, "gpus").json())
        .unwrap();
    let configs: Api<gpu_operator::api::DeviceConfig> = Api::namespaced(emu.client(), NAMESPACE);
    set_upgrade_states(
        &configs,
        json!({"gpu-0": {"status": "Upgrade-In-Progress"},
               "gpu-1": {"status": "Upgrade-Complete"}}),
    )
    .await;
    let out = gpu_operator(
        &kubeconfig,
        &[
            "crd",
            "--apply",
            "--refuse-while-upgrading",
            "--namespace",
            NAMESPACE,
        ],
    )
    .await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{}", said(&out));
    assert!(
        stderr.contains("gpu-0 (Upgrade-In-Progress)") && !stderr.contains("gpu-1"),
        "{stderr}"
    );
    // Without the check, the CRDs are applied all the same.
    let out = gpu_operator(&kubeconfig, &["crd", "--apply", "--namespace", NAMESPACE]).await;
    assert_eq!(out.status.code(), Some(0), "{}", said(&out));
    // A DeviceConfig in another namespace is followed too: with
    // --all-namespaces (the chart's hook) its upgrade refuses as well.
    set_upgrade_states(&configs, json!({"gpu-0": {"status": "Upgrade-Complete"}})).await;
    emu.create(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team-a"}}))
        .unwrap();
    emu.create(DeviceConfigBuilder::new("team-a", "gpus").json())
        .unwrap();
    let elsewhere: Api<gpu_operator::api::DeviceConfig> = Api::namespaced(emu.client(), "team-a");
    set_upgrade_states(&elsewhere, json!({"gpu-7": {"status": "Upgrade-Started"}})).await;
    let refuse = [
        "crd",
        "--apply",
        "--refuse-while-upgrading",
        "--namespace",
        NAMESPACE,
    ];
    let out = gpu_operator(&kubeconfig, &refuse).await;
    assert_eq!(
        out.status.code(),
        Some(0),
        "its own namespace only: {}",
        said(&out)
    );
    let out = gpu_operator(&kubeconfig, &[&refuse[..], &["--all-namespaces"]].concat()).await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{}", said(&out));
    assert!(
        stderr.contains("team-a/gpus: gpu-7 (Upgrade-Started)"),
        "{stderr}"
    );
}

/// Node `gpu-0` of `cluster` on a simulated host, its agent leading.
async fn start_agent(cluster: &TestCluster) -> NodeRig {
    let mut rig = NodeRig::builder("gpu-0")
        .join(cluster.client())
        .profile("mi210", Some(1), None)
        .start()
        .await;
    let config = rig
        .agent_config()
        .rescan_interval(Duration::from_millis(300))
        .leader(Some(
            LeaderConfigBuilder::new(NAMESPACE, "gpu-0", "gpu-0")
                .fast_lease()
                .teardown_timeout(Duration::from_secs(10))
                .build(),
        ))
        .build();
    rig.start_agent(config);
    rig
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uninstall_deletes_the_device_configs_once_the_leader_has_cleaned_the_nodes() {
    let cluster = TestCluster::start().await;
    cluster.add_node(cluster::node("gpu-0", json!({"gpu": "amd"})));
    cluster
        .apply_device_config(
            "gpus",
            json!({"selector": {"gpu": "amd"}, "devicePlugin": {}, "metricsExporter": {"enable": true, "port": 0},
                   "testRunner": {"enable": true}}),
        )
        .await;
    // Another namespace's DeviceConfig (selecting no node), which the
    // leader follows and holds just the same.
    cluster
        .create(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team-a"}}))
        .unwrap();
    cluster
        .apply_device_config_in(
            "team-a",
            "spare",
            json!({"selector": {"gpu": "none"}, "metricsExporter": {"enable": true}}),
        )
        .await;
    let mut node = start_agent(&cluster).await;
    wait::eventually(
        "the agent follows the DeviceConfig and the leader holds it",
        || {
            let node = cluster.node("gpu-0");
            let held = |ns: &str, name: &str| {
                cluster
                    .get("amd.com/v1alpha1", "DeviceConfig", ns, name)
                    .is_some_and(|dc| {
                        dc["metadata"]["finalizers"]
                            .as_array()
                            .is_some_and(|f| !f.is_empty())
                    })
            };
            node["metadata"]["annotations"]["amd.com/gpu-agent-status"]
                .as_str()
                .is_some_and(|s| s.contains("kube-amd-gpu/gpus"))
                && held(NAMESPACE, "gpus")
                && held("team-a", "spare")
        },
    )
    .await;
    assert!(!ours_on(&cluster.node("gpu-0")).is_empty());
    // The label detect keeps, and one NFD keeps on another node.
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(cluster.client());
    cluster.add_node(cluster::node("nfd-0", json!({})));
    for (node, manager) in [("gpu-0", "gpu-operator-detect"), ("nfd-0", "nfd-master")] {
        nodes
            .patch(
                node,
                &PatchParams::apply(manager).force(),
                &Patch::Apply(json!({"apiVersion": "v1", "kind": "Node",
                    "metadata": {"name": node,
                                 "labels": {"feature.node.kubernetes.io/amd-gpu": "true"}}})),
            )
            .await
            .unwrap();
    }
    // As the chart's hook runs it: every namespace.
    let out = gpu_operator(
        cluster.kubeconfig_path(),
        &[
            "uninstall",
            "--namespace",
            NAMESPACE,
            "--all-namespaces",
            "--timeout",
            "60s",
        ],
    )
    .await;
    assert_eq!(out.status.code(), Some(0), "{}", said(&out));
    for (ns, name) in [(NAMESPACE, "gpus"), ("team-a", "spare")] {
        assert!(
            cluster
                .get("amd.com/v1alpha1", "DeviceConfig", ns, name)
                .is_none(),
            "{ns}/{name} is still there: {}",
            said(&out)
        );
    }
    // The Service of each, beside the agents, went with it.
    assert!(
        cluster.list("v1", "Service").is_empty(),
        "{:?}",
        cluster.list("v1", "Service")
    );
    // Gone only once the node was clean: nothing of ours is left on it,
    // detect's label included; NFD's stays.
    assert_eq!(ours_on(&cluster.node("gpu-0")), Vec::<String>::new());
    let gpu_label = |node: &str| {
        cluster.node(node)["metadata"]["labels"]["feature.node.kubernetes.io/amd-gpu"].clone()
    };
    assert!(gpu_label("gpu-0").is_null(), "{}", cluster.node("gpu-0"));
    assert_eq!(gpu_label("nfd-0"), "true");
    let _ = node.stop_agent().await;

    // With nobody to lift the finalizer: it says so at its timeout, naming
    // the DeviceConfig by namespace/name; one namespace only without
    // --all-namespaces.
    cluster
        .create(
            DeviceConfigBuilder::new("team-a", "stuck")
                .metadata(
                    "finalizers",
                    json!([gpu_operator::cluster::reconcile::FINALIZER]),
                )
                .json(),
        )
        .unwrap();
    let out = gpu_operator(
        cluster.kubeconfig_path(),
        &["uninstall", "--namespace", NAMESPACE, "--timeout", "2s"],
    )
    .await;
    assert_eq!(out.status.code(), Some(0), "{}", said(&out));
    let out = gpu_operator(
        cluster.kubeconfig_path(),
        &["uninstall", "-A", "--timeout", "2s"],
    )
    .await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{}", said(&out));
    assert!(
        stderr.contains("team-a/stuck") && stderr.contains("leader"),
        "{stderr}"
    );
    // A cluster without the CRD has nothing to uninstall.
    let empty = Emulator::start(EmulatorConfig::default()).await.unwrap();
    let out = gpu_operator(empty.kubeconfig_path(), &["uninstall"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", said(&out));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn detect_labels_the_nodes_with_amd_gpus_and_only_them() {
    let cluster = TestCluster::start().await;
    let dir = tempfile::tempdir().unwrap();
    let mut children = Vec::new();
    for (node, profile) in [
        ("gpu", Some("mi300x")),
        ("vgpu", Some("mi300x-vf")),
        ("cpu", None),
    ] {
        cluster.add_node(cluster::node(node, json!({})));
        let host = HostRoot::new(dir.path().join(node));
        std::fs::create_dir_all(host.root()).unwrap();
        if let Some(profile) = profile {
            let mut spec = SimSpec::new(profile, Some(2), None).unwrap();
            // A fresh node: no amdgpu loaded yet.
            spec.driver_loaded = false;
            simulate::write_host(&host, &spec).unwrap();
        }
        let mut child = Command::new(env!("CARGO_BIN_EXE_gpu-operator"))
            .args(["detect", "--node-name", node, "--host-root"])
            .arg(host.root())
            .env("KUBECONFIG", cluster.kubeconfig_path())
            .env("RUST_LOG", "info")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        // Its log, as it comes: the evidence that it has looked.
        let log = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
        let (into, stderr) = (log.clone(), child.stderr.take().unwrap());
        std::thread::spawn(move || {
            use std::io::BufRead;
            for line in std::io::BufReader::new(stderr)
                .lines()
                .map_while(Result::ok)
            {
                if let Ok(mut log) = into.lock() {
                    log.push_str(&line);
                    log.push('\n');
                }
            }
        });
        children.push((node, child, log));
    }
    let labels = |node: &str| cluster.node(node)["metadata"]["labels"].clone();
    wait::eventually("the GPU nodes labelled", || {
        labels("gpu")["feature.node.kubernetes.io/amd-gpu"] == "true"
            && labels("vgpu")["feature.node.kubernetes.io/amd-vgpu"] == "true"
    })
    .await;
    assert_eq!(
        labels("gpu")["feature.node.kubernetes.io/amd-gpu-mi300x"],
        "true"
    );
    assert!(labels("vgpu")["feature.node.kubernetes.io/amd-gpu"].is_null());
    // Under its own field manager, as every concern's Node writes are.
    let managers: Vec<String> = cluster.node("gpu")["metadata"]["managedFields"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|m| m["manager"].as_str().map(str::to_owned))
        .collect();
    assert!(
        managers.contains(&"gpu-operator-detect".to_owned()),
        "{managers:?}"
    );
    // Every detect has looked at its node (its one log line); the node
    // without a GPU got nothing.
    wait::eventually("every detect has looked", || {
        children
            .iter()
            .all(|(_, _, log)| log.lock().is_ok_and(|l| l.contains("node labels")))
    })
    .await;
    for (node, mut child, log) in children {
        // SAFETY: kill(2) on our own child's pid.
        unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        let status = tokio::task::spawn_blocking(move || child.wait().unwrap())
            .await
            .unwrap();
        assert_eq!(status.code(), Some(0), "{node}: {}", log.lock().unwrap());
    }
    let cpu = labels("cpu");
    assert!(
        cpu.as_object().is_none_or(|l| !l
            .keys()
            .any(|k| k.contains("amd-gpu") || k.contains("amd-vgpu"))),
        "{cpu}"
    );
}
