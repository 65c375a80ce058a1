use super::*;
use crate::device::{DriverState, Gpu};

fn mi300x(partition: Option<(&str, &str)>) -> Gpu {
    Gpu {
        bdf: "0000:05:00.0".into(),
        vendor_id: 0x1002,
        device_id: 0x74a1,
        product_name: Some("AMD Instinct MI300X (OAM)".into()),
        vram_bytes: Some(192 << 30),
        cu_count: Some(304),
        simd_count: Some(1216),
        gfx_target_version: Some(90402),
        compute_partition: partition.map(|p| p.0.to_owned()),
        memory_partition: partition.map(|p| p.1.to_owned()),
        available_compute_partitions: vec!["spx".into(), "cpx".into()],
        available_memory_partitions: vec!["nps1".into(), "nps4".into()],
        ..Gpu::default()
    }
}

fn inventory(gpus: Vec<Gpu>) -> Inventory {
    Inventory {
        driver: DriverState {
            loaded: true,
            version: Some("6.12.12".into()),
            srcversion: Some("ABC123".into()),
            kfd_present: true,
        },
        gpus,
        warnings: vec![],
    }
}

fn all() -> Vec<LabelKind> {
    LabelKind::ALL.iter().map(|(kind, _)| *kind).collect()
}

#[test]
fn uniform_gpus_get_value_labels_and_beta_counters() {
    let labels = desired_labels(&inventory(vec![mi300x(Some(("spx", "nps1"))); 8]), &all());
    let get = |k: &str| labels.get(k).map(String::as_str);
    assert_eq!(get("amd.com/gpu.family"), Some("AI"));
    assert_eq!(get("beta.amd.com/gpu.family"), Some("AI"));
    assert_eq!(get("beta.amd.com/gpu.family.AI"), Some("8"));
    assert_eq!(get("amd.com/gpu.device-id"), Some("74a1"));
    assert_eq!(
        get("amd.com/gpu.product-name"),
        Some("AMD_Instinct_MI300X_OAM")
    );
    assert_eq!(get("amd.com/gpu.vram"), Some("192G"));
    assert_eq!(get("amd.com/gpu.cu-count"), Some("304"));
    assert_eq!(get("amd.com/gpu.simd-count"), Some("1216"));
    assert_eq!(get("amd.com/gpu.driver-version"), Some("6.12.12"));
    assert_eq!(get("amd.com/gpu.driver-src-version"), Some("ABC123"));
    assert_eq!(
        get("amd.com/gpu.compute-memory-partition"),
        Some("spx_nps1")
    );
    assert_eq!(
        get("amd.com/gpu.compute-partitioning-supported"),
        Some("true")
    );
    assert_eq!(
        get("amd.com/gpu.memory-partitioning-supported"),
        Some("true")
    );
    assert!(!labels.contains_key("amd.com/gpu.family.AI"));
    // Single labels: no beta twin, no counter.
    assert!(
        !labels
            .keys()
            .any(|k| k.starts_with("beta.amd.com/gpu.driver"))
    );
}

#[test]
fn differing_gpus_get_counters_per_value() {
    let mut small = mi300x(Some(("spx", "nps1")));
    small.cu_count = Some(228);
    let labels = desired_labels(
        &inventory(vec![mi300x(Some(("cpx", "nps4"))), small.clone(), small]),
        &all(),
    );
    assert_eq!(
        labels.get("amd.com/gpu.cu-count.304").map(String::as_str),
        Some("1")
    );
    assert_eq!(
        labels.get("amd.com/gpu.cu-count.228").map(String::as_str),
        Some("2")
    );
    // The reference writes the beta counters on mixed nodes too.
    assert_eq!(
        labels
            .get("beta.amd.com/gpu.cu-count.304")
            .map(String::as_str),
        Some("1")
    );
    assert_eq!(
        labels
            .get("beta.amd.com/gpu.cu-count.228")
            .map(String::as_str),
        Some("2")
    );
    assert!(!labels.contains_key("amd.com/gpu.cu-count"));
    assert!(!labels.contains_key("beta.amd.com/gpu.cu-count"));
    // The partition label is for homogeneous nodes only.
    assert!(!labels.contains_key("amd.com/gpu.compute-memory-partition"));
}

