//! KFD topology captured from physical machines (tests/fixtures/kfd, derived by
//! derive.py there) parses into the right GPUs, partitions, render minors, BDFs,
//! hives and link kinds.

use std::collections::BTreeSet;

use gpu_operator::device::LinkKind;
use gpu_operator::device::kfd::{self, KfdTopology};
use gpu_operator::host::HostRoot;

/// Writes a fixture's files under a temporary host root's KFD topology directory
/// and reads it back through the production parser.
fn load(name: &str) -> (tempfile::TempDir, KfdTopology) {
    let path = format!(
        "{}/tests/fixtures/kfd/{name}.txt",
        env!("CARGO_MANIFEST_DIR")
    );
    let text = std::fs::read_to_string(&path).expect("fixture exists");
    let dir = tempfile::tempdir().unwrap();
    let host = HostRoot::new(dir.path());
    let mut current: Option<(String, String)> = None;
    let flush = |entry: Option<(String, String)>| {
        if let Some((rel, body)) = entry {
            host.write(format!("{}/{rel}", kfd::TOPOLOGY_DIR), body)
                .unwrap();
        }
    };
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        if let Some(rel) = line.strip_prefix('@') {
            flush(current.take());
            current = Some((rel.to_owned(), String::new()));
        } else if let Some((_, body)) = current.as_mut() {
            body.push_str(line);
            body.push('\n');
        }
    }
    flush(current);
    let topology = kfd::read_topology(&host, kfd::TOPOLOGY_DIR);
    (dir, topology)
}

fn render_minors(gpu: &kfd::KfdGpu<'_>) -> Vec<u64> {
    gpu.nodes
        .iter()
        .map(|n| n.props.drm_render_minor.unwrap())
        .collect()
}

#[test]
fn mi300x_cpx_is_eight_gpus_of_eight_partitions_in_one_hive() {
    let (_dir, topology) = load("mi300x-cpx");
    assert!(topology.problems.is_empty(), "{:?}", topology.problems);
    // The capture holds 63 of the 64 GPU nodes: the last partition of the GPU at
    // bus 0xe5 (function 7, render minor 191) is missing from the published data.
    assert_eq!(topology.gpu_nodes().count(), 63);
    assert_eq!(topology.nodes.len() - 63, 2, "two CPU agents");
    let gpus = topology.gpus();
    assert_eq!(gpus.len(), 8);
    let bdfs: Vec<String> = gpus.iter().map(|g| g.bdf()).collect();
    assert_eq!(
        bdfs,
        [
            "0000:05:00.0",
            "0000:27:00.0",
            "0000:47:00.0",
            "0000:65:00.0",
            "0000:85:00.0",
            "0000:a7:00.0",
            "0000:c7:00.0",
            "0000:e5:00.0"
        ]
    );
    for (i, gpu) in gpus.iter().enumerate() {
        let partitions = if i == 7 { 7 } else { 8 };
        assert_eq!(gpu.nodes.len(), partitions, "{}", gpu.bdf());
        let first = 128 + 8 * i as u64;
        assert_eq!(
            render_minors(gpu),
            (first..first + partitions as u64).collect::<Vec<_>>()
        );
        // Partition functions are the low three bits of location_id.
        let functions: Vec<u64> = gpu.nodes.iter().map(|n| n.props.location_id & 7).collect();
        assert_eq!(functions, (0..partitions as u64).collect::<Vec<_>>());
        assert_eq!(
            gpu.cu_count(),
            Some(38 * partitions as u64),
            "38 CUs per CPX partition"
        );
    }
    let hives: BTreeSet<u64> = gpus.iter().map(|g| g.primary().props.hive_id).collect();
    assert_eq!(hives.len(), 1);
    // MEC and SDMA firmware, which the labeller falls back to without sysfs.
    for gpu in &gpus {
        assert_eq!(gpu.primary().props.fw_version, Some(177));
        assert_eq!(gpu.primary().props.sdma_fw_version, Some(24));
    }
    for gpu in &gpus {
        let links = topology.links_of(gpu);
        assert_eq!(links.len(), 7, "one link per peer GPU");
        assert!(links.iter().all(|l| l.kind == LinkKind::Xgmi));
        assert!(!links.iter().any(|l| l.to_bdf == gpu.bdf()));
    }
}

#[test]
fn mi308_qpx_is_eight_gpus_of_four_partitions() {
    let (_dir, topology) = load("mi308-qpx");
    let gpus = topology.gpus();
    assert_eq!(gpus.len(), 8);
    assert!(gpus.iter().all(|g| g.nodes.len() == 4));
    // Eight render minors are reserved per GPU; QPX uses the first four.
    assert_eq!(render_minors(&gpus[0]), [128, 129, 130, 131]);
    let all: BTreeSet<u64> = gpus.iter().flat_map(render_minors).collect();
    assert_eq!(all.len(), 32);
    assert_eq!(gpus[0].bdf(), "0000:0a:00.0");
    assert!(
        gpus.iter()
            .all(|g| g.primary().props.gfx_target_version == 90402)
    );
    assert!(gpus.iter().all(|g| g.primary().vram_bytes.is_some()));
}

