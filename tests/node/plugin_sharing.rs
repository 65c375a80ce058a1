//! GPU sharing (time-slicing) in the device plugin, against the test kubelet
//! built from the published device plugin protos: replicas in ListAndWatch,
//! Allocate of replicas, the one-replica rule, preferred allocations that
//! spread, renaming, and the replica count changed on a live plugin.

use crate::support;

use std::collections::BTreeSet;

use gpu_operator::plugin::ResourceNamingStrategy::Single;
use gpu_operator::plugin::api::v1beta1::device_plugin_client::DevicePluginClient;
use gpu_operator::plugin::{DeviceRef, HealthReport, PluginConfig, TimeSlicing, parent_id};
use support::kubelet::{allocate_request, health_of, numa_of, preferred_request};
use support::rig::Rig;
use tonic::Code;

fn shared(rig: &Rig, replicas: u32, rename: bool, fail: bool) -> PluginConfig {
    PluginConfig {
        sharing: TimeSlicing {
            replicas,
            rename,
            fail_requests_greater_than_one: fail,
        },
        ..rig.config(Single)
    }
}

/// The kubelet's GetPreferredAllocation for one container of `size`.
async fn preferred(
    client: &mut DevicePluginClient<tonic::transport::Channel>,
    available: &[String],
    size: i32,
) -> Vec<String> {
    client
        .get_preferred_allocation(preferred_request(available, &[], size))
        .await
        .expect("GetPreferredAllocation")
        .into_inner()
        .container_responses[0]
        .device_i_ds
        .clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_replicas_of_an_mi300x_are_32_devices_that_allocate_and_spread_over_gpus() {
    let mut rig = Rig::start("mi300x", None, Single).await;
    rig.kubelet().wait_for_registration("amd.com/gpu", 1).await;
    let mut stream = rig.kubelet().list_and_watch("amd.com_gpu.sock").await;
    assert_eq!(stream.next().await.len(), 8);

    // Shared live: the same resource, its stream re-advertises, no restart.
    rig.plugin()
        .reconfigure(shared(&rig, 4, false, false))
        .await
        .unwrap();
    let devices = stream.next_matching("32 replicas", |d| d.len() == 32).await;
    let inventory = rig.sim.discover();
    for gpu in &inventory.gpus {
        let replicas: Vec<_> = devices
            .iter()
            .filter(|d| parent_id(&d.id) == gpu.bdf)
            .collect();
        let ids: BTreeSet<&str> = replicas.iter().map(|d| d.id.as_str()).collect();
        let wanted: BTreeSet<String> = (0..4).map(|n| format!("{}::{n}", gpu.bdf)).collect();
        assert_eq!(ids, wanted.iter().map(String::as_str).collect());
        let numa = gpu.numa_node.filter(|n| *n >= 0).map(i64::from);
        assert!(
            replicas
                .iter()
                .all(|d| numa_of(d) == numa && d.id.len() <= 63)
        );
    }
    assert_eq!(
        rig.kubelet().registrations().len(),
        1,
        "a new replica count does not register again"
    );

    let mut client = rig.kubelet().client("amd.com_gpu.sock").await;
    // Two replicas of one GPU: allowed, its nodes once.
    let bdf = &inventory.gpus[0].bdf;
    let card = inventory.gpus[0].card.unwrap();
    let a = format!("{bdf}::0");
    let b = format!("{bdf}::1");
    let response = client
        .allocate(allocate_request(&[&a, &b]))
        .await
        .expect("two replicas of one GPU are allowed")
        .into_inner();
    let paths: Vec<String> = response.container_responses[0]
        .devices
        .iter()
        .map(|d| d.host_path.clone())
        .collect();
    assert_eq!(
        paths.len(),
        3,
        "/dev/kfd and the GPU's two nodes, once: {paths:?}"
    );
    assert!(paths.contains(&format!("/dev/dri/card{card}")));

    // Four replicas out of all: four GPUs while they are free.
    let available: Vec<String> = devices.iter().map(|d| d.id.clone()).collect();
    let picked = preferred(&mut client, &available, 4).await;
    let gpus: BTreeSet<&str> = picked.iter().map(|id| parent_id(id)).collect();
    assert_eq!((picked.len(), gpus.len()), (4, 4), "{picked:?}");
    // Ten out of all: eight GPUs, then packed.
    let picked = preferred(&mut client, &available, 10).await;
    let gpus: BTreeSet<&str> = picked.iter().map(|id| parent_id(id)).collect();
    assert_eq!((picked.len(), gpus.len()), (10, 8), "{picked:?}");

    // A sick GPU: all its replicas go with it.
    let mut report = HealthReport::default();
    report.unhealthy.insert(
        DeviceRef::gpu(bdf.clone()),
        "uncorrectable ECC errors".into(),
    );
    rig.health().send_replace(report);
    let devices = stream
        .next_matching("4 unhealthy replicas", |d| {
            d.iter().filter(|d| d.health == "Unhealthy").count() == 4
        })
        .await;
    assert_eq!(health_of(&devices, &b), Some("Unhealthy"));

    // Back to 2 replicas, live.
    rig.health().send_replace(HealthReport::default());
    rig.plugin()
        .reconfigure(shared(&rig, 2, false, false))
        .await
        .unwrap();
    stream.next_matching("16 replicas", |d| d.len() == 16).await;
    rig.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_fail_flag_a_request_for_two_replicas_is_refused() {
    let mut rig = Rig::start_with_gpus("mi210", Some(2), None, Single).await;
    rig.plugin()
        .reconfigure(shared(&rig, 2, false, true))
        .await
        .unwrap();
    rig.kubelet().wait_for_registration("amd.com/gpu", 1).await;
    let mut stream = rig.kubelet().list_and_watch("amd.com_gpu.sock").await;
    let devices = stream.next_matching("replicas", |d| d.len() == 4).await;
    let mut client = rig.kubelet().client("amd.com_gpu.sock").await;
    let status = client
        .allocate(allocate_request(&[&devices[0].id, &devices[1].id]))
        .await
        .expect_err("more than one replica is refused");
    assert_eq!(status.code(), Code::InvalidArgument);
    assert_eq!(
        status.message(),
        "request for 'amd.com/gpu: 2' too large: maximum request size for shared resources is 1"
    );
    client
        .allocate(allocate_request(&[&devices[0].id]))
        .await
        .expect("one replica is served");
    rig.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renaming_advertises_amd_com_gpu_shared_instead() {
    let mut rig = Rig::start_with_gpus("mi210", Some(2), None, Single).await;
    rig.kubelet().wait_for_registration("amd.com/gpu", 1).await;
    rig.plugin()
        .reconfigure(shared(&rig, 3, true, false))
        .await
        .unwrap();
    let registered = rig
        .kubelet()
        .wait_for_registration("amd.com/gpu.shared", 1)
        .await
        .request;
    assert_eq!(registered.endpoint, "amd.com_gpu.shared.sock");
    let status = rig
        .wait_status("only amd.com/gpu.shared", |s| {
            s.resources.len() == 1 && s.resources[0].name == "amd.com/gpu.shared"
        })
        .await;
    assert_eq!(status.resources[0].devices, 6);
    assert!(
        !rig.sockets().contains(&"amd.com_gpu.sock".to_owned()),
        "the exclusive resource is withdrawn: {:?}",
        rig.sockets()
    );
    rig.stop().await;
}
