//! The DRA DeviceClasses the leader keeps, as plain data, and the writes
//! that make the cluster's classes so: `gpu.amd.com`
//! ([`resources::device_class`], every device, for claims),
//! `amd-gpu.gpu.amd.com` ([`resources::extended_resource_class`], serving
//! `amd.com/gpu` with whole GPUs and existing partitions) and one class per
//! partition layout present on a DRA node (`cpx-nps4.gpu.amd.com`, serving
//! `amd.com/cpx_nps4`, the name the device plugin's `mixed` strategy gives
//! that layout), so that pods written for the mixed strategy are served by
//! DRA with no edit (KEP-5004).
//!
//! Pure: the Nodes and classes come in as data; `reconcile.rs` reads and
//! writes. It must not touch a class that is not the operator's (no
//! [`resources::DEVICE_CLASS_LABEL`]), nor name one outside
//! [`operator_class_name`], which RBAC and the admission policy list.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::DeviceClass;
use kube::ResourceExt;
use kube::runtime::watcher;

use super::resources;
use crate::api::agent_status::STATUS_ANNOTATION;
use crate::dra::DRIVER_NAME;

/// Every per-layout class the leader may make: the compute modes amdgpu
/// names (SPX, DPX, TPX, QPX, CPX) with its memory modes NPS1, NPS2, NPS4
/// and NPS8, as `<compute>-<memory>.gpu.amd.com`. RBAC
/// (`deploy/10-rbac.yaml`) and the admission policy
/// (`deploy/15-admission-policy.yaml`) list the same names; a layout outside
/// these gets no class.
pub const LAYOUT_CLASS_NAMES: [&str; 20] = [
    "spx-nps1.gpu.amd.com",
    "spx-nps2.gpu.amd.com",
    "spx-nps4.gpu.amd.com",
    "spx-nps8.gpu.amd.com",
    "dpx-nps1.gpu.amd.com",
    "dpx-nps2.gpu.amd.com",
    "dpx-nps4.gpu.amd.com",
    "dpx-nps8.gpu.amd.com",
    "tpx-nps1.gpu.amd.com",
    "tpx-nps2.gpu.amd.com",
    "tpx-nps4.gpu.amd.com",
    "tpx-nps8.gpu.amd.com",
    "qpx-nps1.gpu.amd.com",
    "qpx-nps2.gpu.amd.com",
    "qpx-nps4.gpu.amd.com",
    "qpx-nps8.gpu.amd.com",
    "cpx-nps1.gpu.amd.com",
    "cpx-nps2.gpu.amd.com",
    "cpx-nps4.gpu.amd.com",
    "cpx-nps8.gpu.amd.com",
];

/// The class of `layout` (`cpx_nps4` → `cpx-nps4.gpu.amd.com`), or `None`
/// for a layout outside [`LAYOUT_CLASS_NAMES`].
pub fn layout_class_name(layout: &str) -> Option<&'static str> {
    let (compute, memory) = layout.split_once('_')?;
    LAYOUT_CLASS_NAMES.iter().copied().find(|name| {
        name.strip_suffix(DRIVER_NAME)
            .and_then(|n| n.strip_suffix('.'))
            .and_then(|n| n.split_once('-'))
            == Some((compute, memory))
    })
}

/// The CEL selector of `layout`'s class: devices of our driver in that
/// layout, either way the plugin publishes one:
///
/// - a whole GPU or partition as the GPU is now: `partitionProfile` is
///   `layout` (`cpx_nps4`);
/// - with `draDriver.autoPartition`, a layout device the GPU can take
///   (`gpu-0-cpx-nps4`, [`crate::dra::layouts`]): `computePartition` and
///   `memoryPartition` are the layout's halves, lower case as published.
///
/// `has()` before each read, since looking up an attribute a device lacks
/// (a GPU without partition support, a layout device's missing
/// `partitionProfile`) is an error that fails the allocation rather than
/// skipping the device. `None` for a layout that is not
/// `<compute>_<memory>`.
pub fn layout_selector(layout: &str) -> Option<String> {
    let (compute, memory) = layout.split_once('_')?;
    let (compute, memory) = (compute.to_ascii_lowercase(), memory.to_ascii_lowercase());
    let attr = |name: &str| format!("device.attributes['{DRIVER_NAME}'].{name}");
    Some(format!(
        "device.driver == '{DRIVER_NAME}' && \
         ((has({profile}) && {profile} == '{layout}') || \
         (has({compute_attr}) && has({memory_attr}) && \
         {compute_attr} == '{compute}' && {memory_attr} == '{memory}'))",
        profile = attr("partitionProfile"),
        compute_attr = attr("computePartition"),
        memory_attr = attr("memoryPartition"),
    ))
}

