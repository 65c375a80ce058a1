//! Driver bundles and a `modprobe` stand-in, for tests of driver loading on
//! simulated hosts: a bundle laid out as docs/driver.md describes, with its
//! manifest written by the project's own `write_manifest`, and a recorder
//! script that does to the simulated host what a successful `modprobe
//! amdgpu` does to a real one (`/sys/module/amdgpu` appears, with the
//! bundle's version), and logs its arguments.

use std::path::{Path, PathBuf};

use gpu_operator::driver::bundle::{SIGNATURE_TRAILER, write_manifest};
use gpu_operator::host::HostRoot;

/// Where bundles are kept on a simulated host.
pub const STORE: &str = "/var/lib/gpu-operator/drivers";

/// The directory (a host path) of the bundle for `version` and `kernel`.
pub fn bundle_dir(version: &str, kernel: &str) -> String {
    format!("{STORE}/{version}-{kernel}")
}

/// Writes the bundle's files (amdgpu, one dependency, modules.dep, a
/// firmware file), without its manifest; `signed` appends the module
/// signature trailer to each module. Returns the bundle's directory.
pub fn write_bundle_tree(host: &HostRoot, version: &str, kernel: &str, signed: bool) -> String {
    let bundle = bundle_dir(version, kernel);
    write_tree_at(host, &bundle, kernel, signed);
    bundle
}

/// [`write_bundle`] at the host path `bundle`, which need not be in the
/// store: a bundle made elsewhere and moved in whole.
pub fn write_bundle_at(host: &HostRoot, bundle: &str, version: &str, kernel: &str, signed: bool) {
    write_tree_at(host, bundle, kernel, signed);
    write_manifest(host, bundle, version, kernel).unwrap();
}

fn write_tree_at(host: &HostRoot, bundle: &str, kernel: &str, signed: bool) {
    let modules = format!("{bundle}/lib/modules/{kernel}");
    for name in ["amdgpu", "amdttm"] {
        let mut bytes = format!("\x7fELF {name}").into_bytes();
        if signed {
            bytes.extend_from_slice(SIGNATURE_TRAILER);
        }
        host.write(format!("{modules}/updates/dkms/{name}.ko"), bytes)
            .unwrap();
    }
    host.write(
        format!("{modules}/modules.dep"),
        "updates/dkms/amdgpu.ko: updates/dkms/amdttm.ko\nupdates/dkms/amdttm.ko:\n",
    )
    .unwrap();
    host.write(format!("{bundle}/firmware/amdgpu/psp_13_0_6_sos.bin"), "fw")
        .unwrap();
}

/// A complete bundle: its files and its manifest. Returns its directory.
pub fn write_bundle(host: &HostRoot, version: &str, kernel: &str, signed: bool) -> String {
    let bundle = write_bundle_tree(host, version, kernel, signed);
    write_manifest(host, &bundle, version, kernel).unwrap();
    bundle
}

/// A `modprobe` stand-in in `tools`: logs its arguments, one line per run,
/// to `tools/modprobe.log`, then makes `/sys/module/amdgpu` of the host at
/// `root` show an out-of-tree module of `version`, or, for `-r`, removes
/// it. Returns its path.
pub fn modprobe_recorder(tools: &Path, root: &Path, version: &str) -> PathBuf {
    let module = root.join("sys/module/amdgpu");
    let log = tools.join("modprobe.log");
    let body = format!(
        "#!/bin/sh\necho \"$*\" >> '{log}'\n\
         if [ \"$1\" = -r ]; then rm -rf '{module}'; exit 0; fi\nmkdir -p '{module}'\n\
         printf '{version}\\n' > '{module}/version'\nprintf 'O\\n' > '{module}/taint'\n\
         printf '0\\n' > '{module}/refcnt'\nprintf 'live\\n' > '{module}/initstate'\n\
         printf 'ABCDEF0123456789ABCDEF0\\n' > '{module}/srcversion'\n",
        log = log.display(),
        module = module.display(),
    );
    write_script(tools, "modprobe", &body)
}

/// The argument lines the recorder logged, one per run.
pub fn modprobe_runs(tools: &Path) -> Vec<String> {
    std::fs::read_to_string(tools.join("modprobe.log"))
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect()
}

/// A driver configuration whose `modprobe` does not exist: for agents in
/// tests that must never run a host command, whatever a DeviceConfig asks.
pub fn no_modprobe() -> gpu_operator::driver::manager::ManagerConfig {
    let mut config = gpu_operator::driver::manager::ManagerConfig::default();
    config.commands.modprobe = PathBuf::from("/nonexistent/gpu-operator-test/modprobe");
    config
}

