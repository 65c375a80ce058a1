//! The mapping from Node conditions to remediations, in the reference's
//! ConfigMap format: key `workflow`, a YAML list of entries, each naming a
//! `nodeCondition` and how to remediate it. [`Mapping::parse`] reads it;
//! [`Mapping::builtin`] is the mapping used when
//! `spec.remediationWorkflow.config` names none: the entries the reference
//! shipped as its default ConfigMap (before v1.5 it stopped shipping one), so
//! that our own `AMDGPUUnhealthy` condition and Node Problem Detector's
//! conditions work without a ConfigMap.
//!
//! `workflowTemplate` is read and recorded, never run: remediation is built
//! in (there is no Argo). Pure; this module must not read the API.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::api::syntax;

/// The ConfigMap key that holds the mapping.
pub const CONFIGMAP_KEY: &str = "workflow";
/// The reference's default for `recoveryPolicy.maxAllowedRunsPerWindow`.
pub const DEFAULT_MAX_RUNS: u32 = 3;
/// The reference's default for `recoveryPolicy.windowSize`.
pub const DEFAULT_WINDOW: &str = "300m";
/// The test limit when a profile gives none: the reference's default mapping's.
pub const DEFAULT_TEST_TIMEOUT_SECONDS: u64 = 4800;

/// How one Node condition is remediated.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Entry {
    pub node_condition: String,
    /// Recorded in status and Events; the built-in steps run instead.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub workflow_template: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub validation_tests_profile: Option<ValidationTestsProfile>,
    /// Wait for a person (the force-resume label) instead of rebooting.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub physical_action_needed: bool,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub notify_remediation_message: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub notify_test_failure_message: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub recovery_policy: Option<RecoveryPolicy>,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub skip_reboot_step: bool,
    /// Our extension (the reference has no such key and ignores it): when
    /// the fault is confined to one GPU, evict only the pods on that GPU,
    /// reset it and test it alone before the whole-node steps; a reset that
    /// fails, or a fault on several GPUs, goes on with them.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub gpu_reset_first: bool,
}

/// The test run that confirms a repair.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ValidationTestsProfile {
    pub framework: String,
    pub recipe: String,
    pub iterations: u32,
    pub stop_on_failure: bool,
    pub timeout_seconds: u64,
    /// Our extension, for `framework: COMMAND` only: the program (an
    /// absolute path, which the agent's `--allow-test-command` must allow)
    /// and its arguments. The reference's mapping has no such key.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub command: Vec<String>,
}

/// How many runs one node may have for one condition within a window.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct RecoveryPolicy {
    /// 0 (or unset) means the default, 3.
    pub max_allowed_runs_per_window: i64,
    /// A Go duration; unset means the default, "300m".
    #[serde(skip_serializing_if = "String::is_empty")]
    pub window_size: String,
}

/// Why a validation profile can never run, if so: an unknown framework, a
/// COMMAND without its program (or with one that is not an absolute path,
/// which the agent's allow-list cannot vouch for), or a program given to
/// another framework. Pure.
pub fn profile_problem(profile: &ValidationTestsProfile) -> Option<String> {
    let framework = profile.framework.to_ascii_uppercase();
    if !framework.is_empty() && !["RVS", "AGFHC", "COMMAND"].contains(&framework.as_str()) {
        return Some(format!(
            "framework {:?} is not RVS, AGFHC or COMMAND",
            profile.framework
        ));
    }
    match (framework.as_str(), profile.command.first()) {
        ("COMMAND", None) => Some(
            "command: a COMMAND profile names its program and arguments \
             (command: [/opt/tools/gpu-burn, \"60\"])"
                .to_owned(),
        ),
        ("COMMAND", Some(program)) if !program.starts_with('/') => Some(format!(
            "command: the program {program:?} must be an absolute path (the agent's \
             --allow-test-command allows paths, not names looked up in PATH)"
        )),
        ("COMMAND", Some(_)) => None,
        (_, Some(_)) => Some(format!(
            "command is for framework COMMAND only, not {:?}",
            profile.framework
        )),
        (_, None) => None,
    }
}