/// The class for `layout`: named by [`layout_class_name`], selecting the
/// devices in that layout, and serving `amd.com/<layout>`, the `mixed`
/// strategy's resource. `None` for a layout without a class name.
pub fn layout_device_class(layout: &str) -> Option<DeviceClass> {
    let name = layout_class_name(layout)?;
    Some(resources::operator_device_class(
        name,
        layout_selector(layout)?,
        Some(crate::plugin::devices::resource_name(layout)),
    ))
}

/// The layouts the agents of `nodes` report (the status annotation's
/// `layouts`, written while a node runs DRA), each once. An annotation
/// that does not parse adds none.
pub fn layouts_present<'a>(nodes: impl IntoIterator<Item = &'a Node>) -> BTreeSet<String> {
    nodes.into_iter().flat_map(layouts_of).collect()
}

/// The layouts the agent of `node` reports.
fn layouts_of(node: &Node) -> Vec<String> {
    #[derive(serde::Deserialize)]
    struct Layouts {
        #[serde(default)]
        layouts: Vec<String>,
    }
    // Most agents report none: skip the parse of their status.
    node.annotations()
        .get(STATUS_ANNOTATION)
        .filter(|s| s.contains("\"layouts\""))
        .and_then(|status| serde_json::from_str::<Layouts>(status).ok())
        .map(|found| found.layouts)
        .unwrap_or_default()
}

/// [`layouts_present`] of the Nodes a watch has shown, kept from its events
/// so that no reconcile reads every Node for it: which layouts each Node
/// reporting some reports. Nodes reporting none take no room.
#[derive(Clone, Debug, Default)]
pub struct LayoutIndex {
    by_node: HashMap<String, Vec<String>>,
    /// The Nodes of a list under way, which replaces `by_node` once done.
    listing: Option<HashMap<String, Vec<String>>>,
}

impl LayoutIndex {
    /// Follows one event of a Node watch.
    pub fn apply(&mut self, event: &watcher::Event<Node>) {
        let put = |index: &mut HashMap<String, Vec<String>>, node: &Node| {
            let layouts = layouts_of(node);
            if layouts.is_empty() {
                index.remove(&node.name_any());
            } else {
                index.insert(node.name_any(), layouts);
            }
        };
        match event {
            watcher::Event::Apply(node) => put(&mut self.by_node, node),
            watcher::Event::Delete(node) => {
                self.by_node.remove(&node.name_any());
            }
            watcher::Event::Init => self.listing = Some(HashMap::new()),
            watcher::Event::InitApply(node) => put(self.listing.get_or_insert_default(), node),
            watcher::Event::InitDone => {
                self.by_node = self.listing.take().unwrap_or_default();
            }
        }
    }

    /// The layouts reported, each once.
    pub fn present(&self) -> BTreeSet<String> {
        self.by_node.values().flatten().cloned().collect()
    }
}

/// Whether the operator may make a class of this name: `gpu.amd.com`,
/// [`resources::EXTENDED_RESOURCE_CLASS`] and [`LAYOUT_CLASS_NAMES`], the
/// names RBAC (`deploy/10-rbac.yaml`) and the admission policy list.
pub fn operator_class_name(name: &str) -> bool {
    name == DRIVER_NAME
        || name == resources::EXTENDED_RESOURCE_CLASS
        || LAYOUT_CLASS_NAMES.contains(&name)
}

/// The classes to keep: none without DRA; with it, `gpu.amd.com`,
/// `amd-gpu.gpu.amd.com` and the class of each of `layouts` that has one.
/// Sorted by name.
pub fn wanted_classes(dra: bool, layouts: &BTreeSet<String>) -> Vec<DeviceClass> {
    if !dra {
        return Vec::new();
    }
    let mut wanted: Vec<DeviceClass> = [
        resources::device_class(),
        resources::extended_resource_class(),
    ]
    .into_iter()
    .chain(layouts.iter().filter_map(|l| layout_device_class(l)))
    .collect();
    wanted.sort_by_key(ResourceExt::name_any);
    wanted
}

