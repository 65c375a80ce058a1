//! `gpu-operator driver`: what driver this node runs (`status`), whether a
//! driver bundle exists and verifies for a kernel (`check`, the preflight
//! before rebooting into a new kernel), and putting bundles in the store
//! (`manifest` for one made by hand, `import` from a driver image's copy,
//! `fetch` from a tarball).
//!
//! It owns the subcommands' arguments, their output (table or JSON) and exit
//! statuses; the report, the checks and the sources are `driver`'s. It must
//! not read a host file or check a bundle itself.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Args, Subcommand};

use super::args::{HostRootArg, OutputFormat};
use super::output::fail;
use super::runtime::run_to_end;
use crate::device::{self, Limits};
use crate::driver::bundle::{self, Expected};
use crate::driver::preflight::{self, DEFAULT_STORE, Preflight};
use crate::driver::source;
use crate::driver::{DriverReport, SecureBoot, read_report};
use crate::host::HostRoot;
use crate::host::reader::BoundedReader;

#[derive(Args, Debug)]
pub struct DriverArgs {
    #[command(subcommand)]
    pub command: DriverCommand,
}

#[derive(Subcommand, Debug)]
pub enum DriverCommand {
    /// Print the amdgpu driver and kernel this host runs.
    ///
    /// The module's version and srcversion, whether it is the in-box driver
    /// (built in, or the kernel's own module) or an out-of-tree one (taint
    /// flag O: DKMS, a driver image), its use count, the running kernel, the
    /// boot id and whether Secure Boot is on. Always exits 0 once the host
    /// root is readable: a file that cannot be read is listed as a problem.
    /// Exit status 2: the host root cannot be read.
    Status(DriverStatusArgs),
    /// Check, before booting into a kernel, that a driver bundle exists for
    /// it and verifies.
    ///
    /// Looks in --bundle-dir for the bundles built for --kernel (default: the
    /// running kernel) and verifies each as the agent does before it loads
    /// one: the manifest names that kernel, every file's sha256 matches, no
    /// path leaves the bundle, no file is unlisted, modules.dep names amdgpu
    /// and its dependencies, and, when Secure Boot is on (or cannot be told),
    /// every module is signed. The bundle format is in docs/driver.md.
    ///
    /// Exit status: 0 a bundle for the kernel verifies, 1 none exists or none
    /// verifies (each refusal is printed with its reason, e.g.
    /// BundleMissingForKernel, ChecksumMismatch, UnsignedModule), 2 an
    /// argument is bad or the host root or bundle directory cannot be read.
    Check(DriverCheckArgs),
    /// Write manifest.json for a bundle directory that is otherwise complete.
    ///
    /// For people who make bundles (the air-gapped path): lay out
    /// lib/modules/<kernel>/ (with depmod's modules.dep) and firmware/ as
    /// docs/driver.md says, then run this. It lists the sha256 of every file
    /// under those two directories, then verifies the bundle as `check` does
    /// (without requiring signatures: use `check --signatures required` for
    /// that). Exit status: 0 written and verified, 1 written but the bundle
    /// does not verify (the reason is printed), 2 an argument is bad or the
    /// directory cannot be read or written.
    Manifest(DriverManifestArgs),
    /// Reboot this host: what the agent runs by default when a node's driver
    /// upgrade asks for a reboot (agent --reboot-command).
    ///
    /// Flushes every file system (sync), enters the mount namespace of the
    /// host's PID 1 and runs the host's `systemctl reboot` there. In a pod it
    /// needs hostPID and CAP_SYS_ADMIN; on a host, root. It reboots at once:
    /// run it by hand only to reboot. Exit status (only when the reboot could
    /// not be asked for): 1, with the reason.
    RebootHost,
    /// Make a bundle from the reference operator's precompiled driver image.
    ///
    /// The image (tag <os>-<osver>-<kernel>-<version>, e.g.
    /// ubuntu-22.04-6.8.0-49-generic-6.12.12) keeps its modules under
    /// /opt/lib/modules/<kernel>/ and amdgpu's firmware under
    /// /firmwareDir/updates/amdgpu/. Copy those two into a directory (an
    /// init container of the driver image does it, see docs/driver.md), then
    /// run this with that directory as --from. It writes the bundle
    /// <bundle-dir>/<version>-<kernel>/: lib/modules/<kernel>/ with the
    /// image's modules.* index files and only amdgpu and the modules it needs
    /// per modules.dep (not the image's whole kernel tree), firmware/amdgpu/
    /// with the firmware, and manifest.json; then verifies it as `check` does.
    /// The bundle is built beside the store's bundles under a name starting
    /// with `.` and renamed into place once it verifies. Symbolic links in
    /// the copy are followed only within --from. It copies at most 512 MiB a
    /// file, 20,000 files and --max-disk in all, and leaves --min-free free
    /// on the store's filesystem; a refused or failed import leaves nothing
    /// in the store.
    ///
    /// Exit status: 0 imported, or the same bundle was there already; 1
    /// refused, with the reason (a module modules.dep names is missing:
    /// DependencyMissing; a link out of --from: PathEscapesBundle; another
    /// bundle at that name: BundleExists, unless --replace; ...); 2 a bad
    /// argument or tag, a --from without opt/lib/modules/<kernel>/ or
    /// firmwareDir/updates/amdgpu/, a directory that cannot be read or
    /// written, or a store without room for the bundle within --max-disk and
    /// --min-free (BundleStoreFull).
    Import(DriverImportArgs),
    /// Put the bundle a tarball holds into the store, once its sha256 matches.
    ///
    /// --source is a file (a host path) or an http:// or https:// URL (https
    /// with the system's root certificates; at most 5 redirects). The tarball
    /// (.tar, .tar.gz/.tgz, .tar.xz or .tar.zst, told by its content) holds
    /// one bundle: manifest.json at its top, or in a single top-level
    /// directory. It is downloaded into the store while hashed (at most 2
    /// GiB), its sha256 checked before anything is unpacked, then unpacked
    /// with only regular files and directories (no absolute path, no `..`,
    /// no link or device; at most 2 GiB and 40,000 entries; within
    /// --max-disk and --min-free), verified
    /// against its own manifest for the kernel that manifest names, and
    /// renamed to <bundle-dir>/<version>-<kernel>/. source.json at the
    /// bundle's top records where it came from and its sha256: a tarball of
    /// that sha256 is not fetched again (unless --replace).
    ///
    /// Exit status: 0 fetched, or fetched before; 1 refused, with the reason
    /// (ChecksumMismatch, UnsafeTarball, a bundle that does not verify,
    /// BundleExists unless --replace); 2 a bad argument, a source that cannot
    /// be read or downloaded, or a store that cannot be written or has no
    /// room (BundleStoreFull).
    Fetch(DriverFetchArgs),
}