#[test]
fn a_vf_without_product_name_still_gets_every_other_label() {
    let mut vf = mi300x(None);
    vf.product_name = None;
    vf.available_compute_partitions.clear();
    vf.available_memory_partitions.clear();
    let labels = desired_labels(&inventory(vec![vf; 2]), &all());
    assert!(!labels.keys().any(|k| k.contains("product-name")));
    for kind in [
        "family",
        "device-id",
        "vram",
        "cu-count",
        "simd-count",
        "driver-version",
    ] {
        assert!(
            labels.contains_key(&format!("amd.com/gpu.{kind}")),
            "{kind}: {labels:?}"
        );
    }
    assert_eq!(
        labels
            .get("amd.com/gpu.compute-partitioning-supported")
            .map(String::as_str),
        Some("false")
    );
}

#[test]
fn a_gpu_without_a_value_neither_counts_nor_makes_values_differ() {
    let mut vf = mi300x(None);
    vf.product_name = None;
    vf.vram_bytes = None;
    let labels = desired_labels(
        &inventory(vec![mi300x(None), vf]),
        &[LabelKind::ProductName, LabelKind::Vram, LabelKind::DeviceId],
    );
    let expected = map(&[
        ("amd.com/gpu.product-name", "AMD_Instinct_MI300X_OAM"),
        ("beta.amd.com/gpu.product-name", "AMD_Instinct_MI300X_OAM"),
        ("beta.amd.com/gpu.product-name.AMD_Instinct_MI300X_OAM", "1"),
        ("amd.com/gpu.vram", "192G"),
        ("beta.amd.com/gpu.vram", "192G"),
        ("beta.amd.com/gpu.vram.192G", "1"),
        ("amd.com/gpu.device-id", "74a1"),
        ("beta.amd.com/gpu.device-id", "74a1"),
        ("beta.amd.com/gpu.device-id.74a1", "2"),
    ]);
    assert_eq!(labels, expected);
}

#[test]
fn the_partition_layout_label_ignores_gpus_that_report_none() {
    let kinds = [LabelKind::ComputeMemoryPartition];
    let layout = |gpus: Vec<Gpu>| {
        desired_labels(&inventory(gpus), &kinds)
            .get("amd.com/gpu.compute-memory-partition")
            .cloned()
    };
    let cpx = mi300x(Some(("cpx", "nps4")));
    let mut compute_only = mi300x(None);
    compute_only.compute_partition = Some("cpx".into());
    assert_eq!(
        layout(vec![cpx.clone(), mi300x(None), compute_only]),
        Some("cpx_nps4".into())
    );
    assert_eq!(layout(vec![cpx, mi300x(Some(("spx", "nps1")))]), None);
    assert_eq!(layout(vec![mi300x(None)]), None);
}

#[test]
fn partitioning_support_is_the_first_gpus_by_pci_address() {
    let kinds = [
        LabelKind::ComputePartitioningSupported,
        LabelKind::MemoryPartitioningSupported,
    ];
    let mut vf = mi300x(None);
    vf.bdf = "0000:01:00.0".into();
    vf.available_compute_partitions.clear();
    vf.available_memory_partitions.clear();
    // The partitionable GPU is listed first, but the VF's address is lower.
    let labels = desired_labels(&inventory(vec![mi300x(None), vf.clone()]), &kinds);
    assert_eq!(
        labels,
        map(&[
            ("amd.com/gpu.compute-partitioning-supported", "false"),
            ("amd.com/gpu.memory-partitioning-supported", "false"),
        ])
    );
    vf.bdf = "0000:ff:00.0".into();
    vf.available_memory_partitions = vec!["nps1".into()];
    let labels = desired_labels(&inventory(vec![vf, mi300x(None)]), &kinds);
    assert_eq!(
        labels,
        map(&[
            ("amd.com/gpu.compute-partitioning-supported", "true"),
            ("amd.com/gpu.memory-partitioning-supported", "true"),
        ])
    );
}

