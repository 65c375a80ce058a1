//! Discovery end to end: simulated hosts of every profile round-trip through
//! `discover`, the CLI behaves as documented, bad sysfs never panics, and hotplug
//! arrives on the change stream.

use std::collections::BTreeSet;
use std::process::Command;
use std::time::Duration;

use gpu_operator::device::watch::{DeviceAction, DeviceWatch, WatchConfig};
use gpu_operator::device::{Inventory, LinkKind, discover};
use gpu_operator::host::HostRoot;
use gpu_operator::simulate::{self, SimSpec};

fn simulated(
    profile: &str,
    gpus: Option<usize>,
    partition: Option<&str>,
) -> (tempfile::TempDir, HostRoot) {
    let dir = tempfile::tempdir().unwrap();
    let host = HostRoot::new(dir.path());
    let spec = SimSpec::new(profile, gpus, partition).unwrap();
    simulate::write_host(&host, &spec).unwrap();
    (dir, host)
}

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_gpu-operator"))
}

#[test]
fn mi300x_cpx_nps4_through_the_cli() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("h");
    let status = bin()
        .args([
            "simulate",
            "--profile",
            "mi300x",
            "--partition",
            "cpx_nps4",
            "--out",
        ])
        .arg(&out)
        .status()
        .unwrap();
    assert!(status.success());
    let output = bin()
        .args(["discover", "--output", "json", "--host-root"])
        .arg(&out)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let inventory: Inventory = serde_json::from_slice(&output.stdout).unwrap();
    assert!(inventory.driver.loaded);
    assert_eq!(inventory.gpus.len(), 8);
    let hives: BTreeSet<_> = inventory.gpus.iter().map(|g| g.hive_id).collect();
    assert_eq!(hives.len(), 1);
    assert!(hives.iter().all(Option::is_some));
    for gpu in &inventory.gpus {
        assert_eq!(gpu.partitions.len(), 8, "{}", gpu.bdf);
        assert_eq!(gpu.partition_profile().as_deref(), Some("cpx_nps4"));
        assert!(gpu.problems.is_empty(), "{:?}", gpu.problems);
        assert_eq!(gpu.links.len(), 7);
        assert!(gpu.links.iter().all(|l| l.kind == LinkKind::Xgmi));
        for part in &gpu.partitions {
            assert!(part.card.is_some() && part.render_minor.is_some() && part.kfd_node.is_some());
        }
    }
    let minors: BTreeSet<u32> = inventory
        .gpus
        .iter()
        .flat_map(|g| g.partitions.iter().filter_map(|p| p.render_minor))
        .collect();
    assert_eq!(minors.len(), 64, "every partition has its own render node");

    // The JSON keeps the documented field names.
    let raw: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    for key in [
        "bdf",
        "vendor_id",
        "device_id",
        "product_name",
        "numa_node",
        "card",
        "render_minor",
        "kfd_node",
        "vram_bytes",
        "cu_count",
        "simd_count",
        "gfx_target_version",
        "hive_id",
        "unique_id",
        "compute_partition",
        "memory_partition",
        "available_compute_partitions",
        "available_memory_partitions",
        "partitions",
        "links",
        "problems",
    ] {
        assert!(raw["gpus"][0].get(key).is_some(), "missing {key}");
    }
    // And the table shows partitions beneath their GPU.
    let table = bin()
        .arg("discover")
        .arg("--host-root")
        .arg(&out)
        .output()
        .unwrap();
    let text = String::from_utf8(table.stdout).unwrap();
    assert_eq!(text.matches("partition ").count(), 64, "{text}");
}