/// Whether a new bundle's modules must be signed, for `import` and `fetch`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum NewBundleSignatures {
    /// Keep the bundle only if every module is signed (as Secure Boot needs).
    Required,
    /// Not checked (the agent checks them before it loads, when needed).
    NotRequired,
}

#[derive(Args, Debug)]
#[command(group(clap::ArgGroup::new("identity").required(true).args(["image_tag", "kernel"])))]
pub struct DriverImportArgs {
    #[command(flatten)]
    pub host: HostRootArg,
    /// The directory the driver image was copied into: it holds
    /// opt/lib/modules/<kernel>/ and firmwareDir/updates/amdgpu/. A host
    /// path, resolved under --host-root; a relative path is taken from the
    /// current directory first.
    #[arg(long, value_name = "DIR")]
    pub from: PathBuf,
    /// The driver image's tag, <os>-<osver>-<kernel>-<version>, or the image
    /// reference ending in it: gives the kernel and the driver version.
    #[arg(long, value_name = "TAG", conflicts_with_all = ["kernel", "version"])]
    pub image_tag: Option<String>,
    /// The kernel release the image is for (instead of --image-tag).
    #[arg(long, value_name = "RELEASE", requires = "version")]
    pub kernel: Option<String>,
    /// The driver version (instead of --image-tag).
    #[arg(long, value_name = "VERSION", requires = "kernel")]
    pub version: Option<String>,
    /// The bundle store (a host path, resolved under --host-root).
    #[arg(long, value_name = "DIR", default_value = DEFAULT_STORE)]
    pub bundle_dir: PathBuf,
    /// Replace a different bundle already at <bundle-dir>/<version>-<kernel>.
    #[arg(long)]
    pub replace: bool,
    /// Whether the new bundle's modules must be signed.
    #[arg(long, value_enum, default_value_t = NewBundleSignatures::NotRequired)]
    pub signatures: NewBundleSignatures,
    /// When --from holds no opt/lib/modules/<kernel>/, exit 0 with a note
    /// instead of 2: in a DaemonSet's init containers, the copy step skips
    /// an image built for another kernel than the node's, and the agent
    /// still starts (it then says BundleMissingForKernel).
    #[arg(long)]
    pub missing_ok: bool,
    /// The most the bundle's copied files may take in the store, added up,
    /// in MiB (as much as a fetched bundle may unpack to). Checked before
    /// anything is copied and while copying.
    #[arg(long, value_name = "MIB", default_value_t = 2048, value_parser = clap::value_parser!(u64).range(1..))]
    pub max_disk: u64,
    /// Free space the import leaves on the store's filesystem, in MiB:
    /// checked before anything is copied and while copying; the import stops
    /// with BundleStoreFull (exit 2), leaving nothing, rather than fill the
    /// disk.
    #[arg(long, value_name = "MIB", default_value_t = 1024)]
    pub min_free: u64,
    #[arg(long, short, value_enum, default_value_t = OutputFormat::Table)]
    pub output: OutputFormat,
}