#[test]
fn driver_versions_are_single_labels_empty_for_the_inbox_driver() {
    let kinds = [LabelKind::DriverVersion, LabelKind::DriverSrcVersion];
    let mut inbox = inventory(vec![mi300x(None); 2]);
    assert_eq!(
        desired_labels(&inbox, &kinds),
        map(&[
            ("amd.com/gpu.driver-version", "6.12.12"),
            ("amd.com/gpu.driver-src-version", "ABC123"),
        ])
    );
    inbox.driver.version = None;
    inbox.driver.srcversion = None;
    assert_eq!(
        desired_labels(&inbox, &kinds),
        map(&[
            ("amd.com/gpu.driver-version", ""),
            ("amd.com/gpu.driver-src-version", ""),
        ])
    );
}

#[test]
fn firmware_labels_count_each_engine_version_as_the_reference_does() {
    let mut old = mi300x(None);
    old.firmware = BTreeMap::from([("MEC".into(), 149), ("SDMA0".into(), 24)]);
    let mut new = old.clone();
    new.firmware.insert("MEC".into(), 177);
    let labels = desired_labels(
        &inventory(vec![old, new.clone(), new]),
        &[LabelKind::Firmware],
    );
    let expected: BTreeMap<String, String> = [
        ("beta.amd.com/gpu.firmware.MEC.fw.149", "1"),
        ("beta.amd.com/gpu.firmware.MEC.fw.177", "2"),
        ("beta.amd.com/gpu.firmware.SDMA0.fw.24", "3"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect();
    assert_eq!(labels, expected);
    // Not selected, not written.
    assert!(
        !desired_labels(&inventory(vec![mi300x(None)]), &[LabelKind::Vram])
            .keys()
            .any(|k| k.contains("firmware"))
    );
}

#[test]
fn keys_too_long_for_kubernetes_are_left_out_not_sent() {
    let mut gpu = mi300x(None);
    let long = "AMD Instinct MI300X with a product name far longer than usual";
    gpu.product_name = Some(long.into());
    let labels = desired_labels(&inventory(vec![gpu]), &[LabelKind::ProductName]);
    let value = label_value(long);
    assert_eq!(labels.get("amd.com/gpu.product-name"), Some(&value));
    assert_eq!(labels.get("beta.amd.com/gpu.product-name"), Some(&value));
    // gpu.product-name.<value> is over 63 characters: that counter is dropped.
    assert_eq!(labels.len(), 2, "{labels:?}");
    assert!(
        labels
            .keys()
            .all(|k| k.split('/').nth(1).unwrap().len() <= 63)
    );
}

#[test]
fn selected_kinds_only_and_none_without_gpus() {
    let labels = desired_labels(&inventory(vec![mi300x(None)]), &[LabelKind::Vram]);
    assert_eq!(labels.len(), 3, "{labels:?}");
    assert!(labels.keys().all(|k| k.contains("vram")));
    assert!(desired_labels(&inventory(vec![]), &all()).is_empty());
}

#[test]
fn family_names_follow_amdgpu_families() {
    assert_eq!(family(90402), Some("AI"));
    assert_eq!(family(90010), Some("AI"));
    assert_eq!(family(90002), Some("RV"));
    assert_eq!(family(100300), Some("NV"));
    assert_eq!(family(110000), Some("GC_11_0_0"));
    assert_eq!(family(110500), Some("GC_11_5_0"));
    assert_eq!(family(0), None);
}

#[test]
fn label_values_are_valid() {
    assert_eq!(
        label_value("AMD Instinct MI300X (OAM)"),
        "AMD_Instinct_MI300X_OAM"
    );
    assert_eq!(label_value(" (x) "), "x");
    assert_eq!(label_value(&"a".repeat(80)).len(), 63);
    assert_eq!(label_value("é+/"), "");
}

fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// A Node as an earlier version left it: labels, and the owned-keys annotation.
fn legacy_node(labels: &[(&str, &str)], owned: Option<&str>) -> k8s_openapi::api::core::v1::Node {
    let mut node = k8s_openapi::api::core::v1::Node::default();
    node.metadata.labels = Some(map(labels));
    node.metadata.annotations = owned.map(|keys| map(&[(OWNED_ANNOTATION, keys)]));
    node
}

fn plan(
    node: &k8s_openapi::api::core::v1::Node,
    desired: BTreeMap<String, String>,
) -> crate::node_writer::MetadataPlan {
    let intent = label_intent(
        desired,
        &node.metadata.annotations.clone().unwrap_or_default(),
    );
    crate::node_writer::plan_metadata(node, crate::node_writer::Concern::Labeller, &intent)
}

#[test]
fn plan_sets_new_removes_stale_owned_and_leaves_others_alone() {
    // The admin wrote amd.com/gpu.family by hand; an earlier version owned
    // only vram and cu-count.
    let node = legacy_node(
        &[
            ("kubernetes.io/hostname", "n1"),
            ("amd.com/gpu.vram", "64G"),
            ("amd.com/gpu.cu-count", "104"),
            ("amd.com/gpu.family", "AI"),
        ],
        Some("amd.com/gpu.cu-count,amd.com/gpu.vram"),
    );
    let desired = map(&[("amd.com/gpu.vram", "192G")]);
    let intent = label_intent(desired.clone(), node.metadata.annotations.as_ref().unwrap());
    assert_eq!(intent.labels, desired, "vram is applied at its new value");
    let plan = plan(&node, desired);
    assert!(plan.apply);
    let patch = plan.leftovers_patch().expect("stale keys to remove");
    assert_eq!(
        patch["metadata"]["labels"]["amd.com/gpu.cu-count"],
        serde_json::Value::Null
    );
    assert!(
        patch["metadata"]["labels"]
            .get("amd.com/gpu.family")
            .is_none()
    );
    assert_eq!(
        patch["metadata"]["annotations"][OWNED_ANNOTATION],
        serde_json::Value::Null
    );
}

#[test]
fn plan_is_none_when_nothing_changed() {
    // Labels the labeller applied, as the API server records them.
    let mut node = legacy_node(&[("amd.com/gpu.vram", "192G")], None);
    node.metadata.managed_fields = Some(vec![
        k8s_openapi::apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry {
            manager: Some(crate::api::field_manager::LABELLER.into()),
            operation: Some("Apply".into()),
            fields_v1: Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::FieldsV1(
                serde_json::json!({"f:metadata": {"f:labels": {"f:amd.com/gpu.vram": {}}}}),
            )),
            ..Default::default()
        },
    ]);
    let plan = plan(&node, map(&[("amd.com/gpu.vram", "192G")]));
    assert_eq!(plan, crate::node_writer::MetadataPlan::default());
}

#[test]
fn disabling_removes_everything_owned_and_the_annotation() {
    let node = legacy_node(
        &[("amd.com/gpu.vram", "192G"), ("x", "y")],
        Some("amd.com/gpu.vram"),
    );
    let plan = plan(&node, BTreeMap::new());
    assert_eq!(
        plan.leftovers_patch(),
        Some(serde_json::json!({"metadata": {
            "labels": {"amd.com/gpu.vram": null},
            "annotations": {OWNED_ANNOTATION: null},
        }}))
    );
    // Nothing owned and nothing wanted: nothing to do.
    let untouched = legacy_node(&[("amd.com/gpu.vram", "192G"), ("x", "y")], None);
    assert_eq!(
        plan_metadata_of(&untouched),
        crate::node_writer::MetadataPlan::default()
    );
}

fn plan_metadata_of(node: &k8s_openapi::api::core::v1::Node) -> crate::node_writer::MetadataPlan {
    plan(node, BTreeMap::new())
}

#[test]
fn labels_from_a_simulated_host() {
    let dir = tempfile::tempdir().unwrap();
    let host = crate::host::HostRoot::new(dir.path());
    let spec = crate::simulate::SimSpec::new("mi300x", None, Some("cpx_nps4")).unwrap();
    crate::simulate::write_host(&host, &spec).unwrap();
    let labels = desired_labels(&crate::device::discover(&host), &all());
    // Counted per device, partitions included, as the reference's libdrm
    // reads on each card count them; the device id per GPU.
    assert_eq!(
        labels.get("beta.amd.com/gpu.family.AI").map(String::as_str),
        Some("64")
    );
    assert_eq!(
        labels
            .get("beta.amd.com/gpu.device-id.74a1")
            .map(String::as_str),
        Some("8")
    );
    assert_eq!(
        labels.get("amd.com/gpu.product-name").map(String::as_str),
        Some("AMD_Instinct_MI300X")
    );
    assert_eq!(
        labels
            .get("amd.com/gpu.compute-memory-partition")
            .map(String::as_str),
        Some("cpx_nps4")
    );
    // Every partition is a device with its own KFD node's size.
    assert_eq!(
        labels.get("amd.com/gpu.cu-count").map(String::as_str),
        Some("38")
    );
    assert_eq!(
        labels
            .get("beta.amd.com/gpu.cu-count.38")
            .map(String::as_str),
        Some("64")
    );
}

#[test]
fn shared_gpus_are_labelled_with_replicas_strategy_and_a_shared_product_name() {
    let inv = inventory(vec![mi300x(None), mi300x(None)]);
    let mut labels = desired_labels(&inv, &all());
    let product = labels["amd.com/gpu.product-name"].clone();
    let mut exclusive = labels.clone();
    add_sharing_labels(&mut exclusive, &TimeSlicing::default());
    assert_eq!(exclusive[REPLICAS_LABEL], "1");
    assert_eq!(exclusive[SHARING_STRATEGY_LABEL], "none");
    assert_eq!(exclusive["amd.com/gpu.product-name"], product);
    let sharing = TimeSlicing {
        replicas: 4,
        ..TimeSlicing::default()
    };
    add_sharing_labels(&mut labels, &sharing);
    assert_eq!(labels[REPLICAS_LABEL], "4");
    assert_eq!(labels[SHARING_STRATEGY_LABEL], "time-slicing");
    assert_eq!(
        labels["amd.com/gpu.product-name"],
        format!("{product}-SHARED")
    );
    assert_eq!(
        labels["beta.amd.com/gpu.product-name"],
        format!("{product}-SHARED")
    );
    assert!(
        labels.contains_key(&format!("beta.amd.com/gpu.product-name.{product}")),
        "the counters keep the product's own name"
    );
    // Renamed, the resource name tells them apart: the product name stays.
    let mut renamed = desired_labels(&inv, &all());
    add_sharing_labels(
        &mut renamed,
        &TimeSlicing {
            rename: true,
            ..sharing
        },
    );
    assert_eq!(renamed["amd.com/gpu.product-name"], product);
    // At most 63 characters, still a valid value.
    let mut long = BTreeMap::from([("amd.com/gpu.product-name".to_owned(), "A".repeat(62) + "_B")]);
    add_sharing_labels(&mut long, &sharing);
    let value = &long["amd.com/gpu.product-name"];
    assert!(value.len() <= 63 && value.ends_with("A-SHARED"), "{value}");
    let mut odd = BTreeMap::from([("amd.com/gpu.product-name".to_owned(), "_".to_owned())]);
    add_sharing_labels(&mut odd, &sharing);
    assert_eq!(odd["amd.com/gpu.product-name"], "SHARED");
    // No GPU labels, no sharing labels.
    let mut none = BTreeMap::new();
    add_sharing_labels(&mut none, &sharing);
    assert!(none.is_empty());
}
