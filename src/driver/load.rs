//! Loading amdgpu from a verified bundle, the way KMM loads modules, so that
//! no host file outside the bundle is changed but the firmware search path:
//! `modprobe --dirname <bundle> ${loadArgs} amdgpu ${parameters}`, with the
//! kernel's firmware search path (`/sys/module/firmware_class/parameters/path`)
//! pointed at the bundle's `firmware/` first.
//!
//! [`decide`] is the pure rule for what to do given what is loaded and the
//! bundle's verdict; [`load`] carries out a [`LoadDecision::Load`] with a
//! configurable `modprobe` and waits for the evidence (`/sys/module/amdgpu`);
//! [`unload`] removes an out-of-tree amdgpu the manager replaces. The
//! argument lists are pure ([`modprobe_args`], [`host_load_args`],
//! [`unload_args`]) and shared with the reload another makes
//! ([`super::reload`]). Nothing here decides to unload or reboots: the
//! manager and [`super::reboot`] do.

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

use serde::Serialize;

use super::bundle::{Refusal, Verified};
use super::report::{DriverReport, MODULE_DIR, ModuleOrigin};
use crate::api::KernelModuleConfigSpec;
use crate::command::{self, End, Invocation, Sink};
use crate::host::HostRoot;

/// The kernel's firmware search path, tried before the built-in ones.
pub const FIRMWARE_PATH_PARAM: &str = "/sys/module/firmware_class/parameters/path";
/// `fw_path_para` in `drivers/base/firmware_loader/main.c` is 256 bytes.
pub const MAX_FIRMWARE_PATH: usize = 255;
/// How long `modprobe` may take. Loading amdgpu on an 8-GPU node initialises
/// every GPU, which takes tens of seconds.
pub const MODPROBE_TIMEOUT: Duration = Duration::from_secs(300);

/// What to do about the driver on this node.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "action", rename_all = "camelCase")]
pub enum LoadDecision {
    /// The wanted driver is loaded.
    Nothing { version: String },
    /// Load the bundle.
    Load { bundle: Box<Verified> },
    /// The bundle (or the configuration) is refused: load nothing.
    Refuse {
        reason: &'static str,
        message: String,
    },
    /// Another version of the out-of-tree driver runs: unload it, once
    /// nothing holds it ([`super::holders`]), then load the bundle.
    Replace { bundle: Box<Verified> },
    /// Another driver is loaded; replacing it needs what is not built yet.
    ReplaceNeeded {
        loaded: ModuleOrigin,
        version: Option<String>,
        why: String,
    },
}

/// Why `loadArgs`, `unloadArgs` or `parameters` cannot be used, if they
/// cannot: every refused entry, by field and index, as `validate` reports
/// them (the one rule is [`crate::api::modprobe`]). Pure.
pub fn module_config_problem(config: &KernelModuleConfigSpec) -> Option<String> {
    let problems = crate::api::modprobe::module_config_problems(
        &config.load_args,
        &config.unload_args,
        &config.parameters,
    );
    if problems.is_empty() {
        return None;
    }
    let described: Vec<String> = problems
        .into_iter()
        .map(|(at, entry, why)| format!("kernelModuleConfig.{at} {entry:?}: {why}"))
        .collect();
    Some(described.join("; "))
}

/// [`LoadDecision::Nothing`] when the driver asked for already runs: an
/// out-of-tree amdgpu of `version` (any version when `None`). Checked before
/// the store is read, so that a node already at its target needs no bundle
/// and hashes nothing. Pure.
pub fn already_running(report: &DriverReport, version: Option<&str>) -> Option<LoadDecision> {
    let running = report.version.as_deref()?;
    let wanted = version.is_none_or(|v| v == running);
    (report.loaded && report.origin == ModuleOrigin::OutOfTree && wanted).then(|| {
        LoadDecision::Nothing {
            version: running.to_owned(),
        }
    })
}