#[derive(Args, Debug)]
pub struct DriverFetchArgs {
    #[command(flatten)]
    pub host: HostRootArg,
    /// The tarball: a file or an http:// or https:// URL. A file is a host
    /// path: a relative one is made absolute against the current directory,
    /// and the result is looked for under --host-root (so with --host-root
    /// DIR, `--source x.tar.gz` run in /tmp reads DIR/tmp/x.tar.gz).
    #[arg(long, value_name = "PATH|URL")]
    pub source: String,
    /// The tarball's sha256, 64 hexadecimal digits (as `sha256sum` prints it).
    #[arg(long, value_name = "HEX")]
    pub sha256: String,
    /// The bundle store (a host path, resolved under --host-root).
    #[arg(long, value_name = "DIR", default_value = DEFAULT_STORE)]
    pub bundle_dir: PathBuf,
    /// Replace a different bundle already at <bundle-dir>/<version>-<kernel>;
    /// also fetch again a tarball of a sha256 fetched before (to mend a
    /// bundle damaged since).
    #[arg(long)]
    pub replace: bool,
    /// Whether the new bundle's modules must be signed.
    #[arg(long, value_enum, default_value_t = NewBundleSignatures::NotRequired)]
    pub signatures: NewBundleSignatures,
    /// Seconds the whole download may take, redirects included.
    #[arg(long, value_name = "SECONDS", default_value_t = 1800, value_parser = clap::value_parser!(u64).range(1..))]
    pub timeout: u64,
    /// The most the fetch may hold in the store at once (the tarball, its
    /// decompressed copy and the unpacked files; each copy goes once the
    /// next is made), in MiB.
    #[arg(long, value_name = "MIB", default_value_t = 4096, value_parser = clap::value_parser!(u64).range(1..))]
    pub max_disk: u64,
    /// Free space the fetch leaves on the store's filesystem, in MiB:
    /// checked before each step and while writing; the fetch stops with
    /// BundleStoreFull (exit 2), leaving nothing, rather than fill the disk.
    #[arg(long, value_name = "MIB", default_value_t = 1024)]
    pub min_free: u64,
    #[arg(long, short, value_enum, default_value_t = OutputFormat::Table)]
    pub output: OutputFormat,
}

#[derive(Args, Debug)]
pub struct DriverManifestArgs {
    #[command(flatten)]
    pub host: HostRootArg,
    /// The bundle directory (a host path under --host-root; a relative path
    /// is taken from the current directory first).
    #[arg(long, value_name = "DIR")]
    pub bundle_dir: PathBuf,
    /// The kernel release the modules are built for, as `uname -r` prints it.
    #[arg(long, value_name = "RELEASE")]
    pub kernel: String,
    /// The driver version (what /sys/module/amdgpu/version will show).
    #[arg(long, value_name = "VERSION")]
    pub version: String,
}

#[derive(Args, Debug)]
pub struct DriverStatusArgs {
    #[command(flatten)]
    pub host: HostRootArg,
    #[arg(long, short, value_enum, default_value_t = OutputFormat::Table)]
    pub output: OutputFormat,
}

/// Whether modules must be signed, for `check`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum SignaturePolicy {
    /// Required when this host has Secure Boot on, or it cannot be told.
    Auto,
    /// Always required (the new kernel will boot with Secure Boot on).
    Required,
    /// Not checked.
    NotRequired,
}