#[test]
fn every_profile_round_trips() {
    struct Expect {
        profile: &'static str,
        partition: Option<&'static str>,
        gpus: usize,
        partitions_each: usize,
        hives: usize,
        product: Option<&'static str>,
        xgmi_links_each: usize,
    }
    let cases = [
        Expect {
            profile: "mi300x",
            partition: None,
            gpus: 8,
            partitions_each: 0,
            hives: 1,
            product: Some("AMD Instinct MI300X"),
            xgmi_links_each: 7,
        },
        Expect {
            profile: "mi300x",
            partition: Some("dpx_nps1"),
            gpus: 8,
            partitions_each: 2,
            hives: 1,
            product: Some("AMD Instinct MI300X"),
            xgmi_links_each: 7,
        },
        Expect {
            profile: "mi300x",
            partition: Some("qpx_nps4"),
            gpus: 8,
            partitions_each: 4,
            hives: 1,
            product: Some("AMD Instinct MI300X"),
            xgmi_links_each: 7,
        },
        Expect {
            profile: "mi250x",
            partition: None,
            gpus: 8,
            partitions_each: 0,
            hives: 1,
            product: Some("AMD Instinct MI250X"),
            xgmi_links_each: 7,
        },
        Expect {
            profile: "mi210",
            partition: None,
            gpus: 4,
            partitions_each: 0,
            hives: 2,
            product: Some("AMD Instinct MI210"),
            xgmi_links_each: 1,
        },
        Expect {
            profile: "radeon-w7900",
            partition: None,
            gpus: 1,
            partitions_each: 0,
            hives: 0,
            product: Some("AMD Radeon PRO W7900"),
            xgmi_links_each: 0,
        },
        Expect {
            profile: "mi300x-vf",
            partition: None,
            gpus: 8,
            partitions_each: 0,
            hives: 0,
            product: None,
            xgmi_links_each: 0,
        },
    ];
    for case in cases {
        let (_dir, host) = simulated(case.profile, None, case.partition);
        let inv = discover(&host);
        let what = format!("{} {:?}", case.profile, case.partition);
        assert!(inv.warnings.is_empty(), "{what}: {:?}", inv.warnings);
        assert_eq!(inv.gpus.len(), case.gpus, "{what}");
        let hives: BTreeSet<u64> = inv.gpus.iter().filter_map(|g| g.hive_id).collect();
        assert_eq!(hives.len(), case.hives, "{what}");
        for gpu in &inv.gpus {
            assert!(gpu.problems.is_empty(), "{what}: {:?}", gpu.problems);
            assert_eq!(gpu.partitions.len(), case.partitions_each, "{what}");
            assert_eq!(gpu.product_name.as_deref(), case.product, "{what}");
            assert_eq!(gpu.vendor_id, 0x1002);
            assert!(
                gpu.card.is_some() && gpu.render_minor.is_some() && gpu.kfd_node.is_some(),
                "{what}"
            );
            assert!(gpu.cu_count.is_some() && gpu.vram_bytes.is_some(), "{what}");
            let xgmi = gpu
                .links
                .iter()
                .filter(|l| l.kind == LinkKind::Xgmi)
                .count();
            assert_eq!(xgmi, case.xgmi_links_each, "{what}: {:?}", gpu.links);
            assert_eq!(
                gpu.links.len(),
                case.gpus - 1,
                "{what}: a link to every peer"
            );
        }
    }
}

#[test]
fn partitionable_gpus_report_their_modes() {
    let (_dir, host) = simulated("mi300x", Some(2), Some("cpx_nps4"));
    let gpu = &discover(&host).gpus[0];
    assert_eq!(gpu.compute_partition.as_deref(), Some("cpx"));
    assert_eq!(gpu.memory_partition.as_deref(), Some("nps4"));
    assert_eq!(
        gpu.available_compute_partitions,
        ["spx", "dpx", "qpx", "cpx"]
    );
    assert_eq!(gpu.available_memory_partitions, ["nps1", "nps4"]);
    assert_eq!(gpu.numa_node, Some(0));
    assert_eq!(gpu.cu_count, Some(304));
    let (_dir, host) = simulated("mi210", None, None);
    assert!(!discover(&host).gpus[0].supports_compute_partitioning());
}

