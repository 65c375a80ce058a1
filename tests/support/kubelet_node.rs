//! A GPU Node as a real cluster holds it, for the scale benches and the
//! leader's cache tests: what the kubelet writes (50 images with digests and
//! sizes, addresses, capacity and allocatable, the usual conditions,
//! `nodeInfo`, daemon endpoints), Node Feature Discovery's labels and
//! annotations, the agent's labels, and the `managedFields` of each of those
//! writers. About 18 KB of JSON. One builder for every bench and test that
//! needs a realistic Node.

use super::fixtures::AgentStatusBuilder;
use gpu_operator::api::agent_status::STATUS_ANNOTATION;
use gpu_operator::api::field_manager;
use gpu_operator::detect::GPU_LABEL;
use serde_json::{Map, Value, json};

/// The status annotation of an agent serving the device plugin of
/// DeviceConfig `namespace/fleet` (uid `uid`) at `generation`, as the
/// simulated fleets of the benches report it.
pub fn fleet_agent_status(namespace: &str, generation: i64, uid: &str) -> String {
    AgentStatusBuilder::serving(namespace, "fleet")
        .acting_on(uid, generation)
        .resource("amd.com/gpu", 8)
        .driver_version("6.12.12")
        .to_json()
}

/// The name of the `index`th Node.
pub fn node_name(index: usize) -> String {
    format!("gpu-{index:05}")
}

/// A hex digest, the same for the same `seed` (images are shared across a
/// fleet, as they are on real nodes running the same workloads).
fn digest(seed: u64) -> String {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..4)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            format!("{x:016x}")
        })
        .collect()
}

fn images(index: usize) -> Vec<Value> {
    let common = [
        "registry.k8s.io/kube-proxy",
        "registry.k8s.io/pause",
        "docker.io/rocm/k8s-device-plugin",
        "docker.io/rocm/gpu-operator-agent",
        "docker.io/rocm/device-metrics-exporter",
        "docker.io/rocm/pytorch",
        "docker.io/rocm/vllm",
        "quay.io/prometheus/node-exporter",
        "docker.io/calico/node",
        "docker.io/calico/cni",
    ];
    (0..50u64)
        .map(|k| {
            let repo = match common.get(k as usize) {
                Some(r) => (*r).to_owned(),
                None => format!("registry.example.com/ml-team-{}/training-job-{k}", k % 7),
            };
            // A few images differ per node (what last ran there).
            let seed = if k >= 45 {
                k * 1_000_003 + index as u64
            } else {
                k
            };
            json!({
                "names": [
                    format!("{repo}@sha256:{}", digest(seed)),
                    format!("{repo}:v1.{}.{}", k % 30, seed % 10),
                ],
                "sizeBytes": 20_000_000 + (seed * 7_919_317) % 9_000_000_000,
            })
        })
        .collect()
}

const CONDITIONS: [(&str, &str, &str, &str); 4] = [
    (
        "MemoryPressure",
        "False",
        "KubeletHasSufficientMemory",
        "kubelet has sufficient memory available",
    ),
    (
        "DiskPressure",
        "False",
        "KubeletHasNoDiskPressure",
        "kubelet has no disk pressure",
    ),
    (
        "PIDPressure",
        "False",
        "KubeletHasSufficientPID",
        "kubelet has sufficient PID available",
    ),
    (
        "Ready",
        "True",
        "KubeletReady",
        "kubelet is posting ready status",
    ),
];