#[derive(Args, Debug)]
pub struct DriverCheckArgs {
    #[command(flatten)]
    pub host: HostRootArg,
    /// The kernel release to check for, as `uname -r` prints it under that
    /// kernel (e.g. 6.8.0-51-generic). Default: the running kernel.
    #[arg(long, value_name = "RELEASE")]
    pub kernel: Option<String>,
    /// A bundle directory, or a directory of bundles (one per subdirectory).
    /// A host path, resolved under --host-root; a relative path is taken from
    /// the current directory first.
    #[arg(long, value_name = "DIR", default_value = DEFAULT_STORE)]
    pub bundle_dir: PathBuf,
    /// Only accept a bundle of this driver version (as in spec.driver.version).
    #[arg(long, value_name = "VERSION")]
    pub version: Option<String>,
    /// Whether modules must carry a signature.
    #[arg(long, value_enum, default_value_t = SignaturePolicy::Auto)]
    pub signatures: SignaturePolicy,
    #[arg(long, short, value_enum, default_value_t = OutputFormat::Table)]
    pub output: OutputFormat,
}

pub fn run(args: DriverArgs) -> ExitCode {
    match args.command {
        DriverCommand::Status(args) => run_status(args),
        DriverCommand::Check(args) => run_check(args),
        DriverCommand::Manifest(args) => run_manifest(args),
        DriverCommand::RebootHost => fail(crate::driver::reboot::reboot_host(), 1),
        DriverCommand::Import(args) => run_import(args),
        DriverCommand::Fetch(args) => run_fetch(args),
    }
}

/// Discovery's view of the module and the kernel's files, through a
/// deadline-bounded reader.
async fn report(host: &HostRoot) -> DriverReport {
    let reader = BoundedReader::new(host.clone(), 2);
    let scan = device::discover_bounded(&reader, Limits::default());
    read_report(&reader, &scan.inventory.driver).await
}

fn run_status(args: DriverStatusArgs) -> ExitCode {
    let host = match args.host.open() {
        Ok(host) => host,
        Err(message) => return fail(message, 2),
    };
    run_to_end(async move {
        let report = report(&host).await;
        match args.output {
            OutputFormat::Json => print_json(&report),
            OutputFormat::Table => print!("{}", status_text(&report)),
        }
        ExitCode::SUCCESS
    })
}

fn run_check(args: DriverCheckArgs) -> ExitCode {
    let host = match args.host.open() {
        Ok(host) => host,
        Err(message) => return fail(message, 2),
    };
    let Some(store) = host_path_text(&args.bundle_dir) else {
        return fail(
            format!(
                "--bundle-dir {}: not a UTF-8 path",
                args.bundle_dir.display()
            ),
            2,
        );
    };
    run_to_end(async move {
        let report = report(&host).await;
        let Some(kernel_release) = args.kernel.clone().or(report.kernel_release.clone()) else {
            return fail(
                "the running kernel cannot be read (/proc/sys/kernel/osrelease); pass --kernel",
                2,
            );
        };
        let expected = Expected {
            kernel_release,
            version: args.version.clone(),
            signature_required: match args.signatures {
                SignaturePolicy::Auto => report.secure_boot.requires_signature(),
                SignaturePolicy::Required => true,
                SignaturePolicy::NotRequired => false,
            },
        };
        // Hashing tens of MiB blocks: off the runtime's threads.
        let checked =
            tokio::task::spawn_blocking(move || preflight::preflight(&host, &store, &expected))
                .await;
        let answer = match checked {
            Ok(Ok(answer)) => answer,
            Ok(Err(refusal)) => return fail(refusal, 2),
            Err(e) => return fail(format!("the check did not finish: {e}"), 2),
        };
        match args.output {
            OutputFormat::Json => print_json(&answer),
            OutputFormat::Table => print!("{}", check_text(&answer, report.secure_boot)),
        }
        if answer.ok() {
            ExitCode::SUCCESS
        } else {
            ExitCode::from(1)
        }
    })
}