#[test]
fn a_heterogeneous_node_keeps_each_gpus_layout() {
    let dir = tempfile::tempdir().unwrap();
    let host = HostRoot::new(dir.path());
    let spec = SimSpec::new("mi300x", Some(3), Some("spx_nps1"))
        .unwrap()
        .with_gpu_partition(1, "cpx_nps4")
        .unwrap();
    simulate::write_host(&host, &spec).unwrap();
    let inv = discover(&host);
    assert!(inv.warnings.is_empty(), "{:?}", inv.warnings);
    let layouts: Vec<(Option<String>, usize)> = inv
        .gpus
        .iter()
        .map(|g| (g.partition_profile(), g.partitions.len()))
        .collect();
    assert_eq!(
        layouts,
        [
            (Some("spx_nps1".into()), 0),
            (Some("cpx_nps4".into()), 8),
            (Some("spx_nps1".into()), 0)
        ]
    );
    assert!(
        inv.gpus
            .iter()
            .all(|g| g.problems.is_empty() && g.cu_count == Some(304))
    );
    assert!(
        SimSpec::new("mi300x", Some(3), None)
            .unwrap()
            .with_gpu_partition(3, "cpx_nps4")
            .is_err()
    );
}

#[test]
fn vf_without_product_name_and_numa_minus_one_is_kept() {
    let (_dir, host) = simulated("mi300x-vf", Some(1), None);
    let gpu = &discover(&host).gpus[0];
    assert_eq!(gpu.product_name, None);
    assert_eq!(gpu.numa_node, Some(-1));
    assert_eq!(gpu.device_id, 0x74b5);
}

#[test]
fn partition_nodes_under_the_dotted_xcp_spelling_are_found() {
    let dir = tempfile::tempdir().unwrap();
    let host = HostRoot::new(dir.path());
    let mut spec = SimSpec::new("mi300x", Some(1), Some("cpx_nps1")).unwrap();
    spec.xcp_dot_spelling = true;
    simulate::write_host(&host, &spec).unwrap();
    assert!(host.exists("/sys/devices/platform/amdgpu_xcp.0/drm"));
    let gpu = &discover(&host).gpus[0];
    let cards: Vec<Option<u32>> = gpu.partitions.iter().map(|p| p.card).collect();
    assert_eq!(cards, (0..8).map(Some).collect::<Vec<_>>());
    // Partitions after the first are named by their platform device, as the
    // device plugin's IDs and the exporter's pod matching need.
    let platform: Vec<Option<String>> = gpu
        .partitions
        .iter()
        .map(|p| p.platform_device.clone())
        .collect();
    let expected: Vec<Option<String>> = std::iter::once(None)
        .chain((0..7).map(|i| Some(format!("amdgpu_xcp.{i}"))))
        .collect();
    assert_eq!(platform, expected);
    let names = gpu_operator::plugin::devices::xcp_names_of(&discover(&host));
    assert_eq!(names.get(&129).map(String::as_str), Some("amdgpu_xcp.0"));
    assert_eq!(names.len(), 7);
}

#[test]
fn empty_root_has_no_gpus_and_exits_zero() {
    let dir = tempfile::tempdir().unwrap();
    let output = bin()
        .args(["discover", "--output", "json", "--host-root"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(output.status.success());
    let inv: Inventory = serde_json::from_slice(&output.stdout).unwrap();
    assert!(inv.gpus.is_empty());
    assert!(!inv.driver.loaded);
}

#[test]
fn missing_root_is_a_one_line_error_naming_the_path() {
    let output = bin()
        .args(["discover", "--host-root", "/nonexistent/gpu-operator-root"])
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8(output.stderr).unwrap();
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains("/nonexistent/gpu-operator-root"),
        "{stderr}"
    );
}

#[test]
fn without_the_driver_no_gpu_is_bound() {
    let dir = tempfile::tempdir().unwrap();
    let host = HostRoot::new(dir.path());
    let mut spec = SimSpec::new("mi300x", None, None).unwrap();
    spec.driver_loaded = false;
    simulate::write_host(&host, &spec).unwrap();
    let inv = discover(&host);
    assert!(!inv.driver.loaded && !inv.driver.kfd_present);
    assert!(inv.gpus.is_empty());
    assert!(host.exists("/sys/bus/pci/devices/0000:05:00.0/vendor"));
}

#[test]
fn simulate_refuses_a_directory_it_did_not_write() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("notes.txt"), "mine").unwrap();
    let output = bin()
        .args(["simulate", "--profile", "mi210", "--out"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("refusing"));
    assert!(dir.path().join("notes.txt").exists());
}

