//! The node's driver path end to end on a simulated host: a host booted with
//! no amdgpu, a bundle in its store, the report, the verdict, the decision,
//! a load through a recorder `modprobe` that makes `/sys/module/amdgpu`
//! appear as the kernel would, and the report and decision after it.

use std::path::{Path, PathBuf};
use std::time::Duration;

use gpu_operator::api::KernelModuleConfigSpec;
use gpu_operator::device::discover;
use gpu_operator::driver::bundle::{self, Expected, SIGNATURE_TRAILER, write_manifest};
use gpu_operator::driver::load::{self, FIRMWARE_PATH_PARAM, LoadCommands, LoadDecision};
use gpu_operator::driver::{ModuleOrigin, read_report};
use gpu_operator::host::HostRoot;
use gpu_operator::host::reader::BoundedReader;
use gpu_operator::simulate::{self, SIM_KERNEL_RELEASE, SimSpec};

const BUNDLE: &str = "/var/lib/gpu-operator/drivers/6.12.12";

fn write_bundle(host: &HostRoot) {
    let modules = format!("{BUNDLE}/lib/modules/{SIM_KERNEL_RELEASE}");
    let mut module = b"\x7fELF amdgpu".to_vec();
    module.extend_from_slice(SIGNATURE_TRAILER);
    host.write(format!("{modules}/updates/amdgpu.ko"), module)
        .unwrap();
    host.write(format!("{modules}/modules.dep"), "updates/amdgpu.ko:\n")
        .unwrap();
    host.write(format!("{BUNDLE}/firmware/amdgpu/gc.bin"), "fw")
        .unwrap();
    write_manifest(host, BUNDLE, "6.12.12", SIM_KERNEL_RELEASE).unwrap();
}

/// A `modprobe` that logs its arguments to `<tools>/argv` and loads the
/// bundle's driver into the simulated tree, as `simulate::load_module` does.
fn recorder(tools: &Path, root: &Path) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let module = root.join("sys/module/amdgpu");
    let body = format!(
        "#!/bin/sh\nprintf '%s\\n' \"$@\" > '{log}'\nmkdir -p '{m}'\n\
         echo 6.12.12 > '{m}/version'\necho 5D1A0B > '{m}/srcversion'\n\
         echo O > '{m}/taint'\necho 0 > '{m}/refcnt'\n",
        log = tools.join("argv").display(),
        m = module.display(),
    );
    let path = tools.join("modprobe");
    std::fs::write(&path, body).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path
}

#[tokio::test]
async fn a_node_without_a_driver_loads_the_verified_bundle_once() {
    let root = tempfile::tempdir().unwrap();
    let tools = tempfile::tempdir().unwrap();
    let host = HostRoot::new(root.path());
    let mut spec = SimSpec::new("mi300x", Some(1), None).unwrap();
    spec.driver_loaded = false;
    simulate::write_host(&host, &spec).unwrap();
    host.write(FIRMWARE_PATH_PARAM, "\n").unwrap();
    write_bundle(&host);
    let reader = BoundedReader::new(host.clone(), 2);
    let config = KernelModuleConfigSpec {
        parameters: vec!["ras_enable=1".into()],
        ..KernelModuleConfigSpec::default()
    };

    let report = read_report(&reader, &discover(&host).driver).await;
    assert_eq!(report.origin, ModuleOrigin::NotLoaded);
    let kernel = report.kernel_release.clone().unwrap();
    let expected = Expected {
        kernel_release: kernel,
        version: Some("6.12.12".into()),
        signature_required: report.secure_boot.requires_signature(),
    };
    let verdict = bundle::verify(&host, BUNDLE, &expected);
    let decision = load::decide(&report, verdict.as_ref(), &config);
    let LoadDecision::Load { bundle } = decision else {
        panic!("expected a load: {decision:?}");
    };

    let commands = LoadCommands {
        modprobe: recorder(tools.path(), root.path()),
        timeout: Duration::from_secs(30),
    };
    load::load(&host, &commands, &bundle, &config)
        .await
        .unwrap();
    let argv = std::fs::read_to_string(tools.path().join("argv")).unwrap();
    let bundle_seen = host.path(BUNDLE).display().to_string();
    assert_eq!(
        argv.lines().collect::<Vec<_>>(),
        ["--dirname", bundle_seen.as_str(), "amdgpu", "ras_enable=1"]
    );
    assert_eq!(
        host.read_attr(FIRMWARE_PATH_PARAM).unwrap(),
        format!("{BUNDLE}/firmware")
    );

    // The report now shows the bundle's driver, and nothing more is to be done.
    let report = read_report(&reader, &discover(&host).driver).await;
    assert_eq!(report.origin, ModuleOrigin::OutOfTree);
    assert_eq!(report.version.as_deref(), Some("6.12.12"));
    let verdict = bundle::verify(&host, BUNDLE, &expected);
    assert_eq!(
        load::decide(&report, verdict.as_ref(), &config),
        LoadDecision::Nothing {
            version: "6.12.12".into()
        }
    );
}

