//! Driver bundles: one directory per driver version and kernel release, and
//! the checks that must pass before anything in one is loaded.
//!
//! A bundle (format in `docs/driver.md`):
//!
//! ```text
//! <bundle>/manifest.json
//! <bundle>/lib/modules/<kernel-release>/modules.dep   (depmod -b <bundle> output)
//! <bundle>/lib/modules/<kernel-release>/.../amdgpu.ko[.gz|.xz|.zst] and its deps
//! <bundle>/firmware/...
//! ```
//!
//! `manifest.json` is `{"version": "6.12.12", "kernelRelease": "6.8.0-49-generic",
//! "files": {"<relative path>": "<sha256, lowercase hex>", ...}}`.
//!
//! [`verify`] refuses a bundle, with a typed [`Refusal`], unless:
//! - the manifest is well formed and its kernel release is the one asked for
//!   (and its version, when one is asked for);
//! - every listed path is relative, plain (no `..`), under
//!   `lib/modules/<kernel-release>/` or `firmware/`, and resolves inside the
//!   bundle (no symbolic link out of it);
//! - every file under those two directories is listed: `modprobe` and the
//!   firmware loader would use an unlisted one unchecked;
//! - every file's sha256 matches, read in chunks with a size cap;
//! - `modules.dep` names an amdgpu module, and every module it depends on is
//!   in the bundle;
//! - when a signature is required (Secure Boot on or unknown), every module
//!   carries one.
//!
//! Signatures: `scripts/sign-file` appends the signature and ends the file
//! with `~Module signature appended~\n`. The kernel's `modules_install` signs
//! a module *before* compressing it (`scripts/Makefile.modinst`), as DKMS and
//! distributions' signing scripts do (decompress, sign, compress again), and
//! the kernel checks the signature on the decompressed image. So the trailer
//! of a compressed module is inside the compressed data, not at the end of
//! the file: a `.ko` is checked at its end as it is hashed, a `.ko.gz`,
//! `.ko.xz` or `.ko.zst` after decompressing it (streamed, capped); one that
//! does not decompress is [`Refusal::SignatureUncheckable`]. A trailer says
//! the module is signed, not by whom: the kernel still checks the key when it
//! loads it.
//!
//! This module reads through [`HostRoot`] (bundle paths are host paths) and
//! decides nothing about loading.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;

use serde::{Deserialize, Serialize};

use crate::host::{HostError, HostRoot};

/// The manifest's file name in a bundle.
pub const MANIFEST: &str = "manifest.json";
/// `sign-file`'s trailer at the end of a signed module.
pub const SIGNATURE_TRAILER: &[u8] = b"~Module signature appended~\n";
/// A manifest listing every amdgpu firmware file is a few hundred KiB.
pub const MAX_MANIFEST_BYTES: u64 = 4 * 1024 * 1024;
/// The biggest file a bundle may hold. An amdgpu module with its debug
/// information stripped is tens of MiB; firmware files are smaller.
pub const MAX_FILE_BYTES: u64 = 512 * 1024 * 1024;
/// The most files a bundle may list (amdgpu firmware is about a thousand).
pub const MAX_FILES: usize = 20_000;
/// `modules.dep` of a whole kernel is under 1 MiB.
pub(crate) const MAX_MODULES_DEP_BYTES: u64 = 16 * 1024 * 1024;

/// A bundle's manifest.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Manifest {
    /// The driver version (`/sys/module/amdgpu/version` once loaded).
    pub version: String,
    /// The kernel the modules are built for (`uname -r`).
    pub kernel_release: String,
    /// Every file of the bundle but the manifest: relative path to sha256.
    pub files: BTreeMap<String, String>,
}

/// What a bundle must be for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Expected {
    pub kernel_release: String,
    /// The driver version asked for; `None` accepts any.
    pub version: Option<String>,
    /// Modules must carry a signature (Secure Boot on, or not known).
    pub signature_required: bool,
}

/// A bundle that passed every check.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Verified {
    /// The bundle's directory, a host path.
    pub dir: String,
    pub version: String,
    pub kernel_release: String,
    /// The amdgpu module, relative to the bundle.
    pub module: String,
    pub files: usize,
    pub bytes: u64,
    /// Whether the modules' signatures were checked (and found).
    pub signatures_checked: bool,
}

/// Why a bundle is refused. The variant names are the reasons that the
/// `AMDGPUDriverReady=False` condition and Events carry ([`Refusal::reason`]).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("no driver bundle for kernel {kernel_release} in {searched}")]
    BundleMissingForKernel {
        kernel_release: String,
        searched: String,
    },
    #[error("{dir}: bundle is for kernel {bundle}, not {wanted}")]
    KernelMismatch {
        dir: String,
        bundle: String,
        wanted: String,
    },
    #[error("{dir}: bundle has driver {bundle}, not {wanted}")]
    VersionMismatch {
        dir: String,
        bundle: String,
        wanted: String,
    },
    #[error("{dir}: {why}")]
    ManifestInvalid { dir: String, why: String },
    #[error("{path}: outside the bundle ({why})")]
    PathEscapesBundle { path: String, why: String },
    #[error("{path}: in the bundle but not in its manifest")]
    UnlistedFile { path: String },
    #[error("{path}: listed in the manifest but missing")]
    FileMissing { path: String },
    #[error("{path}: sha256 is {actual}, the manifest says {expected}")]
    ChecksumMismatch {
        path: String,
        expected: String,
        actual: String,
    },
    #[error("{dir}: {why}")]
    ModuleMissing { dir: String, why: String },
    #[error("{module}: needs {dependency}, which the bundle does not hold")]
    DependencyMissing { module: String, dependency: String },
    #[error("{path}: not signed, and Secure Boot requires signed modules")]
    UnsignedModule { path: String },
    #[error("{path}: its signature cannot be checked: {why}")]
    SignatureUncheckable { path: String, why: String },
    #[error("{tarball}: {why}")]
    UnsafeTarball { tarball: String, why: String },
    #[error("{0}")]
    Unreadable(String),
}

