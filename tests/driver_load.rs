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