#[test]
fn mi210_has_two_xgmi_hives_joined_by_pcie() {
    let (_dir, topology) = load("mi210-xgmi-pcie");
    let gpus = topology.gpus();
    assert_eq!(gpus.len(), 8);
    assert!(
        gpus.iter().all(|g| g.nodes.len() == 1),
        "MI210 is not partitioned"
    );
    let hives: BTreeSet<u64> = gpus.iter().map(|g| g.primary().props.hive_id).collect();
    assert_eq!(hives.len(), 2);
    for gpu in &gpus {
        let hive = gpu.primary().props.hive_id;
        let links = topology.links_of(gpu);
        assert_eq!(links.len(), 7, "{}: {links:?}", gpu.bdf());
        for link in &links {
            let peer = gpus.iter().find(|g| g.bdf() == link.to_bdf).unwrap();
            let expected = if peer.primary().props.hive_id == hive {
                LinkKind::Xgmi
            } else {
                LinkKind::Pcie
            };
            assert_eq!(link.kind, expected, "{} -> {}", gpu.bdf(), link.to_bdf);
        }
        // XGMI peers sort first.
        assert_eq!(links[0].kind, LinkKind::Xgmi);
    }
}

#[test]
fn single_gpu_capture_without_hive_or_gfx_version() {
    let (_dir, topology) = load("single-gpu");
    let gpus = topology.gpus();
    // Node 2 of this capture is a copy of node 1 with its own unique_id.
    assert_eq!(gpus.len(), 2);
    assert_eq!(gpus[0].bdf(), "0000:19:00.0");
    assert_eq!(render_minors(&gpus[0]), [128]);
    assert_eq!(render_minors(&gpus[1]), [129]);
    assert_eq!(gpus[0].primary().props.hive_id, 0);
    assert_eq!(gpus[0].primary().vram_bytes, Some(17163091968));
    assert_eq!(gpus[0].cu_count(), Some(64));
}

/// A simulated MI300X repartitioned to CPX the way the agent does it, by
/// writing `current_compute_partition` of each GPU (the simulated driver
/// answers), gives the KFD topology the real MI300X CPX machine has: the same
/// GPUs, render minors, partition functions, CUs per partition, hive and
/// links (its last partition, missing from the capture, aside).
#[test]
fn a_simulated_cpx_switch_matches_the_mi300x_cpx_capture() {
    use gpu_operator::host::AttrStore;
    use gpu_operator::simulate::{self, SimSpec, kernel::SimulatedKernel};

    let dir = tempfile::tempdir().unwrap();
    let host = HostRoot::new(dir.path());
    let spec = SimSpec::new("mi300x", None, None).unwrap();
    simulate::write_host(&host, &spec).unwrap();
    let driver = SimulatedKernel::new(host.clone());
    for bdf in simulate::gpu_addresses(&spec) {
        driver
            .store(
                &format!("/sys/bus/pci/devices/{bdf}/current_compute_partition"),
                "CPX\n",
            )
            .unwrap();
    }
    // The driver lays the partitions out once for the batch, as after any
    // sysfs write sequence the operator makes.
    driver.settle().unwrap();
    let simulated = kfd::read_topology(&host, kfd::TOPOLOGY_DIR);
    let (_captured_dir, captured) = load("mi300x-cpx");
    assert!(simulated.problems.is_empty(), "{:?}", simulated.problems);
    let (sim_gpus, real_gpus) = (simulated.gpus(), captured.gpus());
    assert_eq!(sim_gpus.len(), real_gpus.len());
    for (sim, real) in sim_gpus.iter().zip(&real_gpus) {
        assert_eq!(sim.bdf(), real.bdf());
        // The capture lacks the last partition of its last GPU.
        let shared = real.nodes.len();
        assert_eq!(sim.nodes.len(), 8, "{}", sim.bdf());
        assert_eq!(render_minors(sim)[..shared], render_minors(real)[..]);
        let functions = |g: &kfd::KfdGpu<'_>| -> Vec<u64> {
            g.nodes.iter().map(|n| n.props.location_id & 7).collect()
        };
        assert_eq!(functions(sim)[..shared], functions(real)[..]);
        let cus = |g: &kfd::KfdGpu<'_>| g.cu_count().map(|c| c / g.nodes.len() as u64);
        assert_eq!(cus(sim), cus(real), "CUs per partition of {}", sim.bdf());
        let ids: BTreeSet<u64> = sim.nodes.iter().map(|n| n.props.unique_id).collect();
        assert_eq!(ids.len(), 1, "partitions of one GPU share its unique_id");
        let peers = |t: &KfdTopology, g: &kfd::KfdGpu<'_>| -> Vec<(String, LinkKind)> {
            t.links_of(g)
                .iter()
                .map(|l| (l.to_bdf.clone(), l.kind))
                .collect()
        };
        assert_eq!(peers(&simulated, sim), peers(&captured, real));
    }
    let hives: BTreeSet<u64> = sim_gpus.iter().map(|g| g.primary().props.hive_id).collect();
    assert_eq!(hives.len(), 1);
}
