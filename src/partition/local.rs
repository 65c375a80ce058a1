//! A partition change on one host without Kubernetes (`gpu-operator
//! partition apply`, and standalone mode's `partition` setting): the GPU's
//! client services take the place of the drain.
//!
//! 1. The profile is laid onto the host's GPUs ([`super::plan`]); a profile
//!    that does not fit is refused before anything is stopped.
//! 2. Each of the profile set's `gpuClientSystemdServices` that is active is
//!    stopped (`systemctl stop`), as the reference's device config manager
//!    does.
//! 3. The modes are written and the new partitions awaited ([`super::apply`]).
//! 4. The services that were active are started again, whatever happened.
//!
//! `systemctl` is a configurable path, so tests run a recorder.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;

use super::apply::{self, ApplyError, Limits};
use super::plan::{Plan, plan};
use super::profiles::ProfileSet;
use crate::command::{self, End, Invocation, Sink};
use crate::device::{self, Inventory};
use crate::host::reader::BoundedReader;
use crate::host::{AttrStore, HostRoot};

/// How long one `systemctl` call may take.
const SYSTEMCTL_TIMEOUT: Duration = Duration::from_secs(90);

/// What one host change needs besides the profile.
#[derive(Clone, Debug)]
pub struct LocalConfig {
    pub host: HostRoot,
    pub store: Arc<dyn AttrStore>,
    /// `systemctl`; `None` leaves services alone.
    pub systemctl: Option<PathBuf>,
    pub limits: Limits,
}

/// What a change did.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Outcome {
    pub profile: String,
    /// GPUs whose modes were written, by address.
    pub changed: Vec<String>,
    /// Services stopped and started again.
    pub services: Vec<String>,
    /// Partitions the host has afterwards.
    pub partitions: usize,
}