impl Refusal {
    /// The reason, as the condition and Events name it.
    pub fn reason(&self) -> &'static str {
        match self {
            Refusal::BundleMissingForKernel { .. } => "BundleMissingForKernel",
            Refusal::KernelMismatch { .. } => "KernelMismatch",
            Refusal::VersionMismatch { .. } => "VersionMismatch",
            Refusal::ManifestInvalid { .. } => "ManifestInvalid",
            Refusal::PathEscapesBundle { .. } => "PathEscapesBundle",
            Refusal::UnlistedFile { .. } => "UnlistedFile",
            Refusal::FileMissing { .. } => "FileMissing",
            Refusal::ChecksumMismatch { .. } => "ChecksumMismatch",
            Refusal::ModuleMissing { .. } => "ModuleMissing",
            Refusal::DependencyMissing { .. } => "DependencyMissing",
            Refusal::UnsignedModule { .. } => "UnsignedModule",
            Refusal::SignatureUncheckable { .. } => "SignatureUncheckable",
            Refusal::UnsafeTarball { .. } => "UnsafeTarball",
            Refusal::Unreadable(_) => "BundleUnreadable",
        }
    }
}

fn unreadable(e: HostError) -> Refusal {
    Refusal::Unreadable(e.to_string())
}

/// The bundle directory `dir`'s host path joined with a relative path.
fn join(dir: &str, relative: &str) -> String {
    format!("{}/{relative}", dir.trim_end_matches('/'))
}

/// Reads and parses `<dir>/manifest.json`.
pub fn read_manifest(host: &HostRoot, dir: &str) -> Result<Manifest, Refusal> {
    let path = join(dir, MANIFEST);
    let mut bytes = Vec::new();
    host.read_chunks(&path, MAX_MANIFEST_BYTES, |c| bytes.extend_from_slice(c))
        .map_err(|e| Refusal::ManifestInvalid {
            dir: dir.to_owned(),
            why: e.to_string(),
        })?;
    parse_manifest(dir, &bytes)
}

/// Parses a manifest and checks its shape (not the files). Pure.
pub fn parse_manifest(dir: &str, bytes: &[u8]) -> Result<Manifest, Refusal> {
    let invalid = |why: String| Refusal::ManifestInvalid {
        dir: dir.to_owned(),
        why,
    };
    let manifest: Manifest =
        serde_json::from_slice(bytes).map_err(|e| invalid(format!("{MANIFEST}: {e}")))?;
    if manifest.version.trim().is_empty() {
        return Err(invalid("manifest has an empty version".into()));
    }
    if !is_plain_name(&manifest.kernel_release) {
        return Err(invalid(format!(
            "kernelRelease {:?} is not a kernel release",
            manifest.kernel_release
        )));
    }
    if manifest.files.len() > MAX_FILES {
        return Err(invalid(format!(
            "{} files listed, more than the {MAX_FILES} allowed",
            manifest.files.len()
        )));
    }
    for (path, sha) in &manifest.files {
        if !is_sha256_hex(sha) {
            return Err(invalid(format!(
                "{path}: {sha:?} is not a sha256 in lowercase hex"
            )));
        }
    }
    Ok(manifest)
}

/// One path component a kernel release or file name may be: no separator,
/// not `.` or `..`, not empty.
pub(crate) fn is_plain_name(name: &str) -> bool {
    !name.is_empty() && name != "." && name != ".." && !name.contains('/') && !name.contains('\0')
}

pub(crate) fn is_sha256_hex(text: &str) -> bool {
    text.len() == 64
        && text
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// Why a manifest path may not be used, if it may not. Pure.
pub fn path_problem(path: &str, kernel_release: &str) -> Option<String> {
    if path.starts_with('/') {
        return Some("absolute path".into());
    }
    let parts: Vec<&str> = path.split('/').collect();
    if parts.iter().any(|p| !is_plain_name(p)) {
        return Some("empty, `.` or `..` component".into());
    }
    let under_modules = parts.len() > 3 && parts[..3] == ["lib", "modules", kernel_release];
    let under_firmware = parts.len() > 1 && parts[0] == "firmware";
    if !(under_modules || under_firmware) {
        return Some(format!(
            "not under lib/modules/{kernel_release}/ or firmware/"
        ));
    }
    None
}

/// Whether a file name is a kernel module, and how it is compressed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ModuleFile {
    Plain,
    Gzip,
    Xz,
    Zstd,
}