#[tokio::test]
async fn a_kernel_booted_without_a_bundle_refuses_and_changes_nothing() {
    let root = tempfile::tempdir().unwrap();
    let host = HostRoot::new(root.path());
    let mut spec = SimSpec::new("mi300x", Some(1), None).unwrap();
    spec.driver_loaded = false;
    simulate::write_host(&host, &spec).unwrap();
    write_bundle(&host);
    simulate::set_boot(&host, "6.8.0-51-generic", "new-boot").unwrap();
    let reader = BoundedReader::new(host.clone(), 2);

    let report = read_report(&reader, &discover(&host).driver).await;
    let kernel = report.kernel_release.clone().unwrap();
    let store = "/var/lib/gpu-operator/drivers";
    let found = bundle::find(&host, store, &kernel).unwrap();
    assert!(found.is_empty(), "{found:?}");
    let expected = Expected {
        kernel_release: kernel,
        version: None,
        signature_required: false,
    };
    let answer = gpu_operator::driver::preflight::preflight(&host, store, &expected).unwrap();
    let refusal = answer.refused.clone().unwrap().0;
    let decision = load::decide(&report, Err(&refusal), &KernelModuleConfigSpec::default());
    assert!(
        matches!(&decision, LoadDecision::Refuse { reason, .. } if *reason == "BundleMissingForKernel"),
        "{decision:?}"
    );
    assert!(!host.exists(FIRMWARE_PATH_PARAM));
    assert!(!host.exists("/sys/module/amdgpu"));
}

/// A `modprobe` that appends each run's arguments, one line a run, to
/// `<tools>/runs`, and does to the simulated tree what `modprobe` and
/// `modprobe -r` do to `/sys/module/amdgpu`.
fn counting_recorder(tools: &Path, root: &Path) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let module = root.join("sys/module/amdgpu");
    let body = format!(
        "#!/bin/sh\necho \"$*\" >> '{log}'\n\
         if [ \"$1\" = -r ]; then rm -rf '{m}'; exit 0; fi\nmkdir -p '{m}'\n\
         echo 6.12.12 > '{m}/version'\necho 5D1A0B > '{m}/srcversion'\n\
         echo O > '{m}/taint'\necho 0 > '{m}/refcnt'\n",
        log = tools.join("runs").display(),
        m = module.display(),
    );
    let path = tools.join("modprobe");
    std::fs::write(&path, body).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path
}

fn runs(tools: &Path) -> Vec<String> {
    std::fs::read_to_string(tools.join("runs"))
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect()
}

/// Lets every task that is ready run until it waits again: on this
/// (current-thread) runtime, the driver manager has then taken in what it
/// was sent, unless it runs a command.
async fn let_others_run() {
    for _ in 0..20 {
        tokio::task::yield_now().await;
    }
}

