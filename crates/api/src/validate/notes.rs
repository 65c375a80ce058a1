//! The notes on fields this design ignores: which set fields have no effect,
//! by design or because what acts on them is not built yet, and why
//! ([`ignored_field_notes`]).
//!
//! This file owns the notes and their reasons. It must not judge a value:
//! whether one is acceptable is `validate`'s (the module's `mod.rs`), and a
//! field noted here is never a problem.

use std::fmt;

use crate::enums::PullPolicy;
use crate::semantics::ARG_DRIVER_TYPE;
use crate::types::{
    DEFAULT_TEST_RUNNER_LOGS, DaemonSetUpgradeSpec, DeviceConfigSpec, RemediationWorkflowSpec,
    default_exporter_resources, is_default,
};

/// A field that is set but has no effect: by design, or because what acts on
/// it is not built yet.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct IgnoredField {
    /// Field path, e.g. `spec.devicePlugin.devicePluginImage`.
    pub path: String,
    /// Why it has no effect.
    pub reason: String,
    /// True when the field is meant to work, but nothing acts on it yet.
    pub not_yet: bool,
}

impl fmt::Display for IgnoredField {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let what = if self.not_yet {
            "accepted, but not acted on yet"
        } else {
            "ignored in this design"
        };
        write!(f, "{}: {what} ({})", self.path, self.reason)
    }
}
const WHY_IMAGE: &str =
    "one gpu-operator binary does this work on every node; no operand image is pulled";
pub(super) const WHY_PULL_SECRET: &str = "no operand image is pulled";
const NOT_YET_DRIVER: &str = "not used yet: the agent loads amdgpu only from a verified bundle \
                              in the node's store (docs/driver.md), and does not install \
                              packages or sign modules";
const NOT_YET_VFIO: &str = "binding GPUs to vfio-pci for the passthrough driver types is not \
                            built yet; the driver type only picks the node labels";
const WHY_DRA_ARGUMENTS: &str = "flags of the reference DRA plugin binary; the agent's DRA plugin \
     takes its own flags (--cdi-dir, --dra-device-taints, --kubelet-dir)";
const WHY_REMEDIATION_IMAGE: &str = "no image is pulled: the mapping is read from the ConfigMap \
     remediationWorkflow.config names, else the built-in one (docs/remediation.md)";
const WHY_REMEDIATION_TTL: &str = "there are no Argo workflows to delete: a failed remediation \
     keeps its node tainted until a person removes the taint or asks for a new run";
const WHY_TOLERATIONS: &str =
    "the gpu-operator DaemonSet's own tolerations decide where the agent runs";
const WHY_DAEMONSET: &str =
    "there is no operand DaemonSet to update; the agent DaemonSet's update strategy applies";
const WHY_POD: &str = "there is no operand pod; set this on the gpu-operator DaemonSet";
const WHY_DRIVER_IMAGE: &str =
    "the agent installs the driver on the host itself; no driver image is built or pulled";
const WHY_NO_CONTAINER: &str =
    "the agent works on the host directly; there is no operand container";

/// Every field that is meant to work but that nothing acts on yet: the paths
/// [`ignored_field_notes`] can mark `not_yet`. `docs/deviceconfig.md` marks
/// each one "Not acted on yet" (a test keeps the two the same); remove a path
/// here, and its mark there, once its feature lands.
pub const NOT_ACTED_ON_YET: &[&str] = &[
    "spec.driver.amdgpuInstallerRepoURL",
    "spec.driver.imageSign",
    "spec.driver.driverType",
    "spec.driver.vfioConfig",
    "spec.devicePlugin.devicePluginArguments.driver_type",
    "spec.testRunner.logsLocation.logsExportSecrets",
];

/// The set fields that have no effect in this design, with their paths (e.g.
/// `spec.devicePlugin.devicePluginImage`). Empty for a spec that uses none.
pub fn ignored_fields(spec: &DeviceConfigSpec) -> Vec<String> {
    ignored_field_notes(spec)
        .into_iter()
        .map(|note| note.path)
        .collect()
}