impl ModuleFile {
    /// The module kind of a path, or `None` when it is not a module.
    pub fn of(path: &str) -> Option<ModuleFile> {
        let name = path.rsplit('/').next().unwrap_or(path);
        if name.ends_with(".ko") {
            Some(ModuleFile::Plain)
        } else if name.ends_with(".ko.gz") {
            Some(ModuleFile::Gzip)
        } else if name.ends_with(".ko.xz") {
            Some(ModuleFile::Xz)
        } else if name.ends_with(".ko.zst") {
            Some(ModuleFile::Zstd)
        } else {
            None
        }
    }

    /// The module's name, as modprobe takes it (`-` and `_` are the same to
    /// the kernel; this keeps the file's spelling).
    pub fn module_name(path: &str) -> Option<&str> {
        let name = path.rsplit('/').next().unwrap_or(path);
        [".ko", ".ko.gz", ".ko.xz", ".ko.zst"]
            .iter()
            .find_map(|suffix| name.strip_suffix(suffix))
    }
}

/// The amdgpu module and its dependencies, from `modules.dep` (paths
/// relative to `lib/modules/<kernel-release>/`, as depmod writes them; an
/// absolute path of older depmods is made relative). Pure.
pub fn amdgpu_in_modules_dep(text: &str, kernel_release: &str) -> Option<(String, Vec<String>)> {
    let prefix = format!("/lib/modules/{kernel_release}/");
    let relative = |p: &str| p.strip_prefix(&prefix).unwrap_or(p).to_owned();
    text.lines().find_map(|line| {
        let (module, deps) = line.split_once(':')?;
        let module = module.trim();
        let name = ModuleFile::module_name(module)?;
        (name == "amdgpu").then(|| {
            (
                relative(module),
                deps.split_whitespace().map(relative).collect(),
            )
        })
    })
}

/// Ends with [`SIGNATURE_TRAILER`]. Keeps the last bytes of a stream.
#[derive(Default)]
struct Tail(Vec<u8>);

impl Tail {
    fn push(&mut self, chunk: &[u8]) {
        let keep = SIGNATURE_TRAILER.len();
        if chunk.len() >= keep {
            self.0.clear();
            self.0.extend_from_slice(&chunk[chunk.len() - keep..]);
        } else {
            self.0.extend_from_slice(chunk);
            let excess = self.0.len().saturating_sub(keep);
            self.0.drain(..excess);
        }
    }

    fn signed(&self) -> bool {
        self.0 == SIGNATURE_TRAILER
    }
}

/// A file's sha256 (lowercase hex), its size, and whether it ends with the
/// signature trailer, in one capped read.
fn hash_file(host: &HostRoot, path: &str) -> Result<(String, u64, bool), HostError> {
    let mut context = ring::digest::Context::new(&ring::digest::SHA256);
    let mut tail = Tail::default();
    let size = host.read_chunks(path, MAX_FILE_BYTES, |chunk| {
        context.update(chunk);
        tail.push(chunk);
    })?;
    let digest = context.finish();
    let hex = digest.as_ref().iter().map(|b| format!("{b:02x}")).collect();
    Ok((hex, size, tail.signed()))
}

/// Where a decompressed module goes: only its last bytes are kept, and more
/// than [`MAX_FILE_BYTES`] is an error.
#[derive(Default)]
struct TailSink {
    tail: Tail,
    total: u64,
}