impl Entry {
    /// Runs allowed per window, with the reference's default.
    pub fn max_runs(&self) -> u32 {
        self.recovery_policy
            .as_ref()
            .map(|p| p.max_allowed_runs_per_window)
            .filter(|n| *n > 0)
            .map_or(DEFAULT_MAX_RUNS, |n| u32::try_from(n).unwrap_or(u32::MAX))
    }

    /// The recovery window, with the reference's default (parse errors are
    /// refused by [`Mapping::parse`]).
    pub fn window(&self) -> Duration {
        let text = self
            .recovery_policy
            .as_ref()
            .map(|p| p.window_size.as_str())
            .filter(|w| !w.is_empty())
            .unwrap_or(DEFAULT_WINDOW);
        syntax::parse_duration(text).unwrap_or(Duration::from_secs(300 * 60))
    }

    /// How long the validation may take in all: each iteration's limit, times
    /// the iterations, and a minute for starting and reporting.
    pub fn validation_limit(&self) -> Duration {
        let profile = self.validation_tests_profile.as_ref();
        let each = profile
            .map(|p| p.timeout_seconds)
            .filter(|t| *t > 0)
            .unwrap_or(DEFAULT_TEST_TIMEOUT_SECONDS);
        let iterations = profile.map_or(1, |p| p.iterations.max(1));
        Duration::from_secs(
            each.saturating_mul(u64::from(iterations))
                .saturating_add(60),
        )
    }
}

/// Every entry of one mapping, in its order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Mapping {
    pub entries: Vec<Entry>,
}

impl Mapping {
    /// Reads the `workflow` key's text. Errors name the entry and what is
    /// wrong; nothing of a mapping with an error is used.
    pub fn parse(text: &str) -> Result<Self, String> {
        let mut entries: Vec<Entry> = serde_saphyr::from_str(text)
            .map_err(|e| format!("the remediation mapping is not a list of entries: {e}"))?;
        let mut seen = std::collections::BTreeSet::new();
        for (index, entry) in entries.iter_mut().enumerate() {
            // One form for the duplicate check and every lookup: a condition
            // type has no surrounding space, so " A " means A.
            entry.node_condition = entry.node_condition.trim().to_owned();
            let name = entry.node_condition.as_str();
            if name.is_empty() {
                return Err(format!("entry {index} has no nodeCondition"));
            }
            if name.contains(char::is_whitespace) || name.chars().any(char::is_control) {
                return Err(format!(
                    "entry {index}: nodeCondition {name:?} is not a condition type (no spaces)"
                ));
            }
            if !seen.insert(name.to_owned()) {
                return Err(format!("nodeCondition {name:?} is mapped twice"));
            }
            if let Some(policy) = &entry.recovery_policy {
                if policy.max_allowed_runs_per_window < 0 {
                    return Err(format!(
                        "{name}: recoveryPolicy.maxAllowedRunsPerWindow must not be negative"
                    ));
                }
                if !policy.window_size.is_empty() {
                    syntax::parse_duration(&policy.window_size)
                        .map_err(|why| format!("{name}: recoveryPolicy.windowSize {why}"))?;
                }
            }
            if let Some(why) = entry
                .validation_tests_profile
                .as_ref()
                .and_then(profile_problem)
            {
                return Err(format!("{name}: validationTestsProfile.{why}"));
            }
        }
        Ok(Self { entries })
    }

    /// The entry for a condition type, if mapped.
    pub fn entry(&self, condition: &str) -> Option<&Entry> {
        self.entries.iter().find(|e| e.node_condition == condition)
    }

