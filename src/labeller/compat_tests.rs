//! Compatibility fixtures: the whole label set the reference labeller writes on
//! SPX, CPX and heterogeneous nodes, as expected-output tables. They are
//! written for this project from the reference's rules (the module doc of
//! [`crate::labeller`] names the functions), not copied from its tests. Hosts
//! come from the simulator and from the KFD captures of real machines kept in
//! `tests/fixtures/kfd/` (derived from the ROCm k8s-device-plugin test data by
//! `derive.py` there).

use std::collections::BTreeMap;

use super::*;
use crate::api::DeviceConfigSpec;
use crate::device::{DriverState, Gpu, Inventory};
use crate::host::HostRoot;
use crate::simulate::{SimSpec, write_host};

/// The reference defaults plus the partition kinds: what a DeviceConfig with
/// `nodeLabellerArguments: [compute-memory-partition, compute-partitioning-supported,
/// memory-partitioning-supported]` asks for.
fn kinds() -> Vec<LabelKind> {
    let mut spec = DeviceConfigSpec::default();
    spec.device_plugin_mut().node_labeller_arguments = vec![
        "compute-memory-partition".into(),
        "compute-partitioning-supported".into(),
        "memory-partitioning-supported".into(),
    ];
    kinds_for(&spec)
}

fn table(rows: &[(&str, &str)]) -> BTreeMap<String, String> {
    rows.iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

/// Labels of a simulated host, through discovery.
fn simulated(spec: &SimSpec) -> BTreeMap<String, String> {
    let dir = tempfile::tempdir().expect("temporary directory");
    let host = HostRoot::new(dir.path());
    write_host(&host, spec).expect("simulated host");
    desired_labels(&crate::device::discover(&host), &kinds())
}

fn mi300x(partition: &str) -> SimSpec {
    SimSpec::new("mi300x", None, Some(partition)).expect("valid simulation")
}

/// Rows every simulated MI300X node has whatever its layout (the counters of
/// family and product name follow its devices: [`with_identity_of`]).
const MI300X_IDENTITY: &[(&str, &str)] = &[
    ("amd.com/gpu.device-id", "74a1"),
    ("beta.amd.com/gpu.device-id", "74a1"),
    ("beta.amd.com/gpu.device-id.74a1", "8"),
    ("amd.com/gpu.family", "AI"),
    ("beta.amd.com/gpu.family", "AI"),
    ("amd.com/gpu.product-name", "AMD_Instinct_MI300X"),
    ("beta.amd.com/gpu.product-name", "AMD_Instinct_MI300X"),
    ("amd.com/gpu.driver-version", "6.12.12"),
    ("amd.com/gpu.compute-partitioning-supported", "true"),
    ("amd.com/gpu.memory-partitioning-supported", "true"),
];

/// The size rows of eight whole MI300X GPUs.
const WHOLE_MI300X_SIZES: &[(&str, &str)] = &[
    ("amd.com/gpu.cu-count", "304"),
    ("beta.amd.com/gpu.cu-count", "304"),
    ("beta.amd.com/gpu.cu-count.304", "8"),
    ("amd.com/gpu.simd-count", "1216"),
    ("beta.amd.com/gpu.simd-count", "1216"),
    ("beta.amd.com/gpu.simd-count.1216", "8"),
    ("amd.com/gpu.vram", "192G"),
    ("beta.amd.com/gpu.vram", "192G"),
    ("beta.amd.com/gpu.vram.192G", "8"),
];

fn with_identity(rows: &[(&str, &str)]) -> BTreeMap<String, String> {
    with_identity_of(8, rows)
}

/// The identity rows where the reference counts `devices` devices for
/// `family` and `product-name` (libdrm on each device's card: partitions
/// included), and eight GPUs for `device-id` (sysfs only).
fn with_identity_of(devices: usize, rows: &[(&str, &str)]) -> BTreeMap<String, String> {
    let mut expected = table(MI300X_IDENTITY);
    let counted = devices.to_string();
    expected.extend(table(&[
        ("beta.amd.com/gpu.family.AI", counted.as_str()),
        (
            "beta.amd.com/gpu.product-name.AMD_Instinct_MI300X",
            counted.as_str(),
        ),
    ]));
    expected.extend(table(rows));
    expected
}

#[test]
fn spx_mi300x_node() {
    assert_eq!(
        simulated(&mi300x("spx_nps1")),
        with_identity(
            &[
                WHOLE_MI300X_SIZES,
                &[("amd.com/gpu.compute-memory-partition", "spx_nps1")],
            ]
            .concat()
        )
    );
}

/// Issue 13's example: every partition is a device, sized by its KFD node,
/// and counted by family and product name (the reference's libdrm reads on
/// each partition's card); the device id stays one per GPU.
#[test]
fn cpx_nps4_mi300x_node() {
    assert_eq!(
        simulated(&mi300x("cpx_nps4")),
        with_identity_of(
            64,
            &[
                ("amd.com/gpu.cu-count", "38"),
                ("beta.amd.com/gpu.cu-count", "38"),
                ("beta.amd.com/gpu.cu-count.38", "64"),
                ("amd.com/gpu.simd-count", "152"),
                ("beta.amd.com/gpu.simd-count", "152"),
                ("beta.amd.com/gpu.simd-count.152", "64"),
                ("amd.com/gpu.vram", "24G"),
                ("beta.amd.com/gpu.vram", "24G"),
                ("beta.amd.com/gpu.vram.24G", "64"),
                ("amd.com/gpu.compute-memory-partition", "cpx_nps4"),
            ]
        )
    );
}

/// Kernels that name partition devices `amdgpu_xcp.N` escape the reference's
/// `amdgpu_xcp_*` glob: it counts only the PCI functions, each with the size
/// of its own render node, partition 0.
#[test]
fn cpx_mi300x_node_with_dotted_partition_devices() {
    let mut spec = mi300x("cpx_nps4");
    spec.xcp_dot_spelling = true;
    assert_eq!(
        simulated(&spec),
        with_identity(&[
            ("amd.com/gpu.cu-count", "38"),
            ("beta.amd.com/gpu.cu-count", "38"),
            ("beta.amd.com/gpu.cu-count.38", "8"),
            ("amd.com/gpu.simd-count", "152"),
            ("beta.amd.com/gpu.simd-count", "152"),
            ("beta.amd.com/gpu.simd-count.152", "8"),
            ("amd.com/gpu.vram", "24G"),
            ("beta.amd.com/gpu.vram", "24G"),
            ("beta.amd.com/gpu.vram.24G", "8"),
            ("amd.com/gpu.compute-memory-partition", "cpx_nps4"),
        ])
    );
}

/// Some GPUs repartitioned, some not: per-value counters, no layout label.
#[test]
fn heterogeneous_partitions_mi300x_node() {
    let mut spec = mi300x("spx_nps1");
    for gpu in 0..2 {
        spec = spec
            .with_gpu_partition(gpu, "cpx_nps4")
            .expect("valid partition");
    }
    assert_eq!(
        simulated(&spec),
        with_identity_of(
            22,
            &[
                ("amd.com/gpu.cu-count.38", "16"),
                ("amd.com/gpu.cu-count.304", "6"),
                ("beta.amd.com/gpu.cu-count.38", "16"),
                ("beta.amd.com/gpu.cu-count.304", "6"),
                ("amd.com/gpu.simd-count.152", "16"),
                ("amd.com/gpu.simd-count.1216", "6"),
                ("beta.amd.com/gpu.simd-count.152", "16"),
                ("beta.amd.com/gpu.simd-count.1216", "6"),
                ("amd.com/gpu.vram.24G", "16"),
                ("amd.com/gpu.vram.192G", "6"),
                ("beta.amd.com/gpu.vram.24G", "16"),
                ("beta.amd.com/gpu.vram.192G", "6"),
            ]
        )
    );
}

/// SR-IOV VFs in a guest: no product name (so no product-name labels), no
/// partition modes, no NUMA affinity.
#[test]
fn mi300x_vf_node() {
    let spec = SimSpec::new("mi300x-vf", None, None).expect("valid simulation");
    assert_eq!(
        simulated(&spec),
        table(&[
            ("amd.com/gpu.device-id", "74b5"),
            ("beta.amd.com/gpu.device-id", "74b5"),
            ("beta.amd.com/gpu.device-id.74b5", "8"),
            ("amd.com/gpu.family", "AI"),
            ("beta.amd.com/gpu.family", "AI"),
            ("beta.amd.com/gpu.family.AI", "8"),
            ("amd.com/gpu.driver-version", "6.12.12"),
            ("amd.com/gpu.compute-partitioning-supported", "false"),
            ("amd.com/gpu.memory-partitioning-supported", "false"),
        ])
        .into_iter()
        .chain(table(WHOLE_MI300X_SIZES))
        .collect()
    );
}

/// Two models on one node, one of them a VF without a product name.
#[test]
fn heterogeneous_models_node() {
    let gpu = |bdf: &str, device_id, name: &str, gib: u64, cus: u32, simds, gfx| Gpu {
        bdf: bdf.into(),
        device_id,
        product_name: Some(name.into()),
        vram_bytes: Some(gib << 30),
        cu_count: Some(cus),
        simd_count: Some(simds),
        gfx_target_version: Some(gfx),
        ..Gpu::default()
    };
    let mi210 = gpu(
        "0000:03:00.0",
        0x740f,
        "AMD Instinct MI210",
        64,
        104,
        416,
        90010,
    );
    let w7900 = gpu(
        "0000:23:00.0",
        0x7448,
        "AMD Radeon PRO W7900",
        48,
        96,
        192,
        110000,
    );
    let vf = Gpu {
        bdf: "0000:43:00.0".into(),
        device_id: 0x74b5,
        product_name: None,
        ..mi210.clone()
    };
    let inventory = Inventory {
        driver: DriverState {
            loaded: true,
            version: Some("6.10.5".into()),
            ..DriverState::default()
        },
        gpus: vec![mi210.clone(), mi210, w7900, vf],
        warnings: vec![],
    };
    assert_eq!(
        desired_labels(&inventory, &kinds()),
        table(&[
            ("amd.com/gpu.device-id.740f", "2"),
            ("amd.com/gpu.device-id.7448", "1"),
            ("amd.com/gpu.device-id.74b5", "1"),
            ("beta.amd.com/gpu.device-id.740f", "2"),
            ("beta.amd.com/gpu.device-id.7448", "1"),
            ("beta.amd.com/gpu.device-id.74b5", "1"),
            ("amd.com/gpu.family.AI", "3"),
            ("amd.com/gpu.family.GC_11_0_0", "1"),
            ("beta.amd.com/gpu.family.AI", "3"),
            ("beta.amd.com/gpu.family.GC_11_0_0", "1"),
            ("amd.com/gpu.product-name.AMD_Instinct_MI210", "2"),
            ("amd.com/gpu.product-name.AMD_Radeon_PRO_W7900", "1"),
            ("beta.amd.com/gpu.product-name.AMD_Instinct_MI210", "2"),
            ("beta.amd.com/gpu.product-name.AMD_Radeon_PRO_W7900", "1"),
            ("amd.com/gpu.cu-count.104", "3"),
            ("amd.com/gpu.cu-count.96", "1"),
            ("beta.amd.com/gpu.cu-count.104", "3"),
            ("beta.amd.com/gpu.cu-count.96", "1"),
            ("amd.com/gpu.simd-count.416", "3"),
            ("amd.com/gpu.simd-count.192", "1"),
            ("beta.amd.com/gpu.simd-count.416", "3"),
            ("beta.amd.com/gpu.simd-count.192", "1"),
            ("amd.com/gpu.vram.64G", "3"),
            ("amd.com/gpu.vram.48G", "1"),
            ("beta.amd.com/gpu.vram.64G", "3"),
            ("beta.amd.com/gpu.vram.48G", "1"),
            ("amd.com/gpu.driver-version", "6.10.5"),
            ("amd.com/gpu.compute-partitioning-supported", "false"),
            ("amd.com/gpu.memory-partitioning-supported", "false"),
        ])
    );
}

/// A host made of a KFD capture (`tests/fixtures/kfd/<name>.txt`) and the PCI
/// and DRM files the capture implies: one amdgpu PCI function per physical
/// GPU, with `modes` when partitioned, and an `amdgpu_xcp_N` device per
/// further partition.
fn captured(name: &str, modes: (&str, &str)) -> Inventory {
    let path = format!(
        "{}/tests/fixtures/kfd/{name}.txt",
        env!("CARGO_MANIFEST_DIR")
    );
    let text = std::fs::read_to_string(&path).expect("fixture is in the repository");
    let dir = tempfile::tempdir().expect("temporary directory");
    let host = HostRoot::new(dir.path());
    let topology_dir = crate::device::kfd::TOPOLOGY_DIR;
    for file in text.split('@').skip(1) {
        let (rel, body) = file.split_once('\n').expect("a path line");
        let body: String = body
            .lines()
            .filter(|l| !l.starts_with('#'))
            .map(|l| format!("{l}\n"))
            .collect();
        host.write(format!("{topology_dir}/{rel}"), body)
            .expect("fixture file");
    }
    host.write("/sys/module/amdgpu/version", "6.8.5\n")
        .expect("module version");
    let topology = crate::device::kfd::read_topology(&host, topology_dir);
    let (mut card, mut xcp) = (0, 0);
    let mut drm = |dir: &str, minor: u64| {
        for node in [format!("card{card}"), format!("renderD{minor}")] {
            host.write(format!("{dir}/drm/{node}/dev"), "226:0\n")
                .expect("drm node");
        }
        card += 1;
    };
    for gpu in topology.gpus() {
        let pci = format!("/sys/bus/pci/drivers/amdgpu/{}", gpu.bdf());
        let props = &gpu.primary().props;
        let mut files = vec![
            ("vendor", "0x1002".to_owned()),
            ("device", format!("0x{:04x}", props.device_id)),
            ("numa_node", "0".to_owned()),
        ];
        if gpu.nodes.len() > 1 {
            files.push(("current_compute_partition", modes.0.to_uppercase()));
            files.push(("current_memory_partition", modes.1.to_uppercase()));
        }
        for (file, value) in files {
            host.write(format!("{pci}/{file}"), format!("{value}\n"))
                .expect("pci attribute");
        }
        for (i, node) in gpu.nodes.iter().enumerate() {
            let minor = node
                .props
                .drm_render_minor
                .expect("capture has render minors");
            if i == 0 {
                drm(&pci, minor);
            } else {
                drm(&format!("/sys/devices/platform/amdgpu_xcp_{xcp}"), minor);
                xcp += 1;
            }
        }
    }
    crate::device::discover(&host)
}

/// Labels of the size kinds, and device-id, for a capture.
fn size_labels(inventory: &Inventory) -> BTreeMap<String, String> {
    desired_labels(
        inventory,
        &[
            LabelKind::CuCount,
            LabelKind::SimdCount,
            LabelKind::Vram,
            LabelKind::DeviceId,
        ],
    )
}

/// MI308X in CPX: 8 GPUs of 4 partitions, each 20 CUs and 48 GiB (one of each
/// GPU's four banks is 16 MiB short of 48 GiB and still rounds to 48G).
#[test]
fn mi308x_cpx_capture() {
    assert_eq!(
        size_labels(&captured("mi308-qpx", ("cpx", "nps1"))),
        table(&[
            ("amd.com/gpu.cu-count", "20"),
            ("beta.amd.com/gpu.cu-count", "20"),
            ("beta.amd.com/gpu.cu-count.20", "32"),
            ("amd.com/gpu.simd-count", "80"),
            ("beta.amd.com/gpu.simd-count", "80"),
            ("beta.amd.com/gpu.simd-count.80", "32"),
            ("amd.com/gpu.vram", "48G"),
            ("beta.amd.com/gpu.vram", "48G"),
            ("beta.amd.com/gpu.vram.48G", "32"),
            ("amd.com/gpu.device-id", "74a2"),
            ("beta.amd.com/gpu.device-id", "74a2"),
            ("beta.amd.com/gpu.device-id.74a2", "8"),
        ])
    );
}

/// MI300X in CPX: the capture lacks one partition's node (63 of 64) and every
/// memory bank, so there is no vram label, as the reference would write none.
#[test]
fn mi300x_cpx_capture() {
    assert_eq!(
        size_labels(&captured("mi300x-cpx", ("cpx", "nps4"))),
        table(&[
            ("amd.com/gpu.cu-count", "38"),
            ("beta.amd.com/gpu.cu-count", "38"),
            ("beta.amd.com/gpu.cu-count.38", "63"),
            ("amd.com/gpu.simd-count", "152"),
            ("beta.amd.com/gpu.simd-count", "152"),
            ("beta.amd.com/gpu.simd-count.152", "63"),
            ("amd.com/gpu.device-id", "74a1"),
            ("beta.amd.com/gpu.device-id", "74a1"),
            ("beta.amd.com/gpu.device-id.74a1", "8"),
        ])
    );
}

/// MI210: whole GPUs, one device each.
#[test]
fn mi210_capture() {
    assert_eq!(
        size_labels(&captured("mi210-xgmi-pcie", ("spx", "nps1"))),
        table(&[
            ("amd.com/gpu.cu-count", "104"),
            ("beta.amd.com/gpu.cu-count", "104"),
            ("beta.amd.com/gpu.cu-count.104", "8"),
            ("amd.com/gpu.simd-count", "416"),
            ("beta.amd.com/gpu.simd-count", "416"),
            ("beta.amd.com/gpu.simd-count.416", "8"),
            ("amd.com/gpu.device-id", "740f"),
            ("beta.amd.com/gpu.device-id", "740f"),
            ("beta.amd.com/gpu.device-id.740f", "8"),
        ])
    );
}

/// Partitions are the reference's devices only when it finds them: the GPU
/// must report both modes and a NUMA node other than -1.
#[test]
fn partitions_count_only_where_the_reference_finds_them() {
    let mut inventory = captured("mi308-qpx", ("cpx", "nps1"));
    let count = |inventory: &Inventory| {
        size_labels(inventory)
            .get("beta.amd.com/gpu.cu-count.20")
            .cloned()
    };
    assert_eq!(count(&inventory), Some("32".into()));
    inventory.gpus[0].numa_node = Some(-1);
    inventory.gpus[1].memory_partition = None;
    assert_eq!(count(&inventory), Some("26".into()));
}

/// vf-passthrough and pf-passthrough select the reference's reduced set.
/// (Which PCI functions a passthrough node counts is discovery's: it sees
/// amdgpu-bound GPUs only, so this shows the selection, not such a node.)
#[test]
fn passthrough_driver_types_get_the_reduced_set() {
    let inventory = captured("mi210-xgmi-pcie", ("spx", "nps1"));
    let labels = |driver_type: &str| {
        let mut spec = DeviceConfigSpec::default();
        spec.driver_mut().driver_type = driver_type.into();
        desired_labels(&inventory, &kinds_for(&spec))
    };
    let device_id = table(&[
        ("amd.com/gpu.device-id", "740f"),
        ("beta.amd.com/gpu.device-id", "740f"),
        ("beta.amd.com/gpu.device-id.740f", "8"),
    ]);
    let mut vf = device_id.clone();
    vf.insert("amd.com/gpu.driver-version".into(), "6.8.5".into());
    assert_eq!(labels("vf-passthrough"), vf);
    assert_eq!(labels("pf-passthrough"), device_id);
}