impl Write for TailSink {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.total += buf.len() as u64;
        if self.total > MAX_FILE_BYTES {
            return Err(std::io::Error::other(format!(
                "decompresses to more than {MAX_FILE_BYTES} bytes"
            )));
        }
        self.tail.push(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Whether a compressed module's decompressed image ends with the trailer.
/// Streamed, both sides capped: neither image is held in memory.
fn compressed_module_signed(
    host: &HostRoot,
    path: &str,
    kind: ModuleFile,
) -> Result<bool, Refusal> {
    let file = host.open_capped(path, MAX_FILE_BYTES).map_err(unreadable)?;
    let mut input = std::io::BufReader::new(file);
    let mut sink = TailSink::default();
    let decompressed: Result<(), String> = match kind {
        ModuleFile::Plain => return Err(Refusal::Unreadable(format!("{path}: not compressed"))),
        ModuleFile::Gzip => std::io::copy(&mut flate2::bufread::GzDecoder::new(input), &mut sink)
            .map(drop)
            .map_err(|e| format!("gzip: {e}")),
        ModuleFile::Xz => {
            lzma_rs::xz_decompress(&mut input, &mut sink).map_err(|e| format!("xz: {e}"))
        }
        ModuleFile::Zstd => match ruzstd::decoding::StreamingDecoder::new(input) {
            Ok(mut decoder) => std::io::copy(&mut decoder, &mut sink)
                .map(drop)
                .map_err(|e| format!("zstd: {e}")),
            Err(e) => Err(format!("zstd: {e}")),
        },
    };
    decompressed.map_err(|why| Refusal::SignatureUncheckable {
        path: path.to_owned(),
        why,
    })?;
    Ok(sink.tail.signed())
}

/// Every file under `dir` (a host path), relative to `base`, walking at most
/// `MAX_FILES + 1` entries. Symbolic links are listed, not followed.
fn walk(host: &HostRoot, base: &str, dir: &str, out: &mut Vec<String>) -> Result<(), Refusal> {
    let names = match host.list_dir(dir) {
        Ok(names) => names,
        Err(e) if e.is_not_found() => return Ok(()),
        Err(e) => return Err(unreadable(e)),
    };
    for name in names {
        if out.len() > MAX_FILES {
            return Ok(());
        }
        let path = format!("{dir}/{name}");
        let meta = std::fs::symlink_metadata(host.path(&path))
            .map_err(|e| Refusal::Unreadable(format!("{}: {e}", host.path(&path).display())))?;
        if meta.is_dir() {
            walk(host, base, &path, out)?;
        } else {
            let relative = path
                .strip_prefix(base)
                .unwrap_or(&path)
                .trim_start_matches('/');
            out.push(relative.to_owned());
        }
    }
    Ok(())
}

/// Checks the bundle in `dir` (a host path) against `expected`; see the
/// module doc for what is checked, in that order.
pub fn verify(host: &HostRoot, dir: &str, expected: &Expected) -> Result<Verified, Refusal> {
    if !host.exists(dir) {
        return Err(Refusal::BundleMissingForKernel {
            kernel_release: expected.kernel_release.clone(),
            searched: dir.to_owned(),
        });
    }
    let manifest = read_manifest(host, dir)?;
    check_identity(dir, &manifest, expected)?;
    check_listing(host, dir, &manifest)?;
    let (bytes, signed) = check_contents(host, dir, &manifest)?;
    let module = check_modules(host, dir, &manifest)?;
    if expected.signature_required {
        check_signatures(host, dir, &manifest, &signed)?;
    }
    Ok(Verified {
        dir: dir.to_owned(),
        version: manifest.version,
        module: format!("lib/modules/{}/{module}", manifest.kernel_release),
        kernel_release: manifest.kernel_release,
        files: manifest.files.len(),
        bytes,
        signatures_checked: expected.signature_required,
    })
}

/// The manifest is for the kernel (and version) asked for.
fn check_identity(dir: &str, manifest: &Manifest, expected: &Expected) -> Result<(), Refusal> {
    if manifest.kernel_release != expected.kernel_release {
        return Err(Refusal::KernelMismatch {
            dir: dir.to_owned(),
            bundle: manifest.kernel_release.clone(),
            wanted: expected.kernel_release.clone(),
        });
    }
    match &expected.version {
        Some(wanted) if &manifest.version != wanted => Err(Refusal::VersionMismatch {
            dir: dir.to_owned(),
            bundle: manifest.version.clone(),
            wanted: wanted.clone(),
        }),
        _ => Ok(()),
    }
}

/// Every file under `lib/modules/<kernel_release>/` and `firmware/` of the
/// bundle in `dir`, relative to it.
fn bundle_files(host: &HostRoot, dir: &str, kernel_release: &str) -> Result<Vec<String>, Refusal> {
    let mut present = Vec::new();
    for top in [
        format!("lib/modules/{kernel_release}"),
        "firmware".to_owned(),
    ] {
        walk(host, dir, &join(dir, &top), &mut present)?;
    }
    if present.len() > MAX_FILES {
        return Err(Refusal::ManifestInvalid {
            dir: dir.to_owned(),
            why: format!("the bundle holds more than {MAX_FILES} files"),
        });
    }
    Ok(present)
}

/// Listed paths are plain and inside, and every file modprobe or the
/// firmware loader could use is listed.
fn check_listing(host: &HostRoot, dir: &str, manifest: &Manifest) -> Result<(), Refusal> {
    for path in manifest.files.keys() {
        if let Some(why) = path_problem(path, &manifest.kernel_release) {
            return Err(Refusal::PathEscapesBundle {
                path: path.clone(),
                why,
            });
        }
    }
    let present = bundle_files(host, dir, &manifest.kernel_release)?;
    match present.iter().find(|p| !manifest.files.contains_key(*p)) {
        Some(unlisted) => Err(Refusal::UnlistedFile {
            path: join(dir, unlisted),
        }),
        None => Ok(()),
    }
}

/// Every listed file resolves inside the bundle and has its sha256. Returns
/// the bytes read and the uncompressed modules that end with a signature.
fn check_contents(
    host: &HostRoot,
    dir: &str,
    manifest: &Manifest,
) -> Result<(u64, BTreeSet<String>), Refusal> {
    let mut bytes = 0u64;
    let mut signed = BTreeSet::new();
    for (path, expected_sha) in &manifest.files {
        let host_path = join(dir, path);
        match host.resolves_within(dir, &host_path) {
            Ok(true) => {}
            Ok(false) => {
                return Err(Refusal::PathEscapesBundle {
                    path: host_path,
                    why: "a symbolic link points out of the bundle".into(),
                });
            }
            Err(e) if e.is_not_found() => return Err(Refusal::FileMissing { path: host_path }),
            Err(e) => return Err(unreadable(e)),
        }
        let (actual, size, has_trailer) = hash_file(host, &host_path).map_err(unreadable)?;
        if &actual != expected_sha {
            return Err(Refusal::ChecksumMismatch {
                path: host_path,
                expected: expected_sha.clone(),
                actual,
            });
        }
        bytes += size;
        if has_trailer {
            signed.insert(path.clone());
        }
    }
    Ok((bytes, signed))
}

/// `modules.dep` names an amdgpu module the bundle holds, and all it
/// depends on. Returns the module's path relative to the modules directory.
fn check_modules(host: &HostRoot, dir: &str, manifest: &Manifest) -> Result<String, Refusal> {
    let kernel = &manifest.kernel_release;
    let missing = |why: String| Refusal::ModuleMissing {
        dir: dir.to_owned(),
        why,
    };
    let modules_dep = format!("lib/modules/{kernel}/modules.dep");
    if !manifest.files.contains_key(&modules_dep) {
        return Err(missing(format!(
            "no {modules_dep} (run depmod -b <bundle> {kernel})"
        )));
    }
    let mut dep_text = Vec::new();
    host.read_chunks(join(dir, &modules_dep), MAX_MODULES_DEP_BYTES, |c| {
        dep_text.extend_from_slice(c)
    })
    .map_err(unreadable)?;
    let dep_text = String::from_utf8_lossy(&dep_text);
    let Some((module, deps)) = amdgpu_in_modules_dep(&dep_text, kernel) else {
        return Err(missing(format!("{modules_dep} names no amdgpu module")));
    };
    let in_bundle = |relative: &str| {
        manifest
            .files
            .contains_key(&format!("lib/modules/{kernel}/{relative}"))
    };
    if !in_bundle(&module) {
        return Err(missing(format!(
            "{modules_dep} names {module}, which the bundle does not hold"
        )));
    }
    if let Some(dependency) = deps.iter().find(|d| !in_bundle(d)) {
        return Err(Refusal::DependencyMissing {
            module,
            dependency: dependency.clone(),
        });
    }
    Ok(module)
}

/// Every module carries a signature: `signed` holds the uncompressed ones
/// that do (found as they were hashed); compressed ones are decompressed.
fn check_signatures(
    host: &HostRoot,
    dir: &str,
    manifest: &Manifest,
    signed: &BTreeSet<String>,
) -> Result<(), Refusal> {
    for path in manifest.files.keys() {
        let host_path = join(dir, path);
        let is_signed = match ModuleFile::of(path) {
            None => continue,
            Some(ModuleFile::Plain) => signed.contains(path),
            Some(kind) => compressed_module_signed(host, &host_path, kind)?,
        };
        if !is_signed {
            return Err(Refusal::UnsignedModule { path: host_path });
        }
    }
    Ok(())
}

/// Writes `<dir>/manifest.json` for the files now under
/// `lib/modules/<kernel_release>/` and `firmware/` of `dir` (a host path),
/// as a bundle's producer does once the tree is complete (after depmod).
/// It lists what is there; [`verify`] says whether that makes a bundle.
pub fn write_manifest(
    host: &HostRoot,
    dir: &str,
    version: &str,
    kernel_release: &str,
) -> Result<Manifest, Refusal> {
    if !is_plain_name(kernel_release) || version.trim().is_empty() {
        return Err(Refusal::ManifestInvalid {
            dir: dir.to_owned(),
            why: format!("kernel {kernel_release:?} and version {version:?} must be plain names"),
        });
    }
    let mut files = BTreeMap::new();
    for path in bundle_files(host, dir, kernel_release)? {
        let (sha, _, _) = hash_file(host, &join(dir, &path)).map_err(unreadable)?;
        files.insert(path, sha);
    }
    let manifest = Manifest {
        version: version.to_owned(),
        kernel_release: kernel_release.to_owned(),
        files,
    };
    let json = serde_json::to_vec_pretty(&manifest)
        .map_err(|e| Refusal::Unreadable(format!("cannot encode the manifest: {e}")))?;
    host.write(join(dir, MANIFEST), json).map_err(unreadable)?;
    Ok(manifest)
}

/// The bundles for `kernel_release` in `store` (a host path): `store`
/// itself when it holds a manifest, else each directory in it whose
/// manifest names that kernel. A directory whose manifest cannot be read is
/// listed too, so that verifying it says why; one for another kernel is not.
/// Names that start with `.` are skipped: imports and fetches build their
/// bundles in such directories and rename them into place only once they
/// verify, so that nobody loads a half-written bundle.
pub fn find(host: &HostRoot, store: &str, kernel_release: &str) -> Result<Vec<String>, Refusal> {
    if host.exists(join(store, MANIFEST)) {
        return Ok(vec![store.to_owned()]);
    }
    let names = match host.list_dir(store) {
        Ok(names) => names,
        Err(e) if e.is_not_found() => Vec::new(),
        Err(e) => return Err(unreadable(e)),
    };
    let mut found = Vec::new();
    for name in names.into_iter().filter(|n| !n.starts_with('.')) {
        let dir = join(store, &name);
        if !host.exists(join(&dir, MANIFEST)) {
            continue;
        }
        match read_manifest(host, &dir) {
            Ok(m) if m.kernel_release != kernel_release => {}
            _ => found.push(dir),
        }
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    const KERNEL: &str = "6.8.0-49-generic";
    const DIR: &str = "/var/lib/gpu-operator/drivers/6.12.12-6.8.0-49-generic";

    fn module_bytes(name: &str, signed: bool) -> Vec<u8> {
        let mut bytes = format!("\x7fELF {name} module body").into_bytes();
        if signed {
            bytes.extend_from_slice(b"PKCS7-blob\0\0\0\x02");
            bytes.extend_from_slice(SIGNATURE_TRAILER);
        }
        bytes
    }

    fn gzip(bytes: &[u8]) -> Vec<u8> {
        let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        encoder.write_all(bytes).unwrap();
        encoder.finish().unwrap()
    }

    /// A complete bundle with a plain, signed amdgpu at `dir`.
    fn write_bundle_at(host: &HostRoot, dir: &str) {
        let modules = format!("{dir}/lib/modules/{KERNEL}");
        host.write(format!("{modules}/amdgpu.ko"), module_bytes("amdgpu", true))
            .unwrap();
        host.write(format!("{modules}/modules.dep"), "amdgpu.ko:\n")
            .unwrap();
        write_manifest(host, dir, "6.12.12", KERNEL).unwrap();
    }

    /// A bundle with amdgpu, one dependency and a firmware file, its
    /// manifest written; `amdgpu` is the module file's name and bytes.
    fn write_bundle(host: &HostRoot, amdgpu: (&str, Vec<u8>)) {
        let modules = format!("{DIR}/lib/modules/{KERNEL}");
        let (name, bytes) = amdgpu;
        host.write(format!("{modules}/updates/dkms/{name}"), bytes)
            .unwrap();
        host.write(
            format!("{modules}/updates/dkms/amdttm.ko"),
            module_bytes("amdttm", true),
        )
        .unwrap();
        host.write(
            format!("{modules}/modules.dep"),
            format!("updates/dkms/{name}: updates/dkms/amdttm.ko\nupdates/dkms/amdttm.ko:\n"),
        )
        .unwrap();
        host.write(format!("{DIR}/firmware/amdgpu/gc_9_4_3_mec.bin"), "fw")
            .unwrap();
        write_manifest(host, DIR, "6.12.12", KERNEL).unwrap();
    }

    fn expected(signature_required: bool) -> Expected {
        Expected {
            kernel_release: KERNEL.into(),
            version: None,
            signature_required,
        }
    }

    fn setup(amdgpu: (&str, Vec<u8>)) -> (tempfile::TempDir, HostRoot) {
        let dir = tempfile::tempdir().unwrap();
        let host = HostRoot::new(dir.path());
        write_bundle(&host, amdgpu);
        (dir, host)
    }

    fn reason(result: Result<Verified, Refusal>) -> &'static str {
        match result {
            Ok(v) => panic!("verified {v:?}"),
            Err(refusal) => refusal.reason(),
        }
    }

    #[test]
    fn sha256_is_the_standard_one() {
        let dir = tempfile::tempdir().unwrap();
        let host = HostRoot::new(dir.path());
        host.write("/abc", "abc").unwrap();
        let (sha, size, signed) = hash_file(&host, "/abc").unwrap();
        assert_eq!(
            sha,
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert_eq!((size, signed), (3, false));
    }

    #[test]
    fn the_trailer_is_found_across_chunk_boundaries() {
        let body = module_bytes("amdgpu", true);
        for split in [0, 1, body.len() - 20, body.len() - 1, body.len()] {
            let mut tail = Tail::default();
            tail.push(&body[..split]);
            tail.push(&body[split..]);
            assert!(tail.signed(), "split at {split}");
        }
        let mut tail = Tail::default();
        for byte in module_bytes("amdgpu", false) {
            tail.push(&[byte]);
        }
        assert!(!tail.signed());
    }

    #[test]
    fn a_complete_bundle_verifies_with_and_without_secure_boot() {
        let (_dir, host) = setup(("amdgpu.ko", module_bytes("amdgpu", true)));
        for required in [false, true] {
            let verified = verify(&host, DIR, &expected(required)).unwrap();
            assert_eq!(verified.version, "6.12.12");
            assert_eq!(
                verified.module,
                format!("lib/modules/{KERNEL}/updates/dkms/amdgpu.ko")
            );
            assert_eq!(verified.files, 4);
            assert_eq!(verified.signatures_checked, required);
        }
        let wanted = Expected {
            version: Some("6.12.12".into()),
            ..expected(true)
        };
        assert!(verify(&host, DIR, &wanted).is_ok());
    }

    #[test]
    fn wrong_kernel_version_or_no_bundle_is_refused() {
        let (_dir, host) = setup(("amdgpu.ko", module_bytes("amdgpu", true)));
        let other_kernel = Expected {
            kernel_release: "6.11.0-1-generic".into(),
            ..expected(false)
        };
        assert_eq!(reason(verify(&host, DIR, &other_kernel)), "KernelMismatch");
        let other_version = Expected {
            version: Some("6.14.0".into()),
            ..expected(false)
        };
        assert_eq!(
            reason(verify(&host, DIR, &other_version)),
            "VersionMismatch"
        );
        assert_eq!(
            reason(verify(&host, "/nowhere", &expected(false))),
            "BundleMissingForKernel"
        );
    }

    #[test]
    fn a_changed_file_is_a_checksum_mismatch() {
        let (_dir, host) = setup(("amdgpu.ko", module_bytes("amdgpu", true)));
        host.write(format!("{DIR}/firmware/amdgpu/gc_9_4_3_mec.bin"), "fx")
            .unwrap();
        let refusal = verify(&host, DIR, &expected(false)).unwrap_err();
        assert_eq!(refusal.reason(), "ChecksumMismatch");
        assert!(
            refusal.to_string().contains("gc_9_4_3_mec.bin"),
            "{refusal}"
        );
    }

    #[test]
    fn unsigned_modules_are_refused_only_when_a_signature_is_required() {
        let (_dir, host) = setup(("amdgpu.ko", module_bytes("amdgpu", false)));
        assert!(verify(&host, DIR, &expected(false)).is_ok());
        let refusal = verify(&host, DIR, &expected(true)).unwrap_err();
        assert_eq!(refusal.reason(), "UnsignedModule");
        assert!(refusal.to_string().contains("amdgpu.ko"), "{refusal}");
    }

    #[test]
    fn compressed_modules_are_checked_inside_their_compressed_image() {
        type Compress = fn(&[u8]) -> Vec<u8>;
        let xz: Compress = |bytes| {
            let mut out = Vec::new();
            lzma_rs::xz_compress(&mut &bytes[..], &mut out).unwrap();
            out
        };
        let zstd: Compress = |bytes| {
            let mut out = Vec::new();
            ruzstd::encoding::compress(
                bytes,
                &mut out,
                ruzstd::encoding::CompressionLevel::Fastest,
            );
            out
        };
        for (name, compress) in [
            ("amdgpu.ko.gz", gzip as Compress),
            ("amdgpu.ko.xz", xz),
            ("amdgpu.ko.zst", zstd),
        ] {
            // Signed, then compressed, as modules_install does: the file
            // itself does not end with the trailer.
            let signed = compress(&module_bytes("amdgpu", true));
            assert!(!signed.ends_with(SIGNATURE_TRAILER), "{name}");
            let (_dir, host) = setup((name, signed));
            let verified = verify(&host, DIR, &expected(true));
            assert!(verified.is_ok(), "{name}: {verified:?}");

            let unsigned = compress(&module_bytes("amdgpu", false));
            let (_dir, host) = setup((name, unsigned));
            assert!(verify(&host, DIR, &expected(false)).is_ok(), "{name}");
            assert_eq!(
                reason(verify(&host, DIR, &expected(true))),
                "UnsignedModule",
                "{name}"
            );

            let (_dir, host) = setup((name, b"not compressed at all".to_vec()));
            let refusal = verify(&host, DIR, &expected(true)).unwrap_err();
            assert_eq!(refusal.reason(), "SignatureUncheckable", "{refusal}");
        }
    }

    #[test]
    fn paths_must_stay_inside_the_bundle() {
        for (path, ok) in [
            (format!("lib/modules/{KERNEL}/updates/amdgpu.ko"), true),
            ("firmware/amdgpu/x.bin".to_owned(), true),
            ("/etc/passwd".to_owned(), false),
            ("firmware/../../etc/passwd".to_owned(), false),
            ("firmware//x.bin".to_owned(), false),
            ("firmware/./x.bin".to_owned(), false),
            ("lib/modules/6.1.0/amdgpu.ko".to_owned(), false),
            (format!("lib/modules/{KERNEL}"), false),
            ("etc/modprobe.d/x.conf".to_owned(), false),
            ("firmware".to_owned(), false),
        ] {
            assert_eq!(path_problem(&path, KERNEL).is_none(), ok, "{path}");
        }

        let (_dir, host) = setup(("amdgpu.ko", module_bytes("amdgpu", true)));
        let mut manifest = read_manifest(&host, DIR).unwrap();
        manifest
            .files
            .insert("firmware/../../../etc/shadow".into(), "0".repeat(64));
        host.write(
            format!("{DIR}/{MANIFEST}"),
            serde_json::to_vec(&manifest).unwrap(),
        )
        .unwrap();
        assert_eq!(
            reason(verify(&host, DIR, &expected(false))),
            "PathEscapesBundle"
        );

        // A listed firmware file that is a link out of the bundle.
        let (_dir, host) = setup(("amdgpu.ko", module_bytes("amdgpu", true)));
        host.write("/etc/secret", "fw").unwrap();
        host.remove_all(format!("{DIR}/firmware/amdgpu/gc_9_4_3_mec.bin"))
            .unwrap();
        host.symlink(
            "/etc/secret",
            format!("{DIR}/firmware/amdgpu/gc_9_4_3_mec.bin"),
        )
        .unwrap();
        let refusal = verify(&host, DIR, &expected(false)).unwrap_err();
        assert_eq!(refusal.reason(), "PathEscapesBundle", "{refusal}");
        assert!(refusal.to_string().contains("symbolic link"), "{refusal}");
    }

    #[test]
    fn unlisted_or_missing_files_and_missing_modules_are_refused() {
        let (_dir, host) = setup(("amdgpu.ko", module_bytes("amdgpu", true)));
        host.write(format!("{DIR}/lib/modules/{KERNEL}/extra/evil.ko"), "x")
            .unwrap();
        let refusal = verify(&host, DIR, &expected(false)).unwrap_err();
        assert_eq!(refusal.reason(), "UnlistedFile");
        assert!(refusal.to_string().contains("evil.ko"), "{refusal}");

        let (_dir, host) = setup(("amdgpu.ko", module_bytes("amdgpu", true)));
        host.remove_all(format!("{DIR}/firmware/amdgpu/gc_9_4_3_mec.bin"))
            .unwrap();
        assert_eq!(reason(verify(&host, DIR, &expected(false))), "FileMissing");

        // modules.dep names a dependency the bundle does not hold.
        let (_dir, host) = setup(("amdgpu.ko", module_bytes("amdgpu", true)));
        host.write(
            format!("{DIR}/lib/modules/{KERNEL}/modules.dep"),
            "updates/dkms/amdgpu.ko: updates/dkms/amdttm.ko kernel/drm/amdxcp.ko\n",
        )
        .unwrap();
        write_manifest(&host, DIR, "6.12.12", KERNEL).unwrap();
        let refusal = verify(&host, DIR, &expected(false)).unwrap_err();
        assert_eq!(refusal.reason(), "DependencyMissing");
        assert!(refusal.to_string().contains("amdxcp.ko"), "{refusal}");

        // No amdgpu in modules.dep.
        host.write(
            format!("{DIR}/lib/modules/{KERNEL}/modules.dep"),
            "updates/dkms/amdttm.ko:\n",
        )
        .unwrap();
        write_manifest(&host, DIR, "6.12.12", KERNEL).unwrap();
        assert_eq!(
            reason(verify(&host, DIR, &expected(false))),
            "ModuleMissing"
        );
    }

    #[test]
    fn manifests_are_written_only_for_plain_kernel_releases() {
        let (_dir, host) = setup(("amdgpu.ko", module_bytes("amdgpu", true)));
        for kernel in ["../../etc", "", "a/b"] {
            let refusal = write_manifest(&host, DIR, "6.12.12", kernel).unwrap_err();
            assert_eq!(refusal.reason(), "ManifestInvalid", "{kernel:?}");
        }
        assert!(write_manifest(&host, DIR, " ", KERNEL).is_err());
        let manifest = write_manifest(&host, DIR, "6.12.12", KERNEL).unwrap();
        assert_eq!(manifest, read_manifest(&host, DIR).unwrap());
    }

    #[test]
    fn malformed_manifests_are_invalid() {
        for bad in [
            &b"not json"[..],
            br#"{"version":"1","kernelRelease":"6.8.0","files":{"firmware/a":"ABC"}}"#,
            br#"{"version":"","kernelRelease":"6.8.0","files":{}}"#,
            br#"{"version":"1","kernelRelease":"../x","files":{}}"#,
            br#"{"version":"1","kernelRelease":"6.8.0","files":{},"extra":1}"#,
        ] {
            let refusal = parse_manifest("/b", bad).unwrap_err();
            assert_eq!(refusal.reason(), "ManifestInvalid", "{refusal}");
        }
        let dir = tempfile::tempdir().unwrap();
        let host = HostRoot::new(dir.path());
        host.create_dir_all("/b").unwrap();
        assert_eq!(
            reason(verify(&host, "/b", &expected(false))),
            "ManifestInvalid"
        );
    }

    #[test]
    fn modules_dep_lines_give_amdgpu_and_its_dependencies() {
        let text = format!(
            "kernel/drivers/gpu/drm/drm.ko.zst:\n\
             /lib/modules/{KERNEL}/updates/amdgpu.ko.xz: updates/amdttm.ko.xz kernel/drm.ko.zst\n"
        );
        let (module, deps) = amdgpu_in_modules_dep(&text, KERNEL).unwrap();
        assert_eq!(module, "updates/amdgpu.ko.xz");
        assert_eq!(deps, ["updates/amdttm.ko.xz", "kernel/drm.ko.zst"]);
        assert_eq!(amdgpu_in_modules_dep("amdgpu_x.ko:\n", KERNEL), None);
    }

    #[test]
    fn a_store_yields_the_bundles_for_one_kernel() {
        let (_dir, host) = setup(("amdgpu.ko", module_bytes("amdgpu", true)));
        let store = "/var/lib/gpu-operator/drivers";
        let other = format!("{store}/6.12.12-6.11.0");
        host.write(format!("{other}/firmware/a.bin"), "a").unwrap();
        write_manifest(&host, &other, "6.12.12", "6.11.0").unwrap();
        host.create_dir_all(format!("{store}/empty")).unwrap();
        // A bundle still being imported or fetched is not offered.
        write_bundle_at(&host, &format!("{store}/.import-x1y2"));
        assert_eq!(find(&host, store, KERNEL).unwrap(), [DIR]);
        assert_eq!(find(&host, store, "6.11.0").unwrap(), [other.as_str()]);
        assert!(find(&host, store, "5.15.0").unwrap().is_empty());
        // A bundle given directly is itself.
        assert_eq!(find(&host, &other, KERNEL).unwrap(), [other]);
        assert!(find(&host, "/nowhere", KERNEL).unwrap().is_empty());
    }
}
