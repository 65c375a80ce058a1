//! Simulated hosts for tests: `gpu_operator::simulate` writes the tree into a
//! temporary directory and `gpu_operator::device::discover` reads it back, so
//! tests run the same code path as a real host.

use std::sync::Arc;

use gpu_operator::device::{Inventory, discover};
use gpu_operator::host::HostRoot;
use gpu_operator::simulate::{SimSpec, write_host};
use tempfile::TempDir;

/// A simulated host that lives as long as this value.
pub struct SimHost {
    _dir: TempDir,
    pub host: HostRoot,
}

impl SimHost {
    /// Simulates `profile` (`mi300x`, `mi210`...) with its default GPU count,
    /// optionally partitioned (`cpx_nps4`).
    pub fn new(profile: &str, partition: Option<&str>) -> Self {
        Self::with_gpus(profile, None, partition)
    }

    /// Like [`SimHost::new`] with `gpus` GPUs. Fewer GPUs keep partitioned hosts
    /// (thousands of KFD link files at eight GPUs) quick to write.
    pub fn with_gpus(profile: &str, gpus: Option<usize>, partition: Option<&str>) -> Self {
        let spec = SimSpec::new(profile, gpus, partition).expect("valid simulation spec");
        Self::in_dir(tempfile::tempdir().expect("temp dir"), Some(&spec))
    }

    /// The host at `dir/host`, simulated from `spec` (left empty without
    /// one); `dir` lives as long as the host.
    pub fn in_dir(dir: TempDir, spec: Option<&SimSpec>) -> Self {
        let host = HostRoot::new(dir.path().join("host"));
        if let Some(spec) = spec {
            write_host(&host, spec).expect("simulated host written");
        }
        Self { _dir: dir, host }
    }

    /// The directory the host is in (`host/` under it), where a node rig
    /// keeps the rest of the node (its kubelet directory, tools).
    pub fn dir(&self) -> &std::path::Path {
        self._dir.path()
    }

    /// Rewrites the host with the profile's default GPU count, e.g. to repartition it.
    pub fn rewrite(&self, profile: &str, partition: Option<&str>) {
        self.rewrite_with(profile, None, partition);
    }

    pub fn rewrite_with(&self, profile: &str, gpus: Option<usize>, partition: Option<&str>) {
        let spec = SimSpec::new(profile, gpus, partition).expect("valid simulation spec");
        write_host(&self.host, &spec).expect("simulated host written");
    }

    /// What discovery sees now.
    pub fn discover(&self) -> Inventory {
        let inventory = discover(&self.host);
        assert!(
            inventory.driver.loaded,
            "simulated driver is loaded: {inventory:?}"
        );
        inventory
    }

    /// A feed holding the current inventory, as the agent would pass it.
    pub fn feed(
        &self,
    ) -> (
        tokio::sync::watch::Sender<Arc<Inventory>>,
        tokio::sync::watch::Receiver<Arc<Inventory>>,
    ) {
        tokio::sync::watch::channel(Arc::new(self.discover()))
    }
}

/// An inventory whose partitionable GPUs disagree on their layout: the GPUs of a
/// `cpx_nps4` MI300X host, with the upper half reported as `spx_nps1` (whole GPUs
/// on their partition-0 nodes, which the CPX host also has).
pub fn heterogeneous(cpx_host: &SimHost) -> Inventory {
    let mut inventory = cpx_host.discover();
    let half = inventory.gpus.len() / 2;
    for gpu in inventory.gpus.iter_mut().skip(half) {
        gpu.compute_partition = Some("spx".into());
        gpu.memory_partition = Some("nps1".into());
        gpu.partitions.clear();
    }
    inventory
}

/// Turns four files of every GPU into reads that hang (see
/// `simulate::hang_file`) and returns them. Each read costs its 1 s bound, so
/// every discovery scan misses its 5 s deadline while they hang.
pub fn hang_past_the_scan_deadline(host: &gpu_operator::host::HostRoot) -> Vec<String> {
    const DRIVER: &str = "/sys/bus/pci/drivers/amdgpu";
    let mut gpus: Vec<String> = std::fs::read_dir(host.path(DRIVER))
        .expect("a simulated driver directory")
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|name| name.starts_with("0000:"))
        .collect();
    gpus.sort();
    assert!(
        gpus.len() >= 2,
        "too few GPUs to miss the deadline: {gpus:?}"
    );
    let hung: Vec<String> = gpus
        .iter()
        .flat_map(|bdf| {
            [
                "product_name",
                "unique_id",
                "serial_number",
                "current_compute_partition",
            ]
            .map(|file| format!("{DRIVER}/{bdf}/{file}"))
        })
        .collect();
    for file in &hung {
        gpu_operator::simulate::hang_file(host, file).expect("hang a simulated file");
    }
    hung
}
