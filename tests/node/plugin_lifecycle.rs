//! The device plugin over time: kubelet restarts, lost sockets, repartitioning,
//! health changes, reconfiguration and stopping.

use crate::support;

use std::time::Duration;

use gpu_operator::device::Gpu;
use gpu_operator::device::watch::{DeviceWatch, WatchConfig};
use gpu_operator::plugin::ResourceNamingStrategy::{Mixed, Single};
use gpu_operator::plugin::{DevicePluginService, DeviceRef, HealthReport, PluginConfig};
use support::hosts::SimHost;
use support::kubelet::{DeviceStream, TestKubelet, WAIT, health_of};
use support::rig::Rig;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubelet_restart_leads_to_a_new_registration() {
    let mut rig = Rig::start("mi300x", None, Single).await;
    rig.kubelet().wait_for_registration("amd.com/gpu", 1).await;

    // The restart wipes the plugin socket; the plugin hears of it through
    // inotify and may have served it again before `restart` returns.
    rig.kubelet_mut().restart().await;
    // How fast is a benchmark figure (`cargo bench --bench plugin`); here only
    // that it happens, within the test kubelet's bounded wait.
    let again = rig.kubelet().wait_for_registration("amd.com/gpu", 2).await;
    assert_eq!(again.request.endpoint, "amd.com_gpu.sock");
    // Once: the wiped socket and the new kubelet.sock are one event. Several
    // poll intervals pass without another registration.
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert_eq!(rig.kubelet().registrations().len(), 2);
    assert!(
        rig.plugin_dir().join("amd.com_gpu.sock").exists(),
        "socket recreated"
    );

    // The new socket serves.
    let devices = rig.kubelet().first_list("amd.com_gpu.sock").await;
    assert_eq!(devices.len(), 8);
    rig.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recreated_kubelet_sock_alone_leads_to_a_new_registration() {
    use std::os::unix::fs::MetadataExt;
    let mut rig = Rig::start("mi300x", None, Single).await;
    rig.kubelet().wait_for_registration("amd.com/gpu", 1).await;
    let socket = rig.plugin_dir().join("amd.com_gpu.sock");
    let inode = std::fs::metadata(&socket).unwrap().ino();
    rig.kubelet_mut().recreate_socket().await;
    rig.kubelet().wait_for_registration("amd.com/gpu", 2).await;
    // The plugin socket was never touched: the new kubelet.sock alone caused
    // the registration.
    assert_eq!(std::fs::metadata(&socket).unwrap().ino(), inode);
    // Several poll intervals pass without another registration.
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert_eq!(rig.kubelet().registrations().len(), 2, "registered once");
    rig.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_plugin_socket_is_recreated_and_registered_again() {
    let mut rig = Rig::start("mi300x", None, Single).await;
    rig.kubelet().wait_for_registration("amd.com/gpu", 1).await;
    let socket = rig.plugin_dir().join("amd.com_gpu.sock");
    std::fs::remove_file(&socket).unwrap();
    rig.kubelet().wait_for_registration("amd.com/gpu", 2).await;
    assert!(socket.exists());
    let devices = rig.kubelet().first_list("amd.com_gpu.sock").await;
    assert_eq!(devices.len(), 8);
    rig.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registration_waits_for_a_late_kubelet() {
    let sim = SimHost::new("mi210", None);
    let dir = tempfile::tempdir().unwrap();
    let (_inventory_tx, inventory) = sim.feed();
    let (_health_tx, health) = tokio::sync::watch::channel(HealthReport::default());
    let plugin = DevicePluginService::start(
        PluginConfig::new(dir.path(), Single, sim.host.clone()),
        inventory,
        health,
    );
    let mut status = plugin.status();
    tokio::time::timeout(
        WAIT,
        status.wait_for(|s| s.error.as_deref().is_some_and(|e| e.contains("kubelet"))),
    )
    .await
    .expect("a registration error is reported")
    .unwrap();

    let kubelet = TestKubelet::start(dir.path()).await;
    let registered = kubelet.wait_for_registration("amd.com/gpu", 1).await;
    assert_eq!(registered.request.endpoint, "amd.com_gpu.sock");
    tokio::time::timeout(
        WAIT,
        status.wait_for(|s| s.error.is_none() && s.resources[0].registered),
    )
    .await
    .expect("the error clears")
    .unwrap();
    plugin.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repartitioning_updates_list_and_watch_without_a_restart() {
    // The real feed: discovery's watch rescans the simulated host.
    let mut rig = Rig::start("mi300x", None, Single).await;
    let watch = DeviceWatch::start(
        rig.sim.host.clone(),
        WatchConfig {
            rescan_interval: Duration::from_millis(200),
            use_udev: false,
            ..WatchConfig::default()
        },
    )
    .await;
    let mut feed = watch.inventory();
    let forward = rig.inventory().clone();
    let forwarder = tokio::spawn(async move {
        while feed.changed().await.is_ok() {
            let next = feed.borrow_and_update().clone();
            forward.send_replace(next);
        }
    });

    rig.kubelet().wait_for_registration("amd.com/gpu", 1).await;
    let mut stream = rig.kubelet().list_and_watch("amd.com_gpu.sock").await;
    assert_eq!(stream.next().await.len(), 8);

    rig.sim.rewrite("mi300x", Some("cpx_nps4"));
    let devices = stream
        .next_matching("64 partitions", |d| d.len() == 64)
        .await;
    assert!(devices.iter().all(|d| d.health == "Healthy"));

    rig.sim.rewrite("mi300x", Some("dpx_nps1"));
    stream
        .next_matching("16 partitions", |d| d.len() == 16)
        .await;
    assert_eq!(
        rig.kubelet().registrations().len(),
        1,
        "no re-registration was needed"
    );
    forwarder.abort();
    rig.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mixed_resources_come_and_go_with_the_partition_layout() {
    let mut rig = Rig::start_with_gpus("mi300x", Some(4), None, Mixed).await;
    rig.kubelet()
        .wait_for_registration("amd.com/spx_nps1", 1)
        .await;
    let mut spx_stream = rig.kubelet().list_and_watch("amd.com_spx_nps1.sock").await;
    assert_eq!(spx_stream.next().await.len(), 4);

    rig.sim.rewrite_with("mi300x", Some(4), Some("cpx_nps4"));
    rig.rediscover();
    rig.kubelet()
        .wait_for_registration("amd.com/cpx_nps4", 1)
        .await;
    assert!(
        spx_stream.ended().await,
        "the withdrawn resource's stream ends"
    );
    let status = rig
        .wait_status("only cpx_nps4", |s| {
            s.resources.len() == 1 && s.resources[0].registered
        })
        .await;
    assert_eq!(status.resources[0].name, "amd.com/cpx_nps4");
    assert_eq!(status.resources[0].devices, 32);
    assert_eq!(rig.sockets(), ["amd.com_cpx_nps4.sock", "kubelet.sock"]);
    rig.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn devices_turn_unhealthy_and_recover() {
    let mut rig = Rig::start_with_gpus("mi300x", Some(2), Some("cpx_nps4"), Single).await;
    rig.kubelet().wait_for_registration("amd.com/gpu", 1).await;
    let mut stream = rig.kubelet().list_and_watch("amd.com_gpu.sock").await;
    stream.next().await;
    let inventory = rig.sim.discover();
    let gpu = &inventory.gpus[1];
    a_device_node_goes_and_comes_back(&rig, &mut stream, gpu).await;

    // Another health source flags the whole GPU: all its partitions go.
    let mut report = HealthReport::default();
    report.unhealthy.insert(
        DeviceRef::gpu(gpu.bdf.clone()),
        "uncorrectable ECC errors".into(),
    );
    rig.health().send_replace(report);
    let devices = stream
        .next_matching("8 unhealthy", |d| {
            d.iter().filter(|d| d.health == "Unhealthy").count() == 8
        })
        .await;
    assert_eq!(health_of(&devices, &gpu.bdf), Some("Unhealthy"));
    let status = rig
        .wait_status("8 healthy", |s| s.resources[0].healthy == 8)
        .await;
    assert_eq!(status.resources[0].devices, 16);
    rig.health().send_replace(HealthReport::default());
    stream
        .next_matching("all healthy again", |d| {
            d.iter().all(|d| d.health == "Healthy")
        })
        .await;

    // Without /dev/kfd nothing can run.
    rig.sim.host.remove_all("/dev/kfd").unwrap();
    stream
        .next_matching("all unhealthy", |d| {
            d.iter().all(|d| d.health == "Unhealthy")
        })
        .await;
    rig.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_stream_does_not_disturb_the_plugin() {
    let mut rig = Rig::start("mi300x", None, Single).await;
    rig.kubelet().wait_for_registration("amd.com/gpu", 1).await;
    for _ in 0..3 {
        let mut stream = rig.kubelet().list_and_watch("amd.com_gpu.sock").await;
        stream.next().await;
        drop(stream);
    }
    // Changes still flow to a new stream, and the old ones are gone.
    let mut stream = rig.kubelet().list_and_watch("amd.com_gpu.sock").await;
    stream.next().await;
    rig.sim.host.remove_all("/dev/kfd").unwrap();
    stream
        .next_matching("all unhealthy", |d| {
            d.iter().all(|d| d.health == "Unhealthy")
        })
        .await;
    assert!(rig.plugin().status().borrow().running);
    rig.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconfiguring_the_strategy_swaps_resources() {
    let mut rig = Rig::start_with_gpus("mi300x", Some(2), Some("cpx_nps4"), Single).await;
    rig.kubelet().wait_for_registration("amd.com/gpu", 1).await;
    rig.plugin().reconfigure(rig.config(Mixed)).await.unwrap();
    rig.kubelet()
        .wait_for_registration("amd.com/cpx_nps4", 1)
        .await;
    rig.wait_status("only cpx_nps4", |s| {
        s.resources.len() == 1 && s.resources[0].name == "amd.com/cpx_nps4"
    })
    .await;
    assert_eq!(rig.sockets(), ["amd.com_cpx_nps4.sock", "kubelet.sock"]);

    // A new directory moves every socket.
    let other = tempfile::tempdir().unwrap();
    let kubelet = TestKubelet::start(other.path()).await;
    let mut config = rig.config(Mixed);
    config.device_plugin_dir = other.path().to_path_buf();
    rig.plugin().reconfigure(config).await.unwrap();
    kubelet.wait_for_registration("amd.com/cpx_nps4", 1).await;
    let old_socket = rig.plugin_dir().join("amd.com_cpx_nps4.sock");
    support::wait::eventually("the old socket removed", || !old_socket.exists()).await;
    rig.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stopping_removes_the_sockets_and_ends_streams() {
    let mut rig = Rig::start("mi300x", None, Single).await;
    rig.kubelet().wait_for_registration("amd.com/gpu", 1).await;
    let mut stream = rig.kubelet().list_and_watch("amd.com_gpu.sock").await;
    stream.next().await;
    let status = rig.plugin().status();
    rig.stop().await;
    assert_eq!(rig.sockets(), ["kubelet.sock"]);
    assert!(!status.borrow().running);
    assert!(stream.ended().await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closed_inventory_feed_keeps_the_last_inventory() {
    let sim = SimHost::new("mi300x", None);
    let dir = tempfile::tempdir().unwrap();
    let kubelet = TestKubelet::start(dir.path()).await;
    let (inventory_tx, inventory) = sim.feed();
    let (health_tx, health) = tokio::sync::watch::channel(HealthReport::default());
    drop(health_tx);
    let plugin = DevicePluginService::start(
        PluginConfig::new(dir.path(), Single, sim.host.clone()),
        inventory,
        health,
    );
    kubelet.wait_for_registration("amd.com/gpu", 1).await;
    drop(inventory_tx);
    let mut stream = kubelet.list_and_watch("amd.com_gpu.sock").await;
    assert_eq!(stream.next().await.len(), 8);
    // Presence checks still run.
    sim.host.remove_all("/dev/kfd").unwrap();
    stream
        .next_matching("all unhealthy", |d| {
            d.iter().all(|d| d.health == "Unhealthy")
        })
        .await;
    plugin.stop().await;
}

/// With its watches in place the plugin looks when the device-plugin
/// directory or `/dev` changes, not on a timer: with the poll interval at an
/// hour, a deleted plugin socket, a new `kubelet.sock` and a removed device
/// node are each acted on within the test's bounded wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changes_are_acted_on_when_inotify_reports_them_without_a_timer() {
    let mut rig = Rig::start_with_gpus("mi300x", Some(2), Some("cpx_nps4"), Single).await;
    rig.kubelet().wait_for_registration("amd.com/gpu", 1).await;
    let mut config = rig.config(Single);
    config.poll_interval = Duration::from_secs(3600);
    rig.plugin().reconfigure(config).await.unwrap();
    // A new poll interval restarts the servers, which register again.
    rig.kubelet().wait_for_registration("amd.com/gpu", 2).await;

    let socket = rig.plugin_dir().join("amd.com_gpu.sock");
    std::fs::remove_file(&socket).unwrap();
    rig.kubelet().wait_for_registration("amd.com/gpu", 3).await;
    assert!(socket.exists(), "served again");

    rig.kubelet_mut().recreate_socket().await;
    rig.kubelet().wait_for_registration("amd.com/gpu", 4).await;

    let mut stream = rig.kubelet().list_and_watch("amd.com_gpu.sock").await;
    stream.next().await;
    let inventory = rig.sim.discover();
    a_device_node_goes_and_comes_back(&rig, &mut stream, &inventory.gpus[1]).await;
    rig.stop().await;
}

/// Removes the DRM card node of `gpu`'s first partition: that partition
/// alone turns unhealthy; made again, every device is healthy again.
async fn a_device_node_goes_and_comes_back(rig: &Rig, stream: &mut DeviceStream, gpu: &Gpu) {
    let card = format!("/dev/dri/card{}", gpu.partitions[0].card.unwrap());
    rig.sim.host.remove_all(&card).unwrap();
    let devices = stream
        .next_matching("partition 0 unhealthy", |d| {
            health_of(d, &gpu.bdf) == Some("Unhealthy")
        })
        .await;
    assert_eq!(
        devices.iter().filter(|d| d.health == "Unhealthy").count(),
        1
    );
    rig.sim.host.write(&card, "").unwrap();
    stream
        .next_matching("all healthy again", |d| {
            d.iter().all(|d| d.health == "Healthy")
        })
        .await;
}

/// A directory that does not exist yet cannot be watched: the plugin looks
/// every poll interval until it can, registers once the kubelet is there,
/// and watches the directory again after it was removed and made again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_device_plugin_directory_made_late_or_made_again_is_watched() {
    let sim = SimHost::new("mi210", None);
    let scratch = tempfile::tempdir().unwrap();
    let dir = scratch.path().join("device-plugins");
    let (_inventory_tx, inventory) = sim.feed();
    let (_health_tx, health) = tokio::sync::watch::channel(HealthReport::default());
    let plugin = DevicePluginService::start(
        PluginConfig::new(&dir, Single, sim.host.clone()),
        inventory,
        health,
    );
    let mut status = plugin.status();
    tokio::time::timeout(
        WAIT,
        status.wait_for(|s| {
            s.error
                .as_deref()
                .is_some_and(|e| e.contains("cannot serve"))
        }),
    )
    .await
    .expect("the missing directory is reported")
    .unwrap();

    std::fs::create_dir(&dir).unwrap();
    let mut kubelet = TestKubelet::start(&dir).await;
    kubelet.wait_for_registration("amd.com/gpu", 1).await;

    // The kubelet's directory wiped and made again: the watch went with it.
    kubelet.stop().await;
    std::fs::remove_dir_all(&dir).unwrap();
    std::fs::create_dir(&dir).unwrap();
    kubelet.recreate_socket().await;
    kubelet.wait_for_registration("amd.com/gpu", 2).await;
    // A resource registers only once its socket is served.
    assert!(
        dir.join("amd.com_gpu.sock").exists(),
        "served in the new directory"
    );
    plugin.stop().await;
}