/// Whether `class` carries the operator's label.
pub fn is_ours(class: &DeviceClass) -> bool {
    class
        .labels()
        .get(resources::DEVICE_CLASS_LABEL.0)
        .is_some_and(|v| v == resources::DEVICE_CLASS_LABEL.1)
}

/// Whether `current` is `wanted` as far as the leader's fields go. An API
/// server without DRAExtendedResource drops `extendedResourceName`; such a
/// class is applied again at each recheck, in case the feature was turned
/// on since.
pub fn is_current(wanted: &DeviceClass, current: &DeviceClass) -> bool {
    current.spec.selectors == wanted.spec.selectors
        && current.spec.extended_resource_name == wanted.spec.extended_resource_name
        && is_ours(current)
}

/// What to write so that the operator's classes among `current` are
/// `wanted`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ClassChanges {
    /// Wanted classes that are missing or not as wanted: applied.
    pub apply: Vec<DeviceClass>,
    /// The operator's classes no longer wanted: deleted.
    pub delete: Vec<String>,
    /// Wanted names taken by a class without the operator's label (the
    /// reference chart's `gpu.amd.com`, an administrator's own): left alone.
    pub foreign: Vec<String>,
}

/// The writes from `current` (every class in the cluster) to `wanted`. Only
/// classes the operator may make ([`operator_class_name`]) with its label
/// are ever deleted.
pub fn class_changes(wanted: &[DeviceClass], current: &[DeviceClass]) -> ClassChanges {
    let by_name: BTreeMap<String, &DeviceClass> =
        current.iter().map(|c| (c.name_any(), c)).collect();
    let mut changes = ClassChanges::default();
    for class in wanted {
        let name = class.name_any();
        match by_name.get(&name) {
            Some(found) if !is_ours(found) => changes.foreign.push(name),
            Some(found) if is_current(class, found) => {}
            _ => changes.apply.push(class.clone()),
        }
    }
    let wanted_names: BTreeSet<String> = wanted.iter().map(ResourceExt::name_any).collect();
    changes.delete = by_name
        .iter()
        .filter(|(name, class)| {
            is_ours(class) && !wanted_names.contains(*name) && operator_class_name(name)
        })
        .map(|(name, _)| name.clone())
        .collect();
    changes
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    fn layouts(list: &[&str]) -> BTreeSet<String> {
        list.iter().map(|s| (*s).to_owned()).collect()
    }

    fn names(classes: &[DeviceClass]) -> Vec<String> {
        classes.iter().map(ResourceExt::name_any).collect()
    }

    fn node_with_status(status: Option<Value>) -> Node {
        let mut node = Node::default();
        node.metadata.name = Some("n".into());
        if let Some(status) = status {
            node.metadata.annotations = Some(BTreeMap::from([(
                STATUS_ANNOTATION.to_owned(),
                status.to_string(),
            )]));
        }
        node
    }

    #[test]
    fn every_layout_amdgpu_names_has_one_class_and_nothing_else_has() {
        let mut seen = BTreeSet::new();
        for compute in ["spx", "dpx", "tpx", "qpx", "cpx"] {
            for memory in ["nps1", "nps2", "nps4", "nps8"] {
                let name = layout_class_name(&format!("{compute}_{memory}"))
                    .unwrap_or_else(|| panic!("{compute}_{memory} has no class"));
                assert_eq!(name, format!("{compute}-{memory}.gpu.amd.com"));
                assert!(seen.insert(name));
            }
        }
        assert_eq!(seen.len(), LAYOUT_CLASS_NAMES.len());
        for outside in [
            "",
            "cpx",
            "cpx_",
            "_nps4",
            "cpx_nps3",
            "xpx_nps4",
            "CPX_NPS4",
            "cpx-nps4",
            "cpx_nps4_x",
            "cpx_nps4.gpu.amd.com",
        ] {
            assert_eq!(layout_class_name(outside), None, "{outside:?}");
        }
    }

    #[test]
    fn a_layout_class_serves_the_mixed_strategy_s_resource() {
        let class = layout_device_class("cpx_nps4").unwrap();
        assert_eq!(class.name_any(), "cpx-nps4.gpu.amd.com");
        assert_eq!(
            class.spec.extended_resource_name.as_deref(),
            Some("amd.com/cpx_nps4")
        );
        assert!(is_ours(&class));
        let selectors = class.spec.selectors.unwrap();
        assert_eq!(selectors.len(), 1);
        let expression = &selectors[0].cel.as_ref().unwrap().expression;
        assert_eq!(
            expression,
            "device.driver == 'gpu.amd.com' && \
             ((has(device.attributes['gpu.amd.com'].partitionProfile) && \
             device.attributes['gpu.amd.com'].partitionProfile == 'cpx_nps4') || \
             (has(device.attributes['gpu.amd.com'].computePartition) && \
             has(device.attributes['gpu.amd.com'].memoryPartition) && \
             device.attributes['gpu.amd.com'].computePartition == 'cpx' && \
             device.attributes['gpu.amd.com'].memoryPartition == 'nps4'))"
        );
        assert_eq!(layout_device_class("xpx_nps9"), None);
    }

    /// The selector as the API server's CEL evaluates it: the layout's
    /// devices only, and a device without the attribute is skipped, not an
    /// error.
    #[test]
    fn a_layout_selector_picks_that_layout_and_skips_devices_without_one() {
        let evaluate = |device: Value| {
            let program = cel::Program::compile(&layout_selector("cpx_nps4").unwrap()).unwrap();
            let mut context = cel::Context::default();
            context.add_variable_from_value("device", cel::to_value(device).unwrap());
            program.execute(&context).map_err(|e| e.to_string())
        };
        let device = |driver: &str, attributes: Value| json!({"driver": driver, "attributes": {"gpu.amd.com": attributes}});
        assert_eq!(
            evaluate(device(
                "gpu.amd.com",
                json!({"partitionProfile": "cpx_nps4"})
            )),
            Ok(cel::Value::Bool(true))
        );
        assert_eq!(
            evaluate(device(
                "gpu.amd.com",
                json!({"partitionProfile": "spx_nps1"})
            )),
            Ok(cel::Value::Bool(false))
        );
        assert_eq!(
            evaluate(device("gpu.amd.com", json!({"type": "amdgpu"}))),
            Ok(cel::Value::Bool(false))
        );
        // autoPartition's layout devices: no partitionProfile, the layout's
        // halves in lower case, as `dra::layouts` publishes them.
        assert_eq!(
            evaluate(device(
                "gpu.amd.com",
                json!({"type": "amdgpu-partition", "computePartition": "cpx", "memoryPartition": "nps4"})
            )),
            Ok(cel::Value::Bool(true))
        );
        for (compute, memory) in [("cpx", "nps1"), ("spx", "nps4"), ("dpx", "nps1")] {
            assert_eq!(
                evaluate(device(
                    "gpu.amd.com",
                    json!({"computePartition": compute, "memoryPartition": memory})
                )),
                Ok(cel::Value::Bool(false)),
                "{compute}_{memory}"
            );
        }
        assert_eq!(
            evaluate(device("gpu.amd.com", json!({"computePartition": "cpx"}))),
            Ok(cel::Value::Bool(false))
        );
        assert_eq!(layout_selector("cpx"), None);
        assert_eq!(
            evaluate(device(
                "other.example.com",
                json!({"partitionProfile": "cpx_nps4"})
            )),
            Ok(cel::Value::Bool(false))
        );
    }

    /// `amd.com/gpu`'s class takes GPUs and partitions as they are and,
    /// of the layouts a GPU can take on demand, only the whole GPU; while
    /// `gpu.amd.com` keeps every device, for claims that pick a layout by
    /// CEL as AutoPartition's do.
    #[test]
    fn amd_com_gpu_never_gets_a_share_of_a_layout_made_on_demand() {
        let evaluate = |selector: &str, attributes: Value| {
            let program = cel::Program::compile(selector).unwrap();
            let mut context = cel::Context::default();
            let device =
                json!({"driver": "gpu.amd.com", "attributes": {"gpu.amd.com": attributes}});
            context.add_variable_from_value("device", cel::to_value(device).unwrap());
            program.execute(&context).map_err(|e| e.to_string())
        };
        let whole_gpu = json!({"type": "amdgpu", "partitionProfile": "spx_nps1"});
        let no_partition_support = json!({"type": "amdgpu"});
        let existing_partition =
            json!({"type": "amdgpu-partition", "partitionProfile": "cpx_nps4"});
        let spx_layout =
            json!({"type": "amdgpu", "computePartition": "spx", "memoryPartition": "nps1"});
        let cpx_layout = json!({"type": "amdgpu-partition", "computePartition": "cpx", "memoryPartition": "nps4"});
        let extended = resources::EXTENDED_RESOURCE_CLASS_SELECTOR;
        for (device, wanted) in [
            (&whole_gpu, true),
            (&no_partition_support, true),
            (&existing_partition, true),
            (&spx_layout, true),
            (&cpx_layout, false),
        ] {
            assert_eq!(
                evaluate(extended, device.clone()),
                Ok(cel::Value::Bool(wanted)),
                "{device}"
            );
            assert_eq!(
                evaluate(resources::DEVICE_CLASS_SELECTOR, device.clone()),
                Ok(cel::Value::Bool(true)),
                "{device}"
            );
        }
        // Another driver's devices are not ours.
        let program = cel::Program::compile(extended).unwrap();
        let mut context = cel::Context::default();
        let device = json!({"driver": "other.example.com", "attributes": {}});
        context.add_variable_from_value("device", cel::to_value(device).unwrap());
        assert_eq!(program.execute(&context), Ok(cel::Value::Bool(false)));
        // The one class serving amd.com/gpu: gpu.amd.com serves none, so
        // that the scheduler's choice between two classes of one name
        // (the newer wins) never comes into it.
        let classes = wanted_classes(true, &layouts(&["cpx_nps4"]));
        let serving: Vec<String> = classes
            .iter()
            .filter(|c| c.spec.extended_resource_name.as_deref() == Some("amd.com/gpu"))
            .map(ResourceExt::name_any)
            .collect();
        assert_eq!(serving, ["amd-gpu.gpu.amd.com"]);
    }

    #[test]
    fn layouts_come_from_the_agents_status_and_a_bad_one_adds_none() {
        let nodes = [
            node_with_status(Some(json!({"v": 1, "gpus": 8, "layouts": ["cpx_nps4"]}))),
            node_with_status(Some(
                json!({"v": 1, "gpus": 8, "layouts": ["spx_nps1", "cpx_nps4"]}),
            )),
            node_with_status(Some(json!({"v": 1, "gpus": 8}))),
            node_with_status(None),
            node_with_status(Some(json!({"v": 1, "layouts": "cpx_nps4"}))),
        ];
        assert_eq!(layouts_present(&nodes), layouts(&["cpx_nps4", "spx_nps1"]));
        assert!(layouts_present(&nodes[2..]).is_empty());
    }

    #[test]
    fn the_layout_index_follows_the_watch_as_a_scan_of_the_nodes_would() {
        use watcher::Event::*;
        let named = |name: &str, layouts: Option<&[&str]>| {
            let mut node =
                node_with_status(layouts.map(|l| json!({"v": 1, "gpus": 8, "layouts": l})));
            node.metadata.name = Some(name.into());
            node
        };
        let mut index = LayoutIndex::default();
        let mut cache: BTreeMap<String, Node> = BTreeMap::new();
        let mut listing = BTreeMap::new();
        let steps = [
            Init,
            InitApply(named("a", Some(&["cpx_nps4"]))),
            InitApply(named("b", None)),
            InitApply(named("c", Some(&["spx_nps1", "cpx_nps4"]))),
            InitDone,
            // "a" repartitioned, "b" turned DRA on, "c" turned it off.
            Apply(named("a", Some(&["dpx_nps2"]))),
            Apply(named("b", Some(&["qpx_nps1"]))),
            Apply(named("c", None)),
            Delete(named("b", None)),
            // A list again, in which "a" is gone and "d" appeared.
            Init,
            InitApply(named("d", Some(&["tpx_nps1"]))),
            InitDone,
        ];
        let mut seen = Vec::new();
        for event in &steps {
            index.apply(event);
            match event {
                Apply(n) => drop(cache.insert(n.name_any(), n.clone())),
                Delete(n) => drop(cache.remove(&n.name_any())),
                Init => listing.clear(),
                InitApply(n) => drop(listing.insert(n.name_any(), n.clone())),
                InitDone => cache = std::mem::take(&mut listing),
            }
            assert_eq!(
                index.present(),
                layouts_present(cache.values()),
                "{event:?}"
            );
            seen.push(index.present());
        }
        // Not trivially empty: each state was told apart.
        assert_eq!(seen[4], layouts(&["cpx_nps4", "spx_nps1"]));
        assert_eq!(seen[7], layouts(&["dpx_nps2", "qpx_nps1"]));
        assert_eq!(seen[8], layouts(&["dpx_nps2"]));
        assert_eq!(seen[11], layouts(&["tpx_nps1"]));
        // Until a list is done, the one before it holds.
        assert_eq!(seen[9], seen[8]);
        assert_eq!(seen[10], seen[8]);
    }

    #[test]
    fn wanted_is_nothing_without_dra_and_gpu_amd_com_with_each_known_layout() {
        let present = layouts(&["spx_nps1", "cpx_nps4", "xpx_nps9"]);
        assert!(wanted_classes(false, &present).is_empty());
        assert_eq!(
            names(&wanted_classes(true, &present)),
            [
                "amd-gpu.gpu.amd.com",
                "cpx-nps4.gpu.amd.com",
                "gpu.amd.com",
                "spx-nps1.gpu.amd.com"
            ]
        );
        assert_eq!(
            names(&wanted_classes(true, &BTreeSet::new())),
            ["amd-gpu.gpu.amd.com", "gpu.amd.com"]
        );
    }

    #[test]
    fn changes_create_the_missing_remove_our_stale_and_leave_foreign_ones() {
        let wanted = wanted_classes(true, &layouts(&["cpx_nps4", "dpx_nps1"]));
        // Ours and current; ours but edited; ours and stale; a foreign class
        // under a wanted name; a foreign class under a name we may make; a
        // labelled class under a name we never make. `gpu.amd.com` as
        // operators before this one made it, serving amd.com/gpu itself:
        // applied again without it, and amd-gpu.gpu.amd.com made.
        let mut gpu = resources::device_class();
        gpu.spec.extended_resource_name = Some("amd.com/gpu".into());
        let mut edited = layout_device_class("dpx_nps1").unwrap();
        edited.spec.extended_resource_name = None;
        let stale = layout_device_class("spx_nps1").unwrap();
        let mut foreign = layout_device_class("cpx_nps4").unwrap();
        foreign.metadata.labels = None;
        let mut foreign_stale = layout_device_class("qpx_nps1").unwrap();
        foreign_stale.metadata.labels = Some(BTreeMap::from([(
            "app.kubernetes.io/managed-by".to_owned(),
            "Helm".to_owned(),
        )]));
        let mut unrelated = layout_device_class("cpx_nps1").unwrap();
        unrelated.metadata.name = Some("fast.example.com".into());
        let current = [gpu, edited, stale, foreign, foreign_stale, unrelated];
        let changes = class_changes(&wanted, &current);
        assert_eq!(
            names(&changes.apply),
            ["amd-gpu.gpu.amd.com", "dpx-nps1.gpu.amd.com", "gpu.amd.com"]
        );
        assert_eq!(changes.delete, ["spx-nps1.gpu.amd.com"]);
        assert_eq!(changes.foreign, ["cpx-nps4.gpu.amd.com"]);

        // Idempotent: once applied and deleted, nothing is left to do.
        let settled: Vec<DeviceClass> = wanted
            .iter()
            .filter(|c| c.name_any() != "cpx-nps4.gpu.amd.com")
            .cloned()
            .chain(current[3..].iter().cloned())
            .collect();
        let again = class_changes(&wanted, &settled);
        assert!(
            again.apply.is_empty() && again.delete.is_empty(),
            "{again:?}"
        );
        assert_eq!(again.foreign, ["cpx-nps4.gpu.amd.com"]);

        // Without DRA every class of ours goes, and only those.
        let gone = class_changes(&[], &current);
        assert!(gone.apply.is_empty() && gone.foreign.is_empty());
        assert_eq!(
            gone.delete,
            [
                "dpx-nps1.gpu.amd.com",
                "gpu.amd.com",
                "spx-nps1.gpu.amd.com"
            ]
        );
        assert_eq!(
            class_changes(&[], &[resources::extended_resource_class()]).delete,
            ["amd-gpu.gpu.amd.com"]
        );
    }
}
