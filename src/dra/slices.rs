//! The node's ResourceSlices: the devices of [`super::devices`] and the
//! counter sets of [`super::layouts`] cut into slices at the API's limits,
//! one pool named after the node; the taints devices carry (unhealthy, a
//! layout's conflict); the comparison with what the API server stored; and
//! the slices' names.
//!
//! Pure: devices and health come in as plain data. It must not publish
//! (the service does) nor decide what a device is (`devices` does).

use std::collections::BTreeMap;

use k8s_openapi::api::resource::v1::{
    CounterSet, Device, DeviceTaint, ResourcePool, ResourceSliceSpec,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use super::devices::{DRIVER_NAME, DraDevice, quantity_value, shared_capacity};
use super::layouts;
use crate::api::TimeSlicing;

/// The API's limit on devices in one ResourceSlice.
pub const MAX_DEVICES_PER_SLICE: usize = 128;
/// The API's limit on counter sets in one ResourceSlice.
pub const MAX_COUNTER_SETS_PER_SLICE: usize = 8;
/// The API's lower limit for a slice in which any device has taints; slices
/// are cut at it whenever taints are enabled, so that a device turning
/// unhealthy never reshapes them.
pub const MAX_DEVICES_PER_SLICE_WITH_TAINTS: usize = 64;
/// The taint an unhealthy device carries (KEP-5055) when taints are enabled.
pub const UNHEALTHY_TAINT_KEY: &str = "gpu.amd.com/unhealthy";

/// The unhealthy devices by name, each with its reason.
pub type Unhealthy = BTreeMap<String, String>;

/// The specs of the node's ResourceSlices: one pool named after the node, at
/// most [`MAX_DEVICES_PER_SLICE`] devices per slice (with `taints`,
/// [`MAX_DEVICES_PER_SLICE_WITH_TAINTS`]), all slices at
/// `generation`. A node with no devices still publishes one empty slice, so
/// that the scheduler sees the pool and knows it is empty rather than unknown.
/// With `taints`, an unhealthy device carries [`UNHEALTHY_TAINT_KEY`]
/// (`NoSchedule`). Layout devices ([`super::layouts`]) bring their GPUs'
/// counter sets, published first in slices of their own (at most
/// [`MAX_COUNTER_SETS_PER_SLICE`] each), and cut the device slices at the
/// lower limit too; a layout device that cannot be had carries
/// [`layouts::CONFLICT_TAINT_KEY`] (`NoExecute`) whatever `taints` says.
pub fn slice_specs(
    node: &str,
    devices: &[DraDevice],
    unhealthy: &Unhealthy,
    taints: bool,
    sharing: &TimeSlicing,
    generation: i64,
) -> Vec<ResourceSliceSpec> {
    let counter_sets = layouts::counter_sets(devices.iter().filter_map(|d| d.layout.as_ref()));
    let per_slice = if taints || !counter_sets.is_empty() {
        MAX_DEVICES_PER_SLICE_WITH_TAINTS
    } else {
        MAX_DEVICES_PER_SLICE
    };
    let chunks: Vec<&[DraDevice]> = if devices.is_empty() {
        vec![&[]]
    } else {
        devices.chunks(per_slice).collect()
    };
    // Counter sets go in slices of their own (the API takes devices or
    // counter sets in a slice, not both), in the same pool.
    let set_chunks: Vec<&[CounterSet]> = counter_sets.chunks(MAX_COUNTER_SETS_PER_SLICE).collect();
    let pool = ResourcePool {
        name: node.to_owned(),
        generation,
        resource_slice_count: (chunks.len() + set_chunks.len()) as i64,
    };
    let counters = set_chunks.into_iter().map(|sets| ResourceSliceSpec {
        driver: DRIVER_NAME.to_owned(),
        node_name: Some(node.to_owned()),
        pool: pool.clone(),
        shared_counters: Some(sets.to_vec()),
        ..ResourceSliceSpec::default()
    });
    let devices = chunks.into_iter().map(|chunk| ResourceSliceSpec {
        driver: DRIVER_NAME.to_owned(),
        node_name: Some(node.to_owned()),
        pool: pool.clone(),
        devices: Some(
            chunk
                .iter()
                .map(|d| api_device(d, unhealthy.get(&d.name), taints, sharing))
                .collect(),
        ),
        ..ResourceSliceSpec::default()
    });
    counters.chain(devices).collect()
}

fn api_device(
    device: &DraDevice,
    unhealthy: Option<&String>,
    taints: bool,
    sharing: &TimeSlicing,
) -> Device {
    let mut all = Vec::new();
    if taints && unhealthy.is_some() {
        all.push(DeviceTaint {
            key: UNHEALTHY_TAINT_KEY.to_owned(),
            value: None,
            effect: "NoSchedule".to_owned(),
            time_added: None,
        });
    }
    if let Some(mode) = &device.conflict {
        all.push(DeviceTaint {
            key: layouts::CONFLICT_TAINT_KEY.to_owned(),
            value: Some(mode.clone()),
            effect: "NoExecute".to_owned(),
            time_added: None,
        });
    }
    let taints = (!all.is_empty()).then_some(all);
    if let Some(layout) = &device.layout {
        // A layout's shares are its partitions; time-slicing does not apply.
        return Device {
            name: device.name.clone(),
            attributes: Some(device.attributes.clone()),
            capacity: Some(device.capacity.clone()),
            allow_multiple_allocations: (layout.partitions > 1).then_some(true),
            consumes_counters: Some(vec![layouts::consumption(layout)]),
            taints,
            ..Device::default()
        };
    }
    Device {
        name: device.name.clone(),
        attributes: Some(device.attributes.clone()),
        capacity: Some(shared_capacity(device, sharing)),
        allow_multiple_allocations: sharing.is_shared().then_some(true),
        taints,
        ..Device::default()
    }
}

/// Whether two slice specs publish the same thing. The pool generation is
/// left out (it is ours to bump), and so is each taint's `timeAdded`, which
/// the API server fills in; quantities compare by value, since the server
/// stores them in canonical form (`206158430208` comes back as `192Gi`).
pub fn same_content(a: &ResourceSliceSpec, b: &ResourceSliceSpec) -> bool {
    let strip = |s: &ResourceSliceSpec| {
        let mut s = s.clone();
        s.pool.generation = 0;
        for device in s.devices.iter_mut().flatten() {
            let canonical = |q: &mut Quantity| {
                if let Some(value) = quantity_value(&q.0) {
                    *q = Quantity(value.to_string());
                }
            };
            for capacity in device.capacity.iter_mut().flat_map(|c| c.values_mut()) {
                canonical(&mut capacity.value);
                if let Some(policy) = capacity.request_policy.as_mut() {
                    policy.default.iter_mut().for_each(canonical);
                    if let Some(range) = policy.valid_range.as_mut() {
                        canonical(&mut range.min);
                        range.max.iter_mut().for_each(canonical);
                        range.step.iter_mut().for_each(canonical);
                    }
                    policy.valid_values.iter_mut().flatten().for_each(canonical);
                }
            }
            for taint in device.taints.iter_mut().flatten() {
                taint.time_added = None;
            }
            if device.taints.as_ref().is_some_and(Vec::is_empty) {
                device.taints = None;
            }
        }
        s
    };
    strip(a) == strip(b)
}

/// The name of the node's `index`th slice: `<node>-gpu.amd.com-<index>`,
/// shortened with a hash of the node name when that would pass the API's
/// 253 characters.
pub fn slice_name(node: &str, index: usize) -> String {
    let suffix = format!("-{DRIVER_NAME}-{index}");
    if node.len() + suffix.len() <= 253 {
        return format!("{node}{suffix}");
    }
    let hash = node.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    let keep = 253 - suffix.len() - 17;
    let head = node[..keep].trim_end_matches(['-', '.']);
    format!("{head}-{hash:016x}{suffix}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::{Gpu, Partition};
    use crate::dra::devices::tests::{attr, gpu, inventory};
    use crate::dra::devices::{DRIVER_VERSION_RAW, PcieRoots, devices_of, layout_devices_of};

    /// Layouts of sixteen GPUs: 48 devices and 16 counter sets, cut as the
    /// API wants them (counter sets and devices never in one slice, at
    /// most 8 sets and 64 devices per slice), one pool count over all.
    #[test]
    fn layouts_bring_counter_slices_cut_at_the_apis_limits() {
        let mut gpus: Vec<Gpu> = (0..16)
            .map(|i| gpu(&format!("0000:{:02x}:00.0", 0x10 + i), i, 128 + i))
            .collect();
        // One that cannot be partitioned is offered as it is.
        gpus[15].available_compute_partitions.clear();
        let devices = layout_devices_of(&inventory(gpus), &PcieRoots::new());
        let layouts = devices.iter().filter(|d| d.layout.is_some()).count();
        assert_eq!(layouts, 15 * 3, "spx-nps1, cpx-nps1 and cpx-nps4 of each");
        assert!(devices.iter().any(|d| d.name == "gpu-15-143"));
        assert!(devices.iter().any(|d| d.name == "gpu-14-cpx-nps4"));
        let specs = slice_specs(
            "n",
            &devices,
            &Unhealthy::new(),
            false,
            &TimeSlicing::default(),
            2,
        );
        let sets: Vec<usize> = specs
            .iter()
            .filter_map(|s| s.shared_counters.as_ref().map(Vec::len))
            .collect();
        assert_eq!(sets, [8, 7]);
        let sizes: Vec<usize> = specs
            .iter()
            .filter_map(|s| s.devices.as_ref().map(Vec::len))
            .collect();
        assert_eq!(sizes, [46], "at most 64 per slice");
        assert!(
            specs
                .iter()
                .all(|s| s.devices.is_none() || s.shared_counters.is_none())
        );
        assert!(specs.iter().all(|s| s.pool.resource_slice_count == 3));
        let cpx = specs
            .iter()
            .flat_map(|s| s.devices.iter().flatten())
            .find(|d| d.name == "gpu-3-cpx-nps1")
            .unwrap();
        assert_eq!(cpx.allow_multiple_allocations, Some(true));
        let consumes = cpx.consumes_counters.as_ref().unwrap();
        assert_eq!(consumes[0].counter_set, "gpu-3-mutex");
        let spx = specs
            .iter()
            .flat_map(|s| s.devices.iter().flatten())
            .find(|d| d.name == "gpu-3-spx-nps1")
            .unwrap();
        assert_eq!(
            spx.allow_multiple_allocations, None,
            "one allocation takes it"
        );
        // A layout in conflict carries AutoPartition's taint.
        let mut conflicted = devices.clone();
        conflicted[0].conflict = Some("nps1".into());
        let specs = slice_specs(
            "n",
            &conflicted,
            &Unhealthy::new(),
            false,
            &TimeSlicing::default(),
            3,
        );
        let taint = &specs[2].devices.as_ref().unwrap()[0]
            .taints
            .as_ref()
            .unwrap()[0];
        assert_eq!(
            (
                taint.key.as_str(),
                taint.value.as_deref(),
                taint.effect.as_str()
            ),
            (layouts::CONFLICT_TAINT_KEY, Some("nps1"), "NoExecute")
        );
    }

    /// An MI300X-like GPU `index` in `compute`/`memory` mode, its partitions
    /// numbered after the GPUs' own DRM nodes.
    fn gpu_in(index: u32, compute: &str, memory: &str) -> Gpu {
        let count = match compute {
            "spx" => 1,
            "dpx" => 2,
            "qpx" => 4,
            _ => 8,
        };
        let mut g = gpu(
            &format!("0000:{:02x}:00.0", 0x10 + index),
            1 + index * 8,
            128 + index * 8,
        );
        g.numa_node = Some((index / 4) as i32);
        g.compute_partition = Some(compute.into());
        g.memory_partition = Some(memory.into());
        g.available_compute_partitions = ["spx", "dpx", "qpx", "cpx"].map(String::from).to_vec();
        if count > 1 {
            g.partitions = (0..count)
                .map(|i| Partition {
                    id: i,
                    card: Some(1 + index * 8 + i),
                    render_minor: Some(128 + index * 8 + i),
                    ..Partition::default()
                })
                .collect();
        }
        g
    }

    /// Issue 34: the published slices pass the 1.37 API server's validation
    /// at 8 GPUs in every layout, and in all of them mixed, with the worst
    /// case of everything on: every device tainted, shared with request
    /// policies, and AMD's four-part driver version.
    #[test]
    fn slices_pass_the_servers_validation_at_8_gpus_in_every_layout() {
        let roots: PcieRoots = (0..8)
            .map(|i| {
                (
                    format!("0000:{:02x}:00.0", 0x10 + i),
                    format!("pci0000:{:02x}", i * 0x20),
                )
            })
            .collect();
        let mut layouts: Vec<Vec<(&str, &str)>> = [
            ("spx", "nps1"),
            ("dpx", "nps1"),
            ("qpx", "nps1"),
            ("cpx", "nps1"),
            ("qpx", "nps4"),
            ("cpx", "nps4"),
        ]
        .into_iter()
        .map(|l| vec![l; 8])
        .collect();
        layouts.push(
            [
                ("spx", "nps1"),
                ("dpx", "nps1"),
                ("qpx", "nps1"),
                ("cpx", "nps1"),
            ]
            .into_iter()
            .cycle()
            .take(8)
            .collect(),
        );
        for layout in layouts {
            let gpus: Vec<Gpu> = layout
                .iter()
                .enumerate()
                .map(|(i, (c, m))| gpu_in(i as u32, c, m))
                .collect();
            let mut inv = inventory(gpus);
            inv.driver.version = Some("6.19.14.31400000".into());
            inv.driver.srcversion = Some("0123456789ABCDEF01234567".into());
            let devices = devices_of(&inv, &roots);
            let expected: usize = layout
                .iter()
                .map(|(c, _)| match *c {
                    "spx" => 1,
                    "dpx" => 2,
                    "qpx" => 4,
                    _ => 8,
                })
                .sum();
            assert_eq!(devices.len(), expected, "{layout:?}");
            let sick: Unhealthy = devices
                .iter()
                .map(|d| (d.name.clone(), "ECC".to_string()))
                .collect();
            let sharing = TimeSlicing {
                replicas: 4,
                ..TimeSlicing::default()
            };
            for (unhealthy, taints, sharing) in [
                (&sick, true, sharing),
                (&Unhealthy::new(), false, TimeSlicing::default()),
            ] {
                let specs = slice_specs("gpu-node-1", &devices, unhealthy, taints, &sharing, 3);
                let published: usize = specs
                    .iter()
                    .map(|s| s.devices.as_ref().map_or(0, Vec::len))
                    .sum();
                assert_eq!(published, expected);
                for (i, spec) in specs.iter().enumerate() {
                    let slice = serde_json::json!({
                        "metadata": {"name": slice_name("gpu-node-1", i)},
                        "spec": spec,
                    });
                    assert_eq!(
                        kube_emulator::resource_slice::validate(&slice),
                        vec![],
                        "{layout:?} taints {taints}, slice {i}"
                    );
                }
            }
        }
    }

    /// The slices of node `n1` with `count` whole GPUs, all healthy, not
    /// shared, at `generation`.
    fn slices_of_whole_gpus(count: u32, taints: bool, generation: i64) -> Vec<ResourceSliceSpec> {
        let gpus = (0..count)
            .map(|i| gpu(&format!("0000:{:02x}:00.0", i), i, 128 + i))
            .collect();
        let devices = devices_of(&inventory(gpus), &PcieRoots::new());
        slice_specs(
            "n1",
            &devices,
            &Unhealthy::new(),
            taints,
            &TimeSlicing::default(),
            generation,
        )
    }

    #[test]
    fn slices_hold_at_most_128_devices_in_one_pool() {
        let specs = slices_of_whole_gpus(130, false, 7);
        assert_eq!(specs.len(), 2);
        assert_eq!(specs[0].devices.as_ref().map(Vec::len), Some(128));
        assert_eq!(specs[1].devices.as_ref().map(Vec::len), Some(2));
        for s in &specs {
            assert_eq!(s.pool.name, "n1");
            assert_eq!(s.pool.generation, 7);
            assert_eq!(s.pool.resource_slice_count, 2);
            assert_eq!(s.driver, DRIVER_NAME);
            assert_eq!(s.node_name.as_deref(), Some("n1"));
        }
        let empty = slice_specs(
            "n1",
            &[],
            &Unhealthy::new(),
            false,
            &TimeSlicing::default(),
            1,
        );
        assert_eq!(empty.len(), 1);
        assert_eq!(empty[0].devices.as_ref().map(Vec::len), Some(0));
    }

    #[test]
    fn unhealthy_devices_are_tainted_only_when_taints_are_on() {
        let devices = devices_of(
            &inventory(vec![gpu("0000:05:00.0", 1, 128)]),
            &PcieRoots::new(),
        );
        let sick = Unhealthy::from([("gpu-1-128".to_string(), "ECC".to_string())]);
        let on = slice_specs("n", &devices, &sick, true, &TimeSlicing::default(), 1);
        let taint = &on[0].devices.as_ref().unwrap()[0].taints.as_ref().unwrap()[0];
        assert_eq!(taint.key, UNHEALTHY_TAINT_KEY);
        assert_eq!(taint.effect, "NoSchedule");
        let off = slice_specs("n", &devices, &sick, false, &TimeSlicing::default(), 1);
        assert!(off[0].devices.as_ref().unwrap()[0].taints.is_none());
        let healthy = slice_specs(
            "n",
            &devices,
            &Unhealthy::new(),
            true,
            &TimeSlicing::default(),
            1,
        );
        assert!(!same_content(&on[0], &healthy[0]));
        assert!(same_content(
            &off[0],
            &slice_specs("n", &devices, &sick, false, &TimeSlicing::default(), 9)[0]
        ));
    }

    #[test]
    fn quantities_compare_by_value_as_the_server_rewrites_them() {
        assert_eq!(quantity_value("206158430208"), Some(192 << 30));
        assert_eq!(quantity_value("192Gi"), Some(192 << 30));
        assert_eq!(quantity_value("1k"), Some(1000));
        assert_eq!(quantity_value("2e3"), Some(2000));
        assert_eq!(quantity_value("0.5"), None);
        let devices = devices_of(
            &inventory(vec![gpu("0000:05:00.0", 1, 128)]),
            &PcieRoots::new(),
        );
        let sent = slice_specs(
            "n",
            &devices,
            &Unhealthy::new(),
            false,
            &TimeSlicing::default(),
            1,
        );
        let mut stored = sent[0].clone();
        for d in stored.devices.iter_mut().flatten() {
            for c in d.capacity.iter_mut().flat_map(|c| c.values_mut()) {
                if c.value.0 == (192u64 << 30).to_string() {
                    c.value = Quantity("192Gi".into());
                }
            }
        }
        assert_ne!(stored, sent[0], "the canonical form differs as text");
        assert!(same_content(&stored, &sent[0]));
    }

    #[test]
    fn with_taints_on_slices_hold_at_most_64_devices() {
        let specs = slices_of_whole_gpus(100, true, 1);
        assert_eq!(specs.len(), 2);
        assert_eq!(specs[0].devices.as_ref().map(Vec::len), Some(64));
        assert_eq!(specs[0].pool.resource_slice_count, 2);
    }

    #[test]
    fn slice_names_fit_the_api() {
        assert_eq!(slice_name("node-1", 0), "node-1-gpu.amd.com-0");
        let long = "a".repeat(253);
        let name = slice_name(&long, 3);
        assert!(name.len() <= 253, "{}", name.len());
        assert!(name.ends_with("-gpu.amd.com-3"));
        assert_ne!(slice_name(&long, 3), slice_name(&"a".repeat(252), 3));
    }

    #[test]
    fn amds_four_part_driver_version_is_a_semver_and_kept_raw_beside_it() {
        // ROCm/gpu-operator#609: published as a version, it cost the whole slice.
        let mut inv = inventory(vec![gpu("0000:05:00.0", 1, 128)]);
        inv.driver.version = Some("6.19.14.31400000".into());
        let devices = devices_of(&inv, &PcieRoots::new());
        let d = &devices[0];
        assert_eq!(attr(d, "driverVersion").version.as_deref(), Some("6.19.14"));
        assert_eq!(
            attr(d, DRIVER_VERSION_RAW).string.as_deref(),
            Some("6.19.14.31400000")
        );
        let specs = slice_specs(
            "n1",
            &devices,
            &Unhealthy::new(),
            true,
            &TimeSlicing::default(),
            1,
        );
        let slice =
            serde_json::json!({"metadata": {"name": slice_name("n1", 0)}, "spec": specs[0]});
        assert_eq!(kube_emulator::resource_slice::validate(&slice), vec![]);

        inv.driver.version = Some(format!("6.19.14-{}", "x".repeat(70)));
        let d = &devices_of(&inv, &PcieRoots::new())[0];
        assert!(
            !d.attributes.contains_key(DRIVER_VERSION_RAW),
            "too long to publish"
        );
        assert_eq!(attr(d, "driverVersion").version.as_deref(), Some("6.19.14"));
    }

    #[test]
    fn shared_devices_allow_multiple_allocations_with_a_policy_on_every_capacity() {
        let mut g = gpu("0000:03:00.0", 1, 128);
        g.vram_bytes = Some(192 << 30);
        g.cu_count = Some(304);
        g.simd_count = Some(1216);
        g.xcc_count = Some(8);
        let devices = devices_of(&inventory(vec![g]), &PcieRoots::new());
        let sharing = TimeSlicing {
            replicas: 4,
            ..TimeSlicing::default()
        };
        let specs = slice_specs("n", &devices, &Unhealthy::new(), false, &sharing, 1);
        let device = &specs[0].devices.as_ref().unwrap()[0];
        assert_eq!(device.allow_multiple_allocations, Some(true));
        let capacity = device.capacity.as_ref().unwrap();
        let default = |name: &str| {
            capacity[name]
                .request_policy
                .as_ref()
                .unwrap()
                .default
                .clone()
                .unwrap()
                .0
        };
        assert_eq!(default("memory"), (48u64 << 30).to_string());
        assert_eq!(default("computeUnits"), "76");
        assert_eq!(default("simdUnits"), "304");
        let step = |name: &str| {
            capacity[name]
                .request_policy
                .as_ref()
                .unwrap()
                .valid_range
                .as_ref()
                .unwrap()
                .step
                .clone()
                .unwrap()
                .0
        };
        assert_eq!(step("computeUnits"), "38", "one XCC");
        assert_eq!(step("simdUnits"), "152");
        // Exclusive: as before.
        let exclusive = slice_specs(
            "n",
            &devices,
            &Unhealthy::new(),
            false,
            &TimeSlicing::default(),
            1,
        );
        let device = &exclusive[0].devices.as_ref().unwrap()[0];
        assert_eq!(device.allow_multiple_allocations, None);
        assert!(
            device
                .capacity
                .as_ref()
                .unwrap()
                .values()
                .all(|c| c.request_policy.is_none())
        );
        // The server's canonical quantities compare equal.
        let mut canonical = specs[0].clone();
        for d in canonical.devices.iter_mut().flatten() {
            for c in d.capacity.iter_mut().flat_map(|c| c.values_mut()) {
                if let Some(p) = c.request_policy.as_mut()
                    && p.default
                        .as_ref()
                        .is_some_and(|q| q.0 == (48u64 << 30).to_string())
                {
                    p.default = Some(Quantity("48Gi".into()));
                }
            }
        }
        assert!(same_content(&canonical, &specs[0]));
    }
}