/// [`ignored_fields`] with the reason for each.
pub fn ignored_field_notes(spec: &DeviceConfigSpec) -> Vec<IgnoredField> {
    let mut notes = Notes::default();
    let d = spec.driver();
    notes.not_yet(
        "spec.driver.amdgpuInstallerRepoURL",
        d.amdgpu_installer_repo_url.is_some(),
        NOT_YET_DRIVER,
    );
    notes.not_yet(
        "spec.driver.imageSign",
        !is_default(&d.image_sign),
        NOT_YET_DRIVER,
    );
    notes.set(
        "spec.driver.upgradePolicy.nodeDrainPolicy.ignoreDaemonSets",
        d.upgrade_policy
            .as_ref()
            .and_then(|p| p.node_drain_policy.as_ref())
            .is_some_and(|drain| !drain.ignore_daemon_sets),
        "DaemonSet pods are always left alone by the drain: their DaemonSet would put them straight back",
    );
    notes.not_yet("spec.driver.driverType", d.is_passthrough(), NOT_YET_VFIO);
    notes.not_yet(
        "spec.driver.vfioConfig",
        !is_default(&d.vfio_config),
        NOT_YET_VFIO,
    );
    notes.not_yet(
        "spec.devicePlugin.devicePluginArguments.driver_type",
        spec.device_plugin()
            .device_plugin_arguments
            .contains_key(ARG_DRIVER_TYPE),
        "the device plugin offers the amdgpu GPUs discovery finds, whatever this says",
    );
    let dra = &spec.dra_driver;
    notes.set(
        "spec.draDriver.cmdLineArguments",
        !dra.cmd_line_arguments.is_empty(),
        WHY_DRA_ARGUMENTS,
    );
    notes.set(
        "spec.draDriver.autoPartition",
        dra.auto_partition && !dra.enable,
        "partitions are allocated on demand only by the DRA driver: set spec.draDriver.enable too",
    );
    notes.set(
        "spec.draDriver.autoPartition",
        dra.auto_partition && dra.enable && spec.config_manager.enable == Some(true),
        "on a node labelled dcm.amd.com/gpu-config-profile the profile decides the layout and autoPartition is off there; the agent's status says so",
    );
    notes.not_yet(
        "spec.testRunner.logsLocation.logsExportSecrets",
        !spec
            .test_runner
            .logs_location
            .logs_export_secrets
            .is_empty(),
        "exporting test logs to cloud storage is not built: logs stay under logsLocation.hostPath",
    );
    let cm = &spec.config_manager;
    let rw = &spec.remediation_workflow;
    let rw_default = RemediationWorkflowSpec::default();
    notes.set(
        "spec.remediationWorkflow.configMapImage",
        rw.config_map_image.is_some(),
        WHY_REMEDIATION_IMAGE,
    );
    notes.set(
        "spec.remediationWorkflow.ttlForFailedWorkflows",
        rw.ttl_for_failed_workflows != rw_default.ttl_for_failed_workflows,
        WHY_REMEDIATION_TTL,
    );
    notes.set("spec.driver.image", d.image.is_some(), WHY_DRIVER_IMAGE);
    notes.set(
        "spec.driver.useSourceImage",
        d.use_source_image.is_some(),
        WHY_DRIVER_IMAGE,
    );
    notes.set(
        "spec.driver.imageRegistryTLS",
        !is_default(&d.image_registry_tls),
        WHY_DRIVER_IMAGE,
    );
    notes.set(
        "spec.driver.imageRegistrySecret",
        d.image_registry_secret.is_some(),
        WHY_DRIVER_IMAGE,
    );
    notes.set(
        "spec.driver.imageBuild",
        !is_default(&d.image_build),
        WHY_DRIVER_IMAGE,
    );
    notes.set(
        "spec.driver.tolerations",
        !d.tolerations.is_empty(),
        WHY_TOLERATIONS,
    );

    let dp = spec.device_plugin();
    notes.set(
        "spec.devicePlugin.devicePluginImage",
        dp.device_plugin_image.is_some(),
        WHY_IMAGE,
    );
    notes.pull_policy(
        "spec.devicePlugin.devicePluginImagePullPolicy",
        &dp.device_plugin_image_pull_policy,
    );
    notes.set(
        "spec.devicePlugin.devicePluginTolerations",
        !dp.device_plugin_tolerations.is_empty(),
        WHY_TOLERATIONS,
    );
    notes.set(
        "spec.devicePlugin.nodeLabellerImage",
        dp.node_labeller_image.is_some(),
        WHY_IMAGE,
    );
    notes.pull_policy(
        "spec.devicePlugin.nodeLabellerImagePullPolicy",
        &dp.node_labeller_image_pull_policy,
    );
    notes.set(
        "spec.devicePlugin.nodeLabellerTolerations",
        !dp.node_labeller_tolerations.is_empty(),
        WHY_TOLERATIONS,
    );
    notes.set(
        "spec.devicePlugin.imageRegistrySecret",
        dp.image_registry_secret.is_some(),
        WHY_PULL_SECRET,
    );
    notes.daemonset("spec.devicePlugin.upgradePolicy", &dp.upgrade_policy);
    notes.set(
        "spec.devicePlugin.hostNetwork",
        dp.host_network.is_some(),
        WHY_POD,
    );

    notes.set("spec.draDriver.image", dra.image.is_some(), WHY_IMAGE);
    notes.pull_policy("spec.draDriver.imagePullPolicy", &dra.image_pull_policy);
    notes.set(
        "spec.draDriver.tolerations",
        !dra.tolerations.is_empty(),
        WHY_TOLERATIONS,
    );
    notes.set(
        "spec.draDriver.imageRegistrySecret",
        dra.image_registry_secret.is_some(),
        WHY_PULL_SECRET,
    );
    notes.daemonset("spec.draDriver.upgradePolicy", &dra.upgrade_policy);

    let me = &spec.metrics_exporter;
    notes.set("spec.metricsExporter.image", me.image.is_some(), WHY_IMAGE);
    notes.set(
        "spec.metricsExporter.imageRegistrySecret",
        me.image_registry_secret.is_some(),
        WHY_PULL_SECRET,
    );
    notes.pull_policy(
        "spec.metricsExporter.imagePullPolicy",
        &me.image_pull_policy,
    );
    notes.set(
        "spec.metricsExporter.tolerations",
        !me.tolerations.is_empty(),
        WHY_TOLERATIONS,
    );
    notes.set(
        "spec.metricsExporter.rbacConfig.image",
        me.rbac_config.image.is_some(),
        WHY_IMAGE,
    );
    notes.daemonset("spec.metricsExporter.upgradePolicy", &me.upgrade_policy);
    notes.set(
        "spec.metricsExporter.resource",
        me.resource != default_exporter_resources(),
        WHY_POD,
    );
    notes.set(
        "spec.metricsExporter.podAnnotations",
        !me.pod_annotations.is_empty(),
        WHY_POD,
    );
    notes.set(
        "spec.metricsExporter.hostNetwork",
        me.host_network.is_some(),
        WHY_POD,
    );

    let tr = &spec.test_runner;
    notes.set("spec.testRunner.image", tr.image.is_some(), WHY_IMAGE);
    notes.pull_policy("spec.testRunner.imagePullPolicy", &tr.image_pull_policy);
    notes.set(
        "spec.testRunner.tolerations",
        !tr.tolerations.is_empty(),
        WHY_TOLERATIONS,
    );
    notes.set(
        "spec.testRunner.imageRegistrySecret",
        tr.image_registry_secret.is_some(),
        WHY_PULL_SECRET,
    );
    notes.daemonset("spec.testRunner.upgradePolicy", &tr.upgrade_policy);
    notes.set(
        "spec.testRunner.logsLocation.mountPath",
        tr.logs_location.mount_path != DEFAULT_TEST_RUNNER_LOGS,
        WHY_NO_CONTAINER,
    );

    notes.set("spec.configManager.image", cm.image.is_some(), WHY_IMAGE);
    notes.pull_policy("spec.configManager.imagePullPolicy", &cm.image_pull_policy);
    notes.set(
        "spec.configManager.imageRegistrySecret",
        cm.image_registry_secret.is_some(),
        WHY_PULL_SECRET,
    );
    notes.daemonset("spec.configManager.upgradePolicy", &cm.upgrade_policy);
    notes.set(
        "spec.configManager.configManagerTolerations",
        !cm.config_manager_tolerations.is_empty(),
        WHY_TOLERATIONS,
    );

    let cc = &spec.common_config;
    notes.set(
        "spec.commonConfig.initContainerImage",
        cc.init_container_image.is_some(),
        WHY_NO_CONTAINER,
    );
    notes.set(
        "spec.commonConfig.imageRegistrySecrets",
        !cc.image_registry_secrets.is_empty(),
        WHY_PULL_SECRET,
    );
    notes.set(
        "spec.commonConfig.utilsContainer",
        !is_default(&cc.utils_container),
        WHY_NO_CONTAINER,
    );
    notes.pull_policy(
        "spec.commonConfig.utilsContainer.imagePullPolicy",
        &cc.utils_container.image_pull_policy,
    );

    notes.set(
        "spec.remediationWorkflow.testerImage",
        spec.remediation_workflow.tester_image.is_some(),
        WHY_IMAGE,
    );
    notes.notes
}

