//! The one `AgentConfig` literal of the tests and benches: a node agent on a
//! simulated host, serving metrics on a loopback port of the system's
//! choosing, with no leader role, no test tools and a driver store that
//! never runs modprobe. A test names only what it changes.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use gpu_operator::agent::{AgentConfig, LeaderConfig};
use gpu_operator::host::HostRoot;

/// An `AgentConfig` under construction.
pub struct AgentConfigBuilder(AgentConfig);

impl AgentConfigBuilder {
    /// The agent of Node `node_name` on `host`, its kubelet at `kubelet_dir`
    /// and its CDI specs under `kubelet_dir/cdi`; rescans every 200 ms.
    pub fn new(node_name: &str, host: HostRoot, kubelet_dir: PathBuf) -> Self {
        Self(AgentConfig {
            node_name: node_name.to_owned(),
            namespace: None,
            host,
            cdi_dir: kubelet_dir.join("cdi"),
            kubelet_dir,
            rescan_interval: Duration::from_millis(200),
            sampling: Default::default(),
            leader: None,
            metrics_listen: Some(SocketAddr::from(([127, 0, 0, 1], 0))),
            test_commands: None,
            driver: super::bundles::no_modprobe(),
            dra_device_taints: false,
            health_socket: None,
        })
    }

    pub fn rescan_interval(mut self, interval: Duration) -> Self {
        self.0.rescan_interval = interval;
        self
    }

    pub fn cdi_dir(mut self, dir: PathBuf) -> Self {
        self.0.cdi_dir = dir;
        self
    }

    pub fn metrics_listen(mut self, address: SocketAddr) -> Self {
        self.0.metrics_listen = Some(address);
        self
    }

    pub fn test_commands(mut self, commands: Option<gpu_operator::testrunner::Commands>) -> Self {
        self.0.test_commands = commands;
        self
    }

    /// Campaigns for the cluster role when `Some`.
    pub fn leader(mut self, leader: Option<LeaderConfig>) -> Self {
        self.0.leader = leader;
        self
    }

    pub fn driver(mut self, driver: gpu_operator::driver::manager::ManagerConfig) -> Self {
        self.0.driver = driver;
        self
    }

    pub fn dra_device_taints(mut self, taint: bool) -> Self {
        self.0.dra_device_taints = taint;
        self
    }

    pub fn health_socket(mut self, socket: PathBuf) -> Self {
        self.0.health_socket = Some(socket);
        self
    }

    pub fn build(self) -> AgentConfig {
        self.0
    }
}

/// The one `LeaderConfig` of the tests and benches: a campaign in
/// `namespace` as `identity`, the cluster role's instance named `instance`,
/// with the production lease and cluster settings. A test names only what it
/// changes.
pub struct LeaderConfigBuilder(LeaderConfig);

impl LeaderConfigBuilder {
    pub fn new(namespace: &str, identity: &str, instance: &str) -> Self {
        Self(LeaderConfig {
            lease: gpu_operator::cluster::lease::LeaseConfig::new(namespace, identity),
            cluster: gpu_operator::cluster::ClusterConfig {
                instance: instance.to_owned(),
                ..Default::default()
            },
        })
    }

    /// A lease of 6 s renewed every second: a lost leader is replaced within
    /// a test's patience.
    pub fn fast_lease(self) -> Self {
        self.lease_timing(Duration::from_secs(6), Duration::from_secs(1))
    }

    pub fn lease_timing(mut self, duration: Duration, renew_every: Duration) -> Self {
        self.0.lease.duration = duration;
        self.0.lease.renew_every = renew_every;
        self
    }

    pub fn teardown_timeout(mut self, timeout: Duration) -> Self {
        self.0.cluster.teardown_timeout = timeout;
        self
    }

    /// Evictions through `client` (one without retries, so that a refused
    /// eviction is seen as the drain sees it).
    pub fn eviction_client(mut self, client: kube::Client) -> Self {
        self.0.cluster.eviction_client = Some(gpu_operator::cluster::EvictionClient(client));
        self
    }

    pub fn upgrade_timeouts(mut self, timeouts: gpu_operator::cluster::upgrade::Timeouts) -> Self {
        self.0.cluster.upgrade_timeouts = timeouts;
        self
    }

    pub fn remediation_confirm(
        mut self,
        confirm: gpu_operator::remediation::plan::Confirm,
    ) -> Self {
        self.0.cluster.remediation_confirm = confirm;
        self
    }

    pub fn build(self) -> LeaderConfig {
        self.0
    }
}
