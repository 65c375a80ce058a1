//! The DRA kubelet plugin end to end: a simulated host, the API emulator
//! (ResourceSlices, ResourceClaims), and the kubelet's DRA side on unix
//! sockets (`support::dra_kubelet`). The plugin runs as the agent runs it.

mod support;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use gpu_operator::dra::{DraConfig, DraPlugin, DraStatus, Registration, Slices};
use gpu_operator::driver::load::LoadCommands;
use gpu_operator::driver::reload::{Handoff, ReloadFrom, Reloader};
use gpu_operator::events::EventSink;
use gpu_operator::plugin::{DeviceRef, HealthReport, TimeSlicing};
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use support::cluster::TestCluster;
use support::dra_kubelet::DraKubelet;
use support::dra_scheduler;
use support::node_rig::{Modprobe, NodeRig};
use support::wait;
use tokio::sync::watch;

const NODE: &str = "gpu-node-1";
const NS: &str = "team-a";

/// The node (cluster, host, feeds) with the DRA plugin on it, and the
/// kubelet's DRA side in the node's kubelet directory.
struct Rig {
    node: NodeRig,
    kubelet: DraKubelet,
    plugin: Option<DraPlugin>,
    taints: bool,
    sharing: TimeSlicing,
    /// `draDriver.autoPartition`, and the `modprobe` its reloads run.
    auto_partition: bool,
    reload: Option<PathBuf>,
}

impl std::ops::Deref for Rig {
    type Target = NodeRig;

    fn deref(&self) -> &NodeRig {
        &self.node
    }
}

impl Rig {
    async fn start(profile: &str, gpus: Option<usize>, partition: Option<&str>) -> Self {
        Self::start_with(profile, gpus, partition, true).await
    }

    async fn start_with(
        profile: &str,
        gpus: Option<usize>,
        partition: Option<&str>,
        taints: bool,
    ) -> Self {
        Self::start_full(profile, gpus, partition, taints, TimeSlicing::default()).await
    }

    async fn start_full(
        profile: &str,
        gpus: Option<usize>,
        partition: Option<&str>,
        taints: bool,
        sharing: TimeSlicing,
    ) -> Self {
        let node = NodeRig::builder(NODE)
            .cluster(json!({}))
            .namespace(NS)
            .profile(profile, gpus, partition)
            .feeds()
            .start()
            .await;
        let kubelet = DraKubelet::new(&node.kubelet_dir());
        let mut rig = Self {
            node,
            kubelet,
            plugin: None,
            taints,
            sharing,
            auto_partition: false,
            reload: None,
        };
        rig.start_plugin();
        rig
    }

    /// A node of `gpus` MI300Xs in SPX/NPS1 that allocates partitions on
    /// demand, reloading amdgpu with a `modprobe` stand-in; registered and
    /// published.
    async fn start_layouts(gpus: usize) -> Self {
        let mut rig =
            Self::start_full("mi300x", Some(gpus), None, true, TimeSlicing::default()).await;
        rig.stop_plugin().await;
        let tools = rig.dir().join("tools");
        let refusing =
            support::bundles::modprobe_with_faults(&tools, &rig.sim.host.path("/"), "6.12.12");
        rig.auto_partition = true;
        rig.reload = Some(refusing);
        rig.start_plugin();
        rig.kubelet.register().await;
        rig.wait_status("published", |s| {
            matches!(s.slices, Slices::Published { .. })
        })
        .await;
        rig
    }

    fn config(&self) -> DraConfig {
        let mut config = DraConfig::new(self.kubelet_dir(), self.sim.host.clone(), NODE);
        config.cdi_dir = self.cdi_dir();
        config.device_taints = self.taints;
        config.sharing = self.sharing;
        config.auto_partition = self.auto_partition;
        config.reload = self.reload.clone().map(|modprobe| Reloader {
            commands: LoadCommands {
                modprobe,
                ..LoadCommands::default()
            },
            handoff: Handoff::default(),
        });
        config
    }

    fn cdi_dir(&self) -> PathBuf {
        self.dir().join("cdi")
    }

    fn start_plugin(&mut self) {
        self.plugin = Some(DraPlugin::start(
            self.config(),
            self.inventory().subscribe(),
            self.health().subscribe(),
            self.cluster().client(),
            EventSink::kubernetes(self.cluster().client(), NODE, watch::channel(None).1),
        ));
    }

    async fn stop_plugin(&mut self) {
        if let Some(plugin) = self.plugin.take() {
            wait::within("the DRA plugin stops", plugin.stop()).await;
        }
    }

    /// Stops the plugin, starts it again, and waits until it registered
    /// and published.
    async fn restart_plugin(&mut self) {
        self.stop_plugin().await;
        self.start_plugin();
        self.kubelet.register().await;
        self.wait_status("published", |s| {
            matches!(s.slices, Slices::Published { .. })
        })
        .await;
    }

    fn status(&self) -> watch::Receiver<DraStatus> {
        self.plugin.as_ref().expect("running").status()
    }

    async fn wait_status(&self, what: &str, check: impl Fn(&DraStatus) -> bool) -> DraStatus {
        let mut status = self.status();
        let found = wait::within(what, status.wait_for(|s| check(s))).await;
        found.expect("status channel open").clone()
    }

    fn slices(&self) -> Vec<Value> {
        let mut slices: Vec<Value> = self
            .cluster()
            .list("resource.k8s.io/v1", "ResourceSlice")
            .into_iter()
            .filter(|s| s["spec"]["nodeName"] == NODE)
            .collect();
        slices.sort_by_key(|s| {
            s["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_owned()
        });
        slices
    }

    fn device_names(&self) -> Vec<String> {
        let mut names: Vec<String> = self
            .slices()
            .iter()
            .flat_map(|s| s["spec"]["devices"].as_array().cloned().unwrap_or_default())
            .filter_map(|d| d["name"].as_str().map(str::to_owned))
            .collect();
        names.sort();
        names
    }

    fn pool_generation(&self) -> Option<i64> {
        self.slices().first()?["spec"]["pool"]["generation"].as_i64()
    }

    /// The notes of this node's Events of `reason`.
    fn event_notes(&self, reason: &str) -> Vec<String> {
        self.cluster()
            .list("events.k8s.io/v1", "Event")
            .into_iter()
            .filter(|e| e["reason"] == reason && e["regarding"]["name"] == NODE)
            .filter_map(|e| e["note"].as_str().map(str::to_owned))
            .collect()
    }

    /// Creates claim `name` in [`NS`], allocated the devices `(pool, device)`
    /// of driver `driver`; returns its UID.
    async fn claim(&self, name: &str, driver: &str, devices: &[(&str, &str)]) -> String {
        let results: Vec<Value> = devices
            .iter()
            .map(|(pool, device)| {
                json!({"request": "gpu", "driver": driver, "pool": pool, "device": device})
            })
            .collect();
        self.allocated_claim(name, results).await
    }

    /// Creates claim `name` in [`NS`] with one request of class
    /// `gpu.amd.com`, allocated `results` as the scheduler records them;
    /// returns its UID.
    async fn allocated_claim(&self, name: &str, results: Vec<Value>) -> String {
        let api: Api<ResourceClaim> = Api::namespaced(self.cluster().client(), NS);
        let claim: ResourceClaim = serde_json::from_value(json!({
            "metadata": {"name": name},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.amd.com"}}]}}
        }))
        .unwrap();
        let created = api
            .create(&PostParams::default(), &claim)
            .await
            .expect("claim created");
        api.patch_status(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"allocation": {"devices": {"results": results}}}})),
        )
        .await
        .expect("claim allocated");
        created.metadata.uid.expect("uid")
    }
}

fn spec_file(cdi_dir: &Path, uid: &str) -> PathBuf {
    cdi_dir.join(format!("k8s.gpu.amd.com-gpu_{uid}.json"))
}

/// The CDI validator `.ci/run` builds (`tools/cdi-validate`: the CDI
/// reference implementation's reader), or `None` (after saying why) when the
/// check should skip. Panics when it is absent and `REQUIRE_CDI_VALIDATE` is set.
fn cdi_validator() -> Option<PathBuf> {
    let binary = std::env::var_os("CDI_VALIDATE")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            Path::new(env!("CARGO_MANIFEST_DIR")).join("target/cdi-validate/debug/cdi-validate")
        });
    if binary.is_file() {
        return Some(binary);
    }
    let required = std::env::var("REQUIRE_CDI_VALIDATE")
        .is_ok_and(|v| !v.is_empty() && v != "0" && !v.eq_ignore_ascii_case("false"));
    assert!(
        !required,
        "REQUIRE_CDI_VALIDATE is set but the CDI validator is not at {} (build it: cargo build \
         --manifest-path tools/cdi-validate/Cargo.toml --target-dir target/cdi-validate)",
        binary.display()
    );
    eprintln!(
        "SKIPPED the CDI reference check: no validator at {}; set REQUIRE_CDI_VALIDATE=1 to make \
         this a failure",
        binary.display()
    );
    None
}