#[derive(Default)]
struct Notes {
    notes: Vec<IgnoredField>,
}

impl Notes {
    fn set(&mut self, path: &str, is_set: bool, reason: &str) {
        if is_set {
            self.notes.push(IgnoredField {
                path: path.to_string(),
                reason: reason.to_string(),
                not_yet: false,
            });
        }
    }

    /// A field whose feature is not built yet.
    fn not_yet(&mut self, path: &str, is_set: bool, reason: &str) {
        if is_set {
            self.notes.push(IgnoredField {
                path: path.to_string(),
                reason: reason.to_string(),
                not_yet: true,
            });
        }
    }

    /// Pull policies are ignored too (a value the CRD's enum rejects is a
    /// problem, reported by `validate`).
    fn pull_policy(&mut self, path: &str, policy: &Option<PullPolicy>) {
        self.set(path, policy.is_some(), WHY_PULL_SECRET);
    }

    fn daemonset(&mut self, path: &str, policy: &Option<DaemonSetUpgradeSpec>) {
        self.set(path, policy.is_some(), WHY_DAEMONSET);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::{DrainSpec, DriverUpgradePolicySpec, LocalObjectRef};
    use k8s_openapi::api::core::v1::Taint;

    #[test]
    fn features_not_built_yet_are_noted_when_set() {
        let mut spec = DeviceConfigSpec::default();
        spec.driver_mut().enable = false;
        spec.driver_mut().upgrade_policy = Some(DriverUpgradePolicySpec::default());
        spec.dra_driver.enable = true;
        spec.config_manager.enable = Some(true);
        spec.remediation_workflow.enable = Some(true);
        let notes = ignored_field_notes(&spec);
        let pending: Vec<&str> = notes
            .iter()
            .filter(|n| n.not_yet)
            .map(|n| n.path.as_str())
            .collect();
        // upgradePolicy (rolling upgrades), draDriver (the DRA plugin),
        // configManager (partitioning) and remediationWorkflow are acted on.
        assert!(pending.is_empty(), "{pending:?}");
        spec.driver_mut().driver_type = "vf-passthrough".into();
        let notes = ignored_field_notes(&spec);
        assert!(
            notes
                .iter()
                .any(|n| n.not_yet && n.path == "spec.driver.driverType"),
            "a field not acted on yet is still noted"
        );
    }

    /// Every `not_yet` note is in [`NOT_ACTED_ON_YET`] and every entry there
    /// can be noted: a spec that sets them all gets exactly that list.
    #[test]
    fn not_acted_on_yet_lists_exactly_the_not_yet_notes() {
        let mut spec = DeviceConfigSpec::default();
        let d = spec.driver_mut();
        d.version = Some("6.4.1".into());
        d.amdgpu_installer_repo_url = Some("https://repo.example".into());
        d.image_sign.key_secret = Some(LocalObjectRef::new("key"));
        d.upgrade_policy = Some(DriverUpgradePolicySpec::default());
        d.driver_type = "vf-passthrough".into();
        d.vfio_config.device_ids = vec!["74b5".into()];
        spec.device_plugin_mut()
            .device_plugin_arguments
            .insert(ARG_DRIVER_TYPE.into(), "vf-passthrough".into());
        spec.dra_driver.enable = true;
        spec.dra_driver.cmd_line_arguments = [("v".into(), "4".into())].into();
        spec.dra_driver.selector = [("dra".into(), "yes".into())].into();
        spec.test_runner.logs_location.logs_export_secrets = vec![LocalObjectRef::new("s3")];
        spec.config_manager.enable = Some(true);
        spec.config_manager.config = Some(LocalObjectRef::new("profiles"));
        spec.config_manager.selector = [("cm".into(), "yes".into())].into();
        let rw = &mut spec.remediation_workflow;
        rw.enable = Some(true);
        rw.config = Some(LocalObjectRef::new("workflows"));
        rw.ttl_for_failed_workflows = "12h".into();
        rw.max_parallel_workflows = 2;
        rw.node_remediation_taints = vec![Taint {
            key: "k".into(),
            effect: "NoSchedule".into(),
            ..Default::default()
        }];
        rw.node_remediation_labels = [("l".into(), "v".into())].into();
        rw.node_drain_policy = Some(DrainSpec::default());
        rw.auto_start_workflow = false;
        rw.config_map_image = Some("rocm/workflows:v1".into());
        rw.reboot_timeout = "30m".into();
        let mut noted: Vec<String> = ignored_field_notes(&spec)
            .into_iter()
            .filter(|n| n.not_yet)
            .map(|n| n.path)
            .collect();
        noted.sort();
        let mut listed: Vec<String> = NOT_ACTED_ON_YET.iter().map(|p| p.to_string()).collect();
        listed.sort();
        assert_eq!(noted, listed);
    }
}