fn run_manifest(args: DriverManifestArgs) -> ExitCode {
    let host = match args.host.open() {
        Ok(host) => host,
        Err(message) => return fail(message, 2),
    };
    let Some(dir) = host_path_text(&args.bundle_dir) else {
        return fail(
            format!(
                "--bundle-dir {}: not a UTF-8 path",
                args.bundle_dir.display()
            ),
            2,
        );
    };
    if !host.exists(&dir) {
        return fail(format!("--bundle-dir {dir}: no such directory"), 2);
    }
    let manifest = match bundle::write_manifest(&host, &dir, &args.version, &args.kernel) {
        Ok(manifest) => manifest,
        Err(refusal) => return fail(refusal, 2),
    };
    println!(
        "wrote {dir}/{} listing {} files",
        bundle::MANIFEST,
        manifest.files.len()
    );
    let expected = Expected {
        kernel_release: args.kernel,
        version: Some(args.version),
        signature_required: false,
    };
    match bundle::verify(&host, &dir, &expected) {
        Ok(_) => ExitCode::SUCCESS,
        Err(refusal) => {
            println!("does not verify: {}: {refusal}", refusal.reason());
            ExitCode::from(1)
        }
    }
}

fn run_import(args: DriverImportArgs) -> ExitCode {
    let host = match args.host.open() {
        Ok(host) => host,
        Err(message) => return fail(message, 2),
    };
    let (Some(store), Some(staging)) =
        (host_path_text(&args.bundle_dir), host_path_text(&args.from))
    else {
        return fail("--bundle-dir and --from must be UTF-8 paths", 2);
    };
    let (kernel_release, version) = match (&args.image_tag, args.kernel, args.version) {
        (Some(tag), _, _) => match source::parse_image_tag(tag) {
            Ok(tag) => (tag.kernel_release, tag.version),
            Err(why) => return fail(why, 2),
        },
        (None, Some(kernel), Some(version)) => (kernel, version),
        // clap requires one or the other, whole.
        _ => return fail("give --image-tag, or --kernel and --version", 2),
    };
    let copied = format!(
        "{}/opt/lib/modules/{kernel_release}",
        staging.trim_end_matches('/')
    );
    if args.missing_ok && !host.exists(&copied) {
        println!("nothing to import: {copied} is not there (an image for another kernel)");
        return ExitCode::SUCCESS;
    }
    let import = source::ImageImport {
        staging,
        kernel_release,
        version,
        tag: args.image_tag,
        signature_required: args.signatures == NewBundleSignatures::Required,
        replace: args.replace,
        max_total_bytes: args.max_disk.saturating_mul(1 << 20),
        min_free_bytes: args.min_free.saturating_mul(1 << 20),
    };
    let result = source::import_image(&host, &store, &import);
    source_answer(result, args.output, "imported")
}

fn run_fetch(args: DriverFetchArgs) -> ExitCode {
    let host = match args.host.open() {
        Ok(host) => host,
        Err(message) => return fail(message, 2),
    };
    let Some(store) = host_path_text(&args.bundle_dir) else {
        return fail("--bundle-dir must be a UTF-8 path", 2);
    };
    // A URL is taken as it is; a path is made absolute, as --bundle-dir.
    let location = if args.source.contains("://") {
        args.source.clone()
    } else {
        match host_path_text(Path::new(&args.source)) {
            Some(path) => path,
            None => return fail("--source must be a UTF-8 path", 2),
        }
    };
    let tarball = source::TarballSource {
        source: location,
        sha256: args.sha256,
    };
    let options = source::FetchOptions {
        limits: source::FetchLimits {
            timeout: std::time::Duration::from_secs(args.timeout),
            max_total_bytes: args.max_disk.saturating_mul(1 << 20),
            min_free_bytes: args.min_free.saturating_mul(1 << 20),
            ..source::FetchLimits::default()
        },
        signature_required: args.signatures == NewBundleSignatures::Required,
        replace: args.replace,
    };
    let output = args.output;
    run_to_end(async move {
        let result = source::fetch_tarball(&host, &store, &tarball, &options).await;
        source_answer(result, output, "fetched")
    })
}

/// Prints what `import` or `fetch` did (`done` says what "added" was) and
/// gives its exit status: 0 in the store, 1 refused, 2 not usable.
fn source_answer(
    result: Result<source::Placed, source::SourceError>,
    output: OutputFormat,
    done: &str,
) -> ExitCode {
    match (result, output) {
        (Ok(placed), OutputFormat::Json) => {
            print_json(&placed);
            ExitCode::SUCCESS
        }
        (Ok(placed), OutputFormat::Table) => {
            print!("{}", placed_text(&placed, done));
            ExitCode::SUCCESS
        }
        (Err(e), OutputFormat::Json) if e.is_refusal() => {
            print_json(&serde_json::json!({
                "refused": {"reason": e.reason(), "message": e.to_string()}
            }));
            ExitCode::from(1)
        }
        (Err(e), OutputFormat::Table) if e.is_refusal() => {
            println!("refused: {}: {e}", e.reason());
            ExitCode::from(1)
        }
        (Err(e), _) => fail(format!("{}: {e}", e.reason()), 2),
    }
}