fn labels(index: usize) -> Map<String, Value> {
    let mut labels = Map::new();
    let mut put = |k: &str, v: String| {
        labels.insert(k.to_owned(), Value::String(v));
    };
    put("kubernetes.io/hostname", node_name(index));
    put("kubernetes.io/arch", "amd64".into());
    put("kubernetes.io/os", "linux".into());
    put("beta.kubernetes.io/arch", "amd64".into());
    put("beta.kubernetes.io/os", "linux".into());
    put("node.kubernetes.io/instance-type", "mi300x-8gpu".into());
    put("topology.kubernetes.io/region", "us-central".into());
    put(
        "topology.kubernetes.io/zone",
        format!("us-central-{}", index % 3),
    );
    put(GPU_LABEL, "true".into());
    for feature in [
        "cpu-cpuid.ADX",
        "cpu-cpuid.AESNI",
        "cpu-cpuid.AVX",
        "cpu-cpuid.AVX2",
        "cpu-cpuid.AVX512F",
        "cpu-cpuid.FMA3",
        "cpu-cpuid.SHA",
        "cpu-hardware_multithreading",
        "cpu-model.vendor_id",
        "kernel-version.major",
        "pci-1002.present",
        "pci-15b3.present",
        "storage-nonrotationaldisk",
        "system-os_release.ID",
        "system-os_release.VERSION_ID",
    ] {
        put(
            &format!("feature.node.kubernetes.io/{feature}"),
            "true".into(),
        );
    }
    for (k, v) in [
        ("amd.com/gpu.family", "AI"),
        ("amd.com/gpu.device-id", "74a1"),
        ("amd.com/gpu.product-name", "AMD_Instinct_MI300X_OAM"),
        ("amd.com/gpu.vram", "192G"),
        ("amd.com/gpu.compute-partitioning-supported", "true"),
        ("amd.com/gpu.driver-version", "6.12.12"),
    ] {
        put(k, v.into());
    }
    labels
}

/// `{"f:<key>": {}}` for each key.
fn owned(keys: impl IntoIterator<Item = impl AsRef<str>>) -> Value {
    Value::Object(
        keys.into_iter()
            .map(|k| (format!("f:{}", k.as_ref()), json!({})))
            .collect(),
    )
}

