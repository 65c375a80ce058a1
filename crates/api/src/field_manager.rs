//! Field-manager names: who wrote what, as the API server records it in each
//! object's `managedFields`. Every write this program makes (patch, apply,
//! create, replace) names one of these, through [`patch`], [`post`] or
//! [`apply`], so that the server can tell the concerns apart.
//!
//! Not covered: Events sent through `crate::events::SeriesRecorder` (an
//! Event is written by one recorder only, and the server records the
//! client's user agent), and TokenReview / SubjectAccessReview
//! creations, which are questions to the server and store nothing.
//!
//! Plain data: this module must not talk to the API itself.

use kube::api::{PatchParams, PostParams};

/// The node agent's writes that are not about one Node concern: the test
/// runner's result Events. Earlier versions also wrote the GPU labels, the
/// status annotation and the running-state labels under this name (the
/// Node writer takes those over, see `node_writer`).
pub const AGENT: &str = "gpu-operator-agent";

/// The agent status annotation on the agent's own Node (server-side apply).
pub const AGENT_STATUS: &str = "gpu-operator-agent-status";

/// The GPU labels on the agent's own Node (server-side apply).
pub const LABELLER: &str = "gpu-operator-labeller";

/// The test runner's running-state labels and the removal of handled test
/// requests on the agent's own Node.
pub const TEST_RUNNER: &str = "gpu-operator-test-runner";

/// The health monitor: the `AMDGPUUnhealthy` Node condition and the
/// `metricsexporter.amd.com.gpu.<id>.state` labels (server-side apply).
pub const HEALTH: &str = "gpu-operator-health";

/// The operator-side driver-type label
/// (`gpu.operator.amd.com/<ns>.<name>.driver`) on the agent's own Node
/// (server-side apply). Later also the driver lifecycle's own labels.
pub const DRIVER: &str = "gpu-operator-driver";

/// The cluster role's driver upgrades, on every Node it upgrades: the
/// upgrade record and state label (server-side apply), the cordon and the
/// upgrade taint (guarded patches: `spec.taints` is an atomic list).
pub const UPGRADE: &str = "gpu-operator-upgrade";

/// The agent's partition changes: the `dcm.amd.com/gpu-config-profile-state`
/// label of its own Node (server-side apply).
pub const PARTITION: &str = "gpu-operator-partition";

/// The cluster role's partition changes, on every Node it drains for one:
/// the record annotation (server-side apply), the cordon and taint (guarded
/// patches).
pub const PARTITION_LEADER: &str = "gpu-operator-partition-leader";

/// `gpu-operator detect`: the `feature.node.kubernetes.io/amd-gpu` (and
/// `amd-vgpu`, per-model) labels of its own Node, where NFD is not installed
/// (server-side apply).
pub const DETECT: &str = "gpu-operator-detect";

/// The cluster role's remediations, on every Node it remediates: the record
/// annotation and `nodeRemediationLabels` (server-side apply), the
/// remediation taints (guarded patches), and the removal of the person's
/// force-resume and abort labels once acted on (guarded patches).
pub const REMEDIATION: &str = "gpu-operator-remediation";

/// The DRA kubelet plugin: the agent's own node's ResourceSlices
/// (server-side apply).
pub const DRA: &str = "gpu-operator-dra";

/// The cluster role: the Lease, DeviceConfig status and finalizer, and the
/// metrics Service and ServiceMonitor it owns (server-side apply).
pub const LEADER: &str = "gpu-operator-leader";

/// `gpu-operator crd --apply` and `gpu-operator uninstall` (the Helm
/// chart's hooks): the CRDs (server-side apply); DeviceConfig deletions,
/// which the server does not attribute.
pub const INSTALL: &str = "gpu-operator-install";

/// Parameters of a patch by `manager`.
pub fn patch(manager: &str) -> PatchParams {
    PatchParams {
        field_manager: Some(manager.to_owned()),
        ..PatchParams::default()
    }
}

/// Parameters of a create or replace by `manager`.
pub fn post(manager: &str) -> PostParams {
    PostParams {
        field_manager: Some(manager.to_owned()),
        ..PostParams::default()
    }
}

/// Parameters of a forced server-side apply by `manager`: the objects it
/// applies are its own, and it takes their fields back from anyone else.
pub fn apply(manager: &str) -> PatchParams {
    PatchParams::apply(manager).force()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_write_names_its_manager() {
        for manager in [
            AGENT,
            AGENT_STATUS,
            LABELLER,
            TEST_RUNNER,
            HEALTH,
            DRIVER,
            UPGRADE,
            DRA,
            LEADER,
            DETECT,
            INSTALL,
        ] {
            assert_eq!(patch(manager).field_manager.as_deref(), Some(manager));
            assert_eq!(post(manager).field_manager.as_deref(), Some(manager));
            let applied = apply(manager);
            assert_eq!(applied.field_manager.as_deref(), Some(manager));
            assert!(applied.force);
        }
    }
}