/// `import` or `fetch` for a person.
pub fn placed_text(placed: &source::Placed, done: &str) -> String {
    let what = format!(
        "driver {} for kernel {}",
        placed.version, placed.kernel_release
    );
    let detail = placed.verified.as_ref().map_or_else(
        || " (fetched before from a tarball of that sha256; not read again)".to_owned(),
        |v| {
            format!(
                ", {} files, {} MiB, module {}",
                v.files,
                v.bytes.div_ceil(1 << 20),
                v.module
            )
        },
    );
    match placed.placement {
        source::Placement::Added => format!("{done} {}: {what}{detail}\n", placed.dir),
        source::Placement::Replaced => {
            format!(
                "{done} {}, replacing another bundle: {what}{detail}\n",
                placed.dir
            )
        }
        source::Placement::AlreadyPresent => format!(
            "already present: {} holds {what}{detail}; nothing changed\n",
            placed.dir
        ),
    }
}

/// `--bundle-dir` as a host path: absolute, from the current directory when
/// relative.
fn host_path_text(path: &Path) -> Option<String> {
    let absolute = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
    absolute.to_str().map(str::to_owned)
}

fn print_json(value: &impl serde::Serialize) {
    println!(
        "{}",
        serde_json::to_string_pretty(value).unwrap_or_default()
    );
}

/// `driver status` for a person.
pub fn status_text(report: &DriverReport) -> String {
    let mut out = String::new();
    let or_unknown = |v: &Option<String>| v.clone().unwrap_or_else(|| "unknown".into());
    if report.loaded {
        let _ = writeln!(
            out,
            "amdgpu:      loaded, {:?}, version {}, srcversion {}",
            report.origin,
            report.version.as_deref().unwrap_or("none (in-box driver)"),
            report.srcversion.as_deref().unwrap_or("none"),
        );
        let _ = writeln!(
            out,
            "taint:       {}   refcnt: {}",
            report
                .taint
                .as_deref()
                .filter(|t| !t.is_empty())
                .unwrap_or("none"),
            report.refcnt.map_or("-".to_owned(), |n| n.to_string()),
        );
    } else {
        let _ = writeln!(out, "amdgpu:      not loaded");
    }
    let _ = writeln!(out, "kernel:      {}", or_unknown(&report.kernel_release));
    let _ = writeln!(out, "boot id:     {}", or_unknown(&report.boot_id));
    let _ = writeln!(out, "secure boot: {:?}", report.secure_boot);
    for problem in &report.problems {
        let _ = writeln!(out, "problem: {problem}");
    }
    out
}

/// `driver check` for a person: one line per bundle, then the verdict.
pub fn check_text(answer: &Preflight, secure_boot: SecureBoot) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "kernel {} (bundles in {}); signatures {} (Secure Boot here: {secure_boot:?})",
        answer.kernel_release,
        answer.store,
        if answer.signature_required {
            "required"
        } else {
            "not checked"
        },
    );
    for bundle in &answer.bundles {
        match (&bundle.verified, &bundle.refused) {
            (Some(v), _) => {
                let _ = writeln!(
                    out,
                    "ok       {}  driver {}, {} files, {} MiB, module {}",
                    bundle.dir,
                    v.version,
                    v.files,
                    v.bytes.div_ceil(1 << 20),
                    v.module
                );
            }
            (None, Some(refusal)) => {
                let _ = writeln!(
                    out,
                    "refused  {}  {}: {}",
                    bundle.dir,
                    refusal.0.reason(),
                    refusal.0
                );
            }
            (None, None) => {}
        }
    }
    match (answer.usable(), &answer.refused) {
        (Some(v), _) => {
            let _ = writeln!(
                out,
                "ready: driver {} can be loaded under kernel {}",
                v.version, answer.kernel_release
            );
        }
        (None, Some(refusal)) => {
            let _ = writeln!(
                out,
                "NOT READY: {}: {}; the driver would not load after booting {}",
                refusal.0.reason(),
                refusal.0,
                answer.kernel_release
            );
        }
        (None, None) => {}
    }
    out
}