/// The Node named [`node_name`]`(index)` as a kubelet, NFD and the agent
/// wrote it; with the agent's status annotation `agent_status` when given
/// (owned by the agent's status field manager, as the real agent writes it).
pub fn kubelet_node(index: usize, agent_status: Option<&str>) -> Value {
    let name = node_name(index);
    let labels = labels(index);
    let (ours, theirs): (Vec<&String>, Vec<&String>) =
        labels.keys().partition(|k| k.starts_with("amd.com/"));
    let (nfd_labels, kubelet_labels): (Vec<&String>, Vec<&String>) = theirs
        .into_iter()
        .partition(|k| k.starts_with("feature.node.kubernetes.io/"));
    let time = "2026-11-30T00:00:00Z";
    let mut annotations = json!({
        "kubeadm.alpha.kubernetes.io/cri-socket": "unix:///var/run/containerd/containerd.sock",
        "node.alpha.kubernetes.io/ttl": "0",
        "volumes.kubernetes.io/controller-managed-attach-detach": "true",
        "csi.volume.kubernetes.io/nodeid": format!("{{\"ebs.csi.aws.com\":\"i-0{index:016x}\"}}"),
        "nfd.node.kubernetes.io/feature-labels": nfd_labels.iter()
            .map(|k| k.trim_start_matches("feature.node.kubernetes.io/"))
            .collect::<Vec<_>>().join(","),
        "nfd.node.kubernetes.io/extended-resources": "",
    });
    let condition_fields: Map<String, Value> = CONDITIONS
        .iter()
        .map(|(type_, ..)| {
            (
                format!("k:{{\"type\":\"{type_}\"}}"),
                json!({".": {}, "f:lastHeartbeatTime": {}, "f:lastTransitionTime": {},
                       "f:message": {}, "f:reason": {}, "f:status": {}, "f:type": {}}),
            )
        })
        .collect();
    let mut managed = vec![
        json!({"manager": "kubelet", "operation": "Update", "apiVersion": "v1", "time": time,
            "fieldsType": "FieldsV1", "fieldsV1": {"f:metadata": {
                "f:annotations": owned(["kubeadm.alpha.kubernetes.io/cri-socket",
                    "node.alpha.kubernetes.io/ttl",
                    "volumes.kubernetes.io/controller-managed-attach-detach"]),
                "f:labels": owned(&kubelet_labels)},
                "f:spec": {"f:providerID": {}}}}),
        json!({"manager": "kube-controller-manager", "operation": "Update", "apiVersion": "v1",
            "time": time, "fieldsType": "FieldsV1",
            "fieldsV1": {"f:spec": {"f:podCIDR": {}, "f:podCIDRs": {".": {}, "v:\"10.244.0.0/24\"": {}}}}}),
        json!({"manager": "nfd-master", "operation": "Update", "apiVersion": "v1", "time": time,
            "fieldsType": "FieldsV1", "fieldsV1": {"f:metadata": {
                "f:annotations": owned(["nfd.node.kubernetes.io/feature-labels",
                    "nfd.node.kubernetes.io/extended-resources"]),
                "f:labels": owned(&nfd_labels)}}}),
        json!({"manager": "kubelet", "operation": "Update", "apiVersion": "v1", "time": time,
            "subresource": "status", "fieldsType": "FieldsV1", "fieldsV1": {"f:metadata": {
                "f:annotations": owned(["csi.volume.kubernetes.io/nodeid"])},
              "f:status": {
                "f:addresses": {".": {}, "k:{\"type\":\"Hostname\"}": {".": {}, "f:address": {}, "f:type": {}},
                    "k:{\"type\":\"InternalIP\"}": {".": {}, "f:address": {}, "f:type": {}}},
                "f:allocatable": owned(["amd.com/gpu", "cpu", "ephemeral-storage", "hugepages-1Gi", "hugepages-2Mi", "memory", "pods"]),
                "f:capacity": owned(["amd.com/gpu", "cpu", "ephemeral-storage", "hugepages-1Gi", "hugepages-2Mi", "memory", "pods"]),
                "f:conditions": Value::Object(condition_fields),
                "f:daemonEndpoints": {"f:kubeletEndpoint": {"f:Port": {}}},
                "f:features": {".": {}, "f:supplementalGroupsPolicy": {}},
                "f:images": {},
                "f:nodeInfo": owned(["architecture", "bootID", "containerRuntimeVersion", "kernelVersion",
                    "kubeProxyVersion", "kubeletVersion", "machineID", "operatingSystem", "osImage", "systemUUID"]),
                "f:runtimeHandlers": {}}}}),
        json!({"manager": field_manager::LABELLER, "operation": "Apply", "apiVersion": "v1",
            "time": time, "fieldsType": "FieldsV1",
            "fieldsV1": {"f:metadata": {"f:labels": owned(&ours)}}}),
    ];
    if let Some(status) = agent_status {
        annotations[STATUS_ANNOTATION] = json!(status);
        managed.push(
            json!({"manager": field_manager::AGENT_STATUS, "operation": "Apply",
            "apiVersion": "v1", "time": time, "fieldsType": "FieldsV1",
            "fieldsV1": {"f:metadata": {"f:annotations": owned([STATUS_ANNOTATION])}}}),
        );
    }
    let quantities = json!({"amd.com/gpu": "8", "cpu": "192", "ephemeral-storage": "3750157048Ki",
        "hugepages-1Gi": "0", "hugepages-2Mi": "0", "memory": "2113389100Ki", "pods": "110"});
    let conditions: Vec<Value> = CONDITIONS
        .iter()
        .map(|(type_, status, reason, message)| {
            json!({"type": type_, "status": status, "reason": reason, "message": message,
                "lastHeartbeatTime": time, "lastTransitionTime": "2026-11-01T00:00:00Z"})
        })
        .collect();
    json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": labels, "annotations": annotations,
            "managedFields": managed},
        "spec": {"podCIDR": "10.244.0.0/24", "podCIDRs": ["10.244.0.0/24"],
            "providerID": format!("aws:///us-central-1a/i-0{index:016x}")},
        "status": {
            "addresses": [{"type": "InternalIP", "address": format!("10.{}.{}.{}", index >> 16 & 255, index >> 8 & 255, index & 255)},
                {"type": "Hostname", "address": node_name(index)}],
            "allocatable": quantities, "capacity": quantities,
            "conditions": conditions,
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            "features": {"supplementalGroupsPolicy": true},
            "images": images(index),
            "nodeInfo": {"architecture": "amd64", "bootID": format!("boot-{index}"),
                "containerRuntimeVersion": "containerd://1.7.24", "kernelVersion": "6.8.0-49-generic",
                "kubeProxyVersion": "v1.34.1", "kubeletVersion": "v1.34.1",
                "machineID": digest(index as u64 + 7)[..32].to_owned(), "operatingSystem": "linux",
                "osImage": "Ubuntu 24.04.1 LTS", "systemUUID": format!("ec2{index:029x}")},
            "runtimeHandlers": [{"name": "", "features": {"recursiveReadOnlyMounts": true, "userNamespaces": true}},
                {"name": "runc", "features": {"recursiveReadOnlyMounts": true, "userNamespaces": true}}],
        }
    })
}