#[derive(Debug, thiserror::Error)]
pub enum LocalError {
    #[error("no profile {0:?}; the profiles are {1}")]
    UnknownProfile(String, String),
    #[error("profile {0} does not fit this host: {1}")]
    Rejected(String, String),
    #[error("cannot stop {unit}: {why}")]
    Service { unit: String, why: String },
    #[error(transparent)]
    Apply(#[from] ApplyError),
}

impl LocalError {
    /// Bad input (nothing was touched) rather than a failed change.
    pub fn is_rejection(&self) -> bool {
        matches!(self, Self::UnknownProfile(..) | Self::Rejected(..))
    }
}

/// Applies profile `name` of `set` to the host.
pub async fn apply_profile(
    config: &LocalConfig,
    set: &ProfileSet,
    name: &str,
) -> Result<Outcome, LocalError> {
    let profile = set.profiles.get(name).ok_or_else(|| {
        let names: Vec<&str> = set.profiles.keys().map(String::as_str).collect();
        LocalError::UnknownProfile(name.to_owned(), names.join(", "))
    })?;
    let inventory = device::discover(&config.host);
    let plan = plan(name, profile, &inventory.gpus)
        .map_err(|why| LocalError::Rejected(name.to_owned(), why))?;
    let mut outcome = Outcome {
        profile: name.to_owned(),
        changed: plan.changes().map(|a| a.bdf.clone()).collect(),
        ..Default::default()
    };
    if plan.is_done() {
        outcome.partitions = partitions(&inventory);
        return Ok(outcome);
    }
    let mut stopped = Vec::new();
    let result = async {
        if let Some(systemctl) = &config.systemctl {
            for unit in &set.systemd_services {
                if is_active(systemctl, unit).await {
                    systemctl_run(systemctl, "stop", unit).await?;
                    stopped.push(unit.clone());
                }
            }
        }
        change(config, &plan, &inventory).await
    }
    .await;
    if let Some(systemctl) = &config.systemctl {
        for unit in &stopped {
            if let Err(e) = systemctl_run(systemctl, "start", unit).await {
                tracing::warn!(%unit, error = %e, "cannot start a GPU client service again");
            }
        }
    }
    outcome.services = stopped;
    outcome.partitions = partitions(&result?);
    Ok(outcome)
}

/// Writes the plan and waits until the host shows it; the inventory then.
async fn change(
    config: &LocalConfig,
    plan: &Plan,
    before: &Inventory,
) -> Result<Inventory, LocalError> {
    let reader = BoundedReader::new(config.host.clone(), 2);
    apply::write_plan(plan, before, config.store.clone(), &reader, config.limits).await?;
    Ok(apply::seen_on_host(&config.host, plan, config.limits.appear).await?)
}

fn partitions(inventory: &Inventory) -> usize {
    inventory
        .gpus
        .iter()
        .map(|g| g.partitions.len().max(1))
        .sum()
}

async fn is_active(systemctl: &std::path::Path, unit: &str) -> bool {
    // `--`: a unit name is never read as an option.
    let run = invoke(systemctl, &["is-active", "--quiet", "--", unit]).await;
    matches!(run.end, End::Exited { success: true, .. })
}

async fn systemctl_run(
    systemctl: &std::path::Path,
    verb: &str,
    unit: &str,
) -> Result<(), LocalError> {
    let run = invoke(systemctl, &[verb, "--", unit]).await;
    match run.end {
        End::Exited { success: true, .. } => Ok(()),
        other => Err(LocalError::Service {
            unit: unit.to_owned(),
            why: format!(
                "systemctl {verb}: {other:?}: {}",
                String::from_utf8_lossy(&run.stderr).trim()
            ),
        }),
    }
}

async fn invoke(systemctl: &std::path::Path, args: &[&str]) -> command::Finished {
    let what = Invocation {
        program: systemctl.to_path_buf(),
        args: args.iter().map(Into::into).collect(),
        ..Default::default()
    };
    command::run(
        &what,
        Sink::Discard,
        Sink::Memory(4096),
        SYSTEMCTL_TIMEOUT,
        None,
    )
    .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::simulate::{self, kernel::SimulatedKernel};
    use std::os::unix::fs::PermissionsExt;

    fn host() -> (tempfile::TempDir, HostRoot) {
        simulate::mi300x_in_memory()
    }

    /// A systemctl that records its arguments and says `gpuagent` is active.
    fn recorder(dir: &std::path::Path) -> (PathBuf, PathBuf) {
        let log = dir.join("systemctl.log");
        let path = dir.join("systemctl");
        std::fs::write(
            &path,
            format!(
                "#!/bin/sh\necho \"$@\" >> {}\n\
                 if [ \"$1\" = is-active ]; then [ \"$4\" = gpuagent.service ]; exit $?; fi\nexit 0\n",
                log.display()
            ),
        )
        .unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        (path, log)
    }

    #[tokio::test]
    async fn a_profile_is_applied_with_the_active_services_stopped_and_started() {
        let (dir, host) = host();
        let (systemctl, log) = recorder(dir.path());
        let config = LocalConfig {
            store: Arc::new(SimulatedKernel::new(host.clone())),
            host: host.clone(),
            systemctl: Some(systemctl),
            limits: Limits::default(),
        };
        let set = ProfileSet::builtin();
        let outcome = apply_profile(&config, &set, "cpx_nps4_all").await.unwrap();
        assert_eq!(outcome.changed.len(), 8);
        assert_eq!(outcome.partitions, 64);
        assert_eq!(outcome.services, ["gpuagent.service"]);
        let calls = std::fs::read_to_string(&log).unwrap();
        assert_eq!(
            calls,
            "is-active --quiet -- amd-metrics-exporter.service\n\
             is-active --quiet -- gpuagent.service\n\
             stop -- gpuagent.service\n\
             start -- gpuagent.service\n"
        );
        // Again: nothing to do, nothing stopped.
        let again = apply_profile(&config, &set, "cpx_nps4_all").await.unwrap();
        assert!(again.changed.is_empty() && again.services.is_empty());
        // And back.
        let back = apply_profile(&config, &set, "default").await.unwrap();
        assert_eq!(back.partitions, 8);
    }

    #[tokio::test]
    async fn bad_profiles_touch_nothing() {
        let (dir, host) = host();
        let (systemctl, log) = recorder(dir.path());
        let config = LocalConfig {
            store: Arc::new(SimulatedKernel::new(host.clone())),
            host,
            systemctl: Some(systemctl),
            limits: Limits::default(),
        };
        let set = ProfileSet::builtin();
        let err = apply_profile(&config, &set, "nope").await.unwrap_err();
        assert!(err.is_rejection(), "{err}");
        assert!(err.to_string().contains("cpx_nps4_all"), "{err}");
        let err = apply_profile(&config, &set, "dpx_nps2_all")
            .await
            .unwrap_err();
        assert!(err.is_rejection());
        assert!(
            err.to_string().contains("does not offer memory mode NPS2"),
            "{err}"
        );
        assert!(!log.exists(), "no service was touched");
    }
}