// ---- bad input -------------------------------------------------------------

const GPU0: &str = "/sys/devices/pci0000:00/0000:05:00.0";

#[test]
fn non_numeric_and_missing_values_become_problems() {
    let (_dir, host) = simulated("mi300x", Some(2), None);
    host.write(format!("{GPU0}/numa_node"), "banana\n").unwrap();
    host.write(format!("{GPU0}/revision"), "\n").unwrap();
    host.remove_all(format!("{GPU0}/drm")).unwrap();
    let inv = discover(&host);
    assert_eq!(inv.gpus.len(), 2);
    let gpu = &inv.gpus[0];
    assert_eq!(gpu.numa_node, None);
    assert!(
        gpu.problems.iter().any(|p| p.contains("numa_node")),
        "{:?}",
        gpu.problems
    );
    assert!(
        gpu.problems.iter().any(|p| p.contains("drm")),
        "{:?}",
        gpu.problems
    );
    // KFD still knows the render node.
    assert_eq!(gpu.render_minor, Some(128));
    assert!(inv.gpus[1].problems.is_empty());
}

#[test]
fn firmware_versions_come_from_sysfs_with_kfd_as_fallback() {
    let (_dir, host) = simulated("mi300x", Some(2), None);
    let inv = discover(&host);
    let firmware = &inv.gpus[0].firmware;
    assert_eq!(firmware.get("MEC"), Some(&177));
    assert_eq!(firmware.get("SDMA0"), Some(&24));
    assert_eq!(firmware.get("SMC"), Some(&0x0055_7100));
    assert_eq!(firmware.get("VCE"), Some(&0), "absent engines read 0");
    assert_eq!(firmware.len(), 10, "{firmware:?}");

    // Without fw_version/ (older kernels), KFD still knows MEC and SDMA.
    host.remove_all(format!("{GPU0}/fw_version")).unwrap();
    // A garbled file costs its own value only.
    let gpu1 = GPU0.replace("0000:05:00.0", &inv.gpus[1].bdf);
    host.write(format!("{gpu1}/fw_version/smc_fw_version"), "soon\n")
        .unwrap();
    let inv = discover(&host);
    let kfd_only: Vec<(&str, u32)> = inv.gpus[0]
        .firmware
        .iter()
        .map(|(k, v)| (k.as_str(), *v))
        .collect();
    assert_eq!(kfd_only, [("MEC", 177), ("SDMA0", 24)]);
    assert!(
        inv.gpus[0].problems.is_empty(),
        "{:?}",
        inv.gpus[0].problems
    );
    assert_eq!(inv.gpus[1].firmware.get("SMC"), None);
    assert_eq!(inv.gpus[1].firmware.get("MEC"), Some(&177));
    assert!(
        inv.gpus[1]
            .problems
            .iter()
            .any(|p| p.contains("smc_fw_version")),
        "{:?}",
        inv.gpus[1].problems
    );
}

#[test]
fn truncated_kfd_properties_cost_only_their_values() {
    let (_dir, host) = simulated("mi300x", Some(2), None);
    let props = "/sys/class/kfd/kfd/topology/nodes/2/properties";
    let text = host.read_string(props).unwrap();
    host.write(props, &text[..text.len() / 3]).unwrap();
    let inv = discover(&host);
    assert_eq!(inv.gpus.len(), 2);
    assert!(inv.gpus.iter().all(|g| g.bdf.len() == 12));
}

#[test]
fn a_gpu_that_vanished_mid_scan_is_skipped_with_a_warning() {
    let (_dir, host) = simulated("mi300x", Some(2), None);
    // The driver's link is still listed, but the device directory is gone.
    host.remove_all(GPU0).unwrap();
    let inv = discover(&host);
    assert_eq!(inv.gpus.len(), 1);
    assert!(
        inv.warnings.iter().any(|w| w.contains("0000:05:00.0")),
        "{:?}",
        inv.warnings
    );
}