/// A `modprobe` stand-in in `tools` that loads whatever bundle it is given:
/// for `--dirname DIR` it makes `/sys/module/amdgpu` of the host at `root`
/// show an out-of-tree module of the version `DIR/manifest.json` names (a
/// `srcversion` of its own per version); `-r` removes it. Each run's
/// arguments go to `tools/modprobe.log`. Returns its path.
pub fn modprobe_recorder_of_bundles(tools: &Path, root: &Path) -> PathBuf {
    let module = root.join("sys/module/amdgpu");
    let log = tools.join("modprobe.log");
    let body = format!(
        "#!/bin/sh\necho \"$*\" >> '{log}'\n\
         if [ \"$1\" = -r ]; then rm -rf '{module}'; exit 0; fi\n\
         [ \"$1\" = --dirname ] || {{ echo 'expected --dirname' >&2; exit 1; }}\n\
         version=$(sed -n 's/.*\"version\" *: *\"\\([^\"]*\\)\".*/\\1/p' \"$2/manifest.json\" | head -n 1)\n\
         [ -n \"$version\" ] || {{ echo \"no version in $2/manifest.json\" >&2; exit 1; }}\n\
         mkdir -p '{module}'\n\
         printf '%s\\n' \"$version\" > '{module}/version'\nprintf 'O\\n' > '{module}/taint'\n\
         printf '0\\n' > '{module}/refcnt'\nprintf 'live\\n' > '{module}/initstate'\n\
         printf 'SRC%s\\n' \"$version\" | tr -d . > '{module}/srcversion'\n",
        log = log.display(),
        module = module.display(),
    );
    write_script(tools, "modprobe", &body)
}

/// A reboot stand-in in `tools`: logs each run to `tools/reboot.log`; when
/// `comes_back`, does to the host at `root` what a reboot does to what the
/// agent reads (a new boot id, no amdgpu loaded: the bundle's module is not
/// in the host's module tree, and the in-box one is blacklisted); else
/// nothing more (a node that never comes back). Returns the command.
pub fn reboot_recorder(
    tools: &Path,
    root: &Path,
    comes_back: bool,
) -> gpu_operator::driver::reboot::RebootCommand {
    let log = tools.join("reboot.log");
    let boot_id = root.join("proc/sys/kernel/random/boot_id");
    let module = root.join("sys/module/amdgpu");
    let back = if comes_back {
        format!(
            "n=$(wc -l < '{log}')\nprintf 'b007%08d-0000-4000-8000-000000000000\\n' \"$n\" > '{boot_id}.new'\n\
             mv '{boot_id}.new' '{boot_id}'\nrm -rf '{module}'\n",
            log = log.display(),
            boot_id = boot_id.display(),
            module = module.display(),
        )
    } else {
        String::new()
    };
    let body = format!(
        "#!/bin/sh\necho reboot >> '{log}'\n{back}",
        log = log.display()
    );
    let path = write_script(tools, "reboot", &body);
    gpu_operator::driver::reboot::RebootCommand::parse(&path.display().to_string()).unwrap()
}

/// How often the reboot stand-in ran.
pub fn reboots(tools: &Path) -> usize {
    std::fs::read_to_string(tools.join("reboot.log"))
        .map(|text| text.lines().count())
        .unwrap_or(0)
}

/// Writes the shell script `body` as `tools/name`, executable; its path.
fn write_script(tools: &Path, name: &str, body: &str) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let path = tools.join(name);
    std::fs::create_dir_all(tools).unwrap();
    std::fs::write(&path, body).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path
}

/// Makes the `modprobe` stand-in in `tools` hold every load until the file
/// `gate` exists: a driver load that takes as long as a test needs.
pub fn hold_loads_until(tools: &Path, gate: &Path) {
    let path = tools.join("modprobe");
    let script = std::fs::read_to_string(&path).unwrap();
    let (shebang, rest) = script.split_once('\n').unwrap();
    let held = format!(
        "{shebang}\nif [ \"$1\" = --dirname ]; then while [ ! -e '{}' ]; do sleep 0.05; done; fi\n{rest}",
        gate.display()
    );
    write_script(tools, "modprobe", &held);
}

/// Runs `gpu-operator driver ARGS --host-root <root>` to its exit: exit
/// code, stdout, stderr.
pub fn run_driver(root: &std::path::Path, args: &[&str]) -> (i32, String, String) {
    super::logged::run(
        super::logged::gpu_operator()
            .arg("driver")
            .args(args)
            .arg("--host-root")
            .arg(root),
    )
}

/// The `modprobe` stand-in's name in `tools` of [`modprobe_with_faults`].
pub const MODPROBE_WITH_FAULTS: &str = "modprobe-or-refuse";

/// A `modprobe` stand-in in `tools` for the host at `root`: the
/// recorder of `version` ([`modprobe_recorder`], logging each run), but
/// failing while `tools/refuse` exists, and once for `tools/refuse-once`,
/// as a modprobe refusing to unload a module in use does (such a run is
/// not logged); taking 2 s while `tools/slow` exists. Returns its path.
pub fn modprobe_with_faults(tools: &Path, root: &Path, version: &str) -> PathBuf {
    let recorder = modprobe_recorder(tools, root, version);
    let refusing = tools.join(MODPROBE_WITH_FAULTS);
    std::fs::write(
        &refusing,
        format!(
            "#!/bin/sh\nif [ -e '{refuse}' ]; then echo 'modprobe: FATAL: Module amdgpu is in use.' >&2; exit 1; fi\nif [ -e '{slow}' ]; then sleep 2; fi\nif [ -e '{refuse}-once' ]; then rm '{refuse}-once'; echo 'modprobe: FATAL: Module amdgpu is in use.' >&2; exit 1; fi\nexec '{recorder}' \"$@\"\n",
            refuse = tools.join("refuse").display(),
            slow = tools.join("slow").display(),
            recorder = recorder.display()
        ),
    )
    .expect("the modprobe stand-in written");
    std::fs::set_permissions(
        &refusing,
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .expect("the modprobe stand-in written");
    refusing
}
