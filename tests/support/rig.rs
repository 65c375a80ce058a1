//! A device plugin wired to a simulated host and a test kubelet, as the agent
//! would wire it: a [`NodeRig`] with the test kubelet and the feeds, and the
//! plugin on them.

use gpu_operator::device::Inventory;
use gpu_operator::plugin::{
    DevicePluginService, PluginConfig, PluginStatus, ResourceNamingStrategy,
};

use super::hosts::SimHost;
use super::kubelet::WAIT;
use super::node_rig::NodeRig;

pub struct Rig {
    node: NodeRig,
    pub plugin: Option<DevicePluginService>,
}

impl std::ops::Deref for Rig {
    type Target = NodeRig;

    fn deref(&self) -> &NodeRig {
        &self.node
    }
}

impl std::ops::DerefMut for Rig {
    fn deref_mut(&mut self) -> &mut NodeRig {
        &mut self.node
    }
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
        let node = NodeRig::builder("gpu-node")
            .sim(sim)
            .kubelet()
            .feeds_with(inventory)
            .start()
            .await;
        let plugin = DevicePluginService::start(
            plugin_config(&node, strategy),
            node.inventory().subscribe(),
            node.health().subscribe(),
        );
        Self {
            node,
            plugin: Some(plugin),
        }
    }

    pub fn config(&self, strategy: ResourceNamingStrategy) -> PluginConfig {
        plugin_config(&self.node, strategy)
    }

    pub fn plugin(&self) -> &DevicePluginService {
        self.plugin.as_ref().expect("plugin running")
    }

    /// Names of the files in the device plugin directory, sorted.
    pub fn sockets(&self) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(self.plugin_dir())
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

    /// Stops the plugin, then what the rig started.
    pub async fn stop(&mut self) {
        if let Some(plugin) = self.plugin.take() {
            plugin.stop().await;
        }
        self.node.stop().await;
    }
}

/// The plugin's config on `node`: its device plugin directory, `strategy`,
/// the host.
fn plugin_config(node: &NodeRig, strategy: ResourceNamingStrategy) -> PluginConfig {
    PluginConfig::new(node.plugin_dir(), strategy, node.host.clone())
}