    /// The built-in mapping: the reference's former default ConfigMap.
    pub fn builtin() -> Self {
        // (condition, recipe, physical action needed)
        const ROWS: &[(&str, &str, bool)] = &[
            ("AMDGPUXgmi", "all_lvl4", true),
            ("AMDGPUBadPageRetirementThreshold", "all_lvl4", true),
            ("AMDGPUThrottle", "thermal", true),
            ("AMDGPUPcieLinkSpeedNotCorrect", "pcie_link_status", true),
            ("AMDGPUBootFailed", "all_lvl4", false),
            ("AMDGPUGemmPerformance", "all_lvl4", true),
            ("AMDGPUHBMError", "all_lvl4", false),
            ("AMDGPUPcieLinkWidthNotCorrect", "pcie_link_status", true),
            ("AMDGPUPcieBandwidthPerformance", "pcie_link_status", true),
            ("AMDGPUDeviceInternalError", "all_lvl4", true),
            ("AMDGPUXgmiBandwidthPerformance", "all_lvl4", true),
            ("AMDGPUWatchdogTimeoutWdt", "all_lvl4", false),
            ("AMDGPUProgramFaultDueToHardwareError", "all_lvl4", false),
            ("AMDGPUGeneralApplicationFault", "all_lvl4", false),
            ("AMDGPUHbmBandwidthPerformance", "all_lvl4", true),
            ("AMDGPUHwsHang", "all_lvl4", false),
            ("AMDGPUPcieAer", "pcie_link_status", true),
            ("AMDGPUHardwareAssertionHwa", "all_lvl4", false),
            ("AMDGPUOnDieEcc", "all_lvl4", true),
            ("AMDGPUEndToEndCrc", "all_lvl4", true),
            ("AMDGPUHplFailure", "rochpl_isolation", false),
            ("AMDGPUWafl", "all_lvl4", true),
            ("AMDGPUAccuracyCheckFailureAcf", "all_lvl4", true),
            ("AMDGPUUnhealthy", "all_lvl4", false),
        ];
        let entries = ROWS
            .iter()
            .map(|(condition, recipe, physical)| {
                let ours = *condition == crate::api::agent_status::HEALTH_CONDITION;
                Entry {
                    node_condition: (*condition).to_owned(),
                    workflow_template: "default-template".to_owned(),
                    validation_tests_profile: Some(ValidationTestsProfile {
                        framework: "AGFHC".to_owned(),
                        recipe: (*recipe).to_owned(),
                        iterations: 1,
                        stop_on_failure: true,
                        timeout_seconds: DEFAULT_TEST_TIMEOUT_SECONDS,
                        command: Vec::new(),
                    }),
                    physical_action_needed: *physical,
                    notify_remediation_message: if ours {
                        String::new()
                    } else {
                        format!(
                            "{condition} was reported on this node: the node is drained and {}",
                            if *physical {
                                "waits for a person to act on the hardware"
                            } else {
                                "rebooted, then tested"
                            }
                        )
                    },
                    notify_test_failure_message: format!(
                        "the {recipe} tests failed after remediating {condition}: the node stays \
                         tainted for a person to look at"
                    ),
                    recovery_policy: (!ours).then(|| RecoveryPolicy {
                        max_allowed_runs_per_window: 3,
                        window_size: "15m".to_owned(),
                    }),
                    skip_reboot_step: false,
                    gpu_reset_first: false,
                }
            })
            .collect();
        Self { entries }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const REFERENCE: &str = r#"
- nodeCondition: AMDGPUHardwareAssertionHwa
  workflowTemplate: default-template
  validationTestsProfile:
    framework: AGFHC
    recipe: all_lvl4
    iterations: 1
    stopOnFailure: true
    timeoutSeconds: 4800
  physicalActionNeeded: false
  notifyRemediationMessage: "Remove GPU tray"
  notifyTestFailureMessage: "Tests failed"
  recoveryPolicy:
    maxAllowedRunsPerWindow: 2
    windowSize: 15m
  skipRebootStep: true
- nodeCondition: AMDGPUUnhealthy
  workflowTemplate: default-template
  gpuResetFirst: true
"#;

    #[test]
    fn reads_the_reference_format_with_its_defaults() {
        let mapping = Mapping::parse(REFERENCE).unwrap();
        let hwa = mapping.entry("AMDGPUHardwareAssertionHwa").unwrap();
        assert_eq!(hwa.max_runs(), 2);
        assert_eq!(hwa.window(), Duration::from_secs(15 * 60));
        assert!(hwa.skip_reboot_step);
        assert_eq!(hwa.notify_remediation_message, "Remove GPU tray");
        assert_eq!(
            hwa.validation_limit(),
            Duration::from_secs(4800 + 60),
            "one iteration of 4800 s and a minute"
        );
        let ours = mapping.entry("AMDGPUUnhealthy").unwrap();
        assert_eq!(ours.max_runs(), DEFAULT_MAX_RUNS);
        assert_eq!(ours.window(), Duration::from_secs(300 * 60));
        assert!(ours.gpu_reset_first && !hwa.gpu_reset_first);
        assert!(mapping.entry("AMDGPUXgmi").is_none());
    }

    #[test]
    fn bad_entries_are_refused_with_the_condition_named() {
        for (text, wanted) in [
            ("- workflowTemplate: t\n", "no nodeCondition"),
            ("- nodeCondition: A\n- nodeCondition: A\n", "mapped twice"),
            (
                "- nodeCondition: A\n  recoveryPolicy: {maxAllowedRunsPerWindow: -1}\n",
                "must not be negative",
            ),
            (
                "- nodeCondition: A\n  recoveryPolicy: {windowSize: soon}\n",
                "A: recoveryPolicy.windowSize",
            ),
            (
                "- nodeCondition: A\n  validationTestsProfile: {framework: MAGIC}\n",
                "not RVS, AGFHC or COMMAND",
            ),
            ("nodeCondition: A\n", "not a list"),
            (
                "- nodeCondition: A\n- nodeCondition: ' A '\n",
                "mapped twice",
            ),
            ("- nodeCondition: 'A B'\n", "not a condition type"),
            (
                "- nodeCondition: A\n  validationTestsProfile: {framework: COMMAND, recipe: r}\n",
                "A: validationTestsProfile.command: a COMMAND profile names its program",
            ),
            (
                "- nodeCondition: A\n  validationTestsProfile: {framework: command, command: [burn]}\n",
                "must be an absolute path",
            ),
            (
                "- nodeCondition: A\n  validationTestsProfile: {framework: RVS, command: [/bin/true]}\n",
                "command is for framework COMMAND only",
            ),
        ] {
            let error = Mapping::parse(text).unwrap_err();
            assert!(error.contains(wanted), "{text:?}: {error}");
        }
    }

    #[test]
    fn the_notes_count_the_builtin_mappings_conditions() {
        let count = format!("({} conditions)", Mapping::builtin().entries.len());
        assert!(
            crate::api::semantics::BUILTIN_MAPPING_NOTE.contains(&count),
            "{count}: {}",
            crate::api::semantics::BUILTIN_MAPPING_NOTE
        );
    }

    #[test]
    fn a_command_profile_carries_its_program() {
        let mapping = Mapping::parse(
            "- nodeCondition: A\n  validationTestsProfile:\n    framework: COMMAND\n    \
             recipe: burn\n    command: [/opt/tools/burn, \"60\"]\n",
        )
        .unwrap();
        let profile = mapping
            .entry("A")
            .and_then(|e| e.validation_tests_profile.clone());
        assert_eq!(
            profile.map(|p| p.command),
            Some(vec!["/opt/tools/burn".to_owned(), "60".to_owned()])
        );
    }

    #[test]
    fn a_condition_with_surrounding_space_is_found_by_its_type() {
        let mapping =
            Mapping::parse("- nodeCondition: '  AMDGPUXgmi '\n  skipRebootStep: true\n").unwrap();
        let entry = mapping
            .entry("AMDGPUXgmi")
            .expect("found by the trimmed type");
        assert_eq!(entry.node_condition, "AMDGPUXgmi");
        assert!(entry.skip_reboot_step);
    }

    #[test]
    fn the_builtin_mapping_covers_our_condition_and_the_problem_detectors() {
        let mapping = Mapping::builtin();
        assert_eq!(mapping.entries.len(), 24);
        let ours = mapping.entry("AMDGPUUnhealthy").unwrap();
        assert!(!ours.physical_action_needed);
        assert_eq!(ours.recovery_policy, None, "the reference's entry has none");
        let xgmi = mapping.entry("AMDGPUXgmi").unwrap();
        assert!(xgmi.physical_action_needed);
        assert_eq!(xgmi.max_runs(), 3);
        assert_eq!(xgmi.window(), Duration::from_secs(15 * 60));
        // The built-in text round-trips through the reference format.
        let text = serde_saphyr::to_string(&mapping.entries).unwrap();
        assert_eq!(Mapping::parse(&text).unwrap(), mapping);
    }
}
