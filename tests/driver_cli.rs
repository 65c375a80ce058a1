//! `gpu-operator driver status` and `driver check`, the real binary against a
//! simulated host with a driver bundle written into its bundle store: exit
//! statuses, reasons and JSON as an administrator's script sees them.

mod support;

use std::process::Command;

use gpu_operator::driver::report::SECURE_BOOT_VAR;
use gpu_operator::host::HostRoot;
use gpu_operator::simulate::{self, SIM_BOOT_ID, SIM_KERNEL_RELEASE, SimSpec};
use support::bundles;

const VERSION: &str = "6.12.12";

struct Host {
    dir: tempfile::TempDir,
    host: HostRoot,
}

impl Host {
    /// A simulated MI300X host with one bundle for its running kernel;
    /// `signed` says whether the bundle's modules carry a signature.
    fn with_bundle(signed: bool) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let host = HostRoot::new(dir.path());
        simulate::write_host(&host, &SimSpec::new("mi300x", Some(1), None).unwrap()).unwrap();
        let this = Self { dir, host };
        this.write_bundle(SIM_KERNEL_RELEASE, signed);
        this
    }

    fn bundle_dir(kernel: &str) -> String {
        bundles::bundle_dir(VERSION, kernel)
    }

    fn write_bundle(&self, kernel: &str, signed: bool) {
        bundles::write_bundle(&self.host, VERSION, kernel, signed);
    }

    /// The bundle's files, without its manifest.
    fn write_bundle_tree(&self, kernel: &str, signed: bool) {
        bundles::write_bundle_tree(&self.host, VERSION, kernel, signed);
    }

    /// Runs `gpu-operator driver ARGS --host-root <root>`: exit code, stdout.
    fn driver(&self, args: &[&str]) -> (i32, String, String) {
        bundles::run_driver(self.dir.path(), args)
    }

    fn check_json(&self, args: &[&str]) -> (i32, serde_json::Value) {
        let mut all = vec!["check", "-o", "json"];
        all.extend_from_slice(args);
        let (code, stdout, stderr) = self.driver(&all);
        let json = serde_json::from_str(&stdout)
            .unwrap_or_else(|e| panic!("{e}: stdout {stdout:?}, stderr {stderr:?}"));
        (code, json)
    }
}

#[test]
fn status_reports_the_module_kernel_boot_and_secure_boot() {
    let host = Host::with_bundle(true);
    let (code, stdout, stderr) = host.driver(&["status", "-o", "json"]);
    assert_eq!(code, 0, "{stderr}");
    let json: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(json["loaded"], true);
    assert_eq!(json["origin"], "OutOfTree");
    assert_eq!(json["kernelRelease"], SIM_KERNEL_RELEASE);
    assert_eq!(json["bootId"], SIM_BOOT_ID);
    assert_eq!(json["secureBoot"], "NotUefi");

    host.host.write(SECURE_BOOT_VAR, [7u8, 0, 0, 0, 1]).unwrap();
    simulate::unload_module(&host.host).unwrap();
    let (code, stdout, _) = host.driver(&["status"]);
    assert_eq!(code, 0);
    assert!(stdout.contains("not loaded"), "{stdout}");
    assert!(stdout.contains("secure boot: Enabled"), "{stdout}");
}

#[test]
fn a_verified_bundle_for_the_running_kernel_passes() {
    let host = Host::with_bundle(true);
    let (code, json) = host.check_json(&[]);
    assert_eq!(code, 0, "{json:#}");
    assert_eq!(json["kernelRelease"], SIM_KERNEL_RELEASE);
    let bundle = &json["bundles"][0];
    assert_eq!(bundle["dir"], Host::bundle_dir(SIM_KERNEL_RELEASE));
    assert_eq!(bundle["verified"]["version"], VERSION);
    assert!(json.get("refused").is_none(), "{json:#}");

    let (code, stdout, _) = host.driver(&["check", "--version", VERSION]);
    assert_eq!(code, 0, "{stdout}");
    assert!(stdout.contains("ready: driver 6.12.12"), "{stdout}");
}

