//! The upgrade policy as the planner uses it ([`Policy`]): the step limits,
//! how many nodes may be in progress or unavailable at once, read from the
//! DeviceConfig's `driver` section with the API's defaults. Pure; it must
//! not plan (that is [`super::plan`]'s) nor do I/O.

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde::Serialize;

use crate::api::{DriverSpec, DriverUpgradePolicySpec};
use crate::cluster::drain::DrainPolicy;

/// Step limits. The reboot wait and the whole-upgrade limit are the
/// reference's (60 minutes, 2 hours).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Timeouts {
    /// Cordoning (the write being accepted).
    pub cordon: Duration,
    /// Draining; `None` waits as long as the drain policy does.
    pub drain: Option<Duration>,
    /// The agent reporting the target version after it was told.
    pub load: Duration,
    /// The node coming back with a new boot id.
    pub reboot: Duration,
    /// The whole upgrade of one node.
    pub upgrade: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Self {
            cordon: Duration::from_secs(60),
            drain: Some(Duration::from_secs(300)),
            load: Duration::from_secs(600),
            reboot: Duration::from_secs(3600),
            upgrade: Duration::from_secs(2 * 3600),
        }
    }
}

/// The upgrade policy as the planner uses it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Policy {
    /// Nodes in progress at once; 0 is no limit.
    pub max_parallel: usize,
    pub max_unavailable: MaxUnavailable,
    pub reboot_required: bool,
    /// `driver.blacklist: true`: the in-box amdgpu does not come back at
    /// boot, so a reboot can replace it.
    pub blacklist: bool,
    pub timeouts: Timeouts,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub enum MaxUnavailable {
    Count(usize),
    /// Percent of the selected nodes, rounded up.
    Percent(u32),
}

impl MaxUnavailable {
    /// Reads `maxUnavailableNodes`: an integer, or a string `N%`. Anything
    /// else is an error for `validate` to report.
    pub fn parse(value: &IntOrString) -> Result<Self, String> {
        match value {
            IntOrString::Int(n) => usize::try_from(*n)
                .map(Self::Count)
                .map_err(|_| format!("maxUnavailableNodes must not be negative, got {n}")),
            IntOrString::String(text) => {
                let number = text.strip_suffix('%').unwrap_or(text);
                let parsed = number.trim().parse::<u32>().map_err(|_| {
                    format!("maxUnavailableNodes must be an integer or a percentage, got {text:?}")
                })?;
                Ok(if text.ends_with('%') {
                    Self::Percent(parsed.min(100))
                } else {
                    Self::Count(parsed as usize)
                })
            }
        }
    }

    /// How many nodes of `total` may be unavailable. At least one, so that
    /// an upgrade of a small cluster (25 % of 3 nodes) can start at all.
    pub fn of(&self, total: usize) -> usize {
        let n = match self {
            Self::Count(n) => *n,
            Self::Percent(p) => (total * *p as usize).div_ceil(100),
        };
        n.max(1)
    }
}

impl Policy {
    /// The policy the `driver` section asks for (the API's defaults where
    /// unset), with the step limits of `timeouts` but the drain's own from
    /// the drain policy. Only planned while `upgradePolicy.enable` is true.
    pub fn of_spec(driver: &DriverSpec, timeouts: Timeouts) -> Self {
        let default = DriverUpgradePolicySpec::default();
        let spec = driver.upgrade_policy.as_ref().unwrap_or(&default);
        Self {
            blacklist: driver.blacklist == Some(true),
            max_parallel: usize::try_from(spec.max_parallel_upgrades).unwrap_or(0),
            max_unavailable: MaxUnavailable::parse(&spec.max_unavailable_nodes)
                .unwrap_or(MaxUnavailable::Percent(25)),
            reboot_required: spec.reboot_required,
            timeouts: Timeouts {
                drain: DrainPolicy::of_upgrade(spec).timeout,
                ..timeouts
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn max_unavailable_reads_counts_and_rounds_percentages_up() {
        let parse = |v: IntOrString| MaxUnavailable::parse(&v);
        assert_eq!(parse(IntOrString::Int(2)), Ok(MaxUnavailable::Count(2)));
        assert_eq!(
            parse(IntOrString::String("25%".into())),
            Ok(MaxUnavailable::Percent(25))
        );
        assert_eq!(
            parse(IntOrString::String("3".into())),
            Ok(MaxUnavailable::Count(3))
        );
        assert!(parse(IntOrString::Int(-1)).is_err());
        assert!(parse(IntOrString::String("a quarter".into())).is_err());
        assert_eq!(MaxUnavailable::Percent(25).of(5), 2);
        assert_eq!(MaxUnavailable::Percent(25).of(1000), 250);
        assert_eq!(MaxUnavailable::Percent(1).of(3), 1);
        assert_eq!(MaxUnavailable::Count(0).of(10), 1);
        // No upgradePolicy fields set: the API's defaults.
        let unset = Policy::of_spec(&DriverSpec::default(), Timeouts::default());
        assert!(!unset.blacklist);
        assert_eq!(unset.max_parallel, 1);
        assert_eq!(unset.max_unavailable, MaxUnavailable::Percent(25));
        assert!(unset.reboot_required);
        // The drain's limit is the drain policy's (300 s by default).
        assert_eq!(unset.timeouts.drain, Some(Duration::from_secs(300)));
    }
}