#[test]
fn symlink_loops_do_not_hang_or_panic() {
    let (dir, host) = simulated("mi300x", Some(2), None);
    let link = dir.path().join("sys/bus/pci/drivers/amdgpu/0000:05:00.0");
    std::fs::remove_file(&link).unwrap();
    std::os::unix::fs::symlink("0000:05:00.0", &link).unwrap();
    let kfd_loop = dir
        .path()
        .join("sys/class/kfd/kfd/topology/nodes/2/io_links/0");
    std::fs::remove_dir_all(&kfd_loop).unwrap();
    std::os::unix::fs::symlink("0", &kfd_loop).unwrap();
    let inv = discover(&host);
    assert_eq!(inv.gpus.len(), 1);
    assert!(
        inv.warnings.iter().any(|w| w.contains("0000:05:00.0")),
        "{:?}",
        inv.warnings
    );
}

mod corruption {
    //! Property: corrupting the files of one GPU never panics discovery, never
    //! changes what is reported for the other GPUs, and leaves the corrupted GPU
    //! either reported or skipped with a warning that names it, never dropped
    //! silently. (Which values turn into problems is covered by the tests above:
    //! garbage can look like a valid value.)
    use super::*;
    use proptest::prelude::*;

    #[derive(Clone, Debug)]
    enum Damage {
        Delete,
        Garbage(String),
        Truncate(usize),
        Empty,
    }

    fn damage() -> impl Strategy<Value = Damage> {
        prop_oneof![
            Just(Damage::Delete),
            "[ -~]{0,12}".prop_map(Damage::Garbage),
            (0usize..8).prop_map(Damage::Truncate),
            Just(Damage::Empty),
        ]
    }

    const ATTRS: &[&str] = &[
        "vendor",
        "device",
        "revision",
        "subsystem_vendor",
        "subsystem_device",
        "numa_node",
        "product_name",
        "unique_id",
        "current_compute_partition",
        "available_compute_partition",
        "current_memory_partition",
        "available_memory_partition",
        "mem_info_vram_total",
    ];

    fn apply(host: &HostRoot, path: &str, damage: &Damage) {
        match damage {
            Damage::Delete => host.remove_all(path).unwrap(),
            Damage::Garbage(text) => host.write(path, text).unwrap(),
            Damage::Truncate(n) => {
                let text = host.read_string(path).unwrap_or_default();
                host.write(path, &text[..(*n).min(text.len())]).unwrap();
            }
            Damage::Empty => host.write(path, "").unwrap(),
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 48, .. ProptestConfig::default() })]

        #[test]
        fn damaging_one_gpu_leaves_the_others_alone(
            hits in proptest::collection::vec((0..ATTRS.len(), damage()), 1..5),
            kfd_hits in proptest::collection::vec((0u32..8, damage()), 0..3),
        ) {
            let (_dir, host) = simulated("mi300x", Some(2), Some("dpx_nps1"));
            let baseline = discover(&host);
            for (attr, damage) in &hits {
                apply(&host, &format!("{GPU0}/{}", ATTRS[*attr]), damage);
            }
            // KFD nodes 2 and 3 are the partitions of GPU 0; io_links of its first node.
            for (index, damage) in &kfd_hits {
                let path = match index {
                    0 => "/sys/class/kfd/kfd/topology/nodes/2/properties".to_owned(),
                    1 => "/sys/class/kfd/kfd/topology/nodes/3/properties".to_owned(),
                    n => format!("/sys/class/kfd/kfd/topology/nodes/2/io_links/{n}/properties"),
                };
                apply(&host, &path, damage);
            }
            let damaged = discover(&host);
            let other = |inv: &Inventory| inv.gpus.iter().find(|g| g.bdf == "0000:27:00.0").cloned();
            let (before, after) = (other(&baseline).unwrap(), other(&damaged).unwrap());
            // Links of the other GPU may lose the damaged peer; everything else is intact.
            prop_assert_eq!(
                gpu_operator::device::Gpu { links: vec![], ..before },
                gpu_operator::device::Gpu { links: vec![], ..after }
            );
            let reported = damaged.gpus.iter().any(|g| g.bdf == "0000:05:00.0");
            let warned = damaged.warnings.iter().any(|w| w.contains("0000:05:00.0"));
            prop_assert!(reported || warned, "skipped silently: {:?}", damaged.warnings);
        }
    }
}

