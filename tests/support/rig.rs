//! A device plugin wired to a simulated host and a test kubelet, as the agent
//! would wire it.

use std::sync::Arc;

use gpu_operator::device::Inventory;
use gpu_operator::plugin::{
    DevicePluginService, HealthReport, PluginConfig, PluginStatus, ResourceNamingStrategy,
};
use tempfile::TempDir;
use tokio::sync::watch;

use super::hosts::SimHost;
use super::kubelet::{TestKubelet, WAIT};

pub struct Rig {
    pub sim: SimHost,
    /// Holds the device plugin directory.
    pub plugin_dir: TempDir,
    pub kubelet: TestKubelet,
    pub inventory: watch::Sender<Arc<Inventory>>,
    pub health: watch::Sender<HealthReport>,
    pub plugin: Option<DevicePluginService>,
}

impl Rig {
    /// Simulates `profile`/`partition`, starts the test kubelet and the plugin.
    pub async fn start(
        profile: &str,
        partition: Option<&str>,
        strategy: ResourceNamingStrategy,
    ) -> Self {
        Self::start_with_gpus(profile, None, partition, strategy).await
    }

    pub async fn start_with_gpus(
        profile: &str,
        gpus: Option<usize>,
        partition: Option<&str>,
        strategy: ResourceNamingStrategy,
    ) -> Self {
        let sim = SimHost::with_gpus(profile, gpus, partition);
        let inventory = sim.discover();
        Self::with_inventory(sim, inventory, strategy).await
    }

    pub async fn with_inventory(
        sim: SimHost,
        inventory: Inventory,
        strategy: ResourceNamingStrategy,
    ) -> Self {
        let plugin_dir = tempfile::tempdir().expect("temp dir");
        let kubelet = TestKubelet::start(plugin_dir.path()).await;
        let (inventory_tx, inventory_rx) = watch::channel(Arc::new(inventory));
        let (health_tx, health_rx) = watch::channel(HealthReport::default());
        let config = PluginConfig::new(plugin_dir.path(), strategy, sim.host.clone());
        let plugin = DevicePluginService::start(config, inventory_rx, health_rx);
        Self {
            sim,
            plugin_dir,
            kubelet,
            inventory: inventory_tx,
            health: health_tx,
            plugin: Some(plugin),
        }
    }

    pub fn config(&self, strategy: ResourceNamingStrategy) -> PluginConfig {
        PluginConfig::new(self.plugin_dir.path(), strategy, self.sim.host.clone())
    }

    pub fn plugin(&self) -> &DevicePluginService {
        self.plugin.as_ref().expect("plugin running")
    }

    /// Names of the files in the device plugin directory, sorted.
    pub fn sockets(&self) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(self.plugin_dir.path())
            .expect("read plugin dir")
            .flatten()
            .filter_map(|e| e.file_name().into_string().ok())
            .collect();
        names.sort();
        names
    }

    /// Waits until the plugin's status satisfies `predicate`.
    pub async fn wait_status(
        &self,
        what: &str,
        predicate: impl Fn(&PluginStatus) -> bool,
    ) -> PluginStatus {
        let mut rx = self.plugin().status();
        let result = match tokio::time::timeout(WAIT, rx.wait_for(|s| predicate(s))).await {
            Ok(Ok(status)) => Some(status.clone()),
            Ok(Err(_)) => panic!("status channel closed while waiting for {what}"),
            Err(_) => None,
        };
        result.unwrap_or_else(|| {
            panic!(
                "status never showed {what}: {:?}",
                *self.plugin().status().borrow()
            )
        })
    }

    /// Publishes a fresh discovery of the simulated host.
    pub fn rediscover(&self) {
        self.inventory.send_replace(Arc::new(self.sim.discover()));
    }

    pub async fn stop(&mut self) {
        if let Some(plugin) = self.plugin.take() {
            plugin.stop().await;
        }
    }
}