/// Checks a spec with the CDI reference implementation's reader (schema,
/// kind, names, versions), and what it does not check: absolute paths.
fn assert_valid_cdi(path: &Path) {
    if let Some(validator) = cdi_validator() {
        let out = std::process::Command::new(&validator)
            .arg(path)
            .output()
            .expect("the CDI validator runs");
        assert!(
            out.status.success(),
            "{} is not a valid CDI spec: {}{}",
            path.display(),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let text: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let nodes = text["containerEdits"]["deviceNodes"]
        .as_array()
        .into_iter()
        .flatten()
        .chain(
            text["devices"]
                .as_array()
                .unwrap()
                .iter()
                .flat_map(|d| d["containerEdits"]["deviceNodes"].as_array().unwrap()),
        );
    for node in nodes {
        assert!(node["path"].as_str().unwrap().starts_with('/'), "{node}");
    }
}

/// The reference check is only worth something if it can fail.
#[test]
fn the_cdi_validator_refuses_a_spec_the_reference_refuses() {
    let Some(validator) = cdi_validator() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.json");
    std::fs::write(
        &bad,
        r#"{"cdiVersion":"0.5.0","kind":"gpu","devices":[{"name":"x","containerEdits":{"deviceNodes":[{"path":"/dev/kfd"}]}}]}"#,
    )
    .unwrap();
    let out = std::process::Command::new(validator)
        .arg(&bad)
        .output()
        .unwrap();
    assert!(
        !out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registers_with_the_kubelet_and_publishes_mi300x_gpus_and_partitions() {
    // Taints off (--dra-device-taints=false): a health change then changes
    // nothing the slices carry, which this test checks writes nothing.
    let mut rig = Rig::start_with("mi300x", None, None, false).await;
    let (info, version) = rig.kubelet.register().await;
    assert_eq!(info.name, "gpu.amd.com");
    assert_eq!(
        info.endpoint,
        rig.kubelet.dra_socket().display().to_string()
    );
    assert_eq!(version, "v1.DRAPlugin", "{:?}", info.supported_versions);
    assert!(
        info.supported_versions
            .contains(&"v1beta1.DRAPlugin".to_string())
    );
    let status = rig
        .wait_status("registered and published", |s| {
            s.registration == Registration::Registered
                && matches!(s.slices, Slices::Published { devices: 8, .. })
        })
        .await;
    assert_eq!(status.unavailable_reason(), None);

    // SPX: eight whole GPUs in one slice of one pool named after the node.
    let slices = rig.slices();
    assert_eq!(slices.len(), 1, "{slices:#?}");
    let spec = &slices[0]["spec"];
    assert_eq!(spec["driver"], "gpu.amd.com");
    assert_eq!(spec["pool"]["name"], NODE);
    assert_eq!(spec["pool"]["resourceSliceCount"], 1);
    let devices = spec["devices"].as_array().unwrap();
    assert_eq!(devices.len(), 8);
    let first = &devices[0];
    assert!(
        first["name"].as_str().unwrap().starts_with("gpu-"),
        "{first}"
    );
    let attrs = &first["attributes"];
    assert_eq!(attrs["type"]["string"], "amdgpu");
    assert_eq!(attrs["family"]["string"], "AI");
    assert_eq!(attrs["partitionProfile"]["string"], "spx_nps1");
    assert!(
        attrs["productName"]["string"]
            .as_str()
            .unwrap()
            .contains("MI300X")
    );
    assert!(
        attrs["deviceID"]["string"]
            .as_str()
            .unwrap()
            .starts_with("0x")
    );
    assert!(attrs["driverVersion"]["version"].is_string(), "{attrs}");
    assert!(attrs["cardIndex"]["int"].is_i64() && attrs["renderIndex"]["int"].is_i64());
    assert!(attrs["resource.kubernetes.io/pciBusID"]["string"].is_string());
    assert_eq!(
        attrs["pciAddr"]["string"], attrs["resource.kubernetes.io/pciBusID"]["string"],
        "{attrs}"
    );
    assert!(
        attrs["resource.kubernetes.io/numaNode"]["int"].is_i64(),
        "{attrs}"
    );
    assert_eq!(
        attrs["resource.kubernetes.io/numaNode"]["int"], attrs["numaNode"]["int"],
        "{attrs}"
    );
    assert_eq!(
        attrs["resource.kubernetes.io/pcieRoot"]["string"],
        "pci0000:00"
    );
    let capacity = &first["capacity"];
    assert_eq!(capacity["computeUnits"]["value"], "304");
    assert!(
        capacity["memory"]["value"]
            .as_str()
            .unwrap()
            .parse::<u64>()
            .unwrap()
            > 0
    );
    assert!(capacity["simdUnits"]["value"].is_string());
    let owner = &slices[0]["metadata"]["ownerReferences"][0];
    assert_eq!(owner["kind"], "Node");
    assert_eq!(owner["name"], NODE);

    // A change the slices do not carry (health, with taints off) is looked
    // at and writes nothing: the publisher reports each look in the status.
    let before = rig.cluster().requests();
    let mut looked = rig.status();
    looked.borrow_and_update();
    let inventory = rig.sim.discover();
    rig.health().send_replace(HealthReport {
        unhealthy: BTreeMap::from([(DeviceRef::gpu(inventory.gpus[0].bdf.clone()), "hot".into())]),
    });
    wait::within("the publisher looked", looked.changed())
        .await
        .unwrap();
    let made = rig.cluster().requests().since(&before);
    assert_eq!(
        made.get("patch", "resourceslices.resource.k8s.io")
            + made.get("create", "resourceslices.resource.k8s.io")
            + made.get("delete", "resourceslices.resource.k8s.io"),
        0,
        "{made}"
    );
    rig.health().send_replace(HealthReport::default());

    // Slices someone else deletes (a restarting kubelet wipes its node's)
    // are written again at once, at a new generation.
    let generation = rig.pool_generation().unwrap();
    let slices: Api<ResourceSlice> = Api::all(rig.cluster().client());
    for slice in rig.slices() {
        slices
            .delete(
                slice["metadata"]["name"].as_str().unwrap(),
                &Default::default(),
            )
            .await
            .unwrap();
    }
    wait::eventually("the slices written again", || {
        rig.device_names().len() == 8 && rig.pool_generation() > Some(generation)
    })
    .await;

    // A plugin that ends without cleaning up (a crash) leaves its slices; the
    // next one finds them as wanted, reports them published, writes nothing.
    drop(rig.plugin.take());
    let before = rig.cluster().requests();
    rig.start_plugin();
    rig.kubelet.register().await;
    rig.wait_status("published after a restart", |s| {
        matches!(s.slices, Slices::Published { devices: 8, .. })
    })
    .await;
    let made = rig.cluster().requests().since(&before);
    assert_eq!(
        made.get("patch", "resourceslices.resource.k8s.io"),
        0,
        "{made}"
    );

    // Repartitioned to CPX/NPS4: 64 partitions, within 2 s, at a new generation.
    let generation = rig.pool_generation().unwrap();
    rig.sim.rewrite("mi300x", Some("cpx_nps4"));
    let changed = Instant::now();
    rig.rediscover();
    rig.wait_status("64 partitions published", |s| {
        matches!(s.slices, Slices::Published { devices: 64, .. })
    })
    .await;
    let took = changed.elapsed();
    assert!(took < Duration::from_secs(2), "slices moved after {took:?}");
    assert_eq!(rig.device_names().len(), 64);
    assert!(rig.pool_generation().unwrap() > generation);
    let slices = rig.slices();
    assert_eq!(slices.len(), 1);
    for device in slices[0]["spec"]["devices"].as_array().unwrap() {
        assert_eq!(device["attributes"]["type"]["string"], "amdgpu-partition");
        assert_eq!(
            device["attributes"]["partitionProfile"]["string"],
            "cpx_nps4"
        );
    }

    // Stopping removes the sockets and the slices.
    rig.stop_plugin().await;
    assert!(rig.slices().is_empty(), "{:#?}", rig.slices());
    assert!(!rig.kubelet.registration_socket().exists());
    assert!(!rig.kubelet.dra_socket().exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_registration_is_reported() {
    let rig = Rig::start("mi210", None, None).await;
    rig.kubelet.register().await;
    rig.kubelet.refuse("version skew").await;
    let status = rig
        .wait_status("refused", |s| {
            matches!(s.registration, Registration::Refused(_))
        })
        .await;
    assert!(
        status
            .unavailable_reason()
            .unwrap()
            .contains("version skew"),
        "{status:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_registration_is_an_event() {
    let rig = Rig::start("mi210", None, None).await;
    rig.kubelet.register().await;
    rig.kubelet.refuse("version skew").await;
    wait::eventually("a DRARegistrationRefused Event", || {
        rig.event_notes("DRARegistrationRefused")
            .iter()
            .any(|n| n.contains("version skew"))
    })
    .await;
}

/// A slice the API server refuses is not "published": the status names the
/// field and the server's message, an Event says the same, and the same
/// content is not sent again; new content is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_slice_is_a_problem_and_an_event_and_is_retried_only_on_new_content() {
    let rig = Rig::start("mi300x", Some(2), None).await;
    rig.kubelet.register().await;
    rig.wait_status("published", |s| {
        matches!(s.slices, Slices::Published { .. })
    })
    .await;
    let generation = rig.pool_generation();

    // An amdgpu srcversion the API cannot hold (over 64 bytes).
    let mut hostile = rig.sim.discover();
    hostile.driver.srcversion = Some("F".repeat(70));
    rig.inventory().send_replace(Arc::new(hostile.clone()));
    let status = rig
        .wait_status("rejected", |s| matches!(s.slices, Slices::Rejected { .. }))
        .await;
    let reason = status.unavailable_reason().expect("a problem");
    assert!(
        reason.contains(&format!("ResourceSlice {NODE}-gpu.amd.com-0"))
            && reason.contains("spec.devices[0].attributes[driverSrcVersion].string")
            && reason.contains("may not be more than 64 bytes"),
        "{reason}"
    );
    wait::eventually("a ResourceSliceRejected Event", || {
        rig.event_notes("ResourceSliceRejected")
            .iter()
            .any(|n| n.contains("attributes[driverSrcVersion]"))
    })
    .await;
    assert_eq!(rig.pool_generation(), generation, "the old slices stay");

    // The same content again (a health re-check, a watch event) writes nothing.
    let before = rig.cluster().requests();
    rig.inventory().send_replace(Arc::new(hostile));
    rig.health().send_replace(HealthReport::default());
    // Someone else touching the slice makes the plugin compare again.
    let slices: Api<ResourceSlice> = Api::all(rig.cluster().client());
    slices
        .patch(
            &format!("{NODE}-gpu.amd.com-0"),
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"touched": "yes"}}})),
        )
        .await
        .expect("slice labelled");
    rig.cluster().faults().drop_watches();
    let watched = rig.cluster().requests();
    wait::eventually("the slice watch is back", || {
        rig.cluster().requests().since(&watched).watches() > 0
    })
    .await;
    // A claim that nothing happens needs a window: one past the 5 s after
    // which a failed write is tried again, which a refusal must not be.
    tokio::time::sleep(Duration::from_secs(6)).await;
    let writes = rig.cluster().requests().since(&before);
    assert_eq!(
        writes.get("patch", "resourceslices.resource.k8s.io"),
        1,
        "only the label; {}",
        writes.to_json()
    );
    assert_eq!(
        rig.event_notes("ResourceSliceRejected").len(),
        1,
        "{}",
        writes.to_json()
    );
    assert!(matches!(
        rig.status().borrow().slices,
        Slices::Rejected { .. }
    ));

    // New content is written, and published again.
    rig.rediscover();
    rig.wait_status("published again", |s| {
        matches!(s.slices, Slices::Published { .. })
    })
    .await;
    assert_eq!(rig.status().borrow().unavailable_reason(), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_are_prepared_once_and_unprepared_idempotently() {
    let mut rig = Rig::start("mi300x", None, None).await;
    rig.kubelet.register().await;
    rig.wait_status("published", |s| {
        matches!(s.slices, Slices::Published { .. })
    })
    .await;
    let names = rig.device_names();
    let (one, two) = (names[0].clone(), names[1].clone());
    let uid = rig
        .claim("pair", "gpu.amd.com", &[(NODE, &one), (NODE, &two)])
        .await;

    let first = rig.kubelet.prepare(&[(NS, &uid, "pair")]).await;
    let answer = &first.claims[&uid];
    assert_eq!(answer.error, "", "{first:?}");
    let mut got: Vec<&str> = answer
        .devices
        .iter()
        .map(|d| d.device_name.as_str())
        .collect();
    got.sort();
    assert_eq!(got, [one.as_str(), two.as_str()]);
    for device in &answer.devices {
        assert_eq!(device.pool_name, NODE);
        assert_eq!(device.request_names, ["gpu"]);
        assert_eq!(
            device.cdi_device_ids,
            [format!("k8s.gpu.amd.com/gpu={uid}-{}", device.device_name)]
        );
    }
    let spec_path = spec_file(&rig.cdi_dir(), &uid);
    assert_valid_cdi(&spec_path);
    let spec: Value = serde_json::from_str(&std::fs::read_to_string(&spec_path).unwrap()).unwrap();
    assert_eq!(spec["kind"], "k8s.gpu.amd.com/gpu");
    // /dev/kfd once for the claim, with the numbers sysfs gives it.
    let kfd = &spec["containerEdits"]["deviceNodes"][0];
    assert_eq!(
        (kfd["path"].as_str(), kfd["major"].as_u64()),
        (Some("/dev/kfd"), Some(235))
    );
    let card_index: u64 = one.split('-').nth(1).unwrap().parse().unwrap();
    let device = spec["devices"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["name"] == format!("{uid}-{one}"))
        .expect("the device's entry");
    let card = &device["containerEdits"]["deviceNodes"][0];
    assert_eq!(card["path"], format!("/dev/dri/card{card_index}"));
    assert_eq!(
        (card["major"].as_u64(), card["minor"].as_u64()),
        (Some(226), Some(card_index))
    );

    // A second call: the same answer, and nothing written.
    let written = std::fs::metadata(&spec_path).unwrap().modified().unwrap();
    let checkpoint = rig
        .kubelet_dir()
        .join("plugins/gpu.amd.com/checkpoint.json");
    let checkpoint_written = std::fs::metadata(&checkpoint).unwrap().modified().unwrap();
    let again = rig.kubelet.prepare(&[(NS, &uid, "pair")]).await;
    assert_eq!(again, first);
    assert_eq!(
        std::fs::metadata(&spec_path).unwrap().modified().unwrap(),
        written
    );
    assert_eq!(
        std::fs::metadata(&checkpoint).unwrap().modified().unwrap(),
        checkpoint_written
    );

    // The v1beta1 service answers the same.
    let beta = rig
        .kubelet
        .v1beta1()
        .await
        .node_prepare_resources(
            gpu_operator::dra::api::dra_v1beta1::NodePrepareResourcesRequest {
                claims: vec![gpu_operator::dra::api::dra_v1beta1::Claim {
                    namespace: NS.into(),
                    uid: uid.clone(),
                    name: "pair".into(),
                }],
            },
        )
        .await
        .unwrap()
        .into_inner();
    assert_eq!(beta.claims[&uid].devices.len(), 2);

    // A restarted plugin still knows the claim (the checkpoint) and keeps its spec.
    rig.stop_plugin().await;
    assert!(
        spec_path.exists(),
        "a prepared claim's spec outlives the plugin"
    );
    rig.start_plugin();
    rig.kubelet.register().await;
    let after_restart = rig.kubelet.prepare(&[(NS, &uid, "pair")]).await;
    assert_eq!(after_restart, first);

    // Unprepare twice: the spec and the entry go, the second call is a no-op.
    for _ in 0..2 {
        let gone = rig.kubelet.unprepare(&[(NS, &uid, "pair")]).await;
        assert_eq!(gone.claims[&uid].error, "", "{gone:?}");
        assert!(!spec_path.exists());
    }
    let kept: Value = serde_json::from_str(&std::fs::read_to_string(&checkpoint).unwrap()).unwrap();
    assert!(
        kept["preparedClaims"].as_object().unwrap().is_empty(),
        "{kept}"
    );
}

/// Time-slicing through DRA: devices published for several allocations with
/// consumable capacity; two claims share one GPU by memory and are both
/// prepared, each with its own CDI spec and its share in the checkpoint; a
/// third that does not fit is not allocatable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_claims_share_a_gpu_by_memory_and_a_third_that_does_not_fit_is_not_allocatable() {
    let sharing = TimeSlicing {
        replicas: 4,
        ..TimeSlicing::default()
    };
    let mut rig = Rig::start_full("mi300x", Some(1), None, false, sharing).await;
    rig.kubelet.register().await;
    rig.wait_status("published", |s| {
        matches!(s.slices, Slices::Published { .. })
    })
    .await;
    let slice_device = rig.slices()[0]["spec"]["devices"][0].clone();
    let device = slice_device["name"].as_str().unwrap().to_owned();
    assert_eq!(slice_device["allowMultipleAllocations"], true);
    let memory = &slice_device["capacity"]["memory"];
    let total = dra_scheduler::quantity(memory["value"].as_str().unwrap());
    let gib: u128 = 1 << 30;
    assert_eq!(
        dra_scheduler::quantity(memory["requestPolicy"]["default"].as_str().unwrap()),
        total / 4 / gib * gib,
        "a quarter by default: {memory}"
    );
    assert_eq!(
        dra_scheduler::quantity(
            memory["requestPolicy"]["validRange"]["step"]
                .as_str()
                .unwrap()
        ),
        gib,
        "in GiB steps"
    );

    // The scheduler's part: each claim asks for memory; what it consumes is
    // judged against the published policy and the shares already taken.
    let api: Api<ResourceClaim> = Api::namespaced(rig.cluster().client(), NS);
    let half = format!("{}Gi", total / gib / 2);
    let third = format!("{}Gi", total / gib / 3);
    let mut shares: Vec<BTreeMap<String, String>> = Vec::new();
    let mut uids = Vec::new();
    for (name, asked) in [("train", half.as_str()), ("infer", third.as_str())] {
        let claim: ResourceClaim = serde_json::from_value(json!({
            "metadata": {"name": name},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                "deviceClassName": "gpu.amd.com", "capacity": {"requests": {"memory": asked}}}}]}}
        }))
        .unwrap();
        let created = api
            .create(&PostParams::default(), &claim)
            .await
            .expect("claim created");
        let requests = BTreeMap::from([("memory", asked)]);
        let consumed = dra_scheduler::fit(&slice_device, &requests, &shares).expect("it fits");
        let share = format!("share-{name}");
        api.patch_status(
            name,
            &PatchParams::default(),
            &Patch::Merge(dra_scheduler::allocation(NODE, &device, &share, &consumed)),
        )
        .await
        .expect("claim allocated");
        shares.push(consumed);
        uids.push((name, created.metadata.uid.expect("uid")));
    }
    // The third does not fit beside them.
    let requests = BTreeMap::from([("memory", third.as_str())]);
    let refused = dra_scheduler::fit(&slice_device, &requests, &shares).unwrap_err();
    assert!(refused.starts_with("memory:"), "{refused}");

    // One claim with two small shares of the device (two requests): what
    // fits beside the first two.
    let small = "8Gi";
    let mut results = Vec::new();
    for request in ["a", "b"] {
        let requests = BTreeMap::from([("memory", small)]);
        let consumed =
            dra_scheduler::fit(&slice_device, &requests, &shares).expect("a small share fits");
        shares.push(consumed.clone());
        results.push(json!({"request": request, "driver": "gpu.amd.com", "pool": NODE,
            "device": device, "shareID": format!("share-pair-{request}"), "consumedCapacity": consumed}));
    }
    let requests: Vec<Value> = ["a", "b"]
        .iter()
        .map(|r| {
            json!({"name": r, "exactly": {"deviceClassName": "gpu.amd.com",
                "capacity": {"requests": {"memory": small}}}})
        })
        .collect();
    let pair: ResourceClaim = serde_json::from_value(json!({
        "metadata": {"name": "pair"},
        "spec": {"devices": {"requests": requests}}
    }))
    .unwrap();
    let pair_uid = api
        .create(&PostParams::default(), &pair)
        .await
        .expect("claim created")
        .metadata
        .uid
        .expect("uid");
    api.patch_status(
        "pair",
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"allocation": {"devices": {"results": results}}}})),
    )
    .await
    .expect("claim allocated");
    let answer = rig.kubelet.prepare(&[(NS, &pair_uid, "pair")]).await;
    let prepared = &answer.claims[&pair_uid];
    assert_eq!(prepared.error, "", "{answer:?}");
    let mut share_ids: Vec<&str> = prepared
        .devices
        .iter()
        .filter_map(|d| d.share_id.as_deref())
        .collect();
    share_ids.sort();
    assert_eq!(
        share_ids,
        ["share-pair-a", "share-pair-b"],
        "an answer for each share"
    );
    assert_valid_cdi(&spec_file(&rig.cdi_dir(), &pair_uid));
    let spec: Value = serde_json::from_str(
        &std::fs::read_to_string(spec_file(&rig.cdi_dir(), &pair_uid)).unwrap(),
    )
    .unwrap();
    assert_eq!(
        spec["devices"].as_array().unwrap().len(),
        1,
        "one CDI device for the two shares"
    );

    // Both shares prepared: a CDI spec each, the share in the answer and in
    // the checkpoint.
    let claims: Vec<(&str, &str, &str)> = uids.iter().map(|(n, u)| (NS, u.as_str(), *n)).collect();
    let answer = rig.kubelet.prepare(&claims).await;
    for (name, uid) in &uids {
        let prepared = &answer.claims[uid];
        assert_eq!(prepared.error, "", "{name}: {answer:?}");
        assert_eq!(prepared.devices.len(), 1);
        assert_eq!(prepared.devices[0].device_name, device);
        assert_eq!(
            prepared.devices[0].share_id.as_deref(),
            Some(format!("share-{name}").as_str())
        );
        assert_valid_cdi(&spec_file(&rig.cdi_dir(), uid));
    }
    let checkpoint: Value = serde_json::from_str(
        &std::fs::read_to_string(
            rig.kubelet_dir()
                .join("plugins/gpu.amd.com/checkpoint.json"),
        )
        .unwrap(),
    )
    .unwrap();
    let (_, train_uid) = &uids[0];
    let recorded = &checkpoint["preparedClaims"][train_uid]["devices"][0];
    assert_eq!(recorded["shareId"], "share-train");
    assert_eq!(
        dra_scheduler::quantity(recorded["consumedCapacity"]["memory"].as_str().unwrap()),
        dra_scheduler::quantity(&half)
    );
    rig.stop_plugin().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_claims_get_their_own_error_and_do_not_stop_the_others() {
    let rig = Rig::start("mi300x", None, None).await;
    rig.kubelet.register().await;
    rig.wait_status("published", |s| {
        matches!(s.slices, Slices::Published { .. })
    })
    .await;
    let good_device = rig.device_names()[0].clone();
    let good = rig
        .claim("good", "gpu.amd.com", &[(NODE, &good_device)])
        .await;
    let elsewhere = rig
        .claim("elsewhere", "gpu.amd.com", &[("other-node", "gpu-1-128")])
        .await;
    let unknown = rig
        .claim("unknown", "gpu.amd.com", &[(NODE, "gpu-99-999")])
        .await;
    let foreign = rig
        .claim("foreign", "net.example.com", &[(NODE, "eth0")])
        .await;
    let answer = rig
        .kubelet
        .prepare(&[
            (NS, "no-such-uid", "missing"),
            (NS, &elsewhere, "elsewhere"),
            (NS, &good, "good"),
            (NS, &unknown, "unknown"),
            (NS, &foreign, "foreign"),
            (NS, "stale-uid", "good"),
        ])
        .await;
    let error = |uid: &str| answer.claims[uid].error.clone();
    assert!(error("no-such-uid").contains("not found"), "{answer:?}");
    assert!(error(&elsewhere).contains("pool other-node"), "{answer:?}");
    assert!(error(&unknown).contains("gpu-99-999"), "{answer:?}");
    assert!(
        error(&foreign).contains("no gpu.amd.com device"),
        "{answer:?}"
    );
    assert!(error("stale-uid").contains("UID"), "{answer:?}");
    assert_eq!(error(&good), "");
    assert_eq!(answer.claims[&good].devices.len(), 1);
    assert!(spec_file(&rig.cdi_dir(), &good).exists());
    for uid in [&elsewhere, &unknown, &foreign] {
        assert!(!spec_file(&rig.cdi_dir(), uid).exists());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_between_the_cdi_write_and_the_checkpoint_leaves_nothing_unfixable() {
    let mut rig = Rig::start("mi210", None, None).await;
    rig.kubelet.register().await;
    rig.wait_status("published", |s| {
        matches!(s.slices, Slices::Published { .. })
    })
    .await;
    let device = rig.device_names()[0].clone();
    let uid = rig.claim("c", "gpu.amd.com", &[(NODE, &device)]).await;
    rig.stop_plugin().await;

    // What a crash after the spec write leaves: a spec (here half-written)
    // that no checkpoint entry names, for a claim the kubelet got no answer for.
    let spec_path = spec_file(&rig.cdi_dir(), &uid);
    std::fs::create_dir_all(rig.cdi_dir()).unwrap();
    std::fs::write(&spec_path, "{\"cdiVersion\": \"0.5").unwrap();
    // Another vendor's spec in the same directory is not ours to touch.
    let other = rig.cdi_dir().join("nvidia.com-gpu.json");
    std::fs::write(&other, "{}").unwrap();

    // The restarted plugin removes the orphan at start...
    rig.start_plugin();
    rig.kubelet.register().await;
    rig.wait_status("published", |s| {
        matches!(s.slices, Slices::Published { .. })
    })
    .await;
    assert!(!spec_path.exists(), "the orphaned spec is removed");
    assert!(other.exists());
    // ...and the kubelet's retry prepares the claim whole.
    let answer = rig.kubelet.prepare(&[(NS, &uid, "c")]).await;
    assert_eq!(answer.claims[&uid].error, "");
    assert_valid_cdi(&spec_path);

    // A spec left half-written with no entry, found without a restart, is
    // rewritten by the next call too.
    rig.kubelet.unprepare(&[(NS, &uid, "c")]).await;
    std::fs::write(&spec_path, "{\"cdiVersion\": \"0.5").unwrap();
    let answer = rig.kubelet.prepare(&[(NS, &uid, "c")]).await;
    assert_eq!(answer.claims[&uid].error, "");
    assert_valid_cdi(&spec_path);
}

/// A checkpoint that cannot be read keeps every CDI spec there then, not for
/// one restart but for every one after it, until the kubelet unprepares the
/// claim: a container of a prepared claim may start again at any time. Orphan
/// removal still works for specs that appear later without an entry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupt_checkpoint_keeps_every_cdi_spec_through_repeated_restarts() {
    let mut rig = Rig::start("mi210", None, None).await;
    rig.kubelet.register().await;
    rig.wait_status("published", |s| {
        matches!(s.slices, Slices::Published { .. })
    })
    .await;
    let devices = rig.device_names();
    let a = rig.claim("a", "gpu.amd.com", &[(NODE, &devices[0])]).await;
    let b = rig.claim("b", "gpu.amd.com", &[(NODE, &devices[1])]).await;
    for (uid, name) in [(&a, "a"), (&b, "b")] {
        let answer = rig.kubelet.prepare(&[(NS, uid, name)]).await;
        assert_eq!(answer.claims[uid].error, "", "{name}");
    }
    let checkpoint = rig
        .kubelet_dir()
        .join("plugins/gpu.amd.com/checkpoint.json");
    rig.stop_plugin().await;
    std::fs::write(&checkpoint, "{\"version\": 1, \"preparedClaims\": {\"trunc").unwrap();
    rig.start_plugin();
    rig.kubelet.register().await;
    rig.wait_status("published", |s| {
        matches!(s.slices, Slices::Published { .. })
    })
    .await;
    let aside = checkpoint.with_extension("json.unreadable");
    assert!(
        std::fs::read_to_string(&aside).unwrap().contains("\"trunc"),
        "the unreadable checkpoint is kept for a person"
    );
    for uid in [&a, &b] {
        assert!(
            spec_file(&rig.cdi_dir(), uid).exists(),
            "first start: {uid}"
        );
    }
    // A new claim after it, and a spec a crash left without an entry.
    let c = rig.claim("c", "gpu.amd.com", &[(NODE, &devices[0])]).await;
    assert_eq!(
        rig.kubelet.prepare(&[(NS, &c, "c")]).await.claims[&c].error,
        ""
    );
    let crashed = spec_file(&rig.cdi_dir(), "0c0c0c0c-0000-4000-8000-00000000dead");
    std::fs::write(&crashed, "{\"cdiVersion\": \"0.5").unwrap();
    for start in 2..=3 {
        rig.restart_plugin().await;
        for uid in [&a, &b, &c] {
            assert!(
                spec_file(&rig.cdi_dir(), uid).exists(),
                "start {start}: {uid} lost"
            );
            assert_valid_cdi(&spec_file(&rig.cdi_dir(), uid));
        }
        assert!(
            !crashed.exists(),
            "start {start}: the crash's orphan is removed"
        );
    }
    // The kubelet unprepares a kept claim: its spec goes, and it is no
    // longer kept.
    let answer = rig.kubelet.unprepare(&[(NS, &a, "a")]).await;
    assert_eq!(answer.claims[&a].error, "");
    assert!(!spec_file(&rig.cdi_dir(), &a).exists());
    let kept: Value = serde_json::from_str(&std::fs::read_to_string(&checkpoint).unwrap()).unwrap();
    assert_eq!(kept["keptSpecs"], json!([b.clone()]), "{kept:#}");
    // A UID that is not one names no path: refused, nothing removed.
    let answer = rig.kubelet.unprepare(&[(NS, "../../b", "x")]).await;
    assert!(
        answer.claims["../../b"].error.contains("not a UID"),
        "{answer:?}"
    );
    assert!(spec_file(&rig.cdi_dir(), &b).exists());
    rig.restart_plugin().await;
    assert!(
        spec_file(&rig.cdi_dir(), &b).exists(),
        "after unprepare and a restart"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_reaches_the_stream_and_the_taint_within_a_second_and_recovers() {
    let rig = Rig::start_with("mi300x", None, None, true).await;
    rig.kubelet.register().await;
    rig.wait_status("published", |s| {
        matches!(s.slices, Slices::Published { devices: 8, .. })
    })
    .await;
    for mut stream in [
        rig.kubelet.health_v1alpha1().await,
        rig.kubelet.health_v1().await,
    ] {
        let (first, _) = stream.next().await;
        assert_eq!(first.len(), 8, "the first message lists every device");
        assert!(
            first
                .iter()
                .all(|d| d.health == "HEALTHY" && d.pool == NODE),
            "{first:?}"
        );
    }
    let mut stream = rig.kubelet.health_v1alpha1().await;
    stream.next().await;

    // The monitor reports one GPU unhealthy, as it does after an ECC error.
    let inventory = rig.sim.discover();
    let sick = &inventory.gpus[0];
    let sick_name = format!("gpu-{}-{}", sick.card.unwrap(), sick.render_minor.unwrap());
    let reported = Instant::now();
    rig.health().send_replace(HealthReport {
        unhealthy: BTreeMap::from([(
            DeviceRef::gpu(sick.bdf.clone()),
            "uncorrectable ECC: 7 on umc".to_string(),
        )]),
    });
    let (devices, at) = stream
        .next_matching("the GPU unhealthy", |d| {
            d.iter()
                .any(|x| x.device == sick_name && x.health == "UNHEALTHY")
        })
        .await;
    assert!(
        at - reported < Duration::from_secs(1),
        "{:?}",
        at - reported
    );
    let sick_entry = devices.iter().find(|d| d.device == sick_name).unwrap();
    assert_eq!(sick_entry.message, "uncorrectable ECC: 7 on umc");
    assert_eq!(devices.iter().filter(|d| d.health == "HEALTHY").count(), 7);
    let tainted = |rig: &Rig| {
        rig.slices().iter().any(|s| {
            s["spec"]["devices"].as_array().unwrap().iter().any(|d| {
                d["name"] == sick_name.as_str()
                    && d["taints"][0]["key"] == "gpu.amd.com/unhealthy"
                    && d["taints"][0]["effect"] == "NoSchedule"
            })
        })
    };
    wait::eventually_within(
        "the taint",
        Duration::from_secs(1),
        || tainted(&rig),
        || format!("{:#?}", rig.slices()),
    )
    .await;

    // Recovery: healthy in the stream, the taint gone.
    rig.health().send_replace(HealthReport::default());
    stream
        .next_matching("all healthy again", |d| {
            d.iter().all(|x| x.health == "HEALTHY")
        })
        .await;
    wait::eventually("the taint removed", || !tainted(&rig)).await;

    // With nothing changing, messages still repeat (the kubelet marks a
    // silent device Unknown after 30 s).
    let (_, last) = stream.next().await;
    let (_, next) = stream.next().await;
    assert!(next - last <= Duration::from_secs(11), "{:?}", next - last);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_registration_socket_is_served_and_registered_again() {
    // The kubelet's plugin watcher registers whatever appears in
    // plugins_registry, so a socket someone removed must come back.
    let rig = Rig::start("mi210", None, None).await;
    rig.kubelet.register().await;
    rig.wait_status("published", |s| {
        matches!(s.slices, Slices::Published { .. })
    })
    .await;
    std::fs::remove_file(rig.kubelet.registration_socket()).unwrap();
    wait::eventually("the registration socket served again", || {
        rig.kubelet.registration_socket().exists()
    })
    .await;
    rig.wait_status("waiting for a new registration", |s| {
        s.registration == Registration::Waiting
    })
    .await;
    rig.kubelet.register().await;
    rig.wait_status("registered again", |s| {
        s.registration == Registration::Registered
    })
    .await;
}

/// A claim's `status.devices` entry is written after Prepare answers: a
/// status write the API server fails does not fail Prepare, and is made
/// once the server answers again (after the retry policy's tries, 5 s on).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_claim_status_write_does_not_fail_prepare_and_is_made_later() {
    let rig = Rig::start("mi210", Some(1), None).await;
    rig.kubelet.register().await;
    rig.wait_status("published", |s| {
        matches!(s.slices, Slices::Published { .. })
    })
    .await;
    let device = rig.device_names()[0].clone();
    let uid = rig.claim("solo", "gpu.amd.com", &[(NODE, &device)]).await;
    // Every try of the first write: the call and the policy's four retries.
    rig.cluster()
        .faults()
        .fail_next(5, "patch", "resourceclaims.resource.k8s.io/status", 500);

    let answer = rig.kubelet.prepare(&[(NS, &uid, "solo")]).await;
    assert_eq!(answer.claims[&uid].error, "", "{answer:?}");
    let entry = || {
        rig.cluster()
            .get("resource.k8s.io/v1", "ResourceClaim", NS, "solo")
            .and_then(|c| c["status"]["devices"].as_array().cloned())
            .unwrap_or_default()
    };
    wait::eventually("every failure served", || {
        rig.cluster().faults().pending_failures() == 0
    })
    .await;
    assert!(entry().is_empty(), "{:?}", entry());
    wait::eventually("the entry written once the server answers", || {
        entry()
            .iter()
            .any(|e| e["device"] == device.as_str() && e["driver"] == "gpu.amd.com")
    })
    .await;
}

impl Rig {
    /// Creates claim `name`, allocated one share of `device` of this node
    /// as the scheduler records it; returns its UID.
    async fn claim_share(
        &self,
        name: &str,
        device: &str,
        share: Option<&str>,
        consumed: &BTreeMap<String, String>,
    ) -> String {
        let mut result =
            json!({"request": "gpu", "driver": "gpu.amd.com", "pool": NODE, "device": device});
        if let Some(share) = share {
            result["shareID"] = json!(share);
            result["consumedCapacity"] = json!(consumed);
        }
        self.allocated_claim(name, vec![result]).await
    }

    /// Creates claim `name` with one partition of layout device `device`,
    /// allocated as the scheduler allocates it (the first share); its UID.
    async fn claim_one_partition(&self, name: &str, device: &str) -> String {
        let published = self.slice_device(device);
        let one = BTreeMap::from([("partitions", "1")]);
        let consumed = dra_scheduler::fit(&published, &one, &[]).expect("a partition fits");
        self.claim_share(name, device, Some("share-1"), &consumed)
            .await
    }

    /// The published device `name`.
    fn slice_device(&self, name: &str) -> Value {
        self.slices()
            .iter()
            .flat_map(|s| s["spec"]["devices"].as_array().cloned().unwrap_or_default())
            .find(|d| d["name"] == name)
            .unwrap_or_else(|| panic!("device {name} is published"))
    }

    /// The value of the memory-partition-conflict taint of each published
    /// device that carries it (always `NoExecute`).
    fn conflict_taints(&self) -> BTreeMap<String, String> {
        let mut out = BTreeMap::new();
        for slice in self.slices() {
            for device in slice["spec"]["devices"].as_array().into_iter().flatten() {
                for taint in device["taints"].as_array().into_iter().flatten() {
                    if taint["key"] == "gpu.amd.com/memory-partition-conflict" {
                        assert_eq!(taint["effect"], "NoExecute", "{taint}");
                        out.insert(
                            device["name"].as_str().unwrap().to_owned(),
                            taint["value"].as_str().unwrap_or_default().to_owned(),
                        );
                    }
                }
            }
        }
        out
    }

    /// GPU `index`'s modes and partition count, as discovery reads the host.
    fn layout_of(&self, index: usize) -> (String, String, usize) {
        let inventory = self.sim.discover();
        let mut gpus: Vec<_> = inventory.gpus.iter().collect();
        gpus.sort_by(|a, b| a.bdf.cmp(&b.bdf));
        let gpu = gpus[index];
        (
            gpu.compute_partition.clone().unwrap_or_default(),
            gpu.memory_partition.clone().unwrap_or_default(),
            gpu.partitions.len().max(1),
        )
    }

    fn checkpoint(&self) -> Value {
        serde_json::from_str(
            &std::fs::read_to_string(
                self.kubelet_dir()
                    .join("plugins/gpu.amd.com/checkpoint.json"),
            )
            .unwrap_or_else(|_| "{}".into()),
        )
        .unwrap()
    }

    /// The DRM nodes (path, minor) a prepared claim's CDI spec gives `device`.
    fn cdi_nodes(&self, uid: &str, cdi_device: &str) -> Vec<(String, u64)> {
        let spec: Value = serde_json::from_str(
            &std::fs::read_to_string(spec_file(&self.cdi_dir(), uid)).unwrap(),
        )
        .unwrap();
        let device = spec["devices"]
            .as_array()
            .unwrap()
            .iter()
            .find(|d| d["name"] == format!("{uid}-{cdi_device}"))
            .unwrap_or_else(|| panic!("{cdi_device} in {spec}"))
            .clone();
        device["containerEdits"]["deviceNodes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|n| {
                (
                    n["path"].as_str().unwrap().to_owned(),
                    n["minor"].as_u64().unwrap(),
                )
            })
            .collect()
    }
}

/// Issue 34 item 1: every layout a partitionable GPU runs is on offer,
/// named as AMD's AutoPartition names them; the scheduler (a stand-in that
/// charges counters as KEP-4815 documents) can allocate shares of one layout
/// of a GPU and never two layouts; a claim for another layout repartitions
/// its GPU on Prepare and gets its own partition; one that would change a
/// GPU others hold fails cleanly, and again the same way when retried.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_for_another_layout_repartitions_its_gpu_and_layouts_never_mix() {
    let mut rig = Rig::start_layouts(2).await;
    let slices = rig.slices();
    let sets: Vec<String> = slices
        .iter()
        .flat_map(|s| {
            s["spec"]["sharedCounters"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .map(|c| c["name"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(sets, ["gpu-0-mutex", "gpu-1-mutex"]);
    let names = rig.device_names();
    for layout in [
        "spx-nps1", "dpx-nps1", "qpx-nps1", "qpx-nps4", "cpx-nps1", "cpx-nps4",
    ] {
        for gpu in [0, 1] {
            let name = format!("gpu-{gpu}-{layout}");
            assert!(names.contains(&name), "{name} in {names:?}");
        }
    }
    assert_eq!(names.len(), 12, "only layouts, no GPU as it is: {names:?}");
    let cpx = rig.slice_device("gpu-0-cpx-nps1");
    assert_eq!(cpx["attributes"]["computePartition"]["string"], "cpx");
    assert_eq!(cpx["attributes"]["memoryPartition"]["string"], "nps1");
    assert_eq!(cpx["attributes"]["gpuIndex"]["int"], 0);
    assert_eq!(cpx["attributes"]["type"]["string"], "amdgpu-partition");
    assert_eq!(cpx["capacity"]["partitions"]["value"], "8");
    assert_eq!(cpx["allowMultipleAllocations"], true);
    assert_eq!(cpx["consumesCounters"][0]["counterSet"], "gpu-0-mutex");
    assert_eq!(rig.layout_of(0), ("spx".into(), "nps1".into(), 1));

    // Two claims for one CPX partition each: the scheduler's part first.
    let all = rig.slices();
    let one = BTreeMap::from([("partitions", "1")]);
    let first = dra_scheduler::fit(&cpx, &one, &[]).expect("a partition fits");
    dra_scheduler::counters_allow(&all, "gpu-0-cpx-nps1", &[]).expect("GPU 0 is free");
    let train = rig
        .claim_share("train", "gpu-0-cpx-nps1", Some("share-train"), &first)
        .await;
    let answer = rig.kubelet.prepare(&[(NS, &train, "train")]).await;
    let prepared = &answer.claims[&train];
    assert_eq!(prepared.error, "", "{answer:?}");
    assert_eq!(prepared.devices[0].device_name, "gpu-0-cpx-nps1");
    assert_eq!(
        prepared.devices[0].cdi_device_ids,
        [format!("k8s.gpu.amd.com/gpu={train}-gpu-0-cpx-nps1-p0")]
    );
    assert_valid_cdi(&spec_file(&rig.cdi_dir(), &train));
    assert_eq!(
        rig.layout_of(0),
        ("cpx".into(), "nps1".into(), 8),
        "repartitioned"
    );
    assert_eq!(
        rig.layout_of(1),
        ("spx".into(), "nps1".into(), 1),
        "the other GPU untouched"
    );
    let inventory = rig.sim.discover();
    let mut gpus: Vec<_> = inventory.gpus.iter().collect();
    gpus.sort_by(|a, b| a.bdf.cmp(&b.bdf));
    let partition = |i: usize| {
        let p = &gpus[0].partitions[i];
        (p.card.unwrap() as u64, p.render_minor.unwrap() as u64)
    };
    let nodes = rig.cdi_nodes(&train, "gpu-0-cpx-nps1-p0");
    assert_eq!(
        nodes,
        [
            (format!("/dev/dri/card{}", partition(0).0), partition(0).0),
            (
                format!("/dev/dri/renderD{}", partition(0).1),
                partition(0).1
            )
        ]
    );

    let second = dra_scheduler::fit(&cpx, &one, std::slice::from_ref(&first)).expect("fits");
    dra_scheduler::counters_allow(&all, "gpu-0-cpx-nps1", &["gpu-0-cpx-nps1"])
        .expect("a second share of the same layout is charged nothing more");
    let infer = rig
        .claim_share("infer", "gpu-0-cpx-nps1", Some("share-infer"), &second)
        .await;
    let answer = rig.kubelet.prepare(&[(NS, &infer, "infer")]).await;
    assert_eq!(answer.claims[&infer].error, "", "{answer:?}");
    assert_eq!(
        rig.cdi_nodes(&infer, "gpu-0-cpx-nps1-p1")[0].0,
        format!("/dev/dri/card{}", partition(1).0),
        "the next partition"
    );
    // Never two layouts of one GPU; another GPU's layouts stay free.
    let refused =
        dra_scheduler::counters_allow(&all, "gpu-0-spx-nps1", &["gpu-0-cpx-nps1"]).unwrap_err();
    assert!(refused.contains("gpu-0-mutex"), "{refused}");
    dra_scheduler::counters_allow(&all, "gpu-1-spx-nps1", &["gpu-0-cpx-nps1"])
        .expect("GPU 1 is free");
    // The node's memory mode is held: layouts of another one are tainted.
    wait::eventually("layouts of NPS4 carry the conflict taint", || {
        let taints = rig.conflict_taints();
        taints.len() == 4 && taints.values().all(|v| v == "nps1")
    })
    .await;
    assert!(rig.conflict_taints().contains_key("gpu-1-cpx-nps4"));

    // An allocation that went around the counters (a stale one) is refused
    // cleanly: no CDI spec, no checkpoint entry, the layout kept; a retry
    // is refused the same way.
    let stale = rig
        .claim_share("stale", "gpu-0-spx-nps1", None, &BTreeMap::new())
        .await;
    for _ in 0..2 {
        let answer = rig.kubelet.prepare(&[(NS, &stale, "stale")]).await;
        let error = &answer.claims[&stale].error;
        assert!(
            error.contains("gpu-0-cpx-nps1") && error.contains("free"),
            "{error}"
        );
        assert!(!spec_file(&rig.cdi_dir(), &stale).exists());
        assert!(rig.checkpoint()["preparedClaims"].get(&stale).is_none());
        assert_eq!(rig.layout_of(0).0, "cpx");
    }

    // Both shares unprepared: the taints go, and the stale claim's layout
    // can be had.
    let answer = rig
        .kubelet
        .unprepare(&[(NS, &train, "train"), (NS, &infer, "infer")])
        .await;
    assert!(
        answer.claims.values().all(|c| c.error.is_empty()),
        "{answer:?}"
    );
    wait::eventually("no conflict taint once nothing is held", || {
        rig.conflict_taints().is_empty()
    })
    .await;
    let answer = rig.kubelet.prepare(&[(NS, &stale, "stale")]).await;
    assert_eq!(answer.claims[&stale].error, "", "{answer:?}");
    assert_eq!(rig.layout_of(0), ("spx".into(), "nps1".into(), 1));
    assert_eq!(
        rig.cdi_nodes(&stale, "gpu-0-spx-nps1-p0")[0].0,
        format!("/dev/dri/card{}", gpus[0].card.unwrap())
    );
    assert_eq!(
        rig.checkpoint()["preparedClaims"][&stale]["devices"][0]["partitions"],
        json!([0])
    );
    rig.stop_plugin().await;
}

/// Prepares claim `nps4` (`uid`) with the `modprobe` stand-in in `tools`
/// refusing the next unload: the Prepare fails, saying the change was
/// undone.
async fn prepare_with_the_reload_refused_once(kubelet: &DraKubelet, tools: &Path, uid: &str) {
    std::fs::write(tools.join("refuse-once"), "").unwrap();
    let answer = kubelet.prepare(&[(NS, uid, "nps4")]).await;
    let error = &answer.claims[uid].error;
    assert!(
        error.contains("cannot reload amdgpu") && error.contains("back in their layouts"),
        "{error}"
    );
}

/// A memory mode change reloads amdgpu through the driver manager's
/// `modprobe`; a change that fails is undone (the GPUs back in their
/// layouts, nothing half written); one that cannot be undone taints the
/// GPUs' layouts until a later change of them succeeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_memory_mode_change_reloads_the_driver_and_a_failed_one_is_undone_or_tainted() {
    let mut rig = Rig::start_layouts(2).await;
    let tools = rig.dir().join("tools");
    let uid = rig.claim_one_partition("nps4", "gpu-0-cpx-nps4").await;

    // The reload fails once: the change is undone, its own reload works.
    prepare_with_the_reload_refused_once(&rig.kubelet, &tools, &uid).await;
    assert!(!spec_file(&rig.cdi_dir(), &uid).exists());
    assert!(rig.checkpoint()["preparedClaims"].get(&uid).is_none());
    assert_eq!(rig.layout_of(0), ("spx".into(), "nps1".into(), 1));
    assert_eq!(rig.layout_of(1), ("spx".into(), "nps1".into(), 1));
    assert!(rig.conflict_taints().is_empty());

    // The kubelet's retry: the change is made, with one reload.
    let before = support::bundles::modprobe_runs(&tools).len();
    let answer = rig.kubelet.prepare(&[(NS, &uid, "nps4")]).await;
    assert_eq!(answer.claims[&uid].error, "", "{answer:?}");
    assert_eq!(
        support::bundles::modprobe_runs(&tools)[before..],
        ["-r amdgpu", "amdgpu"],
        "unloaded and loaded again"
    );
    assert_eq!(rig.layout_of(0), ("cpx".into(), "nps4".into(), 8));
    // The other GPU followed the memory mode, in the widest mode that runs with it.
    assert_eq!(rig.layout_of(1), ("cpx".into(), "nps4".into(), 8));
    wait::eventually("NPS1 layouts carry the conflict taint", || {
        let taints = rig.conflict_taints();
        taints.contains_key("gpu-1-spx-nps1") && taints.values().all(|v| v == "nps4")
    })
    .await;
    let answer = rig.kubelet.unprepare(&[(NS, &uid, "nps4")]).await;
    assert_eq!(answer.claims[&uid].error, "");

    // Every reload refused: the change and its undoing fail, and the GPUs'
    // layouts are tainted until a change of them succeeds.
    let spx = rig
        .claim_share("spx", "gpu-0-spx-nps1", None, &BTreeMap::new())
        .await;
    std::fs::write(tools.join("refuse"), "").unwrap();
    let answer = rig.kubelet.prepare(&[(NS, &spx, "spx")]).await;
    let error = &answer.claims[&spx].error;
    assert!(
        error.contains("gpu.amd.com/memory-partition-conflict"),
        "{error}"
    );
    assert!(!spec_file(&rig.cdi_dir(), &spx).exists());
    wait::eventually("every layout of both GPUs is tainted", || {
        rig.conflict_taints().len() == 12
    })
    .await;
    std::fs::remove_file(tools.join("refuse")).unwrap();
    let answer = rig.kubelet.prepare(&[(NS, &spx, "spx")]).await;
    assert_eq!(answer.claims[&spx].error, "", "{answer:?}");
    assert_eq!(rig.layout_of(0), ("spx".into(), "nps1".into(), 1));
    wait::eventually("only the other memory mode's layouts are tainted", || {
        let taints = rig.conflict_taints();
        !taints.contains_key("gpu-0-spx-nps1")
            && taints.contains_key("gpu-0-cpx-nps4")
            && taints.values().all(|v| v == "nps1")
    })
    .await;
    rig.stop_plugin().await;
}

/// Issue 34 item 1, the window counters cannot close: amdgpu sets one
/// memory mode for all of a node's GPUs, but each GPU has its own counter
/// set, and the memory-partition-conflict taint comes only once a claim
/// holds a layout device (at Prepare). Two claims allocated before the
/// first Prepare can so take different memory modes on two GPUs. The first
/// prepared wins. The second's Prepare fails cleanly: its error names the
/// memory mode and what holds the node; nothing is written (modes, reload,
/// CDI spec, checkpoint entry); its device carries the conflict taint
/// (NoExecute: the device-taint eviction takes its pod off and the
/// scheduler allocates again); and the kubelet's retries are idempotent,
/// refused alike while the first claim is prepared and made once it is not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_allocated_on_two_memory_modes_before_a_prepare_fail_the_second_cleanly() {
    let mut rig = Rig::start_layouts(2).await;
    let tools = rig.dir().join("tools");
    let first = rig.claim_one_partition("nps1", "gpu-0-cpx-nps1").await;
    let second = rig.claim_one_partition("nps4", "gpu-1-cpx-nps4").await;
    assert!(
        rig.conflict_taints().is_empty(),
        "no claim holds a layout yet"
    );
    let reloads = support::bundles::modprobe_runs(&tools).len();

    let answer = rig.kubelet.prepare(&[(NS, &first, "nps1")]).await;
    assert_eq!(answer.claims[&first].error, "", "{answer:?}");
    assert_eq!(rig.layout_of(0), ("cpx".into(), "nps1".into(), 8));

    let mut errors = Vec::new();
    for _ in 0..2 {
        let answer = rig.kubelet.prepare(&[(NS, &second, "nps4")]).await;
        let error = answer.claims[&second].error.clone();
        assert!(
            error.contains("memory mode nps4 needs every GPU of the node free")
                && error.contains("gpu-0-cpx-nps1"),
            "{error}"
        );
        assert!(!spec_file(&rig.cdi_dir(), &second).exists());
        assert!(rig.checkpoint()["preparedClaims"].get(&second).is_none());
        assert_eq!(rig.layout_of(1), ("spx".into(), "nps1".into(), 1));
        assert_eq!(rig.layout_of(0), ("cpx".into(), "nps1".into(), 8));
        assert_eq!(support::bundles::modprobe_runs(&tools).len(), reloads);
        errors.push(error);
    }
    assert_eq!(errors[0], errors[1], "the retry is answered alike");
    wait::eventually(
        "the second claim's device carries the conflict taint",
        || {
            rig.conflict_taints()
                .get("gpu-1-cpx-nps4")
                .map(String::as_str)
                == Some("nps1")
        },
    )
    .await;

    // The first claim unprepared: the retry makes the change, one reload.
    let answer = rig.kubelet.unprepare(&[(NS, &first, "nps1")]).await;
    assert_eq!(answer.claims[&first].error, "");
    let answer = rig.kubelet.prepare(&[(NS, &second, "nps4")]).await;
    assert_eq!(answer.claims[&second].error, "", "{answer:?}");
    assert_eq!(rig.layout_of(1), ("cpx".into(), "nps4".into(), 8));
    assert_eq!(
        support::bundles::modprobe_runs(&tools)[reloads..],
        ["-r amdgpu", "amdgpu"]
    );
    assert!(spec_file(&rig.cdi_dir(), &second).exists());
    rig.stop_plugin().await;
}

/// A claim's `status.devices` removal that is not made before the plugin
/// stops is made after the next start: the checkpoint keeps it until then,
/// through a stop in between, and forgets it once made.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_status_removal_pending_at_stop_is_made_after_the_next_start() {
    let mut rig = Rig::start("mi210", Some(1), None).await;
    rig.kubelet.register().await;
    rig.wait_status("published", |s| {
        matches!(s.slices, Slices::Published { .. })
    })
    .await;
    let device = rig.device_names()[0].clone();
    let uid = rig.claim("solo", "gpu.amd.com", &[(NODE, &device)]).await;
    let answer = rig.kubelet.prepare(&[(NS, &uid, "solo")]).await;
    assert_eq!(answer.claims[&uid].error, "", "{answer:?}");
    let entries = |cluster: &TestCluster| {
        cluster
            .get("resource.k8s.io/v1", "ResourceClaim", NS, "solo")
            .and_then(|c| c["status"]["devices"].as_array().cloned())
            .unwrap_or_default()
    };
    wait::eventually("the entry written", || !entries(rig.cluster()).is_empty()).await;
    let generation = rig
        .cluster()
        .get("resource.k8s.io/v1", "ResourceClaim", NS, "solo")
        .unwrap()["metadata"]["generation"]
        .clone();
    assert_eq!(
        entries(rig.cluster())[0]["conditions"][0]["observedGeneration"],
        generation,
        "conditions say which generation of the claim they saw"
    );

    // The removal's first try (the call and its four retries) fails; the
    // plugin stops before the next.
    rig.cluster()
        .faults()
        .fail_next(5, "patch", "resourceclaims.resource.k8s.io/status", 500);
    let answer = rig.kubelet.unprepare(&[(NS, &uid, "solo")]).await;
    assert_eq!(answer.claims[&uid].error, "");
    wait::eventually("every failure served", || {
        rig.cluster().faults().pending_failures() == 0
    })
    .await;
    rig.stop_plugin().await;
    assert!(
        !entries(rig.cluster()).is_empty(),
        "not removed before the stop"
    );
    assert!(
        rig.checkpoint()["statusRemovals"].get(&uid).is_some(),
        "kept: {}",
        rig.checkpoint()
    );
    rig.restart_plugin().await;
    wait::eventually("the entry removed after the start", || {
        entries(rig.cluster()).is_empty()
    })
    .await;
    wait::eventually("the removal forgotten once made", || {
        rig.checkpoint()["statusRemovals"].get(&uid).is_none()
    })
    .await;
    rig.restart_plugin().await;
    assert!(entries(rig.cluster()).is_empty());
    rig.stop_plugin().await;
}

/// A Prepare given up midway (the kubelet's call timed out during a memory
/// mode change) leaves nothing half made: the change goes on to its end,
/// amdgpu loaded again, and the kubelet's retry finds the layout in place
/// and changes nothing more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prepare_given_up_midway_finishes_its_change() {
    let mut rig = Rig::start_layouts(2).await;
    let tools = rig.dir().join("tools");
    let uid = rig.claim_one_partition("nps4", "gpu-0-cpx-nps4").await;
    std::fs::write(tools.join("slow"), "").unwrap();
    let given_up = tokio::time::timeout(
        Duration::from_millis(500),
        rig.kubelet.prepare(&[(NS, &uid, "nps4")]),
    )
    .await;
    assert!(
        given_up.is_err(),
        "the change outlasts the call: {given_up:?}"
    );
    wait::eventually("the change reloaded amdgpu to its end", || {
        support::bundles::modprobe_runs(&tools) == ["-r amdgpu", "amdgpu"]
    })
    .await;
    let answer = rig.kubelet.prepare(&[(NS, &uid, "nps4")]).await;
    assert_eq!(answer.claims[&uid].error, "", "{answer:?}");
    assert_eq!(rig.layout_of(0), ("cpx".into(), "nps4".into(), 8));
    assert!(
        rig.sim.host.exists("/sys/module/amdgpu"),
        "amdgpu is loaded"
    );
    assert_eq!(
        support::bundles::modprobe_runs(&tools),
        ["-r amdgpu", "amdgpu"],
        "the retry changed nothing"
    );
    rig.stop_plugin().await;
}

/// A GPU repartitioned on the host before discovery has seen it: its old
/// partitions' DRM nodes are gone on purpose, so no device is tainted
/// unhealthy meanwhile; once discovery sees the new layout, the whole GPU is
/// published, healthy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn devices_of_a_gpu_repartitioned_behind_discovery_are_not_taken_for_faults() {
    let rig = Rig::start("mi300x", Some(1), Some("cpx_nps4")).await;
    rig.kubelet.register().await;
    rig.wait_status("published", |s| {
        matches!(s.slices, Slices::Published { .. })
    })
    .await;
    let unhealthy = |rig: &Rig| {
        rig.slices()
            .iter()
            .flat_map(|s| s["spec"]["devices"].as_array().cloned().unwrap_or_default())
            .filter(|d| {
                d["taints"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|t| t["key"] == "gpu.amd.com/unhealthy")
            })
            .count()
    };
    assert_eq!(rig.device_names().len(), 8);
    // The GPU goes back to SPX, as amdgpu does it when its compute mode is
    // written: seven partitions' nodes are gone, and the plugin's inventory
    // still names them. (Not the whole host written again: that takes
    // /dev/kfd away for the rewrite's length, which no repartition does, and
    // a look in that window rightly finds every device unhealthy.)
    let spec = gpu_operator::simulate::spec_of(&rig.sim.host).unwrap();
    let bdf = &gpu_operator::simulate::gpu_addresses(&spec)[0];
    let kernel = gpu_operator::simulate::kernel::store_for(&rig.sim.host);
    // SPX runs with NPS1 only: the memory mode first.
    for (attr, mode) in [
        ("current_memory_partition", "NPS1"),
        ("current_compute_partition", "SPX"),
    ] {
        kernel
            .store(&format!("/sys/bus/pci/devices/{bdf}/{attr}"), mode)
            .unwrap();
    }
    kernel.settle().unwrap();
    let watched = Instant::now();
    while watched.elapsed() < Duration::from_secs(1) {
        assert_eq!(unhealthy(&rig), 0, "{:#?}", rig.slices());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    rig.rediscover();
    wait::eventually("the whole GPU published", || {
        rig.device_names().len() == 1 && unhealthy(&rig) == 0
    })
    .await;
}

/// The driver the node's DeviceConfig has the operator manage, for the
/// agent tests below.
const MANAGED_VERSION: &str = "6.12.12";

/// A node of two MI300Xs (SPX/NPS1) booted with no amdgpu, a bundle in its
/// store, and the real agent, whose DeviceConfig has the driver manager
/// load that bundle with `kernelModuleConfig` and allocates partitions on
/// demand (`draDriver.autoPartition`); the driver manager's `modprobe` is
/// [`support::bundles::modprobe_with_faults`]. Returns once the bundle is loaded and the layouts
/// are published, with the kubelet's DRA side registered.
async fn managed_driver_node() -> Rig {
    use gpu_operator::simulate;
    let mut node = NodeRig::builder(NODE)
        .cluster(json!({}))
        .namespace(NS)
        .profile("mi300x", Some(2), None)
        .prepare(|host| {
            simulate::unload_module(host).unwrap();
            support::bundles::write_bundle(
                host,
                MANAGED_VERSION,
                simulate::SIM_KERNEL_RELEASE,
                true,
            );
        })
        .start()
        .await;
    let tools = node.dir().join("tools");
    start_managed_agent(&mut node);
    node.cluster()
        .apply_device_config(
            "gpus",
            json!({
                "driver": {"enable": true, "version": MANAGED_VERSION, "kernelModuleConfig": {
                    "loadArgs": ["-v"], "unloadArgs": ["--wait=5000"],
                    "parameters": ["ras_enable=1"]}},
                "draDriver": {"enable": true, "autoPartition": true},
            }),
        )
        .await;
    let kubelet = DraKubelet::new(&node.kubelet_dir());
    kubelet.register().await;
    let rig = Rig {
        node,
        kubelet,
        // The agent runs it.
        plugin: None,
        taints: false,
        sharing: TimeSlicing::default(),
        auto_partition: true,
        reload: None,
    };
    wait::eventually("the bundle loaded and the layouts published", || {
        support::bundles::modprobe_runs(&tools).len() == 1
            && rig.device_names().iter().any(|d| d == "gpu-0-cpx-nps4")
    })
    .await;
    assert_eq!(
        support::bundles::modprobe_runs(&tools),
        [managed_load(&rig)],
        "the driver manager's load"
    );
    rig
}

/// Starts the agent of [`managed_driver_node`] on `node`; returns its driver
/// manager's record of what it loaded.
fn start_managed_agent(node: &mut NodeRig) -> Handoff {
    let driver = node.driver_manager(Modprobe::WithFaults("6.12.12"));
    let handoff = driver.handoff.clone();
    let config = node.agent_config().driver(driver).build();
    node.start_agent(config);
    handoff
}

/// The `modprobe` run that loads the managed bundle of [`managed_driver_node`].
fn managed_load(rig: &Rig) -> String {
    let bundle =
        support::bundles::bundle_dir(MANAGED_VERSION, gpu_operator::simulate::SIM_KERNEL_RELEASE);
    format!(
        "--dirname {} -v amdgpu ras_enable=1",
        rig.sim.host.path(&bundle).display()
    )
}

/// The agent's CDI spec of claim `uid` (`--cdi-dir` is the kubelet
/// directory's `cdi/` in these agents).
fn agent_spec_file(rig: &Rig, uid: &str) -> PathBuf {
    spec_file(&rig.kubelet_dir().join("cdi"), uid)
}

/// Issue 34, the reload's known gap closed, with the real agent: on a node
/// whose DeviceConfig has the operator manage the driver from a bundle, a
/// claim whose layout changes the memory mode is prepared by unloading
/// amdgpu with the DeviceConfig's `unloadArgs` and loading the same bundle
/// again, from its directory, with its firmware path, `loadArgs` and
/// `parameters`, not the host's driver; the driver manager runs nothing of
/// its own meanwhile; Prepare answers with the new partition's devices. An
/// agent started again finds that driver running and reloads the store's
/// bundle of its version.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_memory_mode_change_reloads_the_bundle_the_driver_manager_loaded() {
    let mut rig = managed_driver_node().await;
    let tools = rig.dir().join("tools");
    // The firmware path set elsewhere since: the reload points it back.
    rig.sim
        .host
        .write(
            gpu_operator::driver::load::FIRMWARE_PATH_PARAM,
            "/elsewhere",
        )
        .unwrap();
    let uid = rig.claim_one_partition("nps4", "gpu-0-cpx-nps4").await;
    let answer = rig.kubelet.prepare(&[(NS, &uid, "nps4")]).await;
    let prepared = &answer.claims[&uid];
    assert_eq!(prepared.error, "", "{answer:?}");
    assert_eq!(
        support::bundles::modprobe_runs(&tools),
        [
            managed_load(&rig),
            "-r --wait=5000 amdgpu".to_owned(),
            managed_load(&rig)
        ],
        "unloaded with unloadArgs, the same bundle loaded again"
    );
    let bundle =
        support::bundles::bundle_dir(MANAGED_VERSION, gpu_operator::simulate::SIM_KERNEL_RELEASE);
    assert_eq!(
        rig.sim
            .host
            .read_attr(gpu_operator::driver::load::FIRMWARE_PATH_PARAM)
            .unwrap(),
        format!("{bundle}/firmware")
    );
    assert_eq!(rig.layout_of(0), ("cpx".into(), "nps4".into(), 8));
    // The answer and the CDI spec name the new layout's first partition.
    assert_eq!(prepared.devices.len(), 1, "{prepared:?}");
    assert_eq!(prepared.devices[0].device_name, "gpu-0-cpx-nps4");
    assert_eq!(
        prepared.devices[0].cdi_device_ids,
        [format!("k8s.gpu.amd.com/gpu={uid}-gpu-0-cpx-nps4-p0")]
    );
    let gpus = rig.sim.discover();
    let mut gpus: Vec<_> = gpus.gpus.iter().collect();
    gpus.sort_by(|a, b| a.bdf.cmp(&b.bdf));
    let card = gpus[0].partitions[0].card.expect("partition 0 has a card");
    let spec: Value =
        serde_json::from_str(&std::fs::read_to_string(agent_spec_file(&rig, &uid)).unwrap())
            .unwrap();
    assert!(
        spec["devices"]
            .to_string()
            .contains(&format!("/dev/dri/card{card}")),
        "{spec}"
    );
    // The driver manager still counts the bundle as its own, and loaded
    // nothing more.
    wait::eventually("the driver condition still says the bundle runs", || {
        rig.node()["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|c| c["type"] == "AMDGPUDriverReady" && c["status"] == "True")
    })
    .await;
    assert_eq!(support::bundles::modprobe_runs(&tools).len(), 3);

    // The agent started again (an operator upgrade, say): its manager finds
    // the bundle's amdgpu running, loaded by no one it knows, and the next
    // memory mode change loads the store's bundle of the version that runs.
    let answer = rig.kubelet.unprepare(&[(NS, &uid, "nps4")]).await;
    assert_eq!(answer.claims[&uid].error, "");
    rig.node.stop_agent().await;
    let handoff = start_managed_agent(&mut rig.node);
    rig.kubelet.register().await;
    wait::eventually("the running bundle found and the layouts published", || {
        matches!(handoff.from(), ReloadFrom::Store { .. })
            && rig.device_names().iter().any(|d| d == "gpu-0-spx-nps1")
    })
    .await;
    let whole = rig
        .claim_share("whole", "gpu-0-spx-nps1", None, &BTreeMap::new())
        .await;
    let answer = rig.kubelet.prepare(&[(NS, &whole, "whole")]).await;
    assert_eq!(answer.claims[&whole].error, "", "{answer:?}");
    assert_eq!(rig.layout_of(0), ("spx".into(), "nps1".into(), 1));
    assert_eq!(
        support::bundles::modprobe_runs(&tools)[3..],
        ["-r --wait=5000 amdgpu".to_owned(), managed_load(&rig)],
        "the store's bundle of the running version, nothing else"
    );
    rig.node.stop().await;
}

/// With the real agent and a managed driver, a reload that fails (the
/// unload refused, as for a module in use) fails the Prepare cleanly: the
/// GPUs back in their layout, the driver loaded again from the same
/// bundle, no CDI spec and no checkpoint entry; the kubelet's retry makes
/// the change.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_reload_of_the_managed_bundle_fails_the_prepare_cleanly() {
    let mut rig = managed_driver_node().await;
    let tools = rig.dir().join("tools");
    let uid = rig.claim_one_partition("nps4", "gpu-0-cpx-nps4").await;
    prepare_with_the_reload_refused_once(&rig.kubelet, &tools, &uid).await;
    assert!(!agent_spec_file(&rig, &uid).exists());
    assert!(rig.checkpoint()["preparedClaims"].get(&uid).is_none());
    assert_eq!(rig.layout_of(0), ("spx".into(), "nps1".into(), 1));
    assert_eq!(rig.layout_of(1), ("spx".into(), "nps1".into(), 1));
    // The refused unload is not logged; the undoing's reload is, with the
    // bundle.
    assert_eq!(
        support::bundles::modprobe_runs(&tools),
        [
            managed_load(&rig),
            "-r --wait=5000 amdgpu".to_owned(),
            managed_load(&rig)
        ]
    );
    assert!(rig.conflict_taints().is_empty());

    // The kubelet retries, with a back-off: the reload that undid the
    // change makes the driver's devices go and come back, and until the
    // plugin has found them again the claim's device is not one of this
    // node's.
    let kubelet = &rig.kubelet;
    let claims = [(NS, uid.as_str(), "nps4")];
    wait::poll_until(
        "the kubelet's retry prepared",
        || kubelet.prepare(&claims),
        |answer| answer.claims[&uid].error.is_empty(),
    )
    .await;
    assert_eq!(rig.layout_of(0), ("cpx".into(), "nps4".into(), 8));
    assert!(agent_spec_file(&rig, &uid).exists());
    assert_eq!(support::bundles::modprobe_runs(&tools).len(), 5);
    rig.node.stop().await;
}