/// Issue 34's reload and the driver manager: the manager records the bundle
/// it loaded, with its module config, for a reload by another (the DRA
/// plugin's memory mode change); while such a reload runs, and after it
/// while the report still shows amdgpu gone, the manager runs no
/// `modprobe` of its own (it would load the driver a second time in the
/// middle of the reload), and a change asked meanwhile is taken once the
/// report shows amdgpu back.
#[tokio::test]
async fn the_driver_manager_records_its_bundle_and_holds_off_during_a_reload() {
    use gpu_operator::api::DriverType;
    use gpu_operator::api::agent_status::{DriverLoadState, SecureBoot};
    use gpu_operator::driver::DriverReport;
    use gpu_operator::driver::decision::DriverWanted;
    use gpu_operator::driver::manager::{self, ManagerConfig};
    use gpu_operator::driver::reload::{Handoff, ReloadFrom};
    use tokio::sync::watch;

    let root = tempfile::tempdir().unwrap();
    let tools = tempfile::tempdir().unwrap();
    let host = HostRoot::new(root.path());
    host.write(FIRMWARE_PATH_PARAM, "\n").unwrap();
    write_bundle(&host);
    let handoff = Handoff::default();
    let config = ManagerConfig {
        store: "/var/lib/gpu-operator/drivers".into(),
        commands: LoadCommands {
            modprobe: counting_recorder(tools.path(), root.path()),
            timeout: Duration::from_secs(30),
        },
        recheck: Duration::from_millis(50),
        handoff: handoff.clone(),
        ..ManagerConfig::default()
    };
    let module = KernelModuleConfigSpec {
        load_args: vec!["-v".into()],
        parameters: vec!["ras_enable=1".into()],
        ..KernelModuleConfigSpec::default()
    };
    let asked = |told_at: Option<&str>| DriverWanted {
        driver_type: DriverType::Container,
        version: Some("6.12.12".into()),
        blacklist: None,
        module: module.clone(),
        replace: true,
        reboot_from: None,
        told_at: told_at.map(str::to_owned),
    };
    let report = |loaded: bool| DriverReport {
        loaded,
        version: loaded.then(|| "6.12.12".to_owned()),
        origin: if loaded {
            ModuleOrigin::OutOfTree
        } else {
            ModuleOrigin::NotLoaded
        },
        kernel_release: Some(SIM_KERNEL_RELEASE.into()),
        secure_boot: SecureBoot::Disabled,
        ..DriverReport::default()
    };
    let (wanted_tx, wanted_rx) = watch::channel(Some(asked(None)));
    let (report_tx, report_rx) = watch::channel(Some(report(false)));
    let cancel = tokio_util::sync::CancellationToken::new();
    let (mut outcome, task) = manager::follow(
        BoundedReader::new(host.clone(), 2),
        config,
        wanted_rx,
        report_rx,
        cancel.clone(),
    );
    let manager = tokio::spawn(task);
    let within = Duration::from_secs(30);

    // The manager's own load: recorded with its bundle and module config.
    tokio::time::timeout(
        within,
        outcome.wait_for(|o| o.as_ref().is_some_and(|o| o.reason == "DriverLoaded")),
    )
    .await
    .expect("the bundle loaded")
    .unwrap();
    let bundle_seen = host.path(BUNDLE).display().to_string();
    assert_eq!(
        runs(tools.path()),
        [format!("--dirname {bundle_seen} -v amdgpu ras_enable=1")]
    );
    let recorded = ReloadFrom::Bundle {
        dir: BUNDLE.into(),
        version: "6.12.12".into(),
        module: module.clone(),
    };
    assert_eq!(handoff.from(), recorded);
    report_tx.send_replace(Some(report(true)));
    tokio::time::timeout(
        within,
        outcome.wait_for(|o| o.as_ref().is_some_and(|o| o.reason == "DriverRunning")),
    )
    .await
    .expect("found running")
    .unwrap();
    assert_eq!(handoff.from(), recorded, "kept while its version runs");

    // A reload: amdgpu gone for a moment while it runs, and after it in a
    // report read during it. The manager loads nothing of its own.
    let reload = handoff.begin().await;
    report_tx.send_replace(Some(report(false)));
    let_others_run().await;
    wanted_tx.send_replace(Some(asked(Some("t2"))));
    let_others_run().await;
    drop(reload);
    let_others_run().await;
    assert_eq!(runs(tools.path()).len(), 1, "{:?}", runs(tools.path()));
    assert_ne!(
        outcome.borrow().as_ref().map(|o| o.state),
        Some(DriverLoadState::Loading)
    );
    // amdgpu back: the change asked meanwhile is answered, with no load.
    report_tx.send_replace(Some(report(true)));
    tokio::time::timeout(
        within,
        outcome.wait_for(|o| {
            o.as_ref().is_some_and(|o| {
                o.told_at.as_deref() == Some("t2") && o.state == DriverLoadState::Loaded
            })
        }),
    )
    .await
    .expect("the change asked during the reload answered")
    .unwrap();
    assert_eq!(
        outcome.borrow().as_ref().map(|o| o.reason.clone()),
        Some("DriverRunning".to_owned()),
        "found running, not loaded again"
    );
    assert_eq!(runs(tools.path()).len(), 1, "{:?}", runs(tools.path()));
    assert_eq!(handoff.from(), recorded);
    cancel.cancel();
    manager.await.unwrap();
}

/// A reload of an out-of-tree amdgpu the driver manager found running (an
/// earlier agent loaded it): the store's verified bundle of the running
/// version is loaded again, as the manager would load it; with no such
/// bundle, the reload is refused before anything runs, saying why.
#[tokio::test]
async fn a_reload_of_a_driver_found_running_takes_the_stores_bundle_of_its_version() {
    use gpu_operator::driver::reload::{self, ReloadFrom};
    let root = tempfile::tempdir().unwrap();
    let host = HostRoot::new(root.path());
    write_bundle(&host);
    let module = KernelModuleConfigSpec {
        parameters: vec!["ras_enable=1".into()],
        ..KernelModuleConfigSpec::default()
    };
    let found = |version: &str| ReloadFrom::Store {
        store: "/var/lib/gpu-operator/drivers".into(),
        expected: Expected {
            kernel_release: SIM_KERNEL_RELEASE.into(),
            version: Some(version.into()),
            signature_required: true,
        },
        module: module.clone(),
    };
    let steps = reload::plan(&host, &found("6.12.12"), &KernelModuleConfigSpec::default())
        .await
        .unwrap();
    assert_eq!(
        steps.firmware.as_deref(),
        Some(&*format!("{BUNDLE}/firmware"))
    );
    let bundle_seen = host.path(BUNDLE);
    assert_eq!(
        steps.load,
        load::modprobe_args(&bundle_seen, &module),
        "the bundle's directory and the asked module config"
    );
    let err = reload::plan(&host, &found("6.10.5"), &KernelModuleConfigSpec::default())
        .await
        .unwrap_err();
    assert!(
        err.contains("amdgpu 6.10.5 runs, and no bundle of it"),
        "{err}"
    );
    let err = reload::plan(
        &host,
        &ReloadFrom::Refused("amdgpu is not loaded".into()),
        &module,
    )
    .await
    .unwrap_err();
    assert!(err.contains("amdgpu is not loaded"), "{err}");
}
