//! The health monitor feeding the real device plugin, as the agent wires them:
//! an ECC error on a simulated GPU turns its device Unhealthy in the kubelet's
//! `ListAndWatch`, and clearing it turns it Healthy again.

use crate::support;

use std::time::Instant;

use gpu_operator::health::{HealthConfig, HealthMonitor};
use gpu_operator::plugin::{DevicePluginService, PluginConfig, ResourceNamingStrategy};
use gpu_operator::service::Slot;
use gpu_operator::simulate;
use support::hosts::SimHost;
use support::kubelet::{TestKubelet, health_of};

#[tokio::test]
async fn an_ecc_error_reaches_list_and_watch_and_recovery_follows() {
    let sim = SimHost::new("mi210", None);
    let (_inventory_tx, inventory) = sim.feed();
    let monitor = HealthMonitor::new(inventory.clone());
    let report = monitor.report();
    let mut health = Slot::new(monitor);
    health
        .apply(Some(HealthConfig::new(sim.host.clone())))
        .await;

    let plugin_dir = tempfile::tempdir().unwrap();
    let kubelet = TestKubelet::start(plugin_dir.path()).await;
    let plugin = DevicePluginService::start(
        PluginConfig::new(
            plugin_dir.path(),
            ResourceNamingStrategy::Single,
            sim.host.clone(),
        ),
        inventory,
        report,
    );
    kubelet.wait_for_registration("amd.com/gpu", 1).await;
    let mut devices = kubelet.list_and_watch("amd.com_gpu.sock").await;
    let gpu = "0000:26:00.0";
    devices
        .next_matching("4 healthy devices", |d| {
            d.len() == 4 && d.iter().all(|d| d.health == "Healthy")
        })
        .await;

    let injected = Instant::now();
    simulate::set_ecc_counts(&sim.host, gpu, "umc", 1, 0).unwrap();
    let list = devices
        .next_matching("the GPU unhealthy", |d| {
            health_of(d, gpu) == Some("Unhealthy")
        })
        .await;
    eprintln!("ECC error to ListAndWatch: {:?}", injected.elapsed());
    let unhealthy: Vec<&str> = list
        .iter()
        .filter(|d| d.health != "Healthy")
        .map(|d| d.id.as_str())
        .collect();
    assert_eq!(unhealthy, [gpu], "only the GPU with the error");

    simulate::set_ecc_counts(&sim.host, gpu, "umc", 0, 0).unwrap();
    devices
        .next_matching("the GPU healthy again", |d| {
            health_of(d, gpu) == Some("Healthy")
        })
        .await;
    plugin.stop().await;
    health.stop().await;
}