/// What to do, from the report, the verdict on the bundle for the running
/// kernel, and the module configuration. Pure.
pub fn decide(
    report: &DriverReport,
    bundle: Result<&Verified, &Refusal>,
    config: &KernelModuleConfigSpec,
) -> LoadDecision {
    let bundle = match bundle {
        Ok(bundle) => bundle,
        Err(refusal) => {
            return LoadDecision::Refuse {
                reason: refusal.reason(),
                message: refusal.to_string(),
            };
        }
    };
    if report.loaded {
        let loaded_version = report.version.clone();
        if report.origin == ModuleOrigin::OutOfTree
            && loaded_version.as_deref() == Some(bundle.version.as_str())
        {
            return LoadDecision::Nothing {
                version: bundle.version.clone(),
            };
        }
        if report.origin == ModuleOrigin::OutOfTree && loaded_version.is_some() {
            if let Some(problem) = module_config_problem(config) {
                return LoadDecision::Refuse {
                    reason: "ModuleConfigInvalid",
                    message: problem,
                };
            }
            return LoadDecision::Replace {
                bundle: Box::new(bundle.clone()),
            };
        }
        let why = match report.origin {
            ModuleOrigin::BuiltIn => "amdgpu is built into this kernel and cannot be replaced: \
                boot a kernel that has it as a module"
                .to_owned(),
            ModuleOrigin::InTree => "the in-box amdgpu is loaded: set driver.blacklist: true \
                and reboot the node (a rolling upgrade reboots it)"
                .to_owned(),
            ModuleOrigin::OutOfTree => format!(
                "an out-of-tree amdgpu whose version cannot be read is loaded, {} wanted: \
                 it is not unloaded on a guess",
                bundle.version
            ),
            _ => format!(
                "amdgpu {} of unknown origin is loaded, {} wanted: the agent replaces only \
                 an out-of-tree driver it can tell apart (taint flag O)",
                loaded_version.as_deref().unwrap_or("of unknown version"),
                bundle.version
            ),
        };
        return LoadDecision::ReplaceNeeded {
            loaded: report.origin,
            version: loaded_version,
            why,
        };
    }
    if let Some(problem) = module_config_problem(config) {
        return LoadDecision::Refuse {
            reason: "ModuleConfigInvalid",
            message: problem,
        };
    }
    LoadDecision::Load {
        bundle: Box::new(bundle.clone()),
    }
}

/// The commands loading runs. Paths, so that tests use recorders.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LoadCommands {
    pub modprobe: PathBuf,
    pub timeout: Duration,
}

impl Default for LoadCommands {
    fn default() -> Self {
        Self {
            modprobe: PathBuf::from("/usr/sbin/modprobe"),
            timeout: MODPROBE_TIMEOUT,
        }
    }
}

/// Why a load or an unload did not happen or did not take.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("firmware path {path:?} is longer than the kernel's {MAX_FIRMWARE_PATH} bytes")]
    FirmwarePathTooLong { path: String },
    #[error("cannot set the firmware path: {0}")]
    FirmwarePath(String),
    #[error("{program}: cannot be started: {why}")]
    Start { program: String, why: String },
    #[error("modprobe did not finish within {0:?}")]
    TimedOut(Duration),
    #[error("modprobe failed ({status}): {stderr}")]
    Failed { status: String, stderr: String },
    #[error("modprobe succeeded but {MODULE_DIR} did not appear")]
    NotLoaded,
    #[error("modprobe -r succeeded but {MODULE_DIR} is still there")]
    StillLoaded,
}

impl LoadError {
    /// The reason the condition and Events carry.
    pub fn reason(&self) -> &'static str {
        match self {
            LoadError::FirmwarePathTooLong { .. } | LoadError::FirmwarePath(_) => {
                "FirmwarePathFailed"
            }
            LoadError::Start { .. } => "ModprobeUnavailable",
            LoadError::TimedOut(_) => "ModprobeTimedOut",
            LoadError::Failed { .. } => "ModprobeFailed",
            LoadError::NotLoaded => "ModuleNotLoaded",
            LoadError::StillLoaded => "ModuleStillLoaded",
        }
    }
}

/// `modprobe`'s arguments for a bundle whose directory this process sees
/// at `bundle_dir`: `--dirname <bundle> ${loadArgs} amdgpu ${parameters}`.
/// Pure.
pub fn modprobe_args(
    bundle_dir: &std::path::Path,
    config: &KernelModuleConfigSpec,
) -> Vec<OsString> {
    let mut args: Vec<OsString> = vec!["--dirname".into(), bundle_dir.as_os_str().to_owned()];
    args.extend(config.load_args.iter().map(OsString::from));
    args.push("amdgpu".into());
    args.extend(config.parameters.iter().map(OsString::from));
    args
}

/// `modprobe`'s arguments for amdgpu as the host installs it: `${loadArgs}
/// amdgpu ${parameters}`. Pure.
pub fn host_load_args(config: &KernelModuleConfigSpec) -> Vec<OsString> {
    let mut args: Vec<OsString> = config.load_args.iter().map(OsString::from).collect();
    args.push("amdgpu".into());
    args.extend(config.parameters.iter().map(OsString::from));
    args
}