// ---- hotplug ---------------------------------------------------------------

/// A simulated host with a fast-rescanning watch on it.
async fn watched_host(spec: SimSpec) -> (tempfile::TempDir, HostRoot, DeviceWatch) {
    let dir = tempfile::tempdir().unwrap();
    let host = HostRoot::new(dir.path());
    simulate::write_host(&host, &spec).unwrap();
    let config = WatchConfig {
        rescan_interval: Duration::from_millis(50),
        use_udev: false,
        ..WatchConfig::default()
    };
    let watch = DeviceWatch::start(host.clone(), config).await;
    (dir, host, watch)
}

#[tokio::test]
async fn hotplug_arrives_on_the_change_stream() {
    let (_dir, host, watch) = watched_host(SimSpec::new("mi210", Some(2), None).unwrap()).await;
    let mut events = watch.subscribe();
    let mut inventory = watch.inventory();
    assert_eq!(inventory.borrow().gpus.len(), 2);

    simulate::write_host(&host, &SimSpec::new("mi210", Some(3), None).unwrap()).unwrap();
    let added = next_event(&mut events, DeviceAction::Added, "0000:43:00.0").await;
    assert_eq!(added.action, DeviceAction::Added);
    tokio::time::timeout(
        Duration::from_secs(5),
        inventory.wait_for(|inv| inv.gpus.len() == 3),
    )
    .await
    .expect("inventory updated")
    .unwrap();

    simulate::write_host(&host, &SimSpec::new("mi210", Some(2), None).unwrap()).unwrap();
    let removed = next_event(&mut events, DeviceAction::Removed, "0000:43:00.0").await;
    assert_eq!(removed.action, DeviceAction::Removed);
}

#[tokio::test]
async fn repartitioning_is_a_change_event() {
    let (_dir, host, watch) = watched_host(SimSpec::new("mi300x", Some(1), None).unwrap()).await;
    let mut events = watch.subscribe();
    // Through the simulated driver, as a real repartition goes: writing the
    // whole host again would take the GPU away for the rewrite's length,
    // and a scan in that window rightly sees it removed and added.
    let kernel = simulate::kernel::store_for(&host);
    for (attr, mode) in [
        ("current_compute_partition", "CPX"),
        ("current_memory_partition", "NPS4"),
    ] {
        let path = format!("/sys/bus/pci/devices/0000:05:00.0/{attr}");
        kernel.store(&path, mode).unwrap();
    }
    kernel.settle().unwrap();
    let changed = next_event(&mut events, DeviceAction::Changed, "0000:05:00.0").await;
    assert_eq!(changed.action, DeviceAction::Changed);
    let mut inventory = watch.inventory();
    tokio::time::timeout(
        Duration::from_secs(5),
        inventory.wait_for(|inv| inv.gpus.first().is_some_and(|g| g.partitions.len() == 8)),
    )
    .await
    .expect("partitions published")
    .unwrap();
}

/// Waits for the first event of the given kind about the GPU at `bdf`,
/// skipping transient ones seen while the simulator rewrites the tree:
/// `write_host` clears every GPU before it writes them again, which no
/// kernel does, so a scan in between may see the others go and come back.
async fn next_event(
    events: &mut tokio::sync::broadcast::Receiver<gpu_operator::device::watch::DeviceEvent>,
    action: DeviceAction,
    bdf: &str,
) -> gpu_operator::device::watch::DeviceEvent {
    tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            let event = events.recv().await.expect("stream open");
            if event.action == action && event.bdf == bdf {
                return event;
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("no {action:?} event of {bdf} within 5 s"))
}