#[test]
fn a_new_kernel_without_a_bundle_is_not_ready_until_one_is_added() {
    let host = Host::with_bundle(true);
    let next = "6.8.0-51-generic";
    let (code, json) = host.check_json(&["--kernel", next]);
    assert_eq!(code, 1, "{json:#}");
    assert_eq!(json["refused"]["reason"], "BundleMissingForKernel");
    assert_eq!(json["bundles"].as_array().map(Vec::len), Some(0));

    host.write_bundle(next, true);
    let (code, json) = host.check_json(&["--kernel", next]);
    assert_eq!(code, 0, "{json:#}");
    assert_eq!(json["bundles"][0]["dir"], Host::bundle_dir(next));
}

#[test]
fn a_changed_file_fails_with_checksum_mismatch() {
    let host = Host::with_bundle(true);
    let bundle = Host::bundle_dir(SIM_KERNEL_RELEASE);
    host.host
        .write(format!("{bundle}/firmware/amdgpu/psp_13_0_6_sos.bin"), "FW")
        .unwrap();
    let (code, json) = host.check_json(&[]);
    assert_eq!(code, 1, "{json:#}");
    assert_eq!(json["refused"]["reason"], "ChecksumMismatch");
    let (code, stdout, _) = host.driver(&["check"]);
    assert_eq!(code, 1);
    assert!(stdout.contains("NOT READY: ChecksumMismatch"), "{stdout}");
    assert!(stdout.contains("psp_13_0_6_sos.bin"), "{stdout}");
}

#[test]
fn unsigned_modules_fail_under_secure_boot_only() {
    let host = Host::with_bundle(false);
    let (code, json) = host.check_json(&[]);
    assert_eq!(code, 0, "no Secure Boot, no signature needed: {json:#}");
    assert_eq!(json["signatureRequired"], false);

    host.host.write(SECURE_BOOT_VAR, [7u8, 0, 0, 0, 1]).unwrap();
    let (code, json) = host.check_json(&[]);
    assert_eq!(code, 1, "{json:#}");
    assert_eq!(json["refused"]["reason"], "UnsignedModule");

    let (code, json) = host.check_json(&["--signatures", "not-required"]);
    assert_eq!(code, 0, "{json:#}");
}

#[test]
fn bad_arguments_and_unreadable_roots_exit_2() {
    let host = Host::with_bundle(true);
    let (code, _, stderr) = host.driver(&["check", "--signatures", "sometimes"]);
    assert_eq!(code, 2, "{stderr}");
    let out = Command::new(env!("CARGO_BIN_EXE_gpu-operator"))
        .args(["driver", "check", "--host-root"])
        .arg(host.dir.path().join("missing"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("host root"));

    let help = Command::new(env!("CARGO_BIN_EXE_gpu-operator"))
        .args(["driver", "check", "--help"])
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&help.stdout);
    assert!(help.contains("Exit status: 0"), "{help}");
    assert!(help.contains("BundleMissingForKernel"), "{help}");
}

#[test]
fn manifest_writes_a_bundle_that_check_accepts_and_names_what_is_missing() {
    let host = Host::with_bundle(true);
    let kernel = "6.8.0-51-generic";
    let bundle = Host::bundle_dir(kernel);
    host.write_bundle_tree(kernel, true);
    let (code, json) = host.check_json(&["--kernel", kernel]);
    assert_eq!(code, 1, "no manifest yet: {json:#}");

    let args = [
        "manifest",
        "--bundle-dir",
        &bundle,
        "--kernel",
        kernel,
        "--version",
        VERSION,
    ];
    let (code, stdout, stderr) = host.driver(&args);
    assert_eq!(code, 0, "{stdout} {stderr}");
    assert!(stdout.contains("listing 4 files"), "{stdout}");
    let (code, json) = host.check_json(&["--kernel", kernel, "--signatures", "required"]);
    assert_eq!(code, 0, "{json:#}");

    // A dependency depmod names but nobody copied.
    host.host
        .write(
            format!("{bundle}/lib/modules/{kernel}/modules.dep"),
            "updates/dkms/amdgpu.ko: updates/dkms/amdttm.ko updates/dkms/amdxcp.ko\n",
        )
        .unwrap();
    let (code, stdout, _) = host.driver(&args);
    assert_eq!(code, 1, "{stdout}");
    assert!(stdout.contains("DependencyMissing"), "{stdout}");
    assert!(stdout.contains("amdxcp.ko"), "{stdout}");

    let missing = format!("{bundle}-nowhere");
    let (code, _, stderr) = host.driver(&[
        "manifest",
        "--bundle-dir",
        &missing,
        "--kernel",
        kernel,
        "--version",
        VERSION,
    ]);
    assert_eq!(code, 2, "{stderr}");
}