/// `modprobe`'s arguments to unload amdgpu: `-r ${unloadArgs} amdgpu`. Pure.
pub fn unload_args(config: &KernelModuleConfigSpec) -> Vec<OsString> {
    let mut args: Vec<OsString> = vec!["-r".into()];
    args.extend(config.unload_args.iter().map(OsString::from));
    args.push("amdgpu".into());
    args
}

/// The firmware search path for the bundle at host path `bundle_dir`: its
/// `firmware/`. Pure.
pub fn firmware_dir(bundle_dir: &str) -> String {
    format!("{}/firmware", bundle_dir.trim_end_matches('/'))
}

/// Loads `bundle`: points the kernel's firmware search path at its
/// `firmware/` (the host path, as the kernel resolves it), runs `modprobe`,
/// and checks that `/sys/module/amdgpu` appeared. Call it only for
/// [`LoadDecision::Load`].
pub async fn load(
    host: &HostRoot,
    commands: &LoadCommands,
    bundle: &Verified,
    config: &KernelModuleConfigSpec,
) -> Result<(), LoadError> {
    let firmware = firmware_dir(&bundle.dir);
    if firmware.len() > MAX_FIRMWARE_PATH {
        return Err(LoadError::FirmwarePathTooLong { path: firmware });
    }
    host.write(FIRMWARE_PATH_PARAM, &firmware)
        .map_err(|e| LoadError::FirmwarePath(e.to_string()))?;
    // modprobe reads the modules itself: the bundle as this process sees it.
    run_modprobe(commands, modprobe_args(&host.path(&bundle.dir), config)).await?;
    if !host.exists(MODULE_DIR) {
        return Err(LoadError::NotLoaded);
    }
    Ok(())
}

/// Unloads amdgpu: `modprobe -r ${unloadArgs} amdgpu`, then checks that
/// `/sys/module/amdgpu` is gone. Never forced: call it only once
/// [`super::holders::in_use`] found the module free, and a module that is
/// still in use stays loaded and is reported.
pub async fn unload(
    host: &HostRoot,
    commands: &LoadCommands,
    config: &KernelModuleConfigSpec,
) -> Result<(), LoadError> {
    run_modprobe(commands, unload_args(config)).await?;
    if host.exists(MODULE_DIR) {
        return Err(LoadError::StillLoaded);
    }
    Ok(())
}

/// Runs `modprobe` with `args`, keeping what it says on stderr for the
/// error, killed at the commands' timeout.
pub(super) async fn run_modprobe(
    commands: &LoadCommands,
    args: Vec<OsString>,
) -> Result<(), LoadError> {
    let modprobe = Invocation {
        program: commands.modprobe.clone(),
        args,
        ..Invocation::default()
    };
    // modprobe's complaints are a few lines; the cap keeps a chatty command
    // from filling memory.
    let done = command::run(
        &modprobe,
        Sink::Discard,
        Sink::Memory(64 * 1024),
        commands.timeout,
        None,
    )
    .await;
    match done.end {
        End::Exited { success: true, .. } => Ok(()),
        End::Exited { status, .. } => Err(LoadError::Failed {
            status,
            stderr: String::from_utf8_lossy(&done.stderr).trim().to_owned(),
        }),
        End::TimedOut | End::Cancelled => Err(LoadError::TimedOut(commands.timeout)),
        End::NotStarted(why) => Err(LoadError::Start {
            program: commands.modprobe.display().to_string(),
            why,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::driver::report::ModuleOrigin;

    fn verified(version: &str) -> Verified {
        Verified {
            dir: "/var/lib/gpu-operator/drivers/b".into(),
            version: version.into(),
            kernel_release: "6.8.0".into(),
            module: "lib/modules/6.8.0/updates/amdgpu.ko".into(),
            files: 3,
            bytes: 10,
            signatures_checked: false,
        }
    }

    fn report(origin: ModuleOrigin, version: Option<&str>) -> DriverReport {
        DriverReport {
            loaded: origin != ModuleOrigin::NotLoaded,
            version: version.map(str::to_owned),
            origin,
            ..DriverReport::default()
        }
    }

    fn kind(decision: &LoadDecision) -> String {
        match decision {
            LoadDecision::Nothing { .. } => "nothing".into(),
            LoadDecision::Load { .. } => "load".into(),
            LoadDecision::Refuse { reason, .. } => format!("refuse {reason}"),
            LoadDecision::ReplaceNeeded { loaded, .. } => format!("replace {loaded:?}"),
            LoadDecision::Replace { bundle } => format!("unload, then load {}", bundle.version),
        }
    }

    #[test]
    fn decisions_follow_what_is_loaded_and_the_bundle() {
        let bundle = verified("6.12.12");
        let checksum = Refusal::ChecksumMismatch {
            path: "p".into(),
            expected: "a".into(),
            actual: "b".into(),
        };
        let config = KernelModuleConfigSpec::default();
        let bad_config = KernelModuleConfigSpec {
            load_args: vec!["--force".into()],
            ..KernelModuleConfigSpec::default()
        };
        use ModuleOrigin::*;
        let cases: Vec<(
            DriverReport,
            Result<&Verified, &Refusal>,
            &KernelModuleConfigSpec,
            &str,
        )> = vec![
            (report(NotLoaded, None), Ok(&bundle), &config, "load"),
            (
                report(OutOfTree, Some("6.12.12")),
                Ok(&bundle),
                &config,
                "nothing",
            ),
            (
                report(OutOfTree, Some("6.10.5")),
                Ok(&bundle),
                &config,
                "unload, then load 6.12.12",
            ),
            (report(InTree, None), Ok(&bundle), &config, "replace InTree"),
            (
                report(BuiltIn, Some("6.12.12")),
                Ok(&bundle),
                &config,
                "replace BuiltIn",
            ),
            // An in-tree module that happens to carry the version is not ours.
            (
                report(InTree, Some("6.12.12")),
                Ok(&bundle),
                &config,
                "replace InTree",
            ),
            (
                report(Unknown, Some("6.12.12")),
                Ok(&bundle),
                &config,
                "replace Unknown",
            ),
            (
                report(NotLoaded, None),
                Err(&checksum),
                &config,
                "refuse ChecksumMismatch",
            ),
            // A refused bundle is refused whatever is loaded.
            (
                report(OutOfTree, Some("6.12.12")),
                Err(&checksum),
                &config,
                "refuse ChecksumMismatch",
            ),
            (
                report(NotLoaded, None),
                Ok(&bundle),
                &bad_config,
                "refuse ModuleConfigInvalid",
            ),
        ];
        for (report, bundle, config, want) in cases {
            let decision = decide(&report, bundle, config);
            assert_eq!(kind(&decision), want, "{report:?} {bundle:?}");
        }
    }

    #[test]
    fn load_args_that_defeat_the_bundle_are_refused() {
        let config = |load_args: &[&str], parameters: &[&str]| KernelModuleConfigSpec {
            load_args: load_args.iter().map(|s| s.to_string()).collect(),
            parameters: parameters.iter().map(|s| s.to_string()).collect(),
            ..KernelModuleConfigSpec::default()
        };
        for ok in [
            config(&[], &[]),
            config(&["-v"], &["ras_enable=1", "noretry"]),
            config(&["--verbose", "-q"], &["amdgpu.x=1"]),
        ] {
            assert_eq!(module_config_problem(&ok), None, "{ok:?}");
        }
        for bad in [
            config(&["--dirname=/tmp"], &[]),
            config(&["-d", "/tmp"], &[]),
            config(&["-vf"], &[]),
            config(&["--force-vermagic"], &[]),
            config(&["-r"], &[]),
            config(&["amdgpu"], &[]),
            config(&[], &["-x"]),
            config(&[], &["a b=1"]),
            config(&[], &["=1"]),
        ] {
            assert!(module_config_problem(&bad).is_some(), "{bad:?}");
        }
    }

    #[test]
    fn modprobe_gets_the_bundle_then_options_then_amdgpu_then_parameters() {
        let config = KernelModuleConfigSpec {
            load_args: vec!["-v".into()],
            parameters: vec!["ras_enable=1".into()],
            ..KernelModuleConfigSpec::default()
        };
        let args = modprobe_args(std::path::Path::new("/host/b"), &config);
        assert_eq!(
            args,
            ["--dirname", "/host/b", "-v", "amdgpu", "ras_enable=1"].map(OsString::from)
        );
    }

    /// A `modprobe` that logs its arguments and, unless told to fail, makes
    /// `/sys/module/amdgpu` appear under `root` as a real load would.
    /// An executable shell script `dir/name`. Each test's scripts have
    /// names of their own: none is rewritten while another may run.
    fn script(dir: &std::path::Path, name: &str, body: &str) -> PathBuf {
        use std::os::unix::fs::PermissionsExt;
        let path = dir.join(name);
        std::fs::write(&path, body).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        path
    }

    fn recorder(
        dir: &std::path::Path,
        name: &str,
        root: &std::path::Path,
        exit: i32,
        appear: bool,
    ) -> PathBuf {
        let log = dir.join("modprobe.log");
        let module = root.join("sys/module/amdgpu");
        let appear = if appear {
            format!(
                "mkdir -p '{m}' && echo 6.12.12 > '{m}/version' && echo O > '{m}/taint'",
                m = module.display()
            )
        } else {
            String::new()
        };
        let body = format!(
            "#!/bin/sh\nfor a in \"$@\"; do printf '%s\\n' \"$a\"; done > '{log}'\n{appear}\n\
             [ {exit} -ne 0 ] && echo 'modprobe: ERROR: could not insert amdgpu' >&2\nexit {exit}\n",
            log = log.display()
        );
        script(dir, name, &body)
    }

    fn logged(dir: &std::path::Path) -> Vec<String> {
        std::fs::read_to_string(dir.join("modprobe.log"))
            .unwrap_or_default()
            .lines()
            .map(str::to_owned)
            .collect()
    }

    #[tokio::test]
    async fn load_sets_the_firmware_path_runs_modprobe_and_sees_the_module() {
        let root = tempfile::tempdir().unwrap();
        let tools = tempfile::tempdir().unwrap();
        let host = HostRoot::new(root.path());
        host.write(FIRMWARE_PATH_PARAM, "\n").unwrap();
        let commands = LoadCommands {
            modprobe: recorder(tools.path(), "modprobe", root.path(), 0, true),
            timeout: Duration::from_secs(30),
        };
        let config = KernelModuleConfigSpec {
            parameters: vec!["ras_enable=1".into()],
            ..KernelModuleConfigSpec::default()
        };
        let bundle = verified("6.12.12");
        load(&host, &commands, &bundle, &config).await.unwrap();
        assert_eq!(
            host.read_attr(FIRMWARE_PATH_PARAM).unwrap(),
            "/var/lib/gpu-operator/drivers/b/firmware"
        );
        let bundle_seen = host.path(&bundle.dir).display().to_string();
        assert_eq!(
            logged(tools.path()),
            ["--dirname", bundle_seen.as_str(), "amdgpu", "ras_enable=1"]
        );
        assert_eq!(
            host.read_attr("/sys/module/amdgpu/version").unwrap(),
            "6.12.12"
        );
    }

    #[tokio::test]
    async fn failures_are_typed_and_name_what_modprobe_said() {
        let root = tempfile::tempdir().unwrap();
        let tools = tempfile::tempdir().unwrap();
        let host = HostRoot::new(root.path());
        let config = KernelModuleConfigSpec::default();
        let bundle = verified("6.12.12");

        let failing = LoadCommands {
            modprobe: recorder(tools.path(), "failing", root.path(), 1, false),
            timeout: Duration::from_secs(30),
        };
        let err = load(&host, &failing, &bundle, &config).await.unwrap_err();
        assert_eq!(err.reason(), "ModprobeFailed");
        assert!(err.to_string().contains("could not insert amdgpu"), "{err}");

        let silent = LoadCommands {
            modprobe: recorder(tools.path(), "silent", root.path(), 0, false),
            timeout: Duration::from_secs(30),
        };
        let err = load(&host, &silent, &bundle, &config).await.unwrap_err();
        assert_eq!(err.reason(), "ModuleNotLoaded");

        let missing = LoadCommands {
            modprobe: tools.path().join("no-such-modprobe"),
            timeout: Duration::from_secs(30),
        };
        let err = load(&host, &missing, &bundle, &config).await.unwrap_err();
        assert_eq!(err.reason(), "ModprobeUnavailable");

        let long = Verified {
            dir: format!("/{}", "d".repeat(300)),
            ..bundle.clone()
        };
        let err = load(&host, &silent, &long, &config).await.unwrap_err();
        assert_eq!(err.reason(), "FirmwarePathFailed");
    }

    #[tokio::test]
    async fn a_modprobe_that_hangs_times_out() {
        let root = tempfile::tempdir().unwrap();
        let tools = tempfile::tempdir().unwrap();
        let host = HostRoot::new(root.path());
        let commands = LoadCommands {
            modprobe: script(tools.path(), "hanging", "#!/bin/sh\nexec sleep 30\n"),
            timeout: Duration::from_millis(200),
        };
        let started = std::time::Instant::now();
        let err = load(
            &host,
            &commands,
            &verified("6.12.12"),
            &KernelModuleConfigSpec::default(),
        )
        .await
        .unwrap_err();
        assert_eq!(err.reason(), "ModprobeTimedOut");
        assert!(started.elapsed() < Duration::from_secs(10));
    }
}
